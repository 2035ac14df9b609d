package runapi

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/runtime"
)

// Cell is a cell as the API shows it.
type Cell struct {
	// Address is the full address, "space/pattern/name".
	Address string          `json:"address"`
	Value   json.RawMessage `json:"value"`
	// Error says the cell's producer failed; Value is then the last good
	// value.
	Error   string    `json:"error,omitempty"`
	Version uint64    `json:"version"`
	Changed time.Time `json:"changed"`
	Stream  bool      `json:"stream,omitempty"`
	// Cut says Value is not whole: a read with max_string cut it (see
	// fastjson.Cut); Size is then the whole value's length in bytes. GET
	// /v1/cells/{addr} answers it whole.
	Cut  bool `json:"cut,omitempty"`
	Size int  `json:"size,omitempty"`
}

// Event is an event queued on a stream.
type Event struct {
	ID      uint64          `json:"id"`
	Payload json.RawMessage `json:"payload"`
	Sent    time.Time       `json:"sent"`
	// Cut and Size: as a Cell's, for the payload.
	Cut  bool `json:"cut,omitempty"`
	Size int  `json:"size,omitempty"`
}

// Change is one cell's change in a commit.
type Change struct {
	Cell    Cell   `json:"cell"`
	Event   *Event `json:"event,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
}

// Batch is what one commit changed (Snapshot: the whole state under the
// watch prefix, replacing what the client knew).
type Batch struct {
	Version  uint64   `json:"version"`
	Snapshot bool     `json:"snapshot,omitempty"`
	Changes  []Change `json:"changes"`
	// Error, on the last event of a watch, says why the server ended it
	// (the store's change log could not be read).
	Error string `json:"error,omitempty"`
}

// CellList is the answer of GET /v1/cells.
type CellList struct {
	Version uint64 `json:"version"`
	Cells   []Cell `json:"cells"`
}

// Node is a loaded node and its state.
type Node struct {
	Address string `json:"address"`
	Builtin string `json:"builtin"`
	// Shape is "compute", "async" or "service".
	Shape string `json:"shape"`
	// State is "idle", "running", "error", "backoff" or "open".
	State     string   `json:"state"`
	Error     string   `json:"error,omitempty"`
	Inputs    []string `json:"inputs,omitempty"`
	Runs      int      `json:"runs"`
	CacheHits int      `json:"cache_hits"`
	// LastMS is the duration of the last run, in milliseconds.
	LastMS float64 `json:"last_ms"`
}

// Instance is a loaded pattern instance.
type Instance struct {
	Space       string    `json:"space"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Source      string    `json:"source,omitempty"`
	Loaded      time.Time `json:"loaded"`
	// Version is the store version Cells were read at.
	Version uint64 `json:"version"`
	Cells   []Cell `json:"cells"`
	Nodes   []Node `json:"nodes"`
	// Resets, in the answer of a load, are the stored cells the pattern
	// no longer fitted (edited since), which start from its definition.
	Resets []Reset `json:"resets,omitempty"`
}

// Reset is a stored cell a load started anew, and why.
type Reset struct {
	Cell string `json:"cell"`
	Why  string `json:"why"`
}

// Sent is the answer of a send.
type Sent struct {
	Address string `json:"address"`
	Event   Event  `json:"event"`
}

// Violation is one way a value breaks its cell's schema.
type Violation struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Error is an API error: its HTTP status and its JSON body.
type Error struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
	// Suggestion is the nearest known name, for an unknown cell.
	Suggestion string `json:"suggestion,omitempty"`
	// Path and Reason are the first schema violation (Path: the JSON
	// pointer of the offending value, "" for the whole value; nil when the
	// error is not a violation); Violations lists all.
	Path       *string     `json:"path,omitempty"`
	Reason     string      `json:"reason,omitempty"`
	Violations []Violation `json:"violations,omitempty"`
	// cause is what the error stands for, for errors.Is (lease.ErrHeld).
	cause error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.cause }

func errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// CellOf renders a store cell for the API.
func CellOf(c cells.Cell) Cell {
	v := c.Value
	if len(v) == 0 {
		v = json.RawMessage("null")
	}
	return Cell{Address: c.Addr.String(), Value: v, Error: c.Error, Version: c.Version, Changed: c.Changed.UTC(), Stream: c.Stream}
}

func eventJSON(e cells.Event) Event {
	return Event{ID: e.ID, Payload: e.Payload, Sent: e.Sent.UTC()}
}

// BatchOf renders a store batch for the API.
func BatchOf(b cells.Batch) Batch {
	out := Batch{Version: b.Version, Snapshot: b.Snapshot, Changes: make([]Change, len(b.Changes))}
	if b.Err != nil {
		out.Error = b.Err.Error()
	}
	for i, c := range b.Changes {
		out.Changes[i] = Change{Cell: CellOf(c.Cell), Deleted: c.Deleted}
		if c.Event != nil {
			ev := eventJSON(*c.Event)
			out.Changes[i].Event = &ev
		}
	}
	return out
}

func nodeJSON(n runtime.NodeInfo) Node {
	out := Node{
		Address: n.Addr.String(), Builtin: n.Builtin, Shape: n.Shape, State: string(n.State), Error: n.Err,
		Runs: n.Runs, CacheHits: n.CacheHits, LastMS: float64(n.Last.Microseconds()) / 1000,
	}
	for _, in := range n.Inputs {
		out.Inputs = append(out.Inputs, in.String())
	}
	return out
}
