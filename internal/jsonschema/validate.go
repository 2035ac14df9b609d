// Package jsonschema generates JSON Schemas (draft 2020-12) from Go types
// and validates JSON values against schemas, with errors that name the JSON
// path of every violation.
//
// Generation is github.com/google/jsonschema-go's (the MCP Go SDK's schema
// package), with the conventions For lists. Validation is
// santhosh-tekuri/jsonschema's (v6.0.3 with two patches, copied into
// internal/third_party/jsonschema; see its PATCHES.md), and stays so: it
// passes the JSON Schema test suite, asserts formats, and reports every
// violation as a structured error (kind, instance path, schema path), which
// Validate turns into a list a model can act on ("/edits/0/oldText: required
// property is missing").
// google/jsonschema-go's validator stops at the first violation and reports
// it as text only, and does not check formats; cell schemas are written by
// users, so they get the complete validator. One library generates, one
// validates: nothing is validated twice.
package jsonschema

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"

	js "github.com/cellbox/cellbox/internal/third_party/jsonschema"
	"github.com/cellbox/cellbox/internal/third_party/jsonschema/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Error kinds returned by Validate; test with errors.Is.
var (
	ErrInvalidSchema = errors.New("invalid JSON Schema")
	ErrInvalidJSON   = errors.New("value is not valid JSON")
	ErrMismatch      = errors.New("value does not match the schema")
)

// Violation is one way a value breaks a schema.
type Violation struct {
	Path    string // JSON pointer of the offending value ("" is the whole value)
	Message string // e.g. "must be >= 0 (got -1)"
}

func (v Violation) String() string {
	p := v.Path
	if p == "" {
		p = "(root)"
	}
	return p + ": " + v.Message
}

// ValidationError lists every violation found; it wraps ErrMismatch.
type ValidationError struct {
	Violations []Violation
}

func (e *ValidationError) Error() string {
	var sb strings.Builder
	sb.WriteString("value does not match the schema:")
	for _, v := range e.Violations {
		sb.WriteString("\n  ")
		sb.WriteString(v.String())
	}
	return sb.String()
}

func (e *ValidationError) Unwrap() error { return ErrMismatch }

// Validate checks value (JSON) against schema (JSON Schema; draft 2020-12
// unless it says otherwise with $schema). A value that breaks the schema
// gives a *ValidationError listing each violation with its JSON path; a
// schema that does not compile gives an error wrapping ErrInvalidSchema.
// The schema must be self-contained: $ref may point inside it, never to a
// file or URL. Compiled schemas are cached by content hash.
func Validate(schema []byte, value []byte) error {
	c, err := compile(schema)
	if err != nil {
		return err
	}
	v, err := js.UnmarshalJSON(bytes.NewReader(value))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	err = c.schema.Validate(v)
	if err == nil {
		return nil
	}
	var ve *js.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("validate: %w", err)
	}
	var out []Violation
	collect(ve, c.doc, &out)
	slices.SortStableFunc(out, func(a, b Violation) int { return strings.Compare(a.Path, b.Path) })
	return &ValidationError{Violations: slices.Compact(out)}
}

type compiled struct {
	schema *js.Schema
	doc    any // the schema document, to look property names up in
	err    error
}

const (
	schemaURL    = "mem:///schema.json"
	maxCacheSize = 1024
)

var (
	cacheMu  sync.Mutex
	compiles = map[[sha256.Size]byte]*compiled{}
)

func compile(schema []byte) (*compiled, error) {
	key := sha256.Sum256(schema)
	cacheMu.Lock()
	c, ok := compiles[key]
	cacheMu.Unlock()
	if !ok {
		c = doCompile(schema, key)
		cacheMu.Lock()
		if len(compiles) >= maxCacheSize {
			clear(compiles)
		}
		compiles[key] = c
		cacheMu.Unlock()
	}
	return c, c.err
}

// noLoader refuses external references, so a schema cannot read files.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref to %s: external references are not allowed; the schema must be self-contained", url)
}

