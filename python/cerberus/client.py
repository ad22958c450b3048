"""client.py — Client, Lock, Hold and Cancel over the C handles.

Lifetimes. Every C handle lives in a :class:`_Handle` that counts the calls
using it; freeing it (``dispose``) first refuses new calls, then waits for
the running ones to return, so no call ever sees freed memory, whichever
thread frees. A client keeps a table of its children's handles. Closing
it fires the cancel of every blocking call in flight, under the client's
mutex (a call cannot end, and give back or free its cancel, while the
close fires it; ``cerb_cancel_fire`` never waits on the network), waits
for those calls to return, marks every child handle closed (new calls are
refused, running ones are waited for) and lets ``cerb_client_close`` release
and free what is left: bounded, where freeing hold after hold is not when
an engine is down. A child keeps its client alive (it refers to it), so
garbage collection never closes a client under a hold.

Finalizers. ``__del__`` never blocks and takes no lock of the client: it
hands the handle to the reaper, a thread of the process that frees it (a
hold still held is released there, on the network). A client still open
at exit is closed then, by an ``atexit`` hook.

Signals. Python delivers signals to the main thread only, and raises
their exceptions (KeyboardInterrupt, a SIGTERM handler's) between two
bytecodes: raised just after the C call that made a hold, it would leave
the hold owned by nobody. So every call that returns a new handle frees
it in a ``finally`` unless the Python object that owns it was made (a
pointer is owned by a _Handle as soon as one holds it). And a C wait does
not return for a signal: on the main thread a lock acquisition that may
wait runs on a helper thread while the main thread waits, interruptibly;
an exception raised there fires the call's cancel, waits for the call to
end, gives back what it made (the hold is released) and propagates. A
try (wait=0), a guard's begin and a client's open are bounded by the
configured timeouts: they run on the calling thread.
A close made from inside a call of the same thread (a signal handler's)
or while that thread's close is under way never waits: it fires the
cancels and returns, and the interrupted frame finishes the close when
its last call of the package ends (_busy_leave).

Fork. A client belongs to the process that opened it. In a child made by
``fork()`` a call on a lock or a client goes to the library, which refuses
it (InvalidArgument, with a text that names the fork); a hold, guard
attempt or cancel of the parent is refused here, before C is reached, and
nothing of the parent's is freed, released or waited for by the child, at
exit either. Every mutex of the package is made anew in the child.

Threads. Every call may be made from any thread; blocking calls release
the GIL (ctypes does), so other threads run while one waits. A hold
belongs to an object, not a thread: any thread may release it.
"""

from __future__ import annotations

import asyncio
import atexit
import enum
import functools
import itertools
import math
import os
import queue
import threading
import weakref
from ctypes import byref, c_size_t, c_void_p, POINTER
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar,
                    Union)

from . import _callbacks, _lib
from .errors import (Error, InvalidArgument, NotOwner, Status, check, error_for,
                     last_error)

if TYPE_CHECKING:
    from .guard import GuardContext

# Loaded on first use (_lib.Deferred): importing this module needs no library.
L: Any = _lib.Deferred(globals(), "L", "lib")  # calls that may wait: the GIL is released
F: Any = _lib.Deferred(globals(), "F", "fast")  # calls that never wait: the GIL is kept
T = TypeVar("T")
E = TypeVar("E", bound=enum.IntEnum)

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


def _enum(cls: Type[E], value: int) -> Union[E, int]:
    """@value as a member of @cls, or the plain int for a value a later
    library added (the lists are append-only): degrade, do not fail."""
    try:
        return cls(value)
    except ValueError:
        return value


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


def _cstr(value: Union[str, bytes], what: str) -> bytes:
    """@value as a C string: UTF-8, and no NUL byte (C would stop there and
    use a shorter name than the one asked for)."""
    if isinstance(value, str):
        try:
            b = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgument(Status.EINVAL, "%s is not valid text: %s" % (what, e)) from None
    elif isinstance(value, bytes):
        b = value
    else:
        raise TypeError("%s must be str, not %s" % (what, type(value).__name__))
    if b"\0" in b:
        raise InvalidArgument(Status.EINVAL, "%s contains a NUL character at offset %d: C "
                              "would read it cut short there" % (what, b.index(b"\0")))
    return b


def _closed(what: str) -> Error:
    return InvalidArgument(Status.EINVAL, "%s is closed" % what)


# The current process's id, kept up to date by a fork hook (cheaper than a
# getpid() per call): a handle made under another pid is the parent's.
_PID = [os.getpid()]


def _forked(pid: int) -> bool:
    return pid != _PID[0]


def _on_main_thread() -> bool:
    return threading.get_ident() == threading.main_thread().ident


# ----------------------------------------------------------------- handles

# How many calls of the package this thread is inside (handles entered,
# blocking calls registered), and the closes it had to leave unfinished
# because of them: a close made from inside a call of the same thread (a
# signal handler's, run on the main thread between two bytecodes of that
# call) must not wait for that call, which cannot go on until the handler
# returns. It fires the cancels and returns; the outermost frame finishes
# it when its last call ends (see _busy_leave).
_tls = threading.local()


