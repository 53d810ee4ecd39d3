/*
 * avx512_lora.c — the bf16 LoRA shrink and expand on AVX512-BF16 (kern.h, "LoRA shrink and
 * expand in bf16"; the scalar twins are kernels/lora_ref.c).
 *
 * Why vdpbf16ps: a LoRA update streams its adapter weights once per step and does only a few
 * multiply-adds per weight (one per token of the adapter's segment, 1-2 in decode). Widening
 * bf16 to f32 costs two instructions per 8 weights on AVX2, which made the update's kernels
 * compute-bound next to the memory stream; vdpbf16ps takes 32 bf16 weights as they are, so
 * the update becomes one load and one instruction per token per 32 weights.
 *
 * shrink: rank rows are dot products along `in`, where both A and x are contiguous: x is
 *   rounded to bf16 32 columns at a time (once per block of up to 4 rank rows) and each
 *   (rank row, token) pair keeps one 16-lane accumulator, reduced at the end.
 * expand: B^T panels hold 32 columns per rank row; vdpbf16ps wants pairs along the summed
 *   index (rank), so rows k and k+1 are interleaved in registers (vpunpck{l,h}wd: per 128-bit
 *   lane, columns 8L..8L+3 and 8L+4..8L+7) and the two accumulators are put back in column
 *   order once per panel. t's pairs are rounded to bf16 once per token block.
 * Every token has its own accumulators over the same sequence of instructions, so its result
 * does not depend on which tokens share the call.
 */
#include "internal.h"

#include <immintrin.h>
#include <stdint.h>

#define TGT __attribute__((always_inline)) static inline
#define UNROLL _Pragma("GCC unroll 4")

/* 32 columns of x from c as bf16 (lanes past `in` are 0 and never read) */
TGT __m512bh x32(const float *x, size_t c, size_t in)
{
    size_t m = in - c;
    __m512 lo, hi;
    if (m >= 32) {
        lo = _mm512_loadu_ps(x + c);
        hi = _mm512_loadu_ps(x + c + 16);
    } else {
        __mmask16 ml = (__mmask16)(m >= 16 ? 0xffffu : (1u << m) - 1u);
        __mmask16 mh = (__mmask16)(m > 16 ? (1u << (m - 16)) - 1u : 0u);
        lo = _mm512_maskz_loadu_ps(ml, x + c);
        hi = _mm512_maskz_loadu_ps(mh, x + c + 16);
    }
    return _mm512_cvtne2ps_pbh(hi, lo);
}

TGT __m512bh a32(const uint16_t *a, size_t c, size_t in)
{
    size_t m = in - c;
    if (m >= 32)
        return (__m512bh)_mm512_loadu_si512(a + c);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1u << m) - 1u), a + c);
}

/* KR rank rows from k x NT tokens (constants after inlining) */
TGT void shrink_block(const uint16_t *a, size_t in, size_t rank, const float *x, float *t,
                      size_t k, const size_t kr, const size_t nt)
{
    __m512 acc[4][4];
    UNROLL for (size_t q = 0; q < kr; q++)
        UNROLL for (size_t i = 0; i < nt; i++)
            acc[q][i] = _mm512_setzero_ps();
    for (size_t c = 0; c < in; c += 32) {
        __m512bh xv[4];
        UNROLL for (size_t i = 0; i < nt; i++)
            xv[i] = x32(x + i * in, c, in);
        UNROLL for (size_t q = 0; q < kr; q++) {
            __m512bh av = a32(a + (k + q) * in, c, in);
            UNROLL for (size_t i = 0; i < nt; i++)
                acc[q][i] = _mm512_dpbf16_ps(acc[q][i], av, xv[i]);
        }
    }
    UNROLL for (size_t q = 0; q < kr; q++)
        UNROLL for (size_t i = 0; i < nt; i++)
            t[i * rank + k + q] = _mm512_reduce_add_ps(acc[q][i]);
}

TGT void shrink_tokens(const uint16_t *a, size_t in, size_t rank, const float *x, float *t,
                       size_t k0, size_t k1, const size_t nt)
{
    size_t k = k0;
    for (; k + 4 <= k1; k += 4)
        shrink_block(a, in, rank, x, t, k, 4, nt);
    switch (k1 - k) {
    case 3: shrink_block(a, in, rank, x, t, k, 3, nt); break;
    case 2: shrink_block(a, in, rank, x, t, k, 2, nt); break;
    case 1: shrink_block(a, in, rank, x, t, k, 1, nt); break;
    default: break;
    }
}

void kern_lora_shrink_bf16_bf16_avx512(const void *a_, size_t in, size_t rank,
                                       const float *x, size_t n, float *t, size_t k0, size_t k1)
{
    const uint16_t *a = a_;
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        const float *xi = x + i0 * in;
        float *ti = t + i0 * rank;
        switch (n - i0 < 4 ? n - i0 : 4) {
        case 4: shrink_tokens(a, in, rank, xi, ti, k0, k1, 4); break;
        case 3: shrink_tokens(a, in, rank, xi, ti, k0, k1, 3); break;
        case 2: shrink_tokens(a, in, rank, xi, ti, k0, k1, 2); break;
        default: shrink_tokens(a, in, rank, xi, ti, k0, k1, 1); break;
        }
    }
}

