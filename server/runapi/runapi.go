// Package runapi is the HTTP face of the pattern runtime: load and stop
// pattern instances, read, write and watch cells, send events to streams and
// draw a pattern's graph. `cellbox run` serves it on a unix socket in its
// data directory (and on --addr), `cellbox serve` next to the tool API; the
// CLI (`cellbox cell`, `cellbox send`) is its Client. The runtime itself
// knows nothing of HTTP.
//
// # Endpoints
//
//	POST   /v1/patterns              load: {"path": "dir or pattern.yaml"} or {"yaml": "..."}
//	                                 (optional "name", "space" rename the instance), or the
//	                                 YAML text itself as the body → 201 Instance
//	GET    /v1/patterns              loaded instances → [Instance]
//	GET    /v1/patterns/{name}       one instance, with its cells and nodes
//	DELETE /v1/patterns/{name}       stop it (its cells stay in the store)
//	GET    /v1/cells?prefix=P        cells → {"version": N, "cells": [Cell]}
//	GET    /v1/cells/{addr}          one cell → Cell
//	PUT    /v1/cells/{addr}          body: the new JSON value → Cell
//	GET    /v1/watch?prefix=P&from=V server-sent events, one Batch each (see below)
//	POST   /v1/send/{node}.{stream}  body: the event's JSON payload → 202 Sent
//	POST   /v1/retry/{node}          run a failed exec node again → 202 Cell
//	GET    /v1/graph/{name}?format=dot|mermaid  the instance's graph, as text
//
// GET /v1/patterns, /v1/patterns/{name}, /v1/cells and /v1/watch take
// max_string=N: the values they answer have their strings longer than N
// bytes cut, and are kept under a bound as a whole (fastjson.Cut); a cell cut
// so says "cut": true and its whole "size". Without it values are whole;
// GET /v1/cells/{addr} always answers the whole value.
//
// Errors are JSON, always: {"error": "what went wrong and what to do"},
// plus "suggestion" on a 404 for an unknown cell, and "path", "reason" and
// "violations" on a 422 for a value its cell's JSON Schema refuses. A PUT to
// a node's output is a 409, and so is a retry of a node that did not fail;
// a PUT to a stream or a send to a plain cell a 400.
//
// # Cell addresses
//
// A cell's full address is "space/pattern/name" (node outputs are named
// after their node, streams "node.stream"). In URLs and on the command line
// it may be shortened:
//
//	name               a cell of the first loaded instance (with none loaded:
//	                   the one cell of that name in the store)
//	pattern/name       a cell of the loaded instance called pattern (with none
//	                   loaded: in space "default")
//	space/pattern/name the full address
//
// A watch or list prefix is matched against full addresses in whole
// segments (cells.HasPrefix: "big/s" is not "big/small"); a prefix that
// names a loaded instance ("csv-pipeline" or "default/csv-pipeline") means
// its cells, one that names a cell as above ("report", "repl/report") that
// cell and its streams.
//
// # Watching
//
// GET /v1/watch streams text/event-stream. Each event's id is the version of
// the commit it reports and its data a Batch: {"version", "snapshot",
// "changes": [{"cell": Cell, "event"?: Event, "deleted"?: true}]}. Without
// from (or a Last-Event-ID header, which an EventSource sends when it
// reconnects) the first event is a snapshot of the current state; with it,
// every commit after that version is replayed before the watch follows live,
// so a client that reconnects misses nothing. A snapshot batch replaces what
// the client knew. Comments (": ping") keep idle connections open.
package runapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cellbox/cellbox/builtins"
	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/patterns"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox/lease"
)

// DefaultSpace is the space of instances loaded without one.
const DefaultSpace = patterns.DefaultSpace

