# shellcheck shell=bash
#
# servers.d/mysql.sh — a real MariaDB server (Debian mariadb-server 10.11)
# for the tests, sourced by scripts/servers.sh, which provides the helpers
# (say, die, pid_alive, proc_state, pid_cmdline, kill_pid, read_pid,
# remove_data_dir, now_ms, engine_ports) and the options ($OPT_PORT,
# $OPT_NODES, $CMD, $STATE_DIR, $WAIT_S).
#
#   scripts/servers.sh start|stop|status mysql [--nodes 1|2] [--port P]
#
# Ports. One server on P, 127.0.0.1 only (DESIGN.md §9: 23306). With
# --nodes 2, node 0 on P is a primary and node 1 on P + 1 an asynchronous
# GTID replica of it (more nodes are refused): both run with a binary log
# (log-bin, binlog-format=ROW, server-id 1 and 2), the replica read-only
# (@@read_only) with log-slave-updates, made with mariadb-install-db and
# then CHANGE MASTER TO ... MASTER_USE_GTID = slave_pos from the start of
# the primary's binary log, so it gets the accounts, the database and the
# lock tables by replication; `start` returns once its replication threads
# run and cerb.cerberus_meta has reached it. Tests promote the replica
# themselves (STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0). A
# node keeps its role across restarts (recorded in mysql-<port>.role), so a
# promoted replica restarted on its data comes back read-only. Its unix socket (mysqld.sock) and PID file
# (mariadbd.pid) are in its data directory, never /var/run. Every program
# runs with --no-defaults, so nothing of /etc/mysql or ~/.my.cnf is read.
#
# Accounts, made after the first start of a new data directory through the
# socket as the admin user (root, authenticated by unix_socket as OS root;
# when we are not root, the OS user we are, see --auth-root-socket-user):
#   cerb@127.0.0.1, cerb@localhost        no password; ALL on cerb.*
#                                         (database cerb), PROCESS (to see
#                                         the other sessions), SELECT on
#                                         performance_schema.*; not SUPER
#                                         nor CONNECTION ADMIN
#   cerb_pw@127.0.0.1, cerb_pw@localhost  IDENTIFIED BY 'cerb-secret'; ALL
#                                         on cerb.*, SELECT on
#                                         performance_schema.*
#   cerb_repl@127.0.0.1                   no password; REPLICATION SLAVE (the
#                                         replica of --nodes 2 logs in as it)
# With --skip-name-resolve, TCP from 127.0.0.1 matches the @127.0.0.1
# accounts and the unix socket the @localhost ones.
#
# Settings, small and fast for tests: innodb-buffer-pool-size=64M,
# innodb-log-file-size=16M (also given to mariadb-install-db, whose
# bootstrap would make a 96M redo log), innodb-flush-log-at-trx-commit=2 (the
# log is written to the OS at each commit and synced once a second: a kill
# -9 of mariadbd loses nothing, only an OS crash could), skip-log-bin,
# max-connections=300, skip-name-resolve, performance-schema=ON with the
# instrument wait/lock/metadata/sql/mdl on (the engine reads
# performance_schema.metadata_locks). The server logs to stderr, which our
# shell appends to the .log file.
#
# State, keyed by its port:
#   $STATE_DIR/mysql-<port>.pid   PID of mariadbd
#   $STATE_DIR/mysql-<port>.dir   its data directory, mktemp -d
#                                 ${TMPDIR:-/tmp}/cerberus-mysql-<port>.XXXXXX
#   $STATE_DIR/mysql-<port>.log   mariadb-install-db's output and the server
#                                 log (kept after stop)
#   $STATE_DIR/mysql-<port>.role  "single", "primary" or "replica"
#
# Algorithm. `start` is idempotent: a live mariadbd of ours that answers is
# left alone (continued first if a test SIGSTOPped it). A server whose
# process is gone (a test killed it) but whose recorded data directory was
# initialised (it has the mysql schema) is restarted on that data: InnoDB
# recovers what was committed, so the fences survive. Anything else recorded
# is stale and removed, and a new data directory is made with
# mariadb-install-db. The server is started detached (setsid, no inherited
# stdio or lock fd). Readiness, with a deadline: the admin user's
# `SELECT @@port` through the socket in our data directory answers our port,
# the PID file in the data directory names our recorded PID, and that PID
# itself holds the listening socket of 127.0.0.1:P (/proc/net/tcp and
# /proc/PID/fd) — so a foreign server squatting on the port is an error, not
# a silent success (a port that accepts TCP before we start is refused at
# once, except after a server of ours died: a killed mariadbd's main process
# is gone, a zombie, 10-15 ms before its threads close the listening socket,
# so start first waits, within the deadline, for the port to stop
# listening). Startup fails early, with the log's tail, when the process dies.
# `stop` signals exactly the recorded PID (kill_pid: SIGCONT, SIGTERM — a
# normal shutdown for mariadbd — SIGKILL after the deadline), never a
# process found by name, and removes the data directory and state.
#
# Running as root. mariadbd refuses to run as root unless told to: as root it
# gets --user=$CERB_MYSQL_USER (default mysql, the system user of Debian's
# package), switches to it itself (so $! is mariadbd, with no wrapper), and
# the data directory is chown'ed to it (mariadb-install-db --user too). When
# not root it runs as ourselves.
#
# Pitfalls. The server user must be able to reach the data directory: a
# TMPDIR under a root-only directory fails at start with a clear message. A
# unix socket path is limited to 107 bytes. Every client call is bounded by
# `timeout` (a SIGSTOPped server accepts connections and never answers).
# root has no password and only socket authentication: it cannot log in over
# TCP, which is why readiness uses the socket. performance_schema sizes its
# tables when the server starts; it cannot be turned on later.
#
# Environment: CERB_MYSQL_PORT (default port, 23306), MARIADBD (default
# /usr/sbin/mariadbd, else mariadbd or mysqld from PATH), MARIADB_CLIENT
# (mariadb), MARIADB_INSTALL_DB (mariadb-install-db), CERB_MYSQL_USER (the
# server user when root, default mysql), CERB_MYSQL_EXTRA_ARGS (extra
# mariadbd flags, word-split; applied whenever the server starts),
# CERB_MYSQL_UNPREPARED=1 (a new server is not given the lock tables by
# `cerberus init`, which otherwise runs through servers.sh's cerberus_init).

