/*
 * test_gw_req.c — the gateway's pure parts: API keys to tenants (plain and sha256: keys, bad
 * headers), per-tenant stream counters, and GenerateRequest checks (defaults, every refusal
 * with its status and the field it names, worker error codes to gRPC statuses).
 */
#include "testutil.h"

#include "auth.h"
#include "config.h"
#include "err.h"
#include "gw_req.h"

#include <errno.h>
#include <grpc/status.h>
#include <openssl/sha.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* sha256("secret-key-42") */
static const char CFG[] =
    "{\"model_dir\": \"/m\", \"limits\": {\"max_tokens\": 100, \"max_prompt_tokens\": 8},"
    " \"tenants\": ["
    "  {\"name\": \"alice\", \"api_keys\": [\"alice-key-0001\"], \"allowed_adapters\": \"*\"},"
    "  {\"name\": \"bob\", \"api_keys\": [\"sha256:%s\"], \"allowed_adapters\": [\"a0\"],"
    "   \"max_concurrent_streams\": 2}]}";

static struct config *g_cfg;

static int setup(void **state)
{
    (void)state;
    unsigned char d[32];
    SHA256((const unsigned char *)"secret-key-42", 13, d);
    char hex[65], json[1024];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(json, sizeof json, CFG, hex);
    return config_parse("t.json", "/etc", json, strlen(json), NULL, &g_cfg);
}

static int teardown(void **state)
{
    (void)state;
    config_unref(g_cfg);
    return 0;
}

static int who(const char *hdr, const char **name)
{
    const struct config_tenant *t = NULL;
    int rc = auth_tenant(g_cfg, hdr, hdr ? strlen(hdr) : 0, &t);
    *name = t ? t->name : NULL;
    return rc;
}

static void test_auth(void **state)
{
    (void)state;
    const char *n;
    assert_int_equal(who("Bearer alice-key-0001", &n), 0);
    assert_string_equal(n, "alice");
    assert_int_equal(who("bearer  secret-key-42 ", &n), 0); /* scheme case, spaces */
    assert_string_equal(n, "bob");
    assert_int_equal(who("Bearer alice-key-000", &n), ERR_NOT_FOUND); /* a prefix */
    assert_int_equal(who("Bearer alice-key-00011", &n), ERR_NOT_FOUND);
    assert_int_equal(who("Bearer sha256:whatever", &n), ERR_NOT_FOUND);
    assert_int_equal(who(NULL, &n), ERR_FORMAT);
    assert_int_equal(who("", &n), ERR_FORMAT);
    assert_int_equal(who("Basic YWxpY2U6", &n), ERR_FORMAT);
    assert_int_equal(who("Bearer ", &n), ERR_FORMAT);
    assert_int_equal(who("Bearer    ", &n), ERR_FORMAT);
    assert_null(n);

    /* no tenants: anonymous, whatever the header */
    struct config *anon = NULL;
    assert_int_equal(config_parse("a.json", "/etc", "{\"model_dir\": \"/m\"}", 19, NULL, &anon), 0);
    const struct config_tenant *t = (void *)1;
    assert_int_equal(auth_tenant(anon, NULL, 0, &t), 0);
    assert_null(t);
    config_unref(anon);

    assert_true(auth_tenant_id("alice") != 0);
    assert_true(auth_tenant_id("alice") == auth_tenant_id("alice"));
    assert_true(auth_tenant_id("alice") != auth_tenant_id("bob"));
    assert_true(auth_tenant_id("") != 0);
}

static void test_streams(void **state)
{
    (void)state;
    struct auth_streams s;
    auth_streams_init(&s);
    assert_int_equal(auth_streams_acquire(&s, "bob", 2), 0);
    assert_int_equal(auth_streams_acquire(&s, "bob", 2), 0);
    assert_int_equal(auth_streams_acquire(&s, "bob", 2), ERR_OVERLOADED);
    assert_int_equal(auth_streams_acquire(&s, "alice", 0), 0); /* no limit */
    assert_int_equal(auth_streams_active(&s, "bob"), 2);
    auth_streams_release(&s, "bob");
    assert_int_equal(auth_streams_acquire(&s, "bob", 2), 0);
    auth_streams_release(&s, "nobody"); /* harmless */
    /* many tenants come and go: entries of idle ones are reused */
    char name[32];
    for (int i = 0; i < 10 * AUTH_MAX_TRACKED; i++) {
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(auth_streams_acquire(&s, name, 1), 0);
        auth_streams_release(&s, name);
    }
    assert_int_equal(auth_streams_active(&s, "bob"), 2);
    auth_streams_fini(&s);
}

