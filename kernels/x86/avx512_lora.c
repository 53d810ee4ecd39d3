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
 *   rounded to bf16 32 columns at a time (once per call, or per block of up to 4 rank rows)
 *   and each (rank row, token) pair keeps two 16-lane accumulators (even and odd 32-column
 *   chunks), added and reduced at the end.
 * expand: B^T panels hold 32 columns per rank row; vdpbf16ps wants pairs along the summed
 *   index (rank), so rows k and k+1 are interleaved in registers (vpunpck{l,h}wd: per 128-bit
 *   lane, columns 8L..8L+3 and 8L+4..8L+7) and the two accumulators are put back in column
 *   order once per panel. t's pairs are rounded to bf16 once per token block.
 * int8 weights (kern.h "on int8 adapter weights"): vpdpbusd on the +128 codes (unsigned) and
 * the int8 activations (signed); the codes' offset is taken back with 128 * the sum of each
 * token's activation codes. Integer sums are exact: the same bits as the scalar twin.
 * Every token has its own accumulators over the same sequence of instructions, so its result
 * does not depend on which tokens share the call.
 */
#include "internal.h"

#include "check.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define TGT __attribute__((always_inline)) static inline
/* The int8 shrink requests the rank rows this far ahead (the next block of 4) as it reads a
 * block: past the call's last rows these are the next product's or adapter's first rows
 * (worker/model/lora_pack.c lays a job's A blocks back to back); a prefetch never faults. */
#define SHRINK_PF 4u
#define UNROLL _Pragma("GCC unroll 4")
/* bytes of a shrink block's x (NT tokens as bf16) above which 3-4 tokens take 4-row blocks */
#define SHRINK_X_L1 (24u << 10)

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

/* KR rank rows from k x NT tokens (constants after inlining); xb: x already as bf16, [NT][ldx]
 * (zeros past in), or NULL: convert x here. Each (rank row, token) pair sums the even 32-column
 * chunks in acc and the odd ones in acc2, added before the final reduction: two dependency
 * chains per pair, since at one or two tokens a segment (decode) four rows' single chains left
 * vdpbf16ps waiting on its own latency (scratch probe, session 28: 1.50 -> 1.30 TSC cycles per
 * 64 bytes of A from L2; in the engine the shrink -10..-17 %). The order does not depend on
 * KR, NT, xb or the call's row range: a token's sums are the same bits in every call. */
TGT void shrink_block(const uint16_t *a, size_t in, size_t rank, const float *x,
                      const uint16_t *xb, size_t ldx, float *t, size_t k, const size_t kr,
                      const size_t nt)
{
    __m512 acc[4][4], acc2[4][4];
    UNROLL for (size_t q = 0; q < kr; q++)
        UNROLL for (size_t i = 0; i < nt; i++) {
            acc[q][i] = _mm512_setzero_ps();
            acc2[q][i] = _mm512_setzero_ps();
        }
    /* No software prefetch: A's rows are one sequential stream per block (lora_pack.c), which
     * the hardware prefetchers follow; the next block's prefetches cost load slots and were
     * no faster with the two chains (session 28, engine knob pairs). */
    size_t c = 0;
    for (; c + 64 <= in; c += 64) {
        __m512bh xv[4], xw[4];
        UNROLL for (size_t i = 0; i < nt; i++) {
            xv[i] = xb ? (__m512bh)_mm512_load_si512(xb + i * ldx + c) : x32(x + i * in, c, in);
            xw[i] = xb ? (__m512bh)_mm512_load_si512(xb + i * ldx + c + 32)
                       : x32(x + i * in, c + 32, in);
        }
        UNROLL for (size_t q = 0; q < kr; q++) {
            __m512bh av = (__m512bh)_mm512_loadu_si512(a + (k + q) * in + c);
            __m512bh aw = (__m512bh)_mm512_loadu_si512(a + (k + q) * in + c + 32);
            UNROLL for (size_t i = 0; i < nt; i++) {
                acc[q][i] = _mm512_dpbf16_ps(acc[q][i], av, xv[i]);
                acc2[q][i] = _mm512_dpbf16_ps(acc2[q][i], aw, xw[i]);
            }
        }
    }
    if (c < in) { /* the last 1..63 columns: an even chunk, and an odd one past 32 */
        UNROLL for (size_t q = 0; q < kr; q++) {
            __m512bh av = a32(a + (k + q) * in, c, in);
            UNROLL for (size_t i = 0; i < nt; i++) {
                __m512bh xv = xb ? (__m512bh)_mm512_load_si512(xb + i * ldx + c)
                                 : x32(x + i * in, c, in);
                acc[q][i] = _mm512_dpbf16_ps(acc[q][i], av, xv);
            }
        }
        if (c + 32 < in)
            UNROLL for (size_t q = 0; q < kr; q++) {
                __m512bh aw = a32(a + (k + q) * in, c + 32, in);
                UNROLL for (size_t i = 0; i < nt; i++) {
                    __m512bh xw = xb ? (__m512bh)_mm512_load_si512(xb + i * ldx + c + 32)
                                     : x32(x + i * in, c + 32, in);
                    acc2[q][i] = _mm512_dpbf16_ps(acc2[q][i], aw, xw);
                }
            }
    }
    UNROLL for (size_t q = 0; q < kr; q++)
        UNROLL for (size_t i = 0; i < nt; i++)
            t[i * rank + k + q] = _mm512_reduce_add_ps(_mm512_add_ps(acc[q][i], acc2[q][i]));
}

