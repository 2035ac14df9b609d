package sandbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandbox/backend"
)

// TestSandboxCreateRefusesBadSpec: env and limits a box cannot run with are
// refused by sandbox_create itself, as invalid input, whether the box would
// come from the warm pool or the backend and whether the name exists.
// Before, a box from the warm pool took {"": "x"} or {"A=B": "x"} as env
// and every later shell failed; limits the backend refused came back as
// "internal" errors, and pids past the kernel's maximum as runc's error.
func TestSandboxCreateRefusesBadSpec(t *testing.T) {
	rb := newRealService(t, "local", func(c *Config) { c.Pool = map[string]int{backend.DefaultImage: 1} })
	rb.ok("sandbox_create", map[string]any{"sandbox": "existing"})
	tests := []struct {
		name  string
		input map[string]any
		want  string
	}{
		{"empty env name", map[string]any{"env": map[string]string{"": "x"}}, `env "": names must be non-empty`},
		{"env name with =", map[string]any{"env": map[string]string{"A=B": "x"}}, `env "A=B": names must be non-empty`},
		{"NUL in an env value", map[string]any{"env": map[string]string{"A": "x\x00y"}}, `env "A"`},
		{"memory below the minimum", map[string]any{"limits": map[string]any{"memory_bytes": 1}}, "memory_bytes 1: want at least 16 MiB"},
		{"pids past the kernel's maximum", map[string]any{"limits": map[string]any{"pids": 99999999999}}, "pids 99999999999: want"},
		{"cpus too small", map[string]any{"limits": map[string]any{"cpus": 1e-300}}, "cpus 1e-300: want between"},
		{"disk too big", map[string]any{"limits": map[string]any{"disk_bytes": int64(1) << 62}}, "disk_bytes"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, name := range []string{fmt.Sprint("fresh", i), "existing"} {
				// Let the pool fill, so a fresh box would be a warm one.
				require.Eventually(t, func() bool {
					return rb.s.pools.Ready()[backend.DefaultImage] == 1
				}, time.Minute, 10*time.Millisecond)
				in := map[string]any{"sandbox": name}
				for k, v := range tt.input {
					in[k] = v
				}
				m := rb.call("sandbox_create", in)
				require.Equal(t, true, m["is_error"], "%s: %v", name, m)
				assert.Equal(t, api.CodeInvalidInput, m["code"], "%s: %v", name, m["error"])
				assert.Contains(t, m["error"], tt.want, name)
			}
			list := rb.ok("sandbox_list", map[string]any{})
			assert.Len(t, list["sandboxes"], 1, "only the existing box: %v", list)
		})
	}
}

// TestSandboxCreateExistingSaysWhatItKept: sandbox_create of a name that
// exists, with other limits or env, says they were left as they are (before:
// only image and network changes had a notice; new limits vanished silently).
func TestSandboxCreateExistingSaysWhatItKept(t *testing.T) {
	rb := newRealService(t, "local", nil)
	rb.ok("sandbox_create", map[string]any{"sandbox": "a", "env": map[string]string{"A": "1"}})
	m := rb.ok("sandbox_create", map[string]any{"sandbox": "a", "env": map[string]string{"A": "2"}, "limits": map[string]any{"memory_bytes": 64 << 20}})
	assert.Equal(t, false, m["created"])
	assert.Contains(t, m["notice"], `sandbox "a" already exists; its limits were left as they are (destroy it first to change them)`)
	assert.Contains(t, m["notice"], `sandbox "a" already exists; its env was left as it is (destroy it first to change it, or pass env to each shell call)`)
	// The same settings again: nothing to say.
	m = rb.ok("sandbox_create", map[string]any{"sandbox": "a", "env": map[string]string{"A": "1"}})
	assert.Nil(t, m["notice"])
}

// TestImageErrorCodes: an image name that is no image reference is the
// caller's mistake (invalid_input, before any backend call); an image the
// backend does not have is not_found, saying how to get it (a build only
// of an image `cellbox image build` makes); on both
// backends.
func TestImageErrorCodes(t *testing.T) {
	for _, kind := range []string{"local", "docker"} {
		t.Run(kind, func(t *testing.T) {
			rb := newRealService(t, kind, nil)
			m := rb.call("sandbox_create", map[string]any{"sandbox": "a", "image": "HOST"})
			require.Equal(t, true, m["is_error"], "%v", m)
			assert.Equal(t, api.CodeInvalidInput, m["code"], "%v", m)
			assert.Contains(t, m["error"], "cellbox/python")
			m = rb.call("sandbox_create", map[string]any{"sandbox": "b", "image": "cellbox/no-such-image"})
			require.Equal(t, true, m["is_error"], "%v", m)
			assert.Equal(t, api.CodeNotFound, m["code"], "%v", m)
			// No build is proposed that `cellbox image build` would refuse.
			assert.Contains(t, m["error"], "`cellbox image build` makes only cellbox/base, cellbox/node, cellbox/python")
			assert.NotContains(t, m["error"], "cellbox image build no-such-image")
		})
	}
}
