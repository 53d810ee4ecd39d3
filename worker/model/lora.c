/*
 * lora.c — LoRA adapters (see lora.h; the accepted PEFT subset and the math in docs/LORA.md).
 *
 * Loading validates everything before a byte of weights is converted: adapter_config.json
 * (jansson, duplicates rejected), then every tensor name of adapter_model.safetensors parsed
 * by grammar (no table of strings), its layer, module, dtype and shape checked against the
 * configuration and the base model's hyper-parameters, and finally completeness (every
 * targeted projection of every adapted layer has both A and B). Weights are then converted to
 * f32 into one 64-byte aligned allocation, lora_B's q/k rows reordered for IEBIN's RoPE
 * convention; the safetensors mapping is closed before returning.
 *
 * Applying: phase A and B are kern_matmul calls on f32 "weights" A [r][in] and B [out][r].
 * kern_matmul overwrites its output, so phase B computes the low-rank product in a stack tile
 * of at most TILE_T tokens x TILE_R rows and adds it, scaled per token, into y.
 *
 * NOTES: adapters are immutable once loaded, reference counted with C11 atomics (acq_rel on
 * the decrement so the freeing thread sees every other user's reads finished). The registry
 * is single-threaded by contract (lora.h).
 */
#include "lora.h"

#include "check.h"
#include "err.h"
#include "half.h"
#include "kern.h"
#include "fmap.h"
#include "log.h"
#include "pool.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#if defined(__x86_64__)
#include <immintrin.h> /* _mm_pause, _mm_prefetch (SSE, baseline x86-64) */
#endif
#include <sys/stat.h>
#include <unistd.h>

#define LORA_MAGIC 0x4c6f5241u /* "LoRA" */
#define ALIGN_FLOATS 16u       /* 64 bytes */
#define TILE_T 16u             /* phase B tile: tokens */
#define TILE_R 256u            /* phase B tile: output rows */

static const struct target_info {
    const char *module; /* PEFT module name */
    const char *parent; /* its parent module in a Hugging Face llama decoder layer */
} targets[LORA_TARGET_COUNT] = {
    [LORA_Q] = {"q_proj", "self_attn"},  [LORA_K] = {"k_proj", "self_attn"},
    [LORA_V] = {"v_proj", "self_attn"},  [LORA_O] = {"o_proj", "self_attn"},
    [LORA_GATE] = {"gate_proj", "mlp"},  [LORA_UP] = {"up_proj", "mlp"},
    [LORA_DOWN] = {"down_proj", "mlp"},
};

#define ALL_TARGETS ((1u << LORA_TARGET_COUNT) - 1u)

const char *lora_target_name(enum lora_target t)
{
    return (unsigned)t < LORA_TARGET_COUNT ? targets[t].module : "?";
}

void lora_target_dims(const struct iebin_hparams *hp, enum lora_target t, uint32_t *in,
                      uint32_t *out)
{
    uint32_t q = hp->n_heads * hp->head_dim, kv = hp->n_kv_heads * hp->head_dim;
    switch (t) {
    case LORA_Q:
        *in = hp->dim, *out = q;
        return;
    case LORA_K:
    case LORA_V:
        *in = hp->dim, *out = kv;
        return;
    case LORA_O:
        *in = q, *out = hp->dim;
        return;
    case LORA_GATE:
    case LORA_UP:
        *in = hp->dim, *out = hp->ffn_dim;
        return;
    case LORA_DOWN:
        *in = hp->ffn_dim, *out = hp->dim;
        return;
    case LORA_TARGET_COUNT:
        break;
    }
    CHECK(!"lora_target_dims: bad target");
}

static int target_from_module(const char *s, size_t n)
{
    for (int t = 0; t < LORA_TARGET_COUNT; t++)
        if (strlen(targets[t].module) == n && memcmp(s, targets[t].module, n) == 0)
            return t;
    return -1;
}

/* ---- adapter_config.json ---- */

/* A short rendering of a JSON value for messages. */
static const char *jdesc(const json_t *v, char *buf, size_t n)
{
    if (!v)
        return "missing";
    if (json_is_array(v))
        return "an array";
    if (json_is_object(v))
        return "an object";
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s)
        return "?";
    if (strlen(s) < n)
        snprintf(buf, n, "%s", s);
    else
        snprintf(buf, n, "%.*s...", (int)(n - 4), s);
    free(s);
    return buf;
}

/* An optional boolean that must be false (or null) for Clocher to apply the adapter exactly. */
static int refuse_true(const char *what, const json_t *root, const char *key, const char *why)
{
    char d[48];
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_false(v))
        return 0;
    if (!json_is_true(v)) {
        LOG_ERR("%s: %s is %s, not a boolean", what, key, jdesc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    LOG_ERR("%s: %s is true: not supported (%s)", what, key, why);
    return ERR_UNSUPPORTED;
}

/* An optional field that must be null or an empty array/object. */
static int refuse_nonempty(const char *what, const json_t *root, const char *key,
                           const char *why)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if ((json_is_array(v) && json_array_size(v) == 0) ||
        (json_is_object(v) && json_object_size(v) == 0))
        return 0;
    char d[48];
    LOG_ERR("%s: %s is %s: not supported (%s)", what, key, jdesc(v, d, sizeof d), why);
    return ERR_UNSUPPORTED;
}

