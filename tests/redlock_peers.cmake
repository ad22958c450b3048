# redlock_peers.cmake — other Redlock clients on the masters of the redis
# engine's Redlock mode (redis.mode = "redlock"), issue 29:
#   node_redlock                    npm redlock 4.2.0 (tests/node/redlock: pinned by its
#                                   package-lock.json, installed into the build dir with
#                                   npm ci; the Cerberus side is rl_peer.c, driven by the
#                                   node test over a pipe). Skipped (77) with a message
#                                   when npm cannot install.
#   integration_redlock_interop_redispy
#                                   redis-py Locks on each master, as a Python Redlock
#                                   would hold them (integration/redlock_interop_redispy.c)
#   bench_redlock                   cerberus-bench --engine redlock: uncontended and
#                                   handoff rows with the Redlock raw ceiling and
#                                   node-redlock's rows (bench/test_bench_redlock.sh)
# All three on the shared set of three masters (fixture redlock, ports
# CERB_TEST_REDLOCK_PORT +0..+2, DESIGN.md §9), which tests/CMakeLists.txt
# defines with the Redlock mode's own suites; this file is included after.

if(TARGET PkgConfig::HIREDIS)
  math(EXPR _rl1 "${CERB_TEST_REDLOCK_PORT} + 1")
  math(EXPR _rl2 "${CERB_TEST_REDLOCK_PORT} + 2")

  add_executable(node_rl_peer ${CMAKE_CURRENT_SOURCE_DIR}/node/redlock/rl_peer.c)
  target_link_libraries(node_rl_peer PRIVATE cerberus_static Threads::Threads)
  target_include_directories(node_rl_peer PRIVATE ${PROJECT_SOURCE_DIR}/include)
  cerb_set_warnings(node_rl_peer)
  cerb_add_sanitizers(node_rl_peer)
  cerb_add_test(NAME node_redlock COMMAND ${CERB_BASH}
    ${CMAKE_CURRENT_SOURCE_DIR}/node/redlock/run.sh $<TARGET_FILE:node_rl_peer>
    ${CMAKE_CURRENT_BINARY_DIR}/node-redlock
    ${CERB_TEST_REDLOCK_PORT},${_rl1},${_rl2})
  set_tests_properties(node_redlock PROPERTIES LABELS integration TIMEOUT 600
    SKIP_RETURN_CODE 77 FIXTURES_REQUIRED redlock
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

  cerb_add_suite(NAME integration_redlock_interop_redispy
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/redlock_interop_redispy.c
    LABELS integration TIMEOUT 120 FIXTURES redlock
    ENV CERB_REDLOCK_PORT=${CERB_TEST_REDLOCK_PORT})

  if(TARGET cerberus-bench)
    cerb_add_test(NAME bench_redlock COMMAND ${CERB_BASH}
      ${CMAKE_CURRENT_SOURCE_DIR}/bench/test_bench_redlock.sh $<TARGET_FILE:cerberus-bench>)
    set_tests_properties(bench_redlock PROPERTIES LABELS integration TIMEOUT 300
      FIXTURES_REQUIRED redlock ENVIRONMENT
      "CERB_REDLOCK_PORT=${CERB_TEST_REDLOCK_PORT};CERB_PYTHON=${CERB_TEST_PYTHON};ASAN_OPTIONS=detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  endif()
endif()
