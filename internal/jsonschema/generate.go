package jsonschema

import (
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	gj "github.com/google/jsonschema-go/jsonschema"
)

// Schema is a JSON Schema (draft 2020-12), github.com/google/jsonschema-go's
// type: the MCP Go SDK serves tools' schemas in it. Properties marshal in
// PropertyOrder, which For sets to Go field declaration order (LLM tool
// APIs present properties to the model in that order).
type Schema = gj.Schema

// For returns the JSON Schema of v's type; v may be a value, a pointer, or
// a reflect.Type. The result is the caller's to modify. It panics if the type
// cannot be described (see Generate): types are fixed at compile time, so
// that is a programming error, like regexp.MustCompile.
//
// The schema is google/jsonschema-go's (gj.ForType: structs are objects with
// additionalProperties false, properties named by their json tags, required
// unless tagged omitempty or omitzero), with this project's conventions on
// top, which tool schemas and docs/tools.md rely on:
//   - a pointer or a slice has its element's single type, not ["null", T]:
//     a tool's input that sends null where a list is wanted is refused, and
//     some LLM APIs take no type lists;
//   - []byte is a base64 string, time.Time a date-time string,
//     encoding.TextMarshaler a string, json.RawMessage and other
//     json.Marshaler types any value (the library would describe their Go
//     representation, not their JSON);
//   - a recursive struct type refers to itself with $ref ("#" for the type
//     itself, "#/$defs/Name" for one inside it), where the library refuses
//     a cycle;
//   - field tags desc:"..." (description), default:"..." (parsed as the
//     field's type; JSON for non-strings), enum:"a,b,c", minimum:"1",
//     maximum:"9"; on a slice of scalars, enum/minimum/maximum constrain
//     the items. (The library reads only a jsonschema:"description" tag.)
//   - a type with a method JSONSchemaAnyOf() []any (on its value), for
//     custom JSON of more than one shape (a boolean or an object), is
//     described as anyOf the types of the values it returns (false and a
//     struct: a boolean or that struct's object), where "any value" would
//     say nothing.
func For(v any) *Schema {
	s, err := Generate(v)
	if err != nil {
		panic(err)
	}
	return s
}

// JSON returns For(v) marshalled. It panics like For.
func JSON(v any) json.RawMessage {
	b, err := json.Marshal(For(v))
	if err != nil {
		panic(fmt.Sprintf("jsonschema: marshal the schema of %T: %v", v, err))
	}
	return b
}

var (
	timeType          = reflect.TypeFor[time.Time]()
	bytesType         = reflect.TypeFor[[]byte]()
	rawMessageType    = reflect.TypeFor[json.RawMessage]()
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	describerType     = reflect.TypeFor[describer]()
)

// describer is a type of several JSON shapes (see For).
type describer interface{ JSONSchemaAnyOf() []any }

// Generate is For returning an error instead of panicking.
func Generate(v any) (*Schema, error) {
	t, ok := v.(reflect.Type)
	if !ok {
		t = reflect.TypeOf(v)
	}
	if t == nil {
		return nil, fmt.Errorf("jsonschema: cannot describe nil: pass a value, a pointer or a reflect.Type")
	}
	t = deref(t)
	s, err := generate(t)
	if err != nil {
		return nil, fmt.Errorf("jsonschema: describe %s: %w", t, err)
	}
	return s, nil
}