MARIADBD=${MARIADBD:-$(if [[ -x /usr/sbin/mariadbd ]]; then echo /usr/sbin/mariadbd;
    else command -v mariadbd || command -v mysqld || echo mariadbd; fi)}
MARIADB_CLIENT=${MARIADB_CLIENT:-mariadb}
MARIADB_INSTALL_DB=${MARIADB_INSTALL_DB:-mariadb-install-db}
MYSQL_USER=${CERB_MYSQL_USER:-mysql}

# The admin account: root through unix_socket (it maps OS root to MariaDB
# root); when we are not root, mariadb-install-db makes one named after us.
if (($(id -u) == 0)); then
    MYSQL_ADMIN=root
else
    MYSQL_ADMIN=$(id -un)
fi

mysql_default_port() { printf '%s' "${CERB_MYSQL_PORT:-23306}"; }

# mysql_ports: the ports to act on (engine_ports in servers.sh).
mysql_ports() { engine_ports mysql "$(mysql_default_port)" 1; }

# mysql_data PORT: the recorded data directory of PORT, or empty.
mysql_data() {
    local d=""
    if [[ -f $STATE_DIR/mysql-$1.dir ]]; then read -r d <"$STATE_DIR/mysql-$1.dir" || true; fi
    printf '%s' "$d"
}

