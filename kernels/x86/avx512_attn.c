/*
 * avx512_attn.c — the attention tile kernel with AVX-512 (kern.h; the scalar specification is
 * kern_attn_<kvt>_f32_ref in kernels/attn.c): 16 lanes over the head dimension, ragged head
 * dims with masked loads and stores.
 *
 * Per call: f16/bf16/8-bit V rows are widened to f32 once per sub-tile into a stack buffer
 * and then read by every query row (the GQA group / prefill rows share them); K rows of any
 * dtype are widened inside the transpose below (session 13: no widened K copy); f32 rows are
 * read in place. The tile (session 12) is register-blocked like a small GEMM:
 *  - q.k: 16 positions of K are transposed in registers (16x16, 64 shuffles per 16 head-dim
 *    elements) once for all rows; then 8 rows' scores over those 16 positions are 8 vectors,
 *    one broadcast-q FMA per element (two chains per row: even and odd d), so the scores
 *    need no horizontal sums and the softmax works on 16 scores per vector;
 *  - softmax 16 rows at a time, a row per lane (session 19, softmax16): the scores' 16x16
 *    blocks transposed, the tile maxima, corr and the weights' sums as vertical operations,
 *    exp16 (avx512_exp.h, the scalar fm_expf's algorithm), weights 0 outside a row's
 *    [lo, vis), left transposed (a position's weights of the rows side by side) for o += w v;
 *  - o = o*corr + sum_j w_j v_j: 4 rows x 64 lanes of o in 16 registers per V row loaded;
 *    rows past the last group of 4 one at a time (pv_row1: a decode without GQA has one row,
 *    which used to pay for 3 zero-weight padding rows).
 * Every row's arithmetic is its own sequence of operations, whatever rows share the call, so
 * a query gives the same bits in a decode and in any prefill chunk (the engine's batch
 * invariance relies on it; weights outside a row's range add exact zeros).
 *
 * 8-bit KV head rows (int8, fp8 E4M3 with an f32 scale; kern.h) are decoded (V: into the
 * widened tile by widen_kvi8 / widen_kvf8; K: by load_k) bit for bit as kern_kv8_dequant, so
 * the widened values, and every result, are those of the session-12 kernel.
 *
 * NOTES: reentrant; at most ATTN_BUF floats (32 KiB) of stack in the widening driver,
 * and 48 KiB in the tile (the transposed K, the scores of 64 rows, their weights transposed);
 * the decode walk (kern_attn_blocks_avx512, at the end) ~41 KiB (q, a widened K and V block).
 */
#include "avx512_exp.h"
#include "fastmath.h"
#include "internal.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ATTN_BUF 8192 /* floats per widened K (or V) sub-tile: rows = ATTN_BUF / hd */

static inline __mmask16 lanes(size_t hd, size_t d)
{
    return hd - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - d)) - 1u);
}

/*
 * One 16x16 transpose: r[i] (row i, 16 floats) -> r[i] (column i). 64 shuffles.
 */
static inline __attribute__((always_inline)) void tr16x16(__m512 r[16])
{
    __m512 t[16];
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i += 4) {
        r[i + 0] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* How K rows are stored (kern.h): the dtype transpose_k widens as it loads. */
enum kform { KF_F32, KF_F16, KF_BF16, KF_I8, KF_F8 };

/* Lanes d .. d+15 (masked by mk) of one K row at p, widened to f32 bit for bit as the
 * widen_* functions below (and kern_kv8_dequant) do: 8-bit rows end in their f32 scale. */
static inline __attribute__((always_inline)) __m512 load_k(enum kform f, const uint8_t *p,
                                                           size_t d, size_t hd, __mmask16 mk)
{
    switch (f) {
    case KF_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)(const void *)p + d));
    case KF_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)(const void *)p + d)),
            16));
    case KF_I8: {
        float sc;
        memcpy(&sc, p + hd, sizeof sc);
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, p + d))),
                             _mm512_set1_ps(sc));
    }
    case KF_F8: {
        float sc;
        memcpy(&sc, p + hd, sizeof sc);
        const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mk, p + d));
        const __m256i h =
            _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                            _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
        return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(sc * 256.0f));
    }
    case KF_F32:
    default:
        return _mm512_maskz_loadu_ps(mk, (const float *)(const void *)p + d);
    }
}

/* K rows [i0, nb) (nb <= 16, row i at k + i*ldk bytes, stored as f) widened and transposed
 * into kt [hd][16]: kt[d][i] = K[i][d], lanes outside [i0, nb) zero (those rows are not
 * read). Why widen here: a 16-bit or 8-bit K row goes from memory to the transpose in
 * registers, with no widened copy of the tile written and read back (session 13). */
static inline __attribute__((always_inline)) void transpose_k(float *kt, const uint8_t *k,
                                                              size_t ldk, size_t i0, size_t nb,
                                                              size_t hd, enum kform f)
{
    for (size_t d = 0; d < hd; d += 16) {
        const __mmask16 mk = lanes(hd, d);
        __m512 r[16];
        if (i0 == 0 && nb == 16) { /* a whole block (the common case): no per-row tests */
            _Pragma("GCC unroll 16") for (size_t i = 0; i < 16; i++)
                r[i] = load_k(f, k + i * ldk, d, hd, mk);
        } else {
            _Pragma("GCC unroll 16") for (size_t i = 0; i < 16; i++)
                r[i] = i >= i0 && i < nb ? load_k(f, k + i * ldk, d, hd, mk) : _mm512_setzero_ps();
        }
        tr16x16(r);
        if (hd - d >= 16) { /* constant indices: r stays in registers (a variable count made
                               GCC spill r and copy it with rep movsq, 6% of the tile) */
            _Pragma("GCC unroll 16") for (size_t i = 0; i < 16; i++)
                _mm512_store_ps(kt + (d + i) * 16, r[i]);
        } else {
            for (size_t i = 0; i < hd - d; i++)
                _mm512_store_ps(kt + (d + i) * 16, r[i]);
        }
    }
}

