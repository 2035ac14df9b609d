// Package safe keeps a panic in one goroutine or request of a long-running
// server from taking the whole server down. A goroutine that panics kills
// the process, whatever recovers elsewhere; so every goroutine the box
// service starts, and every request it serves, defers Recover: the panic is
// logged with its stack and, where a caller waits for an answer, becomes
// that caller's error.
package safe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
)

// Recover must be deferred directly (defer safe.Recover(log, "reaper",
// &err)). On a panic it logs what panicked with the stack and, when errp is
// not nil, sets *errp to an error saying so. log nil means slog.Default().
func Recover(log *slog.Logger, what string, errp *error) {
	r := recover()
	if r == nil {
		return
	}
	if log == nil {
		log = slog.Default()
	}
	log.Error("panic recovered", "in", what, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	if errp != nil {
		*errp = fmt.Errorf("internal error in %s: %v (the server logged it and keeps running; please report it)", what, r)
	}
}

// Go runs fn in a new goroutine that recovers from a panic (see Recover).
func Go(log *slog.Logger, what string, fn func()) {
	go func() {
		defer Recover(log, what, nil)
		fn()
	}()
}

// PipeFrom runs src in a goroutine, writing into a pipe, and returns the
// pipe's reader and the channel src's error (a panic's, as an error)
// arrives on; the error also closes the pipe, so the reader sees it.
func PipeFrom(what string, src func(w io.Writer) error) (*io.PipeReader, <-chan error) {
	pr, pw := io.Pipe()
	srcErr := make(chan error, 1)
	go func() {
		var err error
		defer func() { pw.CloseWithError(err); srcErr <- err }()
		defer Recover(nil, what, &err)
		err = src(pw)
	}()
	return pr, srcErr
}

// PipeError picks the error to report of a copy from a source to a sink:
// the source's, unless it only failed because the sink closed the pipe.
func PipeError(srcErr, dstErr error) error {
	if srcErr != nil && !errors.Is(srcErr, io.ErrClosedPipe) {
		return srcErr
	}
	return dstErr
}

// ContextReader is r until ctx is done, then ctx's error: a copy from a
// reader that never blocks for long ends with the context.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
