"""conftest.py — what every test of the Python binding shares.

The package is imported from the source tree (python/ is put first on
sys.path), the library from $CERBERUS_LIB (ctest points it at the build's
libcerberus.so). Servers are the ctest fixtures' (tests/python/CMakeLists.txt):
their ports come in $CERB_REDIS_PORT, $CERB_ZK_PORT and $CERB_ETCD_PORT, and
a test needing a server whose port is not set is skipped.

Other suites share those servers, so every test works in a namespace of its
own: unique lock names, and a redis.prefix, zk.root or etcd.prefix made for
it (closure records, fence offsets and guard records are per namespace). A
fresh Redis prefix gets its data-loss marker through cerberus.init_stores
(force: the namespace is new, the shared server is not), as the docs check
does, so its first grant does not wait a lease.

Waiting is on conditions with deadlines (wait_until), never a fixed sleep.

A tool a test needs (redis-py, kazoo, etcdctl, pip, venv) that is missing
skips the test with the reason, unless $CERB_PY_REQUIRE=1 (ctest sets it):
then it fails, so a CI run cannot pass with whole parts of the suite
silently skipped.
"""

from __future__ import annotations

import _thread
import importlib
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import Callable, Dict, NoReturn, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYDIR)
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

import cerberus  # noqa: E402

_counter = itertools.count(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "exclusive: pauses or stops a server; runs only against an exclusive "
        "server (ctest python_exclusive, $CERB_PY_EXCLUSIVE=1)")
    # kazoo 2.8 calls Event.isSet(); not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:isSet:DeprecationWarning")


def uniq(tag: str) -> str:
    """A name no other test, process or run uses: <tag>-<pid>-<n>-<hex>."""
    return "%s-%d-%d-%s" % (tag, os.getpid(), next(_counter), secrets.token_hex(4))


def wait_until(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition",
               every: float = 0.01) -> object:
    """Poll @pred until it returns something true; fail after @timeout s."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            pytest.fail("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(every)


REQUIRE = os.environ.get("CERB_PY_REQUIRE") == "1"


def missing(reason: str) -> NoReturn:
    """Something a test needs is missing: skip it, or fail it when
    $CERB_PY_REQUIRE=1. Usable at module level too."""
    if REQUIRE:
        pytest.fail("%s; CERB_PY_REQUIRE=1: a required test may not be skipped" % reason,
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, package: str) -> ModuleType:
    """import @name, or missing() naming the Debian @package."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing("%s cannot be imported (Debian %s): %s" % (name, package, e))


def require_tool(exe: str, package: str) -> str:
    """The path of the program @exe, or missing() naming the Debian @package."""
    path = shutil.which(exe)
    if not path:
        missing("%s is not installed (Debian %s)" % (exe, package))
    return path


def port(var: str) -> int:
    v = os.environ.get(var)
    if not v:
        pytest.skip("%s is not set: no test server (run through ctest)" % var)
    return int(v)


# ------------------------------------------------------------ namespaces

class Redis:
    """The shared test redis: its port, a prefix of this test's own, and
    the configuration text for it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.prefix = uniq("py") + ":"
        self._raw = None

    def config(self, extra: str = "", redis_extra: str = "") -> str:
        return ('engines = ("redis");\nredis = { host = "127.0.0.1"; port = %d; '
                'prefix = "%s"; %s };\n%s\n' % (self.port, self.prefix, redis_extra, extra))

    def prepare(self) -> "Redis":
        cerberus.init_stores(text=self.config(), force=True)
        return self

    @property
    def raw(self):  # a redis-py client for looking at the server
        if self._raw is None:
            redis = require_module("redis", "python3-redis")
            self._raw = redis.Redis(host="127.0.0.1", port=self.port)
        return self._raw

    def key(self, name: str) -> str:
        return self.prefix + name


class ZK:
    def __init__(self, port: int) -> None:
        self.port = port
        self.root = "/cerb-py/%s/locks" % uniq("ns")

    def config(self, extra: str = "", zk_extra: str = "") -> str:
        return ('engines = ("zk");\nzk = { hosts = "127.0.0.1:%d"; root = "%s"; %s };\n%s\n'
                % (self.port, self.root, zk_extra, extra))


class Etcd:
    def __init__(self, port: int) -> None:
        self.port = port
        self.prefix = uniq("py") + "-"

    def config(self, extra: str = "", etcd_extra: str = "") -> str:
        return ('engines = ("etcd");\netcd = { endpoints = ("http://127.0.0.1:%d"); '
                'prefix = "%s"; %s };\n%s\n' % (self.port, self.prefix, etcd_extra, extra))

    def etcdctl(self, *args: str, **kw) -> subprocess.Popen:
        env = dict(os.environ, ETCDCTL_API="3")
        env.pop("LD_PRELOAD", None)
        return subprocess.Popen(["etcdctl", "--endpoints=http://127.0.0.1:%d" % self.port,
                                 *args], env=env, start_new_session=True, **kw)


@pytest.fixture
def redis_ns() -> Redis:
    return Redis(port("CERB_REDIS_PORT")).prepare()


@pytest.fixture
def zk_ns() -> ZK:
    return ZK(port("CERB_ZK_PORT"))


@pytest.fixture
def etcd_ns() -> Etcd:
    return Etcd(port("CERB_ETCD_PORT"))


@pytest.fixture
def sigint():
    """Python's own SIGINT handler (KeyboardInterrupt), as an interactive
    program has it: a process started as a background job (ctest's, through
    run_in_session.sh) has SIGINT ignored, and Python then installs none."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def local_client():
    with cerberus.Client() as c:
        yield c


