/*
 * avx2_kq.c — GEMV/GEMM for the GGUF k-quants (q4_K, q5_K, q6_K; kernels/include/quant.h)
 * with AVX2 against the q8_0 activations (int8 blocks of 32; kern.h struct kern_act).
 * kernels/ref_kq.c (mm_kq_ref) is the specification.
 *
 * A super-block is unpacked once per row and token tile into 8 vectors of 32 unsigned codes
 * (one per activation block); vpmaddubsw + vpmaddwd give 8 lanes of 4 products each (|pair|
 * <= 63 * 127 * 2 < 2^15: no saturation). As in avx512_kq.c, lanes keep f32 sums scaled by
 * (d * sub-block scale) x dx_b, mins go to an 8-lane sum over the blocks' ns32, and q6_K's
 * -32 offset starts each lane at 4 x ns4. gemv: one token per row pass; gemm: tiles of up to
 * 4 tokens over each unpacked super-block.
 */
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AI_ static inline __attribute__((always_inline))
#define TILE 4 /* tokens per gemm tile */

/* F16C's conversion (exact, like half_f16_to_f32, without its branches). */
static inline float f16_at(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

struct tok {
    const int8_t *q;     /* [cp] quants */
    const float *d;      /* [cp/32] block scales */
    const float *d4;     /* [cp/4] lane scales */
    const int32_t *ns4;  /* [cp/4] */
    const int32_t *ns32; /* [cp/32] */
};

/* Unpacks super-block blk into w[8] (32 codes per activation block) and the lane scales
 * sv[8]; msc gets q4_K/q5_K's 8 min factors dmin m_j / 8. */
AI_ void unpack(enum dtype wt, const uint8_t *blk, __m256i w[8], __m256 sv[8], __m256 *msc)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    if (wt == DT_Q6_K) {
        const struct quant_q6_k *b = (const void *)blk;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        __m128i s16 = _mm_loadu_si128((const void *)b->scales);
        const __m256 sc[2] = {
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)), d),
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8))), d)};
        const __m256i hb = _mm256_set1_epi8(0x30);
        #pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m256i qa = _mm256_loadu_si256((const void *)(b->ql + 64 * h));
            __m256i qb = _mm256_loadu_si256((const void *)(b->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const void *)(b->qh + 32 * h));
            /* quarter k's high bits are qh bits 2k..2k+1, moved to bits 4-5 */
            w[4 * h] = _mm256_or_si256(_mm256_and_si256(qa, lo4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), hb));
            w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(qb, lo4),
                                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), hb));
            w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), lo4),
                                           _mm256_and_si256(qh, hb));
            w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), lo4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), hb));
        }
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* lanes 0-3: scale 2j, 4-7: 2j + 1 */
            const int k = 2 * (j % 4);
            sv[j] = _mm256_permutevar8x32_ps(sc[j / 4], _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1));
        }
        return;
    }
    uint64_t s8, m8;
    quant_kq_scales_mins64(blk + 4, &s8, &m8);
    const __m256 sc = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)s8))),
        _mm256_set1_ps(f16_at(blk)));
    *msc = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8))),
        _mm256_set1_ps(f16_at(blk + 2) * 0.125f));
    const uint8_t *qs = blk + (wt == DT_Q4_K ? 16 : 48);
    __m256i qh = _mm256_setzero_si256();
    if (wt == DT_Q5_K)
        qh = _mm256_loadu_si256((const void *)(blk + 16));
    #pragma GCC unroll 8
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const void *)(qs + 32 * c));
        w[2 * c] = _mm256_and_si256(q, lo4);
        w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
        if (wt == DT_Q5_K) {
            /* bit j of qh (sub-block j) -> bit 4 */
            const __m256i b4 = _mm256_set1_epi8(0x10);
            __m256i h0 = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c));
            __m256i h1 = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1));
            w[2 * c] = _mm256_or_si256(w[2 * c], _mm256_and_si256(_mm256_slli_epi16(h0, 4), b4));
            w[2 * c + 1] = _mm256_or_si256(w[2 * c + 1], _mm256_and_si256(_mm256_slli_epi16(h1, 4), b4));
        }
    }
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        sv[j] = _mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(j));
}

