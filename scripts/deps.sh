# shellcheck shell=bash
#
# deps.sh — the Debian packages Cerberus needs, and one function that installs
# whichever of them are missing. Sourced by scripts/test.sh and
# scripts/quickstart.sh so both agree on the list.
#
# Algorithm: ask dpkg-query for each package's status and keep those that are
# not "installed"; when the list is empty nothing else happens (no network, no
# root needed). Otherwise run `apt-get update` once and `apt-get install` for
# exactly the missing ones, non-interactively, through sudo when not root.
#
# Environment: CERB_NO_INSTALL=1 only reports what is missing and fails.

# The build needs the compilers, cmake and the -dev packages; the tests need a
# real redis-server, redis-cli (readiness checks) and python3-redis (interop
# with redis-py's Lock, run by /usr/bin/python3), python3-prometheus-client
# (the metrics text is checked with its parser). The fuzz smoke
# (scripts/fuzz.sh) needs clang and libFuzzer, which Debian ships in
# libclang-rt-dev (only recommended by clang, and we install without
# recommends). The man pages' tests (tests/man/) render them with man-db's
# man and groff-base's groff, and lint them with mandoc. The documentation
# checks (scripts/doc-check.py, scripts/doc-keys.py, tests/docs/) and
# scripts/bench-report.sh run /usr/bin/python3 itself, so it is named too.
# The Python package (python/, tests/python/) is tested with python3-pytest
# and installed offline by pip (in a venv: python3-venv) with Debian's setuptools
# as its build backend. The SQL engines build against libpq-dev (PostgreSQL)
# and libmariadb-dev (MariaDB/MySQL), and their tests run real servers
# (scripts/servers.d/pg.sh, mysql.sh): postgresql (initdb, postgres,
# pg_basebackup for the standby, pg_isready and psql) and mariadb-server and
# mariadb-client (mariadbd, mariadb-install-db, the mariadb client); as root
# both servers run as their package's system user (postgres, mysql), through
# util-linux's setpriv, which every Debian system has. The memcached engine's
# tests run Debian's memcached (1.6.18: the meta protocol), started by
# scripts/servers.d/memcached.sh. Installing these servers may create and
# start Debian's own on 5432, 3306 and 11211; the tests never use those (their
# ports are 25432, 23306 and 21211). The Debian packages
# (scripts/package.sh, tests/package/) need dpkg-dev (dpkg-shlibdeps,
# dpkg-architecture) and file (CPack reads the ELF files with it); their test
# runs the maintainer scripts, which use systemd's systemd-sysusers and
# systemd-tmpfiles and init-system-helpers' deb-systemd-helper, and verifies
# the units with systemd-analyze (all without systemd running).
CERB_DEB_PACKAGES=(
    build-essential cmake pkg-config
    libhiredis-dev libconfig-dev libjansson-dev libcurl4-openssl-dev
    libcmocka-dev uuid-dev libssl-dev libzookeeper-mt-dev libmicrohttpd-dev
    redis-server redis-tools python3-redis python3-prometheus-client
    zookeeper default-jre-headless default-jdk-headless libcurator-recipes-java libslf4j-java
    python3-kazoo
    gnuplot-nox
    etcd-server etcd-client python3-etcd3
    openssl curl
    clang libclang-rt-dev
    groff-base man-db mandoc
    python3 python3-pytest python3-pip python3-setuptools python3-wheel python3-venv
    postgresql libpq-dev mariadb-server mariadb-client libmariadb-dev
    memcached
    dpkg-dev file systemd init-system-helpers
)

# cerb_missing_packages PKG...: print the packages (one per line) that dpkg
# does not list as installed. A package dpkg has never heard of counts as
# missing, as does one that was removed but left its config files.
cerb_missing_packages() {
    local p st
    for p in "$@"; do
        st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || st=""
        [[ $st == *" installed" ]] || printf '%s\n' "$p"
    done
}

# cerb_ensure_packages [PKG...]: install the missing ones of PKG... (default:
# CERB_DEB_PACKAGES). Returns non-zero when they cannot be installed.
cerb_ensure_packages() {
    local -a want missing sudo=()
    if (($#)); then want=("$@"); else want=("${CERB_DEB_PACKAGES[@]}"); fi

    if ! command -v dpkg-query >/dev/null 2>&1; then
        echo "deps: dpkg-query not found: not a Debian system; install these yourself:" >&2
        echo "deps:   ${want[*]}" >&2
        return 1
    fi
    mapfile -t missing < <(cerb_missing_packages "${want[@]}")
    if ((${#missing[@]} == 0)); then
        echo "deps: all ${#want[@]} Debian packages present"
        return 0
    fi
    echo "deps: missing Debian packages: ${missing[*]}"
    if [[ ${CERB_NO_INSTALL:-0} == 1 ]]; then
        echo "deps: CERB_NO_INSTALL=1, not installing" >&2
        return 1
    fi
    if (($(id -u) != 0)); then
        command -v sudo >/dev/null 2>&1 || {
            echo "deps: not root and no sudo: install them yourself" >&2
            return 1
        }
        sudo=(sudo)
    fi
    # The package lists are refreshed only because something is missing, and
    # only once; the lock timeout rides out a concurrent unattended upgrade.
    local -a apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get
        -q -y -o DPkg::Lock::Timeout=300)
    echo "deps: + ${apt[*]} update"
    "${apt[@]}" update || return 1
    echo "deps: + ${apt[*]} install --no-install-recommends ${missing[*]}"
    "${apt[@]}" install --no-install-recommends "${missing[@]}" </dev/null || return 1

    mapfile -t missing < <(cerb_missing_packages "${want[@]}")
    if ((${#missing[@]})); then
        echo "deps: still missing after install: ${missing[*]}" >&2
        return 1
    fi
    echo "deps: installed"
}
