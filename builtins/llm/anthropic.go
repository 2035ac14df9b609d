package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/cellbox/cellbox/internal/sse"
)

// anthropic speaks the Messages API (POST /v1/messages, stream: true).
type anthropic struct {
	http *http.Client
	base string
	key  string
}

func (a *anthropic) Name() string { return "anthropic" }

type aBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   string          `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

type aMessage struct {
	Role    string   `json:"role"`
	Content []aBlock `json:"content"`
}

type aRequest struct {
	Model       string     `json:"model"`
	System      string     `json:"system,omitempty"`
	Messages    []aMessage `json:"messages"`
	Tools       []Tool     `json:"tools,omitempty"`
	MaxTokens   int        `json:"max_tokens"`
	Temperature *float64   `json:"temperature,omitempty"`
	Stream      bool       `json:"stream"`
}

func (a *anthropic) Stream(ctx context.Context, req Request, onText func(string)) (Response, error) {
	body := aRequest{Model: req.Model, System: req.System, Tools: req.Tools, MaxTokens: req.MaxTokens, Temperature: req.Temperature, Stream: true}
	if body.MaxTokens <= 0 {
		body.MaxTokens = DefaultMaxTokens
	}
	for _, m := range req.Messages {
		am := aMessage{Role: m.Role}
		for _, b := range m.Content {
			ab := aBlock{Type: b.Type, Text: b.Text, ID: b.ID, Name: b.Name, ToolUseID: b.ToolUseID, IsError: b.IsError}
			if b.Type == "tool_result" {
				ab.Text, ab.Content = "", b.Text
			}
			if b.Type == "tool_use" {
				ab.Input = wireInput(b.Input)
			}
			am.Content = append(am.Content, ab)
		}
		body.Messages = append(body.Messages, am)
	}
	resp, err := post(ctx, a.http, "anthropic", endpoint(a.base, "/v1/messages"), map[string]string{
		"x-api-key":         a.key,
		"anthropic-version": "2023-06-01",
	}, body)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()

	var out Response
	type open struct {
		typ   string
		call  ToolCall
		input strings.Builder
	}
	blocks := map[int]*open{}
	var order []int
	stopped := false
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "" && mt != "text/event-stream" {
		return out, fmt.Errorf("anthropic: the server answered %s, not an event stream (text/event-stream): it ignored \"stream\": true; give the base URL of a Messages API that streams", mt)
	}
	err = sse.Read(resp.Body, maxEventLine, func(event string, data []byte) error {
		var ev struct {
			Type    string `json:"type"`
			Index   int    `json:"index"`
			Message struct {
				Usage Usage `json:"usage"`
			} `json:"message"`
			ContentBlock aBlock `json:"content_block"`
			Delta        struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			Usage *Usage `json:"usage"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("anthropic: unreadable %s event %q: %w", event, data, err)
		}
		switch ev.Type {
		case "message_start":
			out.Usage.Add(ev.Message.Usage)
		case "content_block_start":
			o := &open{typ: ev.ContentBlock.Type}
			if o.typ == "tool_use" {
				o.call = ToolCall{ID: ev.ContentBlock.ID, Name: ev.ContentBlock.Name}
			}
			blocks[ev.Index] = o
			order = append(order, ev.Index)
		case "content_block_delta":
			o := blocks[ev.Index]
			if o == nil {
				return fmt.Errorf("anthropic: delta for block %d that never started", ev.Index)
			}
			switch ev.Delta.Type {
			case "text_delta":
				out.Text += ev.Delta.Text
				if onText != nil && ev.Delta.Text != "" {
					onText(ev.Delta.Text)
				}
			case "input_json_delta":
				o.input.WriteString(ev.Delta.PartialJSON)
			}
		case "message_delta":
			if ev.Delta.StopReason != "" {
				out.StopReason = ev.Delta.StopReason
			}
			if ev.Usage != nil {
				// message_delta's usage is cumulative for output tokens.
				out.Usage.OutputTokens = ev.Usage.OutputTokens
				if ev.Usage.InputTokens > out.Usage.InputTokens {
					out.Usage.InputTokens = ev.Usage.InputTokens
				}
			}
		case "message_stop":
			stopped = true
		case "error":
			return &APIError{Provider: "anthropic", Type: ev.Error.Type, Message: ev.Error.Message}
		}
		return nil
	})
	if err != nil {
		return out, streamError(ctx, err)
	}
	if !stopped {
		return out, errors.New("anthropic: the stream ended before message_stop (connection cut?)")
	}
	for _, i := range order {
		o := blocks[i]
		if o.typ != "tool_use" {
			continue
		}
		o.call.Input = callInput(o.input.String())
		out.ToolCalls = append(out.ToolCalls, o.call)
	}
	return out, nil
}
