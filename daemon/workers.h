/*
 * workers.h — the contract between clocherd's supervisor (daemon/sup.c, libuv loop thread) and
 * its gRPC gateway (daemon/gw*.c, its own threads): the fixed table of worker slots, the
 * shared-memory region of each worker's current generation, and the events the supervisor
 * tells the gateway about.
 *
 * A slot is one place a worker runs: a NUMA node and a CPU share, fixed for the daemon's life
 * (index, node, cpus). The worker process in it changes: each spawn is a new generation with a
 * fresh shm region; a crash ends the generation.
 *
 * NOTES (who writes what):
 *  - Everything in struct workers and the slot's identity (index, node, cpus, cpulist) is
 *    written once before the loop runs and read-only afterwards.
 *  - The slot's atomics (state, pid, generation, restarts, given_up, hot_replicated_*) are
 *    written ONLY by the supervisor's loop thread; any thread may read them (acquire loads pair
 *    with the supervisor's release stores). `generation` is stored before `state`, so a reader
 *    seeing READY after an acquire load of `state` sees the ready generation (or a later one).
 *  - `region` is guarded by the slot's mutex: the supervisor replaces it at each spawn and
 *    clears it when the generation ends; readers take a reference with workers_region_get()
 *    and drop it with workers_region_put(). The last reference unmaps the region, so a gateway
 *    thread still draining events of a dead generation never reads unmapped memory.
 *  - Hooks are called on the supervisor's loop thread; the gateway must only queue work to
 *    its own threads from them (they must not block).
 *  - The supervisor never reads memory a worker writes (PostgreSQL's postmaster rule): it
 *    creates each region and hands it over; readiness and liveness come from the worker's
 *    control socket (daemon/ctl.h), not from the region.
 *
 * The gateway side (daemon/gw.h) provides, and clocherd's main.c calls:
 *     int  gw_create(struct workers *w, uv_loop_t *loop, struct gw **out); // sets w->hooks
 *     void gw_destroy(struct gw *g);                                       // joins its threads
 * and daemon/metrics.c likewise metrics_create(w, loop, &m) / metrics_destroy(m), serving
 * config->metrics_listen on the loop. Both are created before the workers are spawned and
 * destroyed after the loop has stopped. This file calls neither of them, nor daemon/stats.c:
 * they read the table, it knows nothing of them.
 */
#ifndef CLOCHER_DAEMON_WORKERS_H
#define CLOCHER_DAEMON_WORKERS_H

#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WORKERS_MAGIC 0x574b5253u      /* "WKRS" */
#define WORKERS_SLOT_MAGIC 0x534c4f54u /* "SLOT" */
#define WORKERS_REGION_MAGIC 0x5247494eu /* "RGIN" */

/* Lifecycle of the worker in a slot. */
enum workers_state {
    WORKERS_STARTING = 0, /* spawned, loading its model: not routable */
    WORKERS_READY = 1,    /* serving: route requests here */
    WORKERS_DRAINING = 2, /* being stopped: finish what it has, send nothing new */
    WORKERS_DEAD = 3,     /* no process: waiting to respawn, or given up (see given_up) */
};

/* The daemon as a whole (health: SERVING only in WORKERS_PHASE_SERVING with a READY slot). */
enum workers_phase {
    WORKERS_PHASE_STARTING = 0, /* not every worker has been ready yet */
    WORKERS_PHASE_SERVING = 1,
    WORKERS_PHASE_DRAINING = 2, /* SIGTERM: no new calls, in-flight streams finish */
    WORKERS_PHASE_STOPPING = 3, /* workers being stopped */
};

struct shm_region; /* shm/region.h */
struct stats;      /* stats.h */

/* One generation's region, reference-counted (see NOTES). */
struct workers_region {
    uint32_t magic;
    atomic_uint refs;
    unsigned slot;
    uint32_t generation;
    struct shm_region *shm;
};

