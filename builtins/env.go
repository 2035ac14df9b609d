package builtins

import (
	"errors"
	"log/slog"
	"time"

	"github.com/cellbox/cellbox/sandboxclient"
)

// Env is what the box-driving node kinds (exec, sandbox) need from their
// host: a client of the sandbox service (one session: box names are per
// session) and a logger.
type Env struct {
	// Client drives the boxes. Required by exec and sandbox nodes.
	Client sandboxclient.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// LLM is where llm nodes find their providers.
	LLM LLMEnv
}

func (e Env) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.Default()
	}
	return e.Logger
}

func (e Env) check() error {
	if e.Client == nil {
		return errors.New("no sandbox client: exec and sandbox nodes need builtins.Env.Client")
	}
	return nil
}

// cleanupTimeout bounds destroying a box after its run (also on abort).
const cleanupTimeout = 30 * time.Second
