package patterns

import (
	"io/fs"
	"os"
)

// folderFS is a pattern folder as an fs.FS whose paths cannot leave it,
// through a symbolic link either: os.DirFS follows a link anywhere, so a
// `{file: x}` whose x links to /etc/shadow would read that. Each call opens
// the folder as an os.Root (which refuses escapes), so nothing stays open
// between loads.
type folderFS string

func (d folderFS) root(op, name string) (*os.Root, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return os.OpenRoot(string(d))
}

// Open opens name in the folder.
func (d folderFS) Open(name string) (fs.File, error) {
	r, err := d.root("open", name)
	if err != nil {
		return nil, err
	}
	defer r.Close() // the file stays open
	return r.Open(name)
}

// Stat stats name in the folder without opening it (a FIFO would block
// an open).
func (d folderFS) Stat(name string) (fs.FileInfo, error) {
	r, err := d.root("stat", name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.Stat(name)
}
