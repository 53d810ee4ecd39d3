/*
 * amx_qbf16.c — design (b) of the q4_0 / q8_0 prefill on AMX (session 17, task amxq): the
 * panels' weights dequantized to bf16 once per call and row chunk, then multiplied with
 * tdpbf16ps against the activations rounded to bf16, C accumulated in tiles over all columns
 * (no per-block epilogue, unlike the AMX-INT8 kernels of amx_q.c). Compiled with the AVX-512
 * and AMX flags (kernels/CMakeLists.txt).
 *
 * A NUMERICS CHANGE against the int8 panel GEMMs, so only dispatched on activations prepared
 * with KERN_ACT_BF16_TILES (kern.h: from 128 tokens, never under the batch-invariant switch;
 * amx_q.c's entries pass them here; ADR 0004 session 18 addendum, docs/PERFORMANCE.md
 * "session 17, s17-amxq" and "session 18, s18-amxb"): y[t][r] = sum_k bf16(x[t][k]) * bf16(q[r][k] *
 * d[r][k/32]), exact products, f32 sums in tdpbf16ps' order. The weights lose up to 2^-9
 * relative (q * d needs 4 + 11 / 8 + 11 bits; bf16 keeps 8), the activations are bf16 instead
 * of int8 per block of 32 (which is coarser: relative ~2^-8 of the block max). The ref twins
 * (ref_qbf16.c) compute the same rounded operands with scalar f32 sums.
 *
 * Layout, C[token][row] = X . W^T:
 *   A tiles: 16 tokens x 32 bf16 of the activations, a->xt (kern.h: made once per product by
 *     kern_act_prepare over the pool, kern__act_tiles_amx below) or, without it, a per-call
 *     copy rounded the same way (half_f32_to_bf16), tokens padded with zeros to a multiple of
 *     16, stored tile-contiguous: token tile i's block b is the 1 KiB at ((i * nb + b) * 16) *
 *     32 elements (loads of stride 64: measured faster than the row layout, docs/PERFORMANCE.md).
 *   B tiles: 16 column pairs x 16 rows x 2 bf16 (tdpbf16ps' pair layout: dword i of pair row p
 *     = row i's columns 2p, 2p+1). The panels already hold lane = row (quant.h "q4_0 panels",
 *     "q8_0 panels"), so one 64-byte vector of a block gives 4 (q8_0) or 8 (q4_0) columns of
 *     the 16 rows: each byte is widened to f32 by shifts (q8_0), each nibble looked up as
 *     q - 8 in a 16-entry f32 table by vpermps (q4_0: 3 instructions per column instead of
 *     4 + the nibble split, ~1.07x at 128 tokens, s19), scaled by its row's d (lane = row),
 *     and two columns at a time
 *     are rounded and interleaved into a pair row (vcvtne2ps2bf16 + vpermw). The products
 *     q * d are never denormal (|q| >= 1, d an f16), so the instruction's denormal flush
 *     never applies and its rounding equals half_f32_to_bf16's.
 *   C tiles: 16 tokens x 16 rows f32, 2 x 2 in flight (32 tokens x 32 rows: 2 A + 2 B loads
 *     per 4 tdpbf16ps), loaded from and stored to a C buffer [npad][RC + 16] f32 per K chunk;
 *     on the last K chunk the tiles wholly inside y (whole token tiles, whole panels) are
 *     stored there, and only the ragged rest goes through the buffer (no masks in the loop).
 * Blocking: the thread's rows in chunks of RC rows; per chunk, K in chunks of KC columns: the
 * chunk's panels are dequantized (RC x KC bf16 = 256 KiB, L2), then each token pair's A tiles
 * (2 x KC/32 KiB, L1) run over every panel pair, whose B tiles stream from L2 in address order.
 * Session 19 (s19-amxb2, docs/PERFORMANCE.md) measured this order against session 18's
 * (panel pair outer, token pairs streaming A from L2, KC 512, RC 256; same bits): ~1.15-1.2x
 * on one thread when the AMX unit is not the limit (tile loads from L2 stall the tile loop:
 * the loop with A pinned in L1 ran ~1.2x faster, software prefetch of A did not help).
 */
#include "internal.h"

#include "check.h"
#include "half.h"
#include "quant.h"

