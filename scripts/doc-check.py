#!/usr/bin/env python3
"""doc-check.py — the checks that keep Cerberus' Markdown from rotting (issue 24).

    doc-check.py [CHECK] [options] [FILE.md ...]

CHECK is one of (default: all of them, in this order):

  c         every ```c block is a whole translation unit: it is compiled with
            CC -std=c11 -Wall -Wextra -Werror -Wno-unused-function
            -Wno-unused-parameter -Wno-unused-variable
            -Wno-unused-but-set-variable -I SRC/include -c; a block that
            defines main is also linked against libcerberus when --lib is
            given (with --link-flags, e.g. the build's sanitizer flags).
            Blocks are compiled in parallel (--jobs). A failure names the
            block's file:line and the compiler's message, whose line numbers
            are the Markdown file's (a #line directive maps them).
  console   every ```console block whose `$ ` commands run `cerberus`: when
            it shows output, the line directly above its fence must be one of
            <!-- doc-test -->, <!-- doc-test: engines=redis,zk -->,
            <!-- illustrative -->. Illustrative blocks are not run. Doc-test
            blocks run (--jobs at a time) each in an empty temporary
            directory holding ./cerberus.cfg with the engines named, in that
            order (default: local), on the test servers whose ports are in
            $CERB_REDIS_PORT, $CERB_ZK_PORT, $CERB_ETCD_PORT (a block naming
            an engine whose port is not set fails), in a fresh namespace:
            redis.prefix "cerb-doc-<id>:" (given its marker by
            `cerberus init --force` before the block: the namespace is new,
            the shared server is not), zk.root "/cerb-doc/<id>/locks",
            etcd.prefix "cerb-doc-<id>-", local.dir a directory of its own.
            Each `$ ` line (one ending in a backslash continues on the next) runs
            as `bash -c`, PATH starting at the directory of --cli,
            $CERBERUS_CONFIG unset, LC_ALL=C, stdin /dev/null, $? set to the
            previous line's exit status, 30 s at most (--timeout); nothing
            else carries between lines (no variables, no cd). What it
            printed on stdout and stderr is compared with the lines that
            follow it: `...` inside a line matches any text, a line that is
            only `...` matches any number of lines, trailing spaces and
            trailing blank lines are ignored. Processes a line leaves in the
            background (`cmd &`) are killed when the block ends; what they
            print after their line has ended is not compared. A mismatch
            prints a diff and what the command printed.
  links     every relative link [t](path), [t](path#anchor), [t](#anchor)
            and image ![a](path) outside code resolves: the file exists
            (relative to the linking file) and, in a .md target, the anchor
            is a heading's GitHub slug or an explicit <a id="x">/<a name="x">.
            Links into other files need only the file. http(s):, mailto: and
            other schemes are not checked.
  coverage  every status of CERB_STATUS_MAP (SRC/include/cerberus.h) is named
            in docs/guide.md; every public function of that header is named
            on some docs/*.md page; every long option of the `cerberus`
            usage texts (SRC/cli/*.c) and every configuration key of
            SRC/man/cerberus.cfg.5 is named in docs/operations.md; README.md
            has at most 250 lines. Named = as a whole word (cerb_lock does not
            count inside cerb_lock_new); a top-level key without a dot
            (engines, active, epoch) must be named in `code`.
  all       all four.

FILE arguments replace the default set (README.md, CONTRIBUTING.md and
CHANGELOG.md when present, docs/*.md under --root) for c, console and links;
coverage always reads the tree under --root.

Exit status: 0 every check passed, 1 some failed, 2 usage error.
Python 3 standard library only.
"""

import argparse
import concurrent.futures
import difflib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.dirname(HERE)
CHECKS = ("c", "console", "links", "coverage")

C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function",
           "-Wno-unused-parameter", "-Wno-unused-variable",
           "-Wno-unused-but-set-variable"]
README_MAX_LINES = 250
ENGINES = {  # engine -> the environment variable holding its test port
    "redis": "CERB_REDIS_PORT",
    "zk": "CERB_ZK_PORT",
    "etcd": "CERB_ETCD_PORT",
    "local": None,
}


# ----------------------------------------------------------------- reporting

class Report:
    """TAP-like lines; failures carry file:line, what is wrong, what to do."""

    def __init__(self):
        self.counts = {}

    def ok(self, check, msg):
        self.counts.setdefault(check, [0, 0])[0] += 1
        print("ok - %s: %s" % (check, msg))

    def fail(self, check, where, msg, todo=None, detail=None):
        self.counts.setdefault(check, [0, 0])[1] += 1
        print("not ok - %s: %s: %s" % (check, where, msg))
        if detail:
            for line in detail.rstrip("\n").split("\n"):
                print("    " + line)
        if todo:
            print("    what to do: " + todo)

    def failed(self):
        return any(f for _, f in self.counts.values())

    def summary(self, checks):
        parts = []
        for c in checks:
            ok, bad = self.counts.get(c, [0, 0])
            parts.append("%s %d ok, %d failed" % (c, ok, bad))
        print("doc-check: " + "; ".join(parts))


