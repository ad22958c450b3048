#!/usr/bin/env python3
"""test_cli_serve_ops.py — operating `cerberus serve`, end to end with the
real binary and the built-in "local" engine (no server fixture):

  check      `serve --check`: "ok" and exit 0 for a good file, binding
             nothing; exit 78 with the reason for an unknown serve key
             (file:line), a non-loopback address without allow_remote, a
             token file every user may read, an empty one, an unknown group,
             a bad socket mode;
  remote     --allow-remote / serve.allow_remote: 0.0.0.0:0 is served (we
             connect on 127.0.0.1), still only with the token;
  group      --socket-group (the user's own group) and --socket-mode: the
             socket's group and mode; an unknown group is 78;
  notify     Type=notify by hand: READY=1 on a datagram socket we bind
             (abstract and path), RELOADING=1 + MONOTONIC_USEC then READY=1
             around a SIGHUP, STOPPING=1 on SIGTERM;
  activation sockets passed as fds 3.. with LISTEN_PID/LISTEN_FDS (a unix
             and a TCP one) are served instead of serve.listen; TCP still
             needs the token; a passed 0.0.0.0 socket is refused without
             allow_remote; the socket file is left to its owner;
  reload     SIGHUP: a rotated token file takes effect (old token 401, new
             200), a broken file keeps the old configuration and is logged,
             a world-readable token file keeps the old token;
  limits     max_connections (a connection beyond it waits unanswered in
             the backlog until one closes; logged), rate_limit (429 RATE_LIMITED with Retry-After, logged
             at most once a second), max_body (400), idle_timeout_s (an idle
             connection is closed; a blocking acquisition and an event
             stream are not cut);
  logs       every record is `TIME LEVEL EVENT key=value...`; start, listen,
             stop (holds released, drained) are there; the token is in no
             line of any run.

Usage: test_cli_serve_ops.py PATH/TO/cerberus
Every wait is on a condition with a deadline; every server started here is
killed by its PID at exit. Output: one "ok"/"not ok" line per check, exit 1
if any failed. Python 3 standard library only.
"""

import grp
import http.client
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

CLI = sys.argv[1]
DIR = tempfile.mkdtemp(prefix="cerb-serve-ops-")
TOKEN = "tok-%d-secret" % (int.from_bytes(os.urandom(6), "big"))
FAILED = False
PROCS = []
LOGS = []
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (debug|info|warning|error) [a-z_.]+"
    r"( [a-z_]+=(\"([^\"\\]|\\.)*\"|[^ \"]+))*$")


def ok(name):
    print("ok - " + name, flush=True)


def notok(name):
    global FAILED
    FAILED = True
    print("not ok - " + name, flush=True)


def check(name, cond, detail=""):
    if cond:
        ok(name)
    else:
        notok(name + (": " + detail if detail else ""))


def path(name):
    return os.path.join(DIR, name)


def write(name, text, mode=0o600):
    p = path(name)
    with open(p, "w") as f:
        f.write(text)
    os.chmod(p, mode)
    return p


