"""remote_guard.py — the idempotency guard of a RemoteClient, over
``cerberus serve``: ``POST /v1/guard/{scope}/{key}/begin`` and ``/finish``
(scope and key percent-encoded in the path).

The model is guard.py's (docs/guard.md): the first caller claims the
operation and runs the block; others are told Busy and ask again after a
growing pause (50 ms doubling up to 1 s) until their ``wait`` runs out;
once it succeeded they get :class:`~cerberus.Duplicate` with the stored
result. The daemon answers a begin with ``{"state": "run", "attempt",
"degraded"}`` or ``{"state": "duplicate", "result" | "result_base64"}``;
a finish takes ``{"attempt", "succeeded", "result" | "result_base64"}``
(base64 when the result is not UTF-8 text).

A running attempt's claim must be kept alive on the daemon, which frees
an attempt (counts it failed: another caller may run the operation) once
its window passes without a keepalive. The begin answers that window
(``window_ms``: ``running`` when given, else the daemon's
serve.keepalive_ms), and each ``POST /v1/guard/attempts/{id}/keepalive``
answers it again. A thread of the attempt keeps it alive every third of
the window, and the attempt has a local deadline as a hold has (see
remote_hold.py): the send time of the last confirmed keepalive (or of the
begin) plus the window — the daemon cannot have freed it before. ``state``
is VALID before the deadline while the last keepalive succeeded, SUSPECT
after a failed one (tried again every 100 ms, each bounded by the
deadline), LOST from the deadline on (at every read), or at once when the
daemon answers 410 (the claim was lost), 404 (it freed the attempt) or the
state "lost"; ``on_lost`` fires once, on that thread, at the deadline.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Union

from .client import State, wait_ms
from .errors import (Busy, Duplicate, Error, Interrupted, IOFailure, Lost,
                     NotOwner, ProtocolError, Status, Unavailable)
from .guard import Result, _as_bytes, _ms
from .remote_hold import _now

if TYPE_CHECKING:
    from .remote import RemoteClient
    from .remote_http import RemoteCancel

log = logging.getLogger("cerberus")

# The window of an attempt when a (very old) daemon's begin does not say
# and `running` is not given.
_DEFAULT_WINDOW_S = 6.0
# The shortest keepalive period, and the pause before a failed keepalive
# is tried again.
_MIN_PERIOD_S = 0.05
_RETRY_S = 0.1


def _path(scope: str, key: bytes, verb: str) -> str:
    from .remote_http import _q
    return "/v1/guard/%s/%s/%s" % (_q(scope), _q(key), verb)


def _result_field(data: bytes) -> Dict[str, str]:
    try:
        return {"result": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"result_base64": base64.b64encode(data).decode("ascii")}


class RemoteAttempt:
    """A running attempt at a guarded operation on the daemon: what ``with
    remote_client.guard(...) as attempt:`` gives the block, with the
    interface of :class:`~cerberus.Attempt` (``result``, ``degraded``,
    ``state``, ``on_lost``). ``on_lost`` runs on the attempt's keepalive
    thread."""

    def __init__(self, client: "RemoteClient", scope: str, key: bytes, attempt: str,
                 degraded: bool, window: float, sent: float) -> None:
        self._client = client
        self.scope = scope
        self._key = key
        self._id = attempt
        self._degraded = degraded
        self._result: Result = None
        self._data = b""
        self._mu = threading.Lock()
        self._state = State.VALID
        self._window = window
        self._deadline = sent + window  # _now() of the last good send + the window
        self._lost_text = ""
        self._done = False
        self._callback: Optional[Callable[[Any], Any]] = None
        self._called = False
        self._stop = threading.Event()
        self._inflight: Optional["RemoteCancel"] = None
        self._thread = threading.Thread(target=self._keep, daemon=True,
                                        name="cerberus-remote-attempt")
        self._thread.start()

    @property
    def result(self) -> Result:
        """What the success stores, as set (see Attempt.result)."""
        return self._result

    @result.setter
    def result(self, value: Result) -> None:
        try:
            data = _as_bytes(value, "attempt.result")
        except UnicodeEncodeError as e:
            raise TypeError("attempt.result: a str that UTF-8 cannot encode (%s)" % e) from None
        self._result, self._data = value, data

    @property
    def degraded(self) -> bool:
        """True when the daemon let it run unprotected (``on_unavailable``
        ``"allow"`` and no engine could tell)."""
        return self._degraded

    @property
    def state(self) -> State:
        """VALID, SUSPECT (the last keepalive failed; the deadline has not
        passed), LOST (the deadline passed, or the daemon says the claim is
        lost or freed), FREE once finished. Never blocks."""
        with self._mu:
            self._expire_locked()
            return self._state

    def _expire_locked(self) -> None:
        if not self._done and self._state in (State.VALID, State.SUSPECT) \
                and _now() >= self._deadline:
            self._state = State.LOST
            self._lost_text = ("no keepalive was confirmed within the attempt's window (%g s): "
                               "the daemon may have freed it" % self._window)

    def on_lost(self, callback: Optional[Callable[["RemoteAttempt"], Any]]) -> None:
        """Call ``callback(attempt)`` once if the claim is lost, on the
        attempt's keepalive thread (at once, here, if it already is)."""
        with self._mu:
            self._callback = callback
            self._expire_locked()
            now = callback is not None and self._state is State.LOST and not self._called
            if now:
                self._called = True
        if now:
            assert callback is not None
            self._run_callback(callback)

    def _run_callback(self, cb: Callable[[Any], Any]) -> None:
        try:
            cb(self)
        except Exception:  # noqa: BLE001 - logged, as the library's callbacks are
            log.exception("cerberus: the on_lost callback of guard %s raised", self.scope)

    def _period(self) -> float:
        return max(self._window / 3.0, _MIN_PERIOD_S)

    def _keepalive(self) -> Optional[bool]:
        """Keep the attempt alive on the daemon, once
        (``POST /v1/guard/attempts/{id}/keepalive``), bounded by the
        deadline: True when confirmed (a new deadline), False when it failed
        (SUSPECT: tried again), None when the attempt is lost or done."""
        from .remote_http import RemoteCancel, _q
        what = "guard %s keepalive" % self.scope
        cancel = RemoteCancel()
        with self._mu:
            if self._done:
                return None
            self._inflight = cancel
            deadline = self._deadline
        sent = _now()
        budget = max(min(self._client._t.timeout, deadline - sent), 0.001)
        try:
            reply = self._client._call("POST", "/v1/guard/attempts/%s/keepalive" % _q(self._id),
                                       None, what, read_timeout=budget, cancel=cancel,
                                       connect_timeout=budget)
        except (Lost, NotOwner) as e:
            self._lose("the daemon no longer keeps the attempt (%s: %s)" % (e.name, e.text))
            return None
        except Error as e:
            with self._mu:
                if not self._done and self._state is State.VALID:
                    self._state = State.SUSPECT
            log.debug("cerberus: guard %s: keepalive failed (tried again until the deadline): "
                      "%s", self.scope, e)
            return False
        finally:
            with self._mu:
                self._inflight = None
        state = reply.get("state") if isinstance(reply, dict) else None
        if state in ("lost", "free"):
            self._lose("the daemon says the attempt's claim is %s" % state)
            return None
        w = reply.get("window_ms") if isinstance(reply, dict) else None
        with self._mu:
            if self._done:
                return None
            self._expire_locked()  # LOST is final, even if this answer is good
            lost = self._state is State.LOST
            if not lost:
                if isinstance(w, int) and not isinstance(w, bool) and w > 0:
                    self._window = w / 1000.0
                self._deadline = sent + self._window
                self._state = State.SUSPECT if state == "suspect" else State.VALID
        if lost:
            self._lose(self._lost_text)
            return None
        return True

    def _keep(self) -> None:
        next_at = _now() + self._period()
        while True:
            with self._mu:
                if self._done:
                    return
                self._expire_locked()
                lost = self._state is State.LOST
                deadline = self._deadline
            if lost:
                self._lose(self._lost_text)
                return
            now = _now()
            if now < next_at:
                self._stop.wait(min(next_at, deadline) - now)
                continue
            ok = self._keepalive()
            if ok is None:
                return
            next_at = _now() + (self._period() if ok else min(self._period(), _RETRY_S))

    def _lose(self, text: str) -> None:
        with self._mu:
            if self._done:
                return
            first = not self._called
            if self._state is not State.LOST:
                self._state = State.LOST
                self._lost_text = text
            cb, self._called = (None if self._called else self._callback), True
        if first:
            log.warning("cerberus: guard %s: the claim is lost: %s", self.scope, text)
        if cb is not None:
            self._run_callback(cb)

    def _finish(self, succeeded: bool) -> None:
        """Finish on the daemon; a success it did not confirm is finished
        again, four more times over about 2.5 s (as Attempt._finish)."""
        with self._mu:
            if self._done:
                return
            self._done = True
            inflight = self._inflight
        self._stop.set()
        if inflight is not None:
            inflight.fire()
        body: Dict[str, Any] = {"attempt": self._id, "succeeded": bool(succeeded)}
        if succeeded:  # a failure stores nothing: the daemon refuses a result with it
            body.update(_result_field(self._data))
        what = "guard finish %s" % ("success" if succeeded else "failure")
        try:
            for pause in (0.25, 0.5, 0.75, 1.0, None):
                try:
                    self._client._call("POST", _path(self.scope, self._key, "finish"), body,
                                       what, closing_ok=True)
                    return
                except (Unavailable, IOFailure, Busy):
                    # A lost answer: the retry gets the daemon's record of
                    # the first finish (200 "repeated"), or BUSY while that
                    # one still runs.
                    if not succeeded or pause is None:
                        raise
                    time.sleep(pause)
        finally:
            self._state = State.FREE
            if self._thread is not threading.current_thread():
                self._thread.join(self._client._t.timeout)

    def _discard(self) -> None:
        try:
            self._finish(False)
        except Error as e:
            log.warning("cerberus: guard %s: the failure was not recorded (%s); its claim "
                        "expires by itself", self.scope, e)

    def __repr__(self) -> str:
        return "<cerberus.RemoteAttempt %r %s>" % (self.scope, self._state.name)