# ------------------------------------------------------------ processes

def child_env() -> Dict[str, str]:
    """The environment for a Python child that imports this package from
    the source tree (the sanitizer preload and $CERBERUS_LIB carry over)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                 else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def read_line(proc: subprocess.Popen, timeout: float = 20.0) -> str:
    """The next line the child prints on stdout, within @timeout s."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0 or not sel.select(left):
            pytest.fail("the child printed no line within %.0f s (got %r)" % (timeout, buf))
        chunk = os.read(fd, 4096)
        if not chunk:
            pytest.fail("the child exited (status %s) without a line; got %r"
                        % (proc.wait(), buf))
        buf += chunk
    sel.close()
    return buf.split(b"\n", 1)[0].decode()


def server_pid(engine: str, port_: int) -> Optional[int]:
    """The PID scripts/servers.sh recorded for a test server."""
    state = os.environ.get("CERB_STATE_DIR")
    if not state:
        return None
    try:
        with open(os.path.join(state, "%s-%d.pid" % (engine, port_))) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class InterruptAfter:
    """The library with @fn wrapped: the C call runs, then a SIGINT is
    "delivered" (_thread.interrupt_main) before Python gets the result:
    what a Ctrl-C during the call does."""

    def __init__(self, real, fn):
        self._real = real
        self._fn = fn

    def __getattr__(self, attr):
        real = getattr(self._real, attr)
        if attr != self._fn:
            return real

        def wrapped(*args):
            st = real(*args)
            _thread.interrupt_main()
            return st

        return wrapped


# ------------------------------------------------------------ cerberus serve

TOKEN = "py-remote-token-" + uniq("t")


def _binary() -> str:
    exe = os.environ.get("CERBERUS_BIN")
    if exe:
        return exe
    for build in sorted(os.listdir(ROOT)):
        cand = os.path.join(ROOT, build, "cli", "cerberus")
        if build.startswith("build") and os.access(cand, os.X_OK):
            return cand
    missing("no cerberus binary: set CERBERUS_BIN (ctest does)")


class Daemon:
    """One `cerberus serve` process: unix socket @sock, and TCP on @port
    when given (with the token file @token_file)."""

    def __init__(self, tmp, config: str = 'engines = ("local");\n',
                 port: int = 0) -> None:
        self.dir = tmp
        self.sock = os.path.join(str(tmp), "serve.sock")
        self.address = "unix:" + self.sock
        self.port = port
        self.token_file = os.path.join(str(tmp), "token")
        # Owner-only: the daemon refuses a token file others may read.
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w") as f:
            f.write(TOKEN + "\n")
        cfg = os.path.join(str(tmp), "cerberus.cfg")
        with open(cfg, "w") as f:
            f.write(config)
        args = [_binary(), "-c", cfg, "serve", "--listen", self.address]
        if port:
            args += ["--listen", "127.0.0.1:%d" % port, "--token-file", self.token_file]
        self.log = os.path.join(str(tmp), "serve.log")
        env = dict(os.environ)
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        wait_until(self._ready, 30, "cerberus serve to answer /healthz (log: %s)" % self.log)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail("cerberus serve exited %s:\n%s" % (self.proc.returncode, self.output()))
        try:
            cerberus.RemoteClient(self.address, timeout=2).close()
            if self.port:
                cerberus.RemoteClient(self.tcp, token=TOKEN, timeout=2).close()
        except cerberus.Unavailable:
            return False
        return True

    @property
    def tcp(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def output(self) -> str:
        with open(self.log, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self) -> int:
        """SIGTERM by PID, then wait for the exit (SIGKILL after 30 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                pytest.fail("cerberus serve did not stop within 30 s of SIGTERM")
        return self.proc.returncode
