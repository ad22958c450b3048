"""The lost callback after a server pause. It stops the redis server (SIGSTOP
by the PID scripts/servers.sh recorded), so it runs only on an exclusive
server: ctest's python_exclusive sets $CERB_PY_EXCLUSIVE=1 and points
$CERB_REDIS_PORT at the exclusive redis, under the redis_server lock."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import cerberus
from conftest import missing, server_pid, wait_until

pytestmark = [
    pytest.mark.exclusive,
    pytest.mark.skipif(os.environ.get("CERB_PY_EXCLUSIVE") != "1",
                       reason="pauses the server: only with CERB_PY_EXCLUSIVE=1 (an exclusive "
                       "server, ctest python_exclusive)"),
]


def test_lost_callback_after_a_server_pause(redis_ns, caplog):
    pid = server_pid("redis", redis_ns.port)
    if pid is None:
        missing("no PID recorded for the redis on port %d" % redis_ns.port)
    cfg = redis_ns.config(extra="lock = { lease_ms = 1000; };",
                          redis_extra="op_timeout_ms = 200; connect_timeout_ms = 200;")
    with cerberus.Client(text=cfg) as c:
        hold = c.lock("paused", wait=5).acquire()
        lost = threading.Event()
        seen = []

        def on_lost(h: cerberus.Hold) -> None:
            seen.append((h is hold, threading.current_thread() is threading.main_thread(),
                         h.state))
            lost.set()

        hold.on_lost(on_lost)
        # A callback that raises must not disturb the library (logged).
        other = c.lock("paused-2", wait=5).acquire()
        other.on_lost(lambda h: 1 / 0)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            assert lost.wait(15), "no lost callback within 15 s of the pause"
            took = time.monotonic() - t0
            wait_until(lambda: other.state is cerberus.State.LOST, what="the second hold lost")
            wait_until(lambda: any("exception in a callback" in r.getMessage()
                                   for r in caplog.records), what="the raising callback logged")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert took < 5  # at the hold's local deadline: about one lease
        assert seen == [(True, False, cerberus.State.LOST)]
        assert hold.state is cerberus.State.LOST
        with pytest.raises(cerberus.Lost) as e:
            hold.release()
        assert e.value.status == cerberus.Status.LOST and e.value.text  # the library's reason
        assert hold.error == e.value.text
        with pytest.raises(cerberus.Lost):
            other.release()
        # The server is back: the name is granted again once its lease ran out.
        with c.lock("paused", wait=10) as again:
            assert again.fencing_token > hold.fencing_token


def test_close_with_the_server_paused_is_bounded(redis_ns):
    """Closing a client whose engine does not answer: the holds are left to
    cerb_client_close(), which stops releasing on an engine once a release
    went unanswered, rather than freeing them one by one (an operation
    timeout each, and retries). Every Python hold is done afterwards."""
    pid = server_pid("redis", redis_ns.port)
    if pid is None:
        missing("no PID recorded for the redis on port %d" % redis_ns.port)
    op = 0.2
    cfg = redis_ns.config(extra="lock = { lease_ms = 2000; };",
                          redis_extra="op_timeout_ms = 200; connect_timeout_ms = 200;")
    c = cerberus.Client(text=cfg)
    holds = [c.lock("down-%d" % i, wait=5).acquire() for i in range(10)]
    attempt = c.guard("down-guard", "k").__enter__()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        c.close()
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert all(not h.held and h.state is cerberus.State.FREE for h in holds)
    assert attempt.state is cerberus.State.FREE
    # One release unanswered, then the engine is left alone: a few operation
    # timeouts in all, not one (or more, with retries) per hold.
    assert took < 10 * op, "close took %.2f s with 10 holds on a paused server" % took
