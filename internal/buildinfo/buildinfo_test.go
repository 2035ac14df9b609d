package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestVersionLine: the version names the commit the build recorded, and
// says so when it recorded none (it used to print nothing in its place).
func TestVersionLine(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	mod := debug.Module{Path: "github.com/cellbox/cellbox", Version: "(devel)"}
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"commit", &debug.BuildInfo{GoVersion: "go1.26.8", Main: mod, Settings: vcs("vcs.revision", "65e041ffe446a1b2c3d4", "vcs.time", "2026-11-23T05:58:33Z", "vcs.modified", "false")},
			"cellbox (devel) commit 65e041ffe446 2026-11-23T05:58:33Z go1.26.8"},
		{"dirty", &debug.BuildInfo{GoVersion: "go1.26.8", Main: mod, Settings: vcs("vcs.revision", "65e041ffe446a1b2c3d4", "vcs.time", "2026-11-23T05:58:33Z", "vcs.modified", "true")},
			"cellbox (devel) commit 65e041ffe446+dirty 2026-11-23T05:58:33Z go1.26.8"},
		{"no vcs", &debug.BuildInfo{GoVersion: "go1.26.8", Main: mod, Settings: vcs("-buildmode", "exe")},
			"cellbox (devel) (no commit recorded: build from a git checkout with -buildvcs=true to record it) go1.26.8"},
		{"no build info", nil, "cellbox (no build info)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Line("cellbox", tc.info))
		})
	}
}

// TestSameSource: one clean commit is the same source; another commit,
// another Go or another dependency is not; a build without its commit or
// of a changed tree cannot say.
func TestSameSource(t *testing.T) {
	build := func(goVersion, dep string, kv ...string) *debug.BuildInfo {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return &debug.BuildInfo{GoVersion: goVersion, Main: debug.Module{Path: "github.com/cellbox/cellbox", Version: "(devel)"},
			Deps: []*debug.Module{{Path: "go.etcd.io/bbolt", Version: dep}}, Settings: s}
	}
	clean := func(rev string) []string { return []string{"vcs.revision", rev, "vcs.modified", "false"} }
	for _, tc := range []struct {
		name string
		a, b *debug.BuildInfo
		want Verdict
	}{
		{"one clean commit", build("go1.26.8", "v1.4.3", clean("abc")...), build("go1.26.8", "v1.4.3", clean("abc")...), Same},
		{"two commits", build("go1.26.8", "v1.4.3", clean("abc")...), build("go1.26.8", "v1.4.3", clean("def")...), Different},
		{"another Go", build("go1.26.8", "v1.4.3", clean("abc")...), build("go1.26.7", "v1.4.3", clean("abc")...), Different},
		{"another dependency", build("go1.26.8", "v1.4.3", clean("abc")...), build("go1.26.8", "v1.4.2", clean("abc")...), Different},
		{"a changed tree", build("go1.26.8", "v1.4.3", "vcs.revision", "abc", "vcs.modified", "true"), build("go1.26.8", "v1.4.3", "vcs.revision", "abc", "vcs.modified", "true"), Unknown},
		{"no commit recorded", build("go1.26.8", "v1.4.3"), build("go1.26.8", "v1.4.3"), Unknown},
		{"no build info", build("go1.26.8", "v1.4.3"), nil, Different},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, SameSource(tc.a, tc.b))
		})
	}
}
