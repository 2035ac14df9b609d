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
dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -qx 'install ok installed' || need+=(chromium)
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
CGO_ENABLED=0 go build -o bin/ ./cmd/cellbox ./cmd/cellbox-agent
# cellbox with the cluster's clients (etcd, S3, Kubernetes): cellbox runs
# it for --etcd and --backend kubernetes (docs/cluster.md).
go vet -tags cluster ./cmd/cellbox
CGO_ENABLED=0 go build -tags cluster -o bin/cellbox-cluster ./cmd/cellbox
# The S3 blob store's tests (sandbox/blobs/s3blobs) run against a real
# S3-compatible server, versitygw, built from its Go module on first use
# (scripts/s3-server.sh; ~3 minutes from a cold Go build cache on 2 cores);
# each test starts its own (internal/s3test).
ts=$(date +%s)
bash scripts/s3-server.sh build
echo "test: s3 server build $(($(date +%s) - ts)) s"
# The kubernetes backend's tests run on a real two-node cluster of this
# machine: built from Go modules on first use (scripts/kube-cluster.sh;
# ~25 minutes from a cold Go build cache on 2 cores), started fresh, and
# taken down after the tests.
t0=$(date +%s)
bash scripts/kube-cluster.sh build
t1=$(date +%s)
bash scripts/kube-cluster.sh up
t2=$(date +%s)
trap 'bash scripts/kube-cluster.sh down >/dev/null 2>&1 || true' EXIT
echo "test: kube build $((t1 - t0)) s, cluster up $((t2 - t1)) s"
go test -race -count=1 -timeout 40m ./...
echo "test: go test $(($(date +%s) - t2)) s"
