#!/usr/bin/env bash
#
# expect_finding.sh MESSAGE COMMAND [ARG...] — passes when COMMAND fails
# (any non-zero status, an abort included) and its output contains
# MESSAGE: the test that a harness does report a known-bad input
# (ctest fuzz_planted).
set -uo pipefail
msg=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out" | tail -20
if ((rc == 0)); then
    echo "expect_finding: '$*' passed; it should have reported: $msg" >&2
    exit 1
fi
if ! grep -qF -- "$msg" <<<"$out"; then
    echo "expect_finding: '$*' failed (status $rc) without reporting: $msg" >&2
    exit 1
fi
echo "expect_finding: reported as expected (status $rc)"
