#!/usr/bin/env bash
#
# test.sh — what CI runs (through .ci/run): install the missing Debian
# packages, configure a warnings-as-errors ASan+UBSan build, build it, run
# every ctest suite against real servers, then more simulation seeds and
# the fuzz smoke. Exits non-zero when any failed.
#
# The steps, each printed before it runs:
#   1. scripts/deps.sh: install missing packages (apt-get update only when
#      something is missing);
#   2. cmake -S . -B $CERB_BUILD_DIR -DCMAKE_BUILD_TYPE=RelWithDebInfo
#        -DCERB_WERROR=ON -DCERB_ASAN=ON
#   3. cmake --build $CERB_BUILD_DIR -j$(nproc)
#   4. ctest --test-dir $CERB_BUILD_DIR --output-on-failure --timeout 300
#      (-j $CERB_TEST_JOBS: suites use unique lock names, and the ones that
#      stop or pause the server hold the redis_server resource lock);
#   5. the simulation beyond ctest's seeds: cerb_sim --seeds
#      $CERB_SIM_SEEDS --first-seed 1000000 (ctest's sim_seeds runs seeds
#      1..2000; a failing seed prints its replay command);
#   6. the fuzz smoke: scripts/fuzz.sh --seconds $CERB_FUZZ_SECONDS builds
#      the libFuzzer harnesses with clang (with the same sanitizer, in
#      <build dir>-fuzz), checks that a planted defect is found, and runs
#      each harness that long, printing executions per harness (about two
#      minutes in all with the default 20 s). It runs even when ctest failed, and its failure fails the
#      run (the exit status is ctest's when that failed, else fuzz.sh's).
#   6. the ThreadSanitizer pass (asan runs only; CERB_TSAN_PASS=0 skips it):
#      a TSan build in <build dir>-tsan, its unit and simulation suites and
#      every suite that runs its own code in a child process (ctest -L
#      'unit|sim|forks'; cerb_add_suite labels those `forks`: under TSan a
#      child forked from a process with threads dies at its first thread,
#      which the ASan run cannot see), and the fuzz smoke under TSan
#      ($CERB_TSAN_FUZZ_SECONDS per harness, default 10). The full suites
#      under TSan are CERB_SANITIZER=tsan scripts/test.sh.
#
# Every ctest test runs in a session of its own and fails when it leaves a
# process behind, and the run's last test (harness_leftovers) fails when
# anything a test started is still alive (cmake/CerbTesting.cmake).
#
# The test servers are ctest fixtures (tests/CMakeLists.txt), started by
# scripts/servers.sh with their state inside the build dir and stopped by PID.
#
# Environment:
#   CERB_BUILD_DIR    build directory (default: <repo>/build-ci)
#   CERB_TEST_JOBS    parallel ctest jobs (default: nproc)
#   CERB_CMAKE_ARGS   extra cmake configure arguments (word-split)
#   CERB_CTEST_ARGS   extra ctest arguments, e.g. "-L unit" (word-split)
#   CERB_NO_INSTALL=1 never install packages; fail if some are missing
#   CERB_SANITIZER    asan (default: ASan+UBSan) or tsan (ThreadSanitizer;
#                     default build dir <repo>/build-ci-tsan); CI runs asan
#   CERB_SIM_SEEDS    further simulation seeds (default 10000, about half a
#                     minute under ASan; 0 skips)
#   CERB_FUZZ_SECONDS seconds per fuzz harness (default 20; 0 skips the
#                     fuzz smoke)
#   CERB_TSAN_PASS    1 (default for asan) runs step 6; 0 skips it
#   CERB_TSAN_FUZZ_SECONDS  seconds per harness in step 6 (default 10; 0
#                     skips its fuzz smoke)

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/deps.sh
. "$ROOT/scripts/deps.sh"

SANITIZER=${CERB_SANITIZER:-asan}
case $SANITIZER in
asan) SAN_FLAG=-DCERB_ASAN=ON DEFAULT_DIR=$ROOT/build-ci ;;
tsan) SAN_FLAG=-DCERB_TSAN=ON DEFAULT_DIR=$ROOT/build-ci-tsan ;;
*)
    echo "test.sh: CERB_SANITIZER must be asan or tsan, not '$SANITIZER'" >&2
    exit 2
    ;;
