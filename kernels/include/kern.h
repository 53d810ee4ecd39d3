/*
 * kern.h — the compute kernels' entry points: what the model code calls.
 *
 * Every entry runs the variant of the active ISA through one dispatch table (kernels/
 * internal.h, struct kern_ops) that kern_init() fills once per process from CPUID, or from
 * CLOCHER_ISA=ref|avx2|avx512 (an unavailable forced ISA is an error, not a silent fallback),
 * so tests can exercise every path on one machine. The variants themselves (kern_<op>_<weight
 * type>_<activation type>_<isa>, each with a scalar `_ref` twin that is its specification)
 * are declared in kern_variants.h, for tests and benchmarks only.
 *
 * Numerics (docs/PERFORMANCE.md has the measurements behind these choices):
 *  - f32/f16 weights: exact f32 products, f32 accumulation (order differs from _ref).
 *  - bf16 weights: the decode GEMV widens to f32 exactly; the prefill GEMM on AVX-512-BF16
 *    rounds activations to bf16 and uses vdpbf16ps (relative error <= 2^-8 per product, see
 *    tests/kern for the bound asserted). On AMX-BF16 (kern_has_amx_bf16) the prefill GEMM is
 *    tdpbf16ps on the same bf16 operands: exact products, f32 sums, but each output sums its
 *    column pairs in 32-column steps inside the tile unit (whose internal order and rounding
 *    Intel leaves unspecified; denormal inputs read as zero, like vdpbf16ps) rather than in
 *    vdpbf16ps' per-lane chains, so its bits differ from the AVX-512 GEMM's within the same
 *    bound (tests/kern test_amx_bf16_gemm; ADR 0004, session 17 addendum).
 *  - q8_0/q4_0/mxfp4/q4_k/q5_k/q6_k weights: the SIMD paths quantize activations per block of 32 to int8 with
 *    an f32 scale (kernels/include/quant.h states the resulting error bound) and use integer dot
 *    products (mxfp4: the doubled E2M1 values, |w| <= 12, exact; its block scale 2^(e-128)
 *    applied to the block's sum); the scalar ISA computes in f32 with unquantized activations.
 *    mxfp4 is batch invariant on every ISA: a token's outputs are the same bits whatever n and
 *    whichever tokens share the call (its gemv folds in its gemm's order), since a MoE expert's
 *    token count depends on the rest of the batch (tests/kern/test_kern_mxfp4.c).
 *    The k-quants are too (kern_variants.h), and q8_0/q4_0 where their panel GEMM exists
 *    (AVX-512; with AMX from 24 tokens the panel GEMM runs on AMX-INT8 tiles, x86/amx_q.c,
 *    which give the same int32 block sums and take the same float steps: the same bits),
 *    EXCEPT on activations prepared with KERN_ACT_BF16_TILES (below): with AMX, from 128
 *    tokens, q8_0/q4_0 panels then multiply as bf16(q * d) x bf16(x) on tdpbf16ps (x86/
 *    amx_qbf16.c; no int8 activations, f32 sums in the tiles' order; KLD vs f32 no worse
 *    than the int8 product's, ADR 0004 session 18 addendum), which is not batch invariant.
 *    f32/f16/bf16 on SIMD ISAs and q8_0/q4_0 on AVX2 are not: gemv and gemm add
 *    in different orders, so a token's bits depend on how many share the call. The batch-
 *    invariant mode (worker/model/matmul.c, matmul_ctx.invariant) runs those products one
 *    token at a time through the gemv (docs/DAEMON.md "Batch invariance").
 *
 * NOTES: kern_init() is idempotent and must run before threads call kernels (engine creation
 * does it); kernels themselves are reentrant and take row ranges so a thread pool can shard.
 * kern_matmul() keeps one growing scratch buffer per calling thread (freed at thread exit).
 */
#ifndef CLOCHER_KERNELS_KERN_H
#define CLOCHER_KERNELS_KERN_H

#include "dtype.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum kern_isa { KERN_ISA_REF = 0, KERN_ISA_AVX2 = 1, KERN_ISA_AVX512 = 2 };

/* Fills the dispatch table with the best ISA this CPU has, or the one CLOCHER_ISA names.
 * Does nothing once the table is filled (by it or kern_force_isa). 0, ERR_UNSUPPORTED when
 * CLOCHER_ISA names a path this CPU lacks, ERR_USAGE when it names none (both logged). */
int kern_init(void);
/* DRAM streams per thread of the few-token panel products (AVX-512: q8_0 panels at 1-8 tokens,
 * q4_0 panels at 1-8 tokens, mxfp4 panels at 1-4 tokens, the grouped experts at 8 decode
 * streams):
 * 2 interleaves two panels half the thread's rows apart, block by block; 1 reads the panels
 * one after another; 4 (the default) interleaves four a quarter apart in the mxfp4 panels at
 * 1-2 tokens and two everywhere else (docs/PERFORMANCE.md "Four DRAM streams, session 22"),
 * except that on AMD Zen 5 and later kern_init() leaves the q4_0/q8_0 panels at one stream
 * (measured faster there: docs/PERFORMANCE.md "Session 25"). Same bits every way. kern_init()
 * takes CLOCHER_PANEL_STREAMS=1|2|4 (for every kind); set it only while no kernel runs
 * (benchmarks and tests compare them). */
void kern_set_panel_streams(int streams);
/*
 * Side prefetch (session 24): up to KERN_SIDE_PF_MAX byte ranges that the calling thread's
 * next streaming panel products (AVX-512 q4_0 and q8_0 panels) request into L2 one line per
 * block of 32 columns they read, while their own weights stream from DRAM (a burst per panel
 * made the int8 base's adapted steps ~4 % slower, session 25): the LoRA
 * update's expand reads its B panels right after the base rows it adds to, and at low rank
 * it waited a DRAM latency for their first lines (26-37 % of its samples, perf, session 24),
 * where requesting them all at once waited for fill buffers instead (session 19). What the
 * products do not request by their end stays on the list for the next; n = 0 clears it. A
 * hint only: no effect on any result; other kernels ignore it.
 */
