/*
 * gw_req.c — GenerateRequest → GENERATE record, every client-controlled field checked
 * (see gw_req.h).
 */
#include "gw_req.h"

#include "gencfg.h"

#include "err.h"

#include <errno.h>
#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

__attribute__((format(printf, 4, 5)))
static int refuse(char *msg, size_t cap, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return status;
}

#define INVALID(...) refuse(msg, cap, GRPC_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

bool gw_req_name_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return false;
        if (n >= SHM_MAX_NAME)
            return false;
    }
    return n > 0;
}

int gw_req_status_of_error(int32_t code)
{
    switch (code) {
    case ERR_FORMAT:
    case ERR_RANGE:
    case ERR_USAGE:
    case ERR_TRUNCATED:
    case ERR_OVERFLOW:
    case -EINVAL: return GRPC_STATUS_INVALID_ARGUMENT;
    case -ENOTDIR:
    case -EISDIR: return GRPC_STATUS_INVALID_ARGUMENT;
    case ERR_NOT_FOUND:
    case -ENOENT: return GRPC_STATUS_NOT_FOUND;
    case ERR_OVERLOADED:
    case -EAGAIN: return GRPC_STATUS_UNAVAILABLE;
    case -ENOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case ERR_UNSUPPORTED:
    case ERR_STATE:
    case ERR_MISMATCH: return GRPC_STATUS_FAILED_PRECONDITION;
    case ERR_DEADLINE: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case ERR_CANCELLED: return GRPC_STATUS_CANCELLED;
    default: return GRPC_STATUS_INTERNAL;
    }
}

/* A float field the client may leave out: its value, or the default. */
static float opt(protobuf_c_boolean has, float v, float def) { return has ? v : def; }

int gw_req_generate(const Clocher__V1__GenerateRequest *r, const struct gw_req_ctx *ctx,
                    struct shm_msg_generate *out, char *msg, size_t cap)
{
    const struct config_limits *lim = &ctx->cfg->limits;
    memset(out, 0, sizeof *out);
    msg[0] = '\0';

    if (r->model && r->model[0] && ctx->model_name && strcmp(r->model, ctx->model_name) != 0)
        return refuse(msg, cap, GRPC_STATUS_NOT_FOUND, "model: \"%.64s\" is not served here "
                      "(this daemon serves \"%s\"; \"\" means it)", r->model, ctx->model_name);
    if (r->request_id && strlen(r->request_id) > GW_REQ_MAX_REQUEST_ID)
        return INVALID("request_id: longer than %u bytes", GW_REQ_MAX_REQUEST_ID);

    /* ---- the prompt ---- */
    switch (r->input_case) {
    case CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT: {
        size_t n = r->prompt ? strlen(r->prompt) : 0;
        if (n == 0)
            return INVALID("prompt: empty");
        /* bounded here: the worker tokenizes on its engine's thread */
        if (n > lim->max_prompt_bytes)
            return INVALID("prompt: %zu bytes, the limit is %" PRIu32 " (limits.max_prompt_bytes)",
                           n, lim->max_prompt_bytes);
        out->prompt_text = r->prompt;
        out->prompt_text_len = (uint32_t)n;
        if (!r->has_add_bos || r->add_bos)
            out->flags |= SHM_GEN_ADD_BOS;
        break;
    }
    case CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS: {
        const Clocher__V1__TokenIds *t = r->prompt_ids;
        if (!t || t->n_ids == 0)
            return INVALID("prompt_ids: empty");
        if (t->n_ids > lim->max_prompt_tokens)
            return INVALID("prompt_ids: %zu tokens, the limit is %" PRIu32, t->n_ids,
                           lim->max_prompt_tokens);
        for (size_t i = 0; i < t->n_ids; i++)
            if (t->ids[i] < 0)
                return INVALID("prompt_ids: token %zu is %" PRId32 ", ids are >= 0", i,
                               t->ids[i]);
        out->prompt_ids = t->ids;
        out->n_prompt_ids = (uint32_t)t->n_ids;
        break;
    }
    default:
        return INVALID("prompt: missing (give prompt or prompt_ids)");
    }

    /* ---- the adapter ---- */
    const char *ad = r->adapter && r->adapter[0] ? r->adapter : NULL;
    if (ad) {
        if (!gw_req_name_ok(ad))
            return INVALID("adapter: \"%.64s\" is not a valid name (1..%u of [A-Za-z0-9._-])",
                           ad, SHM_MAX_NAME);
        if ((ctx->tenant && !config_tenant_allows(ctx->tenant, ad)) ||
            (ctx->adapter_known && !ctx->adapter_known(ctx->ud, ad)))
            return refuse(msg, cap, GRPC_STATUS_NOT_FOUND, "adapter: %s: not found", ad);
    }
    out->adapter = ad;
    out->adapter_scale = opt(r->has_adapter_scale, r->adapter_scale, 1.0f);
    if (!isfinite(out->adapter_scale))
        return INVALID("adapter_scale: not a finite number");
    if (!ad && r->has_adapter_scale && out->adapter_scale != 1.0f)
        return INVALID("adapter_scale: given without an adapter");

