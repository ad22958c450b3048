#!/usr/bin/env bash
#
# quickstart.sh — from a fresh checkout to a running demo in one command, in
# about two to three minutes on two cores:
#
#   1. install the missing Debian packages (scripts/deps.sh);
#   2. build Cerberus, Release, into build/ (the `cerberus` command, the
#      embed and orders examples and cerberus-bench only);
#   3. start a private redis-server, ZooKeeper and etcd on loopback
#      (scripts/servers.sh), on ports of their own, and prepare them for
#      their first use with `cerberus init`, as a new deployment would;
#   4. the `cerberus` command on those servers, in build/quickstart/ with
#      its ./cerberus.cfg (engines = ("redis", "zk"), a namespace of its
#      own): `cerberus status`; three `cerberus run demo-job -- CMD` started
#      at once, whose CMDs run one at a time (checked: the script fails if
#      two overlap, or a fencing token does not grow), with `cerberus
#      holders demo-job` while one holds; then running clients (two
#      processes of examples/embed taking the lock in a loop, and a
#      `cerberus run` holding it) while `cerberus switch zk` rewrites the
#      file: `status` shows zk active and epoch 2, the hold taken before
#      stays on redis until released, and the running clients' next grants
#      are on zk in epoch 2 (checked too); about ten seconds;
#   5. run examples/embed: several processes contend for one lock, each
#      printing when it holds it and with which fencing token, and a shared
#      counter proves that no two held it at once; then examples/orders:
#      several processes receive the same order requests (some repeated,
#      some failing once, one process killed mid-way) and the idempotency
#      guard creates exactly one order per request;
#   6. run a short `cerberus-bench --engine all --peers` on the three
#      servers: Cerberus, the raw ceiling and the peers (redis-py, Curator,
#      kazoo, python-etcd3, etcdctl) in one table, written to the terminal
#      and to build/quickstart/bench.txt, with build/quickstart/bench.json
#      and the picture build/quickstart/bench.png;
#   7. a live failover (bench/failover.sh): four clients lock in a loop on a
#      redis primary with ZooKeeper second; the primary is killed by its PID
#      and the library's switch shows, with the time from the kill to the
#      first grant on ZooKeeper (build/quickstart/failover.txt).
#
# Every server is started by scripts/servers.sh on its own port and state
# directory (so it never touches a system server or the test servers) and
# is stopped by its PID when this script exits, however it exits (an error,
# Ctrl-C), and so is every process it started in the background (with the
# processes they started). Every wait has a deadline. Each step prints a
# "==> " line and echoes its commands ("+ ...").
#
# Environment:
#   CERB_BUILD_DIR       build directory (default: <repo>/build; an existing
#                        configured tree is reused as it is)
#   CERB_QS_PORT         redis port (default 26479)
#   CERB_QS_ZK_PORT      ZooKeeper client port (default 22281)
#   CERB_QS_ETCD_PORT    etcd client port (default 22479; peer port + 1)
#   CERB_QS_FAILOVER_PORT  the redis primary the failover demo kills
#                        (default 26481)
#   CERB_QS_STATE_DIR    servers.sh state (default /tmp/cerberus-quickstart-$UID)
#   CERB_QS_PROCS        embed and orders: processes (default 4; orders at least 2)
#   CERB_QS_ITER         embed: acquisitions per process (default 3)
#   CERB_QS_DURATION     bench: seconds measured per side (default 2)
#   CERB_QS_THREADS      bench: uncontended thread counts (default 1,8)
#   CERB_QS_SKIP_CLI=1, CERB_QS_SKIP_BENCH=1, CERB_QS_SKIP_FAILOVER=1
#                        leave a step out
#   CERB_NO_INSTALL=1    never install packages

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/deps.sh
. "$ROOT/scripts/deps.sh"
# shellcheck source=scripts/stores.sh
. "$ROOT/scripts/stores.sh"