static int parse_targets(const char *what, const json_t *v, uint32_t *mask)
{
    char d[48];
    *mask = 0;
    if (!v) {
        LOG_ERR("%s: target_modules is missing", what);
        return ERR_FORMAT;
    }
    if (json_is_string(v)) {
        /* PEFT reads a string as a regular expression over full module names, except this
         * shorthand; Clocher does not evaluate Python regular expressions. */
        if (strcmp(json_string_value(v), "all-linear") == 0) {
            *mask = ALL_TARGETS;
            return 0;
        }
        LOG_ERR("%s: target_modules is the string %s: regular expressions are not supported "
                "(list module names, e.g. [\"q_proj\", \"v_proj\"], or use \"all-linear\")",
                what, jdesc(v, d, sizeof d));
        return ERR_UNSUPPORTED;
    }
    if (!json_is_array(v)) {
        LOG_ERR("%s: target_modules is %s, not a list of module names", what,
                jdesc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    if (json_array_size(v) == 0) {
        LOG_ERR("%s: target_modules is an empty list: the adapter adapts nothing", what);
        return ERR_FORMAT;
    }
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_string(e)) {
            LOG_ERR("%s: target_modules[%zu] is %s, not a string", what, i,
                    jdesc(e, d, sizeof d));
            return ERR_FORMAT;
        }
        int t = target_from_module(json_string_value(e), json_string_length(e));
        if (t < 0) {
            LOG_ERR("%s: target_modules[%zu] %s is not a supported target (known: q_proj, "
                    "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                    what, i, jdesc(e, d, sizeof d));
            return ERR_UNSUPPORTED;
        }
        *mask |= 1u << t;
    }
    return 0;
}

static int layer_value(const char *what, const char *field, const json_t *v, uint32_t *out)
{
    char d[48];
    if (!json_is_integer(v)) {
        LOG_ERR("%s: %s is %s, not an integer layer index", what, field, jdesc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= (json_int_t)LORA_MAX_LAYERS) {
        LOG_ERR("%s: %s is %lld, outside 0..%u", what, field, (long long)x, LORA_MAX_LAYERS - 1);
        return ERR_RANGE;
    }
    *out = (uint32_t)x;
    return 0;
}

static int parse_layers(const char *what, const json_t *v, struct lora_config *c)
{
    uint32_t l;
    int rc;
    if (!v || json_is_null(v))
        return 0;
    c->has_layers = true;
    if (json_is_integer(v)) {
        if ((rc = layer_value(what, "layers_to_transform", v, &l)) != 0)
            return rc;
        c->layers[l / 64] |= UINT64_C(1) << (l % 64);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0) {
        char d[48];
        LOG_ERR("%s: layers_to_transform is %s, not a layer index or a non-empty list of them",
                what, json_is_array(v) ? "an empty list" : jdesc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        char field[48];
        snprintf(field, sizeof field, "layers_to_transform[%zu]", i);
        if ((rc = layer_value(what, field, e, &l)) != 0)
            return rc;
        c->layers[l / 64] |= UINT64_C(1) << (l % 64);
    }
    return 0;
}

static bool layer_listed(const struct lora_config *c, uint32_t l)
{
    return !c->has_layers || (l < LORA_MAX_LAYERS && (c->layers[l / 64] >> (l % 64)) & 1u);
}

int lora_config_parse(const char *what, const char *json, size_t len, struct lora_config *out)
{
    char d[48];
    int rc;
    memset(out, 0, sizeof *out);
    if (len > LORA_CONFIG_MAX) {
        LOG_ERR("%s: %zu bytes, larger than the %u-byte limit for an adapter configuration",
                what, len, LORA_CONFIG_MAX);
        return ERR_RANGE;
    }
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", what, jerr.line, jerr.column,
                jerr.text);
        return ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        LOG_ERR("%s: the configuration is %s, not a JSON object", what,
                jdesc(root, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }

    const json_t *v = json_object_get(root, "peft_type");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) {
            LOG_ERR("%s: peft_type is %s, not a string", what, jdesc(v, d, sizeof d));
            rc = ERR_FORMAT;
            goto out;
        }
        if (strcmp(json_string_value(v), "LORA") != 0) {
            LOG_ERR("%s: peft_type %s is not supported (only \"LORA\")", what,
                    jdesc(v, d, sizeof d));
            rc = ERR_UNSUPPORTED;
            goto out;
        }
    }

    v = json_object_get(root, "r");
    if (!v) {
        LOG_ERR("%s: r (the rank) is missing", what);
        rc = ERR_FORMAT;
        goto out;
    }
    if (!json_is_integer(v)) {
        LOG_ERR("%s: r is %s, not an integer", what, jdesc(v, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    if (json_integer_value(v) < 1 || json_integer_value(v) > (json_int_t)LORA_MAX_RANK) {
        LOG_ERR("%s: r is %lld, outside 1..%u", what, (long long)json_integer_value(v),
                LORA_MAX_RANK);
        rc = ERR_RANGE;
        goto out;
    }
    out->rank = (uint32_t)json_integer_value(v);

    v = json_object_get(root, "lora_alpha");
    if (!v || !json_is_number(v)) {
        LOG_ERR("%s: lora_alpha is %s, not a number", what, jdesc(v, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    double alpha = json_number_value(v);
    if (!(fabs(alpha) <= FLT_MAX)) {
        LOG_ERR("%s: lora_alpha %g does not fit a float", what, alpha);
        rc = ERR_RANGE;
        goto out;
    }
    out->alpha = (float)alpha;

    if ((rc = refuse_true(what, root, "use_dora", "DoRA's magnitude vector is not applied")) ||
        (rc = refuse_true(what, root, "fan_in_fan_out",
                          "Conv1D-style [in][out] weights; llama uses nn.Linear")) ||
        (rc = refuse_true(what, root, "lora_bias", "lora_B bias terms are not applied")) ||
        (rc = refuse_nonempty(what, root, "modules_to_save",
                              "full replacement modules are not applied")) ||
        (rc = refuse_nonempty(what, root, "rank_pattern", "per-module ranks")) ||
        (rc = refuse_nonempty(what, root, "alpha_pattern", "per-module alphas")) ||
        (rc = refuse_nonempty(what, root, "layer_replication", "replicated layers")) ||
        (rc = refuse_nonempty(what, root, "target_parameters", "parameter targets")) ||
        (rc = refuse_nonempty(what, root, "trainable_token_indices", "trainable tokens")))
        goto out;

    v = json_object_get(root, "bias");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) {
            LOG_ERR("%s: bias is %s, not a string", what, jdesc(v, d, sizeof d));
            rc = ERR_FORMAT;
            goto out;
        }
        if (strcmp(json_string_value(v), "none") != 0) {
            LOG_ERR("%s: bias is %s: not supported (only \"none\": bias terms are not applied)",
                    what, jdesc(v, d, sizeof d));
            rc = ERR_UNSUPPORTED;
            goto out;
        }
    }

    v = json_object_get(root, "use_rslora");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        LOG_ERR("%s: use_rslora is %s, not a boolean", what, jdesc(v, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    out->rslora = v && json_is_true(v);

    if ((rc = parse_targets(what, json_object_get(root, "target_modules"), &out->target_mask)))
        goto out;
    if ((rc = parse_layers(what, json_object_get(root, "layers_to_transform"), out)))
        goto out;

    out->scaling = out->rslora ? (float)((double)out->alpha / sqrt((double)out->rank))
                               : (float)((double)out->alpha / (double)out->rank);
    rc = 0;
out:
    json_decref(root);
    return rc;
}

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
    int t = target_from_module(module, (size_t)(dot2 - module));
    if (t < 0) {
        LOG_ERR("%s: tensor '%.200s': module '%.*s' is not a supported target (known: q_proj, "
                "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                path, name, (int)(dot2 - module > 64 ? 64 : dot2 - module), module);
        return ERR_UNSUPPORTED;
    }
    if ((size_t)(dot - parent) != strlen(targets[t].parent) ||
        memcmp(parent, targets[t].parent, (size_t)(dot - parent)) != 0)
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
    snprintf(buf, n, NAME_PREFIX "%u.%s.%s.lora_%c.weight", layer, targets[t].parent,
             targets[t].module, ab == AB_A ? 'A' : 'B');
}

/* ---- loading ---- */

static _Atomic uint64_t g_next_id = 1;

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", dir, name);
    return s;
}

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

static void adapter_unref(struct lora_adapter *ad)
{
    if (!ad)
        return;
    CHECK(ad->magic == LORA_MAGIC);
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
                shape_str(w, 2, want, sizeof want), words, targets[t].module);
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
                shape_str(w, 2, want, sizeof want), words, targets[t].module, out, in);
        return ERR_MISMATCH;
    }
    return 0;
}

/*
 * The content digest: an xxh64-style 4-lane multiply-rotate hash over 64-bit words (not
 * cryptographic: it tells adapters apart, it does not authenticate them; an accidental
 * collision between two of n adapters has probability ~n^2 / 2^65).
 */
#define P1 UINT64_C(0x9e3779b185ebca87)
#define P2 UINT64_C(0xc2b2ae3d27d4eb4f)
#define P3 UINT64_C(0x165667b19e3779f9)

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t lane(uint64_t acc, uint64_t w) { return rotl64(acc + w * P2, 31) * P1; }

struct digest {
    uint64_t v[4];
    uint64_t n; /* words */
};

static void digest_init(struct digest *d)
{
    d->v[0] = P1 + P2, d->v[1] = P2, d->v[2] = 0, d->v[3] = (uint64_t)0 - P1;
    d->n = 0;
}

static void digest_words(struct digest *d, const void *p, size_t bytes)
{
    const unsigned char *b = p;
    for (size_t i = 0; i + 8 <= bytes; i += 8, d->n++) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        d->v[d->n & 3] = lane(d->v[d->n & 3], w);
    }
    if (bytes % 8) {
        uint64_t w = 0;
        memcpy(&w, b + bytes / 8 * 8, bytes % 8);
        d->v[d->n & 3] = lane(d->v[d->n & 3], w);
        d->n++;
    }
}

static uint64_t digest_final(const struct digest *d)
{
    uint64_t h = rotl64(d->v[0], 1) + rotl64(d->v[1], 7) + rotl64(d->v[2], 12) +
                 rotl64(d->v[3], 18);
    for (int i = 0; i < 4; i++)
        h = (h ^ lane(0, d->v[i])) * P1 + P3;
    h += d->n * 8;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h ? h : 1; /* 0 is the base model */
}

static size_t round_up(size_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

/* Bytes of the serving copy (lora_weights.fa / .fbt in ad->fast_dt): rank rows [0, k) of A
 * for target t, and the B^T panels holding columns [0, c) (c a multiple of 32, or out). */
static size_t fa_offset(const struct lora_adapter *ad, uint32_t t, size_t k)
{
    return k * ad->in[t] * (ad->fast_dt == DT_BF16 ? 2 : 4);
}

static size_t fbt_offset(const struct lora_adapter *ad, size_t c)
{
    size_t panels = (c + LORA_PANEL - 1) / LORA_PANEL, r = ad->cfg.rank;
    return panels * LORA_PANEL * r * (ad->fast_dt == DT_BF16 ? 2 : 4);
}

/* bytes per weight of the serving copy, for balancing tasks by cost */
static double fast_elem_bytes(const struct lora_adapter *ad)
{
    return ad->fast_dt == DT_BF16 ? 2.0 : 4.0;
}

/*
 * The serving path's copy (lora_weights.fa/fbt) in dt: B transposed into panels of 32 output
 * columns (lora_bt_index) so that an expand task streams one contiguous block. build() asks
 * for bf16 when the file holds only BF16 tensors (the f32 values are then exact bf16 numbers:
 * no precision is lost, and the update reads half the bytes; decode with several adapters is
 * bound by those bytes), else f32 (A shared with the canonical copy, B^T copied);
 * lora_repack may ask for bf16 on any file (rounded).
 */
static int pack_fast(struct lora_adapter *ad, enum dtype dt, const char *f_what)
{
    ad->fast_dt = dt;
    const bool bf16 = dt == DT_BF16;
    const size_t esz = bf16 ? 2 : 4;
    size_t bytes = 0;
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_TARGET_COUNT; i++) {
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT);
        if (!ad->w[i].a)
            continue;
        if (dt != DT_F32)
            bytes += (fa_offset(ad, t, ad->cfg.rank) + 63) / 64 * 64;
        bytes += (fbt_offset(ad, ad->out[t]) + 63) / 64 * 64;
    }
    ad->fast_bytes = bytes;
    ad->fast_store = bytes ? aligned_alloc(64, bytes) : NULL;
    if (bytes && !ad->fast_store) {
        LOG_ERR("%s: out of memory for %zu bytes of packed adapter weights", f_what, bytes);
        return -ENOMEM;
    }
    unsigned char *p = ad->fast_store;
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_TARGET_COUNT; i++) {
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT);
        struct lora_weights *w = &ad->w[i];
        if (!w->a)
            continue;
        size_t r = ad->cfg.rank, in = ad->in[t], out = ad->out[t];
        if (bf16) {
            uint16_t *a16 = (uint16_t *)p;
            for (size_t k = 0; k < r * in; k++)
                a16[k] = half_f32_to_bf16(w->a[k]);
            w->fa = a16;
            p += (r * in * esz + 63) / 64 * 64;
        } else {
            w->fa = w->a;
        }
        size_t nbt = lora_bt_elems(out, r);
        memset(p, 0, nbt * esz); /* the last panel's padding columns */
        for (size_t k = 0; k < r; k++)
            for (size_t j = 0; j < out; j++) {
                size_t d = lora_bt_index(r, k, j);
                if (bf16)
                    ((uint16_t *)p)[d] = half_f32_to_bf16(w->b[j * r + k]);
                else
                    ((float *)p)[d] = w->b[j * r + k];
            }
        w->fbt = p;
        p += (nbt * esz + 63) / 64 * 64;
    }
    return 0;
}

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

    if (ad->cfg.has_layers) {
        for (uint32_t l = hp->n_layers; l < LORA_MAX_LAYERS; l++)
            if (layer_listed(&ad->cfg, l)) {
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
                    f_what, st->name, targets[t].module);
            rc = ERR_MISMATCH;
            goto out;
        }
        if (!layer_listed(&ad->cfg, layer)) {
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
        if (!layer_listed(&ad->cfg, l))
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
                        f_what, tn, targets[t].module, l);
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
    if ((rc = pack_fast(ad, all_bf16 ? DT_BF16 : DT_F32, f_what)) != 0)
        goto out;
    /* the digest covers what changes the computation, in a fixed layout (padding between
     * matrices is left out: it is never read) */
    struct digest dg;
    digest_init(&dg);
    uint32_t hdr[4] = {ad->cfg.rank, ad->cfg.target_mask, hp->n_layers, 0};
    memcpy(&hdr[3], &ad->cfg.scaling, 4);
    digest_words(&dg, hdr, sizeof hdr);
    for (size_t i = 0; i < (size_t)hp->n_layers * LORA_TARGET_COUNT; i++) {
        const struct lora_weights *w = &ad->w[i];
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT), here = w->a != NULL;
        digest_words(&dg, &here, 4);
        if (!here)
            continue;
        digest_words(&dg, w->a, (size_t)ad->cfg.rank * ad->in[t] * sizeof(float));
        digest_words(&dg, w->b, (size_t)ad->out[t] * ad->cfg.rank * sizeof(float));
    }
    ad->digest = digest_final(&dg);
    ad->name = strdup(name);
    ad->dir = strdup(dir);
    if (!ad->name || !ad->dir) {
        LOG_ERR("%s: out of memory", dir);
        rc = -ENOMEM;
        goto out;
    }
    ad->magic = LORA_MAGIC;
    ad->id = atomic_fetch_add(&g_next_id, 1);
    atomic_init(&ad->refs_, 1);
    LOG_DEBUG("%s: LoRA adapter r=%u alpha=%g scaling=%g, %zu floats", dir, ad->cfg.rank,
              (double)ad->cfg.alpha, (double)ad->cfg.scaling, ad->store_floats);
    rc = 0;
