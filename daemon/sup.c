/*
 * sup.c — the supervisor: worker spawn, readiness, heartbeats, reaping, respawn with backoff,
 * drain and stop, reload, systemd notifications (see sup.h, docs/DAEMON.md).
 *
 * NOTES: single-threaded (the loop thread). A worker process is a uv_process_t allocated per
 * spawn and freed in its close callback, so a respawn never reuses a handle libuv still owns;
 * likewise its control socket's uv_poll_t. Each spawn gets (shm/heritage.h):
 *  - HERITAGE_FD_CONTROL: one end of a SOCK_SEQPACKET socketpair, the control channel
 *    (HERITAGE_CTL_KEYS, parsed by ctl.c). Readiness and liveness come from there, timed on the
 *    supervisor's clock; the supervisor reads no memory a worker writes;
 *  - HERITAGE_FD_REGION: a fresh shm region with the slot's next generation, for the gateway;
 *    the supervisor only creates it and hands it over (workers.h);
 *  - its command line and environment, built by heritage_argv_build / heritage_env_build.
 * The slot table's atomics are written here only: generation, then pid, then state (release),
 * so a gateway thread that sees READY also sees the generation it belongs to.
 */
#include "sup.h"

#include "backoff.h"
#include "check.h"
#include "config.h"
#include "err.h"
#include "gencfg.h"
#include "log.h"
#include "ctl.h"
#include "modelsrc.h"
#include "region.h"
#include "workers.h"

#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <sys/socket.h>
#include <unistd.h>

#define SUP_MAGIC 0x53555052u /* "SUPR" */
#define TICK_MS 100           /* readiness, heartbeat and drain checks */

extern char **environ;

struct sup_slot {
    struct sup *sup;
    struct workers_slot *ws;
    uv_process_t *proc;            /* NULL when no process; freed in its close callback */
    uv_timer_t respawn_timer;
    struct backoff backoff;
    uv_poll_t *ctl;                /* our end of the control socket; NULL when none */
    uint64_t started_ms;           /* loop time of the spawn */
    uint64_t last_beat_ms;         /* loop time of the last WATCHDOG=1 (or READY=1) */
    bool ctl_complained;           /* one log line per generation for bad messages */
    bool respawn_pending;
    char kill_reason[128];         /* set when the supervisor SIGKILLs it (hung, never ready) */
};

struct sup {
    uint32_t magic;
    uv_loop_t *loop;
    struct workers *w;
    struct sup_options opt;
    char *worker_binary;
    char *config_path;
    char *model_dir_override;
    struct sup_slot *slots;        /* [w->n] */

    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t tick, watchdog, stop_timer;
    unsigned open_handles;         /* handles not yet closed at shutdown */

    bool notified_ready;           /* READY=1 sent once every worker was ready */
    bool stopping;                 /* SIGTERM received */
    uint64_t drain_deadline_ms;
    size_t last_ready;             /* for STATUS= updates */
    int exit_code;
};

/* ---- small helpers ---- */

static struct config *cfg_get(struct sup *s) { return config_ptr_get(s->w->config); }

static void set_state(struct sup_slot *ss, enum workers_state st)
{
    atomic_store_explicit(&ss->ws->state, (int)st, memory_order_release);
}

static int get_state(const struct sup_slot *ss)
{
    return atomic_load_explicit(&ss->ws->state, memory_order_acquire);
}

static void notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void notify(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* 0 = not under systemd (no NOTIFY_SOCKET): nothing to do; < 0 worth a debug line only */
    int rc = sd_notify(0, buf);
    if (rc < 0)
        LOG_DEBUG("sd_notify(%s): %s", buf, strerror(-rc));
}

static void notify_status(struct sup *s)
{
    size_t ready = workers_ready_count(s->w), given_up = 0;
    for (size_t i = 0; i < s->w->n; i++)
        given_up += atomic_load(&s->w->slots[i].given_up) ? 1 : 0;
    char extra[64] = "";
    if (given_up)
        snprintf(extra, sizeof extra, ", %zu given up (see the journal)", given_up);
    notify("STATUS=%s: %zu/%zu workers ready%s", workers_phase_name(atomic_load(&s->w->phase)),
           ready, s->w->n, extra);
    s->last_ready = ready;
}

/* ---- the shm region: created here, used by the gateway and the worker ---- */

static int region_create(struct sup_slot *ss, uint32_t generation, struct workers_region **wr,
                         int *fd)
{
    *wr = NULL;
    *fd = -1;
    struct config *c = cfg_get(ss->sup);
    struct shm_region *r = NULL;
    /* a ring record must hold the largest request the gateway accepts */
    int rc = shm_region_create(generation, c->limits.max_message_bytes, &r);
    config_unref(c);
    if (rc < 0)
        return rc;
    char name[32];
    snprintf(name, sizeof name, "worker %u", ss->ws->index);
    shm_region_set_name(r, name);
    if ((rc = workers_region_wrap(ss->ws->index, generation, r, wr)) < 0) {
        shm_region_close(r);
        return rc;
    }
    *fd = shm_region_fd(r);
    return 0;
}

