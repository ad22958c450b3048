#!/usr/bin/env bash
# check_packages.sh SRC WORK — the Debian packages (cmake/CerbPackage.cmake)
# build, hold what they should, install, work, and uninstall cleanly.
#
#  1. Packages: the three .deb of $CERB_DEBS (a directory), else
#     scripts/package.sh builds them in WORK/pkg-build (kept between runs,
#     so a second run only rebuilds what changed).
#  2. Each is read with dpkg-deb --info/--contents: its control fields and
#     control files (conffiles, maintainer scripts, shlibs, triggers), its
#     files against the exact expected list (so a file that moves to another
#     package, a missing one and a stray one all fail), no file in two
#     packages, no build or source path and no RPATH inside, and every
#     dependency installed on this machine with the version asked.
#  3. dpkg --root installs them into a scratch root with a fresh admin dir
#     (--force-script-chrootless: the maintainer scripts run here with
#     $DPKG_ROOT set; --force-depends: the empty root has no libc6). The
#     scripts' work is checked there: the user and group, the directories,
#     the enabled units. A real `dpkg -i` is never done, not even in CI:
#     it would put libcerberus.so.0 in the linker's default path, where
#     suites of the build running at the same time could load it, and leave
#     a user on the machine.
#  4. The examples shipped in the package (usr/share/doc/cerberus/examples)
#     are built against the installed package with pkg-config
#     (PKG_CONFIG_SYSROOT_DIR into the root), and tests/install/app.c with
#     the installed CMake package; embed runs two processes on the local
#     engine with the shipped cerberus.cfg (local.dir re-pointed into WORK),
#     linked to the root's libcerberus.so.0 (ldd says which), and the
#     installed `cerberus` checks the shipped configuration.
#  5. systemd-analyze verify on the unit files, in a root holding this
#     machine's units, /bin/kill and the cerberus package, so that ExecStart,
#     ExecReload, the dependencies and Documentation= are all checked; any
#     warning fails too. Skipped, saying so, without systemd-analyze.
#  6. dpkg -r keeps the conffile and masks the units; dpkg --purge leaves
#     only the `cerberus` user and group (Debian keeps system users) and
#     empty directories of systemd's; the files of this machine that the
#     scripts could touch are unchanged throughout.
# (No pipe into a reader that may stop early, such as head or grep -q:
# under pipefail the writer's SIGPIPE would end the script without a word.)
set -euo pipefail
src=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
root=$work/root
rm -rf "$root" "$work/x" "$work/vroot" "$work/ex"
mkdir -p "$work/x" "$work/ex"

fail() { echo "package check: $*" >&2; exit 1; }
step() { echo "== $*"; }

