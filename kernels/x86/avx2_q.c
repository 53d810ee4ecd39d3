/*
 * avx2_q.c — AVX2 kernels for q8_0, q4_0 and mxfp4 weights against int8 activations (compiled
 * with -mavx2 -mfma -mf16c).
 *
 * vpmaddubsw multiplies unsigned by signed bytes into saturating int16 pairs, so operands are
 * arranged to stay below saturation: q4_0 nibbles (0..15) or |w| <= 128 times activation quants
 * |q| <= 127 (at most 2*128*127 = 32512 per pair); vpmaddwd with ones then sums to int32.
 *  - q4_0: unsigned nibbles x signed quants; the accumulator starts at (minus the sum of the
 *    quants) * 8 to undo the +8 (gemv: per 4-element lane, kern_act.ns4; gemm: per block,
 *    kern_act.ns32).
 *  - q8_0: |w| x sign(q, w) (vpsignb), needing no correction.
 *  - mxfp4: the nibbles index the 16-entry int8 table quant_mxfp4_kvalues (vpshufb), giving
 *    signed weights |w| <= 12 that then go the q8_0 way; the block scale is 2^(e-128)
 *    (quant_e8m0_half), exact, so the products are as exact as q8_0's (spec §4.5).
 * gemv streams the stored layout one block per register; gemm packs 8-row panels (one row per
 * int32 lane, 8x8 dword transpose) and reuses each 4-column weight group for 4 tokens.
 * mxfp4's gemv reproduces the gemm's sums and order instead (batch invariance, "mxfp4 gemv").
 */
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

enum qk { QK_Q8_0, QK_Q4_0, QK_MXFP4 };

static const size_t blk_bytes[] = {[QK_Q8_0] = 34, [QK_Q4_0] = 18, [QK_MXFP4] = 17};
static const enum dtype qk_dtype[] = {[QK_Q8_0] = DT_Q8_0, [QK_Q4_0] = DT_Q4_0,
                                      [QK_MXFP4] = DT_MXFP4};

INLINE float load_f16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

INLINE int32_t load_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The 32 nibbles (0..15) of 16 split-half bytes at qs (q4_0, mxfp4), in element order. */
INLINE __m256i nibbles(const uint8_t *qs)
{
    __m256i z = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    z = _mm256_srlv_epi64(z, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
}

/* A block's weight scale: f16 d, or mxfp4's 2^(e-128). */
INLINE float wscale(enum qk k, const uint8_t *blk)
{
    return k == QK_MXFP4 ? quant_e8m0_half(blk[0]) : load_f16(blk);
}

/* A block's 32 weights as signed bytes for the |w| x sign(q, w) products (q8_0, mxfp4). */
INLINE __m256i signed_quants(enum qk k, const uint8_t *blk)
{
    if (k == QK_MXFP4) /* vpshufb: the same 16-entry table in both 128-bit lanes */
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_mxfp4_kvalues)),
            nibbles(blk + 1));
    return _mm256_loadu_si256((const __m256i *)(blk + 2));
}

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- gemv -------------------------------------------------------------------------------- */

/* Blocks are processed in pairs with one accumulator each, so two FMA chains are in flight;
 * the row stream is prefetched PF_DIST bytes ahead (see avx512_q.c). */
#define PF_DIST 2048

