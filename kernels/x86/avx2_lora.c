/*
 * avx2_lora.c — LoRA shrink and expand with f32 or bf16 adapter weights and f32 activations
 * on AVX2+FMA (kern.h, "LoRA shrink and expand"; the scalar twins are kernels/lora_kern.c).
 * bf16 weights are widened exactly (a shift per 8 weights), so these give the f32 results up
 * to the order of the sums; AVX512-BF16 machines take kern_lora_*_bf16_bf16_avx512 instead.
 *
 * shrink: rank rows are dot products along `in`; up to 4 rank rows x 1-2 tokens (decode) or
 *   2 rows x 4 tokens share each load. expand: a B^T panel row (32 columns) is loaded once for
 *   a pair of tokens; with more tokens the panel is widened once into a stack copy.
 * int8 weights (kern.h "on int8 adapter weights"): vpmaddubsw on |q| (the +128 codes XORed
 *   back to signed) and the activations with q's sign moved onto them (vpsignb), so no pair
 *   sum exceeds 2 * 127 * 127 (no saturation); the integer sums are exact: the same bits as
 *   the scalar twin.
 */
#include "internal.h"

#include "check.h"
#include "half.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

/* ---- int8 weights: vpmaddubsw -------------------------------------------------------------- */

/* kern_lora_i8_quant's rule on n floats into q [round_up(n, 32)] (zeros past n), as
 * quant_x512 in avx512_lora.c: the same max, 127 / max and rounding, so the same codes. */
static float quant_x256(const float *v, size_t n, int8_t *q)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    /* max(|v|, m): a NaN is skipped as in the reference (quant_x512) */
    __m256 m4[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps()};
    size_t c = 0;
    for (; c + 32 <= n; c += 32)
        for (int u = 0; u < 4; u++)
            m4[u] = _mm256_max_ps(_mm256_and_ps(abs_mask, _mm256_loadu_ps(v + c + 8 * u)), m4[u]);
    for (; c + 8 <= n; c += 8)
        m4[0] = _mm256_max_ps(_mm256_and_ps(abs_mask, _mm256_loadu_ps(v + c)), m4[0]);
    const __m256 mx = _mm256_max_ps(_mm256_max_ps(m4[0], m4[1]), _mm256_max_ps(m4[2], m4[3]));
    float m8[8], amax = 0.0f;
    _mm256_storeu_ps(m8, mx);
    for (int i = 0; i < 8; i++)
        amax = m8[i] > amax ? m8[i] : amax;
    for (; c < n; c++) {
        float a = v[c] < 0 ? -v[c] : v[c];
        amax = a > amax ? a : amax;
    }
    const float idf = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 id = _mm256_set1_ps(idf);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    c = 0;
    for (; c + 32 <= n; c += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c), id));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 8), id));
        __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 16), id));
        __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + c + 24), id));
        __m256i ab = _mm256_packs_epi32(a, b), de = _mm256_packs_epi32(d, e);
        _mm256_storeu_si256((__m256i *)(q + c),
                            _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, de), perm));
    }
    for (; c < n; c++) /* cvtss2si's rounding: nearest even, like vcvtps2dq */
        q[c] = (int8_t)_mm_cvtss_si32(_mm_set_ss(v[c] * idf));
    for (; c % 32; c++)
        q[c] = 0;
    return amax / 127.0f;
}

