package sandbox

// The snapshot tools: snapshot, snapshot_list, snapshot_delete, restore,
// branch and fork, over the snapshot store (sandbox/snapshots).
// Workspaces move through the agents' tar streams (the portable path);
// fork uses a backend's copy-on-write (backend.Cloner) when it has one.
// Snapshots belong to the session that took them: another session's id
// is "no such snapshot".

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellbox/cellbox/internal/safe"
	"github.com/cellbox/cellbox/sandbox/agent"
	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/egress"
	"github.com/cellbox/cellbox/sandbox/snapshots"
	"github.com/cellbox/cellbox/sandbox/tools"
)

// maxFork caps the boxes one fork makes.
const maxFork = 16

// maxSnapshots caps the snapshots of one session (each is bounded by its
// box's disk cap).
const maxSnapshots = 256

func snapshotTools() []*tools.Tool {
	return []*tools.Tool{
		tools.Define("snapshot", tools.Meta{Title: "Snapshot a sandbox's workspace"},
			"Save a sandbox's workspace (/workspace) as a snapshot of this session and return its id; use it with restore, branch and snapshot_delete. Kept: files, directories, hard links, FIFOs and symlinks (wherever they point), names byte for byte, permission bits, modification times. Not kept: sockets and devices (left out), owners, /tmp, processes. A file the sandbox cannot read fails the snapshot, naming it. Snapshots survive restarts and are stored deduplicated by whole file (an unchanged file costs nothing again; no compression; the holes of a sparse file are kept as holes, neither stored nor copied: size counts them, data_bytes does not; files counts regular files only, added_bytes what the snapshot added to the store); a session may keep 256, taking at most 16 GiB of store by default (cellbox serve --max-snapshot-bytes).",
			snapshotTool),
		tools.Define("snapshot_list", tools.Meta{Title: "List snapshots", ReadOnly: true, Idempotent: true},
			"List the snapshots of this session, oldest first, with label, source sandbox, size, and the bytes each added to the (deduplicated) store.",
			snapshotListTool),
		tools.Define("snapshot_delete", tools.Meta{Title: "Delete a snapshot", Destructive: true},
			"Delete a snapshot of this session; content no other snapshot shares is freed.",
			snapshotDeleteTool),
		tools.Define("restore", tools.Meta{Title: "Restore a snapshot into a sandbox", Destructive: true, Idempotent: true},
			"Replace a sandbox's workspace with a snapshot's content: everything in /workspace is replaced. A snapshot larger than the sandbox's disk cap (limits.disk_bytes) is refused before anything is changed; use branch for it instead. If the copy stops part way (the disk fills), the earlier workspace is put back. Running processes keep running.",
			restoreTool),
		tools.Define("branch", tools.Meta{Title: "Start a new sandbox from a snapshot"},
			"Make a NEW sandbox of this session (same image and settings as the snapshot's sandbox had when it was taken: env, limits, workspace_dir, destroy_on_close, network with its allow list and inject rules) whose workspace is the snapshot's content; the original sandbox is unchanged.",
			branchTool),
		tools.Define("fork", tools.Meta{Title: "Fork a sandbox into several"},
			"Make count NEW sandboxes (up to 16) with a running sandbox's image and settings (env, limits, workspace_dir, destroy_on_close, network with its allow list and inject rules) whose workspaces are copies of its workspace (/workspace; /tmp starts empty), e.g. to try several fixes in parallel; each is independent afterwards. Processes are not copied.",
			forkTool),
	}
}

func snapInfo(r snapshots.Record) api.SnapshotInfo {
	data := r.Size
	if r.Data != nil {
		data = *r.Data
	}
	return api.SnapshotInfo{ID: r.ID, Label: r.Label, Sandbox: r.Sandbox, Created: r.Created, Size: r.Size, DataBytes: data, Files: r.Files, AddedBytes: r.Added}
}

// maxSnapshotLabel caps a snapshot's label, in bytes.
const maxSnapshotLabel = 256

