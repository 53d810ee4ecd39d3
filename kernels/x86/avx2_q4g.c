/*
 * avx2_q4g.c — AVX2 kernels for the int4 group types (q4_g64, q4_g128, q4z_g32, q4z_g64,
 * q4z_g128; kernels/include/quant.h) against int8 activations (compiled with -mavx2 -mfma -mf16c).
 *
 * As avx2_q.c's q4_0 gemv: one nibble array (32 columns) per ymm of unsigned codes 0..15;
 * vpmaddubsw with the signed activation quants (at most 2*15*127 per int16 pair, far from
 * saturation) then vpmaddwd with ones leaves lane l = the sum over columns 4l..4l+3, the
 * layout of kern_act.ns4.
 *  - q4_gN: adding ns4 = -8 * (sum of the 4 quants) makes the codes q - 8 exactly.
 *  - q4z_gN: the offset term m * dx * sum(xq) is folded per lane as (-m/8) * ns4 (exact).
 * Every block of 32 activations has one scale dx, so dx * dw is one broadcast per block.
 * gemv: 1 row x up to 2 tokens, two accumulators per output (even/odd blocks), prefetched;
 * gemm: 2 rows x 4 tokens reusing each unpacked ymm (no packing, see avx512_q4g.c).
 */
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define PF_DIST 2048 /* as avx2_q.c */

INLINE float load_f16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

/* The 32 codes (0..15) of the nibble array at qs, in element order. */
INLINE __m256i nibbles(const uint8_t *qs)
{
    __m256i z = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    z = _mm256_srlv_epi64(z, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
}

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Columns [c, c+32) of NR rows x NT tokens, added into acc (registers after inlining): per
 * row i the nibble array qs[i] under the header (scale, offset) hs[i]. */
INLINE void block(int Z, int NR, const uint8_t *const *hs, const uint8_t *const *qs,
                  const struct kern_act *a, size_t t, int NT, size_t c, __m256 acc[4][4])
{
    const size_t cp = a->cp;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i wz[4];
    float dw[4], mw[4];
    UNROLL for (int i = 0; i < NR; i++)
    {
        wz[i] = nibbles(qs[i]);
        dw[i] = load_f16(hs[i]);
        mw[i] = Z ? load_f16(hs[i] + 2) * -0.125f : 0.0f;
    }
    UNROLL for (int j = 0; j < NT; j++)
    {
        size_t tj = t + (size_t)j;
        __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + tj * a->ld + c));
        __m256i ns = _mm256_loadu_si256((const __m256i *)(a->ns4 + tj * cp / 4 + c / 4));
        float dx = a->d[tj * cp / 32 + c / 32];
        UNROLL for (int i = 0; i < NR; i++)
        {
            __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wz[i], q), ones);
            if (Z) {
                __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw[i]),
                                           _mm256_mul_ps(_mm256_cvtepi32_ps(ns),
                                                         _mm256_set1_ps(mw[i])));
                acc[i][j] = _mm256_fmadd_ps(f, _mm256_set1_ps(dx), acc[i][j]);
            } else {
                dot = _mm256_add_epi32(dot, ns);
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw[i] * dx),
                                            acc[i][j]);
            }
        }
    }
}

/*
 * NR rows x NT tokens of a type with G blocks of 32 per group and, if Z, an offset. The main
 * loop walks 128 columns (4 nibble arrays) with plain pointer steps, alternating two
 * accumulator sets so that each output has two independent FMA chains.
 */
