#!/usr/bin/env bash
# lint.sh PAGE... — the man pages format without a single warning.
#
# Each page goes through groff's man macros with every warning on
# (`groff -man -Tutf8 -ww -z`: undefined macros, bad escapes, fonts,
# numeric arguments, ...) and, when mandoc is installed (Debian: mandoc, in
# scripts/deps.sh), through `mandoc -T lint -W warning`, which also knows
# the man(7) conventions (empty blocks, sections out of order, a NAME line
# that does not parse, ...). Anything either prints fails the test, with
# the page and the tool's own message. Style notes (mandoc's -W style,
# e.g. lines over 80 bytes) are shown but do not fail. With $CERB_VERSION
# set, each page's .TH line must name "cerberus $CERB_VERSION", so a version
# bump that forgets the pages fails here.
set -u
command -v groff >/dev/null || { echo "lint.sh: groff not found (Debian: groff-base)" >&2; exit 1; }
have_mandoc=0
if command -v mandoc >/dev/null; then
    have_mandoc=1
else
    echo "note: mandoc not installed (Debian: mandoc): checking with groff only"
fi
fail=0
for page in "$@"; do
    if [[ -n ${CERB_VERSION:-} ]] && ! grep -q "^\.TH .*\"cerberus $CERB_VERSION\"" "$page"; then
        printf 'not ok - %s: the .TH line does not name "cerberus %s" (the project version): update it\n' \
            "$page" "$CERB_VERSION"
        fail=1
    fi
    out=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
    rc=$?
    if ((rc != 0)) || [[ -n $out ]]; then
        printf 'not ok - groff -ww %s (status %d):\n%s\n' "$page" "$rc" "$out"
        fail=1
    else
        echo "ok - groff -ww $page"
    fi
    ((have_mandoc)) || continue
    out=$(mandoc -T lint -W warning "$page" 2>&1)
    rc=$?
    if ((rc != 0)) || [[ -n $out ]]; then
        printf 'not ok - mandoc -T lint %s (status %d):\n%s\n' "$page" "$rc" "$out"
        fail=1
    else
        echo "ok - mandoc -T lint $page"
    fi
    style=$(mandoc -T lint -W style "$page" 2>&1 | grep ': STYLE: ')
    [[ -z $style ]] || printf '# style (not failing):\n%s\n' "$style"
done
exit "$fail"