def _busy_here() -> int:
    return getattr(_tls, "depth", 0)


def _busy_enter() -> None:
    _tls.depth = getattr(_tls, "depth", 0) + 1


def _busy_leave() -> None:
    depth = _tls.depth = _tls.depth - 1
    if depth == 0 and getattr(_tls, "deferred", None):
        cores, _tls.deferred = _tls.deferred, []
        for core in cores:
            core.close()



# Every cancel's handle, for the fork hook (its mutex may be held by a
# thread that stayed in the parent). The other live handles are found
# through their client (_cores: the client's handle and its table of
# children); a handle gone (freed, closed) is refused before its mutex is
# taken, so its mutex does not matter.
_cancel_handles: "weakref.WeakSet[_Handle]" = weakref.WeakSet()


class _Handle:
    """A C pointer, the count of calls using it, and how to free it."""

    __slots__ = ("ptr", "what", "pid", "cb_key", "_free", "_mu", "_cond", "_users", "_gone",
                 "_freeing", "__weakref__")

    def __init__(self, ptr: int, free: Callable[["_Handle"], Any], what: str) -> None:
        self.ptr = ptr
        self.what = what
        self.pid = _PID[0]
        self.cb_key: Optional[int] = None  # a callback's entry (_callbacks)
        self._free = free
        self._mu = threading.Lock()
        self._cond: Optional[threading.Condition] = None
        self._users = 0
        self._gone = False
        self._freeing = False

    def enter(self) -> int:
        """Count one call in; raises when the handle is freed."""
        if self._gone:
            raise _closed(self.what)
        _busy_enter()  # before the count: a use counted is a use seen busy
        try:
            with self._mu:
                if self._gone:
                    raise _closed(self.what)
                self._users += 1
        except BaseException:
            _busy_leave()
            raise
        return self.ptr

    def leave(self) -> None:
        try:
            with self._mu:
                self._users -= 1
                if self._users == 0 and self._cond is not None:
                    self._cond.notify_all()
        finally:
            _busy_leave()

    @property
    def gone(self) -> bool:
        return self._gone

    def _wait(self, idle: bool) -> None:
        """With _mu held: wait until no call uses the handle (@idle: and no
        free of it is running either)."""
        while self._users or (idle and self._freeing):
            if self._cond is None:
                self._cond = threading.Condition(self._mu)
            self._cond.wait()

    def dispose(self) -> Any:
        """Refuse new calls, wait for running ones, free. Returns the free
        function's result for the call that freed, None otherwise (freed
        before, or a parent's handle in a forked child: left alone, and
        nothing waited for — the parent's threads are not here)."""
        if _forked(self.pid):
            self._gone = True
            return None
        with self._mu:
            if self._gone:
                return None
            self._gone = True
            self._freeing = True
            try:
                self._wait(False)
            except BaseException:  # interrupted: nothing freed, a later free does it
                self._gone = False
                self._freeing = False
                if self._cond is not None:
                    self._cond.notify_all()
                raise
        try:
            _callbacks.unregister(self.cb_key)
            return self._free(self)
        finally:
            with self._mu:
                self._freeing = False
                if self._cond is not None:
                    self._cond.notify_all()

    def drop(self) -> None:
        """For a client's close: refuse new calls and wait for the running
        ones (and a free already under way), but free nothing:
        cerb_client_close() frees what is left."""
        if _forked(self.pid):
            self._gone = True
            return
        with self._mu:
            self._gone = True
            self._wait(True)
        _callbacks.unregister(self.cb_key)

    def after_fork(self) -> None:
        """In a forked child: a fresh mutex (the parent's may have been held),
        and no call of the parent's threads counted."""
        self._mu = threading.Lock()
        self._cond = None
        self._users = 0
        self._freeing = False


# ----------------------------------------------------------------- reaper

