/*
 * avx512_float.c — AVX-512 kernels for f32, f16 and bf16 weights (compiled with -mavx512*).
 *
 * gemv: dot products, one row at a time (a single sequential stream), up to 2 tokens sharing
 *   each widened weight vector, several accumulators per output to hide the FMA latency.
 *   bf16 x f32 at n = 1 (decode) has its own loop: shift/AND instead of widening loads, two
 *   row streams (the range's halves) and a software prefetch ahead of each
 *   (kern_gemv_bf16_f32_avx512 below).
 *   Ragged column tails use masked loads (masked-off lanes are never read).
 * gemm: panels of 16 rows x a chunk of columns are widened to f32 (or kept as bf16 pairs) and
 *   transposed so one zmm holds one column (two for bf16) of all 16 rows; each step is then
 *   one FMA (vdpbf16ps) per token with the activation broadcast from memory, and a chunk of
 *   the panel plus the tile's activations stay in L1 while all tokens pass over it. Partial
 *   sums of later chunks are added into y. bf16 tiles span up to 4 panels (64 rows) x 6 tokens,
 *   the panels' pairs interleaved, so each broadcast activation feeds 4 vdpbf16ps.
 *
 * bf16 x bf16 (vdpbf16ps, 32 products per instruction) is the prefill path when the CPU has
 * AVX512-BF16: activations rounded to bf16 (kern_act.xb), f32 accumulation; the bf16 x f32
 * path widens weights exactly at half the peak (docs/PERFORMANCE.md has both measured). Up
 * to 8 tokens (multi-stream decode without AMX) it streams rows instead of packing panels
 * (gemm_bf16_few below).
 */
#include "internal.h"

#include "avx512_common.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

enum wk { WK_F32, WK_F16, WK_BF16 };

/* 16 weights from column c of a row, as f32; lanes outside m read nothing and are 0. */
INLINE __m512 load_w(enum wk k, const void *row, size_t c, __mmask16 m)
{
    switch (k) {
    case WK_F32:
        return _mm512_maskz_loadu_ps(m, (const float *)row + c);
    case WK_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + c));
    case WK_BF16:
    default: {
        __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + c));
        return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    }
    }
}

/*
 * y[t+j][r+i] = W[r+i] . x[t+j] for i < NR, j < NT (compile-time constants after inlining).
 * Small tiles keep U > 1 accumulators per output, used round-robin over steps of 16 columns,
 * so that at least 4 independent FMA chains hide the FMA latency.
 */
INLINE void tile_f32(enum wk k, const uint8_t *w, size_t rb, size_t r, int NR, const float *x,
                     size_t ldx, size_t cols, size_t t, int NT, float *y, size_t ldy)
{
    const int U = NR * NT >= 4 ? 1 : NR * NT >= 2 ? 2 : 4;
    __m512 acc[4][8][4];
    const void *rows[4];
    const float *xs[8];
    UNROLL for (int i = 0; i < NR; i++)
    {
        rows[i] = w + (r + (size_t)i) * rb;
        UNROLL for (int j = 0; j < NT; j++) UNROLL for (int u = 0; u < U; u++) acc[i][j][u] =
            _mm512_setzero_ps();
    }
    UNROLL for (int j = 0; j < NT; j++) xs[j] = x + (t + (size_t)j) * ldx;

    size_t c = 0;
    for (; c + 16 * (size_t)U <= cols; c += 16 * (size_t)U) {
        UNROLL for (int u = 0; u < U; u++)
        {
            size_t cu = c + 16 * (size_t)u;
            __m512 wv[4];
            UNROLL for (int i = 0; i < NR; i++) wv[i] = load_w(k, rows[i], cu, 0xffff);
            UNROLL for (int j = 0; j < NT; j++)
            {
                __m512 xv = _mm512_loadu_ps(xs[j] + cu);
                UNROLL for (int i = 0; i < NR; i++) acc[i][j][u] =
                    _mm512_fmadd_ps(wv[i], xv, acc[i][j][u]);
            }
        }
    }
    for (; c < cols; c += 16) {
        __mmask16 m = cols - c >= 16 ? 0xffff : (__mmask16)((1u << (cols - c)) - 1u);
        __m512 wv[4];
        UNROLL for (int i = 0; i < NR; i++) wv[i] = load_w(k, rows[i], c, m);
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512 xv = _mm512_maskz_loadu_ps(m, xs[j] + c);
            UNROLL for (int i = 0; i < NR; i++) acc[i][j][0] =
                _mm512_fmadd_ps(wv[i], xv, acc[i][j][0]);
        }
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int i = 0; i < NR; i++)
    {
        __m512 sum = acc[i][j][0];
        UNROLL for (int u = 1; u < U; u++) sum = _mm512_add_ps(sum, acc[i][j][u]);
        y[(t + (size_t)j) * ldy + r + (size_t)i] = _mm512_reduce_add_ps(sum);
    }
}