esac
BUILD_DIR=${CERB_BUILD_DIR:-$DEFAULT_DIR}
JOBS=$(nproc 2>/dev/null || echo 2)
TEST_JOBS=${CERB_TEST_JOBS:-$JOBS}
read -r -a EXTRA_CMAKE <<<"${CERB_CMAKE_ARGS:-}"
read -r -a EXTRA_CTEST <<<"${CERB_CTEST_ARGS:-}"

step() { printf '\n==> %s\n' "$*"; }
run() {
    printf '+ %s\n' "$*"
    "$@"
}

step "dependencies"
cerb_ensure_packages "${CERB_DEB_PACKAGES[@]}"

step "configure ($BUILD_DIR)"
run cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCERB_WERROR=ON "$SAN_FLAG" ${EXTRA_CMAKE[@]+"${EXTRA_CMAKE[@]}"}

step "build (-j$JOBS)"
run cmake --build "$BUILD_DIR" -j "$JOBS"

step "test"
start=$SECONDS
rc=0
run ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 300 \
    -j "$TEST_JOBS" ${EXTRA_CTEST[@]+"${EXTRA_CTEST[@]}"} || rc=$?
printf '\n==> ctest finished in %ss with status %s\n' "$((SECONDS - start))" "$rc"

SIM_SEEDS=${CERB_SIM_SEEDS:-10000}
if [[ $SIM_SEEDS != 0 ]]; then
    step "simulation ($SIM_SEEDS seeds from 1000000)"
    src=0
    run "$BUILD_DIR/tests/sim/cerb_sim" --seeds "$SIM_SEEDS" --first-seed 1000000 || src=$?
    ((rc != 0)) || rc=$src
fi

FUZZ_SECONDS=${CERB_FUZZ_SECONDS:-20}
if [[ $FUZZ_SECONDS != 0 ]]; then
    step "fuzz smoke (${FUZZ_SECONDS}s per harness)"
    start=$SECONDS
    frc=0
    CERB_FUZZ_BUILD_DIR=${BUILD_DIR}-fuzz CERB_FUZZ_JOBS=$JOBS \
        run "$ROOT/scripts/fuzz.sh" --seconds "$FUZZ_SECONDS" --sanitizer "$SANITIZER" || frc=$?
    printf '\n==> fuzz smoke finished in %ss with status %s\n' "$((SECONDS - start))" "$frc"
    ((rc != 0)) || rc=$frc
fi

if [[ $SANITIZER == asan && ${CERB_TSAN_PASS:-1} != 0 ]]; then
    TSAN_DIR=${BUILD_DIR}-tsan
    step "ThreadSanitizer pass ($TSAN_DIR): unit, simulation and forking suites, fuzz smoke"
    start=$SECONDS
    trc=0
    run cmake -S "$ROOT" -B "$TSAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCERB_WERROR=ON -DCERB_TSAN=ON ${EXTRA_CMAKE[@]+"${EXTRA_CMAKE[@]}"} || trc=$?
    ((trc != 0)) || run cmake --build "$TSAN_DIR" -j "$JOBS" || trc=$?
    ((trc != 0)) || run ctest --test-dir "$TSAN_DIR" --output-on-failure --timeout 300 \
        -j "$TEST_JOBS" -L 'unit|sim|forks' || trc=$?
    TSAN_FUZZ=${CERB_TSAN_FUZZ_SECONDS:-10}
    if ((trc == 0)) && [[ $TSAN_FUZZ != 0 ]]; then
        CERB_FUZZ_BUILD_DIR=${TSAN_DIR}-fuzz CERB_FUZZ_JOBS=$JOBS \
            run "$ROOT/scripts/fuzz.sh" --seconds "$TSAN_FUZZ" --sanitizer tsan || trc=$?
    fi
    printf '\n==> ThreadSanitizer pass finished in %ss with status %s\n' "$((SECONDS - start))" "$trc"
    ((rc != 0)) || rc=$trc
fi
exit "$rc"
