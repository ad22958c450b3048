#!/usr/bin/env bash
#
# etcd_peers.sh — the etcd engine's peers (`etcdctl lock` and python3-etcd3's
# Lock) measured on a given etcd by hand; cerberus-bench --peers runs the
# same measurements (etcd_peers.py) next to Cerberus in its own table.
#
#   bench/peers/etcd_peers.sh [--peer python-etcd3|etcdctl|all]
#                             [--check | --scenario uncontended|handoff|all]
#                             [--endpoint URL | --port P] [--threads N]
#                             [--duration S]
#
# Runs bench/peers/etcd_peers.py with Debian's /usr/bin/python3 (the one
# python3-etcd3 is installed for, not a pyenv python3 earlier on PATH), once
# per peer and scenario asked for (default: both peers, both scenarios, 8
# threads/contenders, 5 s, http://127.0.0.1:22379). Each run prints one line
# of the peer protocol (bench/peers/peerlib.py): "result peer=... key=value
# ... # how", or "skip <why>" for a peer that is not installed. Lock names
# are bench-peer-<pid>-*, with etcdctl's layout (NAME/<lease>) and
# python-etcd3's (/locks/NAME).
#
# Environment: PYTHON (default $CERB_PEER_PYTHON or /usr/bin/python3),
# ETCDCTL (default etcdctl from PATH).

set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-${CERB_PEER_PYTHON:-/usr/bin/python3}}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage() { sed -n '3,/^$/{s/^# \{0,1\}//;p}' "$0"; }

PEER=all
SCENARIO=all
ENDPOINT=""
PORT=22379
CHECK=0
ARGS=()
while (($#)); do
    case $1 in
        --peer) PEER=${2:-}; shift 2 || die "--peer needs a value" ;;
        --scenario) SCENARIO=${2:-}; shift 2 || die "--scenario needs a value" ;;
        --port) PORT=${2:-}; shift 2 || die "--port needs a value" ;;
        --endpoint) ENDPOINT=${2:-}; shift 2 || die "--endpoint needs a value" ;;
        --threads | --duration | --work) ARGS+=("$1" "${2:-}"); shift 2 || die "$1 needs a value" ;;
        --check) CHECK=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ -n $ENDPOINT ]] || ENDPOINT="http://127.0.0.1:$PORT"
case $PEER in all) peers=(python-etcd3 etcdctl) ;; python-etcd3 | etcdctl) peers=("$PEER") ;;
    *) die "--peer: python-etcd3, etcdctl or all, not '$PEER'" ;; esac
case $SCENARIO in all) scenarios=(uncontended handoff) ;; uncontended | handoff) scenarios=("$SCENARIO") ;;
    *) die "--scenario: uncontended, handoff or all, not '$SCENARIO'" ;; esac
[[ " ${ARGS[*]-} " == *" --threads "* ]] || ARGS+=(--threads 8)
[[ -x $PYTHON ]] || { printf 'skip %s not found (Debian package python3)\n' "$PYTHON"; exit 3; }

rc=0
for p in "${peers[@]}"; do
    if ((CHECK)); then
        "$PYTHON" "$HERE/etcd_peers.py" --peer "$p" --check --endpoint "$ENDPOINT" || rc=$?
        continue
    fi
    for s in "${scenarios[@]}"; do
        "$PYTHON" "$HERE/etcd_peers.py" --peer "$p" --scenario "$s" --endpoint "$ENDPOINT" \
            ${ARGS[@]+"${ARGS[@]}"} || rc=$?
    done
done
exit "$rc"