struct workers_slot {
    uint32_t magic;
    unsigned index;
    int node;                    /* NUMA node of its CPUs and memory */
    size_t n_cpus;
    int *cpus;                   /* [n_cpus] ascending */
    char cpulist[256];           /* the same as text, "0-7" (labels, logs, worker argv) */

    _Atomic int state;           /* enum workers_state */
    _Atomic int pid;             /* 0 when no process */
    _Atomic uint32_t generation; /* 1 for the first spawn, +1 per respawn */
    _Atomic uint64_t restarts;   /* respawns after a crash */
    _Atomic bool given_up;       /* crash loop or fatal model error: not respawned */
    _Atomic uint64_t hot_replicated_bytes; /* what the worker copied to node-local memory */
    _Atomic uint64_t hot_replicated_tensors; /* and how many tensors that was */

    pthread_mutex_t mu;          /* guards region */
    struct workers_region *region; /* current generation's region, NULL when none */
};

/* Why a generation ended: what the gateway puts in the UNAVAILABLE status of its streams. */
struct workers_death {
    unsigned slot;
    uint32_t generation;
    int pid;
    int exit_code;       /* -1 when killed by a signal */
    int term_signal;     /* 0 when it exited */
    bool respawning;     /* false: crash loop, fatal error or daemon stopping */
    char reason[160];    /* "worker 1 (pid 4242, generation 3) was killed by signal 9 (Killed)" */
};

struct workers_hooks {
    /* The slot's worker reached READY (its region is published). */
    void (*worker_ready)(void *ud, struct workers_slot *s, uint32_t generation);
    /* The generation ended: fail its in-flight streams (UNAVAILABLE, d->reason and the tokens
     * already sent) and drop every reference to its region. */
    void (*worker_died)(void *ud, struct workers_slot *s, const struct workers_death *d);
    /* SIGTERM: refuse new calls (UNAVAILABLE), health NOT_SERVING, let streams finish. */
    void (*stop_accepting)(void *ud);
    /* Streams still in flight (the supervisor polls it while draining). Any thread. */
    size_t (*active_streams)(void *ud);
    /* A reload took effect; `fresh` is borrowed (the gateway reads config through w->config). */
    void (*config_changed)(void *ud, const struct config *fresh);
};

struct workers {
    uint32_t magic;
    size_t n;
    struct workers_slot *slots;   /* [n], fixed */
    struct config_ptr *config;    /* the current configuration snapshot (config.h) */
    _Atomic int phase;            /* enum workers_phase, written by the supervisor */
    const struct workers_hooks *hooks; /* set by gw_create before the loop runs; may be NULL */
    void *hooks_ud;
    /* Counters the gateway records and the metrics endpoint renders (daemon/stats.h), lent
     * here so both reach them as w->stats: main.c creates them before gw_create and frees them
     * after the loop's last run; the table itself never touches them. NULL: nothing recorded.
     * Any thread (stats.h has its own rules). */
    struct stats *stats;
};

struct topo_plan;

/* Builds the table from a placement plan (daemon/topo.h): one slot per share, DEAD, no pid. */
int workers_create(const struct topo_plan *plan, struct config_ptr *config, struct workers **out);
/* Drops every slot's region and frees the table. NULL is a no-op. */
void workers_destroy(struct workers *w);

/* A reference to the slot's current region, or NULL if it has none. Any thread. */
struct workers_region *workers_region_get(struct workers_slot *s);
/* Drops a reference; the last one unmaps the region. NULL is a no-op. Any thread. */
void workers_region_put(struct workers_region *r);
/* Supervisor only: wraps a freshly created region (one reference, the caller's). */
int workers_region_wrap(unsigned slot, uint32_t generation, struct shm_region *shm,
                        struct workers_region **out);
/* Supervisor only: replaces the slot's region (taking over the caller's reference to r, which
 * may be NULL) and drops the slot's reference to the previous one. */
void workers_slot_set_region(struct workers_slot *s, struct workers_region *r);

/* Slots currently READY. Any thread. */
size_t workers_ready_count(const struct workers *w);
const char *workers_state_name(int state);
const char *workers_phase_name(int phase);

#endif
