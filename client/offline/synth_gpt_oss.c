/*
 * synth_gpt_oss.c — random-weight gpt-oss models (synth.h presets gpt-oss-20b and gpt-oss-tiny)
 * in the release's Hugging Face layout (config.json as ../shared/specs/gpt-oss.md §1a, sharded
 * safetensors with model.safetensors.index.json, MXFP4 experts as U8 `*_blocks`/`*_scales`, the
 * rest in the chosen float dtype, BF16 by default) and, with --gguf, in llama.cpp's layout
 * (§3.3: MXFP4 type 39 with the scale first and split-half nibbles, gate/up split, 1-D tensors
 * F32).
 *
 * Every row of every tensor is drawn from its own splitmix64 stream seeded by (seed, tensor,
 * row), so the GGUF writer can take the even or odd rows of gate_up_proj without generating the
 * rest, and both files hold the same numbers: converting either gives the same IEBIN, bit for
 * bit. Memory is one chunk of rows (about 1 MB) whatever the preset: the 20b preset's 13 GB
 * stream through.
 *
 * Values: matrices uniform with std 0.02 (HF's init), biases and sinks likewise (HF inits them
 * to 0; non-zero here so that a test sees a dropped bias), norm gains 1 ± 0.1. Experts: random
 * E2M1 nibbles (std 2.93 for uniform codes) with E8M0 scales drawn per block around
 * 127 + round(log2(1 / (2.93 sqrt(fan_in)))) — [c-1, c+1] for gate_up, [c-2, c] for down — so
 * pre-activations and expert outputs stay O(1) (spec §4.6: at the 20b shapes c = 120, i.e.
 * [119, 121] and [118, 120]).
 */
#include "synth.h"

#include "afile.h"
#include "err.h"
#include "gguf.h"
#include "half.h"
#include "log.h"
#include "mxfp4_hf.h"
#include "path.h"
#include "rng.h"
#include "safetensors.h"
#include "tok.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum gkind {
    G_MAT,   /* a matrix: uniform, std 0.02 */
    G_NORM,  /* a norm gain: 1 ± 0.1 */
    G_VEC,   /* a bias or the sinks: uniform, std 0.02; [n] or [E][n] */
    G_MXFP4, /* experts: HF blocks + scales, logical shape [E][rows][cols] */
};

/* One Hugging Face tensor (an MXFP4 one is two safetensors entries). */
struct gt {
    char hf[128]; /* MXFP4: the base, "_blocks" / "_scales" appended */
    enum gkind kind;
    int n_dims;
    uint64_t shape[3];
    int down; /* MXFP4: the down projection (its scale range is one lower) */
};

static uint64_t gt_cols(const struct gt *t) { return t->shape[t->n_dims - 1]; }

static uint64_t gt_rows(const struct gt *t)
{
    uint64_t r = 1;
    for (int i = 0; i < t->n_dims - 1; i++)
        r *= t->shape[i];
    return r;
}

/* The stream of row `row` of tensor `idx`; part tells the blocks (0) from the scales (1). */
static uint64_t row_state(uint64_t seed, uint32_t idx, uint64_t row, uint32_t part)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)idx << 40) ^ (row * 0xd1b54a32d192ed03ull) ^
                 ((uint64_t)part << 62);
    rng_splitmix64(&s); /* decorrelate neighbouring seeds */
    return s;
}

/* Row `row` of a float tensor as f32 values already rounded to dt (so f32 copies agree). */
static void float_row(uint64_t seed, uint32_t idx, const struct gt *t, uint64_t row,
                      enum dtype dt, float *out)
{
    uint64_t s = row_state(seed, idx, row, 0), n = gt_cols(t);
    const float a = 0.02f * 1.7320508f; /* uniform [-a, a] has std 0.02 */
    for (uint64_t i = 0; i < n; i++) {
        float r = rng_signed_f32(rng_splitmix64(&s));
        float x = t->kind == G_NORM ? 1.0f + 0.1f * r : a * r;
        if (dt == DT_BF16)
            x = half_bf16_to_f32(half_f32_to_bf16(x));
        else if (dt == DT_F16)
            x = half_f16_to_f32(half_f32_to_f16(x));
        out[i] = x;
    }
}

