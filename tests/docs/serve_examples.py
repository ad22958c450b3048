#!/usr/bin/env python3
"""serve_examples.py — runs the client examples of docs/serve.md against a
real `cerberus serve` (issue 27).

    serve_examples.py --cli PATH/TO/cerberus [--doc docs/serve.md]
                      [--port N] [--timeout S] [--verbose]

What it does, in order:

 1. Starts the build's `cerberus serve` with the built-in "local" engine
    (no lock server), on a unix socket in a new temporary directory and on
    127.0.0.1:PORT (--port, else $CERB_TEST_DOCS_SERVE_PORT, else 28380)
    with a token file of mode 0600, and waits (deadline 30 s, polling
    /healthz on both) until it answers.
 2. Takes every fenced block of the page whose line directly above is
    <!-- serve-example --> (a marker of its own: doc-check.py's markers
    are doc-test and illustrative, for ```console blocks only). The block's
    language says how it runs: sh/bash with `bash -e`, python with python3,
    js with node (as an .mjs module). A marked block in another language is
    an error, and so is a page with no marked sh, python or js block (an
    example renamed must not silently stop being run).
 3. Replaces the page's placeholders, exactly these strings:
        /run/cerberus/cerberus.sock  -> the daemon's unix socket
        127.0.0.1:7080               -> 127.0.0.1:PORT
        /etc/cerberus/token          -> the token file
    and runs the block in an empty directory of its own, stdin /dev/null,
    with a timeout (--timeout, 60 s).
 4. A block passes when it exits 0 and each of its `prints: TEXT` comments
    (after # or //) matches a line of its output (stdout and stderr
    together), in the order of the comments; `...` in TEXT matches any
    text. After each block the daemon must hold nothing
    (cerberus_serve_holds 0 in /metrics): an example releases what it
    takes. A failure names the block's line in the page and shows its
    output.
 5. Stops the daemon by its PID (SIGTERM; SIGKILL after 15 s) and fails
    unless it exited 0.

Node blocks are skipped, with a message, only when `node` is not on PATH.
Output: one "ok"/"not ok" line per block; exit 1 when any failed, 2 on a
usage error. Python 3 standard library only.
"""

import argparse
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MARKER = "<!-- serve-example -->"
FENCE_OPEN = re.compile(r"^(`{3,}|~{3,})\s*([A-Za-z0-9_+-]*)")
PLACEHOLDERS = ("/run/cerberus/cerberus.sock", "127.0.0.1:7080", "/etc/cerberus/token")
RUNNERS = {  # language -> (file suffix, command prefix)
    "sh": (".sh", ["bash", "-e"]),
    "bash": (".sh", ["bash", "-e"]),
    "python": (".py", [sys.executable]),
    "js": (".mjs", ["node"]),
}
KINDS = {"sh": "sh", "bash": "sh", "python": "python", "js": "js"}
PRINTS = re.compile(r"^\s*(?:#|//)\s*prints:\s?(.*?)\s*$")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def get(conn, path, headers=None):
    """(status, body text) of GET path, or None when nobody answers."""
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        conn.close()


