#!/usr/bin/env bash
# test_bench_peers.sh — `cerberus-bench --peers` against the shared test
# redis-server ($CERB_REDIS_PORT): the peer rows in the table and in the
# JSON (checked by check_bench_json.py), for a peer that runs (redis-py,
# when Debian's python3-redis is installed), one that is not installed
# (CERB_PEER_PYTHON pointing nowhere: a "skipped" row, exit status 0), and
# stand-in peer scripts (CERB_BENCH_PEERS_DIR) that hang with a child
# holding their pipes (killed at CERB_BENCH_PEER_LIMIT_S, the child too),
# print no result, fail, or say "skip" at the check (one row for the run,
# not one per scenario). Also: the peers in the --plot picture, and a bad
# CERB_BENCH_PEER_LIMIT_S exits 2.
#
# Usage: test_bench_peers.sh PATH/TO/cerberus-bench
#
# Every run is under timeout(1) and short (0.3..1 s per side, 2 waiters).
# Output is TAP-like: one "ok"/"not ok" line per check; the exit status is 1
# if any failed.

set -u

BENCH=${1:?usage: test_bench_peers.sh PATH/TO/cerberus-bench}
case $BENCH in /*) ;; *) BENCH=$PWD/$BENCH ;; esac
PORT=${CERB_REDIS_PORT:?CERB_REDIS_PORT is not set (run under ctest)}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-peers
show() { sed 's/^/# /' "$@"; }
schema() { "$PY" "$HERE/check_bench_json.py" "$@"; }
# jq-less JSON probe: prints the peer rows as "peer scenario status reason".
peer_rows() {
    "$PY" -c '
import json, sys
for r in json.load(open(sys.argv[1])):
    if r.get("peer"):
        print(r["peer"], r["scenario"], r["peer_status"], r.get("peer_reason") or "")' "$1"
}
# bench NAME [ENV=VALUE...] -- ARGS...: run with a JSON and a table in WORK.
bench() {
    local name=$1
    shift
    local -a envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    timeout 120 env ${envs[@]+"${envs[@]}"} "$BENCH" --port "$PORT" --peers \
        --json "$WORK/$name.json" "$@" >"$WORK/$name.txt" 2>"$WORK/$name.err"
}

# 1. A peer that runs: redis-py next to Cerberus, uncontended and handoff.
if "$PY" -c 'import redis' 2>/dev/null; then
    if bench real -- --scenario uncontended,handoff --threads 1 --waiters 2 --duration 1; then
        ok "--peers with redis-py exits 0"
    else
        not_ok "--peers with redis-py exits 0 (status $?)"
        show "$WORK/real.err" "$WORK/real.txt"
    fi
    check "redis-py rows follow the schema and were measured" \
        schema "$WORK/real.json" --engine redis --peer-rows some --peer-status measured
    check "one redis-py row under uncontended and one under handoff" \
        test "$(peer_rows "$WORK/real.json" | awk '{print $1, $2, $3}' | tr '\n' ';')" = \
        "redis-py uncontended measured;redis-py handoff measured;"
    check "the table gives cerberus/peer for both" \
        test "$(grep -c '^[a-z]* *redis-py .*cerberus/peer' "$WORK/real.txt")" = 2
else
    for what in "--peers with redis-py exits 0" "redis-py rows follow the schema" \
        "one redis-py row per scenario" "the table gives cerberus/peer"; do
        ok "$what # SKIP python3-redis is not installed for $PY"
    done
fi

# 2. A peer that is not installed: one "skipped" row, never a failure.
if bench nopy CERB_PEER_PYTHON=/nonexistent/python3 -- \
        --scenario uncontended,handoff --waiters 2 --duration 0.3; then
    ok "a missing peer does not fail the bench"
else
    not_ok "a missing peer does not fail the bench (status $?)"
    show "$WORK/nopy.err" "$WORK/nopy.txt"
fi
check "the missing peer is one skipped row in the JSON" \
    schema "$WORK/nopy.json" --engine redis --peer-rows some --peer-status skipped
check "its reason names the interpreter" \
    test "$(peer_rows "$WORK/nopy.json" | grep -c '^redis-py uncontended skipped /nonexistent/python3 not found')" = 1
check "the table says skipped and why" \
    grep -q 'redis-py .*skipped: /nonexistent/python3 not found' "$WORK/nopy.txt"

# 3. Stand-in peers in a directory of their own (one script, its mode in
# FAKE_MODE, which the bench passes on in the environment).
mkdir -p "$WORK/fake"
cat >"$WORK/fake/redispy_lock.py" <<'EOF'
import os, subprocess, sys, time
mode = os.environ.get("FAKE_MODE", "")
if "--check" in sys.argv:
    if mode == "skip-check":
        print("skip the stand-in is not installed")
        sys.exit(3)
    print("ok stand-in")
    sys.exit(0)
if mode == "hang":
    # A child that would outlive the script, holding its pipes.
    child = subprocess.Popen(["sleep", "300"])
    with open(os.environ["FAKE_PIDFILE"], "w") as f:
        f.write("%d\n" % child.pid)
    time.sleep(300)
elif mode == "garbage":
    print("nothing useful")
elif mode == "error":
    sys.stderr.write("x" * 3000 + "\nstand-in: the server said no\n")
    sys.exit(1)
else:
    scen = sys.argv[sys.argv.index("--scenario") + 1]
    print("result peer=redis-py scenario=%s threads=1 ops_per_s=500 p50_us=900 "
          "p90_us=950 p99_us=1800 max_us=2000 samples=500 # a stand-in" % scen)
EOF
fake() { # fake NAME MODE ARGS...
    local name=$1 mode=$2
    shift 2
    bench "$name" CERB_BENCH_PEERS_DIR="$WORK/fake" FAKE_MODE="$mode" \
        FAKE_PIDFILE="$WORK/$name.pid" CERB_BENCH_PEER_LIMIT_S=3 -- "$@"
}

start=$(date +%s)
fake hang hang --scenario uncontended --duration 0.3
st=$?
took=$(($(date +%s) - start))
check "a hanging peer does not fail the bench" test "$st" = 0
check "it is killed at its limit (run took ${took}s)" test "$took" -lt 60
check "its row says failed: killed after its limit" \
    grep -q 'redis-py .*failed: killed after its 3 s limit' "$WORK/hang.txt"
check "the failed row follows the schema" \
    schema "$WORK/hang.json" --peer-rows some --peer-status failed
# Gone, or a zombie: PID 1 of a container may never reap what it inherits.
dead() {
    local stat
    [ -n "$1" ] || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    case ${stat%% *} in Z | X) return 0 ;; *) return 1 ;; esac
}
check "the peer's child was stopped with it" dead "$(cat "$WORK/hang.pid" 2>/dev/null)"

fake garbage garbage --scenario uncontended --duration 0.3
check "a peer without a result line is a failed row" \
    grep -q 'redis-py .*failed: no result line' "$WORK/garbage.txt"
fake error error --scenario uncontended --duration 0.3
check "a failing peer's row gives its exit status and last message" \
    grep -q 'redis-py .*failed: exit status 1: stand-in: the server said no' "$WORK/error.txt"
fake skipcheck skip-check --scenario uncontended,handoff --waiters 2 --duration 0.3
check "a peer skipped at its check is one row for the whole run" \
    test "$(peer_rows "$WORK/skipcheck.json" | tr '\n' ';')" = \
    "redis-py uncontended skipped the stand-in is not installed;"
fake good good --scenario uncontended,handoff --waiters 2 --duration 0.3
check "a stand-in result gives measured rows with ratios" \
    schema "$WORK/good.json" --peer-rows some --peer-status measured
check "its handoff row compares p50 and p99" \
    "$PY" -c '
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r.get("peer") and r["scenario"] == "handoff"]
sys.exit(0 if len(rows) == 1 and rows[0]["cerberus_over_peer"] > 0
         and rows[0]["cerberus_over_peer_p99"] > 0 and rows[0]["compared"] == "p50_us" else 1)' \
    "$WORK/good.json"

# 4. The peers in the picture.
if command -v gnuplot >/dev/null 2>&1; then
    if fake plot good --scenario uncontended --duration 0.3 --plot "$WORK/peers.png" &&
        [ "$(head -c 8 "$WORK/peers.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
        ok "--plot --peers writes a PNG"
    else
        not_ok "--plot --peers writes a PNG"
        show "$WORK/plot.err"
    fi
else
    ok "--plot --peers writes a PNG # SKIP gnuplot is not installed"
fi

# 5. Bad input.
timeout 30 env CERB_BENCH_PEER_LIMIT_S=soon "$BENCH" --port "$PORT" --peers \
    --scenario uncontended >/dev/null 2>"$WORK/badlimit.err"
check "a bad CERB_BENCH_PEER_LIMIT_S exits 2 and says so" \
    test $? = 2 -a -n "$(grep CERB_BENCH_PEER_LIMIT_S "$WORK/badlimit.err")"
timeout 30 "$BENCH" --port "$PORT" --peers --scenario failover >/dev/null 2>&1
check "--peers with the failover scenario exits 2" test $? = 2

echo "1..$N"
exit $FAILED