#include "amx_common.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#define TT 16               /* tokens per tile */
#define PANEL 16            /* rows per panel / per B tile column */
#ifndef KC
#define KC 256 /* columns per K chunk: a token pair's A tiles (2 x KC/32 KiB) stay in L1 */
#endif
#ifndef RC
#define RC 512 /* rows per row chunk (multiple of 32): its bf16 panels (RC x KC) stay in L2 */
#endif

/* Tiles 0-3: C, 4-5: A, 6-7: B; every tile 16 rows x 64 bytes. */
static void tiles_config(void) { amx_cfg_load_full(); }

enum qtype { Q4, Q8 };

/* Two columns (f32, lane = row) -> one pair row: dword i = bf16(c0[i]) | bf16(c1[i]) << 16. */
INLINE __m512i pair_row(__m512 c0, __m512 c1)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(c1, c0));
}

/* byte j of every dword of v as a signed int32 (v already holds signed values) */
INLINE __m512 byte_f32(__m512i v, int j)
{
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j), 24));
}

/*
 * One panel's blocks [b0, b0 + nblk) dequantized to bf16 pair rows: dst [nblk][16 pairs][16
 * rows] dwords, block b's B tile at dst + (b - b0) * 256.
 */
static void dequant_panel(enum qtype qt, const uint8_t *pp, size_t nb, size_t b0, size_t nblk,
                          uint32_t *dst)
{
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const __m512 tbl = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t b = b0; b < b0 + nblk; b++) {
        uint32_t *o = dst + (b - b0) * 256;
        if (qt == Q4) {
            const uint8_t *qb = pp + quant_q4p_qoff(b, nb);
            __m512 d = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(pp + quant_q4p_soff(b, nb))));
            UNROLL for (int g = 0; g < 4; g++)
            {
                __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * g));
                /* nibble k of every dword (k even: byte k/2's low, odd: its high) picks
                 * (nibble - 8) from the table by vpermps (which reads an index's low 4 bits):
                 * low nibbles are columns 4g..4g+3, high ones 16 + 4g.. */
#define NIB_(k) _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * (k)), tbl), d)
                __m512 l0 = NIB_(0), l1 = NIB_(2), l2 = NIB_(4), l3 = NIB_(6);
                __m512 h0 = NIB_(1), h1 = NIB_(3), h2 = NIB_(5), h3 = NIB_(7);
#undef NIB_
                _mm512_store_si512((void *)(o + (2 * g) * 16), pair_row(l0, l1));
                _mm512_store_si512((void *)(o + (2 * g + 1) * 16), pair_row(l2, l3));
                _mm512_store_si512((void *)(o + (8 + 2 * g) * 16), pair_row(h0, h1));
                _mm512_store_si512((void *)(o + (8 + 2 * g + 1) * 16), pair_row(h2, h3));
            }
        } else {
            const uint8_t *qb = pp + quant_q8p_qoff(b, nb);
            __m512 d = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(pp + quant_q8p_soff(b, nb))));
            UNROLL for (int g = 0; g < 8; g++)
            {
                /* stored as q + 128: back to signed bytes */
                __m512i v = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qb + 64 * g)), x80);
                __m512 c0 = _mm512_mul_ps(byte_f32(v, 0), d), c1 = _mm512_mul_ps(byte_f32(v, 1), d);
                __m512 c2 = _mm512_mul_ps(byte_f32(v, 2), d), c3 = _mm512_mul_ps(byte_f32(v, 3), d);
                _mm512_store_si512((void *)(o + (2 * g) * 16), pair_row(c0, c1));
                _mm512_store_si512((void *)(o + (2 * g + 1) * 16), pair_row(c2, c3));
            }
        }
    }
}

/* 16 f32 -> 16 bf16 rounded like half_f32_to_bf16 (round to nearest even, NaN quieted, no
 * denormal flush: vcvtneps2bf16 would flush, so the rounding is done on the integers). */
