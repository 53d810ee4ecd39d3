/*
 * serve.c — the worker's serving loop between its shm rings and the engine (see serve.h).
 *
 * NOTES: one thread for the engine and the rings, plus the tokenizer's (tokq.h: text is
 * tokenized beside this loop, so a large one never stalls the steps). Engine events arrive
 * through on_event() from inside engine_step() / engine_cancel() on this same thread and are
 * sent at once (a callback may not call the engine: a request that must be cancelled from
 * there is marked and cancelled after the step); when the event ring is full the
 * send waits in one-second slices, giving the control socket its WATCHDOG=1 between slices
 * (a slow gateway is not a hung worker). The request table maps the gateway's request ids to
 * the engine's; an entry lives from a successful engine_submit to its FINISH or ERROR event.
 */
#include "serve.h"
#include "mono.h"

#include "check.h"
#include "dtype.h"
#include "engine.h"
#include "chat.h"
#include "err.h"
#include "heritage.h"
#include "hotrepl.h"
#include "iebin.h"
#include "log.h"
#include "lora.h"
#include "msg.h"
#include "pool.h"
#include "region.h"
#include "sampler.h"
#include "tok.h"
#include "tokq.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <numa.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SERVE_MAGIC 0x53525645u           /* "SRVE" */
#define WATCHDOG_NS 1000000000ull         /* WATCHDOG=1 about once a second */
#define IDLE_WAIT_NS 500000000ll          /* an empty request ring is re-checked this often */
#define SEND_SLICE_NS 1000000000ll        /* a full event ring: WATCHDOG between these waits */
#define STOP_CANCEL_NS 5000000000ull      /* on SIGTERM: at most this long to cancel */
#define GATHER_GAP_NS 100000ll            /* a burst's requests arrive closer than this */
#define GATHER_MAX_NS 1000000ull          /* an idle engine waits at most this for a burst */
#define TOKQ_POLL_NS 1000000ll            /* an idle loop looks for tokenized texts this often */
#define HELD_MAX 16                       /* records read in a step kept for after it */

/* ---- the request table: gateway request id -> engine id ---- */

struct req {
    uint64_t key;                         /* gateway request id; 0 = empty slot */
    uint64_t engine_id;
    bool doomed;                          /* its ERROR is sent: drop its events, cancel it */
    bool cancel_sent;
    bool chat;                            /* a chat: its pieces carry a channel */
    enum shm_finish chat_stop;            /* harmony <|return|>/<|call|> seen: cancelled after
                                           * the step, finishing with this reason; 0 = none */
    struct chat_out *co;                  /* chats: the generated text's parser (chat.h; owned) */
    char adapter[LORA_NAME_MAX];          /* "" = base model (ADAPTER's active_requests) */
    /* FINISH's timings start when the worker read the GENERATE, not at engine_submit: a text
     * waits for the tokenizer, and a record read during a step for that step's end */
    uint64_t t_read;                      /* s->arrivals: when its wait began (arrival_ns) */
    uint64_t pre_ns;                      /* s->reqs: record read -> engine_submit */
};

struct reqmap {
    struct req *slots;                    /* [cap], cap a power of two */
    size_t cap, n;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static struct req *reqmap_find(struct reqmap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key)
            return &m->slots[i];
        if (m->slots[i].key == 0)
            return NULL;
    }
}

static int reqmap_grow(struct reqmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct req *s = calloc(cap, sizeof *s);
    if (!s)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key)
            continue;
        size_t j = mix(m->slots[i].key) & (cap - 1);
        while (s[j].key)
            j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

/* Inserts a key not present; 0 or -ENOMEM. */
static int reqmap_put(struct reqmap *m, const struct req *r)
{
    if ((m->n + 1) * 4 > m->cap * 3 && reqmap_grow(m) < 0)
        return -ENOMEM;
    size_t i = mix(r->key) & (m->cap - 1);
    while (m->slots[i].key)
        i = (i + 1) & (m->cap - 1);
    m->slots[i] = *r;
    m->n++;
    return 0;
}

