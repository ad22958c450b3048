"""guard.py — the idempotency guard: ``client.guard()`` and ``client.once()``.

An operation that may arrive twice (a redelivered message, a retried
request) is named by a scope and a key. The first caller claims its record
and runs it; while it runs, others are told Busy (and wait, by default);
once it succeeded, others get :class:`~cerberus.Duplicate` with the result
it stored, for ``keep`` seconds. A failed run (an exception) deletes the
record at once, so a retry runs now; a crashed process's claim expires
after ``running`` seconds. The C side is ``cerb_guard_*`` (docs/guard.md).

The guard has no wait on the server: a caller told Busy asks again after a
growing pause (50 ms doubling up to 1 s, as ``cerberus once`` does), until
its ``wait`` runs out.
"""

from __future__ import annotations

import functools
import math
import time
from ctypes import byref, c_size_t, c_void_p, string_at
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

from . import _callbacks, _lib
from .client import (Cancel, Client, State, _blocking_call, _cstr, _enum, _forked,
                     _foreign_error, _Handle, _reap, _text, wait_ms)
from .errors import (Busy, Duplicate, Error, Interrupted, InvalidArgument, Status, check,
                     error_for, last_error)

# Loaded on first use (_lib.Deferred): importing this module needs no library.
L: Any = _lib.Deferred(globals(), "L", "lib")  # calls that may wait: the GIL is released
F: Any = _lib.Deferred(globals(), "F", "fast")  # calls that never wait: the GIL is kept
T = TypeVar("T")

#: ``keep=FOREVER``: a success keeps duplicates out for good.
FOREVER = math.inf

_REFUSE, _ALLOW = 0, 1


def _ms(seconds: Optional[float], what: str, forever_ok: bool = False) -> int:
    if seconds is None:
        return 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError("%s must be a number of seconds or None, not %r" % (what, seconds))
    if forever_ok and math.isinf(seconds) and seconds > 0:
        return -1
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError("%s must be a positive number of seconds, not %r" % (what, seconds))
    return max(1, int(math.ceil(seconds * 1000)))


Result = Union[str, bytes, bytearray, memoryview, None]


def _as_bytes(v: Result, what: str) -> bytes:
    """A result or key as bytes: bytes-like as it is, str in UTF-8, None
    as empty. Anything else is a TypeError; a str that UTF-8 cannot encode
    (a lone surrogate) a UnicodeEncodeError."""
    if v is None:
        return b""
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError("%s must be str, bytes or None, not %s" % (what, type(v).__name__))


def _free_attempt(h: _Handle) -> int:
    """cerb_guard_free(): an attempt never finished counts as failed (its
    record is deleted); a delete that failed is logged."""
    st = L.cerb_guard_free(h.ptr)
    if st != 0:
        _callbacks.log.warning("cerberus: %s was freed unfinished and its record could not be "
                               "deleted: %s (%s); its claim expires by itself",
                               h.what, error_for(st).name, last_error())
    return st


