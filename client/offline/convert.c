/*
 * convert.c — llama2.c / Hugging Face / GGUF → IEBIN (see convert.h).
 *
 * Every source is reduced to the same loop: for each IEBIN tensor of the llama architecture,
 * find the source tensor, check its shape, and stream its rows through a dtype conversion
 * (and, for HF q/k, a row permutation) into the IEBIN writer.
 */
#include "convert.h"

#include "err.h"
#include "gguf.h"
#include "iebin.h"
#include "kern.h"
#include "llama2c.h"
#include "log.h"
#include "safetensors.h"
#include "tok.h"

#include "half.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One source tensor as the converter sees it: rows of a dtype, row-major, outermost first. */
struct src_tensor {
    enum dtype dtype;
    int n_dims;
    uint64_t shape[4];
    const uint8_t *data;
};

/* The state of one conversion: progress, and whether a failure was the output's. */
struct progress {
    bool on;
    size_t done, total;
    double mb;
    void (*fn)(void *arg, size_t done, size_t total);
    void *arg;
    bool out_failed; /* set where a write to OUT_DIR fails (convert_model's *fault) */
};

/* rc of a call that writes OUT_DIR: a failure there is the output's, not the source's. */
static int out_rc(struct progress *pg, int rc)
{
    if (rc)
        pg->out_failed = true;
    return rc;
}

static void progress_tick(struct progress *p, const char *name, uint64_t bytes)
{
    p->done++;
    p->mb += (double)bytes / 1e6;
    if (p->on) {
        fprintf(stderr, "\rconverting: %zu/%zu tensors, %.0f MB  %-32.32s", p->done, p->total,
                p->mb, name);
        if (p->done == p->total)
            fputc('\n', stderr);
        fflush(stderr);
    }
    if (p->fn)
        p->fn(p->arg, p->done, p->total);
}

/*
 * Round-to-nearest block quantization with one f16 scale per 32 elements, GGML's Q8_0/Q4_0
 * layouts (common/dtype.h):
 *   q8_0: d = max|x| / 127, q = round(x / d) in [-127, 127];
 *   q4_0: d = m / -8 where m is the element of largest magnitude (sign kept), so m maps
 *         exactly to the code 0 and the range [-8, 7] is used asymmetrically, q = round(x/d)+8.
 * The scale is rounded to f16 before the codes are computed from it.
 */
static int quantize_row(enum dtype to, const float *x, void *dst, size_t n)
{
    uint8_t *b = dst;
    for (size_t i = 0; i < n; i += 32) {
        const float *v = x + i;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (!isfinite(v[j])) {
                LOG_ERR("cannot quantize a non-finite value (%g)", (double)v[j]);
                return ERR_RANGE;
            }
            if (fabsf(v[j]) > amax) {
                amax = fabsf(v[j]);
                m = v[j];
            }
        }
        if (to == DT_Q8_0) {
            uint16_t d16 = half_f32_to_f16(amax / 127.0f);
            float d = half_f16_to_f32(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(b, &d16, 2);
            int8_t *q = (int8_t *)(b + 2);
            for (int j = 0; j < 32; j++) {
                float r = roundf(v[j] * id);
                q[j] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
            }
            b += 34;
        } else {
            uint16_t d16 = half_f32_to_f16(m / -8.0f);
            float d = half_f16_to_f32(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(b, &d16, 2);
            uint8_t *q = b + 2;
            for (int j = 0; j < 16; j++) {
                float r0 = roundf(v[j] * id) + 8.0f, r1 = roundf(v[j + 16] * id) + 8.0f;
                uint8_t c0 = (uint8_t)(r0 < 0.0f ? 0 : r0 > 15.0f ? 15 : r0);
                uint8_t c1 = (uint8_t)(r1 < 0.0f ? 0 : r1 > 15.0f ? 15 : r1);
                q[j] = (uint8_t)(c0 | (c1 << 4));
            }
            b += 18;
        }
    }
    return 0;
}

/* Converts one row of n elements between dtypes. Targets: same dtype, a float or a block type. */
static int convert_row(enum dtype from, const void *src, enum dtype to, void *dst, float *tmp,
                       size_t n, bool search)
{
    if (from == to) {
        uint64_t rb;
        dtype_row_bytes(from, n, &rb);
        memcpy(dst, src, rb);
        return 0;
    }
    kern_row_to_f32(from, src, tmp, n);
    if (search && (to == DT_Q4_0 || dtype_is_q4g(to)))
        return kern_quantize_row_q4_search(to, tmp, dst, n); /* --rounding search */
    switch (to) {
    case DT_F32:
        memcpy(dst, tmp, n * sizeof(float));
        return 0;
    case DT_F16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) {
            if (isfinite(tmp[i]) && fabsf(tmp[i]) > 65504.0f) {
                LOG_ERR("value %g does not fit in f16", (double)tmp[i]);
                return ERR_RANGE;
            }
            h[i] = half_f32_to_f16(tmp[i]);
        }
        return 0;
    }
    case DT_BF16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++)
            h[i] = half_f32_to_bf16(tmp[i]);
        return 0;
    }
    case DT_Q8_0:
    case DT_Q4_0:
        return quantize_row(to, tmp, dst, n);
    case DT_Q4_G64:
    case DT_Q4_G128:
    case DT_Q4Z_G32:
    case DT_Q4Z_G64:
    case DT_Q4Z_G128:
        /* the int4 group types: round to nearest per group (kern.h states the rule) */
        return kern_quantize_row_q4g(to, tmp, dst, n);
    default:
        LOG_ERR("conversion to %s is not supported here",
                dtype_info(to)->name);
        return ERR_UNSUPPORTED;
    }
}

