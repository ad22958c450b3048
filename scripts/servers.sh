#!/usr/bin/env bash
#
# servers.sh — start, stop and inspect the real servers the tests run against.
#
#   scripts/servers.sh start|stop|status redis [--nodes N] [--port P]
#
# Every server listens on 127.0.0.1 only, keeps its data in a fresh temporary
# directory (mktemp -d) and persists nothing. What this script started is
# recorded in a state directory, one set of files per node:
#
#   $CERB_STATE_DIR/redis-<port>.pid   PID of the server process
#   $CERB_STATE_DIR/redis-<port>.dir   path of its temporary data directory
#   $CERB_STATE_DIR/redis-<port>.log   its log (kept after stop, for post-mortems)
#
# CERB_STATE_DIR defaults to /tmp/cerberus-servers-$UID; the ctest fixtures
# point it into the build directory so two build trees never share state.
#
# Algorithm. `start` is idempotent: a node whose PID file names a live process
# that is ours and answers PING on its port is left alone (and continued if a
# test left it SIGSTOPped); a PID file naming a dead or foreign process is
# stale and cleaned up; otherwise the server is started detached (setsid, no
# inherited stdio, so a ctest fixture does not wait on it), and we poll PING
# with a deadline, failing early when the process dies. Readiness also checks
# that the server answering on the port reports our PID (INFO server), so a
# foreign server squatting on the port is an error rather than a silent
# success. `stop` signals exactly the recorded PIDs — never a process by name
# — waits for them to exit with a deadline (SIGKILL after it), then removes the
# data directory and the PID file.
#
# Engines are functions named <engine>_<command>; zk and etcd (DESIGN.md §9:
# ZooKeeper client 22181, etcd 22379) are to be added the same way.
#
# Environment: CERB_STATE_DIR (see above); CERB_REDIS_PORT (default base port
# when --port is not given, 26379); CERB_SERVER_WAIT_S (readiness deadline,
# default 10); REDIS_SERVER / REDIS_CLI (binaries, default from PATH);
# CERB_REDIS_UNMARKED=1 (a new redis is not prepared with `cerberus init`; a
# restart after a server died never is, see redis_start_one); CERBERUS_BIN
# (the `cerberus` command that prepares a new server; default the build
# tree's, $CERB_BUILD_DIR/cli/cerberus or <repo>/build*/cli/cerberus, then
# one on PATH).

set -euo pipefail

PROG=${0##*/}
STATE_DIR=${CERB_STATE_DIR:-/tmp/cerberus-servers-${UID:-$(id -u)}}
WAIT_S=${CERB_SERVER_WAIT_S:-10}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_CLI=${REDIS_CLI:-redis-cli}

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    cat <<EOF
usage: $PROG start|stop|status ENGINE [--nodes N] [--port P]

ENGINE     redis, or one defined in scripts/servers.d/ (zk, etcd, pg, mysql, sentinel, cluster)
--nodes N  number of nodes; node i listens on base port + i (default 1)
--port P   base port (redis default: \$CERB_REDIS_PORT or 26379)

stop and status without --nodes/--port act on every node recorded in
the state directory (${STATE_DIR}).
EOF
}

# --------------------------------------------------------------- helpers

# cerberus_bin: the `cerberus` command (see CERBERUS_BIN above), or false.
cerberus_bin() {
    local b
    for b in "${CERBERUS_BIN:-}" "${CERB_BUILD_DIR:+$CERB_BUILD_DIR/cli/cerberus}" \
        "$HERE"/../build-ci/cli/cerberus "$HERE"/../build/cli/cerberus; do
        [[ -n $b && -x $b ]] && { printf '%s' "$b"; return 0; }
    done
    command -v cerberus
}

# cerberus_init WHAT CONFIG-TEXT: prepare a server started here empty with
# `cerberus init` on a configuration naming it (the same code a user runs,
# so the markers are what the engine expects). Without the command the
# server is left unprepared: its first client warns and waits one lease.
cerberus_init() {
    local what=$1 text=$2 bin cfg out
    if ! bin=$(cerberus_bin); then
        say "$what: no cerberus command to prepare it (CERBERUS_BIN); its first client waits a lease"
        return 0
    fi
    cfg=$(mktemp "${TMPDIR:-/tmp}/cerberus-init.XXXXXX.cfg")
    printf '%s\n' "$text" >"$cfg"
    if ! out=$(timeout 60 "$bin" -c "$cfg" init 2>&1 </dev/null 9>&-); then
        rm -f -- "$cfg"
        die "$what: cerberus init failed: $out"
    fi
    rm -f -- "$cfg"
    say "$what: $out"
}

