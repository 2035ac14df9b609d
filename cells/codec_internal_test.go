package cells

import (
	"math"
	"testing"
)

// TestEncodeSizes: a record and a log entry are encoded into exactly the
// size they are allocated with.
func TestEncodeSizes(t *testing.T) {
	for _, r := range []record{
		{},
		{flags: flagStream | flagHasSchema, version: math.MaxUint64, changed: math.MinInt64, err: []byte("boom"), value: []byte(`{"a":1}`)},
		{version: 1 << 7, changed: -1, value: []byte("12")},
		{version: 1<<14 - 1, changed: math.MaxInt64, err: make([]byte, 300)},
	} {
		b := r.encode()
		if len(b) != cap(b) {
			t.Errorf("record %+v: %d bytes in %d", r, len(b), cap(b))
		}
		got, err := decodeRecord(b)
		if err != nil || got.version != r.version || got.changed != r.changed || string(got.value) != string(r.value) || string(got.err) != string(r.err) {
			t.Errorf("record %+v decodes as %+v, %v", r, got, err)
		}
		ev := &Event{ID: 1 << 40, Payload: []byte(`"x"`)}
		for _, at := range []int64{0, -5, math.MaxInt64, math.MinInt64, 1e18} {
			changes := []logChange{
				{kind: changeCell, key: "s/p/a", rec: b},
				{kind: changeEvent, key: "s/p/e", rec: b, event: ev},
				{kind: changeDeleted, key: "s/p/d"},
			}
			e := encodeLog(at, changes)
			if len(e) != cap(e) {
				t.Errorf("log entry at %d: %d bytes in %d", at, len(e), cap(e))
			}
			if out, err := decodeLog(e, "s/p"); err != nil || len(out) != 3 {
				t.Errorf("log entry at %d decodes as %d changes, %v", at, len(out), err)
			}
		}
	}
}
