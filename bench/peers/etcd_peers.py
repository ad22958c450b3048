#!/usr/bin/python3
"""etcd_peers.py — the etcd engine's peers, python-etcd3's Lock and
`etcdctl lock`, measured the way cerberus-bench measures Cerberus, on the
same etcd in the same run (`cerberus-bench --peers` runs it through
etcd_peers.sh; DESIGN.md §10: >= python-etcd3 and etcdctl; hand-off p50 <=
6 ms, p90 <= 10 ms with 8 contenders).

usage: etcd_peers.py --peer python-etcd3|etcdctl|election-api
                     --check | --scenario uncontended|handoff|elect-failover
                     [--threads N] [--duration S] [--endpoint URL] [--work DIR]
                     [--rounds R] [--lease-ms L]

  --endpoint   the etcd client URL, http://HOST:PORT (or HOST:PORT)

Measures, each on lock names of its own (bench-peer-<pid>-...):
  python-etcd3 uncontended  N client processes, each with its own client
      (the library's best case: no GIL shared), lock.acquire() +
      lock.release() on a name of its own; cycles/s summed over the
      processes. (python-etcd3's Lock grants a new lease per acquire:
      three writes per cycle.)
  python-etcd3 handoff  N processes on one name. Its acquire loop is
      re-implemented step for step (py_acquire): Debian 12's python3-etcd3
      0.12 crashes in Lock.acquire when the lock is busy. The lock is not
      fair: a releaser contending again at once takes it back before the
      watchers hear of the release, so it steps aside until another
      process holds.
  etcdctl uncontended  N loops of `etcdctl lock NAME -- true`, a name each:
      one process per cycle, start-up and session set-up included, as a
      shell script uses it.
  etcdctl handoff  N loops of `etcdctl lock NAME -- bash -c ...` on one
      name (one process per acquisition; fair: each joins the queue); the
      command stamps "A" on entry and "R" on exit with bash's EPOCHREALTIME
      (no fork); the hand-off is the next A minus the previous R, so it
      includes etcdctl's unlock, the waiter's wake-up and the start of the
      next bash.
  etcdctl elect-failover  N `etcdctl elect NAME PROPOSAL` candidates
      (peerlib.elect_failover: the leader killed, the time to the next
      one's first line, stamped when read). etcdctl 3.4's elect has no TTL
      option: its session lease is the client's default, 60 s, so a killed
      leader's term lasts 60 s; one round is run (--rounds is ignored) and
      the row's "how" says so. The same layout with Cerberus's TTL is the
      election-api peer.
  election-api elect-failover  etcd's own election service (v3election,
      the server side of concurrency.Election, the layout `etcdctl elect`
      writes) through the JSON gateway: N candidate processes (this script
      with --election-candidate), each granting a lease of --lease-ms
      (Cerberus's etcd.session_ttl_s), keeping it alive every third of it,
      and blocking in POST /v3/election/campaign; --rounds leaders killed.
Hand-offs are counted between two different contenders; a holder of the
python-etcd3 lock busy-works 20 us. Output: one line on stdout, "ok
<what>" (--check), "skip <why>" (exit 3: not installed) or "result
peer=... " (see peerlib.py). Uses /usr/bin/python3 with Debian's
python3-etcd3, and etcdctl (etcd-client) from PATH or $ETCDCTL.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402

PEERS = ("python-etcd3", "etcdctl", "election-api")
ETCDCTL_TTL_MS = 60000   # etcdctl elect's session lease (no option sets it)


def host_port(endpoint):
    e = endpoint
    for scheme in ("http://", "https://"):
        if e.startswith(scheme):
            e = e[len(scheme):]
    e = e.rstrip("/")
    host, _, port = e.rpartition(":")
    if not host or not port.isdigit():
        peerlib.fail("bad --endpoint %r (want http://HOST:PORT)" % endpoint)
    return host, int(port)


# ---- python-etcd3 ----

def have_etcd3():
    """Whether etcd3 can be imported, without importing it: gRPC, which it
    loads, does not survive a fork, and the measuring processes are forked
    from this one (each imports it for itself)."""
    if importlib.util.find_spec("etcd3") is None:
        peerlib.skip("python3-etcd3 is not installed for %s (Debian package "
                     "python3-etcd3)" % sys.executable)


def py_client(a):
    import etcd3
    host, port = host_port(a.endpoint)
    c = etcd3.client(host=host, port=port, timeout=10)
    c.status()  # connected before the clock starts
    return c


def py_uncontended_proc(idx, a):
    c = py_client(a)
    lock = c.lock("bench-peer-%d-u%d" % (os.getpid(), idx), ttl=10)

    def loop(t0):
        def cycle():
            if not lock.acquire(timeout=10):
                raise RuntimeError("an uncontended lock was not granted in 10 s")
            lock.release()
        return peerlib.Clock(a.duration, t0).cycles(cycle)
    return loop


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


def py_handoff_proc(idx, a, name, baton):
    c = py_client(a)
    lock = c.lock(name, ttl=10)

    def loop(t0):
        clock = peerlib.Clock(a.duration, t0)
        ev = []
        while True:
            if not py_acquire(c, lock, 30):
                raise RuntimeError("no grant in 30 s")
            t_acq = clock.now()
            baton.taken(idx)
            t_rel = peerlib.busy_work(t_acq)
            lock.release()
            if clock.start <= t_acq < clock.end:
                ev.append((t_acq, t_rel, idx))
            if t_rel >= clock.end:
                break
            baton.step_aside(idx, clock.end)
        return ev
    return loop


def python_etcd3(a):
    have_etcd3()
    if a.check:  # nothing is forked after a check
        try:
            py_client(a).close()
        except Exception as e:  # noqa: B902 - grpc raises several kinds
            peerlib.fail("etcd at %s: %s: %s" % (a.endpoint, type(e).__name__, e))
        import etcd3
        peerlib.ok("python-etcd3 %s" % getattr(etcd3, "__version__", "?"))
    if a.scenario == "uncontended":
        lat = peerlib.run_procs(a.threads, py_uncontended_proc, (a,), a.duration)
        peerlib.result("python-etcd3", a, len(lat) / a.duration, lat,
                       "%d process(es), a client each, lock.acquire()+release()"
                       % a.threads)
    name = "bench-peer-%d-h" % os.getpid()
    ev = peerlib.run_procs(a.threads, py_handoff_proc,
                           (a, name, peerlib.Baton()), a.duration)
    peerlib.result("python-etcd3", a, len(ev) / a.duration, peerlib.handoffs(ev),
                   "%d processes; not fair, so a releaser steps aside until "
                   "another holds" % a.threads)


# ---- etcdctl ----

def etcdctl_cmd():
    exe = os.environ.get("ETCDCTL") or shutil.which("etcdctl")
    if not exe or not os.access(exe, os.X_OK):
        peerlib.skip("%s not found (Debian package etcd-client)"
                     % (os.environ.get("ETCDCTL") or "etcdctl"))
    return exe


def etcdctl(a):
    exe = etcdctl_cmd()
    env = dict(os.environ, ETCDCTL_API="3")
    host, port = host_port(a.endpoint)
    ep = "--endpoints=http://%s:%d" % (host, port)
    if a.check:
        r = subprocess.run([exe, ep, "endpoint", "health"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=30)
        if r.returncode != 0:
            peerlib.fail("etcdctl endpoint health: %s"
                         % r.stdout.decode(errors="replace").strip())
        v = subprocess.run([exe, "version"], env=env, stdout=subprocess.PIPE,
                           timeout=30).stdout.decode(errors="replace").split("\n")[0]
        peerlib.ok(v.strip() or "etcdctl")

    warm = min(0.5, max(0.05, a.duration / 10.0))
    t_start = time.time() + warm           # EPOCHREALTIME is wall time
    t_end = t_start + a.duration
    errors = []
    with tempfile.TemporaryDirectory(prefix="cerb-etcdctl-") as d:
        if a.scenario == "uncontended":
            def loop(i):
                name = "bench-peer-%d-cu%d" % (os.getpid(), i)
                lat = []
                while True:
                    t0 = time.monotonic_ns()
                    w0 = time.time()
                    r = subprocess.run([exe, ep, "lock", name, "--", "true"],
                                       env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, timeout=60)
                    if r.returncode != 0:
                        errors.append(r.stderr.decode(errors="replace").strip())
                        return
                    t1 = time.monotonic_ns()
                    if time.time() >= t_end:
                        break
                    if w0 >= t_start:
                        lat.append(t1 - t0)
                out[i] = lat

            out = {}
            peerlib.run_threads(a.threads, loop)
            if errors:
                peerlib.fail("etcdctl lock: %s" % errors[0])
            lat = [x for i in range(a.threads) for x in out.get(i, [])]
            peerlib.result("etcdctl", a, len(lat) / a.duration, lat,
                           "%d loop(s) of `etcdctl lock NAME -- true`: a "
                           "process and a session per cycle" % a.threads)

        name = "bench-peer-%d-ch" % os.getpid()

        def contend(i):
            log = os.path.join(d, "stamps-%d" % i)
            cmd = 'echo "A $EPOCHREALTIME" >> %s; echo "R $EPOCHREALTIME" >> %s' % (log, log)
            while time.time() < t_end:
                r = subprocess.run([exe, ep, "lock", name, "--", "bash", "-c", cmd],
                                   env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=60)
                if r.returncode != 0:
                    errors.append(r.stderr.decode(errors="replace").strip())
                    return

        peerlib.run_threads(a.threads, contend)
        if errors:
            peerlib.fail("etcdctl lock: %s" % errors[0])
        ev = []
        for i in range(a.threads):
            acq = None
            try:
                f = open(os.path.join(d, "stamps-%d" % i))
            except FileNotFoundError:
                continue
            with f:
                for line in f:
                    k, v = line.split()
                    t = int(float(v.replace(",", ".")) * 1e9)
                    if k == "A":
                        acq = t
                    elif acq is not None:
                        if t_start * 1e9 <= acq < t_end * 1e9:
                            ev.append((acq, t, i))
                        acq = None
    peerlib.result("etcdctl", a, len(ev) / a.duration, peerlib.handoffs(ev),
                   "%d loops of `etcdctl lock NAME -- bash -c ...`, a process "
                   "per acquisition; fair (each joins the queue)" % a.threads)


# ---- elections ----

def gw_post(base, path, body, timeout=30):
    import json
    import urllib.request
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode() or "{}")


def election_candidate(argv):
    """--election-candidate ENDPOINT NAME IDX TTL_MS: one candidate of
    etcd's election API (see election-api above)."""
    import base64
    import threading
    endpoint, name, idx, ttl_ms = argv
    host, port = host_port(endpoint)
    base = "http://%s:%d" % (host, port)
    ttl = max(1, int(ttl_ms) // 1000)
    lease = gw_post(base, "/v3/lease/grant", {"TTL": ttl})["ID"]
    done = threading.Event()

    def keepalive():
        while not done.wait(ttl / 3.0):
            gw_post(base, "/v3/lease/keepalive", {"ID": lease})
    threading.Thread(target=keepalive, daemon=True).start()
    print("ready %s" % idx, flush=True)
    b64 = lambda v: base64.b64encode(v.encode()).decode()  # noqa: E731
    r = gw_post(base, "/v3/election/campaign",
                {"name": b64(name), "value": b64("bench-candidate-%s" % idx),
                 "lease": lease}, timeout=3600)
    t = time.monotonic_ns()
    if "leader" not in r:
        peerlib.fail("campaign: %r" % r)
    print("elected %s %d" % (idx, t), flush=True)
    while sys.stdin.buffer.read(64):
        pass
    done.set()
    gw_post(base, "/v3/lease/revoke", {"ID": lease})
    sys.exit(0)


def elect_failover(a):
    host, port = host_port(a.endpoint)
    name = "bench-peer-%d-e" % os.getpid()
    if a.peer == "etcdctl":
        exe = etcdctl_cmd()
        ep = "--endpoints=http://%s:%d" % (host, port)
        a.rounds = 1
        peerlib.elect_failover(
            a, lambda i: [exe, ep, "elect", name, "bench-candidate-%d" % i], "etcdctl",
            "`etcdctl elect NAME PROPOSAL` processes; its session TTL is 60 s, fixed "
            "(etcdctl 3.4 has no option), not Cerberus's %d ms: one round" % a.lease_ms,
            stamps=False, bound_ms=ETCDCTL_TTL_MS)
    me = os.path.abspath(__file__)
    peerlib.elect_failover(
        a, lambda i: [sys.executable, me, "--election-candidate", a.endpoint, name, str(i),
                      str(a.lease_ms)], "etcd-election",
        "etcd's election API (v3election, etcdctl elect's layout) through the JSON "
        "gateway, a process per candidate, lease TTL %d s kept alive" % (a.lease_ms // 1000))


def main():
    if sys.argv[1:2] == ["--election-candidate"]:
        election_candidate(sys.argv[2:])
    a = peerlib.parse_args(__doc__, etcd=True, peer_choices=PEERS,
                           scenarios=("uncontended", "handoff", "elect-failover"))
    if a.peer == "election-api":
        if a.check:
            host, port = host_port(a.endpoint)
            try:
                gw_post("http://%s:%d" % (host, port), "/v3/maintenance/status", {})
            except OSError as e:
                peerlib.fail("etcd at %s: %s" % (a.endpoint, e))
            peerlib.ok("etcd election API (v3election) via the gateway")
        if a.scenario != "elect-failover":
            peerlib.fail("election-api measures elect-failover only")
        elect_failover(a)
    if a.scenario == "elect-failover":
        if a.peer != "etcdctl":
            peerlib.fail("%s has no election" % a.peer)
        elect_failover(a)
    if a.peer == "python-etcd3":
        python_etcd3(a)
    else:
        etcdctl(a)


if __name__ == "__main__":
    peerlib.main(main)
