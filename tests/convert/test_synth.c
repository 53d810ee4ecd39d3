/*
 * test_synth.c — `clocher synth` (client/offline/synth.h): presets, determinism, the weights'
 * distribution, the synthesized tokenizer, and the acceptance check that one set of synthetic
 * weights reached through the Hugging Face directory (q/k rotate-half) and through the GGUF
 * file (q/k interleaved, dims innermost first) converts to bit-identical IEBIN models for
 * f32, f16 and bf16 sources.
 */
#include "testutil.h"

#include "convert.h"
#include "err.h"
#include "half.h"
#include "iebin.h"
#include "safetensors.h"
#include "synth.h"
#include "tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void assert_files_equal(const char *a, const char *b, bool equal)
{
    size_t la, lb;
    char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    bool same = la == lb && memcmp(x, y, la) == 0;
    if (same != equal)
        fail_msg("%s and %s are %s", a, b, same ? "identical" : "different");
    free(x);
    free(y);
}

static void test_presets(void **state)
{
    (void)state;
    struct iebin_hparams hp;
    enum dtype dt;
    assert_int_equal(synth_preset("tinyllama-1.1b", &hp, &dt), 0);
    /* TinyLlama-1.1B's published shape */
    assert_int_equal(hp.dim, 2048);
    assert_int_equal(hp.n_layers, 22);
    assert_int_equal(hp.n_heads, 32);
    assert_int_equal(hp.n_kv_heads, 4);
    assert_int_equal(hp.head_dim, 64);
    assert_int_equal(hp.ffn_dim, 5632);
    assert_int_equal(hp.vocab_size, 32000);
    assert_int_equal(hp.max_seq_len, 2048);
    assert_true(hp.rope_theta == 10000.0f);
    assert_true(hp.rms_eps == 1e-5f);
    assert_int_equal(dt, DT_BF16);
    assert_int_equal(iebin_check_hparams(&hp, "tinyllama-1.1b"), 0);
    assert_int_equal(synth_preset("demo", &hp, &dt), 0);
    assert_int_equal(iebin_check_hparams(&hp, "demo"), 0);

    tu_log_capture_begin();
    assert_int_equal(synth_preset("gpt-5", &hp, &dt), ERR_NOT_FOUND);
    tu_assert_log_contains("unknown preset 'gpt-5'", "demo or tinyllama-1.1b", NULL);
    tu_log_capture_end();
}

/* Same seed, same bytes; another seed, other weights (same config and tokenizer). */
static void test_deterministic(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char a[4096], b[4096], c[4096], ga[4096], gb[4096];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(c, sizeof c, "%s/c", dir);
    snprintf(ga, sizeof ga, "%s/a.gguf", dir);
    snprintf(gb, sizeof gb, "%s/b.gguf", dir);
    struct synth_opts o = {.preset = "demo", .seed = 42, .layers = 1, .gguf = ga};
    assert_int_equal(synth_model(a, &o), 0);
    o.gguf = gb;
    assert_int_equal(synth_model(b, &o), 0);
    o.gguf = NULL;
    o.seed = 43;
    assert_int_equal(synth_model(c, &o), 0);
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.model"};
    for (int i = 0; i < 3; i++) {
        char pa[4200];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        assert_files_equal(pa, tu_path(b, files[i]), true);
        assert_files_equal(pa, tu_path(c, files[i]), i != 1);
    }
    assert_files_equal(ga, gb, true);
    tu_rmtree(dir);
    free(dir);
}

/* Matrices: mean ~0, std ~0.02, bounded (uniform); norms exactly 1; all finite. */
static void test_weight_distribution(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct synth_opts o = {.preset = "demo", .seed = 5, .layers = 1};
    assert_int_equal(synth_model(dir, &o), 0);
    struct safetensors_file *f;
    assert_int_equal(safetensors_open(tu_path(dir, "model.safetensors"), &f), 0);
    assert_int_equal(f->n_tensors, 2 + 9 + 1);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        assert_int_equal(t->dtype, SAFETENSORS_F32); /* demo's default */
        size_t n = t->size / 4;
        double sum = 0, sq = 0, amax = 0;
        for (size_t k = 0; k < n; k++) {
            float v;
            memcpy(&v, (const char *)t->data + 4 * k, 4);
            assert_true(isfinite(v));
            sum += v, sq += (double)v * v;
            amax = fabs(v) > amax ? fabs(v) : amax;
        }
        double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
        if (strstr(t->name, "norm")) {
            assert_true(mean == 1.0 && sd == 0.0);
        } else {
            if (fabs(mean) > 0.001 || fabs(sd - 0.02) > 0.001 || amax > 0.0347)
                fail_msg("%s: mean %g std %g max %g", t->name, mean, sd, amax);
        }
    }
    safetensors_close(f);
    tu_rmtree(dir);
    free(dir);
}

/* The synthesized SentencePiece vocabulary: specials, 256 byte tokens, fills the vocab, and
 * spells any UTF-8 text losslessly (byte fallback), without <unk>. */
