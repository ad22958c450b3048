#!/usr/bin/env bash
# test_cli_elect.sh — `cerberus elect` and `cerberus leader` (DESIGN.md §16)
# end to end, between processes, on one engine's shared fixture: redis
# ($CERB_REDIS_PORT), zk ($CERB_ZK_PORT) or etcd ($CERB_ETCD_PORT).
#
# Usage: test_cli_elect.sh PATH/TO/cerberus redis|zk|etcd
#
# Nobody leads: `leader` says so (75). A leader elected with -n runs CMD
# with the election's variables and passes CMD's status on. While a
# background candidate leads: `leader` prints its value (-q alone), -n
# exits 75 at once, -w 300 after about 300 ms, a TERM ends a campaign
# (75); a waiting candidate is elected when CMD ends, with a greater
# fencing token; a leader whose cerberus is killed (SIGKILL) is followed
# within its lease. Usage errors exit 64. Same conventions as
# test_cli_once.sh: every command under timeout(1), waits on conditions
# with deadlines, names unique per run, background processes stopped by PID.
set -u

CERBERUS=${1:?usage: test_cli_elect.sh PATH/TO/cerberus redis|zk|etcd}
ENGINE=${2:?usage: test_cli_elect.sh PATH/TO/cerberus redis|zk|etcd}
T=30
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerb-elect-test.XXXXXX")
BG_PIDS=()
FAILED=0
N=0
NAME="electtest-$$-$RANDOM"

cleanup() {
    local p
    for p in "${BG_PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done
    { wait; } 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

ok() { N=$((N + 1)); echo "ok $N - $1"; }
not_ok() {
    N=$((N + 1)); FAILED=1; echo "not ok $N - $1"; shift
    local line; for line in "$@"; do echo "#   $line"; done
}
now_ms() { date +%s%3N; }
wait_for() {
    local deadline=$(($(now_ms) + $1 * 1000)); shift
    until "$@"; do
        [ "$(now_ms)" -ge "$deadline" ] && return 1
        sleep 0.02
    done
}
cerb() { OUT=$(timeout -k 5 "$T" "$CERBERUS" -c "$CFG" "$@" 2>&1); RC=$?; }
expect_rc() {
    if [ "$RC" -eq "$1" ]; then ok "$2"; else not_ok "$2" "exit status $RC, expected $1" "output: $OUT"; fi
}

CFG=$WORK/cerberus.cfg
case $ENGINE in
# redis: the fixture's own prefix, which servers.sh prepared (a new prefix
# would start in the data-loss quarantine); the name is this run's own.
redis) printf 'engines = ("redis");\nredis = { host = "127.0.0.1"; port = %s; };\nlock = { lease_ms = 2000; };\n' \
    "${CERB_REDIS_PORT:?}" >"$CFG" ;;
zk) printf 'engines = ("zk");\nzk = { hosts = "127.0.0.1:%s"; root = "/%s/elect"; session_timeout_ms = 2000; };\nlock = { lease_ms = 2000; };\n' \
    "${CERB_ZK_PORT:?}" "$NAME" >"$CFG" ;;
etcd) printf 'engines = ("etcd");\netcd = { endpoints = ("http://127.0.0.1:%s"); prefix = "%s/"; session_ttl_s = 2; };\nlock = { lease_ms = 2000; };\n' \
    "${CERB_ETCD_PORT:?}" "$NAME" >"$CFG" ;;
*) echo "unknown engine $ENGINE" >&2; exit 2 ;;
esac

# A background candidate: `elect --value V NAME -- CMD` where CMD writes
# its environment to $WORK/V.env and runs until $WORK/V.stop exists.
bg_elect() {
    local v=$1; shift
    setsid timeout -k 5 60 "$CERBERUS" -c "$CFG" elect -v --value "$v" "$@" "$NAME" -- \
        sh -c 'env | grep ^CERBERUS_ > "$0.env"; while [ ! -e "$0.stop" ]; do sleep 0.02; done' \
        "$WORK/$v" >"$WORK/$v.out" 2>&1 &
    BG_PIDS+=("$!")
    LAST_PID=$!
}
elected() { [ -s "$WORK/$1.env" ]; }
# The candidate writing to FILE has begun its campaign (-v says so).
campaigning() { grep -q "campaigning as" "$1" 2>/dev/null; }
token_of() { sed -n 's/^CERBERUS_FENCING_TOKEN=//p' "$WORK/$1.env"; }

# 1. Nobody leads.
cerb leader "$NAME"
expect_rc 75 "leader: nobody leads yet (75)"
case $OUT in *"no leader"*) ok "leader says no leader" ;; *) not_ok "leader says no leader" "$OUT" ;; esac

