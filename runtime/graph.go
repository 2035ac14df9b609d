package runtime

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/cellbox/cellbox/cells"
)

type shape int

const (
	shapeCompute shape = iota
	shapeAsync
	shapeService
)

func (s shape) String() string { return [...]string{"compute", "async", "service"}[s] }

// input is one resolved input of a node.
type input struct {
	slot *slot // set by link; first, the one field a batch reads
	name string
	addr cells.Address
}

// pattern is a loaded pattern instance.
type pattern struct {
	space, name string
	nodes       []*node
}

func (p *pattern) key() string { return p.space + "/" + p.name }

// compile checks p and returns its nodes, unlinked.
func compile(p Pattern) (*pattern, error) {
	pat := &pattern{space: p.Space, name: p.Name}
	probe := cells.Address{Space: p.Space, Pattern: p.Name, Name: "x"}
	if err := probe.Valid(); err != nil {
		return nil, fmt.Errorf("pattern %s/%s: %w", p.Space, p.Name, err)
	}
	addr := func(name string) cells.Address { return cells.Address{Space: p.Space, Pattern: p.Name, Name: name} }
	kinds := map[string]string{} // name -> "cell", "stream", "node"
	declare := func(name, what string) error {
		if err := addr(name).Valid(); err != nil {
			return fmt.Errorf("%s %q: %w", what, name, err)
		}
		if prev, dup := kinds[name]; dup {
			return fmt.Errorf("%s %q: the name is already used by a %s", what, name, prev)
		}
		kinds[name] = what
		return nil
	}
	for _, c := range p.Cells {
		what := "cell"
		if c.Stream {
			what = "stream"
		}
		if err := declare(c.Name, what); err != nil {
			return nil, fmt.Errorf("pattern %s: %w", pat.key(), err)
		}
	}
	for _, n := range p.Nodes {
		if err := declare(n.Name, "node"); err != nil {
			return nil, fmt.Errorf("pattern %s: %w", pat.key(), err)
		}
		if strings.Contains(n.Name, ".") {
			return nil, fmt.Errorf("pattern %s: node %q: a node name cannot contain '.' (it separates a node from its streams)", pat.key(), n.Name)
		}
		for _, s := range n.Streams {
			if err := declare(n.Name+"."+s, "stream"); err != nil {
				return nil, fmt.Errorf("pattern %s: node %s: %w", pat.key(), n.Name, err)
			}
		}
	}
	for _, d := range p.Nodes {
		n := &node{addr: addr(d.Name), decl: d, pat: pat}
		switch k := d.Kind.(type) {
		case Compute:
			n.shape, n.compute = shapeCompute, k
		case Async:
			n.shape, n.async = shapeAsync, k
		case Service:
			n.shape, n.service = shapeService, k
		default:
			return nil, fmt.Errorf("pattern %s: node %s: kind %T implements none of Compute, Async, Service", pat.key(), d.Name, d.Kind)
		}
		if len(d.Streams) > 0 && n.shape != shapeService {
			return nil, fmt.Errorf("pattern %s: node %s: only a service node can have streams", pat.key(), d.Name)
		}
		seen := map[string]bool{}
		for _, in := range d.Inputs {
			if seen[in] {
				continue
			}
			seen[in] = true
			var a cells.Address
			if strings.Contains(in, "/") {
				var err error
				if a, err = cells.Parse(in); err != nil {
					return nil, fmt.Errorf("pattern %s: node %s: input %w", pat.key(), d.Name, err)
				}
			} else {
				switch kinds[in] {
				case "cell", "node":
					a = addr(in)
				case "stream":
					return nil, fmt.Errorf("pattern %s: node %s: input %q is a stream: streams take events, they have no value to read", pat.key(), d.Name, in)
				default:
					return nil, fmt.Errorf("pattern %s: node %s: unknown input %q (%s)", pat.key(), d.Name, in, names(kinds))
				}
			}
			n.inputs = append(n.inputs, input{name: in, addr: a})
		}
		if b, ok := n.compute.(BindArgs); ok {
			names := make([]string, len(n.inputs))
			for i, in := range n.inputs {
				names[i] = in.name
			}
			n.args = b.BindArgs(names)
		}
		pat.nodes = append(pat.nodes, n)
	}
	return pat, nil
}

