/*
 * test_convert_gpt_oss.c — gpt-oss through `clocher synth` and `clocher convert` (the library):
 *  - the Hugging Face and GGUF files synth writes for the same weights convert to the same
 *    IEBIN, manifest and blob byte for byte;
 *  - what the IEBIN holds is what the checkpoint means, decoded here independently from the
 *    spec (../shared/specs/gpt-oss.md §4: HF nibbles 2i/2i+1, GGUF j/j+16, FP4 table, E8M0):
 *    experts de-interleaved (gate = even rows), q/k rows and biases in IEBIN's pair order,
 *    sinks and biases as f32 of the same values;
 *  - bad input is refused at conversion with a message naming it, each case its own check:
 *    truncated _scales, a _blocks tensor with the wrong block count, an E8M0 byte 255 (HF and
 *    GGUF), a missing sinks tensor, experts_per_token above num_local_experts, an unknown
 *    layer_types entry, an index naming a missing shard, unknown rope_scaling keys, missing
 *    GGUF keys.
 * Everything runs on the small preset (a few MB).
 */
#include "testutil.h"

#include "convert.h"
#include "err.h"
#include "gguf.h"
#include "half.h"
#include "iebin.h"
#include "safetensors.h"
#include "synth.h"

#include <jansson.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 1000

/* ---- fixtures ---- */

static char *g_root;            /* temp dir for the session */
static char g_hf[4096];         /* the pristine synth output */
static char g_gguf[4096];
static char g_ref[4096];        /* its IEBIN conversion (from HF) */

static int convert_to(const char *src, const char *out)
{
    struct convert_opts o = {0};
    return convert_model(src, out, &o, NULL);
}

static int setup(void **state)
{
    (void)state;
    g_root = tu_mkdtemp();
    snprintf(g_hf, sizeof g_hf, "%s/hf", g_root);
    snprintf(g_gguf, sizeof g_gguf, "%s/m.gguf", g_root);
    snprintf(g_ref, sizeof g_ref, "%s/ref", g_root);
    struct synth_opts so = {.preset = "gpt-oss-tiny", .seed = 7, .vocab = VOCAB, .gguf = g_gguf};
    if (synth_model(g_hf, &so) != 0 || convert_to(g_hf, g_ref) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_root);
    free(g_root);
    return 0;
}

/* A fresh copy of the synth output at dir (cp -r), to be spoiled. */
static void copy_hf(const char *dir)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, g_hf, dir);
    assert_int_equal(system(cmd), 0);
}

static void expect_fail(const char *src, int rc, const char *n1, const char *n2)
{
    char out[4200];
    snprintf(out, sizeof out, "%s/fail_out", g_root);
    enum convert_fault fault;
    struct convert_opts o = {0};
    tu_log_capture_begin();
    int got = convert_model(src, out, &o, &fault);
    if (got != rc)
        fail_msg("%s: rc %d (%s), expected %d (%s); log: %s", src, got, err_name(got), rc,
                 err_name(rc), tu_log_captured());
    assert_int_equal(fault, CONVERT_FAULT_SOURCE);
    tu_assert_log_contains(n1, n2, NULL);
    tu_log_capture_end();
    assert_int_not_equal(access(tu_path(out, IEBIN_MANIFEST), F_OK), 0);
}

/* ---- editing a Hugging Face directory ---- */

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *r = json_load_file(path, 0, &e);
    if (!r)
        fail_msg("%s: %s", path, e.text);
    return r;
}

static void save_json(const char *path, json_t *r)
{
    assert_int_equal(json_dump_file(r, path, JSON_INDENT(2)), 0);
    json_decref(r);
}

/* Sets config key (a JSON text value) or deletes it (value NULL). */
static void edit_config(const char *dir, const char *key, const char *value)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *r = load_json(path);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(r, key, v);
    } else {
        json_object_del(r, key);
    }
    save_json(path, r);
}

enum spoil { SP_SHORT_SCALES, SP_FEWER_BLOCKS, SP_NAN_SCALE, SP_DROP };

