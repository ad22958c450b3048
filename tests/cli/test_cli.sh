#!/usr/bin/env bash
# test_cli.sh — the `cerberus` command end to end against a real server of
# one engine: redis (ctest fixture `redis`, port $CERB_REDIS_PORT), zk
# (fixture `zk`, $CERB_ZK_PORT) or etcd (fixture `etcd`, $CERB_ETCD_PORT).
#
# Usage: test_cli.sh PATH/TO/cerberus [redis|zk|etcd]   (default redis)
#
# What runs for every engine: `run` (CMD's status, 75 when held, -n and -w,
# five concurrent `run -n` run the job once, concurrent runs never overlap,
# the release when CMD is killed, signals forwarded, a TERM abandoning a
# wait), `holders` (the holder with its fence equal to the low 48 bits of
# the holder's CERBERUS_FENCING_TOKEN, two waiters in queue order, then each
# waiter holding in turn; an unreachable or silent server; names the engine
# refuses) and `status --json`. Per engine: zk digest auth with a chroot in
# zk.hosts; etcd over https with a private CA and a client certificate (a
# private server, stopped by PID). What does not depend on the engine runs
# in the redis variant only: --help and usage, `check` on a set of broken
# files (file:line and 78 each), the configuration lookup order (-c,
# $CERBERUS_CONFIG, ./cerberus.cfg, /etc/cerberus/cerberus.cfg in a private
# mount namespace when we may make one, else the local engine), `switch`
# editing the file, and a lost lock (76). The zk variant, given
# $CERB_REDIS_PORT as well, runs `switch` against running clients with
# engines ("redis", "zk").
#
# Every command runs under timeout(1), so a hang fails the test instead of
# the suite; waits are on a condition with a deadline (wait_for), never a
# bare sleep. Lock names carry the PID and a random part, so the suite can
# share the server with the cmocka suites running in parallel. Processes
# started here are stopped by PID at exit. Output is TAP-like: one
# "ok"/"not ok" line per check, and the exit status is 1 if any failed.

set -u

CERBERUS=${1:?usage: test_cli.sh PATH/TO/cerberus [redis|zk|etcd]}
ENGINE=${2:-redis}
PY=${CERB_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
REDIS_CLI=$(command -v redis-cli || true)
T=30 # default bound of one command, seconds

case "$ENGINE" in
redis) PORT=${CERB_REDIS_PORT:-26379} ;;
zk) PORT=${CERB_ZK_PORT:-22181} ;;
etcd) PORT=${CERB_ETCD_PORT:-22379} ;;
*)
    echo "test_cli.sh: unknown engine '$ENGINE' (redis, zk or etcd)" >&2
    exit 2
    ;;
esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerb-cli-test.XXXXXX")
BG_PIDS=()
FAILED=0
N=0

cleanup() {
    local p
    [ -n "${TLS_STARTED:-}" ] && tls_servers stop
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

# check DESCRIPTION CMD... — ok when CMD succeeds.
check() {
    local d=$1
    shift
    if "$@"; then ok "$d"; else not_ok "$d" "output: ${OUT:-}"; fi
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

# cerb_split ARGS... — the same with stdout in OUT and stderr in ERR.
cerb_split() {
    OUT=$(timeout -k 5 "$T" "$CERBERUS" "$@" 2>"$WORK/stderr")
    RC=$?
    ERR=$(cat "$WORK/stderr")
}

# expect_rc RC DESCRIPTION — check the last cerb's status.
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

uniq_name() { echo "cli-$ENGINE-$1-$$-$RANDOM$RANDOM"; }

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

# A shell loop for CMD: create FILE, then wait until GO exists.
hold_until() { echo "touch '$1'; while [ ! -e '$2' ]; do sleep 0.02; done"; }

# The engine's settings group, for the engine's port; $1 overrides the port.
# engine_group [PORT [NS]] — this engine's group; with NS, under a namespace
# of that name (a redis prefix, a zk root whose parent is its own, an etcd
# prefix). Sections whose files are switched (epoch >= 2) use one: the
# closure records a switch writes are one per namespace and would refuse
# every other file at epoch 1 on the shared server (core/closure.c).
engine_group() {
    local port=${1:-$PORT} ns=${2:-}
    case "$ENGINE" in
    redis) printf 'redis = {\n  host = "127.0.0.1";\n  port = %s;%s\n};\n' "$port" \
        "${ns:+ prefix = \"$ns:\";}" ;;
    zk) printf 'zk = { hosts = "127.0.0.1:%s"; root = "%s"; connect_timeout_ms = 5000; };\n' \
        "$port" "${ns:+/$ns}/cerberus-cli-test" ;;
    etcd) printf 'etcd = { endpoints = ("http://127.0.0.1:%s"); prefix = "%s%s"; };\n' "$port" \
        "$ETCD_PREFIX" "${ns:+$ns-}" ;;
    esac
}
# etcd: a prefix of this run's own, whose fence offset (the number the
# engine adds to create revisions, engine_etcd/etcd_fence.c) is not 0, so
# that `holders` must report the fence, not the create revision.
ETCD_PREFIX="cli-$$-"
if [ "$ENGINE" = etcd ]; then
    ETCDCTL_API=3 timeout 20 etcdctl --endpoints="http://127.0.0.1:$PORT" \
        put "${ETCD_PREFIX}__cerberus_fence__" 1000000 >/dev/null
fi

# What `holders` prints for this engine (extended regexes). HOLDER_RE has
# the owner in \1 and the fence in \2; ID_RE matches one owner.
case "$ENGINE" in
redis)
    ID_RE='[0-9a-f]{32}'
    HOLDER_RE="^redis: held by ($ID_RE), [0-9]+ ms left, fence ([0-9]+)\$"
    ;;
zk)
    ID_RE='_c_[0-9a-f-]{36}-lock-[0-9]{10}'
    HOLDER_RE="^zk: held by ($ID_RE) \\(session 0x[0-9a-f]+\\), fence ([0-9]+)\$"
    ;;
etcd)
    ID_RE='[0-9a-f]+'
    HOLDER_RE="^etcd: held by ($ID_RE), [0-9]+ s left \\(TTL [0-9]+ s\\), fence ([0-9]+)\$"
    ;;