func doCompile(schema []byte, key [sha256.Size]byte) *compiled {
	if checkedBefore(key) {
		if c := compileDoc(schema, true); c.err == nil {
			return c
		}
		// The file named a schema that does not compile: check it.
	}
	metaChecks.Add(1)
	c := compileDoc(schema, false)
	if c.err == nil {
		passed(key)
	}
	return c
}

// compileDoc compiles schema, checking it against the metaschema unless
// trusted.
func compileDoc(schema []byte, trusted bool) *compiled {
	doc, err := js.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return &compiled{err: fmt.Errorf("%w: not JSON: %v", ErrInvalidSchema, err)}
	}
	c := js.NewCompiler()
	if trusted {
		c.SkipMetaValidation()
	}
	c.DefaultDraft(js.Draft2020)
	c.AssertFormat()
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return &compiled{err: fmt.Errorf("%w: %v", ErrInvalidSchema, err)}
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return &compiled{err: fmt.Errorf("%w: %s", ErrInvalidSchema, schemaError(err))}
	}
	return &compiled{schema: s, doc: doc}
}

// schemaError explains a compile error: for a schema that breaks the
// metaschema, the paths of the offending keywords.
func schemaError(err error) string {
	var sve *js.SchemaValidationError
	var ve *js.ValidationError
	if errors.As(err, &sve) && errors.As(sve.Err, &ve) {
		var out []Violation
		collect(ve, nil, &out)
		var parts []string
		for _, v := range slices.Compact(out) {
			parts = append(parts, v.String())
		}
		return "it breaks the JSON Schema metaschema: " + strings.Join(parts, "; ")
	}
	return strings.ReplaceAll(err.Error(), schemaURL, "schema")
}

// collect appends the leaf errors of e: the ones that say what is wrong.
func collect(e *js.ValidationError, doc any, out *[]Violation) {
	if types := altTypes(e); types != nil {
		*out = append(*out, Violation{pointer(e.InstanceLocation),
			fmt.Sprintf("must be %s (got %s)", strings.Join(types, " or "), e.Causes[0].ErrorKind.(*kind.Type).Got)})
		return
	}
	if len(e.Causes) > 0 {
		for _, c := range valueTypeCauses(e) {
			collect(c, doc, out)
		}
		return
	}
	path := pointer(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, m := range k.Missing {
			*out = append(*out, Violation{path + "/" + escape(m), "required property is missing"})
		}
	case *kind.AdditionalProperties:
		allowed := allowedProperties(doc, e.SchemaURL)
		for _, p := range k.Properties {
			msg := "unknown property"
			if len(allowed) > 0 {
				msg += " (allowed: " + strings.Join(allowed, ", ") + ")"
			} else {
				msg += " (not allowed here)"
			}
			*out = append(*out, Violation{path + "/" + escape(p), msg})
		}
	default:
		*out = append(*out, Violation{path, describe(e.ErrorKind)})
	}
}

var printer = message.NewPrinter(language.English)

// altTypes returns the wanted types when e is an anyOf/oneOf whose
// alternatives all failed only on the type of the value itself.
func altTypes(e *js.ValidationError) []string {
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
	default:
		return nil
	}
	var types []string
	for _, c := range e.Causes {
		t, ok := c.ErrorKind.(*kind.Type)
		if !ok || len(c.Causes) > 0 || !slices.Equal(c.InstanceLocation, e.InstanceLocation) {
			return nil
		}
		types = append(types, t.Want...)
	}
	return types
}

// valueTypeCauses returns the causes of e worth reporting. Of an anyOf or
// oneOf, the alternatives that failed only because the value has another
// type say nothing useful when an alternative of the value's own type
// failed on its content: {"network": {"allow": "x"}} is about allow, not
// "network: must be boolean (got object)".
func valueTypeCauses(e *js.ValidationError) []*js.ValidationError {
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
	default:
		return e.Causes
	}
	var deeper []*js.ValidationError
	for _, c := range e.Causes {
		if _, ok := c.ErrorKind.(*kind.Type); ok && len(c.Causes) == 0 && slices.Equal(c.InstanceLocation, e.InstanceLocation) {
			continue
		}
		deeper = append(deeper, c)
	}
	if len(deeper) == 0 {
		return e.Causes
	}
	return deeper
}

