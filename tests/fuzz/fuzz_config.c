/*
 * fuzz_config.c — libFuzzer harness over clocherd's configuration parser (daemon/config.c).
 *
 * The input is a configuration file's bytes. A rejection must be a negative code with a
 * message and no output; an accepted configuration must satisfy what the supervisor and the
 * gateway rely on without re-checking: absolute paths, at least one listener, sane limits,
 * well-formed tenants and adapters. Every accepted configuration also goes through the reload
 * path (config_keep_restart_fields against itself must change nothing).
 */
#include "fuzz.h"

#include "config.h"
#include "log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static void check_abs(const char *p)
{
    if (p && p[0] != '/')
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct config *c = NULL;
    int rc = config_parse("fuzz.json", "/etc/clocherd", (const char *)data, size, NULL, &c);
    if (rc != 0) {
        if (rc > 0 || c)
            abort();
        if (!log_last_error()[0])
            abort(); /* every rejection says why */
        log_clear_error();
        return 0;
    }
    if (!c->listen_tcp && !c->listen_unix)
        abort();
    check_abs(c->model_dir);
    check_abs(c->listen_unix);
    check_abs(c->tls_cert);
    check_abs(c->tls_key);
    check_abs(c->worker_binary);
    if (!c->model_dir || !!c->tls_cert != !!c->tls_key)
        abort();
    if (c->workers > CONFIG_MAX_WORKERS || c->limits.max_tokens == 0 || c->limits.max_queue == 0)
        abort();
    if (c->sup.respawn_max_ms < c->sup.respawn_initial_ms || c->sup.crash_loop_max == 0)
        abort();
    for (size_t i = 0; i < c->n_tenants; i++) {
        const struct config_tenant *t = &c->tenants[i];
        if (!t->name[0] || strlen(t->name) >= CONFIG_NAME_MAX || t->n_keys == 0)
            abort();
        if (config_find_tenant(c, t->name) != t)
            abort(); /* names are unique */
        for (size_t k = 0; k < t->n_keys; k++)
            if (t->keys[k].kind == CONFIG_KEY_PLAIN && strlen(t->keys[k].plain) < 8)
                abort();
    }
    for (size_t i = 0; i < c->n_adapters; i++) {
        check_abs(c->adapters[i].dir);
        if (config_find_adapter(c, c->adapters[i].name) != &c->adapters[i])
            abort();
    }
    struct config *again = NULL;
    if (config_parse("fuzz.json", "/etc/clocherd", (const char *)data, size, NULL, &again) != 0)
        abort();
    if (config_keep_restart_fields(again, c) != 0)
        abort();
    config_unref(again);
    config_unref(c);
    return 0;
}
