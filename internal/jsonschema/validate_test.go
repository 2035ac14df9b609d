package jsonschema

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	const params = `{
		"type": "object",
		"properties": {
			"threshold": {"type": "number", "minimum": 0},
			"ratio": {"type": "number", "exclusiveMaximum": 1},
			"name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
			"mode": {"enum": ["fast", "slow"]},
			"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "uniqueItems": true},
			"id": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
			"when": {"type": "string", "format": "date-time"},
			"a/b": {"type": "integer"}
		},
		"required": ["threshold"],
		"additionalProperties": false
	}`
	tests := []struct {
		name   string
		schema string
		value  string
		want   []string // violations, sorted by path; nil means valid
	}{
		{name: "valid", schema: params, value: `{"threshold": 0.5, "mode": "fast", "id": 3, "when": "2024-05-01T10:00:00Z"}`},
		{name: "minimum", schema: params, value: `{"threshold": -1}`, want: []string{"/threshold: must be >= 0 (got -1)"}},
		{name: "exclusive maximum, fraction", schema: params, value: `{"threshold": 1, "ratio": 1.5}`, want: []string{"/ratio: must be < 1 (got 1.5)"}},
		{name: "required", schema: params, value: `{}`, want: []string{"/threshold: required property is missing"}},
		{name: "type", schema: params, value: `{"threshold": "high"}`, want: []string{"/threshold: must be number (got string)"}},
		{name: "root type", schema: params, value: `[1]`, want: []string{"(root): must be object (got array)"}},
		{name: "unknown property lists the allowed ones", schema: params, value: `{"threshold": 1, "treshold": 1}`,
			want: []string{"/treshold: unknown property (allowed: a/b, id, mode, name, ratio, tags, threshold, when)"}},
		{name: "string rules", schema: params, value: `{"threshold": 1, "name": "ABCDEFG"}`, want: []string{
			`/name: must be at most 5 characters long (got 7)`,
			`/name: must match the pattern "^[a-z]+$" (got "ABCDEFG")`,
		}},
		{name: "enum", schema: params, value: `{"threshold": 1, "mode": "medium"}`, want: []string{`/mode: must be one of "fast", "slow" (got "medium")`}},
		{name: "array rules and item paths", schema: params, value: `{"threshold": 1, "tags": ["a", 2, "b"]}`, want: []string{
			"/tags: must have at most 2 items (got 3)",
			"/tags/1: must be string (got number)",
		}},
		{name: "unique items", schema: params, value: `{"threshold": 1, "tags": ["a", "a"]}`, want: []string{"/tags: items must be unique (items 0 and 1 are equal)"}},
		{name: "anyOf of types", schema: params, value: `{"threshold": 1, "id": 1.5}`, want: []string{"/id: must be string or integer (got number)"}},
		{name: "format is asserted", schema: params, value: `{"threshold": 1, "when": "yesterday"}`, want: []string{`/when: must be a valid date-time (got "yesterday": less than 20 characters long)`}},
		{name: "path escaping", schema: params, value: `{"threshold": 1, "a/b": "x"}`, want: []string{"/a~1b: must be integer (got string)"}},
		{name: "several at once", schema: params, value: `{"threshold": -2, "mode": 1, "extra": null}`, want: []string{
			"/extra: unknown property (allowed: a/b, id, mode, name, ratio, tags, threshold, when)",
			`/mode: must be one of "fast", "slow" (got 1)`,
			"/threshold: must be >= 0 (got -2)",
		}},
		{name: "big integers stay exact", schema: `{"type":"integer","maximum":9007199254740993}`, value: `9007199254740994`,
			want: []string{"(root): must be <= 9007199254740993 (got 9007199254740994)"}},
		{name: "other draft via $schema", schema: `{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"type":"string"}]}`, value: `[1]`,
			want: []string{"/0: must be string (got number)"}},
		{name: "$defs and $ref", schema: `{"$defs":{"pos":{"type":"integer","minimum":1}},"properties":{"n":{"$ref":"#/$defs/pos"}}}`, value: `{"n":0}`,
			want: []string{"/n: must be >= 1 (got 0)"}},
		{name: "false schema", schema: `{"properties":{"x":false}}`, value: `{"x":1}`, want: []string{"/x: no value is allowed here"}},
		{name: "const", schema: `{"const":"on"}`, value: `"off"`, want: []string{`(root): must be "on" (got "off")`}},
		// A boolean-or-object field given an object with a bad field says
		// what is wrong in the object, not also "must be boolean (got object)".
		{name: "anyOf: only the alternative of the value's type", schema: `{"properties":{"network":{"anyOf":[{"type":"boolean"},{"type":"object","properties":{"allow":{"type":"array"}}}]}}}`,
			value: `{"network":{"allow":"x"}}`, want: []string{"/network/allow: must be array (got string)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate([]byte(tt.schema), []byte(tt.value))
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrMismatch)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			var got []string
			for _, v := range ve.Violations {
				got = append(got, v.String())
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestValidateBadInput(t *testing.T) {
	tests := []struct {
		name          string
		schema, value string
		kind          error
		want          string
	}{
		{"schema not JSON", `{"type":`, `1`, ErrInvalidSchema, "invalid JSON Schema: not JSON"},
		{"schema breaks the metaschema", `{"type":"nope"}`, `1`, ErrInvalidSchema,
			`invalid JSON Schema: it breaks the JSON Schema metaschema: /type: must be one of "array", "boolean"`},
		{"bad minimum", `{"minimum":"3"}`, `1`, ErrInvalidSchema, "/minimum: must be number (got string)"},
		{"bad regexp", `{"pattern":"(["}`, `"x"`, ErrInvalidSchema, "invalid JSON Schema"},
		{"dangling ref", `{"$ref":"#/$defs/missing"}`, `1`, ErrInvalidSchema, "invalid JSON Schema"},
		{"file ref refused", `{"$ref":"file:///etc/passwd"}`, `1`, ErrInvalidSchema, "external references are not allowed"},
		{"remote ref refused", `{"$ref":"https://example.com/s.json"}`, `1`, ErrInvalidSchema, "external references are not allowed"},
		{"value not JSON", `{}`, `{"a":`, ErrInvalidJSON, "value is not valid JSON"},
		{"trailing garbage", `{}`, `1 2`, ErrInvalidJSON, "value is not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate([]byte(tt.schema), []byte(tt.value))
			require.ErrorIs(t, err, tt.kind)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestValidateCache(t *testing.T) {
	schema := []byte(`{"type":"object","properties":{"cache_test":{"type":"integer"}}}`)
	c1, err := compile(schema)
	require.NoError(t, err)
	c2, err := compile(append([]byte(nil), schema...))
	require.NoError(t, err)
	assert.Same(t, c1, c2, "same content, one compiled schema")

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				err := Validate(schema, fmt.Appendf(nil, `{"cache_test":%d}`, i*j))
				assert.NoError(t, err)
				err = Validate(schema, []byte(`{"cache_test":"x"}`))
				assert.ErrorIs(t, err, ErrMismatch)
			}
		})
	}
	wg.Wait()
}

// A schema that passed the metaschema is named in the cache file, and a
// later process (here: the caches emptied) compiles it without the check;
// a schema that failed it is never named, and fails again.
func TestRememberValid(t *testing.T) {
	forget := func() {
		cacheMu.Lock()
		clear(compiles)
		cacheMu.Unlock()
		RememberValid("")
	}
	t.Cleanup(forget)
	path := filepath.Join(t.TempDir(), "schemas.valid")
	good := []byte(`{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}`)
	bad := []byte(`{"type": "integr"}`)

	forget()
	RememberValid(path)
	checks := metaChecks.Load()
	require.NoError(t, Validate(good, []byte(`{"n": 1}`)))
	require.ErrorIs(t, Validate(bad, []byte(`1`)), ErrInvalidSchema)
	assert.Equal(t, checks+2, metaChecks.Load(), "both checked against the metaschema")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(good)
	assert.Equal(t, hex.EncodeToString(sum[:])+"\n", string(data), "only the valid one is named")

	forget() // a new process
	RememberValid(path)
	checks = metaChecks.Load()
	var ve *ValidationError
	require.ErrorAs(t, Validate(good, []byte(`{"n": -1}`)), &ve, "the schema still applies")
	assert.Equal(t, "/n", ve.Violations[0].Path)
	assert.Equal(t, checks, metaChecks.Load(), "the valid one compiled without the check")
	err = Validate(bad, []byte(`1`))
	require.ErrorIs(t, err, ErrInvalidSchema)
	assert.ErrorContains(t, err, "metaschema")
	assert.Equal(t, checks+1, metaChecks.Load(), "the invalid one checked again")

	forget() // no file given: nothing remembered, every schema checked
	checks = metaChecks.Load()
	require.NoError(t, Validate(good, []byte(`{"n": 1}`)))
	assert.Equal(t, checks+1, metaChecks.Load())
}
