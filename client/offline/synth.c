/*
 * synth.c — random-weight Llama-family models (see synth.h): llama (and Llama 3's RoPE scaling,
 * tied embeddings), qwen2 (q/k/v biases) and mistral (a sliding window on every layer).
 *
 * Every tensor's values come from its own splitmix64 stream seeded by (seed, tensor index),
 * so the safetensors and the GGUF file can be produced in any order and still hold the same
 * numbers. Matrices are uniform with standard deviation 0.02 (activations stay finite over
 * 22 layers; the -tiny presets use 0.15 and biases 0.5, so that attention is far from uniform
 * and every feature moves the logits), norm weights are 1. The tokenizer is a SentencePiece BPE model synthesized from
 * byte tokens and letter n-grams: it tokenizes any UTF-8 text (byte fallback), but it is not a
 * trained vocabulary.
 */
#include "synth.h"

#include "err.h"
#include "gguf.h"
#include "half.h"
#include "kern.h"
#include "quant.h"
#include "log.h"
#include "model.h"
#include "path.h"
#include "rng.h"
#include "safetensors.h"

#include "sentencepiece/sentencepiece_model.pb-c.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "afile.h"

/* gpt-oss's layer_types: alternating, starting with a sliding layer (spec §2.4) */
static void synth_gpt_oss_layers(struct iebin_hparams *hp)
{
    memset(hp->sliding_layers, 0, sizeof hp->sliding_layers);
    for (uint32_t l = 0; l < hp->n_layers && l < 1024; l += 2)
        hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
}

/*
 * The Hugging Face family of a llama-like preset: its model_type, Llama 3's rope_scaling
 * (factor 0: none) and the weights' spread. The -tiny presets have every feature of their
 * family, small: tests/models checks each against a float64 reference.
 */
struct family {
    const char *name, *model_type, *hf_class;
    double factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
    float std, bias_std; /* matrices and embedding; q/k/v biases (qwen2) */
};

static const struct family families[] = {
    {"llama3-tiny", "llama", "LlamaForCausalLM", 8.0, 1.0, 4.0, 64.0, 0.15f, 0},
    {"qwen2-tiny", "qwen2", "Qwen2ForCausalLM", 0, 0, 0, 0, 0.15f, 0.5f},
    {"mistral-tiny", "mistral", "MistralForCausalLM", 0, 0, 0, 0, 0.15f, 0},
};
static const struct family family_llama = {NULL, "llama", "LlamaForCausalLM", 0, 0, 0, 0,
                                           0.02f, 0};

static const struct family *preset_family(const char *name)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(name, families[i].name))
            return &families[i];
    return &family_llama;
}

/* Llama 3's scaling as per-pair factors (what the converters derive from config.json). */
static void family_rope(const struct family *fam, struct iebin_hparams *hp)
{
    if (fam->factor == 0)
        return;
    hp->rope_scaling.type = IEBIN_ROPE_FREQ_FACTORS;
    for (uint32_t i = 0; i < hp->head_dim / 2; i++)
        hp->rope_freq_factors[i] = (float)model_llama3_freq_factor(
            hp->rope_theta, hp->head_dim, i, fam->factor, fam->low_freq_factor,
            fam->high_freq_factor, fam->original_max_position_embeddings);
}

