/*
 * test_kern_kq.c — the GGUF k-quants (q4_K, q5_K, q6_K; kernels/include/quant.h):
 *  - kern_row_to_f32 bit-exact against an independent decoder written here from the GGUF
 *    block layouts (ggml's block_q4_K / block_q5_K / block_q6_K: byte offsets, bit positions,
 *    and ggml's f32 evaluation order (d * sc) * q - (dmin * m)), on random bytes (every code,
 *    scale and min pattern) under random finite f16 super-block scales;
 *  - quant_kq_scales_mins (the kernels' 12-byte unpack) equals the per-sub-block rule;
 *  - kern_quantize_row_kq: relative RMS error per super-block on Gaussian rows below a stated
 *    bound (q4_k 0.12, q5_k 0.06, q6_k 0.03: about 1.5x what it measures), q4_k below q4_0
 *    round-to-nearest's on the same rows (the point of the format), ragged and non-finite
 *    rows refused; kern_quantize_rows_kq gives those bytes whatever its thread count;
 *  - kern_quantize_row_kq's bytes equal llama.cpp's quantize_row_q{4,5,6}_K_ref's on data with
 *    the search's corner cases (hashes of llama.cpp's output, computed with its library);
 *  - every GEMV/GEMM variant of every ISA against its scalar `_ref` twin and against the f32
 *    product of the dequantized weights, on random shapes (1..23 rows, ragged row ranges,
 *    1..9 super-blocks, 1..17 tokens), with the bounds of test_kern_q4g.c:
 *      variant vs twin: |y - y_twin| <= 1e-5 * S', S' = sum (|w| + 2 |dmin m|) |x| (for q4_K
 *      and q5_K the code and min parts are summed apart; q6_K: sum |w| |x|);
 *      twin and kern_matmul vs the f32 product: the int8 activation bound of quant.h,
 *      sum_b dx_b / 2 * sum_{i in b} |w_i|, plus 2e-5 * S';
 *    and on AVX2 / AVX-512 batch invariance: the gemm over n tokens gives each token the bits
 *    the gemv gives it alone (a MoE expert's token count depends on the rest of the batch);
 *  - q4_K and q6_K panels (check_panels_kq): the repack's round trip and padding, the panel gemm
 *    against the twin, batch invariant, and equal to the stored-row gemm where it is one.
 */
#include "testutil.h"
#include "rng.h"
#include "isa_case.h"

#include "dtype.h"
#include "err.h"
#include "half.h"
#include "kern_variants.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL -12345.0f

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng_xorshift64(&rng_state);
    return (uint32_t)(rng_state >> 16);
}

static float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

static size_t rndz(size_t lo, size_t hi) { return lo + rnd() % (hi - lo + 1); }

