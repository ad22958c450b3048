#!/usr/bin/env bash
# test_cli_once.sh — `cerberus once` (DESIGN.md §11) end to end, on the
# shared redis fixture ($CERB_REDIS_PORT), on the local engine with
# local.dir (records shared by processes through files), and on the shared
# zk fixture when $CERB_ZK_PORT is set.
#
# Usage: test_cli_once.sh PATH/TO/cerberus
#
# For each backend: a failing CMD is forgotten (the next `once` runs CMD
# again at once) and its status passed on; a succeeding one is recorded
# (the next exits 0 with a line on stderr and does not run CMD); while an
# attempt runs, -n exits 75, -w MS exits 75 after MS, and a default waiter
# waits and then reports the success without running CMD (or runs CMD when
# the first failed); five concurrent `once -n` run CMD exactly once;
# --keep expires; a SIGKILLed cerberus holding an attempt blocks a retry
# for --running and not after; a TERM abandons a wait (75); on redis, a
# record deleted while CMD runs: --on-lost kill stops CMD (76), ignore
# lets it finish (76: not recorded). Plus usage
# errors and --help. Same conventions as test_cli.sh: every command under
# timeout(1), waits on conditions with deadlines, TAP-like output, keys
# unique per run, background processes stopped by PID.
#
# Nothing outlives the script: a CMD that holds an attempt (hold_until)
# writes its PID where the script finds it, and gives up by itself when
# told, when the work folder is gone, or after about a minute; the EXIT trap
# kills every background cerberus (by its timeout's process group) and,
# by PID, every process whose command line names the work folder (a CMD:
# cerberus runs it in a group of its own, and the one of a killed cerberus
# is an orphan) before it removes the folder.

set -u

CERBERUS=${1:?usage: test_cli_once.sh PATH/TO/cerberus}
PORT=${CERB_REDIS_PORT:-26379}
REDIS_CLI=$(command -v redis-cli || true)
T=30

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerb-once-test.XXXXXX")
BG_PIDS=()
FAILED=0
N=0
PREFIX="oncetest$$:"

# names_work PID: PID's command line names $WORK (so it is one of ours,
# not a process that reused a PID we knew).
names_work() {
    local args
    { mapfile -d '' args <"/proc/$1/cmdline"; } 2>/dev/null || return 1
    [[ "${args[*]}" == *"$WORK"* ]]
}

# cmd_alive PIDFILE: the CMD whose PID hold_until wrote in PIDFILE runs.
cmd_alive() {
    local p
    { read -r p <"$1"; } 2>/dev/null && [ -n "$p" ] && names_work "$p"
}

cleanup() {
    local p d
    # Each bg cerberus runs under timeout(1), which leads a process group.
    for p in "${BG_PIDS[@]}"; do
        kill -KILL -- -"$p" 2>/dev/null
    done
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        if [ "$p" != $$ ] && names_work "$p"; then kill -KILL "$p" 2>/dev/null; fi
    done
    { wait; } 2>/dev/null # bash's "Killed" notes for the jobs above
    rm -rf "$WORK"
}
trap cleanup EXIT
# A signal ends the script through exit, so that the EXIT trap runs.
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

ok() {
    N=$((N + 1))
    echo "ok $N - $1"
}

not_ok() {
    N=$((N + 1))
    FAILED=1
    echo "not ok $N - $1"
    shift
    local line
    for line in "$@"; do
        echo "#   $line"
    done
}

check() {
    local d=$1
    shift
    if "$@"; then ok "$d"; else not_ok "$d" "output: ${OUT:-}"; fi
}

now_ms() { date +%s%3N; }

wait_for() {
    local deadline=$(($(now_ms) + $1 * 1000))
    shift
    until "$@"; do
        [ "$(now_ms)" -ge "$deadline" ] && return 1
        sleep 0.02
    done
}

cerb() {
    OUT=$(timeout -k 5 "$T" "$CERBERUS" "$@" 2>&1)
    RC=$?
}

expect_rc() {
    if [ "$RC" -eq "$1" ]; then
        ok "$2"
    else
        not_ok "$2" "exit status $RC, expected $1" "output: $OUT"
    fi
}

expect_out() {
    if printf '%s\n' "$OUT" | grep -Eq -- "$1"; then
        ok "$2"
    else
        not_ok "$2" "output does not match /$1/" "output: $OUT"
    fi
}

