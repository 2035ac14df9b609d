// Package cluster is cellbox past one machine (docs/cluster.md): the
// state several servers share in etcd, snapshots in S3, boxes as pods of
// Kubernetes. It registers itself with package server as it initialises
// (server.RegisterCluster): a binary that imports it (cellbox-cluster,
// cellbox-bench) serves --etcd, --blobs and --backend kubernetes; cellbox
// itself starts without these clients.
//
// Several servers, one state: with ClusterConfig.Etcd, the cells, the
// sandbox service's records and the leases live in etcd, and every server
// over it is the same server to a client. What stays a server's own is its
// data directory (sockets, box directories, images) and the boxes'
// connections; a session is served by the server holding its lease, and a
// request that reaches another is forwarded to it (forwardSessions).
package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/cells/etcdkv"
	"github.com/cellbox/cellbox/internal/etcdconn"
	"github.com/cellbox/cellbox/sandbox"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/blobs"
	"github.com/cellbox/cellbox/sandbox/blobs/s3blobs"
	"github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/lease/etcdlease"
	"github.com/cellbox/cellbox/sandbox/previews"
	"github.com/cellbox/cellbox/sandbox/state"
	"github.com/cellbox/cellbox/sandbox/state/etcdstate"
	"github.com/cellbox/cellbox/server"
)

func init() { server.RegisterCluster(open, openKube) }

// cluster is what a server of a shared state holds: its etcd client, its
// name among the servers, and the leases.
type cluster struct {
	c      *clientv3.Client
	prefix string
	holder string
	leaser lease.Leaser
	lock   *os.File // DATA/server.lock, flocked: one process a data dir
	blobs  string   // --blobs
	// key is the server key once the HTTP server has it (ServeTCP): the
	// mark of forwarded requests is made with it.
	key atomic.Pointer[string]
	// alive is the etcd lease of this server's registry entry (announce):
	// what lives only as long as this server does is put under it.
	alive atomic.Int64
}

// open opens the shared state of cfg for the server of dataDir: the
// cells, the sandbox records, the leases; and makes the server key the
// cluster's (DATA/server.key holds a copy, for this machine's CLI).
func open(ctx context.Context, dataDir string, cfg server.ClusterConfig) (cells.Store, state.Store, server.Shared, error) {
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := etcdconn.Dial(ctx, cfg.Etcd)
	if err != nil {
		lock.Close()
		return nil, nil, nil, err
	}
	cl := &cluster{c: c, prefix: cfg.PrefixOrDefault(), lock: lock, blobs: cfg.Blobs}
	fail := func(err error) (cells.Store, state.Store, server.Shared, error) {
		c.Close()
		lock.Close()
		return nil, nil, nil, err
	}
	if cl.holder, err = serverName(dataDir); err != nil {
		return fail(err)
	}
	cl.leaser = etcdlease.New(c, cl.prefix+"leases/")
	kv, err := etcdkv.Open(ctx, c, cl.prefix+"cells/")
	if err != nil {
		return fail(err)
	}
	store, err := cells.Open(ctx, kv, cells.Options{})
	if err != nil {
		kv.Close()
		return fail(err)
	}
	if os.Getenv(server.KeyEnv) == "" {
		if err := cl.shareKey(ctx, filepath.Join(dataDir, server.KeyFile)); err != nil {
			store.Close()
			return fail(err)
		}
	}
	return store, etcdstate.Open(c, cl.prefix+"state/"), cl, nil
}

func (cl *cluster) Leaser() lease.Leaser { return cl.leaser }

func (cl *cluster) Holder() string { return cl.holder }

// Close closes the client and frees the data directory.
func (cl *cluster) Close() error {
	return errors.Join(cl.c.Close(), cl.lock.Close())
}

// lockDataDir takes DATA/server.lock: the data directory is one
// process's, as the bbolt file's lock says on one machine.
func lockDataDir(dataDir string) (*os.File, error) {
	path := filepath.Join(dataDir, "server.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s is in use: another cellbox serve holds %s (stop it, or give each server its own --data)", dataDir, path)
	}
	return f, nil
}

// serverName is this server's name among those of the cluster: the host
// and a random id kept in DATA/server.id, so that a server restarted over
// its data directory is the same server (it holds its leases again at
// once) and two data directories are two servers.
func serverName(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "server.id")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		r := make([]byte, 6)
		rand.Read(r)
		b = []byte(hex.EncodeToString(r))
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		return "", fmt.Errorf("the server's id (%s): %w", path, err)
	}
	host, _ := os.Hostname()
	return host + "/" + strings.TrimSpace(string(b)), nil
}

// shareKey makes the cluster's server key this server's: the first server
// puts one (if none is there), every server writes it to its key file.
func (cl *cluster) shareKey(ctx context.Context, path string) error {
	k := cl.prefix + "server.key"
	b := make([]byte, 32)
	rand.Read(b)
	resp, err := cl.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, hex.EncodeToString(b))).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return etcdconn.Explain("share the server key", err)
	}
	key := hex.EncodeToString(b)
	if !resp.Succeeded {
		key = string(resp.Responses[0].GetResponseRange().Kvs[0].Value)
	}
	if cur, err := server.ReadKey(path); err == nil && cur == key {
		return nil
	}
	if err := os.WriteFile(path+".new", []byte(key+"\n"), 0o600); err != nil {
		return fmt.Errorf("write the server key: %w", err)
	}
	return os.Rename(path+".new", path)
}

