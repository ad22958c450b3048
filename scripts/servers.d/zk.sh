# shellcheck shell=bash
#
# servers.d/zk.sh — ZooKeeper for scripts/servers.sh (sourced; it provides
# say, die, pid_alive, proc_state, pid_cmdline, read_pid, kill_pid,
# remove_data_dir, now_ms, $STATE_DIR, $WAIT_S, $CMD, $OPT_PORT, $OPT_NODES).
#
#   scripts/servers.sh start|stop|status zk [--nodes N] [--port P]
#
# A real ZooKeeper from Debian's jars (packages zookeeper, libslf4j-java,
# default-jre-headless), run in the foreground of a detached JVM:
#   java -Dzookeeper.admin.enableServer=false -cp zookeeper.jar:
#        zookeeper-jute.jar:slf4j-simple.jar QuorumPeerMain <dir>/zoo.cfg
# One temporary directory per node holds zoo.cfg, myid and the data. The
# client port is base + i (base: --port, $CERB_ZK_PORT or 22181), bound to
# 127.0.0.1 only; an ensemble (--nodes N > 1) talks on quorum ports
# base + 707 + i and election ports base + 1707 + i (22888+ and 23888+ for
# the default base, as DESIGN.md §9 says), overridable with
# $CERB_ZK_QUORUM_BASE and $CERB_ZK_ELECTION_BASE.
#
# tickTime is 500 ms so that sessions of 1–60 s are allowed (the server
# clamps a session timeout to [minSessionTimeout, maxSessionTimeout]; the
# tests use 2–8 s sessions to watch a lost session happen quickly). Nothing
# is kept (forceSync=no: no fsync per transaction, as the test redis saves
# nothing), and empty CONTAINER parents (the lock names) are removed every
# 5 s instead of every minute. The JVM gets a small heap and the serial
# collector: the test machine has 2 cores that the clients under test need
# too.
#
# Readiness is the `srvr` four-letter word printing "Mode:" (standalone,
# leader or follower): `ruok` answers "imok" before the server serves
# requests, `srvr` only once it does. The four-letter words are sent with
# bash's /dev/tcp under `timeout`, because a SIGSTOPped server accepts the
# connection and never answers. An ensemble is started whole, then every
# node is awaited (they need each other for a quorum).
#
# Idempotence and ownership as for redis: a node whose PID file names a live
# process whose command line names this node's zoo.cfg and that answers is
# left alone (continued if SIGSTOPped); stale state is cleaned; stop signals
# exactly the recorded PIDs, never a process found by name.

ZK_JAVA=${ZK_JAVA:-java}
ZK_JARS=${ZK_JARS:-/usr/share/java}

zk_default_port() { printf '%s' "${CERB_ZK_PORT:-22181}"; }

# zk_4lw PORT WORD: send a four-letter word, print the answer (bounded).
zk_4lw() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "%s" "$2" >&3
        cat <&3' _ "$1" "$2" 2>/dev/null
}

# zk_mode PORT: "standalone", "leader" or "follower" once the node serves.
zk_mode() {
    local out
    out=$(zk_4lw "$1" srvr) || return 1
    [[ $out =~ Mode:\ ([a-z]+) ]] || return 1
    printf '%s' "${BASH_REMATCH[1]}"
}

# zk_is_ours PID PORT: PID is the JVM we started for the node on PORT (its
# command line names that node's zoo.cfg, in a dir made by zk_start_one).
zk_is_ours() {
    local cmd
    cmd=$(pid_cmdline "$1")
    [[ $cmd == *QuorumPeerMain* && $cmd == *"/cerberus-zk-$2."*"/zoo.cfg"* ]]
}

# zk_ports: the client ports to act on (engine_ports in servers.sh).
zk_ports() { engine_ports zk "$(zk_default_port)" 1; }


# zk_launch PORT ID N BASE: write a fresh node dir and start the JVM.
zk_launch() {
    local port=$1 id=$2 n=$3 base=$4
    local pidf="$STATE_DIR/zk-$port.pid" dirf="$STATE_DIR/zk-$port.dir"
    local logf="$STATE_DIR/zk-$port.log"
    local qbase=${CERB_ZK_QUORUM_BASE:-$((base + 707))}
    local ebase=${CERB_ZK_ELECTION_BASE:-$((base + 1707))}
    local data i pid

    data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-zk-$port.XXXXXX")
    printf '%s\n' "$data" >"$dirf"
    {
        echo "tickTime=500"
        echo "initLimit=20"
        echo "syncLimit=10"
        echo "minSessionTimeout=1000"
        echo "maxSessionTimeout=60000"
        echo "dataDir=$data"
        echo "forceSync=no"
        echo "clientPort=$port"
        echo "clientPortAddress=127.0.0.1"
        echo "maxClientCnxns=0"
        echo "admin.enableServer=false"
        echo "4lw.commands.whitelist=ruok,srvr,mntr"
        if ((n > 1)); then
            for ((i = 0; i < n; i++)); do
                echo "server.$((i + 1))=127.0.0.1:$((qbase + i)):$((ebase + i))"
            done
        fi
    } >"$data/zoo.cfg"
    printf '%s\n' "$id" >"$data/myid"

    # setsid and redirected stdio detach it (ctest waits for a fixture's
    # output pipe to close); 9>&- keeps the state-dir lock out of the JVM.
    setsid "$ZK_JAVA" -Xms32m -Xmx256m -XX:+UseSerialGC -XX:-UsePerfData \
        -Djava.net.preferIPv4Stack=true \
        -Dzookeeper.admin.enableServer=false \
        -Dznode.container.checkIntervalMs=5000 \
        -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
        -Dorg.slf4j.simpleLogger.showDateTime=true \
        -cp "$ZK_JARS/zookeeper.jar:$ZK_JARS/zookeeper-jute.jar:$ZK_JARS/slf4j-simple.jar" \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$data/zoo.cfg" \
        </dev/null >"$logf" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidf"
}

