# shellcheck shell=bash
#
# servers.d/pg.sh — real PostgreSQL servers (Debian postgresql-15) for the
# tests, sourced by scripts/servers.sh, which provides the helpers (say, die,
# pid_alive, proc_state, pid_cmdline, kill_pid, wait_exit, read_pid,
# remove_data_dir, now_ms, engine_ports) and the options ($OPT_PORT,
# $OPT_NODES, $CMD, $STATE_DIR, $WAIT_S).
#
#   scripts/servers.sh start|stop|status pg [--nodes N] [--port P]
#
# Ports. Node i (0-based) listens on P + i, 127.0.0.1 only (DESIGN.md §9:
# base 25432); its unix socket is in its data directory, never /var/run.
# Node 0 is a primary. With --nodes N > 1, nodes 1..N-1 are streaming hot
# standbys of node 0, made with `pg_basebackup -R -X stream` from it; `start`
# returns once each new standby answers, says pg_is_in_recovery() = t and
# streams from the primary. Tests promote a standby themselves (SELECT
# pg_promote()): its postmaster stays the same process, so status (which
# reports "primary" or "standby" from pg_is_in_recovery()) and stop need
# nothing special, and a promoted node restarted on its data comes back a
# primary (promotion removed its standby.signal).
#
# Accounts, made once on a new primary (standbys get them by replication):
#   postgres  the bootstrap superuser (initdb -U postgres)
#   cerb      LOGIN, not a superuser, owner of database cerb
#   cerb_pw   LOGIN PASSWORD 'cerb-secret', member of nothing, CONNECT on cerb
#             and ALL on cerb's schema public
# pg_hba.conf: cerb_pw over 127.0.0.1 must give its password (scram-sha-256);
# every other role is trusted over 127.0.0.1 and the unix socket, and
# replication connections are trusted (pg_basebackup, the standbys).
#
# Settings (command line, so a restart on old data gets them too): small and
# fast for tests — max_connections=200, shared_buffers=32MB, fsync=off,
# full_page_writes=off, wal_level=replica,
# max_wal_senders=10, wal_keep_size=64MB, hot_standby=on, cluster_name
# cerb<port> (it names the processes: "postgres: cerb25432: checkpointer").
# fsync=off loses nothing when only postgres dies (kill -9): the WAL it wrote
# is in the OS page cache, and a restart replays it, so fences stay durable
# across a kill -9 or a clean restart; only an OS crash could lose data.
# synchronous_commit stays on: with it off, an acknowledged commit can still
# sit in postgres's WAL buffers, and a kill -9 would lose a grant (the engine
# sets it on in its sessions anyway).
# The server logs to stderr, which our shell appends to the .log file.
#
# State, per node, keyed by its port:
#   $STATE_DIR/pg-<port>.pid   PID of the postmaster (not of a wrapper)
#   $STATE_DIR/pg-<port>.dir   its data directory, mktemp -d
#                              ${TMPDIR:-/tmp}/cerberus-pg-<port>.XXXXXX
#   $STATE_DIR/pg-<port>.log   initdb/pg_basebackup output and the server log
#                              (kept after stop)
#
# Algorithm. `start` handles the nodes in order (a standby needs its primary
# up). A live postmaster of ours that answers is left alone (continued first
# if a test SIGSTOPped it). A node whose process is gone (a test killed it)
# but whose recorded data directory holds a cluster (PG_VERSION) is
# restarted on that data: the fences written before must survive. Before
# that we wait for the dead postmaster's orphaned children to exit (every
# postgres process has its data directory as working directory, which is
# how they are found; they exit on their own on postmaster death) and only
# then remove the lock files (postmaster.pid, and .s.PGSQL.<port>.lock next
# to the socket) whose process is gone, so postgres's own check of its old
# shared memory is never bypassed while an old backend lives.
# Anything else recorded is stale and removed, and the node is made anew on
# a fresh directory: initdb (node 0) or pg_basebackup from node 0. The server
# is started detached (setsid, no inherited stdio or lock fd). Readiness,
# with a deadline: pg_isready, then psql as postgres over TCP returning the
# server's data_directory, which must be the one postmaster.pid in our data
# directory names, and that postmaster.pid must name our recorded PID — so
# a foreign server squatting on the port is an error, not a silent success
# (a port that accepts TCP before we start is refused at once). Startup
# fails early, with the log's tail, when the process dies. `stop` signals
# exactly the recorded PID, never a process found by name: SIGCONT (a
# stopped process acts on nothing), SIGINT (postgres's fast shutdown: SIGTERM
# is its "smart" one, which waits for every client to leave), and after
# $WAIT_S kill_pid's SIGTERM then SIGKILL; standbys are stopped before the
# primary (a primary's fast shutdown waits for its walsenders). It then waits
# a little for orphaned children and removes the data directory and state.
#
# Running as root. PostgreSQL refuses to run as root, so when we are root
# initdb, pg_basebackup and postgres run as $CERB_PG_USER (default postgres,
# the system user of Debian's package) through `setpriv --reuid --regid
# --init-groups`, and the data directory is chown'ed to it. setpriv (like
# setsid in a non-interactive script) execs, so $! of the background launch
# is the postmaster's own PID; readiness checks it against postmaster.pid.
# When not root, everything runs as ourselves.
#
# Pitfalls. The server user must be able to reach the data directory: a
# TMPDIR under a root-only directory (e.g. /root/...) fails at start with a
# clear message. A unix socket path is limited to 107 bytes, so a very long
# TMPDIR breaks the socket in the data directory. Every client call is
# bounded by `timeout` (a SIGSTOPped postmaster accepts connections and never
# answers) and runs psql with -X -w (no psqlrc, never a password prompt).
# /usr/bin/psql is Debian's pg_wrapper; the binaries of $PG_BINDIR are used
# directly instead. Only a postmaster with a SIGSTOP is continued by start;
# a test that stops a backend is on its own. A postmaster killed by a test
# stays a zombie until PID 1 reaps it (a container's PID 1 may be slow, or
# never do it); postgres's kill(pid, 0) takes a lock file naming a zombie for
# a live server ("lock file ... already exists"), which is why the restart
# removes dead lock files itself (pid_alive counts zombies as dead). The
# programs run from / (the server user cannot chdir to, say, /root), and
# pg_isready is given -U postgres (without it every poll logs 'role "root"
# does not exist').
#
# Environment: CERB_PG_PORT (default base port, 25432), PG_BINDIR (the
# PostgreSQL binaries, default the newest /usr/lib/postgresql/*/bin, else
# the directory of `postgres` on PATH), CERB_PG_USER (the server user when
# root, default postgres), CERB_PG_EXTRA_ARGS (extra postgres flags,
# word-split, e.g. "-c log_statement=all"; applied whenever a node starts),
# CERB_PG_UNPREPARED=1 (a new primary is not given the lock tables by
# `cerberus init`, which otherwise runs through servers.sh's cerberus_init).

