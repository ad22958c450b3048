"""_lib.py — find libcerberus.so, load it with ctypes and declare its API.

Nothing here is public. The search order for the library is:

1. ``$CERBERUS_LIB``: the path of the shared library itself. When it is set
   it is the only candidate: a typo must fail, not fall through to another
   copy.
2. ``$CERBERUS_BUILD_DIR``: a CMake build tree; ``libcerberus.so`` directly
   inside it.
3. ``pkg-config --variable=libdir cerberus`` (an installed library).
4. ``ctypes.util.find_library("cerberus")``, then the soname
   ``libcerberus.so.0`` through the dynamic loader's own path.

A library built with AddressSanitizer or ThreadSanitizer cannot be loaded
into a Python that did not start with the sanitizer's runtime: the runtime
aborts the whole process. So the candidate's dynamic section is read first,
and such a library is refused with an ImportError naming the LD_PRELOAD that
would load it, unless the runtime is already in the process.

Every function is declared with its argument and result types, so ctypes
converts and checks arguments, and a ``char *`` result is read as ``bytes``.
ctypes.CDLL releases the GIL for the duration of each foreign call, so a
thread blocked in ``cerb_lock_acquire()`` lets the others run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int,
                    c_int64, c_size_t, c_uint, c_uint64, c_void_p)
from typing import List, Optional, Tuple

SONAME = "libcerberus.so.0"



class LibraryNotFound(ImportError):
    """No usable libcerberus was found (the message lists what was tried)."""


# ------------------------------------------------------------- the search

def _pkg_config_libdir() -> Optional[str]:
    exe = shutil.which("pkg-config")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--variable=libdir", "cerberus"], check=False,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    d = out.stdout.strip()
    return d if out.returncode == 0 and d else None


def _candidates() -> Tuple[List[str], bool]:
    """The paths (or loader names) to try, in order, and whether the first
    is an explicit choice that must not fall through."""
    explicit = os.environ.get("CERBERUS_LIB")
    if explicit:
        return [explicit], True
    out: List[str] = []
    build = os.environ.get("CERBERUS_BUILD_DIR")
    if build:
        out.append(os.path.join(build, "libcerberus.so"))
    libdir = _pkg_config_libdir()
    if libdir:
        out.append(os.path.join(libdir, SONAME))
    found = ctypes.util.find_library("cerberus")
    if found:
        out.append(found)
    out.append(SONAME)
    return out, False


# The sanitizer runtimes a library may need, and the file to preload for each.
_SANITIZERS = (("libasan.so", "AddressSanitizer", "libasan.so"),
               ("libtsan.so", "ThreadSanitizer", "libtsan.so"),
               ("libclang_rt.asan", "AddressSanitizer", "libclang_rt.asan-x86_64.so"),
               ("libclang_rt.tsan", "ThreadSanitizer", "libclang_rt.tsan-x86_64.so"))


def _needed(path: str) -> List[str]:
    """The DT_NEEDED entries of an ELF shared object (64-bit little-endian
    only; anything else gives [] and is left to the loader)."""
    import struct
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + 64 > len(data):
            return []
        sh_type, = struct.unpack_from("<I", data, off + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, off + 0x18)
        sh_link, = struct.unpack_from("<I", data, off + 0x28)
        sections.append((sh_type, sh_offset, sh_size, sh_link))
    names: List[str] = []
    for sh_type, off, size, link in sections:
        if sh_type != 6 or link >= len(sections):  # SHT_DYNAMIC
            continue
        stroff = sections[link][1]
        for j in range(0, size, 16):
            tag, val = struct.unpack_from("<qQ", data, off + j)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", stroff + val)
                names.append(data[stroff + val:end].decode("ascii", "replace"))
    return names


def _loaded_objects() -> str:
    try:
        with open("/proc/self/maps", "r") as f:
            return f.read()
    except OSError:
        return ""


def _sanitizer_refusal(path: str) -> Optional[str]:
    """Why @path cannot be loaded into this process, or None when it can."""
    if not os.path.isfile(path):
        return None
    needed = _needed(path)
    maps = None
    for dep in needed:
        for stem, what, preload in _SANITIZERS:
            if dep.startswith(stem):
                if maps is None:
                    maps = _loaded_objects()
                if stem in maps:
                    return None
                return ("%s is built with %s: its runtime must be loaded before Python "
                        "starts, e.g. LD_PRELOAD=$(cc -print-file-name=%s) (and "
                        "ASAN_OPTIONS=detect_leaks=0: Python's own allocations look like "
                        "leaks)" % (path, what, preload))
    return None


def load() -> Tuple[ctypes.CDLL, str]:
    """Load the first usable candidate. Returns (library, path it came from)."""
    cands, explicit = _candidates()
    tried = []
    for cand in cands:
        if os.sep in cand and not os.path.exists(cand):
            tried.append("%s: no such file" % cand)
            if explicit:
                break
            continue
        why = _sanitizer_refusal(cand)
        if why:
            raise LibraryNotFound("cerberus: " + why)
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append("%s: %s" % (cand, e))
            if explicit:
                break
            continue
        # Every function the binding calls: a library without one of them
        # predates hold objects and cancels, and is refused.
        missing = [f for f in PROTOTYPES if not hasattr(lib, f)]
        if missing:
            version = "?"
            if hasattr(lib, "cerb_version"):
                lib.cerb_version.restype = c_char_p
                version = lib.cerb_version().decode()
            tried.append("%s (version %s) lacks %s: it predates hold objects and cancels"
                         % (cand, version, ", ".join(missing[:4])
                            + (" and %d more" % (len(missing) - 4) if len(missing) > 4 else "")))
            if explicit:
                break
            continue
        lib.cerb_version.restype = c_char_p
        version = (lib.cerb_version() or b"?").decode()
        if version.split(".")[0] != SONAME.rsplit(".", 1)[1]:
            tried.append("%s is version %s: this binding speaks the ABI of %s"
                         % (cand, version, SONAME))
            if explicit:
                break
            continue
        path = cand
        if os.sep not in cand:
            path = _resolved_path(lib) or cand
        return lib, path
    raise LibraryNotFound(
        "cerberus: no usable libcerberus found. Set CERBERUS_LIB to the library's path "
        "(or CERBERUS_BUILD_DIR to a build tree), or install it where pkg-config or the "
        "dynamic loader finds it. Tried: " + "; ".join(tried))


def _resolved_path(lib: ctypes.CDLL) -> Optional[str]:
    """The file the loader picked for a library loaded by name."""
    try:
        addr = ctypes.cast(lib.cerb_version, c_void_p).value or 0
    except (AttributeError, ValueError):
        return None
    for line in _loaded_objects().splitlines():
        parts = line.split()
        if len(parts) < 6 or "-" not in parts[0]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5]
    return None


# ------------------------------------------------------------ declarations

class EngineInfo(Structure):
    """struct cerb_engine_info, followed by room the library cannot overrun
    should a later version append fields."""
    _fields_ = [
        ("name", c_char_p),
        ("active", c_int),
        ("breaker", c_int),
        ("last_probe_us", c_int64),
        ("acquires", c_uint64),
        ("failures", c_uint64),
        ("lost", c_uint64),
        ("acquire_calls", c_uint64),
        ("wakeups", c_uint64),
        ("handoffs", c_uint64),
        ("breaker_transitions", c_uint64),
        ("switches", c_uint64),
        ("epoch", c_int64),
        ("wanted", c_int),
        ("guard_begins", c_uint64),
        ("guard_duplicates", c_uint64),
        ("guard_busy", c_uint64),
        ("guard_degraded", c_uint64),
        ("gate_questions", c_uint64),
        ("closed_epoch", c_int64),
        ("_reserved", c_char * 512),
    ]


class HolderInfo(Structure):
    """cerb_holder_info (one element of the array cerb_lock_inspect returns)."""
    _fields_ = [
        ("engine", c_char_p),
        ("owner", c_char_p),
        ("waiting", c_int),
        ("fence", c_uint64),
        ("ttl_ms", c_int64),
        ("detail", c_char_p),
    ]


class StoreReport(Structure):
    """cerb_store_report (one element of the array cerb_store_init returns)."""
    _fields_ = [
        ("engine", c_char_p),
        ("result", c_int),
        ("status", c_int),
        ("text", c_char_p),
    ]


class GuardOpts(Structure):
    """cerb_guard_opts."""
    _fields_ = [("running_ms", c_int64), ("keep_ms", c_int64), ("on_unavailable", c_int)]


class LockOpts(Structure):
    """cerb_lock_opts."""
    _fields_ = [("lease_ms", c_int64), ("renew", c_int), ("fair", c_int)]


# Callback types. Handles are passed as void *: the callbacks identify the
# Python object through their user-data word, never through the handle.
HOLD_LOST_CB = CFUNCTYPE(None, c_void_p, c_void_p)
GUARD_LOST_CB = CFUNCTYPE(None, c_void_p, c_void_p)
SWITCH_CB = CFUNCTYPE(None, c_char_p, c_char_p, c_char_p, c_void_p)
LOG_CB = CFUNCTYPE(None, c_int, c_char_p, c_void_p)

P = c_void_p
PP = POINTER(c_void_p)

# name: (restype, argtypes)
PROTOTYPES = {
    "cerb_strerror": (c_char_p, [c_int]),
    "cerb_status_name": (c_char_p, [c_int]),
    "cerb_version": (c_char_p, []),
    "cerb_last_error": (c_char_p, []),
    "cerb_log_set": (c_int, [LOG_CB, P, c_int]),
    "cerb_client_open": (c_int, [PP, c_char_p]),
    "cerb_client_open_string": (c_int, [PP, c_char_p]),
    "cerb_client_close": (None, [P]),
    "cerb_client_reload": (c_int, [P]),
    "cerb_engine_current": (c_char_p, [P]),
    "cerb_engine_switch": (c_char_p, [P]),
    "cerb_engine_switch_to": (c_char_p, [P, c_char_p]),
    "cerb_client_on_switch": (c_int, [P, SWITCH_CB, P]),
    "cerb_engine_info": (c_int, [P, c_char_p, POINTER(EngineInfo)]),
    "cerb_metrics_text": (c_int, [P, POINTER(c_void_p)]),
    "cerb_free": (None, [P]),
    "cerb_lock_new": (c_int, [P, c_char_p, POINTER(LockOpts), PP]),
    "cerb_lock_free": (c_int, [P]),
    "cerb_lock_name": (c_char_p, [P]),
    "cerb_lock_acquire": (c_int, [P, c_int64, P, PP]),
    "cerb_hold_release": (c_int, [P]),
    "cerb_hold_fencing_token": (c_uint64, [P]),
    "cerb_hold_state": (c_int, [P]),
    "cerb_hold_name": (c_char_p, [P]),
    "cerb_hold_on_lost": (c_int, [P, HOLD_LOST_CB, P]),
    "cerb_hold_error": (c_char_p, [P]),
    "cerb_hold_free": (c_int, [P]),
    "cerb_cancel_new": (c_int, [PP]),
    "cerb_cancel_fire": (None, [P]),
    "cerb_cancel_fired": (c_int, [P]),
    "cerb_cancel_error": (c_char_p, [P]),
    "cerb_cancel_free": (None, [P]),
    "cerb_lock_inspect": (c_int, [P, c_char_p, c_char_p, POINTER(POINTER(HolderInfo)),
                                  POINTER(c_size_t)]),
    "cerb_holders_free": (None, [POINTER(HolderInfo), c_size_t]),
    "cerb_guard_begin_ex": (c_int, [P, c_char_p, c_char_p, c_size_t, POINTER(GuardOpts), P,
                                    PP]),
    "cerb_guard_finish": (c_int, [P, c_int, c_char_p, c_size_t]),
    "cerb_guard_result": (c_void_p, [P, POINTER(c_size_t)]),
    "cerb_guard_degraded": (c_int, [P]),
    "cerb_guard_state": (c_int, [P]),
    "cerb_guard_on_lost": (c_int, [P, GUARD_LOST_CB, P]),
    "cerb_guard_free": (c_int, [P]),
    "cerb_store_init": (c_int, [c_char_p, c_uint, POINTER(POINTER(StoreReport)),
                                POINTER(c_size_t)]),
    "cerb_store_reports_free": (None, [POINTER(StoreReport), c_size_t]),
}


def declare(lib: ctypes.CDLL) -> None:
    """Set restype and argtypes of every function the binding calls."""
    for name, (res, args) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


# Calls that never wait (no server contact, no wait on a lock held across
# I/O): made through a PyDLL handle of the same library, which keeps the
# GIL. Releasing and taking back the GIL around a call of a microsecond is
# what costs most when threads share the interpreter: the thread that let
# it go waits for the others to give it back. Everything that may wait
# (acquire, release, free of a hold still held, guard calls, close,
# inspect, init) goes through the CDLL handle, which releases it. No
# deadlock is possible: the library calls into Python (callbacks) with no
# library lock held.
FAST = (
    "cerb_strerror", "cerb_status_name", "cerb_version", "cerb_last_error",
    "cerb_lock_new", "cerb_lock_free", "cerb_lock_name", "cerb_hold_fencing_token",
    "cerb_hold_state", "cerb_hold_name", "cerb_hold_error", "cerb_cancel_new",
    "cerb_cancel_fire", "cerb_cancel_fired", "cerb_cancel_error", "cerb_cancel_free",
    "cerb_guard_result", "cerb_guard_degraded", "cerb_guard_state", "cerb_engine_current",
    "cerb_free", "cerb_holders_free", "cerb_store_reports_free",
)


class _Fast:
    """The FAST functions, through a PyDLL handle (the GIL is kept)."""

    def __init__(self, path: str) -> None:
        py = ctypes.PyDLL(path)
        for name in FAST:
            res, args = PROTOTYPES[name]
            fn = getattr(py, name)
            fn.restype = res
            fn.argtypes = args
            setattr(self, name, fn)
        # A hold already released: its free does not touch the server.
        res, args = PROTOTYPES["cerb_hold_free"]
        self.cerb_hold_free_released = py.cerb_hold_free
        self.cerb_hold_free_released.restype = res
        self.cerb_hold_free_released.argtypes = args


# The library is loaded on first use, not at import: ``import cerberus``
# works without it, for RemoteClient (a client of ``cerberus serve`` that
# needs no library). ``lib``, ``fast``, ``path`` and ``version`` are this
# module's attributes once loaded; before, the module's __getattr__ loads
# on the first read of one of them. A failure is kept and raised again, with
# the same text, at every later use (the search is not repeated).
_load_mu = threading.Lock()
_load_error: Optional[str] = None
_LAZY = ("lib", "fast", "path", "version")


def _ensure() -> None:
    """Load and declare the library once; raises LibraryNotFound (the same
    text every time) when there is none."""
    global _load_error
    with _load_mu:
        g = globals()
        if "version" in g:
            return
        if _load_error is not None:
            raise LibraryNotFound(_load_error)
        try:
            lib_, path_ = load()
        except LibraryNotFound as e:
            _load_error = str(e)
            raise
        declare(lib_)
        fast_ = _Fast(path_)
        g["lib"], g["path"], g["fast"] = lib_, path_, fast_
        g["version"] = lib_.cerb_version().decode()  # last: "loaded" means all four are set


def loaded() -> bool:
    """Whether the library is loaded (never loads it)."""
    return "version" in globals()


def __getattr__(name: str) -> object:
    if name in _LAZY:
        _ensure()
        return globals()[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


class Deferred:
    """Stands for ``_lib.lib`` or ``_lib.fast`` in a module's globals (``L``,
    ``F``) until the first call through it, which loads the library and
    puts the real object in its place: later calls find the real one
    directly, at no cost, and a module that never calls the library (a
    RemoteClient's process) never loads it."""

    __slots__ = ("_g", "_name", "_attr")

    def __init__(self, module_globals: dict, name: str, attr: str) -> None:
        self._g = module_globals
        self._name = name
        self._attr = attr

    def __getattr__(self, fn: str) -> object:
        _ensure()
        real = globals()[self._attr]
        self._g[self._name] = real
        return getattr(real, fn)
