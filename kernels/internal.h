/*
 * internal.h — kernels-private declarations shared between ref.c, act.c, dispatch.c and the
 * per-ISA files (libuv's uv__ habit: kern__ names never leave this folder).
 */
#ifndef CLOCHER_KERNELS_INTERNAL_H
#define CLOCHER_KERNELS_INTERNAL_H

#include "kern.h"

#include <stddef.h>
#include <stdint.h>

/* Activation rows are padded to this many elements (one AVX-512 block pair). */
#define KERN__ACT_PAD 64

static inline size_t kern__round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

/* Bytes of one weight row of a->cols elements of type wt (validated by kern_act_init). */
size_t kern__row_bytes(enum dtype wt, size_t cols);

/*
 * Growable scratch owned by the calling thread: 64-byte aligned, contents not preserved
 * across calls, freed at thread exit. NULL when it cannot grow (kern_matmul then falls back
 * to the allocation-free scalar path rather than fail: kernels have no error path).
 */
void *kern__scratch(size_t bytes);
/* The same with an index: slot 0 is kern__scratch's, slot 1 a second buffer for code that
 * runs inside a product whose activations live in slot 0 (q4p.c, q8p.c). */
void *kern__scratch_slot(int slot, size_t bytes);

/* kern_act_prepare per ISA: the scalar specification and two bit-identical SIMD versions. */
void kern__act_prepare_ref(const struct kern_act *a, size_t t0, size_t t1);
void kern__act_prepare_avx2(const struct kern_act *a, size_t t0, size_t t1);
void kern__act_prepare_avx512(const struct kern_act *a, size_t t0, size_t t1);
/* The offset of the unsigned weights that kern_act.ns4/ns32 correct for: 8 or 128. */
int32_t kern__act_offset(enum dtype wt);

/* kern_q4p_pack's AVX-512 version (x86/avx512_q.c): the same bytes. */
void kern__q4p_pack_avx512(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                           size_t p1);
/* kern_q8p_pack's AVX-512 version (x86/avx512_q.c): the same bytes. */
void kern__q8p_pack_avx512(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                           size_t p1);

/* kern_row_to_f32 for the int4 group types (dtype_is_q4g), kernels/ref_q4g.c. */
void kern__q4g_row_to_f32(enum dtype dt, const void *row, float *out, size_t n);

#endif
