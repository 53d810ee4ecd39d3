/*
 * http.c — the OpenAI-compatible API (contract: http.h): routes, the request's life
 * (body -> checked request -> gateway call -> JSON reply or SSE stream), error objects.
 *
 * Life of a generation request (struct hreq, MHD's per-connection closure):
 *   BODY: the handler accumulates the upload (at most http.max_body_bytes, else 413);
 *   ADMIT: the whole body came: the connection waits for the loop's next whole turn
 *         (http_srv_defer) before the request is checked and admitted. A SIGTERM delivered
 *         before the request was read has written libuv's signal pipe, but libuv may run
 *         MHD's watcher first (the same turn) or the pipe's event may only come in the next
 *         turn: admitting at once took a generation after the drain began, which then ran
 *         to its end while its client was owed a 503 (tests/http's draining test, under
 *         ASan). After the next whole turn the signal's watcher has run;
 *   WAIT: the call is submitted (gw_ext_generate) and the connection suspended; each wake-up
 *         from the gateway resumes it and the handler looks again: an error becomes the error
 *         object, a finished non-streamed call its reply, a streamed one's first output starts
 *         the SSE response (so a prompt too long is a 413, not an error inside a 200 stream);
 *   STREAM: MHD pulls the body through sse_reader, which suspends when nothing is pending.
 * A client that hangs up while suspended is noticed by http_srv's watch (gone()): the call is
 * released at once (the workers cancel it, freeing its KV blocks); one gone while MHD is
 * writing ends the request, and the completion callback releases it.
 */
#include "http.h"

#include "auth.h"
#include "config.h"
#include "err.h"
#include "gw_internal.h"
#include "http_lora.h"
#include "http_oai.h"
#include "http_srv.h"
#include "log.h"
#include "mono.h"
#include "workers.h"

#include <errno.h>
#include <grpc/status.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"

#define HTTP_MAGIC 0x48545450u /* "HTTP" */

struct http {
    uint32_t magic;
    struct workers *w;
    struct gw *g;
    struct http_srv *srv;
    uint32_t max_body;
};

enum hreq_route { R_NONE, R_COMPLETIONS, R_CHAT, R_LOAD_LORA, R_UNLOAD_LORA };
enum hreq_phase { P_BODY, P_ADMIT, P_WAIT, P_STREAM, P_ANSWERED };

/* One choice of a reply: the text taken from the gateway so far. */
struct choice {
    char *text;
    size_t len, cap;
    size_t sent;           /* bytes of text already streamed */
    char *rtext;           /* chat: the analysis channel (reasoning_content) */
    size_t rlen, rcap, rsent;
    struct gw_ext_state st;
    bool role_sent, final_sent;
    /* logprobs requests: the entries not yet sent, in the reply's own shape (chat:
     * {"content": [...]}; completions: {"tokens", "token_logprobs", "top_logprobs",
     * "text_offset"}), and the completion's bytes so far (text_offset) */
    json_t *lp;
    size_t lp_off;
    /* chat tools: the reply's tool_calls so far (whole), and, streamed, the deltas not yet
     * sent (http_oai_tool_call's shapes) */
    json_t *calls, *call_deltas;
};

struct hreq {
    struct http_srv_susp susp; /* first: gone() gets it */
    struct http *h;
    enum hreq_route route;
    enum hreq_phase phase;
    char *body;
    size_t body_len, body_cap;
    bool too_big;
    struct http_oai_req req;
    struct gw_call *call;
    bool gone;
    struct choice *choices;
    char id[40];
    char model[128];
    time_t created;
    /* SSE output not yet handed to MHD */
    char *out;
    size_t out_len, out_off, out_cap;
    bool done_sent;
};

/* ---- responses ---- */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *ctype,
                             char *body, size_t len, const char *retry_after)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_json(struct MHD_Connection *conn, unsigned status, json_t *j,
                                  const char *retry_after)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return MHD_NO;
    return reply(conn, status, "application/json", s, strlen(s), retry_after);
}

static const char *error_type(unsigned status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 500: return "server_error";
    default: return "invalid_request_error";
    }
}

