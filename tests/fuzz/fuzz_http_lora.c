/*
 * fuzz_http_lora.c — libFuzzer harness over the bodies of vLLM's runtime adapter endpoints
 * (daemon/http_lora.c), which any client of the HTTP port can send. Each input is read twice,
 * as a load and as an unload body. Beyond "no crash": a refusal is ERR_FORMAT with a message
 * and an empty request; an accepted body has a non-empty NUL-terminated name (and a path when
 * loading, none when unloading).
 */
#include "fuzz.h"

#include "err.h"
#include "http_lora.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(const uint8_t *data, size_t size, bool load)
{
    struct http_lora_req q;
    char param[32], msg[512];
    int rc = http_lora_parse((const char *)data, size, load, &q, param, sizeof param, msg,
                             sizeof msg);
    if (rc < 0) {
        if (rc != ERR_FORMAT || !msg[0] || q.name[0] || q.path[0])
            abort();
        if (param[0] && strcmp(param, "lora_name") && strcmp(param, "lora_path"))
            abort();
        return;
    }
    size_t n = strnlen(q.name, sizeof q.name), p = strnlen(q.path, sizeof q.path);
    if (rc != 0 || n == 0 || n == sizeof q.name || p == sizeof q.path || !p != !load)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size, true);
    check(data, size, false);
    return 0;
}