/* A standard normal value (Box-Muller). */
static float gauss(void)
{
    float u = ((float)rnd() + 1.0f) / 4294967297.0f, v = (float)rnd() / 4294967296.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static const enum dtype types[] = {DT_Q4_K, DT_Q5_K, DT_Q6_K};

/* ---- the independent decoder -------------------------------------------------------------- */

static float f16le(const uint8_t *p) { return half_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* block_q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16 (144 bytes);
 * block_q5_K: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48 (176 bytes). */
static void indep_q45(int five, const uint8_t *b, float *y)
{
    const float d = f16le(b), dmin = f16le(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *ql = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++) {       /* 64 elements per 32 bytes of qs */
        for (int half = 0; half < 2; half++) {
            const int j = 2 * c + half;    /* sub-block of 32 */
            int sc, m;
            if (j < 4) {
                sc = s[j] & 0x3f;
                m = s[j + 4] & 0x3f;
            } else {
                sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
                m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = half ? ql[32 * c + l] >> 4 : ql[32 * c + l] & 0x0f;
                if (five && (qh[l] & (1 << j)))
                    q += 16;
                float p = d1 * (float)q;
                y[64 * c + 32 * half + l] = p - m1;
            }
        }
    }
}

/* block_q6_K: ql[128] @0, qh[64] @128, int8 scales[16] @192, d @208 (210 bytes). */
static void indep_q6(const uint8_t *b, float *y)
{
    const float d = f16le(b + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[128 * n + l] = d * (float)sc[is] * (float)q1;
            y[128 * n + l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[128 * n + l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[128 * n + l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

static void indep_row(enum dtype dt, const uint8_t *row, float *y, size_t n)
{
    const size_t bb = dtype_info(dt)->block_bytes;
    for (size_t i = 0; i < n; i += 256, row += bb) {
        if (dt == DT_Q6_K)
            indep_q6(row, y + i);
        else
            indep_q45(dt == DT_Q5_K, row, y + i);
    }
}

/* A random finite f16, magnitude 2^-14 .. 2^2 or zero now and then. */
static uint16_t rnd_f16(void)
{
    if (rnd() % 40 == 0)
        return 0;
    float v = ldexpf(1.0f + rndf() * 0.5f, (int)rndz(0, 16) - 14) * (rnd() & 1 ? -1.0f : 1.0f);
    return half_f32_to_f16(v);
}

static void test_decode_independent(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const enum dtype dt = types[k];
        const struct dtype_info *di = dtype_info(dt);
        assert_int_equal(di->block, 256);
        const size_t nsb = 7, n = nsb * 256;
        uint8_t *row = malloc(nsb * di->block_bytes);
        float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        assert_true(row && got && want);
        for (int rep = 0; rep < 300; rep++) {
            for (size_t i = 0; i < nsb * di->block_bytes; i++)
                row[i] = (uint8_t)rnd();
            for (size_t b = 0; b < nsb; b++) {
                uint8_t *blk = row + b * di->block_bytes;
                uint16_t d = rnd_f16(), m = rnd_f16();
                size_t at = dt == DT_Q6_K ? 208 : 0;
                blk[at] = (uint8_t)d, blk[at + 1] = (uint8_t)(d >> 8);
                if (dt != DT_Q6_K)
                    blk[2] = (uint8_t)m, blk[3] = (uint8_t)(m >> 8);
            }
            kern_row_to_f32(dt, row, got, n);
            indep_row(dt, row, want, n);
            if (memcmp(got, want, n * sizeof(float)) != 0)
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                        fail_msg("%s rep %d element %zu: kern_row_to_f32 %.9g, decoder %.9g",
                                 di->name, rep, i, got[i], want[i]);
        }
        enum dtype back;
        assert_int_equal(dtype_from_name(di->name, &back), 0);
        assert_int_equal(back, dt);
        free(want);
        free(got);
        free(row);
    }
    /* the kernels' 12-byte unpack against the per-sub-block rule */
    for (int rep = 0; rep < 2000; rep++) {
        uint8_t s[12], sc[8], m[8];
        for (int i = 0; i < 12; i++)
            s[i] = (uint8_t)rnd();
        quant_kq_scales_mins(s, sc, m);
        for (int j = 0; j < 8; j++) {
            uint8_t a, b;
            quant_kq_scale_min(s, j, &a, &b);
            assert_int_equal(sc[j], a);
            assert_int_equal(m[j], b);
        }
    }
}

/* q4_0 round to nearest (the converter's rule), for the comparison below. */
static double q4_0_sqerr(const float *x, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i += 32) {
        float big = 0.0f;
        for (size_t j = i; j < i + 32; j++)
            big = fabsf(x[j]) > fabsf(big) ? x[j] : big;
        float d = half_f16_to_f32(half_f32_to_f16(big / -8.0f)), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (size_t j = i; j < i + 32; j++) {
            float r = roundf(x[j] * id) + 8.0f;
            r = r < 0 ? 0 : r > 15 ? 15 : r;
            float v = d * (r - 8.0f);
            e += (double)(x[j] - v) * (x[j] - v);
        }
    }
    return e;
}

static void test_quantize(void **state)
{
    (void)state;
    static const double bound[] = {0.12, 0.06, 0.03};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const enum dtype dt = types[k];
        const struct dtype_info *di = dtype_info(dt);
        const size_t nsb = 64, n = nsb * 256;
        float *x = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
        uint8_t *q = malloc(nsb * di->block_bytes);
        assert_true(x && back && q);
        for (size_t b = 0; b < nsb; b++) {
            /* Gaussian rows, a few outliers, a shifted or constant sub-block now and then */
            float mag = powf(10.0f, rndf()), shift = rnd() % 3 == 0 ? rndf() * mag : 0.0f;
            for (size_t i = b * 256; i < b * 256 + 256; i++)
                x[i] = gauss() * mag * (rnd() % 64 == 0 ? 4.0f : 1.0f) + shift;
            if (rnd() % 8 == 0)
                for (size_t i = b * 256 + 32; i < b * 256 + 64; i++)
                    x[i] = shift;
        }
        assert_int_equal(kern_quantize_row_kq(dt, x, q, n), 0);
        kern_row_to_f32(dt, q, back, n);
        double worst = 0, tot = 0, tot_x = 0;
        for (size_t b = 0; b < nsb; b++) {
            double e = 0, s = 0;
            for (size_t i = b * 256; i < b * 256 + 256; i++) {
                e += (double)(x[i] - back[i]) * (x[i] - back[i]);
                s += (double)x[i] * x[i];
            }
            double rel = s > 0 ? sqrt(e / s) : sqrt(e);
            if (!(rel <= bound[k]))
                fail_msg("%s super-block %zu: relative RMS error %.4f > %.4f", di->name, b, rel,
                         bound[k]);
            worst = rel > worst ? rel : worst;
            tot += e;
            tot_x += s;
        }
        double q40 = q4_0_sqerr(x, n);
        printf("%-5s quantize: relative RMS error %.4f (worst super-block %.4f); q4_0 RTN %.4f\n",
               di->name, sqrt(tot / tot_x), worst, sqrt(q40 / tot_x));
        if (dt == DT_Q4_K)
            assert_true(tot < q40);
        free(q);
        free(back);
        free(x);
    }
    float bad[512] = {0};
    uint8_t out[2 * 210];
    assert_int_equal(kern_quantize_row_kq(DT_Q4_K, bad, out, 128), ERR_FORMAT);
    bad[300] = NAN;
    assert_int_equal(kern_quantize_row_kq(DT_Q6_K, bad, out, 512), ERR_RANGE);
    bad[300] = -INFINITY;
    assert_int_equal(kern_quantize_row_kq(DT_Q5_K, bad, out, 512), ERR_RANGE);
    /* an all-zero row decodes to zeros */
    float zero[256] = {0}, z[256];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        assert_int_equal(kern_quantize_row_kq(types[k], zero, out, 256), 0);
        kern_row_to_f32(types[k], out, z, 256);
        for (int i = 0; i < 256; i++)
            assert_true(z[i] == 0.0f);
    }
}

/* ---- llama.cpp's bytes ----------------------------------------------------------------------- */

/*
 * 48 super-blocks of data exact in binary (xorshift, powers of two: no libm, so the same
 * floats everywhere), with the search's corner cases: shifted blocks, outliers, a constant, an
 * all-zero, a positive (its min clamps to 0) and a tiny (its 6-bit scale rounds to 0)
 * sub-block, and an all-zero super-block. x: [48 * 256].
 */
static void llama_case_data(float *x) /* [48 * 256] */
{
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int b = 0; b < 48; b++) {
        const float mag = ldexpf(1.0f, b % 7 - 8), shift = b % 3 == 0 ? 0.375f * mag : 0.0f;
        for (int i = 0; i < 256; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            float u = (float)(int32_t)(s >> 40 & 0xffffff) / 8388608.0f - 1.0f; /* [-1, 1) */
            if ((s >> 8) % 61 == 0)
                u *= 6.0f; /* an outlier */
            x[256 * b + i] = u * mag + shift;
        }
        float *sb = x + 256 * b;
        if (b % 8 == 5) /* a constant sub-block */
            for (int i = 32; i < 64; i++)
                sb[i] = shift + mag;
        if (b % 11 == 4) /* an all-zero sub-block */
            for (int i = 64; i < 96; i++)
                sb[i] = 0.0f;
        if (b % 13 == 6) /* a positive sub-block (its min clamps to 0) */
            for (int i = 96; i < 128; i++)
                sb[i] = fabsf(sb[i]) + mag;
        if (b % 9 == 7) /* a tiny sub-block: its scale rounds to 0 */
            for (int i = 128; i < 160; i++)
                sb[i] *= 1.0f / 4096.0f;
        if (b == 47) /* an all-zero super-block */
            for (int i = 0; i < 256; i++)
                sb[i] = 0.0f;
    }
}
static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/*
 * kern_quantize_row_kq writes llama.cpp's bytes: the FNV-1a hashes below are of what
 * llama.cpp's own quantize_row_q4_K_ref, quantize_row_q5_K_ref and quantize_row_q6_K_ref
 * (ggml/src/ggml-quants.c, the llama.cpp build of session 12; no imatrix) wrote for
 * llama_case_data, computed once with that library, not with our code. The quality
 * bar is llama.cpp's Q4_K_M: equal bytes give its KLD (docs/PERFORMANCE.md "k-quants, session
 * 12" checks the whole synthetic TinyLlama the same way).
 */
static void test_quantize_llama_bytes(void **state)
{
    (void)state;
    static const uint64_t want[] = {0xe1c90b14283c4ba1ull, 0xf29f9095939dd52aull,
                                    0x22b30495bae2b29cull};
    float *x = malloc(48 * 256 * sizeof(float));
    uint8_t *q = malloc(48 * 210);
    assert_true(x && q);
    llama_case_data(x);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const size_t bytes = 48 * dtype_info(types[k])->block_bytes;
        assert_int_equal(kern_quantize_row_kq(types[k], x, q, 48 * 256), 0);
        if (fnv1a(q, bytes) != want[k])
            fail_msg("%s: bytes hash 0x%016llx, llama.cpp's 0x%016llx", dtype_info(types[k])->name,
                     (unsigned long long)fnv1a(q, bytes), (unsigned long long)want[k]);
    }
    free(q);
    free(x);
}

/* kern_quantize_rows_kq: the bytes of kern_quantize_row_kq row by row, whatever the thread
 * count (1, 2, 3, more threads than rows, the CPUs); the first failing row's error. */
static void test_quantize_rows(void **state)
{
    (void)state;
    const size_t rows = 7, n = 512;
    float *x = malloc(rows * n * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < rows * n; i++)
        x[i] = gauss() * (rnd() % 32 == 0 ? 5.0f : 1.0f);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const enum dtype dt = types[k];
        const size_t rb = n / 256 * dtype_info(dt)->block_bytes;
        uint8_t *one = malloc(rows * rb), *par = malloc(rows * rb);
        assert_true(one && par);
        for (size_t r = 0; r < rows; r++)
            assert_int_equal(kern_quantize_row_kq(dt, x + r * n, one + r * rb, n), 0);
        static const int threads[] = {1, 2, 3, 16, 0};
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            memset(par, 0xa5, rows * rb);
            assert_int_equal(kern_quantize_rows_kq(dt, x, rows, n, par, threads[t]), 0);
            assert_memory_equal(one, par, rows * rb);
        }
        free(one);
        free(par);
    }
    uint8_t out[7 * 2 * 210];
    assert_int_equal(kern_quantize_rows_kq(DT_Q4_K, x, 2, 300, out, 2), ERR_FORMAT);
    x[5 * n + 3] = NAN; /* a bad row in the second thread's share */
    assert_int_equal(kern_quantize_rows_kq(DT_Q6_K, x, rows, n, out, 2), ERR_RANGE);
    x[5 * n + 3] = 0.0f;
    x[6 * n + 9] = INFINITY;
    assert_int_equal(kern_quantize_rows_kq(DT_Q4_K, x, rows, n, out, 3), ERR_RANGE);
    assert_int_equal(kern_quantize_rows_kq(DT_Q4_K, x, 0, n, out, 2), 0); /* no rows */
    free(x);
}

