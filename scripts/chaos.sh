#!/usr/bin/env bash
#
# chaos.sh — the chaos suite's driver (DESIGN.md §14, issue 11 part 1).
#
#   scripts/chaos.sh [--minutes N | --seconds S] [--scenario S[,S...]]
#                    [--seed X] [--build DIR] [--procs P] [--threads T]
#                    [--grace MS] [--list]
#
# For each scenario: start its real servers on 127.0.0.1 (scripts/servers.sh,
# chaos ports and state dir of its own), put the loopback proxy
# (cerb_chaos_proxy) in front of the first engine, write a client config,
# create the shared-memory oracle, run P worker processes × T threads
# (cerb_chaos_worker) against it, and meanwhile run the nemesis: a seeded
# schedule of faults (a shuffle of the scenario's list, taken in turn, so each
# happens once before any repeats), each bounded in time —
#   pause E      SIGSTOP the server past the lease, then SIGCONT; pg: the
#                postmaster first, then (once it is stopped, so no new
#                backend appears) every process whose parent it is
#                (backends, background workers), all continued after
#   kill E       kill -9 and restart; redis without its data (the fence
#                counter is gone), zk and etcd on their data
#   kill-keep E  redis: SAVE, kill -9, restart on the snapshot; zk, etcd:
#                kill -9, restart on the data; pg: kill -9 of the
#                postmaster, restarted on its data by servers.sh (which
#                waits for its orphaned backends to exit); mysql: kill -9
#                of mariadbd, restarted on its data (InnoDB recovery)
#   delay        the proxy holds each reply longer than probe_timeout_ms,
#                shorter than the op timeout (a gray failure)
#   blackhole    the proxy accepts and answers nothing
#   drop         the proxy forwards requests and drops the replies
#   switch       `cerberus switch` to another engine (then back to auto)
#                while the workers run; the oracle is told (mark-switch)
#   flip         (manual-switch) `cerberus switch` to the other of the two
#                engines, both alive throughout: an operator moving back and
#                forth; the oracle is told (mark-switch)
#   kill-leader  (3-node zk3 and etcd3) kill -9 the ensemble's leader and
#                restart it on its data a moment later
#   pause-leader (zk3, etcd3) SIGSTOP the leader past the lease, SIGCONT
#   pause-follower (zk3, etcd3) the same to a follower
#   expire       the proxy answers nothing for twice the session timeout,
#                so the server expires the clients' sessions mid-attempt
#   kill-master  (sentinel, cluster) kill -9 the master (cluster: of a
#                worker name's slot), wait until a replica is promoted, then
#                restart it empty on its old command line (sentinel: as a
#                master, which the sentinels turn into a replica after a
#                while; cluster: on its nodes.conf, as a replica)
#   pause-master (sentinel, cluster) SIGSTOP that master 2.5-6 s (past the
#                lease; mostly long enough for a failover), then SIGCONT: it
#                comes back as a master until it is told otherwise
#   stale-promote (sentinel) a replica stops replicating (REPLICAOF NO ONE)
#                while the workers write on the master for 1-2.5 s, the other
#                replica gets replica-priority 0, and SENTINEL FAILOVER
#                promotes the stale one: what the master granted in between
#                is lost
#   kill-node    (redlock) kill -9 one of the three masters, chosen at
#                random, and restart it without its data (its keys and fence
#                counters gone, a new run_id): one node, never a majority
#   pause-node   (redlock) SIGSTOP one master past the lease, then SIGCONT
#   pause-two    (redlock) SIGSTOP one master past the lease and, in the
#                middle of it, a second one for 300-800 ms: a majority
#                unreachable for a moment (no grant can be made, holders
#                cannot renew), then both continued
#   migrate      (cluster) the slot of a worker name moves to another master
#                under load: SETSLOT IMPORTING/MIGRATING, MIGRATE of its keys
#                two at a time 100 ms apart, SETSLOT NODE everywhere
# Sentinel and Cluster faults wait, before they start, until the deployment
# is whole again (every replica linked, no failover for the sentinels'
# 2 × failover-timeout), 30 s at most, and are skipped otherwise.
# Then heal everything, let the workers finish, and print the oracle's row:
# scenario, acquisitions (per engine), overlaps explained / unsafe, token
# regressions, tokens of 0, overruns, LOST. Its anomaly notes follow.
#
# Verdict: exit 1 when any scenario had unsafe overlaps (except the
# switch_grace_ms = 0 scenario, where they are counted and reported), token
# regressions, tokens of 0, overrunning calls, a hung worker, or no grants.
#
# manual-switch: the operator flips between redis and zk under load while
# two kinds of process lock the same names: P workers on the file that is
# switched (they watch it and follow), and two laggards on a copy of the
# file as it was at the start, with failover.watch_config = false, which
# nobody rewrites: processes that never hear of the switches (DESIGN.md §5:
# the engine they stay on must refuse them, not grant below the new
# epoch). Every grant, the laggards' too, is judged by the same oracle:
# unsafe overlaps and token regressions fail the run; the laggards' errors
# and refusals are counted and printed, never failed on. --grace 0 shows
# the oracle catching the overlaps the gate prevents.
#
# SQL scenarios (pg, mysql, pg-redis, pg-guard): PostgreSQL and MariaDB
# through the proxy like the other single servers. Neither engine has a key
# prefix or namespace (the rows of cerberus_lock are never deleted), so the
# workers' names there carry a tag of this run (its temporary directory's
# suffix) besides scenario and seed: no run meets another's rows. They write
# no closure records, so switching to or from them needs no namespace.
#
# Guard scenarios (zk-guard, redis-guard, etcd-guard, pg-guard; the mysql
# engine has no guard yet) run the workers with --guard:
# idempotency-guard attempts on four keys instead of locks, twice
# the threads (zk: so the guard's extra sessions open), judged by the same
# oracle (overlaps of attempts at one key; a rerun within keep_ms of a
# success; no tokens).
#
# Primitive scenarios (redis-prims, zk-prims, etcd-prims, redis-zk-prims)
# run the primitives of DESIGN.md §16 under the engine's usual nemesis:
# the workers take turns by process — leader elections (--elect),
# semaphores of two permits (--semaphore 2), read-write locks (--rwlock) —
# at least two processes each, on names of their own, judged by the same
# oracle (one leader per name at a time, each told LOST before the next;
# at most two permits held; never a writer with anybody; tokens).
# redis-zk-prims adds switches: permits add up across the two engines.
#
# memcached (memcached, memcached-redis): one memcached (servers.d/memcached.sh
# starts it with -M: no evictions, as the engine requires of a lock server)
# through the proxy. `kill` restarts it as a new, empty process (memcached
# keeps nothing on disk): the engine tells every holder LOST and grants
# nothing on the new process for about one lease (its quarantine), so the oracle must
# see no overlap across it. memcached has no fencing: its grants (no counter)
# are judged by the overlap rule alone (worker --unfenced memcached).
# memcached-redis adds switches to redis and back.
# redlock: the redis engine in Redlock mode (redis.mode = "redlock",
# redis.redlock_fence = "quorum") over three independent masters
# (CERB_CHAOS_REDLOCK_PORT +0..+2, no proxy: each node is a server of its
# own), under kill-node, pause-node and pause-two. The oracle judges it as
# any engine: no unsafe overlap, and fencing tokens that strictly increase
# per name (the quorum fence, written back to a majority before a grant is
# reported) through restarts without data of any one node.
#
# Replay: every scenario prints its seed and the nemesis schedule; the same
# --scenario and --seed give the same worker choices and the same schedule
# (faults land at the same offsets; the servers' timing is real time).
#
# Environment: CERB_CHAOS_REDIS_PORT (31400), CERB_CHAOS_ZK_PORT (31200),
# CERB_CHAOS_ETCD_PORT (31300), CERB_CHAOS_PROXY_PORT (31410),
# CERB_CHAOS_PG_PORT (31700), CERB_CHAOS_MYSQL_PORT (31800),
# CERB_CHAOS_ZK3_PORT (30000: client ports 30000-30002, quorum and election
# ports 707 and 1707 above), CERB_CHAOS_ETCD3_PORT (30100: client ports
# 30100, 30102, 30104, each with its peer port next to it) — below the
# kernel's ephemeral range (32768+), where a client socket could hold a port
# a restarted member needs,
# CERB_CHAOS_SENTINEL_PORT (31500: master and replicas 31500-31502,
# sentinels 31510-31512), CERB_CHAOS_CLUSTER_PORT (31600: nodes 31600-31605,
# bus ports 21600-21605, see servers.d/cluster.sh),
# CERB_CHAOS_MEMCACHED_PORT (31950),
# CERB_CHAOS_REDLOCK_PORT (31900: masters 31900-31902),
# CERB_CHAOS_STATE_DIR (servers' state, default $TMPDIR/cerb-chaos-$UID),
# CERB_CHAOS_KEEP_DIR (a failed scenario's worker logs, config and oracle,
# default $TMPDIR/cerb-chaos-failed-<seed>), CERB_CHAOS_KEEP_ALL=1 (keep
# them for every scenario),
# CERB_BUILD_DIR (default ./build), CERB_CHAOS_BROKEN (a worker --broken
# mode, e.g. skip-lock: every worker runs deliberately broken, to show a
# scenario's verdict failing on its real servers; see test_broken.sh).
set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

