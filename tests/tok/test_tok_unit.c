/*
 * test_tok_unit.c — the tokenizer algorithms on small hand-made vocabularies, where each rule
 * can be seen in isolation: SentencePiece merge order (score, then leftmost), byte fallback,
 * <unk>, unused pieces, user-defined pieces, control pieces never produced from text,
 * whitespace normalization; byte-level BPE merge order, GPT-2 pre-tokenizer splits, added
 * tokens; the Unicode classes and UTF-8 rules underneath.
 */
#include "testutil.h"

#include "err.h"
#include "tok.h"
#include "tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building vocabularies ------------------------------------------------------------- */

struct vt {
    const char *piece;
    const char *type; /* "normal", "unknown", ... */
    double score;
};

static struct tok *load_json_doc(json_t *doc)
{
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(text, strlen(text), "ie-json", &t);
    if (rc != 0)
        fail_msg("tok_load_mem: %s\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    free(text);
    return t;
}

/* SPM vocabulary: the entries, then (with_bytes) the 256 <0xNN> tokens and byte fallback.
 * unk/bos are the first entries typed unknown / named "<s>". */
static struct tok *make_spm(const struct vt *v, size_t n, bool dummy, bool rew, bool with_bytes)
{
    json_t *tokens = json_array(), *types = json_array(), *scores = json_array();
    json_t *unk = json_null(), *bos = json_null();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, json_string(v[i].piece));
        json_array_append_new(types, json_string(v[i].type));
        json_array_append_new(scores, json_real(v[i].score));
        if (strcmp(v[i].type, "unknown") == 0 && json_is_null(unk))
            unk = json_integer((json_int_t)i);
        if (strcmp(v[i].piece, "<s>") == 0)
            bos = json_integer((json_int_t)i);
    }
    for (int b = 0; with_bytes && b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_array_append_new(tokens, json_string(name));
        json_array_append_new(types, json_string("byte"));
        json_array_append_new(scores, json_real(0));
    }
    return load_json_doc(json_pack("{sssiss sososn sb sbsbsb so so so}", "format",
                                   "clocher-tokenizer", "version", 1, "kind", "spm", "bos", bos,
                                   "unk", unk, "eos", "add_bos", 1, "add_dummy_prefix", dummy,
                                   "remove_extra_whitespaces", rew, "byte_fallback", with_bytes,
                                   "tokens", tokens, "types", types, "scores", scores));
}

/* Byte-level BPE: token b (0..255) is byte b's character, then `extra`, then the merges
 * ("left right" strings). */
static struct tok *make_bpe(const struct vt *extra, size_t n_extra, const char *const *merges,
                            size_t n_merges)
{
    json_t *tokens = json_array(), *types = json_array(), *m = json_array();
    for (int b = 0; b < 256; b++) {
        char c[5] = {0};
        tok__utf8_encode(tok__byte_to_cp((uint8_t)b), c);
        json_array_append_new(tokens, json_string(c));
        json_array_append_new(types, json_string("normal"));
    }
    for (size_t i = 0; i < n_extra; i++) {
        json_array_append_new(tokens, json_string(extra[i].piece));
        json_array_append_new(types, json_string(extra[i].type));
    }
    for (size_t i = 0; i < n_merges; i++) {
        char l[64], r[64];
        assert_int_equal(sscanf(merges[i], "%63s %63s", l, r), 2);
        json_int_t li = -1, ri = -1;
        for (size_t k = 0; k < json_array_size(tokens); k++) {
            const char *s = json_string_value(json_array_get(tokens, k));
            if (strcmp(s, l) == 0)
                li = (json_int_t)k;
            if (strcmp(s, r) == 0)
                ri = (json_int_t)k;
        }
        assert_true(li >= 0 && ri >= 0);
        json_array_append_new(m, json_pack("[II]", li, ri));
    }
    return load_json_doc(json_pack("{sssiss snsnsn sb ss so so so}", "format",
                                   "clocher-tokenizer", "version", 1, "kind", "bpe", "bos",
                                   "unk", "eos", "add_bos", 0, "pre_tokenizer", "gpt2", "tokens",
                                   tokens, "types", types, "merges", m));
}

/* Encodes text and compares the tokens' strings joined by '|' ("ab|a"). */
static void expect_pieces(const struct tok *t, const char *text, const char *want)
{
    int32_t *ids;
    size_t n;
    int rc = tok_encode(t, text, strlen(text), false, &ids, &n);
    if (rc != 0)
        fail_msg("tok_encode('%s'): %s", text, err_name(rc));
    char got[1024] = "";
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(got, "|");
        strcat(got, tok_token_str(t, ids[i]));
    }
    if (strcmp(got, want) != 0)
        fail_msg("'%s' encodes to '%s', expected '%s'", text, got, want);
    free(ids);
}

