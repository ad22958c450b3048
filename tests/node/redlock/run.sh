#!/usr/bin/env bash
# run.sh — npm redlock (node-redlock) against Cerberus' Redlock mode on the
# same three test Redis masters (ctest: node_redlock). Copies package.json
# and package-lock.json to WORKDIR and installs them there with
# `npm ci --ignore-scripts` (pinned by the lockfile; skipped when the
# lockfile has not changed since the last install), then runs
# `node --test` on redlock.test.mjs, which drives npm's Redlock and the
# rl_peer helper (a Cerberus client in Redlock mode) on one name.
#
# Usage: run.sh PATH/TO/rl_peer WORKDIR PORT1,PORT2,PORT3
#
# Exit status: node's (0 all passed); 77 (ctest's skip) with a message when
# node or npm is missing or npm cannot install (no registry, no cache).

set -u

PEER=${1:?usage: run.sh PATH/TO/rl_peer WORKDIR PORTS}
WORK=${2:?usage: run.sh PATH/TO/rl_peer WORKDIR PORTS}
PORTS=${3:?usage: run.sh PATH/TO/rl_peer WORKDIR PORTS}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d /tmp/cerb-node-rl-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

skip() { echo "SKIP: $*"; exit 77; }

command -v node >/dev/null || skip "no node"
command -v npm >/dev/null || skip "no npm"

mkdir -p "$WORK"
cp "$HERE/redlock.test.mjs" "$WORK/"
if ! cmp -s "$HERE/package-lock.json" "$WORK/node_modules/.cerb-lock" 2>/dev/null; then
    cp "$HERE/package.json" "$HERE/package-lock.json" "$WORK/"
    echo "npm ci --ignore-scripts in $WORK"
    if ! (cd "$WORK" && timeout 300 npm ci --ignore-scripts --prefer-offline --no-audit \
              --no-fund >"$TMP/npm.log" 2>&1); then
        tail -5 "$TMP/npm.log"
        skip "npm could not install redlock from package-lock.json (no registry or cache?)"
    fi
    cp "$HERE/package-lock.json" "$WORK/node_modules/.cerb-lock"
fi

(cd "$WORK" && CERB_REDLOCK_PORTS=$PORTS CERB_RL_PEER=$PEER timeout 120 node --test redlock.test.mjs)
