#!/usr/bin/env bash
# test_bench_redlock.sh — cerberus-bench's Redlock rows (issue 29) against
# the three shared test Redlock masters ($CERB_REDLOCK_PORT, +1, +2), each
# short: `--engine redlock --scenario uncontended,handoff --peers`. The rows
# must say engine "redlock", carry the Redlock raw ceiling (ops/s for
# uncontended, the round trip to every master for handoff) with a ratio,
# and have node-redlock's row under each (measured, or skipped when Node
# or the npm registry is missing). The JSON follows the schema
# (check_bench_json.py). Also node_redlock.sh on its own: --check says ok
# or skip, and a bad --nodes is refused with status 2.
#
# Usage: test_bench_redlock.sh PATH/TO/cerberus-bench
#
# Every run is under timeout(1). Output is TAP-like: one "ok"/"not ok" line
# per check; the exit status is 1 if any failed.

set -u

BENCH=${1:?usage: test_bench_redlock.sh PATH/TO/cerberus-bench}
case $BENCH in /*) ;; *) BENCH=$PWD/$BENCH ;; esac
PORT=${CERB_REDLOCK_PORT:?CERB_REDLOCK_PORT is not set (run under ctest)}
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS=$(cd "$HERE/../../bench/peers" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-redlock
show() { sed 's/^/# /' "$@"; }

if timeout 200 "$BENCH" --engine redlock --port "$PORT" --scenario uncontended,handoff \
        --waiters 3 --duration 0.5 --peers --json "$WORK/rl.json" >"$WORK/rl.txt" 2>&1; then
    ok "uncontended and handoff on redlock exit 0"
else
    not_ok "uncontended and handoff on redlock exit 0 (status $?)"
    show "$WORK/rl.txt"
fi
check "its JSON follows the schema, every row on engine redlock" \
    "$PY" "$HERE/check_bench_json.py" "$WORK/rl.json" --engine redlock --peer-rows some \
    --peer-status measured --peer-status skipped
check "the rows: Redlock's ceilings with ratios, node-redlock under each" \
    "$PY" - "$WORK/rl.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))
cerb = {r["scenario"]: r for r in rows if not r.get("peer")}
peers = [r for r in rows if r.get("peer")]
u, h = cerb.get("uncontended"), cerb.get("handoff")
ok = (u is not None and h is not None
      and u["ceiling_kind"] == "ops" and u["ceiling_ops_per_s"] > 0 and u["ratio"] > 0
      and h["ceiling_kind"] == "rtt" and h["ceiling_p50_us"] > 0 and h["ratio"] > 0
      and sorted(p["scenario"] for p in peers) == ["handoff", "uncontended"]
      and all(p["peer"] == "node-redlock" for p in peers))
if not ok:
    print("# %r" % rows)
sys.exit(0 if ok else 1)
PYEOF
check "the header names the masters and the ceiling" \
    grep -q "^# redlock: the redis engine in Redlock mode on 127.0.0.1:$PORT" "$WORK/rl.txt"

nodes="127.0.0.1:$PORT,127.0.0.1:$((PORT + 1)),127.0.0.1:$((PORT + 2))"
out=$(timeout 320 bash "$PEERS/node_redlock.sh" --check --nodes "$nodes" 2>&1)
st=$?
if { [ $st = 0 ] && [[ $out == "ok node-redlock 4.2.0"* ]]; } || { [ $st = 3 ] && [[ $out == skip* ]]; }; then
    ok "node_redlock.sh --check: ok or skip ($out)"
else
    not_ok "node_redlock.sh --check: ok or skip (status $st: $out)"
fi
timeout 30 bash "$PEERS/node_redlock.sh" --scenario uncontended --nodes "127.0.0.1" >/dev/null 2>&1
check "node_redlock.sh refuses a bad --nodes with status 2" test $? = 2

echo "1..$N"
exit $FAILED
