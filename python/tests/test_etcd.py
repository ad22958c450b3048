"""Against the shared test etcd: exclusion with `etcdctl lock` (Go's
concurrency.Mutex) on the same name, both ways."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest

import cerberus
from conftest import read_line, require_tool, uniq, wait_until

require_tool("etcdctl", "etcd-client")


@pytest.fixture
def client(etcd_ns):
    with cerberus.Client(text=etcd_ns.config()) as c:
        yield c


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:  # by PID, whatever the test did
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_excludes_etcdctl_lock_both_ways(etcd_ns, client, procs):
    name = uniq("ctl")
    full = etcd_ns.prefix + name  # etcdctl's name for the same keys
    ctl = etcd_ns.etcdctl("lock", full, stdout=subprocess.PIPE)
    procs.append(ctl)
    assert read_line(ctl).startswith(full + "/")  # etcdctl holds it
    with pytest.raises(cerberus.Busy):
        client.lock(name).acquire(wait=0)
    with pytest.raises(cerberus.Timeout):
        client.lock(name).acquire(wait=0.2)
    holders = client.inspect(name)
    assert [h.waiting for h in holders] == [False]
    got = {}

    def waiter():
        got["hold"] = client.lock(name).acquire(wait=20)

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: len(client.inspect(name)) == 2, what="our key queued behind etcdctl")
    assert "hold" not in got
    ctl.send_signal(signal.SIGTERM)  # etcdctl unlocks on SIGTERM
    t.join(20)
    ctl.wait(10)
    hold = got["hold"]
    try:
        # Cerberus holds: `etcdctl lock NAME -- CMD` waits for our release.
        ctl2 = etcd_ns.etcdctl("lock", full, "--", "echo", "ran", stdout=subprocess.PIPE)
        procs.append(ctl2)
        wait_until(lambda: len(client.inspect(name)) == 2, what="etcdctl queued behind us")
        assert ctl2.poll() is None
    finally:
        hold.release()
    assert read_line(ctl2) == "ran"
    assert ctl2.wait(20) == 0
    wait_until(lambda: client.inspect(name) == [], what="etcdctl's key gone")
    client.lock(name).acquire(wait=5).release()
