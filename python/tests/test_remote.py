"""cerberus.RemoteClient against a real `cerberus serve` (the built
binary, $CERBERUS_BIN) with the `local` engine, on a unix socket in a
temporary directory and on 127.0.0.1:$CERB_PY_SERVE_PORT (28180 by
default) with a token file; each daemon is stopped by its PID.

Tests marked "serve-native" use routes another branch adds (the guard,
/v1/switch, /metrics): against a daemon without them they fail (the daemon
answers "no such route"), they are not skipped.

Waiting is on conditions with deadlines (wait_until, a blocking acquire
with a wait, Event.wait with a timeout), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import cerberus
from conftest import TOKEN, Daemon, child_env, uniq, wait_until

PORT = int(os.environ.get("CERB_PY_SERVE_PORT") or 28180)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("serve"), port=PORT)
    yield d
    rc = d.stop()
    assert rc == 0, "cerberus serve exited %s:\n%s" % (rc, d.output())


@pytest.fixture
def own_daemon(tmp_path):
    """A daemon of the test's own, which it may stop."""
    ds = []

    def make(config: str = 'engines = ("local");\n') -> Daemon:
        d = Daemon(tmp_path / ("d%d" % len(ds)), config)
        ds.append(d)
        return d

    (tmp_path / "d0").mkdir()
    (tmp_path / "d1").mkdir()
    yield make
    for d in ds:
        d.stop()


@pytest.fixture
def remote(daemon):
    with cerberus.RemoteClient(daemon.address) as c:
        yield c


# ------------------------------------------------------------------ locks

def test_lock_release_and_context_manager(remote):
    name = uniq("rl")
    with remote.lock(name, wait=5) as hold:
        assert isinstance(hold, cerberus.RemoteHold)
        assert isinstance(hold.fencing_token, int) and hold.fencing_token > 0
        assert hold.state is cerberus.State.VALID and hold.held and hold.name == name
        assert [h.waiting for h in remote.inspect(name)] == [False]
    assert hold.state is cerberus.State.FREE and not hold.held
    assert remote.inspect(name) == []
    with pytest.raises(cerberus.NotOwner):
        hold.release()

    hold = remote.lock(name).acquire(wait=0)
    hold.release()
    assert remote.inspect(name) == []


