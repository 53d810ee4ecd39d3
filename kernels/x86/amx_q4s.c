/*
 * amx_q4s.c — the q4_0 panel GEMM for a few tokens (decode of 2..16 streams) on AMX-INT8 tiles
 * (tdpbsud), compiled with the AVX-512 and AMX flags (kernels/CMakeLists.txt). dispatch.c puts
 * kern_gemm_q4_0p_q8_0_amxs in DT_Q4_0's panel_gemm when the CPU and the OS allow AMX and
 * CLOCHER_AMX is not 0 (traits.c's amx overlay); it hands n outside [AMXS_MIN_N, AMXS_MAX_N]
 * to kern_gemm_q4_0p_q8_0_amx (x86/amx_q.c: its own tiles from 24 tokens, the VNNI panel
 * kernel below).
 *
 * Same bits as kern_gemm_q4_0p_q8_0_avx512 (so as the stored-row GEMM, and batch invariant like
 * it): per block of 32 columns a tile multiply gives each (token, row) the exact int32 sum of
 * (nibble 0..15) x (signed activation quant); adding the activation's ns32 (-8 x the sum of its
 * quants) gives the integer the VNNI kernel reaches (it starts its accumulator at ns32), and the
 * float steps after it are the VNNI kernel's, in its order: f = (float)sum * d_x;
 * acc = fma(f, d_w, acc) block by block over the same chunks of KC columns, then y (+)= acc.
 * No numerics change; tests/kern asserts equality bit for bit.
 *
 * Why another AMX kernel beside amx_q.c: at n = 8 that one measured 0.53-0.71x the VNNI kernel
 * (so it runs from 24 tokens). Its tiles are used two blocks apart, and tiles are not renamed: a
 * block's tile load waits for the multiply two blocks back, whose tile store waits for it, so the
 * tile unit's latency is exposed at small n, where each block carries little work. Here:
 *   - 4 C tiles (blocks b..b+3 in flight), 2 A and 2 B tiles; a block's epilogue runs LAG blocks
 *     after its multiply, reading the sums its tile store left in a ring in L1;
 *   - tdpbsud (signed activations in A, unsigned weights in B): the nibbles go to B as they are
 *     (0..15, no -8 per byte); the offset is the activation's ns32, added in the epilogue
 *     (one vpaddd per token and block, as the VNNI kernel's accumulator start);
 *   - the B operand of each block is unpacked straight from the panel (4 loads, and / shift+and)
 *     into a small ring in L1, never a whole chunk;
 *   - the pipeline runs over all blocks of all panels of the call (no drain per chunk or panel).
 *
 * Layout, C = X . W^T per block, C[token][row]:
 *   A tiles: n tokens x 32 int8 activation bytes (kern_act.q), loaded straight from the
 *     prepared activations (stride kern_act.ld).
 *   B tiles: 8 rows of 64 bytes, row g holding columns 4g..4g+3 (g < 4: low nibbles, columns
 *     4g+j; g >= 4: high nibbles, columns 16+4(g-4)+j) of the panel's 16 rows, dword i = row i
 *     (quant.h "q4_0 panels": the panel's 4 vectors of nibble pairs are lane = row already).
 *   C tiles: n tokens x 16 rows int32.
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

#define PANEL 16 /* weight rows per panel: the 16 dwords of a B tile row */
#define KC 1024  /* columns per chunk: the AVX-512 panel kernel's (same sums, same order) */
#define TT 16    /* most tokens of one call here (rows of A and C) */
#define LAG 4    /* a block's epilogue runs LAG blocks after its multiply */
#define CS_RING 8 /* stored sums in flight: > LAG */
#define BB_RING 4 /* unpacked B operands in flight */
#define PF 8192   /* software prefetch distance in the panel stream (the VNNI kernel's Q4P_PF) */

/* The call's token range: from AMXS_MIN_N tokens to AMXS_MAX_N (one token tile). */
#define AMXS_MIN_N 2
#define AMXS_MAX_N TT

#include <stdlib.h>
static int g_exp = -1;
static size_t g_d = 3;
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

/* A token's block scale and offset correction (kern_act.d, .ns32), [block][token]. */
struct sc {
    float d;
    int32_t ns;
};

/* Where the producer or the consumer stands: panel p (its bytes at pp, rows from r), block b. */
struct pos {
    const uint8_t *pp;
    size_t r, b;
};

INLINE void pos_next(struct pos *q, size_t nb, size_t pstride, int pstep)
{
    if (++q->b == nb) {
        q->b = 0;
        q->pp += pstride * (size_t)pstep;
        q->r += PANEL * (size_t)pstep;
    }
}

/* acc + w . (x[0..3] in every lane): vpdpbusd with an embedded {1to16} broadcast operand (as
 * x86/avx512_q.c's dpbusd_bcast). */
INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *x)
{
    __asm__("vpdpbusd %[m]%{1to16%}, %[w], %[acc]"
            : [acc] "+v"(acc)
            : [w] "v"(w), [m] "m"(*(const int32_t *)(const void *)x));
    return acc;
}

