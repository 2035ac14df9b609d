package jsonschema

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type editParams struct {
	Path  string `json:"path" desc:"absolute path of the file"`
	Edits []struct {
		OldText string `json:"old_text"`
		NewText string `json:"new_text"`
	} `json:"edits" desc:"replacements, each matched against the original file"`
	DryRun bool `json:"dry_run,omitempty" default:"false"`
}

type scalars struct {
	S    string            `json:"s"`
	B    bool              `json:"b"`
	I    int64             `json:"i"`
	U    uint8             `json:"u"`
	F    float32           `json:"f"`
	P    *int              `json:"p,omitempty"`
	Z    int               `json:"z,omitzero"`
	Raw  json.RawMessage   `json:"raw"`
	Any  any               `json:"any"`
	T    time.Time         `json:"t"`
	D    time.Duration     `json:"d"`
	Blob []byte            `json:"blob"`
	Arr  [2]float64        `json:"arr"`
	M    map[string]int    `json:"m"`
	Skip string            `json:"-"`
	NoTg string            //
	priv string            //nolint:unused
	Nest *struct{ A int }  `json:"nest"`
	SS   [][]string        `json:"ss"`
	MS   map[string]*inner `json:"ms"`
}

type inner struct {
	N int `json:"n" minimum:"1" maximum:"9"`
}

func TestForTypes(t *testing.T) {
	got := string(JSON(scalars{}))
	want := `{"type":"object","properties":{` +
		`"s":{"type":"string"},"b":{"type":"boolean"},"i":{"type":"integer"},"u":{"type":"integer","minimum":0,"maximum":255},` +
		`"f":{"type":"number"},"p":{"type":"integer"},"z":{"type":"integer"},"raw":true,"any":true,` +
		`"t":{"type":"string","format":"date-time"},"d":{"type":"integer"},"blob":{"type":"string","contentEncoding":"base64"},` +
		`"arr":{"type":"array","items":{"type":"number"},"minItems":2,"maxItems":2},` +
		`"m":{"type":"object","additionalProperties":{"type":"integer"}},` +
		`"NoTg":{"type":"string"},` +
		`"nest":{"type":"object","properties":{"A":{"type":"integer"}},"required":["A"],"additionalProperties":false},` +
		`"ss":{"type":"array","items":{"type":"array","items":{"type":"string"}}},` +
		`"ms":{"type":"object","additionalProperties":{"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":9}},"required":["n"],"additionalProperties":false}}` +
		`},"required":["s","b","i","u","f","raw","any","t","d","blob","arr","m","NoTg","nest","ss","ms"],"additionalProperties":false}`
	assert.Equal(t, want, got, "properties keep declaration order")
}

