/*
 * test_tok_fixtures.c — acceptance of the tokenizers on real vocabularies: every test string
 * of llama.cpp's Llama SentencePiece and GPT-2 vocabulary tests must encode to exactly the
 * expected ids (no BOS) and decode back to itself, through every way each vocabulary can be
 * loaded: GGUF, tokenizer.model, tokenizer.bin, tokenizer.ie.json (saved and reloaded, and
 * inside an IEBIN model directory), and Hugging Face tokenizer.json generated from the
 * vocabulary. Also: the sources agree with each other, and long texts encode in well under a
 * second (no quadratic behaviour).
 */
#include "testutil.h"

#include "tokfix.h"

#include "err.h"
#include "mono.h"
#include "tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPM_GGUF "ggml-vocab-llama-spm.gguf"
#define GPT2_GGUF "ggml-vocab-gpt-2.gguf"

static struct tok *load_path(const char *rel)
{
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load(tu_fixture(rel), &t);
    if (rc != 0)
        fail_msg("tok_load(%s): %s\n%s", rel, err_name(rc), tu_log_captured());
    tu_log_capture_end();
    return t;
}

static struct tok *load_mem(const char *text, const char *kind)
{
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(text, strlen(text), kind, &t);
    if (rc != 0)
        fail_msg("tok_load_mem(%s): %s\n%s", kind, err_name(rc), tu_log_captured());
    tu_log_capture_end();
    return t;
}

static char *ie_json(const struct tok *t)
{
    char *json;
    size_t len;
    assert_int_equal(tok_save_json(t, &json, &len), 0);
    assert_int_equal(strlen(json), len);
    return json;
}

/* ---- Llama SentencePiece -------------------------------------------------------------- */

static void spm_check(const char *rel, const char *label)
{
    struct tokfix fx;
    tokfix_load(SPM_GGUF, &fx);
    struct tok *t = load_path(rel);
    assert_int_equal(tok_kind(t), TOK_SPM);
    assert_int_equal(tok_vocab_size(t), 32000);
    assert_int_equal(tok_bos(t), 1);
    assert_int_equal(tok_eos(t), 2);
    assert_int_equal(tok_unk(t), 0);
    assert_true(tok_add_bos(t));
    assert_int_equal(tok_token_type(t, 0), TOK_UNKNOWN);
    assert_int_equal(tok_token_type(t, 1), TOK_CONTROL);
    assert_int_equal(tok_token_type(t, 3), TOK_BYTE);
    assert_string_equal(tok_token_str(t, 1), "<s>");
    assert_string_equal(tok_token_str(t, 15043), "\xE2\x96\x81Hello");
    tokfix_check(t, &fx, label);
    tok_free(t);
    tokfix_free(&fx);
}

static void spm_gguf(void **state)
{
    (void)state;
    spm_check("tokenizer/" SPM_GGUF, "llama-spm via GGUF");
}

static void spm_model(void **state)
{
    (void)state;
    spm_check("tokenizer/llama2-tokenizer.model", "llama-spm via tokenizer.model");
}

static void spm_bin(void **state)
{
    (void)state;
    spm_check("tokenizer/llama2-tokenizer.bin", "llama-spm via tokenizer.bin");
}

/* The three sources describe the same vocabulary: their tokenizer.ie.json are identical. */
static void spm_sources_agree(void **state)
{
    (void)state;
    struct tok *a = load_path("tokenizer/" SPM_GGUF);
    struct tok *b = load_path("tokenizer/llama2-tokenizer.model");
    struct tok *c = load_path("tokenizer/llama2-tokenizer.bin");
    char *ja = ie_json(a), *jb = ie_json(b), *jc = ie_json(c);
    assert_string_equal(ja, jb);
    assert_string_equal(ja, jc);
    free(ja);
    free(jb);
    free(jc);
    tok_free(a);
    tok_free(b);
    tok_free(c);
}

