/*
 * fuzz_jinja.c — libFuzzer harness for the chat-template interpreter (worker/tok/jinja*.c),
 * which reads untrusted template text from tokenizer_config.json / GGUF: the input is a
 * template; one that loads is rendered against a small conversation (system, user, assistant
 * with a tool call, tool result; tools; add_generation_prompt) under tight limits, so deep
 * recursion, huge loops and huge outputs end in an error, never a hang, crash or leak. A
 * refusal must name a line. Seeds: corpus/jinja/ (written by hand, not the fixture templates).
 */
#include "fuzz.h"

#include "jinja.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \" Hi \\u4e16 \"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abcdefghi\","
    "  \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5}}}]},"
    " {\"role\": \"tool\", \"content\": \"[1, 2]\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    struct jinja_tpl *t = NULL;
    int rc = jinja_parse((const char *)data, size, &t, err, sizeof err);
    if (rc) {
        if (t || strncmp(err, "template line ", 14) != 0)
            abort();
        return 0;
    }
    json_t *ctx = json_loads(VARS, 0, NULL);
    if (!ctx)
        abort();
    struct jinja_limits lim = {.max_output = 1 << 16, .max_steps = 200000, .max_depth = 16,
                               .now = 1785000000};
    char *out = NULL;
    size_t n = 0;
    rc = jinja_render(t, ctx, &lim, &out, &n, err, sizeof err);
    if (rc == 0 && (!out || strlen(out) > n || n > lim.max_output))
        abort();
    if (rc != 0 && (out || err[0] == 0))
        abort();
    free(out);
    json_decref(ctx);
    jinja_free(t);
    return 0;
}
