/*
 * lora_kern.c — the LoRA shrink and expand (kern.h, "LoRA shrink and expand"): their scalar
 * specifications and the entries (the weight type's variants of the active ISA, kern__ops).
 *  - f32 activations (_f32_f32, _bf16_f32): products and sums in f32 in column order.
 *  - bf16 activations (_bf16_bf16): x and t rounded to bf16 exactly as vcvtne2ps2bf16 does
 *    (round to nearest even), products exact in f32, sums in f32 in column order.
 */
#include "internal.h"

#include "check.h"
#include "half.h"

#include <math.h>

static inline float ld_w(enum dtype dt, const void *w, size_t i)
{
    return dt == DT_BF16 ? half_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

static void shrink_ref(enum dtype dt, const void *a, size_t in, size_t rank, const float *x,
                       size_t n, float *t, size_t k0, size_t k1)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = k0; k < k1; k++) {
            float acc = 0.0f;
            for (size_t c = 0; c < in; c++)
                acc += x[i * in + c] * ld_w(dt, a, k * in + c);
            t[i * rank + k] = acc;
        }
}

static void expand_ref(enum dtype dt, const void *bt, size_t rank, const float *t, size_t n,
                       const float *scale, float s, float *y, size_t ldy, size_t j0, size_t j1)
{
    const size_t P = KERN_LORA_PANEL;
    for (size_t i = 0; i < n; i++) {
        float si = scale ? scale[i] : s;
        for (size_t j = j0; j < j1; j++) {
            float acc = 0.0f;
            for (size_t k = 0; k < rank; k++)
                acc += t[i * rank + k] * ld_w(dt, bt, (j / P) * rank * P + k * P + j % P);
            y[i * ldy + j] += si * acc;
        }
    }
}

void kern_lora_shrink_f32_f32_ref(const void *a, size_t in, size_t rank, const float *x,
                                  size_t n, float *t, size_t k0, size_t k1)
{
    shrink_ref(DT_F32, a, in, rank, x, n, t, k0, k1);
}

void kern_lora_shrink_bf16_f32_ref(const void *a, size_t in, size_t rank, const float *x,
                                   size_t n, float *t, size_t k0, size_t k1)
{
    shrink_ref(DT_BF16, a, in, rank, x, n, t, k0, k1);
}

void kern_lora_expand_f32_f32_ref(const void *bt, size_t rank, const float *t, size_t n,
                                  const float *scale, float s, float *y, size_t ldy, size_t j0,
                                  size_t j1)
{
    expand_ref(DT_F32, bt, rank, t, n, scale, s, y, ldy, j0, j1);
}

void kern_lora_expand_bf16_f32_ref(const void *bt, size_t rank, const float *t, size_t n,
                                   const float *scale, float s, float *y, size_t ldy,
                                   size_t j0, size_t j1)
{
    expand_ref(DT_BF16, bt, rank, t, n, scale, s, y, ldy, j0, j1);
}

/*
 * The variants of the active ISA for adapters stored in wt (kern__ops, filled from traits.c):
 * on AVX512-BF16, bf16 weights of rank <= KERN_LORA_RANK_MAX take the _bf16_bf16 kernels
 * (activations rounded to bf16, vdpbf16ps; why: ADR 0006 addendum, session 6).
 */
void kern_lora_shrink(enum dtype wt, const void *a, size_t in, size_t rank, const float *x,
                      size_t n, float *t, size_t k0, size_t k1)
{
    CHECK((unsigned)wt < DT_COUNT_);
    const struct kern__type_ops *o = &kern__ops.type[wt];
    CHECK(o->lora_shrink != NULL); /* DT_F32 or DT_BF16 */
    CHECK(k0 <= k1 && k1 <= rank);
    kern_lora_shrink_fn *fn = o->lora_shrink_lowrank && rank <= KERN_LORA_RANK_MAX
                                  ? o->lora_shrink_lowrank
                                  : o->lora_shrink;
    fn(a, in, rank, x, n, t, k0, k1);
}

void kern_lora_expand(enum dtype wt, const void *bt, size_t rank, const float *t, size_t n,
                      const float *scale, float s, float *y, size_t ldy, size_t j0, size_t j1)
{
    CHECK((unsigned)wt < DT_COUNT_);
    const struct kern__type_ops *o = &kern__ops.type[wt];
    CHECK(o->lora_expand != NULL); /* DT_F32 or DT_BF16 */
    CHECK(j0 <= j1);
    kern_lora_expand_fn *fn = o->lora_expand_lowrank && rank <= KERN_LORA_RANK_MAX
                                  ? o->lora_expand_lowrank
                                  : o->lora_expand;
    fn(bt, rank, t, n, scale, s, y, ldy, j0, j1);
}

