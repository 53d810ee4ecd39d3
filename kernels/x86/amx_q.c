/*
 * amx_q.c — the q4_0 and q8_0 panel GEMMs on AMX-INT8 tiles (tdpbssd), compiled with the
 * AVX-512 and AMX flags (kernels/CMakeLists.txt); dispatch.c puts them in DT_Q4_0's and
 * DT_Q8_0's panel_gemm when the CPU and the OS allow AMX (kern_has_amx_bf16, which also asks
 * for AMX-INT8) and CLOCHER_AMX is not 0.
 *
 * Same bits as kern_gemm_q4_0p_q8_0_avx512 / kern_gemm_q8_0p_q8_0_avx512 (so as the stored-row
 * GEMMs, and batch invariant like them): a tile multiply gives each (token, row) pair's exact
 * int32 sum over one block of 32 columns, which is the integer the VNNI kernels reach (their
 * offset correction ns32 cancels the +8 / +128 they add to make the weights unsigned; here the
 * weights are signed bytes and need none), and the float steps after it are theirs, in their
 * order: f = (float)sum * d_x; acc = fma(f, d_w, acc) block by block over the same chunks of
 * KC columns, then y (+)= acc. No numerics change; tests/kern asserts equality bit for bit.
 *
 * Why tiles although q4_0/q8_0 scale every block of 32: one tdpbssd of 16 tokens x 32 columns
 * x 16 rows (8192 multiply-adds) costs a few nanoseconds (docs/PERFORMANCE.md "llama.cpp's AMX
 * path, session 17": half tiles still ~12x a zmm vpdpbusd), so the work left per block is the
 * epilogue (store the 16 x 16 sums, convert, scale, accumulate: 3 vector ops per token) instead
 * of 8 vpdpbusd per token and panel.
 *
 * Layout, C = X . W^T per block, C[token][row]:
 *   A tiles: nt tokens x 32 int8 activation bytes (kern_act.q), loaded straight from the
 *     prepared activations (stride kern_act.ld).
 *   B tiles: 8 rows of 64 bytes, row g holding columns 4g..4g+3 of the panel's 16 rows (the
 *     VNNI layout: dword i of row g = row i's 4 columns) as signed bytes. The panels are built
 *     lane = row already (quant.h "q4_0 panels", "q8_0 panels"): q4_0's 4 vectors of nibble
 *     pairs become 8 rows (low nibbles = columns 4g+j, high = 16+4g+j) minus 8; q8_0's 8
 *     vectors lose their 0x80 offset. Both are unpacked once per chunk of KC columns of a
 *     panel into a 16 KiB L1 buffer that every token tile of the call then reads.
 *   C tiles: nt tokens x 16 rows int32, two in flight (blocks b and b+1), stored to a 2 KiB
 *     buffer for the epilogue.
 * Token tiles are 16 tokens, the last one ragged (its own tile configuration); the float
 * accumulators of a tile (nt x 16 rows) live in registers (one instance per nt).
 *
 * NOTES: the tile config is loaded with inline asm taking the struct as a memory operand
 * (GCC 12 drops the stores that build a struct passed to _tile_loadconfig, amx_bf16.c NOTES);
 * every call ends with tilerelease. Below AMX_Q_MIN_N tokens the AVX-512 panel kernels run
 * (same bits).
 */
#include "internal.h"

#include "check.h"
#include "quant.h"

#include "amx_common.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#define PANEL 16   /* weight rows per panel: the 16 dwords of a B tile row */
#define KC 1024    /* columns per chunk: the AVX-512 panel kernels' (same sums, same order) */
#define TT 16      /* tokens per token tile (rows of A and C) */
#define LAG 2     /* a block's epilogue runs LAG blocks after its multiply (chunk_tile) */
#define CS_RING 4 /* stored sums in flight: > LAG */
#define AMX_Q_MIN_N 24 /* 2048x2048, thread CPU time under load: n = 8 0.53-0.71x the AVX-512 panel
                         * kernel, n = 16 0.99-1.05x, n = 32 1.17-1.23x, n = 64 1.34-1.41x */

/* Tiles 0-1: C (nt x 16 int32), 2-3: A (nt x 32 bytes), 4-5: B (8 x 64 bytes). */
static void tiles_config(int nt)
{
    struct amx_tile_cfg cfg;
    amx_cfg_init(&cfg);
    for (int i = 0; i < 2; i++) {
        cfg.rows[i] = (uint8_t)nt;
        cfg.colsb[i] = 64;
        cfg.rows[2 + i] = (uint8_t)nt;
        cfg.colsb[2 + i] = 32;
        cfg.rows[4 + i] = 8;
        cfg.colsb[4 + i] = 64;
    }
    amx_cfg_load(&cfg);
}