#define KERN_SIDE_PF_MAX 8
void kern_side_prefetch(const void *const *p, const size_t *bytes, size_t n);
enum kern_isa kern_isa(void);
const char *kern_isa_name(enum kern_isa isa);
/* Refills the dispatch table for `isa` (tests and benchmarks compare paths with it; no kernel
 * may be running meanwhile). ERR_UNSUPPORTED (logged) when the CPU lacks it; the table is then
 * left as it was. */
int kern_force_isa(enum kern_isa isa);
/* true when this CPU can run the ISA. AVX2 = AVX2+FMA+F16C; AVX512 = F+BW+VL+DQ+VNNI. */
int kern_isa_supported(enum kern_isa isa);
/* true when the CPU has AVX512-BF16 (vdpbf16ps), used by the bf16 GEMM when present. */
int kern_has_avx512bf16(void);
/* true when AMX-TILE + AMX-BF16 can run here: the CPU has them (CPUID 7.0 EDX bits 24, 22),
 * the OS saves tile state (XCR0 bits 17, 18) and Linux granted this process the tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; a refusal is logged at info level), and the
 * CPU also has the AVX-512 ISA with AVX512-BF16. Then the AVX-512 table's bf16 GEMM is the
 * AMX one (kern_gemm_bf16_bf16_amx) unless CLOCHER_AMX=0 (read at kern_init/kern_force_isa).
 * kern_amx_active: whether the active table uses it. */
int kern_has_amx_bf16(void);
int kern_amx_active(void);

/*
 * Matrix multiply against a stored weight matrix, for output rows [r0, r1) only:
 *   y[t*ldy + r] = sum_c W[r][c] * x[t*cols + c]     for t < n, r0 <= r < r1
 * W: [rows][cols] of dtype wt, rows packed per dtype_row_bytes(wt, cols).
 * x: [n][cols] f32.  y: [n][ldy] f32.
 * n == 1 is the decode GEMV; n > 1 the prefill / batch GEMM.
 * Prepares (quantizes) the activations itself, once per call: callers that shard one product
 * over threads should prepare once with kern_act_* and call kern_matmul_act per shard.
 */
void kern_matmul(enum dtype wt, const void *w, size_t cols, const float *x, size_t n, float *y,
                 size_t ldy, size_t r0, size_t r1);

/* The scalar twin of kern_matmul, whatever ISA is active (the tests' reference). */
void kern_matmul_ref(enum dtype wt, const void *w, size_t cols, const float *x, size_t n,
                     float *y, size_t ldy, size_t r0, size_t r1);

/* Dequantize/convert one row of n elements of dtype dt to f32. */
void kern_row_to_f32(enum dtype dt, const void *row, float *out, size_t n);

/* ---- activations prepared once per product ---------------------------------------------- */

/*
 * Activations x [n][cols] in the forms the kernels need for weight type wt: int8 blocks of 32
 * (with the sums and lane-wise scales the SIMD kernels use) for q8_0/q4_0/mxfp4 and the int4
 * group weights, bf16 for
 * bf16 weights, and for f32/f16/bf16 weights a copy with padded rows (kernels/internal.h:
 * the weight type's act form). The same for every ISA. Lives in one caller-provided buffer of
 * kern_act_bytes() bytes, 64-byte aligned. `cp` is cols rounded up to 64; padding elements
 * are zero.
 * NOTES: fill with kern_act_init() then kern_act_prepare() over all tokens, each once (token
 * ranges may be prepared by different threads); afterwards it is read-only and shared by every
 * shard.
 */
/* A token's block scale and offset correction side by side (struct kern_act.sc). */
struct kern_act_sc {
    float d;      /* kern_act.d of the block */
    int32_t ns32; /* kern_act.ns32 of the block */
};
#define KERN_ACT_SC_NT 8u /* tokens per tile of kern_act.sc */

struct kern_act {
    enum dtype wt;   /* the weight type it was prepared for */
    size_t cols, n, cp;
    size_t ld;       /* row stride of q and xb in elements: cp + 64, so that the same column of
                        consecutive tokens does not map to one L1 set (2^k-byte strides would) */
    const float *x;  /* [n][cols] the f32 source, borrowed */
    int8_t *q;       /* [n][ld] int8 quants, blocks of 32 (NULL if unused) */
    float *d;        /* [n][cp/32] block scales: x ~= d * q */
    int32_t *ns4;    /* [n][cp/4] -off * (sum of each group of 4 quants): the correction for
                        unsigned weights w + off (off = 8 for q4_0, 128 for q8_0 and mxfp4) */
    int32_t *ns32;   /* [n][cp/32] the same per block of 32 */
    float *d4;       /* [n][cp/4] the block scale of each group of 4 (lane-wise scales) */
    struct kern_act_sc *sc; /* [n][cols/32] d and ns32 again, in tiles of at most
                        KERN_ACT_SC_NT near-equal tokens (ceil(n / KERN_ACT_SC_NT) tiles, the
                        AVX-512 q4_0/q8_0 panel products' register tiles): the tile of tokens
                        [t, t + nt) at sc + t * (cols/32), its token j's block b at + b * nt + j.
                        Laid out by kern_act_prepare, once per activation: until session 23 each
                        product call gathered it (~1.5% of an int4 8-stream decode step's CPU,
                        ~2.5% of a LoRA-adapted one, whose 512-row tiles are more calls). NULL
                        when q is, or when cols is not a multiple of 32 */
    atomic_size_t *sc_left; /* tokens not prepared yet: the call that prepares the last lays
                        out sc (kern_act_prepare) */
    uint16_t *xb;    /* [n][ld] x rounded to bf16, for bf16 weights (NULL if unused) */
    float *xf;       /* [n][ld] a copy of x, for f32/f16/bf16 weights (NULL if unused) */
    uint16_t *xt;    /* [npad/16][cols/32][16][32] x rounded to bf16 (act.c's rounding), tokens
                        n..npad (npad = n rounded up to 16) zero, 1 KiB per 16 x 32 tile: the
                        AMX-BF16 q4_0/q8_0 panel product's A tiles. Only with
                        KERN_ACT_BF16_TILES and from the type's tile threshold (NULL if unused);
                        then q, d, ns4, ns32 and d4 are NULL (act.c: nothing reads them) */
};

