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

void kern_lora_i8_quant_x_ref(const float *x, size_t in, size_t n, int8_t *qx, float *xs,
                              int32_t *xsum)
{
    CHECK(in <= KERN_LORA_I8_IN_MAX);
    const size_t ldx = KERN_LORA_I8_LDX(in);
    for (size_t i = 0; i < n; i++) {
        int8_t *q = qx + i * ldx;
        xs[i] = kern_lora_i8_quant(x + i * in, in, q);
        int32_t sum = 0;
        for (size_t c = 0; c < in; c++)
            sum += q[c];
        for (size_t c = in; c < ldx; c++)
            q[c] = 0;
        xsum[i] = sum;
    }
}

void kern_lora_shrink_i8q_ref(const void *a_, size_t in, size_t rank, const int8_t *qx,
                              const float *xs, const int32_t *xsum, size_t n, float *t,
                              size_t k0, size_t k1)
{
    (void)xsum;
    const float *sa = a_;
    const uint8_t *q = (const uint8_t *)a_ + KERN_LORA_I8_HDR(rank);
    const size_t ldx = KERN_LORA_I8_LDX(in);
    for (size_t i = 0; i < n; i++)
        for (size_t k = k0; k < k1; k++) {
            int32_t acc = 0;
            for (size_t c = 0; c < in; c++)
                acc += ((int32_t)q[k * in + c] - 128) * qx[i * ldx + c];
            t[i * rank + k] = sa[k] * (xs[i] * (float)acc);
        }
}

