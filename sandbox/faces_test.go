package sandbox_test

import (
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/httpapi"
)

// The tests of package sandbox serve the service with httpapi.Handler
// (see export_test.go).
func init() { sandbox.SetHTTPHandler(httpapi.Handler) }
