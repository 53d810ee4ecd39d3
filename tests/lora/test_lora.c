/*
 * test_lora.c — LoRA unit tests: adapter_config.json parsing, loading (dtypes, the q/k row
 * permutation, every kind of bad adapter with its message), the registry's reference counts
 * (unload while in use), and the grouped apply against a double-precision evaluation of
 * y + s * B (A x), whole and sharded.
 */
#include "testutil.h"
#include "../kern/isa_case.h"

#include "peft.h"

#include "err.h"
#include "half.h"
#include "kern_variants.h"
#include "log.h"
#include "lora.h"
#include "matmul.h"
#include "pool.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ALL_MASK ((1u << LORA_TARGET_COUNT) - 1u)

/* ---- adapter_config.json ---- */

static int parse(const char *json, struct lora_config *c)
{
    return lora_config_parse("cfg/adapter_config.json", json, strlen(json), c);
}

static void test_config_ok(void **state)
{
    (void)state;
    struct lora_config c;
    char *j = peft_config_json(8, 16, 1u << LORA_Q | 1u << LORA_V, "");
    assert_int_equal(parse(j, &c), 0);
    free(j);
    assert_int_equal(c.rank, 8);
    assert_true(c.alpha == 16.0f);
    assert_true(c.scaling == 2.0f);
    assert_false(c.rslora);
    assert_false(c.has_layers);
    assert_int_equal(c.target_mask, 1u << LORA_Q | 1u << LORA_V);

    /* rsLoRA: alpha / sqrt(r) */
    assert_int_equal(parse("{\"r\": 16, \"lora_alpha\": 8, \"use_rslora\": true, "
                           "\"target_modules\": [\"down_proj\", \"up_proj\", \"up_proj\"]}",
                           &c),
                     0);
    assert_true(c.rslora);
    assert_true(c.scaling == 2.0f);
    assert_int_equal(c.target_mask, 1u << LORA_DOWN | 1u << LORA_UP);

    /* all-linear, a real-valued alpha, layers_to_transform as an int and as a list, unknown
     * keys ignored, null for optional fields */
    assert_int_equal(parse("{\"r\": 4, \"lora_alpha\": 6.0, \"target_modules\": \"all-linear\","
                           " \"layers_to_transform\": 3, \"future_option\": {\"x\": 1},"
                           " \"bias\": null, \"use_dora\": null}",
                           &c),
                     0);
    assert_int_equal(c.target_mask, ALL_MASK);
    assert_true(c.scaling == 1.5f);
    assert_true(c.has_layers);
    assert_int_equal(c.layers[0], 1u << 3);
    assert_int_equal(parse("{\"r\": 4, \"lora_alpha\": 4, \"target_modules\": [\"o_proj\"],"
                           " \"layers_to_transform\": [0, 65, 1023]}",
                           &c),
                     0);
    assert_int_equal(c.layers[0], 1u);
    assert_int_equal(c.layers[1], 2u);
    assert_int_equal(c.layers[15], UINT64_C(1) << 63);
}

struct bad_cfg {
    const char *json;
    int rc;
    const char *needle1, *needle2;
};

static void test_config_bad(void **state)
{
    (void)state;
    static const struct bad_cfg cases[] = {
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]", ERR_FORMAT,
         "invalid JSON", "line"},
        {"[1, 2]", ERR_FORMAT, "not a JSON object", NULL},
        {"{\"r\": 8, \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}",
         ERR_FORMAT, "invalid JSON", "duplicate"},
        {"{\"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}", ERR_FORMAT, "r (the rank)",
         "missing"},
        {"{\"r\": \"8\", \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}", ERR_FORMAT,
         "r is \"8\"", "not an integer"},
        {"{\"r\": 0, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}", ERR_RANGE,
         "r is 0", "1..1024"},
        {"{\"r\": 4096, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}", ERR_RANGE,
         "r is 4096", NULL},
        {"{\"r\": 8, \"target_modules\": [\"q_proj\"]}", ERR_FORMAT, "lora_alpha", "missing"},
        {"{\"r\": 8, \"lora_alpha\": 1e300, \"target_modules\": [\"q_proj\"]}", ERR_RANGE,
         "lora_alpha", "does not fit"},
        {"{\"r\": 8, \"lora_alpha\": 16}", ERR_FORMAT, "target_modules is missing", NULL},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": []}", ERR_FORMAT,
         "target_modules", "empty"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"lm_head\"]}",
         ERR_UNSUPPORTED, "target_modules[1] \"lm_head\"", "not a supported target"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", 3]}", ERR_FORMAT,
         "target_modules[1]", "not a string"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": \".*\\\\.q_proj\"}",
         ERR_UNSUPPORTED, "target_modules", "regular expressions"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], \"use_dora\": true}",
         ERR_UNSUPPORTED, "use_dora is true", "not supported"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"fan_in_fan_out\": true}",
         ERR_UNSUPPORTED, "fan_in_fan_out is true", NULL},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], \"use_dora\": 1}",
         ERR_FORMAT, "use_dora is 1", "not a boolean"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], \"bias\": \"all\"}",
         ERR_UNSUPPORTED, "bias is \"all\"", NULL},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"modules_to_save\": [\"lm_head\"]}",
         ERR_UNSUPPORTED, "modules_to_save", "not supported"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"rank_pattern\": {\"q_proj\": 4}}",
         ERR_UNSUPPORTED, "rank_pattern", "per-module ranks"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"peft_type\": \"PREFIX_TUNING\"}",
         ERR_UNSUPPORTED, "peft_type \"PREFIX_TUNING\"", NULL},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"use_rslora\": \"yes\"}",
         ERR_FORMAT, "use_rslora", "not a boolean"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": [0, 1024]}",
         ERR_RANGE, "layers_to_transform[1] is 1024", NULL},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": []}",
         ERR_FORMAT, "layers_to_transform", "empty list"},
        {"{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": \"0\"}",
         ERR_FORMAT, "layers_to_transform", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct lora_config c;
        tu_log_capture_begin();
        int rc = parse(cases[i].json, &c);
        if (rc != cases[i].rc)
            fail_msg("case %zu (%s): rc %d, want %d; log: %s", i, cases[i].json, rc,
                     cases[i].rc, tu_log_captured());
        tu_assert_log_contains("cfg/adapter_config.json", cases[i].needle1, cases[i].needle2,
                               NULL);
        tu_log_capture_end();
    }
    /* over the size cap: refused before parsing */
    struct lora_config c;
    tu_log_capture_begin();
    assert_int_equal(lora_config_parse("big.json", "{}", LORA_CONFIG_MAX + 1u, &c), ERR_RANGE);
    tu_assert_log_contains("big.json", "limit", NULL);
    tu_log_capture_end();
}

/* ---- loading ---- */

static char *g_tmp;

static int setup_tmp(void **state)
{
    (void)state;
    g_tmp = tu_mkdtemp();
    return 0;
}

static int teardown_tmp(void **state)
{
    (void)state;
    tu_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

static char *subdir(const char *name)
{
    char *d = strdup(tu_path(g_tmp, name));
    mkdir(d, 0755);
    return d;
}

/* Loading dir against the small hparams must fail with rc and a log naming the needles. */
static void expect_load_fail(const char *dir, int rc, const char *n1, const char *n2,
                             const char *n3)
{
    struct iebin_hparams hp = peft_small_hparams();
    struct lora_adapter *ad = (void *)1;
    tu_log_capture_begin();
    int got = lora_open(dir, &hp, &ad);
    if (got != rc)
        fail_msg("%s: rc %d (%s), want %d; log: %s", dir, got, err_name(got), rc,
                 tu_log_captured());
    assert_null(ad);
    tu_assert_log_contains(n1, n2, n3, NULL);
    tu_log_capture_end();
}

static void test_load_dtypes_and_permutation(void **state)
{
    (void)state;
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 3, 6.0, ALL_MASK, 42, 0.5f, 0.5f);
    static const enum safetensors_dtype dts[] = {SAFETENSORS_F32, SAFETENSORS_F16,
                                                 SAFETENSORS_BF16};
    for (size_t k = 0; k < 3; k++) {
        char *dir = subdir(safetensors_dtype_name(dts[k]));
        peft_adapter_write(pa, dir, dts[k], "");
        struct lora_adapter *ad;
        assert_int_equal(lora_open(dir, &hp, &ad), 0);
        assert_int_equal(lora_refcount(ad), 1);
        assert_true(ad->id > 0);
        assert_true(ad->cfg.scaling == 2.0f);
        assert_string_equal(ad->dir, dir);
        for (uint32_t l = 0; l < hp.n_layers; l++)
            for (int t = 0; t < LORA_TARGET_COUNT; t++) {
                const struct lora_weights *w = lora_weights(ad, l, (enum lora_target)t);
                assert_non_null(w);
                uint32_t in, out;
                lora_target_dims(&hp, (enum lora_target)t, &in, &out);
                assert_int_equal(ad->in[t], in);
                assert_int_equal(ad->out[t], out);
                /* what the file holds, as f32 */
                float *ea = malloc((size_t)3 * in * 4), *eb = malloc((size_t)out * 3 * 4);
                for (size_t i = 0; i < (size_t)3 * in; i++)
                    ea[i] = dts[k] == SAFETENSORS_F32 ? pa->a[l][t][i]
                            : dts[k] == SAFETENSORS_F16
                                ? half_f16_to_f32(half_f32_to_f16(pa->a[l][t][i]))
                                : half_bf16_to_f32(half_f32_to_bf16(pa->a[l][t][i]));
                for (size_t i = 0; i < (size_t)out * 3; i++)
                    eb[i] = dts[k] == SAFETENSORS_F32 ? pa->b[l][t][i]
                            : dts[k] == SAFETENSORS_F16
                                ? half_f16_to_f32(half_f32_to_f16(pa->b[l][t][i]))
                                : half_bf16_to_f32(half_f32_to_bf16(pa->b[l][t][i]));
                assert_memory_equal(w->a, ea, (size_t)3 * in * 4);
                if (t == LORA_Q || t == LORA_K) {
                    /* row 2i+s of head h (IEBIN) is HF row s*hd/2+i; hd = 4 here */
                    uint32_t heads = t == LORA_Q ? hp.n_heads : hp.n_kv_heads;
                    assert_int_equal(heads * 4, out);
                    for (uint32_t h = 0; h < heads; h++)
                        for (uint32_t i = 0; i < 2; i++)
                            for (uint32_t s = 0; s < 2; s++)
                                assert_memory_equal(w->b + (h * 4 + 2 * i + s) * 3,
                                                    eb + (h * 4 + s * 2 + i) * 3, 3 * 4);
                    /* and it is the inverse of HF's own permutation */
                    float *back = malloc((size_t)out * 3 * 4);
                    peft_permute_meta_to_hf(back, w->b, heads, 4, 3);
                    assert_memory_equal(back, eb, (size_t)out * 3 * 4);
                    free(back);
                } else {
                    assert_memory_equal(w->b, eb, (size_t)out * 3 * 4);
                }
                assert_int_equal((uintptr_t)w->a % 64, 0);
                assert_int_equal((uintptr_t)w->b % 64, 0);
                free(ea);
                free(eb);
            }
        lora_close(ad);
        free(dir);
    }
    peft_adapter_free(pa);
}

