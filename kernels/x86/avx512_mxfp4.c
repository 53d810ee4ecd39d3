/*
 * avx512_mxfp4.c — the AVX-512 MXFP4 gemv (gpt-oss experts at decode, n = 1..8 tokens per
 * expert), rewritten in session 11 to need fewer instructions per weight byte so that it is
 * bound by DRAM rather than by the core (issue 13: decode at >= 80% of the read roofline).
 *
 * The same arithmetic as x86/avx512_q.c's gemm, bit for bit (batch invariance: a token's bits
 * do not depend on n, nor on whether the gemv or the gemm ran; tests/kern/test_kern_mxfp4.c):
 * each block's exact integer sum
 * (doubled E2M1 weight + 128 times the int8 activation quant, vpdpbusd, plus the offset
 * correction ns32), packed with its E8M0 byte as sum << 8 | e, one transpose16 per 16 rows x
 * 16 blocks to lane = row, then per KC chunk facc = fma(float(sum), 2^(e-128) * dx, facc) in
 * block order, the chunks added in order through y. Only how the integer sums are formed
 * changed from session 10's gemv (any exact method gives the same integers):
 *
 *  - the weights are transposed, not the sums: the 4 quads of a 16-block group (quad v:
 *    128-bit lane m = the 16 qs bytes of block 4v + m) go through one 4x4 dword transpose
 *    (8 unpacks) into X_k, dword 4m + v = qs dword k of block 4v + m. Then every vpdpbusd
 *    lane belongs to one block (low nibbles of X_k: elements 4k..4k+3, high: 16+4k..), the
 *    8 vpdpbusd of a group land in one vector of 16 block sums already in the order the
 *    exponents and the fold use, and the per-token horizontal reduction (12 ops per token and
 *    group) and 3 of the 4 offset-correction loads are gone; the transpose is paid once per
 *    row for all tokens of the pass;
 *  - with AVX512-VBMI (checked at run time; Ice Lake, Zen 4 and later) the 16 blocks (272
 *    bytes) come in with 5 loads and one vpermt2b per quad instead of 16 masked 128-bit
 *    broadcasts, the exponents with two vpermt2b instead of 4 loads + 4 vpshufb, and the
 *    nibble -> weight lookup is one vpermb on a 4x replicated 16-entry table (its index's bits
 *    4-5 are ignored by the table), so no and-mask per nibble vector.
 *    kern_gemv_mxfp4_q8_0_avx512_plain is the same kernel without VBMI (Cascade Lake).
 *
 * docs/PERFORMANCE.md "MXFP4 gemv, session 11" has the measurements.
 */
#include "internal.h"
#include "quant.h"

#include "avx512_common.h"
#include "check.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MX_PANEL 16 /* rows per fold: one per int32 lane after the transpose */
#define MX_KC 1024  /* columns per float chunk: the gemm's KC (x86/avx512_q.c), its order */
#define MX_NT 4     /* tokens per pass over a panel (each row's unpacked weights are shared) */
#define MX_WB 128   /* blocks per column window (a multiple of MX_KC / 32) */
#define MX_PF 4096  /* software prefetch distance in the row stream (x86/avx512_q.c's pf_dist) */
#define MX_BB 17    /* bytes per block: the E8M0 byte, 16 bytes of split-half nibbles */
#define MX_F2P23 0x4b000000 /* the bits of the float 2^23: its ulp is 1 */

/* quant_mxfp4_kvalues + 128 (doubled E2M1 values as unsigned bytes for vpdpbusd), four times:
 * vpshufb reads the first 16 per 128-bit lane, vpermb all 64 (index bits 4-5 ignored).
 * (avx512_q.c's gemm has the 16-entry table as mxfp4_ukv.) */
static const uint8_t mx_ukv[64] __attribute__((aligned(64))) = {
    128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116,
    128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116,
    128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116,
    128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116};

struct mx_buf {
    /* per 16 blocks of a row, dword 4m + v = block 4v + m: the exact block sum << 8 | its
     * E8M0 byte (|sum| <= 32 x 12 x 127 < 2^16: exact); [token][row][block slot] */
    int32_t pk[MX_NT][MX_PANEL][MX_WB];
    /* the window's activation quants per 16-block group: 8 vectors s = 4h + k, dword 4m + v =
     * elements 16h + 4k .. +3 of block 4v + m (h = 0: low nibbles, 1: high) */
    int8_t aq[MX_NT][MX_WB * 32];
    int32_t ans[MX_NT][MX_WB]; /* ns32 of each block, in the same dword order */
};

/* Block 4v + m of a 16-block group sits at dword 4m + v (the transpose's order). */
static inline size_t mx_slot(size_t b) { return b % 4 * 4 + b / 4; }

/* Lays out tokens [t, t + nt)'s activations of blocks [kb, kb + nbk) as struct mx_buf says;
 * slots past nbk (up to a multiple of 16) are zero, so absent blocks sum to 0. */
