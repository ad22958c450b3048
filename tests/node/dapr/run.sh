#!/usr/bin/env bash
# run.sh — the real Dapr JS SDK against `cerberus serve`'s Dapr façade
# (ctest: node_dapr_sdk). Copies package.json and package-lock.json to
# WORKDIR and installs them there with `npm ci --ignore-scripts` (pinned
# by the lockfile; skipped when the lockfile has not changed since the last
# install); checks that refused --dapr-store/--dapr-app-id values exit 64;
# starts `cerberus serve` on 127.0.0.1:PORT with a token, the local engine,
# --dapr-store locks and --dapr-app-id sdk-app; runs `node --test` on
# dapr.test.mjs with the daemon's address, token and store in the
# environment; stops the daemon by its PID.
#
# Usage: run.sh PATH/TO/cerberus WORKDIR PORT
#
# Exit status: node's (0 all passed); 77 (ctest's skip) with a message when
# node or npm is missing or npm cannot install (no registry, no cache); 1
# when the daemon does not start. Waits are on a condition with a
# deadline; nothing sleeps to synchronise.

set -u

CERBERUS=${1:?usage: run.sh PATH/TO/cerberus WORKDIR PORT}
WORK=${2:?usage: run.sh PATH/TO/cerberus WORKDIR PORT}
PORT=${3:?usage: run.sh PATH/TO/cerberus WORKDIR PORT}
HERE=$(cd "$(dirname "$0")" && pwd)
PID=
TMP=$(mktemp -d /tmp/cerb-dapr-sdk-XXXXXX)

cleanup() {
    if [ -n "$PID" ]; then
        kill -TERM "$PID" 2>/dev/null
        for _ in $(seq 250); do kill -0 "$PID" 2>/dev/null || break; sleep 0.02; done
        kill -KILL "$PID" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

skip() { echo "SKIP: $*"; exit 77; }

command -v node >/dev/null || skip "no node"
command -v npm >/dev/null || skip "no npm"

mkdir -p "$WORK"
cp "$HERE/dapr.test.mjs" "$WORK/"
if ! cmp -s "$HERE/package-lock.json" "$WORK/node_modules/.cerb-lock" 2>/dev/null; then
    cp "$HERE/package.json" "$HERE/package-lock.json" "$WORK/"
    echo "npm ci --ignore-scripts in $WORK"
    if ! (cd "$WORK" && timeout 300 npm ci --ignore-scripts --prefer-offline --no-audit \
              --no-fund >"$TMP/npm.log" 2>&1); then
        tail -5 "$TMP/npm.log"
        skip "npm could not install @dapr/dapr from package-lock.json (no registry or cache?)"
    fi
    cp "$HERE/package-lock.json" "$WORK/node_modules/.cerb-lock"
fi

# The façade's flags: refused values are usage errors (64).
printf 'engines = ("local");\n' >"$TMP/c.cfg"
for bad in "--dapr-store=" "--dapr-app-id=" "--dapr-app-id=a||b" "--dapr-store=a/b"; do
    timeout 30 "$CERBERUS" -c "$TMP/c.cfg" serve --listen "unix:$TMP/x.sock" "$bad" 2>"$TMP/err"
    rc=$?
    if [ "$rc" != 64 ]; then
        echo "not ok - serve $bad: exit $rc, not 64: $(cat "$TMP/err")"
        exit 1
    fi
done
echo "ok - refused --dapr-store/--dapr-app-id values exit 64"

TOKEN="dapr-sdk-$RANDOM$RANDOM$RANDOM"
printf '%s\n' "$TOKEN" >"$TMP/token"
"$CERBERUS" -c "$TMP/c.cfg" serve --listen "127.0.0.1:$PORT" --token-file "$TMP/token" \
    --dapr-store locks --dapr-app-id sdk-app 2>"$TMP/serve.log" &
PID=$!
now_ms() { date +%s%3N; }
DEADLINE=$(($(now_ms) + 30000))
until grep -q "listening on 127.0.0.1:$PORT" "$TMP/serve.log"; do
    if ! kill -0 "$PID" 2>/dev/null || [ "$(now_ms)" -ge "$DEADLINE" ]; then
        echo "cerberus serve did not start:"
        cat "$TMP/serve.log"
        exit 1
    fi
    sleep 0.02
done

(cd "$WORK" && CERB_DAPR_PORT=$PORT CERB_DAPR_TOKEN=$TOKEN CERB_DAPR_STORE=locks \
    timeout 120 node --test dapr.test.mjs)
RC=$?
if grep -q -- "$TOKEN" "$TMP/serve.log"; then
    echo "not ok - the token is in the daemon's log"
    RC=1
fi
exit $RC
