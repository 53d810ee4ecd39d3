/*
 * moe.h — the mixture-of-experts feed-forward block of gpt-oss, written once for both passes
 * (the reference forward.c and the serving engine's fwd_batch.c).
 *
 * For n token rows xn [n][dim] (already RMS-normalised) of one layer:
 *   logits = xn router^T + router_bias                       [n][n_experts]
 *   top    = the k = n_experts_used largest logits (ties: the lowest expert index), in
 *            decreasing order; w = softmax over those k values only
 *   for each chosen expert e of token t:
 *     g = gate_e xn_t + bg_e,  u = up_e xn_t + bu_e          [ffn_dim] each
 *     g = min(g, limit),  u = clamp(u, -limit, limit)
 *     a = g sigmoid(alpha g) (u + 1)                         the clamped SwiGLU with its +1
 *     y = down_e a + bd_e                                    [dim]: the bias BEFORE the weight
 *   out_t = sum_i w_i y_i                                    in the top-k order
 * (spec gpt-oss.md §2.5-2.7). The rows routed to an expert are gathered so that each chosen
 * expert's weights are read once per call whatever the number of rows (matmul.h's MoE plan:
 * one matmul_group for every chosen expert's gate and up, one for the downs). A row's result
 * depends only on that row: the products compute each output row alone (matmul.h, "Numbers")
 * and the sum over a row's experts runs in its own top-k order, so a token gives the same
 * numbers batched with others as alone.
 *
 * NOTES: a struct moe is scratch for up to max_tok rows, owned by one pass (one thread).
 */
#ifndef CLOCHER_WORKER_MOE_H
#define CLOCHER_WORKER_MOE_H

#include "matmul.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>

struct moe;

/* Scratch for up to max_tok rows of m (m->moe). 0, ERR_OVERFLOW or -ENOMEM (logged). */
int moe_create(const struct model *m, uint32_t max_tok, struct moe **out);
void moe_destroy(struct moe *s);

/*
 * out [n][dim] = the MoE block of layer L on xn [n][dim], n <= max_tok; the products run on
 * mm. out must not overlap xn.
 */
void moe_ffn(struct moe *s, struct matmul_ctx *mm, const struct model_layer *L, const float *xn,
             size_t n, float *out);

/* Counters of the last moe_ffn call: distinct experts chosen, (token, expert) pairs. */
void moe_last_counts(const struct moe *s, uint32_t *experts, uint32_t *pairs);

#endif