// Config configures a Server.
type Config struct {
	// Runtime runs the patterns; Store is the store it runs them over.
	Runtime *runtime.Runtime
	Store   cells.Store
	// Env is what exec and sandbox nodes of loaded patterns drive boxes
	// with.
	Env builtins.Env
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Persist records each loaded instance in the store (and forgets it
	// when stopped), so that Resume loads them again after a restart: what
	// cellbox serve does. cellbox run loads the one pattern it is given.
	Persist bool
	// Leaser grants the lease of each loaded instance ("pattern/SPACE/
	// NAME"): an instance runs on the one server that holds it, and stops
	// here when its lease is lost. Default lease.Local (one process).
	Leaser lease.Leaser
	// Holder names this server to Leaser; default lease.DefaultHolder().
	Holder string
	// Forward, for servers that share the store (docs/cluster.md), sends a
	// write (a cell set, an event, a retry) to a pattern instance that runs
	// on another server there, and reports whether it did; a bare cell
	// name then resolves against every server's instances, not only this
	// one's.
	Forward func(w http.ResponseWriter, r *http.Request, instance string) bool
}

// patternLeaseTTL is how long a pattern instance's lease outlives a server
// that stopped renewing it: another server resumes it after at most this.
const patternLeaseTTL = 5 * time.Second

// Server serves the runtime API. Create it with New; it is an
// http.Handler and safe for concurrent use.
type Server struct {
	rt      *runtime.Runtime
	store   cells.Store
	env     builtins.Env
	log     *slog.Logger
	mux     *http.ServeMux
	persist bool

	loadMu sync.Mutex // serializes Load and Stop

	leaser   lease.Leaser
	holder   string
	forward  func(w http.ResponseWriter, r *http.Request, instance string) bool
	fences   sync.Map        // instance key -> the cells.Fence of its lease (FenceContext)
	leaseCtx context.Context // the leases' renewals; ends at Shutdown
	endLease context.CancelFunc

	shutdown     chan struct{} // closed by Shutdown: watches end
	shutdownOnce sync.Once

	mu        sync.Mutex
	instances []*instance // in load order
}

// instance is a loaded pattern instance.
type instance struct {
	space, name string
	source      string
	pattern     *patterns.Pattern
	loaded      time.Time
	held        *lease.Held // this server's lease on the instance
}

func (in *instance) key() string    { return in.space + "/" + in.name }
func (in *instance) prefix() string { return in.key() + "/" }

// New returns a server over cfg's runtime and store.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{rt: cfg.Runtime, store: cfg.Store, env: cfg.Env, log: cfg.Logger, persist: cfg.Persist, shutdown: make(chan struct{}),
		leaser: cfg.Leaser, holder: cfg.Holder, forward: cfg.Forward}
	if s.leaser == nil {
		s.leaser = lease.NewLocal()
	}
	if s.holder == "" {
		s.holder = lease.DefaultHolder()
	}
	s.leaseCtx, s.endLease = context.WithCancel(context.Background())
	s.mux = s.routes()
	return s
}

// Shutdown ends the watches in flight (they would hold an http.Server's
// Shutdown until its deadline). The server keeps answering other requests.
func (s *Server) Shutdown() {
	s.shutdownOnce.Do(func() {
		close(s.shutdown)
		s.endLease() // Keep releases each lease as its context ends
	})
}

// LoadOptions name a pattern instance and say where it came from.
type LoadOptions struct {
	// Space and Name of the instance; default DefaultSpace and the
	// pattern's name.
	Space, Name string
	// Source is the file or folder the pattern was read from, for views.
	Source string
	// YAML is the pattern's text when it came in a request rather than
	// from Source (Resume parses it again).
	YAML string `json:",omitempty"`
}

// instancesBucket is the store's meta bucket of loaded instances (with
// Config.Persist): key "space/name", value an instanceRecord.
const instancesBucket = "runapi.instances"

// instanceRecord is a loaded instance as instancesBucket keeps it: its
// LoadOptions and its place in the load order. The bucket iterates in key
// order, so the order is kept in Seq: Resume loads the instances again in
// the order they were loaded, and a bare cell name still means a cell of
// the same (first loaded) instance after a restart. A record written
// before Seq existed has 0 and resumes first, in key order.
type instanceRecord struct {
	LoadOptions
	Seq uint64 `json:"seq,omitempty"`
}

