/*
 * avx512_q.c — AVX-512 VNNI kernels for q8_0, q4_0 and mxfp4 weights against int8 activations
 * (compiled with -mavx512* -mavx512vnni).
 *
 * Both paths use vpdpbusd (unsigned bytes x signed bytes, 4 products summed per int32 lane)
 * and fix up the unsigned operand's +128 / +8 offset with a precomputed sum, so no
 * instruction is spent on signs:
 *
 * mxfp4 (spec §4.5) is q8_0 once unpacked: its nibbles index the 16-entry table of doubled E2M1
 * values stored as kvalues ^ 0x80 = kvalues + 128 (vpshufb per 128-bit lane, AVX512-BW: no
 * VBMI needed, so the ISA stays F+BW+VL+DQ+VNNI), giving the same unsigned operand with
 * offset 128 (its act_offset); its block scale is 2^(e-128), exact.
 *
 * gemv (decode): weights are read in their stored layout, two blocks (64 elements) per zmm in
 *   natural element order, as unsigned bytes (q4_0: the nibble 0..15; q8_0: w ^ 0x80 = w+128;
 *   mxfp4: kvalues[code] + 128),
 *   times the signed activation quants. Lane l then holds sum(wu*q) over 4 elements; the
 *   accumulator starts at kern_act.ns4 = -offset * (sum of those 4 quants), offset = 8 (q4_0)
 *   or 128 (q8_0), giving the exact signed dot. Each lane is converted and scaled by its
 *   block's weight scale x activation scale (q8_0, q4_0). mxfp4's gemv is x86/avx512_mxfp4.c:
 *   it reproduces this file's gemm's sums and order, for batch invariance.
 *
 * gemm (prefill): a panel of 16 rows x KC columns is unpacked to the same unsigned bytes and
 *   transposed so that one zmm holds 4 consecutive columns of all 16 rows (lane = row);
 *   vpdpbusd with an embedded broadcast of 4 signed activation quants then advances 16 rows at
 *   once, 8 instructions per block of 32 columns. The accumulator starts at kern_act.ns32 (the
 *   offset's correction, the same for every row) and the 16 row scales are applied once per
 *   block. One packed panel (16 KiB, on the stack) is reused, from L1, by every token tile.
 */
#include "internal.h"
#include "quant.h"

#include "avx512_common.h"
#include "check.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum qk { QK_Q8_0, QK_Q4_0, QK_MXFP4 };

/*
 * Software prefetch distance of the gemv's row stream, per type (0: none). Measured from
 * DRAM at 1 thread (bench/kern_bench --only gemv): q4_0, whose unpacking keeps the core busy,
 * gains ~25% from prefetching 4 KiB ahead; q8_0 streams faster with the hardware prefetcher
 * alone (the extra prefetches cost ~15%).
 */
static const size_t pf_dist[] = {[QK_Q8_0] = 0, [QK_Q4_0] = 4096};

static const size_t blk_bytes[] = {[QK_Q8_0] = 34, [QK_Q4_0] = 18, [QK_MXFP4] = 17};
static const enum dtype qk_dtype[] = {[QK_Q8_0] = DT_Q8_0, [QK_Q4_0] = DT_Q4_0,
                                      [QK_MXFP4] = DT_MXFP4};

/* quant_mxfp4_kvalues + 128 (as ^ 0x80), the unsigned operand's table, in each 128-bit lane */
static const uint8_t mxfp4_ukv[16] = {128, 129, 130, 131, 132, 134, 136, 140,
                                      128, 127, 126, 125, 124, 122, 120, 116};

INLINE uint16_t load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

INLINE int32_t load_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/*
 * The quants of block A (at blk) and, if has_b, of the next block, in natural element order as
 * unsigned bytes w + off (q4_0: the nibble itself, off 8; q8_0: w ^ 0x80, off 128; mxfp4: its
 * table's value + 128, off 128): bytes 0..31 = A, 32..63 = B (without B: zero for q4_0 and
 * q8_0, 128 for mxfp4; never read).
 */
INLINE __m512i unpack_pair(enum qk k, const uint8_t *blk, int has_b)
{
    if (k == QK_Q4_0 || k == QK_MXFP4) {
        const size_t hdr = k == QK_Q4_0 ? 2 : 1, bb = blk_bytes[k];
        __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + hdr)));
        __m256i b = has_b ? _mm256_broadcastsi128_si256(
                                _mm_loadu_si128((const __m128i *)(blk + bb + hdr)))
                          : _mm256_setzero_si256();
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        /* [qA, qA, qB, qB]: shift the 2nd copy of each by 4 so high nibbles land second */
        z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
        z = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
        if (k == QK_MXFP4)
            z = _mm512_shuffle_epi8(
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mxfp4_ukv)), z);
        return z;
    }
    __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m512i z = _mm512_castsi256_si512(_mm256_xor_si256(a, _mm256_set1_epi8((char)0x80)));
    if (has_b) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 34 + 2));
        z = _mm512_inserti64x4(z, _mm256_xor_si256(b, _mm256_set1_epi8((char)0x80)), 1);
    } else {
        z = _mm512_zextsi256_si512(_mm256_xor_si256(a, _mm256_set1_epi8((char)0x80)));
    }
    return z;
}

/* [dA x 8 lanes, dB x 8 lanes] as f32 (dB = 0 without B). */
INLINE __m512 scale_pair(enum qk k, const uint8_t *blk, int has_b)
{
    if (k == QK_MXFP4)
        return _mm512_insertf32x8(_mm512_set1_ps(quant_e8m0_half(blk[0])),
                                  _mm256_set1_ps(has_b ? quant_e8m0_half(blk[17]) : 0.0f), 1);
    uint16_t da = load_u16(blk), db = has_b ? load_u16(blk + blk_bytes[k]) : 0;
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)da)),
                                        _mm_set1_epi16((short)db), 1);
    return _mm512_cvtph_ps(h);
}

/* ---- gemv -------------------------------------------------------------------------------- */

/*
 * The f16 scales of 16 consecutive blocks as 16 f32: word gathers (vpermt2w) from loads that
 * stay inside the 16 blocks. q4_0 (18-byte blocks): blocks 0..7 lie in bytes [0, 128) at words
 * 9j, blocks 8..15 likewise from byte 144. q8_0 (34-byte blocks): 4 blocks per 128 bytes at
 * words 17j, from bytes 0, 136, 272, 408.
 */
static const uint16_t idx_q4[32] = {0, 9, 18, 27, 36, 45, 54, 63, 0, 9, 18, 27, 36, 45, 54, 63};
static const uint16_t idx_q8[32] = {0, 17, 34, 51, 0, 17, 34, 51, 0, 17, 34, 51, 0, 17, 34, 51};

INLINE __m512i load512(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }

INLINE __m512 scales16(enum qk k, const uint8_t *blk0)
{
    __m512i h;
    if (k == QK_Q4_0) {
        __m512i idx = _mm512_loadu_si512(idx_q4);
        h = _mm512_or_si512(
            _mm512_maskz_permutex2var_epi16(0x00ff, load512(blk0), idx, load512(blk0 + 64)),
            _mm512_maskz_permutex2var_epi16(0xff00, load512(blk0 + 144), idx,
                                            load512(blk0 + 208)));
    } else {
        __m512i idx = _mm512_loadu_si512(idx_q8);
        h = _mm512_setzero_si512();
        UNROLL for (int g = 0; g < 4; g++)
        {
            const uint8_t *p = blk0 + 136 * g;
            h = _mm512_or_si512(h, _mm512_maskz_permutex2var_epi16((__mmask32)(0xfu << (4 * g)),
                                                                    load512(p), idx,
                                                                    load512(p + 64)));
        }
    }
    return _mm512_cvtph_ps(_mm512_castsi512_si256(h));
}

/*
 * NR rows x NT tokens. Main loop: 16 blocks at a time, so the 16 weight scales are gathered
 * and multiplied by the activation scales once (scale16); each block pair then takes one
 * vpermps to spread its two scales over its lanes. A tail of < 16 blocks goes pair by pair.
 */
