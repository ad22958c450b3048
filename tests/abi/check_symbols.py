#!/usr/bin/env python3
"""check_symbols.py — the library exports exactly its public API (issue 25).

Three lists must be the same set, each difference reported by name:
  - the functions declared in include/cerberus.h (as scripts/doc-check.py
    reads them: top-level `cerb_name(` declarations, comments and macros
    left out);
  - cmake/cerberus.sym, the list the shared library's version script is
    made from;
  - the symbols the built libcerberus.so defines and exports
    (`nm -D --defined-only`), version suffixes and the version node left out.

usage: check_symbols.py HEADER SYMFILE LIBRARY
Exit 0 when all three agree, 1 otherwise, 2 on usage errors.
"""
import importlib.util
import os
import re
import subprocess
import sys


def header_functions(path):
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "doc_check", os.path.join(here, "..", "..", "scripts", "doc-check.py"))
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    with open(path, encoding="utf-8") as f:
        return set(dc.public_functions(f.read()))


def sym_list(path):
    with open(path, encoding="utf-8") as f:
        return {l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")}


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if kind == "A":  # the version node itself (CERBERUS_0)
            continue
        names.add(re.sub(r"@.*$", "", name))
    return names


def diff(what_a, a, what_b, b):
    bad = 0
    for n in sorted(a - b):
        print("not ok - %s is in %s but not in %s" % (n, what_a, what_b))
        bad = 1
    for n in sorted(b - a):
        print("not ok - %s is in %s but not in %s" % (n, what_b, what_a))
        bad = 1
    return bad


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    header, symfile, lib = argv[1:]
    h, s, e = header_functions(header), sym_list(symfile), exported(lib)
    bad = diff("include/cerberus.h", h, "cmake/cerberus.sym", s)
    bad |= diff("cmake/cerberus.sym", s, "the exports of " + os.path.basename(lib), e)
    internal = sorted(n for n in e if n.startswith("cerb__"))
    print("%d public functions; %d symbols exported; %d internal exported" %
          (len(h), len(e), len(internal)))
    print("ok - exports match the public API" if not bad else "FAILED")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv))
