/*
 * gw_call.c — one state machine per gRPC call of the gateway: arrival (authentication, the
 * request unpacked and checked), the worker requests it is made of (items), the messages it
 * streams back, its end (one status), and a client that goes away first (CANCEL to the
 * worker). Threads and locks: gw_internal.h.
 *
 * NOTES
 *  - pump() is the only place that starts a send. It runs with the call's mutex held and
 *    starts at most one batch at a time (gRPC allows one SEND_MESSAGE in flight per call);
 *    whatever arrives meanwhile (tokens) is coalesced into the next message, so a slow client
 *    gets fewer, larger messages instead of an unbounded queue.
 *  - The last message and the status go in one batch; so do a failed Generate's pending
 *    tokens and its error status.
 *  - A call's status is recorded in the statistics exactly once: when it is sent, or when the
 *    client is found gone (CANCELLED, or DEADLINE_EXCEEDED once its deadline has passed).
 */
#include "auth.h"
#include "err.h"
#include "gw_internal.h"
#include "gw_req.h"
#include "log.h"
#include "mono.h"
#include "stats.h"

#include <ctype.h>
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>

#include "clocher/v1/inference.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

#define GW_MAX_BATCH 1024u /* prompts in one BatchGenerate */

static const char *const method_names[GW_METHODS + 1] = {
    [GW_GENERATE] = "Generate",         [GW_BATCH_GENERATE] = "BatchGenerate",
    [GW_TOKENIZE] = "Tokenize",         [GW_DETOKENIZE] = "Detokenize",
    [GW_LIST_MODELS] = "ListModels",    [GW_LIST_ADAPTERS] = "ListAdapters",
    [GW_LOAD_ADAPTER] = "LoadAdapter",  [GW_UNLOAD_ADAPTER] = "UnloadAdapter",
    [GW_GET_METRICS] = "GetMetrics",    [GW_HEALTH_CHECK] = "Health.Check",
    [GW_HEALTH_WATCH] = "Health.Watch", [GW_UNKNOWN] = "unknown",
};

static void on_close(struct gw_tag *t, bool ok);
static void on_sent(struct gw_tag *t, bool ok);
static void pump(struct gw_call *c);
static void sink_pump(struct gw_call *c);

/* ---- messages ---- */

static grpc_byte_buffer *pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

/* The message in bb as a `d`; NULL if it is not one. nul_at[cap] is set (non-empty) to the
 * first string field, at any depth, that holds a NUL byte, which the unpacked C string would
 * have silently cut (gw_req_strings_nul). */
static void *unpack_checked(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb,
                            char *nul_at, size_t cap)
{
    nul_at[0] = 0;
    if (!bb)
        return NULL;
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return NULL;
    grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    void *m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    if (m && gw_req_strings_nul(GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl), d, nul_at,
                                cap) != 1)
        nul_at[0] = 0;
    grpc_slice_unref(sl);
    return m;
}

/* Appends bytes to a NUL-terminated buffer, dropping NULs (protobuf-c strings are C strings;
 * a U+0000 in model output is not worth a truncated reply). */
static int append_text(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc < *len + n + 1)
            nc *= 2;
        char *p = realloc(*buf, nc);
        if (!p)
            return -ENOMEM;
        *buf = p, *cap = nc;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i])
            (*buf)[(*len)++] = s[i];
    (*buf)[*len] = '\0';
    return 0;
}

static int append_id(struct gw_item *it, int32_t id)
{
    if (it->n_ids == it->cap_ids) {
        size_t nc = it->cap_ids ? 2 * it->cap_ids : 16;
        int32_t *p = realloc(it->ids, nc * sizeof *p);
        if (!p)
            return -ENOMEM;
        it->ids = p, it->cap_ids = nc;
    }
    it->ids[it->n_ids++] = id;
    return 0;
}

/* A TOKEN's logprobs appended to the item's pending ones. */
static int lp_piece(struct gw_item *it, const struct shm_msg_logprob *x, struct gw_lp_ent *e)
{
    if (it->lp_len + x->piece_len > it->lp_cap) {
        size_t nc = it->lp_cap ? 2 * it->lp_cap : 1024;
        while (nc < it->lp_len + x->piece_len)
            nc *= 2;
        char *p = realloc(it->lp_bytes, nc);
        if (!p)
            return -ENOMEM;
        it->lp_bytes = p, it->lp_cap = nc;
    }
    *e = (struct gw_lp_ent){.id = x->id, .logprob = x->logprob, .off = (uint32_t)it->lp_len,
                            .len = x->piece_len};
    if (x->piece_len)
        memcpy(it->lp_bytes + it->lp_len, x->piece, x->piece_len);
    it->lp_len += x->piece_len;
    return 0;
}

static int append_logprobs(struct gw_item *it, const struct shm_msg_token *t)
{
    if (it->n_lps == it->cap_lps) {
        size_t nc = it->cap_lps ? 2 * it->cap_lps : 16;
        struct gw_lp *p = realloc(it->lps, nc * sizeof *p);
        if (!p)
            return -ENOMEM;
        it->lps = p, it->cap_lps = nc;
    }
    struct gw_lp *l = &it->lps[it->n_lps];
    l->n_top = t->n_top;
    if (lp_piece(it, &t->own, &l->own) < 0)
        return -ENOMEM;
    for (uint32_t k = 0; k < t->n_top; k++)
        if (lp_piece(it, &t->top[k], &l->top[k]) < 0)
            return -ENOMEM;
    it->n_lps++;
    return 0;
}

/* GenerateResponse.logprobs of the first n pending ids (each of which has its entry); the
 * messages live in *mem (free it after packing). 0 / -ENOMEM. */
static int fill_logprobs(const struct gw_item *it, size_t n, Clocher__V1__GenerateResponse *r,
                         void **mem)
{
    *mem = NULL;
    n = n < it->n_lps ? n : it->n_lps;
    if (n == 0)
        return 0;
    size_t tops = 0;
    for (size_t i = 0; i < n; i++)
        tops += it->lps[i].n_top;
    char *m = malloc(n * (sizeof(Clocher__V1__TokenLogprob) + sizeof(void *)) +
                     tops * (sizeof(Clocher__V1__TopLogprob) + sizeof(void *)));
    if (!m)
        return -ENOMEM;
    Clocher__V1__TokenLogprob *tl = (void *)m, **tlp = (void *)(tl + n);
    Clocher__V1__TopLogprob *tp = (void *)(tlp + n), **tpp = (void *)(tp + tops);
    for (size_t i = 0; i < n; i++) {
        const struct gw_lp *l = &it->lps[i];
        Clocher__V1__TokenLogprob t0 = CLOCHER__V1__TOKEN_LOGPROB__INIT;
        tl[i] = t0, tlp[i] = &tl[i];
        tl[i].has_id = tl[i].has_logprob = 1;
        tl[i].id = l->own.id, tl[i].logprob = l->own.logprob;
        tl[i].n_top = l->n_top, tl[i].top = tpp;
        for (uint32_t k = 0; k < l->n_top; k++) {
            Clocher__V1__TopLogprob p0 = CLOCHER__V1__TOP_LOGPROB__INIT;
            *tp = p0;
            tp->has_id = tp->has_logprob = 1;
            tp->id = l->top[k].id, tp->logprob = l->top[k].logprob;
            *tpp++ = tp++;
        }
    }
    r->n_logprobs = n;
    r->logprobs = tlp;
    *mem = m;
    return 0;
}

/* Drops the first n pending logprob entries (sent with their ids). */
static void consume_logprobs(struct gw_item *it, size_t n)
{
    n = n < it->n_lps ? n : it->n_lps;
    if (it->lps)
        memmove(it->lps, it->lps + n, (it->n_lps - n) * sizeof *it->lps);
    it->n_lps -= n;
    if (it->n_lps == 0)
        it->lp_len = 0; /* their pieces are all gone: the bytes start over */
}

/* ---- the request id of the logs ---- */

/* c->rid = id when it is printable ASCII (a client's bytes go into log lines), else kept. */
static void set_rid(struct gw_call *c, const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n >= sizeof c->rid)
        return;
    for (size_t i = 0; i < n; i++)
        if (id[i] < 0x21 || id[i] > 0x7e)
            return;
    pthread_mutex_lock(&c->mu); /* its client going away may log it meanwhile (gw_route.c) */
    memcpy(c->rid, id, n + 1);
    pthread_mutex_unlock(&c->mu);
}

static void default_rid(struct gw_call *c)
{
    static _Atomic uint64_t next = 1;
    snprintf(c->rid, sizeof c->rid, "call-%" PRIu64, atomic_fetch_add(&next, 1));
}

/* ---- the end of a call ---- */

static void end_stream(struct gw_call *c)
{
    if (!c->stream_slot)
        return;
    c->stream_slot = false;
    auth_streams_release_n(&c->g->streams, c->tenant, c->n_streams);
    atomic_fetch_sub(&c->g->active_streams, c->n_streams);
    if (c->g->stats)
        stats_active_streams_add(c->g->stats, c->tenant, -(int64_t)c->n_streams);
}

static void record(struct gw_call *c, int status)
{
    if (c->counted)
        return;
    c->counted = true;
    if (c->g->stats)
        stats_request(c->g->stats, c->tenant, method_names[c->method], status);
}

/* A generation leaves its tenant's max_queued count: its first token came, or it ended. */
static void unqueue(struct gw_call *c, struct gw_item *it)
{
    if (!it->queued)
        return;
    it->queued = false;
    gw__quota_unqueue(c->g, c->tenant);
}

static void item_fail(struct gw_call *c, struct gw_item *it, int status, const char *msg)
{
    unqueue(c, it);
    if (it->done)
        return;
    it->done = true;
    it->status = status ? status : GRPC_STATUS_INTERNAL;
    free(it->error);
    it->error = strdup(msg && *msg ? msg : "failed");
    c->n_open--;
}

