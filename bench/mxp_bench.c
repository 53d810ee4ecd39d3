/*
 * mxp_bench — gpt-oss's expert products on mxfp4 panels against the stored rows (issue 13,
 * session 16; kernels/include/quant.h "mxfp4 panels", x86/avx512_mxfp4.c).
 *
 * The stored MXFP4 rows (17-byte blocks: E8M0 byte, 16 bytes of split-half nibbles) make the
 * AVX-512 gemv rearrange every 16-block group (5 loads, 6 vpermt2b, a 4x4 dword transpose),
 * pack each block sum with its exponent, and transpose the packed sums of 16 rows x 16 blocks
 * back to lane = row for the fold: ~23 cycles per 272-byte group from L2, about one core's
 * share of the DRAM rate, so the decode's expert jobs read ~35 GB/s where the probe reads
 * 70-86 (docs/PERFORMANCE.md, session 15). The panels (repacked at load) have the vpdpbusd
 * lanes = rows from the start. This bench checks that the panel GEMM gives the stored gemv's
 * bits (n = 1..4, every product of a job) and times both:
 *
 *   usage: mxp_bench [ring MiB (default 768)] [rounds (default 5)]
 * Per round, interleaved: the read probe (bench_bandwidth, 2 threads), then the stored-row
 * product (kern_matmul_act) and the panel GEMM (kern_matmul_act_panels), each best of 2, on
 * jobs of 8 products of 2880 x 2880 (one decode gate+up job: 4 experts, gate and up) picked at
 * random from a ring larger than L3 (so from DRAM), at n = 1, 2, 4 tokens, with 2 threads and
 * 1 (pool_run: the 8 products claimed by the threads as the engine's job does), GB/s of
 * weights; and the same on one product again and again ("hot": L2/L3). Then the repack's rate
 * (kern_panels_pack, 1 thread). Bench-only; the engine's loader repacks the experts itself.
 *
 *   mxp_bench [ring MiB] [rounds] streams [n list, default 1]   (sessions 17, 18)
 * instead compares one and two DRAM streams per thread (kern_set_panel_streams) on one thread,
 * at each token count of the list (e.g. 1,2,3,4,8: mxfp4 panels up to 4 tokens, where two
 * streams apply; q8_0 panels at every n, two streams only at n = 1), one random 2880 x 2880
 * product at a time from a ring of each, in the order 1 2 2 1 per round, then the first
 * HOT_ROWS rows of one product again and again ("hot", from L2: the compute rate), GB of weights per second of the
 * thread's CPU time (robust to neighbours taking the CPU: a loaded 2-vCPU machine) and per
 * wall second.
 */
#include "bench_util.h"
#include "kern.h"
#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ROWS 2880
#define COLS 2880
#define NB (COLS / 32)       /* blocks per row */
#define RB (NB * 17)         /* stored row bytes */
#define MAT (ROWS * RB)      /* bytes of one product, either layout */
#define JOB 8                /* products per job */
#define HOT_ROWS 256         /* the streams mode's "hot" cell: 0.39 MB mxfp4, 0.74 MB q8_0 (L2) */

/* ---- jobs ------------------------------------------------------------------------------------ */

struct job {
    uint8_t *stored, *inter; /* the two rings, same products: stored rows, panels */
    size_t pick[JOB];        /* products of this job */
    int variant;             /* 0 stored rows, 1 panels */
    const struct kern_act *a;
    float *y;                /* [n][JOB * ROWS] */
};

static void job_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    struct job *j = ctx;
    size_t m = j->pick[task];
    float *y = j->y + task * ROWS;
    if (j->variant == 0)
        kern_matmul_act(j->stored + m * (size_t)MAT, j->a, y, JOB * ROWS, 0, ROWS);
    else
        kern_matmul_act_panels(DT_MXFP4, j->inter + m * (size_t)MAT, j->a, y, JOB * ROWS, 0,
                               ROWS);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* GB/s of weights over `calls` jobs (ring: random products; hot: product 0 only) */
static double run(struct pool *p, struct job *j, size_t nmat, int hot, double min_s)
{
    double t0 = bench_now(), t;
    size_t calls = 0;
    do {
        for (int i = 0; i < JOB; i++)
            j->pick[i] = hot ? 0 : next() % nmat;
        pool_run(p, job_task, j, JOB);
        calls++;
        t = bench_now() - t0;
    } while (t < min_s);
    return (double)calls * JOB * MAT / t / 1e9;
}

