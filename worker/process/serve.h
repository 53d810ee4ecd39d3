/*
 * serve.h — a worker's serving loop: the engine on one side, the worker's end of its
 * shared-memory region (shm/region.h) on the other. clocher-worker (worker_main.c) runs it
 * after placing the process; tests run it in a thread against a region they create.
 *
 * Requests ring → engine:
 *   GENERATE      text prompts are tokenized here (the model's tokenizer.ie.json), prompts
 *                 checked against max_prompt_tokens and the vocabulary, then engine_submit;
 *                 the events come back as TOKEN records and one FINISH, or one ERROR
 *   CANCEL        engine_cancel (an unknown id is ignored: the request has already ended)
 *   TOKENIZE      → TOKENS        DETOKENIZE → TEXT
 *   ADAPTER_LOAD  → ADAPTER (rank, alpha, targets from adapter_config.json)
 *   ADAPTER_UNLOAD → DONE         STATS_QUERY → STATS (engine metrics + RSS)
 * Any request that fails gets one ERROR record with its request id, a negative code and a
 * message naming what is wrong (ERR_RANGE "prompt: 5000 tokens, the limit is 4096", ...).
 * After attach the worker sends one HELLO (model name, architecture, dtype, sizes).
 *
 * Liveness: the region's heartbeat is given at every loop turn and ring wait; the control
 * socket (shm/heritage.h, HERITAGE_CTL_KEYS) gets READY=1 once, then WATCHDOG=1 about once a
 * second, including while a full event ring makes the loop wait for the gateway.
 *
 * NOTES: single-threaded: the calling thread owns the engine (engine.h) and both ring ends of
 * the worker side. `stop` is read at every loop turn (a signal handler sets it). The engine is
 * assumed to copy what engine_submit is given (prompt, stop strings, adapter name): the record
 * buffer they point into is reused for the next record.
 */
#ifndef CLOCHER_WORKER_SERVE_H
#define CLOCHER_WORKER_SERVE_H

#include "dtype.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

struct shm_region;

struct serve_options {
    const char *model_dir;
    unsigned threads;             /* 0 = every CPU this thread may run on */
    const char *pin;              /* engine threads: "none", "compact" or "scatter"; NULL =
                                   * none (serve_pin_prepare's choice is applied) */
    uint64_t kv_budget_bytes;     /* 0 = the engine's default */
    enum dtype kv_dtype;          /* the KV cache's elements (engine_config.kv_dtype; the
                                   * heritage's --kv-dtype); 0 = DT_F32 */
    uint32_t max_queue;
    uint32_t max_prompt_tokens;
    const char *kv_snapshot_path; /* engine_config.snapshot_path: restored at open, saved at
                                   * close; NULL = none */
    uint64_t kv_snapshot_max_bytes; /* KV data a save keeps at most; 0 = the whole pool */
    size_t n_adapters;            /* loaded at start; a failure is fatal */
    const char *const *adapter_names;
    const char *const *adapter_dirs;
    int lora_pack;                /* enum lora_pack (lora.h), engine_config.lora_pack */
    int mem_node;                 /* hot replication target; -1 = the thread's policy */
    int hot_replicate;            /* IE_HOT_REPLICATE */
    uint64_t hot_limit_bytes;     /* 0 = no limit */
    int control_fd;               /* -1 = no supervisor (tests) */
    const volatile sig_atomic_t *stop;
};

struct serve;

/*
 * Readies this thread for pinning `threads` engine threads (0 = one per CPU of its affinity
 * mask) the `pin` way, before the engine's pool is made from it: "compact" keeps them within
 * one NUMA node (libnuma) when that node has enough CPUs of the mask, by narrowing this
 * thread's mask to the node's CPUs (the pool's threads inherit it). Returns the mode to give
 * the engine: `pin`, or "none" (logged once) when the threads outnumber the CPUs the thread
 * may use — pinning them would stack participants on one CPU. NULL pin = "none".
 */
const char *serve_pin_prepare(unsigned threads, const char *pin);

/*
 * Creates the engine, loads the adapters, replicates hot tensors, sends HELLO on `region`
 * (worker side, attached; the serve does not own it). 0 and *out, or a negative code (logged):
 * -ENOMEM, or any other code for a model, adapter or configuration that does not load (the
 * caller exits 2 for those: respawning cannot help).
 */
int serve_open(const struct serve_options *o, struct shm_region *region, struct serve **out);

/*
 * Announces READY (region state and control socket), then serves until *stop: returns 0.
 * On SIGTERM in-flight requests are cancelled (each gets its FINISH CANCELLED) before it
 * returns. A ring that breaks, a gateway that is gone or a control socket that closes end the
 * loop with a negative code (logged): the worker exits and is respawned with a fresh region.
 */
int serve_run(struct serve *s);

/* Bytes of hot tensors serve_open replicated. */
uint64_t serve_hot_bytes(const struct serve *s);

/* Destroys the engine. NULL is a no-op. */
void serve_close(struct serve *s);

#endif