/* Ends the call with a status of its own (mu held): every item still open fails with it. */
__attribute__((format(printf, 3, 4)))
static void fail_call(struct gw_call *c, int status, const char *fmt, ...)
{
    if (c->status)
        return;
    c->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->status_msg, sizeof c->status_msg, fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < c->n_items; i++)
        item_fail(c, &c->items[i], status, c->status_msg);
}

/* fail_call + pump, for code not holding mu */
__attribute__((format(printf, 3, 4)))
static void end_call(struct gw_call *c, int status, const char *fmt, ...)
{
    char msg[sizeof c->status_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    fail_call(c, status, "%s", msg);
    pump(c);
    pthread_mutex_unlock(&c->mu);
}

/* ---- what to send next ---- */

/* The first channel run of the pending output: its ids, its text length and its channel. */
static void first_run(const struct gw_item *it, size_t *n_ids, size_t *text_len,
                      uint32_t *channel)
{
    *n_ids = it->n_segs ? it->segs[0].ids_end : it->n_ids;
    *text_len = it->n_segs ? it->segs[0].text_end : it->text_len;
    *channel = it->n_segs ? it->segs[0].channel : 0;
}

/* r's ids and text: the first run (its text NUL-terminated in place: *saved keeps the byte,
 * restore_run puts it back). */
static void fill_response(struct gw_item *it, bool final, Clocher__V1__GenerateResponse *r,
                          Clocher__V1__Usage *u, Clocher__V1__Timings *t, char *saved)
{
    size_t n_ids, text_len;
    uint32_t channel;
    first_run(it, &n_ids, &text_len, &channel);
    r->n_token_ids = n_ids;
    r->token_ids = it->ids;
    *saved = text_len < it->text_len ? it->text[text_len] : '\0';
    if (text_len < it->text_len)
        it->text[text_len] = '\0';
    r->text = text_len ? it->text : NULL;
    if (channel) {
        r->has_channel = 1;
        r->channel = (Clocher__V1__Channel)channel; /* enum shm_channel = Channel's numbers */
    }
    if (it->n_segs && it->segs[0].call) { /* chat tools: the run is a call's arguments */
        r->recipient = it->segs[0].call_name;
        r->tool_call_id = it->segs[0].call_id;
    }
    if (!final || !it->finished || it->n_segs > 1)
        return;
    static const Clocher__V1__FinishReason reasons[] = {
        [SHM_FINISH_EOS] = CLOCHER__V1__FINISH_REASON__FINISH_REASON_EOS,
        [SHM_FINISH_LENGTH] = CLOCHER__V1__FINISH_REASON__FINISH_REASON_LENGTH,
        [SHM_FINISH_STOP] = CLOCHER__V1__FINISH_REASON__FINISH_REASON_STOP,
        [SHM_FINISH_CONTEXT] = CLOCHER__V1__FINISH_REASON__FINISH_REASON_CONTEXT,
    };
    unsigned why = it->fin.reason;
    r->has_finish_reason = 1;
    r->finish_reason = why < sizeof reasons / sizeof reasons[0] ? reasons[why] : 0;
    if (why == SHM_FINISH_EOS && it->tool_call)
        r->finish_reason = CLOCHER__V1__FINISH_REASON__FINISH_REASON_TOOL_CALL;
    u->has_prompt_tokens = u->has_completion_tokens = u->has_cached_prompt_tokens = 1;
    u->prompt_tokens = it->fin.prompt_tokens;
    u->completion_tokens = it->fin.completion_tokens;
    u->cached_prompt_tokens = it->fin.cached_tokens;
    t->has_queue_ms = t->has_ttft_ms = t->has_tpot_ms = t->has_e2e_ms = 1;
    t->queue_ms = (double)it->fin.queue_ns / 1e6;
    t->ttft_ms = (double)it->fin.ttft_ns / 1e6;
    t->tpot_ms = (double)it->fin.tpot_ns / 1e6;
    t->e2e_ms = (double)it->fin.e2e_ns / 1e6;
    r->usage = u;
    r->timings = t;
}

/* Drops the first run (fill_response's) from the pending output. */
static void consume_run(struct gw_item *it, char saved)
{
    size_t n_ids, text_len;
    uint32_t channel;
    first_run(it, &n_ids, &text_len, &channel);
    if (text_len < it->text_len)
        it->text[text_len] = saved;
    it->sent_tokens += n_ids;
    consume_logprobs(it, n_ids); /* gRPC's path: the entries go with their ids */
    if (it->ids) /* NULL until the first id (an item that failed before any: memmove's
                    arguments must not be NULL even for 0 bytes) */
        memmove(it->ids, it->ids + n_ids, (it->n_ids - n_ids) * sizeof *it->ids);
    it->n_ids -= n_ids;
    if (it->text) {
        memmove(it->text, it->text + text_len, it->text_len - text_len + 1);
        it->text_len -= text_len;
    }
    if (it->n_segs) {
        it->n_segs--;
        memmove(it->segs, it->segs + 1, it->n_segs * sizeof *it->segs);
        for (size_t k = 0; k < it->n_segs; k++)
            it->segs[k].text_end -= text_len, it->segs[k].ids_end -= n_ids;
    }
}

static void consume_pending(struct gw_item *it)
{
    it->sent_tokens += it->n_ids;
    it->n_ids = 0;
    it->text_len = 0;
    it->n_segs = 0;
    if (it->text)
        it->text[0] = '\0';
}

/* A chat piece's run: a new one when its text opens another channel, or another tool call
 * (chat tools: a piece with a call header opens one; the pieces of its channel that follow
 * are its arguments). 0, or -ENOMEM when the run table cannot grow (the caller fails the
 * item). */
static int note_run(struct gw_item *it, const struct shm_msg_token *t)
{
    if (!t->channel && !it->n_segs)
        return 0; /* not a chat */
    bool opens = t->call_name_len != 0;
    if (opens) {
        it->open_call = ++it->n_calls;
        it->call_channel = (uint32_t)t->channel;
        snprintf(it->call_name, sizeof it->call_name, "%.*s", (int)t->call_name_len,
                 t->call_name);
        snprintf(it->call_id, sizeof it->call_id, "%.*s", (int)t->call_id_len, t->call_id);
    } else if (it->open_call && t->text_len && (uint32_t)t->channel != it->call_channel) {
        it->open_call = 0; /* text elsewhere: the call's arguments are complete */
    }
    unsigned call = it->open_call;
    if (it->n_segs == 0 || opens ||
        (t->text_len && (it->segs[it->n_segs - 1].channel != t->channel ||
                         it->segs[it->n_segs - 1].call != call))) {
        if (it->n_segs && it->segs[it->n_segs - 1].text_end == 0 &&
            it->segs[it->n_segs - 1].ids_end == 0)
            it->n_segs--; /* empty */
        if (it->n_segs == it->cap_segs) {
            size_t cap = it->cap_segs ? 2 * it->cap_segs : 4;
            struct gw_seg *p = realloc(it->segs, cap * sizeof *p);
            if (!p)
                return -ENOMEM;
            it->segs = p, it->cap_segs = cap;
        }
        struct gw_seg *ns = &it->segs[it->n_segs++];
        *ns = (struct gw_seg){.channel = (uint32_t)t->channel, .text_end = it->text_len,
                              .ids_end = it->n_ids, .call = call, .call_opens = opens};
        if (call) {
            memcpy(ns->call_name, it->call_name, sizeof ns->call_name);
            memcpy(ns->call_id, it->call_id, sizeof ns->call_id);
        }
    }
    struct gw_seg *sg = &it->segs[it->n_segs - 1];
    if (sg->text_end == it->text_len && sg->ids_end == it->n_ids && t->text_len)
        sg->channel = (uint32_t)t->channel; /* a run without text yet takes the text's channel */
    sg->text_end = it->text_len + t->text_len;
    sg->ids_end = it->n_ids + (t->token >= 0);
    return 0;
}

/* Generate: the next message; *end when the call ends with it (status in *st, *detail). */
static grpc_byte_buffer *next_generate(struct gw_call *c, bool *end, int *st, const char **detail)
{
    struct gw_item *it = &c->items[0];
    bool pending = it->n_ids || it->text_len;
    bool final = it->done && !it->status;
    grpc_byte_buffer *bb = NULL;
    if (pending || final) {
        Clocher__V1__GenerateResponse r = CLOCHER__V1__GENERATE_RESPONSE__INIT;
        Clocher__V1__Usage u = CLOCHER__V1__USAGE__INIT;
        Clocher__V1__Timings t = CLOCHER__V1__TIMINGS__INIT;
        char saved;
        void *lpmem = NULL;
        fill_response(it, final, &r, &u, &t, &saved);
        if (fill_logprobs(it, r.n_token_ids, &r, &lpmem) == 0)
            bb = pack(&r.base);
        free(lpmem);
        consume_run(it, saved);
        if (it->n_segs && bb)
            return bb; /* more runs wait: the end comes with the last */
    }
    if (it->done) {
        it->final_sent = true;
        *end = true;
        *st = it->status;
        *detail = it->status ? it->error : "";
    }
    return bb;
}

static grpc_byte_buffer *next_batch(struct gw_call *c, bool *end)
{
    grpc_byte_buffer *bb = NULL;
    for (size_t k = 0; k < c->n_items && !bb; k++) {
        size_t i = (c->rr + k) % c->n_items;
        struct gw_item *it = &c->items[i];
        if (it->final_sent || (!it->done && !it->n_ids && !it->text_len))
            continue;
        Clocher__V1__BatchGenerateResponse br = CLOCHER__V1__BATCH_GENERATE_RESPONSE__INIT;
        Clocher__V1__GenerateResponse r = CLOCHER__V1__GENERATE_RESPONSE__INIT;
        Clocher__V1__Usage u = CLOCHER__V1__USAGE__INIT;
        Clocher__V1__Timings t = CLOCHER__V1__TIMINGS__INIT;
        br.has_index = 1;
        br.index = it->index;
        char saved;
        fill_response(it, it->done && !it->status, &r, &u, &t, &saved);
        br.response = &r;
        bool more = it->n_segs > 1;
        if (it->done && it->status && !more) {
            br.has_error_code = 1;
            br.error_code = it->status;
            br.error_message = it->error;
        }
        void *lpmem = NULL;
        if (fill_logprobs(it, r.n_token_ids, &r, &lpmem) == 0)
            bb = pack(&br.base);
        free(lpmem);
        consume_run(it, saved);
        if (it->done && !more)
            it->final_sent = true;
        c->rr = i + 1;
    }
    *end = true;
    for (size_t i = 0; i < c->n_items; i++)
        if (!c->items[i].final_sent)
            *end = false;
    return bb;
}

static void adapter_info(const struct gw_item *it, const char *name, Clocher__V1__AdapterInfo *a,
                         char **mods)
{
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
    a->name = (char *)name;
    a->has_rank = a->has_alpha = a->has_active_requests = 1;
    a->rank = it->ans_adapter.rank;
    a->alpha = it->ans_adapter.alpha;
    a->active_requests = it->ans_adapter.active_requests;
    a->n_target_modules = 0;
    for (unsigned t = 0; t < 7; t++)
        if (it->ans_adapter.targets & (1u << t))
            mods[a->n_target_modules++] = (char *)names[t];
    a->target_modules = mods;
}

/* A unary call whose items are all done: its answer, or the status of its first failure. */
static grpc_byte_buffer *unary_answer(struct gw_call *c, int *st, const char **detail)
{
    for (size_t i = 0; i < c->n_items; i++)
        if (c->items[i].status) {
            *st = c->items[i].status;
            *detail = c->items[i].error;
            return NULL;
        }
    if (c->answer) {
        grpc_byte_buffer *bb = c->answer;
        c->answer = NULL;
        return bb;
    }
    struct gw_item *it = c->n_items ? &c->items[0] : NULL;
    switch (c->method) {
    case GW_TOKENIZE: {
        Clocher__V1__TokenizeResponse r = CLOCHER__V1__TOKENIZE_RESPONSE__INIT;
        r.n_ids = it->n_ans;
        r.ids = it->ans_ids;
        return pack(&r.base);
    }
    case GW_DETOKENIZE: {
        Clocher__V1__DetokenizeResponse r = CLOCHER__V1__DETOKENIZE_RESPONSE__INIT;
        r.text = it->ans_text ? it->ans_text : "";
        return pack(&r.base);
    }
    case GW_LOAD_ADAPTER: {
        const Clocher__V1__LoadAdapterRequest *q = c->req;
        struct gw_item *best = it;
        for (size_t i = 0; i < c->n_items; i++)
            if (c->items[i].has_adapter)
                best = &c->items[i];
        gw__adapter_add(c->g, q->name, q->path, best->has_adapter ? &best->ans_adapter : NULL);
        LOG_INFO("request %s: adapter %s loaded from %s by tenant \"%s\" on %zu workers", c->rid,
                 q->name, q->path,
                 c->tenant, c->n_items);
        Clocher__V1__LoadAdapterResponse r = CLOCHER__V1__LOAD_ADAPTER_RESPONSE__INIT;
        Clocher__V1__AdapterInfo a = CLOCHER__V1__ADAPTER_INFO__INIT;
        char *mods[7];
        adapter_info(best, q->name, &a, mods);
        a.source = (char *)gw__adapter_source(c->g, q->name);
        r.adapter = &a;
        return pack(&r.base);
    }
    case GW_UNLOAD_ADAPTER: {
        const Clocher__V1__UnloadAdapterRequest *q = c->req;
        gw__adapter_remove(c->g, q->name);
        LOG_INFO("request %s: adapter %s unloaded by tenant \"%s\"", c->rid, q->name, c->tenant);
        Clocher__V1__UnloadAdapterResponse r = CLOCHER__V1__UNLOAD_ADAPTER_RESPONSE__INIT;
        return pack(&r.base);
    }
    default: *st = GRPC_STATUS_INTERNAL, *detail = "no answer was made"; return NULL;
    }
}

static grpc_byte_buffer *health_message(int status)
{
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = status;
    return pack(&r.base);
}

/* A gw_ext_generate call (mu held): ends it once every item is done, tells its owner. */
static void sink_pump(struct gw_call *c)
{
    if (!c->status_sent && !c->closed && (c->status || c->n_open == 0)) {
        int st = c->status;
        for (size_t i = 0; !st && i < c->n_items; i++)
            st = c->items[i].status;
        c->status_sent = true;
        record(c, st);
        end_stream(c);
    }
    if (c->sink_ud)
        c->sink(c->sink_ud);
}

/* Starts the next batch if one is due (mu held). */
static void pump(struct gw_call *c)
{
    if (c->sink) {
        sink_pump(c);
        return;
    }
    if (c->sending || c->status_sent || c->closed || !c->call)
        return;
    grpc_byte_buffer *msg = NULL;
    bool end = false;
    int st = 0;
    const char *detail = "";
    if (c->status) {
        /* only refusals before anything reached a worker set the call's own status */
        end = true, st = c->status, detail = c->status_msg;
    } else {
        switch (c->method) {
        case GW_GENERATE: msg = next_generate(c, &end, &st, &detail); break;
        case GW_BATCH_GENERATE:
            msg = next_batch(c, &end);
            break;
        case GW_HEALTH_WATCH:
            if (c->health_now != c->health) {
                c->health = c->health_now;
                msg = health_message(c->health);
            }
            break;
        default:
            if (c->n_open == 0) {
                msg = unary_answer(c, &st, &detail);
                end = true;
            }
        }
    }
    if (!msg && !end)
        return;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = true;
    }
    if (msg) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = msg;
        c->out = msg;
        c->msg_sent = true;
    }
    if (end) {
        if (c->has_status_slice)
            grpc_slice_unref(c->status_slice);
        c->status_slice = grpc_slice_from_copied_string(detail ? detail : "");
        c->has_status_slice = true;
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = (grpc_status_code)st;
        ops[n++].data.send_status_from_server.status_details = st ? &c->status_slice : NULL;
        c->status_sent = true;
        record(c, st);
        end_stream(c);
    }
    c->sending = true;
    gw__call_ref(c);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
    if (e != GRPC_CALL_OK) {
        LOG_ERR("gateway: request %s (%s): starting a send: gRPC error %d", c->rid,
                method_names[c->method], (int)e);
        c->sending = false;
        if (c->out)
            grpc_byte_buffer_destroy(c->out);
        c->out = NULL;
        atomic_fetch_sub(&c->refs, 1); /* not the last: the caller holds one */
    }
}