out:
    free(found);
    return rc;
}

static int open_named(const char *dir, const char *name, const struct iebin_hparams *hp,
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
    cfg_path = join(dir, LORA_CONFIG_FILE);
    st_path = join(dir, LORA_WEIGHTS_FILE);
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
        char *bin = join(dir, "adapter_model.bin");
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
    cfg_what = join(what, LORA_CONFIG_FILE);
    st_what = join(what, LORA_WEIGHTS_FILE);
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
    return open_named(dir, dir, hp, out);
}

static const char *const pack_names[] = {"auto", "bf16"};

int lora_pack_parse(const char *s, enum lora_pack *out)
{
    for (unsigned i = 0; i < 2; i++)
        if (strcmp(s, pack_names[i]) == 0) {
            *out = (enum lora_pack)i;
            return 0;
        }
    LOG_ERR("LoRA weight packing '%.32s' is unknown: auto or bf16", s);
    return ERR_FORMAT;
}

int lora_repack(struct lora_adapter *ad, enum lora_pack pack)
{
    CHECK(ad->magic == LORA_MAGIC && lora_refcount(ad) == 1);
    enum dtype dt = pack == LORA_PACK_BF16 ? DT_BF16 : ad->fast_dt;
    if (dt == ad->fast_dt)
        return 0;
    void *old = ad->fast_store;
    enum dtype old_dt = ad->fast_dt;
    struct lora_weights *keep = malloc((size_t)ad->n_layers * LORA_TARGET_COUNT * sizeof *keep);
    if (!keep) {
        LOG_ERR("%s: out of memory repacking the adapter", ad->dir);
        return -ENOMEM;
    }
    memcpy(keep, ad->w, (size_t)ad->n_layers * LORA_TARGET_COUNT * sizeof *keep);
    int rc = pack_fast(ad, dt, ad->dir);
    if (rc) { /* the previous copy stays */
        free(ad->fast_store);
        memcpy(ad->w, keep, (size_t)ad->n_layers * LORA_TARGET_COUNT * sizeof *keep);
        ad->fast_store = old;
        ad->fast_dt = old_dt;
        free(keep);
        return rc;
    }
    free(keep);
    free(old);
    /* a lossy copy computes something else: prefix reuse and snapshots must not mix them */
    struct digest dg;
    digest_init(&dg);
    uint64_t words[2] = {ad->digest, (uint64_t)dt};
    digest_words(&dg, words, sizeof words);
    ad->digest = digest_final(&dg);
    return 0;
}