static void mx_arrange(const struct kern_act *a, size_t kb, size_t nbk, size_t t, size_t nt,
                       struct mx_buf *bf)
{
    const size_t nb16 = (nbk + 15) / 16 * 16;
    for (size_t j = 0; j < nt; j++) {
        const int8_t *q = a->q + (t + j) * a->ld + kb * 32;
        const int32_t *ns = a->ns32 + (t + j) * a->cp / 32 + kb;
        for (size_t g = 0; g < nb16; g += 16) {
            int8_t *aq = bf->aq[j] + g * 32;
            for (size_t b = 0; b < 16; b++) {
                size_t s = mx_slot(b);
                if (g + b < nbk) {
                    for (size_t k = 0; k < 8; k++) /* elements 4k..4k+3 -> vector k */
                        memcpy(aq + k * 64 + s * 4, q + (g + b) * 32 + k * 4, 4);
                    bf->ans[j][g + s] = ns[g + b];
                } else {
                    for (size_t k = 0; k < 8; k++)
                        memset(aq + k * 64 + s * 4, 0, 4);
                    bf->ans[j][g + s] = 0;
                }
            }
        }
    }
}

/* ---- one 16-block group of one row -------------------------------------------------------- */

/* The 4x4 dword transpose of the quads q[v] (lane m = block 4v + m) into x[k] (dword 4m + v =
 * qs dword k of block 4v + m). */