/* The B operand of block b of panel pp: the nibbles, 8 rows of 64 bytes, into bb; and a
 * prefetch PF bytes ahead in the panel stream (past the panel's end: the next panel). */
INLINE void unpack_b(const uint8_t *pp, size_t nb, size_t b, uint8_t (*bb)[64])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const uint8_t *qb = pp + quant_q4p_qoff(b, nb);
    UNROLL for (int l = 0; l < 5; l++)
        _mm_prefetch((const char *)qb + PF + 64 * l, _MM_HINT_T0);
    UNROLL for (int g = 0; g < 4; g++)
    {
        __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * g));
        _mm512_store_si512((void *)bb[g], _mm512_and_si512(v, m4));
        _mm512_store_si512((void *)bb[4 + g], _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
}

/* Block P's multiply into C tile CT (A tile AT, B tile BT): unpack, load A and B, zero C,
 * tdpbsud. Its tile store is issued D blocks later (STORE_). */
#define PRODUCE_(CT, AT, BT, P, bb)                                                          \
    do {                                                                                     \
        unpack_b((P).pp, nb, (P).b, bb);                                                     \
        _tile_loadd(AT, a->q + (P).b * 32, (long)a->ld);                                     \
        _tile_loadd(BT, bb, 64);                                                             \
        _tile_zero(CT);                                                                      \
        _tile_dpbsud(CT, AT, BT);                                                            \
    } while (0)

/* Block k's sums (C tile k % 4) to the ring. */
INLINE void store_c(size_t k, int32_t (*cs)[PANEL])
{
    switch (k % 4) {
    case 0: _tile_stored(0, cs, 64); break;
    case 1: _tile_stored(1, cs, 64); break;
    case 2: _tile_stored(2, cs, 64); break;
    default: _tile_stored(3, cs, 64); break;
    }
}

/* At the end of a chunk of KC columns (or of the panel): y (+)= acc, acc restarts from 0, as
 * the VNNI kernel's tiles do per chunk. */
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

/*
 * One block of one panel on the VNNI units, kern_gemm_q4_0p_q8_0_avx512's arithmetic (its one
 * panel tile): the accumulator starts at ns32, 8 vpdpbusd per token, then the same float steps.
 */
INLINE void vnni_block(const struct pos *q, size_t nb, const struct kern_act *a,
                       const struct sc *sc, int NT, __m512 acc[TT], float *y, size_t ldy,
                       size_t r1)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const struct sc *sb = sc + q->b * (size_t)NT;
    const uint8_t *qb = q->pp + quant_q4p_qoff(q->b, nb);
    UNROLL for (int l = 0; l < 5; l++)
        _mm_prefetch((const char *)qb + PF + 64 * l, _MM_HINT_T0);
    __m512i ia[TT];
    UNROLL for (int j = 0; j < NT; j++) ia[j] = _mm512_set1_epi32(sb[j].ns);
    UNROLL for (int g = 0; g < 4; g++)
    {
        __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * g));
        __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        UNROLL for (int j = 0; j < NT; j++)
        {
            const int8_t *x = a->q + (size_t)j * a->ld + q->b * 32 + (size_t)g * 4;
            ia[j] = dpbusd_bcast(ia[j], lo, x);
            ia[j] = dpbusd_bcast(ia[j], hi, x + 16);
        }
    }
    __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256((const __m256i *)(const void *)(q->pp + quant_q4p_soff(q->b, nb))));
    UNROLL for (int j = 0; j < NT; j++)
    {
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[j]), _mm512_set1_ps(sb[j].d));
        acc[j] = _mm512_fmadd_ps(f, s, acc[j]);
    }
    flush(q, nb, NT, acc, y, ldy, r1);
}

/*
 * The epilogue of one block: acc[j] = fma((float)(sum[j] + ns) * d_x, d_w, acc[j]) for each
 * token j, the VNNI kernel's float steps; at the end of a chunk of KC columns (or of the
 * panel) y (+)= acc and acc restarts from 0, as the VNNI kernel's tiles do per chunk.
 */
INLINE void consume(const int32_t (*cs)[PANEL], const struct pos *q, size_t nb,
                    const struct sc *sc, int NT, __m512 acc[TT], float *y, size_t ldy,
                    size_t r1)
{
    const struct sc *sb = sc + q->b * (size_t)NT;
    __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256((const __m256i *)(const void *)(q->pp + quant_q4p_soff(q->b, nb))));
    UNROLL for (int j = 0; j < NT; j++)
    {
        __m512i ia = _mm512_add_epi32(_mm512_load_si512((const void *)cs[j]),
                                      _mm512_set1_epi32(sb[j].ns));
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(sb[j].d));
        acc[j] = _mm512_fmadd_ps(f, s, acc[j]);
    }
    flush(q, nb, NT, acc, y, ldy, r1);
}