REDIS_PORT=${CERB_CHAOS_REDIS_PORT:-31400}
ZK_PORT=${CERB_CHAOS_ZK_PORT:-31200}
ETCD_PORT=${CERB_CHAOS_ETCD_PORT:-31300}
PROXY_PORT=${CERB_CHAOS_PROXY_PORT:-31410}
ZK3_PORT=${CERB_CHAOS_ZK3_PORT:-30000}
ETCD3_PORT=${CERB_CHAOS_ETCD3_PORT:-30100}
SENTINEL_PORT=${CERB_CHAOS_SENTINEL_PORT:-31500}
CLUSTER_PORT=${CERB_CHAOS_CLUSTER_PORT:-31600}
PG_PORT=${CERB_CHAOS_PG_PORT:-31700}
MYSQL_PORT=${CERB_CHAOS_MYSQL_PORT:-31800}
MEMCACHED_PORT=${CERB_CHAOS_MEMCACHED_PORT:-31950}
REDLOCK_PORT=${CERB_CHAOS_REDLOCK_PORT:-31900}
export CERB_SENTINEL_MASTER=${CERB_SENTINEL_MASTER:-cerbmaster}
NODES=1              # servers per engine in the current scenario
RKIND=redis          # the redis deployment: redis (one server), sentinel, cluster, redlock
GUARD=0              # workers make guard attempts instead of locking
PRIMS=0              # workers use the primitives of §16 instead (elect, semaphore, rwlock)
BROKEN=${CERB_CHAOS_BROKEN:-} # a worker --broken mode (the verdict must fail)
export CERB_STATE_DIR=${CERB_CHAOS_STATE_DIR:-${TMPDIR:-/tmp}/cerb-chaos-${UID:-$(id -u)}}
# Upstream leaks of the workers' libraries (tests/chaos/lsan.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/chaos/lsan.supp}
BUILD=${CERB_BUILD_DIR:-$ROOT/build}

LEASE_MS=2000        # lock.lease_ms; zk sessions and etcd TTLs are of the same order
SETTLE_MS=3000       # time clients take to see a `cerberus switch` (file watch)

ALL_SCENARIOS="redis zk etcd redis-zk etcd-redis zk-etcd redis-zk-grace0 manual-switch zk3 etcd3 sentinel cluster zk-guard redis-guard etcd-guard pg mysql pg-redis pg-guard redis-prims zk-prims etcd-prims redis-zk-prims memcached memcached-redis redlock"
# Run only when named: etcd3-oldleader pauses the leader of a 3-node etcd,
# which etcd before 3.4.28 / 3.5.11 answers by revoking live sessions'
# leases when it resumes (etcd#15247): overlaps there are the server's,
# counted and reported, not failed.
EXTRA_SCENARIOS="etcd3-oldleader"
CI_SCENARIOS="redis zk etcd redis-zk etcd-redis redis-zk-grace0 manual-switch zk3 etcd3 sentinel cluster zk-guard pg mysql pg-redis redis-prims zk-prims etcd-prims redis-zk-prims memcached redlock"

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    cat <<EOF
usage: $PROG [--minutes N | --seconds S] [--scenario S[,S...]] [--seed X]
             [--build DIR] [--procs P] [--threads T] [--grace MS] [--ci] [--list]

--minutes N   run the chosen scenarios for N minutes in all (default 2)
--seconds S   run each scenario for S seconds instead
--scenario S  one or more of: $ALL_SCENARIOS
              (default: all of these), or $EXTRA_SCENARIOS
--ci          the bounded CI set: $CI_SCENARIOS, 20 s each
--seed X      base seed (scenario i uses X + i); printed for replay
--grace MS    failover.switch_grace_ms for every chosen scenario instead of
              its own (0 turns the safe-switch gate off: overlaps then fail
              the run, except in the scenarios that allow them)
EOF
}

# ---------------------------------------------------------------- options
MINUTES=2
SECONDS_EACH=""
SCENARIOS=""
SEED=$(($(date +%s) % 1000000))
PROCS=3
THREADS=3
GRACE_OVERRIDE=""
while (($#)); do
    case $1 in
        --minutes) MINUTES=${2:?}; shift 2 ;;
        --seconds) SECONDS_EACH=${2:?}; shift 2 ;;
        --scenario) SCENARIOS=${2:?}; shift 2 ;;
        --seed) SEED=${2:?}; shift 2 ;;
        --build) BUILD=${2:?}; shift 2 ;;
        --procs) PROCS=${2:?}; shift 2 ;;
        --threads) THREADS=${2:?}; shift 2 ;;
        --grace) GRACE_OVERRIDE=${2:?}; shift 2 ;;
        --ci) SCENARIOS=${SCENARIOS:-$CI_SCENARIOS}; SECONDS_EACH=${SECONDS_EACH:-20}; shift ;;
        --list) echo "$ALL_SCENARIOS"; exit 0 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
SCENARIOS=${SCENARIOS:-$ALL_SCENARIOS}
SCENARIOS=${SCENARIOS//,/ }
[[ $SEED =~ ^[0-9]+$ ]] || die "bad --seed '$SEED'"
[[ -z $GRACE_OVERRIDE || $GRACE_OVERRIDE =~ ^(-1|[0-9]+)$ ]] || die "bad --grace '$GRACE_OVERRIDE'"
for s in $SCENARIOS; do
    [[ " $ALL_SCENARIOS $EXTRA_SCENARIOS " == *" $s "* ]] ||
        die "unknown scenario '$s' (known: $ALL_SCENARIOS $EXTRA_SCENARIOS)"
done
set -- $SCENARIOS
NSCEN=$#
if [[ -z $SECONDS_EACH ]]; then
    SECONDS_EACH=$((MINUTES * 60 / NSCEN))
    ((SECONDS_EACH >= 15)) || SECONDS_EACH=15
fi

WORKER=$BUILD/tests/chaos/cerb_chaos_worker
ORACLE=$BUILD/tests/chaos/cerb_chaos_oracle
PROXY=$BUILD/tests/chaos/cerb_chaos_proxy
CLI=$BUILD/cli/cerberus
for b in "$WORKER" "$ORACLE" "$PROXY" "$CLI"; do
    [[ -x $b ]] || die "$b not built (cmake --build $BUILD)"
done
# servers.sh prepares the redis servers it starts empty with this `cerberus init`.
export CERBERUS_BIN=$CLI

RUN=$(mktemp -d "${TMPDIR:-/tmp}/cerb-chaos-run.XXXXXX")
# What a failed scenario leaves for the post-mortem (removed by nobody).
KEEP=${CERB_CHAOS_KEEP_DIR:-${TMPDIR:-/tmp}/cerb-chaos-failed-$SEED}
mkdir -p -- "$CERB_STATE_DIR"
STARTED=""     # "engine:port" servers this run started
PROXY_PID=""
WORKER_PIDS=()
PAUSED=()      # processes a pause stopped, continued by its end, the heal or cleanup
T0=0
# Part of the workers' names on engines without a namespace (pg, mysql):
# this run's own, lower case (mysql.key "dl" keeps such names as they are).
RUN_TAG=$(tr 'A-Z' 'a-z' <<<"${RUN##*.}")

now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
elapsed() { local d=$(($(now_ms) - T0)); printf '+%d.%ds' $((d / 1000)) $((d % 1000 / 100)); }

servers() { "$ROOT/scripts/servers.sh" "$@"; }

# kind_of E: the servers.sh deployment serving engine E in the current
# scenario (redis, sentinel or cluster for the redis engine).
kind_of() {
    case $1 in
        redis) if [[ $RKIND == redlock ]]; then echo redis; else echo "$RKIND"; fi ;;
        *) echo "$1" ;;
    esac
}

