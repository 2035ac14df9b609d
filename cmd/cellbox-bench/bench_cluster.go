package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/etcdkv"
	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/internal/etcdproc"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/server"
	_ "github.com/cellbox/cellbox/server/cluster" // --etcd servers in this process: it registers itself with server
)

// The target of issue 22: every figure over etcd within clusterFactor of
// its bbolt (one-machine) figure plus one etcd round trip.
const (
	clusterFactor = 1.5
	clusterChain  = 50 // levels of the propagation chain
)

// clusterOptions are the flags of `cellbox-bench cluster`.
type clusterOptions struct {
	benchCommon     // n: samples of each figure; backends: local (sessions and tool calls) or none
	members     int // etcd members
}

func benchClusterCmd(ctx context.Context, args []string) (*benchReport, bool, error) {
	fs := flag.NewFlagSet("bench cluster", flag.ContinueOnError)
	var o clusterOptions
	o.flags(fs, 100, "samples of each figure", 10*time.Second,
		"box backend of the session and tool call figures: local, or none to measure the stores only",
		"static cellbox binary run as the agent in every box (default: cellbox beside this executable)", true)
	o.backend = "local"
	fs.Lookup("backend").DefValue = "local"
	fs.IntVar(&o.members, "members", 3, "etcd members, on loopback")
	err := o.parse(fs, args, func() error { return positive("members", o.members) }, func() error {
		if len(o.backends) > 1 || (len(o.backends) == 1 && o.backends[0] != "local") {
			return fmt.Errorf("--backend %s: the cluster bench runs boxes on the local backend only: want local or none", o.backend)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	rep, err := benchCluster(ctx, o)
	return rep, o.asJSON, err
}

// clusterBench is one run of the cluster bench: an etcd cluster of its
// own, two clients of it, and the round trips the targets add.
type clusterBench struct {
	o       clusterOptions
	rep     *benchReport
	dir     string
	etcd    *etcdproc.Cluster
	c1, c2  *clientv3.Client
	label   string        // the backend column of etcd: "etcd ×3"
	putRTT  time.Duration // p50 of a clientv3 Put
	getRTT  time.Duration // p50 of a clientv3 Get
	boltP50 time.Duration // p50 of a bbolt commit of one key
	targets []string      // each etcd figure and whether its target held
	calls   []string      // the etcd requests of each etcd figure's operation
}

func benchCluster(ctx context.Context, o clusterOptions) (_ *benchReport, err error) {
	if len(o.backends) > 0 {
		if o.agentBinary, err = cellboxBinary(o.agentBinary); err != nil {
			return nil, err
		}
		// The local backend mounts it into the boxes: an absolute path.
		if o.agentBinary, err = filepath.Abs(o.agentBinary); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "cellbox-bench-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	b := &clusterBench{o: o, rep: newBenchReport("cluster"), dir: dir, label: fmt.Sprintf("etcd ×%d", o.members)}
	start := time.Now()
	var stopEtcd func()
	b.etcd, stopEtcd, err = startEtcd(filepath.Join(dir, "etcd"), o.members, etcdproc.WithMaxRequestBytes(etcdconn.MaxRequestBytes), etcdproc.WithMaxTxnOps(4096))
	if err != nil {
		return nil, err
	}
	defer stopEtcd()
	started := time.Since(start)
	eps := b.etcd.Endpoints()
	if b.c1, err = etcdconn.Dial(ctx, eps); err != nil {
		return nil, err
	}
	defer b.c1.Close()
	if b.c2, err = etcdconn.Dial(ctx, eps); err != nil {
		return nil, err
	}
	defer b.c2.Close()
	version := "?"
	if st, err := b.c1.Status(ctx, eps[0]); err == nil {
		version = st.Version
	}
	rep := b.rep
	rep.note("%s: %d etcd %s members (/usr/bin/etcd) on 127.0.0.1, started by the bench in %s, their data dirs in %s beside the bbolt files (one file system; both fsync every commit): --heartbeat-interval 50 --election-timeout 500 --max-txn-ops 4096 --max-request-bytes %d. Clients: internal/etcdconn.Dial, as a server makes them.",
		b.label, o.members, version, started.Round(time.Millisecond), os.TempDir(), etcdconn.MaxRequestBytes)
	rep.note("Each etcd figure is measured in the same loop as its bbolt (one-machine) figure, one after the other in every round, so that both see the same load.")
	rep.note("target (issue 22): each figure over etcd within %g× its bbolt figure plus one etcd round trip (the p50 of a clientv3 Put for what writes, of a Get for a call that only reads etcd); the target column holds that sum, ✘ where the p50 is past it. The bench does not fail on it.", clusterFactor)

	if err := b.roundTrips(ctx); err != nil {
		return rep, fmt.Errorf("etcd round trips: %w", err)
	}
	if err := b.watchers(ctx); err != nil {
		return rep, fmt.Errorf("watchers: %w", err)
	}
	if err := b.chains(ctx); err != nil {
		return rep, fmt.Errorf("propagation: %w", err)
	}
	if len(o.backends) > 0 {
		if err := b.servers(ctx); err != nil {
			return rep, fmt.Errorf("servers: %w", err)
		}
	}
	b.summary()
	return rep, nil
}

// startEtcd starts the members (etcdproc.Start); stop kills them. A
// failed start tells what the members' logs said (they go with dir).
func startEtcd(dir string, members int, opts ...etcdproc.Option) (cl *etcdproc.Cluster, stop func(), err error) {
	cl, err = etcdproc.Start(dir, members, opts...)
	if err != nil {
		if cl != nil {
			for i := range cl.Len() {
				if tail, terr := cl.Member(i).LogTail(10); terr == nil {
					err = fmt.Errorf("%w\nmember %d's log ends:\n%s", err, i, tail)
				}
			}
		}
		return nil, nil, err
	}
	return cl, cl.Close, nil
}

// addTarget adds a row of an etcd figure against its bbolt figure's p50,
// with the target base × clusterFactor + rtt, and notes whether it held.
func (b *clusterBench) addTarget(backendCol, what string, samples []time.Duration, baseline string, baseP50, rtt time.Duration) {
	target := time.Duration(float64(baseP50)*clusterFactor) + rtt
	b.rep.add(backendCol, what, samples, baseline, baseP50, target)
	row := b.rep.Rows[len(b.rep.Rows)-1]
	mark := "holds"
	if !*row.Met {
		mark = "does not hold"
	}
	b.targets = append(b.targets, fmt.Sprintf("%s: %s (p50 %s, target %s)", what, mark, fmtDur(row.P50), fmtDur(target)))
}

func (b *clusterBench) summary() {
	held := 0
	for _, t := range b.targets {
		if strings.Contains(t, ": holds (") {
			held++
		}
	}
	b.rep.note("target: holds for %d of %d figures. %s.", held, len(b.targets), strings.Join(b.targets, "; "))
	if len(b.calls) > 0 {
		b.rep.note("etcd requests per operation (unary gRPC requests the members handled, by method, over %d runs of the operation alone after its measurement; leases renewed meanwhile may add a fraction): %s.", clusterCountRuns, strings.Join(b.calls, "; "))
	}
}

// clusterCountRuns is how many times an operation runs alone to count
// its etcd requests.
const clusterCountRuns = 10

// etcdRequests returns the unary requests the members have handled so
// far, by gRPC method (Range, Txn, Put, LeaseGrant...), read from their
// /metrics (grpc_server_handled_total).
func (b *clusterBench) etcdRequests(ctx context.Context) (map[string]float64, error) {
	counts := map[string]float64{}
	for _, ep := range b.etcd.Endpoints() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/metrics", nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(body), "\n") {
			if !strings.HasPrefix(line, "grpc_server_handled_total{") || !strings.Contains(line, `grpc_type="unary"`) {
				continue
			}
			_, rest, _ := strings.Cut(line, `grpc_method="`)
			method, _, _ := strings.Cut(rest, `"`)
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil && method != "" {
				counts[method] += v
			}
		}
	}
	return counts, nil
}

// countCalls runs fn clusterCountRuns times (with i from first on) and
// notes the etcd requests per run of what.
func (b *clusterBench) countCalls(ctx context.Context, what string, first int, fn func(i int) (time.Duration, error)) error {
	before, err := b.etcdRequests(ctx)
	if err != nil {
		return fmt.Errorf("count etcd requests: %w", err)
	}
	for i := range clusterCountRuns {
		if _, err := fn(first + i); err != nil {
			return err
		}
	}
	after, err := b.etcdRequests(ctx)
	if err != nil {
		return fmt.Errorf("count etcd requests: %w", err)
	}
	var methods []string
	for m, v := range after {
		if v > before[m] {
			methods = append(methods, m)
		}
	}
	slices.Sort(methods)
	var parts []string
	for _, m := range methods {
		parts = append(parts, fmt.Sprintf("%s %.3g", m, (after[m]-before[m])/clusterCountRuns))
	}
	if len(parts) == 0 {
		parts = []string{"none"}
	}
	b.calls = append(b.calls, what+": "+strings.Join(parts, ", "))
	return nil
}

// interleaved runs fns one after the other in every round, up to n
// rounds or until budget has passed (after the first), and returns each
// fn's samples.
func interleaved(ctx context.Context, n int, budget time.Duration, fns ...func(i int) (time.Duration, error)) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(fns))
	_, err := benchLoop(ctx, n, budget, func(i int) (time.Duration, error) {
		for k, fn := range fns {
			d, err := fn(i)
			if err != nil {
				return 0, err
			}
			out[k] = append(out[k], d)
		}
		return 0, nil
	})
	return out, err
}

