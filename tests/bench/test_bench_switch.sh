#!/usr/bin/env bash
# test_bench_switch.sh — cerberus-bench's switch scenario on the test
# servers (redis, zk and etcd): the steady-state rate on an engine after
# `cerberus switch` against the same engine alone. Its figures depend on the
# library (a switch that still costs a question to every engine left behind
# gives a ratio far below the 0.9 target), so this checks what the row
# must say whatever the ratio: the built-in three-engine file switched on
# every engine, with the settling and epochs as documented; a second run
# on the same servers (closure records are permanent and per namespace:
# each round works in namespaces of its own, which it removes afterwards);
# a -c file that pins another engine and does not watch itself (the bench
# switches a copy and reloads the client: the file given is never
# rewritten, and the scratch directory goes); and the command lines it
# refuses.
#
# Usage: test_bench_switch.sh PATH/TO/cerberus-bench
# Environment: CERB_REDIS_PORT, CERB_ZK_PORT, CERB_ETCD_PORT (the servers),
# CERB_BENCH_CLI (the `cerberus` command), CERB_PYTHON.
#
# Every run is under timeout(1). Output is TAP-like: one "ok"/"not ok" line
# per check; the exit status is 1 if any failed.

set -u

BENCH=${1:?usage: test_bench_switch.sh PATH/TO/cerberus-bench}
HERE=$(cd "$(dirname "$0")" && pwd)
RP=${CERB_REDIS_PORT:?} ZP=${CERB_ZK_PORT:?} EP=${CERB_ETCD_PORT:?}
# shellcheck source=tests/bench/tap.sh
. "$HERE/tap.sh" cerb-bench-switch-test
mkdir "$WORK/tmp"

# the switch rows of FILE: every engine of ENGINES (comma list) once, in
# that order, with THREADS, the fields as documented; EXTRA is Python run
# on each row r (e.g. the epochs a given file must show).
rows_ok() { # FILE ENGINES THREADS EXTRA
    "$PY" - "$@" <<'PYEOF'
import json, sys
path, engines, threads, extra = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
rows = json.load(open(path))
errors = []
def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)
got = [r.get("engine") for r in rows]
if got != engines:
    errors.append("engines of the rows are %r, expected %r" % (got, engines))
for r in rows:
    w = "switch %s" % r.get("engine")
    if r.get("scenario") != "switch" or r.get("threads") != threads:
        errors.append("%s: scenario %r threads %r" % (w, r.get("scenario"), r.get("threads")))
    if r.get("ceiling_kind") != "alone":
        errors.append("%s: ceiling_kind %r, expected \"alone\"" % (w, r.get("ceiling_kind")))
    for k in ("alone_ops_per_s", "ratio", "ratio_paired_median"):
        if not num(r.get(k)) or r[k] <= 0:
            errors.append("%s: %s %r is not a positive number" % (w, k, r.get(k)))
    if num(r.get("alone_ops_per_s")) and num(r.get("ops_per_s")) and r["alone_ops_per_s"] > 0:
        if abs(r["ops_per_s"] / r["alone_ops_per_s"] - r["ratio"]) > 1e-6:
            errors.append("%s: ratio is not ops_per_s / alone_ops_per_s" % w)
    if r.get("epoch_after") != r.get("epoch_before", -9) + 1:
        errors.append("%s: epochs %r -> %r, not one bump" % (w, r.get("epoch_before"), r.get("epoch_after")))
    if r.get("settle_ms") != 2 * r.get("hold_ms", -1) or r.get("hold_ms", 0) < r.get("lease_ms", 1):
        errors.append("%s: settle_ms %r is not twice hold_ms %r (>= lease_ms %r)"
                      % (w, r.get("settle_ms"), r.get("hold_ms"), r.get("lease_ms")))
    if r.get("target_min") != 0.9 or not isinstance(r.get("target_met"), bool) or \
            r["target_met"] != (r.get("ratio", 0) >= 0.9):
        errors.append("%s: target_min %r target_met %r" % (w, r.get("target_min"), r.get("target_met")))
    for k in ("busy", "busy_alone"):
        if not isinstance(r.get(k), int) or r[k] < 0:
            errors.append("%s: %s %r" % (w, k, r.get(k)))
    try:
        exec(extra, {"r": r, "errors": errors, "w": w})
    except Exception as e:
        errors.append("%s: %r" % (w, e))