func snapshotTool(ctx context.Context, c *call, in api.SnapshotInput) (api.SnapshotInfo, error) {
	if len(in.Label) > maxSnapshotLabel {
		return api.SnapshotInfo{}, api.WithCode(api.CodeInvalidInput, fmt.Errorf("snapshot label of %d bytes: at most %d; say more in a file of the workspace", len(in.Label), maxSnapshotLabel))
	}
	l, err := c.existingBox(ctx, in.Sandbox)
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	ss := c.s.snaps
	if ids, err := ss.SessionIDs(ctx, c.sess.ID); err != nil {
		return api.SnapshotInfo{}, err
	} else if len(ids) >= maxSnapshots {
		return api.SnapshotInfo{}, api.WithCode(api.CodeLimit, fmt.Errorf("this session has %d snapshots, the most a session may keep; delete some with snapshot_delete", len(ids)))
	}
	most := c.s.cfg.MaxSnapshotBytes
	used := ss.Bytes(c.sess.ID)
	full := func() error {
		return api.WithCode(api.CodeLimit, fmt.Errorf("snapshot of %q: this session's snapshots would take more than %d bytes (%d in use), the most a session may store: delete some with snapshot_delete, or raise the limit (cellbox serve --max-snapshot-bytes)", l.name, most, used))
	}
	if used >= most {
		return api.SnapshotInfo{}, full()
	}
	l.b.workspace.Lock()
	defer l.b.workspace.Unlock()
	release, err := ss.Hold(ctx, c.sess.ID)
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	defer release()
	entries, added, err := c.s.captureBox(ctx, c.sess.ID, l, most-used)
	if err != nil {
		ss.FreeLater(c.s.log, c.sess.ID) // what it stored before it failed
		if errors.Is(err, snapshots.ErrStoreFull) {
			return api.SnapshotInfo{}, full()
		}
		return api.SnapshotInfo{}, err
	}
	c.noticeUnkept(l.name, l.b.rec, "a snapshot")
	rec, err := newSnapshotRecord(c, l, in.Label, entries, added)
	if err == nil {
		err = ss.Put(ctx, rec, entries)
	}
	if err != nil {
		ss.FreeLater(c.s.log, c.sess.ID) // the blobs no record names now
		return api.SnapshotInfo{}, fmt.Errorf("save snapshot of %q: %w", l.name, err)
	}
	c.s.log.Info("snapshot taken", "session", c.sess.ID, "sandbox", l.name, "snapshot", rec.ID, "files", rec.Files, "bytes", rec.Size, "added", added)
	return snapInfo(rec), nil
}

// newSnapshotRecord is the record of a new snapshot of the call's session:
// entries, the manifest of l's workspace, which added bytes to the store.
// Its Spec is l's settings (specOf), for branch (specOfSnapshot).
func newSnapshotRecord(c *call, l *lease, label string, entries []snapshots.Entry, added int64) (snapshots.Record, error) {
	spec, err := json.Marshal(specOf(l.b.rec))
	if err != nil {
		return snapshots.Record{}, err
	}
	rec := snapshots.Record{
		ID: "snap-" + randomID(8), Label: label, Session: c.sess.ID,
		Sandbox: l.name, BoxID: l.b.rec.ID, Spec: spec,
		Created: time.Now().UTC(), Added: added, Entries: len(entries),
	}
	rec.Files, rec.Size = snapshots.CountFiles(entries)
	data := snapshots.DataBytes(entries)
	rec.Data = &data
	return rec, nil
}

// specOfSnapshot is the spec of a new box made from snapshot rec (branch):
// the settings its box had, as newSnapshotRecord stored them.
func specOfSnapshot(rec snapshots.Record) (boxSpec, error) {
	var spec boxSpec
	if len(rec.Spec) == 0 {
		return spec, nil
	}
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		return spec, fmt.Errorf("snapshot %s: %w", rec.ID, err)
	}
	return spec, nil
}

func snapshotListTool(ctx context.Context, c *call, in api.SnapshotListInput) (api.SnapshotListOutput, error) {
	recs, err := c.s.snaps.List(ctx, c.sess.ID)
	if err != nil {
		return api.SnapshotListOutput{}, err
	}
	out := api.SnapshotListOutput{Snapshots: []api.SnapshotInfo{}, StoreBytes: c.s.snaps.Bytes(c.sess.ID)}
	for _, r := range recs {
		out.Snapshots = append(out.Snapshots, snapInfo(r))
	}
	return out, nil
}

