/*
 * avx512_q4g.c — AVX-512 VNNI kernels for the int4 group types (q4_g64, q4_g128, q4z_g32,
 * q4z_g64, q4z_g128; kernels/include/quant.h) against int8 activations (compiled with -mavx512*).
 *
 * Modelled on avx512_q.c's q4_0 gemv: 64 columns (two nibble arrays) are unpacked into one
 * zmm of unsigned codes 0..15 in element order and multiplied with the signed activation
 * quants by vpdpbusd, so lane l holds the sum over 4 consecutive columns.
 *  - q4_gN: the accumulator starts at kern_act.ns4 = -8 * (sum of those 4 quants), which
 *    turns the unsigned codes into q - 8 exactly; lane * dx * dw as for q4_0.
 *  - q4z_gN: the dot starts at 0 and the offset term m * dx * sum(xq) is folded in per lane
 *    as (-m/8) * ns4 (exact: ns4 is an integer multiple of -8 and /8 is exact in f32):
 *    (dot * dw + ns4 * (-m/8)) * dx.
 * With groups of 64/128 one scale (and offset) covers a whole zmm, so it is broadcast once per
 * 64 columns; q4z_g32 spreads two groups over the lanes as avx512_q.c's scale_pair does.
 * gemv: one generic tile (rows x tokens) specialised per type by constant arguments, used as
 * 1 row x 2 tokens (the row stream read once, prefetched, two FMA chains per output).
 * gemm: avx512_q.c's q4_0 scheme — 16-row panels unpacked to codes and transposed so one zmm
 * holds 4 columns of 16 rows, vpdpbusd against broadcast activation quads, per-block row scales
 * (and offsets) applied once per 32 columns; one 16 KiB panel reused by every token tile.
 */
#include "internal.h"
#include "quant.h"

#include "avx512_common.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define PF_DIST 4096 /* bytes ahead in the row stream, as avx512_q.c's q4_0 gemv */

INLINE uint16_t load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Codes of the nibble arrays at qa and qb (NULL: zeros) as bytes 0..31 and 32..63. */
INLINE __m512i unpack64(const uint8_t *qa, const uint8_t *qb)
{
    __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa));
    __m256i b = qb ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb))
                   : _mm256_setzero_si256();
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    /* [qa, qa, qb, qb]: the second copy of each shifted by 4 so its high nibbles land next */
    z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* [f16 at pa x 8 lanes, f16 at pb x 8 lanes] as f32 (pb NULL: 0). */
INLINE __m512 f16_pair(const uint8_t *pa, const uint8_t *pb)
{
    uint16_t ha = load_u16(pa), hb = pb ? load_u16(pb) : 0;
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)ha)),
                                        _mm_set1_epi16((short)hb), 1);
    return _mm512_cvtph_ps(h);
}

/*
 * One 64-column chunk, columns [c, c+64), of NR rows x NT tokens, added into acc: per row i,
 * the nibble arrays qa[i] and qb[i] (NULL: the chunk has only 32 columns) with the headers
 * (scale, offset) ha[i] and hb[i]; for G >= 2 both arrays are in one group, ha == hb.
 * Operands are arrays indexed by compile-time loop indices only, so after inlining and
 * unrolling they live in registers.
 */
