# CerbTesting.cmake — cmocka suites as ctest tests, and real test servers as
# ctest fixtures (libuv/cmocka style: one executable per suite, each test in
# its own process with a timeout).
#
#   cerb_add_suite(NAME <name>
#                  SOURCES <file.c>...
#                  [LABELS <label>...]        unit | integration | fault ...
#                  [FIXTURES <fixture>...]    FIXTURES_REQUIRED, e.g. redis
#                  [RESOURCE_LOCK <res>...]   serialise with other holders
#                  [TIMEOUT <seconds>]        default CERB_TEST_TIMEOUT (300)
#                  [REDIS_PORT <port>]        default CERB_TEST_REDIS_PORT
#                  [ENV <VAR=value>...]       extra environment
#                  [LIBS <target>...])        extra link libraries
#
# builds one executable from SOURCES linked with cerberus_static, the
# cerb_test_support library (tests/support/*.c), cmocka, threads and raw
# hiredis (tests inspect the server directly), compiled with the project's
# warnings and sanitizers, and registers it as a ctest test of the same name.
# Every suite gets in its environment: CERB_REDIS_PORT, CERB_STATE_DIR (where
# servers.sh keeps PID files, so a test can find the server's PID),
# CERB_SOURCE_DIR, CERB_BUILD_DIR, CERB_PYTHON (the Debian python3 that has
# python3-redis) and sanitizer options with leak checking on.
#
#   cerb_add_server_fixture(<fixture> ENGINE redis PORT <port> [NODES n])
#
# adds the FIXTURES_SETUP test `<fixture>_start` (scripts/servers.sh start)
# and the FIXTURES_CLEANUP test `<fixture>_stop` (servers.sh stop, by PID),
# with the servers' state inside the build dir; a new redis is prepared with
# this build's `cerberus init` (CERBERUS_BIN).
#
#   cerb_add_test(NAME <name> COMMAND <command> [<arg>...]
#                 [WORKING_DIRECTORY <dir>])
#
# is add_test() for this tree, and every test goes through it (the suites,
# the fixtures, the scripts, the examples): the command runs under
# tests/support/run_in_session.sh, in a session of its own, and fails when
# it leaves a process of that session alive after it exits. Everything a
# test starts carries CERB_TEST_RUN=<build dir> in its environment, and the
# test harness_leftovers (cerb_add_leftovers_check()), the cleanup of the
# fixture cerb_leftovers that every test of the tree requires, runs last and
# fails when any such process is still alive (those that left the session,
# or were orphaned by a test ctest killed at its timeout). harness_wrapped
# checks that no test of the tree bypasses cerb_add_test().

set(CERB_TEST_TIMEOUT 300 CACHE STRING "Default ctest timeout of a suite, seconds")
set(CERB_TEST_REDIS_PORT 26379 CACHE STRING "Port of the shared test redis-server")
set(CERB_TEST_STATE_DIR ${CMAKE_BINARY_DIR}/test-servers)

find_program(CERB_BASH bash REQUIRED)
# python3-redis installs for the Debian interpreter; a pyenv python3 earlier
# on PATH would not see it.
if(EXISTS /usr/bin/python3)
  set(CERB_TEST_PYTHON /usr/bin/python3)
else()
  find_program(CERB_TEST_PYTHON python3)
endif()

set(CERB_TEST_LAUNCHER ${PROJECT_SOURCE_DIR}/tests/support/run_in_session.sh)

function(cerb_add_test)
  cmake_parse_arguments(T "" "NAME;WORKING_DIRECTORY" "COMMAND" ${ARGN})
  if(NOT T_NAME OR NOT T_COMMAND OR T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "cerb_add_test: NAME and COMMAND are required (got ${ARGN})")
  endif()
  # add_test() turns a target's name into its file only as the first word
  # of COMMAND, which is now the launcher's.
  list(POP_FRONT T_COMMAND cmd)
  if(TARGET ${cmd})
    set(cmd $<TARGET_FILE:${cmd}>)
  endif()
  set(wd "")
  if(T_WORKING_DIRECTORY)
    set(wd WORKING_DIRECTORY ${T_WORKING_DIRECTORY})
  endif()
  add_test(NAME ${T_NAME}
    COMMAND ${CERB_BASH} ${CERB_TEST_LAUNCHER} ${CMAKE_BINARY_DIR} ${T_NAME} -- ${cmd} ${T_COMMAND}
    ${wd})
  # Once per directory, at its end (after every set_tests_properties() of
  # its CMakeLists.txt, which would otherwise overwrite these lists).
  get_property(hooked DIRECTORY PROPERTY CERB_LEFTOVERS_HOOKED)
  if(NOT hooked)
    set_property(DIRECTORY PROPERTY CERB_LEFTOVERS_HOOKED ON)
    cmake_language(DEFER CALL cerb__require_leftovers_check)
  endif()