/* Removes an entry by backward-shift deletion (no tombstones). */
static void reqmap_del(struct reqmap *m, struct req *e)
{
    chat_out_free(e->co);
    e->co = NULL;
    size_t i = (size_t)(e - m->slots), mask = m->cap - 1;
    m->slots[i].key = 0;
    m->n--;
    for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
        size_t home = mix(m->slots[j].key) & mask;
        /* move j back to i when i lies cyclically in [home, j) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->slots[i] = m->slots[j];
            m->slots[j].key = 0;
            i = j;
        }
    }
}

/* ---- the serve ---- */

/* An adapter the engine has loaded and the directory it came from: a LOAD repeating both is
 * answered as done (the gateway replays a reload's changes to a worker that may have been
 * started from the new command line already). */
struct served_adapter {
    char name[SHM_MAX_NAME + 1];
    char *dir;
};

/* A request record read during an engine step that needs the engine: handled after it. */
struct held_rec {
    struct held_rec *next;
    struct shm_msg m;                     /* views into buf */
    uint64_t t_read;                      /* mono_ns() when it was read */
    void *buf;
};

struct serve {
    uint32_t magic;
    struct serve_options o;
    struct shm_region *region;
    struct shm_ring *rx, *tx;             /* requests (consumed), events (produced) */
    void *buf;                            /* [buf_cap] one request record, 8-byte aligned */
    size_t buf_cap;
    struct engine *e;
    struct tok *tok;                      /* NULL: the model has no tokenizer */
    struct tokq *tokq;                    /* its thread (tokq.h); NULL without a tokenizer */
    enum chat_template chat;              /* how chats are rendered (chat.h) */
    char chat_why[256];                   /* CHAT_TPL_NONE: why */
    struct tokq_job *deferred, *deferred_tail; /* tokenized during a step: submitted after it */
    struct held_rec *held, *held_tail;    /* read during a step, for after it */
    size_t n_held;
    uint32_t vocab_size;
    struct reqmap reqs;
    struct reqmap arrivals;               /* texts in the tokenizer: id -> t_read */
    uint64_t rec_read_ns;                 /* when the record being handled was read */
    struct served_adapter *adapters;      /* [n_adapters] what the engine has loaded, by name */
    size_t n_adapters, cap_adapters;
    uint64_t hot_bytes;
    size_t hot_tensors;
    uint64_t last_watchdog_ns;
    int fatal;                            /* < 0: a ring or the control socket failed */
    bool ctl_gone;
};

static bool stopping(const struct serve *s) { return s->o.stop && *s->o.stop; }

/* One control datagram (shm/heritage.h, parsed by daemon/ctl.c). Non-blocking: a supervisor
 * too busy to read loses a WATCHDOG, never our loop. A supervisor gone ends the worker: nobody
 * would route to it. */
static int ctl_send(struct serve *s, const struct heritage_ctl_msg *m)
{
    if (s->o.control_fd < 0 || s->ctl_gone)
        return 0;
    char buf[HERITAGE_CTL_MSG_MAX + 1];
    size_t n = heritage_ctl_format(m, buf, sizeof buf);
    while (send(s->o.control_fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        int e = errno;
        LOG_ERR("control socket: %s: clocherd is gone", strerror(e));
        s->ctl_gone = true;
        return -e;
    }
    return 0;
}

/* Liveness for both audiences: the region (the gateway) and the control socket (clocherd). */
static void beat(struct serve *s)
{
    shm_region_heartbeat(s->region);
    uint64_t t = mono_ns();
    if (t - s->last_watchdog_ns >= WATCHDOG_NS) {
        s->last_watchdog_ns = t;
        if (ctl_send(s, &(struct heritage_ctl_msg){.watchdog = true}) < 0 && s->fatal == 0)
            s->fatal = -EPIPE;
    }
}

static void take_tokenized(struct serve *s, bool in_step);
static void drain_requests_in_step(struct serve *s);

/* engine_set_progress: a long step (a 512-token prefill chunk of a 1B model on a loaded
 * machine can take many seconds) keeps both heartbeats fresh layer by layer, and answers the
 * tokenizer's refusals meanwhile. */
static void beat_from_step(void *ud)
{
    beat(ud);
    drain_requests_in_step(ud);
    take_tokenized(ud, true);
}

/* Sends one event record, waiting for room in slices. A failure is fatal to the loop. */
static int send_event(struct serve *s, const struct shm_msg *m)
{
    if (s->fatal < 0)
        return s->fatal;
    for (;;) {
        int rc = shm_msg_send_wait(s->tx, m, SEND_SLICE_NS);
        if (rc == 0)
            return 0;
        if (rc == -ETIMEDOUT || rc == -EINTR) {
            beat(s);
            if (s->fatal < 0)
                return s->fatal;
            continue;
        }
        if (rc == ERR_FORMAT || rc == ERR_RANGE) {
            /* our record was refused by the encoder: a bug on this side, not the ring's */
            LOG_ERR("event %s for request %" PRIu64 " cannot be encoded (%s)",
                    shm_msg_type_name(m->type), m->request_id, err_name(rc));
            return rc;
        }
        LOG_ERR("the events ring failed (%s): the gateway cannot hear this worker any more",
                err_name(rc));
        s->fatal = rc;
        return rc;
    }
}

/* An ERROR record for request `id`; the message is the caller's, at most SHM_MAX_ERROR bytes. */
static int send_error(struct serve *s, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int send_error(struct serve *s, uint64_t id, int code, const char *fmt, ...)
{
    char msg[SHM_MAX_ERROR + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!msg[0])
        snprintf(msg, sizeof msg, "%s", err_str(code));
    /* the wire allows any bytes but NUL; keep it one line of text for the gateway's status */
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = ' ';
    struct shm_msg m = {.type = SHM_MSG_ERROR,
                        .error = {.request_id = id, .code = code < 0 ? code : ERR_STATE,
                                  .message = msg}};
    return send_event(s, &m);
}

/* ---- engine events -> event records ---- */

static enum shm_finish finish_reason(enum engine_finish r)
{
    switch (r) {
    case ENGINE_FINISH_EOS: return SHM_FINISH_EOS;
    case ENGINE_FINISH_LENGTH: return SHM_FINISH_LENGTH;
    case ENGINE_FINISH_STOP: return SHM_FINISH_STOP;
    case ENGINE_FINISH_CANCELLED: return SHM_FINISH_CANCELLED;
    case ENGINE_FINISH_DEADLINE: return SHM_FINISH_DEADLINE;
    case ENGINE_FINISH_CONTEXT: return SHM_FINISH_CONTEXT;
    case ENGINE_FINISH_ERROR: break;
    }
    return 0;
}

static uint64_t ms_to_ns(double ms) { return ms > 0 && isfinite(ms) ? (uint64_t)(ms * 1e6) : 0; }

/* A chat's pieces (chat.h's parser: harmony channels, tool calls) as TOKEN records: the first
 * carries m's id and logprobs, the others go as text-only pieces. */
static void send_pieces(struct serve *s, struct shm_msg *m, const struct chat_piece *p, size_t n,
                        bool call)
{
    for (size_t i = 0; i < n; i++) {
        if (i > 0 || m->token.token < 0) {
            if (!p[i].len)
                continue; /* a text-only piece carries text */
            m->token.token = -1, m->token.has_logprob = false, m->token.n_top = 0;
        }
        m->token.channel = p[i].channel;
        m->token.text = p[i].text;
        m->token.text_len = (uint32_t)p[i].len;
        m->token.call = call && m->token.token >= 0;
        m->token.call_name = p[i].call_name, m->token.call_id = p[i].call_id;
        m->token.call_name_len = p[i].call_name ? (uint32_t)strlen(p[i].call_name) : 0;
        m->token.call_id_len = p[i].call_id ? (uint32_t)strlen(p[i].call_id) : 0;
        send_event(s, m);
    }
}

/* A chat's token through its parser; a stop id marks the request to finish. */
static void send_chat(struct serve *s, struct req *r, const struct engine_event *ev,
                      struct shm_msg *m)
{
    if (r->chat_stop)
        return; /* after the model's own stop */
    const struct chat_piece *p;
    size_t n;
    bool stop, call;
    chat_out_push(r->co, ev->token, ev->text_len ? ev->text : "", ev->text_len, &p, &n, &stop,
                  &call);
    send_pieces(s, m, p, n, call);
    if (stop)
        r->chat_stop = SHM_FINISH_EOS;
}

/* A token event's logprobs as the TOKEN record carries them: the sampler's values (sampler.h
 * and shm_abi.h share the bound and the floor) with each token's own bytes. */
static void logprob_entry(const struct serve *s, int32_t id, float lp, struct shm_msg_logprob *x)
{
    const char *b = NULL;
    size_t n = 0;
    if (!s->tok || tok_piece(s->tok, id, &b, &n) < 0)
        b = NULL, n = 0;
    *x = (struct shm_msg_logprob){.id = id, .logprob = lp, .piece = b,
                                  .piece_len = (uint32_t)(n < SHM_MAX_LOGPROB_PIECE
                                                              ? n : SHM_MAX_LOGPROB_PIECE)};
}

static void logprobs_of(const struct serve *s, const struct engine_event *ev,
                        struct shm_msg_token *t)
{
    t->has_logprob = true;
    logprob_entry(s, ev->token, ev->logprob, &t->own);
    t->n_top = ev->n_top < SHM_MAX_TOP_LOGPROBS ? ev->n_top : SHM_MAX_TOP_LOGPROBS;
    for (uint32_t i = 0; i < t->n_top; i++)
        logprob_entry(s, ev->top[i].id, ev->top[i].logprob, &t->top[i]);
}

static void on_event(const struct engine_event *ev, void *ud)
{
    struct serve *s = ud;
    uint64_t id = (uint64_t)(uintptr_t)ev->user;
    struct req *r = reqmap_find(&s->reqs, id);
    if (!r)
        return; /* not (or no longer) a request the gateway waits on */
    if (r->doomed) {
        /* its ERROR has been sent: only the final FINISH matters, to forget it */
        if (ev->kind == ENGINE_EV_FINISH)
            reqmap_del(&s->reqs, r);
        return;
    }
    switch (ev->kind) {
    case ENGINE_EV_TOKEN: {
        if (ev->token < 0 && ev->text_len == 0)
            return; /* nothing was held back */
        if (ev->text_len > SHM_MAX_PIECE) {
            send_error(s, id, ERR_RANGE, "token %" PRId32 " decodes to %zu bytes, the limit of "
                       "a token event is %u", ev->token, ev->text_len, SHM_MAX_PIECE);
            r->doomed = true; /* cancelled after this step: no engine call from a callback */
            return;
        }
        /* token -1 is the text the engine held back until the end: a text-only piece */
        struct shm_msg m = {.type = SHM_MSG_TOKEN,
                            .token = {.request_id = id, .token = ev->token < 0 ? -1 : ev->token,
                                      .channel = r->chat ? SHM_CH_FINAL : SHM_CH_NONE,
                                      .text = ev->text_len ? ev->text : "",
                                      .text_len = (uint32_t)ev->text_len}};
        if (ev->has_logprob && ev->token >= 0)
            logprobs_of(s, ev, &m.token);
        if (r->co)
            send_chat(s, r, ev, &m);
        else
            send_event(s, &m);
        return;
    }
    case ENGINE_EV_FINISH: {
        enum shm_finish reason = finish_reason(ev->reason);
        if (reason && r->chat_stop)
            reason = r->chat_stop; /* the model's own stop, whatever ended the engine's request */
        if (reason && r->co) { /* what the parser still holds (a call that never closed) */
            const struct chat_piece *p;
            size_t n;
            chat_out_flush(r->co, &p, &n);
            struct shm_msg t = {.type = SHM_MSG_TOKEN, .token = {.request_id = id, .token = -1}};
            send_pieces(s, &t, p, n, false);
        }
        uint64_t pre_ns = r->pre_ns;
        reqmap_del(&s->reqs, r);
        if (!reason) {
            send_error(s, id, ev->code < 0 ? ev->code : ERR_STATE, "%s",
                       ev->message ? ev->message : "the engine ended the request with an error");
            return;
        }
        uint32_t cached = ev->cached_tokens <= ev->prompt_tokens ? ev->cached_tokens
                                                                   : ev->prompt_tokens;
        struct shm_msg m = {.type = SHM_MSG_FINISH,
                            .finish = {.request_id = id, .reason = reason,
                                       .prompt_tokens = ev->prompt_tokens,
                                       .completion_tokens = ev->generated_tokens,
                                       .cached_tokens = cached,
                                       .queue_ns = pre_ns + ms_to_ns(ev->queue_ms),
                                       .ttft_ns = ev->generated_tokens
                                                      ? pre_ns + ms_to_ns(ev->ttft_ms) : 0,
                                       .tpot_ns = ms_to_ns(ev->tpot_ms),
                                       .e2e_ns = pre_ns + ms_to_ns(ev->e2e_ms)}};
        send_event(s, &m);
        return;
    }
    case ENGINE_EV_ERROR:
        /* the last record the gateway gets; the engine's FINISH that follows is dropped */
        send_error(s, id, ev->code, "%s", ev->message ? ev->message : "");
        r->doomed = true;
        r->cancel_sent = true; /* the engine is ending it already */
        return;
    }
}

/* Cancels requests marked from inside a callback (outside of it, as engine.h requires). */
static void cancel_doomed(struct serve *s)
{
    for (size_t i = 0; i < s->reqs.cap; i++) {
        struct req *r = &s->reqs.slots[i];
        if (r->key && (r->doomed || r->chat_stop) && !r->cancel_sent) {
            r->cancel_sent = true;
            engine_cancel(s->e, r->engine_id); /* may delete entries: they only shift back */
            i = (size_t)-1;                    /* rescan from the start */
        }
    }
}

/* ---- requests ---- */

static int check_ids(struct serve *s, uint64_t id, const char *what, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= s->vocab_size) {
            send_error(s, id, ERR_RANGE, "%s: token %zu is %" PRId32 ", the vocabulary has %" PRIu32
                       " tokens", what, i, ids[i], s->vocab_size);
            return ERR_RANGE;
        }
    return 0;
}

/* Refuses a prompt of n ids the engine must not get (its ERROR sent): true if refused. */
static bool prompt_refused(struct serve *s, uint64_t id, const int32_t *ids, size_t n)
{
    if (n == 0) {
        send_error(s, id, ERR_RANGE, "prompt: empty after tokenization");
        return true;
    }
    if (n > s->o.max_prompt_tokens) {
        send_error(s, id, ERR_RANGE, "prompt: %zu tokens, the limit is %" PRIu32, n,
                   s->o.max_prompt_tokens);
        return true;
    }
    return check_ids(s, id, "prompt", ids, n) < 0;
}

/* A Generate whose prompt is token ids (given, or from the tokenizer thread) into the engine. */
/* When a text Generate's record was read (its entry in s->arrivals, removed); now if it has
 * none (out of memory when it was read). Every tokenized Generate passes here once. */
static uint64_t arrival_take(struct serve *s, uint64_t request_id)
{
    struct req *a = reqmap_find(&s->arrivals, request_id);
    if (!a)
        return mono_ns();
    uint64_t t = a->t_read;
    reqmap_del(&s->arrivals, a);
    return t;
}

static void submit_generate(struct serve *s, const struct shm_msg_generate *g,
                            const int32_t *ids, size_t n, uint64_t t_read)
{
    if (prompt_refused(s, g->request_id, ids, n))
        return;

    struct engine_request er = {
        .prompt = ids,
        .n_prompt = n,
        .max_new = g->max_tokens,
        .temperature = g->temperature,
        .top_p = g->top_p,
        .min_p = g->min_p,
        .repeat_penalty = g->repeat_penalty,
        .top_k = g->top_k,
        .repeat_window = g->repeat_window,
        .seed = g->seed,
        .stop = g->n_stop ? g->stop : NULL,
        .n_stop = g->n_stop,
        .tenant = g->tenant_id,
        .adapter = g->adapter,
        .adapter_scale = g->adapter_scale,
        .priority = g->priority == SHM_PRIO_HIGH  ? ENGINE_PRIO_HIGH
                    : g->priority == SHM_PRIO_LOW ? ENGINE_PRIO_LOW
                                                  : ENGINE_PRIO_NORMAL,
        .deadline_ns = g->deadline_ns,
        .user = (void *)(uintptr_t)g->request_id,
        .logprobs = g->logprobs,
        .top_logprobs = g->top_logprobs,
        .batch_invariant = (g->flags & SHM_GEN_BATCH_INVARIANT) != 0,
    };
    /* in the table before the submit: the engine may emit events from inside it */
    uint64_t now = mono_ns();
    struct req entry = {.key = g->request_id, .chat = (g->flags & SHM_GEN_CHAT) != 0,
                        .pre_ns = now > t_read ? now - t_read : 0};
    if (entry.chat && s->chat != CHAT_TPL_NONE &&
        chat_out_new(s->tok, s->chat, g->prompt_text, g->prompt_text_len, &entry.co) < 0) {
        send_error(s, g->request_id, -ENOMEM, "worker out of memory");
        return;
    }
    if (g->adapter)
        snprintf(entry.adapter, sizeof entry.adapter, "%s", g->adapter);
    if (reqmap_put(&s->reqs, &entry) < 0) {
        chat_out_free(entry.co);
        send_error(s, g->request_id, -ENOMEM, "worker out of memory");
        return;
    }
    uint64_t eid = 0;
    log_clear_error();
    int rc = engine_submit(s->e, &er, &eid);
    struct req *r = reqmap_find(&s->reqs, g->request_id);
    if (rc < 0) {
        if (r)
            reqmap_del(&s->reqs, r);
        const char *why = log_last_error();
        if (rc == ERR_OVERLOADED && !why[0])
            send_error(s, g->request_id, rc, "overloaded: the worker's queue is full (%" PRIu32
                       " requests waiting beyond those running: limits.max_queue); retry later",
                       s->o.max_queue);
        else
            send_error(s, g->request_id, rc, "%s", why[0] ? why : err_str(rc));
    } else if (r) {
        r->engine_id = eid;
    }
}

/* When g's wait began: the gateway's stamp as it put the record on the ring (the time the
 * record sat there while a step ran is queueing too), unless that stamp is missing or not
 * believable (after the read, or an hour before it: shared memory is not trusted), then the
 * read itself. Both are CLOCK_MONOTONIC, one clock for every process of the machine. */
static uint64_t arrival_ns(const struct shm_msg_generate *g, uint64_t read_ns)
{
    const uint64_t hour_ns = 3600ull * 1000000000ull;
    if (g->sent_ns && g->sent_ns <= read_ns && read_ns - g->sent_ns < hour_ns)
        return g->sent_ns;
    return read_ns;
}

/* Text goes to the tokenizer thread (tokq.h) and comes back through take_tokenized: the loop
 * keeps stepping the engine meanwhile. */
static void do_generate(struct serve *s, const struct shm_msg_generate *g)
{
    const uint64_t t_arrived = arrival_ns(g, s->rec_read_ns);
    if (reqmap_find(&s->reqs, g->request_id)) {
        send_error(s, g->request_id, ERR_STATE, "request id %" PRIu64 " is already in flight",
                   g->request_id);
        return;
    }
    if (!g->prompt_text_len && g->n_prompt_ids)
        return submit_generate(s, g, g->prompt_ids, g->n_prompt_ids, t_arrived);
    if ((g->flags & SHM_GEN_CHAT) && s->chat == CHAT_TPL_NONE) {
        send_error(s, g->request_id, ERR_UNSUPPORTED, "%s", s->chat_why);
        return;
    }
    if (!s->tok) {
        send_error(s, g->request_id, ERR_UNSUPPORTED,
                   "prompt: the model has no tokenizer; send token ids");
        return;
    }
    struct tokq_job *j = tokq_job_generate(g);
    if (!j) {
        send_error(s, g->request_id, -ENOMEM, "worker out of memory");
        return;
    }
    /* out of memory here only makes its timings start at its submit */
    struct req *a = reqmap_find(&s->arrivals, g->request_id);
    if (a)
        a->t_read = t_arrived;
    else
        (void)reqmap_put(&s->arrivals, &(struct req){.key = g->request_id,
                                                     .t_read = t_arrived});
    tokq_push(s->tokq, j);
}

static void do_cancel(struct serve *s, uint64_t id)
{
    struct req *r = reqmap_find(&s->reqs, id);
    if (!r) {
        /* still being tokenized: dropped when done; or ended already: its FINISH or ERROR
         * is on its way or has been read */
        for (struct tokq_job *j = s->deferred; j; j = j->next)
            if (j->request_id == id)
                j->cancelled = true;
        if (s->tokq)
            tokq_cancel(s->tokq, id);
        return;
    }
    int rc = engine_cancel(s->e, r->engine_id);
    if (rc < 0)
        LOG_WARN("cancel of request %" PRIu64 ": %s", id, err_str(rc));
}

static void do_tokenize(struct serve *s, const struct shm_msg_tokenize *t)
{
    if (!s->tok) {
        send_error(s, t->request_id, ERR_UNSUPPORTED, "the model has no tokenizer");
        return;
    }
    struct tokq_job *j = tokq_job_tokenize(t);
    if (!j) {
        send_error(s, t->request_id, -ENOMEM, "worker out of memory");
        return;
    }
    tokq_push(s->tokq, j);
}

/* The tokenizer thread's finished jobs: answers to Tokenize, Generates into the engine.
 * in_step: called from inside an engine step (its progress callback), where the engine may not
 * be called: refusals and Tokenize answers go out at once (a long prefill step no longer
 * delays them), the Generates to submit wait in s->deferred for the step's end. */
static void take_tokenized(struct serve *s, bool in_step)
{
    if (!in_step) {
        while (s->deferred && s->fatal == 0) {
            struct tokq_job *j = s->deferred;
            s->deferred = j->next;
            if (!s->deferred)
                s->deferred_tail = NULL;
            uint64_t t_read = arrival_take(s, j->request_id);
            if (!j->cancelled)
                submit_generate(s, &j->gen, j->ids, j->n_ids, t_read);
            tokq_job_free(j);
        }
    }
    struct tokq_job *j;
    while (s->tokq && s->fatal == 0 && (j = tokq_take(s->tokq))) {
        const char *what = j->kind == TOKQ_GENERATE ? "prompt" : "text";
        /* deferred: its entry stays until it is submitted after the step */
        bool defer = j->kind == TOKQ_GENERATE && !j->cancelled && j->rc >= 0 && in_step &&
                     !prompt_refused(s, j->request_id, j->ids, j->n_ids);
        uint64_t t_read = j->kind == TOKQ_GENERATE && !defer ? arrival_take(s, j->request_id) : 0;
        if (j->cancelled) {
            /* the gateway forgot it with its CANCEL */
        } else if (j->rc < 0) {
            send_error(s, j->request_id, j->rc, "%s: %s", what, j->error);
        } else if (j->kind == TOKQ_GENERATE) {
            if (!in_step) {
                submit_generate(s, &j->gen, j->ids, j->n_ids, t_read);
            } else if (defer) {
                j->next = NULL;
                if (s->deferred_tail)
                    s->deferred_tail->next = j;
                else
                    s->deferred = j;
                s->deferred_tail = j;
                continue;
            }
        } else if (j->n_ids > (shm_region_max_record(s->region) - sizeof(struct shm_wire_ids)) /
                                  sizeof(int32_t)) {
            send_error(s, j->request_id, ERR_RANGE, "text: %zu tokens do not fit one record",
                       j->n_ids);
        } else {
            struct shm_msg m = {.type = SHM_MSG_TOKENS,
                                .ids = {.request_id = j->request_id, .ids = j->ids,
                                        .n_ids = (uint32_t)j->n_ids}};
            send_event(s, &m);
        }
        tokq_job_free(j);
    }
}

static void do_detokenize(struct serve *s, const struct shm_msg_ids *d)
{
    if (!s->tok) {
        send_error(s, d->request_id, ERR_UNSUPPORTED, "the model has no tokenizer");
        return;
    }
    if (check_ids(s, d->request_id, "ids", d->ids, d->n_ids) < 0)
        return;
    char *text = NULL;
    size_t len = 0;
    int rc = tok_decode(s->tok, d->ids, d->n_ids, &text, &len);
    if (rc < 0) {
        send_error(s, d->request_id, rc, "ids: %s", log_last_error());
        return;
    }
    if (len > shm_region_max_record(s->region) - sizeof(struct shm_wire_text)) {
        send_error(s, d->request_id, ERR_RANGE, "ids: %zu bytes of text do not fit one record",
                   len);
    } else {
        struct shm_msg m = {.type = SHM_MSG_TEXT,
                            .text = {.request_id = d->request_id, .text = len ? text : "",
                                     .text_len = (uint32_t)len}};
        send_event(s, &m);
    }
    free(text);
}

/* rank, alpha and targets of an adapter directory, from its adapter_config.json */
static int adapter_info(const char *dir, struct lora_config *cfg)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, LORA_CONFIG_FILE);
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    char *buf = malloc(LORA_CONFIG_MAX);
    size_t n = buf ? fread(buf, 1, LORA_CONFIG_MAX, f) : 0;
    fclose(f);
    int rc = buf ? lora_config_parse(path, buf, n, cfg) : -ENOMEM;
    free(buf);
    return rc;
}

