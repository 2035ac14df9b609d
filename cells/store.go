package cells

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cellbox/cellbox/internal/jsonschema"
)

const defaultLogLimit = 10000

// defaultLogBytes caps the bytes of the change log's entries: each holds
// the records it changed, values included, so 10,000 commits of a 50 MB
// fetch result would keep 500 GB. Past it the oldest entries go (a watch
// from before the log's start gets a Snapshot, as past LogLimit).
const defaultLogBytes = 64 << 20

// maxAttempts bounds how many times Update runs fn when its commits meet
// conflicts (over a KV that runs writable transactions at once).
const maxAttempts = 32

// db is the Store over a KV.
type db struct {
	kv       KV
	logLimit uint64
	logBytes uint64

	// closeMu orders Close after the calls in flight: a call enters
	// (inflight.Add) only while the store is open, and Close waits for
	// those that entered before it closed the store.
	closeMu  sync.Mutex
	inflight sync.WaitGroup
	closed   atomic.Bool
	done     chan struct{}

	// spare is a change list's array, kept (emptied) for the next
	// Update, as memKV keeps its undo log's.
	spareMu sync.Mutex
	spare   []logChange
}

// Open returns a Store over k, which it owns from then on (Close closes
// it). A KV holding no store gets the layout (layout.go); one holding a
// store of a newer layout than this build knows, or keys that are not a
// store's, is refused. ctx bounds the opening only.
func Open(ctx context.Context, k KV, opts Options) (Store, error) {
	s, err := open(ctx, k, opts)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, k KV, opts Options) (*db, error) {
	s := &db{kv: k, logLimit: defaultLogLimit, logBytes: defaultLogBytes, done: make(chan struct{})}
	if opts.LogLimit > 0 {
		s.logLimit = uint64(opts.LogLimit)
	}
	if opts.LogBytes > 0 {
		s.logBytes = uint64(opts.LogBytes)
	}
	err := retry(ctx, func() error { return s.init(ctx) })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// init checks the layout of the store in the KV, or writes it into a KV
// that holds none.
func (s *db) init(ctx context.Context) error {
	t, err := s.kv.Begin(ctx, true)
	if err != nil {
		return err
	}
	defer t.Rollback()
	info, err := t.Bucket(bucketInfo)
	if err != nil {
		return err
	}
	l, err := info.Get(ctx, keyLayout)
	if err != nil {
		return err
	}
	if l != nil {
		v, err := strconv.Atoi(string(l))
		if err != nil {
			return fmt.Errorf("not a cellbox store: bad layout version %q", l)
		}
		if v > layoutVersion {
			return fmt.Errorf("the store has layout version %d, newer than this cellbox understands (%d): use a newer cellbox", v, layoutVersion)
		}
		return nil
	}
	for _, name := range []string{bucketCells, bucketLog} {
		b, err := t.Bucket(name)
		if err != nil {
			return err
		}
		nonEmpty := false
		if err := b.Scan(ctx, "", "", func(string, []byte) bool { nonEmpty = true; return false }); err != nil {
			return err
		}
		if nonEmpty {
			return fmt.Errorf("not a cellbox store: it has cells but no layout version")
		}
	}
	if err := info.Put(keyLayout, []byte(strconv.Itoa(layoutVersion))); err != nil {
		return err
	}
	if err := info.Put(keyLogStart, u64(1)); err != nil {
		return err
	}
	// Only a new store is written, so only its open commits: a store made
	// before opens without a commit (and its sync), in microseconds for a
	// run with nothing to do.
	if _, err = t.Commit(ctx, false); errors.Is(err, ErrConflict) {
		return &conflictError{err}
	}
	return err
}

// retry runs attempt until it returns anything but a conflict (a
// *conflictError), up to maxAttempts times, pausing a little longer (and
// at random) each time so that the transactions that conflicted spread
// out.
func retry(ctx context.Context, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		var ce *conflictError
		if !errors.As(err, &ce) {
			return err
		}
		if n == maxAttempts {
			return fmt.Errorf("%d commits in a row met a conflict, the last: %w", n, ce.err)
		}
		pause := time.Duration(rand.Int64N(int64(min(50*time.Microsecond<<n, 20*time.Millisecond))))
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// conflictError is a commit's conflict (it wraps ErrConflict), which
// retry runs again; an error of Update's fn that wraps ErrConflict is
// not one, and is returned as it is.
type conflictError struct{ err error }

func (e *conflictError) Error() string { return e.err.Error() }
func (e *conflictError) Unwrap() error { return e.err }

func (s *db) Version() uint64 { return s.kv.Revision() }

// enter admits a call while the store is open; the call leaves with
// s.inflight.Done.
func (s *db) enter() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	s.inflight.Add(1)
	return nil
}

func (s *db) Get(ctx context.Context, addr Address) (Cell, error) {
	var c Cell
	err := s.View(ctx, func(tx Tx) error {
		var err error
		c, err = tx.Get(addr)
		return err
	})
	return c, err
}

func (s *db) View(ctx context.Context, fn func(Tx) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.inflight.Done()
	k, err := s.kv.Begin(ctx, false)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer k.Rollback()
	t := &tx{db: s, kv: k, ctx: ctx, version: k.Revision()}
	if err := fn(t); err != nil {
		return err
	}
	return t.err
}

func (s *db) Update(ctx context.Context, fn func(Tx) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.inflight.Done()
	return retry(ctx, func() error { return s.update(ctx, fn) })
}

// update is one attempt of Update. A commit that met a conflict returns
// a *conflictError.
func (s *db) update(ctx context.Context, fn func(Tx) error) (err error) {
	k, err := s.kv.Begin(ctx, true)
	if err != nil {
		return fmt.Errorf("begin write: %w", err)
	}
	defer k.Rollback()
	s.spareMu.Lock()
	changes := s.spare
	s.spare = nil
	s.spareMu.Unlock()
	t := &tx{db: s, kv: k, ctx: ctx, writable: true, version: k.Revision() + 1, now: time.Now().UnixNano(), changes: changes}
	defer func() {
		clear(t.changes) // let the records be collected
		s.spareMu.Lock()
		s.spare = t.changes[:0]
		s.spareMu.Unlock()
	}()
	if err := fn(t); err != nil {
		return err
	}
	if t.err != nil {
		return t.err
	}
	if !t.dirty {
		// Nothing written: no commit, whose sync would cost milliseconds
		// (a run with nothing to do does several such transactions).
		return nil
	}
	versioned := len(t.changes) > 0
	if versioned {
		if err := t.writeLog(); err != nil {
			return fmt.Errorf("write change log: %w", err)
		}
	}
	rev, err := k.Commit(ctx, versioned)
	switch {
	case errors.Is(err, ErrConflict):
		return &conflictError{fmt.Errorf("commit: %w", err)}
	case err != nil:
		return fmt.Errorf("commit: %w", err)
	case versioned && rev != t.version:
		return fmt.Errorf("commit: the KV gave it version %d, not %d", rev, t.version)
	}
	return nil
}

func (s *db) Close() error {
	s.closeMu.Lock()
	if s.closed.Swap(true) {
		s.closeMu.Unlock()
		return nil
	}
	close(s.done)
	s.closeMu.Unlock()
	s.inflight.Wait()
	return s.kv.Close()
}

// tx implements Tx.
type tx struct {
	db       *db
	kv       KVTx
	ctx      context.Context // View's or Update's: the KV's reads take it
	writable bool
	dirty    bool // something was written (through write)
	version  uint64
	now      int64
	// err is the first failure of the KV in the transaction: View and
	// Update return it even if fn does not, and nothing commits.
	err error

	buckets map[string]KVBucket
	cells   KVBucket // buckets[bucketCells], once opened: every cell read and write takes it
	changes []logChange
	index   map[string]int // cell changes by address
}

func (t *tx) Version() uint64 { return t.version }

// fail notes a failure of the KV, which fails the transaction, and
// returns it.
func (t *tx) fail(err error) error {
	if t.err == nil {
		t.err = err
	}
	return err
}

func (t *tx) bucket(name string) (KVBucket, error) {
	if name == bucketCells && t.cells != nil {
		return t.cells, nil
	}
	if b, ok := t.buckets[name]; ok {
		return b, nil
	}
	b, err := t.kv.Bucket(name)
	if err != nil {
		return nil, t.fail(fmt.Errorf("bucket %q: %w", name, err))
	}
	if t.buckets == nil {
		t.buckets = map[string]KVBucket{}
	}
	t.buckets[name] = b
	if name == bucketCells {
		t.cells = b
	}
	return b, nil
}

// write returns a bucket to write to, or ErrReadOnly.
func (t *tx) write(name string) (KVBucket, error) {
	if !t.writable {
		return nil, ErrReadOnly
	}
	t.dirty = true
	return t.bucket(name)
}

// get reads key in the bucket name: nil for a missing key.
func (t *tx) get(name, key string) ([]byte, error) {
	b, err := t.bucket(name)
	if err != nil {
		return nil, err
	}
	v, err := b.Get(t.ctx, key)
	if err != nil {
		return nil, t.fail(fmt.Errorf("read %s %q: %w", name, key, err))
	}
	return v, nil
}

// scan scans the keys in [from, to) of the bucket name.
func (t *tx) scan(name, from, to string, fn func(k string, v []byte) bool) error {
	b, err := t.bucket(name)
	if err != nil {
		return err
	}
	if err := b.Scan(t.ctx, from, to, fn); err != nil {
		return t.fail(fmt.Errorf("scan %s: %w", name, err))
	}
	return nil
}

// put writes key in the bucket name.
func (t *tx) put(name, key string, v []byte) error {
	b, err := t.write(name)
	if err != nil {
		return err
	}
	if err := b.Put(key, v); err != nil {
		return t.fail(fmt.Errorf("write %s %q: %w", name, key, err))
	}
	return nil
}

// del deletes key in the bucket name.
func (t *tx) del(name, key string) error {
	b, err := t.write(name)
	if err != nil {
		return err
	}
	if err := b.Delete(key); err != nil {
		return t.fail(fmt.Errorf("delete %s %q: %w", name, key, err))
	}
	return nil
}

func (t *tx) load(addr Address) (key string, rec record, found bool, err error) {
	if err := addr.Valid(); err != nil {
		return "", rec, false, err
	}
	key = addr.String()
	rec, found, err = t.loadKey(key, nil)
	return key, rec, found, err
}

// loadKey reads the record under a valid cell key, through the kv's hint
// of the key if given.
func (t *tx) loadKey(key string, hint *kvHint) (rec record, found bool, err error) {
	b, err := t.bucket(bucketCells)
	if err != nil {
		return rec, false, err
	}
	var raw []byte
	hinted := false
	if hb, ok := b.(hintedBucket); ok && hint != nil {
		raw, hinted = hb.getHinted(key, hint), true
		if hint.rec.hit(raw) { // the record this hint last saw: no decode
			return hint.rec.rec, true, nil
		}
	} else if raw, err = b.Get(t.ctx, key); err != nil {
		return rec, false, t.fail(fmt.Errorf("read cell %s: %w", key, err))
	}
	if raw == nil {
		return rec, false, nil
	}
	rec, err = decodeRecord(raw)
	if err != nil {
		return rec, false, fmt.Errorf("cell %s: %w", key, err)
	}
	if hinted {
		hint.rec = recCache{enc: raw, rec: rec}
	}
	return rec, true, nil
}

func (t *tx) Get(addr Address) (Cell, error) {
	_, rec, found, err := t.load(addr)
	if err != nil {
		return Cell{}, err
	}
	if !found {
		return Cell{}, fmt.Errorf("cell %s: %w", addr, ErrNotFound)
	}
	return rec.cell(addr), nil
}

func (t *tx) List(prefix string) ([]Cell, error) {
	var out []Cell
	var err error
	serr := t.scan(bucketCells, prefix, prefixEnd(prefix), func(k string, v []byte) bool {
		if !HasPrefix(k, prefix) { // "s/p" scans "s/pa/…" too
			return true
		}
		var a Address
		if a, err = Parse(k); err != nil {
			return false
		}
		var r record
		if r, err = decodeRecord(v); err != nil {
			err = fmt.Errorf("cell %s: %w", k, err)
			return false
		}
		out = append(out, r.cell(a))
		return true
	})
	if serr != nil {
		return nil, serr
	}
	return out, err
}

// putCell stores rec and records the change. It returns the record's
// value as stored (within the encoded record, which nothing changes).
func (t *tx) putCell(key string, rec *record, kind byte, ev *Event) ([]byte, error) {
	return t.putCellHinted(key, nil, rec, kind, ev)
}

// putCellHinted is putCell through a Ref's hint (nil for none), which
// then caches the record (see recCache).
func (t *tx) putCellHinted(key string, hint *kvHint, rec *record, kind byte, ev *Event) ([]byte, error) {
	again := rec.version == t.version // changed earlier in this transaction
	rec.version, rec.changed = t.version, t.now
	enc := rec.encode()
	if err := t.put(bucketCells, key, enc); err != nil {
		return nil, err
	}
	t.record(logChange{kind: kind, key: key, rec: enc, event: ev}, again)
	stored := enc[len(enc)-len(rec.value):]
	if hint != nil {
		c := &hint.rec
		c.enc, c.rec = enc, *rec
		c.rec.err, c.rec.value = enc[len(enc)-len(rec.value)-len(rec.err):len(enc)-len(rec.value)], stored
	}
	return stored, nil
}

// record adds a change to the commit's log entry. A cell changed again
// replaces its earlier change (events always append); the index for that
// is built on the first repeat, so the common case needs no map.
func (t *tx) record(c logChange, again bool) {
	if again && c.kind == changeCell {
		if t.index == nil {
			t.index = make(map[string]int, len(t.changes))
			for i, x := range t.changes {
				if x.kind == changeCell {
					t.index[x.key] = i
				}
			}
		}
		if i, ok := t.index[c.key]; ok {
			t.changes[i] = c
			return
		}
	}
	if t.index != nil && c.kind == changeCell {
		t.index[c.key] = len(t.changes)
	}
	t.changes = append(t.changes, c)
}

func (t *tx) Declare(addr Address, spec Spec) error {
	key, rec, found, err := t.load(addr)
	if err != nil {
		return err
	}
	if !t.writable {
		return ErrReadOnly
	}
	if found && (rec.flags&flagStream != 0) != spec.Stream {
		kinds := map[bool]string{true: "a stream", false: "a value cell"}
		return fmt.Errorf("declare %s as %s: it is %s", key, kinds[spec.Stream], kinds[!spec.Stream])
	}
	var flags byte
	if spec.Stream {
		flags |= flagStream
	}
	if len(spec.Schema) > 0 {
		if !json.Valid(spec.Schema) {
			return fmt.Errorf("declare %s: its schema is not valid JSON", key)
		}
		flags |= flagHasSchema
		// Unchanged, it is not written again: a pattern loaded over a
		// settled store then commits nothing (no sync).
		if cur, err := t.get(bucketSchemas, key); err != nil {
			return err
		} else if !bytes.Equal(cur, spec.Schema) {
			if err := t.put(bucketSchemas, key, append([]byte(nil), spec.Schema...)); err != nil {
				return err
			}
		}
	} else if found && rec.flags&flagHasSchema != 0 {
		if err := t.del(bucketSchemas, key); err != nil {
			return err
		}
	}
	if found {
		if rec.flags == flags {
			return nil
		}
		// A schema flag change rewrites the record in place: no new version.
		rec.flags = flags
		return t.put(bucketCells, key, rec.encode())
	}
	rec = record{flags: flags, value: []byte("null")}
	_, err = t.putCell(key, &rec, changeCell, nil)
	return err
}

func (t *tx) Spec(addr Address) (Spec, error) {
	key, rec, found, err := t.load(addr)
	if err != nil || !found {
		return Spec{}, err
	}
	spec := Spec{Stream: rec.flags&flagStream != 0}
	if rec.flags&flagHasSchema != 0 {
		schema, err := t.get(bucketSchemas, key)
		if err != nil {
			return Spec{}, err
		}
		spec.Schema = append(json.RawMessage(nil), schema...)
	}
	return spec, nil
}

func (t *tx) Set(addr Address, value json.RawMessage) (bool, error) {
	if !t.writable {
		return false, ErrReadOnly
	}
	if err := addr.Valid(); err != nil {
		return false, err
	}
	_, changed, err := t.set(addr, addr.String(), nil, value)
	return changed, err
}

func (t *tx) SetRef(r *Ref, value json.RawMessage) (bool, error) {
	_, changed, err := t.set(r.addr, r.key, &r.hint, value)
	return changed, err
}

func (t *tx) SetRefStored(r *Ref, value json.RawMessage) (json.RawMessage, bool, error) {
	return t.set(r.addr, r.key, &r.hint, value)
}

// set writes the cell's record with value (copied into it) and returns
// the value as stored, when it changed the cell.
func (t *tx) set(addr Address, key string, hint *kvHint, value json.RawMessage) ([]byte, bool, error) {
	if !t.writable {
		return nil, false, ErrReadOnly
	}
	rec, found, err := t.loadKey(key, hint)
	if err != nil {
		return nil, false, err
	}
	if found && rec.flags&flagStream != 0 {
		return nil, false, fmt.Errorf("set %s: it is a stream: send events to it instead", key)
	}
	v, err := compactValue(value)
	if err != nil {
		return nil, false, fmt.Errorf("set %s: %w", key, err)
	}
	if found && len(rec.err) == 0 && bytes.Equal(rec.value, v) {
		return nil, false, nil
	}
	if found && rec.flags&flagHasSchema != 0 {
		schema, err := t.get(bucketSchemas, key)
		if err != nil {
			return nil, false, err
		}
		if err := jsonschema.Validate(schema, v); err != nil {
			return nil, false, &SchemaError{Addr: addr, Err: err}
		}
	}
	rec.value, rec.err = v, nil
	stored, err := t.putCellHinted(key, hint, &rec, changeCell, nil)
	return stored, true, err
}

// compactValue validates a JSON value and returns it compact. A scalar
// (no array or object, so no inner whitespace outside strings) with no
// space around it is compact already (what the runtime writes for most
// computes): it is
// returned as it is, without the copy json.Compact makes.
func compactValue(value json.RawMessage) ([]byte, error) {
	if plainInt(value) {
		return value, nil
	}
	if n := len(value); n > 0 && !bytes.ContainsAny(value[:1], " \t\r\n[{") && !bytes.ContainsAny(value[n-1:], " \t\r\n") && json.Valid(value) {
		return value, nil
	}
	var buf bytes.Buffer
	buf.Grow(len(value))
	if err := json.Compact(&buf, value); err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	if buf.Len() == 0 {
		return nil, errors.New("empty value (write null for none)")
	}
	return buf.Bytes(), nil
}

// plainInt reports whether b is a JSON integer with no sign but '-' and
// no leading zero, so valid and compact: the value most computes write,
// checked without json.Valid's scanner.
func plainInt(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 1 && b[0] == '0' {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (t *tx) SetError(addr Address, msg string) (bool, error) {
	if !t.writable {
		return false, ErrReadOnly
	}
	key, rec, found, err := t.load(addr)
	if err != nil {
		return false, err
	}
	if found && string(rec.err) == msg {
		return false, nil
	}
	if !found {
		if msg == "" {
			return false, nil
		}
		rec.value = []byte("null")
	}
	rec.err = []byte(msg)
	_, err = t.putCell(key, &rec, changeCell, nil)
	return true, err
}

func (t *tx) Delete(addr Address) error {
	key, _, found, err := t.load(addr)
	if err != nil {
		return err
	}
	if !t.writable {
		return ErrReadOnly
	}
	if !found {
		return nil
	}
	for _, name := range []string{bucketCells, bucketSchemas, bucketAcks} {
		if err := t.del(name, key); err != nil {
			return err
		}
	}
	var keys []string
	from, to := eventRange(key)
	if err := t.scan(bucketEvents, from, to, func(k string, _ []byte) bool {
		keys = append(keys, k)
		return true
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := t.del(bucketEvents, k); err != nil {
			return err
		}
	}
	if t.index != nil {
		delete(t.index, key)
	}
	t.record(logChange{kind: changeDeleted, key: key}, false)
	return nil
}

func eventKey(addr string, id uint64) string {
	k := make([]byte, 0, len(addr)+9)
	k = append(k, addr...)
	k = append(k, 0)
	return string(append(k, u64(id)...))
}

// eventRange is the range of the keys of the events of the stream at addr.
func eventRange(addr string) (from, to string) { return addr + "\x00", addr + "\x01" }

func (t *tx) stream(addr Address, verb string) (string, record, error) {
	key, rec, found, err := t.load(addr)
	if err != nil {
		return key, rec, err
	}
	if !found {
		return key, rec, fmt.Errorf("%s %s: no such stream: %w", verb, key, ErrNotFound)
	}
	if rec.flags&flagStream == 0 {
		return key, rec, fmt.Errorf("%s %s: it is a value cell, not a stream", verb, key)
	}
	return key, rec, nil
}

func (t *tx) Send(addr Address, payload json.RawMessage) (Event, error) {
	if !t.writable {
		return Event{}, ErrReadOnly
	}
	key, rec, err := t.stream(addr, "send to")
	if err != nil {
		return Event{}, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, payload); err != nil || buf.Len() == 0 {
		return Event{}, fmt.Errorf("send to %s: payload is not JSON: %v", key, err)
	}
	last, err := t.get(bucketInfo, keyEvent)
	if err != nil {
		return Event{}, err
	}
	ev := Event{ID: readU64(last) + 1, Payload: buf.Bytes(), Sent: time.Unix(0, t.now)}
	if err := t.put(bucketInfo, keyEvent, u64(ev.ID)); err != nil {
		return Event{}, err
	}
	if err := t.put(bucketEvents, eventKey(key, ev.ID), append(binaryVarint(t.now), ev.Payload...)); err != nil {
		return Event{}, err
	}
	_, err = t.putCell(key, &rec, changeEvent, &ev)
	return ev, err
}

func (t *tx) Events(addr Address) ([]Event, error) {
	key, _, err := t.stream(addr, "read events of")
	if err != nil {
		return nil, err
	}
	from, to := eventRange(key)
	var out []Event
	serr := t.scan(bucketEvents, from, to, func(k string, v []byte) bool {
		sent, n := binaryUvarintTime(v)
		if n <= 0 {
			err = fmt.Errorf("event on %s: %w", key, errCorrupt)
			return false
		}
		out = append(out, Event{ID: readU64([]byte(k[len(from):])), Sent: sent, Payload: append([]byte(nil), v[n:]...)})
		return true
	})
	if serr != nil {
		return nil, serr
	}
	return out, err
}

func (t *tx) Ack(addr Address, id uint64) error {
	key, _, err := t.stream(addr, "ack on")
	if err != nil {
		return err
	}
	if !t.writable {
		return ErrReadOnly
	}
	acked, err := t.get(bucketAcks, key)
	if err != nil {
		return err
	}
	if last := readU64(acked); id <= last {
		return fmt.Errorf("ack event %d on %s (handled up to %d): %w", id, key, last, ErrHandled)
	}
	var done []string
	from, to := eventRange(key)
	if err := t.scan(bucketEvents, from, to, func(k string, _ []byte) bool {
		if readU64([]byte(k[len(from):])) > id {
			return false
		}
		done = append(done, k)
		return true
	}); err != nil {
		return err
	}
	for _, k := range done {
		if err := t.del(bucketEvents, k); err != nil {
			return err
		}
	}
	return t.put(bucketAcks, key, u64(id))
}

func (t *tx) Meta(name string) Bucket { return &metaBucket{t: t, name: metaPrefix + name} }

// writeLog appends the commit's log entry and drops the oldest entries
// beyond the limits: more than logLimit commits, or more than logBytes of
// entries (the newest entry always stays).
func (t *tx) writeLog() error {
	entry := encodeLog(t.now, t.changes)
	if err := t.put(bucketLog, string(u64(t.version)), entry); err != nil {
		return err
	}
	b, err := t.get(bucketInfo, keyLogStart)
	if err != nil {
		return err
	}
	start := readU64(b)
	if start == 0 {
		start = 1
	}
	var size uint64
	if b, err := t.get(bucketInfo, keyLogBytes); err != nil {
		return err
	} else if b != nil {
		size = readU64(b) + uint64(len(entry))
	} else if err := t.scan(bucketLog, "", "", func(_ string, v []byte) bool { size += uint64(len(v)); return true }); err != nil {
		return err // a store from before the key: the log is counted once
	}
	v := start
	for ; v < t.version && (v+t.db.logLimit <= t.version || size > t.db.logBytes); v++ {
		old, err := t.get(bucketLog, string(u64(v)))
		if err != nil {
			return err
		}
		size -= min(uint64(len(old)), size)
		if err := t.del(bucketLog, string(u64(v))); err != nil {
			return err
		}
	}
	if v != start {
		if err := t.put(bucketInfo, keyLogStart, u64(v)); err != nil {
			return err
		}
	}
	return t.put(bucketInfo, keyLogBytes, u64(size))
}

type metaBucket struct {
	t    *tx
	name string
}

// Get fails the transaction when the KV fails: it has no error to say so.
func (m *metaBucket) Get(key string) ([]byte, bool) {
	v, err := m.t.get(m.name, key)
	if err != nil || v == nil {
		return nil, false
	}
	return append([]byte{}, v...), true
}

func (m *metaBucket) Put(key string, value []byte) error {
	if !m.t.writable {
		return ErrReadOnly
	}
	if key == "" {
		return errors.New("meta put: empty key")
	}
	return m.t.put(m.name, key, append([]byte{}, value...))
}

func (m *metaBucket) Delete(key string) error {
	if key == "" {
		if !m.t.writable {
			return ErrReadOnly
		}
		return nil // no such key
	}
	return m.t.del(m.name, key)
}

func (m *metaBucket) ForEach(prefix string, fn func(key string, value []byte) error) error {
	var ferr error
	if err := m.t.scan(m.name, prefix, prefixEnd(prefix), func(k string, v []byte) bool {
		ferr = fn(k, append([]byte{}, v...))
		return ferr == nil
	}); err != nil {
		return err
	}
	return ferr
}
