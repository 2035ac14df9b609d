// Package llmtest is a scripted chat-model server for tests: an httptest
// server that speaks the Anthropic Messages API (POST /v1/messages) and
// OpenAI Chat Completions (POST /v1/chat/completions) exactly as they
// stream — SSE events, text in small deltas, tool-call arguments split
// across chunks, usage blocks, error statuses and error events — and
// plays a script of turns, one per request, recording each request.
//
// No model is reachable from the test machines, so this stands in for
// the provider while the real client code runs against it.
package llmtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Call is a tool call a turn makes.
type Call struct {
	ID    string
	Name  string
	Input string // JSON arguments
}

// Turn is one scripted answer.
type Turn struct {
	Text  string
	Calls []Call
	// Status, if set, answers with that HTTP status and an error body
	// carrying ErrMessage (and RetryAfter as the Retry-After header).
	Status     int
	RetryAfter string
	ErrMessage string
	// StreamError sends an error event after the text (Status 200).
	StreamError string
	// Garbage sends a data line that is not JSON after the text, in its
	// place (Status 200).
	Garbage string
	// Hold, if not nil, is waited on after the first text delta (or the
	// client going away), to abort a call mid-stream.
	Hold chan struct{}
	// Started, if not nil, is closed once the first text delta is flushed.
	Started chan struct{}
	// Usage in and out tokens; zero gives 10 and 5.
	In, Out int
}

// Request is a request the server got.
type Request struct {
	Path   string
	Query  string // the raw query
	Header http.Header
	Body   map[string]any
	Raw    string
}

// Server plays a script.
type Server struct {
	*httptest.Server
	t      testing.TB
	mu     sync.Mutex
	script []Turn
	reqs   []Request
}

// New starts a server playing script; it closes with the test.
func New(t testing.TB, script ...Turn) *Server {
	s := &Server{t: t, script: script}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.anthropic)
	mux.HandleFunc("POST /v1/chat/completions", s.openai)
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// Add appends turns to the script.
func (s *Server) Add(turns ...Turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, turns...)
}

// Requests returns the requests so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Env returns the environment that points both providers here.
func (s *Server) Env() map[string]string {
	return map[string]string{
		"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": s.URL,
		"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": s.URL + "/v1",
	}
}

// next records r and pops the next turn; false when the script is done.
func (s *Server) next(w http.ResponseWriter, r *http.Request) (Turn, bool) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, Request{Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body, Raw: string(raw)})
	if len(s.script) == 0 {
		s.t.Errorf("llmtest: request %d beyond the script", len(s.reqs))
		http.Error(w, `{"error":{"type":"script_done","message":"the script has no more turns"}}`, http.StatusInternalServerError)
		return Turn{}, false
	}
	t := s.script[0]
	s.script = s.script[1:]
	if t.Status != 0 {
		if t.RetryAfter != "" {
			w.Header().Set("Retry-After", t.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(t.Status)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"scripted_error","message":%q}}`, t.ErrMessage)
		return Turn{}, false
	}
	if t.In == 0 && t.Out == 0 {
		t.In, t.Out = 10, 5
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	return t, true
}

// pieces splits s into chunks of at most n bytes.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

type sender struct {
	w http.ResponseWriter
	r *http.Request
}

func (x sender) event(name string, v any) {
	raw, _ := json.Marshal(v)
	if name != "" {
		fmt.Fprintf(x.w, "event: %s\n", name)
	}
	fmt.Fprintf(x.w, "data: %s\n\n", raw)
	x.w.(http.Flusher).Flush()
}

// garbage sends data as a data line as it is (not JSON).
func (x sender) garbage(name, data string) {
	if name != "" {
		fmt.Fprintf(x.w, "event: %s\n", name)
	}
	fmt.Fprintf(x.w, "data: %s\n\n", data)
	x.w.(http.Flusher).Flush()
}

// hold waits on t.Hold after the first delta; false when the client left.
func (x sender) hold(t Turn, first bool) bool {
	if !first {
		return true
	}
	if t.Started != nil {
		close(t.Started)
	}
	if t.Hold == nil {
		return true
	}
	select {
	case <-t.Hold:
		return true
	case <-x.r.Context().Done():
		return false
	}
}

func (s *Server) anthropic(w http.ResponseWriter, r *http.Request) {
	t, ok := s.next(w, r)
	if !ok {
		return
	}
	x := sender{w, r}
	x.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_1", "type": "message", "role": "assistant", "content": []any{},
		"usage": map[string]any{"input_tokens": t.In, "output_tokens": 1}}})
	x.event("ping", map[string]any{"type": "ping"})
	idx := 0
	if t.Text != "" {
		x.event("content_block_start", map[string]any{"type": "content_block_start", "index": idx, "content_block": map[string]any{"type": "text", "text": ""}})
		for i, p := range pieces(t.Text, 4) {
			x.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx, "delta": map[string]any{"type": "text_delta", "text": p}})
			if !x.hold(t, i == 0) {
				return
			}
		}
		x.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx})
		idx++
	}
	if t.StreamError != "" {
		x.event("error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": t.StreamError}})
		return
	}
	if t.Garbage != "" {
		x.garbage("content_block_delta", t.Garbage)
		return
	}
	for _, c := range t.Calls {
		x.event("content_block_start", map[string]any{"type": "content_block_start", "index": idx, "content_block": map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": map[string]any{}}})
		for _, p := range pieces(c.Input, 7) {
			x.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx, "delta": map[string]any{"type": "input_json_delta", "partial_json": p}})
		}
		x.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx})
		idx++
	}
	stop := "end_turn"
	if len(t.Calls) > 0 {
		stop = "tool_use"
	}
	x.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": t.Out}})
	x.event("message_stop", map[string]any{"type": "message_stop"})
}

func (s *Server) openai(w http.ResponseWriter, r *http.Request) {
	t, ok := s.next(w, r)
	if !ok {
		return
	}
	x := sender{w, r}
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "scripted",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	x.event("", chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	for i, p := range pieces(t.Text, 4) {
		x.event("", chunk(map[string]any{"content": p}, nil))
		if !x.hold(t, i == 0) {
			return
		}
	}
	if t.StreamError != "" {
		x.event("", map[string]any{"error": map[string]any{"type": "server_error", "message": t.StreamError}})
		return
	}
	if t.Garbage != "" {
		x.garbage("", t.Garbage)
		return
	}
	for i, c := range t.Calls {
		x.event("", chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": ""}}}}, nil))
		for _, p := range pieces(c.Input, 7) {
			x.event("", chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": p}}}}, nil))
		}
	}
	stop := "stop"
	if len(t.Calls) > 0 {
		stop = "tool_calls"
	}
	x.event("", chunk(map[string]any{}, stop))
	x.event("", map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []any{},
		"usage": map[string]any{"prompt_tokens": t.In, "completion_tokens": t.Out, "total_tokens": t.In + t.Out}})
	fmt.Fprint(w, "data: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

// Joined returns the text of every string in v, for loose assertions on
// a recorded request.
func Joined(v any) string {
	raw, _ := json.Marshal(v)
	return strings.ToLower(string(raw))
}
