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
# hashes to the slot). A cluster started empty here is marked in every slot,
# with its master's replication id, so clients do not quarantine each slot
# for a lease on first use. Marking needs redis-py (python3-redis) for the
# slot hash; without it the cluster is left unmarked.

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

# cluster_mark BASE: write every slot's marker on the master that owns it.
cluster_mark() {
    local base=$1 py=${CERB_PYTHON:-/usr/bin/python3}
    [[ -x $py ]] || py=python3
    if ! "$py" -c 'import redis.crc' 2>/dev/null; then
        say "cluster: python3-redis missing; slots left unmarked (clients quarantine each slot once)"
        return 0
    fi
    "$py" - "$base" <<'PY' || die "cluster: could not write the Cerberus markers"
import sys, time, redis
from redis.crc import key_slot
base = int(sys.argv[1])
owner = {}
c = redis.Redis(host="127.0.0.1", port=base, socket_timeout=5)
for lo, hi, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
    for s in range(lo, hi + 1):
        owner[s] = int(master[1])
tags, n = {}, 0
while len(tags) < 16384:
    s = key_slot(str(n).encode())
    tags.setdefault(s, str(n))
    n += 1
stamp = "servers.sh-%d-%d" % (base, int(time.time() * 1000))
by_port = {}
for s, tag in tags.items():
    by_port.setdefault(owner[s], []).append(tag)
for port, ts in by_port.items():
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    replid = r.info("replication").get("master_replid", "")
    p = r.pipeline(transaction=False)
    for t in ts:
        p.set("{%s}\x1fcerberus" % t, "%s 0 %s" % (stamp, replid))
    p.execute()
    r.execute_command("WAIT", 1, 5000)  # the replica has them before anyone kills us
PY
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
        cluster_mark "$base"
        # The markers replicated (WAIT above): every replica's view is whole.
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