INLINE void mx_transpose(const __m512i q[4], __m512i x[4])
{
    __m512i t0 = _mm512_unpacklo_epi32(q[0], q[1]), t1 = _mm512_unpackhi_epi32(q[0], q[1]);
    __m512i t2 = _mm512_unpacklo_epi32(q[2], q[3]), t3 = _mm512_unpackhi_epi32(q[2], q[3]);
    x[0] = _mm512_unpacklo_epi64(t0, t2);
    x[1] = _mm512_unpackhi_epi64(t0, t2);
    x[2] = _mm512_unpacklo_epi64(t1, t3);
    x[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The 16 block sums of tokens j < NT (w[4h + k]: the unsigned weights of X_k's low (h = 0) or
 * high nibbles), packed with the exponents ex, into pk[j][i] + g. One chain of 8 vpdpbusd:
 * rows are independent, so the core overlaps chains of consecutive rows (two chains of 4 and
 * their add took 0-7% more cycles from L2, a tie from DRAM; docs/PERFORMANCE.md "gpt-oss decode, session 15"). */
INLINE void mx_dots(const __m512i w[8], __m512i ex, int NT, struct mx_buf *bf, size_t i,
                    size_t g)
{
    UNROLL for (int j = 0; j < NT; j++)
    {
        const int8_t *aq = bf->aq[j] + g * 32;
        __m512i s0 = _mm512_loadu_si512(bf->ans[j] + g);
        UNROLL for (int s = 0; s < 8; s++) s0 =
            _mm512_dpbusd_epi32(s0, w[s], _mm512_loadu_si512(aq + 64 * s));
        _mm512_storeu_si512(bf->pk[j][i] + g, _mm512_or_si512(_mm512_slli_epi32(s0, 8), ex));
    }
}

INLINE void mx_prefetch(const uint8_t *gb)
{
    UNROLL for (size_t l = 0; l < 16 * MX_BB; l += 64) _mm_prefetch(
        (const char *)gb + MX_PF + l, _MM_HINT_T0);
}

/* vpshufb indices for the exponents without VBMI, load g (bytes 68g..): lane m's byte m (block
 * 4g + m's exponent) -> byte 4g of lane m, i.e. dword 4m + g; the rest zero */
static const uint8_t mx_eix[4][64] __attribute__((aligned(64))) = {
    {0, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
     1, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
     2, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
     3, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128},
    {128, 128, 128, 128, 0, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
     128, 128, 128, 128, 1, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
     128, 128, 128, 128, 2, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
     128, 128, 128, 128, 3, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128},
    {128, 128, 128, 128, 128, 128, 128, 128, 0, 128, 128, 128, 128, 128, 128, 128,
     128, 128, 128, 128, 128, 128, 128, 128, 1, 128, 128, 128, 128, 128, 128, 128,
     128, 128, 128, 128, 128, 128, 128, 128, 2, 128, 128, 128, 128, 128, 128, 128,
     128, 128, 128, 128, 128, 128, 128, 128, 3, 128, 128, 128, 128, 128, 128, 128},
    {128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 0, 128, 128, 128,
     128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 1, 128, 128, 128,
     128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 2, 128, 128, 128,
     128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 3, 128, 128, 128},
};

/* Without VBMI: blocks [0, nblk) (1..16) of the group at gb: quads and exponents (dword 4m + v,
 * 0 past nblk); bytes past block nblk are not read. */
INLINE void mx_load_plain(const uint8_t *gb, size_t nblk, __m512i q[4], __m512i *ex)
{
    const size_t len = nblk * MX_BB;
    __m512i e = _mm512_setzero_si512();
    UNROLL for (size_t v = 0; v < 4; v++)
    {
        size_t lo = 68 * v, cnt = len > lo ? len - lo : 0;
        __m512i l = cnt >= 64 ? _mm512_loadu_si512((const void *)(gb + lo))
                              : _mm512_maskz_loadu_epi8((__mmask64)((1ull << cnt) - 1), gb + lo);
        e = _mm512_or_si512(e, _mm512_shuffle_epi8(l, _mm512_load_si512(mx_eix[v])));
        __m512i z = _mm512_setzero_si512();
        UNROLL for (size_t m = 0; m < 4; m++)
        {
            if (4 * v + m < nblk)
                z = _mm512_mask_broadcast_i32x4(
                    z, (__mmask16)(0xfu << (4 * m)),
                    _mm_loadu_si128((const __m128i *)(gb + MX_BB * (4 * v + m) + 1)));
        }
        q[v] = z;
    }
    *ex = e;
}

INLINE void mx_weights_plain(const __m512i x[4], __m512i w[8])
{
    const __m512i ukv = _mm512_load_si512(mx_ukv), m4 = _mm512_set1_epi8(0x0f);
    UNROLL for (int k = 0; k < 4; k++)
    {
        w[k] = _mm512_shuffle_epi8(ukv, _mm512_and_si512(x[k], m4));
        w[4 + k] = _mm512_shuffle_epi8(ukv, _mm512_and_si512(_mm512_srli_epi16(x[k], 4), m4));
    }
}

/* One row's block sums over blocks [0, nbk) of the window into bf->pk[j][i] (slots up to nbk
 * rounded up to 16; sum and exponent 0 past nbk). The row's bytes past block nbk are not read. */
INLINE void mx_row_plain(const uint8_t *row, size_t nbk, int NT, struct mx_buf *bf, size_t i)
{
    for (size_t g = 0; g < nbk; g += 16) {
        const uint8_t *gb = row + g * MX_BB;
        size_t rem = nbk - g < 16 ? nbk - g : 16;
        if (rem == 16)
            mx_prefetch(gb);
        __m512i q[4], x[4], w[8], ex;
        mx_load_plain(gb, rem, q, &ex);
        mx_transpose(q, x);
        mx_weights_plain(x, w);
        mx_dots(w, ex, NT, bf, i, g);
    }
}

/* ---- the same with AVX512-VBMI ------------------------------------------------------------ */

/* The VBMI functions carry the ISA as a function attribute (gcc and clang both honour it; clang
 * ignores `#pragma GCC target`), so the rest of the file never uses VBMI instructions. */
#define MX_VBMI __attribute__((target("avx512vbmi")))

/*
 * vpermt2b indices. Quad v (bytes 68v .. 68v + 67 of the group) lies in the 64-byte loads v
 * and v + 1 (at 64v): byte 16m + c of q[v] <- byte 4v + 17m + 1 + c of the pair. The
 * exponent of block 4v + m (byte 17(4v + m)) goes to byte 4(4m + v): blocks 0..7 from loads
 * 0-1, 8..15 from loads 2-3 (byte 17b - 128).
 */
static const uint8_t mx_qix[4][64] __attribute__((aligned(64))) = {
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
     18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,
     35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
     52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67},
    {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
     22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37,
     39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54,
     56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71},
    {9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
     26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
     43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58,
     60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75},
    {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
     30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45,
     47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
     64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79},
};
static const uint8_t mx_xix[64] __attribute__((aligned(64))) = {
    0, 0, 0, 0, 68, 0, 0, 0, 8, 0, 0, 0, 76, 0, 0, 0,
    17, 0, 0, 0, 85, 0, 0, 0, 25, 0, 0, 0, 93, 0, 0, 0,
    34, 0, 0, 0, 102, 0, 0, 0, 42, 0, 0, 0, 110, 0, 0, 0,
    51, 0, 0, 0, 119, 0, 0, 0, 59, 0, 0, 0, 127, 0, 0, 0};
/* byte 4(4m + v): v < 2 from the first pair, v >= 2 from the second */
#define MX_EXMASK_LO 0x0011001100110011ull
#define MX_EXMASK_HI 0x1100110011001100ull

INLINE MX_VBMI void mx_load_vbmi(const uint8_t *gb, size_t nblk, __m512i q[4], __m512i *ex)
{
    const size_t len = nblk * MX_BB;
    __m512i l[5];
    UNROLL for (size_t p = 0; p < 5; p++)
    {
        size_t lo = 64 * p, cnt = len > lo ? len - lo : 0;
        l[p] = cnt >= 64 ? _mm512_loadu_si512((const void *)(gb + lo))
                         : _mm512_maskz_loadu_epi8((__mmask64)((1ull << cnt) - 1), gb + lo);
    }
    UNROLL for (size_t v = 0; v < 4; v++)
        q[v] = _mm512_permutex2var_epi8(l[v], _mm512_load_si512(mx_qix[v]), l[v + 1]);
    const __m512i xi = _mm512_load_si512(mx_xix);
    /* exponents past nblk: their bytes were not loaded (0), as the fold expects */
    *ex = _mm512_or_si512(_mm512_maskz_permutex2var_epi8(MX_EXMASK_LO, l[0], xi, l[1]),
                          _mm512_maskz_permutex2var_epi8(MX_EXMASK_HI, l[2], xi, l[3]));
}

INLINE MX_VBMI void mx_weights_vbmi(const __m512i x[4], __m512i w[8])
{
    const __m512i ukv = _mm512_load_si512(mx_ukv);
    UNROLL for (int k = 0; k < 4; k++)
    {
        w[k] = _mm512_permutexvar_epi8(x[k], ukv);
        w[4 + k] = _mm512_permutexvar_epi8(_mm512_srli_epi16(x[k], 4), ukv);
    }
}

INLINE MX_VBMI void mx_row_vbmi(const uint8_t *row, size_t nbk, int NT, struct mx_buf *bf, size_t i)
{
    for (size_t g = 0; g < nbk; g += 16) {
        const uint8_t *gb = row + g * MX_BB;
        size_t rem = nbk - g < 16 ? nbk - g : 16;
        if (rem == 16)
            mx_prefetch(gb);
        __m512i q[4], x[4], w[8], ex;
        mx_load_vbmi(gb, rem, q, &ex);
        mx_transpose(q, x);
        mx_weights_vbmi(x, w);
        mx_dots(w, ex, NT, bf, i, g);
    }
}

/* The rows [0, nr) of a panel (rows rb bytes apart, from the window's first block) for NT
 * tokens: one function per (ISA flavour, NT), called through mx_panel_fns. */
#define MX_PANEL_FN_(flavour, T, ATTR)                                                       \
    static ATTR void mx_panel_##flavour##_##T(const uint8_t *p, size_t rb, size_t nr,        \
                                              size_t nbk, struct mx_buf *bf)                 \
    {                                                                                        \
        for (size_t i = 0; i < nr; i++)                                                      \
            mx_row_##flavour(p + i * rb, nbk, T, bf, i);                                     \
    }
