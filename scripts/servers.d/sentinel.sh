# shellcheck shell=bash
# scripts/servers.d/sentinel.sh — a Redis Sentinel deployment for the tests,
# sourced by scripts/servers.sh (which provides redis_start_one,
# redis_stop_one, redis_answer, pid_alive, kill_pid, read_pid, say, die).
#
#   scripts/servers.sh start|stop|status sentinel [--port P]
#
# One master on P, two replicas on P+1 and P+2 (replicaof the master), and
# three sentinels on P+10..P+12 (`redis-server FILE --sentinel`) monitoring
# the master as "cerbmaster" with quorum 2, down-after 1000 ms and a
# failover timeout of 5000 ms, so a killed master is replaced in about two
# seconds. Base port: --port, $CERB_SENTINEL_PORT or 26500. The data nodes
# are plain redis nodes of servers.sh (redis-<port>.pid/.dir/.log); each
# sentinel keeps sentinel-<port>.pid, .dir (its config file lives there:
# sentinels rewrite it) and .log. `start` returns once every sentinel sees
# the master, both replicas and the two other sentinels. Loopback only;
# everything is stopped by PID.

SENTINEL_MASTER=${CERB_SENTINEL_MASTER:-cerbmaster}

sentinel_base() { printf '%s' "${OPT_PORT:-${CERB_SENTINEL_PORT:-26500}}"; }

sentinel_cli() {
    timeout 5 "$REDIS_CLI" -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null
}

sentinel_start_one() {
    local port=$1 master=$2
    local pidf="$STATE_DIR/sentinel-$port.pid" dirf="$STATE_DIR/sentinel-$port.dir"
    local logf="$STATE_DIR/sentinel-$port.log" pid data deadline
    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid" && redis_answer "$port" "$pid"; then
        say "sentinel :$port already running (pid $pid)"
        return 0
    fi
    rm -f -- "$pidf"
    [[ -f $dirf ]] && remove_data_dir "$dirf"
    data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-sentinel-$port.XXXXXX")
    printf '%s\n' "$data" >"$dirf"
    cat >"$data/sentinel.conf" <<CONF
bind 127.0.0.1
port $port
protected-mode yes
dir $data
sentinel monitor $SENTINEL_MASTER 127.0.0.1 $master 2
sentinel down-after-milliseconds $SENTINEL_MASTER 1000
sentinel failover-timeout $SENTINEL_MASTER 5000
sentinel parallel-syncs $SENTINEL_MASTER 1
CONF
    setsid "$REDIS_SERVER" "$data/sentinel.conf" --sentinel --daemonize no --logfile "" \
        </dev/null >"$logf" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidf"
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until redis_answer "$port" "$pid"; do
        pid_alive "$pid" || { tail -n 20 "$logf" >&2; die "sentinel :$port exited during startup"; }
        (($(now_ms) < deadline)) || { kill_pid "$pid" "sentinel :$port"; die "sentinel :$port did not answer"; }
        sleep 0.05
    done
    say "sentinel :$port started (pid $pid)"
}

# sentinel_ready PORT: this sentinel knows the master, 2 replicas, 2 peers.
sentinel_ready() {
    local out
    out=$(sentinel_cli "$1" SENTINEL master "$SENTINEL_MASTER" | tr '\n' ' ') || return 1
    [[ $out == *"num-slaves 2 "* && $out == *"num-other-sentinels 2 "* ]]
}

sentinel_start() {
    local base i p deadline
    base=$(sentinel_base)
    redis_start_one "$base"
    for i in 1 2; do
        REDIS_EXTRA_ARGS=(--replicaof 127.0.0.1 "$base")
        REDIS_NO_MARKER=1 redis_start_one $((base + i))
    done
    REDIS_EXTRA_ARGS=()
    # Both replicas in sync before the sentinels look.
    deadline=$(($(now_ms) + WAIT_S * 1000))
    for i in 1 2; do
        until [[ $(sentinel_cli $((base + i)) INFO replication) == *"master_link_status:up"* ]]; do
            (($(now_ms) < deadline)) || die "replica :$((base + i)) did not sync with :$base"
            sleep 0.05
        done
    done
    for i in 10 11 12; do sentinel_start_one $((base + i)) "$base"; done
    deadline=$(($(now_ms) + 30000))
    for i in 10 11 12; do
        until sentinel_ready $((base + i)); do
            (($(now_ms) < deadline)) || die "sentinel :$((base + i)) did not see the whole deployment within 30 s"
            sleep 0.1
        done
    done
    say "sentinel deployment ready: master :$base, replicas :$((base + 1)) :$((base + 2)), sentinels :$((base + 10))-:$((base + 12))"
}

sentinel_stop() {
    local base i p pid
    base=$(sentinel_base)
    for i in 10 11 12; do
        p=$((base + i))
        pid=$(read_pid "$STATE_DIR/sentinel-$p.pid")
        if [[ -n $pid ]] && pid_alive "$pid"; then
            kill -CONT "$pid" 2>/dev/null || true
            kill_pid "$pid" "sentinel :$p"
        fi
        rm -f -- "$STATE_DIR/sentinel-$p.pid"
        [[ -f $STATE_DIR/sentinel-$p.dir ]] && remove_data_dir "$STATE_DIR/sentinel-$p.dir"
    done
    for i in 0 1 2; do redis_stop_one $((base + i)); done
}

sentinel_status() {
    local base i rc=0 out
    base=$(sentinel_base)
    for i in 0 1 2; do redis_status_one $((base + i)) || rc=1; done
    for i in 10 11 12; do
        if out=$(sentinel_cli $((base + i)) SENTINEL get-master-addr-by-name "$SENTINEL_MASTER"); then
            say "sentinel :$((base + i)) says master is $(echo $out | tr ' ' ':')"
        else
            say "sentinel :$((base + i)) not answering"
            rc=1
        fi
    done
    return $rc
}