/*
 * Rewrites the shard holding tensor `name` with that tensor spoiled: its last-but-one (blocks)
 * or last (scales) dimension one short, one E8M0 byte 255, or the tensor dropped (and removed
 * from the index, so only the converter notices).
 */
static void spoil_tensor(const char *dir, const char *name, enum spoil how)
{
    char ipath[4200], spath[4200], tmp[4300];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    json_t *idx = load_json(ipath);
    json_t *map = json_object_get(idx, "weight_map");
    const char *shard = json_string_value(json_object_get(map, name));
    assert_non_null(shard);
    snprintf(spath, sizeof spath, "%s/%s", dir, shard);
    snprintf(tmp, sizeof tmp, "%s.new", spath);
    struct safetensors_file *f;
    assert_int_equal(safetensors_open(spath, &f), 0);
    struct safetensors_writer *w;
    assert_int_equal(safetensors_writer_create(tmp, &w), 0);
    uint8_t *copy = NULL;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        uint64_t shape[SAFETENSORS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        const void *data = t->data;
        uint64_t size = t->size;
        if (strcmp(t->name, name) == 0) {
            if (how == SP_DROP)
                continue;
            if (how == SP_NAN_SCALE) {
                copy = malloc(size);
                memcpy(copy, data, size);
                copy[size / 2] = 255;
                data = copy;
            } else {
                int d = how == SP_FEWER_BLOCKS ? t->n_dims - 2 : t->n_dims - 1;
                size = size / shape[d] * (shape[d] - 1);
                shape[d]--;
            }
        }
        assert_int_equal(safetensors_writer_add(w, t->name, t->dtype, shape, t->n_dims, data,
                                                size),
                         0);
    }
    assert_int_equal(safetensors_writer_finish(w), 0);
    free(copy);
    safetensors_close(f);
    assert_int_equal(rename(tmp, spath), 0);
    if (how == SP_DROP) {
        json_object_del(map, name);
        save_json(ipath, idx);
    } else {
        json_decref(idx);
    }
}

/* ---- HF and GGUF give the same IEBIN ---- */

/* The manifest without its "name" (the source's file name). */
static char *manifest_unnamed(const char *dir)
{
    json_t *r = load_json(tu_path(dir, IEBIN_MANIFEST));
    json_object_del(r, "name");
    char *s = json_dumps(r, JSON_SORT_KEYS);
    json_decref(r);
    return s;
}

static void test_hf_and_gguf_identical(void **state)
{
    (void)state;
    char out[4200];
    snprintf(out, sizeof out, "%s/from_gguf", g_root);
    assert_int_equal(convert_to(g_gguf, out), 0);
    size_t la, lb;
    char *a = tu_read_file(tu_path(g_ref, IEBIN_BLOB), &la);
    char *b = tu_read_file(tu_path(out, IEBIN_BLOB), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    char *ma = manifest_unnamed(g_ref), *mb = manifest_unnamed(out);
    assert_string_equal(ma, mb);
    free(ma);
    free(mb);

    /* and it is the preset: every structural feature */
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_ref, &m), 0);
    assert_string_equal(m->arch, "gpt_oss");
    assert_int_equal(m->hp.dim, 128);
    assert_int_equal(m->hp.n_layers, 4);
    assert_int_equal(m->hp.n_experts, 8);
    assert_int_equal(m->hp.n_experts_used, 4);
    assert_int_equal(m->hp.sliding_window, 16);
    assert_int_equal(m->hp.vocab_size, VOCAB);
    assert_true(iebin_layer_slides(&m->hp, 0) && !iebin_layer_slides(&m->hp, 1));
    assert_true(iebin_layer_slides(&m->hp, 2) && !iebin_layer_slides(&m->hp, 3));
    assert_int_equal(m->hp.rope_scaling.type, IEBIN_ROPE_YARN);
    assert_false(m->hp.rope_scaling.truncate);
    assert_true(m->hp.rope_scaling.factor == 32.0f && m->hp.rope_scaling.beta_fast == 32.0f &&
                m->hp.rope_scaling.beta_slow == 1.0f);
    assert_int_equal(m->hp.rope_scaling.original_max_position_embeddings, 4096);
    assert_true(m->hp.swiglu_limit == 7.0f && m->hp.swiglu_alpha == 1.702f);
    assert_false(m->hp.tied_embeddings);
    assert_int_equal(iebin_find(m, "blk.3.ffn_down_exps")->dtype, DT_MXFP4);
    assert_int_equal(iebin_find(m, "blk.0.attn_q")->dtype, DT_BF16);
    assert_int_equal(iebin_find(m, "blk.0.attn_sinks")->dtype, DT_F32);
    iebin_close(m);
}