/*
 * kern_act_bytes_ex / kern_act_init_ex flags.
 * KERN_ACT_BF16_TILES: the products on these activations may take the AMX-BF16 q4_0/q8_0 panel
 * product (x86/amx_qbf16.c, from 128 tokens, only with AMX): weights bf16(q * d), activations
 * bf16 instead of int8 per block of 32, f32 sums in the tiles' order. That is a numerics change
 * (docs/adr/0004, session 18 addendum: KLD no worse than the int8 product's) and NOT batch
 * invariant: a token's outputs then depend on how many tokens share the call. Callers that
 * promise batch invariance (worker/model/matmul.c with its invariant switch) leave it unset.
 * Without it (kern_act_bytes / kern_act_init) every quantized product keeps its int8 bits.
 * The environment, read when the dispatch table is filled (kern_init / kern_force_isa):
 * CLOCHER_AMX=0 or CLOCHER_AMX_QBF16=0 turn the tiles off (the flag then lays out nothing
 * more), CLOCHER_AMX_QBF16=N moves the 128-token threshold to N (measurements).
 */
enum { KERN_ACT_BF16_TILES = 1u };

/* *out = buffer bytes for kern_act_init(wt, cols, n).
 * ERR_FORMAT when cols is not a whole number of wt's blocks, ERR_OVERFLOW on size overflow. */
int kern_act_bytes(enum dtype wt, size_t cols, size_t n, size_t *out);
/* Lays out *a over buf (kern_act_bytes() bytes, 64-byte aligned); nothing is computed yet. */
void kern_act_init(struct kern_act *a, enum dtype wt, const float *x, size_t cols, size_t n,
                   void *buf);
/* The same with flags (KERN_ACT_*); flags 0 is kern_act_bytes / kern_act_init. */
int kern_act_bytes_ex(enum dtype wt, size_t cols, size_t n, unsigned flags, size_t *out);
void kern_act_init_ex(struct kern_act *a, enum dtype wt, const float *x, size_t cols, size_t n,
                      unsigned flags, void *buf);
/* Fills tokens [t0, t1). */
void kern_act_prepare(const struct kern_act *a, size_t t0, size_t t1);
/* kern_matmul on prepared activations: y rows [r0, r1) for all a->n tokens. w needs no
 * alignment beyond its dtype's (block types: any byte), so a MoE expert is a pointer offset
 * into its [experts][rows][cols] tensor (tests/kern/test_kern_mxfp4.c, expert slices). */
void kern_matmul_act(const void *w, const struct kern_act *a, float *y, size_t ldy, size_t r0,
                     size_t r1);

/*
 * Quantized matrices repacked at load time into panels of rows (q4_0, q8_0, mxfp4, q4_K and
 * q6_K: 16-row panels, layouts in kernels/include/quant.h "q4_0 panels" / "q8_0 panels" /
 * "mxfp4 panels" / "q4_K panels" / "q6_K panels"; why: ADR 0004, "load-time q4_0 panels" and
 * addenda "q8_0 panels", "k-quant panels", "mxfp4 panels"), by the matrix's stored dtype wt. `wp` points to a
 * repacked matrix, never to stored rows, and row ranges start on a panel (r0 % 16 == 0; r1
 * may be the matrix's last row). Same contract as kern_matmul / kern_matmul_act otherwise,
 * with activations prepared for wt (a->wt == wt). A wt without panels aborts.
 *   kern_panels_supported: whether wt has a panel layout (the loader repacks only those);
 *   kern_panels_bytes:     bytes of the repacked [rows][cols] matrix (cols a multiple of the
 *                          block; q4_K's panels are 148/144 of its stored rows, the others equal);
 *   kern_panels_pack:      writes panels [p0, p1) of dst from the stored rows w (panels are
 *                          independent, so threads may pack disjoint ranges);
 *   kern_panels_rows:      stored rows [r0, r1) back out of the panels, into out [r1-r0][rb];
 *   kern_matmul_panels / kern_matmul_act_panels: the products. On AVX-512 the panel GEMM,
 *     whose outputs equal the stored-row kern_gemm_<wt>_q8_0_avx512's bit for bit for any n
 *     (each token's sums do not depend on the others; the k-quants' panel GEMMs have their own
 *     f32 order, within the k-quant tolerance and equally batch invariant); on the other ISAs
 *     each panel's rows are unpacked to the stored layout and run through kern_matmul_act,
 *     so a repacked model computes there what the stored one did.
 */
int kern_panels_supported(enum dtype wt);
size_t kern_panels_bytes(enum dtype wt, size_t rows, size_t cols);
void kern_panels_pack(enum dtype wt, const void *w, size_t cols, void *dst, size_t rows,
                      size_t p0, size_t p1);
void kern_panels_rows(enum dtype wt, const void *wp, size_t cols, size_t r0, size_t r1,
                      void *out);
