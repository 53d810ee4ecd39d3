/*
 * http_lora.h — the bodies of vLLM's runtime adapter endpoints on the HTTP door
 * (POST /v1/load_lora_adapter {"lora_name", "lora_path"}, POST /v1/unload_lora_adapter
 * {"lora_name"}), read from any client before the gateway checks the name and path as gRPC's
 * LoadAdapter/UnloadAdapter do (daemon/http.c; docs/DAEMON.md "Adapters over HTTP").
 */
#ifndef CLOCHER_DAEMON_HTTP_LORA_H
#define CLOCHER_DAEMON_HTTP_LORA_H

#include <stdbool.h>
#include <stddef.h>

#define HTTP_LORA_NAME_MAX 128  /* bytes with the NUL; the gateway allows 63 */
#define HTTP_LORA_PATH_MAX 4096 /* bytes with the NUL; the gateway allows SHM_MAX_PATH */

struct http_lora_req {
    char name[HTTP_LORA_NAME_MAX];
    char path[HTTP_LORA_PATH_MAX]; /* "" when unloading */
};

/*
 * Reads body[len]: a JSON object (duplicate keys refused) with a non-empty string "lora_name"
 * and, when load, "lora_path"; other members are ignored, as vLLM ignores them. 0 and *out, or
 * ERR_FORMAT with the member at fault in param ("" for the body itself) and a message naming
 * it in msg. Never logs: the HTTP reply carries the message.
 */
int http_lora_parse(const char *body, size_t len, bool load, struct http_lora_req *out,
                    char *param, size_t param_cap, char *msg, size_t msg_cap);

#endif
