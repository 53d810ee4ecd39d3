/*
 * engine.c — the serving engine (engine.h): requests, the iteration-level scheduler, events
 * and metrics. The batched forward pass is fwd_batch.c; the KV cache is kv.h.
 *
 * A request lives in one of two lists: waiting (submitted, or preempted) and running (it has a
 * KV sequence). Its tokens are prompt + generated so far; positions [0, n_done) are in its KV
 * sequence and [n_done, n_tok) are pending (a prompt still to prefill, or the token just
 * sampled). engine_step():
 *   1. finishes requests whose deadline passed;
 *   2. admits waiting requests while the running batch has room and the KV pool has blocks for
 *      the request's whole known text: highest priority first, then the tenant with the fewest
 *      running requests (round-robin between tenants), then the oldest. Admission attaches the
 *      longest cached prefix (kv.h), which skips that prefill;
 *   3. builds the step: the decode token of every running request (1 pending token), then
 *      prefill chunks of the others, in (priority, admission) order, under max_step_tokens,
 *      the prefill budget split fairly between tenants within a priority (fair_shares);
 *      each reserves its KV rows first; when the pool cannot provide them the running request
 *      last in that order (lowest priority, youngest) is preempted: its blocks are freed and it
 *      goes back to waiting with every token it has (emitted tokens are never re-emitted; it
 *      is recomputed as a prompt). A request alone that cannot grow fails (ERR_OVERLOADED);
 *   4. runs one batched forward pass, samples one token for every request whose last pending
 *      token was computed (the rows in parallel over the pool, sample_rows), commits the rows
 *      (full blocks enter the prefix index), and emits TOKEN / FINISH events.
 *
 * NOTES: everything runs on the engine's owner thread (engine.h); the pool's threads only run
 * matmul rows, attention and per-row tasks inside engine__fwd_run, and the step's draws
 * (each request's own sampler, nothing shared). Event callbacks must not call back
 * into the engine (the lists are being walked). A request owns its sampler, its stop-string
 * state, one adapter reference and its KV sequence; all are released when it finishes.
 */
#include "engine.h"
#include "mono.h"

#include "engine_internal.h"

#include "check.h"
#include "err.h"
#include "kern.h"
#include "kv.h"
#include "log.h"
#include "lora.h"
#include "model.h"
#include "pool.h"
#include "sampler.h"
#include "tok.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_STEP_TOKENS 256u
#define DEFAULT_RUNNING 16u
#define DEFAULT_QUEUE 256u
#define STATS_RING 1024u   /* finished requests the latency percentiles cover */
#define TPS_WINDOW_NS 2000000000ull
#define MAX_STOP_IDS 16u   /* end-of-sequence ids (Llama 3: 128001, 128008, 128009) */

/* The chat metadata conversion writes beside the IEBIN (docs/CHAT.md). */
#ifndef CHAT_META_FILE /* the same name in worker/process/chat.h and client/offline/chat_meta.h */
#define CHAT_META_FILE "chat.ie.json"
/* The prefix-key namespace of batch-invariant requests (engine_request.batch_invariant) */
#define INV_KEY UINT64_C(0x62617463682d696e)
#endif

struct collect; /* engine_generate's capture */

struct ereq {
    uint64_t id;
    uint64_t arrival;          /* submission order: older first within a priority */
    uint64_t admission;        /* order of the latest admission */
    struct engine_request r;   /* copy; prompt and stop point into our own storage */
    int32_t *tokens;           /* [cap] prompt then generated */
    size_t n_prompt, n_tok, cap;
    uint32_t n_gen;
    uint32_t n_done;           /* positions in the KV sequence */
    uint32_t cached_tokens;    /* prefix hit at first admission */
    bool admitted_once;
    struct kv_seq *kv;         /* NULL while waiting */
    struct kv_seq *kvw;        /* the sliding layers' sequence (e->split), else NULL */
    struct sampler *smp;
    /* the last token's log-probabilities (engine_request.logprobs) */
    float lp;
    uint32_t lp_n;
    struct sampler_logprob lp_top[SAMPLER_MAX_TOP_LOGPROBS];
    struct sampler_stop stop;
    bool has_stop;
    struct tok_stream ts;
    char *text;                /* [text_cap] tok_stream output */
    size_t text_cap;
    struct lora_adapter *ad;   /* one reference, or NULL */
    uint64_t adapter_key;      /* KV prefix key of (adapter, scale); 0 = base */
    uint64_t t_submit, t_first, t_last;
    uint64_t t_admit;          /* first admission; 0 = never admitted (queue_ms) */
    bool in_batch;
    struct collect *collect;
};

struct collect {
    int32_t *ids;
    size_t n, cap;
    int err;
    bool done;
    struct engine_event finish;
};

struct engine {
    struct engine_config cfg;
    engine_event_fn *on_event;
    void *ud;
    struct model *m;
    struct tok *tok;
    int32_t stop_ids[MAX_STOP_IDS]; /* [n_stop_ids] end-of-sequence ids (load_stop_ids) */
    uint32_t n_stop_ids;
    struct pool *pool;
    struct kv_pool *kv;
    bool split;                /* sliding layers in their own sequences (docs/KV.md) */
    bool slide_all;            /* every layer slides (Mistral): r->kv itself releases */
    uint32_t window;           /* the sliding layers' window (split or slide_all), else 0 */
    struct engine__fwd *fwd;
    struct lora_registry *loras;
    uint64_t fingerprint;
    char *snapshot_path;

    struct ereq **running;     /* [max_running] */
    size_t n_running;
    struct ereq **waiting;     /* [max_queue + max_running]: preempted requests come back */
    size_t n_waiting, cap_waiting;
    uint64_t next_id, next_arrival, next_admission;

    /* step scratch */
    int32_t *btok;             /* [max_step_tokens] */
    struct engine__bseq *bseq; /* [max_running] */
    struct ereq **breq;        /* [max_running] */
    int32_t *bdraw;            /* [max_running] each sampling row's draw (sample_rows) */
    size_t *bsrow;             /* [max_running] the sequence of each sampling row */
    struct fair_slot *fair;    /* [max_running]: prefill shares of one step, per (prio, tenant) */

    /* metrics */
    uint64_t preemptions, finished, generated, prefilled;
    uint64_t win_start_ns, win_tokens;
    double tps;
    double ttft[STATS_RING], tpot[STATS_RING], e2e[STATS_RING];
    engine__logits_fn *tap;
    void *tap_ud;
    bool lora_bypass;          /* engine__set_lora_bypass: steps run every request base-only */
    size_t n_stats;            /* total recorded; ring index = n % STATS_RING */
};

