# shellcheck shell=bash
#
# servers.d/etcd.sh — real etcd servers (Debian etcd-server) for the tests,
# sourced by scripts/servers.sh, which provides the helpers (pid_alive,
# kill_pid, wait_exit, read_pid, remove_data_dir, now_ms, say, die) and the
# options ($OPT_PORT, $OPT_NODES, $CMD, $STATE_DIR, $WAIT_S).
#
#   scripts/servers.sh start|stop|status etcd [--nodes N] [--port P]
#
# Ports. Node i (0-based) serves clients on P + 2i and its peers on P + 2i + 1
# (DESIGN.md §9: base 22379, peer 22380), all on 127.0.0.1 only. One node is
# a standalone server; --nodes 3 is one cluster whose members are named
# cerb<client port> and know each other from the start (static bootstrap).
#
# State, per node, keyed by its client port:
#   $STATE_DIR/etcd-<port>.pid      PID of the etcd process
#   $STATE_DIR/etcd-<port>.dir      its temporary data directory (mktemp -d)
#   $STATE_DIR/etcd-<port>.cluster  the --initial-cluster it was created with
#   $STATE_DIR/etcd-<port>.log      its log (kept after stop)
#
# Algorithm. `start` is idempotent, per node: a live process of ours that
# answers /health is left alone (continued first if a test SIGSTOPped it). A
# node whose process is gone (a test killed it) but whose data directory was
# made for the same cluster is restarted on that data: a cluster member must
# come back with its raft log, not as a stranger with an empty one. Anything
# else recorded is stale and removed, and the node starts on a fresh mktemp
# directory, detached (setsid, no inherited stdio or lock fd). Readiness:
# every node of the set answers `{"health":"true"}` on GET /health (which
# needs an elected leader) before the deadline, and the process listening on
# its client port is the PID we started (checked through the socket inodes
# in /proc), so a foreign server squatting on the port is an error rather
# than a silent success. `stop` signals exactly the recorded PIDs (SIGCONT,
# SIGTERM, SIGKILL after the deadline) and removes the data directories.
#
# Environment: CERB_ETCD_PORT (default base port, 22379), ETCD_BIN (default
# etcd from PATH), CERB_ETCD_EXTRA_ARGS (extra etcd flags, word-split, for a
# test that needs e.g. --auth-token-ttl; applied only when a node starts),
# CERB_ETCD_TLS_DIR (serve clients over https with client certificates: the
# files below are made there with openssl when missing, see etcd_tls_files).

ETCD_BIN=${ETCD_BIN:-etcd}

etcd_default_port() { printf '%s' "${CERB_ETCD_PORT:-22379}"; }

# etcd_scheme: the client URL scheme (https with CERB_ETCD_TLS_DIR).
etcd_scheme() { if [[ -n ${CERB_ETCD_TLS_DIR:-} ]]; then printf https; else printf http; fi; }

# etcd_curl PORT PATH: GET <scheme>://127.0.0.1:PORT/PATH bounded by a timeout
# (a SIGSTOPped server accepts connections and then never answers).
etcd_curl() {
    local -a tls=()
    if [[ -n ${CERB_ETCD_TLS_DIR:-} ]]; then
        local d=$CERB_ETCD_TLS_DIR
        tls=(--cacert "$d/ca.crt" --cert "$d/client.crt" --key "$d/client.key")
    fi
    curl -s -m 2 --connect-timeout 1 ${tls[@]+"${tls[@]}"} \
        "$(etcd_scheme)://127.0.0.1:$1/$2" 2>/dev/null
}

# etcd_tls_cert DIR NAME CN USAGE: a P-256 key and a certificate for
# 127.0.0.1 signed by DIR/ca (two days, enough for any test run).
etcd_tls_cert() {
    local d=$1 name=$2 cn=$3 usage=$4
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$d/$name.key" -out "$d/$name.csr" -subj "/CN=$cn" 2>/dev/null &&
        openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
            -CAcreateserial -days 2 -out "$d/$name.crt" \
            -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=%s\n' "$usage") \
            2>/dev/null
}

