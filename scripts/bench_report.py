#!/usr/bin/python3
"""bench_report.py — the helper of scripts/bench-report.sh (python3 stdlib).

usage: bench_report.py meta --out FILE --command CMD [--script-command CMD]
                            [--started UTC] [--seconds S] [--loadavg L]
                            [--redis-port P] [--zk-port P] [--etcd-port P]
                            [--pg-port P] [--mysql-port P]
                            [--root DIR] [--build-dir DIR] [--config FILE]
       bench_report.py render --json FILE [--meta FILE] --out PAGE.md
                              [--plot NAME.png]

meta    describes the run into a JSON object: the machine (CPU model,
        cores, memory, kernel, Debian release), the servers' versions
        asked from the servers themselves (redis INFO server, ZooKeeper's
        srvr four-letter word, etcd's /version, PostgreSQL's
        server_version through psql, MariaDB's VERSION() through the
        mariadb client), the peers' Debian package
        versions, the git commit, the date and the exact commands.
render  writes docs/performance.md from cerberus-bench's --json array
        (bench/report.c) and that metadata: the run, a summary, one table
        per engine (Cerberus, the raw ceiling, the ratio, the peers side by
        side), the plot, the targets this run missed, and the fixed text
        that says what each scenario measures.
"""
import argparse
import glob
import json
import os
import platform
import socket
import subprocess
import sys
import urllib.request

PEER_PACKAGES = (
    ("redis-py", "python3-redis"),
    ("Curator", "libcurator-recipes-java"),
    ("kazoo", "python3-kazoo"),
    ("python-etcd3", "python3-etcd3"),
    ("etcdctl", "etcd-client"),
)
ENGINE_TITLES = {"redis": "Redis", "zk": "ZooKeeper", "etcd": "etcd", "pg": "PostgreSQL",
                 "mysql": "MariaDB", "local": "local"}
PEER_TITLES = {"redis-py": "redis-py `Lock`", "curator": "Curator", "kazoo": "kazoo",
               "python-etcd3": "python-etcd3", "etcdctl": "`etcdctl lock`"}


# ------------------------------------------------------------------ meta

def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def cpu_model():
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def mem_gib():
    for line in read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / (1024 * 1024), 1)
    return None


def debian():
    rel = read_text("/etc/os-release")
    pretty = ""
    for line in rel.splitlines():
        if line.startswith("PRETTY_NAME="):
            pretty = line.split("=", 1)[1].strip().strip('"')
    point = read_text("/etc/debian_version").strip()
    if pretty and point:
        return "%s, %s" % (pretty, point)
    return pretty or point or platform.platform()


def loadavg():
    """The 1, 5 and 15 minute load averages now (the end of the run)."""
    try:
        return [float(x) for x in read_text("/proc/loadavg").split()[:3]]
    except ValueError:
        return None


def ask(port, payload, complete=None):
    """Send payload to 127.0.0.1:port and read the answer until the server
    closes, or until complete(buf) says it is whole; None when it fails."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(payload)
            buf = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if complete and complete(buf):
                    break
            return buf.decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def redis_bulk_whole(buf):
    """Whether a RESP bulk string (or an error) has come whole."""
    head, _, rest = buf.partition(b"\r\n")
    return head.startswith(b"-") or (head.startswith(b"$") and len(rest) >= int(head[1:]))


def redis_version(port):
    """redis_version from INFO server, asked over the wire (inline command)."""
    text = ask(port, b"INFO server\r\n", redis_bulk_whole)
    for line in (text or "").splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1].strip()
    return None


def zk_version(port):
    """The first word after "Zookeeper version:" in srvr's answer."""
    for line in (ask(port, b"srvr") or "").splitlines():
        if line.startswith("Zookeeper version:"):
            v = line.split(":", 1)[1].strip()
            return v.split(",")[0].split("-")[0]
    return None


def etcd_version(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/version" % port, timeout=3) as r:
            return json.load(r).get("etcdserver")
    except (OSError, ValueError, AttributeError):
        return None


def sql_answer(argv):
    """The one-line answer of a command-line SQL client, or None."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PG", "MYSQL", "MARIADB"))}
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    answer = out.stdout.strip()
    return answer if out.returncode == 0 and answer and "\n" not in answer else None


def psql():
    """The newest Debian PostgreSQL's psql (/usr/bin/psql is pg_wrapper),
    else the one on PATH."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"),
                    key=lambda p: [int(x) if x.isdigit() else 0 for x in p.split("/")],
                    reverse=True):
        if os.access(d, os.X_OK):
            return d
    return "psql"


def pg_version(port):
    """SHOW server_version, asked over TCP as servers.sh's user cerb."""
    return sql_answer([psql(), "-X", "-w", "-q", "-At", "-h", "127.0.0.1", "-p", str(port),
                       "-U", "cerb", "-d", "cerb", "-c", "SHOW server_version"])


def mysql_version(port):
    """SELECT VERSION() ("10.11.19-MariaDB-0+deb12u1"), asked over TCP as
    servers.sh's user cerb."""
    return sql_answer(["mariadb", "--no-defaults", "--connect-timeout=3", "--protocol=TCP",
                       "-h", "127.0.0.1", "-P", str(port), "-u", "cerb", "-N", "-B",
                       "-e", "SELECT VERSION()"])


def deb_version(pkg):
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", pkg],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    status, _, version = out.stdout.partition("\t")
    return version if out.returncode == 0 and status.endswith(" installed") else None