/* ---- the IEBIN means what the checkpoint means ---- */

static const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

static float e8m0(uint8_t e) { return ldexpf(1.0f, (int)e - 127); }

/* Element k of HF MXFP4 row `row` (blocks [rows][nb][16], scales [rows][nb]). */
static float hf_mx(const struct safetensors_tensor *b, const struct safetensors_tensor *s,
                   uint64_t row, uint64_t k)
{
    uint64_t nb = b->shape[2];
    const uint8_t *blk = (const uint8_t *)b->data + (row * nb + k / 32) * 16;
    uint8_t byte = blk[(k % 32) / 2];
    uint8_t code = (k % 2) ? byte >> 4 : byte & 15;
    return fp4[code] * e8m0(((const uint8_t *)s->data)[row * nb + k / 32]);
}

/* Element k of IEBIN (GGUF block_mxfp4) row `row` of a [..][cols] tensor. */
static float ie_mx(const struct iebin_tensor *t, uint64_t row, uint64_t k)
{
    uint64_t nb = t->shape[t->n_dims - 1] / 32;
    const uint8_t *blk = (const uint8_t *)t->data + (row * nb + k / 32) * 17;
    uint64_t j = k % 32;
    uint8_t code = j < 16 ? blk[1 + j] & 15 : blk[1 + j - 16] >> 4;
    return fp4[code] * e8m0(blk[0]);
}

static float hf_bf16(const struct safetensors_tensor *t, uint64_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + i * 2, 2);
    return half_bf16_to_f32(h);
}

static float ie_f32(const struct iebin_tensor *t, uint64_t i)
{
    return ((const float *)t->data)[i];
}

static uint16_t ie_bf16_bits(const struct iebin_tensor *t, uint64_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + i * 2, 2);
    return h;
}

