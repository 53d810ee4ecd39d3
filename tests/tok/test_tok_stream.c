/*
 * test_tok_stream.c — streaming decode: only whole UTF-8 characters ever come out, whether a
 * character is split across byte tokens (SPM <0xNN>) or across byte-level BPE tokens (GPT-2
 * emoji); ill-formed bytes become U+FFFD (one per maximal ill-formed subpart), an incomplete
 * tail becomes U+FFFD on flush; SentencePiece's leading-space rule; too-small buffers leave the
 * stream unchanged; the stream agrees with tok_decode on random sequences.
 */
#include "testutil.h"

#include "err.h"
#include "tok.h"
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FFFD "\xEF\xBF\xBD"
#define SPM_BYTE(b) (3 + (b)) /* Llama's <0xNN> tokens are ids 3..258 */

static struct tok *spm, *gpt2;

static int setup(void **state)
{
    (void)state;
    if (tok_load(tu_fixture("tokenizer/ggml-vocab-llama-spm.gguf"), &spm) != 0 ||
        tok_load(tu_fixture("tokenizer/ggml-vocab-gpt-2.gguf"), &gpt2) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tok_free(spm);
    tok_free(gpt2);
    return 0;
}

/* Pushes ids one by one; the chunks, joined by '|', must be `want` (flush output last). */
static void expect_chunks(struct tok_stream *s, const int32_t *ids, size_t n, const char *want)
{
    char got[1024] = "", buf[256];
    size_t o = 0, len;
    for (size_t i = 0; i <= n; i++) {
        int rc = i < n ? tok_stream_push(s, ids[i], buf, sizeof buf, &len)
                       : tok_stream_flush(s, buf, sizeof buf, &len);
        assert_int_equal(rc, 0);
        if (i)
            got[o++] = '|';
        memcpy(got + o, buf, len);
        o += len;
        got[o] = '\0';
    }
    if (strcmp(got, want) != 0)
        fail_msg("chunks '%s', expected '%s'", got, want);
}

#define CHUNKS(t, want, ...)                                                          \
    do {                                                                              \
        struct tok_stream s_;                                                         \
        tok_stream_init(&s_, t);                                                      \
        const int32_t ids_[] = {__VA_ARGS__};                                         \
        expect_chunks(&s_, ids_, sizeof ids_ / sizeof ids_[0], want);                 \
    } while (0)

static void spm_byte_tokens(void **state)
{
    (void)state;
    /* "🦙" is ▁ + four byte tokens: nothing comes out until the character is whole */
    CHUNKS(spm, "||||\xF0\x9F\xA6\x99|", 29871, SPM_BYTE(0xF0), SPM_BYTE(0x9F), SPM_BYTE(0xA6),
           SPM_BYTE(0x99));
    /* a two-byte character after text */
    CHUNKS(spm, "Hello||\xC3\xA9|", 15043, SPM_BYTE(0xC3), SPM_BYTE(0xA9));
}

static void ill_formed_bytes(void **state)
{
    (void)state;
    /* a lead byte then ASCII: the lead is replaced, the ASCII kept */
    CHUNKS(spm, "|" FFFD "A|", SPM_BYTE(0xF0), SPM_BYTE(0x41));
    CHUNKS(spm, FFFD "|", SPM_BYTE(0x80));                      /* lone continuation */
    CHUNKS(spm, FFFD "|", SPM_BYTE(0xC0));                      /* never a lead byte */
    CHUNKS(spm, "|" FFFD FFFD "|", SPM_BYTE(0xE0), SPM_BYTE(0x80)); /* overlong */
    CHUNKS(spm, "|" FFFD FFFD "|", SPM_BYTE(0xED), SPM_BYTE(0xA0)); /* surrogate */
    CHUNKS(spm, "|" FFFD FFFD "|", SPM_BYTE(0xF4), SPM_BYTE(0x90)); /* > U+10FFFF */
    /* incomplete at the end: U+FFFD on flush */
    CHUNKS(spm, "||" FFFD, SPM_BYTE(0xE2), SPM_BYTE(0x82));
    /* incomplete, then a text token: the tail is replaced; the first token was a byte, so
     * the text keeps its leading space */
    CHUNKS(spm, "||" FFFD " Hello|", SPM_BYTE(0xF0), SPM_BYTE(0x9F), 15043);
}

static void leading_space(void **state)
{
    (void)state;
    CHUNKS(spm, "|Hello| world|", 1, 15043, 3186); /* BOS, ▁Hello, ▁world */
    CHUNKS(spm, "\n|", SPM_BYTE(0x0A));
    /* continuing text keeps the space */
    struct tok_stream s;
    tok_stream_init(&s, spm);
    s.at_start = false;
    const int32_t ids[] = {15043, 3186};
    expect_chunks(&s, ids, 2, " Hello| world|");
    /* flush starts a new sequence: the rule applies again */
    expect_chunks(&s, ids, 2, "Hello| world|");
    /* GPT-2 has no such rule */
    CHUNKS(gpt2, " Hello|", 18435);
}

/* Every fixture string, streamed token by token through both vocabularies: each chunk is
 * complete UTF-8 and the chunks make the text (SPM: as tok_decode gives it). */
static void fixture_strings(void **state)
{
    (void)state;
    static const char *texts[] = {
        ("Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
         "apple\xE5\xB7\xA5\xE4\xBD\x9C" "1314151\xE5\xA4\xA9\xEF\xBD\x9E"),
        "\xE1\x9E\x80\xE1\x9E\xB6\xE1\x9E\x93\xE1\x9F\x8B\xE1\x9E\x8F\xE1\x9F\x82",
        ("\xF0\x9F\x9A\x80 (normal) \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F "
         "(multiple emojis concatenated) \xE2\x9C\x85"),
        "F\xC3\xBChrer ied 4 \xC2\xBD months",
    };
    const struct tok *toks[2] = {spm, gpt2};
    for (int k = 0; k < 2; k++) {
        size_t split_chars = 0;
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            int32_t *ids;
            size_t n;
            assert_int_equal(tok_encode(toks[k], texts[i], strlen(texts[i]), false, &ids, &n),
                             0);
            struct tok_stream s;
            tok_stream_init(&s, toks[k]);
            char out[4096], chunk[256];
            size_t o = 0, len;
            for (size_t j = 0; j <= n; j++) {
                int rc = j < n ? tok_stream_push(&s, ids[j], chunk, sizeof chunk, &len)
                               : tok_stream_flush(&s, chunk, sizeof chunk, &len);
                assert_int_equal(rc, 0);
                assert_int_equal(tok__utf8_check(chunk, len), len);
                const char *piece;
                size_t plen;
                if (j < n && tok_piece(toks[k], ids[j], &piece, &plen) == 0 && plen > 0 &&
                    tok__utf8_check(piece, plen) != plen)
                    split_chars++; /* this token carried part of a character */
                memcpy(out + o, chunk, len);
                o += len;
            }
            assert_int_equal(o, strlen(texts[i]));
            assert_memory_equal(out, texts[i], o);
            free(ids);
        }
        assert_true(split_chars > 0); /* the test did exercise split characters */
    }
}

