/*
 * gw.c — clocherd's gRPC gateway: the server and its listeners, the completion-queue thread,
 * one event reader per worker slot, routing of requests to workers, the adapter registry and
 * the supervisor's hooks (see gw.h; threads and locks: gw_internal.h). The calls themselves
 * are daemon/gw_call.c.
 *
 * NOTES
 *  - gRPC C core has no generated service code for C: each method is registered by its path
 *    and its request arrives as a byte buffer (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER) that
 *    gw_call.c unpacks with protobuf-c. One completion queue serves every call; a call's
 *    address (its embedded tags) is the tag.
 *  - A reader adopts the region of its slot's current generation and serves it until the
 *    worker is gone: the supervisor's worker_died hook, the ring's peer check (-EPIPE) or a
 *    broken ring, whichever comes first. Records already committed by a dead worker are still
 *    delivered first; then every request left in the slot's table fails with UNAVAILABLE and
 *    the worker's death as the reason. A generation once ended is never adopted again.
 *  - Workers are told nothing about adapters loaded at run time by the supervisor: on each
 *    HELLO the reader replays the registry's run-time changes (loads and unloads) so a
 *    respawned worker serves what the old one did.
 */
#include "gw.h"

#include "err.h"
#include "gw_internal.h"
#include "log.h"
#include "msg.h"
#include "region.h"
#include "stats.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"

#define READER_SLICE_NS 50000000ll   /* a reader re-checks stop/death flags this often */
#define IDLE_POLL_US 20000           /* a reader without a region looks for one this often */
#define STATS_EVERY_NS 1000000000ull /* STATS_QUERY to each worker about once a second */
#define ADAPTER_BONUS 4               /* routing: requests a shared adapter is worth */
#define DEATH_WAIT_POLLS 30          /* x 10 ms a reader waits for the supervisor's reason */

static const char *const method_paths[GW_METHODS] = {
    [GW_GENERATE] = "/clocher.v1.Inference/Generate",
    [GW_BATCH_GENERATE] = "/clocher.v1.Inference/BatchGenerate",
    [GW_TOKENIZE] = "/clocher.v1.Inference/Tokenize",
    [GW_DETOKENIZE] = "/clocher.v1.Inference/Detokenize",
    [GW_LIST_MODELS] = "/clocher.v1.Inference/ListModels",
    [GW_LIST_ADAPTERS] = "/clocher.v1.Inference/ListAdapters",
    [GW_LOAD_ADAPTER] = "/clocher.v1.Inference/LoadAdapter",
    [GW_UNLOAD_ADAPTER] = "/clocher.v1.Inference/UnloadAdapter",
    [GW_GET_METRICS] = "/clocher.v1.Inference/GetMetrics",
    [GW_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
    [GW_HEALTH_WATCH] = "/grpc.health.v1.Health/Watch",
};

uint64_t gw__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- new calls ---- */

void gw__request(struct gw *g, enum gw_method m)
{
    if (atomic_load(&g->stopping))
        return;
    struct gw_call *c = gw__call_new(g, m);
    if (!c) {
        LOG_ERR("gateway: out of memory: no longer accepting %s calls",
                m < GW_METHODS ? method_paths[m] : "unknown");
        return;
    }
    grpc_call_error e;
    if (m == GW_UNKNOWN)
        e = grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cq, g->cq,
                                     &c->t_new);
    else
        e = grpc_server_request_registered_call(g->server, g->methods[m], &c->call,
                                                &c->deadline, &c->md, &c->payload, g->cq, g->cq,
                                                &c->t_new);
    if (e != GRPC_CALL_OK) {
        LOG_ERR("gateway: requesting a %s call: gRPC error %d",
                m < GW_METHODS ? method_paths[m] : "unregistered", (int)e);
        gw__call_unref(c);
    }
}

static void on_shutdown(struct gw_tag *t, bool ok)
{
    (void)ok;
    struct gw *g = t->obj;
    atomic_store(&g->shutdown_seen, true);
    grpc_completion_queue_shutdown(g->cq);
}

