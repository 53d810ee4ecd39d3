/*
 * lora_load.c — reading a PEFT adapter (lora_open, lora_open_mem; docs/LORA.md): tensor
 * names, validation, conversion to f32, and the adapter's references.
 *
 * Loading validates everything before a byte of weights is converted: adapter_config.json
 * (lora_config.c), then every tensor name of adapter_model.safetensors parsed by grammar (no
 * table of strings), its layer, module, dtype and shape checked against the configuration
 * and the base model's hyper-parameters, and finally completeness (every targeted projection
 * of every adapted layer has both A and B). Weights are then converted to f32 into one
 * 64-byte aligned allocation, lora_B's q/k rows reordered for IEBIN's RoPE convention; the
 * serving copy and the digest follow (lora_pack.c); the safetensors mapping is closed before
 * returning.
 *
 * NOTES: adapters are immutable once loaded, reference counted with C11 atomics (acq_rel on
 * the decrement so the freeing thread sees every other user's reads finished).
 */
#include "lora.h"
#include "path.h"

#include "check.h"
#include "err.h"
#include "fmap.h"
#include "half.h"
#include "log.h"
#include "lora_internal.h"
#include "safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN_FLOATS 16u /* 64 bytes */

/* ---- tensor names ---- */

#define NAME_PREFIX "base_model.model.model.layers."

enum ab { AB_A = 0, AB_B = 1 };

/*
 * "base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight" ->
 * layer, target, A/B. 0, or an error logged naming the tensor.
 */
static int parse_name(const char *path, const char *name, uint32_t n_layers, uint32_t *layer,
                      enum lora_target *target, enum ab *ab)
{
    const char *p = name;
    if (strncmp(p, NAME_PREFIX, strlen(NAME_PREFIX)) != 0)
        goto not_lora;
    p += strlen(NAME_PREFIX);
    /* decimal without sign or leading zeros; at most 9 digits so it cannot overflow */
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        goto not_lora;
    uint32_t l = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (digits == 9)
            goto not_lora;
        l = l * 10 + (uint32_t)(*p - '0');
    }
    if (*p++ != '.')
        goto not_lora;
    const char *parent = p;
    const char *dot = strchr(parent, '.');
    if (!dot)
        goto not_lora;
    const char *module = dot + 1;
    const char *dot2 = strchr(module, '.');
    if (!dot2)
        goto not_lora;
    const char *tail = dot2 + 1;
    if (strcmp(tail, "lora_A.weight") == 0)
        *ab = AB_A;
    else if (strcmp(tail, "lora_B.weight") == 0)
        *ab = AB_B;
    else
        goto not_lora;
    int t = lora__target_from_module(module, (size_t)(dot2 - module));
    if (t < 0) {
        LOG_ERR("%s: tensor '%.200s': module '%.*s' is not a supported target (known: q_proj, "
                "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                path, name, (int)(dot2 - module > 64 ? 64 : dot2 - module), module);
        return ERR_UNSUPPORTED;
    }
    if ((size_t)(dot - parent) != strlen(lora__targets[t].parent) ||
        memcmp(parent, lora__targets[t].parent, (size_t)(dot - parent)) != 0)
        goto not_lora;
    if (l >= n_layers) {
        LOG_ERR("%s: tensor '%.200s': layer %u is out of range (the base model has %u layers, "
                "0..%u)",
                path, name, l, n_layers, n_layers - 1);
        return ERR_RANGE;
    }
    *layer = l;
    *target = (enum lora_target)t;
    return 0;
not_lora:
    LOG_ERR("%s: tensor '%.200s' is not a LoRA weight of a llama decoder layer (expected "
            NAME_PREFIX "N.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight or "
            NAME_PREFIX "N.mlp.{gate,up,down}_proj.lora_{A,B}.weight)",
            path, name);
    return ERR_FORMAT;
}

static void tensor_name(char *buf, size_t n, uint32_t layer, enum lora_target t, enum ab ab)
{
    snprintf(buf, n, NAME_PREFIX "%u.%s.%s.lora_%c.weight", layer, lora__targets[t].parent,
             lora__targets[t].module, ab == AB_A ? 'A' : 'B');
}