/*
 * Writes one IEBIN tensor from a source tensor. perm_heads > 0 applies the HF rotate-half →
 * interleaved row permutation within heads of head_dim rows: destination row h*hd + 2i + s
 * comes from source row h*hd + s*hd/2 + i.
 */
static int emit(struct iebin_writer *w, const char *what, const char *name,
                const struct src_tensor *st, const uint64_t *want, int want_dims, enum dtype to,
                uint32_t perm_heads, uint32_t head_dim, bool search, struct progress *pg)
{
    if (st->n_dims != want_dims || memcmp(st->shape, want, sizeof(uint64_t) * (size_t)want_dims)) {
        char got[96] = "", exp[96] = "";
        for (int i = 0; i < st->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)st->shape[i]);
        for (int i = 0; i < want_dims; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%llu", i ? ", " : "",
                     (unsigned long long)want[i]);
        LOG_ERR("%s: tensor for '%s' has shape [%s], expected [%s]", what, name, got, exp);
        return ERR_MISMATCH;
    }
    uint64_t cols = want[want_dims - 1], rows = 1;
    for (int i = 0; i < want_dims - 1; i++)
        rows *= want[i];
    uint64_t src_rb, dst_rb;
    if (dtype_row_bytes(st->dtype, cols, &src_rb) || dtype_row_bytes(to, cols, &dst_rb)) {
        LOG_ERR("%s: tensor for '%s': row of %llu elements is not whole blocks", what, name,
                (unsigned long long)cols);
        return ERR_FORMAT;
    }
    int rc = out_rc(pg, iebin_writer_begin(w, name, to, want, want_dims));
    if (rc)
        return rc;
    /* a chunk of rows at a time keeps writes large without holding the tensor */
    size_t chunk_rows = dst_rb >= (4u << 20) ? 1 : (size_t)((4u << 20) / dst_rb);
    uint8_t *buf = malloc(chunk_rows * dst_rb);
    float *tmp = malloc(cols * sizeof(float));
    if (!buf || !tmp) {
        LOG_ERR("out of memory converting '%s'", name);
        rc = -ENOMEM;
        goto out;
    }
    for (uint64_t r0 = 0; r0 < rows && rc == 0; r0 += chunk_rows) {
        uint64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        for (uint64_t j = 0; j < nr && rc == 0; j++) {
            uint64_t r = r0 + j, sr = r;
            if (perm_heads)
                sr = iebin_rope_hf_row(r, head_dim);
            rc = convert_row(st->dtype, st->data + sr * src_rb, to, buf + j * dst_rb, tmp, cols,
                             search);
        }
        if (rc == 0)
            rc = out_rc(pg, iebin_writer_write(w, buf, nr * dst_rb));
    }
    if (rc == 0)
        rc = out_rc(pg, iebin_writer_end(w));
    if (rc == 0)
        progress_tick(pg, name, rows * dst_rb);
out:
    free(buf);
    free(tmp);
    return rc;
}

/*
 * A block type needs rows of whole blocks (32, 64 or 128 elements). A matrix whose rows are
 * not (stories260K's ffn_down has 172 columns) keeps a float dtype instead — its source dtype
 * if that is a float, else f32 — as llama.cpp's quantizer does; said once per tensor at info
 * level.
 */
static enum dtype fallback_dtype(const char *name, enum dtype to, enum dtype from, uint64_t cols)
{
    uint64_t rb;
    if (dtype_row_bytes(to, cols, &rb) == 0)
        return to;
    enum dtype fb = (from == DT_F32 || from == DT_F16 || from == DT_BF16) ? from : DT_F32;
    LOG_INFO("%s: rows of %llu are not whole %s blocks; stored as %s", name,
             (unsigned long long)cols, dtype_info(to)->name, dtype_info(fb)->name);
    return fb;
}

/* ---- a generic walk over the llama tensors ---- */

/* Looks a tensor up in the source by its IEBIN name; layer < 0 for global tensors. */
typedef int lookup_fn(void *src, const char *iebin_kind, int layer, struct src_tensor *out);

static bool is_norm(const char *kind) { return strstr(kind, "norm") != NULL; }

