#!/usr/bin/env bash
# shellcheck disable=SC2317 # the helpers are called through check/check_not
#
# sql_servers_check.sh [SERVERS_SH] — a self-test of scripts/servers.sh's
# PostgreSQL and MariaDB servers (scripts/servers.d/pg.sh, mysql.sh), run by
# hand (it is no ctest test): start, status, the accounts the tests use,
# idempotent start, a kill -9 restarted on the same data, a SIGSTOP
# continued, a streaming standby promoted, and a stop that leaves no process,
# state file or data directory. Output is TAP-like; exit status 1 when a
# check fails.
#
# It uses a state directory of its own (mktemp -d) and ports away from the
# defaults, so it does not disturb a test run: CERB_CHECK_PG_PORT (default
# 25532; the standby takes the next port) and CERB_CHECK_MYSQL_PORT (23406).
# The EXIT trap stops, by PID through servers.sh, whatever it started.
# Needs psql (PG_BINDIR, default the newest /usr/lib/postgresql/*/bin) and
# the mariadb client.

set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SERVERS=${1:-$HERE/../../scripts/servers.sh}
PG_PORT=${CERB_CHECK_PG_PORT:-25532}
PG_PORT2=$((PG_PORT + 1))
MY_PORT=${CERB_CHECK_MYSQL_PORT:-23406}
STATE=$(mktemp -d "${TMPDIR:-/tmp}/cerb-sql-check.XXXXXX")
export CERB_STATE_DIR=$STATE
FAILED=0
N=0

if [[ -z ${PG_BINDIR:-} ]]; then
    PG_BINDIR=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5 -rn | head -n 1)
fi
PSQL=$PG_BINDIR/psql

cleanup() {
    bash "$SERVERS" stop pg >/dev/null 2>&1
    bash "$SERVERS" stop mysql >/dev/null 2>&1
    rm -rf -- "$STATE"
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

# check NAME COMMAND...: ok when COMMAND succeeds, its output shown if not.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then ok "$name"; else not_ok "$name" "$out"; fi
}

# check_not NAME COMMAND...: ok when COMMAND fails.
check_not() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then not_ok "$name" "succeeded: $out"; else ok "$name"; fi
}

# gone PID...: every PID is gone or a zombie within 10 s.
gone() {
    local p s i
    for p in "$@"; do
        for ((i = 0; i < 200; i++)); do
            s=$(sed 's/.*) //; s/ .*//' "/proc/$p/stat" 2>/dev/null) || break
            [[ $s == Z || $s == X ]] && break
            sleep 0.05
        done
        ((i < 200)) || { echo "pid $p still alive"; return 1; }
    done
}

pid_of() { cat "$STATE/$1.pid" 2>/dev/null; }
dir_of() { cat "$STATE/$1.dir" 2>/dev/null; }
pstate() { sed 's/.*) //; s/ .*//' "/proc/$1/stat" 2>/dev/null; }

# pg PORT USER SQL [PASSWORD]: one value from psql over TCP.
pg() {
    PGPASSWORD=${4:-} PGCONNECT_TIMEOUT=3 timeout 10 "$PSQL" -X -w -At \
        -h 127.0.0.1 -p "$1" -U "$2" -d "$([[ $2 == postgres ]] && echo postgres || echo cerb)" \
        -c "$3"
}

# my USER SQL [PASSWORD]: the mariadb client over TCP, batch mode.
my() {
    timeout 10 mariadb --no-defaults --connect-timeout=3 -h127.0.0.1 -P"$MY_PORT" \
        -u"$1" ${3:+-p"$3"} -N -B cerb -e "$2"
}

# equals WANT COMMAND...: COMMAND prints exactly WANT.
equals() {
    local want=$1 got
    shift
    got=$("$@" 2>&1) || { echo "failed: $got"; return 1; }
    [[ $got == "$want" ]] || { echo "want '$want', got '$got'"; return 1; }
}

# eventually WANT COMMAND...: equals within 10 s.
eventually() {
    local i
    for ((i = 0; i < 100; i++)); do
        equals "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    equals "$@"
}

S() { bash "$SERVERS" "$@"; }

# ---------------------------------------------------------------- PostgreSQL

check "pg: start --nodes 2" S start pg --port "$PG_PORT" --nodes 2
check "pg: status" S status pg
P1=$(pid_of "pg-$PG_PORT")
P2=$(pid_of "pg-$PG_PORT2")
D1=$(dir_of "pg-$PG_PORT")
D2=$(dir_of "pg-$PG_PORT2")
check "pg: the recorded PID is the postmaster (postmaster.pid)" \
    equals "$P1" head -n 1 "$D1/postmaster.pid"
check "pg: cerb connects, not a superuser" \
    equals "cerb|f" pg "$PG_PORT" cerb "select current_user, rolsuper from pg_roles where rolname = current_user"
check "pg: cerb_pw with its password" \
    equals cerb_pw pg "$PG_PORT" cerb_pw "select current_user" cerb-secret
