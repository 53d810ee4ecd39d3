/*
 * forward.h — the FP32 reference forward pass of the llama and gpt_oss architectures, with its
 * KV cache (contiguous; gpt-oss's sliding layers keep every position here, attention reads only
 * their window).
 *
 * One struct forward is one sequence: a KV cache of positions [0, forward_pos()) and the
 * scratch buffers to extend it. forward_eval() feeds the next tokens (a prompt chunk of any
 * length, or one generated token) and returns logits for the positions asked for. The pass is
 * written to be read top to bottom (forward.c) and is the numeric reference every faster path
 * is tested against: activations, attention and the KV cache are f32; weights are used in
 * their stored dtype through matmul.h's products (f32 weights: exact products, f32 sums).
 * docs/DESIGN.md ("Forward pass") gives the equations and the choices behind them.
 *
 * NOTES: a struct forward belongs to one thread (the one calling forward_eval); with a pool it
 * dispatches matmul rows and attention heads to the pool's threads and returns when they are
 * done (pool.h: one dispatching thread per pool). The model must outlive it; any number of
 * forward passes may share one model.
 */
#ifndef CLOCHER_WORKER_FORWARD_H
#define CLOCHER_WORKER_FORWARD_H

#include "lora.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>

struct pool;

#define FORWARD_CHUNK_DEFAULT 64u /* tokens per batch through the layers */
#define FORWARD_CHUNK_MAX 4096u

struct forward_config {
    uint32_t max_seq;   /* positions the KV cache holds; 0 = the model's max_seq_len */
    uint32_t max_chunk; /* tokens per batch (longer inputs are split); 0 = FORWARD_CHUNK_DEFAULT */
    struct pool *pool;  /* shards matmul rows and attention heads; NULL = calling thread only */
};

/* Which logits forward_eval writes. */
enum forward_logits {
    FORWARD_LOGITS_NONE = 0, /* none (prefill of a prefix) */
    FORWARD_LOGITS_LAST = 1, /* [vocab] for the last token fed */
    FORWARD_LOGITS_ALL = 2,  /* [n][vocab], one row per token fed */
};

/*
 * Called after every base projection y [n][ldy] = x [n][in] W^T of (layer, t), before the
 * result is used: where LoRA adapters add their low-rank term (lora_apply_one). For attn_k and
 * attn_v, y points into the KV cache (ldy = kv_dim) and RoPE is applied to K after the hook.
 */
typedef void forward_hook_fn(void *ud, uint32_t layer, enum lora_target t, const float *x,
                             size_t n, float *y, size_t ldy);

struct forward;

/*
 * Allocates the KV cache ([n_layers][max_seq][kv_dim] f32, twice) and every scratch buffer
 * once. 0, or ERR_RANGE (max_seq above the model's context, max_chunk above
 * FORWARD_CHUNK_MAX), ERR_OVERFLOW (sizes), -ENOMEM; logged naming the value or the bytes.
 */
int forward_create(const struct model *m, const struct forward_config *cfg,
                   struct forward **out);
void forward_destroy(struct forward *f);

/* Installs (fn != NULL) or removes the projection hook. */
void forward_set_hook(struct forward *f, forward_hook_fn *fn, void *ud);

/*
 * Feeds tokens[0..n) at positions forward_pos() .. forward_pos()+n-1 with causal attention
 * over everything before them, and writes the requested logits. Inputs are validated before
 * anything is computed (the sequence is unchanged on error): ERR_RANGE, logged, when n is 0,
 * a token id is outside the vocabulary, or the positions exceed max_seq.
 */
int forward_eval(struct forward *f, const int32_t *tokens, size_t n, enum forward_logits which,
                 float *logits);

/* Positions held in the cache (the next token's position). */
uint32_t forward_pos(const struct forward *f);
uint32_t forward_max_seq(const struct forward *f);
/* Forgets positions >= pos (keeps a prefix; 0 starts a new sequence). ERR_RANGE if pos >
 * forward_pos() (logged). */
int forward_truncate(struct forward *f, uint32_t pos);

#endif
