#!/usr/bin/env bash
# failover.sh — run cerberus-bench's failover scenario against test servers:
# a redis primary (killed with kill -9 by its PID and restarted by
# scripts/servers.sh) and a secondary engine (default: local; `SECONDARY=zk`
# or `etcd` uses that server on ZK_PORT / ETCD_PORT, starting it when it is
# not running). Four clients lock and unlock in a loop; the bench kills the
# primary and prints, for switch_grace_ms = 0 and for the safe default, how
# long after the kill the first grant on the secondary came, then (FLAP_S >
# 0) how often a flapping primary made the clients switch. The library's
# own "engine switch" lines show on stderr as they happen. JSON with --json
# FILE.
#
#   bench/failover.sh [BENCH] [extra cerberus-bench args...]
#
# Servers this script started are stopped by PID when it exits, however it
# exits; a secondary that was already running is left running.
#
# Environment: PORT (redis primary, default 26551), SECONDARY (local|zk|etcd),
# ZK_PORT (default 22181), ETCD_PORT (default 22379), LEASE_MS (default
# 3000), FLAP_S (default 30), CERB_STATE_DIR (servers.sh state; default a
# fresh temporary directory).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${1:-$ROOT/build/bench/cerberus-bench}
shift || true
PORT=${PORT:-26551}
ZK_PORT=${ZK_PORT:-22181}
ETCD_PORT=${ETCD_PORT:-22379}
LEASE_MS=${LEASE_MS:-3000}
FLAP_S=${FLAP_S:-30}
SECONDARY=${SECONDARY:-local}
case $SECONDARY in local | zk | etcd) ;;
    *) echo "failover.sh: SECONDARY must be local, zk or etcd" >&2; exit 2 ;; esac
[[ -x $BENCH ]] || { echo "failover.sh: $BENCH is not built" >&2; exit 2; }
export CERB_STATE_DIR=${CERB_STATE_DIR:-$(mktemp -d /tmp/cerb-failover-XXXXXX)}
work=$(mktemp -d /tmp/cerb-failover-cfg-XXXXXX)
servers=$ROOT/scripts/servers.sh
case $SECONDARY in zk) sport=$ZK_PORT ;; etcd) sport=$ETCD_PORT ;; *) sport="" ;; esac
started_secondary=0

cleanup() {
    "$servers" stop redis --port "$PORT" >/dev/null 2>&1 || true
    if ((started_secondary)); then
        "$servers" stop "$SECONDARY" --port "$sport" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$servers" start redis --port "$PORT" >/dev/null
if [[ -n $sport ]] && ! "$servers" status "$SECONDARY" --port "$sport" >/dev/null 2>&1; then
    started_secondary=1
    "$servers" start "$SECONDARY" --port "$sport" >/dev/null
fi
second=""
case $SECONDARY in
    zk) second="zk = { hosts = \"127.0.0.1:$ZK_PORT\"; session_timeout_ms = 4000; };" ;;
    etcd) second="etcd = { endpoints = (\"http://127.0.0.1:$ETCD_PORT\"); session_ttl_s = 5; };" ;;
esac

write_cfg() { # FILE GRACE
    cat >"$1" <<CFG
engines = ("redis", "$SECONDARY");
redis = { port = $PORT; op_timeout_ms = 200; connect_timeout_ms = 200; };
$second
lock = { lease_ms = $LEASE_MS; };
retry = { max = 1; backoff_ms = 5; backoff_max_ms = 20; };
failover = { probe_interval_ms = 250; probe_timeout_ms = 200; switch_grace_ms = $2;
  failback_after_ms = 5000; watch_config = false; };
CFG
}
write_cfg "$work/default.cfg" -1
write_cfg "$work/grace0.cfg" 0

# The kill names the PID it signals, so the demo shows what died.
pidfile=$CERB_STATE_DIR/redis-$PORT.pid
fail_cmd="pid=\$(cat $pidfile) && echo \"failover.sh: kill -9 \$pid (redis primary :$PORT)\" >&2 && kill -9 \$pid"
"$BENCH" -c "$work/default.cfg" --scenario failover --grace0-config "$work/grace0.cfg" \
    --fail-cmd "$fail_cmd" \
    --restore-cmd "$servers start redis --port $PORT >/dev/null" \
    --flap "$FLAP_S" "$@"
