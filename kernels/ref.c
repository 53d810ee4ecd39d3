/*
 * ref.c — scalar reference kernels: the specification every SIMD variant is tested against.
 * Plain loops, f32 accumulation in index order, no cleverness.
 *
 * kern_matmul_ref is the f32 specification of a product (weights converted exactly, f32
 * activations). The kern_*_ref twins specify what the SIMD variants compute on prepared
 * activations: integer dot products of weight quants (q8_0, q4_0 - 8, mxfp4's doubled E2M1
 * values) with int8 activation quants per block of 32 (scaled by both scales), or products of
 * bf16-rounded activations.
 */
#include "internal.h"
#include "quant.h"

#include "check.h"
#include "half.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- row converters (each type's kern__traits to_f32) ------------------------------------- */

void kern__row_f32(const void *row, float *out, size_t n) { memcpy(out, row, n * sizeof(float)); }

void kern__row_f16(const void *row, float *out, size_t n)
{
    const uint16_t *h = row;
    for (size_t i = 0; i < n; i++)
        out[i] = half_f16_to_f32(h[i]);
}

void kern__row_bf16(const void *row, float *out, size_t n)
{
    const uint16_t *h = row;
    for (size_t i = 0; i < n; i++)
        out[i] = half_bf16_to_f32(h[i]);
}

void kern__row_q8_0(const void *row, float *out, size_t n)
{
    const struct quant_q8_0 *b = row;
    for (size_t i = 0; i < n; i += 32, b++) {
        float d = half_f16_to_f32(b->d);
        for (int j = 0; j < 32; j++)
            out[i + (size_t)j] = d * (float)b->qs[j];
    }
}

void kern__row_q4_0(const void *row, float *out, size_t n)
{
    const struct quant_q4_0 *b = row;
    for (size_t i = 0; i < n; i += 32, b++) {
        float d = half_f16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            out[i + (size_t)j] = d * (float)((int)(b->qs[j] & 0x0f) - 8);
            out[i + (size_t)j + 16] = d * (float)((int)(b->qs[j] >> 4) - 8);
        }
    }
}

void kern__row_mxfp4(const void *row, float *out, size_t n)
{
    const struct quant_mxfp4 *b = row;
    for (size_t i = 0; i < n; i += 32, b++) {
        float d = quant_e8m0_half(b->e); /* kvalues are the E2M1 values doubled */
        for (int j = 0; j < 16; j++) {
            out[i + (size_t)j] = d * (float)quant_mxfp4_kvalues[b->qs[j] & 0x0f];
            out[i + (size_t)j + 16] = d * (float)quant_mxfp4_kvalues[b->qs[j] >> 4];
        }
    }
}

void kern_row_to_f32(enum dtype dt, const void *row, float *out, size_t n)
{
    CHECK((unsigned)dt < DT_COUNT_);
    kern__traits[dt].to_f32(row, out, n);
}

size_t kern__row_bytes(enum dtype wt, size_t cols)
{
    uint64_t row_bytes;
    CHECK(dtype_row_bytes(wt, cols, &row_bytes) == 0);
    return (size_t)row_bytes;
}

/*
 * One output element: dot(W row, x) with f32 accumulation in column order, converting W as
 * it is read, DOT_CHUNK columns at a time (a whole number of blocks of every type: the
 * conversion is exact, so the chunking does not change a bit).
 */
#define DOT_CHUNK 256 /* the k-quants' super-block */
static float dot_row_ref(const struct kern_type_traits *tt, const void *wrow, const float *x,
                         size_t cols)
{
    float tmp[DOT_CHUNK]; /* [DOT_CHUNK] one converted chunk */
    float acc = 0.0f;
    const uint8_t *b = wrow;
    for (size_t c = 0; c < cols; c += DOT_CHUNK) {
        const size_t nc = cols - c < DOT_CHUNK ? cols - c : DOT_CHUNK;
        tt->to_f32(b + c / tt->block * tt->block_bytes, tmp, nc);
        for (size_t j = 0; j < nc; j++)
            acc += tmp[j] * x[c + j];
    }
    return acc;
}

void kern_matmul_ref(enum dtype wt, const void *w, size_t cols, const float *x, size_t n,
                     float *y, size_t ldy, size_t r0, size_t r1)
{
    size_t row_bytes = kern__row_bytes(wt, cols);
    const struct kern_type_traits *tt = &kern__traits[wt];
    const uint8_t *wb = w;
    for (size_t t = 0; t < n; t++)
        for (size_t r = r0; r < r1; r++)
            y[t * ldy + r] = dot_row_ref(tt, wb + r * row_bytes, x + t * cols, cols);
}

void kern__matmul_act_f32(const void *w, const struct kern_act *a, float *y, size_t ldy,
                          size_t r0, size_t r1)
{
    kern_matmul_ref(a->wt, w, a->cols, a->x, a->n, y, ldy, r0, r1);
}

/* ---- twins of the SIMD variants ---------------------------------------------------------- */