void kern_matmul_panels(enum dtype wt, const void *wp, size_t cols, const float *x, size_t n,
                        float *y, size_t ldy, size_t r0, size_t r1);
void kern_matmul_act_panels(enum dtype wt, const void *wp, const struct kern_act *a, float *y,
                            size_t ldy, size_t r0, size_t r1);

/*
 * Round-to-nearest quantization of one row of n f32 values (n a multiple of the group) to an
 * int4 group type (dtype_is_q4g), the converter's rule (docs/IEBIN.md):
 *   q4_gN:  d = m / -8, m the group's element of largest magnitude (sign kept; q4_0's rule),
 *           q = clamp(round(x / d) + 8, 0, 15);
 *   q4z_gN: d = (max - min) / 15, m = min, q = clamp(round((x - m) / d), 0, 15).
 * d and m are rounded to f16 before the codes are computed from them. 0, or ERR_RANGE for a
 * non-finite input (nothing meaningful to store), ERR_FORMAT for a ragged n.
 */
int kern_quantize_row_q4g(enum dtype dt, const float *x, void *dst, size_t n);
/*
 * The same layouts, and q4_0's, with `--rounding search`: per group, the scale (and offset)
 * of least squared error among candidates around the round-to-nearest choice, each refitted
 * by least squares for its codes (kernels/ref_q4g.c); never worse than round to nearest.
 */
int kern_quantize_row_q4_search(enum dtype dt, const float *x, void *dst, size_t n);

/*
 * One row of n f32 values (n a multiple of 256) to a GGUF k-quant (dtype_is_kq: q4_k, q5_k,
 * q6_k) in ggml's block layout, with a search in the spirit of ggml's make_qkx2_quants
 * (q4_k, q5_k: per sub-block of 32 the scale and min of least weighted squared error over a
 * grid of candidates, each refitted by least squares) and make_qx_quants (q6_k: per 16, a
 * signed scale), the sub-block scales then rounded to 6 bits (int8 for q6_k) under an f16
 * super-block scale (kernels/ref_kq.c). 0, ERR_RANGE for a non-finite input, ERR_FORMAT for
 * a ragged n (both logged).
 */
int kern_quantize_row_kq(enum dtype dt, const float *x, void *dst, size_t n);

/*
 * kern_quantize_row_kq over rows rows of n: x [rows][n] to dst [rows][row bytes], split over
 * `threads` threads (<= 0: the online CPUs; at most 16) in contiguous shares. Each row's bytes
 * depend on that row alone, so the output never depends on the thread count. 0, or the error
 * of the first failing row (ERR_FORMAT for a ragged n, ERR_RANGE for a non-finite value).
 */
int kern_quantize_rows_kq(enum dtype dt, const float *x, size_t rows, size_t n, void *dst,
                          int threads);

/* ---- LoRA shrink and expand (worker/model/matmul_lora.c's serving path) ------------------------------ */

/*
 * The two low-rank products of a LoRA update, y += s * B (A x), on the adapter's packed
 * weights (wt: DT_F32 or DT_BF16):
 *   shrink: t[i][k] = sum_c x[i][c] * a[k][c] for i < n, k in [k0, k1)
 *           a: [rank][in], x: [n][in] f32, t: [n][rank] f32 (only columns [k0, k1)).
 *   expand: y[i][j] += s_i * sum_k t[i][k] * bt[k][j] for i < n, j in [j0, j1),
 *           s_i = scale ? scale[i] : s;
 *           bt: B^T in panels of KERN_LORA_PANEL output columns, [ceil(out/32)][rank][32],
 *           the last panel zero-padded (bt[k][j] at (j/32)*rank*32 + k*32 + j%32),
 *           t: [n][rank], y: [n][ldy].
 * kern_lora_shrink / kern_lora_expand run, by wt and kern_isa(), these variants
 * (kern_variants.h):
 *   _<wt>_f32_{ref,avx2}: f32 activations; bf16 weights widened exactly.
 *   _bf16_bf16_{ref,avx512}: bf16 weights on AVX512-BF16 (and rank <= KERN_LORA_RANK_MAX):
 *     x and t rounded to bf16 (round to nearest even), products summed in f32, so vdpbf16ps
 *     does 32 multiply-adds per instruction with no widening (ADR 0006, session 6 addendum);
 *     a zero s_i leaves row i's bits alone.
 * SIMD variants differ from their _ref twin only in the order of the f32 sums
 * (tests/lora/test_lora.c states the bounds). A token's result does not depend on n or on
 * the other tokens (batched = alone).
 */
#define KERN_LORA_PANEL 32u
#define KERN_LORA_RANK_MAX 256u
void kern_lora_shrink(enum dtype wt, const void *a, size_t in, size_t rank, const float *x,
                      size_t n, float *t, size_t k0, size_t k1);
void kern_lora_expand(enum dtype wt, const void *bt, size_t rank, const float *t, size_t n,
                      const float *scale, float s, float *y, size_t ldy, size_t j0, size_t j1);