endfunction()

# Every test of the directory requires the fixture cerb_leftovers, so that
# its cleanup, harness_leftovers, runs after all of them (in a run of any
# subset too); and a leftover report fails a test also when a pass
# expression decides it.
function(cerb__require_leftovers_check)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    if(NOT t STREQUAL "harness_leftovers")
      set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED cerb_leftovers)
      set_property(TEST ${t} APPEND PROPERTY FAIL_REGULAR_EXPRESSION "run_in_session: LEFTOVER")
    endif()
  endforeach()
endfunction()

# harness_leftovers: the last test of every run (see cerb_add_test), and
# harness_wrapped: every test of the tree runs under the launcher. Called
# once, from tests/CMakeLists.txt.
function(cerb_add_leftovers_check)
  add_test(NAME harness_leftovers COMMAND ${CERB_BASH}
    ${PROJECT_SOURCE_DIR}/tests/support/check_leftovers.sh ${CMAKE_BINARY_DIR} ${CERB_TEST_STATE_DIR})
  set_tests_properties(harness_leftovers PROPERTIES FIXTURES_CLEANUP cerb_leftovers
    LABELS "fixture" TIMEOUT 60)
  cerb_add_test(NAME harness_wrapped COMMAND ${CERB_TEST_PYTHON}
    ${PROJECT_SOURCE_DIR}/tests/support/check_wrapped.py ${CMAKE_CTEST_COMMAND} ${CMAKE_BINARY_DIR}
    ${CERB_TEST_LAUNCHER})
  cerb_add_test(NAME harness_session COMMAND ${CERB_BASH}
    ${PROJECT_SOURCE_DIR}/tests/support/test_harness.sh ${CERB_TEST_LAUNCHER}
    ${PROJECT_SOURCE_DIR}/tests/support/check_leftovers.sh)
  set_tests_properties(harness_wrapped PROPERTIES LABELS unit TIMEOUT 60)
  # harness_session's race case runs for up to 25 s of a loaded machine.
  set_tests_properties(harness_session PROPERTIES LABELS unit TIMEOUT 120)
endfunction()

function(cerb_add_server_fixture fixture)
  cmake_parse_arguments(F "" "ENGINE;PORT;NODES" "" ${ARGN})
  if(NOT F_ENGINE OR NOT F_PORT)
    message(FATAL_ERROR "cerb_add_server_fixture(${fixture}): ENGINE and PORT are required")
  endif()
  if(NOT F_NODES)
    set(F_NODES 1)
  endif()
  set(script ${PROJECT_SOURCE_DIR}/scripts/servers.sh)
  set(args ${F_ENGINE} --port ${F_PORT} --nodes ${F_NODES})
  cerb_add_test(NAME ${fixture}_start COMMAND ${CERB_BASH} ${script} start ${args})
  cerb_add_test(NAME ${fixture}_stop COMMAND ${CERB_BASH} ${script} stop ${args})
  set_tests_properties(${fixture}_start PROPERTIES FIXTURES_SETUP ${fixture}
    LABELS "fixture" TIMEOUT 60)
  set_tests_properties(${fixture}_stop PROPERTIES FIXTURES_CLEANUP ${fixture}
    LABELS "fixture" TIMEOUT 60)
  # servers.sh prepares a new redis with `cerberus init` (this build's).
  set(env "CERB_STATE_DIR=${CERB_TEST_STATE_DIR}")
  if(TARGET cerberus_cli)
    list(APPEND env "CERBERUS_BIN=$<TARGET_FILE:cerberus_cli>")
  endif()
  set_tests_properties(${fixture}_start ${fixture}_stop PROPERTIES ENVIRONMENT "${env}")
endfunction()