/* ---- the control socket ---- */

/* The socket is closed here, after libuv let go of it; its number was taken before uv_close,
 * because uv_fileno answers EBADF on a closing handle (that lost one fd per worker exit). */
static void close_ctl_cb(uv_handle_t *h)
{
    int fd = (int)(intptr_t)h->data;
    if (fd >= 0)
        close(fd);
    free(h);
}

static void close_ctl(struct sup_slot *ss)
{
    if (!ss->ctl)
        return;
    uv_poll_stop(ss->ctl);
    int fd;
    ss->ctl->data = (void *)(intptr_t)(uv_fileno((uv_handle_t *)ss->ctl, &fd) == 0 ? fd : -1);
    uv_close((uv_handle_t *)ss->ctl, close_ctl_cb);
    ss->ctl = NULL;
}

static void on_ready(struct sup_slot *ss, uint64_t hot_bytes);

static void on_ctl(uv_poll_t *h, int status, int events)
{
    struct sup_slot *ss = h->data;
    (void)events;
    if (status < 0 || ss->ctl != h)
        return;
    int fd;
    uv_fileno((uv_handle_t *)h, &fd);
    char who[64];
    snprintf(who, sizeof who, "worker %u (pid %d)", ss->ws->index,
             atomic_load(&ss->ws->pid));
    for (;;) {
        char buf[HERITAGE_CTL_MSG_MAX + 1];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)))
            break; /* EOF comes with the worker's exit; on_worker_exit handles it */
        if (n < 0) {
            LOG_WARN("%s: control socket: %s", who, strerror(errno));
            uv_poll_stop(h);
            break;
        }
        struct heritage_ctl_msg m;
        if ((size_t)n > HERITAGE_CTL_MSG_MAX) {
            if (!ss->ctl_complained)
                LOG_ERR("%s: control message of %zd bytes, the limit is %d; ignored", who, n,
                        HERITAGE_CTL_MSG_MAX);
            ss->ctl_complained = true;
            continue;
        }
        if (ctl_parse(who, buf, (size_t)n, &m) < 0) {
            ss->ctl_complained = true;
            continue;
        }
        uint64_t now = uv_now(ss->sup->loop);
        if (m.watchdog || m.ready)
            ss->last_beat_ms = now;
        if (m.status[0])
            LOG_INFO("%s: %s", who, m.status);
        if (m.has_hot_tensors)
            atomic_store(&ss->ws->hot_replicated_tensors, m.hot_tensors);
        if (m.ready)
            on_ready(ss, m.has_hot_bytes ? m.hot_bytes : 0);
        else if (m.has_hot_bytes)
            atomic_store(&ss->ws->hot_replicated_bytes, m.hot_bytes);
    }
}

/* ---- spawning ---- */

static void on_worker_exit(uv_process_t *p, int64_t exit_status, int term_signal);
static void finish_if_stopped(struct sup *s);

/* The worker's command line for slot `ws`, generation `gen` (shm/heritage.h). The strings
 * point into c and ws; heritage_argv_build copies them. spawn() has refused a configuration
 * with more than HERITAGE_MAX_ADAPTERS adapters before. */
static void worker_args(const struct sup *s, const struct workers_slot *ws, uint32_t gen,
                        const struct config *c, struct heritage_args *h)
{
    heritage_args_init(h);
    h->slot = ws->index;
    h->generation = gen;
    h->control_fd = HERITAGE_FD_CONTROL;
    h->region_fd = HERITAGE_FD_REGION;
    h->cpus = ws->cpulist;
    if (s->opt.numa)
        h->mem_node = ws->node;
    h->model_dir = c->served_model_dir ? c->served_model_dir : c->model_dir;
    h->threads = c->threads_per_worker ? c->threads_per_worker : (unsigned)ws->n_cpus;
    h->kv_budget_mb = (int64_t)c->kv_budget_mb;
    h->max_queue = c->limits.max_queue;
    h->max_prompt_tokens = c->limits.max_prompt_tokens;
    h->parent_pid = getpid();
    if (c->lora_weights_bf16)
        h->lora_weights = HERITAGE_LORA_WEIGHTS_BF16;
    if (c->lora_weights_int8)
        h->lora_weights = HERITAGE_LORA_WEIGHTS_INT8;
    h->kv_dtype = dtype_kv_name(c->kv_dtype);
    h->pin = c->threads_pin;
    if (c->kv_snapshot_dir) {
        /* one file per slot: a replaced worker restores what its predecessor saved */
        static char path[PATH_MAX]; /* single-threaded, as h; argv_build copies it */
        snprintf(path, sizeof path, "%s/worker-%u.kvsnap", c->kv_snapshot_dir, ws->index);
        h->kv_snapshot = path;
        h->kv_snapshot_max_mb = (int64_t)c->kv_snapshot_max_mb;
    }
    for (size_t i = 0; i < c->n_adapters && i < HERITAGE_MAX_ADAPTERS; i++) {
        h->adapters_name[i] = c->adapters[i].name;
        h->adapters_dir[i] = c->adapters[i].dir;
        h->n_adapters = i + 1;
    }
}

