"""remote.py — RemoteClient: the package's interface over ``cerberus serve``.

``RemoteClient(address)`` speaks the daemon's HTTP/1.1 + JSON API
(DESIGN.md §15, docs/operations.md) with the standard library only, and
needs no libcerberus in the process: nothing of it touches ``_lib``, and
errors are made from the binding's own table of status names (errors.py).
The parts: remote_http.py (connections, requests, errors), remote_hold.py
(locks, holds and the thread that keeps each hold on the daemon),
remote_guard.py (the idempotency guard), and this file: the client, which
maps each method of Client onto a route.

Every request opens a connection of its own and is registered in flight
while it runs: a close shuts every one down (the calls end Interrupted) and
releases the holds still held. An acquisition with no limit, or a longer
one than the daemon takes (an hour), is asked again in hour-long waits
until its deadline. asyncio runs the blocking calls on two thread pools of
the client ("wait" for acquisitions that may wait, "short" for tries and
releases, so a release never queues behind waits); a cancelled task fires
the request's RemoteCancel and gives back a grant that still reached it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, TypeVar, Union

from .client import Breaker, ClientStatus, EngineStatus, Holder, State, _reaper, _settle
from .errors import (Error, Interrupted, InvalidArgument, Lost, NotOwner, ProtocolError,
                     Status, Timeout)
from .remote_hold import (_DEFAULT_WINDOW_S, RemoteHold, RemoteLock, _HoldCore, _in_thread,
                          _now, _RemoteAsyncLock, _valid_s)
from .remote_http import RemoteCancel, _check_name, _json, _q, _Transport

log = logging.getLogger("cerberus")
T = TypeVar("T")

# The longest wait one request may ask the daemon for (serve_routes.c).
_MAX_WAIT_MS = 3600000


def _not_remote(what: str, why: str) -> NotImplementedError:
    return NotImplementedError("RemoteClient.%s is not available over cerberus serve: %s"
                               % (what, why))


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
              closing_ok: bool = False, raw: bool = False,
              connect_timeout: Optional[float] = None) -> Any:
        """One request, registered in flight (a close ends it): the answer's
        JSON object, or its text with @raw. @read_timeout and
        @connect_timeout default to the client's timeout."""
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
                                          else read_timeout, c, connect_timeout)
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
            sent = _now()  # the grant's deadline counts from here (remote_hold.py)
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
        w = ans.get("window_ms")  # the daemon's window, if it says
        if isinstance(w, int) and not isinstance(w, bool) and w > 0:
            window, known = w / 1000.0, True
        else:
            window = lease_ms / 1000.0 if lease_ms else _DEFAULT_WINDOW_S
            known = bool(lease_ms)
        valid = _valid_s(ans, window)
        core = _HoldCore(self, name, hid, token, engine or "", window, sent, valid, known)
        if _now() - sent > valid / 4.0:
            # The grant came long after its request was sent (a blocking
            # wait): its deadline would be short or past already. One
            # keepalive confirms it before anyone relies on it.
            if core.keepalive(True) is None or core.current() is State.LOST:
                text = core.lost_text
                core.close()
                raise Lost(Status.LOST, "granted, but lost before the grant could be "
                           "confirmed: %s" % text, what)
        hold = RemoteHold(core)
        with self._mu:
            closing = self._closing
            if not closing:
                self._holds[id(core)] = core
        if closing:  # granted as the client closed: given back
            core.close()
            raise Interrupted(Status.INTERRUPTED, "the client is closing", what)
        core.start()
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
__all__ = ["RemoteClient", "RemoteLock", "RemoteHold", "RemoteCancel", "RemoteAttempt"]
