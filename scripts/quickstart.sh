#!/usr/bin/env bash
#
# quickstart.sh — from a fresh checkout to a running demo in one command:
# install the missing Debian packages, build Cerberus (no sanitizers), start a
# private redis-server on loopback, and run examples/embed — several processes
# contending for one lock, each printing when it holds it and with which
# fencing token, and a shared counter that proves no two held it at once.
#
# The redis-server is started by scripts/servers.sh on its own port and state
# directory (so it never touches a system redis or the test servers) and is
# stopped by its PID when this script exits, however it exits.
#
# Environment:
#   CERB_BUILD_DIR     build directory (default: <repo>/build; an existing
#                      configured tree is reused as it is)
#   CERB_QS_PORT       redis port (default 26479)
#   CERB_QS_PROCS      contending processes (default 4)
#   CERB_QS_ITER       acquisitions per process (default 3)
#   CERB_NO_INSTALL=1  never install packages

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/deps.sh
. "$ROOT/scripts/deps.sh"

BUILD_DIR=${CERB_BUILD_DIR:-$ROOT/build}
PORT=${CERB_QS_PORT:-26479}
PROCS=${CERB_QS_PROCS:-4}
ITER=${CERB_QS_ITER:-3}
JOBS=$(nproc 2>/dev/null || echo 2)
# A state dir of its own: quickstart never stops a test fixture's server.
export CERB_STATE_DIR=${CERB_QS_STATE_DIR:-/tmp/cerberus-quickstart-${UID:-$(id -u)}}

step() { printf '\n==> %s\n' "$*"; }
run() {
    printf '+ %s\n' "$*"
    "$@"
}

step "dependencies"
cerb_ensure_packages "${CERB_DEB_PACKAGES[@]}"

step "build ($BUILD_DIR)"
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
    run cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
run cmake --build "$BUILD_DIR" -j "$JOBS" --target cerb_example_embed

CFG=""
cleanup() {
    local rc=$?
    step "cleanup"
    bash "$ROOT/scripts/servers.sh" stop redis --port "$PORT" || true
    [[ -n $CFG ]] && rm -f -- "$CFG"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "redis-server on 127.0.0.1:$PORT"
run bash "$ROOT/scripts/servers.sh" start redis --port "$PORT"

# The example config, pointed at this server.
CFG=$(mktemp "${TMPDIR:-/tmp}/cerberus-quickstart.XXXXXX.cfg")
sed "s/port = 6379;/port = $PORT;/" "$ROOT/examples/cerberus.cfg" >"$CFG"

step "examples/embed: $PROCS processes x $ITER acquisitions of one lock"
run "$BUILD_DIR/examples/embed" -c "$CFG" -n "$PROCS" -i "$ITER" quickstart-demo
