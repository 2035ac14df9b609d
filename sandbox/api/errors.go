package api

import (
	"errors"
	"io/fs"
)

// Error codes: the kind of a failure, a small closed set. A tool result
// with is_error: true carries one in its "code" field beside "error" (the
// message, written for a model or a person to act on); the clients turn a
// code into the sentinel error below, so callers test failures with
// errors.Is instead of matching messages.
const (
	CodeInvalidInput     = "invalid_input"     // the input is malformed or names something impossible
	CodeNotFound         = "not_found"         // no such file or directory (or process, ...)
	CodeNoBox            = "no_box"            // the session has no sandbox of that name
	CodeNoSession        = "no_session"        // the session does not exist (any more)
	CodeOutsideWorkspace = "outside_workspace" // a path leaves the sandbox's workspace
	CodeExists           = "exists"            // the thing to create is already there
	CodeTooLarge         = "too_large"         // a file, input or output is over a limit
	CodeTimeout          = "timeout"           // the operation ran out of time
	CodeRefused          = "refused"           // the command is outside the session's allowed_commands
	CodeLimit            = "limit"             // a cap on sandboxes (per session or server) is reached
	CodeUnavailable      = "unavailable"       // the server is shutting down: call again once it is back
	CodeInternal         = "internal"          // anything else: a fault of the service or the backend
)

// Sentinel errors, one per code. Both clients (in process and HTTP) return
// errors for which errors.Is(err, ErrX) holds when the failure has code X.
var (
	ErrInvalidInput = errors.New("invalid input")
	// ErrNotFound is fs.ErrNotExist, so either test works.
	ErrNotFound         = fs.ErrNotExist
	ErrNoBox            = errors.New("no sandbox of that name in this session")
	ErrNoSession        = errors.New("no such session")
	ErrOutsideWorkspace = errors.New("path outside the workspace")
	// ErrExists is fs.ErrExist, so either test works.
	ErrExists   = fs.ErrExist
	ErrTooLarge = errors.New("too large")
	ErrTimeout  = errors.New("timed out")
	ErrRefused  = errors.New("command not in allowed_commands")
	ErrLimit    = errors.New("sandbox limit reached")
	// ErrUnavailable: the call did not fail on its own; the server could
	// not serve it (it is shutting down). Retryable.
	ErrUnavailable = errors.New("server unavailable")
	ErrInternal    = errors.New("internal error")
)

// codes lists the codes with their sentinels, in the order CodeOf tries
// them.
var codes = []struct {
	code string
	err  error
}{
	{CodeNoBox, ErrNoBox},
	{CodeNoSession, ErrNoSession},
	{CodeOutsideWorkspace, ErrOutsideWorkspace},
	{CodeRefused, ErrRefused},
	{CodeLimit, ErrLimit},
	{CodeTooLarge, ErrTooLarge},
	{CodeTimeout, ErrTimeout},
	{CodeInvalidInput, ErrInvalidInput},
	{CodeNotFound, ErrNotFound},
	{CodeExists, ErrExists},
	{CodeUnavailable, ErrUnavailable},
	{CodeInternal, ErrInternal},
}

// Sentinel returns the sentinel error of code, or nil for "" or a code it
// does not know (a newer server's).
func Sentinel(code string) error {
	for _, c := range codes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// Coder is an error that knows its code.
type Coder interface {
	error
	ErrorCode() string
}

// CodeOf returns the code of err: that of the first Coder in its chain, or
// of the first sentinel it matches, or "" if none.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	var c Coder
	if errors.As(err, &c) && c.ErrorCode() != "" {
		return c.ErrorCode()
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return ""
}

// WithCode gives err the code (errors.Is(result, Sentinel(code)) holds)
// without changing its message. A nil err or an empty code leaves err as
// it is.
func WithCode(code string, err error) error {
	if err == nil || code == "" {
		return err
	}
	return &codedError{code: code, err: err}
}

type codedError struct {
	code string
	err  error
}

func (e *codedError) Error() string     { return e.err.Error() }
func (e *codedError) Unwrap() error     { return e.err }
func (e *codedError) ErrorCode() string { return e.code }
func (e *codedError) Is(target error) bool {
	return target != nil && target == Sentinel(e.code)
}