bg() {
    local tag=$1
    shift
    (
        timeout -k 5 60 "$CERBERUS" "$@" >"$WORK/$tag.out" 2>&1 &
        echo $! >"$WORK/$tag.pid"
        wait $!
        echo $? >"$WORK/$tag.rc.tmp"
        mv "$WORK/$tag.rc.tmp" "$WORK/$tag.rc"
    ) &
    wait_for 10 test -s "$WORK/$tag.pid"
    BG_PID=$(cat "$WORK/$tag.pid")
    BG_PIDS+=("$BG_PID")
}

bg_done() { [ -e "$WORK/$1.rc" ]; }
bg_rc() { cat "$WORK/$1.rc"; }
# hold_until STARTED STOP: the text of a CMD that writes its PID to STARTED,
# then runs until STOP exists, or $WORK is gone (the script ended), or 3 000
# polls (a minute or more) have passed.
hold_until() {
    echo "echo \$\$ >'$1.tmp'; mv '$1.tmp' '$1'; i=0
        while [ ! -e '$2' ] && [ -d '$WORK' ] && [ \$i -lt 3000 ]; do sleep 0.02; i=\$((i + 1)); done"
}
count_lines() { [ -e "$1" ] && wc -l <"$1" || echo 0; }

# ---- usage (no server needed) ----
cerb once --help
expect_rc 0 "once --help exits 0"
expect_out 'SCOPE KEY -- CMD' "once --help shows the synopsis"
cerb once
expect_rc 64 "once without SCOPE: usage error"
cerb once s
expect_rc 64 "once without KEY: usage error"
cerb once s k
expect_rc 64 "once without CMD: usage error"
cerb once -n -w 5 s k -- true
expect_rc 64 "once -n with -w: usage error"
cerb once --keep 0 s k -- true
expect_rc 64 "once --keep 0: usage error"
cerb once --keep 3x s k -- true
expect_rc 64 "once --keep with a bad unit: usage error"
cerb once "$(printf 'a\tb')" k -- true
expect_rc 64 "once with a control character in SCOPE: usage error"
cerb once --on-lost maybe s k -- true
expect_rc 64 "once --on-lost with a bad value: usage error"
cerb help
expect_out 'once \[-n \| -w MS\]' "cerberus help lists once"

