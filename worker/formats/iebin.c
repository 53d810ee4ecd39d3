/*
 * iebin.c — IEBIN v1 reader: manifest parsing (jansson), validation of every field against the
 * format and the architecture, and the read-only mapping of the blob (see iebin.h and
 * docs/IEBIN.md, which this file implements).
 *
 * Validation runs on the manifest alone (it needs only the blob's size) before anything is
 * mapped, so a bad manifest for a 4 GB model costs a few microseconds, not a 4 GB read. The
 * same code validates what iebin_writer_finish is about to commit (iebin_check_manifest), so
 * the writer can never produce a model this reader rejects.
 *
 * An architecture's tensors are numbered by "slot": 0 tok_embd, 1 output_norm, 2 output, then
 * one per per-layer kind of its table below (llama 9, qwen2 12, gpt_oss 19) for each layer. A name resolves to its slot by
 * parsing (no table of strings), duplicates are a second hit on a slot, missing tensors an
 * empty slot, and iebin_find is a slot lookup.
 *
 * NOTES: a struct iebin_model is immutable once returned and may be read by any thread. It
 * owns its mapping; tensors' `data` pointers die with iebin_close.
 */
#include "iebin.h"

#include "err.h"
#include "fmap.h"
#include "jfield.h"
#include "log.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef MADV_POPULATE_READ
#define IEBIN_MADV_POPULATE_READ MADV_POPULATE_READ
#else
#define IEBIN_MADV_POPULATE_READ 22 /* Linux 5.14; older kernels answer EINVAL */
#endif
#include <sys/stat.h>
#include <unistd.h>

/* ---- the architectures ---- */

/* Dimensions a tensor shape is made of, resolved against the hyper-parameters. */
enum dimc { D_VOCAB, D_DIM, D_Q, D_KV, D_FFN, D_NEXP, D_NHEADS };

static const struct kind_info {
    const char *name; /* full name, or the suffix after "blk.N." for per-layer kinds */
    int n_dims;
    const char *f32_what; /* "norms", "biases", "sinks": must be f32; NULL: any dtype */
    uint8_t dims[3];      /* enum dimc, outermost first */
    const char *words;    /* the expected shape in words, for messages */
} llama_kinds[] = {
    {IEBIN_T_TOK_EMBD, 2, NULL, {D_VOCAB, D_DIM}, "vocab_size, dim"},
    {IEBIN_T_OUTPUT_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_OUTPUT, 2, NULL, {D_VOCAB, D_DIM}, "vocab_size, dim"},
    {IEBIN_T_ATTN_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_ATTN_Q, 2, NULL, {D_Q, D_DIM}, "n_heads*head_dim, dim"},
    {IEBIN_T_ATTN_K, 2, NULL, {D_KV, D_DIM}, "n_kv_heads*head_dim, dim"},
    {IEBIN_T_ATTN_V, 2, NULL, {D_KV, D_DIM}, "n_kv_heads*head_dim, dim"},
    {IEBIN_T_ATTN_O, 2, NULL, {D_DIM, D_Q}, "dim, n_heads*head_dim"},
    {IEBIN_T_FFN_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_FFN_GATE, 2, NULL, {D_FFN, D_DIM}, "ffn_dim, dim"},
    {IEBIN_T_FFN_UP, 2, NULL, {D_FFN, D_DIM}, "ffn_dim, dim"},
    {IEBIN_T_FFN_DOWN, 2, NULL, {D_DIM, D_FFN}, "dim, ffn_dim"},
}, qwen2_kinds[] = { /* llama's with q/k/v biases */
    {IEBIN_T_TOK_EMBD, 2, NULL, {D_VOCAB, D_DIM}, "vocab_size, dim"},
    {IEBIN_T_OUTPUT_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_OUTPUT, 2, NULL, {D_VOCAB, D_DIM}, "vocab_size, dim"},
    {IEBIN_T_ATTN_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_ATTN_Q, 2, NULL, {D_Q, D_DIM}, "n_heads*head_dim, dim"},
    {IEBIN_T_ATTN_Q_BIAS, 1, "biases", {D_Q}, "n_heads*head_dim"},
    {IEBIN_T_ATTN_K, 2, NULL, {D_KV, D_DIM}, "n_kv_heads*head_dim, dim"},
    {IEBIN_T_ATTN_K_BIAS, 1, "biases", {D_KV}, "n_kv_heads*head_dim"},
    {IEBIN_T_ATTN_V, 2, NULL, {D_KV, D_DIM}, "n_kv_heads*head_dim, dim"},
    {IEBIN_T_ATTN_V_BIAS, 1, "biases", {D_KV}, "n_kv_heads*head_dim"},
    {IEBIN_T_ATTN_O, 2, NULL, {D_DIM, D_Q}, "dim, n_heads*head_dim"},
    {IEBIN_T_FFN_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_FFN_GATE, 2, NULL, {D_FFN, D_DIM}, "ffn_dim, dim"},
    {IEBIN_T_FFN_UP, 2, NULL, {D_FFN, D_DIM}, "ffn_dim, dim"},
    {IEBIN_T_FFN_DOWN, 2, NULL, {D_DIM, D_FFN}, "dim, ffn_dim"},
}, gpt_oss_kinds[] = {
    {IEBIN_T_TOK_EMBD, 2, NULL, {D_VOCAB, D_DIM}, "vocab_size, dim"},
    {IEBIN_T_OUTPUT_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_OUTPUT, 2, NULL, {D_VOCAB, D_DIM}, "vocab_size, dim"},
    {IEBIN_T_ATTN_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_ATTN_Q, 2, NULL, {D_Q, D_DIM}, "n_heads*head_dim, dim"},
    {IEBIN_T_ATTN_Q_BIAS, 1, "biases", {D_Q}, "n_heads*head_dim"},
    {IEBIN_T_ATTN_K, 2, NULL, {D_KV, D_DIM}, "n_kv_heads*head_dim, dim"},
    {IEBIN_T_ATTN_K_BIAS, 1, "biases", {D_KV}, "n_kv_heads*head_dim"},
    {IEBIN_T_ATTN_V, 2, NULL, {D_KV, D_DIM}, "n_kv_heads*head_dim, dim"},
    {IEBIN_T_ATTN_V_BIAS, 1, "biases", {D_KV}, "n_kv_heads*head_dim"},
    {IEBIN_T_ATTN_O, 2, NULL, {D_DIM, D_Q}, "dim, n_heads*head_dim"},
    {IEBIN_T_ATTN_O_BIAS, 1, "biases", {D_DIM}, "dim"},
    {IEBIN_T_ATTN_SINKS, 1, "sinks", {D_NHEADS}, "n_heads"},
    {IEBIN_T_FFN_NORM, 1, "norms", {D_DIM}, "dim"},
    {IEBIN_T_FFN_ROUTER, 2, NULL, {D_NEXP, D_DIM}, "n_experts, dim"},
    {IEBIN_T_FFN_ROUTER_BIAS, 1, "biases", {D_NEXP}, "n_experts"},
    {IEBIN_T_FFN_GATE_EXPS, 3, NULL, {D_NEXP, D_FFN, D_DIM}, "n_experts, ffn_dim, dim"},
    {IEBIN_T_FFN_GATE_EXPS_BIAS, 2, "biases", {D_NEXP, D_FFN}, "n_experts, ffn_dim"},
    {IEBIN_T_FFN_UP_EXPS, 3, NULL, {D_NEXP, D_FFN, D_DIM}, "n_experts, ffn_dim, dim"},
    {IEBIN_T_FFN_UP_EXPS_BIAS, 2, "biases", {D_NEXP, D_FFN}, "n_experts, ffn_dim"},
    {IEBIN_T_FFN_DOWN_EXPS, 3, NULL, {D_NEXP, D_DIM, D_FFN}, "n_experts, dim, ffn_dim"},
    {IEBIN_T_FFN_DOWN_EXPS_BIAS, 2, "biases", {D_NEXP, D_DIM}, "n_experts, dim"},
};