# mysql_admin_raw DATA TIMEOUT ARGS...: the client as the admin user through
# the socket in DATA, batch mode without column names, bounded by TIMEOUT.
mysql_admin_raw() {
    local data=$1 t=$2
    shift 2
    timeout "$t" "$MARIADB_CLIENT" --no-defaults --connect-timeout=2 \
        --socket="$data/mysqld.sock" -u"$MYSQL_ADMIN" -N -B "$@"
}

# mysql_admin DATA TIMEOUT ARGS...: mysql_admin_raw, quietly, without stdin.
mysql_admin() { mysql_admin_raw "$@" 2>/dev/null </dev/null; }

# mysql_port_busy PORT: something accepts TCP connections on 127.0.0.1:PORT.
mysql_port_busy() {
    # shellcheck disable=SC2016 # expanded by the inner bash, not here
    timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# mysql_is_ours PID PORT: PID is a mariadbd we started for PORT.
mysql_is_ours() {
    local cmd
    cmd=$(pid_cmdline "$1")
    [[ $cmd == *--port="$2 "* && $cmd == *"/cerberus-mysql-$2."* ]]
}

# mysql_listens PID PORT: PID itself holds the listening socket of
# 127.0.0.1:PORT. /proc/net/tcp lists sockets by inode (hex address and
# port, state 0A = LISTEN); /proc/PID/fd links to socket:[inode].
mysql_listens() {
    local pid=$1 port=$2 hexport inode
    printf -v hexport '%04X' "$port"
    inode=$(awk -v a="0100007F:$hexport" '$2 == a && $4 == "0A" { print $10; exit }' \
        /proc/net/tcp 2>/dev/null)
    [[ -n $inode ]] || return 1
    find "/proc/$pid/fd" -maxdepth 1 -lname "socket:\[$inode\]" 2>/dev/null | grep -q .
}

# mysql_answer PORT PID: the server of our data directory answers on its
# socket, serves PORT, names PID in its PID file, and PID listens on PORT.
mysql_answer() {
    local port=$1 pid=$2 data file_pid="" reply
    data=$(mysql_data "$port")
    [[ -n $data && -S $data/mysqld.sock && -f $data/mariadbd.pid ]] || return 1
    read -r file_pid <"$data/mariadbd.pid" 2>/dev/null || return 1
    [[ $file_pid == "$pid" ]] || return 1
    reply=$(mysql_admin "$data" 2 -e 'SELECT @@port') || return 1
    [[ $reply == "$port" ]] || return 1
    mysql_listens "$pid" "$port"
}

# mysql_new_dir PORT: a new data directory (mariadb-install-db) owned by the
# server user; dies, cleaning up, on failure.
mysql_new_dir() {
    local port=$1 data logf="$STATE_DIR/mysql-$1.log"
    local -a as=()
    data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-mysql-$port.XXXXXX") ||
        die "mysql :$port: mktemp failed"
    printf '%s\n' "$data" >"$STATE_DIR/mysql-$port.dir"
    if (($(id -u) == 0)); then
        as=("--user=$MYSQL_USER")
        chown "$MYSQL_USER:" "$data" || die "mysql :$port: cannot chown $data to $MYSQL_USER"
        setpriv "--reuid=$MYSQL_USER" "--regid=$MYSQL_USER" --init-groups \
            test -w "$data" -a -x "$data" || {
            remove_data_dir "$STATE_DIR/mysql-$port.dir"
            die "mysql :$port: user $MYSQL_USER cannot reach $data (is TMPDIR=${TMPDIR:-/tmp} traversable by it?)"
        }
    fi
    # The bootstrap server gets the same InnoDB log size as the real one.
    if ! (cd / && timeout 120 "$MARIADB_INSTALL_DB" --no-defaults --datadir="$data" \
        ${as[@]+"${as[@]}"} --auth-root-authentication-method=socket \
        --auth-root-socket-user="$MYSQL_ADMIN" --skip-test-db --skip-name-resolve \
        --innodb-log-file-size=16M) </dev/null >>"$logf" 2>&1 9>&-; then
        remove_data_dir "$STATE_DIR/mysql-$port.dir"
        tail -n 20 "$logf" >&2 || true
        die "mysql :$port: mariadb-install-db failed (log: $logf)"
    fi
    printf '%s' "$data"
}

# mysql_role_args ROLE: the mariadbd flags of a node's role, in ROLE_ARGS.
mysql_role_args() {
    case $1 in
    primary) ROLE_ARGS=(--log-bin=mysql-bin --binlog-format=ROW --server-id=1) ;;
    replica) ROLE_ARGS=(--log-bin=mysql-bin --binlog-format=ROW --server-id=2
        --log-slave-updates --read-only=ON) ;;
    *) ROLE_ARGS=(--skip-log-bin) ;;
    esac
}

