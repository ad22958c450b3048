#!/usr/bin/env bash
# test_bench_guard.sh — the guard scenario of cerberus-bench, short, on the
# local engine (no server) and on a test redis-server ($CERB_REDIS_PORT,
# the exclusive one: the commands are counted on the server): each run gives a "guard" row (begin + finish(1) on
# distinct keys) and a "guard-dup" row (begin on keys already done:
# CERB_DUPLICATE) per thread count, in the table and the JSON (checked by
# check_bench_json.py). On redis both rows have a ratio to the raw ceiling
# (the same server commands with no library: SET NX PX GET + EVALSHA of the
# finish script, and SET NX PX GET alone on a done record) and the server
# commands per operation counted with INFO commandstats (which counts a
# script's own calls too): the library's equal to the raw ceiling's (4 per
# begin + finish: SET, EVALSHA, its GET and SET), and 1 per duplicate (a
# lone SET: one round trip). The local engine has no server,
# so no ceiling: the rows say so ("no ceiling for engine local") and the
# ratio is null. The figures themselves are not judged here (the machine
# is shared); that they are there and sane is.
#
# With CERB_GUARD_BENCH_ENGINE=zk|etcd and CERB_GUARD_BENCH_PORT (ctest
# bench_guard_zk, bench_guard_etcd, on the exclusive test servers: requests
# are counted on the server) it checks instead the rows of that engine. zk
# and etcd have their raw guard steps (bench/ceiling_guard_<e>.c): both rows
# need a positive ratio and the same requests per operation on both sides,
# as the server counted them (zk with mntr: 3 per begin + finish, 2 per
# duplicate; etcd with its gRPC counters: 2 and 1). An engine whose raw
# guard steps are not written (the HOOK in bench/ceiling_guard.c), or
# without a guard at all, must not fail the run: the rows say "no ceiling
# for engine E", or one row notes that the engine has no idempotency guard
# in this build.
#
# Usage: test_bench_guard.sh PATH/TO/cerberus-bench
#
# Every run is under timeout(1). Output is TAP-like: one "ok"/"not ok" line
# per check; the exit status is 1 if any failed.

set -u