static struct served_adapter *served_find(struct serve *s, const char *name)
{
    for (size_t i = 0; i < s->n_adapters; i++)
        if (strcmp(s->adapters[i].name, name) == 0)
            return &s->adapters[i];
    return NULL;
}

/* Records a successful load; out of memory only loses the idempotence of a repeated LOAD. */
static void served_add(struct serve *s, const char *name, const char *dir)
{
    if (s->n_adapters == s->cap_adapters) {
        size_t cap = s->cap_adapters ? 2 * s->cap_adapters : 8;
        struct served_adapter *p = realloc(s->adapters, cap * sizeof *p);
        if (!p)
            return;
        s->adapters = p, s->cap_adapters = cap;
    }
    struct served_adapter *a = &s->adapters[s->n_adapters];
    if (!(a->dir = strdup(dir)))
        return;
    snprintf(a->name, sizeof a->name, "%s", name);
    s->n_adapters++;
}

static void served_remove(struct serve *s, const char *name)
{
    struct served_adapter *a = served_find(s, name);
    if (a) {
        free(a->dir);
        *a = s->adapters[--s->n_adapters];
    }
}

static void do_adapter_load(struct serve *s, const struct shm_msg_adapter_load *a)
{
    log_clear_error();
    const struct served_adapter *have = served_find(s, a->name);
    int rc = have && strcmp(have->dir, a->path) == 0 ? 0
                                                     : engine_load_adapter(s->e, a->name, a->path);
    if (rc == 0 && !have)
        served_add(s, a->name, a->path);
    if (rc < 0) {
        const char *why = log_last_error();
        send_error(s, a->request_id, rc, "adapter %s: %s", a->name, why[0] ? why : err_str(rc));
        return;
    }
    if (!have)
        LOG_INFO("adapter %s loaded from %s", a->name, a->path);
    struct lora_config cfg;
    uint32_t targets = 0;
    if (adapter_info(a->path, &cfg) == 0) {
        for (unsigned t = 0; t < LORA_TARGET_COUNT; t++)
            if (cfg.target_mask & (1u << t))
                targets |= 1u << t; /* lora_target and shm_target share the order Q..DOWN */
    }
    if (!targets || !(cfg.alpha > 0) || !isfinite(cfg.alpha) || cfg.rank == 0 ||
        cfg.rank > SHM_MAX_RANK) {
        /* loaded, but its description does not fit the wire: success without details */
        struct shm_msg m = {.type = SHM_MSG_DONE, .request_id = a->request_id};
        send_event(s, &m);
        return;
    }
    uint32_t active = 0;
    for (size_t i = 0; i < s->reqs.cap; i++)
        if (s->reqs.slots[i].key && strcmp(s->reqs.slots[i].adapter, a->name) == 0)
            active++;
    struct shm_msg m = {.type = SHM_MSG_ADAPTER,
                        .adapter = {.request_id = a->request_id, .rank = cfg.rank,
                                    .alpha = cfg.alpha, .targets = targets,
                                    .active_requests = active, .name = a->name}};
    send_event(s, &m);
}

