/*
 * avx512_kqp.c — the GEMMs on q4_K and q6_K panels repacked at load time
 * (kernels/include/quant.h, "q4_K panels" / "q6_K panels"; why: ADR 0004 addendum "k-quant
 * panels"), with AVX-512 VNNI against the q8_0
 * activations (int8 blocks of 32 with an f32 scale; kern.h struct kern_act). It serves every
 * n: decode (n = 1) and prefill's token tiles. kernels/ref_kq.c (mm_kq_ref) is the
 * specification.
 *
 * The stored-row kernel (avx512_kq.c) unpacks each 144-byte super-block of each row for its
 * tokens: ~59 instructions per row and super-block, compute-bound at n = 1. Here the lanes are
 * the 16 rows of a panel: one 64-byte load is 8 codes (4 bytes, two nibbles each) of 16 rows,
 * split by one and / one shift + and, and each token's 4 activation bytes are broadcast once
 * for 16 rows (vpdpbusd's embedded broadcast); the scales and mins are bytes already. About 15
 * instructions per row and super-block at n = 1 (docs/PERFORMANCE.md "k-quant panels,
 * session 14").
 *
 * Per row, token and sub-block j (activation block b, dx_b its scale, ns32_b = -8 x its quant
 * sum), in the order below, each token in its own f32 accumulator:
 *   acc = fma(float(sum q xq), (d sc_j) x dx_b, acc)
 *   acc = fma(dmin m_j / 8, dx_b x ns32_b, acc)         (= - dmin m_j dx_b sum xq; /8 exact)
 * The integer sums are exact; the f32 steps do not depend on how many tokens share a tile, so
 * a token's outputs are the same bits whatever n and its neighbours (batch invariant).
 */
#include "check.h"
#include "internal.h"
#include "quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AI_ static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define NT_MAX 6     /* tokens per register tile: 2 NT int + NT float accumulators */
#define KQP_PF 8192  /* prefetch distance in the panel's sequential stream */

static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/*
 * Rows [r, r + 16) (one panel pp; rm masks rows past r1) for tokens [t, t + NT): xq the
 * tokens' int8 activations, dx their block scales, mn their min factors dx_b x ns32_b
 * ([n][nb], per call).
 */
