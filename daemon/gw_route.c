/*
 * gw_route.c — the gateway's routing: each worker slot's request table (worker request id ->
 * call item), which slots are routable, the submission of a worker request to the least-loaded
 * one, its cancellation, and what health and ListModels derive from the slots. Threads and
 * locks: gw_internal.h. Below the calls (daemon/gw_call.c) and the readers (gw_reader.c),
 * which both use it; it only takes and drops call references (gw_callobj.c).
 */
#include "err.h"
#include "gw_internal.h"
#include "log.h"
#include "mono.h"
#include "msg.h"
#include "region.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"

#define ADAPTER_BONUS 4 /* routing: requests a shared adapter is worth */

static size_t bucket(uint64_t id)
{
    return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 54) & (GW_BUCKETS - 1);
}

struct gw_entry *gw__table_take(struct gw_slot *s, uint64_t id)
{
    for (struct gw_entry **pp = &s->buckets[bucket(id)]; *pp; pp = &(*pp)->next)
        if ((*pp)->req_id == id) {
            struct gw_entry *e = *pp;
            *pp = e->next;
            s->n_entries--;
            return e;
        }
    return NULL;
}

struct gw_entry *gw__table_find(struct gw_slot *s, uint64_t id)
{
    for (struct gw_entry *e = s->buckets[bucket(id)]; e; e = e->next)
        if (e->req_id == id)
            return e;
    return NULL;
}

/* Whether the slot has a generation with this adapter in flight (slot->mu held). */
static bool slot_runs(const struct gw_slot *s, const char *adapter)
{
    for (size_t b = 0; b < GW_BUCKETS; b++)
        for (const struct gw_entry *e = s->buckets[b]; e; e = e->next)
            if (strcmp(e->adapter, adapter) == 0)
                return true;
    return false;
}

/* Routable: its worker is READY and the reader has seen its HELLO. slot->mu held. */
static bool routable(const struct gw_slot *s)
{
    return s->region && s->hello &&
           atomic_load_explicit(&s->ws->state, memory_order_acquire) == WORKERS_READY;
}

size_t gw__ready_slots(struct gw *g, int *idx, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_slots && n < cap; i++) {
        pthread_mutex_lock(&g->slots[i].mu);
        if (routable(&g->slots[i]))
            idx[n++] = (int)i;
        pthread_mutex_unlock(&g->slots[i].mu);
    }
    return n;
}

static void set_request_id(struct shm_msg *m, uint64_t id)
{
    switch (m->type) {
    case SHM_MSG_GENERATE: /* its queue time starts as it goes onto the ring */
        m->generate.request_id = id;
        m->generate.sent_ns = mono_ns();
        break;
    case SHM_MSG_TOKENIZE: m->tokenize.request_id = id; break;
    case SHM_MSG_DETOKENIZE: m->ids.request_id = id; break;
    case SHM_MSG_ADAPTER_LOAD: m->adapter_load.request_id = id; break;
    case SHM_MSG_ADAPTER_UNLOAD: m->name.request_id = id; break;
    default: m->request_id = id; break;
    }
}