INLINE void gemv_tile(enum qk k, const uint8_t *w, size_t rb, size_t r, int NR,
                      const struct kern_act *a, size_t t, int NT, float *y, size_t ldy)
{
    const size_t bb = blk_bytes[k], cp = a->cp, nb = a->cols / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][2][2];
    UNROLL for (int i = 0; i < NR; i++) UNROLL for (int j = 0; j < NT; j++)
    {
        acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    }

    for (size_t b = 0; b < nb; b += 2) {
        UNROLL for (int i = 0; i < NR; i++) _mm_prefetch(
            (const char *)(w + (r + (size_t)i) * rb + b * bb + PF_DIST), _MM_HINT_T0);
        UNROLL for (int h = 0; h < 2; h++)
        {
            size_t bh = b + (size_t)h;
            if (h == 1 && bh >= nb)
                break;
            __m256i wz[4], wa[4];
            float dw[4];
            UNROLL for (int i = 0; i < NR; i++)
            {
                const uint8_t *blk = w + (r + (size_t)i) * rb + bh * bb;
                dw[i] = wscale(k, blk);
                if (k == QK_Q4_0) {
                    wz[i] = nibbles(blk + 2);
                } else {
                    wz[i] = signed_quants(k, blk);
                    wa[i] = _mm256_abs_epi8(wz[i]);
                }
            }
            UNROLL for (int j = 0; j < NT; j++)
            {
                size_t tj = t + (size_t)j;
                __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + tj * a->ld + bh * 32));
                float dx = a->d[tj * cp / 32 + bh];
                __m256i ns = _mm256_setzero_si256();
                if (k == QK_Q4_0)
                    ns = _mm256_loadu_si256((const __m256i *)(a->ns4 + (tj * cp + bh * 32) / 4));
                UNROLL for (int i = 0; i < NR; i++)
                {
                    __m256i p;
                    if (k == QK_Q4_0)
                        p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wz[i], q), ones), ns);
                    else
                        p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[i], _mm256_sign_epi8(q, wz[i])), ones);
                    acc[i][j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw[i] * dx),
                                                   acc[i][j][h]);
                }
            }
        }
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int i = 0; i < NR; i++)
        y[(t + (size_t)j) * ldy + r + (size_t)i] =
            hsum8(_mm256_add_ps(acc[i][j][0], acc[i][j][1]));
}

/* One row at a time (a single sequential stream, see avx512_q.c), up to 2 tokens. */
#define GEMV_NR 1
#define GEMV_NT 2

INLINE void gemv_q(enum qk k, const void *w, const struct kern_act *a, float *y, size_t ldy,
                   size_t r0, size_t r1)
{
    size_t rb = kern__row_bytes(qk_dtype[k], a->cols);
    for (size_t r = r0; r < r1; r += GEMV_NR) {
        size_t nr = r1 - r < GEMV_NR ? r1 - r : GEMV_NR;
        for (size_t t = 0; t < a->n; t += GEMV_NT) {
            size_t nt = a->n - t < GEMV_NT ? a->n - t : GEMV_NT;
            switch (nr * 16 + nt) {
#define CASE_(R, T)                                                                          \
    case R * 16 + T:                                                                         \
        if (R <= GEMV_NR && T <= GEMV_NT)                                                    \
            gemv_tile(k, w, rb, r, R, a, t, T, y, ldy);                                      \
        break;
                CASE_(1, 1) CASE_(1, 2) CASE_(2, 1) CASE_(2, 2)
#undef CASE_
            }
        }
    }
}

void kern_gemv_q8_0_q8_0_avx2(const void *w, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    gemv_q(QK_Q8_0, w, a, y, ldy, r0, r1);
}

void kern_gemv_q4_0_q8_0_avx2(const void *w, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    gemv_q(QK_Q4_0, w, a, y, ldy, r0, r1);
}

/* kern_gemv_mxfp4_q8_0_avx2 is below the gemm, whose order it reproduces. */

/* ---- gemm -------------------------------------------------------------------------------- */

#define PANEL 8   /* rows per panel: one per int32 lane */
#define KC 1024   /* columns per packed chunk: 8 KiB of quants */
#define GEMM_NT 4 /* tokens per register tile */

struct panel {
    __m256i p[KC / 4];       /* [KC/32 blocks][8 groups] x 8 rows x 4 bytes (q4_0: nibbles,
                                q8_0 and mxfp4: signed quants) */
    float s[KC / 32][PANEL]; /* weight scale per block and row (0 for absent rows) */
};