AI_ void q4kp_tile(const uint8_t *pp, size_t nsb, const struct kern_act *a, const float *mn,
                   size_t t, int NT, float *y, size_t ldy, size_t r, __mmask16 rm)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const size_t nb = nsb * 8;
    __m512 acc[NT_MAX];
    const int8_t *xq[NT_MAX];
    const float *dx[NT_MAX], *mf[NT_MAX];
    UNROLL for (int u = 0; u < NT; u++)
    {
        acc[u] = _mm512_setzero_ps();
        xq[u] = a->q + (t + (size_t)u) * a->ld;
        dx[u] = a->d + (t + (size_t)u) * a->cp / 32;
        mf[u] = mn + (t + (size_t)u) * nb;
    }
    for (size_t s = 0; s < nsb; s++) {
        const uint8_t *ps = pp + quant_q4kp_off(s);
        UNROLL for (int l = 0; l < 5; l++)
            _mm_prefetch((const char *)ps + KQP_PF + 64 * l, _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(ps + QUANT_Q4KP_D)));
        const __m512 dm = _mm512_mul_ps(
            _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(ps + QUANT_Q4KP_DMIN))),
            _mm512_set1_ps(0.125f));
        UNROLL for (int c = 0; c < 4; c++)
        {
            const uint8_t *qc = ps + QUANT_Q4KP_QS + 512 * (size_t)c;
            UNROLL for (int l = 0; l < 8; l++)
                _mm_prefetch((const char *)qc + KQP_PF + 64 * l, _MM_HINT_T0);
            __m512i lo_acc[NT_MAX], hi_acc[NT_MAX];
            UNROLL for (int u = 0; u < NT; u++) lo_acc[u] = hi_acc[u] = _mm512_setzero_si512();
            UNROLL for (int g = 0; g < 8; g++)
            {
                const __m512i v = _mm512_loadu_si512((const void *)(qc + 64 * (size_t)g));
                const __m512i lo = _mm512_and_si512(v, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                UNROLL for (int u = 0; u < NT; u++)
                {
                    const int8_t *x = xq[u] + s * QUANT_K + 64 * (size_t)c + 4 * (size_t)g;
                    lo_acc[u] = _mm512_dpbusd_epi32(lo_acc[u], lo, _mm512_set1_epi32(load_i32(x)));
                    hi_acc[u] =
                        _mm512_dpbusd_epi32(hi_acc[u], hi, _mm512_set1_epi32(load_i32(x + 32)));
                }
            }
            UNROLL for (int h = 0; h < 2; h++)
            {
                const size_t j = 2 * (size_t)c + (size_t)h, b = s * 8 + j;
                const __m512 dsc = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const void *)(ps + QUANT_Q4KP_SC + 16 * j)))),
                    d);
                const __m512 mm = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const void *)(ps + QUANT_Q4KP_M + 16 * j)))),
                    dm);
                UNROLL for (int u = 0; u < NT; u++)
                {
                    const __m512i dot = h ? hi_acc[u] : lo_acc[u];
                    acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                             _mm512_mul_ps(dsc, _mm512_set1_ps(dx[u][b])), acc[u]);
                    acc[u] = _mm512_fmadd_ps(mm, _mm512_set1_ps(mf[u][b]), acc[u]);
                }
            }
        }
    }
    UNROLL for (int u = 0; u < NT; u++)
        _mm512_mask_storeu_ps(y + (t + (size_t)u) * ldy + r, rm, acc[u]);
}

/*
 * q6_K panels (quant.h "q6_K panels"): per half and group, three loads give four vectors of
 * 6-bit codes (0..63) for 16 rows, each the 4 elements of one sub-block of 16 in every lane.
 * Per row, token and sub-block k (dx its activation block's scale), in the order below:
 *   acc = fma(float(sum q xq - 32 sum xq), (d sc_k) x dx, acc)
 * the -32 offset entering the integer sum as its start value (4 x the sub-block's 4 ns4:
 * exact). The sub-blocks go in the order h, g / 4, then the four vectors, whatever n.
 */
#define NT6_MAX 4

