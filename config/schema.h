/*
 * schema.h — the table of configuration keys, shared by parse.c, validate.c
 * and reload.c (private to config/).
 *
 * Every key the library understands has exactly one row, in the manner of
 * Redis' standardConfig: its dotted path, its type, where it lives in
 * struct cerb_config, its default, its range, whether it may change on a
 * reload, and an optional check for string values. Parsing, defaults,
 * validation and the reload comparison are all driven by this table, so a
 * new key is one new row — plus its entry in man/cerberus.cfg.5, which the
 * ctest unit_man_cfg compares with this table (it prints the line to add).
 */
#ifndef CERB_CONFIG_SCHEMA_H
#define CERB_CONFIG_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* Upper bound on the number of rows; schema.c asserts the table fits. */
#define CERB__CFG_MAX_KEYS 128

typedef enum cerb__cfg_type {
    CERB__CFG_INT,     /* int field; libconfig int or int64 accepted */
    CERB__CFG_INT64,   /* int64_t field */
    CERB__CFG_BOOL,    /* bool field */
    CERB__CFG_STRING,  /* char * (inline_len 0) or char[inline_len] */
    CERB__CFG_STRLIST, /* array of char * or of char[inline_len], + count */
    CERB__CFG_ENUM     /* a string from `enums`, stored as its value */
} cerb__cfg_type;

enum {
    CERB__CFG_RELOADABLE = 1u << 0, /* may change on cerb_client_reload() */
    CERB__CFG_IMMUTABLE = 1u << 1   /* fixed for the client's lifetime */
};

struct cerb__cfg_key;

/* One accepted spelling of an enum key and the value stored for it. */
struct cerb__cfg_enum {
    const char *name;
    int64_t value;
};

/*
 * Extra check of one string value (of a string key or of one element of a
 * list). On failure it writes the whole message (without position) into
 * why and returns false.
 */
typedef bool (*cerb__cfg_check_fn)(const struct cerb__cfg_key *k,
                                   const char *s, char *why, size_t len);

struct cerb__cfg_key {
    const char *path;          /* "redis.port"; at most one '.' */
    cerb__cfg_type type;
    unsigned flags;            /* CERB__CFG_RELOADABLE or _IMMUTABLE */
    size_t offset;             /* offsetof(struct cerb_config, …) */
    size_t size;               /* sizeof the field (ints, bool, enum) */
    size_t inline_len;         /* strings: buffer size, 0 = heap char * */
    size_t count_offset;       /* STRLIST: offset of the size_t count */
    int64_t min, max;          /* INT/INT64 value range; STRLIST count */
    int64_t def;               /* INT/INT64/BOOL/ENUM default */
    const char *def_str;       /* STRING default; STRLIST sole element */
    const struct cerb__cfg_enum *enums; /* ENUM: NULL-name terminated */
    cerb__cfg_check_fn check;  /* optional, for strings and list items */
};

/* The table, in the order keys are documented (DESIGN.md §6). */
extern const struct cerb__cfg_key cerb__cfg_keys[];
extern const size_t cerb__cfg_nkeys;

/* Row index of `path`, or -1. */
int cerb__cfg_key_index(const char *path);
/* True when some key lives in group `name` ("redis" for "redis.port"). */
bool cerb__cfg_is_group(const char *name);

/* Integer view of an INT/INT64/BOOL/ENUM field, and the store. */
int64_t cerb__cfg_get_int(const struct cerb__cfg_key *k,
                          const struct cerb_config *cfg);
void cerb__cfg_set_int(const struct cerb__cfg_key *k, struct cerb_config *cfg,
                       int64_t v);
/* STRING field value (never NULL in a built config). */
const char *cerb__cfg_get_str(const struct cerb__cfg_key *k,
                              const struct cerb_config *cfg);
/* STRLIST element count and element i. */
size_t cerb__cfg_list_len(const struct cerb__cfg_key *k,
                          const struct cerb_config *cfg);