static json_t *error_object(unsigned status, const char *param, const char *code,
                            const char *msg)
{
    json_t *e = json_pack("{s:s, s:s}", "message", msg, "type", error_type(status));
    if (!e)
        return NULL;
    json_object_set_new(e, "param", param && *param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    return json_pack("{s:o}", "error", e);
}

/* OpenAI's error object: {"error": {"message", "type", "param", "code"}}. */
__attribute__((format(printf, 5, 6)))
static enum MHD_Result reply_error(struct MHD_Connection *conn, unsigned status,
                                   const char *param, const char *code, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply_json(conn, status, error_object(status, param, code, msg),
                      status == 429 ? "1" : NULL);
}

/* The parameter a gateway message names ("sampling.top_p: ..." -> "top_p"). */
static void param_of(const char *msg, bool chat, char *out, size_t cap)
{
    size_t n = strcspn(msg, ":[ ");
    snprintf(out, cap, "%.*s", (int)n, msg);
    if (strncmp(out, "sampling.", 9) == 0)
        memmove(out, out + 9, strlen(out + 9) + 1);
    if (strcmp(out, "prompt") == 0 && chat)
        snprintf(out, cap, "messages");
    else if (strcmp(out, "chat.messages") == 0)
        snprintf(out, cap, "messages");
    else if (strcmp(out, "adapter") == 0)
        snprintf(out, cap, "model");
    else if (strcmp(out, "prompt_ids") == 0)
        snprintf(out, cap, "prompt");
}

/* A gateway status as an HTTP error. */
static enum MHD_Result reply_status(struct hreq *r, struct MHD_Connection *conn, int st,
                                    const char *msg)
{
    char param[64];
    bool chat = r->route == R_CHAT;
    switch (st) {
    case GRPC_STATUS_INVALID_ARGUMENT:
        param_of(msg, chat, param, sizeof param);
        if (strcmp(param, chat ? "messages" : "prompt") == 0 && strstr(msg, "the limit is"))
            return reply_error(conn, 413, param, "context_length_exceeded", "%s", msg);
        return reply_error(conn, 400, param, NULL, "%s",
                           strncmp(msg, "sampling.", 9) == 0 ? msg + 9 : msg);
    case GRPC_STATUS_NOT_FOUND:
        return reply_error(conn, 404, "model", "model_not_found",
                           "The model `%s` does not exist or you do not have access to it.",
                           r->model);
    case GRPC_STATUS_UNAUTHENTICATED:
        return reply_error(conn, 401, NULL, "invalid_api_key", "%s", msg);
    case GRPC_STATUS_PERMISSION_DENIED: return reply_error(conn, 403, NULL, NULL, "%s", msg);
    case GRPC_STATUS_FAILED_PRECONDITION:
        /* the model cannot serve this request (a chat without a template) */
        return reply_error(conn, 400, chat ? "messages" : NULL, NULL, "%s", msg);
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return reply_error(conn, 429, NULL, "rate_limit_exceeded", "%s", msg);
    case GRPC_STATUS_UNAVAILABLE:
        /* draining, or no worker up: 503; a full queue or ring: 429, retry soon */
        if (!atomic_load(&r->h->g->accepting) || strstr(msg, "draining") ||
            strstr(msg, "no worker") || strstr(msg, "stopping"))
            return reply_error(conn, 503, NULL, NULL, "%s", msg);
        return reply_error(conn, 429, NULL, "rate_limit_exceeded", "%s", msg);
    default: return reply_error(conn, 500, NULL, NULL, "%s", msg);
    }
}

/* ---- GET /v1/models ---- */

static enum MHD_Result do_models(struct http *h, struct MHD_Connection *conn,
                                 const struct config_tenant *t)
{
    struct gw_model_info mi;
    if (!gw__model(h->g, &mi))
        return reply_error(conn, 503, NULL, NULL, "no worker has loaded the model yet");
    json_t *data = json_array();
    json_t *root = json_pack("{s:s, s:o}", "object", "list", "data", data);
    if (!root)
        return MHD_NO;
    json_int_t now = (json_int_t)time(NULL);
    json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", mi.name, "object",
                                          "model", "created", now, "owned_by", "clocher",
                                          "max_model_len", (json_int_t)mi.context_length));
    struct gw *g = h->g;
    pthread_mutex_lock(&g->adapters_mu);
    for (size_t i = 0; i < g->n_adapters; i++) {
        const struct gw_adapter *a = &g->adapters[i];
        if (a->unloaded || (t && !config_tenant_allows(t, a->name)))
            continue;
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", a->name,
                                              "object", "model", "created", now, "owned_by",
                                              "clocher", "parent", mi.name, "root",
                                              a->name));
    }
    pthread_mutex_unlock(&g->adapters_mu);
    return reply_json(conn, 200, root, NULL);
}

/* ---- generation replies ---- */

static const char *finish_reason(const struct gw_ext_state *st)
{
    if (!st->finished)
        return NULL;
    if ((int)st->fin.reason == GW_FINISH_TOOL_CALL)
        return "tool_calls";
    return st->fin.reason == SHM_FINISH_LENGTH || st->fin.reason == SHM_FINISH_CONTEXT
               ? "length" : "stop";
}

static json_t *usage_of(const struct hreq *r)
{
    uint64_t completion = 0;
    for (size_t i = 0; i < r->req.n; i++)
        completion += r->choices[i].st.fin.completion_tokens;
    const struct shm_msg_finish *f = &r->choices[0].st.fin;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)f->prompt_tokens,
                     "completion_tokens", (json_int_t)completion, "total_tokens",
                     (json_int_t)(f->prompt_tokens + completion), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)f->cached_tokens);
}

static json_t *text_value(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    return v ? v : json_string("\xef\xbf\xbd"); /* not UTF-8: never expected from a worker */
}

static json_t *envelope(const struct hreq *r, bool chunk)
{
    const char *object = r->route == R_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                            : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", r->id, "object", object, "created",
                     (json_int_t)r->created, "model", r->model, "choices");
}