# mysql_launch PORT DATA: start mariadbd on DATA, detached; record its PID.
mysql_launch() {
    local port=$1 data=$2 pid role=single
    local -a extra=() as=() ROLE_ARGS=()
    read -r -a extra <<<"${CERB_MYSQL_EXTRA_ARGS:-}"
    if (($(id -u) == 0)); then as=("--user=$MYSQL_USER"); fi
    if [[ -f $STATE_DIR/mysql-$port.role ]]; then read -r role <"$STATE_DIR/mysql-$port.role" || true; fi
    mysql_role_args "$role"
    # setsid and redirected stdio detach it (ctest waits for a fixture's
    # output pipe to close); 9>&- keeps the state lock out of it. The
    # subshell and setsid exec: $! is mariadbd itself.
    (cd / && exec setsid "$MARIADBD" --no-defaults --datadir="$data" \
        ${as[@]+"${as[@]}"} --bind-address=127.0.0.1 --port="$port" \
        --socket="$data/mysqld.sock" --pid-file="$data/mariadbd.pid" \
        --skip-name-resolve "${ROLE_ARGS[@]}" --max-connections=300 \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=16M \
        --innodb-flush-log-at-trx-commit=2 \
        --performance-schema=ON \
        --performance-schema-instrument='wait/lock/metadata/sql/mdl=ON' \
        ${extra[@]+"${extra[@]}"}) \
        </dev/null >>"$STATE_DIR/mysql-$port.log" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$STATE_DIR/mysql-$port.pid"
}

# mysql_wait_ready PORT FRESH: poll until the server answers and is ours, or
# die (a fresh server's directory is removed then; an old one's data kept).
mysql_wait_ready() {
    local port=$1 fresh=$2 pid deadline
    local pidf="$STATE_DIR/mysql-$port.pid" dirf="$STATE_DIR/mysql-$port.dir"
    local logf="$STATE_DIR/mysql-$port.log"
    pid=$(read_pid "$pidf")
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until mysql_answer "$port" "$pid"; do
        if ! pid_alive "$pid"; then
            rm -f -- "$pidf"
            ((fresh)) && remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "mysql :$port exited during startup (log: $logf)"
        fi
        if (($(now_ms) >= deadline)); then
            kill_pid "$pid" "mysql :$port"
            rm -f -- "$pidf"
            ((fresh)) && remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "mysql :$port did not answer as our server within ${WAIT_S}s (pid $pid, log: $logf)"
        fi
        sleep 0.05
    done
}

