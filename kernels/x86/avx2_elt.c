/*
 * avx2_elt.c — the elementwise kernels with AVX2+FMA (kern.h; the scalar specifications are in
 * kernels/elt.c and kernels/fastmath.h): 8 lanes per ymm, ragged tails with vmaskmovps loads
 * and stores (masked lanes are neither read nor written, so no access past n). No AVX-512
 * instruction here: this file is compiled with -mavx2 -mfma -mf16c only.
 *
 * Bit-identity notes: exp follows fm_expf operation by operation (fmaf as FMA instructions,
 * rintf as round-to-nearest). AVX2 has no vscalefps, so ldexpf(p, n) becomes p * 2^n1 * 2^n2
 * with n1 = n >> 1, n2 = n - n1: for n in [-150, 128] (the clamped range) both factors are
 * normal floats, p * 2^n1 is exact (p is in [0.7, 1.42]) and only the second product rounds,
 * once, as ldexpf does — also into the subnormal range. Clamps put the constant first so a NaN
 * x passes through (minps/maxps return the second operand on NaN). tanh, SiLU, GELU and SwiGLU
 * compute both branches and blend. Only softmax's sum and rmsnorm's sum of squares are
 * reassociated (8 partial sums).
 */
#include "avx2_exp.h"
#include "fastmath.h"
#include "internal.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* tail_mask(r): the first r lanes set (0 < r <= 8), for vmaskmovps. */
static const int32_t g_mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static inline __m256i tail_mask(size_t r)
{
    return _mm256_loadu_si256((const __m256i *)(g_mask_tab + 8 - r));
}
static inline __m256i lane_mask(size_t n, size_t i) { return tail_mask(n - i >= 8 ? 8 : n - i); }

static inline __m256 tanh8(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, x);
    __m256 small = _mm256_cmp_ps(a, _mm256_set1_ps(FM_TANH_SMALL), _CMP_LT_OQ);
    __m256 z = _mm256_mul_ps(a, a);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(FM_TANH_T4), z, _mm256_set1_ps(FM_TANH_T3));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FM_TANH_T2));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FM_TANH_T1));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FM_TANH_T0));
    __m256 ts = _mm256_fmadd_ps(_mm256_mul_ps(p, z), a, a);
    __m256 e = exp8(_mm256_add_ps(a, a));
    __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                             _mm256_div_ps(_mm256_set1_ps(2.0f),
                                           _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    t = _mm256_blendv_ps(t, ts, small);
    return _mm256_or_ps(t, _mm256_and_ps(sign, x)); /* copysignf: t >= 0 or NaN */
}

/* v / (1 + e), or -0 where e overflowed (fm_siluf / fm_geluf). */
static inline __m256 div_1pe(__m256 v, __m256 e)
{
    __m256 y = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 inf = _mm256_cmp_ps(e, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
    return _mm256_blendv_ps(y, _mm256_set1_ps(-0.0f), inf);
}

static inline __m256 silu8(__m256 v)
{
    return div_1pe(v, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v)));
}

static inline __m256 gelu8(__m256 v)
{
    __m256 u = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_set1_ps(FM_GELU_CK), _mm256_mul_ps(v, v),
                                                _mm256_set1_ps(FM_GELU_C)));
    return div_1pe(v, exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u)));
}

/* The loop shared by the unary maps: full vectors, then one masked tail. */
#define MAP8_(y, x, n, f)                                                                    \
    do {                                                                                     \
        size_t i_ = 0;                                                                       \
        for (; i_ + 8 <= (n); i_ += 8)                                                       \
            _mm256_storeu_ps((y) + i_, f(_mm256_loadu_ps((x) + i_)));                        \
        if (i_ < (n)) {                                                                      \
            __m256i k_ = tail_mask((n) - i_);                                                \
            _mm256_maskstore_ps((y) + i_, k_, f(_mm256_maskload_ps((x) + i_, k_)));          \
        }                                                                                    \
    } while (0)

void kern_exp_f32_f32_avx2(float *y, const float *x, size_t n) { MAP8_(y, x, n, exp8); }

void kern_tanh_f32_f32_avx2(float *y, const float *x, size_t n) { MAP8_(y, x, n, tanh8); }

/* x + b, b == NULL meaning no bias; lanes outside k read nothing. */
static inline __m256 load_biased(__m256i k, const float *x, const float *b)
{
    __m256 v = _mm256_maskload_ps(x, k);
    return b ? _mm256_add_ps(v, _mm256_maskload_ps(b, k)) : v;
}