static void small_buffer_and_bad_id(void **state)
{
    (void)state;
    struct tok_stream s;
    tok_stream_init(&s, spm);
    char buf[64];
    size_t len;
    tu_log_capture_begin();
    assert_int_equal(tok_stream_push(&s, 15043, buf, 2, &len), ERR_RANGE);
    tu_assert_log_contains("too small", NULL);
    assert_int_equal(len, 0);
    assert_true(s.at_start); /* unchanged */
    assert_int_equal(tok_stream_push(&s, 15043, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "Hello", 5);
    /* a pending byte outputs nothing, so no room is needed */
    assert_int_equal(tok_stream_push(&s, SPM_BYTE(0xE2), buf, 0, &len), 0);
    assert_int_equal(tok_stream_flush(&s, buf, 2, &len), ERR_RANGE);
    assert_int_equal(tok_stream_flush(&s, buf, 3, &len), 0);
    assert_memory_equal(buf, FFFD, 3);
    assert_int_equal(tok_stream_push(&s, 32000, buf, sizeof buf, &len), ERR_RANGE);
    assert_int_equal(tok_stream_push(&s, -1, buf, sizeof buf, &len), ERR_RANGE);
    tu_assert_log_contains("token id 32000 is outside the vocabulary of 32000 tokens",
                           "token id -1", NULL);
    tu_log_capture_end();
}

/* Random id sequences (which may splice bytes into anything): every chunk is valid UTF-8,
 * never longer than tok_stream_max_out, and the chunks equal tok_decode's result. */
static void random_sequences(void **state)
{
    (void)state;
    const struct tok *toks[2] = {spm, gpt2};
    uint32_t x = 12345;
    for (int k = 0; k < 2; k++) {
        const struct tok *t = toks[k];
        size_t max = tok_stream_max_out(t);
        char *chunk = malloc(max), *all = malloc(64 * max + 1);
        for (int round = 0; round < 300; round++) {
            int32_t ids[64];
            size_t n = 1 + round % 64, o = 0, len;
            for (size_t j = 0; j < n; j++) {
                x = x * 1664525u + 1013904223u;
                /* half the time a byte-ish token (SPM <0xNN>, GPT-2 single bytes), so
                 * sequences are often ill-formed */
                ids[j] = (int32_t)((x >> 8) % (x & 1 ? 259 : tok_vocab_size(t)));
            }
            struct tok_stream s;
            tok_stream_init(&s, t);
            for (size_t j = 0; j <= n; j++) {
                int rc = j < n ? tok_stream_push(&s, ids[j], chunk, max, &len)
                               : tok_stream_flush(&s, chunk, max, &len);
                assert_int_equal(rc, 0);
                assert_true(len <= max);
                assert_int_equal(tok__utf8_check(chunk, len), len);
                memcpy(all + o, chunk, len);
                o += len;
            }
            char *text;
            size_t text_len;
            assert_int_equal(tok_decode(t, ids, n, &text, &text_len), 0);
            assert_int_equal(text_len, o);
            assert_memory_equal(text, all, o);
            assert_int_equal(text[text_len], '\0');
            free(text);
        }
        free(chunk);
        free(all);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spm_byte_tokens),   cmocka_unit_test(ill_formed_bytes),
        cmocka_unit_test(leading_space),     cmocka_unit_test(fixture_strings),
        cmocka_unit_test(small_buffer_and_bad_id), cmocka_unit_test(random_sequences),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
