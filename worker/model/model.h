/*
 * model.h — a model's weights as typed views: one struct to read the forward pass from.
 *
 * Three architectures: "llama" (dense SwiGLU; Llama 3's frequency-factor RoPE scaling and
 * Mistral's sliding window on every layer are hyper-parameters of it), "qwen2" (llama with
 * q/k/v biases) and "gpt_oss" (biased attention with learned sinks and sliding-window layers,
 * YaRN RoPE, a mixture of experts with the clamped SwiGLU; ../shared/specs/gpt-oss.md,
 * docs/IEBIN.md).
 * model_init() binds the tensors of an opened IEBIN model (worker/formats/iebin.h) into a struct of
 * named fields, the way llama2.c's TransformerWeights does, so that the forward pass reads
 * `L->wq` rather than looking names up. Nothing is copied: every view points into the model's
 * read-only mapping. A matrix (struct matmul_mat, matmul.h: the view every product takes)
 * carries its dtype and geometry because IEBIN stores each tensor in its own type (f32, f16,
 * bf16, q8_0, q4_0); the kernels (kernels/include/kern.h) take it as is.
 *
 * NOTES: a struct model is immutable after model_init()/model_open() and may be shared by any
 * number of threads and forward passes. The views borrow the struct iebin_model: it must
 * outlive them (model_open owns its own).
 */
#ifndef CLOCHER_WORKER_MODEL_H
#define CLOCHER_WORKER_MODEL_H

#include "dtype.h"
#include "iebin.h"
#include "matmul.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model_layer {
    const float *attn_norm;   /* [dim] */
    struct matmul_mat wq;     /* [n_heads*head_dim][dim] */
    struct matmul_mat wk;     /* [n_kv_heads*head_dim][dim] */
    struct matmul_mat wv;     /* [n_kv_heads*head_dim][dim] */
    struct matmul_mat wo;     /* [dim][n_heads*head_dim] */
    const float *ffn_norm;    /* [dim] */
    struct matmul_mat w_gate; /* [ffn_dim][dim]  (llama2.c w1) */
    struct matmul_mat w_up;   /* [ffn_dim][dim]  (llama2.c w3) */
    struct matmul_mat w_down; /* [dim][ffn_dim]  (llama2.c w2) */

    /* gpt_oss and qwen2 (NULL for llama) */
    const float *bq, *bk, *bv; /* [q_dim], [kv_dim], [kv_dim]: projection biases */
    /* gpt_oss only (NULL / zero for llama, whose dense w_gate/w_up/w_down are zero here) */
    const float *bo;           /* [dim] */
    const float *sinks;        /* [n_heads]: one learned logit per query head */
    uint32_t window;           /* sliding layers (gpt_oss's, or every layer of a llama/qwen2
                                * with a window: Mistral): a query at t sees keys u with
                                * t-u < window; 0 = every earlier key (full layers) */
    uint32_t kind_index;       /* this layer's index among the layers of its kind (sliding or
                                * not): where the engine's KV keeps it when it stores the two
                                * kinds apart (docs/KV.md, "Sliding layers") */
    struct matmul_mat router;  /* [n_experts][dim] */
    const float *router_bias;  /* [n_experts] */
    /* the experts of one [n_experts][rows][cols] tensor each, as n_experts views (matmul.h's
     * MoE plan): gate_exps[e] [ffn_dim][dim], up_exps[e] [ffn_dim][dim], down_exps[e]
     * [dim][ffn_dim] */
    struct matmul_mat *gate_exps, *up_exps, *down_exps;
    const float *gate_exps_bias; /* [n_experts][ffn_dim] */
    const float *up_exps_bias;   /* [n_experts][ffn_dim] */
    const float *down_exps_bias; /* [n_experts][dim] */
};

