package fastjson

import (
	"bytes"
	"math/bits"
	"strings"
)

// runEnd is where the plain run of a string's inside that starts at i
// ends: the index of the first byte of s at or after i that is one of
// stops or a control character (or, with high, a byte >= 0x80), or
// len(s). next holds, per stop, where it was last found (-1 at first):
// the caller keeps it for the next call on the same s.
//
// Why: a scan of the words of a megabyte takes half a millisecond here,
// bytes.IndexByte (vectorised) tens of microseconds. So the next 16 bytes
// are looked at a word at a time (escapes close together, as in short
// lines, cost no call), and a longer run is found with IndexByte, one
// search per stop byte; each found position is kept until the scan
// passes it, so that a string of many escapes is not searched to its end
// for each. Only control characters (and high bytes) are looked for in
// Go, by ctlIndex.
func runEnd[T string | []byte](s T, i int, stops string, high bool, next []int) int {
	for n := 0; n < 2 && i+8 <= len(s); n++ {
		w := load8(s, i)
		m := special(w)
		if high {
			m |= w & msb
		}
		if len(stops) > 2 {
			m |= html(w)
		}
		if m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		i += 8
	}
	end := len(s)
	for k := range len(stops) {
		if next[k] < i {
			if j := indexByte(s[i:], stops[k]); j < 0 {
				next[k] = len(s)
			} else {
				next[k] = i + j
			}
		}
		end = min(end, next[k])
	}
	if j := ctlIndex(s[i:end], high); j >= 0 {
		return i + j
	}
	return end
}

func indexByte[T string | []byte](s T, c byte) int {
	switch s := any(s).(type) {
	case string:
		return strings.IndexByte(s, c)
	case []byte:
		return bytes.IndexByte(s, c)
	}
	panic("unreachable")
}

// ctlIndex is the index of the first control character (< 0x20) of s
// (with high, or byte >= 0x80), or -1: 32 bytes a step while there is
// none (special's "has a byte less than 0x20" test, alone), then the step
// that has one byte by byte.
func ctlIndex[T string | []byte](s T, high bool) int {
	const ctl = lsb * 0x20
	hi := uint64(0)
	if high {
		hi = msb
	}
	i := 0
	for ; i+32 <= len(s); i += 32 {
		w0, w1, w2, w3 := load8(s, i), load8(s, i+8), load8(s, i+16), load8(s, i+24)
		if ((w0-ctl)&^w0|(w1-ctl)&^w1|(w2-ctl)&^w2|(w3-ctl)&^w3|(w0|w1|w2|w3)&hi)&msb != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x20 || high && s[i] >= 0x80 {
			return i
		}
	}
	return -1
}

// load8 is the eight bytes of s at i, little-endian (the compiler makes
// it one load).
func load8[T string | []byte](s T, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
