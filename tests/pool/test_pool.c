/*
 * test_pool.c — the thread pool: every task exactly once, contiguous sharding, many rapid
 * dispatches, ~0% CPU when idle, pinning, and the products over it (matmul_rows) against the
 * scalar reference.
 * Labelled `tsan` too: CI also runs it in a ThreadSanitizer build.
 */
#include "testutil.h"

#include "err.h"
#include "half.h"
#include "kern.h"
#include "matmul.h"
#include "pool.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static void test_create_errors(void **state)
{
    (void)state;
    struct pool *p = NULL;
    tu_log_capture_begin();
    assert_int_equal(pool_create(0, POOL_PIN_NONE, &p), ERR_RANGE);
    tu_assert_log_contains("0 threads requested", NULL);
    assert_int_equal(pool_create(POOL_MAX_THREADS + 1, POOL_PIN_NONE, &p), ERR_RANGE);
    assert_int_equal(pool_create(2, (enum pool_pin)9, &p), ERR_RANGE);
    tu_assert_log_contains("unknown pin mode 9", NULL);
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    int ncpu = CPU_COUNT(&set);
    if (ncpu < POOL_MAX_THREADS) {
        assert_int_equal(pool_create(ncpu + 1, POOL_PIN_COMPACT, &p), ERR_RANGE);
        tu_assert_log_contains("cannot pin", NULL);
    }
    tu_log_capture_end();
    assert_null(p);
    pool_destroy(NULL);
}

struct count_ctx {
    atomic_int *hits;
    int n_threads;
    atomic_int bad_thread;
};

static void count_task(void *arg, size_t task, int thread)
{
    struct count_ctx *c = arg;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads)
        atomic_store(&c->bad_thread, 1);
}

static void test_run_every_task_once(void **state)
{
    (void)state;
    static const int threads[] = {1, 2, 3, 5};
    static const size_t tasks[] = {0, 1, 2, 3, 7, 64, 1000};
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        struct pool *p;
        assert_int_equal(pool_create(threads[ti], POOL_PIN_NONE, &p), 0);
        assert_int_equal(pool_threads(p), threads[ti]);
        for (size_t k = 0; k < sizeof tasks / sizeof tasks[0]; k++) {
            atomic_int *hits = calloc(tasks[k] + 1, sizeof *hits);
            struct count_ctx c = {hits, threads[ti], 0};
            pool_run(p, count_task, &c, tasks[k]);
            for (size_t i = 0; i < tasks[k]; i++)
                assert_int_equal(atomic_load(&hits[i]), 1);
            assert_int_equal(atomic_load(&c.bad_thread), 0);
            free(hits);
        }
        pool_destroy(p);
    }
}

struct range_ctx {
    unsigned char *seen; /* plain bytes: each index is written by exactly one task */
    size_t begin, grain;
    atomic_int shards, misaligned;
};

static void range_task(void *arg, size_t b, size_t e, int thread)
{
    (void)thread;
    struct range_ctx *c = arg;
    if ((b - c->begin) % c->grain != 0 || e <= b)
        atomic_store(&c->misaligned, 1);
    for (size_t i = b; i < e; i++)
        c->seen[i]++;
    atomic_fetch_add(&c->shards, 1);
}

static void test_for_contiguous_shards(void **state)
{
    (void)state;
    struct pool *p;
    assert_int_equal(pool_create(3, POOL_PIN_NONE, &p), 0);
    static const size_t cases[][3] = {{0, 1, 1},      {5, 6, 16},   {3, 1000, 16},
                                      {16, 5648, 16}, {0, 2048, 1}, {7, 7, 4},
                                      {100, 131, 32}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t b = cases[k][0], e = cases[k][1], g = cases[k][2];
        unsigned char *seen = calloc(e + 1, 1);
        struct range_ctx c = {seen, b, g, 0, 0};
        pool_for(p, b, e, g, range_task, &c);
        for (size_t i = 0; i < e; i++)
            assert_int_equal(seen[i], i >= b ? 1 : 0);
        assert_int_equal(atomic_load(&c.misaligned), 0);
        assert_true(atomic_load(&c.shards) <= 4 * 3);
        free(seen);
    }
    pool_destroy(p);
}

struct sum_ctx {
    atomic_long sum;
};

static void sum_task(void *arg, size_t task, int thread)
{
    (void)thread;
    struct sum_ctx *c = arg;
    atomic_fetch_add_explicit(&c->sum, (long)task + 1, memory_order_relaxed);
}

