/*
 * elt_bench — the elementwise kernels (kern.h) per ISA, as ns per element and as speed-up over
 * the _ref specification measured in the same run, plus a "libm" column: the scalar code
 * worker/model/forward.c runs today (expf/tanhf from libm, the same loops), which is what a swap to
 * these kernels would replace. Vectors stay in L1/L2 (they do in the forward pass: one row of
 * activations at a time), so this measures arithmetic, not memory bandwidth. One thread.
 * Each row ends with the CPU share other processes used meanwhile (bench_load_end).
 *
 *   usage: elt_bench [--quick]
 */
#include "bench_util.h"
#include "kern_variants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double g_min_time = 0.5;

/* One benchmarked call: op(args) on buffers prepared by main. */
struct job {
    int op;
    size_t n;              /* elements per call (rope: heads * hd) */
    float *x, *b, *y, *cs; /* [n] inputs / output; cs [hd] */
    size_t heads, hd;
};

enum { OP_EXP, OP_TANH, OP_SILU, OP_GELU_B, OP_SOFTMAX, OP_RMSNORM, OP_SWIGLU, OP_ROPE, OP_N };
static const char *const op_names[OP_N] = {"exp",     "tanh",    "silu",   "gelu+bias",
                                           "softmax", "rmsnorm", "swiglu", "rope"};

/* ---- the scalar code of worker/model/forward.c (libm), for the "libm" column ------------------- */

static void libm_run(const struct job *j)
{
    size_t n = j->n;
    switch (j->op) {
    case OP_EXP:
        for (size_t i = 0; i < n; i++)
            j->y[i] = expf(j->x[i]);
        break;
    case OP_TANH:
        for (size_t i = 0; i < n; i++)
            j->y[i] = tanhf(j->x[i]);
        break;
    case OP_SILU:
        for (size_t i = 0; i < n; i++)
            j->y[i] = j->x[i] / (1.0f + expf(-j->x[i]));
        break;
    case OP_GELU_B:
        for (size_t i = 0; i < n; i++) {
            float v = j->x[i] + j->b[i];
            j->y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
        }
        break;
    case OP_SOFTMAX: { /* on y: a copy of x would add a memcpy to every call */
        float m = j->y[0], s = 0.0f;
        for (size_t i = 1; i < n; i++)
            m = j->y[i] > m ? j->y[i] : m;
        for (size_t i = 0; i < n; i++) {
            j->y[i] = expf(j->y[i] - m);
            s += j->y[i];
        }
        for (size_t i = 0; i < n; i++)
            j->y[i] /= s;
        break;
    }
    case OP_RMSNORM:
        kern_rmsnorm_f32_f32_ref(j->y, j->x, j->b, n, 1e-5f); /* forward.c's loop exactly */
        break;
    case OP_SWIGLU:
        for (size_t i = 0; i < n; i++)
            j->y[i] = j->x[i] / (1.0f + expf(-j->x[i])) * j->b[i];
        break;
    case OP_ROPE:
        kern_rope_f32_f32_ref(j->y, j->heads, j->hd, j->cs); /* forward.c's loop exactly */
        break;
    }
}