def git(root, *args):
    try:
        out = subprocess.run(["git", "-C", root] + list(args), capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def build_type(build_dir):
    for line in read_text(os.path.join(build_dir or "", "CMakeCache.txt")).splitlines():
        if line.startswith("CMAKE_BUILD_TYPE:"):
            return line.split("=", 1)[1].strip() or None
    return None


def cmd_meta(a):
    root = a.root or os.getcwd()
    # Changes to the measured code (not to the pages, the tests or this
    # report's own scripts, which measure nothing).
    dirty = git(root, "status", "--porcelain", "--untracked-files=no", "--", ".",
                ":(exclude)docs", ":(exclude)tests", ":(exclude)*.md",
                ":(exclude)scripts/bench-report.sh", ":(exclude)scripts/bench_report.py",
                ":(exclude)scripts/stores.sh")
    meta = {
        "date_utc": a.started,
        "bench_seconds": a.seconds,
        "loadavg_before": a.loadavg,
        "loadavg_after": loadavg(),
        "command": a.command,
        "script_command": a.script_command,
        "commit": git(root, "rev-parse", "HEAD"),
        "commit_subject": git(root, "log", "-1", "--format=%s"),
        "commit_dirty": bool(dirty) if dirty is not None else None,
        "build_type": build_type(a.build_dir),
        "config_path": os.path.relpath(a.config, root) if a.config else None,
        "config_text": read_text(a.config) if a.config else None,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": mem_gib(),
            "kernel": "%s %s" % (platform.system(), platform.release()),
            "os": debian(),
        },
        "servers": {
            "redis": {"port": a.redis_port,
                      "version": redis_version(a.redis_port) if a.redis_port else None},
            "zk": {"port": a.zk_port, "version": zk_version(a.zk_port) if a.zk_port else None},
            "etcd": {"port": a.etcd_port,
                     "version": etcd_version(a.etcd_port) if a.etcd_port else None},
            "pg": {"port": a.pg_port, "version": pg_version(a.pg_port) if a.pg_port else None},
            "mysql": {"port": a.mysql_port,
                      "version": mysql_version(a.mysql_port) if a.mysql_port else None},
        },
        "peers": [{"peer": p, "package": pkg, "version": deb_version(pkg)}
                  for p, pkg in PEER_PACKAGES],
    }
    with open(a.out, "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return 0



# ---------------------------------------------------------------- render

# Targets the figures are held to (DESIGN.md section 10, as cerberus-bench
# prints them): (description, test) per kind of row; peer rows and switch
# rows carry their own target in the JSON.
MARKER = ("<!-- generated by scripts/bench-report.sh from one cerberus-bench run: "
          "do not edit by hand, rerun the script -->")
UNCONTENDED_MIN = 0.9
HANDOFF_RTT_MAX = 3.0      # Redis: the hand-off p50 in round trips (pg and mysql rows
                           # are set against their raw hand-off instead: known gaps)
HERD_WAKEUPS = 1.0
HERD_CALLS_MAX = 1.1
MANY_CPU_MAX = 5.0         # % of one core
MANY_BYTES_MAX = 1024.0    # per lock


# The fixed text: what each scenario measures, the raw ceiling, the known
# gaps and how to rerun. No figures here: they come from the JSON.
FIXED_TEXT = """
## What each scenario measures

`cerberus-bench` measures each scenario on each engine in one process, against one
server per engine. Where a scenario has a raw ceiling, the library and the ceiling
run in alternating rounds of about half a second each (ceiling, library, ceiling,
...) after an unmeasured warm-up of each, and the rounds of each side are summed.
Noise on a shared or virtual machine comes in regimes lasting seconds, so it is as
likely to hit either side; the JSON also gives the median of the per-round ratios
(`ratio_paired_median`).

### The raw ceiling

The raw ceiling is the fewest server commands a lock needs, sent by the bench
itself over bare client connections (one per thread), with no library logic:

- **Redis**: `SET name token NX PX 10000`, then `EVALSHA` of the compare-and-delete
  script: two round trips, with a token fixed per thread (redis-py's protocol
  reduced to its round trips). The round trip is `PING`.
- **Redlock** (the redis engine with `redis.mode = "redlock"`, rows `redlock`, `--engine
  redlock`): `SET name token NX PX 10000` to every master at once (one connection per
  master per thread, every request written before the first reply is read; a majority
  must say OK), then the compare-and-delete script to every master at once: two
  round trips of the slowest master. Cerberus's fenced grant adds a third (the fence's
  write-back to a majority), the price of its tokens. The round trip is `PING` to every
  master at once. Its peer is npm `redlock` 4.2.0 (node-redlock) on the same masters.
- **ZooKeeper**: `create2` of an ephemeral sequential node under the lock's node and
  `getChildren` of it, sent together (one round trip: the server answers a
  session's requests in order), then `delete` of the node: Curator's layout on a
  bare `libzookeeper_mt` session. The round trip is `exists /`.
- **etcd**: a transaction that puts `<name>/<lease>` if its `create_revision` is 0,
  then a `deleterange` of it, over one kept-alive HTTP/1.1 connection with a lease
  granted once. The round trip is `maintenance/status`, answered without
  consensus.
- **PostgreSQL** (engine `pg`): one statement that takes `pg_try_advisory_lock` on
  the name's 64-bit key and, when it got it, upserts the name's row in the engine's
  own table (`INSERT ... ON CONFLICT DO UPDATE`: the fence raised, the owner and a
  10 s lease on the server's clock, unless another owner's lease still runs), then
  one statement that frees the row if the token still owns it and calls
  `pg_advisory_unlock`: two round trips, prepared once per session, with
  `synchronous_commit = on` as the engine's sessions have it. The round trip is
  `SELECT 1`.
- **memcached** (engine `memcached`, `--engine memcached`; not in this page's run):
  `ms name 32 T10 ME c` with the token as the value (add mode: stored only when the
  key is absent; the reply carries the item's CAS), then `md name C<cas>` (deleted
  only while the item is still the one the grant wrote): two round trips over one
  bare connection per thread. The contended ceiling sends the `ms` again at once
  on `NS`. The round trip is `mn`. The engine has no fencing and no guard (its
  guard row says skipped).
- **MariaDB** (engine `mysql`): one `UPDATE` of the name's row in the engine's own
  table that raises the fence through `LAST_INSERT_ID(fence + 1)` (it comes back in
  the OK packet) and sets the owner and a 10 s lease, where no other owner's lease
  runs and, evaluated last, `GET_LOCK(name, 0) = 1`; then the engine's release, an
  `UPDATE` that frees the row if the token owns it and calls `RELEASE_LOCK` in its
  `WHERE` once the row is locked: two round trips, prepared once per session, on
  sessions set up as the engine's are (REPEATABLE READ, `CLIENT_FOUND_ROWS`). The
  round trip is `SELECT 1`.

That is what any client of the server must send for a lock that knows it holds.
It leaves out what the library adds: a fresh random token, the fencing token (the
SQL ceilings raise their row's fence, which is part of the layout, but not its
floor after a failover), the data-loss marker check on Redis, the mapping of a
name to PostgreSQL's lock key or MariaDB's lock name, the fair queue, the
connection pool, renewal, the breakers. A ratio of 1.00 means those cost nothing measurable;
below 1 is their cost. The ceiling is measured on the same server in the same run
as the figure it divides, so a slow machine slows both.

### The scenarios

- **uncontended**: N threads share one client (its pool sized to N), each looping
  lock + unlock on a name of its own. Figure: cycles per second; latency: one
  cycle. Ratio: cycles per second ÷ the raw ceiling's (higher is better; target
  ≥ 0.9).
- **handoff**: 8 waiters, each with a client of its own as 8 processes would have,
  contend for one name in fair mode. The holder does about 20 µs of work, stamps
  the time and unlocks; the latency is from that release to the next holder's lock
  returning. Ceiling: one server round trip (RTT, measured in rounds alternating
  with the hand-off rounds). Ratio: hand-off p50 ÷ RTT p50 (lower is better; a
  hand-off needs at least the release to reach the server and the grant to come
  back; target ≤ 3 on Redis). PostgreSQL and MariaDB queue the waiters in the
  server, so there the row also has a raw hand-off: 8 bare sessions pass a name
  among them with the engine's statements and nothing else, in rounds alternating
  with the library's. The waiter blocks in the server's queue (`pg_advisory_lock`,
  or `GET_LOCK` with a timeout) and claims the row, in the same statement on
  PostgreSQL and in a second one on MariaDB; the holder frees the row and gives
  the lock back in one statement. The table gives its p50 and p99 and the
  hand-off p50 ÷ the raw hand-off's p50 (lower is better).
- **herd**: 100 waiters, a client each, queue on one name behind a holder; each
  takes the lock and releases it at once, and a round ends when all 100 have had
  it. A library with a thundering herd wakes every waiter at each release, and
  each of them asks the server again: about W²/2 wake-ups and acquire calls a
  round. A queue with direct hand-off costs one wake-up and one acquire call (the
  one that queued the waiter) per acquisition: the target is 1 wake-up and at most
  1.1 acquire calls. The counters are `cerb_engine_info()`'s, summed over the
  waiters' clients. Latency and ratio as in handoff; on PostgreSQL and MariaDB the
  raw hand-off runs among 100 bare sessions, before the library's clients open.
- **many**: one client acquires 10 000 locks (8 threads), with renewal on and a
  3 s lease so that the watchdog renews each one every second, then holds them for
  the measured duration. CPU: the process's user + system time over wall time, as
  a share of one core (target < 5 %). Memory: the growth of the resident set ÷ the
  locks, everything the library keeps for a held lock included (target < 1 KiB).
  No ceiling: the figures are absolute. Every lock is checked still valid at the
  end.
- **guard**: the [idempotency guard](guard.md). N threads share one client, each on
  keys of its own. *begin + finish*: `cerb_guard_begin` + `cerb_guard_finish` with a
  16-byte result on a fresh key, the first caller of an operation. *duplicate*: begin on a
  key done before, answered `CERB_DUPLICATE` with the stored result: the retry.
  The ceiling sends the same server commands without the library (no SHA-256 of
  the key, no fresh token, no renewer): on Redis the guard's own begin and finish
  scripts, on ZooKeeper the create multi with a `getData` sent with it and the
  finish multi, on etcd one transaction each, on PostgreSQL and MariaDB the
  engine's own begin and finish statements, prepared once per session (on MariaDB
  a duplicate's begin is followed by the `SELECT` of the stored result, as the
  engine's is). The server itself counts the commands per operation, the
  library's beside the ceiling's: Redis `INFO commandstats`, a script's own
  commands included (6 per begin + finish, 2 per duplicate); ZooKeeper `mntr`'s
  packets received, a multi counting one (3 and 2); etcd's gRPC requests from
  `/metrics` (2 and 1); on PostgreSQL the transaction ids handed out, that is the
  statements that wrote or locked a row (2 and 1); MariaDB's `Questions`, the
  statements sent (2 and 2). Equal counts show the library sends nothing its
  layout does not need; the client's prober and the guard sweepers add a few in
  the background. A duplicate is one round trip on every engine but MariaDB, where
  it is two.
- **switch**: what an operator's switch costs once it is done. A client on a copy
  of the file (every engine in it, `active = "auto"`) follows `cerberus switch E`,
  run by the bench; after twice the longest a hold may live (the lease, the
  ZooKeeper session timeout, the etcd session TTL: 20 s with the defaults), each
  thread loops trylock + unlock over 16 names of its own on E. Ceiling: the same
  loop on a client that lists E alone, in alternating rounds of the same run.
  Ratio: switched ÷ alone, target ≥ 0.9. Each run and each client works in
  namespaces of its own, removed afterwards. What the switch costs before it
  settles, and the full gate after an automatic switch, are in
  [failover.md](failover.md#what-a-switch-costs).

The established clients run on the same servers in the same run, through the
scripts in [`bench/peers/`](../bench/peers): redis-py's `Lock`
(`acquire(blocking=False)` + `release`; in handoff it polls every 0.1 s, its
default, and is not fair), Apache Curator's `InterProcessMutex` and kazoo's `Lock`
on ZooKeeper (both fair), python-etcd3's `Lock` (not fair) and `etcdctl lock` (a
process and a session per cycle) on etcd. "Cerberus 1.40×" in uncontended is
Cerberus's cycles per second over the peer's (higher is better); "Cerberus 0.50× /
0.40×" in handoff is Cerberus's p50 and p99 over the peer's (lower is better). The
targets, uncontended: at least 3× redis-py (at 1 thread), 1.6× Curator, 2.8× kazoo
and 1× python-etcd3 and `etcdctl lock`; in handoff, a p50 at most 0.7× and a p99 at
most 0.4× Curator's. The bench runs no established client on PostgreSQL or
MariaDB.

Not in this run: **contended** (N clients spinning on one name against the raw
spin-and-retry cycle: `--scenario contended`) and **failover** (it kills a server:
[`bench/failover.sh`](../bench/failover.sh), see [failover.md](failover.md)).
Sentinel and Cluster deployments are measured the same way with `-c FILE` on servers
from `scripts/servers.sh start sentinel` or `cluster`. Every option is in
`cerberus-bench --help` and [cerberus-bench(1)](../man/cerberus-bench.1).

### Known gaps

- **Redis at 8 threads.** On a two-core machine the single `redis-server` process
  is the bottleneck, so the ratio is the ratio of server time per lock + unlock.
  The library's acquire and release are Lua scripts (the fence, the data-loss
  marker check, the fair queue's check, the server's clock), where the ceiling
  sends `SET NX PX` and a compare-and-delete: every `redis.call` in a script costs
  the server a fraction of a microsecond, and the scripts together cost it several
  times what the ceiling's commands do. Pipelining the threads' requests on
  shared connections was tried and was slower: the client's wake-ups cost more than
  the server's saved system calls.
- **redis-py at 1 thread.** Both it and the raw ceiling are round-trip bound, so
  the ceiling itself is well under 3× redis-py; the target cannot be met on
  loopback.
- **The ZooKeeper guard at 8 threads.** The library spreads the guard's requests
  over `zk.guard_sessions` sessions (4 by default), the ceiling has a session per
  thread, and ZooKeeper answers a session's requests in order: a read waits for the
  writes sent before it on its session. The client's CPU counts too:
  `libzookeeper_mt` hands every request between the caller, its I/O thread and its
  completion thread, on the cores the server also needs. A run right after another
  also pays for sweeping the earlier run's records, which the ceiling never
  deletes.
- **The hand-off on PostgreSQL and MariaDB.** The target of 3 round trips is below
  the raw ceiling itself there. The bare SQL hand-off (the holder's free, then the
  waiter's blocking lock returning and its claim of the row) is two writes that
  commit one after the other, each costing the server more than the `SELECT 1` the
  round trip is measured with, so it takes several round trips by itself. Those
  rows are held to the raw hand-off instead; their round trips are there to compare
  with the other engines.
- **PostgreSQL and MariaDB at 8 threads.** The file leaves `pg.pool` and
  `mysql.pool` at their default, 8 sessions, which is not above the 8 threads of
  one client, so some calls wait for a session (the bench says so on stderr); the
  raw ceiling has a session per thread.
- **After a switch, with PostgreSQL and MariaDB in the file.** The `pg` and `mysql`
  engines keep no closure records (`cerberus switch` writes them only on engines
  that have them), so a client that a switch pinned keeps the full gate on them:
  before and after each grant, on whichever engine, it asks PostgreSQL and MariaDB
  whether the name is free, and it takes the name there too (a claim, released
  with the hold). So the switch rows of every engine pay round trips to the SQL
  servers that the engine alone never does.
- **Round trips.** On a virtual machine the round trip is often bimodal, fast and
  slow regimes lasting seconds; a ratio to a round trip taken in a fast regime
  reads high. The alternating short rounds are there for that.

## Rerunning it

```sh
scripts/bench-report.sh                  # about 12 minutes on two cores: the page and the plot
scripts/bench-report.sh --duration 5     # steadier figures, longer run
scripts/bench-report.sh --from-json build/bench-report/bench.json   # re-render only
```

The script installs the missing Debian packages (`CERB_NO_INSTALL=1` only lists
them), builds the Release tree in `build/` (`CERB_BUILD_DIR`), starts its own
redis-server, ZooKeeper, etcd, PostgreSQL and MariaDB on ports 26679, 22681, 22779,
25791 and 23791 (`CERB_BR_REDIS_PORT`, `CERB_BR_ZK_PORT`, `CERB_BR_ETCD_PORT`,
`CERB_BR_PG_PORT`, `CERB_BR_MYSQL_PORT`), prepares them with `cerberus init` (the
SQL servers with the user and database `cerb` that `scripts/servers.sh` makes),
runs the command above once, and stops the servers by their PIDs however it
exits. It writes this page and `performance.png` (`--out DIR` elsewhere) and keeps
the JSON, its metadata and the bench's table in `build/bench-report/`. Commit the
page and the plot together: their history is this file's git log.

The memcached engine (not in this page's run) is measured the same way, against
its raw ceiling on the same server in the same run:

```sh
scripts/servers.sh start memcached --port 21211
build/bench/cerberus-bench --engine memcached --memcached-port 21211 --scenario uncontended,contended,handoff --threads 1,8 --duration 5
scripts/servers.sh stop memcached --port 21211
```

The Redlock mode (not in this page's run: its engine is `redis` in another mode) is
measured the same way, against its raw ceiling and node-redlock on the same three
masters in the same run:

```sh
scripts/servers.sh start redis --port 26411 --nodes 3
build/bench/cerberus-bench --engine redlock --port 26411 --scenario uncontended,handoff \\
    --threads 1,8 --peers --duration 5
scripts/servers.sh stop redis --port 26411 --nodes 3
```
"""


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fmt_int(v):
    """6997 -> "6 997" (a space between thousands, as the old README)."""
    if not num(v):
        return "n/a"
    return "{:,}".format(int(round(v))).replace(",", " ")


def fmt_us(v):
    if not num(v):
        return "n/a"
    return "%.1f" % v if v < 100 else fmt_int(v)


def fmt_ratio(v, suffix=""):
    return "%.2f%s" % (v, suffix) if num(v) else "n/a"


def fmt_near(v, bound):
    """v with two decimals, or three where two would read as the bound
    itself (0.403 against "at most 0.4" is a miss, and must show as one)."""
    two = "%.2f" % v
    return "%.3f" % v if float(two) == bound else two


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def threads_word(n, one="thread", many="threads"):
    return "%d %s" % (n, one if n == 1 else many)


def load_rows(path):
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError("%s: not a JSON array of objects (cerberus-bench --json)" % path)
    return rows


def engines_in(rows):
    seen = []
    for r in rows:
        e = r.get("engine")
        if isinstance(e, str) and e not in seen:
            seen.append(e)
    return seen


def own(rows, engine, scenario):
    """Cerberus's rows (peer null, no note) of one engine and scenario."""
    return [r for r in rows if r.get("engine") == engine and r.get("scenario") == scenario
            and r.get("peer") is None and "note" not in r]


def peers_of(rows, row):
    return [r for r in rows if r.get("peer") is not None and r.get("engine") == row.get("engine")
            and r.get("scenario") == row.get("scenario") and r.get("threads") == row.get("threads")]


def peer_name(p):
    return PEER_TITLES.get(p, p)


def peer_cell(rows, row):
    parts = []
    for p in peers_of(rows, row):
        name = peer_name(p["peer"])
        if p.get("peer_status") != "measured":
            parts.append("%s: %s (%s)" % (name, p.get("peer_status"), p.get("peer_reason")))
            continue
        c = p.get("cerberus_over_peer")
        if p.get("scenario") == "uncontended":
            parts.append("%s %s (Cerberus %s)" % (name, fmt_int(p.get("ops_per_s")),
                                                  fmt_ratio(c, "×")))
        else:
            parts.append("%s %s / %s (Cerberus %s / %s)" % (
                name, fmt_us(p.get("p50_us")), fmt_us(p.get("p99_us")), fmt_ratio(c, "×"),
                fmt_ratio(p.get("cerberus_over_peer_p99"), "×")))
    return " · ".join(parts) if parts else "—"


def cmds(v):
    return " (%.2f commands)" % v if num(v) else ""


def engine_table(rows, engine):
    """The lines of one engine's table."""
    out = ["| Scenario | Cerberus | Raw ceiling | Ratio | Established clients (same server, same run) |",
           "|---|--:|--:|--:|---|"]

    def add(label, cerb, ceiling, ratio, peers="—"):
        out.append("| %s | %s | %s | %s | %s |" % tuple(cell(x) for x in
                                                     (label, cerb, ceiling, ratio, peers)))

    for r in own(rows, engine, "uncontended"):
        add("uncontended, %s: lock + unlock per second" % threads_word(r["threads"]),
            fmt_int(r.get("ops_per_s")), fmt_int(r.get("ceiling_ops_per_s")),
            fmt_ratio(r.get("ratio")), peer_cell(rows, r))
    for r in own(rows, engine, "contended"):
        add("contended, %s on one name: acquisitions per second" % threads_word(
            r["threads"], "client", "clients"), fmt_int(r.get("ops_per_s")),
            fmt_int(r.get("ceiling_ops_per_s")), fmt_ratio(r.get("ratio")))
    def raw_handoff(scen, r):
        """The row against the raw hand-off (pg, mysql), when the JSON has one."""
        if r.get("raw_handoff") is None:
            return
        add("%s, %d waiters: the same against the raw hand-off, p50 / p99 µs"
            % (scen, r["threads"]),
            "%s / %s" % (fmt_us(r.get("p50_us")), fmt_us(r.get("p99_us"))),
            "raw %s / %s" % (fmt_us(r.get("raw_handoff_p50_us")),
                             fmt_us(r.get("raw_handoff_p99_us"))),
            fmt_ratio(r.get("ratio_to_raw_handoff")))

    for r in own(rows, engine, "handoff"):
        add("handoff, %d waiters: release to next grant, p50 / p99 µs" % r["threads"],
            "%s / %s" % (fmt_us(r.get("p50_us")), fmt_us(r.get("p99_us"))),
            "RTT %s" % fmt_us(r.get("ceiling_rtt_us")), fmt_ratio(r.get("ratio")),
            peer_cell(rows, r))
        raw_handoff("handoff", r)
    for r in own(rows, engine, "herd"):
        add("herd, %d waiters: release to next grant, p50 / p99 µs" % r["threads"],
            "%s / %s" % (fmt_us(r.get("p50_us")), fmt_us(r.get("p99_us"))),
            "RTT %s" % fmt_us(r.get("ceiling_rtt_us")), fmt_ratio(r.get("ratio")))
        raw_handoff("herd", r)
        add("herd, %d waiters: wake-ups / acquire calls per acquisition" % r["threads"],
            "%s / %s" % (fmt_ratio(r.get("wakeups_per_acq")), fmt_ratio(r.get("calls_per_acq"))),
            "target 1 / ≤ %.1f" % HERD_CALLS_MAX, "—")
    for r in own(rows, engine, "many"):
        lease = r.get("lease_ms")
        add("many, %s locks held and renewed (lease %s ms): CPU (%% of one core) / memory per lock"
            % (fmt_int(r.get("locks")), fmt_int(lease)),
            "%s %% / %s B" % ("%.2f" % r["cpu_percent"] if num(r.get("cpu_percent")) else "n/a",
                              fmt_int(r.get("bytes_per_lock"))),
            "target < %d %% / < 1 KiB" % MANY_CPU_MAX, "—")
    for scen, what in (("guard", "begin + finish"), ("guard-dup", "duplicate")):
        for r in own(rows, engine, scen):
            ceiling = (fmt_int(r.get("ceiling_ops_per_s")) + cmds(r.get("ceiling_server_cmds_per_op"))
                       if r.get("ceiling_missing") is None else r.get("ceiling_missing"))
            add("guard %s, %s: per second (server commands each)" % (what, threads_word(r["threads"])),
                fmt_int(r.get("ops_per_s")) + cmds(r.get("server_cmds_per_op")), ceiling,
                fmt_ratio(r.get("ratio")))
    for r in own(rows, engine, "switch"):
        add("after `cerberus switch %s` (the client on %s before), %s: trylock + unlock per second"
            % (engine, r.get("from"), threads_word(r["threads"])),
            fmt_int(r.get("ops_per_s")), "alone %s" % fmt_int(r.get("alone_ops_per_s")),
            fmt_ratio(r.get("ratio")))
    for r in rows:
        if r.get("engine") == engine and "note" in r:
            add(r.get("scenario"), r["note"], "—", "—")
    return out


def target_bounds(text):
    """The numbers of a peer row's target text (">= 3.0x", "p50 <= 0.7x, p99 <= 0.4x")."""
    out = []
    for word in str(text).replace(",", " ").split():
        try:
            out.append(float(word.rstrip("x")))
        except ValueError:
            pass
    return out


def first(rows, engine, scenario, threads=None):
    for r in own(rows, engine, scenario):
        if threads is None or r.get("threads") == threads:
            return r
    return None


def summary_table(rows, engines):
    out = ["| Engine | uncontended, 1 / 8 threads | handoff p50 ÷ RTT (÷ raw hand-off) | "
           "herd wake-ups / calls "
           "per acquisition | guard, 1 / 8 threads | duplicate, 1 / 8 threads | "
           "after a switch, 1 / 8 threads |",
           "|---|--:|--:|--:|--:|--:|--:|"]

    def pair(scen, key="ratio"):
        vals = [fmt_ratio(r.get(key)) for r in own(rows, e, scen)]
        return " / ".join(vals) if vals else "—"

    for e in engines:
        h = first(rows, e, "herd")
        herd = ("%s / %s" % (fmt_ratio(h.get("wakeups_per_acq")), fmt_ratio(h.get("calls_per_acq")))
                if h else "—")
        ho = first(rows, e, "handoff")
        handoff = fmt_ratio(ho.get("ratio")) if ho else "—"
        if ho and num(ho.get("ratio_to_raw_handoff")):
            handoff += " (%s)" % fmt_ratio(ho["ratio_to_raw_handoff"], "×")
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            ENGINE_TITLES.get(e, e), pair("uncontended"), handoff, herd, pair("guard"),
            pair("guard-dup"), pair("switch")))
    return out