// names lists the readable names of a pattern for an error message.
func names(kinds map[string]string) string {
	var cs, ns []string
	for name, k := range kinds {
		switch k {
		case "cell":
			cs = append(cs, name)
		case "node":
			ns = append(ns, name)
		}
	}
	sort.Strings(cs)
	sort.Strings(ns)
	return fmt.Sprintf("cells: %s; nodes: %s", list(cs), list(ns))
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// link adds pat's nodes to the graph, or returns the cycle they close.
// Callers hold r.mu.
func (r *Runtime) link(pat *pattern) error {
	for _, n := range pat.nodes {
		if other, ok := r.nodes[n.addr]; ok {
			return fmt.Errorf("pattern %s: node %s: cell %s is already the output of a loaded node (%s)", pat.key(), n.decl.Name, n.addr, other.addr)
		}
	}
	register := func(a cells.Address) *slot {
		s, ok := r.slots[a]
		if !ok {
			s = &slot{addr: a}
			r.slots[a] = s
		}
		return s
	}
	for _, n := range pat.nodes {
		r.nodes[n.addr] = n
		n.out = register(n.addr)
		n.out.producer = n
		n.in = n.inBuf[:0]
		for i := range n.inputs {
			s := register(n.inputs[i].addr)
			s.readers = append(s.readers, n)
			n.inputs[i].slot = s
			n.in = append(n.in, s)
		}
		for _, s := range n.decl.Streams {
			r.streams[streamAddr(n, s)] = streamRef{node: n, name: s}
		}
	}
	if cyc := r.findCycle(pat.nodes); cyc != nil {
		r.unlink(pat)
		return fmt.Errorf("pattern %s: cycle: %s", pat.key(), r.cycleText(pat, cyc))
	}
	r.heights()
	return nil
}

func (r *Runtime) unlink(pat *pattern) {
	for _, n := range pat.nodes {
		if r.nodes[n.addr] == n {
			delete(r.nodes, n.addr)
		}
		release := func(s *slot) {
			if s != nil && s.producer == nil && len(s.readers) == 0 && r.slots[s.addr] == s {
				delete(r.slots, s.addr)
			}
		}
		if n.out != nil && n.out.producer == n {
			n.out.producer = nil
		}
		release(n.out)
		for _, in := range n.inputs {
			if in.slot != nil {
				in.slot.readers = slices.DeleteFunc(in.slot.readers, func(d *node) bool { return d == n })
				release(in.slot)
			}
		}
		for _, s := range n.decl.Streams {
			delete(r.streams, streamAddr(n, s))
		}
	}
}

func streamAddr(n *node, stream string) cells.Address {
	a := n.addr
	a.Name += "." + stream
	return a
}

// findCycle looks for a cycle through the given nodes: a path of nodes
// where each reads the next one's output, back to the first.
func (r *Runtime) findCycle(from []*node) []*node {
	const (
		white = iota
		grey
		black
	)
	color := map[*node]int{}
	var stack []*node
	var visit func(n *node) []*node
	visit = func(n *node) []*node {
		color[n] = grey
		stack = append(stack, n)
		for _, in := range n.inputs {
			p := in.slot.producer
			if p == nil {
				continue
			}
			switch color[p] {
			case grey:
				i := slices.Index(stack, p)
				return append(slices.Clone(stack[i:]), p)
			case white:
				if c := visit(p); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return nil
	}
	for _, n := range from {
		if color[n] == white {
			if c := visit(n); c != nil {
				return c
			}
		}
	}
	return nil
}

// cycleText names a cycle in data-flow order, "a -> b -> a" (b reads a).
func (r *Runtime) cycleText(pat *pattern, cyc []*node) string {
	parts := make([]string, len(cyc))
	for i, n := range cyc {
		name := n.addr.String()
		if n.pat == pat {
			name = n.decl.Name
		}
		parts[len(cyc)-1-i] = name
	}
	return strings.Join(parts, " -> ")
}

// heights sets every node's height: 1 + the highest of the nodes it reads
// (cells without a producer are at 0). Nodes run in height order.
func (r *Runtime) heights() {
	done := map[*node]bool{}
	var h func(n *node) int
	h = func(n *node) int {
		if done[n] {
			return n.height
		}
		height := 1
		for _, in := range n.inputs {
			if p := in.slot.producer; p != nil {
				height = max(height, h(p)+1)
			}
		}
		n.height, done[n] = height, true
		return height
	}
	for _, n := range r.nodes {
		h(n)
	}
}