def wait_for(pred, timeout=30.0):
    """pred() until true or the deadline; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(0.02)


def run(cfg, *args, timeout=30):
    """A short-lived `cerberus -c cfg serve args` (refusals, --check)."""
    p = subprocess.run([CLI, "-c", cfg, "serve", *args], capture_output=True, text=True,
                       timeout=timeout)
    LOGS.append(p.stderr + p.stdout)
    return p


class Server:
    """A `cerberus serve` in the background, its stderr in a file."""

    def __init__(self, cfg, *args, env=None, pass_fds=(), preexec=None, argv=None):
        self.log = path("log-%d" % len(LOGS))
        LOGS.append(self.log)
        with open(self.log, "w") as err:
            self.p = subprocess.Popen(argv or [CLI, "-c", cfg, "serve", *args], stderr=err,
                                      stdout=subprocess.DEVNULL, env=env, pass_fds=pass_fds,
                                      preexec_fn=preexec)
        PROCS.append(self.p)

    def text(self):
        with open(self.log) as f:
            return f.read()

    def wait_log(self, pattern, timeout=30.0):
        """The first match of @pattern in the log (or None once it exited)."""
        def found():
            m = re.search(pattern, self.text(), re.M)
            return m or self.p.poll() is not None
        r = wait_for(found, timeout)
        return r if isinstance(r, re.Match) else re.search(pattern, self.text(), re.M)

    def count(self, pattern):
        return len(re.findall(pattern, self.text(), re.M))

    def port(self, addr="127.0.0.1:0"):
        m = self.wait_log(r" info listen addr=%s port=(\d+) auth=bearer" % re.escape(addr))
        return int(m.group(1)) if m else None

    def started(self):
        return self.wait_log(r" info start ") is not None

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            return self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return None


def req(port=None, method="GET", url="/healthz", body=None, token=None, unix=None,
         timeout=30):
    """(status, headers, body text) of one request, or (None, None, error)."""
    headers = {}
    if token:
        headers["Authorization"] = "Bearer " + token
    try:
        if unix:
            c = http.client.HTTPConnection("localhost", timeout=timeout)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(unix)
            c.sock = s
        else:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request(method, url, body=body, headers=headers)
        r = c.getresponse()
        data = r.read().decode()
        c.close()
        return r.status, r.headers, data
    except (OSError, http.client.HTTPException) as e:
        return None, None, repr(e)


def cfg_file(name, serve_keys=""):
    return write(name, 'engines = ("local");\nserve = {\n%s\n};\n' % serve_keys, 0o644)


# ---------------------------------------------------------------- check

def test_check():
    tok = write("token", TOKEN + "\n")
    sock = path("check.sock")
    good = cfg_file("good.cfg", 'listen = ("unix:%s", "127.0.0.1:0");\n'
                    'token_file = "%s";\nrate_limit = 100;' % (sock, tok))
    p = run(good, "--check")
    check("check: a good file is ok (0)", p.returncode == 0 and p.stdout.strip() == "ok",
          "rc %d out %r err %r" % (p.returncode, p.stdout, p.stderr))
    check("check: binds nothing", not os.path.exists(sock))

    bad = cfg_file("badkey.cfg", 'listen = ("unix:%s");\n  rate_limt = 5;' % sock)
    p = run(bad, "--check")
    check("check: unknown serve key is 78 with file:line",
          p.returncode == 78 and "badkey.cfg:4" in p.stderr and "rate_limt" in p.stderr,
          "rc %d err %r" % (p.returncode, p.stderr))

    remote = cfg_file("remote.cfg", 'listen = ("0.0.0.0:7080");\ntoken_file = "%s";' % tok)
    p = run(remote, "--check")
    check("check: non-loopback without allow_remote is 78",
          p.returncode == 78 and "allow_remote" in p.stderr,
          "rc %d err %r" % (p.returncode, p.stderr))

    open_tok = write("open-token", TOKEN + "\n", 0o644)
    p = run(good, "--check", "--token-file", open_tok)
    check("check: a world-readable token file is 78",
          p.returncode == 78 and "every user may read" in p.stderr,
          "rc %d err %r" % (p.returncode, p.stderr))

    empty = write("empty-token", "\n")
    p = run(good, "--check", "--token-file", empty)
    check("check: an empty token file is 78", p.returncode == 78 and "empty" in p.stderr,
          "rc %d err %r" % (p.returncode, p.stderr))

    p = run(good, "--check", "--socket-group", "no-such-group-cerb")
    check("check: an unknown group is 78",
          p.returncode == 78 and "no such group" in p.stderr,
          "rc %d err %r" % (p.returncode, p.stderr))

    mode = cfg_file("mode.cfg", 'socket_mode = "0066";')
    p = run(mode, "--check")
    check("check: a mode without owner rw is 78 with file:line",
          p.returncode == 78 and "mode.cfg:" in p.stderr and "socket_mode" in p.stderr,
          "rc %d err %r" % (p.returncode, p.stderr))

    p = run(good, "--check", "--listen", "10.1.2.3:7080", "--token-file", tok)
    check("check: --listen non-loopback is 64", p.returncode == 64,
          "rc %d err %r" % (p.returncode, p.stderr))


# ---------------------------------------------------------------- remote, group

def test_remote():
    tok = write("token", TOKEN + "\n")
    cfg = cfg_file("plain.cfg")
    s = Server(cfg, "--listen", "0.0.0.0:0", "--token-file", tok, "--allow-remote")
    port = s.port("0.0.0.0:0")
    check("remote: --allow-remote listens on 0.0.0.0", port is not None, s.text())
    if port:
        st, _, _ = req(port)
        check("remote: no token is still 401", st == 401, str(st))
        st, _, _ = req(port, token=TOKEN)
        check("remote: with the token 200 (over 127.0.0.1)", st == 200, str(st))
        check("remote: the listen record says remote=yes",
              s.count(r"listen addr=0\.0\.0\.0:0 port=\d+ auth=bearer remote=yes") == 1)
    s.stop()
    cfg2 = cfg_file("allow.cfg", 'allow_remote = true;\nlisten = ("0.0.0.0:0");\n'
                    'token_file = "%s";' % tok)
    s = Server(cfg2)
    check("remote: serve.allow_remote in the file too", s.port("0.0.0.0:0") is not None,
          s.text())
    s.stop()


def test_group():
    cfg = cfg_file("plain.cfg")
    gid = os.getgid()
    name = grp.getgrgid(gid).gr_name
    sock = path("group.sock")
    s = Server(cfg, "--listen", "unix:" + sock, "--socket-group", name, "--socket-mode", "0600")
    if s.started():
        st = os.stat(sock)
        check("group: the socket's group is %s" % name, st.st_gid == gid)
        check("group: the socket's mode is 0600", stat.S_IMODE(st.st_mode) == 0o600,
              oct(st.st_mode))
        code, _, _ = req(unix=sock)
        check("group: it answers", code == 200, str(code))
    else:
        notok("group: did not start: " + s.text())
    s.stop()
    sock2 = path("default.sock")
    s = Server(cfg, "--listen", "unix:" + sock2)
    if s.started():
        check("group: the default mode is 0660",
              stat.S_IMODE(os.stat(sock2).st_mode) == 0o660)
    s.stop()
    p = run(cfg, "--listen", "unix:" + path("x.sock"), "--socket-group", "no-such-group-cerb")
    check("group: an unknown group is 78", p.returncode == 78, p.stderr)
    check("group: no socket made for it", not os.path.exists(path("x.sock")))


# ---------------------------------------------------------------- systemd

class Notify:
    """A datagram socket in NOTIFY_SOCKET's place."""

    def __init__(self, abstract):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = "cerb-notify-%d-%d" % (os.getpid(), int.from_bytes(os.urandom(4), "big"))
            self.s.bind("\0" + name)
            self.addr = "@" + name
        else:
            self.addr = path("notify.sock")
            self.s.bind(self.addr)

    def next(self, timeout=30.0):
        self.s.settimeout(timeout)
        try:
            return self.s.recv(4096).decode()
        except socket.timeout:
            return None