/* Every architecture starts with the same three global tensors; slot 2 is `output`. */
#define N_GLOBAL 3
#define SLOT_OUTPUT 2

static const struct arch_info {
    const char *name;
    const struct kind_info *kinds;
    size_t n_kinds;
} arches[] = {
    {"llama", llama_kinds, sizeof llama_kinds / sizeof llama_kinds[0]},
    {"gpt_oss", gpt_oss_kinds, sizeof gpt_oss_kinds / sizeof gpt_oss_kinds[0]},
    {"qwen2", qwen2_kinds, sizeof qwen2_kinds / sizeof qwen2_kinds[0]},
};
#define ARCH_LLAMA (&arches[0])
#define ARCH_GPT_OSS (&arches[1])
#define ARCH_QWEN2 (&arches[2])
#define KNOWN_ARCHES "llama, qwen2, gpt_oss"

static const struct arch_info *arch_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof arches / sizeof arches[0]; i++)
        if (strcmp(name, arches[i].name) == 0)
            return &arches[i];
    return NULL;
}

/* The architecture a (checked) hyper-parameter set describes (iebin_arch_of). */
static const struct arch_info *hp_arch(const struct iebin_hparams *hp)
{
    return arch_by_name(iebin_arch_of(hp));
}

static size_t per_layer(const struct arch_info *a) { return a->n_kinds - N_GLOBAL; }

static size_t n_slots(const struct arch_info *a, const struct iebin_hparams *hp)
{
    return N_GLOBAL + (size_t)hp->n_layers * per_layer(a);
}

/* "blk.12.attn_q" -> slot; -1 for a name the architecture does not define. */
static long name_slot(const struct arch_info *a, const struct iebin_hparams *hp, const char *name)
{
    for (int k = 0; k < N_GLOBAL; k++)
        if (strcmp(name, a->kinds[k].name) == 0)
            return k;
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    const char *p = name + 4;
    /* decimal without sign or leading zeros: "blk.01.x" is not "blk.1.x" */
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return -1;
    unsigned long layer = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        layer = layer * 10 + (unsigned long)(*p - '0');
        if (layer >= hp->n_layers)
            return -1;
    }
    if (*p != '.')
        return -1;
    p++;
    for (size_t k = N_GLOBAL; k < a->n_kinds; k++)
        if (strcmp(p, a->kinds[k].name) == 0)
            return (long)(N_GLOBAL + layer * per_layer(a) + (k - N_GLOBAL));
    return -1;
}

static size_t slot_kind(const struct arch_info *a, size_t slot)
{
    return slot < N_GLOBAL ? slot : N_GLOBAL + (slot - N_GLOBAL) % per_layer(a);
}

static void slot_name(const struct arch_info *a, size_t slot, char *buf, size_t n)
{
    if (slot < N_GLOBAL)
        snprintf(buf, n, "%s", a->kinds[slot].name);
    else
        snprintf(buf, n, "blk.%zu.%s", (slot - N_GLOBAL) / per_layer(a),
                 a->kinds[slot_kind(a, slot)].name);
}

static void expected_shape(const struct iebin_hparams *hp, const struct kind_info *k,
                           uint64_t shape[3])
{
    for (int i = 0; i < k->n_dims; i++) {
        switch ((enum dimc)k->dims[i]) {
        case D_VOCAB: shape[i] = hp->vocab_size; break;
        case D_DIM: shape[i] = hp->dim; break;
        case D_Q: shape[i] = (uint64_t)hp->n_heads * hp->head_dim; break;
        case D_KV: shape[i] = (uint64_t)hp->n_kv_heads * hp->head_dim; break;
        case D_FFN: shape[i] = hp->ffn_dim; break;
        case D_NEXP: shape[i] = hp->n_experts; break;
        case D_NHEADS: shape[i] = hp->n_heads; break;
        }
    }
}

size_t iebin_arch_n_slots(const char *arch, const struct iebin_hparams *hp)
{
    const struct arch_info *a = arch_by_name(arch);
    return a ? n_slots(a, hp) : 0;
}

int iebin_arch_slot(const char *arch, const struct iebin_hparams *hp, size_t slot,
                    char name[IEBIN_NAME_MAX], uint64_t shape[3], int *n_dims, bool *f32)
{
    const struct arch_info *a = arch_by_name(arch);
    if (!a || slot >= n_slots(a, hp))
        return ERR_RANGE;
    const struct kind_info *k = &a->kinds[slot_kind(a, slot)];
    slot_name(a, slot, name, IEBIN_NAME_MAX);
    expected_shape(hp, k, shape);
    *n_dims = k->n_dims;
    *f32 = k->f32_what != NULL;
    return 0;
}

static const char *shape_str(const uint64_t *shape, int n_dims, char *buf, size_t n)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

/* ---- hyper-parameters ---- */

static const struct hp_field {
    const char *name;
    size_t off;
    uint32_t lo, hi;
} hp_fields[] = {
    {"dim", offsetof(struct iebin_hparams, dim), 1, 65536},
    {"n_layers", offsetof(struct iebin_hparams, n_layers), 1, 1024},
    {"n_heads", offsetof(struct iebin_hparams, n_heads), 1, 1024},
    {"n_kv_heads", offsetof(struct iebin_hparams, n_kv_heads), 1, 1024},
    {"head_dim", offsetof(struct iebin_hparams, head_dim), 2, 1024},
    {"ffn_dim", offsetof(struct iebin_hparams, ffn_dim), 1, 1048576},
    {"vocab_size", offsetof(struct iebin_hparams, vocab_size), 1, 4194304},
    {"max_seq_len", offsetof(struct iebin_hparams, max_seq_len), 1, 1048576},
};
#define N_HP_FIELDS (sizeof hp_fields / sizeof hp_fields[0])

