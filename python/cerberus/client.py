"""client.py — Client, Lock, Hold and Cancel over the C handles.

Lifetimes. Every C handle lives in a :class:`_Handle` that counts the calls
using it; freeing it (``dispose``) first refuses new calls, then waits for
the running ones to return, so no call ever sees freed memory, whichever
thread frees. A client keeps a table of its children's handles: closing it
fires the cancel of every blocking call in flight (an acquire waiting
without limit returns at once with Interrupted), waits for those calls to
return, frees every hold, guard attempt and lock still alive, and only then
closes the C client. A child keeps its client alive (it refers to it), so
garbage collection never closes a client under a hold; each object frees
its handle when it is collected, and whatever is left is freed at exit.

Fork. A client belongs to the process that opened it. In a child made by
``fork()`` a call on a lock or a client goes to the library, which refuses
it (InvalidArgument, with a text that names the fork); a hold, guard
attempt or cancel of the parent is refused here, before C is reached, and
nothing of the parent's is freed or released by the child, at exit either.

Threads. Every call may be made from any thread; blocking calls release
the GIL (ctypes does), so other threads run while one waits. A hold
belongs to an object, not a thread: any thread may release it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import os
import queue
import threading
import weakref
from ctypes import byref, c_size_t, c_void_p, POINTER
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, TypeVar,
                    Union)
import enum

from . import _callbacks, _lib
from .errors import (Error, InvalidArgument, NotOwner, Status, check, error_for,
                     last_error)

if TYPE_CHECKING:
    from .guard import GuardContext

L = _lib.lib  # calls that may wait: the GIL is released
F = _lib.fast  # calls that never wait: the GIL is kept
T = TypeVar("T")

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class State(enum.IntEnum):
    """How a hold stands (``enum cerb_lock_state``)."""

    FREE = 0     #: not held: released, or never granted
    VALID = 1    #: held, and the lease is known to be in force
    SUSPECT = 2  #: held, but a renewal failed or the session is down
    LOST = 3     #: held no more: the lease passed, the session expired, the key is gone


class Breaker(enum.IntEnum):
    """An engine's circuit breaker (``cerb_breaker_state``)."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2
    DISABLED = 3
    FORCED_OPEN = 4


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


#: "Use the lock's own default wait" (the ``wait`` given to ``client.lock``).
DEFAULT: Any = _Default()


def wait_ms(wait: Optional[float]) -> int:
    """Seconds (None: no limit, 0: one try) to the library's milliseconds."""
    if wait is None:
        return -1
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise TypeError("wait must be a number of seconds or None, not %r" % (wait,))
    if wait < 0 or math.isnan(wait):
        raise ValueError("wait must be >= 0 seconds or None (no limit), not %r" % (wait,))
    if math.isinf(wait):
        return -1
    return int(math.ceil(wait * 1000))


def _text(b: Optional[bytes]) -> str:
    return (b or b"").decode("utf-8", "replace")


def _closed(what: str) -> Error:
    return InvalidArgument(Status.EINVAL, "%s is closed" % what)


# The current process's id, kept up to date by a fork hook (cheaper than a
# getpid() per call): a handle made under another pid is the parent's.
_PID = [os.getpid()]


def _forked(pid: int) -> bool:
    return pid != _PID[0]


class _Handle:
    """A C pointer, the count of calls using it, and how to free it."""

    __slots__ = ("ptr", "what", "pid", "cb_key", "_free", "_mu", "_users", "_gone",
                 "_drained", "__weakref__")

    def __init__(self, ptr: int, free: Callable[["_Handle"], Any], what: str) -> None:
        self.ptr = ptr
        self.what = what
        self.pid = _PID[0]
        self.cb_key: Optional[int] = None  # a callback's entry (_callbacks)
        self._free = free
        self._mu = threading.Lock()
        self._users = 0
        self._gone = False
        self._drained: Optional[threading.Event] = None

    def enter(self) -> int:
        """Count one call in; raises when the handle is freed."""
        with self._mu:
            if self._gone:
                raise _closed(self.what)
            self._users += 1
        return self.ptr

    def leave(self) -> None:
        with self._mu:
            self._users -= 1
            if self._users == 0 and self._drained is not None:
                self._drained.set()

    @property
    def gone(self) -> bool:
        return self._gone

    def dispose(self) -> Any:
        """Refuse new calls, wait for running ones, free. Returns the free
        function's result for the call that freed, None otherwise (freed
        before, or a parent's handle in a forked child: left alone)."""
        with self._mu:
            if self._gone:
                return None
            self._gone = True
            drained = None
            if self._users:
                drained = self._drained = threading.Event()
        if drained is not None:
            drained.wait()
        if _forked(self.pid):
            return None
        _callbacks.unregister(self.cb_key)
        return self._free(self)

    def after_fork(self) -> None:
        """In a forked child: a fresh mutex (the parent's may have been held)."""
        self._mu = threading.Lock()
        self._users = 0


# Every client's core, for the fork hook.
_cores: "weakref.WeakSet[_Core]" = weakref.WeakSet()


