/*
 * internal.h — kernels-private declarations shared between the entry points (dispatch.c,
 * act.c, panels.c, ...), the type traits (traits.c) and the per-ISA files (libuv's uv__
 * habit: kern__ names never leave this folder, and this header is not on any other target's
 * include path).
 *
 * The dispatch design (docs/adr/0004, addendum "one dispatch table"), ggml-style:
 *  - struct kern_type_traits, one per weight dtype (kern__traits, traits.c): what the kernels
 *    know about the type whatever the ISA (block geometry, the row converter, the activation
 *    form its products read, its panel layout if any) and, per ISA, the variants that run its
 *    products, panels, LoRA products and attention over caches of it.
 *  - struct kern_ops (kern__ops): the table the entry points read. kern_init() /
 *    kern_force_isa() fill it once from the traits' column of the chosen ISA plus the
 *    elementwise, BSR and act_prepare variants of that ISA; afterwards every entry is a load
 *    and an indirect call, with no per-call CPUID, getenv or switch on the ISA.
 * Only dispatch.c reads the ISA; no other file here tests it.
 *
 * Adding a block format (MXFP4, Q4_K, ...): write its variants (kern_<op>_<type>_<act>_<isa>,
 * declared in kern_variants.h), its row converter, and fill its kern__traits entry in
 * traits.c. Nothing else routes on the type.
 */
#ifndef CLOCHER_KERNELS_INTERNAL_H
#define CLOCHER_KERNELS_INTERNAL_H

#include "kern.h"
#include "kern_variants.h"

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
 * runs inside a product whose activations live in slot 0 (panels.c). */
void *kern__scratch_slot(int slot, size_t bytes);

/* ---- type traits ------------------------------------------------------------------------- */

/* The form of struct kern_act a weight type's products read (act.c lays it out). */
enum kern__act_form {
    KERN__ACT_F32,  /* xf: a padded f32 copy */
    KERN__ACT_BF16, /* xf and xb: the copy and x rounded to bf16 */
    KERN__ACT_Q8,   /* q, d, ns4, ns32, d4: int8 blocks of 32 with their sums and scales */
};

/* One row of n elements of the type -> f32 (n a multiple of the block). */
typedef void kern__row_fn(const void *row, float *out, size_t n);
/* Writes panels [p0, p1) of dst from the stored rows w [rows][cols] (kern.h kern_panels_pack). */
typedef void kern__pack_fn(const void *w, size_t cols, void *dst, size_t rows, size_t p0,
                           size_t p1);
/* Fills tokens [t0, t1) of the q8/bf16 arrays (kern_act_prepare; the f32 copy is act.c's). */
typedef void kern__act_prepare_fn(const struct kern_act *a, size_t t0, size_t t1);
/* The products' entry on prepared activations (kern_matmul's body, by ISA). */
typedef void kern__matmul_fn(enum dtype wt, const void *w, size_t cols, const float *x,
                             size_t n, float *y, size_t ldy, size_t r0, size_t r1);

/*
 * A panel layout (bytes: kernels/include/quant.h): panels of `rows` rows, block_bytes bytes
 * per row and block (the stored block's, or more where the panel decodes something at load).
 * q4_0/q8_0/mxfp4 (qoff != NULL): block b of a panel keeps the 4-byte groups of its rows'
 * quants interleaved at qoff(b, nb) (group g of row i at + g*64 + i*4, each byte XORed with
 * xor_mask) and the rows' scales (hdr bytes each: an f16, or mxfp4's E8M0 byte) at
 * soff(b, nb) + i*hdr; the stored block is the scale then block_bytes - hdr quant bytes.
 * qoff == NULL: a k-quant layout (quant.h "q4_K panels"), which panels.c packs and unpacks
 * by its dtype.
 */
