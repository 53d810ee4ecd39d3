/*
 * lora_config.c — the PEFT side of an adapter: which projections it may target (lora.h's
 * enum lora_target, their PEFT module names and shapes) and adapter_config.json, parsed and
 * validated with jansson (duplicates rejected; the accepted subset in docs/LORA.md).
 */
#include "lora.h"
#include "jfield.h"

#include "check.h"
#include "err.h"
#include "log.h"
#include "lora_internal.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct lora__target_info lora__targets[LORA_TARGET_COUNT] = {
    [LORA_Q] = {"q_proj", "self_attn"},  [LORA_K] = {"k_proj", "self_attn"},
    [LORA_V] = {"v_proj", "self_attn"},  [LORA_O] = {"o_proj", "self_attn"},
    [LORA_GATE] = {"gate_proj", "mlp"},  [LORA_UP] = {"up_proj", "mlp"},
    [LORA_DOWN] = {"down_proj", "mlp"},
};

#define ALL_TARGETS ((1u << LORA_TARGET_COUNT) - 1u)

const char *lora_target_name(enum lora_target t)
{
    return (unsigned)t < LORA_TARGET_COUNT ? lora__targets[t].module : "?";
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

int lora__target_from_module(const char *s, size_t n)
{
    for (int t = 0; t < LORA_TARGET_COUNT; t++)
        if (strlen(lora__targets[t].module) == n && memcmp(s, lora__targets[t].module, n) == 0)
            return t;
    return -1;
}

/* ---- adapter_config.json ---- */


/* An optional boolean that must be false (or null) for Clocher to apply the adapter exactly. */
static int refuse_true(const char *what, const json_t *root, const char *key, const char *why)
{
    char d[48];
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_false(v))
        return 0;
    if (!json_is_true(v)) {
        LOG_ERR("%s: %s is %s, not a boolean", what, key, jfield_desc(v, d, sizeof d));
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
    LOG_ERR("%s: %s is %s: not supported (%s)", what, key, jfield_desc(v, d, sizeof d), why);
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
                what, jfield_desc(v, d, sizeof d));
        return ERR_UNSUPPORTED;
    }
    if (!json_is_array(v)) {
        LOG_ERR("%s: target_modules is %s, not a list of module names", what,
                jfield_desc(v, d, sizeof d));
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
                    jfield_desc(e, d, sizeof d));
            return ERR_FORMAT;
        }
        int t = lora__target_from_module(json_string_value(e), json_string_length(e));
        if (t < 0) {
            LOG_ERR("%s: target_modules[%zu] %s is not a supported target (known: q_proj, "
                    "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                    what, i, jfield_desc(e, d, sizeof d));
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
        LOG_ERR("%s: %s is %s, not an integer layer index", what, field, jfield_desc(v, d, sizeof d));
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
                what, json_is_array(v) ? "an empty list" : jfield_desc(v, d, sizeof d));
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
                jfield_desc(root, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }

    const json_t *v = json_object_get(root, "peft_type");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) {
            LOG_ERR("%s: peft_type is %s, not a string", what, jfield_desc(v, d, sizeof d));
            rc = ERR_FORMAT;
            goto out;
        }
        if (strcmp(json_string_value(v), "LORA") != 0) {
            LOG_ERR("%s: peft_type %s is not supported (only \"LORA\")", what,
                    jfield_desc(v, d, sizeof d));
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
        LOG_ERR("%s: r is %s, not an integer", what, jfield_desc(v, d, sizeof d));
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
        LOG_ERR("%s: lora_alpha is %s, not a number", what, jfield_desc(v, d, sizeof d));
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
            LOG_ERR("%s: bias is %s, not a string", what, jfield_desc(v, d, sizeof d));
            rc = ERR_FORMAT;
            goto out;
        }
        if (strcmp(json_string_value(v), "none") != 0) {
            LOG_ERR("%s: bias is %s: not supported (only \"none\": bias terms are not applied)",
                    what, jfield_desc(v, d, sizeof d));
            rc = ERR_UNSUPPORTED;
            goto out;
        }
    }

    v = json_object_get(root, "use_rslora");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        LOG_ERR("%s: use_rslora is %s, not a boolean", what, jfield_desc(v, d, sizeof d));
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