version=$(sed -n 's/^project(cerberus VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[[ -n $version ]] || fail "no project version in $src/CMakeLists.txt"
debver=$version-1
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
arch=$(dpkg --print-architecture)

# ---- 1. the packages ----
if [[ -n ${CERB_DEBS:-} ]]; then
    debdir=$CERB_DEBS
    step "packages from CERB_DEBS=$debdir"
else
    step "scripts/package.sh $work/pkg-build"
    start=$SECONDS
    "$src/scripts/package.sh" "$work/pkg-build" >"$work/package.out"
    debdir=$work/pkg-build/packages
    echo "built in $((SECONDS - start)) s"
fi
declare -A deb
for p in libcerberus0 libcerberus-dev cerberus; do
    deb[$p]=$debdir/${p}_${debver}_${arch}.deb
    [[ -f ${deb[$p]} ]] || fail "${deb[$p]} missing"
done

# ---- 2. control and contents ----
step "control fields and files"
field() { dpkg-deb -f "${deb[$1]}" "$2"; }
for p in libcerberus0 libcerberus-dev cerberus; do
    [[ $(field $p Package) == "$p" ]] || fail "$p: Package is '$(field $p Package)'"
    [[ $(field $p Version) == "$debver" ]] || fail "$p: Version $(field $p Version), want $debver"
    [[ $(field $p Architecture) == "$arch" ]] || fail "$p: Architecture $(field $p Architecture)"
    for f in Maintainer Section Priority Description; do
        [[ -n $(field $p $f) ]] || fail "$p: no $f field"
    done
    synopsis=$(field $p Description)
    synopsis=${synopsis%%$'\n'*}
    ((${#synopsis} <= 80)) || fail "$p: synopsis longer than 80: $synopsis"
done
[[ $(field libcerberus0 Section) == libs && $(field libcerberus-dev Section) == libdevel ]] ||
    fail "sections: libcerberus0 $(field libcerberus0 Section), -dev $(field libcerberus-dev Section)"
# dpkg-shlibdeps ran: libc6 and the engines' client libraries.
for p in libcerberus0 cerberus; do
    for d in libc6 libhiredis libconfig9 libssl3 libuuid1; do
        grep -q "\b$d" <<<"$(field $p Depends)" || fail "$p: Depends lacks $d: $(field $p Depends)"
    done
done
grep -q libmicrohttpd <<<"$(field cerberus Depends)" || fail "cerberus: Depends lacks libmicrohttpd"
grep -qF "libcerberus0 (= $debver)" <<<"$(field libcerberus-dev Depends)" ||
    fail "libcerberus-dev: Depends lacks libcerberus0 (= $debver): $(field libcerberus-dev Depends)"

# The -dev package depends on the package of every module cerberus.pc
# requires (pkg-config resolves them even for a shared link): each .pc file
# is found with dpkg -S and its package must be named.
dpkg-deb -x "${deb[libcerberus-dev]}" "$work/x/dev"
pc=$work/x/dev/usr/lib/$ma/pkgconfig/cerberus.pc
[[ -f $pc ]] || fail "libcerberus-dev has no usr/lib/$ma/pkgconfig/cerberus.pc"
for mod in $(sed -n 's/^Requires.private: //p' "$pc"); do
    modpc=$(pkg-config --variable=pcfiledir "$mod")/$mod.pc
    owner=$( (dpkg -S "$(readlink -f "$modpc")" || dpkg -S "$modpc" || true) 2>/dev/null |
        awk -F: 'NR == 1 {print $1}')
    [[ -n $owner ]] || fail "no Debian package owns $modpc (pkg-config module $mod)"
    grep -qE "(^|, |\| )$owner( |,|$)" <<<"$(field libcerberus-dev Depends)" ||
        fail "libcerberus-dev: Depends lacks $owner (for pkg-config module $mod)"
done

# Control files: CPack leaves a missing one out silently.
ctrl() { dpkg-deb --ctrl-tarfile "${deb[$1]}" | tar -t | sed 's|^\./||' | grep -v '^$' | sort | tr '\n' ' '; }
[[ $(ctrl libcerberus0) == "control md5sums postinst postrm shlibs triggers " ]] ||
    fail "libcerberus0 control files: $(ctrl libcerberus0)"
[[ $(ctrl libcerberus-dev) == "control md5sums " ]] ||
    fail "libcerberus-dev control files: $(ctrl libcerberus-dev)"
[[ $(ctrl cerberus) == "conffiles control md5sums postinst postrm prerm " ]] ||
    fail "cerberus control files: $(ctrl cerberus)"
dpkg-deb -e "${deb[libcerberus0]}" "$work/x/ctl0"
grep -qx "libcerberus 0 libcerberus0 (>= $debver)" "$work/x/ctl0/shlibs" ||
    fail "libcerberus0 shlibs: $(cat "$work/x/ctl0/shlibs")"
grep -qx "activate-noawait ldconfig" "$work/x/ctl0/triggers" || fail "libcerberus0: no ldconfig trigger"
dpkg-deb -e "${deb[cerberus]}" "$work/x/ctl"
[[ $(cat "$work/x/ctl/conffiles") == /etc/cerberus/cerberus.cfg ]] ||
    fail "cerberus conffiles: $(cat "$work/x/ctl/conffiles")"

step "contents"
# Every file and link of a package (not directories), as /path.
files() { dpkg-deb --fsys-tarfile "${deb[$1]}" | tar -tv | awk '$1 !~ /^d/ {print $6}' | sed 's|^\.||' | sort; }
expect_lib="/usr/lib/$ma/libcerberus.so.0
/usr/lib/$ma/libcerberus.so.$version"
expect_dev="/usr/include/cerberus.h
/usr/lib/$ma/cmake/cerberus/cerberus-config-version.cmake
/usr/lib/$ma/cmake/cerberus/cerberus-config.cmake
/usr/lib/$ma/cmake/cerberus/cerberusTargets-release.cmake
/usr/lib/$ma/cmake/cerberus/cerberusTargets.cmake
/usr/lib/$ma/libcerberus.a
/usr/lib/$ma/libcerberus.so
/usr/lib/$ma/pkgconfig/cerberus.pc"
expect_cli="/etc/cerberus/cerberus.cfg
/lib/systemd/system/cerberus.service
/lib/systemd/system/cerberus.socket
/usr/bin/cerberus
/usr/lib/sysusers.d/cerberus.conf
/usr/lib/tmpfiles.d/cerberus.conf
/usr/share/doc/cerberus/examples/cerberus.cfg
/usr/share/doc/cerberus/examples/embed.c
/usr/share/doc/cerberus/examples/metrics_http.c
/usr/share/doc/cerberus/examples/orders.c
/usr/share/man/man1/cerberus.1
/usr/share/man/man5/cerberus.cfg.5"
declare -A expect=([libcerberus0]=$expect_lib [libcerberus-dev]=$expect_dev [cerberus]=$expect_cli)
for p in libcerberus0 libcerberus-dev cerberus; do
    want=$(sort <<<"${expect[$p]}")
    got=$(files "$p")
    if [[ $got != "$want" ]]; then
        diff <(echo "$want") <(echo "$got") >&2 || true
        fail "$p: files differ from the expected list (< expected, > in the package)"
    fi
done
dups=$(for p in libcerberus0 libcerberus-dev cerberus; do files $p; done | sort | uniq -d)
[[ -z $dups ]] || fail "files in two packages: $dups"
[[ $(dpkg-deb --fsys-tarfile "${deb[libcerberus0]}" | tar -tv | awk '$6 ~ /libcerberus.so.0$/ {print $8}') == "libcerberus.so.$version" ]] ||
    fail "libcerberus.so.0 is not a link to libcerberus.so.$version"
for p in libcerberus0 cerberus; do
    dpkg-deb -x "${deb[$p]}" "$work/x/$p"
done
# Owned by root, and nothing that names the build or the source tree.
for p in libcerberus0 libcerberus-dev cerberus; do
    bad=$(dpkg-deb --fsys-tarfile "${deb[$p]}" | tar -tv | awk '$2 != "root/root"')
    [[ -z $bad ]] || fail "$p: entries not owned by root/root: $bad"
done
leak=$(grep -rlF -e "$src" -e "$work" -e "$debdir" "$work/x/dev" "$work/x/libcerberus0" "$work/x/cerberus" || true)
[[ -z $leak ]] || fail "build or source paths inside: $leak"
for elf in "$work/x/libcerberus0/usr/lib/$ma/libcerberus.so.$version" \
           "$work/x/cerberus/usr/bin/cerberus"; do
    dyn=$(readelf -d "$elf")
    [[ $dyn == *NEEDED* ]] || fail "readelf -d $elf: no dynamic section?"
    if grep -qE 'RPATH|RUNPATH' <<<"$dyn"; then
        fail "$elf has an RPATH: $(grep -E 'RPATH|RUNPATH' <<<"$dyn")"
    fi
done
[[ $(readelf -d "$work/x/libcerberus0/usr/lib/$ma/libcerberus.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p') == libcerberus.so.0 ]] ||
    fail "libcerberus0: soname is not libcerberus.so.0"

# dpkg --compare-versions' name of a Depends relation.
debop() { case $1 in '>=') echo ge ;; '<=') echo le ;; '>>') echo gt ;; '<<') echo lt ;; *) echo eq ;; esac; }
# Every dependency is installed here with a version that satisfies it (the
# first alternative found; our own packages are installed in step 3).
for p in libcerberus0 libcerberus-dev cerberus; do
    IFS=, read -ra deps <<<"$(field $p Depends)"
    for dep in "${deps[@]}"; do
        ok=""
        IFS='|' read -ra alts <<<"$dep"
        for alt in "${alts[@]}"; do
            read -r name op ver <<<"$(sed -E 's/^ *([^ (]+) *(\(([<>=]+) *([^)]+)\))?.*/\1 \3 \4/' <<<"$alt")"
            if [[ $name == libcerberus0 ]]; then ok=1; break; fi
            have=$(dpkg-query -W -f='${Status} ${Version}\n' "$name" 2>/dev/null |
                   awk '$3 == "installed" && !v {v = $4} END {print v}')
            [[ -n $have ]] || continue
            if [[ -z $op ]] || dpkg --compare-versions "$have" "$(debop "$op")" "$ver"; then
                ok=1
                break
            fi
        done
        [[ -n $ok ]] || fail "$p: dependency '$dep' is not installed here"
    done
done

# ---- 3. install into a scratch root ----
# What the maintainer scripts could touch on this machine, if they ignored
# $DPKG_ROOT: compared at the end.
host_state() {
    for f in /etc/passwd /etc/group /etc/shadow /etc/gshadow /etc/ld.so.cache; do
        [[ -e $f ]] && md5sum "$f"
    done
    for d in /etc/systemd/system /var/lib/systemd/deb-systemd-helper-enabled \
             /var/lib/systemd/deb-systemd-helper-masked /etc/cerberus /run/cerberus /var/lib/cerberus; do
        [[ -e $d ]] && find "$d" -printf '%p %M %u %g %l\n' | sort
    done
    return 0
}
host_state >"$work/host.before"

step "dpkg --root $root -i"
mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info"
: >"$root/var/lib/dpkg/status"
dpk() {
    dpkg --root="$root" --log="$work/dpkg.log" --force-script-chrootless --force-not-root \
        --force-depends "$@" >>"$work/dpkg.out" 2>&1 || { cat "$work/dpkg.out" >&2; fail "dpkg $* failed"; }
}
: >"$work/dpkg.out"
dpk -i "${deb[libcerberus0]}" "${deb[libcerberus-dev]}" "${deb[cerberus]}"
for p in libcerberus0 libcerberus-dev cerberus; do
    st=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Status}' "$p")
    [[ $st == "install ok installed" ]] || fail "$p: status '$st' after install"
done
grep -q '/etc/cerberus/cerberus.cfg ' <<<"$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Conffiles}' cerberus)" ||
    fail "dpkg did not record /etc/cerberus/cerberus.cfg as a conffile"
# The postinst's work, in the root.
grep -q '^cerberus:x:[0-9]*:[0-9]*:[^:]*:/var/lib/cerberus:/usr/sbin/nologin$' "$root/etc/passwd" ||
    fail "postinst: no system user cerberus in the root ($(cat "$root/etc/passwd" 2>/dev/null))"
grep -q '^cerberus:' "$root/etc/group" || fail "postinst: no group cerberus in the root"
uid=$(awk -F: '$1 == "cerberus" {print $3}' "$root/etc/passwd")
gid=$(awk -F: '$1 == "cerberus" {print $3}' "$root/etc/group")
for d in "run/cerberus 750" "var/lib/cerberus 770"; do
    set -- $d
    [[ $(stat -c '%a %u %g' "$root/$1") == "$2 $uid $gid" ]] ||
        fail "postinst: $1 is $(stat -c '%a %u %g' "$root/$1"), want $2 $uid $gid"
done
for l in sockets.target.wants/cerberus.socket multi-user.target.wants/cerberus.service; do
    [[ $(readlink "$root/etc/systemd/system/$l") == /lib/systemd/system/${l#*/} ]] ||
        fail "postinst: $l not enabled"
done

# ---- 4. build and run against the installed package ----
step "examples built against the installed package"
export PKG_CONFIG_SYSROOT_DIR=$root
export PKG_CONFIG_PATH=$root/usr/lib/$ma/pkgconfig
flags=$(pkg-config --cflags --libs cerberus)
echo "pkg-config: $flags"
[[ $flags == *"-I$root/usr/include"* && $flags == *"-L$root/usr/lib/$ma"* ]] ||
    fail "pkg-config does not point into the root: $flags"
exdir=$root/usr/share/doc/cerberus/examples
for ex in embed orders metrics_http; do
    # shellcheck disable=SC2086
    cc -std=c11 -Wall -Wextra -Werror -pthread "$exdir/$ex.c" -o "$work/ex/$ex" $flags
done
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
export LD_LIBRARY_PATH=$root/usr/lib/$ma
got=$(ldd "$work/ex/embed" | awk '$1 == "libcerberus.so.0" {print $3}')
[[ $got == "$root/usr/lib/$ma/libcerberus.so.0" ]] || fail "embed loads libcerberus.so.0 from '$got'"
# The shipped configuration, its lock directory moved into WORK.
mkdir -p "$work/ex/locks"
sed "s|\"/var/lib/cerberus\"|\"$work/ex/locks\"|" "$root/etc/cerberus/cerberus.cfg" >"$work/ex/cerberus.cfg"
grep -q "$work/ex/locks" "$work/ex/cerberus.cfg" || fail "the shipped cerberus.cfg has no local.dir \"/var/lib/cerberus\""
"$root/usr/bin/cerberus" -c "$root/etc/cerberus/cerberus.cfg" check
"$work/ex/embed" -c "$work/ex/cerberus.cfg" -n 2 -i 3 -t 5 -w 10000 package-check
ls "$work/ex/locks"/*.lock >/dev/null 2>&1 || fail "embed left no lock file in local.dir: not the shipped engine?"
"$root/usr/bin/cerberus" --version

step "CMake find_package against the installed package"
mkdir -p "$work/ex/consumer"
cp "$src/tests/install/app.c" "$work/ex/consumer/"
cp "$src/tests/install/CMakeLists.txt.in" "$work/ex/consumer/CMakeLists.txt"
cmake -S "$work/ex/consumer" -B "$work/ex/consumer/build" -DCMAKE_PREFIX_PATH="$root/usr" \
    -DCMAKE_BUILD_TYPE=Release >"$work/ex/consumer.log" 2>&1 || { cat "$work/ex/consumer.log" >&2; fail "consumer configure"; }
grep -q "cerberus_DIR:PATH=$root/usr/lib/$ma/cmake/cerberus" "$work/ex/consumer/build/CMakeCache.txt" ||
    fail "find_package(cerberus) did not find the root's package: $(grep cerberus_DIR "$work/ex/consumer/build/CMakeCache.txt")"
cmake --build "$work/ex/consumer/build" >>"$work/ex/consumer.log" 2>&1 || { cat "$work/ex/consumer.log" >&2; fail "consumer build"; }
"$work/ex/consumer/build/app"
unset LD_LIBRARY_PATH

# ---- 5. systemd-analyze verify ----
if command -v systemd-analyze >/dev/null 2>&1; then
    step "systemd-analyze verify"
    v=$work/vroot
    mkdir -p "$v/lib/systemd" "$v/bin"
    cp -a /lib/systemd/system "$v/lib/systemd/"
    cp /bin/kill "$v/bin/"
    dpkg-deb -x "${deb[cerberus]}" "$v"
    MANPATH=$v/usr/share/man systemd-analyze verify --root="$v" cerberus.service cerberus.socket \
        >"$work/verify.out" 2>&1 || { cat "$work/verify.out" >&2; fail "systemd-analyze verify failed"; }
    [[ ! -s $work/verify.out ]] || { cat "$work/verify.out" >&2; fail "systemd-analyze verify warned"; }
    echo "systemd-analyze verify: cerberus.service cerberus.socket ok"
else
    echo "SKIP systemd-analyze verify: systemd-analyze not installed (apt-get install systemd)"
fi

# ---- 6. remove, purge ----
step "dpkg -r, dpkg --purge"
dpk -r cerberus libcerberus-dev libcerberus0
[[ -f $root/etc/cerberus/cerberus.cfg ]] || fail "dpkg -r removed the conffile"
[[ ! -e $root/usr/bin/cerberus && ! -e $root/usr/lib/$ma/libcerberus.so.0 ]] || fail "dpkg -r left binaries"
[[ $(readlink "$root/etc/systemd/system/cerberus.service") == /dev/null ]] ||
    fail "postrm remove: cerberus.service not masked"
dpk --purge cerberus libcerberus-dev libcerberus0
for p in libcerberus0 libcerberus-dev cerberus; do
    st=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ -z $st || $st == "unknown ok not-installed" || $st == "purge ok not-installed" ]] ||
        fail "$p: status '$st' after purge"
done
# Left: the user and group (and the files sysusers keeps them in), dpkg's
# database, empty directories.
left=$(cd "$root" && find . -path ./var/lib/dpkg -prune -o ! -type d -print | sed 's|^\.||' | sort |
    grep -vxE '/etc/(passwd|group|shadow|gshadow|\.pwd\.lock)(-)?' || true)
[[ -z $left ]] || fail "left after purge: $left"
grep -q '^cerberus:' "$root/etc/passwd" || fail "purge removed the cerberus user (Debian keeps it)"
[[ ! -e $root/var/lib/cerberus && ! -e $root/run/cerberus && ! -e $root/etc/cerberus ]] ||
    fail "purge left /var/lib/cerberus, /run/cerberus or /etc/cerberus"

host_state >"$work/host.after"
diff "$work/host.before" "$work/host.after" >&2 || fail "the maintainer scripts changed this machine"
echo "package check passed"
