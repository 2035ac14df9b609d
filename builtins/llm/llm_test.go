package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/builtins/llm"
	"github.com/cellbox/cellbox/internal/llmtest"
)

func provider(t *testing.T, name string, s *llmtest.Server) llm.Provider {
	env := s.Env()
	p, err := llm.New(name, func(k string) string { return env[k] }, s.Client())
	require.NoError(t, err)
	return p
}

var echoTool = llm.Tool{Name: "echo", Description: "echo", InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)}

func TestStreamTextAndToolCalls(t *testing.T) {
	for _, name := range llm.Providers {
		t.Run(name, func(t *testing.T) {
			s := llmtest.New(t, llmtest.Turn{
				Text:  "Let me check that for you.",
				Calls: []llmtest.Call{{ID: "c1", Name: "echo", Input: `{"text":"hello, wide world"}`}, {ID: "c2", Name: "echo", Input: `{"text":"2"}`}},
				In:    12, Out: 34,
			})
			var pieces []string
			r, err := provider(t, name, s).Stream(context.Background(), llm.Request{
				Model: "m", System: "be brief", Messages: []llm.Message{llm.Text("user", "hi")}, Tools: []llm.Tool{echoTool},
			}, func(p string) { pieces = append(pieces, p) })
			require.NoError(t, err)
			assert.Equal(t, "Let me check that for you.", r.Text)
			assert.Greater(t, len(pieces), 1, "text arrives in pieces")
			assert.Equal(t, r.Text, strings.Join(pieces, ""))
			require.Len(t, r.ToolCalls, 2)
			assert.Equal(t, "c1", r.ToolCalls[0].ID)
			assert.Equal(t, "echo", r.ToolCalls[0].Name)
			assert.JSONEq(t, `{"text":"hello, wide world"}`, string(r.ToolCalls[0].Input))
			assert.JSONEq(t, `{"text":"2"}`, string(r.ToolCalls[1].Input))
			assert.Equal(t, llm.Usage{InputTokens: 12, OutputTokens: 34}, r.Usage)
			assert.Contains(t, []string{"tool_use", "tool_calls"}, r.StopReason)

			req := s.Requests()[0]
			assert.Equal(t, true, req.Body["stream"])
			assert.Contains(t, req.Raw, "be brief")
			if name == "anthropic" {
				assert.Equal(t, "test-key", req.Header.Get("x-api-key"))
				assert.NotEmpty(t, req.Header.Get("anthropic-version"))
			} else {
				assert.Equal(t, "Bearer test-key", req.Header.Get("Authorization"))
			}
		})
	}
}

// The tool loop, on both wire formats: the second request carries the
// assistant's tool call and the tool's result in the provider's shape.
func TestLoopSendsToolResultsBack(t *testing.T) {
	for _, name := range llm.Providers {
		t.Run(name, func(t *testing.T) {
			s := llmtest.New(t,
				llmtest.Turn{Calls: []llmtest.Call{{ID: "c1", Name: "echo", Input: `{"text":"ping"}`}}},
				llmtest.Turn{Calls: []llmtest.Call{{ID: "c2", Name: "rm_rf", Input: `{}`}}},
				llmtest.Turn{Text: "done"},
			)
			var ran []string
			res, err := llm.Loop(context.Background(), provider(t, name, s), llm.Request{
				Model: "m", Messages: []llm.Message{llm.Text("user", "go")}, Tools: []llm.Tool{echoTool},
			}, func(_ context.Context, c llm.ToolCall) (string, bool) {
				ran = append(ran, c.Name)
				return "pong:" + string(c.Input), false
			}, 5, llm.LoopHooks{})
			require.NoError(t, err)
			assert.Equal(t, "done", res.Text)
			assert.Equal(t, 3, res.Turns)
			assert.Equal(t, []string{"echo"}, ran, "an invented tool never runs")
			assert.Len(t, res.ToolCalls, 2)
			assert.Len(t, res.Messages, 6)
			assert.Equal(t, llm.Usage{InputTokens: 30, OutputTokens: 15}, res.Usage)

			reqs := s.Requests()
			require.Len(t, reqs, 3)
			second, third := reqs[1].Raw, reqs[2].Raw
			assert.Contains(t, second, `pong:{\"text\":\"ping\"}`)
			assert.Contains(t, third, `unknown tool \"rm_rf\"`)
			if name == "anthropic" {
				assert.Contains(t, second, `"type":"tool_use","id":"c1","name":"echo","input":{"text":"ping"}`)
				assert.Contains(t, second, `"type":"tool_result","tool_use_id":"c1"`)
				assert.Contains(t, third, `"is_error":true`)
			} else {
				assert.Contains(t, second, `"tool_calls":[{"id":"c1","type":"function","function":{"name":"echo","arguments":"{\"text\":\"ping\"}"}}]`)
				assert.Contains(t, second, `"role":"tool","content":"pong:`)
				assert.Contains(t, second, `"tool_call_id":"c1"`)
			}
		})
	}
}

