# shellcheck shell=bash
# scripts/servers.d/cluster.sh — a Redis Cluster for the tests, sourced by
# scripts/servers.sh (which provides redis_start_one, redis_stop_one,
# redis_cli, now_ms, say, die).
#
#   scripts/servers.sh start|stop|status cluster [--port P]
#
# Six cluster-enabled redis nodes on P..P+5 (bus ports P+10000..P+10005, or
# P-10000.. when those are ephemeral ports: cluster_bus_port),
# each a plain redis node of servers.sh (redis-<port>.pid/.dir/.log, its
# nodes.conf in its data dir), joined by `redis-cli --cluster create …
# --cluster-replicas 1 --cluster-yes`: three masters with one replica each.
# cluster-node-timeout is 2000 ms, so a killed master's replica takes over in
# about four seconds. `start` returns once every node reports
# cluster_state:ok, agrees on the six nodes, and every replica's link to its
# master is up (a replica that never synced refuses to fail over). Base port:
# --port, $CERB_CLUSTER_PORT or 27100. Stopped by PID, like every node.
#
# Cerberus keeps one data-loss marker per slot (engine_redis/redis_marker.h:
# "{<tag>}<prefix>\x1fcerberus", <tag> the smallest decimal number that
# hashes to the slot). A cluster started empty here is prepared with
# `cerberus init` (servers.sh: cerberus_init), which writes every slot's
# marker on its master with the master's replication id and waits for the
# replicas to have them, so clients do not quarantine each slot for a lease
# on first use. CERB_REDIS_UNMARKED=1 leaves it unprepared.

cluster_base() { printf '%s' "${OPT_PORT:-${CERB_CLUSTER_PORT:-27100}}"; }

# cluster_bus_port PORT: the node's cluster bus port, PORT + 10000 as Redis
# does by default, or PORT - 10000 when that would fall in Linux's ephemeral
# range (32768-60999): there any outgoing connection, even one in TIME-WAIT
# (seen: 127.0.0.1:37102 -> :26379), makes the bind fail for a minute.
cluster_bus_port() {
    local bus=$(($1 + 10000))
    ((bus < 32768 || bus > 60999)) || bus=$(($1 - 10000))
    printf '%s' "$bus"
}

# cluster_ok PORT: the node says cluster_state:ok and knows six nodes.
cluster_ok() {
    local info
    info=$(redis_cli "$1" CLUSTER INFO | tr -d '\r') || return 1
    [[ $info == *"cluster_state:ok"* && $info == *"cluster_known_nodes:6"* ]]
}

# cluster_replica_up PORT: the node sees three replicas in the cluster, and
# it is a master or a replica whose link to its master is up.
cluster_replica_up() {
    local info nodes
    nodes=$(redis_cli "$1" CLUSTER NODES) || return 1
    (($(grep -cE ' (myself,)?slave ' <<<"$nodes") == 3)) || return 1
    info=$(redis_cli "$1" INFO replication | tr -d '\r') || return 1
    [[ $info == *"role:master"* || $info == *"master_link_status:up"* ]]
}

# cluster_init BASE: `cerberus init` on the six nodes. The operation
# timeout is long because init waits half of it for the replicas.
cluster_init() {
    local base=$1 i nodes=""
    for i in 0 1 2 3 4 5; do nodes+="${nodes:+, }\"127.0.0.1:$((base + i))\""; done
    cerberus_init "cluster :$base" "engines = (\"redis\");
redis = { mode = \"cluster\"; nodes = ($nodes); op_timeout_ms = 5000; };"
}

cluster_start() {
    local base i p deadline nodes=()
    base=$(cluster_base)
    for i in 0 1 2 3 4 5; do
        p=$((base + i))
        REDIS_EXTRA_ARGS=(--cluster-enabled yes --cluster-config-file nodes.conf
            --cluster-port "$(cluster_bus_port "$p")" --cluster-node-timeout 2000
            --repl-diskless-sync yes --repl-diskless-sync-delay 0)
        REDIS_NO_MARKER=1 redis_start_one "$p"
        nodes+=("127.0.0.1:$p")
    done
    REDIS_EXTRA_ARGS=()
    if ! cluster_ok "$base"; then
        timeout 60 "$REDIS_CLI" --cluster create "${nodes[@]}" --cluster-replicas 1 \
            --cluster-yes >"$STATE_DIR/cluster-$base.create.log" 2>&1 ||
            { tail -n 20 "$STATE_DIR/cluster-$base.create.log" >&2; die "redis-cli --cluster create failed"; }
        deadline=$(($(now_ms) + 30000))
        for i in 0 1 2 3 4 5; do
            until cluster_ok $((base + i)) && cluster_replica_up $((base + i)); do
                (($(now_ms) < deadline)) || die "cluster node :$((base + i)) not ready within 30 s"
                sleep 0.1
            done
        done
        [[ ${CERB_REDIS_UNMARKED:-0} == 1 ]] || cluster_init "$base"
    fi
    say "cluster ready: nodes :$base-:$((base + 5)) (3 masters, 3 replicas)"
}

cluster_stop() {
    local base i
    base=$(cluster_base)
    for i in 0 1 2 3 4 5; do redis_stop_one $((base + i)); done
    rm -f -- "$STATE_DIR/cluster-$base.create.log"
}

cluster_status() {
    local base i rc=0
    base=$(cluster_base)
    for i in 0 1 2 3 4 5; do
        redis_status_one $((base + i)) || rc=1
    done
    if cluster_ok "$base"; then say "cluster state ok"; else say "cluster state not ok"; rc=1; fi
    return $rc
}
