/*
 * kvtest.h — helpers shared by the KV cache tests: small pools, sequences filled with K/V rows
 * that are a known function of (layer, position, token, element) so any row can be checked
 * after sharing, copying, eviction or a snapshot round trip.
 */
#ifndef CLOCHER_TESTS_KVTEST_H
#define CLOCHER_TESTS_KVTEST_H

#include "testutil.h"

#include "kv.h"

/* A config with n_layers 2, n_kv_heads 2, head_dim 8, the given B and dtype, room for
 * n_blocks blocks exactly. */
struct kv_config kt_config(uint32_t block_tokens, enum dtype dt, uint32_t n_blocks,
                           bool prefix_cache);
struct kv_pool *kt_pool(const struct kv_config *cfg);

/* The value stored at element i of K (kv = 0) or V (kv = 1): small multiples of 1/4, exact in
 * f16 and bf16. */
float kt_value(uint32_t layer, int kv, uint32_t pos, int32_t token, uint32_t i);

/* reserve + write every layer + commit of tokens[0..n) at the sequence's end; returns the
 * code of the first failing call. */
int kt_append(struct kv_seq *s, const int32_t *tokens, uint32_t n);
/* Asserts positions [from, to) of every layer hold kt_value(.., tokens[pos], ..). */
void kt_check_rows(const struct kv_seq *s, const int32_t *tokens, uint32_t from, uint32_t to);
/* Asserts kv_pool_validate passes and returns the metrics. */
struct kv_metrics kt_valid(const struct kv_pool *p);
/* A deterministic token sequence: seed-dependent ids. */
void kt_tokens(int32_t *t, size_t n, uint32_t seed);

#endif