/* Saved, reloaded, saved again: the same bytes, and the same tokens. */
static void spm_ie_json(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load(SPM_GGUF, &fx);
    struct tok *t = load_path("tokenizer/" SPM_GGUF);
    struct tok *t2 = tokfix_via_ie_json(t);
    tokfix_check(t2, &fx, "llama-spm via tokenizer.ie.json");
    char *j1 = ie_json(t), *j2 = ie_json(t2);
    assert_string_equal(j1, j2);
    free(j1);
    free(j2);
    tok_free(t2);
    tok_free(t);
    tokfix_free(&fx);
}

static void spm_hf_json(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load(SPM_GGUF, &fx);
    struct tok *t = load_path("tokenizer/llama2-tokenizer.model");
    for (int metaspace = 0; metaspace <= 1; metaspace++) {
        char *hf = tokfix_hf_json(t, metaspace);
        struct tok *t2 = load_mem(hf, "hf-json");
        assert_int_equal(tok_kind(t2), TOK_SPM);
        assert_int_equal(tok_vocab_size(t2), 32000);
        assert_int_equal(tok_bos(t2), 1);
        assert_int_equal(tok_eos(t2), 2);
        assert_int_equal(tok_unk(t2), 0);
        assert_int_equal(tok_token_type(t2, 258), TOK_BYTE);
        tokfix_check(t2, &fx, metaspace ? "llama-spm via tokenizer.json (Metaspace)"
                                        : "llama-spm via tokenizer.json (Prepend+Replace)");
        /* and through a file, which tok_load must recognize as Hugging Face's */
        char *dir = tu_mkdtemp();
        tu_write_file(tu_path(dir, "tokenizer.json"), hf, strlen(hf));
        struct tok *t3 = NULL;
        assert_int_equal(tok_load(tu_path(dir, "tokenizer.json"), &t3), 0);
        assert_int_equal(tok_kind(t3), TOK_SPM);
        tok_free(t3);
        tu_rmtree(dir);
        free(dir);
        tok_free(t2);
        free(hf);
    }
    tok_free(t);
    tokfix_free(&fx);
}

/* An IEBIN model directory carries tokenizer.ie.json; tok_load takes the directory. */
static void iebin_dir(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load(SPM_GGUF, &fx);
    struct tok *t = load_path("tokenizer/llama2-tokenizer.bin");
    char *json = ie_json(t);
    char *dir = tu_mkdtemp();
    tu_write_file(tu_path(dir, "tokenizer.ie.json"), json, strlen(json));
    struct tok *t2 = NULL;
    assert_int_equal(tok_load(dir, &t2), 0);
    tokfix_check(t2, &fx, "llama-spm via an IEBIN directory");
    tok_free(t2);
    /* and the file itself, by path */
    assert_int_equal(tok_load(tu_path(dir, "tokenizer.ie.json"), &t2), 0);
    tok_free(t2);
    tu_rmtree(dir);
    free(dir);
    free(json);
    tok_free(t);
    tokfix_free(&fx);
}

/* ---- GPT-2 ---------------------------------------------------------------------------- */

static void gpt2_gguf(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load(GPT2_GGUF, &fx);
    struct tok *t = load_path("tokenizer/" GPT2_GGUF);
    assert_int_equal(tok_kind(t), TOK_BPE);
    assert_int_equal(tok_vocab_size(t), 50257);
    assert_int_equal(tok_bos(t), 50256);
    assert_int_equal(tok_eos(t), 50256);
    assert_false(tok_add_bos(t));
    assert_int_equal(tok_token_type(t, 50256), TOK_CONTROL);
    tokfix_check(t, &fx, "gpt-2 via GGUF");
    tok_free(t);
    tokfix_free(&fx);
}

static void gpt2_ie_json(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load(GPT2_GGUF, &fx);
    struct tok *t = load_path("tokenizer/" GPT2_GGUF);
    struct tok *t2 = tokfix_via_ie_json(t);
    tokfix_check(t2, &fx, "gpt-2 via tokenizer.ie.json");
    char *j1 = ie_json(t), *j2 = ie_json(t2);
    assert_string_equal(j1, j2);
    free(j1);
    free(j2);
    tok_free(t2);
    tok_free(t);
    tokfix_free(&fx);
}