/* ---- loading ---- */

static _Atomic uint64_t g_next_id = 1;

static void adapter_free(struct lora_adapter *ad)
{
    if (!ad)
        return;
    ad->magic = 0;
    free(ad->w);
    free(ad->store);
    free(ad->fast_store);
    free(ad->name);
    free(ad->dir);
    free(ad);
}

void lora__adapter_unref(struct lora_adapter *ad)
{
    if (!ad)
        return;
    CHECK(ad->magic == LORA__MAGIC);
    int before = atomic_fetch_sub_explicit(&ad->refs_, 1, memory_order_acq_rel);
    CHECK(before > 0);
    if (before == 1)
        adapter_free(ad);
}

/* src element i of a tensor of dtype dt (unaligned-safe: safetensors promises no alignment) */
static float load_elem(enum safetensors_dtype dt, const unsigned char *src, size_t i)
{
    switch (dt) {
    case SAFETENSORS_F32: {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    case SAFETENSORS_F16: {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        return half_f16_to_f32(h);
    }
    case SAFETENSORS_BF16: {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        return half_bf16_to_f32(h);
    }
    default:
        CHECK(!"load_elem: dtype not validated");
        return 0.0f;
    }
}

/* HF rotate-half row of IEBIN (interleaved) row `row` of a [heads*head_dim] matrix. */
static size_t hf_row(size_t row, uint32_t head_dim)
{
    return (size_t)iebin_rope_hf_row(row, head_dim);
}

void lora_permute_rows_hf_to_iebin(float *dst, const float *src, uint32_t n_heads,
                                   uint32_t head_dim, size_t cols)
{
    CHECK(head_dim % 2 == 0);
    for (size_t r = 0; r < (size_t)n_heads * head_dim; r++)
        memcpy(dst + r * cols, src + hf_row(r, head_dim) * cols, cols * sizeof(float));
}

/*
 * Converts tensor st ([rows][cols]) to f32 into dst; for lora_B of q/k (heads != 0) row r of
 * dst comes from the file's row hf_row(r). Refuses non-finite values.
 */
static int convert(const char *path, const struct safetensors_tensor *st, float *dst,
                   size_t rows, size_t cols, uint32_t heads, uint32_t head_dim)
{
    const unsigned char *src = st->data;
    for (size_t r = 0; r < rows; r++) {
        size_t sr = heads ? hf_row(r, head_dim) : r;
        for (size_t c = 0; c < cols; c++) {
            float v = load_elem(st->dtype, src, sr * cols + c);
            if (!isfinite(v)) {
                LOG_ERR("%s: tensor '%.200s': element [%zu][%zu] is not finite", path,
                        st->name, sr, c);
                return ERR_RANGE;
            }
            dst[r * cols + c] = v;
        }
    }
    return 0;
}

static const char *shape_str(const uint64_t *shape, int n_dims, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

/* Checks one tensor's dtype and shape; `in`/`out` are the base projection's. */
static int check_tensor(const char *path, const struct safetensors_tensor *st,
                        const struct lora_config *cfg, enum lora_target t, enum ab ab,
                        uint32_t in, uint32_t out)
{
    enum dtype dt;
    char got[128], want[64];
    if (safetensors_dtype_to_dtype(st->dtype, &dt) != 0) {
        LOG_ERR("%s: tensor '%.200s': dtype %s is not supported (F32, F16 or BF16)", path,
                st->name, safetensors_dtype_name(st->dtype));
        return ERR_UNSUPPORTED;
    }
    uint64_t w[2] = {ab == AB_A ? cfg->rank : out, ab == AB_A ? in : cfg->rank};
    const char *words = ab == AB_A ? "r, in" : "out, r";
    if (st->n_dims != 2) {
        LOG_ERR("%s: tensor '%.200s': shape %s is not 2-D (expected %s = [%s] for %s)", path,
                st->name, shape_str(st->shape, st->n_dims, got, sizeof got),
                shape_str(w, 2, want, sizeof want), words, lora__targets[t].module);
        return ERR_MISMATCH;
    }
    uint64_t rank = st->shape[ab == AB_A ? 0 : 1];
    if (rank != cfg->rank) {
        LOG_ERR("%s: tensor '%.200s': shape %s has rank %llu, but adapter_config.json says r = "
                "%u",
                path, st->name, shape_str(st->shape, 2, got, sizeof got),
                (unsigned long long)rank, cfg->rank);
        return ERR_MISMATCH;
    }
    if (st->shape[0] != w[0] || st->shape[1] != w[1]) {
        LOG_ERR("%s: tensor '%.200s': shape %s does not match the base model's %s (%s; %s is "
                "[%u][%u])",
                path, st->name, shape_str(st->shape, 2, got, sizeof got),
                shape_str(w, 2, want, sizeof want), words, lora__targets[t].module, out, in);
        return ERR_MISMATCH;
    }
    return 0;
}

static size_t round_up(size_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

/*
 * The loader's core: ad->cfg parsed from cfg_what; validates f's tensors (f_what in messages)
 * against it and hp, then fills and finishes ad. Does not close f.
 */
static int build(struct lora_adapter *ad, const char *cfg_what, struct safetensors_file *f,
                 const char *f_what, const struct iebin_hparams *hp, const char *name,
                 const char *dir)
{
    int rc;
    const struct safetensors_tensor **found = NULL; /* [n_layers][TARGETS][2] */

    /* a mixture of experts (gpt_oss) has no dense gate/up/down for the update to reach:
     * refused, never silently left out */
    const unsigned ffn = 1u << LORA_GATE | 1u << LORA_UP | 1u << LORA_DOWN;
    if (hp->n_experts && (ad->cfg.target_mask & ffn)) {
        LOG_ERR("%s: target_modules lists feed-forward projections (gate_proj, up_proj, "
                "down_proj), but the base model's feed-forward is a mixture of %u experts, "
                "which LoRA adapters do not reach (attention projections only)",
                cfg_what, hp->n_experts);
        return ERR_UNSUPPORTED;
    }

    if (ad->cfg.has_layers) {
        for (uint32_t l = hp->n_layers; l < LORA_MAX_LAYERS; l++)
            if (lora__layer_listed(&ad->cfg, l)) {
                LOG_ERR("%s: layers_to_transform lists layer %u, out of range (the base model "
                        "has %u layers, 0..%u)",
                        cfg_what, l, hp->n_layers, hp->n_layers - 1);
                return ERR_RANGE;
            }
    }
    found = calloc((size_t)hp->n_layers * LORA_TARGET_COUNT * 2, sizeof *found);
    if (!found) {
        LOG_ERR("%s: out of memory", f_what);
        return -ENOMEM;
    }
    for (uint32_t t = 0; t < LORA_TARGET_COUNT; t++)
        lora_target_dims(hp, (enum lora_target)t, &ad->in[t], &ad->out[t]);

    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *st = &f->tensors[i];
        uint32_t layer;
        enum lora_target t;
        enum ab ab;
        if ((rc = parse_name(f_what, st->name, hp->n_layers, &layer, &t, &ab)) != 0)
            goto out;
        if (!(ad->cfg.target_mask >> t & 1u)) {
            LOG_ERR("%s: tensor '%.200s' adapts %s, which adapter_config.json's target_modules "
                    "does not list",
                    f_what, st->name, lora__targets[t].module);
            rc = ERR_MISMATCH;
            goto out;
        }
        if (!lora__layer_listed(&ad->cfg, layer)) {
            LOG_ERR("%s: tensor '%.200s' adapts layer %u, which adapter_config.json's "
                    "layers_to_transform does not list",
                    f_what, st->name, layer);
            rc = ERR_MISMATCH;
            goto out;
        }
        if ((rc = check_tensor(f_what, st, &ad->cfg, t, ab, ad->in[t], ad->out[t])) != 0)
            goto out;
        /* duplicates cannot happen: safetensors rejects duplicate keys, and the grammar
         * admits one spelling per (layer, module, A/B) */
        found[((size_t)layer * LORA_TARGET_COUNT + t) * 2 + ab] = st;
    }

    /* completeness, and the storage size (bounded by hparams and LORA_MAX_RANK; still
     * checked: size_t may be 32 bits) */
    uint64_t total = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        if (!lora__layer_listed(&ad->cfg, l))
            continue;
        for (uint32_t t = 0; t < LORA_TARGET_COUNT; t++) {
            if (!(ad->cfg.target_mask >> t & 1u))
                continue;
            for (int ab = 0; ab < 2; ab++) {
                if (found[((size_t)l * LORA_TARGET_COUNT + t) * 2 + (size_t)ab])
                    continue;
                char tn[160];
                tensor_name(tn, sizeof tn, l, (enum lora_target)t, (enum ab)ab);
                LOG_ERR("%s: tensor '%s' is missing (%s is in target_modules and layer %u is "
                        "adapted)",
                        f_what, tn, lora__targets[t].module, l);
                rc = ERR_NOT_FOUND;
                goto out;
            }
            uint64_t a = round_up((size_t)ad->cfg.rank * ad->in[t]);
            uint64_t b = round_up((size_t)ad->out[t] * ad->cfg.rank);
            total += a + b;
        }
    }
    if (total > SIZE_MAX / sizeof(float)) {
        LOG_ERR("%s: the adapter needs %llu floats, more than this machine can address", f_what,
                (unsigned long long)total);
        rc = ERR_OVERFLOW;
        goto out;
    }

    ad->n_layers = hp->n_layers;
    ad->store_floats = (size_t)total;
    ad->w = calloc((size_t)hp->n_layers * LORA_TARGET_COUNT, sizeof *ad->w);
    ad->store = total ? aligned_alloc(64, (size_t)total * sizeof(float)) : NULL;
    if (!ad->w || (total && !ad->store)) {
        LOG_ERR("%s: out of memory for %llu bytes of adapter weights", f_what,
                (unsigned long long)total * sizeof(float));
        rc = -ENOMEM;
        goto out;
    }
    float *p = ad->store;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        for (uint32_t t = 0; t < LORA_TARGET_COUNT; t++) {
            const struct safetensors_tensor **ab = &found[((size_t)l * LORA_TARGET_COUNT + t) * 2];
            if (!ab[AB_A])
                continue;
            uint32_t r = ad->cfg.rank, in = ad->in[t], o = ad->out[t];
            uint32_t heads = t == LORA_Q ? hp->n_heads : t == LORA_K ? hp->n_kv_heads : 0;
            float *a = p, *b = p + round_up((size_t)r * in);
            if ((rc = convert(f_what, ab[AB_A], a, r, in, 0, 0)) != 0 ||
                (rc = convert(f_what, ab[AB_B], b, o, r, heads, hp->head_dim)) != 0)
                goto out;
            ad->w[(size_t)l * LORA_TARGET_COUNT + t] = (struct lora_weights){.a = a, .b = b};
            p = b + round_up((size_t)o * r);
        }
    }
    bool all_bf16 = f->n_tensors > 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        all_bf16 &= f->tensors[i].dtype == SAFETENSORS_BF16;
    if ((rc = lora__pack(ad, all_bf16 ? DT_BF16 : DT_F32, f_what)) != 0)
        goto out;
    /* the digest covers what changes the computation (lora_pack.c) */
    ad->digest = lora__digest(ad);
    ad->name = strdup(name);
    ad->dir = strdup(dir);
    if (!ad->name || !ad->dir) {
        LOG_ERR("%s: out of memory", dir);
        rc = -ENOMEM;
        goto out;
    }
    ad->magic = LORA__MAGIC;
    ad->id = atomic_fetch_add(&g_next_id, 1);
    atomic_init(&ad->refs_, 1);
    LOG_DEBUG("%s: LoRA adapter r=%u alpha=%g scaling=%g, %zu floats", dir, ad->cfg.rank,
              (double)ad->cfg.alpha, (double)ad->cfg.scaling, ad->store_floats);
    rc = 0;
out:
    free(found);
    return rc;
}