// Load compiles p and loads it as an instance (resuming it if the store
// already holds it), and returns the instance as loaded.
func (s *Server) Load(ctx context.Context, p *patterns.Pattern, opts LoadOptions) (Instance, error) {
	space, name := opts.Space, opts.Name
	if space == "" {
		space = DefaultSpace
	}
	if name == "" {
		name = p.Name
	}
	rp, err := patterns.CompileInstance(p, s.env, space, name)
	if err != nil {
		return Instance{}, &Error{Status: 400, Message: err.Error()}
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	in := &instance{space: rp.Space, name: rp.Name, source: opts.Source, pattern: p, loaded: time.Now().UTC()}
	s.mu.Lock()
	if s.find(in.key()) != nil {
		s.mu.Unlock()
		return Instance{}, &Error{Status: 409, Message: fmt.Sprintf("pattern %s is already loaded: stop it first (DELETE /v1/patterns/%s) or load it under another name", in.key(), in.key())}
	}
	s.mu.Unlock()
	held, err := lease.Keep(s.leaseCtx, s.leaser, "pattern/"+in.key(), s.holder, patternLeaseTTL)
	if errors.Is(err, lease.ErrHeld) {
		return Instance{}, &Error{Status: 409, Message: fmt.Sprintf("pattern %s runs on another server: %v", in.key(), err), cause: err}
	} else if err != nil {
		return Instance{}, fmt.Errorf("take the lease of pattern %s: %w", in.key(), err)
	}
	in.held = held
	if f, ok := s.leaser.(lease.Fencer); ok {
		s.fences.Store(in.key(), cells.Fence{Key: f.FenceKey("pattern/" + in.key()), Rev: int64(held.Lease().Token)})
	}
	resets, err := s.loadRuntime(ctx, in, rp)
	if err != nil {
		held.Release(context.WithoutCancel(ctx))
		return Instance{}, &Error{Status: 400, Message: err.Error()}
	}
	go s.watchLease(in.key(), held)
	s.mu.Lock()
	s.instances = append(s.instances, in)
	s.mu.Unlock()
	if s.persist {
		opts.Space, opts.Name = in.space, in.name
		err := s.store.Update(context.WithoutCancel(ctx), func(tx cells.Tx) error {
			b := tx.Meta(instancesBucket)
			r := instanceRecord{LoadOptions: opts, Seq: 1}
			err := b.ForEach("", func(_ string, v []byte) error {
				var o instanceRecord
				if json.Unmarshal(v, &o) == nil && o.Seq >= r.Seq {
					r.Seq = o.Seq + 1
				}
				return nil
			})
			if err != nil {
				return err
			}
			rec, _ := json.Marshal(r)
			return b.Put(in.key(), rec)
		})
		if err != nil {
			s.log.Warn("record the loaded pattern; it will not be resumed after a restart", "pattern", in.key(), "err", err)
		}
	}
	s.log.Info("pattern loaded", "pattern", in.key(), "source", in.source)
	d, err := s.describe(in)
	d.Resets = resets
	return d, err
}

// loadRuntime loads rp, instance in's pattern, into the runtime and
// returns the cells the load reset (the pattern was edited since they
// were stored), to be said in the answer, not only in the server's log.
func (s *Server) loadRuntime(ctx context.Context, in *instance, rp runtime.Pattern) ([]Reset, error) {
	watch, endWatch := context.WithCancel(ctx)
	statuses := s.rt.Subscribe(watch, 256)
	err := s.rt.Load(ctx, rp)
	endWatch()
	var resets []Reset
	for st := range statuses { // emitted before Load returned; closed after endWatch
		if st.Kind == runtime.Reset && st.Node.Prefix() == in.prefix() {
			resets = append(resets, Reset{Cell: st.Node.Name, Why: st.Err})
		}
	}
	return resets, err
}

// Reload replaces the pattern of the loaded instance name by p (its file
// was edited): the instance is unloaded as a shutdown would (its boxes and
// runs kept, to resume) and loaded again in p's version, its stored cells
// reconciled as a load after a restart does; the answer says which were
// reset. A p that does not compile or load changes nothing: the instance
// runs on in the version it had.
func (s *Server) Reload(ctx context.Context, name string, p *patterns.Pattern) (Instance, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.mu.Lock()
	in := s.lookup(name)
	s.mu.Unlock()
	if in == nil {
		return Instance{}, s.notLoaded(name)
	}
	rp, err := patterns.CompileInstance(p, s.env, in.space, in.name)
	if err != nil {
		return Instance{}, &Error{Status: 400, Message: err.Error()}
	}
	if err := s.rt.Unload(ctx, in.space, in.name); err != nil {
		return Instance{}, err
	}
	resets, err := s.loadRuntime(ctx, in, rp)
	if err != nil {
		// The edit does not load here (a cycle, an input of another
		// instance that is not there): the version that ran comes back.
		old, cerr := patterns.CompileInstance(in.pattern, s.env, in.space, in.name)
		if cerr == nil {
			cerr = s.rt.Load(ctx, old)
		}
		if cerr != nil {
			s.log.Error("reload failed, and the version that ran did not load again", "pattern", in.key(), "err", err, "again", cerr)
		}
		return Instance{}, &Error{Status: 400, Message: err.Error()}
	}
	// A new instance, not an edit of in: readers may hold in.
	next := &instance{space: in.space, name: in.name, source: in.source, pattern: p, loaded: time.Now().UTC(), held: in.held}
	s.mu.Lock()
	for i, x := range s.instances {
		if x == in {
			s.instances[i] = next
		}
	}
	s.mu.Unlock()
	s.log.Info("pattern reloaded", "pattern", in.key(), "source", in.source, "resets", len(resets))
	d, err := s.describe(next)
	d.Resets = resets
	return d, err
}

// Resume loads again every instance recorded as loaded (Config.Persist),
// in the order they were loaded: after a restart, cellbox serve runs what
// it ran, where it stood, and short cell addresses mean what they meant.
// An instance that no longer loads (its folder is gone, it no longer
// compiles) is reported in the error and kept, to be tried again at the
// next start (Stop of its name forgets it).
func (s *Server) Resume(ctx context.Context) ([]Instance, error) {
	recs, err := s.records(ctx)
	if err != nil {
		return nil, err
	}
	var out []Instance
	var errs []error
	for _, r := range recs {
		o := r.LoadOptions
		key := o.Space + "/" + o.Name
		s.mu.Lock()
		loaded := s.find(key) != nil
		s.mu.Unlock()
		if loaded {
			continue
		}
		if h, err := s.leaser.Holder(ctx, "pattern/"+key); err == nil && h != "" && h != s.holder {
			continue // runs on another server (a cheap check before parsing it)
		}
		var p *patterns.Pattern
		if o.YAML != "" {
			p, err = patterns.Parse("request.yaml", []byte(o.YAML), nil)
		} else {
			p, err = patterns.Load(o.Source)
		}
		var in Instance
		if err == nil {
			in, err = s.Load(ctx, p, o)
		}
		if errors.Is(err, lease.ErrHeld) {
			s.log.Info("pattern runs on another server; not resumed here", "pattern", o.Space+"/"+o.Name, "err", err)
			continue
		}
		if err != nil {
			// Kept, to be tried again at the next start: a file saved half
			// way or a folder briefly away must not unload it for good.
			errs = append(errs, fmt.Errorf("resume pattern %s/%s from %s: %w (kept: it is tried again at the next start; load it again, or forget it with cellbox stop %s/%s)", o.Space, o.Name, o.Source, err, o.Space, o.Name))
			continue
		}
		out = append(out, in)
	}
	return out, errors.Join(errs...)
}

// Adopt resumes, every interval until ctx ends, the loaded instances no
// server runs: those of a server that died or was cut off, once their
// lease ran out (servers sharing one store, docs/cluster.md). Each is
// resumed as at a restart (Resume): from the store, where it stood.
func (s *Server) Adopt(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.leaseCtx.Done():
			return
		case <-t.C:
		}
		ins, err := s.Resume(ctx)
		for _, in := range ins {
			s.log.Info("took over a pattern no server ran", "pattern", in.Space+"/"+in.Name)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Warn("take over patterns", "err", err)
		}
	}
}