/* In-register transpose of an 8x8 matrix of dwords (r[i] = row i). */
INLINE void transpose8(__m256i r[8])
{
    __m256i t[8], u[8];
    UNROLL for (int i = 0; i < 4; i++)
    {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    UNROLL for (int i = 0; i < 2; i++)
    {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    UNROLL for (int c = 0; c < 4; c++)
    {
        r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

INLINE void pack_panel(enum qk k, const uint8_t *w, size_t rb, size_t r, size_t nr, size_t k0,
                       size_t kc, struct panel *pn)
{
    const size_t bb = blk_bytes[k];
    for (size_t b = 0; b < kc / 32; b++) {
        __m256i z[8];
        UNROLL for (int i = 0; i < PANEL; i++)
        {
            if ((size_t)i < nr) {
                const uint8_t *blk = w + (r + (size_t)i) * rb + (k0 / 32 + b) * bb;
                pn->s[b][i] = wscale(k, blk);
                if (k == QK_Q4_0)
                    z[i] = nibbles(blk + 2);
                else
                    z[i] = signed_quants(k, blk);
            } else {
                pn->s[b][i] = 0.0f;
                z[i] = _mm256_setzero_si256();
            }
        }
        transpose8(z);
        UNROLL for (int g = 0; g < 8; g++) pn->p[b * 8 + (size_t)g] = z[g];
    }
}

INLINE void gemm_tile(enum qk k, const struct panel *pn, size_t nblk, const struct kern_act *a,
                      size_t k0, size_t t, int NT, float *y, size_t ldy, size_t r, size_t nr,
                      int add)
{
    const size_t cp = a->cp;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 facc[GEMM_NT];
    const int8_t *xq[GEMM_NT];
    const float *xd[GEMM_NT];
    const int32_t *xs[GEMM_NT];
    UNROLL for (int j = 0; j < NT; j++)
    {
        size_t tj = t + (size_t)j;
        facc[j] = _mm256_setzero_ps();
        xq[j] = a->q + tj * a->ld + k0;
        xd[j] = a->d + (tj * cp + k0) / 32;
        xs[j] = a->ns32 + (tj * cp + k0) / 32;
    }
    for (size_t b = 0; b < nblk; b++) {
        __m256i iacc[GEMM_NT];
        UNROLL for (int j = 0; j < NT; j++) iacc[j] =
            k == QK_Q4_0 ? _mm256_set1_epi32(xs[j][b]) : _mm256_setzero_si256();
        UNROLL for (int g = 0; g < 8; g++)
        {
            __m256i wv = pn->p[b * 8 + (size_t)g];
            __m256i wa = k != QK_Q4_0 ? _mm256_abs_epi8(wv) : wv;
            UNROLL for (int j = 0; j < NT; j++)
            {
                __m256i xv = _mm256_set1_epi32(load_i32(xq[j] + b * 32 + (size_t)g * 4));
                __m256i p16 = k == QK_Q4_0 ? _mm256_maddubs_epi16(wv, xv)
                                           : _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, wv));
                iacc[j] = _mm256_add_epi32(iacc[j], _mm256_madd_epi16(p16, ones));
            }
        }
        __m256 s = _mm256_loadu_ps(pn->s[b]);
        UNROLL for (int j = 0; j < NT; j++)
        {
            if (k == QK_MXFP4) { /* scales first, as _ref: 2^(e-128) spans 2^-128..2^126, and
                                    sum * dx alone may overflow where the product does not */
                facc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[j]),
                                          _mm256_mul_ps(s, _mm256_set1_ps(xd[j][b])), facc[j]);
                continue;
            }
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[j]), _mm256_set1_ps(xd[j][b]));
            facc[j] = _mm256_fmadd_ps(f, s, facc[j]);
        }
    }
    UNROLL for (int j = 0; j < NT; j++)
    {
        float *yo = y + (t + (size_t)j) * ldy + r;
        if (nr == PANEL) {
            if (add)
                facc[j] = _mm256_add_ps(facc[j], _mm256_loadu_ps(yo));
            _mm256_storeu_ps(yo, facc[j]);
        } else {
            float tmp[PANEL];
            _mm256_storeu_ps(tmp, facc[j]);
            for (size_t i = 0; i < nr; i++)
                yo[i] = add ? yo[i] + tmp[i] : tmp[i];
        }
    }
}