/* transpose_k with the form a runtime value: one inlined copy per form. */
static void transpose_k_any(float *kt, const uint8_t *k, size_t ldk, size_t i0, size_t nb,
                            size_t hd, enum kform f)
{
    switch (f) {
    case KF_F16: transpose_k(kt, k, ldk, i0, nb, hd, KF_F16); break;
    case KF_BF16: transpose_k(kt, k, ldk, i0, nb, hd, KF_BF16); break;
    case KF_I8: transpose_k(kt, k, ldk, i0, nb, hd, KF_I8); break;
    case KF_F8: transpose_k(kt, k, ldk, i0, nb, hd, KF_F8); break;
    case KF_F32:
    default: transpose_k(kt, k, ldk, i0, nb, hd, KF_F32); break;
    }
}

/*
 * Scores of R query rows against 16 transposed positions: s[r][0..16) = scale * q[r] . K[i],
 * lanes = positions. Each row's sum is its own pair of FMA chains (even and odd d, added at
 * the end), so a row's bits do not depend on R or on the rows beside it (batch invariance:
 * the same query gives the same score in a decode and inside any prefill chunk).
 */
#define SCORES_ROWS_(R)                                                                          \
    static void scores_rows##R(const float *const *q, const float *kt, size_t hd, float scale,  \
                               float *s, size_t lds)                                            \
    {                                                                                            \
        __m512 a0[R], a1[R];                                                                     \
        _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++) a0[r] = a1[r] =                   \
            _mm512_setzero_ps();                                                                 \
        size_t d = 0;                                                                            \
        for (; d + 2 <= hd; d += 2) {                                                            \
            const __m512 k0 = _mm512_load_ps(kt + d * 16);                                       \
            const __m512 k1 = _mm512_load_ps(kt + (d + 1) * 16);                                 \
            _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++)                               \
            {                                                                                    \
                a0[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k0, a0[r]);                     \
                a1[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d + 1]), k1, a1[r]);                 \
            }                                                                                    \
        }                                                                                        \
        if (d < hd) {                                                                            \
            const __m512 k0 = _mm512_load_ps(kt + d * 16);                                       \
            _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++) a0[r] =                       \
                _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k0, a0[r]);                             \
        }                                                                                        \
        const __m512 vs = _mm512_set1_ps(scale);                                                 \
        _Pragma("GCC unroll 8") for (size_t r = 0; r < R; r++)                                   \
            _mm512_store_ps(s + r * lds, _mm512_mul_ps(_mm512_add_ps(a0[r], a1[r]), vs));        \
    }
SCORES_ROWS_(8)
SCORES_ROWS_(1)
#undef SCORES_ROWS_

/* o[r] = o[r]*corr[r] + sum_{j in [ja, jb)} w[j*ldw + r*ldr] v_j for PV_ROWS rows (the
 * weights transposed as softmax16 leaves them, ldw = ROWS_MAX and ldr = 1, or row-major as
 * softmax_row does, ldw = 1 and ldr = KERN_ATTN_TILE), 64 floats of o (d0 .. d0+63, masked at
 * hd) per pass. One FMA chain per (row, 16 lanes), j in order, so a
 * row's bits do not depend on the rows beside it; weights outside a row's range are 0 and add
 * exactly nothing (v rows in [ja, jb) are rows some row of the call sees: finite). */
#define PV_ROWS 4
/* 64 lanes of o from d0: LD(p, c) loads lanes 16c .. 16c+15 at p (masked or not) */
#define PV_BODY_(LD)                                                                          \
    {                                                                                         \
        PV_LOAD_(0) PV_LOAD_(1) PV_LOAD_(2) PV_LOAD_(3)                                       \
        const float *vp = vf + ja * ldf + d0, *wp = w + ja * ldw;                             \
        for (size_t j = ja; j < jb; j++, vp += ldf, wp += ldw) {                              \
            const __m512 v0 = LD(vp, 0), v1 = LD(vp, 1), v2 = LD(vp, 2), v3 = LD(vp, 3);      \
            PV_FMA_(0) PV_FMA_(1) PV_FMA_(2) PV_FMA_(3)                                       \
        }                                                                                     \
        PV_STORE_(0) PV_STORE_(1) PV_STORE_(2) PV_STORE_(3)                                   \
    }
#define PV_LOAD_(r)                                                                           \
    const __m512 c##r = _mm512_set1_ps(corr[r]);                                              \
    __m512 a##r##0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, o[r] + d0), c##r);               \
    __m512 a##r##1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, o[r] + d0 + 16), c##r);          \
    __m512 a##r##2 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m2, o[r] + d0 + 32), c##r);          \
    __m512 a##r##3 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m3, o[r] + d0 + 48), c##r);
#define PV_FMA_(r)                                                                            \
    {                                                                                         \
        const __m512 wr = _mm512_set1_ps(wp[(r) * ldr]);                                      \
        a##r##0 = _mm512_fmadd_ps(wr, v0, a##r##0);                                           \
        a##r##1 = _mm512_fmadd_ps(wr, v1, a##r##1);                                           \
        a##r##2 = _mm512_fmadd_ps(wr, v2, a##r##2);                                           \
        a##r##3 = _mm512_fmadd_ps(wr, v3, a##r##3);                                           \
    }
