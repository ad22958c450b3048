"""remote_hold.py — RemoteLock and RemoteHold: a RemoteClient's locks and
the holds the daemon grants, and the keeper thread that keeps each hold.

Validity is a local deadline, as the library's own (DESIGN.md §5a): every
answer that confirms the hold (the grant, then each ``POST
/v1/holds/{id}/keepalive``) carries ``valid_ms``, how long the daemon's
library still counts the hold valid, measured when the daemon answered,
and never later than when another owner could take the name. The deadline
is the time this process *sent* that request plus ``valid_ms`` (the answer
was made after the send, so the deadline is never late), on a clock that
counts suspended time (CLOCK_BOOTTIME). ``state`` reads the deadline at
every look: VALID before it while the last keepalive succeeded (and the
daemon said "valid"), SUSPECT before it after a failed one (or when the
daemon says "suspect"), LOST from it on, or at once when the daemon
answers 410 (lost) or 404 (it no longer knows the hold), or when nothing
listens at its address any more (nobody renews the hold). LOST is final.

Each hold has two threads. The keeper sends a keepalive every third of
the hold's window (the smaller of its lease and the last ``valid_ms``), at
least every 5 s and at most every 50 ms; a failed one is tried again after
100 ms. It waits until min(next keepalive, deadline), so ``on_lost`` fires
on it at the deadline, not later; a keepalive's connect and read are
bounded by the deadline too. The listener (remote_events.py) keeps the
hold's event stream open: it keeps the hold on the daemon whatever the
daemon's window (which a hold without ``lease_ms`` is not told), and
reports ``lost`` and ``released`` early; it never makes a hold valid.
While no stream is open, a hold whose window is not known is kept alive
every 50 ms (the daemon's window restarts when the stream closes).

A grant that took long (a blocking acquire: its send time is long past) is
confirmed by one keepalive before the hold is handed out, so its first
deadline is fresh. A daemon older than ``valid_ms`` gets half the hold's
window as its ``valid_ms``.

A release sets the hold done before its DELETE (so the keeper stops and a
late answer is not taken for a loss), ends the keepalive in flight and
joins the keeper. The keeper refers to a _HoldCore, not to the RemoteHold,
so a hold dropped while held is collected and released by the package's
reaper thread.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, TypeVar

from .client import DEFAULT, State, _reap, _settle, wait_ms
from .errors import Error, InvalidArgument, Lost, NotOwner, Status, Unavailable
from .remote_events import listen
from .remote_http import RemoteCancel, _check_name, _q, _shutdown

if TYPE_CHECKING:
    from .remote import RemoteClient

log = logging.getLogger("cerberus")
T = TypeVar("T")

# The keepalive window of a hold acquired without lease_ms when the daemon
# does not say (its serve.keepalive_ms default).
_DEFAULT_WINDOW_S = 10.0
# Bounds of the keepalive period (a third of the window).
_MIN_PERIOD_S = 0.05
_MAX_PERIOD_S = 5.0
# The pause before a failed keepalive is tried again (until the deadline).
_RETRY_S = 0.1


def _now() -> float:
    """Seconds on a clock that keeps counting while the machine is
    suspended (CLOCK_BOOTTIME; monotonic where there is none): a suspend
    must not stretch a deadline that the engines' clocks do not stretch."""
    return _clock()


try:
    _BOOT = time.CLOCK_BOOTTIME  # type: ignore[attr-defined]
    time.clock_gettime(_BOOT)

    def _clock() -> float:
        return time.clock_gettime(_BOOT)
except (AttributeError, OSError):  # not Linux
    _clock = time.monotonic