static void store_row(const float *x, uint64_t n, enum dtype dt, void *dst)
{
    if (dt == DT_F32) {
        memcpy(dst, x, n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    for (uint64_t i = 0; i < n; i++)
        h[i] = dt == DT_BF16 ? half_f32_to_bf16(x[i]) : half_f32_to_f16(x[i]);
}

/* The E8M0 range of an expert tensor with rows of fan_in inputs (see the file comment). */
static void scale_range(uint64_t fan_in, int down, unsigned *lo, unsigned *hi)
{
    long c = 127 + lround(log2(1.0 / (2.93 * sqrt((double)fan_in))));
    long l = down ? c - 2 : c - 1, h = down ? c : c + 1;
    *lo = (unsigned)(l < 1 ? 1 : l);
    *hi = (unsigned)(h > 254 ? 254 : h < (long)*lo ? (long)*lo : h);
}

/* Row `row` ([E][rows] flattened) of an MXFP4 tensor: HF blocks [nb][16] and scales [nb]. */
static void mx_row(uint64_t seed, uint32_t idx, const struct gt *t, uint64_t row,
                   uint8_t *blocks, uint8_t *scales)
{
    uint64_t nb = gt_cols(t) / 32;
    uint64_t s = row_state(seed, idx, row, 0);
    for (uint64_t i = 0; i < nb * 16; i += 8) {
        uint64_t r = rng_splitmix64(&s);
        memcpy(blocks + i, &r, 8);
    }
    unsigned lo, hi;
    scale_range(gt_cols(t), t->down, &lo, &hi);
    s = row_state(seed, idx, row, 1);
    for (uint64_t b = 0; b < nb; b++)
        scales[b] = (uint8_t)(lo + rng_splitmix64(&s) % (hi - lo + 1));
}

/* ---- the tensor list (HF names, HF order) ---- */

static size_t tensor_list(const struct iebin_hparams *hp, struct gt **out)
{
    size_t cap = 3 + 20 * (size_t)hp->n_layers;
    struct gt *t = calloc(cap, sizeof *t);
    if (!t)
        return 0;
    size_t k = 0;
    uint64_t q = (uint64_t)hp->n_heads * hp->head_dim, kv = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t d = hp->dim, f = hp->ffn_dim, e = hp->n_experts;
#define T(kind_, nd_, a_, b_, c_, ...)                                                          \
    do {                                                                                       \
        snprintf(t[k].hf, sizeof t[k].hf, __VA_ARGS__);                                        \
        t[k].kind = kind_, t[k].n_dims = nd_;                                                  \
        t[k].shape[0] = a_, t[k].shape[1] = b_, t[k].shape[2] = c_;                            \
        k++;                                                                                   \
    } while (0)
    T(G_MAT, 2, hp->vocab_size, d, 0, "model.embed_tokens.weight");
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define P "model.layers.%u."
        T(G_NORM, 1, d, 0, 0, P "input_layernorm.weight", l);
        T(G_MAT, 2, q, d, 0, P "self_attn.q_proj.weight", l);       /* [q][dim] */
        T(G_VEC, 1, q, 0, 0, P "self_attn.q_proj.bias", l);         /* [q] */
        T(G_MAT, 2, kv, d, 0, P "self_attn.k_proj.weight", l);      /* [kv][dim] */
        T(G_VEC, 1, kv, 0, 0, P "self_attn.k_proj.bias", l);        /* [kv] */
        T(G_MAT, 2, kv, d, 0, P "self_attn.v_proj.weight", l);      /* [kv][dim] */
        T(G_VEC, 1, kv, 0, 0, P "self_attn.v_proj.bias", l);        /* [kv] */
        T(G_MAT, 2, d, q, 0, P "self_attn.o_proj.weight", l);       /* [dim][q] */
        T(G_VEC, 1, d, 0, 0, P "self_attn.o_proj.bias", l);         /* [dim] */
        T(G_VEC, 1, hp->n_heads, 0, 0, P "self_attn.sinks", l);     /* [n_heads] */
        T(G_NORM, 1, d, 0, 0, P "post_attention_layernorm.weight", l);
        T(G_MAT, 2, e, d, 0, P "mlp.router.weight", l);             /* [E][dim] */
        T(G_VEC, 1, e, 0, 0, P "mlp.router.bias", l);               /* [E] */
        T(G_MXFP4, 3, e, 2 * f, d, P "mlp.experts.gate_up_proj", l); /* [E][2F][dim] */
        T(G_VEC, 2, e, 2 * f, 0, P "mlp.experts.gate_up_proj_bias", l); /* [E][2F] */
        T(G_MXFP4, 3, e, d, f, P "mlp.experts.down_proj", l);       /* [E][dim][F] */
        t[k - 1].down = 1;
        T(G_VEC, 2, e, d, 0, P "mlp.experts.down_proj_bias", l);    /* [E][dim] */
#undef P
    }
    T(G_NORM, 1, d, 0, 0, "model.norm.weight");
    T(G_MAT, 2, hp->vocab_size, d, 0, "lm_head.weight");
#undef T
    *out = t;
    return k;
}

/* Bytes of t in the safetensors files (both parts for MXFP4). */
static uint64_t hf_bytes(const struct gt *t, size_t es)
{
    if (t->kind == G_MXFP4)
        return gt_rows(t) * (gt_cols(t) / 32) * 17;
    return gt_rows(t) * gt_cols(t) * es;
}

/* ---- Hugging Face layout ---- */

/* Streams rows [0, rows) of part (0 blocks / values, 1 scales) of t into the writer. */
static int hf_stream(struct safetensors_writer *w, uint64_t seed, uint32_t idx,
                     const struct gt *t, int part, enum dtype dt, size_t es)
{
    uint64_t cols = gt_cols(t), rows = gt_rows(t), nb = cols / 32;
    uint64_t rb = t->kind != G_MXFP4 ? cols * es : part == 0 ? nb * 16 : nb;
    uint64_t per = rb >= (1u << 20) ? 1 : (1u << 20) / rb;
    uint8_t *buf = malloc(per * rb), *other = t->kind == G_MXFP4 ? malloc(nb * 16) : NULL;
    float *x = t->kind != G_MXFP4 ? malloc(cols * sizeof *x) : NULL;
    int rc = 0;
    if (!buf || (t->kind == G_MXFP4 ? !other : !x)) {
        LOG_ERR("synth: out of memory");
        rc = -ENOMEM;
    }
    for (uint64_t r0 = 0; r0 < rows && rc == 0; r0 += per) {
        uint64_t n = rows - r0 < per ? rows - r0 : per;
        for (uint64_t j = 0; j < n; j++) {
            uint8_t *d = buf + j * rb;
            if (t->kind == G_MXFP4) {
                if (part == 0)
                    mx_row(seed, idx, t, r0 + j, d, other);
                else
                    mx_row(seed, idx, t, r0 + j, other, d);
            } else {
                float_row(seed, idx, t, r0 + j, dt, x);
                store_row(x, cols, dt, d);
            }
        }
        rc = safetensors_writer_stream_write(w, buf, (size_t)(n * rb));
    }
    free(buf);
    free(other);
    free(x);
    return rc;
}

static void shard_name(char *buf, size_t cap, unsigned k, unsigned n)
{
    snprintf(buf, cap, "model-%05u-of-%05u.safetensors", k + 1, n);
}

/* The shards (tensors cut into n runs of about equal bytes) and the index naming them. */
static int write_hf(const char *dir, const struct gt *t, size_t nt, unsigned n_shards,
                    uint64_t seed, enum dtype dt)
{
    size_t es = dt == DT_F32 ? 4 : 2;
    enum safetensors_dtype sdt = dt == DT_F32   ? SAFETENSORS_F32
                                 : dt == DT_F16 ? SAFETENSORS_F16
                                                : SAFETENSORS_BF16;
    uint64_t total = 0;
    for (size_t i = 0; i < nt; i++)
        total += hf_bytes(&t[i], es);
    json_t *map = json_object();
    int rc = map ? 0 : -ENOMEM;
    uint64_t before = 0;
    size_t i = 0;
    char name[64], path[4200], tn[160];
    for (unsigned k = 0; k < n_shards && rc == 0; k++) {
        size_t first = i;
        uint64_t b0 = before;
        /* tensor i goes to shard floor(bytes before it * n / total) */
        while (i < nt && (k + 1 == n_shards || (before * n_shards) / total <= k))
            before += hf_bytes(&t[i++], es);
        shard_name(name, sizeof name, k, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct safetensors_writer *w;
        if ((rc = safetensors_writer_create(path, &w)) != 0)
            break;
        rc = safetensors_writer_metadata(w, "format", "pt");
        for (size_t j = first; j < i && rc == 0; j++) {
            const struct gt *g = &t[j];
            if (g->kind != G_MXFP4) {
                rc = safetensors_writer_add(w, g->hf, sdt, g->shape, g->n_dims, NULL,
                                            hf_bytes(g, es));
                if (rc == 0)
                    rc = json_object_set_new(map, g->hf, json_string(name)) ? -ENOMEM : 0;
                continue;
            }
            uint64_t nb = gt_cols(g) / 32;
            uint64_t bs[4] = {g->shape[0], g->shape[1], nb, 16};
            snprintf(tn, sizeof tn, "%s_blocks", g->hf);
            rc = safetensors_writer_add(w, tn, SAFETENSORS_U8, bs, 4, NULL, gt_rows(g) * nb * 16);
            if (rc == 0)
                rc = json_object_set_new(map, tn, json_string(name)) ? -ENOMEM : 0;
            snprintf(tn, sizeof tn, "%s_scales", g->hf);
            if (rc == 0)
                rc = safetensors_writer_add(w, tn, SAFETENSORS_U8, bs, 3, NULL, gt_rows(g) * nb);
            if (rc == 0)
                rc = json_object_set_new(map, tn, json_string(name)) ? -ENOMEM : 0;
        }
        if (rc == 0)
            rc = safetensors_writer_stream_begin(w);
        for (size_t j = first; j < i && rc == 0; j++) {
            rc = hf_stream(w, seed, (uint32_t)j, &t[j], 0, dt, es);
            if (rc == 0 && t[j].kind == G_MXFP4)
                rc = hf_stream(w, seed, (uint32_t)j, &t[j], 1, dt, es);
        }
        if (rc) {
            safetensors_writer_abort(w);
            break;
        }
        if ((rc = safetensors_writer_finish(w)) != 0)
            break;
        LOG_INFO("synth: %s (%.1f MB)", path, (double)(before - b0) / 1e6);
    }
    if (rc == 0) {
        json_t *idx = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                                "weight_map", map);
        char *text = idx ? json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(idx);
        struct afile af;
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!text)
            rc = -ENOMEM;
        else if ((rc = afile_open(&af, path)) == 0) {
            if ((rc = afile_write(&af, text, strlen(text))) == 0)
                rc = afile_commit(&af);
            else
                afile_abort(&af);
        }
        free(text);
    }
    json_decref(map);
    if (rc == -ENOMEM)
        LOG_ERR("synth: out of memory");
    return rc;
}