/* bf16 weights x bf16 activations: 32 columns per step, one vdpbf16ps per row and token. */
INLINE void tile_bf16(const uint8_t *w, size_t rb, size_t r, int NR, const uint16_t *xb,
                      size_t ld, size_t cols, size_t t, int NT, float *y, size_t ldy)
{
    __m512 acc[4][8];
    const uint16_t *rows[4];
    const uint16_t *xs[8];
    UNROLL for (int i = 0; i < NR; i++)
    {
        rows[i] = (const uint16_t *)(const void *)(w + (r + (size_t)i) * rb);
        UNROLL for (int j = 0; j < NT; j++) acc[i][j] = _mm512_setzero_ps();
    }
    UNROLL for (int j = 0; j < NT; j++) xs[j] = xb + (t + (size_t)j) * ld;

    size_t c = 0;
    __mmask32 m = 0xffffffffu;
    for (;;) {
        if (c + 32 > cols) {
            if (c >= cols)
                break;
            m = (__mmask32)((1u << (cols - c)) - 1u);
        }
        __m512bh wv[4];
        UNROLL for (int i = 0; i < NR; i++)
            wv[i] = (__m512bh)_mm512_maskz_loadu_epi16(m, rows[i] + c);
        UNROLL for (int j = 0; j < NT; j++)
        {
            /* activations are zero-padded up to cp >= cols rounded up to 64: no mask needed */
            __m512bh xv = (__m512bh)_mm512_loadu_si512(xs[j] + c);
            UNROLL for (int i = 0; i < NR; i++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[i], xv);
        }
        c += 32;
    }
    UNROLL for (int j = 0; j < NT; j++)
        UNROLL for (int i = 0; i < NR; i++)
            y[(t + (size_t)j) * ldy + r + (size_t)i] = _mm512_reduce_add_ps(acc[i][j]);
}

/*
 * Drives tiles of NR x NT over rows [r0, r1) and all tokens; ragged edges run smaller tiles
 * (every (nr, nt) pair is its own unrolled instance).
 */
#define TILE_CASES_(CALL)                                                                    \
    CALL(1, 1) CALL(1, 2) CALL(1, 3) CALL(1, 4) CALL(1, 5) CALL(1, 6) CALL(1, 7) CALL(1, 8)  \
    CALL(2, 1) CALL(2, 2) CALL(2, 3) CALL(2, 4) CALL(2, 5) CALL(2, 6) CALL(2, 7) CALL(2, 8)  \
    CALL(3, 1) CALL(3, 2) CALL(3, 3) CALL(3, 4) CALL(3, 5) CALL(3, 6) CALL(3, 7) CALL(3, 8)  \
    CALL(4, 1) CALL(4, 2) CALL(4, 3) CALL(4, 4)

INLINE void mm_float(enum wk k, int bf16a, const void *w, const struct kern_act *a, float *y,
                     size_t ldy, size_t r0, size_t r1, size_t NR, size_t NT)
{
    static const enum dtype dts[] = {DT_F32, DT_F16, DT_BF16};
    size_t rb = kern__row_bytes(dts[k], a->cols);
    for (size_t r = r0; r < r1; r += NR) {
        size_t nr = r1 - r < NR ? r1 - r : NR;
        for (size_t t = 0; t < a->n; t += NT) {
            size_t nt = a->n - t < NT ? a->n - t : NT;
            switch (nr * 16 + nt) {
#define CALL_(R, T)                                                                          \
    case R * 16 + T:                                                                         \
        if (R <= NR && T <= NT) {                                                            \
            if (bf16a)                                                                       \
                tile_bf16(w, rb, r, R, a->xb, a->ld, a->cols, t, T, y, ldy);                 \
            else                                                                             \
                tile_f32(k, w, rb, r, R, a->xf, a->ld, a->cols, t, T, y, ldy);                \
        }                                                                                    \
        break;
                TILE_CASES_(CALL_)
#undef CALL_
            }
        }
    }
}