for e in errors:
    print("# " + e)
sys.exit(1 if errors else 0)
PYEOF
}

# What the bench's namespaces ("cerb-bench-<pid>-...", nested in the file's
# default ones) hold after a run, one line per key or node; a store whose
# client is not installed prints nothing.
leftovers() {
    if command -v redis-cli >/dev/null; then
        timeout 20 redis-cli -p "$RP" --scan --pattern '*cerb-bench-*' | sed 's/^/redis: /'
    fi
    if command -v etcdctl >/dev/null; then
        ETCDCTL_API=3 timeout 20 etcdctl --endpoints="http://127.0.0.1:$EP" get cerb-bench- \
            --prefix --keys-only | sed '/^$/d; s/^/etcd: /'
    fi
    local zkcli=/usr/share/zookeeper/bin/zkCli.sh
    if [ -x "$zkcli" ]; then
        timeout 60 "$zkcli" -server "127.0.0.1:$ZP" ls /cerberus 2>/dev/null |
            grep -o 'cerb-bench-[^],]*' | sed 's|^|zk: /cerberus/|'
    fi
}

# 1. The built-in file (redis, zk, etcd; lease 1000 ms) on every engine.
if timeout 200 env TMPDIR="$WORK/tmp" "$BENCH" --scenario switch --engine all \
        --redis-port "$RP" --zk-port "$ZP" --etcd-port "$EP" --duration 1 \
        --json "$WORK/all.json" >"$WORK/all.txt" 2>"$WORK/all.err"; then
    ok "switch on the built-in file, every engine, exits 0"
else
    not_ok "switch on the built-in file, every engine, exits 0 (status $?)"
    sed 's/^/# /' "$WORK/all.err" "$WORK/all.txt"
fi
check "its JSON follows the bench's schema" \
    "$PY" "$HERE/check_bench_json.py" "$WORK/all.json" --peer-rows none
check "one row per engine, switched from auto (on redis), epoch 1 -> 2, settled 4 s" \
    rows_ok "$WORK/all.json" redis,zk,etcd 1 '
if r.get("engines") != ["redis", "zk", "etcd"] or r.get("from") != "redis":
    errors.append("%s: engines %r from %r" % (w, r.get("engines"), r.get("from")))
if (r.get("epoch_before"), r.get("lease_ms"), r.get("hold_ms"), r.get("settle_ms")) != (1, 1000, 2000, 4000):
    errors.append("%s: epoch %r lease %r hold %r settle %r" % (w, r.get("epoch_before"),
                  r.get("lease_ms"), r.get("hold_ms"), r.get("settle_ms")))'
# What is measured is the switch once done: closure records trusted, so
# the rounds ask the engines left nothing (each name was asked once in
# the warm-up); the full gate would ask at least twice per acquisition.
# A count, not a time: it holds on any machine.
check "the rounds ran without the full gate (fewer gate questions than acquisitions)" \
    rows_ok "$WORK/all.json" redis,zk,etcd 1 '
if not isinstance(r.get("gate_questions"), int) or r["gate_questions"] >= r.get("ops", 0):
    errors.append("%s: %r gate questions for %r acquisitions" % (w, r.get("gate_questions"),
                  r.get("ops")))'
check "the table has a switch row per engine, with the alone rate and the target" \
    test "$(grep -c '^switch .* alone [0-9]* ops/s' "$WORK/all.txt")" = 3 -a \
    "$(grep -c 'target (DESIGN 10): >= 0.9' "$WORK/all.txt")" = 3
check "the scratch directory is gone" test -z "$(ls -A "$WORK/tmp")"