class _Core:
    """What a client and its children share: the C client, the table of
    children's handles, the blocking calls in flight and a pool of cancels
    (a blocking call given no cancel takes one, so that closing the client
    can end it)."""

    def __init__(self, ptr: int) -> None:
        self.handle = _Handle(ptr, lambda h: L.cerb_client_close(h.ptr), "the client")
        self.pid = _PID[0]
        self.mu = threading.Lock()
        self.closing = False
        self.children: Dict[int, _Handle] = {}
        self.inflight: Dict[int, int] = {}  # call id -> cancel pointer
        self.drained: Optional[threading.Event] = None
        self.pool: List[int] = []
        self.calls = itertools.count(1)
        self.switch_key: Optional[int] = None
        self.async_threads = 64
        self._workers: Dict[str, "_Workers"] = {}
        _cores.add(self)

    def workers(self, kind: str) -> "_Workers":
        """The threads that run asyncio's blocking calls: "acquire" for
        acquisitions (up to async_threads wait at once), "release" for the
        releases, apart, so that a release never queues behind waits for
        the very lock it releases."""
        w = self._workers.get(kind)
        if w is None:
            with self.mu:
                if self.closing:
                    raise _closed("the client")
                w = self._workers.get(kind)
                if w is None:
                    most = self.async_threads if kind == "acquire" else 4
                    w = self._workers[kind] = _Workers(most, "cerberus-" + kind)
        return w

    # -- children
    def adopt(self, h: _Handle) -> None:
        with self.mu:
            if self.closing:
                raise _closed("the client")
            self.children[id(h)] = h

    def dispose_child(self, h: _Handle) -> Any:
        with self.mu:
            self.children.pop(id(h), None)
        return h.dispose()

    # -- cancels
    def take_cancel(self) -> int:
        """An unfired cancel from the pool, or a new one."""
        with self.mu:
            if self.pool:
                return self.pool.pop()
        out = c_void_p()
        check(F.cerb_cancel_new(byref(out)), "cerb_cancel_new")
        return out.value

    def give_cancel(self, ptr: int, fired: bool) -> None:
        """Back to the pool, or freed when it was fired (firing is final)
        or the client is closing."""
        with self.mu:
            if not fired and not self.closing:
                self.pool.append(ptr)
                return
        if not _forked(self.pid):
            F.cerb_cancel_free(ptr)

    # -- blocking calls
    def begin_call(self, cancel_ptr: int) -> int:
        """Register a blocking call using @cancel_ptr; returns its id."""
        call = next(self.calls)
        with self.mu:
            if self.closing:
                raise _closed("the client")
            self.inflight[call] = cancel_ptr
        return call

    def end_call(self, call: int) -> None:
        with self.mu:
            del self.inflight[call]
            if not self.inflight and self.drained is not None:
                self.drained.set()

    # -- closing
    def close(self) -> None:
        with self.mu:
            if self.closing:
                return
            self.closing = True
            pending = list(self.inflight.values())
            drained = None
            if pending:
                drained = self.drained = threading.Event()
        forked = _forked(self.pid)
        if not forked and drained is not None:
            for c in pending:
                F.cerb_cancel_fire(c)
            drained.wait()
        with self.mu:
            children = list(self.children.values())
            self.children.clear()
            pool, self.pool = self.pool, []
        # Holds and guard attempts before the locks they came from; each
        # frees (and releases) what is left, then the client goes.
        order = {"a hold": 0, "a guard attempt": 1, "a lock": 2}
        children.sort(key=lambda h: order.get(h.what.split(" \"")[0], 3))
        for h in children:
            try:
                h.dispose()
            except Exception:  # noqa: BLE001 - closing goes on regardless
                _callbacks.log.exception("cerberus: freeing %s while closing", h.what)
        if not forked:
            for c in pool:
                F.cerb_cancel_free(c)
        _callbacks.unregister(self.switch_key)
        for w in list(self._workers.values()):
            w.stop()
        self.handle.dispose()

    def after_fork(self) -> None:
        self.mu = threading.Lock()
        self.handle.after_fork()
        for h in self.children.values():
            h.after_fork()
        self.inflight.clear()
        self.pool = []  # the parent's: never used nor freed here
        self._workers = {}  # their threads stayed in the parent


def _after_fork_in_child() -> None:
    _PID[0] = os.getpid()
    for core in list(_cores):
        core.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _blocking_call(core: _Core, cancel: Optional["Cancel"],
                   call: Callable[[int], Tuple[int, Any]]) -> Tuple[int, Any, str]:
    """Run @call(cancel pointer) -> (status, value) as a blocking call of
    @core: with the user's cancel, or one from the pool; registered in
    flight so that a close fires it. Returns (status, value, error text);
    the text is the cancel's (else cerb_last_error()) when status != 0."""
    if cancel is not None:
        cptr = cancel._enter()
    else:
        cptr = core.take_cancel()
    try:
        cid = core.begin_call(cptr)
        try:
            st, value = call(cptr)
            text = (_text(F.cerb_cancel_error(cptr)) or last_error()) if st else ""
        finally:
            core.end_call(cid)
    finally:
        if cancel is not None:
            cancel._h.leave()
        else:
            core.give_cancel(cptr, False)
    return st, value, text


