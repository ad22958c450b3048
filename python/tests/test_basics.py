"""The binding on the in-process local engine (no server): loading, errors,
holds and their lifetimes, cancels, closing, fork, threads and the GIL."""

from __future__ import annotations

import asyncio
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
    """A callback that raises is logged and goes no further: the hold, the
    client and the next callback are unharmed."""
    hold = local_client.lock(uniq("cb")).acquire(wait=0)
    hold.on_lost(lambda h: None)
    hold.on_lost(None)
    hold.release()
    with pytest.raises(cerberus.InvalidArgument):
        hold.on_lost(lambda h: None)  # released: nothing to watch
    # A lease of 100 ms never renewed: the hold is lost, its callback raises.
    seen = []
    lost = local_client.lock(uniq("cb-lost"), lease_ms=100, renew=False).acquire(wait=0)
    lost.on_lost(lambda h: (seen.append(h.state), 1 / 0))
    wait_until(lambda: any("exception in a callback" in r.getMessage() for r in caplog.records),
               what="the raising callback logged")
    assert seen == [cerberus.State.LOST]
    rec = next(r for r in caplog.records if "exception in a callback" in r.getMessage())
    assert rec.exc_info and rec.exc_info[0] is ZeroDivisionError
    with pytest.raises(cerberus.Lost):
        lost.release()
    local_client.lock(uniq("after"), wait=1).acquire().release()  # still serving


def test_garbage_collected_hold_is_released(local_client):
    name = uniq("gc")
    local_client.lock(name).acquire(wait=0)  # dropped at once: released on the reaper
    gc.collect()
    local_client.lock(name).acquire(wait=10).release()


