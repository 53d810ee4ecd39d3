/*
 * avx512_sparse.c — the AVX-512 block-sparse (BSR) f32 GEMV (contract: kern.h, kern_bsr_fn).
 *
 * Eight rows of a block row keep their accumulators in registers across the whole block row,
 * so each 16-column slice of x is loaded once per block and feeds eight FMAs, and eight
 * independent FMA chains cover the FMA latency. Columns past the matrix (the edge block
 * column) and past bc are masked off the loads, so x is never read out of bounds; the edge
 * block row computes only the rows inside the matrix. Rows left over when the block has fewer
 * than a multiple of 8 rows take one accumulator each.
 */
#include "kern.h"

#include <immintrin.h>

static inline __mmask16 lanes(size_t n) { return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1u); }

void kern_gemv_bsr_f32_avx512(const struct kern_bsr *m, const float *x, float *y, size_t b0,
                              size_t b1)
{
    const size_t br = m->br, bc = m->bc, bsz = br * bc;
    for (size_t b = b0; b < b1; b++) {
        const size_t r0 = b * br;
        if (r0 >= m->rows)
            break;
        const size_t nr = m->rows - r0 < br ? m->rows - r0 : br;
        const uint32_t k0 = m->row_ptr[b], k1 = m->row_ptr[b + 1];
        size_t i = 0;
        for (; i + 8 <= nr; i += 8) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
                   a6 = a0, a7 = a0;
            for (uint32_t k = k0; k < k1; k++) {
                const size_t c0 = (size_t)m->col_idx[k] * bc;
                const size_t nc = m->cols - c0 < bc ? m->cols - c0 : bc;
                const float *w = m->blocks + (size_t)k * bsz + i * bc;
                for (size_t s = 0; s < nc; s += 16) {
                    const __mmask16 mk = lanes(nc - s);
                    const __m512 xv = _mm512_maskz_loadu_ps(mk, x + c0 + s);
                    const float *ws = w + s;
                    a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws), xv, a0);
                    a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + bc), xv, a1);
                    a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + 2 * bc), xv, a2);
                    a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + 3 * bc), xv, a3);
                    a4 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + 4 * bc), xv, a4);
                    a5 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + 5 * bc), xv, a5);
                    a6 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + 6 * bc), xv, a6);
                    a7 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ws + 7 * bc), xv, a7);
                }
            }
            float *yr = y + r0 + i;
            yr[0] = _mm512_reduce_add_ps(a0);
            yr[1] = _mm512_reduce_add_ps(a1);
            yr[2] = _mm512_reduce_add_ps(a2);
            yr[3] = _mm512_reduce_add_ps(a3);
            yr[4] = _mm512_reduce_add_ps(a4);
            yr[5] = _mm512_reduce_add_ps(a5);
            yr[6] = _mm512_reduce_add_ps(a6);
            yr[7] = _mm512_reduce_add_ps(a7);
        }
        for (; i < nr; i++) {
            __m512 a = _mm512_setzero_ps();
            for (uint32_t k = k0; k < k1; k++) {
                const size_t c0 = (size_t)m->col_idx[k] * bc;
                const size_t nc = m->cols - c0 < bc ? m->cols - c0 : bc;
                const float *w = m->blocks + (size_t)k * bsz + i * bc;
                for (size_t s = 0; s < nc; s += 16) {
                    const __mmask16 mk = lanes(nc - s);
                    a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w + s),
                                        _mm512_maskz_loadu_ps(mk, x + c0 + s), a);
                }
            }
            y[r0 + i] = _mm512_reduce_add_ps(a);
        }
    }
}
