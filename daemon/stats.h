/*
 * stats.h — clocherd's counters, gauges and histograms: the contract between the gateway
 * (daemon/gw*.c, which records what its calls did) and the metrics endpoint (daemon/metrics.c,
 * which renders them in Prometheus text format on the libuv loop).
 *
 * NOTES
 *  - Writers are the gateway's threads, the readers the metrics endpoint and the gateway's
 *    GetMetrics call (both through stats_render): every value is an
 *    independent relaxed atomic. A scrape is a snapshot of independent series; no ordering
 *    between two series is promised (Prometheus does not need one), and a histogram's count
 *    may run one observation ahead of its buckets during a scrape.
 *  - Tenants are labels. Names are interned on first use into a fixed table of
 *    STATS_MAX_TENANTS under a mutex (the only lock, taken once per new name); beyond the
 *    table, counts go to the tenant "_other" so a flood of names cannot grow memory.
 *    Anonymous access (no tenants configured) is the tenant "" rendered as "anonymous".
 *  - Per-worker series (engine figures from the worker's STATS record: KV blocks, prefix
 *    hits, running/waiting, RSS) are replaced whole by stats_worker_engine(); their slot index
 *    matches struct workers. Supervisor-owned series (state, given up, generation, restarts,
 *    hot replication, ready slots, the daemon's phase) are not kept here: stats_render reads
 *    them from the struct workers it is passed, at render time.
 *  - Ownership: clocherd's main.c creates the struct stats (one per daemon) and lends it to
 *    the gateway and the metrics endpoint as w->stats. This module reads struct workers and
 *    calls nothing that calls it back (daemon/workers.c does not know it).
 *  - Adapters are labels too (clocher_adapter_*_total{adapter}), interned like tenants into
 *    STATS_MAX_ADAPTERS; they mix tenants, so stats_render_for a single tenant omits them.
 *  - Inter-token gaps (stats_track) are kept per worker request in a direct-mapped table of
 *    STATS_TRACK_PER_SLOT entries per slot, written only by the slot's reader thread.
 *  - Histogram buckets are fixed (seconds): 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30
 *    60 +Inf; one set per (series, tenant).
 */
#ifndef CLOCHER_DAEMON_STATS_H
#define CLOCHER_DAEMON_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STATS_MAX_TENANTS 64
#define STATS_MAX_ADAPTERS 64     /* adapter labels; beyond, "_other" */
#define STATS_TRACK_PER_SLOT 4096 /* requests tracked per worker slot for inter-token gaps */
#define STATS_HIST_BUCKETS 14 /* including +Inf */

struct stats;
struct workers;
struct shm_msg_stats; /* shm/msg.h */
struct shm_msg_finish;
struct shm_msg;

/* n_workers: the size of the worker table (per-worker series). */
int stats_create(size_t n_workers, struct stats **out);
void stats_destroy(struct stats *s); /* NULL is a no-op */

/* One finished RPC: clocher_requests_total{method, status, tenant}. `method` is the short
 * gRPC method name ("Generate", "BatchGenerate", "Tokenize", ..., "Health.Check");
 * grpc_status is the grpc_status_code it ended with (0 = OK). */
void stats_request(struct stats *s, const char *tenant, const char *method, int grpc_status);

/* One finished generation (a Generate call, or one item of a BatchGenerate), as the worker's
 * FINISH record reports it: clocher_{prompt,completion,cached}_tokens_total{tenant} and the
 * clocher_{ttft,tpot,e2e}_seconds{tenant} histograms (a 0 ns figure is not observed, e.g. TPOT
 * of a one-token reply). */
void stats_generation(struct stats *s, const char *tenant, uint64_t prompt_tokens,
                      uint64_t completion_tokens, uint64_t cached_tokens, uint64_t ttft_ns,
                      uint64_t tpot_ns, uint64_t e2e_ns);

