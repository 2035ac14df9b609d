// Package sparse copies into a file leaving holes where the data is zeros,
// so that a file of a gigabyte of zeros (`truncate -s 1G f`) takes no disk
// when it is copied: into the snapshot store, or back into a box.
//
// Hand-written: Go has no sparse copy, and cp --sparse=always, which does
// the same, is a process per file.
package sparse

import (
	"bytes"
	"io"
	"os"
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