/* sum_c (code - 128) * x over 32 bytes, added as 8 int32 lanes to acc */
static inline __m256i dot32(__m256i acc, __m256i code, __m256i x)
{
    const __m256i w = _mm256_xor_si256(code, _mm256_set1_epi8((char)0x80));
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

static inline int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 32 codes of row r from c; past `in` read as code 128 (zero) from a copy, never past the row */
static inline __m256i codes32(const uint8_t *row, size_t c, size_t in)
{
    if (in - c >= 32)
        return _mm256_loadu_si256((const __m256i *)(row + c));
    uint8_t b[32];
    memset(b, 128, sizeof b);
    memcpy(b, row + c, in - c);
    return _mm256_loadu_si256((const __m256i *)b);
}

void kern_lora_i8_quant_x_avx2(const float *x, size_t in, size_t n, int8_t *qx, float *xs,
                               int32_t *xsum)
{
    const size_t ldx = KERN_LORA_I8_LDX(in);
    for (size_t i = 0; i < n; i++) {
        int8_t *q = qx + i * ldx;
        xs[i] = quant_x256(x + i * in, in, q); /* zeros to a multiple of 32 */
        for (size_t c = (in + 31) / 32 * 32; c < ldx; c++)
            q[c] = 0;
        /* the codes' sum (the AVX-512 shrink's correction; kern.h asks for it) */
        __m256i s = _mm256_setzero_si256();
        for (size_t c = 0; c < ldx; c += 32)
            s = _mm256_add_epi32(s, _mm256_madd_epi16(
                                        _mm256_maddubs_epi16(_mm256_set1_epi8(1),
                                                             _mm256_loadu_si256((const __m256i *)(q + c))),
                                        _mm256_set1_epi16(1)));
        xsum[i] = hsum_i32(s);
    }
}

void kern_lora_shrink_i8q_avx2(const void *a, size_t in, size_t rank, const int8_t *qx,
                               const float *xs, const int32_t *xsum, size_t n, float *t,
                               size_t k0, size_t k1)
{
    (void)xsum;
    const float *sa = a;
    const uint8_t *q = (const uint8_t *)a + KERN_LORA_I8_HDR(rank);
    const size_t ldx = KERN_LORA_I8_LDX(in);
    for (size_t i0 = 0; i0 < n; i0 += 2) {
        const size_t nt = n - i0 < 2 ? n - i0 : 2;
        const int8_t *qi = qx + i0 * ldx;
        for (size_t k = k0; k < k1; k += 4) {
            const size_t kr = k1 - k < 4 ? k1 - k : 4;
            __m256i acc[4][2];
            for (size_t r = 0; r < 4; r++)
                acc[r][0] = acc[r][1] = _mm256_setzero_si256();
            for (size_t c = 0; c < in; c += 32) {
                __m256i x0 = _mm256_loadu_si256((const __m256i *)(qi + c));
                __m256i x1 = nt > 1 ? _mm256_loadu_si256((const __m256i *)(qi + ldx + c)) : x0;
                /* the next block's rows (as avx512_lora.c's shrinks): a long stream */
                if ((c & 63) == 0)
                    for (size_t r = 0; r < kr; r++)
                        _mm_prefetch((const char *)(q + (k + 4 + r) * in + c), _MM_HINT_T0);
                UNROLL4 for (size_t r = 0; r < 4; r++) {
                    if (r >= kr)
                        break;
                    __m256i w = codes32(q + (k + r) * in, c, in);
                    acc[r][0] = dot32(acc[r][0], w, x0);
                    if (nt > 1)
                        acc[r][1] = dot32(acc[r][1], w, x1);
                }
            }
            for (size_t r = 0; r < kr; r++)
                for (size_t i = 0; i < nt; i++)
                    t[(i0 + i) * rank + k + r] =
                        sa[k + r] * (xs[i0 + i] * (float)hsum_i32(acc[r][i]));
        }
    }
}

void kern_lora_shrink_i8_avx2(const void *a, size_t in, size_t rank, const float *x, size_t n,
                              float *t, size_t k0, size_t k1)
{
    CHECK(in <= KERN_LORA_I8_IN_MAX);
    _Alignas(32) int8_t qx[2 * KERN_LORA_I8_IN_MAX];
    float xs[2];
    int32_t xsum[2];
    for (size_t i0 = 0; i0 < n; i0 += 2) {
        const size_t nt = n - i0 < 2 ? n - i0 : 2;
        kern_lora_i8_quant_x_avx2(x + i0 * in, in, nt, qx, xs, xsum);
        kern_lora_shrink_i8q_avx2(a, in, rank, qx, xs, xsum, nt, t + i0 * rank, k0, k1);
    }
}

/* y += on codes of u made by kern_lora_i8_quant_u (kern.h): qu [n][KERN_LORA_I8_LDU(rank)] */
void kern_lora_expand_i8q_avx2(const void *bt, size_t rank, const int8_t *qu, const float *us,
                               const int32_t *usum, size_t n, const float *scale, float s,
                               float *y, size_t ldy, size_t j0, size_t j1)
{
    (void)usum; /* vpmaddubsw takes the codes' signs, not a +128 correction */
    const uint8_t *q = (const uint8_t *)bt + KERN_LORA_I8_HDR(rank);
    const size_t g_n = (rank + 3) / 4, P = KERN_LORA_PANEL, pbytes = g_n * 128;
    const size_t ldu = KERN_LORA_I8_LDU(rank);
    for (size_t i = 0; i < n; i++) {
        const float si = scale ? scale[i] : s;
        if (si == 0.0f)
            continue;
        const int8_t *qi = qu + i * ldu; /* zeros past rank: the padding groups add nothing */
        const float su = us[i];
        const __m256 sv = _mm256_set1_ps(si), uv = _mm256_set1_ps(su);
        float *yr = y + i * ldy;
        for (size_t pj = j0 / P * P; pj < j1; pj += P) {
            const uint8_t *pw = q + pj / P * pbytes;
            __m256i acc[4];
            for (int m = 0; m < 4; m++)
                acc[m] = _mm256_setzero_si256();
            for (size_t g = 0; g < g_n; g++) {
                int32_t t4;
                memcpy(&t4, qi + 4 * g, 4);
                const __m256i tv = _mm256_set1_epi32(t4);
                UNROLL4 for (int m = 0; m < 4; m++)
                    acc[m] = dot32(acc[m], _mm256_loadu_si256((const __m256i *)(pw + g * 128 + 32 * m)), tv);
            }
            size_t a = (pj > j0 ? pj : j0) - pj, e = (pj + P < j1 ? pj + P : j1) - pj;
            if (a == 0 && e == P) {
                for (int m = 0; m < 4; m++) {
                    __m256 d = _mm256_mul_ps(sv, _mm256_mul_ps(uv, _mm256_cvtepi32_ps(acc[m])));
                    _mm256_storeu_ps(yr + pj + 8 * m, _mm256_add_ps(_mm256_loadu_ps(yr + pj + 8 * m), d));
                }
            } else {
                int32_t v[32];
                for (int m = 0; m < 4; m++)
                    _mm256_storeu_si256((__m256i *)(v + 8 * m), acc[m]);
                for (size_t j = a; j < e; j++)
                    yr[pj + j] += si * (su * (float)v[j]);
            }
        }
    }
}

/* a token's codes (the scalar rule), then its expand */
void kern_lora_expand_i8_avx2(const void *bt, size_t rank, const float *t, size_t n,
                              const float *scale, float s, float *y, size_t ldy, size_t j0,
                              size_t j1)
{
    CHECK(rank <= KERN_LORA_RANK_MAX);
    _Alignas(32) int8_t qu[KERN_LORA_I8_LDU(KERN_LORA_RANK_MAX)];
    float us;
    int32_t usum;
    for (size_t i = 0; i < n; i++) {
        const float si = scale ? scale[i] : s;
        if (si == 0.0f)
            continue;
        kern_lora_i8_quant_u_ref(bt, rank, t + i * rank, 1, qu, &us, &usum);
        kern_lora_expand_i8q_avx2(bt, rank, qu, &us, &usum, 1, NULL, si, y + i * ldy, ldy, j0,
                                  j1);
    }
}