INLINE void gemv_tile(enum qk k, const uint8_t *w, size_t rb, size_t r, int NR,
                      const struct kern_act *a, size_t t, int NT, float *y, size_t ldy)
{
    const size_t bb = blk_bytes[k], nb = a->cols / 32, cp = a->cp;
    const uint8_t *rows[4];
    const int8_t *xq[4];
    const int32_t *xs[4];
    const float *xd[4], *xd4[4];
    /* two accumulators per output, for even and odd block pairs: one chain of dependent
     * FMAs (4 cycles each) would otherwise bound a row to 2 cycles per block */
    __m512 acc[4][4], acc2[4][4];
    UNROLL for (int i = 0; i < NR; i++)
    {
        rows[i] = w + (r + (size_t)i) * rb;
        UNROLL for (int j = 0; j < NT; j++) acc[i][j] = acc2[i][j] = _mm512_setzero_ps();
    }
    UNROLL for (int j = 0; j < NT; j++)
    {
        size_t tj = t + (size_t)j;
        xq[j] = a->q + tj * a->ld;
        xs[j] = a->ns4 + tj * cp / 4;
        xd[j] = a->d + tj * cp / 32;
        xd4[j] = a->d4 + tj * cp / 4;
    }

    size_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        __m512 sc[4][4];
        UNROLL for (int i = 0; i < NR; i++)
        {
            /* prefetch ahead in the row stream (past the row's end is the next row, which is
             * next to be read) */
            if (pf_dist[k]) {
                const uint8_t *pf = rows[i] + b * bb + pf_dist[k];
                UNROLL for (size_t l = 0; l < 16 * bb; l += 64) _mm_prefetch((const char *)pf + l,
                                                                             _MM_HINT_T0);
            }
            __m512 dw = scales16(k, rows[i] + b * bb);
            UNROLL for (int j = 0; j < NT; j++) sc[i][j] =
                _mm512_mul_ps(dw, _mm512_loadu_ps(xd[j] + b));
        }
        UNROLL for (int pr = 0; pr < 8; pr++)
        {
            size_t c = (b + 2 * (size_t)pr) * 32;
            /* lanes 0..7 take the scale of block 2pr, lanes 8..15 that of block 2pr+1 */
            __m512i sidx = _mm512_set_epi32(2 * pr + 1, 2 * pr + 1, 2 * pr + 1, 2 * pr + 1,
                                            2 * pr + 1, 2 * pr + 1, 2 * pr + 1, 2 * pr + 1,
                                            2 * pr, 2 * pr, 2 * pr, 2 * pr, 2 * pr, 2 * pr,
                                            2 * pr, 2 * pr);
            __m512i wz[4];
            UNROLL for (int i = 0; i < NR; i++) wz[i] =
                unpack_pair(k, rows[i] + (b + 2 * (size_t)pr) * bb, 1);
            UNROLL for (int j = 0; j < NT; j++)
            {
                __m512i q = _mm512_loadu_si512(xq[j] + c);
                __m512i ns = _mm512_loadu_si512(xs[j] + c / 4);
                UNROLL for (int i = 0; i < NR; i++)
                {
                    __m512i dot = _mm512_dpbusd_epi32(ns, wz[i], q);
                    __m512 f = _mm512_cvtepi32_ps(dot), s2 = _mm512_permutexvar_ps(sidx, sc[i][j]);
                    if (pr & 1)
                        acc2[i][j] = _mm512_fmadd_ps(f, s2, acc2[i][j]);
                    else
                        acc[i][j] = _mm512_fmadd_ps(f, s2, acc[i][j]);
                }
            }
        }
    }
    for (; b < nb; b += 2) {
        int has_b = b + 1 < nb;
        size_t c = b * 32;
        __m512i wz[4];
        __m512 dw[4];
        UNROLL for (int i = 0; i < NR; i++)
        {
            wz[i] = unpack_pair(k, rows[i] + b * bb, has_b);
            dw[i] = scale_pair(k, rows[i] + b * bb, has_b);
        }
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512i q = _mm512_loadu_si512(xq[j] + c);
            __m512i ns = _mm512_loadu_si512(xs[j] + c / 4);
            __m512 dx = _mm512_loadu_ps(xd4[j] + c / 4);
            UNROLL for (int i = 0; i < NR; i++)
            {
                __m512i dot = _mm512_dpbusd_epi32(ns, wz[i], q);
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), dx);
                acc[i][j] = _mm512_fmadd_ps(f, dw[i], acc[i][j]);
            }
        }
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int i = 0; i < NR; i++)
        y[(t + (size_t)j) * ldy + r + (size_t)i] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[i][j], acc2[i][j]));
}

/* One row at a time: decode streams the matrix as a single sequential run, which the
 * hardware prefetchers follow at full bandwidth (several interleaved row streams, each a
 * few KiB long, measured 2x slower). Up to 4 tokens share each unpacked weight register
 * (n = 3, 4 unpack each row once; bench/kern_bench --only batch). */
#define GEMV_NR 1
#define GEMV_NT 4

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
                CASE_(1, 1) CASE_(1, 2) CASE_(1, 3) CASE_(1, 4) CASE_(2, 1) CASE_(2, 2)
#undef CASE_
            }
        }
    }
}

void kern_gemv_q8_0_q8_0_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                size_t r0, size_t r1)
{
    gemv_q(QK_Q8_0, w, a, y, ldy, r0, r1);
}

void kern_gemv_q4_0_q8_0_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                size_t r0, size_t r1)
{
    gemv_q(QK_Q4_0, w, a, y, ldy, r0, r1);
}

/* ---- gemm -------------------------------------------------------------------------------- */

#define PANEL 16    /* rows per panel: one per int32 lane */
#define KC 1024     /* columns per packed chunk: 16 KiB of quants */
#define GEMM_NT 8   /* tokens per register tile: 8 int + 8 float accumulators */

/* A packed chunk: P[block][group of 4 columns][row] dwords, and per block scales. */
struct panel {
    __m512i p[KC / 4];       /* [KC/32 blocks][8 groups] x 16 rows x 4 unsigned bytes w+off */
    float s[KC / 32][PANEL]; /* weight scale per block and row (0 for absent rows) */
};

/*
 * Packing reads the stored rows with few, wide loads and transposes once (ADR 0004, "small-
 * batch GEMM" addendum): the panel is the same bytes as unpacking each block pair and
 * transposing, but the per-row work is cheaper, which is what decides the cost at n = 2..16.
 *
 * Block scales of 16 rows (lane = row) for up to 4 consecutive blocks: row i's f16 scales sit
 * at words (bb/2)*k of its vector v[i] (k < nblk); they are gathered into words [row][block]
 * of two vectors (rows 0..7, 8..15) by one masked vpermw per row, then one vpermt2w per block
 * turns them into lane = row.
 */
/* Step 1: words [row][block] of rows 0..7 into *lo, rows 8..15 into *hi (see above). */
INLINE void scales_gather(enum qk k, const __m512i v[PANEL], size_t nr, __m512i *lo,
                          __m512i *hi)
{
    const short st = (short)(blk_bytes[k] / 2);
    /* word 4i + kk <- word st*kk of row i's vector */
    const __m512i gi = _mm512_set_epi16(3 * st, 2 * st, st, 0, 3 * st, 2 * st, st, 0, 3 * st,
                                        2 * st, st, 0, 3 * st, 2 * st, st, 0, 3 * st, 2 * st,
                                        st, 0, 3 * st, 2 * st, st, 0, 3 * st, 2 * st, st, 0,
                                        3 * st, 2 * st, st, 0);
    *lo = _mm512_setzero_si512();
    *hi = _mm512_setzero_si512();
    UNROLL for (int i = 0; i < PANEL; i++)
    {
        if ((size_t)i >= nr)
            break;
        __mmask32 m = (__mmask32)0xfu << (4 * (i & 7));
        if (i < 8)
            *lo = _mm512_mask_permutexvar_epi16(*lo, m, gi, v[i]);
        else
            *hi = _mm512_mask_permutexvar_epi16(*hi, m, gi, v[i]);
    }
}

/* Step 2: the 16 rows' f16 scales of block kk (< 4), lane = row. */
INLINE __m256i scales_block(__m512i lo, __m512i hi, size_t kk)
{
    /* word i <- block kk of row i: lo word 4i + kk (i < 8), hi word 4(i-8) + kk */
    short b = (short)kk;
    __m512i ti = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                  (short)(60 + b), (short)(56 + b), (short)(52 + b),
                                  (short)(48 + b), (short)(44 + b), (short)(40 + b),
                                  (short)(36 + b), (short)(32 + b), (short)(28 + b),
                                  (short)(24 + b), (short)(20 + b), (short)(16 + b),
                                  (short)(12 + b), (short)(8 + b), (short)(4 + b), b);
    return _mm512_castsi512_si256(_mm512_permutex2var_epi16(lo, ti, hi));
}

INLINE void pack_scales(enum qk k, const __m512i v[PANEL], size_t nr, size_t nblk,
                        float (*s)[PANEL])
{
    __m512i lo, hi;
    scales_gather(k, v, nr, &lo, &hi);
    for (size_t kk = 0; kk < nblk; kk++)
        _mm512_storeu_ps(s[kk], _mm512_cvtph_ps(scales_block(lo, hi, kk)));
}

/*
 * The bytes [p, p + len) of the row one panel below: a panel reads 16 rows side by side, a
 * pattern the hardware prefetchers follow poorly from DRAM, and at n <= 16 tokens a panel is
 * computed in about the time DRAM takes to deliver it. Past the matrix's last panel the
 * addresses are unused (prefetches never fault).
 */
INLINE void prefetch_next_panel(const uint8_t *p, size_t rb, size_t len)
{
    uintptr_t a = (uintptr_t)p + PANEL * rb;
    _mm_prefetch((const char *)a, _MM_HINT_T0);
    _mm_prefetch((const char *)(a + len - 1), _MM_HINT_T0);
}

/*
 * q4_0: 4 blocks (128 columns) of 16 rows per step. Each row's 4 x 16 quant bytes are
 * gathered into one vector (vpermt2w: every block starts on a word), the 16 vectors are
 * transposed as dwords (lane = row, dword 4kk + g = bytes 4g..4g+3 of block kk), and only
 * then split into nibbles: low nibbles are columns 4g..4g+3, high nibbles 16+4g..16+4g+3.
 */
/*
 * Loads 4 blocks (nb < 4: a short tail, read only its nb * 18 bytes) of rows [r, r+nr) from
 * block bk on: v[i] = row i's bytes (for the scales), z[i] = its 4 x 16 quant bytes.
 */
