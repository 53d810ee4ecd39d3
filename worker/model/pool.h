/*
 * pool.h — a persistent thread pool for data-parallel kernels (matmul rows, attention heads).
 * The products over it are matmul.h's.
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
/* "none", "compact" or "scatter" (a --pin / threads_pin value) into *out; ERR_RANGE for
 * anything else (not logged: the caller names its option). */
int pool_pin_parse(const char *s, enum pool_pin *out);
/* The CPUs of the calling thread's affinity mask: what pinning spreads participants over
 * (a pin with more threads than this is refused by pool_create); a negative code (logged). */
int pool_affinity_count(void);
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
 * may be shorter); at most 4 shards per participant so each shard is long. From 32 grains per
 * participant on, the shards shrink towards the end of the range (pool.c: 4 rounds taking
 * 44/32/18/6% of it), so the participants finish close together.
 */
void pool_for(struct pool *p, size_t begin, size_t end, size_t grain, pool_range_fn *fn,
              void *ctx);

#endif
