/*
 * pool.h — a persistent thread pool for data-parallel kernels (matmul rows, attention heads).
 *
 * n_threads participants: the calling thread plus n_threads-1 pthreads created once. A job
 * (pool_run/pool_for) is published by bumping a generation counter; workers spin briefly on
 * it (jobs of a forward pass come back to back), then sleep on a futex, so an idle pool costs
 * no CPU. Tasks are claimed from a shared counter, so a participant slowed down (another
 * process on its core) simply takes fewer of them. The caller runs tasks too and returns when
 * all of them are done.
 *
 * NOTES: one pool serves one dispatching thread at a time (the engine's thread); pool_run is
 * not reentrant (a task must not call pool_run on the same pool). Effects of tasks are visible
 * to the caller when pool_run returns (release/acquire on the completion counter). Pinning
 * (compact/scatter) also pins the creating thread, which is participant 0, until
 * pool_destroy (called from that same thread) restores its previous affinity.
 */
#ifndef CLOCHER_WORKER_POOL_H
#define CLOCHER_WORKER_POOL_H

#include "dtype.h"

#include <stddef.h>

enum pool_pin {
    POOL_PIN_NONE = 0,    /* leave placement to the scheduler */
    POOL_PIN_COMPACT = 1, /* participant i on the i-th CPU of the affinity mask */
    POOL_PIN_SCATTER = 2, /* participants spread evenly over the CPUs of the affinity mask */
};

struct pool;

/* Task i of n_tasks, run by participant `thread` (0 = the caller). */
typedef void pool_task_fn(void *ctx, size_t task, int thread);
/* Contiguous range [begin, end) of a pool_for. */
typedef void pool_range_fn(void *ctx, size_t begin, size_t end, int thread);

/*
 * n_threads in 1..POOL_MAX_THREADS (1 = the caller alone, no pthreads). Pinning to more
 * participants than CPUs in the affinity mask, or a failed pthread_setaffinity_np, is
 * ERR_RANGE / -errno with a message. -ENOMEM, -EAGAIN (pthread_create) likewise.
 */
#define POOL_MAX_THREADS 256
int pool_create(int n_threads, enum pool_pin pin, struct pool **out);
void pool_destroy(struct pool *p);
int pool_threads(const struct pool *p);

/*
 * Wakes sleeping workers without waiting for them, so that they spin (up to 200 µs) ready for
 * the next job: an idle engine calls it when work arrives, and the workers' wake-up (tens of
 * µs to milliseconds on a virtual machine whose idle vCPUs are halted) overlaps with what the
 * caller does before its first pool_run. Nothing happens if no worker sleeps.
 */
void pool_wake(struct pool *p);

/* Runs fn(ctx, i, thread) for every i < n_tasks across the participants; returns when done. */
void pool_run(struct pool *p, pool_task_fn *fn, void *ctx, size_t n_tasks);

/*
 * Parallel for over [begin, end) in contiguous shards of whole multiples of `grain` (the last
 * may be shorter); at most about 4 shards per participant so each shard is long.
 */
void pool_for(struct pool *p, size_t begin, size_t end, size_t grain, pool_range_fn *fn,
              void *ctx);

/*
 * kern_matmul sharded over the pool: y rows [r0, r1) for n tokens (kern.h has the contract).
 * Activations are prepared once (tokens in parallel) into a buffer the pool keeps; row shards
 * are multiples of 16 rows (one AVX-512 panel). Falls back to per-shard kern_matmul if the
 * buffer cannot grow.
 */
void pool_matmul(struct pool *p, enum dtype wt, const void *w, size_t cols, const float *x,
                 size_t n, float *y, size_t ldy, size_t r0, size_t r1);
/* The same for a q4_0 or q8_0 matrix (wt) repacked in panels (kern_matmul_act_panels);
 * r0 % 16 == 0. */
void pool_matmul_panels(struct pool *p, enum dtype wt, const void *wp, size_t cols,
                        const float *x, size_t n, float *y, size_t ldy, size_t r0, size_t r1);

/* One product of pool_matmul_group: all rows of w [rows][cols] into y [n][ldy]; w is wt's
 * panels (kern_matmul_act_panels) when `panels` is set, stored rows otherwise. */
struct pool_mm {
    enum dtype wt;
    int panels;
    const void *w;
    size_t rows;
    float *y;
    size_t ldy;
};
#define POOL_MM_GROUP_MAX 4
/*
 * k <= POOL_MM_GROUP_MAX products of the same activations x [n][cols] (a layer's q, k, v or
 * gate, up) as one job: the activations are prepared once and one pool_for shards the
 * concatenated rows, instead of one preparation and two dispatches per product. The same
 * kernels on the same rows, so the same results as k pool_matmul calls. Falls back to those
 * calls when the products differ in weight type or a product other than the last has rows not
 * a multiple of 16.
 */
void pool_matmul_group(struct pool *p, const struct pool_mm *mm, size_t k, const float *x,
                       size_t cols, size_t n);

#endif
