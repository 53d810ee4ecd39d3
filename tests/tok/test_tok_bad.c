/*
 * test_tok_bad.c — every kind of bad tokenizer input, each asserting the return code and
 * that the one logged message names what is wrong: tokenizer.model (truncated, garbage,
 * unsupported model/normalizer, bad pieces), tokenizer.bin (short, negative or oversized
 * lengths, lengths past the end), tokenizer.json (invalid JSON, wrong types, unknown tokens
 * in merges, unsupported pre-tokenizers), tokenizer.ie.json, GGUF files without (or with
 * broken) tokenizer keys, invalid UTF-8 to encode, out-of-range ids to decode.
 *
 * Inputs are copied to exact-size heap buffers so that ASan catches any read past the end.
 */
#include "testutil.h"

#include "err.h"
#include "gguf.h"
#include "sentencepiece/sentencepiece_model.pb-c.h"
#include "tok.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loading buf as `kind` fails with `code`; the log names each non-NULL needle. */
static void expect_fail(const void *buf, size_t len, const char *kind, int code, const char *n1,
                        const char *n2)
{
    void *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, buf, len);
    struct tok *t = (struct tok *)1;
    tu_log_capture_begin();
    int rc = tok_load_mem(copy, len, kind, &t);
    if (rc != code)
        fail_msg("%s: expected %s, got %s; log:\n%s", kind, err_name(code), err_name(rc),
                 tu_log_captured());
    assert_null(t);
    if (!*tu_log_captured())
        fail_msg("%s: %s but nothing logged", kind, err_name(rc));
    tu_assert_log_contains(n1 ? n1 : "", n2 ? n2 : "", NULL);
    tu_log_capture_end();
    free(copy);
}

static void expect_fail_str(const char *s, const char *kind, int code, const char *n1,
                            const char *n2)
{
    expect_fail(s, strlen(s), kind, code, n1, n2);
}

static void expect_fail_json(json_t *doc, const char *kind, int code, const char *n1,
                             const char *n2)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    expect_fail(s, strlen(s), kind, code, n1, n2);
    free(s);
}

static struct tok *expect_ok(const void *buf, size_t len, const char *kind)
{
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(buf, len, kind, &t);
    if (rc != 0)
        fail_msg("%s: %s; log:\n%s", kind, err_name(rc), tu_log_captured());
    tu_log_capture_end();
    return t;
}

/* ---- tokenizer.model ------------------------------------------------------------------- */

struct piece {
    const char *s;
    size_t len; /* 0: strlen(s) */
    float score;
    int type;
};

struct model_opts {
    int model_type; /* 0: no trainer_spec */
    bool byte_fallback;
    int unk_id, bos_id;
    const char *charsmap;
    bool no_escape;
};

static uint8_t *pack_model(const struct piece *p, size_t n, const struct model_opts *o,
                           size_t *len)
{
    Sentencepiece__ModelProto m = SENTENCEPIECE__MODEL_PROTO__INIT;
    Sentencepiece__TrainerSpec ts = SENTENCEPIECE__TRAINER_SPEC__INIT;
    Sentencepiece__NormalizerSpec ns = SENTENCEPIECE__NORMALIZER_SPEC__INIT;
    Sentencepiece__ModelProto__SentencePiece sp[16], *spp[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        Sentencepiece__ModelProto__SentencePiece init =
            SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__INIT;
        sp[i] = init;
        sp[i].has_piece = 1;
        sp[i].piece.data = (uint8_t *)p[i].s;
        sp[i].piece.len = p[i].len ? p[i].len : strlen(p[i].s);
        sp[i].has_score = 1;
        sp[i].score = p[i].score;
        sp[i].has_type = 1;
        sp[i].type = (Sentencepiece__ModelProto__SentencePiece__Type)p[i].type;
        spp[i] = &sp[i];
    }
    m.n_pieces = n;
    m.pieces = spp;
    if (o->model_type) {
        ts.has_model_type = 1;
        ts.model_type = (Sentencepiece__TrainerSpec__ModelType)o->model_type;
        ts.has_byte_fallback = 1;
        ts.byte_fallback = o->byte_fallback;
        ts.has_unk_id = ts.has_bos_id = 1;
        ts.unk_id = o->unk_id;
        ts.bos_id = o->bos_id;
        m.trainer_spec = &ts;
    }
    ns.name = (char *)"identity";
    ns.has_add_dummy_prefix = ns.has_remove_extra_whitespaces = 1;
    ns.add_dummy_prefix = 1;
    ns.remove_extra_whitespaces = 0;
    if (o->charsmap) {
        ns.has_precompiled_charsmap = 1;
        ns.precompiled_charsmap.data = (uint8_t *)o->charsmap;
        ns.precompiled_charsmap.len = strlen(o->charsmap);
    }
    if (o->no_escape) {
        ns.has_escape_whitespaces = 1;
        ns.escape_whitespaces = 0;
    }
    m.normalizer_spec = &ns;
    *len = sentencepiece__model_proto__get_packed_size(&m);
    uint8_t *buf = malloc(*len);
    assert_non_null(buf);
    sentencepiece__model_proto__pack(&m, buf);
    return buf;
}

#define GOOD_PIECES                                                                            \
    {"<unk>", 0, 0, 2}, {"<s>", 0, 0, 3}, {"</s>", 0, 0, 3}, {"\xE2\x96\x81", 0, -2, 1},     \
        {"a", 0, -3, 1}, {"\xE2\x96\x81" "a", 0, -1, 1}

static const struct model_opts good_opts = {.model_type = 2, .unk_id = 0, .bos_id = 1};

static void model_fail(const struct piece *p, size_t n, const struct model_opts *o, int code,
                       const char *n1, const char *n2)
{
    size_t len;
    uint8_t *buf = pack_model(p, n, o, &len);
    expect_fail(buf, len, "spm-model", code, n1, n2);
    free(buf);
}

