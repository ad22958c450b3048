#!/usr/bin/env bash
#
# check_leftovers.sh — the last test of a ctest run (harness_leftovers, the
# FIXTURES_CLEANUP of the fixture cerb_leftovers that every other test
# requires, so it runs after all of them, the server fixtures' stops
# included):
#
#   check_leftovers.sh BUILD_DIR STATE_DIR
#
# fails, listing them, when processes started by this tree's tests are
# still alive: every process whose environment has CERB_TEST_RUN=BUILD_DIR
# (run_in_session.sh gives it to each test, and everything a test starts
# inherits it), and CERB_TEST_NAME says which test started it. This finds
# what left a test's session (a daemon, a setsid) and what a timed-out test
# left (ctest kills the test's tree, not its orphans), which the per-test
# check of run_in_session.sh cannot see. They are then killed by PID.
#
# Not counted: zombies (dead, their parent has not reaped them), and the
# test servers recorded in STATE_DIR's PID files (scripts/servers.sh stops
# them by PID; they are still up when a run selected a server fixture's
# start without its stop, and are listed apart).

set -u

if (($# != 2)); then
    echo "usage: $0 BUILD_DIR STATE_DIR" >&2
    exit 2
fi
RUN=$1
STATE_DIR=$2

declare -A servers=()
for f in "$STATE_DIR"/*.pid; do
    [[ -f $f ]] || continue
    read -r p <"$f" 2>/dev/null || continue
    [[ $p =~ ^[0-9]+$ ]] && servers[$p]=${f##*/}
done

# stat_of PID: "state ppid session", or nothing when PID is gone.
stat_of() {
    local line rest fields
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    rest=${line##*) }
    read -r -a fields <<<"$rest"
    printf '%s %s %s' "${fields[0]}" "${fields[1]}" "${fields[3]}"
}

# server_of PID: the PID file of the recorded server that is PID or one of
# its ancestors (a server's own children are the server's).
server_of() {
    local p=$1 st i
    for ((i = 0; i < 64 && p > 1; i++)); do
        if [[ -n ${servers[$p]:-} ]]; then
            printf '%s' "${servers[$p]}"
            return 0
        fi
        st=$(stat_of "$p") || return 1
        read -r _ p _ <<<"$st"
    done
    return 1
}

# This script is not started through run_in_session.sh, but a ctest run
# from inside a test would hand the marker down: never count our session.
read -r _ _ self_sid <<<"$(stat_of $$)"

# marked PIDs: one grep over every environ (NUL-separated entries).
mapfile -t files < <(grep -lzxF -- "CERB_TEST_RUN=$RUN" /proc/[0-9]*/environ 2>/dev/null)
left=()
report=""
for f in "${files[@]}"; do
    p=${f#/proc/}
    p=${p%/environ}
    [[ $p != "$$" ]] || continue
    st=$(stat_of "$p") || continue
    read -r state ppid sid <<<"$st"
    [[ $state != Z && $state != X && $sid != "$self_sid" ]] || continue
    name=$(grep -zoE '^CERB_TEST_NAME=.*' "/proc/$p/environ" 2>/dev/null | tr -d '\0')
    cmd=$(tr '\0\n' '  ' <"/proc/$p/cmdline" 2>/dev/null)
    name=${name#CERB_TEST_NAME=}
    line="pid $p ppid $ppid state $state, started by ${name:-?}: $cmd"
    if srv=$(server_of "$p"); then
        echo "server still running (recorded in $STATE_DIR/$srv;" \
            "stop it with scripts/servers.sh stop): $line"
        continue
    fi
    left+=("$p")
    report+="$line"$'\n'
done

if ((${#left[@]} == 0)); then
    echo "no process of this run ($RUN) is left"
    exit 0
fi
echo "check_leftovers: ${#left[@]} process(es) started by tests of $RUN are still running:"
printf '%s' "$report"
# Killed by PID, each checked to carry the marker still (not a reused PID).
for p in "${left[@]}"; do
    if grep -qzxF -- "CERB_TEST_RUN=$RUN" "/proc/$p/environ" 2>/dev/null; then
        kill -KILL "$p" 2>/dev/null
    fi
done
echo "check_leftovers: killed them"
exit 1