INLINE void chunk(int G, int Z, int NR, const uint8_t *const *ha, const uint8_t *const *qa,
                  const uint8_t *const *hb, const uint8_t *const *qb, const struct kern_act *a,
                  size_t t, int NT, size_t c, __m512 acc[4][4])
{
    const size_t cp = a->cp;
    __m512i wz[4];
    __m512 dw[4], mw[4];
    UNROLL for (int i = 0; i < NR; i++)
    {
        wz[i] = unpack64(qa[i], qb[i]);
        if (G == 1) {
            dw[i] = f16_pair(ha[i], qb[i] ? hb[i] : NULL);
            if (Z)
                mw[i] = _mm512_mul_ps(f16_pair(ha[i] + 2, qb[i] ? hb[i] + 2 : NULL),
                                      _mm512_set1_ps(-0.125f));
        } else {
            dw[i] = _mm512_set1_ps(_cvtsh_ss(load_u16(ha[i])));
            if (Z)
                mw[i] = _mm512_set1_ps(_cvtsh_ss(load_u16(ha[i] + 2)) * -0.125f);
        }
    }
    UNROLL for (int j = 0; j < NT; j++)
    {
        size_t tj = t + (size_t)j;
        /* past the last block the activation rows are zero padded up to cp (64) */
        __m512i q = _mm512_loadu_si512(a->q + tj * a->ld + c);
        __m512i ns = _mm512_loadu_si512(a->ns4 + tj * cp / 4 + c / 4);
        __m512 dx = _mm512_loadu_ps(a->d4 + tj * cp / 4 + c / 4);
        UNROLL for (int i = 0; i < NR; i++)
        {
            if (Z) {
                __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wz[i], q);
                __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dw[i],
                                           _mm512_mul_ps(_mm512_cvtepi32_ps(ns), mw[i]));
                acc[i][j] = _mm512_fmadd_ps(f, dx, acc[i][j]);
            } else {
                __m512i dot = _mm512_dpbusd_epi32(ns, wz[i], q);
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), dx);
                acc[i][j] = _mm512_fmadd_ps(f, dw[i], acc[i][j]);
            }
        }
    }
}

/*
 * NR rows x NT tokens of a type with G blocks of 32 per group (1, 2, 4) and, if Z, an offset.
 * The main loop walks 128 columns at a time with plain pointer steps (4/G blocks) and puts
 * its two chunks into two accumulator sets, so each output has two independent FMA chains.
 */
INLINE void tile(int G, int Z, const uint8_t *w, size_t rb, size_t r, int NR,
                 const struct kern_act *a, size_t t, int NT, float *y, size_t ldy, int pf)
{
    const size_t hd = Z ? 4 : 2, bb = hd + 16 * (size_t)G, cols = a->cols;
    const uint8_t *p[4], *ha[4], *qa[4], *hb[4], *qb[4];
    __m512 acc0[4][4], acc1[4][4];
    UNROLL for (int i = 0; i < NR; i++)
    {
        p[i] = w + (r + (size_t)i) * rb;
        UNROLL for (int j = 0; j < NT; j++) acc0[i][j] = acc1[i][j] = _mm512_setzero_ps();
    }
    size_t c = 0;
    for (; c + 128 <= cols; c += 128) {
        UNROLL for (int i = 0; i < NR; i++)
        {
            if (pf)
                _mm_prefetch((const char *)p[i] + PF_DIST, _MM_HINT_T0);
            /* arrays 0, 1 of this 128: G=1 blocks 0, 1; G=2 block 0; G=4 block 0 */
            ha[i] = p[i];
            qa[i] = p[i] + hd;
            hb[i] = G == 1 ? p[i] + bb : p[i];
            qb[i] = G == 1 ? p[i] + bb + hd : p[i] + hd + 16;
        }
        chunk(G, Z, NR, ha, qa, hb, qb, a, t, NT, c, acc0);
        UNROLL for (int i = 0; i < NR; i++)
        {
            /* arrays 2, 3: G=1 blocks 2, 3; G=2 block 1; G=4 block 0's arrays 2, 3 */
            const uint8_t *h2 = G == 1 ? p[i] + 2 * bb : G == 2 ? p[i] + bb : p[i];
            ha[i] = h2;
            qa[i] = G == 4 ? h2 + hd + 32 : h2 + hd;
            hb[i] = G == 1 ? h2 + bb : h2;
            qb[i] = G == 1 ? h2 + bb + hd : qa[i] + 16;
            p[i] += 4 / G * bb;
        }
        chunk(G, Z, NR, ha, qa, hb, qb, a, t, NT, c + 64, acc1);
    }
    for (; c < cols; c += 64) {
        /* fewer than 128 columns left: G = 1 (32 or 96 columns) or G = 2 (64) */
        const int has_b = c + 64 <= cols;
        UNROLL for (int i = 0; i < NR; i++)
        {
            ha[i] = p[i];
            qa[i] = p[i] + hd;
            hb[i] = G == 1 ? p[i] + bb : p[i];
            qb[i] = !has_b ? NULL : G == 1 ? p[i] + bb + hd : p[i] + hd + 16;
            p[i] += G == 1 ? 2 * bb : bb;
        }
        chunk(G, Z, NR, ha, qa, hb, qb, a, t, NT, c, acc0);
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int i = 0; i < NR; i++)
        y[(t + (size_t)j) * ldy + r + (size_t)i] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc0[i][j], acc1[i][j]));
}