MX_PANEL_FN_(vbmi, 1, MX_VBMI)
MX_PANEL_FN_(vbmi, 2, MX_VBMI)
MX_PANEL_FN_(vbmi, 3, MX_VBMI)
MX_PANEL_FN_(vbmi, 4, MX_VBMI)
MX_PANEL_FN_(plain, 1, )
MX_PANEL_FN_(plain, 2, )
MX_PANEL_FN_(plain, 3, )
MX_PANEL_FN_(plain, 4, )
#undef MX_PANEL_FN_

typedef void mx_panel_fn(const uint8_t *p, size_t rb, size_t nr, size_t nbk, struct mx_buf *bf);
static mx_panel_fn *const mx_panel_fns[2][MX_NT] = {
    {mx_panel_plain_1, mx_panel_plain_2, mx_panel_plain_3, mx_panel_plain_4},
    {mx_panel_vbmi_1, mx_panel_vbmi_2, mx_panel_vbmi_3, mx_panel_vbmi_4}};

/* ---- the fold: gemm_tile's float steps, in its order ------------------------------------- */

/*
 * y[t+j][r..r+16) (+)= the panel's window [kb, kb + nbk) for tokens j < nt: per KC chunk
 * facc = fma(float(sum), 2^(e-128) * dx, facc) from 0 in block order, lane = row, then added
 * to y (chunks after the first), as gemm_tile does. 2^(e-128) * dx is vscalefps(dx, e - 128):
 * both it and the gemm's product of the exact power of two 2^(e-128) (quant_e8m0_half) by dx
 * are the one correctly rounded value of dx x 2^(e-128), subnormal and overflowing results
 * included (no FTZ/DAZ anywhere), so the bits are the same, in 3 instructions instead of 7:
 * e - 128 is a vpternlogd and a subtraction, as (z & 0xff) | the bits of 2^23, read as a
 * float, is 2^23 + e exactly (session 13: in place of an and and a vcvtdq2ps; 0.96-1.00x of
 * the n = 1 gemv's cycles, docs/PERFORMANCE.md "gpt-oss decode, session 13").
 * The window's chunks (up to 4) are independent sums until they are added to y in order, so
 * they are interleaved: each a chain of 32 dependent FMAs, one alone left the core waiting on
 * FMA latency. After the transpose z[4m + v] is block 4v + m; rows >= nr read row 0 and are
 * not stored.
 */
static void mx_fold(const struct mx_buf *bf, size_t nbk, const struct kern_act *a, size_t kb,
                    size_t t, size_t nt, float *y, size_t ldy, size_t r, size_t nr)
{
    enum { CPW = MX_WB / (MX_KC / 32) }; /* chunks per window */
    const __mmask16 rm = (__mmask16)((1u << nr) - 1u);
    const size_t nch = (nbk + MX_KC / 32 - 1) / (MX_KC / 32);
    for (size_t j = 0; j < nt; j++) {
        const size_t tj = t + j;
        const float *xd = a->d + tj * a->cp / 32 + kb;
        __m512 facc[CPW];
        for (size_t c = 0; c < CPW; c++)
            facc[c] = _mm512_setzero_ps();
        for (size_t g0 = 0; g0 < MX_KC / 32; g0 += 16)
            for (size_t c = 0; c < nch; c++) {
                const size_t b0 = c * (MX_KC / 32) + g0;
                if (b0 >= nbk)
                    break;
                const size_t gn = nbk - b0 < 16 ? nbk - b0 : 16;
                __m512i z[16];
                UNROLL for (size_t i = 0; i < MX_PANEL; i++) z[i] =
                    _mm512_loadu_si512(bf->pk[j][i < nr ? i : 0] + b0);
                transpose16(z);
                __m512 f = facc[c];
                UNROLL for (size_t g = 0; g < 16; g++)
                {
                    if (g >= gn)
                        break;
                    __m512i zb = z[4 * (g % 4) + g / 4];
                    /* (zb & 0xff) | bits of 2^23 is the float 2^23 + e: one vpternlogd */
                    __m512 e = _mm512_sub_ps(
                        _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
                            zb, _mm512_set1_epi32(0xff), _mm512_set1_epi32(MX_F2P23), 0xea)),
                        _mm512_set1_ps(8388608.0f + 128.0f));
                    f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(zb, 8)),
                                        _mm512_scalef_ps(_mm512_set1_ps(xd[b0 + g]), e), f);
                }
                facc[c] = f;
            }
        /* the chunks into y in column order: y = chunk 0 (+ y from the windows before) */
        float *yo = y + tj * ldy + r;
        __m512 acc = facc[0];
        if (kb > 0)
            acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(rm, yo));
        for (size_t c = 1; c < nch; c++)
            acc = _mm512_add_ps(facc[c], acc);
        _mm512_mask_storeu_ps(yo, rm, acc);
    }
}

