/*
 * fuzz_tok_encode.c — libFuzzer harness for encoding and decoding arbitrary bytes. The
 * vocabularies are built inline (the fuzzer cannot rely on fixture files): a SentencePiece
 * vocabulary with merges, byte fallback, a user-defined, an unused and control pieces, and a
 * byte-level BPE vocabulary with merges, an added token and a control token.
 *
 * The first input byte picks the vocabulary (bit 0) and the mode (bit 1): text or ids.
 *  - text: invalid UTF-8 must be refused with ERR_FORMAT; valid text must encode without
 *    control tokens and decode back to itself (SPM: with U+2581 read as a space, which is
 *    what SentencePiece's escaping means);
 *  - ids: the remaining bytes, two per id, are decoded both at once and through the stream
 *    with a chunked buffer; both must agree and be valid UTF-8.
 */
#include "fuzz.h"

#include "tok.h"
#include "log.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SP "\xE2\x96\x81" /* U+2581 */

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static struct tok *load(json_t *doc)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = NULL;
    if (!s || tok_load_mem(s, strlen(s), "ie-json", &t) != 0)
        abort(); /* the inline vocabularies are valid */
    free(s);
    return t;
}

static struct tok *build_spm(void)
{
    static const struct {
        const char *p, *type;
        double score;
    } v[] = {
        {"<unk>", "unknown", 0}, {"<s>", "control", 0},   {"</s>", "control", 0},
        {SP, "normal", -30},     {"t", "normal", -31},    {"h", "normal", -32},
        {"e", "normal", -33},    {"a", "normal", -34},    {"b", "normal", -35},
        {"c", "normal", -36},    {"\xC3\xA9", "normal", -37},
        {SP "t", "normal", -1},  {"th", "normal", -2},    {"he", "normal", -2},
        {SP "th", "normal", -3}, {SP "the", "normal", -4}, {"ab", "unused", -5},
        {"abc", "normal", -6},   {SP SP, "normal", -7},   {"<x>", "user_defined", 0},
        {SP "a", "normal", -8},
    };
    json_t *tokens = json_array(), *types = json_array(), *scores = json_array();
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        json_array_append_new(tokens, json_string(v[i].p));
        json_array_append_new(types, json_string(v[i].type));
        json_array_append_new(scores, json_real(v[i].score));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_array_append_new(tokens, json_string(name));
        json_array_append_new(types, json_string("byte"));
        json_array_append_new(scores, json_real(0));
    }
    return load(json_pack("{sssiss sisisi sbsbsbsb soso so}", "format", "clocher-tokenizer",
                          "version", 1, "kind", "spm", "bos", 1, "eos", 2, "unk", 0, "add_bos",
                          1, "add_dummy_prefix", 1, "remove_extra_whitespaces", 0,
                          "byte_fallback", 1, "tokens", tokens, "types", types, "scores",
                          scores));
}

/* GPT-2's byte -> character mapping, written out here independently of tok_unicode.c */
static void byte_char(int b, char out[3])
{
    static int cp[256];
    if (!cp[0]) {
        int k = 0;
        for (int i = 0; i < 256; i++) {
            int self = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
            cp[i] = self ? i : 0x100 + k++;
        }
    }
    memset(out, 0, 3);
    if (cp[b] < 0x80) {
        out[0] = (char)cp[b];
    } else {
        out[0] = (char)(0xC0 | cp[b] >> 6);
        out[1] = (char)(0x80 | (cp[b] & 0x3F));
    }
}