/* Rows k0..k1 for NT tokens, in blocks of 4 rows at up to 2 tokens; at 3-4 tokens 4 rows x NT
 * x 2 chains leave too few of the 32 vector registers, so blocks of 2 rows, unless x (read
 * once per block) is too wide to stay in L1 beside A's stream (hot probe, session 28: 4 rows
 * -12 % at 4 tokens of 5632 columns, 2 rows -15 % at 4 tokens of 2048). A token's bits do not
 * depend on the block. */
TGT void shrink_tokens(const uint16_t *a, size_t in, size_t rank, const float *x,
                       const uint16_t *xb, size_t ldx, float *t, size_t k0, size_t k1,
                       const size_t nt)
{
    size_t k = k0;
    if (nt <= 2 || nt * ldx * 2 > SHRINK_X_L1) {
        for (; k + 4 <= k1; k += 4)
            shrink_block(a, in, rank, x, xb, ldx, t, k, 4, nt);
        if (k1 - k == 3) {
            shrink_block(a, in, rank, x, xb, ldx, t, k, 3, nt);
            return;
        }
    }
    for (; k + 2 <= k1; k += 2)
        shrink_block(a, in, rank, x, xb, ldx, t, k, 2, nt);
    if (k < k1)
        shrink_block(a, in, rank, x, xb, ldx, t, k, 1, nt);
}

/* nt <= 4 tokens: the token count a constant in each instance */
static void shrink_group(const uint16_t *a, size_t in, size_t rank, const float *x,
                         const uint16_t *xb, size_t ldx, float *t, size_t k0, size_t k1,
                         size_t nt)
{
    switch (nt) {
    case 4: shrink_tokens(a, in, rank, x, xb, ldx, t, k0, k1, 4); break;
    case 3: shrink_tokens(a, in, rank, x, xb, ldx, t, k0, k1, 3); break;
    case 2: shrink_tokens(a, in, rank, x, xb, ldx, t, k0, k1, 2); break;
    default: shrink_tokens(a, in, rank, x, xb, ldx, t, k0, k1, 1); break;
    }
}

/* x's columns converted to bf16 once per call, for in up to this (stack: 4 tokens x 8192 x
 * 2 bytes = 64 KB, as the int8 shrink's codes); wider inputs convert per block of 4 rank
 * rows. Converting per block redid the conversion rank / 4 times per token (perf, session 13,
 * int8 base, 4 x r16 bf16 on all projections: the shrink was 8 % of the samples) */
#define SHRINK_XB_MAX 8192u