esac
FENCE_MASK=$(((1 << 48) - 1))

CFG=$WORK/cerberus.cfg
# cfg_text [NS] — the test configuration, its engine under NS when given.
cfg_text() {
    cat <<EOF
# Test configuration for test_cli.sh.
engines = ("$ENGINE", "local");   # failover order
active = "auto";                # pinned by ops: keep this comment
epoch = 1;

/* A block comment mentioning active = "zk"; must stay untouched. */
lock = { lease_ms = 3000; };
$(engine_group "$PORT" "${1:-}")
# active = "local";  (a comment, after the groups)
EOF
}
cfg_text >"$CFG"

# holders_of NAME — run holders on NAME; sets OUT, RC, and HOLDER, FENCE
# and WAITERS (owners in queue order, space-separated) for this engine.
holders_of() {
    OUT=$(timeout 20 "$CERBERUS" -c "$CFG" holders "$1" 2>&1)
    RC=$?
    local line
    line=$(printf '%s\n' "$OUT" | grep -E "$HOLDER_RE")
    HOLDER=$(printf '%s' "$line" | sed -E "s/$HOLDER_RE/\\1/")
    FENCE=$(printf '%s' "$line" | sed -E "s/$HOLDER_RE/\\2/")
    line=$(printf '%s\n' "$OUT" | grep "^$ENGINE: waiting: " | sed "s/^$ENGINE: waiting: //")
    WAITERS=$(printf '%s' "$line" | grep -oE "$ID_RE" | tr '\n' ' ' | sed 's/ $//')
}
waiters_are() { # NAME COUNT: exactly COUNT waiters and a holder
    holders_of "$1"
    local n=0
    [ -n "$WAITERS" ] && n=$(echo "$WAITERS" | wc -w)
    [ -n "$HOLDER" ] && [ "$n" -eq "$2" ]
}
is_free() { holders_of "$1" && printf '%s\n' "$OUT" | grep -qx "$ENGINE: free"; }

if [ "$ENGINE" = redis ]; then
# ------------------------------------------------------------------ help
for c in run status switch check holders; do
    cerb "$c" --help
    if [ "$RC" -eq 0 ] && printf '%s' "$OUT" | grep -q "^Usage: cerberus .*$c" &&
        printf '%s' "$OUT" | grep -q "^Exit status"; then
        ok "$c --help: usage and exit statuses"
    else
        not_ok "$c --help" "rc $RC" "$OUT"
    fi
    help_text=$OUT
    cerb help "$c"
    if [ "$RC" -eq 0 ] && [ "$OUT" = "$help_text" ]; then
        ok "cerberus help $c = $c --help"
    else
        not_ok "cerberus help $c = $c --help" "rc $RC" "$OUT"
    fi
    cerb -c "$WORK/none.cfg" "$c" -h
    if [ "$RC" -eq 0 ] && [ "$OUT" = "$help_text" ]; then
        ok "$c -h needs no configuration"
    else
        not_ok "$c -h needs no configuration" "rc $RC" "$OUT"
    fi
done
cerb --help
expect_rc 0 "cerberus --help"
for c in run status switch check holders help; do
    if ! printf '%s\n' "$OUT" | grep -Eq "^  $c( |\$)"; then
        not_ok "cerberus --help lists $c" "$OUT"
    fi
done
expect_out '^Exit status' "cerberus --help: exit statuses"
expect_out 'CERBERUS_CONFIG' "cerberus --help: configuration lookup"
cerb help
expect_rc 0 "cerberus help"
cerb help nosuch
expect_rc 64 "cerberus help with an unknown command: 64"
cerb --help
main_help=$OUT
cerb help help
if [ "$RC" -eq 0 ] && [ "$OUT" = "$main_help" ]; then
    ok "cerberus help help = cerberus --help"
else
    not_ok "cerberus help help = cerberus --help" "rc $RC" "$OUT"
fi
cerb -V
expect_out '^cerberus [0-9]+\.[0-9]+\.[0-9]+$' "cerberus -V"
cerb
expect_rc 64 "no command: usage, 64"
cerb frobnicate
expect_rc 64 "unknown command: 64"
cerb --frob check
expect_rc 64 "unknown global option: 64"
cerb -c
expect_rc 64 "-c without FILE: 64"
cerb -c "$CFG" run
expect_rc 64 "run without NAME: 64"
cerb -c "$CFG" run x
expect_rc 64 "run without CMD: 64"
cerb -c "$CFG" run -n -w 10 x -- true
expect_rc 64 "run -n -w together: 64"
cerb -c "$CFG" run -w soon x -- true
expect_rc 64 "run -w with a bad number: 64"
cerb -c "$CFG" run --on-lost maybe x -- true
expect_rc 64 "run --on-lost with a bad value: 64"
cerb -c "$CFG" run "$(printf 'a\tb')" -- true
expect_rc 64 "run with a control character in NAME: 64"
cerb -c "$CFG" holders
expect_rc 64 "holders without NAME: 64"
cerb -c "$CFG" holders a b
expect_rc 64 "holders with two names: 64"
cerb -c "$CFG" status --frob
expect_rc 64 "status with an unknown option: 64"
cerb -c "$CFG" switch a b
expect_rc 64 "switch with two engines: 64"
cerb -c "$CFG" status --json --prometheus
expect_rc 64 "status --json --prometheus: 64"

# status --prometheus: parsed by Prometheus' own parser (python3-prometheus-client).
cerb_split -c "$CFG" status --prometheus
CHECK="$(dirname "$0")/../metrics/check_metrics.py"
if [ "$RC" -eq 0 ] && printf '%s' "$OUT" > "$WORK/prom.txt" &&
    "$PY" "$CHECK" "$WORK/prom.txt" 'cerberus_up=1' 'cerberus_holds=0' \
        'cerberus_engine_switches_total=0' >/dev/null; then
    ok "status --prometheus: the text format, parsed"
else
    not_ok "status --prometheus: the text format, parsed" "rc $RC" "output: $OUT"
fi

