/*
 * kern_variants.h — every kernel variant by name, for tests and benchmarks only (model code
 * calls the entry points of kern.h, which pick the variant of the active ISA).
 *
 * Naming: kern_<op>_<weight type>_<activation type>_<isa>, each SIMD variant with a scalar
 * `_ref` twin that specifies it. The X-macro lists below enumerate them once, so the tests
 * and kernels/traits.c can walk every (op, type, ISA) without spelling the names out. A
 * variant may only run when kern_isa_supported() says so for its ISA (and
 * kern_has_avx512bf16() for the _bf16_bf16_avx512 ones, kern_has_amx_bf16() for _amx).
 */
#ifndef CLOCHER_KERNELS_KERN_VARIANTS_H
#define CLOCHER_KERNELS_KERN_VARIANTS_H

#include "kern.h"

#include <stddef.h>
#include <stdint.h>

/* ---- products (kern_matmul_act's variants) ------------------------------------------------ */

/*
 * kern_<op>_<weight type>_<activation type>_<isa>: the variants kern_matmul_act dispatches
 * to (through the weight type's traits, kernels/traits.c); tests and benchmarks call them
 * directly. Same contract as kern_matmul_act, with the
 * weight type fixed by the name and `a` prepared for it. A variant may only run when
 * kern_isa_supported() says so for its ISA (and kern_has_avx512bf16() for bf16_bf16_avx512).
 * gemv: streams each weight row once, register-blocked over a few rows and up to 4 tokens;
 *       tuned for n == 1 (decode), correct for any n.
 * gemm: reuses each weight block across many tokens (int types: 16- or 8-row panels packed
 *       for integer dot products; float types: rows x tokens register tiles); tuned for
 *       n >= 8 (prefill), correct for any n.
 * _ref: the scalar specification of the same arithmetic (quantized or bf16 activations).
 */
typedef void kern_mm_fn(const void *w, const struct kern_act *a, float *y, size_t ldy,
                        size_t r0, size_t r1);

#define KERN_VARIANTS_(X, isa)                                                               \
    X(gemv, f32, f32, isa) X(gemv, f16, f32, isa) X(gemv, bf16, f32, isa)                    \
    X(gemv, q8_0, q8_0, isa) X(gemv, q4_0, q8_0, isa) X(gemm, f32, f32, isa)                 \
    X(gemm, f16, f32, isa) X(gemm, bf16, f32, isa) X(gemm, q8_0, q8_0, isa)                  \
    X(gemm, q4_0, q8_0, isa) X(gemv, mxfp4, q8_0, isa) X(gemm, mxfp4, q8_0, isa)

#define KERN_DECLARE_(op, wty, aty, isa) kern_mm_fn kern_##op##_##wty##_##aty##_##isa;
KERN_VARIANTS_(KERN_DECLARE_, ref)
KERN_VARIANTS_(KERN_DECLARE_, avx2)
KERN_VARIANTS_(KERN_DECLARE_, avx512)
kern_mm_fn kern_gemv_bf16_bf16_ref, kern_gemm_bf16_bf16_ref;
kern_mm_fn kern_gemv_bf16_bf16_avx512, kern_gemm_bf16_bf16_avx512;
/* the AVX512-BF16 panel gemm at every n (kern_gemm_bf16_bf16_avx512 streams rows up to 8 tokens) */
kern_mm_fn kern_gemm_bf16_bf16_avx512_panels;
/* AMX-BF16 tiles (x86/amx_bf16.c): may only run when kern_has_amx_bf16(); its twin is
 * kern_gemm_bf16_bf16_ref (kern.h "bf16 weights" for how its order of sums differs). */
kern_mm_fn kern_gemm_bf16_bf16_amx;
#undef KERN_DECLARE_
/* kern_gemv_mxfp4_q8_0_avx512 (x86/avx512_mxfp4.c) uses AVX512-VBMI when the CPU has it;
 * _plain is the same kernel never using it (the path of AVX-512 CPUs without VBMI), for
 * tests and benchmarks on CPUs that have it. Both give the gemm's bits. */
