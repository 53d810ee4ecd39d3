/*
 * dtype.h — element types of stored tensors, shared by IEBIN, the converters and the kernels.
 *
 * A tensor's last dimension (its row) is packed per type: plain types store one element after
 * another; block types store rows as whole blocks of `block` elements taking `block_bytes`
 * bytes each (a row's length must be a multiple of the block). Layouts of the block types are
 * those of GGUF (Q8_0: f16 scale d then 32 int8 q, x = d*q; Q4_0: f16 scale d then 16 bytes
 * whose low nibbles are elements 0..15 and high nibbles 16..31, x = d*(q-8)).
 * The int4 group types (docs/IEBIN.md, kernels/include/quant.h) reuse Q4_0's 16-byte nibble arrays,
 * one per 32 elements of the group, after a header: q4_gN (N = 64, 128) has one f16 scale d,
 * x = d*(q-8); q4z_gN (N = 32, 64, 128) has an f16 scale d and an f16 offset m (the group's
 * minimum, a zero point that need not be an integer), x = d*q + m. q4z_g32 is GGUF's Q4_1.
 * MXFP4 (gpt-oss experts; ../shared/specs/gpt-oss.md §4) is GGUF's block_mxfp4, 17 bytes per 32
 * elements: byte 0 the E8M0 exponent e, then 16 bytes whose low nibbles are elements 0..15 and
 * high nibbles 16..31 (split halves, as Q4_0); each nibble an E2M1 code c (bit 3 the sign),
 * x = FP4[c] * 2^(e-127), FP4 = {0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ..., -6}. e = 255 (NaN in
 * the OCP spec) is refused by the converters (docs/IEBIN.md).
 * The k-quants Q4_K, Q5_K, Q6_K are GGUF's block_q4_K / block_q5_K / block_q6_K: super-blocks
 * of 256 elements with 6-bit (q4_K, q5_K: scale and min per 32) or int8 (q6_K: scale per 16)
 * sub-block scales under f16 super-block scales (kernels/include/quant.h has the bytes).
 * All size arithmetic is overflow-checked: sizes come from untrusted files.
 */
#ifndef CLOCHER_COMMON_DTYPE_H
#define CLOCHER_COMMON_DTYPE_H

#include "err.h"

#include <stddef.h>
#include <stdint.h>

enum dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_BF16 = 2,
    DT_Q8_0 = 3,
    DT_Q4_0 = 4,
    DT_Q4_G64 = 5,   /* int4, group 64, f16 scale */
    DT_Q4_G128 = 6,  /* int4, group 128, f16 scale */
    DT_Q4Z_G32 = 7,  /* int4, group 32, f16 scale + f16 offset (GGUF Q4_1) */
    DT_Q4Z_G64 = 8,  /* int4, group 64, f16 scale + f16 offset */
    DT_Q4Z_G128 = 9, /* int4, group 128, f16 scale + f16 offset */
    DT_MXFP4 = 10,   /* OCP MX FP4 (E2M1), blocks of 32 with an E8M0 scale: GGUF's MXFP4 */
    DT_Q4_K = 11,    /* GGUF Q4_K: super-blocks of 256, 144 bytes */
    DT_Q5_K = 12,    /* GGUF Q5_K: super-blocks of 256, 176 bytes */
    DT_Q6_K = 13,    /* GGUF Q6_K: super-blocks of 256, 210 bytes */
    DT_COUNT_,
    /*
     * KV-cache-only element types (worker/engine/kv.h, docs/KV.md "8-bit KV"): per head and
     * position, head_dim 8-bit codes then one f32 scale (x = scale * code), written after a
     * Walsh-Hadamard rotation of the head. Numbered past DT_COUNT_ on purpose: they are not
     * tensor types, so no model file, converter or weight table can name them (dtype_info()
     * is NULL); dtype_kv_name() / dtype_kv_from_name() name every KV element type.
     */
    DT_KV_I8 = 64,   /* int8 codes -127..127 */
    DT_KV_E4M3 = 65, /* OCP FP8 E4M3 (e4m3fn: bias 7, max 448, no infinities) */
};

struct dtype_info {
    const char *name;     /* as written in model.ie.json: "f32", "f16", ..., "q4z_g128" */
    uint32_t block;       /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
};

/* NULL for an out-of-range value. */
const struct dtype_info *dtype_info(enum dtype dt);
/* 0 and *out set, or ERR_NOT_FOUND for an unknown name. */
int dtype_from_name(const char *name, enum dtype *out);

/* true for the int4 group types added after q4_0 (q4_g64 .. q4z_g128): kernels/ref_q4g.c. */
static inline int dtype_is_q4g(enum dtype dt) { return dt >= DT_Q4_G64 && dt <= DT_Q4Z_G128; }
/* Their group size (32, 64, 128) and whether they carry the f16 offset m; 0 for other types. */
static inline uint32_t dtype_q4g_group(enum dtype dt)
{
    static const uint32_t g[] = {64, 128, 32, 64, 128};
    return dtype_is_q4g(dt) ? g[dt - DT_Q4_G64] : 0;
}
static inline int dtype_q4g_has_min(enum dtype dt) { return dt >= DT_Q4Z_G32 && dt <= DT_Q4Z_G128; }
/* true for the GGUF k-quants (q4_k, q5_k, q6_k): kernels/ref_kq.c. */
static inline int dtype_is_kq(enum dtype dt) { return dt >= DT_Q4_K && dt <= DT_Q6_K; }

/* true for the 8-bit KV-cache types (DT_KV_I8, DT_KV_E4M3). */
static inline int dtype_is_kv8(enum dtype dt) { return dt == DT_KV_I8 || dt == DT_KV_E4M3; }
/* The KV cache's element types by name: "f32", "f16", "bf16", "int8" (DT_KV_I8), "fp8"
 * (DT_KV_E4M3). NULL / ERR_NOT_FOUND for anything else (e.g. a weight-only type). */
const char *dtype_kv_name(enum dtype dt);
int dtype_kv_from_name(const char *name, enum dtype *out);

/* Bytes of one row of `n` elements; ERR_FORMAT when n is not a whole number of blocks. */
int dtype_row_bytes(enum dtype dt, uint64_t n, uint64_t *out);

/*
 * Bytes of a tensor of the given shape (row-major, outermost first; the last dimension is the
 * row). Rejects n_dims outside 1..4, any zero dimension, products that overflow 64 bits, and
 * ragged blocks: ERR_RANGE / ERR_OVERFLOW / ERR_FORMAT.
 */
int dtype_tensor_bytes(enum dtype dt, const uint64_t *shape, int n_dims, uint64_t *out);

/* Overflow-checked helpers: 0, or ERR_OVERFLOW leaving *out untouched. */
static inline int dtype_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return ERR_OVERFLOW;
    *out = r;
    return 0;
}

static inline int dtype_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return ERR_OVERFLOW;
    *out = r;
    return 0;
}

#endif
