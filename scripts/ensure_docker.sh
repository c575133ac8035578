#!/usr/bin/env bash
# Install the Docker engine (Debian's docker.io) and debootstrap if missing, and start the daemon if it
# is not running. Sourced by setup.sh and test.sh; safe to run again.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
# `ip`: the cluster tests give their second Docker daemon a bridge of its own (swerl/cluster/onebox.py)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    echo "swerl: installing ${missing[*]} from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        $SUDO systemctl start docker
    else
        echo "swerl: starting dockerd (log: /var/log/swerl-dockerd.log)"
        $SUDO sh -c 'nohup dockerd >/var/log/swerl-dockerd.log 2>&1 &'
    fi
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "swerl: dockerd did not come up; see /var/log/swerl-dockerd.log" >&2; exit 1; }
fi
