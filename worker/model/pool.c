/*
 * pool.c — the persistent thread pool (pool.h).
 *
 * NOTES on the protocol. The counters each sit on their own cache line so that spinning
 * readers of one do not slow down writers of another:
 *  - claim: the job's generation (high 32 bits) and its next unclaimed task (low 32 bits). A
 *    participant claims task i by a compare-and-swap from (g, i) to (g, i + 1); the job's
 *    fields (fn, ctx, n_tasks) are read before that swap, and the swap succeeding proves they
 *    were job g's: the caller closes the word, (g + 1, CLAIM_CLOSED), before it writes the next
 *    job's fields (a fence between), so a swap from (g, i) fails once any field of g + 1 was
 *    read. A slow participant simply claims fewer tasks.
 *  - done: tasks of the current job completed. The caller waits for done == n_tasks (acquire;
 *    each task's increment is a release), so all task effects happen-before pool_run returns.
 *    It waits for TASKS, not for workers: a worker that has not come by yet (descheduled on a
 *    loaded machine, still waking) is not waited for, since it has claimed nothing; when it
 *    comes by it finds every task of its job claimed, or claims in the next job. Waiting for
 *    every worker to check in cost a scheduler slice per job whenever a worker was off its
 *    CPU, and a forward pass runs hundreds of jobs per step.
 *  - gen: the wake-up counter. The caller publishes a job by writing its fields, done = 0 and
 *    claim = (g, 0) (release), then incrementing gen (seq_cst); workers spin on gen for
 *    SPIN_NS, then sleep in futex_wait(gen). A sleeper first increments `sleepers` and
 *    re-checks gen; the caller increments gen and then reads `sleepers`: with both seq_cst,
 *    either the worker sees the new gen or the caller sees the sleeper and calls futex_wake
 *    (the Dekker pattern), and futex_wait itself refuses to sleep if gen already moved. The
 *    caller waiting for done sleeps with the same protocol (caller_sleeping / futex on done).
 * futex only puts threads to sleep; all ordering is carried by the C11 atomics, which keeps
 * ThreadSanitizer's model exact (the job's fields are atomics too: a late worker may read them
 * while the caller writes the next job's, then fail its claim).
 */
#include "pool.h"
#include "mono.h"

#include "check.h"
#include "err.h"
#include "log.h"

#include <errno.h>
#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAGIC 0x504f4f4cu /* "POOL" */
#define SPIN_NS 200000         /* spin 200 us before sleeping: back-to-back jobs never sleep */
#define CACHE_LINE 64
#define CLAIM_CLOSED 0xffffffffu /* claim's index while a job's fields are being written */

struct pool;

struct worker {
    struct pool *pool;
    int index; /* participant number, 1.. */
    pthread_t thread;
};

struct pool {
    uint32_t magic;
    int n;         /* participants, caller included */
    int n_started; /* worker threads running (for cleanup after a failed create) */
    struct worker *workers;
    int caller_pinned;     /* the creating thread was pinned: restore caller_mask at destroy */
    cpu_set_t caller_mask;
    uint32_t job;          /* the caller's job counter, claim's high half (a worker would have to
                            * stall for 2^32 jobs to mistake an old claim for a new one) */

    /* the job, written by the caller before it publishes claim; read by any participant */
    _Atomic(pool_task_fn *) fn;
    _Atomic(void *) ctx;
    atomic_size_t n_tasks;
    atomic_int stop;

    alignas(CACHE_LINE) atomic_uint gen;
    atomic_int sleepers;
    alignas(CACHE_LINE) _Atomic uint64_t claim;
    alignas(CACHE_LINE) atomic_uint done;
    atomic_int caller_sleeping;
};

static void futex_wait(atomic_uint *addr, unsigned val)
{
    /* EAGAIN (value moved) and EINTR are both "look again" */
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *addr)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Spins up to SPIN_NS until *v != old; true if it changed. */
static int spin_while_equal(atomic_uint *v, unsigned old)
{
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old)
            return 1;
        _mm_pause();
        if ((i & 255) == 0) {
            uint64_t t = mono_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                return 0;
        }
    }
}

/* Claims and runs tasks of the current job until none is left (or the job moved on). */
static void run_tasks(struct pool *p, int thread)
{
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        pool_task_fn *fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        size_t n = atomic_load_explicit(&p->n_tasks, memory_order_relaxed);
        /* pairs with pool_run's fence: fields of a newer job mean the claim was closed */
        atomic_thread_fence(memory_order_acquire);
        size_t i = (size_t)(uint32_t)c;
        if (i >= n)
            return; /* all claimed (or fields of a newer job: it is ours to find next time) */
        /* on failure c is reloaded (acquire): the next task, or a newer job */
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, i, thread);
        unsigned d = atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1;
        if (d == n && atomic_load(&p->caller_sleeping))
            futex_wake_all(&p->done);
        c++;
    }
}

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    struct pool *p = wk->pool;
    unsigned seen = 0;
    for (;;) {
        if (!spin_while_equal(&p->gen, seen)) {
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen)
                futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            return NULL;
        run_tasks(p, wk->index);
    }
}

