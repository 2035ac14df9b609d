package cells

import (
	"encoding/binary"
	"errors"
	"time"
)

const (
	flagStream    = 1
	flagHasSchema = 2
)

// record is a decoded cell record; its slices alias the encoded bytes.
type record struct {
	flags   byte
	version uint64
	changed int64
	err     []byte
	value   []byte
}

var errCorrupt = errors.New("corrupt record")

func (r *record) encode() []byte {
	// The exact size (a smaller allocation than a bound of 3 varints of
	// 10 bytes: one per cell written).
	b := make([]byte, 0, 1+uvarintLen(r.version)+varintLen(r.changed)+uvarintLen(uint64(len(r.err)))+len(r.err)+len(r.value))
	b = append(b, r.flags)
	b = binary.AppendUvarint(b, r.version)
	b = binary.AppendVarint(b, r.changed)
	b = binary.AppendUvarint(b, uint64(len(r.err)))
	b = append(b, r.err...)
	return append(b, r.value...)
}

func decodeRecord(b []byte) (record, error) {
	var r record
	if len(b) < 1 {
		return r, errCorrupt
	}
	r.flags, b = b[0], b[1:]
	var n int
	if r.version, n = binary.Uvarint(b); n <= 0 {
		return r, errCorrupt
	}
	b = b[n:]
	if r.changed, n = binary.Varint(b); n <= 0 {
		return r, errCorrupt
	}
	b = b[n:]
	el, n := binary.Uvarint(b)
	if n <= 0 || uint64(len(b)-n) < el {
		return r, errCorrupt
	}
	r.err, r.value = b[n:n+int(el)], b[n+int(el):]
	return r, nil
}

// cell returns the record as a Cell, copying its bytes.
func (r *record) cell(addr Address) Cell {
	c := Cell{
		Addr:    addr,
		Value:   append([]byte(nil), r.value...),
		Error:   string(r.err),
		Version: r.version,
		Changed: time.Unix(0, r.changed),
		Stream:  r.flags&flagStream != 0,
	}
	if len(c.Value) == 0 {
		c.Value = []byte("null")
	}
	return c
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func readU64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

const (
	changeCell    = 0
	changeEvent   = 1
	changeDeleted = 2
)

// logChange is a change as the transaction records it.
type logChange struct {
	kind  byte
	key   string // the address
	rec   []byte // encoded cell record (kinds cell, event)
	event *Event // kind event
}

func encodeLog(at int64, changes []logChange) []byte {
	// The exact size: a commit of thousands of cells makes one entry, and
	// a bound of 5 varints of 10 bytes per change more than doubled it.
	size := varintLen(at) + uvarintLen(uint64(len(changes)))
	for i := range changes {
		c := &changes[i]
		size += 1 + uvarintLen(uint64(len(c.key))) + len(c.key)
		if c.kind == changeDeleted {
			continue
		}
		size += uvarintLen(uint64(len(c.rec))) + len(c.rec)
		if c.kind == changeEvent {
			size += uvarintLen(c.event.ID) + uvarintLen(uint64(len(c.event.Payload))) + len(c.event.Payload)
		}
	}
	b := make([]byte, 0, size)
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(len(changes)))
	for i := range changes {
		c := &changes[i]
		b = append(b, c.kind)
		b = binary.AppendUvarint(b, uint64(len(c.key)))
		b = append(b, c.key...)
		if c.kind == changeDeleted {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(c.rec)))
		b = append(b, c.rec...)
		if c.kind == changeEvent {
			b = binary.AppendUvarint(b, c.event.ID)
			b = binary.AppendUvarint(b, uint64(len(c.event.Payload)))
			b = append(b, c.event.Payload...)
		}
	}
	return b
}

// uvarintLen is the length of binary.AppendUvarint's encoding of v.
func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// varintLen is the length of binary.AppendVarint's encoding of x.
func varintLen(x int64) int { return uvarintLen(uint64(x)<<1 ^ uint64(x>>63)) }

// decodeLog decodes a log entry, keeping the changes whose address is
// under prefix (HasPrefix). The result owns its bytes.
func decodeLog(b []byte, prefix string) ([]Change, error) {
	at, n := binary.Varint(b)
	if n <= 0 {
		return nil, errCorrupt
	}
	b = b[n:]
	count, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, errCorrupt
	}
	b = b[n:]
	var out []Change
	next := func() ([]byte, error) {
		l, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < l {
			return nil, errCorrupt
		}
		v := b[n : n+int(l)]
		b = b[n+int(l):]
		return v, nil
	}
	for range count {
		if len(b) == 0 {
			return nil, errCorrupt
		}
		kind := b[0]
		b = b[1:]
		key, err := next()
		if err != nil {
			return nil, err
		}
		keep := len(key) >= len(prefix) && string(key[:len(prefix)]) == prefix && HasPrefix(string(key), prefix)
		var ch Change
		if keep {
			if ch.Cell.Addr, err = Parse(string(key)); err != nil {
				return nil, err
			}
		}
		if kind == changeDeleted {
			ch.Deleted = true
			ch.Cell.Value = []byte("null")
			ch.Cell.Changed = time.Unix(0, at)
		} else {
			rb, err := next()
			if err != nil {
				return nil, err
			}
			if keep {
				r, err := decodeRecord(rb)
				if err != nil {
					return nil, err
				}
				ch.Cell = r.cell(ch.Cell.Addr)
			}
			if kind == changeEvent {
				id, n := binary.Uvarint(b)
				if n <= 0 {
					return nil, errCorrupt
				}
				b = b[n:]
				p, err := next()
				if err != nil {
					return nil, err
				}
				if keep {
					ch.Event = &Event{ID: id, Payload: append([]byte(nil), p...), Sent: time.Unix(0, at)}
				}
			}
		}
		if keep {
			out = append(out, ch)
		}
	}
	return out, nil
}

func binaryVarint(v int64) []byte { return binary.AppendVarint(nil, v) }

func binaryUvarintTime(b []byte) (time.Time, int) {
	v, n := binary.Varint(b)
	return time.Unix(0, v), n
}
