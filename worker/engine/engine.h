/*
 * engine.h — the serving engine: continuous batching over one model, paged KV cache with
 * prefix reuse, per-request LoRA adapters. The in-process heart of each worker; usable
 * without the daemon (inference-engine uses it).
 *
 * Threading contract: an engine is owned by ONE thread (the worker's loop); every engine_*
 * call must come from it. engine_step() uses the engine's thread pool internally and returns
 * when the iteration is complete. Events are delivered through the callback given at
 * creation, from inside engine_step()/engine_cancel(), on the owner thread; a callback must
 * not call engine_* functions (the engine is walking its lists).
 *
 * Events of one request: TOKEN for every generated token (token = id, text = the completed
 * UTF-8 text it adds, "" while a character or a possible stop string is incomplete; the
 * end-of-sequence token itself is not emitted); at the end, possibly one TOKEN with token -1
 * carrying text held back until then; on failure an ERROR (code, message); always exactly one
 * FINISH last. A preempted request is recomputed later without re-emitting anything.
 * docs/ENGINE.md describes the scheduler.
 */
#ifndef CLOCHER_WORKER_ENGINE_H
#define CLOCHER_WORKER_ENGINE_H

#include "dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum engine_priority { ENGINE_PRIO_HIGH = 0, ENGINE_PRIO_NORMAL = 1, ENGINE_PRIO_LOW = 2 };

enum engine_finish {
    ENGINE_FINISH_EOS = 1,      /* the model produced an end-of-sequence id: the tokenizer's
                                 * EOS or one of chat.ie.json's eos_token_ids (docs/CHAT.md) */
    ENGINE_FINISH_LENGTH,       /* max_new tokens reached */
    ENGINE_FINISH_STOP,         /* a stop string matched */
    ENGINE_FINISH_CANCELLED,    /* engine_cancel() */
    ENGINE_FINISH_DEADLINE,     /* the request's deadline passed */
    ENGINE_FINISH_CONTEXT,      /* the model's context length was reached */
    ENGINE_FINISH_ERROR,        /* see the event's code/message */
};

struct engine_config {
    const char *model_dir;
    int n_threads;              /* 0 = all online CPUs */
    const char *pin;            /* NULL, "compact" or "scatter" */
    uint64_t kv_budget_bytes;   /* 0 = a default fraction of RAM */
    enum dtype kv_dtype;        /* the KV cache's elements (dtype_kv_from_name): DT_F32, DT_F16,
                                 * DT_BF16, DT_KV_I8 (int8 codes) or DT_KV_E4M3 (fp8), the 8-bit
                                 * ones with an f32 scale per head and row (docs/KV.md) */
    uint32_t kv_block_tokens;   /* 0 = 16 */
    uint32_t max_step_tokens;   /* per-iteration token budget (decode + prefill chunks); 0 = 256 */
    uint32_t max_running;       /* sequences in the running batch (<= max_step_tokens); 0 = 16 */
    uint32_t max_queue;         /* requests waiting beyond the free running slots, beyond
                                 * which submit fails: ERR_OVERLOADED; 0 = 256 */
    bool prefix_cache;
    const char *snapshot_path;  /* NULL: no KV snapshot save/restore */
    uint64_t snapshot_max_bytes; /* KV data the save at engine_destroy keeps at most (its
                                  * hottest blocks); 0 = the whole pool */
    int lora_pack;              /* enum lora_pack (lora.h): how adapters' weights are packed
                                 * for the update; 0 = auto (as the file stores them) */
};

