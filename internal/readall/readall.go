// Package readall reads a body whose length is announced into one
// buffer of that size. io.ReadAll starts at 512 bytes and grows by
// doubling: for a megabyte, some twenty allocations and twice the bytes
// copied, and the garbage costs more than the copy on two cores.
package readall

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
)

// ErrTooLarge is Capped's error for a reader holding more than its max.
var ErrTooLarge = errors.New("more bytes than the limit")

// Capped reads r to its end, reading at most max+1 bytes: more than max
// fails with ErrTooLarge, so a source that grows while it is read, or
// lies about its size, cannot fill the memory.
func Capped(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err == nil && int64(len(b)) > max {
		return nil, ErrTooLarge
	}
	return b, err
}

// Sized reads at most limit bytes of r, whose length is size (-1 when
// unknown), into one allocation when size is known and under limit.
func Sized(r io.Reader, size, limit int64) ([]byte, error) {
	if size < 0 || size >= limit {
		return io.ReadAll(io.LimitReader(r, limit))
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+1)) // +1: ReadFrom wants room to see EOF
	_, err := buf.ReadFrom(io.LimitReader(r, limit))
	return buf.Bytes(), err
}

// String is Sized into a string, without string(b)'s copy.
func String(r io.Reader, size, limit int64) (string, error) {
	var sb strings.Builder
	if size >= 0 && size < limit {
		sb.Grow(int(size))
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	_, err := io.CopyBuffer(&sb, io.LimitReader(r, limit), *bp)
	return sb.String(), err
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
