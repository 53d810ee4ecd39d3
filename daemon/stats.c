/*
 * stats.c — clocherd's counters, gauges and histograms (the contract is stats.h): recorded by
 * the gateway's threads, rendered in Prometheus text format 0.0.4 for the metrics endpoint.
 *
 * NOTES
 *  - Every value is an independent relaxed atomic: a scrape needs no consistency between two
 *    series, and a writer never waits for a reader. The only lock is `mu`, taken to intern a
 *    name seen for the first time (a tenant or a method).
 *  - Interning publishes an entry by writing its name, then store-releasing the table's count
 *    (P0); lookups load-acquire the count (A0) and only read names below it, which never change
 *    afterwards. So the fast path (a known name) takes no lock.
 *  - Series are keyed by their rendered label, so two names can never render as two series
 *    with the same labels (an invalid Prometheus exposition): "" (anonymous access) and a real
 *    tenant called "anonymous" share one series; a tenant name that config.c would refuse
 *    (not 1..63 of [A-Za-z0-9_.-]), a real tenant called "_other" and every name beyond
 *    STATS_MAX_TENANTS share the overflow series "_other". Methods likewise: at most
 *    STATS_MAX_METHODS distinct names, then "_other".
 *  - The inter-token table (struct track) has one writer per slot, that slot's reader thread
 *    (stats_track), so an entry's id and time need no lock; the metrics thread only reads ids
 *    (stats_started), and a stale answer is harmless in a gauge's label.
 *  - Histograms keep per-bucket counts (not cumulative) and render the cumulative form; the
 *    rendered _count is the +Inf bucket, so a scrape's count always equals its last bucket.
 */
#include "stats.h"

#include "accesslog.h"
#include "check.h"
#include "err.h"
#include "log.h"
#include "msg.h"
#include "workers.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATS_MAGIC 0x53544154u /* "STAT" */
#define STATS_MAX_METHODS 32
#define STATS_NAME_MAX 64      /* the label's bytes + NUL (config.h's CONFIG_NAME_MAX) */
#define STATS_N_CODES 17       /* grpc_status_code 0..16; anything else counts as UNKNOWN */
#define STATS_CODE_UNKNOWN 2
#define STATS_OVERFLOW "_other"
#define STATS_ANONYMOUS "anonymous"
#define STATS_BASE "_base"     /* the adapter label of the base model */

/* Upper bounds of the histogram buckets, inclusive (Prometheus "le"), in nanoseconds, and the
 * same as rendered. The last bucket is +Inf. */
static const uint64_t hist_bound_ns[STATS_HIST_BUCKETS - 1] = {
    5000000ull,   10000000ull,   25000000ull,   50000000ull,   100000000ull,
    250000000ull, 500000000ull,  1000000000ull, 2500000000ull, 5000000000ull,
    10000000000ull, 30000000000ull, 60000000000ull,
};
static const char *const hist_le[STATS_HIST_BUCKETS] = {
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60",
    "+Inf",
};

static const char *const grpc_code_name[STATS_N_CODES] = {
    "OK",           "CANCELLED",         "UNKNOWN",          "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",    "ALREADY_EXISTS",   "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",         "UNAVAILABLE",      "DATA_LOSS",
    "UNAUTHENTICATED",
};

struct hist {
    _Atomic uint64_t bucket[STATS_HIST_BUCKETS]; /* observations in (bound[i-1], bound[i]] */
    _Atomic uint64_t sum_ns;
};

/* The tenant quotas a refusal is counted under (clocher_throttled_total{limit}). */
static const char *const quota_limit_name[] = {"requests_per_s", "tokens_per_min",
                                               "max_prompt_bytes", "max_queued"};
#define STATS_N_LIMITS (sizeof quota_limit_name / sizeof quota_limit_name[0])

/* The daemon-wide caps a refusal is counted under (clocher_global_refusals_total{limit}). */
static const char *const global_limit_name[] = {"max_calls", "max_connections"};
#define STATS_N_GLOBAL (sizeof global_limit_name / sizeof global_limit_name[0])

struct tenant_series {
    char label[STATS_NAME_MAX]; /* immutable once published (see NOTES) */
    _Atomic uint64_t prompt_tokens, completion_tokens, cached_tokens;
    _Atomic int64_t active_streams;
    _Atomic uint64_t throttled[STATS_N_LIMITS];
    struct hist ttft, tpot, e2e, queue;
    _Atomic uint64_t requests[STATS_MAX_METHODS + 1][STATS_N_CODES]; /* [method][code] */
};

/* The latest STATS record of one worker slot, field by field. */
struct worker_series {
    _Atomic bool have; /* a record arrived at least once */
    _Atomic uint64_t running, waiting;
    _Atomic uint64_t kv_total, kv_used, kv_cached;
    _Atomic uint64_t prefix_hit, prefix_miss, preemptions;
    _Atomic uint64_t requests_finished, tokens_generated, tokens_prefilled;
    _Atomic uint64_t rss_bytes;
};