# now_ms: monotonic-enough milliseconds for deadlines (bash's SECONDS is too
# coarse; date +%s%N is wall clock, but it only bounds a short poll loop).
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }

# proc_state PID: the one-letter state from /proc (R, S, T, Z, ...) or empty
# when there is no such process.
proc_state() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    # The command name is in parentheses and may contain spaces: the state is
    # the first field after the last ')'.
    stat=${stat##*) }
    printf '%s' "${stat%% *}"
}

# pid_alive PID: true when PID exists and is not a zombie. Zombies count as
# dead: PID 1 in a container may never reap the servers we detached.
pid_alive() {
    local s
    s=$(proc_state "$1")
    [[ -n $s && $s != Z && $s != X ]]
}

# pid_cmdline PID: the process's argv joined by spaces.
pid_cmdline() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true; }

# read_pid FILE: the PID recorded in FILE, or empty if absent or malformed.
read_pid() {
    local p=""
    if [[ -f $1 ]]; then read -r p <"$1" 2>/dev/null || true; fi
    if [[ $p =~ ^[0-9]+$ ]]; then printf '%s' "$p"; fi
}

# wait_exit PID SECONDS: poll until PID is gone; false at the deadline.
wait_exit() {
    local pid=$1 deadline=$(($(now_ms) + $2 * 1000))
    while pid_alive "$pid"; do
        (($(now_ms) < deadline)) || return 1
        sleep 0.05
    done
}

# kill_pid PID WHAT: stop exactly this process. SIGCONT first, because a
# test may have left it SIGSTOPped and a stopped process never acts on
# SIGTERM; SIGKILL when it has not exited by the deadline.
kill_pid() {
    local pid=$1 what=$2
    pid_alive "$pid" || return 0
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" "$WAIT_S"; then
        say "$what (pid $pid) ignored SIGTERM for ${WAIT_S}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_exit "$pid" 5 || die "$what (pid $pid) did not exit after SIGKILL"
    fi
}