static void bad_spm_model(void **state)
{
    (void)state;
    const struct piece good[] = {GOOD_PIECES};
    size_t len;
    uint8_t *buf = pack_model(good, 6, &good_opts, &len);
    struct tok *t = expect_ok(buf, len, "spm-model"); /* the baseline is fine */
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "a a", 3, false, &ids, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 5);
    free(ids);
    tok_free(t);
    /* truncated in the middle of a piece, and garbage */
    expect_fail(buf, len - 3, "spm-model", ERR_FORMAT, "does not parse", NULL);
    free(buf);
    uint8_t junk[64];
    memset(junk, 0xFF, sizeof junk);
    expect_fail(junk, sizeof junk, "spm-model", ERR_FORMAT, "<memory:spm-model>",
                "not a SentencePiece model");
    size_t real_len;
    char *real = tu_read_file(tu_fixture("tokenizer/llama2-tokenizer.model"), &real_len);
    expect_fail(real, real_len / 2, "spm-model", ERR_FORMAT, "does not parse", NULL);
    free(real);

    struct model_opts o = good_opts;
    o.model_type = 1;
    model_fail(good, 6, &o, ERR_UNSUPPORTED, "model_type is unigram", "only BPE");
    o.model_type = 0;
    model_fail(good, 6, &o, ERR_UNSUPPORTED, "model_type is unigram", NULL);
    o = good_opts;
    o.charsmap = "compiled-rules";
    model_fail(good, 6, &o, ERR_UNSUPPORTED, "normalizer_spec 'identity'",
               "only the identity normalizer");
    o = good_opts;
    o.no_escape = true;
    model_fail(good, 6, &o, ERR_UNSUPPORTED, "escape_whitespaces", NULL);
    o = good_opts;
    o.unk_id = 4;
    model_fail(good, 6, &o, ERR_FORMAT, "unk_id 4 is piece 'a'", "not of type UNKNOWN");
    o = good_opts;
    o.bos_id = 99;
    model_fail(good, 6, &o, ERR_RANGE, "bos id 99 is outside the vocabulary of 6 tokens", NULL);

    struct piece p[6] = {GOOD_PIECES};
    p[4].s = "\xFF";
    model_fail(p, 6, &good_opts, ERR_FORMAT, "token 4", "is not valid UTF-8 (byte 0)");
    p[4].s = "";
    model_fail(p, 6, &good_opts, ERR_FORMAT, "token 4 is an empty string", NULL);
    p[4].s = "a\0b";
    p[4].len = 3;
    model_fail(p, 6, &good_opts, ERR_FORMAT, "token 4 'a\\x00b' contains a NUL byte", NULL);
    p[4] = (struct piece){"\xE2\x96\x81" "a", 0, -3, 1};
    model_fail(p, 6, &good_opts, ERR_FORMAT, "tokens 4 and 5 are both '\xE2\x96\x81" "a'",
               "unique");
    p[4] = (struct piece){"a", 0, -3, 9};
    model_fail(p, 6, &good_opts, ERR_FORMAT, "piece 4: type 9 is not a SentencePiece piece type",
               NULL);
    p[4] = (struct piece){"<0x0a>", 0, 0, 6};
    model_fail(p, 6, &good_opts, ERR_FORMAT, "token 4 '<0x0a>' has type byte", NULL);
    p[4] = (struct piece){"<0xZZ>", 0, 0, 6};
    model_fail(p, 6, &good_opts, ERR_FORMAT, "token 4 '<0xZZ>' has type byte",
               "does not spell <0xNN>");
    p[4] = (struct piece){"a", 0, NAN, 1};
    model_fail(p, 6, &good_opts, ERR_FORMAT, "token 4 'a' has a score that is not a finite",
               NULL);
    /* neither <unk> nor byte fallback: text outside the vocabulary could not be encoded */
    struct piece q[6] = {GOOD_PIECES};
    q[0].type = 1;
    o = good_opts;
    o.unk_id = -1;
    model_fail(q, 6, &o, ERR_FORMAT, "no unknown token and no byte fallback", NULL);
    model_fail(q, 0, &good_opts, ERR_FORMAT, "the vocabulary is empty", NULL);
}

/* ---- tokenizer.bin --------------------------------------------------------------------- */

struct bin {
    uint8_t b[256];
    size_t len;
};

static void bin_i32(struct bin *b, int32_t v)
{
    memcpy(b->b + b->len, &v, 4);
    b->len += 4;
}

static void bin_token(struct bin *b, float score, int32_t len, const char *s)
{
    memcpy(b->b + b->len, &score, 4);
    b->len += 4;
    bin_i32(b, len);
    if (len > 0) {
        memcpy(b->b + b->len, s, strlen(s));
        b->len += strlen(s);
    }
}