/* ---- logprobs ---- */

/* A token's piece as a JSON string: its text when it is UTF-8, else OpenAI's spelling of raw
 * bytes ("bytes:\\xe2\\x80"; chat's `bytes` array carries them exactly). */
static json_t *piece_string(const char *p, size_t n)
{
    json_t *v = json_stringn(p, n);
    if (v)
        return v;
    char buf[6 + 4 * 256 + 1];
    size_t k = (size_t)snprintf(buf, sizeof buf, "bytes:");
    for (size_t i = 0; i < n && k + 5 < sizeof buf; i++) {
        unsigned char b = (unsigned char)p[i];
        k += (size_t)snprintf(buf + k, sizeof buf - k, b < 0x80 && b >= 0x20 ? "%c" : "\\x%02x",
                              b);
    }
    return json_string(buf);
}

static json_t *piece_bytes(const char *p, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* An empty entry list in the reply's shape. */
static json_t *lp_new(const struct hreq *r)
{
    return r->route == R_CHAT ? json_pack("{s:[]}", "content")
                              : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                                          "top_logprobs", "text_offset");
}

/* Appends the logprobs item i took (lps[n], pieces in bytes) to its choice's entries. */
static int lp_add(struct hreq *r, struct choice *c, const struct gw_lp *lps, size_t n,
                  const char *bytes)
{
    if (!c->lp && !(c->lp = lp_new(r)))
        return -ENOMEM;
    for (size_t k = 0; k < n; k++) {
        const struct gw_lp *l = &lps[k];
        const char *own = bytes + l->own.off;
        if (r->route == R_CHAT) {
            json_t *tops = json_array();
            for (uint32_t j = 0; tops && j < l->n_top; j++) {
                const char *tp = bytes + l->top[j].off;
                json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token",
                                                      piece_string(tp, l->top[j].len), "logprob",
                                                      (double)l->top[j].logprob, "bytes",
                                                      piece_bytes(tp, l->top[j].len)));
            }
            json_t *e = json_pack("{s:o, s:f, s:o, s:o}", "token",
                                  piece_string(own, l->own.len), "logprob",
                                  (double)l->own.logprob, "bytes", piece_bytes(own, l->own.len),
                                  "top_logprobs", tops ? tops : json_array());
            if (!e || json_array_append_new(json_object_get(c->lp, "content"), e) < 0)
                return -ENOMEM;
            continue;
        }
        json_t *top = json_object();
        for (uint32_t j = 0; top && j < l->n_top; j++) {
            json_t *key = piece_string(bytes + l->top[j].off, l->top[j].len);
            if (key && !json_object_get(top, json_string_value(key))) /* pieces may repeat */
                json_object_set_new(top, json_string_value(key),
                                    json_real((double)l->top[j].logprob));
            json_decref(key);
        }
        if (!top || json_array_append_new(json_object_get(c->lp, "tokens"),
                                          piece_string(own, l->own.len)) < 0 ||
            json_array_append_new(json_object_get(c->lp, "token_logprobs"),
                                  json_real((double)l->own.logprob)) < 0 ||
            json_array_append_new(json_object_get(c->lp, "top_logprobs"), top) < 0 ||
            json_array_append_new(json_object_get(c->lp, "text_offset"),
                                  json_integer((json_int_t)c->lp_off)) < 0)
            return -ENOMEM;
        c->lp_off += l->own.len;
    }
    return 0;
}

/* Whether a choice's entry list holds entries. */
static bool lp_pending(const struct hreq *r, const struct choice *c)
{
    return c->lp && json_array_size(json_object_get(c->lp, r->route == R_CHAT ? "content"
                                                                             : "tokens")) > 0;
}

/* The "logprobs" value of a reply or chunk: the pending entries (moved out), null when the
 * request did not ask, an empty list when it did and none are pending. */
static json_t *lp_take(const struct hreq *r, struct choice *c)
{
    if (!r->req.logprobs)
        return json_null();
    json_t *v = c->lp ? c->lp : lp_new(r);
    c->lp = NULL;
    return v;
}

static enum MHD_Result reply_complete(struct hreq *r, struct MHD_Connection *conn)
{
    json_t *root = envelope(r, false);
    if (!root)
        return MHD_NO;
    json_t *choices = json_object_get(root, "choices");
    for (size_t i = 0; i < r->req.n; i++) {
        struct choice *c = &r->choices[i];
        json_t *ch = json_pack("{s:I, s:s?, s:o}", "index", (json_int_t)i, "finish_reason",
                               finish_reason(&c->st), "logprobs", lp_take(r, c));
        if (r->route == R_CHAT) {
            json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                  text_value(c->text ? c->text : "", c->len));
            if (m && c->rlen) /* vLLM's convention for the analysis channel */
                json_object_set_new(m, "reasoning_content", text_value(c->rtext, c->rlen));
            if (m && c->calls && json_array_size(c->calls)) { /* chat tools */
                json_object_set(m, "tool_calls", c->calls);
                if (!c->len)
                    json_object_set_new(m, "content", json_null()); /* OpenAI's shape */
            }
            json_object_set_new(ch, "message", m);
        }
        else
            json_object_set_new(ch, "text", text_value(c->text ? c->text : "", c->len));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(root, "usage", usage_of(r));
    return reply_json(conn, 200, root, NULL);
}

