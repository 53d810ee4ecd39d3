/*
 * kern_bench_ab.c — the A/B driver of bench/kern_bench_ab.sh: two builds of the same AVX-512
 * product (ab_a_*, ab_b_*: kernels/x86/avx512_q.c at two revisions, symbols renamed by the
 * script) on the same random weights and activations, one thread. Both outputs are compared
 * bit for bit (a kernel change that keeps the arithmetic must print 0), then the two are timed
 * alternately, ROUNDS times each, and each keeps its best: thread CPU time, so time the
 * scheduler gives other processes on this shared machine is not counted. One markdown row.
 *   usage: kern_bench_ab KIND ROWS COLS N ROUNDS    (KIND: q4p, q8p, q4rows, mxv, q4vq8)
 * q4vq8 answers bytes against ops: A = REV_A's q4_0 panel product on random q4_0 weights, B =
 * REV_B's q8_0 panel product on the same weights stored as q8_0 (each nibble - 8 an int8, the
 * same scale): twice the bytes, no nibble unpack. The integer sums are equal, so the outputs
 * are too (0 differing bits expected).
 * Weights stay in cache for small shapes (the kernels' own speed, not DRAM's) unless
 * KERN_AB_RING_MIB=M is set: then copies of the weights filling >= M MiB are cycled through,
 * so each call streams its weights from DRAM, as decode does.
 */
#include "dtype.h"
#include "kern.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void ab_fn(const void *w, const struct kern_act *a, float *y, size_t ldy, size_t r0,
                   size_t r1);
ab_fn ab_a_q4p, ab_b_q4p, ab_a_q8p, ab_b_q8p, ab_a_q4rows, ab_b_q4rows, ab_a_mxv, ab_b_mxv;

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

/* Seconds per call, over >= 0.15 s of thread CPU time, cycling through the ncopies weights. */
static double time_calls(ab_fn *f, const void *const *w, size_t ncopies,
                         const struct kern_act *a, float *y, size_t rows)
{
    double t0 = cpu_now(), t;
    size_t k = 0;
    do {
        f(w[k % ncopies], a, y, rows, 0, rows);
        k++;
        t = cpu_now() - t0;
    } while (t < 0.15);
    return t / (double)k;
}