/* ---- entries ------------------------------------------------------------------------------ */

static void mx_gemv(int vbmi, const void *w, const struct kern_act *a, float *y, size_t ldy,
                    size_t r0, size_t r1)
{
    const size_t rb = kern__row_bytes(DT_MXFP4, a->cols), nb = a->cols / 32;
    struct mx_buf bf __attribute__((aligned(64)));
    /* windows in order (each output's chunks are added in column order), the activations
     * arranged once per window and token tile for all panels */
    for (size_t kb = 0; kb < nb; kb += MX_WB) {
        size_t nbk = nb - kb < MX_WB ? nb - kb : MX_WB;
        for (size_t t = 0; t < a->n; t += MX_NT) {
            size_t nt = a->n - t < MX_NT ? a->n - t : MX_NT;
            mx_arrange(a, kb, nbk, t, nt, &bf);
            for (size_t r = r0; r < r1; r += MX_PANEL) {
                size_t nr = r1 - r < MX_PANEL ? r1 - r : MX_PANEL;
                mx_panel_fns[vbmi][nt - 1]((const uint8_t *)w + r * rb + kb * MX_BB, rb, nr,
                                           nbk, &bf);
                mx_fold(&bf, nbk, a, kb, t, nt, y, ldy, r, nr);
            }
        }
    }
}

/* ---- on mxfp4 panels (quant.h "mxfp4 panels") -------------------------------------------- */

/*
 * The panel layout puts row i's qs dword g of block b in dword lane i of the vector at
 * qoff(b) + 64g, so the vpdpbusd lanes are rows from the start: per block, 8 vpdpbusd with the
 * token's activation dwords broadcast give the 16 rows' block sums (the same exact integers as
 * above, from ns32) in the fold's lane order, and the fold is one fma per block and token with
 * the rows' E8M0 bytes zero-extended from one 16-byte load: no transposes, no packing, no
 * scratch. Same float steps as the gemm (facc = fma(float(sum), 2^(e-128) * dx, facc) from 0
 * in block order per KC chunk, the chunks added in order), so the same bits for every n.
 * Measured against the stored-row gemv: docs/PERFORMANCE.md "gpt-oss decode, session 16".
 */
#define MXP_PB QUANT_MXP_BLOCK_BYTES /* bytes per (panel, block) */

/* The 8 unsigned weight vectors of block bw (quant.h: doubled E2M1 + 128): w[g] from the low
 * nibbles of quant vector g (elements 4g..4g+3 of each row), w[4 + g] from the high ones. */
INLINE MX_VBMI void mxp_weights_vbmi(const uint8_t *bw, __m512i tab, __m512i w[8])
{
    UNROLL for (int g = 0; g < 4; g++)
    {
        __m512i l = _mm512_loadu_si512((const void *)(bw + QUANT_MXP_ROWS + 64 * g));
        w[g] = _mm512_permutexvar_epi8(l, tab);
        w[4 + g] = _mm512_permutexvar_epi8(_mm512_srli_epi16(l, 4), tab);
    }
}

INLINE void mxp_weights_plain(const uint8_t *bw, __m512i tab, __m512i w[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    UNROLL for (int g = 0; g < 4; g++)
    {
        __m512i l = _mm512_loadu_si512((const void *)(bw + QUANT_MXP_ROWS + 64 * g));
        w[g] = _mm512_shuffle_epi8(tab, _mm512_and_si512(l, m4));
        w[4 + g] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(l, 4), m4));
    }
}

/* Activation dword p broadcast to every lane: one 4-byte load each, so the compiler makes it a
 * load-port vpbroadcastd (or an embedded {1to16} operand). Copying a block's 32 quant bytes into
 * an int32_t[8] first made GCC 12 load them as 4 quadwords into general registers and split
 * them with shifts, then broadcast from a general register: a port-5 uop each, the port the
 * 8 vpermb of the weight lookup need too. */