void kern_silu_f32_f32_avx2(float *y, const float *x, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        _mm256_maskstore_ps(y + i, k, silu8(load_biased(k, x + i, b ? b + i : NULL)));
    }
}

void kern_gelu_f32_f32_avx2(float *y, const float *x, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        _mm256_maskstore_ps(y + i, k, gelu8(load_biased(k, x + i, b ? b + i : NULL)));
    }
}

static inline float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void kern_softmax_f32_f32_avx2(float *x, size_t n)
{
    if (n == 0)
        return;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    /* max(v, m) returns m when v is NaN: NaN never wins, as in the _ref loop */
    __m256 mv = ninf;
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, k), _mm256_castsi256_ps(k));
        mv = _mm256_max_ps(v, mv);
    }
    const __m256 m = _mm256_set1_ps(hmax8(mv));
    __m256 sv = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), m));
        sv = _mm256_add_ps(sv, _mm256_and_ps(e, _mm256_castsi256_ps(k))); /* lanes past n: 0 */
        _mm256_maskstore_ps(x + i, k, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum8(sv));
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        _mm256_maskstore_ps(x + i, k, _mm256_mul_ps(_mm256_maskload_ps(x + i, k), inv));
    }
}

void kern_rmsnorm_f32_f32_avx2(float *y, const float *x, const float *w, size_t n, float eps)
{
    __m256 sv = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_maskload_ps(x + i, lane_mask(n, i));
        sv = _mm256_fmadd_ps(v, v, sv);
    }
    const __m256 r = _mm256_set1_ps(1.0f / sqrtf(hsum8(sv) / (float)n + eps));
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        __m256 v = _mm256_mul_ps(r, _mm256_maskload_ps(x + i, k));
        _mm256_maskstore_ps(y + i, k, _mm256_mul_ps(_mm256_maskload_ps(w + i, k), v));
    }
}

void kern_swiglu_f32_f32_avx2(float *y, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        __m256 s = silu8(_mm256_maskload_ps(gate + i, k));
        _mm256_maskstore_ps(y + i, k, _mm256_mul_ps(s, _mm256_maskload_ps(up + i, k)));
    }
}

/* kern_swiglu_clamp: min(a, b) returns b when a is NaN, as the _ref comparisons do. */
void kern_swiglu_clamp_f32_f32_avx2(float *g, const float *u, const float *bg, const float *bu,
                                    size_t n, float alpha, float limit)
{
    const __m256 lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
    const __m256 nalpha = _mm256_set1_ps(-alpha), one = _mm256_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = lane_mask(n, i);
        __m256 gv = _mm256_add_ps(_mm256_maskload_ps(g + i, k), _mm256_maskload_ps(bg + i, k));
        __m256 uv = _mm256_add_ps(_mm256_maskload_ps(u + i, k), _mm256_maskload_ps(bu + i, k));
        gv = _mm256_min_ps(gv, lim);
        uv = _mm256_min_ps(_mm256_max_ps(uv, nlim), lim);
        __m256 s = div_1pe(gv, exp8(_mm256_mul_ps(nalpha, gv)));
        _mm256_maskstore_ps(g + i, k, _mm256_mul_ps(s, _mm256_add_ps(uv, one)));
    }
}

/*
 * v and cs share a layout (pairs), so one load of each gives (v0, v1) and (c, s) in matching
 * lanes: v' = v * c -/+ swap(v) * s, with fmaddsub subtracting in even lanes and adding in odd.
 */
void kern_rope_f32_f32_avx2(float *v, size_t n_heads, size_t hd, const float *cs)
{
    const size_t m = hd & ~(size_t)1; /* whole pairs, as _ref's hd / 2 */
    for (size_t h = 0; h < n_heads; h++) {
        float *p = v + h * hd;
        for (size_t i = 0; i < m; i += 8) {
            __m256i k = lane_mask(m, i);
            __m256 x = _mm256_maskload_ps(p + i, k), t = _mm256_maskload_ps(cs + i, k);
            __m256 c = _mm256_moveldup_ps(t), s = _mm256_movehdup_ps(t);
            __m256 xs = _mm256_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1));
            _mm256_maskstore_ps(p + i, k, _mm256_fmaddsub_ps(x, c, _mm256_mul_ps(xs, s)));
        }
    }
}
