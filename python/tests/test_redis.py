"""Against the shared test redis: exclusion with redis-py's Lock both ways,
a hold released from another thread, asyncio cancellation leaving no key
behind, the GIL released during a wait across clients, inspection, Ctrl-C
during a wait and just after a grant, a forked child that exits normally."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time

import pytest

import cerberus
from conftest import InterruptAfter, child_env, require_module, uniq, wait_until

redis = require_module("redis", "python3-redis")


@pytest.fixture
def client(redis_ns):
    with cerberus.Client(text=redis_ns.config()) as c:
        yield c


def test_excludes_redis_py_lock_both_ways(redis_ns, client):
    name = uniq("rpy")
    key = redis_ns.key(name)  # redis-py locks the key K = prefix + name
    theirs = redis_ns.raw.lock(key, timeout=30)
    assert theirs.acquire(blocking=False)
    try:
        with pytest.raises(cerberus.Busy):
            client.lock(name).acquire(wait=0)
        with pytest.raises(cerberus.Timeout):
            client.lock(name).acquire(wait=0.2)
        got = {}

        def waiter():
            got["hold"] = client.lock(name).acquire(wait=20)

        t = threading.Thread(target=waiter)
        t.start()
        wait_until(lambda: client._core.inflight, what="the waiting acquire")
    finally:
        theirs.release()
    t.join(20)
    hold = got["hold"]  # granted once redis-py let go (a re-check, no notification)
    try:
        assert redis_ns.raw.get(key) is not None
        assert not redis_ns.raw.lock(key, timeout=30).acquire(blocking=False)
        holders = client.inspect(name)
        assert [h.waiting for h in holders] == [False]
        assert holders[0].fence == hold.fencing_token & ((1 << 48) - 1)
    finally:
        hold.release()
    assert redis_ns.raw.get(key) is None
    mine = redis_ns.raw.lock(key, timeout=30)
    assert mine.acquire(blocking=False)
    mine.release()


def test_hold_released_from_another_thread(redis_ns, client):
    name = uniq("xt")
    hold = client.lock(name).acquire(wait=5)
    assert redis_ns.raw.get(redis_ns.key(name)) is not None
    t = threading.Thread(target=hold.release)
    t.start()
    t.join(10)
    assert hold.state is cerberus.State.FREE
    assert redis_ns.raw.get(redis_ns.key(name)) is None
    with pytest.raises(cerberus.NotOwner):
        hold.release()


def test_gil_released_while_waiting_on_the_server(redis_ns):
    """One client waits on the server (its waiter shows in inspect) while a
    pure-Python thread keeps counting: the wait does not hold the GIL."""
    name = uniq("gil")
    with cerberus.Client(text=redis_ns.config()) as a, \
            cerberus.Client(text=redis_ns.config()) as b:
        holder = a.lock(name).acquire(wait=5)
        state = {}

        def waiter():
            try:
                state["hold"] = b.lock(name).acquire(wait=30)
            except cerberus.Error as e:
                state["err"] = e
            state["done"] = True

        t = threading.Thread(target=waiter)
        t.start()
        wait_until(lambda: any(h.waiting for h in a.inspect(name)), what="the server waiter")
        count = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        s = threading.Thread(target=spin)
        s.start()
        try:
            start = count[0]
            wait_until(lambda: count[0] > start + 100000, what="the spinning thread")
            assert "done" not in state
        finally:
            stop.set()
            s.join(10)
            holder.release()
        t.join(30)
        assert isinstance(state.get("hold"), cerberus.Hold), state
        state["hold"].release()


async def until(pred, what, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            pytest.fail("timed out waiting for " + what)
        await asyncio.sleep(0.005)


def test_asyncio_cancel_leaves_no_orphan(redis_ns, client):
    """A task waiting on the server (behind redis-py's lock) is cancelled:
    its place in the queue goes; a cancel racing the grant leaves no key."""
    name = uniq("aio")
    key = redis_ns.key(name)
    # Released from an executor thread: no thread-local token.
    theirs = redis_ns.raw.lock(key, timeout=30, thread_local=False)

    async def main():
        entered = asyncio.Event()

        async def job():
            async with client.alock(name, wait=None):
                entered.set()

        assert theirs.acquire(blocking=False)
        task = asyncio.create_task(job())
        await until(lambda: any(h.waiting for h in client.inspect(name)), "our waiter")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not entered.is_set()
        assert [h.waiting for h in client.inspect(name)] == [False]  # redis-py's alone
        theirs.release()
        assert redis_ns.raw.get(key) is None
        # Cancel racing the grant: redis-py releases as the task is
        # cancelled; whatever landed is released before the task ends.
        outcomes = set()
        for i in range(20):
            assert theirs.acquire(blocking=False)
            task = asyncio.create_task(job())
            await until(lambda: client._core.inflight, "the acquire in the library")
            rel = asyncio.get_running_loop().run_in_executor(None, theirs.release)
            await asyncio.sleep(0.002 * (i % 5))
            task.cancel()
            try:
                await task
                outcomes.add("ran")
            except asyncio.CancelledError:
                outcomes.add("cancelled")
            await rel
            assert redis_ns.raw.get(key) is None, "an orphan hold stayed on the server"
            assert client.inspect(name) == []
        assert "cancelled" in outcomes
        # Still usable afterwards, and tasks that are not cancelled go in turn.
        order = []

        async def worker(i):
            async with client.alock(name, wait=10) as hold:
                order.append(i)
                assert hold.state is cerberus.State.VALID
        await asyncio.gather(*(worker(i) for i in range(5)))
        assert sorted(order) == list(range(5))

    asyncio.run(main())
    assert redis_ns.raw.get(key) is None


def test_async_with_hold_and_lock_timeout(redis_ns, client):
    name = uniq("aw")

    async def main():
        async with client.alock(name, wait=1) as hold:
            assert redis_ns.raw.get(redis_ns.key(name)) is not None
            with pytest.raises(cerberus.Timeout):
                async with client.alock(name, wait=0.1):
                    pass
            token = hold.fencing_token
        hold2 = await client.lock(name).acquire_async(wait=1)
        async with hold2:
            assert hold2.fencing_token > token
        assert hold2.state is cerberus.State.FREE

    asyncio.run(main())


def test_two_engines_status_and_switch(redis_ns, zk_ns):
    cfg = ('engines = ("redis", "zk");\n'
           'redis = { host = "127.0.0.1"; port = %d; prefix = "%s"; };\n'
           'zk = { hosts = "127.0.0.1:%d"; root = "%s"; };\n'
           % (redis_ns.port, redis_ns.prefix, zk_ns.port, zk_ns.root))
    switches = []
    with cerberus.Client(text=cfg) as c:
        c.on_switch(lambda a, b, why: switches.append((a, b, why)))
        st = c.status()
        assert [e.name for e in st.engines] == ["redis", "zk"]
        assert st.current == "redis" and st.engines[0].active
        assert c.switch("zk") == "zk"
        assert c.current_engine == "zk"
        wait_until(lambda: switches, what="the switch callback")
        assert switches[0][:2] == ("redis", "zk")
        name = uniq("sw")
        with c.lock(name, wait=5) as hold:
            assert [h.engine for h in c.inspect(name, "zk")] == ["zk"]
            assert hold.state is cerberus.State.VALID
        assert c.switch("auto") in ("redis", "zk")
        metrics = c.metrics_text()
        assert 'cerberus_engine_active{engine="zk"}' in metrics


def test_ctrl_c_ends_an_unlimited_wait(redis_ns, client, sigint):
    """SIGINT while the main thread waits on the server without limit: the
    wait ends at once with KeyboardInterrupt (a C wait alone would not
    return for it), nothing of it stays on the server, and the holder (of
    another client) is untouched."""
    name = uniq("sigint")
    key = redis_ns.key(name)
    other = cerberus.Client(text=redis_ns.config())
    holder = other.lock(name).acquire(wait=5)
    main = threading.main_thread().ident
    ended = threading.Event()
    log = []

    def interrupter():
        end = time.monotonic() + 10
        while not any(h.waiting for h in other.inspect(name)):
            if time.monotonic() > end:
                log.append("no waiter")
                break
            time.sleep(0.005)
        signal.pthread_kill(main, signal.SIGINT)
        log.append("sent")
        if not ended.wait(5):  # Ctrl-C did not end the wait: let the grant land
            log.append("released the holder")
            holder.release()

    t = threading.Thread(target=interrupter)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                client.lock(name).acquire(wait=None)
            finally:
                ended.set()
    finally:
        t.join(30)
    try:
        assert log == ["sent"], log  # the wait ended while the holder still held
        assert [h.waiting for h in other.inspect(name)] == [False]  # no waiter left
        assert holder.held and holder.state is cerberus.State.VALID
        holder.release()
        assert redis_ns.raw.get(key) is None  # no hold of the interrupted call
        assert 'cerberus_holds 0' in client.metrics_text()
    finally:
        other.close()


def test_interrupt_right_after_the_grant_leaves_no_orphan(redis_ns, client, monkeypatch,
                                                          sigint):
    """KeyboardInterrupt lands between the grant and the Hold that owns it:
    the hold is released before the exception propagates."""
    for wait in (5, 0):
        name = uniq("kbi")
        monkeypatch.setattr(cerberus.client, "L", InterruptAfter(cerberus.client.L,
                                                                   "cerb_lock_acquire"))
        with pytest.raises(KeyboardInterrupt):
            client.lock(name).acquire(wait=wait)
        monkeypatch.undo()
        assert redis_ns.raw.get(redis_ns.key(name)) is None, "an orphan hold on the server"
        assert client.inspect(name) == []
        client.lock(name).acquire(wait=0).release()
    assert 'cerberus_holds 0' in client.metrics_text()


FORK_CHILD = r"""
import os, sys, threading, time
import cerberus

cfg, name = sys.argv[1:3]
client = cerberus.Client(text=cfg)
second = cerberus.Client(text=cfg)  # its waiter queues on the server
lock = client.lock(name)
hold = lock.acquire(wait=5)
cancel = cerberus.Cancel()
waited = {}


def waiter():
    try:
        waited["hold"] = second.lock(name).acquire(wait=None, cancel=cancel)
    except cerberus.Error as e:
        waited["err"] = e


t = threading.Thread(target=waiter, daemon=True)
t.start()
end = time.monotonic() + 10
while not any(h.waiting for h in client.inspect(name)):  # the cancel is in use
    assert time.monotonic() < end, "no waiter"
    time.sleep(0.005)
pid = os.fork()
if pid == 0:
    out = []
    for call in (lambda: lock.acquire(wait=0), hold.release, lambda: hold.state,
                 lambda: cancel.error, client.status):
        try:
            call()
            out.append("no error")
        except cerberus.InvalidArgument as e:
            out.append("fork" in e.text)
    cancel.close()  # in use by a thread of the parent: not waited for here
    with cerberus.Client() as own:  # a client of its own works
        with own.lock("child", wait=1):
            pass
    print("child", out, flush=True)
    sys.exit(0)  # a normal exit: exit hooks and finalizers run
deadline = time.monotonic() + 20
while True:
    got, status = os.waitpid(pid, os.WNOHANG)
    if got:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung", flush=True)
        sys.exit(3)
    time.sleep(0.01)
print("exit", os.waitstatus_to_exitcode(status), flush=True)
print("state", hold.state.name, flush=True)
mask = (1 << 48) - 1
print("server", [(h.waiting, h.fence == hold.fencing_token & mask) for h in client.inspect(name)],
      flush=True)
cancel.fire()
t.join(10)
print("waiter", type(waited.get("err")).__name__, flush=True)
hold.release()
client.close()
second.close()
"""


def test_fork_child_exits_normally_and_leaves_the_parent_alone(redis_ns):
    """A child forked while a thread waits with a cancel refuses the
    parent's objects with a text naming the fork, closes that cancel without
    waiting for the parent's thread, exits normally (exit hooks, finalizers)
    with the parent's client, lock, hold and cancel alive; the parent's hold
    is still VALID and on the server."""
    name = uniq("fork")
    r = subprocess.run([sys.executable, "-c", FORK_CHILD, redis_ns.config(), name],
                       env=child_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["child [True, True, True, True, True]", "exit 0", "state VALID",
                     "server [(False, True), (True, False)]", "waiter Interrupted"], r.stdout + r.stderr
    assert redis_ns.raw.get(redis_ns.key(name)) is None
