package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cellbox/cellbox/internal/readall"
)

// maxEventLine bounds one line of a provider's event stream, and a whole
// answer that is not a stream (readAnswer).
const maxEventLine = 8 << 20

// readAnswer reads a provider's answer that is one JSON document, not an
// event stream, capped at maxEventLine.
func readAnswer(r io.Reader) ([]byte, error) {
	b, err := readall.Capped(r, maxEventLine)
	if errors.Is(err, readall.ErrTooLarge) {
		err = fmt.Errorf("an answer of more than %d bytes", maxEventLine)
	}
	return b, err
}

// MaxRetryAfter bounds the wait before the one retry of a 429: a longer
// Retry-After fails the call at once with the provider's message.
var MaxRetryAfter = 30 * time.Second

// post sends body as JSON to url with the headers and returns the response
// of a 2xx. A 429 is retried once after its Retry-After (bounded by
// MaxRetryAfter); any other non-2xx becomes an *APIError (parseErrorBody).
func post(ctx context.Context, hc *http.Client, provider, url string, headers map[string]string, body any) (*http.Response, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("%s: encode the request: %w", provider, err)
	}
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", provider, err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			// The URL is not secret (keys travel in headers); it tells the
			// user which server did not answer.
			return nil, fmt.Errorf("%s: %w", provider, err)
		}
		if resp.StatusCode/100 == 2 {
			return resp, nil
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		apiErr := &APIError{Provider: provider, Status: resp.StatusCode}
		apiErr.Type, apiErr.Message = parseErrorBody(msg)
		if apiErr.Message == "" && apiErr.Type == "" {
			apiErr.Message = strings.TrimSpace(string(msg))
		}
		// A key the server echoes here is redacted where every error
		// leaves the provider (redacting, llm.go).
		if resp.StatusCode != http.StatusTooManyRequests || attempt > 0 {
			return nil, apiErr
		}
		wait, ok := retryAfter(resp.Header.Get("Retry-After"))
		if !ok {
			apiErr.Wait = wait
			return nil, apiErr
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// retryAfter reads a Retry-After header (seconds or an HTTP date); no
// header waits one second. ok is false beyond MaxRetryAfter.
func retryAfter(h string) (time.Duration, bool) {
	d := time.Second
	if h != "" {
		if s, err := strconv.ParseFloat(h, 64); err == nil && s >= 0 {
			d = time.Duration(s * float64(time.Second))
		} else if t, err := http.ParseTime(h); err == nil {
			d = max(time.Until(t), 0)
		}
	}
	return d, d <= MaxRetryAfter
}

// parseErrorBody reads the type and message of a provider's error body:
// both APIs answer {"error": {"type", "message"}}.
func parseErrorBody(b []byte) (typ, msg string) {
	var e struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return "", ""
	}
	return e.Error.Type, e.Error.Message
}

// streamError is what a failed read of a stream returns: the provider's
// own error when it sent one, else the context's error when the call was
// cancelled (the read failed because of it), else err.
func streamError(ctx context.Context, err error) error {
	var apiErr *APIError
	if ctx.Err() != nil && !errors.As(err, &apiErr) {
		return ctx.Err()
	}
	return err
}
