/*
 * zk_log.c — the ZooKeeper C client's log, routed into the library's log.
 *
 * The C client writes INFO lines to stderr by default (every connect,
 * every session event). Each handle we make gets a log callback
 * (zookeeper_init2), which receives finished lines of the form
 *   "2024-01-02 03:04:05,678:123(0x7f..):ZOO_WARN@func@123: text"
 * We take the level from the "ZOO_<LEVEL>@" tag, drop the client's own
 * timestamp and thread prefix (our sink stamps lines itself), and log the
 * text at INFO for the client's errors and DEBUG for the rest: what the C
 * client calls an error (a refused connection, a lost socket) is an event
 * this engine expects and handles, and reports itself — at WARN, with
 * what it means for the locks — when it matters. With a host list of
 * several servers that all refuse, the client retries in a tight loop
 * (thousands of lines a second), so at most ZK_LOG_BURST lines a second
 * are passed on and the number dropped is reported.
 *
 * The client's level threshold is a process-wide variable; it is set once,
 * to WARN, or to INFO when our log is at DEBUG (its DEBUG level logs every
 * request and is never useful here).
 */
#include "internal_posix.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <zookeeper/zookeeper.h>

#include "clock.h"
#include "log.h"
#include "zk_session.h"

#define ZK_LOG_BURST 20

static pthread_once_t level_once = PTHREAD_ONCE_INIT;

static void set_level(void)
{
    zoo_set_debug_level(cerb__log_enabled(CERB_LOG_DEBUG) ? ZOO_LOG_LEVEL_INFO
                                                          : ZOO_LOG_LEVEL_WARN);
}

void cerb__zk_log_setup(void) { pthread_once(&level_once, set_level); }

void cerb__zk_log_line(const char *message)
{
    static const struct {
        const char *tag;
        cerb_log_level level;
    } tags[] = {
        {"ZOO_ERROR@", CERB_LOG_INFO},
        {"ZOO_WARN@", CERB_LOG_DEBUG},
        {"ZOO_INFO@", CERB_LOG_DEBUG},
        {"ZOO_DEBUG@", CERB_LOG_DEBUG},
    };
    cerb_log_level level = CERB_LOG_INFO;
    const char *text = message;

    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++) {
        const char *p = strstr(message, tags[i].tag);
        if (p) {
            level = tags[i].level;
            /* "ZOO_X@func@line: text": the text follows the first ": ". */
            const char *t = strstr(p, ": ");
            text = t ? t + 2 : p;
            break;
        }
    }
    if (!cerb__log_enabled(level))
        return;

    /* Rate limit, per second of the monotonic clock, process-wide. */
    static atomic_llong window;
    static atomic_int in_window, dropped;
    long long sec = (long long)(cerb_monotime() / (1000 * CERB_NS_PER_MS));
    long long w = atomic_load(&window);
    if (sec != w && atomic_compare_exchange_strong(&window, &w, sec)) {
        atomic_store(&in_window, 0);
        int d = atomic_exchange(&dropped, 0);
        if (d > 0)
            cerb__log(level, "zk client: %d more lines dropped", d);
    }
    if (atomic_fetch_add(&in_window, 1) >= ZK_LOG_BURST) {
        atomic_fetch_add(&dropped, 1);
        return;
    }
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        n--;
    cerb__log(level, "zk client: %.*s", (int)n, text);
}