int synth_preset(const char *name, struct iebin_hparams *hp, enum dtype *dflt)
{
    memset(hp, 0, sizeof *hp);
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    if (!strcmp(name, "tinyllama-1.1b")) {
        hp->dim = 2048, hp->n_layers = 22, hp->n_heads = 32, hp->n_kv_heads = 4;
        hp->ffn_dim = 5632, hp->vocab_size = 32000, hp->max_seq_len = 2048;
        *dflt = DT_BF16;
    } else if (!strcmp(name, "demo")) {
        hp->dim = 256, hp->n_layers = 4, hp->n_heads = 8, hp->n_kv_heads = 4;
        hp->ffn_dim = 704, hp->vocab_size = 4096, hp->max_seq_len = 1024;
        *dflt = DT_F32;
    } else if (preset_family(name)->name) {
        /* the same small shape for each family; GQA (2 query heads per KV head) */
        hp->dim = 64, hp->n_layers = 2, hp->n_heads = 4, hp->n_kv_heads = 2, hp->head_dim = 16;
        hp->ffn_dim = 96, hp->vocab_size = 512, hp->max_seq_len = 256, hp->rms_eps = 1e-6f;
        *dflt = DT_F32;
        if (!strcmp(name, "llama3-tiny")) {
            hp->rope_theta = 500000.0f; /* Llama 3's; pairs 0, 1 and 2.. fall in the three
                                         * bands of the scaling with L0 = 64 */
            hp->tied_embeddings = true; /* as Llama 3.2 1B/3B */
        } else if (!strcmp(name, "qwen2-tiny")) {
            hp->rope_theta = 1000000.0f;
            hp->tied_embeddings = true; /* as Qwen2.5 0.5B-3B */
            hp->attn_qkv_bias = true;
        } else {
            hp->sliding_window = 8; /* tests/models' prompts are longer */
            iebin_slide_all(hp);
        }
        family_rope(preset_family(name), hp);
    } else if (!strcmp(name, "gpt-oss-20b") || !strcmp(name, "gpt-oss-tiny")) {
        /* ../shared/specs/gpt-oss.md §1a, and the same structure small (the contract's §4) */
        bool big = name[8] == '2';
        hp->dim = big ? 2880 : 128, hp->n_layers = big ? 24 : 4;
        hp->n_heads = big ? 64 : 4, hp->n_kv_heads = big ? 8 : 2, hp->head_dim = 64;
        hp->ffn_dim = big ? 2880 : 128, hp->vocab_size = big ? 201088 : 0;
        hp->max_seq_len = 131072, hp->rope_theta = 150000.0f;
        hp->n_experts = big ? 32 : 8, hp->n_experts_used = 4;
        hp->sliding_window = big ? 128 : 16;
        synth_gpt_oss_layers(hp);
        hp->rope_scaling = (struct iebin_rope_scaling){.type = IEBIN_ROPE_YARN,
                                                       .factor = 32.0f,
                                                       .beta_fast = 32.0f,
                                                       .beta_slow = 1.0f,
                                                       .original_max_position_embeddings = 4096,
                                                       .truncate = false};
        hp->swiglu_limit = 7.0f, hp->swiglu_alpha = 1.702f;
        *dflt = DT_BF16;
    } else {
        LOG_ERR("unknown preset '%s' (expected demo or tinyllama-1.1b, llama3-tiny, qwen2-tiny, "
                "mistral-tiny, gpt-oss-tiny or gpt-oss-20b)",
                name);
        return ERR_NOT_FOUND;
    }
    if (!hp->head_dim)
        hp->head_dim = hp->dim / hp->n_heads;
    return 0;
}

/* ---- the synthesized SentencePiece vocabulary ---- */

struct vocab {
    uint32_t n;
    char **piece;
    float *score;
    int *type; /* SentencePiece types */
};

static void vocab_free(struct vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        free(v->piece[i]);
    free(v->piece);
    free(v->score);
    free(v->type);
}

static int vocab_add(struct vocab *v, uint32_t cap, const char *p, int type)
{
    if (v->n >= cap)
        return 1;
    v->piece[v->n] = strdup(p);
    v->score[v->n] = type == 1 ? -(float)v->n : 0.0f;
    v->type[v->n] = type;
    v->n++;
    return v->n >= cap;
}

static int vocab_build(struct vocab *v, uint32_t size)
{
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
    static const char singles[] =
        "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,!?'\"-:;()";
    const char *sp = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */
    memset(v, 0, sizeof *v);
    v->piece = calloc(size, sizeof *v->piece);
    v->score = calloc(size, sizeof *v->score);
    v->type = calloc(size, sizeof *v->type);
    if (!v->piece || !v->score || !v->type)
        return -ENOMEM;
    char buf[32];
    vocab_add(v, size, "<unk>", 2);
    vocab_add(v, size, "<s>", 3);
    vocab_add(v, size, "</s>", 3);
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        vocab_add(v, size, buf, 6);
    }
    if (vocab_add(v, size, sp, 1))
        return 0;
    for (const char *c = singles; *c; c++) {
        buf[0] = *c, buf[1] = 0;
        if (vocab_add(v, size, buf, 1))
            return 0;
    }
    /* "▁x", then "xy", "▁xy", then "xyz", "▁xyz" in letter-frequency order */
    for (const char *c = letters; *c; c++) {
        snprintf(buf, sizeof buf, "%s%c", sp, *c);
        if (vocab_add(v, size, buf, 1))
            return 0;
    }
    for (int len = 2; len <= 4; len++) {
        int idx[4] = {0};
        for (;;) {
            char w[8];
            for (int k = 0; k < len; k++)
                w[k] = letters[idx[k]];
            w[len] = 0;
            if (vocab_add(v, size, w, 1))
                return 0;
            snprintf(buf, sizeof buf, "%s%s", sp, w);
            if (vocab_add(v, size, buf, 1))
                return 0;
            int k = len - 1;
            while (k >= 0 && ++idx[k] == 26)
                idx[k--] = 0;
            if (k < 0)
                break;
        }
    }
    return 0;
}

