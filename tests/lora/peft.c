/* peft.c — writing PEFT adapter directories for the LoRA tests (see peft.h). */
#include "testutil.h"
#include "rng.h"

#include "peft.h"

#include "half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const parents[LORA_TARGET_COUNT] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp",
};

const char *peft_name(uint32_t layer, enum lora_target t, int is_b)
{
    static char buf[8][160];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, 160, "base_model.model.model.layers.%u.%s.%s.lora_%c.weight", layer, parents[t],
             lora_target_name(t), is_b ? 'B' : 'A');
    return b;
}

void peft_write_tensors(const char *dir, const struct peft_tensor *t, size_t n)
{
    struct safetensors_writer *w;
    void **bufs = calloc(n ? n : 1, sizeof *bufs);
    assert_non_null(bufs);
    assert_int_equal(safetensors_writer_create(tu_path(dir, LORA_WEIGHTS_FILE), &w), 0);
    for (size_t i = 0; i < n; i++) {
        uint64_t count = 1;
        for (int d = 0; d < t[i].n_dims; d++)
            count *= t[i].shape[d];
        size_t esz = safetensors_dtype_size(t[i].dt);
        bufs[i] = malloc(count * esz + 1);
        assert_non_null(bufs[i]);
        const float *f = t[i].data;
        if (t[i].dt == SAFETENSORS_F32) {
            memcpy(bufs[i], f, count * 4);
        } else if (t[i].dt == SAFETENSORS_F16 || t[i].dt == SAFETENSORS_BF16) {
            uint16_t *h = bufs[i];
            for (uint64_t k = 0; k < count; k++)
                h[k] = t[i].dt == SAFETENSORS_F16 ? half_f32_to_f16(f[k]) : half_f32_to_bf16(f[k]);
        } else {
            memcpy(bufs[i], t[i].data, count * esz);
        }
        assert_int_equal(safetensors_writer_add(w, t[i].name, t[i].dt, t[i].shape, t[i].n_dims,
                                                bufs[i], count * esz),
                         0);
    }
    assert_int_equal(safetensors_writer_finish(w), 0);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
}

void peft_write_config(const char *dir, const char *json)
{
    tu_write_file(tu_path(dir, LORA_CONFIG_FILE), json, strlen(json));
}

char *peft_config_json(uint32_t rank, double alpha, uint32_t mask, const char *extra)
{
    char mods[256] = "";
    size_t used = 0;
    for (int t = 0; t < LORA_TARGET_COUNT; t++)
        if (mask >> t & 1u)
            used += (size_t)snprintf(mods + used, sizeof mods - used, "%s\"%s\"", used ? ", " : "",
                                     lora_target_name((enum lora_target)t));
    char *s = malloc(1024 + strlen(extra));
    assert_non_null(s);
    sprintf(s,
            "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": %u,\n"
            "  \"lora_alpha\": %.9g,\n  \"lora_dropout\": 0.05,\n  \"target_modules\": [%s],\n"
            "  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"use_dora\": false,\n"
            "  \"modules_to_save\": null,\n  \"rank_pattern\": {},\n"
            "  \"alpha_pattern\": {},\n  \"init_lora_weights\": true%s\n}\n",
            rank, alpha, mods, extra);
    return s;
}

static uint64_t rng(uint64_t *s) { return rng_splitmix64(s); }

static float unif(uint64_t *s) { return (float)(rng(s) >> 40) * (2.0f / 16777216.0f) - 1.0f; }

struct peft_adapter *peft_adapter_random(const struct iebin_hparams *hp, uint32_t rank,
                                         double alpha, uint32_t mask, uint64_t seed,
                                         float amp_a, float amp_b)
{
    assert_true(hp->n_layers <= LORA_MAX_LAYERS / 8);
    struct peft_adapter *pa = calloc(1, sizeof *pa);
    assert_non_null(pa);
    pa->hp = *hp;
    pa->rank = rank;
    pa->alpha = alpha;
    pa->mask = mask;
    uint64_t s = seed;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            if (!(mask >> t & 1u))
                continue;
            uint32_t in, out;
            lora_target_dims(hp, (enum lora_target)t, &in, &out);
            pa->a[l][t] = malloc((size_t)rank * in * sizeof(float));
            pa->b[l][t] = malloc((size_t)out * rank * sizeof(float));
            assert_non_null(pa->a[l][t]);
            assert_non_null(pa->b[l][t]);
            for (size_t i = 0; i < (size_t)rank * in; i++)
                pa->a[l][t][i] = amp_a * unif(&s);
            for (size_t i = 0; i < (size_t)out * rank; i++)
                pa->b[l][t][i] = amp_b * unif(&s);
        }
    return pa;
}

void peft_adapter_write(const struct peft_adapter *pa, const char *dir,
                        enum safetensors_dtype dt, const char *extra)
{
    mkdir(dir, 0755);
    char *cfg = peft_config_json(pa->rank, pa->alpha, pa->mask, extra);
    peft_write_config(dir, cfg);
    free(cfg);
    struct peft_tensor *ts = calloc((size_t)pa->hp.n_layers * LORA_TARGET_COUNT * 2, sizeof *ts);
    assert_non_null(ts);
    size_t n = 0;
    for (uint32_t l = 0; l < pa->hp.n_layers; l++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            if (!pa->a[l][t])
                continue;
            uint32_t in, out;
            lora_target_dims(&pa->hp, (enum lora_target)t, &in, &out);
            char *na = strdup(peft_name(l, (enum lora_target)t, 0));
            char *nb = strdup(peft_name(l, (enum lora_target)t, 1));
            ts[n++] = (struct peft_tensor){na, dt, 2, {pa->rank, in}, pa->a[l][t]};
            ts[n++] = (struct peft_tensor){nb, dt, 2, {out, pa->rank}, pa->b[l][t]};
        }
    peft_write_tensors(dir, ts, n);
    for (size_t i = 0; i < n; i++)
        free((char *)ts[i].name);
    free(ts);
}

void peft_adapter_free(struct peft_adapter *pa)
{
    if (!pa)
        return;
    for (uint32_t l = 0; l < pa->hp.n_layers; l++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            free(pa->a[l][t]);
            free(pa->b[l][t]);
        }
    free(pa);
}

void peft_permute_meta_to_hf(float *dst, const float *src, uint32_t heads, uint32_t hd,
                             size_t cols)
{
    /* src viewed as [heads][hd/2][2][cols]; dst = its transpose(1, 2): [heads][2][hd/2][cols] */
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t i = 0; i < hd / 2; i++)
            for (uint32_t s = 0; s < 2; s++) {
                const float *from = src + (((size_t)h * (hd / 2) + i) * 2 + s) * cols;
                float *to = dst + (((size_t)h * 2 + s) * (hd / 2) + i) * cols;
                memcpy(to, from, cols * sizeof(float));
            }
}

struct iebin_hparams peft_small_hparams(void)
{
    return (struct iebin_hparams){.dim = 16, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                  .head_dim = 4, .ffn_dim = 24, .vocab_size = 32,
                                  .max_seq_len = 64, .rope_theta = 10000.0f, .rms_eps = 1e-5f,
                                  .tied_embeddings = true};
}