def test_notify():
    cfg = cfg_file("plain.cfg")
    for abstract in (True, False):
        what = "abstract" if abstract else "path"
        n = Notify(abstract)
        env = dict(os.environ, NOTIFY_SOCKET=n.addr)
        sock = path("notify-%s.sock" % what)
        s = Server(cfg, "--listen", "unix:" + sock, env=env)
        msg = n.next()
        check("notify (%s): READY=1" % what, msg is not None and "READY=1" in msg, repr(msg))
        check("notify (%s): the socket listens when READY=1 comes" % what,
              req(unix=sock)[0] == 200)
        s.p.send_signal(signal.SIGHUP)
        msg = n.next()
        check("notify (%s): RELOADING=1 with MONOTONIC_USEC on SIGHUP" % what,
              msg is not None and "RELOADING=1" in msg and
              re.search(r"MONOTONIC_USEC=\d+", msg) is not None, repr(msg))
        msg = n.next()
        check("notify (%s): READY=1 after the reload" % what,
              msg is not None and "READY=1" in msg, repr(msg))
        rc = s.stop()
        msg = n.next(5)
        check("notify (%s): STOPPING=1 on SIGTERM" % what,
              msg is not None and "STOPPING=1" in msg, repr(msg))
        check("notify (%s): exit 0" % what, rc == 0, str(rc))