kern_mm_fn kern_gemv_mxfp4_q8_0_avx512_plain;

/*
 * Panel GEMMs (kern.h, kern_panels_*): same contract on a repacked matrix wp, r0 on a panel.
 * _avx512 reads the panels directly (the same arithmetic as the stored-row
 * kern_gemm_<type>_q8_0_avx512, bit for bit); _ref and _avx2 unpack each panel's rows to the
 * stored layout and run that ISA's stored-row gemm on them, so they give what it gives.
 */
kern_mm_fn kern_gemm_q4_0p_q8_0_ref, kern_gemm_q4_0p_q8_0_avx2, kern_gemm_q4_0p_q8_0_avx512;
kern_mm_fn kern_gemm_q8_0p_q8_0_ref, kern_gemm_q8_0p_q8_0_avx2, kern_gemm_q8_0p_q8_0_avx512;
/* kern_gemm_q4_0p_q8_0_avx512 with its GFNI path forced (_avx512 takes it where the CPU has
 * GFNI and CLOCHER_GFNI is not 0): only where kern_has_gfni(); the same bits */
kern_mm_fn kern_gemm_q4_0p_q8_0_avx512gfni;
int kern_has_gfni(void);
/* AMX-INT8 tiles on the same panels (x86/amx_q.c): only when kern_has_amx_bf16(); the same bits
 * as the _avx512 panel kernels above (their twins through them) on activations without xt;
 * with xt (kern.h KERN_ACT_BF16_TILES) they run the _bf16_amx kernels below instead */
kern_mm_fn kern_gemm_q4_0p_q8_0_amx, kern_gemm_q8_0p_q8_0_amx;
/* AMX-INT8 tiles for 2..16 tokens on q4_0 panels (x86/amx_q4s.c), measured slower than the
 * VNNI panel kernel here and not in the dispatch table: only when kern_has_amx_bf16(); the same
 * bits as kern_gemm_q4_0p_q8_0_avx512; other n go to kern_gemm_q4_0p_q8_0_amx. */
kern_mm_fn kern_gemm_q4_0p_q8_0_amxs;
/* Design (b), a numerics change (x86/amx_qbf16.c): the panels' weights dequantized to bf16,
 * activations rounded to bf16 (a->xt when prepared, else a->x rounded per call), tdpbf16ps;
 * the _ref twins (ref_qbf16.c) use the same operands with column-order f32 sums. _amx only
 * when kern_has_amx_bf16(). Dispatched by the _q8_0_amx entries above when a->xt exists
 * (kern.h KERN_ACT_BF16_TILES, from 128 tokens): then not the same bits as _avx512. */
kern_mm_fn kern_gemm_q4_0p_bf16_amx, kern_gemm_q8_0p_bf16_amx;
kern_mm_fn kern_gemm_q4_0p_bf16_ref, kern_gemm_q8_0p_bf16_ref;
/* mxfp4 panels (quant.h "mxfp4 panels"; x86/avx512_mxfp4.c): _avx512 gives the stored-row
 * kern_gemm_mxfp4_q8_0_avx512's bits (and so its gemv's) for every n; it uses AVX512-VBMI when
 * the CPU has it, _avx512_plain never (tests on CPUs that have it). */
kern_mm_fn kern_gemm_mxfp4p_q8_0_ref, kern_gemm_mxfp4p_q8_0_avx2, kern_gemm_mxfp4p_q8_0_avx512;
kern_mm_fn kern_gemm_mxfp4p_q8_0_avx512_plain;
/*
 * q4_K and q6_K panels (quant.h "q4_K panels", "q6_K panels"): _avx512 (x86/avx512_kqp.c) is
 * its own arithmetic, not the stored-row kernel's (its lanes are 4-element groups, here rows),
 * within the k-quant tolerance of the _ref twin and batch invariant: a token's outputs are the
 * same bits whatever n and its neighbours. _ref and _avx2 are their ISA's stored-row gemm.
 */
