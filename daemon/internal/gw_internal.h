/*
 * internal/gw_internal.h — what the gateway's files share (daemon/gw.c lists them, one job
 * each, and the order in which they call each other: no two call each other). Not for use
 * outside daemon/gw*.c: CMake keeps this header out of the include path of anything else.
 *
 * NOTES (threads, locks, lifetimes):
 *  - The completion-queue (CQ) threads (GW_CQ_THREADS) run every gRPC completion: new calls,
 *    sends done, clients gone; two completions of one call may run at once (its arrival and
 *    its client going away): what they share is under the call's mutex. Each worker slot has a reader thread that turns the records of its event
 *    ring into updates of calls. Both may start batches on a call (grpc_call_start_batch is
 *    thread-safe); the call's mutex makes "one SEND in flight per call" hold.
 *  - Lock order: slot->mu, then call->mu is never taken the other way round: code holding a
 *    call's mutex that must talk to a worker first drops it, or (cancel) only does a
 *    non-blocking send under slot->mu with no call lock held.
 *  - A call is reference-counted: one reference per batch in flight on the CQ, one per entry
 *    in a slot's request table, one for the code handling its arrival. The last one frees it
 *    (and unrefs the grpc_call).
 *  - A slot's request table, its region reference and the producer end of its requests ring
 *    are guarded by slot->mu; the consumer end of the events ring belongs to its reader.
 *  - adapters_mu comes after slot->mu: the reader replays adapters with its slot's mutex held,
 *    and a reload takes every slot's mutex (by index) before it.
 */
#ifndef CLOCHER_DAEMON_GW_INTERNAL_H
#define CLOCHER_DAEMON_GW_INTERNAL_H

#include "auth.h"
#include "config.h"
#include "gw.h"
#include "msg.h"
#include "workers.h"

#include "clocher/v1/inference.pb-c.h"

#include <dirent.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define GW_MAGIC 0x47574159u      /* "GWAY" */
#define GW_CALL_MAGIC 0x4743414cu /* "GCAL" */
#define GW_BUCKETS 1024u          /* per-slot request table buckets (a power of two) */
#define GW_PEERS 256u             /* connections whose early resets are counted at once */
#define GW_QUOTA_TENANTS 256u     /* tenants whose quotas are tracked (config.c caps lower) */
#define GW_CQ_THREADS 2           /* completion-queue threads (gw.c says why two) */
#define GW_OVER 64u               /* connections over limits.max_connections awaiting their close */

enum gw_method {
    GW_GENERATE = 0,
    GW_BATCH_GENERATE,
    GW_TOKENIZE,
    GW_DETOKENIZE,
    GW_LIST_MODELS,
    GW_LIST_ADAPTERS,
    GW_LOAD_ADAPTER,
    GW_UNLOAD_ADAPTER,
    GW_GET_METRICS,
    GW_HEALTH_CHECK,
    GW_HEALTH_WATCH,
    GW_METHODS,
    GW_UNKNOWN = GW_METHODS, /* a method nobody registered: UNIMPLEMENTED */
};

/* What a completion runs. fn is stored with release (gw__tag_set) and loaded with acquire by
 * the CQ thread that runs it: gRPC core, not instrumented, hides the order from TSan, and two
 * CQ threads may set and run one tag (a call's arrival on one, its close on the other). */
struct gw_tag;
typedef void gw_tag_fn(struct gw_tag *t, bool ok);
struct gw_tag {
    gw_tag_fn *_Atomic fn;
    void *obj;
};

static inline void gw__tag_set(struct gw_tag *t, gw_tag_fn *fn, void *obj)
{
    t->obj = obj;
    atomic_store_explicit(&t->fn, fn, memory_order_release);
}

static inline void gw__tag_run(struct gw_tag *t, bool ok)
{
    gw_tag_fn *fn = atomic_load_explicit(&t->fn, memory_order_acquire);
    fn(t, ok);
}

struct gw_call;

/* One generated token's log-probabilities as a TOKEN record brought them (logprobs requests):
 * the token's own and its alternatives', each with its piece (bytes at the item's lp_bytes +
 * off, len of them). */