func generate(root reflect.Type) (*Schema, error) {
	// Types whose JSON is not their Go shape, and recursive structs, are
	// given to the library as fixed schemas.
	fixed := map[reflect.Type]*Schema{
		timeType:       {Type: "string", Format: "date-time"},
		bytesType:      {Type: "string", ContentEncoding: "base64"},
		rawMessageType: {},
	}
	w := &walker{fixed: fixed, stack: map[reflect.Type]bool{}, done: map[reflect.Type]bool{}, defs: map[reflect.Type]string{}}
	if err := w.walk(root); err != nil {
		return nil, err
	}
	recursive := w.order
	for _, t := range recursive {
		ref := "#/$defs/" + w.defs[t]
		if t == root {
			ref = "#"
		}
		fixed[t] = &Schema{Ref: ref}
	}
	opts := &gj.ForOptions{TypeSchemas: fixed}
	body := func(t reflect.Type) (*Schema, error) {
		if fixed[t] != nil && fixed[t].Ref != "" {
			// The library would answer the $ref itself; describe a copy of
			// the struct, whose fields still refer back by $ref.
			var err error
			if t, err = structCopy(t); err != nil {
				return nil, err
			}
		}
		s, err := gj.ForType(t, opts)
		if err != nil {
			return nil, err
		}
		return s, w.finish(t, s)
	}
	s, err := body(root)
	if err != nil {
		return nil, err
	}
	for _, t := range recursive {
		if t == root {
			continue
		}
		if s.Defs == nil {
			s.Defs = map[string]*Schema{}
		}
		if s.Defs[w.defs[t]], err = body(t); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// structCopy returns an unnamed struct type with t's JSON fields.
func structCopy(t reflect.Type) (c reflect.Type, err error) {
	var fs []reflect.StructField
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() {
			fs = append(fs, f)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("recursive type %s: %v", t, p)
		}
	}()
	return reflect.StructOf(fs), nil
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func implements(t, iface reflect.Type) bool {
	return t.Implements(iface) || reflect.PointerTo(t).Implements(iface)
}

// walker finds, before the library runs, the types it would describe wrongly
// (custom JSON) and the recursive structs (in order, each with a $defs
// name); after, finish applies the conventions For lists to its schema.
type walker struct {
	fixed map[reflect.Type]*Schema
	stack map[reflect.Type]bool
	done  map[reflect.Type]bool
	defs  map[reflect.Type]string
	order []reflect.Type
}

func (w *walker) walk(t reflect.Type) error {
	t = deref(t)
	switch {
	case w.fixed[t] != nil:
		return nil
	case t.Implements(describerType):
		s := &Schema{}
		for _, v := range reflect.Zero(t).Interface().(describer).JSONSchemaAnyOf() {
			alt, err := Generate(v)
			if err != nil {
				return fmt.Errorf("%s: a shape of JSONSchemaAnyOf: %w", t, err)
			}
			s.AnyOf = append(s.AnyOf, alt)
		}
		w.fixed[t] = s
		return nil
	case implements(t, jsonMarshalerType):
		w.fixed[t] = &Schema{}
		return nil
	case implements(t, textMarshalerType):
		w.fixed[t] = &Schema{Type: "string"}
		return nil
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array, reflect.Map:
		return w.walk(t.Elem())
	case reflect.Struct:
	default:
		return nil
	}
	if w.stack[t] {
		if _, ok := w.defs[t]; !ok {
			name := t.Name()
			for i := 2; name == "" || w.nameTaken(name); i++ {
				name = fmt.Sprintf("%s%d", t.Name(), i)
			}
			w.defs[t] = name
			w.order = append(w.order, t)
		}
		return nil
	}
	if w.done[t] {
		return nil
	}
	w.stack[t] = true
	defer func() { delete(w.stack, t); w.done[t] = true }()
	for _, f := range reflect.VisibleFields(t) {
		if f.Anonymous {
			continue // its promoted fields follow
		}
		if err := w.walk(f.Type); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) nameTaken(name string) bool {
	for _, n := range w.defs {
		if n == name {
			return true
		}
	}
	return false
}

// finish collapses ["null", T] to T and applies the field tags, walking
// the type t alongside its schema s.
func (w *walker) finish(t reflect.Type, s *Schema) error {
	if s == nil {
		return nil
	}
	if s.Types != nil { // the library's ["null", T] for a pointer or slice
		types := slices.DeleteFunc(slices.Clone(s.Types), func(t string) bool { return t == "null" })
		s.Types = nil
		switch len(types) {
		case 0: // a pointer to a type of any value: not only null
		case 1:
			s.Type = types[0]
		default:
			s.Types = types
		}
	}
	t = deref(t)
	if s.Ref != "" || w.fixed[t] != nil {
		return nil
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return w.finish(t.Elem(), s.Items)
	case reflect.Map:
		return w.finish(t.Elem(), s.AdditionalProperties)
	case reflect.Struct:
	default:
		return nil
	}
	// The library names each property after the last visible field with
	// that JSON name; so do we.
	byName := map[string]reflect.StructField{}
	for _, f := range reflect.VisibleFields(t) {
		if name, ok := jsonName(f); ok {
			byName[name] = f
		}
	}
	for _, name := range s.PropertyOrder {
		f, p := byName[name], s.Properties[name]
		if p == nil {
			continue
		}
		if err := w.finish(f.Type, p); err != nil {
			return fmt.Errorf("field %s: %w", f.Name, err)
		}
		if err := applyTags(f, p); err != nil {
			return fmt.Errorf("field %s: %w", f.Name, err)
		}
	}
	return nil
}

// PropertyNames lists the JSON property names of struct type t's fields,
// as encoding/json and For read them (embedded fields left out).
func PropertyNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		if name, ok := jsonName(f); ok {
			names = append(names, name)
		}
	}
	return names
}

// jsonName is the property name of field f, as the library reads it.
func jsonName(f reflect.StructField) (string, bool) {
	if f.Anonymous || !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false
	}
	if name, _, _ := strings.Cut(tag, ","); name != "" {
		return name, true
	}
	return f.Name, true
}