/* A step's prefill share of one tenant at one priority (fair_shares). */
struct fair_slot {
    uint64_t tenant;
    int prio;
    uint64_t demand; /* pending prefill tokens of its running requests not yet in the batch */
    uint32_t left;   /* tokens it may still take in the fair pass of this step */
};

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/*
 * What KV snapshots are tied to: the hyper-parameters and the tensor table (name, dtype,
 * shape, size) plus the first and last 4 KiB of every tensor's data. Cheap at start-up and
 * different for any re-conversion or fine-tune we know of; a snapshot from another model is
 * refused by kv_snapshot_restore.
 */
static uint64_t model_fingerprint(const struct model *m)
{
    const struct iebin_model *im = m->im;
    const struct iebin_hparams *hp = &m->hp;
    uint64_t h = 0xcbf29ce484222325ull;
    uint32_t dims[] = {hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                       hp->ffn_dim, hp->vocab_size, hp->max_seq_len};
    h = fnv1a(h, dims, sizeof dims);
    h = fnv1a(h, &hp->rope_theta, sizeof hp->rope_theta);
    h = fnv1a(h, &hp->rms_eps, sizeof hp->rms_eps);
    for (size_t i = 0; i < im->n_tensors; i++) {
        const struct iebin_tensor *t = &im->tensors[i];
        h = fnv1a(h, t->name, strlen(t->name));
        uint64_t meta[2 + IEBIN_MAX_DIMS] = {(uint64_t)t->dtype, t->size};
        for (int d = 0; d < t->n_dims && d < IEBIN_MAX_DIMS; d++)
            meta[2 + d] = t->shape[d];
        h = fnv1a(h, meta, sizeof meta);
        if (t->data) {
            size_t n = t->size < 4096 ? (size_t)t->size : 4096;
            h = fnv1a(h, t->data, n);
            h = fnv1a(h, (const char *)t->data + t->size - n, n);
        }
    }
    return h ? h : 1;
}

/* ---- events ---------------------------------------------------------------------------- */

static void emit(struct engine *e, struct ereq *r, struct engine_event *ev)
{
    ev->id = r->id;
    ev->user = r->r.user;
    struct collect *c = r->collect;
    if (c) {
        if (ev->kind == ENGINE_EV_TOKEN && ev->token >= 0) {
            if (c->n == c->cap) {
                size_t nc = c->cap ? 2 * c->cap : 64;
                int32_t *p = realloc(c->ids, nc * sizeof *p);
                if (!p) {
                    LOG_ERR("engine: out of memory collecting the generated ids");
                    c->err = -ENOMEM;
                } else {
                    c->ids = p;
                    c->cap = nc;
                }
            }
            if (c->n < c->cap)
                c->ids[c->n++] = ev->token;
        } else if (ev->kind == ENGINE_EV_FINISH) {
            c->finish = *ev;
            c->finish.text = NULL;
            c->finish.message = NULL;
            c->done = true;
        } else if (ev->kind == ENGINE_EV_ERROR && !c->err) {
            c->err = ev->code;
        }
    }
    if (e->on_event)
        e->on_event(ev, e->ud);
}

static void emit_text(struct engine *e, struct ereq *r, int32_t token, const char *text,
                      size_t len)
{
    struct engine_event ev = {.kind = ENGINE_EV_TOKEN, .token = token, .text = text ? text : "",
                              .text_len = text ? len : 0};
    if (r->r.logprobs && token >= 0) /* a generated token: sample_task set r->lp */
        ev.has_logprob = true, ev.logprob = r->lp, ev.n_top = r->lp_n, ev.top = r->lp_top;
    emit(e, r, &ev);
}

/* ---- request lifetime ---------------------------------------------------------------------- */

/* Lets go of r's KV sequences (both when the sliding layers are kept apart). */
static void req_kv_drop(struct ereq *r)
{
    kv_seq_destroy(r->kvw);
    kv_seq_destroy(r->kv);
    r->kv = r->kvw = NULL;
}

static void req_free(struct ereq *r)
{
    if (!r)
        return;
    req_kv_drop(r);
    sampler_destroy(r->smp);
    if (r->has_stop)
        sampler_stop_fini(&r->stop);
    lora_registry_release(r->ad);
    free(r->tokens);
    free(r->text);
    free(r);
}

static void remove_from(struct ereq **list, size_t *n, const struct ereq *r)
{
    for (size_t i = 0; i < *n; i++)
        if (list[i] == r) {
            memmove(list + i, list + i + 1, (*n - i - 1) * sizeof *list);
            (*n)--;
            return;
        }
}

static void record_stats(struct engine *e, double ttft, double tpot, double e2e)
{
    size_t i = e->n_stats % STATS_RING;
    e->ttft[i] = ttft;
    e->tpot[i] = tpot;
    e->e2e[i] = e2e;
    e->n_stats++;
}

/* Flushes held-back text, emits FINISH, unlinks and frees r. */
static void finish(struct engine *e, struct ereq *r, enum engine_finish reason)
{
    if (e->tok && r->n_gen > 0 && reason != ENGINE_FINISH_STOP) {
        /* text held back: an incomplete UTF-8 tail, a possible stop-string beginning */
        size_t n = 0;
        if (tok_stream_flush(&r->ts, r->text, r->text_cap, &n) == 0 && (n || r->has_stop)) {
            const char *out = r->text;
            size_t n_out = n;
            if (r->has_stop) {
                bool stopped;
                if (sampler_stop_push(&r->stop, r->text, n, &out, &n_out, &stopped) == 0) {
                    if (n_out)
                        emit_text(e, r, -1, out, n_out);
                    if (!stopped)
                        sampler_stop_flush(&r->stop, &out, &n_out);
                    else
                        n_out = 0;
                } else {
                    n_out = 0;
                }
            }
            if (n_out)
                emit_text(e, r, -1, out, n_out);
        }
    }
    uint64_t t = mono_ns();
    struct engine_event ev = {.kind = ENGINE_EV_FINISH, .reason = reason};
    ev.prompt_tokens = (uint32_t)r->n_prompt;
    ev.generated_tokens = r->n_gen;
    ev.cached_tokens = r->cached_tokens;
    ev.e2e_ms = (double)(t - r->t_submit) / 1e6;
    ev.queue_ms = (double)((r->t_admit ? r->t_admit : t) - r->t_submit) / 1e6;
    if (r->n_gen > 0) {
        ev.ttft_ms = (double)(r->t_first - r->t_submit) / 1e6;
        ev.tpot_ms = r->n_gen > 1 ? (double)(r->t_last - r->t_first) / 1e6 / (r->n_gen - 1) : 0;
        record_stats(e, ev.ttft_ms, ev.tpot_ms, ev.e2e_ms);
    }
    remove_from(e->running, &e->n_running, r);
    remove_from(e->waiting, &e->n_waiting, r);
    /* the KV blocks go back before the event: a callback may submit at once */
    req_kv_drop(r);
    e->finished++;
    emit(e, r, &ev);
    req_free(r);
}