struct variant {
    const char *name;
    enum dtype wt;
    enum kern_isa isa;
    kern_mm_fn *fn, *twin;
};

#define V_(op, wty, DT, isa, ISA)                                                            \
    {"kern_" #op "_" #wty "_q8_0_" #isa, DT, ISA, kern_##op##_##wty##_q8_0_##isa,             \
     kern_##op##_##wty##_q8_0_ref},
#define VS_(isa, ISA)                                                                        \
    V_(gemv, q4_k, DT_Q4_K, isa, ISA) V_(gemm, q4_k, DT_Q4_K, isa, ISA)                      \
    V_(gemv, q5_k, DT_Q5_K, isa, ISA) V_(gemm, q5_k, DT_Q5_K, isa, ISA)                      \
    V_(gemv, q6_k, DT_Q6_K, isa, ISA) V_(gemm, q6_k, DT_Q6_K, isa, ISA)

static const struct variant variants[] = {VS_(ref, KERN_ISA_REF) VS_(avx2, KERN_ISA_AVX2)
                                              VS_(avx512, KERN_ISA_AVX512)};

static void check_close(const char *what, const float *y, const float *want, const float *tol,
                        size_t n, size_t ldy, size_t r0, size_t r1, size_t cols)
{
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < ldy; r++) {
            size_t i = t * ldy + r;
            if (r < r0 || r >= r1) {
                if (y[i] != SENTINEL)
                    fail_msg("%s: cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] outside the range "
                             "was written", what, cols, n, r0, r1, t, r);
                continue;
            }
            if (!(fabsf(y[i] - want[i]) <= tol[i]))
                fail_msg("%s: cols %zu n %zu rows [%zu,%zu): y[%zu][%zu] = %.9g, want %.9g "
                         "(tolerance %.3g)", what, cols, n, r0, r1, t, r, y[i], want[i], tol[i]);
        }
}