int lora__open_named(const char *dir, const char *name, const struct iebin_hparams *hp,
                      struct lora_adapter **out)
{
    int rc;
    char *cfg_path = NULL, *st_path = NULL, *cfg_text = NULL;
    struct safetensors_file *f = NULL;
    struct lora_adapter *ad = NULL;
    size_t cfg_len = 0;

    *out = NULL;
    if ((rc = iebin_check_hparams(hp, "LoRA base model")) != 0)
        return rc;
    cfg_path = path_join(dir, LORA_CONFIG_FILE);
    st_path = path_join(dir, LORA_WEIGHTS_FILE);
    ad = calloc(1, sizeof *ad);
    if (!cfg_path || !st_path || !ad) {
        LOG_ERR("%s: out of memory loading the adapter", dir);
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = fmap_read(cfg_path, "adapter config", LORA_CONFIG_MAX, &cfg_text, &cfg_len)) != 0)
        goto out;
    if ((rc = lora_config_parse(cfg_path, cfg_text, cfg_len, &ad->cfg)) != 0)
        goto out;
    if (access(st_path, F_OK) != 0 && errno == ENOENT) {
        char *bin = path_join(dir, "adapter_model.bin");
        bool has_bin = bin && access(bin, F_OK) == 0;
        free(bin);
        if (has_bin) {
            LOG_ERR("%s: missing; %s/adapter_model.bin (PyTorch pickle) is not supported: save "
                    "the adapter with safe_serialization=True",
                    st_path, dir);
            rc = ERR_UNSUPPORTED;
            goto out;
        }
    }
    if ((rc = safetensors_open(st_path, &f)) != 0)
        goto out;
    if ((rc = build(ad, cfg_path, f, st_path, hp, name, dir)) != 0)
        goto out;
    *out = ad;
    ad = NULL;