check_not "pg: cerb_pw with a wrong password" pg "$PG_PORT" cerb_pw "select 1" wrong
check "pg: cerb_pw may create in schema public" \
    pg "$PG_PORT" cerb_pw "create table pw_t(x int); drop table pw_t" cerb-secret
check "pg: start again is idempotent" S start pg --port "$PG_PORT" --nodes 2
check "pg: same PIDs after it" equals "$P1 $P2" \
    echo "$(pid_of "pg-$PG_PORT") $(pid_of "pg-$PG_PORT2")"
check "pg: the standby is in recovery" equals t pg "$PG_PORT2" postgres "select pg_is_in_recovery()"
check "pg: a fence row" pg "$PG_PORT" cerb "create table fences(v int); insert into fences values (42)"
check "pg: replicated to the standby" eventually 42 pg "$PG_PORT2" cerb "select v from fences"

kill -KILL "$P1"
check "pg: start after kill -9 of the primary" S start pg --port "$PG_PORT" --nodes 2
check "pg: a new postmaster on the same data" equals "yes $D1" \
    echo "$([[ $(pid_of "pg-$PG_PORT") != "$P1" ]] && echo yes) $(dir_of "pg-$PG_PORT")"
check "pg: the fence survived" equals 42 pg "$PG_PORT" cerb "select v from fences"
P1=$(pid_of "pg-$PG_PORT")

kill -STOP "$P1"
check_not "pg: status fails while SIGSTOPped" S status pg
check "pg: start continues a SIGSTOPped postmaster" S start pg --port "$PG_PORT" --nodes 2
check "pg: same PID, running" equals "$P1 yes" \
    echo "$(pid_of "pg-$PG_PORT") $([[ $(pstate "$P1") != T ]] && echo yes)"

check "pg: promote the standby" equals t pg "$PG_PORT2" postgres "select pg_promote()"
check "pg: status reports it a primary" eval "S status pg | grep -q ':$PG_PORT2 running as primary'"
check "pg: stop" S stop pg
check "pg: both postmasters gone" gone "$P1" "$P2"
check "pg: no state and no data left" \
    eval "! ls '$STATE'/pg-*.pid '$STATE'/pg-*.dir '$D1' '$D2' 2>/dev/null | grep -q ."

# ------------------------------------------------------------------- MariaDB

check "mysql: start" S start mysql --port "$MY_PORT"
check "mysql: status" S status mysql
M=$(pid_of "mysql-$MY_PORT")
MD=$(dir_of "mysql-$MY_PORT")
check "mysql: cerb connects over TCP" equals "cerb@127.0.0.1" my cerb "select current_user()"
check "mysql: cerb has PROCESS, not SUPER" \
    eval "my cerb 'show grants' | grep -q 'GRANT PROCESS ON' && ! my cerb 'show grants' | grep -qE 'SUPER|CONNECTION ADMIN'"
check "mysql: cerb reads performance_schema.metadata_locks" \
    my cerb "select count(*) from performance_schema.metadata_locks"
check "mysql: the mdl instrument is on" equals YES \
    my cerb "select enabled from performance_schema.setup_instruments where name = 'wait/lock/metadata/sql/mdl'"
check "mysql: cerb_pw with its password" equals "cerb_pw@127.0.0.1" my cerb_pw "select current_user()" cerb-secret
check_not "mysql: cerb_pw with a wrong password" my cerb_pw "select 1" wrong
check_not "mysql: cerb_pw without a password" my cerb_pw "select 1"
check_not "mysql: --nodes 3 is refused" S start mysql --port "$MY_PORT" --nodes 3
check "mysql: start again is idempotent" S start mysql --port "$MY_PORT"
check "mysql: same PID after it" equals "$M" pid_of "mysql-$MY_PORT"
check "mysql: a fence row" my cerb "create table fences(v int) engine=innodb; insert into fences values (42)"

kill -KILL "$M"
check "mysql: start after kill -9" S start mysql --port "$MY_PORT"
check "mysql: a new mariadbd on the same data" equals "yes $MD" \
    echo "$([[ $(pid_of "mysql-$MY_PORT") != "$M" ]] && echo yes) $(dir_of "mysql-$MY_PORT")"
check "mysql: the fence survived" equals 42 my cerb "select v from fences"
M=$(pid_of "mysql-$MY_PORT")

kill -STOP "$M"
check_not "mysql: status fails while SIGSTOPped" S status mysql
check "mysql: start continues a SIGSTOPped server" S start mysql --port "$MY_PORT"
check "mysql: same PID, running" equals "$M yes" \
    echo "$(pid_of "mysql-$MY_PORT") $([[ $(pstate "$M") != T ]] && echo yes)"
kill -STOP "$M"
check "mysql: stop (a SIGSTOPped server)" S stop mysql
check "mysql: mariadbd gone" gone "$M"
check "mysql: no state and no data left" \
    eval "! ls '$STATE'/mysql-*.pid '$STATE'/mysql-*.dir '$MD' 2>/dev/null | grep -q ."

echo "1..$N"
exit $FAILED
