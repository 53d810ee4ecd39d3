/*
 * test_shm_msg.c — record encoders and validating decoders (shm/msg.c): every record type
 * survives encode → decode with every field intact and re-encodes to the same bytes; every
 * rule (lengths, counts, enums, flags, float ranges, names, NULs, reserved fields, exact record
 * length, direction) refuses with ERR_FORMAT and a message naming the record and the field.
 */
#include "testutil.h"

#include "err.h"
#include "msg.h"
#include "shmtest.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static _Alignas(16) uint8_t wire[1 << 16];

static uint32_t encode(const struct shm_msg *m)
{
    uint32_t len = 0;
    assert_int_equal(shm_msg_size("test", m, &len), 0);
    assert_true(len <= sizeof wire);
    memset(wire, 0xcc, len);
    shm_msg_encode(m, wire, len);
    return len;
}

/* decode, check it re-encodes to the very same bytes */
static void roundtrip(const struct shm_msg *m, uint32_t expect_len, struct shm_msg *out)
{
    uint32_t len = encode(m);
    assert_int_equal(len, expect_len);
    assert_int_equal(shm_msg_decode("test", m->type, wire, len, out), 0);
    assert_int_equal(out->type, m->type);
    static _Alignas(16) uint8_t again[1 << 16];
    uint32_t len2;
    assert_int_equal(shm_msg_size("test", out, &len2), 0);
    assert_int_equal(len2, len);
    shm_msg_encode(out, again, len2);
    assert_memory_equal(again, wire, len);
}

static const int32_t ids[] = {1, 15043, 0, 31999};

static struct shm_msg generate(void)
{
    struct shm_msg m = {.type = SHM_MSG_GENERATE};
    struct shm_msg_generate *g = &m.generate;
    g->request_id = 77;
    g->tenant_id = 5;
    g->deadline_ns = 123456789;
    g->seed = 42;
    g->temperature = 0.7f;
    g->top_p = 0.9f;
    g->min_p = 0.05f;
    g->repeat_penalty = 1.1f;
    g->adapter_scale = 0.5f;
    g->top_k = 40;
    g->repeat_window = 64;
    g->max_tokens = 128;
    g->sent_ns = 123456789012345ull;
    g->priority = SHM_PRIO_HIGH;
    g->flags = SHM_GEN_ADD_BOS;
    g->prompt_ids = ids;
    g->n_prompt_ids = 4;
    g->adapter = "sql-lora";
    g->stop[0] = "\n\n";
    g->stop[1] = "</s>";
    g->n_stop = 2;
    return m;
}