/* gemv: 1 row x up to 2 tokens. One row at a time makes decode a single sequential stream,
 * which the hardware prefetchers follow at full bandwidth; tiles of several rows (several
 * short interleaved streams) measured up to 2x slower from DRAM. */
#define GEMV_NR 1
#define GEMV_NT 2

/* ---- gemm: packed panels ------------------------------------------------------------------ */

#define PANEL 16   /* rows per panel: one per lane */
#define FKC 256    /* f32 panel chunk: 256 columns x 16 rows = 16 KiB */
#define BKC 512    /* bf16 panel chunk: 512 columns x 16 rows = 16 KiB */
#define GEMM_NT 12 /* tokens per register tile */
/* bf16 register tiles (gemm_tile_bf16): BF_NP panels x 6 tokens, or BF_SMALL_NP panels x up
 * to 12 tokens when the call has at most BF_SMALL_N (decode of a few streams: 4 interleaved
 * panels x 512 columns, 64 KiB, outgrow L1 between their packing and their few uses, and the
 * 1-panel tile measured as fast or faster at n = 8; docs/PERFORMANCE.md "bf16 prefill tiles") */
#define BF_NP 4
#define BF_SMALL_NP 1
#define BF_SMALL_N 8
#define BF_NT 12 /* tokens per bf16 tile, at most (the array bound) */

/* Rows [r, r+nr) x columns [k0, k0+kc) as f32, transposed: p[c] = column k0+c of 16 rows. */
INLINE void pack_f32(enum wk k, const uint8_t *w, size_t rb, size_t r, size_t nr, size_t k0,
                     size_t kc, __m512 *p)
{
    for (size_t c = 0; c < kc; c += 16) {
        __mmask16 m = kc - c >= 16 ? 0xffff : (__mmask16)((1u << (kc - c)) - 1u);
        __m512i z[16];
        UNROLL for (int i = 0; i < PANEL; i++) z[i] =
            (size_t)i < nr ? _mm512_castps_si512(load_w(k, w + (r + (size_t)i) * rb, k0 + c, m))
                           : _mm512_setzero_si512();
        transpose16(z);
        UNROLL for (int g = 0; g < 16; g++) p[c + (size_t)g] = _mm512_castsi512_ps(z[g]);
    }
}

/* bf16 rows as pairs: p[(c/2) * np] = columns k0+c, k0+c+1 of 16 rows (one dword per row);
 * np > 1 interleaves the panels of a register tile (gemm_tile_bf16). */
INLINE void pack_bf16(const uint8_t *w, size_t rb, size_t r, size_t nr, size_t k0, size_t kc,
                      __m512i *p, size_t np)
{
    for (size_t c = 0; c < kc; c += 32) {
        __mmask32 m = kc - c >= 32 ? 0xffffffffu : (__mmask32)((1u << (kc - c)) - 1u);
        __m512i z[16];
        UNROLL for (int i = 0; i < PANEL; i++) z[i] =
            (size_t)i < nr ? _mm512_maskz_loadu_epi16(
                                 m, (const uint16_t *)(const void *)(w + (r + (size_t)i) * rb) + k0 + c)
                           : _mm512_setzero_si512();
        transpose16(z);
        UNROLL for (int g = 0; g < 16; g++) p[(c / 2 + (size_t)g) * np] = z[g];
    }
}

/* Stores (first chunk) or adds (later chunks) 16 rows of one token, masked to the panel. */
INLINE void put_rows(float *yo, __m512 v, __mmask16 rm, int add)
{
    if (add)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rm, yo));
    _mm512_mask_storeu_ps(yo, rm, v);
}

INLINE void gemm_tile_f32(const __m512 *p, size_t kc, const float *x, size_t ldx, size_t t,
                          int NT, float *y, size_t ldy, size_t r, __mmask16 rm, int add)
{
    __m512 acc[GEMM_NT];
    const float *xs[GEMM_NT];
    UNROLL for (int j = 0; j < NT; j++)
    {
        acc[j] = _mm512_setzero_ps();
        xs[j] = x + (t + (size_t)j) * ldx;
    }
    for (size_t c = 0; c < kc; c++) {
        __m512 wv = p[c];
        UNROLL for (int j = 0; j < NT; j++) acc[j] =
            _mm512_fmadd_ps(wv, _mm512_set1_ps(xs[j][c]), acc[j]);
    }
    UNROLL for (int j = 0; j < NT; j++) put_rows(y + (t + (size_t)j) * ldy + r, acc[j], rm, add);
}

