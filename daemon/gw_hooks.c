/*
 * gw_hooks.c — the gateway's side of daemon/workers.h: the hooks the supervisor calls on its
 * loop thread (a worker ready or dead, SIGTERM's drain, the streams still open, a configuration
 * reload). They only note state and wake the gateway's own threads: they never block.
 */
#include "gw_internal.h"
#include "log.h"
#include "stats.h"

#include <stdio.h>

static void hook_ready(void *ud, struct workers_slot *ws, uint32_t generation)
{
    (void)ud, (void)ws, (void)generation; /* the reader adopts the region on its next poll */
}

static void hook_died(void *ud, struct workers_slot *ws, const struct workers_death *d)
{
    struct gw *g = ud;
    struct gw_slot *s = &g->slots[ws->index];
    pthread_mutex_lock(&s->mu);
    s->died_gen = d->generation;
    snprintf(s->died_reason, sizeof s->died_reason, "%s", d->reason);
    pthread_mutex_unlock(&s->mu);
    gw__health_changed(g);
}

static void hook_stop_accepting(void *ud)
{
    struct gw *g = ud;
    atomic_store(&g->accepting, false);
    LOG_INFO("gateway: draining: new generation calls are refused, health NOT_SERVING");
    gw__health_changed(g);
}

static size_t hook_active(void *ud)
{
    struct gw *g = ud;
    return atomic_load(&g->active_streams);
}

/* The adapters follow the new configuration (gw_adapters.c); tenants and limits are read
 * through w->config by each new call, so nothing else changes here. */
static void hook_config(void *ud, const struct config *fresh)
{
    struct gw *g = ud;
    size_t added, changed, dropped;
    gw__adapters_reload(g, fresh, &added, &changed, &dropped);
    /* reopened (log rotation: the old file was moved away), started or stopped; a file that
     * cannot be opened is logged there and the log open before stays */
    (void)stats_open_access_log(g->stats, fresh->access_log);
    LOG_INFO("gateway: configuration reloaded: %zu tenants; adapters %zu added, %zu changed, "
             "%zu dropped",
             fresh->n_tenants, added, changed, dropped);
}

const struct workers_hooks gw__hooks = {.worker_ready = hook_ready, .worker_died = hook_died,
                                        .stop_accepting = hook_stop_accepting,
                                        .active_streams = hook_active,
                                        .config_changed = hook_config};
