#!/usr/bin/env bash
#
# curator.sh — Apache Curator's InterProcessMutex, a peer of the zk engine,
# measured the way cerberus-bench measures Cerberus, on the same ZooKeeper
# in the same run (`cerberus-bench --peers` runs it; DESIGN.md §10: >= 1.6 x
# Curator uncontended, handoff p50 <= 0.7 x and p99 <= 0.4 x Curator's).
#
#   bench/peers/curator.sh --check | --scenario uncontended|handoff|semaphore|
#                          rwlock|elect-failover
#                          [--threads N] [--duration S] [--hosts H | --port P]
#                          [--root R] [--work DIR] [--permits N] [--rounds R]
#                          [--lease-ms L]
#
# Compiles tests/interop/curator/CuratorBench.java against Debian's Curator
# jars (javac from default-jdk-headless, under a 120 s deadline) into
# DIR/curator-classes, once per --work DIR (cerberus-bench gives every run a
# scratch directory; without --work a temporary one is used and removed),
# then runs it in a fresh JVM:
#   uncontended  one CuratorFramework client shared by N threads, lock+unlock
#                on a path each;
#   handoff      N clients (sessions), one path, 20 us of work while holding;
#                latency = the next holder's acquire return minus the release
#                stamp. Curator's mutex is fair, the releaser queues again.
# The coordination recipes (issue 28) are tests/interop/curator/
# CuratorPrimsBench.java, compiled alongside:
#   semaphore    InterProcessSemaphoreV2 with --permits N leases, --threads
#                (2N) clients looping acquire + returnLease; latency = the
#                acquire wait;
#   rwlock       InterProcessReadWriteLock, --threads clients, one cycle in
#                ten a write, ~10 us held; latency = the cycle;
#   elect-failover  --threads LeaderLatch candidates, a JVM each, with a
#                session timeout of --lease-ms (Cerberus's
#                zk.session_timeout_ms), driven by elect_driver.py: the
#                leader's JVM killed --rounds times, the time to the next
#                leader's latch.await().
# Lock paths are under --root (default /cerberus/locks, the engine's
# default), named bench-cu-<pid>-<i>, bench-ch-<pid>, bench-cs-<pid>,
# bench-crw-<pid> and bench-ce-<pid>.
#
# Output: one line on stdout, the protocol of every peer script
# (bench/peers/peerlib.py): "ok <what>" after --check, "skip <why>" with
# exit status 3 when Java or Curator is not installed, or
#   result peer=curator scenario=S threads=N ops_per_s=X p50_us=.. [p90_us=..]
#          p99_us=.. max_us=.. # how
# Errors go to stderr with exit status 1.
#
# Environment: JAVA, JAVAC (default from PATH), CURATOR_JARS (default
# /usr/share/java), CURATOR_JVM_OPTS (extra JVM options; default none, so
# the JIT is what a service would run with).

set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT_DIR=$(cd "$HERE/../.." && pwd)
JAVA=${JAVA:-java}
JAVAC=${JAVAC:-javac}
JARS=${CURATOR_JARS:-/usr/share/java}
SRC=$ROOT_DIR/tests/interop/curator/CuratorBench.java
SRC_PRIMS=$ROOT_DIR/tests/interop/curator/CuratorPrimsBench.java
PY=${CERB_PEER_PYTHON:-/usr/bin/python3}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
skip() { printf 'skip %s\n' "$*"; exit 3; }

usage() {
    sed -n '3,/^$/{s/^# \{0,1\}//;p}' "$0"
}

HOSTS=""
PORT=22181
LOCK_ROOT=/cerberus/locks
DURATION=5
THREADS=1
SCENARIO=""
CHECK=0
WORK=""
PERMITS=1
ROUNDS=5
LEASE_MS=10000
while (($#)); do
    case $1 in
        --check) CHECK=1; shift ;;
        --scenario) SCENARIO=${2:-}; shift 2 || die "--scenario needs a value" ;;
        --port) PORT=${2:-}; shift 2 || die "--port needs a value" ;;
        --hosts) HOSTS=${2:-}; shift 2 || die "--hosts needs a value" ;;
        --root) LOCK_ROOT=${2:-}; shift 2 || die "--root needs a value" ;;
        --duration) DURATION=${2:-}; shift 2 || die "--duration needs a value" ;;
        --threads) THREADS=${2:-}; shift 2 || die "--threads needs a value" ;;
        --work) WORK=${2:-}; shift 2 || die "--work needs a value" ;;
        --permits) PERMITS=${2:-}; shift 2 || die "--permits needs a value" ;;
        --rounds) ROUNDS=${2:-}; shift 2 || die "--rounds needs a value" ;;
        --lease-ms) LEASE_MS=${2:-}; shift 2 || die "--lease-ms needs a value" ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
bad() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }
[[ $CHECK == 1 || $SCENARIO =~ ^(uncontended|handoff|semaphore|rwlock|elect-failover)$ ]] ||
    bad "--scenario uncontended|handoff|semaphore|rwlock|elect-failover (or --check) is required"
[[ $PERMITS =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ && $LEASE_MS =~ ^[1-9][0-9]*$ ]] ||
    bad "bad --permits, --rounds or --lease-ms"