static const struct {
    kern_map_fn *exp, *tanh;
    kern_bias_act_fn *silu, *gelu;
    kern_softmax_fn *softmax;
    kern_rmsnorm_fn *rmsnorm;
    kern_swiglu_fn *swiglu;
    kern_rope_fn *rope;
} g_sets[3] = {
#define SET_(isa)                                                                            \
    {kern_exp_f32_f32_##isa,     kern_tanh_f32_f32_##isa,    kern_silu_f32_f32_##isa,        \
     kern_gelu_f32_f32_##isa,    kern_softmax_f32_f32_##isa, kern_rmsnorm_f32_f32_##isa,     \
     kern_swiglu_f32_f32_##isa,  kern_rope_f32_f32_##isa}
    SET_(ref), SET_(avx2), SET_(avx512)
#undef SET_
};

/* isa < 0: the libm column. */
static void run(const struct job *j, int isa)
{
    if (isa < 0) {
        libm_run(j);
        return;
    }
    switch (j->op) {
    case OP_EXP: g_sets[isa].exp(j->y, j->x, j->n); break;
    case OP_TANH: g_sets[isa].tanh(j->y, j->x, j->n); break;
    case OP_SILU: g_sets[isa].silu(j->y, j->x, NULL, j->n); break;
    case OP_GELU_B: g_sets[isa].gelu(j->y, j->x, j->b, j->n); break;
    case OP_SOFTMAX: g_sets[isa].softmax(j->y, j->n); break;
    case OP_RMSNORM: g_sets[isa].rmsnorm(j->y, j->x, j->b, j->n, 1e-5f); break;
    case OP_SWIGLU: g_sets[isa].swiglu(j->y, j->x, j->b, j->n); break;
    case OP_ROPE: g_sets[isa].rope(j->y, j->heads, j->hd, j->cs); break;
    }
}

/*
 * Nanoseconds per element: the best of 5 batches of >= g_min_time/5 s each (the machine is
 * shared; the least disturbed batch counts). Softmax and rope work in place on y, which is
 * refilled from x before each batch; values stay bounded (softmax of a softmax, a rotation).
 */
static double time_ns(const struct job *j, int isa)
{
    double best = 1e30;
    for (int batch = 0; batch < 5; batch++) {
        memcpy(j->y, j->x, j->n * sizeof *j->y);
        run(j, isa); /* warm-up */
        long k = 0;
        double t0 = bench_now(), t;
        do {
            run(j, isa);
            k++;
            t = bench_now() - t0;
        } while (t < g_min_time / 5 || k < 3);
        double ns = t / (double)k / (double)j->n * 1e9;
        best = ns < best ? ns : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            g_min_time = 0.1;
        else {
            fprintf(stderr, "usage: elt_bench [--quick]\n");
            return 2;
        }
    }
    if (kern_init() != 0)
        return 1;
    const size_t maxn = 32000;
    const size_t bytes = maxn * sizeof(float);
    float *x = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    float *y = aligned_alloc(64, bytes), *cs = aligned_alloc(64, 256 * sizeof(float));
    float inv[128];
    if (!x || !b || !y || !cs) {
        fprintf(stderr, "elt_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < maxn; i++) {
        x[i] = (float)((i * 2654435761u) % 2001) / 100.0f - 10.0f; /* [-10, 10] */
        b[i] = (float)((i * 40503u) % 1001) / 1000.0f - 0.5f;
    }
    for (size_t i = 0; i < 64; i++)
        inv[i] = (float)pow(10000.0, -(double)(2 * i) / 128.0);
    kern_rope_table(cs, 1234, inv, 64);

    /* TinyLlama-1.1B shapes: dim 2048, ffn 5632, 32 heads x 64, vocab 32000 */
    static const struct {
        int op;
        size_t n;
    } rows[] = {{OP_EXP, 5632},     {OP_TANH, 5632},    {OP_SILU, 5632},
                {OP_GELU_B, 5632},  {OP_SOFTMAX, 2048}, {OP_SOFTMAX, 32000},
                {OP_RMSNORM, 2048}, {OP_SWIGLU, 5632},  {OP_ROPE, 32 * 64}};
    printf("elt_bench: ns/element, one thread; speed-ups = time of _ref (or of the libm loop) / "
           "time of the variant\n");
    printf("%-10s %6s %8s %8s %8s %8s | %11s %11s | %11s %11s | %5s\n", "kernel", "n", "libm",
           "ref", "avx2", "avx512", "avx2 vs ref", "512 vs ref", "avx2 vs libm", "512 vs libm",
           "load");
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        struct job j = {rows[r].op, rows[r].n, x, b, y, cs, 0, 0};
        if (j.op == OP_ROPE) {
            j.heads = 32;
            j.hd = 64;
        }
        struct bench_load l;
        bench_load_begin(&l);
        double t_libm = time_ns(&j, -1), t_ref = time_ns(&j, KERN_ISA_REF);
        double t_avx2 = kern_isa_supported(KERN_ISA_AVX2) ? time_ns(&j, KERN_ISA_AVX2) : 0;
        double t_512 = kern_isa_supported(KERN_ISA_AVX512) ? time_ns(&j, KERN_ISA_AVX512) : 0;
        double load = bench_load_end(&l);
        printf("%-10s %6zu %8.3f %8.3f %8.3f %8.3f | %11.1f %11.1f | %11.1f %11.1f | %4.0f%%\n",
               op_names[j.op], j.n, t_libm, t_ref, t_avx2, t_512, t_avx2 ? t_ref / t_avx2 : 0,
               t_512 ? t_ref / t_512 : 0, t_avx2 ? t_libm / t_avx2 : 0,
               t_512 ? t_libm / t_512 : 0, load * 100);
    }
    free(x);
    free(b);
    free(y);
    free(cs);
    return 0;
}
