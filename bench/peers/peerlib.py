"""peerlib.py — what the Python peer scripts of cerberus-bench share: the
command line, the timing, the percentiles and the one-line output protocol
that bench/peers.c reads.

Command line (every peer script, Python or shell):
  --check                      say whether the peer can run, measure nothing
  --scenario uncontended|handoff|semaphore|rwlock|elect-failover
                               (each script takes those it measures)
  --threads N                  uncontended: threads (or processes); handoff:
                               contenders; semaphore: clients (2 x permits);
                               rwlock: clients; elect-failover: candidate
                               processes (default 1)
  --permits N                  semaphore: the limit
  --rounds R                   elect-failover: leaders killed (default 5)
  --lease-ms L                 elect-failover: the lease (or session timeout,
                               or TTL) Cerberus's candidates had; the peer's
                               is set to it where the peer lets it be set
  --duration S                 measured seconds (default 5)
  --work DIR                   a scratch directory the bench owns (unused here)
plus the server: --host/--port/--db (redis), --hosts/--root (zk) or
--endpoint URL (etcd).

Output: exactly one line on stdout,
  ok <what>                    exit 0, after --check
  skip <why>                   exit 3: the peer is not installed here
  result peer=P scenario=S threads=N ops_per_s=X p50_us=.. p90_us=..
         p99_us=.. max_us=.. samples=K # how it was measured
and any error on stderr with exit status 1.

Timing follows bench/scenarios.c: a measured window of --duration seconds
after an unmeasured warm-up of a tenth of it (0.05..0.5 s), CLOCK_MONOTONIC
(time.monotonic_ns, one clock for every process on Linux), latencies kept
in nanoseconds, percentiles by nearest rank. A hand-off is the next
holder's acquire return minus the previous holder's release stamp, taken
just before it releases, as in the bench's handoff scenario; the holder
busy-works 20 us first.

elect-failover (elect_failover below) drives K candidate processes of any
kind, each a command that prints "ready I" once it campaigns and "elected
I T" (T its CLOCK_MONOTONIC stamp, ns) the moment it leads, or, for a
command that cannot stamp (etcdctl), any first line, stamped here when
read. The leader is sent SIGKILL, its term left to end as a crashed
leader's would; the failover is the next leader's stamp minus the kill's;
a new candidate takes the dead one's place; R rounds. Candidates die with
this script (PR_SET_PDEATHSIG) and on EOF of their stdin, and are killed
by PID (never by name) at the end.
"""
import argparse
import ctypes
import multiprocessing as mp
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback

HOLD_NS = 20000          # handoff: busy work while holding, as scenarios.c
SCENARIOS = ("uncontended", "handoff", "semaphore", "rwlock", "elect-failover")
SETUP_TIMEOUT_S = 60     # processes and threads must be ready by then


class Usage(Exception):
    pass


def ok(what):
    print("ok " + what, flush=True)
    sys.exit(0)


def skip(why):
    print("skip " + why, flush=True)
    sys.exit(3)


def fail(why):
    print("error: " + why, file=sys.stderr, flush=True)
    sys.exit(1)


def parse_args(doc, redis=False, zk=False, etcd=False, peer_choices=None,
               scenarios=None):
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--scenario", choices=SCENARIOS)
    p.add_argument("--permits", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lease-ms", type=int, default=10000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--work")
    if peer_choices:
        p.add_argument("--peer", choices=peer_choices, required=False)
    if redis:
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=26379)
        p.add_argument("--db", type=int, default=0)
    if zk:
        p.add_argument("--hosts", default="127.0.0.1:22181")
        p.add_argument("--root", default="/cerberus/locks")
    if etcd:
        p.add_argument("--endpoint", default="http://127.0.0.1:22379")
    try:
        a = p.parse_args()
    except SystemExit:
        print(doc, file=sys.stderr)
        sys.exit(2)
    if a.help:
        print(doc)
        sys.exit(0)
    err = None
    if not a.check and not a.scenario:
        err = "--scenario %s (or --check) is required" % "|".join(SCENARIOS)
    elif a.scenario and a.scenario not in (scenarios or ("uncontended", "handoff")):
        err = "this peer does not measure --scenario %s" % a.scenario
    elif not 1 <= a.rounds <= 20 or not 100 <= a.lease_ms <= 3600000:
        err = "--rounds must be in 1..20, --lease-ms in 100..3600000"
    elif not 1 <= a.threads <= 1024:
        err = "--threads must be in 1..1024"
    elif not 0.1 <= a.duration <= 3600:
        err = "--duration must be in 0.1..3600 seconds"
    elif peer_choices and not a.peer:
        err = "--peer %s is required" % "|".join(peer_choices)
    elif zk and not a.root.startswith("/"):
        err = "--root must be an absolute path"
    if err:
        print("%s: error: %s" % (sys.argv[0], err), file=sys.stderr)
        sys.exit(2)
    return a


def now():
    return time.monotonic_ns()


