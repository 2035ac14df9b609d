package local

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUIDRangeClashes(t *testing.T) {
	etc := t.TempDir()
	for name, body := range map[string]string{
		"passwd": "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbox:x:1900000005:100::/:/bin/false\n",
		"group":  "root:x:0:\nbig:x:1902097151:\n",
		"subuid": "alice:100000:65536\nwide:1899999000:2000\n",
		"subgid": "alice:100000:65536\nbelow:1899000000:1000000\n", // ends just below the range
	} {
		require.NoError(t, os.WriteFile(filepath.Join(etc, name), []byte(body), 0o644))
	}
	assert.Equal(t, []string{
		filepath.Join(etc, "passwd") + ": box",
		filepath.Join(etc, "group") + ": big",
		filepath.Join(etc, "subuid") + ": wide",
	}, uidRangeClashes(etc))
	assert.Empty(t, uidRangeClashes("/etc"), "this host's accounts use box uids")
}