// applyTags sets s from f's desc, default, enum, minimum and maximum tags.
func applyTags(f reflect.StructField, s *Schema) error {
	ft := deref(f.Type)
	tag := f.Tag
	if d, ok := tag.Lookup("desc"); ok {
		s.Description = d
	}
	if d, ok := tag.Lookup("default"); ok {
		v, err := parseValue(ft, s, d)
		if err != nil {
			return fmt.Errorf("default:%q: %w", d, err)
		}
		if s.Default, err = json.Marshal(v); err != nil {
			return fmt.Errorf("default:%q: %w", d, err)
		}
	}
	// enum, minimum and maximum constrain the items of a slice of scalars
	target, tt := s, ft
	if s.Type == "array" && s.Items != nil && s.Items.Type != "object" && s.Items.Type != "array" {
		target, tt = s.Items, deref(ft.Elem())
	}
	if e, ok := tag.Lookup("enum"); ok {
		for item := range strings.SplitSeq(e, ",") {
			v, err := parseValue(tt, target, strings.TrimSpace(item))
			if err != nil {
				return fmt.Errorf("enum:%q: %w", e, err)
			}
			target.Enum = append(target.Enum, v)
		}
	}
	for _, b := range []struct {
		name string
		dst  **float64
	}{{"minimum", &target.Minimum}, {"maximum", &target.Maximum}} {
		v, ok := tag.Lookup(b.name)
		if !ok {
			continue
		}
		if target.Type != "integer" && target.Type != "number" {
			return fmt.Errorf("%s:%q on a %s: only numbers have a %s", b.name, v, tt, b.name)
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsInf(n, 0) || math.IsNaN(n) {
			return fmt.Errorf("%s:%q is not a number", b.name, v)
		}
		*b.dst = &n
	}
	return nil
}

// parseValue reads a tag value as a value of type t (whose schema is s):
// strings as they are, anything else as JSON.
func parseValue(t reflect.Type, s *Schema, text string) (any, error) {
	if s.Type == "string" {
		return text, nil
	}
	p := reflect.New(t)
	if err := json.Unmarshal([]byte(text), p.Interface()); err != nil {
		return nil, fmt.Errorf("not a valid %s: %w", t, err)
	}
	return p.Elem().Interface(), nil
}