/* Rows [r0, r1) x all tokens in tiles of at most MR x MT (MR <= 4, MT <= 4). */
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
                CASE_(2, 3) CASE_(2, 4) CASE_(3, 1) CASE_(3, 2) CASE_(3, 3) CASE_(3, 4)
                CASE_(4, 1) CASE_(4, 2) CASE_(4, 3) CASE_(4, 4)
#undef CASE_
            }
        }
    }
}

/* ---- gemm: packed 16-row panels, as avx512_q.c's q4_0 gemm ------------------------------- */

#define PANEL 16  /* rows per panel: one per int32 lane */
#define KC 1024   /* columns per packed chunk (a multiple of every group) */
#define GEMM_NT 8 /* tokens per register tile */

/* A packed chunk: P[block of 32][group of 4 columns][row] dwords of codes, and per block the
 * 16 row scales and (q4z) offsets. */
struct panel {
    __m512i p[KC / 4];
    float s[KC / 32][PANEL];
    float m[KC / 32][PANEL];
};

/* Packs rows [r, r+nr) (absent rows zero) x columns [k0, k0+kc) into pn. */
INLINE void pack_panel(int G, int Z, const uint8_t *w, size_t rb, size_t r, size_t nr, size_t k0,
                       size_t kc, struct panel *pn)
{
    const size_t hd = Z ? 4 : 2, bb = hd + 16 * (size_t)G;
    for (size_t c = 0; c < kc; c += 64) {
        const size_t sa = (k0 + c) / 32, sb = sa + 1;
        const int has_b = c + 64 <= kc;
        __m512i z[16];
        UNROLL for (int i = 0; i < PANEL; i++)
        {
            const uint8_t *row = w + (r + (size_t)i) * rb;
            z[i] = (size_t)i < nr ? unpack64(row + sa / (size_t)G * bb + hd + 16 * (sa % (size_t)G),
                                             has_b ? row + sb / (size_t)G * bb + hd +
                                                         16 * (sb % (size_t)G)
                                                   : NULL)
                                  : _mm512_setzero_si512();
        }
        transpose16(z);
        UNROLL for (int g = 0; g < 16; g++) pn->p[c / 4 + (size_t)g] = z[g];
    }
    for (size_t b = 0; b < kc / 32; b++) {
        uint16_t h[PANEL] = {0}, hm[PANEL] = {0};
        size_t blk = (k0 / 32 + b) / (size_t)G * bb;
        for (size_t i = 0; i < nr; i++) {
            h[i] = load_u16(w + (r + i) * rb + blk);
            if (Z)
                hm[i] = load_u16(w + (r + i) * rb + blk + 2);
        }
        _mm512_storeu_ps(pn->s[b], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
        if (Z)
            _mm512_storeu_ps(pn->m[b], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hm)));
    }
}

/* y[t+j][r..r+16) (+)= panel . x[t+j] over the chunk, j < NT; rows beyond nr are not stored.
 * q4_g: the integer accumulator starts at ns32 (-8 * the block's quant sum), as for q4_0;
 * q4z: it starts at 0 and the offset adds m * dx * (quant sum), quant sum = ns32 / -8. */
