/*
 * builtin.c — registers the engines compiled into this library. It is the
 * only core file that knows which optional engines exist (CERB_WITH_*), and
 * it knows them only as extern tables: no client-library header is included.
 */
#include "engine.h"

#include <pthread.h>
#include <string.h>

#include "store_init.h"

extern const struct cerb_engine_ops cerb__local_engine_ops;
#ifdef CERB_WITH_REDIS
extern const struct cerb_engine_ops cerb__redis_engine_ops;
extern const struct cerb_store_ops cerb__redis_store_ops;
#endif
#ifdef CERB_WITH_ZK
extern const struct cerb_engine_ops cerb__zk_engine_ops;
#endif
#ifdef CERB_WITH_ETCD
extern const struct cerb_engine_ops cerb__etcd_engine_ops;
#endif
#ifdef CERB_WITH_PG
extern const struct cerb_engine_ops cerb__pg_engine_ops;
extern const struct cerb_store_ops cerb__pg_store_ops;
#endif
#ifdef CERB_WITH_MEMCACHED
extern const struct cerb_engine_ops cerb__memcached_engine_ops;
#endif
#ifdef CERB_WITH_MYSQL
extern const struct cerb_engine_ops cerb__my_engine_ops;
extern const struct cerb_store_ops cerb__my_store_ops;
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void register_all(void)
{
    cerb__engine_register(&cerb__local_engine_ops);
#ifdef CERB_WITH_REDIS
    cerb__engine_register(&cerb__redis_engine_ops);
#endif
#ifdef CERB_WITH_ZK
    cerb__engine_register(&cerb__zk_engine_ops);
#endif
#ifdef CERB_WITH_ETCD
    cerb__engine_register(&cerb__etcd_engine_ops);
#endif
#ifdef CERB_WITH_PG
    cerb__engine_register(&cerb__pg_engine_ops);
#endif
#ifdef CERB_WITH_MYSQL
    cerb__engine_register(&cerb__my_engine_ops);
#endif
#ifdef CERB_WITH_MEMCACHED
    cerb__engine_register(&cerb__memcached_engine_ops);
#endif
}

void cerb__engines_builtin(void) { pthread_once(&once, register_all); }

/* The store tables (store_init.h): only engines whose store needs
 * preparing have one. Fixed at build time, so no registry. */
static const struct cerb_store_ops *const store_tables[] = {
#ifdef CERB_WITH_REDIS
    &cerb__redis_store_ops,
#endif
#ifdef CERB_WITH_PG
    &cerb__pg_store_ops,
#endif
#ifdef CERB_WITH_MYSQL
    &cerb__my_store_ops,
#endif
    NULL};

const struct cerb_store_ops *cerb__store_ops_find(const char *name)
{
    for (size_t i = 0; name && store_tables[i]; i++)
        if (strcmp(store_tables[i]->name, name) == 0)
            return store_tables[i];
    return NULL;
}