AI_ void q6kp_tile(const uint8_t *pp, size_t nsb, const struct kern_act *a, const int32_t *corr,
                   size_t t, int NT, float *y, size_t ldy, size_t r, __mmask16 rm)
{
    const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const size_t nk = nsb * 16; /* sub-blocks of 16 per row */
    __m512 acc[NT6_MAX];
    const int8_t *xq[NT6_MAX];
    const float *dx[NT6_MAX];
    const int32_t *cr[NT6_MAX];
    UNROLL for (int u = 0; u < NT; u++)
    {
        acc[u] = _mm512_setzero_ps();
        xq[u] = a->q + (t + (size_t)u) * a->ld;
        dx[u] = a->d + (t + (size_t)u) * a->cp / 32;
        cr[u] = corr + (t + (size_t)u) * nk;
    }
    for (size_t s = 0; s < nsb; s++) {
        const uint8_t *ps = pp + quant_q6kp_off(s);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(ps + QUANT_Q6KP_D)));
        UNROLL for (int l = 0; l < 5; l++)
            _mm_prefetch((const char *)ps + KQP_PF + 64 * l, _MM_HINT_T0);
        UNROLL for (int h = 0; h < 2; h++) UNROLL for (int gh = 0; gh < 2; gh++)
        {
            const uint8_t *qh = ps + QUANT_Q6KP_QS + (size_t)(h * 8 + gh * 4) * 3 * 64;
            UNROLL for (int l = 0; l < 12; l++)
                _mm_prefetch((const char *)qh + KQP_PF + 64 * l, _MM_HINT_T0);
            __m512i ia[NT6_MAX][4];
            UNROLL for (int u = 0; u < NT; u++) UNROLL for (int v = 0; v < 4; v++)
                ia[u][v] = _mm512_set1_epi32(cr[u][s * 16 + (size_t)(8 * h + 2 * v + gh)]);
            UNROLL for (int g4 = 0; g4 < 4; g4++)
            {
                const uint8_t *q = qh + (size_t)g4 * 3 * 64;
                const __m512i va = _mm512_loadu_si512((const void *)q);
                const __m512i vb = _mm512_loadu_si512((const void *)(q + 64));
                const __m512i vc = _mm512_loadu_si512((const void *)(q + 128));
                __m512i e[4];
                e[0] = _mm512_or_si512(_mm512_and_si512(va, m0f),
                                       _mm512_and_si512(_mm512_slli_epi16(vc, 4), m30));
                e[1] = _mm512_or_si512(_mm512_and_si512(vb, m0f),
                                       _mm512_and_si512(_mm512_slli_epi16(vc, 2), m30));
                e[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(va, 4), m0f),
                                       _mm512_and_si512(vc, m30));
                e[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(vb, 4), m0f),
                                       _mm512_and_si512(_mm512_srli_epi16(vc, 2), m30));
                UNROLL for (int u = 0; u < NT; u++) UNROLL for (int v = 0; v < 4; v++)
                {
                    const int8_t *x = xq[u] + s * QUANT_K + 128 * (size_t)h + 32 * (size_t)v +
                                      16 * (size_t)gh + 4 * (size_t)g4;
                    ia[u][v] = _mm512_dpbusd_epi32(ia[u][v], e[v], _mm512_set1_epi32(load_i32(x)));
                }
            }
            UNROLL for (int v = 0; v < 4; v++)
            {
                const size_t k = 8 * (size_t)h + 2 * (size_t)v + (size_t)gh; /* in the block */
                const __m512 dsc = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                        _mm_loadu_si128((const void *)(ps + QUANT_Q6KP_SC + 16 * k)))),
                    d);
                UNROLL for (int u = 0; u < NT; u++)
                {
                    const __m512 ls = _mm512_mul_ps(dsc, _mm512_set1_ps(dx[u][s * 8 + k / 2]));
                    acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[u][v]), ls, acc[u]);
                }
            }
        }
    }
    UNROLL for (int u = 0; u < NT; u++)
        _mm512_mask_storeu_ps(y + (t + (size_t)u) * ldy + r, rm, acc[u]);
}

void kern_gemm_q6_kp_q8_0_avx512(const void *wp, const struct kern_act *a, float *y,
                                 size_t ldy, size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q6_K && r0 % QUANT_Q6KP_ROWS == 0);
    const size_t nsb = a->cols / QUANT_K, nk = nsb * 16;
    const size_t pstride = QUANT_Q6KP_ROWS * nsb * QUANT_Q6KP_ROW_BYTES;
    /* each sub-block's -32 x its quant sum [n][nk], once per call (slot 1: see above) */
    int32_t *corr = kern__scratch_slot(1, a->n * nk * sizeof *corr);
    CHECK(corr != NULL);
    for (size_t t = 0; t < a->n; t++) {
        const int32_t *ns4 = a->ns4 + t * a->cp / 4;
        for (size_t k = 0; k < nk; k++)
            corr[t * nk + k] = 4 * (ns4[4 * k] + ns4[4 * k + 1] + ns4[4 * k + 2] + ns4[4 * k + 3]);
    }
    const size_t ntiles = (a->n + NT6_MAX - 1) / NT6_MAX;
    for (size_t r = r0; r < r1; r += QUANT_Q6KP_ROWS) {
        const size_t nr = r1 - r < QUANT_Q6KP_ROWS ? r1 - r : QUANT_Q6KP_ROWS;
        const __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        const uint8_t *pp = (const uint8_t *)wp + r / QUANT_Q6KP_ROWS * pstride;
        size_t nt;
        for (size_t t = 0, ti = 0; t < a->n; t += nt, ti++) {
            nt = (a->n - t + (ntiles - ti) - 1) / (ntiles - ti);
            switch (nt) {
            case 1: q6kp_tile(pp, nsb, a, corr, t, 1, y, ldy, r, rm); break;
            case 2: q6kp_tile(pp, nsb, a, corr, t, 2, y, ldy, r, rm); break;
            case 3: q6kp_tile(pp, nsb, a, corr, t, 3, y, ldy, r, rm); break;
            default: q6kp_tile(pp, nsb, a, corr, t, 4, y, ldy, r, rm); break;
            }
        }
    }
}