static void test_semantics(void **state)
{
    (void)state;
    struct safetensors_set *set;
    assert_int_equal(safetensors_set_open(g_hf, &set), 0);
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_ref, &m), 0);
    const struct iebin_hparams *hp = &m->hp;
    uint64_t E = hp->n_experts, F = hp->ffn_dim, D = hp->dim, hd = hp->head_dim;
    for (uint32_t l = 0; l < hp->n_layers; l += 3) {
        char n[160];
#define HF(s_) (snprintf(n, sizeof n, "model.layers.%u." s_, l), safetensors_set_find(set, n))
#define IE(s_) (snprintf(n, sizeof n, "blk.%u." s_, l), iebin_find(m, n))
        const struct safetensors_tensor *gb = HF("mlp.experts.gate_up_proj_blocks"),
                                        *gs = HF("mlp.experts.gate_up_proj_scales"),
                                        *db = HF("mlp.experts.down_proj_blocks"),
                                        *ds = HF("mlp.experts.down_proj_scales"),
                                        *gub = HF("mlp.experts.gate_up_proj_bias"),
                                        *qw = HF("self_attn.q_proj.weight"),
                                        *qb = HF("self_attn.q_proj.bias"),
                                        *kb = HF("self_attn.k_proj.bias"),
                                        *sk = HF("self_attn.sinks");
        assert_non_null(gb && gs && db && ds && gub && qw && qb && kb && sk);
        const struct iebin_tensor *gate = IE("ffn_gate_exps"), *up = IE("ffn_up_exps"),
                                  *down = IE("ffn_down_exps"), *gbias = IE("ffn_gate_exps_bias"),
                                  *ubias = IE("ffn_up_exps_bias"), *q = IE("attn_q"),
                                  *qbias = IE("attn_q_bias"), *kbias = IE("attn_k_bias"),
                                  *sinks = IE("attn_sinks");
        /* gate = even rows of gate_up, up = odd rows: every element, both scales */
        for (uint64_t e = 0; e < E; e++)
            for (uint64_t f = 0; f < F; f++)
                for (uint64_t k = 0; k < D; k++) {
                    assert_true(ie_mx(gate, e * F + f, k) == hf_mx(gb, gs, e * 2 * F + 2 * f, k));
                    assert_true(ie_mx(up, e * F + f, k) == hf_mx(gb, gs, e * 2 * F + 2 * f + 1, k));
                }
        for (uint64_t r = 0; r < E * D; r++)
            for (uint64_t k = 0; k < F; k++)
                assert_true(ie_mx(down, r, k) == hf_mx(db, ds, r, k));
        for (uint64_t e = 0; e < E; e++)
            for (uint64_t f = 0; f < F; f++) {
                assert_true(ie_f32(gbias, e * F + f) == hf_bf16(gub, e * 2 * F + 2 * f));
                assert_true(ie_f32(ubias, e * F + f) == hf_bf16(gub, e * 2 * F + 2 * f + 1));
            }
        /* q/k: IEBIN row (element) h*hd + 2i + s is HF's h*hd + s*hd/2 + i */
        for (uint64_t r = 0; r < (uint64_t)hp->n_heads * hd; r++) {
            uint64_t h = r / hd, j = r % hd, src = h * hd + (j % 2) * (hd / 2) + j / 2;
            assert_true(ie_f32(qbias, r) == hf_bf16(qb, src));
            for (uint64_t k = 0; k < D; k++)
                assert_int_equal(ie_bf16_bits(q, r * D + k),
                                 ((const uint16_t *)qw->data)[src * D + k]);
        }
        for (uint64_t r = 0; r < (uint64_t)hp->n_kv_heads * hd; r++) {
            uint64_t h = r / hd, j = r % hd, src = h * hd + (j % 2) * (hd / 2) + j / 2;
            assert_true(ie_f32(kbias, r) == hf_bf16(kb, src));
        }
        for (uint64_t h = 0; h < hp->n_heads; h++)
            assert_true(ie_f32(sinks, h) == hf_bf16(sk, h));
#undef HF
#undef IE
    }
    /* random values, not zeros: the checks above would pass on an all-zero model */
    const struct iebin_tensor *s0 = iebin_find(m, "blk.0.attn_sinks");
    assert_true(ie_f32(s0, 0) != 0.0f && ie_f32(s0, 0) != ie_f32(s0, 1));
    /* scales in the fan-in range of spec §4.6 (c = 122 at 128 inputs) */
    const struct iebin_tensor *g0 = iebin_find(m, "blk.0.ffn_gate_exps"),
                              *d0 = iebin_find(m, "blk.0.ffn_down_exps");
    for (uint64_t b = 0; b < g0->size / 17; b++) {
        uint8_t eg = ((const uint8_t *)g0->data)[b * 17], ed = ((const uint8_t *)d0->data)[b * 17];
        assert_true(eg >= 121 && eg <= 123);
        assert_true(ed >= 120 && ed <= 122);
    }
    iebin_close(m);
    safetensors_set_close(set);
}

/* The 20b preset's numbers are the spec's (§1a), and its MXFP4 scales §4.6's ranges. */
static void test_preset_20b_hparams(void **state)
{
    (void)state;
    struct iebin_hparams hp;
    enum dtype dt;
    assert_int_equal(synth_preset("gpt-oss-20b", &hp, &dt), 0);
    assert_int_equal(hp.dim, 2880);
    assert_int_equal(hp.n_layers, 24);
    assert_int_equal(hp.n_heads, 64);
    assert_int_equal(hp.n_kv_heads, 8);
    assert_int_equal(hp.head_dim, 64);
    assert_int_equal(hp.ffn_dim, 2880);
    assert_int_equal(hp.vocab_size, 201088);
    assert_int_equal(hp.n_experts, 32);
    assert_int_equal(hp.n_experts_used, 4);
    assert_int_equal(hp.sliding_window, 128);
    assert_int_equal(hp.max_seq_len, 131072);
    assert_true(hp.rope_theta == 150000.0f);
    assert_int_equal(dt, DT_BF16);
    for (uint32_t l = 0; l < 24; l++)
        assert_int_equal(iebin_layer_slides(&hp, l), l % 2 == 0);
    assert_int_equal(iebin_check_hparams(&hp, "20b"), 0);
}

