/*
 * fuzz_http_body.c — libFuzzer harness over the HTTP API's request-body reader
 * (daemon/http_oai.c), which reads JSON from any client of the OpenAI-compatible port. Each
 * input is read twice, as a /v1/completions and as a /v1/chat/completions body. Beyond "no
 * crash": a refusal is one of the documented codes with a message; an accepted body has a
 * model, 1..HTTP_OAI_MAX_N choices, at most HTTP_OAI_MAX_STOP stops, a prompt (text or ids) or
 * messages, and its chat rendering contains every message's content.
 */
#include "fuzz.h"

#include "err.h"
#include "http_oai.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(const uint8_t *data, size_t size, bool chat)
{
    struct http_oai_req r;
    char param[64], msg[512];
    int rc = http_oai_parse((const char *)data, size, chat, &r, param, sizeof param, msg,
                            sizeof msg);
    if (rc < 0) {
        if (rc != ERR_FORMAT && rc != ERR_UNSUPPORTED && rc != ERR_RANGE && rc != -ENOMEM)
            abort();
        if (!msg[0] || strnlen(param, sizeof param) == sizeof param)
            abort();
        if (r.model || r.prompt || r.msgs || r.n_stop) /* freed on refusal */
            abort();
        return;
    }
    if (!r.model || !r.model[0] || r.n < 1 || r.n > HTTP_OAI_MAX_N ||
        r.n_stop > HTTP_OAI_MAX_STOP || r.chat != chat)
        abort();
    for (size_t i = 0; i < r.n_stop; i++)
        if (!r.stop[i])
            abort();
    if (chat) {
        if (r.n_msgs == 0 || r.prompt || r.prompt_ids)
            abort();
        char *p = http_oai_render_plain(&r);
        if (!p)
            abort();
        for (size_t i = 0; i < r.n_msgs; i++)
            if (!r.msgs[i].role || !r.msgs[i].content || !strstr(p, r.msgs[i].content))
                abort();
        free(p);
    } else if (!r.prompt == !r.n_prompt_ids) {
        abort(); /* exactly one of text and ids */
    }
    http_oai_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size, false);
    check(data, size, true);
    return 0;
}