def test_failed_releases_are_logged(local_client, caplog):
    """A release that fails where nobody can be told (Hold.close, a hold
    collected while held) is logged as a warning on "cerberus"."""
    import logging
    caplog.set_level(logging.WARNING, logger="cerberus")
    a = local_client.lock(uniq("log-a"), lease_ms=100, renew=False).acquire(wait=0)
    b = local_client.lock(uniq("log-b"), lease_ms=100, renew=False).acquire(wait=0)
    wait_until(lambda: a.state is cerberus.State.LOST and b.state is cerberus.State.LOST,
               what="both holds lost")
    a.close()  # the release says LOST: logged, not raised
    assert any("release of %r failed" % a.name in r.getMessage() and "LOST" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    name = b.name
    b = None  # collected while held: the reaper's release fails (LOST)
    gc.collect()
    assert cerberus.client._reaper.sync()
    assert any(('a hold "%s" was freed while still held' % name) in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_finalizers_never_take_the_client_mutex(local_client):
    """__del__ may run on any thread, inside any code: while the client's
    mutex is held (by close, say), dropping a hold, a lock, a cancel or an
    attempt must return at once, and the hold is released afterwards."""
    name = uniq("fin")
    hold = local_client.lock(name).acquire(wait=0)
    lock = local_client.lock(uniq("fin-lock"))
    cancel = cerberus.Cancel()
    attempt = local_client.guard(uniq("fin-guard"), "k").__enter__()
    objs = [hold, lock, cancel, attempt]
    del hold, lock, cancel, attempt
    dropped = threading.Event()

    def drop():
        objs.clear()  # the last references: __del__ runs here
        gc.collect()
        dropped.set()

    core = local_client._core
    with core.mu:  # as close holds it
        t = threading.Thread(target=drop)
        t.start()
        finished = dropped.wait(5)
    t.join(10)
    assert finished, "a finalizer waited for the client's mutex"
    assert cerberus.client._reaper.sync()
    local_client.lock(name).acquire(wait=0).release()  # released by the reaper


def test_close_fires_cancels_holding_the_mutex(monkeypatch):
    """close() fires the cancels of the calls in flight while it holds the
    client's mutex: a call leaves the table under it before its cancel is
    given back or freed, so no fire can reach a freed cancel."""
    c = cerberus.Client()
    name = uniq("closefire")
    holder = c.lock(name).acquire(wait=0)
    core = c._core
    real = cerberus.client.F
    fires = []

    class Fast:
        def __getattr__(self, attr):
            return getattr(real, attr)

        @staticmethod
        def cerb_cancel_fire(ptr):
            fires.append((core.mu._is_owned(), ptr in core.inflight.values()))
            real.cerb_cancel_fire(ptr)

    mine = [cerberus.Cancel() for _ in range(3)]
    out = []

    def waiter(cancel):
        try:
            c.lock(name).acquire(wait=None, cancel=cancel)
        except cerberus.Error as e:
            out.append(e)

    ts = [threading.Thread(target=waiter, args=(k,)) for k in mine + [None]]
    for t in ts:
        t.start()
    wait_until(lambda: len(core.inflight) == 4, what="four waiting calls")
    monkeypatch.setattr(cerberus.client, "F", Fast())
    c.close()
    monkeypatch.undo()
    for t in ts:
        t.join(10)
    assert len(fires) == 4 and all(locked and alive for locked, alive in fires), fires
    assert len(out) == 4 and all(isinstance(e, cerberus.Interrupted) for e in out), out
    assert not holder.held
    for k in mine:
        k.close()


def test_close_while_calls_end_on_their_own():
    """Calls ending by themselves (their own cancel fired, their wait run
    out) while the client closes: nothing freed is touched (ASan would
    report it), every call returns, every hold is done."""
    for round_ in range(5):
        c = cerberus.Client()
        name = uniq("closerace")
        holder = c.lock(name).acquire(wait=0)
        cancels = [cerberus.Cancel() for _ in range(6)]
        results = []
        started = threading.Barrier(7)

        def waiter(i):
            started.wait()
            try:
                if i % 2:
                    c.lock(name).acquire(wait=0.001 * (i + round_), cancel=cancels[i])
                else:
                    c.lock(name).acquire(wait=None, cancel=cancels[i])
            except cerberus.Error as e:
                results.append(type(e))
            finally:
                cancels[i].close()  # a user's close right after the call

        ts = [threading.Thread(target=waiter, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        started.wait()
        for k in cancels[::3]:
            k.fire()
        c.close()
        for t in ts:
            t.join(10)
        assert not any(t.is_alive() for t in ts)
        assert len(results) == 6
        assert not holder.held


def test_a_child_being_freed_is_still_listed(local_client, monkeypatch):
    """A hold leaves the client's table only once freed: a close that
    starts during the free finds it there and waits for it (no call may run
    during cerb_client_close)."""
    core = local_client._core
    seen = []
    real = cerberus.client._free_hold

    def free(h):
        seen.append(id(h) in core.children)
        return real(h)

    monkeypatch.setattr(cerberus.client, "_free_hold", free)
    name = uniq("listed")
    local_client.lock(name).acquire(wait=0)  # collected: the reaper frees it
    assert cerberus.client._reaper.sync()
    assert seen == [True]
    assert not core.children  # and then it is gone from the table
    local_client.lock(name).acquire(wait=0).release()


def test_close_while_holds_are_released_and_collected():
    """Releases on other threads and holds freed by the reaper, racing a
    close: no free may run during cerb_client_close (ASan would see it),
    and every hold ends up done."""
    for round_ in range(20):
        c = cerberus.Client()
        holds = [c.lock(uniq("r%d" % i)).acquire(wait=0) for i in range(16)]
        mine, dropped = holds[::2], holds[1::2]
        del holds
        go = threading.Barrier(3)

        def releaser():
            go.wait()
            for h in mine:
                h.close()

        def dropper():
            go.wait()
            dropped.clear()  # their finalizers hand them to the reaper

        ts = [threading.Thread(target=releaser), threading.Thread(target=dropper)]
        for t in ts:
            t.start()
        go.wait()
        if round_ % 2:
            assert cerberus.client._reaper.sync()
        c.close()
        for t in ts:
            t.join(10)
        assert cerberus.client._reaper.sync()
        assert not any(h.held for h in mine)


def test_with_lock_releases_when_the_block_raises(local_client):
    name = uniq("raise")
    lock = local_client.lock(name, wait=1)
    with pytest.raises(RuntimeError):
        with lock as hold:
            assert hold.state is cerberus.State.VALID
            raise RuntimeError("the critical section failed")
    assert hold.state is cerberus.State.FREE and not hold.held
    with pytest.raises(KeyError):
        with hold:  # a hold as its own context manager, too
            raise KeyError("x")
    local_client.lock(name).acquire(wait=0).release()


def test_nul_characters_are_refused(local_client, tmp_path):
    """C reads a string up to its first NUL: "a\0b" must not lock "a"."""
    for bad in ("a\0b", "\0"):
        with pytest.raises(cerberus.InvalidArgument) as e:
            local_client.lock(bad)
        assert "NUL" in e.value.text
        with pytest.raises(cerberus.InvalidArgument):
            local_client.alock(bad)
        with pytest.raises(cerberus.InvalidArgument):
            local_client.guard(bad, "key")
        with pytest.raises(cerberus.InvalidArgument):
            local_client.inspect(bad)
        with pytest.raises(cerberus.InvalidArgument):
            local_client.switch(bad)
    with pytest.raises(cerberus.InvalidArgument):
        cerberus.Client(text='engines = ("local");\0 this part would be ignored')
    with pytest.raises(cerberus.InvalidArgument):
        cerberus.Client(str(tmp_path / "a.cfg") + "\0.txt")
    with pytest.raises(cerberus.InvalidArgument):
        cerberus.init_stores(text='engines = ("local");\0')
    with pytest.raises(cerberus.InvalidArgument):
        local_client.lock("\udc80")  # not encodable: no silent replacement either
    # A guard key is bytes with a length: a NUL there is data.
    with local_client.guard(uniq("nulkey"), b"a\0b") as a:
        a.result = b"x"
    with pytest.raises(cerberus.Duplicate):
        with local_client.guard(a.scope, b"a\0b"):
            pass


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
        with cerberus.Client() as c:
            name = uniq("logged")
            hold = c.lock(name, lease_ms=100, renew=False).acquire(wait=0)  # lost: WARN
            wait_until(lambda: any(name in line for _, line in lines), what="the lost line")
            assert hold.state is cerberus.State.LOST
    finally:
        cerberus.set_log_handler(None)
    assert lines and all(isinstance(lv, cerberus.LogLevel) for lv, _ in lines)
    assert any(lv == cerberus.LogLevel.WARN and ("lock \"%s\" lost" % name) in line
               for lv, line in lines), lines


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
    # Codes a later library may add degrade to plain ints, never ValueError.
    from cerberus.client import _enum
    assert _enum(cerberus.State, 2) is cerberus.State.SUSPECT
    assert _enum(cerberus.State, 9) == 9 and _enum(cerberus.Breaker, 17) == 17


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


# ------------------------------------------------------------------ asyncio

def test_asyncio_cancel_of_a_queued_acquisition_is_immediate():
    """Every thread for asyncio waits is taken by a wait without limit: an
    acquisition queued behind it and then cancelled ends at once (it never
    runs), it does not wait for a thread."""
    name = uniq("q")

    async def main(client, holder):
        waiting = asyncio.create_task(client.alock(name, wait=None).__aenter__())
        await until(lambda: len(client._core.inflight) == 1, "the wait on the only thread")
        queued = asyncio.create_task(client.alock(uniq("other"), wait=None).__aenter__())
        await until(lambda: client._core._pools["wait"].q.qsize() == 1, "the queued job")
        queued.cancel()
        done, _ = await asyncio.wait({queued}, timeout=5)
        ok = queued in done
        holder.release()  # lets everything end whatever happened
        hold = await waiting
        await hold.release_async()
        if not ok:
            await asyncio.wait({queued}, timeout=30)
        return ok, queued

    with cerberus.Client(async_threads=1) as c:
        holder = c.lock(name).acquire(wait=0)
        ok, queued = asyncio.run(main(c, holder))
    assert ok, "a cancelled acquisition still queued waited for a thread"
    assert queued.cancelled()


def test_asyncio_try_and_release_never_queue_behind_waits():
    """With every wait thread taken by a wait for a name this task holds, a
    nested try (wait=0) and the releases still run: they have threads of
    their own."""
    outer, inner = uniq("outer"), uniq("inner")

    async def main(client):
        async with client.alock(outer, wait=0):
            other = asyncio.create_task(client.alock(outer, wait=None).__aenter__())
            await until(lambda: len(client._core.inflight) == 1, "the other task's wait")
            nested = asyncio.create_task(client.alock(inner, wait=0).__aenter__())
            done, _ = await asyncio.wait({nested}, timeout=5)
            if nested in done:
                await (await nested).release_async()
        hold = await asyncio.wait_for(other, 30)  # the outer release let it in
        await hold.release_async()
        if nested not in done:
            await asyncio.wait({nested}, timeout=30)
        return nested in done

    with cerberus.Client(async_threads=1) as c:
        assert asyncio.run(main(c)), "a try queued behind a wait for a lock its task holds"


def test_asyncio_cancelled_while_the_client_closes():
    """A grant lands, the task is cancelled and the client closes before the
    task runs again: the close released the hold, and the task ends with
    CancelledError, not with the closed client's InvalidArgument."""
    name = uniq("aclose")

    def granted(core):
        return any(h.what == 'a hold "%s"' % name for h in list(core.children.values()))

    async def main(client, holder):
        core = client._core
        task = asyncio.create_task(client.alock(name, wait=None).__aenter__())
        await until(lambda: core.inflight, "the wait")
        holder.release()
        # Without yielding to the loop: the task cannot see its result yet.
        end = time.monotonic() + 10
        while not granted(core) or core.inflight:
            assert time.monotonic() < end, "no grant"
            time.sleep(0.002)
        task.cancel()
        client.close()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        except BaseException as e:  # noqa: B902
            return repr(e)
        return "granted"

    c = cerberus.Client()
    holder = c.lock(name).acquire(wait=0)
    got = asyncio.run(main(c, holder))
    assert got == "cancelled", got


def test_pool_submit_races_stop():
    """A job the pool accepted always runs, however stop() interleaves."""
    from cerberus.client import _Job, _Pool
    for _ in range(200):
        pool = _Pool(2, "test-pool")
        ran = []
        jobs = []
        go = threading.Barrier(2)

        def submitter():
            go.wait()
            for i in range(5):
                job = _Job(ran.append, (i,))
                job.done = threading.Lock()
                job.done.acquire()
                try:
                    pool.submit(job)
                except cerberus.InvalidArgument:
                    return
                jobs.append(job)

        t = threading.Thread(target=submitter)
        t.start()
        go.wait()
        pool.stop()
        t.join(10)
        for job in jobs:
            assert job.done.acquire(timeout=10), "an accepted job never ran"
        assert len(ran) == len(jobs)


async def until(pred, what, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            pytest.fail("timed out waiting for " + what)
        await asyncio.sleep(0.005)
