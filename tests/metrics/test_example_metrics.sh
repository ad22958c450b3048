#!/usr/bin/env bash
# test_example_metrics.sh EXAMPLE CFG — examples/metrics_http end to end: start
# it on a free loopback port with a lock loop on the test server, scrape
# /metrics with curl until the worker's grants show (bounded), parse each
# answer with Prometheus' parser (check_metrics.py), check a 404 for another
# path, and that the example exits 0 once it has given its -n answers.
set -u
EXAMPLE=$1 CFG=$2
PY=${CERB_PYTHON:-/usr/bin/python3}
CHECK="$(dirname "$0")/check_metrics.py"
N=40
WORK=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null; rm -rf "$WORK"' EXIT

"$EXAMPLE" -c "$CFG" -p 0 -n "$N" "example-metrics-$$" >"$WORK/out" 2>"$WORK/err" &
PID=$!
PORT=""
for _ in $(seq 100); do # up to 10 s for "listening on PORT"
    PORT=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$WORK/out")
    [ -n "$PORT" ] && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "not ok: no port ($(cat "$WORK/err"))"; exit 1; }

served=0
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$PORT/other")
served=$((served + 1))
[ "$code" = 404 ] || { echo "not ok: /other gave $code"; exit 1; }
granted=0
while [ "$served" -lt $((N - 1)) ]; do
    curl -sf --max-time 10 "http://127.0.0.1:$PORT/metrics" >"$WORK/m" \
        || { echo "not ok: scrape failed"; exit 1; }
    served=$((served + 1))
    "$PY" "$CHECK" "$WORK/m" 'cerberus_engine_active{engine="redis"}=1' >"$WORK/check" \
        || { echo "not ok: the scrape does not parse or is wrong:"; cat "$WORK/check"; exit 1; }
    if "$PY" "$CHECK" "$WORK/m" 'cerberus_acquisitions_total{engine="redis"}>0' \
        'cerberus_acquire_wait_seconds_count{engine="redis"}>0' >/dev/null; then
        granted=1
        break
    fi
    sleep 0.1
done
[ "$granted" = 1 ] || { echo "not ok: no grant in $served scrapes"; exit 1; }
while [ "$served" -lt "$N" ]; do # use up the example's answers
    curl -s -o /dev/null --max-time 10 "http://127.0.0.1:$PORT/other"
    served=$((served + 1))
done
for _ in $(seq 100); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
wait "$PID"
rc=$?
[ "$rc" = 0 ] || { echo "not ok: example exited $rc: $(cat "$WORK/err")"; exit 1; }
echo "ok: /metrics served and parsed ($served answers)"
