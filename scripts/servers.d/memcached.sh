# shellcheck shell=bash
#
# servers.d/memcached.sh — memcached for scripts/servers.sh (sourced; it
# provides say, die, pid_alive, proc_state, pid_cmdline, read_pid, kill_pid,
# remove_data_dir, now_ms, $STATE_DIR, $WAIT_S, $CMD, $OPT_PORT, $OPT_NODES).
#
#   scripts/servers.sh start|stop|status memcached [--nodes N] [--port P]
#
# Debian's memcached (1.6.18: the meta protocol), run in the foreground of
# a detached process on 127.0.0.1:<port> (base: --port, $CERB_MEMCACHED_PORT
# or 21211, DESIGN.md §9), UDP off, 16 MiB of memory. It keeps nothing on
# disk; the temporary directory only marks the node as ours (its path is on
# the command line, as `-P <dir>/memcached.pid`) and holds nothing else.
#
# It runs as docs/engines.md advises for locks: -M (errors instead of
# evicting unexpired items; the engine refuses a server with evictions on)
# and -o slab_automove=0 (a slab page move can evict live items).
# $CERB_MEMCACHED_EVICT=1 starts it with memcached's defaults instead, so
# the refusal can be seen.
#
# A server started on a clean port is new and empty, so it gets the
# Cerberus marker without a quarantine (what `cerberus init` does for
# redis; engine_memcached/mc_marker.c): the value "<nonce> 0" under the key
# 0x01 "marker". A start after a server died here (stale state), or with
# $CERB_MEMCACHED_UNMARKED=1, is left unmarked: its first client
# quarantines it.
#
# Readiness: `stats` answers with our PID (a foreign server on the port is an
# error, not a success). The probe goes through bash's /dev/tcp under
# `timeout`, because a SIGSTOPped server accepts the connection and never
# answers. Idempotence and ownership as for redis: a live node of ours that
# answers is left alone (continued if SIGSTOPped); stop signals exactly the
# recorded PID, never a process found by name.

MEMCACHED_BIN=${MEMCACHED_BIN:-memcached}

memcached_default_port() { printf '%s' "${CERB_MEMCACHED_PORT:-21211}"; }

# memcached_pid_of PORT: the pid the server on PORT reports (bounded).
memcached_pid_of() {
    local out
    out=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "stats\r\nquit\r\n" >&3
        cat <&3' _ "$1" 2>/dev/null) || return 1
    [[ $out =~ STAT\ pid\ ([0-9]+) ]] || return 1
    printf '%s' "${BASH_REMATCH[1]}"
}

# memcached_is_ours PID PORT: PID is the server we started for PORT.
memcached_is_ours() {
    local cmd
    cmd=$(pid_cmdline "$1")
    [[ $cmd == *memcached* && $cmd == *"/cerberus-memcached-$2."* ]]
}

# memcached_mark PORT: the marker of a new server, no quarantine (add mode:
# one already there is kept).
memcached_mark() {
    local nonce out
    nonce=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    out=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "ms AW1hcmtlcg== 34 ME b\r\n%s 0\r\nquit\r\n" "$2" >&3
        cat <&3' _ "$1" "$nonce" 2>/dev/null) || return 1
    [[ $out == HD* || $out == NS* ]]
}

memcached_ports() { engine_ports memcached "$(memcached_default_port)" 1; }

