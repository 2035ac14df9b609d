package cells

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// db is the Store over a kv.
type db struct {
	kv       kv
	logLimit uint64
	logBytes uint64

	mu      sync.Mutex // serializes Update
	version atomic.Uint64
	closed  atomic.Bool
	done    chan struct{}

	watchMu  sync.Mutex
	watchers map[*watcher]struct{}

	// spare is the change list's array, kept (emptied) for the next
	// Update, as memKV keeps its undo log's. Guarded by mu.
	spare []logChange
}

func open(k kv, opts Options) (*db, error) {
	s := &db{kv: k, logLimit: defaultLogLimit, logBytes: defaultLogBytes, done: make(chan struct{}), watchers: map[*watcher]struct{}{}}
	if opts.LogLimit > 0 {
		s.logLimit = uint64(opts.LogLimit)
	}
	if opts.LogBytes > 0 {
		s.logBytes = uint64(opts.LogBytes)
	}
	t, err := k.begin(true)
	if err != nil {
		return nil, err
	}
	defer t.rollback()
	info, err := t.bucket(bucketInfo)
	if err != nil {
		return nil, err
	}
	s.version.Store(readU64(info.get(keyVersion)))
	switch l := info.get(keyLayout); {
	case l == nil:
		for _, name := range []string{bucketCells, bucketLog} {
			b, err := t.bucket(name)
			if err != nil {
				return nil, err
			}
			nonEmpty := false
			b.scan(nil, func(_, _ []byte) bool { nonEmpty = true; return false })
			if nonEmpty {
				return nil, fmt.Errorf("not a cellbox store: it has cells but no layout version")
			}
		}
		if err := info.put(keyLayout, []byte(strconv.Itoa(layoutVersion))); err != nil {
			return nil, err
		}
		if err := info.put(keyLogStart, u64(1)); err != nil {
			return nil, err
		}
		// Only a new store is written, so only its open commits: a store
		// made before opens without a commit (and its sync), in
		// microseconds for a run with nothing to do.
		if err := t.commit(); err != nil {
			return nil, err
		}
	default:
		v, err := strconv.Atoi(string(l))
		if err != nil {
			return nil, fmt.Errorf("not a cellbox store: bad layout version %q", l)
		}
		if v > layoutVersion {
			return nil, fmt.Errorf("the store has layout version %d, newer than this cellbox understands (%d): use a newer cellbox", v, layoutVersion)
		}
	}
	return s, nil
}

func (s *db) Version() uint64 { return s.version.Load() }

func (s *db) Get(addr Address) (Cell, error) {
	var c Cell
	err := s.View(func(tx Tx) error {
		var err error
		c, err = tx.Get(addr)
		return err
	})
	return c, err
}

func (s *db) View(fn func(Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	k, err := s.kv.begin(false)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer k.rollback()
	t := &tx{db: s, kv: k}
	info, err := k.bucket(bucketInfo)
	if err != nil {
		return err
	}
	t.version = readU64(info.get(keyVersion))
	return fn(t)
}

func (s *db) Update(fn func(Tx) error) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	k, err := s.kv.begin(true)
	if err != nil {
		return fmt.Errorf("begin write: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			k.rollback()
		}
	}()
	t := &tx{db: s, kv: k, writable: true, version: s.version.Load() + 1, now: time.Now().UnixNano(), changes: s.spare}
	defer func() {
		clear(t.changes) // let the records be collected
		s.spare = t.changes[:0]
	}()
	if err := fn(t); err != nil {
		return err
	}
	if !t.dirty {
		// Nothing written: no commit, whose sync would cost milliseconds
		// (a run with nothing to do does several such transactions).
		return nil
	}
	if len(t.changes) > 0 {
		if err := t.writeLog(); err != nil {
			return fmt.Errorf("write change log: %w", err)
		}
	}
	if err := k.commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed = true
	if len(t.changes) > 0 {
		s.version.Store(t.version)
		s.notify()
	}
	return nil
}

func (s *db) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	close(s.done)
	return s.kv.close()
}

// tx implements Tx.
type tx struct {
	db       *db
	kv       kvTx
	writable bool
	dirty    bool // something was written (through write)
	version  uint64
	now      int64

	buckets map[string]kvBucket
	changes []logChange
	index   map[string]int // cell changes by address
}

func (t *tx) Version() uint64 { return t.version }

func (t *tx) bucket(name string) (kvBucket, error) {
	if b, ok := t.buckets[name]; ok {
		return b, nil
	}
	b, err := t.kv.bucket(name)
	if err != nil {
		return nil, err
	}
	if t.buckets == nil {
		t.buckets = map[string]kvBucket{}
	}
	t.buckets[name] = b
	return b, nil
}