static void bad_llama2c_bin(void **state)
{
    (void)state;
    struct bin b = {.len = 0};
    bin_i32(&b, 8);
    bin_token(&b, 0, 5, "<unk>");
    bin_token(&b, 0, 5, "\n<s>\n");
    bin_token(&b, 0, 6, "\n</s>\n");
    bin_token(&b, -1, 2, " a");
    bin_token(&b, -2, 1, "a");
    bin_token(&b, -3, 1, " ");
    struct tok *t = expect_ok(b.b, b.len, "llama2c-bin"); /* the baseline is fine */
    assert_string_equal(tok_token_str(t, 1), "<s>");
    assert_string_equal(tok_token_str(t, 3), "\xE2\x96\x81" "a");
    tok_free(t);

    expect_fail(b.b, 3, "llama2c-bin", ERR_TRUNCATED, "3 bytes, shorter than the 4-byte", NULL);
    expect_fail(b.b, 4, "llama2c-bin", ERR_FORMAT, "no tokens after the header", NULL);
    expect_fail(b.b, 4 + 5, "llama2c-bin", ERR_TRUNCATED,
                "token 0: its 8-byte score and length run past the end", NULL);
    expect_fail(b.b, 4 + 8 + 3, "llama2c-bin", ERR_TRUNCATED,
                "token 0: its 5 bytes run past the end of the file (3 bytes left)", NULL);
    expect_fail(b.b, b.len - 1, "llama2c-bin", ERR_TRUNCATED, "token 5", "run past the end");

    struct bin c = {.len = 0};
    bin_i32(&c, 0);
    bin_token(&c, 0, 1, "a");
    expect_fail(c.b, c.len, "llama2c-bin", ERR_FORMAT, "max_token_length is 0", NULL);
    c.len = 0;
    bin_i32(&c, -7);
    expect_fail(c.b, c.len, "llama2c-bin", ERR_FORMAT, "max_token_length is -7", NULL);
    c.len = 0;
    bin_i32(&c, 8);
    bin_token(&c, 0, 5, "<unk>");
    bin_token(&c, 0, -1, "");
    expect_fail(c.b, c.len, "llama2c-bin", ERR_FORMAT, "token 1: negative length -1", NULL);
    c.len = 0;
    bin_i32(&c, 8);
    bin_token(&c, 0, 2147483647, "");
    expect_fail(c.b, c.len, "llama2c-bin", ERR_FORMAT,
                "token 0: length 2147483647 exceeds max_token_length 8", NULL);
    c.len = 0;
    bin_i32(&c, 100);
    bin_token(&c, 0, 5, "<unk>");
    bin_token(&c, 0, 90, "abc");
    expect_fail(c.b, c.len, "llama2c-bin", ERR_TRUNCATED, "token 1: its 90 bytes run past", NULL);
    c.len = 0;
    bin_i32(&c, 8);
    bin_token(&c, 0, 5, "<unk>");
    bin_token(&c, 0, 3, "");
    memcpy(c.b + c.len, "a\0b", 3);
    c.len += 3;
    expect_fail(c.b, c.len, "llama2c-bin", ERR_FORMAT, "token 1 'a\\x00b' contains a NUL byte",
                NULL);
    c.len = 0;
    bin_i32(&c, 8);
    bin_token(&c, INFINITY, 5, "<unk>");
    expect_fail(c.b, c.len, "llama2c-bin", ERR_FORMAT, "token 0 '<unk>' has a score", NULL);
    /* the real file cut inside a token */
    size_t real_len;
    char *real = tu_read_file(tu_fixture("tokenizer/llama2-tokenizer.bin"), &real_len);
    expect_fail(real, real_len - 2, "llama2c-bin", ERR_TRUNCATED, "token 31999", NULL);
    free(real);
}

/* ---- tokenizer.json -------------------------------------------------------------------- */

/* A small valid Llama-style document: <unk> <s> ▁ a ▁a, merges "▁ a". */
static json_t *hf_spm_doc(void)
{
    json_error_t e;
    json_t *d = json_loads(
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
        "                    {\"id\": 1, \"content\": \"<s>\", \"special\": true}],"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
        "   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
        "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
        " \"pre_tokenizer\": null,"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true,"
        "   \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"\\u2581\": 2, \"a\": 3, \"\\u2581a\": 4},"
        "   \"merges\": [\"\\u2581 a\"]}}",
        0, &e);
    assert_non_null(d);
    return d;
}

