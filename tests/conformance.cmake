# conformance.cmake — the engine conformance suite (integration/conformance.c):
# one source, built once per engine with CERB_CONFORMANCE_ENGINE naming the
# engine it runs against, so each ctest test says which engine failed:
#   conformance_local   no server
#   conformance_redis   fixture redis (shared server)
#   conformance_zk      fixture zk, when CERB_WITH_ZK
#   conformance_etcd    fixture etcd, when CERB_WITH_ETCD
# Included at the end of tests/CMakeLists.txt, after the fixtures exist. The
# file is not named test_*.c, so the integration globs there do not pick it
# up a second time. Every build includes the helpers of each engine that is
# built (CERB_CONF_<ENGINE>), so one binary could serve any of them; only
# the compile definition of the engine differs.

set(CERB_CONFORMANCE_SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/integration/conformance.c)
set(CERB_CONFORMANCE_DEFS "")
if(TARGET PkgConfig::HIREDIS)
  list(APPEND CERB_CONFORMANCE_DEFS CERB_CONF_REDIS=1)
endif()
if(CERB_WITH_ZK)
  list(APPEND CERB_CONFORMANCE_DEFS CERB_CONF_ZK=1)
endif()
if(CERB_WITH_ETCD)
  list(APPEND CERB_CONFORMANCE_DEFS CERB_CONF_ETCD=1)
endif()
if(CERB_WITH_PG)
  list(APPEND CERB_CONFORMANCE_DEFS CERB_CONF_PG=1)
endif()
if(CERB_WITH_MYSQL)
  list(APPEND CERB_CONFORMANCE_DEFS CERB_CONF_MYSQL=1)
endif()
if(CERB_WITH_MEMCACHED)
  list(APPEND CERB_CONFORMANCE_DEFS CERB_CONF_MEMCACHED=1)
endif()

# cerb_engine_suite(NAME SOURCE TIMEOUT ENGINE [cerb_add_suite arguments...]):
# one source built for one engine, named by CERB_CONFORMANCE_ENGINE.
function(cerb_engine_suite name source timeout engine)
  cerb_add_suite(NAME ${name} SOURCES ${source}
    LABELS integration conformance TIMEOUT ${timeout} ${ARGN})
  target_compile_definitions(${name} PRIVATE
    CERB_CONFORMANCE_ENGINE="${engine}" ${CERB_CONFORMANCE_DEFS})
endfunction()

# cerb_conformance_suite(ENGINE [cerb_add_suite arguments...])
function(cerb_conformance_suite engine)
  cerb_engine_suite(conformance_${engine} ${CERB_CONFORMANCE_SOURCE} 120 ${engine} ${ARGN})
endfunction()

cerb_conformance_suite(local)
if(TARGET PkgConfig::HIREDIS)
  cerb_conformance_suite(redis FIXTURES redis)
  # redis.mode = "redlock" over the shared set of three masters.
  cerb_conformance_suite(redis_redlock FIXTURES redlock
    ENV CERB_REDLOCK_PORT=${CERB_TEST_REDLOCK_PORT})
endif()
if(CERB_WITH_ZK)
  cerb_conformance_suite(zk FIXTURES zk ENV CERB_ZK_PORT=${CERB_TEST_ZK_PORT})
endif()
if(CERB_WITH_ETCD)
  cerb_conformance_suite(etcd FIXTURES etcd ENV CERB_ETCD_PORT=${CERB_TEST_ETCD_PORT})
endif()
if(CERB_WITH_PG)
  cerb_conformance_suite(pg FIXTURES pg ENV CERB_PG_PORT=${CERB_TEST_PG_PORT})
  # pg.mode = "lease" (the row alone), as behind a transaction pooler.
  cerb_conformance_suite(pg_lease FIXTURES pg ENV CERB_PG_PORT=${CERB_TEST_PG_PORT})
endif()
if(CERB_WITH_MYSQL)
  cerb_conformance_suite(mysql FIXTURES mysql ENV CERB_MYSQL_PORT=${CERB_TEST_MYSQL_PORT})
  # mysql.mode = "lease" (the row alone), as on Galera or multi-primary
  # Group Replication.
  cerb_conformance_suite(mysql_lease FIXTURES mysql ENV CERB_MYSQL_PORT=${CERB_TEST_MYSQL_PORT})
endif()
if(CERB_WITH_MEMCACHED)
  cerb_conformance_suite(memcached FIXTURES memcached)
endif()

# cerb_lock_inspect on each engine (integration/inspect_conformance.c), built
# the same way: inspect_<engine>, the engine named by CERB_CONFORMANCE_ENGINE.
function(cerb_inspect_suite engine)
  cerb_engine_suite(inspect_${engine}
    ${CMAKE_CURRENT_SOURCE_DIR}/integration/inspect_conformance.c 120 ${engine} ${ARGN})
endfunction()

cerb_inspect_suite(local)
if(TARGET PkgConfig::HIREDIS)
  cerb_inspect_suite(redis FIXTURES redis)
endif()
if(CERB_WITH_ZK)
  cerb_inspect_suite(zk FIXTURES zk ENV CERB_ZK_PORT=${CERB_TEST_ZK_PORT})
endif()
if(CERB_WITH_ETCD)
  cerb_inspect_suite(etcd FIXTURES etcd ENV CERB_ETCD_PORT=${CERB_TEST_ETCD_PORT})
endif()
if(CERB_WITH_PG)
  cerb_inspect_suite(pg FIXTURES pg ENV CERB_PG_PORT=${CERB_TEST_PG_PORT})
endif()
if(CERB_WITH_MYSQL)
  cerb_inspect_suite(mysql FIXTURES mysql ENV CERB_MYSQL_PORT=${CERB_TEST_MYSQL_PORT})
endif()
# memcached: no inspect_memcached — its waiters poll and leave nothing on
# the server to list, and it has no fence; test_memcached.c inspects.

# Semaphores and read-write locks on each engine (integration/
# queue_conformance.c), built the same way: queue_conformance_<engine>.
function(cerb_queue_suite engine)
  cerb_engine_suite(queue_conformance_${engine}
    ${CMAKE_CURRENT_SOURCE_DIR}/integration/queue_conformance.c 240 ${engine} ${ARGN})
endfunction()

cerb_queue_suite(local)
if(TARGET PkgConfig::HIREDIS)
  cerb_queue_suite(redis FIXTURES redis)
endif()
if(CERB_WITH_ZK)
  cerb_queue_suite(zk FIXTURES zk ENV CERB_ZK_PORT=${CERB_TEST_ZK_PORT})
endif()
if(CERB_WITH_ETCD)
  cerb_queue_suite(etcd FIXTURES etcd ENV CERB_ETCD_PORT=${CERB_TEST_ETCD_PORT})
endif()