static void fail(struct engine *e, struct ereq *r, int code, const char *msg)
{
    struct engine_event ev = {.kind = ENGINE_EV_ERROR, .code = code, .message = msg};
    emit(e, r, &ev);
    finish(e, r, ENGINE_FINISH_ERROR);
}

/* ---- creation ------------------------------------------------------------------------------ */

static int pick_threads(int n)
{
    if (n > 0)
        return n > POOL_MAX_THREADS ? POOL_MAX_THREADS : n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c < 1 ? 1 : c > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)c;
}

static uint64_t default_budget(const struct model *m, uint32_t max_running, enum dtype dt)
{
    /* every running request at the full context, capped at a quarter of RAM */
    uint64_t row = 0;
    if (dtype_is_kv8(dt)) /* codes plus a scale per head: what kv.c stores (not a dtype row) */
        row = (uint64_t)m->hp.n_kv_heads * kern_kv8_head_bytes(m->hp.head_dim);
    else if (dtype_row_bytes(dt, m->kv_dim, &row))
        row = (uint64_t)m->kv_dim * 4;
    uint64_t per_pos = (uint64_t)m->hp.n_layers * 2 * row;
    uint64_t want = per_pos * m->hp.max_seq_len * max_running;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : (1ull << 32);
    return want < ram / 4 ? want : ram / 4;
}

/* Adds id (a negative one: none) to the end-of-sequence set, once. */
static void add_stop_id(struct engine *e, int32_t id)
{
    if (id < 0)
        return;
    for (uint32_t i = 0; i < e->n_stop_ids; i++)
        if (e->stop_ids[i] == id)
            return;
    if (e->n_stop_ids < MAX_STOP_IDS)
        e->stop_ids[e->n_stop_ids++] = id;
}

static bool is_stop_id(const struct engine *e, int32_t id)
{
    for (uint32_t i = 0; i < e->n_stop_ids; i++)
        if (e->stop_ids[i] == id)
            return true;
    return false;
}

/* The model's own end-of-sequence ids: <model_dir>/chat.ie.json "eos_token_ids", what its
 * generation config lists (Llama 3 Instruct ends a turn with <|eot_id|>, which is not the
 * tokenizer's EOS). No file or no key: the tokenizer's EOS alone. A malformed file, a list
 * that is not of ids in [0, vocab) or longer than MAX_STOP_IDS: ERR_FORMAT naming the file. */
static int load_stop_ids(struct engine *e, const char *model_dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", model_dir, CHAT_META_FILE);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int err = errno;
        if (err == ENOENT)
            return 0;
        LOG_ERR("engine: open(%s) failed: %s", path, strerror(err));
        return -err;
    }
    json_error_t je;
    json_t *meta = json_loadf(f, 0, &je);
    fclose(f);
    int rc = 0;
    json_t *ids = meta ? json_object_get(meta, "eos_token_ids") : NULL;
    if (!meta || !json_is_object(meta)) {
        LOG_ERR("engine: %s:%d: %s", path, meta ? 1 : je.line,
                meta ? "not a JSON object" : je.text);
        rc = ERR_FORMAT;
    } else if (ids && (!json_is_array(ids) || json_array_size(ids) > MAX_STOP_IDS)) {
        LOG_ERR("engine: %s: eos_token_ids is not a list of at most %u token ids", path,
                MAX_STOP_IDS);
        rc = ERR_FORMAT;
    } else if (ids) {
        const uint32_t V = e->m->hp.vocab_size;
        size_t i;
        json_t *v;
        json_array_foreach(ids, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= (json_int_t)V) {
                LOG_ERR("engine: %s: eos_token_ids[%zu] is not a token id in [0, %u)", path, i,
                        V);
                rc = ERR_FORMAT;
                break;
            }
            add_stop_id(e, (int32_t)json_integer_value(v));
        }
    }
    json_decref(meta);
    return rc;
}