static void *cq_main(void *arg)
{
    struct gw *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                                   NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            struct gw_tag *t = ev.tag;
            t->fn(t, ev.success != 0);
        }
    }
    return NULL;
}

/* ---- slots: routing and the request tables ---- */

static size_t bucket(uint64_t id)
{
    return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 54) & (GW_BUCKETS - 1);
}

/* Unlinks and returns the entry of id (slot->mu held), NULL if none. */
static struct gw_entry *table_take(struct gw_slot *s, uint64_t id)
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

static struct gw_entry *table_find(struct gw_slot *s, uint64_t id)
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
    case SHM_MSG_GENERATE: m->generate.request_id = id; break;
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
        snprintf(msg, cap, "no worker is ready to serve (%zu of %zu starting or restarting)",
                 g->n_slots, g->n_slots);
        return GRPC_STATUS_UNAVAILABLE;
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
        table_take(s, id);
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
    pthread_mutex_unlock(&c->mu);
    if (!id || slot < 0)
        return;
    struct gw_slot *s = &g->slots[slot];
    pthread_mutex_lock(&s->mu);
    struct gw_entry *e = table_take(s, id);
    if (e && s->region) {
        struct shm_msg m = {.type = SHM_MSG_CANCEL, .request_id = id};
        /* never wait under the slot lock: a full ring means the worker is swamped, and the
         * request ends at its deadline or max_tokens anyway */
        if (shm_msg_send(shm_region_tx(s->region->shm), &m) < 0)
            LOG_WARN("worker %d: could not send the cancel of request %" PRIu64 " (ring full)",
                     slot, id);
    }
    pthread_mutex_unlock(&s->mu);
    if (e) {
        free(e);
        gw__call_unref(c);
    }
}

/* ---- health ---- */

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

/* ---- the adapter registry ---- */

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

/* Makes what a fresh worker serves match the registry (slot->mu held, reader thread): its
 * command line held the configuration's adapters as they were when it was spawned, so it gets
 * LOADs for run-time loads and UNLOADs for run-time unloads, and, when a reload changed an
 * adapter after the spawn, the adapter's new state (a LOAD it already has is answered as done).
 * Answers come back with ids nobody waits on and are dropped; the worker logs a failure. */
static void replay_adapters(struct gw *g, struct gw_slot *s, uint32_t generation)
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

/* ---- the event readers ---- */

/* Fails every request of the slot's current generation and lets go of its region. */
static void end_generation(struct gw_slot *s, const char *reason)
{
    struct gw *g = s->g;
    pthread_mutex_lock(&s->mu);
    struct workers_region *r = s->region;
    uint32_t gen = s->generation;
    struct gw_entry *list = NULL;
    for (size_t b = 0; b < GW_BUCKETS; b++) {
        while (s->buckets[b]) {
            struct gw_entry *e = s->buckets[b];
            s->buckets[b] = e->next;
            e->next = list;
            list = e;
        }
    }
    s->n_entries = 0;
    s->region = NULL;
    s->hello = false;
    pthread_mutex_unlock(&s->mu);
    size_t n = 0;
    while (list) {
        struct gw_entry *e = list;
        list = e->next;
        char msg[400];
        snprintf(msg, sizeof msg, "worker %u (generation %" PRIu32 ") is gone: %s", s->index,
                 gen, reason);
        gw__call_fail_item(e->call, e->item, GRPC_STATUS_UNAVAILABLE, msg);
        gw__call_unref(e->call);
        free(e);
        n++;
    }
    if (r) {
        if (n)
            LOG_WARN("worker %u generation %" PRIu32 ": %zu requests failed: %s", s->index, gen,
                     n, reason);
        workers_region_put(r);
        gw__health_changed(g);
    }
}