# ----------------------------------------------------------------- check
cerb -c "$CFG" check
expect_rc 0 "check: a valid file exits 0"
expect_out "^$CFG: ok\$" "check: prints FILE: ok"

# check warns on stderr, exit status unchanged, when a file that holds a
# password is readable by group or others (as ssh does for keys); not when
# it is private, nor for a readable file without one.
S=$WORK/secret
mkdir -p "$S"
printf 'engines = ("redis");\nredis = { password = "pw"; };\n' >"$S/redis.cfg"
printf 'engines = ("redis");\nredis = { mode = "sentinel"; sentinels = ("127.0.0.1:1"); master_name = "m"; sentinel_password = "pw"; };\n' >"$S/sentinel.cfg"
printf 'engines = ("zk");\nzk = { user = "u"; password = "pw"; };\n' >"$S/zk.cfg"
printf 'engines = ("etcd");\netcd = { user = "u"; password = "pw"; };\n' >"$S/etcd.cfg"
printf 'engines = ("etcd");\netcd = { endpoints = ("http://u:pw@127.0.0.1:1"); };\n' >"$S/etcd_url.cfg"
for f in redis sentinel zk etcd etcd_url; do
    for mode in 644 640 604; do
        chmod "$mode" "$S/$f.cfg"
        cerb_split check "$S/$f.cfg"
        if [ "$RC" -eq 0 ] && printf '%s\n' "$ERR" | grep -q "^cerberus: warning: $S/$f.cfg holds a password .*readable by" &&
            ! printf '%s\n' "$ERR" | grep -q 'pw'; then
            ok "check: $f.cfg with mode $mode -> 0 and a warning"
        else
            not_ok "check: $f.cfg with mode $mode -> 0 and a warning" "rc $RC" "$OUT" "stderr: $ERR"
        fi
    done
    chmod 600 "$S/$f.cfg"
    cerb_split check "$S/$f.cfg"
    if [ "$RC" -eq 0 ] && [ -z "$ERR" ]; then
        ok "check: $f.cfg with mode 600 -> 0, no warning"
    else
        not_ok "check: $f.cfg with mode 600 -> 0, no warning" "rc $RC" "stderr: $ERR"
    fi
done
chmod 644 "$CFG"
cerb_split check "$CFG"
if [ "$RC" -eq 0 ] && [ -z "$ERR" ]; then
    ok "check: a readable file without a password -> no warning"
else
    not_ok "check: a readable file without a password -> no warning" "rc $RC" "stderr: $ERR"
fi

B=$WORK/broken
mkdir -p "$B"
printf 'engines = ("redis");\nepoch = "x";\n' >"$B/type.cfg"
printf 'engines = ("redis");\nredis = { prot = 1; };\n' >"$B/unknown_key.cfg"
printf 'engines = ("redis");\nbogus = 1;\n' >"$B/unknown_top.cfg"
printf '# comment\nengines = ("redsi");\n' >"$B/unknown_engine.cfg"
printf 'engines = ("redis");\nlock = {\n  lease_ms = 5;\n};\n' >"$B/range.cfg"
printf 'engines = ("redis");\nlock = { lease_ms = -5; };\n' >"$B/negative.cfg"
printf 'engines = ("redis");\nredis = {\n  port = 70000;\n};\n' >"$B/port.cfg"
printf 'engines = ("redis");\n\nredis = { port = 1\n' >"$B/syntax.cfg"
printf 'engines = ("redis");\nactive = "auto;\n' >"$B/unterminated.cfg"
printf 'engines = ("redis");\nactive = "local";\n' >"$B/active.cfg"
printf 'engines = ("redis");\nredis = 5;\n' >"$B/group.cfg"
printf 'engines = ("redis");\nretry = {\n  backoff_ms = 100;\n  backoff_max_ms = 50;\n};\n' >"$B/cross.cfg"
printf 'engines = ("redis");\nlock = { renew = "yes"; };\n' >"$B/bool.cfg"
printf 'engines = ("redis");\nepoch = 1.5;\n' >"$B/float.cfg"
printf 'engines = ();\n' >"$B/no_engines.cfg"
printf 'engines = ("redis", "local", "redis");\n' >"$B/twice.cfg"
printf 'engines = ("redis");\nfailover = { failback = "sometimes"; };\n' >"$B/enum.cfg"
printf 'engines = ("zk");\nzk = { root = "locks"; };\n' >"$B/zk_root.cfg"
printf 'engines = ("etcd");\netcd = {\n  endpoints = ("ftp://127.0.0.1:1");\n};\n' >"$B/etcd_url.cfg"
check_broken() { # FILE LINE REGEX
    cerb check "$B/$1"
    if [ "$RC" -eq 78 ] && printf '%s\n' "$OUT" | grep -Eq "^$B/$1:$2: .*$3"; then
        ok "check: $1 -> 78, $1:$2"
    else
        not_ok "check: $1 -> 78, $1:$2" "rc $RC" "$OUT"
    fi
}
check_broken type.cfg 2 'epoch: expected an integer'
check_broken unknown_key.cfg 2 'unknown key "redis.prot"'
check_broken unknown_top.cfg 2 'unknown key "bogus"'
check_broken unknown_engine.cfg 2 'unknown engine "redsi"'
check_broken range.cfg 3 'lock.lease_ms: 5 is out of range'
check_broken negative.cfg 2 'lock.lease_ms: -5 is out of range'
check_broken port.cfg 3 'redis.port: 70000 is out of range'
check_broken syntax.cfg 4 'syntax error'
check_broken unterminated.cfg 3 'syntax error'
check_broken active.cfg 2 'not listed in engines'
check_broken group.cfg 2 'expected a group'
check_broken cross.cfg 4 'backoff_max_ms'
check_broken bool.cfg 2 'lock.renew: expected true or false'
check_broken float.cfg 2 'epoch: expected an integer'
check_broken no_engines.cfg 1 'engines: expected 1\.\.8 entries, got 0'
check_broken twice.cfg 1 'engine "redis" is listed twice'
check_broken enum.cfg 2 'failover.failback: expected one of'
check_broken zk_root.cfg 2 'zk.root: "locks" must be an absolute path'
check_broken etcd_url.cfg 3 'must start with http:// or https://'
cerb -c "$B/unknown_key.cfg" check
expect_rc 78 "check: the -c file is checked"
cerb check "$CFG" "$B/type.cfg" "$B/port.cfg"
if [ "$RC" -eq 78 ] && printf '%s\n' "$OUT" | grep -q "^$CFG: ok" &&
    printf '%s\n' "$OUT" | grep -q "^$B/type.cfg:2: " &&
    printf '%s\n' "$OUT" | grep -q "^$B/port.cfg:3: "; then
    ok "check: several files: every broken one named, the good one ok, 78"