struct model {
    const struct iebin_model *im; /* the source; borrowed (owned when from model_open) */
    struct iebin_hparams hp;
    uint32_t q_dim;               /* n_heads * head_dim */
    uint32_t kv_dim;              /* n_kv_heads * head_dim */
    struct matmul_mat tok_embd;   /* [vocab_size][dim] */
    const float *output_norm;     /* [dim] */
    struct matmul_mat output;     /* [vocab_size][dim]; a copy of tok_embd when tied */
    struct model_layer *layers;   /* [n_layers] */
    bool moe;                     /* gpt_oss: the FFN is a mixture of experts */
    uint32_t n_sliding;           /* layers with a sliding window (window != 0) */
    float rope_mscale;            /* YaRN's concentration 0.1 ln(factor) + 1 multiplying cos and
                                   * sin (q and k); 1 without rope scaling */
    struct matmul_mat *expert_views_; /* private: [n_layers][3][n_experts], the layers' views */
    void *panel_buf_;             /* private: every matrix's panels, one anonymous mapping */
    size_t panel_bytes_;
    struct iebin_model *owned_;   /* private: what model_close closes (model_open only) */
};

/*
 * Binds the tensors of `im` (architecture "llama", "qwen2" or "gpt_oss", as iebin_open
 * validated it)
 * into *m; m->im
 * borrows im. When the kernels run AVX-512 (kern_isa(), so kern_init() first) every q4_0,
 * q8_0, q4_K, q6_K and mxfp4 matrix the products read (layers, gpt-oss's experts, and the
 * classifier) is also repacked into panels (matmul_mat.panels): as many bytes again as those
 * matrices (q4_K: +2.8%), anonymous memory, written once here; CLOCHER_Q4_PANELS=0 in the
 * environment turns it off for q4_0 matrices, CLOCHER_Q8_PANELS=0 for q8_0 ones,
 * CLOCHER_KQ_PANELS=0 for the k-quants, CLOCHER_MX_PANELS=0 for mxfp4.
 * The repacked matrices' stored rows are then dropped from this process's view of the file
 * mapping (model_release_stored_rows; matrix by matrix, so the resident size never holds both
 * copies of the weights): `data` stays valid, a read of it faults the file's bytes back in.
 * 0, or ERR_UNSUPPORTED (another architecture), ERR_NOT_FOUND / ERR_MISMATCH (a tensor
 * missing or of another shape or type: iebin_open rules this out, a hand-built struct
 * iebin_model might not), -ENOMEM; logged once naming the model and the tensor.
 */
int model_init(struct model *m, const struct iebin_model *im);
/* Frees what model_init allocated (not the iebin model). Safe on a zeroed struct. */
void model_fini(struct model *m);

/* iebin_open_ex(dir, iebin_flags) then model_init; *out owns the IEBIN model. Codes as both. */
int model_open(const char *dir, unsigned iebin_flags, struct model **out);
/* Closes what model_open returned. NULL is a no-op. */
void model_close(struct model *m);

/*
 * Whether the forward pass still reads the stored bytes of IEBIN tensor `name` (its pages in
 * the model's file mapping). False only for a matrix whose products read its panels instead;
 * tok_embd stays read even when a tied classifier has panels (the embedding lookup reads its
 * rows). A name the model has no view of is reported as read: callers that act on the
 * answer (hot replication) then keep doing what they did without it.
 */
bool model_reads_stored(const struct model *m, const char *name);

/* Bytes [off, off + len) of model.ie.bin (file offsets). */
struct model_range {
    uint64_t off, len;
};

/*
 * The whole pages of model.ie.bin that no reader takes from the mapping any more: runs of
 * tensors for which model_reads_stored is false (with the padding up to the next tensor that
 * is read), shrunk to whole pages, so a page holding any byte that is read is never among
 * them. Sorted by offset, disjoint. *out is malloc'd (NULL when *n_out is 0: nothing
 * repacked). 0 or -ENOMEM, logged.
 */
int model_unread_ranges(const struct model *m, struct model_range **out, size_t *n_out);

