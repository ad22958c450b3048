#!/usr/bin/env bash
#
# fuzz.sh — build the libFuzzer harnesses of tests/fuzz/ with clang and run
# each for a bounded time under ASan+UBSan (leak checking on).
#
#   scripts/fuzz.sh                      every harness, 20 s each (CI smoke)
#   scripts/fuzz.sh --seconds N          every harness, N seconds each
#   scripts/fuzz.sh --minutes N [--harness H]   the long form
#   scripts/fuzz.sh --list               the harnesses
#   --no-self-test                       skip the planted-defect check
#   --sanitizer asan|tsan                ASan+UBSan (default) or TSan
#
# Self-test. Before the harnesses (unless --harness or --no-self-test), the
# names harness built with a planted defect (fuzz_planted: it fails on an
# accepted name ending in "~~") runs for up to 60 s from the kept names
# corpus, where no name has a '~'; the run fails unless libFuzzer finds the
# defect, so a smoke that passes is one that could have failed.
#
# Build. The main build uses gcc, which has no libFuzzer, so the harnesses
# get their own build directory ($CERB_FUZZ_BUILD_DIR, default
# <repo>/build-fuzz, or build-fuzz-tsan) configured with CC=clang,
# CERB_WERROR=ON, CERB_ASAN=ON (or CERB_TSAN=ON) and CERB_FUZZ=ON,
# where every target carries libFuzzer's coverage instrumentation; only the
# fuzz_* targets and what they link are built. (The gcc build replays the
# same harnesses on the kept corpus through ctest: tests/fuzz/CMakeLists.txt.)
#
# Corpus. libFuzzer reads the kept corpus tests/fuzz/corpus/<H>/ and writes
# what it finds new to <build>/corpus/<H>/ (first directory on its command
# line), so a run never changes the repository; copy an input worth keeping
# by hand. A finding (crash, sanitizer report, leak, failed FUZZ_CHECK,
# timeout) is saved as <build>/artifacts/<H>/crash-* and fails the run; make
# it a corpus entry (corpus/<H>/regress-<what>) with its fix, and ctest
# replays it from then on. Replay one input with the gcc build:
#   build/tests/fuzz/fuzz_<H>_replay FILE     (CERB_FUZZ_VERBOSE=1 for cli_args)
#
# Output: per harness its executions, coverage and corpus size, then a
# summary table; the exit status is 1 if any harness found something or the
# self-test found nothing.
#
# Environment: CERB_FUZZ_BUILD_DIR, CC (default clang), CERB_FUZZ_JOBS
# (build parallelism, default nproc), CERB_FUZZ_ARGS (extra libFuzzer flags).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CC_FUZZ=${CC:-clang}
[[ $CC_FUZZ == *gcc* || $CC_FUZZ == cc ]] && CC_FUZZ=clang
JOBS=${CERB_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
ALL=(config names cli_args etcd_json redis_reply serve_request)
seconds=20
only=""
self_test=1
sanitizer=asan

usage() {
    sed -n '3,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}
while (($#)); do
    case $1 in
    --seconds) seconds=${2:?}; shift 2 ;;
    --minutes) seconds=$((${2:?} * 60)); shift 2 ;;
    --harness) only=${2:?}; shift 2 ;;
    --list) printf '%s\n' "${ALL[@]}"; exit 0 ;;
    --no-self-test) self_test=0; shift ;;
    --sanitizer) sanitizer=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
case $sanitizer in
asan) SAN_FLAG=-DCERB_ASAN=ON BUILD=${CERB_FUZZ_BUILD_DIR:-$ROOT/build-fuzz} ;;
tsan) SAN_FLAG=-DCERB_TSAN=ON BUILD=${CERB_FUZZ_BUILD_DIR:-$ROOT/build-fuzz-tsan} ;;
*) echo "fuzz.sh: --sanitizer takes asan or tsan" >&2; exit 2 ;;
esac
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || {
    echo "fuzz.sh: the time must be a positive whole number" >&2
    exit 2
}
harnesses=("${ALL[@]}")
if [[ -n $only ]]; then
    [[ " ${ALL[*]} " == *" $only "* ]] || {
        echo "fuzz.sh: no harness '$only' (have: ${ALL[*]})" >&2
        exit 2
    }
    harnesses=("$only")
    self_test=0
fi

command -v "$CC_FUZZ" >/dev/null || {
    echo "fuzz.sh: $CC_FUZZ not found (scripts/deps.sh installs clang)" >&2
    exit 1
}

