# CerbPackage.cmake — the service files' install rules and the Debian
# packages (CPack DEB), included once at the end of the top CMakeLists.txt,
# after every install() rule (docs/packaging.md).
#
# Three packages, one per CPack component group (ONE_PER_GROUP):
#   libcerberus0     component `lib`: libcerberus.so.0 and its real file
#   libcerberus-dev  component `dev`: the header, the libcerberus.so link,
#                    libcerberus.a, cerberus.pc, the CMake package
#   cerberus         every other component: `Unspecified` (the install()
#                    rules of cli/, bench/ and examples/, which name none;
#                    scripts/package.sh builds no bench),
#                    `man`, and `service` from here: the unit files, the
#                    sysusers.d/tmpfiles.d snippets and the default
#                    /etc/cerberus/cerberus.cfg (a conffile)
# Library dependencies come from dpkg-shlibdeps; libcerberus-dev depends on
# libcerberus0 of the same version and on the -dev packages of the modules
# cerberus.pc requires (pkg-config resolves Requires.private even for a
# shared link). The maintainer scripts of `cerberus` (dist/debian/) make the
# user and the directories, enable and start cerberus.socket, and honour
# $DPKG_ROOT, so tests/package/ runs them in a scratch root.
#
# A package build must be configured with CMAKE_INSTALL_PREFIX=/usr (so
# cerberus.pc and GNUInstallDirs' multiarch libdir say /usr):
# scripts/package.sh does that. Any other prefix still installs the service
# files, under that prefix, for a plain `cmake --install`.

option(CERB_INSTALL_SERVICE "Install the systemd units, sysusers/tmpfiles snippets and /etc/cerberus/cerberus.cfg" ON)
set(CERB_DEB_MAINTAINER "Cerberus maintainers <maintainers@cerberus.invalid>" CACHE STRING
  "Maintainer field of the Debian packages")
set(CERB_DEB_HOMEPAGE "" CACHE STRING "Homepage field of the Debian packages (none when empty)")
set(CERB_DEB_RELEASE 1 CACHE STRING "Debian revision of the packages (VERSION-RELEASE)")

# ---- the service files (component `service`, package `cerberus`) ----
if(CERB_INSTALL_SERVICE)
  # Debian 12's systemd looks in /lib/systemd/system (pkg-config systemd
  # --variable=systemdsystemunitdir); usr-merge makes it /usr/lib too.
  if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(cerb_unitdir /lib/systemd/system)
  else()
    set(cerb_unitdir ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
  endif()
  set(CERB_SYSTEMD_UNITDIR ${cerb_unitdir} CACHE PATH "Where the systemd unit files go")
  set(dist ${PROJECT_SOURCE_DIR}/dist)
  install(FILES ${dist}/systemd/cerberus.service ${dist}/systemd/cerberus.socket
    DESTINATION ${CERB_SYSTEMD_UNITDIR} COMPONENT service)
  install(FILES ${dist}/sysusers.d/cerberus.conf
    DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/sysusers.d COMPONENT service)
  install(FILES ${dist}/tmpfiles.d/cerberus.conf
    DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/tmpfiles.d COMPONENT service)
  # GNUInstallDirs makes the full sysconfdir /etc for the prefix /usr.
  install(FILES ${dist}/cerberus.cfg
    DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/cerberus COMPONENT service)
endif()

# ---- CPack DEB ----
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cerberus)
set(CPACK_PACKAGE_VENDOR "Cerberus")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CERB_DEB_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
# The unit files and /etc are outside the prefix on purpose.
set(CPACK_WARN_ON_ABSOLUTE_INSTALL_DESTINATION OFF)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
# Every component an install() rule has named so far: one this file does
# not know goes into the `cerberus` package (below) rather than into none,
# and tests/package/'s exact file lists then show it.
get_cmake_property(cerb_install_components COMPONENTS)
set(CPACK_COMPONENTS_ALL lib dev Unspecified man service)
set(cerb_extra_components "")
foreach(comp IN LISTS cerb_install_components)
  if(NOT comp IN_LIST CPACK_COMPONENTS_ALL)
    list(APPEND CPACK_COMPONENTS_ALL ${comp})
    list(APPEND cerb_extra_components ${comp})
  endif()
endforeach()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${CERB_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CERB_DEB_MAINTAINER}")
if(CERB_DEB_HOMEPAGE)
  set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${CERB_DEB_HOMEPAGE}")
endif()
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps finds libcerberus.so.0 in the staging tree, should a
# program of these packages ever link it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
  ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)