static uint32_t hp_get(const struct iebin_hparams *hp, const struct hp_field *f)
{
    uint32_t v;
    memcpy(&v, (const char *)hp + f->off, sizeof v);
    return v;
}

static bool finite_pos(float x) { return x > 0.0f && isfinite(x); }

/* llama and qwen2 (dense): a window on every layer or none, frequency-factor RoPE scaling or
 * none, and every gpt_oss-only field zero (named when one is not). */
static int check_dense_extras(const struct iebin_hparams *hp, const char *what)
{
    const char *arch = iebin_arch_of(hp);
    bool bits_ok = true;
    for (uint32_t l = 0; l < 1024; l++)
        bits_ok &= iebin_layer_slides(hp, l) == (hp->sliding_window != 0 && l < hp->n_layers);
    bool stray = false; /* layer bits without a window; else !bits_ok: a window on some layers */
    for (size_t i = 0; i < sizeof hp->sliding_layers / sizeof hp->sliding_layers[0]; i++)
        stray |= !hp->sliding_window && hp->sliding_layers[i] != 0;
    const char *field = hp->n_experts_used                          ? "n_experts_used"
                        : stray                                     ? "layer_types"
                        : !bits_ok                                  ? "sliding_window"
                        : hp->rope_scaling.type == IEBIN_ROPE_YARN ? "rope_scaling"
                        : hp->swiglu_limit != 0.0f                  ? "swiglu_limit"
                        : hp->swiglu_alpha != 0.0f                  ? "swiglu_alpha"
                                                                    : NULL;
    if (field) {
        LOG_ERR("%s: hparams.%s is set, but architecture %s does not implement it (a gpt_oss "
                "field; %s layers slide all or none)",
                what, field, arch, arch);
        return ERR_RANGE;
    }
    const struct iebin_rope_scaling *rs = &hp->rope_scaling;
    const uint32_t half = hp->head_dim / 2;
    for (uint32_t i = 0; rs->type == IEBIN_ROPE_FREQ_FACTORS && i < IEBIN_MAX_ROPE_PAIRS; i++) {
        float f = hp->rope_freq_factors[i];
        if (i < half ? !finite_pos(f) : f != 0.0f) {
            LOG_ERR("%s: hparams.rope_freq_factors[%u] is %g: the head_dim/2 = %u factors must "
                    "be finite and > 0",
                    what, i, (double)f, half);
            return ERR_RANGE;
        }
    }
    return 0;
}

static int check_gpt_oss_extras(const struct iebin_hparams *hp, const char *what)
{
    if (hp->attn_qkv_bias) {
        LOG_ERR("%s: gpt_oss hyper-parameters with qwen2's attn_qkv_bias", what);
        return ERR_RANGE;
    }
    if (hp->n_experts > IEBIN_MAX_EXPERTS) {
        LOG_ERR("%s: hparams.n_experts %u is outside 1..%u", what, hp->n_experts,
                IEBIN_MAX_EXPERTS);
        return ERR_RANGE;
    }
    if (hp->n_experts_used < 1 || hp->n_experts_used > hp->n_experts) {
        LOG_ERR("%s: hparams.n_experts_used %u is outside 1..n_experts (n_experts %u)", what,
                hp->n_experts_used, hp->n_experts);
        return ERR_RANGE;
    }
    if (hp->sliding_window < 1) {
        LOG_ERR("%s: hparams.sliding_window is 0, must be >= 1", what);
        return ERR_RANGE;
    }
    for (uint32_t l = hp->n_layers; l < 1024; l++)
        if ((hp->sliding_layers[l / 64] >> (l % 64)) & 1u) {
            LOG_ERR("%s: hparams.layer_types: layer %u slides but the model has %u layers", what,
                    l, hp->n_layers);
            return ERR_RANGE;
        }
    const struct iebin_rope_scaling *rs = &hp->rope_scaling;
    if (rs->type != IEBIN_ROPE_YARN) {
        LOG_ERR("%s: hparams.rope_scaling.type %d is not yarn (gpt_oss needs YaRN)", what,
                (int)rs->type);
        return ERR_RANGE;
    }
    if (!(rs->factor >= 1.0f) || !isfinite(rs->factor)) {
        LOG_ERR("%s: hparams.rope_scaling.factor %g must be finite and >= 1", what,
                (double)rs->factor);
        return ERR_RANGE;
    }
    /* YaRN's ramp runs from dimension low (from beta_fast) to high (from beta_slow): low <
     * high needs beta_fast > beta_slow */
    if (!finite_pos(rs->beta_slow) || !finite_pos(rs->beta_fast) ||
        !(rs->beta_fast > rs->beta_slow)) {
        LOG_ERR("%s: hparams.rope_scaling.beta_fast %g and beta_slow %g must be finite with "
                "beta_fast > beta_slow > 0",
                what, (double)rs->beta_fast, (double)rs->beta_slow);
        return ERR_RANGE;
    }
    if (rs->original_max_position_embeddings < 1 ||
        rs->original_max_position_embeddings > 1048576) {
        LOG_ERR("%s: hparams.rope_scaling.original_max_position_embeddings %u is outside "
                "1..1048576",
                what, rs->original_max_position_embeddings);
        return ERR_RANGE;
    }
    if (!finite_pos(hp->swiglu_limit) || !finite_pos(hp->swiglu_alpha)) {
        LOG_ERR("%s: hparams.swiglu_limit %g and swiglu_alpha %g must be finite and > 0", what,
                (double)hp->swiglu_limit, (double)hp->swiglu_alpha);
        return ERR_RANGE;
    }
    return 0;
}

int iebin_check_hparams(const struct iebin_hparams *hp, const char *what)
{
    for (size_t i = 0; i < N_HP_FIELDS; i++) {
        const struct hp_field *f = &hp_fields[i];
        uint32_t v = hp_get(hp, f);
        if (v < f->lo || v > f->hi) {
            LOG_ERR("%s: hparams.%s %u is outside %u..%u", what, f->name, v, f->lo, f->hi);
            return ERR_RANGE;
        }
    }
    if (hp->n_heads % hp->n_kv_heads != 0) {
        LOG_ERR("%s: hparams.n_heads %u is not a multiple of n_kv_heads %u", what, hp->n_heads,
                hp->n_kv_heads);
        return ERR_RANGE;
    }
    if (hp->head_dim % 2 != 0) {
        LOG_ERR("%s: hparams.head_dim %u is odd (RoPE rotates pairs of elements)", what,
                hp->head_dim);
        return ERR_RANGE;
    }
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta)) {
        LOG_ERR("%s: hparams.rope_theta %g must be finite and > 0", what, (double)hp->rope_theta);
        return ERR_RANGE;
    }
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f)) {
        LOG_ERR("%s: hparams.rms_eps %g must be in (0, 1)", what, (double)hp->rms_eps);
        return ERR_RANGE;
    }
    return hp->n_experts ? check_gpt_oss_extras(hp, what) : check_dense_extras(hp, what);
}