/* config.json as the release's (spec §1a), with this preset's numbers. */
static int write_config(const char *dir, const struct iebin_hparams *hp, enum dtype dt)
{
    char path[4200];
    size_t cap = 4096 + 32 * (size_t)hp->n_layers, n = 0;
    char *b = malloc(cap);
    if (!b)
        return -ENOMEM;
#define A(...) (n += (size_t)snprintf(b + n, cap - n, __VA_ARGS__))
    A("{\n  \"architectures\": [\n    \"GptOssForCausalLM\"\n  ],\n");
    A("  \"attention_bias\": true,\n  \"attention_dropout\": 0.0,\n");
    if (hp->vocab_size > 200002)
        A("  \"eos_token_id\": 200002,\n");
    A("  \"experts_per_token\": %u,\n  \"head_dim\": %u,\n  \"hidden_act\": \"silu\",\n",
      hp->n_experts_used, hp->head_dim);
    A("  \"hidden_size\": %u,\n  \"initial_context_length\": %u,\n", hp->dim,
      hp->rope_scaling.original_max_position_embeddings);
    A("  \"initializer_range\": 0.02,\n  \"intermediate_size\": %u,\n  \"layer_types\": [\n",
      hp->ffn_dim);
    for (uint32_t l = 0; l < hp->n_layers; l++)
        A("    \"%s\"%s\n", iebin_layer_slides(hp, l) ? "sliding_attention" : "full_attention",
          l + 1 < hp->n_layers ? "," : "");
    A("  ],\n  \"max_position_embeddings\": %u,\n  \"model_type\": \"gpt_oss\",\n",
      hp->max_seq_len);
    A("  \"num_attention_heads\": %u,\n  \"num_experts_per_tok\": %u,\n", hp->n_heads,
      hp->n_experts_used);
    A("  \"num_hidden_layers\": %u,\n  \"num_key_value_heads\": %u,\n", hp->n_layers,
      hp->n_kv_heads);
    A("  \"num_local_experts\": %u,\n  \"output_router_logits\": false,\n", hp->n_experts);
    if (hp->vocab_size > 200002)
        A("  \"pad_token_id\": 199999,\n");
    A("  \"quantization_config\": {\n    \"modules_to_not_convert\": [\n"
      "      \"model.layers.*.self_attn\",\n      \"model.layers.*.mlp.router\",\n"
      "      \"model.embed_tokens\",\n      \"lm_head\"\n    ],\n"
      "    \"quant_method\": \"mxfp4\"\n  },\n");
    A("  \"rms_norm_eps\": %g,\n", (double)hp->rms_eps);
    const struct iebin_rope_scaling *rs = &hp->rope_scaling;
    A("  \"rope_scaling\": {\n    \"beta_fast\": %.1f,\n    \"beta_slow\": %.1f,\n"
      "    \"factor\": %.1f,\n    \"original_max_position_embeddings\": %u,\n"
      "    \"rope_type\": \"yarn\",\n    \"truncate\": %s\n  },\n",
      (double)rs->beta_fast, (double)rs->beta_slow, (double)rs->factor,
      rs->original_max_position_embeddings, rs->truncate ? "true" : "false");
    A("  \"rope_theta\": %.0f,\n  \"router_aux_loss_coef\": 0.9,\n", (double)hp->rope_theta);
    A("  \"sliding_window\": %u,\n  \"swiglu_limit\": %.1f,\n", hp->sliding_window,
      (double)hp->swiglu_limit);
    A("  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"%s\",\n",
      dt == DT_F32 ? "float32" : dt == DT_F16 ? "float16" : "bfloat16");
    A("  \"transformers_version\": \"4.55.0.dev0\",\n  \"use_cache\": true,\n");
    A("  \"vocab_size\": %u\n}\n", hp->vocab_size);
#undef A
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct afile af;
    int rc = afile_open(&af, path);
    if (rc == 0) {
        if ((rc = afile_write(&af, b, n)) == 0)
            rc = afile_commit(&af);
        else
            afile_abort(&af);
    }
    free(b);
    return rc;
}