/* One chunk of one panel, unpacked: [block][8 rows][64] signed bytes, and the weight scales
 * [block][16 rows] widened to f32. */
struct chunk {
    int8_t q[KC / 32][8][64];
    float s[KC / 32][PANEL];
};

enum qtype { Q4, Q8 };

static void unpack_chunk(enum qtype qt, const uint8_t *pp, size_t nb, size_t b0, size_t nblk,
                         struct chunk *c)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8),
                  x80 = _mm512_set1_epi8((char)0x80);
    for (size_t b = 0; b < nblk; b++) {
        const uint8_t *qb, *sb;
        if (qt == Q4) {
            qb = pp + quant_q4p_qoff(b0 + b, nb);
            sb = pp + quant_q4p_soff(b0 + b, nb);
            UNROLL for (int g = 0; g < 4; g++)
            {
                __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * g));
                __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, m4), eight);
                __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), eight);
                _mm512_store_si512((void *)c->q[b][g], lo);
                _mm512_store_si512((void *)c->q[b][4 + g], hi);
            }
        } else {
            qb = pp + quant_q8p_qoff(b0 + b, nb);
            sb = pp + quant_q8p_soff(b0 + b, nb);
            UNROLL for (int g = 0; g < 8; g++) _mm512_store_si512(
                (void *)c->q[b][g],
                _mm512_xor_si512(_mm512_loadu_si512((const void *)(qb + 64 * g)), x80));
        }
        _mm512_store_ps(c->s[b], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sb)));
    }
}

/*
 * The epilogue of one block's sums: acc[j] = fma((float)sum[j] * d_x(token j), d_w, acc[j]),
 * the VNNI panel kernels' two float steps. xd: the block's activation scales, token j at xd[j].
 */
INLINE void block_epilogue(const int32_t (*cs)[PANEL], const float *xd, __m512 s, int NT,
                           __m512 acc[TT])
{
    UNROLL for (int j = 0; j < NT; j++)
    {
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)cs[j])),
                                 _mm512_set1_ps(xd[j]));
        acc[j] = _mm512_fmadd_ps(f, s, acc[j]);
    }
}

/* Block b's sums into C tile CT (A tile AT, B tile BT), stored to cs: the multiply, then the
 * tile store, which waits for it. */
#define BLOCK_SUMS_(CT, AT, BT, b, cs)                                                       \
    do {                                                                                     \
        _tile_loadd(AT, xq + (b) * 32, (long)ld);                                            \
        _tile_loadd(BT, c->q[b], 64);                                                        \
        _tile_zero(CT);                                                                      \
        _tile_dpbssd(CT, AT, BT);                                                            \
        _tile_stored(CT, cs, 64);                                                            \
    } while (0)

/*
 * y[t+j][r..r+16) (+)= the chunk's products for tokens t..t+NT-1 (rows beyond rm not stored).
 * The tile config must be tiles_config(NT). xq: token t's quants at column k0; xd: the token
 * tile's activation scales from block k0/32, [block][TT] (scales_gather).
 * Software-pipelined by one block: block b's multiply and tile store are issued before block
 * b-1's epilogue, which reads the sums stored one step earlier, so the vector work overlaps the
 * tile unit's latency (tiles are not renamed: a tile is reused only every other block).
 */
INLINE void chunk_tile(const struct chunk *c, size_t nblk, const int8_t *xq, size_t ld,
                       const float *xd, int NT, float *y, size_t ldy, __mmask16 rm, int add)
{
    int32_t cs[CS_RING][TT][PANEL] __attribute__((aligned(64)));
    __m512 acc[TT];
    UNROLL for (int j = 0; j < NT; j++) acc[j] = _mm512_setzero_ps();
#define EPI_(bb) block_epilogue(cs[(bb) % CS_RING], xd + (bb) * TT, _mm512_load_ps(c->s[bb]), NT, acc)
    size_t b = 0;
    for (; b + 2 <= nblk; b += 2) {
        BLOCK_SUMS_(0, 2, 4, b, cs[b % CS_RING]);
        if (b >= LAG)
            EPI_(b - LAG);
        BLOCK_SUMS_(1, 3, 5, b + 1, cs[(b + 1) % CS_RING]);
        if (b + 1 >= LAG)
            EPI_(b + 1 - LAG);
    }
    if (b < nblk) {
        BLOCK_SUMS_(0, 2, 4, b, cs[b % CS_RING]);
        if (b >= LAG)
            EPI_(b - LAG);
        b++;
    }
    for (size_t e = b > LAG ? b - LAG : 0; e < b; e++)
        EPI_(e);
#undef EPI_
    UNROLL for (int j = 0; j < NT; j++)
    {
        float *yo = y + (size_t)j * ldy;
        if (add)
            acc[j] = _mm512_add_ps(acc[j], _mm512_maskz_loadu_ps(rm, yo));
        _mm512_mask_storeu_ps(yo, rm, acc[j]);
    }
}

