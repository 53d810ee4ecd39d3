/*
 * traits.c — the weight types' traits (internal.h, struct kern_type_traits): one entry per
 * dtype saying how the kernels convert, prepare for, repack and multiply it on each ISA.
 * kern_init()/kern_force_isa() (dispatch.c) copy the chosen ISA's column into kern__ops; this
 * table is the only place that routes on the weight type.
 *
 * gemm_min_n is where the gemm variant overtakes the gemv in bench/kern_bench --only variants
 * (docs/PERFORMANCE.md): the gemv streams a row once per pair of tokens and wins while
 * unpacking dominates; the packed gemm wins once a panel is reused enough. The scalar ISA
 * runs kern_matmul_ref on the f32 activations for every type (kern__matmul_act_f32), so its
 * products are the f32 specification, not the quantized _ref twins.
 *
 * Adding a type: its entry below (block geometry as common/dtype.h states it, which kern_init
 * checks, a row converter, the
 * activation form, a panel layout if it has one, and its variants per ISA).
 */
#include "internal.h"
#include "quant.h"

static const struct kern__panel_layout q4_0_panels = {
    QUANT_Q4P_ROWS, sizeof(struct quant_q4_0), 0x00, quant_q4p_qoff, quant_q4p_soff, 2};
/* q8_0 quants are stored offset by +128 (unsigned bytes for vpdpbusd; quant.h) */
static const struct kern__panel_layout q8_0_panels = {
    QUANT_Q8P_ROWS, sizeof(struct quant_q8_0), 0x80, quant_q8p_qoff, quant_q8p_soff, 2};
/* mxfp4: nibbles as stored, the E8M0 bytes of a block together (quant.h "mxfp4 panels") */
static const struct kern__panel_layout mxfp4_panels = {
    QUANT_MXP_ROWS, sizeof(struct quant_mxfp4), 0x00, quant_mxp_qoff, quant_mxp_soff, 1};
/* q4_K: scales and mins decoded to bytes at load (quant.h "q4_K panels"); q6_K: bytes moved */
static const struct kern__panel_layout q4_k_panels = {QUANT_Q4KP_ROWS, QUANT_Q4KP_ROW_BYTES,
                                                      0x00, NULL, NULL, 0};
static const struct kern__panel_layout q6_k_panels = {QUANT_Q6KP_ROWS, QUANT_Q6KP_ROW_BYTES,
                                                      0x00, NULL, NULL, 0};

/* The scalar ISA's column, the same for every type: the f32 specification. */
/* Tokens from which q4_0/q8_0 panel products on AMX take the bf16 tiles (x86/amx_qbf16.c)
 * when their activations allow it (kern.h KERN_ACT_BF16_TILES); below, the AMX-INT8 kernel
 * (x86/amx_q.c, itself the AVX-512 VNNI one below 24 tokens). docs/PERFORMANCE.md, session 18
 * (s18-amxb): where (b) overtakes (a) in bench/amxq_bench. */
#define AMX_QBF16_MIN_N 128
#define REF_MM_ .gemv = kern__matmul_act_f32, .gemm = kern__matmul_act_f32, .gemm_min_n = 1
/* gemv/gemm of one type on one ISA */
#define MM_(wty, aty, isa, min_n)                                                            \
    .gemv = kern_gemv_##wty##_##aty##_##isa, .gemm = kern_gemm_##wty##_##aty##_##isa,        \
    .gemm_min_n = (min_n)
/* LoRA adapter weights: f32 activations on every ISA (AVX-512 reuses the AVX2 kernels) */
#define LORA_(wty, isa)                                                                      \
    .lora_shrink = kern_lora_shrink_##wty##_f32_##isa,                                       \
    .lora_expand = kern_lora_expand_##wty##_f32_##isa
#define ATTN_(kvt, isa) .attn = kern_attn_##kvt##_f32_##isa

/* The int4 group types (x86/avx*_q4g.c): on AVX2 the gemm tile reuses unpacked rows over 4
 * tokens; on AVX-512 it is the same packed-panel gemm as q4_0's, so its crossover. */
