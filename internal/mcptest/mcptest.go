// Package mcptest drives cellbox's MCP server with the official SDK's
// client, for the tests of sandbox (the handler) and cmd/cellbox (the
// binary, a real serve).
package mcptest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Client is an SDK client session that records the progress and log
// notifications it gets.
type Client struct {
	*mcp.ClientSession

	mu       sync.Mutex
	progress []string
	logs     []string
	incoming chan string // progress messages as they come, while there is room
}

// Connect connects an SDK client over transport; Cleanup closes it.
func Connect(t *testing.T, transport mcp.Transport) (*Client, error) {
	c := &Client{incoming: make(chan string, 64)}
	opts := &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params.Message)
			c.mu.Unlock()
			select {
			case c.incoming <- req.Params.Message:
			default:
			}
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			c.mu.Lock()
			defer c.mu.Unlock()
			text, _ := req.Params.Data.(string)
			c.logs = append(c.logs, req.Params.Logger+": "+text)
		},
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "mcptest", Version: "1"}, opts).Connect(context.Background(), transport, nil)
	if err != nil {
		return nil, err
	}
	c.ClientSession = cs
	t.Cleanup(func() { cs.Close() })
	return c, nil
}

// MustConnect is Connect for a connection that must work.
func MustConnect(t *testing.T, transport mcp.Transport) *Client {
	t.Helper()
	c, err := Connect(t, transport)
	require.NoError(t, err)
	return c
}

// Bearer is a RoundTripper that sends Authorization: Bearer with its token
// (none when empty), as a client configured with a URL and one header does.
type Bearer string

func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b != "" {
		r.Header.Set("Authorization", "Bearer "+string(b))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// HTTP is the Streamable HTTP transport to url with token, without retries
// (a refused connection fails at once).
func HTTP(url, token string) mcp.Transport {
	return &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: Bearer(token)}, MaxRetries: -1}
}

// Progress returns the progress messages so far.
func (c *Client) Progress() []string { return c.recorded(&c.progress) }

// Logs returns the log messages so far, as "logger: data".
func (c *Client) Logs() []string { return c.recorded(&c.logs) }

func (c *Client) recorded(list *[]string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), *list...)
}

// Call runs a tool and returns its result object (the text content, which
// image contents may follow); a successful call's structuredContent must
// be the same object but for the images' data, which the text replaces
// with a note (the images follow as image content), and a failed one has
// none (it would not match the output schema).
func (c *Client) Call(t *testing.T, name string, args map[string]any) (res *mcp.CallToolResult, result map[string]any) {
	t.Helper()
	res, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	require.NotEmpty(t, res.Content)
	for _, extra := range res.Content[1:] { // images among run_code's outputs
		require.IsType(t, &mcp.ImageContent{}, extra)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	require.NoError(t, json.Unmarshal([]byte(text), &result), text)
	if res.IsError {
		assert.Nil(t, res.StructuredContent)
	} else {
		raw, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		var structured map[string]any
		require.NoError(t, json.Unmarshal(raw, &structured))
		if outs, ok := structured["outputs"].([]any); ok && len(res.Content) > 1 {
			for i, o := range outs {
				if o := o.(map[string]any); strings.HasPrefix(fmt.Sprint(o["mime"]), "image/") {
					o["data"] = result["outputs"].([]any)[i].(map[string]any)["data"]
				}
			}
		}
		assert.Equal(t, result, structured)
	}
	return res, result
}

// Shell runs a command that must succeed and returns the result object.
func (c *Client) Shell(t *testing.T, command string) map[string]any {
	t.Helper()
	res, out := c.Call(t, "shell", map[string]any{"command": command})
	require.False(t, res.IsError, out)
	return out
}

// CancelSleep starts a long sleep with a progress token, cancels the call
// (notifications/cancelled) once the command printed its pid as progress,
// and checks the sleep is gone from the box.
func (c *Client) CancelSleep(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	params := &mcp.CallToolParams{Name: "shell", Arguments: map[string]any{"command": "echo $$; exec sleep 30", "timeout_ms": 120000}}
	params.SetProgressToken("sleep")
	done := make(chan error, 1)
	go func() {
		_, err := c.CallTool(ctx, params)
		done <- err
	}()
	var pid string
	select {
	case pid = <-c.incoming:
	case err := <-done:
		t.Fatalf("the call ended before it printed: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no progress with the command's first line")
	}
	require.Regexp(t, `^\d+$`, pid)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Eventually(t, func() bool {
		return c.Shell(t, "kill -0 "+pid+" 2>/dev/null && echo alive || echo gone")["stdout"] == "gone\n"
	}, 10*time.Second, 50*time.Millisecond, "the cancelled sleep is killed")
}

// Sessions lists the sessions of the server at url (GET /v1/sessions,
// with the server key if any) with their box counts.
func Sessions(t *testing.T, url, key string) map[string]int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/sessions", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: Bearer(key)}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list []struct {
		ID    string `json:"id"`
		Boxes int    `json:"boxes"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	out := map[string]int{}
	for _, s := range list {
		out[s.ID] = s.Boxes
	}
	return out
}
