/*
 * amx_bf16.c — the bf16 x bf16 prefill GEMM on AMX tiles (tdpbf16ps), compiled with the
 * AVX-512 and AMX flags (kernels/CMakeLists.txt); dispatch.c routes DT_BF16's gemm here when
 * the CPU and the OS allow AMX (kern_has_amx_bf16) and CLOCHER_AMX is not 0.
 *
 * Same arithmetic as kern_gemm_bf16_bf16_avx512 (ADR 0004, session 17 addendum): activations
 * rounded to bf16 (kern_act.xb), exact bf16 products, f32 sums; only the order of the sums
 * differs (kern.h). Why tiles: one tdpbf16ps is 16 x 16 x 32 multiply-adds (8192) in about the time
 * of a few vdpbf16ps (32 each), so with no per-block scales in bf16 a full tile is all work.
 *
 * Layout, C = W . X^T:
 *   A tiles: 16 weight rows x 32 columns, loaded straight from the stored rows (64 bytes each,
 *     stride = the row's bytes): no weight repack.
 *   B tiles: 16 pairs of columns x 16 tokens x 2 bf16 (the VNNI pair layout tdpbf16ps reads:
 *     row k holds token t's columns 2k, 2k+1 at dword t). The activations are repacked into it
 *     once per call (repack_b), tokens padded with zeros to a multiple of 16.
 *   C tiles: 16 rows x 16 tokens f32; each step multiplies up to 2 x 2 of them (32 rows x 32
 *     tokens: 4 tdpbf16ps on 2 A + 2 B loads) over all the columns, then stores them
 *     transposed into y (y is tokens x ldy).
 *   Order: rows in groups of ~512 KiB (RG_BYTES); per group, 32-token blocks outer and the
 *     group's 32-row blocks inner, so both stay in L2 (the weights come from DRAM once).
 * Ragged edges: a partial last group of < 16 rows is copied into a zero-padded 16-row buffer
 *   (loading 16 rows from the matrix would read past its end); token padding is zeros in B;
 *   columns that are not a multiple of 32 (no model here has them) go to the AVX-512 gemm, as
 *   does a call whose scratch cannot grow.
 *
 * NOTES: the tile config is loaded with inline asm taking the struct as a memory operand:
 * GCC 12 drops the stores that build a struct passed to _tile_loadconfig (llama.cpp's native
 * GCC build dies with SIGILL in ldtilecfg for that reason). Every call ends with tilerelease so
 * no tile state outlives it (context switches then skip the 8 KiB of tile data).
 */
#include "internal.h"

#include "check.h"

#include "amx_common.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#define TM 16 /* rows of a tile (weight rows in A and C, column pairs in B) */
#define TK 32 /* bf16 columns of one A tile (64 bytes) */
#define TN 16 /* tokens of a B / C tile */

/* Tiles 0-3: C (C[i][j] = tile 2i+j), 4-5: A, 6-7: B; every tile 16 rows x 64 bytes. */
static void tiles_config(void) { amx_cfg_load_full(); }

/*
 * 16 x 16 dwords transposed in registers: v[i] lane j -> v[j] lane i (unpack 32, unpack 64,
 * then two 128-bit lane shuffles).
 */
INLINE void transpose16(__m512i v[16])
{
    __m512i t[16], u[16];
    UNROLL for (int i = 0; i < 8; i++)
    {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    /* u[4i+k] lane L: column 4L+k of rows 4i..4i+3 */
    UNROLL for (int i = 0; i < 4; i++)
    {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    UNROLL for (int k = 0; k < 4; k++)
    {
        __m512i a = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);     /* lanes 0, 2 */
        __m512i b = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        __m512i c = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);     /* lanes 1, 3 */
        __m512i d = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
        v[k] = _mm512_shuffle_i32x4(a, b, 0x88);
        v[8 + k] = _mm512_shuffle_i32x4(a, b, 0xdd);
        v[4 + k] = _mm512_shuffle_i32x4(c, d, 0x88);
        v[12 + k] = _mm512_shuffle_i32x4(c, d, 0xdd);
    }
}

