/*
 * test_tok_norm.c — normalizers and added-token flags of byte-level BPE vocabularies, on
 * small hand-made vocabularies (the 256 byte characters, no merges, so a text's ids are its
 * bytes after normalization): NFC/NFD/NFKC/NFKD, Lowercase (İ, final sigma), StripAccents,
 * Strip, Prepend, Replace (string and regex), Sequence; lstrip/rstrip/single_word of added
 * tokens; both kept through tokenizer.ie.json; each malformed or unsupported declaration
 * refused with a message naming it. Expected strings are written from Unicode's data (the
 * decompositions of U+00E9, U+FB01, U+2460) and Hugging Face's documented behaviour.
 */
#include "testutil.h"

#include "err.h"
#include "tok.h"
#include "tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ie.json of a byte-level BPE: the 256 byte characters, then `<tool>` (user
 * defined) and `<|end|>` (control), with `extra` keys merged in (normalizer, flags). */
static json_t *bpe_doc(json_t *extra)
{
    json_t *tokens = json_array(), *types = json_array();
    for (int b = 0; b < 256; b++) {
        char c[5] = {0};
        tok__utf8_encode(tok__byte_to_cp((uint8_t)b), c);
        json_array_append_new(tokens, json_string(c));
        json_array_append_new(types, json_string("normal"));
    }
    json_array_append_new(tokens, json_string("<tool>"));
    json_array_append_new(types, json_string("user_defined"));
    json_array_append_new(tokens, json_string("<|end|>"));
    json_array_append_new(types, json_string("control"));
    json_t *d = json_pack("{sssiss snsnsn sb ss so so s[]}", "format", "clocher-tokenizer",
                          "version", 1, "kind", "bpe", "bos", "unk", "eos", "add_bos", 0,
                          "pre_tokenizer", "gpt2", "tokens", tokens, "types", types, "merges");
    if (extra) {
        json_object_update(d, extra);
        json_decref(extra);
    }
    return d;
}

static struct tok *load(json_t *doc, const char *kind)
{
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(text, strlen(text), kind, &t);
    if (rc != 0)
        fail_msg("tok_load_mem: %s\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    free(text);
    return t;
}

static struct tok *with_norm(const char *norm_json)
{
    json_error_t e;
    json_t *n = json_loads(norm_json, 0, &e);
    if (!n)
        fail_msg("bad test JSON %s: %s", norm_json, e.text);
    return load(bpe_doc(json_pack("{so}", "normalizer", n)), "ie-json");
}

/* decode(encode(in)): with no merges, the normalized text (added tokens literally). */
static void expect_text(const struct tok *t, unsigned flags, const char *in, const char *want)
{
    int32_t *ids;
    size_t n;
    int rc = tok_encode_ex(t, in, strlen(in), flags, &ids, &n);
    if (rc != 0)
        fail_msg("encoding '%s': %s", in, err_name(rc));
    char *text;
    size_t len;
    assert_int_equal(tok_decode_ex(t, ids, n, TOK_DEC_SPECIAL, &text, &len), 0);
    if (len != strlen(want) || memcmp(text, want, len) != 0)
        fail_msg("'%s' normalizes to '%.*s', expected '%s'", in, (int)len, text, want);
    free(text);
    free(ids);
}

static void normalization_forms(void **state)
{
    (void)state;
    struct tok *t = with_norm("{\"type\": \"NFC\"}");
    expect_text(t, 0, "cafe\xCC\x81", "caf\xC3\xA9"); /* e + U+0301 -> U+00E9 */
    expect_text(t, 0, "caf\xC3\xA9", "caf\xC3\xA9");
    expect_text(t, 0, "\xEF\xAC\x81", "\xEF\xAC\x81"); /* NFC keeps the ligature */
    expect_text(t, 0, "", "");
    tok_free(t);
    t = with_norm("{\"type\": \"NFD\"}");
    expect_text(t, 0, "caf\xC3\xA9", "cafe\xCC\x81");
    tok_free(t);
    t = with_norm("{\"type\": \"NFKC\"}");
    expect_text(t, 0, "\xEF\xAC\x81 \xE2\x91\xA0 e\xCC\x81", "fi 1 \xC3\xA9"); /* ﬁ ① */
    tok_free(t);
    t = with_norm("{\"type\": \"NFKD\"}");
    expect_text(t, 0, "\xEF\xAC\x81\xC3\xA9", "fie\xCC\x81");
    tok_free(t);
    /* without a normalizer the two spellings stay different */
    t = load(bpe_doc(NULL), "ie-json");
    expect_text(t, 0, "cafe\xCC\x81", "cafe\xCC\x81");
    tok_free(t);
}

static void case_and_accents(void **state)
{
    (void)state;
    struct tok *t = with_norm("{\"type\": \"Lowercase\"}");
    expect_text(t, 0, "ABC \xC3\x80 Dz", "abc \xC3\xA0 dz");
    expect_text(t, 0, "\xC4\xB0", "i\xCC\x87"); /* İ -> i + U+0307, as Rust's to_lowercase */
    /* ΟΔΟΣ -> οδος (final sigma), a lone Σ -> σ */
    expect_text(t, 0, "\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3 \xCE\xA3",
                "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82 \xCF\x83");
    tok_free(t);
    t = with_norm("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"}, "
                  "{\"type\": \"StripAccents\"}, {\"type\": \"NFC\"}]}");
    expect_text(t, 0, "Caf\xC3\xA9 na\xC3\xAFve", "Cafe naive");
    tok_free(t);
}