[[ $PORT =~ ^[0-9]+$ ]] || bad "bad --port '$PORT'"
[[ $DURATION =~ ^[0-9]+(\.[0-9]+)?$ ]] || bad "bad --duration '$DURATION'"
[[ $THREADS =~ ^[1-9][0-9]*$ && $THREADS -le 1024 ]] || bad "bad --threads '$THREADS'"
[[ $LOCK_ROOT == /* ]] || bad "--root must be an absolute path"
[[ -z $WORK || -d $WORK ]] || bad "--work $WORK is not a directory"
HOSTS=${HOSTS:-127.0.0.1:$PORT}

command -v "$JAVA" >/dev/null || skip "$JAVA not found (Debian package default-jre-headless)"
command -v "$JAVAC" >/dev/null || skip "$JAVAC not found (Debian package default-jdk-headless)"
[[ -f $JARS/curator-recipes.jar ]] ||
    skip "$JARS/curator-recipes.jar not found (Debian package libcurator-recipes-java)"
[[ -f $JARS/slf4j-nop.jar ]] || skip "$JARS/slf4j-nop.jar not found (Debian package libslf4j-java)"
[[ -f $SRC && -f $SRC_PRIMS ]] || skip "$SRC or $SRC_PRIMS not found (a source checkout is needed)"

if [[ -z $WORK ]]; then
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-curator-bench.XXXXXX")
    trap 'rm -rf -- "$WORK"' EXIT
fi
CLASSES=$WORK/curator-classes
if [[ ! -f $CLASSES/CuratorBench.class || ! -f $CLASSES/CuratorPrimsBench.class ]]; then
    mkdir -p -- "$CLASSES"
    timeout 120 "$JAVAC" -nowarn -d "$CLASSES" -cp "$JARS/curator-recipes.jar" "$SRC" \
        "$SRC_PRIMS" >&2 || die "javac $SRC $SRC_PRIMS failed or timed out"
fi
CP="$JARS/curator-recipes.jar:$JARS/slf4j-nop.jar:$CLASSES"
read -r -a JVM_OPTS <<<"${CURATOR_JVM_OPTS:-}"

if ((CHECK)); then
    # Debian names the versioned jar as a link to the plain one.
    ver="(version unknown)"
    for jar in "$JARS"/curator-recipes-*.jar; do
        [[ -e $jar ]] || continue
        ver=${jar##*/curator-recipes-}
        ver=${ver%.jar}
        break
    done
    printf 'ok Curator %s\n' "$ver"
    exit 0
fi

if [[ $SCENARIO == elect-failover ]]; then
    "$PY" "$HERE/elect_driver.py" --peer curator --threads "$THREADS" \
        --rounds "$ROUNDS" --lease-ms "$LEASE_MS" \
        --how "Curator LeaderLatch, a JVM per candidate, session timeout $LEASE_MS ms" -- \
        "$JAVA" ${JVM_OPTS[@]+"${JVM_OPTS[@]}"} -cp "$CP" CuratorPrimsBench "$HOSTS" \
        "$LOCK_ROOT" candidate "bench-ce-$$" "{idx}" "$LEASE_MS"
    exit $?
fi

# A run may not outlast its measured time by much: a hung server must not
# hang the script (cerberus-bench bounds it too).
limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d + 60 }')
if [[ $SCENARIO == semaphore || $SCENARIO == rwlock ]]; then
    n=$THREADS
    [[ $SCENARIO == semaphore ]] && n=$PERMITS
    out=$(timeout "$limit" "$JAVA" ${JVM_OPTS[@]+"${JVM_OPTS[@]}"} -cp "$CP" CuratorPrimsBench \
        "$HOSTS" "$LOCK_ROOT" "$SCENARIO" "$n" "$DURATION") ||
        die "CuratorPrimsBench $SCENARIO $n $DURATION failed (status $?)"
    line=$(printf '%s\n' "$out" | grep -m1 "^curator $SCENARIO ") ||
        die "CuratorPrimsBench printed no result: $out"
    if [[ $SCENARIO == semaphore ]]; then
        how="InterProcessSemaphoreV2, $PERMITS leases, $((2 * PERMITS)) clients (sessions) in one JVM, acquire + returnLease; latency = acquire wait"
    else
        how="InterProcessReadWriteLock, $THREADS clients (sessions) in one JVM, 1 cycle in 10 a write, ~10 us held"
    fi
    printf '%s\n' "$line" | awk -v how="$how" '{
        printf "result peer=curator scenario=%s", $2
        for (i = 3; i <= NF; i++) {
            split($i, kv, "=")
            k = kv[1]
            if (k == "ops/s") k = "ops_per_s"
            printf " %s=%s", k, kv[2]
        }
        printf " # %s\n", how
    }'
    exit 0
fi
out=$(timeout "$limit" "$JAVA" ${JVM_OPTS[@]+"${JVM_OPTS[@]}"} -cp "$CP" CuratorBench \
    "$HOSTS" "$LOCK_ROOT" "$SCENARIO" "$THREADS" "$DURATION") ||
    die "CuratorBench $SCENARIO $THREADS $DURATION failed (status $?)"

# CuratorBench prints "curator <scenario> threads=N ops/s=X ..." or
# "curator handoff contenders=N acq/s=X ..."; say it in the protocol's keys.
line=$(printf '%s\n' "$out" | grep -m1 "^curator $SCENARIO ") ||
    die "CuratorBench printed no result: $out"
if [[ $SCENARIO == uncontended ]]; then
    how="$THREADS thread(s) sharing one CuratorFramework client, acquire+release"
else
    how="$THREADS clients (sessions) in one JVM; fair, the releaser queues again"
fi
printf '%s\n' "$line" | awk -v how="$how" '{
    printf "result peer=curator scenario=%s", $2
    for (i = 3; i <= NF; i++) {
        split($i, kv, "=")
        k = kv[1]
        if (k == "contenders") k = "threads"
        if (k == "ops/s" || k == "acq/s") k = "ops_per_s"
        printf " %s=%s", k, kv[2]
    }
    printf " # %s\n", how
}'