class _Reaper:
    """Frees what finalizers hand over. ``__del__`` runs on whatever thread
    the garbage collector does, perhaps one holding a mutex of this package
    or inside the event loop: it must neither block nor take a lock. So it
    only puts the work on a queue (SimpleQueue.put is safe there), and this
    thread does it."""

    def __init__(self) -> None:
        self.q: "queue.SimpleQueue[Optional[Tuple[Callable[..., Any], Any]]]" = \
            queue.SimpleQueue()
        self.mu = threading.Lock()
        self.pid = 0

    def put(self, fn: Callable[..., Any], arg: Any) -> None:
        self.q.put((fn, arg))

    def ensure(self) -> None:
        """Start the thread of this process (not from a finalizer)."""
        if self.pid == _PID[0]:
            return
        with self.mu:
            if self.pid != _PID[0]:
                threading.Thread(target=self._run, args=(self.q,), name="cerberus-reaper",
                                 daemon=True).start()
                self.pid = _PID[0]

    @staticmethod
    def _run(q: "queue.SimpleQueue[Any]") -> None:
        while True:
            item = q.get()
            if item is None:
                return
            try:
                item[0](item[1])
            except BaseException:  # noqa: B902 - the reaper goes on
                _callbacks.log.exception("cerberus: freeing a collected object")
            item = None

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait until what was queued before this call is done (tests)."""
        done = threading.Event()
        self.ensure()
        self.q.put((lambda ev: ev.set(), done))
        return done.wait(timeout)

    def after_fork(self) -> None:
        self.q = queue.SimpleQueue()  # the parent's thread is not here
        self.mu = threading.Lock()
        self.pid = 0


_reaper = _Reaper()


def _reap(fn: Callable[[Any], Any], arg: Any) -> None:
    """From a finalizer: hand @fn(@arg) to the reaper. Never raises (at
    interpreter shutdown the module may be half torn down)."""
    try:
        _reaper.put(fn, arg)
    except Exception:  # noqa: BLE001 - nothing may escape a finalizer
        pass


# ------------------------------------------------------------------- pools

_NEW, _QUEUED, _RUNNING, _DONE, _DROPPED = range(5)


class _Job:
    """One call run on a pool's thread: ``fn(*args)``, its outcome, and
    how the caller learns it (@done: a threading wait, or an asyncio
    future and its loop)."""

    __slots__ = ("fn", "args", "state", "ok", "value", "done", "loop", "fut", "cptr", "core")

    def __init__(self, fn: Callable[..., Any], args: Tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.state = _NEW
        self.ok = False
        self.value: Any = None
        self.done: Optional[threading.Lock] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.fut: Optional["asyncio.Future[Any]"] = None
        self.cptr: Optional[int] = None  # a pooled cancel the job gives back
        self.core: Optional["_Core"] = None

    # -- the waiting thread's side (threading)
    def wait(self) -> None:
        """Wait for the end; interruptible (KeyboardInterrupt)."""
        if self.state != _DONE:
            assert self.done is not None
            self.done.acquire()

    def wait_quietly(self) -> Optional[BaseException]:
        """Wait for the end whatever is raised meanwhile: the call uses
        memory the caller is about to give back. Returns the last exception
        raised meanwhile (a SystemExit, say), for the caller to raise once
        it gave back what it must."""
        late: Optional[BaseException] = None
        while self.state != _DONE:
            try:
                assert self.done is not None
                self.done.acquire()
            except BaseException as e:  # noqa: B902 - a second Ctrl-C: still wait
                late = e
        return late


class _Pool:
    """Threads that run blocking calls for other threads or event loops:
    a SimpleQueue of jobs and up to @most threads, started when a job finds
    none idle. A job is put on the queue under the mutex, so a stop() comes
    after every job accepted (and its threads run them all before they
    end). A job still queued can be dropped (its task was cancelled): it
    then never runs, and nobody waits for a thread to take it."""

    def __init__(self, most: int, name: str) -> None:
        self.mu = threading.Lock()
        self.q: "queue.SimpleQueue[Optional[_Job]]" = queue.SimpleQueue()
        self.most = most
        self.name = name
        self.threads = 0
        self.idle = 0  # threads free for a job not yet handed one
        self.stopped = False

    def submit(self, job: _Job) -> _Job:
        spawn = False
        with self.mu:
            if self.stopped:
                raise _closed("the client")
            job.state = _QUEUED
            self.q.put(job)
            if self.idle:
                self.idle -= 1
            elif self.threads < self.most:
                self.threads += 1
                spawn = True
        if spawn:
            try:
                threading.Thread(target=self._run, name=self.name, daemon=True).start()
            except BaseException:
                with self.mu:
                    self.threads -= 1
                    dropped = job.state == _QUEUED
                    if dropped:
                        job.state = _DROPPED
                if dropped:
                    raise
        return job

    def drop(self, job: _Job) -> bool:
        """Mark @job dropped if no thread took it yet (a thread that takes
        it later skips it)."""
        with self.mu:
            if job.state != _QUEUED:
                return False
            job.state = _DROPPED
            return True

    def interrupt(self, job: _Job) -> str:
        """For a cancelled task: "dropped" (it never ran), "fired" (it runs:
        its cancel was fired, under the mutex, so the job cannot give the
        cancel back meanwhile) or "done"."""
        with self.mu:
            if job.state == _QUEUED:
                job.state = _DROPPED
                return "dropped"
            if job.state == _RUNNING:
                if job.cptr is not None:
                    F.cerb_cancel_fire(job.cptr)
                return "fired"
            return "done"

    def _run(self) -> None:
        q = self.q
        while True:
            job = q.get()
            if job is None:
                return
            with self.mu:
                if job.state == _DROPPED:
                    self.idle += 1
                    continue
                job.state = _RUNNING
            try:
                value, ok = job.fn(*job.args), True
            except BaseException as e:  # noqa: B902 - delivered to the waiting side
                value, ok = e, False
            job.value, job.ok = value, ok
            value = None
            with self.mu:
                job.state = _DONE
                self.idle += 1
            if job.cptr is not None and job.core is not None:
                job.core.give_cancel(job.cptr)
            _deliver(job)
            job = None

    def stop(self) -> None:
        """Threads end once they took every job queued before."""
        with self.mu:
            self.stopped = True
            n, self.threads = self.threads, 0
            self.idle = 0
            for _ in range(n):
                self.q.put(None)


def _deliver(job: _Job) -> None:
    if job.done is not None:
        job.done.release()
        return
    assert job.loop is not None
    try:
        job.loop.call_soon_threadsafe(_settle_future, job)
    except RuntimeError:  # the loop is closed
        _undeliverable(job)


def _settle_future(job: _Job) -> None:
    fut = job.fut
    assert fut is not None
    if fut.cancelled():
        _undeliverable(job)
    elif job.ok:
        fut.set_result(job.value)
    else:
        fut.set_exception(job.value)
    job.value = None


def _undeliverable(job: _Job) -> None:
    """A result nobody will take: a hold is released (off the loop), never
    left an orphan."""
    value, job.value = job.value, None
    if job.ok and isinstance(value, Hold):
        threading.Thread(target=value.close, name="cerberus-release", daemon=True).start()


# The helper threads of the main thread (see "Signals" above).
_main_pool = [_Pool(8, "cerberus-main-call")]


def _off_main(fn: Callable[[], T], discard: Callable[[T], None],
              cancel_ptr: Optional[int]) -> T:
    """Run @fn on a helper thread while this (main) thread waits, so that
    a signal's exception cannot fall between the C call and the object that
    takes its result. On any exception raised here while waiting: fire
    @cancel_ptr, wait for @fn to end, @discard what it returned, re-raise."""
    job = _Job(fn, ())
    job.done = threading.Lock()
    job.done.acquire()
    pool = _main_pool[0]
    try:
        pool.submit(job)
        job.wait()
        if not job.ok:
            raise job.value
        value = job.value
        job.value = None
        return value
    except BaseException as e:
        if not job.ok and e is job.value:
            job.value = None
            raise  # the call's own exception
        # _DROPPED: submit could not start a thread and took the job back.
        if job.state in (_NEW, _DROPPED) or pool.drop(job):
            raise  # it never ran
        if cancel_ptr is not None:
            F.cerb_cancel_fire(cancel_ptr)
        late = job.wait_quietly()
        produced, job.value = job.value, None
        if job.ok:
            try:
                discard(produced)
            except BaseException:  # noqa: B902 - the first exception is the one to tell
                _callbacks.log.exception("cerberus: giving back the result of an "
                                         "interrupted call")
        if late is not None and not isinstance(late, KeyboardInterrupt):
            raise late from e  # a SystemExit (say) raised while we waited
        raise


# ------------------------------------------------------------------- core

# Every client's core, for the fork hook and the exit hook.
_cores: "weakref.WeakSet[_Core]" = weakref.WeakSet()


class _Core:
    """What a client and its children share: the C client, the table of
    children's handles, the blocking calls in flight and a pool of cancels
    (a blocking call given no cancel takes one, so that closing the client
    can end it)."""

    def __init__(self, ptr: int) -> None:
        self.handle = _Handle(ptr, lambda h: L.cerb_client_close(h.ptr), "the client")
        self.pid = _PID[0]
        # Reentrant: a signal handler's close may run on a thread inside it.
        self.mu = threading.RLock()
        # One close at a time, start to end; reentrant, so that a signal
        # handler's close on the thread already closing gets in (and returns).
        self.close_mu = threading.RLock()
        self.close_depth = 0
        self.closed = False  # cerb_client_close() ran
        self.closing = False
        self.children: Dict[int, _Handle] = {}
        self.inflight: Dict[int, int] = {}  # call id -> cancel pointer
        self.drained: Optional[threading.Event] = None
        self.pool: List[int] = []
        self.calls = itertools.count(1)
        self.switch_key: Optional[int] = None
        self.async_threads = 64
        self._pools: Dict[str, _Pool] = {}
        _cores.add(self)

    def workers(self, kind: str) -> _Pool:
        """The threads that run asyncio's blocking calls: "wait" for
        acquisitions that may wait (up to async_threads wait at once),
        "short" for the calls that never wait long — releases and tries
        (wait=0) — apart, so that they never queue behind waits (a release
        behind the waits for the very lock it releases, a nested try behind
        waits that its own hold keeps waiting)."""
        w = self._pools.get(kind)
        if w is None:
            with self.mu:
                if self.closing:
                    raise _closed("the client")
                w = self._pools.get(kind)
                if w is None:
                    w = self._pools[kind] = _Pool(self.async_threads, "cerberus-" + kind)
        return w

    # -- children
    def adopt(self, h: _Handle) -> None:
        with self.mu:
            if self.closing:
                raise _closed("the client")
            self.children[id(h)] = h

    def dispose_child(self, h: _Handle) -> Any:
        """Free a child; it leaves the table only once freed, so a close
        that starts meanwhile still finds it and waits for that free (no
        call may run during cerb_client_close). A free cut short (the wait
        interrupted) leaves it listed: it is still the client's."""
        try:
            return h.dispose()
        finally:
            if h.gone:
                with self.mu:
                    self.children.pop(id(h), None)

    # -- cancels
    def take_cancel(self) -> int:
        """An unfired cancel from the pool, or a new one."""
        with self.mu:
            if self.pool:
                return self.pool.pop()
        out = c_void_p()
        check(F.cerb_cancel_new(byref(out)), "cerb_cancel_new")
        return out.value

    def give_cancel(self, ptr: int) -> None:
        """Back to the pool once its call has returned; freed instead when
        it was fired (firing is final) or the client is closing."""
        if _forked(self.pid):
            return
        fired = F.cerb_cancel_fired(ptr)
        with self.mu:
            if not fired and not self.closing:
                self.pool.append(ptr)
                return
        F.cerb_cancel_free(ptr)

    # -- blocking calls
    def begin_call(self, cancel_ptr: int) -> int:
        """Register a blocking call using @cancel_ptr; returns its id."""
        call = next(self.calls)
        _busy_enter()
        try:
            with self.mu:
                if self.closing:
                    raise _closed("the client")
                self.inflight[call] = cancel_ptr
        except BaseException:
            _busy_leave()
            raise
        return call

    def end_call(self, call: int) -> None:
        try:
            with self.mu:
                del self.inflight[call]
                if not self.inflight and self.drained is not None:
                    self.drained.set()
        finally:
            _busy_leave()

    # -- closing
    def _fire(self) -> None:
        """Mark closing and fire the cancel of every blocking call in flight."""
        with self.mu:
            self.closing = True
            if not _forked(self.pid):
                # Fired under the mutex: a call leaves `inflight` (end_call)
                # under it before giving back or freeing its cancel, so every
                # pointer here is alive. The fire never waits on the network.
                for c in self.inflight.values():
                    F.cerb_cancel_fire(c)

    def close(self) -> None:
        """Close: idempotent, and a close cut short (KeyboardInterrupt while
        it waited) is finished by the next one (the exit hook's at least).
        A second close from another thread waits for the first: none may
        reach cerb_client_close() while another still waits for a call.
        A close that cannot wait — made from inside a call of this thread
        (a signal handler interrupting it), or while this thread's own close
        is under way — fires the cancels and returns: the outer frame
        finishes the close."""
        self._fire()
        if _busy_here():
            # This thread is inside a call (of this client, perhaps): waiting
            # for it here would never end. The frame finishes the close when
            # its last call ends (_busy_leave).
            deferred = getattr(_tls, "deferred", None)
            if deferred is None:
                deferred = _tls.deferred = []
            if self not in deferred:
                deferred.append(self)
            return
        with self.close_mu:
            if self.close_depth:
                return  # this thread's close, interrupted by a signal handler: it goes on
            self.close_depth += 1
            try:
                self._close()
            finally:
                self.close_depth -= 1

    def _close(self) -> None:
        if self.closed:
            return
        forked = _forked(self.pid)
        with self.mu:
            self.closing = True
            if forked:
                children = list(self.children.values())
            else:  # their cancels were fired (close() -> _fire())
                drained = None
                if self.inflight:
                    drained = self.drained = self.drained or threading.Event()
                    drained.clear()
        if forked:  # the parent's: nothing to free, nothing to wait for
            for h in children:
                h.drop()
            self.handle.drop()
            self.closed = True
            return
        if drained is not None:
            drained.wait()
        with self.mu:
            children = list(self.children.values())
        # Each child refuses new calls and waits for its running ones; none
        # is freed here: cerb_client_close() releases every hold still held
        # (bounded: once an engine fails to answer a release, the rest of its
        # holds are left to their lease), ends the guard attempts left open
        # (as failed) and frees every handle. A child leaves the table only
        # once dropped: a close cut short here leaves the rest listed, and
        # the next close drops them before it may reach cerb_client_close().
        for h in children:
            h.drop()
            with self.mu:
                self.children.pop(id(h), None)
        with self.mu:
            pool, self.pool = self.pool, []
        for c in pool:
            F.cerb_cancel_free(c)
        _callbacks.unregister(self.switch_key)
        for w in list(self._pools.values()):
            w.stop()
        self.handle.dispose()
        self.closed = True

    def after_fork(self) -> None:
        self.mu = threading.RLock()
        self.close_mu = threading.RLock()
        self.close_depth = 0
        self.handle.after_fork()
        for h in self.children.values():
            h.after_fork()
        self.drained = None
        self.inflight.clear()
        self.pool = []  # the parent's: never used nor freed here
        self._pools = {}  # their threads stayed in the parent


