// Package suggest finds the name a user probably meant: the one place the
// "did you mean" of every face (pattern errors, CLI commands, cells, tools)
// comes from, so they all agree on what counts as a typo.
package suggest

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// DidYouMean returns ` (did you mean "x"?)` for the candidate nearest to
// name, or "" when none is near enough to be a likely typo.
func DidYouMean(name string, candidates []string) string {
	if s := Nearest(name, candidates); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// Nearest returns the candidate nearest to name by edit distance (a
// case-insensitive match first), or "" when none is within a third of the
// name's length (at least 1).
func Nearest(name string, candidates []string) string {
	if len(name) > 100 {
		return ""
	}
	for _, c := range candidates {
		if strings.EqualFold(c, name) && c != name {
			return c
		}
	}
	best, bestD := "", max(utf8.RuneCountInString(name)/3, 1)+1
	for _, c := range candidates {
		if d := distance(name, c); d < bestD && c != name {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the edit distance between a and b in runes, counting a
// transposition of neighbours as one edit (optimal string alignment).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// ListOrNone is names joined with ", " for a message that lists what
// there is instead ("sandboxes: a, b"), or "none".
func ListOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