run_backend() { # NAME CONFIG-TEXT
    local be=$1 cfg="$WORK/$1.cfg" key scope s
    printf '%s\n' "$2" >"$cfg"
    scope="once-$be"
    local C=(-c "$cfg")

    # A failure is passed on and forgotten; a success is recorded.
    key="k1-$$-$RANDOM"
    cerb "${C[@]}" once "$scope" "$key" -- sh -c "echo x >>'$WORK/$be.ran1'; exit 3"
    expect_rc 3 "$be: CMD's failing status is passed on"
    cerb "${C[@]}" once "$scope" "$key" -- sh -c "echo x >>'$WORK/$be.ran1'"
    expect_rc 0 "$be: after a failure the next once runs CMD at once"
    cerb "${C[@]}" once "$scope" "$key" -- sh -c "echo x >>'$WORK/$be.ran1'; exit 9"
    expect_rc 0 "$be: after a success once exits 0"
    expect_out 'already succeeded; CMD not run' "$be: ...with a line on stderr"
    check "$be: CMD ran twice in three onces" [ "$(count_lines "$WORK/$be.ran1")" -eq 2 ]
    cerb "${C[@]}" once "$scope" "other-$key" -- true
    expect_rc 0 "$be: another KEY is another operation"

    # While an attempt runs: -n, -w, and a default waiter.
    key="k2-$$-$RANDOM"
    bg "$be-holder" "${C[@]}" once "$scope" "$key" -- sh -c "$(hold_until "$WORK/$be.h" "$WORK/$be.go")"
    check "$be: the first attempt runs CMD" wait_for 10 test -e "$WORK/$be.h"
    cerb "${C[@]}" once -n "$scope" "$key" -- touch "$WORK/$be.nope"
    expect_rc 75 "$be: once -n while an attempt runs exits 75"
    local t0
    t0=$(now_ms)
    cerb "${C[@]}" once -w 300 "$scope" "$key" -- touch "$WORK/$be.nope"
    expect_rc 75 "$be: once -w 300 exits 75"
    check "$be: ...after its wait" [ $(($(now_ms) - t0)) -ge 300 ]
    bg "$be-waiter" "${C[@]}" once "$scope" "$key" -- touch "$WORK/$be.nope"
    bg "$be-waiter2" "${C[@]}" once -v "$scope" "$key" -- sh -c "exit 0"
    local w=$BG_PID
    # Once it says it waits, its signals are handled (set before the client).
    wait_for 10 grep -q 'waiting' "$WORK/$be-waiter2.out"
    kill -TERM "$w"
    check "$be: a TERM abandons the wait (75)" wait_for 10 bg_done "$be-waiter2"
    check "$be: ...with 75" [ "$(bg_rc "$be-waiter2")" = 75 ]
    touch "$WORK/$be.go"
    check "$be: the holder exits" wait_for 10 bg_done "$be-holder"
    check "$be: the waiter ends" wait_for 10 bg_done "$be-waiter"
    check "$be: ...with 0, reporting the success" [ "$(bg_rc "$be-waiter")" = 0 ]
    check "$be: ...and no waiter nor refused once ran CMD" [ ! -e "$WORK/$be.nope" ]

    # A waiter whose first attempt fails runs CMD itself.
    key="k3-$$-$RANDOM"
    bg "$be-f" "${C[@]}" once "$scope" "$key" -- sh -c "$(hold_until "$WORK/$be.fh" "$WORK/$be.fgo"); exit 1"
    wait_for 10 test -e "$WORK/$be.fh"
    bg "$be-fw" "${C[@]}" once "$scope" "$key" -- touch "$WORK/$be.took_over"
    touch "$WORK/$be.fgo"
    check "$be: after the attempt failed, the waiter runs CMD" wait_for 10 bg_done "$be-fw"
    check "$be: ...successfully" [ "$(bg_rc "$be-fw")" = 0 ] && [ -e "$WORK/$be.took_over" ]

    # Five concurrent once -n: CMD runs once.
    key="k4-$$-$RANDOM"
    local i
    for i in 1 2 3 4 5; do
        bg "$be-c$i" "${C[@]}" once -n "$scope" "$key" -- sh -c "echo x >>'$WORK/$be.c'; sleep 0.3"
    done
    all5() { local j; for j in 1 2 3 4 5; do bg_done "$be-c$j" || return 1; done; }
    check "$be: five concurrent once -n end" wait_for 20 all5
    check "$be: ...and CMD ran exactly once" [ "$(count_lines "$WORK/$be.c")" -eq 1 ]

    # --keep expires. 3 s, not less: "right after" is a new cerberus
    # process, whose start under ASan on a loaded machine took more than a
    # keep of 500 ms (ctest -j3: the duplicate ran CMD).
    key="k5-$$-$RANDOM"
    cerb "${C[@]}" once --keep 3s "$scope" "$key" -- true
    expect_rc 0 "$be: once --keep 3s runs CMD"
    cerb "${C[@]}" once "$scope" "$key" -- touch "$WORK/$be.kept"
    check "$be: ...a duplicate right after does not" [ ! -e "$WORK/$be.kept" ]
    again() { "$CERBERUS" "${C[@]}" once "$scope" "$key" -- touch "$WORK/$be.kept" 2>/dev/null && [ -e "$WORK/$be.kept" ]; }
    check "$be: ...and after the keep time CMD runs again" wait_for 10 again

    # A killed cerberus: the claim blocks retries for --running, then lapses.
    key="k6-$$-$RANDOM"
    bg "$be-kill" "${C[@]}" once --running 1500 "$scope" "$key" -- sh -c "$(hold_until "$WORK/$be.kh" "$WORK/$be.never")"
    wait_for 10 test -e "$WORK/$be.kh"
    local kt0 cpid
    kt0=$(now_ms)
    cpid=$(pgrep -P "$BG_PID" -x cerberus || true)
    [ -n "$cpid" ] && kill -KILL "$cpid"
    check "$be: the holding cerberus was killed" wait_for 10 bg_done "$be-kill"
    cerb "${C[@]}" once -n "$scope" "$key" -- touch "$WORK/$be.early"
    expect_rc 75 "$be: right after the kill a retry is refused (75)"
    retry() { "$CERBERUS" "${C[@]}" once -n "$scope" "$key" -- touch "$WORK/$be.late" 2>/dev/null; }
    check "$be: a retry runs once --running has passed" wait_for 10 retry
    check "$be: ...not before it" [ $(($(now_ms) - kt0)) -ge 1000 ]
    touch "$WORK/$be.never" # ends the killed cerberus' orphaned CMD
    orphan_gone() { ! cmd_alive "$WORK/$be.kh"; }
    check "$be: ...whose orphaned CMD then ends" wait_for 10 orphan_gone
}

