/*
 * test_serve.c — the worker's serving loop (worker/process/serve.c) with the real engine, driven over a
 * real shm region from the gateway's side, in one process: serve_run() runs in a thread on the
 * worker end; the test writes request records and reads event records like the gateway does.
 *
 *  - HELLO describes the model;
 *  - greedy generation on stories260K reproduces llama2.c's golden continuation, token by token;
 *  - CANCEL ends a generation with FINISH CANCELLED; STATS answers;
 *  - bad requests get one ERROR naming what is wrong: a prompt over the limit, a token outside
 *    the vocabulary, a text prompt on a model without tokenizer, an adapter that does not load;
 *  - TOKENIZE / DETOKENIZE round trip on a model with a tokenizer (clocher synth --preset demo);
 *  - stop: in-flight requests end CANCELLED and serve_run returns 0;
 *  - a record the worker cannot decode breaks the ring and ends serve_run with an error.
 */
#include "testutil.h"

#include "err.h"
#include "llama2c.h"
#include "log.h"
#include "msg.h"
#include "region.h"
#include "serve.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char *g_tmp;
static char g_stories[4096], g_demo[4200];

static int setup(void **state)
{
    (void)state;
    g_tmp = tu_mkdtemp();
    snprintf(g_stories, sizeof g_stories, "%s/stories", g_tmp);
    if (llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, g_stories, DT_F32,
                        NULL) != 0)
        fail_msg("llama2c_convert: %s", log_last_error());
    /* a model with a tokenizer: the synthesized demo Llama, converted */
    char cmd[16384];
    snprintf(g_demo, sizeof g_demo, "%s/demo-ie", g_tmp);
    snprintf(cmd, sizeof cmd, "%s synth --preset demo %s/demo >/dev/null 2>&1 && %s convert %s/demo %s >/dev/null 2>&1",
             tu_build_path("client/clocher"), g_tmp, tu_build_path("client/clocher"), g_tmp,
             g_demo);
    if (tu_run(cmd, NULL) != 0)
        fail_msg("clocher synth/convert failed: %s", cmd);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

/* ---- a worker in a thread, the gateway side in the test ---- */

struct rig {
    struct shm_region *gw, *wk;
    struct serve *sv;
    pthread_t th;
    volatile sig_atomic_t stop;
    int run_rc;
    void *buf;
    size_t cap;
};

static void *run(void *arg)
{
    struct rig *r = arg;
    r->run_rc = serve_run(r->sv);
    return NULL;
}

static int rig_open(struct rig *r, const char *model, uint32_t max_prompt, const char **names,
                    const char **dirs, size_t n_adapters)
{
    memset(r, 0, sizeof *r);
    assert_int_equal(shm_region_create(1, 64 * 1024, &r->gw), 0);
    assert_int_equal(shm_region_attach(shm_region_fd(r->gw), 1, &r->wk), 0);
    shm_region_set_stale_ns(r->wk, 0);
    struct serve_options o = {.model_dir = model, .threads = 1, .kv_budget_bytes = 16u << 20,
                              .max_queue = 64, .max_prompt_tokens = max_prompt,
                              .n_adapters = n_adapters, .adapter_names = names,
                              .adapter_dirs = dirs, .mem_node = -1, .control_fd = -1,
                              .stop = &r->stop};
    int rc = serve_open(&o, r->wk, &r->sv);
    if (rc < 0) {
        shm_region_close(r->wk);
        shm_region_close(r->gw);
        return rc;
    }
    r->cap = (shm_region_max_record(r->gw) + 7u) & ~(size_t)7;
    r->buf = malloc(r->cap);
    assert_int_equal(pthread_create(&r->th, NULL, run, r), 0);
    return 0;
}

static int rig_close(struct rig *r)
{
    r->stop = 1;
    pthread_join(r->th, NULL);
    serve_close(r->sv);
    shm_region_close(r->wk);
    shm_region_close(r->gw);
    free(r->buf);
    return r->run_rc;
}