static void test_roundtrip_requests(void **state)
{
    (void)state;
    struct shm_msg m = generate(), d;
    /* 104 + 4*4 ids + "sql-lora\0" 9 + "\n\n\0</s>\0" 8 */
    roundtrip(&m, 104 + 16 + 9 + 8, &d);
    const struct shm_msg_generate *g = &d.generate;
    assert_int_equal(g->request_id, 77);
    assert_int_equal(g->tenant_id, 5);
    assert_int_equal(g->deadline_ns, 123456789);
    assert_int_equal(g->seed, 42);
    assert_true(g->temperature == 0.7f && g->top_p == 0.9f && g->min_p == 0.05f);
    assert_true(g->repeat_penalty == 1.1f && g->adapter_scale == 0.5f);
    assert_int_equal(g->top_k, 40);
    assert_int_equal(g->repeat_window, 64);
    assert_int_equal(g->max_tokens, 128);
    assert_int_equal(g->priority, SHM_PRIO_HIGH);
    assert_int_equal(g->flags, SHM_GEN_ADD_BOS);
    assert_int_equal(g->n_prompt_ids, 4);
    assert_memory_equal(g->prompt_ids, ids, sizeof ids);
    assert_null(g->prompt_text);
    assert_string_equal(g->adapter, "sql-lora");
    assert_int_equal(g->n_stop, 2);
    assert_string_equal(g->stop[0], "\n\n");
    assert_string_equal(g->stop[1], "</s>");

    /* a text prompt, no adapter, no stops */
    m.generate.prompt_ids = NULL;
    m.generate.n_prompt_ids = 0;
    m.generate.prompt_text = "Once upon\0a time"; /* text is bytes: a NUL is fine */
    m.generate.prompt_text_len = 16;
    m.generate.adapter = NULL;
    m.generate.n_stop = 0;
    roundtrip(&m, 104 + 16, &d);
    assert_null(d.generate.adapter);
    assert_int_equal(d.generate.n_stop, 0);
    assert_int_equal(d.generate.prompt_text_len, 16);
    assert_memory_equal(d.generate.prompt_text, "Once upon\0a time", 16);

    m = (struct shm_msg){.type = SHM_MSG_CANCEL, .request_id = 9};
    roundtrip(&m, 8, &d);
    assert_int_equal(d.request_id, 9);
    m.type = SHM_MSG_STATS_QUERY;
    roundtrip(&m, 8, &d);

    m = (struct shm_msg){.type = SHM_MSG_TOKENIZE,
                         .tokenize = {.request_id = 3, .flags = SHM_GEN_ADD_BOS, .text = "héllo",
                                      .text_len = 6}};
    roundtrip(&m, 16 + 6, &d);
    assert_int_equal(d.tokenize.flags, SHM_GEN_ADD_BOS);
    assert_memory_equal(d.tokenize.text, "héllo", 6);
    m.tokenize.text_len = 0; /* empty text: no ids, still a valid question */
    m.tokenize.text = NULL;
    roundtrip(&m, 16, &d);

    m = (struct shm_msg){.type = SHM_MSG_DETOKENIZE,
                         .ids = {.request_id = 4, .ids = ids, .n_ids = 4}};
    roundtrip(&m, 16 + 16, &d);
    assert_memory_equal(d.ids.ids, ids, sizeof ids);

    m = (struct shm_msg){.type = SHM_MSG_ADAPTER_LOAD,
                         .adapter_load = {.request_id = 5, .name = "a.b-c_1",
                                          .path = "/srv/adapters/a b"}};
    roundtrip(&m, 16 + 8 + 18, &d);
    assert_string_equal(d.adapter_load.name, "a.b-c_1");
    assert_string_equal(d.adapter_load.path, "/srv/adapters/a b");

    m = (struct shm_msg){.type = SHM_MSG_ADAPTER_UNLOAD, .name = {.request_id = 6, .name = "x"}};
    roundtrip(&m, 16 + 2, &d);
    assert_string_equal(d.name.name, "x");
}