def _after_fork_in_child() -> None:
    _PID[0] = os.getpid()
    for h in list(_cancel_handles):
        h.after_fork()
    for core in list(_cores):
        core.after_fork()
    _reaper.after_fork()
    _main_pool[0] = _Pool(8, "cerberus-main-call")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_all_at_exit() -> None:
    """Close every client still open (their holds are released). Runs
    after the application's own exit hooks (registered later)."""
    for core in list(_cores):
        try:
            core.close()
        except BaseException:  # noqa: B902 - the others still get closed
            _callbacks.log.exception("cerberus: closing a client at exit")


def _discard(value: Any) -> None:
    """Give back what an interrupted call made (see _off_main)."""
    if value is not None and hasattr(value, "_discard"):
        value._discard()


def _blocking_call(core: _Core, cancel: Optional["Cancel"],
                   call: Callable[[Optional[int]], Tuple[int, Any, str]],
                   need_cancel: bool = True, waits: bool = False) -> Tuple[int, Any, str]:
    """Run @call(cancel pointer) -> (status, value, error text) as a
    blocking call of @core: with the user's cancel, or one from the pool,
    registered in flight so that a close fires it (@need_cancel False and
    no user's cancel: a bounded call, run with none). @waits: it may wait
    long, so on the main thread it runs on a helper thread (_off_main).
    @call reads the error text on the thread that made the C call, right
    after it, and owns what the call made (see "Signals")."""
    if cancel is None and not need_cancel:
        return call(None)
    if cancel is not None:
        cptr = cancel._enter()
    else:
        cptr = core.take_cancel()
    try:
        cid = core.begin_call(cptr)
        try:
            if waits and _on_main_thread():
                return _off_main(lambda: call(cptr), lambda r: _discard(r[1]), cptr)
            return call(cptr)
        finally:
            core.end_call(cid)
    finally:
        if cancel is not None:
            cancel._h.leave()
        else:
            core.give_cancel(cptr)


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
    may be reused after the call returned if it was not fired. A
    KeyboardInterrupt (or another exception a signal handler raises) on the
    main thread during the call fires it too.
    """

    def __init__(self) -> None:
        _reaper.ensure()
        out = c_void_p()
        check(F.cerb_cancel_new(byref(out)), "cerb_cancel_new")
        self._h = _Handle(out.value, lambda h: F.cerb_cancel_free(h.ptr), "a cancel")
        _cancel_handles.add(self._h)

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.gone:
            _reap(_Handle.dispose, h)

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

def _free_hold(h: _Handle) -> int:
    """cerb_hold_free() of a hold nobody released: it releases first. A
    failed release is logged (the lease then expires by itself)."""
    return _free_hold_ptr(h.ptr, h.what)


def _free_hold_ptr(ptr: int, what: str) -> int:
    st = L.cerb_hold_free(ptr)
    if st not in (0, Status.NOT_OWNER):
        _callbacks.log.warning("cerberus: %s was freed while still held and its release "
                               "failed: %s (%s); the lease expires by itself",
                               what, error_for(st).name, last_error())
    return st


class Hold:
    """One grant of a lock, owned by this object rather than by a thread
    (``cerb_hold``).

    Any thread may :meth:`release` it or read its :attr:`state`. It is a
    context manager (``with hold:`` releases at the end) and an
    asynchronous one (``async with hold:`` releases off the event loop).
    A hold that is garbage collected while still held is released soon
    after, on a thread of the package; one still held when its client
    closes is released by the close.
    """

    __slots__ = ("_client", "_core", "_h", "_name", "_token", "_error", "__weakref__")

    def __init__(self, client: "Client", h: _Handle, name: str) -> None:
        """@h owns the C hold; its maker frees it when this raises (the
        client is closing, say)."""
        self._client = client
        self._core = client._core
        self._token: int = F.cerb_hold_fencing_token(h.ptr)
        self._name = name
        self._error = ""
        self._core.adopt(h)
        self._h = h

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.gone:
            _reap(self._core.dispose_child, h)

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
            return _enum(State, F.cerb_hold_state(ptr))  # type: ignore[return-value]
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
            st, text = _callbacks.set_lost(self, self._h, L.cerb_hold_on_lost, ptr,
                                           _callbacks.HOLD_LOST, _callbacks.HOLD_LOST_NONE,
                                           callback)
        finally:
            self._h.leave()
        check(st, "on_lost", text)

    def release(self) -> None:
        """Release the hold on the server and free it; from any thread.

        Raises:
            NotOwner: it was already released (or its client closed, which
                released it).
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
            how = "its client closed" if self._core.closing else "it was already released"
            raise NotOwner(Status.NOT_OWNER, 'the hold of "%s" is not held: %s'
                           % (self._name, how), "release") from None
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
        """:meth:`release`, run on the client's threads for short calls so
        the event loop does not wait on the network. A cancellation of the
        awaiting task does not stop the release: it completes, then
        CancelledError is raised."""
        await _settle(_submit(self._short_pool(), self.release))

    def _short_pool(self) -> _Pool:
        """The client's threads for short calls; NotOwner (as release()
        says) when the client is closing: its close releases the hold."""
        try:
            return self._core.workers("short")
        except InvalidArgument:
            if not self._core.closing or _forked(self._h.pid):
                raise
            raise NotOwner(Status.NOT_OWNER, 'the hold of "%s" is not held: its client '
                           'closed' % self._name, "release") from None

    def close(self) -> None:
        """Release the hold if it is still held and free it. A failed
        release is logged (warning, logger ``cerberus``), not raised."""
        if not self._h.gone:
            try:
                self.release()
            except NotOwner:
                pass
            except Error as e:
                _callbacks.log.warning("cerberus: release of %r failed: %s", self._name, e)

    _discard = close

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        _exit_release(self, et is not None)

    async def __aenter__(self) -> "Hold":
        return self

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self._h.gone:
            return
        try:
            pool = self._short_pool()
        except NotOwner:
            return  # the client is closing: its close releases the hold
        await _settle(_submit(pool, _exit_release, self, et is not None))

    def __repr__(self) -> str:
        return "<cerberus.Hold %r token=%d %s>" % (self._name, self._token,
                                                   getattr(self.state, "name", self.state))


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