/*
 * LoRA shrink and expand on int8 adapter weights (the serving copy of --lora-weights int8,
 * worker/model/lora.h LORA_PACK_INT8): the same products as above, on 8-bit codes with one
 * f32 scale per rank row of A and of B^T, and activations quantized per token:
 *   a:  f32 sa[rank], padded to KERN_LORA_I8_HDR(rank) bytes, then [rank][in] codes q + 128
 *       (bytes; q in -127..127): A[k][c] ~= sa[k] * q[k][c].
 *   bt: f32 sb[rank], padded to KERN_LORA_I8_HDR(rank) bytes, then panels of 32 output
 *       columns, [ceil(out/32)][ceil(rank/4)][32][4] codes q + 128: rank k = 4g + e of column j
 *       at panel j/32, group g, byte (j%32)*4 + e (KERN_LORA_I8_BT_INDEX); padding codes are
 *       128 (zero). B[j][k] ~= sb[k] * q[k][j].
 *   shrink: x[i] quantized symmetrically (sx_i = max|x[i]| / 127, qx = x * (127 / max|x[i]|)
 *           rounded to nearest even), t[i][k] = sa[k] * (sx_i * (float)sum_c qx[c] * q[k][c]);
 *   expand: u[k] = t[i][k] * sb[k] quantized the same way (su_i, qu),
 *           y[i][j] += s_i * (su_i * (float)sum_k qu[k] * q[k][j]); a zero s_i leaves row i's
 *           bits alone.
 * The integer sums are exact (int32: in <= KERN_LORA_I8_IN_MAX), so the SIMD variants
 * (_avx512: vpdpbusd on the +128 codes with the activations' sums as correction; _avx2:
 * vpmaddubsw on |q| and the sign-moved activations) equal their _ref twin bit for bit, and a
 * token's result does not depend on the other tokens. The error against the f32 product is
 * bounded in tests/lora/test_lora_i8.c (docs/LORA.md "8-bit adapter weights").
 * kern_lora_*_i8 run the active ISA's variant (kernels/dispatch.c).
 */
#define KERN_LORA_I8_IN_MAX 16384u
#define KERN_LORA_I8_HDR(rank) (((size_t)(rank) * 4 + 63) / 64 * 64)
#define KERN_LORA_I8_BT_INDEX(rank, k, j)                                                      \
    (((size_t)(j) / 32) * (((size_t)(rank) + 3) / 4) * 128 + ((size_t)(k) / 4) * 128 +        \
     ((size_t)(j) % 32) * 4 + (size_t)(k) % 4)
void kern_lora_shrink_i8(const void *a, size_t in, size_t rank, const float *x, size_t n,
                         float *t, size_t k0, size_t k1);
void kern_lora_expand_i8(const void *bt, size_t rank, const float *t, size_t n,
                         const float *scale, float s, float *y, size_t ldy, size_t j0,
                         size_t j1);
/* The variants (tests): _ref, _avx2, _avx512 (AVX-512 VNNI). */
void kern_lora_shrink_i8_ref(const void *a, size_t in, size_t rank, const float *x, size_t n,
                             float *t, size_t k0, size_t k1);
void kern_lora_shrink_i8_avx2(const void *a, size_t in, size_t rank, const float *x, size_t n,
                              float *t, size_t k0, size_t k1);
void kern_lora_shrink_i8_avx512(const void *a, size_t in, size_t rank, const float *x,
                                size_t n, float *t, size_t k0, size_t k1);
void kern_lora_expand_i8_ref(const void *bt, size_t rank, const float *t, size_t n,
                             const float *scale, float s, float *y, size_t ldy, size_t j0,
                             size_t j1);
void kern_lora_expand_i8_avx2(const void *bt, size_t rank, const float *t, size_t n,
                              const float *scale, float s, float *y, size_t ldy, size_t j0,
                              size_t j1);
void kern_lora_expand_i8_avx512(const void *bt, size_t rank, const float *t, size_t n,
                                const float *scale, float s, float *y, size_t ldy, size_t j0,
                                size_t j1);
/* Symmetric int8 quantization of n values (the activations' rule above): q[i] (int8) and
 * the scale max|v| / 127 returned (0 for an all-zero v: q all 0). The packer's rule for the
 * weights too. */
float kern_lora_i8_quant(const float *v, size_t n, int8_t *q);
/*
 * The int8 shrink on x already quantized: a segment's tokens meet every product of a job that
 * shares their input (q, k, v; gate, up), so the caller quantizes them once per job, not once
 * per product (worker/model/matmul_lora.c, session 14).
 *   kern_lora_i8_quant_x: x [n][in] -> qx [n][KERN_LORA_I8_LDX(in)] codes (zeros past in),
 *     xs[n] scales and xsum[n] sums of each token's codes, by kern_lora_i8_quant's rule (the
 *     same codes); in <= KERN_LORA_I8_IN_MAX.
 *   kern_lora_shrink_i8q: t as kern_lora_shrink_i8 computes it from those (the same bits).
 * Both run the active ISA's variant (_ref, _avx2, _avx512, kernels/lora_kern.c).
 */
#define KERN_LORA_I8_LDX(in) (((size_t)(in) + 63) / 64 * 64)
void kern_lora_i8_quant_x(const float *x, size_t in, size_t n, int8_t *qx, float *xs,
                          int32_t *xsum);
void kern_lora_shrink_i8q(const void *a, size_t in, size_t rank, const int8_t *qx,
                          const float *xs, const int32_t *xsum, size_t n, float *t, size_t k0,
                          size_t k1);
/*
 * The int8 expand on u already quantized (session 18): u = t * sb and its codes depend only on
 * t, but kern_lora_expand_i8 recomputed them on every call, and the fused job calls it per
 * tile of 512 columns (36 tiles of 7 projections a layer on TinyLlama); the caller quantizes
 * each (product, adapter) once when its shrinks are done (worker/model/matmul_lora.c).
 *   kern_lora_i8_quant_u: bt's scales (the header of kern_lora_expand_i8's bt) and t [n][rank]
 *     -> qu [n][KERN_LORA_I8_LDU(rank)] codes of u (zeros past rank), us[n] scales and usum[n]
 *     sums of each token's codes, by kern_lora_i8_quant's rule (the same codes); qu 4-byte
 *     aligned.
 *   kern_lora_expand_i8q: y as kern_lora_expand_i8 computes it from those (the same bits).
 * Both run the active ISA's variant (_ref, _avx2, _avx512; kernels/lora_kern.c; quant_u's
 * AVX2 column is its scalar twin).
 */