static void test_rapid_dispatch(void **state)
{
    (void)state;
    struct pool *p;
    assert_int_equal(pool_create(2, POOL_PIN_NONE, &p), 0);
    struct sum_ctx c;
    atomic_init(&c.sum, 0);
    long want = 0;
    for (int i = 0; i < 10000; i++) {
        size_t n = (size_t)(i % 5) + 1;
        pool_run(p, sum_task, &c, n);
        want += (long)(n * (n + 1) / 2);
        /* each pool_run returns only after all its tasks: the running sum is exact */
        if (i % 997 == 0)
            assert_int_equal(atomic_load(&c.sum), want);
    }
    assert_int_equal(atomic_load(&c.sum), want);
    pool_destroy(p);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void test_idle_uses_no_cpu(void **state)
{
    (void)state;
    struct pool *p;
    assert_int_equal(pool_create(3, POOL_PIN_NONE, &p), 0);
    struct sum_ctx c;
    atomic_init(&c.sum, 0);
    pool_run(p, sum_task, &c, 8);
    /* let the workers finish spinning, then measure a quiet half second */
    struct timespec settle = {0, 50 * 1000 * 1000}, quiet = {0, 500 * 1000 * 1000};
    nanosleep(&settle, NULL);
    double t0 = cpu_seconds();
    nanosleep(&quiet, NULL);
    double used = cpu_seconds() - t0;
    /* 2 sleeping workers: ~0. Spinning would be ~1 s of CPU. Allow 2% of one core. */
    if (used > 0.01)
        fail_msg("idle pool used %.3f s of CPU over 0.5 s", used);
    /* and it still works after sleeping */
    pool_run(p, sum_task, &c, 8);
    assert_int_equal(atomic_load(&c.sum), 72);
    pool_destroy(p);
}

/* pool_wake: an empty job that only wakes sleeping workers, never in the way of the next real
 * one, of a second wake, or of destroy (TSan runs this test too) */
static void test_wake(void **state)
{
    (void)state;
    struct timespec settle = {0, 20 * 1000 * 1000};
    for (int threads = 1; threads <= 3; threads++) {
        struct pool *p;
        assert_int_equal(pool_create(threads, POOL_PIN_NONE, &p), 0);
        struct sum_ctx c;
        atomic_init(&c.sum, 0);
        pool_wake(p); /* workers still spinning from their start, or none: nothing to do */
        nanosleep(&settle, NULL);
        pool_wake(p); /* asleep by now: woken */
        pool_run(p, sum_task, &c, 8);
        assert_int_equal(atomic_load(&c.sum), 36);
        pool_wake(p);
        pool_wake(p); /* a wake right behind a wake: waits for the first one's empty job */
        pool_run(p, sum_task, &c, 8);
        assert_int_equal(atomic_load(&c.sum), 72);
        nanosleep(&settle, NULL);
        pool_wake(p);
        pool_destroy(p); /* with the empty job possibly still in flight */
    }
}

struct pin_ctx {
    int cpu[8];
    int single[8];
};

static void pin_task(void *arg, size_t task, int thread)
{
    (void)task;
    struct pin_ctx *c = arg;
    cpu_set_t set;
    pthread_getaffinity_np(pthread_self(), sizeof set, &set);
    c->single[thread] = CPU_COUNT(&set) == 1;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set)) {
            c->cpu[thread] = i;
            break;
        }
}

static void test_pinning(void **state)
{
    (void)state;
    cpu_set_t orig;
    assert_int_equal(sched_getaffinity(0, sizeof orig, &orig), 0);
    int cpus[CPU_SETSIZE], n = 0;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &orig))
            cpus[n++] = i;
    int nt = n < 2 ? n : 2;
    for (int mode = POOL_PIN_COMPACT; mode <= POOL_PIN_SCATTER; mode++) {
        struct pool *p;
        assert_int_equal(pool_create(nt, (enum pool_pin)mode, &p), 0);
        struct pin_ctx c;
        memset(&c, 0xff, sizeof c);
        /* the shared counter hands tasks to whoever comes first: run until every participant
         * has reported, each reporting its own slot */
        for (int tries = 0; tries < 1000; tries++) {
            pool_run(p, pin_task, &c, 64);
            int all = 1;
            for (int i = 0; i < nt; i++)
                all &= c.single[i] == 1;
            if (all)
                break;
        }
        for (int i = 0; i < nt; i++) {
            assert_int_equal(c.single[i], 1);
            int want = mode == POOL_PIN_COMPACT ? cpus[i] : cpus[(size_t)i * n / nt];
            assert_int_equal(c.cpu[i], want);
        }
        pool_destroy(p);
        cpu_set_t now; /* pool_destroy gave the test thread its affinity back */
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_true(CPU_EQUAL(&now, &orig));
    }
}