/* One adapter's finished generations ("_base": the base model): clocher_adapter_*_total. */
struct adapter_series {
    char label[STATS_NAME_MAX]; /* immutable once published (see NOTES) */
    _Atomic uint64_t generations, prompt_tokens, completion_tokens;
};

/* A request a worker is generating for, as its slot's reader saw it: the last token's time.
 * Written only by that slot's reader thread; `id` is read by the metrics thread too. */
struct track {
    _Atomic uint64_t id; /* 0 = free */
    _Atomic uint64_t last_ns;
};

/* A table of interned labels: the first `n` entries are published (see NOTES). */
struct names {
    _Atomic size_t n;
    size_t cap;
};

struct stats {
    uint32_t magic;
    pthread_mutex_t mu; /* serialises interning only */

    struct names tenant_names;
    struct tenant_series tenants[STATS_MAX_TENANTS + 1]; /* the last one: "_other" */

    struct names method_names;
    char methods[STATS_MAX_METHODS + 1][STATS_NAME_MAX]; /* the last one: "_other" */

    struct names adapter_names;
    struct adapter_series adapters[STATS_MAX_ADAPTERS + 1]; /* the last one: "_other" */

    struct hist itl;               /* per-token gaps, every tenant (stats_track) */
    _Atomic bool tracking;         /* stats_track has seen a token */
    struct track *track;           /* [n_workers][STATS_TRACK_PER_SLOT] */

    pthread_mutex_t log_mu;        /* serialises access-log swaps against writers */
    struct accesslog *log;         /* NULL = no access log */

    _Atomic int64_t queue_depth;
    _Atomic uint64_t early_resets, conns_closed; /* the rapid-reset guard (daemon/gw_conn.c) */
    _Atomic uint64_t global_refusals[STATS_N_GLOBAL]; /* limits.max_calls / max_connections */

    size_t n_workers;
    struct worker_series *workers; /* [n_workers] */
};

int stats_create(size_t n_workers, struct stats **out)
{
    *out = NULL;
    struct stats *s = calloc(1, sizeof *s);
    if (!s || !(s->workers = calloc(n_workers ? n_workers : 1, sizeof *s->workers)) ||
        !(s->track = calloc((n_workers ? n_workers : 1) * STATS_TRACK_PER_SLOT,
                            sizeof *s->track))) {
        if (s)
            free(s->workers);
        free(s);
        LOG_ERR("stats: out of memory");
        return -ENOMEM;
    }
    s->magic = STATS_MAGIC;
    CHECK(pthread_mutex_init(&s->mu, NULL) == 0);
    CHECK(pthread_mutex_init(&s->log_mu, NULL) == 0);
    /* calloc's zero bytes are every atomic's zero value on the platforms we build for */
    s->tenant_names.cap = STATS_MAX_TENANTS;
    s->method_names.cap = STATS_MAX_METHODS;
    s->adapter_names.cap = STATS_MAX_ADAPTERS;
    snprintf(s->adapters[STATS_MAX_ADAPTERS].label, STATS_NAME_MAX, "%s", STATS_OVERFLOW);
    snprintf(s->tenants[STATS_MAX_TENANTS].label, STATS_NAME_MAX, "%s", STATS_OVERFLOW);
    snprintf(s->methods[STATS_MAX_METHODS], STATS_NAME_MAX, "%s", STATS_OVERFLOW);
    s->n_workers = n_workers;
    *out = s;
    return 0;
}

void stats_destroy(struct stats *s)
{
    if (!s)
        return;
    CHECK(s->magic == STATS_MAGIC);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->log_mu);
    accesslog_close(s->log);
    free(s->workers);
    free(s->track);
    s->magic = 0;
    free(s);
}

/* ---- interning ---- */

/* The label entry i of a table (tenants or methods); `stride` bytes apart from `base`. */
static char *name_at(char *base, size_t stride, size_t i) { return base + i * stride; }

/* The index of `key` in the table, interning it if there is room; `cap` (the overflow entry)
 * when there is none. */