static void strings(void **state)
{
    (void)state;
    /* Llama's legacy SentencePiece normalizer, on a byte-level vocabulary */
    struct tok *t = with_norm("{\"type\": \"Sequence\", \"normalizers\": ["
                              "{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"}, "
                              "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                              "\"content\": \"\xE2\x96\x81\"}]}");
    expect_text(t, 0, "a b", "\xE2\x96\x81" "a\xE2\x96\x81" "b");
    expect_text(t, 0, "", ""); /* Prepend leaves empty text empty */
    tok_free(t);
    t = with_norm("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, "
                  "\"content\": \" \"}");
    expect_text(t, 0, "a \t\n b\xE2\x80\x83" "c", "a b c"); /* U+2003 is \s under UCP */
    tok_free(t);
    t = with_norm("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"x*\"}, \"content\": \"-\"}");
    expect_text(t, 0, "axxb", "-a--b-"); /* empty matches between characters */
    tok_free(t);
    t = with_norm("{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": false}");
    expect_text(t, 0, " \t\xE3\x80\x80 a b  ", "a b  "); /* U+3000 is White_Space */
    tok_free(t);
    t = with_norm("{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}");
    expect_text(t, 0, "  a b \n", "a b");
    expect_text(t, 0, "   ", "");
    tok_free(t);
}

/* Added tokens are matched on the raw text; the text between them is normalized. */
static void added_tokens_and_normalizer(void **state)
{
    (void)state;
    struct tok *t = with_norm("{\"type\": \"Lowercase\"}");
    expect_text(t, 0, "AB<tool>CD", "ab<tool>cd");
    expect_text(t, TOK_ENC_SPECIAL, "X<|end|>Y", "x<|end|>y");
    expect_text(t, 0, "X<|end|>Y", "x<|end|>y"); /* as text: lowercased, unchanged here */
    tok_free(t);
}

/* A user-defined token marked normalized: false (tokenizer.ie.json "unnormalized") is
 * matched in the text as written, the text between such tokens normalized piece by piece, as
 * Hugging Face's AddedVocabulary does; one left normalized is matched in the normalized text. */