static void close_proc(uv_handle_t *h) { free(h); }

/* Spawns the slot's next generation. On failure the slot goes through the crash path. */
static void crash(struct sup_slot *ss, const char *reason, bool fatal);

static void spawn(struct sup_slot *ss)
{
    struct sup *s = ss->sup;
    struct workers_slot *ws = ss->ws;
    uint32_t gen = atomic_load(&ws->generation) + 1;
    struct workers_region *wr = NULL;
    int region_fd = -1, rc;
    int sv[2] = {-1, -1};
    ss->respawn_pending = false;
    ss->kill_reason[0] = '\0';
    ss->ctl_complained = false;

    struct config *c0 = cfg_get(s);
    size_t n_adapters = c0->n_adapters;
    config_unref(c0);
    if (n_adapters > HERITAGE_MAX_ADAPTERS) {
        /* the worker would refuse such a command line (exit 2): a configuration error */
        char why[160];
        snprintf(why, sizeof why, "worker %u: %zu adapters configured, a worker loads at most %d",
                 ws->index, n_adapters, HERITAGE_MAX_ADAPTERS);
        crash(ss, why, true);
        return;
    }

    if ((rc = region_create(ss, gen, &wr, &region_fd)) < 0) {
        char why[160];
        snprintf(why, sizeof why, "worker %u: could not create its shared-memory region: %s",
                 ws->index, log_last_error());
        crash(ss, why, false);
        return;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
        char why[160];
        snprintf(why, sizeof why, "worker %u: socketpair for its control channel: %s", ws->index,
                 strerror(errno));
        workers_region_put(wr);
        crash(ss, why, false);
        return;
    }

    struct config *c = cfg_get(s);
    static struct heritage_args h; /* single-threaded; large: keep it off the stack */
    worker_args(s, ws, gen, c, &h);
    char **argv = heritage_argv_build(s->worker_binary, &h);
    struct heritage_env_store env_store;
    struct heritage_env he = {.hot_replicate = c->hot_replicate,
                              .hot_repl_limit_mb = c->hot_repl_limit_mb};
    char **env = heritage_env_build(environ, &he, &env_store);

    /* libuv dup2()s slot i onto fd i in the child (clearing close-on-exec there) */
    uv_stdio_container_t stdio[HERITAGE_FD_COUNT] = {
        {.flags = UV_IGNORE},
        {.flags = UV_INHERIT_FD, .data.fd = STDOUT_FILENO},
        {.flags = UV_INHERIT_FD, .data.fd = STDERR_FILENO},
        [HERITAGE_FD_CONTROL] = {.flags = UV_INHERIT_FD, .data.fd = sv[1]},
        [HERITAGE_FD_REGION] = {.flags = UV_INHERIT_FD, .data.fd = region_fd},
    };
    uv_process_options_t po = {
        .exit_cb = on_worker_exit,
        .file = s->worker_binary,
        .args = argv,
        .env = env,
        .stdio_count = HERITAGE_FD_COUNT,
        .stdio = stdio,
    };
    uv_process_t *p = calloc(1, sizeof *p);
    uv_poll_t *poll = calloc(1, sizeof *poll);
    bool spawned = p && poll && env && argv;
    rc = spawned ? uv_spawn(s->loop, p, &po) : UV_ENOMEM;
    free(argv);
    free(env);
    config_unref(c);
    close(sv[1]); /* the child's end: it has its own copy now */

    if (rc < 0) {
        /* libuv reports exec failures (ENOENT, EACCES) synchronously */
        char why[160];
        snprintf(why, sizeof why, "worker %u: spawning %s failed: %s", ws->index, s->worker_binary,
                 uv_strerror(rc));
        if (spawned)
            uv_close((uv_handle_t *)p, close_proc); /* libuv: a failed spawn is still closed */
        else
            free(p);
        free(poll);
        close(sv[0]);
        workers_region_put(wr);
        crash(ss, why, rc == UV_ENOENT || rc == UV_EACCES);
        return;
    }
    p->data = ss;
    ss->proc = p;
    ss->started_ms = uv_now(s->loop);
    ss->last_beat_ms = ss->started_ms;
    if ((rc = uv_poll_init(s->loop, poll, sv[0])) < 0) {
        /* without its control channel the worker can never be seen ready: it is killed at
         * ready_timeout_s like any worker that does not report */
        LOG_ERR("worker %u: uv_poll_init: %s", ws->index, uv_strerror(rc));
        free(poll);
        close(sv[0]);
    } else {
        poll->data = ss;
        ss->ctl = poll;
        uv_poll_start(poll, UV_READABLE, on_ctl);
    }
    /* our copy of the fd: the child has its own now, and the mapping stays valid without it;
     * the pid we spawned is the one the region must see attach (the gateway checks it) */
    shm_region_close_fd(wr->shm);
    shm_region_set_peer_pid(wr->shm, p->pid);

    atomic_store_explicit(&ws->generation, gen, memory_order_release);
    atomic_store_explicit(&ws->pid, p->pid, memory_order_release);
    atomic_store(&ws->hot_replicated_bytes, 0);
    atomic_store(&ws->hot_replicated_tensors, 0);
    workers_slot_set_region(ws, wr); /* the slot holds the supervisor's reference */
    set_state(ss, WORKERS_STARTING);
    LOG_INFO("worker %u: started pid %d, generation %" PRIu32 ", node %d, CPUs %s", ws->index,
             p->pid, gen, ws->node, ws->cpulist);
}