def missed_targets(rows, engines):
    """What this run missed, one sentence each."""
    out = []
    for e in engines:
        t = ENGINE_TITLES.get(e, e)
        for r in own(rows, e, "uncontended") + own(rows, e, "guard") + own(rows, e, "guard-dup"):
            if num(r.get("ratio")) and r["ratio"] < UNCONTENDED_MIN:
                what = {"uncontended": "uncontended", "guard": "guard begin + finish",
                        "guard-dup": "guard duplicate"}[r["scenario"]]
                out.append("%s, %s at %s: %.2f of the raw ceiling (target ≥ %.1f)."
                           % (t, what, threads_word(r["threads"]), r["ratio"], UNCONTENDED_MIN))
        if e == "redis":
            for r in own(rows, e, "handoff"):
                if num(r.get("ratio")) and r["ratio"] > HANDOFF_RTT_MAX:
                    out.append("Redis, handoff: p50 %.2f round trips (target ≤ %.0f)."
                               % (r["ratio"], HANDOFF_RTT_MAX))
        for r in own(rows, e, "herd"):
            w, c = r.get("wakeups_per_acq"), r.get("calls_per_acq")
            if num(w) and num(c) and (w > HERD_WAKEUPS + 0.05 or c > HERD_CALLS_MAX):
                out.append("%s, herd: %.2f wake-ups and %.2f acquire calls per acquisition "
                           "(target 1 and ≤ %.1f)." % (t, w, c, HERD_CALLS_MAX))
        for r in own(rows, e, "many"):
            if num(r.get("not_valid")) and r["not_valid"] > 0:
                out.append("%s, many: %s of the %s locks held were no longer valid at the end."
                           % (t, fmt_int(r["not_valid"]), fmt_int(r.get("locks"))))
            cpu, b = r.get("cpu_percent"), r.get("bytes_per_lock")
            if (num(cpu) and cpu >= MANY_CPU_MAX) or (num(b) and b >= MANY_BYTES_MAX):
                out.append("%s, many: %s %% of one core and %s B per lock (target < %d %% "
                           "and < 1 KiB)." % (t, "%.2f" % cpu if num(cpu) else "n/a",
                                               fmt_int(b), MANY_CPU_MAX))
        for r in own(rows, e, "switch"):
            if r.get("target_met") is False:
                out.append("%s, after a switch at %s: %.2f of the engine alone (target ≥ %.1f)."
                           % (t, threads_word(r["threads"]), r["ratio"], r.get("target_min", 0.9)))
        for r in rows:
            if r.get("engine") != e or r.get("peer") is None or r.get("target_met") is not False:
                continue
            if r["scenario"] == "uncontended":
                line = ("%s, uncontended at %s: Cerberus %s× %s (target %s)."
                        % (t, threads_word(r["threads"]),
                           fmt_near(r["cerberus_over_peer"], target_bounds(r["target"])[0]),
                           peer_name(r["peer"]), r["target"]))
                base = first(rows, e, "uncontended", r["threads"])
                if base and num(base.get("ceiling_ops_per_s")) and num(r.get("ops_per_s")) \
                        and r["ops_per_s"] > 0:
                    line += (" The raw ceiling itself is %.2f× %s in this run."
                             % (base["ceiling_ops_per_s"] / r["ops_per_s"], peer_name(r["peer"])))
            else:
                b = target_bounds(r["target"]) + [None, None]
                line = ("%s, handoff: Cerberus's p50 / p99 %s× / %s× %s's (target %s)."
                        % (t, fmt_near(r["cerberus_over_peer"], b[0]),
                           fmt_near(r["cerberus_over_peer_p99"], b[1]),
                           peer_name(r["peer"]), r["target"]))
            out.append(line)
    return out