int engine_create(const struct engine_config *cfg, engine_event_fn *on_event, void *ud,
                  struct engine **out)
{
    int rc = kern_init();
    if (rc)
        return rc;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        LOG_ERR("engine: out of memory");
        return -ENOMEM;
    }
    e->cfg = *cfg;
    e->on_event = on_event;
    e->ud = ud;
    e->next_id = 1;
    struct engine_config *c = &e->cfg;
    if (!c->max_step_tokens)
        c->max_step_tokens = DEFAULT_STEP_TOKENS;
    if (!c->max_running)
        c->max_running = DEFAULT_RUNNING;
    if (!c->max_queue)
        c->max_queue = DEFAULT_QUEUE;
    if (c->max_running > c->max_step_tokens) {
        LOG_ERR("engine: max_running %u exceeds max_step_tokens %u (every running request "
                "needs a token of the step)", c->max_running, c->max_step_tokens);
        rc = ERR_RANGE;
        goto fail;
    }
    if (c->max_step_tokens > (1u << 16) || c->max_running > (1u << 14) ||
        c->max_queue > (1u << 24)) {
        LOG_ERR("engine: max_step_tokens %u, max_running %u or max_queue %u is out of range "
                "(65536, 16384, 16777216)", c->max_step_tokens, c->max_running, c->max_queue);
        rc = ERR_RANGE;
        goto fail;
    }
    c->model_dir = NULL; /* not kept: the caller's string */
    c->pin = NULL;
    if (cfg->snapshot_path && !(e->snapshot_path = strdup(cfg->snapshot_path))) {
        rc = -ENOMEM;
        LOG_ERR("engine: out of memory");
        goto fail;
    }
    c->snapshot_path = e->snapshot_path;

    if ((rc = model_open(cfg->model_dir, 0, &e->m)))
        goto fail;
    if (e->m->im->tokenizer_path) {
        if ((rc = tok_load(e->m->im->tokenizer_path, &e->tok)))
            goto fail;
        add_stop_id(e, tok_eos(e->tok));
    }
    if ((rc = load_stop_ids(e, cfg->model_dir)) < 0)
        goto fail;
    enum pool_pin pin = POOL_PIN_NONE;
    if (cfg->pin && !strcmp(cfg->pin, "compact"))
        pin = POOL_PIN_COMPACT;
    else if (cfg->pin && !strcmp(cfg->pin, "scatter"))
        pin = POOL_PIN_SCATTER;
    else if (cfg->pin && *cfg->pin && strcmp(cfg->pin, "none")) {
        LOG_ERR("engine: pin \"%s\" is not compact, scatter or none", cfg->pin);
        rc = ERR_RANGE;
        goto fail;
    }
    if ((rc = pool_create(pick_threads(cfg->n_threads), pin, &e->pool)))
        goto fail;

    const struct iebin_hparams *hp = &e->m->hp;
    /* sliding layers apart (each request: two sequences of one pool, docs/KV.md "Sliding
     * layers") when they are as many as the full ones, so that one block size serves both */
    e->split = e->m->n_sliding > 0 && 2 * e->m->n_sliding == hp->n_layers;
    /* every layer sliding (Mistral v0.1): the one sequence lets go of what no layer sees */
    e->slide_all = e->m->n_sliding > 0 && e->m->n_sliding == hp->n_layers &&
                   hp->sliding_window > 0;
    e->window = e->split || e->slide_all ? hp->sliding_window : 0;
    struct kv_config kc = {
        .n_layers = e->split ? e->m->n_sliding : hp->n_layers,
        .n_kv_heads = hp->n_kv_heads,
        .head_dim = hp->head_dim,
        .block_tokens = cfg->kv_block_tokens,
        .dtype = cfg->kv_dtype,
        .budget_bytes = cfg->kv_budget_bytes ? cfg->kv_budget_bytes
                                             : default_budget(e->m, c->max_running, cfg->kv_dtype),
        .prefix_cache = cfg->prefix_cache,
    };
    if ((rc = kv_pool_create(&kc, &e->kv)))
        goto fail;
    e->fingerprint = model_fingerprint(e->m);
    /* the fingerprint read both ends of every tensor: the repacked matrices' pages it faulted
     * back in go out again (model.h; the weights resident once). A failure is logged there and
     * costs memory, not correctness: the engine still serves */
    (void)model_release_stored_rows(e->m, NULL);
    if (e->snapshot_path && cfg->prefix_cache) {
        uint32_t n = 0;
        rc = kv_snapshot_restore(e->kv, e->snapshot_path, e->fingerprint, &n);
        if (rc == 0)
            LOG_INFO("engine: restored %u KV blocks from %s", n, e->snapshot_path);
        /* otherwise kv.h logged why (a warning for a bad file); start cold */
    }
    if ((rc = engine__fwd_create(e->m, e->pool, c->max_step_tokens, c->max_running, &e->fwd)) ||
        (rc = lora_registry_create(hp, 0, &e->loras)))
        goto fail;
    lora_registry_set_pack(e->loras, (enum lora_pack)c->lora_pack);
    e->cap_waiting = (size_t)c->max_queue + c->max_running;
    e->running = calloc(c->max_running, sizeof *e->running);
    e->waiting = calloc(e->cap_waiting, sizeof *e->waiting);
    e->btok = calloc(c->max_step_tokens, sizeof *e->btok);
    e->bseq = calloc(c->max_running, sizeof *e->bseq);
    e->breq = calloc(c->max_running, sizeof *e->breq);
    e->bdraw = calloc(c->max_running, sizeof *e->bdraw);
    e->bsrow = calloc(c->max_running, sizeof *e->bsrow);
    e->fair = calloc(c->max_running, sizeof *e->fair);
    if (!e->running || !e->waiting || !e->btok || !e->bseq || !e->breq || !e->bdraw || !e->bsrow || !e->fair) {
        LOG_ERR("engine: out of memory for the request tables");
        rc = -ENOMEM;
        goto fail;
    }
    e->win_start_ns = mono_ns();
    *out = e;
    return 0;
fail:
    engine_destroy(e);
    return rc;
}

void engine_set_progress(struct engine *e, engine_progress_fn *fn, void *ud)
{
    engine__fwd_set_progress(e->fwd, fn, ud);
}

void engine_destroy(struct engine *e)
{
    if (!e)
        return;
    while (e->n_running)
        req_free(e->running[--e->n_running]);
    while (e->n_waiting)
        req_free(e->waiting[--e->n_waiting]);
    if (e->kv && e->snapshot_path && e->cfg.prefix_cache) {
        struct kv_metrics km;
        kv_pool_metrics(e->kv, &km);
        uint64_t max_blocks = km.blocks_total;
        if (e->cfg.snapshot_max_bytes && km.block_bytes &&
            e->cfg.snapshot_max_bytes / km.block_bytes < max_blocks)
            max_blocks = e->cfg.snapshot_max_bytes / km.block_bytes;
        uint32_t n = 0;
        if (max_blocks &&
            kv_snapshot_save(e->kv, e->snapshot_path, e->fingerprint,
                             (uint32_t)(max_blocks > UINT32_MAX ? UINT32_MAX : max_blocks),
                             &n) == 0)
            LOG_INFO("engine: saved %u KV blocks to %s", n, e->snapshot_path);
    }
    lora_registry_destroy(e->loras);
    engine__fwd_destroy(e->fwd);
    kv_pool_destroy(e->kv);
    pool_destroy(e->pool);
    tok_free(e->tok);
    model_close(e->m);
    free(e->running);
    free(e->waiting);
    free(e->btok);
    free(e->bseq);
    free(e->breq);
    free(e->bdraw);
    free(e->bsrow);
    free(e->fair);
    free(e->snapshot_path);
    free(e);
}

/* ---- adapters ------------------------------------------------------------------------------ */

int engine_load_adapter(struct engine *e, const char *name, const char *dir)
{
    return lora_registry_load(e->loras, name, dir);
}

int engine_unload_adapter(struct engine *e, const char *name)
{
    return lora_registry_unload(e->loras, name);
}

/* ---- submission ---------------------------------------------------------------------------- */

/* Blocks that `tokens` positions of a request take (in both of its sequences when the
 * sliding layers are kept apart: before any release, an upper bound). */