struct kern__panel_layout {
    size_t rows;
    size_t block_bytes;
    uint8_t xor_mask;
    size_t (*qoff)(size_t b, size_t nb);
    size_t (*soff)(size_t b, size_t nb);
    size_t hdr; /* scale bytes at the head of a stored block (qoff != NULL) */
};

/* What one ISA runs for one weight type; NULL where the type has no such product. */
struct kern__type_ops {
    kern_mm_fn *gemv, *gemm;   /* products on prepared activations ... */
    size_t gemm_min_n;         /* ... gemm from this many tokens on, gemv below */
    kern_mm_fn *panel_gemm;    /* products on the type's panels (any n) */
    kern__pack_fn *panel_pack; /* the load-time repack */
    kern_lora_shrink_fn *lora_shrink;  /* LoRA adapters stored in this type */
    kern_lora_expand_fn *lora_expand;
    kern_lora_shrink_fn *lora_shrink_lowrank; /* instead, when rank <= KERN_LORA_RANK_MAX */
    kern_lora_expand_fn *lora_expand_lowrank;
    kern_attn_fn *attn;        /* attention tiles over K/V caches of this type */
    size_t tiles_min_n;        /* from this many tokens, activations prepared with
                                  KERN_ACT_BF16_TILES get their xt copy (0: never) ... */
    kern__act_prepare_fn *act_tiles; /* ... which this fills (tokens [t0, t1)) */
};

enum { KERN__ISA_COUNT = 3 };

struct kern_type_traits {
    uint32_t block, block_bytes;   /* elements and bytes per block (as common/dtype.h) */
    kern__row_fn *to_f32;          /* kern_row_to_f32 */
    enum kern__act_form act;       /* what its products read */
    int32_t act_offset;            /* KERN__ACT_Q8: the unsigned weights' offset (ns4/ns32) */
    const struct kern__panel_layout *panels; /* NULL: no panel layout */
    struct kern__type_ops isa[KERN__ISA_COUNT]; /* by enum kern_isa */
    struct kern__type_ops bf16;    /* on AVX-512 with AVX512-BF16: non-NULL fields replace the
                                      avx512 column's */
    struct kern__type_ops amx;     /* then with AMX-BF16 (kern_has_amx_bf16, not CLOCHER_AMX=0):
                                      non-NULL fields replace those */
};

/* Indexed by enum dtype; every dtype has an entry (traits.c). */
extern const struct kern_type_traits kern__traits[DT_COUNT_];

/* ---- the dispatch table ------------------------------------------------------------------ */

struct kern_ops {
    enum kern_isa isa;
    int amx;                               /* the amx overlay is applied */
    struct kern__type_ops type[DT_COUNT_]; /* kern__traits[dt].isa[isa] (+ bf16, + amx) */
    kern__matmul_fn *matmul;               /* kern_matmul */
    kern__act_prepare_fn *act_prepare;
    kern_bsr_fn *bsr_gemv;
    kern_map_fn *exp, *tanh;
    kern_bias_act_fn *silu, *gelu;
    kern_softmax_fn *softmax;
    kern_rmsnorm_fn *rmsnorm;
    kern_swiglu_fn *swiglu;
    kern_rope_fn *rope;
    kern_swiglu_clamp_fn *swiglu_clamp;
};

/* Written by kern_init()/kern_force_isa() only (dispatch.c), read-only afterwards. Before
 * kern_init() it holds the scalar ISA's table, so a missed kern_init is slow, not a crash. */
extern struct kern_ops kern__ops;
/* kern_set_panel_streams' value: 1, 2 or 4 (the mxfp4 panels and experts) */
extern int kern__panel_streams;
/* ... 1 or 2 for the q4_0/q8_0 panels (kern_init: 1 on AMD Zen 5 and later) */
extern int kern__qpanel_streams;
/* 1: the AVX-512 kernels may use GFNI (the CPU has it, CLOCHER_GFNI is not 0; dispatch.c) */
extern int kern__gfni;