BUILD_DIR=${CERB_BUILD_DIR:-$ROOT/build}
OUT=$BUILD_DIR/quickstart
PORT=${CERB_QS_PORT:-26479}
ZK_PORT=${CERB_QS_ZK_PORT:-22281}
ETCD_PORT=${CERB_QS_ETCD_PORT:-22479}
FO_PORT=${CERB_QS_FAILOVER_PORT:-26481}
PROCS=${CERB_QS_PROCS:-4}
ITER=${CERB_QS_ITER:-3}
DURATION=${CERB_QS_DURATION:-2}
THREADS=${CERB_QS_THREADS:-1,8}
JOBS=$(nproc 2>/dev/null || echo 2)
# A state dir of its own: quickstart never stops a test fixture's server.
export CERB_STATE_DIR=${CERB_QS_STATE_DIR:-/tmp/cerberus-quickstart-${UID:-$(id -u)}}
SERVERS=$ROOT/scripts/servers.sh
T0=$SECONDS

step() { printf '\n==> [%3ds] %s\n' $((SECONDS - T0)) "$*"; }
run() {
    printf '+ %s\n' "$*"
    "$@"
}

cerb_check_ports "quickstart" PORT ZK_PORT ETCD_PORT FO_PORT

step "dependencies"
cerb_ensure_packages "${CERB_DEB_PACKAGES[@]}"

step "build ($BUILD_DIR, Release)"
cerb_release_tree "quickstart" "$BUILD_DIR"
run cmake --build "$BUILD_DIR" -j "$JOBS" --target cerberus_cli cerb_example_embed cerb_example_orders cerberus-bench
# The command: `init` below, and servers.sh prepares the failover demo's
# redis with it.
export CERBERUS_BIN=$BUILD_DIR/cli/cerberus
mkdir -p -- "$OUT"

# What this script started, stopped by PID on the way out (the servers by
# servers.sh stop, the background processes by stop_background): the EXIT
# trap runs on success, on failure (set -e) and after Ctrl-C/SIGTERM, whose
# traps turn into an exit.
BG_PIDS=()
CFG=""

die() {
    echo "quickstart: $*" >&2
    exit 1
}

# now_ms: milliseconds, for deadlines.
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }

# wait_until SECONDS WHAT CMD...: run CMD every 50 ms until it succeeds;
# fails (status 1, saying what it waited for) when SECONDS pass first.
wait_until() {
    local deadline=$(($(now_ms) + $1 * 1000)) what=$2
    shift 2
    until "$@"; do
        if (($(now_ms) >= deadline)); then
            echo "quickstart: no $what within the deadline" >&2
            return 1
        fi
        sleep 0.05
    done
}

# bg LOG CMD...: start CMD in the background, stdout and stderr appended to
# LOG, stdin /dev/null; its PID in BG_PID and in BG_PIDS (for the trap).
bg() {
    local log=$1
    shift
    "$@" >>"$log" 2>&1 </dev/null &
    BG_PID=$!
    BG_PIDS+=("$BG_PID")
}

# reap PID SECONDS: wait (bounded) for a background process to exit and set
# REAPED to its exit status; dies when it is still running after SECONDS.
reap() {
    local pid=$1 p rest=()
    wait_until "$2" "exit of process $pid" eval "! kill -0 $pid 2>/dev/null" ||
        die "process $pid still running after $2 s"
    REAPED=0
    wait "$pid" || REAPED=$?
    for p in "${BG_PIDS[@]}"; do [[ $p == "$pid" ]] || rest+=("$p"); done
    BG_PIDS=("${rest[@]}")
}

