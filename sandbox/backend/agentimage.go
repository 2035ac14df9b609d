package backend

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
)

// AgentImagePrefix names the images that carry only the agent binary (a
// Kubernetes box's init container, a remote engine's agent volume).
const AgentImagePrefix = "cellbox/agent:"

// agentImages remembers AgentImage by the binary's path, size and time:
// hashing ~40 MB at every box would cost more than making the box.
var agentImages sync.Map

// AgentImage is the name of the agent image of the cellbox binary at path:
// cellbox/agent:<the first 16 hex digits of its SHA-256>, so that no box
// ever runs another build's agent under the same name.
func AgentImage(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	stamp := path + ":" + strconv.FormatInt(fi.Size(), 10) + ":" + strconv.FormatInt(fi.ModTime().UnixNano(), 10)
	if ref, ok := agentImages.Load(stamp); ok {
		return ref.(string), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	ref := AgentImagePrefix + hex.EncodeToString(h.Sum(nil))[:16]
	agentImages.Store(stamp, ref)
	return ref, nil
}
