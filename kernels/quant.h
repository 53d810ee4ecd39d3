/*
 * quant.h — byte layouts of the quantized weight blocks (common/dtype.h names the types) and
 * the scalar quantize/dequantize rules every kernel path shares.
 *
 * The structs document the layout and let code index blocks; rows are arrays of them with no
 * padding, which the static_asserts guarantee. Stored blocks are only 2-byte aligned (an f16
 * scale then bytes), so SIMD code loads them unaligned.
 */
#ifndef CLOCHER_KERNELS_QUANT_H
#define CLOCHER_KERNELS_QUANT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define QUANT_BLOCK 32 /* elements per block of every block type */

/* GGUF Q8_0: x[i] = d * qs[i]. */
struct quant_q8_0 {
    uint16_t d;     /* f16 scale */
    int8_t qs[32];
};

/* GGUF Q4_0: x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8), i < 16. */
struct quant_q4_0 {
    uint16_t d;     /* f16 scale */
    uint8_t qs[16]; /* low nibbles: elements 0..15, high nibbles: elements 16..31 */
};

static_assert(sizeof(struct quant_q8_0) == 34, "q8_0 block must be 34 bytes (GGUF)");
static_assert(sizeof(struct quant_q4_0) == 18, "q4_0 block must be 18 bytes (GGUF)");
static_assert(offsetof(struct quant_q8_0, qs) == 2, "q8_0 quants follow the scale");
static_assert(offsetof(struct quant_q4_0, qs) == 2, "q4_0 quants follow the scale");
static_assert(_Alignof(struct quant_q8_0) == 2 && _Alignof(struct quant_q4_0) == 2,
              "block arrays are packed back to back");

/*
 * Activations are quantized per block of 32 to int8 with an f32 scale (q8_0 style but f32, so
 * the scale itself adds no error): d = max|x| / 127, q = round-half-even(x / d) in [-127, 127].
 * Per element |x - d*q| <= d/2, hence for a dot product with weights w:
 *     |sum w*x - sum w*d*q| <= sum_blocks (d_b / 2) * sum_{i in b} |w_i|
 *                           <= (1/254) * sum_blocks max|x_b| * sum_{i in b} |w_i|.
 * Tests assert that bound (plus float rounding) against the f32 reference.
 */
#define QUANT_ACT_QMAX 127

#endif