/* config.json is the release's (§1a) field for field, at the small preset's numbers */
static void test_config_fields(void **state)
{
    (void)state;
    json_t *c = load_json(tu_path(g_hf, "config.json"));
    assert_string_equal(json_string_value(json_object_get(c, "model_type")), "gpt_oss");
    assert_string_equal(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
                        "GptOssForCausalLM");
    json_t *rs = json_object_get(c, "rope_scaling");
    assert_string_equal(json_string_value(json_object_get(rs, "rope_type")), "yarn");
    assert_true(json_is_false(json_object_get(rs, "truncate")));
    assert_true(json_number_value(json_object_get(rs, "factor")) == 32.0);
    assert_int_equal(json_integer_value(json_object_get(c, "num_local_experts")), 8);
    assert_int_equal(json_integer_value(json_object_get(c, "experts_per_token")), 4);
    assert_int_equal(json_integer_value(json_object_get(c, "num_experts_per_tok")), 4);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "quantization_config"),
                                                          "quant_method")),
                        "mxfp4");
    assert_int_equal(json_array_size(json_object_get(c, "layer_types")), 4);
    assert_true(json_is_true(json_object_get(c, "attention_bias")));
    json_decref(c);
    json_t *idx = load_json(tu_path(g_hf, "model.safetensors.index.json"));
    json_t *map = json_object_get(idx, "weight_map");
    assert_string_equal(json_string_value(json_object_get(map, "lm_head.weight")),
                        "model-00002-of-00002.safetensors");
    assert_string_equal(json_string_value(json_object_get(map, "model.embed_tokens.weight")),
                        "model-00001-of-00002.safetensors");
    assert_non_null(json_object_get(map, "model.layers.3.mlp.experts.down_proj_scales"));
    json_decref(idx);
}

/* --dtype applies to attention, router, embedding and unembedding; experts stay mxfp4 bit for
 * bit, biases/sinks/norms f32; the same from the HF directory and from the IEBIN model */
static void test_dtype_choice(void **state)
{
    (void)state;
    char out[4200], out2[4200];
    snprintf(out, sizeof out, "%s/int8", g_root);
    snprintf(out2, sizeof out2, "%s/int8_from_iebin", g_root);
    struct convert_opts o = {.dtype_set = true, .dtype = DT_Q8_0};
    assert_int_equal(convert_model(g_hf, out, &o, NULL), 0);
    assert_int_equal(convert_model(g_ref, out2, &o, NULL), 0);
    struct iebin_model *m, *ref, *m2;
    assert_int_equal(iebin_open(out, &m), 0);
    assert_int_equal(iebin_open(g_ref, &ref), 0);
    assert_int_equal(iebin_open(out2, &m2), 0);
    static const char *const q8[] = {"tok_embd", "output", "blk.0.attn_q", "blk.2.attn_o",
                                     "blk.1.ffn_router"};
    for (size_t i = 0; i < sizeof q8 / sizeof q8[0]; i++)
        assert_int_equal(iebin_find(m, q8[i])->dtype, DT_Q8_0);
    static const char *const same[] = {"blk.0.ffn_gate_exps", "blk.3.ffn_down_exps",
                                       "blk.1.attn_sinks", "blk.2.ffn_up_exps_bias",
                                       "blk.0.attn_q_bias", "output_norm"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const struct iebin_tensor *a = iebin_find(m, same[i]), *b = iebin_find(ref, same[i]);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->size, b->size);
        assert_memory_equal(a->data, b->data, a->size);
    }
    for (size_t i = 0; i < m->n_tensors; i++) { /* HF and IEBIN sources agree */
        const struct iebin_tensor *a = &m->tensors[i], *b = iebin_find(m2, a->name);
        assert_int_equal(a->dtype, b->dtype);
        assert_memory_equal(a->data, b->data, a->size);
    }
    iebin_close(m);
    iebin_close(m2);
    iebin_close(ref);
}

