/*
 * amx_q4s.c — the q4_0 panel GEMM for a few tokens (decode of 2..16 streams) on AMX-INT8 tiles
 * (tdpbsud), compiled with the AVX-512 and AMX flags (kernels/CMakeLists.txt).
 * MEASURED AND NOT DISPATCHED (session 18, docs/PERFORMANCE.md "int4 8-stream decode against
 * AMX tiles, session 18"): on this Emerald Rapids VM (bench/amxs_bench, thread CPU time, loaded
 * machine) it runs 0.29-0.64x (n = 2..4), 0.69-0.89x (n = 8), ~0.95x (n = 16) the VNNI panel
 * kernel with the weights in cache and 0.70-0.92x from DRAM at n = 8, so DT_Q4_0's panel_gemm
 * stays kern_gemm_q4_0p_q8_0_avx512 below 24 tokens. Kept, with its test and bench/amxs_bench,
 * to re-measure on other AMX parts (where tile instructions may cost less). Only call it where
 * kern_has_amx_bf16(); n outside [AMXS_MIN_N, AMXS_MAX_N] goes to kern_gemm_q4_0p_q8_0_amx
 * (x86/amx_q.c).
 *
 * Same bits as kern_gemm_q4_0p_q8_0_avx512 (so as the stored-row GEMM, and batch invariant like
 * it): per block of 32 columns a tile multiply gives each (token, row) the exact int32 sum of
 * (nibble 0..15) x (signed activation quant); adding the activation's ns32 (-8 x the sum of its
 * quants) gives the integer the VNNI kernel reaches (it starts its accumulator at ns32), and the
 * float steps after it are the VNNI kernel's, in its order: f = (float)sum * d_x;
 * acc = fma(f, d_w, acc) block by block over the same chunks of KC columns, then y (+)= acc.
 * tests/kern asserts equality bit for bit.
 *
 * Why it loses at small n: q4_0 scales every 32 columns, so each block's sums must leave the
 * tiles (a tile store, then vector loads) before its float epilogue, whatever n is, and its B
 * operand must be unpacked from nibbles through memory. One block per multiply (K = 32, M = n,
 * N = 16 rows: 2 tile loads, zero, tdpbsud, tile store) ran ~35-57 ns per block here against
 * ~23-27 ns for the whole VNNI block at n = 8 (64 vpdpbusd, which issue two per cycle on this
 * CPU): 0.50-0.66x. Two blocks per multiply for n <= 8 (run(PAIR 1): A's rows
 * [x block b | 0] then [0 | x block b+1], K = 64, M = 2n) halve the tile instructions:
 * 0.69-0.89x. Per block there remain 8 stores of the unpacked B and 8 rows of tile store, where
 * the VNNI kernel stores nothing. Interleaving VNNI panels with tile panels in one instruction
 * stream (a hybrid, one block per multiply) measured no better (0.63x).
 * What is here:
 *   - 4 C tiles, 2 A and 2 B tiles; a block's (pair's) tile store is issued after later
 *     multiplies (the tile unit runs in order: a store right after its multiply stalls it), its
 *     epilogue later still, reading the sums from a ring in L1;
 *   - tdpbsud (signed activations in A, unsigned weights in B): the nibbles go to B as they are
 *     (0..15); the offset is the activation's ns32, added in the epilogue;
 *   - the B operand of each block is unpacked from the panel (4 loads, and / shift+and) into a
 *     small ring in L1;
 *   - the pipeline runs over all blocks of all panels of the call (no drain per chunk or panel).
 *
 * Layout, C = X . W^T per block, C[token][row]:
 *   A tiles: n tokens x 32 int8 activation bytes (kern_act.q), loaded straight from the
 *     prepared activations (stride kern_act.ld); for n <= 8, 2n rows x 64 bytes from a copy
 *     (run, PAIR 1).
 *   B tiles: 8 rows of 64 bytes per block, row g holding columns 4g..4g+3 (g < 4: low nibbles,
 *     columns 4g+j; g >= 4: high nibbles, columns 16+4(g-4)+j) of the panel's 16 rows,
 *     dword i = row i (quant.h "q4_0 panels": the panel's 4 vectors of nibble pairs are
 *     lane = row already).
 *   C tiles: n tokens (n <= 8: 2n, two blocks) x 16 rows int32.
 *
 * NOTES: the tile config is loaded with inline asm taking the struct as a memory operand
 * (amx_common.h); every call ends with tilerelease.
 */
