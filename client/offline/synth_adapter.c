/*
 * synth_adapter.c — deterministic random PEFT LoRA adapters for an IEBIN base (see
 * synth_adapter.h for the magnitudes and the file layout).
 *
 * Tensors are declared to the safetensors writer first and then streamed one by one from a
 * single row buffer, so memory stays at one tensor whatever the model's size.
 */
#include "synth_adapter.h"

#include "afile.h"
#include "err.h"
#include "half.h"
#include "kern.h"
#include "log.h"
#include "lora.h"
#include "path.h"
#include "rng.h"
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* IEBIN tensor (after "blk.N.") of each target, for the base weights' size. */
static const char *const base_names[LORA_TARGET_COUNT] = {
    [LORA_Q] = IEBIN_T_ATTN_Q,     [LORA_K] = IEBIN_T_ATTN_K,   [LORA_V] = IEBIN_T_ATTN_V,
    [LORA_O] = IEBIN_T_ATTN_O,     [LORA_GATE] = IEBIN_T_FFN_GATE, [LORA_UP] = IEBIN_T_FFN_UP,
    [LORA_DOWN] = IEBIN_T_FFN_DOWN,
};
static const char *const parents[LORA_TARGET_COUNT] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp",
};

/* Root mean square of a base tensor's elements (any dtype). */
static int tensor_rms(const struct iebin_tensor *t, float *row, double *out)
{
    uint64_t rows = t->shape[0], cols = t->shape[1], rb;
    if (dtype_row_bytes(t->dtype, cols, &rb) != 0) { /* iebin_open validated it */
        LOG_ERR("tensor '%s': rows of %llu elements do not fit its dtype", t->name,
                (unsigned long long)cols);
        return ERR_FORMAT;
    }
    double ss = 0.0;
    for (uint64_t r = 0; r < rows; r++) {
        kern_row_to_f32(t->dtype, (const char *)t->data + r * rb, row, (size_t)cols);
        for (uint64_t c = 0; c < cols; c++)
            ss += (double)row[c] * row[c];
    }
    *out = sqrt(ss / ((double)rows * (double)cols));
    return 0;
}

static enum safetensors_dtype st_dtype(enum dtype dt)
{
    return dt == DT_F16 ? SAFETENSORS_F16 : dt == DT_BF16 ? SAFETENSORS_BF16 : SAFETENSORS_F32;
}

