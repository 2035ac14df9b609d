package runapi

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cellbox/cellbox/patterns"
)

// Graph formats.
const (
	FormatDot     = "dot"
	FormatMermaid = "mermaid"
)

// Graph draws a pattern's graph — its input cells, its nodes (name and
// kind) and an edge from everything a node reads to the node — in Graphviz
// dot (format "dot" or "") or as a Mermaid flowchart ("mermaid").
func Graph(p *patterns.Pattern, format string) (string, error) {
	var b strings.Builder
	switch format {
	case "", FormatDot:
		fmt.Fprintf(&b, "digraph %s {\n\trankdir=LR;\n\tnode [fontname=\"Helvetica\"];\n", strconv.Quote(p.Name))
		for _, c := range p.Cells {
			fmt.Fprintf(&b, "\t%s [shape=ellipse, label=%s];\n", strconv.Quote(c.Name), strconv.Quote(c.Name))
		}
		for _, n := range p.Nodes {
			shape := map[patterns.Kind]string{patterns.KindComputed: "box, style=rounded", patterns.KindSandbox: "box3d"}[n.Kind]
			if shape == "" {
				shape = "box"
			}
			fmt.Fprintf(&b, "\t%s [shape=%s, label=%s];\n", strconv.Quote(n.Name), shape, strconv.Quote(n.Name+"\n"+string(n.Kind)))
		}
		for _, n := range p.Nodes {
			for _, r := range n.Reads {
				fmt.Fprintf(&b, "\t%s -> %s;\n", strconv.Quote(r), strconv.Quote(n.Name))
			}
		}
		b.WriteString("}\n")
	case FormatMermaid:
		// Ids are prefixed: a name may be a Mermaid keyword ("end").
		b.WriteString("flowchart LR\n")
		for _, c := range p.Cells {
			fmt.Fprintf(&b, "\tc_%s([\"%s\"])\n", c.Name, c.Name)
		}
		for _, n := range p.Nodes {
			open, close := "[", "]"
			switch n.Kind {
			case patterns.KindComputed:
				open, close = "(", ")"
			case patterns.KindSandbox:
				open, close = "[[", "]]"
			}
			fmt.Fprintf(&b, "\tn_%s%s\"%s<br/><i>%s</i>\"%s\n", n.Name, open, n.Name, n.Kind, close)
		}
		for _, n := range p.Nodes {
			for _, r := range n.Reads {
				from := "c_" + r
				if _, ok := p.Node(r); ok {
					from = "n_" + r
				}
				fmt.Fprintf(&b, "\t%s --> n_%s\n", from, n.Name)
			}
		}
	default:
		return "", fmt.Errorf("unknown graph format %q: want dot or mermaid", format)
	}
	return b.String(), nil
}
