/*
 * test_genreq.c — the request/response logic of the online commands (client/online/genreq.c):
 * batch JSON lines → GenerateRequest (every field, defaults from flags, each kind of bad
 * line with a message naming the key), command-line request flags, token id lists, and
 * Generate results → JSON (text pieces joined, token ids, usage, errors, invalid UTF-8).
 */
#include "testutil.h"

#include "err.h"
#include "genreq.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static genreq_t *from_json(const char *line, const genreq_t *defaults, char *err, size_t cap,
                           int *rc)
{
    genreq_t *r = NULL;
    *rc = genreq_from_json(line, strlen(line), defaults, &r, err, cap);
    return r;
}

static void test_json_every_field(void **state)
{
    (void)state;
    char err[512] = "";
    int rc;
    genreq_t *r = from_json(
        "{\"prompt\":\"Once upon\",\"model\":\"m\",\"add_bos\":false,\"adapter\":\"fr\","
        "\"adapter_scale\":0.5,\"max_tokens\":32,\"stop\":[\"\\n\",\"END\"],\"priority\":\"high\","
        "\"request_id\":\"r1\",\"temperature\":0,\"top_k\":40,\"top_p\":0.9,\"min_p\":0.05,"
        "\"repetition_penalty\":1.1,\"seed\":1234567890123}",
        NULL, err, sizeof err, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(r);
    assert_int_equal(r->input_case, CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT);
    assert_string_equal(r->prompt, "Once upon");
    assert_string_equal(r->model, "m");
    assert_true(r->has_add_bos && !r->add_bos);
    assert_string_equal(r->adapter, "fr");
    assert_true(r->has_adapter_scale && r->adapter_scale == 0.5f);
    assert_true(r->has_max_tokens && r->max_tokens == 32);
    assert_int_equal(r->n_stop, 2);
    assert_string_equal(r->stop[0], "\n");
    assert_string_equal(r->stop[1], "END");
    assert_true(r->has_priority && r->priority == CLOCHER__V1__PRIORITY__PRIORITY_HIGH);
    assert_string_equal(r->request_id, "r1");
    const Clocher__V1__SamplingParams *s = r->sampling;
    assert_true(s->has_temperature && s->temperature == 0.0f);
    assert_true(s->has_top_k && s->top_k == 40);
    assert_true(s->has_top_p && s->top_p == 0.9f);
    assert_true(s->has_min_p && s->min_p == 0.05f);
    assert_true(s->has_repetition_penalty && s->repetition_penalty == 1.1f);
    assert_true(s->has_seed && s->seed == 1234567890123ull);

    /* it survives the wire: pack, unpack, same fields */
    size_t n = protobuf_c_message_get_packed_size(&r->base);
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    protobuf_c_message_pack(&r->base, buf);
    Clocher__V1__GenerateRequest *u = clocher__v1__generate_request__unpack(NULL, n, buf);
    assert_non_null(u);
    assert_string_equal(u->prompt, "Once upon");
    assert_int_equal(u->sampling->top_k, 40);
    assert_int_equal(u->n_stop, 2);
    clocher__v1__generate_request__free_unpacked(u, NULL);
    free(buf);
    genreq_free(r);
}

static void test_json_ids_and_unset_fields(void **state)
{
    (void)state;
    char err[512];
    int rc;
    genreq_t *r = from_json(" {\"prompt_ids\": [1, 403, 407], \"stop\": \"x\"} ", NULL, err,
                            sizeof err, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(r->input_case, CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS);
    assert_int_equal(r->prompt_ids->n_ids, 3);
    assert_int_equal(r->prompt_ids->ids[2], 407);
    assert_int_equal(r->n_stop, 1);
    assert_string_equal(r->stop[0], "x");
    /* nothing else set: the daemon's defaults apply */
    assert_false(r->has_max_tokens);
    assert_false(r->has_add_bos);
    assert_null(r->adapter);
    assert_false(r->sampling->has_temperature);
    assert_false(r->sampling->has_seed);
    genreq_free(r);
}

static void test_json_over_defaults(void **state)
{
    (void)state;
    char err[256];
    genreq_t *d = genreq_new();
    assert_non_null(d);
    assert_int_equal(genreq_opt_set(d, GENREQ_OPT_BASE + GENREQ_MAX_TOKENS, "7", err, sizeof err), 1);
    assert_int_equal(genreq_opt_set(d, GENREQ_OPT_BASE + GENREQ_TEMPERATURE, "0", err, sizeof err), 1);
    assert_int_equal(genreq_opt_set(d, GENREQ_OPT_BASE + GENREQ_STOP, "a", err, sizeof err), 1);
    assert_int_equal(genreq_opt_set(d, GENREQ_OPT_BASE + GENREQ_ADAPTER, "base", err, sizeof err), 1);
    int rc;
    genreq_t *r = from_json("{\"prompt\":\"p\",\"max_tokens\":3,\"stop\":[\"b\",\"c\"]}", d, err,
                            sizeof err, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(r->max_tokens, 3);           /* the line wins */
    assert_true(r->sampling->has_temperature);    /* the default stays */
    assert_string_equal(r->adapter, "base");
    assert_int_equal(r->n_stop, 2);               /* a line's stop replaces the default's */
    assert_string_equal(r->stop[0], "b");
    genreq_free(r);
    /* the defaults are untouched */
    assert_int_equal(d->max_tokens, 7);
    assert_int_equal(d->n_stop, 1);
    genreq_free(d);
}

static void expect_bad(const char *line, int want_rc, const char *needle)
{
    char err[512] = "";
    int rc;
    genreq_t *r = from_json(line, NULL, err, sizeof err, &rc);
    if (rc != want_rc || !strstr(err, needle))
        fail_msg("line %s: rc %d (want %d), message \"%s\" (want \"%s\")", line, rc, want_rc,
                 err, needle);
    assert_null(r);
}

static void test_json_bad_lines(void **state)
{
    (void)state;
    expect_bad("{\"prompt\":", ERR_FORMAT, "not JSON");
    expect_bad("[1,2]", ERR_FORMAT, "expected a JSON object");
    expect_bad("{\"prompt\":\"x\",\"temprature\":1}", ERR_FORMAT, "unknown key \"temprature\"");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":\"5\"}", ERR_FORMAT, "max_tokens: expected an integer");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":-1}", ERR_RANGE, "max_tokens");
    expect_bad("{\"prompt\":\"x\",\"max_tokens\":4294967296}", ERR_RANGE, "max_tokens");
    expect_bad("{\"prompt\":\"x\",\"top_p\":\"high\"}", ERR_FORMAT, "top_p: expected a number");
    expect_bad("{\"prompt\":\"x\",\"add_bos\":1}", ERR_FORMAT, "add_bos: expected true or false");
    expect_bad("{\"prompt\":\"x\",\"priority\":\"urgent\"}", ERR_FORMAT, "priority");
    expect_bad("{\"prompt\":\"x\",\"stop\":[1]}", ERR_FORMAT, "stop[0]");
    expect_bad("{\"prompt\":5}", ERR_FORMAT, "prompt: expected a string");
    expect_bad("{\"prompt_ids\":[1,-2]}", ERR_FORMAT, "prompt_ids[1]");
    expect_bad("{\"prompt_ids\":[]}", ERR_FORMAT, "prompt_ids");
    expect_bad("{\"prompt_ids\":[1],\"prompt\":\"x\"}", ERR_FORMAT, "give one of them");
    expect_bad("{\"max_tokens\":5}", ERR_FORMAT, "no prompt");
    expect_bad("{\"prompt\":\"a\",\"prompt\":\"b\"}", ERR_FORMAT, "not JSON");
}

static void test_flags(void **state)
{
    (void)state;
    char err[256];
    genreq_t *r = genreq_new();
    struct {
        int f;
        const char *arg;
        int want;
        const char *needle;
    } cases[] = {
        {GENREQ_TOP_K, "40", 1, NULL},
        {GENREQ_TOP_K, "-1", ERR_USAGE, "--top-k"},
        {GENREQ_TOP_K, "4294967296", ERR_USAGE, "--top-k"},
        {GENREQ_TOP_P, "0.95", 1, NULL},
        {GENREQ_TOP_P, "x", ERR_USAGE, "--top-p: expected a number, got 'x'"},
        {GENREQ_TEMPERATURE, "inf", ERR_USAGE, "--temperature"},
        {GENREQ_TEMPERATURE, "-1", 1, NULL}, /* the daemon judges ranges, naming the field */
        {GENREQ_SEED, "18446744073709551615", 1, NULL},
        {GENREQ_SEED, "18446744073709551616", ERR_USAGE, "--seed"},
        {GENREQ_MAX_TOKENS, "12", 1, NULL},
        {GENREQ_PRIORITY, "low", 1, NULL},
        {GENREQ_PRIORITY, "soon", ERR_USAGE, "--priority"},
        {GENREQ_NO_BOS, NULL, 1, NULL},
        {GENREQ_STOP, "a", 1, NULL},
        {GENREQ_STOP, "b", 1, NULL},
        {GENREQ_PROMPT_IDS, "1, 2 3", 1, NULL},
        {GENREQ_PROMPT_IDS, "1 two", ERR_USAGE, "--prompt-ids: 'two' is not a token id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        int rc = genreq_opt_set(r, GENREQ_OPT_BASE + cases[i].f, cases[i].arg, err, sizeof err);
        if (rc != cases[i].want || (cases[i].needle && !strstr(err, cases[i].needle)))
            fail_msg("case %zu (%s): rc %d, message \"%s\"", i, cases[i].arg ? cases[i].arg : "",
                     rc, err);
    }
    assert_int_equal(genreq_opt_set(r, 'x', "1", err, sizeof err), 0); /* not a request flag */
    assert_int_equal(r->sampling->top_k, 40);
    assert_true(r->sampling->top_p == 0.95f);
    assert_int_equal(r->sampling->seed, UINT64_MAX);
    assert_int_equal(r->priority, CLOCHER__V1__PRIORITY__PRIORITY_LOW);
    assert_true(r->has_add_bos && !r->add_bos);
    assert_int_equal(r->n_stop, 2);
    assert_int_equal(r->prompt_ids->n_ids, 3);
    /* a text prompt replaces the ids */
    assert_int_equal(genreq_set_prompt(r, "hello", 5), 0);
    assert_int_equal(r->input_case, CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT);
    genreq_t *c = genreq_copy(r);
    assert_non_null(c);
    assert_string_equal(c->prompt, "hello");
    assert_int_equal(c->n_stop, 2);
    genreq_free(c);
    genreq_free(r);
}

static void test_parse_ids(void **state)
{
    (void)state;
    char err[128];
    int32_t *ids;
    size_t n;
    assert_int_equal(genreq_parse_ids(" 1,2\t3\n", &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[2], 3);
    free(ids);
    assert_int_equal(genreq_parse_ids("2147483647", &ids, &n, err, sizeof err), 0);
    free(ids);
    assert_int_equal(genreq_parse_ids("", &ids, &n, err, sizeof err), ERR_FORMAT);
    assert_int_equal(genreq_parse_ids(" , ", &ids, &n, err, sizeof err), ERR_FORMAT);
    assert_int_equal(genreq_parse_ids("-1", &ids, &n, err, sizeof err), ERR_FORMAT);
    assert_int_equal(genreq_parse_ids("2147483648", &ids, &n, err, sizeof err), ERR_FORMAT);
    assert_int_equal(genreq_parse_ids("12x", &ids, &n, err, sizeof err), ERR_FORMAT);
    assert_non_null(strstr(err, "12x"));
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("not JSON: %s (%s)", s, e.text);
    return j;
}

static void test_result_json(void **state)
{
    (void)state;
    struct genreq_result r;
    genreq_result_init(&r);
    int32_t a[] = {5, 6}, b[] = {7};
    Clocher__V1__GenerateResponse m1 = CLOCHER__V1__GENERATE_RESPONSE__INIT;
    m1.n_token_ids = 2;
    m1.token_ids = a;
    m1.text = "Once";
    Clocher__V1__GenerateResponse m2 = CLOCHER__V1__GENERATE_RESPONSE__INIT;
    Clocher__V1__Usage u = CLOCHER__V1__USAGE__INIT;
    Clocher__V1__Timings t = CLOCHER__V1__TIMINGS__INIT;
    u.prompt_tokens = 3;
    u.completion_tokens = 3;
    t.ttft_ms = 1.5;
    m2.n_token_ids = 1;
    m2.token_ids = b;
    m2.text = " upon \xc3\xa9";
    m2.has_finish_reason = true;
    m2.finish_reason = CLOCHER__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    m2.usage = &u;
    m2.timings = &t;
    assert_int_equal(genreq_result_add(&r, &m1), 0);
    assert_int_equal(genreq_result_add(&r, &m2), 0);
    char *s = genreq_result_json(&r, 4);
    json_t *j = parse(s);
    assert_int_equal(json_integer_value(json_object_get(j, "index")), 4);
    assert_string_equal(json_string_value(json_object_get(j, "text")), "Once upon \xc3\xa9");
    json_t *ids = json_object_get(j, "token_ids");
    assert_int_equal(json_array_size(ids), 3);
    assert_int_equal(json_integer_value(json_array_get(ids, 2)), 7);
    assert_string_equal(json_string_value(json_object_get(j, "finish_reason")), "length");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 3);
    assert_true(json_real_value(json_object_get(json_object_get(j, "timings"), "ttft_ms")) == 1.5);
    json_decref(j);
    free(s);

    /* no index; bytes that are not UTF-8 become U+FFFD instead of breaking the line */
    genreq_result_fini(&r);
    genreq_result_init(&r);
    Clocher__V1__GenerateResponse m3 = CLOCHER__V1__GENERATE_RESPONSE__INIT;
    m3.text = "a\xff" "b\xc3";
    assert_int_equal(genreq_result_add(&r, &m3), 0);
    s = genreq_result_json(&r, -1);
    j = parse(s);
    assert_null(json_object_get(j, "index"));
    assert_string_equal(json_string_value(json_object_get(j, "text")),
                        "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    assert_string_equal(json_string_value(json_object_get(j, "finish_reason")), "unspecified");
    json_decref(j);
    free(s);

    /* an error replaces the result */
    assert_int_equal(genreq_result_set_error(&r, 5, "adapter fr: not found"), 0);
    s = genreq_result_json(&r, 0);
    j = parse(s);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "NOT_FOUND");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "adapter fr: not found");
    assert_null(json_object_get(j, "text"));
    json_decref(j);
    free(s);
    genreq_result_fini(&r);

    assert_string_equal(genreq_status_name(16), "UNAUTHENTICATED");
    assert_string_equal(genreq_status_name(99), "CODE_99");
    assert_string_equal(genreq_finish_name(CLOCHER__V1__FINISH_REASON__FINISH_REASON_EOS), "eos");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_every_field),
        cmocka_unit_test(test_json_ids_and_unset_fields),
        cmocka_unit_test(test_json_over_defaults),
        cmocka_unit_test(test_json_bad_lines),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_parse_ids),
        cmocka_unit_test(test_result_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