/* ---- llama.cpp's GGUF layout ---- */

/* One GGUF tensor: which HF tensor it comes from and how (parity: 0 all rows, 1 even, 2 odd
 * rows of each expert's gate_up; for a bias, elements). */
struct gg {
    char name[64];
    uint32_t src;
    int parity;
    uint32_t type; /* ggml */
    uint32_t nd;
    uint64_t ne[3]; /* GGUF order, innermost first */
};

static int gguf_stream(struct gguf_writer *w, uint64_t seed, const struct gt *all,
                       const struct gg *g, enum dtype dt)
{
    const struct gt *t = &all[g->src];
    uint64_t cols = gt_cols(t), rows = gt_rows(t);
    int rc = 0;
    if (t->kind == G_MXFP4) {
        /* dst row (e, f) <- src row e*R + f (parity 0) or e*R + 2f + parity - 1 */
        uint64_t nb = cols / 32, r_src = t->shape[1], r_dst = g->parity ? r_src / 2 : r_src;
        uint8_t *bl = malloc(nb * 16), *sc = malloc(nb), *out = malloc(nb * 17);
        if (!bl || !sc || !out)
            rc = -ENOMEM;
        for (uint64_t r = 0; r < t->shape[0] * r_dst && rc == 0; r++) {
            uint64_t e = r / r_dst, f = r % r_dst;
            uint64_t sr = e * r_src + (g->parity ? 2 * f + (uint64_t)g->parity - 1 : f);
            mx_row(seed, g->src, t, sr, bl, sc);
            for (uint64_t b = 0; b < nb; b++)
                mxfp4_block_from_hf(bl + b * 16, sc[b], out + b * 17);
            rc = gguf_writer_stream_write(w, out, (size_t)(nb * 17));
        }
        free(bl);
        free(sc);
        free(out);
        return rc;
    }
    enum dtype wdt = g->type == GGUF_GGML_F32 ? DT_F32 : dt;
    size_t es = wdt == DT_F32 ? 4 : 2;
    float *x = malloc(cols * sizeof *x);
    uint8_t *o = malloc(cols * es);
    if (!x || !o)
        rc = -ENOMEM;
    for (uint64_t r = 0; r < rows && rc == 0; r++) {
        float_row(seed, g->src, t, r, dt, x);
        uint64_t n = cols;
        if (g->parity) { /* a gate_up bias row [2F]: its even or odd elements */
            n = cols / 2;
            for (uint64_t i = 0; i < n; i++)
                x[i] = x[2 * i + (uint64_t)g->parity - 1];
        }
        store_row(x, n, wdt, o);
        rc = gguf_writer_stream_write(w, o, (size_t)(n * es));
    }
    free(x);
    free(o);
    return rc;
}