/* One finished generation with what the gateway knows of it (its call's tenant, its adapter,
 * "" = base): stats_generation's series, plus clocher_queue_seconds{tenant} (FINISH's
 * queue_ns), clocher_adapter_{generations,prompt_tokens,completion_tokens}_total{adapter}
 * ("_base" for the base model; "_other" past STATS_MAX_ADAPTERS) and a line of the access log
 * when one is open. Called instead of stats_generation by the gateway on each FINISH. */
void stats_finish(struct stats *s, const char *tenant, const char *adapter,
                  const struct shm_msg_finish *f);

/* Opens the access log at `path` (daemon/accesslog.h; the config key `access_log`), closing
 * the one open before; NULL closes it. 0, or the open's negative code (logged) and the old log
 * stays. Safe while requests finish (a SIGHUP reopens a rotated file this way). */
int stats_open_access_log(struct stats *s, const char *path);

/*
 * One record of worker slot `slot`'s event ring, seen by the slot's gateway reader at now_ns
 * (mono_ns): a TOKEN carrying a generated id observes the gap since the request's previous
 * token into clocher_itl_seconds (vllm:inter_token_latency_seconds: per token, not a
 * per-request mean; the first token is TTFT and observes nothing); FINISH, ERROR and DONE
 * forget the request. Other records are ignored. Only the slot's reader thread calls it for
 * that slot (its requests' entries have one writer). Gaps are measured where the gateway
 * receives tokens, so they include the ring's hand-over, as a client would see them.
 */
void stats_track(struct stats *s, unsigned slot, const struct shm_msg *m, uint64_t now_ns);

/* Whether worker request `request_id` of slot `slot` has produced a token (running) or not
 * yet (waiting): 1 or 0; -1 when stats_track never saw a token (no reader feeds it), so the
 * caller cannot tell. Racy by nature (a gauge): the answer may be a moment old. */
int stats_started(const struct stats *s, unsigned slot, uint64_t request_id);

/* Gauges kept by the gateway: generations waiting for a worker slot in the gateway's bounded
 * queue (clocher_queue_depth) and streams in flight (clocher_active_streams{tenant}). */
void stats_queue_depth_add(struct stats *s, int64_t delta);
void stats_active_streams_add(struct stats *s, const char *tenant, int64_t delta);

/* A request refused by the tenant quota `limit` ("requests_per_s", "tokens_per_min",
 * "max_prompt_bytes", "max_queued"): clocher_throttled_total{tenant, limit}. */
void stats_throttled(struct stats *s, const char *tenant, const char *limit);
/* A stream reset by its client before any answer (clocher_early_resets_total); closed: its
 * connection was closed for it (clocher_connections_closed_total). */
void stats_early_reset(struct stats *s, bool closed);
/* A call refused by a daemon-wide cap, before any tenant is known: limit is "max_calls" or
 * "max_connections" (clocher_global_refusals_total{limit}; any other name is ignored). */
void stats_global_refusal(struct stats *s, const char *limit);

/* The latest STATS record of worker `slot` (replaces the previous one): clocher_kv_blocks
 * {worker,node,state=used|cached|free}, clocher_prefix_{hit,miss}_tokens_total{worker},
 * clocher_preemptions_total, clocher_running/waiting_sequences, clocher_worker_rss_bytes. */
void stats_worker_engine(struct stats *s, unsigned slot, const struct shm_msg_stats *m);

/* Renders everything in Prometheus text exposition format 0.0.4 (HELP and TYPE lines, label
 * values escaped) into a malloc'd buffer (*out, *len; the caller frees). `w` supplies the
 * supervisor's per-worker series (state, restarts, hot replicated bytes, node labels); it may
 * be NULL. Returns 0 or -ENOMEM. */
int stats_render(const struct stats *s, const struct workers *w, char **out, size_t *len);
/* The same, with the per-tenant series of tenant `only` alone ("" = anonymous; NULL = every
 * tenant, as stats_render): what GetMetrics shows a tenant that is not an admin. The
 * per-worker and supervisor series carry no tenant and are shown whole. */
int stats_render_for(const struct stats *s, const struct workers *w, const char *only,
                     char **out, size_t *len);

#endif