/* chat tools: the pieces of tool calls a take brought, into c's calls (whole: a piece that
 * does not open its call extends the arguments of the one it continues) and, streamed, deltas */
static int add_calls(struct hreq *r, struct choice *c, struct gw_ext_call *calls, size_t n)
{
    int rc = 0;
    if (!c->calls && !(c->calls = json_array()))
        rc = -ENOMEM;
    if (!rc && r->req.stream && !c->call_deltas && !(c->call_deltas = json_array()))
        rc = -ENOMEM;
    for (size_t k = 0; k < n; k++) {
        struct gw_ext_call *e = &calls[k];
        json_t *whole = json_array_get(c->calls, e->index);
        if (!rc && (e->opens || !whole)) {
            if (json_array_append_new(c->calls, http_oai_tool_call(e->index, false, true, e->id,
                                                                   e->name, e->args,
                                                                   e->args_len)) < 0)
                rc = -ENOMEM;
        } else if (!rc) {
            json_t *fn = json_object_get(whole, "function");
            const char *old = json_string_value(json_object_get(fn, "arguments"));
            size_t ol = json_string_length(json_object_get(fn, "arguments"));
            char *cat = malloc(ol + e->args_len + 1);
            if (!cat) {
                rc = -ENOMEM;
            } else {
                memcpy(cat, old ? old : "", ol);
                memcpy(cat + ol, e->args, e->args_len + 1);
                json_object_set_new(fn, "arguments", json_stringn(cat, ol + e->args_len));
                free(cat);
            }
        }
        if (!rc && r->req.stream &&
            json_array_append_new(c->call_deltas, http_oai_tool_call(e->index, true, e->opens,
                                                                     e->id, e->name, e->args,
                                                                     e->args_len)) < 0)
            rc = -ENOMEM;
        free(e->args);
    }
    free(calls);
    return rc;
}

