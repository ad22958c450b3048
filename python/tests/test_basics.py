"""The binding on the in-process local engine (no server): loading, errors,
holds and their lifetimes, cancels, closing, fork, threads and the GIL."""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time

import pytest

import cerberus
from conftest import uniq, wait_until


def test_library_loaded_and_versioned():
    assert cerberus.library_version.count(".") == 2
    assert os.path.exists(cerberus.library_path)
    if os.environ.get("CERBERUS_LIB"):
        assert os.path.samefile(cerberus.library_path, os.environ["CERBERUS_LIB"])


def test_client_modes_and_config_errors(tmp_path):
    with pytest.raises(ValueError):
        cerberus.Client("a.cfg", text="engines = (\"local\");")
    with pytest.raises(cerberus.ConfigError) as e:
        cerberus.Client(text='engines = ("redsi");')
    assert e.value.status == cerberus.Status.ECONFIG
    assert e.value.name == "ECONFIG"
    assert 'config:1: unknown engine "redsi"' in e.value.text
    assert "redsi" in str(e.value)
    missing = tmp_path / "nope.cfg"
    with pytest.raises(cerberus.ConfigError) as e:
        cerberus.Client(missing)
    assert "cannot read" in e.value.text
    cfg = tmp_path / "c.cfg"
    cfg.write_text('engines = ("local");\n')
    with cerberus.Client(cfg) as c:
        assert c.current_engine == "local"
    assert c.closed
    c.close()  # idempotent
    with pytest.raises(cerberus.InvalidArgument):
        c.lock("x")


def test_lock_hold_and_with(local_client):
    name = uniq("with")
    lock = local_client.lock(name, wait=2)
    with lock as hold:
        assert isinstance(hold, cerberus.Hold)
        assert hold.name == name
        assert hold.state is cerberus.State.VALID
        assert hold.fencing_token >> 48 == 1  # the default epoch
        with pytest.raises(cerberus.Busy) as e:
            lock.acquire(wait=0)  # not reentrant: a second hold waits
        assert e.value.status == cerberus.Status.BUSY
        with pytest.raises(cerberus.Timeout):
            lock.acquire(wait=0.05)
        token = hold.fencing_token
    assert hold.state is cerberus.State.FREE
    assert hold.fencing_token == token  # still readable
    with pytest.raises(cerberus.NotOwner):
        hold.release()
    with local_client.lock(name).acquire(wait=0) as h2:
        assert h2.fencing_token > token


def test_wait_values(local_client):
    lock = local_client.lock(uniq("w"))
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            lock.acquire(wait=bad)
    with pytest.raises(TypeError):
        lock.acquire(wait="5")
    lock.acquire(wait=float("inf")).release()
    with pytest.raises(ValueError):
        local_client.lock("x", wait=-2)


def test_bad_names_raise_invalid_argument(local_client):
    with pytest.raises(cerberus.InvalidArgument) as e:
        local_client.lock("")
    assert e.value.text
    with pytest.raises(cerberus.InvalidArgument):
        local_client.lock("a\nb")
    assert isinstance(e.value, ValueError)


def test_release_from_another_thread(local_client):
    name = uniq("xthread")
    hold = local_client.lock(name).acquire(wait=0)
    errors = []

    def release():
        try:
            hold.release()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=release)
    t.start()
    t.join(10)
    assert not errors and not t.is_alive()
    assert hold.state is cerberus.State.FREE
    local_client.lock(name).acquire(wait=0).release()