struct gw_lp_ent {
    int32_t id;
    float logprob;
    uint32_t off, len;
};
struct gw_lp {
    struct gw_lp_ent own;
    uint32_t n_top;
    struct gw_lp_ent top[SHM_MAX_TOP_LOGPROBS];
};

/* One worker request of a call (a Generate, one prompt of a batch, one worker's adapter load,
 * a tokenization). Guarded by its call's mutex. */
struct gw_item {
    uint64_t req_id;           /* 0 = not (or no longer) known to a worker */
    int slot;                  /* -1 = none */
    unsigned index;            /* BatchGenerate: its request's index */
    bool done;                 /* its last record came (or it failed) */
    bool final_sent;           /* its last message went out */
    /* streaming output not yet sent */
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *text;
    size_t text_len, text_cap;
    /* chat: the pending output's channel runs in order (each ends at text_end/ids_end); a
     * piece without text joins the last run. Grown as a slow client lets runs pile up (like
     * the text they delimit), so every run keeps its own channel. */
    struct gw_seg {
        uint32_t channel;      /* enum shm_channel */
        size_t text_end, ids_end;
        /* chat tools: 0, or 1 + the index in the reply of the tool call whose arguments the
         * run's text is; its recipient and id ("functions.f", "call_...") */
        unsigned call;
        bool call_opens;       /* the run starts the call (its first arguments) */
        char call_name[SHM_MAX_CHAT_NAME + 1], call_id[SHM_MAX_CHAT_NAME + 1];
    } *segs;                   /* [n_segs] of cap_segs */
    size_t n_segs, cap_segs;
    bool tool_call;            /* chat: the reply ended on harmony's <|call|> (SHM_TOKEN_CALL) */
    /* chat tools: the calls the reply opened so far; the open one (0 = none, else its
     * 1 + index) continues with the next pieces of its channel, and its name and id */
    unsigned n_calls, open_call;
    uint32_t call_channel;
    char call_name[SHM_MAX_CHAT_NAME + 1], call_id[SHM_MAX_CHAT_NAME + 1];
    uint64_t sent_tokens;      /* tokens already handed to gRPC */
    /* logprobs requests: one entry per pending id (gRPC sends them with their ids; an
     * external caller takes them apart, gw_ext_take_logprobs), their pieces in lp_bytes */
    struct gw_lp *lps;
    size_t n_lps, cap_lps;
    char *lp_bytes;
    size_t lp_len, lp_cap;
    /* the ending */
    bool finished;             /* FINISH came */
    struct shm_msg_finish fin;
    int status;                /* gRPC status of an item that failed, 0 = ok */
    char *error;               /* its message (malloc'd) */
    /* unary answers */
    int32_t *ans_ids;
    size_t n_ans;
    char *ans_text;
    struct shm_msg_adapter ans_adapter;
    bool has_adapter;
    char adapter[SHM_MAX_NAME + 1]; /* the adapter it runs with ("" = base) */
    bool queued;                   /* counted in its tenant's max_queued until a token or its end */
};

/* The finish reason gw_ext_take_chat reports for a reply that ended with a tool call (an EOS
 * whose last id was <|call|>): the gateway's own value, never on the shm wire. */
#define GW_FINISH_TOOL_CALL 64

/* gw_ext_take for a chat: the pending text split by channel (vLLM's convention): analysis
 * into reasoning, every other channel into content. */
struct gw_ext_state;
int gw_ext_take_chat(struct gw_call *c, size_t i, char **content, size_t *len, size_t *cap,
                     char **reasoning, size_t *rlen, size_t *rcap, struct gw_ext_state *st);

/* chat tools: one piece of a tool call's arguments, as gw_ext_take_chat_calls hands them over
 * (OpenAI's streamed tool_calls deltas: the first piece of a call opens it with its id and
 * name). */
struct gw_ext_call {
    unsigned index;            /* the call's index in the reply (0, 1, ...) */
    bool opens;
    char id[SHM_MAX_CHAT_NAME + 1], name[SHM_MAX_CHAT_NAME + 1]; /* name: "functions.f" */
    char *args;                /* malloc'd, NUL-terminated [args_len] */
    size_t args_len;
};
/* gw_ext_take_chat with the tool calls apart: their pieces appended to *calls[*n_calls]
 * (grown with realloc; free each args, then the array) instead of content. */