else
    not_ok "check: several files" "rc $RC" "$OUT"
fi
cerb check "$B/missing.cfg"
expect_rc 78 "check: a missing file -> 78"
expect_out "$B/missing.cfg" "check: a missing file is named"

# ------------------------------------------------------------ config lookup
# -c, then $CERBERUS_CONFIG (set and not empty), then ./cerberus.cfg, then
# /etc/cerberus/cerberus.cfg, then the defaults (engine "local").
mkdir -p "$WORK/cwd" "$WORK/nofile"
cp "$CFG" "$WORK/cwd/cerberus.cfg"
in_dir() { # DIR ENV-VALUE ARGS... — run cerberus in DIR with $CERBERUS_CONFIG
    local d=$1 env=$2
    shift 2
    OUT=$(cd "$d" && CERBERUS_CONFIG=$env timeout 20 "$CERBERUS" "$@" 2>&1)
    RC=$?
}
in_dir "$WORK/cwd" "" check
expect_out '^cerberus\.cfg: ok$' "lookup: ./cerberus.cfg (with \$CERBERUS_CONFIG empty)"
in_dir "$WORK/cwd" "$B/type.cfg" check
expect_rc 78 "lookup: \$CERBERUS_CONFIG before ./cerberus.cfg"
in_dir "$WORK/cwd" "$B/type.cfg" -c "$CFG" check
expect_rc 0 "lookup: -c before \$CERBERUS_CONFIG"
in_dir "$WORK/cwd" "" -c "$B/type.cfg" check
expect_rc 78 "lookup: -c before ./cerberus.cfg"
in_dir "$WORK/cwd" "" --config="$CFG" status --json
expect_rc 0 "lookup: --config=FILE"
in_dir "$WORK/nofile" "$WORK/nofile/typo.cfg" check
expect_rc 78 "lookup: a \$CERBERUS_CONFIG that does not exist is an error, not skipped"
if [ -e /etc/cerberus/cerberus.cfg ]; then
    ok "lookup: defaults without any file # SKIP /etc/cerberus/cerberus.cfg exists"
else
    in_dir "$WORK/nofile" "" check
    expect_out '^\(defaults\): ok$' "lookup: no file anywhere: the defaults"
    in_dir "$WORK/nofile" "" status --json
    if [ "$RC" -eq 0 ] && printf '%s' "$OUT" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
assert d["current"] == "local", d
assert [e["name"] for e in d["engines"]] == ["local"], d
'; then
        ok "lookup: no file anywhere: the local engine"
    else
        not_ok "lookup: no file anywhere: the local engine" "rc $RC" "$OUT"
    fi
    in_dir "$WORK/nofile" "" run "$(uniq_name deflocal)" -- sh -c 'echo "t=$CERBERUS_FENCING_TOKEN"'
    expect_out '^t=[1-9][0-9]*$' "lookup: no file anywhere: run holds a local lock"
fi
# /etc/cerberus/cerberus.cfg, in a private mount namespace with an overlay
# on /etc, so that nothing outside this test ever sees the file.
ETC_SCRIPT=$WORK/etc.sh
cat >"$ETC_SCRIPT" <<EOF
set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir=$WORK/etc-up,workdir=$WORK/etc-work /etc
mkdir -p /etc/cerberus
cp "$CFG" /etc/cerberus/cerberus.cfg
cd "$WORK/nofile"
echo "== etc"; CERBERUS_CONFIG= "$CERBERUS" check 2>&1 || true
cd "$WORK/cwd"
echo "== cwd"; CERBERUS_CONFIG= "$CERBERUS" check 2>&1 || true
echo "== env"; CERBERUS_CONFIG="$B/type.cfg" "$CERBERUS" check 2>&1 || true
EOF
mkdir -p "$WORK/etc-up" "$WORK/etc-work"
ETC_OUT=
for u in "unshare -m" "unshare -rm"; do
    ETC_OUT=$(timeout 60 $u bash "$ETC_SCRIPT" 2>/dev/null) && break
    ETC_OUT=
done
if [ -z "$ETC_OUT" ]; then
    ok "lookup: /etc/cerberus/cerberus.cfg # SKIP cannot make a mount namespace with an overlay on /etc"
else
    if printf '%s\n' "$ETC_OUT" | grep -A1 '^== etc' | grep -qx '/etc/cerberus/cerberus.cfg: ok' &&
        printf '%s\n' "$ETC_OUT" | grep -A1 '^== cwd' | grep -qx 'cerberus.cfg: ok' &&
        printf '%s\n' "$ETC_OUT" | grep -A1 '^== env' | grep -q "^$B/type.cfg:2: "; then
        ok "lookup: /etc/cerberus/cerberus.cfg last, after ./cerberus.cfg and \$CERBERUS_CONFIG"
    else
        not_ok "lookup: /etc/cerberus/cerberus.cfg" "$ETC_OUT"
    fi
fi

# ---------------------------------------------------------------- switch
SW=$WORK/switch.cfg
cfg_text "cli-sw-$$" >"$SW"
cp "$SW" "$WORK/switch.orig"
chmod 640 "$SW"
cerb -c "$SW" switch
expect_out '^auto$' "switch without ENGINE prints the active setting"
cerb -c "$SW" switch local
expect_rc 0 "switch local exits 0"
expect_out 'active "auto" -> "local", epoch 1 -> 2' "switch reports the change"
expect_out "^  $ENGINE: closed from epoch 2" "switch writes the closure record on the engine left"
expect_out '^  local: open from epoch 2' "and the open one on the engine switched to"
want_active=$(grep '^active = ' "$CFG" | sed 's/"auto"/"local"/')
if grep -qxF "$want_active" "$SW" && grep -q '^epoch = 2;$' "$SW"; then
    ok "switch rewrote active and bumped epoch in place"
