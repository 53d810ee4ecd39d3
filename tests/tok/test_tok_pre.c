/*
 * test_tok_pre.c — the regex pre-tokenizers (worker/tok/tok_pre.c, PCRE2):
 *  - llama.cpp's vocabulary tests for the models whose GGUF names a regex pre-tokenizer
 *    (deepseek-llm, deepseek-coder, mpt, refact): 100% of the cases, through GGUF and through
 *    tokenizer.ie.json saved and reloaded;
 *  - GPT-2's vocabulary test through PCRE2 (a tokenizer.json whose pre_tokenizer is a Split of
 *    GPT-2's regex then ByteLevel without regex), so the PCRE2 path is checked against the
 *    expected ids too, and against the hand-written splitter;
 *  - every GGUF name of the table compiles;
 *  - the split behaviors (Isolated, Removed, MergedWithPrevious/Next, Contiguous, invert,
 *    empty matches) on small texts, seen piece by piece;
 *  - a pattern with catastrophic backtracking on hostile text ends quickly and losslessly;
 *  - ignore_merges: a pre-token that is a token stays whole, through tokenizer.ie.json too.
 */
#include "testutil.h"

#include "tokfix.h"

#include "err.h"
#include "mono.h"
#include "tok.h"
#include "tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- llama.cpp vocabulary tests ---------------------------------------------------------- */

static void vocab_case(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    struct tokfix fx;
    tokfix_load(rel + strlen("tokenizer/"), &fx);
    struct tok *t = load_path(rel);
    char label[96];
    snprintf(label, sizeof label, "%s via GGUF", name);
    tokfix_check(t, &fx, label);
    struct tok *t2 = tokfix_via_ie_json(t);
    snprintf(label, sizeof label, "%s via tokenizer.ie.json", name);
    tokfix_check(t2, &fx, label);
    tok_free(t2);
    tok_free(t);
    tokfix_free(&fx);
}

static void deepseek_llm(void **state)
{
    (void)state;
    vocab_case("deepseek-llm");
}

static void deepseek_coder(void **state)
{
    (void)state;
    vocab_case("deepseek-coder");
}

static void mpt(void **state)
{
    (void)state;
    vocab_case("mpt");
}

static void refact(void **state)
{
    (void)state;
    vocab_case("refact");
}

