#!/usr/bin/env bash
#
# redis_semaphore.sh — the npm redis-semaphore package's Semaphore, the redis
# engine's semaphore peer (Cerberus's redis semaphores use its sorted-set
# layout, DESIGN.md §16), measured on the same server in the same run
# (`cerberus-bench --peers --scenario semaphore` runs it).
#
#   bench/peers/redis_semaphore.sh --check | --scenario semaphore --permits N
#                                  [--threads 2N] [--duration S] [--host H]
#                                  [--port P] [--db N] [--work DIR]
#
# The package and ioredis are pinned by bench/peers/node/package.json and
# package-lock.json and installed with `npm ci` (under a 300 s deadline) into
# $CERB_BENCH_NODE_CACHE (default ~/.cache/cerberus-bench) in a directory
# named after the lock file's hash, once; later runs reuse it. The
# measurement is bench/peers/node/redis_semaphore.mjs (see there).
#
# Output: one line of the peer protocol (bench/peers/peerlib.py): "ok
# <what>" after --check, "skip <why>" with exit status 3 when Node or npm is
# missing or the package cannot be installed (no registry), or "result
# peer=redis-semaphore scenario=semaphore threads=2N ... # how". Errors on
# stderr with exit status 1.

set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODE=${NODE:-node}
NPM=${NPM:-npm}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
skip() { printf 'skip %s\n' "$*"; exit 3; }
bad() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }

HOST=127.0.0.1 PORT=26379 DB=0 DURATION=5 PERMITS=1 THREADS="" SCENARIO="" CHECK=0
while (($#)); do
    case $1 in
        --check) CHECK=1; shift ;;
        --scenario) SCENARIO=${2:-}; shift 2 || bad "--scenario needs a value" ;;
        --host) HOST=${2:-}; shift 2 || bad "--host needs a value" ;;
        --port) PORT=${2:-}; shift 2 || bad "--port needs a value" ;;
        --db) DB=${2:-}; shift 2 || bad "--db needs a value" ;;
        --duration) DURATION=${2:-}; shift 2 || bad "--duration needs a value" ;;
        --permits) PERMITS=${2:-}; shift 2 || bad "--permits needs a value" ;;
        --threads) THREADS=${2:-}; shift 2 || bad "--threads needs a value" ;;
        --work) shift 2 || bad "--work needs a value" ;;
        -h | --help) sed -n '3,/^$/{s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) bad "unknown argument '$1'" ;;
    esac
done
[[ $CHECK == 1 || $SCENARIO == semaphore ]] || bad "--scenario semaphore (or --check) is required"
[[ $PORT =~ ^[0-9]+$ && $DB =~ ^[0-9]+$ && $PERMITS =~ ^[1-9][0-9]*$ ]] || bad "bad --port, --db or --permits"
[[ $DURATION =~ ^[0-9]+(\.[0-9]+)?$ ]] || bad "bad --duration '$DURATION'"
[[ -z $THREADS || $THREADS == $((2 * PERMITS)) ]] ||
    bad "--threads $THREADS: the semaphore scenario runs 2 x --permits acquirers"

command -v "$NODE" >/dev/null || skip "$NODE not found (Debian package nodejs)"
command -v "$NPM" >/dev/null || skip "$NPM not found (Debian package npm)"
hash=$(sha1sum "$HERE/node/package-lock.json" | cut -c1-12)
CACHE=${CERB_BENCH_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cerberus-bench}/redis-semaphore-$hash
if [[ ! -f $CACHE/.installed ]]; then
    mkdir -p -- "$CACHE"
    cp -- "$HERE/node/package.json" "$HERE/node/package-lock.json" "$HERE/node/redis_semaphore.mjs" "$CACHE/"
    (cd "$CACHE" && timeout 300 "$NPM" ci --no-audit --no-fund --loglevel=error >&2) ||
        skip "npm ci of redis-semaphore failed (is the npm registry reachable?)"
    touch -- "$CACHE/.installed"
fi
cp -- "$HERE/node/redis_semaphore.mjs" "$CACHE/"

if ((CHECK)); then
    ver=$(cd "$CACHE" && "$NODE" -p 'require("redis-semaphore/package.json").version' 2>/dev/null) ||
        die "redis-semaphore is not loadable from $CACHE"
    printf 'ok redis-semaphore %s (node %s)\n' "$ver" "$("$NODE" --version)"
    exit 0
fi
limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d + 60 }')
timeout "$limit" "$NODE" "$CACHE/redis_semaphore.mjs" "$HOST" "$PORT" "$DB" "$PERMITS" "$DURATION" ||
    die "redis_semaphore.mjs failed (status $?)"
