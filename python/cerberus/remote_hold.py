"""remote_hold.py — RemoteLock and RemoteHold: a RemoteClient's locks and
the holds the daemon grants, and the keeper thread that keeps each hold.

The daemon releases a hold whose caller neither listens to its event stream
nor keeps it alive within its lease. The keeper (one thread per hold) keeps
``GET /v1/holds/{id}/events`` open while the hold is held: the open stream
keeps the hold, and says ``event: lost`` when the daemon's library loses
it. A stream that ends is reopened (SUSPECT meanwhile, pauses growing from
50 ms to 1 s); the hold is LOST when the daemon says it no longer knows it
(404, 410), when the daemon is gone (its socket refuses or no longer
exists: nobody keeps the hold), or when no stream was open for the hold's
lease (the daemon has released it by then). LOST means: ``state`` LOST,
``on_lost`` called once on the keeper thread, ``release`` raising Lost.
A release sets the hold done before its DELETE (so the stream's end is not
taken for a loss), then closes the stream and joins the keeper.

The keeper refers to a _HoldCore, not to the RemoteHold, so a hold dropped
while held is collected and released by the package's reaper thread.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from .client import DEFAULT, State, _reap, _settle, wait_ms
from .errors import Error, InvalidArgument, Lost, NotOwner, Status, Unavailable
from .remote_http import _check_name, _q, _shutdown

if TYPE_CHECKING:
    from .remote import RemoteClient
    from .remote_http import RemoteCancel

log = logging.getLogger("cerberus")
T = TypeVar("T")

# The keepalive window of a hold acquired without lease_ms (the daemon's
# CERB_SERVE_DEFAULT_WINDOW_MS).
_DEFAULT_WINDOW_S = 10.0
# An event stream says `event: heartbeat` every 5 s: one silent for this
# long is taken for dead and reopened.
_STREAM_SILENCE_S = 15.0

class _HoldCore:
    """What a RemoteHold's keeper thread shares with it (the thread refers
    to this, not to the RemoteHold, so a hold dropped unreleased can be
    collected and released)."""

    def __init__(self, client: "RemoteClient", name: str, hid: str, token: int,
                 engine: str, window: float) -> None:
        self.client = client
        self.name = name
        self.id = hid
        self.token = token
        self.engine = engine
        self.window = window
        self.mu = threading.Lock()
        self.wake = threading.Event()  # ends the keeper's pauses (a release)
        self.state = State.VALID
        self.done = False       # released (or being released): the keeper stops
        self.forgotten = False  # the daemon does not know the hold any more
        self.lost_text = ""
        self.error = ""
        self.callback: Optional[Callable[[Any], Any]] = None
        self.called = False
        self.owner: Optional["weakref.ref[RemoteHold]"] = None
        self.stream: Optional[http.client.HTTPConnection] = None
        self.resume = threading.Event()  # a test's pause of the keeper (_pause_keeper)
        self.resume.set()
        self.thread = threading.Thread(target=self._keep, daemon=True,
                                       name="cerberus-remote-hold")

    # -- the keeper
    def _keep(self) -> None:
        t = self.client._t
        path = "/v1/holds/%s/events" % _q(self.id)
        what = 'keep the hold of "%s"' % self.name
        pause = 0.05
        last_ok = time.monotonic()
        while True:
            self.resume.wait()
            if self.done:
                return
            try:
                conn = t.connect(what, _STREAM_SILENCE_S)
            except Unavailable as e:
                if getattr(e, "gone", False):
                    self._lose("%s; nobody keeps the hold any more" % e.text, True)
                    return
            else:
                try:
                    with self.mu:
                        if self.done:
                            conn.close()
                            return
                        if not self.resume.is_set():  # paused meanwhile (a test)
                            conn.close()
                            continue
                        self.stream = conn
                    conn.request("GET", path, headers=t.headers(False, "text/event-stream"))
                    resp = conn.getresponse()
                    if resp.status in (404, 410):
                        err = t.error(resp.status, resp.read(), what)
                        self._lose("the daemon no longer keeps the hold (%s: %s): it expired "
                                   "or was released" % (err.name, err.text), resp.status == 404)
                        return
                    if resp.status == 200:
                        while True:
                            line = resp.readline()
                            if not line:
                                break  # the stream ended: reopen it, or learn why not
                            line = line.strip()
                            if line.startswith(b"event:"):
                                last_ok = time.monotonic()
                                pause = 0.05
                                self._valid()
                            if line == b"event: lost":
                                self._lose("the daemon reports the hold lost (its lease or "
                                           "session ended while held)", False)
                                return
                    else:
                        resp.read()
                except (OSError, http.client.HTTPException):
                    pass  # the stream broke: reopen it
                finally:
                    with self.mu:
                        self.stream = None
                    conn.close()
            if self.done:
                return
            if time.monotonic() - last_ok > self.window:
                self._lose("no event stream could be kept open for the hold's lease (%g s): "
                           "the daemon has released it" % self.window, True)
                return
            with self.mu:
                if not self.done and self.state is State.VALID:
                    self.state = State.SUSPECT
            self.wake.wait(pause)
            pause = min(pause * 2, 1.0)

    def _valid(self) -> None:
        with self.mu:
            if not self.done and self.state is State.SUSPECT:
                self.state = State.VALID

    def _lose(self, text: str, forgotten: bool) -> None:
        with self.mu:
            if self.done or self.state is State.LOST:
                return
            self.state = State.LOST
            self.lost_text = text
            self.forgotten = forgotten
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
            self.done = True
            forgotten, lost_text = self.forgotten, self.lost_text
        self.wake.set()
        self.resume.set()
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
        except Error as e:
            self.error = e.text
            raise
        finally:
            with self.mu:
                self.state = State.FREE
                stream = self.stream
            _shutdown(stream)
            if self.thread is not threading.current_thread() and self.thread.is_alive():
                self.thread.join(self.client._t.timeout)
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
            stream = self.stream
        self.wake.set()
        self.resume.set()
        _shutdown(stream)


class RemoteHold:
    """One grant of a lock by ``cerberus serve``: what
    :meth:`RemoteLock.acquire` returns, with the interface of
    :class:`~cerberus.Hold`.

    The daemon keeps the hold while this object keeps its event stream open
    (a thread of its own, see the module's text); any thread may release it
    or read its state. It is a context manager (``with hold:`` releases at
    the end) and an asynchronous one. A hold garbage collected while still
    held is released soon after on a thread of the package; one still held
    when its client closes is released by the close.

    Differences from Hold: ``state`` is VALID while the daemon's stream is
    open, SUSPECT while it is being reopened, LOST once the daemon says so,
    no longer knows the hold, or cannot be reached for the hold's lease;
    ``on_lost`` callbacks run on the hold's keeper thread.
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
        once released. Never blocks."""
        return self._core.state

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
        already lost, it is called at once on this thread. It runs on the
        hold's keeper thread (not the client's callback thread, as for
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
        """Tests: stop keeping the hold (its event stream is closed and not
        reopened until _resume_keeper), as a caller that stalls would."""
        c = self._core
        with c.mu:  # the keeper sets its stream under it, and then looks
            c.resume.clear()
            stream = c.stream
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
