/* dtype.c — element type table and overflow-checked size arithmetic (see dtype.h). */
#include "dtype.h"

#include "err.h"

#include <string.h>

static const struct dtype_info infos[DT_COUNT_] = {
    [DT_F32] = {"f32", 1, 4},
    [DT_F16] = {"f16", 1, 2},
    [DT_BF16] = {"bf16", 1, 2},
    [DT_Q8_0] = {"q8_0", 32, 34},
    [DT_Q4_0] = {"q4_0", 32, 18},
    /* header (f16 d [, f16 m]) + 16 bytes per 32 elements: kernels/include/quant.h asserts these */
    [DT_Q4_G64] = {"q4_g64", 64, 34},
    [DT_Q4_G128] = {"q4_g128", 128, 66},
    [DT_Q4Z_G32] = {"q4z_g32", 32, 20},
    [DT_Q4Z_G64] = {"q4z_g64", 64, 36},
    [DT_Q4Z_G128] = {"q4z_g128", 128, 68},
    /* E8M0 exponent + 16 bytes of E2M1 nibbles: kernels/include/quant.h asserts it */
    [DT_MXFP4] = {"mxfp4", 32, 17},
    /* GGUF k-quant super-blocks: kernels/include/quant.h asserts these */
    [DT_Q4_K] = {"q4_k", 256, 144},
    [DT_Q5_K] = {"q5_k", 256, 176},
    [DT_Q6_K] = {"q6_k", 256, 210},
};

const struct dtype_info *dtype_info(enum dtype dt)
{
    if ((unsigned)dt >= DT_COUNT_)
        return NULL;
    return &infos[dt];
}

int dtype_from_name(const char *name, enum dtype *out)
{
    for (int i = 0; i < DT_COUNT_; i++) {
        if (strcmp(infos[i].name, name) == 0) {
            *out = (enum dtype)i;
            return 0;
        }
    }
    return ERR_NOT_FOUND;
}

static const struct {
    const char *name;
    enum dtype dt;
} kv_names[] = {{"f32", DT_F32}, {"f16", DT_F16}, {"bf16", DT_BF16}, {"int8", DT_KV_I8},
                {"fp8", DT_KV_E4M3}};

const char *dtype_kv_name(enum dtype dt)
{
    for (size_t i = 0; i < sizeof kv_names / sizeof kv_names[0]; i++)
        if (kv_names[i].dt == dt)
            return kv_names[i].name;
    return NULL;
}

int dtype_kv_from_name(const char *name, enum dtype *out)
{
    for (size_t i = 0; i < sizeof kv_names / sizeof kv_names[0]; i++) {
        if (strcmp(kv_names[i].name, name) == 0) {
            *out = kv_names[i].dt;
            return 0;
        }
    }
    return ERR_NOT_FOUND;
}

int dtype_row_bytes(enum dtype dt, uint64_t n, uint64_t *out)
{
    const struct dtype_info *di = dtype_info(dt);
    if (!di)
        return ERR_RANGE;
    if (n % di->block != 0)
        return ERR_FORMAT;
    return dtype_mul_u64(n / di->block, di->block_bytes, out);
}

int dtype_tensor_bytes(enum dtype dt, const uint64_t *shape, int n_dims, uint64_t *out)
{
    if (n_dims < 1 || n_dims > 4)
        return ERR_RANGE;
    uint64_t rows = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] == 0)
            return ERR_RANGE;
        if (i < n_dims - 1 && dtype_mul_u64(rows, shape[i], &rows) != 0)
            return ERR_OVERFLOW;
    }
    uint64_t row_bytes;
    int rc = dtype_row_bytes(dt, shape[n_dims - 1], &row_bytes);
    if (rc != 0)
        return rc;
    return dtype_mul_u64(rows, row_bytes, out);
}