static void do_adapter_unload(struct serve *s, const struct shm_msg_name *a)
{
    log_clear_error();
    int rc = engine_unload_adapter(s->e, a->name);
    if (rc < 0) {
        const char *why = log_last_error();
        send_error(s, a->request_id, rc, "adapter %s: %s", a->name, why[0] ? why : err_str(rc));
        return;
    }
    served_remove(s, a->name);
    LOG_INFO("adapter %s unloaded", a->name);
    struct shm_msg m = {.type = SHM_MSG_DONE, .request_id = a->request_id};
    send_event(s, &m);
}

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void do_stats(struct serve *s, uint64_t id)
{
    struct engine_metrics em;
    engine_get_metrics(s->e, &em);
    uint64_t total = em.kv_blocks_total;
    struct shm_msg m = {
        .type = SHM_MSG_STATS,
        .stats = {.request_id = id, .running = em.running, .waiting = em.waiting,
                  .kv_blocks_total = total,
                  .kv_blocks_used = em.kv_blocks_used <= total ? em.kv_blocks_used : total,
                  .kv_blocks_cached = em.kv_blocks_cached <= total ? em.kv_blocks_cached : total,
                  .prefix_hit_tokens = em.prefix_hit_tokens,
                  .prefix_miss_tokens = em.prefix_miss_tokens, .preemptions = em.preemptions,
                  .requests_finished = em.requests_finished,
                  .tokens_generated = em.tokens_generated,
                  .tokens_prefilled = em.tokens_prefilled, .rss_bytes = rss_bytes()}};
    send_event(s, &m);
}