pg_default_port() { printf '%s' "${CERB_PG_PORT:-25432}"; }

# pg_bindir: $PG_BINDIR, else the newest Debian one, else from PATH.
pg_bindir() {
    local d p
    if [[ -n ${PG_BINDIR:-} ]]; then
        printf '%s' "$PG_BINDIR"
        return 0
    fi
    for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5 -rn); do
        [[ -x $d/postgres ]] && { printf '%s' "$d"; return 0; }
    done
    p=$(command -v postgres) || return 1
    p=$(readlink -f "$p")
    printf '%s' "${p%/*}"
}

PG_BIN=$(pg_bindir || true)
PG_USER=${CERB_PG_USER:-postgres}

# pg_as: the command prefix that runs a program as the server user (empty
# when we are not root), in the array PG_AS.
PG_AS=()
if (($(id -u) == 0)); then
    PG_AS=(setpriv "--reuid=$PG_USER" "--regid=$PG_USER" --init-groups)
fi

# pg_ports: the ports to act on (engine_ports in servers.sh).
pg_ports() { engine_ports pg "$(pg_default_port)" 1; }

# pg_psql_raw PORT TIMEOUT ARGS...: psql as postgres over TCP, unaligned
# and tuples only, bounded by TIMEOUT seconds, reading SQL from stdin unless
# ARGS has -c. Settings of the caller's environment that could change where
# or how it connects are dropped.
pg_psql_raw() {
    local port=$1 t=$2
    shift 2
    env -u PGSERVICE -u PGSERVICEFILE -u PGOPTIONS -u PGSSLMODE -u PGPASSWORD \
        -u PGPASSFILE -u PGTARGETSESSIONATTRS PGCONNECT_TIMEOUT=2 \
        timeout "$t" "$PG_BIN/psql" -X -w -q -At -h 127.0.0.1 -p "$port" \
        -U postgres -d postgres "$@"
}

