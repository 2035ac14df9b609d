package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/cellbox/cellbox/cells"
)

// DefaultMemoLimit caps the memo cache's total size when Options.MemoLimit
// is 0.
const DefaultMemoLimit = 256 << 20

// The memo cache is capped by the total size of its results; the least
// recently used are evicted first. Besides the results (bucketMemo: key ->
// result) it keeps, in the same transaction:
//
//	runtime.memo.lru    key -> use sequence number (8 bytes BE) · size (8 bytes BE)
//	runtime.memo.order  use sequence number (16 hex digits) -> key, oldest first
//	runtime.memo.meta   "seq" -> the last sequence number, "total" -> the size of all results
//
// A hit moves the entry to the end of the order. A store written before
// the cap existed holds results without lru records: the first put indexes
// them (oldest first, in key order).
const (
	bucketMemoLRU   = "runtime.memo.lru"
	bucketMemoOrder = "runtime.memo.order"
	bucketMemoMeta  = "runtime.memo.meta"
)

// memo is the memo cache inside one transaction.
type memo struct {
	tx    cells.Tx
	limit int64 // > 0
}

func (r *Runtime) memo(tx cells.Tx) memo { return memo{tx: tx, limit: r.opts.MemoLimit} }

// get returns a cached result and marks it used.
func (m memo) get(key string) ([]byte, bool, error) {
	res, ok := m.tx.Meta(bucketMemo).Get(key)
	if !ok {
		return nil, false, nil
	}
	if rec, ok := m.tx.Meta(bucketMemoLRU).Get(key); ok && len(rec) == 16 {
		if err := m.tx.Meta(bucketMemoOrder).Delete(orderKey(binary.BigEndian.Uint64(rec))); err != nil {
			return nil, false, err
		}
		if err := m.record(key, int64(binary.BigEndian.Uint64(rec[8:]))); err != nil {
			return nil, false, err
		}
	}
	return res, true, nil
}

// put stores a result and evicts the least recently used results while
// the total is over the limit. A result larger than the limit alone is not
// stored.
func (m memo) put(key string, res []byte) error {
	size := int64(len(key) + len(res))
	if size > m.limit {
		return nil
	}
	total, err := m.index()
	if err != nil {
		return err
	}
	if rec, ok := m.tx.Meta(bucketMemoLRU).Get(key); ok && len(rec) == 16 {
		total -= int64(binary.BigEndian.Uint64(rec[8:]))
		if err := m.tx.Meta(bucketMemoOrder).Delete(orderKey(binary.BigEndian.Uint64(rec))); err != nil {
			return err
		}
	}
	if err := m.tx.Meta(bucketMemo).Put(key, res); err != nil {
		return err
	}
	if err := m.record(key, size); err != nil {
		return err
	}
	total += size
	if total > m.limit {
		if total, err = m.evict(total); err != nil {
			return err
		}
	}
	return m.tx.Meta(bucketMemoMeta).Put("total", strconv.AppendInt(nil, total, 10))
}

// record gives key the next sequence number.
func (m memo) record(key string, size int64) error {
	meta := m.tx.Meta(bucketMemoMeta)
	var seq uint64
	if b, ok := meta.Get("seq"); ok {
		seq, _ = strconv.ParseUint(string(b), 10, 64)
	}
	seq++
	if err := meta.Put("seq", strconv.AppendUint(nil, seq, 10)); err != nil {
		return err
	}
	rec := binary.BigEndian.AppendUint64(nil, seq)
	rec = binary.BigEndian.AppendUint64(rec, uint64(size))
	if err := m.tx.Meta(bucketMemoLRU).Put(key, rec); err != nil {
		return err
	}
	return m.tx.Meta(bucketMemoOrder).Put(orderKey(seq), []byte(key))
}

var errStop = errors.New("stop")

// evict removes the least recently used results until total is at most
// the limit, and returns the new total.
func (m memo) evict(total int64) (int64, error) {
	var victims []string
	var orders []string
	err := m.tx.Meta(bucketMemoOrder).ForEach("", func(ok string, key []byte) error {
		if total <= m.limit {
			return errStop
		}
		rec, found := m.tx.Meta(bucketMemoLRU).Get(string(key))
		if found && len(rec) == 16 {
			total -= int64(binary.BigEndian.Uint64(rec[8:]))
		}
		victims, orders = append(victims, string(key)), append(orders, ok)
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, err
	}
	for i, k := range victims {
		for _, del := range []error{
			m.tx.Meta(bucketMemo).Delete(k),
			m.tx.Meta(bucketMemoLRU).Delete(k),
			m.tx.Meta(bucketMemoOrder).Delete(orders[i]),
		} {
			if del != nil {
				return 0, fmt.Errorf("evict memo entry: %w", del)
			}
		}
	}
	return total, nil
}

// index returns the total size of the cached results, first indexing the
// results of a store written before the cap (they have no lru record).
func (m memo) index() (int64, error) {
	if b, ok := m.tx.Meta(bucketMemoMeta).Get("total"); ok {
		return strconv.ParseInt(string(b), 10, 64)
	}
	var total int64
	err := m.tx.Meta(bucketMemo).ForEach("", func(key string, res []byte) error {
		size := int64(len(key) + len(res))
		total += size
		return m.record(key, size)
	})
	return total, err
}

func orderKey(seq uint64) string { return fmt.Sprintf("%016x", seq) }
