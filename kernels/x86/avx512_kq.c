/*
 * avx512_kq.c — GEMV/GEMM for the GGUF k-quants (q4_K, q5_K, q6_K; kernels/include/quant.h)
 * with AVX-512 VNNI against the q8_0 activations (int8 blocks of 32; kern.h struct kern_act).
 * kernels/ref_kq.c (mm_kq_ref) is the specification.
 *
 * A super-block is unpacked once per row and token tile into 4 vectors of 64 unsigned codes
 * (q4_K 0..15, q5_K 0..31, q6_K 0..63) in element order; vpdpbusd multiplies them by 64 int8
 * activations into 16 lanes of 4 products. Lanes keep their own f32 sums: lane scale =
 * (d * sub-block scale) x (activation block scale, kern_act d), formed once per sub-block
 * and permuted to the lanes, so no horizontal work until the row is done. The q4_K/q5_K mins
 * go to a separate 8-lane sum, (dmin m_j / 8) x dx_b x ns32_b (ns32 = -8 x the block's quant
 * sum); q6_K's -32 offset starts each dot product at 4 x ns4 (= -32 x the lane's quant sum),
 * so the integer sums are those of the _ref twin.
 * gemv runs one token per row pass (two accumulators to hide the FMA latency); gemm runs tiles
 * of up to 4 tokens over each unpacked super-block.
 */
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AI_ static inline __attribute__((always_inline))
#define TILE 4 /* tokens per gemm tile */

/* Lane -> sub-block scale index for chunk c (64 elements): q4_K/q5_K 2c + lane/8, q6_K
 * 4c + lane/4. */
static const int32_t idx45[4][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7}};
static const int32_t idx6[4][16] = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
    {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
    {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};

/* q6_K: sub-block k (16 elements) -> its activation block k / 2 */
static const int32_t idx_half[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};

/* F16C's conversion (exact, like half_f16_to_f32, without its branches). */
static inline float f16_at(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

/* Per-token pointers of a tile. */
struct tok {
    const int8_t *q;     /* [cp] quants */
    const float *d;      /* [cp/32] block scales */
    const int32_t *ns4;  /* [cp/4] */
    const int32_t *ns32; /* [cp/32] */
};

/* Unpacks super-block blk into w[4] (64 codes each) and the sub-block scales *scs (q4_K/q5_K:
 * d sc_j in lanes 0..7; q6_K: d sc_k in 16 lanes); msc gets q4_K/q5_K's 8 min factors
 * dmin m_j / 8. */
AI_ void unpack(enum dtype wt, const uint8_t *blk, __m512i w[4], __m512 *scs, __m256 *msc)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    if (wt == DT_Q6_K) {
        const struct quant_q6_k *b = (const void *)blk;
        const __m512 sc = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)b->scales))),
            _mm512_set1_ps(_cvtsh_ss(b->d)));
        const __m512i hb = _mm512_set1_epi8(0x30);
        #pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(b->qh + 32 * h)));
            /* [qh | qh >> 2]: bits 4-5 of A are the high bits of quarters 2, 3 and of A << 4
             * those of quarters 0, 1 (byte-crossing bits of the 16-bit shifts are masked) */
            __m512i A = _mm512_mask_srli_epi16(qh, 0xffff0000u, qh, 2);
            w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, lo4),
                                       _mm512_and_si512(_mm512_slli_epi16(A, 4), hb));
            w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), lo4),
                                           _mm512_and_si512(A, hb));
        }
        *scs = sc;
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
    *scs = _mm512_castps256_ps512(sc); /* the indices read lanes 0..7 only */
    const uint8_t *qs = blk + (wt == DT_Q4_K ? 16 : 48);
    __m512i A = _mm512_setzero_si512();
    if (wt == DT_Q5_K) {
        /* broadcast loads and masked shifts build [x | x >> s] without a lane-crossing op */
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(blk + 16)));
        A = _mm512_mask_srli_epi16(qh, 0xffff0000u, qh, 1);
    }
    #pragma GCC unroll 8
    for (int c = 0; c < 4; c++) {
        __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(qs + 32 * c)));
        w[c] = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xffff0000u, q, 4), lo4);
        if (wt == DT_Q5_K) {
            /* bit 2c of A's low half and (qh >> 1)'s high half -> bit 4 */
            __m512i h = _mm512_srl_epi16(A, _mm_cvtsi32_si128(2 * c));
            w[c] = _mm512_or_si512(w[c], _mm512_and_si512(_mm512_slli_epi16(h, 4),
                                                          _mm512_set1_epi8(0x10)));
        }
    }
}

