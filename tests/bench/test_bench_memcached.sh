#!/usr/bin/env bash
# test_bench_memcached.sh — cerberus-bench's memcached rows (issue 29) on
# the shared test memcached ($CERB_MEMCACHED_PORT), short:
# `--engine memcached --scenario uncontended,contended,handoff,guard`.
# uncontended and contended must carry the raw ceiling on the same server
# (ceiling_kind ops: `ms ... ME c` + `md ... C<cas>` per cycle) with a
# ratio, handoff the round trip (`mn`) with a ratio; the guard row is
# "skipped" (memcached refuses the guard), not a failure. The JSON follows
# the schema (check_bench_json.py) and the header names the server.
#
# Usage: test_bench_memcached.sh PATH/TO/cerberus-bench
#
# Every run is under timeout(1). Output is TAP-like: one "ok"/"not ok" line
# per check; the exit status is 1 if any failed.

set -u

BENCH=${1:?usage: test_bench_memcached.sh PATH/TO/cerberus-bench}
case $BENCH in /*) ;; *) BENCH=$PWD/$BENCH ;; esac
PORT=${CERB_MEMCACHED_PORT:?CERB_MEMCACHED_PORT is not set (run under ctest)}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-memcached
show() { sed 's/^/# /' "$@"; }

if timeout 120 "$BENCH" --engine memcached --memcached-port "$PORT" \
        --scenario uncontended,contended,handoff,guard --threads 2 --waiters 3 \
        --duration 0.5 --json "$WORK/mc.json" >"$WORK/mc.txt" 2>&1; then
    ok "uncontended, contended, handoff and guard on memcached exit 0"
else
    not_ok "uncontended, contended, handoff and guard on memcached exit 0 (status $?)"
    show "$WORK/mc.txt"
fi
check "its JSON follows the schema, every row on engine memcached" \
    "$PY" "$HERE/check_bench_json.py" "$WORK/mc.json" --engine memcached --peer-rows none
check "the rows: the raw ceilings with ratios, the guard skipped" \
    "$PY" - "$WORK/mc.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))
by = {r["scenario"]: r for r in rows}
u, c, h, g = (by.get(k) for k in ("uncontended", "contended", "handoff", "guard"))
ok = (u is not None and c is not None and h is not None and g is not None
      and u["threads"] == 2 and u["ops"] > 0
      and u["ceiling_kind"] == "ops" and u["ceiling_ops_per_s"] > 0 and u["ratio"] > 0
      and c["ceiling_kind"] == "ops" and c["ceiling_ops_per_s"] > 0 and c["ratio"] > 0
      and h["ceiling_kind"] == "rtt" and h["ceiling_p50_us"] > 0 and h["ratio"] > 0
      and g.get("note", "").startswith("skipped: engine memcached"))
if not ok:
    print("# %r" % rows)
sys.exit(0 if ok else 1)
PYEOF
check "the header names the server and the ceiling" \
    grep -q "^# memcached at 127.0.0.1:$PORT (raw ceiling on the same server" "$WORK/mc.txt"

# No server on the port: the bench fails plainly (status 1) rather than
# printing a row measured against nothing.
timeout 30 "$BENCH" --engine memcached --memcached-port 1 --scenario uncontended \
    --duration 0.2 >"$WORK/bad.txt" 2>&1
check "no server on the port: exit 1, not a row" test $? = 1

echo "1..$N"
exit $FAILED