// describe says what is wrong, in words an LLM can act on.
func describe(k js.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		return fmt.Sprintf("must be %s (got %s)", strings.Join(k.Want, " or "), k.Got)
	case *kind.Enum:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = show(w)
		}
		return fmt.Sprintf("must be one of %s (got %s)", strings.Join(want, ", "), show(k.Got))
	case *kind.Const:
		return fmt.Sprintf("must be %s (got %s)", show(k.Want), show(k.Got))
	case *kind.Minimum:
		return fmt.Sprintf("must be >= %s (got %s)", rat(k.Want), rat(k.Got))
	case *kind.Maximum:
		return fmt.Sprintf("must be <= %s (got %s)", rat(k.Want), rat(k.Got))
	case *kind.ExclusiveMinimum:
		return fmt.Sprintf("must be > %s (got %s)", rat(k.Want), rat(k.Got))
	case *kind.ExclusiveMaximum:
		return fmt.Sprintf("must be < %s (got %s)", rat(k.Want), rat(k.Got))
	case *kind.MultipleOf:
		return fmt.Sprintf("must be a multiple of %s (got %s)", rat(k.Want), rat(k.Got))
	case *kind.MinLength:
		return fmt.Sprintf("must be at least %d characters long (got %d)", k.Want, k.Got)
	case *kind.MaxLength:
		return fmt.Sprintf("must be at most %d characters long (got %d)", k.Want, k.Got)
	case *kind.MinItems:
		return fmt.Sprintf("must have at least %d items (got %d)", k.Want, k.Got)
	case *kind.MaxItems:
		return fmt.Sprintf("must have at most %d items (got %d)", k.Want, k.Got)
	case *kind.MinProperties:
		return fmt.Sprintf("must have at least %d properties (got %d)", k.Want, k.Got)
	case *kind.MaxProperties:
		return fmt.Sprintf("must have at most %d properties (got %d)", k.Want, k.Got)
	case *kind.Pattern:
		return fmt.Sprintf("must match the pattern %s (got %s)", show(k.Want), show(k.Got))
	case *kind.Format:
		return fmt.Sprintf("must be a valid %s (got %s: %v)", k.Want, show(k.Got), k.Err)
	case *kind.UniqueItems:
		return fmt.Sprintf("items must be unique (items %d and %d are equal)", k.Duplicates[0], k.Duplicates[1])
	case *kind.FalseSchema:
		return "no value is allowed here"
	}
	return k.LocalizedString(printer)
}

func rat(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return fmt.Sprint(f)
}

// show renders a JSON value briefly.
func show(v any) string {
	s := fmt.Sprintf("%v", v)
	switch v.(type) {
	case string:
		s = fmt.Sprintf("%q", v)
	case nil:
		s = "null"
	}
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func pointer(tokens []string) string {
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		sb.WriteString(escape(t))
	}
	return sb.String()
}

func escape(tok string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(tok)
}

// allowedProperties returns the names under "properties" of the subschema
// at schemaURL (schemaURL#/json/pointer) in doc, sorted; nil if unknown.
func allowedProperties(doc any, url string) []string {
	_, ptr, ok := strings.Cut(url, "#")
	if !ok || doc == nil {
		return nil
	}
	node := doc
	for tok := range strings.SplitSeq(ptr, "/") {
		if tok == "" {
			continue
		}
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch n := node.(type) {
		case map[string]any:
			node = n[tok]
		case []any:
			var i int
			if _, err := fmt.Sscanf(tok, "%d", &i); err != nil || i < 0 || i >= len(n) {
				return nil
			}
			node = n[i]
		default:
			return nil
		}
	}
	obj, _ := node.(map[string]any)
	props, _ := obj["properties"].(map[string]any)
	names := make([]string, 0, len(props))
	for k := range props {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