/* Token tiles of near-equal size (n = 8: 4 + 4, not 6 + 2): tile ti of ntiles starts at t. */
static inline size_t tile_tokens(size_t n, size_t t, size_t ti, size_t ntiles)
{
    return (n - t + (ntiles - ti) - 1) / (ntiles - ti);
}

void kern_gemm_q4_kp_q8_0_avx512(const void *wp, const struct kern_act *a, float *y,
                                 size_t ldy, size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q4_K && r0 % QUANT_Q4KP_ROWS == 0);
    const size_t nsb = a->cols / QUANT_K, nb = nsb * 8;
    const size_t pstride = QUANT_Q4KP_ROWS * nsb * QUANT_Q4KP_ROW_BYTES; /* bytes of a panel */
    /* the min term's activation factors [n][nb], once per call (the same for every row);
     * slot 1 is free under a panel product (panels.c uses it only on ISAs without this
     * kernel); kernels have no error path, so failing to get them aborts */
    float *mn = kern__scratch_slot(1, a->n * nb * sizeof *mn);
    CHECK(mn != NULL);
    for (size_t t = 0; t < a->n; t++) {
        const float *d = a->d + t * a->cp / 32;
        const int32_t *ns = a->ns32 + t * a->cp / 32;
        for (size_t b = 0; b < nb; b += 8)
            _mm256_storeu_ps(mn + t * nb + b,
                             _mm256_mul_ps(_mm256_loadu_ps(d + b),
                                           _mm256_cvtepi32_ps(_mm256_loadu_si256(
                                               (const void *)(ns + b)))));
    }
    const size_t ntiles = (a->n + NT_MAX - 1) / NT_MAX;
    for (size_t r = r0; r < r1; r += QUANT_Q4KP_ROWS) {
        const size_t nr = r1 - r < QUANT_Q4KP_ROWS ? r1 - r : QUANT_Q4KP_ROWS;
        const __mmask16 rm = (__mmask16)((1u << nr) - 1u);
        const uint8_t *pp = (const uint8_t *)wp + r / QUANT_Q4KP_ROWS * pstride;
        size_t nt;
        for (size_t t = 0, ti = 0; t < a->n; t += nt, ti++) {
            nt = tile_tokens(a->n, t, ti, ntiles);
            switch (nt) { /* constant tile sizes, so the accumulators stay in registers */
            case 1: q4kp_tile(pp, nsb, a, mn, t, 1, y, ldy, r, rm); break;
            case 2: q4kp_tile(pp, nsb, a, mn, t, 2, y, ldy, r, rm); break;
            case 3: q4kp_tile(pp, nsb, a, mn, t, 3, y, ldy, r, rm); break;
            case 4: q4kp_tile(pp, nsb, a, mn, t, 4, y, ldy, r, rm); break;
            case 5: q4kp_tile(pp, nsb, a, mn, t, 5, y, ldy, r, rm); break;
            default: q4kp_tile(pp, nsb, a, mn, t, 6, y, ldy, r, rm); break;
            }
        }
    }
}
