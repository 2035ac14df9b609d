package textedit

import (
	"fmt"
	"strings"
)

// UnifiedDiff returns a unified diff from a to b, in the format patch(1) and
// git apply read: "--- path" / "+++ path" headers, then @@ hunks with context
// unchanged lines around each change (negative means 0). Lines are compared
// byte for byte (a CRLF line differs from its LF twin), and a missing final
// newline is marked "\ No newline at end of file". Equal inputs give "".
//
// The line diff is Myers' O(ND) algorithm in linear space; when a region
// needs more than maxCost edit steps it is treated as wholly replaced, so
// the diff stays correct (though not minimal) and fast on huge rewrites.
func UnifiedDiff(path string, a, b []byte, context int) string {
	if string(a) == string(b) {
		return ""
	}
	context = max(context, 0)
	al, bl := splitLines(string(a)), splitLines(string(b))
	ids := map[string]int{}
	d := &differ{a: lineIDs(al, ids), b: lineIDs(bl, ids)}
	d.delA, d.insB = make([]bool, len(al)), make([]bool, len(bl))
	d.compare(0, len(al), 0, len(bl))

	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", path, path)
	for _, h := range d.hunks(context) {
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", hunkRange(h.a0, h.a1), hunkRange(h.b0, h.b1))
		i, j := h.a0, h.b0
		for i < h.a1 || j < h.b1 {
			switch {
			case i < h.a1 && d.delA[i]:
				writeLine(&sb, '-', al[i])
				i++
			case j < h.b1 && d.insB[j]:
				writeLine(&sb, '+', bl[j])
				j++
			default:
				writeLine(&sb, ' ', al[i])
				i, j = i+1, j+1
			}
		}
	}
	return sb.String()
}

// splitLines splits s after every '\n'; the last line may lack one.
func splitLines(s string) []string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func lineIDs(lines []string, ids map[string]int) []int {
	out := make([]int, len(lines))
	for i, l := range lines {
		id, ok := ids[l]
		if !ok {
			id = len(ids)
			ids[l] = id
		}
		out[i] = id
	}
	return out
}

func writeLine(sb *strings.Builder, tag byte, line string) {
	sb.WriteByte(tag)
	sb.WriteString(line)
	if !strings.HasSuffix(line, "\n") {
		sb.WriteString("\n\\ No newline at end of file\n")
	}
}

// hunkRange formats a 0-based half-open line range as "start,count".
func hunkRange(lo, hi int) string {
	switch hi - lo {
	case 0:
		return fmt.Sprintf("%d,0", lo) // an empty range names the line before it
	case 1:
		return fmt.Sprint(lo + 1)
	}
	return fmt.Sprintf("%d,%d", lo+1, hi-lo)
}

type hunk struct{ a0, a1, b0, b1 int }

// hunks groups the changes into hunks with context lines around them;
// changes closer than 2*context lines share a hunk.
func (d *differ) hunks(context int) []hunk {
	var hs []hunk
	i, j := 0, 0
	n, m := len(d.a), len(d.b)
	for i < n || j < m {
		if (i < n && d.delA[i]) || (j < m && d.insB[j]) {
			// a change starts at (i, j): find where it ends
			i1, j1 := i, j
			for i1 < n && d.delA[i1] {
				i1++
			}
			for j1 < m && d.insB[j1] {
				j1++
			}
			a0, b0 := max(i-context, 0), max(j-context, 0)
			if k := len(hs) - 1; k >= 0 && a0 <= hs[k].a1+context {
				hs[k].a1, hs[k].b1 = i1, j1 // merge with the previous hunk
			} else {
				hs = append(hs, hunk{a0, i1, b0, j1})
			}
			i, j = i1, j1
			continue
		}
		i, j = i+1, j+1
	}
	for k := range hs {
		extra := min(context, n-hs[k].a1, m-hs[k].b1)
		hs[k].a1 += extra
		hs[k].b1 += extra
	}
	return hs
}

