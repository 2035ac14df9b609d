package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cellbox/cellbox/internal/fastjson"
	"github.com/cellbox/cellbox/internal/jsonschema"
)

// decode checks raw against the tool's fields and decodes it into in, with
// errors a model can act on.
func (t *Tool) decode(raw json.RawMessage, in any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	fields, err := fastjson.SplitObject(raw) // one fast pass, however long the content
	if err != nil {
		return fmt.Errorf("the input of %s must be a JSON object with the fields %s", t.Name, strings.Join(t.fields, ", "))
	}
	// A long string that fastjson.Unquote decodes below has its escapes checked
	// there, in the same pass; here only its UTF-8.
	viaRaw := t.allStrings(fields)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		check := validText
		if viaRaw && isLong(fields[k]) {
			check = utf8.Valid
		}
		if !check(fields[k]) {
			return t.badText(k)
		}
		if !slices.Contains(t.fields, k) {
			valid := "it takes no fields"
			if len(t.fields) > 0 {
				valid = "valid fields: " + strings.Join(t.fields, ", ")
			}
			return fmt.Errorf("unknown field %q in the input of %s; %s", k, t.Name, valid)
		}
	}
	// null for an optional field means "not given": models send it for
	// every field they leave out.
	dropped := false
	for k, v := range fields {
		if string(v) == "null" && !slices.Contains(t.required, k) {
			delete(fields, k)
			dropped = true
		}
	}
	if dropped {
		if raw, err = json.Marshal(fields); err != nil {
			return fmt.Errorf("input of %s: %w", t.Name, err)
		}
	}
	for _, k := range t.required {
		if _, ok := fields[k]; !ok {
			return fmt.Errorf("missing required field %q in the input of %s (required: %s)", k, t.Name, strings.Join(t.required, ", "))
		}
	}
	sk := skeleton(raw, fields)
	if err := jsonschema.Validate(t.InputSchema, sk); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			problems := make([]string, len(ve.Violations))
			for i, v := range ve.Violations {
				problems[i] = strings.TrimPrefix(v.String(), "/")
			}
			return fmt.Errorf("invalid input of %s: %s", t.Name, strings.Join(problems, "; "))
		}
		return fmt.Errorf("invalid input of %s: %w", t.Name, err)
	}
	// A long input (write_file's content) is decoded from its skeleton, its
	// long strings set directly: a second full parse of a megabyte costs
	// more than the rest of the call.
	target, long := raw, map[string]json.RawMessage(nil)
	switch {
	case viaRaw && len(sk) < len(raw):
		target, long = sk, fields
	case viaRaw: // no skeleton after all: the escapes are checked here
		for k, v := range fields {
			if isLong(v) && !validText(v) {
				return t.badText(k)
			}
		}
	}
	if err := json.Unmarshal(target, in); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("field %q of %s: expected %s, got %s", te.Field, t.Name, JSONKind(te.Type), te.Value)
		}
		return fmt.Errorf("input of %s: %w", t.Name, err)
	}
	for k, v := range long {
		if !isLong(v) {
			continue
		}
		s, err := fastjson.Unquote(v)
		if errors.Is(err, fastjson.ErrLoneSurrogate) {
			return t.badText(k)
		}
		if err != nil {
			return fmt.Errorf("field %q of %s: %w", k, t.Name, err)
		}
		reflect.ValueOf(in).Elem().FieldByIndex(t.stringIdx[k]).SetString(s)
	}
	return nil
}

// allStrings reports whether every long string value of the input goes to
// a string field (so that the skeleton's "" stands for it); otherwise
// decode parses the whole input.
func (t *Tool) allStrings(fields map[string]json.RawMessage) bool {
	for k, v := range fields {
		if isLong(v) {
			if _, ok := t.stringIdx[k]; !ok {
				return false
			}
		}
	}
	return true
}

// isLong reports whether v is a string value skeleton elides.
func isLong(v json.RawMessage) bool { return len(v) > fastjson.LongString && v[0] == '"' }

// badText is decode's error for a field that is not valid text.
func (t *Tool) badText(field string) error {
	hint := ""
	if field == "content" {
		hint = t.base64Hint() // bytes go as base64 in content, never in a path or command
	}
	return fmt.Errorf("field %q of %s is not valid UTF-8 (or holds a lone surrogate escape such as \\udc80); send text as UTF-8%s", field, t.Name, hint)
}

// stringFields maps the JSON names of a struct type's string fields to
// their index paths.
func stringFields(typ reflect.Type) map[string][]int {
	out := map[string][]int{}
	if typ == nil || typ.Kind() != reflect.Struct {
		return out
	}
	for _, f := range reflect.VisibleFields(typ) {
		if !f.IsExported() || f.Anonymous || f.Type.Kind() != reflect.String {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || strings.Contains(opts, "string") {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Index
	}
	return out
}

// base64Hint tells how to send bytes, for the tools that take them.
func (t *Tool) base64Hint() string {
	if slices.Contains(t.fields, "encoding") {
		return `, or bytes base64-encoded with "encoding": "base64"`
	}
	return ""
}

// validText reports whether the raw JSON value v holds only valid UTF-8
// and no lone UTF-16 surrogate escape. encoding/json would silently turn
// either into U+FFFD, so a command, path or content would not be what the
// caller sent.
func validText(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	pending := false // the last escape was a high surrogate
	for i := 0; i < len(v); {
		// Only escapes matter: jump to the next backslash.
		j := bytes.IndexByte(v[i:], '\\')
		if j < 0 {
			break
		}
		if j > 0 && pending {
			return false
		}
		i += j
		if i+1 >= len(v) {
			break
		}
		if v[i+1] != 'u' || i+6 > len(v) {
			if pending {
				return false
			}
			i += 2 // an escaped character: skip it (it may be a backslash)
			continue
		}
		r, err := strconv.ParseUint(string(v[i+2:i+6]), 16, 16)
		if err != nil {
			return false
		}
		i += 6
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if pending {
				return false
			}
			pending = true
		case r >= 0xdc00 && r < 0xe000:
			if !pending {
				return false
			}
			pending = false
		default:
			if pending {
				return false
			}
		}
	}
	return !pending
}

// skeleton is the input to check against the schema: raw, with long
// strings (file contents) replaced by "". No tool constrains a long
// string beyond its type, and the schema validator would parse it again.
func skeleton(raw json.RawMessage, fields map[string]json.RawMessage) json.RawMessage {
	if len(raw) < fastjson.LongString {
		return raw
	}
	short := make(map[string]json.RawMessage, len(fields))
	for k, v := range fields {
		if isLong(v) {
			v = json.RawMessage(`""`)
		}
		short[k] = v
	}
	out, err := json.Marshal(short)
	if err != nil {
		return raw
	}
	return out
}

// JSONKind names the JSON kind a Go type takes ("a string", "an
// integer"), for an error that says what a field expected.
func JSONKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "an object"
	}
	return t.String()
}
