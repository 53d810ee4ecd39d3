/*
 * model.h — a llama model's weights as typed views: one struct to read the forward pass from.
 *
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
    void *panel_buf_;             /* private: every matrix's panels, one anonymous mapping */
    size_t panel_bytes_;
    struct iebin_model *owned_;   /* private: what model_close closes (model_open only) */
};

/*
 * Binds the tensors of `im` (architecture "llama", as iebin_open validated it) into *m; m->im
 * borrows im. When the kernels run AVX-512 (kern_isa(), so kern_init() first) every q4_0 and
 * q8_0 matrix the products read (layers, and the classifier) is also repacked into panels
 * (matmul_mat.panels): as many bytes again as those matrices, anonymous memory, written once
 * here; CLOCHER_Q4_PANELS=0 in the environment turns it off for q4_0 matrices,
 * CLOCHER_Q8_PANELS=0 for q8_0 ones. 0, or ERR_UNSUPPORTED (another architecture),
 * ERR_NOT_FOUND / ERR_MISMATCH (a tensor missing or of another shape or type: iebin_open
 * rules this out, a hand-built struct iebin_model might not), -ENOMEM; logged once naming
 * the model and the tensor.
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

/* Row r of the token embedding as f32 (any stored dtype). out: [dim]. r < vocab_size. */
void model_embed_row(const struct model *m, uint32_t r, float *out);

/*
 * RoPE's inv_freq [head_dim/2] = rope_theta^(-2i/head_dim), computed in double so that the
 * angle pos * inv_freq stays accurate at long positions (llama2.c computes it in float; the
 * difference is below 1e-6 up to 512). Both passes rotate with it (kern_rope_table).
 */
void model_rope_inv_freq(const struct model *m, float *inv_freq);

/*
 * *out = 64-byte aligned room for a*b*c floats, the product checked for overflow: a pass's
 * buffers over the model. `who` (the pass) and `what` (the buffer) name it in messages.
 * 0, ERR_OVERFLOW or -ENOMEM, logged.
 */
int model_alloc_f32(const char *who, const char *what, uint64_t a, uint64_t b, uint64_t c,
                    float **out);

#endif
