#!/usr/bin/env bash
# check_install.sh SRC WORK — build Cerberus without sanitizers, install it
# into WORK/prefix, then build a program against the installed copy three
# ways (pkg-config shared, pkg-config --static, CMake find_package) and run
# each. Proves the installed header, libraries, cerberus.pc and the CMake
# package config are complete and self-sufficient, and that the man pages
# are installed and render.
set -euo pipefail
src=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
here=$(cd "$(dirname "$0")" && pwd)

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCERB_WERROR=ON \
    -DCERB_BUILD_TESTS=OFF -DCERB_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX="$prefix" >"$work/configure.log"
cmake --build "$work/build" -j "$(nproc)" --target cerberus cerberus_static cerberus_cli >"$work/build.log"
cmake --install "$work/build" >"$work/install.log"

libdir=$(dirname "$(find "$prefix" -name cerberus.pc | head -n1)")/..
export PKG_CONFIG_PATH=$libdir/pkgconfig
export LD_LIBRARY_PATH=$libdir

echo "pkg-config: $(pkg-config --cflags --libs cerberus)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$here/app.c" -o "$work/app-shared" $(pkg-config --cflags --libs cerberus)
"$work/app-shared"
# shellcheck disable=SC2046
# Static libcerberus, its dependencies shared (libcurl's own static closure
# needs -dev packages nobody installs just for this).
deps=$(pkg-config --print-requires-private cerberus | awk '{print $1}' | tr '\n' ' ')
privs=$(pkg-config --static --libs-only-l cerberus | tr ' ' '\n' | grep -E '^-l(zookeeper_mt|pthread)$' | tr '\n' ' ')
cc -std=c11 -Wall -Werror "$here/app.c" -o "$work/app-static" $(pkg-config --cflags cerberus) \
    "$libdir/libcerberus.a" $(pkg-config --libs $deps) $privs
"$work/app-static"

mkdir -p "$work/consumer"
cp "$here/app.c" "$work/consumer/"
cp "$here/CMakeLists.txt.in" "$work/consumer/CMakeLists.txt"
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/consumer.log"
cmake --build "$work/consumer/build" >>"$work/consumer.log"
"$work/consumer/build/app"
"$prefix/bin/cerberus" --version
# The man pages come with a plain install too (man/CMakeLists.txt), where
# man(1) finds them, and render without a warning.
for page in man1/cerberus.1 man5/cerberus.cfg.5; do
    f=$(find "$prefix" -path "*/man/$page" | head -n1)
    [[ -n $f ]] || { echo "install check: $page not installed" >&2; exit 1; }
    MANWIDTH=80 man --warnings=w -l -Tutf8 "$f" >/dev/null 2>"$work/man.err"
    [[ ! -s $work/man.err ]] || { cat "$work/man.err" >&2; exit 1; }
    echo "man page: $f"
done
echo "install check passed"