INLINE void load_q4_rows(const uint8_t *w, size_t rb, size_t r, size_t nr, size_t bk,
                         size_t nb, int prefetch, __m512i v[PANEL], __m512i z[PANEL])
{
    /* out word 8kk + j <- quant word j of block kk: a word 9kk + 1 + j (kk < 3), b word j */
    const __m512i qi = _mm512_set_epi16(39, 38, 37, 36, 35, 34, 33, 32, 26, 25, 24, 23, 22, 21,
                                        20, 19, 17, 16, 15, 14, 13, 12, 11, 10, 8, 7, 6, 5, 4,
                                        3, 2, 1);
    UNROLL for (int i = 0; i < PANEL; i++)
    {
        if ((size_t)i < nr) {
            const uint8_t *p = w + (r + (size_t)i) * rb + bk * 18;
            if (prefetch)
                prefetch_next_panel(p, rb, 72);
            __m512i a, b;
            if (nb == 4) { /* bytes [0, 72): all inside the 4 blocks */
                a = _mm512_loadu_si512((const void *)p);
                b = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 56)));
            } else {
                a = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (nb * 18)) - 1), p);
                b = _mm512_setzero_si512();
            }
            v[i] = a;
            z[i] = _mm512_permutex2var_epi16(a, qi, b);
        } else {
            v[i] = z[i] = _mm512_setzero_si512();
        }
    }
}

/*
 * q4_0: 4 blocks (128 columns) of 16 rows per step. Each row's 4 x 16 quant bytes are
 * gathered into one vector (vpermt2w: every block starts on a word), the 16 vectors are
 * transposed as dwords (lane = row, dword 4kk + g = bytes 4g..4g+3 of block kk), and only
 * then split into nibbles: low nibbles are columns 4g..4g+3, high nibbles 16+4g..16+4g+3.
 */
INLINE void pack_panel_q4(const uint8_t *w, size_t rb, size_t r, size_t nr, size_t k0,
                          size_t kc, struct panel *pn)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const size_t nblk = kc / 32;
    for (size_t b0 = 0; b0 < nblk; b0 += 4) {
        size_t nb = nblk - b0 < 4 ? nblk - b0 : 4;
        __m512i v[PANEL], z[PANEL];
        load_q4_rows(w, rb, r, nr, k0 / 32 + b0, nb, 1, v, z);
        pack_scales(QK_Q4_0, v, nr, nb, &pn->s[b0]);
        transpose16(z);
        UNROLL for (int kk = 0; kk < 4; kk++)
        {
            if ((size_t)kk >= nb)
                break;
            UNROLL for (int g = 0; g < 4; g++)
            {
                __m512i t = z[4 * kk + g];
                pn->p[(b0 + (size_t)kk) * 8 + (size_t)g] = _mm512_and_si512(t, m4);
                pn->p[(b0 + (size_t)kk) * 8 + 4 + (size_t)g] =
                    _mm512_and_si512(_mm512_srli_epi16(t, 4), m4);
            }
        }
    }
}

/* Packs rows [r, r+nr) (nr <= 16; absent rows are zero) x columns [k0, k0+kc) into pn. */
INLINE void pack_panel(enum qk k, const uint8_t *w, size_t rb, size_t r, size_t nr, size_t k0,
                       size_t kc, struct panel *pn)
{
    if (k == QK_Q4_0) {
        pack_panel_q4(w, rb, r, nr, k0, kc, pn);
        return;
    }
    const size_t bb = blk_bytes[k];
    for (size_t c = 0; c < kc; c += 64) {
        int has_b = c + 64 <= kc;
        __m512i z[16], v[16];
        UNROLL for (int i = 0; i < PANEL; i++)
        {
            if ((size_t)i < nr) {
                const uint8_t *p = w + (r + (size_t)i) * rb + (k0 + c) / 32 * bb;
                prefetch_next_panel(p, rb, 2 * bb);
                z[i] = unpack_pair(k, p, has_b);
                if (k == QK_MXFP4) { /* one exponent byte per block: read as they are */
                    pn->s[c / 32][i] = quant_e8m0_half(p[0]);
                    if (has_b)
                        pn->s[c / 32 + 1][i] = quant_e8m0_half(p[bb]);
                    continue;
                }
                /* the scales: words 0 and 17 (bytes [0, 64) are inside the pair; one block
                 * alone is 34 bytes) */
                v[i] = has_b ? _mm512_loadu_si512((const void *)p)
                             : _mm512_maskz_loadu_epi8((__mmask64)((1ull << 34) - 1), p);
            } else {
                z[i] = v[i] = _mm512_setzero_si512();
                if (k == QK_MXFP4) {
                    pn->s[c / 32][i] = 0.0f;
                    if (has_b)
                        pn->s[c / 32 + 1][i] = 0.0f;
                }
            }
        }
        if (k != QK_MXFP4)
            pack_scales(k, v, nr, has_b ? 2 : 1, &pn->s[c / 32]);
        transpose16(z);
        UNROLL for (int g = 0; g < 16; g++) pn->p[c / 4 + (size_t)g] = z[g];
    }
}

/* y[t+j][r..r+16) (+)= panel . x[t+j] over the chunk, j < NT; rows beyond nr are not stored.
 * mxfp4 multiplies the two scales first, as its _ref does: 2^(e-128) spans 2^-128..2^126, and
 * the block sum times the activation scale alone may overflow where the product does not
 * (q4_0/q8_0 keep their order, which the panel GEMMs reproduce bit for bit). */
INLINE void gemm_tile(enum qk k, const struct panel *pn, size_t nblk, const struct kern_act *a, size_t k0,
                      size_t t, int NT, float *y, size_t ldy, size_t r, __mmask16 rm, int add)
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
        UNROLL for (int j = 0; j < NT; j++) iacc[j] = _mm512_set1_epi32(xs[j][b]);
        UNROLL for (int g = 0; g < 8; g++)
        {
            __m512i wv = pn->p[b * 8 + (size_t)g];
            UNROLL for (int j = 0; j < NT; j++)
            {
                /* a broadcast from memory: folds into vpdpbusd's {1to16} operand */
                __m512i xv = _mm512_set1_epi32(load_i32(xq[j] + b * 32 + (size_t)g * 4));
                iacc[j] = _mm512_dpbusd_epi32(iacc[j], wv, xv);
            }
        }
        __m512 s = _mm512_loadu_ps(pn->s[b]);
        UNROLL for (int j = 0; j < NT; j++)
        {
            if (k == QK_MXFP4) {
                facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[j]),
                                          _mm512_mul_ps(s, _mm512_set1_ps(xd[j][b])), facc[j]);
                continue;
            }
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[j]), _mm512_set1_ps(xd[j][b]));
            facc[j] = _mm512_fmadd_ps(f, s, facc[j]);
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

INLINE void gemm_q(enum qk k, const void *w, const struct kern_act *a, float *y, size_t ldy,
                   size_t r0, size_t r1)
{
    size_t rb = kern__row_bytes(qk_dtype[k], a->cols);
    struct panel pn __attribute__((aligned(64)));
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
            size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
            pack_panel(k, w, rb, r, nr, k0, kc, &pn);
            for (size_t t = 0; t < a->n; t += GEMM_NT) {
                size_t nt = a->n - t < GEMM_NT ? a->n - t : GEMM_NT;
                switch (nt) {
#define CASE_(T)                                                                             \
    case T:                                                                                  \
        gemm_tile(k, &pn, kc / 32, a, k0, t, T, y, ldy, r, rm, k0 > 0);                      \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
#undef CASE_
                }
            }
        }
    }
}

void kern_gemm_q8_0_q8_0_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                size_t r0, size_t r1)
{
    gemm_q(QK_Q8_0, w, a, y, ldy, r0, r1);
}

void kern_gemm_q4_0_q8_0_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                size_t r0, size_t r1)
{
    gemm_q(QK_Q4_0, w, a, y, ldy, r0, r1);
}

void kern_gemm_mxfp4_q8_0_avx512(const void *w, const struct kern_act *a, float *y,
                                 size_t ldy, size_t r0, size_t r1)
{
    gemm_q(QK_MXFP4, w, a, y, ldy, r0, r1);
}

/* ---- gemm on q4_0 panels repacked at load time (quant.h, "q4_0 panels") ------------------ */

/*
 * The same arithmetic as gemm_tile, reading the panels from the repacked matrix instead of a
 * packed chunk: per block, 4 vectors of nibble pairs (lane = row) are split with one and / one
 * shift + and each, then 8 vpdpbusd per token. The integer sums are exact and the float steps
 * are gemm_tile's, in its order, so the outputs equal kern_gemm_q4_0_q8_0_avx512's bit for bit
 * whatever tile computed them (and a token's sums do not depend on n: batch-invariant).
 *
 * Two panels (32 rows) share each tile, so every activation broadcast feeds two vpdpbusd: with
 * one panel the tile issued a broadcast load per vpdpbusd and reached ~60% of the vpdpbusd
 * peak. 2 panels x 8 tokens of int accumulators take 16 zmm; the float sums of the 16 (panel,
 * token) pairs would take 16 more, so they live in an L1 buffer (one load and one store per
 * pair and block, beside 8 vpdpbusd), and each token's block scale and offset correction are
 * read from a [block][token] copy (kern_act.sc, laid out once per activation: one pointer
 * instead of two per token, which with the 8 quant pointers overflowed the general registers;
 * until session 23 each call made its own). Against
 * the session-10 tiles (registers only; one panel x 8 tokens below n = 16, two panels x 6 from
 * n = 16), bench/kern_bench_ab.sh: docs/PERFORMANCE.md "int4 wide tile, session 11".
 * With at most 8 (panel, token) pairs one accumulator each would be a chain of 8 dependent
 * vpdpbusd per block, too few chains to keep the vpdpbusd pipes busy, so low and high nibbles
 * go to two accumulators (added as integers: still exact).
 * pp: the tile's first panel, pstride bytes apart (quant.h: block b's quants at
 * quant_q4p_qoff, scales at quant_q4p_soff); blocks [k0/32, k0/32 + nblk) of its nb; sc: the
 * token tile's part of kern_act.sc.
 */