# zk_await PORT: wait until the node serves; on failure clean it up and die.
zk_await() {
    local port=$1 pid mode deadline
    local pidf="$STATE_DIR/zk-$port.pid" dirf="$STATE_DIR/zk-$port.dir"
    local logf="$STATE_DIR/zk-$port.log"
    pid=$(read_pid "$pidf")
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until mode=$(zk_mode "$port"); do
        if ! pid_alive "$pid"; then
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "zk :$port exited during startup (log: $logf)"
        fi
        if (($(now_ms) >= deadline)); then
            kill_pid "$pid" "zk :$port"
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "zk :$port did not serve (srvr Mode:) within ${WAIT_S}s (log: $logf)"
        fi
        sleep 0.05
    done
    say "zk :$port serving as $mode (pid $pid, data $(cat "$dirf" 2>/dev/null))"
}

zk_start() {
    command -v "$ZK_JAVA" >/dev/null || die "$ZK_JAVA not found (Debian package default-jre-headless)"
    local jar
    for jar in zookeeper.jar zookeeper-jute.jar slf4j-simple.jar; do
        [[ -f $ZK_JARS/$jar ]] ||
            die "$ZK_JARS/$jar not found (Debian packages zookeeper, libslf4j-java)"
    done
    local -a ports launched=()
    local port pid base n id=0
    mapfile -t ports < <(zk_ports)
    base=${ports[0]}
    n=${#ports[@]}
    for port in "${ports[@]}"; do
        id=$((id + 1))
        local pidf="$STATE_DIR/zk-$port.pid" dirf="$STATE_DIR/zk-$port.dir"
        pid=$(read_pid "$pidf")
        if [[ -n $pid ]] && pid_alive "$pid" && zk_is_ours "$pid" "$port"; then
            if [[ $(proc_state "$pid") == T ]]; then
                say "zk :$port (pid $pid) was stopped (SIGSTOP); continuing it"
                kill -CONT "$pid" 2>/dev/null || true
            fi
            launched+=("$port")
            continue
        fi
        if [[ -n $pid || -f $pidf || -f $dirf ]]; then
            say "zk :$port: removing stale state (pid ${pid:-none})"
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
        fi
        if zk_4lw "$port" srvr >/dev/null; then
            die "port $port already has a server that is not ours (state dir $STATE_DIR)"
        fi
        zk_launch "$port" "$id" "$n" "$base"
        launched+=("$port")
    done
    for port in "${launched[@]}"; do zk_await "$port"; done
}

zk_stop() {
    local port pid any=0
    for port in $(zk_ports); do
        any=1
        local pidf="$STATE_DIR/zk-$port.pid" dirf="$STATE_DIR/zk-$port.dir"
        pid=$(read_pid "$pidf")
        if [[ -n $pid ]] && pid_alive "$pid"; then
            if zk_is_ours "$pid" "$port"; then
                kill_pid "$pid" "zk :$port"
                say "zk :$port stopped (pid $pid)"
            else
                say "zk :$port: pid $pid is no longer our server; not signalling it"
            fi
        elif [[ -n $pid ]]; then
            say "zk :$port was not running (stale pid $pid)"
        else
            say "zk :$port is not running"
        fi
        rm -f -- "$pidf"
        remove_data_dir "$dirf"
    done
    ((any)) || say "no zk recorded in $STATE_DIR"
}

zk_status() {
    local port pid mode rc=0 any=0
    for port in $(zk_ports); do
        any=1
        pid=$(read_pid "$STATE_DIR/zk-$port.pid")
        if [[ -z $pid ]]; then
            say "zk :$port not running"
            rc=1
        elif ! pid_alive "$pid" || ! zk_is_ours "$pid" "$port"; then
            say "zk :$port stale (pid $pid gone)"
            rc=1
        elif [[ $(proc_state "$pid") == T ]]; then
            say "zk :$port paused (pid $pid, SIGSTOPped)"
            rc=1
        elif mode=$(zk_mode "$port"); then
            say "zk :$port running as $mode (pid $pid)"
        else
            say "zk :$port not serving (pid $pid)"
            rc=1
        fi
    done
    if ((!any)); then
        say "no zk recorded in $STATE_DIR"
        rc=1
    fi
    return $rc
}
