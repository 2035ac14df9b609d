#!/usr/bin/env bash
# A real Kubernetes cluster for cellbox's kubernetes backend, on this
# machine, with nothing downloaded but Go modules and Debian packages
# (issue 21). Steps:
#
#   bash scripts/kube-cluster.sh build [BIN]   the binaries, from Go modules
#
# build compiles kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet and kubectl of Kubernetes v1.34.4 from the k8s.io/kubernetes
# module (scripts/kube/go.mod says why a module of its own) into BIN
# (default /var/lib/cellbox-kube/bin), statically and stripped. It skips a
# binary that is there and newer than scripts/kube/go.sum. From a cold Go
# build cache it is ~1,400 CPU-seconds (kube-apiserver ~1,000 of them) and
# ~3 GB of cache: measured here (2026-12-02, under nice beside a loaded
# test run) kube-apiserver 5,778 s, then with the cache it left
# controller-manager 134 s, scheduler 11 s, kubelet 42 s, kubectl 53 s;
# a second build 0.2 s. Bringing the cluster up (containerd, etcd, the control plane,
# two kubelets in network namespaces of their own, a NetworkPolicy
# enforcer) comes next: ../shared/labs/kubernetes/ is the recipe it
# follows.
set -euo pipefail
cd "$(dirname "$0")"
V=v1.34.4

build() {
	local bin="${1:-/var/lib/cellbox-kube/bin}"
	mkdir -p "$bin"
	local ld="-s -w"
	local p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $p.gitVersion=$V -X $p.gitMajor=1 -X $p.gitMinor=34"
	done
	local c start
	for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
		if [ -x "$bin/$c" ] && [ "$bin/$c" -nt kube/go.sum ]; then
			echo "kube: $c is built ($bin/$c)"
			continue
		fi
		start=$(date +%s)
		(cd kube && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$bin/$c.part" "k8s.io/kubernetes/cmd/$c")
		mv "$bin/$c.part" "$bin/$c"
		echo "kube: built $c in $(($(date +%s) - start)) s ($(stat -c %s "$bin/$c") bytes)"
	done
	"$bin/kubectl" version --client | head -1
}

case "${1:-}" in
build) shift; build "$@" ;;
*)
	echo "usage: $0 build [BIN]" >&2
	exit 2
	;;
esac
