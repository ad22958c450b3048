#!/usr/bin/env bash
# test_cli.sh — the `cerberus` command end to end against the test
# redis-server (ctest fixture `redis`, port $CERB_REDIS_PORT).
#
# Usage: test_cli.sh PATH/TO/cerberus
#
# Every command runs under timeout(1), so a hang fails the test instead of
# the suite; waits are on a condition with a deadline (wait_for), never a
# bare sleep. Lock names carry the PID and a random part, so the suite can
# share the server with the cmocka suites running in parallel. Processes
# started here are stopped by PID at exit. Output is TAP-like: one
# "ok"/"not ok" line per check, and the exit status is 1 if any failed.

set -u

CERBERUS=${1:?usage: test_cli.sh PATH/TO/cerberus}
PORT=${CERB_REDIS_PORT:-26379}
PY=${CERB_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
REDIS_CLI=$(command -v redis-cli || true)
T=30 # default bound of one command, seconds

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerb-cli-test.XXXXXX")
BG_PIDS=()
FAILED=0
N=0

cleanup() {
    local p
    # timeout(1) PIDs: TERM goes on to cerberus, and from it to CMD.
    for p in "${BG_PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    wait
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
    for line in "$@"; do
        echo "#   $line"
    done
}

now_ms() { date +%s%3N; }

# wait_for SECONDS CMD... — poll CMD until it succeeds or the deadline passes.
wait_for() {
    local deadline=$(($(now_ms) + $1 * 1000))
    shift
    until "$@"; do
        [ "$(now_ms)" -ge "$deadline" ] && return 1
        sleep 0.02
    done
}

# cerb ARGS... — run the command bounded; sets OUT (stdout+stderr) and RC.
cerb() {
    OUT=$(timeout -k 5 "$T" "$CERBERUS" "$@" 2>&1)
    RC=$?
}

# expect RC DESCRIPTION — check the last cerb's status.
expect_rc() {
    if [ "$RC" -eq "$1" ]; then
        ok "$2"
    else
        not_ok "$2" "exit status $RC, expected $1" "output: $OUT"
    fi
}

# expect_out REGEX DESCRIPTION — check the last cerb's output.
expect_out() {
    if printf '%s\n' "$OUT" | grep -Eq -- "$1"; then
        ok "$2"
    else
        not_ok "$2" "output does not match /$1/" "output: $OUT"
    fi
}

uniq_name() { echo "cli-$1-$$-$RANDOM$RANDOM"; }

# bg NAME ARGS... — start `cerberus ARGS` in the background, bounded. Sets
# BG_PID to the PID of its timeout(1), which passes TERM on to cerberus;
# the exit status goes to $WORK/NAME.rc, the output to $WORK/NAME.out.
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

CFG=$WORK/cerberus.cfg
cat >"$CFG" <<EOF
# Test configuration for test_cli.sh.
engines = ("redis", "local");   # failover order
active = "auto";                # pinned by ops: keep this comment
epoch = 1;

/* A block comment mentioning active = "zk"; must stay untouched. */
lock = { lease_ms = 3000; };
redis = {
  host = "127.0.0.1";
  port = $PORT;
  # active = "local";  (a comment inside a group)
};
EOF

# ------------------------------------------------------------------ help
for c in run status switch check holders; do
    cerb "$c" --help
    if [ "$RC" -eq 0 ] && printf '%s' "$OUT" | grep -q "^Usage: cerberus .*$c"; then
        ok "$c --help"
    else
        not_ok "$c --help" "rc $RC" "$OUT"
    fi
done
cerb --help
expect_rc 0 "cerberus --help"
cerb help run
expect_out '^Usage: cerberus \[-c FILE\] run' "cerberus help run"
cerb
expect_rc 64 "no command: usage, 64"
cerb frobnicate
expect_rc 64 "unknown command: 64"
cerb -c "$CFG" run
expect_rc 64 "run without NAME: 64"
cerb -c "$CFG" run -n -w 10 x -- true
expect_rc 64 "run -n -w together: 64"
cerb -c "$CFG" run --on-lost maybe x -- true
expect_rc 64 "run --on-lost with a bad value: 64"

# ----------------------------------------------------------------- check
cerb -c "$CFG" check
expect_rc 0 "check: a valid file exits 0"
expect_out "^$CFG: ok\$" "check: prints FILE: ok"

B=$WORK/broken
mkdir -p "$B"
printf 'engines = ("redis");\nepoch = "x";\n' >"$B/type.cfg"
printf 'engines = ("redis");\nredis = { prot = 1; };\n' >"$B/unknown_key.cfg"
printf '# comment\nengines = ("redsi");\n' >"$B/unknown_engine.cfg"
printf 'engines = ("redis");\nlock = {\n  lease_ms = 5;\n};\n' >"$B/range.cfg"
printf 'engines = ("redis");\n\nredis = { port = 1\n' >"$B/syntax.cfg"
printf 'engines = ("redis");\nactive = "local";\n' >"$B/active.cfg"
printf 'engines = ("redis");\nredis = 5;\n' >"$B/group.cfg"
printf 'engines = ("redis");\nretry = {\n  backoff_ms = 100;\n  backoff_max_ms = 50;\n};\n' >"$B/cross.cfg"
check_broken() { # FILE LINE REGEX
    cerb check "$B/$1"
    if [ "$RC" -eq 78 ] && printf '%s\n' "$OUT" | grep -Eq "^$B/$1:$2: .*$3"; then
        ok "check: $1 -> 78, $1:$2"
    else
        not_ok "check: $1 -> 78, $1:$2" "rc $RC" "$OUT"
    fi
}
check_broken type.cfg 2 'expected an integer'
check_broken unknown_key.cfg 2 'unknown key "redis.prot"'
check_broken unknown_engine.cfg 2 'unknown engine "redsi"'
check_broken range.cfg 3 'out of range'
check_broken syntax.cfg 4 'syntax error'
check_broken active.cfg 2 'not listed in engines'
check_broken group.cfg 2 'expected a group'
check_broken cross.cfg 4 'backoff_max_ms'
cerb -c "$B/unknown_key.cfg" check
expect_rc 78 "check: the -c file is checked"
cerb check "$CFG" "$B/type.cfg"
if [ "$RC" -eq 78 ] && printf '%s\n' "$OUT" | grep -q "^$CFG: ok"; then
    ok "check: several files, one broken -> 78, the good one ok"
else
    not_ok "check: several files" "rc $RC" "$OUT"
fi
cerb check "$B/missing.cfg"
expect_rc 78 "check: a missing file -> 78"

# ------------------------------------------------------------ config lookup
mkdir -p "$WORK/cwd"
cp "$CFG" "$WORK/cwd/cerberus.cfg"
OUT=$(cd "$WORK/cwd" && CERBERUS_CONFIG= timeout 10 "$CERBERUS" check 2>&1)
RC=$?
expect_out '^cerberus\.cfg: ok$' "lookup: ./cerberus.cfg"
OUT=$(cd "$WORK/cwd" && CERBERUS_CONFIG=$B/type.cfg timeout 10 "$CERBERUS" check 2>&1)
RC=$?
expect_rc 78 "lookup: \$CERBERUS_CONFIG before ./cerberus.cfg"
OUT=$(cd "$WORK/cwd" && CERBERUS_CONFIG=$B/type.cfg timeout 10 "$CERBERUS" -c "$CFG" check 2>&1)
RC=$?
expect_rc 0 "lookup: -c before \$CERBERUS_CONFIG"

# ---------------------------------------------------------------- switch
SW=$WORK/switch.cfg
cp "$CFG" "$SW"
chmod 640 "$SW"
cerb -c "$SW" switch
expect_out '^auto$' "switch without ENGINE prints the active setting"
cerb -c "$SW" switch local
expect_rc 0 "switch local exits 0"
expect_out 'active "auto" -> "local", epoch 1 -> 2' "switch reports the change"
want_active=$(grep '^active = ' "$CFG" | sed 's/"auto"/"local"/')
if grep -qxF "$want_active" "$SW" && grep -q '^epoch = 2;$' "$SW"; then
    ok "switch rewrote active and bumped epoch in place"
else
    not_ok "switch rewrote active and bumped epoch in place" "$(cat "$SW")"
fi
if diff <(grep -v '^active = \|^epoch = ' "$CFG") <(grep -v '^active = \|^epoch = ' "$SW") >/dev/null; then
    ok "switch kept every other line, comments included"
else
    not_ok "switch kept every other line" "$(diff "$CFG" "$SW")"
fi
if [ "$(stat -c %a "$SW")" = 640 ]; then
    ok "switch kept the file mode"
else
    not_ok "switch kept the file mode" "mode $(stat -c %a "$SW")"
fi
if ls -A "$WORK" | grep -q '^\.switch\.cfg\.'; then
    not_ok "switch left no temporary file" "$(ls -A "$WORK")"
else
    ok "switch left no temporary file"
fi
cerb -c "$SW" check
expect_rc 0 "the switched file is valid"
cp "$SW" "$WORK/before.cfg"
cerb -c "$SW" switch zk
expect_rc 78 "switch to an engine not in engines -> 78"
expect_out 'engine "zk" is not configured' "switch names the unknown engine"
if cmp -s "$SW" "$WORK/before.cfg"; then
    ok "switch to an unknown engine leaves the file unchanged"
else
    not_ok "switch to an unknown engine leaves the file unchanged" "$(diff "$WORK/before.cfg" "$SW")"
fi
cerb -c "$SW" switch local
expect_out 'already "local"' "switch to the active engine changes nothing"
cerb -c "$SW" switch auto
expect_out 'epoch 2 -> 3' "switch back to auto bumps again"
# Concurrent switches are serialised: no bump is lost.
for i in 1 2 3 4 5 6; do
    if [ $((i % 2)) -eq 0 ]; then e=auto; else e=local; fi
    (timeout 20 "$CERBERUS" -c "$SW" switch "$e" >"$WORK/sw.$i" 2>&1) &
done
wait
changes=$(cat "$WORK"/sw.* | grep -c -- '->')
if grep -q "^epoch = $((3 + changes));\$" "$SW"; then
    ok "concurrent switches: epoch bumped once per change ($changes)"
else
    not_ok "concurrent switches" "changes $changes" "$(grep epoch "$SW")"
fi
NOFILE=$WORK/nofile
mkdir -p "$NOFILE"
OUT=$(cd "$NOFILE" && CERBERUS_CONFIG= timeout 10 "$CERBERUS" switch local 2>&1)
RC=$?
if [ -e /etc/cerberus/cerberus.cfg ]; then
    ok "switch without a file # SKIP /etc/cerberus/cerberus.cfg exists"
else
    expect_rc 78 "switch without any config file -> 78"
fi

# ------------------------------------------------------------------- run
L=$(uniq_name status)
cerb -c "$CFG" run "$L" -- sh -c 'exit 7'
expect_rc 7 "run exits with CMD's status"
cerb -c "$CFG" run "$L" -- sh -c 'kill -TERM $$'
expect_rc 143 "run exits 128+N when CMD dies of signal N"
cerb -c "$CFG" run "$L" -- sh -c 'echo "name=$CERBERUS_LOCK_NAME token=$CERBERUS_FENCING_TOKEN"'
expect_out "^name=$L token=[1-9][0-9]*\$" "CMD sees CERBERUS_LOCK_NAME and CERBERUS_FENCING_TOKEN"
cerb -c "$CFG" run "$L" -- true
if [ "$RC" -eq 0 ] && [ -z "$OUT" ]; then
    ok "run prints nothing on success"
else
    not_ok "run prints nothing on success" "rc $RC" "$OUT"
fi
cerb -c "$CFG" run "$L" -- "$WORK/no-such-command"
expect_rc 127 "run: CMD not found -> 127"
cerb -c "$CFG" run "$L" -- "$CFG"
expect_rc 126 "run: CMD not executable -> 126"

# -n while another `cerberus run` holds the name; holders sees the holder.
L=$(uniq_name busy)
bg holder -c "$CFG" run "$L" -- sh -c "touch '$WORK/busy.held'; while [ ! -e '$WORK/busy.go' ]; do sleep 0.02; done"
HOLDER=$BG_PID
if wait_for 20 test -e "$WORK/busy.held"; then ok "holder started"; else not_ok "holder started" "$(cat "$WORK/holder.out")"; fi
cerb -c "$CFG" run -n "$L" -- echo must-not-run
expect_rc 75 "run -n while held -> 75"
if printf '%s' "$OUT" | grep -q must-not-run; then not_ok "run -n did not run CMD" "$OUT"; else ok "run -n did not run CMD"; fi
t0=$(now_ms)
cerb -c "$CFG" run -w 300 "$L" -- echo must-not-run
t1=$(now_ms)
expect_rc 75 "run -w 300 while held -> 75"
if [ $((t1 - t0)) -ge 250 ] && [ $((t1 - t0)) -lt 10000 ]; then
    ok "run -w waited about its bound ($((t1 - t0)) ms)"
else
    not_ok "run -w waited about its bound" "$((t1 - t0)) ms"
fi
cerb -c "$CFG" holders "$L"
expect_rc 0 "holders exits 0"
expect_out '^redis: held by [0-9a-f]{32}, [0-9]+ ms left' "holders shows the redis holder"
expect_out '^local: not supported yet$' "holders: other engines not supported yet"
# A waiter shows up in holders, and gets the lock when the holder is done.
bg waiter -c "$CFG" run "$L" -- sh -c "echo waiter-ran"
holders_waiting() {
    OUT=$(timeout 10 "$CERBERUS" -c "$CFG" holders "$L" 2>&1)
    printf '%s\n' "$OUT" | grep -Eq '^redis: waiting: [0-9a-f]{32}'
}
if wait_for 20 holders_waiting; then ok "holders shows the waiter"; else not_ok "holders shows the waiter" "$OUT"; fi
# A TERM while waiting abandons the wait with 75 (timeout(1) forwards it).
OUT=$(timeout -s TERM --preserve-status 2 "$CERBERUS" -c "$CFG" run "$L" -- echo must-not-run 2>&1)
RC=$?
expect_rc 75 "SIGTERM while waiting -> 75, CMD not run"
touch "$WORK/busy.go"
if wait_for 30 bg_done holder && [ "$(bg_rc holder)" = 0 ]; then ok "holder exited 0"; else not_ok "holder exited 0" "$(cat "$WORK/holder.out")"; fi
if wait_for 30 bg_done waiter && [ "$(bg_rc waiter)" = 0 ] && grep -q waiter-ran "$WORK/waiter.out"; then
    ok "the waiter ran after the holder released"
else
    not_ok "the waiter ran after the holder released" "$(cat "$WORK/waiter.out" 2>/dev/null)"
fi
cerb -c "$CFG" holders "$L"
expect_out '^redis: free$' "holders: free after release"

# Five concurrent `run -n` on one name run the job once.
L=$(uniq_name once)
for i in 1 2 3 4 5; do
    bg "once$i" -c "$CFG" run -n "$L" -- sh -c "echo ran >> '$WORK/once.log'; while [ ! -e '$WORK/once.go' ]; do sleep 0.02; done"
done
four_refused() {
    local n=0 i
    for i in 1 2 3 4 5; do
        bg_done "once$i" && [ "$(bg_rc "once$i")" = 75 ] && n=$((n + 1))
    done
    [ "$n" -eq 4 ]
}
wait_for 30 four_refused
touch "$WORK/once.go"
all_done() { local i; for i in 1 2 3 4 5; do bg_done "once$i" || return 1; done; }
wait_for 30 all_done
if [ "$(wc -l <"$WORK/once.log")" -eq 1 ] && four_refused; then
    ok "five concurrent run -n: the job ran once, four exited 75"
else
    not_ok "five concurrent run -n" "runs: $(wc -l <"$WORK/once.log")" "$(for i in 1 2 3 4 5; do echo "once$i: $(bg_rc "once$i" 2>/dev/null)"; done)"
fi

# Concurrent waiting runs never overlap.
L=$(uniq_name overlap)
for i in 1 2 3 4; do
    bg "ov$i" -c "$CFG" run "$L" -- sh -c "echo 'start $i' >> '$WORK/ov.log'; sleep 0.1; echo 'end $i' >> '$WORK/ov.log'"
done
ov_done() { local i; for i in 1 2 3 4; do bg_done "ov$i" || return 1; done; }
wait_for 60 ov_done
if awk 'NR % 2 == 1 { if ($1 != "start") bad = 1; id = $2 }
        NR % 2 == 0 { if ($1 != "end" || $2 != id) bad = 1 }
        END { exit (bad || NR != 8) }' "$WORK/ov.log"; then
    ok "four concurrent runs never overlapped"
else
    not_ok "four concurrent runs never overlapped" "$(cat "$WORK/ov.log")"
fi

# The lock is released when CMD is killed.
L=$(uniq_name killed)
bg killed -c "$CFG" run "$L" -- sh -c "echo \$\$ > '$WORK/killed.cmdpid'; exec sleep 60"
wait_for 20 test -s "$WORK/killed.cmdpid"
kill -KILL "$(cat "$WORK/killed.cmdpid")"
if wait_for 20 bg_done killed && [ "$(bg_rc killed)" = 137 ]; then
    ok "run exits 137 when CMD is killed by SIGKILL"
else
    not_ok "run exits 137 when CMD is killed" "$(bg_rc killed 2>/dev/null)" "$(cat "$WORK/killed.out")"
fi
cerb -c "$CFG" holders "$L"
expect_out '^redis: free$' "the lock is free after CMD was killed"

# Signals to cerberus are forwarded to CMD's process group.
L=$(uniq_name fwd)
bg fwd -c "$CFG" run "$L" -- sh -c "trap 'echo got-term > \"$WORK/fwd.term\"; exit 5' TERM; touch '$WORK/fwd.held'; while :; do sleep 0.02; done"
wait_for 20 test -e "$WORK/fwd.held"
kill -TERM "$BG_PID" # timeout(1), which passes TERM on to cerberus
if wait_for 20 bg_done fwd && [ "$(bg_rc fwd)" = 5 ] && [ -e "$WORK/fwd.term" ]; then
    ok "SIGTERM to cerberus reaches CMD; exit with CMD's status"
else
    not_ok "SIGTERM forwarded to CMD" "rc $(bg_rc fwd 2>/dev/null)" "$(cat "$WORK/fwd.out")"
fi

# A lost lock: the key is deleted behind the holder's back.
if [ -n "$REDIS_CLI" ]; then
    L=$(uniq_name lost)
    bg lost -c "$CFG" run --lease 300 "$L" -- sh -c "trap 'echo got-term > \"$WORK/lost.term\"; exit 9' TERM; touch '$WORK/lost.held'; while :; do sleep 0.02; done"
    wait_for 20 test -e "$WORK/lost.held"
    timeout 10 "$REDIS_CLI" -p "$PORT" DEL "$L" >/dev/null
    if wait_for 20 bg_done lost && [ "$(bg_rc lost)" = 76 ] && [ -e "$WORK/lost.term" ]; then
        ok "run --on-lost kill: CMD got SIGTERM, exit 76"
    else
        not_ok "run --on-lost kill" "rc $(bg_rc lost 2>/dev/null)" "$(cat "$WORK/lost.out")"
    fi
    # SIGKILL after the grace when CMD ignores SIGTERM.
    L=$(uniq_name lostkill)
    bg lostk -c "$CFG" run --lease 300 --grace 200 "$L" -- sh -c "trap '' TERM; touch '$WORK/lostk.held'; while :; do sleep 0.02; done"
    wait_for 20 test -e "$WORK/lostk.held"
    timeout 10 "$REDIS_CLI" -p "$PORT" DEL "$L" >/dev/null
    if wait_for 20 bg_done lostk && [ "$(bg_rc lostk)" = 76 ] && grep -q SIGKILL "$WORK/lostk.out"; then
        ok "run --on-lost kill: SIGKILL after the grace, exit 76"
    else
        not_ok "run --on-lost kill with a stubborn CMD" "rc $(bg_rc lostk 2>/dev/null)" "$(cat "$WORK/lostk.out")"
    fi
    # --on-lost ignore: reported, CMD finishes, its status is kept.
    L=$(uniq_name lostign)
    bg losti -c "$CFG" run --lease 300 --on-lost ignore "$L" -- sh -c "touch '$WORK/losti.held'; while [ ! -e '$WORK/losti.go' ]; do sleep 0.02; done; exit 4"
    wait_for 20 test -e "$WORK/losti.held"
    timeout 10 "$REDIS_CLI" -p "$PORT" DEL "$L" >/dev/null
    wait_for 20 grep -q 'lost' "$WORK/losti.out"
    touch "$WORK/losti.go"
    if wait_for 20 bg_done losti && [ "$(bg_rc losti)" = 4 ] && grep -q 'lost' "$WORK/losti.out"; then
        ok "run --on-lost ignore: loss reported, CMD's status kept"
    else
        not_ok "run --on-lost ignore" "rc $(bg_rc losti 2>/dev/null)" "$(cat "$WORK/losti.out")"
    fi
else
    ok "lost lock # SKIP redis-cli not found"
fi

# ---------------------------------------------------------------- status
cerb -c "$CFG" status
expect_rc 0 "status exits 0"
expect_out '^\* redis +closed' "status marks the active engine"
cerb -c "$CFG" status --json
expect_rc 0 "status --json exits 0"
if printf '%s' "$OUT" | "$PY" -m json.tool >/dev/null 2>&1 &&
    printf '%s' "$OUT" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
names = [e["name"] for e in d["engines"]]
assert names == ["redis", "local"], names
assert d["current"] == "redis" and d["epoch"] == 1, d
assert d["engines"][0]["active"] is True
assert all(k in d["engines"][0] for k in ("breaker", "last_probe_us", "acquires",
    "failures", "lost", "acquire_calls", "wakeups", "handoffs"))
'; then
    ok "status --json is valid JSON with the engines"
else
    not_ok "status --json is valid JSON" "$OUT"
fi
DEAD=$WORK/dead.cfg
printf 'engines = ("redis");\nredis = { port = 1; connect_timeout_ms = 200; };\n' >"$DEAD"
cerb -c "$DEAD" status --json
if [ "$RC" -eq 69 ] && printf '%s' "$OUT" | grep -v '^cerberus:' | "$PY" -m json.tool >/dev/null 2>&1; then
    ok "status with no engine reachable -> 69, still JSON"
else
    not_ok "status with no engine reachable" "rc $RC" "$OUT"
fi
cerb -c "$DEAD" run x -- true
expect_rc 69 "run with no engine reachable -> 69"
cerb -c "$DEAD" holders x
expect_rc 69 "holders with redis unreachable -> 69"
cerb -c "$B/type.cfg" run x -- true
expect_rc 78 "run with a broken config -> 78"

echo "1..$N"
exit $FAILED