static void fill(float *p, size_t count, float v)
{
    for (size_t i = 0; i < count; i++)
        p[i] = v;
}

static unsigned ran[3]; /* variant checks per ISA, printed */
static enum kern_isa g_isa; /* the ISA the running test checks (isa_case.h) */

/* |dmin * m| of the sub-block holding column c (0 for q6_K). */
static float min_term(enum dtype wt, const uint8_t *row, size_t c)
{
    if (wt == DT_Q6_K)
        return 0.0f;
    const uint8_t *blk = row + c / 256 * dtype_info(wt)->block_bytes;
    uint8_t sc, m;
    quant_kq_scale_min(blk + 4, (int)(c % 256 / 32), &sc, &m);
    return fabsf(f16le(blk + 2) * (float)m);
}

/*
 * k-quant panels (quant.h "q4_K panels", "q6_K panels"): the repacked matrix gives back the
 * stored rows byte for byte (from any row), rows past the matrix are zero bytes; the panel
 * gemm of the test's ISA: AVX-512's own kernel within the variant-vs-twin bound of the _ref
 * twin and batch invariant (n tokens give each token the bits it gets alone), the other ISAs'
 * exactly their stored-row gemm; kern_matmul_act_panels within kern_matmul's bound. Row
 * ranges start on a panel.
 */