/* y of one row for nt tokens (nt <= TILE, a constant after inlining). */
AI_ void row_tile(enum dtype wt, const uint8_t *row, size_t nsb, size_t bb, const struct tok *tk,
                  int nt, float *out)
{
    __m512 acc[TILE][2];
    __m256 macc[TILE];
    #pragma GCC unroll 8
    for (int u = 0; u < nt; u++) {
        acc[u][0] = acc[u][1] = _mm512_setzero_ps();
        macc[u] = _mm256_setzero_ps();
    }
    for (size_t s = 0; s < nsb; s++) {
        __m512i w[4];
        __m512 scs;
        __m256 msc = _mm256_setzero_ps();
        unpack(wt, row + s * bb, w, &scs, &msc);
        #pragma GCC unroll 8
        for (int u = 0; u < nt; u++) {
            const size_t e = s * QUANT_K;
            /* (d sc) x dx_b once per sub-block, then spread over the lanes: the products the
             * lanes had from sv x d4 (one multiply per super-block instead of 4 + 4 loads) */
            const __m256 dx8 = _mm256_loadu_ps(tk[u].d + s * 8); /* [8] activation blocks */
            const __m512 cs =
                wt == DT_Q6_K
                    ? _mm512_mul_ps(scs, _mm512_permutexvar_ps(_mm512_loadu_si512(idx_half),
                                                               _mm512_castps256_ps512(dx8)))
                    : _mm512_castps256_ps512(_mm256_mul_ps(_mm512_castps512_ps256(scs), dx8));
            #pragma GCC unroll 8
            for (int c = 0; c < 4; c++) {
                __m512i x = _mm512_loadu_si512(tk[u].q + e + 64 * (size_t)c);
                __m512i init = wt == DT_Q6_K
                                   ? _mm512_slli_epi32(_mm512_loadu_si512(tk[u].ns4 + e / 4 + 16 * (size_t)c), 2)
                                   : _mm512_setzero_si512();
                __m512i dot = _mm512_dpbusd_epi32(init, w[c], x);
                __m512 ls = _mm512_permutexvar_ps(
                    _mm512_loadu_si512(wt == DT_Q6_K ? idx6[c] : idx45[c]), cs);
                acc[u][c & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), ls, acc[u][c & 1]);
            }
            if (wt != DT_Q6_K) {
                const __m256i ns8 = _mm256_loadu_si256((const void *)(tk[u].ns32 + s * 8));
                __m256 sb = _mm256_mul_ps(dx8, _mm256_cvtepi32_ps(ns8));
                macc[u] = _mm256_fmadd_ps(msc, sb, macc[u]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int u = 0; u < nt; u++) {
        float v = _mm512_reduce_add_ps(_mm512_add_ps(acc[u][0], acc[u][1]));
        if (wt != DT_Q6_K) {
            __m128 m = _mm_add_ps(_mm256_castps256_ps128(macc[u]), _mm256_extractf128_ps(macc[u], 1));
            m = _mm_add_ps(m, _mm_movehl_ps(m, m));
            m = _mm_add_ss(m, _mm_movehdup_ps(m));
            v += _mm_cvtss_f32(m);
        }
        out[u] = v;
    }
}

static struct tok tok_of(const struct kern_act *a, size_t t)
{
    struct tok k = {a->q + t * a->ld, a->d + t * a->cp / 32, a->ns4 + t * a->cp / 4,
                    a->ns32 + t * a->cp / 32};
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
        struct tok tk[TILE] = {{NULL, NULL, NULL, NULL}};
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
    void kern_gemv_##wty##_q8_0_avx512(const void *w, const struct kern_act *a, float *y,    \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        mm_kq(DT, 1, w, a, y, ldy, r0, r1);                                                  \
    }                                                                                        \
    void kern_gemm_##wty##_q8_0_avx512(const void *w, const struct kern_act *a, float *y,    \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        mm_kq(DT, TILE, w, a, y, ldy, r0, r1);                                               \
    }
KQ_(q4_k, DT_Q4_K)
KQ_(q5_k, DT_Q5_K)
KQ_(q6_k, DT_Q6_K)