static uint32_t blocks_for(const struct engine *e, uint64_t tokens)
{
    uint32_t B = kv_pool_config(e->kv)->block_tokens;
    uint64_t n = (tokens + B - 1) / B * (e->split ? 2 : 1);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int engine_submit(struct engine *e, const struct engine_request *req, uint64_t *id)
{
    const struct iebin_hparams *hp = &e->m->hp;
    if (!req->prompt || req->n_prompt == 0) {
        LOG_ERR("engine: request has an empty prompt");
        return ERR_RANGE;
    }
    if (req->n_prompt >= hp->max_seq_len) {
        LOG_ERR("engine: prompt of %zu tokens leaves no room in the context of %u", req->n_prompt,
                hp->max_seq_len);
        return ERR_RANGE;
    }
    for (size_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || (uint32_t)req->prompt[i] >= hp->vocab_size) {
            LOG_ERR("engine: prompt token %zu: id %d is outside the vocabulary of %u", i,
                    (int)req->prompt[i], hp->vocab_size);
            return ERR_RANGE;
        }
    if (req->priority < ENGINE_PRIO_HIGH || req->priority > ENGINE_PRIO_LOW) {
        LOG_ERR("engine: priority %d is not high, normal or low", (int)req->priority);
        return ERR_RANGE;
    }
    if (req->n_stop && !e->tok) {
        LOG_ERR("engine: stop strings need a tokenizer and the model has none");
        return ERR_UNSUPPORTED;
    }
    if (req->max_new == 0) {
        LOG_ERR("engine: max_new is 0: a request generates at least one token");
        return ERR_RANGE;
    }
    if (!isfinite(req->adapter_scale)) {
        LOG_ERR("engine: adapter_scale is not finite");
        return ERR_RANGE;
    }
    struct kv_metrics km;
    kv_pool_metrics(e->kv, &km);
    if (blocks_for(e, req->n_prompt + 1) > km.blocks_total) {
        LOG_ERR("engine: prompt of %zu tokens needs %u KV blocks, the pool holds %llu",
                req->n_prompt, blocks_for(e, req->n_prompt + 1),
                (unsigned long long)km.blocks_total);
        return ERR_RANGE;
    }
    /* max_queue bounds the requests waiting beyond the free running slots: a burst that
     * arrives between two steps sits in waiting until the next admit, yet it will run
     * (issue 16 "Also found"). n_running + n_waiting <= max_running + max_queue, so waiting
     * (cap_waiting) holds every preempted request too. */
    size_t free_running = e->cfg.max_running - e->n_running;
    if (e->n_waiting >= e->cfg.max_queue + free_running) {
        LOG_WARN("engine: overloaded: %zu requests are waiting, %zu running (max_queue %u "
                 "beyond max_running %u)", e->n_waiting, e->n_running, e->cfg.max_queue,
                 e->cfg.max_running);
        return ERR_OVERLOADED;
    }
    struct sampler_params sp = {
        .temperature = req->temperature,
        .top_k = req->top_k,
        .top_p = req->top_p,
        .min_p = req->min_p,
        .repeat_penalty = req->repeat_penalty,
        .repeat_window = req->repeat_window,
        .seed = req->seed,
    };
    struct ereq *r = calloc(1, sizeof *r);
    if (!r) {
        LOG_ERR("engine: out of memory for a request");
        return -ENOMEM;
    }
    int rc;
    if ((rc = sampler_create(&sp, hp->vocab_size, &r->smp)))
        goto fail;
    if (req->adapter) {
        if ((rc = lora_registry_acquire(e->loras, req->adapter, &r->ad)))
            goto fail;
        float s = req->adapter_scale;
        r->adapter_key = fnv1a(r->ad->digest, &s, sizeof s) | 1; /* never 0 (the base) */
    }
    /* KV rows a batch-invariant request writes are the bits it would compute alone; rows of
     * other requests may not be, so the two kinds never share prefixes */
    if (req->batch_invariant)
        r->adapter_key ^= INV_KEY;
    if (req->n_stop) {
        if ((rc = sampler_stop_init(&r->stop, req->stop, req->n_stop)))
            goto fail;
        r->has_stop = true;
    }
    size_t max_total = (size_t)hp->max_seq_len;
    uint64_t want = (uint64_t)req->n_prompt + req->max_new;
    r->cap = want < max_total ? (size_t)want : max_total;
    r->tokens = malloc(r->cap * sizeof *r->tokens);
    if (e->tok) {
        r->text_cap = tok_stream_max_out(e->tok);
        r->text = malloc(r->text_cap ? r->text_cap : 1);
        tok_stream_init(&r->ts, e->tok);
        r->ts.at_start = false; /* continues the prompt's text */
    }
    if (!r->tokens || (e->tok && !r->text)) {
        LOG_ERR("engine: out of memory for a request of %zu tokens", r->cap);
        rc = -ENOMEM;
        goto fail;
    }
    memcpy(r->tokens, req->prompt, req->n_prompt * sizeof *r->tokens);
    r->n_prompt = r->n_tok = req->n_prompt;
    r->r = *req;
    r->r.prompt = r->tokens;
    r->r.stop = NULL; /* copied into r->stop */
    r->r.adapter = NULL;
    r->id = e->next_id++;
    r->arrival = e->next_arrival++;
    r->t_submit = mono_ns();
    e->waiting[e->n_waiting++] = r;
    if (e->n_running == 0 && e->pool)
        pool_wake(e->pool); /* idle until now: its threads wake while the caller gets to step */
    *id = r->id;
    return 0;
fail:
    req_free(r);
    return rc;
}

int engine_cancel(struct engine *e, uint64_t id)
{
    for (size_t i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) {
            finish(e, e->running[i], ENGINE_FINISH_CANCELLED);
            return 0;
        }
    for (size_t i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->id == id) {
            finish(e, e->waiting[i], ENGINE_FINISH_CANCELLED);
            return 0;
        }
    LOG_INFO("engine: cancel: no request %llu (finished already?)", (unsigned long long)id);
    return ERR_NOT_FOUND;
}

/* ---- scheduling ---------------------------------------------------------------------------- */

static size_t tenant_running(const struct engine *e, uint64_t tenant)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n_running; i++)
        n += e->running[i]->r.tenant == tenant;
    return n;
}

/* The next request to admit: highest priority, then the least served tenant, then oldest. */
static size_t pick_waiting(const struct engine *e)
{
    size_t best = 0, best_load = 0;
    for (size_t i = 0; i < e->n_waiting; i++) {
        const struct ereq *r = e->waiting[i];
        size_t load = tenant_running(e, r->r.tenant);
        if (i == 0) {
            best_load = load;
            continue;
        }
        const struct ereq *b = e->waiting[best];
        if (r->r.priority != b->r.priority) {
            if (r->r.priority < b->r.priority)
                best = i, best_load = load;
            continue;
        }
        if (load != best_load) {
            if (load < best_load)
                best = i, best_load = load;
            continue;
        }
        if (r->arrival < b->arrival)
            best = i, best_load = load;
    }
    return best;
}