function(cerb_add_suite)
  cmake_parse_arguments(S "" "NAME;TIMEOUT;REDIS_PORT"
    "SOURCES;LABELS;FIXTURES;RESOURCE_LOCK;ENV;LIBS" ${ARGN})
  if(NOT S_NAME OR NOT S_SOURCES)
    message(FATAL_ERROR "cerb_add_suite: NAME and SOURCES are required")
  endif()
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT ${CERB_TEST_TIMEOUT})
  endif()
  if(NOT S_REDIS_PORT)
    set(S_REDIS_PORT ${CERB_TEST_REDIS_PORT})
  endif()

  add_executable(${S_NAME} ${S_SOURCES})
  target_include_directories(${S_NAME} PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/core
    ${PROJECT_SOURCE_DIR}/config ${PROJECT_SOURCE_DIR}/engine_redis
    ${PROJECT_SOURCE_DIR}/engine_zk ${PROJECT_SOURCE_DIR}/engine_etcd
    ${PROJECT_SOURCE_DIR}/failover ${PROJECT_SOURCE_DIR}/tests/support)
  if(TARGET ZooKeeper::zookeeper_mt)
    target_link_libraries(${S_NAME} PRIVATE ZooKeeper::zookeeper_mt)
  endif()
  if(TARGET PkgConfig::LIBCURL)
    target_link_libraries(${S_NAME} PRIVATE PkgConfig::LIBCURL PkgConfig::JANSSON)
  endif()
  target_compile_definitions(${S_NAME} PRIVATE _POSIX_C_SOURCE=200809L _DEFAULT_SOURCE)
  # The support library first: it uses cerberus_static, so the static
  # archive must come after it on the link line.
  target_link_libraries(${S_NAME} PRIVATE cerb_test_support cerberus_static
    PkgConfig::CMOCKA Threads::Threads ${S_LIBS})
  if(TARGET PkgConfig::HIREDIS)
    target_link_libraries(${S_NAME} PRIVATE PkgConfig::HIREDIS)
  endif()
  cerb_set_warnings(${S_NAME})
  cerb_add_sanitizers(${S_NAME})

  cerb_add_test(NAME ${S_NAME} COMMAND ${S_NAME})

  # A suite whose own code runs in a child process (a fork, or the suite's
  # binary again as a role, cerb_test_spawn_self) gets the label `forks`:
  # scripts/test.sh runs these under ThreadSanitizer too, where a child
  # forked from a process with threads dies at its first thread. Read at
  # configure time (test.sh always configures).
  foreach(src IN LISTS S_SOURCES)
    file(READ ${src} text)
    if(text MATCHES "cerb_test_fork|cerb_test_spawn_self|[^_a-z]fork\\(|GUARD_CASES")
      list(APPEND S_LABELS forks)
      break()
    endif()
  endforeach()

  # LSan rides on ASan; UBSan findings abort with a stack. Suppression files
  # are used when someone adds them.
  set(env
    "CERB_REDIS_PORT=${S_REDIS_PORT}"
    "CERB_STATE_DIR=${CERB_TEST_STATE_DIR}"
    "CERB_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    "CERB_BUILD_DIR=${CMAKE_BINARY_DIR}"
    "CERB_PYTHON=${CERB_TEST_PYTHON}"
    "CERB_ZK_PORT=${CERB_TEST_ZK_PORT}"
    "CERB_ETCD_PORT=${CERB_TEST_ETCD_PORT}"
    "CERB_PG_PORT=${CERB_TEST_PG_PORT}"
    "CERB_MYSQL_PORT=${CERB_TEST_MYSQL_PORT}"
    "CERB_MEMCACHED_PORT=${CERB_TEST_MEMCACHED_PORT}"
    "CERB_CLUSTER_PORT=${CERB_TEST_CLUSTER_PORT}"
    "ASAN_OPTIONS=detect_leaks=1"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  if(EXISTS ${PROJECT_SOURCE_DIR}/tests/lsan.supp)
    list(APPEND env "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0")
  endif()
  if(EXISTS ${PROJECT_SOURCE_DIR}/tests/tsan.supp)
    list(APPEND env "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/tsan.supp:halt_on_error=1")
  endif()
  list(APPEND env ${S_ENV})

  set_tests_properties(${S_NAME} PROPERTIES
    TIMEOUT ${S_TIMEOUT}
    ENVIRONMENT "${env}")
  if(S_LABELS)
    set_tests_properties(${S_NAME} PROPERTIES LABELS "${S_LABELS}")
  endif()
  if(S_FIXTURES)
    set_tests_properties(${S_NAME} PROPERTIES FIXTURES_REQUIRED "${S_FIXTURES}")
  endif()
  if(S_RESOURCE_LOCK)
    set_tests_properties(${S_NAME} PROPERTIES RESOURCE_LOCK "${S_RESOURCE_LOCK}")
  endif()
endfunction()