kern_mm_fn kern_gemm_q4_kp_q8_0_ref, kern_gemm_q4_kp_q8_0_avx2, kern_gemm_q4_kp_q8_0_avx512;
kern_mm_fn kern_gemm_q6_kp_q8_0_ref, kern_gemm_q6_kp_q8_0_avx2, kern_gemm_q6_kp_q8_0_avx512;

/*
 * int4 group types (common/dtype.h q4_g64 .. q4z_g128; kernels/ref_q4g.c, x86/avx*_q4g.c):
 * the same contract on activations prepared as for q4_0 (int8 blocks of 32, kernels/include/quant.h
 * bound). q4_gN: per block of 32 columns, dw * dx * sum((q-8) * xq); q4z_gN adds
 * m * dx * sum(xq) for the group's offset m. Integer sums are exact: SIMD variants differ from
 * _ref only in the order of the f32 sums (tests/kern/test_kern_q4g.c states the tolerance).
 */
#define KERN_Q4G_VARIANTS_(X, isa)                                                           \
    X(gemv, q4_g64, q8_0, isa) X(gemv, q4_g128, q8_0, isa) X(gemv, q4z_g32, q8_0, isa)       \
    X(gemv, q4z_g64, q8_0, isa) X(gemv, q4z_g128, q8_0, isa) X(gemm, q4_g64, q8_0, isa)      \
    X(gemm, q4_g128, q8_0, isa) X(gemm, q4z_g32, q8_0, isa) X(gemm, q4z_g64, q8_0, isa)      \
    X(gemm, q4z_g128, q8_0, isa)
#define KERN_DECLARE_(op, wty, aty, isa) kern_mm_fn kern_##op##_##wty##_##aty##_##isa;
KERN_Q4G_VARIANTS_(KERN_DECLARE_, ref)
KERN_Q4G_VARIANTS_(KERN_DECLARE_, avx2)
KERN_Q4G_VARIANTS_(KERN_DECLARE_, avx512)
#undef KERN_DECLARE_

/*
 * GGUF k-quants (common/dtype.h q4_k, q5_k, q6_k; kernels/ref_kq.c, x86/avx*_kq.c): the same
 * contract on activations prepared as for q4_0 (int8 blocks of 32, kernels/include/quant.h
 * bound). Per block of 32 columns: q4_K/q5_K (d sc_j) dx sum(q xq) - (dmin m_j) dx sum(xq);
 * q6_K d dx (sc sum_lo((q-32) xq) + sc' sum_hi((q-32) xq)), ref_kq.c states it exactly.
 * Integer sums are exact: SIMD variants differ from _ref only in the order and grouping of the
 * f32 products and sums (tests/kern/test_kern_kq.c states the tolerance). gemv: one token per
 * pass over a row; gemm: up to 4 tokens per unpacked super-block (AVX-512: vpdpbusd). Both
 * run one token's sums in the same order, so they are batch invariant like mxfp4's: a token's
 * outputs are the same bits whatever n and its neighbours (the test asserts it).
 */
#define KERN_KQ_VARIANTS_(X, isa)                                                            \
    X(gemv, q4_k, q8_0, isa) X(gemv, q5_k, q8_0, isa) X(gemv, q6_k, q8_0, isa)               \
    X(gemm, q4_k, q8_0, isa) X(gemm, q5_k, q8_0, isa) X(gemm, q6_k, q8_0, isa)
#define KERN_DECLARE_(op, wty, aty, isa) kern_mm_fn kern_##op##_##wty##_##aty##_##isa;
KERN_KQ_VARIANTS_(KERN_DECLARE_, ref)
KERN_KQ_VARIANTS_(KERN_DECLARE_, avx2)
KERN_KQ_VARIANTS_(KERN_DECLARE_, avx512)
#undef KERN_DECLARE_

/* ---- LoRA shrink and expand (kern.h, kern_lora_shrink / kern_lora_expand) ----------------- */

typedef void kern_lora_shrink_fn(const void *a, size_t in, size_t rank, const float *x,
                                 size_t n, float *t, size_t k0, size_t k1);
typedef void kern_lora_expand_fn(const void *bt, size_t rank, const float *t, size_t n,
                                 const float *scale, float s, float *y, size_t ldy, size_t j0,
                                 size_t j1);