static int walk(void *src, lookup_fn *lookup, const char *what, const struct iebin_hparams *hp,
                struct iebin_writer *w, const struct convert_opts *o, bool hf_rope,
                struct progress *pg)
{
    static const char *const kinds[] = {"attn_norm", "attn_q", "attn_k",  "attn_v",  "attn_o",
                                        "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    uint64_t q_rows = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t kv_rows = (uint64_t)hp->n_kv_heads * hp->head_dim;
    pg->total = 2 + (hp->tied_embeddings ? 0 : 1) + 9u * hp->n_layers;
    struct src_tensor st;
    int rc;
    char name[IEBIN_NAME_MAX];

#define EMIT(kind_, layer_, nd_, perm_, ...)                                                     \
    do {                                                                                         \
        uint64_t want_[] = {__VA_ARGS__};                                                        \
        if ((layer_) < 0)                                                                        \
            snprintf(name, sizeof name, "%s", kind_);                                            \
        else                                                                                     \
            snprintf(name, sizeof name, "blk.%d.%s", (layer_), kind_);                           \
        rc = lookup(src, kind_, (layer_), &st);                                                  \
        if (rc)                                                                                  \
            return rc;                                                                           \
        enum dtype to_ = is_norm(kind_) ? DT_F32 : (o->dtype_set ? o->dtype : st.dtype);         \
        if (o->embd_dtype_set && (!strcmp(kind_, "tok_embd") || !strcmp(kind_, "output")))     \
            to_ = o->embd_dtype;                                                                 \
        enum dtype qm_;                                                                          \
        if (o->manifest && !is_norm(kind_) && qm_match(o->manifest, name, &qm_) == 0)            \
            to_ = qm_;                                                                           \
        to_ = fallback_dtype(name, to_, st.dtype, want_[(nd_) - 1]);                             \
        rc = emit(w, what, name, &st, want_, (nd_), to_, (perm_), hp->head_dim,                 \
                  o->rounding_search, pg);                                                       \
        if (rc)                                                                                  \
            return rc;                                                                           \
    } while (0)

    EMIT("tok_embd", -1, 2, 0, hp->vocab_size, hp->dim);
    for (int l = 0; l < (int)hp->n_layers; l++) {
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            const char *kind = kinds[k];
            if (!strcmp(kind, "attn_norm") || !strcmp(kind, "ffn_norm"))
                EMIT(kind, l, 1, 0, hp->dim);
            else if (!strcmp(kind, "attn_q"))
                EMIT(kind, l, 2, hf_rope ? hp->n_heads : 0, q_rows, hp->dim);
            else if (!strcmp(kind, "attn_k"))
                EMIT(kind, l, 2, hf_rope ? hp->n_kv_heads : 0, kv_rows, hp->dim);
            else if (!strcmp(kind, "attn_v"))
                EMIT(kind, l, 2, 0, kv_rows, hp->dim);
            else if (!strcmp(kind, "attn_o"))
                EMIT(kind, l, 2, 0, hp->dim, q_rows);
            else if (!strcmp(kind, "ffn_down"))
                EMIT(kind, l, 2, 0, hp->dim, hp->ffn_dim);
            else
                EMIT(kind, l, 2, 0, hp->ffn_dim, hp->dim);
        }
    }
    EMIT("output_norm", -1, 1, 0, hp->dim);
    if (!hp->tied_embeddings)
        EMIT("output", -1, 2, 0, hp->vocab_size, hp->dim);
#undef EMIT
    return 0;
}

/* ---- tokenizer ---- */

/*
 * Loads any tokenizer tok_load knows and renders it as tokenizer.ie.json. A tokenizer with more
 * tokens than the model has embedding rows could emit ids the model cannot look up (the engine
 * refuses such a pair at load): refused here, before anything is written. Fewer is fine
 * (checkpoints pad their vocabulary to a multiple of 64 or so).
 */
static int tokenizer_json(const char *path, uint32_t vocab_size, char **json, size_t *len)
{
    struct tok *t;
    int rc = tok_load(path, &t);
    if (rc)
        return rc;
    if (tok_vocab_size(t) > vocab_size) {
        LOG_ERR("%s: the tokenizer has %u tokens, more than the model's vocab_size %u", path,
                tok_vocab_size(t), vocab_size);
        rc = ERR_MISMATCH;
    } else {
        rc = tok_save_json(t, json, len);
    }
    tok_free(t);
    return rc;
}

/*
 * The common tail of every streaming import: the tokenizer first (a bad one fails before
 * gigabytes are written), then the tensors, then the atomic commit. tok_path may be NULL.
 */
static int write_model(void *src, lookup_fn *lookup, const char *what, const char *out_dir,
                       const char *name, const struct iebin_hparams *hp, const char *tok_path,
                       const struct convert_opts *o, bool hf_rope, struct progress *pg)
{
    char *json = NULL;
    size_t len = 0;
    int rc = tok_path ? tokenizer_json(tok_path, hp->vocab_size, &json, &len) : 0;
    if (rc)
        return rc;
    struct iebin_writer *w;
    rc = out_rc(pg, iebin_writer_create(out_dir, "llama", name, hp, &w));
    if (rc == 0) {
        if ((rc = walk(src, lookup, what, hp, w, o, hf_rope, pg)) == 0 && json)
            rc = out_rc(pg, iebin_writer_set_tokenizer(w, json, len));
        if (rc)
            iebin_writer_abort(w);
        else
            rc = out_rc(pg, iebin_writer_finish(w));
    }
    free(json);
    return rc;
}

