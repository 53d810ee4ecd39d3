/*
 * fuzz_tok_tiktoken.c — libFuzzer harness for the tiktoken rank-file parser
 * (worker/tok/tok_tiktoken.c): the input is the file. Every line is parsed and checked before
 * the encoding is recognized by its rank count, so any input reaches the base64 and rank
 * parsing; loading must fail cleanly or give a tokenizer that encodes and decodes a text
 * losslessly. Seeds: corpus/tok_tiktoken/ (written by hand).
 */
#include "fuzz.h"

#include "log.h"
#include "tok.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct tok *t;
    if (tok_load_mem(data, size, "tiktoken", &t) != 0)
        return 0;
    static const char text[] = "Hello, world! It's 2026 \xE6\x88\x91 \xF0\x9F\xA6\x99";
    int32_t *ids;
    size_t n;
    char *back;
    size_t blen;
    if (tok_encode(t, text, strlen(text), false, &ids, &n) != 0 ||
        tok_decode(t, ids, n, &back, &blen) != 0 || blen != strlen(text) ||
        memcmp(back, text, blen) != 0)
        abort();
    free(back);
    free(ids);
    tok_free(t);
    return 0;
}