static void on_sent(struct gw_tag *t, bool ok)
{
    struct gw_call *c = t->obj;
    pthread_mutex_lock(&c->mu);
    c->sending = false;
    if (c->out)
        grpc_byte_buffer_destroy(c->out);
    c->out = NULL;
    if (ok)
        pump(c);
    pthread_mutex_unlock(&c->mu);
    gw__call_unref(c);
}

/* The client is gone (or the call ended normally): cancel what the workers still run. */
static void on_close(struct gw_tag *t, bool ok)
{
    (void)ok;
    struct gw_call *c = t->obj;
    struct gw *g = c->g;
    size_t n_cancel = 0;
    pthread_mutex_lock(&c->mu);
    c->close_seen = true;
    bool late = gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) != 0 &&
                gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) >= 0;
    /* reset by its client before any answer: what an HTTP/2 rapid reset is made of */
    bool early_reset = c->close_cancelled && !c->msg_sent && !late;
    if (c->close_cancelled && !c->status_sent && !c->closed) {
        c->closed = true;
        record(c, late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED);
        end_stream(c);
        for (size_t i = 0; i < c->n_items; i++)
            if (!c->items[i].done) {
                item_fail(c, &c->items[i], GRPC_STATUS_CANCELLED, "the client went away");
                n_cancel++;
            }
    }
    bool closed = c->closed;
    size_t n_items = c->n_items; /* read under mu: items_alloc grows it on the other CQ thread */
    pthread_mutex_unlock(&c->mu);
    if (early_reset)
        gw__conn_early_reset(g, c->peer, c->cfg->limits.max_early_resets);
    if (closed)
        for (size_t i = 0; i < n_items && n_cancel; i++)
            gw__cancel_item(g, c, i);
    if (c->method == GW_HEALTH_WATCH) {
        pthread_mutex_lock(&g->adapters_mu);
        for (size_t i = 0; i < g->n_watch; i++)
            if (g->watch[i] == c) {
                g->watch[i] = g->watch[--g->n_watch];
                gw__call_unref(c); /* the list's */
                break;
            }
        pthread_mutex_unlock(&g->adapters_mu);
    }
    gw__call_unref(c);
}

/* ---- events from workers ---- */

