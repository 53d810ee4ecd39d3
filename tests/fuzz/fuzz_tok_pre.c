/*
 * fuzz_tok_pre.c — libFuzzer harness for the regex pre-tokenizer (worker/tok/tok_pre.c,
 * PCRE2) reached the way an untrusted tokenizer.json reaches it: byte 0 picks the Split
 * behavior (bits 0-2, modulo 5) and invert (bit 3); the bytes up to the first newline are the
 * pattern; the rest, cut to its valid UTF-8 prefix, is the text. The pattern goes into a
 * tokenizer.json over a 256-byte byte-level vocabulary. A pattern that loads must then: encode
 * the text (hostile patterns included: PCRE2's limits end a piece instead of hanging), decode
 * it back exactly unless the behavior removes text, and survive the tokenizer.ie.json round
 * trip with the same ids. Any violation aborts. Seeds: corpus/tok_pre/ (written by hand).
 */
#include "fuzz.h"

#include "log.h"
#include "tok.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static const char *const behaviors[] = {"Isolated", "Removed", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};

/* GPT-2's byte-level character of byte b, UTF-8 in out (NUL-terminated). */
static void byte_char(int b, char out[3])
{
    int cp = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? b : -1;
    if (cp < 0) {
        int k = 0;
        for (int c = 0; c < b; c++)
            k += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

static size_t utf8_prefix(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (l == 0 || i + l > n)
            break;
        bool ok = true;
        for (size_t j = 1; j < l; j++)
            ok &= (p[i + j] & 0xC0) == 0x80;
        /* overlongs and surrogates: leave to the encoder's check by stopping here */
        if (!ok || (c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F) ||
            (c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))
            break;
        i += l;
    }
    return i;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (size < 2)
        return 0;
    int behavior = (data[0] & 7) % 5;
    bool invert = data[0] & 8;
    const uint8_t *nl = memchr(data + 1, '\n', size - 1);
    if (!nl)
        return 0;
    size_t plen = (size_t)(nl - (data + 1));
    const uint8_t *text = nl + 1;
    size_t tlen = utf8_prefix(text, size - (size_t)(text - data));

    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_t *pat = json_stringn((const char *)data + 1, plen); /* NULL unless UTF-8 */
    if (!pat) {
        json_decref(vocab);
        return 0;
    }
    json_t *doc = json_pack("{s{sssos[]} s{s{so}sssb}}", "model", "type", "BPE", "vocab", vocab,
                            "merges", "pre_tokenizer", "pattern", "Regex", pat, "type", "Split",
                            "behavior", behaviors[behavior], "invert", invert);
    char *js = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!js)
        abort();
    struct tok *t;
    int rc = tok_load_mem(js, strlen(js), "hf-json", &t);
    free(js);
    if (rc != 0)
        return 0;
    int32_t *ids;
    size_t n;
    if (tok_encode(t, (const char *)text, tlen, false, &ids, &n) != 0)
        abort(); /* valid UTF-8 always encodes */
    char *back;
    size_t blen;
    if (tok_decode(t, ids, n, &back, &blen) != 0)
        abort();
    bool removes = behavior == 1; /* Removed drops the matches (or the gaps when inverted) */
    if (!removes && (blen != tlen || memcmp(back, text, tlen) != 0))
        abort(); /* every other behavior only regroups the text */
    free(back);
    char *j1;
    size_t l1;
    struct tok *t2;
    if (tok_save_json(t, &j1, &l1) != 0 || tok_load_mem(j1, l1, "ie-json", &t2) != 0)
        abort(); /* what we write, we read */
    int32_t *ids2;
    size_t n2;
    if (tok_encode(t2, (const char *)text, tlen, false, &ids2, &n2) != 0 || n2 != n ||
        memcmp(ids, ids2, n * sizeof *ids) != 0)
        abort();
    free(ids2);
    free(j1);
    tok_free(t2);
    free(ids);
    tok_free(t);
    return 0;
}