static void test_roundtrip_events(void **state)
{
    (void)state;
    struct shm_msg m, d;
    m = (struct shm_msg){.type = SHM_MSG_TOKEN,
                         .token = {.request_id = 1, .token = 1234, .text = " the", .text_len = 4}};
    roundtrip(&m, 16 + 4, &d);
    assert_int_equal(d.token.token, 1234);
    assert_memory_equal(d.token.text, " the", 4);
    m.token.text_len = 0; /* a token that completes no character yet */
    m.token.text = NULL;
    roundtrip(&m, 16, &d);
    /* -1: the text the engine held back until the end, not a token */
    m.token.token = -1;
    m.token.text = "\xc3\xa9";
    m.token.text_len = 2;
    roundtrip(&m, 16 + 2, &d);
    assert_int_equal(d.token.token, -1);
    assert_memory_equal(d.token.text, "\xc3\xa9", 2);

    m = (struct shm_msg){.type = SHM_MSG_FINISH,
                         .finish = {.request_id = 2, .reason = SHM_FINISH_STOP,
                                    .prompt_tokens = 10, .completion_tokens = 20,
                                    .cached_tokens = 8, .queue_ns = 1, .ttft_ns = 2,
                                    .tpot_ns = 3, .e2e_ns = 4}};
    roundtrip(&m, 56, &d);
    assert_int_equal(d.finish.reason, SHM_FINISH_STOP);
    assert_int_equal(d.finish.cached_tokens, 8);
    assert_int_equal(d.finish.e2e_ns, 4);

    m = (struct shm_msg){.type = SHM_MSG_ERROR,
                         .error = {.request_id = 0, .code = ERR_OVERLOADED,
                                   .message = "queue full (256 waiting)"}};
    roundtrip(&m, 16 + 25, &d);
    assert_int_equal(d.error.code, ERR_OVERLOADED);
    assert_string_equal(d.error.message, "queue full (256 waiting)");

    m = (struct shm_msg){.type = SHM_MSG_TOKENS, .ids = {.request_id = 3, .ids = ids, .n_ids = 4}};
    roundtrip(&m, 32, &d);
    m = (struct shm_msg){.type = SHM_MSG_TEXT,
                         .text = {.request_id = 3, .text = "abc", .text_len = 3}};
    roundtrip(&m, 19, &d);
    m = (struct shm_msg){.type = SHM_MSG_ADAPTER,
                         .adapter = {.request_id = 4, .rank = 16, .alpha = 32,
                                     .targets = SHM_TARGET_Q | SHM_TARGET_V,
                                     .active_requests = 2, .name = "sql"}};
    roundtrip(&m, 32 + 4, &d);
    assert_int_equal(d.adapter.rank, 16);
    assert_true(d.adapter.alpha == 32.0f);
    assert_string_equal(d.adapter.name, "sql");
    m = (struct shm_msg){.type = SHM_MSG_DONE, .request_id = 4};
    roundtrip(&m, 8, &d);
    m = (struct shm_msg){.type = SHM_MSG_STATS,
                         .stats = {.request_id = 5, .running = 3, .waiting = 1,
                                   .kv_blocks_total = 100, .kv_blocks_used = 40,
                                   .kv_blocks_cached = 10, .prefix_hit_tokens = 7,
                                   .rss_bytes = 1 << 30}};
    roundtrip(&m, 96, &d);
    assert_int_equal(d.stats.kv_blocks_used, 40);
    assert_int_equal(d.stats.rss_bytes, 1 << 30);
    m = (struct shm_msg){.type = SHM_MSG_HELLO,
                         .hello = {.parameters = 260000, .vocab_size = 512,
                                   .context_length = 512, .name = "stories260K",
                                   .arch = "llama", .dtype = "f32"}};
    roundtrip(&m, 40 + 12 + 6 + 4, &d);
    assert_string_equal(d.hello.name, "stories260K");
    assert_int_equal(d.hello.vocab_size, 512);
}

/* ---- semantic rules: the encoder refuses, and so would the decoder ---- */

struct invalid {
    const char *needle;
    void (*edit)(struct shm_msg *m);
};