static void on_respawn_timer(uv_timer_t *t)
{
    struct sup_slot *ss = t->data;
    if (ss->sup->stopping)
        return;
    atomic_fetch_add(&ss->ws->restarts, 1);
    spawn(ss);
}

/*
 * A generation ended (or never began): decide between respawn and giving up. `fatal` = the
 * worker said respawning cannot help (HERITAGE_EXIT_FATAL) or it cannot be executed at all.
 */
static void crash(struct sup_slot *ss, const char *reason, bool fatal)
{
    struct sup *s = ss->sup;
    struct workers_slot *ws = ss->ws;
    set_state(ss, WORKERS_DEAD);
    if (s->stopping)
        return;
    if (fatal) {
        atomic_store(&ws->given_up, true);
        LOG_ERR("%s; a configuration or model error: NOT respawning worker %u (fix the cause, "
                "then SIGHUP clocherd to retry)",
                reason, ws->index);
    } else {
        uint64_t delay;
        enum backoff_verdict v = backoff_crash(&ss->backoff, uv_now(s->loop), ss->started_ms,
                                               &delay);
        if (v == BACKOFF_GIVE_UP) {
            atomic_store(&ws->given_up, true);
            LOG_ERR("%s; %u crashes within %" PRIu64 " s: crash loop, NOT respawning worker %u "
                    "any more (SIGHUP clocherd to retry)",
                    reason, ss->backoff.pol.crash_loop_max, ss->backoff.pol.window_ms / 1000,
                    ws->index);
        } else {
            LOG_WARN("%s; respawning in %" PRIu64 " ms", reason, delay);
            ss->respawn_pending = true;
            uv_timer_start(&ss->respawn_timer, on_respawn_timer, delay, 0);
        }
    }
    if (workers_ready_count(s->w) == 0) {
        bool any_coming = false;
        for (size_t i = 0; i < s->w->n; i++)
            if (s->slots[i].proc || s->slots[i].respawn_pending)
                any_coming = true;
        if (!any_coming)
            LOG_ERR("no worker left: clocherd is up but serves nothing (health NOT_SERVING)");
    }
    notify_status(s);
}

static void describe_exit(const struct sup_slot *ss, int pid, uint32_t gen, int64_t status,
                          int sig, char *buf, size_t cap)
{
    int o;
    if (sig)
        o = snprintf(buf, cap, "worker %u (pid %d, generation %" PRIu32 ") was killed by signal %d (%s)",
                     ss->ws->index, pid, gen, sig, strsignal(sig));
    else
        o = snprintf(buf, cap, "worker %u (pid %d, generation %" PRIu32 ") exited with status %" PRId64,
                     ss->ws->index, pid, gen, status);
    if (ss->kill_reason[0] && o > 0 && (size_t)o < cap)
        snprintf(buf + o, cap - (size_t)o, " (%s)", ss->kill_reason);
}