def rel(path, root):
    p = os.path.relpath(os.path.abspath(path), root)
    return path if p.startswith("..") else p


# ------------------------------------------------------------ markdown parse

FENCE_OPEN = re.compile(r"^( *)(`{3,}|~{3,})(.*)$")
MARKER_RE = re.compile(
    r"^<!--\s*(?:(doc-test)(?:\s*:\s*engines\s*=\s*([A-Za-z0-9_, ]*?))?|(illustrative))\s*-->$")


class Block:
    def __init__(self, path, line, lang, info, lines, above, above2, end):
        self.path = path          # the Markdown file
        self.line = line          # 1-based line of the opening fence
        self.lang = lang          # first word of the info string, lower-case
        self.info = info
        self.lines = lines        # content, the fence's indentation removed
        self.above = above        # the line directly above the fence ("" if none)
        self.above2 = above2      # the line above that
        self.end = end            # 1-based line of the closing fence (None: unclosed)


class Doc:
    """A Markdown file: its lines, its fenced blocks, and its text with the
    fenced blocks blanked (same line count) for the link and word checks."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8", errors="replace") as f:
            self.text = f.read()
        self.lines = self.text.split("\n")
        if self.lines and self.lines[-1] == "":
            self.lines.pop()
        self.blocks = []
        prose = []
        i, n = 0, len(self.lines)
        while i < n:
            m = FENCE_OPEN.match(self.lines[i])
            # Any indentation: GitHub renders fences nested in list items.
            if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):
                prose.append(self.lines[i])
                i += 1
                continue
            indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
            close = re.compile(r"^ *" + re.escape(fence[0]) + "{%d,} *$" % len(fence))
            j = i + 1
            content = []
            while j < n and not close.match(self.lines[j]):
                line = self.lines[j]
                k = 0
                while k < indent and k < len(line) and line[k] == " ":
                    k += 1
                content.append(line[k:])
                j += 1
            lang = info.split()[0].lower() if info else ""
            above = self.lines[i - 1].strip() if i >= 1 else ""
            above2 = self.lines[i - 2].strip() if i >= 2 else ""
            self.blocks.append(Block(path, i + 1, lang, info, content, above, above2,
                                     j + 1 if j < n else None))
            prose.extend([""] * (min(j, n - 1) - i + 1))
            i = j + 1
        self.prose = prose  # same length as self.lines


def default_files(root):
    files = []
    for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md"):
        p = os.path.join(root, name)
        if os.path.exists(p):
            files.append(p)
    d = os.path.join(root, "docs")
    if os.path.isdir(d):
        files += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    return files


# --------------------------------------------------------------------- c

C_MAIN = re.compile(r"\bint\s+main\s*\(")


def strip_c_comments(src):
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j) or " ")
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def compile_block(block, idx, args, root, workdir):
    """Returns (block, ok, note, message)."""
    where = "%s:%d" % (rel(block.path, root), block.line)
    src = os.path.join(workdir, "block%03d.c" % idx)
    with open(src, "w", encoding="utf-8") as f:
        # Line numbers of diagnostics are the Markdown file's.
        f.write('#line %d "%s"\n' % (block.line + 1, rel(block.path, root)))
        f.write("\n".join(block.lines) + "\n")
    has_main = bool(C_MAIN.search(strip_c_comments("\n".join(block.lines))))
    cmd = list(args.cc) + C_FLAGS + ["-I", args.include, src]
    note = "compiled"
    if has_main and args.lib:
        extra = shlex.split(args.link_flags or "")
        cmd += extra + ["-o", os.path.join(workdir, "block%03d" % idx),
                        "-L", args.lib, "-Wl,-rpath," + args.lib, "-lcerberus"]
        note = "compiled and linked"
    else:
        cmd += ["-c", "-o", os.path.join(workdir, "block%03d.o" % idx)]
        if has_main:
            note = "compiled (defines main; not linked: no --lib)"
    try:
        # From the root, where the #line file names resolve: the compiler
        # quotes the Markdown lines in its diagnostics.
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=120, cwd=root)
    except FileNotFoundError:
        return block, False, where, "compiler not found: %s" % args.cc[0]
    except subprocess.TimeoutExpired:
        return block, False, where, "the compiler took more than 120 s"
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        return block, False, where, out or ("compiler exit status %d" % p.returncode)
    return block, True, where, note


def check_c(docs, args, root, rep):
    blocks = [b for d in docs for b in d.blocks if b.lang == "c"]
    if not blocks:
        rep.ok("c", "no ```c blocks")
        return
    if not os.path.isfile(os.path.join(args.include, "cerberus.h")):
        rep.fail("c", args.include, "no cerberus.h in the include directory",
                 "pass --src with the source tree (or --include DIR)")
        return
    with tempfile.TemporaryDirectory(prefix="doc-check-c.") as work:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            futs = [ex.submit(compile_block, b, i, args, root, work)
                    for i, b in enumerate(blocks)]
            for fut in futs:  # in document order
                block, ok, where, msg = fut.result()
                if ok:
                    rep.ok("c", "%s: %s" % (where, msg))
                else:
                    rep.fail("c", where, "the ```c block does not build", detail=msg,
                             todo="make the block a whole translation unit that compiles "
                             "(include <cerberus.h> and every system header it uses; "
                             "#define _POSIX_C_SOURCE 200809L before them for POSIX "
                             "functions; fragments as static functions; no `...`), or use "
                             "```text for pseudo-code")


# --------------------------------------------------------------- console

CERBERUS_CMD = re.compile(r"(^|[\s;|&(/`$])cerberus(?=$|[\s;|&)])")


def parse_console(block):
    """[(line_no, command, [expected lines])] — line_no is the Markdown line."""
    cmds = []
    lines = block.lines
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ ") or line == "$":
            lno = block.line + 1 + i
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd + "\n" + lines[i]
            cmds.append([lno, cmd, []])
        elif cmds:
            cmds[-1][2].append(line)
        else:
            cmds.append([block.line + 1 + i, None, [line]])  # output before any command
        i += 1
    return cmds


def line_pattern(exp):
    parts = exp.split("...")
    return re.compile("^" + ".*".join(re.escape(p) for p in parts) + "$", re.S)


def compare_output(expected, actual):
    """Wildcard-aware alignment. Returns (matched, diff lines)."""
    exp = [e.rstrip() for e in expected]
    act = [a.rstrip() for a in actual]
    while exp and exp[-1] == "":
        exp.pop()
    while act and act[-1] == "":
        act.pop()
    n, m = len(exp), len(act)
    star = [e.strip() == "..." for e in exp]
    pats = [None if star[i] else line_pattern(exp[i]) for i in range(n)]
    INF = 1 << 30
    # cost[i][j]: fewest unmatched lines aligning exp[i:] with act[j:].
    cost = [[INF] * (m + 1) for _ in range(n + 1)]
    move = [[None] * (m + 1) for _ in range(n + 1)]
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if i == n and j == m:
                cost[i][j] = 0
                continue
            best, mv = INF, None
            if i < n and star[i]:
                if j < m and cost[i][j + 1] < best:
                    best, mv = cost[i][j + 1], "eat"
                if cost[i + 1][j] < best:
                    best, mv = cost[i + 1][j], "star"
            else:
                if i < n and j < m and pats[i].match(act[j]) and cost[i + 1][j + 1] < best:
                    best, mv = cost[i + 1][j + 1], "same"
                if i < n and cost[i + 1][j] + 1 < best:
                    best, mv = cost[i + 1][j] + 1, "-"
                if j < m and cost[i][j + 1] + 1 < best:
                    best, mv = cost[i][j + 1] + 1, "+"
            cost[i][j], move[i][j] = best, mv
    if cost[0][0] == 0:
        return True, []
    diff, i, j, starred = [], 0, 0, False
    while i < n or j < m:
        mv = move[i][j]
        if mv == "eat":
            if not starred:
                diff.append("  " + exp[i])
                starred = True
            j += 1
        elif mv == "star":
            if not starred:
                diff.append("  " + exp[i])
            starred = False
            i += 1
        elif mv == "same":
            diff.append("  " + act[j])
            i += 1
            j += 1
        elif mv == "-":
            diff.append("- " + exp[i])
            i += 1
        else:
            diff.append("+ " + act[j])
            j += 1
    return False, diff


def printed(actual, limit=60):
    lines = list(actual)
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return "| (nothing)"
    more = len(lines) - limit
    lines = ["| " + a for a in lines[:limit]]
    if more > 0:
        lines.append("| ... (%d more lines)" % more)
    return "\n".join(lines)


def kill_group(pgid, grace=1.0):
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cfg_for(engines, base, tag):
    lines = ["engines = (%s);" % ", ".join('"%s"' % e for e in engines)]
    for e in engines:
        if e == "redis":
            lines.append('redis = { host = "127.0.0.1"; port = %s; prefix = "cerb-doc-%s:"; };'
                         % (os.environ["CERB_REDIS_PORT"], tag))
        elif e == "zk":
            lines.append('zk = { hosts = "127.0.0.1:%s"; root = "/cerb-doc/%s/locks"; };'
                         % (os.environ["CERB_ZK_PORT"], tag))
        elif e == "etcd":
            lines.append('etcd = { endpoints = ("http://127.0.0.1:%s"); prefix = "cerb-doc-%s-"; };'
                         % (os.environ["CERB_ETCD_PORT"], tag))
        elif e == "local":
            d = os.path.join(base, "local")
            os.makedirs(d, exist_ok=True)
            lines.append('local = { dir = "%s"; };' % d)
    return "\n".join(lines) + "\n"


def run_console_block(block, engines, args, root):
    """Returns a list of (ok, where, msg, detail, todo)."""
    res = []
    where = "%s:%d" % (rel(block.path, root), block.line)
    if not args.cli:
        return [(False, where, "doc-test block, but no --cli (the built `cerberus`) given",
                 None, "run it through ctest (docs_console) or pass --cli build/cli/cerberus")]
    cli = os.path.abspath(args.cli)
    cli_bin = os.path.join(cli, "cerberus") if os.path.isdir(cli) else cli
    if not os.access(cli_bin, os.X_OK):
        return [(False, where, "--cli %s: no executable cerberus there" % args.cli, None,
                 "build the cli (cmake --build BUILD --target cerberus_cli)")]
    missing = [e for e in engines if ENGINES[e] and not os.environ.get(ENGINES[e])]
    if missing:
        return [(False, where, "the block needs engine(s) %s, but %s not set: no test server "
                 "is configured for them" % (", ".join(missing), ", ".join(
                     "$" + ENGINES[e] for e in missing)), None,
                 "run it through ctest (docs_console starts the servers and sets the ports), or "
                 "export the port of a test server you started with scripts/servers.sh")]
    env = dict(os.environ)
    env.pop("CERBERUS_CONFIG", None)
    env["PATH"] = os.path.dirname(cli_bin) + os.pathsep + env.get("PATH", "")
    env["LC_ALL"] = "C"
    tag = uuid.uuid4().hex[:12]
    base = tempfile.mkdtemp(prefix="doc-check-console.")
    work = os.path.join(base, "work")
    os.makedirs(work)
    groups = []
    group_kw = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    try:
        with open(os.path.join(work, "cerberus.cfg"), "w") as f:
            f.write(cfg_for(engines, base, tag))
        # --force: the namespace is new (no holder of it can exist), but the
        # shared server holds other namespaces' keys, which `init` alone
        # rightly takes for signs of earlier use (they may be all that came
        # back after this namespace lost its data).
        p = subprocess.run([cli_bin, "init", "--force"], cwd=work, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=args.timeout)
        if p.returncode != 0:
            return [(False, where, "could not prepare the block's namespace: `cerberus init "
                     "--force` exited %d" % p.returncode,
                     p.stdout.decode("utf-8", "replace") + "\ncerberus.cfg:\n" +
                     cfg_for(engines, base, tag),
                     "check that the test servers run (ctest starts them as fixtures)")]
        prev = 0
        for k, (lno, cmd, expected) in enumerate(parse_console(block)):
            cwhere = "%s:%d" % (rel(block.path, root), lno)
            if cmd is None:
                if any(e.strip() for e in expected):
                    res.append((False, cwhere, "output before the first `$ ` command", None,
                                "start the block with a `$ command` line"))
                continue
            outp = os.path.join(base, "out%03d" % k)
            with open(outp, "wb") as out:
                proc = subprocess.Popen(["bash", "-c", "(exit %d); %s" % (prev, cmd)], cwd=work,
                                        env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, **group_kw)
            groups.append(proc.pid)
            try:
                prev = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid, 2.0)
                proc.wait()
                res.append((False, cwhere, "`$ %s` did not finish in %g s" % (cmd, args.timeout),
                            None, "doc-test commands must finish on their own; mark the block "
                            "<!-- illustrative --> or bound the command"))
                prev = 124
                continue
            if prev < 0:
                prev = 128 - prev
            with open(outp, "rb") as f:
                actual = f.read().decode("utf-8", "replace").split("\n")
            same, diff = compare_output(expected, actual)
            if same:
                res.append((True, cwhere, "`$ %s`" % cmd.split("\n")[0], None, None))
            else:
                res.append((False, cwhere, "`$ %s` printed something else (exit status %d)"
                            % (cmd.split("\n")[0], prev),
                            "- expected (in the block), + actual; a `...` line stands for the "
                            "lines it matched\n" + "\n".join(diff) + "\nthe command printed:\n"
                            + printed(actual),
                            "update the block to what the command prints now (`...` for parts "
                            "that vary between runs), or mark it <!-- illustrative --> if its "
                            "output cannot be made deterministic"))
    except subprocess.TimeoutExpired:
        res.append((False, where, "`cerberus init` did not finish in %g s" % args.timeout, None,
                    "check that the test servers run"))
    finally:
        for g in groups:
            kill_group(g)
        shutil.rmtree(base, ignore_errors=True)
    return res


def console_plan(block):
    """What to do with a block: ("skip"|"run"|"error", engines or message)."""
    marker_m = MARKER_RE.match(block.above)
    looks_marker = block.above.startswith("<!--") and (
        "doc-test" in block.above or "illustrative" in block.above)
    if block.lang != "console":
        if marker_m or looks_marker:
            return "error", ("a doc-test/illustrative marker sits above a ```%s block: markers "
                             "apply to ```console blocks only" % (block.lang or "(no language)"),
                             "make the block ```console (with `$ ` before each command) or drop "
                             "the marker")
        return "ignore", None
    cmds = parse_console(block)
    runs_cerb = any(c is not None and CERBERUS_CMD.search(c) for _, c, _ in cmds)
    shows_output = any(e.strip() for _, c, out in cmds for e in out)
    if looks_marker and not marker_m:
        return "error", ("malformed marker above the block: %r" % block.above,
                         "use exactly <!-- doc-test -->, <!-- doc-test: engines=redis,zk --> "
                         "or <!-- illustrative -->")
    if not marker_m:
        stray = MARKER_RE.match(block.above2) if block.above == "" else None
        if stray:
            return "error", ("the marker %s is not on the line directly above the fence "
                             "(a blank line separates them)" % block.above2,
                             "remove the blank line between the marker and the ```console fence")
        if runs_cerb and shows_output:
            seen = (" (the line above, %s, is not one)" % block.above
                    if block.above.startswith("<!--") else "")
            return "error", ("a ```console block runs `cerberus` and shows output but has no "
                             "marker on the line directly above its fence" + seen,
                             "put <!-- doc-test --> (CI runs it and compares; "
                             "<!-- doc-test: engines=redis,zk --> for servers) or "
                             "<!-- illustrative --> (not run) on the line above the fence")
        return "ignore", None
    if marker_m.group(3):
        return "illustrative", None
    names = marker_m.group(2)
    engines = [e.strip() for e in names.split(",") if e.strip()] if names is not None else ["local"]
    bad = [e for e in engines if e not in ENGINES]
    if not engines or bad or len(set(engines)) != len(engines):
        return "error", ("bad engine list in %r" % block.above,
                         "name engines among redis, zk, etcd, local, each once, comma-separated")
    if not any(c is not None for _, c, _ in cmds):
        return "error", ("a doc-test block without a `$ ` command line",
                         "prefix each command with `$ `")
    return "run", engines


def check_console(docs, args, root, rep):
    seen = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        items = []  # in document order: a plan's verdict, or a run's future
        for d in docs:
            for b in d.blocks:
                kind, what = console_plan(b)
                if kind == "ignore":
                    continue
                seen += 1
                where = "%s:%d" % (rel(b.path, root), b.line)
                if kind == "error":
                    items.append([(False, where, what[0], None, what[1])])
                elif kind == "illustrative":
                    items.append([(True, where, "illustrative, not run", None, None)])
                else:
                    items.append(ex.submit(run_console_block, b, what, args, root))
        for item in items:
            results = item if isinstance(item, list) else item.result()
            for ok, where, msg, detail, what in results:
                if ok:
                    rep.ok("console", "%s: %s" % (where, msg))
                else:
                    rep.fail("console", where, msg, what, detail)
            sys.stdout.flush()
    if not seen:
        rep.ok("console", "no ```console block runs cerberus with output")


# ------------------------------------------------------------------ links

def blank_code_spans(text):
    """Inline code spans replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i] == "`":
            j = i
            while j < n and text[j] == "`":
                j += 1
            run = text[i:j]
            k = j
            while True:
                k = text.find(run, k)
                if k < 0:
                    break
                e = k + len(run)
                if (e >= n or text[e] != "`") and text[k - 1] != "`":
                    break
                k = e
                while k < n and text[k] == "`":
                    k += 1
            if k < 0:
                out.append(run)
                i = j
                continue
            e = k + len(run)
            out.append(re.sub(r"[^\n]", " ", text[i:e]))
            i = e
        elif text[i] == "\\" and i + 1 < n:
            out.append(text[i:i + 2])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def strip_md_inline(s):
    s = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", s)
    s = re.sub(r"<[^>]+>", "", s)
    s = s.replace("`", "")
    s = re.sub(r"(\*+|~~)", "", s)
    s = re.sub(r"(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])", "", s)
    return s