static const char *base_name(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *b = strrchr(buf, '/');
    return b ? b + 1 : buf;
}

/* ---- Hugging Face ---- */

struct hf_src {
    struct safetensors_set *set;
    const char *dir;
};

static int hf_lookup(void *p, const char *kind, int layer, struct src_tensor *out)
{
    struct hf_src *s = p;
    static const struct {
        const char *kind, *hf;
    } map[] = {{"tok_embd", "model.embed_tokens.weight"},
               {"output_norm", "model.norm.weight"},
               {"output", "lm_head.weight"},
               {"attn_norm", "input_layernorm.weight"},
               {"attn_q", "self_attn.q_proj.weight"},
               {"attn_k", "self_attn.k_proj.weight"},
               {"attn_v", "self_attn.v_proj.weight"},
               {"attn_o", "self_attn.o_proj.weight"},
               {"ffn_norm", "post_attention_layernorm.weight"},
               {"ffn_gate", "mlp.gate_proj.weight"},
               {"ffn_up", "mlp.up_proj.weight"},
               {"ffn_down", "mlp.down_proj.weight"}};
    char name[160];
    const char *hf = NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].kind, kind))
            hf = map[i].hf;
    if (layer < 0)
        snprintf(name, sizeof name, "%s", hf);
    else
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, hf);
    const struct safetensors_tensor *t = safetensors_set_find(s->set, name);
    if (!t) {
        LOG_ERR("%s: tensor '%s' is missing from the safetensors files", s->dir, name);
        return ERR_NOT_FOUND;
    }
    if (safetensors_dtype_to_dtype(t->dtype, &out->dtype) != 0 ||
        (out->dtype != DT_F32 && out->dtype != DT_F16 && out->dtype != DT_BF16)) {
        LOG_ERR("%s: tensor '%s' has dtype %s; F32, F16 and BF16 are supported", s->dir, name,
                safetensors_dtype_name(t->dtype));
        return ERR_UNSUPPORTED;
    }
    if (t->n_dims < 1 || t->n_dims > 4) {
        LOG_ERR("%s: tensor '%s' has %d dimensions", s->dir, name, t->n_dims);
        return ERR_FORMAT;
    }
    out->n_dims = t->n_dims;
    memcpy(out->shape, t->shape, sizeof(uint64_t) * (size_t)t->n_dims);
    out->data = t->data;
    return 0;
}

/* A bias the config did not announce would be silently dropped: refuse any. */
static int hf_refuse_biases(const struct hf_src *s)
{
    for (size_t f = 0; f < s->set->n_files; f++) {
        const struct safetensors_file *sf = s->set->files[f];
        for (size_t i = 0; i < sf->n_tensors; i++) {
            const char *n = sf->tensors[i].name;
            size_t len = strlen(n);
            if (len >= 5 && !strcmp(n + len - 5, ".bias")) {
                LOG_ERR("%s: tensor '%s': biases are not supported", sf->path, n);
                return ERR_UNSUPPORTED;
            }
        }
    }
    return 0;
}

static int json_u32(json_t *cfg, const char *path, const char *key, uint32_t *out, bool required,
                    uint32_t dflt)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (!required) {
            *out = dflt;
            return 0;
        }
        LOG_ERR("%s: missing key '%s'", path, key);
        return ERR_FORMAT;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 0x7fffffff) {
        LOG_ERR("%s: '%s' must be a positive integer", path, key);
        return ERR_FORMAT;
    }
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int json_f32(json_t *cfg, const char *path, const char *key, float *out, float dflt)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v)) {
        LOG_ERR("%s: '%s' must be a number", path, key);
        return ERR_FORMAT;
    }
    *out = (float)json_number_value(v);
    return 0;
}