#include "internal.h"

#include "check.h"
#include "kern_variants.h"
#include "quant.h"

#include "amx_common.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#define PANEL 16   /* weight rows per panel: the 16 dwords of a B tile row */
#define KC 1024    /* columns per chunk: the AVX-512 panel kernel's (same sums, same order) */
#define TT 16      /* most tokens of one call here (rows of A and C) */
#define LAG 4      /* a block's epilogue runs LAG blocks after its multiply */
#define CS_RING 8  /* stored sums in flight: > LAG */
#define BB_RING 4  /* unpacked B operands in flight */
#define PF 8192    /* software prefetch distance in the panel stream (the VNNI kernel's Q4P_PF) */

/* The call's token range: from AMXS_MIN_N tokens to AMXS_MAX_N (one token
 * tile). */
#define AMXS_MIN_N 2
#define AMXS_MAX_N TT

/* Tiles 0-3: C (n x 16 int32), 4-5: A (n x 32 bytes), 6-7: B (8 x 64 bytes). */
static void tiles_config(int nt)
{
    struct amx_tile_cfg cfg;
    amx_cfg_init(&cfg);
    for (int i = 0; i < 4; i++) {
        cfg.rows[i] = (uint8_t)nt;
        cfg.colsb[i] = 64;
    }
    for (int i = 4; i < 6; i++) {
        cfg.rows[i] = (uint8_t)nt;
        cfg.colsb[i] = 32;
        cfg.rows[i + 2] = 8;
        cfg.colsb[i + 2] = 64;
    }
    amx_cfg_load(&cfg);
}

/* A token's block scale and offset correction (kern_act.d, .ns32),
 * [block][token]. */
struct sc {
    float d;
    int32_t ns;
};

/* Where the producer or the consumer stands: panel p (its bytes at pp, rows
 * from r), block b. */
struct pos {
    const uint8_t *pp;
    size_t r, b;
};

INLINE void pos_next(struct pos *q, size_t nb, size_t pstride)
{
    if (++q->b == nb) {
        q->b = 0;
        q->pp += pstride;
        q->r += PANEL;
    }
}

/* The B operand of block b of panel pp: the nibbles, 8 rows of 64 bytes, into
 * bb; and a prefetch PF bytes ahead in the panel stream (past the panel's end:
 * the next panel). */
INLINE void unpack_b(const uint8_t *pp, size_t nb, size_t b, uint8_t (*bb)[64])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const uint8_t *qb = pp + quant_q4p_qoff(b, nb);
    UNROLL for (int l = 0; l < 5; l++) _mm_prefetch((const char *)qb + PF + 64 * l, _MM_HINT_T0);
    UNROLL for (int g = 0; g < 4; g++)
    {
        __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * g));
        _mm512_store_si512((void *)bb[g], _mm512_and_si512(v, m4));
        _mm512_store_si512((void *)bb[4 + g], _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
}

/* Block P's multiply into C tile CT (A tile AT, B tile BT): unpack, load A and
 * B, zero C, tdpbsud. Its tile store is issued D blocks later (store_c). */
#define PRODUCE_(CT, AT, BT, P, bb)                                                                \
    do {                                                                                           \
        unpack_b((P).pp, nb, (P).b, bb);                                                           \
        _tile_loadd(AT, a->q + (P).b * 32, (long)a->ld);                                           \
        _tile_loadd(BT, bb, 64);                                                                   \
        _tile_zero(CT);                                                                            \
        _tile_dpbsud(CT, AT, BT);                                                                  \
    } while (0)