static void *huge_alloc(size_t bytes)
{
    const size_t hp = (size_t)2 << 20;
    bytes = (bytes + hp - 1) / hp * hp;
    void *m = aligned_alloc(hp, bytes);
    if (m)
        (void)madvise(m, bytes, MADV_HUGEPAGE);
    return m;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 768;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    size_t nmat = (mib << 20) / MAT;
    if (nmat < JOB)
        nmat = JOB;
    uint8_t *st = huge_alloc(nmat * MAT), *in = huge_alloc(nmat * MAT);
    if (kern_init() != 0 || !kern_isa_supported(KERN_ISA_AVX512) || !st || !in)
        return 1;
    for (size_t m = 0; m < nmat; m++) {
        uint8_t *s = st + m * MAT;
        for (size_t i = 0; i < MAT; i++)
            s[i] = (uint8_t)next();
        for (size_t i = 0; i < (size_t)ROWS * NB; i++) /* exponents 2^-8 .. 2^4 around 1 */
            s[i * 17] = (uint8_t)(119 + next() % 13);
        kern_panels_pack(DT_MXFP4, s, COLS, in + m * MAT, ROWS, 0, ROWS / 16);
    }
    float *x = malloc(4 * COLS * sizeof(float));
    for (size_t i = 0; i < 4 * COLS; i++)
        x[i] = (float)((double)(next() % 20001) / 10000.0 - 1.0);
    size_t ab;
    kern_act_bytes(DT_MXFP4, COLS, 4, &ab);
    void *abuf = aligned_alloc(64, (ab + 63) / 64 * 64);
    float *y0 = malloc(4 * JOB * ROWS * sizeof(float)), *y1 = malloc(4 * JOB * ROWS * sizeof(float));

    /* bits: every n, every product of a job */
    for (size_t n = 1; n <= 4; n++) {
        struct kern_act a;
        kern_act_init(&a, DT_MXFP4, x, COLS, n, abuf);
        kern_act_prepare(&a, 0, n);
        struct job j = {st, in, {0}, 0, &a, y0};
        for (int i = 0; i < JOB; i++)
            j.pick[i] = next() % nmat;
        for (size_t i = 0; i < JOB; i++)
            job_task(&j, i, 0);
        j.variant = 1;
        j.y = y1;
        for (size_t i = 0; i < JOB; i++)
            job_task(&j, i, 0);
        for (size_t i = 0; i < n * JOB * ROWS; i++)
            if (y0[i] != y1[i]) {
                fprintf(stderr, "first diff at %zu: %.9g vs %.9g\n", i, y0[i], y1[i]);

                break;
            }
        if (memcmp(y0, y1, n * JOB * ROWS * sizeof(float)) != 0) {
            fprintf(stderr, "mxp_bench: n = %zu: the panels' bits differ\n", n);
            return 1;
        }
    }
    printf("bits: panels == stored rows for n = 1..4 (%d products each)\n", JOB);
    if (argc > 3 && strcmp(argv[3], "streams") == 0) { /* see the head of this file */
        const size_t QRB = (size_t)NB * 34, QMAT = (size_t)ROWS * QRB, nq = nmat * MAT / QMAT;
        uint8_t *qs = huge_alloc(QMAT), *qp = huge_alloc(nq * QMAT);
        for (size_t i = 0; i < QMAT; i++)
            qs[i] = (uint8_t)next();
        for (size_t i = 0; i < (size_t)ROWS * NB; i++) { qs[i * 34] = 0x00; qs[i * 34 + 1] = 0x20; }
        for (size_t m = 0; m < nq; m++)
            kern_panels_pack(DT_Q8_0, qs, COLS, qp + m * QMAT, ROWS, 0, ROWS / 16);
        /* token counts: argv[4], e.g. "1,2,3,4" (default 1); mxfp4 up to 4, q8_0 up to 8 */
        size_t tok[8], ntok = 0;
        for (const char *c = argc > 4 ? argv[4] : "1"; *c && ntok < 8;) {
            long v = strtol(c, (char **)&c, 10);
            if (v >= 1 && v <= 8)
                tok[ntok++] = (size_t)v;
            while (*c == ',')
                c++;
        }
        float *x8 = malloc(8 * COLS * sizeof(float)), *yb = malloc(8 * ROWS * sizeof(float));
        for (size_t i = 0; i < 8 * COLS; i++)
            x8[i] = (float)((double)(next() % 20001) / 10000.0 - 1.0);
        size_t mab, qab;
        kern_act_bytes(DT_MXFP4, COLS, 8, &mab);
        kern_act_bytes(DT_Q8_0, COLS, 8, &qab);
        void *mabuf = aligned_alloc(64, (mab + 63) / 64 * 64),
             *qabuf = aligned_alloc(64, (qab + 63) / 64 * 64);
        static const int seq[] = {0, 1, 1, 0};
        printf("| round | panels | n | streams per thread | GB per CPU-s | GB per wall-s |\n"
               "|---|---|---|---|---|---|\n");
        for (int r = 0; r < rounds; r++)
            for (size_t ti = 0; ti < ntok; ti++)
                for (int ty = 0; ty < 2; ty++) {
                    const size_t n = tok[ti];
                    if (ty == 0 && n > 4)
                        continue;
                    struct kern_act a;
                    kern_act_init(&a, ty ? DT_Q8_0 : DT_MXFP4, x8, COLS, n, ty ? qabuf : mabuf);
                    kern_act_prepare(&a, 0, n);
                    /* 1 2 2 1 streams from DRAM, then one "hot" cell: product 0 again and
                     * again (L2/L3), the compute rate */
                    for (int k = 0; k < 5; k++) {
                        kern_set_panel_streams(k == 4 || seq[k] ? 2 : 1);
                        struct timespec c0, c1;
                        double w0 = bench_now();
                        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
                        size_t done = 0;
                        const size_t rows = k == 4 ? HOT_ROWS : ROWS;
                        while (bench_now() - w0 < 0.5) {
                            size_t m = k == 4 ? 0 : next();
                            if (ty == 0)
                                kern_matmul_act_panels(DT_MXFP4, in + m % nmat * MAT, &a, yb,
                                                       ROWS, 0, rows);
                            else
                                kern_matmul_act_panels(DT_Q8_0, qp + m % nq * QMAT, &a, yb,
                                                       ROWS, 0, rows);
                            done++;
                        }
                        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
                        double w = bench_now() - w0,
                               c = (double)(c1.tv_sec - c0.tv_sec) +
                                   1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
                        double gb = (double)done * (ty ? QMAT : MAT) / ROWS * rows / 1e9;
                        printf("| %d | %s | %zu | %s | %.2f | %.2f |\n", r, ty ? "q8_0" : "mxfp4",
                               n, k == 4 ? "2, hot" : seq[k] ? "2" : "1", gb / c, gb / w);
                        fflush(stdout);
                    }
                }
        return 0;
    }
    printf("ring %zu products of %d x %d (%.0f MiB per layout), jobs of %d products\n\n", nmat,
           ROWS, COLS, (double)nmat * MAT / 1048576.0, JOB);

    struct pool *p2, *p1;
    if (pool_create(2, POOL_PIN_COMPACT, &p2) != 0 || pool_create(1, POOL_PIN_NONE, &p1) != 0)
        return 1;
    static const size_t ns[] = {1, 2, 4};
    printf("| round | probe 2T | n | DRAM 2T stored / panels | DRAM 1T stored / panels | hot 1T "
           "stored / panels | other CPU |\n|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < rounds; r++)
        for (size_t ni = 0; ni < 3; ni++) {
            size_t n = ns[ni];
            double probe = bench_bandwidth(p2, (size_t)512 << 20, 2);
            struct bench_load ld;
            bench_load_begin(&ld);
            struct kern_act a;
            kern_act_init(&a, DT_MXFP4, x, COLS, n, abuf);
            kern_act_prepare(&a, 0, n);
            struct job j = {st, in, {0}, 0, &a, y0};
            double g[3][2];
            for (int v = 0; v < 2; v++) { /* stored, panels, then again: best of 2 */
                j.variant = v;
                g[0][v] = run(p2, &j, nmat, 0, 0.25);
                g[1][v] = run(p1, &j, nmat, 0, 0.25);
                g[2][v] = run(p1, &j, nmat, 1, 0.1);
            }
            for (int v = 0; v < 2; v++) {
                j.variant = v;
                double t;
                if ((t = run(p2, &j, nmat, 0, 0.25)) > g[0][v]) g[0][v] = t;
                if ((t = run(p1, &j, nmat, 0, 0.25)) > g[1][v]) g[1][v] = t;
                if ((t = run(p1, &j, nmat, 1, 0.1)) > g[2][v]) g[2][v] = t;
            }
            printf("| %d | %.1f | %zu | %.1f / %.1f (%.2fx) | %.1f / %.1f (%.2fx) | %.1f / %.1f "
                   "(%.2fx) | %.0f%% |\n",
                   r, probe, n, g[0][0], g[0][1], g[0][1] / g[0][0], g[1][0], g[1][1],
                   g[1][1] / g[1][0], g[2][0], g[2][1], g[2][1] / g[2][0],
                   100 * bench_load_end(&ld));
            fflush(stdout);
        }
    {
        double t = bench_now();
        size_t done = 0;
        for (size_t m = 0; m < nmat && bench_now() - t < 2.0; m++, done++)
            kern_panels_pack(DT_MXFP4, st + m * MAT, COLS, in + m * MAT, ROWS, 0, ROWS / 16);
        t = bench_now() - t;
        printf("\nrepack (kern_panels_pack, 1 thread, from DRAM): %.2f GB/s\n",
               (double)done * MAT / t / 1e9);
    }
    pool_destroy(p2);
    pool_destroy(p1);
    return 0;
}