static size_t intern(struct stats *s, struct names *t, char *base, size_t stride, const char *key)
{
    size_t n = atomic_load_explicit(&t->n, memory_order_acquire); /* A0 */
    for (size_t i = 0; i < n; i++)
        if (strcmp(name_at(base, stride, i), key) == 0)
            return i;
    if (n == t->cap)
        return t->cap;
    pthread_mutex_lock(&s->mu);
    /* entries added since our look are published; only we (holding mu) can add more */
    size_t m = atomic_load_explicit(&t->n, memory_order_relaxed);
    size_t i = n;
    for (; i < m; i++)
        if (strcmp(name_at(base, stride, i), key) == 0)
            break;
    if (i == m) {
        if (m < t->cap) {
            snprintf(name_at(base, stride, m), STATS_NAME_MAX, "%s", key);
            atomic_store_explicit(&t->n, m + 1, memory_order_release); /* P0 */
        } else {
            i = t->cap;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return i;
}

/* A tenant name config.c would accept (CONFIG_NAME_MAX: 1..63 of [A-Za-z0-9_.-]). */
static bool tenant_name_ok(const char *t)
{
    size_t n = 0;
    for (; t[n]; n++) {
        char c = t[n];
        if (n + 1 >= STATS_NAME_MAX ||
            !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return n > 0;
}

static struct tenant_series *tenant(struct stats *s, const char *name)
{
    const char *label;
    if (!name || !*name)
        label = STATS_ANONYMOUS;
    else if (!tenant_name_ok(name) || strcmp(name, STATS_OVERFLOW) == 0)
        return &s->tenants[STATS_MAX_TENANTS];
    else
        label = name;
    size_t i = intern(s, &s->tenant_names, s->tenants[0].label, sizeof s->tenants[0], label);
    return &s->tenants[i];
}

/* A method label: printable ASCII, shorter than STATS_NAME_MAX (else "_other"). */
static size_t method(struct stats *s, const char *name)
{
    if (!name || !*name || strlen(name) >= STATS_NAME_MAX || strcmp(name, STATS_OVERFLOW) == 0)
        return STATS_MAX_METHODS;
    for (const char *p = name; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return STATS_MAX_METHODS;
    return intern(s, &s->method_names, s->methods[0], sizeof s->methods[0], name);
}

/* An adapter's series: "" is the base model ("_base"); a name config.c would refuse, a real
 * adapter called "_base" or "_other" and every name beyond STATS_MAX_ADAPTERS share "_other". */
static struct adapter_series *adapter(struct stats *s, const char *name)
{
    const char *label;
    if (!name || !*name)
        label = STATS_BASE;
    else if (!tenant_name_ok(name) || strcmp(name, STATS_OVERFLOW) == 0 ||
             strcmp(name, STATS_BASE) == 0)
        return &s->adapters[STATS_MAX_ADAPTERS];
    else
        label = name;
    size_t i = intern(s, &s->adapter_names, s->adapters[0].label, sizeof s->adapters[0], label);
    return &s->adapters[i];
}

/* ---- recording ---- */

static void add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static void hist_observe(struct hist *h, uint64_t ns)
{
    size_t b = 0;
    while (b < STATS_HIST_BUCKETS - 1 && ns > hist_bound_ns[b])
        b++;
    add(&h->bucket[b], 1);
    add(&h->sum_ns, ns);
}

void stats_request(struct stats *s, const char *tenant_name, const char *method_name,
                   int grpc_status)
{
    struct tenant_series *t = tenant(s, tenant_name);
    size_t m = method(s, method_name);
    int code = grpc_status >= 0 && grpc_status < STATS_N_CODES ? grpc_status : STATS_CODE_UNKNOWN;
    add(&t->requests[m][code], 1);
}

void stats_generation(struct stats *s, const char *tenant_name, uint64_t prompt_tokens,
                      uint64_t completion_tokens, uint64_t cached_tokens, uint64_t ttft_ns,
                      uint64_t tpot_ns, uint64_t e2e_ns)
{
    struct tenant_series *t = tenant(s, tenant_name);
    add(&t->prompt_tokens, prompt_tokens);
    add(&t->completion_tokens, completion_tokens);
    add(&t->cached_tokens, cached_tokens);
    if (ttft_ns)
        hist_observe(&t->ttft, ttft_ns);
    if (tpot_ns)
        hist_observe(&t->tpot, tpot_ns);
    if (e2e_ns)
        hist_observe(&t->e2e, e2e_ns);
}

static const char *finish_reason_name(int reason)
{
    switch (reason) {
    case SHM_FINISH_EOS: return "eos";
    case SHM_FINISH_LENGTH: return "length";
    case SHM_FINISH_STOP: return "stop";
    case SHM_FINISH_CANCELLED: return "cancelled";
    case SHM_FINISH_DEADLINE: return "deadline";
    case SHM_FINISH_CONTEXT: return "context";
    default: return "unknown";
    }
}

void stats_finish(struct stats *s, const char *tenant_name, const char *adapter_name,
                  const struct shm_msg_finish *f)
{
    stats_generation(s, tenant_name, f->prompt_tokens, f->completion_tokens, f->cached_tokens,
                     f->ttft_ns, f->tpot_ns, f->e2e_ns);
    /* the queue wait is observed even when 0: a request that never waited is a sample too */
    hist_observe(&tenant(s, tenant_name)->queue, f->queue_ns);
    struct adapter_series *a = adapter(s, adapter_name);
    add(&a->generations, 1);
    add(&a->prompt_tokens, f->prompt_tokens);
    add(&a->completion_tokens, f->completion_tokens);
    pthread_mutex_lock(&s->log_mu);
    if (s->log) {
        const char *reason = finish_reason_name((int)f->reason);
        struct accesslog_entry e = {
            .tenant = tenant_name, .adapter = adapter_name, .request_id = f->request_id,
            .status = f->reason == SHM_FINISH_CANCELLED  ? "cancelled"
                      : f->reason == SHM_FINISH_DEADLINE ? "deadline"
                                                         : "ok",
            .finish_reason = reason, .prompt_tokens = f->prompt_tokens,
            .completion_tokens = f->completion_tokens, .cached_tokens = f->cached_tokens,
            .queue_ns = f->queue_ns, .ttft_ns = f->ttft_ns, .e2e_ns = f->e2e_ns};
        (void)accesslog_write(s->log, &e); /* logged there; never fails the request */
    }
    pthread_mutex_unlock(&s->log_mu);
}

int stats_open_access_log(struct stats *s, const char *path)
{
    struct accesslog *a = NULL;
    if (path) {
        int rc = accesslog_open(path, &a);
        if (rc < 0)
            return rc; /* the log open before (if any) stays */
    }
    pthread_mutex_lock(&s->log_mu);
    struct accesslog *old = s->log;
    s->log = a;
    pthread_mutex_unlock(&s->log_mu);
    accesslog_close(old);
    return 0;
}

/* The tracking entry of request `id` in slot `slot` (direct-mapped: ids are handed out in
 * sequence, so only requests STATS_TRACK_PER_SLOT ids apart share an entry). */
static struct track *track_at(const struct stats *s, unsigned slot, uint64_t id)
{
    return &s->track[(size_t)slot * STATS_TRACK_PER_SLOT + (size_t)(id % STATS_TRACK_PER_SLOT)];
}

void stats_track(struct stats *s, unsigned slot, const struct shm_msg *m, uint64_t now_ns)
{
    if (slot >= s->n_workers)
        return;
    uint64_t id;
    switch (m->type) {
    case SHM_MSG_TOKEN: id = m->token.request_id; break;
    case SHM_MSG_FINISH: id = m->finish.request_id; break;
    case SHM_MSG_ERROR: id = m->error.request_id; break;
    case SHM_MSG_DONE: id = m->request_id; break;
    default: return;
    }
    if (id == 0)
        return;
    struct track *t = track_at(s, slot, id);
    uint64_t had = atomic_load_explicit(&t->id, memory_order_relaxed);
    if (m->type != SHM_MSG_TOKEN) {
        if (had == id) /* the request ended: its entry is free */
            atomic_store_explicit(&t->id, 0, memory_order_relaxed);
        return;
    }
    if (m->token.token < 0)
        return; /* a text-only piece: no token was generated */
    if (had == id) {
        uint64_t last = atomic_load_explicit(&t->last_ns, memory_order_relaxed);
        hist_observe(&s->itl, now_ns > last ? now_ns - last : 0);
    } else {
        /* its first token (TTFT, not a gap); an entry left by a request that ended without
         * a record here (its worker died) is taken over */
        atomic_store_explicit(&t->id, id, memory_order_relaxed);
        atomic_store_explicit(&s->tracking, true, memory_order_relaxed);
    }
    atomic_store_explicit(&t->last_ns, now_ns, memory_order_relaxed);
}

int stats_started(const struct stats *s, unsigned slot, uint64_t request_id)
{
    if (!atomic_load_explicit(&s->tracking, memory_order_relaxed))
        return -1;
    if (slot >= s->n_workers || request_id == 0)
        return 0;
    return atomic_load_explicit(&track_at(s, slot, request_id)->id, memory_order_relaxed) ==
           request_id;
}

void stats_queue_depth_add(struct stats *s, int64_t delta)
{
    atomic_fetch_add_explicit(&s->queue_depth, delta, memory_order_relaxed);
}

void stats_active_streams_add(struct stats *s, const char *tenant_name, int64_t delta)
{
    struct tenant_series *t = tenant(s, tenant_name);
    atomic_fetch_add_explicit(&t->active_streams, delta, memory_order_relaxed);
}

void stats_throttled(struct stats *s, const char *tenant_name, const char *limit)
{
    struct tenant_series *t = tenant(s, tenant_name);
    for (size_t i = 0; i < STATS_N_LIMITS; i++)
        if (strcmp(limit, quota_limit_name[i]) == 0)
            atomic_fetch_add_explicit(&t->throttled[i], 1, memory_order_relaxed);
}

void stats_global_refusal(struct stats *s, const char *limit)
{
    for (size_t i = 0; i < STATS_N_GLOBAL; i++)
        if (strcmp(limit, global_limit_name[i]) == 0)
            atomic_fetch_add_explicit(&s->global_refusals[i], 1, memory_order_relaxed);
}

void stats_early_reset(struct stats *s, bool closed)
{
    atomic_fetch_add_explicit(&s->early_resets, 1, memory_order_relaxed);
    if (closed)
        atomic_fetch_add_explicit(&s->conns_closed, 1, memory_order_relaxed);
}

void stats_worker_engine(struct stats *s, unsigned slot, const struct shm_msg_stats *m)
{
    if (slot >= s->n_workers) {
        LOG_WARN("stats: STATS record for worker %u ignored (%zu workers)", slot, s->n_workers);
        return;
    }
    struct worker_series *w = &s->workers[slot];
#define SET_(field, v) atomic_store_explicit(&w->field, (v), memory_order_relaxed)
    SET_(running, m->running);
    SET_(waiting, m->waiting);
    SET_(kv_total, m->kv_blocks_total);
    SET_(kv_used, m->kv_blocks_used);
    SET_(kv_cached, m->kv_blocks_cached);
    SET_(prefix_hit, m->prefix_hit_tokens);
    SET_(prefix_miss, m->prefix_miss_tokens);
    SET_(preemptions, m->preemptions);
    SET_(requests_finished, m->requests_finished);
    SET_(tokens_generated, m->tokens_generated);
    SET_(tokens_prefilled, m->tokens_prefilled);
    SET_(rss_bytes, m->rss_bytes);
    SET_(have, true);
#undef SET_
}

/* ---- rendering ---- */

static uint64_t get(const _Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* A growing text buffer; `failed` latches the first allocation failure. */
struct out {
    char *buf;
    size_t len, cap;
    bool failed;
};

static bool out_reserve(struct out *o, size_t more)
{
    if (o->failed)
        return false;
    if (o->len + more + 1 <= o->cap)
        return true;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more + 1)
        cap *= 2;
    char *b = realloc(o->buf, cap);
    if (!b) {
        o->failed = true;
        return false;
    }
    o->buf = b;
    o->cap = cap;
    return true;
}

__attribute__((format(printf, 2, 3))) static void outf(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !out_reserve(o, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    o->len += (size_t)n;
}

/* A label value with Prometheus' escapes (\\, \", \n). */
static void out_label(struct out *o, const char *v)
{
    for (; *v; v++) {
        if (!out_reserve(o, 2))
            return;
        if (*v == '\\' || *v == '"') {
            o->buf[o->len++] = '\\';
            o->buf[o->len++] = *v;
        } else if (*v == '\n') {
            o->buf[o->len++] = '\\';
            o->buf[o->len++] = 'n';
        } else {
            o->buf[o->len++] = *v;
        }
    }
}

static void family(struct out *o, const char *name, const char *type, const char *help)
{
    outf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `name{tenant="..."` — the caller closes the label set. */
static void tenant_open(struct out *o, const char *name, const struct tenant_series *t)
{
    outf(o, "%s{tenant=\"", name);
    out_label(o, t->label);
    outf(o, "\"");
}

static size_t tenant_count(const struct stats *s)
{
    return atomic_load_explicit(&s->tenant_names.n, memory_order_acquire); /* A0 */
}

static bool tenant_used(const struct tenant_series *t)
{
    if (get(&t->prompt_tokens) || get(&t->completion_tokens) || get(&t->cached_tokens) ||
        atomic_load_explicit(&t->active_streams, memory_order_relaxed))
        return true;
    for (size_t i = 0; i < STATS_N_LIMITS; i++)
        if (get(&t->throttled[i]))
            return true;
    for (size_t b = 0; b < STATS_HIST_BUCKETS; b++)
        if (get(&t->ttft.bucket[b]) || get(&t->tpot.bucket[b]) || get(&t->e2e.bucket[b]) ||
            get(&t->queue.bucket[b]))
            return true;
    for (size_t m = 0; m <= STATS_MAX_METHODS; m++)
        for (size_t c = 0; c < STATS_N_CODES; c++)
            if (get(&t->requests[m][c]))
                return true;
    return false;
}

/* Whether tenant entry i is shown to a caller who may see only `only` (NULL: everything).
 * The overflow entry mixes tenants: only those who see everything see it. */
static bool tenant_visible(const struct tenant_series *t, size_t i, const char *only)
{
    if (!only)
        return true;
    return i != STATS_MAX_TENANTS && strcmp(t->label, only[0] ? only : STATS_ANONYMOUS) == 0;
}

/* Runs `body` with `t` bound to every tenant to render: the published ones, then the overflow
 * entry only if anything was counted there (a quiet daemon shows no "_other"). */
#define FOR_TENANTS_(s, only, t, body)                                                        \
    do {                                                                                      \
        size_t n_t_ = tenant_count(s);                                                        \
        for (size_t i_t_ = 0; i_t_ <= STATS_MAX_TENANTS; i_t_++) {                           \
            if (i_t_ >= n_t_ && i_t_ < STATS_MAX_TENANTS)                                     \
                continue;                                                                     \
            const struct tenant_series *t = &(s)->tenants[i_t_];                             \
            if (i_t_ == STATS_MAX_TENANTS && !tenant_used(t))                                 \
                continue;                                                                     \
            if (!tenant_visible(t, i_t_, only))                                               \
                continue;                                                                     \
            body                                                                              \
        }                                                                                     \
    } while (0)

/* The bucket, sum and count lines of one histogram series; `labels` ("tenant=\"x\"" or "")
 * is already escaped. */
static void hist_lines(struct out *o, const char *name, const char *labels, const struct hist *h)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (size_t b = 0; b < STATS_HIST_BUCKETS; b++) {
        cum += get(&h->bucket[b]);
        outf(o, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, labels, sep, hist_le[b], cum);
    }
    outf(o, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
         (double)get(&h->sum_ns) / 1e9);
    outf(o, "%s_count%s%s%s %" PRIu64 "\n", name, labels[0] ? "{" : "", labels,
         labels[0] ? "}" : "", cum);
}

/* One histogram family, a series per tenant (tenant labels are [A-Za-z0-9_.-] or "_other":
 * nothing to escape). */
static void render_hist(struct out *o, const struct stats *s, const char *only,
                        const char *name, size_t off, const char *help)
{
    family(o, name, "histogram", help);
    FOR_TENANTS_(s, only, t, {
        const struct hist *h = (const struct hist *)((const char *)t + off);
        char labels[STATS_NAME_MAX + 16];
        snprintf(labels, sizeof labels, "tenant=\"%s\"", t->label);
        hist_lines(o, name, labels, h);
    });
}

/* clocher_adapter_*_total{adapter}: only adapters that finished a generation. */
static void render_adapters(struct out *o, const struct stats *s)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } c[] = {
        {"clocher_adapter_generations_total", "Finished generations by adapter (_base: the base model).",
         offsetof(struct adapter_series, generations)},
        {"clocher_adapter_prompt_tokens_total", "Prompt tokens of finished generations by adapter.",
         offsetof(struct adapter_series, prompt_tokens)},
        {"clocher_adapter_completion_tokens_total",
         "Tokens generated by finished generations by adapter.",
         offsetof(struct adapter_series, completion_tokens)},
    };
    size_t n = atomic_load_explicit(&s->adapter_names.n, memory_order_acquire); /* A0 */
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        family(o, c[k].name, "counter", c[k].help);
        for (size_t i = 0; i <= STATS_MAX_ADAPTERS; i++) {
            if (i >= n && i < STATS_MAX_ADAPTERS)
                continue;
            const struct adapter_series *a = &s->adapters[i];
            if (i == STATS_MAX_ADAPTERS && !get(&a->generations))
                continue;
            outf(o, "%s{adapter=\"", c[k].name);
            out_label(o, a->label);
            outf(o, "\"} %" PRIu64 "\n",
                 get((const _Atomic uint64_t *)((const char *)a + c[k].off)));
        }
    }
}

static void render_tenant_counter(struct out *o, const struct stats *s, const char *only,
                                  const char *name, size_t off, const char *help)
{
    family(o, name, "counter", help);
    FOR_TENANTS_(s, only, t, {
        tenant_open(o, name, t);
        outf(o, "} %" PRIu64 "\n", get((const _Atomic uint64_t *)((const char *)t + off)));
    });
}

static void render_requests(struct out *o, const struct stats *s, const char *only)
{
    family(o, "clocher_requests_total", "counter",
           "Finished RPCs by gRPC method, final status and tenant.");
    size_t n_m = atomic_load_explicit(&s->method_names.n, memory_order_acquire); /* A0 */
    FOR_TENANTS_(s, only, t, {
        for (size_t m = 0; m <= STATS_MAX_METHODS; m++) {
            if (m >= n_m && m < STATS_MAX_METHODS)
                continue;
            for (size_t c = 0; c < STATS_N_CODES; c++) {
                uint64_t v = get(&t->requests[m][c]);
                if (!v)
                    continue; /* only combinations that happened, as client libraries do */
                outf(o, "clocher_requests_total{method=\"");
                out_label(o, s->methods[m]);
                outf(o, "\",status=\"%s\",tenant=\"", grpc_code_name[c]);
                out_label(o, t->label);
                outf(o, "\"} %" PRIu64 "\n", v);
            }
        }
    });
}

/* `name{worker="i",node="n"` — the caller closes the label set. */
static void worker_open(struct out *o, const char *name, const struct workers *w, size_t i)
{
    if (w && i < w->n)
        outf(o, "%s{worker=\"%zu\",node=\"%d\"", name, i, w->slots[i].node);
    else
        outf(o, "%s{worker=\"%zu\",node=\"unknown\"", name, i);
}

static void render_engine(struct out *o, const struct stats *s, const struct workers *w)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } gauge[] = {
        {"clocher_running_sequences", "gauge", "Sequences the worker is stepping.",
         offsetof(struct worker_series, running)},
        {"clocher_waiting_sequences", "gauge", "Sequences queued inside the worker.",
         offsetof(struct worker_series, waiting)},
        {"clocher_prefix_hit_tokens_total", "counter",
         "Prompt tokens served from the worker's prefix cache (resets when it restarts).",
         offsetof(struct worker_series, prefix_hit)},
        {"clocher_prefix_miss_tokens_total", "counter",
         "Prompt tokens the worker had to prefill (resets when it restarts).",
         offsetof(struct worker_series, prefix_miss)},
        {"clocher_preemptions_total", "counter",
         "Sequences the worker preempted for KV space (resets when it restarts).",
         offsetof(struct worker_series, preemptions)},
        {"clocher_worker_requests_finished_total", "counter",
         "Generations the worker finished (resets when it restarts).",
         offsetof(struct worker_series, requests_finished)},
        {"clocher_worker_generated_tokens_total", "counter",
         "Tokens the worker generated (resets when it restarts).",
         offsetof(struct worker_series, tokens_generated)},
        {"clocher_worker_prefilled_tokens_total", "counter",
         "Prompt tokens the worker prefilled (resets when it restarts).",
         offsetof(struct worker_series, tokens_prefilled)},
        {"clocher_worker_rss_bytes", "gauge", "Resident set size of the worker process.",
         offsetof(struct worker_series, rss_bytes)},
    };
    for (size_t g = 0; g < sizeof gauge / sizeof gauge[0]; g++) {
        family(o, gauge[g].name, gauge[g].type, gauge[g].help);
        for (size_t i = 0; i < s->n_workers; i++) {
            const struct worker_series *ws = &s->workers[i];
            if (!atomic_load_explicit(&ws->have, memory_order_relaxed))
                continue;
            worker_open(o, gauge[g].name, w, i);
            outf(o, "} %" PRIu64 "\n",
                 get((const _Atomic uint64_t *)((const char *)ws + gauge[g].off)));
        }
    }
    family(o, "clocher_kv_blocks", "gauge",
           "KV cache blocks of the worker: used by sequences, cached prefixes, free.");
    for (size_t i = 0; i < s->n_workers; i++) {
        const struct worker_series *ws = &s->workers[i];
        if (!atomic_load_explicit(&ws->have, memory_order_relaxed))
            continue;
        uint64_t total = get(&ws->kv_total), used = get(&ws->kv_used),
                 cached = get(&ws->kv_cached);
        /* fields are read one by one: a record replacing them meanwhile must not underflow */
        uint64_t busy = used + cached;
        uint64_t free_ = total > busy ? total - busy : 0;
        const char *state[3] = {"used", "cached", "free"};
        uint64_t v[3] = {used, cached, free_};
        for (size_t k = 0; k < 3; k++) {
            worker_open(o, "clocher_kv_blocks", w, i);
            outf(o, ",state=\"%s\"} %" PRIu64 "\n", state[k], v[k]);
        }
    }
}

static void render_supervisor(struct out *o, const struct workers *w)
{
    if (!w)
        return;
    family(o, "clocher_worker_state", "gauge",
           "1 for the worker slot's current lifecycle state, 0 for the others.");
    for (size_t i = 0; i < w->n; i++) {
        int st = atomic_load_explicit(&w->slots[i].state, memory_order_acquire);
        for (int k = WORKERS_STARTING; k <= WORKERS_DEAD; k++) {
            worker_open(o, "clocher_worker_state", w, i);
            outf(o, ",state=\"%s\"} %d\n", workers_state_name(k), st == k);
        }
    }
    family(o, "clocher_worker_given_up", "gauge",
           "1 when the slot's worker is not respawned any more (crash loop or fatal error).");
    for (size_t i = 0; i < w->n; i++) {
        worker_open(o, "clocher_worker_given_up", w, i);
        outf(o, "} %d\n",
             (int)atomic_load_explicit(&w->slots[i].given_up, memory_order_relaxed));
    }
    family(o, "clocher_worker_generation", "gauge",
           "Spawns of the slot's worker so far (1 for the first).");
    for (size_t i = 0; i < w->n; i++) {
        worker_open(o, "clocher_worker_generation", w, i);
        outf(o, "} %" PRIu32 "\n",
             atomic_load_explicit(&w->slots[i].generation, memory_order_relaxed));
    }
    family(o, "clocher_worker_restarts_total", "counter",
           "Respawns of the slot's worker after a crash.");
    for (size_t i = 0; i < w->n; i++) {
        worker_open(o, "clocher_worker_restarts_total", w, i);
        outf(o, "} %" PRIu64 "\n",
             atomic_load_explicit(&w->slots[i].restarts, memory_order_relaxed));
    }
    family(o, "clocher_worker_hot_replicated_bytes", "gauge",
           "Bytes of hot tensors the slot's worker copied to node-local memory.");
    for (size_t i = 0; i < w->n; i++) {
        worker_open(o, "clocher_worker_hot_replicated_bytes", w, i);
        outf(o, "} %" PRIu64 "\n",
             atomic_load_explicit(&w->slots[i].hot_replicated_bytes, memory_order_relaxed));
    }
    family(o, "clocher_worker_hot_replicated_tensors", "gauge",
           "Tensors the slot's worker copied to node-local memory.");
    for (size_t i = 0; i < w->n; i++) {
        worker_open(o, "clocher_worker_hot_replicated_tensors", w, i);
        outf(o, "} %" PRIu64 "\n",
             atomic_load_explicit(&w->slots[i].hot_replicated_tensors, memory_order_relaxed));
    }
    family(o, "clocher_workers_ready", "gauge", "Worker slots currently ready to serve.");
    outf(o, "clocher_workers_ready %zu\n", workers_ready_count(w));
    family(o, "clocher_daemon_phase", "gauge",
           "1 for the daemon's current phase, 0 for the others.");
    int ph = atomic_load_explicit(&w->phase, memory_order_relaxed);
    for (int k = WORKERS_PHASE_STARTING; k <= WORKERS_PHASE_STOPPING; k++)
        outf(o, "clocher_daemon_phase{phase=\"%s\"} %d\n", workers_phase_name(k), ph == k);
}

int stats_render(const struct stats *s, const struct workers *w, char **out, size_t *len)
{
    return stats_render_for(s, w, NULL, out, len);
}

int stats_render_for(const struct stats *s, const struct workers *w, const char *only,
                     char **out, size_t *len)
{
    CHECK(s->magic == STATS_MAGIC);
    *out = NULL;
    *len = 0;
    struct out o = {0};

    render_requests(&o, s, only);
    render_tenant_counter(&o, s, only, "clocher_prompt_tokens_total",
                          offsetof(struct tenant_series, prompt_tokens),
                          "Prompt tokens of finished generations.");
    render_tenant_counter(&o, s, only, "clocher_completion_tokens_total",
                          offsetof(struct tenant_series, completion_tokens),
                          "Tokens generated by finished generations.");
    render_tenant_counter(&o, s, only, "clocher_cached_tokens_total",
                          offsetof(struct tenant_series, cached_tokens),
                          "Prompt tokens of finished generations served from the prefix cache.");
    render_hist(&o, s, only, "clocher_ttft_seconds", offsetof(struct tenant_series, ttft),
                "Time to first token of finished generations.");
    render_hist(&o, s, only, "clocher_tpot_seconds", offsetof(struct tenant_series, tpot),
                "Mean time per output token after the first, per finished generation.");
    render_hist(&o, s, only, "clocher_e2e_seconds", offsetof(struct tenant_series, e2e),
                "End-to-end duration of finished generations.");
    render_hist(&o, s, only, "clocher_queue_seconds", offsetof(struct tenant_series, queue),
                "Time finished generations waited in their worker's queue before prefill.");
    family(&o, "clocher_itl_seconds", "histogram",
           "Gap between consecutive generated tokens of a request, per token, as the gateway "
           "receives them (every tenant).");
    hist_lines(&o, "clocher_itl_seconds", "", &s->itl);
    if (!only)
        render_adapters(&o, s); /* adapters mix tenants: only those who see everything */

    family(&o, "clocher_queue_depth", "gauge",
           "Generations waiting in the gateway's queue for a worker slot.");
    outf(&o, "clocher_queue_depth %" PRId64 "\n",
         atomic_load_explicit(&s->queue_depth, memory_order_relaxed));
    family(&o, "clocher_active_streams", "gauge", "Streams in flight.");
    FOR_TENANTS_(s, only, t, {
        tenant_open(&o, "clocher_active_streams", t);
        outf(&o, "} %" PRId64 "\n", atomic_load_explicit(&t->active_streams,
                                                        memory_order_relaxed));
    });

    family(&o, "clocher_throttled_total", "counter",
           "Requests refused by a tenant quota, by the quota (tenants[].<limit>).");
    FOR_TENANTS_(s, only, t, {
        for (size_t i = 0; i < STATS_N_LIMITS; i++) {
            tenant_open(&o, "clocher_throttled_total", t);
            outf(&o, ",limit=\"%s\"} %" PRIu64 "\n", quota_limit_name[i], get(&t->throttled[i]));
        }
    });
    family(&o, "clocher_early_resets_total", "counter",
           "Streams reset by their client before any answer (HTTP/2 rapid reset).");
    outf(&o, "clocher_early_resets_total %" PRIu64 "\n", get(&s->early_resets));
    family(&o, "clocher_connections_closed_total", "counter",
           "Connections closed for too many early resets (limits.max_early_resets).");
    outf(&o, "clocher_connections_closed_total %" PRIu64 "\n", get(&s->conns_closed));
    family(&o, "clocher_global_refusals_total", "counter",
           "Calls refused by a daemon-wide cap (limits.max_calls, limits.max_connections).");
    for (size_t i = 0; i < STATS_N_GLOBAL; i++)
        outf(&o, "clocher_global_refusals_total{limit=\"%s\"} %" PRIu64 "\n",
             global_limit_name[i], get(&s->global_refusals[i]));

    render_engine(&o, s, w);
    render_supervisor(&o, w);

    if (o.failed || !out_reserve(&o, 0)) {
        free(o.buf);
        LOG_ERR("stats_render: out of memory");
        return -ENOMEM;
    }
    o.buf[o.len] = '\0';
    *out = o.buf;
    *len = o.len;
    return 0;
}