/* Block k's sums (C tile k % 4) to the ring. */
INLINE void store_c(size_t k, int32_t (*cs)[PANEL])
{
    switch (k % 4) {
    case 0:
        _tile_stored(0, cs, 64);
        break;
    case 1:
        _tile_stored(1, cs, 64);
        break;
    case 2:
        _tile_stored(2, cs, 64);
        break;
    default:
        _tile_stored(3, cs, 64);
        break;
    }
}

/* At the end of a chunk of KC columns (or of the panel): y (+)= acc, acc
 * restarts from 0, as the VNNI kernel's tiles do per chunk. */
INLINE void flush(const struct pos *q, size_t nb, int NT, __m512 acc[TT], float *y, size_t ldy,
                  size_t r1)
{
    if ((q->b + 1) % (KC / 32) == 0 || q->b + 1 == nb) {
        size_t nr = r1 - q->r < PANEL ? r1 - q->r : PANEL;
        __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        int add = q->b >= KC / 32;
        UNROLL for (int j = 0; j < NT; j++)
        {
            float *yo = y + (size_t)j * ldy + q->r;
            __m512 o = acc[j];
            if (add)
                o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(rm, yo));
            _mm512_mask_storeu_ps(yo, rm, o);
            acc[j] = _mm512_setzero_ps();
        }
    }
}

/* The epilogue of one block: acc[j] = fma((float)(sum[j] + ns) * d_x, d_w, acc[j]) for each
 * token j, the VNNI kernel's float steps, then flush. */
INLINE void consume(const int32_t (*cs)[PANEL], const struct pos *q, size_t nb, const struct sc *sc,
                    int NT, __m512 acc[TT], float *y, size_t ldy, size_t r1)
{
    const struct sc *sb = sc + q->b * (size_t)NT;
    __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256((const __m256i *)(const void *)(q->pp + quant_q4p_soff(q->b, nb))));
    UNROLL for (int j = 0; j < NT; j++)
    {
        __m512i ia =
            _mm512_add_epi32(_mm512_load_si512((const void *)cs[j]), _mm512_set1_epi32(sb[j].ns));
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(sb[j].d));
        acc[j] = _mm512_fmadd_ps(f, s, acc[j]);
    }
    flush(q, nb, NT, acc, y, ldy, r1);
}

/*
 * n <= 8: two blocks per multiply. A holds 2n rows of 64 bytes, [x_t block b | 0] for the n
 * tokens then [0 | x_t block b+1] (built once per call, a2), B the two blocks' 16 rows, so
 * C's first n rows are block b's sums and its last n rows block b+1's, each exact (the zero
 * halves add nothing): one multiply, one tile store, one pair of tile loads for two blocks.
 */
INLINE void unpack_pair(const uint8_t *pp, size_t nb, size_t b, uint8_t (*bb)[64])
{
    unpack_b(pp, nb, b, bb);
    if (b + 1 < nb)
        unpack_b(pp, nb, b + 1, bb + 8);
    else /* an odd last block: block b+1's rows of B are zero (A's are too) */
        UNROLL for (int g = 0; g < 8; g++) _mm512_store_si512((void *)bb[8 + g],
                                                              _mm512_setzero_si512());
}

#define PRODUCE2_(CT, AT, BT, P, bb, a2)                                                          \
    do {                                                                                           \
        unpack_pair((P).pp, nb, (P).b, bb);                                                        \
        _tile_loadd(AT, a2 + (P).b / 2 * (size_t)TT * 64, 64);                                     \
        _tile_loadd(BT, bb, 64);                                                                   \
        _tile_zero(CT);                                                                            \
        _tile_dpbsud(CT, AT, BT);                                                                  \
    } while (0)

