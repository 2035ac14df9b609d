package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/distribution/reference"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// allTools is the registry, in the order tools are listed.
func allTools() []*tools.Tool {
	return slices.Concat(tools.BoxTools(), []*tools.Tool{
		tools.Define("browse", tools.Meta{Title: "Open a box's server in a browser"},
			"Return a URL (http://ID.localhost:PORT/, an origin of its own on this server) that proxies to a TCP port inside a sandbox (works although sandboxes have no network). Start the server first (shell with background: true).",
			browseTool),
		tools.WaitPortTool(),
	}, tools.CodeTools(), []*tools.Tool{
		tools.Define("sandbox_create", tools.Meta{Title: "Create a sandbox", Idempotent: true},
			"Create a named sandbox with an image, environment, limits and network access; a no-op if it exists. Tools create sandboxes on first use anyway; use this to choose their settings.",
			sandboxCreateTool),
		tools.Define("network_set", tools.Meta{Title: "Set a sandbox's network allow list", Destructive: true, Idempotent: true},
			"Replace the network allow list of a sandbox, also a running one (the next connection obeys it): the destinations it may reach through the host's egress proxy, and headers (API keys) the proxy adds to its http:// requests so the key never enters the box. An empty list closes the network. Not for a sandbox created with network: true (full network).",
			networkSetTool),
		tools.Define("sandbox_list", tools.Meta{Title: "List sandboxes", ReadOnly: true, Idempotent: true},
			"List the sandboxes of this session with image, status (running; sleeping; dead: died and could not be restarted, retried on next use; lost: gone from the backend, recreated empty on next use), creation and last-use times.",
			sandboxListTool),
		tools.Define("sandbox_destroy", tools.Meta{Title: "Destroy a sandbox", Destructive: true, Idempotent: true},
			"Destroy a sandbox of this session and delete its files.",
			sandboxDestroyTool),
	}, snapshotTools())
}

func sandboxCreateTool(ctx context.Context, c *call, in api.SandboxCreateInput) (api.SandboxCreateOutput, error) {
	name := in.Sandbox
	if name == "" {
		name = api.DefaultBox
	}
	out := api.SandboxCreateOutput{Sandbox: name}
	if err := CheckName(name); err != nil {
		return out, err
	}
	if len(c.sess.allowed) > 0 {
		if len(in.Env) > 0 {
			return out, c.sess.allowed.Check("", in.Env)
		}
		if in.BoxID != "" {
			return out, api.WithCode(api.CodeRefused, fmt.Errorf("box_id refused: this session runs only allowed_commands %q, and a box shared with other sessions may be set up to run other code; use a box of this session", []string(c.sess.allowed)))
		}
	}
	if err := backend.ValidWorkDir(in.WorkspaceDir); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	if err := validImage(in.Image); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	spec := boxSpec{Image: in.Image, Env: in.Env, SleepAfterMs: in.SleepAfterMs,
		WorkspaceDir: in.WorkspaceDir, DestroyOnClose: in.DestroyOnClose}
	if n := in.Network; n != nil && n.Full {
		spec.Network = true
	} else if n != nil {
		pol, err := c.compileNetwork(&n.NetworkRules)
		if err != nil {
			return out, err
		}
		rules := n.NetworkRules
		spec.Egress, spec.policy = &rules, pol
	}
	if in.Limits != nil {
		spec.Limits = *in.Limits
	}
	// Checked here, not only by the backend: a box from the warm pool gets
	// its env per command and never meets the backend's check, and an
	// existing name must not hide a bad input behind created: false.
	if err := backend.ValidEnv(spec.Env); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	if err := toBackendLimits(spec.Limits).Validate(c.s.caps.MaxCPUs); err != nil {
		return out, api.WithCode(api.CodeInvalidInput, err)
	}
	s, sess := c.s, c.sess
	switch {
	case in.BoxID != "" && !in.ShareAcrossSessions:
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("box_id %q attaches this session to a box that every session naming it shares: what one session writes, the others read. Set share_across_sessions: true if that is intended, or omit box_id for a box private to this session", in.BoxID))
	case in.BoxID == "" && in.ShareAcrossSessions:
		return out, api.WithCode(api.CodeInvalidInput, errors.New("share_across_sessions needs box_id, the id of the shared box"))
	case in.BoxID != "":
		if len(in.BoxID) > maxNameLen || !boxIDRE.MatchString(in.BoxID) || strings.HasPrefix(in.BoxID, "cb-") {
			return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("invalid box_id %q: use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit, and not with \"cb-\" (reserved for private boxes)", in.BoxID))
		}
		if n := len(socketPath(s.cfg.DataDir, in.BoxID)); n > maxSocketPath {
			return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("box_id %q is too long for this server's data dir (its agent socket path would have %d bytes, at most %d); use a shorter id", in.BoxID, n, maxSocketPath))
		}
		spec.ID, spec.Shared = in.BoxID, true
	}
	s.mu.Lock()
	if sess.deleted {
		s.mu.Unlock()
		return out, fmt.Errorf("session %s: %w", sess.ID, ErrNoSession)
	}
	b := sess.boxes[name]
	created := false
	switch {
	case b != nil && spec.Shared && b.rec.ID != spec.ID:
		s.mu.Unlock()
		return out, api.WithCode(api.CodeExists, fmt.Errorf("this session already has a sandbox named %q (%s); destroy it first or pick another name", name, b.rec.ID))
	case b != nil:
		if b.state == stateNew {
			created = true // being made by a concurrent call
		}
	case spec.Shared:
		b = s.boxes[spec.ID]
		if b != nil && !b.rec.Shared {
			s.mu.Unlock()
			return out, api.WithCode(api.CodeExists, fmt.Errorf("box_id %q is in use by a private box; pick another id", spec.ID))
		}
		if err := s.checkCapsLocked(sess, 1); err != nil {
			s.mu.Unlock()
			return out, fmt.Errorf("create sandbox %q: %w", name, err)
		}
		if b == nil {
			b = s.newBoxLocked(sess, spec)
			s.boxes[spec.ID] = b
			created = true
		}
		sess.boxes[name] = b
		s.log.Warn("session attaches a box shared across sessions", "session", sess.ID, "name", name, "box", spec.ID)
	default:
		if err := s.checkCapsLocked(sess, 1); err != nil {
			s.mu.Unlock()
			return out, fmt.Errorf("create sandbox %q: %w", name, err)
		}
		spec.OneShot = s.oneShot(sess.ID, name)
		b = s.newBoxLocked(sess, spec)
		sess.boxes[name] = b
		created = true
	}
	s.mu.Unlock()
	l, err := s.use(ctx, sess, name, b, c.Notice)
	if err != nil {
		return out, err
	}
	c.leases = append(c.leases, l)
	if spec.Shared && !created {
		// Record the new binding of an existing shared box.
		s.mu.Lock()
		srec := s.sessionRecordLocked(sess)
		s.mu.Unlock()
		if err := s.st.apply(change{session: &srec}); err != nil {
			return out, err
		}
	}
	if !created && in.Image != "" && in.Image != b.rec.Image {
		c.Notice(fmt.Sprintf("sandbox %q already exists with image %s; it was left as it is (destroy it first to change its image)", name, b.rec.Image))
	}
	if !created && in.Network != nil {
		c.Notice(fmt.Sprintf("sandbox %q already exists; its network was left as it is (change an allow list with network_set)", name))
	}
	if have := cmp.Or(b.rec.WorkspaceDir, backend.Workspace); !created && in.WorkspaceDir != "" && in.WorkspaceDir != have {
		c.Notice(fmt.Sprintf("sandbox %q already exists with workspace_dir %s; it was left as it is (destroy it first to change its workspace_dir)", name, have))
	}
	if !created && in.Limits != nil && *in.Limits != b.rec.Limits {
		c.Notice(fmt.Sprintf("sandbox %q already exists; its limits were left as they are (destroy it first to change them)", name))
	}
	if !created && len(in.Env) > 0 && !maps.Equal(in.Env, b.rec.Env) {
		c.Notice(fmt.Sprintf("sandbox %q already exists; its env was left as it is (destroy it first to change it, or pass env to each shell call)", name))
	}
	out.Created, out.ID = created, b.rec.ID
	return out, nil
}