# descendants PID...: the PIDs of every live descendant of the PIDs (read
# from /proc, so no procps is needed).
descendants() {
    local -A kids=()
    local f st pid ppid
    local -a todo=("$@")
    for f in /proc/[0-9]*/stat; do
        { read -r st <"$f"; } 2>/dev/null || continue # gone meanwhile
        pid=${f#/proc/}
        pid=${pid%/stat}
        st=${st##*) } # after the command name: state, ppid, ...
        st=${st#* }
        ppid=${st%% *}
        kids[$ppid]+=" $pid"
    done
    while ((${#todo[@]})); do
        pid=${todo[0]}
        todo=("${todo[@]:1}")
        for f in ${kids[$pid]:-}; do
            echo "$f"
            todo+=("$f")
        done
    done
}

# pid_alive PID: the process exists and is not a zombie (a descendant
# reparented to a PID 1 that never reaps stays one).
pid_alive() {
    local st
    { read -r st <"/proc/$1/stat"; } 2>/dev/null || return 1
    st=${st##*) }
    [[ ${st%% *} != [ZX] ]]
}

# stop_background: SIGTERM to the background processes still running and
# to their descendants (all found before anything is signalled), SIGKILL
# to those left after 5 s.
stop_background() {
    local -a all=() alive=()
    local p deadline
    for p in "${BG_PIDS[@]}"; do
        pid_alive "$p" && all+=("$p")
    done
    ((${#all[@]})) || return 0
    mapfile -t -O "${#all[@]}" all < <(descendants "${all[@]}")
    echo "stopping background processes: ${all[*]}"
    kill -TERM "${all[@]}" 2>/dev/null || true
    deadline=$(($(now_ms) + 5000))
    while :; do
        alive=()
        for p in "${all[@]}"; do pid_alive "$p" && alive+=("$p"); done
        ((${#alive[@]})) || return 0
        (($(now_ms) < deadline)) || break
        sleep 0.05
    done
    echo "still running after 5 s, SIGKILL: ${alive[*]}"
    kill -KILL "${alive[@]}" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    step "cleanup: stopping what this script started"
    stop_background
    cerb_stores_stop
    # The failover demo's primary, should it have been interrupted.
    bash "$SERVERS" stop redis --port "$FO_PORT" >/dev/null 2>&1 || true
    [[ -n $CFG ]] && rm -f -- "$CFG"
    if ((rc == 0)); then
        printf '\nquickstart: done in %ds. Results in %s\n' $((SECONDS - T0)) "$OUT"
    else
        printf '\nquickstart: FAILED (status %d) after %ds\n' "$rc" $((SECONDS - T0)) >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "servers on loopback: redis :$PORT, ZooKeeper :$ZK_PORT, etcd :$ETCD_PORT (state in $CERB_STATE_DIR)"
# The redis stays unprepared here: the next step shows how a new one is.
# The three servers in one file (each engine with its defaults; the redis
# pool opens connections on demand, as many as threads call at once).
cerb_stores_start "$PORT" "$ZK_PORT" "$ETCD_PORT" "$OUT/stores.cfg" scripts/quickstart.sh
step "cerberus init: prepare the new stores (without it the first lock on the new redis waits a lease)"
run "$CERBERUS_BIN" -c "$OUT/stores.cfg" init

# ---- the `cerberus` command: run, status, holders, and a switch under
# running clients. In $OUT, on ./cerberus.cfg, as a user would type it.
if [[ ${CERB_QS_SKIP_CLI:-0} != 1 ]]; then
    cd "$OUT"
    export PATH="$BUILD_DIR/cli:$PATH" # `cerberus` by name
    unset CERBERUS_CONFIG              # ./cerberus.cfg, by the default lookup
    rm -f -- held release runs.log holder.log embed.log
    # A namespace of its own (redis db 1; zk root /quickstart-cli/locks,
    # whose parent keeps the zk records): the closure records a switch
    # leaves are permanent per namespace, and would refuse the later steps'
    # clients, whose files are at epoch 1, on the default one.
    cat >cerberus.cfg <<EOF
# written by scripts/quickstart.sh for its \`cerberus\` demo
# Engines in failover order; "auto": new locks go to the first healthy one.
engines = ("redis", "zk");
active = "auto";
epoch = 1;                      # bumped by \`cerberus switch\`
redis = { host = "127.0.0.1"; port = $PORT; db = 1; };
zk = { hosts = "127.0.0.1:$ZK_PORT"; root = "/quickstart-cli/locks"; };
EOF
    step "cerberus: two engines in ./cerberus.cfg (in $OUT), prepared and looked at"
    run cat cerberus.cfg
    run cerberus init
    run cerberus status

    NRUNS=3
    # shellcheck disable=SC2016 # expanded by the job's sh, not here
    JOB='echo "$(date +%T.%3N) start pid $$ token $CERBERUS_FENCING_TOKEN"; sleep 1; echo "$(date +%T.%3N) end   pid $$"'
    step "cerberus run: $NRUNS processes started at once on one name, demo-job: one runs at a time"
    printf "+ for i in %s; do cerberus run demo-job -- sh -c '%s' >>runs.log & done\n" \
        "$(seq -s ' ' "$NRUNS")" "$JOB"
    : >runs.log
    run_pids=()
    for ((i = 0; i < NRUNS; i++)); do
        bg runs.log cerberus run demo-job -- sh -c "$JOB"
        run_pids+=("$BG_PID")
    done
    # While the first holds: its owner, and the others queued behind it.
    wait_until 15 "start of a run" grep -q ' start ' runs.log
    queued() {
        cerberus holders demo-job >holders.txt 2>&1 &&
            [[ $(sed -n 's/^redis: waiting: //p' holders.txt | tr ',' '\n' | grep -c .) -ge $((NRUNS - 1)) ]]
    }
    wait_until 3 "queue of $((NRUNS - 1)) waiters" queued || true
    echo "+ cerberus holders demo-job"
    cat holders.txt
    for p in "${run_pids[@]}"; do
        reap "$p" 30
        ((REAPED == 0)) || die "cerberus run (pid $p) exited $REAPED: $(cat runs.log)"
    done
    run cat runs.log
    # Appends to one file are ordered: a start while another run's CMD has
    # not ended is an overlap. Tokens must grow from one holder to the next.
    awk -v n="$NRUNS" '
        $2 == "start" { if (cur != "") { print "OVERLAP: pid " $4 " started while pid " cur " ran"; bad = 1 }
                        if ($6 + 0 <= last + 0) { print "fencing token " $6 " not above " last; bad = 1 }
                        cur = $4; last = $6; starts++ }
        $2 == "end"   { if (cur != $4) { print "pid " $4 " ended while pid " cur " held"; bad = 1 }
                        cur = ""; ends++ }
        END { if (starts != n || ends != n) { print starts + 0 " starts, " ends + 0 " ends, " n " expected"; bad = 1 }
              exit bad }' runs.log ||
        die "cerberus run: the runs overlapped or misbehaved (runs.log above)"
    echo "checked: $NRUNS runs, one at a time, each token above the last" \
        "(a token is the epoch << 48 | the engine's counter)"

    step "cerberus switch zk: running clients move from redis to zk; a hold taken before stays on redis"
    # Running clients: two embed processes, each with one client opened on
    # the file now, taking demo-job in a loop (6 times each, 250 ms).
    run_bg() { # LOG CMD...: echo, then bg
        printf '+ %s >%s &\n' "${*:2}" "$1"
        bg "$@"
    }
    run_bg embed.log ../examples/embed -n 2 -i 6 -t 250 demo-job
    embed_pid=$BG_PID
    grants() { [[ $(grep -c " holds demo-job " embed.log) -ge $1 ]]; }
    wait_until 15 "first grants of the running clients" grants 2
    # A job that holds demo-job across the switch, until told to end.
    # shellcheck disable=SC2016
    HOLD='touch held; n=0; while [ ! -e release ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done'
    printf "+ cerberus -v run demo-job -- sh -c '%s' >holder.log &\n" "$HOLD"
    bg holder.log cerberus -v run demo-job -- sh -c "$HOLD"
    holder_pid=$BG_PID
    wait_until 15 "hold of the job" test -e held
    run cerberus holders demo-job
    run cerberus switch zk
    run cerberus status | tee status.txt
    { grep -q '^active: *zk$' status.txt && grep -q '^epoch: *2$' status.txt; } ||
        die "status after the switch: zk active and epoch 2 expected"
    # Each running process reloads the file and says so.
    switched() { [[ $(grep -c 'engine switch redis -> zk' "$1") -ge $2 ]]; }
    wait_until 10 "reload by the running clients" switched embed.log 2
    wait_until 10 "reload by the holding job" switched holder.log 1
    run cerberus holders demo-job | tee holders.txt
    grep -q '^redis: held by ' holders.txt || die "the hold taken before the switch is not on redis"
    echo "+ touch release    # the job ends: its redis hold is released, the waiters go on, on zk"
    touch release
    reap "$holder_pid" 20
    ((REAPED == 0)) || die "the job holding across the switch exited $REAPED: $(cat holder.log)"
    reap "$embed_pid" 30
    ((REAPED == 0)) || die "examples/embed exited $REAPED: $(cat embed.log)"
    run cat holder.log
    run cat embed.log
    # Epoch 1 grants on redis, then only epoch 2 grants on zk.
    awk '/ holds demo-job / { e = $8 + 0; on = $NF
            if ((e == 1 && on != "redis") || (e == 2 && on != "zk") || e < last) bad = 1
            last = e; n[e]++ }
         END { exit bad || !n[1] || !n[2] }' embed.log ||
        die "the running clients' grants: epoch 1 on redis, then epoch 2 on zk expected"
    echo "checked: the running clients' grants were on redis in epoch 1, then on zk in epoch 2"
    run cerberus run -w 10000 demo-job -- cerberus holders demo-job | tee holders.txt
    { grep -q '^zk: held by ' holders.txt && grep -qx 'redis: free' holders.txt; } ||
        die "a new cerberus run after the switch is not on zk"
    cd "$ROOT"
fi

# The example config, pointed at this server.
CFG=$(mktemp "${TMPDIR:-/tmp}/cerberus-quickstart.XXXXXX.cfg")
sed "s/port = 6379;/port = $PORT;/" "$ROOT/examples/cerberus.cfg" >"$CFG"

step "examples/embed: $PROCS processes x $ITER acquisitions of one lock"
run "$BUILD_DIR/examples/embed" -c "$CFG" -n "$PROCS" -i "$ITER" quickstart-demo

step "examples/orders: $PROCS processes, the same order requests, one order each"
run "$BUILD_DIR/examples/orders" -c "$CFG" -n "$((PROCS < 2 ? 2 : PROCS))"

if [[ ${CERB_QS_SKIP_BENCH:-0} != 1 ]]; then
    step "cerberus-bench --engine all --peers (${DURATION}s per side; uncontended x$THREADS, handoff x8)"
    run "$BUILD_DIR/bench/cerberus-bench" -c "$OUT/stores.cfg" --engine all --peers \
        --scenario uncontended,handoff --threads "$THREADS" --duration "$DURATION" \
        --json "$OUT/bench.json" --plot "$OUT/bench.png" | tee "$OUT/bench.txt"
    echo "table: $OUT/bench.txt  JSON: $OUT/bench.json  plot: $OUT/bench.png"
fi

if [[ ${CERB_QS_SKIP_FAILOVER:-0} != 1 ]]; then
    step "failover: redis :$FO_PORT (primary, killed by PID) then ZooKeeper :$ZK_PORT"
    run env PORT="$FO_PORT" SECONDARY=zk ZK_PORT="$ZK_PORT" FLAP_S=0 LEASE_MS=3000 \
        bash "$ROOT/bench/failover.sh" "$BUILD_DIR/bench/cerberus-bench" \
        --json "$OUT/failover.json" | tee "$OUT/failover.txt"
fi