# pg_psql PORT TIMEOUT ARGS...: pg_psql_raw, quietly and without stdin.
pg_psql() { pg_psql_raw "$@" 2>/dev/null </dev/null; }

# pg_port_busy PORT: something accepts TCP connections on 127.0.0.1:PORT.
pg_port_busy() {
    # shellcheck disable=SC2016 # expanded by the inner bash, not here
    timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# pg_is_ours PID PORT: PID is a postmaster we started for PORT (its argv is
# kept: only its children retitle themselves).
pg_is_ours() {
    local cmd
    cmd=$(pid_cmdline "$1")
    [[ $cmd == *postgres* && $cmd == *"-c port=$2 "* && $cmd == *"/cerberus-pg-$2."* ]]
}

# pg_data PORT: the recorded data directory of PORT, or empty.
pg_data() {
    local d=""
    if [[ -f $STATE_DIR/pg-$1.dir ]]; then read -r d <"$STATE_DIR/pg-$1.dir" || true; fi
    printf '%s' "$d"
}

# pg_dir_procs DATA: the PIDs of processes whose working directory is DATA
# (the postmaster and all its children chdir there).
pg_dir_procs() {
    local f
    for f in /proc/[0-9]*/cwd; do
        [[ $f -ef $1 ]] || continue
        f=${f#/proc/}
        printf '%s\n' "${f%/cwd}"
    done 2>/dev/null
}

# pg_wait_orphans DATA SECONDS: wait until no process works in DATA.
pg_wait_orphans() {
    local deadline=$(($(now_ms) + $2 * 1000))
    [[ -d $1 ]] || return 0
    while [[ -n $(pg_dir_procs "$1") ]]; do
        (($(now_ms) < deadline)) || return 1
        sleep 0.05
    done
}

# pg_answer PORT PID: the server on PORT answers a query as postgres, its
# data_directory is the one named by postmaster.pid in our recorded data
# directory, and that file names PID (our postmaster).
pg_answer() {
    local port=$1 pid=$2 data file_pid="" file_dir="" reply
    data=$(pg_data "$port")
    [[ -n $data && -f $data/postmaster.pid ]] || return 1
    { read -r file_pid && read -r file_dir; } <"$data/postmaster.pid" 2>/dev/null || return 1
    [[ $file_pid == "$pid" ]] || return 1
    timeout 2 "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -t 1 >/dev/null 2>&1 || return 1
    reply=$(pg_psql "$port" 2 -c "select current_setting('data_directory')") || return 1
    [[ -n $reply && $reply == "$file_dir" ]]
}

# pg_role PORT: "standby" or "primary" (pg_is_in_recovery()), or fails.
pg_role() {
    local r
    r=$(pg_psql "$1" 2 -c 'select pg_is_in_recovery()') || return 1
    case $r in
        t) printf standby ;;
        f) printf primary ;;
        *) return 1 ;;
    esac
}

