package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sort"
	"strings"

	"github.com/cellbox/cellbox/internal/sse"
)

// openAI speaks Chat Completions (POST {base}/chat/completions, stream:
// true, usage asked for with stream_options.include_usage).
type openAI struct {
	http *http.Client
	base string
	key  string
}

func (o *openAI) Name() string { return "openai" }

type oFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

type oToolCall struct {
	Index    *int      `json:"index,omitempty"`
	ID       string    `json:"id,omitempty"`
	Type     string    `json:"type,omitempty"`
	Function oFunction `json:"function"`
}

type oMessage struct {
	Role       string      `json:"role"`
	Content    *string     `json:"content"`
	ToolCalls  []oToolCall `json:"tool_calls,omitempty"`
	ToolCallID string      `json:"tool_call_id,omitempty"`
}

type oTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type oRequest struct {
	Model         string     `json:"model"`
	Messages      []oMessage `json:"messages"`
	Tools         []oTool    `json:"tools,omitempty"`
	MaxTokens     int        `json:"max_tokens,omitempty"`
	Temperature   *float64   `json:"temperature,omitempty"`
	Stream        bool       `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func str(s string) *string { return &s }

// openAIMessages maps neutral messages to Chat Completions ones: the
// system prompt first, each tool_result its own "tool" message.
func openAIMessages(req Request) []oMessage {
	var out []oMessage
	if req.System != "" {
		out = append(out, oMessage{Role: "system", Content: str(req.System)})
	}
	for _, m := range req.Messages {
		var text strings.Builder
		var calls []oToolCall
		for _, b := range m.Content {
			switch b.Type {
			case "text":
				text.WriteString(b.Text)
			case "tool_use":
				calls = append(calls, oToolCall{ID: b.ID, Type: "function", Function: oFunction{Name: b.Name, Arguments: string(wireInput(b.Input))}})
			case "tool_result":
				content := b.Text
				if b.IsError {
					// Chat Completions has no error flag on a tool message.
					content = "error: " + content
				}
				out = append(out, oMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: str(content)})
			}
		}
		if text.Len() == 0 && len(calls) == 0 {
			continue
		}
		om := oMessage{Role: m.Role, ToolCalls: calls}
		if text.Len() > 0 || m.Role != "assistant" {
			om.Content = str(text.String())
		}
		out = append(out, om)
	}
	return out
}

// oDelta is a streamed chunk's delta, or a whole answer's message.
type oDelta struct {
	Content   string      `json:"content"`
	ToolCalls []oToolCall `json:"tool_calls"`
}

func (o *openAI) Stream(ctx context.Context, req Request, onText func(string)) (Response, error) {
	body := oRequest{Model: req.Model, Messages: openAIMessages(req), MaxTokens: req.MaxTokens, Temperature: req.Temperature, Stream: true}
	body.StreamOptions.IncludeUsage = true
	for _, t := range req.Tools {
		var ot oTool
		ot.Type = "function"
		ot.Function.Name, ot.Function.Description, ot.Function.Parameters = t.Name, t.Description, t.InputSchema
		body.Tools = append(body.Tools, ot)
	}
	headers := map[string]string{}
	if o.key != "" {
		headers["Authorization"] = "Bearer " + o.key
	}
	resp, err := post(ctx, o.http, "openai", endpoint(o.base, "/chat/completions"), headers, body)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()

	var out Response
	calls := map[int]*ToolCall{}
	args := map[int]*strings.Builder{}
	done := false
	chunk := func(data []byte) error {
		if string(data) == "[DONE]" {
			done = true
			return nil
		}
		// A chunk's choices carry a delta; a server that ignores
		// "stream": true answers one chat.completion whose choices carry
		// the whole message: read as one chunk.
		var chunk struct {
			Choices []struct {
				Delta        oDelta  `json:"delta"`
				Message      *oDelta `json:"message"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return fmt.Errorf("openai: unreadable chunk %q: %w", data, err)
		}
		if chunk.Error != nil {
			return &APIError{Provider: "openai", Type: chunk.Error.Type, Message: chunk.Error.Message}
		}
		if chunk.Usage != nil {
			out.Usage = Usage{InputTokens: chunk.Usage.PromptTokens, OutputTokens: chunk.Usage.CompletionTokens}
		}
		for _, c := range chunk.Choices {
			if c.Message != nil {
				c.Delta = *c.Message
			}
			if c.Delta.Content != "" {
				out.Text += c.Delta.Content
				if onText != nil {
					onText(c.Delta.Content)
				}
			}
			for _, tc := range c.Delta.ToolCalls {
				i := 0
				if tc.Index != nil {
					i = *tc.Index
				}
				call := calls[i]
				if call == nil {
					call = &ToolCall{}
					calls[i], args[i] = call, &strings.Builder{}
				}
				if tc.ID != "" {
					call.ID = tc.ID
				}
				if tc.Function.Name != "" {
					call.Name += tc.Function.Name
				}
				args[i].WriteString(tc.Function.Arguments)
			}
			if c.FinishReason != nil && *c.FinishReason != "" {
				out.StopReason = *c.FinishReason
			}
		}
		return nil
	}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case "application/json":
		var body []byte
		if body, err = readAnswer(resp.Body); err == nil {
			err = chunk(body)
		}
		done = err == nil
	case "", "text/event-stream":
		err = sse.Read(resp.Body, maxEventLine, func(_ string, data []byte) error { return chunk(data) })
	default:
		return out, fmt.Errorf("openai: the server answered %s, neither an event stream nor JSON: give the base URL of a Chat Completions API", mt)
	}
	if err != nil {
		return out, streamError(ctx, err)
	}
	if !done && out.StopReason == "" {
		return out, errors.New("openai: the stream ended before a finish_reason (connection cut?)")
	}
	idx := make([]int, 0, len(calls))
	for i := range calls {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		c := calls[i]
		c.Input = callInput(args[i].String())
		out.ToolCalls = append(out.ToolCalls, *c)
	}
	return out, nil
}
