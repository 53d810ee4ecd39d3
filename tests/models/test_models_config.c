/*
 * test_models_config.c — what Llama 3, Qwen2 and Mistral bring to conversion and to IEBIN
 * (issue 17, "Architectures"), field by field: Hugging Face config.json (convert_hf_config_mem)
 * accepted with the right hyper-parameters, and every field the engine does not implement
 * refused by name; GGUF keys and rope_freqs.weight (convert_model on small GGUF files written
 * here); IEBIN manifests (iebin_check_manifest) and hyper-parameter sets
 * (iebin_check_hparams). The numbers themselves are checked against a float64 reference by
 * test_models.py.
 */
#include "convert.h"
#include "err.h"
#include "gguf.h"
#include "iebin.h"
#include "model.h"
#include "testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* A config with `extra` (JSON members, each followed by a comma, or "") before the required
 * keys; head_dim 16, 2 layers. */
static int config(const char *model_type, const char *extra, struct iebin_hparams *hp)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "{\"model_type\": \"%s\", %s \"hidden_size\": 64, \"intermediate_size\": 96, "
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"vocab_size\": 512, \"rope_theta\": 500000.0}",
                     model_type, extra);
    return convert_hf_config_mem(buf, (size_t)n, "config.json", hp);
}

static void expect_refused(const char *model_type, const char *extra, int rc, const char *needle)
{
    struct iebin_hparams hp;
    tu_log_capture_begin();
    int got = config(model_type, extra, &hp);
    if (got != rc)
        fail_msg("%s %s: rc %d, expected %d; log: %s", model_type, extra, got, rc,
                 tu_log_captured());
    tu_assert_log_contains("config.json", needle, NULL);
    tu_log_capture_end();
}

#define LLAMA3_RS                                                                              \
    "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, " \
    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64},"

static void test_hf_llama3(void **state)
{
    (void)state;
    struct iebin_hparams hp;
    assert_int_equal(config("llama", LLAMA3_RS " \"tie_word_embeddings\": true,", &hp), 0);
    assert_string_equal(iebin_arch_of(&hp), "llama");
    assert_true(hp.tied_embeddings);
    assert_int_equal(hp.rope_scaling.type, IEBIN_ROPE_FREQ_FACTORS);
    /* theta 500000, head_dim 16, L0 64: pair 0 high frequency (1), pair 1 in the smoothed
     * band, pairs 2.. low frequency (the factor) */
    assert_true(hp.rope_freq_factors[0] == 1.0f);
    assert_true(hp.rope_freq_factors[1] > 1.0f && hp.rope_freq_factors[1] < 8.0f);
    for (uint32_t i = 0; i < 8; i++)
        assert_true(hp.rope_freq_factors[i] ==
                    (float)model_llama3_freq_factor(500000.0, 16, i, 8, 1, 4, 64));
    for (uint32_t i = 2; i < 8; i++)
        assert_true(hp.rope_freq_factors[i] == 8.0f);
    assert_true(hp.rope_freq_factors[8] == 0.0f);
    /* "default" alone is plain RoPE; null too */
    assert_int_equal(config("llama", "\"rope_scaling\": {\"rope_type\": \"default\"},", &hp), 0);
    assert_int_equal(hp.rope_scaling.type, IEBIN_ROPE_NONE);
    assert_int_equal(config("llama", "\"rope_scaling\": null,", &hp), 0);
    assert_int_equal(hp.rope_scaling.type, IEBIN_ROPE_NONE);
    /* Llama 3.2's other keys, which change nothing */
    assert_int_equal(config("llama",
                            LLAMA3_RS " \"attention_bias\": false, \"mlp_bias\": false, "
                                      "\"pretraining_tp\": 1, \"head_dim\": 16,",
                            &hp),
                     0);
}