/* The sliding sequence's prefix key: the request's, in a namespace of its own. */
#define KVW_KEY UINT64_C(0x736c6964696e6777)

/* Lets r's sliding sequence (the split one, or the only one when every layer slides) go of
 * the blocks no later query of r can see. A block shared with the prefix cache or another
 * sequence only loses r's reference (kv_seq_release_before). */
static void release_window(const struct engine *e, struct ereq *r)
{
    struct kv_seq *s = e->split ? r->kvw : e->slide_all ? r->kv : NULL;
    if (!s)
        return;
    uint32_t len = kv_seq_len(s);
    if (len + 1 > e->window)
        (void)kv_seq_release_before(s, len + 1 - e->window);
}

/*
 * Creates r's KV sequence(s) and attaches the longest cached prefix that both have (the
 * sliding one is attached up to what the full one found; if it found less, the full one is
 * attached again up to that). *n_cached: positions attached.
 */
static int attach(struct engine *e, struct ereq *r, uint32_t *n_cached)
{
    size_t limit = r->n_tok - 1; /* one token left to compute: its logits are needed */
    for (int round = 0; round < 2; round++) {
        int rc = kv_seq_create(e->kv, r->r.tenant, r->adapter_key, &r->kv);
        if (!rc)
            rc = kv_seq_attach_prefix(r->kv, r->tokens, limit, n_cached);
        if (!rc && e->split) {
            uint32_t nw = 0;
            if (!(rc = kv_seq_create(e->kv, r->r.tenant, r->adapter_key ^ KVW_KEY, &r->kvw)))
                rc = kv_seq_attach_prefix(r->kvw, r->tokens, *n_cached, &nw);
            if (!rc && nw < *n_cached) {
                req_kv_drop(r); /* the full sequence attached more: again, up to nw */
                limit = nw;
                continue;
            }
        }
        if (rc) {
            req_kv_drop(r);
            return rc;
        }
        release_window(e, r);
        return 0;
    }
    CHECK(!"the second attach finds the prefix the first one did");
    return ERR_STATE;
}

static int admit(struct engine *e)
{
    while (e->n_running < e->cfg.max_running && e->n_waiting > 0) {
        size_t i = pick_waiting(e);
        struct ereq *r = e->waiting[i];
        struct kv_metrics km;
        kv_pool_metrics(e->kv, &km);
        uint32_t need = blocks_for(e, (uint64_t)r->n_tok + 1);
        if (need > km.blocks_free + km.blocks_cached) {
            if (e->n_running > 0)
                return 0; /* waits for running requests to free blocks */
            fail(e, r, ERR_OVERLOADED, "the request no longer fits in the KV pool");
            continue;
        }
        uint32_t n_cached = 0;
        int rc = attach(e, r, &n_cached);
        if (rc)
            return rc;
        r->n_done = n_cached;
        if (!r->admitted_once) {
            r->cached_tokens = n_cached;
            r->t_admit = mono_ns();
        }
        r->admitted_once = true;
        r->admission = e->next_admission++;
        remove_from(e->waiting, &e->n_waiting, r);
        e->running[e->n_running++] = r;
    }
    return 0;
}

static int cmp_order(const void *a, const void *b)
{
    const struct ereq *x = *(struct ereq *const *)a, *y = *(struct ereq *const *)b;
    if (x->r.priority != y->r.priority)
        return x->r.priority < y->r.priority ? -1 : 1;
    return x->admission < y->admission ? -1 : x->admission > y->admission;
}

/* Back to waiting with every token it has; its blocks are freed. */
static void preempt(struct engine *e, struct ereq *r)
{
    req_kv_drop(r);
    r->n_done = 0;
    remove_from(e->running, &e->n_running, r);
    e->waiting[e->n_waiting++] = r; /* room: cap_waiting = max_queue + max_running */
    e->preemptions++;
}

/* The running request last in scheduling order that is not in the batch and is not r. */
static struct ereq *victim(struct engine *e, const struct ereq *r)
{
    for (size_t i = e->n_running; i-- > 0;) {
        struct ereq *v = e->running[i];
        if (v != r && !v->in_batch)
            return v;
    }
    return NULL;
}

/*
 * Reserves n rows for r, preempting others when needed. 1 = reserved, 0 = r must wait this
 * step (or was preempted / failed: r->kv is then NULL or r is gone), <0 = error.
 * *gone: r was finished (failed) and freed.
 */
static int reserve(struct engine *e, struct ereq *r, uint32_t n, size_t n_batch, bool *gone)
{
    *gone = false;
    for (;;) {
        /* a retry after a victim was preempted finds kv's reservation made (a no-op) */
        int rc = kv_seq_reserve(r->kv, n);
        if (rc == 0 && r->kvw)
            rc = kv_seq_reserve(r->kvw, n);
        if (rc == 0)
            return 1;
        if (rc != ERR_OVERLOADED)
            return rc;
        struct ereq *v = victim(e, r);
        if (v) {
            preempt(e, v);
            continue;
        }
        if (n_batch > 0)
            return 0; /* the batch's requests hold the blocks: wait for them */
        *gone = true;
        fail(e, r, ERR_OVERLOADED, "the KV pool is too small for this request to grow");
        return 0;
    }
}

/*
 * The draws of a step: every sequence with logits samples its row (and takes its log-
 * probabilities right after, while the sampler holds them), one task per row over the pool.
 * Each request's sampler, history and log-probability fields are its own, so the rows are
 * independent and each draw is what the serial loop drew; with 8 greedy streams the serial
 * loop was ~1.5% of a step on the engine's thread with the pool's other threads idle.
 */
struct sample_job {
    struct engine *e;
    const float *logits; /* [rows][vocab] */
};

static void sample_task(void *ctx, size_t row, int thread)
{
    (void)thread;
    const struct sample_job *j = ctx;
    const size_t i = j->e->bsrow[row];
    struct ereq *r = j->e->breq[i];
    const float *lg = j->logits + row * (size_t)j->e->m->hp.vocab_size;
    int32_t id = sampler_sample(r->smp, lg, r->tokens, r->n_tok);
    if (id >= 0 && r->r.logprobs)
        sampler_logprobs(r->smp, id, r->r.top_logprobs, &r->lp, r->lp_top, &r->lp_n);
    j->e->bdraw[i] = id;
}