static void test_permute_roundtrip(void **state)
{
    (void)state;
    /* lora_permute_rows_hf_to_iebin undoes HF's permute for any head count and even hd */
    const uint32_t heads = 3, hd = 6;
    const size_t cols = 5, rows = heads * hd;
    float meta[18 * 5], hf[18 * 5], back[18 * 5];
    for (size_t i = 0; i < rows * cols; i++)
        meta[i] = (float)i;
    peft_permute_meta_to_hf(hf, meta, heads, hd, cols);
    assert_memory_not_equal(hf, meta, sizeof meta);
    lora_permute_rows_hf_to_iebin(back, hf, heads, hd, cols);
    assert_memory_equal(back, meta, sizeof meta);
}

static void test_layers_to_transform(void **state)
{
    (void)state;
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 2, 2.0, 1u << LORA_V, 7, 0.5f, 0.5f);
    /* only layer 1 adapted: drop layer 0's tensors */
    free(pa->a[0][LORA_V]);
    free(pa->b[0][LORA_V]);
    pa->a[0][LORA_V] = pa->b[0][LORA_V] = NULL;
    char *dir = subdir("layers1");
    peft_adapter_write(pa, dir, SAFETENSORS_F32, ",\n  \"layers_to_transform\": [1]");
    struct lora_adapter *ad;
    assert_int_equal(lora_open(dir, &hp, &ad), 0);
    assert_null(lora_weights(ad, 0, LORA_V));
    assert_non_null(lora_weights(ad, 1, LORA_V));
    assert_null(lora_weights(ad, 1, LORA_Q));
    lora_close(ad);

    /* without layers_to_transform, layer 0 missing is an incomplete adapter */
    peft_adapter_write(pa, dir, SAFETENSORS_F32, "");
    expect_load_fail(dir, ERR_NOT_FOUND, "adapter_model.safetensors",
                     "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight",
                     "is missing");
    /* layers_to_transform beyond the base model */
    peft_adapter_write(pa, dir, SAFETENSORS_F32, ",\n  \"layers_to_transform\": [1, 5]");
    expect_load_fail(dir, ERR_RANGE, "adapter_config.json", "layers_to_transform lists layer 5",
                     "2 layers");
    /* a tensor for a layer layers_to_transform does not list */
    peft_adapter_free(pa);
    pa = peft_adapter_random(&hp, 2, 2.0, 1u << LORA_V, 7, 0.5f, 0.5f);
    peft_adapter_write(pa, dir, SAFETENSORS_F32, ",\n  \"layers_to_transform\": 1");
    expect_load_fail(dir, ERR_MISMATCH, "layers.0.self_attn.v_proj.lora_A.weight",
                     "adapts layer 0", "layers_to_transform");
    peft_adapter_free(pa);
    free(dir);
}

static void test_load_missing_files(void **state)
{
    (void)state;
    char *dir = subdir("empty");
    expect_load_fail(dir, -ENOENT, "adapter_config.json", "cannot open", NULL);
    char *cfg = peft_config_json(2, 4, 1u << LORA_Q, "");
    peft_write_config(dir, cfg);
    free(cfg);
    expect_load_fail(dir, -ENOENT, "adapter_model.safetensors", NULL, NULL);
    tu_write_file(tu_path(dir, "adapter_model.bin"), "PK", 2);
    expect_load_fail(dir, ERR_UNSUPPORTED, "adapter_model.bin", "safe_serialization", NULL);
    /* bad JSON in the directory's config: the message names the file */
    peft_write_config(dir, "{\"r\": 2,");
    expect_load_fail(dir, ERR_FORMAT, "adapter_config.json", "invalid JSON", NULL);
    /* a directory, not a file */
    char *dir2 = subdir("cfgdir");
    mkdir(tu_path(dir2, LORA_CONFIG_FILE), 0755);
    expect_load_fail(dir2, ERR_FORMAT, "adapter_config.json", "not a regular file", NULL);
    free(dir2);
    free(dir);
}

/* Writes a q_proj-only rank-2 adapter for the small hparams with tensors `t`, then expects
 * loading to fail. */
static void bad_tensors(const char *name, const struct peft_tensor *t, size_t n, int rc,
                        const char *n1, const char *n2)
{
    char *dir = subdir(name);
    char *cfg = peft_config_json(2, 4, 1u << LORA_Q | 1u << LORA_GATE, "");
    peft_write_config(dir, cfg);
    free(cfg);
    peft_write_tensors(dir, t, n);
    expect_load_fail(dir, rc, "adapter_model.safetensors", n1, n2);
    free(dir);
}

static void test_load_bad_tensors(void **state)
{
    (void)state;
    static float z[4096];
    for (size_t i = 0; i < 4096; i++)
        z[i] = (float)i * 1e-3f;
    /* a complete valid set for q (in 16, out 16) and gate (in 16, out 24), 2 layers */
    struct peft_tensor good[8];
    size_t n = 0;
    for (uint32_t l = 0; l < 2; l++) {
        good[n++] = (struct peft_tensor){strdup(peft_name(l, LORA_Q, 0)), SAFETENSORS_F32, 2,
                                         {2, 16}, z};
        good[n++] = (struct peft_tensor){strdup(peft_name(l, LORA_Q, 1)), SAFETENSORS_F32, 2,
                                         {16, 2}, z};
        good[n++] = (struct peft_tensor){strdup(peft_name(l, LORA_GATE, 0)), SAFETENSORS_F32, 2,
                                         {2, 16}, z};
        good[n++] = (struct peft_tensor){strdup(peft_name(l, LORA_GATE, 1)), SAFETENSORS_F32, 2,
                                         {24, 2}, z};
    }
    /* sanity: the good set loads */
    {
        char *dir = subdir("good");
        char *cfg = peft_config_json(2, 4, 1u << LORA_Q | 1u << LORA_GATE, "");
        peft_write_config(dir, cfg);
        free(cfg);
        peft_write_tensors(dir, good, n);
        struct iebin_hparams hp = peft_small_hparams();
        struct lora_adapter *ad;
        assert_int_equal(lora_open(dir, &hp, &ad), 0);
        lora_close(ad);
        free(dir);
    }
    struct peft_tensor t[9];

    /* wrong shapes: A's input width, B's output height, a 3-D tensor */
    memcpy(t, good, sizeof good);
    t[0].shape[1] = 15;
    bad_tensors("shape_a", t, n, ERR_MISMATCH, "layers.0.self_attn.q_proj.lora_A.weight",
                "shape [2, 15] does not match the base model's [2, 16]");
    memcpy(t, good, sizeof good);
    t[7].shape[0] = 16;
    bad_tensors("shape_b", t, n, ERR_MISMATCH, "layers.1.mlp.gate_proj.lora_B.weight",
                "shape [16, 2] does not match the base model's [24, 2]");
    memcpy(t, good, sizeof good);
    t[0].n_dims = 1;
    t[0].shape[0] = 32;
    bad_tensors("shape_1d", t, n, ERR_MISMATCH, "q_proj.lora_A.weight", "not 2-D");

    /* rank mismatch with the config's r */
    memcpy(t, good, sizeof good);
    t[1].shape[1] = 3;
    bad_tensors("rank", t, n, ERR_MISMATCH, "layers.0.self_attn.q_proj.lora_B.weight",
                "rank 3, but adapter_config.json says r = 2");

    /* layer out of range */
    memcpy(t, good, sizeof good);
    t[8] = (struct peft_tensor){"base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight",
                                SAFETENSORS_F32, 2, {2, 16}, z};
    bad_tensors("layer_range", t, 9, ERR_RANGE, "layers.2.self_attn.q_proj.lora_A.weight",
                "layer 2 is out of range (the base model has 2 layers");

    /* names that are not LoRA weights of a decoder layer */
    static const char *const not_lora[] = {
        "base_model.model.lm_head.lora_A.weight",
        "base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.1.mlp.q_proj.lora_A.weight",
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.1.self_attn.q_proj.lora_magnitude_vector",
        "base_model.model.model.layers.99999999999.self_attn.q_proj.lora_A.weight",
    };
    for (size_t i = 0; i < sizeof not_lora / sizeof not_lora[0]; i++) {
        memcpy(t, good, sizeof good);
        t[8] = (struct peft_tensor){not_lora[i], SAFETENSORS_F32, 2, {2, 16}, z};
        char nm[32];
        snprintf(nm, sizeof nm, "notlora%zu", i);
        bad_tensors(nm, t, 9, ERR_FORMAT, not_lora[i], "is not a LoRA weight");
    }
    /* an unknown module (unknown target) */
    memcpy(t, good, sizeof good);
    t[8] = (struct peft_tensor){"base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",
                                SAFETENSORS_F32, 2, {2, 16}, z};
    bad_tensors("unknown_module", t, 9, ERR_UNSUPPORTED, "module 'qkv_proj'",
                "not a supported target");
    /* a module target_modules does not list */
    memcpy(t, good, sizeof good);
    t[8] = (struct peft_tensor){strdup(peft_name(0, LORA_V, 0)), SAFETENSORS_F32, 2, {2, 16}, z};
    bad_tensors("not_targeted", t, 9, ERR_MISMATCH, "adapts v_proj",
                "target_modules does not list");
    free((char *)t[8].name);
    /* a missing B */
    memcpy(t, good, sizeof good);
    memmove(&t[3], &t[4], 4 * sizeof t[0]);
    bad_tensors("missing_b", t, 7, ERR_NOT_FOUND, "layers.0.mlp.gate_proj.lora_B.weight",
                "is missing");
    /* unsupported dtype */
    memcpy(t, good, sizeof good);
    t[2].dt = SAFETENSORS_I32;
    bad_tensors("dtype", t, n, ERR_UNSUPPORTED, "layers.0.mlp.gate_proj.lora_A.weight",
                "dtype I32 is not supported");
    /* a non-finite weight */
    static float nanbuf[64];
    memcpy(nanbuf, z, sizeof nanbuf);
    nanbuf[17] = NAN;
    memcpy(t, good, sizeof good);
    t[5].data = nanbuf;
    bad_tensors("nan", t, n, ERR_RANGE, "layers.1.self_attn.q_proj.lora_B.weight",
                "element [8][1] is not finite");

    for (size_t i = 0; i < n; i++)
        free((char *)good[i].name);
}

