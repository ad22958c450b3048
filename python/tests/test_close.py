"""Closing a client cut short, re-entered (signal handlers) or raced by
the calls it must wait for; and helper threads that cannot start."""

from __future__ import annotations

import signal
import threading
import time

import pytest

import cerberus
from cerberus import client as cl
from conftest import uniq, wait_until


class Stop(Exception):
    """What the tests' signal handler raises."""


@pytest.fixture
def sigterm():
    """Install a SIGTERM handler (set by the test through the list this
    yields); the previous one is put back after."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    handlers = []

    def handler(signum, frame):
        handlers[0]()

    old = signal.signal(signal.SIGTERM, handler)
    yield handlers
    signal.signal(signal.SIGTERM, old)


def _kill_main_when(pred, what):
    """A thread that sends SIGTERM to the main thread once @pred holds."""
    main = threading.main_thread().ident

    def run():
        wait_until(pred, what=what)
        signal.pthread_kill(main, signal.SIGTERM)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _entered_elsewhere(h):
    """Enter handle @h on another thread until the event returned is set."""
    entered, leave = threading.Event(), threading.Event()

    def run():
        h.enter()
        entered.set()
        leave.wait(30)
        h.leave()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert entered.wait(10)
    return leave, t


def test_signal_handler_closes_during_a_wait(sigterm):
    """A SIGTERM handler that closes the client while the main thread waits
    in acquire(wait=None): the close cannot wait for that call (its frame is
    the one the handler interrupted), so it fires the cancel and returns;
    the acquisition ends with Interrupted and the frame finishes the close."""
    c = cerberus.Client()
    name = uniq("sigclose")
    holder = c.lock(name).acquire(wait=0)
    core = c._core
    closed_in_handler = []

    def close():
        c.close()
        closed_in_handler.append(True)

    sigterm.append(close)
    t = _kill_main_when(lambda: len(core.inflight) == 1, "the wait")
    start = time.monotonic()
    with pytest.raises(cerberus.Interrupted):
        c.lock(name).acquire(wait=None)
    assert time.monotonic() - start < 10
    t.join(10)
    assert closed_in_handler == [True]
    assert c.closed and core.closed  # finished by the acquiring frame
    assert not holder.held  # the close released it
    c.close()  # idempotent


def test_signal_handler_raising_after_close_during_a_wait(sigterm):
    """The same handler, raising after its close (as sys.exit would)."""
    c = cerberus.Client()
    name = uniq("sigexit")
    holder = c.lock(name).acquire(wait=0)

    def close():
        c.close()
        raise Stop()

    sigterm.append(close)
    t = _kill_main_when(lambda: len(c._core.inflight) == 1, "the wait")
    with pytest.raises(Stop):
        c.lock(name).acquire(wait=None)
    t.join(10)
    assert c._core.closed and not holder.held


def test_signal_handler_closes_during_a_close(sigterm):
    """The main thread is closing (waiting for a call of another thread)
    when a SIGTERM handler closes the client again: that close returns at
    once (it used to block on the close's mutex for ever)."""
    c = cerberus.Client()
    lock = c.lock(uniq("closeclose"))
    leave, t = _entered_elsewhere(lock._h)
    inner = []

    def close():
        c.close()
        inner.append(True)

    sigterm.append(close)
    # The close waits for the lock handle's user: let it go once the
    # handler's close returned (or after a while, for the test to fail).
    k = _kill_main_when(lambda: lock._h._cond is not None, "the close's wait")

    def release():
        k.join(10)
        wait_until(lambda: inner, timeout=10, what="the handler's close")
        leave.set()

    r = threading.Thread(target=lambda: (release() if True else None), daemon=True)
    r.start()
    try:
        c.close()
    finally:
        leave.set()
        r.join(10)
        t.join(10)
    assert inner == [True]
    assert c._core.closed


def test_an_interrupted_close_is_resumed(sigterm):
    """A close cut short while it waits for a child leaves that child in
    the table and the C client open; the next close waits for it and
    finishes (it used to find an empty table and free the child under its
    user)."""
    c = cerberus.Client()
    core = c._core
    lock = c.lock(uniq("resume"))
    leave, t = _entered_elsewhere(lock._h)

    def stop():
        raise Stop()

    sigterm.append(stop)
    k = _kill_main_when(lambda: lock._h._cond is not None, "the close's wait")
    with pytest.raises(Stop):
        c.close()
    k.join(10)
    assert c.closed and not core.closed
    assert id(lock._h) in core.children  # still waited for by the next close
    done = threading.Thread(target=c.close, daemon=True)
    done.start()
    wait_until(lambda: lock._h._users == 1 and not done.join(0.01) and done.is_alive(),
               what="the second close waiting")
    assert not core.closed
    leave.set()
    t.join(10)
    done.join(10)
    assert core.closed and not core.children


def test_an_interrupted_free_is_retried(sigterm):
    """dispose() cut short while it waits for a user frees nothing and
    leaves the handle as it was: a later free (here the close) still works
    (it used to wait for ever for a free that would never come)."""
    c = cerberus.Client()
    lock = c.lock(uniq("refree"))
    leave, t = _entered_elsewhere(lock._h)

    def stop():
        raise Stop()

    sigterm.append(stop)
    k = _kill_main_when(lambda: lock._h._cond is not None, "the free's wait")
    with pytest.raises(Stop):
        lock.close()
    k.join(10)
    assert not lock._h.gone and not lock._h._freeing
    leave.set()
    t.join(10)
    closer = threading.Thread(target=c.close, daemon=True)
    closer.start()
    closer.join(10)
    assert not closer.is_alive() and c._core.closed


def test_a_helper_thread_that_cannot_start(monkeypatch):
    """When the main thread's helper thread cannot start, the acquisition
    raises that error at once (it used to wait for ever for a job that
    never ran)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("helpers serve the main thread only")
    monkeypatch.setattr(cl, "_main_pool", [cl._Pool(8, "cerberus-main-call")])
    real = threading.Thread.start

    def start(self):
        if self.name == "cerberus-main-call":
            raise RuntimeError("can't start new thread")
        return real(self)

    with cerberus.Client() as c:
        lock = c.lock(uniq("nothread"))
        monkeypatch.setattr(threading.Thread, "start", start)
        with pytest.raises(RuntimeError, match="can't start"):
            lock.acquire(wait=None)
        monkeypatch.undo()
        assert not c._core.inflight
        lock.acquire(wait=0).release()


def test_a_lock_made_as_the_client_closes(monkeypatch):
    """A lock handle is adopted while the client's handle is still entered:
    a close starting right after cerb_lock_new waits, the adoption is
    refused and the lock freed once (ASan would see a double free or a use
    after free otherwise)."""
    c = cerberus.Client()
    real = cl.F
    closer = []

    class Fast:
        def __getattr__(self, attr):
            return getattr(real, attr)

        @staticmethod
        def cerb_lock_new(*args):
            st = real.cerb_lock_new(*args)
            t = threading.Thread(target=c.close, daemon=True)
            t.start()
            closer.append(t)
            wait_until(lambda: c.closed, what="the close")
            return st

    monkeypatch.setattr(cl, "F", Fast())
    with pytest.raises(cerberus.InvalidArgument, match="closed"):
        c.lock(uniq("race"))
    monkeypatch.undo()
    closer[0].join(10)
    assert c._core.closed


def test_a_client_failing_after_its_core_is_made(monkeypatch):
    """An exception after the core is listed but before the client takes
    it: the core is closed through itself (once), not behind its back."""
    made = []
    real = cl._Core.__init__

    def init(self, ptr):
        real(self, ptr)
        made.append(self)
        raise Stop()

    monkeypatch.setattr(cl._Core, "__init__", init)
    with pytest.raises(Stop):
        cerberus.Client()
    monkeypatch.undo()
    assert made and made[0].closed and made[0].handle.gone
    made[0].close()  # what the exit hook does: nothing left to close


def test_a_grant_landing_as_the_client_closes_is_interrupted(monkeypatch):
    """A hold granted while the client closes is given back, and the call
    says Interrupted (not InvalidArgument)."""
    c = cerberus.Client()
    real = cl.L

    class Slow:
        def __getattr__(self, attr):
            return getattr(real, attr)

        @staticmethod
        def cerb_lock_acquire(*args):
            st = real.cerb_lock_acquire(*args)
            c._core._fire()  # the close has begun
            return st

    lock = c.lock(uniq("landing"))
    monkeypatch.setattr(cl, "L", Slow())
    with pytest.raises(cerberus.Interrupted):
        lock.acquire(wait=0)
    monkeypatch.undo()
    c.close()