/* ---- one tensor against the architecture ---- */

static int check_arch_tensor(const char *what, const struct arch_info *a,
                             const struct iebin_hparams *hp, const char *name, enum dtype dt,
                             const uint64_t *shape, int n_dims, long *slot_out)
{
    long slot = name_slot(a, hp, name);
    if (slot < 0) {
        LOG_ERR("%s: tensor '%s' is not a tensor of architecture %s with %u layers "
                "(unexpected tensor)",
                what, name, a->name, hp->n_layers);
        return ERR_FORMAT;
    }
    const struct kind_info *k = &a->kinds[slot_kind(a, (size_t)slot)];
    if (slot == SLOT_OUTPUT && hp->tied_embeddings) {
        LOG_ERR("%s: tensor '%s' is present but hparams.tied_embeddings is true (the classifier "
                "is tok_embd)",
                what, name);
        return ERR_FORMAT;
    }
    if (k->f32_what && dt != DT_F32) {
        const struct dtype_info *di = dtype_info(dt);
        LOG_ERR("%s: tensor '%s': dtype %s, but %s must be f32", what, name, di ? di->name : "?",
                k->f32_what);
        return ERR_MISMATCH;
    }
    uint64_t want[3];
    expected_shape(hp, k, want);
    bool same = n_dims == k->n_dims;
    for (int i = 0; same && i < n_dims; i++)
        same = shape[i] == want[i];
    if (!same) {
        char got_s[128], want_s[96];
        LOG_ERR("%s: tensor '%s': shape %s does not match the architecture's %s (%s)", what, name,
                shape_str(shape, n_dims, got_s, sizeof got_s),
                shape_str(want, k->n_dims, want_s, sizeof want_s), k->words);
        return ERR_MISMATCH;
    }
    if (slot_out)
        *slot_out = slot;
    return 0;
}

int iebin_check_tensor(const char *what, const char *arch, const struct iebin_hparams *hp,
                       const char *name, enum dtype dt, const uint64_t *shape, int n_dims)
{
    const struct arch_info *a = arch_by_name(arch);
    if (!a) {
        LOG_ERR("%s: architecture '%s' is not supported (known: " KNOWN_ARCHES ")", what, arch);
        return ERR_UNSUPPORTED;
    }
    if (a != hp_arch(hp)) {
        LOG_ERR("%s: architecture %s with hyper-parameters of %s (n_experts %u)", what, arch,
                hp_arch(hp)->name, hp->n_experts);
        return ERR_MISMATCH;
    }
    return check_arch_tensor(what, a, hp, name, dt, shape, n_dims, NULL);
}

/* ---- manifest fields ---- */