/* Wakes the workers: spinning ones see gen move, sleeping ones get a futex wake. */
static void publish(struct pool *p)
{
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
}

/* Returns when all n tasks of the current job are done. */
static void wait_done(struct pool *p, unsigned n)
{
    for (;;) {
        unsigned d = atomic_load_explicit(&p->done, memory_order_acquire);
        if (d == n)
            return;
        if (spin_while_equal(&p->done, d))
            continue;
        atomic_store(&p->caller_sleeping, 1);
        d = atomic_load(&p->done);
        if (d != n)
            futex_wait(&p->done, d);
        atomic_store(&p->caller_sleeping, 0);
    }
}

void pool_run(struct pool *p, pool_task_fn *fn, void *ctx, size_t n_tasks)
{
    CHECK(p && p->magic == POOL_MAGIC);
    if (n_tasks == 0)
        return;
    if (p->n == 1 || n_tasks == 1) {
        for (size_t i = 0; i < n_tasks; i++)
            fn(ctx, i, 0);
        return;
    }
    CHECK(n_tasks < CLAIM_CLOSED); /* claim's low half */
    /* The previous job is complete (its pool_run waited for done), but its claim word still
     * reads (g, n): a participant holding that value and reading the NEW n could claim task n
     * of the new job under the old generation. So the claim is closed first, (g + 1, CLAIM_
     * CLOSED), and the release fence orders that before the new fields: a participant that
     * reads any new field (then its acquire fence) fails its swap against the closed word. */
    p->job++;
    atomic_store_explicit(&p->claim, (uint64_t)p->job << 32 | CLAIM_CLOSED,
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)p->job << 32, memory_order_release);
    publish(p);
    run_tasks(p, 0);
    wait_done(p, (unsigned)n_tasks);
}

void pool_wake(struct pool *p)
{
    CHECK(p && p->magic == POOL_MAGIC);
    if (p->n == 1 || atomic_load(&p->sleepers) == 0)
        return; /* every worker is still spinning: the next job reaches them at once */
    publish(p); /* the last job's tasks are all claimed: the workers find nothing and spin */
}

/*
 * pool_for's shards: 4 rounds of one shard per participant (so at most 4 per participant, as
 * pool.h promises). Few units: equal shards. Many: the rounds take 44%, 32%, 18% and 6% of the
 * range, so the shards shrink towards its end. With equal shards of 1/(4n) the participant that
 * took the last one ran alone for up to a shard, 1/8 of a 2-thread job (at 8 decode streams
 * the caller spun in the joins ~5% of its time, the worker ~6%); the last round's shards are
 * 3% of it, and the first ones are longer than before (the same count of claims and kernel
 * starts).
 */
static const unsigned for_round_w[4] = {22, 16, 9, 3}; /* of FOR_ROUND_SUM */
#define FOR_ROUND_SUM 50u
/* units per participant from which the shards shrink: the last round's are >= 1.9 units */
#define FOR_GUIDED_MIN_UNITS 32

struct for_ctx {
    pool_range_fn *fn;
    void *ctx;
    size_t begin, end, grain;
    size_t shard; /* units per shard, equal split; 0: the shrinking rounds */
    size_t units, n; /* the rounds: units in the range, participants */
};

/* First unit of shard i of the shrinking rounds (i <= 4n; shard i is [at(i), at(i + 1))). */
static size_t for_round_at(const struct for_ctx *fc, size_t i)
{
    size_t k = i / fc->n, j = i % fc->n, c = 0;
    for (size_t r = 0; r < k; r++)
        c += for_round_w[r] * fc->n;
    if (k < 4)
        c += for_round_w[k] * j;
    return (size_t)((unsigned __int128)fc->units * c / (FOR_ROUND_SUM * fc->n));
}

static void for_task(void *arg, size_t task, int thread)
{
    const struct for_ctx *fc = arg;
    size_t b, e;
    if (fc->shard) {
        b = fc->begin + task * fc->shard;
        e = fc->end - b < fc->shard ? fc->end : b + fc->shard;
    } else {
        b = fc->begin + for_round_at(fc, task) * fc->grain;
        e = task + 1 == 4 * fc->n ? fc->end : fc->begin + for_round_at(fc, task + 1) * fc->grain;
    }
    fc->fn(fc->ctx, b, e, thread);
}

void pool_for(struct pool *p, size_t begin, size_t end, size_t grain, pool_range_fn *fn,
              void *ctx)
{
    CHECK(grain > 0);
    if (begin >= end)
        return;
    size_t units = (end - begin + grain - 1) / grain;
    struct for_ctx fc = {fn, ctx, begin, end, grain, 0, units, (size_t)p->n};
    if (units < (size_t)p->n * FOR_GUIDED_MIN_UNITS) {
        size_t max_shards = (size_t)p->n * 4;
        fc.shard = (units + max_shards - 1) / max_shards * grain;
        pool_run(p, for_task, &fc, (end - begin + fc.shard - 1) / fc.shard);
        return;
    }
    pool_run(p, for_task, &fc, 4 * (size_t)p->n);
}