def github_slug(heading):
    s = strip_md_inline(heading).strip().lower()
    s = "".join(ch for ch in s if ch.isalnum() or ch in " -_")
    return s.replace(" ", "-")


ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
ANCHOR_TAG = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def anchors_of(doc):
    seen, out = {}, set()
    prose = doc.prose
    for i, line in enumerate(prose):
        text = None
        m = ATX.match(line)
        if m:
            text = m.group(2) or ""
        elif i + 1 < len(prose) and line.strip() and re.match(r"^ {0,3}(=+|-+)[ \t]*$", prose[i + 1]) \
                and not re.match(r"^ {0,3}([-*_] *){3,}$", line) and not line.lstrip().startswith(("-", "*", "+", ">", "|")):
            text = line.strip()
        if text is not None:
            slug = github_slug(text)
            k = seen.get(slug, 0)
            seen[slug] = k + 1
            out.add(slug if k == 0 else "%s-%d" % (slug, k))
    for line in prose:
        for m in ANCHOR_TAG.finditer(line):
            out.add(m.group(1))
    return out


LINK_RE = re.compile(r"(!?)\[((?:[^\[\]\\]|\\.|\[[^\[\]]*\])*)\]\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                     r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFDEF_RE = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)", re.M)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def check_links(docs, args, root, rep):
    cache = {}

    def doc_of(path):
        path = os.path.abspath(path)
        if path not in cache:
            cache[path] = Doc(path)
        return cache[path]

    total = 0
    for d in docs:
        cache[os.path.abspath(d.path)] = d
        for b in d.blocks:
            if b.end is None:
                rep.fail("links", "%s:%d" % (rel(d.path, root), b.line),
                         "a code fence is opened here and never closed: the rest of the file "
                         "renders as code", "close it with a line of %s" % ("`" * 3))
        text = blank_code_spans("\n".join(d.prose))
        # HTML comments do not render: their links are not links.
        text = re.sub(r"<!--.*?-->", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
        found = [(m.start(), m.group(3)) for m in LINK_RE.finditer(text)]
        found += [(m.start(2), m.group(2)) for m in REFDEF_RE.finditer(text)]
        for pos, dest in sorted(found):
            line = text.count("\n", 0, pos) + 1
            where = "%s:%d" % (rel(d.path, root), line)
            dest = dest.strip()
            if dest.startswith("<") and dest.endswith(">"):
                dest = dest[1:-1]
            if not dest or SCHEME.match(dest) or dest.startswith("//"):
                continue
            total += 1
            path, _, anchor = dest.partition("#")
            path = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), path)
            path = path.split("?")[0]
            if path:
                base = root if path.startswith("/") else os.path.dirname(os.path.abspath(d.path))
                target = os.path.normpath(os.path.join(base, path.lstrip("/")))
                if not os.path.exists(target):
                    rep.fail("links", where, "link to %s: no such file (%s)" % (dest, rel(target, root)),
                             "fix the path (relative to %s) or create the file" % rel(d.path, root))
                    continue
            else:
                target = os.path.abspath(d.path)
            if anchor and target.endswith(".md") and os.path.isfile(target):
                anchors = anchors_of(doc_of(target))
                if anchor not in anchors:
                    close = [a for a in anchors if a.lower() == anchor.lower()] or \
                        sorted(difflib_close(anchor, anchors))
                    hint = (" (did you mean %s?)" % ", ".join("#" + c for c in close[:3])) if close else ""
                    rep.fail("links", where, "link to %s: %s has no heading or <a id> with anchor "
                             "#%s%s" % (dest, rel(target, root), anchor, hint),
                             "link to an existing heading's GitHub slug (lower-case, punctuation "
                             "other than - and _ dropped, spaces to -, repeats get -1, -2), or "
                             "add <a id=\"%s\"></a> in the target" % anchor)
                    continue
            rep.ok("links", "%s: %s" % (where, dest))
    if not total:
        rep.ok("links", "no relative links")