void gw__call_event(struct gw_call *c, size_t item, const struct shm_msg *m)
{
    struct gw *g = c->g;
    pthread_mutex_lock(&c->mu);
    struct gw_item *it = &c->items[item];
    if (c->closed || it->done) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    switch (m->type) {
    case SHM_MSG_TOKEN:
        unqueue(c, it);
        it->tool_call |= m->token.call || m->token.call_name_len; /* chat tools */
        if (note_run(it, &m->token) < 0 || (m->token.token >= 0 && append_id(it, m->token.token) < 0) ||
            (m->token.has_logprob && append_logprobs(it, &m->token) < 0) ||
            append_text(&it->text, &it->text_len, &it->text_cap, m->token.text,
                        m->token.text_len) < 0)
            item_fail(c, it, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
        break;
    case SHM_MSG_FINISH: {
        unqueue(c, it);
        gw__quota_charge(g, c->tcfg, c->tenant,
                         m->finish.prompt_tokens + m->finish.completion_tokens);
        it->finished = true;
        it->fin = m->finish;
        it->done = true;
        c->n_open--;
        uint64_t sent = it->sent_tokens + it->n_ids;
        char why[160];
        if (m->finish.reason == SHM_FINISH_CANCELLED) {
            /* a cancel of ours removes the request from its table first: this one came from
             * the worker itself, stopping (SIGTERM, the drain timeout passed) */
            snprintf(why, sizeof why, "worker %d stopped the request (the daemon is stopping); "
                     "%" PRIu64 " tokens had been generated", it->slot, sent);
            it->status = GRPC_STATUS_UNAVAILABLE;
            it->error = strdup(why);
        } else if (m->finish.reason == SHM_FINISH_DEADLINE) {
            snprintf(why, sizeof why, "the deadline passed after %" PRIu64 " tokens", sent);
            it->status = GRPC_STATUS_DEADLINE_EXCEEDED;
            it->error = strdup(why);
        }
        if (g->stats)
            stats_finish(g->stats, c->tenant, it->adapter, &m->finish);
        break;
    }
    case SHM_MSG_ERROR:
        item_fail(c, it, gw_req_status_of_error(m->error.code), m->error.message);
        break;
    case SHM_MSG_TOKENS:
        it->ans_ids = malloc((m->ids.n_ids ? m->ids.n_ids : 1) * sizeof *it->ans_ids);
        if (!it->ans_ids) {
            item_fail(c, it, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
            break;
        }
        if (m->ids.n_ids)
            memcpy(it->ans_ids, m->ids.ids, m->ids.n_ids * sizeof *it->ans_ids);
        it->n_ans = m->ids.n_ids;
        gw__quota_charge(g, c->tcfg, c->tenant, m->ids.n_ids);
        it->done = true, c->n_open--;
        break;
    case SHM_MSG_TEXT: {
        size_t len = 0, cap = 0;
        if (append_text(&it->ans_text, &len, &cap, m->text.text, m->text.text_len) < 0) {
            item_fail(c, it, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
            break;
        }
        it->done = true, c->n_open--;
        break;
    }
    case SHM_MSG_ADAPTER:
        it->ans_adapter = m->adapter;
        it->ans_adapter.name = NULL; /* a view into the reader's buffer */
        it->has_adapter = true;
        it->done = true, c->n_open--;
        break;
    case SHM_MSG_DONE: it->done = true, c->n_open--; break;
    default: break;
    }
    pump(c);
    pthread_mutex_unlock(&c->mu);
}

void gw__call_fail_item(struct gw_call *c, size_t item, int status, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    struct gw_item *it = &c->items[item];
    if (!it->done) {
        char full[600];
        uint64_t sent = it->sent_tokens + it->n_ids;
        if (c->method == GW_GENERATE || c->method == GW_BATCH_GENERATE)
            snprintf(full, sizeof full, "%s; %" PRIu64 " tokens had been generated", msg, sent);
        else
            snprintf(full, sizeof full, "%s", msg);
        item_fail(c, it, status, full);
        pump(c);
    }
    pthread_mutex_unlock(&c->mu);
}

void gw__health_changed(struct gw *g)
{
    int h = gw__health(g);
    pthread_mutex_lock(&g->adapters_mu);
    size_t n = g->n_watch;
    struct gw_call **list = n ? malloc(n * sizeof *list) : NULL;
    for (size_t i = 0; list && i < n; i++) {
        list[i] = g->watch[i];
        gw__call_ref(list[i]);
    }
    pthread_mutex_unlock(&g->adapters_mu);
    for (size_t i = 0; list && i < n; i++) {
        pthread_mutex_lock(&list[i]->mu);
        list[i]->health_now = h;
        pump(list[i]);
        pthread_mutex_unlock(&list[i]->mu);
        gw__call_unref(list[i]);
    }
    free(list);
}

/* ---- arrival ---- */

static uint64_t deadline_ns(const struct gw_call *c)
{
    if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0 ||
        c->deadline.clock_type == GPR_TIMESPAN)
        return 0;
    gpr_timespec left = gpr_time_sub(c->deadline, gpr_now(c->deadline.clock_type));
    int64_t ns = (int64_t)left.tv_sec * 1000000000ll + left.tv_nsec;
    return mono_ns() + (uint64_t)(ns > 0 ? ns : 1);
}

static int items_alloc(struct gw_call *c, size_t n)
{
    struct gw_item *items = n ? calloc(n, sizeof *items) : NULL;
    if (n && !items)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        items[i].slot = -1;
        items[i].index = (unsigned)i;
    }
    /* under mu: the call's close may be handled on the other CQ thread meanwhile */
    pthread_mutex_lock(&c->mu);
    c->items = items;
    c->n_items = c->n_open = n;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* After the submits: a client gone meanwhile leaves nothing running. */
static void after_submit(struct gw_call *c)
{
    pthread_mutex_lock(&c->mu);
    bool closed = c->closed;
    pthread_mutex_unlock(&c->mu);
    if (closed)
        for (size_t i = 0; i < c->n_items; i++)
            gw__cancel_item(c->g, c, i);
}

static int begin_stream(struct gw_call *c)
{
    uint32_t limit = c->tcfg ? c->tcfg->max_concurrent_streams : 0;
    /* every request of a batch is a stream of its own: a batch is not a way around the limit */
    uint32_t n = c->n_items ? (uint32_t)c->n_items : 1;
    if (auth_streams_acquire_n(&c->g->streams, c->tenant, n, limit) < 0) {
        end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "tenant %s: %" PRIu32 " more streams would exceed its limit of %" PRIu32
                 " (tenants[].max_concurrent_streams; %" PRIu32 " open; each request of a "
                 "batch counts)", c->tenant, n, limit,
                 auth_streams_active(&c->g->streams, c->tenant));
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    c->stream_slot = true;
    c->n_streams = n;
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->g->active_streams, n);
    if (c->g->stats)
        stats_active_streams_add(c->g->stats, c->tenant, n);
    return 0;
}

static void ctx_init(struct gw_call *c, struct gw_req_ctx *ctx, struct gw_model_info *mi)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = mono_ns() ^ atomic_load(&c->g->next_id);
    *ctx = (struct gw_req_ctx){.cfg = c->cfg, .tenant = c->tcfg,
                               .tenant_id = auth_tenant_id(c->tenant),
                               .model_name = gw__model(c->g, mi) ? mi->name : NULL,
                               .adapter_known = gw__adapter_known, .ud = c->g, .seed = seed,
                               .deadline_ns = deadline_ns(c)};
}

/* The call's request unpacked as a `d` message and kept with the call; NULL when the bytes
 * are not one (the call is ended INVALID_ARGUMENT). */
static void *request_of(struct gw_call *c, const ProtobufCMessageDescriptor *d)
{
    char nul_at[256];
    void *r = unpack_checked(d, c->payload, nul_at, sizeof nul_at);
    if (!r) {
        end_call(c, GRPC_STATUS_INVALID_ARGUMENT, "request: not a valid %s", d->name);
        return NULL;
    }
    c->req = r;
    if (nul_at[0]) {
        end_call(c, GRPC_STATUS_INVALID_ARGUMENT,
                 "%s: holds a NUL byte (text may not: it would be cut there)", nul_at);
        return NULL;
    }
    return r;
}

/* ---- the chat form of Generate ---- */

/* chat tools: tools_json is OpenAI's `tools` array, each {"type": "function", "function":
 * {"name", "description"?, "parameters"?}} with OpenAI's name rule (1..64 of [A-Za-z0-9_-]).
 * 0, or why[cap] naming the element and field. With want (tool_choice_function) not NULL,
 * *at is the index of the tool of that name (-1: none). */
static int check_tools(const char *json, const char *want, long *at, char *why, size_t cap)
{
    *at = -1;
    json_error_t je;
    json_t *a = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!a)
        snprintf(why, cap, "chat.tools_json: not JSON: %s (at %d)", je.text, je.position);
    else if (!json_is_array(a))
        snprintf(why, cap, "chat.tools_json: not an array of tools");
    else
        rc = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(a); i++) {
        json_t *t = json_array_get(a, i), *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *desc = json_object_get(fn, "description"), *par = json_object_get(fn, "parameters");
        size_t nl = name ? strlen(name) : 0, ok = 0;
        while (ok < nl && (isalnum((unsigned char)name[ok]) || name[ok] == '_' || name[ok] == '-'))
            ok++;
        rc = -1;
        if (!json_is_object(t))
            snprintf(why, cap, "chat.tools_json[%zu]: not an object", i);
        else if (!type || strcmp(type, "function") != 0)
            snprintf(why, cap, "chat.tools_json[%zu].type: must be \"function\"", i);
        else if (!json_is_object(fn))
            snprintf(why, cap, "chat.tools_json[%zu].function: missing or not an object", i);
        else if (!name)
            snprintf(why, cap, "chat.tools_json[%zu].function.name: missing or not a string", i);
        else if (nl == 0 || nl > 64 || ok != nl)
            snprintf(why, cap, "chat.tools_json[%zu].function.name: \"%.70s\" is not 1..64 "
                     "characters of A-Z a-z 0-9 _ -", i, name);
        else if (desc && !json_is_string(desc))
            snprintf(why, cap, "chat.tools_json[%zu].function.description: not a string", i);
        else if (par && !json_is_object(par))
            snprintf(why, cap, "chat.tools_json[%zu].function.parameters: not a JSON Schema "
                     "object", i);
        else
            rc = 0;
        if (rc == 0 && want && *at < 0 && !strcmp(name, want))
            *at = (long)i;
    }
    json_decref(a);
    return rc;
}