/* The accumulators' lanes back in column order: lo holds columns 8L+0..3 of each 128-bit
 * lane L, hi columns 8L+4..7. */
static const int32_t col_idx[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                    8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

/* y_i[a, e) of one panel += s_i * (columns of lo/hi), for NT tokens */
TGT void expand_panel(const uint16_t *pw, size_t rank, const uint32_t *tp, size_t kp_n,
                      const float *si, float *y, size_t ldy, size_t a, size_t e,
                      const size_t nt)
{
    __m512 lo[4], hi[4];
    UNROLL for (size_t i = 0; i < nt; i++) {
        lo[i] = _mm512_setzero_ps();
        hi[i] = _mm512_setzero_ps();
    }
    for (size_t kp = 0; kp < kp_n; kp++) {
        __m512i r0 = _mm512_loadu_si512(pw + 2 * kp * KERN_LORA_PANEL);
        __m512i r1 = 2 * kp + 1 < rank ? _mm512_loadu_si512(pw + (2 * kp + 1) * KERN_LORA_PANEL)
                                       : _mm512_setzero_si512();
        __m512bh wl = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
        __m512bh wh = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
        UNROLL for (size_t i = 0; i < nt; i++) {
            __m512bh tv = (__m512bh)_mm512_set1_epi32((int)tp[i * kp_n + kp]);
            lo[i] = _mm512_dpbf16_ps(lo[i], wl, tv);
            hi[i] = _mm512_dpbf16_ps(hi[i], wh, tv);
        }
    }
    const __m512i i0 = _mm512_loadu_si512(col_idx), i1 = _mm512_loadu_si512(col_idx + 16);
    /* columns [a, e) of the panel */
    uint32_t m = (uint32_t)((e >= 32 ? ~0ull : (1ull << e) - 1u) & ~((1ull << a) - 1u));
    __mmask16 m0 = (__mmask16)(m & 0xffffu), m1 = (__mmask16)(m >> 16);
    UNROLL for (size_t i = 0; i < nt; i++) {
        if (si[i] == 0.0f)
            continue;
        __m512 sv = _mm512_set1_ps(si[i]);
        __m512 c0 = _mm512_permutex2var_ps(lo[i], i0, hi[i]);
        __m512 c1 = _mm512_permutex2var_ps(lo[i], i1, hi[i]);
        float *yr = y + i * ldy;
        /* a product then a sum, like the reference */
        _mm512_mask_storeu_ps(yr, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, yr),
                                                    _mm512_mul_ps(sv, c0)));
        _mm512_mask_storeu_ps(yr + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, yr + 16),
                                                         _mm512_mul_ps(sv, c1)));
    }
}

TGT void expand_tokens(const uint16_t *bt, size_t rank, const uint32_t *tp, size_t kp_n,
                       const float *si, float *y, size_t ldy, size_t j0, size_t j1,
                       const size_t nt)
{
    const size_t P = KERN_LORA_PANEL, pbytes = rank * P * 2;
    for (size_t pj = j0 / P * P; pj < j1; pj += P) {
        const uint16_t *pw = bt + pj * rank; /* [rank][32] */
        /* the next panel is the next bytes: start fetching it */
        if (pj + P < j1)
            for (size_t q = 0; q < pbytes; q += 64)
                _mm_prefetch((const char *)pw + pbytes + q, _MM_HINT_T0);
        size_t a = (pj > j0 ? pj : j0) - pj, e = (pj + P < j1 ? pj + P : j1) - pj;
        expand_panel(pw, rank, tp, kp_n, si, y + pj, ldy, a, e, nt);
    }
}

void kern_lora_expand_bf16_bf16_avx512(const void *bt_, size_t rank, const float *t,
                                       size_t n, const float *scale, float s, float *y,
                                       size_t ldy, size_t j0, size_t j1)
{
    const uint16_t *bt = bt_;
    const size_t kp_n = (rank + 1) / 2;
    uint32_t tp[4 * (KERN_LORA_RANK_MAX / 2)]; /* [4 tokens][kp_n]: (t[2kp], t[2kp+1]) bf16 */
    float si[4];
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        size_t nt = n - i0 < 4 ? n - i0 : 4;
        for (size_t i = 0; i < nt; i++) {
            const float *ti = t + (i0 + i) * rank;
            si[i] = scale ? scale[i0 + i] : s;
            for (size_t k = 0; k < rank; k += 32) {
                size_t m = rank - k < 32 ? rank - k : 32;
                __m512bh v = x32(ti, k, k + m); /* lanes past rank are 0 */
                __m512i vi = (__m512i)v;
                size_t np = (m + 1) / 2;
                _mm512_mask_storeu_epi32(tp + i * kp_n + k / 2, (__mmask16)((1u << np) - 1u),
                                         vi);
            }
        }
        float *yi = y + i0 * ldy;
        switch (nt) {
        case 4: expand_tokens(bt, rank, tp, kp_n, si, yi, ldy, j0, j1, 4); break;
        case 3: expand_tokens(bt, rank, tp, kp_n, si, yi, ldy, j0, j1, 3); break;
        case 2: expand_tokens(bt, rank, tp, kp_n, si, yi, ldy, j0, j1, 2); break;
        default: expand_tokens(bt, rank, tp, kp_n, si, yi, ldy, j0, j1, 1); break;
        }
    }
}