#ifndef Q4P_PF /* bench/kern_bench_ab.sh can set it per side (CFLAGS_A, CFLAGS_B) */
#define Q4P_PF 8192
#endif
#define Q4P_NP 2 /* panels per register tile: each activation broadcast feeds NP vpdpbusd */
#define Q4P_NT 8 /* tokens per register tile: NP x NT int accumulators */
/* Tokens are tiled as kern_act.sc is (kern.h): the tiles read it in place. */
_Static_assert(Q4P_NT == KERN_ACT_SC_NT, "the q4_0 panel tile's tokens are kern_act.sc's");
/*
 * acc + w . (x[0..3] in every lane): vpdpbusd with an embedded {1to16} broadcast operand. GCC
 * issues _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(load)) as a separate vpbroadcastd, one
 * per vpdpbusd in the one-panel tile; folded, the tile read up to ~15% faster with the weights
 * in cache in one round of a kernel bench and equal in the next, and no difference showed in
 * the engine (docs/PERFORMANCE.md "The 8-stream step, session 14"). The same instruction, the
 * same sums.
 */
INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *x)
{
    __asm__("vpdpbusd %[m]%{1to16%}, %[w], %[acc]"
            : [acc] "+v"(acc)
            : [w] "v"(w), [m] "m"(*(const int32_t *)(const void *)x));
    return acc;
}

#ifndef Q4P_RB
#define Q4P_RB 1
#endif
/*
 * set1(*p) as its own vpbroadcastd from memory (a load-port uop, no vector ALU op), never
 * merged with another broadcast of the same word: GCC otherwise broadcasts a token's offset
 * once for both panels of the two-stream tile, keeps the 8 copies live and moves one into each
 * accumulator (8 zmm moves per block, and the 8 live registers spilled 3 float sums to the stack).
 */
INLINE __m512i bcast_epi32_ld(const int32_t *p)
{
    __m512i r;
    if (!Q4P_RB)
        return _mm512_set1_epi32(*p);
    __asm__ volatile("vpbroadcastd %[m], %[r]" : [r] "=v"(r) : [m] "m"(*p));
    return r;
}

/* a * set1(*p) with the {1to16} broadcast memory operand (the same product; see bcast_epi32_ld) */
INLINE __m512 mul_bcast_ps(__m512 a, const float *p)
{
    if (!Q4P_RB)
        return _mm512_mul_ps(a, _mm512_set1_ps(*p));
    __asm__("vmulps %[m]%{1to16%}, %[a], %[a]" : [a] "+v"(a) : [m] "m"(*p));
    return a;
}

/*
 * The float steps of one panel block for the NT tokens of a tile (gemm_tile's, in its order):
 * facc[j] += (float(iacc[j] (+ iacc2[j] when split)) * d_j) * s, s the block's 16 row scales
 * (f16 at sp), d_j token j's block scale (scb[j].d: kern_act.sc, kern.h).
 * The q4_0 and q8_0 panel tiles share it: their bits are the same by construction.
 */
INLINE void panel_block_fold(const uint8_t *sp, const __m512i *iacc, const __m512i *iacc2,
                             int split, const struct kern_act_sc *scb, int NT, __m512 *facc)
{
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)sp));
    UNROLL for (int j = 0; j < NT; j++)
    {
        __m512i ia = split ? _mm512_add_epi32(iacc[j], iacc2[j]) : iacc[j];
        __m512 f = mul_bcast_ps(_mm512_cvtepi32_ps(ia), &scb[j].d);
        facc[j] = _mm512_fmadd_ps(f, s, facc[j]);
    }
}

/* facc[j] (16 rows, mask rm) to y[j * ldy + r ..], added to what is there when add (a later K
 * chunk). */
INLINE void panel_store(__m512 *facc, int NT, float *y, size_t ldy, size_t r, __mmask16 rm,
                        int add)
{
    UNROLL for (int j = 0; j < NT; j++)
    {
        float *yo = y + (size_t)j * ldy + r;
        if (add)
            facc[j] = _mm512_add_ps(facc[j], _mm512_maskz_loadu_ps(rm, yo));
        _mm512_mask_storeu_ps(yo, rm, facc[j]);
    }
}

/*
 * *p as one vector load. Zen 5 issues two vector loads a cycle (a broadcast is one), and the
 * one-panel tiles are bound by them (gemm_q4p_tile1); GCC folded the nibble vector into both
 * the and and the shift, two loads of the same 64 bytes (+2-5 % on the one-panel tile alone,
 * kern_bench_ab, session 26).
 */
INLINE __m512i load512_once(const uint8_t *p)
{
    __m512i r;
    __asm__("vmovdqu64 %[m], %[r]" : [r] "=v"(r) : [m] "m"(*(const __m512i *)(const void *)p));
    return r;
}

/*
 * gemm_q4p_tile's one-panel tile (NP = 1, 1..8 tokens: the decode of a few streams on one DRAM
 * stream) with fewer vector loads (session 26). On Zen 5 a core issues two vector loads a
 * cycle, a {1to16} operand is one, and at 8 tokens a block of gemm_q4p_tile made ~93 of them
 * beside 64 vpdpbusd (32 cycles at two a cycle): it ran at the loads' pace, ~68 % of the
 * vpdpbusd peak in L2, L3 and from DRAM alike (docs/PERFORMANCE.md "Session 26": probes of
 * vpdpbusd beside extra loads, shuffles and multiplies). Here a block makes ~73: the nibble
 * vectors one load each (load512_once), each pair of tokens' {d, ns32} one 16-byte load
 * repeated in the four lanes and picked by vpshufd (a shuffle issued beside the vpdpbusd at no
 * cost in the probe) instead of two broadcasts per token, and the float sums in registers
 * instead of an L1 buffer (8 loads and 8 stores a block). The activation words stay {1to16}
 * operands: from registers (vbroadcasti32x4 + vpshufd per vpdpbusd) the tile ran at 0.88x, the
 * shuffles' count then bounding it. The same instructions on the same values in gemm_q4p_tile's
 * order: the same bits (tests/kern compares every tile with the stored-row GEMM).
 */
#ifndef Q4P_T1 /* 0: gemm_q4p_tile instead (bench/kern_bench_ab.sh CFLAGS_A / CFLAGS_B) */
#define Q4P_T1 1
#endif
INLINE __m512i hi_nibbles_gfni(__m512i v);
_Static_assert(offsetof(struct kern_act_sc, d) == 0 && offsetof(struct kern_act_sc, ns32) == 4 &&
                   sizeof(struct kern_act_sc) == 8,
               "gemm_q4p_tile1 picks d and ns32 of two tokens from 16 bytes");
/* dword w (0..3) of every 128-bit lane of v in all 16 lanes: with v two tokens' {d, ns32}
 * repeated, w = 0 / 1 the first token's d / ns32, 2 / 3 the second's */
INLINE __m512i lane_word(__m512i v, int w)
{
    switch (w) {
    case 0: return _mm512_shuffle_epi32(v, _MM_PERM_AAAA);
    case 1: return _mm512_shuffle_epi32(v, _MM_PERM_BBBB);
    case 2: return _mm512_shuffle_epi32(v, _MM_PERM_CCCC);
    default: return _mm512_shuffle_epi32(v, _MM_PERM_DDDD);
    }
}

/*
 * The integer dots of one panel block (16 rows x 32 columns at qb) with NT tokens' block b:
 * per group of 4 columns the nibble vector split (gfni: the high nibbles by one affine op,
 * the same bytes), then each token's low- and high-nibble vpdpbusd with its activation words
 * as {1to16} operands, into iacc (and iacc2 for the high ones when split).
 */
INLINE void q4p_block_dots(const uint8_t *qb, const int8_t *const *xq, size_t b, int NT,
                           int split, int gfni, __m512i *iacc, __m512i *iacc2)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    UNROLL for (int g = 0; g < 4; g++)
    {
        __m512i v = load512_once(qb + 64 * g);
        __m512i lo = _mm512_and_si512(v, m4);
        __m512i hi = gfni ? hi_nibbles_gfni(v) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        UNROLL for (int j = 0; j < NT; j++)
        {
            const int8_t *x = xq[j] + b * 32 + (size_t)g * 4;
            iacc[j] = dpbusd_bcast(iacc[j], lo, x);
            if (split)
                iacc2[j] = dpbusd_bcast(iacc2[j], hi, x + 16);
            else
                iacc[j] = dpbusd_bcast(iacc[j], hi, x + 16);
        }
    }
}