/*
 * bf16 register tile: NP panels (16 rows each) x NT tokens, NP * NT <= 24 accumulators plus NP
 * weight registers. p interleaves the panels' column pairs (p[(c/2) * NP + q] = pair c of
 * panel q), so the tile reads one sequential stream; each step loads NP weight vectors and
 * broadcasts each token's pair once, for NP * NT vdpbf16ps: the 1-panel tile did NT + 1 loads
 * for NT of them and had too few independent chains to fill both pipes (docs/PERFORMANCE.md,
 * "bf16 prefill tiles"). Each output's lane still sums its column pairs in order, so the
 * result is the 1-panel tile's, bit for bit.
 */
INLINE void gemm_tile_bf16(const __m512i *p, int NP, size_t kc, const uint16_t *xb, size_t ldx,
                           size_t t, int NT, float *y, size_t ldy, size_t r, __mmask16 rm_last,
                           int add)
{
    __m512 acc[BF_NP][BF_NT];
    const uint16_t *xs[BF_NT];
    UNROLL for (int j = 0; j < NT; j++)
    {
        UNROLL for (int q = 0; q < NP; q++) acc[q][j] = _mm512_setzero_ps();
        xs[j] = xb + (t + (size_t)j) * ldx;
    }
    for (size_t c = 0; c < kc; c += 2) {
        __m512bh wv[BF_NP];
        UNROLL for (int q = 0; q < NP; q++) wv[q] =
            (__m512bh)p[(c / 2) * (size_t)NP + (size_t)q];
        UNROLL for (int j = 0; j < NT; j++)
        {
            uint32_t pair;
            memcpy(&pair, xs[j] + c, 4);
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)pair);
            UNROLL for (int q = 0; q < NP; q++) acc[q][j] =
                _mm512_dpbf16_ps(acc[q][j], wv[q], xv);
        }
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int q = 0; q < NP; q++)
        put_rows(y + (t + (size_t)j) * ldy + r + 16 * (size_t)q, acc[q][j],
                 q == NP - 1 ? rm_last : (__mmask16)0xffff, add);
}

#define NT_CASES_(CALL)                                                                      \
    CALL(1) CALL(2) CALL(3) CALL(4) CALL(5) CALL(6) CALL(7) CALL(8) CALL(9) CALL(10)         \
    CALL(11) CALL(12)

INLINE void gemm_float(enum wk k, const void *w, const struct kern_act *a, float *y, size_t ldy,
                       size_t r0, size_t r1)
{
    static const enum dtype dts[] = {DT_F32, DT_F16, DT_BF16};
    size_t rb = kern__row_bytes(dts[k], a->cols);
    __m512 p[FKC] __attribute__((aligned(64)));
    for (size_t r = r0; r < r1; r += PANEL) {
        size_t nr = r1 - r < PANEL ? r1 - r : PANEL;
        __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        for (size_t k0 = 0; k0 < a->cols; k0 += FKC) {
            size_t kc = a->cols - k0 < FKC ? a->cols - k0 : FKC;
            pack_f32(k, w, rb, r, nr, k0, kc, p);
            for (size_t t = 0; t < a->n; t += GEMM_NT) {
                size_t nt = a->n - t < GEMM_NT ? a->n - t : GEMM_NT;
                switch (nt) {
#define CALL_(T)                                                                             \
    case T:                                                                                  \
        gemm_tile_f32(p, kc, a->xf + k0, a->ld, t, T, y, ldy, r, rm, k0 > 0);                \
        break;
                    NT_CASES_(CALL_)
#undef CALL_
                }
            }
        }
    }
}

/* Panels [r, r + 16 * np) x columns [k0, k0 + kc) packed for gemm_tile_bf16 (np <= BF_NP). */
static void pack_bf16_group(const void *w, size_t rb, size_t r, size_t r1, size_t np, size_t k0,
                            size_t kc, __m512i *p)
{
    for (size_t q = 0; q < np; q++) {
        size_t rq = r + PANEL * q, nr = r1 - rq < PANEL ? r1 - rq : PANEL;
        pack_bf16(w, rb, rq, nr, k0, kc, p + q, np);
    }
}