INLINE __m512i mxp_bcast(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/*
 * Panel pp (nb blocks) for tokens t..t+NT-1 of a: y[t+j][r..r+nr) = the sum over KC chunks in
 * order of the chunks' fma chains. Two vpdpbusd chains per token and block (low and high
 * nibbles) keep the dependent run at 4; blocks are independent until their fma.
 */
#define MXP_PANEL_FN_(flavour, T, ATTR)                                                      \
    static ATTR void mxp_panel_##flavour##_##T(const uint8_t *pp, size_t nb,                 \
                                               const struct kern_act *a, size_t t, float *y, \
                                               size_t ldy, size_t r, __mmask16 rm)           \
    {                                                                                        \
        const __m512i tab = _mm512_load_si512(mx_ukv);                                       \
        const int8_t *q[T];                                                                  \
        const int32_t *ns[T];                                                                \
        const float *d[T];                                                                   \
        __m512 acc[T];                                                                       \
        for (int j = 0; j < (T); j++) {                                                      \
            q[j] = a->q + (t + (size_t)j) * a->ld;                                           \
            ns[j] = a->ns32 + (t + (size_t)j) * a->cp / 32;                                  \
            d[j] = a->d + (t + (size_t)j) * a->cp / 32;                                      \
            acc[j] = _mm512_setzero_ps();                                                    \
        }                                                                                    \
        for (size_t c0 = 0; c0 < nb; c0 += MX_KC / 32) {                                     \
            const size_t c1 = nb - c0 < MX_KC / 32 ? nb : c0 + MX_KC / 32;                   \
            __m512 f[T];                                                                     \
            for (int j = 0; j < (T); j++)                                                    \
                f[j] = _mm512_setzero_ps();                                                  \
            for (size_t b = c0; b < c1; b++) {                                               \
                const uint8_t *bw = pp + b * MXP_PB;                                         \
                UNROLL for (size_t l = 0; l < MXP_PB; l += 64) _mm_prefetch(                 \
                    (const char *)bw + MX_PF + l, _MM_HINT_T0);                              \
                __m512i w[8];                                                                \
                mxp_weights_##flavour(bw, tab, w);                                           \
                /* 2^23 + e as a float, minus 2^23 + 128: e - 128 exactly */                 \
                const __m512 em = _mm512_sub_ps(                                             \
                    _mm512_castsi512_ps(_mm512_or_si512(                                     \
                        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bw)),          \
                        _mm512_set1_epi32(MX_F2P23))),                                       \
                    _mm512_set1_ps(8388608.0f + 128.0f));                                    \
                UNROLL for (int j = 0; j < (T); j++)                                         \
                {                                                                            \
                    const int8_t *qb = q[j] + b * 32;                                        \
                    __m512i s0 = _mm512_set1_epi32(ns[j][b]), s1 = _mm512_setzero_si512();   \
                    UNROLL for (int g = 0; g < 4; g++)                                       \
                    {                                                                        \
                        s0 = _mm512_dpbusd_epi32(s0, w[g], mxp_bcast(qb + 4 * g));           \
                        s1 = _mm512_dpbusd_epi32(s1, w[4 + g], mxp_bcast(qb + 16 + 4 * g));  \
                    }                                                                        \
                    f[j] = _mm512_fmadd_ps(                                                  \
                        _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),                        \
                        _mm512_scalef_ps(_mm512_set1_ps(d[j][b]), em), f[j]);                \
                }                                                                            \
            }                                                                                \
            for (int j = 0; j < (T); j++)                                                    \
                acc[j] = c0 == 0 ? f[j] : _mm512_add_ps(f[j], acc[j]);                       \
        }                                                                                    \
        for (int j = 0; j < (T); j++)                                                        \
            _mm512_mask_storeu_ps(y + (t + (size_t)j) * ldy + r, rm, acc[j]);                \
    }
MXP_PANEL_FN_(vbmi, 1, MX_VBMI)
MXP_PANEL_FN_(vbmi, 2, MX_VBMI)
MXP_PANEL_FN_(vbmi, 3, MX_VBMI)
MXP_PANEL_FN_(vbmi, 4, MX_VBMI)
MXP_PANEL_FN_(plain, 1, )
MXP_PANEL_FN_(plain, 2, )
MXP_PANEL_FN_(plain, 3, )
MXP_PANEL_FN_(plain, 4, )
#undef MXP_PANEL_FN_

/*
 * S panels at once (S = 2 or 4) for tokens t..t+T-1 (T <= MX_NT; kern.h kern_set_panel_streams):
 * panels pp[0..S), a fraction of the thread's row range apart, block by block, so the thread
 * keeps S sequential DRAM streams in flight instead of one (one stream per thread left the
 * n = 1 products at ~half the probe: docs/PERFORMANCE.md "gpt-oss decode, session 17"; the
 * probe's 2-thread best is 2-8 streams per thread; at 8 decode streams most experts get 1-2
 * tokens: "gpt-oss 8-stream decode, session 18"). Panel k's rows start at r[k], masked by
 * rm[k]. Each panel's steps for each token are mxp_panel_*_T's, in its order: the same bits.
 */
