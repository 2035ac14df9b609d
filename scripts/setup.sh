#!/usr/bin/env bash
# Installs what cellbox needs on a fresh Debian machine (as root) and starts a
# Docker Engine when none answers. Safe to rerun: it only does what is missing.
set -euo pipefail

# installed: the package is installed, not only known (a package removed
# but for its config files is "deinstall ok config-files", which dpkg -s
# answers with success).
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -qx 'install ok installed'; }

need=()
for pkg in bubblewrap docker.io debootstrap python3 ca-certificates patch etcd-server; do
	installed "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "setup: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	# etcd-server (only /usr/bin/etcd is wanted: the tests start their own
	# members) starts a system etcd on 2379 where an init system runs: stop it.
	if [[ " ${need[*]} " == *" etcd-server "* ]]; then
		if [ -d /run/systemd/system ]; then
			systemctl disable --now etcd.service >/dev/null 2>&1 || true
		else
			service etcd stop >/dev/null 2>&1 || true
			update-rc.d etcd disable >/dev/null 2>&1 || true
		fi
	fi
fi

# The Engine: Debian's docker.io. Start dockerd when nothing answers.
if ! docker info >/dev/null 2>&1; then
	echo "setup: starting dockerd"
	nohup dockerd >/var/log/cellbox-dockerd.log 2>&1 &
	for _ in $(seq 1 60); do
		docker info >/dev/null 2>&1 && break
		sleep 0.5
	done
	docker info >/dev/null 2>&1 || { echo "setup: dockerd did not come up; see /var/log/cellbox-dockerd.log" >&2; exit 1; }
fi

command -v go >/dev/null || { echo "setup: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
echo "setup: ok (bwrap $(bwrap --version | cut -d' ' -f2), docker engine $(docker version -f '{{.Server.Version}}'), $(go version | cut -d' ' -f3))"