class RemoteGuardContext:
    """``with remote_client.guard(scope, key) as attempt:`` — as
    :class:`~cerberus.GuardContext`, over the daemon. @cancel is a
    :class:`~cerberus.RemoteCancel`: it ends a begin in flight and the
    waiting between two."""

    def __init__(self, client: "RemoteClient", scope: str, key: Union[str, bytes], *,
                 wait: Optional[float] = None, running: Optional[float] = None,
                 keep: Optional[float] = None, on_unavailable: Optional[str] = None,
                 cancel: Optional["RemoteCancel"] = None) -> None:
        from .remote_http import RemoteCancel, _check_name
        if not isinstance(scope, str):
            raise TypeError("scope must be str, not %s" % type(scope).__name__)
        if key is None:
            raise TypeError("key must be str or bytes, not None")
        if cancel is not None and not isinstance(cancel, RemoteCancel):
            raise TypeError("a RemoteClient's guard takes a cerberus.RemoteCancel, not %s"
                            % type(cancel).__name__)
        self._client = client
        self._scope = _check_name(scope, "the guard's scope")
        self._key = _as_bytes(key, "key")
        wait_ms(wait)
        self._wait = wait
        if on_unavailable not in (None, "refuse", "allow"):
            raise ValueError('on_unavailable must be "refuse", "allow" or None, not %r'
                             % (on_unavailable,))
        self._body: Dict[str, Any] = {}
        if running is not None:
            self._body["running_ms"] = _ms(running, "running")
        if keep is not None:
            self._body["keep_ms"] = _ms(keep, "keep", True)
        if on_unavailable is not None:
            self._body["on_unavailable"] = on_unavailable
        self._window = (self._body["running_ms"] / 1000.0 if running is not None
                        else _DEFAULT_WINDOW_S)
        self._cancel = cancel
        self._attempt: Optional[RemoteAttempt] = None

    def _begin_once(self) -> RemoteAttempt:
        what = "guard %s" % self._scope
        sent = _now()  # the attempt's first deadline counts from here
        ans = self._client._call("POST", _path(self._scope, self._key, "begin"), self._body,
                                 what, cancel=self._cancel)
        state = ans.get("state")
        if state == "run" and isinstance(ans.get("attempt"), str):
            w = ans.get("window_ms")
            window = (w / 1000.0 if isinstance(w, int) and not isinstance(w, bool) and w > 0
                      else self._window)
            return RemoteAttempt(self._client, self._scope, self._key, ans["attempt"],
                                 bool(ans.get("degraded")), window, sent)
        if state == "duplicate":
            if isinstance(ans.get("result_base64"), str):
                result = base64.b64decode(ans["result_base64"])
            else:
                r = ans.get("result")
                result = r.encode("utf-8") if isinstance(r, str) else b""
            raise Duplicate(Status.DUPLICATE, 'the operation "%s" already succeeded'
                            % self._scope, what, result=result)
        raise ProtocolError(Status.EPROTO, "the daemon's answer to a guard begin is %r" % (ans,),
                            what)

    def _nap(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            if self._client.closed or (self._cancel is not None and self._cancel.fired):
                raise Interrupted(Status.INTERRUPTED, "the wait for a running attempt was "
                                  "interrupted", "guard %s" % self._scope)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def begin(self) -> RemoteAttempt:
        """Begin an attempt, waiting while another runs (as
        GuardContext.begin)."""
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

    def __enter__(self) -> RemoteAttempt:
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
        attempt._discard()
