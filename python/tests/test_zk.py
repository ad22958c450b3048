"""Against the shared test ZooKeeper: exclusion with kazoo's Lock (given
Curator's node names, as docs/python.md shows) both ways, and asyncio
cancellation leaving no lock node behind."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import cerberus
from conftest import require_module, uniq, wait_until

kazoo_client = require_module("kazoo.client", "python3-kazoo")
kazoo_lock = require_module("kazoo.recipe.lock", "python3-kazoo")


class CuratorLock(kazoo_lock.Lock):
    """kazoo's Lock with Curator's node names (<uuid>-lock-<sequence>), the
    layout Cerberus's zk engine and Curator's InterProcessMutex share."""

    _NODE_NAME = "-lock-"
    _EXCLUDE_NAMES = ["-lock-"]


@pytest.fixture
def zk(zk_ns):
    kz = kazoo_client.KazooClient(hosts="127.0.0.1:%d" % zk_ns.port)
    kz.start(timeout=15)
    yield kz
    try:
        kz.delete(zk_ns.root.rsplit("/", 1)[0], recursive=True)
    except Exception:  # noqa: BLE001 - best effort
        pass
    kz.stop()
    kz.close()


@pytest.fixture
def client(zk_ns):
    with cerberus.Client(text=zk_ns.config()) as c:
        yield c


def test_excludes_kazoo_lock_both_ways(zk_ns, zk, client):
    name = uniq("kz")
    path = "%s/%s" % (zk_ns.root, name)
    theirs = CuratorLock(zk, path, "kazoo")
    assert theirs.acquire(timeout=10)
    got = {}
    try:
        with pytest.raises(cerberus.Busy):
            client.lock(name).acquire(wait=0)
        with pytest.raises(cerberus.Timeout):
            client.lock(name).acquire(wait=0.2)

        def waiter():
            got["hold"] = client.lock(name).acquire(wait=20)

        t = threading.Thread(target=waiter)
        t.start()
        # Our waiter queues behind kazoo's node: two contenders.
        wait_until(lambda: len(zk.get_children(path)) == 2, what="our node in the queue")
        assert "hold" not in got
    finally:
        theirs.release()
    t.join(20)
    hold = got["hold"]
    try:
        other = CuratorLock(zk, path, "kazoo-2")
        assert not other.acquire(blocking=False)  # Cerberus holds: kazoo waits
        got2 = {}

        def kazoo_waiter():
            got2["ok"] = other.acquire(timeout=20)

        t2 = threading.Thread(target=kazoo_waiter)
        t2.start()
        wait_until(lambda: len(zk.get_children(path)) == 2, what="kazoo's node in the queue")
        assert "ok" not in got2
    finally:
        hold.release()
    t2.join(20)
    assert got2.get("ok") is True
    with pytest.raises(cerberus.Busy):
        client.lock(name).acquire(wait=0)
    other.release()
    assert zk.get_children(path) == []
    client.lock(name).acquire(wait=0).release()


def test_asyncio_cancel_leaves_no_node(zk_ns, zk, client):
    """The waiter queues a node on the server behind kazoo's; cancelling the
    task removes it, and a cancel racing the grant leaves no node either."""
    name = uniq("aiozk")
    path = "%s/%s" % (zk_ns.root, name)

    async def until(pred, what, timeout=10.0):
        end = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > end:
                pytest.fail("timed out waiting for " + what)
            await asyncio.sleep(0.005)

    async def main():
        async def job():
            async with client.alock(name):
                pass

        theirs = CuratorLock(zk, path, "kazoo")
        assert theirs.acquire(timeout=10)
        task = asyncio.create_task(job())
        await until(lambda: len(zk.get_children(path)) == 2, "our node queued")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(zk.get_children(path)) == 1  # only kazoo's is left
        theirs.release()
        assert zk.get_children(path) == []
        # Cancel racing the grant: kazoo releases as the task is cancelled.
        outcomes = set()
        for i in range(10):
            assert theirs.acquire(timeout=10)
            task = asyncio.create_task(job())
            await until(lambda: len(zk.get_children(path)) == 2, "our node queued")
            loop = asyncio.get_running_loop()
            rel = loop.run_in_executor(None, theirs.release)
            await asyncio.sleep(0.001 * (i % 4))
            task.cancel()
            try:
                await task
                outcomes.add("ran")
            except asyncio.CancelledError:
                outcomes.add("cancelled")
            await rel
            assert zk.get_children(path) == [], "an orphan node stayed on the server"
        assert "cancelled" in outcomes

    asyncio.run(main())