struct engine_request {
    const int32_t *prompt;      /* [n_prompt] token ids (BOS included if wanted) */
    size_t n_prompt;
    uint32_t max_new;
    /* sampling: temperature 0 = greedy; top_k 0 = off; top_p 1 = off; min_p 0 = off;
     * repeat_penalty 1 = off (over the last repeat_window tokens); same seed, same output */
    float temperature, top_p, min_p, repeat_penalty;
    uint32_t top_k, repeat_window;
    uint64_t seed;
    const char *const *stop;    /* [n_stop] stop strings */
    size_t n_stop;
    uint64_t tenant;            /* prefix reuse and fairness are per tenant */
    const char *adapter;        /* NULL = base model */
    float adapter_scale;
    enum engine_priority priority;
    uint64_t deadline_ns;       /* CLOCK_MONOTONIC; 0 = none */
    void *user;                 /* returned in events */
    bool ignore_eos;            /* keep generating after an end-of-sequence id */
    bool logprobs;              /* each TOKEN event carries its log-probability ... */
    uint32_t top_logprobs;      /* ... and this many alternatives' (sampler_logprobs: capped
                                 * at SAMPLER_MAX_TOP_LOGPROBS) */
    bool batch_invariant;       /* the same tokens for the same seed whatever else shares the
                                 * steps: every step it is in runs batch-invariant products
                                 * (slower for every sequence of the step), and its prompt
                                 * reuses only prefixes computed that way (docs/DESIGN.md
                                 * "Batch invariance") */
};

enum engine_event_kind { ENGINE_EV_TOKEN = 1, ENGINE_EV_FINISH, ENGINE_EV_ERROR };

struct engine_event {
    enum engine_event_kind kind;
    uint64_t id;
    void *user;
    int32_t token;              /* TOKEN */
    const char *text;           /* TOKEN: completed UTF-8 text (may be ""), not NUL-owned */
    size_t text_len;
    /* TOKEN of a request with logprobs (a generated token, not the text-only one) */
    bool has_logprob;
    float logprob;
    uint32_t n_top;
    const struct sampler_logprob *top; /* [n_top], most likely first (sampler.h) */
    enum engine_finish reason;  /* FINISH */
    int code;                   /* ERROR: negative code */
    const char *message;        /* ERROR */
    /* FINISH: usage and timings */
    uint32_t prompt_tokens, generated_tokens, cached_tokens;
    double ttft_ms, tpot_ms, e2e_ms;
    double queue_ms;            /* FINISH: submit -> first admission (never admitted: e2e) */
};

struct sampler_logprob;
typedef void engine_event_fn(const struct engine_event *ev, void *ud);

struct engine;
struct model;
int engine_create(const struct engine_config *cfg, engine_event_fn *on_event, void *ud,
                  struct engine **out);
void engine_destroy(struct engine *e);
int engine_submit(struct engine *e, const struct engine_request *req, uint64_t *id);
/* One scheduler iteration; *active = running + waiting afterwards. */
int engine_step(struct engine *e, size_t *active);
int engine_cancel(struct engine *e, uint64_t id);
int engine_load_adapter(struct engine *e, const char *name, const char *dir);

/*
 * Installs (fn != NULL) or removes a progress callback, called by the thread inside
 * engine_step() before each layer of the forward pass (so at least every 1/n_layers of a
 * step). It is where a serving loop keeps its liveness signals fresh while one long step
 * (a big prefill chunk on a loaded machine) runs: progress per layer still proves the worker
 * is not hung, which a timer thread would not. fn must be quick and must not call the engine.
 */
typedef void engine_progress_fn(void *ud);
void engine_set_progress(struct engine *e, engine_progress_fn *fn, void *ud);
int engine_unload_adapter(struct engine *e, const char *name);

struct engine_metrics {
    uint32_t running, waiting;
    uint64_t kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached;
    uint64_t prefix_hit_tokens, prefix_miss_tokens, preemptions;
    uint64_t kv_window_releases;    /* sliding-layer blocks let go (docs/KV.md "Sliding layers") */
    uint64_t requests_finished, tokens_generated, tokens_prefilled;
    double tokens_per_s;            /* generated tokens per second over the last window */
    double ttft_p50_ms, ttft_p95_ms, tpot_p50_ms, tpot_p95_ms, e2e_p50_ms, e2e_p95_ms;
};
void engine_get_metrics(const struct engine *e, struct engine_metrics *m);

/* The engine's loaded model (read-only; valid until engine_destroy). Hot replication asks it
 * which tensors the forward pass reads. */
const struct model *engine_model(const struct engine *e);

/* single-shot: submit, step until finished */
int engine_generate(struct engine *e, const struct engine_request *req, int32_t **ids,
                    size_t *n_ids, struct engine_event *finish);
#endif