static void on_worker_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct sup_slot *ss = p->data;
    struct sup *s = ss->sup;
    struct workers_slot *ws = ss->ws;
    uint32_t gen = atomic_load(&ws->generation);
    int pid = p->pid;

    bool asked = s->stopping;
    bool fatal = !term_signal && exit_status == HERITAGE_EXIT_FATAL;
    if (!asked && !term_signal && exit_status == HERITAGE_EXIT_OK && !ss->kill_reason[0])
        /* nobody asked it to stop: handled like a crash, so a worker that keeps exiting
         * cleanly cannot spin either */
        snprintf(ss->kill_reason, sizeof ss->kill_reason, "without being asked to stop");
    struct workers_death d = {.slot = ws->index, .generation = gen, .pid = pid,
                              .exit_code = term_signal ? -1 : (int)exit_status,
                              .term_signal = term_signal};
    describe_exit(ss, pid, gen, exit_status, term_signal, d.reason, sizeof d.reason);

    ss->proc = NULL;
    uv_close((uv_handle_t *)p, close_proc);
    close_ctl(ss);
    atomic_store_explicit(&ws->pid, 0, memory_order_release);
    set_state(ss, WORKERS_DEAD);
    workers_slot_set_region(ws, NULL); /* the gateway's references keep it mapped meanwhile */

    if (asked) {
        if (term_signal || exit_status != 0)
            LOG_WARN("%s while stopping", d.reason);
        else
            LOG_INFO("%s", d.reason);
    }
    if (!asked) {
        crash(ss, d.reason, fatal);
        d.respawning = ss->respawn_pending;
    }
    if (s->w->hooks && s->w->hooks->worker_died)
        s->w->hooks->worker_died(s->w->hooks_ud, ws, &d);
    if (asked)
        finish_if_stopped(s);
}

/* ---- periodic checks ---- */

static void sigkill(struct sup_slot *ss, const char *why)
{
    if (!ss->proc || ss->kill_reason[0])
        return;
    snprintf(ss->kill_reason, sizeof ss->kill_reason, "%s", why);
    LOG_ERR("worker %u (pid %d): %s: killing it", ss->ws->index, ss->proc->pid, why);
    uv_process_kill(ss->proc, SIGKILL);
}

static void begin_stop(struct sup *s);
static void on_tick(uv_timer_t *t);

/* The worker said READY=1 on its control socket. */
static void on_ready(struct sup_slot *ss, uint64_t hot_bytes)
{
    struct sup *s = ss->sup;
    struct workers_slot *ws = ss->ws;
    if (!ss->proc || get_state(ss) != WORKERS_STARTING)
        return; /* a repeated READY, or one racing with a stop */
    uint64_t now = uv_now(s->loop);
    uint32_t gen = atomic_load(&ws->generation);
    atomic_store(&ws->hot_replicated_bytes, hot_bytes);
    set_state(ss, WORKERS_READY);
    char hot[96] = "";
    if (hot_bytes)
        snprintf(hot, sizeof hot, ", %.1f MiB of hot tensors node-local (%" PRIu64 " tensors)",
                 (double)hot_bytes / 1048576.0, atomic_load(&ws->hot_replicated_tensors));
    LOG_INFO("worker %u (pid %d, generation %" PRIu32 "): ready after %.1f s%s", ws->index,
             ss->proc->pid, gen, (double)(now - ss->started_ms) / 1000.0, hot);
    if (s->w->hooks && s->w->hooks->worker_ready)
        s->w->hooks->worker_ready(s->w->hooks_ud, ws, gen);
    on_tick(&s->tick); /* READY=1 to systemd without waiting for the next tick */
}

static void check_slot(struct sup_slot *ss, const struct config *c, uint64_t now)
{
    if (!ss->proc || ss->kill_reason[0])
        return;
    int st = get_state(ss);
    char why[128];
    if (st == WORKERS_STARTING && now - ss->started_ms > (uint64_t)c->sup.ready_timeout_s * 1000) {
        snprintf(why, sizeof why, "not ready after %u s (supervisor.ready_timeout_s)",
                 c->sup.ready_timeout_s);
        sigkill(ss, why);
    } else if (st == WORKERS_READY &&
               now - ss->last_beat_ms > (uint64_t)c->sup.heartbeat_timeout_s * 1000) {
        snprintf(why, sizeof why, "hung: no heartbeat for %u s (supervisor.heartbeat_timeout_s)",
                 c->sup.heartbeat_timeout_s);
        sigkill(ss, why);
    }
}

