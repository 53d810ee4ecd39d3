/*
 * fuzz_tok_load.c — libFuzzer harness for the tokenizer loaders. The first byte picks the
 * format (modulo 5: GGUF, tokenizer.model, tokenizer.json, tokenizer.bin, tokenizer.ie.json),
 * the rest is the file. A vocabulary that loads must then work: fixed texts encode without
 * producing control tokens and decode back (byte-level BPE exactly), every token decodes
 * through the stream within tok_stream_max_out, and tokenizer.ie.json round-trips to the
 * same document and the same tokens. Any violation aborts.
 */
#include "fuzz.h"

#include "tok.h"
#include "log.h"

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

static const char *const kinds[] = {"gguf", "spm-model", "hf-json", "llama2c-bin", "ie-json"};

static const char *const texts[] = {
    "",
    " ",
    "Hello world",
    "  leading and trailing  ",
    "it's 42 \xC3\xA9t\xC3\xA9\n\tdone",
    "\xF0\x9F\xA6\x99\xE6\x88\x91 <s> </s> <|endoftext|> <unk>",
};

static void check_encode(const struct tok *t)
{
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        size_t n;
        if (tok_encode(t, texts[i], strlen(texts[i]), true, &ids, &n) != 0)
            abort(); /* a loaded vocabulary encodes any valid UTF-8 */
        size_t first = tok_bos(t) >= 0; /* BOS, asked for, may be any type of token */
        if (first && (n == 0 || ids[0] != tok_bos(t)))
            abort();
        for (size_t j = first; j < n; j++) {
            if (tok_token_type(t, ids[j]) == 0)
                abort();
            if (tok_token_type(t, ids[j]) == TOK_CONTROL)
                abort(); /* text never yields control tokens */
        }
        char *text;
        size_t len;
        if (tok_decode(t, ids + first, n - first, &text, &len) != 0)
            abort();
        if (tok_kind(t) == TOK_BPE && (len != strlen(texts[i]) || memcmp(text, texts[i], len)))
            abort(); /* byte-level BPE is lossless */
        free(text);
        free(ids);
    }
}

static void check_stream(const struct tok *t)
{
    size_t max = tok_stream_max_out(t);
    char *buf = malloc(max);
    if (!buf)
        abort();
    struct tok_stream s;
    tok_stream_init(&s, t);
    uint32_t n = tok_vocab_size(t);
    for (uint32_t id = 0; id < n && id < 4096; id++) {
        size_t got;
        if (tok_stream_push(&s, (int32_t)id, buf, max, &got) != 0 || got > max)
            abort();
    }
    size_t got;
    if (tok_stream_flush(&s, buf, max, &got) != 0)
        abort();
    free(buf);
}

static void check_round_trip(const struct tok *t)
{
    char *j1, *j2;
    size_t l1, l2;
    struct tok *t2;
    if (tok_save_json(t, &j1, &l1) != 0)
        abort();
    if (tok_load_mem(j1, l1, "ie-json", &t2) != 0)
        abort(); /* what we write, we read */
    if (tok_save_json(t2, &j2, &l2) != 0 || l1 != l2 || memcmp(j1, j2, l1) != 0)
        abort();
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *a, *b;
        size_t na, nb;
        if (tok_encode(t, texts[i], strlen(texts[i]), false, &a, &na) != 0 ||
            tok_encode(t2, texts[i], strlen(texts[i]), false, &b, &nb) != 0 || na != nb ||
            memcmp(a, b, na * sizeof *a) != 0)
            abort();
        free(a);
        free(b);
    }
    tok_free(t2);
    free(j1);
    free(j2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (size < 1)
        return 0;
    struct tok *t;
    if (tok_load_mem(data + 1, size - 1, kinds[data[0] % 5], &t) != 0)
        return 0;
    check_encode(t);
    check_stream(t);
    check_round_trip(t);
    tok_free(t);
    return 0;
}
