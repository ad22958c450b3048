#!/usr/bin/env bash
#
# node_redlock.sh — npm redlock (node-redlock 4.2.0, npm's `latest`), the
# peer of the redis engine's Redlock mode, measured on the same masters in
# the same run (`cerberus-bench --peers` runs it under the redlock rows).
#
#   bench/peers/node_redlock.sh --check | --scenario uncontended|handoff
#                               [--threads N] [--duration S]
#                               --nodes HOST:PORT,HOST:PORT,... [--work DIR]
#
# The package and ioredis are pinned by bench/peers/node_redlock/package.json
# and package-lock.json and installed with `npm ci` (under a 300 s deadline)
# into $CERB_BENCH_NODE_CACHE (default ~/.cache/cerberus-bench) in a
# directory named after the lock file's hash, once; later runs reuse it.
# The measurement is bench/peers/node_redlock/node_redlock.mjs (see there).
#
# Output: one line of the peer protocol (bench/peers/peerlib.py): "ok
# <what>" after --check, "skip <why>" with exit status 3 when Node or npm is
# missing or the package cannot be installed (no registry), or "result
# peer=node-redlock scenario=S threads=N ... # how". Errors on stderr with
# exit status 1.

set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODE=${NODE:-node}
NPM=${NPM:-npm}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
skip() { printf 'skip %s\n' "$*"; exit 3; }
bad() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }

NODES="" DURATION=5 THREADS=1 SCENARIO="" CHECK=0
while (($#)); do
    case $1 in
        --check) CHECK=1; shift ;;
        --scenario) SCENARIO=${2:-}; shift 2 || bad "--scenario needs a value" ;;
        --nodes) NODES=${2:-}; shift 2 || bad "--nodes needs a value" ;;
        --duration) DURATION=${2:-}; shift 2 || bad "--duration needs a value" ;;
        --threads) THREADS=${2:-}; shift 2 || bad "--threads needs a value" ;;
        --work) shift 2 || bad "--work needs a value" ;;
        -h | --help) sed -n '3,/^$/{s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) bad "unknown argument '$1'" ;;
    esac
done
[[ $CHECK == 1 || $SCENARIO == uncontended || $SCENARIO == handoff ]] ||
    bad "--scenario uncontended|handoff (or --check) is required"
[[ $NODES =~ ^[^,:]+:[0-9]+(,[^,:]+:[0-9]+)*$ ]] || bad "--nodes HOST:PORT,... is required"
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || bad "bad --threads '$THREADS'"
[[ $DURATION =~ ^[0-9]+(\.[0-9]+)?$ ]] || bad "bad --duration '$DURATION'"

command -v "$NODE" >/dev/null || skip "$NODE not found (Debian package nodejs)"
command -v "$NPM" >/dev/null || skip "$NPM not found (Debian package npm)"
hash=$(sha1sum "$HERE/node_redlock/package-lock.json" | cut -c1-12)
CACHE=${CERB_BENCH_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cerberus-bench}/node-redlock-$hash
if [[ ! -f $CACHE/.installed ]]; then
    mkdir -p -- "$CACHE"
    cp -- "$HERE/node_redlock/package.json" "$HERE/node_redlock/package-lock.json" "$CACHE/"
    (cd "$CACHE" && timeout 300 "$NPM" ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2) ||
        skip "npm ci of redlock failed (is the npm registry reachable?)"
    touch -- "$CACHE/.installed"
fi
cp -- "$HERE/node_redlock/node_redlock.mjs" "$CACHE/"

if ((CHECK)); then
    ver=$(cd "$CACHE" && "$NODE" -p 'require("redlock/package.json").version' 2>/dev/null) ||
        die "redlock is not loadable from $CACHE"
    for hp in ${NODES//,/ }; do
        timeout 5 bash -c "exec 3<>/dev/tcp/${hp%:*}/${hp##*:}" 2>/dev/null ||
            die "no server answers at $hp"
    done
    printf 'ok node-redlock %s (node %s)\n' "$ver" "$("$NODE" --version)"
    exit 0
fi
limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d + 60 }')
timeout "$limit" "$NODE" "$CACHE/node_redlock.mjs" "$SCENARIO" "$THREADS" "$DURATION" "$NODES" ||
    die "node_redlock.mjs failed (status $?)"