def difflib_close(word, words):
    return difflib.get_close_matches(word, list(words), n=3, cutoff=0.6)


# --------------------------------------------------------------- coverage

def status_names(header_text):
    m = re.search(r"#\s*define\s+CERB_STATUS_MAP\s*\(\s*X\s*\)((?:[^\n]*\\\n)*[^\n]*)", header_text)
    if not m:
        return []
    return ["CERB_" + n for n in re.findall(r"\bX\s*\(\s*([A-Z0-9_]+)\s*,", m.group(1))]


def public_functions(header_text):
    src = strip_c_comments(header_text)
    src = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", src, flags=re.M)
    names, depth = [], 0
    ident = re.compile(r"\b(cerb_[A-Za-z0-9_]+)\s*\((?!\s*\*)")
    for m in re.finditer(r"[()]|\bcerb_[A-Za-z0-9_]+\s*\((?!\s*\*)", src):
        t = m.group(0)
        if t == "(":
            depth += 1
        elif t == ")":
            depth = max(0, depth - 1)
        else:
            name = ident.match(t).group(1)
            if depth == 0 and not name.startswith("cerb__") and name not in names:
                names.append(name)
            depth += 1
    return names


def c_string_literals(s):
    out = []
    for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"', s):
        lit = m.group(1)
        lit = re.sub(r"\\(.)", lambda e: {"n": "\n", "t": "\t"}.get(e.group(1), e.group(1)), lit)
        out.append(lit)
    return "".join(out)


