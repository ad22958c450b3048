#!/usr/bin/env python3
"""test_cli_serve_e2e.py CERBERUS — `cerberus serve` end to end on a real
Redis (the exclusive test server, which this test pauses), with callers that
are processes of their own, speaking HTTP over the unix socket with the
standard library only:

  1. the event stream says `lost` when the engine is paused past the lease,
     and the hold's release then answers 410 LOST;
  2. a caller killed mid-hold (SIGKILL, while it listens to its hold's
     events) leaves the name free within its lease (plus the daemon's
     hang-up check and expiry tick, 100 ms each);
  3. the daemon killed (SIGKILL) with a hold: the name is free once the
     hold's lease passed, and the fencing token keeps growing after the
     restart.

Environment (from ctest): CERB_REDIS_PORT (the exclusive server's port),
CERB_STATE_DIR (where scripts/servers.sh keeps its PID file). Output is
TAP-like; the exit status is 1 when a check failed. Every wait is a
condition polled against a deadline.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

CERBERUS = sys.argv[1]
PORT = int(os.environ["CERB_REDIS_PORT"])
STATE = os.environ["CERB_STATE_DIR"]
LEASE_MS = 1000
RUN = "%d-%d" % (os.getpid(), int(time.time()))

failed = False
n = 0


def ok(cond, what, detail=""):
    global failed, n
    n += 1
    if cond:
        print("ok %d - %s" % (n, what))
    else:
        failed = True
        print("not ok %d - %s" % (n, what))
        if detail:
            print("#   " + str(detail).replace("\n", "\n#   "))
    sys.stdout.flush()
    return cond


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("cerberus", timeout=timeout)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


def call(sock, method, path, body=None, timeout=15):
    c = UnixHTTP(sock, timeout)
    try:
        c.request(method, path, json.dumps(body) if body is not None else None,
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        c.close()


def wait_for(cond, seconds, step=0.02):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)  # polling the condition, bounded by the deadline
    return cond()


class Daemon:
    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "serve.sock")
        self.cfg = os.path.join(tmp, "c.cfg")
        self.log = os.path.join(tmp, "serve.log")
        with open(self.cfg, "w") as f:
            f.write('engines = ("redis");\n'
                    'redis = { host = "127.0.0.1"; port = %d; };\n'
                    'lock = { lease_ms = %d; };\n' % (PORT, LEASE_MS))
        self.proc = None

    def start(self):
        logf = open(self.log, "a")
        self.proc = subprocess.Popen([CERBERUS, "-c", self.cfg, "serve", "--listen",
                                      "unix:" + self.sock], stderr=logf, stdout=logf)
        logf.close()

        def up():
            if self.proc.poll() is not None:
                return True
            try:
                return call(self.sock, "GET", "/healthz", timeout=1)[0] == 200
            except OSError:
                return False
        if not wait_for(up, 20) or self.proc.poll() is not None:
            raise SystemExit("cerberus serve did not start:\n" + open(self.log).read())

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def redis_pid():
    with open(os.path.join(STATE, "redis-%d.pid" % PORT)) as f:
        return int(f.read().split()[0])


def listen(sock, hold, seen, stop):
    """Reads the hold's event stream into @seen until it ends or @stop."""
    c = UnixHTTP(sock, 30)
    try:
        c.request("GET", "/v1/holds/%s/events" % hold)
        r = c.getresponse()
        while not stop.is_set():
            line = r.readline()
            if not line:
                break
            seen.append(line.decode().strip())
    except OSError as e:
        seen.append("error: %s" % e)
    finally:
        c.close()


# A caller of its own (case 2): acquires, prints the hold, listens until killed.
CALLER = r'''
import http.client, json, socket, sys
class U(http.client.HTTPConnection):
    def __init__(self, p):
        super().__init__("cerberus", timeout=60); self.p = p
    def connect(self):
        s = socket.socket(socket.AF_UNIX); s.connect(self.p); self.sock = s
c = U(sys.argv[1])
c.request("POST", "/v1/locks/%s/acquire" % sys.argv[2], json.dumps({"lease_ms": int(sys.argv[3])}))
a = json.loads(c.getresponse().read())
print(a["hold"], a["fencing_token"], flush=True)
e = U(sys.argv[1])
e.request("GET", "/v1/holds/%s/events" % a["hold"])
r = e.getresponse()
while r.readline():
    pass
'''


