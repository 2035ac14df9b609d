#!/usr/bin/env bash
# The S3-compatible server the tests of the S3 blob store run against
# (sandbox/blobs/s3blobs, through internal/s3test, which starts one per test
# as a child process: this script starts no daemon):
#
#   bash scripts/s3-server.sh build   build it into /var/lib/cellbox-s3/bin,
#                                     unless that version is there already
#   bash scripts/s3-server.sh path    print the binary's path
#
# The server is versitygw (github.com/versity/versitygw, Apache-2.0), a
# gateway serving the S3 API from a POSIX directory, with conditional PUTs
# (If-None-Match: *), checksums and multipart uploads; built from its Go
# module by `go install` (its go.mod has no replace directive, so no scratch
# module is needed), statically and stripped, its version stamped in so
# that build can tell it is current (`versitygw --version`).
#
# Why versitygw and not SeaweedFS, measured here (2026-12-02, 2 cores, each
# from a Go build cache of its own, empty): versitygw v1.8.0 downloads its
# modules in 12 s and builds in 176 s wall, 238 CPU-s, 650 MB of memory at
# most, a 45 MB binary; SeaweedFS (v0.0.0-20261109003541-7506e5f91cd6, whose
# go.mod has a replace directive, so it needs a scratch module) downloads
# for 97 s and builds in 907 CPU-s (22 min wall under nice beside other
# work; ~8 min on 2 idle cores, estimated), 2.2 GB of memory at most, a
# 164 MB binary. CI's budget is 90 minutes. SeaweedFS was not run against
# the tests: versitygw passes all of them (it honours If-None-Match: * on
# PUT and on completing a multipart upload, and checks
# x-amz-checksum-sha256).
set -euo pipefail

VERSION=v1.8.0
ROOT=/var/lib/cellbox-s3
BIN=$ROOT/bin/versitygw

built() {
	local v
	[ -x "$BIN" ] && v=$("$BIN" --version 2>/dev/null) && grep -qx "Version *: $VERSION" <<<"$v"
}

build() {
	if built; then
		echo "s3-server: versitygw $VERSION is built ($BIN)"
		return
	fi
	command -v go >/dev/null || { echo "s3-server: Go is required" >&2; exit 1; }
	mkdir -p "$ROOT/bin"
	# Into a directory of its own, then renamed into place: a build that
	# fails or is killed leaves no binary that tests would take.
	local start
	TMP=$(mktemp -d "$ROOT/bin.XXXXXX")
	trap 'rm -rf "$TMP"' EXIT
	start=$(date +%s)
	# GOFLAGS of the caller's (-mod=…) are for cellbox's module, not this one.
	(cd "$ROOT" && GOFLAGS= GOWORK=off CGO_ENABLED=0 GOBIN="$TMP" \
		go install -trimpath -ldflags "-s -w -X main.Version=$VERSION" \
		"github.com/versity/versitygw/cmd/versitygw@$VERSION")
	mv -f "$TMP/versitygw" "$BIN"
	built || { echo "s3-server: $BIN does not say it is $VERSION" >&2; exit 1; }
	echo "s3-server: built versitygw $VERSION in $(($(date +%s) - start)) s ($BIN, $(stat -c %s "$BIN") bytes)"
}

case "${1:-}" in
build) build ;;
path) echo "$BIN" ;;
*)
	echo "usage: $0 build | path" >&2
	exit 2
	;;
esac