int gw_ext_take_chat_calls(struct gw_call *c, size_t i, char **content, size_t *len,
                           size_t *cap, char **reasoning, size_t *rlen, size_t *rcap,
                           struct gw_ext_call **calls, size_t *n_calls,
                           struct gw_ext_state *st);

struct gw_call {
    uint32_t magic;
    struct gw *g;
    enum gw_method method;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_call_details details;     /* unregistered calls only */
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    struct gw_tag t_new, t_close, t_send;

    atomic_uint refs;
    pthread_mutex_t mu;
    int close_cancelled;           /* RECV_CLOSE_ON_SERVER's answer */
    bool sending, md_sent, status_sent, closed, counted;
    bool msg_sent;                 /* a response message went out (not an early reset) */
    bool close_seen;               /* on_close ran (RECV_CLOSE_ON_SERVER came back) */
    bool live;                     /* counted in g->live_calls until freed */
    char peer[80];                 /* its connection as gRPC names it ("fd:12", "ipv4:a:p") */
    char rid[136];                 /* its request id in every log line about it: the client's
                                    * request_id (printable ASCII), the HTTP door's
                                    * ("chatcmpl-..."), else "call-N" */
    struct config *cfg;            /* the snapshot the call runs with */
    char tenant[CONFIG_NAME_MAX];  /* "" = anonymous */
    const struct config_tenant *tcfg; /* in cfg; NULL = anonymous */
    bool stream_slot;              /* holds n_streams of its tenant's concurrent streams */
    uint32_t n_streams;            /* one per request (a BatchGenerate's items each count) */
    uint64_t start_ns;
    size_t n_items, n_open;
    struct gw_item *items;
    size_t rr;                     /* BatchGenerate: the next item to send from */
    int status;                    /* the call's own status (0 = from its items) */
    char status_msg[512];
    void *req;                     /* the unpacked request (freed with the call) */
    grpc_byte_buffer *out;         /* the message of the batch in flight */
    char *out_text;                /* a unary answer packed later (metrics text) */
    grpc_byte_buffer *answer;      /* a unary answer made at arrival (no worker involved) */
    grpc_slice status_slice;       /* the status details of the batch that sent them */
    bool has_status_slice;
    int health;                    /* Health.Watch: the status last sent, -1 = none */
    int health_now;                /* Health.Watch: the status to send */
    /* a call made by gw_ext_generate (no grpc_call): pump() tells its owner instead of sending */
    void (*sink)(void *ud);
    void *sink_ud;                 /* NULL once its owner released it */
};

/* A table entry: the worker request req_id is item `item` of `call`. */
struct gw_entry {
    struct gw_entry *next;
    uint64_t req_id;
    struct gw_call *call;
    size_t item;
    char adapter[SHM_MAX_NAME + 1]; /* a generation's adapter, "" = base or not a generation */
};

struct gw_model_info {
    bool have;
    uint64_t parameters;
    uint32_t vocab_size, context_length;
    char name[SHM_MAX_INFO + 1], arch[SHM_MAX_INFO + 1], dtype[SHM_MAX_INFO + 1];
};

struct gw_slot {
    struct gw *g;
    unsigned index;
    struct workers_slot *ws;
    pthread_t reader;
    bool reader_started;

    pthread_mutex_t mu;            /* guards everything below */
    struct workers_region *region; /* the generation the reader serves, NULL = none */
    uint32_t generation;
    bool hello;                    /* its HELLO came: routable */
    struct gw_model_info model;
    struct gw_entry *buckets[GW_BUCKETS];
    size_t n_entries;
    uint32_t died_gen;             /* set by the worker_died hook */
    char died_reason[200];
};

/* A loaded adapter as ListAdapters shows it. */
struct gw_adapter {
    char name[SHM_MAX_NAME + 1];
    char *dir;
    uint32_t rank, targets;
    float alpha;
    bool from_config;              /* in the configuration: on every new worker's command line */
    bool unloaded;                 /* not to be served: unloaded at run time, or dropped by a
                                    * reload (then kept as a tombstone) */
    /* Set by a reload that changed this adapter: a worker of slot i whose generation is at most
     * reload_gen[i] was started from the old command line, so its HELLO replays the change. */
    bool reloaded;
    uint32_t reload_gen[CONFIG_MAX_WORKERS];
};