/* GPT-2's vocabulary test through a Split step run by PCRE2 */
static void gpt2_through_pcre2(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load("ggml-vocab-gpt-2.gguf", &fx);
    struct tok *t = load_path("tokenizer/ggml-vocab-gpt-2.gguf");
    char *hf = tokfix_hf_json(t, 0);
    json_error_t jerr;
    json_t *doc = json_loads(hf, 0, &jerr);
    assert_non_null(doc);
    json_t *pre = json_pack("{ss s[{ss s{ss} ss sb}{ss sb sb}]}", "type", "Sequence",
                            "pretokenizers", "type", "Split", "pattern", "Regex",
                            tok__gpt2_pattern, "behavior", "Isolated", "invert", 0, "type",
                            "ByteLevel", "add_prefix_space", 0, "use_regex", 0);
    json_object_set_new(doc, "pre_tokenizer", pre);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t2 = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(text, strlen(text), "hf-json", &t2);
    if (rc != 0)
        fail_msg("hf-json: %s\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    tokfix_check(t2, &fx, "gpt-2 through PCRE2");
    /* and the two splitters agree on text the fixture lacks */
    static const char *const extra[] = {
        "  leading\u00a0nbsp \t\ttabs\r\n\r\nlines   ", "it's I'M we'LL 'd 's", "x\u3000y \u2028z",
        "\xF0\x9F\x98\x80\xF0\x9F\x98\x80 99bottles 3.14159 ...!!!", "\u0661\u0662\u0663 \u00bd",
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        int32_t *a, *b;
        size_t na, nb;
        assert_int_equal(tok_encode(t, extra[i], strlen(extra[i]), false, &a, &na), 0);
        assert_int_equal(tok_encode(t2, extra[i], strlen(extra[i]), false, &b, &nb), 0);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
        free(a);
        free(b);
    }
    free(text);
    tok_free(t2);
    free(hf);
    tok_free(t);
    tokfix_free(&fx);
}

/* ---- the table --------------------------------------------------------------------------- */

static void every_name_compiles(void **state)
{
    (void)state;
    char *names = strdup(tok__pre_known);
    assert_non_null(names);
    int count = 0;
    for (char *save = NULL, *n = strtok_r(names, ", ", &save); n;
         n = strtok_r(NULL, ", ", &save)) {
        enum tok_pre kind;
        struct tok__pre_step steps[TOK_PRE_MAX_STEPS];
        uint32_t ns = 0;
        bool ign;
        assert_int_equal(tok__pre_by_name(n, strlen(n), &kind, steps, &ns, &ign), 0);
        if (kind == TOK_PRE_GPT2)
            continue;
        struct tok__pre_rx *rx;
        tu_log_capture_begin();
        int rc = tok__pre_compile(n, steps, ns, &rx);
        if (rc != 0)
            fail_msg("%s: %s", n, tu_log_captured());
        tu_log_capture_end();
        tok__pre_free(rx);
        count++;
    }
    free(names);
    assert_true(count >= 12);
    enum tok_pre kind;
    struct tok__pre_step steps[TOK_PRE_MAX_STEPS];
    uint32_t ns;
    bool ign;
    assert_int_equal(tok__pre_by_name("gpt-5", 5, &kind, steps, &ns, &ign), ERR_UNSUPPORTED);
}

/* ---- behaviors --------------------------------------------------------------------------- */

struct pieces {
    char buf[512];
    size_t len;
};

static int collect(void *arg, const char *p, size_t n)
{
    struct pieces *c = arg;
    assert_true(c->len + n + 1 < sizeof c->buf);
    memcpy(c->buf + c->len, p, n);
    c->len += n;
    c->buf[c->len++] = '|';
    c->buf[c->len] = '\0';
    return 0;
}

/* The pieces of text under steps, joined by '|' (one after each piece). */
static void expect_split(const struct tok__pre_step *steps, uint32_t n, const char *text,
                         const char *want)
{
    struct tok__pre_rx *rx;
    tu_log_capture_begin();
    int rc = tok__pre_compile("test", steps, n, &rx);
    if (rc != 0)
        fail_msg("compile: %s", tu_log_captured());
    tu_log_capture_end();
    struct pieces c = {.len = 0};
    c.buf[0] = '\0';
    assert_int_equal(tok__pre_split(rx, text, strlen(text), collect, &c), 0);
    if (strcmp(c.buf, want) != 0)
        fail_msg("/%s/ on '%s': got '%s', want '%s'", steps[n - 1].pattern, text, c.buf, want);
    tok__pre_free(rx);
}

static struct tok__pre_step step(const char *pat, enum tok_split b, bool invert)
{
    return (struct tok__pre_step){pat, (uint32_t)strlen(pat), (uint8_t)b, invert, false};
}

static void behaviors(void **state)
{
    (void)state;
    struct tok__pre_step s;
    s = step("-", TOK_SPLIT_ISOLATED, false);
    expect_split(&s, 1, "a-b--c-", "a|-|b|-|-|c|-|");
    s = step("-", TOK_SPLIT_REMOVED, false);
    expect_split(&s, 1, "a-b--c-", "a|b|c|");
    s = step("-", TOK_SPLIT_MERGED_PREV, false);
    expect_split(&s, 1, "a-b--c-", "a-|b-|-|c-|");
    s = step("-", TOK_SPLIT_MERGED_NEXT, false);
    expect_split(&s, 1, "-a-b--c", "-a|-b|-|-c|");
    s = step("-", TOK_SPLIT_CONTIGUOUS, false);
    expect_split(&s, 1, "a-b--c-", "a|-|b|--|c|-|");
    /* invert: the pattern names the pieces; Removed then keeps only them */
    s = step("[a-z]+", TOK_SPLIT_REMOVED, true);
    expect_split(&s, 1, "ab, cd!", "ab|cd|");
    /* an empty match still separates (digit groups of three from the right) */
    s = step("(?=(\\d{3})+(?!\\d))", TOK_SPLIT_ISOLATED, false);
    expect_split(&s, 1, "1234567", "1|234|567|");
    /* literal patterns are not regexes */
    s = (struct tok__pre_step){".", 1, TOK_SPLIT_ISOLATED, false, true};
    expect_split(&s, 1, "a.b", "a|.|b|");
    /* steps apply inside the pieces of the previous one: the lookahead never sees past */
    struct tok__pre_step two[2] = {step("\\p{N}", TOK_SPLIT_ISOLATED, false),
                                   step(tok__gpt2_pattern, TOK_SPLIT_ISOLATED, false)};
    expect_split(two, 2, "ab12 cd", "ab|1|2| cd|");
    /* Unicode classes (UCP): \p{L} over CJK and accents, \s over U+3000 */
    s = step(" ?\\p{L}+|\\s+", TOK_SPLIT_ISOLATED, false);
    expect_split(&s, 1, "\xC3\xA9t\xC3\xA9 \xE6\x88\x91\xE3\x80\x80x",
                 "\xC3\xA9t\xC3\xA9| \xE6\x88\x91|\xE3\x80\x80|x|");
}

/* o200k's regex on the cases that tell it from GPT-2's and Llama 3's */
static void o200k_pieces(void **state)
{
    (void)state;
    enum tok_pre kind;
    struct tok__pre_step st[TOK_PRE_MAX_STEPS];
    uint32_t n;
    bool ign;
    assert_int_equal(tok__pre_by_name("gpt-4o", 6, &kind, st, &n, &ign), 0);
    assert_int_equal(kind, TOK_PRE_REGEX);
    assert_true(ign);
    expect_split(st, n, "Hello world", "Hello| world|");
    expect_split(st, n, "I'm don't WE'LL", "I'm| don't| WE'LL|");
    expect_split(st, n, "1234567", "123|456|7|");
    expect_split(st, n, "a/b//\n\nc", "a|/b|//\n\n|c|");
    expect_split(st, n, "CamelCase", "Camel|Case|");
    expect_split(st, n, "x   y", "x|  | y|");
}

/* ---- ignore_merges ----------------------------------------------------------------------- */

/* 256 byte characters, then "bc" (256) and "abc" (257); one merge b + c; the pre-tokenizer
 * given; ignore_merges as asked */
static struct tok *abc_vocab(bool ignore_merges)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = b;
        if (!self) {
            cp = 256;
            for (int c = 0; c < b; c++)
                cp += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        }
        char u[3] = {0};
        if (cp < 0x80) {
            u[0] = (char)cp;
        } else {
            u[0] = (char)(0xC0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 0x3F));
        }
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "bc", json_integer(256));
    json_object_set_new(vocab, "abc", json_integer(257));
    json_t *doc = json_pack("{s{sssos[s]sb} s{sss{ss}ss}}", "model", "type", "BPE", "vocab",
                            vocab, "merges", "b c", "ignore_merges", ignore_merges,
                            "pre_tokenizer", "type", "Split", "pattern", "Regex", "\\p{L}+",
                            "behavior", "Isolated");
    assert_non_null(doc);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(text, strlen(text), "hf-json", &t);
    if (rc != 0)
        fail_msg("abc vocabulary: %s\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    free(text);
    return t;
}

