#!/usr/bin/env bash
# A real two-node Kubernetes cluster for cellbox's kubernetes backend, on
# this machine, with nothing downloaded but Go modules and Debian packages
# (issue 21). Run as root:
#
#   bash scripts/kube-cluster.sh build [BIN]   the binaries, from Go modules
#   bash scripts/kube-cluster.sh up            start the cluster (builds what is missing)
#   bash scripts/kube-cluster.sh down          stop it and remove every trace but BIN
#   bash scripts/kube-cluster.sh status        processes alive, memory, nodes' Ready state
#   bash scripts/kube-cluster.sh env           export KUBECONFIG=... lines for tests
#   bash scripts/kube-cluster.sh load FILE.tar...   import OCI archives into every node
#   bash scripts/kube-cluster.sh kill-node N   node N dies: kill -9 its kubelet,
#                                              containerd, shims, pods, enforcer
#   bash scripts/kube-cluster.sh start-node N  node N comes back
#   bash scripts/kube-cluster.sh test-image [OUT.tar]  busybox (busybox-static)
#                                              packed as docker.io/cellbox/kubetest:1
#
# build compiles kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet and kubectl of Kubernetes v1.34.4 from the k8s.io/kubernetes
# module (scripts/kube/go.mod says why a module of its own), and kube-router
# v2.1.0 (scripts/kube-router/go.mod), into BIN (default
# /var/lib/cellbox-kube/bin), statically and stripped; and the pause image
# (gcc -static of the kubernetes module's build/pause/linux/pause.c, packed
# as an OCI archive by mkoci below) into /var/lib/cellbox-kube/images. It
# skips what is built and newer than its go.sum. From a cold Go build cache
# it is ~1,400 CPU-seconds (kube-apiserver ~1,000 of them) and ~3 GB of
# cache: measured here (2026-12-02, under nice beside a loaded test run)
# kube-apiserver 5,778 s, then with the cache it left controller-manager
# 134 s, scheduler 11 s, kubelet 42 s, kubectl 53 s; kube-router 2.1.0
# 250 s (~410 CPU-s); a second build 0.2 s.
#
# Topology (all state in /var/lib/cellbox-kube/cluster, "S" below):
#
#   host: etcd (Debian etcd-server, 127.0.0.1:23790, --unsafe-no-fsync),
#         kube-apiserver (10.250.0.1:6443), kube-controller-manager,
#         kube-scheduler; bridge cbk0 10.250.0.1/24; routes
#         10.244.1.0/24 via 10.250.0.11 and 10.244.2.0/24 via 10.250.0.12.
#   node cbk-n1 / cbk-n2: network namespace cbk-n1 / cbk-n2, eth0
#         10.250.0.11 / .12 (a veth onto cbk0), default route via
#         10.250.0.1, a route to the other node's pod CIDR via its IP,
#         ip_forward on; a containerd of its own (S/nN/containerd, socket
#         S/nN/run/containerd.sock) run with nsenter --net only, so its mount
#         namespace is the host's; a kubelet of its own in the node's netns
#         and a private mount namespace; pods on a CNI bridge "cni0" in the
#         node's netns, pod CIDR 10.244.1.0/24 / 10.244.2.0/24 (also set as
#         the node's spec.podCIDR); kube-router's NetworkPolicy controller
#         (firewall only) in the node's netns, so its iptables chains and
#         ipsets are the node's own.
#   admin kubeconfig: S/admin.kubeconfig (https://10.250.0.1:6443).
#   every process the cluster runs is under nice -n 10.
#   pause image: cellbox.local/pause:3.10 (the sandbox image of both
#   containerds). No kube-proxy (Service ClusterIPs do not route), no DNS,
#   no way out to the internet from pods: pod IPs and the host only.
#
# Traps met on this machine kind (2 cores, cgroup v1 hybrid, Docker present):
# - containerd needs restrict_oom_score_adj = true: the VM lacks
#   CAP_SYS_RESOURCE, so the pause container's oom_score_adj -998 is refused
#   and runc fails with "can't get final child's PID from pipe: EOF".
# - the kubelet would rewrite host sysctls (vm.overcommit_memory,
#   vm.panic_on_oom, kernel.panic, kernel.panic_on_oops,
#   kernel.keys.root_max*): it runs in a private mount namespace where files
#   holding the wanted values are bind-mounted over them. Its root dir is a
#   shared bind mount so the volumes it mounts there reach containerd, which
#   is in the host's mount namespace; /var/lib/kubelet (device-plugins is
#   hard-coded there) is a per-node directory bind-mounted in that namespace.
#   That namespace is made with --propagation unchanged (the root dir must
#   stay a peer of the host's) and / and /proc made slaves in it before the
#   bind mounts, so on a host whose / is shared (systemd) they do not leak.
# - two kubelets on one host: each has a cgroupRoot of its own (/cbk-nN,
#   created here, in every hierarchy) so their kubepods trees don't collide;
#   /var/log/containers is shared (the kubelet hard-codes it; names are
#   unique per container).
# - the controller-manager needs --use-service-account-credentials=true;
#   --node-monitor-grace-period=20s marks a dead node Ready=Unknown (what
#   a node that stops posting shows, not False) in 12-17 s.
# - Docker sets the host's FORWARD policy to DROP and
#   bridge-nf-call-iptables=1, so frames bridged by cbk0 between the nodes
#   are dropped: one rule "-i cbk0 -o cbk0 -j ACCEPT" (comment cellbox-kube)
#   at the top of FORWARD, removed by down.
# - NetworkPolicy: this kernel has no nft queue (CONFIG_NFT_QUEUE unset), so
#   sigs.k8s.io/kube-network-policies cannot work; kube-router's controller
#   needs only ip_set, xt_set, physdev, conntrack, comment, addrtype, mark,
#   limit, multiport, NFLOG, which it has, and the ipset binary.
# - cellbox images are named docker.io/cellbox/NAME:latest: a ":latest"
#   image is pulled by default, so pods need imagePullPolicy: Never (or
#   IfNotPresent); nothing can be pulled.
# - Debian's busybox-static 1.35 wget segfaults (on the host too): the
#   checks use nc ("printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 IP 8080").
# - pid 1 of these VMs reaps orphans ~2 s late: waiting for a killed
#   process treats a zombie as gone.
#
# Figures measured here (2026-12-02, 2 cores, 24 GB, other jobs light):
# - up from built binaries to both nodes Ready, kube-router running and the
#   default service account there: 14-21 s (certificates 1-2 s, network 1 s,
#   two containerds + pause image 1-3 s, etcd 1 s, kube-apiserver ready 4-6
#   s, nodes Ready 4-5 s, kube-router + service account 3 s); up when up:
#   0.8 s; down 1-5 s.
# - two pods (one a node) created -> Ready 3-4 s; kubectl exec 0.35-0.5 s;
#   port-forward first request 0.1 s; a NetworkPolicy takes effect in <= 2 s
#   and its removal in ~1 s.
# - kill-node 2: 1.6 s; cbk-n2 Ready=Unknown 12-17 s later; start-node 2-6
#   s, its pods running again (restarted, new IPs) 5-7 s after.
# - memory: 820-900 MiB RSS for the whole cluster without pods (the
#   apiserver grows with use), ~890 with 3 pods (kube-apiserver
#   265, controller-manager 109, kubelets 81-85 each, scheduler 63,
#   kube-routers 55 each, containerds 43-48 each, etcd 47, a shim 13 per
#   pod; a busybox pod's processes ~1-2 MiB). `status` prints the sum.
set -euo pipefail
cd "$(dirname "$0")"
V=v1.34.4
TOP=/var/lib/cellbox-kube
BIN=$TOP/bin
IMG=$TOP/images
S=$TOP/cluster
PAUSE=cellbox.local/pause:3.10
TESTIMAGE=docker.io/cellbox/kubetest:1
NODES="1 2"
APISERVER=https://10.250.0.1:6443
SVC_CIDR=10.96.0.0/16
KUBECTL="$BIN/kubectl --kubeconfig=$S/admin.kubeconfig"
NICE="nice -n 10"