static void send_msg(struct rig *r, const struct shm_msg *m)
{
    assert_int_equal(shm_msg_send_wait(shm_region_tx(r->gw), m, 5000000000ll), 0);
}

/* The next event (within 20 s). */
static void recv_msg(struct rig *r, struct shm_msg *m)
{
    struct shm_ring *rx = shm_region_rx(r->gw);
    for (int i = 0; i < 200; i++) {
        int rc = shm_msg_recv(rx, r->buf, r->cap, m);
        if (rc == 0)
            return;
        assert_int_equal(rc, -EAGAIN);
        rc = shm_ring_wait_readable(rx, 100000000ll);
        assert_true(rc == 0 || rc == -ETIMEDOUT || rc == -EINTR);
    }
    fail_msg("no event from the worker within 20 s");
}

static void expect_error(struct rig *r, uint64_t id, int code, const char *needle)
{
    struct shm_msg m;
    recv_msg(r, &m);
    if (m.type != SHM_MSG_ERROR)
        fail_msg("want ERROR for request %llu, got %s", (unsigned long long)id,
                 shm_msg_type_name(m.type));
    assert_int_equal(m.error.request_id, id);
    assert_int_equal(m.error.code, code);
    if (!strstr(m.error.message, needle))
        fail_msg("ERROR message \"%s\" does not mention \"%s\"", m.error.message, needle);
}

static struct shm_msg gen(uint64_t id, const int32_t *ids, uint32_t n, uint32_t max_tokens)
{
    return (struct shm_msg){.type = SHM_MSG_GENERATE,
                            .generate = {.request_id = id, .tenant_id = 1, .temperature = 0,
                                         .top_p = 1, .min_p = 0, .repeat_penalty = 1,
                                         .adapter_scale = 1, .max_tokens = max_tokens,
                                         .priority = SHM_PRIO_NORMAL, .prompt_ids = ids,
                                         .n_prompt_ids = n}};
}

/* ---- tests ---- */

static void test_hello_and_golden(void **state)
{
    (void)state;
    struct rig r;
    assert_int_equal(rig_open(&r, g_stories, 4096, NULL, NULL, 0), 0);
    struct shm_msg m;
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_HELLO);
    assert_int_equal(m.hello.vocab_size, 512);
    assert_int_equal(m.hello.context_length, 512);
    assert_string_equal(m.hello.arch, "llama");
    assert_string_equal(m.hello.dtype, "f32");
    assert_true(m.hello.parameters > 200000 && m.hello.parameters < 400000);

    /* the golden case with a 10-token prompt: greedy ids up to the first low-margin step */
    json_error_t je;
    json_t *g = json_load_file(tu_fixture("stories260K/golden.json"), 0, &je);
    assert_non_null(g);
    json_t *c = json_array_get(json_object_get(g, "cases"), 1);
    json_t *prompt = json_object_get(c, "prompt"), *greedy = json_object_get(c, "greedy");
    json_t *margin = json_object_get(c, "greedy_margin");
    uint32_t n = (uint32_t)json_array_size(prompt);
    int32_t ids[512];
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(prompt, i));
    uint32_t want = 0;
    while (want < 40 && json_real_value(json_array_get(margin, want)) >= 0.01)
        want++;
    assert_true(want >= 5);
    struct shm_msg req = gen(7, ids, n, want);
    send_msg(&r, &req);
    for (uint32_t i = 0; i < want; i++) {
        recv_msg(&r, &m);
        if (m.type != SHM_MSG_TOKEN)
            fail_msg("step %u: want TOKEN, got %s (%s)", i, shm_msg_type_name(m.type),
                     m.type == SHM_MSG_ERROR ? m.error.message : "");
        assert_int_equal(m.token.request_id, 7);
        assert_int_equal(m.token.token, json_integer_value(json_array_get(greedy, i)));
    }
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_FINISH);
    assert_int_equal(m.finish.request_id, 7);
    assert_int_equal(m.finish.reason, SHM_FINISH_LENGTH);
    assert_int_equal(m.finish.prompt_tokens, n);
    assert_int_equal(m.finish.completion_tokens, want);
    json_decref(g);

    /* STATS */
    struct shm_msg q = {.type = SHM_MSG_STATS_QUERY, .request_id = 8};
    send_msg(&r, &q);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_STATS);
    assert_int_equal(m.stats.request_id, 8);
    assert_true(m.stats.requests_finished >= 1);
    assert_true(m.stats.rss_bytes > 0);
    assert_int_equal(rig_close(&r), 0);
}

