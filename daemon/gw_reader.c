/*
 * gw_reader.c — the gateway's event readers: one thread per worker slot that adopts the shm
 * region of the slot's current generation, turns the records of its event ring into updates
 * of calls (daemon/gw_call.c), asks the worker for its STATS once a second, and ends the
 * generation when the worker is gone. Threads and locks: gw_internal.h.
 *
 * NOTES
 *  - A reader adopts the region of its slot's current generation and serves it until the
 *    worker is gone: the supervisor's worker_died hook, the ring's peer check (-EPIPE) or a
 *    broken ring, whichever comes first. Records already committed by a dead worker are still
 *    delivered first; then every request left in the slot's table fails with UNAVAILABLE and
 *    the worker's death as the reason. A generation once ended is never adopted again.
 */
#include "err.h"
#include "gw_internal.h"
#include "log.h"
#include "mono.h"
#include "msg.h"
#include "region.h"
#include "stats.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READER_SLICE_NS 50000000ll   /* a reader re-checks stop/death flags this often */
#define IDLE_POLL_US 20000           /* a reader without a region looks for one this often */
#define STATS_EVERY_NS 1000000000ull /* STATS_QUERY to each worker about once a second */
#define DEATH_WAIT_POLLS 30          /* x 10 ms a reader waits for the supervisor's reason */

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
            gw__adapters_replay(g, s, s->generation);
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
    if (g->stats)
        stats_track(g->stats, s->index, m, mono_ns()); /* vllm:inter_token_latency_seconds */
    pthread_mutex_lock(&s->mu);
    struct gw_entry *e = final ? gw__table_take(s, id) : gw__table_find(s, id);
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

void *gw__reader_main(void *arg)
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
        uint64_t now = mono_ns();
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