void kern_lora_shrink_i8_ref(const void *a, size_t in, size_t rank, const float *x, size_t n,
                             float *t, size_t k0, size_t k1)
{
    CHECK(in <= KERN_LORA_I8_IN_MAX);
    int8_t qx[KERN_LORA_I8_LDX(KERN_LORA_I8_IN_MAX)];
    float xs;
    int32_t xsum;
    for (size_t i = 0; i < n; i++) { /* one token at a time: its result is its own */
        kern_lora_i8_quant_x_ref(x + i * in, in, 1, qx, &xs, &xsum);
        kern_lora_shrink_i8q_ref(a, in, rank, qx, &xs, &xsum, 1, t + i * rank, k0, k1);
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

void kern_lora_i8_quant_u_ref(const void *bt, size_t rank, const float *t, size_t n,
                              int8_t *qu, float *us, int32_t *usum)
{
    CHECK(rank <= KERN_LORA_RANK_MAX);
    const float *sb = bt;
    const size_t ldu = KERN_LORA_I8_LDU(rank);
    float u[KERN_LORA_RANK_MAX];
    for (size_t i = 0; i < n; i++) {
        int8_t *q = qu + i * ldu;
        for (size_t k = 0; k < rank; k++)
            u[k] = t[i * rank + k] * sb[k];
        us[i] = kern_lora_i8_quant(u, rank, q);
        int32_t sum = 0;
        for (size_t k = 0; k < rank; k++)
            sum += q[k];
        for (size_t k = rank; k < ldu; k++)
            q[k] = 0;
        usum[i] = sum;
    }
}

/* kern_lora_expand_i8_ref's loop on codes made by kern_lora_i8_quant_u_ref: the same bits */
void kern_lora_expand_i8q_ref(const void *bt_, size_t rank, const int8_t *qu, const float *us,
                              const int32_t *usum, size_t n, const float *scale, float s,
                              float *y, size_t ldy, size_t j0, size_t j1)
{
    (void)usum;
    const uint8_t *q = (const uint8_t *)bt_ + KERN_LORA_I8_HDR(rank);
    const size_t ldu = KERN_LORA_I8_LDU(rank);
    for (size_t i = 0; i < n; i++) {
        float si = scale ? scale[i] : s;
        if (si == 0.0f)
            continue;
        for (size_t j = j0; j < j1; j++) {
            int32_t acc = 0;
            for (size_t k = 0; k < rank; k++)
                acc += ((int32_t)q[KERN_LORA_I8_BT_INDEX(rank, k, j)] - 128) * qu[i * ldu + k];
            y[i * ldy + j] += si * (us[i] * (float)acc);
        }
    }
}

/* The pre-quantized int8 shrink's entries (kern.h kern_lora_i8_quant_x): the active ISA's
 * variant, indexed by enum kern_isa like kern_lora_shrink_i8's table in dispatch.c. */
static kern_lora_quant_x_fn *const lora_quant_x[KERN__ISA_COUNT] = {
    kern_lora_i8_quant_x_ref, kern_lora_i8_quant_x_avx2, kern_lora_i8_quant_x_avx512};
static kern_lora_shrink_i8q_fn *const lora_shrink_i8q[KERN__ISA_COUNT] = {
    kern_lora_shrink_i8q_ref, kern_lora_shrink_i8q_avx2, kern_lora_shrink_i8q_avx512};

/* quant_u's AVX2 column is the scalar twin (its codes are the same on every ISA) */
static kern_lora_quant_u_fn *const lora_quant_u[KERN__ISA_COUNT] = {
    kern_lora_i8_quant_u_ref, kern_lora_i8_quant_u_ref, kern_lora_i8_quant_u_avx512};
static kern_lora_expand_i8q_fn *const lora_expand_i8q[KERN__ISA_COUNT] = {
    kern_lora_expand_i8q_ref, kern_lora_expand_i8q_avx2, kern_lora_expand_i8q_avx512};

void kern_lora_i8_quant_u(const void *bt, size_t rank, const float *t, size_t n, int8_t *qu,
                          float *us, int32_t *usum)
{
    CHECK(rank <= KERN_LORA_RANK_MAX && ((uintptr_t)qu & 3) == 0);
    lora_quant_u[kern__ops.isa](bt, rank, t, n, qu, us, usum);
}

void kern_lora_expand_i8q(const void *bt, size_t rank, const int8_t *qu, const float *us,
                          const int32_t *usum, size_t n, const float *scale, float s, float *y,
                          size_t ldy, size_t j0, size_t j1)
{
    CHECK(rank <= KERN_LORA_RANK_MAX && j0 <= j1 && ((uintptr_t)qu & 3) == 0);
    lora_expand_i8q[kern__ops.isa](bt, rank, qu, us, usum, n, scale, s, y, ldy, j0, j1);
}

void kern_lora_i8_quant_x(const float *x, size_t in, size_t n, int8_t *qx, float *xs,
                          int32_t *xsum)
{
    CHECK(in <= KERN_LORA_I8_IN_MAX);
    lora_quant_x[kern__ops.isa](x, in, n, qx, xs, xsum);
}

void kern_lora_shrink_i8q(const void *a, size_t in, size_t rank, const int8_t *qx,
                          const float *xs, const int32_t *xsum, size_t n, float *t, size_t k0,
                          size_t k1)
{
    CHECK(k0 <= k1 && k1 <= rank && in <= KERN_LORA_I8_IN_MAX);
    lora_shrink_i8q[kern__ops.isa](a, in, rank, qx, xs, xsum, n, t, k0, k1);
}

/* ---- bf16 shrink on x rounded once (kern.h kern_lora_bf16_x) ---- */

void kern_lora_bf16_x_ref(const float *x, size_t in, size_t n, uint16_t *xb)
{
    const size_t ldx = KERN_LORA_BF16_LDX(in);
    for (size_t i = 0; i < n; i++) {
        for (size_t c = 0; c < in; c++)
            xb[i * ldx + c] = half_f32_to_bf16(x[i * in + c]);
        for (size_t c = in; c < ldx; c++)
            xb[i * ldx + c] = 0;
    }
}

/* kern_lora_shrink_bf16_bf16_ref's sums in its order on the rounded x: the same bits */
void kern_lora_shrink_bf16x_ref(const void *a_, size_t in, size_t rank, const uint16_t *xb,
                                size_t n, float *t, size_t k0, size_t k1)
{
    const uint16_t *a = a_;
    const size_t ldx = KERN_LORA_BF16_LDX(in);
    for (size_t i = 0; i < n; i++)
        for (size_t k = k0; k < k1; k++) {
            float acc = 0.0f;
            for (size_t c = 0; c < in; c++)
                acc += half_bf16_to_f32(xb[i * ldx + c]) * half_bf16_to_f32(a[k * in + c]);
            t[i * rank + k] = acc;
        }
}

int kern_lora_shrink_rounds_x(enum dtype wt, size_t rank)
{
    CHECK((unsigned)wt < DT_COUNT_);
    return wt == DT_BF16 && kern__ops.type[wt].lora_shrink_lowrank != NULL &&
           rank <= KERN_LORA_RANK_MAX;
}

/* _avx512 where kern_lora_shrink takes the _bf16_bf16 kernels (AVX512-BF16), else _ref */
static int bf16x_fast(void) { return kern__ops.type[DT_BF16].lora_shrink_lowrank != NULL; }

void kern_lora_bf16_x(const float *x, size_t in, size_t n, uint16_t *xb)
{
    CHECK(in <= KERN_LORA_BF16_IN_MAX && ((uintptr_t)xb & 63) == 0);
    (bf16x_fast() ? kern_lora_bf16_x_avx512 : kern_lora_bf16_x_ref)(x, in, n, xb);
}

void kern_lora_shrink_bf16x(const void *a, size_t in, size_t rank, const uint16_t *xb,
                            size_t n, float *t, size_t k0, size_t k1)
{
    CHECK(k0 <= k1 && k1 <= rank && in <= KERN_LORA_BF16_IN_MAX && ((uintptr_t)xb & 63) == 0);
    (bf16x_fast() ? kern_lora_shrink_bf16x_avx512 : kern_lora_shrink_bf16x_ref)(a, in, rank, xb,
                                                                                n, t, k0, k1);
}
