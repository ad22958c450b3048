#!/usr/bin/env bash
# test_bench_prims.sh — the coordination primitives' scenarios of
# cerberus-bench (issue 28) against the shared test redis-server
# ($CERB_REDIS_PORT), each short: elect-failover (3 candidate processes, a
# 1 s lease, 2 leaders killed) with the redis-py election loop as its peer;
# semaphore (1 permit, 2 clients) with npm redis-semaphore; rwlock, whose
# redis row has no peer ("skipped: no peer: ..."). The JSON of each is
# checked against the schema (check_bench_json.py) and for what the run
# must show: every failover within the lease + 1 RTT, no candidate process
# left behind. Peers that are not installed (python3-redis, Node, an
# unreachable npm registry) give "skipped" rows, which pass. Also the peer
# scripts on their own: redis_semaphore.sh --check says ok or skip and
# refuses another scenario with status 2; elect_driver.py drives stand-in
# candidates (python processes taking a flock in turn) through 3 rounds.
#
# Usage: test_bench_prims.sh PATH/TO/cerberus-bench
#
# Every run is under timeout(1). Output is TAP-like: one "ok"/"not ok" line
# per check; the exit status is 1 if any failed.

set -u

BENCH=${1:?usage: test_bench_prims.sh PATH/TO/cerberus-bench}
case $BENCH in /*) ;; *) BENCH=$PWD/$BENCH ;; esac
PORT=${CERB_REDIS_PORT:?CERB_REDIS_PORT is not set (run under ctest)}
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS=$(cd "$HERE/../../bench/peers" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-prims
show() { sed 's/^/# /' "$@"; }
schema() { "$PY" "$HERE/check_bench_json.py" "$@"; }

# 1. elect-failover on redis, with its peer.
timeout 200 "$BENCH" --engine redis --port "$PORT" --scenario elect-failover --lease 1000 \
    --rounds 2 --candidates 3 --peers --json "$WORK/ef.json" >"$WORK/ef.txt" 2>&1 &
bpid=$!
wait $bpid
st=$?
if [ $st = 0 ]; then
    ok "elect-failover on redis exits 0"
else
    not_ok "elect-failover on redis exits 0 (status $st)"
    show "$WORK/ef.txt"
fi
check "its JSON follows the schema, with a peer row" schema "$WORK/ef.json" --engine redis \
    --peer-rows some --peer-status measured --peer-status skipped
# Whether the bound was met is a measurement (a loaded machine may miss it):
# its field is checked for its type, not its value.
check "every failover measured against the 1 s lease + 1 RTT; redis-py's loop measured or skipped" \
    "$PY" - "$WORK/ef.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))
c = rows[0]
ok = (c["scenario"] == "elect-failover" and c["bound_ms"] == 1000 and c["rounds"] == 2
      and c["candidates"] == 3 and isinstance(c["target_met"], bool) and len(rows) == 2
      and rows[1]["peer"] == "redis-py")
if not ok:
    print("# %r" % rows)
sys.exit(0 if ok else 1)
PYEOF
# The bench reaps its candidates before it exits: none may be left now.
check "no candidate process is left behind" \
    sh -c "! ps -eo args | grep -v grep | grep -q -- 'bench-elect-$bpid'"

# 2. semaphore on redis with npm redis-semaphore.
if timeout 200 "$BENCH" --engine redis --port "$PORT" --scenario semaphore --permits 1 \
        --duration 0.5 --peers --json "$WORK/sem.json" >"$WORK/sem.txt" 2>&1; then
    ok "semaphore on redis exits 0"
else
    not_ok "semaphore on redis exits 0 (status $?)"
    show "$WORK/sem.txt"
fi
check "its JSON follows the schema: permits 1, 2 clients, the redis-semaphore row" \
    schema "$WORK/sem.json" --engine redis --peer-rows some --peer-status measured \
    --peer-status skipped
check "the semaphore row has an RTT ceiling and the peer is redis-semaphore" \
    "$PY" - "$WORK/sem.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
ok = (r[0]["permits"] == 1 and r[0]["threads"] == 2 and r[0]["ceiling_kind"] == "rtt"
      and r[1]["peer"] == "redis-semaphore")
sys.exit(0 if ok else 1)
PYEOF

# 3. rwlock on redis: no peer, said so.
if timeout 200 "$BENCH" --engine redis --port "$PORT" --scenario rwlock --threads 4 \
        --duration 0.5 --peers --json "$WORK/rw.json" >"$WORK/rw.txt" 2>&1; then
    ok "rwlock on redis exits 0"
else
    not_ok "rwlock on redis exits 0 (status $?)"
    show "$WORK/rw.txt"
fi
check "its JSON follows the schema, the peer row skipped" schema "$WORK/rw.json" \
    --engine redis --peer-rows some --peer-status skipped
check "the table says there is no peer" grep -q 'none .*skipped: no peer' "$WORK/rw.txt"

# 4. The peer scripts on their own.
out=$(timeout 300 bash "$PEERS/redis_semaphore.sh" --check --port "$PORT" 2>/dev/null)
check "redis_semaphore.sh --check says ok or skip" \
    sh -c "printf '%s' \"\$1\" | grep -Eq '^(ok redis-semaphore|skip )'" _ "$out"
timeout 30 bash "$PEERS/redis_semaphore.sh" --scenario rwlock >/dev/null 2>&1
check "redis_semaphore.sh refuses another scenario (status 2)" test $? = 2
timeout 30 "$PY" "$PEERS/redispy_lock.py" --scenario semaphore >/dev/null 2>&1
check "redispy_lock.py refuses a scenario it does not measure (status 2)" test $? = 2
CAND='import fcntl, sys, time
f = open(sys.argv[1], "w")
print("ready", sys.argv[2], flush=True)
fcntl.flock(f, fcntl.LOCK_EX)
print("elected", sys.argv[2], time.monotonic_ns(), flush=True)
sys.stdin.read()'
out=$(timeout 60 "$PY" "$PEERS/elect_driver.py" --peer stand-in --how "flock stand-ins" \
    --threads 3 --rounds 3 --lease-ms 100 -- "$PY" -c "$CAND" "$WORK/flock" "{idx}" 2>&1)
check "elect_driver.py: 3 rounds of stand-in candidates give a result line" \
    sh -c "printf '%s' \"\$1\" | grep -Eq '^result peer=stand-in scenario=elect-failover threads=3 .*samples=3 # flock stand-ins'" _ "$out"
[ "$FAILED" = 0 ] || printf '# %s\n' "$out"

echo "1..$N"
exit $FAILED
