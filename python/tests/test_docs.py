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
* zk: the shared test ZooKeeper, a root of this run's own; the block's
  "/cerberus/locks" (the default root, which kazoo examples spell out) is
  rewritten to it; ZK_HOSTS in the environment;
* etcd: the shared test etcd, a prefix of this run's own; ETCD_ENDPOINTS in
  the environment;
* local: the in-process engine;
* serve (a first line `# cerberus serve`): a `cerberus serve` of the
  block's own (the built binary, the `local` engine) on a unix socket,
  whose address is CERBERUS_ADDRESS in the block's environment; stopped
  by its PID when the block ends.

The servers are shared (with other suites, and with another run of this
one), so no two runs may use the same names: every lock name, guard scope
and `once` scope a block passes as a literal is rewritten with a suffix of
this run's own (`"report"` becomes `"report-<pid>-<n>-<hex>"`) everywhere
in the block, in the redis-py and kazoo calls too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Dict, List, Tuple

import pytest

import cerberus
from conftest import ROOT, Daemon, child_env, require_module, uniq

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


RUN = uniq("docs")  # this run's suffix
ZK_ROOT = "/cerb-docs/%s/locks" % RUN
ETCD_PREFIX = RUN + "-"

# A literal name: the first argument of lock(), alock(), guard(), once(),
# inspect() (redis-py's r.lock() included).
_NAME = re.compile(r'\.(?:a?lock|guard|once|inspect)\(\s*"([^"\\]+)"')


def isolate(code: str) -> Tuple[str, Dict[str, str]]:
    """The block with this run's names: (code, {old name: new name})."""
    names = {n: "%s-%s" % (n, RUN) for n in sorted(set(_NAME.findall(code)))}
    code = code.replace('"/cerberus/locks/', '"%s/' % ZK_ROOT)
    for old, new in names.items():
        code = code.replace('"%s"' % old, '"%s"' % new).replace('/%s"' % old, '/%s"' % new)
    return code, names


def test_names_are_made_unique_per_run():
    code = ('with client.lock("a", wait=5):\n    r.lock("a")\n    client.guard("s", "k")\n'
            '    CuratorLock(zk, "/cerberus/locks/a")\n    job(client, "a", 1)\n')
    out, names = isolate(code)
    assert names == {"a": "a-" + RUN, "s": "s-" + RUN}
    assert out.count('"a-%s"' % RUN) == 3 and '"%s/a-%s"' % (ZK_ROOT, RUN) in out
    assert '"k"' in out  # a key is not a name: the scope makes it unique
    for _, block in BLOCKS:  # every name a block uses is rewritten
        out, _ = isolate(block)
        assert not [n for n in _NAME.findall(out) if not n.endswith(RUN)], block


def _engines(code: str) -> List[str]:
    if re.match(r"#\s*cerberus serve\s*\n", code):
        return ["serve"]
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
            parts.append('zk = { hosts = "127.0.0.1:%d"; root = "%s"; };' % (p, ZK_ROOT))
            env["ZK_HOSTS"] = "127.0.0.1:%d" % p
        elif e == "etcd":
            p = int(os.environ.get("CERB_ETCD_PORT") or 0)
            if not p:
                pytest.skip("CERB_ETCD_PORT is not set")
            parts.append('etcd = { endpoints = ("http://127.0.0.1:%d"); prefix = "%s"; };'
                         % (p, ETCD_PREFIX))
            env["ETCD_ENDPOINTS"] = "http://127.0.0.1:%d" % p
        elif e == "serve":
            parts[0] = 'engines = ("local");'
        elif e != "local":
            pytest.fail("unknown engine %r in a block's cerberus.cfg line" % e)
    return "\n".join(parts) + "\n", env


_prepared = set()


@pytest.mark.parametrize("line,code", BLOCKS, ids=["python.md:%d" % l for l, _ in BLOCKS])
def test_example_runs(line, code, tmp_path):
    engines = _engines(code)
    code, _ = isolate(code)
    if "kazoo" in code:
        require_module("kazoo", "python3-kazoo")
    if "import redis" in code:
        require_module("redis", "python3-redis")
    cfg, extra = _config(engines)
    (tmp_path / "cerberus.cfg").write_text(cfg)
    if "redis" in engines and DOCS_DB not in _prepared:
        # The docs' database is new to Cerberus, not the server: force.
        cerberus.init_stores(tmp_path / "cerberus.cfg", force=True)
        _prepared.add(DOCS_DB)
    env = child_env()
    env.update(extra)
    daemon = None
    if engines == ["serve"]:
        (tmp_path / "serve").mkdir()
        daemon = Daemon(tmp_path / "serve", cfg)
        env["CERBERUS_ADDRESS"] = daemon.address
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail("docs/python.md:%d: the example ran over 60 s; output so far:\n%s\n%s"
                    % (line, e.stdout, e.stderr))
    finally:
        if daemon is not None:
            daemon.stop()
    if r.returncode != 0:
        pytest.fail("docs/python.md:%d: the example exited %d\n--- stdout\n%s--- stderr\n%s"
                    % (line, r.returncode, r.stdout, r.stderr))


@pytest.fixture(scope="module", autouse=True)
def _remove_zk_root():
    yield
    port = os.environ.get("CERB_ZK_PORT")
    if not port:
        return
    try:
        from kazoo.client import KazooClient
    except ImportError:
        return
    zk = KazooClient(hosts="127.0.0.1:%s" % port)
    try:
        zk.start(timeout=10)
        zk.delete(ZK_ROOT.rsplit("/", 1)[0], recursive=True)
    except Exception:  # noqa: BLE001 - best effort: the names are this run's alone
        pass
    finally:
        zk.stop()
        zk.close()
