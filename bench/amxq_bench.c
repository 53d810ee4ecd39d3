/*
 * amxq_bench.c — the q4_0 / q8_0 panel GEMMs side by side (session 17, task amxq): the
 * AVX-512 VNNI panel kernel (kern_gemm_<t>p_q8_0_avx512), the AMX-INT8 one (same bits,
 * x86/amx_q.c) and the AMX-BF16 dequantizing one (design (b), x86/amx_qbf16.c) twice: rounding
 * the activations to bf16 tiles in every call (B) and reading the tiles kern_act_prepare made
 * once per product (S: activations prepared with KERN_ACT_BF16_TILES, as worker/model/matmul.c
 * does; from the tile threshold, 128 tokens, else S = B), on the same random weights and
 * activations, THREADS threads splitting the rows on panel boundaries as
 * worker/model/matmul.c does. Rounds interleave the kernels (V I B S V I B S ...); each entry is
 * the median over rounds of the slowest thread's CPU time per call (thread CPU time: this
 * machine is shared), so the ratios come from one run under one load.
 * Prints one markdown row: GFLOP/s of each, the ratios to VNNI and S / I, plus the largest error of
 * the bf16 kernel relative to the VNNI output's scale (max |y_b - y_v| / max |y_v|) and the
 * count of AMX-INT8 outputs whose bits differ from VNNI's (must be 0).
 *   usage: amxq_bench q4|q8 ROWS COLS N THREADS ROUNDS
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
    double cpu; /* thread CPU seconds of the last batch */
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
            j->f(j->w, j->a, j->y, j->rows, j->r0, j->r1);
        j->cpu = bench_thread_cpu() - t0;
        pthread_barrier_wait(j->done);
    }
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: amxq_bench q4|q8 ROWS COLS N THREADS ROUNDS\n");
        return 2;
    }
    const int q8 = strcmp(argv[1], "q8") == 0;
    const size_t rows = strtoul(argv[2], NULL, 10), cols = strtoul(argv[3], NULL, 10),
                 n = strtoul(argv[4], NULL, 10);
    const int nth = atoi(argv[5]), rounds = atoi(argv[6]);
    if (kern_init() != 0 || !kern_has_amx_bf16()) {
        fprintf(stderr, "amxq_bench: needs AMX\n");
        return 2;
    }
    const enum dtype dt = q8 ? DT_Q8_0 : DT_Q4_0;
    const size_t bb = q8 ? 34 : 18, nb = cols / 32, wbytes = rows * nb * bb;
    uint8_t *w = bench_xmalloc("amxq_bench", wbytes);
    for (size_t i = 0; i < wbytes; i++)
        w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < rows * nb; b++) {
        uint16_t d = (uint16_t)(0x2000 + (rnd() & 0x3ff));
        memcpy(w + b * bb, &d, 2);
    }
    void *wp = bench_xmalloc("amxq_bench", kern_panels_bytes(dt, rows, cols));
    kern_panels_pack(dt, w, cols, wp, rows, 0, (rows + 15) / 16);
    float *x = bench_xmalloc("amxq_bench", n * cols * sizeof *x);
    for (size_t i = 0; i < n * cols; i++)
        x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    size_t abytes;
    if (kern_act_bytes(dt, cols, n, &abytes) != 0)
        return 2;
    struct kern_act a;
    kern_act_init(&a, dt, x, cols, n, bench_xmalloc("amxq_bench", abytes + 64));
    kern_act_prepare(&a, 0, n);
    size_t tbytes;
    if (kern_act_bytes_ex(dt, cols, n, KERN_ACT_BF16_TILES, &tbytes) != 0)
        return 2;
    struct kern_act at; /* with the bf16 tiles (xt) from the threshold on */
    kern_act_init_ex(&at, dt, x, cols, n, KERN_ACT_BF16_TILES, bench_xmalloc("amxq_bench", tbytes + 64));
    kern_act_prepare(&at, 0, n);
    enum { NK = 4 };
    kern_mm_fn *fs[NK] = {q8 ? kern_gemm_q8_0p_q8_0_avx512 : kern_gemm_q4_0p_q8_0_avx512,
                          q8 ? kern_gemm_q8_0p_q8_0_amx : kern_gemm_q4_0p_q8_0_amx,
                          q8 ? kern_gemm_q8_0p_bf16_amx : kern_gemm_q4_0p_bf16_amx,
                          q8 ? kern_gemm_q8_0p_bf16_amx : kern_gemm_q4_0p_bf16_amx};
    const struct kern_act *as[NK] = {&a, &a, &a, &at};
    float *ys[NK];
    for (int k = 0; k < NK; k++)
        ys[k] = bench_xmalloc("amxq_bench", n * rows * sizeof(float));
    pthread_barrier_t start, done;
    pthread_barrier_init(&start, NULL, (unsigned)nth + 1);
    pthread_barrier_init(&done, NULL, (unsigned)nth + 1);
    struct job *jobs = calloc((size_t)nth, sizeof *jobs);
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    const size_t np = (rows + 15) / 16;
    for (int i = 0; i < nth; i++) {
        size_t p0 = np * (size_t)i / (size_t)nth, p1 = np * (size_t)(i + 1) / (size_t)nth;
        jobs[i] = (struct job){.w = wp, .a = &a, .rows = rows, .r0 = p0 * 16,
                               .r1 = p1 * 16 < rows ? p1 * 16 : rows, .start = &start,
                               .done = &done};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    /* iterations per timed call batch: ~30 ms of VNNI work at ~100 GFLOP/s per thread */
    const double ops = 2.0 * (double)rows * (double)cols * (double)n;
    int iters = (int)(0.03 / (ops / (100e9 * nth)));
    if (iters < 1)
        iters = 1;
    double *t[NK];
    for (int k = 0; k < NK; k++)
        t[k] = calloc((size_t)rounds, sizeof(double));
    for (int r = -1; r < rounds; r++)
        for (int k = 0; k < NK; k++) {
            for (int i = 0; i < nth; i++) {
                jobs[i].f = fs[k];
                jobs[i].a = as[k];
                jobs[i].y = ys[k];
                jobs[i].iters = r < 0 ? 1 : iters;
            }
            pthread_barrier_wait(&start);
            pthread_barrier_wait(&done);
            /* the slowest thread's CPU time: the wall time on an idle machine, without the
             * time the scheduler gives other processes on this shared one */
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
    double maxv = 0, maxe = 0;
    for (size_t i = 0; i < n * rows; i++) {
        diff += memcmp(&ys[0][i], &ys[1][i], sizeof(float)) != 0;
        /* S reads the same rounded operands as B, in the same order: the same bits */
        diff += memcmp(&ys[2][i], &ys[3][i], sizeof(float)) != 0;
        maxv = fmax(maxv, fabs(ys[0][i]));
        maxe = fmax(maxe, fabs((double)ys[2][i] - ys[0][i]));
    }
    double med[NK];
    for (int k = 0; k < NK; k++) {
        qsort(t[k], (size_t)rounds, sizeof(double), bench_cmp_double);
        med[k] = t[k][rounds / 2];
    }
    /* | type | rows x cols | n | threads | GFLOP/s V I B S | I/V B/V S/V | S/I | bits | b err | */
    printf("| %s | %zu x %zu | %zu | %d | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f "
           "| %zu | %.1e |\n",
           argv[1], rows, cols, n, nth, ops / med[0] / 1e9, ops / med[1] / 1e9,
           ops / med[2] / 1e9, ops / med[3] / 1e9, med[0] / med[1], med[0] / med[2],
           med[0] / med[3], med[1] / med[3], diff, maxe / maxv);
    return 0;
}