int pool_threads(const struct pool *p) { return p->n; }

/* The CPUs of the process's affinity mask, in order; count in *n. */
static int affinity_cpus(int *cpus, int *n)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        int rc = -errno;
        LOG_ERR("pool: sched_getaffinity failed: %s", strerror(errno));
        return rc;
    }
    *n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            cpus[(*n)++] = c;
    return 0;
}

int pool_pin_parse(const char *s, enum pool_pin *out)
{
    static const struct {
        const char *name;
        enum pool_pin pin;
    } modes[] = {{"none", POOL_PIN_NONE}, {"compact", POOL_PIN_COMPACT},
                 {"scatter", POOL_PIN_SCATTER}};
    for (size_t i = 0; s && i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(s, modes[i].name)) {
            *out = modes[i].pin;
            return 0;
        }
    return ERR_RANGE;
}

int pool_affinity_count(void)
{
    int cpus[CPU_SETSIZE], n = 0;
    int rc = affinity_cpus(cpus, &n);
    return rc < 0 ? rc : n;
}

static int pin_thread(pthread_t th, int cpu, int participant)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int e = pthread_setaffinity_np(th, sizeof set, &set);
    if (e != 0) {
        LOG_ERR("pool: pinning participant %d to CPU %d failed: %s", participant, cpu,
                strerror(e));
        return -e;
    }
    return 0;
}

int pool_create(int n_threads, enum pool_pin pin, struct pool **out)
{
    int rc = 0;
    int cpus[CPU_SETSIZE];
    int n_cpus = 0;
    if (n_threads < 1 || n_threads > POOL_MAX_THREADS) {
        LOG_ERR("pool: %d threads requested, expected 1..%d", n_threads, POOL_MAX_THREADS);
        return ERR_RANGE;
    }
    if (pin != POOL_PIN_NONE && pin != POOL_PIN_COMPACT && pin != POOL_PIN_SCATTER) {
        LOG_ERR("pool: unknown pin mode %d", (int)pin);
        return ERR_RANGE;
    }
    int cpu_of[POOL_MAX_THREADS];
    if (pin != POOL_PIN_NONE) {
        rc = affinity_cpus(cpus, &n_cpus);
        if (rc != 0)
            return rc;
        if (n_threads > n_cpus) {
            LOG_ERR("pool: cannot pin %d threads to the %d CPUs of the affinity mask",
                    n_threads, n_cpus);
            return ERR_RANGE;
        }
        for (int i = 0; i < n_threads; i++)
            cpu_of[i] = pin == POOL_PIN_COMPACT ? cpus[i] : cpus[(size_t)i * n_cpus / n_threads];
    }

    struct pool *p = aligned_alloc(CACHE_LINE, sizeof *p); /* a multiple of its alignment */
    if (!p) {
        LOG_ERR("pool: out of memory");
        return -ENOMEM;
    }
    memset(p, 0, sizeof *p);
    p->magic = POOL_MAGIC;
    p->n = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->n_tasks, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->caller_sleeping, 0);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            LOG_ERR("pool: out of memory");
            rc = -ENOMEM;
            goto fail;
        }
    }
    if (pin != POOL_PIN_NONE) {
        if (pthread_getaffinity_np(pthread_self(), sizeof p->caller_mask, &p->caller_mask) != 0 ||
            (rc = pin_thread(pthread_self(), cpu_of[0], 0)) != 0) {
            rc = rc ? rc : -EINVAL;
            goto fail;
        }
        p->caller_pinned = 1;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker *wk = &p->workers[i - 1];
        wk->pool = p;
        wk->index = i;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        if (pin != POOL_PIN_NONE) {
            /* start on its CPU rather than migrate there after the first job */
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpu_of[i], &set);
            pthread_attr_setaffinity_np(&attr, sizeof set, &set);
        }
        int e = pthread_create(&wk->thread, &attr, worker_main, wk);
        pthread_attr_destroy(&attr);
        if (e != 0) {
            LOG_ERR("pool: creating worker thread %d of %d failed: %s", i, n_threads - 1,
                    strerror(e));
            rc = -e;
            goto fail;
        }
        p->n_started++;
    }
    *out = p;
    return 0;

fail:
    pool_destroy(p);
    return rc;
}

void pool_destroy(struct pool *p)
{
    if (!p)
        return;
    CHECK(p->magic == POOL_MAGIC);
    if (p->n_started > 0) {
        atomic_store(&p->stop, 1);
        publish(p);
        for (int i = 0; i < p->n_started; i++)
            pthread_join(p->workers[i].thread, NULL);
    }
    if (p->caller_pinned)
        pthread_setaffinity_np(pthread_self(), sizeof p->caller_mask, &p->caller_mask);
    free(p->workers);
    p->magic = 0;
    free(p);
}
