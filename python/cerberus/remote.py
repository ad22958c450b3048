"""remote.py — RemoteClient: the package's interface over ``cerberus serve``.

``RemoteClient(address)`` speaks the daemon's HTTP/1.1 + JSON API
(DESIGN.md §15, docs/operations.md) with the standard library only:
``http.client`` over a TCP connection, or over an AF_UNIX socket (a
subclass of HTTPConnection whose ``connect`` makes one). It needs no
libcerberus in the process: nothing here touches ``_lib``, and errors are
made from the binding's own table of status names (errors.py).

Requests. Every request opens a connection of its own (``Connection:
close``) and closes it once answered: no pool to go stale, any thread may
make one, and a request in flight can be ended from another thread by
shutting its socket down (a :class:`RemoteCancel`, a client's close, a
cancelled asyncio task). Connecting is bounded by ``timeout``; an answer
by ``timeout`` too, plus the acquisition's wait for an acquisition. A
daemon that cannot be reached is :class:`~cerberus.Unavailable` naming the
address; an answer that did not come is :class:`~cerberus.IOFailure`.
Error answers (``{"status": NAME, "error": TEXT}``) become the exception
class of that status, as :class:`~cerberus.Client` raises; HTTP 401 is
:class:`~cerberus.Unauthorized`.

Holds. The daemon releases a hold whose caller neither listens to its
event stream nor keeps it alive within its lease. So every
:class:`RemoteHold` has a thread (the keeper) that keeps
``GET /v1/holds/{id}/events`` open for as long as the hold is held: the
open stream keeps the hold, and the stream says ``event: lost`` when the
daemon's library loses it. The keeper reopens a stream that ended (the
hold is SUSPECT meanwhile, pauses growing from 50 ms to 1 s) and decides
the hold LOST when the daemon says it no longer knows it (404, 410), when
the daemon is gone (the socket refuses or no longer exists: nobody keeps
the hold any more), or when no stream has been open for the hold's lease
(the daemon has released it by then). Lost means: ``state`` LOST, the
``on_lost`` callback called once on the keeper thread, ``release`` raising
Lost. A release ends the keeper (it closes the stream once the DELETE was
answered).

Nothing in a log line or an exception carries the bearer token.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import errno
import functools
import http.client
import json
import logging
import math
import os
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar, Union
from urllib.parse import quote, urlsplit

from .client import (DEFAULT, Breaker, ClientStatus, EngineStatus, Holder, State, _reap,
                     _reaper, _settle, wait_ms)
from .errors import (Error, Interrupted, InvalidArgument, IOFailure, Lost, NotOwner,
                     ProtocolError, Status, Timeout, Unauthorized, Unavailable, error_for)

log = logging.getLogger("cerberus")
T = TypeVar("T")

# The daemon's limits (serve/serve_routes.c): the longest wait one request
# may ask for, and the keepalive window of a hold acquired without lease_ms.
_MAX_WAIT_MS = 3600000
_DEFAULT_WINDOW_S = 10.0
# An event stream says `event: heartbeat` every 5 s: one silent for this
# long is taken for dead and reopened.
_STREAM_SILENCE_S = 15.0

# HTTP codes of error answers whose body did not say the status.
_BY_HTTP = {409: Status.BUSY, 408: Status.TIMEOUT, 503: Status.UNAVAILABLE,
            400: Status.EINVAL, 404: Status.NOT_OWNER, 410: Status.LOST}


def _not_remote(what: str, why: str) -> NotImplementedError:
    return NotImplementedError("RemoteClient.%s is not available over cerberus serve: %s"
                               % (what, why))


def _q(part: Union[str, bytes]) -> str:
    """One path segment, percent-encoded (a / in a name stays in it)."""
    return quote(part, safe="")


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError("%s is a str, not %s" % (what, type(name).__name__))
    if "\0" in name:
        raise InvalidArgument(Status.EINVAL, "%s contains a NUL character at offset %d"
                              % (what, name.index("\0")))
    return name


# ------------------------------------------------------------- transport

class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: http.client with its connect replaced."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _shutdown(conn: Optional[http.client.HTTPConnection]) -> None:
    """Wake a thread blocked on @conn's socket (from any thread)."""
    sock = getattr(conn, "sock", None) if conn is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class RemoteCancel:
    """Ends one request of a :class:`RemoteClient` in flight (the remote
    counterpart of :class:`~cerberus.Cancel`, which needs the library).

    :meth:`fire` it from any thread: the request's connection is shut down
    and the call raises :class:`~cerberus.Interrupted`. Unlike a library
    cancel, the daemon cannot give back a grant that landed as the
    connection closed: such a hold is released by the daemon when its
    lease passes (nobody keeps it alive), so give acquisitions that may be
    cancelled a short ``lease_ms``. Firing is final.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._fired = False
        self._conn: Optional[http.client.HTTPConnection] = None
        self._error = ""

    def fire(self) -> None:
        """End the request using this cancel (never waits)."""
        with self._mu:
            self._fired = True
            conn = self._conn
        _shutdown(conn)

    @property
    def fired(self) -> bool:
        """Whether :meth:`fire` was called."""
        return self._fired

    @property
    def error(self) -> str:
        """The error text of the last call this cancel was passed to."""
        return self._error

    def close(self) -> None:
        """Nothing to free (for the interface of Cancel)."""

    def __enter__(self) -> "RemoteCancel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _attach(self, conn: http.client.HTTPConnection) -> bool:
        with self._mu:
            if self._fired:
                return False
            self._conn = conn
            return True

    def _detach(self) -> None:
        with self._mu:
            self._conn = None


class _Transport:
    """The daemon's address, the token and the bounds: makes connections
    and requests, and turns failures and error answers into exceptions."""

    def __init__(self, address: str, token: Optional[str], timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self.unix: Optional[str] = None
        self.host = ""
        self.port = 0
        if address.startswith("unix:"):
            path = address[len("unix:"):]
            if path.startswith("//"):  # unix:///run/x.sock
                path = path[2:]
            if not path:
                raise ValueError("a unix: address needs a socket path: unix:/run/cerberus/"
                                 "cerberus.sock")
            self.unix = path
        elif address.startswith("http://"):
            u = urlsplit(address)
            try:
                port = u.port
            except ValueError as e:
                raise ValueError("bad port in %r: %s" % (address, e)) from None
            if not u.hostname or not port or u.path not in ("", "/") or u.query:
                raise ValueError("a TCP address is http://HOST:PORT (such as "
                                 "http://127.0.0.1:8080), not %r" % address)
            self.host, self.port = u.hostname, port
        else:
            raise ValueError("the address of cerberus serve is unix:PATH or http://HOST:PORT, "
                             "not %r" % address)
        self._auth = "Bearer " + token if token else None

    def connect(self, what: str, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        """A connected connection; Unavailable naming the address (its
        ``gone`` attribute true when nothing listens there) when not."""
        t = self.timeout if timeout is None else timeout
        conn: http.client.HTTPConnection
        if self.unix is not None:
            conn = _UnixConnection(self.unix, t)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=t)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            reason = e.strerror or str(e) or type(e).__name__
            if isinstance(e, socket.timeout):
                reason = "no connection within %g s" % t
            err = Unavailable(Status.UNAVAILABLE, "cannot reach the cerberus daemon at %s: %s"
                              % (self.address, reason), what)
            err.gone = e.errno in (errno.ENOENT, errno.ECONNREFUSED)  # type: ignore[attr-defined]
            raise err from None
        return conn

    def headers(self, body: bool, accept: str = "application/json") -> Dict[str, str]:
        h = {"Accept": accept, "Connection": "close"}
        if body:
            h["Content-Type"] = "application/json"
        if self._auth:
            h["Authorization"] = self._auth
        return h

    def request(self, method: str, path: str, body: Optional[dict], what: str,
                read_timeout: float, cancel: RemoteCancel) -> Tuple[str, bytes]:
        """One request: (content type, body) of a 200 answer; raises the
        answer's error, Unavailable (no daemon), IOFailure (no answer) or
        Interrupted (@cancel fired)."""
        if cancel.fired:
            raise Interrupted(Status.INTERRUPTED, "the cancel was fired", what)
        conn = self.connect(what)
        try:
            if not cancel._attach(conn):
                raise Interrupted(Status.INTERRUPTED, "the cancel was fired", what)
            try:
                assert conn.sock is not None
                conn.sock.settimeout(read_timeout)
                payload = None if body is None else json.dumps(body).encode("utf-8")
                conn.request(method, path, body=payload, headers=self.headers(payload is not None))
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as e:
                if cancel.fired:
                    cancel._error = ("cancelled: the connection was closed; a grant that lands "
                                     "anyway is released by the daemon when its lease passes")
                    raise Interrupted(Status.INTERRUPTED, cancel._error, what) from None
                if isinstance(e, socket.timeout):
                    text = ("the cerberus daemon at %s did not answer within %g s"
                            % (self.address, read_timeout))
                else:
                    text = ("the connection to the cerberus daemon at %s failed: %s"
                            % (self.address, str(e) or type(e).__name__))
                raise IOFailure(Status.EIO, text, what) from None
            finally:
                cancel._detach()
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "") or ""
        if resp.status == 200:
            cancel._error = ""
            return ctype, data
        err = self.error(resp.status, data, what)
        cancel._error = err.text
        raise err

    def error(self, code: int, data: bytes, what: str) -> Error:
        """The exception for an error answer."""
        body: Any = None
        try:
            body = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            pass
        if not isinstance(body, dict):
            body = {}
        name = body.get("status")
        text = body.get("error") if isinstance(body.get("error"), str) else ""
        if code == 401 or name == "UNAUTHORIZED":
            return Unauthorized(Status.EINVAL, text or "the daemon at %s wants another token"
                                % self.address, what)
        if isinstance(name, str) and name in Status.__members__ and name != "OK":
            st = Status[name]
        else:
            st = _BY_HTTP.get(code, Status.EPROTO)
            if not body:
                text = ("HTTP %d from the cerberus daemon at %s: %r"
                        % (code, self.address, data[:200]))
        if code == 404 and text == "no such route":
            text = ("the cerberus daemon at %s has no such route: it is older than this "
                    "client, or the request is not one it serves" % self.address)
        return error_for(st, text, what)


def _json(ctype: str, data: bytes, what: str) -> Dict[str, Any]:
    try:
        v = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        v = None
    if not isinstance(v, dict):
        raise ProtocolError(Status.EPROTO, "the daemon answered %r (%s), not a JSON object"
                            % (data[:200], ctype or "no content type"), what)
    return v


# ------------------------------------------------------------------ holds

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


# ------------------------------------------------------------------ client

_clients: "weakref.WeakSet[RemoteClient]" = weakref.WeakSet()


def _renew(flag: Optional[bool], what: str) -> None:
    if flag is not None:
        raise _not_remote("lock(%s=...)" % what, "the daemon's configuration sets lock.%s "
                          "for every caller; leave %s=None" % (what, what))


class RemoteClient:
    """A client of ``cerberus serve`` with the interface of
    :class:`~cerberus.Client`, over the standard library only: it needs no
    libcerberus in this process.

    Args:
        address: ``unix:/run/cerberus/cerberus.sock`` (a unix socket) or
            ``http://127.0.0.1:PORT`` (loopback TCP, which needs a token).
        token: the bearer token of TCP (never logged nor shown).
        token_file: a file whose first line is the token (the daemon's
            ``--token-file``); not with @token.
        timeout: seconds to connect, and to wait for an answer beyond an
            acquisition's own wait.
        async_threads: how many asyncio acquisitions may wait at once.

    The daemon is asked ``GET /healthz`` here, so a missing daemon or a
    wrong token is told at once: Unavailable (naming the address) or
    Unauthorized. Every request opens its own connection: share one
    RemoteClient between threads and tasks freely. Use it as a context
    manager, or call :meth:`close`, which releases the holds still held.
    A RemoteClient belongs to the process that made it: in a child made by
    ``fork()`` make a new one.
    """

    def __init__(self, address: str, *, token: Optional[str] = None,
                 token_file: Optional[Union[str, "os.PathLike[str]"]] = None,
                 timeout: float = 10.0, async_threads: int = 64) -> None:
        if not isinstance(address, str):
            raise TypeError("address must be str, not %s" % type(address).__name__)
        if token is not None and token_file is not None:
            raise ValueError("give a token or a token file, not both")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not timeout > 0 or math.isinf(timeout):
            raise ValueError("timeout must be a positive number of seconds, not %r" % (timeout,))
        if isinstance(async_threads, bool) or not isinstance(async_threads, int) \
                or async_threads < 1:
            raise ValueError("async_threads must be a positive int, not %r" % (async_threads,))
        if token_file is not None:
            token = _read_token(token_file)
        elif token is not None and (not isinstance(token, str) or not token
                                    or any(c in token for c in "\r\n\0")):
            raise ValueError("token must be a non-empty str of one line")
        self._t = _Transport(address, token, float(timeout))
        self._pid = os.getpid()
        self._mu = threading.Lock()
        self._closing = False
        self._inflight: Set[RemoteCancel] = set()
        self._holds: Dict[int, _HoldCore] = {}
        self._pools: Dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._async_threads = async_threads
        _reaper.ensure()  # finalizers of holds hand their release to it
        self._call("GET", "/healthz", None, "connect")
        _clients.add(self)

    @property
    def address(self) -> str:
        """The daemon's address, as given."""
        return self._t.address

    # -- requests
    def _call(self, method: str, path: str, body: Optional[dict], what: str,
              read_timeout: Optional[float] = None, cancel: Optional[RemoteCancel] = None,
              closing_ok: bool = False, raw: bool = False) -> Any:
        """One request, registered in flight (a close ends it): the answer's
        JSON object, or its text with @raw."""
        if os.getpid() != self._pid:
            raise InvalidArgument(Status.EINVAL, "this RemoteClient was made in process %d, "
                                  "before fork(): make a new one in the child" % self._pid,
                                  what)
        c = cancel if cancel is not None else RemoteCancel()
        with self._mu:
            if self._closing and not closing_ok:
                raise InvalidArgument(Status.EINVAL, "the client is closed", what)
            self._inflight.add(c)
        try:
            ctype, data = self._t.request(method, path, body, what,
                                          self._t.timeout if read_timeout is None
                                          else read_timeout, c)
        finally:
            with self._mu:
                self._inflight.discard(c)
        if raw:
            return data.decode("utf-8", "replace")
        return _json(ctype, data, what)

    def _executor(self, kind: str) -> concurrent.futures.ThreadPoolExecutor:
        with self._mu:
            if self._closing:
                raise InvalidArgument(Status.EINVAL, "the client is closed")
            ex = self._pools.get(kind)
            if ex is None:
                ex = self._pools[kind] = concurrent.futures.ThreadPoolExecutor(
                    self._async_threads, thread_name_prefix="cerberus-remote-" + kind)
            return ex

    # -- holds
    def _acquire(self, name: str, ms: int, lease_ms: Optional[int],
                 cancel: Optional[RemoteCancel]) -> RemoteHold:
        if cancel is not None and not isinstance(cancel, RemoteCancel):
            raise TypeError("a RemoteClient's calls take a cerberus.RemoteCancel, not %s "
                            "(a library Cancel cannot end a request to the daemon)"
                            % type(cancel).__name__)
        what = 'acquire "%s"' % name
        path = "/v1/locks/%s/acquire" % _q(name)
        deadline = None if ms < 0 else time.monotonic() + ms / 1000.0
        while True:
            if deadline is None:
                chunk = _MAX_WAIT_MS
            else:
                chunk = min(_MAX_WAIT_MS, max(0, int(math.ceil((deadline - time.monotonic())
                                                               * 1000))))
                if ms == 0:
                    chunk = 0
            body: Dict[str, Any] = {"wait_ms": chunk}
            if lease_ms is not None:
                body["lease_ms"] = lease_ms
            try:
                ans = self._call("POST", path, body, what, chunk / 1000.0 + self._t.timeout,
                                 cancel)
                break
            except Timeout:
                # No limit, or more than the daemon's longest wait: ask again.
                if ms != 0 and (deadline is None or deadline - time.monotonic() > 0.001):
                    continue
                raise
        try:
            hid = ans["hold"]
            token = int(ans["fencing_token"])
            if not isinstance(hid, str) or not hid:
                raise ValueError(hid)
        except (KeyError, ValueError, TypeError):
            raise ProtocolError(Status.EPROTO, "the daemon's grant is not {hold, fencing_token}:"
                                " %r" % (ans,), what) from None
        engine = ans.get("engine") if isinstance(ans.get("engine"), str) else ""
        core = _HoldCore(self, name, hid, token, engine or "",
                         lease_ms / 1000.0 if lease_ms else _DEFAULT_WINDOW_S)
        hold = RemoteHold(core)
        with self._mu:
            closing = self._closing
            if not closing:
                self._holds[id(core)] = core
        if closing:  # granted as the client closed: given back
            core.close()
            raise Interrupted(Status.INTERRUPTED, "the client is closing", what)
        core.thread.start()
        return hold

    def _forget(self, core: _HoldCore) -> None:
        with self._mu:
            self._holds.pop(id(core), None)

    async def _acquire_async(self, name: str, ms: int, lease_ms: Optional[int]) -> RemoteHold:
        cancel = RemoteCancel()
        fut = _in_thread(self, "short" if ms == 0 else "wait", self._acquire, name, ms,
                         lease_ms, cancel)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancel.fire()  # the request's connection is closed: the call ends
            while not fut.done():
                try:
                    await asyncio.shield(fut)
                except BaseException:  # noqa: B902 - only its end matters here
                    pass
            if not fut.cancelled() and fut.exception() is None:
                hold = fut.result()  # granted just before the cancel: given back
                try:
                    await _settle(_in_thread(self, "short", hold.close))
                except Error:
                    pass
            raise

    # -- lifetime
    def close(self) -> None:
        """Close: requests in flight end (Interrupted), every hold still held
        is released (bounded: once the daemon fails to answer, the other
        holds are left to their lease). Idempotent."""
        with self._mu:
            self._closing = True
            inflight = list(self._inflight)
            holds = list(self._holds.values())
            pools, self._pools = list(self._pools.values()), {}
        for c in inflight:
            c.fire()
        failed = False
        for core in holds:
            if failed:
                core.stop()
                continue
            try:
                core.release()
            except (NotOwner, Lost):
                pass
            except Error as e:
                failed = True
                log.warning("cerberus: closing the RemoteClient of %s: release of %r failed: "
                            "%s; the other holds are left to their lease", self.address,
                            core.name, e)
        for p in pools:
            p.shutdown(wait=False)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closing

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- locks
    def lock(self, name: str, wait: Optional[float] = None, lease_ms: Optional[int] = None,
             *, renew: Optional[bool] = None, fair: Optional[bool] = None) -> RemoteLock:
        """A :class:`RemoteLock` for @name (the daemon is not asked yet).
        ``wait`` and ``lease_ms`` as for Client.lock; ``lease_ms`` is also
        how long the daemon keeps a hold whose keeper went silent (10 s when
        not given). ``renew`` and ``fair`` are the daemon's configuration:
        anything but None raises NotImplementedError."""
        _renew(renew, "renew")
        _renew(fair, "fair")
        return RemoteLock(self, name, wait, lease_ms)

    def alock(self, name: str, wait: Optional[float] = None, lease_ms: Optional[int] = None,
              *, renew: Optional[bool] = None, fair: Optional[bool] = None
              ) -> _RemoteAsyncLock:
        """``async with client.alock(name, wait=...) as hold:`` acquires on a
        thread of the client's (up to ``async_threads`` waits at once; tries
        and releases on threads of their own) and releases at the end.
        Cancelling the task closes the request's connection: the daemon may
        still grant it, and then releases the grant when its lease passes
        (nobody keeps it); a grant that reached this client first is
        released before CancelledError reaches you."""
        _renew(renew, "renew")
        _renew(fair, "fair")
        return _RemoteAsyncLock(self, name, wait, lease_ms)

    # -- the guard
    def guard(self, scope: str, key: Union[str, bytes], *, wait: Optional[float] = None,
              running: Optional[float] = None, keep: Optional[float] = None,
              on_unavailable: Optional[str] = None, cancel: Optional[RemoteCancel] = None
              ) -> "RemoteGuardContext":
        """The idempotency guard over the daemon
        (``POST /v1/guard/{scope}/{key}/begin|finish``), as
        :meth:`Client.guard`; @cancel is a :class:`RemoteCancel`."""
        return RemoteGuardContext(self, scope, key, wait=wait, running=running, keep=keep,
                                  on_unavailable=on_unavailable, cancel=cancel)

    def once(self, scope: str, key: Union[str, bytes, Callable[..., Union[str, bytes]], None]
             = None, *, text: bool = False, wait: Optional[float] = None,
             running: Optional[float] = None, keep: Optional[float] = None,
             on_unavailable: Optional[str] = None) -> Callable[[Callable[..., T]],
                                                               Callable[..., Any]]:
        """A decorator: the function runs once per key, as
        :meth:`Client.once`, through the daemon's guard."""
        from .guard import once
        return once(self, scope, key, text=text, wait=wait, running=running, keep=keep,
                    on_unavailable=on_unavailable)

    # -- engines
    @property
    def current_engine(self) -> str:
        """The daemon's current engine (``GET /v1/status``)."""
        cur = self._call("GET", "/v1/status", None, "status").get("current")
        return cur if isinstance(cur, str) else ""

    def status(self) -> ClientStatus:
        """The daemon's engines and current engine (``GET /v1/status``), as
        :class:`~cerberus.ClientStatus`. The daemon does not send the guard
        counters, ``gate_questions`` nor ``closed_epoch``: they read 0; a
        ``last_probe_us`` it has not measured reads -1."""
        ans = self._call("GET", "/v1/status", None, "status")
        engines = []
        for e in ans.get("engines") or []:
            if not isinstance(e, dict):
                continue

            def n(k: str, default: int = 0) -> int:
                v = e.get(k)
                return v if isinstance(v, int) and not isinstance(v, bool) else default

            br = str(e.get("breaker", "")).upper()
            engines.append(EngineStatus(
                name=str(e.get("name", "")), active=bool(e.get("active")),
                breaker=Breaker[br] if br in Breaker.__members__ else br,  # type: ignore[arg-type]
                last_probe_us=n("last_probe_us", -1), acquires=n("acquires"),
                failures=n("failures"), lost=n("lost"), acquire_calls=n("acquire_calls"),
                wakeups=n("wakeups"), handoffs=n("handoffs"),
                breaker_transitions=n("breaker_transitions"), switches=n("switches"),
                epoch=n("epoch"), wanted=bool(e.get("wanted")), guard_begins=n("guard_begins"),
                guard_duplicates=n("guard_duplicates"), guard_busy=n("guard_busy"),
                guard_degraded=n("guard_degraded"), gate_questions=n("gate_questions"),
                closed_epoch=n("closed_epoch")))
        cur = ans.get("current")
        return ClientStatus(current=cur if isinstance(cur, str) else "", engines=engines)

    def metrics_text(self) -> str:
        """The daemon's client in the Prometheus text format
        (``GET /metrics``)."""
        return self._call("GET", "/metrics", None, "metrics", raw=True)

    def inspect(self, name: str, engine: Optional[str] = None) -> List[Holder]:
        """Who holds @name and who waits (``GET /v1/locks/{name}``), as
        :meth:`Client.inspect`. The daemon asks every open engine; @engine
        keeps that engine's entries only. An engine that fails fails the
        whole call (no ``holders`` attribute on the error)."""
        _check_name(name, "a lock name")
        ans = self._call("GET", "/v1/locks/%s" % _q(name), None, 'inspect "%s"' % name)
        out = []
        for h in ans.get("holders") or []:
            if not isinstance(h, dict):
                continue
            try:
                fence = int(h.get("fence", 0))
            except (TypeError, ValueError):
                fence = 0
            ttl = h.get("ttl_ms")
            out.append(Holder(engine=str(h.get("engine", "")), owner=str(h.get("owner", "")),
                              waiting=bool(h.get("waiting")), fence=fence,
                              ttl_ms=ttl if isinstance(ttl, int) else -1,
                              detail=str(h.get("detail", ""))))
        if engine is not None:
            out = [h for h in out if h.engine == engine]
        return out

    def switch(self, engine: Optional[str] = None) -> str:
        """Move the daemon's new acquisitions to @engine (``POST
        /v1/switch``): every caller of the daemon, not only this client.
        Returns the engine now current. Raises InvalidArgument as
        Client.switch does."""
        body: Dict[str, Any] = {}
        if engine is not None:
            body["engine"] = _check_name(engine, "an engine name")
        ans = self._call("POST", "/v1/switch", body, "switch %s" % engine)
        to = ans.get("to")
        if not isinstance(to, str):
            raise ProtocolError(Status.EPROTO, "the daemon's answer has no \"to\": %r" % (ans,),
                                "switch %s" % engine)
        return to

    def reload(self) -> None:
        """Not available remotely: the daemon re-reads its configuration on
        SIGHUP (``systemctl reload cerberus``). Raises NotImplementedError."""
        raise _not_remote("reload()", "send the daemon SIGHUP (systemctl reload cerberus)")

    def on_switch(self, callback: Optional[Callable[[str, str, str], Any]]) -> None:
        """Not available remotely (the daemon has no stream of switches):
        poll :attr:`current_engine`. Raises NotImplementedError."""
        raise _not_remote("on_switch()", "the daemon does not report switches to its "
                          "callers; poll current_engine or status()")

    def __repr__(self) -> str:
        return "<cerberus.RemoteClient %s%s>" % (self.address, " closed" if self.closed else "")


def _read_token(path: Union[str, "os.PathLike[str]"]) -> str:
    """The first line of @path, as the daemon reads its --token-file."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            line = f.readline()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InvalidArgument(Status.EINVAL, "token file %s: %s" % (os.fspath(path), reason),
                              "RemoteClient") from None
    token = line.rstrip("\r\n")
    if not token:
        raise InvalidArgument(Status.EINVAL, "token file %s: the first line (the token) is "
                              "empty" % os.fspath(path), "RemoteClient")
    return token



@atexit.register
def _close_all_at_exit() -> None:
    """Release the holds of every RemoteClient still open."""
    for c in list(_clients):
        if c._pid != os.getpid():
            continue
        try:
            c.close()
        except BaseException:  # noqa: B902 - the others still get closed
            log.exception("cerberus: closing a RemoteClient at exit")


from .remote_guard import RemoteAttempt, RemoteGuardContext  # noqa: E402,F401 - uses the above