// warmUp runs each fn a few times, unmeasured.
func warmUp(fns ...func(i int) (time.Duration, error)) error {
	for i := -3; i < 0; i++ {
		for _, fn := range fns {
			if _, err := fn(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// roundTrips measures a clientv3 Put and Get of one key beside a bbolt
// commit and read of one key in a file in b.dir.
func (b *clusterBench) roundTrips(ctx context.Context) error {
	db, err := bolt.Open(filepath.Join(b.dir, "floor.db"), 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	bucket := []byte("floor")
	boltPut := func(i int) (time.Duration, error) {
		return timed(func() error {
			return db.Update(func(tx *bolt.Tx) error {
				bk, err := tx.CreateBucketIfNotExists(bucket)
				if err != nil {
					return err
				}
				return bk.Put([]byte("k"), []byte(strconv.Itoa(i)))
			})
		})
	}
	boltGet := func(int) (time.Duration, error) {
		return timed(func() error {
			return db.View(func(tx *bolt.Tx) error {
				if tx.Bucket(bucket).Get([]byte("k")) == nil {
					return errors.New("bbolt: the key is missing")
				}
				return nil
			})
		})
	}
	const key = "/cellbox-bench/rtt"
	etcdPut := func(i int) (time.Duration, error) {
		return timed(func() error {
			_, err := b.c1.Put(ctx, key, strconv.Itoa(i))
			return err
		})
	}
	etcdGet := func(int) (time.Duration, error) {
		return timed(func() error {
			r, err := b.c1.Get(ctx, key)
			if err == nil && len(r.Kvs) != 1 {
				err = errors.New("etcd: the key is missing")
			}
			return err
		})
	}
	if err := warmUp(boltPut, etcdPut, boltGet, etcdGet); err != nil {
		return err
	}
	s, err := interleaved(ctx, b.o.n, b.o.budget, boltPut, etcdPut, boltGet, etcdGet)
	if err != nil {
		return err
	}
	b.boltP50, _, _ = percentiles(s[0])
	b.putRTT, _, _ = percentiles(s[1])
	boltGetP50, _, _ := percentiles(s[2])
	b.getRTT, _, _ = percentiles(s[3])
	b.rep.add(b.label, "clientv3 Put of one key (a write's round trip)", s[1], "bbolt commit of one key (2 fdatasyncs)", b.boltP50, 0)
	b.rep.add(b.label, "clientv3 Get of one key (linearizable: a read's round trip)", s[3], "bbolt read of one key", boltGetP50, 0)
	return nil
}

// clusterStores opens a bbolt store in b.dir and two stores over etcd
// (the same prefix, each on its own client). closeAll closes them.
func (b *clusterBench) clusterStores(ctx context.Context, prefix string) (bb, e1, e2 cells.Store, closeAll func(), err error) {
	var closers []func() error
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	path := filepath.Join(b.dir, fmt.Sprintf("cells-%d.db", time.Now().UnixNano()))
	if bb, err = cells.OpenBolt(path, cells.Options{}); err != nil {
		return
	}
	closers = append(closers, bb.Close, func() error { return os.Remove(path) })
	open := func(c *clientv3.Client) (cells.Store, error) {
		kv, err := etcdkv.Open(ctx, c, prefix)
		if err != nil {
			return nil, err
		}
		s, err := cells.Open(ctx, kv, cells.Options{})
		if err != nil {
			kv.Close()
			return nil, err
		}
		closers = append(closers, s.Close)
		return s, nil
	}
	if e1, err = open(b.c1); err != nil {
		return
	}
	e2, err = open(b.c2)
	return
}

// watchProbe times a cell write through one store until a watcher of
// another (or the same) store receives it.
type watchProbe struct {
	w    cells.Store
	seen chan watchSeen
	addr cells.Address
	sets []time.Duration // Update returning
}

type watchSeen struct {
	value string
	at    time.Time
}

// newWatchProbe watches the cell x of bench/watch on r (until ctx ends)
// for writes made through w.
func newWatchProbe(ctx context.Context, w, r cells.Store) (*watchProbe, error) {
	p := &watchProbe{w: w, seen: make(chan watchSeen, 16), addr: cells.Address{Space: "bench", Pattern: "watch", Name: "x"}}
	batches, err := r.Watch(ctx, "bench/watch/", r.Version())
	if err != nil {
		return nil, err
	}
	go func() {
		for bt := range batches {
			for _, ch := range bt.Changes {
				if ch.Cell.Addr != p.addr {
					continue
				}
				select {
				case p.seen <- watchSeen{string(ch.Cell.Value), time.Now()}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return p, nil
}

// write writes x = i and returns the time until the watcher saw it.
func (p *watchProbe) write(ctx context.Context, i int) (time.Duration, error) {
	want := strconv.Itoa(i)
	start := time.Now()
	err := p.w.Update(ctx, func(tx cells.Tx) error {
		_, err := tx.Set(p.addr, json.RawMessage(want))
		return err
	})
	if err != nil {
		return 0, err
	}
	p.sets = append(p.sets, time.Since(start))
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-p.seen:
			if s.value == want {
				return s.at.Sub(start), nil
			}
		case <-timeout:
			return 0, fmt.Errorf("the watcher did not see x = %s within 10s", want)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// watchers measures a cell write until a watcher is notified: on bbolt
// the watcher is of the same store, on etcd of a second store over
// another client (as another server's).
func (b *clusterBench) watchers(ctx context.Context) error {
	bb, e1, e2, closeAll, err := b.clusterStores(ctx, "/cellbox-bench/watch/")
	if err != nil {
		return err
	}
	defer closeAll()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pb, err := newWatchProbe(wctx, bb, bb)
	if err != nil {
		return err
	}
	pe, err := newWatchProbe(wctx, e1, e2)
	if err != nil {
		return err
	}
	fb := func(i int) (time.Duration, error) { return pb.write(ctx, i) }
	fe := func(i int) (time.Duration, error) { return pe.write(ctx, i) }
	if err := warmUp(fb, fe); err != nil {
		return err
	}
	pb.sets = nil
	s, err := interleaved(ctx, b.o.n, b.o.budget, fb, fe)
	if err != nil {
		return err
	}
	setP50, _, _ := percentiles(pb.sets)
	bP50, _, _ := percentiles(s[0])
	eSetP50, _, _ := percentiles(pe.sets)
	if err := b.countCalls(ctx, "cell write → watcher notified", 1<<20, fe); err != nil {
		return err
	}
	b.rep.add("bbolt", "cell write → watcher notified (the same store)", s[0], "Store.Update returns", setP50, 0)
	b.addTarget(b.label, "cell write → watcher notified (a second store, on another client)", s[1], "bbolt: cell write → watcher notified", bP50, b.putRTT)
	b.rep.note("watcher: from the start of a Store.Update setting one cell until a goroutine reading Store.Watch receives that value; on bbolt one store writes and watches, on etcd the watcher is a second cells.Open(etcdkv.Open(…)) on another client, as another server's store is. The etcd Store.Update alone took %s (p50).", fmtDur(eSetP50))
	return nil
}

// chains measures the propagation of a 50-level chain of computed nodes
// (benchShapes') through runtime.New over bbolt and over etcd.
func (b *clusterBench) chains(ctx context.Context) error {
	shapes, err := benchShapes(clusterChain)
	if err != nil {
		return err
	}
	chain := shapes[0]
	base, err := directEval(ctx, chain.nodes, b.o.budget)
	if err != nil {
		return err
	}
	bb, e1, _, closeAll, err := b.clusterStores(ctx, "/cellbox-bench/chain/")
	if err != nil {
		return err
	}
	defer closeAll()
	var fns []func(int) (time.Duration, error)
	for _, s := range []cells.Store{bb, e1} {
		p := runtime.Pattern{Space: "bench", Name: "chain", Cells: []runtime.Cell{{Name: "root", Initial: json.RawMessage(`0`)}}, Nodes: chain.nodes}
		rt := runtime.New(s, runtime.Options{Logger: benchLogger()})
		defer rt.Close(context.Background())
		if err := rt.Load(ctx, p); err != nil {
			return err
		}
		root := cells.Address{Space: "bench", Pattern: "chain", Name: "root"}
		tail := cells.Address{Space: "bench", Pattern: "chain", Name: "n" + strconv.Itoa(clusterChain-1)}
		set := func(i int) (time.Duration, error) {
			d, err := timed(func() error { return rt.Set(ctx, root, json.RawMessage(strconv.Itoa(i))) })
			if err != nil {
				return 0, err
			}
			// Set returns once the whole chain is committed: the tail
			// holds root + 50 (checked, not timed).
			c, err := s.Get(ctx, tail)
			if err != nil {
				return 0, err
			}
			if want := strconv.Itoa(i + clusterChain); string(c.Value) != want {
				return 0, fmt.Errorf("after Set of root = %d the tail is %s, want %s", i, c.Value, want)
			}
			return d / clusterChain, nil
		}
		fns = append(fns, set)
	}
	if err := warmUp(fns...); err != nil {
		return err
	}
	s, err := interleaved(ctx, b.o.n, b.o.budget, fns...)
	if err != nil {
		return err
	}
	bP50, _, _ := percentiles(s[0])
	if err := b.countCalls(ctx, fmt.Sprintf("Set of the head of the %d-level chain", clusterChain), 1<<20, fns[1]); err != nil {
		return err
	}
	what := fmt.Sprintf("propagate a %d-level chain of computed nodes, per node", clusterChain)
	b.rep.add("bbolt", what, s[0], "expressions evaluated directly, per node", base, 0)
	b.addTarget(b.label, what, s[1], "bbolt: the same", bP50, b.putRTT/clusterChain)
	b.rep.note("propagation: Runtime.Set of the chain's head (runtime.New over the store), which returns once every level is recomputed and committed (one commit; the tail's value is checked after each); per node = that time / %d, so the whole write is %d× the figure, and the target adds 1/%d of a Put's round trip per node.", clusterChain, clusterChain, clusterChain)
	return nil
}

// benchServerOf is a server of the bench, opened by server.Open and
// serving TCP on a loopback port.
type benchServerOf struct {
	srv *server.Server
	svc *sandbox.Service
	ep  *server.Endpoint
}

// openServer opens a server over dataDir on the local backend with no
// warm pool, over etcd when cluster is on.
func (b *clusterBench) openServer(ctx context.Context, dataDir string, cluster server.ClusterConfig) (*benchServerOf, error) {
	log := benchLogger()
	srv, err := server.Open(ctx, server.Config{
		DataDir: dataDir,
		Backend: "local",
		Sandbox: sandbox.Config{AgentBinary: b.o.agentBinary, Pool: map[string]int{backend.DefaultImage: 0}, Logger: log},
		HTTP:    server.DefaultHTTPOptions(),
		Logger:  log,
		Cluster: cluster,
	})
	if err != nil {
		return nil, err
	}
	s := &benchServerOf{srv: srv}
	if s.svc, _, err = srv.Sandboxes.Get(ctx); err != nil {
		srv.Close()
		return nil, err
	}
	if s.ep, err = srv.Host.ServeTCP("127.0.0.1:0"); err != nil {
		srv.Close()
		return nil, err
	}
	return s, nil
}

// servers measures session creates and warm tool calls on a one-machine
// server and on two servers over etcd.
func (b *clusterBench) servers(ctx context.Context) error {
	one, err := b.openServer(ctx, filepath.Join(b.dir, "one"), server.ClusterConfig{})
	if err != nil {
		return fmt.Errorf("the one-machine server: %w", err)
	}
	defer one.srv.Close()
	cluster := server.ClusterConfig{Etcd: b.etcd.Endpoints(), Prefix: "/cellbox-bench/servers/"}
	a, err := b.openServer(ctx, filepath.Join(b.dir, "a"), cluster)
	if err != nil {
		return fmt.Errorf("server a over etcd: %w", err)
	}
	defer a.srv.Close()
	c, err := b.openServer(ctx, filepath.Join(b.dir, "b"), cluster)
	if err != nil {
		return fmt.Errorf("server b over etcd: %w", err)
	}
	defer c.srv.Close()

	// Session creates, each session deleted again (not timed).
	create := func(s *benchServerOf) func(int) (time.Duration, error) {
		return func(int) (time.Duration, error) {
			var id string
			d, err := timed(func() error {
				var err error
				id, _, err = s.svc.NewSession(ctx)
				return err
			})
			if err != nil {
				return 0, err
			}
			return d, s.svc.DeleteSession(ctx, id)
		}
	}
	if err := warmUp(create(one), create(a)); err != nil {
		return err
	}
	s, err := interleaved(ctx, b.o.n, b.o.budget, create(one), create(a))
	if err != nil {
		return fmt.Errorf("session create: %w", err)
	}
	oneP50, _, _ := percentiles(s[0])
	if err := b.countCalls(ctx, "session create (with its delete, not timed)", 0, create(a)); err != nil {
		return err
	}
	b.rep.add("local, one machine", "session create (sandbox service NewSession)", s[0], "bbolt commit of one key (2 fdatasyncs)", b.boltP50, 0)
	b.addTarget("local, "+b.label, "session create (sandbox service NewSession)", s[1], "one machine: session create", oneP50, b.putRTT)

	// Warm tool calls: a session on the one-machine server, and one made
	// on a, called through a and through b.
	cOne, err := sandboxclient.NewSessionWithKey(ctx, one.ep.URL, one.ep.Key)
	if err != nil {
		return err
	}
	oneID, _ := cOne.Session()
	defer one.svc.DeleteSession(context.WithoutCancel(ctx), oneID)
	cA, err := sandboxclient.NewSessionWithKey(ctx, a.ep.URL, a.ep.Key)
	if err != nil {
		return err
	}
	id, token := cA.Session()
	defer a.svc.DeleteSession(context.WithoutCancel(ctx), id)
	cB := sandboxclient.New(c.ep.URL, id, token)
	call := func(cl *sandboxclient.HTTP) func(int) (time.Duration, error) {
		return func(int) (time.Duration, error) {
			// {"command":"true"}: the session's default box.
			return timed(func() error { _, err := shell(ctx, cl, "", "true", 0); return err })
		}
	}
	bwrap := func(int) (time.Duration, error) {
		return timedCmd(ctx, append(bwrapArgv(), "--", "/usr/bin/true")...)
	}
	if err := warmUp(call(cOne), call(cA), call(cB), bwrap); err != nil {
		return fmt.Errorf("shell true: %w", err)
	}
	// b must forward the calls, not take the session over.
	if holder, err := c.svc.SessionHolder(ctx, id); err != nil || holder == "" {
		return fmt.Errorf("server b serves the session made on a itself (holder %q, %v): the calls through b would not be forwarded", holder, err)
	}
	s, err = interleaved(ctx, b.o.n, b.o.budget, call(cOne), call(cA), call(cB), bwrap)
	if err != nil {
		return fmt.Errorf("shell true: %w", err)
	}
	if holder, err := c.svc.SessionHolder(ctx, id); err != nil || holder == "" {
		return fmt.Errorf("server b took the session made on a over during the calls (holder %q, %v)", holder, err)
	}
	if err := b.countCalls(ctx, "`shell` `true` to the session's server", 0, call(cA)); err != nil {
		return err
	}
	if err := b.countCalls(ctx, "`shell` `true` to another server", 0, call(cB)); err != nil {
		return err
	}
	bwrapP50, _, _ := percentiles(s[3])
	oneP50, _, _ = percentiles(s[0])
	ownerP50, _, _ := percentiles(s[1])
	b.rep.add("local, one machine", "warm `shell` `true` over HTTP", s[0], "bwrap … true", bwrapP50, 0)
	b.addTarget("local, "+b.label, "warm `shell` `true` over HTTP to the session's server", s[1], "one machine: warm `shell` `true`", oneP50, b.getRTT)
	b.addTarget("local, "+b.label, "warm `shell` `true` over HTTP to another server (forwarded)", s[2], "one machine: warm `shell` `true`", oneP50, b.getRTT)
	fwdP50, _, _ := percentiles(s[2])
	b.rep.note("servers: server.Open with Backend local, no warm pool, serving TCP on 127.0.0.1 (Host.ServeTCP): one over its data dir's bbolt file, and two in this process over the etcd cluster (Cluster.Etcd, each with its own data dir). Session create: the sandbox service's NewSession in-process (each session deleted after, not timed). Tool calls: POST /v1/sessions/ID/tools/shell {\"command\":\"true\"} with the session's token, to the session's default box (running: warm); the session made on server a, called on a, and on b, which forwards it to a (a read of the session's lease and one of a's URL in etcd, then a proxied request); forwarded / direct to a: %.3g×.", float64(fwdP50)/float64(ownerP50))
	return nil
}