# mysql_accounts PORT DATA: the database and accounts of the header.
mysql_accounts() {
    local port=$1 data=$2 out
    out=$(mysql_admin_raw "$data" 60 2>&1 <<'SQL'
CREATE DATABASE IF NOT EXISTS cerb;
CREATE USER IF NOT EXISTS 'cerb'@'127.0.0.1', 'cerb'@'localhost';
GRANT ALL ON cerb.* TO 'cerb'@'127.0.0.1', 'cerb'@'localhost';
GRANT PROCESS ON *.* TO 'cerb'@'127.0.0.1', 'cerb'@'localhost';
CREATE USER IF NOT EXISTS 'cerb_pw'@'127.0.0.1' IDENTIFIED BY 'cerb-secret',
    'cerb_pw'@'localhost' IDENTIFIED BY 'cerb-secret';
GRANT ALL ON cerb.* TO 'cerb_pw'@'127.0.0.1', 'cerb_pw'@'localhost';
GRANT SELECT ON performance_schema.* TO 'cerb'@'127.0.0.1', 'cerb'@'localhost',
    'cerb_pw'@'127.0.0.1', 'cerb_pw'@'localhost';
CREATE USER IF NOT EXISTS 'cerb_repl'@'127.0.0.1';
GRANT REPLICATION SLAVE ON *.* TO 'cerb_repl'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
    ) || die "mysql :$port: creating the accounts failed: $out"
}

# mysql_replicate PORT DATA PRIMARY: make the new server of PORT a replica
# of PRIMARY (from the start of its binary log) and wait until it runs and
# has the lock tables.
mysql_replicate() {
    local port=$1 data=$2 primary=$3 out deadline
    out=$(mysql_admin_raw "$data" 60 2>&1 <<SQL
CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = $primary,
    MASTER_USER = 'cerb_repl', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
START SLAVE;
SQL
    ) || die "mysql :$port: cannot make it a replica of :$primary: $out"
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until [[ $(mysql_admin "$data" 2 -e "SELECT COUNT(*) FROM cerb.cerberus_meta") == 1 ]]; do
        (($(now_ms) < deadline)) ||
            die "mysql :$port: the replica did not catch up with :$primary within ${WAIT_S}s: $(mysql_admin "$data" 2 -e 'SHOW SLAVE STATUS\G' | grep -E 'Running|Error' | tr '\n' ' ')"
        sleep 0.1
    done
}

mysql_start_one() {
    local port=$1 role=$2 primary=$3
    local pidf="$STATE_DIR/mysql-$port.pid" dirf="$STATE_DIR/mysql-$port.dir"
    local pid data fresh=1 deadline

    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid" && mysql_is_ours "$pid" "$port"; then
        if [[ $(proc_state "$pid") == T ]]; then
            say "mysql :$port (pid $pid) was stopped (SIGSTOP); continuing it"
            kill -CONT "$pid" 2>/dev/null || true
        fi
        deadline=$(($(now_ms) + WAIT_S * 1000))
        until mysql_answer "$port" "$pid"; do
            (($(now_ms) < deadline)) ||
                die "mysql :$port (pid $pid) is running but does not answer; stop it first"
            sleep 0.05
        done
        say "mysql :$port already running (pid $pid)"
        return 0
    fi
    rm -f -- "$pidf"
    # A server of ours that was killed: its main process is gone (a
    # zombie, which pid_alive counts as dead) 10-15 ms before its threads
    # close the listening socket; wait for that, within the deadline,
    # rather than take its port for a foreign server's.
    if [[ -n $pid ]] && mysql_port_busy "$port"; then
        deadline=$(($(now_ms) + WAIT_S * 1000))
        while mysql_port_busy "$port" && (($(now_ms) < deadline)); do sleep 0.02; done
    fi
    if mysql_port_busy "$port"; then
        die "port $port already has a server that is not ours (state dir $STATE_DIR)"
    fi
    data=$(mysql_data "$port")
    if [[ -n $data && -d $data/mysql ]]; then
        say "mysql :$port: its server is gone (pid ${pid:-unknown}); restarting it on its data $data"
        fresh=0
    else
        if [[ -n $pid || -f $dirf ]]; then
            say "mysql :$port: removing stale state (pid ${pid:-none})"
        fi
        remove_data_dir "$dirf"
        data=$(mysql_new_dir "$port") || exit 1
        printf '%s\n' "$role" >"$STATE_DIR/mysql-$port.role"
    fi
    mysql_launch "$port" "$data"
    mysql_wait_ready "$port" "$fresh"
    pid=$(read_pid "$pidf")
    if ((fresh)) && [[ $role == replica ]]; then
        mysql_replicate "$port" "$data" "$primary"
        say "mysql :$port started, a replica of :$primary (pid $pid, data $data)"
    elif ((fresh)); then
        mysql_accounts "$port" "$data"
        # The lock tables, made by the code a user runs (`cerberus init`),
        # unless a test wants a server without them.
        if [[ ${CERB_MYSQL_UNPREPARED:-0} != 1 ]]; then
            cerberus_init "mysql :$port" "engines = (\"mysql\"); mysql = { host = \"127.0.0.1\"; port = $port; user = \"cerb\"; database = \"cerb\"; };"
        fi
        say "mysql :$port started (pid $pid, data $data)"
    else
        say "mysql :$port restarted (pid $pid, data $data)"
    fi
}