/* ---- SentencePiece BPE ----------------------------------------------------------------- */

static const struct vt abc[] = {
    {"<unk>", "unknown", 0}, {"<s>", "control", 0}, {"a", "normal", -10},
    {"b", "normal", -10},    {"c", "normal", -10},   {"ab", "normal", -1},
    {"ba", "normal", -1},    {"bc", "normal", -2},   {"abc", "normal", -3},
};

static void spm_merge_order(void **state)
{
    (void)state;
    struct tok *t = make_spm(abc, sizeof abc / sizeof abc[0], false, false, false);
    expect_pieces(t, "aba", "ab|a");         /* ab and ba tie: the leftmost pair merges */
    expect_pieces(t, "bab", "ba|b");
    expect_pieces(t, "abc", "abc");          /* ab (-1) before bc (-2), then ab+c */
    expect_pieces(t, "bcab", "bc|ab");
    expect_pieces(t, "", "");
    tok_free(t);

    /* bc now merges first; SentencePiece merges strings, not listed pairs, so a+bc still
     * makes abc (a rank-based BPE without the pair (a, bc) would stop at a|bc) */
    struct vt v[sizeof abc / sizeof abc[0]];
    memcpy(v, abc, sizeof v);
    v[7].score = 0;
    t = make_spm(v, sizeof v / sizeof v[0], false, false, false);
    expect_pieces(t, "abc", "abc");
    expect_pieces(t, "abcb", "abc|b");
    expect_pieces(t, "bcb", "bc|b");
    tok_free(t);
}

static void spm_unknown_and_bytes(void **state)
{
    (void)state;
    struct tok *t = make_spm(abc, sizeof abc / sizeof abc[0], false, false, false);
    /* no byte fallback: each unknown character is one <unk> */
    expect_pieces(t, "axé", "a|<unk>|<unk>");
    tok_free(t);
    t = make_spm(abc, sizeof abc / sizeof abc[0], false, false, true);
    expect_pieces(t, "axé", "a|<0x78>|<0xC3>|<0xA9>");
    /* control pieces are never produced from text, even when the text spells them */
    expect_pieces(t, "<s>", "<0x3C>|<0x73>|<0x3E>");
    /* decoding puts the bytes back together */
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "axé", 4, true, &ids, &n), 0);
    assert_int_equal(ids[0], 1); /* BOS when asked */
    char *text;
    size_t len;
    assert_int_equal(tok_decode(t, ids, n, &text, &len), 0);
    assert_string_equal(text, "axé");
    free(text);
    free(ids);
    tok_free(t);
}

/* Without a "▁" piece, spaces fall back to the bytes of U+2581; they still decode as
 * spaces, and the dummy prefix is still dropped. A raw <0x20> byte token is a plain space. */
static void spm_space_from_bytes(void **state)
{
    (void)state;
    static const struct vt v[] = {{"<unk>", "unknown", 0}, {"a", "normal", -1},
                                  {"b", "normal", -1}};
    struct tok *t = make_spm(v, 3, true, false, true);
    expect_pieces(t, "a b", "<0xE2>|<0x96>|<0x81>|a|<0xE2>|<0x96>|<0x81>|b");
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "a b", 3, false, &ids, &n), 0);
    char *text;
    size_t len;
    assert_int_equal(tok_decode(t, ids, n, &text, &len), 0);
    assert_string_equal(text, "a b");
    free(text);
    free(ids);
    const int32_t raw[] = {3 + 0x20, 1}; /* <0x20> a */
    assert_int_equal(tok_decode(t, raw, 2, &text, &len), 0);
    assert_string_equal(text, " a");
    free(text);
    tok_free(t);
}

static void spm_unused_pieces(void **state)
{
    (void)state;
    /* "ab" is unused: it may be formed on the way to "abc", never output itself */
    static const struct vt v[] = {
        {"<unk>", "unknown", 0}, {"a", "normal", -10}, {"b", "normal", -10},
        {"c", "normal", -10},    {"ab", "unused", -1}, {"abc", "normal", -2},
    };
    struct tok *t = make_spm(v, sizeof v / sizeof v[0], false, false, false);
    expect_pieces(t, "abc", "abc");
    expect_pieces(t, "ab", "a|b");
    expect_pieces(t, "abab", "a|b|a|b");
    tok_free(t);
}