class Attempt:
    """A running attempt at a guarded operation (``cerb_guard``): what
    ``with client.guard(...) as attempt:`` gives the block.

    Set :attr:`result` (str, bytes, bytearray or memoryview) inside the
    block: it is stored with the success, and a later duplicate receives it.
    """

    def __init__(self, client: Client, h: _Handle, scope: str) -> None:
        """@h owns the C attempt; its maker frees it when this raises (the
        client is closing: the attempt counts as failed)."""
        self._client = client
        self._core = client._core
        self.scope = scope
        self._result: Result = None
        self._data = b""
        self._core.adopt(h)
        self._h = h

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.gone:
            _reap(self._core.dispose_child, h)

    @property
    def result(self) -> Result:
        """What the success stores, as it was set (``None``: empty). Set it
        to str (stored in UTF-8), bytes, bytearray or memoryview; anything
        else raises TypeError at once, in the block, before the success is
        recorded."""
        return self._result

    @result.setter
    def result(self, value: Result) -> None:
        try:
            data = _as_bytes(value, "attempt.result")
        except UnicodeEncodeError as e:
            raise TypeError("attempt.result: a str that UTF-8 cannot encode (%s)" % e) from None
        self._result, self._data = value, data

    def _discard(self) -> None:
        """Finish as failed (a retry may run at once) and free; a failure
        to record it is logged, not raised (the claim then expires)."""
        try:
            self._finish(False)
        except Error as e:
            _callbacks.log.warning("cerberus: guard %s: the failure was not recorded (%s); "
                                   "its claim expires by itself", self.scope, e)

    def _enter(self) -> int:
        if _forked(self._h.pid):
            raise _foreign_error("this guard attempt", self._h.pid)
        return self._h.enter()

    @property
    def degraded(self) -> bool:
        """True when the attempt runs unprotected: an engine that may hold
        the record could not answer and ``on_unavailable`` was ``"allow"``."""
        ptr = self._enter()
        try:
            return bool(F.cerb_guard_degraded(ptr))
        finally:
            self._h.leave()

    @property
    def state(self) -> State:
        """The claim, as a hold's state: VALID, SUSPECT, LOST (another
        attempt may begin: stop if you can), FREE once finished."""
        try:
            ptr = self._enter()
        except InvalidArgument:
            return State.FREE
        try:
            return _enum(State, F.cerb_guard_state(ptr))  # type: ignore[return-value]
        finally:
            self._h.leave()

    def on_lost(self, callback: Optional[Callable[["Attempt"], Any]]) -> None:
        """Call ``callback(attempt)`` once if the attempt's claim is lost,
        on the client's callback thread (as :meth:`Hold.on_lost`)."""
        ptr = self._enter()
        try:
            st, text = _callbacks.set_lost(self, self._h, L.cerb_guard_on_lost, ptr,
                                           _callbacks.GUARD_LOST, _callbacks.GUARD_LOST_NONE,
                                           callback)
        finally:
            self._h.leave()
        check(st, "on_lost", text)

    def _finish(self, succeeded: bool) -> None:
        """Finish and free. A success the engine did not confirm is finished
        again, four more times over about 2.5 s (as ``cerberus once``);
        Lost and InvalidArgument are final. A failure's delete is retried by
        the library in the background. The handle is freed whatever happens
        (an attempt freed unfinished counts as failed)."""
        try:
            ptr = self._enter()
        except InvalidArgument:
            if succeeded:  # freed by a client close: counted as failed
                raise InvalidArgument(Status.EINVAL, "the attempt was freed when its client "
                                      "closed: the success is not recorded",
                                      "guard %s" % self.scope) from None
            return
        try:
            try:
                data = self._data if succeeded else b""
                st = L.cerb_guard_finish(ptr, 1 if succeeded else 0, data, len(data))
                text = last_error() if st else ""
                for pause in (0.25, 0.5, 0.75, 1.0):
                    if not succeeded or st in (0, Status.LOST, Status.EINVAL):
                        break
                    time.sleep(pause)
                    st = L.cerb_guard_finish(ptr, 1, data, len(data))
                    text = last_error() if st else ""
            finally:
                self._h.leave()
        finally:
            self._core.dispose_child(self._h)
        if st != 0:
            raise error_for(st, text, "guard finish %s" % ("success" if succeeded else "failure"))

    def __repr__(self) -> str:
        return "<cerberus.Attempt %r %s>" % (self.scope, self.state.name)


