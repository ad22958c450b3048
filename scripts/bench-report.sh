#!/usr/bin/env bash
#
# bench-report.sh — regenerate docs/performance.md and docs/performance.png
# from one run of cerberus-bench.
#
#   scripts/bench-report.sh [--duration S] [--out DIR] [--json-only]
#   scripts/bench-report.sh --from-json FILE [--out DIR]
#
# A run:
#   1. installs the missing Debian packages (scripts/deps.sh; CERB_NO_INSTALL=1
#      only reports them);
#   2. builds the Release tree if needed (cerberus-bench and the `cerberus`
#      command, which the switch scenario runs);
#   3. starts a private redis-server, ZooKeeper, etcd, PostgreSQL and
#      MariaDB on loopback (scripts/servers.sh), on ports and a state
#      directory of their own, and prepares them with `cerberus init`, as a
#      new deployment would (pg and mysql get servers.sh's user and
#      database, cerb, and their lock tables from `cerberus init`);
#   4. runs ONE cerberus-bench on the five engines, with -c a file that
#      lists the five servers and leaves every other key at its default
#      ($CERB_BUILD_DIR/bench-report/stores.cfg): uncontended (1 and 8
#      threads), handoff (8 waiters), herd (100 waiters), many (10 000
#      locks), guard (1 and 8 threads) and switch (1 and 8 threads), with the
#      peers (--peers), the JSON (--json) and the plot (--plot DIR/
#      performance.png);
#   5. describes the machine, the servers (their versions asked from the
#      servers themselves), the peers, the date and the commit
#      (scripts/bench_report.py meta), then renders DIR/performance.md from
#      the JSON (scripts/bench_report.py render).
# The servers are stopped by their PIDs when the script exits, however it
# exits (success, error, Ctrl-C). The run takes about 12 minutes with the
# default --duration 3 on two cores; each step prints a "==> " line.
#
# Options:
#   --duration S     seconds measured per side of each scenario (default 3)
#   --out DIR        where performance.md and performance.png go (default
#                    docs/ of this checkout)
#   --json-only      run and keep the JSON, the metadata and the plot, but do
#                    not write the page
#   --from-json FILE render the page from FILE (cerberus-bench --json) and
#                    its metadata FILE.meta.json, without running anything
#
# The JSON, its metadata and the bench's table stay in $CERB_BUILD_DIR/
# bench-report/ (bench.json, bench.json.meta.json, bench.txt).
#
# Environment:
#   CERB_BUILD_DIR         build directory (default <repo>/build; an existing
#                          configured tree is reused as it is)
#   CERB_BR_REDIS_PORT     redis port (default 26679)
#   CERB_BR_ZK_PORT        ZooKeeper client port (default 22681)
#   CERB_BR_ETCD_PORT      etcd client port (default 22779; peer port + 1)
#   CERB_BR_PG_PORT        PostgreSQL port (default 25791)
#   CERB_BR_MYSQL_PORT     MariaDB port (default 23791)
#   CERB_BR_STATE_DIR      servers.sh state (default /tmp/cerberus-bench-report-$UID)
#   CERB_NO_INSTALL=1      never install packages

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=${0##*/}
PY=${CERB_PYTHON:-python3}
REPORT_PY=$ROOT/scripts/bench_report.py

usage() {
    cat <<EOF
usage: $PROG [--duration S] [--out DIR] [--json-only]
       $PROG --from-json FILE [--out DIR]

Runs cerberus-bench once on private redis, ZooKeeper, etcd, PostgreSQL and
MariaDB servers and writes DIR/performance.md and DIR/performance.png
(default DIR: docs/).

  --duration S      seconds measured per side of each scenario (default 3;
                    the whole run takes about 12 minutes on two cores)
  --out DIR         output directory (default: $ROOT/docs)
  --json-only       run, keep the JSON and the plot, do not write the page
  --from-json FILE  only render the page from FILE (cerberus-bench --json)
                    and FILE.meta.json; nothing is built or run

Environment: CERB_BUILD_DIR, CERB_BR_REDIS_PORT (26679), CERB_BR_ZK_PORT
(22681), CERB_BR_ETCD_PORT (22779), CERB_BR_PG_PORT (25791),
CERB_BR_MYSQL_PORT (23791), CERB_BR_STATE_DIR, CERB_NO_INSTALL=1.
EOF
}

DURATION=3
OUT=$ROOT/docs
JSON_ONLY=0
FROM_JSON=""
while (($#)); do
    case $1 in
        --duration) DURATION=${2:?--duration needs a value}; shift 2 ;;
        --duration=*) DURATION=${1#*=}; shift ;;
        --out) OUT=${2:?--out needs a value}; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        --json-only) JSON_ONLY=1; shift ;;
        --from-json) FROM_JSON=${2:?--from-json needs a file}; shift 2 ;;
        --from-json=*) FROM_JSON=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