// TestLoopListsBigInputsCut: a call with a huge input (a model writing
// megabytes) runs with it whole and keeps it whole in messages, which the
// conversation needs; tool_calls, a list to read, has its long strings cut
// (a 6 MiB write_file was stored twice).
func TestLoopListsBigInputsCut(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	s := llmtest.New(t,
		llmtest.Turn{Calls: []llmtest.Call{{ID: "c1", Name: "echo", Input: `{"text":"` + big + `"}`}}},
		llmtest.Turn{Text: "done"},
	)
	var got int
	res, err := llm.Loop(context.Background(), provider(t, "openai", s), llm.Request{
		Model: "m", Messages: []llm.Message{llm.Text("user", "go")}, Tools: []llm.Tool{echoTool},
	}, func(_ context.Context, c llm.ToolCall) (string, bool) {
		got = len(c.Input)
		return "ok", false
	}, 5, llm.LoopHooks{})
	require.NoError(t, err)
	assert.Equal(t, len(`{"text":""}`)+len(big), got, "the tool gets the input whole")
	require.Len(t, res.ToolCalls, 1)
	assert.Less(t, len(res.ToolCalls[0].Input), 70<<10, "listed cut")
	var listed struct{ Text string }
	require.NoError(t, json.Unmarshal(res.ToolCalls[0].Input, &listed), "still the call's shape")
	assert.True(t, strings.HasSuffix(listed.Text, "…"))
	whole, err := json.Marshal(res.Messages)
	require.NoError(t, err)
	assert.Greater(t, len(whole), 1<<20, "messages keep it whole")
}