static int write_spm_model(const char *path, const struct vocab *v)
{
    Sentencepiece__ModelProto mp = SENTENCEPIECE__MODEL_PROTO__INIT;
    Sentencepiece__TrainerSpec ts = SENTENCEPIECE__TRAINER_SPEC__INIT;
    Sentencepiece__NormalizerSpec ns = SENTENCEPIECE__NORMALIZER_SPEC__INIT;
    ts.has_model_type = 1, ts.model_type = SENTENCEPIECE__TRAINER_SPEC__MODEL_TYPE__BPE;
    ts.has_byte_fallback = 1, ts.byte_fallback = 1;
    ns.has_add_dummy_prefix = 1, ns.add_dummy_prefix = 1;
    ns.has_remove_extra_whitespaces = 1, ns.remove_extra_whitespaces = 0;
    mp.trainer_spec = &ts;
    mp.normalizer_spec = &ns;
    Sentencepiece__ModelProto__SentencePiece *ps = calloc(v->n, sizeof *ps);
    Sentencepiece__ModelProto__SentencePiece **pp = calloc(v->n, sizeof *pp);
    int rc = -ENOMEM;
    if (!ps || !pp)
        goto out;
    for (uint32_t i = 0; i < v->n; i++) {
        sentencepiece__model_proto__sentence_piece__init(&ps[i]);
        ps[i].has_piece = 1;
        ps[i].piece.data = (uint8_t *)v->piece[i];
        ps[i].piece.len = strlen(v->piece[i]);
        ps[i].has_score = 1, ps[i].score = v->score[i];
        ps[i].has_type = 1, ps[i].type = v->type[i];
        pp[i] = &ps[i];
    }
    mp.n_pieces = v->n;
    mp.pieces = pp;
    size_t len = sentencepiece__model_proto__get_packed_size(&mp);
    uint8_t *buf = malloc(len);
    if (!buf)
        goto out;
    sentencepiece__model_proto__pack(&mp, buf);
    struct afile af;
    rc = afile_open(&af, path);
    if (rc == 0 && (rc = afile_write(&af, buf, len)) == 0)
        rc = afile_commit(&af);
    else if (rc == 0)
        afile_abort(&af);
    free(buf);
out:
    free(ps);
    free(pp);
    return rc;
}

/* ---- weights ---- */

/* Fills n values of tensor `index` (uniform with standard deviation std; or ones for norms)
 * in dtype dt. */
static void gen_values(uint64_t seed, uint32_t index, int is_norm, float std, enum dtype dt,
                       void *out, uint64_t n)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)index * 0xd1b54a32d192ed03ull + 1;
    const float a = std * 1.7320508f; /* uniform [-a, a] has standard deviation std */
    for (uint64_t i = 0; i < n; i++) {
        float x = 1.0f;
        if (!is_norm) {
            x = rng_signed_f32(rng_splitmix64(&s)) * a;
        }
        if (dt == DT_F32)
            ((float *)out)[i] = x;
        else if (dt == DT_F16)
            ((uint16_t *)out)[i] = half_f32_to_f16(x);
        else
            ((uint16_t *)out)[i] = half_f32_to_bf16(x);
    }
}

struct stensor {
    char hf[96], gg[64];
    uint64_t rows, cols; /* rows == 1 with is_vec: a 1-D tensor of cols */
    int is_vec, is_norm;
    uint32_t perm_heads; /* q/k: heads for the GGUF (interleaved) permutation */
    float std;           /* the values' spread (family's matrices, or its biases) */
    int gguf_f32;        /* GGUF only, F32 from hp (rope_freqs: llama.cpp's Llama 3 factors) */
};

