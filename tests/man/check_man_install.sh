#!/usr/bin/env bash
# check_man_install.sh BUILD WORK MANDIR PAGE... — `cmake --install` puts
# the man pages where man(1) finds them, and each installed page renders.
#
# Installs the build's `man` component (only the pages: nothing is
# compiled) into WORK/prefix, then for each PAGE (cerberus.1,
# cerberus.cfg.5, ...) checks that WORK/prefix/MANDIR/manN/PAGE exists and
# that `MANWIDTH=80 man --warnings=w -l -Tutf8` renders it with exit status
# 0, not one line on stderr (every groff warning on), and its title and a
# NAME section in the output. MANDIR is CMAKE_INSTALL_MANDIR (share/man).
set -u
build=$1 work=$2 mandir=$3
shift 3
command -v man >/dev/null || { echo "check_man_install.sh: man not found (Debian: man-db)" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
if ! cmake --install "$build" --component man --prefix "$work/prefix" >"$work/install.log" 2>&1; then
    echo "not ok - cmake --install --component man failed:"
    cat "$work/install.log"
    exit 1
fi
fail=0
for page in "$@"; do
    sec=${page##*.}
    path=$work/prefix/$mandir/man$sec/$page
    if [[ ! -f $path ]]; then
        echo "not ok - $page not installed at $path; installed:"
        (cd "$work/prefix" && find . -type f | sort)
        fail=1
        continue
    fi
    title=$(basename "$page" ".$sec" | tr '[:lower:]' '[:upper:]')
    # Bold and underline come as overstrikes (c BS c) when stdout is no
    # terminal: removed, to read the text.
    MANWIDTH=80 man --warnings=w -l -Tutf8 "$path" 2>"$work/$page.err" >"$work/$page.raw"
    rc=$?
    sed $'s/.\b//g' "$work/$page.raw" >"$work/$page.txt"
    if ((rc != 0)) || [[ -s $work/$page.err ]]; then
        echo "not ok - man -l $path: status $rc, stderr:"
        cat "$work/$page.err"
        fail=1
    elif ! grep -q "^$title($sec)" "$work/$page.txt" || ! grep -q '^NAME' "$work/$page.txt"; then
        echo "not ok - man -l $path: no '$title($sec)' title or NAME section in the output:"
        head -20 "$work/$page.txt"
        fail=1
    else
        echo "ok - $mandir/man$sec/$page renders ($(wc -l <"$work/$page.txt") lines)"
    fi
done
exit "$fail"