static void dispatch(struct gw_slot *s, const struct shm_msg *m)
{
    struct gw *g = s->g;
    uint64_t id;
    bool final = true;
    switch (m->type) {
    case SHM_MSG_HELLO:
        pthread_mutex_lock(&s->mu);
        s->model.have = true;
        s->model.parameters = m->hello.parameters;
        s->model.vocab_size = m->hello.vocab_size;
        s->model.context_length = m->hello.context_length;
        snprintf(s->model.name, sizeof s->model.name, "%s", m->hello.name);
        snprintf(s->model.arch, sizeof s->model.arch, "%s", m->hello.arch);
        snprintf(s->model.dtype, sizeof s->model.dtype, "%s", m->hello.dtype);
        if (s->region)
            replay_adapters(g, s, s->generation);
        s->hello = true;
        pthread_mutex_unlock(&s->mu);
        LOG_INFO("worker %u: serving %s (%s, %s, %" PRIu64 " parameters)", s->index,
                 m->hello.name, m->hello.arch, m->hello.dtype, m->hello.parameters);
        gw__health_changed(g);
        return;
    case SHM_MSG_STATS:
        if (g->stats)
            stats_worker_engine(g->stats, s->index, &m->stats);
        return;
    case SHM_MSG_TOKEN: id = m->token.request_id, final = false; break;
    case SHM_MSG_FINISH: id = m->finish.request_id; break;
    case SHM_MSG_ERROR: id = m->error.request_id; break;
    case SHM_MSG_TOKENS: id = m->ids.request_id; break;
    case SHM_MSG_TEXT: id = m->text.request_id; break;
    case SHM_MSG_ADAPTER: id = m->adapter.request_id; break;
    case SHM_MSG_DONE: id = m->request_id; break;
    default: return; /* shm_msg_recv only returns event types */
    }
    if (id == 0) {
        if (m->type == SHM_MSG_ERROR)
            LOG_WARN("worker %u: %s", s->index, m->error.message);
        return;
    }
    pthread_mutex_lock(&s->mu);
    struct gw_entry *e = final ? table_take(s, id) : table_find(s, id);
    struct gw_call *c = e ? e->call : NULL;
    size_t item = e ? e->item : 0;
    if (c && !final)
        gw__call_ref(c);
    pthread_mutex_unlock(&s->mu);
    if (!c)
        return; /* cancelled, or an answer nobody waits for (adapter replays) */
    gw__call_event(c, item, m);
    gw__call_unref(c); /* the table's reference (final) or ours */
    if (final)
        free(e);
}