# ----------------------------------------------------------------- asyncio

def _submit(pool: _Pool, fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
    """Run fn(*args) on @pool; a future of the running loop for its result."""
    loop = asyncio.get_running_loop()
    job = _Job(fn, args)
    job.loop = loop
    job.fut = loop.create_future()
    pool.submit(job)
    return job.fut


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


async def _acquire_async(core: _Core, acquire: Callable[[Optional[int]], Hold],
                         bounded: bool) -> Hold:
    """Run @acquire(cancel pointer) on the client's threads ("short" for a
    try, @bounded, "wait" otherwise) with a cancel from the pool, which the
    job gives back when the call has returned. When the awaiting task is
    cancelled: a job no thread took yet is dropped, and the cancellation
    propagates at once; a running one has its cancel fired, its end is
    awaited, and a hold it returned anyway is released (off the loop)."""
    pool = core.workers("short" if bounded else "wait")
    cptr = core.take_cancel()
    loop = asyncio.get_running_loop()
    job = _Job(acquire, (cptr,))
    job.loop = loop
    job.fut = fut = loop.create_future()
    job.cptr, job.core = cptr, core
    try:
        pool.submit(job)
    except BaseException:
        core.give_cancel(cptr)
        raise
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if pool.interrupt(job) == "dropped":
            core.give_cancel(cptr)  # never ran: never used
            fut.cancel()
            raise
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except BaseException:  # noqa: B902 - only its end matters here
                pass
        if not fut.cancelled() and fut.exception() is None:
            hold = fut.result()
            try:
                await _settle(_submit(core.workers("short"), hold.close))
            except Error:  # the client closed meanwhile: its close released it
                pass
        raise
# -------------------------------------------------------------------- Lock

def _lock_opts(lease_ms: Optional[int], renew: Optional[bool],
               fair: Optional[bool]) -> "_lib.LockOpts":
    if lease_ms is not None and (isinstance(lease_ms, bool) or not isinstance(lease_ms, int)):
        raise TypeError("lease_ms must be an int of milliseconds or None, not %r" % (lease_ms,))
    return _lib.LockOpts(int(lease_ms or 0), -1 if renew is None else int(bool(renew)),
                         -1 if fair is None else int(bool(fair)))


def _new_lock(core: _Core, name: str, opts: "_lib.LockOpts") -> int:
    """cerb_lock_new(); the handle's pointer, or the library's error. The
    caller keeps the client's handle entered while it uses the pointer
    (a close waits for it)."""
    cname = _cstr(name, "a lock name")
    cptr = core.handle.enter()
    try:
        out = c_void_p()
        st = F.cerb_lock_new(cptr, cname, byref(opts), byref(out))
        text = last_error() if st else ""
    finally:
        core.handle.leave()
    check(st, 'lock "%s"' % name, text)
    return out.value


def _new_lock_handle(core: _Core, name: str, opts: "_lib.LockOpts") -> _Handle:
    """cerb_lock_new() in a _Handle adopted by @core, adopted while the
    client's handle is still entered: a close that starts meanwhile waits
    for it, then finds it in the table (or the adoption is refused and the
    lock freed here, before the client's handle is left)."""
    cname = _cstr(name, "a lock name")
    out = c_void_p()
    adopted = False
    cptr = core.handle.enter()
    try:
        st = F.cerb_lock_new(cptr, cname, byref(opts), byref(out))
        text = last_error() if st else ""
        if st == 0:
            h = _Handle(out.value, lambda h: F.cerb_lock_free(h.ptr), 'a lock "%s"' % name)
            core.adopt(h)
            adopted = True
            return h
    finally:
        try:
            if out.value and not adopted:
                F.cerb_lock_free(out.value)
        finally:
            core.handle.leave()
    check(st, 'lock "%s"' % name, text)
    raise AssertionError("unreachable")  # check() raised


def _acquire(client: "Client", lptr: int, name: str, ms: int,
             cancel: Optional[Cancel], cancel_ptr: Optional[int] = None) -> Hold:
    """cerb_lock_acquire() as a blocking call of the client; the Hold is
    adopted while the call still counts as in flight (or its lock handle
    as used), so a close waits for it, then leaves it to
    cerb_client_close(); adopted after the close began, it is refused and
    given back here."""
    core = client._core

    def call(cptr: Optional[int]) -> Tuple[int, Optional[Hold], str]:
        out = c_void_p()
        h = hold = None
        try:
            st = L.cerb_lock_acquire(lptr, ms, cptr, byref(out))
            if st != 0:  # this thread's text first; the cancel keeps it too
                return st, None, (last_error() or
                                  (_text(F.cerb_cancel_error(cptr)) if cptr else ""))
            h = _Handle(out.value, _free_hold, 'a hold "%s"' % name)
            try:
                hold = Hold(client, h, name)
            except InvalidArgument:
                if not core.closing:
                    raise
                # A grant that landed as the client closed: given back below.
                return Status.INTERRUPTED, None, "the client is closing"
            return st, hold, ""
        finally:
            if hold is None and out.value:  # an exception came before a Hold took it
                if h is not None:
                    core.dispose_child(h)  # adopted or not
                else:
                    _free_hold_ptr(out.value, 'a hold "%s"' % name)

    if cancel_ptr is not None:  # the async path's pooled cancel, on a pool thread
        cid = core.begin_call(cancel_ptr)
        try:
            st, hold, text = call(cancel_ptr)
        finally:
            core.end_call(cid)
    else:
        # One try (ms 0) is bounded by the operation timeouts: it needs no
        # cancel for a close to end it. A close waits for it all the same
        # (the lock handle counts it), and a grant that lands as the client
        # closes is given back (Hold refuses to be adopted).
        st, hold, text = _blocking_call(core, cancel, call, need_cancel=ms != 0,
                                        waits=ms != 0)
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
        self._h = _new_lock_handle(self._core, name, _lock_opts(lease_ms, renew, fair))

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.gone:
            _reap(self._core.dispose_child, h)

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
        """:meth:`acquire` for asyncio: the blocking call runs on a thread of
        the client's (see :meth:`Client.alock`), and cancelling the awaiting
        task fires a cancel that ends it. A grant that landed anyway is
        released (off the loop) before CancelledError reaches you, so no
        hold is left behind on the server."""
        ms = wait_ms(self._wait if wait is DEFAULT else wait)
        return await _acquire_async(self._core,
                                    functools.partial(self._acquire_with, ms), ms == 0)

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
    (pool) thread: holds outlive their lock handle."""
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
        _cstr(name, "a lock name")
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
            functools.partial(_acquire_once, self._client, self._name, self._opts, self._ms),
            self._ms == 0)
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
        if text is not None:
            if not isinstance(text, str):
                raise TypeError("text must be str, not %s" % type(text).__name__)
            arg = _cstr(text, "the configuration text")
        else:
            arg = None if path is None else _cstr(os.fsencode(path), "the configuration path")
        _reaper.ensure()
        out = c_void_p()
        core: Optional[_Core] = None
        try:
            if text is not None:
                st = L.cerb_client_open_string(byref(out), arg)
            else:
                st = L.cerb_client_open(byref(out), arg)
            check(st, "open")
            core = _Core(out.value)
            core.async_threads = async_threads
            self._core = core
        finally:
            if out.value and getattr(self, "_core", None) is None:
                # An exception came before this client took it: a core made
                # (listed in _cores, perhaps by a _Core() that then raised)
                # closes through itself, so the exit hook finds it closed;
                # else the pointer is closed raw.
                if core is None:
                    core = next((k for k in list(_cores)
                                 if k.handle.ptr == out.value and not k.closed), None)
                if core is not None:
                    core.close()
                else:
                    L.cerb_client_close(out.value)

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None and not core.closing:
            _reap(_Core.close, core)

    # -- lifetime
    def close(self) -> None:
        """Close the client: blocking calls in flight end with Interrupted,
        every hold still held is released, every handle freed (bounded:
        once an engine fails to answer a release, its other holds are left
        to expire with their lease). Idempotent."""
        self._core.close()

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
        the event loop and releases at the end. The call waits on a thread
        of the client's: up to ``async_threads`` acquisitions that may wait
        at once (more queue for a thread); tries (``wait=0``) and releases
        run on threads of their own, so they never queue behind waits.
        Cancelling the task ends the acquisition (one still queued never
        runs); a grant that landed anyway is released first."""
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
                st = L.cerb_engine_info(ptr, _cstr(n, "an engine name"), byref(info))
                check(st, "engine_info %s" % n)
                engines.append(EngineStatus(
                    name=_text(info.name), active=bool(info.active),
                    breaker=_enum(Breaker, info.breaker),  # type: ignore[arg-type]
                    last_probe_us=info.last_probe_us,
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
        from ctypes import string_at
        out = c_void_p()
        try:
            st = L.cerb_metrics_text(ptr, byref(out))
            check(st, "metrics_text")
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
        cname = _cstr(name, "a lock name")
        cengine = None if engine is None else _cstr(engine, "an engine name")
        ptr = self._enter()
        try:
            arr = POINTER(_lib.HolderInfo)()
            n = c_size_t(0)
            try:
                st = L.cerb_lock_inspect(ptr, cname, cengine, byref(arr), byref(n))
                text = last_error() if st else ""
                out = [Holder(engine=_text(arr[i].engine), owner=_text(arr[i].owner),
                              waiting=bool(arr[i].waiting), fence=arr[i].fence,
                              ttl_ms=arr[i].ttl_ms, detail=_text(arr[i].detail))
                       for i in range(n.value)]
            finally:
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
        cengine = None if engine is None else _cstr(engine, "an engine name")
        ptr = self._enter()
        try:
            if cengine is None:
                r = L.cerb_engine_switch(ptr)
            else:
                r = L.cerb_engine_switch_to(ptr, cengine)
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

