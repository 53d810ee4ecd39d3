/*
 * avx512_elt.c — the elementwise kernels with AVX-512 (kern.h; the scalar specifications are
 * in kernels/elt.c and kernels/fastmath.h): 16 lanes per zmm, ragged tails with masked loads
 * and stores (no scalar epilogue, no reads or writes past n).
 *
 * Bit-identity notes: exp follows fm_expf operation by operation (the same fmaf's as FMA
 * instructions, rintf as roundscale to nearest, ldexpf as vscalefps, which also rounds once
 * into the subnormal range); the clamps are min/max with the constant first, which returns the
 * second operand, x, when x is NaN, as fm_expf's explicit NaN test does. tanh, SiLU, GELU and
 * SwiGLU compute both sides of each branch and blend. Only softmax's sum and rmsnorm's sum of
 * squares are reassociated (16 partial sums).
 */
#include "avx512_exp.h"
#include "fastmath.h"
#include "internal.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __mmask16 tail_mask(size_t rem) { return (__mmask16)((1u << rem) - 1u); }

static inline __m512 tanh16(__m512 x)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 a = _mm512_andnot_ps(sign, x);
    __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(FM_TANH_SMALL), _CMP_LT_OQ);
    __m512 z = _mm512_mul_ps(a, a);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(FM_TANH_T4), z, _mm512_set1_ps(FM_TANH_T3));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FM_TANH_T2));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FM_TANH_T1));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FM_TANH_T0));
    __m512 ts = _mm512_fmadd_ps(_mm512_mul_ps(p, z), a, a);
    __m512 e = exp16(_mm512_add_ps(a, a));
    __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                             _mm512_div_ps(_mm512_set1_ps(2.0f),
                                           _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    t = _mm512_mask_mov_ps(t, small, ts);
    return _mm512_or_ps(t, _mm512_and_ps(sign, x)); /* copysignf: t >= 0 or NaN */
}

/* v / (1 + e), or -0 where e overflowed (fm_siluf / fm_geluf). */
static inline __m512 div_1pe(__m512 v, __m512 e)
{
    __m512 y = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    __mmask16 inf = _mm512_cmp_ps_mask(e, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(y, inf, _mm512_set1_ps(-0.0f));
}

static inline __m512 silu16(__m512 v)
{
    return div_1pe(v, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v)));
}

static inline __m512 gelu16(__m512 v)
{
    __m512 u = _mm512_mul_ps(v, _mm512_fmadd_ps(_mm512_set1_ps(FM_GELU_CK), _mm512_mul_ps(v, v),
                                                _mm512_set1_ps(FM_GELU_C)));
    return div_1pe(v, exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u)));
}

/* The loop shared by the unary maps: full vectors, then one masked tail. */
#define MAP16_(y, x, n, f)                                                                   \
    do {                                                                                     \
        size_t i_ = 0;                                                                       \
        for (; i_ + 16 <= (n); i_ += 16)                                                     \
            _mm512_storeu_ps((y) + i_, f(_mm512_loadu_ps((x) + i_)));                        \
        if (i_ < (n)) {                                                                      \
            __mmask16 k_ = tail_mask((n) - i_);                                              \
            _mm512_mask_storeu_ps((y) + i_, k_, f(_mm512_maskz_loadu_ps(k_, (x) + i_)));     \
        }                                                                                    \
    } while (0)

void kern_exp_f32_f32_avx512(float *y, const float *x, size_t n) { MAP16_(y, x, n, exp16); }

void kern_tanh_f32_f32_avx512(float *y, const float *x, size_t n) { MAP16_(y, x, n, tanh16); }

/* x + b, b == NULL meaning no bias; lanes outside k read nothing. */
static inline __m512 load_biased(__mmask16 k, const float *x, const float *b)
{
    __m512 v = _mm512_maskz_loadu_ps(k, x);
    return b ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, b)) : v;
}

void kern_silu_f32_f32_avx512(float *y, const float *x, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, k, silu16(load_biased(k, x + i, b ? b + i : NULL)));
    }
}

void kern_gelu_f32_f32_avx512(float *y, const float *x, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, k, gelu16(load_biased(k, x + i, b ? b + i : NULL)));
    }
}

void kern_softmax_f32_f32_avx512(float *x, size_t n)
{
    if (n == 0)
        return;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    /* max(v, m) returns m when v is NaN: NaN never wins, as in the _ref loop */
    __m512 mv = ninf;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        mv = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, x + i), mv);
    }
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512 sv = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
        sv = _mm512_add_ps(sv, _mm512_maskz_mov_ps(k, e)); /* lanes past n add nothing */
        _mm512_mask_storeu_ps(x + i, k, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
    }
}

void kern_rmsnorm_f32_f32_avx512(float *y, const float *x, const float *w, size_t n, float eps)
{
    __m512 sv = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        sv = _mm512_fmadd_ps(v, v, sv);
    }
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(sv) / (float)n + eps));
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 v = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(k, x + i));
        _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + i), v));
    }
}

void kern_swiglu_f32_f32_avx512(float *y, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 s = silu16(_mm512_maskz_loadu_ps(k, gate + i));
        _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, up + i)));
    }
}

/* kern_swiglu_clamp: min(a, b) returns b when a is NaN, as the _ref comparisons do; -alpha
 * times gv is the same product as _ref's -alpha * gv. */
void kern_swiglu_clamp_f32_f32_avx512(float *g, const float *u, const float *bg, const float *bu,
                                      size_t n, float alpha, float limit)
{
    const __m512 lim = _mm512_set1_ps(limit), nlim = _mm512_set1_ps(-limit);
    const __m512 nalpha = _mm512_set1_ps(-alpha), one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 gv =
            _mm512_add_ps(_mm512_maskz_loadu_ps(k, g + i), _mm512_maskz_loadu_ps(k, bg + i));
        __m512 uv =
            _mm512_add_ps(_mm512_maskz_loadu_ps(k, u + i), _mm512_maskz_loadu_ps(k, bu + i));
        gv = _mm512_min_ps(gv, lim);
        uv = _mm512_min_ps(_mm512_max_ps(uv, nlim), lim);
        __m512 s = div_1pe(gv, exp16(_mm512_mul_ps(nalpha, gv)));
        _mm512_mask_storeu_ps(g + i, k, _mm512_mul_ps(s, _mm512_add_ps(uv, one)));
    }
}

/*
 * v and cs share a layout (pairs), so one load of each gives (v0, v1) and (c, s) in matching
 * lanes: v' = v * c -/+ swap(v) * s, with fmaddsub subtracting in even lanes and adding in odd.
 */
void kern_rope_f32_f32_avx512(float *v, size_t n_heads, size_t hd, const float *cs)
{
    const size_t m = hd & ~(size_t)1; /* whole pairs, as _ref's hd / 2 */
    for (size_t h = 0; h < n_heads; h++) {
        float *p = v + h * hd;
        for (size_t i = 0; i < m; i += 16) {
            __mmask16 k = m - i >= 16 ? (__mmask16)0xffff : tail_mask(m - i);
            __m512 x = _mm512_maskz_loadu_ps(k, p + i), t = _mm512_maskz_loadu_ps(k, cs + i);
            __m512 c = _mm512_moveldup_ps(t), s = _mm512_movehdup_ps(t);
            __m512 xs = _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1));
            _mm512_mask_storeu_ps(p + i, k, _mm512_fmaddsub_ps(x, c, _mm512_mul_ps(xs, s)));
        }
    }
}