def test_concurrent_releases_one_wins(local_client):
    hold = local_client.lock(uniq("race")).acquire(wait=0)
    results = []
    barrier = threading.Barrier(4)

    def release():
        barrier.wait()
        try:
            hold.release()
            results.append("ok")
        except cerberus.NotOwner:
            results.append("not owner")

    ts = [threading.Thread(target=release) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert sorted(results) == ["not owner"] * 3 + ["ok"]


def test_cancel_ends_one_waiting_call(local_client):
    name = uniq("cancel")
    holder = local_client.lock(name).acquire(wait=0)
    lock = local_client.lock(name)
    c1, c2 = cerberus.Cancel(), cerberus.Cancel()
    out = {}

    def waiter(tag, cancel):
        try:
            out[tag] = lock.acquire(wait=30, cancel=cancel)
        except cerberus.Error as e:
            out[tag] = e

    t1 = threading.Thread(target=waiter, args=("a", c1))
    t2 = threading.Thread(target=waiter, args=("b", c2))
    t1.start()
    t2.start()
    wait_until(lambda: len(local_client._core.inflight) >= 2, what="two waiting calls")
    c1.fire()
    t1.join(10)
    assert isinstance(out["a"], cerberus.Interrupted)
    assert c1.fired and not c2.fired
    assert c1.error  # the text travels with the cancel
    assert "b" not in out  # the other call still waits
    holder.release()
    t2.join(10)
    assert isinstance(out["b"], cerberus.Hold)
    out["b"].release()
    # A fired cancel is final.
    with pytest.raises(cerberus.Interrupted):
        lock.acquire(wait=0, cancel=c1)
    c1.close()
    c2.close()


def test_close_interrupts_waiting_calls_and_frees_holds():
    c = cerberus.Client()
    name = uniq("close")
    holder = c.lock(name).acquire(wait=0)
    got = []

    def waiter():
        try:
            c.lock(name).acquire(wait=None)
        except cerberus.Error as e:
            got.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: c._core.inflight, what="the waiting call")
    c.close()
    t.join(10)
    assert not t.is_alive()
    assert got and isinstance(got[0], (cerberus.Interrupted, cerberus.InvalidArgument))
    assert holder.state is cerberus.State.FREE
    assert not holder.held


def test_gil_released_while_waiting(local_client):
    """Another Python thread runs while one waits in the library."""
    name = uniq("gil")
    holder = local_client.lock(name).acquire(wait=0)
    count = [0]
    stop = threading.Event()
    state = {}

    def spin():
        while not stop.is_set():
            count[0] += 1

    def waiter():
        try:
            state["hold"] = local_client.lock(name).acquire(wait=20)
        except cerberus.Error as e:
            state["err"] = e
        state["done"] = True

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: local_client._core.inflight, what="the waiter inside the library")
    s = threading.Thread(target=spin)
    s.start()
    before = count[0]
    wait_until(lambda: count[0] > before + 10000, timeout=10, what="the spinning thread")
    assert "done" not in state  # still waiting in C while Python ran
    holder.release()
    t.join(10)
    stop.set()
    s.join(10)
    assert isinstance(state.get("hold"), cerberus.Hold)
    state["hold"].release()


def test_lost_callback_exceptions_are_contained(local_client, caplog):
    hold = local_client.lock(uniq("cb")).acquire(wait=0)
    hold.on_lost(lambda h: None)
    hold.on_lost(None)
    hold.release()
    with pytest.raises(cerberus.InvalidArgument):
        hold.on_lost(lambda h: None)  # released: nothing to watch


def test_garbage_collected_hold_is_released(local_client):
    name = uniq("gc")
    local_client.lock(name).acquire(wait=0)  # dropped at once
    gc.collect()
    local_client.lock(name).acquire(wait=0).release()