/* truncate absent: HF's default, true; then the manifest says so */
static void test_truncate_default(void **state)
{
    (void)state;
    char hf[4200], out[4200];
    snprintf(hf, sizeof hf, "%s/trunc", g_root);
    snprintf(out, sizeof out, "%s/trunc_out", g_root);
    copy_hf(hf);
    edit_config(hf, "rope_scaling",
                "{\"rope_type\": \"yarn\", \"factor\": 32.0, \"beta_fast\": 32.0, "
                "\"beta_slow\": 1.0, \"original_max_position_embeddings\": 4096}");
    assert_int_equal(convert_to(hf, out), 0);
    struct iebin_model *m;
    assert_int_equal(iebin_open(out, &m), 0);
    assert_true(m->hp.rope_scaling.truncate);
    iebin_close(m);
}

/* ---- bad input ---- */

static void test_bad_mxfp4(void **state)
{
    (void)state;
    char hf[4200];
    snprintf(hf, sizeof hf, "%s/bad", g_root);
    copy_hf(hf);
    spoil_tensor(hf, "model.layers.1.mlp.experts.gate_up_proj_scales", SP_SHORT_SCALES);
    expect_fail(hf, ERR_MISMATCH, "'model.layers.1.mlp.experts.gate_up_proj_scales' is U8 [8, 256, 3]",
                "one E8M0 scale per block");

    copy_hf(hf);
    spoil_tensor(hf, "model.layers.2.mlp.experts.down_proj_blocks", SP_FEWER_BLOCKS);
    expect_fail(hf, ERR_MISMATCH,
                "'model.layers.2.mlp.experts.down_proj_blocks' has 3 blocks of 32 per row",
                "expected 4");

    copy_hf(hf);
    spoil_tensor(hf, "model.layers.0.mlp.experts.down_proj_scales", SP_NAN_SCALE);
    expect_fail(hf, ERR_RANGE, "bad: tensor 'model.layers.0.mlp.experts.down_proj_scales': row",
                "E8M0 scale byte 255 (NaN)");

    copy_hf(hf);
    spoil_tensor(hf, "model.layers.3.self_attn.sinks", SP_DROP);
    expect_fail(hf, ERR_NOT_FOUND, "tensor 'model.layers.3.self_attn.sinks' is missing", hf);

    copy_hf(hf);
    spoil_tensor(hf, "model.layers.2.mlp.experts.gate_up_proj_blocks", SP_DROP);
    expect_fail(hf, ERR_NOT_FOUND, "'model.layers.2.mlp.experts.gate_up_proj_blocks' is missing",
                hf);
}