static void test_digest(void **state)
{
    (void)state;
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 4, 8.0, 1u << LORA_V | 1u << LORA_UP,
                                                  21, 0.5f, 0.5f);
    struct {
        const char *name;
        enum safetensors_dtype dt;
        const char *extra;
        double alpha;
        int tweak; /* change one weight */
    } v[] = {
        {"dg_a", SAFETENSORS_F32, "", 8.0, 0},   {"dg_same", SAFETENSORS_F32, "", 8.0, 0},
        {"dg_bf16", SAFETENSORS_BF16, "", 8.0, 0}, {"dg_alpha", SAFETENSORS_F32, "", 4.0, 0},
        {"dg_rslora", SAFETENSORS_F32, ",\n  \"use_rslora\": true", 8.0, 0},
        {"dg_weight", SAFETENSORS_F32, "", 8.0, 1},
    };
    uint64_t d[6];
    for (size_t i = 0; i < 6; i++) {
        char *dir = subdir(v[i].name);
        pa->alpha = v[i].alpha;
        if (v[i].tweak)
            pa->b[1][LORA_UP][7] += 1e-3f;
        peft_adapter_write(pa, dir, v[i].dt, v[i].extra);
        struct lora_adapter *ad;
        assert_int_equal(lora_open(dir, &hp, &ad), 0);
        d[i] = ad->digest;
        lora_close(ad);
        free(dir);
    }
    assert_true(d[0] == d[1]); /* the same files: the same digest, across loads */
    for (size_t i = 2; i < 6; i++)
        for (size_t j = 0; j < i; j++)
            if (!(i == 1 && j == 0))
                assert_true(d[i] != d[j]);
    peft_adapter_free(pa);
}

/* ---- registry ---- */

static void test_registry(void **state)
{
    (void)state;
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 4, 4.0, 1u << LORA_Q | 1u << LORA_DOWN,
                                                  3, 0.5f, 0.5f);
    char *dir = subdir("reg");
    peft_adapter_write(pa, dir, SAFETENSORS_F32, "");
    peft_adapter_free(pa);

    struct lora_registry *r;
    assert_int_equal(lora_registry_create(&hp, 2, &r), 0);
    assert_int_equal(lora_registry_load(r, "sql-v1", dir), 0);
    assert_int_equal(lora_registry_count(r), 1);
    const struct lora_adapter *listed = lora_registry_at(r, 0);
    assert_string_equal(listed->name, "sql-v1");

    /* unknown names */
    struct lora_adapter *ad = (void *)1;
    tu_log_capture_begin();
    assert_int_equal(lora_registry_acquire(r, "nope", &ad), ERR_NOT_FOUND);
    assert_null(ad);
    tu_assert_log_contains("LoRA adapter 'nope' is not loaded", NULL);
    assert_int_equal(lora_registry_unload(r, "nope"), ERR_NOT_FOUND);
    /* name taken, bad names, a failing load leaves the registry as it was */
    assert_int_equal(lora_registry_load(r, "sql-v1", dir), ERR_STATE);
    tu_assert_log_contains("'sql-v1' is already loaded", "unload it first", NULL);
    assert_int_equal(lora_registry_load(r, "", dir), ERR_FORMAT);
    assert_int_equal(lora_registry_load(r, "a/b", dir), ERR_FORMAT);
    tu_assert_log_contains("name 'a/b' is invalid", NULL);
    assert_int_equal(lora_registry_load(r, "broken", g_tmp), -ENOENT);
    assert_int_equal(lora_registry_count(r), 1);
    tu_log_capture_end();

    /* two requests use it */
    struct lora_adapter *u1, *u2;
    assert_int_equal(lora_registry_acquire(r, "sql-v1", &u1), 0);
    assert_int_equal(lora_registry_acquire(r, "sql-v1", &u2), 0);
    assert_ptr_equal(u1, u2);
    assert_int_equal(lora_refcount(u1), 3);
    uint64_t old_id = u1->id;

    /* unload while in use: the name goes, the adapter stays valid for its users */
    assert_int_equal(lora_registry_unload(r, "sql-v1"), 0);
    assert_int_equal(lora_registry_count(r), 0);
    assert_int_equal(lora_refcount(u1), 2);
    tu_log_capture_begin();
    assert_int_equal(lora_registry_acquire(r, "sql-v1", &ad), ERR_NOT_FOUND);
    tu_log_capture_end();
    /* a new version under the same name is a different adapter (new id: no KV reuse) */
    assert_int_equal(lora_registry_load(r, "sql-v1", dir), 0);
    struct lora_adapter *u3;
    assert_int_equal(lora_registry_acquire(r, "sql-v1", &u3), 0);
    assert_ptr_not_equal(u3, u1);
    assert_true(u3->id != old_id);
    /* ... computing the same thing: the same digest (KV computed with either is the same) */
    assert_true(u3->digest == u1->digest && u3->digest != 0);

    /* the old version still computes (ASan would flag a use after free) */
    float x[16], y[16] = {0}, tmp[4];
    for (int i = 0; i < 16; i++)
        x[i] = 1.0f;
    lora_apply_one(u1, 1.0f, 0, LORA_Q, x, 1, y, 16, tmp);
    float y3[16] = {0};
    lora_apply_one(u3, 1.0f, 0, LORA_Q, x, 1, y3, 16, tmp);
    assert_memory_equal(y, y3, sizeof y);

    lora_registry_release(u1);
    assert_int_equal(lora_refcount(u2), 1);
    lora_registry_release(u2); /* freed here: the leak checker sees nothing left */

    /* capacity */
    assert_int_equal(lora_registry_load(r, "b", dir), 0);
    tu_log_capture_begin();
    assert_int_equal(lora_registry_load(r, "c", dir), ERR_OVERLOADED);
    tu_assert_log_contains("'c'", "2 adapters are loaded", NULL);
    tu_log_capture_end();

    /* destroying the registry while a request holds an adapter: it outlives the registry */
    lora_registry_destroy(r);
    assert_int_equal(lora_refcount(u3), 1);
    lora_apply_one(u3, 0.5f, 1, LORA_DOWN, (float[24]){0}, 1, y, 16, (float[4]){0});
    lora_registry_release(u3);
    free(dir);
}

/* Users on pool threads: each computes with the adapter, then drops its references. */
struct user_arg {
    struct lora_adapter *ad;
    int refs;
    float y[16];
};

static void *user_thread(void *p)
{
    struct user_arg *u = p;
    float x[16], tmp[4];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i * 0.1f;
    for (int k = 0; k < u->refs; k++) {
        memset(u->y, 0, sizeof u->y);
        lora_apply_one(u->ad, 1.0f, 1, LORA_Q, x, 1, u->y, 16, tmp);
        lora_registry_release(u->ad);
    }
    return NULL;
}

static void test_release_from_threads(void **state)
{
    (void)state;
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 4, 4.0, 1u << LORA_Q, 5, 0.5f, 0.5f);
    char *dir = subdir("threads");
    peft_adapter_write(pa, dir, SAFETENSORS_F32, "");
    peft_adapter_free(pa);
    struct lora_registry *r;
    assert_int_equal(lora_registry_create(&hp, 0, &r), 0);
    assert_int_equal(lora_registry_load(r, "t", dir), 0);
    enum { THREADS = 4, REFS = 50 };
    struct user_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i].refs = REFS;
        for (int k = 0; k < REFS; k++)
            assert_int_equal(lora_registry_acquire(r, "t", &args[i].ad), 0);
    }
    assert_int_equal(lora_refcount(args[0].ad), 1 + THREADS * REFS);
    /* the owner unloads while the users are still running; the last release frees it
     * (ASan reports a use after free or a leak otherwise; TSan a race) */
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, user_thread, &args[i]), 0);
    assert_int_equal(lora_registry_unload(r, "t"), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 1; i < THREADS; i++)
        assert_memory_equal(args[i].y, args[0].y, sizeof args[0].y);
    lora_registry_destroy(r);
    free(dir);
}

/* ---- applying ---- */

/* y[t] += s_t * B (A x_t), in double, straight from the definition. */
static void naive(const struct lora_adapter *ad, float scale, uint32_t layer,
                  enum lora_target t, const float *x, float *y)
{
    const struct lora_weights *w = lora_weights(ad, layer, t);
    if (!w)
        return;
    uint32_t r = ad->cfg.rank, in = ad->in[t], out = ad->out[t];
    double ax[LORA_MAX_RANK];
    for (uint32_t k = 0; k < r; k++) {
        double acc = 0.0;
        for (uint32_t c = 0; c < in; c++)
            acc += (double)w->a[(size_t)k * in + c] * x[c];
        ax[k] = acc;
    }
    for (uint32_t o = 0; o < out; o++) {
        double acc = 0.0;
        for (uint32_t k = 0; k < r; k++)
            acc += (double)w->b[(size_t)o * r + k] * ax[k];
        y[o] += (float)((double)ad->cfg.scaling * scale * acc);
    }
}

/* naive's terms in absolute value: the scale of the rounding when x and A x are rounded to
 * bf16 (the bf16 adapters' kernels on AVX512-BF16) */
static void naive_mag(const struct lora_adapter *ad, float scale, uint32_t layer,
                      enum lora_target t, const float *x, float *m)
{
    const struct lora_weights *w = lora_weights(ad, layer, t);
    uint32_t r = ad->cfg.rank, in = ad->in[t], out = ad->out[t];
    for (uint32_t o = 0; o < out; o++)
        m[o] = 0.0f;
    if (!w)
        return;
    for (uint32_t k = 0; k < r; k++) {
        double acc = 0.0;
        for (uint32_t c = 0; c < in; c++)
            acc += fabs((double)w->a[(size_t)k * in + c] * x[c]);
        for (uint32_t o = 0; o < out; o++)
            m[o] += (float)(fabs((double)ad->cfg.scaling * scale * w->b[(size_t)o * r + k]) * acc);
    }
}

