/*
 * ref_llama.h — a small FP32 llama forward pass for the LoRA acceptance tests, with a hook
 * after every base projection (where the serving engine calls lora_apply).
 *
 * It follows llama2.c's run.c (RMSNorm, interleaved RoPE, grouped-query attention, SwiGLU)
 * over an IEBIN model of any dtype (kern_matmul), processes a chunk of tokens per call, and is
 * itself checked against the fixture's golden logits before it is used as a reference. It
 * stands in for worker/forward.c until that lands on main (then the hook moves there).
 */
#ifndef CLOCHER_TESTS_LORA_REF_LLAMA_H
#define CLOCHER_TESTS_LORA_REF_LLAMA_H

#include "iebin.h"
#include "lora.h"

#include <stddef.h>
#include <stdint.h>

/* After the base product y [n][ldy] = x [n][in] W^T of projection (layer, t). */
typedef void ref_llama_hook_fn(void *ud, uint32_t layer, enum lora_target t, const float *x,
                               size_t n, float *y, size_t ldy);

struct ref_llama;

/* Scratch for up to max_tok tokens per call, KV cache for hp.max_seq_len positions. */
struct ref_llama *ref_llama_create(const struct iebin_model *m, size_t max_tok);
void ref_llama_destroy(struct ref_llama *r);
/* Tokens tok[0..n) at positions pos0.. (the cache holds 0..pos0-1); logits [n][vocab]. */
void ref_llama_forward(struct ref_llama *r, const int32_t *tok, size_t n, size_t pos0,
                       float *logits, ref_llama_hook_fn *hook, void *ud);

#endif
