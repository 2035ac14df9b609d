package server

import (
	dbuildinfo "debug/buildinfo"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/cellbox/cellbox/internal/buildinfo"
	"github.com/cellbox/cellbox/sandbox/backend"
	"github.com/cellbox/cellbox/sandbox/docker"
	"github.com/cellbox/cellbox/sandbox/local"
)

// mountsAgent says whether be puts the host's agent binary into its
// boxes as it is (local, docker): the backends whose agent images are
// built and loaded by hand (kubernetes, a remote engine) keep this
// executable, the binary `cellbox image agent` makes their images of.
func mountsAgent(be backend.Backend) bool {
	switch be.(type) {
	case *local.Backend, *docker.Backend:
		return true
	}
	return false
}

// AgentName is the agent-only binary (cmd/cellbox-agent) the server looks
// for beside its own executable.
const AgentName = "cellbox-agent"

// AgentBinary is the binary boxes of the local and docker backends run as
// their agent when none is given: cellbox-agent beside this executable
// when it is of the same source as this binary, else "" — this executable
// itself. cellbox-agent holds the agent's packages alone and starts in a
// fraction of the time (cmd/cellbox-agent). Of the same source: built
// from one clean commit (buildinfo.SameSource), or, where a build did not
// record its commit (-buildvcs=false) or was of a changed work tree, with
// the same module, Go and dependencies and built together — its file not
// older than this one's by more than agentSlack, as `go build -o bin/
// ./cmd/cellbox ./cmd/cellbox-agent` makes them; a cellbox rebuilt alone
// later runs itself. A mismatch the check lets through is still caught by
// the agent's protocol version, as for the agents of a remote engine or a
// cluster, which are built on their own.
func AgentBinary(log *slog.Logger) string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	mine, _ := debug.ReadBuildInfo()
	return agentBeside(self, mine, log)
}

// AgentBeside is AgentBinary for the cellbox binary at path (a process
// that is not cellbox itself, as cellbox-bench, runs boxes with it).
func AgentBeside(cellbox string, log *slog.Logger) string {
	info, err := dbuildinfo.ReadFile(cellbox)
	if err != nil {
		return ""
	}
	return agentBeside(cellbox, info, log)
}

func agentBeside(self string, mine *debug.BuildInfo, log *slog.Logger) string {
	path := filepath.Join(filepath.Dir(self), AgentName)
	agentFile, err := os.Stat(path)
	if err != nil {
		return ""
	}
	selfFile, err := os.Stat(self)
	if err != nil {
		return ""
	}
	theirs, _ := dbuildinfo.ReadFile(path) // nil when unreadable: not the same source
	same := buildinfo.SameSource(mine, theirs)
	if same == buildinfo.Unknown && !agentFile.ModTime().Before(selfFile.ModTime().Add(-agentSlack)) {
		same = buildinfo.Same
	}
	if same != buildinfo.Same {
		if log != nil {
			log.Info("boxes run this binary as their agent: the cellbox-agent beside it is not of the same source (another commit, or built apart from it)",
				"agent", path, "this", buildinfo.Line("cellbox", mine), "beside", buildinfo.Line(AgentName, theirs))
		}
		return ""
	}
	return path
}

// agentSlack is how much older than cellbox a cellbox-agent built with
// it may be (go build links the two one after the other).
const agentSlack = 2 * time.Minute