/* A valid GPT-2-style document: the 256 byte characters, "Ġa", merge "Ġ a". */
static json_t *hf_bpe_doc(void)
{
    json_t *vocab = json_object();
    int k = 0;
    for (int b = 0; b < 256; b++) {
        /* GPT-2's mapping, spelled out independently of the code under test */
        int self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        unsigned cp = self ? (unsigned)b : 0x100u + (unsigned)k++;
        char c[4] = {0};
        if (cp < 0x80) {
            c[0] = (char)cp;
        } else {
            c[0] = (char)(0xC0 | cp >> 6);
            c[1] = (char)(0x80 | (cp & 0x3F));
        }
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_object_set_new(vocab, "\xC4\xA0" "a", json_integer(256));
    json_object_set_new(vocab, "<|endoftext|>", json_integer(257));
    return json_pack("{s[{sisssb}] snsn s{sssos[s]}}", "added_tokens", "id", 257, "content",
                     "<|endoftext|>", "special", 1, "normalizer", "pre_tokenizer", "model",
                     "type", "BPE", "vocab", vocab, "merges", "\xC4\xA0 a");
}

static void set_bytelevel(json_t *d)
{
    json_object_set_new(d, "pre_tokenizer", json_pack("{ss}", "type", "ByteLevel"));
}

static void bad_hf_json(void **state)
{
    (void)state;
    /* baselines */
    json_t *d = hf_spm_doc();
    char *s = json_dumps(d, 0);
    struct tok *t = expect_ok(s, strlen(s), "hf-json");
    assert_int_equal(tok_kind(t), TOK_SPM);
    assert_int_equal(tok_unk(t), 0);
    tok_free(t);
    free(s);
    json_decref(d);
    d = hf_bpe_doc();
    set_bytelevel(d);
    s = json_dumps(d, 0);
    t = expect_ok(s, strlen(s), "hf-json");
    assert_int_equal(tok_kind(t), TOK_BPE);
    assert_int_equal(tok_eos(t), 257);
    tok_free(t);
    free(s);
    json_decref(d);

    expect_fail_str("{\"model\": ", "hf-json", ERR_FORMAT, "invalid JSON at line 1", NULL);
    expect_fail_str("[1]", "hf-json", ERR_FORMAT, "not a JSON object", NULL);
    expect_fail_str("{}", "hf-json", ERR_FORMAT, "model is missing, not an object", NULL);
    expect_fail_str("{\"model\": {\"type\": \"Unigram\"}}", "hf-json", ERR_UNSUPPORTED,
                "model.type Unigram is not supported", NULL);
    expect_fail_str("{\"a\": 1, \"a\": 2}", "hf-json", ERR_FORMAT, "duplicate", NULL);

    d = hf_spm_doc();
    json_object_set_new(json_object_get(d, "model"), "vocab", json_array());
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.vocab is an array, not an object", NULL);
    d = hf_spm_doc();
    json_object_set_new(json_object_get(json_object_get(d, "model"), "vocab"), "a",
                        json_string("3"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.vocab token 'a' has an id that is a string",
                     NULL);
    d = hf_spm_doc();
    json_object_set_new(json_object_get(json_object_get(d, "model"), "vocab"), "a",
                        json_integer(-3));
    expect_fail_json(d, "hf-json", ERR_RANGE, "'a' has id -3", NULL);
    d = hf_spm_doc();
    json_object_set_new(json_object_get(json_object_get(d, "model"), "vocab"), "a",
                        json_integer(4));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "both have id 4", NULL);
    d = hf_spm_doc();
    json_object_set_new(json_object_get(json_object_get(d, "model"), "vocab"), "a",
                        json_integer(9));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "ids go up to 9 but there are only 7 tokens",
                     NULL);
    d = hf_spm_doc();
    json_object_set_new(json_object_get(d, "model"), "merges", json_integer(5));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges is an integer, not an array", NULL);
    d = hf_spm_doc();
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_string("a zz"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[1]: 'zz' is not in the vocabulary",
                     NULL);
    d = hf_spm_doc();
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_string("aa"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[1] \"aa\" is not two tokens", NULL);
    d = hf_spm_doc();
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_pack("[ii]", 1, 2));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[1] is an array, not", NULL);
    d = hf_spm_doc();
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_string("a a"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[1] ('a', 'a'): the merged token",
                     NULL);
    d = hf_spm_doc();
    json_object_set_new(json_object_get(d, "model"), "unk_token", json_string("<?>"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.unk_token '<?>' is not a token", NULL);
    d = hf_spm_doc();
    json_array_append_new(json_object_get(d, "added_tokens"),
                          json_pack("{siss}", "id", 3, "content", "zz"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "added_tokens[2] 'zz' has id 3, already token 'a'",
                     NULL);
    d = hf_spm_doc();
    json_object_set_new(d, "added_tokens", json_integer(3));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "added_tokens is an integer, not an array", NULL);
    d = hf_spm_doc();
    json_object_set_new(d, "normalizer", json_pack("{ss}", "type", "NFKC"));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "normalizer NFKC is not supported", NULL);
    d = hf_spm_doc();
    json_object_set_new(d, "normalizer", json_null());
    json_object_set_new(d, "pre_tokenizer",
                        json_pack("{sssssb}", "type", "Metaspace", "replacement", "\xE2\x96\x81",
                                  "split", 1));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "Metaspace pre_tokenizer that splits words",
                     NULL);
    d = hf_spm_doc();
    json_object_set_new(d, "normalizer", json_null());
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "neither a pre_tokenizer nor a normalizer",
                     NULL);

    d = hf_bpe_doc();
    json_object_set_new(d, "pre_tokenizer",
                        json_pack("{ss s[{ss}{ss}]}", "type", "Sequence", "pretokenizers", "type",
                                  "Split", "type", "ByteLevel"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "pre_tokenizer.pretokenizers[0] Split: pattern "
                     "is not {\"Regex\": string}", NULL);
    d = hf_bpe_doc();
    json_object_set_new(d, "pre_tokenizer",
                        json_pack("{ss s[{ss}{ss}]}", "type", "Sequence", "pretokenizers", "type",
                                  "ByteLevel", "type", "Whitespace"));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1] Whitespace "
                     "is not supported", NULL);
    d = hf_bpe_doc();
    json_object_set_new(d, "pre_tokenizer",
                        json_pack("{ss s{ss} ss}", "type", "Split", "pattern", "Regex", "a",
                                  "behavior", "Sideways"));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "Split: behavior 'Sideways' is not Isolated",
                     NULL);
    d = hf_bpe_doc();
    json_object_set_new(d, "pre_tokenizer",
                        json_pack("{ss s{ss} ss}", "type", "Split", "pattern", "Regex", "(a",
                                  "behavior", "Isolated"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "pre-tokenizer step 0: the regex /(a/ does not "
                     "compile at offset 2", NULL);
    d = hf_bpe_doc();
    json_object_set_new(d, "pre_tokenizer",
                        json_pack("{sssb}", "type", "ByteLevel", "add_prefix_space", 1));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "ByteLevel pre_tokenizer with add_prefix_space",
                     NULL);
    d = hf_spm_doc(); /* byte-level BPE honours it; SentencePiece has no such thing */
    json_object_set_new(json_object_get(d, "model"), "ignore_merges", json_true());
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "model.ignore_merges is not supported for a "
                     "SentencePiece BPE", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "continuing_subword_prefix",
                        json_string("##"));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "model.continuing_subword_prefix", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "dropout", json_real(0.1));
    expect_fail_json(d, "hf-json", ERR_UNSUPPORTED, "model.dropout is not supported", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_string("\xC4\xA0 zz"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "merge 1: 'zz' is not in the vocabulary", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_string("a a"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "merge 1 ('a', 'a'): the merged token", NULL);
    /* a byte-level vocabulary must spell every byte */
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_t *v = json_object_get(json_object_get(d, "model"), "vocab");
    json_object_set_new(v, "\xC3\xA9\xC3\xA9", json_integer(json_integer_value(
                                                   json_object_get(v, "\xC3\xA9"))));
    json_object_del(v, "\xC3\xA9");
    expect_fail_json(d, "hf-json", ERR_FORMAT, "no normal token '\xC3\xA9' for byte 0xE9", NULL);
    /* a merge that would produce a control token */
    d = hf_bpe_doc();
    set_bytelevel(d);
    v = json_object_get(json_object_get(d, "model"), "vocab");
    json_object_set_new(v, "<|", json_integer(258));
    json_array_append_new(json_object_get(json_object_get(d, "model"), "merges"),
                          json_string("< |"));
    json_array_append_new(json_object_get(d, "added_tokens"),
                          json_pack("{sisssb}", "id", 258, "content", "<|", "special", 1));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "merge 1 ('<', '|') involves a control token",
                     NULL);
}