else
    not_ok "switch rewrote active and bumped epoch in place" "$(cat "$SW")"
fi
if diff <(grep -v '^active = \|^epoch = ' "$WORK/switch.orig") <(grep -v '^active = \|^epoch = ' "$SW") >/dev/null; then
    ok "switch kept every other line, comments included"
else
    not_ok "switch kept every other line" "$(diff "$WORK/switch.orig" "$SW")"
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
OUT=$(cd "$WORK/nofile" && CERBERUS_CONFIG= timeout 10 "$CERBERUS" switch local 2>&1)
RC=$?
if [ -e /etc/cerberus/cerberus.cfg ]; then
    ok "switch without a file # SKIP /etc/cerberus/cerberus.cfg exists"
else
    expect_rc 78 "switch without any config file -> 78"
fi
fi # redis only

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
check "holders: free after these runs" is_free "$L"

# -n while another `cerberus run` holds the name; holders sees the holder
# with the fence of the holder's token.
L=$(uniq_name busy)
bg holder -c "$CFG" run "$L" -- sh -c "echo \$CERBERUS_FENCING_TOKEN > '$WORK/holder.tok'; $(hold_until "$WORK/busy.held" "$WORK/busy.go")"
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
holders_of "$L"
expect_rc 0 "holders exits 0"
if [ -n "$HOLDER" ] && [ "$FENCE" = $(($(cat "$WORK/holder.tok") & FENCE_MASK)) ]; then
    ok "holders shows the $ENGINE holder, fence = low 48 bits of its token ($FENCE)"
else
    not_ok "holders shows the $ENGINE holder with its fence" "token $(cat "$WORK/holder.tok")" "$OUT"
fi
expect_out '^local: in-process, not visible from here$' "holders: local is not visible"
H0=$HOLDER
# A TERM while waiting abandons the wait with 75 (timeout(1) forwards it),
# and the abandoned waiter leaves the queue.
OUT=$(timeout -s TERM --preserve-status 2 "$CERBERUS" -c "$CFG" run "$L" -- echo must-not-run 2>&1)
RC=$?
expect_rc 75 "SIGTERM while waiting -> 75, CMD not run"
if wait_for 20 waiters_are "$L" 0; then
    ok "the abandoned waiter left the queue"
else
    not_ok "the abandoned waiter left the queue" "$OUT"
fi
# Two waiters: holders lists them in queue order, and each holds in turn
# (CMD runs holders itself while it holds).
w_cmd() { # TAG: CMD of a waiter that records holders and its token
    echo "'$CERBERUS' -c '$CFG' holders '$L' > '$WORK/$1.holders' 2>&1; echo \$CERBERUS_FENCING_TOKEN > '$WORK/$1.tok'; $(hold_until "$WORK/$1.held" "$WORK/$1.go")"
}
bg w1 -c "$CFG" run "$L" -- sh -c "$(w_cmd w1)"
if wait_for 20 waiters_are "$L" 1; then ok "holders shows the first waiter"; else not_ok "holders shows the first waiter" "$OUT"; fi
X1=$WAITERS
bg w2 -c "$CFG" run "$L" -- sh -c "$(w_cmd w2)"
if wait_for 20 waiters_are "$L" 2; then ok "holders shows the second waiter"; else not_ok "holders shows the second waiter" "$OUT"; fi
set -- $WAITERS
X2=${2:-}
if [ "${1:-}" = "$X1" ] && [ -n "$X2" ] && [ "$X2" != "$X1" ] && [ "$HOLDER" = "$H0" ]; then
    ok "holders: the holder, then the waiters in arrival order"
else
    not_ok "holders: the holder, then the waiters in arrival order" "first waiter was $X1" "$OUT"
fi
touch "$WORK/busy.go"
if wait_for 30 bg_done holder && [ "$(bg_rc holder)" = 0 ]; then ok "holder exited 0"; else not_ok "holder exited 0" "$(cat "$WORK/holder.out")"; fi
if wait_for 30 test -e "$WORK/w1.held" && OUT=$(cat "$WORK/w1.holders") &&
    printf '%s\n' "$OUT" | grep -Eq "^$ENGINE: held by $X1[ ,]" &&
    printf '%s\n' "$OUT" | grep -Eq "^$ENGINE: waiting: $X2( |\$)"; then
    ok "the first waiter holds next, the second still waits (holders from its CMD)"
else
    not_ok "the first waiter holds next" "$OUT" "$(cat "$WORK/w1.out")"
fi
if [ "$(cat "$WORK/w1.tok")" -gt "$(cat "$WORK/holder.tok")" ]; then
    ok "the next holder's fencing token is larger"
else
    not_ok "the next holder's fencing token is larger" "$(cat "$WORK/holder.tok") then $(cat "$WORK/w1.tok")"
fi
touch "$WORK/w2.go" "$WORK/w1.go"
if wait_for 30 test -e "$WORK/w2.held" && OUT=$(cat "$WORK/w2.holders") &&
    printf '%s\n' "$OUT" | grep -Eq "^$ENGINE: held by $X2[ ,]" &&
    ! printf '%s\n' "$OUT" | grep -q "^$ENGINE: waiting"; then
    ok "then the second waiter holds, nobody waits"
else
    not_ok "then the second waiter holds" "$OUT" "$(cat "$WORK/w2.out")"
fi
if wait_for 30 bg_done w1 && wait_for 30 bg_done w2 && [ "$(bg_rc w1)" = 0 ] && [ "$(bg_rc w2)" = 0 ]; then
    ok "both waiters exited 0"
else
    not_ok "both waiters exited 0" "$(cat "$WORK/w1.out" "$WORK/w2.out")"
fi
check "holders: free after release" is_free "$L"