/* A random [rows][cols] matrix of dtype wt with finite weights; *rb = its row bytes. */
static uint8_t *random_weights(enum dtype wt, size_t rows, size_t cols, unsigned seed,
                               uint64_t *rb)
{
    assert_int_equal(dtype_row_bytes(wt, cols, rb), 0);
    uint8_t *w = malloc(rows * *rb);
    for (size_t i = 0; i < rows * *rb; i++)
        w[i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    /* keep every weight finite: f32 / bf16 exponents and block scales tamed */
    if (wt == DT_F32)
        for (size_t i = 0; i < rows * cols; i++) {
            float v = (float)((seed = seed * 1103515245u + 12345u) >> 16) / 65536.0f - 0.5f;
            memcpy(w + i * 4, &v, 4);
        }
    if (wt == DT_BF16)
        for (size_t i = 0; i < rows * cols; i++)
            w[i * 2 + 1] = (uint8_t)(0x3c + (w[i * 2 + 1] & 1)) | (w[i * 2 + 1] & 0x80);
    if (wt == DT_Q8_0 || wt == DT_Q4_0) {
        size_t bb = dtype_info(wt)->block_bytes;
        for (size_t b = 0; b < rows * cols / 32; b++) {
            uint16_t d = half_f32_to_f16(0.01f * (float)(b % 7 + 1));
            memcpy(w + b * bb, &d, 2);
        }
    }
    return w;
}

/* matmul_rows on a pool equals the scalar reference within the kernels' stated bounds (tests/kern). */
static void test_pool_matmul(void **state)
{
    (void)state;
    static const enum dtype types[] = {DT_F32, DT_BF16, DT_Q8_0, DT_Q4_0};
    static const size_t ns[] = {1, 3, 9};
    for (int th = 1; th <= 3; th++) {
        struct pool *p;
        assert_int_equal(pool_create(th, POOL_PIN_NONE, &p), 0);
        struct matmul_ctx mc;
        matmul_ctx_init(&mc, p);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                enum dtype wt = types[ti];
                size_t rows = 77, cols = 256, n = ns[ni], r0 = 5, r1 = 77;
                uint64_t rb;
                uint8_t *w = random_weights(wt, rows, cols, 12345u + (unsigned)ti, &rb);
                float *x = malloc(n * cols * sizeof(float));
                for (size_t i = 0; i < n * cols; i++)
                    x[i] = sinf((float)i * 0.37f);
                float *y = calloc(n * rows, sizeof(float)), *want = calloc(n * rows, sizeof(float));
                float *wf = malloc(cols * sizeof(float));
                kern_matmul_ref(wt, w, cols, x, n, want, rows, r0, r1);
                const struct matmul_mat mat = {wt, w, (uint32_t)rows, (uint32_t)cols, (size_t)rb,
                                               NULL};
                matmul_rows(&mc, &mat, x, n, y, rows, r0, r1);
                for (size_t t = 0; t < n; t++)
                    for (size_t r = 0; r < rows; r++) {
                        if (r < r0) {
                            assert_true(y[t * rows + r] == 0.0f);
                            continue;
                        }
                        kern_row_to_f32(wt, w + r * rb, wf, cols);
                        double s = 0;
                        for (size_t c = 0; c < cols; c++)
                            s += fabs((double)wf[c] * x[t * cols + c]);
                        /* int8 activations: quant.h's bound is ~s/160 on this data (|x|
                         * averages 2/pi of its block's max); bf16 ones: 2^-8 s */
                        double tol = s / 100.0 + 1e-6;
                        if (fabs((double)y[t * rows + r] - want[t * rows + r]) > tol)
                            fail_msg("matmul_rows(%s, n %zu, %d threads) row %zu: %g vs %g",
                                     dtype_info(wt)->name, n, th, r, y[t * rows + r],
                                     want[t * rows + r]);
                    }
                free(wf);
                free(want);
                free(y);
                free(x);
                free(w);
            }
        matmul_ctx_fini(&mc);
        pool_destroy(p);
    }
}

/*
 * matmul_group (the shape a MoE layer will use: products with their own inputs and token
 * counts, mixed dtypes, row counts off the 16-row grain, one with panels, one with no tokens)
 * gives the bits of one matmul_one per product, on the calling thread and on pools of 1-3.
 */