/* All tokens over one packed group of NP panels, in tiles of NTMAX tokens (constants after
 * inlining; every (NP, nt) pair is its own unrolled instance). */
INLINE void gemm_group_bf16(const __m512i *p, int NP, int NTMAX, size_t kc,
                            const struct kern_act *a, size_t k0, float *y, size_t ldy, size_t r,
                            __mmask16 rm_last)
{
    for (size_t t = 0; t < a->n; t += (size_t)NTMAX) {
        size_t nt = a->n - t < (size_t)NTMAX ? a->n - t : (size_t)NTMAX;
        switch (nt) {
#define CALL_(T)                                                                             \
    case T:                                                                                  \
        if (T <= NTMAX)                                                                      \
            gemm_tile_bf16(p, NP, kc, a->xb + k0, a->ld, t, T, y, ldy, r, rm_last, k0 > 0);  \
        break;
            NT_CASES_(CALL_)
#undef CALL_
        }
    }
}

static void gemm_bf16(const void *w, const struct kern_act *a, float *y, size_t ldy, size_t r0,
                      size_t r1)
{
    size_t rb = kern__row_bytes(DT_BF16, a->cols);
    __m512i p[BF_NP * BKC / 2] __attribute__((aligned(64)));
    const size_t gnp = a->n <= BF_SMALL_N ? BF_SMALL_NP : BF_NP;
    for (size_t r = r0; r < r1; r += gnp * PANEL) {
        size_t np = (r1 - r + PANEL - 1) / PANEL < gnp ? (r1 - r + PANEL - 1) / PANEL : gnp;
        size_t nr_last = r1 - (r + PANEL * (np - 1));
        __mmask16 rm = (__mmask16)((1u << (nr_last < PANEL ? nr_last : PANEL)) - 1u);
        for (size_t k0 = 0; k0 < a->cols; k0 += BKC) {
            size_t kc = a->cols - k0 < BKC ? a->cols - k0 : BKC;
            pack_bf16_group(w, rb, r, r1, np, k0, kc, p);
            /* tile shapes: as many accumulators as the registers allow (NP * NT <= 24) */
            switch (np) {
            case 1:
                gemm_group_bf16(p, 1, 12, kc, a, k0, y, ldy, r, rm);
                break;
            case 2:
                gemm_group_bf16(p, 2, 12, kc, a, k0, y, ldy, r, rm);
                break;
            case 3:
                gemm_group_bf16(p, 3, 8, kc, a, k0, y, ldy, r, rm);
                break;
            default:
                gemm_group_bf16(p, 4, 6, kc, a, k0, y, ldy, r, rm);
                break;
            }
        }
    }
}

#define GEMM_ONLY_(wty, K)                                                                   \
    void kern_gemm_##wty##_f32_avx512(const void *w, const struct kern_act *a, float *y,     \
                                      size_t ldy, size_t r0, size_t r1)                      \
    {                                                                                        \
        gemm_float(K, w, a, y, ldy, r0, r1);                                                 \
    }
#define FLOAT_VARIANTS_(wty, K)                                                              \
    void kern_gemv_##wty##_f32_avx512(const void *w, const struct kern_act *a, float *y,     \
                                      size_t ldy, size_t r0, size_t r1)                      \
    {                                                                                        \
        mm_float(K, 0, w, a, y, ldy, r0, r1, GEMV_NR, GEMV_NT);                              \
    }                                                                                        \
    void kern_gemm_##wty##_f32_avx512(const void *w, const struct kern_act *a, float *y,     \
                                      size_t ldy, size_t r0, size_t r1)                      \
    {                                                                                        \
        gemm_float(K, w, a, y, ldy, r0, r1);                                                 \
    }

FLOAT_VARIANTS_(f32, WK_F32)
FLOAT_VARIANTS_(f16, WK_F16)
GEMM_ONLY_(bf16, WK_BF16)