def machine_lines(meta):
    m = meta.get("machine") or {}
    mem = m.get("memory_gib")
    out = ["- **Machine:** %s, %s cores, %s GiB of memory; %s; %s." % (
        m.get("cpu", "unknown CPU"), m.get("cores", "?"),
        ("%g" % mem) if num(mem) else "?", m.get("kernel", "unknown kernel"),
        m.get("os", "unknown system"))]
    srv = meta.get("servers") or {}
    names = {"redis": "redis-server", "zk": "ZooKeeper", "etcd": "etcd",
             "pg": "PostgreSQL", "mysql": "MariaDB"}
    # How servers.sh starts them, where it matters for the figures.
    settings = {"redis": "nothing persisted by redis", "zk": "no fsync by ZooKeeper",
                "pg": "PostgreSQL with fsync off and synchronous_commit on",
                "mysql": "MariaDB's InnoDB log flushed to disk once a second"}
    keys = [k for k in names if k in srv]
    parts = ["%s %s" % (names[k], (srv.get(k) or {}).get("version") or "(version unknown)")
             for k in keys]
    if parts:
        out.append("- **Servers:** %s; one node each on loopback, on the same machine as the "
                   "clients, started by the script as the tests start them "
                   "([`scripts/servers.sh`](../scripts/servers.sh): %s)."
                   % (", ".join(parts), ", ".join(settings[k] for k in keys if k in settings)))
    peers = meta.get("peers") or []
    if peers:
        out.append("- **Peers:** %s." % ", ".join(
            "%s %s" % (p.get("peer"), ("(Debian %s %s)" % (p.get("package"), p["version"]))
                       if p.get("version") else "(not installed)") for p in peers))
    commit = meta.get("commit") or "unknown"
    date = meta.get("date_utc") or "unknown"
    if len(date) == 20 and date[10] == "T" and date.endswith("Z"):
        date = "%s %s UTC" % (date[:10], date[11:16])
    out.append("- **Date:** %s; the measurement took %s s." % (date, meta.get("bench_seconds", "?")))
    out.append("- **Commit:** `%s`%s%s." % (
        commit[:12], " with uncommitted changes to the measured code"
        if meta.get("commit_dirty") else "",
        "" if meta.get("build_type") in (None, "Release")
        else " (a %s build, not Release)" % meta.get("build_type")))
    la, after = meta.get("loadavg_before"), meta.get("loadavg_after")
    if num(la):
        during = ""
        if isinstance(after, list) and len(after) == 3 and all(num(x) for x in after):
            during = ", over its last 5 minutes %.2f" % after[1]
        out.append("- **Load average:** %.2f just before the run%s, on %s cores. Other work on "
                   "the machine shows in the figures; the ratios, measured in alternating "
                   "rounds, suffer less than the absolute numbers."
                   % (la, during, m.get("cores", "?")))
    return out