INLINE void gemm_q4p_tile1(const uint8_t *pp, size_t nb, size_t nblk, const struct kern_act *a,
                           const struct kern_act_sc *sc, size_t k0, size_t t, int NT, float *y,
                           size_t ldy, size_t r, __mmask16 rm, int add, int gfni)
{
    const int split = NT <= 2;
    __m512 facc[Q4P_NT];
    const int8_t *xq[Q4P_NT];
    sc += k0 / 32 * (size_t)NT;
    UNROLL for (int j = 0; j < NT; j++)
    {
        facc[j] = _mm512_setzero_ps();
        xq[j] = a->q + (t + (size_t)j) * a->ld + k0;
    }
    struct kern__side_pf *const side = kern__side_list(); /* once: internal.h */
    for (size_t b = 0; b < nblk; b++) {
        kern__side_one(side); /* kern.h kern_side_prefetch */
        const uint8_t *qb = pp + quant_q4p_qoff(k0 / 32 + b, nb);
        UNROLL for (int l = 0; l < 5; l++) /* gemm_q4p_tile's prefetch, one panel */
            _mm_prefetch((const char *)qb + Q4P_PF + 64 * l, _MM_HINT_T0);
        const struct kern_act_sc *scb = sc + b * (size_t)NT;
        /* tokens 2i, 2i + 1's {d, ns32} in every 128-bit lane: one load for both (an odd last
         * token: its own broadcasts, so no load reaches past the tile's entries) */
        __m512i scv[Q4P_NT / 2];
        UNROLL for (int i = 0; i < NT / 2; i++)
            scv[i] = _mm512_broadcast_i32x4(
                _mm_loadu_si128((const __m128i *)(const void *)(scb + 2 * i)));
        __m512i iacc[Q4P_NT], iacc2[Q4P_NT];
        UNROLL for (int j = 0; j < NT; j++)
        {
            if (j / 2 < NT / 2)
                iacc[j] = lane_word(scv[j / 2], 2 * (j % 2) + 1);
            else
                iacc[j] = bcast_epi32_ld(&scb[j].ns32);
            iacc2[j] = _mm512_setzero_si512();
        }
        q4p_block_dots(qb, xq, b, NT, split, gfni, iacc, iacc2);
        const __m512 s = _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)(pp + quant_q4p_soff(k0 / 32 + b, nb))));
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512i ia = split ? _mm512_add_epi32(iacc[j], iacc2[j]) : iacc[j];
            __m512 f;
            if (j / 2 < NT / 2)
                f = _mm512_mul_ps(_mm512_cvtepi32_ps(ia),
                                  _mm512_castsi512_ps(lane_word(scv[j / 2], 2 * (j % 2))));
            else
                f = mul_bcast_ps(_mm512_cvtepi32_ps(ia), &scb[j].d);
            facc[j] = _mm512_fmadd_ps(f, s, facc[j]);
        }
    }
    panel_store(facc, NT, y + t * ldy, ldy, r, rm, add);
}

INLINE void gemm_q4p_tile(const uint8_t *pp, size_t pstride, int NP, size_t nb, size_t nblk,
                          const struct kern_act *a, const struct kern_act_sc *sc, size_t k0,
                          size_t t, int NT, float *y, size_t ldy, size_t r,
                          const __mmask16 rm[Q4P_NP], int add)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const int split = NP == 1 ? NT <= 2 : NP * NT <= 8;
    /* float sums [NP][NT][16 rows], in memory (L1) */
    float fs[Q4P_NP * Q4P_NT * 16] __attribute__((aligned(64)));
    const int8_t *xq[Q4P_NT];
    sc += k0 / 32 * (size_t)NT; /* the tile's [block][token] pairs, from block k0/32 */
    UNROLL for (int j = 0; j < NT; j++)
    {
        UNROLL for (int p = 0; p < NP; p++) _mm512_store_ps(fs + (p * Q4P_NT + j) * 16,
                                                          _mm512_setzero_ps());
        xq[j] = a->q + (t + (size_t)j) * a->ld + k0;
    }
    struct kern__side_pf *const side = kern__side_list(); /* once: internal.h */
    for (size_t b = 0; b < nblk; b++) {
        kern__side_one(side); /* kern.h kern_side_prefetch */
        const uint8_t *qb = pp + quant_q4p_qoff(k0 / 32 + b, nb);
        /* Q4P_PF ahead in each panel's sequential stream (bench/kern_bench --only batch:
         * 4-16 KiB were best, none or 1 KiB ~15-25% slower from DRAM) */
        {
            /* past a panel's end its stream continues NP panels on (the next tile's), not in
             * the next panel, which this tile is already reading */
            size_t o = quant_q4p_qoff(k0 / 32 + b, nb) + Q4P_PF;
            o += o >= pstride ? (size_t)(NP - 1) * pstride : 0;
            UNROLL for (int p = 0; p < NP; p++) UNROLL for (int l = 0; l < 5; l++)
                _mm_prefetch((const char *)pp + (size_t)p * pstride + o + 64 * l, _MM_HINT_T0);
        }
        __m512i iacc[Q4P_NP][Q4P_NT], iacc2[Q4P_NP][Q4P_NT];
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512i s0 = _mm512_set1_epi32(sc[b * (size_t)NT + (size_t)j].ns32);
            UNROLL for (int p = 0; p < NP; p++)
            {
                iacc[p][j] = s0;
                iacc2[p][j] = _mm512_setzero_si512();
            }
        }
        UNROLL for (int g = 0; g < 4; g++)
        {
            __m512i lo[Q4P_NP], hi[Q4P_NP];
            UNROLL for (int p = 0; p < NP; p++)
            {
                __m512i v = load512_once(qb + (size_t)p * pstride + 64 * g);
                lo[p] = _mm512_and_si512(v, m4);
                hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            UNROLL for (int j = 0; j < NT; j++)
            {
                const int8_t *x = xq[j] + b * 32 + (size_t)g * 4;
                if (NP == 1) { /* each broadcast feeds one vpdpbusd: fold it in */
                    iacc[0][j] = dpbusd_bcast(iacc[0][j], lo[0], x);
                    if (split)
                        iacc2[0][j] = dpbusd_bcast(iacc2[0][j], hi[0], x + 16);
                    else
                        iacc[0][j] = dpbusd_bcast(iacc[0][j], hi[0], x + 16);
                    continue;
                }
                __m512i xl = _mm512_set1_epi32(load_i32(x)), xh = _mm512_set1_epi32(load_i32(x + 16));
                UNROLL for (int p = 0; p < NP; p++)
                {
                    iacc[p][j] = _mm512_dpbusd_epi32(iacc[p][j], lo[p], xl);
                    if (split)
                        iacc2[p][j] = _mm512_dpbusd_epi32(iacc2[p][j], hi[p], xh);
                    else
                        iacc[p][j] = _mm512_dpbusd_epi32(iacc[p][j], hi[p], xh);
                }
            }
        }
        __m512 s[Q4P_NP];
        UNROLL for (int p = 0; p < NP; p++) s[p] = _mm512_cvtph_ps(_mm256_loadu_si256(
            (const __m256i *)(pp + (size_t)p * pstride + quant_q4p_soff(k0 / 32 + b, nb))));
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512 dx = _mm512_set1_ps(sc[b * (size_t)NT + (size_t)j].d);
            UNROLL for (int p = 0; p < NP; p++)
            {
                __m512i ia = split ? _mm512_add_epi32(iacc[p][j], iacc2[p][j]) : iacc[p][j];
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ia), dx);
                float *fo = fs + (p * Q4P_NT + j) * 16;
                _mm512_store_ps(fo, _mm512_fmadd_ps(f, s[p], _mm512_load_ps(fo)));
            }
        }
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int p = 0; p < NP; p++)
    {
        float *yo = y + (t + (size_t)j) * ldy + r + 16 * (size_t)p;
        __m512 o = _mm512_load_ps(fs + (p * Q4P_NT + j) * 16);
        if (add)
            o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(rm[p], yo));
        _mm512_mask_storeu_ps(yo, rm[p], o);
    }
}

/*
 * (v >> 4) & 15 in every byte with one GF(2) affine op instead of a shift and an and (4 of the
 * ~100 port-0/5 ops of a 16 x 32 block at 8 tokens): output bit i (i < 4) is input bit i + 4,
 * so matrix row i (byte 7 - i of the qword) is 1 << (i + 4), rows 4..7 are zero, no constant.
 * Inline assembly, so this file needs no -mgfni (with it GCC may pick GFNI for code of its own);
 * run only where the CPU has GFNI (kern__gfni, kernels/dispatch.c).
 */
INLINE __m512i hi_nibbles_gfni(__m512i v)
{
    /* the matrix in a register (GCC hoists the constant out of the block loop) */
    const __m512i m = _mm512_set1_epi64((long long)0x1020408000000000ull);
    __m512i r;
    __asm__("vgf2p8affineqb $0, %[m], %[v], %[r]" : [r] "=v"(r) : [v] "v"(v), [m] "v"(m));
    return r;
}

/*
 * gemm_q4p_tile's one-panel tile (NP = 1) on two panels pa, pb far apart (rows ra, rb) block by
 * block, 1..8 tokens: the thread keeps two sequential DRAM streams in flight (kern.h
 * kern_set_panel_streams) with the one-panel tile's instructions per panel (its folded
 * broadcasts, its accumulators), the float sums in registers (2 x NT; with the NT int
 * accumulators and the nibbles <= 27 zmm). Each panel's steps are the one-panel tile's, in its
 * order: the same bits (gfni: the high nibbles by hi_nibbles_gfni, the same bytes). Unlike the
 * two-panel tile (NP = 2, adjacent panels sharing each broadcast), which measured slower at
 * n = 8 from DRAM (docs/PERFORMANCE.md "int4 wide tile, session 11").
 */