# etcd_tls_files DIR: make, unless present, a private CA (ca.crt, ca.key),
# the server's pair (server.crt/.key, SAN IP:127.0.0.1), a client pair
# signed by that CA (client.crt/.key) and a CA nobody uses (other-ca.crt),
# for a test's "wrong CA" case.
etcd_tls_files() {
    local d=$1 ca
    [[ -f $d/server.crt && -f $d/client.crt && -f $d/other-ca.crt ]] && return 0
    mkdir -p -- "$d" || die "etcd tls: cannot create $d"
    command -v openssl >/dev/null || die "etcd tls: openssl not found (apt-get install openssl)"
    for ca in ca other-ca; do
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout "$d/$ca.key" -out "$d/$ca.crt" -days 2 -subj "/CN=cerberus test $ca" \
            2>/dev/null || die "etcd tls: openssl could not make $d/$ca.crt"
    done
    etcd_tls_cert "$d" server 127.0.0.1 serverAuth,clientAuth &&
        etcd_tls_cert "$d" client cerberus-client clientAuth ||
        die "etcd tls: openssl could not sign the certificates in $d"
}

# etcd_healthy PORT: /health says true (the member is up and has a leader).
etcd_healthy() {
    local r
    r=$(etcd_curl "$1" health) || return 1
    [[ $r == *'"health":"true"'* ]]
}

# etcd_is_ours PID PORT: PID is an etcd started by us for client port PORT.
etcd_is_ours() {
    local cmd
    cmd=$(pid_cmdline "$1")
    [[ $cmd == *etcd* && $cmd == *"--name cerb$2 "* ]]
}

# etcd_listens PID PORT: PID itself holds the listening socket of
# 127.0.0.1:PORT. /proc/net/tcp lists sockets by inode (hex address and
# port, state 0A = LISTEN); /proc/PID/fd links to socket:[inode].
etcd_listens() {
    local pid=$1 port=$2 hexport inode
    printf -v hexport '%04X' "$port"
    inode=$(awk -v p=":$hexport" '$2 ~ p"$" && $4 == "0A" { print $10; exit }' \
        /proc/net/tcp 2>/dev/null)
    [[ -n $inode ]] || return 1
    find "/proc/$pid/fd" -maxdepth 1 -lname "socket:\[$inode\]" 2>/dev/null |
        grep -q .
}

# etcd_cluster_spec BASE N: the --initial-cluster value for N nodes.
etcd_cluster_spec() {
    local base=$1 n=$2 i p spec=""
    for ((i = 0; i < n; i++)); do
        p=$((base + 2 * i))
        spec+="${spec:+,}cerb$p=http://127.0.0.1:$((p + 1))"
    done
    printf '%s' "$spec"
}

# etcd_launch PORT SPEC: start one node (fresh or on its recorded data dir)
# without waiting for it. Prints nothing; records PID, dir, cluster.
etcd_launch() {
    local port=$1 spec=$2
    local pidf="$STATE_DIR/etcd-$port.pid" dirf="$STATE_DIR/etcd-$port.dir"
    local clf="$STATE_DIR/etcd-$port.cluster" logf="$STATE_DIR/etcd-$port.log"
    local pid data="" old_spec="" state=new
    local -a extra=()

    read -r -a extra <<<"${CERB_ETCD_EXTRA_ARGS:-}"
    if [[ -n ${CERB_ETCD_TLS_DIR:-} ]]; then
        local d=$CERB_ETCD_TLS_DIR
        etcd_tls_files "$d"
        extra+=(--cert-file "$d/server.crt" --key-file "$d/server.key"
            --trusted-ca-file "$d/ca.crt" --client-cert-auth)
    fi
    if [[ -f $dirf ]]; then read -r data <"$dirf" || true; fi
    if [[ -f $clf ]]; then read -r old_spec <"$clf" || true; fi
    if [[ -n $data && -d $data/member && $old_spec == "$spec" ]]; then
        # A member that died: back on its own data (flags below are then
        # ignored by etcd except the URLs, which are the same).
        state=existing
        say "etcd :$port: restarting on its data $data"
    else
        remove_data_dir "$dirf"
        rm -f -- "$clf"
        data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-etcd-$port.XXXXXX")
        printf '%s\n' "$data" >"$dirf"
        printf '%s\n' "$spec" >"$clf"
    fi

    # setsid and redirected stdio detach it from the caller (ctest waits for
    # a fixture's output pipe to close); 9>&- keeps the state lock out of it.
    setsid "$ETCD_BIN" --name "cerb$port" --data-dir "$data" \
        --listen-client-urls "$(etcd_scheme)://127.0.0.1:$port" \
        --advertise-client-urls "$(etcd_scheme)://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
        --initial-cluster "$spec" --initial-cluster-state "$state" \
        --initial-cluster-token "cerb-etcd-${spec%%=*}" \
        --logger zap --log-outputs stderr --log-level warn \
        ${extra[@]+"${extra[@]}"} \
        </dev/null >>"$logf" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidf"
}

