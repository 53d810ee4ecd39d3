/*
 * lora.h — LoRA adapters: PEFT adapter loading, a registry with reference counts, and the
 * grouped low-rank update applied after each base projection of a batch.
 *
 * An adapter adds, to a base projection y = W x (W: [out][in]), the low-rank term
 *     y += s * B (A x),   A: [r][in], B: [out][r], s = lora_alpha / r  (rsLoRA: / sqrt(r))
 * times a per-request scale. Adapters come from Hugging Face PEFT directories
 * (adapter_config.json + adapter_model.safetensors, docs/LORA.md); they are validated against
 * the base model's hyper-parameters and stored as f32, with the rows of lora_B for q_proj and
 * k_proj permuted from Hugging Face's rotate-half order into IEBIN's interleaved RoPE order
 * (the permutation the converter applies to the base q/k weights).
 *
 * Applying (SGMV style): the batch's tokens are described once per step by a plan that groups
 * consecutive tokens sharing an adapter into segments; for every projection, phase A computes
 * T = X_seg A^T ([n_seg][r]) and phase B adds s_t * T B^T to the rows of Y. Both phases take
 * row ranges (A's rank rows, B's output rows) so a thread pool can shard them like the base
 * kern_matmul; phase B may run right after the base product of the same output rows.
 *
 * NOTES (threads and ownership):
 *  - A struct lora_adapter is immutable after loading; any thread may read it and apply it.
 *    It is reference counted (atomically): the loader's reference, the registry's, and one per
 *    user (a running request). It is freed when the last reference goes, so unloading an
 *    adapter that running requests use only removes its name: they finish with it.
 *  - A struct lora_registry (the name table) belongs to one thread, the engine's owner thread:
 *    every lora_registry_* call must come from it. lora_registry_release may come from any
 *    thread.
 *  - A struct lora_plan is written by lora_plan_build (one thread) and then only read by the
 *    apply functions, from any number of threads, until the next build.
 *
 * Where each part lives (one job per file; worker/model/private/lora_internal.h is what they
 * share): targets and adapter_config.json, lora_config.c; reading an adapter, lora_load.c;
 * its serving copy and digest, lora_pack.c; the registry, lora_registry.c; plans and
 * updates, lora_apply.c; the update fused with the base products, matmul_lora.c (matmul.h).
 */
#ifndef CLOCHER_WORKER_LORA_H
#define CLOCHER_WORKER_LORA_H

#include "iebin.h"
#include "kern.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LORA_CONFIG_FILE "adapter_config.json"
#define LORA_WEIGHTS_FILE "adapter_model.safetensors"
#define LORA_CONFIG_MAX (1u << 20) /* bytes; a larger adapter_config.json is refused unread */
#define LORA_MAX_RANK 1024u
#define LORA_MAX_LAYERS 1024u      /* IEBIN's n_layers bound */
#define LORA_NAME_MAX 64u          /* registry names: 1..63 bytes of [A-Za-z0-9._-] */
#define LORA_REGISTRY_DEFAULT_MAX 64u

/* ---- targets and adapter_config.json (lora_config.c) ---- */

/* The projections an adapter may target, with their PEFT module names. */
enum lora_target {
    LORA_Q = 0, /* self_attn.q_proj  -> attn_q   [n_heads*head_dim][dim] */
    LORA_K,     /* self_attn.k_proj  -> attn_k   [n_kv_heads*head_dim][dim] */
    LORA_V,     /* self_attn.v_proj  -> attn_v   [n_kv_heads*head_dim][dim] */
    LORA_O,     /* self_attn.o_proj  -> attn_o   [dim][n_heads*head_dim] */
    LORA_GATE,  /* mlp.gate_proj     -> ffn_gate [ffn_dim][dim] */
    LORA_UP,    /* mlp.up_proj       -> ffn_up   [ffn_dim][dim] */
    LORA_DOWN,  /* mlp.down_proj     -> ffn_down [dim][ffn_dim] */
    LORA_TARGET_COUNT
};

/* "q_proj", ... ; "?" outside the enum. */
const char *lora_target_name(enum lora_target t);
/* The base projection's [out][in] for hyper-parameters hp. */
void lora_target_dims(const struct iebin_hparams *hp, enum lora_target t, uint32_t *in,
                      uint32_t *out);

/* adapter_config.json, as far as Clocher uses it. */
struct lora_config {
    uint32_t rank;          /* r, 1..LORA_MAX_RANK */
    float alpha;            /* lora_alpha (finite) */
    bool rslora;            /* use_rslora: scaling = alpha / sqrt(r) instead of alpha / r */
    float scaling;          /* the resulting factor s */
    uint32_t target_mask;   /* bit (1 << enum lora_target) per adapted projection, non-zero */
    bool has_layers;        /* layers_to_transform given: only those layers are adapted */
    uint64_t layers[LORA_MAX_LAYERS / 64]; /* bitmap of layers_to_transform */
};

