/*
 * engine_internal.h — what engine.c (requests, scheduling, events) and fwd_batch.c (the
 * batched forward pass over the paged KV cache) share. Private to worker/.
 *
 * One engine step is one call of engine__fwd_run: the tokens of every sequence scheduled in
 * the step are stacked [n_tok][dim], sequence after sequence (a decode token, or a prefill
 * chunk of consecutive positions), and every projection is one matmul over all n_tok rows.
 *
 * NOTES: a struct engine__fwd belongs to the engine's owner thread; it uses the engine's pool
 * for matmul rows, LoRA rank/output rows and (sequence, KV head) attention tasks.
 */
#ifndef CLOCHER_WORKER_ENGINE_INTERNAL_H
#define CLOCHER_WORKER_ENGINE_INTERNAL_H

#include "kv.h"
#include "lora.h"
#include "model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pool;

/* One sequence's part of a step. */
struct engine__bseq {
    struct kv_seq *kv;   /* reserved for n more positions (kv_seq_reserve) by the caller */
    struct kv_seq *kvw;  /* the sliding layers' sequence when the engine keeps them apart
                          * (docs/KV.md, "Sliding layers"), reserved alike; NULL: every layer
                          * is in kv. Layer l is layer kind_index of its sequence. */
    uint32_t pos0;       /* position of its first token: kv_seq_len(kv) */
    uint32_t n;          /* tokens of this sequence in the step (1 for a decode) */
    size_t t0;           /* its first row in the batch */
    bool logits;         /* wants the logits of its last token */
    const struct lora_adapter *ad; /* NULL = base model */
    float scale;         /* request scale of ad */
    bool invariant;      /* batch invariant (engine_request.batch_invariant): the whole
                          * step's products run invariant */
};

struct engine__fwd;

/* Buffers for steps of up to max_tok tokens and max_seqs sequences. 0, ERR_OVERFLOW, -ENOMEM. */
int engine__fwd_create(const struct model *m, struct pool *pool, uint32_t max_tok,
                       uint32_t max_seqs, struct engine__fwd **out);
void engine__fwd_destroy(struct engine__fwd *f);
/* engine_set_progress(): fn(ud) before each layer of engine__fwd_run; NULL = none. */
void engine__fwd_set_progress(struct engine__fwd *f, void (*fn)(void *), void *ud);

/*
 * Runs tokens[0..n_tok) (sequence i owns rows [seqs[i].t0, seqs[i].t0 + seqs[i].n), in order,
 * covering the batch) through the model: writes their K/V rows into each sequence's reserved
 * positions (the caller commits them afterwards) and, for each sequence with `logits`, in
 * order, one row [vocab] of *logits (owned by f, valid until the next run). Token ids must
 * be in the vocabulary (the engine validated them at submission). 0 or -ENOMEM (LoRA plan).
 */
int engine__fwd_run(struct engine__fwd *f, const int32_t *tokens, size_t n_tok,
                    const struct engine__bseq *seqs, size_t n_seqs, const float **logits);

/* ---- engine.c, for tests and debugging ---- */

struct engine;
/* Called with the logits row each request samples from, before sampling: request id, tokens
 * generated so far (the row is for token n_gen), row [vocab]. NULL removes it. */
typedef void engine__logits_fn(void *ud, uint64_t id, uint32_t n_gen, const float *logits,
                               size_t vocab);
void engine__set_logits_tap(struct engine *e, engine__logits_fn *fn, void *ud);
/* The engine's KV pool (kv_pool_validate, metrics). */
struct kv_pool *engine__kv(struct engine *e);
/* off: the following steps run every request's tokens through the base model alone (its
 * adapter is ignored: no LoRA plan), until called again with false. For engine_bench's
 * step-paired LoRA overhead (the same batch, base and adapted steps alternating). The KV rows
 * written meanwhile are the base model's under the request's adapter: a benchmark's switch,
 * not for serving (with the prefix cache on, those blocks would be reused as adapted). */
void engine__set_lora_bypass(struct engine *e, bool off);

#endif
