"""The idempotency guard and the `once` decorator: duplicates, failures,
waiting for a running attempt, and a process killed mid-operation (its
claim expires after `running`, then a retry runs the operation)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

import cerberus
from conftest import InterruptAfter, child_env, read_line, uniq, wait_until


@pytest.fixture(params=["local", "redis", "zk", "etcd"])
def cfg(request) -> str:
    if request.param == "local":
        return 'engines = ("local");\n'
    ns = request.getfixturevalue(request.param + "_ns")
    return ns.config()


def test_guard_runs_once_and_answers_duplicates(cfg):
    scope, key = uniq("orders"), "req-7"
    runs = []
    with cerberus.Client(text=cfg) as c:
        for _ in range(3):
            try:
                with c.guard(scope, key) as attempt:
                    runs.append(1)
                    assert attempt.state is cerberus.State.VALID
                    assert not attempt.degraded
                    attempt.result = "order 1042"
                reply = attempt.result
            except cerberus.Duplicate as d:
                assert d.status == cerberus.Status.DUPLICATE
                reply = d.result.decode()
            assert reply == "order 1042"
        assert len(runs) == 1
        # A failure is forgotten at once: the retry runs.
        k2 = uniq("fail")
        with pytest.raises(RuntimeError):
            with c.guard(scope, k2):
                raise RuntimeError("payment declined")
        with c.guard(scope, k2, wait=0) as a:
            a.result = b"\x00binary\xff"
        with pytest.raises(cerberus.Duplicate) as e:
            with c.guard(scope, k2):
                pytest.fail("ran twice")
        assert e.value.result == b"\x00binary\xff"


def test_once_decorator(cfg):
    scope = uniq("once")
    calls = []
    with cerberus.Client(text=cfg) as c:
        @c.once(scope, text=True)
        def charge(order_id: str) -> str:
            calls.append(order_id)
            return "charged " + order_id

        assert charge("o-1") == "charged o-1"
        assert charge("o-1") == "charged o-1"  # the stored result
        assert charge("o-2") == "charged o-2"
        assert calls == ["o-1", "o-2"]

        @c.once(scope, key=lambda n, **kw: "fixed-%d" % n)
        def other(n: int, flag: bool = False) -> bytes:
            calls.append(n)
            return b"r%d" % n

        assert other(1, flag=True) == b"r1"
        assert other(1) == b"r1" and calls[-1] == 1 and calls.count(1) == 1

        fails = []

        @c.once(scope, key="flaky")
        def flaky() -> None:
            fails.append(1)
            if len(fails) == 1:
                raise ValueError("first try fails")

        with pytest.raises(ValueError):
            flaky()
        assert flaky() is None  # ran again, stored an empty result
        assert flaky() == b""
        assert len(fails) == 2


def test_busy_while_another_attempt_runs_then_waits(local_client):
    scope, key = uniq("busy"), "k"
    inside = threading.Event()
    release = threading.Event()

    def first():
        with local_client.guard(scope, key) as a:
            inside.set()
            release.wait(20)
            a.result = "first"

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    with pytest.raises(cerberus.Busy):
        with local_client.guard(scope, key, wait=0):
            pytest.fail("ran while another attempt ran")
    with pytest.raises(cerberus.Busy):
        with local_client.guard(scope, key, wait=0.1):
            pytest.fail("ran while another attempt ran")
    got = {}

    def second():
        try:
            with local_client.guard(scope, key, wait=20):
                got["ran"] = True
        except cerberus.Duplicate as d:
            got["dup"] = d.result

    t2 = threading.Thread(target=second)
    t2.start()
    release.set()
    t.join(20)
    t2.join(20)
    assert got == {"dup": b"first"}


def test_guard_options_are_checked(local_client):
    with pytest.raises(ValueError):
        local_client.guard("s", "k", on_unavailable="maybe")
    with pytest.raises(ValueError):
        local_client.guard("s", "k", running=0)
    with pytest.raises(TypeError):
        local_client.guard("s", None)
    with local_client.guard(uniq("forever"), "k", keep=cerberus.FOREVER, running=5):
        pass


CHILD = r"""
import sys
import cerberus

cfg, scope, key, mode = sys.argv[1:5]
client = cerberus.Client(text=cfg)
if mode == "guard":
    attempt = client.guard(scope, key, running=3.0, wait=0).__enter__()
    print("begun", flush=True)
    sys.stdin.read()  # until killed
else:
    @client.once(scope, key, running=3.0, wait=0)
    def operation():
        print("begun", flush=True)
        sys.stdin.read()  # until killed
        return "never"
    operation()
"""


def _crash_mid_operation(cfg: str, scope: str, key: str, mode: str) -> None:
    """A child begins the operation and is killed with SIGKILL inside it."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, cfg, scope, key, mode],
                             env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_line(child) == "begun"
    finally:
        child.kill()
        child.wait(20)
        child.stdin.close()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL


def test_guard_after_a_crash_mid_operation(redis_ns):
    cfg, scope, key = redis_ns.config(), uniq("crash"), "op-1"
    _crash_mid_operation(cfg, scope, key, "guard")
    t0 = time.monotonic()
    with cerberus.Client(text=cfg) as c:
        # The dead attempt's claim is still in force: not run, not done.
        with pytest.raises(cerberus.Busy):
            with c.guard(scope, key, wait=0):
                pytest.fail("ran while the crashed attempt's claim held")
        runs = []
        with c.guard(scope, key, wait=30) as attempt:  # once the claim expired
            runs.append(time.monotonic() - t0)
            attempt.result = "recovered"
        assert len(runs) == 1
        with pytest.raises(cerberus.Duplicate) as e:
            with c.guard(scope, key, wait=0):
                pytest.fail("ran twice")
        assert e.value.result == b"recovered"


