#!/usr/bin/env bash
# The test command: formatting, vet, and every test (Docker and bubblewrap
# included) with the race detector. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CI="${CI:-1}"

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
CGO_ENABLED=0 go build -o bin/cellbox ./cmd/cellbox
go test -race -count=1 -timeout 40m ./...