#define KERN_LORA_I8_LDU(rank) (((size_t)(rank) + 15) / 16 * 16)
void kern_lora_i8_quant_u(const void *bt, size_t rank, const float *t, size_t n, int8_t *qu,
                          float *us, int32_t *usum);
void kern_lora_expand_i8q(const void *bt, size_t rank, const int8_t *qu, const float *us,
                          const int32_t *usum, size_t n, const float *scale, float s, float *y,
                          size_t ldy, size_t j0, size_t j1);
/*
 * The bf16 shrink on x already rounded (session 15): where kern_lora_shrink rounds x to bf16
 * (kern_lora_shrink_rounds_x: the _bf16_bf16 variant, AVX512-BF16 and rank <= KERN_LORA_RANK_MAX)
 * it did so for every adapter and product; the caller rounds a segment's tokens once per
 * job's task instead (worker/model/matmul_lora.c), as the int8 path quantizes them.
 *   kern_lora_bf16_x: x [n][in] f32 -> xb [n][KERN_LORA_BF16_LDX(in)] bf16, round to nearest
 *     even (the _bf16_bf16 rule), zeros past in; xb 64-byte aligned; in <= KERN_LORA_BF16_IN_MAX.
 *   kern_lora_shrink_bf16x: t as kern_lora_shrink(DT_BF16, ...) computes it from x when
 *     kern_lora_shrink_rounds_x(DT_BF16, rank) (the same bits), a: [rank][in] bf16.
 * Both run the active ISA's variant: _avx512 on AVX512-BF16, else _ref (the AVX2 column is
 * the scalar twin too: there kern_lora_shrink keeps x in f32 and the caller does not round).
 */
#define KERN_LORA_BF16_LDX(in) (((size_t)(in) + 31) / 32 * 32)
#define KERN_LORA_BF16_IN_MAX 8192u
int kern_lora_shrink_rounds_x(enum dtype wt, size_t rank);
void kern_lora_bf16_x(const float *x, size_t in, size_t n, uint16_t *xb);
void kern_lora_shrink_bf16x(const void *a, size_t in, size_t rank, const uint16_t *xb,
                            size_t n, float *t, size_t k0, size_t k1);

/* ---- block-sparse (BSR) GEMV (kernels/sparse.c; the file format is worker/formats/bsr.h) --------- */

/*
 * A block-sparse [rows][cols] f32 matrix: uniform br x bc blocks, stored row-major inside each
 * block, block rows in order, the blocks of one block row in increasing block column. Edge
 * blocks are stored whole with zeros outside the matrix (worker/formats/bsr.c guarantees it); the
 * kernels never read x past cols nor write y past rows. Borrowed pointers, read-only.
 */
struct kern_bsr {
    size_t rows, cols;       /* the matrix */
    size_t br, bc;           /* block shape, >= 1 */
    const uint32_t *row_ptr; /* [ceil(rows/br) + 1]: block row b owns blocks [row_ptr[b], row_ptr[b+1]) */
    const uint32_t *col_idx; /* [row_ptr[nbr]] block column of each block, < ceil(cols/bc) */
    const float *blocks;     /* [row_ptr[nbr]][br][bc] */
};

/*
 * y[r] = sum_c W[r][c] * x[c] for the rows of block rows [b0, b1) (clipped to m->rows); a
 * block row without blocks yields zeros. x: [cols], y: [rows]. f32 products and accumulation
 * (the SIMD variants sum 8/16 lanes per row, then reduce: order differs from _ref).
 * Runs the variant of kern_isa() (kern_variants.h: kern_gemv_bsr_f32_<isa>).
 */
void kern_bsr_gemv(const struct kern_bsr *m, const float *x, float *y, size_t b0, size_t b1);

/* ---- elementwise kernels (kernels/elt.c, x86/avx2_elt.c, x86/avx512_elt.c) ----------------
 *
 * f32 in, f32 out, any length (0 included), any alignment; y may be the same array as an
 * input (in-place use), other overlaps are not allowed. The entries run the variant of
 * kern_isa(); kern_<op>_f32_f32_<isa> (kern_variants.h) are the variants themselves (the
 * _ref one is the specification, built on kernels/fastmath.h; the SIMD ones use the same
 * algorithm and the same fused multiply-adds, so exp and tanh agree with _ref bit for bit and
 * the others differ only by summation order).
 *
 * Error bounds, asserted by tests/kern/test_kern_elt.c (docs/adr/0004 addendum):
 *  - exp: relative to exp() in double, <= KERN_EXP_MAX_REL_ERR for normal results, plus
 *    2^-149 absolute for subnormal ones; 0 below -104, +inf above 88.7228 (FLT_MAX), NaN ->
 *    NaN. Swept over every 127th float bit pattern.
 *  - tanh: relative to tanh() in double <= KERN_TANH_MAX_REL_ERR; tanh(±0) = ±0,
 *    tanh(±inf) = ±1, subnormals pass through exactly.
 *  - silu(v) = v / (1 + e^-v), v = x + b rounded to f32: relative to double
 *    <= KERN_SILU_MAX_REL_ERR, plus KERN_ACT_ABS_ERR absolute (results below ~1e-37 may
 *    flush to -0 when e^-v overflows); silu(-inf) = -0.
 *  - gelu (tanh form) = 0.5 v (1 + tanh u), u = sqrt(2/pi) (v + 0.044715 v^3), computed as
 *    v / (1 + e^{-2u}) (no cancellation for negative v): relative to double
 *    <= KERN_GELU_MAX_REL_ERR + KERN_GELU_U_REL_ERR * |2u| (u's f32 rounding times the
 *    condition number of e^{-2u}), plus KERN_ACT_ABS_ERR absolute.
 *  - softmax, rmsnorm, swiglu, rope: against _ref, see the test (summation order differs).
 */
