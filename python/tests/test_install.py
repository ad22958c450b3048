"""The package installs offline with Debian's pip and setuptools, and the
installed copy imports and works (not the source tree's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import PYDIR


def test_pip_install_offline_and_import(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if r.returncode != 0:
        pytest.skip("no pip for %s (Debian python3-pip)" % sys.executable)
    # Build from a copy: an in-tree build would leave build/ and *.egg-info
    # in the source tree.
    src = tmp_path / "src"
    shutil.copytree(PYDIR, src, ignore=shutil.ignore_patterns(
        "tests", "bench", "__pycache__", "build", "*.egg-info"))
    site = tmp_path / "site"
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)  # pip loads no libcerberus
    env.pop("PYTHONPATH", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-index", "--no-cache-dir", "--target", str(site), str(src)],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "cerberus" / "__init__.py").exists()
    assert (site / "cerberus" / "py.typed").exists()
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    code = ("import cerberus, sys\n"
            "with cerberus.Client() as c:\n"
            "    with c.lock('installed', wait=1) as h:\n"
            "        assert h.state is cerberus.State.VALID\n"
            "print(cerberus.__file__)\n"
            "print(cerberus.library_version)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    path, version = r.stdout.split()
    assert path.startswith(str(site))
    assert version.count(".") == 2