def activated(cfg, socks, extra=()):
    """A server given @socks as fds 3.. the way systemd gives them."""
    fds = [s.fileno() for s in socks]

    def preexec():
        # In the child: the sockets at 3.., LISTEN_PID this very process.
        tmp = [os.dup(fd) for fd in fds]
        for i, fd in enumerate(tmp):
            os.dup2(fd, 3 + i)
            os.set_inheritable(3 + i, True)
        os.environ["LISTEN_PID"] = str(os.getpid())
        os.environ["LISTEN_FDS"] = str(len(fds))
        os.environ["LISTEN_FDNAMES"] = ":".join("s%d" % i for i in range(len(fds)))

    # env=None so that the child's own environment (set in preexec) is
    # what exec passes on.
    # pass_fds names 3.. too: subprocess closes every other descriptor
    # after preexec runs.
    keep = sorted(set(fds) | set(range(3, 3 + len(fds))))
    return Server(None, argv=[CLI, "-c", cfg, "serve", *extra], pass_fds=keep,
                  preexec=preexec)


def test_activation():
    tok = write("token", TOKEN + "\n")
    never = path("never.sock")
    cfg = cfg_file("act.cfg", 'listen = ("unix:%s");\ntoken_file = "%s";' % (never, tok))
    usock_path = path("act.sock")
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    u.bind(usock_path)
    u.listen(16)
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.bind(("127.0.0.1", 0))
    t.listen(16)
    port = t.getsockname()[1]
    s = activated(cfg, [u, t])
    started = s.started()
    check("activation: started on the passed sockets", started, s.text())
    if started:
        check("activation: serve.listen is not used", not os.path.exists(never))
        check("activation: the unix socket answers", req(unix=usock_path)[0] == 200)
        check("activation: TCP without the token is 401", req(port)[0] == 401)
        check("activation: TCP with the token is 200", req(port, token=TOKEN)[0] == 200)
        check("activation: both logged from=systemd",
              s.count(r"listen addr=\S+ .*from=systemd") == 2, s.text())
    rc = s.stop()
    check("activation: SIGTERM exit 0", rc == 0, str(rc))
    check("activation: the passed socket's file is left to its owner",
          os.path.exists(usock_path))
    u.close()
    t.close()

    r = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    r.bind(("0.0.0.0", 0))
    r.listen(4)
    s = activated(cfg, [r])
    rc = s.p.wait(30)
    check("activation: a passed 0.0.0.0 socket without allow_remote is refused (78)",
          rc == 78 and "allow_remote" in s.text(), "rc %s log %r" % (rc, s.text()))
    s = activated(cfg, [r], extra=("--allow-remote",))
    check("activation: ... and served with --allow-remote", s.started(), s.text())
    s.stop()
    r.close()


# ---------------------------------------------------------------- reload