static void e_id(struct shm_msg *m) { m->generate.request_id = 0; }
static void e_temp(struct shm_msg *m) { m->generate.temperature = -0.5f; }
static void e_temp_nan(struct shm_msg *m) { m->generate.temperature = NAN; }
static void e_top_p0(struct shm_msg *m) { m->generate.top_p = 0; }
static void e_top_p(struct shm_msg *m) { m->generate.top_p = 1.5f; }
static void e_min_p(struct shm_msg *m) { m->generate.min_p = 1; }
static void e_rep(struct shm_msg *m) { m->generate.repeat_penalty = 0; }
static void e_scale(struct shm_msg *m) { m->generate.adapter_scale = INFINITY; }
static void e_window(struct shm_msg *m) { m->generate.repeat_window = SHM_MAX_REPEAT_WINDOW + 1; }
static void e_max(struct shm_msg *m) { m->generate.max_tokens = 0; }
static void e_prio(struct shm_msg *m) { m->generate.priority = (enum shm_priority)3; }
static void e_flags(struct shm_msg *m) { m->generate.flags = 0x10; }
static void e_no_prompt(struct shm_msg *m) { m->generate.n_prompt_ids = 0; }
static void e_two_prompts(struct shm_msg *m)
{
    m->generate.prompt_text = "x";
    m->generate.prompt_text_len = 1;
}
static const int32_t neg_ids[] = {5, -1};
static void e_neg_id(struct shm_msg *m)
{
    m->generate.prompt_ids = neg_ids;
    m->generate.n_prompt_ids = 2;
}
static void e_adapter_empty(struct shm_msg *m) { m->generate.adapter = ""; }
static void e_adapter_char(struct shm_msg *m) { m->generate.adapter = "sql/lora"; }
static char long_name[80];
static void e_adapter_long(struct shm_msg *m)
{
    memset(long_name, 'a', 64);
    long_name[64] = 0;
    m->generate.adapter = long_name;
}
static void e_nstop(struct shm_msg *m) { m->generate.n_stop = SHM_MAX_STOP + 1; }
static void e_stop_empty(struct shm_msg *m) { m->generate.stop[1] = ""; }
static char long_stop[300];
static void e_stop_long(struct shm_msg *m)
{
    memset(long_stop, 's', 257);
    long_stop[257] = 0;
    m->generate.stop[0] = long_stop;
}
static void e_token_neg(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_TOKEN, .token = {.request_id = 1, .token = -3}};
}
static void e_token_text_only_empty(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_TOKEN, .token = {.request_id = 1, .token = -1}};
}
static void e_token_piece(struct shm_msg *m)
{
    static char piece[SHM_MAX_PIECE + 1];
    *m = (struct shm_msg){.type = SHM_MSG_TOKEN,
                          .token = {.request_id = 1, .text = piece, .text_len = sizeof piece}};
}
static void e_finish_reason(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_FINISH,
                          .finish = {.request_id = 1, .reason = (enum shm_finish)7}};
}
static void e_finish_cached(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_FINISH,
                          .finish = {.request_id = 1, .reason = SHM_FINISH_EOS,
                                     .prompt_tokens = 3, .cached_tokens = 4}};
}
static void e_error_code(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_ERROR, .error = {.code = 5, .message = "x"}};
}
static void e_error_msg(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_ERROR, .error = {.code = -1, .message = ""}};
}
static void e_adapter_rank(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_ADAPTER,
                          .adapter = {.request_id = 1, .rank = 0, .alpha = 1, .targets = 1,
                                      .name = "a"}};
}
static void e_adapter_alpha(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_ADAPTER,
                          .adapter = {.request_id = 1, .rank = 8, .alpha = -1, .targets = 1,
                                      .name = "a"}};
}
static void e_adapter_targets(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_ADAPTER,
                          .adapter = {.request_id = 1, .rank = 8, .alpha = 1, .targets = 0x80,
                                      .name = "a"}};
}
static void e_stats(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_STATS,
                          .stats = {.request_id = 1, .kv_blocks_total = 5, .kv_blocks_used = 6}};
}
static void e_hello(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_HELLO,
                          .hello = {.vocab_size = 1, .context_length = 1, .name = "m",
                                    .arch = "ll\x01", .dtype = "f32"}};
}
static void e_hello_vocab(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_HELLO,
                          .hello = {.context_length = 1, .name = "m", .arch = "a", .dtype = "d"}};
}
static void e_load_path(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_ADAPTER_LOAD,
                          .adapter_load = {.request_id = 1, .name = "a", .path = ""}};
}
static void e_cancel(struct shm_msg *m) { *m = (struct shm_msg){.type = SHM_MSG_CANCEL}; }
static void e_tok_flags(struct shm_msg *m)
{
    *m = (struct shm_msg){.type = SHM_MSG_TOKENIZE, .tokenize = {.request_id = 1, .flags = 2}};
}
static void e_type(struct shm_msg *m) { m->type = (enum shm_msg_type)40; }