static int write_gguf(const char *path, const struct iebin_hparams *hp, const struct gt *t,
                      size_t nt, uint64_t seed, enum dtype dt)
{
    uint32_t mt = dt == DT_F32 ? GGUF_GGML_F32 : dt == DT_F16 ? GGUF_GGML_F16 : GGUF_GGML_BF16;
    struct gg *g = calloc(nt + 2 * (size_t)hp->n_layers, sizeof *g);
    if (!g)
        return -ENOMEM;
    size_t n = 0;
    /* the HF list's order: per layer 17 tensors after the embedding (tensor_list) */
    for (size_t i = 0; i < nt; i++) {
        const struct gt *s = &t[i];
        int layer = -1;
        const char *rest = s->hf;
        if (!strncmp(s->hf, "model.layers.", 13)) {
            layer = atoi(s->hf + 13);
            rest = strchr(s->hf + 13, '.') + 1;
        }
        static const struct {
            const char *hf, *gg;
            int parity;
        } map[] = {
            {"model.embed_tokens.weight", "token_embd.weight", 0},
            {"model.norm.weight", "output_norm.weight", 0},
            {"lm_head.weight", "output.weight", 0},
            {"input_layernorm.weight", "attn_norm.weight", 0},
            {"self_attn.q_proj.weight", "attn_q.weight", 0},
            {"self_attn.q_proj.bias", "attn_q.bias", 0},
            {"self_attn.k_proj.weight", "attn_k.weight", 0},
            {"self_attn.k_proj.bias", "attn_k.bias", 0},
            {"self_attn.v_proj.weight", "attn_v.weight", 0},
            {"self_attn.v_proj.bias", "attn_v.bias", 0},
            {"self_attn.o_proj.weight", "attn_output.weight", 0},
            {"self_attn.o_proj.bias", "attn_output.bias", 0},
            {"self_attn.sinks", "attn_sinks.weight", 0},
            {"post_attention_layernorm.weight", "post_attention_norm.weight", 0},
            {"mlp.router.weight", "ffn_gate_inp.weight", 0},
            {"mlp.router.bias", "ffn_gate_inp.bias", 0},
            {"mlp.experts.gate_up_proj", "ffn_gate_exps.weight", 1},
            {"mlp.experts.gate_up_proj", "ffn_up_exps.weight", 2},
            {"mlp.experts.gate_up_proj_bias", "ffn_gate_exps.bias", 1},
            {"mlp.experts.gate_up_proj_bias", "ffn_up_exps.bias", 2},
            {"mlp.experts.down_proj", "ffn_down_exps.weight", 0},
            {"mlp.experts.down_proj_bias", "ffn_down_exps.bias", 0},
        };
        for (size_t m = 0; m < sizeof map / sizeof map[0]; m++) {
            if (strcmp(rest, map[m].hf) != 0)
                continue;
            struct gg *o = &g[n++];
            if (layer < 0)
                snprintf(o->name, sizeof o->name, "%s", map[m].gg);
            else
                snprintf(o->name, sizeof o->name, "blk.%d.%s", layer, map[m].gg);
            o->src = (uint32_t)i;
            o->parity = map[m].parity;
            o->nd = (uint32_t)s->n_dims;
            for (int d = 0; d < s->n_dims; d++)
                o->ne[d] = s->shape[s->n_dims - 1 - d];
            if (o->parity) /* gate_up's rows (blocks) or elements (bias) halve */
                o->ne[s->kind == G_MXFP4 ? 1 : 0] /= 2;
            o->type = s->kind == G_MXFP4 ? GGUF_GGML_MXFP4
                      : s->kind == G_MAT ? mt
                                         : GGUF_GGML_F32; /* norms, biases, sinks */
        }
    }
    struct gguf_writer *w;
    int rc = gguf_writer_create(path, &w);
    if (rc) {
        free(g);
        return rc;
    }
    const char *a = "gpt-oss";
    char k[96];
#define KEY(s_) (snprintf(k, sizeof k, "%s.%s", a, s_), k)
    const struct iebin_rope_scaling *rs = &hp->rope_scaling;
    if ((rc = gguf_writer_kv_str(w, "general.architecture", a)) ||
        (rc = gguf_writer_kv_str(w, "general.name", "clocher-synth")) ||
        (rc = gguf_writer_kv_u32(w, KEY("block_count"), hp->n_layers)) ||
        (rc = gguf_writer_kv_u32(w, KEY("context_length"), hp->max_seq_len)) ||
        (rc = gguf_writer_kv_u32(w, KEY("embedding_length"), hp->dim)) ||
        (rc = gguf_writer_kv_u32(w, KEY("feed_forward_length"), hp->ffn_dim)) ||
        (rc = gguf_writer_kv_u32(w, KEY("attention.head_count"), hp->n_heads)) ||
        (rc = gguf_writer_kv_u32(w, KEY("attention.head_count_kv"), hp->n_kv_heads)) ||
        (rc = gguf_writer_kv_f32(w, KEY("rope.freq_base"), hp->rope_theta)) ||
        (rc = gguf_writer_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps)) ||
        (rc = gguf_writer_kv_u32(w, KEY("expert_count"), hp->n_experts)) ||
        (rc = gguf_writer_kv_u32(w, KEY("expert_used_count"), hp->n_experts_used)) ||
        (rc = gguf_writer_kv_u32(w, KEY("attention.key_length"), hp->head_dim)) ||
        (rc = gguf_writer_kv_u32(w, KEY("attention.value_length"), hp->head_dim)) ||
        (rc = gguf_writer_kv_u32(w, KEY("attention.sliding_window"), hp->sliding_window)) ||
        (rc = gguf_writer_kv_u32(w, KEY("expert_feed_forward_length"), hp->ffn_dim)) ||
        (rc = gguf_writer_kv_str(w, KEY("rope.scaling.type"), "yarn")) ||
        (rc = gguf_writer_kv_f32(w, KEY("rope.scaling.factor"), rs->factor)) ||
        (rc = gguf_writer_kv_u32(w, KEY("rope.scaling.original_context_length"),
                                 rs->original_max_position_embeddings)) ||
        (rc = gguf_writer_kv_f32(w, KEY("rope.scaling.yarn_beta_fast"), rs->beta_fast)) ||
        (rc = gguf_writer_kv_f32(w, KEY("rope.scaling.yarn_beta_slow"), rs->beta_slow)))
        goto fail;