static void test_apply_grouped(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    /* wide enough that phase B tiles rows (ffn 300 > 256) and tokens (37 > 16) */
    struct iebin_hparams hp = peft_small_hparams();
    hp.ffn_dim = 300;
    hp.dim = 40;
    hp.n_heads = 5;
    hp.n_kv_heads = 5;
    hp.head_dim = 8;
    struct peft_adapter *p1 = peft_adapter_random(&hp, 5, 10.0, ALL_MASK, 11, 0.3f, 0.3f);
    struct peft_adapter *p2 =
        peft_adapter_random(&hp, 17, 8.0, 1u << LORA_UP | 1u << LORA_DOWN | 1u << LORA_Q, 12,
                            0.3f, 0.3f);
    char *d1 = subdir("ap1"), *d2 = subdir("ap2");
    peft_adapter_write(p1, d1, SAFETENSORS_F32, "");
    peft_adapter_write(p2, d2, SAFETENSORS_BF16, ",\n  \"use_rslora\": true");
    peft_adapter_free(p1);
    peft_adapter_free(p2);
    struct lora_adapter *a1, *a2;
    assert_int_equal(lora_open(d1, &hp, &a1), 0);
    assert_int_equal(lora_open(d2, &hp, &a2), 0);

    enum { N = 37 };
    const struct lora_adapter *who[N];
    float scale[N];
    for (int i = 0; i < N; i++) {
        /* runs of a1, base tokens, a2, and a1 again non-adjacent */
        who[i] = i < 10 ? a1 : i < 13 ? NULL : i < 30 ? a2 : i == 33 ? NULL : a1;
        scale[i] = i % 7 == 3 ? 0.0f : 0.25f + (float)(i % 5) * 0.5f;
    }
    struct lora_plan plan;
    lora_plan_init(&plan);
    assert_int_equal(lora_plan_build(&plan, who, scale, N), 0);
    assert_int_equal(plan.n_segs, 4);
    assert_int_equal(plan.max_rank, 17);
    assert_int_equal(plan.tmp_floats, 10 * 5 + 17 * 17 + 3 * 5 + 3 * 5);

    uint64_t seed = 99;
    for (uint32_t layer = 0; layer < hp.n_layers; layer++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            uint32_t in, out;
            lora_target_dims(&hp, (enum lora_target)t, &in, &out);
            const size_t ldy = out + 3; /* y is a strided view */
            float *x = malloc((size_t)N * in * 4), *y0 = malloc((size_t)N * ldy * 4);
            float *want = malloc((size_t)N * ldy * 4), *got = malloc((size_t)N * ldy * 4);
            float *tmp = malloc(plan.tmp_floats * 4);
            for (size_t i = 0; i < (size_t)N * in; i++)
                x[i] = (float)((seed = seed * 6364136223846793005u + 1442695040888963407u) >> 41) /
                           4194304.0f - 1.0f;
            for (size_t i = 0; i < (size_t)N * ldy; i++)
                y0[i] = (float)(i % 13) - 6.0f;
            memcpy(want, y0, (size_t)N * ldy * 4);
            for (int i = 0; i < N; i++)
                if (who[i])
                    naive(who[i], scale[i], layer, (enum lora_target)t, x + (size_t)i * in,
                          want + (size_t)i * ldy);

            memcpy(got, y0, (size_t)N * ldy * 4);
            lora_apply(&plan, layer, (enum lora_target)t, x, tmp, got, ldy);
            for (size_t i = 0; i < (size_t)N * ldy; i++) {
                if (fabsf(got[i] - want[i]) > 1e-4f * (1.0f + fabsf(want[i])))
                    fail_msg("layer %u %s: y[%zu][%zu] = %g, want %g", layer,
                             lora_target_name((enum lora_target)t), i / ldy, i % ldy,
                             (double)got[i], (double)want[i]);
                if (i % ldy >= out)
                    assert_true(got[i] == y0[i]); /* padding untouched */
            }
            /* base tokens and zero-scale tokens keep the base product exactly */
            for (int i = 0; i < N; i++)
                if (!who[i] || scale[i] == 0.0f)
                    assert_memory_equal(got + (size_t)i * ldy, y0 + (size_t)i * ldy, out * 4);

            /* sharded over uneven rank and row ranges (as a pool would): the same values;
             * the same bits on the scalar path (SIMD kernels may order a row's sum
             * differently in a row block's tail, so there only to rounding) */
            float *sh = malloc((size_t)N * ldy * 4);
            memcpy(sh, y0, (size_t)N * ldy * 4);
            memset(tmp, 0xff, plan.tmp_floats * 4);
            const size_t kcuts[] = {0, 3, 4, 11, plan.max_rank};
            for (int k = 0; k < 4; k++)
                lora_apply_a(&plan, layer, (enum lora_target)t, x, tmp, kcuts[k], kcuts[k + 1]);
            const size_t rcuts[] = {0, 1, out / 3, out / 3 + 257 < out ? out / 3 + 257 : out, out};
            for (int k = 3; k >= 0; k--)
                if (rcuts[k] < rcuts[k + 1])
                    lora_apply_b(&plan, layer, (enum lora_target)t, tmp, sh, ldy, rcuts[k],
                                 rcuts[k + 1]);
            if (kern_isa() == KERN_ISA_REF)
                assert_memory_equal(sh, got, (size_t)N * ldy * 4);
            for (size_t i = 0; i < (size_t)N * ldy; i++)
                if (fabsf(sh[i] - got[i]) > 1e-5f * (1.0f + fabsf(got[i])))
                    fail_msg("sharded y[%zu][%zu] = %g, unsharded %g", i / ldy, i % ldy,
                             (double)sh[i], (double)got[i]);

            /* one adapter for a whole run: lora_apply_one == its plan segment */
            float *one = malloc((size_t)N * ldy * 4);
            memcpy(one, y0, (size_t)N * ldy * 4);
            float *tmp1 = malloc((size_t)17 * 17 * 4);
            lora_apply_one(a2, 1.0f, layer, (enum lora_target)t, x + 13 * (size_t)in, 17,
                           one + 13 * ldy, ldy, tmp1);
            for (int i = 13; i < 30; i++) {
                float *wrow = malloc(ldy * 4);
                memcpy(wrow, y0 + (size_t)i * ldy, ldy * 4);
                naive(a2, 1.0f, layer, (enum lora_target)t, x + (size_t)i * in, wrow);
                for (size_t o = 0; o < out; o++)
                    assert_true(fabsf(one[(size_t)i * ldy + o] - wrow[o]) <=
                                1e-4f * (1.0f + fabsf(wrow[o])));
                free(wrow);
            }
            free(tmp1);
            free(one);
            free(sh);
            free(tmp);
            free(got);
            free(want);
            free(y0);
            free(x);
        }

    /* rebuilding reuses the plan; an all-base batch has nothing to apply */
    const struct lora_adapter *none[3] = {NULL, NULL, NULL};
    assert_int_equal(lora_plan_build(&plan, none, scale, 3), 0);
    assert_int_equal(plan.n_segs, 0);
    assert_int_equal(plan.tmp_floats, 0);
    assert_int_equal(plan.max_rank, 0);
    lora_plan_fini(&plan);
    lora_close(a1);
    lora_close(a2);
    free(d1);
    free(d2);
}

/* The engine's seam on a real thread pool: phase A sharded by rank rows, then one pass over
 * output-row shards doing the base product and phase B for the same rows. */
struct pool_ctx {
    const struct lora_plan *plan;
    enum lora_target t;
    const float *w, *x;
    float *tmp, *y;
    size_t in, out;
};

static void pool_phase_a(void *c, size_t k0, size_t k1, int thread)
{
    (void)thread;
    struct pool_ctx *p = c;
    lora_apply_a(p->plan, 1, p->t, p->x, p->tmp, k0, k1);
}

static void pool_base_and_b(void *c, size_t r0, size_t r1, int thread)
{
    (void)thread;
    struct pool_ctx *p = c;
    kern_matmul(DT_F32, p->w, p->in, p->x, p->plan->n_tok, p->y, p->out, r0, r1);
    lora_apply_b(p->plan, 1, p->t, p->tmp, p->y, p->out, r0, r1);
}