T0=$(date +%s.%N)
mark() { echo "kube: T+$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s  $*"; }
die() { echo "kube: $*" >&2; exit 1; }

nodeip() { echo "10.250.0.1$1"; }
podcidr() { echo "10.244.$1.0/24"; }

# ---------------------------------------------------------------- build

build() {
	local bin="${1:-$BIN}"
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
	if [ -x "$bin/kube-router" ] && [ "$bin/kube-router" -nt kube-router/go.sum ]; then
		echo "kube: kube-router is built ($bin/kube-router)"
	else
		start=$(date +%s)
		(cd kube-router && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/kube-router.part" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)
		mv "$bin/kube-router.part" "$bin/kube-router"
		echo "kube: built kube-router in $(($(date +%s) - start)) s ($(stat -c %s "$bin/kube-router") bytes)"
	fi
	pause_image
	# sed, not head: head exits after one line, and kubectl, cut off before its
	# second, dies of SIGPIPE, which pipefail makes this build's failure.
	"$bin/kubectl" version --client | sed -n 1p
}

# mkoci ROOTFS NAME OUT.tar ENTRYPOINT_JSON: an OCI image archive of one
# layer, as `ctr images import` takes it (io.containerd.image.name names it).
mkoci() {
	local root=$1 name=$2 out=$3 ep=$4 w ld ls cd cs md ms
	w=$(mktemp -d "$IMG/oci.XXXXXX")
	mkdir -p "$w/blobs/sha256"
	tar -C "$root" --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -cf "$w/layer.tar" .
	ld=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
	ls=$(stat -c %s "$w/layer.tar")
	mv "$w/layer.tar" "$w/blobs/sha256/$ld"
	printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin:/usr/bin"],"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$ep" "$ld" >"$w/c"
	cd=$(sha256sum "$w/c" | cut -d' ' -f1)
	cs=$(stat -c %s "$w/c")
	mv "$w/c" "$w/blobs/sha256/$cd"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' "$cd" "$cs" "$ld" "$ls" >"$w/m"
	md=$(sha256sum "$w/m" | cut -d' ' -f1)
	ms=$(stat -c %s "$w/m")
	mv "$w/m" "$w/blobs/sha256/$md"
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' "$md" "$ms" "$name" "${name##*:}" >"$w/index.json"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci-layout"
	tar -C "$w" -cf "$out.part" oci-layout index.json blobs
	mv "$out.part" "$out"
	rm -rf "$w"
}

pause_image() {
	mkdir -p "$IMG"
	if [ -s "$IMG/pause.tar" ] && [ "$IMG/pause.tar" -nt kube/go.sum ]; then
		echo "kube: the pause image is built ($IMG/pause.tar)"
		return
	fi
	need gcc
	local src
	src="$(cd kube && go env GOMODCACHE)/k8s.io/kubernetes@$V/build/pause/linux/pause.c"
	[ -f "$src" ] || (cd kube && go mod download k8s.io/kubernetes)
	rm -rf "$IMG/pause-root"
	mkdir -p "$IMG/pause-root"
	gcc -Os -static -DVERSION="$V-cellbox" -o "$IMG/pause-root/pause" "$src"
	strip "$IMG/pause-root/pause"
	mkoci "$IMG/pause-root" "$PAUSE" "$IMG/pause.tar" '["/pause"]'
	rm -rf "$IMG/pause-root"
	echo "kube: built the pause image $PAUSE ($IMG/pause.tar)"
}

# test_image [OUT]: Debian's static busybox as an image with sh, httpd, nc,
# wget..., for the cluster's own checks and the backend's tests.
test_image() {
	local out="${1:-$IMG/kubetest.tar}"
	need busybox-static
	mkdir -p "$IMG"
	local r
	r=$(mktemp -d "$IMG/root.XXXXXX")
	mkdir -p "$r/bin" "$r/tmp" "$r/etc"
	cp /bin/busybox "$r/bin/busybox"
	local a
	for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$r/bin/$a"; done
	echo 'root:x:0:0:root:/:/bin/sh' >"$r/etc/passwd"
	echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >>"$r/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$r/etc/group"
	chmod 1777 "$r/tmp"
	mkoci "$r" "$TESTIMAGE" "$out" '["/bin/sh"]'
	rm -rf "$r"
	echo "kube: $TESTIMAGE in $out"
}

# ---------------------------------------------------------------- helpers

# need PKG...: install Debian packages that are missing (CI starts fresh).
need() {
	local miss=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || miss+=("$p")
	done
	[ ${#miss[@]} -eq 0 ] && return
	echo "kube: apt-get install ${miss[*]} (log: $TOP/apt.log)"
	mkdir -p "$TOP"
	export DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l
	apt-get install -y --no-install-recommends "${miss[@]}" >>"$TOP/apt.log" 2>&1 ||
		{ apt-get update >>"$TOP/apt.log" 2>&1 && apt-get install -y --no-install-recommends "${miss[@]}" >>"$TOP/apt.log" 2>&1; } ||
		die "apt-get install ${miss[*]} failed: see $TOP/apt.log"
}

# alive NAME: the process recorded in S/run/NAME.pid runs and is ours (its
# command line names the state dir: no pid reuse fools it).
alive() {
	local f=$S/run/$1.pid p
	[ -f "$f" ] || return 1
	p=$(cat "$f")
	[ -n "$p" ] || return 1
	local c
	c=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || return 1
	[[ $c == *"$S"* ]]
}

# running PID: the process exists and is not a zombie (pid 1 may be slow to
# reap what it inherits).
running() {
	local st
	st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# stop SIGNAL NAME...: signal the recorded processes (TERM or KILL), then
# wait for them, KILL after 10 s.
stop() {
	local sig=$1 n p ps=() _
	shift
	for n in "$@"; do
		if alive "$n"; then
			p=$(cat "$S/run/$n.pid")
			kill "-$sig" "$p" 2>/dev/null || true
			ps+=("$p")
		fi
		rm -f "$S/run/$n.pid"
	done
	for p in "${ps[@]}"; do
		for _ in $(seq 1 50); do running "$p" || break; sleep 0.2; done
		running "$p" && kill -9 "$p" 2>/dev/null || true
	done
	return 0
}

# waitfor SECONDS WHAT CMD...: poll CMD every half second.
waitfor() {
	local t=$1 what=$2 _
	shift 2
	for _ in $(seq 1 $((t * 2))); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "timed out after $t s waiting for $what (logs: $S/logs)"
}

cgv2() { [ -f /sys/fs/cgroup/cgroup.controllers ]; }

# cgdirs N: node N's cgroupRoot in every hierarchy that exists.
cgdirs() {
	if cgv2; then
		[ -d "/sys/fs/cgroup/cbk-n$1" ] && echo "/sys/fs/cgroup/cbk-n$1"
	else
		local h
		for h in /sys/fs/cgroup/*/; do
			[ -d "${h}cbk-n$1" ] && echo "${h}cbk-n$1"
		done
	fi
	return 0
}

mkcgroups() {
	local n=$1 h
	if cgv2; then
		local c
		mkdir -p "/sys/fs/cgroup/cbk-n$n"
		for c in cpuset cpu io memory hugetlb pids; do
			echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
			echo "+$c" >"/sys/fs/cgroup/cbk-n$n/cgroup.subtree_control" 2>/dev/null || true
		done
		return
	fi
	for h in /sys/fs/cgroup/*/; do
		# cgroup v1 controller mounts only (not the tmpfs itself, not unified)
		grep -q " ${h%/} cgroup " /proc/mounts || continue
		mkdir -p "${h}cbk-n$n"
		if [ -f "${h}cpuset.cpus" ]; then
			[ -s "${h}cbk-n$n/cpuset.cpus" ] && [ -n "$(cat "${h}cbk-n$n/cpuset.cpus")" ] || cat "${h}cpuset.cpus" >"${h}cbk-n$n/cpuset.cpus"
			[ -n "$(cat "${h}cbk-n$n/cpuset.mems")" ] || cat "${h}cpuset.mems" >"${h}cbk-n$n/cpuset.mems"
		fi
	done
}

# killpods N: SIGKILL every process in node N's cgroups (its pods), until none.
killpods() {
	local n=$1 d p pids _
	for _ in $(seq 1 20); do
		pids=$(for d in $(cgdirs "$n"); do find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null; done | sort -u |
			while read -r p; do running "$p" && echo "$p"; done)
		[ -z "$pids" ] && return 0
		kill -9 $pids 2>/dev/null || true
		sleep 0.2
	done
	echo "kube: warning: processes left in node $n's cgroups: $pids" >&2
}

# shims N: the containerd-shim processes of node N's containerd.
shims() {
	local sock="$S/n$1/run/containerd.sock" f c
	for f in $(grep -laF -- "$sock" /proc/[0-9]*/cmdline 2>/dev/null); do
		c=$(tr '\0' ' ' 2>/dev/null <"$f") || continue
		[[ $c == *containerd-shim*" -address $sock "* ]] && { f=${f#/proc/}; echo "${f%/cmdline}"; }
	done
	return 0
}

ctrn() { ctr -a "$S/n$1/run/containerd.sock" -n k8s.io "${@:2}"; }

# ---------------------------------------------------------------- pki

# cert NAME CN [O] [SAN]: a key and a certificate signed by the cluster CA.
cert() {
	local n=$1 cn=$2 o=${3:-} san=${4:-} p=$S/pki
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$p/$n.key" -out "$p/$n.csr" \
		-subj "/CN=$cn${o:+/O=$o}" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		if [ -n "$san" ]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=$san"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"$p/$n.ext"
	openssl x509 -req -in "$p/$n.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -out "$p/$n.crt" -days 365 \
		-extfile "$p/$n.ext" 2>/dev/null
	rm -f "$p/$n.csr" "$p/$n.ext"
}

# kubeconfig NAME: S/NAME.kubeconfig with the certificate pki/NAME.
kubeconfig() {
	cat >"$S/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cellbox
  cluster: {server: "$APISERVER", certificate-authority: $S/pki/ca.crt}
users:
- name: $1
  user: {client-certificate: $S/pki/$1.crt, client-key: $S/pki/$1.key}
contexts:
- name: cellbox
  context: {cluster: cellbox, user: $1}
current-context: cellbox
EOF
}

pki() {
	local p=$S/pki n
	mkdir -p "$p"
	openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" \
		-days 365 -subj "/CN=cellbox-kube-ca" 2>/dev/null
	cert apiserver kube-apiserver "" "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.250.0.1,IP:10.96.0.1"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
	cert admin cellbox-admin system:masters
	cert scheduler system:kube-scheduler
	cert controller-manager system:kube-controller-manager
	for n in $NODES; do
		cert "kubelet-n$n" "system:node:cbk-n$n" system:nodes
		cert "kube-router-n$n" "cellbox:kube-router:cbk-n$n" cellbox:kube-routers
	done
	openssl ecparam -name prime256v1 -genkey -noout -out "$p/sa.key" 2>/dev/null
	openssl ec -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
	for n in admin scheduler controller-manager; do kubeconfig $n; done
	for n in $NODES; do kubeconfig "kubelet-n$n"; kubeconfig "kube-router-n$n"; done
	chmod 600 "$p"/*.key
}

# ---------------------------------------------------------------- network

net_up() {
	if ! ip link show cbk0 >/dev/null 2>&1; then
		ip link add cbk0 type bridge
		ip addr add 10.250.0.1/24 dev cbk0
	fi
	ip link set cbk0 up
	local n m
	for n in $NODES; do
		[ -e "/run/netns/cbk-n$n" ] || ip netns add "cbk-n$n"
		if ! ip link show "cbk-n$n" >/dev/null 2>&1; then
			ip link add "cbk-n$n" type veth peer name eth0 netns "cbk-n$n"
			ip -n "cbk-n$n" addr add "$(nodeip "$n")/24" dev eth0
		fi
		ip link set "cbk-n$n" master cbk0 up
		ip -n "cbk-n$n" link set lo up
		ip -n "cbk-n$n" link set eth0 up
		ip -n "cbk-n$n" route replace default via 10.250.0.1
		for m in $NODES; do
			[ "$m" = "$n" ] || ip -n "cbk-n$n" route replace "$(podcidr "$m")" via "$(nodeip "$m")"
		done
		ip route replace "$(podcidr "$n")" via "$(nodeip "$n")" dev cbk0
		nsenter --net="/run/netns/cbk-n$n" sysctl -qw net.ipv4.ip_forward=1
		nsenter --net="/run/netns/cbk-n$n" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
	done
	# Docker's FORWARD policy DROP would drop what cbk0 bridges between nodes
	iptables -C FORWARD -i cbk0 -o cbk0 -m comment --comment cellbox-kube -j ACCEPT 2>/dev/null ||
		iptables -I FORWARD 1 -i cbk0 -o cbk0 -m comment --comment cellbox-kube -j ACCEPT
}

net_down() {
	local n
	while iptables -D FORWARD -i cbk0 -o cbk0 -m comment --comment cellbox-kube -j ACCEPT 2>/dev/null; do :; done
	for n in $NODES; do
		ip route del "$(podcidr "$n")" 2>/dev/null || true
		ip link del "cbk-n$n" 2>/dev/null || true
		[ -e "/run/netns/cbk-n$n" ] && ip netns del "cbk-n$n" 2>/dev/null || true
	done
	ip link del cbk0 2>/dev/null || true
}

# ---------------------------------------------------------------- control plane

start_etcd() {
	alive etcd && return
	mkdir -p "$S/etcd"
	$NICE etcd --name cellbox --data-dir "$S/etcd" \
		--listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
		--listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
		--initial-cluster cellbox=http://127.0.0.1:23800 --unsafe-no-fsync >>"$S/logs/etcd.log" 2>&1 9>&- &
	echo $! >"$S/run/etcd.pid"
	waitfor 60 etcd sh -c 'curl -s http://127.0.0.1:23790/health | grep -q true'
}

apiserver_ready() {
	curl -sf --cacert "$S/pki/ca.crt" --cert "$S/pki/admin.crt" --key "$S/pki/admin.key" "$APISERVER/readyz" | grep -q '^ok'
}

start_apiserver() {
	alive apiserver && return
	local p=$S/pki
	$NICE "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 \
		--bind-address=10.250.0.1 --advertise-address=10.250.0.1 --secure-port=6443 \
		--endpoint-reconciler-type=none \
		--tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
		--service-cluster-ip-range=$SVC_CIDR --authorization-mode=Node,RBAC \
		--enable-admission-plugins=NodeRestriction --allow-privileged=true \
		--kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP --profiling=false >>"$S/logs/apiserver.log" 2>&1 9>&- &
	echo $! >"$S/run/apiserver.pid"
	waitfor 180 kube-apiserver apiserver_ready
}

start_controllers() {
	local p=$S/pki
	if ! alive controller-manager; then
		$NICE "$BIN/kube-controller-manager" --kubeconfig="$S/controller-manager.kubeconfig" \
			--bind-address=127.0.0.1 --leader-elect=false --profiling=false \
			--service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
			--use-service-account-credentials=true \
			--cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
			--service-cluster-ip-range=$SVC_CIDR \
			--node-monitor-grace-period=20s --node-monitor-period=2s >>"$S/logs/controller-manager.log" 2>&1 9>&- &
		echo $! >"$S/run/controller-manager.pid"
	fi
	if ! alive scheduler; then
		$NICE "$BIN/kube-scheduler" --kubeconfig="$S/scheduler.kubeconfig" \
			--bind-address=127.0.0.1 --leader-elect=false --profiling=false >>"$S/logs/scheduler.log" 2>&1 9>&- &
		echo $! >"$S/run/scheduler.pid"
	fi
}

# kube-router's NetworkPolicy controller reads these (its informers start
# for all of them) and nothing more: no writes.
rbac() {
	$KUBECTL apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cellbox:kube-router}
rules:
- apiGroups: [""]
  resources: [namespaces, pods, services, nodes, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cellbox:kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "cellbox:kube-router"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "cellbox:kube-routers"}
EOF
}

# ---------------------------------------------------------------- nodes

node_files() {
	local n=$1 d=$S/n$1
	mkdir -p "$d/run" "$d/containerd" "$d/cni/net.d" "$d/cni/ipam" "$d/kubelet" "$d/kubelet-pki" \
		"$d/podlogs" "$d/varlib-kubelet" "$d/sysctl"
	cat >"$d/containerd/config.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$d/run/containerd.sock"
[ttrpc]
  address = "$d/run/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$d/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni/net.d"
EOF
	cat >"$d/cni/net.d/10-cbk.conflist" <<EOF
{"cniVersion":"0.4.0","name":"cbk-n$n","plugins":[
 {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,"hairpinMode":true,
  "ipam":{"type":"host-local","dataDir":"$d/cni/ipam","ranges":[[{"subnet":"$(podcidr "$n")"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"loopback"}
]}
EOF
	cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(nodeip "$n")
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $S/pki/ca.crt}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: /cbk-n$n
containerRuntimeEndpoint: unix://$d/run/containerd.sock
failSwapOn: false
podLogsDir: $d/podlogs
podPidsLimit: 1024
localStorageCapacityIsolation: true
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
syncFrequency: 10s
nodeStatusReportFrequency: 30s
makeIPTablesUtilChains: false
EOF
	# the values the kubelet wants, so it finds them set and writes nothing
	echo 1 >"$d/sysctl/overcommit_memory"
	echo 0 >"$d/sysctl/panic_on_oom"
	echo 10 >"$d/sysctl/panic"
	echo 1 >"$d/sysctl/panic_on_oops"
	echo 1000000 >"$d/sysctl/root_maxkeys"
	echo 25000000 >"$d/sysctl/root_maxbytes"
}

start_containerd() {
	local n=$1 d=$S/n$1
	alive "n$n-containerd" && return
	rm -f "$d/run/containerd.sock" "$d/run/containerd.sock.ttrpc"
	$NICE nsenter --net="/run/netns/cbk-n$n" containerd --config "$d/containerd/config.toml" \
		>>"$S/logs/n$n-containerd.log" 2>&1 9>&- &
	echo $! >"$S/run/n$n-containerd.pid"
	waitfor 30 "containerd of cbk-n$n" ctr -a "$d/run/containerd.sock" version
	ctrn "$n" images ls -q | grep -qx "$PAUSE" || ctrn "$n" images import "$IMG/pause.tar" >/dev/null
}

start_kubelet() {
	local n=$1 d=$S/n$1
	alive "n$n-kubelet" && return
	mkcgroups "$n"
	# the root dir shared, so what the kubelet mounts there reaches containerd
	mountpoint -q "$d/kubelet" || { mount --bind "$d/kubelet" "$d/kubelet" && mount --make-rshared "$d/kubelet"; }
	mkdir -p /var/lib/kubelet
	local sh
	sh="set -e
mount --make-slave /proc
mount --bind $d/sysctl/overcommit_memory /proc/sys/vm/overcommit_memory
mount --bind $d/sysctl/panic_on_oom /proc/sys/vm/panic_on_oom
mount --bind $d/sysctl/panic /proc/sys/kernel/panic
mount --bind $d/sysctl/panic_on_oops /proc/sys/kernel/panic_on_oops
mount --bind $d/sysctl/root_maxkeys /proc/sys/kernel/keys/root_maxkeys
mount --bind $d/sysctl/root_maxbytes /proc/sys/kernel/keys/root_maxbytes
mount --make-slave \$(findmnt -n -o TARGET -T /var/lib/kubelet)
mount --bind $d/varlib-kubelet /var/lib/kubelet
exec $BIN/kubelet --config=$d/kubelet.yaml --kubeconfig=$S/kubelet-n$n.kubeconfig \
 --root-dir=$d/kubelet --cert-dir=$d/kubelet-pki --hostname-override=cbk-n$n --node-ip=$(nodeip "$n") \
 --pod-infra-container-image=$PAUSE --v=1"
	$NICE nsenter --net="/run/netns/cbk-n$n" unshare -m --propagation unchanged sh -c "$sh" \
		>>"$S/logs/n$n-kubelet.log" 2>&1 9>&- &
	echo $! >"$S/run/n$n-kubelet.pid"
}

kubelet_healthy() {
	nsenter --net="/run/netns/cbk-n$1" curl -sf http://127.0.0.1:10248/healthz | grep -qx ok
}

node_ready() {
	$KUBECTL get node "cbk-n$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

start_router() {
	local n=$1
	alive "n$n-kube-router" && return
	$NICE nsenter --net="/run/netns/cbk-n$n" "$BIN/kube-router" --kubeconfig="$S/kube-router-n$n.kubeconfig" \
		--hostname-override="cbk-n$n" --run-firewall=true --run-router=false --run-service-proxy=false \
		--service-cluster-ip-range=$SVC_CIDR --metrics-port=0 --v=1 >>"$S/logs/n$n-kube-router.log" 2>&1 9>&- &
	echo $! >"$S/run/n$n-kube-router.pid"
}

# kill_node N: node N dies at once: its kubelet, enforcer, containerd and
# shims, and its pods' processes, all SIGKILLed.
kill_node() {
	local n=$1 p
	stop KILL "n$n-kubelet" "n$n-kube-router" "n$n-containerd"
	p=$(shims "$n")
	[ -n "$p" ] && kill -9 $p 2>/dev/null || true
	killpods "$n"
}

start_node() {
	local n=$1
	# leftovers of a node that died: shims and pod processes that outlived it
	if ! alive "n$n-containerd"; then
		local p
		p=$(shims "$n")
		[ -n "$p" ] && kill -9 $p 2>/dev/null || true
		killpods "$n"
	fi
	start_containerd "$n"
	start_kubelet "$n"
	# the node object may still say Ready from before it died: the kubelet's
	# own health first
	waitfor 60 "the kubelet of cbk-n$n" kubelet_healthy "$n"
	waitfor 120 "node cbk-n$n Ready" node_ready "$n"
	start_router "$n"
}

# ---------------------------------------------------------------- up, down

healthy() {
	local c n
	for c in etcd apiserver controller-manager scheduler; do alive $c || return 1; done
	for n in $NODES; do
		for c in containerd kubelet kube-router; do alive "n$n-$c" || return 1; done
	done
	apiserver_ready || return 1
	for n in $NODES; do node_ready "$n" || return 1; done
}

up() {
	[ "$(id -u)" = 0 ] || die "up needs root"
	if [ -d "$S" ] && healthy 2>/dev/null; then
		echo "kube: the cluster is up and healthy; KUBECONFIG=$S/admin.kubeconfig"
		return 0
	fi
	if [ -d "$S" ]; then
		if alive etcd && alive apiserver && apiserver_ready; then
			echo "kube: the control plane is up; starting what is missing"
			start_controllers
			local n
			for n in $NODES; do start_node "$n"; done
			echo "kube: up; KUBECONFIG=$S/admin.kubeconfig"
			return 0
		fi
		echo "kube: a cluster that is not healthy is in $S: down first"
		down
	fi
	need containerd runc containernetworking-plugins etcd-server ipset iptables iproute2 openssl gcc curl util-linux procps kmod
	local c
	for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-router; do
		[ -x "$BIN/$c" ] || { build; break; }
	done
	[ -s "$IMG/pause.tar" ] || pause_image
	mark "binaries and packages"
	mkdir -p "$S/run" "$S/logs"
	pki
	mark "certificates and kubeconfigs"
	modprobe br_netfilter 2>/dev/null || true # bridged pod traffic through iptables (kube-router)
	modprobe overlay 2>/dev/null || true
	net_up
	local n
	for n in $NODES; do node_files "$n"; done
	mark "network: cbk0, netns cbk-n1 cbk-n2, routes"
	for n in $NODES; do start_containerd "$n"; done
	mark "containerd of both nodes, pause image imported"
	start_etcd
	mark "etcd healthy"
	start_apiserver
	mark "kube-apiserver ready"
	rbac
	start_controllers
	for n in $NODES; do start_kubelet "$n"; done
	for n in $NODES; do waitfor 180 "node cbk-n$n Ready" node_ready "$n"; done
	mark "nodes cbk-n1 cbk-n2 Ready"
	for n in $NODES; do
		$KUBECTL patch node "cbk-n$n" --type merge \
			-p "{\"spec\":{\"podCIDR\":\"$(podcidr "$n")\",\"podCIDRs\":[\"$(podcidr "$n")\"]}}" >/dev/null
		start_router "$n"
	done
	waitfor 120 "the default service account" $KUBECTL -n default get serviceaccount default
	mark "kube-router on both nodes, default service account"
	echo "kube: up; KUBECONFIG=$S/admin.kubeconfig"
}

down() {
	[ "$(id -u)" = 0 ] || die "down needs root"
	local n c
	# all of it goes: no need to be gentle
	stop KILL n1-kubelet n2-kubelet n1-kube-router n2-kube-router
	mark "kubelets and kube-routers stopped"
	for n in $NODES; do killpods "$n"; done
	stop KILL n1-containerd n2-containerd
	for n in $NODES; do
		c=$(shims "$n")
		[ -n "$c" ] && kill -9 $c 2>/dev/null || true
	done
	mark "pods, containerds and shims stopped"
	stop KILL scheduler controller-manager apiserver etcd
	mark "control plane stopped"
	# every mount under the state dir: rootfs overlays, shm, pod netns, tokens
	if [ -d "$S" ]; then
		awk -v s="$S/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done
	fi
	net_down
	for n in $NODES; do
		for c in $(cgdirs "$n"); do
			find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		done
	done
	rm -rf /var/lib/kubelet /var/lib/cni /var/log/containers /var/log/pods "$S"
	local left=""
	for n in $NODES; do [ -n "$(cgdirs "$n")" ] && left="$left cgroups of cbk-n$n"; done
	grep -q " $S" /proc/self/mountinfo && left="$left mounts"
	[ -n "$left" ] && echo "kube: warning: left behind:$left" >&2
	echo "kube: down"
}

# rss: the resident memory of the cluster's processes (those naming the state
# dir: control plane, containerds, shims, kubelets, kube-routers) and of the
# pods' processes (those in the nodes' cgroups).
rss() {
	local f p c kb=0 podkb=0 pods=0 n d
	for f in $(grep -laF -- "$S/" /proc/[0-9]*/cmdline 2>/dev/null); do
		p=${f#/proc/}
		p=${p%/cmdline}
		[ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
		c=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
		kb=$((kb + ${c:-0}))
	done
	for n in $NODES; do
		for p in $(for d in $(cgdirs "$n"); do find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null; done | sort -u); do
			c=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
			podkb=$((podkb + ${c:-0}))
			pods=$((pods + 1))
		done
	done
	echo "$((kb / 1024)) MiB cluster processes + $((podkb / 1024)) MiB in $pods pod processes"
}

status() {
	local c n
	for c in etcd apiserver controller-manager scheduler; do
		printf '%-24s %s\n' "$c" "$(alive $c && echo "pid $(cat "$S/run/$c.pid")" || echo dead)"
	done
	for n in $NODES; do
		for c in containerd kubelet kube-router; do
			printf '%-24s %s\n' "cbk-n$n $c" "$(alive "n$n-$c" && echo "pid $(cat "$S/run/n$n-$c.pid")" || echo dead)"
		done
	done
	echo "memory (RSS): $(rss)"
	if alive apiserver && apiserver_ready; then
		$KUBECTL get nodes -o wide
	else
		echo "kube-apiserver is not ready"
		return 1
	fi
}

load() {
	[ $# -gt 0 ] || die "usage: load FILE.tar..."
	local f n any=
	for n in $NODES; do
		alive "n$n-containerd" || { echo "kube: cbk-n$n's containerd is not running: skipped" >&2; continue; }
		any=1
		for f in "$@"; do
			ctrn "$n" images import "$f" | sed "s/^/kube: cbk-n$n: /"
		done
	done
	[ -n "$any" ] || die "no node's containerd runs"
}

nodearg() {
	case "${1:-}" in 1 | 2) ;; *) die "usage: $2 N (N is 1 or 2)" ;; esac
}

# one at a time: tests in parallel may all call up (the daemons started
# close fd 9, or they would hold the lock for good)
case "${1:-}" in
up | down | load | kill-node | start-node)
	mkdir -p "$TOP"
	exec 9>"$TOP/.lock"
	flock 9
	;;
esac

case "${1:-}" in
build) shift; build "$@" ;;
up) up ;;
down) down ;;
status) status ;;
env)
	echo "export KUBECONFIG=$S/admin.kubeconfig"
	echo "export CELLBOX_KUBECTL=$BIN/kubectl"
	echo "export CELLBOX_KUBE_NODES='cbk-n1 cbk-n2'"
	;;
load) shift; load "$@" ;;
kill-node)
	nodearg "${2:-}" kill-node
	kill_node "$2"
	echo "kube: cbk-n$2 killed (kubelet, containerd, shims, pods, kube-router)"
	;;
start-node)
	nodearg "${2:-}" start-node
	alive apiserver || die "the control plane is not up: run up"
	start_node "$2"
	echo "kube: cbk-n$2 is back and Ready"
	;;
test-image) shift; test_image "$@" ;;
*)
	echo "usage: $0 build [BIN] | up | down | status | env | load FILE.tar... | kill-node N | start-node N | test-image [OUT.tar]" >&2
	exit 2
	;;
esac