static int hf_hparams(const char *dir, struct iebin_hparams *hp, bool *tie_given)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        int e = errno;
        LOG_ERR("%s: %s", dir, strerror(e));
        return -e;
    }
    if (!S_ISDIR(sb.st_mode)) {
        LOG_ERR("%s: not a directory (a Hugging Face model is a directory with config.json)",
                dir);
        return ERR_UNSUPPORTED; /* an input problem (exit 3), unlike an output ENOTDIR */
    }
    if (access(path, R_OK) != 0) {
        int e = errno;
        LOG_ERR("cannot read %s: %s", path, strerror(e));
        return -e;
    }
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!cfg) {
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", path, je.line, je.column, je.text);
        return ERR_FORMAT;
    }
    int rc = ERR_FORMAT;
    if (!json_is_object(cfg)) {
        LOG_ERR("%s: not a JSON object", path);
        goto out;
    }
    json_t *mt = json_object_get(cfg, "model_type");
    if (!json_is_string(mt) || strcmp(json_string_value(mt), "llama") != 0) {
        LOG_ERR("%s: model_type %s is not supported (only \"llama\")", path,
                json_is_string(mt) ? json_string_value(mt) : "(missing)");
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    /* features the llama IEBIN architecture does not express: refused, never ignored */
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        LOG_ERR("%s: rope_scaling is not supported (IEBIN has plain RoPE only)", path);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof no_bias / sizeof no_bias[0]; i++) {
        if (json_is_true(json_object_get(cfg, no_bias[i]))) {
            LOG_ERR("%s: %s is true; biases are not supported", path, no_bias[i]);
            rc = ERR_UNSUPPORTED;
            goto out;
        }
    }
    json_t *act = json_object_get(cfg, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        LOG_ERR("%s: hidden_act %s is not supported (only \"silu\")", path,
                json_is_string(act) ? json_string_value(act) : "(not a string)");
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    memset(hp, 0, sizeof *hp);
    if ((rc = json_u32(cfg, path, "hidden_size", &hp->dim, true, 0)) ||
        (rc = json_u32(cfg, path, "intermediate_size", &hp->ffn_dim, true, 0)) ||
        (rc = json_u32(cfg, path, "num_hidden_layers", &hp->n_layers, true, 0)) ||
        (rc = json_u32(cfg, path, "num_attention_heads", &hp->n_heads, true, 0)) ||
        (rc = json_u32(cfg, path, "vocab_size", &hp->vocab_size, true, 0)) ||
        (rc = json_u32(cfg, path, "num_key_value_heads", &hp->n_kv_heads, false, hp->n_heads)) ||
        (rc = json_u32(cfg, path, "max_position_embeddings", &hp->max_seq_len, false, 2048)) ||
        (rc = json_f32(cfg, path, "rope_theta", &hp->rope_theta, 10000.0f)) ||
        (rc = json_f32(cfg, path, "rms_norm_eps", &hp->rms_eps, 1e-6f)))
        goto out;
    /* head_dim is explicit in newer configs (and may differ from hidden_size / heads) */
    if ((rc = json_u32(cfg, path, "head_dim", &hp->head_dim, false, 0)) != 0)
        goto out;
    if (!hp->head_dim) {
        if (hp->dim % hp->n_heads != 0) {
            LOG_ERR("%s: hidden_size %u is not a multiple of num_attention_heads %u", path,
                    hp->dim, hp->n_heads);
            rc = ERR_FORMAT;
            goto out;
        }
        hp->head_dim = hp->dim / hp->n_heads;
    }
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie)) {
        LOG_ERR("%s: 'tie_word_embeddings' must be true or false", path);
        rc = ERR_FORMAT;
        goto out;
    }
    hp->tied_embeddings = json_is_true(tie);
    *tie_given = tie && json_is_boolean(tie);
    rc = iebin_check_hparams(hp, path);
out:
    json_decref(cfg);
    return rc;
}

static int convert_hf(const char *dir, const char *out_dir, const struct convert_opts *o,
                      struct progress *pg)
{
    struct iebin_hparams hp;
    bool tie_given = false;
    int rc = hf_hparams(dir, &hp, &tie_given);
    if (rc)
        return rc;
    struct hf_src s = {.dir = dir};
    char p[4200], idx[4200], pt[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    snprintf(pt, sizeof pt, "%s/pytorch_model.bin", dir);
    if (access(p, F_OK) != 0 && access(idx, F_OK) != 0 && access(pt, F_OK) == 0) {
        LOG_ERR("%s: only PyTorch pickle weights (pytorch_model.bin); convert them to "
                "safetensors first", dir);
        return ERR_UNSUPPORTED;
    }
    rc = safetensors_set_open(dir, &s.set);
    if (rc)
        return rc;
    /* transformers' default is untied, but a config that does not say and has no lm_head
     * can only mean tied; an explicit false with no lm_head is a missing tensor (walk) */
    if (!tie_given && !safetensors_set_find(s.set, "lm_head.weight"))
        hp.tied_embeddings = true;
    if ((rc = hf_refuse_biases(&s)) != 0)
        goto out;
    const char *tok_path = o->tokenizer;
    char tp[4096];
    if (!tok_path) {
        snprintf(tp, sizeof tp, "%s/tokenizer.model", dir);
        if (access(tp, R_OK) != 0)
            snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
        if (access(tp, R_OK) == 0)
            tok_path = tp;
    }
    char nb[4096];
    rc = write_model(&s, hf_lookup, dir, out_dir, base_name(dir, nb, sizeof nb), &hp, tok_path, o,
                     true, pg);
out:
    safetensors_set_close(s.set);
    return rc;
}

/* ---- GGUF ---- */

struct gguf_src {
    struct gguf_file *f;
    const char *path;
};

static int gguf_lookup(void *p, const char *kind, int layer, struct src_tensor *out)
{
    struct gguf_src *s = p;
    static const struct {
        const char *kind, *g;
    } map[] = {{"tok_embd", "token_embd"},   {"output_norm", "output_norm"},
               {"output", "output"},         {"attn_norm", "attn_norm"},
               {"attn_q", "attn_q"},         {"attn_k", "attn_k"},
               {"attn_v", "attn_v"},         {"attn_o", "attn_output"},
               {"ffn_norm", "ffn_norm"},     {"ffn_gate", "ffn_gate"},
               {"ffn_up", "ffn_up"},         {"ffn_down", "ffn_down"}};
    const char *g = NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].kind, kind))
            g = map[i].g;
    char name[128];
    if (layer < 0)
        snprintf(name, sizeof name, "%s.weight", g);
    else
        snprintf(name, sizeof name, "blk.%d.%s.weight", layer, g);
    const struct gguf_tensor *t = gguf_find_tensor(s->f, name);
    if (!t) {
        LOG_ERR("%s: tensor '%s' is missing", s->path, name);
        return ERR_NOT_FOUND;
    }
    if (!t->data || gguf_ggml_type_to_dtype(t->type, &out->dtype) != 0) {
        LOG_ERR("%s: tensor '%s' has type %s; F32, F16, BF16, Q8_0 and Q4_0 are supported",
                s->path, name, gguf_ggml_type_name(t->type));
        return ERR_UNSUPPORTED;
    }
    out->n_dims = (int)t->n_dims;
    for (uint32_t i = 0; i < t->n_dims; i++) /* GGUF lists dimensions innermost first */
        out->shape[i] = t->ne[t->n_dims - 1 - i];
    out->data = t->data;
    return 0;
}