/*
 * The checkpoint's tensors in a fixed order (a tensor's index seeds its values). qwen2 adds
 * q/k/v biases (Hugging Face rotate-half order, like q/k: llama.cpp keeps qwen2's q/k and their
 * biases unpermuted, NEOX RoPE); tied embeddings drop lm_head; Llama 3's scaling appends the
 * GGUF-only rope_freqs.
 */
static size_t tensor_list(const struct iebin_hparams *hp, const struct family *fam,
                          struct stensor **out)
{
    size_t n = 2 + 12 * (size_t)hp->n_layers + 2;
    struct stensor *t = calloc(n, sizeof *t);
    if (!t)
        return 0;
    size_t k = 0;
    uint64_t q = (uint64_t)hp->n_heads * hp->head_dim, kv = (uint64_t)hp->n_kv_heads * hp->head_dim;
#define T(hf_, gg_, r_, c_, vec_, norm_, perm_)                                                \
    do {                                                                                       \
        snprintf(t[k].hf, sizeof t[k].hf, "%s", hf_);                                          \
        snprintf(t[k].gg, sizeof t[k].gg, "%s", gg_);                                          \
        t[k].rows = (r_), t[k].cols = (c_), t[k].is_vec = (vec_), t[k].is_norm = (norm_);      \
        t[k].perm_heads = (perm_), t[k].std = fam->std;                                        \
        k++;                                                                                   \
    } while (0)
    T("model.embed_tokens.weight", "token_embd.weight", hp->vocab_size, hp->dim, 0, 0, 0);
    const bool neox = hp->attn_qkv_bias; /* qwen2: GGUF keeps HF's q/k row order */
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        char h[96], g[64];
#define LX(hfs_, ggs_, x_, r_, c_, vec_, norm_, perm_)                                         \
    do {                                                                                       \
        snprintf(h, sizeof h, "model.layers.%u.%s.%s", l, hfs_, x_);                           \
        snprintf(g, sizeof g, "blk.%u.%s.%s", l, ggs_, x_);                                    \
        T(h, g, r_, c_, vec_, norm_, perm_);                                                   \
    } while (0)
#define L(hfs_, ggs_, r_, c_, vec_, norm_, perm_) LX(hfs_, ggs_, "weight", r_, c_, vec_, norm_, perm_)
        L("input_layernorm", "attn_norm", 1, hp->dim, 1, 1, 0);
        L("self_attn.q_proj", "attn_q", q, hp->dim, 0, 0, neox ? 0 : hp->n_heads);
        L("self_attn.k_proj", "attn_k", kv, hp->dim, 0, 0, neox ? 0 : hp->n_kv_heads);
        L("self_attn.v_proj", "attn_v", kv, hp->dim, 0, 0, 0);
        if (hp->attn_qkv_bias) {
            LX("self_attn.q_proj", "attn_q", "bias", 1, q, 1, 0, 0);
            t[k - 1].std = fam->bias_std;
            LX("self_attn.k_proj", "attn_k", "bias", 1, kv, 1, 0, 0);
            t[k - 1].std = fam->bias_std;
            LX("self_attn.v_proj", "attn_v", "bias", 1, kv, 1, 0, 0);
            t[k - 1].std = fam->bias_std;
        }
        L("self_attn.o_proj", "attn_output", hp->dim, q, 0, 0, 0);
        L("post_attention_layernorm", "ffn_norm", 1, hp->dim, 1, 1, 0);
        L("mlp.gate_proj", "ffn_gate", hp->ffn_dim, hp->dim, 0, 0, 0);
        L("mlp.up_proj", "ffn_up", hp->ffn_dim, hp->dim, 0, 0, 0);
        L("mlp.down_proj", "ffn_down", hp->dim, hp->ffn_dim, 0, 0, 0);
#undef L
#undef LX
    }
    T("model.norm.weight", "output_norm.weight", 1, hp->dim, 1, 1, 0);
    if (!hp->tied_embeddings)
        T("lm_head.weight", "output.weight", hp->vocab_size, hp->dim, 0, 0, 0);
    if (hp->rope_scaling.type == IEBIN_ROPE_FREQ_FACTORS) {
        T("", "rope_freqs.weight", 1, hp->head_dim / 2, 1, 0, 0);
        t[k - 1].gguf_f32 = 1;
    }
