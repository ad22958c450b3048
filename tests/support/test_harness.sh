#!/usr/bin/env bash
#
# test_harness.sh LAUNCHER CHECK — the test harness's own checks
# (harness_session): run_in_session.sh (LAUNCHER) reports and kills what a
# test leaves in its session, and passes a test that leaves nothing or whose
# children end within the grace time; check_leftovers.sh (CHECK) finds a
# marked process that left the session, names the test that started it, and
# kills it. Planted processes carry a marker of this script's own (a
# temporary directory, not the build dir), so the run's real last check never
# sees them, and the trap kills by PID whatever a failed check left.
# Output is TAP-like; the launcher's reports are shown only when a check
# fails (their LEFTOVER line fails any test that prints it).

set -u

LAUNCHER=${1:?usage: test_harness.sh LAUNCHER CHECK}
CHECK=${2:?usage: test_harness.sh LAUNCHER CHECK}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerb-harness-test.XXXXXX")
FAILED=0
N=0
PLANTED=()

cleanup() {
    local p
    for p in "${PLANTED[@]}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

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
    for line in "$@"; do printf '%s\n' "$line" | sed 's/^/#   /'; done
}

# now_ms: monotonic (/proc/uptime).
now_ms() {
    local up
    read -r up _ </proc/uptime
    echo $((10#${up/./} * 10))
}

# wait_gone SECONDS PID: true once PID is gone or a zombie, false at the
# deadline.
wait_gone() {
    local deadline=$(($(now_ms) + $1 * 1000)) s
    while :; do
        s=$(sed 's/.*) //; s/ .*//' "/proc/$2/stat" 2>/dev/null) || return 0
        [[ $s != Z && $s != X ]] || return 0
        (($(now_ms) < deadline)) || return 1
        sleep 0.02
    done
}

# wait_file SECONDS FILE: true once FILE is non-empty.
wait_file() {
    local deadline=$(($(now_ms) + $1 * 1000))
    until [[ -s $2 ]]; do
        (($(now_ms) < deadline)) || return 1
        sleep 0.02
    done
}

launch() { # NAME CMD...: OUT, RC
    local name=$1
    shift
    OUT=$(timeout -k 5 30 bash "$LAUNCHER" "$WORK" "$name" -- "$@" 2>&1)
    RC=$?
}

# Planted processes exec sleep, so that none has a child of its own to
# outlive it when it is killed.

# 1. A process left running: reported, named, killed; status 1.
launch planted-loop bash -c "sh -c 'echo \$\$ >\"$WORK/loop.pid\"; exec sleep 1000' & exit 0"
loop=$(cat "$WORK/loop.pid" 2>/dev/null)
[[ -n $loop ]] && PLANTED+=("$loop")
if ((RC == 1)) && grep -q "^run_in_session: LEFTOVER: planted-loop left" <<<"$OUT" &&
    grep -q "^pid $loop .*: sleep 1000" <<<"$OUT"; then
    ok "a process left in the session is reported by PID with its command, status 1"
else
    not_ok "a process left in the session is reported by PID with its command, status 1" \
        "status $RC, loop pid ${loop:-?}" "$OUT"
fi
if [[ -n $loop ]] && wait_gone 5 "$loop"; then
    ok "...and killed"
else
    not_ok "...and killed" "pid ${loop:-?}"
fi

# 2. A failing test that leaves nothing keeps its status and no report.
launch clean bash -c 'echo fine; exit 3'
if ((RC == 3)) && [[ $OUT == fine ]]; then
    ok "a test that leaves nothing keeps its status (3) and output"
else
    not_ok "a test that leaves nothing keeps its status (3) and output" "status $RC" "$OUT"
fi

# 3. A child that ends within the grace time is not a leftover.
launch grace bash -c 'sleep 0.3 & exit 0'
if ((RC == 0)) && ! grep -q LEFTOVER <<<"$OUT"; then
    ok "a child ending within the grace time is not reported"
else
    not_ok "a child ending within the grace time is not reported" "status $RC" "$OUT"
fi

# 4. The test's environment carries the run's marker and the test's name,
# and the test leads a session of its own.
launch marker bash -c 'read -r l </proc/$$/stat; set -- ${l##*) }
    echo "$CERB_TEST_RUN $CERB_TEST_NAME $([ "$4" = $$ ] && echo leader)"'
if ((RC == 0)) && [[ $OUT == "$WORK marker leader" ]]; then
    ok "CERB_TEST_RUN, CERB_TEST_NAME and a session of its own"
else
    not_ok "CERB_TEST_RUN, CERB_TEST_NAME and a session of its own" "status $RC" "$OUT"
fi

# 5. SIGTERM to the launcher reaches the test (its trap runs).
bash "$LAUNCHER" "$WORK" term -- bash -c "trap 'echo got >\"$WORK/term\"; exit 7' TERM
    echo \$\$ >\"$WORK/term.pid\"; while :; do sleep 0.05; done" >/dev/null 2>&1 &
lpid=$!
PLANTED+=("$lpid")
if wait_file 10 "$WORK/term.pid"; then
    PLANTED+=("$(cat "$WORK/term.pid")")
    kill -TERM "$lpid"
fi
wait_gone 10 "$lpid"
wait "$lpid"
RC=$?
if ((RC == 7)) && [[ -s $WORK/term ]]; then
    ok "SIGTERM is passed on to the test, whose status is kept (7)"
else
    not_ok "SIGTERM is passed on to the test, whose status is kept (7)" "status $RC"
fi

# 5b. The same, signalled the moment the test runs, up to 80 times: the
# launcher must neither die of a SIGTERM that beats its traps nor report the
# interrupted `wait` (143) once the test has ended and been reaped. The old
# launcher failed this case in 4 runs of 4 (a few of the 80 each time).
# Two spinning shells load the machine's two cores, which widens both races.
# The runs stop at 80 or after RACE_BUDGET_MS, whichever comes first (at
# least RACE_MIN runs): a run takes ~0.3 s on an idle machine, and several
# times that while ctest runs other tests beside this one (CI's run of stop
# 37 spent the test's whole 60 s here).
RACE_BUDGET_MS=${CERB_HARNESS_RACE_MS:-25000}
RACE_MIN=20
race_end=$(($(now_ms) + RACE_BUDGET_MS))
runs=0
bad=""
spin=()
for i in 1 2; do
    bash -c 'while :; do :; done' &
    spin+=("$!")
    PLANTED+=("$!")
done
for i in $(seq 1 80); do
    ((i <= RACE_MIN || $(now_ms) < race_end)) || break
    runs=$i
    rm -f "$WORK/race.pid"
    bash "$LAUNCHER" "$WORK" race -- bash -c "trap 'exit 7' TERM
        echo \$\$ >\"$WORK/race.pid\"; while :; do sleep 0.05; done" >/dev/null 2>&1 &
    lpid=$!
    PLANTED+=("$lpid")
    deadline=$(($(now_ms) + 10000))
    # Spinning, not sleeping: the point is to signal within microseconds.
    until [[ -s $WORK/race.pid ]] || (($(now_ms) > deadline)); do :; done
    [[ -s $WORK/race.pid ]] && PLANTED+=("$(cat "$WORK/race.pid")")
    kill -TERM "$lpid"
    wait_gone 10 "$lpid"
    wait "$lpid"
    RC=$?
    ((RC == 7)) || bad+="run $i: status $RC; "
done
kill -KILL "${spin[@]}"
wait "${spin[@]}" 2>/dev/null
if [[ -z $bad ]]; then
    ok "SIGTERM the moment the test starts: status 7 in $runs runs out of $runs"
else
    not_ok "SIGTERM the moment the test starts: status 7 in every run ($runs)" "$bad"
fi

# 6. A process that left the session (setsid): not the launcher's to see;
# check_leftovers.sh finds it by the marker, names the test, kills it.
launch escaped bash -c "setsid sh -c 'echo \$\$ >\"$WORK/esc.pid\"; exec sleep 1000' </dev/null >/dev/null 2>&1 &
    while [ ! -s '$WORK/esc.pid' ]; do sleep 0.02; done"
esc=$(cat "$WORK/esc.pid" 2>/dev/null)
[[ -n $esc ]] && PLANTED+=("$esc")
if ((RC == 0)) && [[ -n $esc ]] && ! wait_gone 0 "$esc"; then
    ok "a process that left the session is not the launcher's"
else
    not_ok "a process that left the session is not the launcher's" "status $RC, pid ${esc:-?}" "$OUT"
fi
OUT=$(timeout -k 5 30 bash "$CHECK" "$WORK" "$WORK/no-state" 2>&1)
RC=$?
if ((RC == 1)) && grep -q "^pid $esc .*started by escaped: sleep 1000" <<<"$OUT"; then
    ok "check_leftovers finds it by CERB_TEST_RUN and names the test, status 1"
else
    not_ok "check_leftovers finds it by CERB_TEST_RUN and names the test, status 1" \
        "status $RC, pid ${esc:-?}" "$OUT"
fi
if [[ -n $esc ]] && wait_gone 5 "$esc"; then
    ok "...and kills it"
else
    not_ok "...and kills it" "pid ${esc:-?}"
fi

# 7. A server recorded in the state dir's PID files is listed, not failed.
mkdir -p "$WORK/state"
(CERB_TEST_RUN=$WORK setsid sleep 1000 </dev/null >/dev/null 2>&1 &
    echo $! >"$WORK/srv.pid")
srv=$(cat "$WORK/srv.pid")
PLANTED+=("$srv")
echo "$srv" >"$WORK/state/redis-1.pid"
OUT=$(timeout -k 5 30 bash "$CHECK" "$WORK" "$WORK/state" 2>&1)
RC=$?
if ((RC == 0)) && grep -q "^server still running .*redis-1.pid" <<<"$OUT" && ! wait_gone 0 "$srv"; then
    ok "a test server recorded by servers.sh is listed, left running, not failed"
else
    not_ok "a test server recorded by servers.sh is listed, left running, not failed" "status $RC" "$OUT"
fi
kill -KILL "$srv" 2>/dev/null

echo "1..$N"
exit $FAILED