static void ignore_merges(void **state)
{
    (void)state;
    for (int ign = 0; ign < 2; ign++) {
        struct tok *t = abc_vocab(ign);
        int32_t *ids;
        size_t n;
        assert_int_equal(tok_encode(t, "abc abcd", 8, false, &ids, &n), 0);
        /* merges alone: a + bc; ignoring them, the word that is a token stays whole; "abcd"
         * is no token, so it merges as usual either way */
        const int32_t merged[] = {'a', 256, ' ', 'a', 256, 'd'};
        const int32_t whole[] = {257, ' ', 'a', 256, 'd'};
        const int32_t *want = ign ? whole : merged;
        size_t nw = ign ? 5 : 6;
        assert_int_equal(n, nw);
        assert_memory_equal(ids, want, nw * sizeof *ids);
        free(ids);
        /* and it survives tokenizer.ie.json */
        char *js;
        size_t len;
        struct tok *t2;
        assert_int_equal(tok_save_json(t, &js, &len), 0);
        assert_int_equal(tok_load_mem(js, len, "ie-json", &t2), 0);
        assert_int_equal(tok_encode(t2, "abc", 3, false, &ids, &n), 0);
        assert_int_equal(n, ign ? 1 : 2);
        free(ids);
        free(js);
        tok_free(t2);
        tok_free(t);
    }
}

/* ---- hostile input ----------------------------------------------------------------------- */

struct tally {
    size_t bytes, pieces;
};

static int count_piece(void *arg, const char *p, size_t n)
{
    (void)p;
    struct tally *k = arg;
    k->bytes += n;
    k->pieces++;
    return 0;
}

static void catastrophic_pattern(void **state)
{
    (void)state;
    /* (a+)+$ on a run of a's then b: exponential without PCRE2's limits */
    struct tok__pre_step s = step("(a+)+$", TOK_SPLIT_ISOLATED, false);
    struct tok__pre_rx *rx;
    assert_int_equal(tok__pre_compile("test", &s, 1, &rx), 0);
    size_t n = 2048;
    char *text = malloc(n);
    memset(text, 'a', n - 1);
    text[n - 1] = 'b';
    struct tally k = {0, 0};
    tu_log_capture_begin();
    double t0 = mono_sec();
    assert_int_equal(tok__pre_split(rx, text, n, count_piece, &k), 0);
    double dt = mono_sec() - t0;
    /* warned once, and every byte is still in some piece */
    tu_assert_log_contains("limit", "the rest of that piece becomes one piece", NULL);
    tu_log_capture_end();
    fprintf(stderr, "(a+)+$ on %zu bytes: %zu pieces in %.2f s\n", n, k.pieces, dt);
    assert_int_equal(k.bytes, n);
    if (dt > 2.0)
        fail_msg("the match limits did not bound the split: %.1f s", dt);
    free(text);
    tok__pre_free(rx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(deepseek_llm),   cmocka_unit_test(deepseek_coder),
        cmocka_unit_test(mpt),            cmocka_unit_test(refact),
        cmocka_unit_test(gpt2_through_pcre2), cmocka_unit_test(every_name_compiles),
        cmocka_unit_test(behaviors),      cmocka_unit_test(o200k_pieces),
        cmocka_unit_test(catastrophic_pattern), cmocka_unit_test(ignore_merges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