void kern_lora_shrink_bf16_bf16_avx512(const void *a_, size_t in, size_t rank,
                                       const float *x, size_t n, float *t, size_t k0, size_t k1)
{
    const uint16_t *a = a_;
    const size_t ldx = (in + 31) / 32 * 32;
    _Alignas(64) uint16_t xbuf[4 * SHRINK_XB_MAX];
    const uint16_t *xb = in <= SHRINK_XB_MAX && k1 - k0 > 4 ? xbuf : NULL;
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        const float *xi = x + i0 * in;
        float *ti = t + i0 * rank;
        const size_t nt = n - i0 < 4 ? n - i0 : 4;
        if (xb) /* the same rounding as x32's, once */
            kern_lora_bf16_x_avx512(xi, in, nt, xbuf);
        shrink_group(a, in, rank, xi, xb, ldx, ti, k0, k1, nt);
    }
}

void kern_lora_bf16_x_avx512(const float *x, size_t in, size_t n, uint16_t *xb)
{
    const size_t ldx = (in + 31) / 32 * 32;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < in; c += 32)
            _mm512_store_si512(xb + i * ldx + c, (__m512i)x32(x + i * in, c, in));
}

/* kern_lora_shrink_bf16_bf16_avx512 on x rounded by kern_lora_bf16_x_avx512: the same
 * instructions on the same bf16 lanes, so the same bits */
void kern_lora_shrink_bf16x_avx512(const void *a_, size_t in, size_t rank, const uint16_t *xb,
                                   size_t n, float *t, size_t k0, size_t k1)
{
    const size_t ldx = (in + 31) / 32 * 32;
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        const size_t nt = n - i0 < 4 ? n - i0 : 4;
        shrink_group(a_, in, rank, NULL, xb + i0 * ldx, ldx, t + i0 * rank, k0, k1, nt);
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

/* ---- int8 weights: vpdpbusd ---------------------------------------------------------------- */

/*
 * kern_lora_i8_quant's rule on n floats of v into q [round_up(n, pad)] (zeros past n; pad a
 * multiple of 16), with the sum of the codes in *sum: the same max, the same 127 / max, the
 * same product rounded by vcvtps2dq (to nearest even), so the same codes. The shrink's x wants
 * pad 64 (its loads are 64 codes wide); the expand's u only its groups of 4 codes, and pad 16
 * spares it three of four passes at rank <= 16 (session 17: it quantizes u per tile, and the
 * padded passes were most of quant_x512's samples at rank 1-8).
 */
TGT float quant_x512(const float *v, size_t n, const size_t pad, int8_t *q, int32_t *sum)
{
    /* max(|v|, m): vmaxps returns its second operand when either is NaN, so a NaN is skipped
     * as the reference's `a > amax ? a : amax` skips it (with m first a NaN entered the lane and
     * was dropped only if a later value followed). Never NaN, the four chains' maxima combine
     * to the same value, and they run in parallel where one chain waited on each vmaxps. */
    __m512 m4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                    _mm512_setzero_ps()};
    size_t c0 = 0;
    for (; c0 + 64 <= n; c0 += 64)
        UNROLL for (int u = 0; u < 4; u++)
            m4[u] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + c0 + 16 * u)), m4[u]);
    for (; c0 < n; c0 += 16) {
        __mmask16 m = (__mmask16)(n - c0 >= 16 ? 0xffffu : (1u << (n - c0)) - 1u);
        m4[0] = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(m, v + c0)), m4[0]);
    }
    const __m512 mx = _mm512_max_ps(_mm512_max_ps(m4[0], m4[1]), _mm512_max_ps(m4[2], m4[3]));
    const float amax = _mm512_reduce_max_ps(mx);
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m512i s = _mm512_setzero_si512();
    const size_t np = (n + pad - 1) / pad * pad;
    for (size_t c = 0; c < np; c += 16) {
        __mmask16 m = (__mmask16)(c >= n ? 0u : n - c >= 16 ? 0xffffu : (1u << (n - c)) - 1u);
        __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + c), id));
        s = _mm512_add_epi32(s, qi);
        _mm_storeu_si128((__m128i *)(q + c), _mm512_cvtsepi32_epi8(qi));
    }
    /* the lanes' sum by vector adds: GCC's _mm512_reduce_add_epi32 adds them as C ints, whose
     * overflow (a NaN's code is INT_MIN before the saturating store) is undefined behaviour;
     * for finite input the sum is exact either way (|codes| <= 127 * KERN_LORA_I8_IN_MAX) */
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    __m128i q4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    q4 = _mm_add_epi32(q4, _mm_shuffle_epi32(q4, 0x4e));
    q4 = _mm_add_epi32(q4, _mm_shuffle_epi32(q4, 0xb1));
    *sum = _mm_cvtsi128_si32(q4);
    return amax / 127.0f;
}

