#!/usr/bin/env bash
# test_cli_serve.sh — `cerberus serve`'s command line end to end, with the
# built-in "local" engine (no server fixture): a --listen address that is
# not loopback, and TCP without --token-file, are usage errors (64) before
# anything starts; an unreadable or empty token file is 78; then one
# server on a unix socket and on 127.0.0.1 with a port the kernel chose
# (read from its log line): over TCP no token and a wrong one are 401
# with WWW-Authenticate: Bearer, the right one acquires; the unix socket
# needs none; the token is in no log line; SIGTERM exits 0 and removes the
# socket.
#
# Usage: test_cli_serve.sh PATH/TO/cerberus
#
# Every command but the server runs under timeout(1); waits are on a condition with a
# deadline, never a bare sleep to synchronise. The server started here is
# stopped by its PID at exit. Output: one "ok"/"not ok" line per check,
# exit status 1 if any failed.

set -u

CERBERUS=${1:?usage: test_cli_serve.sh PATH/TO/cerberus}
T=30
FAILED=0
DIR=$(mktemp -d /tmp/cerb-cli-serve-XXXXXX)
PID=

cleanup() {
    [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null
    rm -rf "$DIR"
}
trap cleanup EXIT

ok() { echo "ok - $1"; }
notok() { echo "not ok - $1"; FAILED=1; }
check() { # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then ok "$1"; else notok "$1: expected '$2', got '$3'"; fi
}

command -v curl >/dev/null || { echo "ok - skipped: no curl"; exit 0; }

CFG=$DIR/c.cfg
printf 'engines = ("local");\n' >"$CFG"
TOKEN="tok-$RANDOM$RANDOM-secret"
printf '%s\nnot part of it\n' "$TOKEN" >"$DIR/token"
: >"$DIR/empty"
chmod 600 "$DIR/token" "$DIR/empty"

run() { timeout "$T" "$CERBERUS" -c "$CFG" serve "$@" >"$DIR/out" 2>"$DIR/err"; echo $?; }

check "non-loopback address refused (64)" 64 "$(run --listen 10.1.2.3:7080 --token-file "$DIR/token")"
grep -q "loopback" "$DIR/err" && ok "the refusal says loopback" || notok "no 'loopback' in: $(cat "$DIR/err")"
check "0.0.0.0 refused (64)" 64 "$(run --listen 0.0.0.0:7080 --token-file "$DIR/token")"
check "TCP without --token-file refused (64)" 64 "$(run --listen 127.0.0.1:0)"
grep -q -- "--token-file" "$DIR/err" && ok "the refusal names --token-file" || notok "no '--token-file' in: $(cat "$DIR/err")"
check "unreadable token file (78)" 78 "$(run --listen 127.0.0.1:0 --token-file "$DIR/none")"
check "empty token file (78)" 78 "$(run --listen 127.0.0.1:0 --token-file "$DIR/empty")"
# --check refuses what the start would refuse.
check "--check --dapr-store a/b refused (64)" 64 "$(run --check --dapr-store a/b)"
check "--check --dapr-app-id 'x||y' refused (64)" 64 "$(run --check --dapr-app-id 'x||y')"

SOCK=$DIR/s.sock
# Not under timeout(1), so that the TERM below reaches the server itself:
# the wait for its exit is bounded instead, and the trap kills it by PID.
"$CERBERUS" -c "$CFG" serve --listen "unix:$SOCK" --listen 127.0.0.1:0 \
    --token-file "$DIR/token" 2>"$DIR/log" &
PID=$!
PORT=
now_ms() { date +%s%3N; }
started() {
    PORT=$(sed -n 's/.* info listen addr=127\.0\.0\.1:0 port=\([0-9]*\) auth=bearer.*/\1/p' "$DIR/log")
    [ -n "$PORT" ] && [ -S "$SOCK" ] && return 0
    kill -0 "$PID" 2>/dev/null || return 0 # died: stop waiting
    return 1
}
DEADLINE=$(($(now_ms) + 30000))
until started; do
    [ "$(now_ms)" -ge "$DEADLINE" ] && break
    sleep 0.02
done
if [ -z "$PORT" ]; then
    notok "the server did not start: $(cat "$DIR/log")"
    exit 1
fi
ok "listening on unix and 127.0.0.1:$PORT"

URL=http://127.0.0.1:$PORT
req() { timeout "$T" curl -s --noproxy '*' -o "$DIR/body" -D "$DIR/hdr" -w '%{http_code}' "$@"; }

check "no token: 401" 401 "$(req -X POST "$URL/v1/locks/cli-serve/acquire")"
grep -q '"UNAUTHORIZED"' "$DIR/body" && ok "401 body says UNAUTHORIZED" || notok "body: $(cat "$DIR/body")"
grep -qi '^WWW-Authenticate: Bearer' "$DIR/hdr" && ok "401 has WWW-Authenticate: Bearer" || notok "headers: $(cat "$DIR/hdr")"
check "healthz without token: 401" 401 "$(req "$URL/healthz")"
check "wrong token: 401" 401 "$(req -H "Authorization: Bearer ${TOKEN}x" -X POST "$URL/v1/locks/cli-serve/acquire")"
check "right token: acquire 200" 200 "$(req -H "Authorization: Bearer $TOKEN" -X POST -d '{"wait_ms": 0}' "$URL/v1/locks/cli-serve/acquire")"
HOLD=$(sed -n 's/.*"hold":"\([0-9a-f]*\)".*/\1/p' "$DIR/body")
check "unix socket, no token: held name is 409" 409 "$(timeout "$T" curl -s -o /dev/null -w '%{http_code}' --unix-socket "$SOCK" -X POST -d '{"wait_ms": 0}' http://localhost/v1/locks/cli-serve/acquire)"
check "right token: release 200" 200 "$(req -H "Authorization: Bearer $TOKEN" -X DELETE "$URL/v1/holds/$HOLD")"

kill -TERM "$PID"
DEADLINE=$(($(now_ms) + 30000))
while kill -0 "$PID" 2>/dev/null && [ "$(now_ms)" -lt "$DEADLINE" ]; do
    sleep 0.02
done
if kill -0 "$PID" 2>/dev/null; then
    notok "SIGTERM: still running after 30 s"
else
    wait "$PID"
    check "SIGTERM: exit 0" 0 "$?"
fi
PID=
[ -e "$SOCK" ] && notok "socket left behind" || ok "socket removed"
grep -q -- "$TOKEN" "$DIR/log" && notok "the token is in the log" || ok "the token is in no log line"

exit $FAILED