static void on_tick(uv_timer_t *t)
{
    struct sup *s = t->data;
    uint64_t now = uv_now(s->loop);
    struct config *c = cfg_get(s);
    for (size_t i = 0; i < s->w->n; i++)
        check_slot(&s->slots[i], c, now);
    config_unref(c);

    size_t ready = workers_ready_count(s->w), given_up = 0;
    for (size_t i = 0; i < s->w->n; i++)
        given_up += atomic_load(&s->w->slots[i].given_up) ? 1 : 0;
    if (!s->stopping && !s->notified_ready && given_up == s->w->n) {
        /* not one worker could start: nothing to serve, and restarting clocherd would not
         * help either (the causes were logged per worker) */
        LOG_ERR("no worker could start: clocherd exits with status %d", SUP_EXIT_FATAL);
        s->exit_code = SUP_EXIT_FATAL;
        s->stopping = true;
        atomic_store(&s->w->phase, WORKERS_PHASE_DRAINING);
        begin_stop(s);
    } else if (!s->stopping && !s->notified_ready && ready > 0 && ready + given_up == s->w->n) {
        /* READY=1 once, when every worker that can start has loaded its model */
        s->notified_ready = true;
        atomic_store(&s->w->phase, WORKERS_PHASE_SERVING);
        if (given_up)
            LOG_WARN("%zu of %zu workers ready (the others were given up): serving", ready,
                     s->w->n);
        else
            LOG_INFO("all %zu workers ready: serving", s->w->n);
        notify("READY=1");
        notify_status(s);
    } else if (ready != s->last_ready) {
        notify_status(s);
    }

    if (atomic_load(&s->w->phase) == WORKERS_PHASE_DRAINING) {
        size_t active = s->w->hooks && s->w->hooks->active_streams
                            ? s->w->hooks->active_streams(s->w->hooks_ud)
                            : 0;
        if (active == 0) {
            LOG_INFO("drained: no stream in flight");
            begin_stop(s);
        } else if (now >= s->drain_deadline_ms) {
            LOG_WARN("drain timeout: %zu streams still in flight are cut", active);
            begin_stop(s);
        }
    }
}

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    notify("WATCHDOG=1");
}

/* ---- stopping ---- */

static void close_cb(uv_handle_t *h)
{
    struct sup *s = h->data;
    s->open_handles--;
}

static void close_handle(struct sup *s, uv_handle_t *h)
{
    if (!uv_is_closing(h)) {
        h->data = s;
        uv_close(h, close_cb);
    }
}

/* Closes every handle of the supervisor and stops the loop: clocherd's main then tears down
 * the gateway and runs the loop until their handles are closed too. */
static void close_all(struct sup *s)
{
    close_handle(s, (uv_handle_t *)&s->sig_term);
    close_handle(s, (uv_handle_t *)&s->sig_int);
    close_handle(s, (uv_handle_t *)&s->sig_hup);
    close_handle(s, (uv_handle_t *)&s->tick);
    close_handle(s, (uv_handle_t *)&s->watchdog);
    close_handle(s, (uv_handle_t *)&s->stop_timer);
    for (size_t i = 0; i < s->w->n; i++)
        close_handle(s, (uv_handle_t *)&s->slots[i].respawn_timer);
    uv_stop(s->loop);
}

static void finish_if_stopped(struct sup *s)
{
    for (size_t i = 0; i < s->w->n; i++)
        if (s->slots[i].proc)
            return;
    LOG_INFO("every worker has exited");
    close_all(s);
}

static void on_stop_grace(uv_timer_t *t)
{
    struct sup *s = t->data;
    for (size_t i = 0; i < s->w->n; i++)
        if (s->slots[i].proc) {
            LOG_WARN("worker %u (pid %d) still running after the stop grace: SIGKILL", (unsigned)i,
                     s->slots[i].proc->pid);
            uv_process_kill(s->slots[i].proc, SIGKILL);
        }
}

/* Drain over (or skipped): SIGTERM every worker, SIGKILL after the grace period. */
static void begin_stop(struct sup *s)
{
    if (atomic_load(&s->w->phase) == WORKERS_PHASE_STOPPING)
        return;
    atomic_store(&s->w->phase, WORKERS_PHASE_STOPPING);
    notify_status(s);
    struct config *c = cfg_get(s);
    uint64_t grace = (uint64_t)c->sup.stop_grace_s * 1000;
    config_unref(c);
    for (size_t i = 0; i < s->w->n; i++) {
        struct sup_slot *ss = &s->slots[i];
        uv_timer_stop(&ss->respawn_timer);
        ss->respawn_pending = false;
        if (ss->proc) {
            set_state(ss, WORKERS_DRAINING);
            uv_process_kill(ss->proc, SIGTERM);
        }
    }
    uv_timer_start(&s->stop_timer, on_stop_grace, grace, 0);
    finish_if_stopped(s);
}

static const char *signame(int signum) { return signum == SIGINT ? "SIGINT" : "SIGTERM"; }

static void begin_drain(struct sup *s, int signum)
{
    if (s->stopping) {
        /* a second SIGTERM/SIGINT: the operator does not want to wait for the drain */
        LOG_WARN("%s again: stopping workers without waiting for the drain", signame(signum));
        begin_stop(s);
        return;
    }
    s->stopping = true;
    struct config *c = cfg_get(s);
    double drain = c->drain_timeout_s;
    config_unref(c);
    LOG_INFO("%s: draining (up to %.1f s), then stopping the workers", signame(signum), drain);
    notify("STOPPING=1");
    atomic_store(&s->w->phase, WORKERS_PHASE_DRAINING);
    notify_status(s);
    for (size_t i = 0; i < s->w->n; i++) {
        uv_timer_stop(&s->slots[i].respawn_timer);
        s->slots[i].respawn_pending = false;
    }
    if (s->w->hooks && s->w->hooks->stop_accepting)
        s->w->hooks->stop_accepting(s->w->hooks_ud);
    s->drain_deadline_ms = uv_now(s->loop) + (uint64_t)(drain * 1000.0);
    on_tick(&s->tick); /* nothing in flight: stop at once */
}

