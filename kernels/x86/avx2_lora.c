/*
 * avx2_lora.c — LoRA shrink and expand with f32 or bf16 adapter weights and f32 activations
 * on AVX2+FMA (kern.h, "LoRA shrink and expand"; the scalar twins are kernels/lora_kern.c).
 * bf16 weights are widened exactly (a shift per 8 weights), so these give the f32 results up
 * to the order of the sums; AVX512-BF16 machines take kern_lora_*_bf16_bf16_avx512 instead.
 *
 * shrink: rank rows are dot products along `in`; up to 4 rank rows x 1-2 tokens (decode) or
 *   2 rows x 4 tokens share each load. expand: a B^T panel row (32 columns) is loaded once for
 *   a pair of tokens; with more tokens the panel is widened once into a stack copy.
 */
#include "internal.h"

#include "half.h"

#include <immintrin.h>
#include <stdint.h>

/* expand: prefetch the next panel in software (measured: +5-15% on a decode-sized segment;
 * the same in shrink, whose rows are separate streams, measured slower, so it has none) */
#define EXPAND_PREFETCH 1
#define EXPAND_PK 64u /* ranks up to this convert a bf16 panel once into a stack buffer */
#define UNROLL4 _Pragma("GCC unroll 4")

static inline float ld_w(enum dtype dt, const void *w, size_t i)
{
    return dt == DT_BF16 ? half_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}


static inline __m256 ld8(enum dtype dt, const void *w, size_t i)
{
    if (dt == DT_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* NT tokens x KR rank rows from k (KR*NT <= 8 accumulators), A read once per NT tokens.
 * Inlined with constant KR and NT so the loops unroll into registers. */
static inline __attribute__((always_inline)) void
shrink_block(enum dtype dt, const void *a, size_t in, size_t rank, const float *x, float *t,
             size_t k, const size_t kr, const size_t nt)
{
    __m256 acc[4][4];
    UNROLL4 for (size_t q = 0; q < kr; q++)
        UNROLL4 for (size_t i = 0; i < nt; i++)
            acc[q][i] = _mm256_setzero_ps();
    size_t c = 0;
    for (; c + 8 <= in; c += 8) {
        __m256 av[4];
        UNROLL4 for (size_t q = 0; q < kr; q++)
            av[q] = ld8(dt, a, (k + q) * in + c);
        UNROLL4 for (size_t i = 0; i < nt; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * in + c);
            UNROLL4 for (size_t q = 0; q < kr; q++)
                acc[q][i] = _mm256_fmadd_ps(av[q], xv, acc[q][i]);
        }
    }
    UNROLL4 for (size_t q = 0; q < kr; q++)
        UNROLL4 for (size_t i = 0; i < nt; i++) {
            float sum = hsum8(acc[q][i]);
            for (size_t cc = c; cc < in; cc++)
                sum += x[i * in + cc] * ld_w(dt, a, (k + q) * in + cc);
            t[i * rank + k + q] = sum;
        }
}

static inline __attribute__((always_inline)) void
shrink_gen(enum dtype dt, const void *a, size_t in, size_t rank, const float *x, size_t n,
           float *t, size_t k0, size_t k1)
{
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        size_t nt = n - i0 < 4 ? n - i0 : 4;
        const float *xi = x + i0 * in;
        float *ti = t + i0 * rank;
        size_t k = k0;
        if (nt <= 2) /* decode: 4 rank rows at once, more streams in flight */
            for (; k + 4 <= k1; k += 4) {
                if (nt == 2)
                    shrink_block(dt, a, in, rank, xi, ti, k, 4, 2);
                else
                    shrink_block(dt, a, in, rank, xi, ti, k, 4, 1);
            }
        for (; k + 2 <= k1; k += 2) {
            switch (nt) {
            case 4: shrink_block(dt, a, in, rank, xi, ti, k, 2, 4); break;
            case 3: shrink_block(dt, a, in, rank, xi, ti, k, 2, 3); break;
            case 2: shrink_block(dt, a, in, rank, xi, ti, k, 2, 2); break;
            default: shrink_block(dt, a, in, rank, xi, ti, k, 2, 1); break;
            }
        }
        if (k < k1) {
            switch (nt) {
            case 4: shrink_block(dt, a, in, rank, xi, ti, k, 1, 4); break;
            case 3: shrink_block(dt, a, in, rank, xi, ti, k, 1, 3); break;
            case 2: shrink_block(dt, a, in, rank, xi, ti, k, 1, 2); break;
            default: shrink_block(dt, a, in, rank, xi, ti, k, 1, 1); break;
            }
        }
    }
}

/* c[i][0..3] = sum_k t_i[k] * panel[k][0..31] for NT (1 or 2) tokens t_i = t + i * rank: each
 * panel row is loaded (and widened) once for the NT tokens. The panel is pw in dt, or pf in
 * f32 (a stack copy). */