#define PV_STORE_(r)                                                                          \
    _mm512_mask_storeu_ps(o[r] + d0, m0, a##r##0);                                            \
    _mm512_mask_storeu_ps(o[r] + d0 + 16, m1, a##r##1);                                       \
    _mm512_mask_storeu_ps(o[r] + d0 + 32, m2, a##r##2);                                       \
    _mm512_mask_storeu_ps(o[r] + d0 + 48, m3, a##r##3);
#define PV_FULL_(p, c) _mm512_loadu_ps((p) + 16 * (c))
#define PV_MASKED_(p, c) _mm512_maskz_loadu_ps(m##c, (p) + 16 * (c))
/* noinline: inlined into tile_rows, its 16 accumulators were spilled to the stack (GCC 12) */
static __attribute__((noinline)) void pv_rows(float *const *o, const float *corr,
                                              const float *w, size_t ldw, size_t ldr, size_t ja,
                                              size_t jb,
                                              const float *vf, size_t ldf, size_t hd)
{
    size_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) { /* whole 64-lane slices: plain loads */
        const __mmask16 m0 = 0xffff, m1 = 0xffff, m2 = 0xffff, m3 = 0xffff;
        PV_BODY_(PV_FULL_)
    }
    if (d0 < hd) { /* the ragged end: lanes past hd neither read nor written */
        const __mmask16 m0 = lanes(hd, d0), m1 = d0 + 16 < hd ? lanes(hd, d0 + 16) : 0,
                        m2 = d0 + 32 < hd ? lanes(hd, d0 + 32) : 0,
                        m3 = d0 + 48 < hd ? lanes(hd, d0 + 48) : 0;
        PV_BODY_(PV_MASKED_)
    }
}
/* pv_rows for one row: the rows of a call past the last whole PV_ROWS group (a decode
 * without GQA has one) no longer pay for three zero-weight padding rows. Row 0's sequence of
 * operations is pv_rows' for any of its rows, so the bits do not depend on the grouping. */
#define PV1_BODY_(LD)                                                                         \
    {                                                                                         \
        PV_LOAD_(0)                                                                           \
        const float *vp = vf + ja * ldf + d0, *wp = w + ja * ldw;                             \
        for (size_t j = ja; j < jb; j++, vp += ldf, wp += ldw) {                              \
            const __m512 v0 = LD(vp, 0), v1 = LD(vp, 1), v2 = LD(vp, 2), v3 = LD(vp, 3);      \
            PV_FMA_(0)                                                                        \
        }                                                                                     \
        PV_STORE_(0)                                                                          \
    }
static void pv_row1(float *const *o, const float *corr, const float *w, size_t ldw, size_t ja,
                    size_t jb, const float *vf, size_t ldf, size_t hd)
{
    const size_t ldr = 0; /* one row: PV_FMA_(0) reads wp[0] */
    size_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) {
        const __mmask16 m0 = 0xffff, m1 = 0xffff, m2 = 0xffff, m3 = 0xffff;
        PV1_BODY_(PV_FULL_)
    }
    if (d0 < hd) {
        const __mmask16 m0 = lanes(hd, d0), m1 = d0 + 16 < hd ? lanes(hd, d0 + 16) : 0,
                        m2 = d0 + 32 < hd ? lanes(hd, d0 + 32) : 0,
                        m3 = d0 + 48 < hd ? lanes(hd, d0 + 48) : 0;
        PV1_BODY_(PV_MASKED_)
    }
}
#undef PV1_BODY_
#undef PV_BODY_
#undef PV_LOAD_
#undef PV_FMA_
#undef PV_STORE_
#undef PV_FULL_
#undef PV_MASKED_

#define ROWS_MAX 64 /* query rows of one pass (their scores live on the stack) */

/* Groups of fewer rows than this take softmax_row: softmax16's transposes and 16-lane passes
 * cost about as much as 6 rows' horizontal sums (a decode without GQA has one row). */
#define SOFTMAX_LANES_MIN 6

/* Did softmax16 (1: weights transposed in wt) or softmax_row (0: row-major in s) take row i
 * of na active rows? */
static inline int lanes_layout(size_t na, size_t i)
{
    const size_t i0 = i / 16 * 16;
    return na - i0 >= SOFTMAX_LANES_MIN;
}

/*
 * The online-softmax step of one row (scores s [KERN_ATTN_TILE] over [jlo, jb), range
 * [a, b)): the weights e^(s - m') in place (0 outside the range), *corr = e^(m - m'), m and l.
 * The session-12 loop, with corr as lane 0 of exp16 (fm_expf's bits, no libm ldexpf call);
 * softmax16 gives every row the same bits.
 */
static void softmax_row(float *s, size_t a, size_t b, float *m, float *l, float *corr,
                        size_t jlo, size_t jb)
{
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i va = _mm512_set1_epi32((int)a), vb = _mm512_set1_epi32((int)b);
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (size_t j = jlo; j < jb; j += 16) {
        const __m512i vj = _mm512_add_epi32(_mm512_set1_epi32((int)j), iota);
        const __mmask16 mk = _mm512_mask_cmplt_epu32_mask(_mm512_cmple_epu32_mask(va, vj), vj, vb);
        vmx = _mm512_mask_max_ps(vmx, mk, vmx, _mm512_load_ps(s + j));
    }
    const float mx = _mm512_reduce_max_ps(vmx);
    const float mn = *m > mx ? *m : mx;
    *corr = _mm512_cvtss_f32(exp16(_mm512_set1_ps(*m - mn))); /* 0 on the first tile */
    __m512 vsum = _mm512_setzero_ps();
    const __m512 vmn = _mm512_set1_ps(mn);
    for (size_t j = jlo; j < jb; j += 16) {
        const __m512i vj = _mm512_add_epi32(_mm512_set1_epi32((int)j), iota);
        const __mmask16 mk = _mm512_mask_cmplt_epu32_mask(_mm512_cmple_epu32_mask(va, vj), vj, vb);
        const __m512 e = _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_load_ps(s + j), vmn)));
        _mm512_store_ps(s + j, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    *l = *l * *corr + _mm512_reduce_add_ps(vsum);
    *m = mn;
}

/*
 * The online-softmax step of active rows i0 .. i0+nr-1 (nr <= 16; row i is query row act[i],
 * seeing tile positions [ra[i], rb[i])), one row per lane: s [ROWS_MAX][KERN_ATTN_TILE] holds
 * their scores over [jlo, jb) (row-major, from the score pass); each 16 x 16 block is
 * transposed so that a position's scores of the 16 rows are one vector. Writes the weights
 * e^(s - m') (0 outside a row's range) transposed into wt [n][ROWS_MAX] (wt[j*ROWS_MAX + i]),
 * corr[i] = e^(m - m'), and the rows' m and l.
 * Same bits as the row-at-a-time loop this replaced (session 19): the maximum is exact in any
 * order; corr is exp16 of the same m - m' (the scalar fm_expf's bits lane-wise, avx512_exp.h);
 * the sum of the weights is that loop's: per position lane p the blocks in order from 0
 * (acc[p] = 0 + e_p + ...), then _mm512_reduce_add_ps's tree (GCC's avx512fintrin.h: lane
 * p + p+8, then + p+4, then + p+2, then lane 0 + lane 1) on whole vectors; l*corr + sum
 * rounded twice (no FMA contraction under -std=c11). Why: per row and 16-position span that
 * loop paid two horizontal reductions and a scalar fm_expf (libm ldexpf), about as many
 * instructions as the row's 128 multiply-adds (the paged prefill's 16-position spans).
 */
static void softmax16(float (*s)[KERN_ATTN_TILE], float *wt, size_t i0, size_t nr,
                      const size_t *ra, const size_t *rb, const size_t *act, float *m, float *l,
                      float *corr, size_t jlo, size_t jb)
{
    uint32_t a32[16] __attribute__((aligned(64))), b32[16] __attribute__((aligned(64)));
    float m0[16] __attribute__((aligned(64))), l0[16] __attribute__((aligned(64)));
    for (size_t r = 0; r < 16; r++) { /* lanes past nr: an empty range, never stored */
        const int in = r < nr;
        a32[r] = in ? (uint32_t)ra[i0 + r] : 0;
        b32[r] = in ? (uint32_t)rb[i0 + r] : 0;
        m0[r] = in ? m[act[i0 + r]] : 0.0f;
        l0[r] = in ? l[act[i0 + r]] : 0.0f;
    }
    const __m512i va = _mm512_load_si512(a32), vb = _mm512_load_si512(b32);
    /* pass 1: transposed scores into wt, the rows' maxima over their ranges */
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (size_t b = jlo; b < jb; b += 16) {
        __m512 t[16];
        _Pragma("GCC unroll 16") for (size_t r = 0; r < 16; r++)
            t[r] = _mm512_load_ps(&s[i0 + r][b]); /* rows past nr: stale, masked below */
        tr16x16(t);
        _Pragma("GCC unroll 16") for (size_t p = 0; p < 16; p++) {
            const __m512i vj = _mm512_set1_epi32((int)(b + p));
            const __mmask16 mk = _mm512_mask_cmplt_epu32_mask(_mm512_cmple_epu32_mask(va, vj), vj, vb);
            vmx = _mm512_mask_max_ps(vmx, mk, vmx, t[p]);
            _mm512_store_ps(wt + (b + p) * ROWS_MAX + i0, t[p]);
        }
    }
    const __m512 vm = _mm512_load_ps(m0);
    const __m512 mn = _mm512_max_ps(vm, vmx); /* m > mx ? m : mx, as the scalar loop */
    const __m512 vc = exp16(_mm512_sub_ps(vm, mn)); /* 0 on the first tile (m = -inf) */
    /* pass 2: weights in place, their per-lane sums over the blocks */
    __m512 acc[16];
    _Pragma("GCC unroll 16") for (size_t p = 0; p < 16; p++) acc[p] = _mm512_setzero_ps();
    for (size_t b = jlo; b < jb; b += 16) {
        _Pragma("GCC unroll 16") for (size_t p = 0; p < 16; p++) {
            const __m512i vj = _mm512_set1_epi32((int)(b + p));
            const __mmask16 mk = _mm512_mask_cmplt_epu32_mask(_mm512_cmple_epu32_mask(va, vj), vj, vb);
            float *wp = wt + (b + p) * ROWS_MAX + i0;
            const __m512 e = _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_load_ps(wp), mn)));
            _mm512_store_ps(wp, e);
            acc[p] = _mm512_add_ps(acc[p], e);
        }
    }
    /* _mm512_reduce_add_ps's tree, a lane per row */
    _Pragma("GCC unroll 8") for (size_t p = 0; p < 8; p++) acc[p] = _mm512_add_ps(acc[p + 8], acc[p]);
    _Pragma("GCC unroll 4") for (size_t p = 0; p < 4; p++) acc[p] = _mm512_add_ps(acc[p + 4], acc[p]);
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    const __m512 vl = _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(l0), vc), sum);
    _mm512_store_ps(m0, mn);
    _mm512_store_ps(l0, vl);
    _mm512_storeu_ps(corr + i0, vc); /* corr has ROWS_MAX entries: lanes past nr unused */
    for (size_t r = 0; r < nr; r++) {
        m[act[i0 + r]] = m0[r];
        l[act[i0 + r]] = l0[r];
    }
}