func snapshotDeleteTool(ctx context.Context, c *call, in api.SnapshotDeleteInput) (api.SnapshotDeleteOutput, error) {
	freed, err := c.s.snaps.Delete(ctx, c.sess.ID, in.Snapshot)
	if err != nil {
		return api.SnapshotDeleteOutput{}, err
	}
	return api.SnapshotDeleteOutput{OK: true, FreedBytes: freed}, nil
}

func restoreTool(ctx context.Context, c *call, in api.RestoreInput) (api.SeedOutput, error) {
	ss := c.s.snaps
	if _, _, err := ss.Get(ctx, c.sess.ID, in.Snapshot); err != nil {
		return api.SeedOutput{}, err // before the box is woken or made
	}
	l, err := c.box(ctx, in.Sandbox)
	if err != nil {
		return api.SeedOutput{}, err
	}
	// The box's workspace lock before the store's (as snapshot and fork
	// take them), then the snapshot again: it may be gone meanwhile.
	l.b.workspace.Lock()
	defer l.b.workspace.Unlock()
	release, err := ss.Hold(ctx, c.sess.ID)
	if err != nil {
		return api.SeedOutput{}, err
	}
	defer release()
	_, entries, err := ss.Get(ctx, c.sess.ID, in.Snapshot)
	if err != nil {
		return api.SeedOutput{}, err
	}
	files, size := snapshots.CountFiles(entries)
	// Checked before anything is deleted: a snapshot larger than the box's
	// disk can never fit, and finding that out by running out of space
	// would cost the workspace.
	if disk := toBackendLimits(l.b.rec.Limits).Defaults().DiskBytes; size > disk {
		return api.SeedOutput{}, api.WithCode(api.CodeTooLarge, fmt.Errorf("restore %s into %q: the snapshot holds %d bytes, more than the sandbox's disk cap of %d bytes; nothing was changed. Branch the snapshot into a new sandbox (branch), or use a sandbox with a larger limits.disk_bytes", in.Snapshot, l.name, size, disk))
	}
	// The workspace as it is goes into the store first, as a snapshot of
	// its own (what is there already costs nothing), so that a restore that
	// stops part way (a full disk, a box that dies) can put it back, and
	// one cut short by the server's death leaves it to restore by hand:
	// nothing is lost. It goes once the restore is over.
	prior, added, err := c.s.captureBox(ctx, c.sess.ID, l, math.MaxInt64)
	if err != nil {
		ss.FreeLater(c.s.log, c.sess.ID)
		return api.SeedOutput{}, fmt.Errorf("restore %s into %q: saving the workspace first failed, so nothing was changed: %w", in.Snapshot, l.name, err)
	}
	before, err := newSnapshotRecord(c, l, "before restore of "+in.Snapshot, prior, added)
	if err == nil {
		err = ss.Put(ctx, before, prior)
	}
	if err != nil {
		ss.FreeLater(c.s.log, c.sess.ID)
		return api.SeedOutput{}, fmt.Errorf("restore %s into %q: saving the workspace first failed, so nothing was changed: %w", in.Snapshot, l.name, err)
	}
	replace := func(entries []snapshots.Entry) error {
		if err := clearWorkspace(ctx, l.client); err != nil {
			return err
		}
		return seed(ctx, ss, l.client, c.sess.ID, entries)
	}
	err = replace(entries)
	if err == nil {
		ss.FreeLater(c.s.log, c.sess.ID, before.ID) // the copy of the workspace: not needed now
		return api.SeedOutput{Sandbox: l.name, ID: l.b.rec.ID, Files: files, Bytes: size}, nil
	}
	if backErr := replace(prior); backErr != nil {
		return api.SeedOutput{}, fmt.Errorf("restore %s into %q stopped part way: %w; putting the earlier files back failed too (%v). They are kept as snapshot %s (label %q): restore it into this sandbox or branch it into a new one", in.Snapshot, l.name, err, backErr, before.ID, before.Label)
	}
	ss.FreeLater(c.s.log, c.sess.ID, before.ID)
	hint := "Free space in the sandbox (its disk cap counts /workspace and /tmp) and restore again"
	if !errors.Is(err, syscall.ENOSPC) && !strings.Contains(err.Error(), "no space left") {
		hint = "Restore again once the cause is fixed"
	}
	return api.SeedOutput{}, fmt.Errorf("restore %s into %q stopped part way: %w; the workspace is back as it was before the restore. %s", in.Snapshot, l.name, err, hint)
}

