package fastjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// LongString is the length above which Marshal and Unmarshal handle a
// top-level string field themselves; shorter ones are left to
// encoding/json (the split costs more than it saves there).
const LongString = 4 << 10

// Marshal is json.Marshal of v (escapeHTML true), or an Encoder's output
// with SetEscapeHTML(false) without its newline (escapeHTML false), byte
// for byte. A struct's long top-level string fields (a file's content) are
// quoted by AppendString; the rest, a few hundred bytes, by encoding/json.
func Marshal(v any, escapeHTML bool) ([]byte, error) { return AppendMarshal(nil, v, escapeHTML) }

// AppendMarshal is Marshal appending to dst (on an error, dst is returned
// as it was).
func AppendMarshal(dst []byte, v any, escapeHTML bool) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	var long []longField
	var sumLen int
	if rv.Kind() == reflect.Struct {
		for _, f := range stringFieldsOf(rv.Type()) {
			if s := rv.Field(f.index).String(); len(s) > LongString {
				long = append(long, longField{f, s})
				sumLen += len(s)
			}
		}
	}
	if len(long) == 0 {
		return appendMarshal(dst, v, escapeHTML)
	}
	// The same value with each long string as "0": a short skeleton whose
	// fields encoding/json writes, then copied with the long ones spliced
	// in. ("0", not "": omitempty keeps it.)
	cp := reflect.New(rv.Type()).Elem()
	cp.Set(rv)
	for _, l := range long {
		cp.Field(l.index).SetString("0")
	}
	sk, err := marshal(cp.Interface(), escapeHTML)
	if err != nil {
		return dst, err
	}
	out := slices.Grow(dst, len(sk)+sumLen+sumLen/16+16)
	last, spliced := 0, 0
	err = walkObject(sk, func(key []byte, vs, ve int) error {
		for _, l := range long {
			if len(key) == len(l.name)+2 && string(key[1:len(key)-1]) == l.name && string(sk[vs:ve]) == `"0"` {
				out = append(out, sk[last:vs]...)
				out = AppendString(out, l.s, escapeHTML)
				last = ve
				spliced++
				return nil
			}
		}
		return nil
	})
	if err != nil || spliced != len(long) { // not the shape expected: let encoding/json do it all
		return appendMarshal(dst, v, escapeHTML)
	}
	return append(out, sk[last:]...), nil
}

type longField struct {
	stringField
	s string
}

