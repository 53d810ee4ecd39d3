/*
 * ref_qbf16.c — the scalar twins of x86/amx_qbf16.c (design (b) of the q4_0 / q8_0 AMX
 * prefill): the same rounded operands, bf16(x) and bf16(q * d), multiplied exactly and summed
 * in f32 column by column. The tile kernel sums in another order, so tests/kern compares them
 * within an f32 summation bound, not bit for bit.
 */
#include "internal.h"

#include "check.h"
#include "half.h"
#include "quant.h"

static float bf16f(float f) { return half_bf16_to_f32(half_f32_to_bf16(f)); }

/* weight (row r, column k) of a q4_0 / q8_0 panel matrix wp, as the tile kernel rounds it */
static float panel_w(enum dtype dt, const uint8_t *wp, size_t cols, size_t r, size_t k)
{
    const size_t nb = cols / 32, pstride = 16 * kern__row_bytes(dt, cols);
    const uint8_t *pp = wp + r / 16 * pstride;
    const size_t b = k / 32, i = r % 16, c = k % 32;
    float d, q;
    if (dt == DT_Q4_0) {
        const uint8_t *s = pp + quant_q4p_soff(b, nb) + 2 * i;
        d = half_f16_to_f32((uint16_t)(s[0] | s[1] << 8));
        size_t g = (c % 16) / 4, j = c % 4;
        uint8_t byte = pp[quant_q4p_qoff(b, nb) + 64 * g + 4 * i + j];
        q = (float)((c < 16 ? byte & 15 : byte >> 4) - 8);
    } else {
        const uint8_t *s = pp + quant_q8p_soff(b, nb) + 2 * i;
        d = half_f16_to_f32((uint16_t)(s[0] | s[1] << 8));
        size_t g = c / 4, j = c % 4;
        q = (float)((int)pp[quant_q8p_qoff(b, nb) + 64 * g + 4 * i + j] - 128);
    }
    return bf16f(q * d);
}

static void gemm_ref(enum dtype dt, const void *wp, const struct kern_act *a, float *y,
                     size_t ldy, size_t r0, size_t r1)
{
    for (size_t t = 0; t < a->n; t++)
        for (size_t r = r0; r < r1; r++) {
            float s = 0.0f;
            for (size_t k = 0; k < a->cols; k++)
                s += bf16f(a->x[t * a->cols + k]) * panel_w(dt, wp, a->cols, r, k);
            y[t * ldy + r] = s;
        }
}

void kern_gemm_q4_0p_bf16_ref(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q4_0 && a->x);
    gemm_ref(DT_Q4_0, wp, a, y, ldy, r0, r1);
}

void kern_gemm_q8_0p_bf16_ref(const void *wp, const struct kern_act *a, float *y, size_t ldy,
                              size_t r0, size_t r1)
{
    CHECK(a->wt == DT_Q8_0 && a->x);
    gemm_ref(DT_Q8_0, wp, a, y, ldy, r0, r1);
}
