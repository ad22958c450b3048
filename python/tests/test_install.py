"""docs/python.md's install commands work as written, offline: the test
runs its "## Install" shell block verbatim (a fresh venv, pip from Debian,
no index, no build isolation) in a copy of the source tree's python/, with
`python3` on PATH being this interpreter (Debian's), then checks that the
installed copy is the one imported, not the source tree's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import cerberus
from conftest import PYDIR, ROOT, missing

DOC = os.path.join(ROOT, "docs", "python.md")


def install_block() -> str:
    text = open(DOC, encoding="utf-8").read()
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert m, "no sh block in docs/python.md's Install section"
    return m.group(1)


def test_documented_install_works_offline(tmp_path):
    block = install_block()
    assert "--no-index" in block and "venv" in block
    r = subprocess.run([sys.executable, "-m", "venv", "--help"], capture_output=True)
    if r.returncode != 0:
        missing("python3 -m venv does not work for %s (Debian python3-venv)" % sys.executable)
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if r.returncode != 0:
        missing("no pip for %s (Debian python3-pip)" % sys.executable)
    # A copy of the tree's python/: pip's in-tree build leaves build/ and
    # *.egg-info behind.
    work = tmp_path / "tree"
    shutil.copytree(PYDIR, work / "python", ignore=shutil.ignore_patterns(
        "tests", "bench", "__pycache__", "build", "*.egg-info"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed copy, not the source tree
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = str(bindir) + os.pathsep + env.get("PATH", "")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # pip's cache: not the user's
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=str(work), env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, "the documented install failed:\n%s\n%s" % (r.stdout, r.stderr)
    assert r.stdout.strip().splitlines()[-1] == cerberus.library_version, r.stdout
    venvs = [p for p in work.iterdir() if (p / "pyvenv.cfg").exists()]
    assert len(venvs) == 1, list(work.iterdir())
    py = venvs[0] / "bin" / "python3"
    code = ("import cerberus, sys\n"
            "with cerberus.Client() as c:\n"
            "    with c.lock('installed', wait=1) as h:\n"
            "        assert h.state is cerberus.State.VALID\n"
            "print(cerberus.__file__)\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().startswith(str(venvs[0])), r.stdout
    assert (venvs[0] / "lib").exists()
