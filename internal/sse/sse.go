// Package sse reads server-sent events (text/event-stream), for the clients
// of cellbox's own streams (box watches, cell watches) and of model
// providers' streaming answers.
//
// Hand-written: the part of the format a client needs (WHATWG HTML,
// "Interpreting an event stream": fields, comments, blank-line dispatch)
// is these few lines, and the SSE libraries (tmaxmax/go-sse, r3labs/sse)
// bring their own HTTP clients, reconnection and servers that none of
// these callers wants.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Stop, returned by Read's fn, ends the read without an error.
var Stop = errors.New("stop reading the event stream")

// Read calls fn with each event of r — its name ("" when it has none) and
// its data lines joined with "\n" — until r ends, fn returns an error, or
// a line is longer than maxLine bytes (bufio.ErrTooLong). It returns nil
// at the end of r or when fn returns Stop, else the error. Comments
// (keep-alives) and fields other than event and data are skipped; an
// event with neither a name nor data is not dispatched.
func Read(r io.Reader, maxLine int, fn func(event string, data []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, min(64<<10, maxLine)), maxLine)
	var event string
	var data bytes.Buffer
	dispatch := func() error {
		if data.Len() == 0 && event == "" {
			return nil
		}
		err := fn(event, bytes.TrimSuffix(data.Bytes(), []byte("\n")))
		event = ""
		data.Reset()
		return err
	}
	err := func() error {
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				if err := dispatch(); err != nil {
					return err
				}
				continue
			}
			if strings.HasPrefix(line, ":") {
				continue // a comment: a keep-alive
			}
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				event = value
			case "data":
				data.WriteString(value)
				data.WriteByte('\n')
			}
		}
		if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("event stream: a line of more than %d bytes, the most read: %w", maxLine, err)
		} else if err != nil {
			return err
		}
		return dispatch()
	}()
	if errors.Is(err, Stop) {
		return nil
	}
	return err
}
