/*
 * sup.h — clocherd's supervisor: spawns one clocher-worker per slot (fork+exec via uv_spawn),
 * watches it become ready and stay alive, reaps it, respawns crashed ones with exponential
 * backoff and a crash-loop limit, drains and stops everything on SIGTERM, reloads the
 * configuration on SIGHUP, and keeps systemd informed (sd_notify READY/STOPPING/RELOADING/
 * WATCHDOG/STATUS). docs/DAEMON.md describes the behaviour; daemon/workers.h what the gateway
 * sees of it.
 *
 * What a worker inherits (argv, descriptors, environment) and the statuses it exits with are
 * the contract in shm/heritage.h; readiness and liveness come from its control socket.
 *
 * NOTES: everything here runs on the libuv loop thread given to sup_create. The supervisor
 * writes the slot table's atomics (workers.h); it creates each worker's region but never reads
 * it (PostgreSQL's postmaster rule: no memory a worker writes). Signal handling is uv_signal_t
 * only.
 */
#ifndef CLOCHER_DAEMON_SUP_H
#define CLOCHER_DAEMON_SUP_H

#include "heritage.h"
#include "workers.h"

#include <stdbool.h>
#include <uv.h>

/* clocherd's own exit statuses: the worker's (shm/heritage.h), with the same meaning. */
#define SUP_EXIT_OK HERITAGE_EXIT_OK
#define SUP_EXIT_FAILURE HERITAGE_EXIT_FAILURE
#define SUP_EXIT_FATAL HERITAGE_EXIT_FATAL /* configuration or model error: retrying cannot help */

struct sup_options {
    const char *config_path;        /* NULL: no file (SIGHUP has nothing to re-read) */
    const char *model_dir_override; /* --model-dir */
    int workers_override;           /* --workers; -1 = none */
    const char *worker_binary;      /* resolved, executable */
    bool numa;                      /* bind worker memory to its node (real topology) */
    /* the conversion cache's command-line overrides (NULL/false = the configuration's) */
    bool no_convert;                /* --no-convert */
    const char *convert_dtype;      /* --convert-dtype */
    const char *cache_dir;          /* --cache-dir (absolute) */
    const char *convert_program;    /* --convert-program */
};

struct sup;

/* Sets up signals and timers on `loop`; spawns nothing yet. 0 or a negative code (logged). */
int sup_create(uv_loop_t *loop, struct workers *w, const struct sup_options *opt,
               struct sup **out);
/* Spawns every slot's first worker. The loop then runs until the supervisor has stopped every
 * worker and closed its handles (after SIGTERM/SIGINT). */
int sup_start(struct sup *s);
/* The exit status clocherd should return once uv_run is done. */
int sup_exit_code(const struct sup *s);
/* Frees the supervisor; the loop must have stopped (all handles closed). NULL is a no-op. */
void sup_destroy(struct sup *s);

/*
 * Before anything else starts: when the configuration's model_dir is a Hugging Face folder or
 * a GGUF file (and conversion is enabled), runs `clocher convert --cache` on it as a child
 * (modelsrc.h), keeping systemd informed (STATUS=, EXTEND_TIMEOUT_USEC=, WATCHDOG=1), and sets
 * c->served_model_dir to the IEBIN folder it printed. Then reads the served folder's sampling
 * defaults into c->model_sampling (daemon/gencfg.h). c is not yet published. 0, or a
 * negative code with the cause logged: ERR_FORMAT (the source or its defaults are refused:
 * exit 2), ERR_CANCELLED (SIGTERM/SIGINT while converting), another (exit 1).
 */
int sup_prepare_model(struct config *c);

/*
 * Applies the command-line overrides that also hold across reloads (workers, worker binary)
 * to a freshly loaded configuration, before it is published.
 */
void sup_apply_overrides(struct config *c, const struct sup_options *opt);

#endif