/* All blocks of panels [r0, r1) for the NT tokens (tiles configured for NT). */
INLINE void run_tiles(const void *wp, const struct kern_act *a, const struct sc *sc, int NT,
                      float *y, size_t ldy, size_t r0, size_t r1, int HYB)
{
    const size_t nb = a->cols / 32, rb = kern__row_bytes(DT_Q4_0, a->cols);
    const size_t pstride = PANEL * rb;
    const int pst = HYB ? 2 : 1; /* hybrid: panel pairs, VNNI on the first, tiles on the second */
    const size_t total = (r1 - r0 + PANEL - 1) / PANEL / (size_t)pst * nb; /* tile blocks */
    int32_t cs[CS_RING][TT][PANEL] __attribute__((aligned(64)));
    uint8_t bb[BB_RING][8][64] __attribute__((aligned(64)));
    __m512 acc[TT];
    UNROLL for (int j = 0; j < NT; j++) acc[j] = _mm512_setzero_ps();
    struct pos pr = {(const uint8_t *)wp + r0 / PANEL * pstride, r0, 0}, co, vq = pr;
    __m512 vacc[TT];
    UNROLL for (int j = 0; j < NT; j++) vacc[j] = _mm512_setzero_ps();
    if (HYB) {
        pr.pp += pstride;
        pr.r += PANEL;
    }
    co = pr;
    size_t i = 0, e = 0; /* blocks multiplied, consumed */
    const size_t D = g_d; /* a block's tile store is issued after the multiply D blocks on */
#define STEP_(CT, AT, BT, ST)                                                                \
    if (i < total) {                                                                         \
        PRODUCE_(CT, AT, BT, pr, bb[i % BB_RING]);                                           \
        pos_next(&pr, nb, pstride, pst);                                                          \
        if (i >= D) {                                                                        \
            if (D == 3) _tile_stored(ST, cs[(i - 3) % CS_RING], 64);                         \
            else store_c(i - D, cs[(i - D) % CS_RING]);                                      \
        }                                                                                    \
        if (HYB) {                                                                           \
            vnni_block(&vq, nb, a, sc, NT, vacc, y, ldy, r1);                                \
            pos_next(&vq, nb, pstride, 2);                                                   \
        }                                                                                    \
        i++;                                                                                 \
        if (i > LAG) {                                                                       \
            consume(cs[e % CS_RING], &co, nb, sc, NT, acc, y, ldy, r1);                      \
            pos_next(&co, nb, pstride, pst);                                                      \
            e++;                                                                             \
        }                                                                                    \
    }
    while (i < total) {
        STEP_(0, 4, 6, 1)
        STEP_(1, 5, 7, 2)
        STEP_(2, 4, 6, 3)
        STEP_(3, 5, 7, 0)
    }
#undef STEP_
    for (size_t k = total > D ? total - D : 0; k < total; k++)
        store_c(k, cs[k % CS_RING]);
    for (; e < total; e++) {
        consume(cs[e % CS_RING], &co, nb, sc, NT, acc, y, ldy, r1);
        pos_next(&co, nb, pstride, pst);
    }
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
     * error path, so failing to get nb x n x 8 bytes aborts */
    struct sc *sc = kern__scratch_slot(1, nb * n * sizeof *sc);
    CHECK(sc != NULL);
    for (size_t b = 0; b < nb; b++)
        for (size_t j = 0; j < n; j++) {
            size_t o = j * a->cp / 32 + b;
            sc[b * n + j] = (struct sc){a->d[o], a->ns32[o]};
        }
    if (g_exp < 0) { g_exp = getenv("AMXS_EXP") ? atoi(getenv("AMXS_EXP")) : 0;
      g_d = getenv("AMXS_D") ? (size_t)atoi(getenv("AMXS_D")) : 3; }
    /* hybrid: pairs of panels up to rh, an odd last panel on the VNNI kernel */
    const int hyb = (g_exp & 64) != 0;
    const size_t npan = (r1 - r0 + PANEL - 1) / PANEL;
    const size_t rh = npan % 2 ? r0 + (npan - 1) * PANEL : r1;
    tiles_config((int)n);
    switch (n) {
#define CASE_(T)                                                                             \
    case T:                                                                                  \
        if (hyb)                                                                             \
            run_tiles(wp, a, sc, T, y, ldy, r0, rh, 1);                                      \
        else                                                                                 \
            run_tiles(wp, a, sc, T, y, ldy, r0, r1, 0);                                      \
        break;
        CASE_(2) CASE_(3) CASE_(4) CASE_(5) CASE_(6) CASE_(7) CASE_(8) CASE_(9) CASE_(10)
        CASE_(11) CASE_(12) CASE_(13) CASE_(14) CASE_(15) CASE_(16)
#undef CASE_
    }
    _tile_release();
    if (hyb && rh < r1) /* (this reuses scratch slot 1: sc is dead) */
        kern_gemm_q4_0p_q8_0_avx512(wp, a, y, ldy, rh, r1);
}
