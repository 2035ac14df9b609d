package jsonschema

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"sync"
	"sync/atomic"
)

// The schemas known to pass the metaschema, kept in a file across
// processes: checking a schema against draft 2020-12's metaschema first
// compiles that metaschema, 1-2 ms at the first compile of every process,
// which was a fifth of a `cellbox run --once` with nothing to do. A schema
// whose content hash the file names is compiled without the check. The
// file is a cache (a line per hash, appended, never synced): lost or
// deleted, the next compile checks again. Hand-written because the
// validator has no such cache; a one-line patch of it
// (Compiler.SkipMetaValidation) skips the check.
var known struct {
	sync.Mutex
	path   string                     // "": remember nothing
	hashes map[[sha256.Size]byte]bool // read from path on first use
}

// metaChecks counts the compiles that checked the metaschema (tests).
var metaChecks atomic.Int64

// RememberValid keeps the hashes of the schemas that passed the metaschema
// in the file at path (made 0600 if missing; its directory must exist),
// and compiles the schemas it names without checking them again. The
// file's owner can make a broken schema skip the check: keep it where only
// the owner of the data it guards writes (cellbox: the data dir).
func RememberValid(path string) {
	known.Lock()
	defer known.Unlock()
	if known.path != path {
		known.path, known.hashes = path, nil
	}
}

// checkedBefore reports whether the schema whose hash is key passed the
// metaschema before, per the file.
func checkedBefore(key [sha256.Size]byte) bool {
	known.Lock()
	defer known.Unlock()
	if known.path == "" {
		return false
	}
	if known.hashes == nil {
		known.hashes = map[[sha256.Size]byte]bool{}
		if data, err := os.ReadFile(known.path); err == nil {
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				var h [sha256.Size]byte
				if n, err := hex.Decode(h[:], sc.Bytes()); err == nil && n == len(h) {
					known.hashes[h] = true
				}
			}
		}
	}
	return known.hashes[key]
}

// passed records that the schema whose hash is key passed the metaschema.
func passed(key [sha256.Size]byte) {
	known.Lock()
	defer known.Unlock()
	if known.path == "" || known.hashes[key] {
		return
	}
	if known.hashes != nil {
		known.hashes[key] = true
	}
	f, err := os.OpenFile(known.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return // a cache: the next process checks again
	}
	f.WriteString(hex.EncodeToString(key[:]) + "\n")
	f.Close()
}
