/*
 * workers.c — the worker slot table shared by the supervisor and the gateway (see workers.h
 * for who writes what), and the reference counting of each generation's shm region.
 */
#include "workers.h"

#include "check.h"
#include "err.h"
#include "log.h"
#include "topo.h"
#include "region.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int workers_create(const struct topo_plan *plan, struct config_ptr *config, struct workers **out)
{
    *out = NULL;
    struct workers *w = calloc(1, sizeof *w);
    if (!w || !(w->slots = calloc(plan->n ? plan->n : 1, sizeof *w->slots))) {
        free(w);
        LOG_ERR("workers: out of memory");
        return -ENOMEM;
    }
    w->magic = WORKERS_MAGIC;
    w->config = config;
    atomic_init(&w->phase, WORKERS_PHASE_STARTING);
    for (size_t i = 0; i < plan->n; i++) {
        struct workers_slot *s = &w->slots[i];
        const struct topo_share *sh = &plan->shares[i];
        s->magic = WORKERS_SLOT_MAGIC;
        s->index = (unsigned)i;
        s->node = sh->node;
        s->n_cpus = sh->n_cpus;
        s->cpus = malloc(sh->n_cpus * sizeof *s->cpus);
        if (!s->cpus) {
            w->n = i;
            workers_destroy(w);
            return -ENOMEM;
        }
        memcpy(s->cpus, sh->cpus, sh->n_cpus * sizeof *s->cpus);
        /* 256 bytes hold any list the planner makes from one node's contiguous run */
        if (topo_cpulist_format(s->cpus, s->n_cpus, s->cpulist, sizeof s->cpulist) < 0)
            snprintf(s->cpulist, sizeof s->cpulist, "%d-%d (%zu CPUs)", s->cpus[0],
                     s->cpus[s->n_cpus - 1], s->n_cpus);
        atomic_init(&s->state, WORKERS_DEAD);
        atomic_init(&s->pid, 0);
        atomic_init(&s->generation, 0);
        atomic_init(&s->restarts, 0);
        atomic_init(&s->given_up, false);
        atomic_init(&s->hot_replicated_bytes, 0);
        atomic_init(&s->hot_replicated_tensors, 0);
        CHECK(pthread_mutex_init(&s->mu, NULL) == 0);
        w->n = i + 1;
    }
    *out = w;
    return 0;
}

void workers_destroy(struct workers *w)
{
    if (!w)
        return;
    CHECK(w->magic == WORKERS_MAGIC);
    for (size_t i = 0; i < w->n; i++) {
        struct workers_slot *s = &w->slots[i];
        workers_slot_set_region(s, NULL);
        pthread_mutex_destroy(&s->mu);
        free(s->cpus);
        s->magic = 0;
    }
    free(w->slots);
    w->magic = 0;
    free(w);
}

int workers_region_wrap(unsigned slot, uint32_t generation, struct shm_region *shm,
                        struct workers_region **out)
{
    struct workers_region *r = calloc(1, sizeof *r);
    *out = NULL;
    if (!r) {
        LOG_ERR("workers: out of memory");
        return -ENOMEM;
    }
    r->magic = WORKERS_REGION_MAGIC;
    atomic_init(&r->refs, 1);
    r->slot = slot;
    r->generation = generation;
    r->shm = shm;
    *out = r;
    return 0;
}

struct workers_region *workers_region_get(struct workers_slot *s)
{
    pthread_mutex_lock(&s->mu);
    struct workers_region *r = s->region;
    if (r)
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&s->mu);
    return r;
}

void workers_region_put(struct workers_region *r)
{
    if (!r)
        return;
    CHECK(r->magic == WORKERS_REGION_MAGIC);
    /* acq_rel: the thread that unmaps sees every other holder's last access */
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) {
        shm_region_close(r->shm);
        r->magic = 0;
        free(r);
    }
}

void workers_slot_set_region(struct workers_slot *s, struct workers_region *r)
{
    pthread_mutex_lock(&s->mu);
    struct workers_region *old = s->region;
    s->region = r;
    pthread_mutex_unlock(&s->mu);
    workers_region_put(old);
}

size_t workers_ready_count(const struct workers *w)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n; i++)
        if (atomic_load_explicit(&w->slots[i].state, memory_order_acquire) == WORKERS_READY)
            n++;
    return n;
}

const char *workers_state_name(int state)
{
    switch (state) {
    case WORKERS_STARTING: return "starting";
    case WORKERS_READY: return "ready";
    case WORKERS_DRAINING: return "draining";
    case WORKERS_DEAD: return "dead";
    }
    return "?";
}

const char *workers_phase_name(int phase)
{
    switch (phase) {
    case WORKERS_PHASE_STARTING: return "starting";
    case WORKERS_PHASE_SERVING: return "serving";
    case WORKERS_PHASE_DRAINING: return "draining";
    case WORKERS_PHASE_STOPPING: return "stopping";
    }
    return "?";
}