# etcd_wait_ready PORT: poll until the node is healthy and ours, or die.
etcd_wait_ready() {
    local port=$1 deadline pid
    local pidf="$STATE_DIR/etcd-$port.pid" logf="$STATE_DIR/etcd-$port.log"
    pid=$(read_pid "$pidf")
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until etcd_healthy "$port" && etcd_listens "$pid" "$port"; do
        if ! pid_alive "$pid"; then
            rm -f -- "$pidf"
            tail -n 20 "$logf" >&2 || true
            die "etcd :$port exited during startup (log: $logf)"
        fi
        if (($(now_ms) >= deadline)); then
            tail -n 20 "$logf" >&2 || true
            die "etcd :$port was not healthy within ${WAIT_S}s (pid $pid, log: $logf)"
        fi
        sleep 0.05
    done
}

# etcd_ports: the client ports to act on (engine_ports in servers.sh).
etcd_ports() { engine_ports etcd "$(etcd_default_port)" 2; }

etcd_start() {
    command -v "$ETCD_BIN" >/dev/null || die "$ETCD_BIN not found (Debian package etcd-server)"
    command -v curl >/dev/null || die "curl not found (Debian package curl)"
    local base=${OPT_PORT:-$(etcd_default_port)} n=${OPT_NODES:-1}
    local spec p pid
    local -a started=()
    spec=$(etcd_cluster_spec "$base" "$n")
    for p in $(etcd_ports); do
        pid=$(read_pid "$STATE_DIR/etcd-$p.pid")
        if [[ -n $pid ]] && pid_alive "$pid" && etcd_is_ours "$pid" "$p"; then
            if [[ $(proc_state "$pid") == T ]]; then
                say "etcd :$p (pid $pid) was stopped (SIGSTOP); continuing it"
                kill -CONT "$pid" 2>/dev/null || true
            fi
            continue
        fi
        rm -f -- "$STATE_DIR/etcd-$p.pid"
        if etcd_curl "$p" health >/dev/null; then
            die "port $p already has a server that is not ours (state dir $STATE_DIR)"
        fi
        etcd_launch "$p" "$spec"
        started+=("$p")
    done
    # A cluster elects its leader only once a quorum runs: wait for all
    # nodes after launching all of them.
    for p in $(etcd_ports); do etcd_wait_ready "$p"; done
    for p in $(etcd_ports); do
        pid=$(read_pid "$STATE_DIR/etcd-$p.pid")
        if [[ " ${started[*]} " == *" $p "* ]]; then
            say "etcd :$p started (pid $pid, data $(cat "$STATE_DIR/etcd-$p.dir"))"
        else
            say "etcd :$p already running (pid $pid)"
        fi
    done
}

etcd_stop_one() {
    local port=$1
    local pidf="$STATE_DIR/etcd-$port.pid" dirf="$STATE_DIR/etcd-$port.dir"
    local pid
    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid"; then
        if etcd_is_ours "$pid" "$port"; then
            kill_pid "$pid" "etcd :$port"
            say "etcd :$port stopped (pid $pid)"
        else
            say "etcd :$port: pid $pid is no longer our server; not signalling it"
        fi
    elif [[ -n $pid ]]; then
        say "etcd :$port was not running (stale pid $pid)"
    else
        say "etcd :$port is not running"
    fi
    rm -f -- "$pidf" "$STATE_DIR/etcd-$port.cluster"
    remove_data_dir "$dirf"
}

etcd_stop() {
    local p any=0
    for p in $(etcd_ports); do
        etcd_stop_one "$p"
        any=1
    done
    ((any)) || say "no etcd recorded in $STATE_DIR"
}

etcd_status() {
    local p pid rc=0 any=0
    for p in $(etcd_ports); do
        any=1
        pid=$(read_pid "$STATE_DIR/etcd-$p.pid")
        if [[ -z $pid ]]; then
            say "etcd :$p not running"
            rc=1
        elif ! pid_alive "$pid" || ! etcd_is_ours "$pid" "$p"; then
            say "etcd :$p stale (pid $pid gone)"
            rc=1
        elif [[ $(proc_state "$pid") == T ]]; then
            say "etcd :$p paused (pid $pid, SIGSTOPped)"
            rc=1
        elif etcd_healthy "$p"; then
            say "etcd :$p running (pid $pid)"
        else
            say "etcd :$p not healthy (pid $pid)"
            rc=1
        fi
    done
    if ((!any)); then
        say "no etcd recorded in $STATE_DIR"
        rc=1
    fi
    return $rc
}