    /* ---- sampling ---- */
    const Clocher__V1__SamplingParams *s = r->sampling;
    out->temperature = s ? opt(s->has_temperature, s->temperature, GW_REQ_DEFAULT_TEMPERATURE)
                         : GW_REQ_DEFAULT_TEMPERATURE;
    out->top_p = s ? opt(s->has_top_p, s->top_p, 1.0f) : 1.0f;
    out->min_p = s ? opt(s->has_min_p, s->min_p, 0.0f) : 0.0f;
    out->repeat_penalty = s ? opt(s->has_repetition_penalty, s->repetition_penalty, 1.0f) : 1.0f;
    out->top_k = s && s->has_top_k ? s->top_k : 0;
    out->seed = s && s->has_seed ? s->seed : ctx->seed;
    out->repeat_window = GW_REQ_DEFAULT_REPEAT_WINDOW;
    if (ctx->cfg) /* the model's generation_config where the request is silent (gencfg.h) */
        gencfg_apply(&ctx->cfg->model_sampling, s, out);
    /* the sampler's own range (worker/model/sampler.c), checked here where it can be named */
    if (!isfinite(out->temperature) || out->temperature < 0)
        return INVALID("sampling.temperature: %g must be a finite number >= 0",
                       (double)out->temperature);
    if (out->temperature > GW_REQ_MAX_TEMPERATURE)
        return INVALID("sampling.temperature: %g is above the limit %g (0 = greedy)",
                       (double)out->temperature, (double)GW_REQ_MAX_TEMPERATURE);
    if (!isfinite(out->top_p) || !(out->top_p > 0 && out->top_p <= 1))
        return INVALID("sampling.top_p: %g is outside (0, 1]", (double)out->top_p);
    if (!isfinite(out->min_p) || !(out->min_p >= 0 && out->min_p < 1))
        return INVALID("sampling.min_p: %g is outside [0, 1)", (double)out->min_p);
    if (!isfinite(out->repeat_penalty) || !(out->repeat_penalty > 0))
        return INVALID("sampling.repetition_penalty: %g must be a finite number > 0",
                       (double)out->repeat_penalty);
    if (out->repeat_penalty > GW_REQ_MAX_TEMPERATURE)
        return INVALID("sampling.repetition_penalty: %g is above the limit %g",
                       (double)out->repeat_penalty, (double)GW_REQ_MAX_TEMPERATURE);

    /* ---- length, stops, priority ---- */
    if (r->has_max_tokens && r->max_tokens > lim->max_tokens)
        return INVALID("max_tokens: %" PRIu32 " exceeds the limit %" PRIu32, r->max_tokens,
                       lim->max_tokens);
    out->max_tokens = r->has_max_tokens && r->max_tokens ? r->max_tokens
                      : GW_REQ_DEFAULT_MAX_TOKENS < lim->max_tokens ? GW_REQ_DEFAULT_MAX_TOKENS
                                                                    : lim->max_tokens;
    if (r->n_stop > SHM_MAX_STOP)
        return INVALID("stop: %zu strings, the limit is %u", r->n_stop, SHM_MAX_STOP);
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t n = r->stop[i] ? strlen(r->stop[i]) : 0;
        if (n == 0 || n > SHM_MAX_STOP_LEN)
            return INVALID("stop[%zu]: %s", i, n ? "longer than 256 bytes" : "empty");
        out->stop[i] = r->stop[i];
    }
    out->n_stop = (uint32_t)r->n_stop;
    switch (r->has_priority ? (int)r->priority : CLOCHER__V1__PRIORITY__PRIORITY_NORMAL) {
    case CLOCHER__V1__PRIORITY__PRIORITY_NORMAL: out->priority = SHM_PRIO_NORMAL; break;
    case CLOCHER__V1__PRIORITY__PRIORITY_HIGH: out->priority = SHM_PRIO_HIGH; break;
    case CLOCHER__V1__PRIORITY__PRIORITY_LOW: out->priority = SHM_PRIO_LOW; break;
    default: return INVALID("priority: %d is not a Priority value", (int)r->priority);
    }
    /* ---- log-probabilities (OpenAI's bounds) ---- */
    if (r->has_top_logprobs && r->top_logprobs > SHM_MAX_TOP_LOGPROBS)
        return INVALID("top_logprobs: %" PRIu32 " exceeds %u", r->top_logprobs,
                       SHM_MAX_TOP_LOGPROBS);
    out->logprobs = r->has_logprobs && r->logprobs;
    if (r->has_top_logprobs && r->top_logprobs && !out->logprobs)
        return INVALID("top_logprobs: %" PRIu32 " needs logprobs: true", r->top_logprobs);
    out->top_logprobs = out->logprobs && r->has_top_logprobs ? r->top_logprobs : 0;
    out->tenant_id = ctx->tenant_id;
    out->deadline_ns = ctx->deadline_ns;
    return GRPC_STATUS_OK;
}