def test_fencing_tokens_increase(remote):
    name = uniq("rf")
    tokens = []
    for _ in range(3):
        with remote.lock(name, wait=5) as hold:
            tokens.append(hold.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens


def test_busy_and_timeout(remote):
    name = uniq("rb")
    with remote.lock(name, wait=5):
        with pytest.raises(cerberus.Busy) as e:
            remote.lock(name).acquire(wait=0)
        assert e.value.status == cerberus.Status.BUSY and e.value.name == "BUSY"
        start = time.monotonic()
        with pytest.raises(cerberus.Timeout) as e:
            remote.lock(name).acquire(wait=0.3)
        assert isinstance(e.value, TimeoutError)
        assert time.monotonic() - start >= 0.25
    with pytest.raises(cerberus.InvalidArgument):
        remote.lock("").acquire(wait=0)


def test_two_clients_exclude_each_other(daemon):
    name = uniq("rx")
    with cerberus.RemoteClient(daemon.address) as a, \
            cerberus.RemoteClient(daemon.tcp, token_file=daemon.token_file) as b:
        with a.lock(name, wait=5):
            with pytest.raises(cerberus.Busy):
                b.lock(name).acquire(wait=0)
        with b.lock(name, wait=5):
            with pytest.raises(cerberus.Busy):
                a.lock(name).acquire(wait=0)


def test_a_blocking_wait_is_granted_on_release(remote, daemon):
    name = uniq("rw")
    first = remote.lock(name).acquire(wait=5)
    got = {}
    other = cerberus.RemoteClient(daemon.address)

    def waiter():
        try:
            h = other.lock(name).acquire(wait=20)
            got["released_before"] = not first.held
            got["hold"] = h
        except BaseException as e:  # noqa: B902 - reported by the test
            got["error"] = e

    t = threading.Thread(target=waiter)
    t.start()
    # The waiter's request is on its connection (the daemon waits in the
    # library, where inspect does not list it).
    wait_until(lambda: in_flight(other), 20, "the waiter's request")
    assert "hold" not in got
    first.release()
    t.join(30)
    assert not t.is_alive()
    assert "error" not in got, got.get("error")
    assert got["released_before"]
    assert got["hold"].fencing_token > first.fencing_token
    got["hold"].release()
    other.close()


def in_flight(client) -> bool:
    """Whether a request of @client is on a connection (sent or being sent)."""
    return any(c._conn is not None for c in list(client._inflight))


def test_threads_share_one_client(remote):
    """Several threads, one RemoteClient: never two in the section."""
    name = uniq("rt")
    inside = [0]
    worst = [0]
    errors = []

    def work():
        try:
            for _ in range(5):
                with remote.lock(name, wait=20):
                    inside[0] += 1
                    worst[0] = max(worst[0], inside[0])
                    inside[0] -= 1
        except BaseException as e:  # noqa: B902
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert worst[0] == 1


def test_cancel_ends_a_wait(remote):
    name = uniq("rc")
    with remote.lock(name, wait=5):
        cancel = cerberus.RemoteCancel()
        timer = threading.Timer(0.2, cancel.fire)
        timer.start()
        start = time.monotonic()
        with pytest.raises(cerberus.Interrupted):
            remote.lock(name, lease_ms=500).acquire(wait=30, cancel=cancel)
        timer.join()
        assert time.monotonic() - start < 10
        with pytest.raises(TypeError):
            remote.lock(name).acquire(wait=0, cancel=object())


def test_close_releases_the_holds(daemon):
    name = uniq("rcl")
    c = cerberus.RemoteClient(daemon.address)
    hold = c.lock(name).acquire(wait=5)
    c.close()
    assert not hold.held and hold.state is cerberus.State.FREE
    with cerberus.RemoteClient(daemon.address) as d:
        d.lock(name).acquire(wait=0).release()
    with pytest.raises(cerberus.InvalidArgument):
        c.lock(name).acquire(wait=0)


# ------------------------------------------------------------------- lost

def test_lost_when_the_daemon_stops(own_daemon):
    d = own_daemon()
    c = cerberus.RemoteClient(d.address)
    lost = threading.Event()
    hold = c.lock(uniq("rs")).acquire(wait=5)
    seen = []
    hold.on_lost(lambda h: (seen.append(h), lost.set()))
    assert d.stop() == 0  # SIGTERM: the daemon releases every hold
    assert lost.wait(20), "on_lost was not called after the daemon stopped"
    assert seen == [hold] and hold.state is cerberus.State.LOST
    with pytest.raises(cerberus.Lost):
        hold.release()
    assert hold.state is cerberus.State.FREE
    # A daemon that is not there: a clear error naming its address.
    with pytest.raises(cerberus.Unavailable) as e:
        c.lock("x").acquire(wait=0)
    assert d.sock in str(e.value)
    c.close()


def test_a_kept_hold_outlives_its_lease(daemon):
    """The hold's keepalives keep it on the daemon past lease_ms: a second
    caller's wait of five leases runs out."""
    name = uniq("rko")
    with cerberus.RemoteClient(daemon.address) as c:
        with c.lock(name, lease_ms=300).acquire(wait=5) as hold:
            with pytest.raises(cerberus.Timeout):
                c.lock(name).acquire(wait=1.5)
            assert hold.state is cerberus.State.VALID


def test_lost_when_keepalives_stop(daemon):
    """A caller that stalls (no keepalive): the daemon releases the hold at
    the end of its lease_ms, another caller gets the name, the stalled
    one's hold reads LOST by then, and on_lost fires once it runs again."""
    name = uniq("rk")
    c = cerberus.RemoteClient(daemon.address)
    other = cerberus.RemoteClient(daemon.address)
    lost = threading.Event()
    hold = c.lock(name, lease_ms=300).acquire(wait=5)
    hold.on_lost(lambda h: lost.set())
    hold._pause_keeper()
    second = other.lock(name).acquire(wait=20)  # granted once the daemon let it go
    assert second.fencing_token > hold.fencing_token
    # Its local deadline passed before the daemon let the name go: the
    # stalled holder reads LOST even before it talks to the daemon again
    # (its keeper, stalled too, has not called on_lost yet).
    assert hold.state is cerberus.State.LOST
    assert not lost.is_set()
    hold._resume_keeper()
    assert lost.wait(20), "on_lost was not called"
    assert hold.state is cerberus.State.LOST
    with pytest.raises(cerberus.Lost):
        hold.release()
    second.release()
    c.close()
    other.close()


def test_paused_while_listening_lets_the_hold_go(daemon):
    """The same stall once the hold's event stream is open (an open stream
    keeps the hold on the daemon): the pause must end the stream, or the
    daemon keeps the hold for good. It did not: http.client drops
    conn.sock once a "Connection: close" answer has begun, and the shutdown
    went through conn.sock (test_lost_when_keepalives_stop failed so when
    the listener was quicker than the pause)."""
    name = uniq("rkl")
    c = cerberus.RemoteClient(daemon.address)
    other = cerberus.RemoteClient(daemon.address)
    hold = c.lock(name, lease_ms=300).acquire(wait=5)
    deadline = time.monotonic() + 10
    while not hold._core.listening:
        assert time.monotonic() < deadline, "the event stream did not open"
        time.sleep(0.01)
    hold._pause_keeper()
    second = other.lock(name).acquire(wait=5)
    assert hold.state is cerberus.State.LOST
    hold._resume_keeper()
    with pytest.raises(cerberus.Lost):
        hold.release()
    second.release()
    c.close()
    other.close()


def test_lost_event_from_the_daemon(own_daemon):
    """A daemon whose library does not renew: the hold is lost at its
    lease's end and the event stream says `event: lost`."""
    d = own_daemon('engines = ("local");\nlock = { renew = false; };\n')
    with cerberus.RemoteClient(d.address) as c:
        lost = threading.Event()
        hold = c.lock(uniq("re"), lease_ms=300).acquire(wait=5)
        hold.on_lost(lambda h: lost.set())
        assert lost.wait(20), "on_lost was not called"
        assert hold.state is cerberus.State.LOST
        with pytest.raises(cerberus.Lost):  # the daemon answers 410 LOST
            hold.release()
        with pytest.raises(cerberus.InvalidArgument):  # released, as Hold.on_lost
            hold.on_lost(lambda h: None)


# ------------------------------------------------------- access and errors

def test_token_missing_or_wrong_is_unauthorized(daemon):
    with pytest.raises(cerberus.Unauthorized) as e:
        cerberus.RemoteClient(daemon.tcp)
    assert e.value.name == "UNAUTHORIZED" and isinstance(e.value, PermissionError)
    with pytest.raises(cerberus.Unauthorized) as e:
        cerberus.RemoteClient(daemon.tcp, token="not-" + TOKEN)
    assert TOKEN not in str(e.value)
    with cerberus.RemoteClient(daemon.tcp, token=TOKEN) as c:
        with c.lock(uniq("ra"), wait=5) as hold:
            assert hold.state is cerberus.State.VALID
        assert TOKEN not in repr(c)


def test_daemon_absent_is_a_clear_error(tmp_path):
    sock = str(tmp_path / "nobody.sock")
    with pytest.raises(cerberus.Unavailable) as e:
        cerberus.RemoteClient("unix:" + sock)
    assert sock in str(e.value) and "cannot reach the cerberus daemon" in str(e.value)
    # A port nobody listens on (the suite's serve port + 1 is not used).
    with pytest.raises(cerberus.Unavailable) as e:
        cerberus.RemoteClient("http://127.0.0.1:%d" % (PORT + 1), token="x")
    assert "127.0.0.1:%d" % (PORT + 1) in str(e.value)
    for bad in ("localhost:80", "https://127.0.0.1:1", "unix:", "http://127.0.0.1"):
        with pytest.raises(ValueError):
            cerberus.RemoteClient(bad)
    with pytest.raises(cerberus.InvalidArgument) as e:
        cerberus.RemoteClient("unix:" + sock, token_file=str(tmp_path / "none"))
    assert "none" in str(e.value)


def test_not_available_remotely(remote):
    with pytest.raises(NotImplementedError, match="SIGHUP"):
        remote.reload()
    with pytest.raises(NotImplementedError, match="current_engine"):
        remote.on_switch(lambda *a: None)
    with pytest.raises(NotImplementedError, match="renew"):
        remote.lock("x", renew=True)


def test_status_and_inspect(remote):
    st = remote.status()
    assert st.current == "local" == remote.current_engine
    assert [e.name for e in st.engines] == ["local"]
    assert st.engines[0].breaker is cerberus.Breaker.CLOSED
    name = uniq("ri")
    with remote.lock(name, wait=5) as hold:
        [h] = remote.inspect(name)
        assert not h.waiting and h.engine == "local" and isinstance(h.fence, int)
        assert remote.inspect(name, engine="redis") == []
        assert hold.engine == "local"


def test_import_without_the_library(daemon, tmp_path):
    """`import cerberus` and a RemoteClient in a process where libcerberus
    cannot be loaded; Client says why, as before."""
    code = """if True:
        import sys, cerberus
        c = cerberus.RemoteClient(sys.argv[1])
        with c.lock(sys.argv[2], wait=5) as hold:
            print("token", hold.fencing_token)
        try:
            c.lock(sys.argv[2]).acquire(wait=0).release()
            cerberus.RemoteClient(sys.argv[1] + ".none")
        except cerberus.Unavailable as e:
            print("unavailable", e.name)
        c.close()
        print("loaded", "libcerberus" in open("/proc/self/maps").read())
        try:
            cerberus.Client()
        except ImportError as e:
            print("client:", type(e).__name__, e)
    """
    env = child_env()
    env["CERBERUS_LIB"] = str(tmp_path / "libnothere.so")
    r = subprocess.run([sys.executable, "-c", code, daemon.address, uniq("rn")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("token ") and int(lines[0].split()[1]) > 0
    assert lines[1] == "unavailable UNAVAILABLE"
    assert lines[2] == "loaded False"
    assert lines[3].startswith("client: LibraryNotFound cerberus: no usable libcerberus found")
    assert "libnothere.so: no such file" in lines[3]


def test_error_texts_match_the_library():
    """errors.py's table (used without the library) is the library's."""
    from cerberus import _lib, errors
    for code, (name, text) in errors._TEXTS.items():
        assert _lib.fast.cerb_status_name(code).decode() == name
        assert _lib.fast.cerb_strerror(code).decode() == text
    assert _lib.fast.cerb_status_name(len(errors._TEXTS)).decode() == "UNKNOWN", \
        "the library has a status this binding's table lacks"


# ---------------------------------------------------------------- asyncio

def test_alock(daemon):
    name = uniq("ras")

    async def main():
        with cerberus.RemoteClient(daemon.address) as c:
            order = []

            async def job(i):
                async with c.alock(name, wait=20) as hold:
                    order.append(hold.fencing_token)
                    await asyncio.sleep(0)

            await asyncio.gather(*(job(i) for i in range(3)))
            assert order == sorted(order) and len(order) == 3

            holder = await c.lock(name).acquire_async(wait=5)
            waiting = asyncio.ensure_future(job(99))
            # Cancel once the daemon has the waiter queued.
            deadline = time.monotonic() + 20
            while not in_flight(c):
                assert time.monotonic() < deadline, "the waiter never queued"
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await holder.release_async()
            assert holder.state is cerberus.State.FREE

    asyncio.run(main())


# ------------------------------------------- serve-native (another branch)

def test_guard_and_once(remote):
    """serve-native: POST /v1/guard/{scope}/{key}/begin|finish."""
    scope = uniq("rg")
    with remote.guard(scope, "k/1", keep=60) as attempt:
        assert attempt.state is cerberus.State.VALID and not attempt.degraded
        attempt.result = "done once"
    with pytest.raises(cerberus.Duplicate) as e:
        with remote.guard(scope, "k/1"):
            pytest.fail("the block ran twice")
    assert e.value.result == b"done once"

    runs = []

    @remote.once(scope + "-once", text=True)
    def f(key):
        runs.append(key)
        return "r-" + key

    assert f("a") == "r-a" and f("a") == "r-a" and runs == ["a"]

    with remote.guard(scope, "busy") as attempt:
        with pytest.raises(cerberus.Busy):
            with remote.guard(scope, "busy", wait=0):
                pass
        attempt.result = b"\xff\x00"
    with pytest.raises(cerberus.Duplicate) as e:
        with remote.guard(scope, "busy"):
            pass
    assert e.value.result == b"\xff\x00"


def test_guard_attempt_outlives_its_window(remote):
    """An attempt that runs for several of its windows (running=0.5 s) is
    kept by its keepalives: its finish stores the result. Without them the
    daemon frees it as failed after one window, and a second caller runs
    the operation too."""
    scope = uniq("rg-long")
    with remote.guard(scope, "k", running=0.5, keep=60) as attempt:
        time.sleep(2.0)  # the operation's own run time, not a synchronisation
        assert attempt.state is cerberus.State.VALID
        with pytest.raises(cerberus.Busy):
            with remote.guard(scope, "k", wait=0):
                pytest.fail("a second caller ran while the first still ran")
        attempt.result = "long"
    with pytest.raises(cerberus.Duplicate) as e:
        with remote.guard(scope, "k"):
            pytest.fail("the block ran twice")
    assert e.value.result == b"long"


def test_switch_and_metrics(remote):
    """serve-native: POST /v1/switch and GET /metrics."""
    assert remote.switch("local") == "local"
    with pytest.raises(cerberus.InvalidArgument):
        remote.switch("no-such-engine")
    text = remote.metrics_text()
    assert 'cerberus_engine_active{engine="local"}' in text


# ------------------------------------------- validity: keepalive + deadline

def test_hold_lost_in_time_when_the_daemon_is_stopped(own_daemon):
    """S1: the daemon is stopped (SIGSTOP) while it keeps a hold of
    lease_ms=1000: nothing renews the hold any more, and another owner may
    take the name once its lease passes. The hold must read LOST by then
    (+300 ms of slack for this test's polling and a loaded machine), and
    on_lost must have fired — whatever the event stream (silent, not
    closed) says. It read VALID for ~15 s before the local deadline."""
    d = own_daemon()
    lease = 1.0
    with cerberus.RemoteClient(d.address, timeout=30) as c:
        hold = c.lock(uniq("rS1"), lease_ms=int(lease * 1000)).acquire(wait=5)
        lost = threading.Event()
        hold.on_lost(lambda h: lost.set())
        assert hold.state is cerberus.State.VALID
        stopped = time.monotonic()
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            limit = stopped + lease + 0.3
            while hold.state is not cerberus.State.LOST and time.monotonic() < limit:
                time.sleep(0.005)  # polling a condition against its deadline
            seen = time.monotonic() - stopped
            assert hold.state is cerberus.State.LOST, \
                "still %s %.2f s after the daemon stopped (lease %g s)" % (
                    hold.state.name, seen, lease)
            assert lost.wait(max(0.0, limit - time.monotonic()) + 0.05), \
                "on_lost did not fire by the deadline"
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        with pytest.raises(cerberus.Lost):
            hold.release()


def test_a_kept_hold_stays_valid_for_three_leases(daemon):
    """The keeper's keepalives move the local deadline on in time: a hold
    of lease_ms=1000 reads VALID at every look for three leases, and the
    name stays taken."""
    name = uniq("rv3")
    with cerberus.RemoteClient(daemon.address) as c:
        hold = c.lock(name, lease_ms=1000).acquire(wait=5)
        end = time.monotonic() + 3.0
        looks = 0
        while time.monotonic() < end:
            assert hold.state is cerberus.State.VALID, "%s after %d looks" % (
                hold.state.name, looks)
            looks += 1
            time.sleep(0.01)  # the next look, not a synchronisation
        with pytest.raises(cerberus.Busy):
            c.lock(name).acquire(wait=0)
        hold.release()


def test_guard_attempt_kept_within_the_daemons_window(own_daemon):
    """S2: a daemon whose attempts' window is 1 s (serve.keepalive_ms) and
    an attempt begun without `running`: the client keeps it alive every
    third of the window_ms the daemon answered (it kept it every 2 s, so
    the daemon freed it after 1 s and B ran the operation too)."""
    d = own_daemon('engines = ("local");\nserve = { keepalive_ms = 1000; };\n')
    scope = uniq("rg-S2")
    entered = threading.Event()
    finish = threading.Event()
    errors = []

    def a():
        try:
            with cerberus.RemoteClient(d.address) as ca:
                with ca.guard(scope, "k", keep=60) as attempt:
                    entered.set()
                    finish.wait(3.0)  # A's operation runs up to 3 s
                    assert attempt.state is cerberus.State.VALID, attempt.state
                    attempt.result = "A"
        except BaseException as e:  # noqa: B902 - reported by the test
            errors.append(e)
            entered.set()

    t = threading.Thread(target=a)
    t.start()
    try:
        assert entered.wait(20), "A never entered the guard"
        assert not errors, errors
        time.sleep(1.5)  # the scenario's time (past one window), not a synchronisation
        with cerberus.RemoteClient(d.address) as cb:
            with pytest.raises(cerberus.Busy):
                with cb.guard(scope, "k", wait=0):
                    pytest.fail("B ran the operation while A still ran it")
    finally:
        finish.set()
        t.join(30)
    assert not errors, errors
    with cerberus.RemoteClient(d.address) as cb:
        with pytest.raises(cerberus.Duplicate) as e:
            with cb.guard(scope, "k"):
                pytest.fail("the block ran twice")
        assert e.value.result == b"A"


def test_guard_attempt_lost_in_time_when_the_daemon_is_stopped(own_daemon):
    """S2, the other half: keepalives that fail (the daemon is stopped) do
    not keep the attempt VALID; it reads LOST once its window passed since
    the last confirmed keepalive (the daemon frees it then), and on_lost
    fires. It stayed VALID, with its failures only logged."""
    d = own_daemon('engines = ("local");\nserve = { keepalive_ms = 1000; };\n')
    window = 1.0

    class Stop(Exception):
        pass

    with cerberus.RemoteClient(d.address, timeout=30) as c:
        lost = threading.Event()
        with pytest.raises(Stop):
            with c.guard(uniq("rg-S2b"), "k") as attempt:
                attempt.on_lost(lambda a: lost.set())
                assert attempt.state is cerberus.State.VALID
                stopped = time.monotonic()
                os.kill(d.proc.pid, signal.SIGSTOP)
                try:
                    limit = stopped + window + 0.3
                    while attempt.state is not cerberus.State.LOST \
                            and time.monotonic() < limit:
                        time.sleep(0.005)  # polling a condition against its deadline
                    assert attempt.state is cerberus.State.LOST, \
                        "still %s %.2f s after the daemon stopped (window %g s)" % (
                            attempt.state.name, time.monotonic() - stopped, window)
                    assert lost.wait(max(0.0, limit - time.monotonic()) + 0.05), \
                        "on_lost did not fire by the deadline"
                finally:
                    os.kill(d.proc.pid, signal.SIGCONT)
                raise Stop()


def test_a_hold_without_lease_is_kept_within_the_daemons_window(own_daemon):
    """A hold acquired without lease_ms lives on the daemon by its
    serve.keepalive_ms window, which the client is not told: here 1 s,
    shorter than the keepalive period the client would pick from the
    library's 10 s lease. The hold's open event stream keeps it (the daemon
    never expires a hold that is listened to): past two windows the name is
    still taken and the hold VALID. Without the stream the daemon released
    it after 1 s and another caller got it while the hold read VALID."""
    d = own_daemon('engines = ("local");\nserve = { keepalive_ms = 1000; };\n')
    name = uniq("rnl")
    with cerberus.RemoteClient(d.address) as c, cerberus.RemoteClient(d.address) as other:
        hold = c.lock(name).acquire(wait=5)
        time.sleep(2.0)  # the scenario's time (two windows), not a synchronisation
        with pytest.raises(cerberus.Busy):
            other.lock(name).acquire(wait=0).release()
        assert hold.state is cerberus.State.VALID
        hold.release()
