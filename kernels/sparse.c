/*
 * sparse.c — the block-sparse (BSR) f32 GEMV: the scalar specification and its entry
 * (the variant of the active ISA, through kern__ops).
 *
 * The scalar variant is the reference the tests hold every other variant to; it accumulates
 * each row in block order in one f32. The SIMD variants (x86/avx2_sparse.c, avx512_sparse.c)
 * keep the same data flow with 8/16 lanes per row.
 */
#include "internal.h"

void kern_gemv_bsr_f32_ref(const struct kern_bsr *m, const float *x, float *y, size_t b0,
                           size_t b1)
{
    const size_t br = m->br, bc = m->bc, bsz = br * bc;
    for (size_t b = b0; b < b1; b++) {
        const size_t r0 = b * br;
        if (r0 >= m->rows)
            break;
        /* rows of the edge block row past the matrix are zero padding: never computed */
        const size_t nr = m->rows - r0 < br ? m->rows - r0 : br;
        for (size_t i = 0; i < nr; i++) {
            float acc = 0.0f;
            for (uint32_t k = m->row_ptr[b]; k < m->row_ptr[b + 1]; k++) {
                const size_t c0 = (size_t)m->col_idx[k] * bc;
                /* the edge block column is clipped so x is never read past cols */
                const size_t nc = m->cols - c0 < bc ? m->cols - c0 : bc;
                const float *w = m->blocks + (size_t)k * bsz + i * bc;
                for (size_t j = 0; j < nc; j++)
                    acc += w[j] * x[c0 + j];
            }
            y[r0 + i] = acc;
        }
    }
}

void kern_bsr_gemv(const struct kern_bsr *m, const float *x, float *y, size_t b0, size_t b1)
{
    kern__ops.bsr_gemv(m, x, y, b0, b1);
}