static void gpt2_hf_json(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load(GPT2_GGUF, &fx);
    struct tok *t = load_path("tokenizer/" GPT2_GGUF);
    char *hf = tokfix_hf_json(t, 0);
    struct tok *t2 = load_mem(hf, "hf-json");
    assert_int_equal(tok_kind(t2), TOK_BPE);
    assert_int_equal(tok_eos(t2), 50256);
    tokfix_check(t2, &fx, "gpt-2 via tokenizer.json");
    /* the same vocabulary and merges as the GGUF it came from */
    char *j1 = ie_json(t), *j2 = ie_json(t2);
    assert_string_equal(j1, j2);
    free(j1);
    free(j2);
    tok_free(t2);
    free(hf);
    tok_free(t);
    tokfix_free(&fx);
}

/* ---- performance ---------------------------------------------------------------------- */

/* 100 KB of varied text, and 100 KB with no space at all (one huge pre-token / one run of
 * merges): both must take well under a second (sanitizer builds included). */
static void timed_encode(const struct tok *t, const char *label)
{
    static const char *words[] = {"Hello", "world,", "the", "quick", "brown", "fox", "42",
                                  "\xC3\xA9t\xC3\xA9", "\xF0\x9F\x98\x81", "\xE6\x88\x91",
                                  "don't", "\n", "  ", "jumps"};
    size_t n = 100 * 1024;
    char *text = malloc(n + 64);
    size_t len = 0;
    for (unsigned i = 0; len < n; i++) {
        const char *w = words[(i * 7 + i / 3) % (sizeof words / sizeof words[0])];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
        text[len++] = ' ';
    }
    char *dense = malloc(n);
    for (size_t i = 0; i < n; i++)
        dense[i] = "abcdefghij"[(i * i + i / 7) % 10];
    const char *inputs[2] = {text, dense};
    size_t lens[2] = {len, n};
    for (int k = 0; k < 2; k++) {
        int32_t *ids;
        size_t n_ids;
        double t0 = mono_sec();
        assert_int_equal(tok_encode(t, inputs[k], lens[k], false, &ids, &n_ids), 0);
        double dt = mono_sec() - t0;
        fprintf(stderr, "%s: %zu bytes (%s) -> %zu tokens in %.3f s\n", label, lens[k],
                k ? "no spaces" : "text", n_ids, dt);
        if (dt > 1.0)
            fail_msg("%s: encoding %zu bytes took %.2f s", label, lens[k], dt);
        assert_true(n_ids > lens[k] / 16);
        char *back;
        size_t back_len;
        assert_int_equal(tok_decode(t, ids, n_ids, &back, &back_len), 0);
        assert_int_equal(back_len, lens[k]);
        assert_memory_equal(back, inputs[k], lens[k]);
        free(back);
        free(ids);
    }
    free(dense);
    free(text);
}

static void performance(void **state)
{
    (void)state;
    struct tok *spm = load_path("tokenizer/" SPM_GGUF);
    struct tok *bpe = load_path("tokenizer/" GPT2_GGUF);
    timed_encode(spm, "llama-spm");
    timed_encode(bpe, "gpt-2");
    tok_free(spm);
    tok_free(bpe);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spm_gguf),
        cmocka_unit_test(spm_model),
        cmocka_unit_test(spm_bin),
        cmocka_unit_test(spm_sources_agree),
        cmocka_unit_test(spm_ie_json),
        cmocka_unit_test(spm_hf_json),
        cmocka_unit_test(iebin_dir),
        cmocka_unit_test(gpt2_gguf),
        cmocka_unit_test(gpt2_ie_json),
        cmocka_unit_test(gpt2_hf_json),
        cmocka_unit_test(performance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