static void test_hf_llama3_refusals(void **state)
{
    (void)state;
    expect_refused("llama",
                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                   "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 64, \"mscale\": 1.0},",
                   ERR_UNSUPPORTED, "rope_scaling.mscale is not implemented");
    expect_refused("llama",
                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                   "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64},",
                   ERR_FORMAT, "rope_scaling.low_freq_factor is missing");
    expect_refused("llama",
                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": \"8\", "
                   "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 64},",
                   ERR_FORMAT, "rope_scaling.factor is not a number > 0");
    expect_refused("llama",
                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                   "\"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 64},",
                   ERR_RANGE, "high_freq_factor 4 must be above low_freq_factor 4");
    expect_refused("llama", "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0},",
                   ERR_UNSUPPORTED, "rope_scaling is not supported with rope_type dynamic");
    expect_refused("llama", "\"rope_scaling\": [1],", ERR_FORMAT,
                   "rope_scaling is not an object");
    expect_refused("llama", "\"sliding_window\": 4096,", ERR_UNSUPPORTED,
                   "sliding_window is set; sliding-window attention is not implemented for llama");
}

static void test_hf_qwen2(void **state)
{
    (void)state;
    struct iebin_hparams hp;
    /* Qwen2.5's window, unused */
    assert_int_equal(config("qwen2",
                            "\"use_sliding_window\": false, \"sliding_window\": 4096, "
                            "\"max_window_layers\": 21, \"tie_word_embeddings\": true,",
                            &hp),
                     0);
    assert_string_equal(iebin_arch_of(&hp), "qwen2");
    assert_true(hp.attn_qkv_bias);
    assert_int_equal(hp.sliding_window, 0);
    assert_false(iebin_layer_slides(&hp, 0));
    expect_refused("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 4096,",
                   ERR_UNSUPPORTED, "use_sliding_window is true");
    expect_refused("qwen2", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0},",
                   ERR_UNSUPPORTED, "rope_type yarn");
    expect_refused("qwen2", "\"layer_types\": [\"full_attention\", \"sliding_attention\"],",
                   ERR_UNSUPPORTED, "layer_types[1] is not \"full_attention\"");
}

static void test_hf_mistral(void **state)
{
    (void)state;
    struct iebin_hparams hp;
    assert_int_equal(config("mistral", "\"sliding_window\": 4096,", &hp), 0);
    assert_string_equal(iebin_arch_of(&hp), "llama");
    assert_int_equal(hp.sliding_window, 4096);
    assert_true(iebin_layer_slides(&hp, 0) && iebin_layer_slides(&hp, 1));
    assert_false(iebin_layer_slides(&hp, 2));
    /* Mistral v0.2+: no window */
    assert_int_equal(config("mistral", "\"sliding_window\": null,", &hp), 0);
    assert_int_equal(hp.sliding_window, 0);
    assert_int_equal(config("mistral",
                            "\"sliding_window\": 16, \"layer_types\": [\"sliding_attention\", "
                            "\"sliding_attention\"],",
                            &hp),
                     0);
    expect_refused("mistral", "\"sliding_window\": 0,", ERR_FORMAT,
                   "'sliding_window' must be a positive integer");
    expect_refused("mistral",
                   "\"sliding_window\": 16, \"layer_types\": [\"sliding_attention\", "
                   "\"full_attention\"],",
                   ERR_UNSUPPORTED, "layer_types[1] is not \"sliding_attention\"");
    expect_refused("mistral", "\"attention_bias\": true,", ERR_UNSUPPORTED,
                   "attention_bias is true");
    expect_refused("mistral", "\"use_sliding_window\": true,", ERR_UNSUPPORTED,
                   "use_sliding_window is true");
    expect_refused("mixtral", "", ERR_UNSUPPORTED, "model_type mixtral is not supported");
}

/* ---- IEBIN ---- */

static struct iebin_hparams dense_hp(void)
{
    struct iebin_hparams hp = {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                               .head_dim = 16, .ffn_dim = 96, .vocab_size = 512,
                               .max_seq_len = 256, .rope_theta = 10000.0f, .rms_eps = 1e-6f};
    return hp;
}

static void expect_hparams_refused(const struct iebin_hparams *hp, const char *needle)
{
    tu_log_capture_begin();
    assert_int_equal(iebin_check_hparams(hp, "hp"), ERR_RANGE);
    tu_assert_log_contains("hp", needle, NULL);
    tu_log_capture_end();
}