void lora_close(struct lora_adapter *ad) { adapter_unref(ad); }

int lora_refcount(const struct lora_adapter *ad)
{
    return atomic_load_explicit(&ad->refs_, memory_order_acquire);
}

const struct lora_weights *lora_weights(const struct lora_adapter *ad, uint32_t layer,
                                        enum lora_target t)
{
    CHECK(ad->magic == LORA_MAGIC);
    CHECK(layer < ad->n_layers && (unsigned)t < LORA_TARGET_COUNT);
    const struct lora_weights *w = &ad->w[(size_t)layer * LORA_TARGET_COUNT + t];
    return w->a ? w : NULL;
}

/* ---- registry ---- */

#define REGISTRY_MAGIC 0x4c6f5267u /* "LoRg" */

struct lora_registry {
    uint32_t magic;
    struct iebin_hparams hp;
    enum lora_pack pack; /* applied to adapters loaded from now on */
    size_t max, n;
    struct lora_adapter **v; /* [max], the first n used, in load order */
};

int lora_registry_create(const struct iebin_hparams *hp, size_t max_adapters,
                         struct lora_registry **out)
{
    int rc;
    *out = NULL;
    if ((rc = iebin_check_hparams(hp, "LoRA registry base model")) != 0)
        return rc;
    struct lora_registry *r = calloc(1, sizeof *r);
    size_t max = max_adapters ? max_adapters : LORA_REGISTRY_DEFAULT_MAX;
    if (r)
        r->v = calloc(max, sizeof *r->v);
    if (!r || !r->v) {
        LOG_ERR("LoRA registry: out of memory");
        free(r);
        return -ENOMEM;
    }
    r->magic = REGISTRY_MAGIC;
    r->hp = *hp;
    r->max = max;
    *out = r;
    return 0;
}

void lora_registry_destroy(struct lora_registry *r)
{
    if (!r)
        return;
    CHECK(r->magic == REGISTRY_MAGIC);
    for (size_t i = 0; i < r->n; i++)
        adapter_unref(r->v[i]);
    r->magic = 0;
    free(r->v);
    free(r);
}

static long find(const struct lora_registry *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->v[i]->name, name) == 0)
            return (long)i;
    return -1;
}

static int check_name(const char *name)
{
    size_t n = strnlen(name, LORA_NAME_MAX);
    bool ok = n > 0 && n < LORA_NAME_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        char c = name[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    }
    if (!ok) {
        LOG_ERR("LoRA adapter name '%.*s%s' is invalid: 1..%u bytes of A-Z a-z 0-9 . _ -",
                (int)(n > 64 ? 64 : n), name, n > 64 ? "..." : "", LORA_NAME_MAX - 1);
        return ERR_FORMAT;
    }
    return 0;
}

void lora_registry_set_pack(struct lora_registry *r, enum lora_pack pack)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    r->pack = pack;
}

int lora_registry_load(struct lora_registry *r, const char *name, const char *dir)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    int rc;
    if ((rc = check_name(name)) != 0)
        return rc;
    long taken = find(r, name);
    if (taken >= 0) {
        LOG_ERR("LoRA adapter '%s' is already loaded (from %s): unload it first", name,
                r->v[taken]->dir);
        return ERR_STATE;
    }
    if (r->n == r->max) {
        LOG_ERR("LoRA adapter '%s': %zu adapters are loaded, the most this registry holds",
                name, r->max);
        return ERR_OVERLOADED;
    }
    struct lora_adapter *ad;
    if ((rc = open_named(dir, name, &r->hp, &ad)) != 0)
        return rc;
    if ((rc = lora_repack(ad, r->pack)) != 0) {
        adapter_unref(ad);
        return rc;
    }
    r->v[r->n++] = ad;
    LOG_INFO("LoRA adapter '%s' loaded from %s (r=%u, scaling %g, %s weights)", name, dir,
             ad->cfg.rank, (double)ad->cfg.scaling,
             ad->fast_dt == DT_BF16 ? "bf16" : "f32");
    return 0;
}

