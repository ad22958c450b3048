#!/usr/bin/env bash
#
# etcd_peers.sh — the etcd engine's peers (`etcdctl lock` and python3-etcd3's
# Lock) measured on a given etcd, for the peer comparison of the etcd engine
# (DESIGN.md §10: >= python-etcd3 and etcdctl; hand-off p50 <= 6 ms and
# p90 <= 10 ms with 8 contenders).
#
#   bench/peers/etcd_peers.sh [--port P | --endpoint HOST:PORT] [--duration S]
#                             [--clients N[,N...]] [--contenders N]
#                             [--skip-etcdctl] [--skip-python]
#
# Runs bench/peers/etcd_peers.py with Debian's /usr/bin/python3 (the one
# python3-etcd3 is installed for, not a pyenv python3 earlier on PATH):
#   python-etcd3 uncontended  N client processes (default 1,8), a lock name
#                             each, acquire+release cycles/s in total;
#   python-etcd3 handoff      --contenders processes (default 8), one name;
#   etcdctl handoff           --contenders loops of `etcdctl lock NAME --
#                             bash -c ...`, stamped with EPOCHREALTIME;
#   etcdctl uncontended       a loop of `etcdctl lock NAME -- true`.
# Each prints one line "<peer> <scenario> key=value ...". Run cerberus-bench
# on the same server right before or after, e.g.
#   cerberus-bench --engine etcd --port P --threads 1,8
# Lock names are bench-peer-<pid>-*, with etcdctl's layout (NAME/<lease>)
# and python-etcd3's (/locks/NAME).
#
# Environment: PYTHON (default /usr/bin/python3), ETCDCTL (default etcdctl
# from PATH).

set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    sed -n '3,/^$/{s/^# \{0,1\}//;p}' "$0"
}

ENDPOINT=""
PORT=22379
ARGS=()
while (($#)); do
    case $1 in
        --port) PORT=${2:-}; shift 2 ;;
        --endpoint) ENDPOINT=${2:-}; shift 2 ;;
        --duration | --clients | --contenders) ARGS+=("$1" "${2:-}"); shift 2 ;;
        --skip-etcdctl | --skip-python) ARGS+=("$1"); shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ -n $ENDPOINT ]] || ENDPOINT="127.0.0.1:$PORT"
[[ $ENDPOINT =~ ^[A-Za-z0-9.:_-]+:[0-9]+$ ]] || die "bad endpoint '$ENDPOINT'"

[[ -x $PYTHON ]] || die "$PYTHON not found"
"$PYTHON" -c 'import etcd3' 2>/dev/null ||
    die "python3-etcd3 is not installed for $PYTHON (Debian package python3-etcd3)"
command -v "${ETCDCTL:-etcdctl}" >/dev/null ||
    die "etcdctl not found (Debian package etcd-client)"
if [[ -n ${ETCDCTL:-} ]]; then
    PATH=$(dirname "$ETCDCTL"):$PATH
    export PATH
fi
# The server must answer before we measure anything.
curl -s -m 2 "http://$ENDPOINT/health" | grep -q '"health":"true"' ||
    die "etcd at $ENDPOINT is not healthy"

exec "$PYTHON" "$HERE/etcd_peers.py" "$ENDPOINT" ${ARGS[@]+"${ARGS[@]}"}
