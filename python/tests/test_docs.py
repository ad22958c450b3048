"""docs/python.md cannot rot: every ```python block of it runs, as a whole
program, against the test servers.

Each block runs as its own `python3` process (this interpreter, the package
from the source tree, the same library and sanitizer preload), in a fresh
directory holding `cerberus.cfg`, within 60 s, and must exit 0. The file
names the engines the block's first line asks for (`# cerberus.cfg: zk`),
Redis by default:

* redis: the shared test server, database 9, `redis.prefix = ""` (as
  redis-py's keys need), prepared with init_stores(force=True); the
  block's environment has REDIS_URL for the same database;
* zk: the shared test ZooKeeper with the default root (kazoo examples
  spell it out); ZK_HOSTS in the environment;
* etcd: the shared test etcd, prefix ""; ETCD_ENDPOINTS in the environment;
* local: the in-process engine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import List, Tuple

import pytest

import cerberus
from conftest import ROOT, child_env

DOC = os.path.join(ROOT, "docs", "python.md")
DOCS_DB = 9


def python_blocks(path: str) -> List[Tuple[int, str]]:
    """(line of the opening fence, code) of every ```python block."""
    out = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^( *)(`{3,})python\s*$", lines[i])
        if m:
            indent, fence = len(m.group(1)), m.group(2)
            start = i + 1
            j = start
            while j < len(lines) and not re.match(r"^ *" + fence + r"\s*$", lines[j]):
                j += 1
            code = "\n".join(l[indent:] for l in lines[start:j])
            out.append((i + 1, code))
            i = j
        i += 1
    return out


BLOCKS = python_blocks(DOC)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 8


def _engines(code: str) -> List[str]:
    m = re.match(r"#\s*cerberus\.cfg:\s*([a-z, ]+)", code)
    return [e.strip() for e in m.group(1).split(",")] if m else ["redis"]


def _config(engines: List[str]) -> Tuple[str, dict]:
    env = {}
    parts = ["engines = (%s);" % ", ".join('"%s"' % e for e in engines)]
    for e in engines:
        if e == "redis":
            p = int(os.environ.get("CERB_REDIS_PORT") or 0)
            if not p:
                pytest.skip("CERB_REDIS_PORT is not set")
            parts.append('redis = { host = "127.0.0.1"; port = %d; db = %d; };' % (p, DOCS_DB))
            env["REDIS_URL"] = "redis://127.0.0.1:%d/%d" % (p, DOCS_DB)
        elif e == "zk":
            p = int(os.environ.get("CERB_ZK_PORT") or 0)
            if not p:
                pytest.skip("CERB_ZK_PORT is not set")
            parts.append('zk = { hosts = "127.0.0.1:%d"; };' % p)
            env["ZK_HOSTS"] = "127.0.0.1:%d" % p
        elif e == "etcd":
            p = int(os.environ.get("CERB_ETCD_PORT") or 0)
            if not p:
                pytest.skip("CERB_ETCD_PORT is not set")
            parts.append('etcd = { endpoints = ("http://127.0.0.1:%d"); };' % p)
            env["ETCD_ENDPOINTS"] = "http://127.0.0.1:%d" % p
        elif e != "local":
            pytest.fail("unknown engine %r in a block's cerberus.cfg line" % e)
    return "\n".join(parts) + "\n", env


_prepared = set()


@pytest.mark.parametrize("line,code", BLOCKS, ids=["python.md:%d" % l for l, _ in BLOCKS])
def test_example_runs(line, code, tmp_path):
    engines = _engines(code)
    if "kazoo" in code:
        pytest.importorskip("kazoo")
    if "import redis" in code:
        pytest.importorskip("redis")
    cfg, extra = _config(engines)
    (tmp_path / "cerberus.cfg").write_text(cfg)
    if "redis" in engines and DOCS_DB not in _prepared:
        # The docs' database is new to Cerberus, not the server: force.
        cerberus.init_stores(tmp_path / "cerberus.cfg", force=True)
        _prepared.add(DOCS_DB)
    env = child_env()
    env.update(extra)
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail("docs/python.md:%d: the example ran over 60 s; output so far:\n%s\n%s"
                    % (line, e.stdout, e.stderr))
    if r.returncode != 0:
        pytest.fail("docs/python.md:%d: the example exited %d\n--- stdout\n%s--- stderr\n%s"
                    % (line, r.returncode, r.stdout, r.stderr))