/*
 * Parses and validates an adapter_config.json document (len bytes, not NUL-terminated); `what`
 * names it in messages. Refuses what Clocher cannot apply exactly (use_dora, fan_in_fan_out,
 * bias other than "none", lora_bias, modules_to_save, rank_pattern/alpha_pattern,
 * layer_replication, regex target_modules, a peft_type other than LORA): ERR_UNSUPPORTED.
 * Other codes: ERR_FORMAT (JSON, missing or mistyped field), ERR_RANGE (r, alpha, layers).
 * Unknown keys are ignored. Logged once, naming the field.
 */
int lora_config_parse(const char *what, const char *json, size_t len, struct lora_config *out);

/* ---- adapters (lora_load.c; the serving copy, lora_pack.c) ---- */

/* One adapted projection of one layer; a == NULL when the adapter leaves it alone. */
struct lora_weights {
    const float *a; /* [rank][in]  (lora_A) */
    const float *b; /* [out][rank] (lora_B, q/k rows in IEBIN's interleaved order) */
    /* the same weights packed for lora_apply_fused, in the adapter's fast_dt: */
    const void *fa;  /* [rank][in]  A (== a when fast_dt is DT_F32) */
    const void *fbt; /* B^T in panels: [ceil(out/32)][rank][32] (lora_bt_index) */
};

struct lora_adapter {
    uint32_t magic;
    uint64_t id;               /* unique per load in this process (never 0) */
    uint64_t digest;           /* 64-bit hash of what the adapter computes (rank, scaling,
                                * targets, layers, every f32 weight), never 0: equal for the
                                * same files across loads and processes, so it is the
                                * "adapter set" key of KV prefix reuse and snapshots */
    char *name;                /* registry name, or the directory for lora_open */
    char *dir;                 /* as given */
    struct lora_config cfg;
    uint32_t n_layers;
    uint32_t in[LORA_TARGET_COUNT], out[LORA_TARGET_COUNT]; /* per target, from the base */
    struct lora_weights *w;    /* [n_layers][LORA_TARGET_COUNT] */
    float *store;              /* every A and B, one allocation */
    size_t store_floats;
    enum dtype fast_dt;        /* packed copy's dtype: DT_BF16 when every tensor of the file
                                * is BF16 (so bf16 is exact), else DT_F32; lora_repack may
                                * make it DT_BF16 or LORA_DT_I8 */
    void *fast_store;          /* the packed copies (fa unless f32, and fbt), per layer
                                * in the order a step reads them (lora_pack.c) */
    size_t fast_bytes;
    _Atomic int refs_;         /* private: reference count */
};

/*
 * Loads the PEFT adapter in `dir` for a base model with hyper-parameters hp: reads and
 * validates adapter_config.json and adapter_model.safetensors (tensor names, layer indices,
 * dtypes f32/f16/bf16, shapes against the base, rank against r, every targeted layer
 * complete) and converts the weights to f32. *out holds one reference (lora_close).
 * Errors, logged once naming the file, the tensor and the field: -errno (missing files),
 * ERR_FORMAT, ERR_UNSUPPORTED, ERR_RANGE (layer out of range), ERR_MISMATCH (shape, rank,
 * module not in target_modules), ERR_NOT_FOUND (a targeted tensor missing), -ENOMEM.
 */
int lora_open(const char *dir, const struct iebin_hparams *hp, struct lora_adapter **out);
/*
 * lora_open on bytes in memory: `config` (adapter_config.json) and `weights`
 * (adapter_model.safetensors, borrowed for the call only: the adapter keeps f32 copies).
 * `what` names the adapter in messages ("what/adapter_config.json"). Same checks and codes.
 */
int lora_open_mem(const char *what, const char *config, size_t config_len,
                  const void *weights, size_t weights_len, const struct iebin_hparams *hp,
                  struct lora_adapter **out);
/*
 * How the serving copy of the weights (lora_weights.fa/.fbt) is packed:
 *   auto: bf16 when every tensor of the file is BF16 (exact), else f32 (exact);
 *   bf16: bf16, f32 and f16 files rounded (half the bytes of f32: the update reads these
 *         bytes once per step for every adapter in the batch, so its cost follows them;
 *         docs/LORA.md). The rounding changes the adapter's digest (prefix reuse and
 *         snapshots never mix the two).
 */