/*
 * The activations in the B layout: token block j (tokens 16j..16j+15) is cols/2 pair rows of
 * 16 dwords at bp + j * (cols/2) * 16 (32 * cols bytes each), its K step s the 1 KiB there
 * + s * 1024 bytes.
 * bp [npad/16][cols/2][16] dwords; tokens >= n are zeros.
 */
static void repack_b(const struct kern_act *a, uint32_t *bp, size_t npad)
{
    const size_t cols = a->cols, ld = a->ld;
    for (size_t j = 0; j < npad / TN; j++) {
        uint32_t *dst = bp + j * (cols / 2) * TN;
        for (size_t c = 0; c < cols; c += TK) {
            __m512i v[16];
            UNROLL for (int t = 0; t < 16; t++)
            {
                size_t tok = j * TN + (size_t)t;
                v[t] = tok < a->n ? _mm512_loadu_si512(a->xb + tok * ld + c)
                                  : _mm512_setzero_si512();
            }
            transpose16(v);
            UNROLL for (int p = 0; p < 16; p++)
                _mm512_store_si512(dst + (c / 2 + (size_t)p) * TN, v[p]);
        }
    }
}

/* C tile (16 rows x 16 tokens, f32, row-major in c) -> y[t][r] for t < nt, r < nr. */
INLINE void store_c(const float *c, float *y, size_t ldy, size_t nr, size_t nt)
{
    const __m512i idx = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80,
                                         64, 48, 32, 16, 0);
    const __mmask16 rm = (__mmask16)((1u << nr) - 1u);
    for (size_t t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + t * ldy, rm, _mm512_i32gather_ps(idx, c + t, 4));
}

/*
 * MR (1, 2) row tiles x NR (1, 2) token tiles over all columns: rows from a0 (a1 = a0 + 16
 * rows), stride lda bytes; tokens from b0 (b1 the next token block); y at the block's first
 * row and token; nr1 / nt1 = valid rows / tokens of the second (or only) tile.
 */