# Names the engine refuses are a usage error for holders.
if [ "$ENGINE" != redis ]; then
    cerb -c "$CFG" holders "a/b"
    expect_rc 64 "holders: a name with '/' on $ENGINE -> 64"
    expect_out "^$ENGINE: not a valid lock name here\$" "holders: says the name is not valid on $ENGINE"
fi

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
check "holders: held while CMD runs" wait_for 10 waiters_are "$L" 0
kill -KILL "$(cat "$WORK/killed.cmdpid")"
if wait_for 20 bg_done killed && [ "$(bg_rc killed)" = 137 ]; then
    ok "run exits 137 when CMD is killed by SIGKILL"
else
    not_ok "run exits 137 when CMD is killed" "$(bg_rc killed 2>/dev/null)" "$(cat "$WORK/killed.out")"
fi
check "the lock is free after CMD was killed" is_free "$L"
cerb -c "$CFG" run -n "$L" -- true
expect_rc 0 "run -n gets the lock of a killed CMD at once"

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
check "the lock is free after a forwarded SIGTERM" is_free "$L"

# A lost lock: the key is deleted behind the holder's back.
if [ "$ENGINE" != redis ]; then
    :
elif [ -n "$REDIS_CLI" ]; then
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
    bg losti -c "$CFG" run --lease 300 --on-lost ignore "$L" -- sh -c "$(hold_until "$WORK/losti.held" "$WORK/losti.go"); exit 4"
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
expect_out "^\\* $ENGINE +closed" "status marks the active engine"
cerb_split -c "$CFG" status --json
expect_rc 0 "status --json exits 0"
if printf '%s' "$OUT" | "$PY" -m json.tool >/dev/null 2>&1 &&
    printf '%s' "$OUT" | ENGINE=$ENGINE "$PY" -c '
import json, os, sys
e = os.environ["ENGINE"]
d = json.load(sys.stdin)
names = [x["name"] for x in d["engines"]]
assert names == [e, "local"], names
assert d["current"] == e and d["epoch"] == 1, d
assert d["engines"][0]["active"] is True
assert all(k in d["engines"][0] for k in ("breaker", "last_probe_us", "acquires",
    "failures", "lost", "acquire_calls", "wakeups", "handoffs"))
'; then
    ok "status --json is valid JSON with the engines (stdout alone)"
else
    not_ok "status --json is valid JSON" "$OUT" "stderr: $ERR"
fi

# ------------------------------------------------------- unreachable servers
# A closed port, and a port that accepts connections and never answers:
# holders says "unreachable" within its configured bounds, exit 69.
DEAD=$WORK/dead.cfg
{
    echo "engines = (\"$ENGINE\");"
    case "$ENGINE" in
    redis) echo 'redis = { port = 1; connect_timeout_ms = 300; op_timeout_ms = 300; };' ;;
    zk) echo 'zk = { hosts = "127.0.0.1:1"; connect_timeout_ms = 500; };' ;;
    etcd) echo 'etcd = { endpoints = ("http://127.0.0.1:1"); connect_timeout_ms = 300; op_timeout_ms = 300; };' ;;
    esac
} >"$DEAD"
cerb_split -c "$DEAD" holders x
if [ "$RC" -eq 69 ] && [ "$OUT" = "$ENGINE: unreachable" ] &&
    printf '%s\n' "$ERR" | grep -q "^cerberus: $ENGINE: unreachable: "; then
    ok "holders with $ENGINE down -> 69, \"$ENGINE: unreachable\" and why"
else
    not_ok "holders with $ENGINE down" "rc $RC" "$OUT" "stderr: $ERR"
fi
# The password of an endpoint written with credentials is shown nowhere:
# not by holders, not by status, whose errors name the endpoint.
if [ "$ENGINE" = etcd ]; then
    printf 'engines = ("etcd");\netcd = { endpoints = ("http://root:Pw-%s@127.0.0.1:1"); connect_timeout_ms = 300; op_timeout_ms = 300; };\n' "$$" >"$WORK/secret-ep.cfg"
    chmod 600 "$WORK/secret-ep.cfg"
    for c in "holders x" "status" "status --json" "run x -- true"; do
        cerb_split -c "$WORK/secret-ep.cfg" $c
        if [ "$RC" -eq 69 ] && ! printf '%s\n%s\n' "$OUT" "$ERR" | grep -q "Pw-$$" &&
            printf '%s\n' "$ERR" | grep -q 'http://root:\*\*\*@127.0.0.1:1'; then
            ok "$c with credentials in the endpoint: 69, the password redacted"
        else
            not_ok "$c with credentials in the endpoint: 69, the password redacted" "rc $RC" "$OUT" "stderr: $ERR"
        fi
    done
fi
cerb_split -c "$DEAD" status --json
if [ "$RC" -eq 69 ] && printf '%s' "$OUT" | "$PY" -m json.tool >/dev/null 2>&1; then
    ok "status with no engine reachable -> 69, still JSON"
else
    not_ok "status with no engine reachable" "rc $RC" "$OUT"
fi
cerb -c "$DEAD" run x -- true
expect_rc 69 "run with no engine reachable -> 69"
"$PY" -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
time.sleep(120)
' >"$WORK/silent.port" &
SILENT_PID=$!
BG_PIDS+=("$SILENT_PID")
if wait_for 10 test -s "$WORK/silent.port"; then
    SILENT=$WORK/silent.cfg
    {
        echo "engines = (\"$ENGINE\");"
        case "$ENGINE" in
        redis) echo "redis = { port = $(cat "$WORK/silent.port"); connect_timeout_ms = 300; op_timeout_ms = 300; };" ;;
        zk) echo "zk = { hosts = \"127.0.0.1:$(cat "$WORK/silent.port")\"; connect_timeout_ms = 500; };" ;;
        etcd) echo "etcd = { endpoints = (\"http://127.0.0.1:$(cat "$WORK/silent.port")\"); connect_timeout_ms = 300; op_timeout_ms = 300; };" ;;
        esac
    } >"$SILENT"
    t0=$(now_ms)
    cerb_split -c "$SILENT" holders x
    t1=$(now_ms)
    if [ "$RC" -eq 69 ] && [ "$OUT" = "$ENGINE: unreachable" ] && [ $((t1 - t0)) -lt 8000 ]; then
        ok "holders with a silent $ENGINE -> 69 in $((t1 - t0)) ms"
    else
        not_ok "holders with a silent $ENGINE" "rc $RC after $((t1 - t0)) ms" "$OUT" "stderr: $ERR"
    fi