static struct tok *build_bpe(void)
{
    /* extra tokens 256.. and merges over them (by token string) */
    static const char *const extra[] = {"\xC4\xA0t", "he", "\xC4\xA0the", "in", "\xC4\xA0\x61",
                                        "er", "aa", "\xC3\xB0\xC5\x81" /* bytes F0 9F */,
                                        "\xC4\xA0\xC4\xA0"};
    static const char *const merges[][2] = {
        {"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "n"}, {"\xC4\xA0", "a"},
        {"e", "r"},        {"a", "a"}, {"\xC3\xB0", "\xC5\x81"}, {"\xC4\xA0", "\xC4\xA0"},
    };
    json_t *tokens = json_array(), *types = json_array(), *m = json_array();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_array_append_new(tokens, json_string(c));
        json_array_append_new(types, json_string("normal"));
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        json_array_append_new(tokens, json_string(extra[i]));
        json_array_append_new(types, json_string("normal"));
    }
    json_array_append_new(tokens, json_string("<|endoftext|>"));
    json_array_append_new(types, json_string("control"));
    json_array_append_new(tokens, json_string("<|user|>"));
    json_array_append_new(types, json_string("user_defined"));
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        json_int_t ids[2] = {-1, -1};
        for (int side = 0; side < 2; side++)
            for (size_t k = 0; k < json_array_size(tokens); k++)
                if (strcmp(json_string_value(json_array_get(tokens, k)), merges[i][side]) == 0)
                    ids[side] = (json_int_t)k;
        if (ids[0] < 0 || ids[1] < 0)
            abort();
        json_array_append_new(m, json_pack("[II]", ids[0], ids[1]));
    }
    json_int_t eot = (json_int_t)json_array_size(tokens) - 2;
    return load(json_pack("{sssiss sIsIsn sb ss soso so}", "format", "clocher-tokenizer",
                          "version", 1, "kind", "bpe", "bos", eot, "eos", eot, "unk", "add_bos",
                          0, "pre_tokenizer", "gpt2", "tokens", tokens, "types", types, "merges",
                          m));
}

/* 1 when s[0..n) is valid UTF-8 (the decoder's output must always be) */
static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                                 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (len == 0 || i + len > n)
            return 0;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (len > 1 && (s[i + 1] < lo || s[i + 1] > hi))
            return 0;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += len;
    }
    return 1;
}

static void fuzz_text(const struct tok *t, const char *text, size_t n)
{
    int32_t *ids;
    size_t n_ids;
    int rc = tok_encode(t, text, n, false, &ids, &n_ids);
    if (!valid_utf8((const unsigned char *)text, n)) {
        if (rc == 0)
            abort(); /* invalid UTF-8 must be refused */
        return;
    }
    if (rc != 0)
        abort();
    for (size_t i = 0; i < n_ids; i++)
        if (tok_token_type(t, ids[i]) == TOK_CONTROL || tok_token_type(t, ids[i]) == 0)
            abort();
    char *back;
    size_t len;
    if (tok_decode(t, ids, n_ids, &back, &len) != 0)
        abort();
    /* the expected text: SPM escapes spaces as U+2581, so a U+2581 in the input reads back as
     * a space */
    char *want = malloc(n + 1);
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        if (tok_kind(t) == TOK_SPM && n - i >= 3 && memcmp(text + i, SP, 3) == 0) {
            want[w++] = ' ';
            i += 3;
        } else {
            want[w++] = text[i++];
        }
    }
    if (len != w || memcmp(back, want, w) != 0)
        abort();
    free(want);
    free(back);
    free(ids);
}

static void fuzz_ids(const struct tok *t, const uint8_t *p, size_t n)
{
    size_t n_ids = n / 2;
    int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
    uint32_t vocab = tok_vocab_size(t);
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)((p[2 * i] | (uint32_t)p[2 * i + 1] << 8) % vocab);
    char *all;
    size_t len;
    if (tok_decode(t, ids, n_ids, &all, &len) != 0 || !valid_utf8((unsigned char *)all, len))
        abort();
    size_t max = tok_stream_max_out(t), o = 0, got;
    char *buf = malloc(max);
    struct tok_stream s;
    tok_stream_init(&s, t);
    for (size_t i = 0; i <= n_ids; i++) {
        int rc = i < n_ids ? tok_stream_push(&s, ids[i], buf, max, &got)
                           : tok_stream_flush(&s, buf, max, &got);
        if (rc != 0 || got > max || o + got > len || memcmp(all + o, buf, got) != 0 ||
            !valid_utf8((unsigned char *)buf, got))
            abort(); /* each chunk is whole characters, and the chunks make the whole */
        o += got;
    }
    if (o != len)
        abort();
    free(buf);
    free(all);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct tok *spm, *bpe;
    log_set_sink(quiet, NULL);
    if (!spm) { /* built once; lives for the process */
        spm = build_spm();
        bpe = build_bpe();
    }
    if (size < 1)
        return 0;
    const struct tok *t = data[0] & 1 ? bpe : spm;
    if (data[0] & 2)
        fuzz_ids(t, data + 1, size - 1);
    else
        fuzz_text(t, (const char *)data + 1, size - 1);
    return 0;
}