static void test_bad_requests(void **state)
{
    (void)state;
    struct rig r;
    assert_int_equal(rig_open(&r, g_stories, 8, NULL, NULL, 0), 0);
    struct shm_msg m;
    recv_msg(&r, &m); /* HELLO */
    int32_t ids[16] = {1, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    struct shm_msg req = gen(11, ids, 10, 4);
    send_msg(&r, &req);
    expect_error(&r, 11, ERR_RANGE, "prompt: 10 tokens, the limit is 8");
    ids[1] = 600;
    req = gen(12, ids, 3, 4);
    send_msg(&r, &req);
    expect_error(&r, 12, ERR_RANGE, "prompt: token 1 is 600, the vocabulary has 512");
    req = gen(13, NULL, 0, 4);
    req.generate.prompt_text = "Once upon";
    req.generate.prompt_text_len = 9;
    send_msg(&r, &req);
    expect_error(&r, 13, ERR_UNSUPPORTED, "no tokenizer");
    struct shm_msg tk = {.type = SHM_MSG_TOKENIZE,
                         .tokenize = {.request_id = 14, .text = "x", .text_len = 1}};
    send_msg(&r, &tk);
    expect_error(&r, 14, ERR_UNSUPPORTED, "no tokenizer");
    struct shm_msg al = {.type = SHM_MSG_ADAPTER_LOAD,
                         .adapter_load = {.request_id = 15, .name = "nope",
                                          .path = "/nonexistent/adapter"}};
    send_msg(&r, &al);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_ERROR);
    assert_int_equal(m.error.request_id, 15);
    assert_non_null(strstr(m.error.message, "adapter nope"));
    /* a CANCEL for an id nobody knows is ignored; the loop goes on */
    struct shm_msg cn = {.type = SHM_MSG_CANCEL, .request_id = 999};
    send_msg(&r, &cn);
    struct shm_msg q = {.type = SHM_MSG_STATS_QUERY, .request_id = 16};
    send_msg(&r, &q);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_STATS);
    assert_int_equal(rig_close(&r), 0);
}

static void test_cancel_and_stop(void **state)
{
    (void)state;
    struct rig r;
    assert_int_equal(rig_open(&r, g_stories, 4096, NULL, NULL, 0), 0);
    struct shm_msg m;
    recv_msg(&r, &m); /* HELLO */
    int32_t ids[] = {1, 400, 401};
    struct shm_msg req = gen(21, ids, 3, 400);
    send_msg(&r, &req);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_TOKEN);
    struct shm_msg cn = {.type = SHM_MSG_CANCEL, .request_id = 21};
    send_msg(&r, &cn);
    uint32_t tokens = 1;
    for (;;) {
        recv_msg(&r, &m);
        if (m.type != SHM_MSG_TOKEN)
            break;
        tokens++;
    }
    assert_int_equal(m.type, SHM_MSG_FINISH);
    assert_int_equal(m.finish.reason, SHM_FINISH_CANCELLED);
    assert_true(tokens < 400);

    /* stop with a request in flight: it ends CANCELLED, serve_run returns 0 */
    req = gen(22, ids, 3, 400);
    send_msg(&r, &req);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_TOKEN);
    r.stop = 1;
    for (;;) {
        recv_msg(&r, &m);
        if (m.type != SHM_MSG_TOKEN)
            break;
    }
    assert_int_equal(m.type, SHM_MSG_FINISH);
    assert_int_equal(m.finish.request_id, 22);
    assert_int_equal(m.finish.reason, SHM_FINISH_CANCELLED);
    assert_int_equal(rig_close(&r), 0);
}

