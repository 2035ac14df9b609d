// Package llm is the client side of chat models: the Anthropic Messages
// API and OpenAI-compatible Chat Completions (what OpenAI, Ollama, vLLM and
// llama.cpp's server speak), both streamed over SSE, behind one Provider
// interface with provider-neutral messages.
//
// No SDK: the two wire formats are small (one POST each, a handful of SSE
// event shapes), and writing them here keeps the dependency tree small and
// lets the tests pin the exact bytes against a scripted server
// (internal/llmtest).
//
// Keys and base URLs come from the environment only (ANTHROPIC_API_KEY,
// ANTHROPIC_BASE_URL, OPENAI_API_KEY, OPENAI_BASE_URL); they never enter a
// request's memo key, an error message or a log line.
package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Block is one piece of a message's content.
type Block struct {
	// Type is "text", "tool_use" (assistant asks for a tool) or
	// "tool_result" (the answer, in a user message).
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
	// ID and Name identify a tool_use; Input is its JSON arguments.
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// ToolUseID ties a tool_result to its tool_use; Text is its content.
	ToolUseID string `json:"tool_use_id,omitempty"`
	IsError   bool   `json:"is_error,omitempty"`
}

// Message is one turn of a conversation: role "user" or "assistant".
type Message struct {
	Role    string  `json:"role"`
	Content []Block `json:"content"`
}

// Text returns a user or assistant message of plain text.
func Text(role, text string) Message {
	return Message{Role: role, Content: []Block{{Type: "text", Text: text}}}
}

// Tool is a tool the model may call.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// Request is one model call. Its JSON (without any key or URL) is what a
// memo key hashes.
type Request struct {
	Model       string    `json:"model"`
	System      string    `json:"system,omitempty"`
	Messages    []Message `json:"messages"`
	Tools       []Tool    `json:"tools,omitempty"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	Temperature *float64  `json:"temperature,omitempty"`
}

// DefaultMaxTokens is max_tokens when a request sets none (the Anthropic
// API requires one).
const DefaultMaxTokens = 4096

// ToolCall is a tool the model asked for.
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Input is the call's arguments, always valid JSON: arguments that
	// are not (a model cut off mid-call, or a local model's broken
	// output) are kept as a JSON string of what the model sent (see
	// callInput), so the conversation stays storable.
	Input json.RawMessage `json:"input"`
}

// callInput is the Input of a call whose streamed arguments are args:
// none is {}; JSON that does not parse is kept as a JSON string of the
// text, which Loop sends back to the model as a tool error (an object is
// what every tool takes) and the providers send back as {} (wireInput).
func callInput(args string) json.RawMessage {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage("{}")
	}
	if json.Valid([]byte(args)) {
		return json.RawMessage(args)
	}
	raw, _ := json.Marshal(args) // a string always marshals
	return raw
}

// isObject says raw is a JSON object.
func isObject(raw json.RawMessage) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}

// wireInput is a tool_use's input as a request sends it back to the
// provider: an object as it is, anything else (the broken arguments
// callInput kept as a string) as {}. Anthropic requires input to be an
// object; OpenAI-compatible servers such as Ollama and vLLM parse the
// arguments of past calls as JSON and refuse the request when they do
// not parse. The tool error that answered the call quotes what the model
// sent.
func wireInput(raw json.RawMessage) json.RawMessage {
	if isObject(raw) {
		return raw
	}
	return json.RawMessage("{}")
}

// Usage counts tokens.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// Add adds u2 to u.
func (u *Usage) Add(u2 Usage) {
	u.InputTokens += u2.InputTokens
	u.OutputTokens += u2.OutputTokens
}

// Response is one model answer.
type Response struct {
	Text      string     `json:"text"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	Usage     Usage      `json:"usage"`
	// StopReason is the provider's own: end_turn, tool_use, max_tokens
	// (Anthropic); stop, tool_calls, length (OpenAI).
	StopReason string `json:"stop_reason"`
}

// Message is the response as the assistant message of the conversation.
func (r Response) Message() Message {
	m := Message{Role: "assistant"}
	if r.Text != "" {
		m.Content = append(m.Content, Block{Type: "text", Text: r.Text})
	}
	for _, c := range r.ToolCalls {
		m.Content = append(m.Content, Block{Type: "tool_use", ID: c.ID, Name: c.Name, Input: c.Input})
	}
	return m
}

// Provider streams one model call. onText, if not nil, gets each piece of
// answer text as it arrives.
type Provider interface {
	Name() string
	Stream(ctx context.Context, req Request, onText func(string)) (Response, error)
}

// Providers are the names New knows.
var Providers = []string{"anthropic", "openai"}

// Getenv reads a variable; os.Getenv in production, a map in tests.
type Getenv func(string) string