/* Takes what every choice has produced. */
static int take_all(struct hreq *r)
{
    atomic_store(&r->susp.wake, false);
    for (size_t i = 0; i < r->req.n; i++) {
        struct choice *c = &r->choices[i];
        struct gw_ext_call *calls = NULL;
        size_t n_calls = 0;
        if ((r->route == R_CHAT ? gw_ext_take_chat_calls(r->call, i, &c->text, &c->len, &c->cap,
                                                         &c->rtext, &c->rlen, &c->rcap, &calls,
                                                         &n_calls, &c->st)
                                : gw_ext_take(r->call, i, &c->text, &c->len, &c->cap, &c->st)) < 0 ||
            (n_calls && add_calls(r, c, calls, n_calls) < 0))
            return -ENOMEM;
        if (r->req.logprobs) {
            struct gw_lp *lps;
            size_t n;
            char *bytes;
            gw_ext_take_logprobs(r->call, i, &lps, &n, &bytes);
            int rc = n ? lp_add(r, c, lps, n, bytes) : 0;
            free(lps), free(bytes);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* ---- SSE ---- */

static int out_add(struct hreq *r, const char *s, size_t n)
{
    if (r->out_len + n > r->out_cap) {
        size_t nc = r->out_cap ? r->out_cap : 1024;
        while (nc < r->out_len + n)
            nc *= 2;
        char *p = realloc(r->out, nc);
        if (!p)
            return -ENOMEM;
        r->out = p, r->out_cap = nc;
    }
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
    return 0;
}

static int out_event(struct hreq *r, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return -ENOMEM;
    int rc = out_add(r, "data: ", 6);
    if (!rc)
        rc = out_add(r, s, strlen(s));
    if (!rc)
        rc = out_add(r, "\n\n", 2);
    free(s);
    return rc;
}

/* One chunk of choice i: its new text and/or its finish reason. */
static json_t *chunk_of(struct hreq *r, size_t i, const char *text, size_t n, bool role,
                        const char *finish, const char *rtext, size_t rn, json_t *logprobs,
                        json_t *tool_calls)
{
    json_t *root = envelope(r, true);
    json_t *ch = json_pack("{s:I, s:s?, s:o}", "index", (json_int_t)i, "finish_reason", finish,
                           "logprobs", logprobs ? logprobs : json_null());
    if (!root || !ch) {
        json_decref(root), json_decref(ch);
        return NULL;
    }
    if (r->route == R_CHAT) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (n || role)
            json_object_set_new(delta, "content", text_value(text, n));
        if (rn)
            json_object_set_new(delta, "reasoning_content", text_value(rtext, rn));
        if (tool_calls) /* chat tools: OpenAI's streamed tool_calls deltas */
            json_object_set_new(delta, "tool_calls", tool_calls);
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", text_value(text, n));
    }
    json_array_append_new(json_object_get(root, "choices"), ch);
    return root;
}

/* Turns what the choices have into events (out). */
static int sse_fill(struct hreq *r)
{
    int rc = take_all(r);
    bool all_final = true;
    for (size_t i = 0; !rc && i < r->req.n; i++) {
        struct choice *c = &r->choices[i];
        if (c->final_sent)
            continue;
        bool role = r->route == R_CHAT && !c->role_sent;
        bool calls = c->call_deltas && json_array_size(c->call_deltas);
        if (c->len > c->sent || c->rlen > c->rsent || role || lp_pending(r, c) || calls) {
            /* no text yet is "" (a chat's first pieces may all be reasoning or headers) */
            json_t *deltas = calls ? c->call_deltas : NULL;
            if (calls)
                c->call_deltas = NULL; /* the chunk takes them */
            rc = out_event(r, chunk_of(r, i, c->text ? c->text + c->sent : "", c->len - c->sent,
                                       role, NULL, c->rtext ? c->rtext + c->rsent : "",
                                       c->rlen - c->rsent, lp_take(r, c), deltas));
            c->sent = c->len;
            c->rsent = c->rlen;
            c->role_sent = true;
        }
        if (!rc && c->st.done) {
            if (c->st.status)
                rc = out_event(r, error_object(c->st.status == GRPC_STATUS_UNAVAILABLE ? 503 : 500,
                                               NULL, NULL, c->st.error));
            else
                rc = out_event(r, chunk_of(r, i, "", 0, false, finish_reason(&c->st), "", 0,
                                           NULL, NULL));
            c->final_sent = true;
        }
        all_final &= c->final_sent;
    }
    if (!rc && all_final && !r->done_sent) {
        if (r->req.include_usage) {
            json_t *u = envelope(r, true);
            if (u)
                json_object_set_new(u, "usage", usage_of(r));
            rc = out_event(r, u);
        }
        if (!rc)
            rc = out_add(r, "data: [DONE]\n\n", 14);
        r->done_sent = true;
    }
    return rc;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct hreq *r = cls;
    if (r->gone || !r->call)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (r->out_off == r->out_len) {
        r->out_off = r->out_len = 0;
        if (!r->done_sent && sse_fill(r) < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (r->out_off < r->out_len) {
        size_t n = r->out_len - r->out_off < max ? r->out_len - r->out_off : max;
        memcpy(buf, r->out + r->out_off, n);
        r->out_off += n;
        return (ssize_t)n;
    }
    if (r->done_sent)
        return MHD_CONTENT_READER_END_OF_STREAM;
    http_srv_suspend(r->h->srv, &r->susp);
    return 0;
}

/* ---- generations ---- */

#define HTTP_CHAT_MAX_MSGS SHM_MAX_CHAT_MSGS

static void on_changed(void *ud)
{
    struct hreq *r = ud;
    http_srv_wake(r->h->srv, &r->susp);
}

static void on_gone(struct http_srv_susp *s)
{
    struct hreq *r = (struct hreq *)s;
    r->gone = true;
    LOG_INFO("HTTP API: request %s: the client went away%s", r->id,
             r->call ? ": its generation is cancelled" : "");
    if (r->call) {
        gw_ext_release(r->call); /* cancels what the workers still run */
        r->call = NULL;
    }
}

static enum MHD_Result start_generation(struct hreq *r, struct MHD_Connection *conn)
{
    struct http *h = r->h;
    char param[64], msg[512];
    int rc = http_oai_parse_ex(r->body ? r->body : "", r->body_len, r->route == R_CHAT,
                               HTTP_OAI_TOOLS, &r->req, param, sizeof param, msg, sizeof msg);
    if (rc == -ENOMEM)
        return reply_error(conn, 500, NULL, NULL, "out of memory");
    if (rc < 0)
        return reply_error(conn, 400, param, rc == ERR_UNSUPPORTED ? "unsupported_parameter" : NULL,
                           "%s", msg);
    snprintf(r->model, sizeof r->model, "%s", r->req.model);
    /* the supervisor's phase turns before the gateway stops accepting: either says draining */
    int phase = atomic_load(&h->w->phase);
    if (phase == WORKERS_PHASE_DRAINING || phase == WORKERS_PHASE_STOPPING)
        return reply_error(conn, 503, NULL, NULL,
                           "the daemon is draining: it takes no new generations");
    struct gw_model_info mi;
    if (!gw__model(h->g, &mi))
        return reply_error(conn, 503, NULL, NULL, "no worker has loaded the model yet");
    /* `model` is the base model's name or an adapter's (vLLM's convention) */
    const char *adapter = strcmp(r->req.model, mi.name) == 0 ? NULL : r->req.model;
    /* a chat goes as messages: the worker renders them with its model's template (harmony
     * for gpt-oss), the one renderer both doors share */
    Clocher__V1__Chat chat = CLOCHER__V1__CHAT__INIT;
    Clocher__V1__ChatMessage cms[HTTP_CHAT_MAX_MSGS], *cmp[HTTP_CHAT_MAX_MSGS];
    if (r->route == R_CHAT) {
        if (r->req.n_msgs > HTTP_CHAT_MAX_MSGS)
            return reply_error(conn, 400, "messages", NULL, "messages: %zu, the limit is %u",
                               r->req.n_msgs, HTTP_CHAT_MAX_MSGS);
        for (size_t i = 0; i < r->req.n_msgs; i++) {
            Clocher__V1__ChatMessage m0 = CLOCHER__V1__CHAT_MESSAGE__INIT;
            cms[i] = m0, cmp[i] = &cms[i];
            cms[i].role = r->req.msgs[i].role;
            cms[i].content = r->req.msgs[i].content;
            cms[i].recipient = r->req.msgs[i].recipient;       /* chat tools */
            cms[i].tool_call_id = r->req.msgs[i].tool_call_id;
        }
        chat.n_messages = r->req.n_msgs;
        chat.messages = cmp;
        chat.tools_json = r->req.tools_json;
        if (r->req.tool_choice[0]) {
            chat.tool_choice = r->req.tool_choice;
            chat.tool_choice_function = r->req.tool_choice_function;
        }
        if (!r->req.parallel_tool_calls) /* OpenAI's parallel_tool_calls false: one call */
            chat.has_parallel_tool_calls = true, chat.parallel_tool_calls = false;
    }
    if (!(r->choices = calloc(r->req.n, sizeof *r->choices)))
        return reply_error(conn, 500, NULL, NULL, "out of memory");
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = mono_ns();
    snprintf(r->id, sizeof r->id, "%s-%016" PRIx64, r->route == R_CHAT ? "chatcmpl" : "cmpl", rnd);
    r->created = time(NULL);

    /* the request as the gRPC API would carry it: one per choice (seed + i when given) */
    Clocher__V1__GenerateRequest gr[HTTP_OAI_MAX_N], *grp[HTTP_OAI_MAX_N];
    Clocher__V1__SamplingParams sp[HTTP_OAI_MAX_N];
    Clocher__V1__TokenIds ids = CLOCHER__V1__TOKEN_IDS__INIT;
    ids.ids = r->req.prompt_ids;
    ids.n_ids = r->req.n_prompt_ids;
    for (uint32_t i = 0; i < r->req.n; i++) {
        Clocher__V1__GenerateRequest g0 = CLOCHER__V1__GENERATE_REQUEST__INIT;
        Clocher__V1__SamplingParams s0 = CLOCHER__V1__SAMPLING_PARAMS__INIT;
        gr[i] = g0, sp[i] = s0, grp[i] = &gr[i];
        if (r->route == R_CHAT) {
            gr[i].input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_CHAT;
            gr[i].chat = &chat;
        } else if (r->req.n_prompt_ids) {
            gr[i].input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS;
            gr[i].prompt_ids = &ids;
        } else {
            gr[i].input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT;
            gr[i].prompt = r->req.prompt;
        }
        gr[i].adapter = (char *)adapter;
        sp[i].has_temperature = r->req.has_temperature;
        sp[i].temperature = r->req.temperature;
        sp[i].has_top_p = r->req.has_top_p;
        sp[i].top_p = r->req.top_p;
        sp[i].has_seed = r->req.has_seed;
        sp[i].seed = r->req.seed + i;
        gr[i].sampling = &sp[i];
        gr[i].has_max_tokens = r->req.has_max_tokens;
        gr[i].max_tokens = r->req.max_tokens;
        gr[i].n_stop = r->req.n_stop;
        gr[i].stop = r->req.stop;
        gr[i].has_logprobs = gr[i].logprobs = r->req.logprobs;
        gr[i].has_top_logprobs = r->req.logprobs;
        gr[i].top_logprobs = r->req.top_logprobs;
    }
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    rc = gw_ext_generate(h->g, r->id, auth, auth ? strlen(auth) : 0, grp, r->req.n, on_changed,
                         r, &r->call);
    if (rc < 0)
        return reply_error(conn, 500, NULL, NULL, "out of memory");
    r->phase = P_WAIT;
    http_srv_suspend(h->srv, &r->susp);
    return MHD_YES;
}

/* ---- vLLM's runtime adapter endpoints ----
 * POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST /v1/unload_lora_adapter
 * {"lora_name"}: gRPC's LoadAdapter / UnloadAdapter through the gateway (gw_ext_adapter), so
 * the same tenant ACL (a tenant needs "allowed_adapters": "*": 403 otherwise), checks and
 * work; success is vLLM's plain-text line, a refusal OpenAI's error object. */

static bool adapter_route(enum hreq_route route)
{
    return route == R_LOAD_LORA || route == R_UNLOAD_LORA;
}

static enum MHD_Result start_adapter(struct hreq *r, struct MHD_Connection *conn)
{
    struct http *h = r->h;
    bool load = r->route == R_LOAD_LORA;
    struct http_lora_req q;
    char param[32], msg[512];
    if (http_lora_parse(r->body, r->body_len, load, &q, param, sizeof param, msg,
                        sizeof msg) < 0)
        return reply_error(conn, 400, param, NULL, "%s", msg);
    const char *name = q.name, *path = load ? q.path : NULL;
    snprintf(r->model, sizeof r->model, "%s", name);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = mono_ns();
    snprintf(r->id, sizeof r->id, "lora-%016" PRIx64, rnd);
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    int rc = gw_ext_adapter(h->g, r->id, auth, auth ? strlen(auth) : 0, load, name, path,
                            on_changed, r, &r->call);
    if (rc < 0)
        return reply_error(conn, 500, NULL, NULL, "out of memory");
    r->phase = P_WAIT;
    http_srv_suspend(h->srv, &r->susp);
    return MHD_YES;
}

/* The parameter a gateway message about an adapter names ("name: ...", "adapter a: path:"). */
static const char *adapter_param(const char *msg)
{
    return strncmp(msg, "path:", 5) == 0 || strstr(msg, ": path:") ? "lora_path" : "lora_name";
}

static enum MHD_Result advance_adapter(struct hreq *r, struct MHD_Connection *conn)
{
    int st;
    char msg[512];
    if (!gw_ext_adapter_result(r->call, &st, msg, sizeof msg)) {
        http_srv_suspend(r->h->srv, &r->susp);
        return MHD_YES;
    }
    r->phase = P_ANSWERED; /* the result is not asked again */
    bool load = r->route == R_LOAD_LORA;
    switch (st) {
    case GRPC_STATUS_OK: {
        /* vLLM's reply, word for word */
        char text[256];
        int n = snprintf(text, sizeof text, "Success: LoRA adapter '%s' %s successfully.",
                         r->model, load ? "added" : "removed");
        char *s = strndup(text, n < 0 ? 0 : (size_t)n);
        return s ? reply(conn, 200, "text/plain", s, strlen(s), NULL) : MHD_NO;
    }
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_FAILED_PRECONDITION:
        return reply_error(conn, 400, adapter_param(msg), NULL, "%s", msg);
    case GRPC_STATUS_NOT_FOUND:
        return reply_error(conn, 404, adapter_param(msg), NULL, "%s", msg);
    case GRPC_STATUS_ALREADY_EXISTS:
        return reply_error(conn, 409, "lora_name", NULL, "%s", msg);
    default: return reply_status(r, conn, st, msg); /* 401, 403, 429, 503, 500 */
    }
}

/* WAIT: a wake-up (or the first look): answer, start streaming, or wait on. */
static enum MHD_Result advance(struct hreq *r, struct MHD_Connection *conn)
{
    if (r->gone || !r->call)
        return MHD_NO;
    if (adapter_route(r->route))
        return advance_adapter(r, conn);
    if (take_all(r) < 0)
        return reply_error(conn, 500, NULL, NULL, "out of memory");
    bool all_done = true, any_output = false;
    for (size_t i = 0; i < r->req.n; i++) {
        const struct choice *c = &r->choices[i];
        all_done &= c->st.done;
        any_output |= c->len > 0 || c->st.tokens > 0;
    }
    /* a failure before anything was produced is the reply's status */
    for (size_t i = 0; i < r->req.n; i++) {
        const struct choice *c = &r->choices[i];
        if (c->st.done && c->st.status && (!r->req.stream || !any_output))
            return reply_status(r, conn, c->st.status, c->st.error);
    }
    if (!r->req.stream) {
        if (all_done)
            return reply_complete(r, conn);
        http_srv_suspend(r->h->srv, &r->susp);
        return MHD_YES;
    }
    bool any_done = false;
    for (size_t i = 0; i < r->req.n; i++)
        any_done |= r->choices[i].st.done;
    if (!any_output && !any_done) {
        http_srv_suspend(r->h->srv, &r->susp);
        return MHD_YES;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, r, NULL);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    r->phase = P_STREAM;
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- the handler ---- */

static int body_add(struct hreq *r, const char *data, size_t n)
{
    if (r->too_big || r->body_len + n > r->h->max_body) {
        r->too_big = true;
        return 0;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t nc = r->body_cap ? r->body_cap : 4096;
        while (nc < r->body_len + n + 1)
            nc *= 2;
        char *p = realloc(r->body, nc);
        if (!p)
            return -ENOMEM;
        r->body = p, r->body_cap = nc;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    struct http *h = cls;
    struct hreq *r = *con_cls;
    if (!r) {
        /* the head came: route it; generations get a closure for their body */
        bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                   strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
        if (strcmp(url, "/health") == 0 || strcmp(url, "/healthz") == 0) {
            if (!get)
                return reply_error(conn, 405, NULL, NULL, "%s: use GET", url);
            bool ok = gw__health(h->g) ==
                      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
            char *s = strdup(ok ? "serving\n" : "not serving\n");
            return s ? reply(conn, ok ? 200 : 503, "text/plain", s, strlen(s), NULL) : MHD_NO;
        }
        enum hreq_route route = strcmp(url, "/v1/completions") == 0        ? R_COMPLETIONS
                                : strcmp(url, "/v1/chat/completions") == 0 ? R_CHAT
                                                                           : R_NONE;
        if (strcmp(url, "/v1/load_lora_adapter") == 0)
            route = R_LOAD_LORA;
        else if (strcmp(url, "/v1/unload_lora_adapter") == 0)
            route = R_UNLOAD_LORA;
        if (route == R_NONE && strcmp(url, "/v1/models") != 0)
            return reply_error(conn, 404, NULL, NULL, "%s: no such endpoint (this server has "
                               "/v1/models, /v1/completions, /v1/chat/completions, "
                               "/v1/load_lora_adapter, /v1/unload_lora_adapter)", url);
        if (route == R_NONE ? !get : !post)
            return reply_error(conn, 405, NULL, NULL, "%s: use %s", url,
                               route == R_NONE ? "GET" : "POST");
        /* the key first: an unauthenticated caller learns nothing else */
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_AUTHORIZATION);
        struct config *cfg = config_ptr_get(h->w->config);
        const struct config_tenant *t = NULL;
        int rc = auth_tenant(cfg, auth, auth ? strlen(auth) : 0, &t);
        enum MHD_Result res = MHD_YES;
        if (rc < 0)
            res = reply_error(conn, 401, NULL, "invalid_api_key",
                              rc == ERR_FORMAT ? "missing API key: send \"Authorization: Bearer "
                                                 "<key>\""
                                               : "unknown API key");
        else if (route == R_NONE)
            res = do_models(h, conn, t);
        config_unref(cfg);
        if (rc < 0 || route == R_NONE)
            return res;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->max_body)
            return reply_error(conn, 413, NULL, NULL, "the body is %s bytes, the limit is %" PRIu32
                               " (http.max_body_bytes)", cl, h->max_body);
        if (!(r = calloc(1, sizeof *r)))
            return MHD_NO;
        r->h = h;
        r->route = route;
        r->susp.conn = conn;
        r->susp.gone = on_gone;
        *con_cls = r;
        return MHD_YES;
    }
    if (r->phase == P_BODY) {
        if (*upload_data_size) {
            int rc = body_add(r, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return rc < 0 ? MHD_NO : MHD_YES;
        }
        if (r->too_big)
            return reply_error(conn, 413, NULL, NULL, "the body is larger than %" PRIu32
                               " bytes (http.max_body_bytes)", h->max_body);
        r->phase = P_ADMIT; /* after the loop's next whole turn (the top of this file) */
        http_srv_defer(h->srv, &r->susp);
        return MHD_YES;
    }
    if (r->phase == P_ADMIT)
        return r->gone                    ? MHD_NO
               : adapter_route(r->route) ? start_adapter(r, conn)
                                          : start_generation(r, conn);
    if (r->phase == P_WAIT)
        return advance(r, conn);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    struct http *h = cls;
    struct hreq *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    http_srv_forget(h->srv, &r->susp);
    if (r->call && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->done_sent)
        LOG_INFO("HTTP API: request %s: the client went away: its generation is cancelled",
                 r->id);
    if (r->call)
        gw_ext_release(r->call);
    if (r->choices)
        for (size_t i = 0; i < r->req.n; i++)
            free(r->choices[i].text), free(r->choices[i].rtext), json_decref(r->choices[i].lp),
                json_decref(r->choices[i].calls), json_decref(r->choices[i].call_deltas);
    free(r->choices);
    http_oai_free(&r->req);
    free(r->body);
    free(r->out);
    free(r);
}

int http_create(struct workers *w, struct gw *g, uv_loop_t *loop, struct http **out)
{
    *out = NULL;
    struct config *cfg = config_ptr_get(w->config);
    if (!cfg->http_listen) {
        config_unref(cfg);
        return 0;
    }
    /* config.c checks http.listen; clocherd --http replaces it after that check */
    if (cfg->n_tenants == 0 && !config_hostport_loopback(cfg->http_listen)) {
        LOG_ERR("HTTP API: no tenants while %s is not a loopback address: anonymous access is "
                "only allowed on local listeners", cfg->http_listen);
        config_unref(cfg);
        return ERR_FORMAT;
    }
    struct http *h = calloc(1, sizeof *h);
    if (!h) {
        config_unref(cfg);
        LOG_ERR("HTTP API: out of memory");
        return -ENOMEM;
    }
    h->magic = HTTP_MAGIC;
    h->w = w;
    h->g = g;
    h->max_body = cfg->http_max_body_bytes;
    struct http_srv_opts o = {.what = "HTTP API", .hostport = cfg->http_listen,
                              .max_connections = cfg->http_max_connections,
                              .timeout_s = cfg->http_timeout_s, .handler = on_request,
                              .completed = on_completed, .ud = h};
    int rc = http_srv_create(loop, &o, &h->srv);
    config_unref(cfg);
    if (rc < 0) {
        free(h);
        return rc;
    }
    *out = h;
    return 0;
}

void http_destroy(struct http *h)
{
    if (!h)
        return;
    http_srv_destroy(h->srv); /* runs on_completed for every request still open */
    h->magic = 0;
    free(h);
}

int http_port(const struct http *h) { return h ? http_srv_port(h->srv) : 0; }