static void check_panels_kq(enum dtype wt, const uint8_t *w, size_t rows, size_t cols,
                            size_t rb, const struct kern_act *a, size_t ldy, size_t r0,
                            size_t r1, const float *s, const float *qb, const float *want)
{
    r0 = r0 / 16 * 16;
    const size_t n = a->n, cnt = n * ldy, np = (rows + 15) / 16, nsb = cols / QUANT_K;
    const size_t bytes = kern_panels_bytes(wt, rows, cols);
    assert_true(kern_panels_supported(wt));
    assert_int_equal(bytes, np * 16 * nsb *
                                (wt == DT_Q4_K ? QUANT_Q4KP_ROW_BYTES : QUANT_Q6KP_ROW_BYTES));
    uint8_t *wp = aligned_alloc(64, (bytes + 63) / 64 * 64), *back = malloc(np * 16 * rb);
    assert_true(wp && back);
    memset(wp, 0xa5, bytes); /* rows past the matrix must be written (as zeros) */
    kern_panels_pack(wt, w, cols, wp, rows, 0, np / 2); /* in two ranges, as threads may */
    kern_panels_pack(wt, w, cols, wp, rows, np / 2, np);
    kern_panels_rows(wt, wp, cols, 0, rows, back);
    assert_memory_equal(back, w, rows * rb);
    if (rows > 1) {
        kern_panels_rows(wt, wp, cols, 1, rows, back);
        assert_memory_equal(back, w + rb, (rows - 1) * rb);
    }
    if (rows % 16) { /* the padding rows unpack to zero bytes (every panel byte is some row's) */
        kern_panels_rows(wt, wp, cols, rows, np * 16, back);
        for (size_t i = 0; i < (np * 16 - rows) * rb; i++)
            if (back[i] != 0)
                fail_msg("%s panels: byte %zu of the padding rows is %u", dtype_info(wt)->name,
                         i, back[i]);
    }

    float *y = malloc(cnt * sizeof(float)), *z = malloc(cnt * sizeof(float));
    float *tol = malloc(cnt * sizeof(float));
    assert_true(y && z && tol);
    char what[160];
    fill(y, cnt, SENTINEL);
    fill(z, cnt, SENTINEL);
    if (g_isa == KERN_ISA_AVX512) {
        kern_mm_fn *pv = wt == DT_Q4_K ? kern_gemm_q4_kp_q8_0_avx512 : kern_gemm_q6_kp_q8_0_avx512;
        pv(wp, a, y, ldy, r0, r1);
        (wt == DT_Q4_K ? kern_gemm_q4_k_q8_0_ref : kern_gemm_q6_k_q8_0_ref)(w, a, z, ldy, r0, r1);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = 1e-5f * s[i] + 1e-30f;
        snprintf(what, sizeof what, "kern_gemm_%sp_q8_0_avx512 vs its twin", dtype_info(wt)->name);
        check_close(what, y, z, tol, n, ldy, r0, r1, cols);
        fill(z, cnt, SENTINEL);
        for (size_t t = 0; t < n; t++) {
            struct kern_act one = *a; /* token t alone */
            one.n = 1;
            one.x = a->x + t * cols;
            one.q = a->q + t * a->ld;
            one.d = a->d + t * a->cp / 32;
            one.ns32 = a->ns32 + t * a->cp / 32;
            one.ns4 = a->ns4 + t * a->cp / 4;
            one.d4 = a->d4 + t * a->cp / 4;
            pv(wp, &one, z + t * ldy, ldy, r0, r1);
        }
        if (memcmp(y, z, cnt * sizeof(float)) != 0)
            fail_msg("%s panels avx512: %zu tokens differ from one token at a time",
                     dtype_info(wt)->name, n);
    } else {
        const int q4 = wt == DT_Q4_K, ref = g_isa == KERN_ISA_REF;
        kern_mm_fn *pv = q4 ? (ref ? kern_gemm_q4_kp_q8_0_ref : kern_gemm_q4_kp_q8_0_avx2)
                            : (ref ? kern_gemm_q6_kp_q8_0_ref : kern_gemm_q6_kp_q8_0_avx2);
        kern_mm_fn *rv = q4 ? (ref ? kern_gemm_q4_k_q8_0_ref : kern_gemm_q4_k_q8_0_avx2)
                            : (ref ? kern_gemm_q6_k_q8_0_ref : kern_gemm_q6_k_q8_0_avx2);
        pv(wp, a, y, ldy, r0, r1);
        rv(w, a, z, ldy, r0, r1);
        if (memcmp(y, z, cnt * sizeof(float)) != 0)
            fail_msg("%s panels %s: not the stored-row gemm's bits", dtype_info(wt)->name,
                     kern_isa_name(g_isa));
    }
    fill(y, cnt, SENTINEL);
    for (size_t i = 0; i < cnt; i++)
        tol[i] = (g_isa != KERN_ISA_REF ? qb[i] : 0.0f) + 2e-5f * s[i] + 1e-30f;
    kern_matmul_act_panels(wt, wp, a, y, ldy, r0, r1);
    snprintf(what, sizeof what, "kern_matmul_act_panels(%s, %s)", dtype_info(wt)->name,
             kern_isa_name(g_isa));
    check_close(what, y, want, tol, n, ldy, r0, r1, cols);
    free(tol);
    free(z);
    free(y);
    free(back);
    free(wp);
}