#define Q4G_(wty, DT, n)                                                                     \
    [DT] = {.block = (n), .block_bytes = sizeof(struct quant_##wty), .to_f32 = kern__row_##wty, \
            .act = KERN__ACT_Q8,                                                             \
            .act_offset = 8, /* q4_gN: q4_0's correction; q4z_gN recovers sums from it */    \
            .isa = {{REF_MM_}, {MM_(wty, q8_0, avx2, 4)}, {MM_(wty, q8_0, avx512, 6)}}}

#define KQ_(wty, DT)                                                                         \
    [DT] = {.block = QUANT_K, .block_bytes = sizeof(struct quant_##wty),                      \
            .to_f32 = kern__row_##wty, .act = KERN__ACT_Q8, .act_offset = 8,                  \
            .isa = {{REF_MM_}, {MM_(wty, q8_0, avx2, 2)}, {MM_(wty, q8_0, avx512, 2)}}}

const struct kern_type_traits kern__traits[DT_COUNT_] = {
    [DT_F32] = {.block = 1, .block_bytes = 4,
 .to_f32 = kern__row_f32,
                .act = KERN__ACT_F32,
                .isa = {{REF_MM_, LORA_(f32, ref), ATTN_(f32, ref)},
                        {MM_(f32, f32, avx2, 3), LORA_(f32, avx2), ATTN_(f32, avx2)},
                        {MM_(f32, f32, avx512, 2), LORA_(f32, avx2), ATTN_(f32, avx512)}}},
    [DT_F16] = {.block = 1, .block_bytes = 2,
 .to_f32 = kern__row_f16,
                .act = KERN__ACT_F32,
                .isa = {{REF_MM_, ATTN_(f16, ref)},
                        {MM_(f16, f32, avx2, 3), ATTN_(f16, avx2)},
                        {MM_(f16, f32, avx512, 3), ATTN_(f16, avx512)}}},
    [DT_BF16] = {.block = 1, .block_bytes = 2,
 .to_f32 = kern__row_bf16,
                 .act = KERN__ACT_BF16,
                 .isa = {{REF_MM_, LORA_(bf16, ref), ATTN_(bf16, ref)},
                         {MM_(bf16, f32, avx2, 3), LORA_(bf16, avx2), ATTN_(bf16, avx2)},
                         {MM_(bf16, f32, avx512, 3), LORA_(bf16, avx2), ATTN_(bf16, avx512)}},
                 /* vdpbf16ps on bf16-rounded activations (ADR 0006, session 6 addendum) */
                 .bf16 = {.gemm = kern_gemm_bf16_bf16_avx512,
                          .lora_shrink_lowrank = kern_lora_shrink_bf16_bf16_avx512,
                          .lora_expand_lowrank = kern_lora_expand_bf16_bf16_avx512},
                 /* tdpbf16ps tiles on the same bf16 operands (x86/amx_bf16.c, ADR 0004 session 17
                  * addendum) */
                 .amx = {.gemm = kern_gemm_bf16_bf16_amx}},
    [DT_Q8_0] = {.block = 32, .block_bytes = sizeof(struct quant_q8_0),
 .to_f32 = kern__row_q8_0,
                 .act = KERN__ACT_Q8,
                 .act_offset = 128,
                 .panels = &q8_0_panels,
                 .isa = {{REF_MM_, .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q8_0_ref},
                         {MM_(q8_0, q8_0, avx2, 5), .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q8_0_ref},
                         {MM_(q8_0, q8_0, avx512, 6), .panel_gemm = kern_gemm_q8_0p_q8_0_avx512,
                          .panel_pack = kern__q8p_pack_avx512}},
                 /* tdpbssd tiles on the same panels, the same bits (x86/amx_q.c); from
                  * AMX_QBF16_MIN_N tokens on activations prepared with KERN_ACT_BF16_TILES,
                  * tdpbf16ps on bf16-dequantized panels (x86/amx_qbf16.c, a numerics change) */
                 .amx = {.panel_gemm = kern_gemm_q8_0p_q8_0_amx, .tiles_min_n = AMX_QBF16_MIN_N,
                         .act_tiles = kern__act_tiles_amx}},
    [DT_Q4_0] = {.block = 32, .block_bytes = sizeof(struct quant_q4_0),
 .to_f32 = kern__row_q4_0,
                 .act = KERN__ACT_Q8,
                 .act_offset = 8,
                 .panels = &q4_0_panels,
                 .isa = {{REF_MM_, .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q4_0_ref},
                         {MM_(q4_0, q8_0, avx2, 8), .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q4_0_ref},
                         {MM_(q4_0, q8_0, avx512, 4), .panel_gemm = kern_gemm_q4_0p_q8_0_avx512,
                          .panel_pack = kern__q4p_pack_avx512}},
                 /* tdpbssd tiles on the same panels, the same bits (x86/amx_q.c); from
                  * AMX_QBF16_MIN_N tokens on activations prepared with KERN_ACT_BF16_TILES,
                  * tdpbf16ps on bf16-dequantized panels (x86/amx_qbf16.c, a numerics change) */
                 .amx = {.panel_gemm = kern_gemm_q4_0p_q8_0_amx, .tiles_min_n = AMX_QBF16_MIN_N,
                         .act_tiles = kern__act_tiles_amx}},
    Q4G_(q4_g64, DT_Q4_G64, 64),
    Q4G_(q4_g128, DT_Q4_G128, 128),
    Q4G_(q4z_g32, DT_Q4Z_G32, 32),
    Q4G_(q4z_g64, DT_Q4Z_G64, 64),
    Q4G_(q4z_g128, DT_Q4Z_G128, 128),
    /* gpt-oss experts: the doubled E2M1 values from a 16-entry table (vpshufb) are q8_0-like
     * signed weights, stored + 128 for vpdpbusd on AVX-512 (x86/avx*_q.c), hence the offset.
     * Both give a token the same bits (the gemv folds in the gemm's order: batch invariance),
     * so gemm_min_n is only speed: bench/kern_bench --only variants --dtype mxfp4 --quick
     * --threads 1 (5632 x 2048, quiet machine), GFLOP/s gemv vs gemm: AVX2 n = 3 43 vs 38,
     * n = 4 40 vs 44. AVX-512 since the session-11 gemv (x86/avx512_mxfp4.c), 2880 x 2880 (an
     * expert), 1 thread, thread CPU time, gemv / gemm from DRAM: n = 4 1.48, n = 6 1.05,
     * n = 8 0.98 (from cache 1.67, 1.17, 1.00): the gemm from 8 tokens on
     * (docs/PERFORMANCE.md "gpt-oss decode, session 12"). */
    [DT_MXFP4] = {.block = 32, .block_bytes = sizeof(struct quant_mxfp4),
                  .to_f32 = kern__row_mxfp4,
                  .act = KERN__ACT_Q8,
                  .act_offset = 128,
                  .panels = &mxfp4_panels,
                  .isa = {{REF_MM_, .panel_gemm = kern__panels_via_rows,
                           .panel_pack = kern__panels_pack_mxfp4_ref},
                          {MM_(mxfp4, q8_0, avx2, 4), .panel_gemm = kern__panels_via_rows,
                           .panel_pack = kern__panels_pack_mxfp4_ref},
                          {MM_(mxfp4, q8_0, avx512, 8), .panel_gemm = kern_gemm_mxfp4p_q8_0_avx512,
                           .panel_pack = kern__mxp_pack_avx512}}},
    /* GGUF k-quants (ref_kq.c, x86/avx*_kq.c): q8_0 activations, ns32 giving the block sums
     * (q4_K/q5_K mins) and ns4 the q6_K -32 correction; the gemm reuses an unpacked
     * super-block over 4 tokens, so it wins from 2 tokens on: bench/kern_bench --only
     * variants --dtype q4_k --quick --hot --threads 1 (5632 x 2048, busy machine), GFLOP/s
     * gemv vs gemm, AVX-512: n = 1 45 vs 41, n = 2 34 vs 53. Batch invariant (kern_variants.h),
     * so the crossover is only speed.
     * q4_K and q6_K also have panels (ADR 0004 addendum "k-quant panels"): the loader repacks
     * them, and on AVX-512 every n then runs the panel gemm (x86/avx512_kqp.c); the other
     * ISAs unpack each panel's rows and run their stored-row gemm. */
    [DT_Q4_K] = {.block = QUANT_K, .block_bytes = sizeof(struct quant_q4_k),
                 .to_f32 = kern__row_q4_k, .act = KERN__ACT_Q8, .act_offset = 8,
                 .panels = &q4_k_panels,
                 .isa = {{REF_MM_, .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q4_k},
                         {MM_(q4_k, q8_0, avx2, 2), .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q4_k},
                         {MM_(q4_k, q8_0, avx512, 2), .panel_gemm = kern_gemm_q4_kp_q8_0_avx512,
                          .panel_pack = kern__panels_pack_q4_k}}},
    KQ_(q5_k, DT_Q5_K),
    [DT_Q6_K] = {.block = QUANT_K, .block_bytes = sizeof(struct quant_q6_k),
                 .to_f32 = kern__row_q6_k, .act = KERN__ACT_Q8, .act_offset = 8,
                 .panels = &q6_k_panels,
                 .isa = {{REF_MM_, .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q6_k},
                         {MM_(q6_k, q8_0, avx2, 2), .panel_gemm = kern__panels_via_rows,
                          .panel_pack = kern__panels_pack_q6_k},
                         {MM_(q6_k, q8_0, avx512, 2), .panel_gemm = kern_gemm_q6_kp_q8_0_avx512,
                          .panel_pack = kern__panels_pack_q6_k}}},
};