static void *reader_main(void *arg)
{
    struct gw_slot *s = arg;
    struct gw *g = s->g;
    void *buf = NULL;
    size_t cap = 0;
    uint32_t ended_gen = 0;
    uint64_t next_stats = 0;
    while (!atomic_load(&g->stopping)) {
        pthread_mutex_lock(&s->mu);
        struct workers_region *r = s->region;
        bool died = r && s->died_gen == s->generation;
        char reason[sizeof s->died_reason];
        snprintf(reason, sizeof reason, "%s", s->died_reason);
        pthread_mutex_unlock(&s->mu);

        if (!r) {
            struct workers_region *nr = workers_region_get(s->ws);
            if (nr && nr->generation > ended_gen) {
                size_t need = ((size_t)shm_region_max_record(nr->shm) + 7u) & ~(size_t)7;
                if (need > cap) {
                    void *nb = realloc(buf, need);
                    if (!nb) {
                        LOG_ERR("worker %u: gateway out of memory for its event buffer",
                                s->index);
                        workers_region_put(nr);
                        usleep(IDLE_POLL_US);
                        continue;
                    }
                    buf = nb, cap = need;
                }
                pthread_mutex_lock(&s->mu);
                s->region = nr;
                s->generation = nr->generation;
                s->hello = false;
                pthread_mutex_unlock(&s->mu);
                continue;
            }
            workers_region_put(nr);
            usleep(IDLE_POLL_US);
            continue;
        }

        struct shm_ring *rx = shm_region_rx(r->shm);
        int rc = died ? -EPIPE : shm_ring_wait_readable(rx, READER_SLICE_NS);
        if (rc == 0 || rc == -EPIPE) {
            /* deliver what was committed, also by a worker that is gone */
            struct shm_msg m;
            int rrc;
            while ((rrc = shm_msg_recv(rx, buf, cap, &m)) == 0)
                dispatch(s, &m);
            if (rrc != -EAGAIN && rc == 0) {
                rc = rrc;
                snprintf(reason, sizeof reason, "its event ring broke (%s)", err_str(rrc));
            }
        }
        if (rc != 0 && rc != -ETIMEDOUT && rc != -EINTR) {
            /* the ring noticed first (pidfd): the supervisor, reaping the process, knows why
             * it ended ("killed by signal 9"); its word comes within moments */
            for (int k = 0; !died && rc == -EPIPE && k < DEATH_WAIT_POLLS; k++) {
                usleep(10000);
                pthread_mutex_lock(&s->mu);
                if ((died = s->died_gen == s->generation))
                    snprintf(reason, sizeof reason, "%s", s->died_reason);
                pthread_mutex_unlock(&s->mu);
            }
            if (!died) {
                struct shm_peer p;
                shm_region_peer(r->shm, &p);
                if (p.why[0])
                    snprintf(reason, sizeof reason, "%s", p.why);
                else if (!reason[0] || rc != -EPIPE)
                    snprintf(reason, sizeof reason, "its event ring failed (%s)",
                             err_str(rc));
            }
            ended_gen = s->generation;
            end_generation(s, reason);
            continue;
        }
        uint64_t now = gw__now_ns();
        if (g->stats && now >= next_stats) {
            next_stats = now + STATS_EVERY_NS;
            pthread_mutex_lock(&s->mu);
            if (s->region && s->hello) {
                struct shm_msg q = {.type = SHM_MSG_STATS_QUERY,
                                    .request_id = atomic_fetch_add(&g->next_id, 1)};
                (void)shm_msg_send(shm_region_tx(s->region->shm), &q); /* next time if full */
            }
            pthread_mutex_unlock(&s->mu);
        }
    }
    end_generation(s, "the daemon is stopping");
    free(buf);
    return NULL;
}

/* ---- supervisor hooks (its loop thread: queue, never block) ---- */

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

static void mark_reloaded(struct gw *g, struct gw_adapter *a)
{
    a->reloaded = true;
    for (size_t i = 0; i < g->n_slots; i++)
        a->reload_gen[i] = atomic_load(&g->slots[i].ws->generation);
}

/*
 * A reload makes the configuration's adapters table authoritative: adapters it adds (or
 * whose directory it changes) are loaded into the running workers, adapters it drops are
 * unloaded (requests using one finish first: the engine releases it after them). The workers
 * answer on their event rings with ids nobody waits on; a worker that cannot load an adapter
 * logs why, and requests naming it on that worker fail NOT_FOUND. Runs on the supervisor's
 * loop thread, which is also the one that spawns workers, so the generations read here are
 * exactly the ones started from the old command line.
 */
static void hook_config(void *ud, const struct config *fresh)
{
    struct gw *g = ud;
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
    LOG_INFO("gateway: configuration reloaded: %zu tenants; adapters %zu added, %zu changed, "
             "%zu dropped",
             fresh->n_tenants, added, changed, dropped);
}

/* ---- set-up ---- */

/* gRPC core's own messages (a TLS handshake that failed, a listener error) go through our log,
 * so under systemd they carry a priority like every other line. */
static void grpc_log_sink(gpr_log_func_args *a)
{
    const char *base = a->file ? strrchr(a->file, '/') : NULL;
    base = base ? base + 1 : a->file ? a->file : "?";
    switch (a->severity) {
    case GPR_LOG_SEVERITY_ERROR: LOG_WARN("grpc: %s (%s:%d)", a->message, base, a->line); break;
    case GPR_LOG_SEVERITY_INFO: LOG_INFO("grpc: %s (%s:%d)", a->message, base, a->line); break;
    default: LOG_DEBUG("grpc: %s (%s:%d)", a->message, base, a->line); break;
    }
}