// maxCost bounds the edit distance explored in one bisection.
const maxCost = 4096

// differ marks the lines of a deleted and of b inserted by a shortest edit
// script (Myers 1986, linear-space refinement).
type differ struct {
	a, b       []int
	delA, insB []bool
}

func (d *differ) compare(aLo, aHi, bLo, bHi int) {
	for aLo < aHi && bLo < bHi && d.a[aLo] == d.b[bLo] {
		aLo, bLo = aLo+1, bLo+1
	}
	for aLo < aHi && bLo < bHi && d.a[aHi-1] == d.b[bHi-1] {
		aHi, bHi = aHi-1, bHi-1
	}
	if aLo == aHi || bLo == bHi {
		for i := aLo; i < aHi; i++ {
			d.delA[i] = true
		}
		for j := bLo; j < bHi; j++ {
			d.insB[j] = true
		}
		return
	}
	x, y, ok := d.bisect(aLo, aHi, bLo, bHi)
	if !ok {
		d.compare(aLo, aHi, bLo, bLo) // no usable split: replace the region wholesale
		d.compare(aHi, aHi, bLo, bHi)
		return
	}
	d.compare(aLo, x, bLo, y)
	d.compare(x, aHi, y, bHi)
}

// bisect finds the middle snake of a[aLo:aHi] vs b[bLo:bHi] and returns a
// point (x, y) on a shortest edit path, splitting the problem in two.
func (d *differ) bisect(aLo, aHi, bLo, bHi int) (x, y int, ok bool) {
	a, b := d.a[aLo:aHi], d.b[bLo:bHi]
	n, m := len(a), len(b)
	maxD := (n + m + 1) / 2
	off := maxD + 1
	vf, vb := make([]int, 2*maxD+3), make([]int, 2*maxD+3)
	for i := range vf {
		vf[i], vb[i] = -1, -1
	}
	vf[off+1], vb[off+1] = 0, 0
	delta := n - m
	front := delta%2 != 0
	k1start, k1end, k2start, k2end := 0, 0, 0, 0
	for dd := 0; dd < min(maxD, maxCost); dd++ {
		for k1 := -dd + k1start; k1 <= dd-k1end; k1 += 2 {
			i := off + k1
			var x1 int
			if k1 == -dd || (k1 != dd && vf[i-1] < vf[i+1]) {
				x1 = vf[i+1]
			} else {
				x1 = vf[i-1] + 1
			}
			y1 := x1 - k1
			for x1 < n && y1 < m && a[x1] == b[y1] {
				x1, y1 = x1+1, y1+1
			}
			vf[i] = x1
			switch {
			case x1 > n:
				k1end += 2
			case y1 > m:
				k1start += 2
			case front:
				if j := off + delta - k1; j >= 0 && j < len(vb) && vb[j] != -1 && x1 >= n-vb[j] {
					return aLo + x1, bLo + y1, true
				}
			}
		}
		for k2 := -dd + k2start; k2 <= dd-k2end; k2 += 2 {
			i := off + k2
			var x2 int
			if k2 == -dd || (k2 != dd && vb[i-1] < vb[i+1]) {
				x2 = vb[i+1]
			} else {
				x2 = vb[i-1] + 1
			}
			y2 := x2 - k2
			for x2 < n && y2 < m && a[n-x2-1] == b[m-y2-1] {
				x2, y2 = x2+1, y2+1
			}
			vb[i] = x2
			switch {
			case x2 > n:
				k2end += 2
			case y2 > m:
				k2start += 2
			case !front:
				if j := off + delta - k2; j >= 0 && j < len(vf) && vf[j] != -1 {
					x1 := vf[j]
					y1 := x1 - (j - off)
					if x1 >= n-x2 {
						return aLo + x1, bLo + y1, true
					}
				}
			}
		}
	}
	return 0, 0, false
}
