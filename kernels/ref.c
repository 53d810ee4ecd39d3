/*
 * ref.c — scalar reference kernels: the specification every SIMD variant is tested against.
 * Plain loops, f32 accumulation in index order, no cleverness.
 */
#include "kern.h"
#include "internal.h"

#include "check.h"
#include "half.h"

#include <stdint.h>
#include <string.h>

void kern_row_to_f32(enum dtype dt, const void *row, float *out, size_t n)
{
    switch (dt) {
    case DT_F32:
        memcpy(out, row, n * sizeof(float));
        return;
    case DT_F16: {
        const uint16_t *h = row;
        for (size_t i = 0; i < n; i++)
            out[i] = half_f16_to_f32(h[i]);
        return;
    }
    case DT_BF16: {
        const uint16_t *h = row;
        for (size_t i = 0; i < n; i++)
            out[i] = half_bf16_to_f32(h[i]);
        return;
    }
    case DT_Q8_0: {
        const uint8_t *b = row;
        for (size_t i = 0; i < n; i += 32, b += 34) {
            uint16_t d16;
            memcpy(&d16, b, 2);
            float d = half_f16_to_f32(d16);
            const int8_t *q = (const int8_t *)(b + 2);
            for (int j = 0; j < 32; j++)
                out[i + (size_t)j] = d * (float)q[j];
        }
        return;
    }
    case DT_Q4_0: {
        const uint8_t *b = row;
        for (size_t i = 0; i < n; i += 32, b += 18) {
            uint16_t d16;
            memcpy(&d16, b, 2);
            float d = half_f16_to_f32(d16);
            const uint8_t *q = b + 2;
            for (int j = 0; j < 16; j++) {
                out[i + (size_t)j] = d * (float)((int)(q[j] & 0x0f) - 8);
                out[i + (size_t)j + 16] = d * (float)((int)(q[j] >> 4) - 8);
            }
        }
        return;
    }
    default:
        CHECK(!"kern_row_to_f32: unknown dtype");
    }
}

/* One output element: dot(W row, x) with f32 accumulation, converting W as it is read. */
static float dot_row_ref(enum dtype dt, const void *wrow, const float *x, size_t cols)
{
    float acc = 0.0f;
    switch (dt) {
    case DT_F32: {
        const float *w = wrow;
        for (size_t c = 0; c < cols; c++)
            acc += w[c] * x[c];
        return acc;
    }
    case DT_F16: {
        const uint16_t *w = wrow;
        for (size_t c = 0; c < cols; c++)
            acc += half_f16_to_f32(w[c]) * x[c];
        return acc;
    }
    case DT_BF16: {
        const uint16_t *w = wrow;
        for (size_t c = 0; c < cols; c++)
            acc += half_bf16_to_f32(w[c]) * x[c];
        return acc;
    }
    case DT_Q8_0:
    case DT_Q4_0: {
        float tmp[32];
        const struct dtype_info *di = dtype_info(dt);
        const uint8_t *b = wrow;
        for (size_t c = 0; c < cols; c += 32, b += di->block_bytes) {
            kern_row_to_f32(dt, b, tmp, 32);
            for (int j = 0; j < 32; j++)
                acc += tmp[j] * x[c + (size_t)j];
        }
        return acc;
    }
    default:
        CHECK(!"dot_row_ref: unknown dtype");
        return 0.0f;
    }
}

void kern_matmul_ref(enum dtype wt, const void *w, size_t cols, const float *x, size_t n,
                     float *y, size_t ldy, size_t r0, size_t r1)
{
    uint64_t row_bytes;
    CHECK(dtype_row_bytes(wt, cols, &row_bytes) == 0);
    const uint8_t *wb = w;
    for (size_t t = 0; t < n; t++)
        for (size_t r = r0; r < r1; r++)
            y[t * ldy + r] = dot_row_ref(wt, wb + r * row_bytes, x + t * cols, cols);
}