#ifndef Q4P_NS2 /* 0: the one-stream tiles (bench/kern_bench_ab.sh CFLAGS_A / CFLAGS_B) */
#define Q4P_NS2 1
#endif
INLINE void gemm_q4p_tile2s(const uint8_t *pa, const uint8_t *pb, size_t nb, size_t nblk,
                            const struct kern_act *a, const struct kern_act_sc *sc, size_t k0,
                            int NT, float *y, size_t ldy, size_t ra, size_t rb, __mmask16 rma,
                            __mmask16 rmb, int add, int gfni)
{
    const int split = NT <= 2;
    const uint8_t *pp[2] = {pa, pb};
    __m512 facc[2][Q4P_NT];
    const int8_t *xq[Q4P_NT];
    sc += k0 / 32 * (size_t)NT;
    UNROLL for (int j = 0; j < NT; j++)
    {
        facc[0][j] = facc[1][j] = _mm512_setzero_ps();
        xq[j] = a->q + (size_t)j * a->ld + k0;
    }
    struct kern__side_pf *const side = kern__side_list(); /* once: internal.h */
    for (size_t b = 0; b < nblk; b++) {
        kern__side_one(side); /* kern.h kern_side_prefetch */
        UNROLL for (int u = 0; u < 2; u++)
        {
            const uint8_t *qb = pp[u] + quant_q4p_qoff(k0 / 32 + b, nb);
            /* gemm_q4p_tile's prefetch; past a panel's end its stream is the next panel */
            UNROLL for (int l = 0; l < 5; l++)
                _mm_prefetch((const char *)qb + Q4P_PF + 64 * l, _MM_HINT_T0);
            __m512i iacc[Q4P_NT], iacc2[Q4P_NT];
            UNROLL for (int j = 0; j < NT; j++)
            {
                iacc[j] = bcast_epi32_ld(&sc[b * (size_t)NT + (size_t)j].ns32);
                iacc2[j] = _mm512_setzero_si512();
            }
            q4p_block_dots(qb, xq, b, NT, split, gfni, iacc, iacc2);
            panel_block_fold(pp[u] + quant_q4p_soff(k0 / 32 + b, nb), iacc, iacc2, split,
                             sc + b * (size_t)NT, NT, facc[u]);
        }
    }
    panel_store(facc[0], NT, y, ldy, ra, rma, add);
    panel_store(facc[1], NT, y, ldy, rb, rmb, add);
}

/* Token tiles of near-equal size (n = 12: 6 + 6, not 8 + 4): tile ti of ntiles starts at t. */
INLINE size_t q4p_tile_tokens(size_t n, size_t t, size_t ti, size_t ntiles)
{
    return (n - t + (ntiles - ti) - 1) / (ntiles - ti);
}

/* kern_gemm_q4_0p_q8_0_avx512's body; gfni: the two-stream tiles (1..8 tokens) take the high
 * nibbles with GFNI (hi_nibbles_gfni: the same bytes, so the same bits) */
INLINE void q4p_gemm(const void *wp, const struct kern_act *a, float *y, size_t ldy, size_t r0,
                     size_t r1, int gfni)
{
    const size_t nb = a->cols / 32, rb = kern__row_bytes(DT_Q4_0, a->cols);
    const size_t pstride = PANEL * rb; /* bytes of one panel */
    /* each token's block scale and offset correction, tiled as below (kern_act.sc) */
    const struct kern_act_sc *sc = a->sc;
    CHECK(sc != NULL);
    /* n < 16 (decode of a few streams, weights from DRAM): one panel per tile. Two measured
     * faster at n = 8 with the weights in cache (1.03-1.10x) but slower in engine_bench's
     * 8-stream decode (0.75-1.07x, 7 alternations under load; session 10 saw 0.8-0.9x from
     * DRAM at n = 8, 9): docs/PERFORMANCE.md "int4 wide tile, session 11". Up to 8 tokens
     * (one token tile) the one-panel tile runs on two far panels at once instead
     * (gemm_q4p_tile2s: two DRAM streams, 1.10-1.28x from DRAM at n = 1..8, docs/PERFORMANCE.md
     * "q4_0 and q8_0 panel products at 8 tokens, session 19") */
    const int np_max = a->n >= 16 ? Q4P_NP : 1;
    const size_t ntiles = (a->n + Q4P_NT - 1) / Q4P_NT;
    if (Q4P_NS2 && ntiles == 1 && r1 - r0 > PANEL && kern__qpanel_streams >= 2) {
        /* 1..8 tokens, one token tile: panel i with panel h + i (gemm_q4p_tile2s, two DRAM
         * streams); with np odd, h - 1 alone (the one-panel tile) */
        const size_t np = (r1 - r0 + PANEL - 1) / PANEL, h = (np + 1) / 2;
        for (size_t i = 0; i < h; i++) {
            const size_t ra = r0 + i * PANEL, rbb = r0 + (h + i) * PANEL;
            const int two = i + h < np;
            const size_t nra = r1 - ra < PANEL ? r1 - ra : PANEL;
            const size_t nrb = two ? (r1 - rbb < PANEL ? r1 - rbb : PANEL) : 0;
            const __mmask16 rm[Q4P_NP] = {(__mmask16)((1u << nra) - 1u), 0};
            const __mmask16 rmb = (__mmask16)((1u << nrb) - 1u);
            const uint8_t *pa = (const uint8_t *)wp + ra / PANEL * pstride;
            const uint8_t *pb = two ? (const uint8_t *)wp + rbb / PANEL * pstride : pa;
            for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
                size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
                switch (a->n * 2 + (size_t)two) {
#define CASE_(T)                                                                             \
    case T * 2:                                                                              \
        if (Q4P_T1)                                                                          \
            gemm_q4p_tile1(pa, nb, kc / 32, a, sc, k0, 0, T, y, ldy, ra, rm[0], k0 > 0, gfni); \
        else                                                                                 \
            gemm_q4p_tile(pa, pstride, 1, nb, kc / 32, a, sc, k0, 0, T, y, ldy, ra, rm,      \
                          k0 > 0);                                                           \
        break;                                                                               \
    case T * 2 + 1:                                                                          \
        gemm_q4p_tile2s(pa, pb, nb, kc / 32, a, sc, k0, T, y, ldy, ra, rbb, rm[0], rmb,      \
                        k0 > 0, gfni);                                                       \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
#undef CASE_
                }
            }
        }
        return;
    }
    for (size_t r = r0; r < r1; r += (size_t)np_max * PANEL) {
        __mmask16 rm[Q4P_NP] = {0};
        int np = 0;
        for (; np < np_max && r + (size_t)np * PANEL < r1; np++) {
            size_t rr = r + (size_t)np * PANEL, nr = r1 - rr < PANEL ? r1 - rr : PANEL;
            rm[np] = (__mmask16)((1u << nr) - 1u);
        }
        const uint8_t *pp = (const uint8_t *)wp + r / PANEL * pstride;
        /* the same K chunks as gemm_q (same sums, and a chunk of the panels stays in L1 while
         * token tiles pass over it) */
        for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
            size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
            size_t nt;
            for (size_t t = 0, ti = 0; t < a->n; t += nt, ti++) {
                nt = q4p_tile_tokens(a->n, t, ti, ntiles);
                switch ((size_t)np * 16 + nt) {
#define CASE_(P, T)                                                                          \
    case P * 16 + T:                                                                         \
        if (P == 1 && Q4P_T1)                                                                \
            gemm_q4p_tile1(pp, nb, kc / 32, a, sc + t * nb, k0, t, T, y, ldy, r, rm[0],      \
                           k0 > 0, gfni);                                                    \
        else                                                                                 \
            gemm_q4p_tile(pp, pstride, P, nb, kc / 32, a, sc + t * nb, k0, t, T, y, ldy, r,  \
                          rm, k0 > 0);                                                       \
        break;
                    CASE_(1, 1) CASE_(1, 2) CASE_(1, 3) CASE_(1, 4) CASE_(1, 5) CASE_(1, 6)
                    CASE_(1, 7) CASE_(1, 8) CASE_(2, 1) CASE_(2, 2) CASE_(2, 3) CASE_(2, 4)
                    CASE_(2, 5) CASE_(2, 6) CASE_(2, 7) CASE_(2, 8)
#undef CASE_
                }
            }
        }
    }
}

/* The GFNI path whatever kern__gfni says (tests/kern runs both paths on a GFNI CPU); only where
 * the CPU has GFNI (kern_has_gfni). */
__attribute__((noinline)) void kern_gemm_q4_0p_q8_0_avx512gfni(const void *wp,
                                                                const struct kern_act *a,
                                                                float *y, size_t ldy, size_t r0,
                                                                size_t r1)
{
    q4p_gemm(wp, a, y, ldy, r0, r1, 1);
}

/* q4p_gemm's two instances, each its own function (noinline): inlined both into one, the plain
 * path ran ~0.8x in kern_bench_ab (n = 8, in cache) */
__attribute__((noinline)) static void q4p_gemm_plain(const void *wp, const struct kern_act *a,
                                                     float *y, size_t ldy, size_t r0, size_t r1)
{
    q4p_gemm(wp, a, y, ldy, r0, r1, 0);
}