if ! [[ $DURATION =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
    ! awk -v d="$DURATION" 'BEGIN { exit !(d >= 0.1) }'; then
    echo "$PROG: --duration: '$DURATION' is not a number of seconds >= 0.1" >&2
    exit 2
fi
if [[ -n $FROM_JSON && $JSON_ONLY == 1 ]]; then
    echo "$PROG: --json-only and --from-json exclude each other" >&2
    exit 2
fi
mkdir -p -- "$OUT"
OUT=$(cd "$OUT" && pwd)

T0=$SECONDS
step() { printf '\n==> [%3ds] %s\n' $((SECONDS - T0)) "$*"; }
run() {
    printf '+ %s\n' "$*"
    "$@"
}

render() { # JSON
    step "render $OUT/performance.md from $1"
    run "$PY" "$REPORT_PY" render --json "$1" --meta "$1.meta.json" \
        --out "$OUT/performance.md" --plot performance.png
}

if [[ -n $FROM_JSON ]]; then
    [[ -f $FROM_JSON ]] || { echo "$PROG: $FROM_JSON: no such file" >&2; exit 2; }
    render "$FROM_JSON"
    exit 0
fi

# shellcheck source=scripts/deps.sh
. "$ROOT/scripts/deps.sh"
# shellcheck source=scripts/stores.sh
. "$ROOT/scripts/stores.sh"
BUILD_DIR=${CERB_BUILD_DIR:-$ROOT/build}
WORK=$BUILD_DIR/bench-report
REDIS_PORT=${CERB_BR_REDIS_PORT:-26679}
ZK_PORT=${CERB_BR_ZK_PORT:-22681}
ETCD_PORT=${CERB_BR_ETCD_PORT:-22779}
PG_PORT=${CERB_BR_PG_PORT:-25791}
MYSQL_PORT=${CERB_BR_MYSQL_PORT:-23791}
JOBS=$(nproc 2>/dev/null || echo 2)
# A state dir of its own: this script never stops a test fixture's server.
export CERB_STATE_DIR=${CERB_BR_STATE_DIR:-/tmp/cerberus-bench-report-${UID:-$(id -u)}}
SERVERS=$ROOT/scripts/servers.sh

cerb_check_ports "$PROG" REDIS_PORT ZK_PORT ETCD_PORT PG_PORT MYSQL_PORT

step "dependencies"
cerb_ensure_packages "${CERB_DEB_PACKAGES[@]}"

step "build ($BUILD_DIR, Release)"
cerb_release_tree "$PROG" "$BUILD_DIR"
run cmake --build "$BUILD_DIR" -j "$JOBS" --target cerberus-bench cerberus_cli
BENCH=$BUILD_DIR/bench/cerberus-bench
export CERBERUS_BIN=$BUILD_DIR/cli/cerberus
mkdir -p -- "$WORK"

# What this script started, stopped by PID (servers.sh stop) on the way
# out: the EXIT trap runs on success, on failure (set -e) and after
# Ctrl-C/SIGTERM, whose traps turn into an exit.
BENCH_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # The bench, should a signal have ended the wait for it: it passes the
    # signal on to a peer it is running (bench/peers.c).
    if [[ -n $BENCH_PID ]] && kill -0 "$BENCH_PID" 2>/dev/null; then
        kill -TERM "$BENCH_PID" 2>/dev/null || true
        wait "$BENCH_PID" 2>/dev/null || true
    fi
    if ((${#STARTED[@]})); then
        step "cleanup: stopping the servers this script started"
        cerb_stores_stop
    fi
    if ((rc == 0)); then
        printf '\n%s: done in %ds.\n' "$PROG" $((SECONDS - T0))
    else
        printf '\n%s: FAILED (status %d) after %ds\n' "$PROG" "$rc" $((SECONDS - T0)) >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "servers on loopback: redis :$REDIS_PORT, ZooKeeper :$ZK_PORT, etcd :$ETCD_PORT, PostgreSQL :$PG_PORT, MariaDB :$MYSQL_PORT (state in $CERB_STATE_DIR)"
# Prepared below with `cerberus init`, all five the same way.
cerb_stores_start "$REDIS_PORT" "$ZK_PORT" "$ETCD_PORT" "$WORK/stores.cfg" \
    scripts/bench-report.sh "$PG_PORT" "$MYSQL_PORT"
step "cerberus init: prepare the new stores"
run "$CERBERUS_BIN" -c "$WORK/stores.cfg" init

# The one measurement, on the file above: every key at its default, as a
# user who lists the five servers and sets nothing else gets. Each
# scenario's client is pinned to the engine measured (bench/scenarios.c);
# the switch scenario switches a copy of the file. (Without -c the bench's
# built-in switch file has a 1 s lease, too short for its clients to trust
# closure records, so it would measure the full gate instead.)
rel() { case $1 in "$ROOT"/*) printf '%s' "${1#"$ROOT"/}" ;; *) printf '%s' "$1" ;; esac; }
JSON=$WORK/bench.json
PNG=$OUT/performance.png
SCENARIOS=uncontended,handoff,herd,many,guard,switch
ARGS=(-c "$(rel "$WORK/stores.cfg")" --engine all --scenario "$SCENARIOS" --threads "1,8"
    --peers --duration "$DURATION" --json "$(rel "$JSON")" --plot "$(rel "$PNG")")
CMDLINE="$(rel "$BENCH") ${ARGS[*]}"
rm -f -- "$JSON" "$JSON.meta.json"
read -r LOAD_BEFORE _ </proc/loadavg
STARTED_UTC=$(date -u +%Y-%m-%dT%H:%M:%SZ)
step "cerberus-bench: $SCENARIOS on redis, zk, etcd, pg and mysql with the peers, ${DURATION}s per side (several minutes)"
B0=$SECONDS
# From the root, so the relative paths in the command are the ones used.
# In the background and waited for: bash runs a trap only once the
# foreground command is over, and a TERM to this script must stop the
# servers now, not after the bench.
(cd "$ROOT" && printf '+ %s\n' "$CMDLINE" && exec "$(rel "$BENCH")" "${ARGS[@]}") \
    > >(tee "$WORK/bench.txt") &
BENCH_PID=$!
brc=0
wait "$BENCH_PID" || brc=$?
BENCH_PID=""
((brc == 0)) || { echo "$PROG: cerberus-bench failed (status $brc); the page is left as it was" >&2; exit "$brc"; }
BENCH_S=$((SECONDS - B0))

step "describe the run (machine, servers, peers, commit) into $(rel "$JSON").meta.json"
run "$PY" "$REPORT_PY" meta --out "$JSON.meta.json" --root "$ROOT" \
    --command "$CMDLINE" --script-command "scripts/$PROG --duration $DURATION" \
    --started "$STARTED_UTC" --seconds "$BENCH_S" --loadavg "$LOAD_BEFORE" \
    --redis-port "$REDIS_PORT" --zk-port "$ZK_PORT" --etcd-port "$ETCD_PORT" \
    --pg-port "$PG_PORT" --mysql-port "$MYSQL_PORT" \
    --build-dir "$BUILD_DIR" --config "$WORK/stores.cfg"

if ((JSON_ONLY)); then
    echo "JSON: $JSON (metadata $JSON.meta.json), plot: $PNG; render with --from-json $JSON"
    exit 0
fi
render "$JSON"
echo "page: $OUT/performance.md  plot: $PNG  JSON: $JSON  table: $WORK/bench.txt"