static void spm_user_defined(void **state)
{
    (void)state;
    static const struct vt v[] = {
        {"<unk>", "unknown", 0},        {"h", "normal", -10},    {"e", "normal", -10},
        {"l", "normal", -10},           {"o", "normal", -10},    {"he", "normal", -1},
        {"hell", "user_defined", -100}, {"lo", "normal", -2},    {"hello", "normal", -3},
        {"[X]", "user_defined", 0},     {"\xE2\x96\x81", "normal", -5},
    };
    struct tok *t = make_spm(v, sizeof v / sizeof v[0], false, false, false);
    /* matched first, longest, and never merged with its neighbours */
    expect_pieces(t, "hello", "hell|o");
    expect_pieces(t, "hel", "he|l");
    expect_pieces(t, "o[X]lo", "o|[X]|lo");
    tok_free(t);
}

static void spm_whitespace(void **state)
{
    (void)state;
    static const struct vt v[] = {
        {"<unk>", "unknown", 0},       {"\xE2\x96\x81", "normal", -10},
        {"a", "normal", -10},          {"b", "normal", -10},
        {"\xE2\x96\x81" "a", "normal", -1},
        {"\xE2\x96\x81" "b", "normal", -1},
    };
    struct tok *t = make_spm(v, sizeof v / sizeof v[0], true, false, false);
    expect_pieces(t, "a b", "\xE2\x96\x81" "a|\xE2\x96\x81" "b");
    expect_pieces(t, " a", "\xE2\x96\x81|\xE2\x96\x81" "a");
    expect_pieces(t, "  ", "\xE2\x96\x81|\xE2\x96\x81|\xE2\x96\x81");
    tok_free(t);
    /* remove_extra_whitespaces: no leading or trailing spaces, runs squeezed */
    t = make_spm(v, sizeof v / sizeof v[0], true, true, false);
    expect_pieces(t, "  a   b  ", "\xE2\x96\x81" "a|\xE2\x96\x81" "b");
    expect_pieces(t, "   ", "");
    tok_free(t);
    /* no dummy prefix */
    t = make_spm(v, sizeof v / sizeof v[0], false, false, false);
    expect_pieces(t, "a b", "a|\xE2\x96\x81" "b");
    tok_free(t);
}

/* ---- byte-level BPE -------------------------------------------------------------------- */

static void bpe_merge_order(void **state)
{
    (void)state;
    static const struct vt extra[] = {{"ab", "normal", 0}, {"bc", "normal", 0},
                                      {"aa", "normal", 0}, {"abc", "normal", 0}};
    static const char *const m1[] = {"a b", "b c", "a a", "ab c"};
    struct tok *t = make_bpe(extra, 4, m1, 4);
    expect_pieces(t, "abc", "abc");
    expect_pieces(t, "aaa", "aa|a"); /* equal ranks: leftmost first */
    expect_pieces(t, "abab", "ab|ab");
    tok_free(t);
    static const char *const m2[] = {"b c", "a b", "a a", "ab c"};
    t = make_bpe(extra, 4, m2, 4);
    expect_pieces(t, "abc", "a|bc"); /* b c now ranks first; ab c never applies */
    tok_free(t);
}

static void bpe_bytes_and_added(void **state)
{
    (void)state;
    static const struct vt extra[] = {{"<|endoftext|>", "control", 0},
                                      {"<|im_start|>", "user_defined", 0},
                                      {"\xC4\xA0" "a", "normal", 0}};
    static const char *const m[] = {"\xC4\xA0 a"};
    struct tok *t = make_bpe(extra, 3, m, 1);
    /* bytes map to GPT-2's characters: space is U+0120, newline U+010A */
    expect_pieces(t, " a\n", "\xC4\xA0" "a|\xC4\x8A");
    /* user-defined (added, not special) tokens are cut out first; control ones never */
    expect_pieces(t, "x<|im_start|> a", "x|<|im_start|>|\xC4\xA0" "a");
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "<|endoftext|>", 13, false, &ids, &n), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(tok_token_type(t, ids[i]), TOK_CONTROL);
    free(ids);
    /* every byte round-trips, including ones that are not UTF-8 on their own */
    const char *s = "\x01\x7F \xC2\xA0\xE2\x82\xAC<|im_start|>\t";
    assert_int_equal(tok_encode(t, s, strlen(s), false, &ids, &n), 0);
    char *text;
    size_t len;
    assert_int_equal(tok_decode(t, ids, n, &text, &len), 0);
    assert_string_equal(text, s);
    free(text);
    free(ids);
    tok_free(t);
}

/* GPT-2's pre-tokens of s, joined by '|'. */
static void expect_split(const char *s, const char *want)
{
    char got[512] = "";
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        size_t e = tok__gpt2_next((const unsigned char *)s, n, i);
        assert_true(e > i && e <= n);
        if (i)
            got[o++] = '|';
        memcpy(got + o, s + i, e - i);
        o += e - i;
        got[o] = '\0';
        i = e;
    }
    if (strcmp(got, want) != 0)
        fail_msg("'%s' splits as '%s', expected '%s'", s, got, want);
}

