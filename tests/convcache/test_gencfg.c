/*
 * test_gencfg.c — the model's sampling defaults (daemon/gencfg.h): chat.ie.json's "sampling"
 * read with every bad value refused naming the file and the field, and applied by
 * gw_req_generate field by field with the precedence request > model > server default.
 */
#include "testutil.h"

#include "config.h"
#include "err.h"
#include "gencfg.h"
#include "gw_req.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void write_meta(const char *dir, const char *json)
{
    tu_write_file(tu_path(dir, GENCFG_FILE), json, strlen(json));
}

static void test_load(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct config_model_sampling m;
    /* no chat.ie.json (a llama2.c conversion): no defaults, no error */
    assert_int_equal(gencfg_load(dir, &m), 0);
    assert_false(m.has_temperature || m.has_top_p || m.has_top_k || m.has_repetition_penalty);
    /* no "sampling" key */
    write_meta(dir, "{\"eos_token_ids\": [2]}");
    assert_int_equal(gencfg_load(dir, &m), 0);
    assert_false(m.has_temperature || m.has_top_p || m.has_top_k || m.has_repetition_penalty);
    /* Llama 3.1's generation_config: temperature and top_p only */
    write_meta(dir, "{\"sampling\": {\"temperature\": 0.6, \"top_p\": 0.9}}");
    assert_int_equal(gencfg_load(dir, &m), 0);
    assert_true(m.has_temperature && m.has_top_p);
    assert_false(m.has_top_k || m.has_repetition_penalty);
    assert_true(m.temperature == 0.6f && m.top_p == 0.9f);
    write_meta(dir, "{\"sampling\": {\"temperature\": 0, \"top_k\": 20, "
                    "\"repetition_penalty\": 1.05}}");
    assert_int_equal(gencfg_load(dir, &m), 0);
    assert_true(m.has_temperature && m.temperature == 0.0f);
    assert_true(m.has_top_k && m.top_k == 20);
    assert_true(m.has_repetition_penalty && m.repetition_penalty == 1.05f);
    tu_rmtree(dir);
    free(dir);
}

static void test_load_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *json, *words;
        int rc;
    } bad[] = {
        {"{\"sampling\": ", "line 1", ERR_FORMAT},
        {"{\"sampling\": 3}", "sampling: must be an object", ERR_FORMAT},
        {"{\"sampling\": {\"temperature\": \"hot\"}}", "sampling.temperature: must be a number",
         ERR_FORMAT},
        {"{\"sampling\": {\"temperature\": -1}}", "sampling.temperature: -1 is outside [0, 1e+06]",
         ERR_RANGE},
        {"{\"sampling\": {\"top_p\": 0}}", "sampling.top_p: 0 is outside (0, 1]", ERR_RANGE},
        {"{\"sampling\": {\"top_p\": 1.5}}", "sampling.top_p: 1.5 is outside (0, 1]", ERR_RANGE},
        /* 0 as the float the sampler gets */
        {"{\"sampling\": {\"top_p\": 1e-50}}", "sampling.top_p: 0 is outside (0, 1]", ERR_RANGE},
        {"{\"sampling\": {\"temperature\": 1e300}}", "sampling.temperature: inf is outside",
         ERR_RANGE},
        {"{\"sampling\": {\"top_k\": 2.5}}", "sampling.top_k: 2.5 is not an integer", ERR_FORMAT},
        {"{\"sampling\": {\"top_k\": -3}}", "sampling.top_k: -3 is outside", ERR_RANGE},
        {"{\"sampling\": {\"repetition_penalty\": 0}}", "sampling.repetition_penalty: 0 is outside",
         ERR_RANGE},
    };
    char *dir = tu_mkdtemp();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct config_model_sampling m;
        write_meta(dir, bad[i].json);
        tu_log_capture_begin();
        assert_int_equal(gencfg_load(dir, &m), bad[i].rc);
        tu_assert_log_contains(GENCFG_FILE, bad[i].words, NULL);
        tu_log_capture_end();
        /* nothing half-read is kept */
        assert_false(m.has_temperature || m.has_top_p || m.has_top_k || m.has_repetition_penalty);
    }
    tu_rmtree(dir);
    free(dir);
}

