package sandbox

// Box networks: a box is created with none (loopback only), a full network
// (api.Network.Full, the backend's own interface), or an allow list. Every
// box without a full network has an egress proxy on the host
// (sandbox/egress), listening on a socket in its host directory that the
// agent forwards 127.0.0.1:3128 to; its policy is the box's allow list (an
// empty one refuses everything, with a message saying how to open it), kept
// in the box's record and changeable on a running box with network_set. A
// box on another machine (a remote backend's) has no host directory here:
// the server lends its agent connections (lendEgress), over which the
// agent carries the box's connections back to the same proxy.

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cellbox/cellbox/internal/netpipe"
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
	var ln net.Listener
	var delivered *netpipe.Listener
	if s.caps.Remote {
		// The box is on another machine: its agent carries its
		// connections to the proxy back over connections this server
		// lends it (lendIfAllowed).
		delivered = netpipe.NewListener()
		ln = delivered
	} else {
		var err error
		if ln, err = egress.Listen(s.egressStaging(id), s.hostDir(id)); err != nil {
			return fmt.Errorf("box %s: %w", id, err)
		}
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
	ctx, cancel := context.WithCancel(s.ctx)
	bp := &boxProxy{p: p, ln: delivered, ctx: ctx, stop: cancel}
	s.proxies[id] = bp
	go func() {
		defer safe.Recover(s.log, "egress proxy of box "+id, nil)
		if err := p.Serve(ln); err != nil {
			s.log.Warn("egress proxy stopped", "box", id, "err", err)
		}
	}()
	s.lendLocked(id, bp)
	return nil
}

// boxProxy is a box's egress proxy and, for a box on another machine, the
// listener its lent connections are delivered to and what stops them.
type boxProxy struct {
	p       *egress.Proxy
	ln      *netpipe.Listener // nil for a box of this machine
	ctx     context.Context
	stop    context.CancelFunc
	lending bool
}

// lendIfAllowed starts lending connections to box id's agent if it is on
// another machine and has an allow list now (its proxy may already run:
// a box from the warm pool handed out with a list, or one given a list by
// network_set). A box without one gets none: nothing to carry, no idle
// streams or exec sessions, and its agent refuses its connections within
// 2 s (agent.unlentWait).
func (s *Service) lendIfAllowed(id string) {
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if bp := s.proxies[id]; bp != nil {
		s.lendLocked(id, bp)
	}
}

// lendLocked is lendIfAllowed for bp, box id's proxy; the caller holds
// egressMu.
func (s *Service) lendLocked(id string, bp *boxProxy) {
	if bp.ln == nil || bp.lending {
		return
	}
	s.mu.Lock()
	b := s.boxes[id]
	allowed := b != nil && b.policy.Load() != nil
	s.mu.Unlock()
	if !allowed {
		return
	}
	bp.lending = true
	for range egressLent {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer safe.Recover(s.log, "egress lender of box "+id, nil)
			s.lendEgress(bp.ctx, id, bp.ln)
		}()
	}
}

// egressLent is how many connections the server keeps lent to a remote
// box's agent, idle, for its next connections to its proxy; each one used
// is replaced at once.
const egressLent = 2

// lendEgress keeps one connection lent to box id's agent (PullEgress) and
// delivers each the box puts to use to its proxy's listener, until ctx
// ends. While the agent does not answer (the box starting, or gone) it
// tries again, less and less often.
func (s *Service) lendEgress(ctx context.Context, id string, ln *netpipe.Listener) {
	cl := s.agentClient(id)
	defer cl.Close()
	pause := lendPause
	for ctx.Err() == nil {
		conn, err := cl.PullEgress(ctx)
		if err == nil {
			pause = lendPause
			if !ln.Deliver(conn) {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, maxLendPause)
	}
}

const (
	lendPause    = 250 * time.Millisecond
	maxLendPause = 5 * time.Second
)

// stopEgress stops the egress proxy of box id, if it has one.
func (s *Service) stopEgress(id string) {
	s.egressMu.Lock()
	p := s.proxies[id]
	delete(s.proxies, id)
	s.egressMu.Unlock()
	if p != nil {
		p.stop()
		p.p.Close()
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
	s.lendIfAllowed(rec.ID)
	s.log.Info("box network set", "box", rec.ID, "allow", rules.Allow, "inject", len(rules.Inject))
	out.Network = networkInfo(*rec)
	return out, nil
}