kern_lora_shrink_fn kern_lora_shrink_f32_f32_ref, kern_lora_shrink_bf16_f32_ref,
    kern_lora_shrink_f32_f32_avx2, kern_lora_shrink_bf16_f32_avx2,
    kern_lora_shrink_bf16_bf16_ref, kern_lora_shrink_bf16_bf16_avx512;
kern_lora_expand_fn kern_lora_expand_f32_f32_ref, kern_lora_expand_bf16_f32_ref,
    kern_lora_expand_f32_f32_avx2, kern_lora_expand_bf16_f32_avx2,
    kern_lora_expand_bf16_bf16_ref, kern_lora_expand_bf16_bf16_avx512;
/* x quantized once, then the int8 shrink on the codes (kern.h kern_lora_i8_quant_x) */
typedef void kern_lora_quant_x_fn(const float *x, size_t in, size_t n, int8_t *qx, float *xs,
                                  int32_t *xsum);
typedef void kern_lora_shrink_i8q_fn(const void *a, size_t in, size_t rank, const int8_t *qx,
                                     const float *xs, const int32_t *xsum, size_t n, float *t,
                                     size_t k0, size_t k1);
kern_lora_quant_x_fn kern_lora_i8_quant_x_ref, kern_lora_i8_quant_x_avx2,
    kern_lora_i8_quant_x_avx512;
kern_lora_shrink_i8q_fn kern_lora_shrink_i8q_ref, kern_lora_shrink_i8q_avx2,
    kern_lora_shrink_i8q_avx512;
/* u quantized once, then the int8 expand on the codes (kern.h kern_lora_i8_quant_u) */
typedef void kern_lora_quant_u_fn(const void *bt, size_t rank, const float *t, size_t n,
                                  int8_t *qu, float *us, int32_t *usum);
typedef void kern_lora_expand_i8q_fn(const void *bt, size_t rank, const int8_t *qu,
                                     const float *us, const int32_t *usum, size_t n,
                                     const float *scale, float s, float *y, size_t ldy,
                                     size_t j0, size_t j1);
kern_lora_quant_u_fn kern_lora_i8_quant_u_ref, kern_lora_i8_quant_u_avx512;
kern_lora_expand_i8q_fn kern_lora_expand_i8q_ref, kern_lora_expand_i8q_avx2,
    kern_lora_expand_i8q_avx512;
/* x rounded to bf16 once, then the bf16 shrink on it (kern.h kern_lora_bf16_x) */
typedef void kern_lora_bf16_x_fn(const float *x, size_t in, size_t n, uint16_t *xb);
typedef void kern_lora_shrink_bf16x_fn(const void *a, size_t in, size_t rank, const uint16_t *xb,
                                       size_t n, float *t, size_t k0, size_t k1);
kern_lora_bf16_x_fn kern_lora_bf16_x_ref, kern_lora_bf16_x_avx512;
kern_lora_shrink_bf16x_fn kern_lora_shrink_bf16x_ref, kern_lora_shrink_bf16x_avx512;

/* ---- block-sparse GEMV (kern.h, kern_bsr_gemv) -------------------------------------------- */

typedef void kern_bsr_fn(const struct kern_bsr *m, const float *x, float *y, size_t b0,
                         size_t b1);
kern_bsr_fn kern_gemv_bsr_f32_ref, kern_gemv_bsr_f32_avx2, kern_gemv_bsr_f32_avx512;

/* ---- elementwise kernels (kern.h, "elementwise kernels") ---------------------------------- */

typedef void kern_map_fn(float *y, const float *x, size_t n);
typedef void kern_bias_act_fn(float *y, const float *x, const float *b, size_t n);
typedef void kern_softmax_fn(float *x, size_t n);
typedef void kern_rmsnorm_fn(float *y, const float *x, const float *w, size_t n, float eps);
typedef void kern_swiglu_fn(float *y, const float *gate, const float *up, size_t n);
typedef void kern_rope_fn(float *v, size_t n_heads, size_t hd, const float *cs);
typedef void kern_swiglu_clamp_fn(float *g, const float *u, const float *bg, const float *bu,
                                  size_t n, float alpha, float limit);