# port_of E: the (base) client port of E in the current scenario.
port_of() {
    case $1 in
        redis)
            case $RKIND in
                sentinel) echo "$SENTINEL_PORT" ;;
                cluster) echo "$CLUSTER_PORT" ;;
                redlock) echo "$REDLOCK_PORT" ;;
                *) echo "$REDIS_PORT" ;;
            esac
            ;;
        zk) if ((NODES > 1)); then echo "$ZK3_PORT"; else echo "$ZK_PORT"; fi ;;
        etcd) if ((NODES > 1)); then echo "$ETCD3_PORT"; else echo "$ETCD_PORT"; fi ;;
        pg) echo "$PG_PORT" ;;
        mysql) echo "$MYSQL_PORT" ;;
        memcached) echo "$MEMCACHED_PORT" ;;
    esac
}

# node_ports E: the client port of each of E's nodes (servers.sh: zk nodes
# are one port apart, etcd nodes two, each with its peer port; a Sentinel
# deployment's three redis nodes and a cluster's six are one apart).
node_ports() {
    local base step=1 i n=$NODES
    base=$(port_of "$1")
    [[ $1 == etcd ]] && step=2
    [[ $1 == redis && $RKIND == sentinel ]] && n=3
    [[ $1 == redis && $RKIND == cluster ]] && n=6
    [[ $1 == redis && $RKIND == redlock ]] && n=3
    for ((i = 0; i < n; i++)); do echo $((base + step * i)); done
}

# nodes_of E: how many servers servers.sh starts for E (a Redlock
# deployment's three masters are three plain redis nodes).
nodes_of() {
    if [[ $1 == redis && $RKIND == redlock ]]; then echo 3; else echo "$NODES"; fi
}

# proxied E: E's clients go through the proxy (one server of its own;
# Sentinel and Cluster hand out their nodes' real addresses; Redlock's
# masters are each a server of its own).
proxied() { (($(nodes_of "$1") == 1)) && [[ $(kind_of "$1") == "$1" ]]; }

# pid_of E [PORT]: the PID of E's server (of its node on PORT).
pid_of() {
    local f p=""
    f="$CERB_STATE_DIR/$1-${2:-$(port_of "$1")}.pid"
    [[ -f $f ]] && read -r p <"$f"
    [[ $p =~ ^[0-9]+$ ]] && echo "$p"
}

# leader_port E: the client port of the ensemble's leader, or nothing.
leader_port() {
    local p out
    for p in $(node_ports "$1"); do
        case $1 in
            zk)
                out=$(servers status zk --port "$p" 2>/dev/null) || continue
                [[ $out == *"running as leader"* ]] && { echo "$p"; return 0; }
                ;;
            etcd)
                out=$(curl -s -m 2 -X POST "http://127.0.0.1:$p/v3/maintenance/status" -d '{}') || continue
                python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d.get("leader") and d["leader"] == d["header"]["member_id"] else 1)' \
                    "$out" 2>/dev/null && { echo "$p"; return 0; }
                ;;
        esac
    done
    return 1
}

# await E: every node of E answers (servers.sh status), within 30 s.
await() {
    local e=$1 deadline=$(($(now_ms) + 30000))
    until servers status "$(kind_of "$e")" --port "$(port_of "$e")" --nodes "$(nodes_of "$e")" >/dev/null 2>&1; do
        (($(now_ms) < deadline)) || { say "$e did not come back within 30 s"; return 1; }
        sleep 0.1
    done
}

cleanup() {
    local p e
    for p in "${WORKER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    [[ -n $PROXY_PID ]] && kill -TERM "$PROXY_PID" 2>/dev/null || true
    # A pause cut short (^C, ctest's timeout): a stopped backend would keep
    # its postmaster's shutdown waiting, and outlive it.
    resume_paused
    for e in $STARTED; do
        # engine:port:nodes
        local name=${e%%:*} rest=${e#*:} f
        for f in "$CERB_STATE_DIR/$name"-*.pid; do
            [[ -f $f ]] && read -r p <"$f" && [[ $p =~ ^[0-9]+$ ]] && kill -CONT "$p" 2>/dev/null || true
        done
        servers stop "$name" --port "${rest%%:*}" --nodes "${rest##*:}" >/dev/null 2>&1 || true
    done
    rm -rf -- "$RUN"
}
trap cleanup EXIT
# A ctest timeout or ^C still stops what this run started (by PID).
trap 'exit 143' TERM
trap 'exit 130' INT

start_server() {
    local e=$1 p k n
    p=$(port_of "$e")
    k=$(kind_of "$e")
    n=$(nodes_of "$e")
    [[ " $STARTED " == *" $k:$p:$n "* ]] && { await "$e"; return; }
    STARTED="$STARTED $k:$p:$n"
    # Three tries: the port may be held for a moment by a client socket
    # (ephemeral range).
    servers start "$k" --port "$p" --nodes "$n" >/dev/null ||
        servers start "$k" --port "$p" --nodes "$n" >/dev/null ||
        servers start "$k" --port "$p" --nodes "$n" >/dev/null
}

# stop_server E: stop E's deployment now (a Sentinel or Cluster one, used
# by its own scenario only: nine and six processes on two cores are not
# left running under the next scenarios).
stop_server() {
    local e=$1 p k n
    p=$(port_of "$e")
    k=$(kind_of "$e")
    n=$(nodes_of "$e")
    servers stop "$k" --port "$p" --nodes "$n" >/dev/null 2>&1 || true
    STARTED=${STARTED/ $k:$p:$n/}
}

# ---------------------------------------------------------------- nemesis

# kill9 PID: kill -9 and wait until the process is gone (or a zombie).
kill9() {
    kill -KILL "$1"
    while kill -0 "$1" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]; do
        sleep 0.05
    done
}

# listening PORT: a socket listens on 127.0.0.1:PORT (/proc/net/tcp, state
# 0A).
listening() {
    local hex
    printf -v hex '%04X' "$1"
    awk -v a="0100007F:$hex" '$2 == a && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp
}

# relaunch E PORT ARGV...: start ARGV detached as E's server (its node on
# PORT), record its PID, and
# wait until it answers. The chaos ports lie in the kernel's ephemeral range,
# so a client socket may hold the port for a moment: a server that dies at
# once (bind failed) is started again, three times at most.
relaunch() {
    local e=$1 port=$2 pid try deadline
    shift 2
    for try in 1 2 3; do
        setsid "$@" </dev/null >>"$CERB_STATE_DIR/$e-$port.log" 2>&1 &
        pid=$!
        disown "$pid" # killed by a later fault: no job notice
        echo "$pid" >"$CERB_STATE_DIR/$e-$port.pid"
        deadline=$(($(now_ms) + 30000))
        while (($(now_ms) < deadline)); do
            servers status "$e" --port "$port" >/dev/null 2>&1 && return 0
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && { say "$e :$port (pid $pid) did not answer within 30 s"; return 1; }
        say "$e :$port exited at start (attempt $try; port busy?)"
        sleep 0.5
    done
    return 1
}

# redis_relaunch PORT: start the redis node on PORT again, on its data dir,
# with the flags servers.sh (and servers.d/cluster.sh) gave it, so their
# stop and status know the process. No --replicaof: a Sentinel promotion
# is written to no file here (CONFIG REWRITE has none to write), so a node
# comes back as a master, as one whose configuration file was never
# rewritten would; a cluster node comes back as its nodes.conf says.
redis_relaunch() {
    local port=$1 data bus
    read -r data <"$CERB_STATE_DIR/redis-$port.dir"
    local -a extra=()
    # As run_scenario sets it on a Sentinel deployment: a replica's full
    # sync starts at once, not after the default 5 s.
    [[ $RKIND == sentinel ]] && extra=(--repl-diskless-sync-delay 0)
    if [[ $RKIND == cluster ]]; then
        # servers.d/cluster.sh's bus port: +10000, or -10000 where that
        # would be an ephemeral port.
        bus=$((port + 10000))
        ((bus < 32768 || bus > 60999)) || bus=$((port - 10000))
        extra=(--cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus"
            --cluster-node-timeout 2000 --repl-diskless-sync yes --repl-diskless-sync-delay 0)
    fi
    relaunch redis "$port" redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --dir "$data" --save "" --appendonly no --daemonize no --logfile "" \
        --loglevel notice --enable-debug-command local "${extra[@]}"
}

