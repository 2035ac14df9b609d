// Package jsonschema generates JSON Schemas (draft 2020-12) from Go types
// and validates JSON values against schemas, with errors that name the JSON
// path of every violation.
package jsonschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Schema is the subset of JSON Schema (draft 2020-12) that For generates.
// It marshals with properties in Go field declaration order, which LLM tool
// APIs present to the model.
type Schema struct {
	Ref                  string             `json:"$ref,omitempty"`
	Type                 string             `json:"type,omitempty"`
	Format               string             `json:"format,omitempty"`
	ContentEncoding      string             `json:"contentEncoding,omitempty"`
	Description          string             `json:"description,omitempty"`
	Default              any                `json:"default,omitempty"`
	Enum                 []any              `json:"enum,omitempty"`
	Minimum              *float64           `json:"minimum,omitempty"`
	Maximum              *float64           `json:"maximum,omitempty"`
	MinItems             *int               `json:"minItems,omitempty"`
	MaxItems             *int               `json:"maxItems,omitempty"`
	Items                *Schema            `json:"items,omitempty"`
	Properties           Properties         `json:"properties,omitempty"`
	Required             []string           `json:"required,omitempty"`
	AdditionalProperties *Schema            `json:"-"` // for maps: the value schema
	Closed               bool               `json:"-"` // additionalProperties: false (structs)
	Defs                 map[string]*Schema `json:"$defs,omitempty"`
}

// Property is one named property of an object schema.
type Property struct {
	Name   string
	Schema *Schema
}

// Properties are the properties of an object schema, in order.
type Properties []Property

// Get returns the schema of the property called name, or nil.
func (p Properties) Get(name string) *Schema {
	for _, x := range p {
		if x.Name == name {
			return x.Schema
		}
	}
	return nil
}

// MarshalJSON writes the properties as a JSON object, in order.
func (p Properties) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, x := range p {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(x.Name)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(x.Schema)
		if err != nil {
			return nil, fmt.Errorf("property %s: %w", x.Name, err)
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// MarshalJSON writes s as JSON Schema.
func (s *Schema) MarshalJSON() ([]byte, error) {
	type plain Schema // the same fields, without this method
	b, err := json.Marshal((*plain)(s))
	if err != nil || (!s.Closed && s.AdditionalProperties == nil) {
		return b, err
	}
	ap := []byte("false")
	if s.AdditionalProperties != nil {
		if ap, err = json.Marshal(s.AdditionalProperties); err != nil {
			return nil, err
		}
	}
	b = b[:len(b)-1] // drop the closing brace
	if len(b) > 1 {
		b = append(b, ',')
	}
	b = append(append(b, `"additionalProperties":`...), ap...)
	return append(b, '}'), nil
}

// Clone returns a deep copy of s.
func (s *Schema) Clone() *Schema {
	if s == nil {
		return nil
	}
	c := *s
	c.Items = s.Items.Clone()
	c.AdditionalProperties = s.AdditionalProperties.Clone()
	c.Enum = slices.Clone(s.Enum)
	c.Required = slices.Clone(s.Required)
	if s.Minimum != nil {
		c.Minimum = new(*s.Minimum)
	}
	if s.Maximum != nil {
		c.Maximum = new(*s.Maximum)
	}
	if s.MinItems != nil {
		c.MinItems = new(*s.MinItems)
	}
	if s.MaxItems != nil {
		c.MaxItems = new(*s.MaxItems)
	}
	if s.Properties != nil {
		c.Properties = make(Properties, len(s.Properties))
		for i, p := range s.Properties {
			c.Properties[i] = Property{p.Name, p.Schema.Clone()}
		}
	}
	if s.Defs != nil {
		c.Defs = maps.Clone(s.Defs)
		for k, v := range c.Defs {
			c.Defs[k] = v.Clone()
		}
	}
	return &c
}
