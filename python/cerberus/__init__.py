"""cerberus — distributed locks that keep working when their store fails.

A Python binding of libcerberus (Redis, ZooKeeper and etcd engines with
failover), over ctypes: nothing to compile. The library is found through
``$CERBERUS_LIB`` (its path), ``$CERBERUS_BUILD_DIR`` (a build tree),
``pkg-config cerberus`` or the dynamic loader.

    import cerberus

    with cerberus.Client("cerberus.cfg") as client:
        with client.lock("nightly-report", wait=5) as hold:
            print("token", hold.fencing_token)

See docs/python.md for holds released from another thread, asyncio, the
idempotency guard, ``once`` and the errors.

``cerberus.RemoteClient("unix:/run/cerberus/cerberus.sock")`` is the same
interface over ``cerberus serve`` (the standard library only): it needs no
libcerberus in the process, and ``import cerberus`` loads the library only
when something first uses it (``Client``, ``library_version``).
"""

from __future__ import annotations

import atexit
import enum
import os
import tempfile
from ctypes import POINTER, byref, c_size_t
from dataclasses import dataclass
from typing import Callable, List, Optional

from . import _callbacks, _lib
from .client import (DEFAULT, Breaker, Cancel, Client, ClientStatus, EngineStatus, Hold,
                     Holder, Lock, PathLike, State, _cstr, _enum)
from .errors import (Busy, ConfigError, Duplicate, Error, Interrupted, InvalidArgument,
                     IOFailure, Lost, NotOwner, OutOfMemory, ProtocolError, Status, Timeout,
                     Unauthorized, Unavailable, error_for, last_error)
from .guard import FOREVER, Attempt, GuardContext
from .remote import RemoteAttempt, RemoteCancel, RemoteClient, RemoteHold, RemoteLock

__all__ = [
    "Client", "Lock", "Hold", "Cancel", "State", "Breaker", "Status", "ClientStatus",
    "EngineStatus", "Holder", "GuardContext", "Attempt", "FOREVER", "DEFAULT",
    "Error", "Busy", "Timeout", "Interrupted", "NotOwner", "Lost", "Unavailable",
    "InvalidArgument", "ConfigError", "OutOfMemory", "ProtocolError", "IOFailure",
    "Duplicate", "Unauthorized", "RemoteClient", "RemoteLock", "RemoteHold", "RemoteCancel",
    "RemoteAttempt", "LogLevel", "set_log_handler", "log_to_logging", "StoreReport",
    "init_stores", "library_version", "library_path", "__version__",
]

#: This package's version.
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # library_version (cerb_version() of the library loaded at run time) and
    # library_path (the file it came from) load the library on first read:
    # the import itself needs none (RemoteClient), and a missing library is
    # reported (LibraryNotFound, with what was tried) by the first use of
    # one of these or of Client.
    if name == "library_version":
        return _lib.version
    if name == "library_path":
        return _lib.path
    raise AttributeError("module 'cerberus' has no attribute %r" % name)


class LogLevel(enum.IntEnum):
    """``cerb_log_level``."""

    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3
    OFF = 4


_log_key: Optional[int] = None


def set_log_handler(handler: Optional[Callable[[LogLevel, str], object]],
                    level: LogLevel = LogLevel.WARN) -> None:
    """Route the library's log lines (breaker transitions, switches, lost
    holds) to ``handler(level, line)``, for the whole process; lines below
    @level are dropped. ``None`` restores the default sink (stderr).
    The handler may run on any thread, including the library's own."""
    global _log_key
    lvl = LogLevel(level)
    old = _log_key
    if handler is None:
        st = _lib.lib.cerb_log_set(_callbacks.LOG_NONE, None, int(lvl))
        key = None
    else:
        key = _callbacks.register(lambda lv, line: handler(LogLevel(lv), line))
        st = _lib.lib.cerb_log_set(_callbacks.LOG, key, int(lvl))
    if st != 0:
        _callbacks.unregister(key)
        raise error_for(st, last_error(), "set_log_handler")
    _log_key = key
    _callbacks.unregister(old)


def log_to_logging(level: LogLevel = LogLevel.INFO) -> None:
    """Send the library's log lines to the :mod:`logging` logger
    ``cerberus`` at the matching levels."""
    import logging
    to = {LogLevel.DEBUG: logging.DEBUG, LogLevel.INFO: logging.INFO,
          LogLevel.WARN: logging.WARNING, LogLevel.ERROR: logging.ERROR}
    logger = logging.getLogger("cerberus")
    set_log_handler(lambda lv, line: logger.log(to.get(lv, logging.ERROR), "%s", line), level)


def _reset_log() -> None:
    # At exit the library's threads must not call into a finalizing Python.
    if _log_key is not None:
        _lib.lib.cerb_log_set(_callbacks.LOG_NONE, None, int(LogLevel.WARN))


atexit.register(_reset_log)


@dataclass(frozen=True)
class StoreReport:
    """One configured engine's answer to :func:`init_stores`."""

    engine: str
    result: str  #: "prepared", "already", "nothing", "refused" or "failed"
    status: Status
    text: str


def init_stores(path: Optional[PathLike] = None, *, text: Optional[str] = None,
                force: bool = False) -> List[StoreReport]:
    """Prepare the configured engines' stores for their first use, so the
    first grant on a new Redis server does not wait a lease
    (``cerb_store_init``, ``cerberus init``). A store that shows signs of
    earlier use is refused unless @force: see docs/guide.md, "Prepare a new
    store", before you force.

    Returns one report per configured engine, in configuration order.
    Raises the first failing store's error (Busy for a refusal), with
    every report in its ``reports`` attribute.
    """
    if path is not None and text is not None:
        raise ValueError("give a configuration path or its text, not both")
    if text is not None:
        _cstr(text, "the configuration text")
    cpath = None if path is None else _cstr(os.fsencode(path), "the configuration path")
    tmp = None
    try:
        if text is not None:
            fd, tmp = tempfile.mkstemp(prefix="cerberus-", suffix=".cfg")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            cpath = os.fsencode(tmp)
        arr = POINTER(_lib.StoreReport)()
        n = c_size_t(0)
        try:
            st = _lib.lib.cerb_store_init(cpath, 1 if force else 0, byref(arr), byref(n))
            detail = last_error() if st else ""
            names = ("prepared", "already", "nothing", "refused", "failed")
            out = [StoreReport(engine=(arr[i].engine or b"").decode(),
                               result=names[arr[i].result] if 0 <= arr[i].result < 5 else "?",
                               status=_enum(Status, arr[i].status),  # type: ignore[arg-type]
                               text=(arr[i].text or b"").decode("utf-8", "replace"))
                   for i in range(n.value)]
        finally:
            _lib.lib.cerb_store_reports_free(arr, n.value)
    finally:
        if tmp:
            os.unlink(tmp)
    if st != 0:
        err = error_for(st, detail, "init_stores")
        err.reports = out  # type: ignore[attr-defined]
        raise err
    return out