/*
 * Decode (n = 1) with bf16 weights: the hot loop of bf16 decode (83% of its profile). A bf16
 * pair read as a dword holds column 2k in its low half and 2k+1 in its high half, so one
 * 64-byte load gives both as f32 with one shift (even columns) and one AND (odd columns),
 * against x split once per call into its even and odd columns: 2 FMAs per 32 weights and no
 * widening loads. Exact like the widening path (bf16 -> f32 is exact; only the order of the
 * f32 additions differs), so the bf16 _ref twin and its tolerance are unchanged.
 * Two sequential streams per thread (session 12): row i of the range's first half and row i
 * of its second half share one loop, as bw_probe's 2-stream variant reads. Each row keeps its
 * own accumulators in the one-row order (same bits), so the loop has 8 independent FMA chains
 * and two streams of misses in flight; with 2 MiB pages, 1 thread, thread CPU time from DRAM
 * this read ~1.15x faster than one row at a time (docs/PERFORMANCE.md "gpt-oss decode, session
 * 12"). Adjacent rows as the pair (one stream twice as wide) measured ~0.7x: the pair must be
 * two distant streams. On top of the hardware prefetchers, which stop at each 4 KiB page, a
 * software prefetch GEMV1_PFD bytes ahead in each stream keeps misses in flight across page
 * boundaries. It may touch up to GEMV1_PFD bytes past a row: prefetches never fault.
 */
#define GEMV1_MAXC 8192 /* x split on the stack: 2 x 16 KiB */
#define GEMV1_PFD 4096

/* S (1 or 2) rows dotted with x, one loop: each row keeps its own four f32 accumulators and
 * reduces them in the same order whatever S is, so a row's bits do not depend on which row
 * shares its loop (the bits are those of the one-row loop before session 12). */
INLINE void gemv1_bf16_rows(int S, const uint16_t *const *rw, const float *xe, const float *xo,
                            size_t cols, float *const *ys)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[2][2][2];
    UNROLL for (int s = 0; s < S; s++) UNROLL for (int u = 0; u < 2; u++) acc[s][u][0] =
        acc[s][u][1] = _mm512_setzero_ps();
    for (size_t c = 0; c < cols; c += 64) {
        UNROLL for (int s = 0; s < S; s++) UNROLL for (int u = 0; u < 2; u++)
        {
            size_t cu = c + 32 * (size_t)u;
            _mm_prefetch((const char *)(rw[s] + cu) + GEMV1_PFD, _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(rw[s] + cu);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            acc[s][u][0] = _mm512_fmadd_ps(we, _mm512_load_ps(xe + cu / 2), acc[s][u][0]);
            acc[s][u][1] = _mm512_fmadd_ps(wo, _mm512_load_ps(xo + cu / 2), acc[s][u][1]);
        }
    }
    UNROLL for (int s = 0; s < S; s++) *ys[s] = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[s][0][0], acc[s][0][1]),
                      _mm512_add_ps(acc[s][1][0], acc[s][1][1])));
}

void kern_gemv_bf16_f32_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                               size_t r0, size_t r1)
{
    size_t cols = a->cols;
    if (a->n != 1 || cols % 64 != 0 || cols > GEMV1_MAXC) {
        mm_float(WK_BF16, 0, w, a, y, ldy, r0, r1, GEMV_NR, GEMV_NT);
        return;
    }
    float xe[GEMV1_MAXC / 2] __attribute__((aligned(64)));
    float xo[GEMV1_MAXC / 2] __attribute__((aligned(64)));
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    for (size_t c = 0; c < cols; c += 32) {
        __m512 lo = _mm512_loadu_ps(a->xf + c), hi = _mm512_loadu_ps(a->xf + c + 16);
        _mm512_store_ps(xe + c / 2, _mm512_permutex2var_ps(lo, ie, hi));
        _mm512_store_ps(xo + c / 2, _mm512_permutex2var_ps(lo, io, hi));
    }
    /* two streams: row i of the range's first half beside row i of its second half */
    const uint16_t *rows = w;
    const size_t half = (r1 - r0) / 2;
    for (size_t i = 0; i < half; i++) {
        const size_t ra = r0 + i, rb = r0 + half + i;
        const uint16_t *rw[2] = {rows + ra * cols, rows + rb * cols};
        float *ys[2] = {y + ra, y + rb};
        gemv1_bf16_rows(2, rw, xe, xo, cols, ys);
    }
    if ((r1 - r0) % 2) {
        const uint16_t *rw[1] = {rows + (r1 - 1) * cols};
        float *ys[1] = {y + r1 - 1};
        gemv1_bf16_rows(1, rw, xe, xo, cols, ys);
    }
}

void kern_gemv_bf16_bf16_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                size_t r0, size_t r1)
{
    mm_float(WK_BF16, 1, w, a, y, ldy, r0, r1, GEMV_NR, GEMV_NT);
}