func branchTool(ctx context.Context, c *call, in api.BranchInput) (api.SeedOutput, error) {
	ss := c.s.snaps
	release, err := ss.Hold(ctx, c.sess.ID)
	if err != nil {
		return api.SeedOutput{}, err
	}
	defer release()
	rec, entries, err := ss.Get(ctx, c.sess.ID, in.Snapshot)
	if err != nil {
		return api.SeedOutput{}, err
	}
	spec, err := specOfSnapshot(rec)
	if err != nil {
		return api.SeedOutput{}, err
	}
	ls, err := c.s.newBoxes(ctx, c, []string{in.Name}, spec, "", func(ctx context.Context, l *lease) error {
		return seed(ctx, ss, l.client, c.sess.ID, entries)
	})
	if err != nil {
		return api.SeedOutput{}, fmt.Errorf("branch %s: %w", in.Snapshot, err)
	}
	files, size := snapshots.CountFiles(entries)
	return api.SeedOutput{Sandbox: ls[0].name, ID: ls[0].b.rec.ID, Files: files, Bytes: size}, nil
}

func forkTool(ctx context.Context, c *call, in api.ForkInput) (api.ForkOutput, error) {
	var out api.ForkOutput
	if in.Count < 1 || in.Count > maxFork {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("fork count %d: want 1 to %d", in.Count, maxFork))
	}
	if len(in.Names) > 0 && len(in.Names) != in.Count {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("fork: %d names for count %d; give one name per new sandbox, or none", len(in.Names), in.Count))
	}
	src, err := c.existingBox(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	src.b.workspace.Lock() // never a copy of half a restore
	defer src.b.workspace.Unlock()
	names := in.Names
	if len(names) == 0 {
		names = c.s.freeNames(c.sess, src.name, in.Count)
	}
	spec := specOf(src.b.rec)
	c.noticeUnkept(src.name, src.b.rec, "a fork")
	if _, ok := c.s.be.(backend.Cloner); ok && c.s.caps.Clone {
		ls, err := c.s.newBoxes(ctx, c, names, spec, src.b.rec.ID, nil)
		switch ErrorCode(err) {
		case "":
			for _, l := range ls {
				out.Sandboxes = append(out.Sandboxes, l.name)
			}
			out.Method = "clone"
			return out, nil
		case api.CodeInternal:
			c.s.log.Warn("fork by copying the disk failed; copying through the agents", "sandbox", src.name, "err", err)
			c.Notice(fmt.Sprintf("the %s backend could not copy the disk of %q (%v); the files were copied through the sandboxes instead", c.s.be.Name(), src.name, err))
		default:
			return out, fmt.Errorf("fork %q: %w", src.name, err)
		}
	}
	ss := c.s.snaps
	release, err := ss.Hold(ctx, c.sess.ID)
	if err != nil {
		return out, fmt.Errorf("fork %q: %w", src.name, err)
	}
	defer release()
	// The portable path: the source's workspace into the store once (what
	// is there already is not written again), then into every new box.
	entries, _, err := c.s.captureBox(ctx, c.sess.ID, src, math.MaxInt64) // transient: not counted against the snapshot cap
	defer ss.FreeLater(c.s.log, c.sess.ID)
	if err != nil {
		return out, fmt.Errorf("fork %q: %w", src.name, err)
	}
	ls, err := c.s.newBoxes(ctx, c, names, spec, "", func(ctx context.Context, l *lease) error {
		return seed(ctx, ss, l.client, c.sess.ID, entries)
	})
	if err != nil {
		return out, fmt.Errorf("fork %q: %w", src.name, err)
	}
	for _, l := range ls {
		out.Sandboxes = append(out.Sandboxes, l.name)
	}
	out.Files, out.Bytes = snapshots.CountFiles(entries)
	out.Method = "tar"
	return out, nil
}

// captureBox stores the workspace of the leased box among session's blobs
// (adding at most maxAdded bytes, else snapshots.ErrStoreFull) and returns
// its manifest and the bytes it added; the caller holds s.snaps
// (snapshots.Store.Hold).
func (s *Service) captureBox(ctx context.Context, session string, l *lease, maxAdded int64) ([]snapshots.Entry, int64, error) {
	pr, srcErr := safe.PipeFrom("snapshot", func(w io.Writer) error {
		_, err := l.client.TarOut(ctx, backend.Workspace, w)
		return err
	})
	maxBytes := toBackendLimits(l.b.rec.Limits).Defaults().DiskBytes
	entries, added, err := s.snaps.Capture(session, pr, maxBytes, maxAdded)
	pr.Close() // the agent, if still writing, gets io.ErrClosedPipe (safe.PipeError)
	if err = safe.PipeError(<-srcErr, err); err != nil {
		return nil, 0, fmt.Errorf("snapshot of %q: %w", l.name, err)
	}
	return entries, added, nil
}