func TestForTags(t *testing.T) {
	type tagged struct {
		Mode    string   `json:"mode,omitempty" desc:"how" enum:"fast, slow" default:"fast"`
		Level   int      `json:"level,omitempty" enum:"1,2,3" default:"2" minimum:"1" maximum:"3"`
		Ratio   float64  `json:"ratio" minimum:"-0.5"`
		On      *bool    `json:"on,omitempty" default:"true"`
		Tags    []string `json:"tags,omitempty" enum:"a,b" default:"[\"a\"]"`
		Counts  []int    `json:"counts,omitempty" minimum:"0"`
		Started string   `json:"started" desc:"when"`
	}
	s := For(tagged{})
	mode := s.Properties["mode"]
	assert.Equal(t, "how", mode.Description)
	assert.JSONEq(t, `"fast"`, string(mode.Default))
	assert.Equal(t, []any{"fast", "slow"}, mode.Enum)
	level := s.Properties["level"]
	assert.Equal(t, []any{1, 2, 3}, level.Enum)
	assert.JSONEq(t, `2`, string(level.Default))
	assert.Equal(t, 1.0, *level.Minimum)
	assert.Equal(t, 3.0, *level.Maximum)
	assert.Equal(t, -0.5, *s.Properties["ratio"].Minimum)
	assert.JSONEq(t, `true`, string(s.Properties["on"].Default))
	tags := s.Properties["tags"]
	assert.JSONEq(t, `["a"]`, string(tags.Default))
	assert.Equal(t, []any{"a", "b"}, tags.Items.Enum, "enum on a slice constrains its items")
	assert.Equal(t, 0.0, *s.Properties["counts"].Items.Minimum)
	assert.Equal(t, []string{"ratio", "started"}, s.Required)

	b, err := json.Marshal(s)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"level":{"type":"integer","default":2,"enum":[1,2,3],"minimum":1,"maximum":3}`)
}

type Base struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Shadow  int    `json:"shadow"`
	Clash   int
	private int
}

type other struct {
	Clash int
	Extra bool `json:"extra,omitempty"`
}

type withEmbedded struct {
	Base
	*other
	Shadow string `json:"shadow,omitempty"` // the shallower field wins
	Named  Base   `json:"named"`
}

func TestForEmbedded(t *testing.T) {
	s := For(&withEmbedded{})
	assert.Equal(t, []string{"id", "name", "extra", "shadow", "named"}, s.PropertyOrder,
		"embedded fields flattened; the clashing Clash fields cancel out as in encoding/json")
	assert.Equal(t, "string", s.Properties["shadow"].Type)
	assert.Equal(t, []string{"id", "name", "named"}, s.Required)

	// the schema agrees with what encoding/json produces
	v := withEmbedded{Base: Base{ID: "1", Name: "n", Shadow: 3}, other: &other{Extra: true}, Shadow: "s"}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, Validate(JSON(v), b))
}

type tree struct {
	Name     string  `json:"name"`
	Children []*tree `json:"children,omitempty"`
	Link     *link   `json:"link,omitempty"`
}

type link struct {
	To   string `json:"to"`
	Next *link  `json:"next,omitempty"`
}

func TestForRecursive(t *testing.T) {
	s := For(tree{})
	assert.Equal(t, "#", s.Properties["children"].Items.Ref)
	require.Contains(t, s.Defs, "link")
	assert.Equal(t, "#/$defs/link", s.Defs["link"].Properties["next"].Ref)

	schema := JSON(tree{})
	ok := `{"name":"a","children":[{"name":"b","link":{"to":"x","next":{"to":"y"}}}]}`
	require.NoError(t, Validate(schema, []byte(ok)))
	err := Validate(schema, []byte(`{"name":"a","children":[{"name":1,"link":{"to":"x","next":{"too":"y"}}}]}`))
	require.Error(t, err)
	assert.Equal(t, "value does not match the schema:\n"+
		"  /children/0/link/next/to: required property is missing\n"+
		"  /children/0/link/next/too: unknown property (allowed: next, to)\n"+
		"  /children/0/name: must be string (got number)", err.Error())
}

func TestForErrors(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"nil", nil, "cannot describe nil"},
		{"chan field", struct {
			C chan int `json:"c"`
		}{}, "type chan int is unsupported"},
		{"bad default", struct {
			N int `json:"n" default:"many"`
		}{}, `field N: default:"many": not a valid int`},
		{"bad enum", struct {
			N []int `json:"n" enum:"1,x"`
		}{}, `field N: enum:"1,x": not a valid int`},
		{"minimum on a string", struct {
			S string `json:"s" minimum:"1"`
		}{}, `field S: minimum:"1" on a string: only numbers have a minimum`},
		{"bad minimum", struct {
			N int `json:"n" minimum:"one"`
		}{}, `field N: minimum:"one" is not a number`},
		{"struct map key", map[struct{ A int }]int{}, "unsupported map key type struct"},
		{"nested path", struct {
			In struct {
				F func() `json:"f"`
			} `json:"in"`
		}{}, "type func() is unsupported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Generate(tt.v)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Panics(t, func() { For(tt.v) })
		})
	}
}

func TestForIndependent(t *testing.T) {
	a := For(editParams{})
	a.Properties["path"].Description = "changed"
	a.Required = append(a.Required, "x")
	b := For(reflect.TypeFor[*editParams]())
	assert.Equal(t, "absolute path of the file", b.Properties["path"].Description, "For returns a copy the caller may change")
	assert.Equal(t, []string{"path", "edits"}, b.Required)
	assert.Equal(t, string(JSON(editParams{})), string(JSON(&editParams{})))
}

func TestForValidatesItsOwnValues(t *testing.T) {
	schema := JSON(editParams{})
	good := editParams{Path: "/w/a.go"}
	good.Edits = append(good.Edits, struct {
		OldText string `json:"old_text"`
		NewText string `json:"new_text"`
	}{"a", "b"})
	b, err := json.Marshal(good)
	require.NoError(t, err)
	require.NoError(t, Validate(schema, b))

	err = Validate(schema, []byte(`{"path":"/w/a.go","edits":[{"oldText":"a","new_text":"b"}],"dry_run":"yes"}`))
	require.Error(t, err)
	assert.Equal(t, "value does not match the schema:\n"+
		"  /dry_run: must be boolean (got string)\n"+
		"  /edits/0/oldText: unknown property (allowed: new_text, old_text)\n"+
		"  /edits/0/old_text: required property is missing", err.Error())
}

// TestForPointers checks that a pointer has its element's schema: the
// library's ["null", T] is collapsed, and a pointer to a type of any value
// stays any value (the library would make it allow null only).
func TestForPointers(t *testing.T) {
	type ptrs struct {
		Raw  *json.RawMessage `json:"raw"`
		When *time.Time       `json:"when"`
		List *[]int           `json:"list"`
	}
	s := For(ptrs{})
	assert.Empty(t, s.Properties["raw"].Types)
	assert.Equal(t, "", s.Properties["raw"].Type)
	assert.Equal(t, "string", s.Properties["when"].Type)
	assert.Equal(t, "date-time", s.Properties["when"].Format)
	assert.Equal(t, "array", s.Properties["list"].Type)
	require.NoError(t, Validate(JSON(ptrs{}), []byte(`{"raw":{"a":1},"when":"2026-01-02T03:04:05Z","list":[1]}`)))
	err := Validate(JSON(ptrs{}), []byte(`{"raw":1,"when":null,"list":[1]}`))
	require.Error(t, err)
	assert.Equal(t, "value does not match the schema:\n  /when: must be string (got null)", err.Error())
}

// boolOrRules is JSON true or an object, like api.Network.
type boolOrRules struct{ rules }

type rules struct {
	Allow []string `json:"allow,omitempty" desc:"allowed"`
}

func (boolOrRules) JSONSchemaAnyOf() []any             { return []any{false, rules{}} }
func (b boolOrRules) MarshalJSON() ([]byte, error)     { return json.Marshal(b.rules) }
func (b *boolOrRules) UnmarshalJSON(data []byte) error { return nil }

func TestForAnyOf(t *testing.T) {
	type in struct {
		Net *boolOrRules `json:"net,omitempty" desc:"the network"`
	}
	s := For(in{})
	p := s.Properties["net"]
	require.Len(t, p.AnyOf, 2, "a JSONSchemaAnyOf type is anyOf its shapes, not any value")
	assert.Equal(t, "boolean", p.AnyOf[0].Type)
	assert.Equal(t, "object", p.AnyOf[1].Type)
	assert.Equal(t, "allowed", p.AnyOf[1].Properties["allow"].Description)
	assert.Equal(t, "the network", p.Description)
	raw, err := json.Marshal(s)
	require.NoError(t, err)
	require.NoError(t, Validate(raw, []byte(`{"net": true}`)))
	require.NoError(t, Validate(raw, []byte(`{"net": {"allow": ["x"]}}`)))
	require.Error(t, Validate(raw, []byte(`{"net": "yes"}`)))
	require.Error(t, Validate(raw, []byte(`{"net": {"deny": []}}`)))
}
