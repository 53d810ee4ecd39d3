/*
 * amxs_bench.c — the q4_0 panel GEMM for a few tokens (session 18, task dec8):
 * the AVX-512 VNNI panel kernel (kern_gemm_q4_0p_q8_0_avx512) against the
 * AMX-INT8 one for 2..16 tokens (kern_gemm_q4_0p_q8_0_amxs, x86/amx_q4s.c, same
 * bits), on the same random weights and activations, THREADS threads splitting
 * the rows on panel boundaries as worker/model/matmul.c does. COPIES copies of
 * the weights are used in turn (one per call) so that they come from DRAM as in
 * decode when COPIES x ROWS x COLS x 18/32 bytes exceed the caches. Rounds
 * interleave the kernels (V A V A ...); each entry is the median over rounds of
 * the slowest thread's CPU time per call (thread CPU time: this machine is
 * shared), so the ratio comes from one run under one load. Prints one markdown
 * row: GFLOP/s of each, the ratio AMX / VNNI, and the count of outputs whose
 * bits differ (must be 0). usage: amxs_bench ROWS COLS N THREADS ROUNDS COPIES
 */
#include "bench_util.h"
#include "dtype.h"
#include "kern.h"
#include "kern_variants.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) { return bench_xorshift(&g_rng); }

struct job {
    kern_mm_fn *f;
    const void *w;
    const struct kern_act *a;
    float *y;
    size_t rows, r0, r1;
    pthread_barrier_t *start, *done;
    int iters;
    int copies;    /* weight copies used in turn */
    size_t pbytes; /* bytes of one copy */
    double cpu;    /* thread CPU seconds of the last batch */
    volatile int quit;
};

static void *worker(void *p)
{
    struct job *j = p;
    for (;;) {
        pthread_barrier_wait(j->start);
        if (j->quit)
            return NULL;
        double t0 = bench_thread_cpu();
        for (int i = 0; i < j->iters; i++)
            j->f((const uint8_t *)j->w + (size_t)(i % j->copies) * j->pbytes, j->a, j->y, j->rows,
                 j->r0, j->r1);
        j->cpu = bench_thread_cpu() - t0;
        pthread_barrier_wait(j->done);
    }
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: amxs_bench ROWS COLS N THREADS ROUNDS COPIES\n");
        return 2;
    }
    const size_t rows = strtoul(argv[1], NULL, 10), cols = strtoul(argv[2], NULL, 10),
                 n = strtoul(argv[3], NULL, 10);
    const int nth = atoi(argv[4]), rounds = atoi(argv[5]), copies = atoi(argv[6]);
    if (kern_init() != 0 || !kern_has_amx_bf16()) {
        fprintf(stderr, "amxs_bench: needs AMX\n");
        return 2;
    }
    const enum dtype dt = DT_Q4_0;
    const size_t bb = 18, nb = cols / 32, wbytes = rows * nb * bb;
    uint8_t *w = bench_xmalloc("amxs_bench", wbytes); /* [rows][cols/32] q4_0 blocks */
    for (size_t i = 0; i < wbytes; i++)
        w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < rows * nb; b++) {
        uint16_t d = (uint16_t)(0x2000 + (rnd() & 0x3ff));
        memcpy(w + b * bb, &d, 2);
    }
    const size_t pbytes = kern_panels_bytes(dt, rows, cols);
    uint8_t *wp = bench_xmalloc("amxs_bench", pbytes * (size_t)copies); /* [copies][panels] */
    for (int c = 0; c < copies; c++)
        kern_panels_pack(dt, w, cols, wp + (size_t)c * pbytes, rows, 0, (rows + 15) / 16);
    float *x = bench_xmalloc("amxs_bench", n * cols * sizeof *x); /* [n][cols] */
    for (size_t i = 0; i < n * cols; i++)
        x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    size_t abytes;
    if (kern_act_bytes(dt, cols, n, &abytes) != 0)
        return 2;
    struct kern_act a;
    kern_act_init(&a, dt, x, cols, n, bench_xmalloc("amxs_bench", abytes + 64));
    kern_act_prepare(&a, 0, n);
    kern_mm_fn *fs[2] = {kern_gemm_q4_0p_q8_0_avx512, kern_gemm_q4_0p_q8_0_amxs};
    float *ys[2]; /* [n][rows] */
    for (int k = 0; k < 2; k++)
        ys[k] = bench_xmalloc("amxs_bench", n * rows * sizeof(float));
    pthread_barrier_t start, done;
    pthread_barrier_init(&start, NULL, (unsigned)nth + 1);
    pthread_barrier_init(&done, NULL, (unsigned)nth + 1);
    struct job *jobs = calloc((size_t)nth, sizeof *jobs);
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    const size_t np = (rows + 15) / 16;
    for (int i = 0; i < nth; i++) {
        size_t p0 = np * (size_t)i / (size_t)nth, p1 = np * (size_t)(i + 1) / (size_t)nth;
        jobs[i] = (struct job){.w = wp,
                               .a = &a,
                               .rows = rows,
                               .r0 = p0 * 16,
                               .r1 = p1 * 16 < rows ? p1 * 16 : rows,
                               .start = &start,
                               .done = &done,
                               .copies = copies,
                               .pbytes = pbytes};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    /* calls per timed batch: ~30 ms of VNNI work at ~40 GFLOP/s per thread */
    const double ops = 2.0 * (double)rows * (double)cols * (double)n;
    int iters = (int)(0.03 / (ops / (40e9 * nth)));
    if (iters < 1)
        iters = 1;
    double *t[2];
    for (int k = 0; k < 2; k++)
        t[k] = calloc((size_t)rounds, sizeof(double));
    for (int r = -1; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < nth; i++) {
                jobs[i].f = fs[k];
                jobs[i].y = ys[k];
                jobs[i].iters = r < 0 ? 1 : iters;
            }
            pthread_barrier_wait(&start);
            pthread_barrier_wait(&done);
            /* the slowest thread's CPU time */
            double m = 0;
            for (int i = 0; i < nth; i++)
                m = jobs[i].cpu > m ? jobs[i].cpu : m;
            if (r >= 0)
                t[k][r] = m / iters;
        }
    for (int i = 0; i < nth; i++)
        jobs[i].quit = 1;
    pthread_barrier_wait(&start);
    for (int i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    size_t diff = 0;
    for (size_t i = 0; i < n * rows; i++)
        diff += memcmp(&ys[0][i], &ys[1][i], sizeof(float)) != 0;
    double med[2];
    for (int k = 0; k < 2; k++) {
        qsort(t[k], (size_t)rounds, sizeof(double), bench_cmp_double);
        med[k] = t[k][rounds / 2];
    }
    printf("| %zu x %zu | %zu | %d | %d | %.0f | %.0f | %.2f | %zu |\n", rows, cols, n, nth, copies,
           ops / med[0] / 1e9, ops / med[1] / 1e9, med[0] / med[1], diff);
    return 0;
}