# remove_data_dir FILE: remove the temp dir whose path FILE records, but
# only if it looks like one we made (guards rm -rf against a corrupt file).
remove_data_dir() {
    local f=$1 d=""
    [[ -f $f ]] || return 0
    read -r d <"$f" || true
    case $d in
        /*/cerberus-*.*) if [[ -d $d ]]; then rm -rf -- "$d"; fi ;;
        "") ;;
        *) say "not removing unexpected data dir '$d' named in $f" ;;
    esac
    rm -f -- "$f"
}

# lock_state: serialise concurrent invocations on one state dir.
lock_state() {
    mkdir -p -- "$STATE_DIR"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$STATE_DIR/.lock"
        flock -w 60 9 || die "could not lock $STATE_DIR/.lock within 60s"
    fi
}

# ----------------------------------------------------------------- redis

redis_default_port() { printf '%s' "${CERB_REDIS_PORT:-26379}"; }

# redis_cli PORT ARGS...: redis-cli bounded by a timeout, because a
# SIGSTOPped server accepts the connection and then never answers.
redis_cli() {
    local port=$1
    shift
    timeout 2 "$REDIS_CLI" -h 127.0.0.1 -p "$port" "$@" 2>/dev/null
}

# redis_is_ours PID PORT: PID is a redis-server started for PORT.
redis_is_ours() {
    local cmd
    cmd=$(pid_cmdline "$1")
    # Before redis sets its process title the argv is ours ("--port P");
    # after, it reads "redis-server 127.0.0.1:P".
    [[ $cmd == *redis-server* && ($cmd == *":$2"* || $cmd == *"--port $2 "*) ]]
}

# redis_answer PORT PID: true when the server on PORT answers PING and
# reports PID as its process id.
redis_answer() {
    local port=$1 pid=$2 reply info
    reply=$(redis_cli "$port" PING) || return 1
    [[ $reply == PONG ]] || return 1
    info=$(redis_cli "$port" INFO server) || return 1
    [[ $info == *"process_id:$pid"* ]]
}

redis_start_one() {
    local port=$1
    local pidf="$STATE_DIR/redis-$port.pid" dirf="$STATE_DIR/redis-$port.dir"
    local logf="$STATE_DIR/redis-$port.log"
    local pid data deadline restart=0

    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid" && redis_is_ours "$pid" "$port"; then
        if [[ $(proc_state "$pid") == T ]]; then
            say "redis :$port (pid $pid) was stopped (SIGSTOP); continuing it"
            kill -CONT "$pid" 2>/dev/null || true
        fi
        deadline=$(($(now_ms) + WAIT_S * 1000))
        until redis_answer "$port" "$pid"; do
            (($(now_ms) < deadline)) ||
                die "redis :$port (pid $pid) is running but does not answer; stop it first"
            sleep 0.05
        done
        say "redis :$port already running (pid $pid)"
        return 0
    fi
    if [[ -n $pid || -f $pidf || -f $dirf ]]; then
        say "redis :$port: removing stale state (pid ${pid:-none})"
        restart=1
        rm -f -- "$pidf"
        remove_data_dir "$dirf"
    fi

    if redis_cli "$port" PING >/dev/null; then
        die "port $port already has a server that is not ours (state dir $STATE_DIR)"
    fi

    data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-redis-$port.XXXXXX")
    printf '%s\n' "$data" >"$dirf"

    # No persistence (save "", no AOF); loopback only; DEBUG allowed from
    # loopback so tests can make the server slow on purpose (DEBUG SLEEP).
    # setsid and redirected stdio detach it from the caller's session and
    # pipes: ctest waits for a fixture's output pipe to close. 9>&- keeps
    # the state-dir lock out of the server, or it would hold it forever.
    setsid "$REDIS_SERVER" \
        --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --dir "$data" --save "" --appendonly no \
        --daemonize no --logfile "" --loglevel notice \
        --enable-debug-command local ${REDIS_EXTRA_ARGS[@]+"${REDIS_EXTRA_ARGS[@]}"} \
        </dev/null >"$logf" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidf"

    deadline=$(($(now_ms) + WAIT_S * 1000))
    until redis_answer "$port" "$pid"; do
        if ! pid_alive "$pid"; then
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "redis :$port exited during startup (log: $logf)"
        fi
        if (($(now_ms) >= deadline)); then
            kill_pid "$pid" "redis :$port"
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "redis :$port did not answer PING within ${WAIT_S}s (log: $logf)"
        fi
        sleep 0.05
    done
    # A server started here on a clean port is new and empty: nothing can be
    # held on it, so prepare it for Cerberus with `cerberus init`. Without
    # that the first client would take it for one restarted without its data
    # and grant nothing for one lease (engine_redis/redis_marker.h). The
    # marker's id differs per start, so clients of an earlier server on this
    # port see their marker gone. A start after a server died here (stale
    # state: kill -9, a crash) is a restart without persistence, and left
    # unprepared, as is every start with CERB_REDIS_UNMARKED=1.
    # A replica (servers.d/sentinel.sh) gets the marker from its master.
    if ((restart == 0)) && [[ ${CERB_REDIS_UNMARKED:-0} != 1 && ${REDIS_NO_MARKER:-0} != 1 ]]; then
        cerberus_init "redis :$port" "engines = (\"redis\");
redis = { host = \"127.0.0.1\"; port = $port; };"
    fi
    say "redis :$port started (pid $pid, data $data)"
}

redis_stop_one() {
    local port=$1
    local pidf="$STATE_DIR/redis-$port.pid" dirf="$STATE_DIR/redis-$port.dir"
    local pid
    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid"; then
        if redis_is_ours "$pid" "$port"; then
            kill_pid "$pid" "redis :$port"
            say "redis :$port stopped (pid $pid)"
        else
            # The PID was reused by something else: not ours to kill.
            say "redis :$port: pid $pid is no longer our server; not signalling it"
        fi
    elif [[ -n $pid ]]; then
        say "redis :$port was not running (stale pid $pid)"
    else
        say "redis :$port is not running"
    fi
    rm -f -- "$pidf"
    remove_data_dir "$dirf"
}

redis_status_one() {
    local port=$1 pid st
    pid=$(read_pid "$STATE_DIR/redis-$port.pid")
    if [[ -z $pid ]]; then
        say "redis :$port not running"
        return 1
    fi
    if ! pid_alive "$pid" || ! redis_is_ours "$pid" "$port"; then
        say "redis :$port stale (pid $pid gone)"
        return 1
    fi
    st=$(proc_state "$pid")
    if [[ $st == T ]]; then
        say "redis :$port paused (pid $pid, SIGSTOPped)"
        return 1
    fi
    if redis_answer "$port" "$pid"; then
        say "redis :$port running (pid $pid)"
    else
        say "redis :$port not answering (pid $pid)"
        return 1
    fi
}

# engine_ports NAME DEFAULT STEP: the client ports to act on — explicit
# (--port/--nodes: DEFAULT or --port, then every STEP-th port for each
# node), else for stop/status every NAME node recorded in the state dir,
# else the default.
engine_ports() {
    local name=$1 def=$2 step=$3 base n i f p
    if [[ -n $OPT_PORT || -n $OPT_NODES || $CMD == start ]]; then
        base=${OPT_PORT:-$def}
        n=${OPT_NODES:-1}
        for ((i = 0; i < n; i++)); do printf '%s\n' $((base + step * i)); done
        return 0
    fi
    for f in "$STATE_DIR/$name"-*.pid "$STATE_DIR/$name"-*.dir; do
        [[ -e $f ]] || continue
        p=${f##*/"$name"-}
        p=${p%.*}
        if [[ $p =~ ^[0-9]+$ ]]; then printf '%s\n' "$p"; fi
    done | sort -un
}