static void test_iebin_hparams(void **state)
{
    (void)state;
    struct iebin_hparams hp = dense_hp();
    hp.sliding_window = 8;
    iebin_slide_all(&hp);
    hp.rope_scaling.type = IEBIN_ROPE_FREQ_FACTORS;
    for (int i = 0; i < 8; i++)
        hp.rope_freq_factors[i] = 1.0f + (float)i;
    assert_int_equal(iebin_check_hparams(&hp, "hp"), 0);
    hp.attn_qkv_bias = true;
    assert_int_equal(iebin_check_hparams(&hp, "hp"), 0);

    struct iebin_hparams bad = hp;
    bad.sliding_layers[0] &= ~UINT64_C(2); /* layer 1 full: not a llama/qwen2 shape */
    expect_hparams_refused(&bad, "hparams.sliding_window is set, but architecture qwen2");
    bad = hp;
    bad.sliding_window = 0; /* layer bits without a window */
    expect_hparams_refused(&bad, "hparams.layer_types");
    bad = hp;
    bad.rope_freq_factors[3] = 0.0f;
    expect_hparams_refused(&bad, "rope_freq_factors[3] is 0");
    bad = hp;
    bad.rope_freq_factors[8] = 1.0f; /* beyond head_dim/2 */
    expect_hparams_refused(&bad, "rope_freq_factors[8]");
    bad = hp;
    bad.rope_scaling.type = IEBIN_ROPE_YARN;
    expect_hparams_refused(&bad, "hparams.rope_scaling is set");
    bad = hp;
    bad.swiglu_limit = 7.0f;
    expect_hparams_refused(&bad, "hparams.swiglu_limit is set");
}

/* A manifest of architecture `arch` whose hparams end with `extra` (members after a comma),
 * no tensors: hparams are checked before any tensor. */
static void expect_manifest(const char *arch, const char *extra, int rc, const char *needle)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "{\"format\": \"iebin\", \"version\": 1, \"architecture\": \"%s\", "
                     "\"hparams\": {\"dim\": 64, \"n_layers\": 2, \"n_heads\": 4, "
                     "\"n_kv_heads\": 2, \"head_dim\": 16, \"ffn_dim\": 96, \"vocab_size\": 512, "
                     "\"max_seq_len\": 256, \"rope_theta\": 10000.0, \"rms_eps\": 1e-6, "
                     "\"tied_embeddings\": true%s}, \"blob\": {\"file\": \"model.ie.bin\", "
                     "\"size\": 0}, \"tensors\": []}",
                     arch, extra);
    tu_log_capture_begin();
    int got = iebin_check_manifest("m.json", buf, (size_t)n, 0);
    if (got != rc)
        fail_msg("%s %s: rc %d, expected %d; log: %s", arch, extra, got, rc, tu_log_captured());
    tu_assert_log_contains("m.json", needle, NULL);
    tu_log_capture_end();
}

static void test_iebin_manifest(void **state)
{
    (void)state;
    /* valid hparams: the first fault is the missing tensor */
    expect_manifest("qwen2", ", \"sliding_window\": 8, \"rope_freq_factors\": [1, 1, 2, 2, 8, 8, 8, 8]",
                    ERR_NOT_FOUND, "tok_embd");
    expect_manifest("llama", ", \"rope_freq_factors\": [1, 2]", ERR_RANGE,
                    "an array of head_dim/2 = 8 numbers");
    expect_manifest("llama", ", \"rope_freq_factors\": 8", ERR_FORMAT,
                    "hparams.rope_freq_factors is");
    expect_manifest("llama", ", \"rope_freq_factors\": [1, 1, 1, \"x\", 1, 1, 1, 1]", ERR_FORMAT,
                    "hparams.rope_freq_factors[3]");
    expect_manifest("llama", ", \"rope_freq_factors\": [1, 1, 1, -1, 1, 1, 1, 1]", ERR_RANGE,
                    "rope_freq_factors[3] is -1");
    expect_manifest("llama", ", \"sliding_window\": 0", ERR_RANGE, "hparams.sliding_window");
    expect_manifest("qwen2", ", \"layer_types\": [\"full_attention\", \"full_attention\"]",
                    ERR_UNSUPPORTED, "hparams.layer_types is a gpt_oss key; architecture qwen2");
    expect_manifest("llama", ", \"rope_scaling\": {\"type\": \"yarn\"}", ERR_UNSUPPORTED,
                    "hparams.rope_scaling is a gpt_oss key");
    expect_manifest("mistral", "", ERR_UNSUPPORTED, "architecture 'mistral'");
}

