#!/usr/bin/env bash
# remote-engine.sh up|down|status DIR — a Docker Engine that is "another
# machine" for cellbox's tests: dockerd in a network, mount, pid, uts and
# ipc namespace of its own, with a root filesystem of its own under DIR
# (pivot_root: the repository, /tmp and the server's data dirs are not
# there), reached only through its API socket, DIR/root/run/docker.sock.
# A backend that binds a host path into a box, or dials a host socket,
# fails against it; one that uses nothing but the Engine API works.
#
# Learned from ../shared/labs/docker-engines (which stands up three such
# engines as a swarm); this is the one the tests need. Needs root,
# iproute2, util-linux (nsenter, unshare) and docker.io (dockerd,
# docker-init). `up` is idempotent (a healthy engine is left as it is);
# `down` kills the engine's namespace by its init's PID and removes DIR.
set -Eeuo pipefail

cmd=${1:-}
DIR=${2:-}
[ -n "$cmd" ] && [ -n "$DIR" ] || { echo "usage: $0 up|down|status DIR" >&2; exit 2; }
case "$DIR" in /*/*) ;; *) echo "DIR must be an absolute path below /" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "remote-engine: must run as root" >&2; exit 1; }

# One name per DIR, so that two fixtures may run at once.
TAG=cbre$(printf '%s' "$DIR" | sha256sum | cut -c1-8)
NS=$TAG
SOCK=$DIR/root/run/docker.sock
log() { printf '%s [remote-engine] %s\n' "$(date +%T.%3N)" "$*" >&2; }

alive() { [ -S "$SOCK" ] && docker -H "unix://$SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# init_pid: the host PID of the engine namespace's init (PID 1 inside).
init_pid() {
	local p
	for p in $(ip netns pids "$NS" 2>/dev/null); do
		awk '/^NSpid:/ { exit !(NF > 2 && $NF == 1) }' "/proc/$p/status" 2>/dev/null && { echo "$p"; return 0; }
	done
	return 0
}

down() {
	local p
	p=$(init_pid)
	if [ -n "$p" ]; then
		kill -KILL "$p" 2>/dev/null || true # the kernel ends its whole pid namespace
		for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	fi
	[ -f "$DIR/unshare.pid" ] && kill -KILL "$(cat "$DIR/unshare.pid")" 2>/dev/null || true
	for _ in $(seq 1 50); do [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break; sleep 0.1; done
	ip netns del "$NS" 2>/dev/null || true
	for cg in /sys/fs/cgroup/*/"$TAG" /sys/fs/cgroup/"$TAG"; do
		[ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
	done
	if [ -e "$DIR" ]; then
		[ -f "$DIR/.remote-engine" ] || { log "$DIR was not made by this script; not removing it"; exit 1; }
		if awk -v d="$DIR/" '{ if (index($5 "/", d) == 1) f=1 } END { exit !f }' /proc/self/mountinfo; then
			log "something is still mounted under $DIR; not removing it"; exit 1
		fi
		rm -rf --one-file-system "$DIR"
	fi
}

up() {
	if alive; then return 0; fi
	down
	local t0 R=$DIR/root O=$DIR/etc-own
	t0=$(date +%s.%N)
	mkdir -p "$R"/{usr,etc,proc,sys,dev,tmp,run,root,var/lib/docker} "$O/docker"
	touch "$DIR/.remote-engine"
	for l in bin lib lib64 sbin; do ln -sfn "usr/$l" "$R/$l"; done
	ln -sfn ../run "$R/var/run"
	echo remote >"$O/hostname"
	printf '127.0.0.1\tlocalhost remote\n' >"$O/hosts"
	printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$O/resolv.conf"
	cat >"$DIR/boot.sh" <<'EOF'
#!/bin/bash
# PID 1 of the engine's pid+mount+uts+ipc namespace, in its netns.
set -eu
R=$1 O=$2 CG=$3
mount --make-rprivate /
mount --bind "$R" "$R"
mount --bind /usr "$R/usr"
mount -o remount,bind,ro "$R/usr"
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount --rbind /sys/fs/cgroup "$R/sys/fs/cgroup"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount --bind /etc "$R/etc"
mount -o remount,bind,ro "$R/etc"
for f in hostname hosts resolv.conf docker; do
	[ -e "/etc/$f" ] || mkdir -p "/etc/$f" 2>/dev/null || true
	mount --bind "$O/$f" "$R/etc/$f"
done
hostname remote
cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec /usr/bin/docker-init -- /usr/sbin/dockerd \
	--data-root /var/lib/docker --exec-root /run/docker --pidfile /run/docker.pid \
	-H unix:///run/docker.sock --cgroup-parent "$CG" --iptables=false --ip-masq=false
EOF
	chmod +x "$DIR/boot.sh"
	ip netns add "$NS"
	ip -n "$NS" link set lo up
	setsid nsenter --net="/run/netns/$NS" \
		unshare --mount --uts --ipc --pid --fork --kill-child --propagation private \
		"$DIR/boot.sh" "$R" "$O" "/$TAG" </dev/null >"$DIR/dockerd.log" 2>&1 &
	echo $! >"$DIR/unshare.pid"
	for _ in $(seq 1 600); do # 60 s
		alive && { log "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: unix://$SOCK"; return 0; }
		kill -0 "$(cat "$DIR/unshare.pid")" 2>/dev/null || break
		sleep 0.1
	done
	tail -20 "$DIR/dockerd.log" >&2
	log "dockerd did not answer"
	exit 1
}

case "$cmd" in
up) up ;;
down) down ;;
status) if alive; then echo "up: unix://$SOCK"; else echo down; exit 1; fi ;;
*) echo "usage: $0 up|down|status DIR" >&2; exit 2 ;;
esac