// Blobs opens the snapshot store of --blobs, and keeps the kubernetes
// backend's stopped boxes' workspaces beside the snapshots (nil, nil
// without --blobs: the data directory's).
func (cl *cluster) Blobs(ctx context.Context) (blobs.Store, backend.Keeper, error) {
	if cl.blobs == "" {
		return nil, nil, nil
	}
	s3, err := s3blobs.Open(ctx, cl.blobs)
	if err != nil {
		return nil, nil, err
	}
	return s3, keptKeeper{s3.Kept()}, nil
}

// Serve puts the forwarding of sessions and MCP sessions other servers
// serve in front of next, and announces this server at base.
func (cl *cluster) Serve(ctx context.Context, key, base string, svc func(context.Context) (*sandbox.Service, error), next http.Handler) (http.Handler, error) {
	cl.key.Store(&key)
	h := cl.forwardSessions(svc, cl.forwardMCP(next))
	if err := cl.announce(ctx, base); err != nil {
		return nil, err
	}
	return h, nil
}

// keptKeeper keeps the workspaces of the kubernetes backend's stopped
// boxes beside the snapshots, so that any server wakes a box another put
// to sleep (backend.Keeper over s3blobs.Kept).
type keptKeeper struct{ k *s3blobs.Kept }

var _ backend.Keeper = keptKeeper{}

func (k keptKeeper) Put(ctx context.Context, id string, r io.Reader) error {
	if err := backend.ValidID(id); err != nil {
		return err
	}
	return k.k.Put(ctx, id+".tar", r)
}

func (k keptKeeper) Get(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := backend.ValidID(id); err != nil {
		return nil, err
	}
	rc, err := k.k.Get(ctx, id+".tar")
	if errors.Is(err, blobs.ErrNotFound) {
		return nil, fmt.Errorf("kept workspace of %s: %w", id, backend.ErrNotFound)
	}
	return rc, err
}

func (k keptKeeper) Delete(ctx context.Context, id string) error {
	if err := backend.ValidID(id); err != nil {
		return err
	}
	return k.k.Delete(ctx, id+".tar")
}

// The registry of servers: PREFIX servers/NAME holds the URL other
// servers forward to, for as long as the server lives (an etcd lease it
// keeps alive).

// announce records this server's URL until ctx ends or the process dies.
func (cl *cluster) announce(ctx context.Context, u string) error {
	g, err := cl.c.Grant(ctx, 10)
	if err != nil {
		return etcdconn.Explain("announce the server", err)
	}
	if _, err := cl.c.Put(ctx, cl.prefix+"servers/"+cl.holder, u, clientv3.WithLease(g.ID)); err != nil {
		return etcdconn.Explain("announce the server", err)
	}
	cl.alive.Store(int64(g.ID))
	ch, err := cl.c.KeepAlive(ctx, g.ID)
	if err != nil {
		return etcdconn.Explain("announce the server", err)
	}
	go func() {
		for range ch { // drained: the client renews as long as ctx lives
		}
	}()
	return nil
}

// urlOf returns the URL of the server named holder ("" if it is not
// announced: dead, or not serving yet).
func (cl *cluster) urlOf(ctx context.Context, holder string) (string, error) {
	resp, err := cl.c.Get(ctx, cl.prefix+"servers/"+holder)
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}

// forwardedHeader marks a request one server forwarded to another: its
// value proves it (an HMAC of the session id under the server key, which
// only servers know), and the server that gets it serves the request
// itself rather than forward it again.
const forwardedHeader = "X-Cellbox-Forwarded"

func forwardMark(key, session string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(session))
	return hex.EncodeToString(m.Sum(nil))
}

// sessionOf returns the session id of a tool API path
// (/v1/sessions/ID/...), "" for another path.
func sessionOf(path string) string {
	rest, ok := strings.CutPrefix(path, "/v1/sessions/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// previewOf returns the preview id of a request to a preview (its host
// ID.localhost, or the path /preview/ID/...), "" for another request.
func previewOf(r *http.Request) string {
	if id, ok := previews.IDFromHost(r.Host); ok {
		return id
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/preview/"); ok {
		if id, _, _ := strings.Cut(rest, "/"); previews.IsID(id) {
			return id
		}
	}
	return ""
}

// forwardSessions sends a request for a session another server serves to
// that server, as it came (its token checked there); the rest goes to
// next. A session no server serves is taken here by next.
func (cl *cluster) forwardSessions(svc func(context.Context) (*sandbox.Service, error), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, pid := sessionOf(r.URL.Path), previewOf(r)
		if id == "" && pid == "" {
			next.ServeHTTP(w, r)
			return
		}
		s, err := svc(r.Context())
		if err != nil {
			next.ServeHTTP(w, r) // it says why
			return
		}
		if pid != "" {
			// A preview: served where its session is.
			if id, err = s.PreviewSession(r.Context(), pid); err != nil || id == "" {
				next.ServeHTTP(w, r)
				return
			}
		}
		if cl.wasForwarded(r, "session/"+id) {
			next.ServeHTTP(w, r)
			return
		}
		holder, err := s.SessionHolder(r.Context(), id)
		if err == nil && holder == "" {
			if pid != "" {
				s.TakeSession(id) // loads its boxes, and their previews
			}
			next.ServeHTTP(w, r)
			return
		}
		cl.proxy(w, r, "session/"+id, holder, err)
	})
}