def config_text(meta):
    return meta.get("config_text")


def count_word(n):
    return {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}.get(n, str(n))


def render_page(rows, meta, plot):
    engines = [e for e in engines_in(rows)]
    servers = count_word(len(engines))
    L = []
    L.append("# Performance")
    L.append("")
    L.append("For anyone choosing an engine or judging what the library costs: the figures of "
             "one `cerberus-bench` run on the %s servers, each set against the raw ceiling "
             "(the bare server commands a lock needs, sent without the library, on the same "
             "server in the same run) and against the established clients of the server where "
             "the bench has them. " % servers +
             "This page is generated by [`scripts/bench-report.sh`](../scripts/bench-report.sh) "
             "and holds the current figures only; earlier ones are in the git log of this file. "
             "Absolute numbers vary from machine to machine, so compare the ratios.")
    L.append("")
    L.append("## This run")
    L.append("")
    L.extend(machine_lines(meta))
    L.append("")
    L.append("The command (from the top of the checkout, after `%s` had built the Release tree "
             "and started the servers):" % (meta.get("script_command") or "scripts/bench-report.sh"))
    L.append("")
    L.append("```sh")
    L.append(meta.get("command") or "cerberus-bench (command unknown)")
    L.append("```")
    cfg = config_text(meta)
    if cfg:
        L.append("")
        L.append("`%s` names the %s servers and sets nothing else, so every other key "
                 "has its default:" % (meta.get("config_path") or "-c FILE", servers))
        L.append("")
        L.append("```text")
        L.extend(cfg.rstrip("\n").splitlines())
        L.append("```")
    L.append("")
    L.append("## Summary")
    L.append("")
    L.append("Ratios to the raw ceiling (≥ 0.9 is the target; 1.00 means the library costs "
             "nothing over the bare commands), the hand-off in server round trips (and, where the "
             "server queues the waiters itself, over the raw hand-off), and the herd "
             "in wake-ups and acquire calls per acquisition (1 and 1 is a queue with direct "
             "hand-off). The tables below have the figures behind them.")
    L.append("")
    L.extend(summary_table(rows, engines))
    for e in engines:
        L.append("")
        L.append("## %s" % ENGINE_TITLES.get(e, e))
        L.append("")
        L.extend(engine_table(rows, e))
    L.append("")
    L.append("## The plot")
    L.append("")
    L.append("Top: operations per second (log scale), each engine's bar beside its raw ceiling "
             "(hatched) and the peers; the switch rows' engine-alone figure is in the tables only. "
             "Bottom: latency in microseconds (log scale), p50 solid and p99 hatched.")
    L.append("")
    L.append("![cerberus-bench: ops/s and p50/p99 per scenario, engines and peers side by side](%s)"
             % plot)
    L.append("")
    L.append("## Targets this run missed")
    L.append("")
    missed = missed_targets(rows, engines)
    if missed:
        L.append("The targets are DESIGN.md section 10's, as `cerberus-bench` prints them "
                 "([why some are out of reach](#known-gaps)).")
        L.append("")
        L.extend("- " + m for m in missed)
    else:
        L.append("None: every figure with a target met it in this run.")
    L.append("")
    L.append(FIXED_TEXT.strip("\n"))
    L.append("")
    L.append(MARKER)
    L.append("")
    return "\n".join(L)