/* The calling thread's side list (kern.h kern_side_prefetch; dispatch.c): lines [p[i], e[i])
 * of ranges i..n-1 still to request, `lines` of them in all. */
struct kern__side_pf {
    const char *p[KERN_SIDE_PF_MAX], *e[KERN_SIDE_PF_MAX];
    unsigned i, n;
    size_t lines;
};
extern _Thread_local struct kern__side_pf kern__side;
/*
 * The calling thread's side list, taken once per tile call before its block loop and passed
 * in. The kernels are position-independent code, where a thread-local's address is a
 * __tls_get_addr call to the compiler (the linker relaxes it to a %fs load afterwards, too
 * late for the register allocator): read inside the decode tiles' block loops, that call made
 * GCC spill and reload the tile's 16+ live zmm accumulators and run vzeroupper every block
 * (perf annotate, session 25: the int4 8-stream decode ran ~15 % slower). The empty asm makes
 * the address an opaque value computed here, which GCC cannot recompute inside the loop (it
 * did so with a plain local); the initial-exec TLS model did the same but tripped UBSan's null
 * check (a false "member access within null pointer" on the address GCC formed for it).
 */
static inline struct kern__side_pf *kern__side_list(void)
{
    struct kern__side_pf *s = &kern__side;
    __asm__("" : "+r"(s));
    return s;
}

/* One line of the side list, if any: per block of a decode panel tile (a block is ~50-100
 * cycles of a DRAM-bound stream), the gentlest trickle; in bursts per panel pair the requests
 * waited for fill buffers beside the tile's own (session 24). */
static inline void kern__side_one(struct kern__side_pf *s)
{
    if (!s->lines)
        return;
    s->lines--;
    __builtin_prefetch(s->p[s->i], 0, 2);
    s->p[s->i] += 64;
    if (s->p[s->i] >= s->e[s->i])
        s->i++;
}

/* ---- pieces the traits point at ---------------------------------------------------------- */

/* kern_act_prepare per ISA: the scalar specification and two bit-identical SIMD versions. */
kern__act_prepare_fn kern__act_prepare_ref, kern__act_prepare_avx2, kern__act_prepare_avx512;
/* kern_act_prepare's xt (the AMX-BF16 q4_0/q8_0 panel product's A tiles; x86/amx_qbf16.c). */
kern__act_prepare_fn kern__act_tiles_amx;

/* The scalar ISA's product: kern_matmul_ref on a->x (f32, unquantized), whatever a's form. */
kern_mm_fn kern__matmul_act_f32;

/* Panels without a panel kernel: unpack each panel's rows, run kern_matmul_act on them. */
kern_mm_fn kern__panels_via_rows;
/* The scalar repack of each panel kind (panels.c), and their AVX-512 versions (the same
 * bytes). */
kern__pack_fn kern__panels_pack_q4_0_ref, kern__panels_pack_q8_0_ref, kern__panels_pack_mxfp4_ref;
kern__pack_fn kern__q4p_pack_avx512, kern__q8p_pack_avx512; /* x86/avx512_q.c */
kern__pack_fn kern__mxp_pack_avx512;                         /* x86/avx512_mxfp4.c */
/* k-quant panels (quant.h "q4_K panels", "q6_K panels"): the repack every ISA runs (panels.c;
 * byte moves, no ISA has its own). */
kern__pack_fn kern__panels_pack_q4_k, kern__panels_pack_q6_k;

/* Row converters (ref.c, ref_q4g.c, ref_kq.c). */
kern__row_fn kern__row_f32, kern__row_f16, kern__row_bf16, kern__row_q8_0, kern__row_q4_0,
    kern__row_mxfp4;
kern__row_fn kern__row_q4_g64, kern__row_q4_g128, kern__row_q4z_g32, kern__row_q4z_g64,
    kern__row_q4z_g128;
kern__row_fn kern__row_q4_k, kern__row_q5_k, kern__row_q6_k; /* ref_kq.c */

#endif