# restart E KEEP [PORT]: kill -9 the server (its node on PORT) and start it
# again; KEEP=1 keeps its
# data (redis: SAVE first), KEEP=0 (redis only) restarts it empty and
# unmarked, as servers.sh treats a start after a crash.
restart() {
    local e=$1 keep=$2 pid port data
    port=${3:-$(port_of "$e")}
    pid=$(pid_of "$e" "$port") || { say "no $e pid"; return 1; }
    case $e in
        redis)
            read -r data <"$CERB_STATE_DIR/redis-$port.dir"
            if ((keep)); then
                timeout 5 redis-cli -h 127.0.0.1 -p "$port" SAVE >/dev/null 2>&1 || true
            fi
            kill9 "$pid"
            ((keep)) || rm -f -- "$data/dump.rdb"
            redis_relaunch "$port"
            ;;
        zk | etcd)
            # The same command line (zk: its zoo.cfg and data dir; etcd: its
            # data dir, where flags for a new cluster are ignored).
            local -a argv
            mapfile -d '' argv <"/proc/$pid/cmdline"
            kill9 "$pid"
            relaunch "$e" "$port" "${argv[@]}"
            ;;
        memcached)
            # A new process, empty (memcached keeps nothing): servers.sh
            # starts one on the port once the killed one has let it go.
            kill9 "$pid"
            local deadline=$(($(now_ms) + 10000))
            while listening "$port" && (($(now_ms) < deadline)); do sleep 0.05; done
            servers start memcached --port "$port" >/dev/null
            ;;
        pg | mysql)
            # servers.sh restarts a server whose process is gone on its
            # recorded data dir (pg: once the dead postmaster's orphaned
            # backends have exited, which they do on noticing its death)
            # and returns once it answers. It refuses a port that still
            # accepts connections, and a killed mariadbd is a zombie before
            # its last threads have let go of the listening socket (seen:
            # "port ... already has a server that is not ours").
            kill9 "$pid"
            local deadline=$(($(now_ms) + 10000))
            while listening "$port" && (($(now_ms) < deadline)); do sleep 0.05; done
            servers start "$e" --port "$port" >/dev/null
            ;;
    esac
}

# stat_of PID: the state and parent PID of PID (fields 3 and 4 of
# /proc/PID/stat, read after the command name, which may hold spaces and
# parentheses).
stat_of() {
    local line
    local -a f
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    read -r -a f <<<"${line##*) }"
    echo "${f[0]} ${f[1]}"
}