static void test_bad_config(void **state)
{
    (void)state;
    char hf[4200];
    snprintf(hf, sizeof hf, "%s/badcfg", g_root);
    static const struct {
        const char *key, *value;
        int rc;
        const char *n1, *n2;
    } cases[] = {
        {"experts_per_token", "9", ERR_FORMAT, "num_experts_per_tok 4 and experts_per_token 9",
         "disagree"},
        {"layer_types",
         "[\"sliding_attention\", \"full_attention\", \"chunked_attention\", \"full_attention\"]",
         ERR_UNSUPPORTED, "layer_types[2] is \"chunked_attention\"", "unknown layer type"},
        {"layer_types", "[\"sliding_attention\"]", ERR_FORMAT, "layer_types must be an array",
         "(4)"},
        {"rope_scaling",
         "{\"rope_type\": \"yarn\", \"factor\": 32.0, \"original_max_position_embeddings\": 4096, "
         "\"mscale\": 1.0}",
         ERR_UNSUPPORTED, "rope_scaling.mscale is not implemented", "known:"},
        {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2.0}", ERR_UNSUPPORTED,
         "rope_scaling.rope_type linear", "only \"yarn\""},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 32.0}", ERR_FORMAT,
         "missing key 'rope_scaling.original_max_position_embeddings'", "config.json"},
        {"rope_scaling", NULL, ERR_UNSUPPORTED, "rope_scaling is missing", "YaRN"},
        {"sliding_window", NULL, ERR_FORMAT, "missing key 'sliding_window'", "config.json"},
        {"num_local_experts", NULL, ERR_FORMAT, "missing key 'num_local_experts'", "config.json"},
        {"attention_bias", "false", ERR_UNSUPPORTED, "attention_bias is not true", "gpt_oss"},
        {"quantization_config", "{\"quant_method\": \"fp8\"}", ERR_UNSUPPORTED,
         "quant_method fp8", "mxfp4"},
        {"hidden_act", "\"gelu\"", ERR_UNSUPPORTED, "hidden_act gelu", "silu"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_hf(hf);
        edit_config(hf, cases[i].key, cases[i].value);
        expect_fail(hf, cases[i].rc, cases[i].n1, cases[i].n2);
    }
    /* above the expert count, both spellings agreeing */
    copy_hf(hf);
    edit_config(hf, "experts_per_token", "9");
    edit_config(hf, "num_experts_per_tok", "9");
    expect_fail(hf, ERR_RANGE, "num_experts_per_tok 9 is above num_local_experts 8", hf);
    copy_hf(hf);
    edit_config(hf, "num_experts_per_tok", NULL);
    edit_config(hf, "experts_per_token", "12");
    expect_fail(hf, ERR_RANGE, "experts_per_token 12 is above num_local_experts 8", hf);
}

static void test_bad_index(void **state)
{
    (void)state;
    char hf[4200], ipath[4300];
    snprintf(hf, sizeof hf, "%s/badidx", g_root);
    copy_hf(hf);
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", hf);
    json_t *idx = load_json(ipath);
    json_object_set_new(json_object_get(idx, "weight_map"), "model.layers.1.self_attn.sinks",
                        json_string("model-00003-of-00002.safetensors"));
    save_json(ipath, idx);
    expect_fail(hf, ERR_NOT_FOUND, "shard 'model-00003-of-00002.safetensors' named in weight_map",
                "does not exist");
    /* a shard removed from under its index */
    copy_hf(hf);
    unlink(tu_path(hf, "model-00002-of-00002.safetensors"));
    expect_fail(hf, ERR_NOT_FOUND, "shard 'model-00002-of-00002.safetensors'", "does not exist");
}

/* ---- GGUF bad input ---- */

/* Copies g_gguf to path without key `skip` (NULL: all keys) and, when nan_tensor is set, with
 * that tensor's first E8M0 byte 255. */
static void rewrite_gguf(const char *path, const char *skip, const char *nan_tensor)
{
    struct gguf_file *f;
    assert_int_equal(gguf_open(g_gguf, &f), 0);
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!skip || !gguf_str_eq(f->kv[i].key, skip))
            assert_int_equal(gguf_writer_kv_copy(w, &f->kv[i]), 0);
    uint8_t *copy = NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const void *data = t->data;
        if (nan_tensor && !strcmp(name, nan_tensor)) {
            copy = malloc(t->size);
            memcpy(copy, t->data, t->size);
            copy[17 * 5] = 255; /* block 5's scale */
            data = copy;
        }
        assert_int_equal(gguf_writer_add_tensor(w, name, t->type, t->ne, t->n_dims, data, t->size),
                         0);
    }
    assert_int_equal(gguf_writer_finish(w), 0);
    free(copy);
    gguf_close(f);
}

/* llama.cpp's --fuse-gate-up-exps layout: ffn_gate_up_exps [E][2F][..] holds each expert's gate
 * rows then its up rows (weights and biases); it converts to the same IEBIN as the split one. */
