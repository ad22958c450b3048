#!/usr/bin/env bash
#
# curator.sh — Apache Curator's InterProcessMutex measured the way
# cerberus-bench measures Cerberus, on a given ZooKeeper, for the peer
# comparison of the zk engine (DESIGN.md §10: >= 1.6 x Curator uncontended,
# handoff p50 <= 0.7 x and p99 <= 0.4 x Curator's).
#
#   bench/peers/curator.sh [--port P | --hosts H] [--root R] [--duration S]
#                          [--threads N[,N...]] [--contenders N]
#
# Compiles tests/interop/curator/CuratorBench.java against Debian's Curator
# jars (javac from default-jdk-headless, under a 120 s deadline) into a
# temporary directory, then runs, each in a fresh JVM:
#   uncontended  one client shared by N threads, lock+unlock on a path each
#                (once per --threads value; default 1,8);
#   handoff      --contenders clients (default 8), one path, 20 us of work
#                while holding; latency = the next holder's acquire return
#                minus the release stamp.
# Each prints one line "curator <scenario> key=value ..."; run cerberus-bench
# on the same server right before or after, e.g.
#   cerberus-bench --engine zk --port P --threads 1,8
# Lock paths are under --root (default /cerberus/locks, the engine's
# default), named bench-cu-<pid>-<i> and bench-ch-<pid>.
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

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    sed -n '3,/^$/{s/^# \{0,1\}//;p}' "$0"
}

HOSTS=""
PORT=22181
LOCK_ROOT=/cerberus/locks
DURATION=5
THREADS=1,8
CONTENDERS=8
while (($#)); do
    case $1 in
        --port) PORT=${2:-}; shift 2 ;;
        --hosts) HOSTS=${2:-}; shift 2 ;;
        --root) LOCK_ROOT=${2:-}; shift 2 ;;
        --duration) DURATION=${2:-}; shift 2 ;;
        --threads) THREADS=${2:-}; shift 2 ;;
        --contenders) CONTENDERS=${2:-}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ $PORT =~ ^[0-9]+$ ]] || die "bad --port '$PORT'"
[[ $DURATION =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad --duration '$DURATION'"
[[ $THREADS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "bad --threads '$THREADS'"
[[ $CONTENDERS =~ ^[1-9][0-9]*$ ]] || die "bad --contenders '$CONTENDERS'"
[[ $LOCK_ROOT == /* ]] || die "--root must be an absolute path"
HOSTS=${HOSTS:-127.0.0.1:$PORT}

command -v "$JAVA" >/dev/null || die "$JAVA not found (Debian package default-jre-headless)"
command -v "$JAVAC" >/dev/null || die "$JAVAC not found (Debian package default-jdk-headless)"
for jar in curator-recipes.jar slf4j-nop.jar; do
    [[ -f $JARS/$jar ]] || die "$JARS/$jar not found (Debian packages libcurator-recipes-java, libslf4j-java)"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-curator-bench.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT
timeout 120 "$JAVAC" -nowarn -d "$WORK" -cp "$JARS/curator-recipes.jar" \
    "$ROOT_DIR/tests/interop/curator/CuratorBench.java" ||
    die "javac failed or timed out"
CP="$JARS/curator-recipes.jar:$JARS/slf4j-nop.jar:$WORK"
read -r -a JVM_OPTS <<<"${CURATOR_JVM_OPTS:-}"

# A run may not outlast its measured time by much: a hung server must not
# hang the script.
limit=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d + 60 }')
run() {
    timeout "$limit" "$JAVA" ${JVM_OPTS[@]+"${JVM_OPTS[@]}"} -cp "$CP" CuratorBench \
        "$HOSTS" "$LOCK_ROOT" "$@" || die "CuratorBench $* failed"
}

printf '# Curator InterProcessMutex on %s (%s s measured per run)\n' "$HOSTS" "$DURATION"
IFS=, read -r -a counts <<<"$THREADS"
for n in "${counts[@]}"; do
    run uncontended "$n" "$DURATION"
done
run handoff "$CONTENDERS" "$DURATION"