mysql_start() {
    [[ -x $MARIADBD ]] || die "$MARIADBD not found (Debian package mariadb-server)"
    command -v "$MARIADB_INSTALL_DB" >/dev/null ||
        die "$MARIADB_INSTALL_DB not found (Debian package mariadb-server)"
    command -v "$MARIADB_CLIENT" >/dev/null ||
        die "$MARIADB_CLIENT not found (Debian package mariadb-client)"
    if [[ -n $OPT_NODES && $OPT_NODES != 1 && $OPT_NODES != 2 ]]; then
        die "mysql: only --nodes 1 or 2 (a primary and its replica) is supported"
    fi
    if (($(id -u) == 0)); then
        id -u "$MYSQL_USER" >/dev/null 2>&1 ||
            die "user $MYSQL_USER not found: mariadbd runs as it when we are root (set CERB_MYSQL_USER)"
        command -v setpriv >/dev/null || die "setpriv not found (Debian package util-linux)"
    fi
    local -a ports
    mapfile -t ports < <(mysql_ports)
    if ((${#ports[@]} == 2)); then
        mysql_start_one "${ports[0]}" primary ""
        mysql_start_one "${ports[1]}" replica "${ports[0]}"
    else
        local p
        for p in "${ports[@]}"; do mysql_start_one "$p" single ""; done
    fi
}

mysql_stop_one() {
    local port=$1
    local pidf="$STATE_DIR/mysql-$port.pid" dirf="$STATE_DIR/mysql-$port.dir"
    local pid
    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid"; then
        if mysql_is_ours "$pid" "$port"; then
            kill_pid "$pid" "mysql :$port"
            say "mysql :$port stopped (pid $pid)"
        else
            say "mysql :$port: pid $pid is no longer our server; not signalling it"
        fi
    elif [[ -n $pid ]]; then
        say "mysql :$port was not running (stale pid $pid)"
    else
        say "mysql :$port is not running"
    fi
    rm -f -- "$pidf" "$STATE_DIR/mysql-$port.role"
    remove_data_dir "$dirf"
}

mysql_stop() {
    local p any=0
    for p in $(mysql_ports); do
        mysql_stop_one "$p"
        any=1
    done
    ((any)) || say "no mysql recorded in $STATE_DIR"
}

mysql_status() {
    local p pid rc=0 any=0
    for p in $(mysql_ports); do
        any=1
        pid=$(read_pid "$STATE_DIR/mysql-$p.pid")
        if [[ -z $pid ]]; then
            say "mysql :$p not running"
            rc=1
        elif ! pid_alive "$pid" || ! mysql_is_ours "$pid" "$p"; then
            say "mysql :$p stale (pid $pid gone)"
            rc=1
        elif [[ $(proc_state "$pid") == T ]]; then
            say "mysql :$p paused (pid $pid, SIGSTOPped)"
            rc=1
        elif mysql_answer "$p" "$pid"; then
            say "mysql :$p running (pid $pid)"
        else
            say "mysql :$p not answering (pid $pid)"
            rc=1
        fi
    done
    if ((!any)); then
        say "no mysql recorded in $STATE_DIR"
        rc=1
    fi
    return $rc
}