static void test_apply_on_pool(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    struct iebin_hparams hp = peft_small_hparams();
    hp.dim = 64;
    hp.ffn_dim = 352;
    struct peft_adapter *p1 = peft_adapter_random(&hp, 16, 16.0, ALL_MASK, 31, 0.2f, 0.2f);
    struct peft_adapter *p2 = peft_adapter_random(&hp, 8, 8.0, ALL_MASK, 32, 0.2f, 0.2f);
    char *d1 = subdir("pool1"), *d2 = subdir("pool2");
    peft_adapter_write(p1, d1, SAFETENSORS_F32, "");
    peft_adapter_write(p2, d2, SAFETENSORS_F32, "");
    peft_adapter_free(p1);
    peft_adapter_free(p2);
    struct lora_registry *reg;
    assert_int_equal(lora_registry_create(&hp, 0, &reg), 0);
    assert_int_equal(lora_registry_load(reg, "one", d1), 0);
    assert_int_equal(lora_registry_load(reg, "two", d2), 0);

    /* a decode-like batch: 24 sequences, one token each, sorted by adapter */
    enum { N = 24 };
    struct lora_adapter *held[N] = {0};
    const struct lora_adapter *who[N];
    float scale[N];
    for (int i = 0; i < N; i++) {
        if (i >= 4)
            assert_int_equal(lora_registry_acquire(reg, i < 15 ? "one" : "two", &held[i]), 0);
        who[i] = held[i];
        scale[i] = 1.0f - 0.03f * (float)i;
    }
    struct lora_plan plan;
    lora_plan_init(&plan);
    assert_int_equal(lora_plan_build(&plan, who, scale, N), 0);
    assert_int_equal(plan.n_segs, 2);

    struct pool *pool;
    assert_int_equal(pool_create(3, POOL_PIN_NONE, &pool), 0);
    for (int t = 0; t < LORA_TARGET_COUNT; t++) {
        uint32_t in, out;
        lora_target_dims(&hp, (enum lora_target)t, &in, &out);
        float *w = malloc((size_t)out * in * 4), *x = malloc((size_t)N * in * 4);
        float *y_seq = malloc((size_t)N * out * 4), *y_pool = malloc((size_t)N * out * 4);
        float *tmp = malloc(plan.tmp_floats * 4), *tmp2 = malloc(plan.tmp_floats * 4);
        for (size_t i = 0; i < (size_t)out * in; i++)
            w[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        for (size_t i = 0; i < (size_t)N * in; i++)
            x[i] = (float)((i * 40503u) % 997) / 997.0f - 0.5f;
        kern_matmul(DT_F32, w, in, x, N, y_seq, out, 0, out);
        lora_apply(&plan, 1, (enum lora_target)t, x, tmp, y_seq, out);

        struct pool_ctx c = {&plan, (enum lora_target)t, w, x, tmp2, y_pool, in, out};
        pool_for(pool, 0, plan.max_rank, 1, pool_phase_a, &c);
        pool_for(pool, 0, out, 16, pool_base_and_b, &c);
        for (size_t i = 0; i < (size_t)N * out; i++)
            if (fabsf(y_pool[i] - y_seq[i]) > 1e-5f * (1.0f + fabsf(y_seq[i])))
                fail_msg("%s: pooled y[%zu][%zu] = %g, sequential %g",
                         lora_target_name((enum lora_target)t), i / out, i % out,
                         (double)y_pool[i], (double)y_seq[i]);
        free(w);
        free(x);
        free(y_seq);
        free(y_pool);
        free(tmp);
        free(tmp2);
    }
    pool_destroy(pool);
    lora_plan_fini(&plan);
    for (int i = 0; i < N; i++)
        lora_registry_release(held[i]);
    lora_registry_destroy(reg);
    free(d1);
    free(d2);
}

/* ---- the serving path: packed weights, shrink/expand kernels, lora_apply_fused ---- */

static uint64_t g_rng = 12345;
static float urand(void)
{
    g_rng = g_rng * 6364136223846793005u + 1442695040888963407u;
    return (float)(g_rng >> 41) / 4194304.0f - 1.0f;
}

/* The scalar kernels (KERN_ISA_REF) against double precision, and the SIMD ones against the
 * scalar ones, on ragged shapes (in not a multiple of 8, out not of 32, rank above the
 * 64-rank panel buffer), both weight dtypes, per-token and uniform scales, and sub-ranges. */
static void test_kernels_ref_vs_fast(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    const enum kern_isa best = kern_isa();
    const size_t ins[] = {1, 7, 8, 37, 64, 203};
    const size_t outs[] = {1, 31, 32, 33, 100, 260};
    const size_t ranks[] = {1, 2, 5, 16, 32, 70};
    const size_t ns[] = {1, 2, 3, 4, 5, 9};
    for (int dti = 0; dti < 2; dti++)
        for (int c = 0; c < 6; c++) {
            enum dtype dt = dti ? DT_BF16 : DT_F32;
            size_t in = ins[c], out = outs[(c + 2) % 6], r = ranks[(c + dti) % 6];
            size_t n = ns[(c * 5 + dti) % 6], ldy = out + 5;
            size_t esz = dt == DT_BF16 ? 2 : 4;
            /* bt in the packed panel layout (lora_bt_index), padding zero */
            unsigned char *a = malloc(r * in * esz), *bt = calloc(lora_bt_elems(out, r), esz);
            float *af = malloc(r * in * 4), *btf = malloc(r * out * 4);
            for (size_t i = 0; i < r * in; i++) {
                float v = urand();
                if (dt == DT_BF16) {
                    uint16_t h = half_f32_to_bf16(v);
                    memcpy(a + 2 * i, &h, 2);
                    af[i] = half_bf16_to_f32(h);
                } else {
                    memcpy(a + 4 * i, &v, 4);
                    af[i] = v;
                }
            }
            for (size_t i = 0; i < r * out; i++) { /* btf [r][out] */
                float v = urand();
                size_t d = lora_bt_index(r, i / out, i % out);
                if (dt == DT_BF16) {
                    uint16_t h = half_f32_to_bf16(v);
                    memcpy(bt + 2 * d, &h, 2);
                    btf[i] = half_bf16_to_f32(h);
                } else {
                    memcpy(bt + 4 * d, &v, 4);
                    btf[i] = v;
                }
            }
            float *x = malloc(n * in * 4), *scale = malloc(n * 4);
            for (size_t i = 0; i < n * in; i++)
                x[i] = urand();
            for (size_t i = 0; i < n; i++)
                scale[i] = i == 1 ? 0.0f : 0.5f + urand();
            float *t_ref = malloc(n * r * 4), *t_fast = malloc(n * r * 4);
            float *y0 = malloc(n * ldy * 4), *y_ref = malloc(n * ldy * 4);
            float *y_fast = malloc(n * ldy * 4);
            for (size_t i = 0; i < n * ldy; i++)
                y0[i] = urand() * 4.0f;
            const size_t k0 = r > 3 ? 1 : 0, j0 = out > 40 ? 3 : 0, j1 = out > 40 ? out - 2 : out;
            for (int uni = 0; uni < 2; uni++) {
                const float *sc = uni ? NULL : scale;
                const float su = 0.75f;
                assert_int_equal(kern_force_isa(KERN_ISA_REF), 0);
                memset(t_ref, 0, n * r * 4);
                kern_lora_shrink(dt, a, in, r, x, n, t_ref, 0, r);
                memcpy(y_ref, y0, n * ldy * 4);
                kern_lora_expand(dt, bt, r, t_ref, n, sc, su, y_ref, ldy, j0, j1);
                /* reference against double precision */
                for (size_t i = 0; i < n; i++) {
                    double tk[80];
                    for (size_t k = 0; k < r; k++) {
                        double acc = 0;
                        for (size_t cc = 0; cc < in; cc++)
                            acc += (double)x[i * in + cc] * af[k * in + cc];
                        tk[k] = acc;
                        assert_true(fabs(t_ref[i * r + k] - acc) <= 1e-5 * (1 + fabs(acc)) * in);
                    }
                    for (size_t j = 0; j < out; j++) {
                        double want = y0[i * ldy + j];
                        if (j >= j0 && j < j1) {
                            double acc = 0;
                            for (size_t k = 0; k < r; k++)
                                acc += tk[k] * btf[k * out + j];
                            want += (sc ? sc[i] : su) * acc;
                        }
                        if (fabs(y_ref[i * ldy + j] - want) > 2e-5 * (1 + fabs(want)) * r)
                            fail_msg("%s in %zu out %zu r %zu: ref y[%zu][%zu] = %g, want %g",
                                     dt == DT_BF16 ? "bf16" : "f32", in, out, r, i, j,
                                     (double)y_ref[i * ldy + j], want);
                    }
                    /* outside [j0, j1), padding, and zero-scale tokens: untouched bits */
                    for (size_t j = 0; j < ldy; j++)
                        if (j < j0 || j >= j1 || (sc && sc[i] == 0.0f))
                            assert_true(y_ref[i * ldy + j] == y0[i * ldy + j]);
                }
                /* bf16 weights on AVX512-BF16 take the bf16-activation kernels, checked
                 * against their own twin in test_kernels_bf16_dot; here the AVX2 ones */
                assert_int_equal(kern_force_isa(dt == DT_BF16 && best == KERN_ISA_AVX512
                                                    ? KERN_ISA_AVX2
                                                    : best),
                                 0);
                /* the fast shrink on a sub-range of ranks writes only those */
                memset(t_fast, 0xff, n * r * 4);
                kern_lora_shrink(dt, a, in, r, x, n, t_fast, k0, r);
                kern_lora_shrink(dt, a, in, r, x, n, t_fast, 0, k0);
                for (size_t i = 0; i < n * r; i++)
                    if (fabsf(t_fast[i] - t_ref[i]) > 1e-5f * (1.0f + fabsf(t_ref[i])))
                        fail_msg("shrink %zu: fast %g, ref %g", i, (double)t_fast[i],
                                 (double)t_ref[i]);
                memcpy(y_fast, y0, n * ldy * 4);
                /* from the same T, so only the expand's summation order differs */
                kern_lora_expand(dt, bt, r, t_ref, n, sc, su, y_fast, ldy, j0, j1);
                for (size_t i = 0; i < n * ldy; i++)
                    if (fabsf(y_fast[i] - y_ref[i]) > 1e-5f * (1.0f + fabsf(y_ref[i])))
                        fail_msg("expand y[%zu][%zu]: fast %g, ref %g", i / ldy, i % ldy,
                                 (double)y_fast[i], (double)y_ref[i]);
            }
            free(a); free(bt); free(af); free(btf); free(x); free(scale);
            free(t_ref); free(t_fast); free(y0); free(y_ref); free(y_fast);
        }
    assert_int_equal(kern_force_isa(best), 0);
}

/* The bf16-activation kernels (kern.h, "LoRA shrink and expand in bf16"): the scalar twin
 * against double precision with x and t rounded to bf16 (only the f32 sums' order may
 * differ), the AVX512-BF16 kernels against the twin, on ragged shapes; a token's bits do
 * not depend on the tokens beside it (the same token alone and in a block of n). */
static void test_kernels_bf16_dot(void **state)
{
    /* /isa_case_ref: the scalar twin; /isa_case_avx512bf16 (skipped without AVX512-BF16):
     * the SIMD kernels against it too */
    const bool simd = isa_case_begin(state)->bf16;
    const size_t ins[] = {1, 31, 32, 33, 172, 2048};
    const size_t outs[] = {1, 31, 32, 33, 100, 260};
    const size_t ranks[] = {1, 2, 5, 16, 32, 70};
    const size_t ns[] = {1, 2, 3, 4, 5, 9};
    /* the seventh: 3 tokens of an input too wide for the AVX-512 shrink's 2-row blocks (its
     * 4-row ones at 3-4 tokens, kernels/x86/avx512_lora.c SHRINK_X_L1) */
    for (int c = 0; c < 7; c++) {
        size_t in = c < 6 ? ins[c] : 4500, out = c < 6 ? outs[(c + 2) % 6] : 100;
        size_t r = c < 6 ? ranks[(c + 1) % 6] : 9, n = c < 6 ? ns[(c * 5) % 6] : 3;
        size_t ldy = out + 3, P = KERN_LORA_PANEL;
        size_t nbt = (out + P - 1) / P * P * r;
        uint16_t *a = malloc(r * in * 2), *bt = calloc(nbt, 2);
        float *x = malloc(n * in * 4), *t = malloc(n * r * 4), *t2 = malloc(n * r * 4);
        float *t1 = malloc(r * 4), *y0 = malloc(n * ldy * 4), *y = malloc(n * ldy * 4);
        float *y2 = malloc(n * ldy * 4), *y1 = malloc(ldy * 4), *sc = malloc(n * 4);
        for (size_t i = 0; i < r * in; i++)
            a[i] = half_f32_to_bf16(urand());
        for (size_t k = 0; k < r; k++)
            for (size_t j = 0; j < out; j++)
                bt[j / P * r * P + k * P + j % P] = half_f32_to_bf16(urand());
        for (size_t i = 0; i < n * in; i++)
            x[i] = urand();
        for (size_t i = 0; i < n; i++)
            sc[i] = i == 1 ? 0.0f : 0.5f + urand();
        for (size_t i = 0; i < n * ldy; i++)
            y0[i] = urand() * 4.0f;
        const size_t j0 = out > 40 ? 3 : 0, j1 = out > 40 ? out - 2 : out;
        kern_lora_shrink_bf16_bf16_ref(a, in, r, x, n, t, 0, r);
        memcpy(y, y0, n * ldy * 4);
        kern_lora_expand_bf16_bf16_ref(bt, r, t, n, sc, 0.0f, y, ldy, j0, j1);
        for (size_t i = 0; i < n; i++) {
            double tk[80];
            for (size_t k = 0; k < r; k++) {
                double acc = 0, mag = 0;
                for (size_t q = 0; q < in; q++) {
                    double xv = half_bf16_to_f32(half_f32_to_bf16(x[i * in + q]));
                    acc += xv * half_bf16_to_f32(a[k * in + q]);
                    mag += fabs(xv * half_bf16_to_f32(a[k * in + q]));
                }
                tk[k] = t[i * r + k];
                if (fabs(t[i * r + k] - acc) > 1e-6 * (1 + mag) * in)
                    fail_msg("twin shrink in %zu r %zu: %g, want %g", in, r,
                             (double)t[i * r + k], acc);
            }
            for (size_t j = 0; j < ldy; j++) {
                double want = y0[i * ldy + j], mag = 0;
                if (j >= j0 && j < j1 && sc[i] != 0.0f) {
                    double acc = 0;
                    for (size_t k = 0; k < r; k++) {
                        double p = half_bf16_to_f32(half_f32_to_bf16((float)tk[k])) *
                                   (double)half_bf16_to_f32(bt[j / P * r * P + k * P + j % P]);
                        acc += p;
                        mag += fabs(p);
                    }
                    want += sc[i] * acc;
                }
                if (fabs(y[i * ldy + j] - want) > 1e-6 * (1 + fabs(want) + mag * r))
                    fail_msg("twin expand out %zu r %zu: y[%zu][%zu] %g, want %g", out, r, i, j,
                             (double)y[i * ldy + j], want);
                if ((j < j0 || j >= j1 || sc[i] == 0.0f) && y[i * ldy + j] != y0[i * ldy + j])
                    fail_msg("twin expand wrote y[%zu][%zu] outside its range", i, j);
            }
        }
        /* x rounded once (kern_lora_bf16_x): zeros past in, and the shrink on it gives
         * the twin's bits */
        {
            const size_t ldx = KERN_LORA_BF16_LDX(in);
            uint16_t *xb = aligned_alloc(64, n * ldx * 2);
            float *tb = malloc(n * r * 4);
            memset(xb, 0xff, n * ldx * 2);
            kern_lora_bf16_x_ref(x, in, n, xb);
            for (size_t i = 0; i < n; i++)
                for (size_t q = 0; q < ldx; q++)
                    assert_int_equal(xb[i * ldx + q],
                                     q < in ? half_f32_to_bf16(x[i * in + q]) : 0);
            kern_lora_shrink_bf16x_ref(a, in, r, xb, n, tb, 0, r);
            assert_memory_equal(tb, t, n * r * 4);
            if (simd) { /* the AVX-512 twins: the same codes, the same bits as today's shrink */
                uint16_t *xb2 = aligned_alloc(64, n * ldx * 2);
                float *ts = malloc(n * r * 4), *tb2 = malloc(n * r * 4);
                memset(xb2, 0xff, n * ldx * 2);
                kern_lora_bf16_x_avx512(x, in, n, xb2);
                assert_memory_equal(xb2, xb, n * ldx * 2);
                size_t kk = r > 3 ? 2 : 0;
                kern_lora_shrink_bf16_bf16_avx512(a, in, r, x, n, ts, 0, r);
                kern_lora_shrink_bf16x_avx512(a, in, r, xb2, n, tb2, kk, r);
                kern_lora_shrink_bf16x_avx512(a, in, r, xb2, n, tb2, 0, kk);
                assert_memory_equal(tb2, ts, n * r * 4);
                /* the entries pick the active ISA's pair (the test's ISA is set) */
                if (kern_lora_shrink_rounds_x(DT_BF16, r)) {
                    kern_lora_bf16_x(x, in, n, xb2);
                    kern_lora_shrink_bf16x(a, in, r, xb2, n, tb2, 0, r);
                    kern_lora_shrink(DT_BF16, a, in, r, x, n, ts, 0, r);
                    assert_memory_equal(tb2, ts, n * r * 4);
                }
                free(xb2); free(ts); free(tb2);
            }
            free(xb); free(tb);
        }
        if (!simd)
            goto next;
        /* SIMD against the twin, a sub-range of ranks first */
        memset(t2, 0xff, n * r * 4);
        size_t k0 = r > 3 ? 1 : 0;
        kern_lora_shrink_bf16_bf16_avx512(a, in, r, x, n, t2, k0, r);
        kern_lora_shrink_bf16_bf16_avx512(a, in, r, x, n, t2, 0, k0);
        for (size_t i = 0; i < n * r; i++) {
            double mag = 0;
            for (size_t q = 0; q < in; q++)
                mag += fabs(x[i / r * in + q] * half_bf16_to_f32(a[i % r * in + q]));
            if (fabs(t2[i] - t[i]) > 1e-6 * (1 + mag) * in)
                fail_msg("avx512 shrink in %zu r %zu: t[%zu] %g, twin %g", in, r, i,
                         (double)t2[i], (double)t[i]);
        }
        memcpy(y2, y0, n * ldy * 4);
        kern_lora_expand_bf16_bf16_avx512(bt, r, t, n, sc, 0.0f, y2, ldy, j0, j1);
        for (size_t i = 0; i < n * ldy; i++) {
            if (fabsf(y2[i] - y[i]) > 1e-5f * (1.0f + fabsf(y[i])) * (float)r)
                fail_msg("avx512 expand out %zu r %zu: y[%zu] %g, twin %g", out, r, i,
                         (double)y2[i], (double)y[i]);
            if ((i % ldy < j0 || i % ldy >= j1 || sc[i / ldy] == 0.0f) && y2[i] != y0[i])
                fail_msg("avx512 expand wrote y[%zu] outside its range", i);
        }
        /* batched = alone: the last token by itself gives the same bits */
        {
            size_t i = n - 1;
            kern_lora_shrink_bf16_bf16_avx512(a, in, r, x + i * in, 1, t1, 0, r);
            assert_memory_equal(t1, t2 + i * r, r * 4);
            memcpy(y1, y0 + i * ldy, ldy * 4);
            kern_lora_expand_bf16_bf16_avx512(bt, r, t + i * r, 1, sc + i, 0.0f, y1, ldy, j0,
                                              j1);
            assert_memory_equal(y1, y2 + i * ldy, ldy * 4);
        }
    next:
        free(a); free(bt); free(x); free(t); free(t2); free(t1);
        free(y0); free(y); free(y2); free(y1); free(sc);
    }
}

/* --lora-weights bf16 (lora_repack): an f32 adapter repacked to bf16 gets a new digest and
 * computes the same update up to bf16 rounding (of the weights, and of x and A x on
 * AVX512-BF16); auto leaves it alone; the registry applies its packing at load; an unknown
 * packing name is refused naming the value. */
static void test_repack_bf16(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    struct iebin_hparams hp = peft_small_hparams();
    struct peft_adapter *pa = peft_adapter_random(&hp, 8, 16.0, ALL_MASK, 31, 0.3f, 0.3f);
    char *d = subdir("repack");
    peft_adapter_write(pa, d, SAFETENSORS_F32, "");
    peft_adapter_free(pa);
    struct lora_adapter *a32, *a16;
    assert_int_equal(lora_open(d, &hp, &a32), 0);
    assert_int_equal(lora_open(d, &hp, &a16), 0);
    assert_int_equal(a32->fast_dt, DT_F32);
    uint64_t dg = a16->digest;
    assert_int_equal(lora_repack(a16, LORA_PACK_AUTO), 0);
    assert_int_equal(a16->fast_dt, DT_F32);
    assert_true(a16->digest == dg);
    assert_int_equal(lora_repack(a16, LORA_PACK_BF16), 0);
    assert_int_equal(a16->fast_dt, DT_BF16);
    assert_true(a16->digest != dg && a16->digest != 0);

    enum { N = 3 };
    uint32_t in, out;
    lora_target_dims(&hp, LORA_GATE, &in, &out);
    float *x = malloc((size_t)N * in * 4), *y32 = calloc((size_t)N * out, 4);
    float *y16 = calloc((size_t)N * out, 4), *mag = malloc(out * 4);
    for (size_t i = 0; i < (size_t)N * in; i++)
        x[i] = urand();
    const struct lora_adapter *who32[N] = {a32, a32, a32}, *who16[N] = {a16, a16, a16};
    float scale[N] = {1.0f, 0.5f, 2.0f};
    struct lora_plan p32, p16;
    lora_plan_init(&p32);
    lora_plan_init(&p16);
    assert_int_equal(lora_plan_build(&p32, who32, scale, N), 0);
    assert_int_equal(lora_plan_build(&p16, who16, scale, N), 0);
    float *tmp = malloc(p32.tmp_floats * 4 + p16.tmp_floats * 4);
    struct lora_proj pr32 = {LORA_GATE, x, y32, out}, pr16 = {LORA_GATE, x, y16, out};
    lora_apply_fused(&p32, NULL, 0, &pr32, 1, tmp);
    lora_apply_fused(&p16, NULL, 0, &pr16, 1, tmp);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        naive_mag(a32, scale[i], 0, LORA_GATE, x + (size_t)i * in, mag);
        for (uint32_t o = 0; o < out; o++) {
            float e = fabsf(y16[(size_t)i * out + o] - y32[(size_t)i * out + o]);
            /* weights and (on AVX512-BF16) x and A x each within 2^-9 of themselves */
            if (e > 1e-5f + mag[o] / 64.0f)
                fail_msg("y[%d][%u]: bf16 %g, f32 %g (terms %g)", i, o,
                         (double)y16[(size_t)i * out + o], (double)y32[(size_t)i * out + o],
                         (double)mag[o]);
            worst = fmax(worst, e / (1e-5 + mag[o]));
        }
    }
    print_message("  bf16 repack: worst |diff| / sum|terms| = %.2e\n", worst);
    lora_plan_fini(&p32);
    lora_plan_fini(&p16);
    free(tmp); free(x); free(y32); free(y16); free(mag);
    lora_close(a32);
    lora_close(a16);

    enum lora_pack pk;
    assert_int_equal(lora_pack_parse("bf16", &pk), 0);
    assert_int_equal(pk, LORA_PACK_BF16);
    assert_int_equal(lora_pack_parse("auto", &pk), 0);
    assert_int_equal(pk, LORA_PACK_AUTO);
    log_clear_error();
    assert_int_equal(lora_pack_parse("int3", &pk), ERR_FORMAT);
    assert_non_null(strstr(log_last_error(), "'int3'"));

    struct lora_registry *reg;
    assert_int_equal(lora_registry_create(&hp, 0, &reg), 0);
    lora_registry_set_pack(reg, LORA_PACK_BF16);
    assert_int_equal(lora_registry_load(reg, "r", d), 0);
    assert_int_equal(lora_registry_at(reg, 0)->fast_dt, DT_BF16);
    lora_registry_destroy(reg);
    free(d);
}