# 2. Elected at once: CMD's environment and status.
cerb elect -n --value solo "$NAME" -- sh -c 'echo "$CERBERUS_ELECTION_NAME|$CERBERUS_LEADER_VALUE|$CERBERUS_FENCING_TOKEN"; exit 7'
expect_rc 7 "elect -n: elected, CMD's status passed on"
case $OUT in "$NAME|solo|"[1-9]*) ok "CMD sees the election's name, value and token" ;;
*) not_ok "CMD sees the election's name, value and token" "$OUT" ;; esac

# 3. A leader in the background, then the others.
bg_elect a
A_PID=$LAST_PID
if wait_for 20 elected a; then ok "a background candidate is elected"; else not_ok "a background candidate is elected" "$(cat "$WORK/a.out")"; fi
cerb leader "$NAME"
expect_rc 0 "leader: somebody leads (0)"
case $OUT in *'leader "a"'*) ok "leader prints the leader's value" ;; *) not_ok "leader prints the leader's value" "$OUT" ;; esac
cerb leader -q "$NAME"
if [ "$RC" -eq 0 ] && [ "$OUT" = a ]; then ok "leader -q prints the value alone"; else not_ok "leader -q prints the value alone" "$RC $OUT"; fi
cerb elect -n "$NAME" -- true
expect_rc 75 "elect -n while another leads: 75"
t0=$(now_ms)
cerb elect -w 300 "$NAME" -- true
t1=$(now_ms)
expect_rc 75 "elect -w 300 while another leads: 75"
if [ $((t1 - t0)) -ge 280 ]; then ok "elect -w waited its 300 ms"; else not_ok "elect -w waited its 300 ms" "$((t1 - t0)) ms"; fi

# A campaign ended by TERM.
setsid timeout -k 5 60 "$CERBERUS" -c "$CFG" elect -v "$NAME" -- true >"$WORK/term.out" 2>&1 &
TERM_PID=$!
BG_PIDS+=("$TERM_PID")
wait_for 20 campaigning "$WORK/term.out"
kill -TERM -- -"$TERM_PID" 2>/dev/null
wait "$TERM_PID"
RC=$?
OUT=$(cat "$WORK/term.out")
# timeout(1) passes the signal on and reports the child's status (75), or
# 124/143 if the child did not end: both would be wrong.
expect_rc 75 "a TERM during the campaign ends it (75)"

# 4. A waiter is elected when the leader's CMD ends, with a greater token.
bg_elect b
B_PID=$LAST_PID
wait_for 20 campaigning "$WORK/b.out"
if elected b; then not_ok "b waits while a leads"; else ok "b waits while a leads"; fi
touch "$WORK/a.stop"
if wait_for 20 elected b; then ok "b is elected when a's CMD ends"; else not_ok "b is elected when a's CMD ends" "$(cat "$WORK/b.out")"; fi
ta=$(token_of a) tb=$(token_of b)
if [ -n "$ta" ] && [ -n "$tb" ] && [ "$tb" -gt "$ta" ]; then ok "b's token ($tb) is greater than a's ($ta)"; else not_ok "b's token is greater than a's" "a=$ta b=$tb"; fi
wait "$A_PID" 2>/dev/null
RC=$?
expect_rc 0 "a exits with its CMD's status"

# 5. A leader whose cerberus is killed is followed within its lease.
bg_elect c
C_PID=$LAST_PID
wait_for 20 campaigning "$WORK/c.out"
t0=$(now_ms)
kill -KILL -- -"$B_PID" 2>/dev/null # b's cerberus and CMD, no resign
if wait_for 20 elected c; then
    t1=$(now_ms)
    ok "c is elected after b's cerberus was killed ($((t1 - t0)) ms)"
else
    not_ok "c is elected after b's cerberus was killed" "$(cat "$WORK/c.out")"
fi
tc=$(token_of c)
if [ -n "$tc" ] && [ -n "$tb" ] && [ "$tc" -gt "$tb" ]; then ok "c's token is greater than b's"; else not_ok "c's token is greater than b's" "b=$tb c=$tc"; fi
touch "$WORK/c.stop"
wait "$C_PID" 2>/dev/null

# 6. Usage errors.
cerb elect "$NAME"
expect_rc 64 "elect without CMD: 64"
cerb elect -n -w 5 "$NAME" -- true
expect_rc 64 "elect -n -w: 64"
cerb leader --layout nope "$NAME"
expect_rc 64 "leader --layout nope: 64"

echo "1..$N"
exit $FAILED
