/*
 * fuzz_lora_adapter.c — libFuzzer harness over the whole adapter loader (lora_open_mem):
 * adapter_config.json and adapter_model.safetensors together, so the fuzzer reaches the tensor
 * name grammar, the layer/module/rank/shape checks against a base model, completeness and the
 * conversion to f32 (with the q/k row permutation).
 *
 * Input: a 4-byte little-endian length N, N bytes of adapter_config.json, then the
 * safetensors bytes (gen_lora_seeds.py writes seeds in this form). The base is a small llama
 * (dim 16, 2 layers, 4 heads, 2 KV heads, head_dim 4, ffn 24). After a success every adapted
 * projection's A and B are read whole (ASan catches a short allocation) and applied once.
 */
#include "fuzz.h"

#include "log.h"
#include "lora.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (size < 4)
        return 0;
    uint32_t n;
    memcpy(&n, data, 4);
    if (n > size - 4)
        return 0;
    const struct iebin_hparams hp = {.dim = 16, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                     .head_dim = 4, .ffn_dim = 24, .vocab_size = 32,
                                     .max_seq_len = 64, .rope_theta = 10000.0f,
                                     .rms_eps = 1e-5f, .tied_embeddings = true};
    struct lora_adapter *ad = NULL;
    int rc = lora_open_mem("fuzz", (const char *)data + 4, n, data + 4 + n, size - 4 - n, &hp,
                           &ad);
    if (rc > 0 || (rc < 0 && ad != NULL))
        abort();
    if (rc < 0)
        return 0;
    if (lora_refcount(ad) != 1 || ad->digest == 0 || ad->cfg.rank < 1 ||
        ad->cfg.rank > LORA_MAX_RANK)
        abort();
    float x[24], y[24], *tmp = malloc(ad->cfg.rank * sizeof(float));
    if (!tmp)
        abort();
    for (int i = 0; i < 24; i++)
        x[i] = 0.5f;
    volatile float sink = 0.0f;
    for (uint32_t l = 0; l < hp.n_layers; l++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            const struct lora_weights *w = lora_weights(ad, l, (enum lora_target)t);
            if (!w)
                continue;
            if (!(ad->cfg.target_mask >> t & 1u))
                abort();
            for (size_t i = 0; i < (size_t)ad->cfg.rank * ad->in[t]; i++)
                sink += w->a[i];
            for (size_t i = 0; i < (size_t)ad->out[t] * ad->cfg.rank; i++)
                sink += w->b[i];
            memset(y, 0, sizeof y);
            lora_apply_one(ad, 1.0f, l, (enum lora_target)t, x, 1, y, 24, tmp);
        }
    (void)sink;
    free(tmp);
    lora_close(ad);
    return 0;
}