/* KR rank rows from k x NT tokens: qx [NT][ldx] codes (zero past in), xsum/xs their code sums
 * and scales */
TGT void shrink8_block(const uint8_t *q, size_t in, size_t rank, const float *sa,
                       const int8_t *qx, size_t ldx, const int32_t *xsum, const float *xs,
                       float *t, size_t k, const size_t kr, const size_t nt)
{
    __m512i acc[4][4];
    UNROLL for (size_t r = 0; r < kr; r++)
        UNROLL for (size_t i = 0; i < nt; i++)
            acc[r][i] = _mm512_setzero_si512();
    for (size_t c = 0; c < in; c += 64) {
        /* codes past in read as 0, against activation codes 0: no term */
        __mmask64 m = in - c >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (in - c)) - 1u;
        __m512i xv[4];
        UNROLL for (size_t i = 0; i < nt; i++)
            xv[i] = _mm512_loadu_si512(qx + i * ldx + c);
        UNROLL for (size_t r = 0; r < kr; r++) /* as shrink_block */
            _mm_prefetch((const char *)(q + (k + SHRINK_PF + r) * in + c), _MM_HINT_T0);
        UNROLL for (size_t r = 0; r < kr; r++) {
            __m512i av = _mm512_maskz_loadu_epi8(m, q + (k + r) * in + c);
            UNROLL for (size_t i = 0; i < nt; i++)
                acc[r][i] = _mm512_dpbusd_epi32(acc[r][i], av, xv[i]);
        }
    }
    UNROLL for (size_t r = 0; r < kr; r++)
        UNROLL for (size_t i = 0; i < nt; i++) {
            int32_t d = _mm512_reduce_add_epi32(acc[r][i]) - 128 * xsum[i];
            t[i * rank + k + r] = sa[k + r] * (xs[i] * (float)d);
        }
}

TGT void shrink8_tokens(const uint8_t *q, size_t in, size_t rank, const float *sa,
                        const int8_t *qx, size_t ldx, const int32_t *xsum, const float *xs,
                        float *t, size_t k0, size_t k1, const size_t nt)
{
    size_t k = k0;
    for (; k + 4 <= k1; k += 4)
        shrink8_block(q, in, rank, sa, qx, ldx, xsum, xs, t, k, 4, nt);
    switch (k1 - k) {
    case 3: shrink8_block(q, in, rank, sa, qx, ldx, xsum, xs, t, k, 3, nt); break;
    case 2: shrink8_block(q, in, rank, sa, qx, ldx, xsum, xs, t, k, 2, nt); break;
    case 1: shrink8_block(q, in, rank, sa, qx, ldx, xsum, xs, t, k, 1, nt); break;
    default: break;
    }
}

void kern_lora_i8_quant_x_avx512(const float *x, size_t in, size_t n, int8_t *qx, float *xs,
                                 int32_t *xsum)
{
    const size_t ldx = KERN_LORA_I8_LDX(in);
    for (size_t i = 0; i < n; i++)
        xs[i] = quant_x512(x + i * in, in, 64, qx + i * ldx, &xsum[i]);
}

void kern_lora_shrink_i8q_avx512(const void *a, size_t in, size_t rank, const int8_t *qx,
                                 const float *xs, const int32_t *xsum, size_t n, float *t,
                                 size_t k0, size_t k1)
{
    const float *sa = a;
    const uint8_t *q = (const uint8_t *)a + KERN_LORA_I8_HDR(rank);
    const size_t ldx = KERN_LORA_I8_LDX(in);
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        const size_t nt = n - i0 < 4 ? n - i0 : 4;
        const int8_t *qi = qx + i0 * ldx;
        float *ti = t + i0 * rank;
        switch (nt) {
        case 4: shrink8_tokens(q, in, rank, sa, qi, ldx, xsum + i0, xs + i0, ti, k0, k1, 4); break;
        case 3: shrink8_tokens(q, in, rank, sa, qi, ldx, xsum + i0, xs + i0, ti, k0, k1, 3); break;
        case 2: shrink8_tokens(q, in, rank, sa, qi, ldx, xsum + i0, xs + i0, ti, k0, k1, 2); break;
        default: shrink8_tokens(q, in, rank, sa, qi, ldx, xsum + i0, xs + i0, ti, k0, k1, 1); break;
        }
    }
}