/* An integer in lo..hi (hi <= 2^53). `field` is the full field label for messages. */
static int get_int(const char *what, const char *field, const json_t *v, uint64_t lo, uint64_t hi,
                   uint64_t *out)
{
    char d[48];
    if (!v) {
        LOG_ERR("%s: %s is missing", what, field);
        return ERR_FORMAT;
    }
    if (!json_is_integer(v)) {
        LOG_ERR("%s: %s is %s, not an integer", what, field, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi) {
        LOG_ERR("%s: %s is %lld, outside %llu..%llu", what, field, (long long)x,
                (unsigned long long)lo, (unsigned long long)hi);
        return ERR_RANGE;
    }
    *out = (uint64_t)x;
    return 0;
}

static int get_string(const char *what, const char *field, const json_t *v, const char **out)
{
    char d[48];
    if (!v) {
        LOG_ERR("%s: %s is missing", what, field);
        return ERR_FORMAT;
    }
    if (!json_is_string(v)) {
        LOG_ERR("%s: %s is %s, not a string", what, field, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    *out = json_string_value(v);
    return 0;
}

/* A JSON number (integer or real) that a float can hold. */
static int get_real(const char *what, const char *field, const json_t *v, float *out)
{
    char d[48];
    if (!v) {
        LOG_ERR("%s: %s is missing", what, field);
        return ERR_FORMAT;
    }
    if (!json_is_number(v)) {
        LOG_ERR("%s: %s is %s, not a number", what, field, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    double x = json_number_value(v);
    if (!(fabs(x) <= FLT_MAX)) { /* a float cannot hold it; converting would be UB */
        LOG_ERR("%s: %s %g does not fit a float", what, field, x);
        return ERR_RANGE;
    }
    *out = (float)x;
    return 0;
}

static int get_bool(const char *what, const char *field, const json_t *v, bool *out)
{
    char d[48];
    if (!v) {
        LOG_ERR("%s: %s is missing", what, field);
        return ERR_FORMAT;
    }
    if (!json_is_boolean(v)) {
        LOG_ERR("%s: %s is %s, not a boolean", what, field, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    *out = json_is_true(v);
    return 0;
}

/* The hparams keys only gpt_oss has: refused by name in a llama or qwen2 manifest. */
static const char *const gpt_oss_keys[] = {"n_experts",    "n_experts_used", "layer_types",
                                           "rope_scaling", "swiglu_limit",   "swiglu_alpha"};
#define N_GPT_OSS_KEYS (sizeof gpt_oss_keys / sizeof gpt_oss_keys[0])

/* "layer_types": n_layers strings, each "sliding_attention" or "full_attention". */
static int parse_layer_types(const char *what, const json_t *v, struct iebin_hparams *hp)
{
    char d[48];
    if (!v || !json_is_array(v)) {
        LOG_ERR("%s: hparams.layer_types is %s, not an array", what, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    if (json_array_size(v) != hp->n_layers) {
        LOG_ERR("%s: hparams.layer_types has %zu entries, but n_layers is %u", what,
                json_array_size(v), hp->n_layers);
        return ERR_RANGE;
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const json_t *e = json_array_get(v, l);
        const char *ty = json_is_string(e) ? json_string_value(e) : NULL;
        if (!ty) {
            LOG_ERR("%s: hparams.layer_types[%u] is %s, not a string", what, l,
                    jfield_desc(e, d, sizeof d));
            return ERR_FORMAT;
        }
        if (strcmp(ty, "sliding_attention") == 0) {
            hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
        } else if (strcmp(ty, "full_attention") != 0) {
            LOG_ERR("%s: hparams.layer_types[%u] is \"%.64s\", not \"sliding_attention\" or "
                    "\"full_attention\" (unknown layer type)",
                    what, l, ty);
            return ERR_UNSUPPORTED;
        }
    }
    return 0;
}

/* "rope_scaling": {"type": "yarn", factor, beta_fast, beta_slow,
 * original_max_position_embeddings, truncate}: every key required, no other key allowed (a
 * scaling parameter the engine would ignore must not load). */
static int parse_rope_scaling(const char *what, const json_t *o, struct iebin_rope_scaling *rs)
{
    static const char *const keys[] = {"type",      "factor",
                                       "beta_fast", "beta_slow",
                                       "original_max_position_embeddings", "truncate"};
    char d[48];
    int rc;
    if (!o || !json_is_object(o)) {
        LOG_ERR("%s: hparams.rope_scaling is %s, not an object", what, jfield_desc(o, d, sizeof d));
        return ERR_FORMAT;
    }
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)o, key, val) {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            known |= strcmp(key, keys[i]) == 0;
        if (!known) {
            LOG_ERR("%s: hparams.rope_scaling.%.64s is an unknown key (known: type, factor, "
                    "beta_fast, beta_slow, original_max_position_embeddings, truncate)",
                    what, key);
            return ERR_FORMAT;
        }
    }
    const char *ty;
    if ((rc = get_string(what, "hparams.rope_scaling.type", json_object_get(o, "type"), &ty)))
        return rc;
    if (strcmp(ty, "yarn") != 0) {
        LOG_ERR("%s: hparams.rope_scaling.type \"%.64s\" is not supported (known: yarn)", what,
                ty);
        return ERR_UNSUPPORTED;
    }
    rs->type = IEBIN_ROPE_YARN;
    uint64_t orig;
    if ((rc = get_real(what, "hparams.rope_scaling.factor", json_object_get(o, "factor"),
                       &rs->factor)) ||
        (rc = get_real(what, "hparams.rope_scaling.beta_fast", json_object_get(o, "beta_fast"),
                       &rs->beta_fast)) ||
        (rc = get_real(what, "hparams.rope_scaling.beta_slow", json_object_get(o, "beta_slow"),
                       &rs->beta_slow)) ||
        (rc = get_int(what, "hparams.rope_scaling.original_max_position_embeddings",
                      json_object_get(o, "original_max_position_embeddings"), 1, 1048576,
                      &orig)) ||
        (rc = get_bool(what, "hparams.rope_scaling.truncate", json_object_get(o, "truncate"),
                       &rs->truncate)))
        return rc;
    rs->original_max_position_embeddings = (uint32_t)orig;
    return 0;
}

static int parse_gpt_oss_hparams(const char *what, const json_t *o, struct iebin_hparams *hp)
{
    int rc;
    uint64_t v;
    if ((rc = get_int(what, "hparams.n_experts", json_object_get(o, "n_experts"), 1,
                      IEBIN_MAX_EXPERTS, &v)))
        return rc;
    hp->n_experts = (uint32_t)v;
    if ((rc = get_int(what, "hparams.n_experts_used", json_object_get(o, "n_experts_used"), 1,
                      UINT32_MAX, &v)))
        return rc;
    hp->n_experts_used = (uint32_t)v;
    if (hp->n_experts_used > hp->n_experts) {
        LOG_ERR("%s: hparams.n_experts_used %u is above hparams.n_experts %u", what,
                hp->n_experts_used, hp->n_experts);
        return ERR_RANGE;
    }
    if ((rc = get_int(what, "hparams.sliding_window", json_object_get(o, "sliding_window"), 1,
                      UINT32_MAX, &v)))
        return rc;
    hp->sliding_window = (uint32_t)v;
    if ((rc = parse_layer_types(what, json_object_get(o, "layer_types"), hp)) ||
        (rc = parse_rope_scaling(what, json_object_get(o, "rope_scaling"), &hp->rope_scaling)) ||
        (rc = get_real(what, "hparams.swiglu_limit", json_object_get(o, "swiglu_limit"),
                       &hp->swiglu_limit)) ||
        (rc = get_real(what, "hparams.swiglu_alpha", json_object_get(o, "swiglu_alpha"),
                       &hp->swiglu_alpha)))
        return rc;
    return 0;
}

/* llama and qwen2's optional keys: sliding_window (every layer slides) and
 * rope_freq_factors (head_dim/2 numbers). */
static int parse_dense_hparams(const char *what, const json_t *o, struct iebin_hparams *hp)
{
    int rc;
    uint64_t v;
    char d[48], field[64];
    const json_t *sw = json_object_get(o, "sliding_window");
    if (sw) {
        if ((rc = get_int(what, "hparams.sliding_window", sw, 1, UINT32_MAX, &v)))
            return rc;
        hp->sliding_window = (uint32_t)v;
        iebin_slide_all(hp);
    }
    const json_t *ff = json_object_get(o, "rope_freq_factors");
    if (!ff)
        return 0;
    const uint32_t half = hp->head_dim / 2; /* head_dim <= 1024: half <= 512 */
    if (!json_is_array(ff) || json_array_size(ff) != half) {
        LOG_ERR("%s: hparams.rope_freq_factors is %s; it must be an array of head_dim/2 = %u "
                "numbers",
                what, json_is_array(ff) ? "an array of another length" : jfield_desc(ff, d, sizeof d),
                half);
        return json_is_array(ff) ? ERR_RANGE : ERR_FORMAT;
    }
    hp->rope_scaling.type = IEBIN_ROPE_FREQ_FACTORS;
    for (uint32_t i = 0; i < half; i++) {
        snprintf(field, sizeof field, "hparams.rope_freq_factors[%u]", i);
        if ((rc = get_real(what, field, json_array_get(ff, i), &hp->rope_freq_factors[i])))
            return rc;
    }
    return 0;
}

static int parse_hparams(const char *what, const struct arch_info *a, const json_t *o,
                         struct iebin_hparams *hp)
{
    char field[64], d[48];
    int rc;
    if (!o || !json_is_object(o)) {
        LOG_ERR("%s: hparams is %s, not an object", what, jfield_desc(o, d, sizeof d));
        return ERR_FORMAT;
    }
    memset(hp, 0, sizeof *hp);
    for (size_t i = 0; i < N_HP_FIELDS; i++) {
        const struct hp_field *f = &hp_fields[i];
        snprintf(field, sizeof field, "hparams.%s", f->name);
        uint64_t v;
        if ((rc = get_int(what, field, json_object_get(o, f->name), f->lo, f->hi, &v)) != 0)
            return rc;
        uint32_t v32 = (uint32_t)v;
        memcpy((char *)hp + f->off, &v32, sizeof v32);
    }
    if ((rc = get_real(what, "hparams.rope_theta", json_object_get(o, "rope_theta"),
                       &hp->rope_theta)) ||
        (rc = get_real(what, "hparams.rms_eps", json_object_get(o, "rms_eps"), &hp->rms_eps)) ||
        (rc = get_bool(what, "hparams.tied_embeddings", json_object_get(o, "tied_embeddings"),
                       &hp->tied_embeddings)))
        return rc;
    if (a == ARCH_GPT_OSS) {
        if (json_object_get(o, "rope_freq_factors")) {
            LOG_ERR("%s: hparams.rope_freq_factors is a llama/qwen2 key; gpt_oss scales RoPE "
                    "by YaRN (rope_scaling)",
                    what);
            return ERR_UNSUPPORTED;
        }
        if ((rc = parse_gpt_oss_hparams(what, o, hp)) != 0)
            return rc;
    } else {
        for (size_t i = 0; i < N_GPT_OSS_KEYS; i++)
            if (json_object_get(o, gpt_oss_keys[i])) {
                LOG_ERR("%s: hparams.%s is a gpt_oss key; architecture %s does not "
                        "implement it",
                        what, gpt_oss_keys[i], a->name);
                return ERR_UNSUPPORTED;
            }
        hp->attn_qkv_bias = a == ARCH_QWEN2;
        if ((rc = parse_dense_hparams(what, o, hp)) != 0)
            return rc;
    }
    return iebin_check_hparams(hp, what);
}

/* Names: 1..127 bytes of printable ASCII, so that every message quoting one is readable. */
static int check_name(const char *what, size_t index, const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= IEBIN_NAME_MAX) {
        LOG_ERR("%s: tensors[%zu].name is %zu bytes long, must be 1..%d", what, index, n,
                IEBIN_NAME_MAX - 1);
        return ERR_FORMAT;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c <= 0x20 || c >= 0x7f || c == '\'' || c == '"' || c == '\\') {
            LOG_ERR("%s: tensors[%zu].name contains byte 0x%02x (names are printable ASCII "
                    "without spaces or quotes)",
                    what, index, c);
            return ERR_FORMAT;
        }
    }
    return 0;
}

/* Parses and checks tensors[i] on its own (everything that does not need other tensors). */
static int parse_tensor(const char *what, size_t index, const json_t *o, uint64_t blob_size,
                        struct iebin_tensor *t)
{
    char field[IEBIN_NAME_MAX + 64], d[48];
    int rc;
    if (!json_is_object(o)) {
        LOG_ERR("%s: tensors[%zu] is %s, not an object", what, index, jfield_desc(o, d, sizeof d));
        return ERR_FORMAT;
    }
    const char *name;
    snprintf(field, sizeof field, "tensors[%zu].name", index);
    if ((rc = get_string(what, field, json_object_get(o, "name"), &name)) != 0)
        return rc;
    if ((rc = check_name(what, index, name)) != 0)
        return rc;
    memcpy(t->name, name, strlen(name) + 1);

    const char *dts;
    snprintf(field, sizeof field, "tensor '%s': dtype", name);
    if ((rc = get_string(what, field, json_object_get(o, "dtype"), &dts)) != 0)
        return rc;
    if (dtype_from_name(dts, &t->dtype) != 0) {
        LOG_ERR("%s: tensor '%s': dtype '%s' is unknown (known: f32, f16, bf16, q8_0, q4_0, "
                "q4_g64, q4_g128, q4z_g32, q4z_g64, q4z_g128, mxfp4)",
                what, name, dts);
        return ERR_UNSUPPORTED;
    }

    const json_t *shape = json_object_get(o, "shape");
    if (!shape || !json_is_array(shape)) {
        LOG_ERR("%s: tensor '%s': shape is %s, not an array", what, name,
                jfield_desc(shape, d, sizeof d));
        return ERR_FORMAT;
    }
    size_t nd = json_array_size(shape);
    if (nd < 1 || nd > IEBIN_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': shape has %zu dimensions, must be 1..%d", what, name, nd,
                IEBIN_MAX_DIMS);
        return ERR_FORMAT;
    }
    t->n_dims = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        snprintf(field, sizeof field, "tensor '%s': shape[%zu]", name, i);
        if ((rc = get_int(what, field, json_array_get(shape, i), 1, IEBIN_INT_MAX, &t->shape[i])))
            return rc;
    }
    snprintf(field, sizeof field, "tensor '%s': offset", name);
    if ((rc = get_int(what, field, json_object_get(o, "offset"), 0, IEBIN_INT_MAX, &t->offset)))
        return rc;
    snprintf(field, sizeof field, "tensor '%s': size", name);
    if ((rc = get_int(what, field, json_object_get(o, "size"), 0, IEBIN_INT_MAX, &t->size)))
        return rc;

    char ss[128];
    uint64_t bytes;
    rc = dtype_tensor_bytes(t->dtype, t->shape, t->n_dims, &bytes);
    if (rc == ERR_OVERFLOW) {
        LOG_ERR("%s: tensor '%s': shape %s: the byte size overflows 64 bits", what, name,
                shape_str(t->shape, t->n_dims, ss, sizeof ss));
        return ERR_OVERFLOW;
    }
    if (rc == ERR_FORMAT) {
        LOG_ERR("%s: tensor '%s': shape %s: the last dimension is not a multiple of the %s "
                "block (%u)",
                what, name, shape_str(t->shape, t->n_dims, ss, sizeof ss), dts,
                dtype_info(t->dtype)->block);
        return ERR_FORMAT;
    }
    if (rc != 0) { /* dimensions were checked >= 1 and n_dims 1..4 above */
        LOG_ERR("%s: tensor '%s': shape %s is invalid", what, name,
                shape_str(t->shape, t->n_dims, ss, sizeof ss));
        return rc;
    }
    if (bytes != t->size) {
        LOG_ERR("%s: tensor '%s': size %llu does not match shape %s x %s = %llu bytes", what,
                name, (unsigned long long)t->size, shape_str(t->shape, t->n_dims, ss, sizeof ss),
                dts, (unsigned long long)bytes);
        return ERR_MISMATCH;
    }
    if (t->offset % IEBIN_ALIGN != 0) {
        LOG_ERR("%s: tensor '%s': offset %llu is not a multiple of %d", what, name,
                (unsigned long long)t->offset, IEBIN_ALIGN);
        return ERR_FORMAT;
    }
    uint64_t end;
    if (dtype_add_u64(t->offset, t->size, &end) != 0) {
        LOG_ERR("%s: tensor '%s': offset %llu + size %llu overflows", what, name,
                (unsigned long long)t->offset, (unsigned long long)t->size);
        return ERR_OVERFLOW;
    }
    if (t->offset >= blob_size) {
        LOG_ERR("%s: tensor '%s': offset %llu is beyond the blob (blob.size %llu)", what, name,
                (unsigned long long)t->offset, (unsigned long long)blob_size);
        return ERR_RANGE;
    }
    if (end > blob_size) {
        LOG_ERR("%s: tensor '%s': offset %llu + size %llu = %llu runs past the end of the blob "
                "(blob.size %llu)",
                what, name, (unsigned long long)t->offset, (unsigned long long)t->size,
                (unsigned long long)end, (unsigned long long)blob_size);
        return ERR_RANGE;
    }
    return 0;
}

static int cmp_offset(const void *a, const void *b, void *ctx)
{
    const struct iebin_tensor *ts = ctx;
    const struct iebin_tensor *x = &ts[*(const uint32_t *)a], *y = &ts[*(const uint32_t *)b];
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int check_overlaps(const char *what, const struct iebin_tensor *ts, size_t n)
{
    uint32_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) {
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    qsort_r(order, n, sizeof *order, cmp_offset, (void *)ts);
    int rc = 0;
    for (size_t i = 1; i < n; i++) {
        const struct iebin_tensor *a = &ts[order[i - 1]], *b = &ts[order[i]];
        if (a->offset + a->size > b->offset) { /* no overflow: both checked against the blob */
            LOG_ERR("%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the blob",
                    what, a->name, (unsigned long long)a->offset,
                    (unsigned long long)(a->offset + a->size), b->name,
                    (unsigned long long)b->offset, (unsigned long long)(b->offset + b->size));
            rc = ERR_FORMAT;
            break;
        }
    }
    free(order);
    return rc;
}

/*
 * Parses and validates a manifest as if its blob had `blob_size` bytes (the size stated in the
 * manifest must then equal it). Fills m except dir, tokenizer_path and the data pointers;
 * *has_tokenizer tells whether the manifest references one.
 */
static int parse_manifest(const char *what, const char *blob_what, const char *text, size_t len,
                          uint64_t blob_size, struct iebin_model *m, bool *has_tokenizer)
{
    char d[48];
    int rc;
    json_t *root = NULL;
    bool *seen = NULL;
    if (len > IEBIN_MANIFEST_MAX) {
        LOG_ERR("%s: %zu bytes, larger than the %u-byte limit for a manifest", what, len,
                IEBIN_MANIFEST_MAX);
        return ERR_RANGE;
    }
    json_error_t jerr;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", what, jerr.line, jerr.column,
                jerr.text);
        return ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        LOG_ERR("%s: the manifest is %s, not a JSON object", what, jfield_desc(root, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    const char *s;
    if ((rc = get_string(what, "format", json_object_get(root, "format"), &s)) != 0)
        goto out;
    if (strcmp(s, "iebin") != 0) {
        LOG_ERR("%s: format is \"%.64s\", not \"iebin\"", what, s);
        rc = ERR_FORMAT;
        goto out;
    }
    const json_t *ver = json_object_get(root, "version");
    if (!ver || !json_is_integer(ver)) {
        LOG_ERR("%s: version is %s, not an integer", what, jfield_desc(ver, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    if (json_integer_value(ver) != IEBIN_VERSION) {
        LOG_ERR("%s: version %lld is not supported (this build reads IEBIN version %d)", what,
                (long long)json_integer_value(ver), IEBIN_VERSION);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    if ((rc = get_string(what, "architecture", json_object_get(root, "architecture"), &s)) != 0)
        goto out;
    const struct arch_info *arch = arch_by_name(s);
    if (!arch) {
        LOG_ERR("%s: architecture '%.64s' is not supported (known: " KNOWN_ARCHES ")", what, s);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(m->arch, sizeof m->arch, "%s", s);
    const json_t *name = json_object_get(root, "name");
    if (name && !json_is_null(name) && !json_is_string(name)) {
        LOG_ERR("%s: name is %s, not a string", what, jfield_desc(name, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    m->name = strdup(name && json_is_string(name) ? json_string_value(name) : "");
    if (!m->name) {
        rc = -ENOMEM;
        LOG_ERR("%s: out of memory", what);
        goto out;
    }
    if ((rc = parse_hparams(what, arch, json_object_get(root, "hparams"), &m->hp)) != 0)
        goto out;

    const json_t *tok = json_object_get(root, "tokenizer");
    *has_tokenizer = tok && !json_is_null(tok);
    if (*has_tokenizer &&
        (!json_is_string(tok) || strcmp(json_string_value(tok), IEBIN_TOKENIZER) != 0)) {
        LOG_ERR("%s: tokenizer is %s; it must be null or \"" IEBIN_TOKENIZER "\"", what,
                jfield_desc(tok, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }

    const json_t *blob = json_object_get(root, "blob");
    if (!blob || !json_is_object(blob)) {
        LOG_ERR("%s: blob is %s, not an object", what, jfield_desc(blob, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    if ((rc = get_string(what, "blob.file", json_object_get(blob, "file"), &s)) != 0)
        goto out;
    if (strcmp(s, IEBIN_BLOB) != 0) { /* never a path: a manifest must not point elsewhere */
        LOG_ERR("%s: blob.file is \"%.64s\"; it must be \"" IEBIN_BLOB "\"", what, s);
        rc = ERR_FORMAT;
        goto out;
    }
    uint64_t stated;
    if ((rc = get_int(what, "blob.size", json_object_get(blob, "size"), 0, IEBIN_INT_MAX,
                      &stated)) != 0)
        goto out;

    const json_t *tensors = json_object_get(root, "tensors");
    if (!tensors || !json_is_array(tensors)) {
        LOG_ERR("%s: tensors is %s, not an array", what, jfield_desc(tensors, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    /* Every accepted entry fills a distinct slot, so n_slots bounds the allocation whatever
     * the array's length (a 64 MB array of {} cannot make us allocate gigabytes). */
    size_t ns = n_slots(arch, &m->hp);
    size_t n = json_array_size(tensors);
    size_t cap = n < ns ? n : ns;
    m->tensors = calloc(cap ? cap : 1, sizeof *m->tensors);
    m->slot_index_ = malloc(ns * sizeof *m->slot_index_);
    seen = calloc(ns, sizeof *seen);
    if (!m->tensors || !m->slot_index_ || !seen) {
        LOG_ERR("%s: out of memory for %zu tensors", what, cap);
        rc = -ENOMEM;
        goto out;
    }
    m->n_slots_ = ns;
    for (size_t slot = 0; slot < ns; slot++)
        m->slot_index_[slot] = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        struct iebin_tensor t;
        memset(&t, 0, sizeof t);
        if ((rc = parse_tensor(what, i, json_array_get(tensors, i), stated, &t)) != 0)
            goto out;
        long slot;
        if ((rc = check_arch_tensor(what, arch, &m->hp, t.name, t.dtype, t.shape, t.n_dims, &slot)))
            goto out;
        if (seen[slot]) {
            LOG_ERR("%s: tensor '%s' is listed twice (tensors[%u] and tensors[%zu]): duplicate "
                    "name",
                    what, t.name, m->slot_index_[slot], i);
            rc = ERR_FORMAT;
            goto out;
        }
        seen[slot] = true;
        m->slot_index_[slot] = (uint32_t)m->n_tensors;
        m->tensors[m->n_tensors++] = t;
    }
    size_t n_missing = 0, first_missing = 0;
    for (size_t slot = ns; slot-- > 0;) {
        if (!seen[slot] && !(slot == SLOT_OUTPUT && m->hp.tied_embeddings))
            n_missing++, first_missing = slot;
    }
    if (n_missing) {
        char nm[IEBIN_NAME_MAX], more[48] = "";
        slot_name(arch, first_missing, nm, sizeof nm);
        if (n_missing > 1)
            snprintf(more, sizeof more, "; %zu more missing", n_missing - 1);
        LOG_ERR("%s: tensor '%s' is missing (architecture %s, %u layers%s%s)", what, nm,
                arch->name, m->hp.n_layers,
                first_missing == SLOT_OUTPUT ? ", tied_embeddings false" : "", more);
        rc = ERR_NOT_FOUND;
        goto out;
    }
    if ((rc = check_overlaps(what, m->tensors, m->n_tensors)) != 0)
        goto out;
    if (blob_size != stated) {
        LOG_ERR("%s: %llu bytes, but the manifest's blob.size is %llu%s", blob_what,
                (unsigned long long)blob_size, (unsigned long long)stated,
                blob_size < stated ? " (truncated)" : "");
        rc = blob_size < stated ? ERR_TRUNCATED : ERR_MISMATCH;
        goto out;
    }
    rc = 0;
out:
    free(seen);
    json_decref(root);
    return rc;
}

/* ---- opening ---- */

static void model_free(struct iebin_model *m)
{
    if (!m)
        return;
    if (m->map)
        munmap(m->map, m->map_size);
    free(m->dir);
    free(m->name);
    free(m->tensors);
    free(m->tokenizer_path);
    free(m->slot_index_);
    free(m);
}

void iebin_close(struct iebin_model *m) { model_free(m); }

int iebin_check_manifest(const char *label, const char *manifest, size_t manifest_len,
                         uint64_t blob_size)
{
    struct iebin_model *m = calloc(1, sizeof *m);
    if (!m) {
        LOG_ERR("%s: out of memory", label);
        return -ENOMEM;
    }
    bool has_tok;
    int rc = parse_manifest(label, IEBIN_BLOB, manifest, manifest_len, blob_size, m, &has_tok);
    model_free(m);
    return rc;
}

int iebin_open_mem(const char *label, const void *manifest, size_t manifest_len, const void *blob,
                   size_t blob_len, struct iebin_model **out)
{
    *out = NULL;
    struct iebin_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(label))) {
        LOG_ERR("%s: out of memory", label);
        free(m);
        return -ENOMEM;
    }
    bool has_tok;
    int rc = parse_manifest(label, IEBIN_BLOB, manifest, manifest_len, blob_len, m, &has_tok);
    if (rc != 0) {
        model_free(m);
        return rc;
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        m->tensors[i].data = (const char *)blob + m->tensors[i].offset;
    *out = m;
    return 0;
}

int iebin_open_ex(const char *dir, unsigned flags, struct iebin_model **out)
{
    int rc;
    int fd = -1;
    char *text = NULL, *mpath = NULL, *bpath = NULL;
    size_t len = 0;
    struct iebin_model *m = NULL;
    *out = NULL;

    mpath = path_join(dir, IEBIN_MANIFEST);
    bpath = path_join(dir, IEBIN_BLOB);
    m = calloc(1, sizeof *m);
    if (!mpath || !bpath || !m) {
        LOG_ERR("%s: out of memory", dir);
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = fmap_read(mpath, "manifest", IEBIN_MANIFEST_MAX, &text, &len)) != 0)
        goto fail;

    /* The blob's size is needed to validate; its contents are not, so map only afterwards. */
    fd = open(bpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        LOG_ERR("%s: cannot open the blob: %s", bpath, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        LOG_ERR("%s: fstat failed: %s", bpath, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERR("%s: not a regular file", bpath);
        rc = ERR_FORMAT;
        goto fail;
    }
    bool has_tok;
    if ((rc = parse_manifest(mpath, bpath, text, len, (uint64_t)st.st_size, m, &has_tok)) != 0)
        goto fail;

    char *abs = realpath(dir, NULL);
    if (!abs) {
        rc = -errno;
        LOG_ERR("%s: realpath failed: %s", dir, strerror(errno));
        goto fail;
    }
    m->dir = abs;
    if (has_tok) {
        if (!(m->tokenizer_path = path_join(abs, IEBIN_TOKENIZER))) {
            LOG_ERR("%s: out of memory", dir);
            rc = -ENOMEM;
            goto fail;
        }
        if (access(m->tokenizer_path, R_OK) != 0) {
            rc = -errno;
            LOG_ERR("%s: the manifest references it but it cannot be read: %s",
                    m->tokenizer_path, strerror(errno));
            goto fail;
        }
    }

    if (st.st_size > 0) {
        /* MAP_PRIVATE + PROT_READ: pages are never written, so they stay the page cache's own
         * pages, shared by every process that maps the file (no private copies). The model is
         * read at load time instead of on the first request (docs/IEBIN.md), after
         * MADV_HUGEPAGE: a file not yet cached then comes in as 2 MiB folios mapped by 2 MiB
         * entries, and a token's weight stream walks 512× fewer page-table entries (4.5×
         * decode on gpt-oss-20b, docs/PERFORMANCE.md). Both advices are hints: a kernel
         * without them (EINVAL) falls back to MAP_POPULATE's 4 KiB reads. */
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = -errno;
            LOG_ERR("%s: mmap of %lld bytes failed: %s", bpath, (long long)st.st_size,
                    strerror(errno));
            goto fail;
        }
        if (!(flags & IEBIN_OPEN_LAZY)) {
            (void)madvise(map, (size_t)st.st_size, MADV_HUGEPAGE);
            if (madvise(map, (size_t)st.st_size, IEBIN_MADV_POPULATE_READ) != 0) {
                /* older kernels: touch every page the way MAP_POPULATE would have */
                const volatile char *p = map;
                for (size_t off = 0; off < (size_t)st.st_size; off += 4096)
                    (void)p[off];
            }
        }
        m->map = map;
        m->map_size = (size_t)st.st_size;
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        m->tensors[i].data = (const char *)m->map + m->tensors[i].offset;
    close(fd);
    free(text);
    free(mpath);
    free(bpath);
    *out = m;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    free(text);
    free(mpath);
    free(bpath);
    model_free(m);
    return rc;
}

int iebin_open(const char *dir, struct iebin_model **out) { return iebin_open_ex(dir, 0, out); }

const struct iebin_tensor *iebin_find(const struct iebin_model *m, const char *name)
{
    long slot = name_slot(hp_arch(&m->hp), &m->hp, name);
    if (slot < 0 || (size_t)slot >= m->n_slots_)
        return NULL;
    uint32_t i = m->slot_index_[slot];
    return i < m->n_tensors ? &m->tensors[i] : NULL;
}
