/*
 * gw_adapters.c — the gateway's adapter registry: the LoRA adapters ListAdapters shows and
 * requests may name (from the configuration, loaded or unloaded at run time), replayed to
 * each fresh worker at its HELLO, and made to follow the configuration on a reload. Threads
 * and locks: gw_internal.h (the registry is guarded by g->adapters_mu). It talks to workers
 * only through their request rings; it calls no other gateway file.
 *
 * NOTES
 *  - Workers are told nothing about adapters loaded at run time by the supervisor: on each
 *    HELLO the reader replays the registry's run-time changes (loads and unloads) so a
 *    respawned worker serves what the old one did.
 */
#include "gw_internal.h"
#include "log.h"
#include "msg.h"
#include "region.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rank, alpha and target modules from a PEFT adapter_config.json (best effort: 0 when absent) */
static void adapter_meta(const char *dir, struct gw_adapter *a)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return;
    json_t *r = json_object_get(j, "r"), *al = json_object_get(j, "lora_alpha");
    if (json_is_integer(r) && json_integer_value(r) > 0 && json_integer_value(r) <= SHM_MAX_RANK)
        a->rank = (uint32_t)json_integer_value(r);
    if (json_is_number(al))
        a->alpha = (float)json_number_value(al);
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
    json_t *tm = json_object_get(j, "target_modules");
    size_t i;
    json_t *v;
    json_array_foreach(tm, i, v) {
        for (unsigned t = 0; json_is_string(v) && t < 7; t++)
            if (strcmp(json_string_value(v), names[t]) == 0)
                a->targets |= 1u << t;
    }
    json_decref(j);
}

static struct gw_adapter *adapter_find(struct gw *g, const char *name)
{
    for (size_t i = 0; i < g->n_adapters; i++)
        if (strcmp(g->adapters[i].name, name) == 0)
            return &g->adapters[i];
    return NULL;
}

bool gw__adapter_known(void *ud, const char *name)
{
    struct gw *g = ud;
    pthread_mutex_lock(&g->adapters_mu);
    struct gw_adapter *a = adapter_find(g, name);
    bool known = a && !a->unloaded;
    pthread_mutex_unlock(&g->adapters_mu);
    return known;
}

static struct gw_adapter *adapter_slot(struct gw *g, const char *name)
{
    struct gw_adapter *a = adapter_find(g, name);
    if (a)
        return a;
    if (g->n_adapters == g->cap_adapters) {
        size_t cap = g->cap_adapters ? 2 * g->cap_adapters : 8;
        struct gw_adapter *p = realloc(g->adapters, cap * sizeof *p);
        if (!p)
            return NULL;
        g->adapters = p, g->cap_adapters = cap;
    }
    a = &g->adapters[g->n_adapters++];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    return a;
}

void gw__adapter_add(struct gw *g, const char *name, const char *dir,
                     const struct shm_msg_adapter *info)
{
    pthread_mutex_lock(&g->adapters_mu);
    struct gw_adapter *a = adapter_slot(g, name);
    if (a) {
        char *d = strdup(dir);
        if (d) {
            free(a->dir);
            a->dir = d;
        }
        a->unloaded = false;
        if (info) {
            a->rank = info->rank, a->alpha = info->alpha, a->targets = info->targets;
        } else {
            a->rank = 0, a->alpha = 0, a->targets = 0;
            adapter_meta(dir, a);
        }
    }
    pthread_mutex_unlock(&g->adapters_mu);
}

void gw__adapter_remove(struct gw *g, const char *name)
{
    pthread_mutex_lock(&g->adapters_mu);
    struct gw_adapter *a = adapter_find(g, name);
    if (a && a->from_config) {
        a->unloaded = true; /* remembered: a respawned worker loads it from its argv */
    } else if (a) {
        free(a->dir);
        *a = g->adapters[--g->n_adapters];
    }
    pthread_mutex_unlock(&g->adapters_mu);
}

const char *gw__adapter_source(struct gw *g, const char *name)
{
    pthread_mutex_lock(&g->adapters_mu);
    struct gw_adapter *a = adapter_find(g, name);
    bool from_config = a && a->from_config;
    pthread_mutex_unlock(&g->adapters_mu);
    return from_config ? "config" : "runtime";
}

/* Its command line held the configuration's adapters as they were when the worker was
 * spawned, so it gets LOADs for run-time loads and UNLOADs for run-time unloads, and, when a
 * reload changed an adapter after the spawn, the adapter's new state (a LOAD it already has is
 * answered as done). Answers come back with ids nobody waits on and are dropped; the worker
 * logs a failure. */
void gw__adapters_replay(struct gw *g, struct gw_slot *s, uint32_t generation)
{
    pthread_mutex_lock(&g->adapters_mu);
    for (size_t i = 0; i < g->n_adapters; i++) {
        struct gw_adapter *a = &g->adapters[i];
        bool want = !a->unloaded && a->dir;
        bool old_argv = a->reloaded && generation <= a->reload_gen[s->index];
        bool load = want && (old_argv || !a->from_config);
        bool unload = !want && (old_argv || a->from_config);
        struct shm_msg m;
        if (load)
            m = (struct shm_msg){.type = SHM_MSG_ADAPTER_LOAD,
                                 .adapter_load = {.request_id = atomic_fetch_add(&g->next_id, 1),
                                                  .name = a->name, .path = a->dir}};
        else if (unload)
            m = (struct shm_msg){.type = SHM_MSG_ADAPTER_UNLOAD,
                                 .name = {.request_id = atomic_fetch_add(&g->next_id, 1),
                                          .name = a->name}};
        else
            continue;
        if (shm_msg_send_wait(shm_region_tx(s->region->shm), &m, 1000000000ll) < 0)
            LOG_WARN("worker %u: could not replay adapter %s", s->index, a->name);
    }
    pthread_mutex_unlock(&g->adapters_mu);
}