def cmd_render(a):
    try:
        rows = load_rows(a.json)
    except (OSError, ValueError) as e:
        print("bench_report.py: %s" % e, file=sys.stderr)
        return 1
    meta = {}
    if a.meta:
        try:
            with open(a.meta) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            print("bench_report.py: warning: %s: %s; the page will say little about the run"
                  % (a.meta, e), file=sys.stderr)
    page = render_page(rows, meta, a.plot)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(page)
    os.replace(tmp, a.out)
    print("bench_report.py: wrote %s (%d rows, engines %s)"
          % (a.out, len(rows), ", ".join(engines_in(rows))))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="bench_report.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta")
    m.add_argument("--out", required=True)
    m.add_argument("--command", required=True)
    m.add_argument("--script-command")
    m.add_argument("--started")
    m.add_argument("--seconds", type=int)
    m.add_argument("--loadavg", type=float)
    m.add_argument("--redis-port", type=int)
    m.add_argument("--zk-port", type=int)
    m.add_argument("--etcd-port", type=int)
    m.add_argument("--pg-port", type=int)
    m.add_argument("--mysql-port", type=int)
    m.add_argument("--root")
    m.add_argument("--build-dir")
    m.add_argument("--config", help="the -c FILE of the command, shown on the page")
    r = sub.add_parser("render")
    r.add_argument("--json", required=True)
    r.add_argument("--meta")
    r.add_argument("--out", required=True)
    r.add_argument("--plot", default="performance.png")
    a = ap.parse_args(argv)
    if a.cmd == "meta":
        return cmd_meta(a)
    return cmd_render(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
