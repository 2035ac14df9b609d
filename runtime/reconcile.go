package runtime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/jsonschema"
	"github.com/cellbox/cellbox/internal/textcut"
)

// Kinds of an instance's cells, as bucketPatterns records them: an input
// cell, a stream, or a node's output ("node:" and the node's builtin, or
// its shape).
const (
	kindCell   = "cell"
	kindStream = "stream"
	kindNode   = "node:"
	// kindSomeNode is the kind a store without a record says a cell had
	// when the runtime kept node state for it: the output of some node.
	kindSomeNode = kindNode + "?"
)

// declared returns the kind of each cell a pattern instance declares: its
// input cells and streams, its nodes' outputs and their streams.
func declared(pat *pattern, p Pattern) map[string]string {
	kinds := make(map[string]string, len(p.Cells)+len(pat.nodes))
	for _, c := range p.Cells {
		kinds[c.Name] = kindCell
		if c.Stream {
			kinds[c.Name] = kindStream
		}
	}
	for _, n := range pat.nodes {
		kinds[n.decl.Name] = kindNode + n.kindName()
		for _, s := range n.decl.Streams {
			kinds[n.decl.Name+"."+s] = kindStream
		}
	}
	return kinds
}

// reconcile makes the store's cells of an instance fit the pattern being
// loaded, before its cells are declared:
//
//   - a stored cell the pattern no longer declares (a removed cell, node or
//     stream) is removed, with the durable state of its node;
//   - a stored cell whose kind changed (an input cell that is now a node's
//     output or the other way round, a node of another kind, a stream that
//     is now a value cell or the other way round) is removed too, so that
//     it starts from its new definition: an input cell from its initial
//     value, a node's output from the node's first run.
//
// What each cell was is recorded per instance in bucketPatterns. A store
// written before that record existed has none: a stream is told by its
// cell, an async node's or a service's output by the node state kept for
// it; any other cell is taken to be what it is declared now.
func (b *batch) reconcile(pat *pattern, p Pattern) error {
	kinds := declared(pat, p)
	bucket := b.tx.Meta(bucketPatterns)
	prev, recorded := bucket.Get(pat.key())
	var before map[string]string
	if recorded && json.Unmarshal(prev, &before) != nil {
		recorded = false
	}
	stored, err := b.tx.List(pat.key() + "/")
	if err != nil {
		return fmt.Errorf("list the stored cells of %s: %w", pat.key(), err)
	}
	var removed []string
	for _, c := range stored {
		name := c.Addr.Name
		kind, ok := kinds[name]
		was := before[name]
		if !recorded {
			was = b.guessKind(c)
		}
		if builtin, node := strings.CutPrefix(was, kindNode); node && builtin != "?" && was != kind && b.r.opts.OnGone != nil {
			addr, gone := c.Addr, b.r.opts.OnGone
			b.then(func() { gone(addr, builtin) })
		}
		if !ok {
			if err := b.drop(c.Addr); err != nil {
				return err
			}
			removed = append(removed, name)
			continue
		}
		if c.Stream != (kind == kindStream) || was != "" && !sameKind(was, kind) {
			if was == "" {
				was = kindCell
				if c.Stream {
					was = kindStream
				}
			}
			why := fmt.Sprintf("it was %s and is now %s: it starts from the pattern's definition", kindText(was), kindText(kind))
			if err := b.reset(c.Addr, why); err != nil {
				return err
			}
		}
	}
	if len(removed) > 0 {
		log := b.r.log
		b.then(func() {
			log.Info("removed the stored cells the pattern no longer declares", "pattern", pat.key(), "cells", strings.Join(removed, ", "))
		})
	}
	rec, err := json.Marshal(kinds)
	if err != nil {
		return err
	}
	if !bytes.Equal(rec, prev) { // unchanged, nothing is written (no commit)
		if err := bucket.Put(pat.key(), rec); err != nil {
			return fmt.Errorf("record the cells of %s: %w", pat.key(), err)
		}
	}
	return nil
}

// guessKind tells what a stored cell was from the store alone (see
// reconcile): "" when it cannot tell.
func (b *batch) guessKind(c cells.Cell) string {
	if c.Stream {
		return kindStream
	}
	for _, bucket := range []string{bucketNodes, bucketServices} {
		if _, ok := b.tx.Meta(bucket).Get(c.Addr.String()); ok {
			return kindSomeNode
		}
	}
	return ""
}

func sameKind(was, now string) bool {
	if was == kindSomeNode {
		return strings.HasPrefix(now, kindNode)
	}
	return was == now
}

// kindText names a kind for a message.
func kindText(kind string) string {
	switch {
	case kind == kindCell:
		return "an input cell"
	case kind == kindStream:
		return "a stream"
	case kind == kindSomeNode:
		return "a node's output"
	case strings.HasPrefix(kind, kindNode):
		return "the output of a node (" + strings.TrimPrefix(kind, kindNode) + ")"
	}
	return kind
}

// reset removes a stored cell that does not fit the pattern being loaded,
// so that it is declared again from the pattern's definition; the live
// view hears why (a Reset status), and the log.
func (b *batch) reset(a cells.Address, why string) error {
	if err := b.drop(a); err != nil {
		return err
	}
	b.status = append(b.status, Status{Node: a, Kind: Reset, Err: why})
	return nil
}

// drop removes a cell from the store with the durable state the runtime
// keeps for the node it was the output of (the memo cache, keyed by
// content and shared by all nodes, keeps its results until evicted). Nodes
// of other instances that read the cell see it gone (null).
func (b *batch) drop(a cells.Address) error {
	if err := b.tx.Delete(a); err != nil {
		return fmt.Errorf("remove cell %s: %w", a, err)
	}
	for _, bucket := range []string{bucketNodes, bucketServices} {
		if err := b.tx.Meta(bucket).Delete(a.String()); err != nil {
			return fmt.Errorf("remove the node state of %s: %w", a, err)
		}
	}
	if s, ok := b.r.slots[a]; ok {
		b.stage(s, value{raw: nullValue, missing: true})
		b.mark(s)
	}
	return nil
}

// clipValue shows a stored value in a message, cut to 80 bytes.
func clipValue(raw json.RawMessage) string {
	const max = 80
	if len(raw) <= max {
		return string(raw)
	}
	return string(textcut.Prefix(raw, max)) + "…"
}

// violations lists a schema validation error's violations on one line.
func violations(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) || len(ve.Violations) == 0 {
		return err.Error()
	}
	parts := make([]string, len(ve.Violations))
	for i, v := range ve.Violations {
		parts[i] = v.String()
	}
	return strings.Join(parts, "; ")
}