/* Weight quant j (0..31) of a block, as the signed integer it stands for (mxfp4: the doubled
 * E2M1 value, quant_mxfp4_kvalues). */
static int block_quant(enum dtype wt, const uint8_t *blk, int j)
{
    if (wt == DT_Q8_0)
        return ((const struct quant_q8_0 *)(const void *)blk)->qs[j];
    if (wt == DT_MXFP4) {
        int byte = ((const struct quant_mxfp4 *)(const void *)blk)->qs[j & 15];
        return quant_mxfp4_kvalues[j < 16 ? (byte & 15) : (byte >> 4)];
    }
    const struct quant_q4_0 *b = (const void *)blk;
    int byte = b->qs[j & 15];
    return (j < 16 ? (byte & 15) : (byte >> 4)) - 8;
}

/* A block's weight scale: its f16 d, or mxfp4's 2^(e-128) (exact either way). */
static float block_scale(enum dtype wt, const uint8_t *blk)
{
    if (wt == DT_MXFP4)
        return quant_e8m0_half(blk[0]);
    uint16_t d16;
    memcpy(&d16, blk, 2);
    return half_f16_to_f32(d16);
}

/* Integer dot products per block of 32, each scaled by weight scale x activation scale. */
static void mm_q8a_ref(enum dtype wt, const void *w, const struct kern_act *a, float *y,
                       size_t ldy, size_t r0, size_t r1)
{
    CHECK(a->wt == wt && a->q);
    size_t row_bytes = kern__row_bytes(wt, a->cols), nb = a->cols / 32;
    size_t bb = dtype_info(wt)->block_bytes;
    for (size_t t = 0; t < a->n; t++) {
        const int8_t *q = a->q + t * a->ld;  /* [cols] */
        const float *d = a->d + t * a->cp / 32; /* [cp/32] */
        for (size_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w + r * row_bytes;
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                int32_t dot = 0;
                for (int j = 0; j < 32; j++)
                    dot += block_quant(wt, blk, j) * q[b * 32 + (size_t)j];
                acc += block_scale(wt, blk) * d[b] * (float)dot;
            }
            y[t * ldy + r] = acc;
        }
    }
}

/* bf16 weights times bf16-rounded activations, f32 accumulation. */
static void mm_bf16a_ref(const void *w, const struct kern_act *a, float *y, size_t ldy,
                         size_t r0, size_t r1)
{
    CHECK(a->wt == DT_BF16 && a->xb);
    const uint16_t *wb = w; /* [rows][cols] */
    for (size_t t = 0; t < a->n; t++) {
        const uint16_t *xb = a->xb + t * a->ld;
        for (size_t r = r0; r < r1; r++) {
            const uint16_t *row = wb + r * a->cols;
            float acc = 0.0f;
            for (size_t c = 0; c < a->cols; c++)
                acc += half_bf16_to_f32(row[c]) * half_bf16_to_f32(xb[c]);
            y[t * ldy + r] = acc;
        }
    }
}

#define F32A_TWIN_(op, wty, DT)                                                              \
    void kern_##op##_##wty##_f32_ref(const void *w, const struct kern_act *a, float *y,      \
                                     size_t ldy, size_t r0, size_t r1)                       \
    {                                                                                        \
        CHECK(a->wt == DT);                                                                  \
        kern_matmul_ref(DT, w, a->cols, a->x, a->n, y, ldy, r0, r1);                         \
    }
#define Q8A_TWIN_(op, wty, DT)                                                               \
    void kern_##op##_##wty##_q8_0_ref(const void *w, const struct kern_act *a, float *y,     \
                                      size_t ldy, size_t r0, size_t r1)                      \
    {                                                                                        \
        mm_q8a_ref(DT, w, a, y, ldy, r0, r1);                                                \
    }

F32A_TWIN_(gemv, f32, DT_F32)
F32A_TWIN_(gemm, f32, DT_F32)
F32A_TWIN_(gemv, f16, DT_F16)
F32A_TWIN_(gemm, f16, DT_F16)
F32A_TWIN_(gemv, bf16, DT_BF16)
F32A_TWIN_(gemm, bf16, DT_BF16)
Q8A_TWIN_(gemv, q8_0, DT_Q8_0)
Q8A_TWIN_(gemm, q8_0, DT_Q8_0)
Q8A_TWIN_(gemv, q4_0, DT_Q4_0)
Q8A_TWIN_(gemm, q4_0, DT_Q4_0)
Q8A_TWIN_(gemv, mxfp4, DT_MXFP4)
Q8A_TWIN_(gemm, mxfp4, DT_MXFP4)

void kern_gemv_bf16_bf16_ref(const void *w, const struct kern_act *a, float *y, size_t ldy,
                             size_t r0, size_t r1)
{
    mm_bf16a_ref(w, a, y, ldy, r0, r1);
}

void kern_gemm_bf16_bf16_ref(const void *w, const struct kern_act *a, float *y, size_t ldy,
                             size_t r0, size_t r1)
{
    mm_bf16a_ref(w, a, y, ldy, r0, r1);
}