/* A tenant's quota state (gw_quota.c). */
struct gw_quota {
    bool used;
    char name[CONFIG_NAME_MAX];
    bool req_init, tok_init;
    double req_level, tok_level;   /* token buckets (tok_level may be below zero: a debt) */
    uint64_t req_ns, tok_ns;       /* their last refill */
    uint32_t queued;               /* generations at the workers without a token yet */
};

/* A connection's early resets (gw_conn.c), by its gRPC peer name. */
struct gw_peer {
    char name[80];
    uint64_t window_ns;            /* the start of its 10 s window */
    uint32_t resets;
};

struct gw_reflect;

struct gw {
    uint32_t magic;
    struct workers *w;
    uv_loop_t *loop;
    struct stats *stats;           /* w->stats, may be NULL */

    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t cq_threads[GW_CQ_THREADS];
    int n_cq_threads;
    bool cq_started;
    void *methods[GW_METHODS];
    struct gw_tag t_shutdown;
    struct gw_reflect *reflect;    /* gRPC server reflection (gw_reflect.c), gw.c's alone */
    atomic_bool shutdown_seen;

    atomic_bool accepting;         /* false once the supervisor drains */
    atomic_bool stopping;          /* gw_destroy has begun */
    _Atomic uint64_t next_id;      /* worker request ids */
    atomic_size_t active_streams;  /* Generate/BatchGenerate calls open */
    struct auth_streams streams;

    size_t n_slots;
    struct gw_slot *slots;

    pthread_mutex_t adapters_mu;   /* guards the registry (gw_adapters.c) and the watch list
                                    * (gw_call.c) */
    size_t n_adapters, cap_adapters;
    struct gw_adapter *adapters;
    size_t n_watch, cap_watch;
    struct gw_call **watch;        /* Health.Watch calls open */

    struct workers_hooks hooks;

    /* gw_conn.c: our Unix listener, the connection thread, early-reset accounting */
    int unix_fd;                   /* -1 = none */
    char unix_path[108];
    int wake[2];                   /* wakes the connection thread to stop */
    pthread_t conn_thread;
    bool conn_started;
    /* /proc/self/fd, opened once before the connection thread starts and read only by it
     * (rewound per count): a directory opened and closed per accept in that thread reused fd
     * numbers libuv's main thread had closed by a raw close syscall, which TSan, not seeing
     * the close, reported as a race on every daemon start (session 13) */
    DIR *fd_dir;
    pthread_mutex_t conn_mu;       /* guards peers */
    struct gw_peer peers[GW_PEERS];
    /* connections accepted over limits.max_connections: their calls are refused, naming the
     * limit, and the connection thread closes them at close_ns */
    struct gw_over {
        int fd;
        uint64_t close_ns;
    } over[GW_OVER];
    size_t n_over;
    _Atomic uint64_t trim_until_ns;
    atomic_size_t live_calls;      /* gRPC calls arrived and not yet freed (limits.max_calls) */

    pthread_mutex_t quota_mu;      /* guards quotas (a leaf lock) */
    struct gw_quota quotas[GW_QUOTA_TENANTS];
};

/* ---- gw_callobj.c: a call's lifetime ---- */
/* A call object for the next call of method m; `arrived` runs (CQ thread) when it comes. */
struct gw_call *gw__call_new(struct gw *g, enum gw_method m, gw_tag_fn *arrived);
void gw__call_ref(struct gw_call *c);
/* The last reference frees the call and everything it owns. */
void gw__call_unref(struct gw_call *c);

/* ---- gw_conn.c: connections (the Unix listener, rapid-reset accounting) ---- */
/* Listens on path, refusing a live socket of another process and removing a stale one. */
int gw__conn_listen_unix(struct gw *g, const char *path);
/* Starts the connection thread (accepts on the Unix socket; gives memory back). */
int gw__conn_start(struct gw *g);
/* Stops it, closes and removes our Unix socket. Before the server is destroyed. */
void gw__conn_stop(struct gw *g);
/* A stream was reset by its client before any answer: counted against its connection (peer:
 * gRPC's name of it, read when the call arrived); past limit in 10 s the connection is sent
 * GOAWAY and closed. */