# pg_new_dir PORT: a fresh data directory owned by the server user.
pg_new_dir() {
    local port=$1 data
    data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-pg-$port.XXXXXX") ||
        die "pg :$port: mktemp failed"
    printf '%s\n' "$data" >"$STATE_DIR/pg-$port.dir"
    if ((${#PG_AS[@]})); then
        chown "$PG_USER:" "$data" || die "pg :$port: cannot chown $data to $PG_USER"
        "${PG_AS[@]}" test -w "$data" -a -x "$data" || {
            remove_data_dir "$STATE_DIR/pg-$port.dir"
            die "pg :$port: user $PG_USER cannot reach $data (is TMPDIR=${TMPDIR:-/tmp} traversable by it?)"
        }
    fi
    printf '%s' "$data"
}

# pg_initdb PORT DATA: a new primary cluster in DATA and our pg_hba.conf.
pg_initdb() {
    local port=$1 data=$2 logf="$STATE_DIR/pg-$1.log"
    if ! (cd / && timeout 120 "${PG_AS[@]}" "$PG_BIN/initdb" -D "$data" -U postgres \
        -A trust -E UTF8 --locale=C -N --no-instructions) </dev/null >>"$logf" 2>&1 9>&-; then
        remove_data_dir "$STATE_DIR/pg-$port.dir"
        tail -n 20 "$logf" >&2 || true
        die "pg :$port: initdb failed (log: $logf)"
    fi
    # Rewritten in place: the file keeps its owner (the server user).
    cat >"$data/pg_hba.conf" <<'HBA'
# Written by scripts/servers.d/pg.sh: first match wins.
host    all             cerb_pw         127.0.0.1/32    scram-sha-256
host    all             all             127.0.0.1/32    trust
local   all             all                             trust
host    replication     all             127.0.0.1/32    trust
local   replication     all                             trust
HBA
}

# pg_basebackup_to PORT DATA PRIMARY: a standby's copy of PRIMARY's cluster
# (standby.signal and primary_conninfo written by -R).
pg_basebackup_to() {
    local port=$1 data=$2 primary=$3 logf="$STATE_DIR/pg-$1.log"
    if ! (cd / && timeout 120 "${PG_AS[@]}" "$PG_BIN/pg_basebackup" -h 127.0.0.1 \
        -p "$primary" -U postgres -D "$data" -R -X stream -c fast -w) </dev/null >>"$logf" 2>&1 9>&-; then
        remove_data_dir "$STATE_DIR/pg-$port.dir"
        tail -n 20 "$logf" >&2 || true
        die "pg :$port: pg_basebackup from :$primary failed (log: $logf)"
    fi
}

# pg_launch PORT DATA: start the postmaster on DATA, detached; record its PID.
pg_launch() {
    local port=$1 data=$2 pid
    local -a extra=()
    read -r -a extra <<<"${CERB_PG_EXTRA_ARGS:-}"
    # setsid and redirected stdio detach it (ctest waits for a fixture's
    # output pipe to close); 9>&- keeps the state lock out of it. The
    # subshell, setsid and setpriv all exec: $! is the postmaster itself.
    (cd / && exec setsid ${PG_AS[@]+"${PG_AS[@]}"} "$PG_BIN/postgres" -D "$data" \
        -c "port=$port" -c listen_addresses=127.0.0.1 \
        -c "unix_socket_directories=$data" -c "cluster_name=cerb$port" \
        -c max_connections=200 -c shared_buffers=32MB \
        -c fsync=off -c full_page_writes=off \
        -c wal_level=replica -c max_wal_senders=10 -c wal_keep_size=64MB \
        -c hot_standby=on -c logging_collector=off -c log_destination=stderr \
        -c lc_messages=C -c "log_line_prefix=%m [%p] " \
        ${extra[@]+"${extra[@]}"}) \
        </dev/null >>"$STATE_DIR/pg-$port.log" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$STATE_DIR/pg-$port.pid"
}

# pg_wait_ready PORT FRESH: poll until the node answers and is ours, or die
# (a fresh node's directory is removed then; an old one's data is kept).
pg_wait_ready() {
    local port=$1 fresh=$2 pid deadline
    local pidf="$STATE_DIR/pg-$port.pid" dirf="$STATE_DIR/pg-$port.dir"
    local logf="$STATE_DIR/pg-$port.log"
    pid=$(read_pid "$pidf")
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until pg_answer "$port" "$pid"; do
        if ! pid_alive "$pid"; then
            rm -f -- "$pidf"
            ((fresh)) && remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "pg :$port exited during startup (log: $logf)"
        fi
        if (($(now_ms) >= deadline)); then
            pg_kill "$port" "$pid"
            rm -f -- "$pidf"
            ((fresh)) && remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "pg :$port did not answer as our server within ${WAIT_S}s (pid $pid, log: $logf)"
        fi
        sleep 0.05
    done
}

# pg_wait_standby PORT: poll until the node is in recovery and its WAL
# receiver streams, or die.
pg_wait_standby() {
    local port=$1 deadline st
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until [[ $(pg_role "$port") == standby ]] &&
        st=$(pg_psql "$port" 2 -c 'select status from pg_stat_wal_receiver') &&
        [[ $st == streaming ]]; do
        (($(now_ms) < deadline)) ||
            die "pg :$port is not a streaming standby within ${WAIT_S}s (log: $STATE_DIR/pg-$port.log)"
        sleep 0.1
    done
}

# pg_accounts PORT: the roles and database of the header, idempotently.
pg_accounts() {
    local port=$1 out
    out=$(pg_psql_raw "$port" 60 -v ON_ERROR_STOP=1 2>&1 <<'SQL'
SELECT 'CREATE ROLE cerb LOGIN'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cerb') \gexec
SELECT 'CREATE DATABASE cerb OWNER cerb'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'cerb') \gexec
SELECT 'CREATE ROLE cerb_pw LOGIN'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cerb_pw') \gexec
ALTER ROLE cerb_pw PASSWORD 'cerb-secret';
GRANT CONNECT ON DATABASE cerb TO cerb_pw;
\connect cerb
GRANT ALL ON SCHEMA public TO cerb_pw;
SQL
    ) || die "pg :$port: creating the accounts failed: $out"
}

# pg_prepare_restart PORT DATA: make DATA safe to start a postmaster on
# after its own died: its orphans gone, then the lock files of a dead
# postmaster removed (postmaster.pid, and .s.PGSQL.<port>.lock beside the
# socket, which is in DATA too). postgres would take a lock file naming a
# zombie (kill(pid, 0) succeeds) for a live server and refuse to start, and
# PID 1 of a container may be slow to reap, or never reap, our detached
# servers; a lock naming a live process that works in DATA is left alone.
pg_prepare_restart() {
    local port=$1 data=$2 f old
    pg_wait_orphans "$data" "$WAIT_S" ||
        die "pg :$port: processes of the dead server still run in $data: $(pg_dir_procs "$data" | tr '\n' ' ')"
    for f in "$data/postmaster.pid" "$data"/.s.PGSQL.*.lock; do
        [[ -f $f ]] || continue
        old=""
        read -r old <"$f" 2>/dev/null || true
        if ! [[ $old =~ ^[0-9]+$ ]] || ! pid_alive "$old" || ! [[ /proc/$old/cwd -ef $data ]]; then
            rm -f -- "$f"
        fi
    done
}

# pg_kill PORT PID: stop our postmaster PID: fast shutdown, then kill_pid.
pg_kill() {
    local port=$1 pid=$2
    pid_alive "$pid" || return 0
    kill -CONT "$pid" 2>/dev/null || true
    kill -INT "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" "$WAIT_S"; then
        say "pg :$port (pid $pid) ignored SIGINT (fast shutdown) for ${WAIT_S}s"
        kill_pid "$pid" "pg :$port"
    fi
}

# pg_start_one PORT INDEX PRIMARY: node INDEX (0: the primary) on PORT.
pg_start_one() {
    local port=$1 idx=$2 primary=$3
    local pidf="$STATE_DIR/pg-$port.pid" dirf="$STATE_DIR/pg-$port.dir"
    local pid data fresh=1 role deadline

    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid" && pg_is_ours "$pid" "$port"; then
        if [[ $(proc_state "$pid") == T ]]; then
            say "pg :$port (pid $pid) was stopped (SIGSTOP); continuing it"
            kill -CONT "$pid" 2>/dev/null || true
        fi
        deadline=$(($(now_ms) + WAIT_S * 1000))
        until pg_answer "$port" "$pid"; do
            (($(now_ms) < deadline)) ||
                die "pg :$port (pid $pid) is running but does not answer; stop it first"
            sleep 0.05
        done
        say "pg :$port already running as $(pg_role "$port" || echo '?') (pid $pid)"
        return 0
    fi
    rm -f -- "$pidf"
    if pg_port_busy "$port"; then
        die "port $port already has a server that is not ours (state dir $STATE_DIR)"
    fi
    data=$(pg_data "$port")
    if [[ -n $data && -f $data/PG_VERSION ]]; then
        say "pg :$port: its server is gone (pid ${pid:-unknown}); restarting it on its data $data"
        pg_prepare_restart "$port" "$data"
        fresh=0
    else
        if [[ -n $pid || -f $dirf ]]; then
            say "pg :$port: removing stale state (pid ${pid:-none})"
        fi
        remove_data_dir "$dirf"
        data=$(pg_new_dir "$port") || exit 1
        if ((idx == 0)); then
            pg_initdb "$port" "$data"
        else
            pg_basebackup_to "$port" "$data" "$primary"
        fi
    fi
    pg_launch "$port" "$data"
    pg_wait_ready "$port" "$fresh"
    pid=$(read_pid "$pidf")
    if ((fresh && idx == 0)); then
        pg_accounts "$port"
        # The lock tables, made by the code a user runs (`cerberus init`),
        # unless a test wants a server without them.
        if [[ ${CERB_PG_UNPREPARED:-0} != 1 ]]; then
            cerberus_init "pg :$port" "engines = (\"pg\"); pg = { conninfo = \"host=127.0.0.1 port=$port dbname=cerb user=cerb\"; };"
        fi
    elif ((fresh)); then
        pg_wait_standby "$port"
    fi
    role=$(pg_role "$port" || echo '?')
    if ((fresh)); then
        say "pg :$port started as $role (pid $pid, data $data)"
    else
        say "pg :$port restarted as $role (pid $pid, data $data)"
    fi
}

pg_start() {
    [[ -n $PG_BIN && -x $PG_BIN/postgres ]] ||
        die "postgres not found (Debian package postgresql; or set PG_BINDIR)"
    local b
    for b in initdb pg_basebackup pg_isready psql; do
        [[ -x $PG_BIN/$b ]] || die "$PG_BIN/$b not found (Debian package postgresql)"
    done
    if ((${#PG_AS[@]})); then
        command -v setpriv >/dev/null || die "setpriv not found (Debian package util-linux)"
        id -u "$PG_USER" >/dev/null 2>&1 ||
            die "user $PG_USER not found: postgres refuses to run as root (set CERB_PG_USER)"
    fi
    local -a ports
    local i
    mapfile -t ports < <(pg_ports)
    for ((i = 0; i < ${#ports[@]}; i++)); do
        pg_start_one "${ports[i]}" "$i" "${ports[0]}"
    done
}

pg_stop_one() {
    local port=$1
    local pidf="$STATE_DIR/pg-$port.pid" dirf="$STATE_DIR/pg-$port.dir"
    local pid data
    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid"; then
        if pg_is_ours "$pid" "$port"; then
            pg_kill "$port" "$pid"
            say "pg :$port stopped (pid $pid)"
        else
            say "pg :$port: pid $pid is no longer our server; not signalling it"
        fi
    elif [[ -n $pid ]]; then
        say "pg :$port was not running (stale pid $pid)"
    else
        say "pg :$port is not running"
    fi
    data=$(pg_data "$port")
    if [[ -n $data ]] && ! pg_wait_orphans "$data" 5; then
        say "pg :$port: processes still working in $data: $(pg_dir_procs "$data" | tr '\n' ' ')"
    fi
    rm -f -- "$pidf"
    remove_data_dir "$dirf"
}

pg_stop() {
    local p any=0
    # Standbys (higher ports) first: a primary's fast shutdown waits for
    # its walsenders to hand the last WAL to them.
    for p in $(pg_ports | sort -rn); do
        pg_stop_one "$p"
        any=1
    done
    ((any)) || say "no pg recorded in $STATE_DIR"
}

pg_status() {
    local p pid role rc=0 any=0
    for p in $(pg_ports); do
        any=1
        pid=$(read_pid "$STATE_DIR/pg-$p.pid")
        if [[ -z $pid ]]; then
            say "pg :$p not running"
            rc=1
        elif ! pid_alive "$pid" || ! pg_is_ours "$pid" "$p"; then
            say "pg :$p stale (pid $pid gone)"
            rc=1
        elif [[ $(proc_state "$pid") == T ]]; then
            say "pg :$p paused (pid $pid, SIGSTOPped)"
            rc=1
        elif pg_answer "$p" "$pid" && role=$(pg_role "$p"); then
            say "pg :$p running as $role (pid $pid)"
        else
            say "pg :$p not answering (pid $pid)"
            rc=1
        fi
    done
    if ((!any)); then
        say "no pg recorded in $STATE_DIR"
        rc=1
    fi
    return $rc
}