/* ---- tokenizer.ie.json ----------------------------------------------------------------- */

static json_t *ie_doc(const char *kind)
{
    json_t *d = json_pack("{sssiss sisnsi sb}", "format", "clocher-tokenizer", "version", 1,
                          "kind", kind, "bos", 1, "eos", "unk", 0, "add_bos", 1);
    json_object_set_new(d, "tokens", json_pack("[sss]", "<unk>", "<s>", "a"));
    json_object_set_new(d, "types", json_pack("[sss]", "unknown", "control", "normal"));
    json_object_set_new(d, "scores", json_pack("[fff]", 0.0, 0.0, -1.0));
    json_object_set_new(d, "add_dummy_prefix", json_true());
    json_object_set_new(d, "remove_extra_whitespaces", json_false());
    json_object_set_new(d, "byte_fallback", json_false());
    return d;
}

/* The JSON reader itself (tok_jscan.c, yajl): malformed documents, and the large containers
 * it captures flat (model.vocab, model.merges; tokens, types, scores, merges) holding the
 * wrong things, each refused naming what and where. */
static void bad_json_scan(void **state)
{
    (void)state;
    expect_fail_str("{}  x", "hf-json", ERR_FORMAT, "invalid JSON at line 1", NULL);
    expect_fail_str("{\n\"a\": 1,\n}", "hf-json", ERR_FORMAT, "invalid JSON at line 3", NULL);
    expect_fail_str("{/* c */}", "hf-json", ERR_FORMAT, "invalid JSON", NULL);
    expect_fail_str("{\"a\": \"\xC3\x28\"}", "hf-json", ERR_FORMAT, "invalid JSON", "UTF8");
    expect_fail_str("{\"a\": 99999999999999999999}", "hf-json", ERR_FORMAT, "invalid JSON",
                    "overflow");
    expect_fail_str("{\"a\": 1e999}", "hf-json", ERR_FORMAT, "invalid JSON", "overflow");
    expect_fail_str("", "hf-json", ERR_FORMAT, "invalid JSON", NULL);
    expect_fail_str("\"x\"", "hf-json", ERR_FORMAT, "not a JSON object", NULL);
    expect_fail_str("7", "ie-json", ERR_FORMAT, "not a JSON object", NULL);
    expect_fail_str("{\"a\": \"x\\u0000y\"}", "hf-json", ERR_FORMAT, "\\u0000 (NUL)", NULL);
    expect_fail_str("{\"x\\u0000\": 1}", "hf-json", ERR_FORMAT, "key contains \\u0000", NULL);
    expect_fail_str("{\"model\": {\"vocab\": {\"a\\u0000\": 1}}}", "hf-json", ERR_FORMAT,
                    "key contains \\u0000", NULL);
    expect_fail_str("{\"model\": {\"merges\": [\"a\\u0000 b\"]}}", "hf-json", ERR_FORMAT,
                    "\\u0000 (NUL)", NULL);
    expect_fail_str("{\"model\": {\"vocab\": {}, \"vocab\": {}}}", "hf-json", ERR_FORMAT,
                    "duplicate key", NULL);
    expect_fail_str("{\"tokens\": 1, \"tokens\": []}", "ie-json", ERR_FORMAT, "duplicate key",
                    NULL);
    expect_fail_str("{\"model\": {\"type\": \"BPE\", \"type\": \"BPE\"}}", "hf-json", ERR_FORMAT,
                    "duplicate key 'type'", NULL);
    /* nesting: 600 arrays deep, inside and outside a captured container */
    char deep[1400];
    int o = snprintf(deep, sizeof deep, "{\"a\": ");
    for (int i = 0; i < 600; i++)
        deep[o++] = '[';
    for (int i = 0; i < 600; i++)
        deep[o++] = ']';
    snprintf(deep + o, sizeof deep - (size_t)o, "}");
    expect_fail_str(deep, "hf-json", ERR_RANGE, "nesting deeper than 512", NULL);
    memcpy(deep, "{\"tokens\":", 10);
    expect_fail_str(deep, "ie-json", ERR_RANGE, "nesting deeper than 512", NULL);

    /* the captured containers holding the wrong things */
    json_t *d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "vocab", json_integer(5));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.vocab is an integer, not an object", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_del(json_object_get(d, "model"), "merges");
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges is missing, not an array", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "merges", json_string("a b"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges is a string, not an array", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "merges", json_pack("[[s[s]]]", "a", "b"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[0] is an array, not", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "merges", json_pack("[[sss]]", "a", "b",
                                                                         "c"));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[0] is an array, not", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(d, "model"), "merges", json_pack("[{si}]", "a", 1));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.merges[0] is an object, not", NULL);
    d = hf_bpe_doc();
    set_bytelevel(d);
    json_object_set_new(json_object_get(json_object_get(d, "model"), "vocab"), "a",
                        json_pack("[i]", 3));
    expect_fail_json(d, "hf-json", ERR_FORMAT, "model.vocab token 'a' has an id that is an array",
                     NULL);
    /* escapes in captured strings decode like any other: every non-ASCII byte escaped */
    d = hf_bpe_doc();
    set_bytelevel(d);
    char *plain = json_dumps(d, JSON_COMPACT);
    char *esc = json_dumps(d, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(d);
    assert_true(strcmp(plain, esc) != 0);
    struct tok *a = expect_ok(plain, strlen(plain), "hf-json");
    struct tok *b = expect_ok(esc, strlen(esc), "hf-json");
    int32_t *ia, *ib;
    size_t na, nb;
    assert_int_equal(tok_encode(a, " a\xC3\xA9", 4, false, &ia, &na), 0);
    assert_int_equal(tok_encode(b, " a\xC3\xA9", 4, false, &ib, &nb), 0);
    assert_int_equal(na, 3); /* " a" merged, then é's two bytes */
    assert_int_equal(nb, na);
    assert_memory_equal(ia, ib, na * sizeof *ia);
    free(ia);
    free(ib);
    tok_free(a);
    tok_free(b);
    free(plain);
    free(esc);

    d = ie_doc("bpe");
    json_object_del(d, "scores");
    json_object_set_new(d, "pre_tokenizer", json_string("gpt2"));
    json_object_set_new(d, "merges", json_pack("[[i[i]]]", 1, 2));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "merges[0] is an array, not a pair", NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "tokens", json_string("a"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "tokens is a string, not an array", NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "scores", json_pack("[fbf]", 0.0, 1, -1.0));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "scores[1] is a boolean, not a number", NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "types", json_pack("[s{}s]", "unknown", "normal"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "types[1] is an object, not one of", NULL);
}

