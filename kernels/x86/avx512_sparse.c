/*
 * avx512_sparse.c — the AVX-512 block-sparse (BSR) f32 GEMV (contract: kern.h, kern_bsr_fn).
 *
 * The GEMV is bound by the stream of blocks from DRAM, so the loop order serves the stream:
 * each block is read front to back, row after row, and every row of a block row keeps one
 * 16-lane accumulator in a small array (L1) across all the blocks of that block row. Reading
 * 8 rows of every block and coming back for the next 8 (registers only) touches each 1 KiB
 * 16x16 block in two strided halves and measured half the bandwidth (docs/PERFORMANCE.md,
 * "Block-sparse weights"). Block rows taller than CHUNK rows are done in CHUNK-row slabs.
 * Up to 4 16-column slices of x (bc <= 64, a multiple of 16) stay in registers per block;
 * other widths and the clipped edge block column use masked loads, so x is never read past
 * cols and rows past the matrix are never computed.
 */
#include "internal.h"

#include <immintrin.h>

#define CHUNK 64

static inline __mmask16 lanes(size_t n) { return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1u); }

/* acc[i] += W[i][0..16*NS) . x[0..16*NS) for i < n; NS is a constant after inlining. */
static inline __attribute__((always_inline)) void rows_full(__m512 *acc, size_t n,
                                                            const float *w, size_t bc,
                                                            const float *xc, int ns)
{
    __m512 x0 = _mm512_loadu_ps(xc), x1 = x0, x2 = x0, x3 = x0;
    if (ns > 1)
        x1 = _mm512_loadu_ps(xc + 16);
    if (ns > 2)
        x2 = _mm512_loadu_ps(xc + 32);
    if (ns > 3)
        x3 = _mm512_loadu_ps(xc + 48);
    for (size_t i = 0; i < n; i++, w += bc) {
        __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(w), x0, acc[i]);
        if (ns > 1)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(w + 16), x1, a);
        if (ns > 2)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(w + 32), x2, a);
        if (ns > 3)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(w + 48), x3, a);
        acc[i] = a;
    }
}

/* The same for any width nc <= bc: masked slices (edge block column, odd bc). */
static void rows_masked(__m512 *acc, size_t n, const float *w, size_t bc, const float *xc,
                        size_t nc)
{
    for (size_t i = 0; i < n; i++, w += bc) {
        __m512 a = acc[i];
        for (size_t s = 0; s < nc; s += 16) {
            const __mmask16 mk = lanes(nc - s);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w + s),
                                _mm512_maskz_loadu_ps(mk, xc + s), a);
        }
        acc[i] = a;
    }
}

void kern_gemv_bsr_f32_avx512(const struct kern_bsr *m, const float *x, float *y, size_t b0,
                              size_t b1)
{
    const size_t br = m->br, bc = m->bc, bsz = br * bc;
    const int ns = (bc & 15) == 0 && bc <= 64 ? (int)(bc / 16) : 0;
    __m512 acc[CHUNK];
    for (size_t b = b0; b < b1; b++) {
        const size_t r0 = b * br;
        if (r0 >= m->rows)
            break;
        const size_t nr = m->rows - r0 < br ? m->rows - r0 : br;
        const uint32_t k0 = m->row_ptr[b], k1 = m->row_ptr[b + 1];
        for (size_t i0 = 0; i0 < nr; i0 += CHUNK) {
            const size_t n = nr - i0 < CHUNK ? nr - i0 : CHUNK;
            for (size_t i = 0; i < n; i++)
                acc[i] = _mm512_setzero_ps();
            for (uint32_t k = k0; k < k1; k++) {
                const size_t c0 = (size_t)m->col_idx[k] * bc;
                const float *w = m->blocks + (size_t)k * bsz + i0 * bc;
                if (m->cols - c0 >= bc) {
                    switch (ns) {
                    case 1: rows_full(acc, n, w, bc, x + c0, 1); continue;
                    case 2: rows_full(acc, n, w, bc, x + c0, 2); continue;
                    case 3: rows_full(acc, n, w, bc, x + c0, 3); continue;
                    case 4: rows_full(acc, n, w, bc, x + c0, 4); continue;
                    default: break;
                    }
                }
                const size_t nc = m->cols - c0 < bc ? m->cols - c0 : bc;
                rows_masked(acc, n, w, bc, x + c0, nc);
            }
            for (size_t i = 0; i < n; i++)
                y[r0 + i0 + i] = _mm512_reduce_add_ps(acc[i]);
        }
    }
}