# ------------------------------------------------------------------ Cancel

def _foreign_error(what: str, pid: int) -> Error:
    return InvalidArgument(
        Status.EINVAL,
        "%s was made in process %d, before fork(): its client, threads and holds are the "
        "parent's; open a new Client in the child (this is process %d)" % (what, pid, _PID[0]))


class Cancel:
    """Cancels one blocking call (``cerb_cancel``).

    Pass it to :meth:`Lock.acquire` (or :meth:`Client.guard`); :meth:`fire`
    it from any thread and that call ends with :class:`~cerberus.Interrupted`
    — after any grant that landed meanwhile has been released, so nothing
    is left on the server. Firing is final: a call given a fired cancel
    returns Interrupted at once. One cancel serves one call at a time; it
    may be reused after the call returned if it was not fired.
    """

    def __init__(self) -> None:
        out = c_void_p()
        check(F.cerb_cancel_new(byref(out)), "cerb_cancel_new")
        self._h = _Handle(out.value, lambda h: F.cerb_cancel_free(h.ptr), "a cancel")

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None:
            h.dispose()

    def _enter(self) -> int:
        if _forked(self._h.pid):
            raise _foreign_error("this cancel", self._h.pid)
        return self._h.enter()

    def fire(self) -> None:
        """End the call using this cancel with Interrupted (from any thread;
        never waits on the network). Firing a closed cancel does nothing."""
        try:
            ptr = self._enter()
        except InvalidArgument:
            return
        try:
            F.cerb_cancel_fire(ptr)
        finally:
            self._h.leave()

    @property
    def fired(self) -> bool:
        """Whether :meth:`fire` was called."""
        try:
            ptr = self._enter()
        except InvalidArgument:
            return False
        try:
            return bool(F.cerb_cancel_fired(ptr))
        finally:
            self._h.leave()

    @property
    def error(self) -> str:
        """The error text of the last call this cancel was passed to (``""``
        when it succeeded); readable from any thread."""
        ptr = self._enter()
        try:
            return _text(F.cerb_cancel_error(ptr))
        finally:
            self._h.leave()

    def close(self) -> None:
        """Free the cancel now (it is freed when collected otherwise); it
        waits for a call using it to return."""
        self._h.dispose()

    def __enter__(self) -> "Cancel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -------------------------------------------------------------------- Hold

