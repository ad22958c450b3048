#!/usr/bin/python3
"""The etcd engine's peers, measured the way cerberus-bench measures
Cerberus, on one etcd endpoint, for the closing note of the etcd engine
(DESIGN.md §10: >= python-etcd3 and etcdctl; hand-off p50 <= 6 ms,
p90 <= 10 ms with 8 contenders).

usage: etcd_peers.py ENDPOINT [--duration S] [--clients N[,N...]]
                     [--contenders N] [--skip-etcdctl] [--skip-python]

  ENDPOINT      host:port of the etcd client URL, e.g. 127.0.0.1:22379

Measures, each on lock names of its own (bench-peer-<pid>-...):
  python-etcd3 uncontended  N client processes (default 1 and 8), each with
      its own client, lock.acquire() + lock.release() on a name of its own;
      cycles/s summed over the processes. (python-etcd3's Lock grants a
      new lease per acquire: three writes per cycle.)
  python-etcd3 handoff  --contenders processes (default 8) on one name;
      hand-off = the next holder's acquire return minus the previous
      holder's release call (CLOCK_MONOTONIC, shared by processes). Its
      acquire loop is re-implemented step for step (py_acquire): Debian 12's
      python3-etcd3 0.12 crashes in Lock.acquire when the lock is busy.
  etcdctl handoff  --contenders loops of `etcdctl lock NAME -- bash -c ...`
      (one process per acquisition, as scripts use it); the command stamps
      "A" on entry and "R" on exit with bash's EPOCHREALTIME (no fork); the
      hand-off is the next A minus the previous R, so it includes etcdctl's
      unlock, the waiter's wake-up and the start of the next bash.
  etcdctl uncontended  one loop of `etcdctl lock NAME -- true`: cycles/s,
      process start and session set-up included (context only).

Prints one line per measure: "<peer> <scenario> key=value ...".
Uses /usr/bin/python3 (Debian's python3-etcd3) and etcdctl (etcd-client).
"""
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time