static void *xmalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "kern_bench_ab: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: kern_bench_ab q4p|q8p|q4rows|mxv ROWS COLS N ROUNDS\n");
        return 2;
    }
    const char *kind = argv[1];
    const size_t rows = strtoul(argv[2], NULL, 10), cols = strtoul(argv[3], NULL, 10),
                 n = strtoul(argv[4], NULL, 10);
    const int rounds = atoi(argv[5]);
    const int mx = strcmp(kind, "mxv") == 0, q8 = strcmp(kind, "q8p") == 0,
              q4v8 = strcmp(kind, "q4vq8") == 0,
              panels = q8 || q4v8 || strcmp(kind, "q4p") == 0;
    if ((!mx && !panels && strcmp(kind, "q4rows") != 0) || rows == 0 || n == 0 ||
        cols == 0 || cols % 32 || rounds < 1) {
        fprintf(stderr, "kern_bench_ab: expected q4p|q8p|q4rows|mxv|q4vq8, rows, n, rounds > 0 "
                        "and cols a multiple of 32\n");
        return 2;
    }
    if (kern_init() != 0 || kern_isa() != KERN_ISA_AVX512) {
        fprintf(stderr, "kern_bench_ab: needs AVX-512 (VNNI)\n");
        return 2;
    }
    const enum dtype dt = mx ? DT_MXFP4 : q8 ? DT_Q8_0 : DT_Q4_0;
    /* random blocks: q4_0 / q8_0 an f16 scale in [2^-15, 2^-14), mxfp4 an exponent near 2^-5 */
    const size_t bb = mx ? 17 : q8 ? 34 : 18, nb = cols / 32, wbytes = rows * nb * bb;
    uint8_t *w = xmalloc(wbytes);
    for (size_t i = 0; i < wbytes; i++)
        w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < rows * nb; b++) {
        if (mx) {
            w[b * bb] = (uint8_t)(120 + rnd() % 8);
        } else {
            uint16_t d = (uint16_t)(0x2000 + (rnd() & 0x3ff));
            memcpy(w + b * bb, &d, 2);
        }
    }
    /* q4vq8's B side: w as q8_0 blocks [rows][nb][34] (q4_0 byte i: element i low nibble,
     * element i + 16 high nibble) */
    uint8_t *w8 = NULL;
    if (q4v8) {
        w8 = xmalloc(rows * nb * 34);
        for (size_t b = 0; b < rows * nb; b++) {
            const uint8_t *s4 = w + b * 18;
            uint8_t *s8 = w8 + b * 34;
            memcpy(s8, s4, 2);
            for (int i = 0; i < 16; i++) {
                s8[2 + i] = (uint8_t)(int8_t)((s4[2 + i] & 15) - 8);
                s8[18 + i] = (uint8_t)(int8_t)((s4[2 + i] >> 4) - 8);
            }
        }
    }
    const char *ring = getenv("KERN_AB_RING_MIB");
    const void **wk[2];
    size_t ncopies[2];
    for (int side = 0; side < 2; side++) {
        const int as8 = q4v8 && side == 1;
        const enum dtype dts = as8 ? DT_Q8_0 : dt;
        const size_t wb = as8 ? rows * nb * 34 : wbytes;
        const size_t kbytes = panels ? kern_panels_bytes(dts, rows, cols) : wb;
        ncopies[side] = ring ? (strtoul(ring, NULL, 10) << 20) / kbytes + 1 : 1;
        wk[side] = xmalloc(ncopies[side] * sizeof *wk[side]);
        for (size_t c = 0; c < ncopies[side]; c++) {
            void *wc = xmalloc(kbytes);
            if (panels)
                kern_panels_pack(dts, as8 ? w8 : w, cols, wc, rows, 0, (rows + 15) / 16);
            else
                memcpy(wc, w, wb);
            wk[side][c] = wc;
        }
    }
    float *x = xmalloc(n * cols * sizeof *x), *ya = xmalloc(n * rows * sizeof *ya),
          *yb = xmalloc(n * rows * sizeof *yb);
    for (size_t i = 0; i < n * cols; i++)
        x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    struct kern_act act[2];
    for (int side = 0; side < 2; side++) {
        const enum dtype dts = q4v8 && side == 1 ? DT_Q8_0 : dt;
        size_t abytes;
        if (kern_act_bytes(dts, cols, n, &abytes) != 0) {
            fprintf(stderr, "kern_bench_ab: activation size overflows\n");
            return 2;
        }
        kern_act_init(&act[side], dts, x, cols, n, xmalloc(abytes + 64));
        kern_act_prepare(&act[side], 0, n);
    }
    ab_fn *fa = mx ? ab_a_mxv : q8 ? ab_a_q8p : panels ? ab_a_q4p : ab_a_q4rows;
    ab_fn *fb = mx ? ab_b_mxv : q8 || q4v8 ? ab_b_q8p : panels ? ab_b_q4p : ab_b_q4rows;
    fa(wk[0][0], &act[0], ya, rows, 0, rows);
    fb(wk[1][0], &act[1], yb, rows, 0, rows);
    size_t diff = 0;
    for (size_t i = 0; i < n * rows; i++)
        diff += memcmp(&ya[i], &yb[i], sizeof ya[i]) != 0;
    double ta = 1e30, tb = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t = time_calls(fa, wk[0], ncopies[0], &act[0], ya, rows);
        ta = t < ta ? t : ta;
        t = time_calls(fb, wk[1], ncopies[1], &act[1], yb, rows);
        tb = t < tb ? t : tb;
    }
    const double ops = 2.0 * (double)rows * (double)cols * (double)n;
    printf("| %s | %zu x %zu | %zu | %.1f | %.1f | %.3f | %zu |\n", kind, rows, cols, n,
           ops / ta / 1e9, ops / tb / 1e9, ta / tb, diff);
    return 0;
}