#define MXP_PANELS_FN_(flavour, S, T, ATTR)                                                  \
    static ATTR void mxp_panel##S##_##flavour##_##T(                                         \
        const uint8_t *const *pp, size_t nb, const struct kern_act *a, size_t t, float *y,   \
        size_t ldy, const size_t *r, const __mmask16 *rm)                                    \
    {                                                                                        \
        const __m512i tab = _mm512_load_si512(mx_ukv);                                       \
        const int8_t *q[T];                                                                  \
        const int32_t *ns[T];                                                                \
        const float *d[T];                                                                   \
        __m512 acc[S][T];                                                                    \
        for (int j = 0; j < (T); j++) {                                                      \
            q[j] = a->q + (t + (size_t)j) * a->ld;                                           \
            ns[j] = a->ns32 + (t + (size_t)j) * a->cp / 32;                                  \
            d[j] = a->d + (t + (size_t)j) * a->cp / 32;                                      \
            for (int k = 0; k < (S); k++)                                                    \
                acc[k][j] = _mm512_setzero_ps();                                             \
        }                                                                                    \
        for (size_t c0 = 0; c0 < nb; c0 += MX_KC / 32) {                                     \
            const size_t c1 = nb - c0 < MX_KC / 32 ? nb : c0 + MX_KC / 32;                   \
            __m512 f[S][T];                                                                  \
            for (int k = 0; k < (S); k++)                                                    \
                for (int j = 0; j < (T); j++)                                                \
                    f[k][j] = _mm512_setzero_ps();                                           \
            for (size_t b = c0; b < c1; b++) {                                               \
                UNROLL for (int k = 0; k < (S); k++)                                         \
                {                                                                            \
                    const uint8_t *bw = pp[k] + b * MXP_PB;                                  \
                    UNROLL for (size_t l = 0; l < MXP_PB; l += 64) _mm_prefetch(             \
                        (const char *)bw + MX_PF + l, _MM_HINT_T0);                          \
                    __m512i w[8];                                                            \
                    mxp_weights_##flavour(bw, tab, w);                                       \
                    const __m512 em = _mm512_sub_ps(                                         \
                        _mm512_castsi512_ps(_mm512_or_si512(                                 \
                            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bw)),      \
                            _mm512_set1_epi32(MX_F2P23))),                                   \
                        _mm512_set1_ps(8388608.0f + 128.0f));                                \
                    UNROLL for (int j = 0; j < (T); j++)                                     \
                    {                                                                        \
                        const int8_t *qb = q[j] + b * 32;                                    \
                        __m512i s0 = _mm512_set1_epi32(ns[j][b]), s1 = _mm512_setzero_si512(); \
                        UNROLL for (int g = 0; g < 4; g++)                                   \
                        {                                                                    \
                            s0 = _mm512_dpbusd_epi32(s0, w[g], mxp_bcast(qb + 4 * g));       \
                            s1 = _mm512_dpbusd_epi32(s1, w[4 + g], mxp_bcast(qb + 16 + 4 * g)); \
                        }                                                                    \
                        f[k][j] = _mm512_fmadd_ps(                                           \
                            _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),                    \
                            _mm512_scalef_ps(_mm512_set1_ps(d[j][b]), em), f[k][j]);         \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
            for (int k = 0; k < (S); k++)                                                    \
                for (int j = 0; j < (T); j++)                                                \
                    acc[k][j] = c0 == 0 ? f[k][j] : _mm512_add_ps(f[k][j], acc[k][j]);       \
        }                                                                                    \
        for (int j = 0; j < (T); j++)                                                        \
            for (int k = 0; k < (S); k++)                                                    \
                _mm512_mask_storeu_ps(y + (t + (size_t)j) * ldy + r[k], rm[k], acc[k][j]);   \
    }
MXP_PANELS_FN_(vbmi, 2, 1, MX_VBMI)
MXP_PANELS_FN_(vbmi, 2, 2, MX_VBMI)
MXP_PANELS_FN_(vbmi, 2, 3, MX_VBMI)
MXP_PANELS_FN_(vbmi, 2, 4, MX_VBMI)
MXP_PANELS_FN_(plain, 2, 1, )
MXP_PANELS_FN_(plain, 2, 2, )
MXP_PANELS_FN_(plain, 2, 3, )
MXP_PANELS_FN_(plain, 2, 4, )
/* four streams up to MX_NT4 tokens: acc and f of 4 x T zmm each beside the 8 unpacked weights */
#define MX_NT4 2
MXP_PANELS_FN_(vbmi, 4, 1, MX_VBMI)
MXP_PANELS_FN_(vbmi, 4, 2, MX_VBMI)
MXP_PANELS_FN_(plain, 4, 1, )
MXP_PANELS_FN_(plain, 4, 2, )
#undef MXP_PANELS_FN_

typedef void mxp_panel_fn(const uint8_t *pp, size_t nb, const struct kern_act *a, size_t t,
                          float *y, size_t ldy, size_t r, __mmask16 rm);
static mxp_panel_fn *const mxp_panel_fns[2][MX_NT] = {
    {mxp_panel_plain_1, mxp_panel_plain_2, mxp_panel_plain_3, mxp_panel_plain_4},
    {mxp_panel_vbmi_1, mxp_panel_vbmi_2, mxp_panel_vbmi_3, mxp_panel_vbmi_4}};
typedef void mxp_panels_fn(const uint8_t *const *pp, size_t nb, const struct kern_act *a,
                           size_t t, float *y, size_t ldy, const size_t *r, const __mmask16 *rm);
static mxp_panels_fn *const mxp_panel2_fns[2][MX_NT] = {
    {mxp_panel2_plain_1, mxp_panel2_plain_2, mxp_panel2_plain_3, mxp_panel2_plain_4},
    {mxp_panel2_vbmi_1, mxp_panel2_vbmi_2, mxp_panel2_vbmi_3, mxp_panel2_vbmi_4}};
static mxp_panels_fn *const mxp_panel4_fns[2][MX_NT4] = {
    {mxp_panel4_plain_1, mxp_panel4_plain_2}, {mxp_panel4_vbmi_1, mxp_panel4_vbmi_2}};

/* Rows [r0, r1) (r0 on a panel) of the panels wp, every token: per panel, tokens by 4 (the
 * panel's 16 x cols weights, 24 KB at gpt-oss's 2880 columns, stay in L1/L2 between tiles).
 * With two streams (the default) and at most MX_NT tokens, two panels at a time. */
