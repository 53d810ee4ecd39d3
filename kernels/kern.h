/*
 * kern.h — compute kernels and their run-time dispatch.
 *
 * Every kernel has a scalar `_ref` twin that is its specification; SIMD variants (AVX2+FMA,
 * AVX-512) are chosen once by kern_init() from CPUID, or forced with CLOCHER_ISA=ref|avx2|avx512
 * (an unavailable forced ISA is an error, not a silent fallback), so tests can exercise every
 * path on one machine.
 *
 * NOTES: kern_init() is idempotent and must run before threads call kernels (engine creation
 * does it); kernels themselves are reentrant and take row ranges so a thread pool can shard.
 */
#ifndef CLOCHER_KERNELS_KERN_H
#define CLOCHER_KERNELS_KERN_H

#include "dtype.h"

#include <stddef.h>
#include <stdint.h>

enum kern_isa { KERN_ISA_REF = 0, KERN_ISA_AVX2 = 1, KERN_ISA_AVX512 = 2 };

/* 0, or ERR_UNSUPPORTED when CLOCHER_ISA names a path this CPU lacks (logged). */
int kern_init(void);
enum kern_isa kern_isa(void);
const char *kern_isa_name(enum kern_isa isa);
/* For tests: switch path explicitly. ERR_UNSUPPORTED when the CPU lacks it. */
int kern_force_isa(enum kern_isa isa);
/* true when this CPU can run the ISA */
int kern_isa_supported(enum kern_isa isa);

/*
 * Matrix multiply against a stored weight matrix, for output rows [r0, r1) only:
 *   y[t*ldy + r] = sum_c W[r][c] * x[t*cols + c]     for t < n, r0 <= r < r1
 * W: [rows][cols] of dtype wt, rows packed per dtype_row_bytes(wt, cols).
 * x: [n][cols] f32.  y: [n][ldy] f32.
 * n == 1 is the decode GEMV; n > 1 the prefill / batch GEMM.
 */
void kern_matmul(enum dtype wt, const void *w, size_t cols, const float *x, size_t n, float *y,
                 size_t ldy, size_t r0, size_t r1);

/* The scalar twin of kern_matmul, whatever ISA is active (the tests' reference). */
void kern_matmul_ref(enum dtype wt, const void *w, size_t cols, const float *x, size_t n,
                     float *y, size_t ldy, size_t r0, size_t r1);

/* Dequantize/convert one row of n elements of dtype dt to f32. */
void kern_row_to_f32(enum dtype dt, const void *row, float *out, size_t n);

#endif