/* gw_req_generate for every input, the chat form included: gw_req checks all but the input,
 * the messages are checked and encoded here (shm_abi.h's chat encoding, bounded by
 * limits.max_prompt_bytes like a text prompt) into *chat (malloc'd: free it after the submit).
 * The worker renders them with its model's template. */
static int req_generate_input(const Clocher__V1__GenerateRequest *r,
                              const struct gw_req_ctx *ctx, struct shm_msg_generate *out,
                              char **chat, char *why, size_t cap)
{
    *chat = NULL;
    if (r->input_case != CLOCHER__V1__GENERATE_REQUEST__INPUT_CHAT)
        return gw_req_generate(r, ctx, out, why, cap);
    Clocher__V1__GenerateRequest base = *r;
    base.input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT;
    base.prompt = (char *)"chat"; /* a stand-in: the chat replaces it below */
    base.has_add_bos = 1, base.add_bos = 0;
    int st = gw_req_generate(&base, ctx, out, why, cap);
    if (st)
        return st;
    const Clocher__V1__Chat *ch = r->chat;
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    size_t n = ch ? ch->n_messages : 0;
    if (n == 0)
        return snprintf(why, cap, "chat.messages: empty"), GRPC_STATUS_INVALID_ARGUMENT;
    if (n > SHM_MAX_CHAT_MSGS)
        return snprintf(why, cap, "chat.messages: %zu, the limit is %u", n, SHM_MAX_CHAT_MSGS),
               GRPC_STATUS_INVALID_ARGUMENT;
    struct shm_chat_msg m[SHM_MAX_CHAT_MSGS];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const Clocher__V1__ChatMessage *cm = ch->messages[i];
        const char *role = cm && cm->role ? cm->role : "";
        size_t k = 0;
        while (k < 5 && strcmp(role, roles[k]) != 0)
            k++;
        if (k == 5)
            return snprintf(why, cap, "chat.messages[%zu].role: \"%.32s\" is not a role "
                            "(system, developer, user, assistant, tool)", i, role),
                   GRPC_STATUS_INVALID_ARGUMENT;
        const char *content = cm->content ? cm->content : "";
        total += strlen(content);
        m[i] = (struct shm_chat_msg){
            .role = (enum shm_chat_role)k, .content = content,
            .content_len = (uint32_t)strlen(content),
            .channel = cm->channel ? cm->channel : "",
            .channel_len = cm->channel ? (uint32_t)strnlen(cm->channel, SHM_MAX_CHAT_NAME + 1) : 0,
            .recipient = cm->recipient ? cm->recipient : "",
            .recipient_len =
                cm->recipient ? (uint32_t)strnlen(cm->recipient, SHM_MAX_CHAT_NAME + 1) : 0,
            /* chat tools */
            .tool_call_id = cm->tool_call_id ? cm->tool_call_id : "",
            .tool_call_id_len =
                cm->tool_call_id ? (uint32_t)strnlen(cm->tool_call_id, SHM_MAX_CHAT_NAME + 1) : 0};
    }
    /* chat tools: checked here, rendered by the worker */
    const char *tools = ch->tools_json && *ch->tools_json ? ch->tools_json : NULL;
    const char *choice = ch->tool_choice && *ch->tool_choice ? ch->tool_choice : "auto";
    const char *fn = ch->tool_choice_function && *ch->tool_choice_function
                         ? ch->tool_choice_function : NULL;
    uint32_t tool_choice = SHM_TOOL_CHOICE_AUTO;
    long fn_at = -1;
    if (strcmp(choice, "auto") && strcmp(choice, "none") && strcmp(choice, "required") &&
        strcmp(choice, "function"))
        return snprintf(why, cap, "chat.tool_choice: \"%.32s\" is not auto, none, required or "
                        "function", choice), GRPC_STATUS_INVALID_ARGUMENT;
    if (!strcmp(choice, "function") != !!fn)
        return snprintf(why, cap, "chat.tool_choice_function: %s", fn ? "given without "
                        "tool_choice \"function\"" : "missing: tool_choice \"function\" "
                        "names the function to call"), GRPC_STATUS_INVALID_ARGUMENT;
    if (!tools && (!strcmp(choice, "required") || fn))
        return snprintf(why, cap, "chat.tool_choice: \"%s\" needs chat.tools_json", choice),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (tools && check_tools(tools, fn, &fn_at, why, cap) < 0)
        return GRPC_STATUS_INVALID_ARGUMENT;
    if (fn && fn_at < 0)
        return snprintf(why, cap, "chat.tool_choice_function: \"%.70s\" is not a function of "
                        "chat.tools_json", fn), GRPC_STATUS_INVALID_ARGUMENT;
    if (fn_at > 0xffffff)
        return snprintf(why, cap, "chat.tool_choice_function: tool %ld, the limit is %u", fn_at,
                        0xffffffu), GRPC_STATUS_INVALID_ARGUMENT;
    if (!strcmp(choice, "none"))
        tools = NULL; /* left out of the prompt, as vLLM does: nothing to call */
    else if (!strcmp(choice, "required"))
        tool_choice = SHM_TOOL_CHOICE_REQUIRED;
    else if (fn)
        tool_choice = SHM_TOOL_CHOICE_FUNCTION | (uint32_t)fn_at << 8;
    if (tools && ch->has_parallel_tool_calls && !ch->parallel_tool_calls)
        tool_choice |= SHM_TOOL_CHOICE_ONE_CALL; /* without tools there is nothing to limit */
    total += tools ? strlen(tools) : 0;
    if (total > ctx->cfg->limits.max_prompt_bytes)
        return snprintf(why, cap, "chat.messages: %" PRIu64 " bytes of content, the limit is %"
                        PRIu32 " (limits.max_prompt_bytes)", total,
                        ctx->cfg->limits.max_prompt_bytes),
               GRPC_STATUS_INVALID_ARGUMENT;
    uint32_t len = 0;
    char detail[256];
    struct shm_chat sc = {.msgs = m, .n = (uint32_t)n, .tools = tools,
                          .tools_len = tools ? (uint32_t)strnlen(tools, SHM_MAX_CHAT_TOOLS + 1)
                                             : 0,
                          .tool_choice = tool_choice};
    if (shm_chat_size(&sc, &len, detail, sizeof detail) < 0)
        return snprintf(why, cap, "chat.%s", detail), GRPC_STATUS_INVALID_ARGUMENT;
    if (len > ctx->cfg->limits.max_prompt_bytes)
        return snprintf(why, cap, "chat.messages: %" PRIu32 " bytes encoded, the limit is %" PRIu32
                        " (limits.max_prompt_bytes)", len, ctx->cfg->limits.max_prompt_bytes),
               GRPC_STATUS_INVALID_ARGUMENT;
    if (!(*chat = malloc(len)))
        return snprintf(why, cap, "gateway out of memory"), GRPC_STATUS_RESOURCE_EXHAUSTED;
    shm_chat_encode(&sc, *chat, len);
    out->prompt_text = *chat;
    out->prompt_text_len = len;
    out->flags = (out->flags & ~SHM_GEN_ADD_BOS) | SHM_GEN_CHAT |
                 (ch->has_reasoning_effort &&
                          ch->reasoning_effort == CLOCHER__V1__REASONING_EFFORT__REASONING_EFFORT_LOW
                      ? SHM_GEN_EFFORT_LOW
                  : ch->has_reasoning_effort &&
                          ch->reasoning_effort ==
                              CLOCHER__V1__REASONING_EFFORT__REASONING_EFFORT_HIGH
                      ? SHM_GEN_EFFORT_HIGH
                      : 0);
    return 0;
}

/* req_generate_input, then batch_invariant (the request's, else the daemon's key) as the
 * record's flag (docs/DAEMON.md "Batch invariance") */
static int req_generate(const Clocher__V1__GenerateRequest *r, const struct gw_req_ctx *ctx,
                        struct shm_msg_generate *out, char **chat, char *why, size_t cap)
{
    int st = req_generate_input(r, ctx, out, chat, why, cap);
    if (!st && (r->has_batch_invariant ? r->batch_invariant : ctx->cfg->batch_invariant))
        out->flags |= SHM_GEN_BATCH_INVARIANT;
    return st;
}

/* A call of one worker request (m) to whichever worker is least loaded. */
static void submit_single(struct gw_call *c, struct shm_msg *m)
{
    if (items_alloc(c, 1) < 0)
        return end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
    char why[512];
    int st = gw__submit(c->g, -1, m, c, 0, why, sizeof why);
    if (st)
        return end_call(c, st, "%s", why);
    after_submit(c);
}

static void start_generate(struct gw_call *c)
{
    Clocher__V1__GenerateRequest *r = request_of(c, &clocher__v1__generate_request__descriptor);
    if (!r)
        return;
    set_rid(c, r->request_id);
    if (items_alloc(c, 1) < 0)
        return end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
    if (begin_stream(c) < 0)
        return;
    struct gw_req_ctx ctx;
    struct gw_model_info mi;
    ctx_init(c, &ctx, &mi);
    struct shm_msg m = {.type = SHM_MSG_GENERATE};
    char why[512], *chat = NULL;
    int st = req_generate(r, &ctx, &m.generate, &chat, why, sizeof why);
    if (!st)
        st = gw__quota_admit(c->g, c->tcfg, c->tenant, 1, 1, m.generate.prompt_text_len, why,
                             sizeof why, NULL);
    if (st) {
        free(chat);
        return end_call(c, st, "%s", why);
    }
    pthread_mutex_lock(&c->mu);
    c->items[0].queued = true;
    pthread_mutex_unlock(&c->mu);
    if (m.generate.adapter)
        snprintf(c->items[0].adapter, sizeof c->items[0].adapter, "%s", m.generate.adapter);
    /* clocher_queue_depth: generations between arrival and a worker's ring (the gateway
     * keeps no queue of its own: a full worker answers UNAVAILABLE at once) */
    if (c->g->stats)
        stats_queue_depth_add(c->g->stats, 1);
    st = gw__submit(c->g, -1, &m, c, 0, why, sizeof why);
    free(chat);
    if (c->g->stats)
        stats_queue_depth_add(c->g->stats, -1);
    if (st)
        return end_call(c, st, "%s", why);
    after_submit(c);
}