/* lora_apply_fused (the engine's path: packed weights, q/k/v as one group) against the
 * double-precision definition for a mixed batch of an f32 adapter (f32 packing), a BF16 one
 * (bf16 packing), base and zero-scale tokens; on a pool and on the calling thread: the same
 * bits, whatever the number of threads. */
static void test_apply_fused(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    struct iebin_hparams hp = peft_small_hparams();
    hp.ffn_dim = 300; /* expand tasks of 256 columns + a ragged one */
    hp.dim = 40;
    hp.n_heads = 5;
    hp.n_kv_heads = 5;
    hp.head_dim = 8;
    struct peft_adapter *p1 = peft_adapter_random(&hp, 5, 10.0, ALL_MASK, 21, 0.3f, 0.3f);
    struct peft_adapter *p2 = peft_adapter_random(&hp, 17, 8.0, ALL_MASK & ~(1u << LORA_K), 22,
                                                  0.3f, 0.3f);
    char *d1 = subdir("fu1"), *d2 = subdir("fu2");
    peft_adapter_write(p1, d1, SAFETENSORS_F32, "");
    peft_adapter_write(p2, d2, SAFETENSORS_BF16, "");
    peft_adapter_free(p1);
    peft_adapter_free(p2);
    struct lora_adapter *a1, *a2;
    assert_int_equal(lora_open(d1, &hp, &a1), 0);
    assert_int_equal(lora_open(d2, &hp, &a2), 0);
    assert_int_equal(a1->fast_dt, DT_F32);
    assert_int_equal(a2->fast_dt, DT_BF16);

    enum { N = 23 };
    const struct lora_adapter *who[N];
    float scale[N];
    for (int i = 0; i < N; i++) {
        who[i] = i < 6 ? a1 : i < 9 ? NULL : i < 20 ? a2 : a1;
        scale[i] = i == 12 ? 0.0f : 0.5f + 0.25f * (float)(i % 4);
    }
    struct lora_plan plan;
    lora_plan_init(&plan);
    assert_int_equal(lora_plan_build(&plan, who, scale, N), 0);
    struct pool *pool;
    assert_int_equal(pool_create(3, POOL_PIN_NONE, &pool), 0);
    const enum lora_target groups[3][3] = {{LORA_Q, LORA_K, LORA_V}, {LORA_GATE, LORA_UP, 0},
                                           {LORA_DOWN, 0, 0}};
    const size_t group_n[3] = {3, 2, 1};
    float *tmp = malloc(3 * plan.tmp_floats * 4);
    for (uint32_t layer = 0; layer < hp.n_layers; layer++)
        for (int g = 0; g < 3; g++) {
            struct lora_proj pr[3], pr2[3];
            float *x[3], *y0[3], *yp[3], *ys[3];
            uint32_t in, out;
            for (size_t k = 0; k < group_n[g]; k++) {
                lora_target_dims(&hp, groups[g][k], &in, &out);
                x[k] = malloc((size_t)N * in * 4);
                y0[k] = malloc((size_t)N * out * 4);
                yp[k] = malloc((size_t)N * out * 4);
                ys[k] = malloc((size_t)N * out * 4);
                for (size_t i = 0; i < (size_t)N * in; i++)
                    x[k][i] = urand();
                for (size_t i = 0; i < (size_t)N * out; i++)
                    y0[k][i] = urand();
                memcpy(yp[k], y0[k], (size_t)N * out * 4);
                memcpy(ys[k], y0[k], (size_t)N * out * 4);
                pr[k] = (struct lora_proj){groups[g][k], x[k], yp[k], out};
                pr2[k] = (struct lora_proj){groups[g][k], x[k], ys[k], out};
            }
            lora_apply_fused(&plan, pool, layer, pr, group_n[g], tmp);
            lora_apply_fused(&plan, NULL, layer, pr2, group_n[g], tmp);
            for (size_t k = 0; k < group_n[g]; k++) {
                enum lora_target t = groups[g][k];
                lora_target_dims(&hp, t, &in, &out);
                assert_memory_equal(yp[k], ys[k], (size_t)N * out * 4);
                for (int i = 0; i < N; i++) {
                    float *want = malloc(out * 4);
                    memcpy(want, y0[k] + (size_t)i * out, out * 4);
                    if (who[i])
                        naive(who[i], scale[i], layer, t, x[k] + (size_t)i * in, want);
                    if (!who[i] || scale[i] == 0.0f || !lora_weights(who[i], layer, t))
                        assert_memory_equal(yp[k] + (size_t)i * out, want, out * 4);
                    /* bf16 adapters on AVX512-BF16: x and A x rounded to bf16, each
                     * product off by at most 2^-8 of itself */
                    float *mag = calloc(out, 4);
                    if (who[i] && who[i]->fast_dt == DT_BF16 && kern_isa() == KERN_ISA_AVX512 &&
                        kern_has_avx512bf16())
                        naive_mag(who[i], scale[i], layer, t, x[k] + (size_t)i * in, mag);
                    for (size_t o = 0; o < out; o++)
                        if (fabsf(yp[k][(size_t)i * out + o] - want[o]) >
                            1e-4f * (1.0f + fabsf(want[o])) + mag[o] / 128.0f)
                            fail_msg("layer %u %s: y[%d][%zu] = %g, want %g", layer,
                                     lora_target_name(t), i, o,
                                     (double)yp[k][(size_t)i * out + o], (double)want[o]);
                    free(mag);
                    free(want);
                }
                free(x[k]);
                free(y0[k]);
                free(yp[k]);
                free(ys[k]);
            }
        }
    free(tmp);
    pool_destroy(pool);
    lora_plan_fini(&plan);
    lora_close(a1);
    lora_close(a2);
    free(d1);
    free(d2);
}

