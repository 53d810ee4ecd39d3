/* test_reflect.c — daemon/gw_reflect.c's answers without a server: the index of the embedded
 * descriptor set, each kind of request, and bytes that are not a request — valid requests cut
 * and mutated at random (seeded: the same inputs every run), which must each give an answer
 * or a clean ERR_FORMAT, never a crash (under ASan in CI's sanitizer tree). */
#include "testutil.h"

#include "err.h"
#include "gw_reflect.h"
#include "rng.h"

#include "grpc/reflection/v1/reflection.pb-c.h"

#include <stdlib.h>
#include <string.h>

typedef Grpc__Reflection__V1__ServerReflectionRequest Req;
typedef Grpc__Reflection__V1__ServerReflectionResponse Resp;

static struct gw_reflect *g_r;

static int setup(void **state)
{
    (void)state;
    return gw_reflect_index_create(&g_r);
}

static int teardown(void **state)
{
    (void)state;
    gw_reflect_destroy(g_r);
    return 0;
}

/* The answer to req (asserted to be one). */
static Resp *ask(const Req *req)
{
    uint8_t buf[4096], *out;
    size_t n = grpc__reflection__v1__server_reflection_request__pack(req, buf), len;
    char msg[200];
    assert_int_equal(gw_reflect_answer(g_r, buf, n, &out, &len, msg, sizeof msg), 0);
    Resp *r = grpc__reflection__v1__server_reflection_response__unpack(NULL, len, out);
    free(out);
    assert_non_null(r);
    return r;
}

static void test_list_services(void **state)
{
    (void)state;
    Req q = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    q.host = "h";
    q.message_request_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES;
    q.list_services = "";
    Resp *r = ask(&q);
    assert_string_equal(r->valid_host, "h");
    assert_int_equal(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE);
    const char *want[] = {"clocher.v1.Inference", "grpc.health.v1.Health",
                          "grpc.reflection.v1.ServerReflection",
                          "grpc.reflection.v1alpha.ServerReflection"};
    assert_int_equal(r->list_services_response->n_service, 4);
    for (size_t i = 0; i < 4; i++) {
        bool found = false;
        for (size_t k = 0; k < 4; k++)
            found |= strcmp(r->list_services_response->service[k]->name, want[i]) == 0;
        assert_true(found);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_symbols_and_files(void **state)
{
    (void)state;
    static const char *const found[] = {"clocher.v1.Inference", "clocher.v1.Inference.Generate",
                                        "clocher.v1.GenerateRequest",
                                        "clocher.v1.GenerateRequest.max_tokens",
                                        "clocher.v1.PRIORITY_HIGH", "clocher.v1.Priority"};
    for (size_t i = 0; i < sizeof found / sizeof found[0]; i++) {
        Req q = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
        q.message_request_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
        q.file_containing_symbol = (char *)found[i];
        Resp *r = ask(&q);
        if (r->message_response_case !=
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE)
            fail_msg("%s: no file", found[i]);
        assert_true(r->file_descriptor_response->n_file_descriptor_proto >= 1);
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    Req q = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    q.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME;
    q.file_by_filename = "clocher/v1/no.proto";
    Resp *r = ask(&q);
    assert_int_equal(r->message_response_case,
                     GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE);
    assert_int_equal(r->error_response->error_code, 5);
    assert_non_null(strstr(r->error_response->error_message, "clocher/v1/no.proto"));
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_bytes_that_are_not_a_request(void **state)
{
    (void)state;
    uint8_t *out = (uint8_t *)"x";
    size_t len = 1;
    char msg[200];
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
    assert_int_equal(gw_reflect_answer(g_r, junk, sizeof junk, &out, &len, msg, sizeof msg),
                     ERR_FORMAT);
    assert_null(out);
    assert_non_null(strstr(msg, "ServerReflectionRequest"));
    /* a request with nothing asked */
    assert_int_equal(gw_reflect_answer(g_r, NULL, 0, &out, &len, msg, sizeof msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "without a request"));
}

static void test_mutated_requests(void **state)
{
    (void)state;
    Req q = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    q.host = "localhost";
    q.message_request_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
    q.file_containing_symbol = "clocher.v1.Inference.Generate";
    uint8_t seed[256];
    size_t n = grpc__reflection__v1__server_reflection_request__pack(&q, seed);
    uint32_t x = 0x5eed1234u;
    size_t ok = 0, refused = 0;
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t buf[300];
        size_t len = n;
        memcpy(buf, seed, n);
        int flips = 1 + (int)(rng_xorshift32(&x) % 4);
        for (int k = 0; k < flips; k++)
            buf[rng_xorshift32(&x) % len] = (uint8_t)rng_xorshift32(&x);
        if (rng_xorshift32(&x) % 4 == 0)
            len = rng_xorshift32(&x) % (len + 1);
        uint8_t *out;
        size_t out_len;
        char msg[200];
        int rc = gw_reflect_answer(g_r, buf, len, &out, &out_len, msg, sizeof msg);
        if (rc == 0) {
            ok++;
            free(out);
        } else {
            assert_int_equal(rc, ERR_FORMAT);
            refused++;
        }
    }
    assert_true(ok > 0 && refused > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_services),
        cmocka_unit_test(test_symbols_and_files),
        cmocka_unit_test(test_bytes_that_are_not_a_request),
        cmocka_unit_test(test_mutated_requests),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