INLINE void gemm_tile(int Z, const struct panel *pn, size_t nblk, const struct kern_act *a,
                      size_t k0, size_t t, int NT, float *y, size_t ldy, size_t r,
                      __mmask16 rm, int add)
{
    const size_t cp = a->cp;
    __m512 facc[GEMM_NT];
    const int8_t *xq[GEMM_NT];
    const float *xd[GEMM_NT];
    const int32_t *xs[GEMM_NT];
    UNROLL for (int j = 0; j < NT; j++)
    {
        size_t tj = t + (size_t)j;
        facc[j] = _mm512_setzero_ps();
        xq[j] = a->q + tj * a->ld + k0;
        xd[j] = a->d + (tj * cp + k0) / 32;
        xs[j] = a->ns32 + (tj * cp + k0) / 32;
    }
    for (size_t b = 0; b < nblk; b++) {
        __m512i iacc[GEMM_NT];
        UNROLL for (int j = 0; j < NT; j++) iacc[j] =
            Z ? _mm512_setzero_si512() : _mm512_set1_epi32(xs[j][b]);
        UNROLL for (int g = 0; g < 8; g++)
        {
            __m512i wv = pn->p[b * 8 + (size_t)g];
            UNROLL for (int j = 0; j < NT; j++)
            {
                int32_t x4;
                memcpy(&x4, xq[j] + b * 32 + (size_t)g * 4, 4);
                iacc[j] = _mm512_dpbusd_epi32(iacc[j], wv, _mm512_set1_epi32(x4));
            }
        }
        __m512 sc = _mm512_loadu_ps(pn->s[b]);
        __m512 mv = Z ? _mm512_loadu_ps(pn->m[b]) : _mm512_setzero_ps();
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[j]), _mm512_set1_ps(xd[j][b]));
            facc[j] = _mm512_fmadd_ps(f, sc, facc[j]);
            if (Z)
                facc[j] = _mm512_fmadd_ps(
                    mv, _mm512_set1_ps(xd[j][b] * (float)xs[j][b] * -0.125f), facc[j]);
        }
    }
    UNROLL for (int j = 0; j < NT; j++)
    {
        float *yo = y + (t + (size_t)j) * ldy + r;
        if (add)
            facc[j] = _mm512_add_ps(facc[j], _mm512_maskz_loadu_ps(rm, yo));
        _mm512_mask_storeu_ps(yo, rm, facc[j]);
    }
}

INLINE void gemm_q4g(int G, int Z, enum dtype dt, const void *w, const struct kern_act *a,
                     float *y, size_t ldy, size_t r0, size_t r1)
{
    const size_t rb = kern__row_bytes(dt, a->cols);
    struct panel pn __attribute__((aligned(64)));
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
            size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
            pack_panel(G, Z, (const uint8_t *)w, rb, r, nr, k0, kc, &pn);
            for (size_t t = 0; t < a->n; t += GEMM_NT) {
                size_t nt = a->n - t < GEMM_NT ? a->n - t : GEMM_NT;
                switch (nt) {
#define CASE_(T)                                                                             \
    case T:                                                                                  \
        gemm_tile(Z, &pn, kc / 32, a, k0, t, T, y, ldy, r, rm, k0 > 0);                      \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
#undef CASE_
                }
            }
        }
    }
}

#define Q4G_ENTRY_(wty, DT, G, Z)                                                            \
    void kern_gemv_##wty##_q8_0_avx512(const void *w, const struct kern_act *a, float *y,    \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        run(G, Z, DT, 1, 2, 1, w, a, y, ldy, r0, r1);                                        \
    }                                                                                        \
    void kern_gemm_##wty##_q8_0_avx512(const void *w, const struct kern_act *a, float *y,    \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        gemm_q4g(G, Z, DT, w, a, y, ldy, r0, r1);                                            \
    }

Q4G_ENTRY_(q4_g64, DT_Q4_G64, 2, 0)
Q4G_ENTRY_(q4_g128, DT_Q4_G128, 4, 0)
Q4G_ENTRY_(q4z_g32, DT_Q4Z_G32, 1, 1)
Q4G_ENTRY_(q4z_g64, DT_Q4Z_G64, 2, 1)
Q4G_ENTRY_(q4z_g128, DT_Q4Z_G128, 4, 1)
