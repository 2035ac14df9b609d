// Package textcut shortens text for messages and displays without
// splitting a UTF-8 sequence: a cut in the middle of one leaves bytes that
// are not text, which JSON encoders then turn into U+FFFD.
package textcut

import "unicode/utf8"

// Prefix returns at most the first n bytes of s, ending where a UTF-8
// sequence starts (so at most 3 bytes fewer than n).
func Prefix[T ~string | ~[]byte](s T, n int) T {
	if len(s) <= n {
		return s
	}
	k := max(n, 0)
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k]
}