/* Sends one adapter message to every worker that serves now (all slot mutexes held). */
static void send_to_serving(struct gw *g, struct shm_msg *m, const char *what)
{
    for (size_t i = 0; i < g->n_slots; i++) {
        struct gw_slot *s = &g->slots[i];
        if (!s->hello || !s->region)
            continue; /* a worker still starting replays the change at its HELLO */
        if (m->type == SHM_MSG_ADAPTER_LOAD)
            m->adapter_load.request_id = atomic_fetch_add(&g->next_id, 1);
        else
            m->name.request_id = atomic_fetch_add(&g->next_id, 1);
        if (shm_msg_send_wait(shm_region_tx(s->region->shm), m, 100000000ll) < 0)
            LOG_WARN("worker %u: could not send the reload's %s", s->index, what);
    }
}

/* Remembers each slot's generation now: those workers were started from the old command line,
 * so a HELLO from one of them (gw__adapters_replay) gets this adapter's new state. */
static void mark_reloaded(struct gw *g, struct gw_adapter *a)
{
    a->reloaded = true;
    for (size_t i = 0; i < g->n_slots; i++)
        a->reload_gen[i] = atomic_load(&g->slots[i].ws->generation);
}

/*
 * The configuration's adapters table becomes authoritative: adapters it adds (or whose
 * directory it changes) are loaded into the running workers, adapters it drops are unloaded
 * (requests using one finish first: the engine releases it after them). The workers answer on
 * their event rings with ids nobody waits on; a worker that cannot load an adapter logs why,
 * and requests naming it on that worker fail NOT_FOUND. Runs on the supervisor's loop thread,
 * which is also the one that spawns workers, so the generations read here are exactly the ones
 * started from the old command line.
 */
void gw__adapters_reload(struct gw *g, const struct config *fresh, size_t *n_added,
                         size_t *n_changed, size_t *n_dropped)
{
    size_t added = 0, changed = 0, dropped = 0;
    for (size_t i = 0; i < g->n_slots; i++) /* order: slots by index, then adapters_mu */
        pthread_mutex_lock(&g->slots[i].mu);
    pthread_mutex_lock(&g->adapters_mu);
    for (size_t i = 0; i < fresh->n_adapters; i++) {
        const struct config_adapter *ca = &fresh->adapters[i];
        struct gw_adapter *a = adapter_find(g, ca->name);
        bool same_dir = a && a->dir && strcmp(a->dir, ca->dir) == 0;
        if (a && !a->unloaded && same_dir) {
            if (!a->from_config)
                mark_reloaded(g, a); /* loaded at run time: now also on the command line */
            a->from_config = true;
            continue;
        }
        bool was_loaded = a && !a->unloaded;
        if (!(a = adapter_slot(g, ca->name))) {
            LOG_ERR("reload: out of memory for adapter %s", ca->name);
            continue;
        }
        char *d = strdup(ca->dir);
        if (!d) {
            LOG_ERR("reload: out of memory for adapter %s", ca->name);
            continue;
        }
        free(a->dir);
        a->dir = d;
        a->rank = 0, a->alpha = 0.0f, a->targets = 0;
        adapter_meta(d, a);
        a->from_config = true, a->unloaded = false;
        mark_reloaded(g, a);
        struct shm_msg m;
        if (was_loaded) {
            m = (struct shm_msg){.type = SHM_MSG_ADAPTER_UNLOAD, .name = {.name = a->name}};
            send_to_serving(g, &m, "unload");
            changed++;
        } else {
            added++;
        }
        m = (struct shm_msg){.type = SHM_MSG_ADAPTER_LOAD,
                             .adapter_load = {.name = a->name, .path = a->dir}};
        send_to_serving(g, &m, "load");
        LOG_INFO("reload: adapter %s %s from %s", a->name, was_loaded ? "reloaded" : "loaded",
                 a->dir);
    }
    for (size_t i = 0; i < g->n_adapters; i++) {
        struct gw_adapter *a = &g->adapters[i];
        if (!a->from_config || config_find_adapter(fresh, a->name))
            continue;
        if (!a->unloaded) {
            struct shm_msg m = {.type = SHM_MSG_ADAPTER_UNLOAD, .name = {.name = a->name}};
            send_to_serving(g, &m, "unload");
            LOG_INFO("reload: adapter %s unloaded (no longer in the configuration)", a->name);
            dropped++;
        }
        a->from_config = false, a->unloaded = true; /* a tombstone for old command lines */
        mark_reloaded(g, a);
    }
    pthread_mutex_unlock(&g->adapters_mu);
    for (size_t i = g->n_slots; i-- > 0;)
        pthread_mutex_unlock(&g->slots[i].mu);
    *n_added = added, *n_changed = changed, *n_dropped = dropped;
}

void gw__adapters_init(struct gw *g, const struct config *c)
{
    for (size_t i = 0; i < c->n_adapters; i++) {
        gw__adapter_add(g, c->adapters[i].name, c->adapters[i].dir, NULL);
        struct gw_adapter *a = adapter_find(g, c->adapters[i].name);
        if (a)
            a->from_config = true;
    }
}

void gw__adapters_fini(struct gw *g)
{
    for (size_t i = 0; i < g->n_adapters; i++)
        free(g->adapters[i].dir);
    free(g->adapters);
    g->adapters = NULL;
    g->n_adapters = g->cap_adapters = 0;
}
