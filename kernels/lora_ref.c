/*
 * lora_ref.c — the scalar specification of the bf16 LoRA shrink and expand (kern.h, "LoRA
 * shrink and expand in bf16"): activations rounded to bf16 exactly as vcvtne2ps2bf16 does
 * (round to nearest even), products exact in f32, sums in f32 in column order.
 */
#include "kern.h"

#include "half.h"

static inline float bf16_round(float v) { return half_bf16_to_f32(half_f32_to_bf16(v)); }

void kern_lora_shrink_bf16_bf16_ref(const uint16_t *a, size_t in, size_t rank, const float *x,
                                    size_t n, float *t, size_t k0, size_t k1)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = k0; k < k1; k++) {
            float acc = 0.0f;
            for (size_t c = 0; c < in; c++)
                acc += bf16_round(x[i * in + c]) * half_bf16_to_f32(a[k * in + c]);
            t[i * rank + k] = acc;
        }
}

void kern_lora_expand_bf16_bf16_ref(const uint16_t *bt, size_t rank, const float *t, size_t n,
                                    const float *scale, float s, float *y, size_t ldy,
                                    size_t j0, size_t j1)
{
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