enum lora_pack { LORA_PACK_AUTO = 0, LORA_PACK_BF16, LORA_PACK_INT8 };
/*
 *   int8: 8-bit codes with one f32 scale per rank row of A and of B^T (a quarter of f32's
 *         bytes, half of bf16's), activations quantized per token inside the kernels
 *         (kern.h "LoRA shrink and expand on int8 adapter weights"; the error bound is in
 *         docs/LORA.md "8-bit adapter weights"). Lossy: changes the digest like bf16.
 * The int8 copy's fast_dt is LORA_DT_I8 (rank 1: DT_BF16, LORA_I8_MIN_RANK).
 */
#define LORA_DT_I8 DT_KV_I8 /* the int8 serving copy (not a model dtype: never in a file) */
/* int8 packing of an adapter of smaller rank gives the bf16 copy (fast_dt DT_BF16): at rank 1
 * the int8 B^T, padded to groups of 4 rank rows, reads more bytes than bf16 (lora_repack) */
#define LORA_I8_MIN_RANK 2u
/* "auto" | "bf16" | "int8"; ERR_FORMAT (logged, naming the value) otherwise. */
int lora_pack_parse(const char *s, enum lora_pack *out);
/* Repacks a freshly opened adapter (one reference, not yet shared). 0, -ENOMEM, or ERR_RANGE
 * (int8 for a projection wider than KERN_LORA_I8_IN_MAX; logged); the adapter is then
 * unchanged. */
int lora_repack(struct lora_adapter *ad, enum lora_pack pack);

/* Drops the reference lora_open returned; frees the adapter if it was the last. NULL: no-op. */
void lora_close(struct lora_adapter *ad);
/* Current number of references (tests, metrics). */
int lora_refcount(const struct lora_adapter *ad);
/* The weights for (layer, target), or NULL when the adapter does not adapt it. */
const struct lora_weights *lora_weights(const struct lora_adapter *ad, uint32_t layer,
                                        enum lora_target t);

/*
 * Hugging Face's rotate-half row order -> IEBIN's interleaved order, for a [n_heads*head_dim]
 * [cols] f32 matrix (q: n_heads, k: n_kv_heads). Within each head, HF row s*head_dim/2 + i
 * becomes row 2i + s (s in {0, 1}, i < head_dim/2): the inverse of the permutation in
 * Hugging Face's convert_llama_weights_to_hf.py. dst and src must not overlap.
 */
void lora_permute_rows_hf_to_iebin(float *dst, const float *src, uint32_t n_heads,
                                   uint32_t head_dim, size_t cols);

/* ---- registry (lora_registry.c) ---- */

struct lora_registry;

/* max_adapters 0 = LORA_REGISTRY_DEFAULT_MAX. hp is copied. 0, ERR_RANGE (bad hp), -ENOMEM. */
int lora_registry_create(const struct iebin_hparams *hp, size_t max_adapters,
                         struct lora_registry **out);
/* The packing of adapters loaded from now on (default LORA_PACK_AUTO). */
void lora_registry_set_pack(struct lora_registry *r, enum lora_pack pack);
/* Drops the registry's references; adapters still acquired live until released. */
void lora_registry_destroy(struct lora_registry *r);
/*
 * Loads `dir` under `name` (1..63 bytes of [A-Za-z0-9._-]). ERR_FORMAT for a bad name,
 * ERR_STATE when the name is taken (unload it first), ERR_OVERLOADED when max_adapters are
 * loaded, or lora_open's codes.
 */
int lora_registry_load(struct lora_registry *r, const char *name, const char *dir);
/* Removes the name; requests holding the adapter keep it until they release it.
 * ERR_NOT_FOUND (logged) for an unknown name. */
int lora_registry_unload(struct lora_registry *r, const char *name);
/* A new reference to the adapter loaded as `name` (for one request). ERR_NOT_FOUND (logged)
 * for an unknown name. */
int lora_registry_acquire(struct lora_registry *r, const char *name,
                          struct lora_adapter **out);
/* Drops a reference from lora_registry_acquire (any thread). NULL: no-op. */
void lora_registry_release(struct lora_adapter *ad);
/* Loaded adapters, in load order: i < lora_registry_count(). No reference is taken. */
size_t lora_registry_count(const struct lora_registry *r);
const struct lora_adapter *lora_registry_at(const struct lora_registry *r, size_t i);

/* ---- applying (lora_apply.c) ---- */

/* A maximal run of consecutive tokens of a batch that use the same adapter. */
struct lora_seg {
    const struct lora_adapter *ad;
    size_t t0, n;  /* tokens [t0, t0 + n) of the batch */
    size_t tmp0;   /* offset of this segment's T [n][rank] in the scratch */
};

/*
 * The adapter layout of one batch, built once per step and used for every projection of every
 * layer. Tokens without an adapter (NULL) belong to no segment and are left alone. For the
 * fewest segments (each reads its adapter's weights once per projection), order the batch so
 * that tokens of the same adapter are adjacent.
 */