int lora_registry_unload(struct lora_registry *r, const char *name)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    long i = find(r, name);
    if (i < 0) {
        LOG_ERR("LoRA adapter '%.64s' is not loaded", name);
        return ERR_NOT_FOUND;
    }
    struct lora_adapter *ad = r->v[i];
    memmove(&r->v[i], &r->v[i + 1], (r->n - (size_t)i - 1) * sizeof *r->v);
    r->n--;
    int users = lora_refcount(ad) - 1;
    if (users > 0)
        LOG_INFO("LoRA adapter '%s' unloaded; freed when its %d user(s) finish", name, users);
    else
        LOG_INFO("LoRA adapter '%s' unloaded", name);
    adapter_unref(ad);
    return 0;
}

int lora_registry_acquire(struct lora_registry *r, const char *name, struct lora_adapter **out)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    *out = NULL;
    long i = find(r, name);
    if (i < 0) {
        LOG_ERR("LoRA adapter '%.64s' is not loaded", name);
        return ERR_NOT_FOUND;
    }
    atomic_fetch_add_explicit(&r->v[i]->refs_, 1, memory_order_relaxed);
    *out = r->v[i];
    return 0;
}

void lora_registry_release(struct lora_adapter *ad) { adapter_unref(ad); }

size_t lora_registry_count(const struct lora_registry *r) { return r->n; }

const struct lora_adapter *lora_registry_at(const struct lora_registry *r, size_t i)
{
    CHECK(i < r->n);
    return r->v[i];
}

/* ---- applying ---- */

void lora_plan_init(struct lora_plan *p) { memset(p, 0, sizeof *p); }

void lora_plan_fini(struct lora_plan *p)
{
    free(p->segs);
    free(p->scale);
    memset(p, 0, sizeof *p);
}

int lora_plan_build(struct lora_plan *p, const struct lora_adapter *const *ad,
                    const float *scale, size_t n_tok)
{
    if (n_tok > p->cap_tok) {
        float *s = realloc(p->scale, n_tok * sizeof *s);
        if (!s) {
            LOG_ERR("LoRA plan: out of memory for %zu tokens", n_tok);
            return -ENOMEM;
        }
        p->scale = s;
        p->cap_tok = n_tok;
    }
    p->n_tok = n_tok;
    p->n_segs = 0;
    p->tmp_floats = 0;
    p->max_rank = 0;
    for (size_t t = 0; t < n_tok; t++) {
        const struct lora_adapter *a = ad[t];
        if (!a) {
            p->scale[t] = 0.0f;
            continue;
        }
        CHECK(a->magic == LORA_MAGIC);
        p->scale[t] = a->cfg.scaling * scale[t];
        struct lora_seg *last = p->n_segs ? &p->segs[p->n_segs - 1] : NULL;
        if (last && last->ad == a && last->t0 + last->n == t) {
            last->n++;
        } else {
            if (p->n_segs == p->cap_segs) {
                size_t cap = p->cap_segs ? 2 * p->cap_segs : 8;
                struct lora_seg *s = realloc(p->segs, cap * sizeof *s);
                if (!s) {
                    LOG_ERR("LoRA plan: out of memory for %zu segments", cap);
                    return -ENOMEM;
                }
                p->segs = s;
                p->cap_segs = cap;
            }
            p->segs[p->n_segs++] = (struct lora_seg){.ad = a, .t0 = t, .n = 1};
        }
        if (a->cfg.rank > p->max_rank)
            p->max_rank = a->cfg.rank;
    }
    for (size_t i = 0; i < p->n_segs; i++) {
        p->segs[i].tmp0 = p->tmp_floats;
        p->tmp_floats += p->segs[i].n * p->segs[i].ad->cfg.rank;
    }
    return 0;
}

/* tmp [n][r] = x [n][in] . A^T, rank rows [k0, k1) clamped to r. */
static void seg_a(const struct lora_adapter *ad, uint32_t layer, enum lora_target t,
                  const float *x, size_t n, float *tmp, size_t k0, size_t k1)
{
    const struct lora_weights *w = lora_weights(ad, layer, t);
    size_t r = ad->cfg.rank;
    if (!w || k0 >= r || k0 >= k1)
        return;
    kern_matmul(DT_F32, w->a, ad->in[t], x, n, tmp, r, k0, k1 < r ? k1 : r);
}

/* y[i][r0..r1) += s_i * (tmp[i] . B^T) for i < n; s_i = scale[i], or s when scale is NULL. */
static void seg_b(const struct lora_adapter *ad, uint32_t layer, enum lora_target t,
                  const float *tmp, size_t n, const float *scale, float s, float *y,
                  size_t ldy, size_t r0, size_t r1)
{
    const struct lora_weights *w = lora_weights(ad, layer, t);
    if (!w)
        return;
    size_t r = ad->cfg.rank;
    CHECK(r0 <= r1 && r1 <= ad->out[t]);
    float d[TILE_T * TILE_R]; /* [nt][nr] */
    for (size_t i0 = 0; i0 < n; i0 += TILE_T) {
        size_t nt = n - i0 < TILE_T ? n - i0 : TILE_T;
        for (size_t rb = r0; rb < r1; rb += TILE_R) {
            size_t nr = r1 - rb < TILE_R ? r1 - rb : TILE_R;
            /* rows [rb, rb+nr) of B as a matrix of their own */
            kern_matmul(DT_F32, w->b + rb * r, r, tmp + i0 * r, nt, d, nr, 0, nr);
            for (size_t i = 0; i < nt; i++) {
                float si = scale ? scale[i0 + i] : s;
                float *yr = y + (i0 + i) * ldy + rb;
                const float *dr = d + i * nr;
                for (size_t j = 0; j < nr; j++)
                    yr[j] += si * dr[j];
            }
        }
    }
}

void lora_apply_a(const struct lora_plan *p, uint32_t layer, enum lora_target t, const float *x,
                  float *tmp, size_t k0, size_t k1)
{
    for (size_t i = 0; i < p->n_segs; i++) {
        const struct lora_seg *s = &p->segs[i];
        seg_a(s->ad, layer, t, x + s->t0 * s->ad->in[t], s->n, tmp + s->tmp0, k0, k1);
    }
}

void lora_apply_b(const struct lora_plan *p, uint32_t layer, enum lora_target t,
                  const float *tmp, float *y, size_t ldy, size_t r0, size_t r1)
{
    for (size_t i = 0; i < p->n_segs; i++) {
        const struct lora_seg *s = &p->segs[i];
        seg_b(s->ad, layer, t, tmp + s->tmp0, s->n, p->scale + s->t0, 0.0f, y + s->t0 * ldy,
              ldy, r0, r1);
    }
}