func appendMarshal(dst []byte, v any, escapeHTML bool) ([]byte, error) {
	b, err := marshal(v, escapeHTML)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

func marshal(v any, escapeHTML bool) ([]byte, error) {
	if escapeHTML {
		return json.Marshal(v)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Unmarshal is json.Unmarshal into v, with the same result. Into a struct,
// its long top-level string fields are unescaped by Unquote, and
// encoding/json decodes a skeleton of the rest (it would scan the long
// strings twice, once to check the text and once to unquote it).
func Unmarshal(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if len(data) <= LongString || rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return json.Unmarshal(data, v)
	}
	fields := stringFieldsOf(rv.Elem().Type())
	type span struct {
		f      stringField
		vs, ve int
	}
	var long []span
	var keys [][]byte
	var sumLen int
	err := walkObject(data, func(key []byte, vs, ve int) error {
		keys = append(keys, key)
		if ve-vs <= LongString || data[vs] != '"' {
			return nil
		}
		long = append(long, span{stringField{index: -1}, vs, ve})
		sumLen += ve - vs
		k := string(key[1 : len(key)-1])
		for _, f := range fields {
			if f.name == k {
				long[len(long)-1].f = f
			}
		}
		return nil
	})
	if err != nil || len(long) == 0 {
		return json.Unmarshal(data, v) // its own error, or nothing to gain
	}
	strs := make([]string, len(long))
	for i, l := range long {
		// encoding/json would match the key case-insensitively, and let a
		// later key that folds to the same name win: only an exact,
		// unique key is decoded here.
		if l.f.index < 0 || foldCount(keys, l.f.name) != 1 || !utf8.Valid(data[l.vs:l.ve]) {
			return json.Unmarshal(data, v)
		}
		s, err := Unquote(data[l.vs:l.ve])
		if err != nil { // a lone surrogate: encoding/json makes it U+FFFD
			return json.Unmarshal(data, v)
		}
		strs[i] = s
	}
	sk := make([]byte, 0, len(data)-sumLen+2*len(long))
	last := 0
	for _, l := range long {
		sk = append(append(sk, data[last:l.vs]...), `""`...)
		last = l.ve
	}
	sk = append(sk, data[last:]...)
	if err := json.Unmarshal(sk, v); err != nil {
		return json.Unmarshal(data, v) // the error as encoding/json words it for the whole text
	}
	for i, l := range long {
		rv.Elem().Field(l.f.index).SetString(strs[i])
	}
	return nil
}

// foldCount is the number of keys (raw, quoted) equal to name under
// encoding/json's case folding (a key with escapes counts, to be safe).
func foldCount(keys [][]byte, name string) int {
	n := 0
	for _, k := range keys {
		k = k[1 : len(k)-1]
		if bytes.IndexByte(k, '\\') >= 0 || strings.EqualFold(string(k), name) {
			n++
		}
	}
	return n
}

// walkObject calls field with each top-level key (raw, with its quotes)
// of the object b and where its value's text starts and ends. An error
// is field's, or means b is not a JSON object.
func walkObject(b []byte, field func(key []byte, vs, ve int) error) error {
	p := parser{b: b}
	p.ws()
	if p.i >= len(b) || b[p.i] != '{' {
		return p.fail("want a JSON object")
	}
	err := p.object(0, func(key, value []byte) error {
		return field(key, p.i-len(value), p.i)
	})
	if err != nil {
		return err
	}
	p.ws()
	if p.i != len(b) {
		return p.fail("invalid character after the top-level value")
	}
	return nil
}

// stringField is a top-level string field of a struct that Marshal and
// Unmarshal may handle: encoding/json would write it as a plain JSON
// string under its plain name.
type stringField struct {
	name  string
	index int
}

var stringFieldCache sync.Map // reflect.Type → []stringField

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	unmarshalerType   = reflect.TypeFor[json.Unmarshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler   = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// stringFieldsOf lists t's string fields that are safe to handle outside
// encoding/json: none if t has its own (un)marshalling; only direct,
// exported, untagged-",string" fields of a string kind without methods of
// their own, whose name no other field shares and needs no escaping.
func stringFieldsOf(t reflect.Type) []stringField {
	if c, ok := stringFieldCache.Load(t); ok {
		return c.([]stringField)
	}
	var out []stringField
	if !hasCodec(t) {
		names := map[string]int{}
		var cand []stringField
		for _, f := range reflect.VisibleFields(t) {
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" && opts == "" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			names[strings.ToLower(name)]++
			if len(f.Index) != 1 || f.Anonymous || !f.IsExported() || f.Type.Kind() != reflect.String ||
				hasCodec(f.Type) || strings.Contains(","+opts+",", ",string,") ||
				string(AppendString(nil, name, true)) != `"`+name+`"` {
				continue
			}
			cand = append(cand, stringField{name, f.Index[0]})
		}
		for _, f := range cand {
			if names[strings.ToLower(f.name)] == 1 {
				out = append(out, f)
			}
		}
	}
	stringFieldCache.Store(t, out)
	return out
}

// hasCodec reports whether t or *t has its own JSON or text (un)marshalling.
func hasCodec(t reflect.Type) bool {
	for _, x := range []reflect.Type{t, reflect.PointerTo(t)} {
		if x.Implements(marshalerType) || x.Implements(unmarshalerType) || x.Implements(textMarshalerType) || x.Implements(textUnmarshaler) {
			return true
		}
	}
	return false
}
