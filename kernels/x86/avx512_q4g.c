/*
 * avx512_q4g.c — AVX-512 VNNI kernels for the int4 group types (q4_g64, q4_g128, q4z_g32,
 * q4z_g64, q4z_g128; kernels/quant.h) against int8 activations (compiled with -mavx512*).
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
 * One generic tile (rows x tokens) is specialised per type by constant arguments: gemv is the
 * 1-row x 2-token tile (the row stream read once, prefetched, two FMA chains per output);
 * gemm reuses each unpacked zmm over 4 tokens of 4 rows (no packing: the group types are
 * bandwidth-cheaper than q4_0 already, and a packed panel is left for when prefill needs it).
 */
#include "kern.h"
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

#define Q4G_ENTRY_(wty, DT, G, Z)                                                            \
    void kern_gemv_##wty##_q8_0_avx512(const void *w, const struct kern_act *a, float *y,    \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        run(G, Z, DT, 1, 2, 1, w, a, y, ldy, r0, r1);                                        \
    }                                                                                        \
    void kern_gemm_##wty##_q8_0_avx512(const void *w, const struct kern_act *a, float *y,    \
                                       size_t ldy, size_t r0, size_t r1)                     \
    {                                                                                        \
        run(G, Z, DT, 4, 4, 0, w, a, y, ldy, r0, r1);                                        \
    }

Q4G_ENTRY_(q4_g64, DT_Q4_G64, 2, 0)
Q4G_ENTRY_(q4_g128, DT_Q4_G128, 4, 0)
Q4G_ENTRY_(q4z_g32, DT_Q4Z_G32, 1, 1)
Q4G_ENTRY_(q4z_g64, DT_Q4Z_G64, 2, 1)
Q4G_ENTRY_(q4z_g128, DT_Q4Z_G128, 4, 1)
