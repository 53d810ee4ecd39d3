/*
 * bsr_bench — block-sparse (BSR) GEMV against the dense f32 GEMV on one core
 * (docs/PERFORMANCE.md, "Block-sparse weights", shows its output).
 *
 * A 4096 x 4096 matrix whose br x bc blocks are zero in exactly the stated fraction (0, 50,
 * 75, 90, 95 %) is converted with bsr_from_dense; each row reports the BSR GEMV's time, its
 * effective bandwidth (bytes of the BSR file image streamed per call: blocks + indices), and
 * the time ratio to the dense kern_matmul(DT_F32) measured in the same run on the same ISA —
 * next to 1 / (1 - sparsity), the ratio a purely bandwidth-bound kernel would reach. Weights
 * rotate through copies totalling >= 256 MiB so every call streams from DRAM, as in decode,
 * even when a sparse matrix would fit in the last-level cache. Times are the best of 5
 * batches (the machine is shared); the last column is the CPU other processes used meanwhile.
 *
 *   usage: bsr_bench [--quick] [--ref]      (--ref: also time the scalar BSR path)
 */
#include "bench_util.h"
#include "bsr.h"
#include "rng.h"
#include "kern_variants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 4096
#define RING_BYTES (256u << 20)

static double g_min_time = 1.0;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) { return rng_xorshift64(&rng); }

/* A dense N x N matrix with exactly round(sparsity * blocks) zero br x bc blocks. */
static float *sparse_dense(size_t br, size_t bc, double sparsity)
{
    const size_t nbr = N / br, nbc = N / bc, nb = nbr * nbc;
    size_t nzero = (size_t)(sparsity * (double)nb + 0.5);
    unsigned char *zero = calloc(nb, 1);
    size_t *perm = malloc(nb * sizeof *perm);
    float *w = malloc((size_t)N * N * sizeof(float));
    if (!zero || !perm || !w) {
        fprintf(stderr, "bsr_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < nb; i++)
        perm[i] = i;
    for (size_t i = 0; i < nzero; i++) { /* partial Fisher-Yates */
        size_t j = i + (size_t)(rnd() % (nb - i)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        zero[perm[i]] = 1;
    }
    for (size_t r = 0; r < N; r++)
        for (size_t c = 0; c < N; c++)
            w[r * N + c] = zero[(r / br) * nbc + c / bc]
                               ? 0.0f
                               : (float)((int)(rnd() % 2001) - 1000) * 1e-5f;
    free(zero);
    free(perm);
    return w;
}

static double time_dense(float **w, int copies, const float *x, float *y)
{
    kern_matmul(DT_F32, w[0], N, x, 1, y, N, 0, N);
    double best = 1e30;
    int calls = 0;
    for (int batch = 0; batch < 5; batch++) {
        int k = 0;
        double t0 = bench_now(), t;
        do {
            kern_matmul(DT_F32, w[calls++ % copies], N, x, 1, y, N, 0, N);
            k++;
            t = bench_now() - t0;
        } while (t < g_min_time / 5 || k < 2);
        best = t / k < best ? t / k : best;
    }
    return best;
}

static double time_bsr(kern_bsr_fn *fn, struct bsr **m, int copies, const float *x, float *y)
{
    fn(&m[0]->k, x, y, 0, (size_t)m[0]->nbr);
    double best = 1e30;
    int calls = 0;
    for (int batch = 0; batch < 5; batch++) {
        int k = 0;
        double t0 = bench_now(), t;
        do {
            const struct bsr *b = m[calls++ % copies];
            fn(&b->k, x, y, 0, (size_t)b->nbr);
            k++;
            t = bench_now() - t0;
        } while (t < g_min_time / 5 || k < 2);
        best = t / k < best ? t / k : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int with_ref = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            g_min_time = 0.2;
        else if (strcmp(argv[i], "--ref") == 0)
            with_ref = 1;
        else {
            fprintf(stderr, "usage: bsr_bench [--quick] [--ref]\n");
            return 2;
        }
    }
    if (kern_init() != 0)
        return 1;
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;

    /* dense f32 reference: kern_matmul, one thread, same ISA */
    const size_t dense_bytes = (size_t)N * N * sizeof(float);
    int dcopies = (int)(RING_BYTES / dense_bytes) + 1;
    float **dw = calloc((size_t)dcopies, sizeof *dw);
    for (int i = 0; i < dcopies; i++)
        dw[i] = sparse_dense(16, 16, 0.0);
    struct bench_load ld;
    bench_load_begin(&ld);
    double td = time_dense(dw, dcopies, x, y);
    double dload = bench_load_end(&ld);
    for (int i = 0; i < dcopies; i++)
        free(dw[i]);
    free(dw);
    printf("### BSR GEMV vs dense f32 GEMV, %d x %d, 1 thread, ISA %s\n\n", N, N,
           kern_isa_name(kern_isa()));
    printf("Dense f32 kern_matmul: %.3f ms, %.2f GB/s (other CPU %.0f%%).\n\n", td * 1e3,
           (double)dense_bytes / td / 1e9, 100 * dload);
    printf("| block | sparsity | blocks kept | MiB | BSR ms | GB/s | dense/BSR time | ideal "
           "1/(1-s) |%s other CPU |\n|---|---|---|---|---|---|---|---|%s---|\n",
           with_ref ? " scalar BSR ms (dense/BSR) |" : "", with_ref ? "---|" : "");
    static const size_t blocks[] = {16, 32};
    static const double sparsities[] = {0.0, 0.5, 0.75, 0.9, 0.95};
    for (size_t bi = 0; bi < 2; bi++)
        for (size_t si = 0; si < 5; si++) {
            const size_t b = blocks[bi];
            const double s = sparsities[si];
            float *w = sparse_dense(b, b, s);
            struct bsr *m0;
            if (bsr_from_dense(w, N, N, N, (uint32_t)b, (uint32_t)b, 0.0f, &m0) != 0)
                return 1;
            free(w);
            int copies = (int)(RING_BYTES / m0->image_size) + 1;
            struct bsr **m = calloc((size_t)copies, sizeof *m);
            m[0] = m0;
            for (int i = 1; i < copies; i++)
                if (bsr_open_mem("copy", m0->image, m0->image_size, &m[i]) != 0)
                    return 1;
            bench_load_begin(&ld);
            double t = time_bsr(kern_bsr_gemv, m, copies, x, y);
            double tr = with_ref ? time_bsr(kern_gemv_bsr_f32_ref, m, copies, x, y) : 0;
            double load = bench_load_end(&ld);
            printf("| %zux%zu | %.0f %% | %llu / %llu | %.1f | %.3f | %.2f | %.2f | %.1f |", b, b,
                   100 * s, (unsigned long long)m0->nnzb,
                   (unsigned long long)(m0->nbr * m0->nbc),
                   (double)m0->image_size / (1 << 20), t * 1e3,
                   (double)m0->image_size / t / 1e9, td / t, 1.0 / (1.0 - s));
            if (with_ref)
                printf(" %.3f (%.2f) |", tr * 1e3, td / tr);
            printf(" %.0f%% |\n", 100 * load);
            fflush(stdout);
            for (int i = 0; i < copies; i++)
                bsr_close(m[i]);
            free(m);
        }
    free(x);
    free(y);
    return 0;
}