/*
 * The online-softmax update of nq rows over n positions: K row j at k + j*ldk bytes, stored
 * as kf (widened to f32 by transpose_k), V row j at vf + j*ldvf (f32). n <= KERN_ATTN_TILE. Row r sees tile positions
 * [lo[r] - j0, vis[r] - j0) clipped to [0, n) (lo/vis are relative to the kernel call, j0 is
 * this tile's offset in it; NULL: unclipped).
 *
 * Register-blocked: K is transposed 16 positions at a time (once for all rows), the scores of
 * 8 rows x 16 positions are 8 vectors (q broadcast, one FMA per element), the softmax runs
 * 16 rows at a time a row per lane (softmax16), and o += w v runs 4 rows x 64 lanes per V row
 * loaded.
 */
static void tile_rows(const float *const *q, float *const *o, float *m, float *l,
                      const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                      const void *k, size_t ldk, enum kform kf, const float *vf, size_t ldvf,
                      size_t n, size_t hd, float scale)
{
    float kt[KERN_ATTN_HD_MAX * 16] __attribute__((aligned(64)));      /* [hd][16] K^T */
    float s[ROWS_MAX][KERN_ATTN_TILE] __attribute__((aligned(64))); /* [nq][n] */
    size_t ra[ROWS_MAX], rb[ROWS_MAX]; /* row r sees [ra, rb) */
    size_t act[ROWS_MAX], na = 0;                  /* rows that see something */
    size_t ja = n, jb = 0;
    for (size_t r = 0; r < nq; r++) {
        size_t nv = vis ? (vis[r] > j0 ? vis[r] - j0 : 0) : n;
        if (nv > n)
            nv = n;
        const size_t a = lo && lo[r] > j0 ? lo[r] - j0 : 0; /* the window's start */
        if (a >= nv)
            continue;
        ra[na] = a, rb[na] = nv, act[na++] = r;
        ja = a < ja ? a : ja;
        jb = nv > jb ? nv : jb;
    }
    if (na == 0)
        return;
    /* scores of the active rows over [ja, jb), 16 positions at a time from ja rounded down
     * (K rows below ja or from jb on are not read: zero lanes, masked below) */
    const float *qa[ROWS_MAX];
    for (size_t i = 0; i < na; i++)
        qa[i] = q[act[i]];
    const size_t jlo = ja / 16 * 16;
    for (size_t b = jlo; b < jb; b += 16) {
        const size_t first = b < ja ? ja : b; /* rows [first, last) of this block are read */
        const size_t nb = jb - b < 16 ? jb - b : 16;
        transpose_k_any(kt, (const uint8_t *)k + b * ldk, ldk, first - b, nb, hd, kf);
        size_t i = 0;
        for (; i + 8 <= na; i += 8)
            scores_rows8(qa + i, kt, hd, scale, &s[i][b], KERN_ATTN_TILE);
        for (; i < na; i++)
            scores_rows1(qa + i, kt, hd, scale, &s[i][b], KERN_ATTN_TILE);
    }
    /* the softmax, 16 rows at a time with a row per lane (softmax16), or a row at a time
     * (softmax_row) where fewer than SOFTMAX_LANES_MIN rows are left: the same bits */
    float wt[KERN_ATTN_TILE * ROWS_MAX] __attribute__((aligned(64))); /* [n][ROWS_MAX] */
    float corr[ROWS_MAX];
    for (size_t i0 = 0; i0 < na; i0 += 16) {
        const size_t nr = na - i0 < 16 ? na - i0 : 16;
        if (nr >= SOFTMAX_LANES_MIN)
            softmax16(s, wt, i0, nr, ra, rb, act, m, l, corr, jlo, jb);
        else
            for (size_t i = i0; i < na; i++)
                softmax_row(s[i], ra[i], rb[i], &m[act[i]], &l[act[i]], &corr[i], jlo, jb);
    }
    /* o = o*corr + sum_j w_j v_j, PV_ROWS rows at a time over the rows' union [ja', jb') */
    size_t i0 = 0;
    for (; i0 + PV_ROWS <= na; i0 += PV_ROWS) {
        float *orow[PV_ROWS];
        size_t pa = n, pb = 0;
        for (size_t t = 0; t < PV_ROWS; t++) {
            orow[t] = o[act[i0 + t]];
            pa = ra[i0 + t] < pa ? ra[i0 + t] : pa;
            pb = rb[i0 + t] > pb ? rb[i0 + t] : pb;
        }
        if (lanes_layout(na, i0)) /* a PV group never straddles two softmax groups */
            pv_rows(orow, &corr[i0], wt + i0, ROWS_MAX, 1, pa, pb, vf, ldvf, hd);
        else
            pv_rows(orow, &corr[i0], s[i0], 1, KERN_ATTN_TILE, pa, pb, vf, ldvf, hd);
    }
    for (; i0 < na; i0++) { /* the rest one at a time, each over its own range */
        float *orow = o[act[i0]];
        if (lanes_layout(na, i0))
            pv_row1(&orow, &corr[i0], wt + i0, ROWS_MAX, ra[i0], rb[i0], vf, ldvf, hd);
        else
            pv_row1(&orow, &corr[i0], s[i0], 1, ra[i0], rb[i0], vf, ldvf, hd);
    }
}

