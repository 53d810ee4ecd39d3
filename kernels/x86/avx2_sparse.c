/*
 * avx2_sparse.c — the AVX2+FMA block-sparse (BSR) f32 GEMV (contract: kern.h, kern_bsr_fn).
 *
 * The AVX-512 variant's loop order (x86/avx512_sparse.c says why) on 8 lanes: each block is
 * read front to back, every row of a block row keeps one accumulator in a small array across
 * the block row, up to 4 8-column slices of x (bc <= 32, a multiple of 8) stay in registers,
 * and other widths / the clipped edge block column use masked loads (vmaskmovps does not
 * fault on masked-off lanes), so x is never read past cols.
 */
#include "internal.h"

#include <immintrin.h>

#define CHUNK 64

static inline __m256i lanes(size_t n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n >= 8 ? 8 : (int)n), idx);
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void rows_full(__m256 *acc, size_t n,
                                                            const float *w, size_t bc,
                                                            const float *xc, int ns)
{
    __m256 x0 = _mm256_loadu_ps(xc), x1 = x0, x2 = x0, x3 = x0;
    if (ns > 1)
        x1 = _mm256_loadu_ps(xc + 8);
    if (ns > 2)
        x2 = _mm256_loadu_ps(xc + 16);
    if (ns > 3)
        x3 = _mm256_loadu_ps(xc + 24);
    for (size_t i = 0; i < n; i++, w += bc) {
        __m256 a = _mm256_fmadd_ps(_mm256_loadu_ps(w), x0, acc[i]);
        if (ns > 1)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + 8), x1, a);
        if (ns > 2)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + 16), x2, a);
        if (ns > 3)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + 24), x3, a);
        acc[i] = a;
    }
}

static void rows_masked(__m256 *acc, size_t n, const float *w, size_t bc, const float *xc,
                        size_t nc)
{
    for (size_t i = 0; i < n; i++, w += bc) {
        __m256 a = acc[i];
        for (size_t s = 0; s < nc; s += 8) {
            const __m256i mk = lanes(nc - s);
            a = _mm256_fmadd_ps(_mm256_maskload_ps(w + s, mk), _mm256_maskload_ps(xc + s, mk),
                                a);
        }
        acc[i] = a;
    }
}

void kern_gemv_bsr_f32_avx2(const struct kern_bsr *m, const float *x, float *y, size_t b0,
                            size_t b1)
{
    const size_t br = m->br, bc = m->bc, bsz = br * bc;
    const int ns = (bc & 7) == 0 && bc <= 32 ? (int)(bc / 8) : 0;
    __m256 acc[CHUNK];
    for (size_t b = b0; b < b1; b++) {
        const size_t r0 = b * br;
        if (r0 >= m->rows)
            break;
        const size_t nr = m->rows - r0 < br ? m->rows - r0 : br;
        const uint32_t k0 = m->row_ptr[b], k1 = m->row_ptr[b + 1];
        for (size_t i0 = 0; i0 < nr; i0 += CHUNK) {
            const size_t n = nr - i0 < CHUNK ? nr - i0 : CHUNK;
            for (size_t i = 0; i < n; i++)
                acc[i] = _mm256_setzero_ps();
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
                y[r0 + i0 + i] = hsum(acc[i]);
        }
    }
}