INLINE void pos_next2(struct pos *q, size_t nb, size_t pstride)
{
    q->b += 2;
    if (q->b >= nb) {
        q->b = 0;
        q->pp += pstride;
        q->r += PANEL;
    }
}

/* The epilogues of a pair: block b from the first NT rows, block b+1 (if any) from the next. */
INLINE void consume2(const int32_t (*cs)[PANEL], const struct pos *q, size_t nb,
                     const struct sc *sc, int NT, __m512 acc[TT], float *y, size_t ldy, size_t r1)
{
    consume(cs, q, nb, sc, NT, acc, y, ldy, r1);
    if (q->b + 1 < nb) {
        struct pos q1 = *q;
        q1.b++;
        consume(cs + NT, &q1, nb, sc, NT, acc, y, ldy, r1);
    }
}

/* One multiply's epilogues: a block's (consume) or a pair's (consume2). */
INLINE void consume_any(int PAIR, const int32_t (*cs)[PANEL], const struct pos *q, size_t nb,
                        const struct sc *sc, int NT, __m512 acc[TT], float *y, size_t ldy,
                        size_t r1)
{
    if (PAIR)
        consume2(cs, q, nb, sc, NT, acc, y, ldy, r1);
    else
        consume(cs, q, nb, sc, NT, acc, y, ldy, r1);
}

/*
 * All blocks of panels [r0, r1) for the NT tokens, one block per multiply (PAIR 0, tiles_config)
 * or two (PAIR 1, n <= 8, tiles_config2, A from a2): the same pipeline, D and L apart.
 */
INLINE void run(int PAIR, const void *wp, const struct kern_act *a, const struct sc *sc,
                const int8_t *a2, int NT, float *y, size_t ldy, size_t r0, size_t r1)
{
    const size_t nb = a->cols / 32, rb = kern__row_bytes(DT_Q4_0, a->cols);
    const size_t pstride = PANEL * rb;
    /* multiplies of the call: blocks, or pairs of blocks */
    const size_t total = (r1 - r0 + PANEL - 1) / PANEL * (PAIR ? (nb + 1) / 2 : nb);
    int32_t cs[CS_RING][TT][PANEL] __attribute__((aligned(64)));
    uint8_t bb[BB_RING][16][64] __attribute__((aligned(64)));
    __m512 acc[TT];
    UNROLL for (int j = 0; j < NT; j++) acc[j] = _mm512_setzero_ps();
    struct pos pr = {(const uint8_t *)wp + r0 / PANEL * pstride, r0, 0}, co = pr;
    size_t i = 0, e = 0; /* multiplies issued, consumed */
    /* A multiply's tile store is issued D multiplies later: the tile unit runs its
     * instructions in order, so a store right after its multiply stalls the queue for the
     * multiply's latency (one block, n = 8: D = 0 0.47x VNNI, D = 1 0.62x, D = 2 0.65x, D = 3
     * 0.64x); its epilogue L later (pairs, n = 8, weights in cache, one run: D, L = 1, 2 0.75x;
     * 2, 3 0.76x; 3, 4 0.79x; 3, 6 0.81x). */
    const size_t D = PAIR ? 3 : 2, L = PAIR ? 6 : LAG;
#define STEP_(CT, AT, BT)                                                                          \
    if (i < total) {                                                                               \
        if (PAIR)                                                                                  \
            PRODUCE2_(CT, AT, BT, pr, bb[i % BB_RING], a2);                                        \
        else                                                                                       \
            PRODUCE_(CT, AT, BT, pr, bb[i % BB_RING]);                                             \
        PAIR ? pos_next2(&pr, nb, pstride) : pos_next(&pr, nb, pstride);                           \
        if (i >= D)                                                                                \
            store_c(i - D, cs[(i - D) % CS_RING]);                                                 \
        i++;                                                                                       \
        if (i > L) {                                                                               \
            consume_any(PAIR, cs[e % CS_RING], &co, nb, sc, NT, acc, y, ldy, r1);                  \
            PAIR ? pos_next2(&co, nb, pstride) : pos_next(&co, nb, pstride);                       \
            e++;                                                                                   \
        }                                                                                          \
    }
    while (i < total) {
        STEP_(0, 4, 6)
        STEP_(1, 5, 7)
        STEP_(2, 4, 6)
        STEP_(3, 5, 7)
    }
#undef STEP_
    for (size_t k = total > D ? total - D : 0; k < total; k++)
        store_c(k, cs[k % CS_RING]);
    for (; e < total; e++) {
        consume_any(PAIR, cs[e % CS_RING], &co, nb, sc, NT, acc, y, ldy, r1);
        PAIR ? pos_next2(&co, nb, pstride) : pos_next(&co, nb, pstride);
    }
}