static void bad_ie_json(void **state)
{
    (void)state;
    json_t *d = ie_doc("spm");
    char *s = json_dumps(d, 0);
    tok_free(expect_ok(s, strlen(s), "ie-json"));
    free(s);
    json_decref(d);

    d = ie_doc("spm");
    json_object_set_new(d, "format", json_string("iebin"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "format is \"iebin\", not \"clocher-tokenizer\"",
                     NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "version", json_integer(2));
    expect_fail_json(d, "ie-json", ERR_UNSUPPORTED, "version 2 is not supported", NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "version", json_string("1"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "version is a string, not an integer", NULL);
    expect_fail_json(ie_doc("wordpiece"), "ie-json", ERR_UNSUPPORTED,
                     "kind \"wordpiece\" is not supported", NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "types", json_pack("[ss]", "unknown", "control"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "types has 2 elements; tokens has 3", NULL);
    d = ie_doc("spm");
    json_array_set_new(json_object_get(d, "types"), 2, json_string("weird"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "types[2] is \"weird\", not one of", NULL);
    d = ie_doc("spm");
    json_array_set_new(json_object_get(d, "tokens"), 2, json_integer(5));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "tokens[2] is an integer, not a string", NULL);
    d = ie_doc("spm");
    json_object_del(d, "scores");
    expect_fail_json(d, "ie-json", ERR_FORMAT, "scores is missing, not an array", NULL);
    d = ie_doc("spm");
    json_array_set_new(json_object_get(d, "scores"), 1, json_string("x"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "scores[1] is a string", NULL);
    d = ie_doc("spm");
    json_array_set_new(json_object_get(d, "scores"), 1, json_real(1e300));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "scores[1] is a real number, not a number in float",
                     NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "bos", json_integer(999));
    expect_fail_json(d, "ie-json", ERR_RANGE, "bos id 999 is outside the vocabulary of 3 tokens",
                     NULL);
    d = ie_doc("spm");
    json_object_set_new(d, "eos", json_string("</s>"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "eos is a string, not a token id or null", NULL);
    d = ie_doc("spm");
    json_object_del(d, "add_bos");
    expect_fail_json(d, "ie-json", ERR_FORMAT, "add_bos is missing, not a boolean", NULL);
    d = ie_doc("spm");
    json_array_set_new(json_object_get(d, "tokens"), 2, json_string("<s>"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "tokens 1 and 2 are both '<s>'", NULL);

    /* bpe documents fail before the missing byte characters matter */
    d = ie_doc("bpe");
    expect_fail_json(d, "ie-json", ERR_FORMAT, "merges is missing, not an array", NULL);
    d = ie_doc("bpe");
    json_object_set_new(d, "merges", json_pack("[[ii]]", 0, 999));
    json_object_set_new(d, "pre_tokenizer", json_string("gpt2"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "merges[0] = [0, 999] names an id outside", NULL);
    d = ie_doc("bpe");
    json_object_set_new(d, "merges", json_pack("[[i]]", 0));
    json_object_set_new(d, "pre_tokenizer", json_string("gpt2"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "merges[0] is an array, not a pair", NULL);
    d = ie_doc("bpe");
    json_object_set_new(d, "merges", json_array());
    json_object_set_new(d, "pre_tokenizer", json_string("llama3"));
    expect_fail_json(d, "ie-json", ERR_UNSUPPORTED, "pre_tokenizer \"llama3\" is not supported",
                     NULL);
    d = ie_doc("bpe");
    json_object_set_new(d, "merges", json_array());
    json_object_set_new(d, "pre_tokenizer", json_string("gpt2"));
    expect_fail_json(d, "ie-json", ERR_FORMAT, "no normal token", "for byte 0x00");
}

/* ---- GGUF ------------------------------------------------------------------------------ */

struct gg {
    const char *model;   /* tokenizer.ggml.model, NULL: absent */
    const char *pre;
    int n_tokens;        /* of "<unk>", "<s>", "a", "b", "ab"; 0: no tokens key */
    int n_scores;        /* -1: none */
    int n_types;         /* -1: none */
    int bad_type;        /* written at index 1 when non-zero */
    int bos;             /* -1: no key */
    bool merges;
    const char *merge;   /* the one merge */
    bool tokens_as_f32;
};

static void write_gguf(const char *path, const struct gg *g)
{
    static const char *const toks[] = {"<unk>", "<s>", "a", "b", "ab"};
    static const float scores[] = {0, 0, -2, -2, -1};
    int32_t types[] = {2, 3, 1, 1, 1};
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    assert_int_equal(gguf_writer_kv_str(w, "general.architecture", "llama"), 0);
    if (g->model)
        assert_int_equal(gguf_writer_kv_str(w, "tokenizer.ggml.model", g->model), 0);
    if (g->pre)
        assert_int_equal(gguf_writer_kv_str(w, "tokenizer.ggml.pre", g->pre), 0);
    if (g->tokens_as_f32)
        assert_int_equal(gguf_writer_kv_f32_arr(w, "tokenizer.ggml.tokens", scores, 5), 0);
    else if (g->n_tokens)
        assert_int_equal(gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", toks,
                                                (uint64_t)g->n_tokens), 0);
    if (g->n_scores >= 0)
        assert_int_equal(gguf_writer_kv_f32_arr(w, "tokenizer.ggml.scores", scores,
                                                (uint64_t)g->n_scores), 0);
    if (g->bad_type)
        types[1] = g->bad_type;
    if (g->n_types >= 0)
        assert_int_equal(gguf_writer_kv_i32_arr(w, "tokenizer.ggml.token_type", types,
                                                (uint64_t)g->n_types), 0);
    if (g->bos >= 0)
        assert_int_equal(gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)g->bos),
                         0);
    if (g->merges) {
        const char *m[1] = {g->merge ? g->merge : "a b"};
        assert_int_equal(gguf_writer_kv_str_arr(w, "tokenizer.ggml.merges", m, 1), 0);
    }
    assert_int_equal(gguf_writer_finish(w), 0);
}

/* Writes the GGUF, then loads it both by path and from memory. */
static void gguf_case(const char *dir, const struct gg *g, int code, const char *n1,
                      const char *n2)
{
    const char *path = tu_path(dir, "v.gguf");
    write_gguf(path, g);
    size_t len;
    char *buf = tu_read_file(path, &len);
    if (code == 0) {
        struct tok *t = expect_ok(buf, len, "gguf");
        tok_free(t);
    } else {
        expect_fail(buf, len, "gguf", code, n1, n2);
    }
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load(path, &t);
    if (rc != code)
        fail_msg("tok_load: expected %s, got %s\n%s", err_name(code), err_name(rc),
                 tu_log_captured());
    if (code != 0)
        tu_assert_log_contains("v.gguf", n1 ? n1 : "", n2 ? n2 : "", NULL);
    tu_log_capture_end();
    tok_free(t);
    free(buf);
}

static void bad_gguf(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const struct gg spm = {.model = "llama", .n_tokens = 5, .n_scores = 5, .n_types = 5,
                           .bos = 1};
    const struct gg bpe = {.model = "gpt2", .n_tokens = 5, .n_scores = -1, .n_types = 5,
                           .bos = -1, .merges = true};
    gguf_case(dir, &spm, 0, NULL, NULL); /* the baseline is fine */

    struct gg g = spm;
    g.model = NULL;
    gguf_case(dir, &g, ERR_NOT_FOUND, "no tokenizer: key tokenizer.ggml.model is missing",
              NULL);
    g = spm;
    g.model = "bert";
    gguf_case(dir, &g, ERR_UNSUPPORTED, "tokenizer.ggml.model 'bert' is not supported", NULL);
    g = spm;
    g.n_tokens = 0;
    gguf_case(dir, &g, ERR_NOT_FOUND, "key tokenizer.ggml.tokens is missing", NULL);
    g = spm;
    g.tokens_as_f32 = true;
    gguf_case(dir, &g, ERR_FORMAT, "tokenizer.ggml.tokens is an array of float32, not of strings",
              NULL);
    g = spm;
    g.n_scores = 3;
    gguf_case(dir, &g, ERR_FORMAT, "tokenizer.ggml.scores has 3 elements", NULL);
    g = spm;
    g.n_scores = -1;
    gguf_case(dir, &g, ERR_NOT_FOUND, "key tokenizer.ggml.scores is missing", NULL);
    g = spm;
    g.bad_type = 7;
    gguf_case(dir, &g, ERR_FORMAT, "tokenizer.ggml.token_type[1] = 7 is not a token type", NULL);
    g = spm;
    g.bos = 10;
    gguf_case(dir, &g, ERR_RANGE, "tokenizer.ggml.bos_token_id = 10 is outside", NULL);
    g = spm;
    g.n_types = -1; /* types inferred from the special ids: without unknown_token_id, no <unk> */
    gguf_case(dir, &g, ERR_FORMAT, "no unknown token and no byte fallback", NULL);

    gguf_case(dir, &bpe, ERR_FORMAT, "no normal token", "for byte 0x00"); /* 5 tokens only */
    g = bpe;
    g.merges = false;
    gguf_case(dir, &g, ERR_NOT_FOUND, "key tokenizer.ggml.merges is missing", NULL);
    g = bpe;
    g.pre = "no-such-pre"; /* llama-bpe, deepseek-coder, gpt-4o ... load (test_tok_pre) */
    gguf_case(dir, &g, ERR_UNSUPPORTED, "tokenizer.ggml.pre 'no-such-pre' is not a "
              "pre-tokenizer we know (known: gpt-2", NULL);
    g = bpe;
    g.merge = "ab";
    gguf_case(dir, &g, ERR_FORMAT, "tokenizer.ggml.merges[0] 'ab' is not two tokens", NULL);
    tu_rmtree(dir);
    free(dir);
}

/* ---- tiktoken rank files -------------------------------------------------------------- */

static void bad_tiktoken(void **state)
{
    (void)state;
    expect_fail_str("", "tiktoken", ERR_FORMAT, "no ranks: not a tiktoken rank file", NULL);
    expect_fail_str("\n\n", "tiktoken", ERR_FORMAT, "no ranks", NULL);
    expect_fail_str("IQ== 0\nIg== 5\n", "tiktoken", ERR_FORMAT,
                    "line 2: rank '5' is not an integer in 0..1", NULL);
    expect_fail_str("IQ== 0\nIQ== 0\n", "tiktoken", ERR_FORMAT, "line 2: rank 0 is given twice",
                    NULL);
    expect_fail_str("I!Q= 0\n", "tiktoken", ERR_FORMAT,
                    "line 1: 'I!Q= 0' is not base64 token bytes", NULL);
    expect_fail_str("IQ==0\n", "tiktoken", ERR_FORMAT, "line 1: 'IQ==0' is not base64", NULL);
    expect_fail_str("IQ= 0\n", "tiktoken", ERR_FORMAT, "is not base64", NULL); /* not 4k chars */
    expect_fail_str("IQ=a 0\n", "tiktoken", ERR_FORMAT, "is not base64", NULL); /* after pad */
    expect_fail_str(" 0\n", "tiktoken", ERR_FORMAT, "is not base64", NULL);
    expect_fail_str("IQ== x\n", "tiktoken", ERR_FORMAT, "line 1: rank 'x' is not an integer",
                    NULL);
    expect_fail_str("IQ== -0\n", "tiktoken", ERR_FORMAT, "rank '-0' is not an integer", NULL);
    expect_fail_str("IQ== 99999999999\n", "tiktoken", ERR_FORMAT, "is not an integer", NULL);
    /* well-formed, but an encoding whose regex and specials nobody told us */
    expect_fail_str("IQ== 0\nIg== 1\n", "tiktoken", ERR_UNSUPPORTED,
                    "2 ranks: not a tiktoken encoding we know (o200k_base has 199998, "
                    "cl100k_base 100256)", NULL);
    /* by path: the .tiktoken extension picks the format */
    char *dir = tu_mkdtemp();
    tu_write_file(tu_path(dir, "x.tiktoken"), "IQ== 0\n", 7);
    struct tok *t = NULL;
    tu_log_capture_begin();
    assert_int_equal(tok_load(tu_path(dir, "x.tiktoken"), &t), ERR_UNSUPPORTED);
    tu_assert_log_contains("x.tiktoken: 1 ranks: not a tiktoken encoding we know", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* ---- tok_load dispatch ----------------------------------------------------------------- */

static void bad_paths(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct tok *t = (struct tok *)1;
    tu_log_capture_begin();
    assert_int_equal(tok_load(tu_path(dir, "nope.model"), &t), -ENOENT);
    assert_null(t);
    tu_assert_log_contains("cannot open tokenizer", "nope.model", NULL);
    tu_write_file(tu_path(dir, "vocab.txt"), "hello\n", 6);
    assert_int_equal(tok_load(tu_path(dir, "vocab.txt"), &t), ERR_UNSUPPORTED);
    tu_assert_log_contains("vocab.txt: cannot tell the tokenizer format", NULL);
    assert_int_equal(tok_load(dir, &t), -ENOENT);
    tu_assert_log_contains("has no tokenizer.ie.json", NULL);
    assert_int_equal(tok_load("/dev/null", &t), ERR_FORMAT);
    tu_assert_log_contains("/dev/null is not a regular file or a directory", NULL);
    assert_int_equal(tok_load_mem("{}", 2, "yaml", &t), ERR_USAGE);
    tu_assert_log_contains("unknown tokenizer format 'yaml'", NULL);
    /* a GGUF model without tokenizer keys, by path (the magic is what identifies it) */
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* ---- encoding and decoding ------------------------------------------------------------- */

static void bad_text_and_ids(void **state)
{
    (void)state;
    struct tok *toks[2];
    assert_int_equal(tok_load(tu_fixture("tokenizer/ggml-vocab-llama-spm.gguf"), &toks[0]), 0);
    assert_int_equal(tok_load(tu_fixture("tokenizer/ggml-vocab-gpt-2.gguf"), &toks[1]), 0);
    static const struct {
        const char *s;
        const char *msg;
    } bad[] = {
        {"ab\xFF", "byte 2 (0xFF) of 3"},
        {"\x80", "byte 0 (0x80) of 1"},
        {"ok \xE2\x82", "byte 3 (0xE2) of 5"},
        {"\xED\xA0\x80", "byte 0 (0xED)"},
        {"\xC0\xAF", "byte 0 (0xC0)"},
        {"\xF4\x90\x80\x80", "byte 0 (0xF4)"},
    };
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            int32_t *ids = (int32_t *)1;
            size_t n = 7;
            tu_log_capture_begin();
            assert_int_equal(tok_encode(toks[k], bad[i].s, strlen(bad[i].s), true, &ids, &n),
                             ERR_FORMAT);
            tu_assert_log_contains("text to encode is not valid UTF-8", bad[i].msg, NULL);
            tu_log_capture_end();
            assert_null(ids);
            assert_int_equal(n, 0);
        }
        /* refused by its length alone, before the text is read */
        int32_t *big_ids;
        size_t big_n;
        tu_log_capture_begin();
        assert_int_equal(
            tok_encode(toks[k], "x", (size_t)TOK_MAX_TEXT + 1, false, &big_ids, &big_n),
            ERR_RANGE);
        tu_assert_log_contains("more than the limit of 268435456", NULL);
        tu_log_capture_end();
        uint32_t nv = tok_vocab_size(toks[k]);
        const int32_t ids[3] = {1, (int32_t)nv, 2};
        char *text = (char *)1;
        size_t len = 9;
        char needle[96];
        snprintf(needle, sizeof needle, "id %u at position 1 is outside the vocabulary of %u",
                 nv, nv);
        tu_log_capture_begin();
        assert_int_equal(tok_decode(toks[k], ids, 3, &text, &len), ERR_RANGE);
        tu_assert_log_contains(needle, NULL);
        const int32_t neg = -5;
        assert_int_equal(tok_decode(toks[k], &neg, 1, &text, &len), ERR_RANGE);
        tu_assert_log_contains("id -5 at position 0", NULL);
        tu_log_capture_end();
        assert_null(text);
        assert_int_equal(len, 0);
        const char *p;
        size_t pl;
        assert_int_equal(tok_piece(toks[k], (int32_t)nv, &p, &pl), ERR_RANGE);
        assert_int_equal(tok_piece(toks[k], -1, &p, &pl), ERR_RANGE);
        assert_null(tok_token_str(toks[k], (int32_t)nv));
        assert_int_equal(tok_token_type(toks[k], -1), 0);
        tok_free(toks[k]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_spm_model), cmocka_unit_test(bad_llama2c_bin),
        cmocka_unit_test(bad_hf_json),   cmocka_unit_test(bad_ie_json),
        cmocka_unit_test(bad_json_scan),
        cmocka_unit_test(bad_gguf),      cmocka_unit_test(bad_paths),
        cmocka_unit_test(bad_text_and_ids), cmocka_unit_test(bad_tiktoken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
