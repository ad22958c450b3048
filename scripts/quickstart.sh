#!/usr/bin/env bash
#
# quickstart.sh — from a fresh checkout to a running demo in one command, in
# about two to three minutes on two cores:
#
#   1. install the missing Debian packages (scripts/deps.sh);
#   2. build Cerberus, Release, into build/ (the `cerberus` command, the
#      embed and orders examples and cerberus-bench only);
#   3. start a private redis-server, ZooKeeper and etcd on loopback
#      (scripts/servers.sh), on ports of their own, and prepare them for
#      their first use with `cerberus init`, as a new deployment would;
#   4. run examples/embed: several processes contend for one lock, each
#      printing when it holds it and with which fencing token, and a shared
#      counter proves that no two held it at once; then examples/orders:
#      several processes receive the same order requests (some repeated,
#      some failing once, one process killed mid-way) and the idempotency
#      guard creates exactly one order per request;
#   5. run a short `cerberus-bench --engine all --peers` on the three
#      servers: Cerberus, the raw ceiling and the peers (redis-py, Curator,
#      kazoo, python-etcd3, etcdctl) in one table, written to the terminal
#      and to build/quickstart/bench.txt, with build/quickstart/bench.json
#      and the picture build/quickstart/bench.png;
#   6. a live failover (bench/failover.sh): four clients lock in a loop on a
#      redis primary with ZooKeeper second; the primary is killed by its PID
#      and the library's switch shows, with the time from the kill to the
#      first grant on ZooKeeper (build/quickstart/failover.txt).
#
# Every server is started by scripts/servers.sh on its own port and state
# directory (so it never touches a system server or the test servers) and
# is stopped by its PID when this script exits, however it exits (an error,
# Ctrl-C). Each step prints a "==> " line.
#
# Environment:
#   CERB_BUILD_DIR       build directory (default: <repo>/build; an existing
#                        configured tree is reused as it is)
#   CERB_QS_PORT         redis port (default 26479)
#   CERB_QS_ZK_PORT      ZooKeeper client port (default 22281)
#   CERB_QS_ETCD_PORT    etcd client port (default 22479; peer port + 1)
#   CERB_QS_FAILOVER_PORT  the redis primary the failover demo kills
#                        (default 26481)
#   CERB_QS_STATE_DIR    servers.sh state (default /tmp/cerberus-quickstart-$UID)
#   CERB_QS_PROCS        embed and orders: processes (default 4; orders at least 2)
#   CERB_QS_ITER         embed: acquisitions per process (default 3)
#   CERB_QS_DURATION     bench: seconds measured per side (default 2)
#   CERB_QS_THREADS      bench: uncontended thread counts (default 1,8)
#   CERB_QS_SKIP_BENCH=1, CERB_QS_SKIP_FAILOVER=1   leave a step out
#   CERB_NO_INSTALL=1    never install packages

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/deps.sh
. "$ROOT/scripts/deps.sh"

BUILD_DIR=${CERB_BUILD_DIR:-$ROOT/build}
OUT=$BUILD_DIR/quickstart
PORT=${CERB_QS_PORT:-26479}
ZK_PORT=${CERB_QS_ZK_PORT:-22281}
ETCD_PORT=${CERB_QS_ETCD_PORT:-22479}
FO_PORT=${CERB_QS_FAILOVER_PORT:-26481}
PROCS=${CERB_QS_PROCS:-4}
ITER=${CERB_QS_ITER:-3}
DURATION=${CERB_QS_DURATION:-2}
THREADS=${CERB_QS_THREADS:-1,8}
JOBS=$(nproc 2>/dev/null || echo 2)
# A state dir of its own: quickstart never stops a test fixture's server.
export CERB_STATE_DIR=${CERB_QS_STATE_DIR:-/tmp/cerberus-quickstart-${UID:-$(id -u)}}
SERVERS=$ROOT/scripts/servers.sh
T0=$SECONDS

step() { printf '\n==> [%3ds] %s\n' $((SECONDS - T0)) "$*"; }
run() {
    printf '+ %s\n' "$*"
    "$@"
}

for v in PORT ZK_PORT ETCD_PORT FO_PORT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ && ${!v} -lt 65535 ]] || {
        echo "quickstart: bad port $v=${!v}" >&2
        exit 2
    }
done

step "dependencies"
cerb_ensure_packages "${CERB_DEB_PACKAGES[@]}"

step "build ($BUILD_DIR, Release)"
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
    run cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