// seed extracts the manifest (of a snapshot of session in ss) into cl's
// workspace; the caller holds ss (Hold).
func seed(ctx context.Context, ss *snapshots.Store, cl *agent.Client, session string, entries []snapshots.Entry) error {
	pr, _ := safe.PipeFrom("restore", func(w io.Writer) error {
		return ss.WriteTar(ctx, w, session, entries)
	})
	_, err := cl.TarIn(ctx, backend.Workspace, pr)
	pr.Close()
	return err
}

// clearWorkspace deletes everything in the box's workspace, the workspace
// itself kept (it is a mount point). It asks the agent, so it works on
// every backend and never follows a link out.
func clearWorkspace(ctx context.Context, cl *agent.Client) error {
	for {
		root, truncated, err := cl.Tree(ctx, backend.Workspace, 1, 10000)
		if err != nil {
			return err
		}
		for _, e := range root.Children {
			if err := cl.Remove(ctx, e.Path, true); err != nil {
				return fmt.Errorf("clear %s: %w", e.Path, err)
			}
		}
		if !truncated || len(root.Children) == 0 {
			return nil
		}
	}
}

// noticeUnkept tells the caller that what (a snapshot, a fork) of box
// name holds none of its working directory when that lies outside the
// workspace (workspace_dir under /tmp): an agent working there would
// otherwise find its files gone without a word.
func (c *call) noticeUnkept(name string, rec boxRecord, what string) {
	if wd := rec.WorkspaceDir; wd != "" && wd != backend.Workspace && !strings.HasPrefix(wd, backend.Workspace+"/") {
		c.Notice(fmt.Sprintf("%q works in %s, outside %s: %s holds only %s, none of the files in %s", name, wd, backend.Workspace, what, backend.Workspace, wd))
	}
}

// specOf is the spec of a new box made like rec (branch, fork): its
// image, env, limits, working directory, destroy_on_close and network,
// the allow list and inject rules included (a copy: network_set on one
// box leaves the other's alone).
func specOf(rec boxRecord) boxSpec {
	spec := boxSpec{Image: rec.Image, Env: rec.Env, Limits: rec.Limits, Network: rec.Network, SleepAfterMs: rec.SleepAfterMs,
		WorkspaceDir: rec.WorkspaceDir, DestroyOnClose: &rec.DestroyOnClose}
	if rec.Egress != nil {
		spec.Egress = &api.NetworkRules{Allow: slices.Clone(rec.Egress.Allow), Inject: slices.Clone(rec.Egress.Inject)}
	}
	return spec
}

// withPolicy compiles spec's allow list (a spec from specOf, or stored
// with a snapshot, carries the rules only).
func withPolicy(spec boxSpec) (boxSpec, error) {
	if spec.Egress == nil || spec.policy != nil {
		return spec, nil
	}
	pol, err := egress.CompileRules(*spec.Egress)
	if err != nil {
		return spec, fmt.Errorf("the network rules of the source box do not compile (%w); set them again with network_set on the new box", err)
	}
	spec.policy = pol
	return spec, nil
}

// cloneInto has the backend (a backend.Cloner) make the backend boxes of
// the new boxes (named names) with copies of box src's disk, all taken at
// one instant; the boxes' first use starts them. The caller holds the
// boxes' life.
func (s *Service) cloneInto(ctx context.Context, sess *Session, names []string, boxes []*box, src string) error {
	release, err := s.acquireSlot(ctx, sess)
	if err != nil {
		return err
	}
	defer release()
	specs := make([]backend.Spec, len(boxes))
	for i, b := range boxes {
		s.setID(b, "cb-"+randomID(8))
		if specs[i], err = s.backendSpec(b.rec, sess.ID, names[i]); err != nil {
			break
		}
	}
	if err == nil {
		_, err = s.be.(backend.Cloner).Clone(ctx, src, specs)
	}
	if err != nil {
		for _, b := range boxes {
			s.removeHostDir(b.rec.ID)
		}
		return fmt.Errorf("%s backend: clone box %s: %w", s.be.Name(), src, err)
	}
	for _, b := range boxes {
		b.made = true
	}
	return nil
}