INLINE void gemm_q(enum qk k, const void *w, const struct kern_act *a, float *y, size_t ldy,
                   size_t r0, size_t r1)
{
    size_t rb = kern__row_bytes(qk_dtype[k], a->cols);
    struct panel pn __attribute__((aligned(32)));
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
            size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
            pack_panel(k, w, rb, r, nr, k0, kc, &pn);
            for (size_t t = 0; t < a->n; t += GEMM_NT) {
                size_t nt = a->n - t < GEMM_NT ? a->n - t : GEMM_NT;
                switch (nt) {
#define CASE_(T)                                                                             \
    case T:                                                                                  \
        gemm_tile(k, &pn, kc / 32, a, k0, t, T, y, ldy, r, nr, k0 > 0);                      \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4)
#undef CASE_
                }
            }
        }
    }
}

void kern_gemm_q8_0_q8_0_avx2(const void *w, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    gemm_q(QK_Q8_0, w, a, y, ldy, r0, r1);
}

void kern_gemm_q4_0_q8_0_avx2(const void *w, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    gemm_q(QK_Q4_0, w, a, y, ldy, r0, r1);
}

void kern_gemm_mxfp4_q8_0_avx2(const void *w, const struct kern_act *a, float *y, size_t ldy,
                               size_t r0, size_t r1)
{
    gemm_q(QK_MXFP4, w, a, y, ldy, r0, r1);
}

/* ---- mxfp4 gemv: the gemm's sums in the gemm's order (batch invariance) -------------------- */

/*
 * As in avx512_q.c: whether the gemv or the gemm serves a token must not change its bits (a
 * MoE expert's token count depends on the rest of the batch; issue 13), so this gemv computes
 * what gemm_tile computes per (row, token): each block's exact integer sum, then per KC chunk
 * facc = fma(float(sum), s * dx, facc) from 0 in block order, lane = row, chunks added in order
 * through y. An 8-row panel is contiguous, so it is streamed row by row; each row's blocks are
 * multiplied as the former gemv did and each 8-block group reduced to its 8 block sums
 * (gv_reduce), kept in gv_buf, then transposed to lane = row (transpose8) and folded.
 */
#define GV_NT 2   /* tokens per pass over a panel */
#define GV_WB 128 /* blocks per column window (a multiple of KC / 32) */

struct gv_buf {
    int32_t isum[GV_NT][PANEL][GV_WB]; /* exact block sums [token][row][block] */
    float ws[PANEL][GV_WB];            /* weight scales 2^(e-128) [row][block] */
    float wst[GV_WB][PANEL];           /* the same, lane = row (as struct panel's s) */
};

/* 8 vectors of dword partial sums (one block each) -> the 8 block sums, in order (exact). */
INLINE __m256i gv_reduce(const __m256i p[8])
{
    __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    /* h0, 128-bit lane L: the lane-L sums of p[0..3]; h1 of p[4..7] */
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                            _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* One row's block sums over blocks [0, nbk) of the window at block kb, tokens t..t+NT-1, into
 * bf->isum[j][i] and, if want_s, its scales into bf->ws[i]; up to nbk rounded to 8 (0 past). */
INLINE void gv_row(const uint8_t *row, size_t nbk, const struct kern_act *a, size_t kb,
                   size_t t, int NT, struct gv_buf *bf, size_t i, int want_s)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (size_t g = 0; g < nbk; g += 8) {
        const uint8_t *gb = row + g * 17;
        size_t rem = nbk - g < 8 ? nbk - g : 8;
        UNROLL for (size_t l = 0; l < 8 * 17; l += 64) _mm_prefetch((const char *)gb + PF_DIST + l,
                                                                    _MM_HINT_T0);
        __m256i wz[8], wa[8];
        UNROLL for (size_t b = 0; b < 8; b++)
        {
            if (b < rem) {
                wz[b] = signed_quants(QK_MXFP4, gb + 17 * b);
                wa[b] = _mm256_abs_epi8(wz[b]);
            } else {
                wz[b] = wa[b] = _mm256_setzero_si256();
            }
            if (want_s)
                bf->ws[i][g + b] = b < rem ? quant_e8m0_half(gb[17 * b]) : 0.0f;
        }
        UNROLL for (int j = 0; j < NT; j++)
        {
            const int8_t *xq = a->q + (t + (size_t)j) * a->ld + (kb + g) * 32;
            __m256i p[8];
            UNROLL for (size_t b = 0; b < 8; b++) p[b] =
                b < rem ? _mm256_madd_epi16(
                              _mm256_maddubs_epi16(
                                  wa[b], _mm256_sign_epi8(
                                             _mm256_loadu_si256((const __m256i *)(xq + 32 * b)), wz[b])),
                              ones)
                        : _mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(void *)(bf->isum[j][i] + g), gv_reduce(p));
        }
    }
}

