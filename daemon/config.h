/*
 * config.h — clocherd's configuration: one JSON file (docs/DAEMON.md, "Configuration";
 * example: systemd/clocherd.json), parsed and validated completely before anything uses it.
 *
 * Every field is checked for type and range, unknown keys are rejected (a typo must not
 * silently fall back to a default), and each failure is logged once naming the file and the
 * field's path ("clocherd.json: limits.max_tokens: must be an integer in 1..1048576, got 0").
 * Relative paths in the file are resolved against the file's own directory.
 *
 * Reload (SIGHUP) builds a fresh struct config from the file; an invalid file is refused and the
 * running one kept. Fields that only take effect at start (listeners, TLS, model, workers,
 * threads, KV budget, hot replication, worker binary) are copied over from the running config
 * with a warning when the file changed them (config_keep_restart_fields), so a snapshot always
 * describes what is really in effect.
 *
 * NOTES: a struct config is immutable once parsed and shared between the supervisor (libuv loop
 * thread) and the gateway threads through a refcount. Readers take a reference with
 * config_ptr_get() for as long as they use it (a call keeps the snapshot it started with); the
 * supervisor swaps in a new one with config_ptr_set(). The holder is a mutex, not a bare atomic
 * pointer, because "load the pointer, then increment its count" would race with the last unref.
 */
#ifndef CLOCHER_DAEMON_CONFIG_H
#define CLOCHER_DAEMON_CONFIG_H

#include "dtype.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONFIG_MAGIC 0x43464731u /* "CFG1" */
#define CONFIG_NAME_MAX 64       /* tenant and adapter names: 1..63 of [A-Za-z0-9_.-] */
#define CONFIG_MAX_WORKERS 256
#define CONFIG_FILE_MAX (4u << 20) /* bytes; larger files are refused unread */

/* An API key as written in the file: "sha256:<64 hex digits>" is the SHA-256 of the key the
 * client sends (what production configs should hold); any other string is the key itself. */
enum config_key_kind { CONFIG_KEY_PLAIN = 1, CONFIG_KEY_SHA256 = 2 };

struct config_key {
    enum config_key_kind kind;
    uint8_t sha256[32];  /* CONFIG_KEY_SHA256 */
    char *plain;         /* CONFIG_KEY_PLAIN: NUL-terminated, 8..256 printable ASCII, no spaces */
};

struct config_tenant {
    char *name;
    size_t n_keys;
    struct config_key *keys;       /* [n_keys], at least one */
    bool all_adapters;             /* "allowed_adapters": "*" */
    size_t n_allowed;
    char **allowed_adapters;       /* [n_allowed] adapter names (may be loaded at run time) */
    uint32_t max_concurrent_streams; /* 0 = no per-tenant limit */
    bool admin;                    /* GetMetrics shows every tenant's series (else its own) */
    /* quotas (gw_quota.c), 0 = none */
    uint32_t requests_per_s;       /* token bucket of RPCs that reach a worker, burst = 1 s */
    uint32_t tokens_per_min;       /* token bucket of prompt + generated tokens, burst = 1 min */
    uint32_t max_prompt_bytes;     /* below limits.max_prompt_bytes for this tenant */
    uint32_t max_queued;           /* requests at the workers not yet generating */
};

struct config_adapter {
    char *name;
    char *dir; /* absolute: a PEFT directory (adapter_config.json + adapter_model.safetensors) */
};

struct config_limits {
    uint32_t max_message_bytes;      /* gRPC receive/send message size */
    uint32_t max_prompt_tokens;      /* after tokenization (checked by the worker) */
    uint32_t max_tokens;             /* per request's max_tokens */
    uint32_t max_streams_per_connection;
    uint32_t max_queue;              /* requests waiting per worker before UNAVAILABLE */
    uint32_t max_prompt_bytes;       /* a request's text (prompt, Tokenize) before tokenizing */
    uint32_t max_early_resets;       /* streams a connection may reset before any answer, in
                                      * 10 s, before the gateway closes it (rapid reset) */
    uint32_t max_connections;        /* gRPC connections open at once on the Unix listener */
    uint32_t max_calls;              /* gRPC calls open at once, every connection together */
};