# 1b. The same again on the same servers: a round at epoch 1 -> 2 as
# before, which the first run's records would have refused.
if timeout 120 env TMPDIR="$WORK/tmp" "$BENCH" --scenario switch --engine redis \
        --redis-port "$RP" --zk-port "$ZP" --etcd-port "$EP" --duration 1 \
        --json "$WORK/again.json" >"$WORK/again.txt" 2>"$WORK/again.err"; then
    ok "a second run on the same servers exits 0"
else
    not_ok "a second run on the same servers exits 0 (status $?)"
    sed 's/^/# /' "$WORK/again.err" "$WORK/again.txt"
fi
check "its row: redis, epoch 1 -> 2" rows_ok "$WORK/again.json" redis 1 '
if r.get("epoch_before") != 1:
    errors.append("%s: epoch %r" % (w, r.get("epoch_before")))'

# 2. A -c file that pins zk, does not watch itself and starts at epoch 7:
# the copy is put back to auto (epoch 8), switched to redis (9), the client
# reloaded by the bench; two threads.
cat >"$WORK/three.cfg" <<EOF
engines = ("redis", "zk", "etcd");
active = "zk";
epoch = 7;
lock = { lease_ms = 1000; };
failover = { watch_config = false; };
redis = { host = "127.0.0.1"; port = $RP; };
zk = { hosts = "127.0.0.1:$ZP"; session_timeout_ms = 2500; };
etcd = { endpoints = ("http://127.0.0.1:$EP"); session_ttl_s = 2; };
EOF
cp "$WORK/three.cfg" "$WORK/three.orig"
if timeout 120 env TMPDIR="$WORK/tmp" "$BENCH" -c "$WORK/three.cfg" --scenario switch \
        --engine redis --threads 2 --duration 1 --json "$WORK/file.json" \
        >"$WORK/file.txt" 2>"$WORK/file.err"; then
    ok "switch on a -c file that pins zk and does not watch itself exits 0"
else
    not_ok "switch on a -c file that pins zk and does not watch itself exits 0 (status $?)"
    sed 's/^/# /' "$WORK/file.err" "$WORK/file.txt"
fi
check "its row: redis, 2 threads, epoch 8 -> 9, settled twice the zk session (2.5 s)" \
    rows_ok "$WORK/file.json" redis 2 '
if (r.get("epoch_before"), r.get("hold_ms"), r.get("settle_ms")) != (8, 2500, 5000):
    errors.append("%s: epoch %r hold %r settle %r" % (w, r.get("epoch_before"), r.get("hold_ms"),
                  r.get("settle_ms")))'
check "the file given with -c is not rewritten" cmp -s "$WORK/three.cfg" "$WORK/three.orig"
check "the scratch directory is gone" test -z "$(ls -A "$WORK/tmp")"

LEFT=$(leftovers)
check "nothing is left in the bench's namespaces after the three runs" test -z "$LEFT"
[ -z "$LEFT" ] || echo "$LEFT" | sed 's/^/# /'

# 3. What it refuses (status 2, before any run).
printf 'engines = ("redis");\nredis = { port = %s; };\n' "$RP" >"$WORK/one.cfg"
timeout 30 "$BENCH" -c "$WORK/one.cfg" --scenario switch >/dev/null 2>"$WORK/one.err"
check "a file with one engine exits 2 and says why" \
    test $? = 2 -a -n "$(grep 'lists one engine' "$WORK/one.err")"
timeout 30 "$BENCH" --scenario switch --engine local >/dev/null 2>&1
check "the local engine without -c exits 2" test $? = 2
timeout 30 "$BENCH" --scenario switch --engine redis --port "$RP" --redis-port "$RP" >/dev/null 2>&1
check "--port and --redis-port for the same engine exit 2" test $? = 2
timeout 30 "$BENCH" -c "$WORK/three.cfg" --scenario switch --zk-port "$ZP" >/dev/null 2>&1
check "--zk-port with -c exits 2" test $? = 2

echo "1..$N"
exit $FAILED