# children_of PID: the PIDs of the processes whose parent is PID.
children_of() {
    local f line
    local -a w
    for f in /proc/[0-9]*/stat; do
        # (A process may exit between the glob and the read.)
        { read -r line <"$f"; } 2>/dev/null || continue
        read -r -a w <<<"${line##*) }"
        [[ ${w[1]} == "$1" ]] || continue
        f=${f#/proc/}
        echo "${f%/stat}"
    done
}

# pause_server E: SIGSTOP E's server, recorded in PAUSED. A PostgreSQL
# server is many processes: a client talks to its own backend, which runs
# on while only the postmaster is stopped. So the postmaster is stopped
# first and, once it is (kill returns before the signal lands), every
# process whose parent it is: the backends and background workers. Only the
# postmaster forks them, so none can appear after the listing. MariaDB is
# one process (threads): the process alone.
pause_server() {
    local e=$1 pid c st deadline
    pid=$(pid_of "$e") || { say "no $e pid"; return 1; }
    kill -STOP "$pid"
    PAUSED=("$pid")
    [[ $e == pg ]] || return 0
    deadline=$(($(now_ms) + 2000))
    until st=$(stat_of "$pid") && [[ ${st%% *} == [Tt] ]]; do
        (($(now_ms) < deadline)) || { say "pg postmaster $pid not stopped after 2 s (state ${st%% *})"; break; }
        sleep 0.01
    done
    for c in $(children_of "$pid"); do
        kill -STOP "$c" 2>/dev/null && PAUSED+=("$c")
    done
}

# resume_paused: SIGCONT what pause_server stopped, children before their
# postmaster.
resume_paused() {
    local i
    for ((i = ${#PAUSED[@]} - 1; i >= 0; i--)); do
        kill -CONT "${PAUSED[i]}" 2>/dev/null || true
    done
    PAUSED=()
}

proxy_mode() {
    printf '%s\n' "$1" >"$RUN/mode.tmp"
    mv -f -- "$RUN/mode.tmp" "$RUN/mode"
}

# ---------------------------------------------- Sentinel and Cluster

# rcli PORT ARGS...: redis-cli on a node, bounded (a paused node accepts the
# connection and never answers).
rcli() {
    local p=$1
    shift
    timeout 5 redis-cli -h 127.0.0.1 -p "$p" "$@" 2>/dev/null
}

# ms_sleep MS: a fault window of MS milliseconds (how long a fault lasts;
# nothing waits for a condition in it).
ms_sleep() { sleep "$(($1 / 1000)).$(printf '%03d' $(($1 % 1000)))"; }

FAILOVER_MS=0 # when the nemesis last saw the sentinels fail over

# sentinel_master: the master's port, when all three sentinels name the same.
sentinel_master() {
    local i out m=""
    for i in 10 11 12; do
        out=$(rcli $((SENTINEL_PORT + i)) SENTINEL get-master-addr-by-name "$CERB_SENTINEL_MASTER") || return 1
        out=$(tail -n 1 <<<"$out")
        [[ $out =~ ^[0-9]+$ && (-z $m || $m == "$out") ]] || return 1
        m=$out
    done
    echo "$m"
}

# sentinel_whole: the sentinels agree on a master that is one, with both
# other nodes replicating from it (link up), and their 2 × failover-timeout
# (servers.d/sentinel.sh: 5 s) since the last failover has passed — before
# it they would not fail over again.
sentinel_whole() {
    local m p info
    (($(now_ms) > FAILOVER_MS + 10500)) || return 1
    m=$(sentinel_master) || return 1
    info=$(rcli "$m" INFO replication | tr -d '\r') || return 1
    [[ $info == *"role:master"* && $info == *"connected_slaves:2"* ]] || return 1
    for p in $(node_ports redis); do
        [[ $p == "$m" ]] && continue
        info=$(rcli "$p" INFO replication | tr -d '\r') || return 1
        [[ $info == *"role:slave"* && $info == *"master_port:$m"* &&
            $info == *"master_link_status:up"* ]] || return 1
    done
}

# cluster_nodes: CLUSTER NODES from the first node that answers.
cluster_nodes() {
    local p
    for p in $(node_ports redis); do
        rcli "$p" CLUSTER NODES && return 0
    done
    return 1
}

# cluster_owner SLOT: "port id" of the master serving SLOT, not one marked
# failing.
cluster_owner() {
    cluster_nodes | awk -v s="$1" '$3 ~ /master/ && $3 !~ /fail/ {
        for (i = 9; i <= NF; i++) {
            if ($i ~ /^\[/) continue
            n = split($i, r, "-"); lo = r[1]; hi = (n > 1) ? r[2] : r[1]
            if (s + 0 >= lo + 0 && s + 0 <= hi + 0) { split($2, a, "[:@]"); print a[2], $1; exit }
        }
    }'
}

# cluster_whole: every node says cluster_state:ok and sees no failing node,
# no handshake and no slot on the move; three masters serve the slots, three
# replicas follow them, each with its link up.
cluster_whole() {
    local p info nodes
    for p in $(node_ports redis); do
        info=$(rcli "$p" CLUSTER INFO | tr -d '\r') || return 1
        [[ $info == *"cluster_state:ok"* ]] || return 1
        nodes=$(rcli "$p" CLUSTER NODES) || return 1
        ! grep -q 'fail\|\[\|handshake\|noaddr' <<<"$nodes" || return 1
        (($(awk '$3 ~ /master/ && NF >= 9' <<<"$nodes" | wc -l) == 3)) || return 1
        (($(awk '$3 ~ /slave/' <<<"$nodes" | wc -l) == 3)) || return 1
        info=$(rcli "$p" INFO replication | tr -d '\r') || return 1
        [[ $info == *"role:master"* || $info == *"master_link_status:up"* ]] || return 1
    done
}

# await_whole END_MS: until the Sentinel or Cluster deployment is whole,
# 30 s at most and no later than END_MS.
await_whole() {
    local deadline=$(($(now_ms) + 30000))
    ((deadline < $1)) || deadline=$1
    until "${RKIND}_whole"; do
        (($(now_ms) < deadline)) || return 1
        sleep 0.2
    done
}

# victim K: "port slot name" of the master a fault hits: Sentinel's master,
# or the master of the slot of the workers' name K (slot and name "-" under
# Sentinel). K is drawn by the caller: $RANDOM in a subshell is seeded anew,
# and the schedule would not replay.
victim() {
    local name slot m
    if [[ $RKIND == sentinel ]]; then
        m=$(sentinel_master) || return 1
        echo "$m - -"
        return 0
    fi
    name="${NAME_PREFIX}$1"
    slot=$(rcli "$CLUSTER_PORT" CLUSTER KEYSLOT "$name") || return 1
    read -r m _ < <(cluster_owner "$slot") || return 1
    echo "$m $slot $name"
}

# master_now SLOT: the port that serves as master now (SLOT "-": Sentinel's).
master_now() {
    if [[ $1 == - ]]; then
        sentinel_master
    else
        local m
        read -r m _ < <(cluster_owner "$1") || return 1
        echo "$m"
    fi
}

# promoted OLD SLOT MS: until a master other than OLD serves (SLOT as in
# master_now), MS at most; prints it. (Run in $(...): the caller notes the
# failover in FAILOVER_MS.)
promoted() {
    local old=$1 slot=$2 deadline=$(($(now_ms) + $3)) m
    while (($(now_ms) < deadline)); do
        if m=$(master_now "$slot") && [[ -n $m && $m != "$old" ]]; then
            echo "$m"
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# replicated_fault SCENARIO END_MS ACTION: one Sentinel or Cluster fault
# (see the file comment), once the deployment is whole, if that is early
# enough to end before the workers do. Returns 2 when it is too late for
# any more faults.
replicated_fault() {
    local scen=$1 end=$2 a=$3 m slot name pid ms new r r2 p src dst src_id dst_id t0
    # 8 s before the workers end at the latest: a fault that starts later
    # would mostly play out after them.
    if ! await_whole $((end - 8000)) || (($(now_ms) > end - 8000)); then
        if (($(now_ms) > end - 8000)); then
            echo "  [$scen $(elapsed)] $a: the $RKIND deployment is not whole 8 s before the end; no more faults"
            return 2
        fi
        echo "  [$scen $(elapsed)] $a: the $RKIND deployment is not whole after 30 s; skipped"
        return 0
    fi
    local k=$((RANDOM % 3))
    read -r m slot name < <(victim "$k") || { echo "  [$scen $(elapsed)] $a: no master found; skipped"; return 0; }
    local what=":$m"
    [[ $slot != - ]] && what=":$m (slot $slot of $name)"
    pid=$(pid_of redis "$m") || { say "no redis pid for :$m"; return 1; }
    case $a in
        kill-master)
            echo "  [$scen $(elapsed)] kill -9 the master $what"
            t0=$(now_ms)
            kill9 "$pid"
            if new=$(promoted "$m" "$slot" 20000); then
                FAILOVER_MS=$(now_ms)
                echo "  [$scen $(elapsed)]   :$new promoted after $(($(now_ms) - t0)) ms; :$m restarts empty"
            else
                echo "  [$scen $(elapsed)]   no replica promoted within 20 s; :$m restarts empty"
            fi
            redis_relaunch "$m" || return 1
            ;;
        pause-master)
            ms=$((LEASE_MS + 500 + RANDOM % 3500))
            echo "  [$scen $(elapsed)] pause the master $what ${ms} ms (SIGSTOP pid $pid)"
            kill -STOP "$pid"
            ms_sleep "$ms"
            kill -CONT "$pid"
            if new=$(promoted "$m" "$slot" 1000); then
                FAILOVER_MS=$(now_ms)
                echo "  [$scen $(elapsed)]   :$new was promoted meanwhile; :$m resumes as a master"
            fi
            ;;
        stale-promote)
            local -a others=()
            for p in $(node_ports redis); do [[ $p == "$m" ]] || others+=("$p"); done
            r=${others[RANDOM % 2]}
            r2=${others[0]}
            [[ $r2 == "$r" ]] && r2=${others[1]}
            ms=$((1000 + RANDOM % 1500))
            echo "  [$scen $(elapsed)] stale-promote: replica :$r stops replicating :$m for ${ms} ms, then SENTINEL FAILOVER to it (:$r2 at priority 0)"
            rcli "$r2" CONFIG SET replica-priority 0 >/dev/null
            rcli "$r" REPLICAOF NO ONE >/dev/null
            ms_sleep "$ms"
            t0=$(now_ms)
            # Any sentinel may start it. One may refuse (NOGOODSLAVE), or
            # answer OK and abort a moment later with no good slave (seen
            # once in eight: its view of the stale replica changed between
            # the two checks): then the next is asked.
            for p in 10 11 12; do
                new=$(rcli $((SENTINEL_PORT + p)) SENTINEL FAILOVER "$CERB_SENTINEL_MASTER") || new="no answer"
                if [[ $new != OK ]]; then
                    echo "  [$scen $(elapsed)]   sentinel :$((SENTINEL_PORT + p)) SENTINEL FAILOVER: $new"
                    continue
                fi
                new=$(promoted "$m" - 5000) && break
                echo "  [$scen $(elapsed)]   sentinel :$((SENTINEL_PORT + p)) said OK; no promotion within 5 s"
            done
            new=$(master_now -) || new="not agreed on"
            if [[ $new == "$r" ]]; then
                FAILOVER_MS=$(now_ms)
                echo "  [$scen $(elapsed)]   the stale :$r promoted after $(($(now_ms) - t0)) ms"
            elif [[ $new == "$m" ]]; then
                echo "  [$scen $(elapsed)]   :$r not promoted; it replicates :$m again"
                rcli "$r" REPLICAOF 127.0.0.1 "$m" >/dev/null
            else
                # Not expected (the other replica was at priority 0): the
                # sentinels set every replica right themselves.
                FAILOVER_MS=$(now_ms)
                echo "  [$scen $(elapsed)]   the sentinels' master is now: $new"
            fi
            rcli "$r2" CONFIG SET replica-priority 100 >/dev/null
            ;;
        migrate)
            src=$m
            src_id=$(rcli "$src" CLUSTER MYID) || return 0
            read -r dst dst_id < <(cluster_nodes | awk -v s="$src_id" '$3 ~ /master/ && $3 !~ /fail/ && NF >= 9 && $1 != s {
                split($2, a, "[:@]"); print a[2], $1; exit }') || true
            [[ -n $dst ]] || { echo "  [$scen $(elapsed)] migrate: no other master; skipped"; return 0; }
            echo "  [$scen $(elapsed)] migrate slot $slot ($name) :$src -> :$dst under load"
            t0=$(now_ms)
            rcli "$dst" CLUSTER SETSLOT "$slot" IMPORTING "$src_id" >/dev/null
            rcli "$src" CLUSTER SETSLOT "$slot" MIGRATING "$dst_id" >/dev/null
            ms_sleep 300
            local -a keys
            local moved=0 out deadline=$(($(now_ms) + 30000))
            while :; do
                mapfile -t keys < <(rcli "$src" CLUSTER GETKEYSINSLOT "$slot" 2)
                if ((${#keys[@]} == 0)) || [[ -z ${keys[0]} ]]; then break; fi
                out=$(rcli "$src" MIGRATE 127.0.0.1 "$dst" "" 0 5000 KEYS "${keys[@]}") || out="no answer"
                if [[ $out == OK || $out == NOKEY ]]; then
                    moved=$((moved + ${#keys[@]}))
                else
                    echo "  [$scen $(elapsed)]   MIGRATE: $out"
                fi
                if (($(now_ms) > deadline)); then
                    echo "  [$scen $(elapsed)]   keys of slot $slot still on :$src after 30 s"
                    break
                fi
                # The operations whose keys are split between the two nodes
                # meanwhile get TRYAGAIN: a fault window, not a wait.
                ms_sleep 100
            done
            # The destination first, then the source, then the rest (as
            # redis-cli --cluster reshard does); replicas refuse, harmlessly.
            for p in "$dst" "$src" $(node_ports redis); do
                rcli "$p" CLUSTER SETSLOT "$slot" NODE "$dst_id" >/dev/null
            done
            echo "  [$scen $(elapsed)]   $moved keys moved in $(($(now_ms) - t0)) ms"
            ;;
    esac
}

# nemesis SCENARIO END_MS ACTIONS...: random faults until END_MS.
nemesis() {
    local scen=$1 end=$2 first=$3
    shift 3
    local -a acts=("$@")
    local sw=0 a ms pid i j t step=0
    local -a rl_nodes=()
    # A seeded shuffle of the actions, taken in turn (then reshuffled), so a
    # short run still meets every fault of its scenario once.
    shuffle() {
        for ((i = ${#acts[@]} - 1; i > 0; i--)); do
            j=$((RANDOM % (i + 1)))
            t=${acts[i]}
            acts[i]=${acts[j]}
            acts[j]=$t
        done
    }
    shuffle
    while (($(now_ms) + 4000 < end)); do
        sleep "$((1 + RANDOM % 2)).$((RANDOM % 10))"
        if ((step > 0 && step % ${#acts[@]} == 0)); then shuffle; fi
        a=${acts[step % ${#acts[@]}]}
        step=$((step + 1))
        case $a in
            pause)
                ms=$((LEASE_MS + 1000 + RANDOM % 1500))
                pause_server "$first" || return 1
                if ((${#PAUSED[@]} > 1)); then
                    echo "  [$scen $(elapsed)] pause $first ${ms} ms (SIGSTOP postmaster ${PAUSED[0]}, then its $((${#PAUSED[@]} - 1)) children)"
                else
                    echo "  [$scen $(elapsed)] pause $first ${ms} ms (SIGSTOP pid ${PAUSED[0]})"
                fi
                sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
                resume_paused
                ;;
            kill)
                echo "  [$scen $(elapsed)] kill -9 $first, restart without data"
                restart "$first" 0 || return 1
                ;;
            kill-keep)
                echo "  [$scen $(elapsed)] kill -9 $first, restart on its data"
                t=$(now_ms)
                restart "$first" 1 || return 1
                echo "  [$scen $(elapsed)]   $first answers again after $(($(now_ms) - t)) ms"
                ;;
            delay)
                ms=$((250 + RANDOM % 200))
                echo "  [$scen $(elapsed)] proxy: delay replies ${ms} ms for 3 s"
                proxy_mode "delay $ms"
                sleep 3
                proxy_mode pass
                ;;
            blackhole)
                ms=$((1500 + RANDOM % 2500))
                echo "  [$scen $(elapsed)] proxy: blackhole ${ms} ms"
                proxy_mode blackhole
                sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
                proxy_mode pass
                ;;
            drop)
                echo "  [$scen $(elapsed)] proxy: drop replies 1 s"
                proxy_mode drop
                sleep 1
                proxy_mode pass
                ;;
            kill-leader | pause-leader | pause-follower)
                local lp fp=""
                if ! lp=$(leader_port "$first"); then
                    echo "  [$scen $(elapsed)] $a: no leader now (an election under way); skipped"
                    continue
                fi
                if [[ $a == pause-follower ]]; then
                    for fp in $(node_ports "$first"); do [[ $fp != "$lp" ]] && break; done
                    lp=$fp
                fi
                pid=$(pid_of "$first" "$lp")
                if [[ $a == kill-leader ]]; then
                    echo "  [$scen $(elapsed)] kill -9 the $first leader :$lp, restart on its data"
                    restart "$first" 1 "$lp" || return 1
                else
                    ms=$((LEASE_MS + 1000 + RANDOM % 1500))
                    echo "  [$scen $(elapsed)] $a: SIGSTOP $first :$lp ${ms} ms"
                    kill -STOP "$pid"
                    sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
                    kill -CONT "$pid"
                fi
                ;;
            kill-node)
                # One master of the three, restarted empty at once: the
                # engine keeps it out of quorums for a lease (its run_id
                # changed) and re-seeds its fence counters.
                local np
                mapfile -t rl_nodes < <(node_ports "$first")
                np=${rl_nodes[RANDOM % ${#rl_nodes[@]}]}
                echo "  [$scen $(elapsed)] kill -9 the master :$np, restart without data"
                restart "$first" 0 "$np" || return 1
                ;;
            pause-node | pause-two)
                local np np2 ms2
                mapfile -t rl_nodes < <(node_ports "$first")
                i=$((RANDOM % ${#rl_nodes[@]}))
                np=${rl_nodes[i]}
                np2=${rl_nodes[(i + 1 + RANDOM % 2) % ${#rl_nodes[@]}]}
                ms=$((LEASE_MS + 1000 + RANDOM % 1500))
                ms2=$((300 + RANDOM % 500))
                pid=$(pid_of "$first" "$np") || { say "no pid for :$np"; return 1; }
                PAUSED=("$pid")
                if [[ $a == pause-node ]]; then
                    echo "  [$scen $(elapsed)] pause the master :$np ${ms} ms (SIGSTOP pid $pid)"
                    kill -STOP "$pid"
                    ms_sleep "$ms"
                else
                    local pid2
                    pid2=$(pid_of "$first" "$np2") || { say "no pid for :$np2"; return 1; }
                    echo "  [$scen $(elapsed)] pause the master :$np ${ms} ms, and :$np2 ${ms2} ms in the middle of it (a majority away)"
                    kill -STOP "$pid"
                    ms_sleep $(((ms - ms2) / 2))
                    PAUSED+=("$pid2")
                    kill -STOP "$pid2"
                    ms_sleep "$ms2"
                    kill -CONT "$pid2"
                    ms_sleep $(((ms - ms2) / 2))
                fi
                resume_paused
                ;;
            kill-master | pause-master | stale-promote | migrate)
                local rf=0
                replicated_fault "$scen" "$end" "$a" || rf=$?
                if ((rf == 2)); then break; fi
                ((rf == 0)) || return 1
                ;;
            expire)
                ms=$((LEASE_MS * 2 + RANDOM % 1000))
                echo "  [$scen $(elapsed)] proxy: blackhole ${ms} ms (sessions expire)"
                proxy_mode blackhole
                ms_sleep "$ms"
                proxy_mode pass
                ;;
            switch | flip)
                local to
                if [[ $a == flip ]]; then
                    # Back and forth between two live engines, the first
                    # flip leaving the one `auto` is on.
                    if ((sw % 2 == 0)); then to=$SECOND; else to=$first; fi
                elif ((sw % 2 == 0)); then to=$SECOND; else to=auto; fi
                sw=$((sw + 1))
                echo "  [$scen $(elapsed)] cerberus switch $to"
                timeout 20 "$CLI" -c "$RUN/cerberus.cfg" switch "$to" >/dev/null ||
                    echo "  [$scen $(elapsed)] cerberus switch $to failed"
                "$ORACLE" mark-switch "$RUN/oracle" "$SETTLE_MS"
                ;;
        esac
    done
}

# --------------------------------------------------------------- scenarios

# scenario NAME: engines, grace, nemesis actions.
scenario_def() {
    GRACE=-1
    ALLOW_OVERLAPS=0
    LAGGARDS=0
    NODES=1
    RKIND=redis
    GUARD=0
    PRIMS=0
    case $1 in
        redis) ENGINES="redis"; ACTS="pause kill kill-keep delay blackhole drop" ;;
        zk) ENGINES="zk"; ACTS="pause kill-keep delay blackhole drop" ;;
        etcd) ENGINES="etcd"; ACTS="pause kill-keep delay blackhole drop" ;;
        redis-zk) ENGINES="redis zk"; ACTS="pause kill blackhole drop switch" ;;
        etcd-redis) ENGINES="etcd redis"; ACTS="pause kill-keep blackhole switch" ;;
        zk-etcd) ENGINES="zk etcd"; ACTS="pause kill-keep blackhole delay switch" ;;
        redis-zk-grace0) ENGINES="redis zk"; GRACE=0; ALLOW_OVERLAPS=1; ACTS="pause kill blackhole switch" ;;
        manual-switch) ENGINES="redis zk"; LAGGARDS=2; ACTS="flip" ;;
        zk3) ENGINES="zk"; NODES=3; ACTS="kill-leader pause-leader pause-follower" ;;
        etcd3) ENGINES="etcd"; NODES=3; ACTS="kill-leader pause-follower" ;;
        etcd3-oldleader) ENGINES="etcd"; NODES=3; ALLOW_OVERLAPS=1; ACTS="pause-leader kill-leader pause-follower" ;;
        sentinel) ENGINES="redis"; RKIND=sentinel; ACTS="kill-master pause-master stale-promote" ;;
        cluster) ENGINES="redis"; RKIND=cluster; ACTS="kill-master pause-master migrate" ;;
        zk-guard) ENGINES="zk"; GUARD=1; ACTS="pause kill-keep expire blackhole drop delay" ;;
        # Faults that keep the data: the redis guard does not detect data
        # loss (engine_redis/redis_guard.c: no marker), so a restart without
        # data, or from a snapshot older than the last writes, would let an
        # attempt begin beside a running one — a documented limit, not news.
        redis-guard) ENGINES="redis"; GUARD=1; ACTS="pause delay blackhole drop" ;;
        etcd-guard) ENGINES="etcd"; GUARD=1; ACTS="pause kill-keep delay blackhole drop" ;;
        pg) ENGINES="pg"; ACTS="pause kill-keep delay blackhole drop" ;;
        mysql) ENGINES="mysql"; ACTS="pause kill-keep delay blackhole drop" ;;
        pg-redis) ENGINES="pg redis"; ACTS="pause kill-keep blackhole switch" ;;
        # No mysql-guard: the mysql engine has no guard yet.
        pg-guard) ENGINES="pg"; GUARD=1; ACTS="pause kill-keep delay blackhole drop" ;;
        redis-prims) ENGINES="redis"; PRIMS=1; ACTS="pause kill kill-keep delay blackhole drop" ;;
        zk-prims) ENGINES="zk"; PRIMS=1; ACTS="pause kill-keep expire delay blackhole drop" ;;
        etcd-prims) ENGINES="etcd"; PRIMS=1; ACTS="pause kill-keep delay blackhole drop" ;;
        redis-zk-prims) ENGINES="redis zk"; PRIMS=1; ACTS="pause kill blackhole drop switch" ;;
        # No kill-keep: memcached keeps nothing, every restart is empty.
        # kill twice: a 20 s run (about four faults) nearly always meets it.
        memcached) ENGINES="memcached"; ACTS="pause kill delay kill blackhole drop" ;;
        memcached-redis) ENGINES="memcached redis"; ACTS="pause kill blackhole switch" ;;
        redlock) ENGINES="redis"; RKIND=redlock; ACTS="kill-node pause-node pause-two" ;;
    esac
    if [[ -n $GRACE_OVERRIDE ]]; then GRACE=$GRACE_OVERRIDE; fi
}

