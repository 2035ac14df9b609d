#!/usr/bin/env bash
# The test command: formatting, vet, and every test (Docker and bubblewrap
# included) with the race detector. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Chromium opens a box's preview page in the HTTP attack suite
# (cmd/cellbox/security_http_test.go); node runs JavaScript code contexts
# in the default image (the host's /usr, sandbox/code_test.go). Only the
# tests need them.
need=()
dpkg -s chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
if [ ${#need[@]} -gt 0 ]; then
	echo "test: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
export CI="${CI:-1}"

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
CGO_ENABLED=0 go build -o bin/cellbox ./cmd/cellbox
go test -race -count=1 -timeout 40m ./...