INLINE void tile(int G, int Z, const uint8_t *w, size_t rb, size_t r, int NR,
                 const struct kern_act *a, size_t t, int NT, float *y, size_t ldy, int pf)
{
    const size_t hd = Z ? 4 : 2, bb = hd + 16 * (size_t)G, cols = a->cols;
    const uint8_t *p[4], *hs[4], *qs[4];
    __m256 acc0[4][4], acc1[4][4];
    UNROLL for (int i = 0; i < NR; i++)
    {
        p[i] = w + (r + (size_t)i) * rb;
        UNROLL for (int j = 0; j < NT; j++) acc0[i][j] = acc1[i][j] = _mm256_setzero_ps();
    }
    size_t c = 0;
    for (; c + 128 <= cols; c += 128) {
        UNROLL for (int k = 0; k < 4; k++)
        {
            /* array k of this 128: block k / G, array k % G of it */
            UNROLL for (int i = 0; i < NR; i++)
            {
                if (pf && k == 0)
                    _mm_prefetch((const char *)p[i] + PF_DIST, _MM_HINT_T0);
                hs[i] = p[i] + (size_t)(k / G) * bb;
                qs[i] = hs[i] + hd + 16 * (size_t)(k % G);
            }
            block(Z, NR, hs, qs, a, t, NT, c + 32 * (size_t)k, k & 1 ? acc1 : acc0);
        }
        UNROLL for (int i = 0; i < NR; i++) p[i] += 4 / G * bb;
    }
    for (; c < cols; c += 32) {
        /* fewer than 128 columns left (G = 1 or 2): array (c / 32) % G of the current block */
        size_t k = (c / 32) % (size_t)G;
        UNROLL for (int i = 0; i < NR; i++)
        {
            hs[i] = p[i];
            qs[i] = p[i] + hd + 16 * k;
            if (k + 1 == (size_t)G)
                p[i] += bb;
        }
        block(Z, NR, hs, qs, a, t, NT, c, acc0);
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int i = 0; i < NR; i++)
        y[(t + (size_t)j) * ldy + r + (size_t)i] = hsum8(_mm256_add_ps(acc0[i][j], acc1[i][j]));
}

/* Rows [r0, r1) x all tokens in tiles of at most MR x MT (MR <= 2, MT <= 4). */
INLINE void run(int G, int Z, enum dtype dt, int MR, int MT, int pf, const void *w,
                const struct kern_act *a, float *y, size_t ldy, size_t r0, size_t r1)
{
    const size_t rb = kern__row_bytes(dt, a->cols);
    for (size_t r = r0; r < r1; r += (size_t)MR) {
        size_t nr = r1 - r < (size_t)MR ? r1 - r : (size_t)MR;
        for (size_t t = 0; t < a->n; t += (size_t)MT) {
            size_t nt = a->n - t < (size_t)MT ? a->n - t : (size_t)MT;
            switch (nr * 16 + nt) {
#define CASE_(R, T)                                                                          \
    case R * 16 + T:                                                                         \
        if (R <= MR && T <= MT)                                                              \
            tile(G, Z, w, rb, r, R, a, t, T, y, ldy, pf);                                    \
        break;
                CASE_(1, 1) CASE_(1, 2) CASE_(1, 3) CASE_(1, 4) CASE_(2, 1) CASE_(2, 2)
                CASE_(2, 3) CASE_(2, 4)
#undef CASE_
            }
        }
    }
}

#define Q4G_ENTRY_(wty, DT, G, Z)                                                            \
    void kern_gemv_##wty##_q8_0_avx2(const void *w, const struct kern_act *a, float *y,      \
                                     size_t ldy, size_t r0, size_t r1)                       \
    {                                                                                        \
        run(G, Z, DT, 1, 2, 1, w, a, y, ldy, r0, r1);                                        \
    }                                                                                        \
    void kern_gemm_##wty##_q8_0_avx2(const void *w, const struct kern_act *a, float *y,      \
                                     size_t ldy, size_t r0, size_t r1)                       \
    {                                                                                        \
        run(G, Z, DT, 2, 4, 0, w, a, y, ldy, r0, r1);                                        \
    }

Q4G_ENTRY_(q4_g64, DT_Q4_G64, 2, 0)
Q4G_ENTRY_(q4_g128, DT_Q4_G128, 4, 0)
Q4G_ENTRY_(q4z_g32, DT_Q4Z_G32, 1, 1)
Q4G_ENTRY_(q4z_g64, DT_Q4Z_G64, 2, 1)
Q4G_ENTRY_(q4z_g128, DT_Q4Z_G128, 4, 1)
