#!/usr/bin/python3
"""kazoo_lock.py — kazoo's Lock recipe, a peer of the zk engine, measured the
way cerberus-bench measures Cerberus, on the same ZooKeeper in the same run
(`cerberus-bench --peers` runs it; DESIGN.md §10: Cerberus >= 2.8 x kazoo
uncontended).

usage: kazoo_lock.py --check | --scenario uncontended|handoff
                     [--threads N] [--duration S] [--hosts H] [--root R]
                     [--work DIR]

  uncontended  one KazooClient shared by N threads (as the Cerberus side
               shares one client), each looping acquire + release on a lock
               path of its own; a cycle's latency is from before acquire to
               after release.
  handoff      N processes, each its own KazooClient (its own session), on
               one path; a holder does 20 us of busy work. kazoo's Lock is
               fair (sequential children, each waiter watching the one
               ahead), so a releaser simply queues again. Hand-off = the
               next holder's acquire return minus the previous holder's
               release stamp (CLOCK_MONOTONIC, shared by processes).
Both run an unmeasured warm-up of a tenth of the time (0.05..0.5 s) first.

Output: one line on stdout, "ok <what>" (--check), "skip <why>" (exit 3:
python3-kazoo is not installed) or "result peer=kazoo ..." (see peerlib.py).
Uses /usr/bin/python3 with Debian's python3-kazoo (cerberus-bench runs it
with $CERB_PEER_PYTHON). Lock paths: <root>/bench-kz-<pid>-*. --work is
accepted and unused.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def have_kazoo():
    try:
        import kazoo.client
    except ImportError:
        peerlib.skip("python3-kazoo is not installed for %s (Debian package "
                     "python3-kazoo)" % sys.executable)
    return kazoo


def client(a):
    import logging
    # kazoo logs connection chatter through the root logger; keep stdout
    # for the one result line.
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    kazoo = have_kazoo()
    c = kazoo.client.KazooClient(hosts=a.hosts, timeout=10.0)
    c.start(timeout=10)
    return c


def unc_worker(a, c, idx, clock, out):
    lock = c.Lock("%s/bench-kz-%d-u%d" % (a.root, os.getpid(), idx), "bench")

    def cycle():
        if not lock.acquire(blocking=True, timeout=30):
            raise RuntimeError("an uncontended lock was not granted in 30 s")
        lock.release()
    out[idx] = clock.cycles(cycle)


def handoff_proc(idx, a, path):
    c = client(a)  # connected before the clock starts
    lock = c.Lock(path, "bench-%d" % idx)

    def loop(t0):
        clock = peerlib.Clock(a.duration, t0)
        ev = []
        try:
            while True:
                if not lock.acquire(blocking=True, timeout=30):
                    raise RuntimeError("no grant in 30 s")
                t_acq = clock.now()
                t_rel = peerlib.busy_work(t_acq)
                lock.release()
                if clock.start <= t_acq < clock.end:
                    ev.append((t_acq, t_rel, idx))
                if t_rel >= clock.end:
                    break
        finally:
            c.stop()
            c.close()
        return ev
    return loop


def main():
    a = peerlib.parse_args(__doc__, zk=True)
    kazoo = have_kazoo()
    if a.check:
        try:
            c = client(a)
        except Exception as e:  # noqa: B902 - kazoo raises several kinds
            peerlib.fail("ZooKeeper at %s: %s: %s" % (a.hosts, type(e).__name__, e))
        c.stop()
        c.close()
        ver = getattr(kazoo, "__version__", None)
        if ver is None:
            try:
                from kazoo import version
                ver = version.__version__
            except ImportError:
                ver = "?"
        peerlib.ok("kazoo %s" % ver)
    if a.scenario == "uncontended":
        c = client(a)
        out = {}
        clock = peerlib.Clock(a.duration)
        try:
            peerlib.run_threads(a.threads,
                                lambda i: unc_worker(a, c, i, clock, out))
        finally:
            c.stop()
            c.close()
        lat = [x for i in range(a.threads) for x in out[i]]
        peerlib.result("kazoo", a, len(lat) / a.duration, lat,
                       "%d thread(s) sharing one KazooClient, acquire+release"
                       % a.threads)
    else:
        path = "%s/bench-kz-%d-h" % (a.root, os.getpid())
        ev = peerlib.run_procs(a.threads, handoff_proc, (a, path), a.duration)
        lat = peerlib.handoffs(ev)
        peerlib.result("kazoo", a, len(ev) / a.duration, lat,
                       "%d processes, a KazooClient each; fair, the releaser "
                       "queues again" % a.threads)


if __name__ == "__main__":
    peerlib.main(main)