static void mxp_gemm(int vbmi, const void *wp, const struct kern_act *a, float *y, size_t ldy,
                     size_t r0, size_t r1)
{
    CHECK(r0 % QUANT_MXP_ROWS == 0);
    const size_t nb = a->cols / 32, pbytes = QUANT_MXP_ROWS * kern__row_bytes(DT_MXFP4, a->cols);
    const size_t np = (r1 - r0 + QUANT_MXP_ROWS - 1) / QUANT_MXP_ROWS;
    /* 4: four streams up to MX_NT4 tokens, two above */
    const int streams = kern__panel_streams != 4 ? kern__panel_streams : a->n <= MX_NT4 ? 4 : 2;
    if (a->n <= MX_NT && streams >= 2 && np > 1) {
        /* the range's panels [0, np) in `streams` lanes h apart: panel i with h + i, 2h + i,
         * ... (those < np); a group of 4 or 2 takes the S-stream tile, what is left of it (3:
         * 2 + 1, or 1) the two-stream and the one-panel tiles. Only the range's last panel
         * can be partial. */
        const size_t S = (size_t)streams, h = (np + S - 1) / S;
        for (size_t i = 0; i < h; i++) {
            const uint8_t *pp[4];
            size_t r[4];
            __mmask16 rm[4];
            size_t k = 0;
            for (; k < S && k * h + i < np; k++) {
                r[k] = r0 + (k * h + i) * QUANT_MXP_ROWS;
                pp[k] = (const uint8_t *)wp + r[k] / QUANT_MXP_ROWS * pbytes;
                const size_t nr = r1 - r[k] < QUANT_MXP_ROWS ? r1 - r[k] : QUANT_MXP_ROWS;
                rm[k] = (__mmask16)((1u << nr) - 1u);
            }
            size_t k0 = 0;
            if (k == 4) {
                mxp_panel4_fns[vbmi][a->n - 1](pp, nb, a, 0, y, ldy, r, rm);
                k0 = 4;
            }
            if (k - k0 >= 2) {
                mxp_panel2_fns[vbmi][a->n - 1](pp + k0, nb, a, 0, y, ldy, r + k0, rm + k0);
                k0 += 2;
            }
            if (k0 < k)
                mxp_panel_fns[vbmi][a->n - 1](pp[k0], nb, a, 0, y, ldy, r[k0], rm[k0]);
        }
        return;
    }
    for (size_t r = r0; r < r1; r += QUANT_MXP_ROWS) {
        const size_t nr = r1 - r < QUANT_MXP_ROWS ? r1 - r : QUANT_MXP_ROWS;
        const __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        const uint8_t *pp = (const uint8_t *)wp + r / QUANT_MXP_ROWS * pbytes;
        for (size_t t = 0; t < a->n; t += MX_NT) {
            size_t nt = a->n - t < MX_NT ? a->n - t : MX_NT;
            mxp_panel_fns[vbmi][nt - 1](pp, nb, a, t, y, ldy, r, rm);
        }
    }
}

/*
 * The load-time repack (kern_panels_pack; the same bytes as panels.c's scalar pack_ref, tested):
 * per block, the 16 rows' 16 quant bytes as 4 vectors (vector v, 128-bit lane m = row 4m + v),
 * one 4x4 dword transpose, so vector g holds dword g of rows 0..15 in order; the E8M0 bytes one
 * by one. gpt-oss-20b's experts are ~10 GB of it at every start.
 */
void kern__mxp_pack_avx512(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                           size_t p1)
{
    const size_t nb = cols / 32, rb = kern__row_bytes(DT_MXFP4, cols);
    for (size_t p = p0; p < p1; p++) {
        const size_t r = p * QUANT_MXP_ROWS, nr = rows - r < QUANT_MXP_ROWS ? rows - r : QUANT_MXP_ROWS;
        const uint8_t *src = (const uint8_t *)w + r * rb;
        uint8_t *pp = (uint8_t *)dst + r * rb;
        for (size_t b = 0; b < nb; b++) {
            __m512i q[4], x[4];
            uint8_t *o = pp + quant_mxp_soff(b, nb);
            for (size_t v = 0; v < 4; v++) {
                __m512i z = _mm512_setzero_si512();
                for (size_t m = 0; m < 4; m++) {
                    const size_t i = 4 * m + v;
                    if (i < nr)
                        z = _mm512_mask_broadcast_i32x4(
                            z, (__mmask16)(0xfu << (4 * m)),
                            _mm_loadu_si128((const __m128i *)(const void *)(src + i * rb +
                                                                             b * MX_BB + 1)));
                }
                q[v] = z;
            }
            mx_transpose(q, x);
            for (size_t i = 0; i < QUANT_MXP_ROWS; i++)
                o[i] = i < nr ? src[i * rb + b * MX_BB] : 0;
            for (size_t g = 0; g < 4; g++)
                _mm512_storeu_si512((void *)(pp + quant_mxp_qoff(b, nb) + 64 * g), x[g]);
        }
    }
}

/* CPUID.(7,0):ECX bit 1, read once (CPUID traps to the hypervisor in a VM) */
static int mx_has_vbmi(void)
{
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) ? (int)((c >> 1) & 1) : 0;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

void kern_gemv_mxfp4_q8_0_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                 size_t r0, size_t r1)
{
    mx_gemv(mx_has_vbmi(), w, a, y, ldy, r0, r1);
}

void kern_gemv_mxfp4_q8_0_avx512_plain(const void *w, const struct kern_act *a, float *y,
                                       size_t ldy, size_t r0, size_t r1)
{
    mx_gemv(0, w, a, y, ldy, r0, r1);
}

void kern_gemm_mxfp4p_q8_0_avx512(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                                  size_t r0, size_t r1)
{
    mxp_gemm(mx_has_vbmi(), wp, a, y, ldy, r0, r1);
}

void kern_gemm_mxfp4p_q8_0_avx512_plain(const void *wp, const struct kern_act *a, float *y,
                                        size_t ldy, size_t r0, size_t r1)
{
    mxp_gemm(0, wp, a, y, ldy, r0, r1);
}