// freeNames returns n names base-1, base-2, ... that sess does not use.
func (s *Service) freeNames(sess *Session, base string, n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for i := 1; len(out) < n; i++ {
		name := fmt.Sprintf("%s-%d", base, i)
		if len(name) > 63 {
			name = fmt.Sprintf("fork-%s-%d", randomID(3), i)
		}
		if sess.boxes[name] == nil {
			out = append(out, name)
		}
	}
	return out
}

// newBoxes makes the new boxes names of the call's session from spec
// (with a copy of box cloneOf's disk if set), in parallel, and runs fill
// (if set) on each. All or nothing: if one fails, those
// made are destroyed. The leases are the call's (released when it ends).
func (s *Service) newBoxes(ctx context.Context, c *call, names []string, spec boxSpec, cloneOf string, fill func(context.Context, *lease) error) ([]*lease, error) {
	sess := c.sess
	spec, err := withPolicy(spec)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, name := range names {
		if err := CheckName(name); err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, api.WithCode(api.CodeInvalidInput, fmt.Errorf("name %q given twice", name))
		}
		seen[name] = true
	}
	s.mu.Lock()
	if sess.deleted {
		s.mu.Unlock()
		return nil, fmt.Errorf("session %s: %w", sess.ID, ErrNoSession)
	}
	var taken []string
	for _, name := range names {
		if sess.boxes[name] != nil {
			taken = append(taken, name)
		}
	}
	if len(taken) > 0 {
		s.mu.Unlock()
		return nil, api.WithCode(api.CodeExists, fmt.Errorf("this session already has sandboxes named %s; pick other names or destroy them first", strings.Join(taken, ", ")))
	}
	if err := s.checkCapsLocked(sess, len(names)); err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("%d new sandboxes: %w", len(names), err)
	}
	boxes := make([]*box, len(names))
	for i, name := range names {
		boxes[i] = s.newBoxLocked(sess, spec)
		if cloneOf != "" {
			// Held until the clone made the backend boxes, so that a call
			// naming one meanwhile waits instead of making it empty. The
			// box is not published yet: nobody else can hold its life.
			boxes[i].life.Lock()
		}
		sess.boxes[name] = boxes[i]
	}
	s.mu.Unlock()
	if cloneOf != "" {
		err := s.cloneInto(ctx, sess, names, boxes, cloneOf)
		if err != nil {
			s.mu.Lock()
			for i, name := range names {
				boxes[i].state, boxes[i].failed = stateRemoved, err
				if sess.boxes[name] == boxes[i] {
					delete(sess.boxes, name)
				}
			}
			s.mu.Unlock()
		}
		for _, b := range boxes {
			b.life.Unlock()
		}
		if err != nil {
			return nil, err
		}
	}

	leases := make([]*lease, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer safe.Recover(s.log, "new box", &errs[i])
			l, err := s.use(ctx, sess, name, boxes[i], c.Notice) // c.notice is safe for concurrent use
			if err != nil {
				errs[i] = err
				return
			}
			leases[i] = l
			if fill == nil {
				return
			}
			if err := fill(ctx, l); err != nil {
				errs[i] = fmt.Errorf("fill sandbox %q: %w", name, err)
			}
		}()
	}
	wg.Wait()
	err = errors.Join(errs...)
	for _, l := range leases {
		if l == nil {
			continue
		}
		if err != nil {
			l.release()
			if derr := s.destroyBox(context.WithoutCancel(ctx), sess, l.name); derr != nil {
				s.log.Warn("remove a box of a failed branch/fork", "name", l.name, "err", derr)
			}
			continue
		}
		c.leases = append(c.leases, l)
	}
	if err != nil {
		// Names whose box was never made (a failed use unbinds it itself).
		s.mu.Lock()
		for i, name := range names {
			if leases[i] == nil && sess.boxes[name] == boxes[i] && boxes[i].state == stateNew {
				delete(sess.boxes, name)
			}
		}
		s.mu.Unlock()
		return nil, err
	}
	return leases, nil
}