/* Worker lifecycle policy (daemon/backoff.h, daemon/sup.c). */
struct config_supervisor {
    uint32_t respawn_initial_ms;     /* first delay after a crash */
    uint32_t respawn_max_ms;         /* delays double up to this */
    uint32_t crash_loop_max;         /* this many crashes ... */
    uint32_t crash_loop_window_s;    /* ... within this window: stop respawning the slot */
    uint32_t stable_after_s;         /* a worker up this long resets the delay */
    uint32_t stop_grace_s;           /* SIGTERM to a worker, then SIGKILL after this */
    uint32_t ready_timeout_s;        /* a worker not ready by then is killed (crash) */
    uint32_t heartbeat_timeout_s;    /* a ready worker whose heartbeat is older is killed */
};

/* The served model's generation defaults: chat.ie.json's "sampling" (from the source's
 * generation_config.json), which the gateway applies to a request that leaves a field unset
 * (daemon/gencfg.h; docs/DAEMON.md, "Sampling defaults"). */
struct config_model_sampling {
    bool has_temperature, has_top_p, has_top_k, has_repetition_penalty;
    float temperature, top_p, repetition_penalty;
    uint32_t top_k;
};

struct config {
    uint32_t magic;
    atomic_uint refs;
    char *path;                      /* the file it came from (absolute), "" if none */

    char *listen_tcp;                /* "host:port" / "[v6]:port", NULL = no TCP listener */
    char *listen_unix;               /* absolute socket path, NULL = none */
    char *tls_cert, *tls_key;        /* absolute paths, both or neither (NULL) */
    char *tls_client_ca;             /* NULL = no client certificates asked */
    char *metrics_listen;            /* "host:port", NULL = no metrics endpoint */
    char *http_listen;               /* "host:port" of the OpenAI-compatible API (daemon/http.h),
                                      * NULL = none */
    uint32_t http_max_connections;   /* its connections served at once (and the metrics
                                      * endpoint's) */
    uint32_t http_timeout_s;         /* an idle connection is closed after this */
    uint32_t http_max_body_bytes;    /* a larger request body is answered 413 */

    char *model_dir;                 /* absolute IEBIN model directory */
    char *worker_binary;             /* NULL = found beside clocherd (docs/DAEMON.md) */
    char *access_log;                /* absolute path of the access log (one JSON line per
                                      * finished request, daemon/stats.h); NULL = none.
                                      * Reopened on reload (log rotation) */
    uint32_t workers;                /* 0 = one per NUMA node with CPUs */
    uint32_t threads_per_worker;     /* 0 = every CPU of the worker's share */
    uint64_t kv_budget_mb;           /* per worker; 0 = the engine's default */
    enum dtype kv_dtype;             /* "kv_dtype": the workers' KV cache element type
                                      * (--kv-dtype, docs/KV.md); default DT_BF16 */
    int log_format;                  /* "log_format": enum log_format (common/log.h), -1 = not
                                      * given (then $CLOCHER_LOG_FORMAT, else text) */
    bool lora_weights_bf16;          /* "lora_weights": "bf16" (workers round adapters to bf16,
                                      * --lora-weights bf16) or "auto" (default) */
    bool lora_weights_int8;          /* "lora_weights": "int8" (8-bit adapter weights,
                                      * --lora-weights int8; docs/LORA.md) */
    bool hot_replicate;              /* IE_HOT_REPLICATE for workers */
    bool batch_invariant;            /* "batch_invariant": the default of a Generate's
                                      * batch_invariant (docs/DAEMON.md "Batch invariance") */
    uint64_t hot_repl_limit_mb;      /* IE_HOT_REPL_LIMIT_MB; 0 = no limit */