/* Draws the rows of the step's n_seq sequences that have logits (bdraw[i]; the tap first). */
static void sample_rows(struct engine *e, const float *logits, size_t n_seq)
{
    size_t rows = 0;
    const size_t V = e->m->hp.vocab_size;
    for (size_t i = 0; i < n_seq; i++)
        if (e->bseq[i].logits) {
            struct ereq *r = e->breq[i];
            if (e->tap)
                e->tap(e->tap_ud, r->id, r->n_gen, logits + rows * V, V);
            e->bsrow[rows++] = i;
        }
    struct sample_job j = {e, logits};
    pool_run(e->pool, sample_task, &j, rows);
}

/* Emits r's draw of this step (sample_rows); may finish r. */
static void emit_draw(struct engine *e, struct ereq *r, int32_t id, uint64_t t)
{
    if (id < 0) { /* only this request's row: the others in the batch go on */
        fail(e, r, id, "non-finite logits: the model's weights or activations hold NaN/Inf");
        return;
    }
    if (r->n_gen == 0)
        r->t_first = t;
    r->t_last = t;
    if (!r->r.ignore_eos && is_stop_id(e, id)) {
        finish(e, r, ENGINE_FINISH_EOS);
        return;
    }
    r->tokens[r->n_tok++] = id;
    r->n_gen++;
    e->generated++;
    e->win_tokens++;
    const char *out = NULL;
    size_t n_out = 0;
    bool stopped = false;
    if (e->tok) {
        size_t n = 0;
        if (tok_stream_push(&r->ts, id, r->text, r->text_cap, &n) == 0) {
            out = r->text;
            n_out = n;
        }
        if (r->has_stop && sampler_stop_push(&r->stop, r->text, n_out, &out, &n_out, &stopped)) {
            fail(e, r, -ENOMEM, "out of memory matching stop strings");
            return;
        }
    }
    emit_text(e, r, id, out, n_out);
    if (stopped)
        finish(e, r, ENGINE_FINISH_STOP);
    else if (r->n_gen >= r->r.max_new)
        finish(e, r, ENGINE_FINISH_LENGTH);
    else if (r->n_tok >= e->m->hp.max_seq_len || r->n_tok >= r->cap)
        finish(e, r, ENGINE_FINISH_CONTEXT);
}

static void expire(struct engine *e, uint64_t t)
{
    for (size_t i = e->n_running; i-- > 0;) {
        struct ereq *r = e->running[i];
        if (r->r.deadline_ns && t >= r->r.deadline_ns)
            finish(e, r, ENGINE_FINISH_DEADLINE);
    }
    for (size_t i = e->n_waiting; i-- > 0;) {
        struct ereq *r = e->waiting[i];
        if (r->r.deadline_ns && t >= r->r.deadline_ns)
            finish(e, r, ENGINE_FINISH_DEADLINE);
    }
}

static struct fair_slot *fair_find(struct fair_slot *f, size_t n, const struct ereq *r)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].tenant == r->r.tenant && f[i].prio == (int)r->r.priority)
            return &f[i];
    return NULL;
}

static int cmp_demand(const void *a, const void *b)
{
    const struct fair_slot *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio < y->prio ? -1 : 1;
    return (x->demand > y->demand) - (x->demand < y->demand);
}

/*
 * Splits the step's remaining prefill budget between tenants (deficit round robin with a
 * token quantum, which for divisible work is water-filling): priority levels in order, and
 * within a level each tenant with pending prefill gets an equal share, a tenant needing less
 * leaving the rest to the others. So one tenant's many or long prompts cannot hold back
 * another tenant's prompt for more than its share. Returns the number of slots.
 */
static size_t fair_shares(struct engine *e, size_t budget)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n_running; i++) {
        const struct ereq *r = e->running[i];
        uint32_t pending = (uint32_t)(r->n_tok - r->n_done);
        if (r->in_batch || pending <= 1)
            continue;
        struct fair_slot *f = fair_find(e->fair, n, r);
        if (!f) {
            f = &e->fair[n++]; /* n <= n_running <= max_running */
            *f = (struct fair_slot){.tenant = r->r.tenant, .prio = (int)r->r.priority};
        }
        f->demand += pending;
    }
    qsort(e->fair, n, sizeof *e->fair, cmp_demand);
    for (size_t i = 0; i < n;) {
        size_t j = i; /* [i, j): one priority level, by increasing demand */
        while (j < n && e->fair[j].prio == e->fair[i].prio)
            j++;
        for (size_t k = i; k < j; k++) {
            size_t share = (budget + (j - k) - 1) / (j - k); /* the last takes what is left */
            if (share > e->fair[k].demand)
                share = (size_t)e->fair[k].demand;
            e->fair[k].left = (uint32_t)share;
            budget -= share;
        }
        i = j;
    }
    return n;
}

/* Fills the step's tables from the scheduled requests e->breq[0..n_seq) (their counts in
 * bseq[i].n), ordered so that rows of one adapter are adjacent (one LoRA segment each). */
static size_t fill_batch(struct engine *e, size_t n_seq)
{
    /* stable insertion sort by adapter key: n_seq <= max_running, and usually one key */
    for (size_t i = 1; i < n_seq; i++) {
        struct ereq *r = e->breq[i];
        uint32_t n = e->bseq[i].n;
        size_t j = i;
        for (; j > 0 && e->breq[j - 1]->adapter_key > r->adapter_key; j--) {
            e->breq[j] = e->breq[j - 1];
            e->bseq[j].n = e->bseq[j - 1].n;
        }
        e->breq[j] = r;
        e->bseq[j].n = n;
    }
    size_t n_tok = 0;
    for (size_t i = 0; i < n_seq; i++) {
        struct ereq *r = e->breq[i];
        struct engine__bseq *b = &e->bseq[i];
        b->kv = r->kv;
        b->kvw = r->kvw;
        b->pos0 = r->n_done;
        b->t0 = n_tok;
        b->logits = r->n_done + b->n == r->n_tok;
        b->ad = e->lora_bypass ? NULL : r->ad;
        b->scale = r->r.adapter_scale;
        b->invariant = r->r.batch_invariant;
        memcpy(e->btok + n_tok, r->tokens + r->n_done, b->n * sizeof *e->btok);
        n_tok += b->n;
    }
    return n_tok;
}

