/*
 * kvq.h — what a KV cache dtype does to a model's next-token distributions: teacher-forced
 * logits through the batched forward pass (worker/engine/private/engine_internal.h) over a
 * pool of the given dtype, and the KL divergence between two sets of them. Shared by
 * tests/kv/test_kv_quality.c (bounds on stories260K) and bench/kv_quality.c (the table in
 * docs/PERFORMANCE.md, "KV cache dtypes").
 */
#ifndef CLOCHER_TESTS_KVQ_H
#define CLOCHER_TESTS_KVQ_H

#include "dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;
struct pool;

/*
 * Prefills tokens[0, n_ctx) in chunks, then feeds tokens[n_ctx, n_ctx + n_eval) one at a time
 * (decode steps), all through a KV pool of dtype dt (no_rotate: kv_config.kv8_no_rotate).
 * logits: [n_eval + 1][vocab] — row 0 after the prefill, row i after decode step i.
 * 0, or a negative code (logged).
 */
int kvq_logits(const struct model *m, struct pool *pool, enum dtype dt, bool no_rotate,
               const int32_t *tokens, uint32_t n_ctx, uint32_t n_eval, float *logits);

/* KL(softmax(ref) || softmax(got)) per row (nats), over n rows of vocab: mean and max. */
void kvq_kld(const float *ref, const float *got, size_t n, size_t vocab, double *mean,
             double *max);

#endif
