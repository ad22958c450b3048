#!/usr/bin/env bash
# test_bench_json.sh — the shape of cerberus-bench's --json output, with no
# server: every scenario of `--scenario all --peers` on the in-process local
# engine, kept short (--duration 1, 20 waiters, 2000 locks), then the JSON
# checked with Python's json module: the schema every row follows
# (check_bench_json.py, with the peer fields: the local engine has no peers,
# so every row says "peer": null and there is no peer row), then what the
# local run itself must show; the coordination primitives' scenarios
# (semaphore, rwlock, elect-failover's note) likewise. Also: --plot draws a PNG when gnuplot is
# installed, and says plainly when it is not; bad options exit 2. The peer
# rows themselves are tested against a real server in test_bench_peers.sh.
#
# Usage: test_bench_json.sh PATH/TO/cerberus-bench
#
# Every run is under timeout(1). Output is TAP-like: one "ok"/"not ok" line
# per check; the exit status is 1 if any failed.

set -u

BENCH=${1:?usage: test_bench_json.sh PATH/TO/cerberus-bench}
# Absolute, so it still runs with PATH emptied (check 4).
case $BENCH in /*) ;; *) BENCH=$PWD/$BENCH ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-json

# 1. The full run on the local engine.
if timeout 100 "$BENCH" --engine local --scenario all --duration 1 \
        --waiters 20 --locks 2000 --peers --json "$WORK/out.json" \
        >"$WORK/table.txt" 2>"$WORK/err.txt"; then
    ok "cerberus-bench --scenario all --peers on the local engine exits 0"
else
    not_ok "cerberus-bench --scenario all --peers on the local engine exits 0 (status $?)"
    sed 's/^/# /' "$WORK/err.txt" "$WORK/table.txt"
fi
check "the table says the local engine has no peers" \
    grep -q '^# peers: none for these engines' "$WORK/table.txt"

# 2. The JSON: the schema of every object (peer fields included), then the
# local run's own figures.
check "the JSON follows the schema, with no peer rows on the local engine" \
    "$PY" "$HERE/check_bench_json.py" "$WORK/out.json" --engine local --peer-rows none
if "$PY" - "$WORK/out.json" <<'PYEOF'
import json, sys

def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)

errors = []
try:
    with open(sys.argv[1]) as f:
        rows = json.load(f)
except (OSError, ValueError) as e:
    print("# cannot read the JSON: %s" % e)
    sys.exit(1)
if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
    print("# the JSON is not an array of objects")
    sys.exit(1)
for i, r in enumerate(rows):
    if r.get("ratio") is not None:
        errors.append("object %d (%s): the local engine has no ceiling, ratio must be null"
                      % (i, r.get("scenario")))

seen = [r.get("scenario") for r in rows if isinstance(r, dict)]
want = ["uncontended", "contended", "handoff", "herd", "many", "guard", "guard-dup"]
if seen != want:
    errors.append("scenarios are %r, expected %r" % (seen, want))
by = {r.get("scenario"): r for r in rows if isinstance(r, dict)}
m = by.get("many", {})
if m.get("locks") != 2000:
    errors.append("many: locks is %r, expected 2000" % m.get("locks"))
for k in ("cpu_percent", "bytes_per_lock"):
    if not num(m.get(k)):
        errors.append("many: %s is not a number" % k)
if m.get("not_valid") != 0:
    errors.append("many: %r holds not valid at the end" % m.get("not_valid"))
h = by.get("herd", {})
if h.get("waiters") != 20 or h.get("threads") != 20:
    errors.append("herd: waiters/threads are %r/%r, expected 20" %
                  (h.get("waiters"), h.get("threads")))
if not isinstance(h.get("rounds"), int) or h["rounds"] < 1:
    errors.append("herd: rounds is %r" % h.get("rounds"))
if not isinstance(h.get("acquisitions"), int) or h["acquisitions"] != 20 * h.get("rounds", 0):
    errors.append("herd: acquisitions %r is not 20 x rounds" % h.get("acquisitions"))
if by.get("contended", {}).get("threads") != 8:
    errors.append("contended: threads is not the default 8")
for e in errors:
    print("# " + e)
sys.exit(1 if errors else 0)
PYEOF
then
    ok "the local run's figures are as documented"
else
    not_ok "the local run's figures are as documented"
fi

# 3. --plot: a PNG when gnuplot is installed.
if command -v gnuplot >/dev/null 2>&1; then
    if timeout 100 "$BENCH" --engine local --scenario uncontended,many \
            --duration 0.2 --locks 100 --plot "$WORK/out.png" \
            >"$WORK/plot.txt" 2>&1 &&
        [ "$(head -c 8 "$WORK/out.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
        ok "--plot writes a PNG"
    else
        not_ok "--plot writes a PNG"
        sed 's/^/# /' "$WORK/plot.txt"
    fi
else
    ok "--plot writes a PNG # SKIP gnuplot is not installed"
fi

# 4. --plot without gnuplot on PATH: a clear error before any run, status 2.
out=$(timeout 30 env PATH=/nonexistent "$BENCH" --engine local --scenario uncontended \
    --duration 0.2 --plot "$WORK/none.png" 2>&1)
st=$?
check "--plot without gnuplot exits 2 and names it" \
    test "$st" = 2 -a -n "$(printf '%s' "$out" | grep gnuplot-nox)"

# 5. Bad command lines exit 2.
timeout 30 "$BENCH" --engine local --scenario nosuch >/dev/null 2>&1
check "an unknown scenario exits 2" test $? = 2
timeout 30 "$BENCH" --engine local --scenario failover,herd >/dev/null 2>&1
check "failover with other scenarios exits 2" test $? = 2
timeout 30 "$BENCH" --engine local --locks 0 >/dev/null 2>&1
check "--locks 0 exits 2" test $? = 2

# 6. The serve scenario (the daemon in-process on a socket of its own): its
# rows, and the round trips measured through libcurl and the lean client.
if timeout 120 "$BENCH" --engine local --scenario serve --duration 1 --waiters 4 \
        --json "$WORK/serve.json" >"$WORK/serve.txt" 2>&1; then
    ok "cerberus-bench --scenario serve on the local engine exits 0"
else
    not_ok "cerberus-bench --scenario serve on the local engine exits 0 (status $?)"
    sed 's/^/# /' "$WORK/serve.txt"
fi
check "the serve JSON follows the schema" \
    "$PY" "$HERE/check_bench_json.py" "$WORK/serve.json" --engine local --peer-rows none
check "the serve row has both clients' cycle and round trip, the hand-off row follows" \
    "$PY" - "$WORK/serve.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))
serve = [r for r in rows if r["scenario"] == "serve"]
ho = [r for r in rows if r["scenario"] == "serve-handoff"]
ok = len(serve) == 1 and len(ho) == 1 and serve[0]["ops"] > 0
for k in ("http_rtt_p50_us", "lean_p50_us", "lean_rtt_p50_us", "lean_ops_per_s"):
    ok = ok and serve[0].get(k, 0) > 0
sys.exit(0 if ok else 1)
PYEOF

# 7. The coordination primitives (issue 28) on the local engine: a
# semaphore row per --permits value (threads 2N), the read-write lock's row
# with its reads and writes, and elect-failover's note (the local engine's
# elections live in one process).
if timeout 120 "$BENCH" --engine local --scenario semaphore,rwlock,elect-failover \
        --duration 0.5 --permits 1,2 --threads 4 --peers --json "$WORK/prims.json" \
        >"$WORK/prims.txt" 2>&1; then
    ok "cerberus-bench --scenario semaphore,rwlock,elect-failover on the local engine exits 0"
else
    not_ok "cerberus-bench --scenario semaphore,rwlock,elect-failover on the local engine exits 0 (status $?)"
    sed 's/^/# /' "$WORK/prims.txt"
fi
check "the primitives' JSON follows the schema, with no peer rows on the local engine" \
    "$PY" "$HERE/check_bench_json.py" "$WORK/prims.json" --engine local --peer-rows none
check "semaphore rows for 1 and 2 permits, rwlock with 4 clients, elect-failover's note" \
    "$PY" - "$WORK/prims.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))
got = [(r["scenario"], r["threads"], r.get("permits")) for r in rows]
want = [("semaphore", 2, 1), ("semaphore", 4, 2), ("rwlock", 4, None), ("elect-failover", 3, None)]
rw = rows[2] if len(rows) > 2 else {}
ok = got == want and rw.get("reads", 0) > 0 and rw.get("writes", 0) > 0 \
    and "one process" in rows[3].get("note", "")
if not ok:
    print("# got %r" % got)
sys.exit(0 if ok else 1)
PYEOF
timeout 30 "$BENCH" --engine local --scenario semaphore --permits 0 >/dev/null 2>&1
check "--permits 0 exits 2" test $? = 2
timeout 30 "$BENCH" --engine local --scenario elect-failover --rounds 21 >/dev/null 2>&1
check "--rounds 21 exits 2" test $? = 2

echo "1..$N"
exit $FAILED