static bool only_a0(void *ud, const char *name)
{
    (void)ud;
    return strcmp(name, "a0") == 0;
}

/* A request with a prompt of ids, then what the test sets. */
static int check(Clocher__V1__GenerateRequest *r, const char *tenant, struct shm_msg_generate *g,
                 char *msg)
{
    struct gw_req_ctx ctx = {.cfg = g_cfg, .tenant = tenant ? config_find_tenant(g_cfg, tenant)
                                                            : NULL,
                             .tenant_id = 7, .model_name = "m1", .adapter_known = only_a0,
                             .seed = 99, .deadline_ns = 5};
    return gw_req_generate(r, &ctx, g, msg, 256);
}

static void test_defaults(void **state)
{
    (void)state;
    Clocher__V1__GenerateRequest r = CLOCHER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT;
    r.prompt = "hello";
    struct shm_msg_generate g;
    char msg[256];
    assert_int_equal(check(&r, "alice", &g, msg), GRPC_STATUS_OK);
    assert_int_equal(g.prompt_text_len, 5);
    assert_true(g.flags & SHM_GEN_ADD_BOS);
    assert_true(fabsf(g.temperature - 0.8f) < 1e-6f);
    assert_true(g.top_p == 1.0f && g.min_p == 0.0f && g.repeat_penalty == 1.0f);
    assert_int_equal(g.top_k, 0);
    assert_int_equal(g.max_tokens, 100); /* the default 256, capped by limits.max_tokens */
    assert_int_equal(g.seed, 99);
    assert_int_equal(g.tenant_id, 7);
    assert_int_equal(g.deadline_ns, 5);
    assert_null(g.adapter);
    assert_int_equal(g.priority, SHM_PRIO_NORMAL);
    r.has_add_bos = 1, r.add_bos = 0;
    Clocher__V1__SamplingParams s = CLOCHER__V1__SAMPLING_PARAMS__INIT;
    s.has_temperature = 1, s.temperature = 0;
    s.has_seed = 1, s.seed = 5;
    r.sampling = &s;
    r.adapter = "a0";
    r.has_max_tokens = 1, r.max_tokens = 7;
    r.has_priority = 1, r.priority = CLOCHER__V1__PRIORITY__PRIORITY_HIGH;
    assert_int_equal(check(&r, "bob", &g, msg), GRPC_STATUS_OK);
    assert_false(g.flags & SHM_GEN_ADD_BOS);
    assert_true(g.temperature == 0.0f);
    assert_int_equal(g.seed, 5);
    assert_string_equal(g.adapter, "a0");
    assert_int_equal(g.max_tokens, 7);
    assert_int_equal(g.priority, SHM_PRIO_HIGH);
}

struct refusal {
    const char *what;
    int status;
    const char *words;
};