/* Optional keys: 0 with *present telling whether it is there; a mistyped value is the
 * getter's (logged) error rather than a silent default. */
static int opt_u32(struct gguf_file *f, const char *key, uint32_t *v, bool *present)
{
    int rc = gguf_get_u32(f, key, v);
    *present = rc == 0;
    return rc == ERR_NOT_FOUND ? 0 : rc;
}

static int opt_f64(struct gguf_file *f, const char *key, double *v, bool *present)
{
    int rc = gguf_get_f64(f, key, v);
    *present = rc == 0;
    return rc == ERR_NOT_FOUND ? 0 : rc;
}

static int gguf_hparams(struct gguf_file *f, const char *path, struct iebin_hparams *hp)
{
    struct gguf_str arch = {0, NULL};
    if (gguf_get_str(f, "general.architecture", &arch) != 0 || !gguf_str_eq(arch, "llama")) {
        LOG_ERR("%s: general.architecture is %.*s; only \"llama\" is supported", path,
                arch.ptr ? (int)(arch.len > 64 ? 64 : arch.len) : 9,
                arch.ptr ? arch.ptr : "(missing)");
        return ERR_UNSUPPORTED;
    }
    memset(hp, 0, sizeof *hp);
    static const struct {
        const char *key;
        size_t off;
        bool required;
    } keys[] = {
        {"llama.embedding_length", offsetof(struct iebin_hparams, dim), true},
        {"llama.feed_forward_length", offsetof(struct iebin_hparams, ffn_dim), true},
        {"llama.block_count", offsetof(struct iebin_hparams, n_layers), true},
        {"llama.attention.head_count", offsetof(struct iebin_hparams, n_heads), true},
        {"llama.attention.head_count_kv", offsetof(struct iebin_hparams, n_kv_heads), false},
        {"llama.context_length", offsetof(struct iebin_hparams, max_seq_len), false},
    };
    bool has;
    int rc;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if ((rc = opt_u32(f, keys[i].key, (uint32_t *)((char *)hp + keys[i].off), &has)) != 0)
            return rc;
        if (!has && keys[i].required) {
            LOG_ERR("%s: key %s is missing", path, keys[i].key);
            return ERR_FORMAT;
        }
    }
    if (!hp->n_kv_heads)
        hp->n_kv_heads = hp->n_heads;
    if (!hp->max_seq_len)
        hp->max_seq_len = 2048;
    double d;
    if ((rc = opt_f64(f, "llama.rope.freq_base", &d, &has)) != 0)
        return rc;
    hp->rope_theta = has ? (float)d : 10000.0f;
    if ((rc = opt_f64(f, "llama.attention.layer_norm_rms_epsilon", &d, &has)) != 0)
        return rc;
    hp->rms_eps = has ? (float)d : 1e-5f;

    /* Mixture-of-experts models (Mixtral) also call themselves "llama" */
    uint32_t u;
    if ((rc = opt_u32(f, "llama.expert_count", &u, &has)) != 0)
        return rc;
    if (has && u > 0) {
        LOG_ERR("%s: llama.expert_count is %u; mixture-of-experts models are not supported",
                path, u);
        return ERR_UNSUPPORTED;
    }
    struct gguf_str st;
    rc = gguf_get_str(f, "llama.rope.scaling.type", &st);
    if (rc != 0 && rc != ERR_NOT_FOUND)
        return rc;
    if (rc == 0 && !gguf_str_eq(st, "none")) {
        LOG_ERR("%s: llama.rope.scaling.type is %.*s; only plain RoPE is supported", path,
                (int)(st.len > 32 ? 32 : st.len), st.ptr);
        return ERR_UNSUPPORTED;
    }
    if ((rc = opt_f64(f, "llama.rope.scale_linear", &d, &has)) != 0)
        return rc;
    if (has && d != 1.0) {
        LOG_ERR("%s: llama.rope.scale_linear is %g; only plain RoPE is supported", path, d);
        return ERR_UNSUPPORTED;
    }
    /* head_dim: attention.key_length when present (it may differ from dim / heads) */
    if ((rc = opt_u32(f, "llama.attention.key_length", &hp->head_dim, &has)) != 0)
        return rc;
    if (!has)
        hp->head_dim = hp->n_heads && hp->dim % hp->n_heads == 0 ? hp->dim / hp->n_heads : 0;
    static const char *const same_as_head_dim[] = {"llama.attention.value_length",
                                                   "llama.rope.dimension_count"};
    for (size_t i = 0; i < 2; i++) {
        if ((rc = opt_u32(f, same_as_head_dim[i], &u, &has)) != 0)
            return rc;
        if (has && u != hp->head_dim) {
            LOG_ERR("%s: %s is %u, not the head dimension %u (partial RoPE and unequal "
                    "key/value heads are not supported)", path, same_as_head_dim[i], u,
                    hp->head_dim);
            return ERR_UNSUPPORTED;
        }
    }

    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2) {
        LOG_ERR("%s: tensor 'token_embd.weight' is missing or not 2-D", path);
        return ERR_FORMAT;
    }
    if (emb->ne[1] > UINT32_MAX) {
        LOG_ERR("%s: vocabulary of %llu tokens is too large", path, (unsigned long long)emb->ne[1]);
        return ERR_RANGE;
    }
    hp->vocab_size = (uint32_t)emb->ne[1];
    if ((rc = opt_u32(f, "llama.vocab_size", &u, &has)) != 0)
        return rc;
    if (has && u != hp->vocab_size) {
        LOG_ERR("%s: llama.vocab_size %u does not match token_embd.weight's %u rows", path, u,
                hp->vocab_size);
        return ERR_MISMATCH;
    }
    hp->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    return iebin_check_hparams(hp, path);
}