static void handle(struct serve *s, const struct shm_msg *m)
{
    switch (m->type) {
    case SHM_MSG_GENERATE: do_generate(s, &m->generate); break;
    case SHM_MSG_CANCEL: do_cancel(s, m->request_id); break;
    case SHM_MSG_TOKENIZE: do_tokenize(s, &m->tokenize); break;
    case SHM_MSG_DETOKENIZE: do_detokenize(s, &m->ids); break;
    case SHM_MSG_ADAPTER_LOAD: do_adapter_load(s, &m->adapter_load); break;
    case SHM_MSG_ADAPTER_UNLOAD: do_adapter_unload(s, &m->name); break;
    case SHM_MSG_STATS_QUERY: do_stats(s, m->request_id); break;
    default:
        /* shm_msg_recv only returns request types on the requests ring */
        CHECK(!"a non-request type from the requests ring");
    }
}

/* ---- lifecycle ---- */

const char *serve_pin_prepare(unsigned threads, const char *pin)
{
    enum pool_pin mode;
    if (!pin || pool_pin_parse(pin, &mode) < 0 || mode == POOL_PIN_NONE)
        return "none"; /* callers have refused unknown names (their option's message) */
    int n_cpus = pool_affinity_count();
    if (n_cpus < 1)
        return "none";
    unsigned want = threads ? threads : (unsigned)n_cpus;
    if (want > (unsigned)n_cpus) {
        LOG_WARN("threads not pinned (%s): %u threads, %d CPUs allowed", pin, want, n_cpus);
        return "none";
    }
    if (mode != POOL_PIN_COMPACT || numa_available() < 0 || numa_num_configured_nodes() < 2)
        return pin;
    /* compact: the node of the CPU we run on, if it holds them all */
    int cpu = sched_getcpu();
    int node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
    struct bitmask *mask = numa_allocate_cpumask(), *on_node = numa_allocate_cpumask();
    if (node >= 0 && mask && on_node && numa_sched_getaffinity(0, mask) >= 0 &&
        numa_node_to_cpus(node, on_node) == 0) {
        unsigned n = 0;
        for (unsigned c = 0; c < on_node->size; c++) {
            bool both = numa_bitmask_isbitset(on_node, c) && numa_bitmask_isbitset(mask, c);
            if (!both && numa_bitmask_isbitset(on_node, c))
                numa_bitmask_clearbit(on_node, c);
            n += both;
        }
        if (n >= want && n < (unsigned)n_cpus && numa_sched_setaffinity(0, on_node) == 0)
            LOG_INFO("threads pinned compact within NUMA node %d (%u of %d allowed CPUs)",
                     node, n, n_cpus);
    }
    if (mask)
        numa_free_cpumask(mask);
    if (on_node)
        numa_free_cpumask(on_node);
    return pin;
}