/* y[t+j][r..r+8) (+)= the panel's window [kb, kb + nbk) for tokens j < NT: gemm_tile's float
 * steps, in its order, on the transposed sums of bf (rows >= nr read row 0, not stored). */
INLINE void gv_fold(const struct gv_buf *bf, size_t nbk, const struct kern_act *a, size_t kb,
                    size_t t, int NT, float *y, size_t ldy, size_t r, size_t nr)
{
    for (size_t c0 = 0; c0 < nbk; c0 += KC / 32) {
        size_t cn = nbk - c0 < KC / 32 ? nbk - c0 : KC / 32;
        size_t k0 = (kb + c0) * 32;
        UNROLL for (int j = 0; j < NT; j++)
        {
            size_t tj = t + (size_t)j;
            const float *xd = a->d + (tj * a->cp + k0) / 32;
            __m256 facc = _mm256_setzero_ps();
            for (size_t g0 = 0; g0 < cn; g0 += 8) {
                __m256i z[8];
                UNROLL for (size_t i = 0; i < PANEL; i++) z[i] = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(bf->isum[j][i < nr ? i : 0] + c0 + g0));
                transpose8(z);
                size_t gn = cn - g0 < 8 ? cn - g0 : 8;
                for (size_t g = 0; g < gn; g++)
                    facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(z[g]),
                                           _mm256_mul_ps(_mm256_loadu_ps(bf->wst[c0 + g0 + g]),
                                                         _mm256_set1_ps(xd[g0 + g])),
                                           facc);
            }
            /* gemm_tile's store */
            float *yo = y + tj * ldy + r;
            float tmp[PANEL];
            _mm256_storeu_ps(tmp, facc);
            for (size_t i = 0; i < nr; i++)
                yo[i] = k0 > 0 ? yo[i] + tmp[i] : tmp[i];
        }
    }
}

void kern_gemv_mxfp4_q8_0_avx2(const void *w, const struct kern_act *a, float *y, size_t ldy,
                               size_t r0, size_t r1)
{
    const size_t rb = kern__row_bytes(DT_MXFP4, a->cols), nb = a->cols / 32;
    struct gv_buf bf __attribute__((aligned(32)));
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        for (size_t kb = 0; kb < nb; kb += GV_WB) {
            size_t nbk = nb - kb < GV_WB ? nb - kb : GV_WB;
            for (size_t t = 0; t < a->n; t += GV_NT) {
                size_t nt = a->n - t < GV_NT ? a->n - t : GV_NT;
                for (size_t i = 0; i < nr; i++) {
                    const uint8_t *row = (const uint8_t *)w + (r + i) * rb + kb * 17;
                    if (nt == 1)
                        gv_row(row, nbk, a, kb, t, 1, &bf, i, t == 0);
                    else
                        gv_row(row, nbk, a, kb, t, 2, &bf, i, t == 0);
                }
                if (t == 0) /* the scales, lane = row, once per window */
                    for (size_t g = 0; g < nbk; g += 8) {
                        __m256i z[8];
                        UNROLL for (size_t i = 0; i < PANEL; i++) z[i] = _mm256_castps_si256(
                            _mm256_loadu_ps(bf.ws[i < nr ? i : 0] + g));
                        transpose8(z);
                        size_t gn = nbk - g < 8 ? nbk - g : 8;
                        for (size_t b = 0; b < gn; b++)
                            _mm256_storeu_ps(bf.wst[g + b], _mm256_castsi256_ps(z[b]));
                    }
                if (nt == 1)
                    gv_fold(&bf, nbk, a, kb, t, 1, y, ldy, r, nr);
                else
                    gv_fold(&bf, nbk, a, kb, t, 2, y, ldy, r, nr);
            }
        }
    }
}