void gw__conn_early_reset(struct gw *g, const char *peer, uint32_t limit);
/* Whether a call's connection (peer) was accepted over limits.max_connections: its calls are
 * refused (RESOURCE_EXHAUSTED) until the connection thread closes it. */
bool gw__conn_over(struct gw *g, const char *peer);

/* ---- gw_quota.c: per-tenant quotas ---- */
/* Admits n_requests worker requests of which n_generations are generations (counted queued
 * until their first token: gw__quota_unqueue), with a prompt of prompt_bytes: 0, or
 * RESOURCE_EXHAUSTED with msg naming the limit and *retry_after_s (may be NULL) set. */
int gw__quota_admit(struct gw *g, const struct config_tenant *t, const char *tenant,
                    uint32_t n_requests, uint32_t n_generations, size_t prompt_bytes,
                    char *msg, size_t cap, double *retry_after_s);
/* A generation admitted by gw__quota_admit produced its first token, or ended. */
void gw__quota_unqueue(struct gw *g, const char *tenant);
/* Tokens a request of the tenant used (prompt + generated, or Tokenize's ids). */
void gw__quota_charge(struct gw *g, const struct config_tenant *t, const char *tenant,
                      uint64_t tokens);

/* ---- gw_cq.c: the completion-queue thread ---- */
void *gw__cq_main(void *gw);
/* The tag of the server's shutdown notification: shuts the queue down. */
void gw__cq_on_shutdown(struct gw_tag *t, bool ok);

/* ---- gw_adapters.c: the adapter registry (its functions take adapters_mu themselves) ---- */
/* The configuration's adapters, at start. */
void gw__adapters_init(struct gw *g, const struct config *c);
void gw__adapters_fini(struct gw *g);
/* Whether an adapter is loaded (gw_req_adapter_known_fn). */
bool gw__adapter_known(void *gw, const char *name);
/* A load that workers acknowledged (info: what one of them reported, NULL: read it from dir's
 * adapter_config.json), an unload. */
void gw__adapter_add(struct gw *g, const char *name, const char *dir,
                     const struct shm_msg_adapter *info);
void gw__adapter_remove(struct gw *g, const char *name);
/* Where a served adapter comes from (AdapterInfo.source): "config" or "runtime". */
const char *gw__adapter_source(struct gw *g, const char *name);
/* Makes what a fresh worker serves match the registry (slot->mu held, reader thread). */
void gw__adapters_replay(struct gw *g, struct gw_slot *s, uint32_t generation);
/* A reload: the registry follows fresh's adapters and tells the serving workers (supervisor's
 * loop thread; takes every slot's mu, then adapters_mu). Counts what changed. */
void gw__adapters_reload(struct gw *g, const struct config *fresh, size_t *added,
                         size_t *changed, size_t *dropped);

/* ---- gw_route.c: slots, routing, submission ---- */
/* Unlinks and returns the entry of id (slot->mu held), NULL if none. */
struct gw_entry *gw__table_take(struct gw_slot *s, uint64_t id);
/* The entry of id, left in the table (slot->mu held), NULL if none. */
struct gw_entry *gw__table_find(struct gw_slot *s, uint64_t id);
/* Picks the least-loaded routable slot and sends m (request_id set here) for item `item` of
 * c, entering it into the slot's table. 0, or a gRPC status with msg. Call without c->mu. */
int gw__submit(struct gw *g, int want_slot, struct shm_msg *m, struct gw_call *c, size_t item,
               char *msg, size_t cap);
/* Removes item's table entry and sends CANCEL if it was still known to its worker. */
void gw__cancel_item(struct gw *g, struct gw_call *c, size_t item);
/* Slots whose worker is routable now, into idx[cap]; their count. */
size_t gw__ready_slots(struct gw *g, int *idx, size_t cap);
/* Health status now (grpc.health.v1 ServingStatus). */
int gw__health(struct gw *g);
/* The model the workers serve (from a HELLO), false if none came yet. */
bool gw__model(struct gw *g, struct gw_model_info *out);