// records returns the recorded instances, in the order they were loaded.
func (s *Server) records(ctx context.Context) ([]instanceRecord, error) {
	var recs []instanceRecord
	err := s.store.View(ctx, func(tx cells.Tx) error {
		return tx.Meta(instancesBucket).ForEach("", func(_ string, v []byte) error {
			var o instanceRecord
			if json.Unmarshal(v, &o) == nil {
				recs = append(recs, o)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read the loaded patterns: %w", err)
	}
	slices.SortStableFunc(recs, func(a, b instanceRecord) int { return cmp.Compare(a.Seq, b.Seq) })
	return recs, nil
}

// FenceContext is the runtime's Options.Fence: the commits of instance
// space/pattern carry its lease (when the Leaser is a lease.Fencer), so
// that once the lease is another server's, this one writes nothing more
// of the instance, however late its writes come.
func (s *Server) FenceContext(ctx context.Context, space, pattern string) context.Context {
	if f, ok := s.fences.Load(space + "/" + pattern); ok {
		return cells.WithFence(ctx, f.(cells.Fence))
	}
	return ctx
}

// forwarded reports whether a write to cell a went to the server that runs
// its instance (Config.Forward): it is not loaded here.
func (s *Server) forwarded(w http.ResponseWriter, r *http.Request, a cells.Address) bool {
	if s.forward == nil {
		return false
	}
	key := a.Space + "/" + a.Pattern
	s.mu.Lock()
	here := s.find(key) != nil
	s.mu.Unlock()
	return !here && s.forward(w, r, key)
}

// forgetUnresumed forgets the record of an instance that is not loaded
// because it failed to resume (kept by Resume, to be tried again): Stop of
// its name is how a user lets it go. It reports whether there was one.
func (s *Server) forgetUnresumed(name string) bool {
	if !s.persist {
		return false
	}
	key := name
	if !strings.Contains(key, "/") {
		key = DefaultSpace + "/" + key
	}
	found := false
	err := s.store.Update(context.Background(), func(tx cells.Tx) error {
		if _, found = tx.Meta(instancesBucket).Get(key); !found {
			return nil
		}
		return tx.Meta(instancesBucket).Delete(key)
	})
	if err != nil {
		s.log.Warn("forget a pattern that was not resumed", "pattern", key, "err", err)
		return false
	}
	if found {
		s.log.Info("forgot a pattern that could not be resumed", "pattern", key)
	}
	return found
}

// watchLease stops the instance key here when its lease (held) is lost
// (this server was cut off and another took it): it runs on one server at
// a time, and this one stops acting for it before the lease expires.
func (s *Server) watchLease(key string, held *lease.Held) {
	select {
	case <-held.Lost():
	case <-s.leaseCtx.Done():
		return
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.mu.Lock()
	in := s.find(key)
	s.mu.Unlock()
	if in == nil || in.held != held {
		return // stopped, or loaded again under a new lease
	}
	s.log.Warn("lost the lease of a pattern: it stops here (another server runs it)", "pattern", key)
	if err := s.rt.Unload(context.Background(), in.space, in.name); err != nil {
		s.log.Warn("unload the pattern whose lease was lost", "pattern", key, "err", err)
	}
	s.mu.Lock()
	s.instances = slices.DeleteFunc(s.instances, func(x *instance) bool { return x == in })
	s.mu.Unlock()
}

// Stop stops the loaded instance called name ("name" or "space/name").
func (s *Server) Stop(ctx context.Context, name string) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.mu.Lock()
	in := s.lookup(name)
	s.mu.Unlock()
	if in == nil {
		if s.forgetUnresumed(name) {
			return nil
		}
		return s.notLoaded(name)
	}
	if err := s.rt.Stop(ctx, in.space, in.name); err != nil {
		return err
	}
	s.mu.Lock()
	s.instances = slices.DeleteFunc(s.instances, func(x *instance) bool { return x == in })
	s.mu.Unlock()
	if in.held != nil {
		in.held.Release(context.WithoutCancel(ctx))
	}
	if s.persist {
		if err := s.store.Update(context.WithoutCancel(ctx), func(tx cells.Tx) error { return tx.Meta(instancesBucket).Delete(in.key()) }); err != nil {
			s.log.Warn("forget the stopped pattern", "pattern", in.key(), "err", err)
		}
	}
	s.log.Info("pattern stopped", "pattern", in.key())
	return nil
}

// Instances returns the loaded instances with their cells and nodes, in
// load order.
func (s *Server) Instances() ([]Instance, error) {
	s.mu.Lock()
	ins := slices.Clone(s.instances)
	s.mu.Unlock()
	out := make([]Instance, 0, len(ins))
	for _, in := range ins {
		d, err := s.describe(in)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Pattern returns the description of the loaded instance called name
// ("name" or "space/name").
func (s *Server) Pattern(name string) (*patterns.Pattern, error) {
	s.mu.Lock()
	in := s.lookup(name)
	s.mu.Unlock()
	if in == nil {
		return nil, s.notLoaded(name)
	}
	return in.pattern, nil
}

// find returns the instance with key space/name. Callers hold s.mu.
func (s *Server) find(key string) *instance {
	for _, in := range s.instances {
		if in.key() == key {
			return in
		}
	}
	return nil
}

// lookup finds an instance by "space/name" or by name alone (the first
// loaded of that name). Callers hold s.mu.
func (s *Server) lookup(name string) *instance {
	if strings.Contains(name, "/") {
		return s.find(name)
	}
	for _, in := range s.instances {
		if in.name == name {
			return in
		}
	}
	return nil
}

// notLoaded is the error for an unknown instance name. Callers do not hold
// s.mu.
func (s *Server) notLoaded(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &Error{Status: 404, Message: fmt.Sprintf("pattern %q is not loaded (loaded: %s)", name, s.loadedNames())}
}

// loadedNames lists the loaded instances. Callers hold s.mu.
func (s *Server) loadedNames() string {
	if len(s.instances) == 0 {
		return "none; load one with POST /v1/patterns or `cellbox run PATTERN`"
	}
	names := make([]string, len(s.instances))
	for i, in := range s.instances {
		names[i] = in.key()
	}
	return strings.Join(names, ", ")
}

// loaded returns the instance keys in load order.
func (s *Server) loaded() []Loaded {
	if s.forward != nil {
		// Every server's instances, in the order they were loaded.
		if recs, err := s.records(context.Background()); err == nil {
			out := make([]Loaded, len(recs))
			for i, r := range recs {
				out[i] = Loaded{Space: r.Space, Name: r.Name}
			}
			return out
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Loaded, len(s.instances))
	for i, in := range s.instances {
		out[i] = Loaded{Space: in.space, Name: in.name}
	}
	return out
}

// describe renders an instance with its cells and nodes.
func (s *Server) describe(in *instance) (Instance, error) {
	d := Instance{
		Space: in.space, Name: in.name, Description: in.pattern.Description,
		Source: in.source, Loaded: in.loaded, Cells: []Cell{}, Nodes: []Node{},
	}
	err := s.store.View(context.Background(), func(tx cells.Tx) error {
		cs, err := tx.List(in.prefix())
		if err != nil {
			return err
		}
		d.Version = tx.Version()
		for _, c := range cs {
			d.Cells = append(d.Cells, CellOf(c))
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("list cells of %s: %w", in.key(), err)
	}
	for _, n := range s.rt.Nodes() {
		if n.Addr.Prefix() == in.prefix() {
			d.Nodes = append(d.Nodes, nodeJSON(n))
		}
	}
	return d, nil
}

// handleRetry (POST /v1/retry/{node}) runs a failed async node (exec)
// again on its current inputs, bypassing the memo cache: for a failure
// whose cause is fixed outside the pattern (an image built, a file put in
// place). 202 with the node's cell (pending: true); the outcome arrives as
// any run's does (watch the cell). 409 for a node that did not fail, is
// running, reruns by itself (computed) or failed because an input did.
func (s *Server) handleRetry(w http.ResponseWriter, r *http.Request) {
	c, err := Lookup(s.store, s.loaded(), r.PathValue("addr"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if s.forwarded(w, r, c.Addr) {
		return
	}
	err = s.rt.Retry(r.Context(), c.Addr)
	switch {
	case errors.Is(err, runtime.ErrNotRetryable):
		writeErr(w, &Error{Status: http.StatusConflict, Message: err.Error()})
		return
	case errors.Is(err, runtime.ErrNoNode):
		writeErr(w, errorf(http.StatusNotFound, "%v (retry takes a node: its output cell's address)", err))
		return
	case err != nil:
		writeErr(w, err)
		return
	}
	s.writeCellBack(w, http.StatusAccepted, c.Addr)
}