def _valid_s(ans: Dict[str, Any], window: float) -> float:
    """An answer's valid_ms in seconds; half the window from a daemon that
    does not send it (its library renews every third of the lease, so half
    is never late while it renews)."""
    v = ans.get("valid_ms") if isinstance(ans, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return window / 2.0
    return max(0.0, v / 1000.0)


class _HoldCore:
    """What a RemoteHold's keeper thread shares with it (the thread refers
    to this, not to the RemoteHold, so a hold dropped unreleased can be
    collected and released)."""

    def __init__(self, client: "RemoteClient", name: str, hid: str, token: int,
                 engine: str, window: float, sent: float, valid: float,
                 window_known: bool) -> None:
        self.client = client
        self.name = name
        self.id = hid
        self.token = token
        self.engine = engine
        self.window = window
        self.mu = threading.Lock()
        self.wake = threading.Event()  # ends the keeper's pause (a release, a stream's end)
        self.stopping = threading.Event()  # set once, by a release: ends the listener's pauses
        self.window_known = window_known  # lease_ms given, or window_ms answered
        self.state = State.VALID
        self.deadline = sent + valid  # _now() of the last good send + its valid_ms
        self.valid = valid
        self.done = False       # released (or being released): the keeper stops
        self.forgotten = False  # the daemon does not know the hold any more
        self.lost_text = ""
        self.error = ""
        self.callback: Optional[Callable[[Any], Any]] = None
        self.called = False
        self.owner: Optional["weakref.ref[RemoteHold]"] = None
        self.inflight: Optional[RemoteCancel] = None  # the keepalive being sent
        self.stream: Optional[http.client.HTTPConnection] = None  # the listener's
        self.listening = False  # the listener's stream is open
        self.resume = threading.Event()  # a test's pause of both threads (_pause_keeper)
        self.resume.set()
        self.last_ok = True
        self.thread = threading.Thread(target=self._keep, daemon=True,
                                       name="cerberus-remote-hold")
        self.listener = threading.Thread(target=listen, args=(self,), daemon=True,
                                         name="cerberus-remote-events")

    def start(self) -> None:
        self.thread.start()
        self.listener.start()

    # -- the deadline
    def period(self) -> float:
        """The keepalive period; the shortest while neither an open stream
        nor a known window keeps the hold on the daemon."""
        if not self.window_known and not self.listening:
            return _MIN_PERIOD_S
        return min(max(min(self.window, self.valid) / 3.0, _MIN_PERIOD_S), _MAX_PERIOD_S)

    def _expire_locked(self) -> None:
        """LOST once the deadline passed (self.mu held); the callback is the
        keeper's to call."""
        if not self.done and self.state in (State.VALID, State.SUSPECT) \
                and _now() >= self.deadline:
            self.state = State.LOST
            self.lost_text = ("no keepalive of the hold was confirmed in time: its local "
                              "deadline passed (the name may be another's now)")

    def current(self) -> State:
        with self.mu:
            self._expire_locked()
            return self.state

    # -- the keeper
    def _keep(self) -> None:
        last = _now()  # the grant, then each keepalive sent
        while True:
            self.resume.wait()
            with self.mu:
                if self.done:
                    return
                self._expire_locked()
                lost = self.state is State.LOST
                deadline = self.deadline
            if lost:
                self._lose(self.lost_text, False)
                return
            now = _now()
            # Worked out again at every wake: a stream's end shortens it.
            period = self.period() if self.last_ok else min(self.period(), _RETRY_S)
            if now < last + period:
                self.wake.wait(min(last + period, deadline) - now)
                self.wake.clear()  # a release sets done first: the loop's top sees it
                continue
            last = _now()
            ok = self.keepalive(False)
            if ok is None:
                return
            self.last_ok = ok

    def keepalive(self, first: bool) -> Optional[bool]:
        """One keepalive: True when it confirmed the hold (a new deadline),
        False when it failed (SUSPECT, tried again), None when the hold is
        lost or done. @first: the confirmation of a grant not yet handed
        out, which may move a deadline already passed."""
        what = 'keep the hold of "%s"' % self.name
        cancel = RemoteCancel()
        with self.mu:
            if self.done:
                return None
            self.inflight = cancel
            deadline = self.deadline
        sent = _now()
        budget = self.client._t.timeout if first else min(self.client._t.timeout,
                                                          deadline - sent)
        try:
            ans = self.client._call("POST", "/v1/holds/%s/keepalive" % _q(self.id), None, what,
                                    read_timeout=max(budget, 0.001), cancel=cancel,
                                    connect_timeout=max(budget, 0.001))
        except (NotOwner, Lost) as e:
            self._lose("the daemon no longer keeps the hold (%s: %s): it was lost, expired "
                       "or released" % (e.name, e.text), True)
            return None
        except Unavailable as e:
            if getattr(e, "gone", False):
                self._lose("%s; nobody keeps the hold any more" % e.text, True)
                return None
            return self._failed(e)
        except Error as e:
            return self._failed(e)
        finally:
            with self.mu:
                self.inflight = None
        valid = _valid_s(ans, self.window)
        w = ans.get("window_ms")
        with self.mu:
            if self.done:
                return None
            if not first:
                self._expire_locked()  # LOST is final, even if this answer is good
            if self.state is State.LOST:
                lost = True
            else:
                lost = False
                self.deadline = sent + valid
                self.valid = valid
                if isinstance(w, int) and not isinstance(w, bool) and w > 0:
                    self.window = w / 1000.0
                    self.window_known = True
                self.state = State.SUSPECT if ans.get("state") == "suspect" else State.VALID
        if lost:
            self._lose(self.lost_text, False)
            return None
        return True

    def _failed(self, e: Error) -> bool:
        with self.mu:
            if not self.done and self.state is State.VALID:
                self.state = State.SUSPECT
        log.debug("cerberus: keepalive of %r failed (tried again until its deadline): %s",
                  self.name, e)
        return False

    def _lose(self, text: str, forgotten: bool) -> None:
        """LOST (if not already, as a read may have made it) and the
        callback, once."""
        with self.mu:
            if self.done:
                return
            if self.state is not State.LOST:
                self.state = State.LOST
                self.lost_text = text
            self.forgotten = self.forgotten or forgotten
            cb, self.called = (None if self.called else self.callback), True
        if cb is not None:
            self._call(cb)

    def _call(self, cb: Callable[[Any], Any]) -> None:
        hold = self.owner() if self.owner is not None else None
        if hold is None:
            return
        try:
            cb(hold)
        except Exception:  # noqa: BLE001 - logged, as the library's callbacks are
            log.exception("cerberus: the on_lost callback of %r raised", self.name)

    # -- the hold's side
    def on_lost(self, callback: Optional[Callable[[Any], Any]]) -> None:
        with self.mu:
            if self.done:
                raise InvalidArgument(Status.EINVAL, "the hold is released", "on_lost")
            self.callback = callback
            self._expire_locked()
            now = callback is not None and self.state is State.LOST and not self.called
            if now:
                self.called = True
        if now:
            assert callback is not None
            self._call(callback)

    def release(self) -> None:
        what = 'release "%s"' % self.name
        with self.mu:
            if self.done:
                raise NotOwner(Status.NOT_OWNER, 'the hold of "%s" is not held: it was already '
                               'released' % self.name, "release")
            self._expire_locked()
            self.done = True
            lost = self.state is State.LOST
            forgotten, lost_text = self.forgotten, self.lost_text
            inflight = self.inflight
            stream = self.stream
        self.wake.set()
        self.stopping.set()
        self.resume.set()
        if inflight is not None:
            inflight.fire()  # the keepalive in flight ends now, not at its deadline
        _shutdown(stream)  # so does the listener's stream
        try:
            if forgotten:
                raise Lost(Status.LOST, lost_text, what)
            try:
                self.client._call("DELETE", "/v1/holds/%s" % _q(self.id), None, what,
                                  closing_ok=True)
            except NotOwner:
                raise Lost(Status.LOST, "the daemon no longer knows the hold: it expired (not "
                           "kept alive within its lease) or the daemon restarted",
                           what) from None
            except Error:
                if not lost:
                    raise
                # Lost already: that is the news, whatever the DELETE met.
            if lost:
                # The daemon may still have had it (a deadline is
                # conservative), but the name may have been another's
                # meanwhile: the caller must know.
                raise Lost(Status.LOST, lost_text, what)
        except Error as e:
            self.error = e.text
            raise
        finally:
            with self.mu:
                self.state = State.FREE
                stream = self.stream
            _shutdown(stream)
            for th in (self.thread, self.listener):
                if th is not threading.current_thread() and th.is_alive():
                    th.join(self.client._t.timeout)
            self.client._forget(self)

    def close(self) -> None:
        if self.done:
            return
        try:
            self.release()
        except NotOwner:
            pass
        except Error as e:
            log.warning("cerberus: release of %r failed: %s", self.name, e)

    def stop(self) -> None:
        """For a close that could not release: stop keeping the hold."""
        with self.mu:
            self.done = True
            self.state = State.FREE
            inflight = self.inflight
            stream = self.stream
        self.wake.set()
        self.stopping.set()
        self.resume.set()
        if inflight is not None:
            inflight.fire()
        _shutdown(stream)


class RemoteHold:
    """One grant of a lock by ``cerberus serve``: what
    :meth:`RemoteLock.acquire` returns, with the interface of
    :class:`~cerberus.Hold`.

    Threads of its own keep the hold alive on the daemon with keepalives
    and its event stream (see the module's text); any thread may release
    it or read its state. It is a context manager (``with hold:`` releases at
    the end) and an asynchronous one. A hold garbage collected while still
    held is released soon after on a thread of the package; one still held
    when its client closes is released by the close.

    As Hold, ``state`` follows a conservative local deadline: the send time
    of the last confirmed keepalive (or of the grant) plus the ``valid_ms``
    the daemon answered. VALID before it while the last keepalive
    succeeded, SUSPECT before it after a failed one, LOST from it on (at
    every read, not only when the keeper looks) or once the daemon says the
    hold is lost or unknown. ``on_lost`` callbacks run on a thread of the
    hold's, at the deadline (or when the daemon's news comes first).
    """

    __slots__ = ("_core", "__weakref__")

    def __init__(self, core: _HoldCore) -> None:
        self._core = core
        core.owner = weakref.ref(self)

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None and not core.done:
            _reap(_HoldCore.close, core)

    @property
    def name(self) -> str:
        """The lock name this hold is for."""
        return self._core.name

    @property
    def fencing_token(self) -> int:
        """The grant's fencing token (the daemon sends it as a decimal
        string; here an int, as Hold's); readable after release."""
        return self._core.token

    @property
    def engine(self) -> str:
        """The engine the daemon granted it on (not in Hold)."""
        return self._core.engine

    @property
    def hold_id(self) -> str:
        """The daemon's id of the hold (not in Hold)."""
        return self._core.id

    @property
    def state(self) -> State:
        """:class:`~cerberus.State`: VALID, SUSPECT or LOST while held, FREE
        once released; LOST from the local deadline on (see the class).
        Never blocks."""
        return self._core.current()

    @property
    def held(self) -> bool:
        """True until the hold is released (even when lost: release it)."""
        return not self._core.done

    @property
    def error(self) -> str:
        """The error text of the release that failed, or ``""``."""
        return self._core.error

    def on_lost(self, callback: Optional[Callable[["RemoteHold"], Any]]) -> None:
        """Call ``callback(hold)`` once if the hold is lost; set while it is
        already lost, it is called at once on this thread. It runs on a
        thread of the hold's (not the client's callback thread, as for
        Hold): keep it short. Exceptions are logged on the ``cerberus``
        logger. ``None`` removes it; not called once released."""
        self._core.on_lost(callback)

    def release(self) -> None:
        """Release the hold on the daemon (``DELETE /v1/holds/{id}``); from
        any thread.

        Raises:
            NotOwner: it was already released (or its client closed).
            Lost: it had been lost, or the daemon no longer knew it (it
                expired, the daemon restarted or stopped).
            Unavailable, IOFailure: the daemon could not be reached or did
                not answer; it releases the hold when its lease passes
                without a keepalive. The hold is done either way.
        """
        self._core.release()

    async def release_async(self) -> None:
        """:meth:`release` on a thread of the client's, off the event loop;
        a cancellation of the awaiting task does not stop it."""
        await _settle(_in_thread(self._core.client, "short", self._core.release))

    def close(self) -> None:
        """Release if still held; a failure is logged, not raised."""
        self._core.close()

    _discard = close

    def _pause_keeper(self) -> None:
        """Tests: stop keeping the hold (no keepalive is sent and the event
        stream is closed until _resume_keeper; a keepalive in flight is
        ended), as a caller that stalls would."""
        c = self._core
        with c.mu:  # the listener sets its stream under it, and then looks
            c.resume.clear()
            inflight = c.inflight
            stream = c.stream
        if inflight is not None:
            inflight.fire()
        _shutdown(stream)

    def _resume_keeper(self) -> None:
        self._core.resume.set()

    def __enter__(self) -> "RemoteHold":
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        _exit_release(self, et is not None)

    async def __aenter__(self) -> "RemoteHold":
        return self

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self._core.done:
            return
        await _settle(_in_thread(self._core.client, "short", _exit_release, self,
                                 et is not None))

    def __repr__(self) -> str:
        return "<cerberus.RemoteHold %r token=%d %s>" % (self.name, self.fencing_token,
                                                         self.state.name)


def _exit_release(hold: RemoteHold, failing: bool) -> None:
    """As client._exit_release: a failing release is only logged when the
    block's own exception is on its way out."""
    if hold._core.done:
        return
    try:
        hold.release()
    except NotOwner:
        pass
    except Error:
        if not failing:
            raise
        log.warning("cerberus: release of %r failed while an exception propagated: %s",
                    hold.name, hold.error)


def _in_thread(client: "RemoteClient", kind: str, fn: Callable[..., T],
               *args: Any) -> "asyncio.Future[T]":
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(client._executor(kind), functools.partial(fn, *args))


# ------------------------------------------------------------------ locks

class RemoteLock:
    """A named lock of a :class:`RemoteClient`: a factory of
    :class:`RemoteHold`, with the interface of :class:`~cerberus.Lock`.
    Holds are not reentrant: a second acquisition of the name waits for the
    first hold's release, from this process too (the daemon has one client
    for every caller)."""

    def __init__(self, client: "RemoteClient", name: str, wait: Optional[float],
                 lease_ms: Optional[int]) -> None:
        self._client = client
        self._name = _check_name(name, "a lock name")
        wait_ms(wait)
        self._wait = wait
        self._lease_ms = _lease(lease_ms)
        self._tls = threading.local()

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._name

    @property
    def client(self) -> "RemoteClient":
        """The client the lock belongs to."""
        return self._client

    def acquire(self, wait: Optional[float] = DEFAULT,
                cancel: Optional[RemoteCancel] = None) -> RemoteHold:
        """Acquire the name for a new :class:`RemoteHold`; the daemon waits
        (no polling here). ``wait`` as for Lock.acquire: seconds, ``None``
        without limit (asked an hour at a time, the daemon's longest), ``0``
        one try.

        @cancel is a :class:`RemoteCancel` (a library Cancel cannot be used
        here); firing it, or Ctrl-C, closes the request's connection: the
        call raises Interrupted (KeyboardInterrupt), and a grant that
        landed anyway stays with the daemon until its lease passes.

        Raises: Busy, Timeout, Interrupted, Unavailable (no daemon, naming
        its address; or no engine), IOFailure, InvalidArgument (a bad name),
        Unauthorized (token).
        """
        ms = wait_ms(self._wait if wait is DEFAULT else wait)
        return self._client._acquire(self._name, ms, self._lease_ms, cancel)

    async def acquire_async(self, wait: Optional[float] = DEFAULT) -> RemoteHold:
        """:meth:`acquire` on a thread of the client's; cancelling the
        awaiting task closes the request's connection (see
        :meth:`RemoteClient.alock`)."""
        ms = wait_ms(self._wait if wait is DEFAULT else wait)
        return await self._client._acquire_async(self._name, ms, self._lease_ms)

    def close(self) -> None:
        """Nothing to free (a remote lock is only a name)."""

    def __enter__(self) -> RemoteHold:
        hold = self.acquire()
        stack = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        stack.append(hold)
        return hold

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        _exit_release(self._tls.stack.pop(), et is not None)

    def __repr__(self) -> str:
        return "<cerberus.RemoteLock %r>" % self._name


def _lease(lease_ms: Optional[int]) -> Optional[int]:
    if lease_ms is None:
        return None
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int):
        raise TypeError("lease_ms must be an int of milliseconds or None, not %r" % (lease_ms,))
    return lease_ms


class _RemoteAsyncLock:
    """What :meth:`RemoteClient.alock` returns."""

    def __init__(self, client: "RemoteClient", name: str, wait: Optional[float],
                 lease_ms: Optional[int]) -> None:
        self._client = client
        self._name = _check_name(name, "a lock name")
        self._ms = wait_ms(wait)
        self._lease_ms = _lease(lease_ms)
        self._hold: Optional[RemoteHold] = None

    async def __aenter__(self) -> RemoteHold:
        if self._hold is not None:
            raise RuntimeError("this alock() is already entered; call client.alock() again")
        self._hold = await self._client._acquire_async(self._name, self._ms, self._lease_ms)
        return self._hold

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            await hold.__aexit__(et, ev, tb)
