/*
 * peft.h — test helpers: write Hugging Face PEFT adapter directories (adapter_config.json +
 * adapter_model.safetensors) from f32 arrays, and random adapters for a base's hparams.
 * Every helper fails the running cmocka test on error.
 */
#ifndef CLOCHER_TESTS_LORA_PEFT_H
#define CLOCHER_TESTS_LORA_PEFT_H

#include "iebin.h"
#include "lora.h"
#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>

struct peft_tensor {
    const char *name;
    enum safetensors_dtype dt; /* F32/F16/BF16: data converted; others: data written raw */
    int n_dims;
    uint64_t shape[2];
    const void *data;          /* f32 values (or raw bytes for other dtypes) */
};

/* dir/adapter_model.safetensors */
void peft_write_tensors(const char *dir, const struct peft_tensor *t, size_t n);
/* dir/adapter_config.json */
void peft_write_config(const char *dir, const char *json);
/* A PEFT-style config; `extra` (may be "") is inserted as more members: ",\"use_rslora\":true" */
char *peft_config_json(uint32_t rank, double alpha, uint32_t mask, const char *extra);
/* "base_model.model.model.layers.{l}.{parent}.{module}.lora_{A|B}.weight" */
const char *peft_name(uint32_t layer, enum lora_target t, int is_b);

/* A random adapter: A, B per (layer, target) in Hugging Face order (B rows rotate-half). */
struct peft_adapter {
    struct iebin_hparams hp;
    uint32_t rank;
    double alpha;
    uint32_t mask;
    float *a[LORA_MAX_LAYERS / 8][LORA_TARGET_COUNT]; /* [rank][in] */
    float *b[LORA_MAX_LAYERS / 8][LORA_TARGET_COUNT]; /* [out][rank] */
};
/* Uniform A in +-amp_a, B in +-amp_b, from seed. hp.n_layers <= 128. */
struct peft_adapter *peft_adapter_random(const struct iebin_hparams *hp, uint32_t rank,
                                         double alpha, uint32_t mask, uint64_t seed,
                                         float amp_a, float amp_b);
/* Writes config (with `extra`) and tensors of dtype dt into dir (created). */
void peft_adapter_write(const struct peft_adapter *pa, const char *dir,
                        enum safetensors_dtype dt, const char *extra);
void peft_adapter_free(struct peft_adapter *pa);

/* HF's convert_llama_weights_to_hf.py permute(): interleaved (Meta/IEBIN) rows -> HF
 * rotate-half rows, written as its view/transpose/reshape: w.view(heads, hd/2, 2, cols)
 * .transpose(1, 2).reshape(heads*hd, cols). */
void peft_permute_meta_to_hf(float *dst, const float *src, uint32_t heads, uint32_t hd,
                             size_t cols);

/* A small, valid llama hparams set for unit tests: dim 16, 2 layers, 4 heads, 2 kv heads,
 * head_dim 4, ffn 24, vocab 32. */
struct iebin_hparams peft_small_hparams(void);

#endif