static inline float bf16_round(float v) { return half_bf16_to_f32(half_f32_to_bf16(v)); }

void kern_lora_shrink_bf16_bf16_ref(const void *a_, size_t in, size_t rank, const float *x,
                                    size_t n, float *t, size_t k0, size_t k1)
{
    const uint16_t *a = a_;
    for (size_t i = 0; i < n; i++)
        for (size_t k = k0; k < k1; k++) {
            float acc = 0.0f;
            for (size_t c = 0; c < in; c++)
                acc += bf16_round(x[i * in + c]) * half_bf16_to_f32(a[k * in + c]);
            t[i * rank + k] = acc;
        }
}

void kern_lora_expand_bf16_bf16_ref(const void *bt_, size_t rank, const float *t, size_t n,
                                    const float *scale, float s, float *y, size_t ldy,
                                    size_t j0, size_t j1)
{
    const uint16_t *bt = bt_;
    const size_t P = KERN_LORA_PANEL;
    for (size_t i = 0; i < n; i++) {
        float si = scale ? scale[i] : s;
        if (si == 0.0f)
            continue;
        for (size_t j = j0; j < j1; j++) {
            float acc = 0.0f;
            for (size_t k = 0; k < rank; k++)
                acc += bf16_round(t[i * rank + k]) *
                       half_bf16_to_f32(bt[(j / P) * rank * P + k * P + j % P]);
            y[i * ldy + j] += si * acc;
        }
    }
}

/* ---- int8 adapter weights (kern.h "LoRA shrink and expand on int8 adapter weights") ---- */

float kern_lora_i8_quant(const float *v, size_t n, int8_t *q)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = v[i] < 0 ? -v[i] : v[i];
        amax = a > amax ? a : amax;
    }
    /* the SIMD kernels compute id and v * id the same way, and cvtps2dq rounds to nearest
     * even like nearbyintf in the default rounding mode */
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (size_t i = 0; i < n; i++)
        q[i] = (int8_t)nearbyintf(v[i] * id);
    return amax / 127.0f;
}

void kern_lora_shrink_i8_ref(const void *a_, size_t in, size_t rank, const float *x, size_t n,
                             float *t, size_t k0, size_t k1)
{
    CHECK(in <= KERN_LORA_I8_IN_MAX);
    const float *sa = a_;
    const uint8_t *q = (const uint8_t *)a_ + KERN_LORA_I8_HDR(rank);
    int8_t qx[KERN_LORA_I8_IN_MAX];
    for (size_t i = 0; i < n; i++) {
        const float sx = kern_lora_i8_quant(x + i * in, in, qx);
        for (size_t k = k0; k < k1; k++) {
            int32_t acc = 0;
            for (size_t c = 0; c < in; c++)
                acc += ((int32_t)q[k * in + c] - 128) * qx[c];
            t[i * rank + k] = sa[k] * (sx * (float)acc);
        }
    }
}

void kern_lora_expand_i8_ref(const void *bt_, size_t rank, const float *t, size_t n,
                             const float *scale, float s, float *y, size_t ldy, size_t j0,
                             size_t j1)
{
    CHECK(rank <= KERN_LORA_RANK_MAX);
    const float *sb = bt_;
    const uint8_t *q = (const uint8_t *)bt_ + KERN_LORA_I8_HDR(rank);
    float u[KERN_LORA_RANK_MAX];
    int8_t qu[KERN_LORA_RANK_MAX];
    for (size_t i = 0; i < n; i++) {
        float si = scale ? scale[i] : s;
        if (si == 0.0f)
            continue;
        for (size_t k = 0; k < rank; k++)
            u[k] = t[i * rank + k] * sb[k];
        const float su = kern_lora_i8_quant(u, rank, qu);
        for (size_t j = j0; j < j1; j++) {
            int32_t acc = 0;
            for (size_t k = 0; k < rank; k++)
                acc += ((int32_t)q[KERN_LORA_I8_BT_INDEX(rank, k, j)] - 128) * qu[k];
            y[i * ldy + j] += si * (su * (float)acc);
        }
    }
}
