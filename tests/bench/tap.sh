# tap.sh — what the bench's script tests share; source it with the name of
# the scratch directory:  . "$HERE/tap.sh" cerb-bench-json
# It sets PY (the Python that runs the checks: $CERB_PYTHON, else
# /usr/bin/python3, else python3 on PATH), WORK (a fresh scratch directory,
# removed when the script exits) and the TAP output: ok, not_ok and
# check DESCRIPTION COMMAND..., counted in N, with FAILED=1 once one fails.
# shellcheck shell=bash
PY=${CERB_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/${1:?tap.sh needs the scratch directory name}.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# shellcheck disable=SC2034 # read by the script that sources this
FAILED=0
N=0

ok() { N=$((N + 1)); echo "ok $N - $1"; }
not_ok() { N=$((N + 1)); FAILED=1; echo "not ok $N - $1"; }
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then ok "$what"; else not_ok "$what"; fi
}