class GuardContext:
    """``with client.guard(scope, key) as attempt:`` runs the block only if
    the operation (@scope, @key) has not already succeeded.

    * The block runs when this caller claims the operation. Set
      ``attempt.result`` to what a duplicate should receive. A normal end
      records the success (stored for ``keep``); an exception deletes the
      record at once, so a retry runs, and propagates.
    * Already succeeded: :class:`~cerberus.Duplicate` is raised *instead of
      running the block*; its ``result`` attribute holds the stored bytes.
    * Another attempt is running: wait (``wait`` seconds, ``None`` without
      limit) and ask again; when it ends in success, Duplicate; when it
      failed, this caller runs. ``wait=0`` or a wait that ran out raises
      :class:`~cerberus.Busy`.

    Args:
        scope: the kind of operation, with lock-name rules.
        key: this operation's id (str or bytes, up to 1 MiB).
        running: seconds a crashed attempt keeps others out (renewed while
            the block runs); ``None``: ``guard.running_ms``.
        keep: seconds a success keeps duplicates out; :data:`FOREVER`;
            ``None``: ``guard.keep_ms``.
        on_unavailable: ``"refuse"`` (raise Unavailable) or ``"allow"`` (run
            unprotected, ``attempt.degraded`` True) when no engine can tell;
            ``None``: ``guard.on_unavailable``.
        cancel: a :class:`~cerberus.Cancel` that ends the begin (and the
            waiting) with Interrupted.
    """

    def __init__(self, client: Client, scope: str, key: Union[str, bytes], *,
                 wait: Optional[float] = None, running: Optional[float] = None,
                 keep: Optional[float] = None, on_unavailable: Optional[str] = None,
                 cancel: Optional[Cancel] = None) -> None:
        if not isinstance(scope, str):
            raise TypeError("scope must be str, not %s" % type(scope).__name__)
        if key is None:
            raise TypeError("key must be str or bytes, not None")
        self._client = client
        self._scope = scope
        self._cscope = _cstr(scope, "the guard's scope")
        self._key = _as_bytes(key, "key")
        wait_ms(wait)
        self._wait = wait
        pol = {None: -1, "refuse": _REFUSE, "allow": _ALLOW}
        if on_unavailable not in pol:
            raise ValueError('on_unavailable must be "refuse", "allow" or None, not %r'
                             % (on_unavailable,))
        self._opts = _lib.GuardOpts(_ms(running, "running"), _ms(keep, "keep", True),
                                    pol[on_unavailable])
        self._cancel = cancel
        self._attempt: Optional[Attempt] = None

    def _begin_once(self) -> Attempt:
        """One cerb_guard_begin_ex(): an Attempt, or an exception."""
        client = self._client
        scope = self._cscope

        def call(cptr: Optional[int]) -> Tuple[int, Union[Attempt, bytes, None], str]:
            out = c_void_p()
            h = attempt = None
            try:
                st = L.cerb_guard_begin_ex(kptr, scope, self._key, len(self._key),
                                           byref(self._opts), cptr, byref(out))
                text = ""
                if st not in (0, Status.DUPLICATE):  # this thread's text first
                    text = last_error() or (_text(F.cerb_cancel_error(cptr)) if cptr else "")
                if st == 0:  # adopted while the call counts as in flight
                    h = _Handle(out.value, _free_attempt, 'a guard attempt "%s"' % self._scope)
                    attempt = Attempt(client, h, self._scope)
                    return st, attempt, ""
                result = b""
                if out.value:  # a duplicate's answer: the stored result
                    n = c_size_t(0)
                    p = F.cerb_guard_result(out.value, byref(n))
                    if p:
                        result = string_at(p, n.value)
                return st, result, text
            finally:
                # A duplicate's answer; or an exception (a signal's, a closing
                # client's) before an Attempt took the handle: an attempt
                # freed unfinished counts as failed, so a retry may run.
                if attempt is None and out.value:
                    if h is not None:
                        client._core.dispose_child(h)  # adopted or not
                    else:
                        L.cerb_guard_free(out.value)

        kptr = client._enter()
        try:
            st, value, text = _blocking_call(client._core, self._cancel, call)
        finally:
            client._leave()
        if isinstance(value, Attempt):
            return value
        if st == Status.DUPLICATE:  # no failure: the error texts are stale
            raise Duplicate(st, 'the operation "%s" already succeeded' % self._scope,
                            "guard %s" % self._scope, result=value or b"")
        raise error_for(st, text, "guard %s" % self._scope)

    def _nap(self, seconds: float) -> None:
        """Pause between two asks; a closing client or a fired cancel ends
        it with Interrupted."""
        end = time.monotonic() + seconds
        while True:
            if self._client.closed or (self._cancel is not None and self._cancel.fired):
                raise Interrupted(Status.INTERRUPTED, "the wait for a running attempt "
                                  "was interrupted", "guard %s" % self._scope)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def begin(self) -> Attempt:
        """Begin an attempt, waiting while another runs (see the class)."""
        deadline = None if self._wait is None else time.monotonic() + self._wait
        pause = 0.05
        while True:
            try:
                return self._begin_once()
            except Busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise
                self._nap(pause if left is None else min(pause, left))
                pause = min(pause * 2, 1.0)

    def __enter__(self) -> Attempt:
        if self._attempt is not None:
            raise RuntimeError("this guard is already entered")
        self._attempt = self.begin()
        return self._attempt

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        if et is None:
            attempt._finish(True)
            return
        try:
            attempt._finish(False)
        except Error as e:
            _callbacks.log.warning("cerberus: guard %s: the failure was not recorded (%s); "
                                   "its claim expires by itself", attempt.scope, e)