/* What HELLO says about the model, read from its manifest (closed again before the engine maps
 * the model, so hot replication sees only the engine's mapping). */
static int model_info(struct serve *s, struct shm_msg_hello *h, char *name, char *arch,
                      char *dtype, size_t cap)
{
    struct iebin_model *m = NULL;
    int rc = iebin_open_ex(s->o.model_dir, IEBIN_OPEN_LAZY, &m);
    if (rc < 0)
        return rc;
    uint64_t params = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        uint64_t n = 1;
        for (int d = 0; d < m->tensors[i].n_dims; d++)
            n *= m->tensors[i].shape[d]; /* validated by iebin_open: no overflow */
        params += n;
    }
    const struct iebin_tensor *q = iebin_find(m, "blk.0.attn_q");
    const struct dtype_info *di = dtype_info(q ? q->dtype : DT_F32);
    const char *base = strrchr(m->dir, '/');
    snprintf(name, cap, "%s", m->name && m->name[0] ? m->name : base && base[1] ? base + 1 : "model");
    snprintf(arch, cap, "%s", m->arch);
    snprintf(dtype, cap, "%s", di ? di->name : "?");
    /* HELLO strings are printable ASCII */
    for (char *p = name; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            *p = '?';
    *h = (struct shm_msg_hello){.parameters = params, .vocab_size = m->hp.vocab_size,
                                .context_length = m->hp.max_seq_len, .name = name,
                                .arch = arch, .dtype = dtype};
    s->vocab_size = m->hp.vocab_size;
    if (m->tokenizer_path && (rc = tok_load(m->tokenizer_path, &s->tok)) < 0) {
        iebin_close(m);
        return rc;
    }
    iebin_close(m);
    return 0;
}

/* Every entry of the model directory is a regular file or a directory: opening a FIFO (or a
 * device) would block the load until the ready timeout (300 s) instead of failing at once. */
static int check_model_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0; /* the model's own open names the problem */
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, 0) < 0)
            continue; /* a dangling link: the model's open names it if it is needed */
        const char *kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                           : S_ISCHR(st.st_mode)  ? "a character device"
                           : S_ISBLK(st.st_mode)  ? "a block device"
                                                  : NULL;
        if (kind) {
            LOG_ERR("model %s: %s is %s, not a regular file", dir, de->d_name, kind);
            rc = ERR_FORMAT;
        }
    }
    closedir(d);
    return rc;
}