static inline __attribute__((always_inline)) void
expand_panel(enum dtype dt, const void *pw, const float *pf, size_t rank, const float *t,
             const size_t nt, __m256 c[2][4])
{
    UNROLL4 for (size_t i = 0; i < nt; i++)
        UNROLL4 for (int q = 0; q < 4; q++)
            c[i][q] = _mm256_setzero_ps();
    for (size_t k = 0; k < rank; k++) {
        __m256 b[4];
        UNROLL4 for (int q = 0; q < 4; q++)
            b[q] = pf ? _mm256_loadu_ps(pf + k * KERN_LORA_PANEL + 8 * q)
                      : ld8(dt, pw, k * KERN_LORA_PANEL + 8 * (size_t)q);
        UNROLL4 for (size_t i = 0; i < nt; i++) {
            __m256 tv = _mm256_broadcast_ss(t + i * rank + k);
            UNROLL4 for (int q = 0; q < 4; q++)
                c[i][q] = _mm256_fmadd_ps(tv, b[q], c[i][q]);
        }
    }
}

/* y_i[pj + a .. pj + e) += s_i * c[i] (a product then a sum, like the reference) */
static inline __attribute__((always_inline)) void
expand_store(float *yr, __m256 sv, const __m256 c[4], size_t a, size_t e)
{
    if (a == 0 && e == KERN_LORA_PANEL) {
        UNROLL4 for (int q = 0; q < 4; q++)
            _mm256_storeu_ps(yr + 8 * q,
                             _mm256_add_ps(_mm256_loadu_ps(yr + 8 * q), _mm256_mul_ps(sv, c[q])));
    } else {
        float d[KERN_LORA_PANEL] __attribute__((aligned(32)));
        for (int q = 0; q < 4; q++)
            _mm256_store_ps(d + 8 * q, _mm256_mul_ps(sv, c[q]));
        for (size_t j = a; j < e; j++)
            yr[j] += d[j];
    }
}

static inline __attribute__((always_inline)) void
expand_gen(enum dtype dt, const void *bt, size_t rank, const float *t, size_t n,
           const float *scale, float s, float *y, size_t ldy, size_t j0, size_t j1)
{
    float stage[EXPAND_PK * KERN_LORA_PANEL] __attribute__((aligned(32))); /* [rank][32] f32 */
    const size_t esz = dt == DT_BF16 ? 2 : 4;
    for (size_t pj = j0 / KERN_LORA_PANEL * KERN_LORA_PANEL; pj < j1; pj += KERN_LORA_PANEL) {
        const void *pw = (const unsigned char *)bt + pj * rank * esz; /* [rank][32] */
        /* the next panel is the next bytes: start fetching it */
        if (EXPAND_PREFETCH && pj + KERN_LORA_PANEL < j1)
            for (size_t q = 0; q < rank * KERN_LORA_PANEL * esz; q += 64)
                _mm_prefetch((const char *)pw + rank * KERN_LORA_PANEL * esz + q, _MM_HINT_T0);
        const float *pf = NULL;
        if (dt == DT_F32) {
            pf = pw;
        } else if (n > 2 && rank <= EXPAND_PK) {
            /* many tokens: widen the panel once instead of once per pair */
            for (size_t q = 0; q < rank * KERN_LORA_PANEL; q += 8)
                _mm256_store_ps(stage + q, ld8(dt, pw, q));
            pf = stage;
        }
        size_t a = (pj > j0 ? pj : j0) - pj, e = (pj + KERN_LORA_PANEL < j1 ? pj + KERN_LORA_PANEL : j1) - pj;
        size_t i = 0;
        for (; i + 2 <= n; i += 2) {
            __m256 c[2][4];
            expand_panel(dt, pw, pf, rank, t + i * rank, 2, c);
            expand_store(y + i * ldy + pj, _mm256_set1_ps(scale ? scale[i] : s), c[0], a, e);
            expand_store(y + (i + 1) * ldy + pj, _mm256_set1_ps(scale ? scale[i + 1] : s), c[1],
                         a, e);
        }
        if (i < n) {
            __m256 c[2][4];
            expand_panel(dt, pw, pf, rank, t + i * rank, 1, c);
            expand_store(y + i * ldy + pj, _mm256_set1_ps(scale ? scale[i] : s), c[0], a, e);
        }
    }
}

/* the weight dtype as a constant in each, so ld8's branch folds away */
void kern_lora_shrink_f32_f32_avx2(const void *a, size_t in, size_t rank, const float *x,
                                   size_t n, float *t, size_t k0, size_t k1)
{
    shrink_gen(DT_F32, a, in, rank, x, n, t, k0, k1);
}

void kern_lora_shrink_bf16_f32_avx2(const void *a, size_t in, size_t rank, const float *x,
                                    size_t n, float *t, size_t k0, size_t k1)
{
    shrink_gen(DT_BF16, a, in, rank, x, n, t, k0, k1);
}

void kern_lora_expand_f32_f32_avx2(const void *bt, size_t rank, const float *t, size_t n,
                                   const float *scale, float s, float *y, size_t ldy,
                                   size_t j0, size_t j1)
{
    expand_gen(DT_F32, bt, rank, t, n, scale, s, y, ldy, j0, j1);
}

void kern_lora_expand_bf16_f32_avx2(const void *bt, size_t rank, const float *t, size_t n,
                                    const float *scale, float s, float *y, size_t ldy,
                                    size_t j0, size_t j1)
{
    expand_gen(DT_BF16, bt, rank, t, n, scale, s, y, ldy, j0, j1);
}