BENCH=${1:?usage: test_bench_guard.sh PATH/TO/cerberus-bench}
case $BENCH in /*) ;; *) BENCH=$PWD/$BENCH ;; esac
HOOKED=${CERB_GUARD_BENCH_ENGINE:-}
if [ -n "$HOOKED" ]; then
    PORT=${CERB_GUARD_BENCH_PORT:?CERB_GUARD_BENCH_PORT is not set (run under ctest)}
else
    PORT=${CERB_REDIS_PORT:?CERB_REDIS_PORT is not set (run under ctest)}
fi
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-guard
show() { sed 's/^/# /' "$@"; }

# figures FILE ENGINE: the guard rows as the run must show them.
figures() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys

def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)

path, engine = sys.argv[1], sys.argv[2]
rows = json.load(open(path))
errors = []
seen = [(r.get("scenario"), r.get("threads")) for r in rows]
want = [("guard", 1), ("guard-dup", 1), ("guard", 2), ("guard-dup", 2)]
if seen != want:
    errors.append("rows are %r, expected %r" % (seen, want))
for r in rows:
    where = "%s x%s" % (r.get("scenario"), r.get("threads"))
    if not num(r.get("ops_per_s")) or r["ops_per_s"] <= 0:
        errors.append("%s: ops_per_s %r" % (where, r.get("ops_per_s")))
    if not isinstance(r.get("ops"), int) or r["ops"] < 1:
        errors.append("%s: ops %r" % (where, r.get("ops")))
    cmds = r.get("server_cmds_per_op")
    if engine == "redis":
        if not num(r.get("ratio")) or r["ratio"] <= 0:
            errors.append("%s: ratio %r is not a positive number" % (where, r.get("ratio")))
        if r.get("ceiling_missing") is not None:
            errors.append("%s: ceiling_missing %r on redis" % (where, r["ceiling_missing"]))
        if not num(r.get("ceiling_ops_per_s")) or r["ceiling_ops_per_s"] <= 0:
            errors.append("%s: ceiling_ops_per_s %r" % (where, r.get("ceiling_ops_per_s")))
        # SET + EVALSHA (GET, SET inside) per cycle, SET alone per
        # duplicate; the client's prober adds a few commands a second,
        # nothing near 0.1 per op.
        raw = r.get("ceiling_server_cmds_per_op")
        lo, hi = (5.9, 6.1) if r.get("scenario") == "guard" else (1.9, 2.1)
        if not num(cmds) or not lo <= cmds <= hi:
            errors.append("%s: server_cmds_per_op %r not in %g..%g" % (where, cmds, lo, hi))
        if not num(raw) or not lo <= raw <= hi:
            errors.append("%s: ceiling_server_cmds_per_op %r not in %g..%g" % (where, raw, lo, hi))
    else:
        if r.get("ratio") is not None:
            errors.append("%s: ratio %r without a ceiling" % (where, r["ratio"]))
        cm = r.get("ceiling_missing")
        if not isinstance(cm, str) or "no ceiling for engine local" not in cm:
            errors.append("%s: ceiling_missing %r" % (where, cm))
        if cmds is not None:
            errors.append("%s: server_cmds_per_op %r without a server" % (where, cmds))
for e in errors:
    print("# " + e)
sys.exit(1 if errors else 0)
PYEOF
}

run_engine() { # ENGINE ARGS...
    local engine=$1
    shift
    if timeout 120 "$BENCH" "$@" --engine "$engine" --scenario guard \
            --threads 1,2 --duration 0.6 --json "$WORK/$engine.json" \
            >"$WORK/$engine.txt" 2>"$WORK/$engine.err"; then
        ok "cerberus-bench --scenario guard on $engine exits 0"
    else
        not_ok "cerberus-bench --scenario guard on $engine exits 0 (status $?)"
        show "$WORK/$engine.err" "$WORK/$engine.txt"
        return
    fi
    check "$engine: the JSON follows the schema" \
        "$PY" "$HERE/check_bench_json.py" "$WORK/$engine.json" --engine "$engine" \
        --peer-rows none
    if figures "$WORK/$engine.json" "$engine"; then
        ok "$engine: guard and guard-dup rows with the documented figures"
    else
        not_ok "$engine: guard and guard-dup rows with the documented figures"
        show "$WORK/$engine.txt"
    fi
}

# An engine of the HOOK: the run ends well and says what it could not do.
if [ -n "$HOOKED" ]; then
    if timeout 120 "$BENCH" --engine "$HOOKED" --port "$PORT" --scenario guard \
            --duration 0.3 --json "$WORK/hooked.json" >"$WORK/hooked.txt" \
            2>"$WORK/hooked.err"; then
        ok "cerberus-bench --scenario guard on $HOOKED exits 0"
    else
        not_ok "cerberus-bench --scenario guard on $HOOKED exits 0 (status $?)"
        show "$WORK/hooked.err" "$WORK/hooked.txt"
    fi
    check "$HOOKED: the JSON follows the schema" \
        "$PY" "$HERE/check_bench_json.py" "$WORK/hooked.json" --engine "$HOOKED" \
        --peer-rows none
    if "$PY" - "$WORK/hooked.json" "$HOOKED" <<'PYEOF'
import json, sys
rows, engine = json.load(open(sys.argv[1])), sys.argv[2]
sc = [r.get("scenario") for r in rows]
# Engines whose raw guard steps are written, and the requests per operation
# their server counts (zk: mntr's zk_packets_received, mntr itself left out):
# a begin + finish(1) is the create multi and its getData, sent back to back,
# then the finish multi (3); a duplicate is the create multi and the getData
# that answers it (2, in one round trip).
CEILED = {"zk": {"guard": 3, "guard-dup": 2}}
if engine in CEILED:
    bad = []
    if sc != ["guard", "guard-dup"]:
        bad.append("rows are %r" % sc)
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    for r in rows:
        s = r.get("scenario")
        if r.get("ceiling_missing") is not None:
            bad.append("%s: ceiling_missing %r" % (s, r["ceiling_missing"]))
        if not num(r.get("ratio")) or r["ratio"] <= 0:
            bad.append("%s: ratio %r is not a positive number" % (s, r.get("ratio")))
        want = CEILED[engine].get(s)
        lib = r.get("server_cmds_per_op_least")
        raw = r.get("ceiling_server_cmds_per_op_least")
        # The least round's count: the library's guard sweeper (a pass soon
        # after the first begin, and one per 1 024 records made) adds its
        # reads to whichever rounds it falls in, the library's or the raw
        # ones (the client stays open); the prober and idle sessions' pings
        # add a few requests a second, nothing near 0.1 per operation.
        for what, v in (("library", lib), ("raw", raw)):
            if not num(v) or want is None or abs(v - want) > 0.1:
                bad.append("%s: %s requests per op %r, expected %r" % (s, what, v, want))
    for b in bad:
        print("# " + b)
    sys.exit(1 if bad else 0)
if len(rows) == 1 and sc == ["guard"] and "has no idempotency guard" in rows[0].get("note", ""):
    sys.exit(0)  # an engine without a guard in this build
if sc != ["guard", "guard-dup"]:
    print("# rows are %r" % sc)
    sys.exit(1)
for r in rows:
    m = r.get("ceiling_missing")
    if m is None and isinstance(r.get("ratio"), (int, float)):
        continue  # the hook is filled
    if not isinstance(m, str) or ("no ceiling for engine %s" % engine) not in m:
        print("# %s: ceiling_missing %r, ratio %r" % (r.get("scenario"), m, r.get("ratio")))
        sys.exit(1)
PYEOF
    then
        ok "$HOOKED: rows with a ratio (and requests per op where counted), or saying what is missing"
    else
        not_ok "$HOOKED: rows with a ratio (and requests per op where counted), or saying what is missing"
        show "$WORK/hooked.txt"
    fi
    # etcd's raw guard steps are written (bench/ceiling_guard_etcd.c): both
    # rows have a ratio, and the requests the server counted
    # (grpc_server_started_total in /metrics) per operation are the same on
    # both sides: 2 txns per begin + finish, 1 per duplicate (one round
    # trip); the leases' grants fall in the unmeasured warm-up, and the
    # client's prober adds a few requests a second, nothing near 0.1 per op.
    if [ "$HOOKED" = etcd ]; then
        if "$PY" - "$WORK/hooked.json" <<'PYEOF'
import json, sys

def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)

rows, bad = json.load(open(sys.argv[1])), []
if [r.get("scenario") for r in rows] != ["guard", "guard-dup"]:
    bad.append("rows are %r" % [r.get("scenario") for r in rows])
for r in rows:
    sc = r.get("scenario")
    if r.get("ceiling_missing") is not None:
        bad.append("%s: ceiling_missing %r" % (sc, r["ceiling_missing"]))
    for f in ("ratio", "ceiling_ops_per_s"):
        if not num(r.get(f)) or r[f] <= 0:
            bad.append("%s: %s %r is not a positive number" % (sc, f, r.get(f)))
    lib, raw = r.get("server_cmds_per_op"), r.get("ceiling_server_cmds_per_op")
    lo, hi = (1.9, 2.1) if sc == "guard" else (0.9, 1.1)
    for side, v in (("library", lib), ("raw ceiling", raw)):
        if not num(v) or not lo <= v <= hi:
            bad.append("%s: %s requests per op %r not in %g..%g" % (sc, side, v, lo, hi))
for b in bad:
    print("# " + b)
sys.exit(1 if bad else 0)
PYEOF
        then
            ok "etcd: ratios to the raw ceiling, the same requests per operation"
        else
            not_ok "etcd: ratios to the raw ceiling, the same requests per operation"
            show "$WORK/hooked.txt"
        fi
    fi
    echo "1..$N"
    exit $FAILED
fi

# 0. The raw ceiling sends the library's own finish script: the text in
# bench/ceiling_guard.c is a copy of engine_redis/redis_guard.c's, kept
# equal by hand, so compare them (a change on one side fails here).
same_script() {
    "$PY" - "$HERE/../../engine_redis/redis_guard.c" "$HERE/../../bench/ceiling_guard.c" <<'PYEOF'
import re, sys

def literals(path, start, last):
    lines = open(path).read().split("\n")
    i = next(k for k, l in enumerate(lines) if start in l) + 1
    out = []
    while i < len(lines):
        l = lines[i].strip()
        i += 1
        m = re.match(r'^"(.*)"([,;]?)$', l)
        if not m:
            if out:
                break
            continue
        out.append(m.group(1))
        if m.group(2) == last:
            break
    return "".join(out)

bad = 0
for name in ("begin", "finish"):
    lib = literals(sys.argv[1], "/* %s:" % name, ",")
    raw = literals(sys.argv[2], "%s_script[] =" % name, ";")
    if not lib or lib != raw:
        print("# the %s scripts differ:\n# library: %r\n# ceiling: %r" % (name, lib, raw))
        bad = 1
sys.exit(bad)
PYEOF
}
check "the raw ceiling's finish script is the library's" same_script

# 1. The local engine: rows, no ceiling, said so in the table too.
run_engine local
check "local: the table says there is no ceiling" \
    grep -q 'no ceiling for engine local' "$WORK/local.txt"

# 2. redis: ratios and commands per operation.
run_engine redis --port "$PORT"
check "redis: the table gives commands per duplicate" \
    grep -Eq 'server commands per duplicate: [0-9]\.[0-9]+' "$WORK/redis.txt"

echo "1..$N"
exit $FAILED