# write_config: the client config, the first engine behind the proxy (a
# 3-node ensemble is given all its nodes, no proxy).
write_config() {
    # Each scenario's keys and nodes under a namespace of their own: a
    # `cerberus switch` writes closure records (core/closure.c), one per
    # namespace and permanent, which would refuse the next scenario's
    # clients (epoch 1) on servers that keep their data between scenarios.
    local ns="${RUN##*.}-$scen"
    local first=$1 e list="" port zkhosts="" eps="" p
    for e in $ENGINES; do list="$list${list:+, }\"$e\""; done
    {
        echo "engines = ($list);"
        echo "active = \"auto\";"
        echo "epoch = 1;"
        echo "lock = { lease_ms = $LEASE_MS; renew = true; fair = true; };"
        echo "retry = { max = 1; backoff_ms = 20; backoff_max_ms = 100; };"
        echo "failover = { probe_interval_ms = 250; probe_timeout_ms = 200;"
        echo "  consecutive_failures = 3; open_ms = 1000; half_open_successes = 3;"
        echo "  failback = \"auto\"; failback_after_ms = 5000; switch_grace_ms = $GRACE;"
        echo "  watch_config = true; };"
        for e in $ENGINES; do
            port=$(port_of "$e")
            [[ $e == "$first" ]] && proxied "$e" && port=$PROXY_PORT
            if ((NODES > 1)); then
                for p in $(node_ports "$e"); do
                    zkhosts="$zkhosts${zkhosts:+,}127.0.0.1:$p"
                    eps="$eps${eps:+, }\"http://127.0.0.1:$p\""
                done
                case $e in
                    zk) echo "zk = { hosts = \"$zkhosts\"; root = \"/cerb-chaos/$ns\"; session_timeout_ms = $LEASE_MS; connect_timeout_ms = 1000; };" ;;
                    etcd) echo "etcd = { endpoints = ($eps); prefix = \"cerb-chaos/$ns/\"; session_ttl_s = 2; op_timeout_ms = 1000; connect_timeout_ms = 500; };" ;;
                esac
                continue
            fi
            case $e:$RKIND in
                redis:sentinel)
                    echo "redis = { mode = \"sentinel\"; master_name = \"$CERB_SENTINEL_MASTER\";"
                    echo "  sentinels = (\"127.0.0.1:$((port + 10))\", \"127.0.0.1:$((port + 11))\", \"127.0.0.1:$((port + 12))\");"
                    echo "  connect_timeout_ms = 500; op_timeout_ms = 500; };"
                    ;;
                redis:cluster)
                    # Three seeds, as a user lists a few; the rest is learnt.
                    echo "redis = { mode = \"cluster\";"
                    echo "  nodes = (\"127.0.0.1:$port\", \"127.0.0.1:$((port + 1))\", \"127.0.0.1:$((port + 2))\");"
                    echo "  connect_timeout_ms = 500; op_timeout_ms = 500; };"
                    ;;
                redis:redlock)
                    echo "redis = { mode = \"redlock\"; redlock_fence = \"quorum\";"
                    echo "  nodes = (\"127.0.0.1:$port\", \"127.0.0.1:$((port + 1))\", \"127.0.0.1:$((port + 2))\");"
                    echo "  prefix = \"cerb-chaos-$ns:\"; connect_timeout_ms = 500; op_timeout_ms = 500; };"
                    ;;
                redis:*) echo "redis = { host = \"127.0.0.1\"; port = $port; prefix = \"cerb-chaos-$ns:\"; connect_timeout_ms = 500; op_timeout_ms = 500; };" ;;
                zk:*) echo "zk = { hosts = \"127.0.0.1:$port\"; root = \"/cerb-chaos/$ns\"; session_timeout_ms = $LEASE_MS; connect_timeout_ms = 1000; };" ;;
                etcd:*) echo "etcd = { endpoints = (\"http://127.0.0.1:$port\"); prefix = \"cerb-chaos/$ns/\"; session_ttl_s = 2; op_timeout_ms = 1000; connect_timeout_ms = 500; };" ;;
                # No namespace: the names carry the run's tag (run_scenario).
                pg:*) echo "pg = { conninfo = \"host=127.0.0.1 port=$port dbname=cerb user=cerb\"; op_timeout_ms = 1000; connect_timeout_ms = 500; };" ;;
                memcached:*) echo "memcached = { servers = (\"127.0.0.1:$port\"); prefix = \"cerb-chaos-$ns:\"; connect_timeout_ms = 500; op_timeout_ms = 500; };" ;;
                mysql:*) echo "mysql = { host = \"127.0.0.1\"; port = $port; user = \"cerb\"; database = \"cerb\"; op_timeout_ms = 1000; connect_timeout_ms = 500; };" ;;
            esac
        done
        # An attempt's claim as long as a lease, so the pauses outlast it.
        if ((GUARD)); then echo "guard = { running_ms = $LEASE_MS; };"; fi
    } >"$RUN/cerberus.cfg"
}