static char *read_text(const char *path, const char *what)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        LOG_ERR("%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            char *p = realloc(buf, cap + 65536);
            if (!p) {
                free(buf);
                fclose(f);
                LOG_ERR("%s %s: out of memory", what, path);
                return NULL;
            }
            buf = p, cap += 65536;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
        if (len > (1u << 20)) {
            LOG_ERR("%s %s: larger than 1 MiB: not a PEM file", what, path);
            free(buf);
            fclose(f);
            return NULL;
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static grpc_server_credentials *server_creds(const struct config *c)
{
    if (!c->tls_cert)
        return grpc_insecure_server_credentials_create();
    char *cert = read_text(c->tls_cert, "tls.cert");
    char *key = cert ? read_text(c->tls_key, "tls.key") : NULL;
    char *ca = key && c->tls_client_ca ? read_text(c->tls_client_ca, "tls.client_ca") : NULL;
    grpc_server_credentials *cr = NULL;
    if (key && (!c->tls_client_ca || ca)) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        cr = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!cr)
            LOG_ERR("tls: gRPC refused the certificate %s / key %s", c->tls_cert, c->tls_key);
    }
    free(cert), free(key), free(ca);
    return cr;
}

static int add_port(struct gw *g, const char *addr, grpc_server_credentials *cr)
{
    int port = grpc_server_add_http2_port(g->server, addr, cr);
    if (port == 0) {
        LOG_ERR("gateway: cannot listen on %s (in use, or not an address of this host)", addr);
        return -EADDRINUSE;
    }
    LOG_INFO("gateway: listening on %s", addr);
    return 0;
}