else
    not_ok "a silent server for the test" "$(cat "$WORK/silent.port")"
fi
kill "$SILENT_PID" 2>/dev/null
if [ "$ENGINE" = redis ]; then
    cerb -c "$B/type.cfg" run x -- true
    expect_rc 78 "run with a broken config -> 78"
    cerb -c "$B/type.cfg" holders x
    expect_rc 78 "holders with a broken config -> 78"
    cerb -c "$B/type.cfg" status
    expect_rc 78 "status with a broken config -> 78"
fi

# ------------------------------------------- engine connection settings
# holders reads with the engine's own connection settings: on zk digest
# auth and a chroot in zk.hosts (a holder whose root includes the chroot
# path is seen through a config that chroots instead); on etcd https with a
# private CA and a client certificate.
if [ "$ENGINE" = zk ]; then
    CH=cli-chroot-$$-$RANDOM
    printf 'engines = ("zk");\nzk = { hosts = "127.0.0.1:%s"; root = "/%s/locks"; user = "cli"; password = "s3cret"; };\n' \
        "$PORT" "$CH" >"$WORK/zk-plain.cfg"
    printf 'engines = ("zk");\nzk = { hosts = "127.0.0.1:%s/%s"; root = "/locks"; user = "cli"; password = "s3cret"; };\n' \
        "$PORT" "$CH" >"$WORK/zk-chroot.cfg"
    L=$(uniq_name auth)
    bg zkauth -c "$WORK/zk-plain.cfg" run "$L" -- sh -c "echo \$CERBERUS_FENCING_TOKEN > '$WORK/zkauth.tok'; $(hold_until "$WORK/zkauth.held" "$WORK/zkauth.go")"
    wait_for 20 test -e "$WORK/zkauth.held"
    OUT=$(timeout 20 "$CERBERUS" -c "$WORK/zk-chroot.cfg" holders "$L" 2>&1)
    RC=$?
    fence=$(printf '%s\n' "$OUT" | sed -nE "s/$HOLDER_RE/\\2/p")
    if [ "$RC" -eq 0 ] && [ -n "$fence" ] && [ "$fence" = $(($(cat "$WORK/zkauth.tok") & FENCE_MASK)) ]; then
        ok "holders on zk with digest auth, through a chroot in zk.hosts"
    else
        not_ok "holders on zk with digest auth and a chroot" "rc $RC" "$OUT"
    fi
    touch "$WORK/zkauth.go"
    wait_for 20 bg_done zkauth
fi
SERVERS_SH=$(cd "$(dirname "$0")/../.." && pwd)/scripts/servers.sh
if [ "$ENGINE" = etcd ]; then
    TLS_PORT=$((PORT + 70))
    TLS_DIR=$WORK/tls
    mkdir -p "$TLS_DIR" "$WORK/state"
    tls_servers() {
        CERB_STATE_DIR=$WORK/state CERB_ETCD_TLS_DIR=$TLS_DIR timeout 120 \
            bash "$SERVERS_SH" "$1" etcd --port "$TLS_PORT" >"$WORK/tls-$1.log" 2>&1
    }
    TLS_STARTED=1
    if ! command -v openssl >/dev/null || ! tls_servers start; then
        ok "holders over https # SKIP no private https etcd: $(tail -1 "$WORK/tls-start.log" 2>/dev/null)"
    else
        TLS_CFG=$WORK/tls.cfg
        printf 'engines = ("etcd");\netcd = { endpoints = ("https://127.0.0.1:%s"); ca_file = "%s/ca.crt"; cert_file = "%s/client.crt"; key_file = "%s/client.key"; };\n' \
            "$TLS_PORT" "$TLS_DIR" "$TLS_DIR" "$TLS_DIR" >"$TLS_CFG"
        L=$(uniq_name tls)
        bg tls -c "$TLS_CFG" run "$L" -- sh -c "echo \$CERBERUS_FENCING_TOKEN > '$WORK/tls.tok'; $(hold_until "$WORK/tls.held" "$WORK/tls.go")"
        wait_for 20 test -e "$WORK/tls.held"
        OUT=$(timeout 20 "$CERBERUS" -c "$TLS_CFG" holders "$L" 2>&1)
        RC=$?
        fence=$(printf '%s\n' "$OUT" | sed -nE "s/$HOLDER_RE/\\2/p")
        if [ "$RC" -eq 0 ] && [ -n "$fence" ] && [ "$fence" = $(($(cat "$WORK/tls.tok") & FENCE_MASK)) ]; then
            ok "holders on etcd over https with a client certificate"
        else
            not_ok "holders on etcd over https" "rc $RC" "$OUT" "$(cat "$WORK/tls.out")"
        fi
        sed "s|$TLS_DIR/ca.crt|$TLS_DIR/other-ca.crt|" "$TLS_CFG" >"$WORK/tls-wrong-ca.cfg"
        cerb_split -c "$WORK/tls-wrong-ca.cfg" holders "$L"
        if [ "$RC" -eq 69 ] && printf '%s\n' "$ERR" | grep -q '^cerberus: etcd: .*https://127.0.0.1'; then
            ok "holders on etcd with the wrong CA -> 69 and why"
        else
            not_ok "holders on etcd with the wrong CA" "rc $RC" "$OUT" "stderr: $ERR"
        fi
        touch "$WORK/tls.go"
        wait_for 20 bg_done tls
    fi
    tls_servers stop
    TLS_STARTED=
fi