# bound_ms: a call's documented bound beyond its wait: each engine's
# connect + operation timeouts times (1 + retry.max), summed over the engines.
bound_ms() {
    local e b=0
    for e in $ENGINES; do
        case $e in
            memcached) b=$((b + (500 + 500) * 2)) ;;
            # Redlock: the masters in parallel, a fenced grant two rounds
            # (acquire, then the write-back to a majority).
            redis) if [[ $RKIND == redlock ]]; then b=$((b + (500 + 2 * 500) * 2)); else b=$((b + (500 + 500) * 2)); fi ;;
            zk) b=$((b + (1000 + LEASE_MS) * 2)) ;;
            etcd) b=$((b + (500 + 2 * 1000) * 2)) ;; # a release re-sends once (cerberus.h)
            pg | mysql) b=$((b + (500 + 1000) * 2)) ;;
        esac
    done
    echo "$b"
}

FAILED=0
ROWS=()

run_scenario() {
    local scen=$1 seed=$2 first e i p end rc=0 allow=""
    scenario_def "$scen"
    set -- $ENGINES
    first=$1
    SECOND=${2:-$1}
    local threads=$THREADS names=3 procs=$PROCS
    local -a wargs=()
    # Primitives: two processes at least per primitive (elect, semaphore,
    # rwlock, by process index).
    if ((PRIMS && procs < 6)); then procs=6; fi
    if ((GUARD)); then
        names=4
        # Twice the threads: on zk, enough overlapping calls that the
        # guard's extra sessions open (counted on the proxy's port).
        threads=$((THREADS * 2))
        wargs=(--guard)
        [[ $first == zk ]] && proxied zk && wargs+=(--count-conns "$PROXY_PORT")
    fi
    if [[ -n $BROKEN ]]; then wargs+=(--broken "$BROKEN"); fi
    # memcached grants carry no fencing counter (no token to judge).
    if [[ " $ENGINES " == *" memcached "* ]]; then wargs+=(--unfenced memcached); fi
    NAME_PREFIX="chaos-$scen-$seed-"
    # pg and mysql have no namespace: names of this run's own.
    if [[ " $ENGINES " == *" pg "* || " $ENGINES " == *" mysql "* ]]; then
        NAME_PREFIX="chaos-$scen-$seed-$RUN_TAG-"
    fi
    local deploy="" how=""
    if [[ $RKIND != redis ]]; then deploy=" ($RKIND)"; fi
    if ((GUARD)); then how=", guard attempts"; fi
    if ((PRIMS)); then how=", elections, semaphores of 2 and read-write locks by process"; fi
    if ((LAGGARDS)); then how="$how, + $LAGGARDS laggard procs on the unswitched file"; fi
    if [[ -n $BROKEN ]]; then how="$how, workers broken on purpose: $BROKEN"; fi
    say "scenario $scen: engines ($ENGINES)$deploy grace $GRACE, ${SECONDS_EACH} s, seed $seed, $procs procs × $threads threads$how"
    say "  replay: scripts/chaos.sh --scenario $scen --seed $seed --seconds $SECONDS_EACH"
    for e in $ENGINES; do start_server "$e"; done
    if [[ $RKIND == sentinel ]]; then
        # servers.d/sentinel.sh keeps the default 5 s before a full sync
        # (its cluster sibling sets 0): after each failover a node would
        # wait that long to be a replica again, and the next fault for it.
        for p in $(node_ports redis); do
            rcli "$p" CONFIG SET repl-diskless-sync-delay 0 >/dev/null || true
        done
    fi
    proxy_mode pass
    "$PROXY" --listen "$PROXY_PORT" --target "$(port_of "$first")" --mode-file "$RUN/mode" \
        --seconds $((SECONDS_EACH + 120)) >"$RUN/proxy.log" 2>&1 &
    PROXY_PID=$!
    write_config "$first"
    # The new redis prefix gets its marker, as servers.sh prepares the
    # default one (no quarantine before the first grant).
    if [[ " $ENGINES " == *" redis "* && $RKIND == redis ]]; then
        timeout 20 "$CLI" -c "$RUN/cerberus.cfg" init --force >/dev/null 2>&1 ||
            say "  cerberus init failed: the first grants wait a quarantine"
    fi
    if ((LAGGARDS)); then
        # The file as it is before any switch, never rewritten and not
        # watched: its readers stay on the engine `auto` picks at the
        # start, at the first epoch, unless the engines tell them.
        sed 's/watch_config = true;/watch_config = false;/' "$RUN/cerberus.cfg" >"$RUN/laggard.cfg"
        grep -q 'watch_config = false;' "$RUN/laggard.cfg" || die "laggard.cfg: watch_config not turned off"
    fi
    "$ORACLE" init "$RUN/oracle"
    RANDOM=$seed
    T0=$(now_ms)
    WORKER_PIDS=()
    local -a pargs
    local pprefix
    for ((i = 0; i < procs; i++)); do
        pargs=()
        pprefix=$NAME_PREFIX
        if ((PRIMS)); then
            case $((i % 3)) in
                0) pargs=(--elect); pprefix="${NAME_PREFIX}e-" ;;
                1) pargs=(--semaphore 2); pprefix="${NAME_PREFIX}s-" ;;
                2) pargs=(--rwlock); pprefix="${NAME_PREFIX}r-" ;;
            esac
        fi
        "$WORKER" -c "$RUN/cerberus.cfg" -o "$RUN/oracle" --client "$i" \
            --threads "$threads" --names "$names" --prefix "$pprefix" \
            --seconds "$SECONDS_EACH" --seed "$seed" --bound-ms "$(bound_ms)" \
            --lease-ms "$LEASE_MS" "${wargs[@]}" "${pargs[@]}" >"$RUN/$scen-worker-$i.log" 2>&1 &
        WORKER_PIDS+=($!)
    done
    # Laggards: the same workload and oracle, client ids after the others.
    for ((i = 0; i < LAGGARDS; i++)); do
        "$WORKER" -c "$RUN/laggard.cfg" -o "$RUN/oracle" --client $((PROCS + i)) \
            --threads "$threads" --names "$names" --prefix "$NAME_PREFIX" \
            --seconds "$SECONDS_EACH" --seed "$seed" --bound-ms "$(bound_ms)" \
            --lease-ms "$LEASE_MS" "${wargs[@]}" >"$RUN/$scen-laggard-$i.log" 2>&1 &
        WORKER_PIDS+=($!)
    done
    end=$((T0 + SECONDS_EACH * 1000))
    # shellcheck disable=SC2086
    nemesis "$scen" "$end" "$first" $ACTS || rc=1
    # Heal: everything answers again before the workers' last seconds.
    proxy_mode pass
    resume_paused
    for e in $ENGINES; do
        local p np
        for np in $(node_ports "$e"); do
            p=$(pid_of "$e" "$np") && kill -CONT "$p" 2>/dev/null || true
        done
        await "$e" || rc=1
    done
    # Workers end by --seconds; a worker still running 60 s later hung.
    local deadline=$(($(now_ms) + (SECONDS_EACH + 60) * 1000)) p
    for p in "${WORKER_PIDS[@]}"; do
        while kill -0 "$p" 2>/dev/null && (($(now_ms) < deadline)); do sleep 0.2; done
        if kill -0 "$p" 2>/dev/null; then
            say "  $scen: worker pid $p hung; killing it"
            kill -KILL "$p" 2>/dev/null || true
            rc=1
        fi
        wait "$p" || { say "  $scen: worker pid $p exited with status $?"; rc=1; }
    done
    WORKER_PIDS=()
    local -a logs=()
    for ((i = 0; i < procs; i++)); do logs+=("$RUN/$scen-worker-$i.log"); done
    for ((i = 0; i < LAGGARDS; i++)); do logs+=("$RUN/$scen-laggard-$i.log"); done
    local wl
    for wl in "${logs[@]}"; do
        # A sanitizer report is shown whole up to its stack's end; otherwise the
        # worker's last lines (its counts).
        if grep -q 'ERROR: \(Address\|Leak\|Undefined\)Sanitizer\|runtime error:' "$wl"; then
            grep -A 40 'ERROR: \(Address\|Leak\|Undefined\)Sanitizer\|runtime error:' "$wl" |
                grep -v 'cerberus \(warn\|info\)' | head -n 45 | sed "s/^/  $scen: /"
            rc=1
        fi
        grep -v 'cerberus \(warn\|info\|debug\)' "$wl" | grep -v '^ *$' | grep -v ': seed ' | tail -n 3 | sed "s/^/  $scen: /"
    done
    if ((LAGGARDS)); then
        # Refusals are what a laggard should get once the engine it stays
        # on knows of the switch: counted, not failed on.
        cat "$RUN/$scen"-laggard-*.log | awk -v s="$scen" '
            $3 == "ops" { g += $6; t += $8; e += $10 }
            END { printf "  %s: laggards: %d granted, %d timeouts or busy, %d errors (refusals included)\n", s, g, t, e }'
    fi
    kill -TERM "$PROXY_PID" 2>/dev/null || true
    wait "$PROXY_PID" 2>/dev/null || true
    PROXY_PID=""
    ((ALLOW_OVERLAPS)) && allow=--allow-overlaps
    local row
    row=$("$ORACLE" report "$RUN/oracle" "$scen" --min-acq 10 $allow) || rc=1
    printf '%s\n' "$row" | tail -n +2
    ROWS+=("$(printf '%s\n' "$row" | head -n 1)")
    if ((rc)) || [[ ${CERB_CHAOS_KEEP_ALL:-0} == 1 ]]; then
        mkdir -p -- "$KEEP"
        cp -- "$RUN/$scen"-worker-*.log "$RUN/cerberus.cfg" "$KEEP/" 2>/dev/null || true
        if ((LAGGARDS)); then cp -- "$RUN/$scen"-laggard-*.log "$RUN/laggard.cfg" "$KEEP/" 2>/dev/null || true; fi
        cp -- "$RUN/oracle" "$KEEP/$scen.oracle" 2>/dev/null || true
        for e in pg mysql; do
            [[ " $ENGINES " == *" $e "* ]] || continue
            cp -- "$CERB_STATE_DIR/$e-$(port_of "$e").log" "$KEEP/$scen-$e.log" 2>/dev/null || true
        done
        if [[ $RKIND != redis ]]; then
            local np
            for np in $(node_ports redis); do
                cp -- "$CERB_STATE_DIR/redis-$np.log" "$KEEP/$scen-redis-$np.log" 2>/dev/null || true
            done
            for np in $((SENTINEL_PORT + 10)) $((SENTINEL_PORT + 11)) $((SENTINEL_PORT + 12)); do
                [[ $RKIND == sentinel ]] || break
                cp -- "$CERB_STATE_DIR/sentinel-$np.log" "$KEEP/$scen-sentinel-$np.log" 2>/dev/null || true
            done
        fi
        say "  $scen: worker logs, config and oracle kept in $KEEP"
    fi
    if [[ $RKIND != redis ]]; then stop_server redis; fi
    if ((rc)); then
        FAILED=1
        say "scenario $scen: FAILED (seed $seed)"
    else
        say "scenario $scen: ok"
    fi
}

say "seed $SEED; scenarios: $SCENARIOS; ${SECONDS_EACH} s each; state $CERB_STATE_DIR"
i=0
for s in $SCENARIOS; do
    run_scenario "$s" $((SEED + i)) || FAILED=1
    i=$((i + 1))
done

echo
"$ORACLE" header
for r in "${ROWS[@]}"; do echo "$r"; done
echo
if ((FAILED)); then
    say "FAILED (seed $SEED)"
    exit 1
fi
say "all scenarios passed (seed $SEED)"