const char *cerb__cfg_list_get(const struct cerb__cfg_key *k,
                               const struct cerb_config *cfg, size_t i);

/*
 * Stores. Heap strings are copied with cerb__strdup (the old value freed);
 * inline ones must fit (callers check the length first). CERB_ENOMEM with
 * the last error set when a copy fails; the field then keeps a valid value.
 */
cerb_status cerb__cfg_set_str(const struct cerb__cfg_key *k,
                              struct cerb_config *cfg, const char *s);
/* Empty the list (freeing heap elements), then append one by one. */
void cerb__cfg_list_clear(const struct cerb__cfg_key *k,
                          struct cerb_config *cfg);
cerb_status cerb__cfg_list_push(const struct cerb__cfg_key *k,
                                struct cerb_config *cfg, const char *s);

/*
 * Check one value against the row: range for integers, spelling for enums
 * (`s` given), the row's check for strings. Writes the message into why.
 */
bool cerb__cfg_check_int(const struct cerb__cfg_key *k, int64_t v, char *why,
                         size_t len);
bool cerb__cfg_check_str(const struct cerb__cfg_key *k, const char *s,
                         char *why, size_t len);

/* ---- checks used by the table (validate.c) ---- */
bool cerb__cfg_check_engine(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len);
bool cerb__cfg_check_active(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len);
bool cerb__cfg_check_zk_root(const struct cerb__cfg_key *k, const char *s,
                             char *why, size_t len);
bool cerb__cfg_check_endpoint(const struct cerb__cfg_key *k, const char *s,
                              char *why, size_t len);
bool cerb__cfg_check_hostport(const struct cerb__cfg_key *k, const char *s,
                              char *why, size_t len);
bool cerb__cfg_check_nonempty(const struct cerb__cfg_key *k, const char *s,
                              char *why, size_t len);
/* A SQL identifier we quote ourselves: [A-Za-z_][A-Za-z0-9_]{0,62}. */
bool cerb__cfg_check_sql_ident(const struct cerb__cfg_key *k, const char *s,
                               char *why, size_t len);
/* pg.key: "dl", "int", "tooz" or "pals:<app>"; mysql.key: "dl" or "raw". */
bool cerb__cfg_check_pg_key(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len);
bool cerb__cfg_check_mysql_key(const struct cerb__cfg_key *k, const char *s,
                               char *why, size_t len);
/* memcached.prefix: at most 150 bytes, none of them a space or a control
 * character (memcached's key rules; the rest of the 250 is the name's). */
bool cerb__cfg_check_mc_prefix(const struct cerb__cfg_key *k, const char *s,
                               char *why, size_t len);

/* serve.listen: "unix:/ABSOLUTE/PATH" or "HOST:PORT" / "[V6]:PORT" (the
 * serve command judges the address itself: loopback, allow_remote). */
bool cerb__cfg_check_listen(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len);
/* serve.socket_mode: an octal mode up to 0777 giving the owner read and
 * write ("0660"). */
bool cerb__cfg_check_socket_mode(const struct cerb__cfg_key *k, const char *s,
                                 char *why, size_t len);

/*
 * Whole-config validation: every row's range and check, then the rules
 * that tie keys together (retry.backoff_max_ms >= retry.backoff_ms,
 * failover.probe_timeout_ms <= failover.probe_interval_ms, engine names
 * unique and registered, 1..CERB_MAX_ENGINES of them, `active` "auto" or a
 * listed engine). `file` names the source in messages; `lines` (may be
 * NULL) gives the source line of each row, 0 where the key was not set.
 * Returns CERB_OK or CERB_ECONFIG with `file:line: message`.
 */
cerb_status cerb__config_validate(const struct cerb_config *cfg,
                                  const char *file, const unsigned *lines);

/* Set the last error to `file:line: why` (`file: why` for line 0). */
cerb_status cerb__cfg_error_at(const char *file, unsigned line,
                               const char *why);

#endif /* CERB_CONFIG_SCHEMA_H */