/* The activations' block scales per token tile, [tile][block][TT] (tokens past n: 0), so that
 * the epilogue broadcasts them from fixed offsets of one pointer. */
static void scales_gather(const struct kern_act *a, size_t nb, float *sc)
{
    const size_t cpb = a->cp / 32;
    for (size_t t = 0; t < a->n; t += TT)
        for (size_t b = 0; b < nb; b++)
            for (size_t j = 0; j < TT; j++)
                sc[(t / TT * nb + b) * TT + j] = t + j < a->n ? a->d[(t + j) * cpb + b] : 0.0f;
}

static void gemm_panels_amx(enum qtype qt, const void *wp, const struct kern_act *a, float *y,
                            size_t ldy, size_t r0, size_t r1)
{
    const enum dtype dt = qt == Q4 ? DT_Q4_0 : DT_Q8_0;
    const size_t nb = a->cols / 32, rb = kern__row_bytes(dt, a->cols);
    const size_t pstride = PANEL * rb; /* bytes of one panel */
    struct chunk ch __attribute__((aligned(64)));
    /* slot 1 is free under a panel product (as for the AVX-512 panel kernels); kernels have no
     * error path, so failing to get ceil(n/16) x nb x 64 bytes aborts */
    float *sc = kern__scratch_slot(1, (a->n + TT - 1) / TT * nb * TT * sizeof *sc);
    CHECK(sc != NULL);
    scales_gather(a, nb, sc);
    int configured = 0; /* the token count the tiles are configured for (0: none yet) */
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        const uint8_t *pp = (const uint8_t *)wp + r / PANEL * pstride;
        for (size_t k0 = 0; k0 < a->cols; k0 += KC) {
            size_t kc = a->cols - k0 < KC ? a->cols - k0 : KC, nblk = kc / 32;
            unpack_chunk(qt, pp, nb, k0 / 32, nblk, &ch);
            for (size_t t = 0; t < a->n; t += TT) {
                int nt = a->n - t < TT ? (int)(a->n - t) : TT;
                if (nt != configured) {
                    tiles_config(nt);
                    configured = nt;
                }
                const int8_t *xq = a->q + t * a->ld + k0;
                const float *xd = sc + (t / TT * nb + k0 / 32) * TT;
                float *yo = y + t * ldy + r;
                switch (nt) {
#define CASE_(T)                                                                             \
    case T:                                                                                  \
        chunk_tile(&ch, nblk, xq, a->ld, xd, T, yo, ldy, rm, k0 > 0);                        \
        break;
                    CASE_(1) CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
                    CASE_(9) CASE_(10) CASE_(11) CASE_(12) CASE_(13) CASE_(14) CASE_(15)
                    CASE_(16)
#undef CASE_
                }
            }
        }
    }
    if (configured)
        _tile_release();
}

void kern_gemm_q4_0p_q8_0_amx(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q4_0);
    if (a->xt) { /* prepared with KERN_ACT_BF16_TILES, n >= the tile threshold (kern.h) */
        kern_gemm_q4_0p_bf16_amx(wp, a, y, ldy, r0, r1);
        return;
    }
    if (a->n < AMX_Q_MIN_N) {
        kern_gemm_q4_0p_q8_0_avx512(wp, a, y, ldy, r0, r1);
        return;
    }
    gemm_panels_amx(Q4, wp, a, y, ldy, r0, r1);
}

void kern_gemm_q8_0p_q8_0_amx(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q8_0);
    if (a->xt) { /* prepared with KERN_ACT_BF16_TILES, n >= the tile threshold (kern.h) */
        kern_gemm_q8_0p_bf16_amx(wp, a, y, ldy, r0, r1);
        return;
    }
    if (a->n < AMX_Q_MIN_N) {
        kern_gemm_q8_0p_q8_0_avx512(wp, a, y, ldy, r0, r1);
        return;
    }
    gemm_panels_amx(Q8, wp, a, y, ldy, r0, r1);
}
