#!/usr/bin/python3
"""redispy_lock.py — redis-py's Lock, the redis engine's peer, measured the
way cerberus-bench measures Cerberus, on the same server in the same run
(`cerberus-bench --peers` runs it; DESIGN.md §10: Cerberus >= 3 x redis-py's
Lock uncontended at 1 thread).

usage: redispy_lock.py --check | --scenario uncontended|handoff|elect-failover
                       [--threads N] [--duration S] [--host H] [--port P]
                       [--db N] [--work DIR] [--rounds R] [--lease-ms L]

  uncontended  N threads of one process (the GIL is redis-py's own limit,
               as it is for a Python service), a connection pool shared by
               them, each looping acquire(blocking=False) + release on a
               name of its own; a cycle's latency is from before acquire
               to after release.
  handoff      N processes, each its own client, on one name, blocking
               acquire with redis-py's default polling (sleep 0.1 s); a
               holder does 20 us of busy work. The lock is not fair: a
               releaser contending again at once takes it back while the
               others sleep (and nothing is handed off), so it rests one
               polling interval first, as a waiter that just missed would;
               each process starts at a random phase of the interval.
               Hand-off (between two different processes) =
               the next holder's acquire return minus the previous
               holder's release stamp (CLOCK_MONOTONIC, shared by
               processes on Linux).
  elect-failover  redis-py has no election recipe; the election a redis-py
               service writes is a Lock loop, and that is what runs: N
               candidate processes (this script with --candidate), each
               blocking in lock.acquire() on one name with a lease (timeout)
               of --lease-ms, polling every 0.1 s (redis-py's default);
               the winner leads, extends the lease every third of it and
               prints its CLOCK_MONOTONIC stamp. peerlib.elect_failover
               kills the leader (SIGKILL) --rounds times; the failover is
               the next leader's stamp minus the kill's.
uncontended and handoff run an unmeasured warm-up of a tenth of the time
(0.05..0.5 s) first.

Output, one line on stdout (the protocol every peer script speaks):
  ok <what>            --check: the peer can run
  skip <why>           exit status 3: the peer is not installed
  result peer=redis-py scenario=S threads=N ops_per_s=X p50_us=.. p90_us=..
         p99_us=.. max_us=.. samples=K # how it was measured
Uses /usr/bin/python3 with Debian's python3-redis (cerberus-bench runs it
with $CERB_PEER_PYTHON, default /usr/bin/python3). --work is accepted and
unused. Lock names: bench-redispy-<pid>-*.
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def have_redis():
    try:
        import redis
    except ImportError:
        peerlib.skip("python3-redis is not installed for %s (Debian package "
                     "python3-redis)" % sys.executable)
    return redis


def client(a):
    redis = have_redis()
    return redis.Redis(host=a.host, port=a.port, db=a.db, socket_timeout=10,
                       socket_connect_timeout=5)


def unc_worker(a, idx, clock, out):
    r = out["client"]
    lock = r.lock("bench-redispy-%d-u%d" % (os.getpid(), idx), timeout=10)

    def cycle():
        if not lock.acquire(blocking=False):
            raise RuntimeError("an uncontended lock was busy")
        lock.release()
    out[idx] = clock.cycles(cycle)


def handoff_proc(idx, a, name):
    r = client(a)
    r.ping()  # connected before the clock starts
    lock = r.lock(name, timeout=10)  # sleep=0.1: redis-py's default polling

    def loop(t0):
        clock = peerlib.Clock(a.duration, t0)
        ev = []
        # Independent services poll at independent phases; started
        # together, the processes would poll in step and hand off in bursts.
        time.sleep(random.uniform(0, lock.sleep))
        while True:
            if not lock.acquire(blocking=True, blocking_timeout=30):
                raise RuntimeError("no grant in 30 s")
            t_acq = clock.now()
            t_rel = peerlib.busy_work(t_acq)
            lock.release()
            if clock.start <= t_acq < clock.end:
                ev.append((t_acq, t_rel, idx))
            if t_rel >= clock.end:
                break
            # Rest one polling interval, as a waiter that just missed
            # would: the lock is not fair, and a releaser contending again
            # at once takes it back while the others sleep.
            time.sleep(lock.sleep)
        return ev
    return loop


def candidate(argv):
    """--candidate HOST PORT DB NAME IDX LEASE_MS: one election candidate
    (see elect-failover above), for peerlib.elect_failover."""
    import threading
    host, port, db, name, idx, lease_ms = argv
    redis = have_redis()
    r = redis.Redis(host=host, port=int(port), db=int(db), socket_timeout=10,
                    socket_connect_timeout=5)
    lease = int(lease_ms) / 1000.0
    lock = r.lock(name, timeout=lease)     # sleep=0.1: redis-py's default
    r.ping()
    print("ready %s" % idx, flush=True)
    lock.acquire(blocking=True)
    t = time.monotonic_ns()
    print("elected %s %d" % (idx, t), flush=True)
    done = threading.Event()

    def renew():
        while not done.wait(lease / 3):
            lock.extend(lease, replace_ttl=True)
    threading.Thread(target=renew, daemon=True).start()
    while sys.stdin.buffer.read(64):
        pass
    done.set()
    try:
        lock.release()
    except redis.exceptions.LockError:
        pass
    sys.exit(0)


def main():
    if sys.argv[1:2] == ["--candidate"]:
        candidate(sys.argv[2:])
    a = peerlib.parse_args(__doc__, redis=True,
                           scenarios=("uncontended", "handoff", "elect-failover"))
    redis = have_redis()
    if a.check:
        c = client(a)
        try:
            c.ping()
        except redis.exceptions.RedisError as e:
            peerlib.fail("redis at %s:%d: %s" % (a.host, a.port, e))
        peerlib.ok("redis-py %s" % redis.__version__)
    if a.scenario == "elect-failover":
        name = "bench-redispy-%d-e" % os.getpid()
        me = os.path.abspath(__file__)
        peerlib.elect_failover(
            a, lambda i: [sys.executable, me, "--candidate", a.host, str(a.port), str(a.db),
                          name, str(i), str(a.lease_ms)],
            "redis-py", "a redis-py Lock loop per process, lease %d ms extended every "
            "third, blocking acquire polling every 0.1 s" % a.lease_ms)
    if a.scenario == "uncontended":
        out = {"client": client(a)}
        clock = peerlib.Clock(a.duration)
        peerlib.run_threads(a.threads, lambda i: unc_worker(a, i, clock, out))
        lat = [x for i in range(a.threads) for x in out[i]]
        peerlib.result("redis-py", a, len(lat) / a.duration, lat,
                       "%d thread(s) of one process, one shared connection "
                       "pool, acquire(blocking=False)+release" % a.threads)
    else:
        name = "bench-redispy-%d-h" % os.getpid()
        ev = peerlib.run_procs(a.threads, handoff_proc, (a, name), a.duration)
        lat = peerlib.handoffs(ev)
        peerlib.result("redis-py", a, len(ev) / a.duration, lat,
                       "%d processes, blocking acquire polling every 0.1 s "
                       "(redis-py's default); not fair, so a releaser rests "
                       "one polling interval before contending again"
                       % a.threads)


if __name__ == "__main__":
    peerlib.main(main)