static void run_case(enum dtype wt, size_t cols, size_t n)
{
    const struct dtype_info *di = dtype_info(wt);
    size_t rows = rndz(1, 23);
    size_t r0 = rnd() % 3 == 0 ? 0 : rndz(0, rows - 1), r1 = rndz(r0 + 1, rows);
    size_t ldy = rows + rndz(0, 3);
    uint64_t rb;
    assert_int_equal(dtype_row_bytes(wt, cols, &rb), 0);
    float *src = malloc(rows * cols * sizeof(float)), *wf = malloc(rows * cols * sizeof(float));
    uint8_t *w = malloc(rows * rb);
    float *x = malloc(n * cols * sizeof(float));
    assert_true(src && wf && w && x);
    for (size_t i = 0; i < rows * cols; i++)
        src[i] = gauss() * (i / 256 % 3 == 0 ? 0.1f : 1.0f) + (i / 256 % 5 == 0 ? 0.5f : 0.0f);
    for (size_t r = 0; r < rows; r++) {
        assert_int_equal(kern_quantize_row_kq(wt, src + r * cols, w + r * rb, cols), 0);
        kern_row_to_f32(wt, w + r * rb, wf + r * cols, cols);
    }
    for (size_t i = 0; i < n * cols; i++)
        x[i] = rndf() * (rnd() % 8 == 0 ? 10.0f : 1.0f);

    size_t act_bytes;
    assert_int_equal(kern_act_bytes(wt, cols, n, &act_bytes), 0);
    void *buf = aligned_alloc(64, act_bytes);
    assert_non_null(buf);
    struct kern_act a;
    kern_act_init(&a, wt, x, cols, n, buf);
    kern_act_prepare(&a, 0, n);

    size_t cnt = n * ldy;
    float *s = malloc(cnt * sizeof(float)), *qb = malloc(cnt * sizeof(float));
    float *want = malloc(cnt * sizeof(float)), *twin = malloc(cnt * sizeof(float));
    float *y = malloc(cnt * sizeof(float)), *tol = malloc(cnt * sizeof(float));
    assert_true(s && qb && want && twin && y && tol);
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double sum = 0, qerr = 0;
            for (size_t c = 0; c < cols; c++)
                sum += (fabs((double)wf[r * cols + c]) + 2.0 * min_term(wt, w + r * rb, c)) *
                       fabs((double)x[t * cols + c]);
            for (size_t b = 0; b < cols / 32; b++) {
                double wabs = 0;
                for (size_t c = b * 32; c < b * 32 + 32; c++)
                    wabs += fabs(wf[r * cols + c]);
                qerr += a.d[t * a.cp / 32 + b] / 2 * wabs;
            }
            s[t * ldy + r] = (float)sum;
            qb[t * ldy + r] = (float)qerr;
        }
    fill(want, cnt, SENTINEL);
    kern_matmul_ref(wt, w, cols, x, n, want, ldy, r0, r1);

    char what[160];
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const struct variant *vr = &variants[v];
        if (vr->wt != wt || vr->isa != g_isa)
            continue;
        fill(twin, cnt, SENTINEL);
        fill(y, cnt, SENTINEL);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = 1e-5f * s[i] + 1e-30f;
        vr->twin(w, &a, twin, ldy, r0, r1);
        vr->fn(w, &a, y, ldy, r0, r1);
        ran[vr->isa]++;
        snprintf(what, sizeof what, "%s vs its twin", vr->name);
        check_close(what, y, twin, tol, n, ldy, r0, r1, cols);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = qb[i] + 2e-5f * s[i] + 1e-30f;
        snprintf(what, sizeof what, "%s's twin vs kern_matmul_ref", vr->name);
        check_close(what, twin, want, tol, n, ldy, r0, r1, cols);
    }
    if (g_isa != KERN_ISA_REF) {
        /* batch invariance: a token's outputs are the same bits whether it runs alone (gemv,
         * n = 1) or in a tile with others (gemm), so n and the neighbours change nothing */
        kern_mm_fn *gv = NULL, *gm = NULL;
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++)
            if (variants[v].wt == wt && variants[v].isa == g_isa)
                *(strstr(variants[v].name, "gemv") ? &gv : &gm) = variants[v].fn;
        fill(twin, cnt, SENTINEL);
        fill(y, cnt, SENTINEL);
        gm(w, &a, y, ldy, r0, r1);
        for (size_t t = 0; t < n; t++) {
            struct kern_act one = a; /* token t alone: the prepared arrays offset by t rows */
            one.n = 1;
            one.x = a.x + t * cols;
            one.q = a.q + t * a.ld;
            one.d = a.d + t * a.cp / 32;
            one.ns32 = a.ns32 + t * a.cp / 32;
            one.ns4 = a.ns4 + t * a.cp / 4;
            one.d4 = a.d4 + t * a.cp / 4;
            gv(w, &one, twin + t * ldy, ldy, r0, r1);
        }
        if (memcmp(y, twin, cnt * sizeof(float)) != 0)
            fail_msg("%s %s: gemm over %zu tokens differs from gemv token by token", di->name,
                     kern_isa_name(g_isa), n);
    }
    if (wt == DT_Q4_K || wt == DT_Q6_K) {
        /* the panels' row range starts on a panel: want for the rows below r0 too */
        fill(want, cnt, SENTINEL);
        kern_matmul_ref(wt, w, cols, x, n, want, ldy, r0 / 16 * 16, r1);
        check_panels_kq(wt, w, rows, cols, rb, &a, ldy, r0, r1, s, qb, want);
        fill(want, cnt, SENTINEL);
        kern_matmul_ref(wt, w, cols, x, n, want, ldy, r0, r1);
    }
    {
        const enum kern_isa isa = g_isa;
        fill(y, cnt, SENTINEL);
        fill(twin, cnt, SENTINEL);
        for (size_t i = 0; i < cnt; i++)
            tol[i] = (isa != KERN_ISA_REF ? qb[i] : 0.0f) + 2e-5f * s[i] + 1e-30f;
        kern_matmul(wt, w, cols, x, n, y, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul(%s, %s)", di->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, y, want, tol, n, ldy, r0, r1, cols);
        kern_act_prepare(&a, 0, n);
        kern_matmul_act(w, &a, twin, ldy, r0, r1);
        snprintf(what, sizeof what, "kern_matmul_act(%s, %s)", di->name,
                 kern_isa_name((enum kern_isa)isa));
        check_close(what, twin, want, tol, n, ldy, r0, r1, cols);
    }
    free(tol);
    free(y);
    free(twin);
    free(want);
    free(qb);
    free(s);
    free(buf);
    free(x);
    free(w);
    free(wf);
    free(src);
}

static void test_matmul(void **state)
{
    g_isa = isa_case_begin(state)->isa;
    static const size_t ns[] = {1, 2, 3, 4, 5, 8, 17};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++)
            for (int c = 0; c < 4; c++)
                run_case(types[k], (c == 0 ? 1 : rndz(1, 9)) * 256, ns[in]);
    printf("variant checks: %s %u\n", kern_isa_name(g_isa), ran[g_isa]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_independent),
        cmocka_unit_test(test_quantize),
        cmocka_unit_test(test_quantize_llama_bytes),
        cmocka_unit_test(test_quantize_rows),
        ISA_CASE_TESTS(test_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