#undef KEY
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t bytes;
        uint64_t shape[3] = {0};
        for (uint32_t d = 0; d < g[i].nd; d++)
            shape[d] = g[i].ne[g[i].nd - 1 - d];
        enum dtype gdt;
        gguf_ggml_type_to_dtype(g[i].type, &gdt);
        dtype_tensor_bytes(gdt, shape, (int)g[i].nd, &bytes);
        rc = gguf_writer_add_tensor(w, g[i].name, g[i].type, g[i].ne, g[i].nd, NULL, bytes);
    }
    if (rc || (rc = gguf_writer_stream_begin(w)))
        goto fail;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = gguf_stream(w, seed, t, &g[i], dt);
    if (rc)
        goto fail;
    free(g);
    return gguf_writer_finish(w);
fail:
    free(g);
    gguf_writer_abort(w);
    return rc;
}

/* ---- the tokenizer ---- */

/* Copies the tokenizer file into dir under its own name (tokenizer.json for a .json, so the
 * converter finds it as in a real checkpoint). */
static int copy_tokenizer(const char *src, const char *dir)
{
    FILE *f = fopen(src, "rb");
    if (!f) {
        int e = errno;
        LOG_ERR("%s: %s", src, strerror(e));
        return -e;
    }
    const char *base = strrchr(src, '/');
    base = base ? base + 1 : src;
    size_t bl = strlen(base);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir,
             bl >= 5 && !strcmp(base + bl - 5, ".json") ? "tokenizer.json" : base);
    struct afile af;
    int rc = afile_open(&af, path);
    char buf[1 << 16];
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, f)) > 0)
        rc = afile_write(&af, buf, n);
    if (rc == 0 && ferror(f)) {
        LOG_ERR("%s: read error", src);
        rc = -EIO;
    }
    fclose(f);
    if (rc == 0)
        return afile_commit(&af);
    afile_abort(&af);
    return rc;
}