def pct(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def handoffs(events):
    """events: (t_acquired, t_released) per hold, any order -> hand-off
    latencies between consecutive holds, in the same unit."""
    events = sorted(events)
    out = []
    for prev, cur in zip(events, events[1:]):
        d = cur[0] - prev[1]
        if d >= 0:
            out.append(d)
    out.sort()
    return out


# ---- python-etcd3 ----

def py_uncontended(args):
    host, port, idx, seconds, q = args
    import etcd3
    c = etcd3.client(host=host, port=port)
    lock = c.lock("bench-peer-%d-u%d" % (os.getpid(), idx), ttl=10)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lock.acquire(timeout=10)
        lock.release()
        n += 1
    q.put(n)


def py_acquire(c, lock, timeout):
    """python-etcd3 0.12's Lock.acquire, step for step: a new lease, the
    create_revision == 0 txn, and on failure watch_once() on the key (any
    event) and again. The library's own method cannot be used on Debian 12:
    it hands tenacity 8 a wait() of the old signature, and raises TypeError
    the first time the lock is busy."""
    import etcd3
    end = time.monotonic() + timeout
    while True:
        lock.lease = c.lease(lock.ttl)
        ok, _ = c.transaction(
            compare=[c.transactions.create(lock.key) == 0],
            success=[c.transactions.put(lock.key, lock.uuid, lease=lock.lease)],
            failure=[c.transactions.get(lock.key)])
        if ok:
            return True
        lock.lease = None
        left = end - time.monotonic()
        if left <= 0:
            return False
        try:
            c.watch_once(lock.key, left)
        except etcd3.exceptions.WatchTimedOut:
            pass


def py_handoff(args):
    host, port, name, seconds, q = args
    import etcd3
    c = etcd3.client(host=host, port=port)
    lock = c.lock(name, ttl=10)
    ev = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not py_acquire(c, lock, 30):
            continue
        t_acq = time.monotonic_ns()
        while time.monotonic_ns() - t_acq < 20000:  # 20 us of work
            pass
        t_rel = time.monotonic_ns()
        lock.release()
        ev.append((t_acq, t_rel))
    q.put(ev)


def run_procs(target, arglist):
    q = mp.Queue()
    ps = [mp.Process(target=target, args=(a + (q,),)) for a in arglist]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return res


def measure_python(host, port, seconds, clients_list, contenders):
    for n in clients_list:
        t0 = time.monotonic()
        res = run_procs(py_uncontended,
                        [(host, port, i, seconds) for i in range(n)])
        total = sum(res)
        print("python-etcd3 uncontended clients=%d ops_per_s=%.0f cycles=%d"
              % (n, total / seconds, total), flush=True)
        del t0
    name = "bench-peer-%d-h" % os.getpid()
    res = run_procs(py_handoff,
                    [(host, port, name, seconds) for _ in range(contenders)])
    ev = [e for r in res for e in r]
    h = handoffs(ev)
    print("python-etcd3 handoff contenders=%d p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f "
          "acquisitions=%d" % (contenders, pct(h, .5) / 1e6, pct(h, .9) / 1e6,
                               pct(h, .99) / 1e6, len(ev)), flush=True)


# ---- etcdctl ----

def etcdctl_env():
    env = dict(os.environ)
    env["ETCDCTL_API"] = "3"
    return env


def measure_etcdctl(endpoint, seconds, contenders):
    env = etcdctl_env()
    ep = "--endpoints=http://%s" % endpoint
    # uncontended: process per cycle
    name = "bench-peer-%d-cu" % os.getpid()
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        subprocess.run(["etcdctl", ep, "lock", name, "--", "true"], env=env,
                       stdout=subprocess.DEVNULL, check=True, timeout=30)
        n += 1
    print("etcdctl uncontended clients=1 ops_per_s=%.1f cycles=%d (a process per cycle)"
          % (n / seconds, n), flush=True)

    # hand-off: `contenders` loops, one etcdctl process per acquisition
    name = "bench-peer-%d-ch" % os.getpid()
    with tempfile.TemporaryDirectory(prefix="cerb-etcdctl-") as d:
        log = os.path.join(d, "stamps")
        cmd = 'echo "A $EPOCHREALTIME" >> %s; echo "R $EPOCHREALTIME" >> %s' % (log, log)
        end = time.monotonic() + seconds
        errors = []

        def loop():
            while time.monotonic() < end:
                r = subprocess.run(["etcdctl", ep, "lock", name, "--", "bash", "-c", cmd],
                                   env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=60)
                if r.returncode != 0:
                    errors.append(r.stderr.decode(errors="replace").strip())
                    return

        ts = [threading.Thread(target=loop) for _ in range(contenders)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            print("etcdctl handoff error: %s" % errors[0], flush=True)
        stamps = []
        with open(log) as f:
            for line in f:
                k, v = line.split()
                stamps.append((k, float(v.replace(",", "."))))
    ev = []
    cur = None
    for k, v in stamps:  # appended in order: A R A R ...
        if k == "A":
            cur = v
        elif cur is not None:
            ev.append((cur, v))
            cur = None
    h = handoffs(ev)
    print("etcdctl handoff contenders=%d p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f acquisitions=%d"
          % (contenders, pct(h, .5) * 1e3, pct(h, .9) * 1e3, pct(h, .99) * 1e3, len(ev)),
          flush=True)


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    endpoint = argv.pop(0)
    seconds, clients, contenders = 5.0, [1, 8], 8
    skip_ctl = skip_py = False
    while argv:
        a = argv.pop(0)
        if a == "--duration":
            seconds = float(argv.pop(0))
        elif a == "--clients":
            clients = [int(x) for x in argv.pop(0).split(",")]
        elif a == "--contenders":
            contenders = int(argv.pop(0))
        elif a == "--skip-etcdctl":
            skip_ctl = True
        elif a == "--skip-python":
            skip_py = True
        else:
            print(__doc__, file=sys.stderr)
            return 2
    host, port = endpoint.rsplit(":", 1)
    if not skip_py:
        measure_python(host, int(port), seconds, clients, contenders)
    if not skip_ctl:
        measure_etcdctl(endpoint, seconds, contenders)
    return 0


if __name__ == "__main__":
    sys.exit(main())