// TestLoopBadArguments: a tool call whose arguments are not valid JSON
// (cut off, as local models often send them) goes back to the model as a
// tool error and the loop goes on; the call is kept as a JSON string, so
// the conversation marshals, and the next request sends its input as {}
// (an object, as Anthropic requires and OpenAI-compatible servers parse).
func TestLoopBadArguments(t *testing.T) {
	for _, name := range llm.Providers {
		t.Run(name, func(t *testing.T) {
			s := llmtest.New(t,
				llmtest.Turn{Calls: []llmtest.Call{{ID: "c1", Name: "echo", Input: `{"text": `}, {ID: "c2", Name: "echo", Input: `{"text":"ok"}`}}},
				llmtest.Turn{Text: "done"},
			)
			var ran []string
			res, err := llm.Loop(context.Background(), provider(t, name, s), llm.Request{
				Model: "m", Messages: []llm.Message{llm.Text("user", "go")}, Tools: []llm.Tool{echoTool},
			}, func(_ context.Context, c llm.ToolCall) (string, bool) {
				ran = append(ran, string(c.Input))
				return "pong", false
			}, 5, llm.LoopHooks{})
			require.NoError(t, err)
			assert.Equal(t, "done", res.Text)
			assert.Equal(t, []string{`{"text":"ok"}`}, ran, "the broken call never runs, the good one does")
			require.Len(t, res.ToolCalls, 2)
			assert.JSONEq(t, `"{\"text\": "`, string(res.ToolCalls[0].Input), "the broken arguments are kept as a string")
			_, err = json.Marshal(res)
			require.NoError(t, err, "the conversation is storable")

			reqs := s.Requests()
			require.Len(t, reqs, 2)
			second := reqs[1].Raw
			assert.Contains(t, second, `the arguments of echo are not a valid JSON object (cut off or malformed?); you sent: {\"text\": `)
			assert.Contains(t, second, "call echo again with its arguments as one complete JSON object")
			if name == "anthropic" {
				assert.Contains(t, second, `"type":"tool_use","id":"c1","name":"echo","input":{}`)
				assert.Contains(t, second, `"tool_use_id":"c1","content":"the arguments of echo`)
				assert.Contains(t, second, `"is_error":true`)
			} else {
				assert.Contains(t, second, `"id":"c1","type":"function","function":{"name":"echo","arguments":"{}"}`)
				assert.Contains(t, second, `"role":"tool","content":"error: the arguments of echo`)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	llm.MaxRetryAfter = 2e9
	for _, name := range llm.Providers {
		t.Run(name+"/429 then success", func(t *testing.T) {
			s := llmtest.New(t, llmtest.Turn{Status: 429, RetryAfter: "0", ErrMessage: "slow down"}, llmtest.Turn{Text: "ok"})
			r, err := provider(t, name, s).Stream(context.Background(), llm.Request{Model: "m", Messages: []llm.Message{llm.Text("user", "hi")}}, nil)
			require.NoError(t, err)
			assert.Equal(t, "ok", r.Text)
			assert.Len(t, s.Requests(), 2)
		})
		t.Run(name+"/429 twice", func(t *testing.T) {
			s := llmtest.New(t, llmtest.Turn{Status: 429, RetryAfter: "0", ErrMessage: "slow down"}, llmtest.Turn{Status: 429, ErrMessage: "still slow"})
			_, err := provider(t, name, s).Stream(context.Background(), llm.Request{Model: "m"}, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "429")
			assert.Contains(t, err.Error(), "still slow")
			assert.Len(t, s.Requests(), 2, "one retry, not more")
		})
		t.Run(name+"/429 with a long Retry-After", func(t *testing.T) {
			s := llmtest.New(t, llmtest.Turn{Status: 429, RetryAfter: "3600", ErrMessage: "come back in an hour"})
			_, err := provider(t, name, s).Stream(context.Background(), llm.Request{Model: "m"}, nil)
			require.ErrorContains(t, err, "come back in an hour")
			assert.ErrorContains(t, err, "asked to wait 1h0m0s, more than the 2s cellbox waits: not retried", "not said to be retried")
			assert.NotContains(t, err.Error(), "retried once already")
			assert.Len(t, s.Requests(), 1)
		})
		for _, st := range []int{401, 500, 529} {
			t.Run(name+"/"+strconv.Itoa(st), func(t *testing.T) {
				s := llmtest.New(t, llmtest.Turn{Status: st, ErrMessage: "the provider says no to key test-key"})
				_, err := provider(t, name, s).Stream(context.Background(), llm.Request{Model: "m"}, nil)
				var apiErr *llm.APIError
				require.ErrorAs(t, err, &apiErr)
				assert.Equal(t, st, apiErr.Status)
				assert.Contains(t, err.Error(), "the provider says no")
				assert.NotContains(t, err.Error(), "test-key", "a key the server echoes is redacted")
				assert.Contains(t, err.Error(), "[redacted]")
				assert.NotContains(t, err.Error(), "  ", "no gap where a status has no text (529)")
			})
		}
		// A key the server echoes inside a 200 stream (an error event, a
		// chunk that does not parse) is redacted as in an error status.
		for what, turn := range map[string]llmtest.Turn{
			"an error event": {Text: "partial", StreamError: "failed for key Bearer test-key"},
			"a broken chunk": {Text: "partial", Garbage: "{not json test-key"},
		} {
			t.Run(name+"/key echoed in "+what, func(t *testing.T) {
				s := llmtest.New(t, turn)
				_, err := provider(t, name, s).Stream(context.Background(), llm.Request{Model: "m"}, nil)
				require.Error(t, err)
				assert.NotContains(t, err.Error(), "test-key")
				assert.Contains(t, err.Error(), "[redacted]")
				var apiErr *llm.APIError
				if errors.As(err, &apiErr) {
					assert.NotContains(t, apiErr.Message+apiErr.Type, "test-key", "the error's fields too")
				}
			})
		}
		t.Run(name+"/a base URL with a query", func(t *testing.T) {
			// An Azure-style base URL: the path goes before its query, and
			// a value of the query (a key) never shows in an error.
			s := llmtest.New(t, llmtest.Turn{Text: "ok"}, llmtest.Turn{Status: 500, ErrMessage: "bad api-key=querysecret123"})
			env := s.Env()
			for k, v := range env {
				if strings.HasSuffix(k, "_BASE_URL") {
					env[k] = v + "?api-key=querysecret123"
				}
			}
			p, err := llm.New(name, func(k string) string { return env[k] }, s.Client())
			require.NoError(t, err)
			r, err := p.Stream(context.Background(), llm.Request{Model: "m", Messages: []llm.Message{llm.Text("user", "hi")}}, nil)
			require.NoError(t, err)
			assert.Equal(t, "ok", r.Text)
			assert.Contains(t, []string{"/v1/chat/completions", "/v1/messages"}, s.Requests()[0].Path)
			assert.Equal(t, "api-key=querysecret123", s.Requests()[0].Query)
			_, err = p.Stream(context.Background(), llm.Request{Model: "m"}, nil)
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "querysecret123")
		})
		t.Run(name+"/error event mid-stream", func(t *testing.T) {
			s := llmtest.New(t, llmtest.Turn{Text: "partial", StreamError: "overloaded"})
			_, err := provider(t, name, s).Stream(context.Background(), llm.Request{Model: "m"}, nil)
			require.ErrorContains(t, err, "overloaded")
		})
		t.Run(name+"/max_turns", func(t *testing.T) {
			s := llmtest.New(t,
				llmtest.Turn{Calls: []llmtest.Call{{ID: "1", Name: "echo", Input: `{}`}}},
				llmtest.Turn{Calls: []llmtest.Call{{ID: "2", Name: "echo", Input: `{}`}}})
			_, err := llm.Loop(context.Background(), provider(t, name, s), llm.Request{Model: "m", Tools: []llm.Tool{echoTool}},
				func(context.Context, llm.ToolCall) (string, bool) { return "", false }, 2, llm.LoopHooks{})
			require.ErrorContains(t, err, "max_turns (2) reached")
		})
	}
}

func TestNewNamesWhatIsMissing(t *testing.T) {
	none := func(string) string { return "" }
	_, err := llm.New("gemini", none, nil)
	assert.ErrorContains(t, err, `unknown provider "gemini": want one of anthropic, openai`)
	_, err = llm.New("anthropic", none, nil)
	assert.ErrorContains(t, err, "ANTHROPIC_API_KEY")
	_, err = llm.New("openai", none, nil)
	assert.ErrorContains(t, err, "OPENAI_API_KEY")
	_, err = llm.New("openai", func(k string) string { return map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}[k] }, nil)
	assert.NoError(t, err, "a local server needs no key")
}

func TestAbortMidStream(t *testing.T) {
	for _, name := range llm.Providers {
		t.Run(name, func(t *testing.T) {
			started := make(chan struct{})
			s := llmtest.New(t, llmtest.Turn{Text: "a long answer", Hold: make(chan struct{}), Started: started})
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-started; cancel() }()
			_, err := provider(t, name, s).Stream(ctx, llm.Request{Model: "m"}, nil)
			require.ErrorIs(t, err, context.Canceled)
		})
	}
}

// A server that ignores "stream": true: an OpenAI-compatible one's whole
// chat.completion is read as the answer; any other kind of body is an
// error saying what came back, not "the stream ended".
func TestAnswerThatIsNotAStream(t *testing.T) {
	serve := func(contentType, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", contentType)
			io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	call := func(provider, url string) (llm.Response, error) {
		env := map[string]string{"OPENAI_BASE_URL": url, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}
		p, err := llm.New(provider, func(k string) string { return env[k] }, nil)
		require.NoError(t, err)
		return p.Stream(context.Background(), llm.Request{Model: "m", Messages: []llm.Message{llm.Text("user", "hi")}, Tools: []llm.Tool{echoTool}}, nil)
	}
	completion := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"on it",
		"tool_calls":[{"id":"c1","type":"function","function":{"name":"echo","arguments":"{\"text\":\"hi\"}"}}]},"finish_reason":"tool_calls"}],
		"usage":{"prompt_tokens":3,"completion_tokens":4}}`
	r, err := call("openai", serve("application/json; charset=utf-8", completion))
	require.NoError(t, err)
	assert.Equal(t, "on it", r.Text)
	require.Len(t, r.ToolCalls, 1)
	assert.Equal(t, "echo", r.ToolCalls[0].Name)
	assert.JSONEq(t, `{"text":"hi"}`, string(r.ToolCalls[0].Input))
	assert.Equal(t, "tool_calls", r.StopReason)
	assert.Equal(t, llm.Usage{InputTokens: 3, OutputTokens: 4}, r.Usage)

	_, err = call("openai", serve("text/plain", "garbage"))
	assert.ErrorContains(t, err, "the server answered text/plain, neither an event stream nor JSON")
	_, err = call("anthropic", serve("application/json", `{"type":"message"}`))
	assert.ErrorContains(t, err, "the server answered application/json, not an event stream")
}