static void test_tokenizer(void **state)
{
    (void)state;
    struct rig r;
    assert_int_equal(rig_open(&r, g_demo, 4096, NULL, NULL, 0), 0);
    struct shm_msg m;
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_HELLO);
    assert_string_equal(m.hello.name, "demo");
    static const char text[] = "Hello world, once upon a time.";
    struct shm_msg tk = {.type = SHM_MSG_TOKENIZE,
                         .tokenize = {.request_id = 31, .text = text,
                                      .text_len = (uint32_t)strlen(text)}};
    send_msg(&r, &tk);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_TOKENS);
    assert_int_equal(m.ids.request_id, 31);
    assert_true(m.ids.n_ids > 0);
    int32_t ids[256];
    uint32_t n = m.ids.n_ids;
    memcpy(ids, m.ids.ids, n * sizeof *ids);
    struct shm_msg dt = {.type = SHM_MSG_DETOKENIZE,
                         .ids = {.request_id = 32, .ids = ids, .n_ids = n}};
    send_msg(&r, &dt);
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_TEXT);
    assert_int_equal(m.text.request_id, 32);
    assert_int_equal(m.text.text_len, strlen(text));
    assert_memory_equal(m.text.text, text, strlen(text));

    /* a text prompt is tokenized by the worker: the generation runs */
    struct shm_msg req = gen(33, NULL, 0, 3);
    req.generate.prompt_text = text;
    req.generate.prompt_text_len = (uint32_t)strlen(text);
    req.generate.flags = SHM_GEN_ADD_BOS;
    send_msg(&r, &req);
    for (int i = 0; i < 3; i++) {
        recv_msg(&r, &m);
        assert_int_equal(m.type, SHM_MSG_TOKEN);
    }
    recv_msg(&r, &m);
    assert_int_equal(m.type, SHM_MSG_FINISH);
    assert_int_equal(m.finish.prompt_tokens, n + 1); /* + BOS */
    assert_int_equal(rig_close(&r), 0);
}

static void test_bad_adapter_at_start(void **state)
{
    (void)state;
    struct rig r;
    const char *names[] = {"sql"}, *dirs[] = {"/nonexistent/peft"};
    tu_log_capture_begin();
    int rc = rig_open(&r, g_stories, 4096, names, dirs, 1);
    tu_log_capture_end();
    assert_true(rc < 0);
    tu_assert_log_contains("adapter sql (/nonexistent/peft) does not load", NULL);
}

static void test_corrupt_record(void **state)
{
    (void)state;
    struct rig r;
    assert_int_equal(rig_open(&r, g_stories, 4096, NULL, NULL, 0), 0);
    struct shm_msg m;
    recv_msg(&r, &m); /* HELLO */
    /* a GENERATE whose length does not match its counts: the worker must give up the ring */
    uint8_t junk[40] = {0};
    tu_log_capture_begin();
    assert_int_equal(shm_ring_write(shm_region_tx(r.gw), SHM_MSG_GENERATE, junk, sizeof junk), 0);
    pthread_join(r.th, NULL);
    tu_log_capture_end();
    assert_true(r.run_rc < 0);
    tu_assert_log_contains("requests ring failed", NULL);
    r.th = pthread_self();
    serve_close(r.sv);
    shm_region_close(r.wk);
    shm_region_close(r.gw);
    free(r.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_and_golden), cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_cancel_and_stop),  cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_bad_adapter_at_start), cmocka_unit_test(test_corrupt_record),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