class Hold:
    """One grant of a lock, owned by this object rather than by a thread
    (``cerb_hold``).

    Any thread may :meth:`release` it or read its :attr:`state`. It is a
    context manager (``with hold:`` releases at the end) and an
    asynchronous one (``async with hold:`` releases off the event loop).
    Released or not, it is freed when it is garbage collected (a hold still
    held is released then) or when its client closes.
    """

    __slots__ = ("_client", "_core", "_h", "_name", "_token", "_error", "__weakref__")

    def __init__(self, client: "Client", ptr: int, name: str) -> None:
        self._client = client
        self._core = client._core
        self._token: int = F.cerb_hold_fencing_token(ptr)
        self._name = name
        self._error = ""
        self._h = _Handle(ptr, lambda h: L.cerb_hold_free(h.ptr), 'a hold "%s"' % name)
        try:
            self._core.adopt(self._h)
        except Error:  # the client is closing: give the grant back
            self._h.dispose()
            raise

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.gone:
            self._core.dispose_child(h)

    def _enter(self) -> int:
        if _forked(self._h.pid):
            raise _foreign_error("this hold", self._h.pid)
        return self._h.enter()

    @property
    def name(self) -> str:
        """The lock name this hold is for."""
        return self._name

    @property
    def fencing_token(self) -> int:
        """The fencing token of this grant (epoch in the high 16 bits, the
        engine's counter in the low 48); it stays readable after release.
        Pass it with every write to the resource, which refuses an older one."""
        return self._token

    @property
    def state(self) -> State:
        """:class:`State`: VALID, SUSPECT or LOST while held, FREE once
        released. Never blocks."""
        try:
            ptr = self._enter()
        except InvalidArgument:
            if _forked(self._h.pid):
                raise
            return State.FREE
        try:
            return State(F.cerb_hold_state(ptr))
        finally:
            self._h.leave()

    @property
    def held(self) -> bool:
        """True until the hold is released (even when it was lost: release it)."""
        return not self._h.gone

    @property
    def error(self) -> str:
        """The error text of the last call on this hold that failed (its
        release); ``""`` when none did."""
        return self._error

    def on_lost(self, callback: Optional[Callable[["Hold"], Any]]) -> None:
        """Call ``callback(hold)`` once if the hold is lost (the lease ran
        out unrenewed, the session expired, the key was deleted or taken).

        It runs on the client's callback thread, not the thread that
        acquired: keep it short, and hand work to your own thread or event
        loop (``loop.call_soon_threadsafe``). Exceptions it raises are
        logged on the ``cerberus`` logger. Set while the hold is already
        lost, it is called at once. ``None`` removes it. Not called once
        the hold was released.
        """
        ptr = self._enter()
        try:
            old = self._h.cb_key
            if callback is None:
                st = L.cerb_hold_on_lost(ptr, _callbacks.HOLD_LOST_NONE, None)
                key = None
            else:
                ref = weakref.ref(self)

                def fire() -> None:
                    hold = ref()
                    if hold is not None:
                        callback(hold)

                key = _callbacks.register(fire)
                st = L.cerb_hold_on_lost(ptr, _callbacks.HOLD_LOST, key)
            text = last_error() if st else ""
            if st == 0:
                self._h.cb_key = key
                _callbacks.unregister(old)
            else:
                _callbacks.unregister(key)
        finally:
            self._h.leave()
        check(st, "on_lost", text)

    def release(self) -> None:
        """Release the hold on the server and free it; from any thread.

        Raises:
            NotOwner: it was already released.
            Lost: it had been lost (the section may have overlapped another
                holder: the fencing token protects the resource).
            IOFailure, Timeout, ...: the release was not confirmed; the
                lease then expires by itself. The hold is freed either way.
            InvalidArgument: a hold of the parent, in a forked child.
        """
        if _forked(self._h.pid):
            raise _foreign_error("this hold", self._h.pid)
        try:
            ptr = self._h.enter()
        except InvalidArgument:
            raise NotOwner(Status.NOT_OWNER, 'the hold of "%s" was already released'
                           % self._name, "release") from None
        try:
            st = L.cerb_hold_release(ptr)
            if st != 0:
                self._error = _text(F.cerb_hold_error(ptr))
        finally:
            self._h.leave()
        # Released (or given up): its free touches no server.
        self._h._free = lambda h: F.cerb_hold_free_released(h.ptr)
        self._core.dispose_child(self._h)
        if st != 0:
            raise error_for(st, self._error, 'release "%s"' % self._name)

    async def release_async(self) -> None:
        """:meth:`release`, run in the event loop's executor so the loop
        does not wait on the network. A cancellation of the awaiting task
        does not stop the release: it completes, then CancelledError is
        raised."""
        await _settle(self._core.workers("release").submit(self.release))

    def close(self) -> None:
        """Release the hold if it is still held, ignoring errors, and free it."""
        if not self._h.gone:
            try:
                self.release()
            except Error:
                pass

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        _exit_release(self, et is not None)

    async def __aenter__(self) -> "Hold":
        return self

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self._h.gone:
            return
        await _settle(self._core.workers("release").submit(_exit_release, self,
                                                           et is not None))

    def __repr__(self) -> str:
        return "<cerberus.Hold %r token=%d %s>" % (self._name, self._token, self.state.name)


def _exit_release(hold: Hold, failing: bool) -> None:
    """Release at the end of a with block. A hold the block already
    released is fine. With an exception on its way out, a failing release
    is only logged, so the block's own exception is what propagates."""
    if hold._h.gone:
        return
    try:
        hold.release()
    except NotOwner:
        pass
    except Error:
        if not failing:
            raise
        _callbacks.log.warning("cerberus: release of %r failed while an exception "
                               "propagated: %s", hold.name, hold.error)