INLINE __m256i round16(const float *x)
{
    const __m512i one = _mm512_set1_epi32(1), r7 = _mm512_set1_epi32(0x7fff),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  q = _mm512_set1_epi32(0x40);
    __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    __m512i r =
        _mm512_add_epi32(u, _mm512_add_epi32(r7, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_mask_or_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_srli_epi32(u, 16), q);
    return _mm512_cvtepi32_epi16(r);
}

/*
 * kern_act_prepare's xt (kern.h) for tokens [t0, t1): token t's columns 32b..32b+31 at
 * xt + ((t / 16 * nb + b) * 16 + t % 16) * 32; the call that ends at n also zeroes the
 * padding tokens n..npad, so ranges prepared by different threads cover the whole array.
 */
void kern__act_tiles_amx(const struct kern_act *a, size_t t0, size_t t1)
{
    const size_t cols = a->cols, nb = cols / 32, npad = kern__round_up(a->n, TT);
    for (size_t t = t0; t < t1; t++) {
        const float *x = a->x + t * cols; /* [cols] */
        uint16_t *o = a->xt + (t / TT * nb * TT + t % TT) * 32;
        for (size_t b = 0; b < nb; b++, o += TT * 32) {
            _mm256_storeu_si256((__m256i *)(void *)o, round16(x + 32 * b));
            _mm256_storeu_si256((__m256i *)(void *)(o + 16), round16(x + 32 * b + 16));
        }
    }
    if (t1 == a->n)
        for (size_t t = a->n; t < npad; t++) {
            uint16_t *o = a->xt + (t / TT * nb * TT + t % TT) * 32;
            for (size_t b = 0; b < nb; b++, o += TT * 32)
                memset(o, 0, 64);
        }
}

/*
 * NT (1, 2) token tiles x MR (1, 2) panels over ks K steps, C accumulated in the buffer c
 * (stride ldc bytes; tile (i, j) at c + i * 16 rows + j * 16 floats), zeroed first when
 * first. xa: the first token tile's A tile at the chunk's first block (its K steps 1 KiB
 * apart, the second token tile lda bytes further); w0: the first panel's pair rows of the
 * chunk (the second at w0 + wstride bytes).
 * Tiles: C[token tile i][panel j] = tile 2i + j.
 */
INLINE void block(int NT, int MR, const uint8_t *xa, size_t lda, const uint8_t *w0,
                  size_t wstride, size_t ks, float *c, size_t ldc, int first, float *out,
                  size_t ldo)
{
    uint8_t *c8 = (uint8_t *)c;
    if (first) {
        _tile_zero(0);
        if (MR == 2)
            _tile_zero(1);
        if (NT == 2) {
            _tile_zero(2);
            if (MR == 2)
                _tile_zero(3);
        }
    } else {
        _tile_loadd(0, c8, (long)ldc);
        if (MR == 2)
            _tile_loadd(1, c8 + 64, (long)ldc);
        if (NT == 2) {
            _tile_loadd(2, c8 + TT * ldc, (long)ldc);
            if (MR == 2)
                _tile_loadd(3, c8 + TT * ldc + 64, (long)ldc);
        }
    }
    const uint8_t *xa1 = xa + lda, *w1 = w0 + wstride;
    for (size_t s = 0; s < ks; s++) {
        _tile_loadd(4, xa + s * 1024, 64);
        _tile_loadd(6, w0 + s * 1024, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (MR == 2) {
            _tile_loadd(7, w1 + s * 1024, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (NT == 2) {
            _tile_loadd(5, xa1 + s * 1024, 64);
            _tile_dpbf16ps(2, 5, 6);
            if (MR == 2)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    if (out) { /* the last K chunk of tiles wholly inside y: straight there */
        c8 = (uint8_t *)out;
        ldc = ldo;
    }
    _tile_stored(0, c8, (long)ldc);
    if (MR == 2)
        _tile_stored(1, c8 + 64, (long)ldc);
    if (NT == 2) {
        _tile_stored(2, c8 + TT * ldc, (long)ldc);
        if (MR == 2)
            _tile_stored(3, c8 + TT * ldc + 64, (long)ldc);
    }
}

static void gemm_qbf16_amx(enum qtype qt, const void *wp, const struct kern_act *a, float *y,
                           size_t ldy, size_t r0, size_t r1)
{
    const enum dtype dt = qt == Q4 ? DT_Q4_0 : DT_Q8_0;
    const size_t cols = a->cols, nb = cols / 32, n = a->n, npad = kern__round_up(n, TT);
    const size_t pstride = PANEL * kern__row_bytes(dt, cols);
    const size_t kcb = KC / 32 < nb ? KC / 32 : nb; /* blocks per K chunk */
    const size_t wpanel = kcb * 1024;                /* bytes of one dequantized panel chunk */
    const size_t ldc_el = RC + 16;                   /* C buffer stride (floats): not 2^k */
    /* the A tiles: the prepared xt, else rounded here (tests, bench/amxq_bench: per call) */
    const size_t abytes = a->xt ? 0 : npad * cols * 2, wbytes = RC / PANEL * wpanel,
                 cbytes = npad * ldc_el * 4;
    uint8_t *scratch = kern__scratch_slot(1, abytes + wbytes + cbytes);
    if (!scratch) { /* out of memory: the twin needs none (and reads x: xt acts have no q) */
        if (qt == Q4)
            kern_gemm_q4_0p_bf16_ref(wp, a, y, ldy, r0, r1);
        else
            kern_gemm_q8_0p_bf16_ref(wp, a, y, ldy, r0, r1);
        return;
    }
    const uint16_t *xa = a->xt;
    if (!xa) {
        struct kern_act own = *a;
        own.xt = (uint16_t *)(void *)scratch;
        kern__act_tiles_amx(&own, 0, n);
        xa = own.xt;
    }
    uint8_t *wb = scratch + abytes;
    float *cb = (float *)(void *)(wb + wbytes);
    tiles_config();
    const size_t ldc = ldc_el * 4, ldo = ldy * sizeof(float);
    for (size_t rc = r0; rc < r1; rc += RC) {
        const size_t nr = r1 - rc < RC ? r1 - rc : RC, np = (nr + PANEL - 1) / PANEL;
        const uint8_t *pp = (const uint8_t *)wp + rc / PANEL * pstride;
        for (size_t b0 = 0; b0 < nb; b0 += kcb) {
            const size_t ks = nb - b0 < kcb ? nb - b0 : kcb;
            for (size_t p = 0; p < np; p++)
                dequant_panel(qt, pp + p * pstride, nb, b0, ks,
                              (uint32_t *)(void *)(wb + p * wpanel));
            /* token tile i's step s at xk + (i * nb + s) * 1024 bytes */
            const uint8_t *xk = (const uint8_t *)(xa + b0 * 512);
            const size_t lda = nb * 1024; /* bytes between token tiles */
            const int first = b0 == 0, last = b0 + ks == nb;
            /* a token pair's A tiles (2 x KC/32 KiB) stay in L1 over all the chunk's panels,
             * which stream from L2 in address order (the panels' bf16 tiles are contiguous) */
            for (size_t t = 0; t < npad; t += 2 * TT) {
                const int nt = t + 2 * TT <= npad ? 2 : 1;
                const uint8_t *xt = xk + t / TT * lda;
                for (size_t p = 0; p < np; p += 2) {
                    const int mr = p + 2 <= np ? 2 : 1;
                    /* the last chunk stores tiles wholly inside y (rows and tokens) there */
                    float *out = last && (p + (size_t)mr) * PANEL <= nr &&
                                         t + (size_t)nt * TT <= n
                                     ? y + t * ldy + rc + p * PANEL
                                     : NULL;
                    const uint8_t *w = wb + p * wpanel;
                    float *c = cb + t * ldc_el + p * PANEL;
                    if (nt == 2 && mr == 2)
                        block(2, 2, xt, lda, w, wpanel, ks, c, ldc, first, out, ldo);
                    else if (nt == 2)
                        block(2, 1, xt, lda, w, wpanel, ks, c, ldc, first, out, ldo);
                    else if (mr == 2)
                        block(1, 2, xt, lda, w, wpanel, ks, c, ldc, first, out, ldo);
                    else
                        block(1, 1, xt, lda, w, wpanel, ks, c, ldc, first, out, ldo);
                }
            }
        }
        /* what the last chunk left in the buffer out to y: the rows of the panels past the
         * last whole one (or pair) for the tokens stored directly, every row for the rest
         * (the ragged token tile: the same conditions as above, so exactly the complement) */
        const size_t rd = nr / PANEL / 2 * 2 * PANEL + (np % 2 && nr % PANEL == 0 ? PANEL : 0);
        const size_t td = n / (2 * TT) * 2 * TT + (npad / TT % 2 && n % TT == 0 ? TT : 0);
        for (size_t t = 0; t < n; t++) {
            const size_t c0 = t < td ? rd : 0;
            if (c0 < nr)
                memcpy(y + t * ldy + rc + c0, cb + t * ldc_el + c0, (nr - c0) * sizeof(float));
        }
    }
    _tile_release();
}

void kern_gemm_q4_0p_bf16_amx(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q4_0 && a->x);
    gemm_qbf16_amx(Q4, wp, a, y, ldy, r0, r1);
}

void kern_gemm_q8_0p_bf16_amx(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q8_0 && a->x);
    gemm_qbf16_amx(Q8, wp, a, y, ldy, r0, r1);
}