out:
    adapter_free(ad);
    safetensors_close(f);
    free(cfg_text);
    free(st_path);
    free(cfg_path);
    return rc;
}

int lora_open_mem(const char *what, const char *config, size_t config_len,
                  const void *weights, size_t weights_len, const struct iebin_hparams *hp,
                  struct lora_adapter **out)
{
    int rc;
    struct safetensors_file *f = NULL;
    struct lora_adapter *ad = NULL;
    char *cfg_what = NULL, *st_what = NULL;

    *out = NULL;
    if ((rc = iebin_check_hparams(hp, "LoRA base model")) != 0)
        return rc;
    cfg_what = path_join(what, LORA_CONFIG_FILE);
    st_what = path_join(what, LORA_WEIGHTS_FILE);
    ad = calloc(1, sizeof *ad);
    if (!cfg_what || !st_what || !ad) {
        LOG_ERR("%s: out of memory loading the adapter", what);
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = lora_config_parse(cfg_what, config, config_len, &ad->cfg)) != 0 ||
        (rc = safetensors_open_mem(weights, weights_len, st_what, &f)) != 0 ||
        (rc = build(ad, cfg_what, f, st_what, hp, what, what)) != 0)
        goto out;
    *out = ad;
    ad = NULL;
out:
    adapter_free(ad);
    safetensors_close(f);
    free(st_what);
    free(cfg_what);
    return rc;
}

int lora_open(const char *dir, const struct iebin_hparams *hp, struct lora_adapter **out)
{
    return lora__open_named(dir, dir, hp, out);
}

void lora_close(struct lora_adapter *ad) { lora__adapter_unref(ad); }

int lora_refcount(const struct lora_adapter *ad) { return lora__refs(ad); }

const struct lora_weights *lora_weights(const struct lora_adapter *ad, uint32_t layer,
                                        enum lora_target t)
{
    CHECK(ad->magic == LORA__MAGIC);
    CHECK(layer < ad->n_layers && (unsigned)t < LORA_TARGET_COUNT);
    const struct lora_weights *w = &ad->w[(size_t)layer * LORA_TARGET_COUNT + t];
    return w->a ? w : NULL;
}