def once(client: Any, scope: str,
         key: Union[str, bytes, Callable[..., Union[str, bytes]], None] = None, *,
         text: bool = False, wait: Optional[float] = None, running: Optional[float] = None,
         keep: Optional[float] = None, on_unavailable: Optional[str] = None
         ) -> Callable[[Callable[..., T]], Callable[..., Any]]:
    """A decorator: the function runs once per key, across every process
    sharing the configuration's engines; a duplicate call returns the result
    the successful run stored, without running it.

    Args:
        scope: the kind of operation.
        key: the operation's id: a str or bytes (one operation for the
            function), a callable given the function's arguments, or None:
            the function's first argument (str or bytes).
        text: return a duplicate's stored result as str (UTF-8) rather than
            bytes.
        wait, running, keep, on_unavailable: as for :meth:`Client.guard`.

    The function must return str, bytes (bytearray, memoryview) or None
    (stored as empty); the first run returns exactly what it returned. An
    exception is not recorded: it propagates and the next call runs the
    function again. A result of another type (or a str UTF-8 cannot
    encode) cannot be stored, but the function did run: the run is
    recorded as done with an empty result — a retry must not repeat its
    side effect — and TypeError says so.
    """

    def decorate(fn: Callable[..., T]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if callable(key):
                k = key(*args, **kwargs)
            elif key is None:
                if not args:
                    raise TypeError("%s: once() without a key uses the first argument as the "
                                    "key, and there is none" % fn.__name__)
                k = args[0]
            else:
                k = key
            # client.guard(): a Client's GuardContext, or a RemoteClient's.
            guard = client.guard(scope, k, wait=wait, running=running, keep=keep,
                                 on_unavailable=on_unavailable)
            try:
                attempt = guard.begin()
            except Duplicate as d:  # only the begin's: the function's own propagate
                return d.result.decode("utf-8") if text else d.result
            try:
                r = fn(*args, **kwargs)
            except BaseException:
                attempt._discard()  # failed: a retry runs
                raise
            bad: Optional[BaseException] = None
            try:
                attempt.result = r  # type: ignore[assignment]
            except TypeError as e:
                bad = e  # stored as empty: the side effect happened
            attempt._finish(True)
            if bad is not None:
                raise TypeError("%s returned %s, which once() cannot store (str, bytes or "
                                "None): the run is recorded as done with an empty result, so "
                                "it will not run again for this key"
                                % (fn.__name__, type(r).__name__)) from bad
            return r

        return wrapper

    return decorate