class Clock:
    """The measured window [start, end) of one run, in monotonic ns."""

    def __init__(self, duration_s, t0=None):
        warm = min(0.5, max(0.05, duration_s / 10.0))
        t0 = now() if t0 is None else t0
        self.start = t0 + int(warm * 1e9)
        self.end = self.start + int(duration_s * 1e9)

    @staticmethod
    def now():
        return time.monotonic_ns()

    def cycles(self, cycle):
        """Run cycle() (one acquire + release) back to back until the window
        ends; the latencies (ns) of those that started inside it."""
        lat = []
        while True:
            t0 = self.now()
            cycle()
            t1 = self.now()
            if t1 >= self.end:
                return lat
            if t0 >= self.start:
                lat.append(t1 - t0)


def busy_work(t_acq):
    """The critical section: HOLD_NS of real work, not a sleep. Returns the
    release stamp."""
    t = now()
    while t - t_acq < HOLD_NS:
        t = now()
    return t


def pct(sorted_vals, q):
    """Nearest rank, as CuratorBench and the bench's histogram."""
    n = len(sorted_vals)
    if n == 0:
        return 0.0
    i = max(0, min(n - 1, int(-(-q * n // 1)) - 1))
    return sorted_vals[i]


def handoffs(events):
    """events: (t_acquired, t_released, contender) per hold, any order ->
    the hand-off latencies between consecutive holds of two different
    contenders (a contender re-taking its own lock hands nothing off)."""
    events = sorted(events)
    out = []
    for prev, cur in zip(events, events[1:]):
        d = cur[0] - prev[1]
        if d >= 0 and cur[2] != prev[2]:
            out.append(d)
    return out


def result(peer, a, ops_per_s, lat_ns, how):
    lat = sorted(lat_ns)
    if not lat:
        fail("no %s measured in %.1f s" % (
            "cycle" if a.scenario == "uncontended" else "hand-off", a.duration))
    us = [pct(lat, q) / 1000.0 for q in (0.5, 0.9, 0.99)]
    print("result peer=%s scenario=%s threads=%d ops_per_s=%.6g p50_us=%.1f "
          "p90_us=%.1f p99_us=%.1f max_us=%.1f samples=%d # %s"
          % (peer, a.scenario, a.threads, ops_per_s, us[0], us[1], us[2],
             lat[-1] / 1000.0, len(lat), how), flush=True)
    sys.exit(0)


class Baton:
    """Fair turns for a lock that is not fair. After releasing, a contender
    steps aside until another one has taken the lock, as a fair lock's
    releaser queues behind the waiters; otherwise the releaser re-acquires
    at once (it is awake, the waiters are polling or watching) and what is
    measured is no hand-off at all. Shared by forked processes."""

    def __init__(self):
        ctx = mp.get_context("fork")
        self.holder = ctx.Value("i", -1, lock=False)
        self.cond = ctx.Condition()

    def taken(self, who):
        with self.cond:
            self.holder.value = who
            self.cond.notify_all()

    def step_aside(self, who, until_ns):
        """Wait until someone else holds, or until @until_ns (monotonic)."""
        with self.cond:
            while self.holder.value == who:
                left = (until_ns - now()) / 1e9
                if left <= 0:
                    return
                self.cond.wait(left)


def run_threads(n, body):
    """Run body(i) in n threads; re-raise the first failure."""
    errors = []

    def wrap(i):
        try:
            body(i)
        except BaseException as e:  # noqa: B902 - reported below
            errors.append("%s: %s" % (type(e).__name__, e))

    ts = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(errors[0])


def _proc_main(idx, target, args, ready, go, start, q):
    try:
        loop = target(idx, *args)          # connect: not timed
        ready.wait(SETUP_TIMEOUT_S)
        go.wait(SETUP_TIMEOUT_S)
        q.put(("ok", loop(start.value)))
    except BaseException as e:  # noqa: B902 - sent to the parent
        q.put(("error", "%s: %s" % (type(e).__name__, e)))


def run_procs(n, target, args, duration_s):
    """n processes; in process i, target(i, *args) sets up (connects) and returns
    loop(t0), which runs the measured loop with Clock(duration_s, t0) and
    returns a list of events. Every process is ready before t0 is taken,
    so the warm-up does not have to cover their start. Returns the events
    of all, or raises the first failure."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ready, go = ctx.Barrier(n + 1), ctx.Barrier(n + 1)
    start = ctx.Value("q", 0)
    ps = [ctx.Process(target=_proc_main, args=(i, target, args, ready, go, start, q),
                      daemon=True) for i in range(n)]
    for p in ps:
        p.start()
    try:
        ready.wait(SETUP_TIMEOUT_S)
        start.value = now()
        go.wait(SETUP_TIMEOUT_S)
    except threading.BrokenBarrierError:
        pass  # a child failed during set-up: its message is in the queue
    res, err = [], None
    deadline = time.monotonic() + SETUP_TIMEOUT_S + duration_s + 30
    for _ in ps:
        left = deadline - time.monotonic()
        try:
            kind, v = q.get(timeout=max(0.1, left))
        except Exception:  # queue.Empty
            err = err or "a process did not report within its deadline"
            break
        if kind == "ok":
            res.extend(v)
        else:
            err = err or v
            ready.abort()
            go.abort()
    for p in ps:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()  # our own child, by its handle
            p.join()
    if err:
        raise RuntimeError(err)
    return res


def main(fn):
    try:
        fn()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as e:  # noqa: B902 - one clear line, exit 1
        traceback.print_exc(limit=3, file=sys.stderr)
        fail("%s: %s" % (type(e).__name__, e))


# ---- elect-failover ----

SETTLE_S = 0.3           # ready -> kill: campaigns reach the server


def _die_with_parent():
    """preexec_fn: SIGKILL when this script dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


class _Cand:
    def __init__(self, idx, argv, stamps, ready_after_s):
        self.idx = idx
        self.stamps = stamps
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  preexec_fn=_die_with_parent)
        self.buf = b""
        self.ready = False
        self.ready_at = None if stamps else now() + int(ready_after_s * 1e9)
        self.elected_ns = None

    def feed(self, data):
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            w = line.decode(errors="replace").split()
            if self.stamps and w[:1] == ["ready"]:
                self.ready = True
            elif self.stamps and w[:1] == ["elected"] and len(w) == 3:
                self.elected_ns = int(w[2])
            elif not self.stamps and self.elected_ns is None and w:
                self.elected_ns = now()     # stamped when read

    def is_ready(self):
        if not self.ready and self.ready_at is not None and now() >= self.ready_at:
            self.ready = True
        return self.ready

    def stop(self, grace_s):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.p.kill()                   # our child, by its PID
            self.p.wait()
        self.p.stdout.close()


def elect_failover(a, argv_for, peer, how, stamps=True, ready_after_s=1.0,
                   bound_ms=None):
    """Run the elect-failover measurement with candidates argv_for(idx) and
    print the result line: p50 = the median failover, p99 = max = the
    longest, ops_per_s = rounds / their summed time."""
    k, rounds = a.threads, a.rounds
    bound_ms = bound_ms or a.lease_ms
    wait_ns = int((3 * bound_ms / 1000.0 + 10) * 1e9)
    sel = selectors.DefaultSelector()
    cands = {}
    nxt = [0]

    def spawn():
        c = _Cand(nxt[0], argv_for(nxt[0]), stamps, ready_after_s)
        nxt[0] += 1
        cands[c.idx] = c
        sel.register(c.p.stdout, selectors.EVENT_READ, c)
        return c

    def pump(until, deadline_ns, skip=None):
        while not until():
            left = (deadline_ns - now()) / 1e9
            if left <= 0:
                raise RuntimeError("timed out waiting for the candidates")
            for key, _ in sel.select(timeout=min(left, 0.2)):
                c = key.data
                if c is skip:
                    continue
                data = os.read(key.fd, 4096)
                if not data:
                    raise RuntimeError("candidate %d exited (status %s)"
                                       % (c.idx, c.p.poll()))
                c.feed(data)

    def leader(skip=None):
        for c in cands.values():
            if c is not skip and c.elected_ns is not None:
                return c
        return None

    fo = []
    overlaps = 0
    try:
        for _ in range(k):
            spawn()
        pump(lambda: all(c.is_ready() for c in cands.values()) and leader(),
             now() + wait_ns + int(60e9))
        for rnd in range(rounds):
            ld = leader()
            time.sleep(SETTLE_S)
            sel.unregister(ld.p.stdout)
            t_kill = now()
            ld.p.kill()                     # SIGKILL, our child by its PID
            pump(lambda: leader(ld) is not None, t_kill + wait_ns, skip=ld)
            # A successor stamped before the kill was elected while the
            # killed leader still believed it led: the peer's lease lapsed
            # (a late renewal on a loaded machine). Its failover is 0, and
            # the row says how often that happened.
            d = leader(ld).elected_ns - t_kill
            if d < 0:
                overlaps += 1
            fo.append(max(d, 0))
            ld.p.wait()
            ld.p.stdout.close()
            ld.p.stdin.close()
            del cands[ld.idx]
            if rnd + 1 < rounds:
                spawn()
                pump(lambda: all(c.is_ready() for c in cands.values()),
                     now() + int(60e9))
    finally:
        for c in list(cands.values()):
            c.stop(3)
    a.duration = max(sum(fo) / 1e9, 1e-9)  # for result(): rounds over their time
    fo_ms = ", ".join("%.0f" % (x / 1e6) for x in fo)
    twice = ("; %d times the next leader was elected before the kill (two leaders: "
             "the peer's lease lapsed)" % overlaps) if overlaps else ""
    result(peer, a, len(fo) / max(sum(fo) / 1e9, 1e-9), fo,
           "%s; %d candidates, leader killed %d times: %s ms%s" % (how, k, len(fo), fo_ms,
                                                               twice))