def test_reload():
    tok = write("rtoken", TOKEN + "\n")
    cfg = cfg_file("reload.cfg", 'listen = ("127.0.0.1:0");\ntoken_file = "%s";' % tok)
    s = Server(cfg)
    port = s.port()
    if not port:
        notok("reload: did not start: " + s.text())
        s.stop()
        return
    check("reload: the first token works", req(port, token=TOKEN)[0] == 200)
    new = TOKEN + "-rotated"
    write("rtoken", new + "\n")
    s.p.send_signal(signal.SIGHUP)
    check("reload: logged", s.wait_log(r" info reload .*token=re-read") is not None, s.text())
    check("reload: the old token is 401 now", req(port, token=TOKEN)[0] == 401)
    check("reload: the new token is 200", req(port, token=new)[0] == 200)

    # A broken file: the old configuration (and token) stays, and it says so.
    with open(cfg, "a") as f:
        f.write("serve = { nonsense = 1; };\n")
    s.p.send_signal(signal.SIGHUP)
    check("reload: a broken file is logged as an error",
          s.wait_log(r" error reload .*kept=\"old configuration\"") is not None, s.text())
    check("reload: still serving with the token in force", req(port, token=new)[0] == 200)

    # A token file every user may read: the old token stays.
    cfg_file("reload.cfg", 'listen = ("127.0.0.1:0");\ntoken_file = "%s";' % tok)
    os.chmod(tok, 0o644)
    s.p.send_signal(signal.SIGHUP)
    check("reload: a world-readable token file is refused",
          s.wait_log(r" error reload error=.*every user may read.*kept=\"old token\"")
          is not None, s.text())
    check("reload: the old token still works", req(port, token=new)[0] == 200)
    check("reload: still one listener (the sockets stay)", s.count(r" info listen ") == 1)
    rc = s.stop()
    check("reload: SIGTERM exit 0", rc == 0, str(rc))


# ---------------------------------------------------------------- limits

def raw_connect(port):
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    return c