func sandboxListTool(ctx context.Context, c *call, in api.SandboxListInput) (api.SandboxListOutput, error) {
	s, sess := c.s, c.sess
	out := api.SandboxListOutput{Sandboxes: []api.SandboxInfo{}}
	// Check the running boxes first, so that the list tells the truth
	// about boxes that died behind the server's back (they are restarted,
	// and the notice says so). Boxes busy with a transition are skipped.
	s.mu.Lock()
	boxes := maps.Clone(sess.boxes)
	s.mu.Unlock()
	for _, name := range sortedNames(boxes) {
		b := boxes[name]
		if b.life.TryLock() {
			if b.state == stateRunning {
				if err := s.check(ctx, sess, name, b, c.Notice); err != nil {
					c.Notice(err.Error())
				}
			}
			b.life.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range sortedNames(sess.boxes) {
		b := sess.boxes[name]
		if b.state == stateNew || b.state == stateRemoved {
			continue
		}
		status := b.state.String()
		out.Sandboxes = append(out.Sandboxes, api.SandboxInfo{
			Name: name, ID: b.rec.ID, Image: b.rec.Image, Status: status, Shared: b.rec.Shared, Network: networkInfo(b.rec),
			WorkspaceDir: cmp.Or(b.rec.WorkspaceDir, backend.Workspace), DestroyOnClose: b.rec.DestroyOnClose,
			Created: b.rec.Created, LastUsed: time.Unix(0, b.lastUsed.Load()).UTC(),
		})
	}
	return out, nil
}

func sandboxDestroyTool(ctx context.Context, c *call, in api.SandboxDestroyInput) (api.OKOutput, error) {
	if err := c.s.destroyBox(ctx, c.sess, in.Sandbox); err != nil {
		return api.OKOutput{}, err
	}
	return api.OKOutput{OK: true}, nil
}

// validImage checks an image name: "" or the default, or a Docker
// reference (cellbox/python, registry.example/x:tag), as both backends
// name images.
func validImage(img string) error {
	if img == "" || img == backend.DefaultImage {
		return nil
	}
	if _, err := reference.ParseNormalizedNamed(img); err != nil {
		return fmt.Errorf("image %q: %v; give an image such as cellbox/python (built with `cellbox image build python`) or %q", img, err, backend.DefaultImage)
	}
	return nil
}
