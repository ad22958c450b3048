#!/usr/bin/env bash
#
# package.sh — build the Debian packages libcerberus0, libcerberus-dev and
# cerberus (cmake/CerbPackage.cmake, docs/packaging.md) and print the path
# of each .deb, one a line, on stdout (everything else goes to stderr).
#
#   scripts/package.sh [BUILD_DIR]
#
# Configures a Release build without tests, sanitizers and cerberus-bench
# (a developer's tool: it finds its peer scripts in the source tree and
# `cerberus` in the build tree, paths a package must not carry), prefix /usr, in
# BUILD_DIR (default <repo>/build-pkg; an existing one is reused, so a
# second run only rebuilds what changed), builds it and runs cpack (DEB,
# one package per component group, dependencies from dpkg-shlibdeps). The
# packages land in BUILD_DIR/packages/.
#
# Environment:
#   CERB_PKG_JOBS     parallel build jobs (default: nproc)
#   CERB_CMAKE_ARGS   extra cmake configure arguments (word-split)
#
# Needs cmake, cpack, dpkg-deb, dpkg-shlibdeps (dpkg-dev) and file; no
# fakeroot: cpack writes the archives itself, every entry owned by root.
# The logs of the steps are BUILD_DIR/package-{configure,build,cpack}.log.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$ROOT/build-pkg}
jobs=${CERB_PKG_JOBS:-$(nproc)}
mkdir -p "$build"
log=$build/package

for tool in cmake cpack dpkg-deb dpkg-shlibdeps file; do
    command -v "$tool" >/dev/null 2>&1 ||
        { echo "package.sh: $tool not found (scripts/deps.sh installs it)" >&2; exit 1; }
done

# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCERB_WERROR=ON \
    -DCERB_BUILD_TESTS=OFF -DCERB_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX=/usr \
    ${CERB_CMAKE_ARGS:-} >"$log-configure.log" 2>&1 ||
    { cat "$log-configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" >"$log-build.log" 2>&1 ||
    { tail -n 40 "$log-build.log" >&2; exit 1; }

# Packages of an earlier version must not be taken for these.
rm -f "$build"/packages/*.deb
(cd "$build" && cpack -G DEB --config CPackConfig.cmake) >"$log-cpack.log" 2>&1 ||
    { cat "$log-cpack.log" >&2; exit 1; }

n=0
for deb in "$build"/packages/*.deb; do
    [[ -e $deb ]] || continue
    echo "$deb"
    n=$((n + 1))
done
if ((n != 3)); then
    echo "package.sh: expected 3 packages in $build/packages, found $n" >&2
    cat "$log-cpack.log" >&2
    exit 1
fi