INLINE void block(int MR, int NR, const uint8_t *a0, size_t lda, const uint8_t *b0,
                  size_t bstride, size_t ksteps, float *y, size_t ldy, size_t nr_last,
                  size_t nt_last)
{
    _tile_zero(0);
    if (NR == 2)
        _tile_zero(1);
    if (MR == 2) {
        _tile_zero(2);
        if (NR == 2)
            _tile_zero(3);
    }
    const uint8_t *a1 = a0 + TM * lda, *b1 = b0 + bstride;
    for (size_t s = 0; s < ksteps; s++) {
        _tile_loadd(4, a0 + s * 64, (long)lda);
        _tile_loadd(6, b0 + s * 1024, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (NR == 2) {
            _tile_loadd(7, b1 + s * 1024, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (MR == 2) {
            _tile_loadd(5, a1 + s * 64, (long)lda);
            _tile_dpbf16ps(2, 5, 6);
            if (NR == 2)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    float c[TM * TN] __attribute__((aligned(64)));
    const size_t nr0 = MR == 2 ? TM : nr_last, nt0 = NR == 2 ? TN : nt_last;
    _tile_stored(0, c, 64);
    store_c(c, y, ldy, nr0, nt0);
    if (NR == 2) {
        _tile_stored(1, c, 64);
        store_c(c, y + TN * ldy, ldy, nr0, nt_last);
    }
    if (MR == 2) {
        _tile_stored(2, c, 64);
        store_c(c, y + TM, ldy, nr_last, nt0);
        if (NR == 2) {
            _tile_stored(3, c, 64);
            store_c(c, y + TN * ldy + TM, ldy, nr_last, nt_last);
        }
    }
}

/* Tokens [t, t + 16*NR) (nt_last valid in the last tile) against the rows of one group:
 * ntiles row tiles from a0 (stride lda), the last with nr_last valid rows. */
INLINE void group_tokens(int NR, const uint8_t *a0, size_t lda, size_t ntiles, size_t nr_last,
                         const uint8_t *b0, size_t bstride, size_t ksteps, float *y, size_t ldy,
                         size_t nt_last)
{
    size_t i = 0;
    for (; i + 2 <= ntiles; i += 2)
        block(2, NR, a0 + i * TM * lda, lda, b0, bstride, ksteps, y + i * TM, ldy,
              i + 2 == ntiles ? nr_last : TM, nt_last);
    if (i < ntiles)
        block(1, NR, a0 + i * TM * lda, lda, b0, bstride, ksteps, y + i * TM, ldy, nr_last,
              nt_last);
}

/* One group of ntiles row tiles (see group_tokens) against every token: token blocks outer,
 * so a block of 32 tokens' B (32 * cols * 2 bytes) is reused from L2 by all the group's rows,
 * while the group's rows (RG * cols * 2 bytes) stay in L2 for all the token blocks. */
static void group_all(const uint8_t *a0, size_t lda, size_t ntiles, size_t nr_last,
                      const uint8_t *bp, size_t cols, size_t n, float *y, size_t ldy)
{
    const size_t bstride = cols * TN * 2, ksteps = cols / TK;
    size_t t = 0;
    for (; t + 2 * TN <= n; t += 2 * TN)
        group_tokens(2, a0, lda, ntiles, nr_last, bp + (t / TN) * bstride, bstride, ksteps,
                     y + t * ldy, ldy, TN);
    if (n - t > TN)
        group_tokens(2, a0, lda, ntiles, nr_last, bp + (t / TN) * bstride, bstride, ksteps,
                     y + t * ldy, ldy, n - t - TN);
    else if (n > t)
        group_tokens(1, a0, lda, ntiles, nr_last, bp + (t / TN) * bstride, bstride, ksteps,
                     y + t * ldy, ldy, n - t);
}

/* Bytes of weight rows per group (group_all): about a quarter of the 2 MiB L2, so the group
 * and a 32-token block of B stay there. bench/kern_bench --only amx, 1 thread, n = 512: groups of
 * 8 tiles (128 rows) over 2 tiles ran ~1.3x faster at 2048 columns (822 vs 607 GFLOP/s) but
 * 0.5-0.8x at 5632 columns (1.4 MiB groups), hence a byte budget, not a row count. */
#define RG_BYTES (512 * 1024)

void kern_gemm_bf16_bf16_amx(const void *w, const struct kern_act *a, float *y, size_t ldy,
                             size_t r0, size_t r1)
{
    CHECK(a->wt == DT_BF16 && a->xb);
    const size_t cols = a->cols, n = a->n, npad = kern__round_up(n, TN);
    const size_t rb = cols * 2; /* bytes of a stored row */
    const size_t rem = (r1 - r0) % TM;
    /* slot 1: slot 0 holds the activations when kern_matmul prepared them (dispatch.c) */
    const size_t bbytes = npad * cols * 2, pbytes = rem ? TM * rb : 0;
    uint8_t *scratch = cols % TK == 0 ? kern__scratch_slot(1, bbytes + pbytes) : NULL;
    if (!scratch) {
        kern_gemm_bf16_bf16_avx512(w, a, y, ldy, r0, r1);
        return;
    }
    uint32_t *bp = (uint32_t *)scratch;
    repack_b(a, bp, npad);
    tiles_config();
    const uint8_t *wb = w;
    size_t rg_tiles = RG_BYTES / (TM * rb) / 2 * 2; /* row tiles per group, even, >= 2 */
    if (rg_tiles < 2)
        rg_tiles = 2;
    const size_t full = (r1 - r0) / TM; /* whole row tiles from r0 */
    for (size_t i = 0; i < full; i += rg_tiles) {
        size_t nt = full - i < rg_tiles ? full - i : rg_tiles;
        group_all(wb + (r0 + i * TM) * rb, rb, nt, TM, (const uint8_t *)bp, cols, n,
                  y + r0 + i * TM, ldy);
    }
    if (rem) {
        /* the last rows, zero-padded to a tile */
        const size_t r = r0 + full * TM;
        uint8_t *pad = scratch + bbytes;
        memcpy(pad, wb + r * rb, rem * rb);
        memset(pad + rem * rb, 0, (TM - rem) * rb);
        group_all(pad, rb, 1, rem, (const uint8_t *)bp, cols, n, y + r, ldy);
    }
    _tile_release();
}