def blocks(path):
    """[(line of the fence, language, text)] of the marked blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        j = i + 1
        while j < len(lines) and not re.match(r"^%s%s*\s*$" % (re.escape(fence), fence[0]), lines[j]):
            j += 1
        if i > 0 and lines[i - 1].strip() == MARKER:
            out.append((i + 1, lang, "\n".join(lines[i + 1:j]) + "\n"))
        i = j + 1
    return out


def matches(pattern, line):
    rx = "^" + ".*".join(re.escape(p) for p in pattern.split("...")) + "$"
    return re.match(rx, line.rstrip()) is not None


def check_prints(text, output):
    """None when every prints: comment matches, in order; else what did not."""
    out = output.split("\n")
    k = 0
    for src in text.split("\n"):
        m = PRINTS.match(src)
        if not m:
            continue
        want = m.group(1)
        while k < len(out) and not matches(want, out[k]):
            k += 1
        if k == len(out):
            return want
        k += 1
    return None


def holds_now(sock):
    r = get(UnixConnection(sock, 10), "/metrics")
    if not r or r[0] != 200:
        return None
    m = re.search(r"^cerberus_serve_holds (\d+)", r[1], re.M)
    return int(m.group(1)) if m else None


def port_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As the daemon binds: connections of an earlier run in TIME_WAIT do
    # not make the port busy.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def main(argv):
    ap = argparse.ArgumentParser(description="Run docs/serve.md's client examples.")
    ap.add_argument("--cli", required=True, help="the built cerberus")
    ap.add_argument("--doc", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "..", "docs", "serve.md"))
    ap.add_argument("--port", type=int,
                    default=int(os.environ.get("CERB_TEST_DOCS_SERVE_PORT", "28380")))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per block")
    ap.add_argument("--verbose", "-v", action="store_true", help="show every block's output")
    a = ap.parse_args(argv)
    if not (0 < a.port < 32768):
        ap.error("--port must be from 1 to 32767")
    if not os.access(a.cli, os.X_OK):
        ap.error("--cli %s: not an executable" % a.cli)

    found = blocks(a.doc)
    # The page as the reader knows it (docs/serve.md), when it is this tree's.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shown = os.path.relpath(os.path.abspath(a.doc), root)
    if shown.startswith(".."):
        shown = a.doc
    failed = False
    bad = [(ln, lang) for ln, lang, _ in found if lang not in RUNNERS]
    for ln, lang in bad:
        print("not ok - %s:%d: a serve-example marker above a ```%s block; the test runs "
              "sh, bash, python and js" % (a.doc, ln, lang or "(no language)"))
        failed = True
    missing = sorted(set(KINDS.values()) - {KINDS[lang] for _, lang, _ in found if lang in KINDS})
    for kind in missing:
        print("not ok - %s: no ```%s block marked %s (the page's examples must be run)"
              % (a.doc, kind, MARKER))
        failed = True
    if not port_free(a.port):
        print("not ok - 127.0.0.1:%d is in use (set CERB_TEST_DOCS_SERVE_PORT)" % a.port)
        return 1

    work = tempfile.mkdtemp(prefix="cerb-docs-serve-")
    sock = os.path.join(work, "s.sock")
    token_file = os.path.join(work, "token")
    cfg = os.path.join(work, "cerberus.cfg")
    with open(cfg, "w") as f:
        f.write('engines = ("local");\n')
    token = "docs-" + os.urandom(16).hex()
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (token + "\n").encode())
    os.close(fd)
    log_path = os.path.join(work, "serve.log")
    log = open(log_path, "wb")
    daemon = subprocess.Popen([a.cli, "-c", cfg, "serve", "--listen", "unix:" + sock,
                               "--listen", "127.0.0.1:%d" % a.port, "--token-file", token_file],
                              stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def daemon_log():
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    try:
        deadline = time.monotonic() + 30
        auth = {"Authorization": "Bearer " + token}
        while True:
            u = get(UnixConnection(sock, 2), "/healthz") if os.path.exists(sock) else None
            t = get(http.client.HTTPConnection("127.0.0.1", a.port, timeout=2), "/healthz", auth)
            if u and t and u[0] == 200 and t[0] == 200:
                break
            if daemon.poll() is not None or time.monotonic() > deadline:
                print("not ok - the daemon did not start (exit %s):\n%s"
                      % (daemon.poll(), daemon_log()))
                return 1
            time.sleep(0.05)  # polling a condition, with the deadline above
        print("ok - cerberus serve answers on %s and 127.0.0.1:%d" % (sock, a.port))

        subst = (sock, "127.0.0.1:%d" % a.port, token_file)
        for ln, lang, text in found:
            if lang not in RUNNERS:
                continue
            where = "%s:%d (```%s)" % (shown, ln, lang)
            suffix, cmd = RUNNERS[lang]
            if lang == "js" and not shutil.which("node"):
                print("ok - %s # SKIP node is not installed" % where)
                continue
            for ph, real in zip(PLACEHOLDERS, subst):
                text = text.replace(ph, real)
            bdir = tempfile.mkdtemp(prefix="block%d-" % ln, dir=work)
            src = os.path.join(bdir, "example" + suffix)
            with open(src, "w", encoding="utf-8") as f:
                f.write(text)
            try:
                p = subprocess.run(cmd + [src], cwd=bdir, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=a.timeout)
                output, rc = p.stdout.decode("utf-8", "replace"), p.returncode
            except subprocess.TimeoutExpired as e:
                output = (e.stdout or b"").decode("utf-8", "replace")
                rc = "timeout after %g s" % a.timeout
            why = None
            if rc != 0:
                why = "exited %s" % rc
            else:
                unmatched = check_prints(text, output)
                if unmatched is not None:
                    why = "its output has no line (in order) matching `prints: %s`" % unmatched
                else:
                    n = holds_now(sock)
                    if n != 0:
                        why = "the daemon holds %s hold(s) after it: the example must release " \
                              "what it takes" % n
            if why:
                failed = True
                print("not ok - %s: %s; its output:" % (where, why))
                for line in output.rstrip("\n").split("\n"):
                    print("    " + line)
            else:
                print("ok - %s" % where)
                if a.verbose:
                    for line in output.rstrip("\n").split("\n"):
                        print("    " + line)
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        log.close()
    if daemon.returncode != 0:
        print("not ok - the daemon exited %s on SIGTERM:\n%s" % (daemon.returncode, daemon_log()))
        failed = True
    if token in daemon_log():
        print("not ok - the token is in the daemon's log")
        failed = True
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