#undef T
    *out = t;
    return k;
}

/* config.json as transformers writes it for the family (only the keys the converters read,
 * plus the ones a real checkpoint of the family has that must not change the result). */
static int write_config(const char *dir, const struct iebin_hparams *hp,
                        const struct family *fam, enum dtype dt)
{
    char path[4096], buf[4096], extra[1024] = "";
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t ne = 0;
    if (fam->factor != 0)
        ne += (size_t)snprintf(extra + ne, sizeof extra - ne,
                               "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.1f, "
                               "\"low_freq_factor\": %.1f, \"high_freq_factor\": %.1f, "
                               "\"original_max_position_embeddings\": %.0f},\n"
                               "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n",
                               fam->factor, fam->low_freq_factor, fam->high_freq_factor,
                               fam->original_max_position_embeddings);
    if (hp->attn_qkv_bias) /* Qwen2.5's: a window it does not use */
        ne += (size_t)snprintf(extra + ne, sizeof extra - ne,
                               "  \"use_sliding_window\": false,\n  \"sliding_window\": 4096,\n"
                               "  \"max_window_layers\": %u,\n",
                               hp->n_layers);
    if (!strcmp(fam->model_type, "mistral"))
        ne += (size_t)snprintf(extra + ne, sizeof extra - ne,
                               "  \"sliding_window\": %u,\n  \"head_dim\": %u,\n",
                               hp->sliding_window, hp->head_dim);
    int n = snprintf(buf, sizeof buf,
                     "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
                     "  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
                     "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
                     "  \"num_key_value_heads\": %u,\n  \"vocab_size\": %u,\n"
                     "  \"max_position_embeddings\": %u,\n  \"rope_theta\": %.1f,\n"
                     "  \"rms_norm_eps\": %g,\n  \"tie_word_embeddings\": %s,\n%s"
                     "  \"hidden_act\": \"silu\",\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
                     "  \"torch_dtype\": \"%s\"\n}\n",
                     fam->hf_class, fam->model_type, hp->dim, hp->ffn_dim, hp->n_layers,
                     hp->n_heads, hp->n_kv_heads, hp->vocab_size, hp->max_seq_len,
                     (double)hp->rope_theta, (double)hp->rms_eps,
                     hp->tied_embeddings ? "true" : "false", extra,
                     dt == DT_F32 ? "float32" : dt == DT_F16 ? "float16" : "bfloat16");
    struct afile af;
    int rc = afile_open(&af, path);
    if (rc)
        return rc;
    if ((rc = afile_write(&af, buf, (size_t)n)) != 0) {
        afile_abort(&af);
        return rc;
    }
    return afile_commit(&af);
}

static int write_safetensors(const char *dir, const struct stensor *t, size_t nt, uint64_t seed,
                             enum dtype dt)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    enum safetensors_dtype sdt = dt == DT_F32 ? SAFETENSORS_F32 : dt == DT_F16 ? SAFETENSORS_F16 : SAFETENSORS_BF16;
    size_t es = dt == DT_F32 ? 4 : 2;
    struct safetensors_writer *w;
    int rc = safetensors_writer_create(path, &w);
    if (rc)
        return rc;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        uint64_t shape[2] = {t[i].rows, t[i].cols};
        if (t[i].gguf_f32)
            continue;
        rc = t[i].is_vec ? safetensors_writer_add(w, t[i].hf, sdt, &shape[1], 1, NULL, t[i].cols * es)
                         : safetensors_writer_add(w, t[i].hf, sdt, shape, 2, NULL, t[i].rows * t[i].cols * es);
    }
    if (rc == 0)
        rc = safetensors_writer_stream_begin(w);
    void *buf = NULL;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        uint64_t n = t[i].rows * t[i].cols;
        if (t[i].gguf_f32)
            continue;
        void *nb = realloc(buf, n * es);
        if (!nb) {
            rc = -ENOMEM;
            break;
        }
        buf = nb;
        gen_values(seed, (uint32_t)i, t[i].is_norm, t[i].std, dt, buf, n);
        rc = safetensors_writer_stream_write(w, buf, n * es);
    }
    free(buf);
    if (rc) {
        safetensors_writer_abort(w);
        return rc;
    }
    return safetensors_writer_finish(w);
}