run_backend local "local = { dir = \"$WORK\"; }; guard = { keep_ms = 60000; };"
if [ -n "$REDIS_CLI" ] && "$REDIS_CLI" -p "$PORT" ping >/dev/null 2>&1; then
    run_backend redis "engines = (\"redis\"); redis = { port = $PORT; prefix = \"$PREFIX\"; }; guard = { keep_ms = 60000; };"
    # Nothing left running on the server: only done-records (keep_ms).
    left=$("$REDIS_CLI" -p "$PORT" --scan --pattern "${PREFIX}cerb:guard:*" | while read -r k; do
        "$REDIS_CLI" -p "$PORT" GET "$k" | head -c 1; echo; done | grep -c '^R' || true)
    check "redis: no running claim left behind" [ "${left:-0}" -eq 0 ]
    "$REDIS_CLI" -p "$PORT" --scan --pattern "${PREFIX}cerb:guard:*" | xargs -r "$REDIS_CLI" -p "$PORT" DEL >/dev/null

    # --on-lost: the record deleted on the server while CMD runs (the only
    # record left under the prefix); the next renewal finds it gone and
    # the attempt is LOST. kill stops CMD at once (76); ignore lets it
    # finish, and its success, not recorded, gives 76 too.
    claim_gone() {
        "$REDIS_CLI" -p "$PORT" --scan --pattern "${PREFIX}cerb:guard:*" |
            xargs -r "$REDIS_CLI" -p "$PORT" DEL >/dev/null
    }
    key="lost-$$-$RANDOM"
    bg redis-lostkill -c "$WORK/redis.cfg" once --on-lost kill --running 600 once-lost "$key" \
        -- sh -c "$(hold_until "$WORK/lk.h" "$WORK/lk.never")"
    wait_for 10 test -e "$WORK/lk.h"
    claim_gone
    check "redis: --on-lost kill: once ends soon after the loss" wait_for 5 bg_done redis-lostkill
    check "redis: ...with 76" [ "$(bg_rc redis-lostkill)" = 76 ]
    check "redis: ...saying CMD was stopped" grep -q 'attempt .* lost; stopping CMD' "$WORK/redis-lostkill.out"
    lk_gone() { ! cmd_alive "$WORK/lk.h"; }
    check "redis: ...and CMD is gone" wait_for 5 lk_gone
    key="lost2-$$-$RANDOM"
    bg redis-lostign -c "$WORK/redis.cfg" once --on-lost ignore --running 600 once-lost "$key" \
        -- sh -c "$(hold_until "$WORK/li.h" "$WORK/li.go")"
    wait_for 10 test -e "$WORK/li.h"
    claim_gone
    check "redis: --on-lost ignore reports the loss" wait_for 5 grep -q 'lost; CMD goes on' "$WORK/redis-lostign.out"
    check "redis: ...and CMD goes on" cmd_alive "$WORK/li.h"
    touch "$WORK/li.go"
    check "redis: ...to its end" wait_for 10 bg_done redis-lostign
    check "redis: ...then 76, its success not recorded" [ "$(bg_rc redis-lostign)" = 76 ]
    check "redis: ...and said so" grep -q 'not recorded' "$WORK/redis-lostign.out"
    claim_gone
else
    not_ok "redis on port $PORT answers"
fi

if [ -n "${CERB_ZK_PORT:-}" ]; then
    # Records under a root of this run's own (the server is the fixture's,
    # discarded with it).
    run_backend zk "engines = (\"zk\"); zk = { hosts = \"127.0.0.1:$CERB_ZK_PORT\"; root = \"/oncetest$$/locks\"; }; guard = { keep_ms = 60000; };"
fi

echo "1..$N"
exit $FAILED