/*
 * Drops model_unread_ranges from this process's page tables of m's file mapping
 * (MADV_DONTNEED of a read-only MAP_PRIVATE file mapping: nothing is lost, a later read faults
 * the file's bytes back in; the page cache keeps the pages for every other process that maps
 * them). Makes the weights resident once for a panelled model, where the file's pages would
 * otherwise stay mapped beside the panels. model_init calls it; call it again after anything
 * that reads the whole mapping (hotrepl_hugify_default_model and hotrepl_apply do), it is
 * idempotent and cheap. A model without a file mapping (iebin_open_mem) is left alone.
 * *released (may be NULL): the bytes of the ranges. 0 or -errno / -ENOMEM, logged.
 */
int model_release_stored_rows(const struct model *m, uint64_t *released);

/* Row r of the token embedding as f32 (any stored dtype). out: [dim]. r < vocab_size. */
void model_embed_row(const struct model *m, uint32_t r, float *out);

/*
 * RoPE's inv_freq [head_dim/2] = rope_theta^(-2i/head_dim), computed in double so that the
 * angle pos * inv_freq stays accurate at long positions (llama2.c computes it in float; the
 * difference is below 1e-6 up to 512). Both passes rotate with it (kern_rope_table). With
 * YaRN rope scaling, model_yarn_inv_freq's values rounded to float (pair i of IEBIN's
 * interleaved order is HF's rotate-half pair (i, i + head_dim/2): the same frequency); with
 * frequency factors (Llama 3), theta^(-2i/head_dim) / hp.rope_freq_factors[i], rounded once.
 */
void model_rope_inv_freq(const struct model *m, float *inv_freq);

/*
 * Llama 3's RoPE scaling as one factor per pair (Hugging Face's _compute_llama3_parameters,
 * llama.cpp's rope_freqs): with wavelen = 2 pi theta^(2i/head_dim) and L0 =
 * original_max_position_embeddings, 1 when wavelen < L0/high_freq_factor, `factor` when
 * wavelen > L0/low_freq_factor, else 1 / ((1 - s)/factor + s) with
 * s = (L0/wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor). Pair i's
 * frequency is divided by it. In double; the converters store it rounded to float.
 */
double model_llama3_freq_factor(double theta, uint32_t head_dim, uint32_t i, double factor,
                                double low_freq_factor, double high_freq_factor,
                                double original_max_position_embeddings);

/*
 * cs [head_dim/2][2] = cos, sin of pos * inv_freq[i] (kern_rope_table), times the model's
 * rope_mscale when it is not 1 (YaRN's concentration, on q and k alike): the rotation table
 * of one position, for both passes.
 */
void model_rope_row(const struct model *m, float *cs, uint32_t pos, const float *inv_freq);

/* y [n][ldy] += b [cols] on every row: a projection's bias (gpt_oss). */
void model_add_bias(float *y, size_t n, size_t ldy, const float *b, size_t cols);

/*
 * YaRN's inv_freq_j for j < head_dim/2, in double (spec gpt-oss.md §2.3, "static YaRN"):
 *   freq_j = theta^(2j/d),  s = factor,  L0 = original_max_position_embeddings
 *   low  = (d/2) ln(L0 / (beta_fast 2 pi)) / ln theta,  high = the same with beta_slow
 *   (truncate: low = max(floor(low), 0), high = min(ceil(high), d-1), as ggml; otherwise kept
 *   fractional, as the reference and HF with truncate: false)
 *   ramp_j = clamp((j - low) / max(high - low, 0.001), 0, 1)
 *   inv_freq_j = ramp_j / (s freq_j) + (1 - ramp_j) / freq_j
 * hp->rope_scaling.type must be IEBIN_ROPE_YARN. Also sets *mscale (when not NULL) to the
 * concentration 0.1 ln(s) + 1.
 */
double model_yarn_inv_freq(const struct iebin_hparams *hp, uint32_t j, double *mscale);

/*
 * *out = 64-byte aligned room for a*b*c floats, the product checked for overflow: a pass's
 * buffers over the model. `who` (the pass) and `what` (the buffer) name it in messages.
 * 0, ERR_OVERFLOW or -ENOMEM, logged.
 */
int model_alloc_f32(const char *who, const char *what, uint64_t a, uint64_t b, uint64_t c,
                    float **out);

#endif