int gw__submit(struct gw *g, int want_slot, struct shm_msg *m, struct gw_call *c, size_t item,
               char *msg, size_t cap)
{
    /* least loaded first, a worker already running the request's adapter counting as
     * ADAPTER_BONUS requests lighter (its tokens join a fused LoRA group instead of starting
     * one); a slot that turns out unroutable under its lock is skipped */
    const char *adapter = m->type == SHM_MSG_GENERATE && m->generate.adapter
                              ? m->generate.adapter : "";
    int order[CONFIG_MAX_WORKERS];
    size_t n = 0;
    if (want_slot >= 0) {
        order[n++] = want_slot;
    } else {
        size_t load[CONFIG_MAX_WORKERS];
        for (size_t i = 0; i < g->n_slots && n < CONFIG_MAX_WORKERS; i++) {
            struct gw_slot *s = &g->slots[i];
            pthread_mutex_lock(&s->mu);
            bool ok = routable(s);
            size_t l = s->n_entries + ADAPTER_BONUS;
            if (ok && adapter[0] && slot_runs(s, adapter))
                l -= ADAPTER_BONUS;
            pthread_mutex_unlock(&s->mu);
            if (!ok)
                continue;
            size_t j = n++;
            for (; j > 0 && load[j - 1] > l; j--)
                order[j] = order[j - 1], load[j] = load[j - 1];
            order[j] = (int)i, load[j] = l;
        }
    }
    if (n == 0) {
        /* a slot given up (crash loop, fatal model error) is not coming back by itself */
        size_t given_up = 0;
        for (size_t i = 0; i < g->n_slots; i++)
            given_up += atomic_load_explicit(&g->slots[i].ws->given_up, memory_order_relaxed);
        if (given_up == g->n_slots)
            snprintf(msg, cap, "no worker is ready to serve: every worker (%zu) was given up "
                     "after repeated failures (see clocherd's log); SIGHUP or a restart tries "
                     "again", g->n_slots);
        else if (given_up)
            snprintf(msg, cap, "no worker is ready to serve (%zu of %zu starting or "
                     "restarting, %zu given up)", g->n_slots - given_up, g->n_slots, given_up);
        else
            snprintf(msg, cap, "no worker is ready to serve (%zu of %zu starting or restarting)",
                     g->n_slots, g->n_slots);
        return GRPC_STATUS_UNAVAILABLE;
    }
    /* the least loaded worker is full (running and waiting): refused here, at once, not by
     * the worker between two engine steps (a long prefill step delayed such refusals by
     * seconds) */
    if (m->type == SHM_MSG_GENERATE && want_slot < 0) {
        struct config *cf = config_ptr_get(g->w->config);
        size_t full = SHM_MAX_RUNNING + cf->limits.max_queue;
        uint32_t max_queue = cf->limits.max_queue;
        config_unref(cf);
        struct gw_slot *s = &g->slots[order[0]];
        pthread_mutex_lock(&s->mu);
        size_t held = s->n_entries;
        pthread_mutex_unlock(&s->mu);
        if (held >= full) {
            snprintf(msg, cap, "overloaded: every worker holds %zu requests (%u running, %" PRIu32
                     " waiting: limits.max_queue); retry later", held, SHM_MAX_RUNNING,
                     max_queue);
            return GRPC_STATUS_UNAVAILABLE;
        }
    }
    struct gw_entry *e = malloc(sizeof *e);
    if (!e) {
        snprintf(msg, cap, "gateway out of memory");
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    int status = GRPC_STATUS_UNAVAILABLE;
    snprintf(msg, cap, "no worker is ready to serve");
    for (size_t k = 0; k < n; k++) {
        struct gw_slot *s = &g->slots[order[k]];
        pthread_mutex_lock(&s->mu);
        if (!routable(s)) {
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        uint64_t id = atomic_fetch_add(&g->next_id, 1);
        set_request_id(m, id);
        /* in the table before the send: the reader may see the answer at once */
        *e = (struct gw_entry){.req_id = id, .call = c, .item = item,
                               .next = s->buckets[bucket(id)]};
        snprintf(e->adapter, sizeof e->adapter, "%s", adapter);
        s->buckets[bucket(id)] = e;
        s->n_entries++;
        gw__call_ref(c);
        int rc = shm_msg_send(shm_region_tx(s->region->shm), m);
        if (rc == 0) {
            pthread_mutex_lock(&c->mu);
            c->items[item].req_id = id;
            c->items[item].slot = order[k];
            pthread_mutex_unlock(&c->mu);
            pthread_mutex_unlock(&s->mu);
            return GRPC_STATUS_OK;
        }
        gw__table_take(s, id);
        pthread_mutex_unlock(&s->mu);
        gw__call_unref(c);
        if (rc == ERR_FORMAT || rc == ERR_RANGE) {
            free(e);
            snprintf(msg, cap, "the request does not fit a worker's request record (%s; "
                     "limits.max_message_bytes bounds it)", err_str(rc));
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
        snprintf(msg, cap, "worker %d is overloaded: its request ring is %s", order[k],
                 rc == -EAGAIN ? "full" : "closed");
        status = GRPC_STATUS_UNAVAILABLE;
        if (want_slot >= 0)
            break;
    }
    free(e);
    return status;
}

void gw__cancel_item(struct gw *g, struct gw_call *c, size_t item)
{
    pthread_mutex_lock(&c->mu);
    uint64_t id = c->items[item].req_id;
    int slot = c->items[item].slot;
    c->items[item].req_id = 0;
    char rid[sizeof c->rid];
    memcpy(rid, c->rid, sizeof rid);
    pthread_mutex_unlock(&c->mu);
    if (!id || slot < 0)
        return;
    struct gw_slot *s = &g->slots[slot];
    pthread_mutex_lock(&s->mu);
    struct gw_entry *e = gw__table_take(s, id);
    if (e && s->region) {
        struct shm_msg m = {.type = SHM_MSG_CANCEL, .request_id = id};
        /* never wait under the slot lock: a full ring means the worker is swamped, and the
         * request ends at its deadline or max_tokens anyway */
        if (shm_msg_send(shm_region_tx(s->region->shm), &m) < 0)
            LOG_WARN("worker %d: request %s: could not send the cancel of its worker request %"
                     PRIu64 " (ring full)", slot, rid, id);
    }
    pthread_mutex_unlock(&s->mu);
    if (e) {
        free(e);
        gw__call_unref(c);
    }
}

/* ---- what the slots say about the daemon ---- */

int gw__health(struct gw *g)
{
    int phase = atomic_load(&g->w->phase);
    if (!atomic_load(&g->accepting) || phase == WORKERS_PHASE_DRAINING ||
        phase == WORKERS_PHASE_STOPPING)
        return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    int idx[1];
    return gw__ready_slots(g, idx, 1)
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

bool gw__model(struct gw *g, struct gw_model_info *out)
{
    for (size_t i = 0; i < g->n_slots; i++) {
        pthread_mutex_lock(&g->slots[i].mu);
        bool have = g->slots[i].model.have;
        if (have)
            *out = g->slots[i].model;
        pthread_mutex_unlock(&g->slots[i].mu);
        if (have)
            return true;
    }
    return false;
}