int engine_step(struct engine *e, size_t *active)
{
    uint64_t t = mono_ns();
    int rc = 0;
    expire(e, t);
    if ((rc = admit(e)))
        goto out;

    /* order: priority then admission; preemption victims come from the end */
    qsort(e->running, e->n_running, sizeof *e->running, cmp_order);
    size_t n_seq = 0, n_tok = 0, budget = e->cfg.max_step_tokens, n_fair = 0;
    for (int pass = 0; pass < 3; pass++) {
        /* pass 0: decode tokens (one pending); pass 1: prefill chunks within each tenant's
         * fair share (fair_shares); pass 2: prefill chunks of requests not yet in the batch
         * with whatever budget is left (a share a skipped request did not use). The list may
         * shrink (preemption) while it is walked: restart the walk after each change. */
        if (pass == 1)
            n_fair = fair_shares(e, budget - n_tok);
        for (size_t i = 0; i < e->n_running && n_tok < budget;) {
            struct ereq *r = e->running[i];
            uint32_t pending = (uint32_t)(r->n_tok - r->n_done);
            bool decode = pending == 1;
            struct fair_slot *fs = pass == 1 ? fair_find(e->fair, n_fair, r) : NULL;
            if (r->in_batch || decode != (pass == 0) || (pass == 1 && (!fs || !fs->left))) {
                i++;
                continue;
            }
            uint32_t n = pending;
            if (n > budget - n_tok)
                n = (uint32_t)(budget - n_tok);
            if (fs && n > fs->left)
                n = fs->left;
            size_t before = e->n_running;
            bool gone;
            int got = reserve(e, r, n, n_seq, &gone);
            if (got < 0) {
                rc = got;
                goto out;
            }
            if (got == 1) {
                e->breq[n_seq] = r;
                e->bseq[n_seq++].n = n;
                r->in_batch = true;
                n_tok += n;
                if (fs)
                    fs->left -= n;
            }
            if (gone || e->n_running != before)
                i = 0; /* the list changed */
            else
                i++;
        }
    }

    if (n_seq > 0) {
        CHECK(fill_batch(e, n_seq) == n_tok);
        const float *logits;
        if ((rc = engine__fwd_run(e->fwd, e->btok, n_tok, e->bseq, n_seq, &logits)))
            goto out;
        uint64_t t1 = mono_ns();
        sample_rows(e, logits, n_seq);
        for (size_t i = 0; i < n_seq; i++) {
            struct ereq *r = e->breq[i];
            const struct engine__bseq *b = &e->bseq[i];
            r->in_batch = false;
            if ((rc = kv_seq_commit(r->kv, r->tokens + b->pos0, b->n)) ||
                (r->kvw && (rc = kv_seq_commit(r->kvw, r->tokens + b->pos0, b->n))))
                goto out;
            release_window(e, r);
            r->n_done += b->n;
            bool decode = b->n == 1 && b->logits && b->pos0 >= r->n_prompt;
            if (!decode)
                e->prefilled += b->n;
            if (b->logits)
                emit_draw(e, r, e->bdraw[i], t1);
        }
    }
out:
    for (size_t i = 0; i < e->n_running; i++)
        e->running[i]->in_batch = false;
    uint64_t t2 = mono_ns();
    if (t2 - e->win_start_ns >= TPS_WINDOW_NS) {
        e->tps = (double)e->win_tokens * 1e9 / (double)(t2 - e->win_start_ns);
        e->win_start_ns = t2;
        e->win_tokens = 0;
    }
    *active = e->n_running + e->n_waiting;
    return rc;
}

/* ---- metrics ------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void percentiles(const double *ring, size_t n, double *p50, double *p95)
{
    double tmp[STATS_RING];
    if (n == 0) {
        *p50 = *p95 = 0;
        return;
    }
    memcpy(tmp, ring, n * sizeof *tmp);
    qsort(tmp, n, sizeof *tmp, cmp_double);
    *p50 = tmp[(n - 1) * 50 / 100];
    *p95 = tmp[(n - 1) * 95 / 100];
}

const struct model *engine_model(const struct engine *e) { return e->m; }

void engine_get_metrics(const struct engine *e, struct engine_metrics *m)
{
    struct kv_metrics km;
    kv_pool_metrics(e->kv, &km);
    memset(m, 0, sizeof *m);
    m->running = (uint32_t)e->n_running;
    m->waiting = (uint32_t)e->n_waiting;
    m->kv_blocks_total = km.blocks_total;
    m->kv_blocks_used = km.blocks_used;
    m->kv_blocks_free = km.blocks_free;
    m->kv_blocks_cached = km.blocks_cached;
    m->kv_window_releases = km.window_releases;
    m->prefix_hit_tokens = km.hit_tokens;
    m->prefix_miss_tokens = km.miss_tokens;
    m->preemptions = e->preemptions;
    m->requests_finished = e->finished;
    m->tokens_generated = e->generated;
    m->tokens_prefilled = e->prefilled;
    uint64_t t = mono_ns();
    m->tokens_per_s = e->tps;
    if (e->tps == 0 && t > e->win_start_ns)
        m->tokens_per_s = (double)e->win_tokens * 1e9 / (double)(t - e->win_start_ns);
    size_t n = e->n_stats < STATS_RING ? e->n_stats : STATS_RING;
    percentiles(e->ttft, n, &m->ttft_p50_ms, &m->ttft_p95_ms);
    percentiles(e->tpot, n, &m->tpot_p50_ms, &m->tpot_p95_ms);
    percentiles(e->e2e, n, &m->e2e_p50_ms, &m->e2e_p95_ms);
}

void engine__set_logits_tap(struct engine *e, engine__logits_fn *fn, void *ud)
{
    e->tap = fn;
    e->tap_ud = ud;
}

struct kv_pool *engine__kv(struct engine *e) { return e->kv; }

void engine__set_lora_bypass(struct engine *e, bool off) { e->lora_bypass = off; }

/* ---- single shot --------------------------------------------------------------------------- */

int engine_generate(struct engine *e, const struct engine_request *req, int32_t **ids,
                    size_t *n_ids, struct engine_event *fin)
{
    struct collect c = {0};
    uint64_t id;
    int rc = engine_submit(e, req, &id);
    if (rc)
        return rc;
    e->waiting[e->n_waiting - 1]->collect = &c;
    while (!c.done) {
        size_t active;
        if ((rc = engine_step(e, &active)))
            break;
    }
    if (!c.done) {
        /* a step failed: take the request out (it may still be listed) */
        engine_cancel(e, id);
    }
    if (rc == 0 && c.err)
        rc = c.err;
    if (rc) {
        free(c.ids);
        return rc;
    }
    *ids = c.ids;
    *n_ids = c.n;
    if (fin)
        *fin = c.finish;
    return 0;
}