static int convert_gguf(const char *path, const char *out_dir, const struct convert_opts *o,
                        struct progress *pg)
{
    struct gguf_src s = {.path = path};
    int rc = gguf_open(path, &s.f);
    if (rc)
        return rc;
    struct iebin_hparams hp;
    rc = gguf_hparams(s.f, path, &hp);
    if (rc == 0) {
        const char *tok_path = o->tokenizer;
        if (!tok_path && gguf_find_kv(s.f, "tokenizer.ggml.model"))
            tok_path = path;
        char nb[4096];
        rc = write_model(&s, gguf_lookup, path, out_dir, base_name(path, nb, sizeof nb), &hp,
                         tok_path, o, false, pg);
    }
    gguf_close(s.f);
    return rc;
}

/* ---- IEBIN (re-quantization of an existing model) ---- */

static int iebin_lookup(void *p, const char *kind, int layer, struct src_tensor *out)
{
    const struct iebin_model *m = p;
    char name[IEBIN_NAME_MAX];
    if (layer < 0)
        snprintf(name, sizeof name, "%s", kind);
    else
        snprintf(name, sizeof name, "blk.%d.%s", layer, kind);
    const struct iebin_tensor *t = iebin_find(m, name);
    if (!t) {
        LOG_ERR("%s: tensor '%s' is missing", m->dir, name);
        return ERR_NOT_FOUND;
    }
    out->dtype = t->dtype;
    out->n_dims = t->n_dims;
    memcpy(out->shape, t->shape, sizeof(uint64_t) * (size_t)t->n_dims);
    out->data = t->data;
    return 0;
}

static int convert_iebin(const char *dir, const char *out_dir, const struct convert_opts *o,
                         struct progress *pg)
{
    struct iebin_model *m;
    int rc = iebin_open_ex(dir, IEBIN_OPEN_LAZY, &m);
    if (rc)
        return rc;
    const char *tok_path = o->tokenizer ? o->tokenizer : m->tokenizer_path;
    char nb[4096];
    rc = write_model(m, iebin_lookup, dir, out_dir,
                     m->name && *m->name ? m->name : base_name(dir, nb, sizeof nb), &m->hp,
                     tok_path, o, false, pg);
    iebin_close(m);
    return rc;
}

/* ---- llama2.c ---- */

/* Removes a directory this process created and the files in it. */
static void remove_scratch(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4400];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

/*
 * The llama2.c importer (client/llama2c.h) validates the checkpoint against its exact size,
 * then writes float tensors; every failure after that validation is the output's. Block
 * dtypes go through an f32 import in a scratch directory of our own beside OUT_DIR (same
 * file system, never a name the user could own), re-quantized by the IEBIN path.
 */