def test_once_after_a_crash_mid_operation(redis_ns):
    cfg, scope, key = redis_ns.config(), uniq("crash-once"), "op-2"
    _crash_mid_operation(cfg, scope, key, "once")
    with cerberus.Client(text=cfg) as c:
        runs = []

        @c.once(scope, key, wait=30, text=True)
        def operation() -> str:
            runs.append(1)
            return "done"

        with pytest.raises(cerberus.Busy):
            c.once(scope, key, wait=0)(operation)()
        assert operation() == "done"  # ran, after the claim expired
        assert operation() == "done"  # stored
        assert runs == [1]


def test_guard_lost_callback_is_settable(local_client):
    with local_client.guard(uniq("cb"), "k") as a:
        seen = []
        a.on_lost(lambda att: seen.append(att))
        a.on_lost(None)
        assert a.state is cerberus.State.VALID
    assert a.state is cerberus.State.FREE


def test_close_interrupts_a_guard_waiting_for_a_running_attempt():
    c = cerberus.Client()
    scope = uniq("closing")
    inside = threading.Event()
    done = threading.Event()
    first_result = []

    def first():
        try:
            with c.guard(scope, "k"):
                inside.set()
                done.wait(20)
        except cerberus.Error as e:
            first_result.append(e)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    got = []

    def second():
        try:
            with c.guard(scope, "k", wait=None):
                got.append("ran")
        except cerberus.Error as e:
            got.append(e)

    t2 = threading.Thread(target=second)
    t2.start()
    wait_until(lambda: c.status().engines[0].guard_busy >= 1, what="the second told busy")
    c.close()
    t2.join(10)
    assert not t2.is_alive() and isinstance(got[0], cerberus.Interrupted), got
    done.set()
    t.join(10)
    # The first attempt was freed by the close: its success is not recorded.
    assert isinstance(first_result[0], cerberus.InvalidArgument)


def test_once_lets_the_functions_own_duplicate_propagate(local_client):
    """A Duplicate raised inside the function (a guard it uses itself) is
    the function's failure: it propagates, and it is not taken for the
    answer of once's own guard."""
    c = local_client
    inner = uniq("inner")
    with c.guard(inner, "k") as a:
        a.result = "the inner result"
    calls = []

    @c.once(uniq("outer"), key="k")
    def outer() -> str:
        calls.append(1)
        with c.guard(inner, "k"):  # already done: Duplicate
            pass
        return "outer"

    for _ in range(2):  # a failure is not recorded: it runs again
        with pytest.raises(cerberus.Duplicate) as e:
            outer()
        assert e.value.result == b"the inner result"
    assert calls == [1, 1]


def test_once_records_a_run_whose_result_cannot_be_stored(local_client):
    """The function ran (its side effect happened) but returned what once()
    cannot store: TypeError says so, and the run is recorded as done, so
    the next call does not repeat the side effect."""
    calls = []

    @local_client.once(uniq("badresult"), key="k")
    def charge() -> int:
        calls.append(1)
        return 42

    with pytest.raises(TypeError) as e:
        charge()
    assert "recorded as done" in str(e.value) and "int" in str(e.value)
    assert charge() == b""  # stored as empty; not run again
    assert calls == [1]

    @local_client.once(uniq("surrogate"), key="k", text=True)
    def odd() -> str:
        calls.append(2)
        return "\udc80"  # a str UTF-8 cannot encode

    with pytest.raises(TypeError):
        odd()
    assert odd() == "" and calls == [1, 2]


def test_attempt_result_is_checked_where_it_is_set(local_client):
    """A result of the wrong type fails at the assignment, in the block: the
    attempt then ends as failed (a retry runs at once), rather than being
    left open, unfinished and renewed."""
    scope = uniq("types")
    with pytest.raises(TypeError):
        with local_client.guard(scope, "k") as a:
            a.result = 42
    with local_client.guard(scope, "k", wait=0) as a:  # not Busy
        a.result = bytearray(b"ba")
        assert a.result == bytearray(b"ba")
        a.result = memoryview(b"mv")
    with pytest.raises(cerberus.Duplicate) as e:
        with local_client.guard(scope, "k"):
            pass
    assert e.value.result == b"mv"
    with local_client.guard(uniq("types-str"), "k") as a:
        a.result = "text"
    assert a.result == "text"


def test_interrupt_right_after_a_guard_begin(cfg, monkeypatch, sigint):
    """KeyboardInterrupt lands between the begin and the Attempt that owns
    it: the claim is given up before the exception propagates, so a retry
    runs at once."""
    scope = uniq("kbi")
    ran = []
    with cerberus.Client(text=cfg) as c:
        monkeypatch.setattr(cerberus.guard, "L", InterruptAfter(cerberus.guard.L,
                                                                 "cerb_guard_begin_ex"))
        with pytest.raises(KeyboardInterrupt):
            with c.guard(scope, "k"):
                ran.append("interrupted")
        monkeypatch.undo()
        with c.guard(scope, "k", wait=0) as a:  # not Busy: the claim was given up
            ran.append("retry")
            a.result = "once"
        assert ran == ["retry"]