static void gpt2_pretokenizer(void **state)
{
    (void)state;
    expect_split("Hello world", "Hello| world");
    expect_split("  Hello", " | Hello");
    expect_split("a\n\nb", "a|\n|\n|b");
    expect_split("x  ", "x|  ");
    expect_split("it's I'll we'Ve 'RE", "it|'s| I|'ll| we|'|Ve| '|RE");
    expect_split("3.14 42!! ok", "3|.|14| 42|!!| ok");
    expect_split(" ?!x", " ?!|x");
    expect_split("\t\tx", "\t|\t|x");
    /* Devanagari: a letter, then a vowel sign (Mc), which is neither letter nor number */
    expect_split("\xE0\xA4\x95\xE0\xA4\xBF", "\xE0\xA4\x95|\xE0\xA4\xBF");
    /* ½ is a number (No); U+3000 and U+00A0 are white space */
    expect_split("4 \xC2\xBD", "4| \xC2\xBD");
    expect_split("a\xE3\x80\x80" "b", "a|\xE3\x80\x80|b");
    expect_split("a\xC2\xA0" "b", "a|\xC2\xA0|b");
    /* emoji are "other"; a ZWJ sequence stays together */
#define FOG_FACE "\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB" /* U+1F636 ZWJ U+1F32B */
    expect_split("hi " FOG_FACE "!", "hi| " FOG_FACE "!");
}

/* ---- Unicode and UTF-8 ----------------------------------------------------------------- */

static void unicode_classes(void **state)
{
    (void)state;
    assert_true(tok__is_letter('a') && tok__is_letter('Z') && !tok__is_letter('0'));
    assert_true(tok__is_letter(0xE9));    /* é */
    assert_true(tok__is_letter(0x6211));  /* 我 */
    assert_true(tok__is_letter(0x1780));  /* Khmer KA */
    assert_false(tok__is_letter(0x17B6)); /* Khmer vowel sign AA (Mc) */
    assert_true(tok__is_letter(0x2C6));   /* modifier letter (Lm) */
    assert_false(tok__is_letter(0x1F601));
    assert_true(tok__is_number('7') && tok__is_number(0xBD) && tok__is_number(0x663));
    assert_true(tok__is_number(0x216B));  /* Roman numeral twelve (Nl) */
    assert_false(tok__is_number('x'));
    assert_true(tok__is_space(' ') && tok__is_space('\n') && tok__is_space(0x0B));
    assert_true(tok__is_space(0x85) && tok__is_space(0x3000) && tok__is_space(0x2009));
    assert_false(tok__is_space(0x1C) || tok__is_space(0x200B) || tok__is_space('x'));
    /* the byte-level alphabet: a bijection over 256 printable characters */
    assert_int_equal(tok__byte_to_cp(' '), 0x120);
    assert_int_equal(tok__byte_to_cp('\n'), 0x10A);
    assert_int_equal(tok__byte_to_cp('a'), 'a');
    assert_int_equal(tok__byte_to_cp(0xAD), 0x143);
    for (int b = 0; b < 256; b++)
        assert_int_equal(tok__cp_to_byte(tok__byte_to_cp((uint8_t)b)), b);
    assert_int_equal(tok__cp_to_byte(' '), -1);
    assert_int_equal(tok__cp_to_byte(0x144), -1);
}

static void utf8_rules(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t bad; /* offset of the first invalid byte, or the length */
    } cases[] = {
        {"plain", 5},
        {"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x81", 9},
        {"a\x80", 1},              /* lone continuation */
        {"\xC0\x80", 0},           /* overlong NUL */
        {"\xE0\x80\xAF", 0},       /* overlong */
        {"\xED\xA0\x80", 0},       /* surrogate */
        {"\xF4\x90\x80\x80", 0},   /* above U+10FFFF */
        {"\xF5\x80\x80\x80", 0},
        {"ok\xE2\x82", 2},         /* truncated */
        {"\xEF\xBF\xBF", 3},       /* U+FFFF is valid */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(tok__utf8_check(cases[i].s, strlen(cases[i].s)), cases[i].bad);
    char buf[4];
    assert_int_equal(tok__utf8_encode(0x10FFFF, buf), 4);
    assert_int_equal(tok__utf8_decode((const unsigned char *)buf, 4), 0x10FFFF);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spm_merge_order),    cmocka_unit_test(spm_unknown_and_bytes),
        cmocka_unit_test(spm_space_from_bytes), cmocka_unit_test(spm_unused_pieces),
        cmocka_unit_test(spm_user_defined),
        cmocka_unit_test(spm_whitespace),     cmocka_unit_test(bpe_merge_order),
        cmocka_unit_test(bpe_bytes_and_added), cmocka_unit_test(gpt2_pretokenizer),
        cmocka_unit_test(unicode_classes),    cmocka_unit_test(utf8_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