static const struct invalid invalids[] = {
    {"generate record: request_id is 0", e_id},
    {"generate record (request 77): temperature -0.5 is not a finite value >= 0", e_temp},
    {"temperature nan", e_temp_nan},
    {"top_p 0 is outside (0, 1]", e_top_p0},
    {"top_p 1.5 is outside (0, 1]", e_top_p},
    {"min_p 1 is outside [0, 1)", e_min_p},
    {"repeat_penalty 0 is not a finite value > 0", e_rep},
    {"adapter_scale inf is not finite", e_scale},
    {"repeat_window 1048577 exceeds 1048576", e_window},
    {"max_tokens is 0", e_max},
    {"priority 3 is not a priority", e_prio},
    {"flags 0x10 hold unknown bits", e_flags},
    {"no prompt (neither text nor token ids)", e_no_prompt},
    {"both a prompt text and prompt token ids", e_two_prompts},
    {"prompt_ids[1] is -1", e_neg_id},
    {"adapter must be 1..63 bytes, got none", e_adapter_empty},
    {"adapter holds byte 0x2f at 3", e_adapter_char},
    {"adapter must be 1..63 bytes, got more", e_adapter_long},
    {"17 stop strings, at most 16", e_nstop},
    {"stop[1] must be 1..256 bytes, got none", e_stop_empty},
    {"stop[0] must be 1..256 bytes, got more", e_stop_long},
    {"token record (request 1): token -3 is negative", e_token_neg},
    {"token -1 (text only) carries no text", e_token_text_only_empty},
    {"text of 4097 bytes exceeds 4096", e_token_piece},
    {"finish record (request 1): reason 7 is not a finish reason", e_finish_reason},
    {"cached_tokens 4 exceeds prompt_tokens 3", e_finish_cached},
    {"error record: code 5 is not a negative error code", e_error_code},
    {"message must be 1..1023 bytes, got none", e_error_msg},
    {"rank 0 is outside 1..65536", e_adapter_rank},
    {"alpha -1 is not a finite value > 0", e_adapter_alpha},
    {"targets 0x80 is not a nonempty set", e_adapter_targets},
    {"kv blocks used 6 / cached 0 exceed total 5", e_stats},
    {"hello record: arch holds byte 0x01 at 2 (printable ASCII only)", e_hello},
    {"vocab_size 0 and context_length 1 must be >= 1", e_hello_vocab},
    {"adapter-load record (request 1): path must be 1..4095 bytes", e_load_path},
    {"cancel record: request_id is 0", e_cancel},
    {"tokenize record (request 1): flags 0x2 hold unknown bits", e_tok_flags},
    {"record of type 40: not a record type", e_type},
};

static void test_invalid_messages(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof invalids / sizeof invalids[0]; i++) {
        struct shm_msg m = generate();
        invalids[i].edit(&m);
        uint32_t len;
        tu_log_capture_begin();
        int rc = shm_msg_size("test", &m, &len);
        tu_log_capture_end();
        if (rc != ERR_FORMAT)
            fail_msg("case %zu (%s): got %s", i, invalids[i].needle, err_name(rc));
        tu_assert_log_contains("test: ", invalids[i].needle, NULL);
    }
}

/* ---- wire-level rules: records crafted byte by byte ---- */

static void expect_refused(uint32_t type, const void *buf, uint32_t len, const char *needle)
{
    static _Alignas(16) uint8_t copy[1 << 16];
    memcpy(copy, buf, len);
    struct shm_msg d;
    tu_log_capture_begin();
    int rc = shm_msg_decode("events ring", type, copy, len, &d);
    tu_log_capture_end();
    if (rc != ERR_FORMAT)
        fail_msg("%s: got %s", needle, err_name(rc));
    tu_assert_log_contains("events ring: ", needle, NULL);
}