/* ---- gw_call.c: the calls' state machines ---- */
/* A new call of method m arrived on the CQ thread (ok = false: the server is shutting down). */
void gw__call_arrived(struct gw_call *c, bool ok);
/* A record of c's item arrived from its worker (final: the entry is already removed). */
void gw__call_event(struct gw_call *c, size_t item, const struct shm_msg *m);
/* c's item failed without a record (its worker died, the daemon stops). */
void gw__call_fail_item(struct gw_call *c, size_t item, int status, const char *msg);
/* Health changed: re-send to every Watch call. */
void gw__health_changed(struct gw *g);

/* ---- gw_call.c: generations on behalf of a caller that is not gRPC (daemon/http*.c) ----
 * The same path as a Generate/BatchGenerate call (authentication, limits, adapters, routing,
 * cancellation, statistics), without a grpc_call: instead of sending, the call runs
 * changed(ud) with its mutex held (any thread: it must only note it and wake its owner), and
 * the owner takes what came with gw_ext_take. */

/* What an item has come to, as gw_ext_take reports it. */
struct gw_ext_state {
    bool done;                     /* nothing more will come */
    int status;                    /* gRPC status of a failure, 0 = ok */
    char error[512];               /* its message */
    bool finished;                 /* FINISH came: fin is set */
    struct shm_msg_finish fin;
    uint64_t tokens;               /* tokens produced so far (taken or not) */
};

/* Authenticates `authorization` (the header's bytes, NULL = none) as gRPC's metadata is (rid:
 * the caller's id of the request, for the logs), then
 * submits reqs[0..n) as one call's items (n > 1: like BatchGenerate). Refusals come through
 * the call (gw_ext_take reports them), so the only failure here is -ENOMEM. */
int gw_ext_generate(struct gw *g, const char *rid, const char *authorization, size_t auth_len,
                    Clocher__V1__GenerateRequest *const *reqs, size_t n,
                    void (*changed)(void *ud), void *ud, struct gw_call **out);
/* Appends item i's text since the last take to buf (len/cap, realloc'd, NUL-terminated) and
 * says how it stands; the call's own status (a refusal) shows as every item's. 0 / -ENOMEM. */
int gw_ext_take(struct gw_call *c, size_t i, char **buf, size_t *len, size_t *cap,
                struct gw_ext_state *st);
/* The logprobs of item i's tokens that came since the last call (a request with logprobs):
 * *lps[*n] and the bytes their pieces point into (*bytes) move to the caller, who frees both
 * (NULL and 0 when none). Independent of gw_ext_take. 0 / -ENOMEM never (a move). */
void gw_ext_take_logprobs(struct gw_call *c, size_t i, struct gw_lp **lps, size_t *n,
                          char **bytes);
/* LoadAdapter (load) or UnloadAdapter as a gRPC client would call it, for the HTTP door's
 * /v1/load_lora_adapter and /v1/unload_lora_adapter: authenticated from `authorization`, then
 * the same checks (tenant ACL, name, path) and the same work on every ready worker. changed()
 * as for gw_ext_generate; the owner asks gw_ext_adapter_result. -ENOMEM only (refusals come
 * through the result). */
int gw_ext_adapter(struct gw *g, const char *rid, const char *authorization, size_t auth_len,
                   bool load, const char *name, const char *path, void (*changed)(void *ud),
                   void *ud, struct gw_call **out);
/* Whether a gw_ext_adapter call has ended; if so its gRPC status (0 = done: the adapter is
 * registered or removed, as the gRPC answer does) and message. Once true, call it no more. */
bool gw_ext_adapter_result(struct gw_call *c, int *status, char *msg, size_t cap);
/* The owner is done with c (any time, any thread): changed() is never run again, work still
 * running is cancelled (counted as CANCELLED), and the owner's reference is dropped. */
void gw_ext_release(struct gw_call *c);

/* ---- gw_reader.c: a slot's event reader thread (arg: its struct gw_slot) ---- */
void *gw__reader_main(void *slot);

/* ---- gw_hooks.c: the supervisor's hooks (hooks_ud: the struct gw) ---- */
extern const struct workers_hooks gw__hooks;

#endif