def test_limits():
    tok = write("token", TOKEN + "\n")
    cfg = cfg_file("conn.cfg", 'listen = ("127.0.0.1:0");\ntoken_file = "%s";\n'
                   'max_connections = 2;' % tok)
    s = Server(cfg)
    port = s.port()
    if port:
        a, b = raw_connect(port), raw_connect(port)
        # Both are accepted and counted once one request went through each.
        for c in (a, b):
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                      TOKEN.encode() + b"\r\n\r\n")
            c.recv(4096)
        third = raw_connect(port)
        third.settimeout(2)
        third.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                      TOKEN.encode() + b"\r\n\r\n")
        try:
            early = third.recv(4096)
        except socket.timeout:
            early = None
        check("limits: a third connection beyond max_connections=2 is not answered "
              "(it waits in the backlog)", early is None, repr(early))
        check("limits: logged as reason=connections",
              s.wait_log(r" warning limit reason=connections") is not None, s.text())
        a.close()
        third.settimeout(30)
        try:
            late = third.recv(4096)
        except OSError as e:
            late = repr(e).encode()
        check("limits: ... and answered once one closed", late.startswith(b"HTTP/1.1 200"),
              repr(late))
        third.close()
        b.close()
        st = wait_for(lambda: req(port, token=TOKEN, timeout=10)[0] == 200, 30)
        check("limits: answered again once one closed", st)
    else:
        notok("limits: did not start: " + s.text())
    s.stop()

    cfg = cfg_file("rate.cfg", 'listen = ("127.0.0.1:0");\ntoken_file = "%s";\n'
                   'rate_limit = 1;\nrate_burst = 3;\nmax_body = 256;' % tok)
    s = Server(cfg)
    port = s.port()
    if port:
        codes = [req(port, token=TOKEN)[0] for _ in range(3)]
        check("limits: the burst of 3 passes", codes == [200, 200, 200], str(codes))
        st, hdr, body = req(port, token=TOKEN)
        check("limits: the 4th is 429", st == 429, str(st))
        check("limits: 429 says RATE_LIMITED",
              st == 429 and json.loads(body).get("status") == "RATE_LIMITED", body)
        check("limits: 429 has Retry-After >= 1",
              hdr is not None and hdr.get("Retry-After", "0").isdigit() and
              int(hdr.get("Retry-After")) >= 1, str(hdr and hdr.get("Retry-After")))
        st, _, _ = req(port)
        check("limits: a request without a token is rate-limited too (429, not 401)",
              st == 429, str(st))
        for _ in range(30):
            req(port, token=TOKEN)
        n = s.count(r" warning limit reason=rate")
        check("limits: 30 more 429s, logged at most twice (once a second)", 1 <= n <= 2,
              str(n))
        check("limits: acquisitions are refused with 429 too, nothing held",
              req(port, "POST", "/v1/locks/ops-rate/acquire", "{}", TOKEN)[0] == 429)
        # A too big body, once the bucket has a token again.
        big = json.dumps({"wait_ms": 0, "pad": "x" * 300})
        last = [None, None, None]

        def not_limited():
            last[:] = req(port, "POST", "/v1/locks/ops-body/acquire", big, TOKEN)
            return last[0] != 429
        wait_for(not_limited, 10)
        st, body = last[0], last[2]
        check("limits: a body over max_body=256 is 400", st == 400 and "256" in body,
              "%s %s" % (st, body))
    else:
        notok("limits: did not start: " + s.text())
    s.stop()

    sock = path("idle.sock")
    cfg = cfg_file("idle.cfg", 'listen = ("unix:%s");\nidle_timeout_s = 1;' % sock)
    s = Server(cfg)
    if s.started():
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(30)
        c.connect(sock)
        t0 = time.monotonic()
        try:
            closed = c.recv(1) == b""
        except OSError:
            closed = True
        took = time.monotonic() - t0
        check("limits: an idle connection is closed after idle_timeout_s=1",
              closed and took < 10, "closed %s after %.1f s" % (closed, took))
        c.close()
        st, _, body = req(unix=sock, method="POST", url="/v1/locks/ops-idle/acquire",
                           body='{"wait_ms": 0}')
        hold = json.loads(body)["hold"] if st == 200 else None
        t0 = time.monotonic()
        st, _, body = req(unix=sock, method="POST", url="/v1/locks/ops-idle/acquire",
                           body='{"wait_ms": 2500}')
        took = time.monotonic() - t0
        check("limits: a blocking acquisition of 2.5 s is not cut by the idle timeout",
              st == 408 and took >= 2.4, "%s after %.1f s: %s" % (st, took, body))
        # An event stream: the first heartbeat at once, the next after 5 s;
        # the connection must stay open in between.
        e = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        e.settimeout(30)
        e.connect(sock)
        e.sendall(("GET /v1/holds/%s/events HTTP/1.1\r\nHost: x\r\n\r\n" % hold).encode())
        got = b""
        t0 = time.monotonic()
        while got.count(b"event: heartbeat") < 2 and time.monotonic() - t0 < 15:
            d = e.recv(4096)
            if not d:
                break
            got += d
        check("limits: an event stream outlives the idle timeout (2 heartbeats, 5 s apart)",
              got.count(b"event: heartbeat") >= 2, repr(got[-200:]))
        e.close()
        rc = s.stop()
        check("limits: SIGTERM with a hold: exit 0", rc == 0, str(rc))
        check("logs: stop says holds_released=1 drained=yes",
              s.count(r" info stop holds_released=1 drained=yes") == 1, s.text())
    else:
        notok("limits: idle server did not start: " + s.text())
        s.stop()


# ---------------------------------------------------------------- logs

def test_logs():
    bad = []
    seen = set()
    for item in LOGS:
        if isinstance(item, str) and os.path.exists(item):
            with open(item) as f:
                text = f.read()
        else:
            text = item
        if TOKEN in text:
            notok("logs: the token is in a log: " + str(item))
            return
        for line in text.splitlines():
            if line.startswith("cerberus: ") or line == "ok":
                continue  # the refusals before a server starts, and --check's
            if not RECORD.match(line):
                bad.append(line)
            else:
                seen.add(line.split(" ")[2])
    ok("logs: the token (and its rotation) is in no line")
    check("logs: every record is TIME LEVEL EVENT key=value...", not bad, repr(bad[:3]))
    for ev in ("start", "listen", "stop", "reload", "signal", "limit"):
        check("logs: a %s record" % ev, ev in seen, str(sorted(seen)))


def main():
    try:
        test_check()
        test_remote()
        test_group()
        test_notify()
        test_activation()
        test_reload()
        test_limits()
        test_logs()
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["rm", "-rf", DIR])
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