/* Tiles for pairs: 0-3 C (2n x 16 int32), 4-5 A (2n x 64 bytes), 6-7 B (16 x 64 bytes). */
static void tiles_config2(int nt)
{
    struct amx_tile_cfg cfg;
    amx_cfg_init(&cfg);
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = (uint8_t)(i < 6 ? 2 * nt : 16);
        cfg.colsb[i] = 64;
    }
    amx_cfg_load(&cfg);
}

void kern_gemm_q4_0p_q8_0_amxs(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                               size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q4_0);
    if (a->n < AMXS_MIN_N || a->n > AMXS_MAX_N) {
        kern_gemm_q4_0p_q8_0_amx(wp, a, y, ldy, r0, r1);
        return;
    }
    if (r0 >= r1)
        return;
    const size_t nb = a->cols / 32, n = a->n;
    /* slot 1 is free under a panel product (as for the other panel kernels); kernels have no
     * error path, so failing to get it aborts. It holds sc, [nb][n] pairs of 8 bytes, then for
     * n <= 8 a2, [(nb + 1) / 2][TT rows][64] bytes (run, PAIR 1). */
    const int two = n <= 8;
    const size_t scb = (nb * n * sizeof(struct sc) + 63) / 64 * 64;
    const size_t a2b = two ? (nb + 1) / 2 * TT * 64 : 0;
    uint8_t *scr = kern__scratch_slot(1, scb + a2b + 64);
    CHECK(scr != NULL);
    struct sc *sc = (struct sc *)(void *)scr;
    int8_t *a2 = (int8_t *)(void *)(((uintptr_t)scr + scb + 63) / 64 * 64);
    for (size_t b = 0; b < nb; b++)
        for (size_t j = 0; j < n; j++) {
            size_t o = j * a->cp / 32 + b;
            sc[b * n + j] = (struct sc){a->d[o], a->ns32[o]};
        }
    if (two) {
        memset(a2, 0, a2b);
        for (size_t b = 0; b < nb; b++)
            for (size_t j = 0; j < n; j++)
                memcpy(a2 + (b / 2 * TT + b % 2 * n + j) * 64 + b % 2 * 32,
                       a->q + j * a->ld + b * 32, 32);
        tiles_config2((int)n);
        switch (n) {
#define CASE_(T)                                                                                   \
    case T:                                                                                        \
        run(1, wp, a, sc, a2, T, y, ldy, r0, r1);                                               \
        break;
            CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8)
#undef CASE_
        }
        _tile_release();
        return;
    }
    tiles_config((int)n);
    switch (n) {
#define CASE_(T)                                                                                   \
    case T:                                                                                        \
        run(0, wp, a, sc, NULL, T, y, ldy, r0, r1);                                                   \
        break;
        CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8) CASE_(9) CASE_(10)
        CASE_(11) CASE_(12) CASE_(13) CASE_(14) CASE_(15) CASE_(16)
#undef CASE_
    }
    _tile_release();
}
