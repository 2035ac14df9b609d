package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cellbox/cellbox/server"
)

// The kubernetes backend's environment is checked before any cluster is
// asked: a bad value says what it wants.
func TestKubeEnvRefused(t *testing.T) {
	for env, want := range map[string]string{
		KubeTolerationsEnv:   "want a JSON list of tolerations",
		KubeNetworkPolicyEnv: "want probe, enforced or unenforced",
		KubePullPolicyEnv:    "want IfNotPresent, Never or Always",
		KubeNodeSelectorEnv:  "want key=value pairs",
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, "[nope")
			_, err := server.OpenBackend(context.Background(), "kubernetes", t.TempDir(), "")
			assert.ErrorContains(t, err, want)
		})
	}
}
