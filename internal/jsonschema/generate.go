package jsonschema

import (
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

// For returns the JSON Schema of v's type; v may be a value, a pointer, or
// a reflect.Type. The result is the caller's to modify. It panics if the type
// cannot be described (see Generate): types are fixed at compile time, so
// that is a programming error, like regexp.MustCompile.
//
// Mapping: structs are objects with additionalProperties false, whose
// properties are named by their json tags (fields tagged "-" and unexported
// fields are left out, embedded structs are flattened as encoding/json
// does); a property is required unless its json tag has omitempty or
// omitzero. string, bool, integers, floats, slices and arrays, maps,
// pointers (as the pointed-to type) map as expected; []byte is a base64
// string, time.Time a date-time string, encoding.TextMarshaler a string;
// json.RawMessage, interfaces and other json.Marshaler types allow any value.
// A recursive type refers to itself with $ref.
//
// Field tags: desc:"..." (description), default:"..." (parsed as the field's
// type; JSON for non-strings), enum:"a,b,c", minimum:"1", maximum:"9". On a
// slice of scalars, enum/minimum/maximum constrain the items.
func For(v any) *Schema {
	s, err := Generate(v)
	if err != nil {
		panic(err)
	}
	return s
}

// JSON returns For(v) marshalled (cached per type). It panics like For.
func JSON(v any) json.RawMessage {
	e := generate(v)
	if e.err != nil {
		panic(e.err)
	}
	return json.RawMessage(append([]byte(nil), e.json...))
}

// Generate is For returning an error instead of panicking.
func Generate(v any) (*Schema, error) {
	e := generate(v)
	if e.err != nil {
		return nil, e.err
	}
	return e.schema.Clone(), nil
}

type entry struct {
	schema *Schema
	json   []byte
	err    error
}

var cache sync.Map // reflect.Type -> *entry

func generate(v any) *entry {
	t, ok := v.(reflect.Type)
	if !ok {
		t = reflect.TypeOf(v)
	}
	if t == nil {
		return &entry{err: fmt.Errorf("jsonschema: cannot describe nil: pass a value, a pointer or a reflect.Type")}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if e, ok := cache.Load(t); ok {
		return e.(*entry)
	}
	g := &generator{root: t, stack: map[reflect.Type]bool{}, names: map[reflect.Type]string{}}
	e := &entry{}
	e.schema, e.err = g.schema(t)
	if e.err == nil {
		if len(g.defs) > 0 {
			e.schema.Defs = g.defs
		}
		e.json, e.err = json.Marshal(e.schema)
	}
	if e.err != nil {
		e.err = fmt.Errorf("jsonschema: describe %s: %w", t, e.err)
	}
	got, _ := cache.LoadOrStore(t, e)
	return got.(*entry)
}

type generator struct {
	root  reflect.Type
	stack map[reflect.Type]bool   // struct types being generated
	names map[reflect.Type]string // recursive struct types -> their $defs name
	defs  map[string]*Schema
}

var (
	timeType          = reflect.TypeFor[time.Time]()
	rawMessageType    = reflect.TypeFor[json.RawMessage]()
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func implements(t, iface reflect.Type) bool {
	return t.Implements(iface) || reflect.PointerTo(t).Implements(iface)
}

func (g *generator) schema(t reflect.Type) (*Schema, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		return &Schema{Type: "string", Format: "date-time"}, nil
	case t == rawMessageType:
		return &Schema{}, nil
	case implements(t, jsonMarshalerType):
		return &Schema{}, nil // custom JSON: any value
	case implements(t, textMarshalerType):
		return &Schema{Type: "string"}, nil
	}
	switch t.Kind() {
	case reflect.String:
		return &Schema{Type: "string"}, nil
	case reflect.Bool:
		return &Schema{Type: "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return &Schema{Type: "integer"}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return &Schema{Type: "integer", Minimum: new(0.0)}, nil
	case reflect.Float32, reflect.Float64:
		return &Schema{Type: "number"}, nil
	case reflect.Interface:
		return &Schema{}, nil
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 && !implements(t.Elem(), jsonMarshalerType) {
			return &Schema{Type: "string", ContentEncoding: "base64"}, nil
		}
		items, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		s := &Schema{Type: "array", Items: items}
		if t.Kind() == reflect.Array {
			s.MinItems, s.MaxItems = new(t.Len()), new(t.Len())
		}
		return s, nil
	case reflect.Map:
		switch k := t.Key(); {
		case k.Kind() == reflect.String, k.Kind() >= reflect.Int && k.Kind() <= reflect.Uintptr, implements(k, textMarshalerType):
		default:
			return nil, fmt.Errorf("map key type %s cannot be a JSON object key", k)
		}
		vals, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return &Schema{Type: "object", AdditionalProperties: vals}, nil
	case reflect.Struct:
		return g.structSchema(t)
	}
	return nil, fmt.Errorf("type %s (%s) has no JSON form", t, t.Kind())
}

func (g *generator) structSchema(t reflect.Type) (*Schema, error) {
	if g.stack[t] {
		if t == g.root {
			return &Schema{Ref: "#"}, nil
		}
		name, ok := g.names[t]
		if !ok {
			name = t.Name()
			for i := 2; g.defs[name] != nil || name == ""; i++ {
				name = fmt.Sprintf("%s%d", t.Name(), i)
			}
			g.names[t] = name
			if g.defs == nil {
				g.defs = map[string]*Schema{}
			}
			g.defs[name] = &Schema{} // reserved; filled in below
		}
		return &Schema{Ref: "#/$defs/" + name}, nil
	}
	g.stack[t] = true
	defer delete(g.stack, t)

	s := &Schema{Type: "object", Closed: true}
	for _, f := range fields(t) {
		p, err := g.fieldSchema(f)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", strings.Join(f.path, "."), err)
		}
		s.Properties = append(s.Properties, Property{f.name, p})
		if !f.optional {
			s.Required = append(s.Required, f.name)
		}
	}
	if name, ok := g.names[t]; ok {
		*g.defs[name] = *s
	}
	return s, nil
}

func (g *generator) fieldSchema(f field) (*Schema, error) {
	ft := f.typ
	for ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	var s *Schema
	if f.asString { // `json:",string"`
		s = &Schema{Type: "string"}
	} else {
		var err error
		if s, err = g.schema(ft); err != nil {
			return nil, err
		}
	}
	tag := f.tag
	s.Description = tag.Get("desc")
	if d, ok := tag.Lookup("default"); ok {
		v, err := parseValue(ft, s, d)
		if err != nil {
			return nil, fmt.Errorf("default:%q: %w", d, err)
		}
		s.Default = v
	}
	// enum, minimum and maximum constrain the items of a slice of scalars
	target, tt := s, ft
	if s.Type == "array" && s.Items != nil && s.Items.Type != "object" && s.Items.Type != "array" {
		target, tt = s.Items, ft.Elem()
		for tt.Kind() == reflect.Pointer {
			tt = tt.Elem()
		}
	}
	if e, ok := tag.Lookup("enum"); ok {
		for item := range strings.SplitSeq(e, ",") {
			v, err := parseValue(tt, target, strings.TrimSpace(item))
			if err != nil {
				return nil, fmt.Errorf("enum:%q: %w", e, err)
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
			return nil, fmt.Errorf("%s:%q on a %s: only numbers have a %s", b.name, v, tt, b.name)
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsInf(n, 0) || math.IsNaN(n) {
			return nil, fmt.Errorf("%s:%q is not a number", b.name, v)
		}
		*b.dst = &n
	}
	return s, nil
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

// field is one JSON property of a struct, after flattening embedded structs.
type field struct {
	name     string
	path     []string // Go field names from the outer struct
	typ      reflect.Type
	tag      reflect.StructTag
	optional bool
	asString bool
	tagged   bool // the name comes from a json tag
	depth    int
}

// fields lists the JSON properties of struct type t the way encoding/json
// does: embedded structs without a json name are flattened, and among
// fields with the same name the shallowest wins, then the one with a json
// tag; otherwise they cancel out.
func fields(t reflect.Type) []field {
	var all []field
	var walk func(t reflect.Type, path []string, depth int, seen map[reflect.Type]bool)
	walk = func(t reflect.Type, path []string, depth int, seen map[reflect.Type]bool) {
		if seen[t] {
			return
		}
		seen[t] = true
		defer delete(seen, t)
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			ft := sf.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			p := append(path[:len(path):len(path)], sf.Name)
			if sf.Anonymous && name == "" && ft.Kind() == reflect.Struct {
				walk(ft, p, depth+1, seen)
				continue
			}
			if !sf.IsExported() {
				continue
			}
			f := field{name: name, path: p, typ: sf.Type, tag: sf.Tag, tagged: name != "", depth: depth}
			if name == "" {
				f.name = sf.Name
			}
			for o := range strings.SplitSeq(opts, ",") {
				switch o {
				case "omitempty", "omitzero":
					f.optional = true
				case "string":
					switch ft.Kind() {
					case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
						reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
						reflect.Float32, reflect.Float64, reflect.String:
						f.asString = true
					}
				}
			}
			all = append(all, f)
		}
	}
	walk(t, nil, 0, map[reflect.Type]bool{})

	var out []field
	for i, f := range all {
		if dominant(all, f.name) == i {
			out = append(out, f)
		}
	}
	return out
}

// dominant returns the index of the field that owns JSON name among all, or
// -1 if the name is ambiguous.
func dominant(all []field, name string) int {
	best, n, tagged, nTagged := -1, 0, -1, 0
	for i, f := range all {
		if f.name != name {
			continue
		}
		if best >= 0 && f.depth > all[best].depth {
			continue
		}
		if best < 0 || f.depth < all[best].depth {
			best, n, tagged, nTagged = i, 0, -1, 0
		}
		n++
		if f.tagged {
			tagged = i
			nTagged++
		}
	}
	switch {
	case n == 1:
		return best
	case nTagged == 1:
		return tagged
	}
	return -1
}
