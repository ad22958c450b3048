#!/usr/bin/env python3
"""selftest.py — scripts/doc-check.py on the fixtures of tests/docs/fixtures/,
so that the checker of the docs cannot rot either (ctest docs_selftest).

    selftest.py --src SRC [--cli CERBERUS] [--cc CC] [--lib DIR]
                [--link-flags FLAGS] [--servers]

Every good fixture must pass its check (exit 0); every bad one must fail it
(exit 1) with the messages listed below, file:line included. Also: the
wildcard matcher and the GitHub slugs on known cases, usage errors exit 2,
and the extractors still find the real tree's status codes, functions,
options and keys (a checker that extracts nothing would pass everything).
--servers runs the fixture on the redis, zk and etcd test servers (ports in
$CERB_REDIS_PORT, $CERB_ZK_PORT, $CERB_ETCD_PORT). Prints one ok / not ok
line per case; exit status 1 if any failed.
"""

import argparse
import importlib.util
import os
import re
import subprocess
import sys

# Loading doc-check.py as a module must not leave scripts/__pycache__ in
# the source tree.
sys.dont_write_bytecode = True

HERE = os.path.dirname(os.path.abspath(__file__))
FX = os.path.join(HERE, "fixtures")

failures = 0


def ok(name):
    print("ok - " + name)


def not_ok(name, why, output=None):
    global failures
    failures += 1
    print("not ok - %s: %s" % (name, why))
    if output:
        for line in output.rstrip("\n").split("\n"):
            print("    | " + line)


def run_case(name, argv, rc, expect=(), env=None, forbid=()):
    e = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    p = subprocess.run([sys.executable, CHECKER] + argv, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=e, cwd=FX, timeout=300)
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != rc:
        not_ok(name, "exit status %d, expected %d" % (p.returncode, rc), out)
        return
    missing = [x for x in expect if not re.search(x, out, re.M)]
    if missing:
        not_ok(name, "output lacks %s" % "; ".join(repr(m) for m in missing), out)
        return
    present = [x for x in forbid if re.search(x, out, re.M)]
    if present:
        not_ok(name, "output has %s" % "; ".join(repr(m) for m in present), out)
        return
    ok(name)


