"""_callbacks.py — C callbacks into Python, made safe to outlive any object.

The library calls callbacks on its own threads (a client's callback thread;
the log sink on any thread). A ctypes CFUNCTYPE object is executable memory
that must stay alive for as long as C may call it, *and* until a call
already running has returned: freeing it while the callback thread is still
inside it would crash. So there is exactly one trampoline per callback
type, made at import and never freed, and the library is given an integer
key as user data. The key names an entry in a table; removing the entry
(when a hold, guard or client goes away) makes a late call a no-op, and
nothing executable is ever freed.

Exceptions raised by a user's callback are caught and logged on the logger
``cerberus`` (with the traceback): nothing may unwind into C.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

from . import _lib
from .errors import last_error

log = logging.getLogger("cerberus")

_table: Dict[int, Callable[..., None]] = {}
_mu = threading.Lock()
_keys = itertools.count(1)


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the table's mutex at the fork.
    global _mu
    _mu = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def register(fn: Callable[..., None]) -> int:
    """Enter @fn in the table; returns the key to pass as user data."""
    key = next(_keys)
    with _mu:
        _table[key] = fn
    return key


def unregister(key: Optional[int]) -> None:
    """Remove an entry; later calls with its key do nothing."""
    if key:
        with _mu:
            _table.pop(key, None)


def set_lost(owner: Any, handle: Any, c_set: Callable[..., int], ptr: Any, trampoline: Any,
             none: Any, callback: Optional[Callable[[Any], Any]]) -> Tuple[int, str]:
    """Point the lost callback of a hold or guard attempt (@owner, whose
    bookkeeping @handle keeps the current key in ``cb_key``) at
    ``callback(owner)``, or remove it (None), through @c_set
    (``cerb_hold_on_lost`` or ``cerb_guard_on_lost``) on @ptr with the
    type's @trampoline (@none for the removal). The callback holds the owner
    weakly, so it keeps nothing alive. Returns the status and, when it
    failed, the library's text, read on this thread."""
    old = handle.cb_key
    if callback is None:
        st = c_set(ptr, none, None)
        key = None
    else:
        ref = weakref.ref(owner)

        def fire() -> None:
            obj = ref()
            if obj is not None:
                callback(obj)

        key = register(fire)
        st = c_set(ptr, trampoline, key)
    text = last_error() if st else ""
    if st == 0:
        handle.cb_key = key
        unregister(old)
    else:
        unregister(key)
    return st, text


def _lookup(ud: Optional[int]) -> Optional[Callable[..., None]]:
    if not ud:
        return None
    with _mu:
        return _table.get(ud)


def _run(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except BaseException:  # noqa: B902 - nothing may unwind into C
        log.exception("cerberus: exception in a callback (ignored)")


def _on_hold_lost(_hold: int, ud: Optional[int]) -> None:
    fn = _lookup(ud)
    if fn is not None:
        _run(fn)


def _on_guard_lost(_guard: int, ud: Optional[int]) -> None:
    fn = _lookup(ud)
    if fn is not None:
        _run(fn)


def _on_switch(frm: Optional[bytes], to: Optional[bytes], why: Optional[bytes],
               ud: Optional[int]) -> None:
    fn = _lookup(ud)
    if fn is not None:
        _run(fn, (frm or b"").decode("utf-8", "replace"), (to or b"").decode("utf-8", "replace"),
             (why or b"").decode("utf-8", "replace"))


def _on_log(level: int, line: Optional[bytes], ud: Optional[int]) -> None:
    fn = _lookup(ud)
    if fn is not None:
        _run(fn, level, (line or b"").decode("utf-8", "replace"))


# The trampolines: module globals, alive until the interpreter exits.
HOLD_LOST = _lib.HOLD_LOST_CB(_on_hold_lost)
GUARD_LOST = _lib.GUARD_LOST_CB(_on_guard_lost)
SWITCH = _lib.SWITCH_CB(_on_switch)
LOG = _lib.LOG_CB(_on_log)
# A NULL function pointer of each type, to remove a callback.
HOLD_LOST_NONE = _lib.HOLD_LOST_CB()
GUARD_LOST_NONE = _lib.GUARD_LOST_CB()
SWITCH_NONE = _lib.SWITCH_CB()
LOG_NONE = _lib.LOG_CB()