def cli_long_options(cli_dir):
    """{option: [where it is named]} from the usage texts of cli/*.c."""
    opts = {}
    if not os.path.isdir(cli_dir):
        return opts
    for f in sorted(os.listdir(cli_dir)):
        if not f.endswith(".c"):
            continue
        with open(os.path.join(cli_dir, f), encoding="utf-8", errors="replace") as fh:
            src = fh.read()
        for m in re.finditer(r"\bconst\s+char\s+(\w*usage\w*)\s*\[\s*\]\s*=\s*((?:\s*\"(?:[^\"\\\n]|\\.)*\")+)\s*;",
                             src):
            var, text = m.group(1), c_string_literals(m.group(2))
            cmd = re.match(r"cerb__cli_(\w+)_usage$", var)
            label = "cerberus %s" % cmd.group(1) if cmd else "cerberus"
            for o in re.findall(r"(?:^|[\]\[ |,(])(--[A-Za-z][A-Za-z0-9-]*)", text, re.M):
                o = o.rstrip("-")
                opts.setdefault(o, [])
                if label not in opts[o]:
                    opts[o].append(label)
    return opts


def config_keys(page_text):
    return re.findall(r"^\.TP\n\\fB([A-Za-z_][A-Za-z0-9_.]*)\\fR \(", page_text, re.M)


