/*
 * fuzz_http_tools.c — libFuzzer harness over the HTTP API's chat body reader with tools
 * (http_oai_parse_ex with HTTP_OAI_TOOLS: `tools`, `tool_choice`, `parallel_tool_calls`,
 * assistant `tool_calls`, `tool` messages), then the reply side's tool-call builder on what it
 * accepted. A refusal is one of the documented codes with a message and the request freed;
 * an acceptance holds tools that parse as a JSON array, and every tool call or tool answer as
 * a message with a "functions." recipient and an id.
 */
#include "fuzz.h"

#include "err.h"
#include "http_oai.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_oai_req r;
    char param[64], msg[512];
    int rc = http_oai_parse_ex((const char *)data, size, true, HTTP_OAI_TOOLS, &r, param,
                               sizeof param, msg, sizeof msg);
    if (rc < 0) {
        if (rc != ERR_FORMAT && rc != ERR_UNSUPPORTED && rc != ERR_RANGE && rc != -ENOMEM)
            abort();
        if (!msg[0] || strnlen(param, sizeof param) == sizeof param)
            abort();
        if (r.model || r.msgs || r.tools_json) /* freed on refusal */
            abort();
        return 0;
    }
    if (!r.model || r.n_msgs == 0)
        abort();
    if (r.tools_json) {
        json_t *t = json_loads(r.tools_json, 0, NULL);
        if (!json_is_array(t) || json_array_size(t) == 0 || json_array_size(t) > HTTP_OAI_MAX_TOOLS)
            abort();
        json_decref(t);
    }
    for (size_t i = 0; i < r.n_msgs; i++) {
        const struct http_oai_msg *m = &r.msgs[i];
        if (!m->role || !m->content || !m->recipient != !m->tool_call_id)
            abort();
        if (!m->recipient)
            continue;
        if (strncmp(m->recipient, "functions.", 10) != 0 || !m->tool_call_id[0])
            abort();
        for (int delta = 0; delta < 2; delta++) {
            json_t *c = http_oai_tool_call((unsigned)i, delta, true, m->tool_call_id,
                                           m->recipient, m->content, strlen(m->content));
            json_t *fn = json_object_get(c, "function");
            if (c && (strcmp(json_string_value(json_object_get(fn, "name")), m->recipient + 10) ||
                      strcmp(json_string_value(json_object_get(fn, "arguments")), m->content)))
                abort(); /* NULL only for OOM or arguments that are not UTF-8 */
            json_decref(c);
        }
    }
    http_oai_free(&r);
    return 0;
}