int synth_gpt_oss(const char *out_dir, const struct synth_opts *o, struct iebin_hparams *hp,
                  enum dtype dt)
{
    int rc;
    if (o->tokenizer) {
        struct tok *tk;
        if ((rc = tok_load(o->tokenizer, &tk)) != 0)
            return rc;
        uint32_t tv = tok_vocab_size(tk);
        tok_free(tk);
        if (!o->vocab && !hp->vocab_size)
            hp->vocab_size = tv;
        else if (o->vocab)
            hp->vocab_size = o->vocab;
        if (tv > hp->vocab_size) {
            LOG_ERR("synth: %s has %u tokens, more than the model's vocab_size %u",
                    o->tokenizer, tv, hp->vocab_size);
            return ERR_USAGE;
        }
    } else if (o->vocab) {
        hp->vocab_size = o->vocab;
    }
    if (!hp->vocab_size) {
        LOG_ERR("synth: preset %s takes its vocabulary from --tokenizer FILE or --vocab N",
                o->preset);
        return ERR_USAGE;
    }
    if ((rc = iebin_check_hparams(hp, o->preset)) != 0)
        return rc;
    if ((rc = path_mkdir_p(out_dir)) != 0)
        return rc;
    struct gt *t = NULL;
    size_t nt = tensor_list(hp, &t);
    if (!nt)
        return -ENOMEM;
    /* the release has 3 shards; the small preset 2, still exercising the index */
    unsigned shards = hp->dim >= 1024 ? 3 : 2;
    if ((o->tokenizer && (rc = copy_tokenizer(o->tokenizer, out_dir)) != 0) ||
        (rc = write_hf(out_dir, t, nt, shards, o->seed, dt)) != 0 ||
        (o->gguf && (rc = write_gguf(o->gguf, hp, t, nt, o->seed, dt)) != 0) ||
        (rc = write_config(out_dir, hp, dt)) != 0) /* last: without it, not a model */
        goto out;
    if (o->gguf && o->tokenizer)
        LOG_INFO("synth: %s carries no tokenizer; give clocher convert --tokenizer %s", o->gguf,
                 o->tokenizer);
out:
    free(t);
    return rc;
}