set(cerb_summary "distributed locks that survive store failures")
# CPack indents the lines after the first and writes " ." for an empty one.
set(cerb_about "Cerberus is a distributed-lock library with Redis, ZooKeeper, etcd,
PostgreSQL, MySQL/MariaDB and local engines, fencing tokens, an
idempotency guard and failover between engines at run time.")

# Package names and fields, per group (CPack names the variables after the
# group, upper-cased).
set(CPACK_DEBIAN_LIBCERBERUS0_PACKAGE_NAME libcerberus0)
set(CPACK_DEBIAN_LIBCERBERUS0_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBCERBERUS0_DESCRIPTION "Cerberus: ${cerb_summary} (library)
${cerb_about}

This package has the shared library, libcerberus.so.0.")
# The shlibs file maps the soname to this package, so dpkg-shlibdeps of
# programs linking it depends on libcerberus0 (>= this version). The
# switch is global, but only libcerberus0 has a shared library.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIBCERBERUS0_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/dist/debian/libcerberus0/triggers
  ${PROJECT_SOURCE_DIR}/dist/debian/libcerberus0/postinst
  ${PROJECT_SOURCE_DIR}/dist/debian/libcerberus0/postrm)

# The -dev modules cerberus.pc names (CERB_PC_REQUIRES) and the static
# link's -lzookeeper_mt; tests/package/ checks the map against dpkg -S.
set(cerb_pc_dev_map
  "libconfig=libconfig-dev" "uuid=uuid-dev" "libcrypto=libssl-dev"
  "hiredis=libhiredis-dev" "libcurl=libcurl4-openssl-dev | libcurl-dev"
  "jansson=libjansson-dev" "libpq=libpq-dev" "libmariadb=libmariadb-dev")
set(cerb_dev_depends "libcerberus0 (= ${PROJECT_VERSION}-${CERB_DEB_RELEASE})")
string(REPLACE " " ";" cerb_pc_mods "${CERB_PC_REQUIRES}")
foreach(mod IN LISTS cerb_pc_mods)
  set(pkg "")
  foreach(pair IN LISTS cerb_pc_dev_map)
    if(pair MATCHES "^${mod}=(.*)$")
      set(pkg "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(NOT pkg)
    message(FATAL_ERROR "CerbPackage: no Debian -dev package known for pkg-config module ${mod}")
  endif()
  string(APPEND cerb_dev_depends ", ${pkg}")
endforeach()
if(CERB_WITH_ZK)
  string(APPEND cerb_dev_depends ", libzookeeper-mt-dev")
endif()
string(APPEND cerb_dev_depends ", pkgconf | pkg-config")
set(CPACK_DEBIAN_LIBCERBERUS-DEV_PACKAGE_NAME libcerberus-dev)
set(CPACK_DEBIAN_LIBCERBERUS-DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_LIBCERBERUS-DEV_PACKAGE_DEPENDS "${cerb_dev_depends}")
# Nothing in it to run: no shlibdeps.
set(CPACK_DEBIAN_LIBCERBERUS-DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_LIBCERBERUS-DEV_DESCRIPTION "Cerberus: ${cerb_summary} (development files)
${cerb_about}

This package has the header cerberus.h, the libcerberus.so link, the static
library, cerberus.pc for pkg-config and the CMake package (find_package).")

set(CPACK_DEBIAN_CERBERUS_PACKAGE_NAME cerberus)
set(CPACK_DEBIAN_CERBERUS_PACKAGE_SECTION admin)
# The postinst makes the user with systemd-sysusers or, without it,
# useradd (passwd, required priority).
set(CPACK_DEBIAN_CERBERUS_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_CERBERUS_DESCRIPTION "Cerberus: ${cerb_summary} (command and service)
${cerb_about}

This package has the cerberus command (run, once, status, switch, check,
holders, init, serve), its manual pages, and the lock
service `cerberus serve` as systemd units listening on
/run/cerberus/cerberus.sock (group cerberus).")
set(cerb_debian ${PROJECT_SOURCE_DIR}/dist/debian/cerberus)
set(CPACK_DEBIAN_CERBERUS_PACKAGE_CONTROL_EXTRA
  ${cerb_debian}/conffiles ${cerb_debian}/postinst ${cerb_debian}/prerm ${cerb_debian}/postrm)

# CPack writes CPackConfig.cmake from the CPACK_ variables set so far; the
# component commands append to it, so they come after.
include(CPack)
cpack_add_component_group(libcerberus0)
cpack_add_component_group(libcerberus-dev)
cpack_add_component_group(cerberus)
cpack_add_component(lib GROUP libcerberus0)
cpack_add_component(dev GROUP libcerberus-dev)
cpack_add_component(Unspecified GROUP cerberus)
cpack_add_component(man GROUP cerberus)
cpack_add_component(service GROUP cerberus)
foreach(comp IN LISTS cerb_extra_components)
  cpack_add_component(${comp} GROUP cerberus)
endforeach()

# CPack leaves a missing control file out without a word: refuse instead.
foreach(f IN LISTS CPACK_DEBIAN_LIBCERBERUS0_PACKAGE_CONTROL_EXTRA
        CPACK_DEBIAN_CERBERUS_PACKAGE_CONTROL_EXTRA)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "CerbPackage: control file ${f} is missing")
  endif()
endforeach()
