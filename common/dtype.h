/*
 * dtype.h — element types of stored tensors, shared by IEBIN, the converters and the kernels.
 *
 * A tensor's last dimension (its row) is packed per type: plain types store one element after
 * another; block types store rows as whole blocks of `block` elements taking `block_bytes`
 * bytes each (a row's length must be a multiple of the block). Layouts of the block types are
 * those of GGUF (Q8_0: f16 scale d then 32 int8 q, x = d*q; Q4_0: f16 scale d then 16 bytes
 * whose low nibbles are elements 0..15 and high nibbles 16..31, x = d*(q-8)).
 * All size arithmetic is overflow-checked: sizes come from untrusted files.
 */
#ifndef CLOCHER_COMMON_DTYPE_H
#define CLOCHER_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_BF16 = 2,
    DT_Q8_0 = 3,
    DT_Q4_0 = 4,
    DT_COUNT_
};

struct dtype_info {
    const char *name;     /* as written in model.ie.json: "f32", "f16", "bf16", "q8_0", "q4_0" */
    uint32_t block;       /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
};

/* NULL for an out-of-range value. */
const struct dtype_info *dtype_info(enum dtype dt);
/* 0 and *out set, or ERR_NOT_FOUND for an unknown name. */
int dtype_from_name(const char *name, enum dtype *out);

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
        return -10005; /* ERR_OVERFLOW */
    *out = r;
    return 0;
}

static inline int dtype_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return -10005; /* ERR_OVERFLOW */
    *out = r;
    return 0;
}

#endif
