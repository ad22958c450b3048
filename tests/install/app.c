/* Built against an installed Cerberus (pkg-config or find_package): uses the
 * DESIGN.md §3 names and runs on the embedded local engine. */
#include <cerberus.h>
#include <stdio.h>

static void on_lost(cerb_lock *l, void *ud) { (void)l; (void)ud; }
static void on_switch(const char *f, const char *t, const char *w, void *ud)
{
    (void)f; (void)t; (void)w; (void)ud;
}

int main(void)
{
    cerb_client *c = NULL;
    cerb_lock *l = NULL, *set[1];
    struct cerb_engine_info info;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;

    if (cerb_client_open(&c, NULL) != CERB_OK)
        return 1;
    if (cerb_lock_new(c, "install-check", &o, &l) != CERB_OK)
        return 2;
    cerb_client_on_switch(c, on_switch, NULL);
    cerb_lock_on_lost(l, on_lost, NULL);
    if (cerb_lock_lock(l) || cerb_lock_trylock(l) || cerb_lock_trylock_for(l, 10))
        return 3;
    if (cerb_lock_fencing_token(l) == 0 || cerb_lock_state(l) != CERB_LOCK_VALID)
        return 4;
    cerb_lock_unlock(l);
    cerb_lock_unlock(l);
    cerb_lock_unlock(l);
    set[0] = l;
    if (cerb_multilock_lock(set, 1, 0) || cerb_multilock_unlock(set, 1))
        return 5;
    cerb_lock_interrupt(l);
    if (cerb_lock_lock_interruptibly(l) != CERB_INTERRUPTED)
        return 6;
    if (cerb_engine_info(c, NULL, &info) || !cerb_engine_current(c) ||
        !cerb_engine_switch(c))
        return 7;
    (void)cerb_engine_switch_to(c, "local");
    (void)cerb_client_reload(c);
    printf("ok %s %s %s\n", info.name, cerb_strerror(CERB_BUSY), cerb_status_name(CERB_LOST));
    cerb_lock_free(l);
    cerb_client_close(c);
    return cerb_last_error() ? 0 : 8;
}