void kern_lora_shrink_i8_avx512(const void *a, size_t in, size_t rank, const float *x,
                                size_t n, float *t, size_t k0, size_t k1)
{
    CHECK(in <= KERN_LORA_I8_IN_MAX);
    _Alignas(64) int8_t qx[4 * KERN_LORA_I8_IN_MAX];
    int32_t xsum[4];
    float xs[4];
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        size_t nt = n - i0 < 4 ? n - i0 : 4;
        kern_lora_i8_quant_x_avx512(x + i0 * in, in, nt, qx, xs, xsum);
        kern_lora_shrink_i8q_avx512(a, in, rank, qx, xs, xsum, nt, t + i0 * rank, k0, k1);
    }
}

/* y_i[a, e) of one panel (G groups of 4 rank rows) += s_i * su_i * its columns, NT tokens */
TGT void expand8_panel(const uint8_t *pw, size_t g_n, const int8_t *tq, size_t ldq,
                       const int32_t *usum, const float *us, const float *si, float *y,
                       size_t ldy, size_t a, size_t e, const size_t nt)
{
    __m512i lo[4], hi[4];
    UNROLL for (size_t i = 0; i < nt; i++) {
        lo[i] = _mm512_setzero_si512();
        hi[i] = _mm512_setzero_si512();
    }
    for (size_t g = 0; g < g_n; g++) {
        __m512i w0 = _mm512_loadu_si512(pw + g * 128), w1 = _mm512_loadu_si512(pw + g * 128 + 64);
        UNROLL for (size_t i = 0; i < nt; i++) {
            int32_t t4; /* 4 codes of u (memcpy: qu is bytes) */
            memcpy(&t4, tq + i * ldq + 4 * g, 4);
            __m512i tv = _mm512_set1_epi32(t4);
            lo[i] = _mm512_dpbusd_epi32(lo[i], w0, tv);
            hi[i] = _mm512_dpbusd_epi32(hi[i], w1, tv);
        }
    }
    uint32_t m = (uint32_t)((e >= 32 ? ~0ull : (1ull << e) - 1u) & ~((1ull << a) - 1u));
    __mmask16 m0 = (__mmask16)(m & 0xffffu), m1 = (__mmask16)(m >> 16);
    UNROLL for (size_t i = 0; i < nt; i++) {
        if (si[i] == 0.0f)
            continue;
        const __m512i corr = _mm512_set1_epi32(128 * usum[i]);
        const __m512 sv = _mm512_set1_ps(si[i]), uv = _mm512_set1_ps(us[i]);
        __m512 c0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(lo[i], corr));
        __m512 c1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(hi[i], corr));
        float *yr = y + i * ldy;
        _mm512_mask_storeu_ps(yr, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, yr),
                                                    _mm512_mul_ps(sv, _mm512_mul_ps(uv, c0))));
        _mm512_mask_storeu_ps(yr + 16, m1,
                              _mm512_add_ps(_mm512_maskz_loadu_ps(m1, yr + 16),
                                            _mm512_mul_ps(sv, _mm512_mul_ps(uv, c1))));
    }
}

TGT void expand8_tokens(const uint8_t *q, size_t g_n, const int8_t *tq, size_t ldq,
                        const int32_t *usum, const float *us, const float *si, float *y,
                        size_t ldy, size_t j0, size_t j1, const size_t nt)
{
    const size_t P = KERN_LORA_PANEL, pbytes = g_n * 128;
    for (size_t pj = j0 / P * P; pj < j1; pj += P) {
        const uint8_t *pw = q + pj / P * pbytes;
        if (pj + P < j1)
            for (size_t o = 0; o < pbytes; o += 64)
                _mm_prefetch((const char *)pw + pbytes + o, _MM_HINT_T0);
        size_t a = (pj > j0 ? pj : j0) - pj, e = (pj + P < j1 ? pj + P : j1) - pj;
        expand8_panel(pw, g_n, tq, ldq, usum, us, si, y + pj, ldy, a, e, nt);
    }
}