def test_fork_child_gets_a_clear_error(local_client):
    lock = local_client.lock(uniq("fork"))
    hold = lock.acquire(wait=0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any cleanup
        try:
            msg = b"no error"
            try:
                lock.acquire(wait=0)
            except cerberus.InvalidArgument as e:
                msg = e.text.encode()
            try:
                hold.release()
                msg += b"\nrelease: no error"
            except cerberus.InvalidArgument as e:
                msg += b"\nrelease: " + e.text.encode()
            os.write(w, msg)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    text = b"".join(chunks).decode()
    acquire_text, release_text = text.split("\n", 1)
    assert "fork" in acquire_text, acquire_text
    assert "fork" in release_text, release_text
    # The parent's hold is untouched by the child.
    assert hold.state is cerberus.State.VALID
    hold.release()


def test_status_metrics_inspect_switch_on_local(local_client):
    st = local_client.status()
    assert st.current == "local"
    assert [e.name for e in st.engines] == ["local"]
    assert st.engines[0].active and st.engines[0].breaker is cerberus.Breaker.CLOSED
    text = local_client.metrics_text()
    assert 'cerberus_engine_active{engine="local"} 1' in text
    name = uniq("insp")
    assert local_client.inspect(name) == []
    with local_client.lock(name).acquire(wait=0) as hold:
        hs = local_client.inspect(name)
        assert len(hs) == 1 and hs[0].engine == "local" and not hs[0].waiting
        assert hs[0].fence == hold.fencing_token & ((1 << 48) - 1)
    with pytest.raises(cerberus.InvalidArgument) as e:
        local_client.switch("nope")
    assert "configured: local" in e.value.text
    assert local_client.switch("auto") == "local"
    assert local_client.switch() == "local"


def test_log_handler_routes_lines():
    lines = []
    cerberus.set_log_handler(lambda lv, line: lines.append((lv, line)), cerberus.LogLevel.DEBUG)
    try:
        with cerberus.Client():
            pass
    finally:
        cerberus.set_log_handler(None)
    assert all(isinstance(lv, cerberus.LogLevel) for lv, _ in lines)


def test_status_codes_and_exception_classes():
    assert [s.name for s in cerberus.Status][:3] == ["OK", "BUSY", "TIMEOUT"]
    for status, cls in [(1, cerberus.Busy), (2, cerberus.Timeout), (3, cerberus.Interrupted),
                        (4, cerberus.NotOwner), (5, cerberus.Lost), (6, cerberus.Unavailable),
                        (7, cerberus.InvalidArgument), (8, cerberus.ConfigError),
                        (9, cerberus.OutOfMemory), (10, cerberus.ProtocolError),
                        (11, cerberus.IOFailure), (12, cerberus.Duplicate)]:
        e = cerberus.errors.error_for(status, "detail")
        assert type(e) is cls and isinstance(e, cerberus.Error)
        assert e.status == status and e.text == "detail"
    assert isinstance(cerberus.errors.error_for(2), TimeoutError)
    unknown = cerberus.errors.error_for(99, "x")
    assert type(unknown) is cerberus.Error and unknown.name == "UNKNOWN"


def test_exceptions_pickle():
    """Across processes (multiprocessing, concurrent.futures) an exception
    keeps its class, status, text and extra attributes."""
    errs = [cerberus.errors.error_for(s, "detail %d" % s, "acquire \"x\"") for s in range(1, 13)]
    errs.append(cerberus.errors.error_for(99, "from a later library"))
    errs.append(cerberus.Duplicate(cerberus.Status.DUPLICATE, "done", "guard s",
                                   result=b"\x00stored"))
    errs[5].holders = ["partial"]
    for e in errs:
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e)
        assert (e2.status, e2.name, e2.text, e2.what, str(e2)) == \
            (e.status, e.name, e.text, e.what, str(e))
        assert e2.__dict__ == e.__dict__
    assert pickle.loads(pickle.dumps(errs[-1])).result == b"\x00stored"
    assert pickle.loads(pickle.dumps(errs[5])).holders == ["partial"]


def test_timeout_is_prompt(local_client):
    name = uniq("prompt")
    with local_client.lock(name).acquire(wait=0):
        t0 = time.monotonic()
        with pytest.raises(cerberus.Timeout):
            local_client.lock(name).acquire(wait=0.2)
        assert 0.15 < time.monotonic() - t0 < 5


def test_asyncio_many_waiters_do_not_starve_the_release():
    """More tasks wait for one name than the client has threads for asyncio
    acquisitions: every wait holds one, and the holder's release (on
    threads of its own) must still run."""
    import asyncio

    name = uniq("starve")
    done = []

    async def main(client):
        async def task(i):
            async with client.alock(name, wait=30):
                await asyncio.sleep(0)
                done.append(i)

        await asyncio.wait_for(asyncio.gather(*(task(i) for i in range(8))), 60)

    with cerberus.Client(async_threads=3) as c:
        asyncio.run(main(c))
    assert sorted(done) == list(range(8))
    with pytest.raises(ValueError):
        cerberus.Client(async_threads=0)
