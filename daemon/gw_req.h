/*
 * gw_req.h — a GenerateRequest as the gateway received it, checked against the daemon's limits
 * and the caller's rights, turned into the GENERATE record a worker runs (shm/msg.h).
 *
 * Pure (no gRPC, no threads) so the fuzzer and the unit tests drive it directly: every field a
 * client controls is checked here, and each refusal is a gRPC status code with a message that
 * names the field ("sampling.top_p: 1.5 is outside (0, 1]"). What only the worker can check
 * (the prompt's length in tokens, token ids against the vocabulary) it checks, and its ERROR
 * record comes back as INVALID_ARGUMENT naming the prompt.
 */
#ifndef CLOCHER_DAEMON_GW_REQ_H
#define CLOCHER_DAEMON_GW_REQ_H

#include "config.h"
#include "msg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clocher/v1/inference.pb-c.h"

#define GW_REQ_MAX_TEMPERATURE 1e6f /* and repetition_penalty: the sampler's upper bound */
#define GW_REQ_DEFAULT_MAX_TOKENS 256u  /* max_tokens 0/unset, capped by limits.max_tokens */
#define GW_REQ_DEFAULT_TEMPERATURE 0.8f
#define GW_REQ_DEFAULT_REPEAT_WINDOW 64u
#define GW_REQ_MAX_REQUEST_ID 128u      /* bytes of a client's request_id */

/* Whether an adapter of that name is loaded (the gateway's registry). */
typedef bool gw_req_adapter_known_fn(void *ud, const char *name);

struct gw_req_ctx {
    const struct config *cfg;
    const struct config_tenant *tenant; /* NULL = anonymous access: every adapter allowed */
    uint64_t tenant_id;
    const char *model_name;             /* the served model's name; NULL = not known yet */
    gw_req_adapter_known_fn *adapter_known; /* NULL = every name counts as loaded */
    void *ud;
    uint64_t seed;                      /* used when the request gives none */
    uint64_t deadline_ns;               /* CLOCK_MONOTONIC, 0 = none (from the call) */
};

/*
 * Checks r and fills *out (a view into r: r must outlive it; request_id is left 0 for the
 * caller). 0 (GRPC_STATUS_OK) or the gRPC status code to end the call with, msg[cap] saying
 * why: INVALID_ARGUMENT (a missing or out-of-range field), NOT_FOUND (an adapter unknown or not
 * allowed to this tenant: the same message for both, on purpose).
 */
int gw_req_generate(const Clocher__V1__GenerateRequest *r, const struct gw_req_ctx *ctx,
                    struct shm_msg_generate *out, char *msg, size_t cap);

/*
 * Whether a text field of a serialized request holds a NUL byte, which protobuf-c's unpacking
 * (C strings) would silently cut the text at: field `field` (length-delimited) of the message
 * in buf[len], or with sub != 0, field `sub` of every message in field `field` (a batch's
 * prompts). 1: a NUL; 0: none; ERR_FORMAT: the bytes are not a protobuf message. Reads only
 * within buf; the same field given twice is checked in each (protobuf keeps the last).
 */
int gw_req_text_nul(const uint8_t *buf, size_t len, uint32_t field, uint32_t sub);

/*
 * Whether any string field of the serialized message d in buf[len] holds a NUL byte, at any
 * depth (sub-messages by their descriptors, each element of a repeated one): a chat's content,
 * role, channel, recipient as much as a prompt. 1 with where[cap] naming the field
 * ("chat.messages[2].content"); 0: none; ERR_FORMAT: the bytes are not a protobuf message
 * (nesting deeper than 16 included). Reads only within buf; unknown fields are skipped.
 */
int gw_req_strings_nul(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *d,
                       char *where, size_t cap);

/* Whether s is an adapter or tenant name the wire accepts: 1..63 bytes of [A-Za-z0-9._-]. */
bool gw_req_name_ok(const char *s);

/* The gRPC status code a worker's ERROR code becomes. */
int gw_req_status_of_error(int32_t code);

#endif