/* tile_rows over any number of rows, ROWS_MAX at a time (rows are independent). */
static void tile_any(const float *const *q, float *const *o, float *m, float *l,
                     const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                     const void *k, size_t ldk, enum kform kf, const float *vf, size_t ldvf,
                     size_t n, size_t hd, float scale)
{
    for (size_t r0 = 0; r0 < nq; r0 += ROWS_MAX)
        tile_rows(q + r0, o + r0, m + r0, l + r0, lo ? lo + r0 : NULL, vis ? vis + r0 : NULL, j0,
                  nq - r0 < ROWS_MAX ? nq - r0 : ROWS_MAX, k, ldk, kf, vf, ldvf, n, hd, scale);
}

/* attn_drivers.h's tile: f32 K and V, row j at j*ldf floats. */
static void tile_f32(const float *const *q, float *const *o, float *m, float *l,
                     const uint32_t *lo, const uint32_t *vis, size_t j0, size_t nq,
                     const float *kf, const float *vf, size_t ldf, size_t n, size_t hd,
                     float scale)
{
    tile_any(q, o, m, l, lo, vis, j0, nq, kf, ldf * sizeof(float), KF_F32, vf, ldf, n, hd,
             scale);
}

/* n rows of hd f16 / bf16 elements (row j at src + j*ld bytes) -> dst [n][hd] f32. */
static void widen_f16(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint16_t *h = (const uint16_t *)(const void *)((const char *)src + j * ld);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            _mm512_mask_storeu_ps(dst + j * hd + d, mk,
                                  _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, h + d)));
        }
    }
}

static void widen_bf16(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint16_t *h = (const uint16_t *)(const void *)((const char *)src + j * ld);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, h + d));
            _mm512_mask_storeu_ps(dst + j * hd + d, mk,
                                  _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    }
}

/* n 8-bit KV head rows (kern.h: hd codes then an f32 scale; row j at src + j*ld bytes) ->
 * dst [n][hd] f32, bit for bit kern_kv8_dequant (as avx2_attn.c's). */
static void widen_kvi8(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)src + j * ld;
        float sc;
        memcpy(&sc, c + hd, sizeof sc);
        const __m512 vs = _mm512_set1_ps(sc);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, c + d)));
            _mm512_mask_storeu_ps(dst + j * hd + d, mk, _mm512_mul_ps(x, vs));
        }
    }
}

/* E4M3 through f16 bits, value / 2^8 exactly (avx2_attn.c's e4m3x8 explains). */
static void widen_kvf8(float *dst, const void *src, size_t ld, size_t n, size_t hd)
{
    for (size_t j = 0; j < n; j++) {
        const uint8_t *c = (const uint8_t *)src + j * ld;
        float sc;
        memcpy(&sc, c + hd, sizeof sc);
        const __m512 vs = _mm512_set1_ps(sc * 256.0f);
        for (size_t d = 0; d < hd; d += 16) {
            const __mmask16 mk = lanes(hd, d);
            const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mk, c + d));
            const __m256i h =
                _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                                _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
            _mm512_mask_storeu_ps(dst + j * hd + d, mk, _mm512_mul_ps(_mm512_cvtph_ps(h), vs));
        }
    }
}