def mentions(text, word, wordchars="A-Za-z0-9_"):
    return re.search(r"(?<![%s])%s(?![%s])" % (wordchars, re.escape(word), wordchars), text) is not None


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def check_coverage(args, root, rep):
    src = args.src
    guide = os.path.join(root, "docs", "guide.md")
    ops = os.path.join(root, "docs", "operations.md")
    readme = os.path.join(root, "README.md")
    header = os.path.join(src, "include", "cerberus.h")
    cfgman = os.path.join(src, "man", "cerberus.cfg.5")
    docs_dir = os.path.join(root, "docs")

    def page(path):
        if os.path.isfile(path):
            return read(path)
        rep.fail("coverage", rel(path, root), "the page does not exist",
                 "write it (docs/ pages of issue 24: see CONVENTIONS.md)")
        return None

    # README length.
    if os.path.isfile(readme):
        n = len(read(readme).splitlines())
        if n > README_MAX_LINES:
            rep.fail("coverage", "%s:%d" % (rel(readme, root), README_MAX_LINES + 1),
                     "README.md has %d lines, at most %d allowed" % (n, README_MAX_LINES),
                     "move depth into docs/ and link to it")
        else:
            rep.ok("coverage", "README.md has %d lines (at most %d)" % (n, README_MAX_LINES))
    else:
        rep.fail("coverage", "README.md", "missing", "write the README")

    htext = read(header) if os.path.isfile(header) else None
    if htext is None:
        rep.fail("coverage", rel(header, root), "no public header to take the status codes and "
                 "functions from", "pass --src with the source tree")
    # Status codes in docs/guide.md.
    gtext = page(guide)
    if htext is not None:
        statuses = status_names(htext)
        if not statuses:
            rep.fail("coverage", rel(header, root), "found no X(NAME, ...) entries in "
                     "CERB_STATUS_MAP", "the extractor in scripts/doc-check.py needs updating")
        elif gtext is not None:
            missing = [s for s in statuses if not mentions(gtext, s)]
            for s in missing:
                rep.fail("coverage", rel(guide, root), "status code %s is not named" % s,
                         "describe %s in the status codes section (#status-codes)" % s)
            if not missing:
                rep.ok("coverage", "docs/guide.md names all %d status codes" % len(statuses))
        # Public functions on some docs/*.md page.
        funcs = public_functions(htext)
        if not funcs:
            rep.fail("coverage", rel(header, root), "found no public functions",
                     "the extractor in scripts/doc-check.py needs updating")
        elif os.path.isdir(docs_dir):
            pages = {f: read(os.path.join(docs_dir, f)) for f in sorted(os.listdir(docs_dir))
                     if f.endswith(".md")}
            missing = [fn for fn in funcs if not any(mentions(t, fn) for t in pages.values())]
            for fn in missing:
                rep.fail("coverage", "docs/*.md", "public function %s (include/cerberus.h) is "
                         "named on no docs/ page" % fn,
                         "document `%s` on the page of its concern (guide.md for the lock API, "
                         "guard.md for cerb_guard_*, operations.md for metrics/store init)" % fn)
            if not missing:
                rep.ok("coverage", "docs/ names all %d public functions" % len(funcs))
        else:
            rep.fail("coverage", "docs/", "no docs/ directory", "write the docs/ pages")

    otext = page(ops)
    # Long options of the cerberus command.
    opts = cli_long_options(os.path.join(src, "cli"))
    if not opts:
        rep.fail("coverage", rel(os.path.join(src, "cli"), root), "found no long options in the "
                 "usage texts (const char ..._usage[] = \"...\";) of cli/*.c",
                 "the extractor in scripts/doc-check.py needs updating")
    elif otext is not None:
        missing = [o for o in sorted(opts) if not mentions(otext, o, "A-Za-z0-9-")]
        for o in missing:
            rep.fail("coverage", rel(ops, root), "option %s (%s) is not named"
                     % (o, ", ".join(opts[o])),
                     "describe %s under the command that takes it (#the-cerberus-command)" % o)
        if not missing:
            rep.ok("coverage", "docs/operations.md names all %d long options" % len(opts))
    # Configuration keys.
    if not os.path.isfile(cfgman):
        rep.fail("coverage", rel(cfgman, root), "no cerberus.cfg(5) to take the keys from",
                 "pass --src with the source tree")
    else:
        keys = config_keys(read(cfgman))
        if not keys:
            rep.fail("coverage", rel(cfgman, root), "found no `.TP` / `\\fBkey\\fR (` entries",
                     "the extractor in scripts/doc-check.py needs updating")
        elif otext is not None:
            code = " ".join(re.findall(r"`([^`\n]+)`", otext))
            missing = []
            for k in keys:
                # A dotted key anywhere as a word; a top-level one (engines,
                # active, epoch) in `code`, since the bare word is common prose.
                found = mentions(otext, k, "A-Za-z0-9_.") if "." in k else mentions(code, k)
                if not found:
                    missing.append(k)
            for k in missing:
                rep.fail("coverage", rel(ops, root), "configuration key %s is not named%s"
                         % (k, "" if "." in k else " in `code`"),
                         "regenerate the key reference (#key-reference) from the schema "
                         "(scripts/doc-keys.py), which lists every key")
            if not missing:
                rep.ok("coverage", "docs/operations.md names all %d configuration keys" % len(keys))