/* The tenant's quotas for n generations (the longest prompt stands for the prompt bytes); on
 * admission every item counts as queued until its first token. -1 when refused (the call is
 * ended with the quota's status naming the limit). */
static int admit_items(struct gw_call *c, Clocher__V1__GenerateRequest *const *reqs, size_t n)
{
    size_t longest = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = reqs[i] ? reqs[i]->prompt : NULL;
        if (p && strlen(p) > longest)
            longest = strlen(p);
    }
    char why[512];
    int st = gw__quota_admit(c->g, c->tcfg, c->tenant, (uint32_t)n, (uint32_t)n, longest, why,
                             sizeof why, NULL);
    if (st) {
        end_call(c, st, "%s", why);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_items; i++)
        c->items[i].queued = true;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static void start_batch(struct gw_call *c)
{
    Clocher__V1__BatchGenerateRequest *r =
        request_of(c, &clocher__v1__batch_generate_request__descriptor);
    if (!r)
        return;
    if (r->n_requests == 0)
        return end_call(c, GRPC_STATUS_INVALID_ARGUMENT, "requests: empty");
    set_rid(c, r->requests[0]->request_id);
    if (r->n_requests > GW_MAX_BATCH)
        return end_call(c, GRPC_STATUS_INVALID_ARGUMENT, "requests: %zu, the limit is %u",
                        r->n_requests, GW_MAX_BATCH);
    if (items_alloc(c, r->n_requests) < 0)
        return end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
    if (begin_stream(c) < 0)
        return;
    if (admit_items(c, r->requests, r->n_requests) < 0)
        return;
    struct gw_req_ctx ctx;
    struct gw_model_info mi;
    ctx_init(c, &ctx, &mi);
    for (size_t i = 0; i < r->n_requests; i++) {
        struct shm_msg m = {.type = SHM_MSG_GENERATE};
        char why[512], full[560];
        ctx.seed = ctx.seed * 6364136223846793005ull + 1442695040888963407ull;
        char *chat = NULL;
        int st = req_generate(r->requests[i], &ctx, &m.generate, &chat, why, sizeof why);
        if (!st)
            st = gw__submit(c->g, -1, &m, c, i, why, sizeof why);
        free(chat);
        if (st) {
            snprintf(full, sizeof full, "requests[%zu].%s", i, why);
            pthread_mutex_lock(&c->mu);
            item_fail(c, &c->items[i], st, st == GRPC_STATUS_INVALID_ARGUMENT ? full : why);
            pump(c);
            pthread_mutex_unlock(&c->mu);
        }
    }
    after_submit(c);
}

static void start_tokenize(struct gw_call *c)
{
    Clocher__V1__TokenizeRequest *r = request_of(c, &clocher__v1__tokenize_request__descriptor);
    if (!r)
        return;
    const char *text = r->text ? r->text : "";
    uint32_t limit = c->cfg->limits.max_prompt_bytes;
    if (strlen(text) > limit)
        return end_call(c, GRPC_STATUS_INVALID_ARGUMENT,
                        "text: %zu bytes, the limit is %" PRIu32 " (limits.max_prompt_bytes)",
                        strlen(text), limit);
    char why[512];
    int st = gw__quota_admit(c->g, c->tcfg, c->tenant, 1, 0, strlen(text), why, sizeof why, NULL);
    if (st)
        return end_call(c, st, "%s", why);
    struct shm_msg m = {.type = SHM_MSG_TOKENIZE,
                        .tokenize = {.flags = !r->has_add_bos || r->add_bos ? SHM_GEN_ADD_BOS : 0,
                                     .text = text, .text_len = (uint32_t)strlen(text)}};
    submit_single(c, &m);
}

static void start_detokenize(struct gw_call *c)
{
    Clocher__V1__DetokenizeRequest *r = request_of(c, &clocher__v1__detokenize_request__descriptor);
    if (!r)
        return;
    for (size_t i = 0; i < r->n_ids; i++)
        if (r->ids[i] < 0)
            return end_call(c, GRPC_STATUS_INVALID_ARGUMENT,
                            "ids: token %zu is %" PRId32 ", ids are >= 0", i, r->ids[i]);
    char why[512];
    int st = gw__quota_admit(c->g, c->tcfg, c->tenant, 1, 0, 0, why, sizeof why, NULL);
    if (st)
        return end_call(c, st, "%s", why);
    gw__quota_charge(c->g, c->tcfg, c->tenant, r->n_ids);
    struct shm_msg m = {.type = SHM_MSG_DETOKENIZE,
                        .ids = {.ids = r->ids, .n_ids = (uint32_t)r->n_ids}};
    submit_single(c, &m);
}

/* Adapter management: tenants allowed every adapter ("*"), or anonymous access. */
static bool may_manage(const struct gw_call *c) { return !c->tcfg || c->tcfg->all_adapters; }

static void start_adapter_op(struct gw_call *c, bool load)
{
    const char *name, *path = NULL;
    if (load) {
        Clocher__V1__LoadAdapterRequest *r =
            request_of(c, &clocher__v1__load_adapter_request__descriptor);
        if (!r)
            return;
        name = r->name ? r->name : "";
        path = r->path ? r->path : "";
    } else {
        Clocher__V1__UnloadAdapterRequest *r =
            request_of(c, &clocher__v1__unload_adapter_request__descriptor);
        if (!r)
            return;
        name = r->name ? r->name : "";
    }
    if (!may_manage(c))
        return end_call(c, GRPC_STATUS_PERMISSION_DENIED,
                        "tenant %s may not %s adapters (it needs \"allowed_adapters\": \"*\")",
                        c->tenant, load ? "load" : "unload");
    if (!atomic_load(&c->g->accepting))
        return end_call(c, GRPC_STATUS_UNAVAILABLE, "the daemon is draining");
    if (!gw_req_name_ok(name))
        return end_call(c, GRPC_STATUS_INVALID_ARGUMENT,
                        "name: \"%.64s\" is not a valid adapter name (1..63 of [A-Za-z0-9._-])",
                        name);
    bool known = gw__adapter_known(c->g, name);
    if (load && known)
        return end_call(c, GRPC_STATUS_ALREADY_EXISTS, "name: adapter %s is already loaded",
                        name);
    if (!load && !known)
        return end_call(c, GRPC_STATUS_NOT_FOUND, "name: adapter %s: not found", name);
    if (load && (path[0] != '/' || strlen(path) > SHM_MAX_PATH))
        return end_call(c, GRPC_STATUS_INVALID_ARGUMENT,
                        "path: \"%.200s\" must be an absolute directory on the server", path);
    /* the workers run on this host: what the path is, is known here (a plain file came back
     * INTERNAL from every worker) */
    struct stat sb;
    if (load && stat(path, &sb) < 0) {
        int e = errno;
        return end_call(c, e == ENOENT ? GRPC_STATUS_NOT_FOUND : GRPC_STATUS_INVALID_ARGUMENT,
                        "adapter %s: path: %.200s: %s", name, path, strerror(e));
    }
    if (load && !S_ISDIR(sb.st_mode))
        return end_call(c, GRPC_STATUS_INVALID_ARGUMENT,
                        "adapter %s: path: %.200s is not a directory (a PEFT adapter directory: "
                        "adapter_config.json + adapter_model.safetensors)", name, path);
    int slots[CONFIG_MAX_WORKERS];
    size_t n = gw__ready_slots(c->g, slots, CONFIG_MAX_WORKERS);
    if (n == 0)
        return end_call(c, GRPC_STATUS_UNAVAILABLE, "no worker is ready");
    if (items_alloc(c, n) < 0)
        return end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
    for (size_t i = 0; i < n; i++) {
        struct shm_msg m;
        if (load)
            m = (struct shm_msg){.type = SHM_MSG_ADAPTER_LOAD,
                                 .adapter_load = {.name = name, .path = path}};
        else
            m = (struct shm_msg){.type = SHM_MSG_ADAPTER_UNLOAD, .name = {.name = name}};
        char why[512];
        int st = gw__submit(c->g, slots[i], &m, c, i, why, sizeof why);
        if (st) {
            pthread_mutex_lock(&c->mu);
            item_fail(c, &c->items[i], st, why);
            pump(c);
            pthread_mutex_unlock(&c->mu);
        }
    }
    after_submit(c);
}

static void start_list_models(struct gw_call *c)
{
    struct gw_model_info mi;
    if (!gw__model(c->g, &mi))
        return end_call(c, GRPC_STATUS_UNAVAILABLE, "no worker has loaded the model yet");
    Clocher__V1__ListModelsResponse r = CLOCHER__V1__LIST_MODELS_RESPONSE__INIT;
    Clocher__V1__ModelInfo m = CLOCHER__V1__MODEL_INFO__INIT, *pm = &m;
    m.name = mi.name, m.architecture = mi.arch, m.dtype = mi.dtype;
    m.has_parameters = m.has_vocab_size = m.has_context_length = 1;
    m.parameters = mi.parameters, m.vocab_size = mi.vocab_size;
    m.context_length = mi.context_length;
    r.n_models = 1, r.models = &pm;
    c->answer = pack(&r.base);
}