struct lora_plan {
    size_t n_tok;
    size_t n_segs, cap_segs;
    struct lora_seg *segs;  /* [n_segs] */
    float *scale;           /* [n_tok] s_adapter * request scale (0 for base tokens) */
    size_t cap_tok;
    size_t tmp_floats;      /* scratch T the apply functions need: sum of n * rank */
    uint32_t max_rank;      /* over the segments' adapters (0: nothing to apply) */
};

void lora_plan_init(struct lora_plan *p);
void lora_plan_fini(struct lora_plan *p);
/*
 * ad[t], scale[t] for t < n_tok: token t's adapter (NULL = base model) and request scale
 * (finite: the engine validates requests). The adapters must stay referenced while the plan
 * is used. Reuses the plan's arrays; 0 or -ENOMEM (logged).
 */
int lora_plan_build(struct lora_plan *p, const struct lora_adapter *const *ad,
                    const float *scale, size_t n_tok);

/*
 * Phase A for projection (layer, t): tmp = X_seg A^T for every segment, rank rows [k0, k1)
 * only (clamped to each adapter's rank; shard [0, p->max_rank) over threads).
 * x: [n_tok][in] the projection's input.  tmp: [p->tmp_floats].
 */
void lora_apply_a(const struct lora_plan *p, uint32_t layer, enum lora_target t, const float *x,
                  float *tmp, size_t k0, size_t k1);
/*
 * Phase B: y[tok][r] += scale[tok] * (tmp_seg B^T)[tok][r] for output rows [r0, r1) (shard
 * [0, out) over threads). Needs every rank row of phase A done. y: [n_tok][ldy] holding the
 * base product.
 */
void lora_apply_b(const struct lora_plan *p, uint32_t layer, enum lora_target t,
                  const float *tmp, float *y, size_t ldy, size_t r0, size_t r1);
/* Both phases on the calling thread, all rows. */
void lora_apply(const struct lora_plan *p, uint32_t layer, enum lora_target t, const float *x,
                float *tmp, float *y, size_t ldy);

/*
 * One adapter for all n tokens (the reference forward's hook): y += s*scale * (x A^T) B^T.
 * x: [n][in], y: [n][ldy], tmp: [n][ad->cfg.rank]. A projection the adapter leaves alone is
 * a no-op.
 */
void lora_apply_one(const struct lora_adapter *ad, float scale, uint32_t layer,
                    enum lora_target t, const float *x, size_t n, float *y, size_t ldy,
                    float *tmp);

/* ---- the serving path: packed weights, fused phases, one pool job per phase ---- */

struct pool;

/* One projection of a layer for lora_apply_fused: y [n_tok][ldy] += the update of x. */
struct lora_proj {
    enum lora_target t;
    const float *x; /* [n_tok][in] */
    float *y;       /* [n_tok][ldy], holding the base product */
    size_t ldy;
};

/*
 * The plan's update for n_proj projections of one layer that are ready together (q, k, v
 * share their input; so do gate and up): phase A (shrink, T = X_seg A^T) of every
 * (projection, segment, 8 rank rows) as ONE pool_run, then phase B (expand, y += s_t T B^T)
 * of every (projection, segment, 256 output columns) as another, on the packed weights
 * (fa, fbt). pool NULL: the calling thread. tmp: [n_proj * p->tmp_floats]. The result does
 * not depend on the number of threads (each value is summed by one task in a fixed order).
 */
void lora_apply_fused(const struct lora_plan *p, struct pool *pool, uint32_t layer,
                      const struct lora_proj *pr, size_t n_proj, float *tmp);

/*
 * The packed B^T (lora_weights.fbt): panels of LORA_PANEL output columns, each [rank]
 * [LORA_PANEL] contiguous (the last panel zero-padded), so that an expand task streams one
 * contiguous block. B[j][k] is element lora_bt_index(rank, k, j).
 */
#define LORA_PANEL KERN_LORA_PANEL /* the layout kern_lora_expand reads (kern.h) */
static inline size_t lora_bt_index(size_t rank, size_t k, size_t j)
{
    return (j / LORA_PANEL) * rank * LORA_PANEL + k * LORA_PANEL + j % LORA_PANEL;
}
static inline size_t lora_bt_elems(size_t out, size_t rank)
{
    return (out + LORA_PANEL - 1) / LORA_PANEL * LORA_PANEL * rank;
}

/* The kernels of lora_apply_fused are kern_lora_shrink / kern_lora_expand (kernels/include/kern.h).
 * The update fused with the base products themselves, as one job, is matmul_group_lora
 * (matmul.h). */

#endif