void lora_apply(const struct lora_plan *p, uint32_t layer, enum lora_target t, const float *x,
                float *tmp, float *y, size_t ldy)
{
    for (size_t i = 0; i < p->n_segs; i++) {
        const struct lora_seg *s = &p->segs[i];
        seg_a(s->ad, layer, t, x + s->t0 * s->ad->in[t], s->n, tmp + s->tmp0, 0,
              s->ad->cfg.rank);
        seg_b(s->ad, layer, t, tmp + s->tmp0, s->n, p->scale + s->t0, 0.0f, y + s->t0 * ldy,
              ldy, 0, s->ad->out[t]);
    }
}

void lora_apply_one(const struct lora_adapter *ad, float scale, uint32_t layer,
                    enum lora_target t, const float *x, size_t n, float *y, size_t ldy,
                    float *tmp)
{
    seg_a(ad, layer, t, x, n, tmp, 0, ad->cfg.rank);
    seg_b(ad, layer, t, tmp, n, NULL, ad->cfg.scaling * scale, y, ldy, 0, ad->out[t]);
}

/* ---- the serving path: packed weights, fused phases (lora_apply_fused) ----
 * The kernels are kern_lora_shrink / kern_lora_expand (kernels/kern.h): bf16 weights on
 * AVX512-BF16 with activations rounded to bf16; f32 weights, and bf16 elsewhere, widened
 * exactly on AVX2; CLOCHER_ISA=ref the scalar ones. */

#define SHRINK_KB 8u   /* phase A task: rank rows */
#define EXPAND_JB 256u /* phase B task: output columns */
struct fused_job {
    const struct lora_plan *p;
    uint32_t layer;
    const struct lora_proj *pr;
    size_t n_proj;
    float *tmp;     /* [n_proj][p->tmp_floats] */
    size_t n_blk;   /* tasks per (projection, segment): rank blocks or column blocks */
};

/* task = (projection, segment, block of SHRINK_KB rank rows) */
static void fused_a(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct fused_job *j = ctx;
    size_t blk = task % j->n_blk, rest = task / j->n_blk;
    size_t si = rest % j->p->n_segs, pi = rest / j->p->n_segs;
    const struct lora_seg *s = &j->p->segs[si];
    const struct lora_proj *pr = &j->pr[pi];
    const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
    size_t r = s->ad->cfg.rank, k0 = blk * SHRINK_KB;
    if (!w || k0 >= r)
        return;
    size_t k1 = k0 + SHRINK_KB < r ? k0 + SHRINK_KB : r, in = s->ad->in[pr->t];
    kern_lora_shrink(s->ad->fast_dt, w->fa, in, r, pr->x + s->t0 * in, s->n,
                     j->tmp + pi * j->p->tmp_floats + s->tmp0, k0, k1);
}

/* task = (projection, segment, block of EXPAND_JB output columns) */
static void fused_b(void *ctx, size_t task, int thread)
{
    (void)thread;
    const struct fused_job *j = ctx;
    size_t blk = task % j->n_blk, rest = task / j->n_blk;
    size_t si = rest % j->p->n_segs, pi = rest / j->p->n_segs;
    const struct lora_seg *s = &j->p->segs[si];
    const struct lora_proj *pr = &j->pr[pi];
    const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
    size_t out = s->ad->out[pr->t], c0 = blk * EXPAND_JB;
    if (!w || c0 >= out)
        return;
    size_t c1 = c0 + EXPAND_JB < out ? c0 + EXPAND_JB : out;
    kern_lora_expand(s->ad->fast_dt, w->fbt, s->ad->cfg.rank,
                     j->tmp + pi * j->p->tmp_floats + s->tmp0, s->n, j->p->scale + s->t0, 0.0f,
                     pr->y + s->t0 * pr->ldy, pr->ldy, c0, c1);
}

void lora_apply_fused(const struct lora_plan *p, struct pool *pool, uint32_t layer,
                      const struct lora_proj *pr, size_t n_proj, float *tmp)
{
    if (p->n_segs == 0 || n_proj == 0)
        return;
    struct fused_job j = {p, layer, pr, n_proj, tmp, 0};
    j.n_blk = (p->max_rank + SHRINK_KB - 1) / SHRINK_KB;
    size_t n_a = n_proj * p->n_segs * j.n_blk;
    if (pool)
        pool_run(pool, fused_a, &j, n_a);
    else
        for (size_t i = 0; i < n_a; i++)
            fused_a(&j, i, 0);
    /* pool_run returned: every T is complete and visible (its completion is acq/rel) */
    size_t max_out = 0;
    for (size_t i = 0; i < n_proj; i++)
        for (size_t si = 0; si < p->n_segs; si++) {
            size_t o = p->segs[si].ad->out[pr[i].t];
            max_out = o > max_out ? o : max_out;
        }
    j.n_blk = (max_out + EXPAND_JB - 1) / EXPAND_JB;
    size_t n_b = n_proj * p->n_segs * j.n_blk;
    if (pool)
        pool_run(pool, fused_b, &j, n_b);
    else
        for (size_t i = 0; i < n_b; i++)
            fused_b(&j, i, 0);
}

/* ---- the serving path with the base product (lora_matmul_fused) ---- */

#define MM_TILE 512u   /* base rows (= expand columns) per task: whole 16-row GEMM panels and
                        * 32-column B panels (measured, int4, 8 streams: 256 cost +2-5% at
                        * rank 1 against pool_matmul's longer shards, 512 ~0%) */
#define MM_PREP_TOK 16u /* tokens per activation-preparing task */
#define MM_LAG 2u      /* an expand task follows its base tile by this many base tasks (2 to 6
                        * measured alike, session 6) */
#define MM_MAX_PROJ 4u
#ifndef MM_PREFETCH
#define MM_PREFETCH 1  /* update tasks request their whole weight blocks first */
#endif

enum { TK_PREP, TK_SHRINK, TK_BASE, TK_EXPAND };

struct mm_task {
    uint32_t kind, proj; /* proj: the activation index for TK_PREP */
    uint32_t a, b;       /* PREP: tokens [a, b); SHRINK: segment a, rank rows from b;
                          * BASE, EXPAND: tile a */
};