static void start_list_adapters(struct gw_call *c)
{
    struct gw *g = c->g;
    pthread_mutex_lock(&g->adapters_mu);
    size_t n = g->n_adapters;
    Clocher__V1__AdapterInfo *infos = calloc(n ? n : 1, sizeof *infos);
    Clocher__V1__AdapterInfo **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    char *(*mods)[7] = calloc(n ? n : 1, sizeof *mods);
    size_t k = 0;
    for (size_t i = 0; infos && ptrs && mods && i < n; i++) {
        const struct gw_adapter *a = &g->adapters[i];
        if (a->unloaded || (c->tcfg && !config_tenant_allows(c->tcfg, a->name)))
            continue;
        struct gw_item tmp = {.ans_adapter = {.rank = a->rank, .alpha = a->alpha,
                                              .targets = a->targets}};
        Clocher__V1__AdapterInfo init = CLOCHER__V1__ADAPTER_INFO__INIT;
        infos[k] = init;
        adapter_info(&tmp, a->name, &infos[k], mods[k]);
        infos[k].has_active_requests = 0;
        infos[k].source = (char *)(a->from_config ? "config" : "runtime");
        ptrs[k] = &infos[k];
        k++;
    }
    if (infos && ptrs && mods) {
        Clocher__V1__ListAdaptersResponse r = CLOCHER__V1__LIST_ADAPTERS_RESPONSE__INIT;
        r.n_adapters = k, r.adapters = ptrs;
        c->answer = pack(&r.base); /* names are copied by the packing, under the lock */
    }
    pthread_mutex_unlock(&g->adapters_mu);
    free(infos), free(ptrs), free(mods);
    if (!c->answer)
        end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
}

static void start_metrics(struct gw_call *c)
{
    if (!c->g->stats)
        return end_call(c, GRPC_STATUS_UNIMPLEMENTED, "metrics are not collected");
    char *text = NULL;
    size_t len = 0;
    /* a tenant sees its own series; an admin, or anonymous access, every tenant's */
    const char *only = c->tcfg && !c->tcfg->admin ? c->tenant : NULL;
    if (stats_render_for(c->g->stats, c->g->w, only, &text, &len) < 0)
        return end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
    Clocher__V1__GetMetricsResponse r = CLOCHER__V1__GET_METRICS_RESPONSE__INIT;
    r.prometheus_text = text;
    c->answer = pack(&r.base);
    free(text);
}

static int health_of(struct gw_call *c, int *status)
{
    Grpc__Health__V1__HealthCheckRequest *r =
        request_of(c, &grpc__health__v1__health_check_request__descriptor);
    if (!r)
        return -1;
    if (r->service && r->service[0] && strcmp(r->service, "clocher.v1.Inference") != 0) {
        end_call(c, GRPC_STATUS_NOT_FOUND, "service \"%.64s\" is not served here", r->service);
        return -1;
    }
    *status = gw__health(c->g);
    return 0;
}

static int authenticate_value(struct gw_call *c, const char *value, size_t len);

/* The tenant of the call from its authorization metadata; ends the call if there is none. */
static int authenticate(struct gw_call *c)
{
    const char *value = NULL;
    size_t len = 0;
    for (size_t i = 0; i < c->md.count; i++)
        if (grpc_slice_str_cmp(c->md.metadata[i].key, "authorization") == 0) {
            value = (const char *)GRPC_SLICE_START_PTR(c->md.metadata[i].value);
            len = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
            break;
        }
    return authenticate_value(c, value, len);
}

/* The tenant of an authorization value (NULL = none given); ends the call if there is none. */
static int authenticate_value(struct gw_call *c, const char *value, size_t len)
{
    const struct config_tenant *t = NULL;
    int rc = auth_tenant(c->cfg, value, len, &t);
    if (rc < 0) {
        end_call(c, GRPC_STATUS_UNAUTHENTICATED,
                 rc == ERR_FORMAT ? "missing API key: send metadata \"authorization: Bearer "
                                    "<key>\""
                                  : "unknown API key");
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    c->tcfg = t;
    snprintf(c->tenant, sizeof c->tenant, "%s", t ? t->name : "");
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void gw__call_arrived(struct gw_call *c, bool ok)
{
    struct gw *g = c->g;
    if (!ok) {
        gw__call_unref(c); /* the server is shutting down: no call came */
        return;
    }
    /* the connection, read now: once a client has reset the stream gRPC answers "unknown" */
    char *peer = grpc_call_get_peer(c->call);
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "unknown");
    default_rid(c);
    gpr_free(peer);
    c->start_ns = mono_ns();
    c->cfg = config_ptr_get(g->w->config);
    if (c->method == GW_UNKNOWN)
        c->deadline = c->details.deadline;
    /* this state machine's own tags: every batch it starts comes back to on_sent / on_close
     * (set last: their release publishes the fields above to the CQ thread that runs them) */
    gw__tag_set(&c->t_close, on_close, c);
    gw__tag_set(&c->t_send, on_sent, c);

    grpc_op op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER,
                  .data.recv_close_on_server.cancelled = &c->close_cancelled};
    gw__call_ref(c);
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
        LOG_ERR("gateway: request %s: cannot watch the call for its end", c->rid);
        gw__call_unref(c);
    }

    /* the global caps: a connection over limits.max_connections, a call beyond
     * limits.max_calls open at once (health checks pass: probes must see a busy daemon) */
    c->live = true;
    size_t open = atomic_fetch_add(&g->live_calls, 1) + 1;
    if (gw__conn_over(g, c->peer)) {
        if (g->stats)
            stats_global_refusal(g->stats, "max_connections");
        end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "limits.max_connections: %" PRIu32 " connections are open already; this one "
                 "is closed, retry later", c->cfg->limits.max_connections);
        goto out;
    }
    if (open > c->cfg->limits.max_calls && c->method != GW_HEALTH_CHECK) {
        if (g->stats)
            stats_global_refusal(g->stats, "max_calls");
        end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "limits.max_calls: %" PRIu32 " calls are open across all connections; retry "
                 "later", c->cfg->limits.max_calls);
        goto out;
    }

    switch (c->method) {
    case GW_UNKNOWN: {
        char path[160];
        size_t n = GRPC_SLICE_LENGTH(c->details.method);
        snprintf(path, sizeof path, "%.*s", (int)(n < 120 ? n : 120),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        end_call(c, GRPC_STATUS_UNIMPLEMENTED, "method %s is not implemented here", path);
        break;
    }
    case GW_HEALTH_CHECK: {
        int h;
        if (health_of(c, &h) == 0) {
            c->answer = health_message(h);
            pthread_mutex_lock(&c->mu);
            pump(c);
            pthread_mutex_unlock(&c->mu);
        }
        break;
    }
    case GW_HEALTH_WATCH: {
        int h;
        if (health_of(c, &h) < 0)
            break;
        pthread_mutex_lock(&g->adapters_mu);
        if (g->n_watch == g->cap_watch) {
            size_t cap = g->cap_watch ? 2 * g->cap_watch : 8;
            struct gw_call **p = realloc(g->watch, cap * sizeof *p);
            if (p)
                g->watch = p, g->cap_watch = cap;
        }
        bool listed = g->n_watch < g->cap_watch;
        if (listed) {
            g->watch[g->n_watch++] = c;
            gw__call_ref(c);
            /* its client may have gone already, on_close (another CQ thread) not finding it
             * in the list: then it leaves it here */
            pthread_mutex_lock(&c->mu);
            bool gone = c->close_seen;
            pthread_mutex_unlock(&c->mu);
            if (gone) {
                g->n_watch--;
                atomic_fetch_sub(&c->refs, 1); /* the list's; not the last: ours is held */
            }
        }
        pthread_mutex_unlock(&g->adapters_mu);
        if (!listed) {
            end_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gateway out of memory");
            break;
        }
        pthread_mutex_lock(&c->mu);
        c->health_now = h;
        pump(c);
        pthread_mutex_unlock(&c->mu);
        break;
    }
    default:
        if (authenticate(c) < 0)
            break;
        if (!atomic_load(&g->accepting) &&
            (c->method == GW_GENERATE || c->method == GW_BATCH_GENERATE)) {
            end_call(c, GRPC_STATUS_UNAVAILABLE,
                     "the daemon is draining: it takes no new generations");
            break;
        }
        if (!c->payload) {
            end_call(c, GRPC_STATUS_INVALID_ARGUMENT, "request: no message");
            break;
        }
        switch (c->method) {
        case GW_GENERATE: start_generate(c); break;
        case GW_BATCH_GENERATE: start_batch(c); break;
        case GW_TOKENIZE: start_tokenize(c); break;
        case GW_DETOKENIZE: start_detokenize(c); break;
        case GW_LOAD_ADAPTER: start_adapter_op(c, true); break;
        case GW_UNLOAD_ADAPTER: start_adapter_op(c, false); break;
        case GW_LIST_MODELS: start_list_models(c); break;
        case GW_LIST_ADAPTERS: start_list_adapters(c); break;
        case GW_GET_METRICS: start_metrics(c); break;
        default: end_call(c, GRPC_STATUS_INTERNAL, "unhandled method"); break;
        }
        /* answers made at once (no worker involved) */
        pthread_mutex_lock(&c->mu);
        pump(c);
        pthread_mutex_unlock(&c->mu);
    }
out:
    gw__call_unref(c); /* the arrival's */
}

/* ---- generations on behalf of a caller that is not gRPC (gw_internal.h) ---- */

/* What a call made for another door (HTTP) starts with: its request id, the owner's wake-up,
 * the start time, no deadline but the request's own, and the configuration of the moment. */
static void ext_call_init(struct gw *g, struct gw_call *c, const char *rid,
                          void (*changed)(void *ud), void *ud)
{
    default_rid(c);
    set_rid(c, rid);
    c->sink = changed;
    c->sink_ud = ud;
    c->start_ns = mono_ns();
    c->deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    c->cfg = config_ptr_get(g->w->config);
}

