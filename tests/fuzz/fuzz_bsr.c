/*
 * fuzz_bsr.c — libFuzzer harness for the block-sparse (BSR) loader (bsr_open_mem). On inputs
 * it accepts, it checks what the kernels will rely on (row pointers monotone and ending at
 * nnzb, block columns in range and increasing) and, for matrices small enough to expand,
 * runs the GEMV on the scalar and the dispatched path and the dense round trip
 * (BSR -> dense -> BSR -> dense is exact), aborting if any promise does not hold. ASan finds
 * any read past x, y or the image.
 */
#include "fuzz.h"

#include "bsr.h"
#include "kern_variants.h"
#include "log.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (kern_init() != 0)
        abort();
    struct bsr *m = NULL;
    if (bsr_open_mem("<fuzz>", data, size, &m) != 0) {
        if (m)
            abort();
        return 0;
    }
    const struct kern_bsr *k = &m->k;
    if (k->row_ptr[0] != 0 || k->row_ptr[m->nbr] != m->nnzb)
        abort();
    for (uint64_t b = 0; b < m->nbr; b++) {
        if (k->row_ptr[b + 1] < k->row_ptr[b])
            abort();
        for (uint64_t i = k->row_ptr[b]; i < k->row_ptr[b + 1]; i++)
            if (k->col_idx[i] >= m->nbc || (i > k->row_ptr[b] && k->col_idx[i] <= k->col_idx[i - 1]))
                abort();
    }
    if ((uint64_t)k->rows * k->cols <= (1u << 16)) {
        float *x = malloc(k->cols * sizeof(float)), *y = malloc(k->rows * sizeof(float)),
              *y2 = malloc(k->rows * sizeof(float)),
              *d = malloc(k->rows * k->cols * sizeof(float)),
              *d2 = malloc(k->rows * k->cols * sizeof(float));
        if (!x || !y || !y2 || !d || !d2)
            abort();
        for (size_t c = 0; c < k->cols; c++)
            x[c] = (float)(c % 7) - 3.0f;
        /* both paths must stay inside x, y and the image (their agreement within a bound
           is tests/bsr's job: here the values are arbitrary bits) */
        kern_gemv_bsr_f32_ref(k, x, y, 0, (size_t)m->nbr);
        bsr_gemv(m, x, y2);
        bsr_to_dense(m, d);
        struct bsr *m2 = NULL;
        if (bsr_from_dense(d, k->rows, k->cols, k->cols, (uint32_t)k->br, (uint32_t)k->bc,
                           0.0f, &m2) != 0)
            abort();
        bsr_to_dense(m2, d2);
        for (size_t i = 0; i < k->rows * k->cols; i++) /* bitwise, except -0.0 and NaN */
            if (!(d[i] == d2[i] || (isnan(d[i]) && isnan(d2[i]))))
                abort();
        if (m2->nnzb > m->nnzb)
            abort();
        bsr_close(m2);
        free(x);
        free(y);
        free(y2);
        free(d);
        free(d2);
    }
    bsr_close(m);
    return 0;
}