void kern_gemm_q4_0p_q8_0_avx512(const void *wp, const struct kern_act *a, float *y,
                                 size_t ldy, size_t r0, size_t r1)
{
    /* GFNI where the CPU has it (and CLOCHER_GFNI is not 0): ~1.04x at n = 8 from DRAM with
     * the broadcast change, not settled under load (docs/PERFORMANCE.md "int4 decode at 8
     * streams, session 20") */
    if (kern__gfni)
        kern_gemm_q4_0p_q8_0_avx512gfni(wp, a, y, ldy, r0, r1);
    else
        q4p_gemm_plain(wp, a, y, ldy, r0, r1);
}


/*
 * kern_panels_pack of q4_0 on AVX-512 (the load-time repack, ~10x the scalar copy):
 * pack_panel_q4's loads and transpose, stored as they are, nibbles still paired (quant.h, "q4_0 panels").
 */
void kern__q4p_pack_avx512(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                           size_t p1)
{
    const size_t nblk = cols / 32, rb = kern__row_bytes(DT_Q4_0, cols);
    for (size_t p = p0; p < p1; p++) {
        size_t r = p * PANEL, nr = rows - r < PANEL ? rows - r : PANEL;
        uint8_t *pp = (uint8_t *)dst + r * rb;
        for (size_t b0 = 0; b0 < nblk; b0 += 4) {
            size_t nb = nblk - b0 < 4 ? nblk - b0 : 4;
            __m512i v[PANEL], z[PANEL], lo, hi;
            load_q4_rows(w, rb, r, nr, b0, nb, 0, v, z);
            scales_gather(QK_Q4_0, v, nr, &lo, &hi);
            transpose16(z);
            for (size_t kk = 0; kk < nb; kk++) {
                _mm256_storeu_si256((__m256i *)(void *)(pp + quant_q4p_soff(b0 + kk, nblk)),
                                    scales_block(lo, hi, kk));
                UNROLL for (int g = 0; g < 4; g++) _mm512_storeu_si512(
                    (void *)(pp + quant_q4p_qoff(b0 + kk, nblk) + (size_t)g * 64),
                    z[4 * kk + (size_t)g]);
            }
        }
    }
}

/* ---- gemm on q8_0 panels repacked at load time (quant.h, "q8_0 panels") ------------------ */

/*
 * gemm_tile reading the panel from the repacked matrix instead of a packed chunk: a q8_0 panel
 * block is the 8 vectors pack_panel builds (w ^ 0x80, lane = row) followed, per block pair, by
 * the f16 scales that pack_scales widens, so the integer sums are gemm_tile's and the float
 * steps are its own, in its order: outputs equal kern_gemm_q8_0_q8_0_avx512's bit for bit.
 * With 1–2 tokens one accumulator would be a chain of 8 dependent vpdpbusd per block, so even
 * and odd groups of 4 columns go to two accumulators (added as integers: still exact).
 * Each token's block scale and offset correction come from the [block][token] copy the q4_0
 * tile uses (kern_act.sc): one pointer instead of two per token, which beside
 * the 8 quant pointers overflowed the general registers at 8 tokens.
 * Each pair of tokens' {d, ns32} is one 16-byte load picked by vpshufd (lane_word), as in
 * gemm_q4p_tile1: Zen 5 issues two vector loads a cycle and a block at 8 tokens made ~89 of
 * them beside 64 vpdpbusd; with ~77, kern_bench_ab read 1.10x in L2/L3 and 1.23x from DRAM at
 * 8 tokens, 1.13x at 2 (session 26), the same bits.
 * pp: the panel (quant.h: block b's quants at quant_q8p_qoff, scales at quant_q8p_soff);
 * blocks [k0/32, k0/32 + nblk) of its nb; sc: the token tile's part of kern_act.sc.
 */
#ifndef Q8P_PF /* bench/kern_bench_ab.sh can set it per side (CFLAGS_A, CFLAGS_B); 0: none */
#define Q8P_PF 8192 /* software prefetch distance from 2 tokens (bytes of the panel stream) */
#endif
/*
 * NS = 2: the same tile on two panels at once, pp and pp2 (rows r2, mask rm2), block by block,
 * so the thread keeps two sequential DRAM streams in flight (kern.h kern_set_panel_streams);
 * each panel's steps are the NS = 1 tile's, in its order: the same bits. 2 x 8 float
 * accumulators + 8 int + the weights fit the 32 zmm.
 */
INLINE void gemm_q8p_tile(const uint8_t *pp, const uint8_t *pp2, int NS, size_t nb, size_t nblk,
                          const struct kern_act *a, const struct kern_act_sc *sc, size_t k0,
                          size_t t, int NT, float *y, size_t ldy, size_t r, __mmask16 rm,
                          size_t r2, __mmask16 rm2, int add)
{
    const int split = NT <= 2;
    const uint8_t *pps[2] = {pp, pp2};
    __m512 facc[2][GEMM_NT];
    const int8_t *xq[GEMM_NT];
    sc += k0 / 32 * (size_t)NT; /* the tile's [block][token] pairs, from block k0/32 */
    UNROLL for (int j = 0; j < NT; j++)
    {
        UNROLL for (int u = 0; u < NS; u++) facc[u][j] = _mm512_setzero_ps();
        xq[j] = a->q + (t + (size_t)j) * a->ld + k0;
    }
    struct kern__side_pf *const side = kern__side_list(); /* once: internal.h */
    for (size_t b = 0; b < nblk; b++) {
        kern__side_one(side); /* kern.h kern_side_prefetch */
        /* tokens 2i, 2i + 1's {d, ns32} from one load (gemm_q4p_tile1: vector loads bound
         * these tiles on Zen 5); an odd last token's from its own broadcasts */
        const struct kern_act_sc *scb = sc + b * (size_t)NT;
        __m512i scv[GEMM_NT / 2];
        UNROLL for (int i = 0; i < NT / 2; i++)
            scv[i] = _mm512_broadcast_i32x4(
                _mm_loadu_si128((const __m128i *)(const void *)(scb + 2 * i)));
        UNROLL for (int u = 0; u < NS; u++)
        {
            const uint8_t *qb = pps[u] + quant_q8p_qoff(k0 / 32 + b, nb);
            /* one token: no software prefetch. The panel is one sequential stream, which the
             * hardware prefetchers follow; 9 prefetches per block 2-16 KiB ahead cost 1.3x
             * the time at n = 1, on 2 MiB and 4 KiB pages, 1 and 2 threads
             * (docs/PERFORMANCE.md "gpt-oss decode, session 14"). From 2 tokens the block's
             * compute is long enough for them to pay (docs/PERFORMANCE.md, "q4_0 and q8_0
             * panel products at 8 tokens, session 19"); past the panel's end the stream is
             * the next panel, read next. */
            if (Q8P_PF && NT >= 2)
                UNROLL for (int l = 0; l < 9; l++) _mm_prefetch(
                    (const char *)qb + Q8P_PF + 64 * l, _MM_HINT_T0);
            __m512i iacc[GEMM_NT], iacc2[GEMM_NT];
            UNROLL for (int j = 0; j < NT; j++)
            {
                iacc[j] = j / 2 < NT / 2 ? lane_word(scv[j / 2], 2 * (j % 2) + 1)
                                         : bcast_epi32_ld(&scb[j].ns32);
                iacc2[j] = _mm512_setzero_si512();
            }
            UNROLL for (int g = 0; g < 8; g++)
            {
                __m512i wv = _mm512_loadu_si512((const void *)(qb + 64 * g));
                UNROLL for (int j = 0; j < NT; j++)
                {
                    /* the activation dword as vpdpbusd's {1to16} memory operand
                     * (dpbusd_bcast): GCC emitted set1(load) as a GPR load and a port-5
                     * vpbroadcastd per vpdpbusd; at n = 8 folded ran 1.03-1.32x
                     * (docs/PERFORMANCE.md "int4 8-stream decode against AMX tiles, session
                     * 18") */
                    const int8_t *x = xq[j] + b * 32 + (size_t)g * 4;
                    if (split && (g & 1))
                        iacc2[j] = dpbusd_bcast(iacc2[j], wv, x);
                    else
                        iacc[j] = dpbusd_bcast(iacc[j], wv, x);
                }
            }
            /* panel_block_fold's steps, each d from scv */
            const __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256(
                (const __m256i *)(const void *)(pps[u] + quant_q8p_soff(k0 / 32 + b, nb))));
            UNROLL for (int j = 0; j < NT; j++)
            {
                __m512i ia = split ? _mm512_add_epi32(iacc[j], iacc2[j]) : iacc[j];
                const __m512 fi = _mm512_cvtepi32_ps(ia);
                __m512 f = j / 2 < NT / 2
                               ? _mm512_mul_ps(fi, _mm512_castsi512_ps(
                                                       lane_word(scv[j / 2], 2 * (j % 2))))
                               : mul_bcast_ps(fi, &scb[j].d);
                facc[u][j] = _mm512_fmadd_ps(f, sw, facc[u][j]);
            }
        }
    }
    panel_store(facc[0], NT, y + t * ldy, ldy, r, rm, add);
    if (NS == 2)
        panel_store(facc[1], NT, y + t * ldy, ldy, r2, rm2, add);
}

