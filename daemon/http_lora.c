/*
 * http_lora.c — reads the bodies of vLLM's runtime adapter endpoints (contract: http_lora.h).
 * jansson parses; this file only checks the two members the endpoints use.
 */
#include "http_lora.h"

#include "err.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* body[key] into out[cap]: 0, or ERR_FORMAT naming it. */
static int member(json_t *body, const char *key, char *out, size_t cap, char *param,
                  size_t param_cap, char *msg, size_t msg_cap)
{
    json_t *v = json_object_get(body, key);
    const char *s = json_string_value(v);
    size_t n = s ? strlen(s) : 0;
    if (s && n && n < cap) {
        memcpy(out, s, n + 1);
        return 0;
    }
    snprintf(param, param_cap, "%s", key);
    if (s && n)
        snprintf(msg, msg_cap, "%s: is too long (%zu bytes, the limit is %zu)", key, n, cap - 1);
    else
        snprintf(msg, msg_cap, "%s: %s", key,
                 !v ? "is required" : !s ? "must be a string" : "must not be empty");
    return ERR_FORMAT;
}

int http_lora_parse(const char *body, size_t len, bool load, struct http_lora_req *out,
                    char *param, size_t param_cap, char *msg, size_t msg_cap)
{
    memset(out, 0, sizeof *out);
    param[0] = msg[0] = '\0';
    json_error_t jerr;
    json_t *j = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &jerr);
    int rc = 0;
    if (!json_is_object(j)) {
        snprintf(msg, msg_cap, "the body is not a JSON object%s%s", j ? "" : ": ",
                 j ? "" : jerr.text);
        rc = ERR_FORMAT;
    } else if ((rc = member(j, "lora_name", out->name, sizeof out->name, param, param_cap, msg,
                            msg_cap)) == 0 &&
               load) {
        rc = member(j, "lora_path", out->path, sizeof out->path, param, param_cap, msg, msg_cap);
    }
    json_decref(j);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}