int gw_create(struct workers *w, uv_loop_t *loop, struct gw **out)
{
    *out = NULL;
    struct gw *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    g->magic = GW_MAGIC;
    g->w = w;
    g->loop = loop;
    g->stats = w->stats;
    atomic_init(&g->accepting, true);
    atomic_init(&g->next_id, 1);
    auth_streams_init(&g->streams);
    pthread_mutex_init(&g->adapters_mu, NULL);
    g->t_shutdown = (struct gw_tag){.fn = on_shutdown, .obj = g};
    g->n_slots = w->n;
    if (!(g->slots = calloc(w->n, sizeof *g->slots))) {
        free(g);
        return -ENOMEM;
    }
    for (size_t i = 0; i < w->n; i++) {
        struct gw_slot *s = &g->slots[i];
        s->g = g;
        s->index = (unsigned)i;
        s->ws = &w->slots[i];
        pthread_mutex_init(&s->mu, NULL);
    }

    struct config *c = config_ptr_get(w->config);
    for (size_t i = 0; i < c->n_adapters; i++) {
        gw__adapter_add(g, c->adapters[i].name, c->adapters[i].dir, NULL);
        struct gw_adapter *a = adapter_find(g, c->adapters[i].name);
        if (a)
            a->from_config = true;
    }

    /* fork+exec of workers happens while our threads run: gRPC's fork handlers would only
     * stall the supervisor, and the child execs at once */
    setenv("GRPC_ENABLE_FORK_SUPPORT", "0", 0);
    gpr_set_log_function(grpc_log_sink);
    grpc_init();
    grpc_arg args[3] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)c->limits.max_message_bytes},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)c->limits.max_message_bytes},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONCURRENT_STREAMS,
         .value.integer = (int)c->limits.max_streams_per_connection},
    };
    grpc_channel_args ca = {.num_args = 3, .args = args};
    g->server = grpc_server_create(&ca, NULL);
    g->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    for (int m = 0; m < GW_METHODS; m++)
        g->methods[m] = grpc_server_register_method(g->server, method_paths[m], NULL,
                                                    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    int rc = 0;
    grpc_server_credentials *cr = server_creds(c);
    if (!cr) {
        rc = ERR_FORMAT;
    } else {
        if (c->listen_tcp)
            rc = add_port(g, c->listen_tcp, cr);
        if (rc == 0 && c->listen_unix) {
            char addr[4200];
            snprintf(addr, sizeof addr, "unix:%s", c->listen_unix);
            rc = add_port(g, addr, cr);
        }
        grpc_server_credentials_release(cr);
    }
    config_unref(c);
    if (rc < 0) {
        grpc_server_destroy(g->server);
        g->server = NULL;
        gw_destroy(g);
        return rc;
    }
    grpc_server_start(g->server);
    for (int m = 0; m <= GW_UNKNOWN; m++) {
        /* a few calls requested ahead for the streaming methods: bursts queue less */
        int ahead = m == GW_GENERATE || m == GW_BATCH_GENERATE ? 4 : 1;
        for (int k = 0; k < ahead; k++)
            gw__request(g, (enum gw_method)m);
    }
    if (pthread_create(&g->cq_thread, NULL, cq_main, g) != 0) {
        LOG_ERR("gateway: pthread_create: %s", strerror(errno));
        gw_destroy(g);
        return -ENOMEM;
    }
    g->cq_started = true;
    for (size_t i = 0; i < g->n_slots; i++) {
        if (pthread_create(&g->slots[i].reader, NULL, reader_main, &g->slots[i]) != 0) {
            LOG_ERR("gateway: pthread_create: %s", strerror(errno));
            gw_destroy(g);
            return -ENOMEM;
        }
        g->slots[i].reader_started = true;
    }
    g->hooks = (struct workers_hooks){.worker_ready = hook_ready, .worker_died = hook_died,
                                      .stop_accepting = hook_stop_accepting,
                                      .active_streams = hook_active,
                                      .config_changed = hook_config};
    w->hooks = &g->hooks;
    w->hooks_ud = g;
    *out = g;
    return 0;
}

void gw_destroy(struct gw *g)
{
    if (!g)
        return;
    atomic_store(&g->stopping, true);
    atomic_store(&g->accepting, false);
    if (g->w->hooks == &g->hooks)
        g->w->hooks = NULL;
    /* the readers fail what their workers still had */
    for (size_t i = 0; i < g->n_slots; i++)
        if (g->slots[i].reader_started)
            pthread_join(g->slots[i].reader, NULL);
    if (g->server) {
        grpc_server_shutdown_and_notify(g->server, g->cq, &g->t_shutdown);
        grpc_server_cancel_all_calls(g->server);
        if (!g->cq_started) {
            /* nothing polls the queue: drain it here */
            while (!atomic_load(&g->shutdown_seen)) {
                grpc_event ev = grpc_completion_queue_next(
                    g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
                if (ev.type == GRPC_OP_COMPLETE)
                    ((struct gw_tag *)ev.tag)->fn(ev.tag, ev.success != 0);
            }
        }
    } else if (g->cq) {
        grpc_completion_queue_shutdown(g->cq);
    }
    if (g->cq_started) {
        pthread_join(g->cq_thread, NULL);
    } else if (g->cq) {
        while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
    }
    if (g->server)
        grpc_server_destroy(g->server);
    if (g->cq)
        grpc_completion_queue_destroy(g->cq);
    if (g->cq || g->server)
        grpc_shutdown();
    for (size_t i = 0; i < g->n_slots; i++)
        pthread_mutex_destroy(&g->slots[i].mu);
    for (size_t i = 0; i < g->n_adapters; i++)
        free(g->adapters[i].dir);
    free(g->adapters);
    free(g->watch);
    free(g->slots);
    auth_streams_fini(&g->streams);
    pthread_mutex_destroy(&g->adapters_mu);
    g->magic = 0;
    free(g);
}