/* chat.ie.json is written by the converter but read from a folder anyone may hand over: every
 * mutation of a good file is either read (values within range) or refused, never a crash
 * (under ASan in CI); a cheap fuzz in-process, beside tests/fuzz's harnesses */
static void test_mutations(void **state)
{
    (void)state;
    static const char good[] = "{\"chat_template\": \"x\", \"sampling\": {\"temperature\": "
                               "0.6, \"top_p\": 0.9, \"top_k\": 40, \"repetition_penalty\": "
                               "1.1}}";
    char *dir = tu_mkdtemp();
    uint8_t noise[4096];
    tu_fill_bytes(noise, sizeof noise, 0x9e3779b9u);
    tu_log_capture_begin();
    for (int i = 0; i < 1000; i++) {
        char buf[sizeof good];
        memcpy(buf, good, sizeof good);
        size_t n = sizeof good - 1;
        for (int k = 0; k < 1 + i % 4; k++) {
            size_t at = noise[(i * 4 + k) % sizeof noise] % n;
            buf[at] = (char)noise[(i * 4 + k + 7) % sizeof noise];
        }
        tu_write_file(tu_path(dir, GENCFG_FILE), buf, n);
        struct config_model_sampling m;
        int rc = gencfg_load(dir, &m);
        assert_true(rc == 0 || rc == ERR_FORMAT || rc == ERR_RANGE);
        if (rc == 0) {
            assert_true(!m.has_temperature || (m.temperature >= 0 && m.temperature <= 1e6f));
            assert_true(!m.has_top_p || (m.top_p > 0 && m.top_p <= 1));
            assert_true(!m.has_repetition_penalty || m.repetition_penalty > 0);
        }
    }
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* gw_req_generate on a text prompt with the given sampling (NULL = none) and model defaults */
static struct shm_msg_generate run(const struct config_model_sampling *m,
                                   const Clocher__V1__SamplingParams *s)
{
    struct config *c;
    assert_int_equal(config_parse("t", "/", "{}", 2, "/m", &c), 0);
    c->model_sampling = *m;
    Clocher__V1__GenerateRequest r = CLOCHER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT;
    r.prompt = (char *)"hello";
    r.sampling = (Clocher__V1__SamplingParams *)s;
    struct gw_req_ctx ctx = {.cfg = c, .seed = 7};
    struct shm_msg_generate out;
    char why[256];
    assert_int_equal(gw_req_generate(&r, &ctx, &out, why, sizeof why), 0);
    config_unref(c);
    return out;
}

static void test_precedence(void **state)
{
    (void)state;
    struct config_model_sampling none = {0};
    struct config_model_sampling llama = {.has_temperature = true, .temperature = 0.6f,
                                          .has_top_p = true, .top_p = 0.9f,
                                          .has_top_k = true, .top_k = 40,
                                          .has_repetition_penalty = true,
                                          .repetition_penalty = 1.1f};
    /* server defaults when neither the request nor the model says */
    struct shm_msg_generate g = run(&none, NULL);
    assert_true(g.temperature == GW_REQ_DEFAULT_TEMPERATURE && g.top_p == 1.0f && g.top_k == 0 &&
                g.repeat_penalty == 1.0f);
    /* the model's where the request is silent (no sampling message at all) */
    g = run(&llama, NULL);
    assert_true(g.temperature == 0.6f && g.top_p == 0.9f && g.top_k == 40 &&
                g.repeat_penalty == 1.1f);
    /* a sampling message that sets some fields: those win, field by field */
    Clocher__V1__SamplingParams s = CLOCHER__V1__SAMPLING_PARAMS__INIT;
    s.has_temperature = true;
    s.temperature = 0.0f; /* greedy, explicitly: not "unset" */
    s.has_top_k = true;
    s.top_k = 0;
    g = run(&llama, &s);
    assert_true(g.temperature == 0.0f && g.top_k == 0);
    assert_true(g.top_p == 0.9f && g.repeat_penalty == 1.1f);
    /* a model that sets only temperature leaves the others at the server's defaults */
    struct config_model_sampling t_only = {.has_temperature = true, .temperature = 0.3f};
    g = run(&t_only, NULL);
    assert_true(g.temperature == 0.3f && g.top_p == 1.0f && g.top_k == 0 &&
                g.repeat_penalty == 1.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_load_refusals),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_precedence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