/* ---- reload ---- */

static void policy_from(const struct config *c, struct backoff_policy *p)
{
    p->initial_ms = c->sup.respawn_initial_ms;
    p->max_ms = c->sup.respawn_max_ms;
    p->crash_loop_max = c->sup.crash_loop_max;
    p->window_ms = (uint64_t)c->sup.crash_loop_window_s * 1000;
    p->stable_ms = (uint64_t)c->sup.stable_after_s * 1000;
}

static void reload(struct sup *s)
{
    if (s->stopping)
        return;
    if (!s->config_path) {
        LOG_INFO("SIGHUP: no configuration file to re-read (started without --config)");
    } else {
        notify("RELOADING=1");
        LOG_INFO("SIGHUP: re-reading %s", s->config_path);
        struct config *fresh = NULL;
        int rc = config_load(s->config_path, s->model_dir_override, &fresh);
        if (rc < 0) {
            LOG_ERR("reload refused: %s; the running configuration stays in effect",
                    log_last_error());
            notify("READY=1\nSTATUS=reload refused: the configuration file is invalid (see the "
                   "journal)");
            return;
        }
        sup_apply_overrides(fresh, &s->opt);
        struct config *running = cfg_get(s);
        config_keep_restart_fields(fresh, running);
        config_unref(running);
        config_ptr_set(s->w->config, config_ref(fresh));
        if (s->w->hooks && s->w->hooks->config_changed)
            s->w->hooks->config_changed(s->w->hooks_ud, fresh);
        LOG_INFO("reload: %zu tenants, %zu adapters, limits applied", fresh->n_tenants,
                 fresh->n_adapters);
        config_unref(fresh);
    }
    /* a reload is also the operator's "I fixed it": given-up slots get a fresh start */
    struct config *c = cfg_get(s);
    struct backoff_policy pol;
    policy_from(c, &pol);
    config_unref(c);
    for (size_t i = 0; i < s->w->n; i++) {
        struct sup_slot *ss = &s->slots[i];
        bool was_given_up = atomic_load(&ss->ws->given_up);
        backoff_reset(&ss->backoff, &pol);
        if (was_given_up && !ss->proc && !ss->respawn_pending) {
            atomic_store(&ss->ws->given_up, false);
            LOG_INFO("worker %u: given up before; trying again after the reload", ss->ws->index);
            spawn(ss);
        }
    }
    if (s->notified_ready)
        notify("READY=1");
    notify_status(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct sup *s = h->data;
    if (signum == SIGHUP)
        reload(s);
    else
        begin_drain(s, signum);
}

/* ---- lifecycle ---- */

/* A string field of c replaced by an override (NULL: kept); false when out of memory. */
static bool override_str(char **field, const char *v)
{
    if (!v)
        return true;
    char *d = strdup(v);
    if (!d)
        return false;
    free(*field);
    *field = d;
    return true;
}

void sup_apply_overrides(struct config *c, const struct sup_options *opt)
{
    if (opt->workers_override >= 0)
        c->workers = (uint32_t)opt->workers_override;
    if (opt->no_convert)
        c->convert_disabled = true;
    CHECK(override_str(&c->convert_dtype, opt->convert_dtype) &&
          override_str(&c->convert_cache_dir, opt->cache_dir) &&
          override_str(&c->convert_program, opt->convert_program));
}

/* ---- the model as downloaded: converted before any worker starts ---- */

/* While the converter runs (about once a second): systemd must neither time the start out
 * nor the watchdog fire; the status says why the start is long. */
static void convert_tick(void *ud)
{
    uint64_t *t0 = ud;
    uint64_t usec = 0;
    bool wd = sd_watchdog_enabled(0, &usec) > 0;
    notify("EXTEND_TIMEOUT_USEC=30000000\nSTATUS=converting the model into the cache (%" PRIu64
           " s)%s",
           (uv_hrtime() - *t0) / 1000000000u, wd ? "\nWATCHDOG=1" : "");
}

int sup_prepare_model(struct config *c)
{
    int e;
    enum modelsrc_kind k = modelsrc_kind(c->model_dir, &e);
    if (modelsrc_convertible(k) && !c->convert_disabled) {
        char cache[4096], prog[4096], served[4096];
        int rc;
        if (c->convert_cache_dir)
            snprintf(cache, sizeof cache, "%s", c->convert_cache_dir);
        else if ((rc = modelsrc_cache_dir_default(cache, sizeof cache)) < 0)
            return ERR_FORMAT;
        if (c->convert_program)
            snprintf(prog, sizeof prog, "%s", c->convert_program);
        else if ((rc = modelsrc_find_clocher(prog, sizeof prog)) < 0)
            return ERR_FORMAT;
        uint64_t t0 = uv_hrtime();
        notify("STATUS=converting the model into the cache");
        struct modelsrc_convert mc = {.program = prog, .src = c->model_dir, .cache_dir = cache,
                                      .dtype = c->convert_dtype,
                                      .cache_max_gb = c->convert_cache_max_gb,
                                      .tick = convert_tick, .ud = &t0};
        /* held (never closed) while this daemon runs: no eviction removes what it serves */
        static int served_hold = -1;
        if ((rc = modelsrc_convert(&mc, served, sizeof served, &served_hold)) < 0)
            return rc;
        LOG_INFO("model %s: serving its conversion %s", c->model_dir, served);
        if (!(c->served_model_dir = strdup(served)))
            return -ENOMEM;
    }
    const char *dir = c->served_model_dir ? c->served_model_dir : c->model_dir;
    /* a folder that is not there is the workers' to report, as they load it */
    return modelsrc_kind(dir, &e) == MODELSRC_IEBIN ? gencfg_load(dir, &c->model_sampling) : 0;
}

int sup_create(uv_loop_t *loop, struct workers *w, const struct sup_options *opt,
               struct sup **out)
{
    *out = NULL;
    struct sup *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->magic = SUP_MAGIC;
    s->loop = loop;
    s->w = w;
    s->opt = *opt;
    s->worker_binary = strdup(opt->worker_binary);
    s->config_path = opt->config_path ? strdup(opt->config_path) : NULL;
    s->model_dir_override = opt->model_dir_override ? strdup(opt->model_dir_override) : NULL;
    s->slots = calloc(w->n ? w->n : 1, sizeof *s->slots);
    if (!s->worker_binary || !s->slots || (opt->config_path && !s->config_path) ||
        (opt->model_dir_override && !s->model_dir_override)) {
        sup_destroy(s);
        return -ENOMEM;
    }
    s->opt.worker_binary = s->worker_binary;
    s->opt.config_path = s->config_path;
    s->opt.model_dir_override = s->model_dir_override;

    struct config *c = cfg_get(s);
    struct backoff_policy pol;
    policy_from(c, &pol);
    config_unref(c);

    uv_signal_init(loop, &s->sig_term);
    uv_signal_init(loop, &s->sig_int);
    uv_signal_init(loop, &s->sig_hup);
    uv_timer_init(loop, &s->tick);
    uv_timer_init(loop, &s->watchdog);
    uv_timer_init(loop, &s->stop_timer);
    s->open_handles = 6;
    s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
    s->tick.data = s->watchdog.data = s->stop_timer.data = s;
    for (size_t i = 0; i < w->n; i++) {
        struct sup_slot *ss = &s->slots[i];
        ss->sup = s;
        ss->ws = &w->slots[i];
        backoff_init(&ss->backoff, &pol);
        uv_timer_init(loop, &ss->respawn_timer);
        ss->respawn_timer.data = ss;
        s->open_handles++;
    }
    *out = s;
    return 0;
}

int sup_start(struct sup *s)
{
    int rc;
    if ((rc = uv_signal_start(&s->sig_term, on_signal, SIGTERM)) < 0 ||
        (rc = uv_signal_start(&s->sig_int, on_signal, SIGINT)) < 0 ||
        (rc = uv_signal_start(&s->sig_hup, on_signal, SIGHUP)) < 0) {
        LOG_ERR("uv_signal_start: %s", uv_strerror(rc));
        close_all(s);
        return -EINVAL;
    }
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        /* ping at half the period, from the loop: a stuck loop stops the pings */
        uint64_t ms = usec / 2000 ? usec / 2000 : 1;
        LOG_INFO("systemd watchdog: %" PRIu64 " ms, pinging every %" PRIu64 " ms", usec / 1000, ms);
        uv_timer_start(&s->watchdog, on_watchdog, ms, ms);
    }
    uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
    notify_status(s);
    for (size_t i = 0; i < s->w->n; i++)
        spawn(&s->slots[i]);
    return 0;
}

int sup_exit_code(const struct sup *s) { return s->exit_code; }

void sup_destroy(struct sup *s)
{
    if (!s)
        return;
    CHECK(s->magic == SUP_MAGIC);
    /* main runs the loop until every close callback has run before it frees us */
    CHECK(s->open_handles == 0);
    free(s->worker_binary);
    free(s->config_path);
    free(s->model_dir_override);
    free(s->slots);
    s->magic = 0;
    free(s);
}
