"""errors.py — the library's status codes as an enum and as exceptions.

Every failing call raises a subclass of :class:`Error` chosen by the
``cerb_status`` it returned. The exception carries the code
(:attr:`Error.status`), its name, and the library's detail text
(:attr:`Error.text`): the error text of the cancel or hold the call used
when it has one (readable from any thread), else ``cerb_last_error()`` read
on the calling thread right after the call.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Tuple, Type

from . import _lib


class Status(enum.IntEnum):
    """``cerb_status``: the codes are append-only, so values never change."""

    OK = 0
    BUSY = 1
    TIMEOUT = 2
    INTERRUPTED = 3
    NOT_OWNER = 4
    LOST = 5
    UNAVAILABLE = 6
    EINVAL = 7
    ECONFIG = 8
    ENOMEM = 9
    EPROTO = 10
    EIO = 11
    DUPLICATE = 12


# cerb_status_name() and cerb_strerror() of every code this binding knows
# (CERB_STATUS_MAP in cerberus.h), so that an error can be made without the
# library: a RemoteClient's process has none. The suite checks that they
# agree with the library's (test_remote.py).
_TEXTS: Dict[int, Tuple[str, str]] = {
    0: ("OK", "success"),
    1: ("BUSY", "lock is held by another owner"),
    2: ("TIMEOUT", "wait deadline passed"),
    3: ("INTERRUPTED", "wait was interrupted"),
    4: ("NOT_OWNER", "caller does not hold the lock"),
    5: ("LOST", "lock lease or session ended while held"),
    6: ("UNAVAILABLE", "no engine could serve the request"),
    7: ("EINVAL", "invalid argument"),
    8: ("ECONFIG", "invalid configuration"),
    9: ("ENOMEM", "out of memory"),
    10: ("EPROTO", "unexpected server reply"),
    11: ("EIO", "connection or I/O failure"),
    12: ("DUPLICATE", "operation already succeeded"),
}


def _status_texts(status: int) -> Tuple[str, str]:
    """(name, short text) of @status: the loaded library's (a newer one
    knows more codes), else this binding's table, never loading it."""
    if _lib.loaded():
        return (_lib.fast.cerb_status_name(status).decode(),
                _lib.fast.cerb_strerror(status).decode())
    return _TEXTS.get(status, ("UNKNOWN", "unknown status"))


class Error(Exception):
    """Base class of every error the library reports.

    Attributes:
        status: the ``cerb_status`` code (an :class:`int`; a :class:`Status`
            member when this binding knows it).
        name: the code's name without prefix, such as ``"BUSY"``.
        text: the library's detail (``cerb_last_error()`` and friends);
            ``""`` when it gave none.
        what: the operation that failed (``'acquire "job"'``), or ``""``.

    Exceptions pickle (to another process, a ``multiprocessing`` pool) with
    their attributes.
    """

    status: int
    name: str
    text: str
    what: str

    def __init__(self, status: int, text: str = "", what: str = "") -> None:
        status = int(status)
        try:
            self.status = Status(status)
        except ValueError:
            self.status = status
        self.name, short = _status_texts(status)
        self.text = text
        self.what = what
        msg = "%s (%s)" % (short, self.name)
        if what:
            msg = "%s: %s" % (what, msg)
        if text:
            msg += ": " + text
        super().__init__(msg)

    def _ctor_args(self) -> Tuple[Any, ...]:
        return (int(self.status), self.text, self.what)

    def __reduce__(self) -> Tuple[Any, ...]:
        # The constructor's own arguments, not Exception's (the message):
        # the default would call cls(message) and fail in the other process.
        # The state carries what was added later (holders, reports).
        return (type(self), self._ctor_args(), dict(self.__dict__))

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)


class Busy(Error):
    """The lock is held by another owner (a wait of 0), or a guard attempt
    is running elsewhere."""


class Timeout(Error, TimeoutError):
    """The wait ran out before the lock was granted."""


class Interrupted(Error):
    """The call's :class:`~cerberus.Cancel` was fired (or the client is
    closing)."""


class NotOwner(Error):
    """The hold was already released."""


class Lost(Error):
    """The hold (or a guard attempt's claim) ended while held: the lease ran
    out, the session expired or the key was taken."""


class Unavailable(Error):
    """No engine could serve the request."""


class InvalidArgument(Error, ValueError):
    """A bad argument, handle or state (``CERB_EINVAL``); also a client used
    in a process forked after it was opened."""


class ConfigError(Error):
    """A bad configuration file or text (``file:line: message``)."""


class OutOfMemory(Error, MemoryError):
    """The library could not allocate memory."""


class ProtocolError(Error):
    """A server answered something the engine cannot read."""


class IOFailure(Error):
    """A connection or I/O failure (``CERB_EIO``)."""


class Duplicate(Error):
    """The guarded operation already succeeded: :attr:`result` holds what
    it stored (bytes)."""

    result: bytes

    def __init__(self, status: int, text: str = "", what: str = "",
                 result: bytes = b"") -> None:
        super().__init__(status, text, what)
        self.result = bytes(result)

    def _ctor_args(self) -> Tuple[Any, ...]:
        return (int(self.status), self.text, self.what, self.result)


class Unauthorized(Error, PermissionError):
    """``cerberus serve`` refused the request: a TCP request without the
    bearer token, or with another one (HTTP 401). Only
    :class:`~cerberus.RemoteClient` raises it; its :attr:`status` is
    ``EINVAL`` (the library has no code for it) and its :attr:`name`
    ``"UNAUTHORIZED"``. The token is never in the message."""

    def __init__(self, status: int = Status.EINVAL, text: str = "", what: str = "") -> None:
        super().__init__(status, text, what)
        self.name = "UNAUTHORIZED"
        msg = "unauthorized (UNAUTHORIZED)"
        if what:
            msg = "%s: %s" % (what, msg)
        if text:
            msg += ": " + text
        self.args = (msg,)


_BY_STATUS: Dict[int, Type[Error]] = {
    Status.BUSY: Busy,
    Status.TIMEOUT: Timeout,
    Status.INTERRUPTED: Interrupted,
    Status.NOT_OWNER: NotOwner,
    Status.LOST: Lost,
    Status.UNAVAILABLE: Unavailable,
    Status.EINVAL: InvalidArgument,
    Status.ECONFIG: ConfigError,
    Status.ENOMEM: OutOfMemory,
    Status.EPROTO: ProtocolError,
    Status.EIO: IOFailure,
    Status.DUPLICATE: Duplicate,
}


def error_for(status: int, text: str = "", what: str = "") -> Error:
    """The exception for @status (Error itself for a code this binding does
    not know yet)."""
    return _BY_STATUS.get(status, Error)(status, text, what)


def last_error() -> str:
    """``cerb_last_error()`` of the calling thread."""
    return (_lib.fast.cerb_last_error() or b"").decode("utf-8", "replace")


def check(status: int, what: str = "", text: Optional[str] = None) -> None:
    """Raise the exception for @status unless it is OK. @text defaults to
    the calling thread's ``cerb_last_error()``: call this right after the
    library call, on the same thread."""
    if status != 0:
        raise error_for(status, last_error() if text is None else text, what)