#define KERN_EXP_MAX_REL_ERR 2e-7
#define KERN_TANH_MAX_REL_ERR 2e-7
#define KERN_SILU_MAX_REL_ERR 1e-6
#define KERN_GELU_MAX_REL_ERR 1e-6
#define KERN_GELU_U_REL_ERR 4e-7
#define KERN_ACT_ABS_ERR 1e-30

/* y[i] = e^x[i] (kern_exp), tanh(x[i]) (kern_tanh), for i < n. */
void kern_exp(float *y, const float *x, size_t n);
void kern_tanh(float *y, const float *x, size_t n);
/* y[i] = act(x[i] + b[i]) for act = SiLU / GELU-tanh; b may be NULL (no bias). */
void kern_silu(float *y, const float *x, const float *b, size_t n);
void kern_gelu(float *y, const float *x, const float *b, size_t n);
/* In place: x[i] = e^(x[i] - max) / sum_j e^(x[j] - max). -inf entries (masked) give 0;
 * a NaN or +inf entry, or all entries -inf, makes the whole row NaN. n == 0 is a no-op. */
void kern_softmax(float *x, size_t n);
/* y[i] = w[i] * (x[i] * r), r = 1 / sqrtf(sum(x^2) / n + eps) (worker/model/forward.c's rmsnorm). */
void kern_rmsnorm(float *y, const float *x, const float *w, size_t n, float eps);
/* y[i] = silu(gate[i]) * up[i]. */
void kern_swiglu(float *y, const float *gate, const float *up, size_t n);
/*
 * gpt-oss's clamped SwiGLU with the experts' biases, in place on g (i < n):
 *   gv = min(g[i] + bg[i], limit),  uv = min(max(u[i] + bu[i], -limit), limit),
 *   g[i] = gv / (1 + e^(-alpha gv)) * (uv + 1),   e^ = fm_expf, e^ = +inf giving -0.
 * The clamps are comparisons (a NaN sum takes the limit, as fminf/fmaxf do). Per element, so
 * any split of a row gives the same bits; the SIMD variants are bit-identical to _ref.
 */
void kern_swiglu_clamp(float *g, const float *u, const float *bg, const float *bu, size_t n,
                       float alpha, float limit);
/*
 * Rotates the interleaved pairs (v[2i], v[2i+1]) of n_heads heads of hd elements each (hd
 * even) by the angles of cs [hd/2][2] = (cos, sin):
 *   v0' = v0 cos - v1 sin,  v1' = v0 sin + v1 cos.
 */
void kern_rope(float *v, size_t n_heads, size_t hd, const float *cs);
/* cs [half][2] = cos, sin of pos * inv_freq[i], computed in double (as worker/model/forward.c). */
void kern_rope_table(float *cs, uint32_t pos, const float *inv_freq, size_t half);

/* ---- attention (kernels/attn.c, x86/avx2_attn.c, x86/avx512_attn.c) ----------------------
 *
 * One tile kernel with explicit online-softmax state. nq query rows that read the same KV
 * head (a GQA group, or the tokens x group heads of a prefill chunk) each carry a running
 * maximum m, a running sum l and an unnormalised output o [hd]; a tile of n positions updates
 * them as
 *   m' = max(m, max_j s_j),  s_j = scale * q . k_j
 *   l  = l e^(m-m') + sum_j e^(s_j-m')
 *   o  = o e^(m-m') + sum_j e^(s_j-m') v_j
 * and kern_attn_end() divides o by l: softmax(scale q K^T) V without an [nq x n] score
 * matrix. Row r sees only the first vis[r] positions of the tile (causal masks; 0 = the row
 * is not touched); vis == NULL means all n. kern_attn_span also takes per-row starts lo[r]
 * (a sliding window's first position inside the tile). Every row must have seen >= 1
 * position, or have been started from a sink (kern_attn_begin_sinks), before kern_attn_end().
 * K and V: n rows of hd elements of dtype kvt (f32, f16 or bf16), row j at k + j*ld bytes
 * (same ld for V). The kernel widens f16/bf16 tiles to f32 once and shares them between all
 * nq rows; products and sums are f32, exp is fm_expf (kernels/fastmath.h), so the SIMD paths
 * differ from _ref only by summation order and FMA contraction. hd <= KERN_ATTN_HD_MAX.
 * Bound asserted by tests/kern/test_kern_attn.c against softmax(q K^T / sqrt(hd)) V in double
 * on the stored values: |err| <= KERN_ATTN_MAX_ERR * max|v|.
 * Batch invariance (docs/DESIGN.md): a row's result depends only on its own q, state, window
 * [lo, vis) and the tile's K/V rows, never on the other rows of the call, their number, or
 * whether vis/lo are NULL; so a query computed in a decode and inside any prefill chunk over
 * the same block spans gives the same bits. Attention never depends on the thread count.
 */
#define KERN_ATTN_HD_MAX 256
#define KERN_ATTN_TILE 64 /* positions widened at once; kern_attn_causal's tile */
#define KERN_ATTN_MAX_ERR 2e-5

/* m[r] = -inf, l[r] = 0, o[r] [hd] = 0 for r < nq. */
void kern_attn_begin(float *const *o, float *m, float *l, size_t nq, size_t hd);
/* m[r] = sinks[r], l[r] = 1, o[r] [hd] = 0 for r < nq: the online softmax started from a
 * learned per-row sink logit (gpt-oss), which joins the normalisation unscaled and has no value
 * row. sinks == NULL: kern_attn_begin. */
void kern_attn_begin_sinks(float *const *o, float *m, float *l, const float *sinks, size_t nq,
                           size_t hd);