static void test_matmul_group(void **state)
{
    (void)state;
    enum { K = 5 };
    static const enum dtype wts[K] = {DT_F32, DT_Q8_0, DT_Q4_0, DT_Q4_0, DT_BF16};
    static const size_t rows[K] = {40, 77, 32, 50, 16}, cols[K] = {64, 256, 256, 256, 64};
    static const size_t ns[K] = {3, 5, 5, 5, 0}; /* products 1-3 share their input */
    struct matmul_mat mat[K];
    uint8_t *w[K];
    void *panels = NULL;
    float *x[K], *y[K], *want[K];
    for (size_t i = 0; i < K; i++) {
        uint64_t rb;
        w[i] = random_weights(wts[i], rows[i], cols[i], 777u + (unsigned)i, &rb);
        mat[i] = (struct matmul_mat){wts[i], w[i], (uint32_t)rows[i], (uint32_t)cols[i],
                                     (size_t)rb, NULL};
        x[i] = i == 2 || i == 3 ? x[1] : malloc((ns[i] ? ns[i] : 1) * cols[i] * sizeof(float));
        for (size_t t = 0; i != 2 && i != 3 && t < ns[i] * cols[i]; t++)
            x[i][t] = sinf((float)(t + 31 * i) * 0.37f);
        y[i] = malloc((ns[i] ? ns[i] : 1) * rows[i] * sizeof(float));
        want[i] = malloc((ns[i] ? ns[i] : 1) * rows[i] * sizeof(float));
    }
    if (kern_panels_supported(DT_Q4_0)) { /* product 3 reads panels */
        panels = aligned_alloc(64, (kern_panels_bytes(DT_Q4_0, rows[3], cols[3]) + 63) / 64 * 64);
        kern_panels_pack(DT_Q4_0, w[3], cols[3], panels, rows[3], 0, (rows[3] + 15) / 16);
        mat[3].panels = panels;
    }
    struct matmul_prod g[K];
    for (size_t i = 0; i < K; i++)
        g[i] = (struct matmul_prod){&mat[i], x[i], ns[i], y[i], rows[i], 0};
    struct matmul_ctx alone;
    matmul_ctx_init(&alone, NULL);
    for (size_t i = 0; i < K; i++)
        matmul_one(&alone, &mat[i], x[i], ns[i], want[i], rows[i]);
    for (int th = 0; th <= 3; th++) {
        struct pool *p = NULL;
        if (th)
            assert_int_equal(pool_create(th, POOL_PIN_NONE, &p), 0);
        struct matmul_ctx mc;
        matmul_ctx_init(&mc, p);
        for (size_t i = 0; i < K; i++)
            for (size_t j = 0; j < ns[i] * rows[i]; j++)
                y[i][j] = NAN; /* every value must be written */
        matmul_group(&mc, g, K);
        for (size_t i = 0; i < K; i++)
            for (size_t j = 0; j < ns[i] * rows[i]; j++)
                if (memcmp(&y[i][j], &want[i][j], sizeof(float)))
                    fail_msg("matmul_group, %d threads: product %zu y[%zu][%zu] = %.9g, want %.9g",
                             th, i, j / rows[i], j % rows[i], (double)y[i][j],
                             (double)want[i][j]);
        /* the same group with its inputs prepared by the caller, in two token ranges (the
         * inputs have 3 and 5 tokens: each range is clipped to its input's) */
        const struct matmul_prep *h = matmul_group_begin(&mc, g, K);
        if (!p) {
            assert_null(h); /* without a pool the kernels prepare their own inputs */
        } else {
            assert_non_null(h);
            for (size_t i = 0; i < K; i++)
                for (size_t j = 0; j < ns[i] * rows[i]; j++)
                    y[i][j] = NAN;
            matmul_prep_rows(h, 2, 5);
            matmul_prep_rows(h, 0, 2);
            matmul_group_end(&mc, g, K);
            for (size_t i = 0; i < K; i++)
                for (size_t j = 0; j < ns[i] * rows[i]; j++)
                    if (memcmp(&y[i][j], &want[i][j], sizeof(float)))
                        fail_msg("matmul_group_end, %d threads: product %zu y[%zu][%zu] = %.9g, "
                                 "want %.9g",
                                 th, i, j / rows[i], j % rows[i], (double)y[i][j],
                                 (double)want[i][j]);
            mc.invariant = true; /* invariant products take their inputs as floats */
            assert_null(matmul_group_begin(&mc, g, K));
            mc.invariant = false;
        }
        matmul_ctx_fini(&mc);
        pool_destroy(p);
    }
    matmul_ctx_fini(&alone);
    free(panels);
    for (size_t i = 0; i < K; i++) {
        if (i != 2 && i != 3)
            free(x[i]);
        free(w[i]);
        free(y[i]);
        free(want[i]);
    }
}

int main(void)
{
    assert_int_equal(kern_init(), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_errors),     cmocka_unit_test(test_run_every_task_once),
        cmocka_unit_test(test_for_contiguous_shards), cmocka_unit_test(test_rapid_dispatch),
        cmocka_unit_test(test_idle_uses_no_cpu),  cmocka_unit_test(test_pinning),
        cmocka_unit_test(test_pool_matmul),       cmocka_unit_test(test_wake),
        cmocka_unit_test(test_matmul_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