else
    bt=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
    echo "reusing the configured tree (CMAKE_BUILD_TYPE=${bt:-none})"
fi
run cmake --build "$BUILD_DIR" -j "$JOBS" --target cerberus_cli cerb_example_embed cerb_example_orders cerberus-bench
# The command: `init` below, and servers.sh prepares the failover demo's
# redis with it.
export CERBERUS_BIN=$BUILD_DIR/cli/cerberus
mkdir -p -- "$OUT"

# What this script started, stopped by PID (servers.sh stop) on the way
# out: the EXIT trap runs on success, on failure (set -e) and after
# Ctrl-C/SIGTERM, whose traps turn into an exit.
STARTED=()
CFG=""
cleanup() {
    local rc=$? s
    trap - EXIT INT TERM
    step "cleanup: stopping the servers this script started"
    for s in "${STARTED[@]}"; do
        # shellcheck disable=SC2086 # "engine --port N"
        bash "$SERVERS" stop $s || true
    done
    # The failover demo's primary, should it have been interrupted.
    bash "$SERVERS" stop redis --port "$FO_PORT" >/dev/null 2>&1 || true
    [[ -n $CFG ]] && rm -f -- "$CFG"
    if ((rc == 0)); then
        printf '\nquickstart: done in %ds. Results in %s\n' $((SECONDS - T0)) "$OUT"
    else
        printf '\nquickstart: FAILED (status %d) after %ds\n' "$rc" $((SECONDS - T0)) >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_server() { # ENGINE PORT
    STARTED+=("$1 --port $2")
    run bash "$SERVERS" start "$1" --port "$2"
}

step "servers on loopback: redis :$PORT, ZooKeeper :$ZK_PORT, etcd :$ETCD_PORT (state in $CERB_STATE_DIR)"
# The redis stays unprepared here: the next step shows how a new one is.
CERB_REDIS_UNMARKED=1 start_server redis "$PORT"
start_server zk "$ZK_PORT"
start_server etcd "$ETCD_PORT"

# The three servers in one file (each engine with its defaults; the redis
# pool opens connections on demand, as many as threads call at once).
cat >"$OUT/stores.cfg" <<EOF
# written by scripts/quickstart.sh: the three quickstart servers
engines = ("redis", "zk", "etcd");
redis = { host = "127.0.0.1"; port = $PORT; };
zk = { hosts = "127.0.0.1:$ZK_PORT"; };
etcd = { endpoints = ("http://127.0.0.1:$ETCD_PORT"); };
EOF
step "cerberus init: prepare the new stores (without it the first lock on the new redis waits a lease)"
run "$CERBERUS_BIN" -c "$OUT/stores.cfg" init

# The example config, pointed at this server.
CFG=$(mktemp "${TMPDIR:-/tmp}/cerberus-quickstart.XXXXXX.cfg")
sed "s/port = 6379;/port = $PORT;/" "$ROOT/examples/cerberus.cfg" >"$CFG"

step "examples/embed: $PROCS processes x $ITER acquisitions of one lock"
run "$BUILD_DIR/examples/embed" -c "$CFG" -n "$PROCS" -i "$ITER" quickstart-demo

step "examples/orders: $PROCS processes, the same order requests, one order each"
run "$BUILD_DIR/examples/orders" -c "$CFG" -n "$((PROCS < 2 ? 2 : PROCS))"

if [[ ${CERB_QS_SKIP_BENCH:-0} != 1 ]]; then
    step "cerberus-bench --engine all --peers (${DURATION}s per side; uncontended x$THREADS, handoff x8)"
    run "$BUILD_DIR/bench/cerberus-bench" -c "$OUT/stores.cfg" --engine all --peers \
        --scenario uncontended,handoff --threads "$THREADS" --duration "$DURATION" \
        --json "$OUT/bench.json" --plot "$OUT/bench.png" | tee "$OUT/bench.txt"
    echo "table: $OUT/bench.txt  JSON: $OUT/bench.json  plot: $OUT/bench.png"
fi

if [[ ${CERB_QS_SKIP_FAILOVER:-0} != 1 ]]; then
    step "failover: redis :$FO_PORT (primary, killed by PID) then ZooKeeper :$ZK_PORT"
    run env PORT="$FO_PORT" SECONDARY=zk ZK_PORT="$ZK_PORT" FLAP_S=0 LEASE_MS=3000 \
        bash "$ROOT/bench/failover.sh" "$BUILD_DIR/bench/cerberus-bench" \
        --json "$OUT/failover.json" | tee "$OUT/failover.txt"
fi