/* u = t * sb and its codes for n tokens: qu [n][KERN_LORA_I8_LDU(rank)] (kern.h) */
void kern_lora_i8_quant_u_avx512(const void *bt, size_t rank, const float *t, size_t n,
                                 int8_t *qu, float *us, int32_t *usum)
{
    CHECK(rank <= KERN_LORA_RANK_MAX);
    const float *sb = bt;
    const size_t ldu = KERN_LORA_I8_LDU(rank);
    _Alignas(64) float u[KERN_LORA_RANK_MAX];
    for (size_t i = 0; i < n; i++) {
        const float *ti = t + i * rank;
        /* u = t * sb and its codes in SIMD (the scalar rule, nearbyintf per rank row, was a
         * fifth of the expand's time at rank 16 when it ran per tile, perf, session 13);
         * quant_x512 gives kern_lora_i8_quant's codes, zeros past rank up to ldu */
        for (size_t k = 0; k < rank; k += 16) {
            __mmask16 m = (__mmask16)(rank - k >= 16 ? 0xffffu : (1u << (rank - k)) - 1u);
            _mm512_store_ps(u + k, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, ti + k),
                                                 _mm512_maskz_loadu_ps(m, sb + k)));
        }
        us[i] = quant_x512(u, rank, 16, qu + i * ldu, &usum[i]);
    }
}

void kern_lora_expand_i8q_avx512(const void *bt, size_t rank, const int8_t *qu, const float *us,
                                 const int32_t *usum, size_t n, const float *scale, float s,
                                 float *y, size_t ldy, size_t j0, size_t j1)
{
    const uint8_t *q = (const uint8_t *)bt + KERN_LORA_I8_HDR(rank);
    const size_t g_n = (rank + 3) / 4, ldu = KERN_LORA_I8_LDU(rank);
    float si[4];
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        size_t nt = n - i0 < 4 ? n - i0 : 4;
        for (size_t i = 0; i < nt; i++)
            si[i] = scale ? scale[i0 + i] : s;
        const int8_t *tq = qu + i0 * ldu;
        const int32_t *su = usum + i0;
        const float *ui = us + i0;
        float *yi = y + i0 * ldy;
        switch (nt) {
        case 4: expand8_tokens(q, g_n, tq, ldu, su, ui, si, yi, ldy, j0, j1, 4); break;
        case 3: expand8_tokens(q, g_n, tq, ldu, su, ui, si, yi, ldy, j0, j1, 3); break;
        case 2: expand8_tokens(q, g_n, tq, ldu, su, ui, si, yi, ldy, j0, j1, 2); break;
        default: expand8_tokens(q, g_n, tq, ldu, su, ui, si, yi, ldy, j0, j1, 1); break;
        }
    }
}

/* the codes of 4 tokens at a time, then their expand (one call: the codes are its own) */
void kern_lora_expand_i8_avx512(const void *bt, size_t rank, const float *t, size_t n,
                                const float *scale, float s, float *y, size_t ldy, size_t j0,
                                size_t j1)
{
    CHECK(rank <= KERN_LORA_RANK_MAX);
    _Alignas(64) int8_t qu[4 * KERN_LORA_I8_LDU(KERN_LORA_RANK_MAX)];
    int32_t usum[4];
    float us[4];
    for (size_t i0 = 0; i0 < n; i0 += 4) {
        size_t nt = n - i0 < 4 ? n - i0 : 4;
        kern_lora_i8_quant_u_avx512(bt, rank, t + i0 * rank, nt, qu, us, usum);
        kern_lora_expand_i8q_avx512(bt, rank, qu, us, usum, nt, scale ? scale + i0 : NULL, s,
                                    y + i0 * ldy, ldy, j0, j1);
    }
}
