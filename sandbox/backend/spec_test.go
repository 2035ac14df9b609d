package backend_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/backend"
)

func TestSpecValidate(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "cellbox")
	require.NoError(t, os.WriteFile(bin, []byte("x"), 0o755))
	good := backend.Spec{ID: "s1-box_a.b", AgentBinary: bin, HostDir: dir}
	caps := backend.Capabilities{MaxCPUs: 4}
	require.NoError(t, good.Validate(caps))

	tests := []struct {
		name   string
		mutate func(*backend.Spec)
		want   string
	}{
		{"empty id", func(s *backend.Spec) { s.ID = "" }, "box id"},
		{"id with slash", func(s *backend.Spec) { s.ID = "a/b" }, "box id"},
		{"id starting with a dot", func(s *backend.Spec) { s.ID = ".hidden" }, "box id"},
		{"id too long", func(s *backend.Spec) { s.ID = string(make([]byte, 129)) }, "box id"},
		{"relative agent", func(s *backend.Spec) { s.AgentBinary = "cellbox" }, "absolute"},
		{"missing agent", func(s *backend.Spec) { s.AgentBinary = "/nonexistent/cellbox" }, "no such file"},
		{"agent is a dir", func(s *backend.Spec) { s.AgentBinary = dir }, "not a regular file"},
		{"missing host dir", func(s *backend.Spec) { s.HostDir = filepath.Join(dir, "nope") }, "no such file"},
		{"host dir is a file", func(s *backend.Spec) { s.HostDir = bin }, "not a directory"},
		{"env name with =", func(s *backend.Spec) { s.Env = map[string]string{"A=B": "c"} }, "env"},
		{"env value with NUL", func(s *backend.Spec) { s.Env = map[string]string{"A": "a\x00"} }, "env"},
		{"negative pids", func(s *backend.Spec) { s.Limits.Pids = -1 }, "pids -1: want between 1 and 4194304"},
		{"pids past the kernel's maximum", func(s *backend.Spec) { s.Limits.Pids = backend.MaxPids + 1 }, "pids 4194305: want between 1 and 4194304"},
		{"tiny memory", func(s *backend.Spec) { s.Limits.MemoryBytes = 1 << 20 }, "memory_bytes 1048576: want at least 16 MiB"},
		{"negative memory", func(s *backend.Spec) { s.Limits.MemoryBytes = -1 }, "want at least 16 MiB"},
		{"more cpus than the host", func(s *backend.Spec) { s.Limits.CPUs = 1000 }, "cpus 1000: want between 0.01 and 4 (the CPU count of the machine boxes run on)"},
		{"more cpus than the backend's machine", func(s *backend.Spec) { s.Limits.CPUs = 5 }, "cpus 5: want between 0.01 and 4"},
		{"tiny cpus", func(s *backend.Spec) { s.Limits.CPUs = 0.001 }, "cpus 0.001: want between 0.01 and"},
		{"tiny disk", func(s *backend.Spec) { s.Limits.DiskBytes = 1 << 20 }, "disk_bytes 1048576: want between 64 MiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			tc.mutate(&s)
			assert.ErrorContains(t, s.Validate(caps), tc.want)
		})
	}
}

func TestLabels(t *testing.T) {
	s := backend.Spec{ID: "x", Labels: map[string]string{backend.LabelSession: "s", backend.LabelID: "spoofed"}}
	l := s.BoxLabels()
	assert.Equal(t, map[string]string{backend.LabelSession: "s", backend.LabelID: "x", backend.LabelManaged: "1"}, l)
	assert.Equal(t, "spoofed", s.Labels[backend.LabelID], "the spec's map is not modified")

	assert.True(t, backend.MatchLabels(l, nil))
	assert.True(t, backend.MatchLabels(l, map[string]string{backend.LabelSession: "s"}))
	assert.False(t, backend.MatchLabels(l, map[string]string{backend.LabelSession: "t"}))
	assert.False(t, backend.MatchLabels(l, map[string]string{"other": ""}))
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"a": true, "s1-box_a.b": true, strings.Repeat("a", 128): true,
		"": false, strings.Repeat("a", 129): false, "-a": false, ".a": false, "a/b": false, "a b": false, "ä": false,
	} {
		assert.Equal(t, ok, backend.ValidID(id) == nil, "%q", id)
	}
}
