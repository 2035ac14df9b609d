package patterns

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cellbox/cellbox/internal/jsonschema"
)

// checkSchema checks that schema is a valid JSON Schema and that value
// (JSON; nil for none) satisfies it, as the cell store will on every write.
func checkSchema(schema, value []byte) error {
	check := value
	if check == nil {
		check = []byte("null")
	}
	err := jsonschema.Validate(schema, check)
	var ve *jsonschema.ValidationError
	switch {
	case err == nil, value == nil && errors.Is(err, jsonschema.ErrMismatch):
		return nil
	case errors.As(err, &ve):
		s := make([]string, len(ve.Violations))
		for i, v := range ve.Violations {
			s[i] = v.String()
		}
		return fmt.Errorf("initial value does not satisfy the schema: %s", strings.Join(s, "; "))
	}
	return err
}