def main():
    global CHECKER
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--checker")
    ap.add_argument("--cli")
    ap.add_argument("--cc")
    ap.add_argument("--lib")
    ap.add_argument("--link-flags", default="")
    ap.add_argument("--servers", action="store_true")
    a = ap.parse_args()
    src = os.path.abspath(a.src)
    CHECKER = os.path.abspath(a.checker or os.path.join(src, "scripts", "doc-check.py"))
    cc = ["--cc", a.cc] if a.cc else []
    lib = ["--lib", a.lib, "--link-flags", a.link_flags] if a.lib else []

    # ---- c
    run_case("c: good blocks compile" + (" (main linked)" if a.lib else ""),
             ["c", "--root", "c", "--src", src] + cc + lib + ["c/good.md"], 0,
             [r"^ok - c: good\.md:5: compiled%s$" % (" and linked" if a.lib else ""),
              r"^ok - c: good\.md:24: compiled$", r"^ok - c: good\.md:40: compiled$",
              r"^doc-check: c 3 ok, 0 failed$"])
    run_case("c: a broken block fails with file:line and the compiler's message",
             ["c", "--root", "c", "--src", src] + cc + ["c/bad.md"], 1,
             [r"^not ok - c: bad\.md:3: the ```c block does not build$",
              r"bad\.md:8:\d+: (error|warning): .*cerb_lock_acquire",
              r"what to do: make the block a whole translation unit"])

    # ---- console
    if not a.cli:
        not_ok("console", "no --cli given: the console cases need the built cerberus")
    else:
        con = ["console", "--root", "console", "--cli", a.cli]
        run_case("console: good blocks pass (local engine, wildcards, $?, a background job)",
                 con + ["console/good.md"], 0,
                 [r"^ok - console: good\.md:11: `\$ cerberus help holders`$",
                  r"^ok - console: good\.md:23: `\$ cerberus run job -- sleep 20 &",
                  r"^ok - console: good\.md:38: illustrative, not run$",
                  r"^doc-check: console 10 ok, 0 failed$"])
        if a.servers:
            run_case("console: a block on redis, zk and etcd, each in a fresh namespace",
                     con + ["console/good_servers.md"], 0,
                     [r"^ok - console: good_servers\.md:18: `\$ cerberus once docs r1",
                      r"^ok - console: good_servers\.md:27: `\$ cerberus once docs r1",
                      r"^ok - console: good_servers\.md:35: `\$ cerberus once docs r1",
                      r"^ok - console: good_servers\.md:41: `\$ cerberus once docs r1",
                      r"^ok - console: good_servers\.md:55: `\$ cerberus once docs r1",
                      r"^doc-check: console 11 ok, 0 failed$"])
        run_case("console: output that differs fails with a diff",
                 con + ["console/bad_output.md"], 1,
                 [r"^not ok - console: bad_output\.md:5: `\$ cerberus check` printed something else",
                  r"^    - cerberus\.cfg: broken$", r"^    \+ cerberus\.cfg: ok$",
                  r"^not ok - console: bad_output\.md:7: ", r"^    - four$",
                  r"^    \| three$", r"what to do: update the block"])
        run_case("console: output without a marker fails",
                 con + ["console/bad_nomarker.md"], 1,
                 [r"^not ok - console: bad_nomarker\.md:3: a ```console block runs `cerberus` "
                  r"and shows output but has no marker", r"<!-- illustrative -->"])
        run_case("console: a marker separated by a blank line fails",
                 con + ["console/bad_marker_gap.md"], 1,
                 [r"^not ok - console: bad_marker_gap\.md:5: the marker <!-- doc-test --> is not "
                  r"on the line directly above"])
        run_case("console: an engine without a server, or unknown, fails (no skip)",
                 con + ["console/bad_engine.md"], 1,
                 [r"^not ok - console: bad_engine\.md:4: the block needs engine\(s\) zk, but "
                  r"\$CERB_ZK_PORT not set", r"^not ok - console: bad_engine\.md:10: bad engine list"],
                 env={"CERB_ZK_PORT": None})
        run_case("console: a command that does not finish times out",
                 con + ["--timeout", "2", "console/bad_timeout.md"], 1,
                 [r"^not ok - console: bad_timeout\.md:5: `\$ cerberus run job -- sleep 30` did "
                  r"not finish in 2 s$"])
        run_case("console: doc-test blocks without --cli fail",
                 ["console", "--root", "console", "console/bad_output.md"], 1,
                 [r"no --cli \(the built `cerberus`\) given"])

    # ---- links
    run_case("links: good links, anchors (duplicates, code, setext, <a id>) pass",
             ["links", "--root", "links/good"], 0,
             [r"^ok - links: README\.md:4: docs/guide\.md#setup-1$",
              r"^ok - links: README\.md:4: docs/guide\.md#fencing-tokens-and-cerb_lock_fencing_token$",
              r"^ok - links: README\.md:8: #the-cerberus-command-and-its-options$",
              r"^ok - links: README\.md:13: docs/guide\.md#status-codes$",
              r"^doc-check: links 14 ok, 0 failed$"], forbid=[r"missing\.md"])
    run_case("links: a missing file, anchor and fence close fail",
             ["links", "--root", "links/bad"], 1,
             [r"^not ok - links: README\.md:3: link to docs/nowhere\.md: no such file",
              r"^not ok - links: README\.md:3: link to docs/guide\.md#status-code: docs/guide\.md "
              r"has no heading or <a id> with anchor #status-code \(did you mean #status-codes\?\)",
              r"^not ok - links: README\.md:4: link to #broken-link: ",
              r"^not ok - links: README\.md:5: link to man/cerberus\.8: no such file",
              r"^not ok - links: README\.md:9: a code fence is opened here and never closed",
              r"^doc-check: links 0 ok, 5 failed$"])

    # ---- coverage
    run_case("coverage: a tree that names everything passes",
             ["coverage", "--root", "coverage/good"], 0,
             [r"names all 2 status codes", r"names all 2 public functions",
              r"names all 3 long options", r"names all 2 configuration keys",
              r"README\.md has 3 lines"])
    run_case("coverage: each miss is listed by name",
             ["coverage", "--root", "coverage/bad", "--src", "coverage/good"], 1,
             [r"^not ok - coverage: README\.md:251: README\.md has 251 lines, at most 250",
              r"^not ok - coverage: docs/guide\.md: status code CERB_BUSY is not named$",
              r"^not ok - coverage: docs/\*\.md: public function cerb_watch ",
              r"^not ok - coverage: docs/operations\.md: option --alpha \(cerberus\) is not named$",
              r"^not ok - coverage: docs/operations\.md: option --beta \(cerberus run\) is not named$",
              r"^not ok - coverage: docs/operations\.md: configuration key engines is not named in `code`$",
              r"^not ok - coverage: docs/operations\.md: configuration key lock\.lease_ms is not named$",
              r"^doc-check: coverage 0 ok, 7 failed$"],
             forbid=[r"CERB_OK is not", r"cerb_open ", r"--config", r"cerb_fn", r"cerb_macro",
                     r"cerb__internal", r"cerb_commented_out", r"--quoted"])
    run_case("all: every check by default, on a tree with nothing to run",
             ["--root", "coverage/good"], 0,
             [r"^doc-check: c 1 ok, 0 failed; console 1 ok, 0 failed; links 1 ok, 0 failed; "
              r"coverage 5 ok, 0 failed$"])

    # ---- usage
    run_case("usage: an unknown option exits 2", ["links", "--bogus"], 2, [r"unrecognized"])
    run_case("usage: a missing file exits 2", ["links", "no-such.md"], 2, [r"no such file"])

    # ---- the pieces, in process
    spec = importlib.util.spec_from_file_location("doc_check", CHECKER)
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    cases = [
        (["a", "...", "z"], ["a", "b", "c", "z"], True),
        (["a", "...", "z"], ["a", "z"], True),
        (["a", "...", "z"], ["a", "b"], False),
        (["took ... ms"], ["took 12.5 ms"], True),
        (["took ... ms"], ["took 12.5 s"], False),
        (["x  "], ["x", "", ""], True),
        (["x"], ["x", "y"], False),
        (["..."], [], True),
        (["a.b (c)"], ["aXb (c)"], False),
    ]
    for exp, act, want in cases:
        got = dc.compare_output(exp, act)[0]
        name = "compare_output(%r, %r) is %s" % (exp, act, want)
        ok(name) if got == want else not_ok(name, "got %s" % got)
    slugs = [
        ("The `cerberus` command", "the-cerberus-command"),
        ("Safety: what a lock promises", "safety-what-a-lock-promises"),
        ("cerb_lock_new() and **options**", "cerb_lock_new-and-options"),
        ("Threads, ownership, and fork", "threads-ownership-and-fork"),
        ("[Engines](engines.md) & more", "engines--more"),
    ]
    for text, want in slugs:
        got = dc.github_slug(text)
        name = "github_slug(%r) = %r" % (text, want)
        ok(name) if got == want else not_ok(name, "got %r" % got)

    # ---- the extractors on the real tree
    with open(os.path.join(src, "include", "cerberus.h")) as f:
        header = f.read()
    st = dc.status_names(header)
    need = {"CERB_OK", "CERB_BUSY", "CERB_LOST", "CERB_DUPLICATE"}
    (ok if need <= set(st) else lambda n: not_ok(n, "got %r" % st))(
        "the real header's CERB_STATUS_MAP gives %d codes with %s" % (len(st), sorted(need)))
    fns = dc.public_functions(header)
    decl = set(re.findall(r"^[a-z][^;(]*?\b(cerb_[a-z0-9_]+)\(", header, re.M))
    (ok if decl <= set(fns) and len(fns) >= 30 else lambda n: not_ok(
        n, "missed %r" % sorted(decl - set(fns))))(
        "the real header gives %d public functions, every line-start declaration among them"
        % len(fns))
    opts = dc.cli_long_options(os.path.join(src, "cli"))
    with open(os.path.join(src, "man", "cerberus.1")) as f:
        page = re.sub(r"\\f[BIRP]", "", f.read().replace("\\-", "-"))
    man_opts = set(re.findall(r"(?<![A-Za-z0-9-])(--[A-Za-z][A-Za-z0-9-]*)", page))
    (ok if man_opts <= set(opts) and "--on-lost" in opts else lambda n: not_ok(
        n, "cerberus(1) names %r, not in the usage texts" % sorted(man_opts - set(opts))))(
        "the usage texts give %d long options, every one cerberus(1) names among them"
        % len(opts))
    with open(os.path.join(src, "man", "cerberus.cfg.5")) as f:
        cfg5 = f.read()
    keys = dc.config_keys(cfg5)
    tp = len(re.findall(r"^\.TP\n\\fB[a-z_.]+\\fR \(", cfg5, re.M))
    (ok if keys and len(keys) == tp and "lock.lease_ms" in keys else lambda n: not_ok(
        n, "got %d of %d" % (len(keys), tp)))(
        "cerberus.cfg(5) gives %d configuration keys" % len(keys))

    print("selftest: %s" % ("all passed" if not failures else "%d failed" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
