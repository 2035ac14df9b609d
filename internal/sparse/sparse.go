// Package sparse copies into a file leaving holes where the data is zeros,
// so that a file of a gigabyte of zeros (`truncate -s 1G f`) takes no disk
// when it is copied: into the snapshot store, or back into a box. A Map
// says where a file's data lies, so that a copy reads and moves the data
// only, in time proportional to it, not to the file's size.
//
// Hand-written: Go has no sparse copy, and cp --sparse=always, which does
// the same, is a process per file; archive/tar reads GNU sparse entries
// but writes none (and gives their holes back as zeros to be read).
package sparse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// blockSize is the unit of a hole: a filesystem block.
const blockSize = 4096

var zeros [blockSize]byte

// Copy copies r into f, which must be empty and positioned at 0, seeking
// over each zero block instead of writing it, and returns the bytes copied.
// f ends with its full size, holes included.
func Copy(f *os.File, r io.Reader) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	hole := false // the last block was skipped
	for {
		// Filled as io.ReadFull would, but a reader's own error (a tar
		// stream cut short says io.ErrUnexpectedEOF) is kept apart from
		// its end.
		m := 0
		var rerr error
		for m < len(buf) && rerr == nil {
			var k int
			k, rerr = r.Read(buf[m:])
			m += k
		}
		for off := 0; off < m; off += blockSize {
			b := buf[off:min(off+blockSize, m)]
			if bytes.Equal(b, zeros[:len(b)]) {
				if _, err := f.Seek(int64(len(b)), io.SeekCurrent); err != nil {
					return n, err
				}
				hole = true
			} else {
				if _, err := f.Write(b); err != nil {
					return n, err
				}
				hole = false
			}
			n += int64(len(b))
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	if hole { // a seek past the end sets no size
		if err := f.Truncate(n); err != nil {
			return n, err
		}
	}
	return n, nil
}

// Segment is a run of data in a sparse file: Len bytes at Off.
type Segment struct{ Off, Len int64 }

// Map says where a file's data lies: its data segments, in order, and
// its size. Where no segment is, the file is a hole (reads as zeros).
type Map struct {
	Size int64
	Segs []Segment
}

// Data is the bytes of data, holes not counted.
func (m Map) Data() int64 {
	var n int64
	for _, s := range m.Segs {
		n += s.Len
	}
	return n
}

// Of finds the data of f, size bytes long, with lseek's SEEK_DATA and
// SEEK_HOLE (at a filesystem's block granularity: a segment may hold
// zeros). A filesystem without them reports one segment, the whole file.
func Of(f *os.File, size int64) (Map, error) {
	m := Map{Size: size}
	for off := int64(0); off < size; {
		data, err := f.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) { // no data past off: a hole to the end
			break
		}
		if err != nil {
			if errors.Is(err, syscall.EINVAL) && off == 0 { // no SEEK_DATA here
				return Map{Size: size, Segs: []Segment{{0, size}}}, nil
			}
			return Map{}, err
		}
		if data >= size {
			break
		}
		hole, err := f.Seek(data, seekHole)
		if err != nil {
			return Map{}, err
		}
		hole = min(hole, size) // the file grew since its size was read
		m.Segs = append(m.Segs, Segment{data, hole - data})
		off = hole
	}
	_, err := f.Seek(0, io.SeekStart)
	return m, err
}

const (
	seekData = 3 // SEEK_DATA
	seekHole = 4 // SEEK_HOLE
)

// Encode writes the segments as "off+len,off+len,…" (decimal).
func (m Map) Encode() string {
	var b strings.Builder
	for i, s := range m.Segs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(s.Off, 10))
		b.WriteByte('+')
		b.WriteString(strconv.FormatInt(s.Len, 10))
	}
	return b.String()
}

// Parse reads the segments Encode wrote for a file of size bytes and
// checks them: in order, not overlapping, not empty, within the size,
// data bytes in all. The map may come from a box: it is hostile.
func Parse(size, data int64, segs string) (Map, error) {
	m := Map{Size: size}
	if size < 0 {
		return Map{}, fmt.Errorf("sparse map: bad size %d", size)
	}
	end := int64(0)
	if segs != "" {
		for _, s := range strings.Split(segs, ",") {
			o, l, ok := strings.Cut(s, "+")
			off, err1 := strconv.ParseInt(o, 10, 64)
			n, err2 := strconv.ParseInt(l, 10, 64)
			if !ok || err1 != nil || err2 != nil || off < end || n <= 0 || n > size-off {
				return Map{}, fmt.Errorf("sparse map: bad segment %q (want off+len, in order, within %d bytes)", s, size)
			}
			m.Segs = append(m.Segs, Segment{off, n})
			end = off + n
		}
	}
	if m.Data() != data {
		return Map{}, fmt.Errorf("sparse map: its segments hold %d bytes, the entry %d", m.Data(), data)
	}
	return m, nil
}

// Reader reads the data of f per m, segment after segment, holes left
// out: what Write lays out again.
func (m Map) Reader(f io.ReaderAt) io.Reader {
	rs := make([]io.Reader, len(m.Segs))
	for i, s := range m.Segs {
		rs[i] = io.NewSectionReader(f, s.Off, s.Len)
	}
	return io.MultiReader(rs...)
}

// Write lays out the data read from r (m.Data() bytes, as Reader gave
// them) into f, which must be empty, at m's segments, holes between, and
// gives f m's size. It returns the data bytes written.
func Write(f *os.File, r io.Reader, m Map) (int64, error) {
	var n int64
	for _, s := range m.Segs {
		if _, err := f.Seek(s.Off, io.SeekStart); err != nil {
			return n, err
		}
		c, err := io.CopyN(f, r, s.Len)
		n += c
		if err != nil {
			return n, err
		}
	}
	return n, f.Truncate(m.Size)
}
