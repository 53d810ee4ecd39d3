/*
 * avx2_float.c — AVX2+FMA+F16C kernels for f32, f16 and bf16 weights (compiled with -mavx2
 * -mfma -mf16c).
 *
 * Same scheme as avx512_float.c with 8-wide registers: an NR x NT register tile loads and
 * widens each row's 8 weights once per step and multiplies them into every token's
 * accumulator; rows are the outer loop so a tile of rows is read from memory once. AVX2 has no
 * masked 16-bit loads, so a ragged column tail (< 8) is copied into zero-padded locals.
 */
#include "internal.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

enum wk { WK_F32, WK_F16, WK_BF16 };

static const size_t elem_bytes[] = {[WK_F32] = 4, [WK_F16] = 2, [WK_BF16] = 2};

INLINE __m256 load_w(enum wk k, const void *p)
{
    switch (k) {
    case WK_F32:
        return _mm256_loadu_ps(p);
    case WK_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128(p));
    case WK_BF16:
    default:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
    }
}

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* NR x NT register tile; small tiles keep U accumulators per output (round-robin over steps)
 * so at least 4 FMA chains are in flight. */
INLINE void tile(enum wk k, const uint8_t *w, size_t rb, size_t r, int NR, const float *x,
                 size_t ldx, size_t cols, size_t t, int NT, float *y, size_t ldy)
{
    const size_t eb = elem_bytes[k];
    const int U = NR * NT >= 4 ? 1 : NR * NT >= 2 ? 2 : 4;
    __m256 acc[4][6][4];
    const uint8_t *rows[4];
    const float *xs[6];
    UNROLL for (int i = 0; i < NR; i++)
    {
        rows[i] = w + (r + (size_t)i) * rb;
        UNROLL for (int j = 0; j < NT; j++) UNROLL for (int u = 0; u < U; u++) acc[i][j][u] =
            _mm256_setzero_ps();
    }
    UNROLL for (int j = 0; j < NT; j++) xs[j] = x + (t + (size_t)j) * ldx;

    size_t c = 0;
    for (; c + 8 * (size_t)U <= cols; c += 8 * (size_t)U) {
        UNROLL for (int u = 0; u < U; u++)
        {
            size_t cu = c + 8 * (size_t)u;
            __m256 wv[4];
            UNROLL for (int i = 0; i < NR; i++) wv[i] = load_w(k, rows[i] + cu * eb);
            UNROLL for (int j = 0; j < NT; j++)
            {
                __m256 xv = _mm256_loadu_ps(xs[j] + cu);
                UNROLL for (int i = 0; i < NR; i++) acc[i][j][u] =
                    _mm256_fmadd_ps(wv[i], xv, acc[i][j][u]);
            }
        }
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 wv[4];
        UNROLL for (int i = 0; i < NR; i++) wv[i] = load_w(k, rows[i] + c * eb);
        UNROLL for (int j = 0; j < NT; j++)
        {
            __m256 xv = _mm256_loadu_ps(xs[j] + c);
            UNROLL for (int i = 0; i < NR; i++) acc[i][j][0] = _mm256_fmadd_ps(wv[i], xv, acc[i][j][0]);
        }
    }
    if (c < cols) { /* ragged tail: zero-padded copies, never a read past the row */
        size_t rem = cols - c;
        __m256 wv[4];
        UNROLL for (int i = 0; i < NR; i++)
        {
            uint8_t buf[32] = {0};
            memcpy(buf, rows[i] + c * eb, rem * eb);
            wv[i] = load_w(k, buf);
        }
        UNROLL for (int j = 0; j < NT; j++)
        {
            float xb[8] = {0};
            memcpy(xb, xs[j] + c, rem * sizeof(float));
            __m256 xv = _mm256_loadu_ps(xb);
            UNROLL for (int i = 0; i < NR; i++) acc[i][j][0] = _mm256_fmadd_ps(wv[i], xv, acc[i][j][0]);
        }
    }
    UNROLL for (int j = 0; j < NT; j++) UNROLL for (int i = 0; i < NR; i++)
    {
        __m256 sum = acc[i][j][0];
        UNROLL for (int u = 1; u < U; u++) sum = _mm256_add_ps(sum, acc[i][j][u]);
        y[(t + (size_t)j) * ldy + r + (size_t)i] = hsum8(sum);
    }
}

#define TILE_CASES_(CALL)                                                                    \
    CALL(1, 1) CALL(1, 2) CALL(1, 3) CALL(1, 4) CALL(1, 5) CALL(1, 6)                        \
    CALL(2, 1) CALL(2, 2) CALL(2, 3) CALL(2, 4) CALL(2, 5) CALL(2, 6)                        \
    CALL(3, 1) CALL(3, 2) CALL(3, 3) CALL(3, 4) CALL(4, 1) CALL(4, 2)

INLINE void mm_float(enum wk k, const void *w, const struct kern_act *a, float *y, size_t ldy,
                     size_t r0, size_t r1, size_t NR, size_t NT)
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
        if (R <= NR && T <= NT)                                                              \
            tile(k, w, rb, r, R, a->xf, a->ld, a->cols, t, T, y, ldy);                        \
        break;
                TILE_CASES_(CALL_)
#undef CALL_
            }
        }
    }
}

/* gemv: 1 row x up to 2 tokens (a single sequential stream, see avx512_float.c).
 * gemm: 2 rows x 6 tokens (15 of 16 registers). */
#define GEMV_NR 1
#define GEMV_NT 2
#define GEMM_NR 2
#define GEMM_NT 6

#define FLOAT_VARIANTS_(wty, K)                                                              \
    void kern_gemv_##wty##_f32_avx2(const void *w, const struct kern_act *a, float *y,       \
                                    size_t ldy, size_t r0, size_t r1)                        \
    {                                                                                        \
        mm_float(K, w, a, y, ldy, r0, r1, GEMV_NR, GEMV_NT);                                 \
    }                                                                                        \
    void kern_gemm_##wty##_f32_avx2(const void *w, const struct kern_act *a, float *y,       \
                                    size_t ldy, size_t r0, size_t r1)                        \
    {                                                                                        \
        mm_float(K, w, a, y, ldy, r0, r1, GEMM_NR, GEMM_NT);                                 \
    }

FLOAT_VARIANTS_(f32, WK_F32)
FLOAT_VARIANTS_(f16, WK_F16)
FLOAT_VARIANTS_(bf16, WK_BF16)
