package textedit

import "strings"

// canonical is a whitespace-insensitive view of a text: on every line,
// leading and trailing spaces/tabs are dropped and every inner run of them
// becomes one space. Line breaks are kept, so line structure is preserved.
type canonical struct {
	text string
	pos  []int // pos[i] is the index in the source of text[i] (for a ' ', the start of its run)
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func canonicalize(src string) *canonical {
	var sb strings.Builder
	sb.Grow(len(src))
	pos := make([]int, 0, len(src))
	emit := func(c byte, i int) { sb.WriteByte(c); pos = append(pos, i) }
	lineStart := true
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			emit(c, i)
			lineStart = true
			i++
		case isBlank(c):
			j := i
			for j < len(src) && isBlank(src[j]) {
				j++
			}
			if !lineStart && j < len(src) && src[j] != '\n' {
				emit(' ', i)
			}
			i = j
		default:
			emit(c, i)
			lineStart = false
			i++
		}
	}
	return &canonical{text: sb.String(), pos: pos}
}

func canonLine(s string) string { return canonicalize(s).text }

// find returns the [start, end) spans of src (which c was made from) that
// match old when whitespace differences are ignored. If old begins (ends)
// with spaces/tabs, a span takes in the blanks before (after) it, so the
// file's own indentation is replaced too.
func (c *canonical) find(src, old string) [][2]int {
	pat := canonLine(old)
	if strings.Trim(pat, " \n") == "" {
		return nil
	}
	leadBlank, trailBlank := isBlank(old[0]), isBlank(old[len(old)-1])
	var spans [][2]int
	for _, cs := range indexAll(c.text, pat) {
		ce := cs + len(pat)
		// Blanks at an edge of old must meet blanks (or a line edge) in the file.
		if leadBlank && cs > 0 && c.text[cs-1] != '\n' && c.text[cs-1] != ' ' {
			continue
		}
		if trailBlank && ce < len(c.text) && c.text[ce] != '\n' && c.text[ce] != ' ' {
			continue
		}
		start, end := c.pos[cs], c.pos[ce-1]+1
		if leadBlank {
			for start > 0 && isBlank(src[start-1]) {
				start--
			}
		}
		if trailBlank {
			for end < len(src) && isBlank(src[end]) {
				end++
			}
		}
		spans = append(spans, [2]int{start, end})
	}
	return spans
}

// lineMatches returns the source positions where the canonical text s occurs.
func (c *canonical) lineMatches(s string) []int {
	var at []int
	for _, i := range indexAll(c.text, s) {
		at = append(at, c.pos[i])
	}
	return at
}

func lead(s string) string { return s[:len(s)-len(strings.TrimLeft(s, " \t"))] }

// reindent rewrites the indentation of repl the way the file's indentation
// differs from old's: old and matched (the file text old fuzzily matched)
// have the same number of lines; each non-blank line pair maps old's
// indentation to the file's. Lines of repl whose indentation (or its longest
// mapped prefix) has a consistent mapping get the file's indentation. When
// the match starts mid-line, the first line carries no indentation and is
// left alone.
func reindent(old, matched, repl string, atLineStart bool) string {
	oldLines, fileLines := strings.Split(old, "\n"), strings.Split(matched, "\n")
	if len(oldLines) != len(fileLines) {
		return repl
	}
	first := 0
	if !atLineStart {
		first = 1
	}
	m, conflict := map[string]string{}, map[string]bool{}
	changed := false
	for i := first; i < len(oldLines); i++ {
		if strings.TrimLeft(oldLines[i], " \t") == "" {
			continue
		}
		a, b := lead(oldLines[i]), lead(fileLines[i])
		if v, ok := m[a]; ok && v != b {
			conflict[a] = true
		}
		m[a] = b
		changed = changed || a != b
	}
	for k := range conflict {
		delete(m, k)
	}
	if !changed || len(m) == 0 {
		return repl
	}
	lines := strings.Split(repl, "\n")
	for i := first; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimLeft(l, " \t") == "" {
			continue
		}
		a := lead(l)
		if v, ok := m[a]; ok {
			lines[i] = v + l[len(a):]
			continue
		}
		best := ""
		for k := range m {
			if len(k) > len(best) && strings.HasPrefix(a, k) {
				best = k
			}
		}
		if best != "" {
			lines[i] = m[best] + l[len(best):]
		}
	}
	return strings.Join(lines, "\n")
}