#define KERN_ELT_VARIANTS_(X, isa)                                                           \
    X(kern_map_fn, exp, isa) X(kern_map_fn, tanh, isa) X(kern_bias_act_fn, silu, isa)        \
    X(kern_bias_act_fn, gelu, isa) X(kern_softmax_fn, softmax, isa)                          \
    X(kern_rmsnorm_fn, rmsnorm, isa) X(kern_swiglu_fn, swiglu, isa) X(kern_rope_fn, rope, isa) \
    X(kern_swiglu_clamp_fn, swiglu_clamp, isa)

#define KERN_ELT_DECLARE_(fn, op, isa) fn kern_##op##_f32_f32_##isa;
KERN_ELT_VARIANTS_(KERN_ELT_DECLARE_, ref)
KERN_ELT_VARIANTS_(KERN_ELT_DECLARE_, avx2)
KERN_ELT_VARIANTS_(KERN_ELT_DECLARE_, avx512)
#undef KERN_ELT_DECLARE_

/* ---- attention tile (kern.h, kern_attn_span) ---------------------------------------------------- */

/* kern_attn_span's contract (kern.h): row r sees tile positions [lo[r], vis[r]); lo == NULL:
 * from 0, vis == NULL: up to n. */
typedef void kern_attn_fn(const float *const *q, float *const *o, float *m, float *l,
                          const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                          const void *v, size_t ld, size_t n, size_t hd, float scale);

#define KERN_ATTN_VARIANTS_(X, isa) X(f32, isa) X(f16, isa) X(bf16, isa)
#define KERN_ATTN_DECLARE_(kvt, isa) kern_attn_fn kern_attn_##kvt##_f32_##isa;
KERN_ATTN_VARIANTS_(KERN_ATTN_DECLARE_, ref)
KERN_ATTN_VARIANTS_(KERN_ATTN_DECLARE_, avx2)
KERN_ATTN_VARIANTS_(KERN_ATTN_DECLARE_, avx512)
#undef KERN_ATTN_DECLARE_

/* kern_attn_blocks' AVX-512 walk (x86/avx512_attn.c): only where attn.c's
 * kern_attn_blocks_fits holds (4..8 rows, 16-position blocks, hd a multiple of 16);
 * kern_attn_blocks_ref: the block loop over the _ref tiles. */
typedef void kern_attn_blocks_fn(enum dtype kvt, const float *const *q, float *const *o,
                                 float *m, float *l, size_t nq, const void *const *kb,
                                 size_t voff, size_t ld, size_t bt, size_t n, size_t hd,
                                 float scale);
kern_attn_blocks_fn kern_attn_blocks_avx512, kern_attn_blocks_ref;
int kern_attn_blocks_fits(enum dtype kvt, size_t nq, size_t bt, size_t hd);

/* ---- 8-bit KV attention tiles (kern.h "8-bit KV cache rows"; kernels/kv8.c) ------------------ */

/* kvi8: DT_KV_I8 head rows, kvf8: DT_KV_E4M3 head rows; kern_attn_fn's contract otherwise. */
#define KERN_ATTN_KV8_VARIANTS_(X, isa) X(kvi8, isa) X(kvf8, isa)
#define KERN_ATTN_DECLARE_KV8_(kvt, isa) kern_attn_fn kern_attn_##kvt##_f32_##isa;
KERN_ATTN_KV8_VARIANTS_(KERN_ATTN_DECLARE_KV8_, ref)
KERN_ATTN_KV8_VARIANTS_(KERN_ATTN_DECLARE_KV8_, avx2)
KERN_ATTN_KV8_VARIANTS_(KERN_ATTN_DECLARE_KV8_, avx512)
/* The active ISA's tile kernel for an 8-bit KV dtype (dispatch.c); NULL for other dtypes. */
kern_attn_fn *kern_attn_kv8_variant(enum dtype kvt);
#undef KERN_ATTN_DECLARE_KV8_

#endif