def main():
    tmp = tempfile.mkdtemp(prefix="cerb-serve-e2e-")
    d = Daemon(tmp)
    d.start()
    rpid = redis_pid()
    try:
        # 1. The engine paused past the lease: `lost` on the stream, 410 on release.
        name = "e2e-pause-" + RUN
        st, a = call(d.sock, "POST", "/v1/locks/%s/acquire" % name, {"lease_ms": LEASE_MS})
        ok(st == 200, "acquired %s" % name, a)
        seen, stop = [], threading.Event()
        t = threading.Thread(target=listen, args=(d.sock, a["hold"], seen, stop))
        t.start()
        ok(wait_for(lambda: "event: heartbeat" in seen, 10), "the stream says heartbeat", seen)
        os.kill(rpid, signal.SIGSTOP)
        try:
            got = wait_for(lambda: "event: lost" in seen, LEASE_MS / 1000.0 + 10)
        finally:
            os.kill(rpid, signal.SIGCONT)
        ok(got, "the stream says lost while redis is paused past the lease", seen)
        stop.set()
        t.join(30)
        st, b = call(d.sock, "DELETE", "/v1/holds/%s" % a["hold"])
        ok(st == 410 and b.get("status") == "LOST", "its release answers 410 LOST", (st, b))

        # 2. A caller killed mid-hold: the name is free within its lease.
        name = "e2e-kill-" + RUN
        caller = subprocess.Popen([sys.executable, "-c", CALLER, d.sock, name, str(LEASE_MS)],
                                  stdout=subprocess.PIPE)
        line = caller.stdout.readline().decode().split()
        ok(len(line) == 2, "the caller holds %s" % name, line)
        st, b = call(d.sock, "POST", "/v1/locks/%s/acquire" % name, {"wait_ms": 0})
        ok(st == 409, "another caller is refused while it lives", (st, b))
        caller.kill()
        caller.wait()
        t0 = time.monotonic()
        st, b = call(d.sock, "POST", "/v1/locks/%s/acquire" % name, {"wait_ms": 10000})
        ms = (time.monotonic() - t0) * 1000
        # The daemon sees the hang-up within 100 ms, the hold then has its
        # window (the lease) for the caller to come back, and the expiry
        # thread's tick is 100 ms.
        ok(st == 200 and ms < LEASE_MS + 400,
           "killed (SIGKILL): the name is free within its lease and the daemon's "
           "two 100 ms ticks (%.0f ms)" % ms, (st, b))
        if st == 200:
            call(d.sock, "DELETE", "/v1/holds/%s" % b["hold"])

        # 3. The daemon killed: the lease frees the name; fences keep growing.
        name = "e2e-daemon-" + RUN
        st, a = call(d.sock, "POST", "/v1/locks/%s/acquire" % name, {"lease_ms": LEASE_MS})
        ok(st == 200, "acquired %s" % name, a)
        d.kill()
        killed = time.monotonic()
        d.start()
        st, b = call(d.sock, "POST", "/v1/locks/%s/acquire" % name, {"wait_ms": 10000})
        ms = (time.monotonic() - killed) * 1000
        ok(st == 200 and ms < LEASE_MS + 2000,
           "after the daemon's SIGKILL and restart the name is granted once its lease "
           "passed (%.0f ms after the kill)" % ms, (st, b))
        ok(st == 200 and int(b["fencing_token"]) > int(a["fencing_token"]),
           "the fencing token grew: %s -> %s" % (a.get("fencing_token"), b.get("fencing_token")))
    finally:
        d.stop()
    print("1..%d" % n)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
