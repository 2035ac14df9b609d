package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// The streaming operations behind the HTTP endpoints and the in-process
// client: exec with output callbacks, raw file download and upload, watch.

// The streaming operations, for a session sess that Authenticate returned.
// box is the box's name in the session (created on first use, woken if
// asleep); notice receives what happened to the box on the way (it was
// lost and recreated, it died and was restarted).

// Exec runs a command in box, passing its output to onOutput (if not nil)
// as it comes. allowed_commands applies. started (if not nil) is called
// once the request passed its checks and the box is up, just before the
// command starts: an error before it is about the request or the box (the
// HTTP endpoint answers it with its status), one after is the command's.
func (s *Service) Exec(ctx context.Context, sess *Session, box string, req api.ExecRequest, started func(), onOutput func(stream string, data []byte), notice func(string)) (api.ExecResult, error) {
	if req.Command == "" && len(req.Argv) == 0 {
		return api.ExecResult{}, api.WithCode(api.CodeInvalidInput, errors.New("exec: give a command or an argv"))
	}
	command := req.Command
	if command == "" {
		command = strings.Join(req.Argv, " ")
	}
	if err := sess.allowed.Check(command, req.Env); err != nil {
		return api.ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	ctx = withCall(ctx, sess, notice)
	l, err := s.acquire(ctx, sess, box, notice)
	if err != nil {
		return api.ExecResult{}, err
	}
	defer l.release()
	if started != nil {
		started()
	}
	res, err := l.client.Exec(ctx, agent.ExecRequest{
		Command:   req.Command,
		Argv:      req.Argv,
		Cwd:       req.Cwd,
		Env:       tools.MergeEnv(l.b.rec.Env, req.Env),
		Stdin:     req.Stdin,
		TimeoutMs: req.TimeoutMs,
		MaxOutput: req.MaxOutput,
		Follow:    req.Follow && onOutput != nil,
	}, onOutput)
	if err != nil {
		return api.ExecResult{}, s.explain(ctx, sess, l, err)
	}
	return api.ExecResult(res), nil
}

// DecodeExecRequest decodes the body of an exec request with the errors a
// tool's input gets (invalid_input): a wrong type names the field and the
// type it takes, an unknown field lists the valid ones.
func DecodeExecRequest(body []byte) (api.ExecRequest, error) {
	var req api.ExecRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return req, nil
	case errors.As(err, &te):
		err = fmt.Errorf("field %q of the exec request: expected %s, got %s", te.Field, tools.JSONKind(te.Type), te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "): // encoding/json has no type for it
		err = fmt.Errorf("%s in the exec request; valid fields: %s", strings.TrimPrefix(err.Error(), "json: "), strings.Join(jsonschema.PropertyNames(reflect.TypeFor[api.ExecRequest]()), ", "))
	default:
		err = fmt.Errorf("exec request: %w", err)
	}
	return api.ExecRequest{}, api.WithCode(api.CodeInvalidInput, err)
}

// Download writes the file path of box to w; start (if not nil) sees the
// file's info before the first byte, and a directory is refused before.
func (s *Service) Download(ctx context.Context, sess *Session, box, path string, w io.Writer, start func(agent.FileInfo) error, notice func(string)) (int64, error) {
	ctx = withCall(ctx, sess, notice)
	l, err := s.acquire(ctx, sess, box, notice)
	if err != nil {
		return 0, err
	}
	defer l.release()
	if start != nil {
		fi, err := l.client.Stat(ctx, path)
		if err != nil {
			return 0, err
		}
		if fi.Type != "file" {
			return 0, &agent.Error{Op: "download", Path: fi.Path, Code: agent.CodeIsDir, Message: fmt.Sprintf("download %s: %s, not a file", fi.Path, tools.KindOf(fi.Type))}
		}
		if err := start(fi); err != nil {
			return 0, err
		}
	}
	n, err := l.client.Download(ctx, path, w)
	return n, s.explain(ctx, sess, l, err)
}

// Upload writes r into the file path of box, creating its parents; mode 0
// keeps an existing file's mode (or makes it 0644).
func (s *Service) Upload(ctx context.Context, sess *Session, box, path string, r io.Reader, mode uint32, notice func(string)) (int64, error) {
	ctx = withCall(ctx, sess, notice)
	l, err := s.acquire(ctx, sess, box, notice)
	if err != nil {
		return 0, err
	}
	defer l.release()
	n, err := l.client.Upload(ctx, path, r, mode)
	return n, s.explain(ctx, sess, l, err)
}

// Watch delivers batches of file changes under path in box until ctx
// ends (debounce: how long changes are gathered into one batch; 0, the
// agent's default); the box stays awake meanwhile.
func (s *Service) Watch(ctx context.Context, sess *Session, box, path string, debounce time.Duration, notice func(string)) (<-chan []api.WatchEvent, error) {
	ctx = withCall(ctx, sess, notice)
	l, err := s.acquire(ctx, sess, box, notice)
	if err != nil {
		return nil, err
	}
	in, err := l.client.Watch(ctx, path, debounce)
	if err != nil {
		l.release()
		return nil, err
	}
	out := make(chan []api.WatchEvent)
	go func() {
		defer close(out)
		defer l.release()
		defer safe.Recover(s.log, "watch "+path, nil)
		for evs := range in {
			batch := make([]api.WatchEvent, len(evs))
			for i, e := range evs {
				batch[i] = api.WatchEvent(e)
			}
			select {
			case out <- batch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// agentCodes maps the agent's error codes to the API's.
var agentCodes = map[string]string{
	agent.CodeNotFound:         api.CodeNotFound,
	agent.CodeOutsideWorkspace: api.CodeOutsideWorkspace,
	agent.CodeIsDir:            api.CodeInvalidInput,
	agent.CodeNotDir:           api.CodeInvalidInput,
	agent.CodeInvalid:          api.CodeInvalidInput,
	agent.CodeTooLarge:         api.CodeTooLarge,
	agent.CodeExists:           api.CodeExists,
	agent.CodeTimeout:          api.CodeTimeout,
}

// ErrorCode is the API code (api.Code*) of an error of a tool or a box
// operation: the code it was given (api.WithCode, or a sentinel such as
// ErrNoSession), else the agent's code, else timeout for a deadline, else
// internal. Tool results carry it beside the message; the HTTP layer can
// send it in api.ErrorBody and api.ExecFrame.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var c api.Coder
	if errors.As(err, &c) && c.ErrorCode() != "" {
		return c.ErrorCode()
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		if code, ok := agentCodes[ae.Code]; ok {
			return code
		}
		return api.CodeInvalidInput // the agent refused the request
	}
	if code := api.CodeOf(err); code != "" {
		return code
	}
	if errors.Is(err, tools.ErrUnknownTool) || errors.Is(err, tools.ErrUnknownProfile) {
		return api.CodeInvalidInput
	}
	if errors.Is(err, backend.ErrNoImage) {
		return api.CodeNotFound
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return api.CodeTimeout
	}
	return api.CodeInternal
}

// coded gives err its ErrorCode, so that errors.Is(err, api.ErrX) holds
// for the in-process client as it does for the HTTP one.
func coded(err error) error {
	return api.WithCode(ErrorCode(err), err)
}

// LocalClient is the in-process client of one session: the same operations
// as sandboxclient's HTTP client, without HTTP (it satisfies
// sandboxclient.Client).
type LocalClient struct {
	s       *Service
	session string
}

// Client returns the in-process client of session id. The session is
// looked up on each call; it no longer expires (see pin).
func (s *Service) Client(sessionID string) *LocalClient {
	s.pin(sessionID)
	s.mu.Lock()
	if sess := s.sessions[sessionID]; sess != nil {
		sess.own = true
	}
	s.mu.Unlock()
	return &LocalClient{s: s, session: sessionID}
}

// Tools lists the tools of the registry (the same list as GET /v1/tools),
// so callers of either client bind model tools the same way.
func (c *LocalClient) Tools(ctx context.Context) ([]api.ToolInfo, error) {
	return ToolInfosFor("")
}

func (c *LocalClient) logNotice(n string) {
	c.s.log.Info("sandbox notice", "session", c.session, "notice", n)
}

// Tool runs a tool; an is_error result is returned as *api.ToolError.
func (c *LocalClient) Tool(ctx context.Context, name string, input any) (json.RawMessage, error) {
	return c.ToolAs(ctx, DefaultProfile, name, input)
}

// ToolAs runs the tool called name in profile (see profiles.go).
func (c *LocalClient) ToolAs(ctx context.Context, profile, name string, input any) (json.RawMessage, error) {
	raw, err := api.MarshalInput(input)
	if err != nil {
		return nil, err
	}
	res, err := c.s.CallToolAs(ctx, c.session, profile, name, raw)
	if err != nil {
		return nil, coded(err)
	}
	return res, api.ResultError(name, res)
}

// CreateBox runs sandbox_create.
func (c *LocalClient) CreateBox(ctx context.Context, in api.SandboxCreateInput) (api.SandboxCreateOutput, error) {
	var out api.SandboxCreateOutput
	res, err := c.Tool(ctx, "sandbox_create", in)
	if err != nil {
		return out, err
	}
	return out, api.DecodeResult(res, &out)
}

// DestroyBox runs sandbox_destroy, as the HTTP client does.
func (c *LocalClient) DestroyBox(ctx context.Context, box string) error {
	_, err := c.Tool(ctx, "sandbox_destroy", api.SandboxDestroyInput{Sandbox: box})
	return err
}

// Exec runs a command in box, calling onOutput (if not nil) with output
// chunks as they come.
func (c *LocalClient) Exec(ctx context.Context, box string, req api.ExecRequest, onOutput func(stream string, data []byte)) (api.ExecResult, error) {
	sess, err := c.s.session(c.session)
	if err != nil {
		return api.ExecResult{}, coded(err)
	}
	res, err := c.s.Exec(ctx, sess, box, req, nil, onOutput, c.logNotice)
	return res, coded(err)
}

// Upload writes r into the file path of box (created with its parents).
func (c *LocalClient) Upload(ctx context.Context, box, path string, r io.Reader) (int64, error) {
	sess, err := c.s.session(c.session)
	if err != nil {
		return 0, coded(err)
	}
	n, err := c.s.Upload(ctx, sess, box, path, r, 0, c.logNotice)
	return n, coded(err)
}

// Download writes the file path of box to w.
func (c *LocalClient) Download(ctx context.Context, box, path string, w io.Writer) (int64, error) {
	sess, err := c.s.session(c.session)
	if err != nil {
		return 0, coded(err)
	}
	n, err := c.s.Download(ctx, sess, box, path, w, nil, c.logNotice)
	return n, coded(err)
}

// Watch delivers batches of changes under path in box until ctx ends.
func (c *LocalClient) Watch(ctx context.Context, box, path string) (<-chan []api.WatchEvent, error) {
	sess, err := c.s.session(c.session)
	if err != nil {
		return nil, coded(err)
	}
	ch, err := c.s.Watch(ctx, sess, box, path, 0, c.logNotice)
	return ch, coded(err)
}