int serve_open(const struct serve_options *o, struct shm_region *region, struct serve **out)
{
    *out = NULL;
    struct serve *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->magic = SERVE_MAGIC;
    s->o = *o;
    s->region = region;
    s->rx = shm_region_rx(region);
    s->tx = shm_region_tx(region);
    s->buf_cap = (shm_region_max_record(region) + 7u) & ~(size_t)7;
    int rc;
    if (!(s->buf = malloc(s->buf_cap))) {
        rc = -ENOMEM;
        goto fail;
    }
    char name[SHM_MAX_INFO + 1], arch[SHM_MAX_INFO + 1], dtype[SHM_MAX_INFO + 1];
    struct shm_msg hello = {.type = SHM_MSG_HELLO};
    if ((rc = check_model_files(o->model_dir)) < 0 ||
        (rc = model_info(s, &hello.hello, name, arch, dtype, sizeof name)) < 0)
        goto fail;
    if (s->tok && (rc = tokq_create(s->tok, &s->tokq)) < 0)
        goto fail;
    /* The model's own chat_template (chat.ie.json), read before chat_template_of asks for it
     * and before the tokq threads render with it (docs/CHAT.md). */
    if ((rc = chat_model_load(o->model_dir)) < 0)
        goto fail;
    s->chat = chat_template_of(arch, s->tok, s->chat_why, sizeof s->chat_why);
    if (s->tokq)
        tokq_set_chat(s->tokq, s->chat, s->chat_why);

    struct engine_config ec = {
        .model_dir = o->model_dir,
        .n_threads = (int)o->threads,
        /* within this thread's affinity: the slot's CPUs (worker_main sets them) */
        .pin = serve_pin_prepare(o->threads, o->pin),
        .kv_budget_bytes = o->kv_budget_bytes,
        .kv_dtype = o->kv_dtype,
        .kv_block_tokens = 0,
        .max_step_tokens = 512,
        .max_running = SHM_MAX_RUNNING,
        .max_queue = o->max_queue,
        .prefix_cache = true,
        .snapshot_path = o->kv_snapshot_path,
        .snapshot_max_bytes = o->kv_snapshot_max_bytes,
        .lora_pack = o->lora_pack,
    };
    log_clear_error();
    if ((rc = engine_create(&ec, on_event, s, &s->e)) < 0) {
        LOG_ERR("model %s: the engine cannot start: %s", o->model_dir, log_last_error());
        goto fail;
    }
    engine_set_progress(s->e, beat_from_step, s);
    for (size_t i = 0; i < o->n_adapters; i++) {
        log_clear_error();
        if ((rc = engine_load_adapter(s->e, o->adapter_names[i], o->adapter_dirs[i])) < 0) {
            LOG_ERR("adapter %s (%s) does not load: %s", o->adapter_names[i],
                    o->adapter_dirs[i], log_last_error());
            goto fail;
        }
        served_add(s, o->adapter_names[i], o->adapter_dirs[i]);
    }
    /* 2 MiB page-table entries for the weights before the copies (which keep them); the
     * stored rows of repacked matrices stay out of the mapping (weights resident once) */
    struct hotrepl_huge_report huge;
    if ((rc = hotrepl_hugify_default_model(o->model_dir, engine_model(s->e), &huge)) < 0)
        goto fail;
    if (o->hot_replicate) {
        struct hotrepl_report rep;
        if ((rc = hotrepl_apply(o->model_dir, engine_model(s->e), o->mem_node,
                                o->hot_limit_bytes, &rep)) < 0)
            goto fail;
        s->hot_bytes = rep.bytes;
        s->hot_tensors = rep.n_tensors;
        if (rep.n_mappings == 0)
            LOG_WARN("hot replication: the engine does not read the model through its file "
                     "mapping; nothing replicated");
        else
            LOG_INFO("hot replication: node %d: %zu tensors, %.1f MiB (%s .. %s), %zu left "
                     "shared (%.1f MiB), %zu not read (repacked; %.1f MiB)",
                     o->mem_node, rep.n_tensors, (double)rep.bytes / 1048576.0, rep.first,
                     rep.last, rep.n_skipped, (double)rep.skipped_bytes / 1048576.0,
                     rep.n_unread, (double)rep.unread_bytes / 1048576.0);
    }
    if ((rc = send_event(s, &hello)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    serve_close(s);
    return rc;
}

uint64_t serve_hot_bytes(const struct serve *s) { return s->hot_bytes; }

/* SIGTERM: what the gateway has not drained is cancelled, each request getting its FINISH. */
static void cancel_all(struct serve *s)
{
    shm_region_set_state(s->region, SHM_STATE_DRAINING);
    size_t n = s->reqs.n;
    if (!n)
        return;
    LOG_INFO("stopping: cancelling %zu requests in flight", n);
    uint64_t *ids = malloc(n * sizeof *ids);
    size_t k = 0;
    for (size_t i = 0; ids && i < s->reqs.cap; i++)
        if (s->reqs.slots[i].key)
            ids[k++] = s->reqs.slots[i].engine_id;
    for (size_t i = 0; i < k; i++)
        engine_cancel(s->e, ids[i]);
    free(ids);
    /* cancellation may complete in the engine's next steps */
    uint64_t end = mono_ns() + STOP_CANCEL_NS;
    size_t active = 1;
    while (s->reqs.n && active && s->fatal == 0 && mono_ns() < end) {
        if (engine_step(s->e, &active) < 0)
            break;
    }
}

/* Whether a request record can be handled without calling the engine (and so from inside a
 * step): texts to tokenize, ids to detokenize. */
static bool engine_free(const struct shm_msg *m)
{
    return m->type == SHM_MSG_TOKENIZE || m->type == SHM_MSG_DETOKENIZE ||
           (m->type == SHM_MSG_GENERATE && m->generate.prompt_text_len);
}

/* From inside a step (its progress callback): the records waiting are read now, so a text is
 * tokenized, and refused if it must be, while a long prefill runs; records that need the
 * engine keep their own buffer and wait in s->held for the step's end (at most HELD_MAX). */
static void drain_requests_in_step(struct serve *s)
{
    while (s->fatal == 0 && s->n_held < HELD_MAX) {
        /* Called after every layer: an empty ring (the usual case) must cost no allocation. A
         * 1 MiB buffer taken and freed per layer was most of a token's time under the
         * sanitizers' allocators (50-300 ms a token through clocherd). Any failure here is
         * left to the read after the step, which logs it. */
        if (shm_ring_wait_readable(s->rx, 0) != 0)
            return;
        struct held_rec *h = malloc(sizeof *h);
        void *buf = h ? malloc(s->buf_cap) : NULL;
        if (!buf) {
            free(h);
            return; /* read after the step, as always */
        }
        int rc = shm_msg_recv(s->rx, buf, s->buf_cap, &h->m);
        h->t_read = s->rec_read_ns = mono_ns();
        if (rc < 0) {
            free(buf), free(h);
            if (rc != -EAGAIN) {
                LOG_ERR("the requests ring failed (%s): stopping this worker", err_name(rc));
                s->fatal = rc;
            }
            return;
        }
        if (engine_free(&h->m)) {
            handle(s, &h->m);
            free(buf), free(h);
            continue;
        }
        h->buf = buf;
        h->next = NULL;
        if (s->held_tail)
            s->held_tail->next = h;
        else
            s->held = h;
        s->held_tail = h;
        s->n_held++;
    }
}

/* The records read during the last step that needed the engine, in their order. */
static void handle_held(struct serve *s)
{
    while (s->held) {
        struct held_rec *h = s->held;
        s->held = h->next;
        if (!s->held)
            s->held_tail = NULL;
        s->n_held--;
        s->rec_read_ns = h->t_read;
        if (s->fatal == 0)
            handle(s, &h->m);
        free(h->buf), free(h);
    }
}

/* Handles every record waiting on the requests ring. */
static void drain_requests(struct serve *s)
{
    for (;;) {
        struct shm_msg m;
        int rc = shm_msg_recv(s->rx, s->buf, s->buf_cap, &m);
        if (rc == -EAGAIN)
            return;
        s->rec_read_ns = mono_ns();
        if (rc < 0) {
            /* a record that does not decode broke the ring: nothing after it is
             * trustworthy, and a fresh region needs a fresh worker */
            LOG_ERR("the requests ring failed (%s): stopping this worker", err_name(rc));
            s->fatal = rc;
            return;
        }
        handle(s, &m);
        if (s->fatal < 0)
            return;
    }
}

/*
 * An idle engine that has just been given work waits a moment for the rest of a burst: a
 * client starting several streams at once reaches the ring a few tens of µs apart, and
 * without this the first step would prefill only the first arrivals while the others wait
 * for that whole step (tens of ms on a 1B model). The wait ends at the first gap longer than
 * GATHER_GAP_NS, and after GATHER_MAX_NS in all, so a lone request pays at most one gap.
 */
static void gather_burst(struct serve *s)
{
    uint64_t end = mono_ns() + GATHER_MAX_NS;
    while (s->fatal == 0 && mono_ns() < end) {
        if (shm_ring_wait_readable(s->rx, GATHER_GAP_NS) != 0)
            return; /* a gap (or a ring problem, which the main loop meets next) */
        drain_requests(s);
    }
}

int serve_run(struct serve *s)
{
    CHECK(s && s->magic == SERVE_MAGIC);
    shm_region_set_state(s->region, SHM_STATE_READY);
    s->last_watchdog_ns = mono_ns();
    struct heritage_ctl_msg ready = {.ready = true, .has_hot_bytes = true,
                                     .hot_bytes = s->hot_bytes, .has_hot_tensors = true,
                                     .hot_tensors = s->hot_tensors};
    /* a longer model path is cut: STATUS is for the log, READY must arrive */
    snprintf(ready.status, sizeof ready.status, "model %s loaded", s->o.model_dir);
    if (ctl_send(s, &ready) < 0)
        return -EPIPE;
    size_t active = 0;
    while (!stopping(s) && s->fatal == 0) {
        beat(s);
        /* take every request waiting (those read during the last step first) and every text
         * tokenized meanwhile, then one step */
        handle_held(s);
        drain_requests(s);
        take_tokenized(s, false);
        if (s->fatal < 0)
            break;
        if (!active && s->reqs.n)
            gather_burst(s);
        if (s->fatal < 0)
            break;
        if (s->reqs.n || active) {
            int rc = engine_step(s->e, &active);
            cancel_doomed(s);
            if (rc < 0) {
                LOG_ERR("engine_step: %s", err_str(rc));
                s->fatal = rc;
            } else if (active == 0 && s->reqs.n) {
                /* the engine holds nothing, yet requests never got their last event: answer
                 * them rather than spin on them forever */
                LOG_ERR("the engine ended %zu requests without a finish event", s->reqs.n);
                for (size_t i = 0; i < s->reqs.cap && s->fatal == 0; i++)
                    if (s->reqs.slots[i].key) {
                        uint64_t id = s->reqs.slots[i].key;
                        bool answered = s->reqs.slots[i].doomed;
                        reqmap_del(&s->reqs, &s->reqs.slots[i]);
                        if (!answered)
                            send_error(s, id, ERR_STATE, "the engine dropped the request");
                        i = (size_t)-1; /* deletion shifts entries: rescan */
                    }
            }
            continue;
        }
        /* texts being tokenized: look back for them soon */
        bool tokenizing = s->tokq && tokq_pending(s->tokq) > 0;
        int rc = shm_ring_wait_readable(s->rx, tokenizing ? TOKQ_POLL_NS : IDLE_WAIT_NS);
        if (rc == -EPIPE) {
            LOG_ERR("the gateway is gone: stopping this worker");
            s->fatal = rc;
        } else if (rc < 0 && rc != -ETIMEDOUT && rc != -EINTR && rc != -EAGAIN) {
            LOG_ERR("waiting for requests: %s", err_str(rc));
            s->fatal = rc;
        }
    }
    if (stopping(s) && s->fatal == 0) {
        LOG_INFO("stop requested (SIGTERM): stopping");
        cancel_all(s);
    }
    return s->fatal;
}

void serve_close(struct serve *s)
{
    if (!s)
        return;
    CHECK(s->magic == SERVE_MAGIC);
    tokq_destroy(s->tokq); /* before the tokenizer it reads */
    chat_model_unload();   /* after the tokq threads that render with it */
    while (s->deferred) {
        struct tokq_job *j = s->deferred;
        s->deferred = j->next;
        tokq_job_free(j);
    }
    while (s->held) {
        struct held_rec *h = s->held;
        s->held = h->next;
        free(h->buf), free(h);
    }
    if (s->e)
        engine_destroy(s->e);
    if (s->tok)
        tok_free(s->tok);
    free(s->reqs.slots);
    free(s->arrivals.slots);
    for (size_t i = 0; i < s->n_adapters; i++)
        free(s->adapters[i].dir);
    free(s->adapters);
    free(s->buf);
    s->magic = 0;
    free(s);
}
