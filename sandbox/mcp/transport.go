package mcp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Serve runs the stdio transport: it reads newline-delimited JSON-RPC
// messages from r and writes each answer to w as one line. Requests run
// concurrently, so a ping or a cancellation is not stuck behind a long tool
// call. Serve returns nil once r ends and the requests in flight are
// answered, ctx.Err() when ctx ends first, or the error of a failed write.
func (s *Server) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wmu sync.Mutex
		wg  sync.WaitGroup
	)
	write := func(answer []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		if _, err := w.Write(append(answer, '\n')); err != nil {
			cancel(fmt.Errorf("write answer: %w", err))
		}
	}
	type line struct {
		msg     []byte
		tooLong bool
	}
	lines := make(chan line)
	readErr := make(chan error, 1)
	go func() {
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			msg, tooLong, err := readLine(br, MaxMessage)
			if len(bytes.TrimSpace(msg)) > 0 || tooLong {
				select {
				case lines <- line{msg, tooLong}:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				readErr <- err
				return
			}
		}
	}()
	for {
		select {
		case l := <-lines:
			if l.tooLong {
				write(encodeError(nil, errorf(CodeInvalidRequest, "message is larger than %d bytes", MaxMessage)))
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if answer := s.Handle(ctx, l.msg); answer != nil {
					write(answer)
				}
			}()
		case err := <-readErr:
			wg.Wait()
			if err != nil {
				return fmt.Errorf("read messages: %w", err)
			}
			return context.Cause(ctx) // a failed write, else nil
		case <-ctx.Done():
			wg.Wait()
			return context.Cause(ctx)
		}
	}
}

// readLine reads one line (its newline included) of at most max bytes;
// tooLong says a longer one was read and dropped.
func readLine(br *bufio.Reader, max int) (msg []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if len(msg)+len(chunk) <= max && !tooLong {
			msg = append(msg, chunk...)
		} else {
			msg, tooLong = nil, true
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return msg, tooLong, err
		}
	}
}

// ServeHTTP serves the Streamable HTTP transport without event streams: a
// POST carries one JSON-RPC message; a request is answered with
// application/json (400 when it was not a valid request at all), a
// notification or response with 202 and no body. Other methods get 405: the
// server opens no stream of its own.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeHTTP(w, http.StatusMethodNotAllowed, encodeError(nil, errorf(CodeInvalidRequest,
			"method %s not allowed: POST one JSON-RPC message; this server opens no event stream", r.Method)))
		return
	}
	if v := r.Header.Get("MCP-Protocol-Version"); v != "" && !Supported(v) {
		writeHTTP(w, http.StatusBadRequest, encodeError(nil, errorf(CodeInvalidRequest,
			"unsupported MCP-Protocol-Version %q; supported: %s", v, strings.Join(SupportedVersions, ", "))))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxMessage))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeHTTP(w, http.StatusRequestEntityTooLarge, encodeError(nil, errorf(CodeInvalidRequest, "message is larger than %d bytes", MaxMessage)))
		return
	case err != nil:
		writeHTTP(w, http.StatusBadRequest, encodeError(nil, errorf(CodeParseError, "read request body: %v", err)))
		return
	}
	answer, rejected := s.handle(r.Context(), body)
	switch {
	case answer == nil:
		w.WriteHeader(http.StatusAccepted)
	case rejected:
		writeHTTP(w, http.StatusBadRequest, answer)
	default:
		writeHTTP(w, http.StatusOK, answer)
	}
}

func writeHTTP(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