/*
 * Few tokens (3..FEW_MAX_N: an 8-stream decode step's bf16 products) on AVX512-BF16 without
 * AMX: the panel gemm above spends its time packing (transposing) the weights, which a few
 * tokens cannot amortize: bench/kern_bench --only gptoss-bf16 read ~5 GB/s of weights at
 * n = 8 against ~15 for the one-token gemv. Here each row is read once, sequentially, 32
 * columns (one zmm) at a time, and dotted with every token's bf16 activations (L1-resident:
 * 8 x 2880 x 2 bytes) by one vdpbf16ps each, as the gemv streams: two rows from the range's
 * two halves share a loop (two DRAM streams) with a software prefetch FEW_PFD bytes ahead in
 * each (gemv1's reasons). Each output is one f32 chain over its row's 32-column chunks,
 * reduced at the end: the same products as the panel gemm (exact bf16 x bf16, f32 sums), in
 * another order, so bits differ from it in the last places (kern.h: bf16 x bf16 is not batch
 * invariant; the invariant mode runs the gemv, worker/model/matmul.c).
 */
#define FEW_MAX_N 8
#define FEW_PFD 4096

INLINE void few_rows(int S, int NT, const uint16_t *const *rw, const uint16_t *xb, size_t ldx,
                     size_t cols, float *y, size_t ldy, const size_t *ro)
{
    __m512 acc[2][FEW_MAX_N];
    UNROLL for (int s = 0; s < S; s++) UNROLL for (int j = 0; j < NT; j++) acc[s][j] =
        _mm512_setzero_ps();
    for (size_t c = 0; c < cols; c += 32) {
        __m512i wv[2];
        UNROLL for (int s = 0; s < S; s++)
        {
            _mm_prefetch((const char *)(rw[s] + c) + FEW_PFD, _MM_HINT_T0);
            wv[s] = _mm512_loadu_si512(rw[s] + c);
        }
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + (size_t)j * ldx + c);
            UNROLL for (int s = 0; s < S; s++) acc[s][j] =
                _mm512_dpbf16_ps(acc[s][j], (__m512bh)wv[s], xv);
        }
    }
    UNROLL for (int s = 0; s < S; s++) UNROLL for (int j = 0; j < NT; j++)
        y[(size_t)j * ldy + ro[s]] = _mm512_reduce_add_ps(acc[s][j]);
}

INLINE void gemm_bf16_few_nt(int NT, const uint16_t *rows, const struct kern_act *a, float *y,
                             size_t ldy, size_t r0, size_t r1)
{
    const size_t cols = a->cols, half = (r1 - r0) / 2;
    for (size_t i = 0; i < half; i++) {
        const size_t ro[2] = {r0 + i, r0 + half + i};
        const uint16_t *rw[2] = {rows + ro[0] * cols, rows + ro[1] * cols};
        few_rows(2, NT, rw, a->xb, a->ld, cols, y, ldy, ro);
    }
    if ((r1 - r0) % 2) {
        const size_t ro[1] = {r1 - 1};
        const uint16_t *rw[1] = {rows + ro[0] * cols};
        few_rows(1, NT, rw, a->xb, a->ld, cols, y, ldy, ro);
    }
}

static void gemm_bf16_few(const void *w, const struct kern_act *a, float *y, size_t ldy,
                          size_t r0, size_t r1)
{
    switch (a->n) {
#define CALL_(T)                                                                             \
    case T:                                                                                  \
        gemm_bf16_few_nt(T, w, a, y, ldy, r0, r1);                                           \
        break;
        CALL_(1) CALL_(2) CALL_(3) CALL_(4) CALL_(5) CALL_(6) CALL_(7) CALL_(8)
#undef CALL_
    default:
        gemm_bf16(w, a, y, ldy, r0, r1);
    }
}

void kern_gemm_bf16_bf16_avx512(const void *w, const struct kern_act *a, float *y, size_t ldy,
                                size_t r0, size_t r1)
{
    if (a->n <= FEW_MAX_N && a->cols % 32 == 0)
        gemm_bf16_few(w, a, y, ldy, r0, r1);
    else
        gemm_bf16(w, a, y, ldy, r0, r1);
}

/* the panel gemm at every n (bench/kern_bench --only gptoss-bf16: old against new) */
void kern_gemm_bf16_bf16_avx512_panels(const void *w, const struct kern_act *a, float *y,
                                       size_t ldy, size_t r0, size_t r1)
{
    gemm_bf16(w, a, y, ldy, r0, r1);
}
