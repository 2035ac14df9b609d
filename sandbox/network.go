package sandbox

// Box networks: a box is created with none (loopback only), a full network
// (api.Network.Full, the backend's own interface), or an allow list. Every
// box without a full network has an egress proxy on the host
// (sandbox/egress), listening on a socket in its host directory that the
// agent forwards 127.0.0.1:3128 to; its policy is the box's allow list (an
// empty one refuses everything, with a message saying how to open it), kept
// in the box's record and changeable on a running box with network_set.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/egress"
)

// compileNetwork checks rules as a tool gives them (also that the secrets
// they name exist) and compiles them; what they open beyond what their
// author may mean is the call's notice.
func (c *call) compileNetwork(r *api.NetworkRules) (*egress.Policy, error) {
	if r == nil {
		return nil, nil
	}
	if c.s.caps.Remote {
		return nil, api.WithCode(api.CodeInvalidInput, fmt.Errorf("network allow lists need this server's egress proxy, which boxes on another machine (the %s backend's) cannot reach: give network: true for the full network, or leave it out for none", c.s.be.Name()))
	}
	pol, err := egress.CompileRules(*r)
	if err != nil {
		return nil, api.WithCode(api.CodeInvalidInput, err)
	}
	if err := pol.MissingSecrets(); err != nil {
		return nil, api.WithCode(api.CodeInvalidInput, err)
	}
	for _, w := range pol.Warnings() {
		c.Notice(w)
	}
	return pol, nil
}

// loadPolicy compiles a stored box's rules (at reconcile). Rules that no
// longer compile leave the box closed, which the log says.
func (s *Service) loadPolicy(b *box) {
	if b.rec.Egress == nil {
		return
	}
	pol, err := egress.CompileRules(*b.rec.Egress)
	if err != nil {
		s.log.Warn("stored network rules of a box do not compile; its network is closed until network_set", "box", b.rec.ID, "err", err)
		return
	}
	b.policy.Store(pol)
}

// networkInfo is rec's network as tools show it, header values redacted.
func networkInfo(rec boxRecord) api.NetworkInfo {
	switch {
	case rec.Network:
		return api.NetworkInfo{Mode: "full"}
	case rec.Egress == nil || len(rec.Egress.Allow) == 0:
		info := api.NetworkInfo{Mode: "none"}
		if rec.Egress != nil {
			info.NetworkRules = rec.Egress.Redact()
		}
		return info
	}
	return api.NetworkInfo{Mode: "allow", NetworkRules: rec.Egress.Redact()}
}

// boxEnv is the environment box rec starts with: the proxy's variables
// unless it has a full network, then its own env (which may override them,
// except the one that tells the agent where to forward: a full-network
// box on bwrap shares the host's network, where the agent must not listen).
func boxEnv(rec boxRecord) map[string]string {
	env := map[string]string{}
	if !rec.Network {
		env = egress.ProxyEnv()
	}
	maps.Copy(env, rec.Env)
	delete(env, egress.EnvListen)
	if !rec.Network {
		env[egress.EnvListen] = egress.ProxyEnv()[egress.EnvListen]
	}
	return env
}

// startEgress starts the egress proxy of box id (no-op if it runs), whose
// policy is that of the pool's box with that id at each connection (none,
// so closed, for a warm box not handed out yet). Its socket goes in the
// box's host directory: callers go through prepareHost, which makes it.
func (s *Service) startEgress(id string) error {
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if s.proxies[id] != nil {
		return nil
	}
	ln, err := egress.Listen(s.egressStaging(id), s.hostDir(id))
	if err != nil {
		return fmt.Errorf("box %s: %w", id, err)
	}
	p := egress.New(egress.Options{
		Box:    id,
		Logger: s.log,
		Policy: func() *egress.Policy {
			s.mu.Lock()
			b := s.boxes[id]
			s.mu.Unlock()
			if b == nil {
				return nil
			}
			return b.policy.Load()
		},
		RootCAs: s.cfg.EgressRootCAs,
	})
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		ln.Close()
		return nil
	}
	s.proxies[id] = p
	go func() {
		defer safe.Recover(s.log, "egress proxy of box "+id, nil)
		if err := p.Serve(ln); err != nil {
			s.log.Warn("egress proxy stopped", "box", id, "err", err)
		}
	}()
	return nil
}

// stopEgress stops the egress proxy of box id, if it has one.
func (s *Service) stopEgress(id string) {
	s.egressMu.Lock()
	p := s.proxies[id]
	delete(s.proxies, id)
	s.egressMu.Unlock()
	if p != nil {
		p.Close()
		// The socket stays in the host dir until the box's directory goes.
	}
}

// stopAllEgress stops every proxy (Close).
func (s *Service) stopAllEgress() {
	s.egressMu.Lock()
	ids := slices.Collect(maps.Keys(s.proxies))
	s.egressMu.Unlock()
	for _, id := range ids {
		s.stopEgress(id)
	}
}

// makeEgressDir makes the directory where proxy sockets are made before
// they are moved into a box's host dir (see egress.Listen).
func makeEgressDir(dataDir string) error {
	dir := filepath.Join(dataDir, "egress")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox: create %s: %w", dir, err)
	}
	return nil
}

func networkSetTool(ctx context.Context, c *call, in api.NetworkSetInput) (api.NetworkSetOutput, error) {
	out := api.NetworkSetOutput{Sandbox: in.Sandbox}
	if out.Sandbox == "" {
		out.Sandbox = api.DefaultBox
	}
	pol, err := c.compileNetwork(&in.NetworkRules)
	if err != nil {
		return out, err
	}
	l, err := c.box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	s, b := c.s, l.b
	// rec changes only under life (see box).
	b.life.Lock()
	defer b.life.Unlock()
	s.mu.Lock()
	if b.rec.Network {
		s.mu.Unlock()
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("sandbox %q was created with a full network (network: true), which cannot be narrowed on a running box; destroy it and create it with network: {\"allow\": [...]}", out.Sandbox))
	}
	rules := in.NetworkRules
	b.rec.Egress = &rules
	b.policy.Store(pol)
	rec := b.record()
	s.mu.Unlock()
	if err := s.st.apply(change{box: rec}); err != nil {
		return out, fmt.Errorf("save the network of sandbox %q: %w", out.Sandbox, err)
	}
	s.log.Info("box network set", "box", rec.ID, "allow", rules.Allow, "inject", len(rules.Inject))
	out.Network = networkInfo(*rec)
	return out, nil
}