static int convert_llama2c(const char *path, const char *out_dir, const struct convert_opts *o,
                           struct progress *pg)
{
    char *json = NULL;
    size_t len = 0;
    struct iebin_hparams hp;
    int rc = llama2c_read_hparams(path, &hp);
    if (rc)
        return rc;
    if (o->tokenizer && (rc = tokenizer_json(o->tokenizer, hp.vocab_size, &json, &len)) != 0)
        return rc;
    enum dtype dt = o->dtype_set ? o->dtype : DT_F32;
    /* block types, per-tensor dtypes and the embedding's own dtype go through the general
     * walk: import as f32 first, then convert that IEBIN like any other source */
    if (dt == DT_Q8_0 || dt == DT_Q4_0 || dtype_is_q4g(dt) || o->manifest ||
        o->embd_dtype_set) {
        char tmp[4096];
        char *slash;
        snprintf(tmp, sizeof tmp, "%s", out_dir);
        while ((slash = strrchr(tmp, '/')) != NULL && slash[1] == '\0' && slash != tmp)
            *slash = '\0';
        if (strlen(tmp) + sizeof ".import.XXXXXX" > sizeof tmp) {
            LOG_ERR("%s: path too long", out_dir);
            free(json);
            return out_rc(pg, -ENAMETOOLONG);
        }
        strcat(tmp, ".import.XXXXXX");
        if (!mkdtemp(tmp)) {
            rc = -errno;
            LOG_ERR("cannot create a scratch directory %s: %s", tmp, strerror(errno));
            free(json);
            return out_rc(pg, rc);
        }
        rc = out_rc(pg, llama2c_convert(path, json, len, tmp, DT_F32, NULL));
        if (rc == 0) {
            struct convert_opts o2 = *o;
            o2.tokenizer = NULL;
            rc = convert_iebin(tmp, out_dir, &o2, pg);
        }
        remove_scratch(tmp);
        free(json);
        return rc;
    }
    rc = out_rc(pg, llama2c_convert(path, json, len, out_dir, dt, NULL));
    free(json);
    return rc;
}

int convert_detect(const char *src, enum convert_from *out)
{
    struct stat st;
    if (stat(src, &st) != 0) {
        LOG_ERR("%s: %s", src, strerror(errno));
        return -errno;
    }
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/config.json", src);
        if (access(p, R_OK) == 0) {
            *out = CONVERT_HF;
            return 0;
        }
        snprintf(p, sizeof p, "%s/" IEBIN_MANIFEST, src);
        if (access(p, R_OK) == 0) {
            *out = CONVERT_IEBIN;
            return 0;
        }
        LOG_ERR("%s: a directory without config.json or " IEBIN_MANIFEST " is not a model", src);
        return ERR_UNSUPPORTED;
    }
    FILE *f = fopen(src, "rb");
    char magic[4] = {0};
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f)
        fclose(f);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) {
        *out = CONVERT_GGUF;
        return 0;
    }
    struct iebin_hparams hp;
    log_clear_error();
    if (llama2c_read_hparams(src, &hp) == 0) {
        *out = CONVERT_LLAMA2C;
        return 0;
    }
    LOG_ERR("%s: not a Hugging Face directory, a GGUF file or a valid llama2.c checkpoint "
            "(llama2.c: %s)",
            src, log_last_error());
    return ERR_UNSUPPORTED;
}

static int run(const char *src, const char *out_dir, const struct convert_opts *o,
               struct progress *pg)
{
    if (o->dtype_set && o->dtype >= DT_COUNT_) {
        LOG_ERR("--dtype: unknown dtype");
        return ERR_USAGE;
    }
    int rc = kern_init();
    if (rc)
        return rc;
    enum convert_from from = o->from;
    if (from == CONVERT_AUTO && (rc = convert_detect(src, &from)) != 0)
        return rc;
    switch (from) {
    case CONVERT_HF:
        return convert_hf(src, out_dir, o, pg);
    case CONVERT_GGUF:
        return convert_gguf(src, out_dir, o, pg);
    case CONVERT_LLAMA2C:
        return convert_llama2c(src, out_dir, o, pg);
    case CONVERT_IEBIN:
        return convert_iebin(src, out_dir, o, pg);
    default:
        return ERR_USAGE;
    }
}

int convert_model(const char *src, const char *out_dir, const struct convert_opts *o,
                  enum convert_fault *fault)
{
    struct progress pg = {.on = o->progress, .fn = o->on_tensor, .arg = o->on_tensor_arg};
    int rc = run(src, out_dir, o, &pg);
    /* a rule that matched nothing is almost always a typo in its pattern */
    for (size_t i = 0; rc == 0 && i < qm_rule_count(o->manifest); i++)
        if (qm_rule_hits(o->manifest, i) == 0)
            LOG_WARN("quant manifest: rules[%zu] (pattern '%s') matched no tensor", i,
                     qm_rule_pattern(o->manifest, i));
    if (fault)
        *fault = rc == 0 ? CONVERT_FAULT_NONE
                 : pg.out_failed ? CONVERT_FAULT_OUTPUT
                 : CONVERT_FAULT_SOURCE;
    return rc;
}