    /* ---- a Hugging Face folder or a GGUF as model_dir: the conversion cache ("convert";
     * docs/DAEMON.md, "Models as downloaded"). Restart-only. ---- */
    bool convert_disabled;           /* "convert.enabled": false (--no-convert): refuse such a
                                      * model_dir with the `clocher convert` command instead */
    char *convert_cache_dir;         /* "convert.cache_dir", absolute; NULL = $CACHE_DIRECTORY,
                                      * $XDG_CACHE_HOME/clocher or ~/.cache/clocher */
    char *convert_dtype;             /* "convert.dtype" (`clocher convert --dtype`); NULL = the
                                      * source's own dtypes */
    char *convert_program;           /* "convert.program": the clocher program, absolute; NULL
                                      * = found beside clocherd */
    double convert_cache_max_gb;     /* "convert.cache_max_gb": after the conversion, least
                                      * recently used entries are evicted down to this; 0 =
                                      * never (client/offline/convcache.h) */
    /* set by clocherd at start, before the snapshot is published, and carried across reloads:
     * the IEBIN folder the workers load (NULL = model_dir itself; else its cache entry) and
     * that folder's sampling defaults */
    char *served_model_dir;
    struct config_model_sampling model_sampling;
    /* "threads_pin": how each worker pins its engine threads within its CPU share,
     * "compact" (default), "scatter" or "none" (--pin; docs/DAEMON.md) */
    char threads_pin[8];
    /* "kv_snapshot": {"path": DIR, "max_mb": N}: each worker restores its prefix cache from
     * DIR/worker-<slot>.kvsnap at start and saves its hottest blocks there when it stops
     * (docs/KV.md "Snapshots in clocherd"); NULL path = off */
    char *kv_snapshot_dir;           /* absolute, an existing directory */
    uint64_t kv_snapshot_max_mb;     /* 0 = the whole KV pool */

    struct config_limits limits;
    double drain_timeout_s;
    struct config_supervisor sup;

    size_t n_tenants;
    struct config_tenant *tenants;   /* [n_tenants]; none = anonymous access (see DAEMON.md) */
    size_t n_adapters;
    struct config_adapter *adapters; /* [n_adapters], loaded by every worker at start */
};

/*
 * Reads and validates the file at `path` (at most CONFIG_FILE_MAX bytes). 0 and *out (one
 * reference), or a negative code with one message naming the file and the field:
 * -errno (unreadable file), ERR_FORMAT (bad JSON, wrong type, unknown key, duplicate,
 * malformed value), ERR_RANGE (a number or length out of range).
 * model_dir_override (NULL = none) replaces the file's model_dir (clocherd --model-dir), so the
 * file may omit it.
 */
int config_load(const char *path, const char *model_dir_override, struct config **out);

/*
 * The same on bytes in memory: `label` names them in messages, relative paths are resolved
 * against base_dir (absolute). An empty document ("{}") with a model_dir_override is the
 * configuration clocherd runs with when given no file.
 */
int config_parse(const char *label, const char *base_dir, const char *json, size_t len,
                 const char *model_dir_override, struct config **out);

/* Whether name is a dtype `clocher convert --dtype` takes (int8/int4 its aliases), *out it. */
bool config_convert_dtype_ok(const char *name, enum dtype *out);

/* Whether a "host:port" names a loopback address (where anonymous access is allowed). */
bool config_hostport_loopback(const char *s);

/* Reference counting (any thread). config_unref(NULL) is a no-op. */
struct config *config_ref(struct config *c);
void config_unref(struct config *c);

/*
 * For a reload: copies every restart-only field of `running` into `fresh`, logging one warning
 * per field whose value the file changed ("listen.tcp changed; takes effect at restart").
 * Returns the number of such fields.
 */
int config_keep_restart_fields(struct config *fresh, const struct config *running);

/* The tenant named `name`, or NULL. */
const struct config_tenant *config_find_tenant(const struct config *c, const char *name);
/* The adapter named `name`, or NULL. */
const struct config_adapter *config_find_adapter(const struct config *c, const char *name);
/* Whether tenant t may use adapter `name` (NULL name = the base model: always). */
bool config_tenant_allows(const struct config_tenant *t, const char *name);

/* ---- the current snapshot, shared between threads ---- */
struct config_ptr {
    pthread_mutex_t mu;
    struct config *cur;
};

/* Takes over the caller's reference to c. */
void config_ptr_init(struct config_ptr *p, struct config *c);
/* Drops the held reference. */
void config_ptr_fini(struct config_ptr *p);
/* A new reference to the current snapshot; release it with config_unref. */
struct config *config_ptr_get(struct config_ptr *p);
/* Replaces the snapshot, taking over the caller's reference to c; readers holding the old one
 * keep it until they unref it. */
void config_ptr_set(struct config_ptr *p, struct config *c);

#endif
