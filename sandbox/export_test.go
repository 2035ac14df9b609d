package sandbox

import "net/http"

// The service's tests drive it as its clients do, over its HTTP face
// (sandbox/httpapi). That package imports this one, so a test file of
// package sandbox cannot import it; faces_test.go, an external test file
// of the same test binary, hands its handler in here before the tests run.
var httpHandler func(*Service) http.Handler

// SetHTTPHandler sets the handler startHTTP serves.
func SetHTTPHandler(h func(*Service) http.Handler) { httpHandler = h }
