# stores.sh — sourced by scripts/quickstart.sh and scripts/bench-report.sh:
# the private servers (redis, ZooKeeper, etcd, and for bench-report also
# PostgreSQL and MariaDB) such a script starts on loopback through
# scripts/servers.sh, on ports and in a state directory ($CERB_STATE_DIR)
# of its own, and the file that names them.
#
# The caller defines run (echo a command, then run it) and sets ROOT (the
# checkout) and SERVERS (scripts/servers.sh). What was started is kept in STARTED, for
# cerb_stores_stop to stop by PID (servers.sh stop) from the caller's EXIT
# trap, however the script ends.
# shellcheck shell=bash

STARTED=()

# cerb_check_ports PROG VAR...: exit 2, naming PROG, unless each variable
# holds a port number.
cerb_check_ports() {
    local prog=$1 v
    shift
    for v in "$@"; do
        [[ ${!v} =~ ^[1-9][0-9]*$ && ${!v} -lt 65535 ]] || {
            echo "$prog: bad port $v=${!v}" >&2
            exit 2
        }
    done
}

# cerb_release_tree PROG DIR: configure DIR as a Release tree unless it is
# configured already (then it is reused as it is, with a warning when it
# is not Release).
cerb_release_tree() {
    local bt
    if [[ ! -f $2/CMakeCache.txt ]]; then
        run cmake -S "$ROOT" -B "$2" -DCMAKE_BUILD_TYPE=Release
    else
        bt=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$2/CMakeCache.txt")
        echo "reusing the configured tree (CMAKE_BUILD_TYPE=${bt:-none})"
        [[ $bt == Release ]] || echo "$1: warning: $2 is not a Release tree" >&2
    fi
}

# cerb_stores_start REDIS_PORT ZK_PORT ETCD_PORT FILE WHO [PG_PORT MYSQL_PORT]:
# start the three servers, and with PG_PORT and MYSQL_PORT a PostgreSQL and
# a MariaDB too, and write FILE, a configuration listing them with every
# other key at its default; WHO names the script in the file's first line.
# Every server starts as a new one is, unprepared (the redis without a
# data-loss marker, pg and mysql with servers.sh's accounts, user and
# database cerb, but without the lock tables): the caller prepares them
# with `cerberus init`.
cerb_stores_start() {
    local e p count=three list='"redis", "zk", "etcd"'
    local -a stores=("redis $1" "zk $2" "etcd $3")
    if (($# >= 7)); then
        stores+=("pg $6" "mysql $7")
        count=five
        list+=', "pg", "mysql"'
    fi
    for e in "${stores[@]}"; do
        p=${e#* }
        e=${e%% *}
        STARTED+=("$e --port $p")
        case $e in
            redis) CERB_REDIS_UNMARKED=1 run bash "$SERVERS" start "$e" --port "$p" ;;
            pg) CERB_PG_UNPREPARED=1 run bash "$SERVERS" start "$e" --port "$p" ;;
            mysql) CERB_MYSQL_UNPREPARED=1 run bash "$SERVERS" start "$e" --port "$p" ;;
            *) run bash "$SERVERS" start "$e" --port "$p" ;;
        esac
    done
    {
        cat <<CFG
# written by $5: its $count private servers
engines = ($list);
redis = { host = "127.0.0.1"; port = $1; };
zk = { hosts = "127.0.0.1:$2"; };
etcd = { endpoints = ("http://127.0.0.1:$3"); };
CFG
        if (($# >= 7)); then
            cat <<CFG
pg = { conninfo = "host=127.0.0.1 port=$6 dbname=cerb user=cerb"; };
mysql = { host = "127.0.0.1"; port = $7; user = "cerb"; database = "cerb"; };
CFG
        fi
    } >"$4"
}

# cerb_stores_stop: stop, by PID, every server cerb_stores_start started.
cerb_stores_stop() {
    local s
    for s in "${STARTED[@]}"; do
        # shellcheck disable=SC2086 # "engine --port N"
        bash "$SERVERS" stop $s || true
    done
}