static void unnormalized_added(void **state)
{
    (void)state;
    static const char *const replace_o =
        "{\"type\": \"Replace\", \"pattern\": {\"String\": \"o\"}, \"content\": \"0\"}";
    json_error_t e;
    /* normalized (the default): "<tool>" is gone once o became 0 */
    struct tok *t = with_norm(replace_o);
    expect_text(t, 0, "go<tool>", "g0<t00l>");
    tok_free(t);
    t = load(bpe_doc(json_pack("{s[i]so}", "unnormalized", 256, "normalizer",
                               json_loads(replace_o, 0, &e))), "ie-json");
    expect_text(t, 0, "go<tool>o", "g0<tool>0");
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "o<tool>", 7, false, &ids, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], 256);
    free(ids);
    tok_free(t);
    /* Prepend applies to each piece between raw tokens, not once before the whole text */
    static const char *const prepend = "{\"type\": \"Prepend\", \"prepend\": \"_\"}";
    t = with_norm(prepend);
    expect_text(t, 0, "a<tool>b", "_a<tool>b");
    tok_free(t);
    t = load(bpe_doc(json_pack("{s[i]so}", "unnormalized", 256, "normalizer",
                               json_loads(prepend, 0, &e))), "ie-json");
    expect_text(t, 0, "a<tool>b", "_a<tool>_b");
    expect_text(t, 0, "<tool>", "<tool>");
    /* it survives tokenizer.ie.json */
    char *js;
    size_t len;
    assert_int_equal(tok_save_json(t, &js, &len), 0);
    assert_non_null(strstr(js, "\"unnormalized\":[256]"));
    struct tok *t2 = NULL;
    assert_int_equal(tok_load_mem(js, len, "ie-json", &t2), 0);
    expect_text(t2, 0, "a<tool>b", "_a<tool>_b");
    free(js);
    tok_free(t2);
    tok_free(t);
    /* from tokenizer.json: normalized false (a user token), Lowercase */
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[5] = {0};
        tok__utf8_encode(tok__byte_to_cp((uint8_t)b), c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_t *hf = json_loads(
        "{\"model\": {\"type\": \"BPE\", \"merges\": []},"
        " \"added_tokens\": [{\"id\": 256, \"content\": \"<TOOL>\", \"special\": false,"
        " \"normalized\": false}, {\"id\": 257, \"content\": \"<NORM>\", \"special\": false}],"
        " \"normalizer\": {\"type\": \"Lowercase\"},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}",
        0, &e);
    if (!hf)
        fail_msg("bad test JSON: %s", e.text);
    json_object_set_new(json_object_get(hf, "model"), "vocab", vocab);
    t = load(hf, "hf-json");
    /* <TOOL> is found as written; <NORM> (normalized) is lowercased before matching: text */
    expect_text(t, 0, "A<TOOL>B<NORM>", "a<TOOL>b<norm>");
    assert_int_equal(tok_encode(t, "<TOOL><tool>", 12, false, &ids, &n), 0);
    assert_int_equal(n, 1 + 6);
    assert_int_equal(ids[0], 256);
    free(ids);
    tok_free(t);
}

static void added_flags(void **state)
{
    (void)state;
    /* <tool> (256) lstrip + rstrip, <|end|> (257) rstrip */
    struct tok *t = load(bpe_doc(json_pack("{s[i]s[ii]}", "lstrip", 256, "rstrip", 256, 257)),
                         "ie-json");
    expect_text(t, 0, "a \t<tool>\n b", "a<tool>b");
    expect_text(t, 0, "<tool>  ", "<tool>");
    expect_text(t, TOK_ENC_SPECIAL, "x <|end|>  y", "x <|end|>y");
    expect_text(t, 0, "x <|end|>  y", "x <|end|>  y"); /* not special: plain text */
    /* lstrip never reaches back into the previous match */
    expect_text(t, 0, "<tool> <tool>", "<tool><tool>");
    tok_free(t);
    t = load(bpe_doc(json_pack("{s[i]}", "single_word", 256)), "ie-json");
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "a<tool> <tool>", 14, false, &ids, &n), 0);
    /* the first touches a word character: bytes; the second is a word of its own */
    assert_int_equal(n, 1 + 6 + 1 + 1);
    assert_int_equal(ids[n - 1], 256);
    assert_int_not_equal(ids[1], 256);
    free(ids);
    tok_free(t);
}