printf '==> fuzz build (%s, %s)\n' "$BUILD" "$CC_FUZZ"
mkdir -p "$BUILD"
CC=$CC_FUZZ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCERB_WERROR=ON "$SAN_FLAG" -DCERB_FUZZ=ON -DCERB_BUILD_BENCH=OFF >"$BUILD/fuzz-configure.log" 2>&1 || {
    cat "$BUILD/fuzz-configure.log" >&2
    exit 1
}
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
((self_test)) && targets+=(fuzz_planted)
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$BUILD/fuzz-build.log" 2>&1 || {
    tail -50 "$BUILD/fuzz-build.log" >&2
    exit 1
}

read -r -a extra <<<"${CERB_FUZZ_ARGS:-}"
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$ROOT/tests/fuzz/lsan.supp:print_suppressions=0
# TSan takes one suppression file: the project's and the fuzz harnesses'.
cat "$ROOT/tests/tsan.supp" "$ROOT/tests/fuzz/tsan.supp" >"$BUILD/tsan.supp"
# report_signal_unsafe=0: libFuzzer writes its crash report from the signal
# handler with malloc; TSan reporting that deadlocked the run.
export TSAN_OPTIONS=suppressions=$BUILD/tsan.supp:halt_on_error=1:report_signal_unsafe=0
declare -A execs cov corp status
rc=0

if ((self_test)); then
    printf '\n==> self-test: the planted defect must be found (60 s at most)\n'
    work=$BUILD/corpus/planted art=$BUILD/artifacts/planted log=$BUILD/fuzz-planted.log
    rm -rf "$work" "$art"
    mkdir -p "$work" "$art"
    set +e
    "$BUILD/tests/fuzz/fuzz_planted" -max_total_time=60 -timeout=10 -max_len=4096 \
        -print_final_stats=1 -artifact_prefix="$art/" "$work" "$ROOT/tests/fuzz/corpus/names" \
        >"$log" 2>&1
    st=$?
    set -e
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if ((st != 0)) && grep -q 'the planted defect was found' "$log"; then
        printf 'self-test: found after %s executions: %s\n' "${n:-?}" "$(ls "$art")"
    else
        echo "fuzz.sh: self-test FAILED: the planted defect was not found (status $st, ${n:-?} executions; $log)" >&2
        tail -20 "$log" >&2
        rc=1
    fi
fi

for h in "${harnesses[@]}"; do
    exe=$BUILD/tests/fuzz/fuzz_$h
    [[ -x $exe ]] || {
        echo "fuzz.sh: $exe was not built (engine not compiled in?)" >&2
        status[$h]=missing
        rc=1
        continue
    }
    # The work corpus grows from run to run; artifacts are this run's only.
    work=$BUILD/corpus/$h art=$BUILD/artifacts/$h
    rm -rf "$art"
    mkdir -p "$work" "$art"
    log=$BUILD/fuzz-$h.log
    printf '\n==> fuzz %s for %ss\n' "$h" "$seconds"
    set +e
    # -timeout: one input taking a second is a finding (a hang), not a
    # slow machine: every input here is parsed in microseconds.
    "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        -print_final_stats=1 -artifact_prefix="$art/" \
        ${extra[@]+"${extra[@]}"} "$work" "$ROOT/tests/fuzz/corpus/$h" >"$log" 2>&1
    st=$?
    set -e
    # A finding in the first inputs leaves no cov/corp lines: no match is
    # not an error here (set -e, pipefail).
    execs[$h]=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov[$h]=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
    corp[$h]=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
    if ((st == 0)); then
        status[$h]=ok
        grep -E '^#[0-9]+ +DONE|^Done' "$log" | tail -2 || true
    else
        status[$h]="FOUND (exit $st)"
        rc=1
        # The report: the harness' own message or the sanitizer's.
        grep -vE '^#[0-9]+ ' "$log" | tail -60 || true
        ls "$art" | sed "s|^|fuzz.sh: artifact $art/|"
    fi
done

printf '\n==> fuzz summary (%ss per harness, %s)\n' "$seconds" "$sanitizer"
printf '%-14s %12s %8s %8s  %s\n' harness executions cov corpus result
for h in "${harnesses[@]}"; do
    printf '%-14s %12s %8s %8s  %s\n' "$h" "${execs[$h]:--}" "${cov[$h]:--}" "${corp[$h]:--}" \
        "${status[$h]}"
done
exit "$rc"