# ------------------------------------------------------------------- main

def parse_args(argv):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("files", nargs="*", metavar="FILE.md",
                        help="Markdown files to check instead of the default set "
                        "(c, console, links)")
    common.add_argument("--root", default=DEFAULT_ROOT,
                        help="the tree whose README.md and docs/ are checked "
                        "(default: this script's repository, %(default)s)")
    common.add_argument("--src", help="the source tree with include/, cli/, man/ "
                        "(default: --root)")
    common.add_argument("--include", help="include directory for ```c blocks (default: SRC/include)")
    common.add_argument("--cc", help="C compiler, may hold arguments (default: $CC or cc)")
    common.add_argument("--lib", metavar="DIR", help="directory of the built libcerberus: blocks "
                        "that define main are linked against it")
    common.add_argument("--link-flags", default="", metavar="FLAGS",
                        help="extra flags to compile and link blocks with main, e.g. the "
                        "build's sanitizer flags (one shell-quoted string)")
    common.add_argument("--cli", metavar="PATH", help="the built `cerberus` (or its directory) "
                        "for doc-test console blocks")
    common.add_argument("--jobs", "-j", type=int, default=2, help="parallel compilations and "
                        "console blocks (default 2)")
    common.add_argument("--timeout", type=float, default=30.0,
                        help="seconds per console command (default 30)")
    p = argparse.ArgumentParser(
        prog="doc-check.py", usage="%(prog)s [CHECK] [options] [FILE.md ...]", description="Check the Markdown documentation: code blocks compile, "
        "shown cerberus output is current, links resolve, nothing documented is missing.",
        epilog="Without CHECK, all four run. Exit status: 0 pass, 1 some check failed, 2 usage.")
    sub = p.add_subparsers(dest="check", metavar="CHECK")
    for name, h in (("c", "compile every ```c block"),
                    ("console", "run doc-test ```console blocks and compare their output"),
                    ("links", "relative links and anchors resolve"),
                    ("coverage", "status codes, functions, options, keys are documented; README length"),
                    ("all", "all four (the default)")):
        sub.add_parser(name, parents=[common], help=h, description=h,
                       usage="doc-check.py %s [options] [FILE.md ...]" % name)
    # The CHECK may come after options (doc-check.py --root X links): the
    # first bare word that names a check and is no option's value is it.
    argv = list(argv)
    takes_value = {"--root", "--src", "--include", "--cc", "--lib", "--link-flags", "--cli",
                   "--jobs", "-j", "--timeout"}
    pos = None
    for i, w in enumerate(argv):
        if w == "--":
            break
        if w in CHECKS + ("all",) and not (i > 0 and argv[i - 1] in takes_value):
            pos = i
            break
    if pos is not None:
        argv = [argv[pos]] + argv[:pos] + argv[pos + 1:]
    elif not argv or argv[0] not in ("-h", "--help"):
        argv = ["all"] + argv
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    a.root = os.path.abspath(a.root)
    if not os.path.isdir(a.root):
        p.error("--root %s: not a directory" % a.root)
    a.src = os.path.abspath(a.src) if a.src else a.root
    a.include = os.path.abspath(a.include) if a.include else os.path.join(a.src, "include")
    if a.lib:
        a.lib = os.path.abspath(a.lib)
        if not any(os.path.exists(os.path.join(a.lib, "libcerberus" + x)) for x in (".so", ".a", ".dylib")):
            p.error("--lib %s: no libcerberus there" % a.lib)
    if a.cli:
        a.cli = os.path.abspath(a.cli)
    cc = a.cc or os.environ.get("CC") or "cc"
    a.cc = shlex.split(cc)
    for f in a.files:
        if not os.path.isfile(f):
            p.error("%s: no such file" % f)
    return a


def main(argv):
    a = parse_args(argv)
    checks = CHECKS if a.check == "all" else (a.check,)
    files = [os.path.abspath(f) for f in a.files] if a.files else default_files(a.root)
    docs = [Doc(f) for f in files]
    rep = Report()
    print("doc-check: %s over %d file(s) under %s" % (", ".join(checks), len(docs), a.root))
    for c in checks:
        if c == "c":
            check_c(docs, a, a.root, rep)
        elif c == "console":
            check_console(docs, a, a.root, rep)
        elif c == "links":
            check_links(docs, a, a.root, rep)
        elif c == "coverage":
            check_coverage(a, a.root, rep)
        sys.stdout.flush()
    rep.summary(checks)
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