int gw_ext_generate(struct gw *g, const char *rid, const char *authorization, size_t auth_len,
                    Clocher__V1__GenerateRequest *const *reqs, size_t n,
                    void (*changed)(void *ud), void *ud, struct gw_call **out)
{
    struct gw_call *c = gw__call_new(g, n == 1 ? GW_GENERATE : GW_BATCH_GENERATE, NULL);
    *out = NULL;
    if (!c || items_alloc(c, n) < 0) {
        if (c)
            gw__call_unref(c);
        LOG_ERR("gateway: request %s: out of memory for the HTTP request", rid);
        return -ENOMEM;
    }
    ext_call_init(g, c, rid, changed, ud);
    *out = c; /* the owner's reference: gw_ext_release drops it */
    gw__call_ref(c); /* this function's, while it submits */
    if (authenticate_value(c, authorization, auth_len) < 0)
        goto out;
    if (!atomic_load(&g->accepting)) {
        end_call(c, GRPC_STATUS_UNAVAILABLE, "the daemon is draining: it takes no new generations");
        goto out;
    }
    if (begin_stream(c) < 0)
        goto out;
    /* the tenant's quotas, as for a BatchGenerate of n (the HTTP door maps the refusal to 429
     * with Retry-After) */
    if (admit_items(c, reqs, n) < 0)
        goto out;
    struct gw_req_ctx ctx;
    struct gw_model_info mi;
    ctx_init(c, &ctx, &mi);
    for (size_t i = 0; i < n; i++) {
        struct shm_msg m = {.type = SHM_MSG_GENERATE};
        char why[512];
        ctx.seed = ctx.seed * 6364136223846793005ull + 1442695040888963407ull; /* as a batch */
        char *chat = NULL;
        int st = req_generate(reqs[i], &ctx, &m.generate, &chat, why, sizeof why);
        if (!st && m.generate.adapter)
            snprintf(c->items[i].adapter, sizeof c->items[i].adapter, "%s", m.generate.adapter);
        if (!st) {
            if (g->stats)
                stats_queue_depth_add(g->stats, 1);
            st = gw__submit(g, -1, &m, c, i, why, sizeof why);
            if (g->stats)
                stats_queue_depth_add(g->stats, -1);
        }
        free(chat);
        if (st) {
            if (n == 1 || i == 0) {
                /* the first refusal ends the call: the others would say the same */
                end_call(c, st, "%s", why);
                for (size_t k = 0; k < i; k++)
                    gw__cancel_item(g, c, k);
                goto out;
            }
            pthread_mutex_lock(&c->mu);
            item_fail(c, &c->items[i], st, why);
            pump(c);
            pthread_mutex_unlock(&c->mu);
        }
    }
    after_submit(c);
out:
    gw__call_unref(c);
    return 0;
}

/* chat tools: a call run's text as one more gw_ext_call piece. */
static int take_call(const struct gw_seg *sg, const char *text, size_t n, struct gw_ext_call **calls,
                     size_t *n_calls)
{
    struct gw_ext_call *p = realloc(*calls, (*n_calls + 1) * sizeof *p);
    if (!p)
        return -ENOMEM;
    *calls = p;
    struct gw_ext_call *e = &p[*n_calls];
    *e = (struct gw_ext_call){.index = sg->call - 1, .opens = sg->call_opens, .args_len = n};
    memcpy(e->id, sg->call_id, sizeof e->id);
    memcpy(e->name, sg->call_name, sizeof e->name);
    if (!(e->args = malloc(n + 1)))
        return -ENOMEM;
    memcpy(e->args, text, n);
    e->args[n] = '\0';
    (*n_calls)++;
    return 0;
}

int gw_ext_take_chat_calls(struct gw_call *c, size_t i, char **content, size_t *len,
                           size_t *cap, char **reasoning, size_t *rlen, size_t *rcap,
                           struct gw_ext_call **calls, size_t *n_calls,
                           struct gw_ext_state *st)
{
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    struct gw_item *it = &c->items[i];
    size_t start = 0;
    for (size_t k = 0; k < it->n_segs && rc == 0; k++) {
        const struct gw_seg *sg = &it->segs[k];
        bool thinking = sg->channel == SHM_CH_ANALYSIS;
        size_t end = sg->text_end;
        if (calls && sg->call) {
            if ((end > start || sg->call_opens) &&
                take_call(sg, it->text + start, end - start, calls, n_calls) < 0)
                rc = -ENOMEM;
        } else if (end > start &&
                   append_text(thinking ? reasoning : content, thinking ? rlen : len,
                               thinking ? rcap : cap, it->text + start, end - start) < 0) {
            rc = -ENOMEM;
        }
        start = end;
    }
    if (rc == 0 && it->text_len > start &&
        append_text(content, len, cap, it->text + start, it->text_len - start) < 0)
        rc = -ENOMEM;
    if (rc == 0)
        consume_pending(it); /* an open call goes on in the next take's runs */
    st->done = it->done;
    st->status = c->status ? c->status : it->status;
    snprintf(st->error, sizeof st->error, "%s",
             c->status ? c->status_msg : it->error ? it->error : "");
    st->finished = it->finished;
    st->fin = it->fin;
    if (it->tool_call && st->fin.reason == SHM_FINISH_EOS)
        st->fin.reason = (enum shm_finish)GW_FINISH_TOOL_CALL;
    st->tokens = it->sent_tokens + it->n_ids;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int gw_ext_take_chat(struct gw_call *c, size_t i, char **content, size_t *len, size_t *cap,
                     char **reasoning, size_t *rlen, size_t *rcap, struct gw_ext_state *st)
{
    return gw_ext_take_chat_calls(c, i, content, len, cap, reasoning, rlen, rcap, NULL, NULL, st);
}

int gw_ext_take(struct gw_call *c, size_t i, char **buf, size_t *len, size_t *cap,
                struct gw_ext_state *st)
{
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    struct gw_item *it = &c->items[i];
    if (it->text_len && append_text(buf, len, cap, it->text, it->text_len) < 0)
        rc = -ENOMEM;
    else
        consume_pending(it);
    st->done = it->done;
    st->status = c->status ? c->status : it->status;
    snprintf(st->error, sizeof st->error, "%s",
             c->status ? c->status_msg : it->error ? it->error : "");
    st->finished = it->finished;
    st->fin = it->fin;
    st->tokens = it->sent_tokens + it->n_ids;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void gw_ext_take_logprobs(struct gw_call *c, size_t i, struct gw_lp **lps, size_t *n,
                          char **bytes)
{
    pthread_mutex_lock(&c->mu);
    struct gw_item *it = &c->items[i];
    *lps = it->lps, *n = it->n_lps, *bytes = it->lp_bytes;
    it->lps = NULL, it->n_lps = it->cap_lps = 0;
    it->lp_bytes = NULL, it->lp_len = it->lp_cap = 0;
    pthread_mutex_unlock(&c->mu);
}

/* ---- adapter management on behalf of a caller that is not gRPC (gw_internal.h) ---- */

int gw_ext_adapter(struct gw *g, const char *rid, const char *authorization, size_t auth_len,
                   bool load, const char *name, const char *path, void (*changed)(void *ud),
                   void *ud, struct gw_call **out)
{
    struct gw_call *c = gw__call_new(g, load ? GW_LOAD_ADAPTER : GW_UNLOAD_ADAPTER, NULL);
    *out = NULL;
    if (!c) {
        LOG_ERR("gateway: request %s: out of memory for the HTTP request", rid);
        return -ENOMEM;
    }
    ext_call_init(g, c, rid, changed, ud);
    *out = c; /* the owner's reference: gw_ext_release drops it */
    gw__call_ref(c); /* this function's, while it submits */
    if (authenticate_value(c, authorization, auth_len) == 0) {
        /* the request as a gRPC client sends it: start_adapter_op reads the payload, so both
         * doors share every check (ACL, names, paths) and the answer's bookkeeping */
        if (load) {
            Clocher__V1__LoadAdapterRequest q = CLOCHER__V1__LOAD_ADAPTER_REQUEST__INIT;
            q.name = (char *)name, q.path = (char *)path;
            c->payload = pack(&q.base);
        } else {
            Clocher__V1__UnloadAdapterRequest q = CLOCHER__V1__UNLOAD_ADAPTER_REQUEST__INIT;
            q.name = (char *)name;
            c->payload = pack(&q.base);
        }
        start_adapter_op(c, load);
    }
    pthread_mutex_lock(&c->mu);
    pump(c); /* refusals made at once reach the owner too */
    pthread_mutex_unlock(&c->mu);
    gw__call_unref(c);
    return 0;
}

bool gw_ext_adapter_result(struct gw_call *c, int *status, char *msg, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    bool done = c->status_sent;
    if (done) {
        const char *detail = "";
        int st = c->status;
        if (st) {
            detail = c->status_msg;
        } else {
            /* the gRPC answer, built and dropped: it records the adapter (or its removal) */
            grpc_byte_buffer *bb = unary_answer(c, &st, &detail);
            if (bb)
                grpc_byte_buffer_destroy(bb);
        }
        *status = st;
        snprintf(msg, cap, "%s", detail ? detail : "");
    }
    pthread_mutex_unlock(&c->mu);
    return done;
}

void gw_ext_release(struct gw_call *c)
{
    size_t n_cancel = 0;
    pthread_mutex_lock(&c->mu);
    c->sink_ud = NULL;
    if (!c->status_sent && !c->closed) {
        c->closed = true;
        record(c, GRPC_STATUS_CANCELLED);
        end_stream(c);
        for (size_t i = 0; i < c->n_items; i++)
            if (!c->items[i].done) {
                item_fail(c, &c->items[i], GRPC_STATUS_CANCELLED, "the client went away");
                n_cancel++;
            }
    }
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < c->n_items && n_cancel; i++)
        gw__cancel_item(c->g, c, i);
    gw__call_unref(c);
}