static void test_invalid_wire(void **state)
{
    (void)state;
    struct shm_msg m = generate();
    uint32_t len = encode(&m);
    static _Alignas(16) uint8_t w[4096];
    struct shm_wire_generate *g = (struct shm_wire_generate *)w;

    expect_refused(SHM_MSG_GENERATE, wire, 103, "generate record: 103 bytes, shorter than its 104-byte fixed part");
    expect_refused(SHM_MSG_GENERATE, wire, 0, "0 bytes, shorter");
    memcpy(w, wire, len);
    w[len] = 0;
    expect_refused(SHM_MSG_GENERATE, w, len + 1, "generate record (request 77): 138 bytes, but its fixed part and counts make 137");
    memcpy(w, wire, len);
    g->n_prompt_ids = 0xffffffffu; /* a count that would have us read 16 GiB */
    expect_refused(SHM_MSG_GENERATE, w, len, "but its fixed part and counts make 17179869301");
    memcpy(w, wire, len);
    g->logprobs = 22; /* 1 + 21 alternatives: one more than the ABI allows */
    expect_refused(SHM_MSG_GENERATE, w, len, "logprobs 22 exceeds 21 (1 + the alternatives)");
    memcpy(w, wire, len);
    g->priority = 0xdeadbeef;
    expect_refused(SHM_MSG_GENERATE, w, len, "priority 3735928559 is not a priority");
    /* the adapter name without its NUL, with an inner NUL */
    memcpy(w, wire, len);
    w[104 + 16 + 8] = 'x';
    expect_refused(SHM_MSG_GENERATE, w, len, "adapter of 9 bytes does not end with a NUL");
    memcpy(w, wire, len);
    w[104 + 16 + 3] = 0;
    expect_refused(SHM_MSG_GENERATE, w, len, "adapter holds a NUL byte at 3");
    /* stop strings section: count mismatches, an empty string, a missing NUL */
    memcpy(w, wire, len);
    g->n_stop = 1;
    expect_refused(SHM_MSG_GENERATE, w, len, "stop strings section holds more than n_stop = 1");
    memcpy(w, wire, len);
    g->n_stop = 3;
    expect_refused(SHM_MSG_GENERATE, w, len, "stop strings section holds 2 strings, n_stop says 3");
    memcpy(w, wire, len);
    g->n_stop = 0;
    expect_refused(SHM_MSG_GENERATE, w, len, "0 stop strings in 8 bytes");
    memcpy(w, wire, len);
    g->n_stop = 200;
    expect_refused(SHM_MSG_GENERATE, w, len, "200 stop strings, at most 16");
    memcpy(w, wire, len);
    w[len - 1] = '!';
    expect_refused(SHM_MSG_GENERATE, w, len, "stop strings section does not end with a NUL");
    memcpy(w, wire, len);
    w[104 + 16 + 9] = 0; /* "\0\n\0</s>\0": three strings, the first empty */
    g->n_stop = 3;
    expect_refused(SHM_MSG_GENERATE, w, len, "stop[0] must be 1..256 bytes, got none");
    /* a token id below zero on the wire */
    memcpy(w, wire, len);
    ((int32_t *)(w + 104))[2] = -7;
    expect_refused(SHM_MSG_GENERATE, w, len, "prompt_ids[2] is -7");

    /* fixed-size records: exact length */
    struct shm_wire_finish f = {.request_id = 1, .reason = 1};
    memcpy(w, &f, sizeof f);
    expect_refused(SHM_MSG_FINISH, w, sizeof f + 8, "64 bytes, but its fixed part and counts make 56");
    f.reason = 0;
    memcpy(w, &f, sizeof f);
    expect_refused(SHM_MSG_FINISH, w, sizeof f, "reason 0 is not a finish reason");
    struct shm_wire_hello h = {.request_id = 3, .vocab_size = 1, .context_length = 1};
    memcpy(w, &h, sizeof h);
    expect_refused(SHM_MSG_HELLO, w, sizeof h, "hello record: request_id 3, a hello answers no request");
    struct shm_wire_error e = {.request_id = 1, .code = -1, .message_len = 0};
    memcpy(w, &e, sizeof e);
    expect_refused(SHM_MSG_ERROR, w, sizeof e, "message is missing (length 0)");
    struct shm_wire_ids ws = {.request_id = 1, .n_ids = 1, .reserved = 9};
    memcpy(w, &ws, sizeof ws);
    expect_refused(SHM_MSG_TOKENS, w, sizeof ws + 4, "reserved field holds 9");
    struct shm_wire_token t = {.request_id = 1, .token = 1, .text_len = 5000};
    memcpy(w, &t, sizeof t);
    expect_refused(SHM_MSG_TOKEN, w, sizeof t + 4, "but its fixed part and counts make 5016");
    expect_refused(1000, w, 16, "record of type 1000: unknown record type");
    expect_refused(SHM_REC_PAD, w, 16, "record of type 1: unknown record type");
}

/* ---- over rings: direction and size ---- */

