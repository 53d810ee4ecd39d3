/*
 * elt.c — the elementwise kernels' scalar specifications (kern_<op>_f32_f32_ref) and the
 * entries that run the variant of kern_isa() through kern__ops (kern.h states contracts and
 * error bounds).
 *
 * The _ref functions are written to be read: one loop per pass, fastmath.h for exp/tanh/
 * SiLU/GELU. The SIMD twins (x86/avx2_elt.c, x86/avx512_elt.c) follow them operation by
 * operation; only reductions (softmax's sum, rmsnorm's sum of squares) are reassociated.
 *
 * NOTES: stateless and reentrant; the table is read per call (kern_force_isa() in tests
 * refills it between calls, never during one).
 */
#include "fastmath.h"
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* ---- scalar specifications --------------------------------------------------------------- */

void kern_exp_f32_f32_ref(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = fm_expf(x[i]);
}

void kern_tanh_f32_f32_ref(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = fm_tanhf(x[i]);
}

void kern_silu_f32_f32_ref(float *y, const float *x, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = fm_siluf(b ? x[i] + b[i] : x[i]);
}

void kern_gelu_f32_f32_ref(float *y, const float *x, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = fm_geluf(b ? x[i] + b[i] : x[i]);
}

void kern_softmax_f32_f32_ref(float *x, size_t n)
{
    if (n == 0)
        return;
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (x[i] > m) /* NaN never wins the maximum: it makes the row NaN through exp */
            m = x[i];
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = fm_expf(x[i] - m);
        s += x[i];
    }
    float inv = 1.0f / s;
    for (size_t i = 0; i < n; i++)
        x[i] *= inv;
}

void kern_rmsnorm_f32_f32_ref(float *y, const float *x, const float *w, size_t n, float eps)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        y[i] = w[i] * (r * x[i]);
}

void kern_swiglu_f32_f32_ref(float *y, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = fm_siluf(gate[i]) * up[i];
}

void kern_swiglu_clamp_f32_f32_ref(float *g, const float *u, const float *bg, const float *bu,
                                   size_t n, float alpha, float limit)
{
    for (size_t i = 0; i < n; i++) {
        float gv = g[i] + bg[i], uv = u[i] + bu[i];
        gv = gv < limit ? gv : limit;
        uv = uv > -limit ? uv : -limit;
        uv = uv < limit ? uv : limit;
        float e = fm_expf(-alpha * gv);
        g[i] = (e == INFINITY ? -0.0f : gv / (1.0f + e)) * (uv + 1.0f);
    }
}

void kern_rope_f32_f32_ref(float *v, size_t n_heads, size_t hd, const float *cs)
{
    for (size_t h = 0; h < n_heads; h++)
        for (size_t i = 0; i < hd / 2; i++) {
            float *p = v + h * hd + 2 * i;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float v0 = p[0], v1 = p[1];
            p[0] = v0 * c - v1 * s;
            p[1] = v0 * s + v1 * c;
        }
}

void kern_rope_table(float *cs, uint32_t pos, const float *inv_freq, size_t half)
{
    for (size_t i = 0; i < half; i++) {
        double angle = (double)pos * (double)inv_freq[i];
        cs[2 * i + 0] = (float)cos(angle);
        cs[2 * i + 1] = (float)sin(angle);
    }
}

/* ---- entries: the variants of kern__ops (internal.h) --------------------------------------- */

void kern_exp(float *y, const float *x, size_t n) { kern__ops.exp(y, x, n); }
void kern_tanh(float *y, const float *x, size_t n) { kern__ops.tanh(y, x, n); }
void kern_silu(float *y, const float *x, const float *b, size_t n) { kern__ops.silu(y, x, b, n); }
void kern_gelu(float *y, const float *x, const float *b, size_t n) { kern__ops.gelu(y, x, b, n); }
void kern_softmax(float *x, size_t n) { kern__ops.softmax(x, n); }
void kern_rmsnorm(float *y, const float *x, const float *w, size_t n, float eps)
{
    kern__ops.rmsnorm(y, x, w, n, eps);
}
void kern_swiglu(float *y, const float *gate, const float *up, size_t n)
{
    kern__ops.swiglu(y, gate, up, n);
}
void kern_rope(float *v, size_t n_heads, size_t hd, const float *cs)
{
    kern__ops.rope(v, n_heads, hd, cs);
}
void kern_swiglu_clamp(float *g, const float *u, const float *bg, const float *bu, size_t n,
                       float alpha, float limit)
{
    kern__ops.swiglu_clamp(g, u, bg, bu, n, alpha, limit);
}