/* ---- GGUF ---- */

/* A GGUF of architecture `arch` with the basic keys, `sw` (0: none) as
 * <arch>.attention.sliding_window and a rope_freqs.weight of n_freqs floats (0: none); no
 * other tensor, so a file the hyper-parameters accept fails on token_embd. */
static void write_gguf(const char *path, const char *arch, uint32_t sw, uint64_t n_freqs)
{
    struct gguf_writer *w;
    char k[96];
    assert_int_equal(gguf_writer_create(path, &w), 0);
    assert_int_equal(gguf_writer_kv_str(w, "general.architecture", arch), 0);
    static const struct {
        const char *key;
        uint32_t v;
    } keys[] = {{"embedding_length", 64}, {"feed_forward_length", 96}, {"block_count", 2},
                {"attention.head_count", 4}, {"attention.head_count_kv", 2}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, keys[i].key);
        assert_int_equal(gguf_writer_kv_u32(w, k, keys[i].v), 0);
    }
    if (sw) {
        snprintf(k, sizeof k, "%s.attention.sliding_window", arch);
        assert_int_equal(gguf_writer_kv_u32(w, k, sw), 0);
    }
    float f[16] = {1, 1, 2, 2, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    if (n_freqs)
        assert_int_equal(gguf_writer_add_tensor(w, "rope_freqs.weight", GGUF_GGML_F32,
                                                (uint64_t[]){n_freqs}, 1, f, n_freqs * 4),
                         0);
    assert_int_equal(gguf_writer_finish(w), 0);
}

static void expect_gguf(const char *dir, const char *arch, uint32_t sw, uint64_t n_freqs, int rc,
                        const char *needle)
{
    char path[4096], out[4096];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    write_gguf(path, arch, sw, n_freqs);
    struct convert_opts o = {0};
    enum convert_fault fault;
    tu_log_capture_begin();
    int got = convert_model(path, out, &o, &fault);
    if (got != rc)
        fail_msg("%s sw %u freqs %llu: rc %d, expected %d; log: %s", arch, sw,
                 (unsigned long long)n_freqs, got, rc, tu_log_captured());
    tu_assert_log_contains("m.gguf", needle, NULL);
    tu_log_capture_end();
}

static void test_gguf_keys(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    /* accepted hyper-parameters: the missing embedding is the first fault */
    expect_gguf(dir, "llama", 8, 8, ERR_FORMAT, "token_embd.weight");
    expect_gguf(dir, "qwen2", 0, 8, ERR_FORMAT, "token_embd.weight");
    expect_gguf(dir, "qwen2", 8, 0, ERR_UNSUPPORTED,
                "qwen2.attention.sliding_window is 8; sliding-window attention is implemented "
                "for llama");
    expect_gguf(dir, "llama", 0, 4, ERR_MISMATCH, "'rope_freqs.weight' is not F32 [head_dim/2 = 8]");
    expect_gguf(dir, "mistral", 0, 0, ERR_UNSUPPORTED, "general.architecture is mistral");
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_llama3),     cmocka_unit_test(test_hf_llama3_refusals),
        cmocka_unit_test(test_hf_qwen2),      cmocka_unit_test(test_hf_mistral),
        cmocka_unit_test(test_iebin_hparams), cmocka_unit_test(test_iebin_manifest),
        cmocka_unit_test(test_gguf_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
