package runapi

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/cellbox/cellbox/internal/fastjson"
)

// Cutting values for display: ?max_string=N on the reads that return many
// cells at once (GET /v1/patterns, /v1/patterns/{name}, /v1/cells,
// /v1/watch). A cell may hold tens of MiB (a sandbox node's files and
// history, a big input); a page that lists every cell, and the copies its
// computed nodes make, does not want them whole. The value keeps its shape
// (objects, their keys, arrays, numbers exactly as written), so a reader
// still finds a sandbox node's status, previews and history; only what is
// too long is cut, and the cell says so ("cut": true, "size": the whole
// value's bytes). GET /v1/cells/{addr} still answers the whole value.

// maxString is the largest max_string taken: past it nothing is ever cut
// (a cell's value is smaller than a request body).
const maxString = maxBody

// cutter cuts the values a request reads; the zero cutter cuts nothing.
type cutter struct {
	on bool
	n  int // max_string
}

// cutterOf reads the max_string parameter of r.
func cutterOf(r *http.Request) (cutter, error) {
	q := r.URL.Query()
	if !q.Has("max_string") {
		return cutter{}, nil
	}
	s := q.Get("max_string")
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return cutter{}, errorf(400, "max_string=%q: want a number of bytes (a non-negative integer): longer strings in cell values are cut to it", s)
	}
	if err != nil || n > maxString {
		n = maxString
	}
	return cutter{on: true, n: int(n)}, nil
}

// cell cuts c's value (in place).
func (k cutter) cell(c *Cell) {
	if !k.on {
		return
	}
	if v, cut := fastjson.Cut(c.Value, k.n); cut {
		c.Size = len(c.Value)
		c.Value, c.Cut = v, true
	}
}

// cells cuts the values of cs (in place).
func (k cutter) cells(cs []Cell) {
	for i := range cs {
		k.cell(&cs[i])
	}
}

// batch cuts the values (and event payloads) of b (in place).
func (k cutter) batch(b *Batch) {
	if !k.on {
		return
	}
	for i := range b.Changes {
		ch := &b.Changes[i]
		k.cell(&ch.Cell)
		if ev := ch.Event; ev != nil {
			if v, cut := fastjson.Cut(ev.Payload, k.n); cut {
				ev.Size = len(ev.Payload)
				ev.Payload, ev.Cut = v, true
			}
		}
	}
}