// New returns the named provider configured from the environment.
// Anthropic needs ANTHROPIC_API_KEY (ANTHROPIC_BASE_URL defaults to
// https://api.anthropic.com). OpenAI needs OPENAI_API_KEY unless
// OPENAI_BASE_URL points elsewhere than the default
// https://api.openai.com/v1 (local servers such as Ollama take no key).
func New(name string, getenv Getenv, hc *http.Client) (Provider, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	switch name {
	case "anthropic":
		base := strings.TrimRight(getenv("ANTHROPIC_BASE_URL"), "/")
		if base == "" {
			base = "https://api.anthropic.com"
		}
		key := getenv("ANTHROPIC_API_KEY")
		if key == "" {
			return nil, errors.New("provider anthropic: no API key: set ANTHROPIC_API_KEY in cellbox's environment")
		}
		return redacting{&anthropic{http: hc, base: base, key: key}, secretsOf(key, base)}, nil
	case "openai":
		base := strings.TrimRight(getenv("OPENAI_BASE_URL"), "/")
		if base == "" {
			base = "https://api.openai.com/v1"
		}
		key := getenv("OPENAI_API_KEY")
		if key == "" && base == "https://api.openai.com/v1" {
			return nil, errors.New("provider openai: no API key: set OPENAI_API_KEY in cellbox's environment (or OPENAI_BASE_URL to a local OpenAI-compatible server)")
		}
		return redacting{&openAI{http: hc, base: base, key: key}, secretsOf(key, base)}, nil
	case "":
		return nil, fmt.Errorf("no provider: set provider to one of %s", strings.Join(Providers, ", "))
	default:
		return nil, fmt.Errorf("unknown provider %q: want one of %s", name, strings.Join(Providers, ", "))
	}
}

// APIError is a provider's refusal: an HTTP status, or an error event in
// the stream (Status 0), with the provider's own message.
// redacting is a provider whose errors never carry its API key: a server
// may echo what it was sent (a proxy, a local server's debug answer) in an
// error status's body, in an error event inside a 200 stream, or in a
// chunk that does not parse, and every one of them goes to cells, logs and
// the live view. Redacting here, where every error leaves the provider,
// covers the paths a check inside each would miss (it did: only error
// statuses were redacted).
type redacting struct {
	Provider
	secrets []string
}

// secretsOf are what a provider's errors must not show: its key, and the
// values of its base URL's query (an Azure-style api-key=…), each at least
// 8 bytes (a local server's placeholder key is no secret).
func secretsOf(key, base string) []string {
	var out []string
	if len(key) >= 8 {
		out = append(out, key)
	}
	if u, err := url.Parse(base); err == nil {
		for _, vs := range u.Query() {
			for _, v := range vs {
				if len(v) >= 8 {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

func (r redacting) Stream(ctx context.Context, req Request, onText func(string)) (Response, error) {
	resp, err := r.Provider.Stream(ctx, req, onText)
	if err == nil || len(r.secrets) == 0 {
		return resp, err
	}
	var api *APIError
	if errors.As(err, &api) {
		api.Type, api.Message = redact(api.Type, r.secrets), redact(api.Message, r.secrets)
	}
	if msg := err.Error(); redact(msg, r.secrets) != msg { // in another error's text
		err = &redactedError{err: err, secrets: r.secrets}
	}
	return resp, err
}

func redact(s string, secrets []string) string {
	for _, v := range secrets {
		s = strings.ReplaceAll(s, v, "[redacted]")
	}
	return s
}

// redactedError is err with its message's secrets replaced by [redacted];
// it unwraps to err, so that callers still tell a cancellation or an
// *APIError by type.
type redactedError struct {
	err     error
	secrets []string
}

func (e *redactedError) Error() string { return redact(e.err.Error(), e.secrets) }
func (e *redactedError) Unwrap() error { return e.err }

// endpoint is the URL of path under a provider's base URL, whose query
// (an Azure-style api-version or api-key) stays at the end: appended as
// text, the path went after the query.
func endpoint(base, path string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base + path // post reports the bad URL
	}
	return u.JoinPath(path).String()
}

type APIError struct {
	Provider string
	Status   int
	Type     string
	Message  string
	// Wait is the Retry-After of a 429 too long to wait for (0: none).
	Wait time.Duration
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", e.Provider)
	if e.Status != 0 {
		fmt.Fprintf(&b, " answered %d", e.Status)
		if text := http.StatusText(e.Status); text != "" { // none for 529, Anthropic's "overloaded"
			b.WriteString(" " + text)
		}
	} else {
		b.WriteString(" stream error")
	}
	if e.Type != "" {
		fmt.Fprintf(&b, " (%s)", e.Type)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	switch {
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		b.WriteString(" — check the API key in cellbox's environment")
	case e.Status == http.StatusTooManyRequests && e.Wait > MaxRetryAfter:
		fmt.Fprintf(&b, " — rate limited, asked to wait %s, more than the %s cellbox waits: not retried; try again later", e.Wait, MaxRetryAfter)
	case e.Status == http.StatusTooManyRequests:
		b.WriteString(" — rate limited; retried once already, try again later")
	case e.Status >= 500:
		b.WriteString(" — the provider failed; try again later")
	}
	return b.String()
}