/* llama.cpp's use_more_bits (llama-quant.cpp): the layers of a Q4_K_M mix whose attn_v and
 * ffn_down get q6_K — the first and last eighth, and every third one between. */
static bool use_more_bits(uint32_t i, uint32_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/*
 * The GGUF type of tensor t: the float type gt, or under Q4_K_M llama.cpp's choice for
 * LLAMA_FTYPE_MOSTLY_Q4_K_M (llama_tensor_get_type): 1-D tensors f32; output.weight q6_K;
 * attn_v.weight and ffn_down.weight q6_K on the layers use_more_bits picks (llama.cpp counts
 * attn_v over the attention layers, which are all the layers here); every other matrix
 * (token_embd included) q4_K. A matrix whose rows are not a multiple of 256 stays in gt
 * (llama.cpp would fall back to q5_0 / q8_0, which this writer does not produce).
 */
static uint32_t gguf_type_of(const struct stensor *t, const struct iebin_hparams *hp,
                             uint32_t gt, bool q4km)
{
    if (t->gguf_f32 || t->is_vec) /* 1-D tensors are f32 in GGUF, as llama.cpp writes them:
                                    * its element-wise ops refuse a bf16 norm weight */
        return GGUF_GGML_F32;
    if (!q4km || t->cols % 256 != 0)
        return gt;
    uint32_t l;
    bool more = sscanf(t->gg, "blk.%u.", &l) == 1 && use_more_bits(l, hp->n_layers) &&
                (strstr(t->gg, ".attn_v.weight") || strstr(t->gg, ".ffn_down.weight"));
    return more || strcmp(t->gg, "output.weight") == 0 ? GGUF_GGML_Q6_K : GGUF_GGML_Q4_K;
}

/* Bytes of tensor t stored as GGUF type gtype (es: bytes of the float type). */
static uint64_t gguf_bytes(const struct stensor *t, uint32_t gtype, size_t es)
{
    uint64_t n = t->rows * t->cols;
    switch (gtype) {
    case GGUF_GGML_F32: return n * 4;
    case GGUF_GGML_Q4_K: return n / 256 * sizeof(struct quant_q4_k);
    case GGUF_GGML_Q6_K: return n / 256 * sizeof(struct quant_q6_k);
    default: return n * es;
    }
}

/* "<arch>.<key>" for the GGUF keys below. */
static const char *gkey(char *buf, size_t cap, const char *arch, const char *key)
{
    snprintf(buf, cap, "%s.%s", arch, key);
    return buf;
}

/*
 * The GGUF llama.cpp's converter writes for the family: architecture "llama" (Llama 3, and
 * Mistral, whose window llama.cpp's converter drops: written here as
 * llama.attention.sliding_window so that it survives) or "qwen2"; Llama 3's scaling as the F32
 * tensor rope_freqs.weight.
 */
static int write_gguf(const char *path, const struct iebin_hparams *hp, const struct stensor *t,
                      size_t nt, uint64_t seed, enum dtype dt, const struct vocab *v, bool q4km)
{
    const char *a = hp->attn_qkv_bias ? "qwen2" : "llama";
    char k[10][64];
    uint32_t gt = dt == DT_F32 ? GGUF_GGML_F32 : dt == DT_F16 ? GGUF_GGML_F16 : GGUF_GGML_BF16;
    size_t es = dt == DT_F32 ? 4 : 2;
    struct gguf_writer *w;
    int rc = gguf_writer_create(path, &w);
    if (rc)
        return rc;
    int32_t *types = malloc(v->n * sizeof *types);
    if (!types) {
        gguf_writer_abort(w);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < v->n; i++)
        types[i] = v->type[i];
    if ((rc = gguf_writer_kv_str(w, "general.architecture", a)) ||
        (rc = gguf_writer_kv_str(w, "general.name", "clocher-synth")) ||
        (rc = gguf_writer_kv_u32(w, gkey(k[0], 64, a, "embedding_length"), hp->dim)) ||
        (rc = gguf_writer_kv_u32(w, gkey(k[1], 64, a, "feed_forward_length"), hp->ffn_dim)) ||
        (rc = gguf_writer_kv_u32(w, gkey(k[2], 64, a, "block_count"), hp->n_layers)) ||
        (rc = gguf_writer_kv_u32(w, gkey(k[3], 64, a, "attention.head_count"), hp->n_heads)) ||
        (rc = gguf_writer_kv_u32(w, gkey(k[4], 64, a, "attention.head_count_kv"),
                                 hp->n_kv_heads)) ||
        (rc = gguf_writer_kv_u32(w, gkey(k[5], 64, a, "context_length"), hp->max_seq_len)) ||
        (rc = gguf_writer_kv_f32(w, gkey(k[6], 64, a, "rope.freq_base"), hp->rope_theta)) ||
        (rc = gguf_writer_kv_f32(w, gkey(k[7], 64, a, "attention.layer_norm_rms_epsilon"),
                                 hp->rms_eps)) ||
        (hp->sliding_window &&
         (rc = gguf_writer_kv_u32(w, gkey(k[8], 64, a, "attention.sliding_window"),
                                  hp->sliding_window))) ||
        (rc = gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama")) ||
        (rc = gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)v->piece, v->n)) ||
        (rc = gguf_writer_kv_f32_arr(w, "tokenizer.ggml.scores", v->score, v->n)) ||
        (rc = gguf_writer_kv_i32_arr(w, "tokenizer.ggml.token_type", types, v->n)) ||
        (rc = gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
        (rc = gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
        (rc = gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
        (q4km && (rc = gguf_writer_kv_u32(w, "general.file_type", 15)))) /* MOSTLY_Q4_K_M */
        goto fail;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        uint64_t ne[2] = {t[i].cols, t[i].rows};
        uint32_t ty = gguf_type_of(&t[i], hp, gt, q4km);
        rc = gguf_writer_add_tensor(w, t[i].gg, ty, ne, t[i].is_vec ? 1 : 2, NULL,
                                    gguf_bytes(&t[i], ty, es));
    }
    if (rc || (rc = gguf_writer_stream_begin(w)))
        goto fail;
    uint8_t *buf = NULL, *row = NULL;
    float *x = NULL;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        uint64_t n = t[i].rows * t[i].cols;
        uint32_t ty = gguf_type_of(&t[i], hp, gt, q4km);
        size_t ts = ty == gt ? es : 4; /* bytes per value written, float types */
        uint64_t rb = ty == GGUF_GGML_Q4_K || ty == GGUF_GGML_Q6_K ? gguf_bytes(&t[i], ty, es) / t[i].rows
                                                               : t[i].cols * ts;
        uint8_t *nb = realloc(buf, n * es);
        if (!nb) {
            rc = -ENOMEM;
            break;
        }
        buf = nb;
        if (t[i].gguf_f32) { /* rope_freqs [head_dim/2] */
            rc = gguf_writer_stream_write(w, hp->rope_freq_factors, n * 4);
            continue;
        }
        gen_values(seed, (uint32_t)i, t[i].is_norm, t[i].std, dt, buf, n);
        const uint8_t *src = buf; /* rows of the values to write, rb bytes each */
        if (ty != gt) { /* f32 or a k-quant: the same values (dt-rounded) as f32 first */
            float *nx = realloc(x, n * sizeof *x);
            uint8_t *nr = realloc(row, rb);
            if (!nx || !nr) {
                x = nx ? nx : x;
                row = nr ? nr : row;
                rc = -ENOMEM;
                break;
            }
            x = nx;
            row = nr;
            for (uint64_t j = 0; j < n; j++)
                x[j] = dt == DT_F32   ? ((const float *)buf)[j]
                       : dt == DT_F16 ? half_f16_to_f32(((const uint16_t *)buf)[j])
                                      : half_bf16_to_f32(((const uint16_t *)buf)[j]);
            src = (const uint8_t *)x;
        }
        /* llama.cpp's HF->GGUF permutation of q/k: interleaved row h*hd + 2i + s holds HF row
         * h*hd + s*hd/2 + i (HF stores q/k rows in rotate-half order) */
        if (ty == GGUF_GGML_Q4_K || ty == GGUF_GGML_Q6_K) {
            /* the whole tensor at once, its rows quantized on every CPU (the bytes do not
             * depend on how many): a permuted tensor's rows are put in file order first */
            if (t[i].perm_heads) {
                float *px = malloc(n * sizeof *px); /* [rows][cols] permuted */
                if (!px) {
                    rc = -ENOMEM;
                    break;
                }
                for (uint64_t r = 0; r < t[i].rows; r++)
                    memcpy(px + r * t[i].cols, x + iebin_rope_hf_row(r, hp->head_dim) * t[i].cols,
                           t[i].cols * sizeof *px);
                memcpy(x, px, n * sizeof *px);
                free(px);
            }
            uint8_t *nr = realloc(row, t[i].rows * rb); /* [rows][rb] */
            if (!nr) {
                rc = -ENOMEM;
                break;
            }
            row = nr;
            rc = kern_quantize_rows_kq(ty == GGUF_GGML_Q4_K ? DT_Q4_K : DT_Q6_K, x, t[i].rows,
                                       t[i].cols, row, 0);
            if (rc == 0)
                rc = gguf_writer_stream_write(w, row, t[i].rows * rb);
            continue;
        }
        for (uint64_t r = 0; r < t[i].rows && rc == 0; r++) {
            uint64_t sr = t[i].perm_heads ? iebin_rope_hf_row(r, hp->head_dim) : r;
            rc = gguf_writer_stream_write(w, src + sr * rb, rb);
        }
    }
    free(x);
    free(row);
    free(buf);
    if (rc)
        goto fail;
    free(types);
    return gguf_writer_finish(w);
fail:
    free(types);
    gguf_writer_abort(w);
    return rc;
}

int synth_model(const char *out_dir, const struct synth_opts *o)
{
    struct iebin_hparams hp;
    enum dtype dt;
    int rc = synth_preset(o->preset, &hp, &dt);
    if (rc)
        return rc;
    if (o->dtype_set)
        dt = o->dtype;
    if (dt != DT_F32 && dt != DT_F16 && dt != DT_BF16) {
        LOG_ERR("synth: dtype must be f32, f16 or bf16");
        return ERR_USAGE;
    }
    if (o->layers)
        hp.n_layers = o->layers;
    if (hp.n_experts) {
        if (o->gguf_q4_k_m) {
            LOG_ERR("synth: --ftype q4_k_m is for the Llama presets, not %s", o->preset);
            return ERR_USAGE;
        }
        synth_gpt_oss_layers(&hp);
        return synth_gpt_oss(out_dir, o, &hp, dt);
    }
    if (o->tokenizer) {
        LOG_ERR("synth: --tokenizer is for the gpt-oss presets");
        return ERR_USAGE;
    }
    if (o->gguf_q4_k_m && !o->gguf) {
        LOG_ERR("synth: --ftype q4_k_m is the type of the --gguf file: give --gguf FILE");
        return ERR_USAGE;
    }
    if (o->vocab) /* e.g. Llama 3's 128256 (the synthesized vocabulary grows to it) */
        hp.vocab_size = o->vocab;
    if ((rc = iebin_check_hparams(&hp, o->preset)) != 0)
        return rc;
    if ((rc = path_mkdir_p(out_dir)) != 0)
        return rc;
    const struct family *fam = preset_family(o->preset);
    if (o->layers && hp.sliding_window) { /* every layer slides, however many */
        memset(hp.sliding_layers, 0, sizeof hp.sliding_layers);
        iebin_slide_all(&hp);
    }
    struct vocab v;
    struct stensor *t = NULL;
    size_t nt = tensor_list(&hp, fam, &t);
    char path[4096];
    if ((rc = vocab_build(&v, hp.vocab_size)) != 0 || nt == 0) {
        rc = rc ? rc : -ENOMEM;
        goto out;
    }
    if (v.n != hp.vocab_size) {
        LOG_ERR("synth: vocabulary of %u is larger than the %u pieces it can synthesize",
                hp.vocab_size, v.n);
        rc = ERR_RANGE;
        goto out;
    }
    /* config.json last: a directory without it is not a model */
    snprintf(path, sizeof path, "%s/tokenizer.model", out_dir);
    if ((rc = write_spm_model(path, &v)) || (rc = write_safetensors(out_dir, t, nt, o->seed, dt)) ||
        (o->gguf && (rc = write_gguf(o->gguf, &hp, t, nt, o->seed, dt, &v, o->gguf_q4_k_m))) ||
        (rc = write_config(out_dir, &hp, fam, dt)))
        goto out;
out:
    vocab_free(&v);
    free(t);
    return rc;
}