class _Workers:
    """Threads that run blocking calls for asyncio, leaner than an
    executor: a SimpleQueue of jobs, up to @most threads (started when a job
    finds none idle), and each result handed to the job's event loop with
    one call_soon_threadsafe. A result the loop can no longer take (it was
    closed) is a Hold released on a thread of its own: never an orphan."""

    def __init__(self, most: int, name: str) -> None:
        self.q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.most = most
        self.name = name
        self.mu = threading.Lock()
        self.threads = 0
        self.idle = 0
        self.stopped = False

    def submit(self, fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.mu:
            if self.stopped:
                raise _closed("the client")
            spawn = False
            if self.idle:
                self.idle -= 1
            elif self.threads < self.most:
                self.threads += 1
                spawn = True
        self.q.put((loop, fut, fn, args))
        if spawn:
            threading.Thread(target=self._run, name=self.name, daemon=True).start()
        return fut

    def _run(self) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            loop, fut, fn, args = job
            try:
                value, ok = fn(*args), True
            except BaseException as e:  # noqa: B902 - delivered to the awaiting task
                value, ok = e, False
            job = None
            try:
                loop.call_soon_threadsafe(_deliver, fut, ok, value)
            except RuntimeError:  # the loop is closed
                _undeliverable(value)
            value = None
            with self.mu:
                self.idle += 1

    def stop(self) -> None:
        with self.mu:
            self.stopped = True
            n, self.threads = self.threads, 0
        for _ in range(n):
            self.q.put(None)


def _deliver(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if fut.cancelled():
        _undeliverable(value)
    elif ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def _undeliverable(value: Any) -> None:
    if isinstance(value, Hold):
        threading.Thread(target=value.close, name="cerberus-release", daemon=True).start()


async def _settle(fut: "asyncio.Future[T]") -> T:
    """Await @fut, a call running on another thread, to its end even when
    the awaiting task is cancelled meanwhile (the call cannot be stopped,
    and its result must not be dropped); then re-raise the cancellation."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except BaseException:  # noqa: B902 - only its end matters here
                pass
        raise


async def _acquire_async(core: _Core, acquire: Callable[[Optional[int]], Hold]) -> Hold:
    """Run @acquire(cancel pointer) on the client's acquisition threads
    with a cancel from the pool. When the awaiting task is cancelled, the
    cancel is fired, the call's end is awaited, and a hold it returned
    anyway is released (off the loop); then the cancellation propagates."""
    cptr = core.take_cancel()
    fired = False
    try:
        fut = core.workers("acquire").submit(acquire, cptr)
    except BaseException:
        core.give_cancel(cptr, False)
        raise
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if not fut.done():
            F.cerb_cancel_fire(cptr)
            fired = True
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except BaseException:  # noqa: B902 - only its end matters here
                pass
        if not fut.cancelled() and fut.exception() is None:
            await _settle(core.workers("release").submit(fut.result().close))
        raise
    finally:
        if fut.done():
            core.give_cancel(cptr, fired)
        else:  # the loop is being torn down mid-call
            fut.add_done_callback(lambda _f: core.give_cancel(cptr, fired))


# -------------------------------------------------------------------- Lock

def _lock_opts(lease_ms: Optional[int], renew: Optional[bool],
               fair: Optional[bool]) -> "_lib.LockOpts":
    if lease_ms is not None and (isinstance(lease_ms, bool) or not isinstance(lease_ms, int)):
        raise TypeError("lease_ms must be an int of milliseconds or None, not %r" % (lease_ms,))
    return _lib.LockOpts(int(lease_ms or 0), -1 if renew is None else int(bool(renew)),
                         -1 if fair is None else int(bool(fair)))


def _new_lock(core: _Core, name: str, opts: "_lib.LockOpts") -> int:
    """cerb_lock_new(); the handle's pointer, or the library's error."""
    cptr = core.handle.enter()
    try:
        out = c_void_p()
        st = F.cerb_lock_new(cptr, name.encode("utf-8"), byref(opts), byref(out))
        text = last_error() if st else ""
    finally:
        core.handle.leave()
    check(st, 'lock "%s"' % name, text)
    return out.value


def _acquire(client: "Client", lptr: int, name: str, ms: int,
             cancel: Optional[Cancel], cancel_ptr: Optional[int] = None) -> Hold:
    """cerb_lock_acquire() as a blocking call of the client; the Hold is
    adopted while the call still counts as in flight, so a close waits for
    it and then frees it."""
    core = client._core

    def call(cptr: Optional[int]) -> Tuple[int, Optional[Hold]]:
        out = c_void_p()
        st = L.cerb_lock_acquire(lptr, ms, cptr, byref(out))
        return st, (Hold(client, out.value, name) if st == 0 else None)

    if cancel_ptr is not None:  # the async path's pooled cancel
        cid = core.begin_call(cancel_ptr)
        try:
            st, hold = call(cancel_ptr)
            text = (_text(F.cerb_cancel_error(cancel_ptr)) or last_error()) if st else ""
        finally:
            core.end_call(cid)
    elif ms == 0 and cancel is None:
        # One try is bounded by the operation timeouts: it needs no cancel
        # for a close to end it. A close waits for it all the same (the
        # lock handle counts it), and a grant that lands as the client
        # closes is given back (Hold refuses to be adopted).
        st, hold = call(None)
        text = last_error() if st else ""
    else:
        st, hold, text = _blocking_call(core, cancel, call)
    if hold is None:
        raise error_for(st, text, 'acquire "%s"' % name)
    return hold


class Lock:
    """A named lock of a client (``cerb_lock``): a factory of holds.

    ``lock.acquire()`` returns a :class:`Hold`; ``with lock as hold:``
    acquires for the block (with the lock's default wait) and releases at
    its end. One Lock may be used by many threads at once; holds are not
    reentrant: a second acquisition of the name waits for the first hold's
    release, in this process too.
    """

    def __init__(self, client: "Client", name: str, wait: Optional[float] = None,
                 lease_ms: Optional[int] = None, renew: Optional[bool] = None,
                 fair: Optional[bool] = None) -> None:
        if not isinstance(name, str):
            raise TypeError("a lock name is a str, not %s" % type(name).__name__)
        wait_ms(wait)  # validates early
        self._client = client
        self._core = client._core
        self._name = name
        self._wait = wait
        self._tls = threading.local()
        ptr = _new_lock(self._core, name, _lock_opts(lease_ms, renew, fair))
        self._h = _Handle(ptr, lambda h: F.cerb_lock_free(h.ptr), 'a lock "%s"' % name)
        try:
            self._core.adopt(self._h)
        except Error:
            F.cerb_lock_free(ptr)
            raise

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.gone:
            self._core.dispose_child(h)

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._name

    @property
    def client(self) -> "Client":
        """The client the lock belongs to."""
        return self._client

    def acquire(self, wait: Optional[float] = DEFAULT,
                cancel: Optional[Cancel] = None) -> Hold:
        """Acquire the name for a new :class:`Hold`.

        Args:
            wait: seconds to wait at most; ``None`` waits without limit, ``0``
                tries once. Default: the ``wait`` given to ``client.lock()``.
            cancel: a :class:`Cancel` no other call is using; firing it ends
                this call with Interrupted.

        Raises:
            Busy: ``wait=0`` and the name is held (in this process too).
            Timeout: the wait ran out.
            Interrupted: the cancel fired, or the client is closing.
            Unavailable, IOFailure, ...: no engine could serve.
            InvalidArgument: a bad handle; a client of the parent process
                in a forked child (the text says so).
        """
        ms = wait_ms(self._wait if wait is DEFAULT else wait)
        lptr = self._h.enter()
        try:
            return _acquire(self._client, lptr, self._name, ms, cancel)
        finally:
            self._h.leave()

    def _acquire_with(self, ms: int, cancel_ptr: Optional[int]) -> Hold:
        lptr = self._h.enter()
        try:
            return _acquire(self._client, lptr, self._name, ms, None, cancel_ptr)
        finally:
            self._h.leave()

    async def acquire_async(self, wait: Optional[float] = DEFAULT) -> Hold:
        """:meth:`acquire` for asyncio: the blocking call runs in the event
        loop's default executor, and cancelling the awaiting task fires a
        cancel that ends it. A grant that landed anyway is released (off the
        loop) before CancelledError reaches you, so no hold is left behind
        on the server."""
        ms = wait_ms(self._wait if wait is DEFAULT else wait)
        return await _acquire_async(self._core,
                                    functools.partial(self._acquire_with, ms))

    def close(self) -> None:
        """Free the lock handle (its holds stay valid)."""
        self._core.dispose_child(self._h)

    # -- the lock as a context manager (one hold per thread and block)
    def __enter__(self) -> Hold:
        hold = self.acquire()
        stack = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        stack.append(hold)
        return hold

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        _exit_release(self._tls.stack.pop(), et is not None)

    def __repr__(self) -> str:
        return "<cerberus.Lock %r>" % self._name


def _acquire_once(client: "Client", name: str, opts: "_lib.LockOpts", ms: int,
                  cancel_ptr: int) -> Hold:
    """A lock handle for one acquisition, made and freed on the calling
    (executor) thread: holds outlive their lock handle."""
    core = client._core
    core.handle.enter()  # the C client outlives the handle made here
    try:
        lptr = _new_lock(core, name, opts)
        try:
            return _acquire(client, lptr, name, ms, None, cancel_ptr)
        finally:
            F.cerb_lock_free(lptr)
    finally:
        core.handle.leave()


class _AsyncLock:
    """What :meth:`Client.alock` returns: ``async with`` acquires one hold
    off the event loop and releases it at the end."""

    def __init__(self, client: "Client", name: str, wait: Optional[float],
                 lease_ms: Optional[int], renew: Optional[bool], fair: Optional[bool]) -> None:
        if not isinstance(name, str):
            raise TypeError("a lock name is a str, not %s" % type(name).__name__)
        self._client = client
        self._name = name
        self._ms = wait_ms(wait)
        self._opts = _lock_opts(lease_ms, renew, fair)
        self._hold: Optional[Hold] = None

    async def __aenter__(self) -> Hold:
        if self._hold is not None:
            raise RuntimeError("this alock() is already entered; call client.alock() again")
        self._hold = await _acquire_async(
            self._client._core,
            functools.partial(_acquire_once, self._client, self._name, self._opts, self._ms))
        return self._hold

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            await hold.__aexit__(et, ev, tb)


# ------------------------------------------------------------------ Client

@dataclass(frozen=True)
class EngineStatus:
    """Health and counters of one configured engine (``cerb_engine_info``)."""

    name: str
    active: bool
    breaker: Breaker
    last_probe_us: int
    acquires: int
    failures: int
    lost: int
    acquire_calls: int
    wakeups: int
    handoffs: int
    breaker_transitions: int
    switches: int
    epoch: int
    wanted: bool
    guard_begins: int
    guard_duplicates: int
    guard_busy: int
    guard_degraded: int
    gate_questions: int
    closed_epoch: int


@dataclass(frozen=True)
class ClientStatus:
    """What :meth:`Client.status` returns: the current engine and every
    configured engine in configuration order."""

    current: str
    engines: List[EngineStatus]


@dataclass(frozen=True)
class Holder:
    """One entry of :meth:`Client.inspect`: the holder of a name on one
    engine (``waiting`` False), or one of its waiters, in queue order."""

    engine: str
    owner: str
    waiting: bool
    fence: int
    ttl_ms: int
    detail: str


class Client:
    """A connection to the configured engines (``cerb_client``).

    Args:
        path: a configuration file (``cerberus.cfg(5)``).
        text: the configuration as text, instead of a file.
        async_threads: how many asyncio acquisitions may wait at once
            (each waits on a thread of the client's; more queue for one).

    With neither, the built-in defaults: the in-process ``local`` engine,
    handy in tests. Open one client per process and share it between
    threads and tasks. Use it as a context manager, or call :meth:`close`.

    Raises:
        ConfigError: a bad file or text, with ``file:line: message``.
        Unavailable: no configured engine could be opened.
    """

    def __init__(self, path: Optional[PathLike] = None, *, text: Optional[str] = None,
                 async_threads: int = 64) -> None:
        if path is not None and text is not None:
            raise ValueError("give a configuration path or its text, not both")
        if isinstance(async_threads, bool) or not isinstance(async_threads, int) \
                or async_threads < 1:
            raise ValueError("async_threads must be a positive int, not %r" % (async_threads,))
        out = c_void_p()
        if text is not None:
            st = L.cerb_client_open_string(byref(out), text.encode("utf-8"))
        else:
            st = L.cerb_client_open(byref(out), None if path is None else os.fsencode(path))
        check(st, "open")
        self._core = _Core(out.value)
        self._core.async_threads = async_threads
        self._fin = weakref.finalize(self, self._core.close)

    # -- lifetime
    def close(self) -> None:
        """Close the client: blocking calls in flight end with Interrupted,
        every hold still held is released, every handle freed. Idempotent."""
        self._fin()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._core.closing

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _enter(self) -> int:
        return self._core.handle.enter()

    def _leave(self) -> None:
        self._core.handle.leave()

    # -- locks
    def lock(self, name: str, wait: Optional[float] = None, lease_ms: Optional[int] = None,
             *, renew: Optional[bool] = None, fair: Optional[bool] = None) -> Lock:
        """A :class:`Lock` for @name (no server is contacted yet).

        Args:
            name: 1-255 bytes of UTF-8, no control characters; no ``/`` on
                ZooKeeper or etcd.
            wait: the default wait of :meth:`Lock.acquire` and of ``with
                lock:``, in seconds; ``None`` waits without limit, ``0`` tries
                once.
            lease_ms: the server-side lease (Redis, local), at most the
                configured ``lock.lease_ms``; ``None`` takes it.
            renew: renew the lease while held (default: ``lock.renew``).
            fair: FIFO hand-off on release (default: ``lock.fair``).
        """
        return Lock(self, name, wait, lease_ms, renew, fair)

    def alock(self, name: str, wait: Optional[float] = None, lease_ms: Optional[int] = None,
              *, renew: Optional[bool] = None, fair: Optional[bool] = None) -> _AsyncLock:
        """``async with client.alock(name, wait=...) as hold:`` acquires off
        the event loop (in its default executor) and releases at the end.
        Cancelling the task while it waits ends the acquisition; a grant
        that landed anyway is released first."""
        return _AsyncLock(self, name, wait, lease_ms, renew, fair)

    # -- the guard
    def guard(self, scope: str, key: Union[str, bytes], *, wait: Optional[float] = None,
              running: Optional[float] = None, keep: Optional[float] = None,
              on_unavailable: Optional[str] = None, cancel: Optional[Cancel] = None
              ) -> "GuardContext":
        """The idempotency guard as a context manager; see
        :class:`cerberus.guard.GuardContext`."""
        from .guard import GuardContext
        return GuardContext(self, scope, key, wait=wait, running=running, keep=keep,
                            on_unavailable=on_unavailable, cancel=cancel)

    def once(self, scope: str, key: Union[str, bytes, Callable[..., Union[str, bytes]], None]
             = None, *, text: bool = False, wait: Optional[float] = None,
             running: Optional[float] = None, keep: Optional[float] = None,
             on_unavailable: Optional[str] = None) -> Callable[[Callable[..., T]],
                                                               Callable[..., Any]]:
        """A decorator: the function runs once per key; see
        :func:`cerberus.guard.once`."""
        from .guard import once
        return once(self, scope, key, text=text, wait=wait, running=running, keep=keep,
                    on_unavailable=on_unavailable)

    # -- engines
    @property
    def current_engine(self) -> str:
        """The engine new acquisitions go to."""
        ptr = self._enter()
        try:
            return _text(F.cerb_engine_current(ptr))
        finally:
            self._leave()

    def _engine_names(self, ptr: int) -> List[str]:
        """The configured engines in configuration order, from the metrics
        (which list every engine in that order)."""
        text = self._metrics(ptr)
        names: List[str] = []
        marker = 'cerberus_engine_active{engine="'
        for line in text.splitlines():
            if line.startswith(marker):
                n = line[len(marker):].split('"', 1)[0]
                if n not in names:
                    names.append(n)
        return names

    def status(self) -> ClientStatus:
        """The engines in configuration order with their breaker state,
        probe latency and counters, and the current engine
        (``cerb_engine_info`` for each)."""
        ptr = self._enter()
        try:
            engines = []
            for n in self._engine_names(ptr):
                info = _lib.EngineInfo()
                st = L.cerb_engine_info(ptr, n.encode(), byref(info))
                check(st, "engine_info %s" % n)
                engines.append(EngineStatus(
                    name=_text(info.name), active=bool(info.active),
                    breaker=Breaker(info.breaker), last_probe_us=info.last_probe_us,
                    acquires=info.acquires, failures=info.failures, lost=info.lost,
                    acquire_calls=info.acquire_calls, wakeups=info.wakeups,
                    handoffs=info.handoffs, breaker_transitions=info.breaker_transitions,
                    switches=info.switches, epoch=info.epoch, wanted=bool(info.wanted),
                    guard_begins=info.guard_begins, guard_duplicates=info.guard_duplicates,
                    guard_busy=info.guard_busy, guard_degraded=info.guard_degraded,
                    gate_questions=info.gate_questions, closed_epoch=info.closed_epoch))
            return ClientStatus(current=_text(F.cerb_engine_current(ptr)), engines=engines)
        finally:
            self._leave()

    def _metrics(self, ptr: int) -> str:
        out = c_void_p()
        st = L.cerb_metrics_text(ptr, byref(out))
        check(st, "metrics_text")
        try:
            from ctypes import string_at
            return string_at(out.value).decode("utf-8", "replace")
        finally:
            F.cerb_free(out.value)

    def metrics_text(self) -> str:
        """The client's state in the Prometheus text format 0.0.4, for a
        ``/metrics`` endpoint (``cerb_metrics_text``)."""
        ptr = self._enter()
        try:
            return self._metrics(ptr)
        finally:
            self._leave()

    def inspect(self, name: str, engine: Optional[str] = None) -> List[Holder]:
        """Who holds @name and who waits for it, read from the servers
        without changing anything (``cerb_lock_inspect``); holds of other
        clients speaking the same layout (redis-py, Curator, etcdctl) show
        too. @engine: one configured engine; ``None`` asks every open one.
        An empty list: nobody holds it.

        Raises: the first failing engine's error, with the entries of the
        engines that answered in its ``holders`` attribute.
        """
        ptr = self._enter()
        try:
            arr = POINTER(_lib.HolderInfo)()
            n = c_size_t(0)
            st = L.cerb_lock_inspect(ptr, name.encode("utf-8"),
                                     None if engine is None else engine.encode(),
                                     byref(arr), byref(n))
            text = last_error() if st else ""
            out = [Holder(engine=_text(arr[i].engine), owner=_text(arr[i].owner),
                          waiting=bool(arr[i].waiting), fence=arr[i].fence,
                          ttl_ms=arr[i].ttl_ms, detail=_text(arr[i].detail))
                   for i in range(n.value)]
            F.cerb_holders_free(arr, n.value)
        finally:
            self._leave()
        if st != 0:
            err = error_for(st, text, 'inspect "%s"' % name)
            err.holders = out  # type: ignore[attr-defined]
            raise err
        return out

    def switch(self, engine: Optional[str] = None) -> str:
        """Move new acquisitions to @engine and pin it; ``"auto"`` returns to
        automatic selection; ``None`` moves to the next engine that opens.
        Returns the engine now current. This client only: ``cerberus
        switch`` moves every process of a configuration file.

        Raises: InvalidArgument when no configured engine has that name or
        it will not open (the text lists the configured ones).
        """
        ptr = self._enter()
        try:
            if engine is None:
                r = L.cerb_engine_switch(ptr)
            else:
                r = L.cerb_engine_switch_to(ptr, engine.encode("utf-8"))
            text = last_error() if r is None else ""
        finally:
            self._leave()
        if r is None:
            raise error_for(Status.EINVAL, text, "switch %s" % engine)
        return _text(r)

    def reload(self) -> None:
        """Re-read the configuration file (``cerb_client_reload``); the old
        configuration stays in force on any error (ConfigError)."""
        ptr = self._enter()
        try:
            st = L.cerb_client_reload(ptr)
            text = last_error() if st else ""
        finally:
            self._leave()
        check(st, "reload", text)

    def on_switch(self, callback: Optional[Callable[[str, str, str], Any]]) -> None:
        """Call ``callback(from_engine, to_engine, why)`` after every engine
        switch, on the client's callback thread; ``None`` removes it."""
        ptr = self._enter()
        try:
            old = self._core.switch_key
            if callback is None:
                st = L.cerb_client_on_switch(ptr, _callbacks.SWITCH_NONE, None)
                key = None
            else:
                key = _callbacks.register(callback)
                st = L.cerb_client_on_switch(ptr, _callbacks.SWITCH, key)
            text = last_error() if st else ""
            if st == 0:
                self._core.switch_key = key
                _callbacks.unregister(old)
            else:
                _callbacks.unregister(key)
        finally:
            self._leave()
        check(st, "on_switch", text)

    def __repr__(self) -> str:
        if self.closed:
            return "<cerberus.Client closed>"
        return "<cerberus.Client engine=%s>" % self.current_engine