# ------------------------------------------ switch with running clients
# engines ("redis", "zk"), active pinned to redis: a holder and a waiter run
# on redis, then `cerberus switch zk`. Both running clients reload the file;
# the holder keeps its lock on redis, renewed, and exits 0 (held locks are
# not migrated); the waiter runs after it with a larger token in the new
# epoch; new acquisitions go to zk; and while the old engine still holds the
# name, the new one must not grant it (DESIGN.md §5, safe switch).
if [ "$ENGINE" = zk ] && [ -n "${CERB_REDIS_PORT:-}" ]; then
    SWR=$WORK/switch-running.cfg
    # A namespace of its own (see engine_group), its redis marker written
    # as scripts/servers.sh writes the default one (no first-grant wait).
    SWR_NS=cli-swr-$$
    replid=$(timeout 10 "$REDIS_CLI" -p "$CERB_REDIS_PORT" INFO replication 2>/dev/null |
        tr -d '\r' | sed -n 's/^master_replid://p')
    [ -n "$replid" ] && timeout 10 "$REDIS_CLI" -p "$CERB_REDIS_PORT" \
        SET "$SWR_NS:"$'\x1f'cerberus "cli-$$ 0 $replid" >/dev/null
    cat >"$SWR" <<EOF
engines = ("redis", "zk");
active = "redis";
epoch = 1;
lock = { lease_ms = 1000; };
# Probes (and closure record readings) often enough for a 1 s lease: with
# the default 250 ms a record would not be trusted and the gate would claim.
failover = { probe_interval_ms = 100; probe_timeout_ms = 100; };
redis = { port = $CERB_REDIS_PORT; prefix = "$SWR_NS:"; };
$(engine_group "$PORT" "$SWR_NS")
EOF
    L=$(uniq_name switch)
    swr_holders() { OUT=$(timeout 20 "$CERBERUS" -c "$SWR" holders "$L" 2>&1); }
    bg swa -v -c "$SWR" run "$L" -- sh -c "echo \$CERBERUS_FENCING_TOKEN > '$WORK/swa.tok'; $(hold_until "$WORK/swa.held" "$WORK/swa.go")"
    wait_for 20 test -e "$WORK/swa.held"
    bg sww -v -c "$SWR" run "$L" -- sh -c "'$CERBERUS' -c '$SWR' holders '$L' > '$WORK/sww.holders' 2>&1; echo \$CERBERUS_FENCING_TOKEN > '$WORK/sww.tok'"
    # The waiter waits at the gate (zk answers "held": the holder's claim),
    # not in redis' queue.
    redis_waiting() { swr_holders && printf '%s\n' "$OUT" | grep -q '^redis: held by '; }
    # active = redis pins the client, so zk is gated: the holder also takes
    # the name on zk (its claim), so that no process granting there misses it.
    if wait_for 20 redis_waiting && printf '%s\n' "$OUT" | grep -q '^zk: held by '; then
        ok "switch: before, the holder and the waiter are on redis"
    else
        not_ok "switch: before, the holder and the waiter are on redis" "$OUT"
    fi
    A_OWNER=$(printf '%s\n' "$OUT" | sed -nE 's/^redis: held by ([0-9a-f]{32}),.*/\1/p')
    cerb -c "$SWR" switch zk
    expect_rc 0 "switch: cerberus switch zk"
    t_switch=$(now_ms)
    if wait_for 20 grep -q 'configuration reloaded' "$WORK/swa.out" &&
        wait_for 20 grep -q 'configuration reloaded' "$WORK/sww.out"; then
        ok "switch: the running holder and waiter reloaded the file"
    else
        not_ok "switch: the running clients reloaded the file" "$(cat "$WORK/swa.out" "$WORK/sww.out")"
    fi
    # The holder's lock stays on redis and is renewed past its lease.
    still_held() {
        swr_holders
        printf '%s\n' "$OUT" | grep -q "^redis: held by $A_OWNER, " || return 2
        [ "$(now_ms)" -ge $((t_switch + 2500)) ]
    }
    wait_for 20 still_held
    if [ $? -eq 0 ] && ! bg_done swa; then
        ok "switch: the holder keeps its redis lock, renewed past 2 leases"
    else
        not_ok "switch: the holder keeps its redis lock" "$OUT" "$(cat "$WORK/swa.out")"
    fi
    # A new process after the switch, while redis still holds the name.
    refused() {
        cerb -c "$SWR" run -n "$L" -- echo must-not-run
        [ "$RC" -eq 75 ]
    }
    check "switch: a new client on zk is refused while redis still holds the name" refused
    touch "$WORK/swa.go"
    if wait_for 30 bg_done swa && [ "$(bg_rc swa)" = 0 ]; then
        ok "switch: the holder exits 0 (its lock was not lost)"
    else
        not_ok "switch: the holder exits 0" "$(cat "$WORK/swa.out")"
    fi
    if wait_for 30 bg_done sww && [ "$(bg_rc sww)" = 0 ] &&
        [ "$(cat "$WORK/sww.tok")" -gt "$(cat "$WORK/swa.tok")" ] &&
        [ $(($(cat "$WORK/sww.tok") >> 48)) -ge 2 ]; then
        ok "switch: the waiter runs next, with a larger token in the new epoch"
    else
        not_ok "switch: the waiter runs next" "tokens $(cat "$WORK/swa.tok" "$WORK/sww.tok" 2>/dev/null)" "$(cat "$WORK/sww.out")"
    fi
    cerb -c "$SWR" run "$L" -- sh -c "'$CERBERUS' -c '$SWR' holders '$L'; echo \"t=\$CERBERUS_FENCING_TOKEN\""
    # Granted on zk. Redis, closed by the switch's record (which refuses
    # every process still on the old file), needs no claim.
    if [ "$RC" -eq 0 ] && printf '%s\n' "$OUT" | grep -q '^redis: free$' &&
        printf '%s\n' "$OUT" | grep -Eq "$HOLDER_RE" &&
        [ $(($(printf '%s\n' "$OUT" | sed -n 's/^t=//p') >> 48)) -ge 2 ]; then
        ok "switch: a new acquisition is on zk, in the new epoch"
    else
        not_ok "switch: a new acquisition is on zk" "rc $RC" "$OUT"
    fi
    swr_holders
    if printf '%s\n' "$OUT" | grep -qx 'redis: free' && printf '%s\n' "$OUT" | grep -qx 'zk: free'; then
        ok "switch: nothing left behind on either engine"
    else
        not_ok "switch: nothing left behind" "$OUT"
    fi
fi

echo "1..$N"
exit $FAILED
