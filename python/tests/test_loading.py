"""How the package finds and checks the library (cerberus/_lib.py), in
child interpreters with a chosen environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cerberus
from cerberus import _lib
from conftest import child_env


def _import(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import cerberus; print(cerberus.library_path)"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_explicit_path_that_does_not_exist_fails_clearly(tmp_path):
    env = child_env()
    env["CERBERUS_LIB"] = str(tmp_path / "libnothere.so")
    r = _import(env)
    assert r.returncode != 0
    assert "LibraryNotFound" in r.stderr and "libnothere.so: no such file" in r.stderr
    assert "CERBERUS_LIB" in r.stderr


def test_build_dir_is_searched():
    env = child_env()
    lib = env.pop("CERBERUS_LIB", None) or cerberus.library_path
    env["CERBERUS_BUILD_DIR"] = os.path.dirname(lib)
    if not os.path.exists(os.path.join(env["CERBERUS_BUILD_DIR"], "libcerberus.so")):
        pytest.skip("the library in use is not in a build tree")
    r = _import(env)
    assert r.returncode == 0, r.stderr
    assert os.path.samefile(r.stdout.strip(), os.path.join(env["CERBERUS_BUILD_DIR"],
                                                           "libcerberus.so"))


def test_sanitized_library_is_refused_without_its_runtime():
    needed = _lib._needed(cerberus.library_path)
    if not any(n.startswith(("libasan", "libclang_rt.asan")) for n in needed):
        pytest.skip("the library in use is not built with AddressSanitizer")
    env = child_env()
    env.pop("LD_PRELOAD", None)
    env["CERBERUS_LIB"] = cerberus.library_path
    r = _import(env)
    # An ImportError that says what to do, not the runtime aborting Python.
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "AddressSanitizer" in r.stderr and "LD_PRELOAD" in r.stderr


def test_needed_reads_the_dynamic_section():
    needed = _lib._needed(cerberus.library_path)
    assert any(n.startswith("libc.so") for n in needed), needed
    assert _lib._needed("/nonexistent") == []


def test_a_missing_tool_fails_when_required(monkeypatch):
    """ctest sets CERB_PY_REQUIRE=1: a missing tool is then a failure that
    names its package, never a silent skip."""
    import conftest
    monkeypatch.setattr(conftest, "REQUIRE", True)
    with pytest.raises(pytest.fail.Exception) as e:
        conftest.require_tool("no-such-tool-cerberus", "some-package")
    assert "some-package" in str(e.value) and "CERB_PY_REQUIRE" in str(e.value)
    with pytest.raises(pytest.fail.Exception):
        conftest.require_module("no_such_module_cerberus", "python3-nothing")
    monkeypatch.setattr(conftest, "REQUIRE", False)
    with pytest.raises(pytest.skip.Exception):
        conftest.require_tool("no-such-tool-cerberus", "some-package")
    if os.environ.get("CERB_TEST_NAME"):  # under ctest (run_in_session.sh)
        assert os.environ.get("CERB_PY_REQUIRE") == "1"