#define ATTN_NO_WIDENED /* attn_widened_v below replaces it */
#include "attn_drivers.h"

/*
 * attn_widened for this ISA: V rows are widened into a stack sub-tile once for all rows (the
 * PV loop reads each V row once per 4 query rows), K rows go raw to the tile, which widens
 * them inside its transpose (transpose_k), so no widened K is written and read back.
 */
static void attn_widened_v(attn_widen_fn *widen_v, enum kform kf, const float *const *q,
                           float *const *o, float *m, float *l, const uint32_t *lo,
                           const uint32_t *vis, size_t nq, const void *k, const void *v,
                           size_t ld, size_t n, size_t hd, float scale)
{
    float vb[ATTN_BUF] __attribute__((aligned(64))); /* [rows][hd] widened V sub-tile */
    size_t rows = ATTN_BUF / hd;
    if (rows > KERN_ATTN_TILE)
        rows = KERN_ATTN_TILE;
    for (size_t j0 = 0; j0 < n; j0 += rows) {
        const size_t nt = n - j0 < rows ? n - j0 : rows;
        size_t from, need;
        if (!attn_rows_seen(lo, vis, nq, j0, nt, &from, &need))
            continue;
        widen_v(vb + from * hd, (const char *)v + (j0 + from) * ld, ld, need - from, hd);
        tile_any(q, o, m, l, lo, vis, j0, nq, (const char *)k + j0 * ld, ld, kf, vb, hd, need,
                 hd, scale);
    }
}

