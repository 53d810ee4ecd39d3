/*
 * test_http_tools.c — the HTTP API's side of tool calling (daemon/http_oai.c): a chat body's
 * `tools`, `tool_choice`, `parallel_tool_calls`, assistant `tool_calls` and `tool` messages
 * read into the messages gRPC's Chat carries (one per call, recipient "functions.NAME",
 * tool_call_id), each malformed one refused naming the parameter and the element; and the
 * reply's tool_calls entries, whole and as OpenAI streams them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "err.h"
#include "http_oai.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS                                                                                 \
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "   \
    "\"Weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "        \
    "{\"type\": \"string\"}}}}}]"

static int parse(const char *body, struct http_oai_req *r, char *param, char *msg)
{
    return http_oai_parse_ex(body, strlen(body), true, HTTP_OAI_TOOLS, r, param, 64, msg, 512);
}

static void round_trip_messages(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": \"auto\", "
        "\"parallel_tool_calls\": false, \"messages\": ["
        "{\"role\": \"user\", \"content\": \"Paris and Oslo?\"},"
        "{\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": ["
        "{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}},"
        "{\"id\": \"call_2\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"call_2\", \"content\": \"3C\"},"
        "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"name\": \"get_weather\", "
        "\"content\": \"21C\"}]}";
    struct http_oai_req r;
    char param[64], msg[512];
    if (parse(body, &r, param, msg))
        fail_msg("%s: %s", param, msg);
    assert_false(r.parallel_tool_calls);
    json_t *t = json_loads(r.tools_json, 0, NULL);
    json_t *want = json_loads(TOOLS, 0, NULL);
    assert_true(json_equal(t, want));
    json_decref(t);
    json_decref(want);
    assert_int_equal(r.n_msgs, 6); /* user, the text, two calls, two answers */
    assert_string_equal(r.msgs[1].role, "assistant");
    assert_string_equal(r.msgs[1].content, "Checking.");
    assert_null(r.msgs[1].recipient);
    assert_string_equal(r.msgs[2].recipient, "functions.get_weather");
    assert_string_equal(r.msgs[2].tool_call_id, "call_1");
    assert_string_equal(r.msgs[2].content, "{\"city\": \"Paris\"}");
    assert_string_equal(r.msgs[3].tool_call_id, "call_2");
    /* an answer without a name takes its call's */
    assert_string_equal(r.msgs[4].role, "tool");
    assert_string_equal(r.msgs[4].recipient, "functions.get_weather");
    assert_string_equal(r.msgs[4].tool_call_id, "call_2");
    assert_string_equal(r.msgs[5].recipient, "functions.get_weather");
    http_oai_free(&r);
    /* tool_choice "required" and a named function: carried as gRPC's Chat carries them */
    assert_int_equal(parse("{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": "
                           "\"required\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"x\"}]}", &r, param, msg), 0);
    assert_string_equal(r.tool_choice, "required");
    assert_null(r.tool_choice_function);
    assert_non_null(r.tools_json);
    http_oai_free(&r);
    assert_int_equal(parse("{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": "
                           "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, "
                           "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                           &r, param, msg), 0);
    assert_string_equal(r.tool_choice, "function");
    assert_string_equal(r.tool_choice_function, "get_weather");
    http_oai_free(&r);
    /* tool_choice "none": the tools stay out of the prompt (vLLM's default) */
    assert_int_equal(parse("{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": \"none\", "
                           "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                           &r, param, msg), 0);
    assert_null(r.tools_json);
    assert_true(r.parallel_tool_calls);
    http_oai_free(&r);
    /* a call without text: no empty assistant message before it */
    assert_int_equal(parse("{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", "
                           "\"content\": null, \"tool_calls\": [{\"id\": \"a\", \"type\": "
                           "\"function\", \"function\": {\"name\": \"f\", \"arguments\": "
                           "\"{}\"}}]}]}",
                           &r, param, msg), 0);
    assert_int_equal(r.n_msgs, 1);
    assert_string_equal(r.msgs[0].recipient, "functions.f");
    http_oai_free(&r);
}

/* without HTTP_OAI_TOOLS (a caller that cannot carry them) tools stay refused */
static void tools_refused_when_not_carried(void **state)
{
    (void)state;
    struct http_oai_req r;
    char param[64], msg[512];
    const char *body = "{\"model\": \"m\", \"tools\": " TOOLS ", \"messages\": [{\"role\": "
                       "\"user\", \"content\": \"x\"}]}";
    assert_int_equal(http_oai_parse(body, strlen(body), true, &r, param, 64, msg, 512),
                     ERR_UNSUPPORTED);
    assert_string_equal(param, "tools");
}

static void malformed_tools(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        int rc;
        const char *param, *msg;
    } cases[] = {
        {"{\"model\": \"m\", \"tools\": {}, \"messages\": [{\"role\": \"user\"}]}", ERR_FORMAT,
         "tools", "tools: must be an array"},
        {"{\"model\": \"m\", \"tools\": [1], \"messages\": [{\"role\": \"user\"}]}", ERR_FORMAT,
         "tools", "tools[0]: must be an object"},
        {"{\"model\": \"m\", \"tools\": [{\"type\": \"retrieval\"}], \"messages\": []}",
         ERR_FORMAT, "tools", "tools[0].type: must be \"function\""},
        {"{\"model\": \"m\", \"tools\": [{\"type\": \"function\"}], \"messages\": []}",
         ERR_FORMAT, "tools", "tools[0].function: missing"},
        {"{\"model\": \"m\", \"tools\": [" "{\"type\": \"function\", \"function\": {\"name\": "
         "\"ok\"}}, {\"type\": \"function\", \"function\": {\"name\": 7}}], \"messages\": []}",
         ERR_FORMAT, "tools", "tools[1].function.name: missing or not a string"},
        {"{\"model\": \"m\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
         "\"get weather\"}}], \"messages\": []}",
         ERR_FORMAT, "tools", "tools[0].function.name: \"get weather\" is not"},
        {"{\"model\": \"m\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
         "\"f\", \"parameters\": [1]}}], \"messages\": []}",
         ERR_FORMAT, "tools", "tools[0].function.parameters: must be a JSON Schema object"},
        {"{\"model\": \"m\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
         "\"f\", \"description\": 1}}], \"messages\": []}",
         ERR_FORMAT, "tools", "tools[0].function.description: must be a string"},
        {"{\"model\": \"m\", \"tool_choice\": \"required\", \"messages\": []}", ERR_FORMAT,
         "tool_choice", "tool_choice: \"required\" needs tools"},
        {"{\"model\": \"m\", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
         "\"f\"}}, \"messages\": []}",
         ERR_FORMAT, "tool_choice", "tool_choice: \"f\" needs tools"},
        {"{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"get_time\"}}, \"messages\": []}",
         ERR_FORMAT, "tool_choice", "\"get_time\" is not one of the tools"},
        {"{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": {\"type\": \"function\"}, "
         "\"messages\": []}",
         ERR_FORMAT, "tool_choice", "an object must be {\"type\": \"function\""},
        {"{\"model\": \"m\", \"tools\": " TOOLS ", \"tool_choice\": {\"type\": \"code\", "
         "\"function\": {\"name\": \"get_weather\"}}, \"messages\": []}",
         ERR_FORMAT, "tool_choice", "an object must be"},
        {"{\"model\": \"m\", \"tool_choice\": \"sometimes\", \"messages\": []}", ERR_FORMAT,
         "tool_choice", "tool_choice: must be"},
        {"{\"model\": \"m\", \"parallel_tool_calls\": 1, \"messages\": []}", ERR_FORMAT,
         "parallel_tool_calls", "must be a boolean"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
         ERR_FORMAT, "messages", "messages[0].tool_call_id: missing"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"tool\", \"tool_call_id\": \"zz\", "
         "\"content\": \"x\"}]}",
         ERR_FORMAT, "messages", "\"zz\" answers no earlier tool call"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"tool_calls\": []}]}",
         ERR_FORMAT, "messages", "messages[0].tool_calls: only assistant messages"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": {}}]}",
         ERR_FORMAT, "messages", "messages[0].tool_calls: must be an array"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"type\": "
         "\"function\", \"function\": {\"name\": \"f\"}}]}]}",
         ERR_FORMAT, "messages", "messages[0].tool_calls[0].id: missing"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": "
         "\"a b\", \"function\": {\"name\": \"f\"}}]}]}",
         ERR_FORMAT, "messages", "messages[0].tool_calls[0].id"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": "
         "\"a\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}]}",
         ERR_FORMAT, "messages", "function.arguments: must be a string"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": "
         "\"a\", \"type\": \"code\", \"function\": {\"name\": \"f\"}}]}]}",
         ERR_FORMAT, "messages", "tool_calls[0].type: must be \"function\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_oai_req r;
        char param[64], msg[512];
        int rc = parse(cases[i].body, &r, param, msg);
        if (rc != cases[i].rc || strcmp(param, cases[i].param) != 0 || !strstr(msg, cases[i].msg))
            fail_msg("case %zu: %s (%s: %s), want %s (%s: %s)", i, err_name(rc), param, msg,
                     err_name(cases[i].rc), cases[i].param, cases[i].msg);
        assert_null(r.tools_json);
        assert_null(r.msgs);
    }
}

static void reply_tool_calls(void **state)
{
    (void)state;
    json_t *c = http_oai_tool_call(0, false, true, "call_X", "functions.get_weather",
                                   "{\"city\": \"Paris\"}", 17);
    char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s, "{\"function\":{\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\","
                           "\"name\":\"get_weather\"},\"id\":\"call_X\",\"type\":\"function\"}");
    free(s);
    json_decref(c);
    /* streamed: the opening piece carries index, id, type and name; the next only arguments */
    c = http_oai_tool_call(1, true, true, "call_Y", "functions.f", "", 0);
    s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s, "{\"function\":{\"arguments\":\"\",\"name\":\"f\"},\"id\":\"call_Y\","
                           "\"index\":1,\"type\":\"function\"}");
    free(s);
    json_decref(c);
    c = http_oai_tool_call(1, true, false, "call_Y", "functions.f", "{\"a\"", 4);
    s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s, "{\"function\":{\"arguments\":\"{\\\"a\\\"\"},\"index\":1}");
    free(s);
    json_decref(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_messages),
        cmocka_unit_test(tools_refused_when_not_carried),
        cmocka_unit_test(malformed_tools),
        cmocka_unit_test(reply_tool_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