static void test_tokenizer(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct synth_opts o = {.preset = "demo", .layers = 1};
    assert_int_equal(synth_model(dir, &o), 0);
    struct tok *t;
    assert_int_equal(tok_load(tu_path(dir, "tokenizer.model"), &t), 0);
    assert_int_equal(tok_kind(t), TOK_SPM);
    assert_int_equal(tok_vocab_size(t), 4096);
    assert_int_equal(tok_unk(t), 0);
    assert_int_equal(tok_bos(t), 1);
    assert_int_equal(tok_eos(t), 2);
    assert_string_equal(tok_token_str(t, 3), "<0x00>");
    assert_int_equal(tok_token_type(t, 3 + 0xff), TOK_BYTE);
    static const char *const texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "Ünïcödé — 日本語のテキスト 🙂 and\ttabs\nnewlines  double  spaces",
        "x",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        size_t n;
        assert_int_equal(tok_encode(t, texts[i], strlen(texts[i]), true, &ids, &n), 0);
        assert_true(n >= 2);
        assert_int_equal(ids[0], 1);
        for (size_t k = 1; k < n; k++)
            assert_true(ids[k] > 2 && ids[k] < 4096);
        char *back;
        size_t len;
        assert_int_equal(tok_decode(t, ids + 1, n - 1, &back, &len), 0);
        assert_string_equal(back, texts[i]);
        free(back);
        free(ids);
    }
    /* English merges into multi-letter pieces, not bytes */
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "the cat", 7, false, &ids, &n), 0);
    assert_true(n <= 3);
    free(ids);
    tok_free(t);
    tu_rmtree(dir);
    free(dir);
}

/*
 * Acceptance (b): synth's HF directory and its GGUF file convert to bit-identical IEBIN
 * models — hyper-parameters, every tensor's dtype, shape and bytes, and the tokenizer — for
 * each source dtype, which is kept. HF q/k go through the rotate-half → interleaved
 * permutation, GGUF q/k were written interleaved: any error in either breaks the equality.
 */
static void test_hf_equals_gguf(void **state)
{
    (void)state;
    static const enum dtype dts[] = {DT_F32, DT_F16, DT_BF16};
    char *dir = tu_mkdtemp();
    for (int i = 0; i < 3; i++) {
        char hf[4096], gg[4096], a[4096], b[4096];
        snprintf(hf, sizeof hf, "%s/hf%d", dir, i);
        snprintf(gg, sizeof gg, "%s/m%d.gguf", dir, i);
        snprintf(a, sizeof a, "%s/a%d", dir, i);
        snprintf(b, sizeof b, "%s/b%d", dir, i);
        struct synth_opts so = {.preset = "demo", .seed = 7, .layers = 2, .dtype_set = 1,
                                .dtype = dts[i], .gguf = gg};
        assert_int_equal(synth_model(hf, &so), 0);
        struct convert_opts co = {0};
        assert_int_equal(convert_model(hf, a, &co, NULL), 0);
        assert_int_equal(convert_model(gg, b, &co, NULL), 0);

        struct iebin_model *ma, *mb;
        assert_int_equal(iebin_open(a, &ma), 0);
        assert_int_equal(iebin_open(b, &mb), 0);
        assert_memory_equal(&ma->hp.dim, &mb->hp.dim,
                            offsetof(struct iebin_hparams, rope_theta)); /* the u32 fields */
        assert_true(ma->hp.rope_theta == mb->hp.rope_theta);
        assert_true(ma->hp.rms_eps == mb->hp.rms_eps);
        assert_int_equal(ma->hp.tied_embeddings, mb->hp.tied_embeddings);
        assert_int_equal(ma->hp.n_layers, 2);
        assert_int_equal(ma->n_tensors, mb->n_tensors);
        assert_int_equal(ma->n_tensors, 3 + 9 * 2);
        for (size_t k = 0; k < ma->n_tensors; k++) {
            const struct iebin_tensor *ta = &ma->tensors[k], *tb = iebin_find(mb, ta->name);
            assert_non_null(tb);
            bool norm = strstr(ta->name, "norm") != NULL;
            assert_int_equal(ta->dtype, norm ? DT_F32 : dts[i]);
            assert_int_equal(tb->dtype, ta->dtype);
            assert_memory_equal(ta->shape, tb->shape, sizeof ta->shape);
            assert_int_equal(ta->size, tb->size);
            if (memcmp(ta->data, tb->data, ta->size) != 0)
                fail_msg("%s (%s): tensor %s differs between HF and GGUF", hf,
                         dtype_info(dts[i])->name, ta->name);
        }
        assert_non_null(ma->tokenizer_path);
        assert_non_null(mb->tokenizer_path);
        assert_files_equal(ma->tokenizer_path, mb->tokenizer_path, true);
        iebin_close(ma);
        iebin_close(mb);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_output_failures(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    tu_write_file(tu_path(dir, "afile"), "x", 1);
    char out[4096];
    snprintf(out, sizeof out, "%s/afile/out", dir);
    struct synth_opts o = {.preset = "demo", .layers = 1};
    tu_log_capture_begin();
    assert_int_equal(synth_model(out, &o), -ENOTDIR);
    tu_assert_log_contains("afile/out", NULL);
    tu_log_capture_end();

    snprintf(out, sizeof out, "%s/full", dir);
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "100000", 1);
    tu_log_capture_begin();
    assert_int_equal(synth_model(out, &o), -ENOSPC);
    tu_assert_log_contains("No space left on device", NULL);
    tu_log_capture_end();
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    /* config.json is written last: a failed synth is not a model directory */
    assert_int_equal(access(tu_path(out, "config.json"), F_OK), -1);

    o.dtype_set = 1;
    o.dtype = DT_Q8_0;
    tu_log_capture_begin();
    assert_int_equal(synth_model(out, &o), ERR_USAGE);
    tu_assert_log_contains("f32, f16 or bf16", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_weight_distribution),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_hf_equals_gguf),
        cmocka_unit_test(test_output_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