AI_ void row_tile(enum dtype wt, const uint8_t *row, size_t nsb, size_t bb, const struct tok *tk,
                  int nt, float *out)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE][2], macc[TILE];
    #pragma GCC unroll 8
    for (int u = 0; u < nt; u++) {
        acc[u][0] = acc[u][1] = _mm256_setzero_ps();
        macc[u] = _mm256_setzero_ps();
    }
    for (size_t s = 0; s < nsb; s++) {
        __m256i w[8];
        __m256 sv[8];
        __m256 msc = _mm256_setzero_ps();
        unpack(wt, row + s * bb, w, sv, &msc);
        #pragma GCC unroll 8
        for (int u = 0; u < nt; u++) {
            const size_t e = s * QUANT_K;
            #pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m256i x = _mm256_loadu_si256((const void *)(tk[u].q + e + 32 * (size_t)j));
                __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], x), ones);
                if (wt == DT_Q6_K)
                    dot = _mm256_add_epi32(dot, _mm256_slli_epi32(_mm256_loadu_si256((const void *)(tk[u].ns4 + e / 4 + 8 * (size_t)j)), 2));
                __m256 ls = _mm256_mul_ps(sv[j], _mm256_loadu_ps(tk[u].d4 + e / 4 + 8 * (size_t)j));
                acc[u][j & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), ls, acc[u][j & 1]);
            }
            if (wt != DT_Q6_K) {
                __m256 sb = _mm256_mul_ps(_mm256_loadu_ps(tk[u].d + s * 8),
                                          _mm256_cvtepi32_ps(_mm256_loadu_si256((const void *)(tk[u].ns32 + s * 8))));
                macc[u] = _mm256_fmadd_ps(msc, sb, macc[u]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int u = 0; u < nt; u++) {
        __m256 v8 = _mm256_add_ps(acc[u][0], acc[u][1]);
        if (wt != DT_Q6_K)
            v8 = _mm256_add_ps(v8, macc[u]);
        __m128 m = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[u] = _mm_cvtss_f32(m);
    }
}

static struct tok tok_of(const struct kern_act *a, size_t t)
{
    struct tok k = {a->q + t * a->ld, a->d + t * a->cp / 32, a->d4 + t * a->cp / 4,
                    a->ns4 + t * a->cp / 4, a->ns32 + t * a->cp / 32};
    return k;
}

AI_ void mm_kq(enum dtype wt, int tile, const void *w, const struct kern_act *a, float *y,
               size_t ldy, size_t r0, size_t r1)
{
    const size_t bb = sizeof(struct quant_q4_k) * (wt == DT_Q4_K) +
                      sizeof(struct quant_q5_k) * (wt == DT_Q5_K) +
                      sizeof(struct quant_q6_k) * (wt == DT_Q6_K);
    const size_t nsb = a->cols / QUANT_K, rb = nsb * bb;
    for (size_t t0 = 0; t0 < a->n; t0 += (size_t)tile) {
        const int nt = a->n - t0 < (size_t)tile ? (int)(a->n - t0) : tile;
        struct tok tk[TILE] = {{NULL, NULL, NULL, NULL, NULL}};
        #pragma GCC unroll 8
        for (int u = 0; u < nt; u++)
            tk[u] = tok_of(a, t0 + (size_t)u);
        for (size_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w + r * rb;
            float out[TILE];
            switch (nt) { /* constant tile sizes, so the accumulators stay in registers */
            case 1: row_tile(wt, row, nsb, bb, tk, 1, out); break;
            case 2: row_tile(wt, row, nsb, bb, tk, 2, out); break;
            case 3: row_tile(wt, row, nsb, bb, tk, 3, out); break;
            default: row_tile(wt, row, nsb, bb, tk, 4, out); break;
            }
            #pragma GCC unroll 8
            for (int u = 0; u < nt; u++)
                y[(t0 + (size_t)u) * ldy + r] = out[u];
        }
    }
}

#define KQ_(wty, DT)                                                                         \
    void kern_gemv_##wty##_q8_0_avx2(const void *w, const struct kern_act *a, float *y,      \
                                     size_t ldy, size_t r0, size_t r1)                       \
    {                                                                                        \
        mm_kq(DT, 1, w, a, y, ldy, r0, r1);                                                  \
    }                                                                                        \
    void kern_gemm_##wty##_q8_0_avx2(const void *w, const struct kern_act *a, float *y,      \
                                     size_t ldy, size_t r0, size_t r1)                       \
    {                                                                                        \
        mm_kq(DT, TILE, w, a, y, ldy, r0, r1);                                               \
    }
KQ_(q4_k, DT_Q4_K)
KQ_(q5_k, DT_Q5_K)
KQ_(q6_k, DT_Q6_K)