void kern_attn_f32_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                              const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                              const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_tiles_f32(q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_f16_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                              const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                              const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened_v(widen_f16, KF_F16, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_bf16_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                               const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                               const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened_v(widen_bf16, KF_BF16, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_kvi8_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                               const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                               const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened_v(widen_kvi8, KF_I8, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

void kern_attn_kvf8_f32_avx512(const float *const *q, float *const *o, float *m, float *l,
                               const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                               const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    attn_widened_v(widen_kvf8, KF_F8, q, o, m, l, lo, vis, nq, k, v, ld, n, hd, scale);
}

/* ---- the decode walk (kern_attn_blocks): up to 8 rows over whole 16-position blocks -------
 *
 * Session 20 (s20-attn4k). A decode step's rows (the GQA group of one KV head: gpt-oss and
 * TinyLlama 8) all see every position, and the paged cache hands them over as 16-position
 * blocks; per block, kern_attn spent as many cycles on the K transpose (256 shuffles), the
 * per-call setup and a half-empty 16-lane softmax as on its 1024 multiply-add vectors
 * (docs/PERFORMANCE.md, session 20). Here the rows are the lanes of one 8-lane vector:
 *  - q is transposed once per call (qt [hd][8]); a position's score of the 8 rows is then
 *    sum_d qt[d] * K[j][d] with K[j][d] a broadcast from memory: no K transpose, and the
 *    scores come out with a row per lane, as the softmax wants them;
 *  - m, l stay in registers from block to block; the weights of positions p and p+8 share
 *    one 16-lane vector, so a block's softmax is 8 exp16 and 1 for corr;
 *  - o = o*corr + sum_j w_j v_j is pv_rows / pv_row1 (4 rows x 64 lanes per V row loaded);
 *  - the K and V rows of the block two ahead are prefetched (they lie far apart in the arena).
 * Bits: every score, maximum, exp, sum and product is the one tile_rows computes for the
 * same row over the same block (scores: two FMA chains over even and odd d from 0, added,
 * times scale; the sum of the weights in softmax16's order; l*corr + sum rounded twice; o as
 * pv_rows), so a row gets the bits of kern_attn over each block in turn (the contract).
 */
#define DEC_ROWS 8  /* rows in lanes: one 8-lane vector */
#define DEC_SPAN 16 /* positions per block the walk takes (the paged cache's default) */
#define DEC_AHEAD 2 /* blocks between the one prefetched and the one computed */

/*
 * Scores of the rows at the 16 positions of a block: z[k] = positions k (lanes 0-7, a row per
 * lane) and k+8 (lanes 8-15), scale * q[r] . K[p], K[p] at kp + p*ldk floats (rows from nt on
 * zero). Lanes 2r and 2r+1 of an accumulator are row r's two FMA chains (even d, odd d), as
 * scores_rows8 keeps them in two vectors: qp [hd/2][16] holds q[r][d], q[r][d+1] at lanes 2r,
 * 2r+1 and the pair K[p][d], K[p][d+1] is one 64-bit broadcast, so each FMA is 16 useful
 * lanes with no transpose; the chains are then added (a0 + a1) and scaled, as there.
 */
struct dec_pf {
    const char *k;      /* K rows of the block to prefetch (V at k + voff), or NULL */
    size_t n, ld, voff; /* its rows, their stride */
    size_t bytes;       /* bytes of a head row */
    int tail;           /* rows not whole lines: one more line at the end */
};

/* The rows of pf's block into the cache, one K or V row per call i (i < 2n): spread over the
 * score loop, so the prefetches never queue up behind each other as a burst of 128 did. */
static inline __attribute__((always_inline)) void dec_prefetch_row(const struct dec_pf *pf,
                                                                   size_t i)
{
    if (!pf->k || i >= 2 * pf->n)
        return;
    const char *r = pf->k + (i >> 1) * pf->ld + (i & 1) * pf->voff;
    for (size_t off = 0; off < pf->bytes; off += 64)
        _mm_prefetch(r + off, _MM_HINT_T0);
    if (pf->tail)
        _mm_prefetch(r + pf->bytes - 1, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void dec_scores(const float *qp, const float *kp,
                                                             size_t ldk, size_t hd,
                                                             __m512 vscale, __m512 *z,
                                                             const struct dec_pf *pf)
{
    __m512 a[DEC_SPAN];
    _Pragma("GCC unroll 16") for (int p = 0; p < DEC_SPAN; p++) a[p] = _mm512_setzero_ps();
    for (size_t d = 0; d < hd; d += 2) {
        dec_prefetch_row(pf, d / 2);
        const __m512 qv = _mm512_load_ps(qp + d * 8);
        _Pragma("GCC unroll 16") for (int p = 0; p < DEC_SPAN; p++) {
            double kk;
            memcpy(&kk, kp + p * ldk + d, sizeof kk);
            a[p] = _mm512_fmadd_ps(qv, _mm512_castpd_ps(_mm512_set1_pd(kk)), a[p]);
        }
    }
    /* per 128-bit lane c: u = [p.a0 of rows 2c, 2c+1 | q.a0 of them], v = the a1 chains;
     * then lanes to rows 0-7 at p | rows 0-7 at q */
    const __m512i perm = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        const __m512 u = _mm512_shuffle_ps(a[k], a[k + 8], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 v = _mm512_shuffle_ps(a[k], a[k + 8], _MM_SHUFFLE(3, 1, 3, 1));
        z[k] = _mm512_permutexvar_ps(perm, _mm512_mul_ps(_mm512_add_ps(u, v), vscale));
    }
}

/* n rows of hd elements (row j at src + j*ld bytes, stored as kvt) -> dst [n][hd] f32, the
 * widening the tile applies (exact for f16/bf16; kern_kv8_dequant's bits for 8-bit rows). */
static void dec_widen(enum dtype kvt, float *dst, const void *src, size_t ld, size_t n,
                      size_t hd)
{
    switch (kvt) {
    case DT_F16: widen_f16(dst, src, ld, n, hd); break;
    case DT_BF16: widen_bf16(dst, src, ld, n, hd); break;
    case DT_KV_I8: widen_kvi8(dst, src, ld, n, hd); break;
    case DT_KV_E4M3: widen_kvf8(dst, src, ld, n, hd); break;
    default:
        for (size_t j = 0; j < n; j++)
            memcpy(dst + j * hd, (const char *)src + j * ld, hd * sizeof(float));
        break;
    }
}

/* The head rows of one block (K at kp, V at kp + voff; n rows of `bytes` at ld strides) into
 * the cache: for the block two ahead of the one being computed. */
static inline __attribute__((always_inline)) void dec_prefetch(const void *k, size_t voff,
                                                               size_t ld, size_t n, size_t bytes)
{
    const char *kp = k;
    /* a row that does not start on a line or is not whole lines (8-bit rows: hd + 4 bytes)
     * may end in one more line */
    const int tail = (((uintptr_t)kp | ld | bytes) & 63) != 0;
    for (size_t j = 0; j < n; j++) {
        const char *r = kp + j * ld;
        for (size_t off = 0; off < bytes; off += 64) {
            _mm_prefetch(r + off, _MM_HINT_T0);
            _mm_prefetch(r + voff + off, _MM_HINT_T0);
        }
        if (tail) {
            _mm_prefetch(r + bytes - 1, _MM_HINT_T0);
            _mm_prefetch(r + voff + bytes - 1, _MM_HINT_T0);
        }
    }
}

/*
 * qp [hd/2][8][2] = the rows' (q[r][2p], q[r][2p + 1]) pairs for r < nq, zero pairs for the
 * rows past nq: as 64-bit elements, an 8 x (hd/2) transpose, done in 8 x 8 blocks by unpacks
 * and 128-bit lane shuffles (bits moved, never computed on), for hd a multiple of 16. One float at a time it was a
 * third of this kernel's samples at 8 streams and short contexts (perf, session 27).
 */
static void dec_gather_q(float *qp, const float *const *q, size_t nq, size_t hd)
{
    /* hd a multiple of 16 (the walk's contract, below): whole 8 x 8 blocks of pairs */
    double *out = (double *)(void *)qp; /* [hd/2][8] pairs */
    for (size_t p0 = 0; p0 < hd / 2; p0 += 8) {
        __m512d v[DEC_ROWS];
        for (size_t r = 0; r < DEC_ROWS; r++) /* pairs p0..p0+7 of row r */
            v[r] = r < nq ? _mm512_castps_pd(_mm512_loadu_ps(q[r] + 2 * p0))
                          : _mm512_setzero_pd();
        __m512d t[DEC_ROWS], u[DEC_ROWS];
        for (size_t r = 0; r < DEC_ROWS; r += 2) { /* rows r, r+1: even pairs; odd pairs */
            t[r] = _mm512_unpacklo_pd(v[r], v[r + 1]);
            t[r + 1] = _mm512_unpackhi_pd(v[r], v[r + 1]);
        }
        for (size_t h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
            __m512d *a = t + 4 * h, *b = u + 4 * h;
            b[0] = _mm512_shuffle_f64x2(a[0], a[2], 0x88); /* pairs 0, 4 */
            b[1] = _mm512_shuffle_f64x2(a[0], a[2], 0xdd); /* 2, 6 */
            b[2] = _mm512_shuffle_f64x2(a[1], a[3], 0x88); /* 1, 5 */
            b[3] = _mm512_shuffle_f64x2(a[1], a[3], 0xdd); /* 3, 7 */
        }
        static const int pair_of[4] = {0, 2, 1, 3}; /* u[k] holds pairs pair_of[k], +4 */
        for (size_t k = 0; k < 4; k++) {
            _mm512_store_pd(out + (p0 + (size_t)pair_of[k]) * DEC_ROWS,
                            _mm512_shuffle_f64x2(u[k], u[k + 4], 0x88));
            _mm512_store_pd(out + (p0 + (size_t)pair_of[k] + 4) * DEC_ROWS,
                            _mm512_shuffle_f64x2(u[k], u[k + 4], 0xdd));
        }
    }
}

/* kern_attn_blocks (kern.h) for nq <= 8 rows, bt == 16, hd a multiple of 16, kvt f32, f16,
 * bf16 or an 8-bit KV type (attn.c's kern_attn_blocks_fits also asks nq >= 4). */
void kern_attn_blocks_avx512(enum dtype kvt, const float *const *q, float *const *o, float *m,
                             float *l, size_t nq, const void *const *kb, size_t voff, size_t ld,
                             size_t bt, size_t n, size_t hd, float scale)
{
    (void)bt;
    const size_t rowb = kvt == DT_F32                         ? hd * 4 /* one head row's bytes */
                        : kvt == DT_F16 || kvt == DT_BF16 ? hd * 2
                                                          : hd + 4;
    float qp[KERN_ATTN_HD_MAX * DEC_ROWS] __attribute__((aligned(64))); /* [hd/2][8][2] */
    float kw[DEC_SPAN * KERN_ATTN_HD_MAX] __attribute__((aligned(64))); /* [16][hd] widened K */
    float vw[DEC_SPAN * KERN_ATTN_HD_MAX] __attribute__((aligned(64))); /* [16][hd] widened V */
    float wt[DEC_SPAN * DEC_ROWS] __attribute__((aligned(64)));         /* [16][8] weights */
    float corr[DEC_ROWS] __attribute__((aligned(32)));
    dec_gather_q(qp, q, nq, hd);
    const __mmask8 rows = (__mmask8)((1u << nq) - 1u);
    __m256 vm = _mm256_mask_loadu_ps(_mm256_setzero_ps(), rows, m);
    __m256 vl = _mm256_mask_loadu_ps(_mm256_setzero_ps(), rows, l);
    const __m512 vscale = _mm512_set1_ps(scale);
    const size_t nblk = (n + DEC_SPAN - 1) / DEC_SPAN;
    const size_t D = DEC_AHEAD;
    const int tail = ((ld | rowb | voff) & 63) != 0; /* rows off lines (and a block's start) */
    for (size_t b = 0; b < D && b < nblk; b++)
        dec_prefetch(kb[b], voff, ld, n - b * DEC_SPAN < DEC_SPAN ? n - b * DEC_SPAN : DEC_SPAN,
                     rowb);
    for (size_t b = 0; b < nblk; b++) {
        const size_t nt = n - b * DEC_SPAN < DEC_SPAN ? n - b * DEC_SPAN : DEC_SPAN;
        struct dec_pf pf = {NULL, 0, ld, voff, rowb, tail};
        if (b + D < nblk) {
            pf.k = kb[b + D];
            pf.n = n - (b + D) * DEC_SPAN < DEC_SPAN ? n - (b + D) * DEC_SPAN : DEC_SPAN;
            pf.tail = tail || ((uintptr_t)pf.k & 63) != 0;
            if (hd < 4 * DEC_SPAN) { /* fewer score iterations than rows to fetch: at once */
                dec_prefetch(pf.k, voff, ld, pf.n, rowb);
                pf.k = NULL;
            }
        }
        const uint8_t *kp = kb[b];
        const float *kf, *vf; /* [16][ldk] K, [nt][ldv] V as f32 */
        size_t ldk, ldv;
        if (kvt == DT_F32 && nt == DEC_SPAN) { /* read in place */
            kf = (const float *)(const void *)kp;
            vf = (const float *)(const void *)(kp + voff);
            ldk = ldv = ld / sizeof(float);
        } else { /* widened (a partial block: the rows past nt zero, never weighted) */
            dec_widen(kvt, kw, kp, ld, nt, hd);
            dec_widen(kvt, vw, kp + voff, ld, nt, hd);
            if (nt < DEC_SPAN)
                memset(kw + nt * hd, 0, (DEC_SPAN - nt) * hd * sizeof(float));
            kf = kw, vf = vw, ldk = ldv = hd;
        }
        __m512 z[8]; /* positions k (lanes 0-7) and k+8 (lanes 8-15), a row per lane */
        dec_scores(qp, kf, ldk, hd, vscale, z, &pf);
        const __mmask16 valid = (__mmask16)((1u << nt) - 1u); /* bit p: position p < nt */
        __m512 zmx = _mm512_set1_ps(-INFINITY);
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {
            const __mmask16 mk = (__mmask16)(((valid >> p) & 1u ? 0x00ffu : 0u) |
                                              ((valid >> (p + 8)) & 1u ? 0xff00u : 0u));
            zmx = _mm512_mask_max_ps(zmx, mk, zmx, z[p]);
        }
        const __m256 mx = _mm256_max_ps(_mm512_castps512_ps256(zmx),
                                        _mm512_extractf32x8_ps(zmx, 1));
        const __m256 mn = _mm256_max_ps(vm, mx); /* m > mx ? m : mx */
        const __m256 vc = _mm512_castps512_ps256(
            exp16(_mm512_castps256_ps512(_mm256_sub_ps(vm, mn)))); /* 0 on the first block */
        const __m512 mn2 = _mm512_insertf32x8(_mm512_castps256_ps512(mn), mn, 1);
        __m256 acc[8];
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {
            const __mmask16 mk = (__mmask16)(((valid >> p) & 1u ? 0x00ffu : 0u) |
                                              ((valid >> (p + 8)) & 1u ? 0xff00u : 0u));
            const __m512 e = _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(z[p], mn2)));
            _mm256_store_ps(wt + p * DEC_ROWS, _mm512_castps512_ps256(e));
            _mm256_store_ps(wt + (p + 8) * DEC_ROWS, _mm512_extractf32x8_ps(e, 1));
            /* softmax16's tree: acc[p] = e_{p+8} + e_p, then + 4 apart, then (0+2) + (1+3) */
            acc[p] = _mm256_add_ps(_mm512_extractf32x8_ps(e, 1), _mm512_castps512_ps256(e));
        }
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) acc[p] =
            _mm256_add_ps(acc[p + 4], acc[p]);
        const __m256 sum =
            _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        vl = _mm256_add_ps(_mm256_mul_ps(vl, vc), sum);
        vm = mn;
        _mm256_store_ps(corr, vc);
        /* o = o*corr + sum_j w_j v_j, 4 rows at a time, then the rest one by one */
        size_t r0 = 0;
        for (; r0 + PV_ROWS <= nq; r0 += PV_ROWS)
            pv_rows(o + r0, corr + r0, wt + r0, DEC_ROWS, 1, 0, nt, vf, ldv, hd);
        for (; r0 < nq; r0++)
            pv_row1(o + r0, corr + r0, wt + r0, DEC_ROWS, 0, nt, vf, ldv, hd);
    }
    _mm256_mask_storeu_ps(m, rows, vm);
    _mm256_mask_storeu_ps(l, rows, vl);
}
