#!/usr/bin/env bash
#
# test_broken.sh — each oracle check can fail (issue 11: "show each oracle
# can fail"). The worker is run in a deliberately broken mode on the local
# engine (no server) and the report must flag exactly what the mode breaks:
#
#   skip-lock   records holds without locking (a lock that grants twice)
#               → unsafe overlaps
#   fake-token  records tokens that repeat and are sometimes 0
#               → token regressions and tokens of 0
#   overrun     one call per thread lasts its bound plus two seconds
#               → overruns
#
# and, with --guard (idempotency-guard attempts on two keys):
#
#   skip-guard        runs every attempt without cerb_guard_begin
#                     → unsafe overlaps
#   ignore-busy       runs an attempt the guard answered CERB_BUSY
#                     → unsafe overlaps
#   ignore-duplicate  runs an attempt the guard answered CERB_DUPLICATE
#                     → reruns
#
# and, with --elect (candidates in leader elections on two names):
#
#   skip-elect        records terms without campaigning
#                     → unsafe overlaps (two leaders at once)
#
# and, with --semaphore 2 and with --rwlock (permits and read/write holds):
#
#   skip-share        records holds without taking them
#                     → unsafe overlaps (three permits of two; a writer with others)
#
# and an honest run of the same worker, locking, guarded, electing or
# sharing, must pass the ordinary verdict.
#
#   test_broken.sh BUILD_CHAOS_DIR
set -euo pipefail

B=${1:?usage: test_broken.sh BUILD_CHAOS_DIR}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cerb-chaos-broken.XXXXXX")
trap 'rm -rf -- "$TMP"' EXIT
printf 'engines = ("local");\nlock = { lease_ms = 1000; };\nguard = { running_ms = 1000; };\n' >"$TMP/local.cfg"
fail=0

# run MODE [--guard | --elect]: init an oracle, run one worker (3 threads,
# 3 s, seed 7) in MODE.
run() {
    local mode=$1
    "$B/cerb_chaos_oracle" init "$TMP/$mode.oracle"
    local args=(-c "$TMP/local.cfg" -o "$TMP/$mode.oracle" --threads 3 --seconds 3
        --seed 7 --bound-ms 500 --lease-ms 1000)
    [[ ${2:-} == --guard ]] && args+=(--guard --names 2)
    [[ ${2:-} == --elect ]] && args+=(--elect --names 2)
    [[ ${2:-} == --semaphore ]] && args+=(--semaphore 2 --names 2)
    [[ ${2:-} == --rwlock ]] && args+=(--rwlock --names 2)
    [[ $mode == honest* ]] || args+=(--broken "$mode")
    timeout 60 "$B/cerb_chaos_worker" "${args[@]}"
}

# expect MODE CHECK: the report of MODE must show CHECK (and fail its verdict).
expect() {
    local mode=$1 check=$2
    if "$B/cerb_chaos_oracle" report "$TMP/$mode.oracle" "$mode" --require "$check"; then
        echo "ok: $mode is reported as $check"
    else
        echo "FAIL: $mode was not reported as $check"
        fail=1
    fi
    if "$B/cerb_chaos_oracle" report "$TMP/$mode.oracle" "$mode" >/dev/null; then
        echo "FAIL: the verdict passed $mode"
        fail=1
    fi
}

run honest
if "$B/cerb_chaos_oracle" report "$TMP/honest.oracle" honest --min-acq 5; then
    echo "ok: an honest worker passes"
else
    echo "FAIL: an honest worker on the local engine was reported"
    fail=1
fi
run skip-lock
expect skip-lock unsafe
run fake-token
expect fake-token regressions
expect fake-token zero
run overrun
expect overrun overruns

run honest-guard --guard
if "$B/cerb_chaos_oracle" report "$TMP/honest-guard.oracle" honest-guard --min-acq 5; then
    echo "ok: an honest guarded worker passes"
else
    echo "FAIL: an honest guarded worker on the local engine was reported"
    fail=1
fi
run skip-guard --guard
expect skip-guard unsafe
run ignore-busy --guard
expect ignore-busy unsafe
run ignore-duplicate --guard
expect ignore-duplicate reruns

run honest-elect --elect
if "$B/cerb_chaos_oracle" report "$TMP/honest-elect.oracle" honest-elect --min-acq 5; then
    echo "ok: an honest electing worker passes"
else
    echo "FAIL: an honest electing worker on the local engine was reported"
    fail=1
fi
run skip-elect --elect
expect skip-elect unsafe

for m in semaphore rwlock; do
    run "honest-$m" "--$m"
    if "$B/cerb_chaos_oracle" report "$TMP/honest-$m.oracle" "honest-$m" --min-acq 5; then
        echo "ok: an honest $m worker passes"
    else
        echo "FAIL: an honest $m worker on the local engine was reported"
        fail=1
    fi
    "$B/cerb_chaos_oracle" init "$TMP/skip-share-$m.oracle"
    timeout 60 "$B/cerb_chaos_worker" -c "$TMP/local.cfg" -o "$TMP/skip-share-$m.oracle" \
        --threads 3 --seconds 3 --seed 7 --bound-ms 500 --lease-ms 1000 --names 2 \
        "--$m" $([[ $m == semaphore ]] && echo 2) --broken skip-share
    expect "skip-share-$m" unsafe
done
exit $fail