/* The normalizer and the flags survive tokenizer.ie.json, and come from tokenizer.json. */
static void round_trip_and_hf(void **state)
{
    (void)state;
    json_t *d = bpe_doc(json_pack("{s{ss}s[i]}", "normalizer", "type", "NFC", "rstrip", 256));
    struct tok *t = load(d, "ie-json");
    char *js;
    size_t len;
    assert_int_equal(tok_save_json(t, &js, &len), 0);
    assert_non_null(strstr(js, "\"normalizer\":{\"type\":\"NFC\"}"));
    assert_non_null(strstr(js, "\"rstrip\":[256]"));
    struct tok *t2 = NULL;
    assert_int_equal(tok_load_mem(js, len, "ie-json", &t2), 0);
    expect_text(t2, 0, "e\xCC\x81<tool>  x", "\xC3\xA9<tool>x");
    char *js2;
    size_t len2;
    assert_int_equal(tok_save_json(t2, &js2, &len2), 0);
    assert_int_equal(len, len2);
    assert_memory_equal(js, js2, len); /* saving what was loaded gives the same bytes */
    free(js);
    free(js2);
    tok_free(t);
    tok_free(t2);

    /* a Qwen2-style tokenizer.json: NFC before a Split + ByteLevel pre-tokenizer */
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[5] = {0};
        tok__utf8_encode(tok__byte_to_cp((uint8_t)b), c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_error_t e;
    json_t *hf = json_loads(
        "{\"model\": {\"type\": \"BPE\", \"merges\": []},"
        " \"added_tokens\": [{\"id\": 256, \"content\": \"<|im_end|>\", \"special\": true,"
        " \"lstrip\": true, \"rstrip\": false, \"single_word\": false, \"normalized\": false}],"
        " \"normalizer\": {\"type\": \"NFC\"},"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
        "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+|\\\\s+\"},"
        " \"behavior\": \"Isolated\", \"invert\": false},"
        " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false,"
        " \"use_regex\": false}]}}",
        0, &e);
    if (!hf)
        fail_msg("bad test JSON: %s", e.text);
    json_object_set_new(json_object_get(hf, "model"), "vocab", vocab);
    t = load(hf, "hf-json");
    expect_text(t, TOK_ENC_SPECIAL, "e\xCC\x81 \n<|im_end|>", "\xC3\xA9<|im_end|>");
    tok_free(t);
}

static void expect_refused(json_t *doc, const char *kind, int code, const char *msg)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = (struct tok *)1;
    tu_log_capture_begin();
    int rc = tok_load_mem(s, strlen(s), kind, &t);
    if (rc != code)
        fail_msg("expected %s, got %s; log:\n%s", err_name(code), err_name(rc),
                 tu_log_captured());
    assert_null(t);
    tu_assert_log_contains(msg, NULL);
    tu_log_capture_end();
    free(s);
}

static json_t *norm(const char *js)
{
    json_error_t e;
    json_t *n = json_loads(js, JSON_DECODE_ANY, &e);
    if (!n)
        fail_msg("bad test JSON %s", js);
    return json_pack("{so}", "normalizer", n);
}

static void refusals(void **state)
{
    (void)state;
    expect_refused(bpe_doc(norm("{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}")),
                   "ie-json", ERR_UNSUPPORTED, "normalizer Precompiled is not supported");
    expect_refused(bpe_doc(norm("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"},"
                                " {\"type\": \"BertNormalizer\"}]}")),
                   "ie-json", ERR_UNSUPPORTED,
                   "normalizer.normalizers[1] BertNormalizer is not supported");
    expect_refused(bpe_doc(norm("\"NFC\"")), "ie-json", ERR_FORMAT,
                   "normalizer is a string, not an object");
    expect_refused(bpe_doc(norm("{\"normalizers\": []}")), "ie-json", ERR_FORMAT,
                   "normalizer is not an object with a string type");
    expect_refused(bpe_doc(norm("{\"type\": \"Sequence\", \"normalizers\": 3}")), "ie-json",
                   ERR_FORMAT, "Sequence: normalizers is an integer, not an array");
    expect_refused(bpe_doc(norm("{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}}")),
                   "ie-json", ERR_FORMAT, "Replace: needs pattern");
    expect_refused(bpe_doc(norm("{\"type\": \"Replace\", \"pattern\": {\"String\": \"\"}, "
                                "\"content\": \"b\"}")),
                   "ie-json", ERR_FORMAT, "Replace: the String pattern is empty");
    expect_refused(bpe_doc(norm("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, "
                                "\"content\": \"b\"}")),
                   "ie-json", ERR_FORMAT, "Replace: regex refused at offset 1");
    expect_refused(bpe_doc(norm("{\"type\": \"Strip\", \"strip_left\": 1, \"strip_right\": "
                                "true}")),
                   "ie-json", ERR_FORMAT, "Strip: strip_left and strip_right must be booleans");
    expect_refused(bpe_doc(norm("{\"type\": \"Prepend\"}")), "ie-json", ERR_FORMAT,
                   "Prepend: prepend is missing, not a string");
    expect_refused(bpe_doc(json_pack("{ss}", "lstrip", "x")), "ie-json", ERR_FORMAT,
                   "lstrip is a string, not an array of token ids");
    expect_refused(bpe_doc(json_pack("{s[i]}", "rstrip", 999)), "ie-json", ERR_FORMAT,
                   "rstrip[0] is not a token id of the vocabulary");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(normalization_forms), cmocka_unit_test(case_and_accents),
        cmocka_unit_test(strings),             cmocka_unit_test(added_tokens_and_normalizer),
        cmocka_unit_test(unnormalized_added), cmocka_unit_test(added_flags),         cmocka_unit_test(round_trip_and_hf),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