static void test_fused_gate_up_gguf(void **state)
{
    (void)state;
    char p[4200], out[4200];
    snprintf(p, sizeof p, "%s/fused.gguf", g_root);
    snprintf(out, sizeof out, "%s/fused_out", g_root);
    struct gguf_file *f;
    assert_int_equal(gguf_open(g_gguf, &f), 0);
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(p, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        assert_int_equal(gguf_writer_kv_copy(w, &f->kv[i]), 0);
    uint8_t *bufs[64];
    size_t nb = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        char *up = strstr(name, "ffn_up_exps");
        if (up)
            continue; /* joined with its gate */
        char *gate = strstr(name, "ffn_gate_exps");
        if (!gate) {
            assert_int_equal(gguf_writer_add_tensor(w, name, t->type, t->ne, t->n_dims, t->data,
                                                    t->size),
                             0);
            continue;
        }
        char uname[128], fname[128];
        snprintf(uname, sizeof uname, "%.*sffn_up_exps%s", (int)(gate - name), name,
                 gate + strlen("ffn_gate_exps"));
        snprintf(fname, sizeof fname, "%.*sffn_gate_up_exps%s", (int)(gate - name), name,
                 gate + strlen("ffn_gate_exps"));
        const struct gguf_tensor *u = gguf_find_tensor(f, uname);
        assert_non_null(u);
        uint64_t experts = t->ne[t->n_dims - 1], per = t->size / experts; /* bytes per expert */
        uint8_t *fb = malloc(2 * t->size);
        for (uint64_t e = 0; e < experts; e++) {
            memcpy(fb + 2 * e * per, (const uint8_t *)t->data + e * per, per);
            memcpy(fb + (2 * e + 1) * per, (const uint8_t *)u->data + e * per, per);
        }
        uint64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        ne[t->n_dims - 2] *= 2; /* the rows (elements, for a bias) of one expert */
        assert_int_equal(gguf_writer_add_tensor(w, fname, t->type, ne, t->n_dims, fb, 2 * t->size),
                         0);
        bufs[nb++] = fb;
    }
    assert_int_equal(gguf_writer_finish(w), 0);
    for (size_t i = 0; i < nb; i++)
        free(bufs[i]);
    gguf_close(f);
    assert_int_equal(convert_to(p, out), 0);
    size_t la, lb;
    char *a = tu_read_file(tu_path(g_ref, IEBIN_BLOB), &la);
    char *b = tu_read_file(tu_path(out, IEBIN_BLOB), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
}

static void test_bad_gguf(void **state)
{
    (void)state;
    char p[4200];
    snprintf(p, sizeof p, "%s/bad.gguf", g_root);
    rewrite_gguf(p, NULL, "blk.1.ffn_up_exps.weight");
    expect_fail(p, ERR_RANGE, p, "block 1: E8M0 scale byte 255");
    expect_fail(p, ERR_RANGE, "tensor 'blk.1.ffn_up_exps.weight': row 1, block 1",
                "E8M0 scale byte 255 (NaN)");
    static const char *const required[] = {"gpt-oss.expert_count", "gpt-oss.attention.sliding_window",
                                           "gpt-oss.rope.scaling.type", "gpt-oss.rope.scaling.factor",
                                           "gpt-oss.rope.scaling.original_context_length",
                                           "gpt-oss.expert_feed_forward_length"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        rewrite_gguf(p, required[i], NULL);
        expect_fail(p, ERR_FORMAT, required[i], "is missing");
    }
    /* the rewrite itself is faithful: without damage it converts to the reference */
    char out[4200];
    snprintf(out, sizeof out, "%s/rewritten", g_root);
    rewrite_gguf(p, NULL, NULL);
    assert_int_equal(convert_to(p, out), 0);
    size_t la, lb;
    char *a = tu_read_file(tu_path(g_ref, IEBIN_BLOB), &la);
    char *b = tu_read_file(tu_path(out, IEBIN_BLOB), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_and_gguf_identical),
        cmocka_unit_test(test_semantics),
        cmocka_unit_test(test_preset_20b_hparams),
        cmocka_unit_test(test_config_fields),
        cmocka_unit_test(test_truncate_default),
        cmocka_unit_test(test_dtype_choice),
        cmocka_unit_test(test_bad_mxfp4),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_bad_gguf),
        cmocka_unit_test(test_fused_gate_up_gguf),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
