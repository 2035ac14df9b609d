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
	// One byte more than announced: reading it sees the end. (Not
	// bytes.Buffer.ReadFrom: it wants 512 bytes of room before each read,
	// so a buffer of the exact size doubled, and was copied, at the end.)
	lr := io.LimitReader(r, limit)
	buf := make([]byte, size+1)
	n, err := io.ReadFull(lr, buf)
	switch {
	case err == io.ErrUnexpectedEOF || err == io.EOF:
		return buf[:n], nil
	case err != nil:
		return buf[:n], err
	}
	// More than announced: the rest as it comes.
	more := bytes.NewBuffer(buf)
	_, err = more.ReadFrom(lr)
	return more.Bytes(), err
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

// BufferPool keeps buffers of at most Max bytes for the next call. A
// fresh buffer of a megabyte per request (a write_file body, a read
// window) sets off a collection every few calls on a small heap, and the
// runtime hands the pages back to the kernel and faults them in again; a
// kept buffer costs neither. A buffer that grew past Max (a rare large
// request) is left to the collector rather than held on to.
type BufferPool struct {
	Max  int
	pool sync.Pool
}

// Get returns an empty buffer.
func (p *BufferPool) Get() *bytes.Buffer {
	b, _ := p.pool.Get().(*bytes.Buffer)
	if b == nil {
		return new(bytes.Buffer)
	}
	b.Reset()
	return b
}

// Put keeps b for a later Get; the caller must not use it after.
func (p *BufferPool) Put(b *bytes.Buffer) {
	if b != nil && b.Cap() <= p.Max {
		p.pool.Put(b)
	}
}

// PutSlice keeps the array of b for a later Get: b was appended to from a
// Get's AvailableBuffer, and may have outgrown it.
func (p *BufferPool) PutSlice(b []byte) { p.Put(bytes.NewBuffer(b[:0])) }