/* ---- NUL bytes in text fields ---- */

/* A base-128 varint at *p (< end): 0 and *p past it, or ERR_FORMAT. */
static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return ERR_FORMAT;
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return ERR_FORMAT;
}

/* The next field of a message at *p (< end): its number, wire type and, for a length-delimited
 * one, its bytes (*data, *n). 0 and *p past it, or ERR_FORMAT. Field number 0 is invalid
 * protobuf, but protobuf-c unpacks it as an unknown field, and the walk must refuse no less
 * than what the gateway then reads (fuzz_req_nul found one): it is skipped like any unknown. */
static int next_field(const uint8_t **p, const uint8_t *end, uint32_t *num, unsigned *wire,
                      const uint8_t **data, size_t *n)
{
    uint64_t key, v;
    if (varint(p, end, &key) < 0 || (key >> 3) > UINT32_MAX)
        return ERR_FORMAT;
    *num = (uint32_t)(key >> 3), *wire = (unsigned)(key & 7), *data = NULL, *n = 0;
    switch (*wire) {
    case 0: return varint(p, end, &v);
    case 1:
        if (end - *p < 8)
            return ERR_FORMAT;
        *p += 8;
        return 0;
    case 5:
        if (end - *p < 4)
            return ERR_FORMAT;
        *p += 4;
        return 0;
    case 2:
        if (varint(p, end, &v) < 0 || v > (uint64_t)(end - *p))
            return ERR_FORMAT;
        *data = *p, *n = (size_t)v;
        *p += v;
        return 0;
    default: return ERR_FORMAT; /* groups (3, 4) are not in our messages */
    }
}

int gw_req_text_nul(const uint8_t *buf, size_t len, uint32_t field, uint32_t sub)
{
    const uint8_t *p = buf, *end = buf + len;
    while (p < end) {
        uint32_t num;
        unsigned wire;
        const uint8_t *data;
        size_t n;
        if (next_field(&p, end, &num, &wire, &data, &n) < 0)
            return ERR_FORMAT;
        if (wire == 2 && num == field) {
            int rc = sub ? gw_req_text_nul(data, n, sub, 0) : memchr(data, 0, n) != NULL;
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

#define STRINGS_MAX_DEPTH 16 /* our messages nest 3 deep; a recursive type would stop here */

static int strings_nul(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *d,
                       unsigned depth, char *where, size_t cap)
{
    if (depth > STRINGS_MAX_DEPTH)
        return ERR_FORMAT;
    unsigned seen[64] = {0}; /* occurrences per field index: a repeated field's element index */
    const uint8_t *p = buf, *end = buf + len;
    while (p < end) {
        uint32_t num;
        unsigned wire;
        const uint8_t *data;
        size_t n;
        if (next_field(&p, end, &num, &wire, &data, &n) < 0)
            return ERR_FORMAT;
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, num);
        if (wire != 2 || !f ||
            (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE))
            continue; /* unknown fields and packed numbers hold no C string */
        size_t fi = (size_t)(f - d->fields);
        unsigned idx = fi < 64 ? seen[fi]++ : 0;
        char here[96];
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
            snprintf(here, sizeof here, "%s[%u]", f->name, idx);
        else
            snprintf(here, sizeof here, "%s", f->name);
        int rc = f->type == PROTOBUF_C_TYPE_STRING
                     ? memchr(data, 0, n) != NULL
                     : strings_nul(data, n, f->descriptor, depth + 1, where, cap);
        if (rc != 0) {
            if (rc == 1 && cap) {
                /* prefix this level's name to what the deeper level wrote */
                char tail[256];
                snprintf(tail, sizeof tail, "%s", f->type == PROTOBUF_C_TYPE_STRING ? "" : where);
                snprintf(where, cap, "%s%s%s", here, tail[0] ? "." : "", tail);
            }
            return rc;
        }
    }
    return 0;
}

int gw_req_strings_nul(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *d,
                       char *where, size_t cap)
{
    if (cap)
        where[0] = 0;
    return strings_nul(buf, len, d, 0, where, cap);
}