struct mm_job {
    const struct lora_plan *p;
    uint32_t layer;
    const struct lora_proj *pr;
    const struct lora_base_mat *base;
    float *tmp; /* [n_proj][p->tmp_floats] */
    const struct mm_task *tasks;
    struct kern_act act[MM_MAX_PROJ];
    size_t act_of[MM_MAX_PROJ];       /* projection -> its prepared input */
    bool act_bytes[MM_MAX_PROJ];      /* the activation has something to prepare */
    size_t tile0[MM_MAX_PROJ];        /* the projection's first tile in tile_done */
    size_t prep_total[MM_MAX_PROJ], shrink_total[MM_MAX_PROJ];
    atomic_size_t prep_done[MM_MAX_PROJ], shrink_done[MM_MAX_PROJ];
    atomic_uint *tile_done;           /* [sum of the projections' tiles] */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* Spins until *v >= want. What it waits for precedes the waiting task in the task order, so a
 * running participant is finishing it; yield now and then in case that one was preempted. */
static void wait_at_least(atomic_size_t *v, size_t want)
{
    for (unsigned i = 1; atomic_load_explicit(v, memory_order_acquire) < want; i++) {
        cpu_relax();
        if ((i & 1023) == 0)
            sched_yield();
    }
}

static void wait_flag(atomic_uint *v)
{
    for (unsigned i = 1; !atomic_load_explicit(v, memory_order_acquire); i++) {
        cpu_relax();
        if ((i & 1023) == 0)
            sched_yield();
    }
}

/* Requests [p, p + bytes) into L2 at once. An update task's weights are a few contiguous
 * blocks of 8-90 KB read once: asking for all of them up front keeps many misses in flight,
 * where the kernels' own loads (and the short streams the hardware prefetcher sees) wait for
 * them a few at a time (measured: the expand kernel's time was mostly its first loads). */
static inline void prefetch_l2(const void *p, size_t bytes)
{
#if defined(__x86_64__)
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63);
    for (const char *e = (const char *)p + bytes; c < e; c += 64)
        _mm_prefetch(c, _MM_HINT_T1);
#else
    (void)p;
    (void)bytes;
#endif
}

static void mm_task_run(void *ctx, size_t task, int thread)
{
    (void)thread;
    struct mm_job *j = ctx;
    const struct mm_task *tk = &j->tasks[task];
    const struct lora_plan *p = j->p;
    switch (tk->kind) {
    case TK_PREP:
        kern_act_prepare(&j->act[tk->proj], tk->a, tk->b);
        atomic_fetch_add_explicit(&j->prep_done[tk->proj], 1, memory_order_release);
        break;
    case TK_SHRINK: {
        const struct lora_seg *s = &p->segs[tk->a];
        const struct lora_proj *pr = &j->pr[tk->proj];
        const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
        size_t r = s->ad->cfg.rank, k0 = tk->b, in = s->ad->in[pr->t];
        size_t k1 = k0 + SHRINK_KB < r ? k0 + SHRINK_KB : r;
        if (MM_PREFETCH)
            prefetch_l2((const char *)w->fa + fa_offset(s->ad, pr->t, k0),
                        fa_offset(s->ad, pr->t, k1) - fa_offset(s->ad, pr->t, k0));
        kern_lora_shrink(s->ad->fast_dt, w->fa, in, r, pr->x + s->t0 * in, s->n,
                         j->tmp + tk->proj * p->tmp_floats + s->tmp0, k0, k1);
        atomic_fetch_add_explicit(&j->shrink_done[tk->proj], 1, memory_order_release);
        break;
    }
    case TK_BASE: {
        size_t ai = j->act_of[tk->proj];
        wait_at_least(&j->prep_done[ai], j->prep_total[ai]);
        const struct lora_proj *pr = &j->pr[tk->proj];
        size_t r0 = (size_t)tk->a * MM_TILE, rows = j->base[tk->proj].rows;
        size_t r1 = r0 + MM_TILE < rows ? r0 + MM_TILE : rows;
        if (j->base[tk->proj].panels) /* MM_TILE rows are whole panels: tiles start on one */
            kern_matmul_act_panels(j->base[tk->proj].wt, j->base[tk->proj].panels, &j->act[ai],
                                   pr->y, pr->ldy, r0, r1);
        else
            kern_matmul_act(j->base[tk->proj].w, &j->act[ai], pr->y, pr->ldy, r0, r1);
        atomic_store_explicit(&j->tile_done[j->tile0[tk->proj] + tk->a], 1,
                              memory_order_release);
        break;
    }
    case TK_EXPAND: {
        wait_at_least(&j->shrink_done[tk->proj], j->shrink_total[tk->proj]);
        wait_flag(&j->tile_done[j->tile0[tk->proj] + tk->a]);
        const struct lora_proj *pr = &j->pr[tk->proj];
        size_t c0 = (size_t)tk->a * MM_TILE, out = j->base[tk->proj].rows;
        size_t c1 = c0 + MM_TILE < out ? c0 + MM_TILE : out;
        if (MM_PREFETCH)
            for (size_t si = 0; si < p->n_segs; si++) {
                const struct lora_seg *s = &p->segs[si];
                const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
                if (w) /* the tile's panels, from c0 (a multiple of 32) */
                    prefetch_l2((const char *)w->fbt + fbt_offset(s->ad, c0),
                                fbt_offset(s->ad, c1) - fbt_offset(s->ad, c0));
            }
        for (size_t si = 0; si < p->n_segs; si++) {
            const struct lora_seg *s = &p->segs[si];
            const struct lora_weights *w = lora_weights(s->ad, j->layer, pr->t);
            if (!w)
                continue;
            kern_lora_expand(s->ad->fast_dt, w->fbt, s->ad->cfg.rank,
                             j->tmp + tk->proj * p->tmp_floats + s->tmp0, s->n,
                             p->scale + s->t0, 0.0f, pr->y + s->t0 * pr->ldy, pr->ldy, c0, c1);
        }
        break;
    }
    default:
        CHECK(0);
    }
}

void lora_ws_fini(struct lora_ws *ws)
{
    free(ws->buf);
    free(ws->tasks);
    memset(ws, 0, sizeof *ws);
}

/* Grows a scratch array to `bytes` (64-byte aligned); false when out of memory. */
static bool ws_grow(void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return true;
    bytes = (bytes + 63) / 64 * 64;
    void *nb = aligned_alloc(64, bytes);
    if (!nb)
        return false;
    free(*buf);
    *buf = nb;
    *cap = bytes;
    return true;
}