// forwardMCP sends a request of an MCP session of /v1/mcp (Mcp-Session-Id)
// to the server it lives on: MCP sessions live in the memory of the server
// that began them, noted in etcd (PREFIX mcp/ID) for as long as that
// server lives. A session whose server died is unknown everywhere, and the
// client is answered 404 and begins a new one, as MCP says.
func (cl *cluster) forwardMCP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/mcp" {
			next.ServeHTTP(w, r)
			return
		}
		sid := r.Header.Get("Mcp-Session-Id")
		if sid == "" { // a new MCP session, maybe: note where it lives
			next.ServeHTTP(&mcpNoter{ResponseWriter: w, note: cl.noteMCP}, r)
			return
		}
		subject := "mcp/" + sid
		if cl.wasForwarded(r, subject) {
			next.ServeHTTP(w, r)
			return
		}
		resp, err := cl.c.Get(r.Context(), cl.prefix+subject)
		if err == nil && (len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) == cl.holder) {
			next.ServeHTTP(w, r)
			return
		}
		holder := ""
		if err == nil {
			holder = string(resp.Kvs[0].Value)
		}
		cl.proxy(w, r, subject, holder, err)
	})
}

// noteMCP records that MCP session id lives on this server.
func (cl *cluster) noteMCP(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var opts []clientv3.OpOption
	if l := cl.alive.Load(); l != 0 {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(l)))
	}
	if _, err := cl.c.Put(ctx, cl.prefix+"mcp/"+id, cl.holder, opts...); err != nil {
		slog.Warn("note an MCP session for the other servers", "session", id, "err", err)
	}
}

// mcpNoter notes the MCP session id a response hands out.
type mcpNoter struct {
	http.ResponseWriter
	note  func(string)
	noted bool
}

func (m *mcpNoter) WriteHeader(code int) {
	if !m.noted {
		m.noted = true
		if id := m.Header().Get("Mcp-Session-Id"); id != "" && code < 300 {
			m.note(id)
		}
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *mcpNoter) Write(b []byte) (int, error) {
	if !m.noted {
		m.WriteHeader(http.StatusOK)
	}
	return m.ResponseWriter.Write(b)
}

func (m *mcpNoter) Flush() { http.NewResponseController(m.ResponseWriter).Flush() }

func (m *mcpNoter) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// ForwardPattern is runapi's Config.Forward: a write to an instance
// another server runs goes there.
func (cl *cluster) ForwardPattern(w http.ResponseWriter, r *http.Request, instance string) bool {
	subject := "pattern/" + instance
	if cl.wasForwarded(r, subject) {
		return false
	}
	holder, err := cl.leaser.Holder(r.Context(), subject)
	if err == nil && (holder == "" || holder == cl.holder) {
		return false
	}
	cl.proxy(w, r, subject, holder, err)
	return true
}

// wasForwarded reports whether r was forwarded by a server (it carries
// the mark of subject under the server key).
func (cl *cluster) wasForwarded(r *http.Request, subject string) bool {
	key := cl.key.Load()
	return key != nil && hmac.Equal([]byte(r.Header.Get(forwardedHeader)), []byte(forwardMark(*key, subject)))
}

// proxy sends r to the server named holder, which serves subject (err:
// finding it failed), and writes its answer.
func (cl *cluster) proxy(w http.ResponseWriter, r *http.Request, subject, holder string, err error) {
	var target string
	if err == nil {
		target, err = cl.urlOf(r.Context(), holder)
	}
	key := cl.key.Load()
	if err != nil || target == "" || key == nil {
		slog.Warn("the server of a session or pattern does not answer", "of", subject, "server", holder, "err", err)
		w.Header().Set("Retry-After", "5")
		http.Error(w, fmt.Sprintf("%s is served by server %s, which is not reachable now: call again in a few seconds, when another server takes it over", subject, holder), http.StatusServiceUnavailable)
		return
	}
	u, err := url.Parse(target)
	if err != nil {
		http.Error(w, "bad server URL in the registry: "+target, http.StatusBadGateway)
		return
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			// The Host the client asked for: the other server's guard
			// checks it as this one's did, and a preview host names its
			// preview.
			pr.Out.Host = r.Host
			pr.Out.Header.Set(forwardedHeader, forwardMark(*key, subject))
		},
		FlushInterval: -1, // streams (MCP, watch) as they come
	}
	p.ServeHTTP(w, r)
}