static void test_over_ring(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, 8192, 4096 - 16);
    p.prod.id = p.cons.id = SHM_RING_REQUESTS;
    struct shm_msg m = generate(), d;
    void *buf = aligned_alloc(16, 4096);
    assert_int_equal(shm_msg_send(&p.prod, &m), 0);
    assert_int_equal(shm_msg_recv(&p.cons, buf, 4096, &d), 0);
    assert_string_equal(d.generate.stop[1], "</s>");
    assert_int_equal(shm_msg_recv(&p.cons, buf, 4096, &d), -EAGAIN);

    /* an event on the requests ring: refused before it is written */
    struct shm_msg ev = {.type = SHM_MSG_DONE, .request_id = 1};
    tu_log_capture_begin();
    assert_int_equal(shm_msg_send(&p.prod, &ev), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("test ring: done record: travels on the events ring", NULL);
    /* too big for this ring's records */
    static int32_t many[2000];
    m.generate.prompt_ids = many;
    m.generate.n_prompt_ids = 2000;
    tu_log_capture_begin();
    assert_int_equal(shm_msg_send(&p.prod, &m), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("exceeds the ring's limit of 4080", NULL);
    assert_false(shm_ring_broken(&p.prod));

    /* a well-framed record that does not decode breaks the ring: the peer is not sane */
    struct shm_wire_id bad = {0};
    assert_int_equal(shm_ring_write(&p.prod, SHM_MSG_CANCEL, &bad, sizeof bad), 0);
    tu_log_capture_begin();
    assert_int_equal(shm_msg_recv(&p.cons, buf, 4096, &d), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("test ring: cancel record: request_id is 0", NULL);
    assert_true(shm_ring_broken(&p.cons) && shm_ring_broken(&p.prod));
    st_pair_fini(&p);

    /* a record of the other direction arriving */
    st_pair_init(&p, 8192, 4096 - 16);
    struct shm_wire_id ok = {.request_id = 5};
    assert_int_equal(shm_ring_write(&p.prod, SHM_MSG_DONE, &ok, sizeof ok), 0);
    tu_log_capture_begin();
    assert_int_equal(shm_msg_recv(&p.cons, buf, 4096, &d), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("done record: travels on the events ring, not this one", NULL);
    st_pair_fini(&p);

    /* send_wait: waits for room, then sends */
    st_pair_init(&p, 4096, 2032);
    struct shm_msg c = {.type = SHM_MSG_CANCEL, .request_id = 1};
    while (shm_msg_send(&p.prod, &c) == 0)
        ;
    assert_int_equal(shm_msg_send_wait(&p.prod, &c, 20 * 1000000), -ETIMEDOUT);
    assert_int_equal(shm_msg_recv(&p.cons, buf, 4096, &d), 0);
    assert_int_equal(shm_msg_send_wait(&p.prod, &c, 20 * 1000000), 0);
    st_pair_fini(&p);
    free(buf);

    assert_string_equal(shm_msg_type_name(SHM_MSG_ADAPTER_LOAD), "adapter-load");
    assert_null(shm_msg_type_name(SHM_REC_PAD));
    assert_int_equal(shm_msg_type_ring(SHM_MSG_STATS_QUERY), SHM_RING_REQUESTS);
    assert_int_equal(shm_msg_type_ring(SHM_MSG_HELLO), SHM_RING_EVENTS);
    assert_int_equal(shm_msg_type_ring(0), -1);
}


/* TOKEN with logprobs: round trip, and every way a worker could get it wrong refused */
static void test_token_logprobs(void **state)
{
    (void)state;
    struct shm_msg m = {.type = SHM_MSG_TOKEN,
                        .token = {.request_id = 9, .token = 42, .text = "ab", .text_len = 2,
                                  .has_logprob = true, .n_top = 2}};
    m.token.own = (struct shm_msg_logprob){42, -0.25f, " the", 4};
    m.token.top[0] = (struct shm_msg_logprob){42, -0.25f, " the", 4};
    m.token.top[1] = (struct shm_msg_logprob){7, -3.5f, NULL, 0};
    struct shm_msg d;
    roundtrip(&m, 16 + 2 + 3 * 12 + 4 + 4, &d);
    assert_true(d.token.has_logprob);
    assert_int_equal(d.token.n_top, 2);
    assert_true(d.token.own.logprob == -0.25f && d.token.own.id == 42);
    assert_memory_equal(d.token.own.piece, " the", 4);
    assert_true(d.token.top[1].id == 7 && d.token.top[1].logprob == -3.5f);
    /* the encoder refuses what the decoder would: */
    uint32_t len;
    struct shm_msg x = m;
    x.token.own.logprob = 0.5f;
    tu_log_capture_begin();
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("logprob of the token 0: 0.5 is outside [-9999, 0]", NULL);
    x = m, x.token.top[1].logprob = NAN;
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("alternative 1: nan is outside", NULL);
    x = m, x.token.top[1].logprob = -0.1f;
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("alternative 1 is more likely than the one before it", NULL);
    x = m, x.token.own.id = 41;
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("the logprob is of token 41, not 42", NULL);
    x = m, x.token.top[0].piece_len = SHM_MAX_LOGPROB_PIECE + 1;
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("a piece of 257 bytes exceeds 256", NULL);
    x = m, x.token.token = -1, x.token.own.id = -1;
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("a text-only piece carries a logprob", NULL);
    x = m, x.token.n_top = SHM_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(shm_msg_size("t", &x, &len), ERR_FORMAT);
    tu_assert_log_contains("21 logprob alternatives, at most 20", NULL);
    tu_log_capture_end();

    /* the wire: a count of alternatives without the flag, a section cut short, trailing bytes */
    len = encode(&m);
    static _Alignas(16) uint8_t w[4096];
    memcpy(w, wire, len);
    struct shm_wire_token *wt = (struct shm_wire_token *)w;
    wt->text_len &= ~SHM_TOKEN_LOGPROBS;
    expect_refused(SHM_MSG_TOKEN, w, len, "2 logprob alternatives without the logprob flag");
    memcpy(w, wire, len);
    expect_refused(SHM_MSG_TOKEN, w, len - 1, "but its fixed part and counts make at least");
    memcpy(w, wire, len);
    w[len] = 0;
    expect_refused(SHM_MSG_TOKEN, w, len + 1, "but its fixed part and counts make");
    memcpy(w, wire, len);
    wt->text_len = (wt->text_len & ~(SHM_TOKEN_TOP_MASK << SHM_TOKEN_TOP_SHIFT)) |
                   30u << SHM_TOKEN_TOP_SHIFT;
    expect_refused(SHM_MSG_TOKEN, w, len, "30 logprob alternatives, at most 20");
    memcpy(w, wire, len);
    /* the first entry's piece_len (after the 16-byte fixed part and the 2 text bytes) */
    uint32_t huge = 1u << 30;
    memcpy(w + 16 + 2 + 8, &huge, 4);
    expect_refused(SHM_MSG_TOKEN, w, len, "a piece of 1073741824 bytes exceeds 256");

    /* GENERATE carries the request: top_logprobs only with logprobs, at most 20 */
    struct shm_msg g = generate();
    g.generate.logprobs = true;
    g.generate.top_logprobs = 5;
    roundtrip(&g, 104 + 16 + 9 + 8, &d);
    assert_true(d.generate.logprobs && d.generate.top_logprobs == 5);
    tu_log_capture_begin();
    g.generate.top_logprobs = 21;
    assert_int_equal(shm_msg_size("t", &g, &len), ERR_FORMAT);
    tu_assert_log_contains("top_logprobs 21 exceeds 20", NULL);
    g.generate.logprobs = false, g.generate.top_logprobs = 2;
    assert_int_equal(shm_msg_size("t", &g, &len), ERR_FORMAT);
    tu_assert_log_contains("top_logprobs 2 without logprobs", NULL);
    tu_log_capture_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_requests),
        cmocka_unit_test(test_roundtrip_events),
        cmocka_unit_test(test_invalid_messages),
        cmocka_unit_test(test_invalid_wire),
        cmocka_unit_test(test_over_ring),
        cmocka_unit_test(test_token_logprobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