/*
 * matmul_group_lora (base product + update as one job; each tile's expand run by whichever of
 * its base task and its projection's last shrink finishes second) against
 * matmul_one followed by lora_apply_fused: the same kernels on the same blocks, so the same
 * bits; and the same bits on the calling thread alone and on pools of 2 and 3. Ragged shapes:
 * ffn 700 (not a multiple of the 32-row tile unit: a ragged last tile, which a merged base
 * task of a rank-40 plan computes in two calls split on a panel after requesting the expand's
 * panels), tiles cut at the products' ends and, on a pool, where pool_for cuts its shards,
 * widths not multiples of 8, batches of 1 to 40
 * tokens (several activation-preparing tasks), f32 and bf16 base weights, an f32 adapter and
 * a BF16 one of ranks 5 (one short shrink block) and 17 (two blocks and a ragged one), an
 * int8-packed one of rank 40 (int8 shrink blocks of 32: one whole, one ragged) on the last two
 * tokens of the larger batches and one of rank 3 before them (u codes at rank 40's stride),
 * a rank-2 one alone in a batch of 6 (every shrink first, every tile's expand merged into its
 * base task), base tokens and zero scales mixed in; and a batch
 * without adapters (the base products alone).
 */
static void test_matmul_fused(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    struct iebin_hparams hp = peft_small_hparams();
    hp.ffn_dim = 700; /* a ragged last tile */
    hp.dim = 40;
    hp.n_heads = 5;
    hp.n_kv_heads = 5;
    hp.head_dim = 8;
    struct peft_adapter *p1 = peft_adapter_random(&hp, 5, 10.0, ALL_MASK, 31, 0.3f, 0.3f);
    struct peft_adapter *p2 = peft_adapter_random(&hp, 17, 8.0, ALL_MASK & ~(1u << LORA_K), 32,
                                                  0.3f, 0.3f);
    char *d1 = subdir("mf1"), *d2 = subdir("mf2");
    peft_adapter_write(p1, d1, SAFETENSORS_F32, "");
    peft_adapter_write(p2, d2, SAFETENSORS_BF16, "");
    peft_adapter_free(p1);
    peft_adapter_free(p2);
    struct lora_adapter *a1, *a2, *a3;
    assert_int_equal(lora_open(d1, &hp, &a1), 0);
    assert_int_equal(lora_open(d2, &hp, &a2), 0);
    struct peft_adapter *p3 = peft_adapter_random(&hp, 40, 12.0, ALL_MASK, 33, 0.3f, 0.3f);
    char *d3 = subdir("mf3");
    peft_adapter_write(p3, d3, SAFETENSORS_F32, "");
    peft_adapter_free(p3);
    assert_int_equal(lora_open(d3, &hp, &a3), 0);
    assert_int_equal(lora_repack(a3, LORA_PACK_INT8), 0);
    /* rank 2 (a plan of rank <= 4 puts every shrink first: every base tile merged) */
    struct lora_adapter *a4;
    struct peft_adapter *p4 = peft_adapter_random(&hp, 2, 4.0, ALL_MASK & ~(1u << LORA_O), 34,
                                                  0.3f, 0.3f);
    char *d4 = subdir("mf4");
    peft_adapter_write(p4, d4, SAFETENSORS_BF16, "");
    peft_adapter_free(p4);
    assert_int_equal(lora_open(d4, &hp, &a4), 0);
    /* int8 of rank 3 beside rank 40's: the job's u codes are laid out at the plan's largest
     * rank, each segment's at its own (kern_lora_i8_quant_u, session 18) */
    struct lora_adapter *a5;
    struct peft_adapter *p5 = peft_adapter_random(&hp, 3, 6.0, ALL_MASK & ~(1u << LORA_V), 35,
                                                  0.3f, 0.3f);
    char *d5 = subdir("mf5");
    peft_adapter_write(p5, d5, SAFETENSORS_F32, "");
    peft_adapter_free(p5);
    assert_int_equal(lora_open(d5, &hp, &a5), 0);
    assert_int_equal(lora_repack(a5, LORA_PACK_INT8), 0);
    assert_int_equal(a5->fast_dt, LORA_DT_I8);

    struct pool *pools[3] = {NULL};
    assert_int_equal(pool_create(2, POOL_PIN_NONE, &pools[1]), 0);
    assert_int_equal(pool_create(3, POOL_PIN_NONE, &pools[2]), 0);
    const enum lora_target groups[4][3] = {
        {LORA_Q, LORA_K, LORA_V}, {LORA_O, 0, 0}, {LORA_GATE, LORA_UP, 0}, {LORA_DOWN, 0, 0}};
    const size_t group_n[4] = {3, 1, 2, 1};
    const size_t ns[] = {1, 6, 8, 9, 23, 40}; /* 9: every token on the base model; 6: rank 2 */
    const enum dtype wts[] = {DT_F32, DT_BF16};
    struct matmul_ctx mcs[3];
    for (int pi = 0; pi < 3; pi++) {
        matmul_ctx_init(&mcs[pi], pools[pi]);
        mcs[pi].base_one_job = true; /* the batch without adapters runs the fused job too */
    }
    /* the fused job's cycle accounting (matmul.h), checked at the end */
    uint64_t cyc0[MATMUL_CYC_N], cyc1[MATMUL_CYC_N];
    matmul_lora_cycles_read(cyc0);
    matmul_lora_cycles_enable(true);
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const size_t N = ns[ni];
        const struct lora_adapter **who = malloc(N * sizeof *who);
        float *scale = malloc(N * 4);
        for (size_t i = 0; i < N; i++) {
            who[i] = N == 9 ? NULL : N == 1 ? a2 : i < N / 4 ? a1 : i < N / 3 ? NULL : i < N - 3 ? a2 : a1;
            if (N > 9 && i >= N - 2)
                who[i] = a3;
            if (N > 9 && i == N - 3)
                who[i] = a5;
            if (N == 6)
                who[i] = i == 3 ? NULL : a4;
            scale[i] = i == 5 ? 0.0f : 0.5f + 0.25f * (float)(i % 4);
        }
        struct lora_plan plan;
        lora_plan_init(&plan);
        assert_int_equal(lora_plan_build(&plan, who, scale, N), 0);
        float *tmp = malloc(3 * plan.tmp_floats * 4 + 4);
        for (size_t wi = 0; wi < 2; wi++)
            for (uint32_t layer = 0; layer < hp.n_layers; layer++)
                for (int g = 0; g < 4; g++) {
                    struct lora_proj pr[3];
                    struct matmul_mat bm[3];
                    struct matmul_prod mp[3];
                    float *x[3], *want[3], *got[3];
                    void *w[3];
                    for (size_t k = 0; k < group_n[g]; k++) {
                        uint32_t in, out;
                        lora_target_dims(&hp, groups[g][k], &in, &out);
                        /* q, k, v (and gate, up) share their input, as in the engine */
                        x[k] = k > 0 ? x[0] : malloc(N * in * 4);
                        if (k == 0)
                            for (size_t i = 0; i < N * in; i++)
                                x[k][i] = urand();
                        w[k] = malloc((size_t)out * in * 4);
                        for (size_t i = 0; i < (size_t)out * in; i++) {
                            float v = urand();
                            if (wts[wi] == DT_BF16)
                                ((uint16_t *)w[k])[i] = half_f32_to_bf16(v);
                            else
                                ((float *)w[k])[i] = v;
                        }
                        want[k] = malloc(N * out * 4);
                        got[k] = malloc(N * out * 4);
                        bm[k] = (struct matmul_mat){wts[wi], w[k], out, in, 0, NULL};
                        matmul_one(&mcs[2], &bm[k], x[k], N, want[k], out);
                        pr[k] = (struct lora_proj){groups[g][k], x[k], want[k], out};
                    }
                    lora_apply_fused(&plan, pools[2], layer, pr, group_n[g], tmp);
                    for (int pi = 0; pi < 3; pi++) {
                        for (size_t k = 0; k < group_n[g]; k++) {
                            uint32_t in, out;
                            lora_target_dims(&hp, groups[g][k], &in, &out);
                            for (size_t i = 0; i < N * out; i++)
                                got[k][i] = NAN; /* every value must be written */
                            mp[k] = (struct matmul_prod){&bm[k], x[k], N, got[k], out,
                                                         groups[g][k]};
                        }
                        assert_int_equal(
                            matmul_group_lora(&mcs[pi], mp, group_n[g], &plan, layer, tmp), 0);
                        for (int prepared = 0; prepared < 2; prepared++) {
                            for (size_t k = 0; k < group_n[g]; k++) {
                                uint32_t in, out;
                                lora_target_dims(&hp, groups[g][k], &in, &out);
                                for (size_t i = 0; i < N * out; i++)
                                    if (memcmp(&got[k][i], &want[k][i], 4))
                                        fail_msg("N %zu wt %d layer %u %s pool %d prepared %d: "
                                                 "y[%zu][%zu] = %.9g, want %.9g",
                                                 N, (int)wts[wi], layer,
                                                 lora_target_name(groups[g][k]), pi, prepared,
                                                 i / out, i % out, (double)got[k][i],
                                                 (double)want[k][i]);
                            }
                            /* again on inputs prepared by the caller with the adapters' forms
                             * (matmul_group_begin_lora, as the engine's norm job does), in two
                             * token ranges that split segments */
                            const struct matmul_prep *h =
                                prepared ? NULL
                                         : matmul_group_begin_lora(&mcs[pi], mp, group_n[g],
                                                                   &plan, layer);
                            if (!h)
                                break;
                            for (size_t k = 0; k < group_n[g]; k++) {
                                uint32_t in, out;
                                lora_target_dims(&hp, groups[g][k], &in, &out);
                                for (size_t i = 0; i < N * out; i++)
                                    got[k][i] = NAN;
                            }
                            matmul_prep_rows(h, N / 3, N);
                            matmul_prep_rows(h, 0, N / 3);
                            assert_int_equal(matmul_group_lora_end(&mcs[pi], mp, group_n[g],
                                                                   &plan, layer, tmp),
                                             0);
                        }
                    }
                    for (size_t k = 0; k < group_n[g]; k++) {
                        if (k == 0)
                            free(x[k]);
                        free(w[k]);
                        free(want[k]);
                        free(got[k]);
                    }
                }
        free(tmp);
        lora_plan_fini(&plan);
        free(who);
        free(scale);
    }
    /* every kind ran; each base, shrink and expand interval lies inside a task's, and every
     * task inside its job's time on the caller, which is counted once per participant (the
     * counters are totals: nothing else in this process runs fused jobs meanwhile) */
    matmul_lora_cycles_enable(false);
    matmul_lora_cycles_read(cyc1);
    uint64_t d[MATMUL_CYC_N];
    for (int q = 0; q < MATMUL_CYC_N; q++) {
        d[q] = cyc1[q] - cyc0[q];
        assert_true(d[q] > 0);
    }
    assert_true(d[MATMUL_CYC_BASE] + d[MATMUL_CYC_SHRINK] + d[MATMUL_CYC_EXPAND] <= d[MATMUL_CYC_TASKS]);
    assert_true(d[MATMUL_CYC_TASKS] <= d[MATMUL_CYC_JOB] + d[MATMUL_CYC_JOB] / 100);
    /* off: nothing more is counted */
    {
        const float xs[40] = {0};
        float ys[700];
        const struct matmul_prod one = {&(struct matmul_mat){DT_F32, xs, 1, 40, 0, NULL}, xs, 1,
                                        ys, 1, LORA_Q};
        struct lora_plan none;
        lora_plan_init(&none);
        assert_int_equal(matmul_group_lora(&mcs[1], &one, 1, &none, 0, NULL), 0);
        lora_plan_fini(&none);
        matmul_lora_cycles_read(cyc0);
        for (int q = 0; q < MATMUL_CYC_N; q++)
            assert_true(cyc0[q] == cyc1[q]);
    }
    for (int pi = 0; pi < 3; pi++)
        matmul_ctx_fini(&mcs[pi]);
    pool_destroy(pools[1]);
    pool_destroy(pools[2]);
    lora_close(a1);
    lora_close(a2);
    lora_close(a3);
    lora_close(a4);
    lora_close(a5);
    free(d1);
    free(d2);
    free(d3);
    free(d4);
    free(d5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_ok),
        cmocka_unit_test(test_config_bad),
        cmocka_unit_test(test_permute_roundtrip),
        cmocka_unit_test(test_load_dtypes_and_permutation),
        cmocka_unit_test(test_layers_to_transform),
        cmocka_unit_test(test_load_missing_files),
        cmocka_unit_test(test_load_bad_tensors),
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_release_from_threads),
        cmocka_unit_test(test_apply_grouped),
        cmocka_unit_test(test_apply_on_pool),
        cmocka_unit_test(test_kernels_ref_vs_fast),
        ISA_CASE_TEST(test_kernels_bf16_dot, isa_case_ref),
        ISA_CASE_TEST(test_kernels_bf16_dot, isa_case_avx512bf16),
        cmocka_unit_test(test_repack_bf16),
        cmocka_unit_test(test_apply_fused),
        cmocka_unit_test(test_matmul_fused),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