int lora_matmul_fused(const struct lora_plan *p, struct pool *pool, uint32_t layer,
                      const struct lora_proj *pr, const struct lora_base_mat *base,
                      size_t n_proj, float *tmp, struct lora_ws *ws)
{
    CHECK(n_proj >= 1 && n_proj <= MM_MAX_PROJ);
    const size_t n = p->n_tok;
    if (n == 0)
        return 0;
    struct mm_job job;
    memset(&job, 0, sizeof job);
    job.p = p;
    job.layer = layer;
    job.pr = pr;
    job.base = base;
    job.tmp = tmp;

    /* inputs: projections sharing x and weight dtype share one prepared copy (q, k, v) */
    size_t n_act = 0, act_off[MM_MAX_PROJ], act_total = 0;
    for (size_t i = 0; i < n_proj; i++) {
        size_t a = 0;
        for (; a < n_act; a++) {
            size_t o = 0;
            for (; o < n_proj && job.act_of[o] != a; o++)
                ;
            if (pr[o].x == pr[i].x && base[o].wt == base[i].wt && base[o].cols == base[i].cols)
                break;
        }
        job.act_of[i] = a;
        if (a < n_act)
            continue;
        size_t bytes;
        CHECK(kern_act_bytes(base[i].wt, base[i].cols, n, &bytes) == 0);
        act_off[n_act] = act_total;
        job.act_bytes[n_act] = bytes > 0;
        act_total += (bytes + 63) / 64 * 64;
        n_act++;
    }
    /* the task list: counts first */
    size_t n_tiles = 0, n_shrink = 0, n_prep = 0;
    for (size_t a = 0; a < n_act; a++)
        n_prep += job.act_bytes[a] ? (n + MM_PREP_TOK - 1) / MM_PREP_TOK : 0;
    for (size_t i = 0; i < n_proj; i++) {
        job.tile0[i] = n_tiles;
        n_tiles += (base[i].rows + MM_TILE - 1) / MM_TILE;
        for (size_t si = 0; si < p->n_segs; si++)
            if (lora_weights(p->segs[si].ad, layer, pr[i].t))
                n_shrink += (p->segs[si].ad->cfg.rank + SHRINK_KB - 1) / SHRINK_KB;
    }
    /* base only (no segment): no expand tasks */
    size_t n_expand = p->n_segs ? n_tiles : 0;
    size_t n_tasks = n_prep + n_shrink + n_tiles + n_expand;
    size_t task_bytes = n_tasks * sizeof(struct mm_task);
    size_t flag_off = (task_bytes + 63) / 64 * 64;
    if (!ws_grow(&ws->buf, &ws->cap, act_total ? act_total : 64) ||
        !ws_grow(&ws->tasks, &ws->task_cap, flag_off + n_tiles * sizeof(atomic_uint)))
        return -ENOMEM;
    struct mm_task *tasks = ws->tasks;
    job.tasks = tasks;
    job.tile_done = (atomic_uint *)((unsigned char *)ws->tasks + flag_off);
    for (size_t i = 0; i < n_tiles; i++)
        atomic_init(&job.tile_done[i], 0);
    for (size_t a = 0; a < n_act; a++) {
        size_t o = 0;
        for (; job.act_of[o] != a; o++)
            ;
        kern_act_init(&job.act[a], base[o].wt, pr[o].x, base[o].cols, n,
                      (unsigned char *)ws->buf + act_off[a]);
        atomic_init(&job.prep_done[a], 0);
    }

    /* order: preparation first; then base tiles with the update's tasks spread evenly among
     * them by cost (shrink before expand; an expand MM_LAG base tasks after its tile), so
     * that the participants mostly run one of each kind at a time */
    size_t nt = 0;
    for (size_t a = 0; a < n_act; a++) {
        if (!job.act_bytes[a])
            continue;
        for (size_t t0 = 0; t0 < n; t0 += MM_PREP_TOK) {
            tasks[nt++] = (struct mm_task){TK_PREP, (uint32_t)a, (uint32_t)t0,
                                           (uint32_t)(t0 + MM_PREP_TOK < n ? t0 + MM_PREP_TOK : n)};
            job.prep_total[a]++;
        }
    }
    double base_cost = 0, upd_cost = 0; /* weight elements; adapter bytes */
    for (size_t i = 0; i < n_proj; i++) {
        base_cost += (double)base[i].rows * (double)base[i].cols;
        for (size_t si = 0; si < p->n_segs; si++) {
            const struct lora_adapter *ad = p->segs[si].ad;
            if (lora_weights(ad, layer, pr[i].t))
                upd_cost += (double)ad->cfg.rank * (ad->in[pr[i].t] + ad->out[pr[i].t]) *
                            fast_elem_bytes(ad);
        }
    }
    /* the update's tasks in order: every shrink (projection, segment, rank block), then every
     * expand (projection, tile) */
    size_t n_upd = n_shrink + n_expand, ui = 0, bi = 0;
    double base_done = 0, upd_done = 0;
    size_t sh_p = 0, sh_s = 0, sh_k = 0; /* shrink cursor */
    size_t ex_p = 0, ex_t = 0;           /* expand cursor */
    size_t base_p = 0, base_t = 0;       /* base cursor */
    while (bi < n_tiles || ui < n_upd) {
        /* one base task */
        if (bi < n_tiles) {
            tasks[nt++] = (struct mm_task){TK_BASE, (uint32_t)base_p, (uint32_t)base_t, 0};
            base_done += (double)MM_TILE * (double)base[base_p].cols;
            bi++;
            if (++base_t * MM_TILE >= base[base_p].rows) {
                base_p++;
                base_t = 0;
            }
        }
        /* then update tasks while they are behind the base in proportion */
        while (ui < n_upd && (bi == n_tiles || upd_done * base_cost <= base_done * upd_cost)) {
            if (ui < n_shrink) {
                /* next (projection, segment) that the adapter adapts */
                for (;;) {
                    const struct lora_adapter *ad = p->segs[sh_s].ad;
                    if (lora_weights(ad, layer, pr[sh_p].t) && sh_k < ad->cfg.rank)
                        break;
                    sh_k = 0;
                    if (++sh_s == p->n_segs) {
                        sh_s = 0;
                        sh_p++;
                    }
                }
                const struct lora_adapter *ad = p->segs[sh_s].ad;
                tasks[nt++] = (struct mm_task){TK_SHRINK, (uint32_t)sh_p, (uint32_t)sh_s,
                                               (uint32_t)sh_k};
                job.shrink_total[sh_p]++;
                upd_done += (double)SHRINK_KB * ad->in[pr[sh_p].t] * fast_elem_bytes(ad);
                sh_k += SHRINK_KB;
            } else {
                /* its base tile must be MM_LAG base tasks back (or every base task out) */
                size_t need = job.tile0[ex_p] + ex_t + MM_LAG;
                if (bi < n_tiles && bi < need)
                    break;
                tasks[nt++] = (struct mm_task){TK_EXPAND, (uint32_t)ex_p, (uint32_t)ex_t, 0};
                for (size_t si = 0; si < p->n_segs; si++) {
                    const struct lora_adapter *ad = p->segs[si].ad;
                    if (lora_weights(ad, layer, pr[ex_p].t))
                        upd_done += (double)MM_TILE * ad->cfg.rank * fast_elem_bytes(ad);
                }
                if (++ex_t * MM_TILE >= base[ex_p].rows) {
                    ex_p++;
                    ex_t = 0;
                }
            }
            ui++;
        }
    }
    CHECK(nt == n_tasks);
    for (size_t i = 0; i < n_proj; i++)
        atomic_init(&job.shrink_done[i], 0);
    if (pool)
        pool_run(pool, mm_task_run, &job, n_tasks);
    else
        for (size_t i = 0; i < n_tasks; i++)
            mm_task_run(&job, i, 0);
    return 0;
}
