package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The server key guards what a session token does not: creating and listing
// sessions, the runtime API on TCP, the web page and /metrics. It is made
// once per data directory and kept there, readable by its owner only, so
// that the CLI of the same user finds it and nobody else does.
const (
	// KeyFile is the server key's file in the data directory:
	// DATA/server.key.
	KeyFile = "server.key"
	// KeyEnv, when set, is the key of servers and clients alike, in place
	// of the file.
	KeyEnv = "CELLBOX_KEY"
	// URLFile holds the URL of the server over DATA while it runs (serve,
	// and run's own), so that commands given --data find one on another
	// --addr than the default.
	URLFile = "server.url"
)

// ServerKey returns the key a server uses: CELLBOX_KEY if set, else the
// file at path (DATA/server.key unless --key-file, Host.KeyPath), made
// with a new random key on first start. created says the file was just
// made (the key is printed then).
func ServerKey(path string) (key string, created bool, err error) {
	if k := strings.TrimSpace(os.Getenv(KeyEnv)); k != "" {
		return k, false, nil
	}
	if k, err := ReadKey(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, false, err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", false, fmt.Errorf("make a server key: %w", err)
	}
	key = hex.EncodeToString(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, fmt.Errorf("create the key's directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) { // another process made it first: use theirs
		k, err := ReadKey(path)
		return k, false, err
	}
	if err != nil {
		return "", false, fmt.Errorf("write the server key: %w", err)
	}
	_, err = f.WriteString(key + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", false, fmt.Errorf("write the server key %s: %w", path, err)
	}
	return key, true, nil
}

// ReadKey reads a key file, refusing one that others may read.
func ReadKey(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("server key %s is readable by others (mode %o): chmod 600 it, or delete it to make a new key", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	k := strings.TrimSpace(string(b))
	if k == "" {
		return "", fmt.Errorf("server key %s is empty: delete it to make a new key", path)
	}
	return k, nil
}

// ClientKey is the key a client sends: CELLBOX_KEY, else DATA/server.key of
// the data directory the server uses (same user, same machine), else "".
func ClientKey(dataDir string) string {
	if k := strings.TrimSpace(os.Getenv(KeyEnv)); k != "" {
		return k
	}
	k, _ := ReadKey(filepath.Join(dataDir, KeyFile))
	return k
}

// KeyPath is the key file of h's HTTP server: HTTPOptions.KeyFile, else
// DATA/server.key.
func (h *Host) KeyPath() string {
	if h.opts.KeyFile != "" {
		return h.opts.KeyFile
	}
	return filepath.Join(h.dataDir, KeyFile)
}