/* o[r] [hd] /= l[r] for r < nq. */
void kern_attn_end(float *const *o, const float *l, size_t nq, size_t hd);
/* The tile kernel of kern_isa() for K/V dtype kvt (DT_F32, DT_F16 or DT_BF16). */
void kern_attn(enum dtype kvt, const float *const *q, float *const *o, float *m, float *l,
               const uint32_t *vis, size_t nq, const void *k, const void *v, size_t ld,
               size_t n, size_t hd, float scale);
/* kern_attn where row r sees tile positions [lo[r], vis[r]) (a sliding window's start inside
 * the tile); lo == NULL: kern_attn. Rows with lo[r] >= vis[r] are not touched. K/V rows below a
 * row's lo are not read for it (f16/bf16 tiles widen rows from the smallest lo[r] of the rows
 * that see something there). */
void kern_attn_span(enum dtype kvt, const float *const *q, float *const *o, float *m, float *l,
                    const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                    const void *v, size_t ld, size_t n, size_t hd, float scale);

/*
 * The paged decode walk: nq rows that see every one of n positions, stored as blocks of bt
 * positions; block i (positions [i*bt, min(n, (i+1)*bt))) has its K rows at kb[i] and its V
 * rows at kb[i] + voff bytes, row j of a block j*ld bytes on (kvt as kern_attn). The same bits
 * as kern_attn(kvt, q, o, m, l, NULL, nq, kb[i], kb[i] + voff, ld, positions of block i, hd,
 * scale) for i = 0, 1, ... in turn (that loop is its specification and what it runs where
 * the ISA has no walk of its own; AVX-512: 4 to 8 rows over 16-position blocks, the rows in
 * lanes, the blocks two ahead prefetched). State as kern_attn: begin before, end after.
 */
void kern_attn_blocks(enum dtype kvt, const float *const *q, float *const *o, float *m,
                      float *l, size_t nq, const void *const *kb, size_t voff, size_t ld,
                      size_t bt, size_t n, size_t hd, float scale);

/*
 * Causal attention over a contiguous cache (prefill, and decode as a chunk of one): nt tokens
 * at positions pos0 .. pos0+nt-1, each with `group` query heads that share one KV head.
 * q [nt][ldq] floats: token t's head j at q + t*ldq + j*hd; out [nt][ldo] alike.
 * k, v: positions 0 .. pos0+nt-1 of that KV head, position p at k + p*ld bytes (dtype kvt).
 * Token t attends to positions [0, pos0+t]; walked in KERN_ATTN_TILE-position tiles, up to
 * 64 query rows at a time (state on the stack, no allocation). Scale 1/sqrt(hd).
 */
void kern_attn_causal(enum dtype kvt, size_t nt, size_t group, size_t hd, const float *q,
                      size_t ldq, const void *k, const void *v, size_t ld, uint32_t pos0,
                      float *out, size_t ldo);
/*
 * kern_attn_causal with a sliding window (token at position p sees positions
 * [p-window+1, p]; window 0 = unbounded) and sinks [group], one per query head of the group
 * (head j of every token starts from sinks[j], kern_attn_begin_sinks; NULL: none). k/v still
 * address positions from 0 (the caller may keep older rows or not: the kernel never reads
 * below pos0-window+1, the first token's window start). Scale 1/sqrt(hd) (gpt-oss: YaRN's
 * concentration is applied to q and k by the caller's RoPE, not here).
 */
void kern_attn_causal_swa(enum dtype kvt, size_t nt, size_t group, size_t hd, const float *q,
                          size_t ldq, const void *k, const void *v, size_t ld, uint32_t pos0,
                          uint32_t window, const float *sinks, float *out, size_t ldo);

/* ---- 8-bit KV cache rows (kernels/kv8.c, x86/avx*_attn.c; docs/KV.md "8-bit KV") -------
 *
 * A KV8 head row (dtype DT_KV_I8 or DT_KV_E4M3, common/dtype.h) is hd 8-bit codes then one f32
 * scale: kern_kv8_head_bytes(hd) bytes, x[d] = scale * value(code[d]), value = the int8 code
 * (scale = max|x| / 127) or the FP8 E4M3 code's value (scale = max|x| / 448). kern_attn and
 * kern_attn_span accept these two dtypes with k/v pointing at head rows (row j at k + j*ld):
 * the kernels decode each row once per sub-tile, inside the tile walk. Rows are written
 * rotated (kern_kv_rotate), so the caller rotates q the same way and unrotates the output.
 * Error of one stored value, |x - decoded| (tests/kern/test_kern_kv8.c): int8 <= max|x| / 254;
 * E4M3 <= max|x| * 2^-4 (half an ulp of a 3-bit mantissa, relative), and <= max|x| * 2^-10
 * near zero (the subnormal quantum 2^-9 of the scaled value, halved).
 */
#define KERN_KV8_SCALE_BYTES 4
static inline size_t kern_kv8_head_bytes(size_t hd) { return hd + KERN_KV8_SCALE_BYTES; }
/* x [hd] f32 (already rotated) -> dst [kern_kv8_head_bytes(hd)]; a row with a NaN or an
 * infinity stores a NaN scale (it reads back NaN, as an f32 cache would). */
void kern_kv8_quant(enum dtype kvt, const float *x, void *dst, size_t hd);
/* src [kern_kv8_head_bytes(hd)] -> out [hd] f32 (still rotated). */
void kern_kv8_dequant(enum dtype kvt, const void *src, float *out, size_t hd);
/* x [hd] <- R x with R = H D orthonormal (D fixed random signs, H the normalized
 * Walsh-Hadamard matrix, block-diagonal in power-of-two chunks when hd is not one);
 * kern_kv_unrotate applies R^T. hd <= KERN_ATTN_HD_MAX. */
void kern_kv_rotate(float *x, size_t hd);
void kern_kv_unrotate(float *x, size_t hd);

#endif