memcached_start_one() {
    local port=$1 pid data deadline
    local pidf="$STATE_DIR/memcached-$port.pid" dirf="$STATE_DIR/memcached-$port.dir"
    local logf="$STATE_DIR/memcached-$port.log"
    pid=$(read_pid "$pidf")
    if [[ -n $pid ]] && pid_alive "$pid" && memcached_is_ours "$pid" "$port"; then
        if [[ $(proc_state "$pid") == T ]]; then
            say "memcached :$port (pid $pid) was stopped (SIGSTOP); continuing it"
            kill -CONT "$pid" 2>/dev/null || true
        fi
        [[ $(memcached_pid_of "$port") == "$pid" ]] && {
            say "memcached :$port already running (pid $pid)"
            return 0
        }
    fi
    local restart=0
    if [[ -n $pid || -f $pidf || -f $dirf ]]; then
        restart=1
        say "memcached :$port: removing stale state (pid ${pid:-none})"
        [[ -n $pid ]] && pid_alive "$pid" && memcached_is_ours "$pid" "$port" &&
            kill_pid "$pid" "memcached :$port"
        rm -f -- "$pidf"
        remove_data_dir "$dirf"
    fi
    if memcached_pid_of "$port" >/dev/null; then
        die "port $port already has a server that is not ours (state dir $STATE_DIR)"
    fi
    data=$(mktemp -d "${TMPDIR:-/tmp}/cerberus-memcached-$port.XXXXXX")
    printf '%s\n' "$data" >"$dirf"
    local -a args=(-l 127.0.0.1 -p "$port" -U 0 -m 16 -c 1024 -t 2 -P "$data/memcached.pid")
    ((EUID == 0)) && args+=(-u root)
    [[ ${CERB_MEMCACHED_EVICT:-0} == 1 ]] || args+=(-M -o slab_automove=0)
    # setsid and redirected stdio detach it (ctest waits for a fixture's
    # output pipe to close); 9>&- keeps the state-dir lock out of it.
    setsid "$MEMCACHED_BIN" "${args[@]}" </dev/null >"$logf" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidf"
    deadline=$(($(now_ms) + WAIT_S * 1000))
    until [[ $(memcached_pid_of "$port") == "$pid" ]]; do
        if ! pid_alive "$pid"; then
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
            tail -n 20 "$logf" >&2 || true
            die "memcached :$port exited during startup (log: $logf)"
        fi
        if (($(now_ms) >= deadline)); then
            kill_pid "$pid" "memcached :$port"
            rm -f -- "$pidf"
            remove_data_dir "$dirf"
            die "memcached :$port did not answer within ${WAIT_S}s (log: $logf)"
        fi
        sleep 0.02
    done
    if ((restart == 0)) && [[ ${CERB_MEMCACHED_UNMARKED:-0} != 1 ]]; then
        memcached_mark "$port" || die "memcached :$port: could not write the Cerberus marker"
    fi
    say "memcached :$port serving (pid $pid${CERB_MEMCACHED_EVICT:+, evictions on})"
}

memcached_start() {
    command -v "$MEMCACHED_BIN" >/dev/null || die "$MEMCACHED_BIN not found (Debian package memcached)"
    local port
    for port in $(memcached_ports); do memcached_start_one "$port"; done
}

memcached_stop() {
    local port pid any=0
    for port in $(memcached_ports); do
        any=1
        local pidf="$STATE_DIR/memcached-$port.pid" dirf="$STATE_DIR/memcached-$port.dir"
        pid=$(read_pid "$pidf")
        if [[ -n $pid ]] && pid_alive "$pid"; then
            if memcached_is_ours "$pid" "$port"; then
                [[ $(proc_state "$pid") == T ]] && kill -CONT "$pid" 2>/dev/null
                kill_pid "$pid" "memcached :$port"
                say "memcached :$port stopped (pid $pid)"
            else
                say "memcached :$port: pid $pid is no longer our server; not signalling it"
            fi
        elif [[ -n $pid ]]; then
            say "memcached :$port was not running (stale pid $pid)"
        else
            say "memcached :$port is not running"
        fi
        rm -f -- "$pidf"
        remove_data_dir "$dirf"
    done
    ((any)) || say "no memcached recorded in $STATE_DIR"
}

memcached_status() {
    local port pid rc=0 any=0
    for port in $(memcached_ports); do
        any=1
        pid=$(read_pid "$STATE_DIR/memcached-$port.pid")
        if [[ -z $pid ]]; then
            say "memcached :$port not running"
            rc=1
        elif ! pid_alive "$pid" || ! memcached_is_ours "$pid" "$port"; then
            say "memcached :$port stale (pid $pid gone)"
            rc=1
        elif [[ $(proc_state "$pid") == T ]]; then
            say "memcached :$port paused (pid $pid, SIGSTOPped)"
            rc=1
        elif [[ $(memcached_pid_of "$port") == "$pid" ]]; then
            say "memcached :$port running (pid $pid)"
        else
            say "memcached :$port not answering (pid $pid)"
            rc=1
        fi
    done
    if ((!any)); then
        say "no memcached recorded in $STATE_DIR"
        rc=1
    fi
    return $rc
}