static int write_config(const char *out_dir, const struct iebin_model *base,
                        const struct synth_adapter_opts *o)
{
    int rc = -ENOMEM;
    char *text = NULL, *path = NULL;
    struct afile af = {.fd = -1};
    json_t *root = json_object(), *mods = json_array();
    if (!root || !mods)
        goto oom;
    for (int t = 0; t < LORA_TARGET_COUNT; t++)
        if (o->target_mask >> t & 1u)
            json_array_append_new(mods, json_string(lora_target_name((enum lora_target)t)));
    double a = (double)o->alpha;
    json_t *alpha = a == floor(a) && fabs(a) < 1e15 ? json_integer((json_int_t)a) : json_real(a);
    json_object_set_new(root, "peft_type", json_string("LORA"));
    json_object_set_new(root, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(root, "base_model_name_or_path",
                        json_string(base->name && *base->name ? base->name : base->dir));
    json_object_set_new(root, "r", json_integer(o->rank));
    json_object_set_new(root, "lora_alpha", alpha);
    json_object_set_new(root, "target_modules", mods);
    mods = NULL;
    json_object_set_new(root, "lora_dropout", json_real(0.0));
    json_object_set_new(root, "bias", json_string("none"));
    json_object_set_new(root, "fan_in_fan_out", json_false());
    json_object_set_new(root, "use_rslora", json_false());
    json_object_set_new(root, "use_dora", json_false());
    json_object_set_new(root, "modules_to_save", json_null());
    json_object_set_new(root, "layers_to_transform", json_null());
    json_object_set_new(root, "inference_mode", json_true());
    text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    size_t n = strlen(out_dir) + sizeof "/" LORA_CONFIG_FILE;
    path = malloc(n);
    if (!text || !path)
        goto oom;
    snprintf(path, n, "%s/%s", out_dir, LORA_CONFIG_FILE);
    if ((rc = afile_open(&af, path)) != 0 || (rc = afile_write(&af, text, strlen(text))) != 0 ||
        (rc = afile_write(&af, "\n", 1)) != 0 || (rc = afile_commit(&af)) != 0) {
        afile_abort(&af);
        goto out;
    }
    rc = 0;
    goto out;
oom:
    LOG_ERR("%s: out of memory writing %s", out_dir, LORA_CONFIG_FILE);
out:
    json_decref(mods);
    json_decref(root);
    free(text);
    free(path);
    return rc;
}

int synth_adapter_write(const struct iebin_model *base, const char *out_dir,
                        const struct synth_adapter_opts *o)
{
    const struct iebin_hparams *hp = &base->hp;
    if (o->rank < 1 || o->rank > LORA_MAX_RANK || !isfinite(o->alpha) || o->alpha == 0.0f ||
        o->target_mask == 0 || (o->target_mask >> LORA_TARGET_COUNT) != 0 ||
        (o->dtype != DT_F32 && o->dtype != DT_F16 && o->dtype != DT_BF16) ||
        !(o->strength >= 0.0f && o->strength < 1e6f)) {
        LOG_ERR("synth-adapter: invalid options (rank %u must be 1..%u, alpha finite and "
                "non-zero, at least one target, dtype f32/f16/bf16)",
                o->rank, LORA_MAX_RANK);
        return ERR_USAGE;
    }
    int rc;
    char *cfg_path = NULL, *st_path = NULL;
    float *buf = NULL;
    void *out_buf = NULL;
    struct safetensors_writer *w = NULL;
    size_t n = strlen(out_dir) + 64;
    cfg_path = malloc(n);
    st_path = malloc(n);
    size_t max_elems = 0;
    for (int t = 0; t < LORA_TARGET_COUNT; t++) {
        uint32_t in, out;
        lora_target_dims(hp, (enum lora_target)t, &in, &out);
        size_t m = (size_t)o->rank * (in > out ? in : out);
        max_elems = m > max_elems ? m : max_elems;
        max_elems = in > max_elems ? in : max_elems;
    }
    buf = malloc(max_elems * sizeof(float));
    out_buf = malloc(max_elems * sizeof(float));
    if (!cfg_path || !st_path || !buf || !out_buf) {
        LOG_ERR("%s: out of memory", out_dir);
        rc = -ENOMEM;
        goto out;
    }
    snprintf(cfg_path, n, "%s/%s", out_dir, LORA_CONFIG_FILE);
    snprintf(st_path, n, "%s/%s", out_dir, LORA_WEIGHTS_FILE);
    if ((rc = path_mkdir_p(out_dir)) != 0)
        goto out;
    /* a configuration left from an earlier adapter must not pair with the new weights */
    if (unlink(cfg_path) != 0 && errno != ENOENT) {
        rc = -errno;
        LOG_ERR("cannot remove %s: %s", cfg_path, strerror(errno));
        goto out;
    }
    if ((rc = safetensors_writer_create(st_path, &w)) != 0 ||
        (rc = safetensors_writer_metadata(w, "format", "pt")) != 0)
        goto out;

    const float s = o->alpha / (float)o->rank; /* what the loader will use (no rsLoRA) */
    const float strength = o->strength > 0.0f ? o->strength : SYNTH_ADAPTER_STRENGTH;
    const size_t esz = o->dtype == DT_F32 ? 4 : 2;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && (rc = safetensors_writer_stream_begin(w)) != 0)
            goto out;
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            for (int t = 0; t < LORA_TARGET_COUNT; t++) {
                if (!(o->target_mask >> t & 1u))
                    continue;
                uint32_t in, out;
                lora_target_dims(hp, (enum lora_target)t, &in, &out);
                double w_rms = 0.0;
                if (pass == 1) {
                    char bn[64];
                    snprintf(bn, sizeof bn, "blk.%u.%s", l, base_names[t]);
                    const struct iebin_tensor *bt = iebin_find(base, bn);
                    if (!bt) { /* iebin_open guarantees every layer tensor: impossible */
                        LOG_ERR("%s: base tensor '%s' is missing", base->dir, bn);
                        rc = ERR_NOT_FOUND;
                        goto out;
                    }
                    if ((rc = tensor_rms(bt, buf, &w_rms)) != 0)
                        goto out;
                }
                for (int ab = 0; ab < 2; ab++) {
                    char name[160];
                    snprintf(name, sizeof name,
                             "base_model.model.model.layers.%u.%s.%s.lora_%c.weight", l,
                             parents[t], lora_target_name((enum lora_target)t), ab ? 'B' : 'A');
                    uint64_t shape[2] = {ab ? out : o->rank, ab ? o->rank : in};
                    size_t count = (size_t)shape[0] * shape[1];
                    if (pass == 0) {
                        rc = safetensors_writer_add(w, name, st_dtype(o->dtype), shape, 2, NULL,
                                                    count * esz);
                        if (rc != 0)
                            goto out;
                        continue;
                    }
                    double sd = ab ? strength * w_rms * sqrt((double)in) /
                                         (fabs((double)s) * sqrt((double)o->rank))
                                   : 1.0 / sqrt((double)in);
                    float amp = (float)(sd * sqrt(3.0)); /* U(-1,1) has std 1/sqrt(3) */
                    uint64_t st = o->seed ^ (0x5851f42d4c957f2du *
                                             (1u + ((uint64_t)l << 8) + (uint64_t)t * 2u +
                                              (uint64_t)ab));
                    rng_splitmix64(&st);
                    for (size_t i = 0; i < count; i++)
                        buf[i] = amp * rng_signed_f32(rng_splitmix64(&st));
                    if (o->dtype == DT_F32) {
                        memcpy(out_buf, buf, count * 4);
                    } else {
                        uint16_t *h = out_buf;
                        for (size_t i = 0; i < count; i++)
                            h[i] = o->dtype == DT_F16 ? half_f32_to_f16(buf[i])
                                                      : half_f32_to_bf16(buf[i]);
                    }
                    if ((rc = safetensors_writer_stream_write(w, out_buf, count * esz)) != 0)
                        goto out;
                }
            }
        }
    }
    rc = safetensors_writer_finish(w);
    w = NULL;
    if (rc != 0)
        goto out;
    rc = write_config(out_dir, base, o);
out:
    if (w)
        safetensors_writer_abort(w);
    free(out_buf);
    free(buf);
    free(st_path);
    free(cfg_path);
    return rc;
}