static void test_refusals(void **state)
{
    (void)state;
    int32_t ids9[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, neg[2] = {1, -1};
    char *stops17[17], *empty_stop[1] = {""};
    for (int i = 0; i < 17; i++)
        stops17[i] = "x";
    char long_id[200];
    memset(long_id, 'r', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    static const struct refusal cases[] = {
        {"no prompt", GRPC_STATUS_INVALID_ARGUMENT, "prompt: missing"},
        {"empty prompt", GRPC_STATUS_INVALID_ARGUMENT, "prompt: empty"},
        {"empty ids", GRPC_STATUS_INVALID_ARGUMENT, "prompt_ids: empty"},
        {"too many ids", GRPC_STATUS_INVALID_ARGUMENT, "prompt_ids: 9 tokens, the limit is 8"},
        {"negative id", GRPC_STATUS_INVALID_ARGUMENT, "prompt_ids: token 1 is -1"},
        {"bad adapter name", GRPC_STATUS_INVALID_ARGUMENT, "adapter: \"a b\" is not a valid"},
        {"forbidden adapter", GRPC_STATUS_NOT_FOUND, "adapter: a1: not found"},
        {"unknown adapter", GRPC_STATUS_NOT_FOUND, "adapter: zz: not found"},
        {"scale without adapter", GRPC_STATUS_INVALID_ARGUMENT, "adapter_scale: given without"},
        {"nan scale", GRPC_STATUS_INVALID_ARGUMENT, "adapter_scale: not a finite"},
        {"negative temperature", GRPC_STATUS_INVALID_ARGUMENT, "sampling.temperature: -1"},
        {"top_p > 1", GRPC_STATUS_INVALID_ARGUMENT, "sampling.top_p: 1.5 is outside (0, 1]"},
        {"top_p 0", GRPC_STATUS_INVALID_ARGUMENT, "sampling.top_p: 0 is outside"},
        {"min_p 1", GRPC_STATUS_INVALID_ARGUMENT, "sampling.min_p: 1 is outside [0, 1)"},
        {"penalty 0", GRPC_STATUS_INVALID_ARGUMENT, "sampling.repetition_penalty: 0"},
        {"max_tokens", GRPC_STATUS_INVALID_ARGUMENT, "max_tokens: 101 exceeds the limit 100"},
        {"17 stops", GRPC_STATUS_INVALID_ARGUMENT, "stop: 17 strings, the limit is 16"},
        {"empty stop", GRPC_STATUS_INVALID_ARGUMENT, "stop[0]: empty"},
        {"priority 9", GRPC_STATUS_INVALID_ARGUMENT, "priority: 9 is not"},
        {"other model", GRPC_STATUS_NOT_FOUND, "model: \"m2\" is not served here"},
        {"long request_id", GRPC_STATUS_INVALID_ARGUMENT, "request_id: longer than 128"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Clocher__V1__GenerateRequest r = CLOCHER__V1__GENERATE_REQUEST__INIT;
        Clocher__V1__SamplingParams s = CLOCHER__V1__SAMPLING_PARAMS__INIT;
        Clocher__V1__TokenIds t = CLOCHER__V1__TOKEN_IDS__INIT;
        r.input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT;
        r.prompt = "hi";
        r.sampling = &s;
        const char *tenant = "bob";
        switch (k) {
        case 0: r.input_case = 0; break;
        case 1: r.prompt = ""; break;
        case 2: case 3: case 4:
            r.input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS;
            r.prompt_ids = &t;
            if (k == 3)
                t.n_ids = 9, t.ids = ids9;
            if (k == 4)
                t.n_ids = 2, t.ids = neg;
            break;
        case 5: r.adapter = "a b"; break;
        case 6: r.adapter = "a1"; break;
        case 7: r.adapter = "zz", tenant = "alice"; break;
        case 8: r.has_adapter_scale = 1, r.adapter_scale = 2; break;
        case 9: r.adapter = "a0", r.has_adapter_scale = 1, r.adapter_scale = NAN; break;
        case 10: s.has_temperature = 1, s.temperature = -1; break;
        case 11: s.has_top_p = 1, s.top_p = 1.5f; break;
        case 12: s.has_top_p = 1, s.top_p = 0; break;
        case 13: s.has_min_p = 1, s.min_p = 1; break;
        case 14: s.has_repetition_penalty = 1, s.repetition_penalty = 0; break;
        case 15: r.has_max_tokens = 1, r.max_tokens = 101; break;
        case 16: r.n_stop = 17, r.stop = stops17; break;
        case 17: r.n_stop = 1, r.stop = empty_stop; break;
        case 18: r.has_priority = 1, r.priority = 9; break;
        case 19: r.model = "m2"; break;
        case 20: r.request_id = long_id; break;
        }
        struct shm_msg_generate g;
        char msg[256];
        int st = check(&r, tenant, &g, msg);
        if (st != cases[k].status || !strstr(msg, cases[k].words))
            fail_msg("%s: status %d \"%s\", want %d \"%s\"", cases[k].what, st, msg,
                     cases[k].status, cases[k].words);
    }
}

static void test_error_statuses(void **state)
{
    (void)state;
    assert_int_equal(gw_req_status_of_error(ERR_RANGE), GRPC_STATUS_INVALID_ARGUMENT);
    assert_int_equal(gw_req_status_of_error(ERR_NOT_FOUND), GRPC_STATUS_NOT_FOUND);
    assert_int_equal(gw_req_status_of_error(ERR_OVERLOADED), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(gw_req_status_of_error(-ENOMEM), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_int_equal(gw_req_status_of_error(ERR_UNSUPPORTED), GRPC_STATUS_FAILED_PRECONDITION);
    assert_int_equal(gw_req_status_of_error(ERR_DEADLINE), GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_int_equal(gw_req_status_of_error(-12345), GRPC_STATUS_INTERNAL);
    assert_true(gw_req_name_ok("a-b_c.9"));
    assert_false(gw_req_name_ok(""));
    assert_false(gw_req_name_ok("a/b"));
    char n64[65];
    memset(n64, 'a', 64);
    n64[64] = '\0';
    assert_false(gw_req_name_ok(n64));
    n64[63] = '\0';
    assert_true(gw_req_name_ok(n64));
}

/* NUL bytes in text fields, found on the wire (protobuf-c's C strings would cut the text). */
static void test_text_nul(void **state)
{
    (void)state;
    /* GenerateRequest {prompt (2): "a\0b", max_tokens (5): 3} */
    static const uint8_t gen_nul[] = {0x12, 3, 'a', 0, 'b', 0x28, 3};
    static const uint8_t gen_ok[] = {0x12, 3, 'a', 'c', 'b', 0x28, 3};
    assert_int_equal(gw_req_text_nul(gen_nul, sizeof gen_nul, 2, 0), 1);
    assert_int_equal(gw_req_text_nul(gen_ok, sizeof gen_ok, 2, 0), 0);
    /* prompt_ids (3) packed ids hold zeros: not a text field */
    static const uint8_t ids[] = {0x1a, 4, 0x0a, 2, 0, 1};
    assert_int_equal(gw_req_text_nul(ids, sizeof ids, 2, 0), 0);
    /* BatchGenerateRequest {requests (1): [{prompt: "ok"}, {prompt: "x\0"}]} */
    static const uint8_t batch[] = {0x0a, 4, 0x12, 2, 'o', 'k', 0x0a, 4, 0x12, 2, 'x', 0};
    assert_int_equal(gw_req_text_nul(batch, sizeof batch, 1, 2), 1);
    assert_int_equal(gw_req_text_nul(batch, 6, 1, 2), 0);
    /* fixed64, fixed32 skipped */
    static const uint8_t fixed[] = {0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x15, 0, 0, 0, 0, 0x12, 1, 'z'};
    assert_int_equal(gw_req_text_nul(fixed, sizeof fixed, 2, 0), 0);
    /* not protobuf: every truncation (but those past the NUL: the scan stops at it) and a
     * group are refused, never read past the end */
    for (size_t n = 1; n < sizeof gen_nul; n++)
        assert_int_equal(gw_req_text_nul(gen_nul, n, 2, 0), n >= 5 ? 1 : ERR_FORMAT);
    static const uint8_t group[] = {0x0b, 0x0c};
    assert_int_equal(gw_req_text_nul(group, sizeof group, 2, 0), ERR_FORMAT);
    static const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                          0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    assert_int_equal(gw_req_text_nul(long_varint, sizeof long_varint, 2, 0), ERR_FORMAT);
    static const uint8_t too_long[] = {0x12, 0x80, 0x80, 0x80, 0x80, 0x10, 'a'};
    assert_int_equal(gw_req_text_nul(too_long, sizeof too_long, 2, 0), ERR_FORMAT);
    assert_int_equal(gw_req_text_nul(NULL, 0, 2, 0), 0);
}

/* A batch takes one stream per request, all or none. */
static void test_streams_n(void **state)
{
    (void)state;
    struct auth_streams s;
    auth_streams_init(&s);
    assert_int_equal(auth_streams_acquire_n(&s, "bob", 3, 2), ERR_OVERLOADED);
    assert_int_equal(auth_streams_active(&s, "bob"), 0);
    assert_int_equal(auth_streams_acquire_n(&s, "bob", 2, 2), 0);
    assert_int_equal(auth_streams_acquire(&s, "bob", 2), ERR_OVERLOADED);
    auth_streams_release_n(&s, "bob", 2);
    assert_int_equal(auth_streams_active(&s, "bob"), 0);
    assert_int_equal(auth_streams_acquire_n(&s, "alice", 1000, 0), 0); /* no limit */
    auth_streams_release_n(&s, "alice", 5000);                          /* never below 0 */
    assert_int_equal(auth_streams_active(&s, "alice"), 0);
    auth_streams_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth),          cmocka_unit_test(test_streams),
        cmocka_unit_test(test_defaults),      cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_error_statuses), cmocka_unit_test(test_text_nul),
        cmocka_unit_test(test_streams_n),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