redis_ports() { engine_ports redis "$(redis_default_port)" 1; }

redis_start() {
    command -v "$REDIS_SERVER" >/dev/null ||
        die "$REDIS_SERVER not found (Debian package redis-server)"
    command -v "$REDIS_CLI" >/dev/null ||
        die "$REDIS_CLI not found (Debian package redis-tools)"
    local p
    for p in $(redis_ports); do redis_start_one "$p"; done
}

redis_stop() {
    local p any=0
    for p in $(redis_ports); do
        redis_stop_one "$p"
        any=1
    done
    ((any)) || say "no redis recorded in $STATE_DIR"
}

redis_status() {
    local p rc=0 any=0
    for p in $(redis_ports); do
        redis_status_one "$p" || rc=1
        any=1
    done
    if ((!any)); then
        say "no redis recorded in $STATE_DIR"
        rc=1
    fi
    return $rc
}

# ------------------------------------------------------------------ main

CMD=${1:-}
ENGINE=${2:-}
case $CMD in
    start | stop | status) ;;
    -h | --help | help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac
[[ -n $ENGINE ]] || { usage >&2; exit 2; }
shift 2

OPT_NODES=""
OPT_PORT=""
while (($#)); do
    case $1 in
        --nodes) OPT_NODES=${2:-}; shift 2 || die "--nodes needs a value" ;;
        --nodes=*) OPT_NODES=${1#*=}; shift ;;
        --port) OPT_PORT=${2:-}; shift 2 || die "--port needs a value" ;;
        --port=*) OPT_PORT=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ -z $OPT_NODES || $OPT_NODES =~ ^[1-9][0-9]*$ ]] || die "bad --nodes '$OPT_NODES'"
[[ -z $OPT_PORT || ($OPT_PORT =~ ^[1-9][0-9]*$ && $OPT_PORT -lt 65536) ]] ||
    die "bad --port '$OPT_PORT'"

# Other engines live in scripts/servers.d/<engine>.sh, sourced here so they
# share the helpers above (pid_alive, kill_pid, wait_exit, lock_state, ...)
# and define <engine>_start, <engine>_stop and <engine>_status.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case $ENGINE in
    redis) ;;
    *)
        [[ $ENGINE =~ ^[a-z0-9_]+$ && -f $HERE/servers.d/$ENGINE.sh ]] ||
            die "unknown engine '$ENGINE' (known: redis $(cd "$HERE/servers.d" && ls -- *.sh 2>/dev/null | sed 's/\.sh$//' | tr '\n' ' '))"
        # shellcheck source=/dev/null
        . "$HERE/servers.d/$ENGINE.sh"
        ;;
esac

lock_state
"${ENGINE}_${CMD}"