/*
 * gemm_q8p_tile at one token on two panels pa, pb (half the thread's row range apart) block by
 * block (kern.h kern_set_panel_streams, default): the thread keeps two sequential DRAM streams
 * in flight instead of one (docs/PERFORMANCE.md "gpt-oss decode, session 17"). Each panel's
 * steps are gemm_q8p_tile's at NT = 1 (split accumulators), in its order: the same bits.
 */
INLINE void gemm_q8p_tile2(const uint8_t *pa, const uint8_t *pb, size_t nb, size_t nblk,
                           const struct kern_act *a, size_t k0, float *y, size_t ra, size_t rb,
                           __mmask16 rma, __mmask16 rmb, int add)
{
    const uint8_t *pp[2] = {pa, pb};
    __m512 facc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const int8_t *xq = a->q + k0;
    const float *xd = a->d + k0 / 32;
    const int32_t *xs = a->ns32 + k0 / 32;
    struct kern__side_pf *const side = kern__side_list(); /* once: internal.h */
    for (size_t b = 0; b < nblk; b++) {
        kern__side_one(side); /* kern.h kern_side_prefetch */
        const __m512 xdb = _mm512_set1_ps(xd[b]);
        UNROLL for (int k = 0; k < 2; k++)
        {
            const uint8_t *qb = pp[k] + quant_q8p_qoff(k0 / 32 + b, nb);
            __m512i iacc = _mm512_set1_epi32(xs[b]), iacc2 = _mm512_setzero_si512();
            UNROLL for (int g = 0; g < 8; g++)
            {
                __m512i wv = _mm512_loadu_si512((const void *)(qb + 64 * g));
                __m512i xv = _mm512_set1_epi32(load_i32(xq + b * 32 + (size_t)g * 4));
                if (g & 1)
                    iacc2 = _mm512_dpbusd_epi32(iacc2, wv, xv);
                else
                    iacc = _mm512_dpbusd_epi32(iacc, wv, xv);
            }
            __m512 sc = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(pp[k] + quant_q8p_soff(k0 / 32 + b, nb))));
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(iacc, iacc2)), xdb);
            facc[k] = _mm512_fmadd_ps(f, sc, facc[k]);
        }
    }
    float *yo[2] = {y + ra, y + rb};
    const __mmask16 rm[2] = {rma, rmb};
    UNROLL for (int k = 0; k < 2; k++)
    {
        if (add)
            facc[k] = _mm512_add_ps(facc[k], _mm512_maskz_loadu_ps(rm[k], yo[k]));
        _mm512_mask_storeu_ps(yo[k], rm[k], facc[k]);
    }
}

void kern_gemm_q8_0p_q8_0_avx512(const void *wp, const struct kern_act *a, float *y,
                                 size_t ldy, size_t r0, size_t r1)
{
    const size_t nb = a->cols / 32, rb = kern__row_bytes(DT_Q8_0, a->cols);
    if (a->n == 1 && r1 - r0 > PANEL && kern__qpanel_streams >= 2) {
        /* the range's panels [0, np): panel i with panel h + i; with np odd, h - 1 alone */
        const size_t np = (r1 - r0 + PANEL - 1) / PANEL, h = (np + 1) / 2;
        for (size_t i = 0; i + h < np; i++) {
            const size_t ra = r0 + i * PANEL, rbb = r0 + (h + i) * PANEL;
            const size_t nrb = r1 - rbb < PANEL ? r1 - rbb : PANEL;
            const uint8_t *pa = (const uint8_t *)wp + ra / PANEL * PANEL * rb;
            const uint8_t *pb = (const uint8_t *)wp + rbb / PANEL * PANEL * rb;
            for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
                size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
                gemm_q8p_tile2(pa, pb, nb, kc / 32, a, k0, y, ra, rbb, (__mmask16)0xffff,
                               (__mmask16)((1u << nrb) - 1u), k0 > 0);
            }
        }
        if (np % 2) /* the middle panel h - 1 alone */
            kern_gemm_q8_0p_q8_0_avx512(wp, a, y, ldy, r0 + (h - 1) * PANEL,
                                        r0 + h * PANEL < r1 ? r0 + h * PANEL : r1);
        return;
    }
    /* each token's block scale and offset correction, tiled as below (kern_act.sc) */
    const struct kern_act_sc *sc = a->sc;
    CHECK(sc != NULL);
    _Static_assert(GEMM_NT == KERN_ACT_SC_NT, "the q8_0 panel tile's tokens are kern_act.sc's");
    const size_t ntiles = (a->n + GEMM_NT - 1) / GEMM_NT;
#ifndef Q8P_NS2 /* 0: one panel at a time from 2 tokens (kern_bench_ab.sh CFLAGS_A / _B) */
#define Q8P_NS2 1
#endif
    if (Q8P_NS2 && ntiles == 1 && r1 - r0 > PANEL && kern__qpanel_streams >= 2) {
        /* 2..8 tokens, one token tile: two DRAM streams as at one token, panel i with h + i
         * (NS = 2); with np odd, h - 1 alone */
        const size_t np = (r1 - r0 + PANEL - 1) / PANEL, h = (np + 1) / 2;
        for (size_t i = 0; i < h; i++) {
            const size_t ra = r0 + i * PANEL, rbb = r0 + (h + i) * PANEL;
            const int two = i + h < np;
            const size_t nra = r1 - ra < PANEL ? r1 - ra : PANEL;
            const size_t nrb = two ? (r1 - rbb < PANEL ? r1 - rbb : PANEL) : 0;
            const __mmask16 rma = (__mmask16)((1u << nra) - 1u);
            const __mmask16 rmb = (__mmask16)((1u << nrb) - 1u);
            const uint8_t *pa = (const uint8_t *)wp + ra / PANEL * PANEL * rb;
            const uint8_t *pb = two ? (const uint8_t *)wp + rbb / PANEL * PANEL * rb : pa;
            for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
                size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
                switch (a->n * 2 + (size_t)two) {
#define CASE_(T)                                                                             \
    case T * 2:                                                                              \
        gemm_q8p_tile(pa, pa, 1, nb, kc / 32, a, sc, k0, 0, T, y, ldy, ra, rma, 0, 0,        \
                      k0 > 0);                                                               \
        break;                                                                               \
    case T * 2 + 1:                                                                          \
        gemm_q8p_tile(pa, pb, 2, nb, kc / 32, a, sc, k0, 0, T, y, ldy, ra, rma, rbb, rmb,    \
                      k0 > 0);                                                               \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
#undef CASE_
                }
            }
        }
        return;
    }
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        const uint8_t *pp = (const uint8_t *)wp + r / PANEL * PANEL * rb;
        /* the same K chunks as gemm_q: the same sums (and the chunk stays in L1 while token
         * tiles pass over it); token tiles of near-equal size, kern_act.sc's */
        for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
            size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC;
            size_t nt;
            for (size_t t = 0, ti = 0; t < a->n; t += nt, ti++) {
                nt = q4p_tile_tokens(a->n, t, ti, ntiles);
                switch (nt) {
#define CASE_(T)                                                                             \
    case T:                                                                                  \
        gemm_q8p_tile(pp, pp, 1, nb, kc / 32, a, sc + t * nb, k0, t, T, y, ldy, r, rm, 0, 0, \
                      k0 > 0);                                                               \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
#undef CASE_
                }
            }
        }
    }
}

/*
 * kern_panels_pack of q8_0 on AVX-512: pack_panel's q8_0 loads (unpack_pair: w ^ 0x80) and
 * transpose, and pack_scales' gather kept as f16, stored in the panel layout (quant.h, "q8_0 panels").
 * Rows past the matrix are zero, as in the scalar packing.
 */
void kern__q8p_pack_avx512(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                           size_t p1)
{
    const size_t nblk = cols / 32, rb = kern__row_bytes(DT_Q8_0, cols);
    for (size_t p = p0; p < p1; p++) {
        size_t r = p * PANEL, nr = rows - r < PANEL ? rows - r : PANEL;
        uint8_t *pp = (uint8_t *)dst + r * rb;
        for (size_t b0 = 0; b0 < nblk; b0 += 2) {
            int has_b = b0 + 1 < nblk;
            __m512i z[PANEL], v[PANEL], lo, hi;
            UNROLL for (int i = 0; i < PANEL; i++)
            {
                if ((size_t)i < nr) {
                    const uint8_t *q = (const uint8_t *)w + (r + (size_t)i) * rb + b0 * 34;
                    z[i] = unpack_pair(QK_Q8_0, q, has_b);
                    v[i] = has_b ? _mm512_loadu_si512((const void *)q)
                                 : _mm512_maskz_loadu_epi8((__mmask64)((1ull << 34) - 1), q);
                } else {
                    z[i] = v[i] = _mm512_setzero_si512();
                }
            }
            scales_gather(QK_Q8_0, v, nr, &lo, &hi);
            transpose16(z);
            /* after the transpose z[g] = dword g of every row: g < 8 block b0, else b0 + 1 */
            for (size_t kk = 0; kk < (size_t)(has_b ? 2 : 1); kk++) {
                _mm256_storeu_si256((__m256i *)(void *)(pp + quant_q8p_soff(b0 + kk, nblk)),
                                    scales_block(lo, hi, kk));
                UNROLL for (int g = 0; g < 8; g++) _mm512_storeu_si512(
                    (void *)(pp + quant_q8p_qoff(b0 + kk, nblk) + (size_t)g * 64),
                    z[8 * kk + (size_t)g]);
            }
        }
    }
}