// write returns a bucket to write to, or ErrReadOnly.
func (t *tx) write(name string) (kvBucket, error) {
	if !t.writable {
		return nil, ErrReadOnly
	}
	t.dirty = true
	return t.bucket(name)
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
	if hb, ok := b.(hintedBucket); ok && hint != nil {
		raw = hb.getHinted(key, hint)
	} else {
		raw = b.get(key)
	}
	if raw == nil {
		return rec, false, nil
	}
	rec, err = decodeRecord(raw)
	if err != nil {
		return rec, false, fmt.Errorf("cell %s: %w", key, err)
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
	b, err := t.bucket(bucketCells)
	if err != nil {
		return nil, err
	}
	var out []Cell
	b.scan([]byte(prefix), func(k, v []byte) bool {
		if !bytes.HasPrefix(k, []byte(prefix)) {
			return false
		}
		if !HasPrefix(string(k), prefix) { // "s/p" scans "s/pa/…" too
			return true
		}
		var a Address
		if a, err = Parse(string(k)); err != nil {
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
	return out, err
}

// put stores rec and records the change.
func (t *tx) put(key string, rec *record, kind byte, ev *Event) error {
	b, err := t.write(bucketCells)
	if err != nil {
		return err
	}
	again := rec.version == t.version // changed earlier in this transaction
	rec.version, rec.changed = t.version, t.now
	enc := rec.encode()
	if err := b.put(key, enc); err != nil {
		return fmt.Errorf("write cell %s: %w", key, err)
	}
	t.record(logChange{kind: kind, key: key, rec: enc, event: ev}, again)
	return nil
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
		if cur, err := t.bucket(bucketSchemas); err != nil {
			return err
		} else if !bytes.Equal(cur.get(key), spec.Schema) {
			schemas, err := t.write(bucketSchemas)
			if err != nil {
				return err
			}
			if err := schemas.put(key, append([]byte(nil), spec.Schema...)); err != nil {
				return err
			}
		}
	} else if found && rec.flags&flagHasSchema != 0 {
		schemas, err := t.write(bucketSchemas)
		if err != nil {
			return err
		}
		if err := schemas.del([]byte(key)); err != nil {
			return err
		}
	}
	if found {
		if rec.flags == flags {
			return nil
		}
		// A schema flag change rewrites the record in place: no new version.
		rec.flags = flags
		b, _ := t.write(bucketCells)
		return b.put(key, rec.encode())
	}
	rec = record{flags: flags, value: []byte("null")}
	return t.put(key, &rec, changeCell, nil)
}

func (t *tx) Spec(addr Address) (Spec, error) {
	key, rec, found, err := t.load(addr)
	if err != nil || !found {
		return Spec{}, err
	}
	spec := Spec{Stream: rec.flags&flagStream != 0}
	if rec.flags&flagHasSchema != 0 {
		b, err := t.bucket(bucketSchemas)
		if err != nil {
			return spec, err
		}
		spec.Schema = append(json.RawMessage(nil), b.get(key)...)
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
	return t.set(addr, addr.String(), nil, value)
}

func (t *tx) SetRef(r *Ref, value json.RawMessage) (bool, error) {
	return t.set(r.addr, r.key, &r.hint, value)
}

func (t *tx) set(addr Address, key string, hint *kvHint, value json.RawMessage) (bool, error) {
	if !t.writable {
		return false, ErrReadOnly
	}
	rec, found, err := t.loadKey(key, hint)
	if err != nil {
		return false, err
	}
	if found && rec.flags&flagStream != 0 {
		return false, fmt.Errorf("set %s: it is a stream: send events to it instead", key)
	}
	v, err := compactValue(value)
	if err != nil {
		return false, fmt.Errorf("set %s: %w", key, err)
	}
	if found && len(rec.err) == 0 && bytes.Equal(rec.value, v) {
		return false, nil
	}
	if found && rec.flags&flagHasSchema != 0 {
		b, err := t.bucket(bucketSchemas)
		if err != nil {
			return false, err
		}
		if err := jsonschema.Validate(b.get(key), v); err != nil {
			return false, &SchemaError{Addr: addr, Err: err}
		}
	}
	rec.value, rec.err = v, nil
	return true, t.put(key, &rec, changeCell, nil)
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
	return true, t.put(key, &rec, changeCell, nil)
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
		b, err := t.write(name)
		if err != nil {
			return err
		}
		if err := b.del([]byte(key)); err != nil {
			return err
		}
	}
	evs, err := t.write(bucketEvents)
	if err != nil {
		return err
	}
	var keys [][]byte
	evs.scan(eventKey(key, 0), func(k, _ []byte) bool {
		if !bytes.HasPrefix(k, eventKey(key, 0)[:len(key)+1]) {
			return false
		}
		keys = append(keys, append([]byte(nil), k...))
		return true
	})
	for _, k := range keys {
		if err := evs.del(k); err != nil {
			return err
		}
	}
	if t.index != nil {
		delete(t.index, key)
	}
	t.record(logChange{kind: changeDeleted, key: key}, false)
	return nil
}

func eventKey(addr string, id uint64) []byte {
	k := make([]byte, 0, len(addr)+9)
	k = append(k, addr...)
	k = append(k, 0)
	return append(k, u64(id)...)
}

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
	info, err := t.write(bucketInfo)
	if err != nil {
		return Event{}, err
	}
	ev := Event{ID: readU64(info.get(keyEvent)) + 1, Payload: buf.Bytes(), Sent: time.Unix(0, t.now)}
	if err := info.put(keyEvent, u64(ev.ID)); err != nil {
		return Event{}, err
	}
	evs, err := t.write(bucketEvents)
	if err != nil {
		return Event{}, err
	}
	if err := evs.put(string(eventKey(key, ev.ID)), append(binaryVarint(t.now), ev.Payload...)); err != nil {
		return Event{}, err
	}
	return ev, t.put(key, &rec, changeEvent, &ev)
}

func (t *tx) Events(addr Address) ([]Event, error) {
	key, _, err := t.stream(addr, "read events of")
	if err != nil {
		return nil, err
	}
	b, err := t.bucket(bucketEvents)
	if err != nil {
		return nil, err
	}
	prefix := eventKey(key, 0)[:len(key)+1]
	var out []Event
	b.scan(prefix, func(k, v []byte) bool {
		if !bytes.HasPrefix(k, prefix) {
			return false
		}
		sent, n := binaryUvarintTime(v)
		if n <= 0 {
			err = fmt.Errorf("event on %s: %w", key, errCorrupt)
			return false
		}
		out = append(out, Event{ID: readU64(k[len(prefix):]), Sent: sent, Payload: append([]byte(nil), v[n:]...)})
		return true
	})
	return out, err
}

func (t *tx) Ack(addr Address, id uint64) error {
	key, _, err := t.stream(addr, "ack on")
	if err != nil {
		return err
	}
	acks, err := t.write(bucketAcks)
	if err != nil {
		return err
	}
	if last := readU64(acks.get(key)); id <= last {
		return fmt.Errorf("ack event %d on %s (handled up to %d): %w", id, key, last, ErrHandled)
	}
	evs, err := t.write(bucketEvents)
	if err != nil {
		return err
	}
	prefix := eventKey(key, 0)[:len(key)+1]
	var done [][]byte
	evs.scan(prefix, func(k, _ []byte) bool {
		if !bytes.HasPrefix(k, prefix) || readU64(k[len(prefix):]) > id {
			return false
		}
		done = append(done, append([]byte(nil), k...))
		return true
	})
	for _, k := range done {
		if err := evs.del(k); err != nil {
			return err
		}
	}
	return acks.put(key, u64(id))
}

func (t *tx) Meta(name string) Bucket { return &metaBucket{t: t, name: metaPrefix + name} }

// writeLog appends the commit's log entry and drops the oldest entries
// beyond the limits: more than logLimit commits, or more than logBytes of
// entries (the newest entry always stays).
func (t *tx) writeLog() error {
	info, err := t.write(bucketInfo)
	if err != nil {
		return err
	}
	lg, err := t.write(bucketLog)
	if err != nil {
		return err
	}
	entry := encodeLog(t.now, t.changes)
	if err := lg.put(string(u64(t.version)), entry); err != nil {
		return err
	}
	if err := info.put(keyVersion, u64(t.version)); err != nil {
		return err
	}
	start := readU64(info.get(keyLogStart))
	if start == 0 {
		start = 1
	}
	var size uint64
	if b := info.get(keyLogBytes); b != nil {
		size = readU64(b) + uint64(len(entry))
	} else { // a store from before the key: count the log once
		lg.scan(nil, func(_, v []byte) bool { size += uint64(len(v)); return true })
	}
	v := start
	for ; v < t.version && (v+t.db.logLimit <= t.version || size > t.db.logBytes); v++ {
		size -= min(uint64(len(lg.get(string(u64(v))))), size)
		if err := lg.del(u64(v)); err != nil {
			return err
		}
	}
	if v != start {
		if err := info.put(keyLogStart, u64(v)); err != nil {
			return err
		}
	}
	return info.put(keyLogBytes, u64(size))
}

type metaBucket struct {
	t    *tx
	name string
}

func (m *metaBucket) Get(key string) ([]byte, bool) {
	b, err := m.t.bucket(m.name)
	if err != nil {
		return nil, false
	}
	v := b.get(key)
	if v == nil {
		return nil, false
	}
	return append([]byte{}, v...), true
}

func (m *metaBucket) Put(key string, value []byte) error {
	b, err := m.t.write(m.name)
	if err != nil {
		return err
	}
	if key == "" {
		return errors.New("meta put: empty key")
	}
	return b.put(key, append([]byte{}, value...))
}

func (m *metaBucket) Delete(key string) error {
	b, err := m.t.write(m.name)
	if err != nil {
		return err
	}
	return b.del([]byte(key))
}

func (m *metaBucket) ForEach(prefix string, fn func(key string, value []byte) error) error {
	b, err := m.t.bucket(m.name)
	if err != nil {
		return err
	}
	var ferr error
	b.scan([]byte(prefix), func(k, v []byte) bool {
		if !strings.HasPrefix(string(k), prefix) {
			return false
		}
		ferr = fn(string(k), append([]byte{}, v...))
		return ferr == nil
	})
	return ferr
}
