#!/usr/bin/env bash
# failover.sh — run cerberus-bench's failover scenario against test servers:
# a redis primary (killed with kill -9 and restarted by scripts/servers.sh)
# and a secondary engine (default: local; `SECONDARY=zk` or `etcd` starts
# that server too). Prints the bench's table; JSON with --json FILE.
#
#   bench/failover.sh [BENCH] [extra cerberus-bench args...]
#
# Environment: PORT (redis, default 26551), LEASE_MS (default 3000),
# FLAP_S (default 30), SECONDARY (local|zk|etcd).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${1:-$ROOT/build/bench/cerberus-bench}
shift || true
PORT=${PORT:-26551}
LEASE_MS=${LEASE_MS:-3000}
FLAP_S=${FLAP_S:-30}
SECONDARY=${SECONDARY:-local}
export CERB_STATE_DIR=${CERB_STATE_DIR:-$(mktemp -d /tmp/cerb-failover-XXXXXX)}
work=$(mktemp -d /tmp/cerb-failover-cfg-XXXXXX)
servers=$ROOT/scripts/servers.sh

cleanup() {
    "$servers" stop redis --port "$PORT" >/dev/null 2>&1 || true
    case $SECONDARY in zk | etcd) "$servers" stop "$SECONDARY" >/dev/null 2>&1 || true ;; esac
    rm -rf "$work"
}
trap cleanup EXIT

"$servers" start redis --port "$PORT" >/dev/null
case $SECONDARY in zk | etcd) "$servers" start "$SECONDARY" >/dev/null ;; esac
second=""
case $SECONDARY in
    zk) second='zk = { hosts = "127.0.0.1:22181"; session_timeout_ms = 4000; };' ;;
    etcd) second='etcd = { endpoints = ("http://127.0.0.1:22379"); session_ttl_s = 5; };' ;;
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

pidfile=$CERB_STATE_DIR/redis-$PORT.pid
"$BENCH" -c "$work/default.cfg" --scenario failover --grace0-config "$work/grace0.cfg" \
    --fail-cmd "kill -9 \$(cat $pidfile)" \
    --restore-cmd "$servers start redis --port $PORT >/dev/null" \
    --flap "$FLAP_S" "$@"
