#!/usr/bin/env bash
#
# run_in_session.sh — how ctest runs every test of this tree
# (cerb_add_test() in cmake/CerbTesting.cmake puts it in front of each
# command):
#
#   run_in_session.sh BUILD_DIR TEST_NAME -- COMMAND [ARG]...
#
# runs COMMAND in a session of its own (setsid), with CERB_TEST_RUN=BUILD_DIR
# and CERB_TEST_NAME=TEST_NAME in its environment, and exits with its
# status. When COMMAND has exited, whatever it started that is still alive
# in its session — a loop whose stop file was removed under it, a child a
# failed check never waited for — is a test leaving a process behind: it is
# given 2 s to go, then listed with the line "run_in_session: LEFTOVER ...",
# killed by PID, and the run fails (status 1 when COMMAND passed; ctest
# also fails a test whose output has that line, whatever its pass rule).
#
# A process that leaves the session (setsid, as scripts/servers.sh starts
# servers) is not seen here; it keeps CERB_TEST_RUN, and the last test of a
# run (check_leftovers.sh) finds it.
#
# SIGTERM, SIGINT and SIGHUP are passed on to every process of the session
# (a new session does not get the terminal's ^C), and the check still runs.
# ctest's timeout kills this script and its children with SIGKILL, so a
# test that timed out is not checked here; its orphans are left to
# check_leftovers.sh too.

set -u

PROG=run_in_session
if (($# < 4)) || [[ $3 != -- ]]; then
    echo "usage: $0 BUILD_DIR TEST_NAME -- COMMAND [ARG]..." >&2
    exit 2
fi
export CERB_TEST_RUN=$1 CERB_TEST_NAME=$2
shift 3

# GRACE_MS: how long a process of the session may outlive COMMAND, e.g. one
# COMMAND signalled just before it exited.
GRACE_MS=${CERB_LEFTOVER_GRACE_MS:-2000}

# now_ms: a monotonic clock (/proc/uptime, 10 ms steps), never the wall clock.
now_ms() {
    local up
    read -r up _ </proc/uptime
    echo $((10#${up/./} * 10))
}

# session_pids SID: the live processes of session SID (zombies are dead:
# PID 1 of a container may never reap them).
session_pids() {
    local f line rest pid fields
    for f in /proc/[0-9]*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        pid=${f#/proc/}
        pid=${pid%/stat}
        # Fields after the command name (in parentheses, may hold spaces):
        # state ppid pgrp session ...
        rest=${line##*) }
        read -r -a fields <<<"$rest"
        [[ ${fields[3]} == "$1" && ${fields[0]} != Z && ${fields[0]} != X ]] || continue
        printf '%s\n' "$pid"
    done
}

describe() { # PID: "pid P ppid Q state S: argv"
    local line rest cmd fields
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    rest=${line##*) }
    read -r -a fields <<<"$rest"
    cmd=$(tr '\0\n' '  ' <"/proc/$1/cmdline" 2>/dev/null)
    printf 'pid %s ppid %s state %s: %s\n' "$1" "${fields[1]}" "${fields[0]}" "${cmd:-?}"
}

# setsid(1) forks only when its caller leads a process group; a background
# job of this non-interactive shell does not, so the child calls setsid()
# itself and its PID is the session's ID.
#
# The traps go in before the fork: a signal that came between the fork and
# them would end this script by default and leave COMMAND running, its
# status lost (CI saw it under load). One that comes before the fork is kept
# and passed on once COMMAND runs; COMMAND itself is signalled too, as it
# may not have called setsid() yet.
sid=""
pending=()
signalled=0
forward() {
    local p
    signalled=1
    if [[ -z $sid ]]; then
        pending+=("$1")
        return
    fi
    kill -"$1" "$sid" 2>/dev/null
    for p in $(session_pids "$sid"); do
        [[ $p == "$sid" ]] || kill -"$1" "$p" 2>/dev/null
    done
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

setsid "$@" &
sid=$!
for s in "${pending[@]}"; do forward "$s"; done

# A trapped signal ends `wait` early with 128 + its number, whether or not
# COMMAND has ended meanwhile (the shell may have reaped it already, so
# `kill -0` cannot tell): wait again after every signal; the shell keeps a
# reaped COMMAND's status for that second wait.
# (A signal that came just as `wait` returned COMMAND's own status makes a
# third wait answer 127, "no such child": the status before it stands.)
rc=""
while :; do
    signalled=0
    wait "$sid"
    r=$?
    ((r == 127)) && [[ -n $rc ]] && break
    rc=$r
    ((rc > 128 && signalled)) || break
done

deadline=$(($(now_ms) + GRACE_MS))
while left=$(session_pids "$sid") && [[ -n $left ]] && (($(now_ms) < deadline)); do
    sleep 0.05 # polling the condition above, bounded by its deadline
done
[[ -n $left ]] || exit "$rc"

list=""
for p in $left; do d=$(describe "$p") && list+=$d$'\n'; done
echo "$PROG: LEFTOVER: $CERB_TEST_NAME left processes running ${GRACE_MS} ms after it exited:"
printf '%s' "$list"
# Killed by PID, each checked to be in the session still (not a reused PID).
still=$(session_pids "$sid")
for p in $left; do
    if grep -qx "$p" <<<"$still"; then kill -KILL "$p" 2>/dev/null; fi
done
echo "$PROG: killed them; $CERB_TEST_NAME fails (its own status was $rc)"
((rc != 0)) || rc=1
exit "$rc"
