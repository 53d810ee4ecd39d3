/*
 * worker_main.c — clocher-worker: one serving process of clocherd, started by the supervisor
 * (daemon/sup.c) with everything it inherits on its command line (shm/heritage.h is the
 * contract: options, descriptors, environment, exit statuses; docs/DAEMON.md, "Worker
 * lifecycle"):
 *
 *   1. never outlive clocherd (PR_SET_PDEATHSIG), volunteer for the OOM killer;
 *   2. pin: CPUs (sched_setaffinity) and memory (set_mempolicy MPOL_BIND to its node) before
 *      anything is allocated, so the model's private pages, the KV cache and the engine's
 *      threads are all local;
 *   3. attach the shared-memory region inherited as --region-fd and check its generation;
 *   4. create the engine on the model, load the configured adapters, re-read a model cached
 *      in 4 KiB folios in 2 MiB ones unless IE_HUGE_PAGES=0 (hotrepl_hugify_default),
 *      replicate hot tensors into node-local memory if IE_HOT_REPLICATE=1;
 *   5. say READY=1 on the control socket (--control-fd; HERITAGE_CTL_KEYS in shm/heritage.h:
 *      text datagrams READY=1, WATCHDOG=1, HOT_BYTES=n, STATUS=text), then loop (serve.c):
 *      request records → engine_submit/engine_cancel, engine_step, engine events → event
 *      records, WATCHDOG=1 about once a second;
 *   6. SIGTERM: stop taking requests, finish the step, exit 0.
 *
 * Exit status (HERITAGE_EXIT_*): 0 clean stop; 2 fatal configuration or model error (the
 * supervisor does not respawn: a bad model stays bad); 1 anything else (treated as a crash and
 * respawned).
 *
 * NOTES: single-threaded apart from the engine's own pool (serve.h). The SIGTERM handler only
 * sets a flag (nginx's rule); the loop's waits are bounded so the flag is seen promptly.
 */
#include "dtype.h"
#include "err.h"
#include "heritage.h"
#include "log.h"
#include "lora.h"
#include "pool.h"
#include "region.h"
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* The parsed command line, converted to the types the worker uses. */
struct args {
    struct heritage_args h;
    enum lora_pack lora_weights;
    enum dtype kv_dtype; /* the KV cache's element type (docs/KV.md) */
};

static volatile sig_atomic_t g_stop;

static void on_sigterm(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Under systemd (inherited journal stream), "<N>" sets each line's priority. */
static void journal_sink(enum log_level level, const char *msg, void *ud)
{
    static const int prio[] = {3, 4, 6, 7};
    if ((int)level > (int)log_get_level())
        return;
    fprintf(stderr, "<%d>%s: %s\n", prio[level], (const char *)ud, msg);
}

/* heritage_args_parse, then what only the worker knows: the meaning of --lora-weights and
 * --kv-dtype.
 * 0, HERITAGE_HELP, or ERR_USAGE (logged). */
static int parse_args(int argc, char **argv, struct args *a)
{
    int rc = heritage_args_parse(argc, argv, &a->h);
    if (rc == 0 && lora_pack_parse(a->h.lora_weights, &a->lora_weights) != 0)
        rc = ERR_USAGE;
    if (rc == 0 && dtype_kv_from_name(a->h.kv_dtype, &a->kv_dtype) != 0) {
        LOG_ERR("--kv-dtype %s: not a KV element type (f32, f16, bf16, int8 or fp8)",
                a->h.kv_dtype);
        rc = ERR_USAGE;
    }
    enum pool_pin pin;
    if (rc == 0 && pool_pin_parse(a->h.pin, &pin) != 0) {
        LOG_ERR("--pin %s: not none, compact or scatter", a->h.pin);
        rc = ERR_USAGE;
    }
    return rc;
}

/* Step 1: tied to clocherd's life, first in line for the OOM killer. */
static int setup_process(const struct args *a)
{
    /* the supervisor's death must take us with it; the check after the prctl closes the race
     * where it died before the prctl took effect */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        LOG_ERR("prctl(PR_SET_PDEATHSIG): %s", strerror(errno));
        return -errno;
    }
    if (a->h.parent_pid && getppid() != (pid_t)a->h.parent_pid) {
        LOG_ERR("clocherd (pid %d) is already gone", (int)a->h.parent_pid);
        return ERR_STATE;
    }
    /* the loop's short timed waits (the 0.1 ms burst-gathering gap in serve.c) sit on the
     * time to first token; the default 50 µs slack would add half a gap to each. Inherited by
     * the engine's threads, which never sleep on a timeout. */
    if (prctl(PR_SET_TIMERSLACK, 1UL) != 0)
        LOG_WARN("prctl(PR_SET_TIMERSLACK): %s", strerror(errno));
    /* a worker is respawned after an OOM kill; the supervisor holding every stream is not */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "500", 3) != 3)
            LOG_DEBUG("oom_score_adj: %s", strerror(errno));
        close(fd);
    }
    struct sigaction sa = {.sa_handler = on_sigterm};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Step 2: CPUs and memory. Errors here are configuration errors (exit 2). */
static int pin(const struct args *a)
{
    int node = (int)a->h.mem_node; /* -1: no memory binding */
    struct bitmask *cpus = numa_parse_cpustring_all(a->h.cpus);
    if (!cpus) {
        LOG_ERR("--cpus %s: not a CPU list of this machine", a->h.cpus);
        return ERR_RANGE;
    }
    /* numa_sched_setaffinity(0, ...) = sched_setaffinity on this thread; threads created
     * afterwards (the engine's pool) inherit the mask */
    int rc = 0;
    if (numa_sched_setaffinity(0, cpus) < 0) {
        rc = -errno;
        LOG_ERR("sched_setaffinity(%s): %s", a->h.cpus, strerror(errno));
    }
    numa_free_cpumask(cpus);
    if (rc < 0)
        return rc;
    if (node < 0)
        return 0;
    if (numa_available() < 0) {
        LOG_ERR("--mem-node %d: this kernel has no NUMA support", node);
        return ERR_UNSUPPORTED;
    }
    struct bitmask *allowed = numa_get_mems_allowed();
    bool ok = allowed && node <= numa_max_node() &&
              numa_bitmask_isbitset(allowed, (unsigned)node);
    if (allowed)
        numa_free_nodemask(allowed);
    if (!ok) {
        LOG_ERR("--mem-node %d: no such node, or its memory is not allowed to this process",
                node);
        return ERR_RANGE;
    }
    struct bitmask *nodes = numa_allocate_nodemask();
    if (!nodes)
        return -ENOMEM;
    numa_bitmask_setbit(nodes, (unsigned)node);
    /* strict: an allocation that cannot be served locally fails rather than going remote
     * quietly; the KV budget is sized per node */
    numa_set_bind_policy(1);
    errno = 0;
    numa_set_membind(nodes);
    if (errno) {
        rc = -errno;
        LOG_ERR("set_mempolicy(MPOL_BIND, node %d): %s", node, strerror(errno));
    }
    numa_free_nodemask(nodes);
    return rc;
}

/* Step 3: the region, checked against the generation we were told. */
static int attach(const struct args *a, struct shm_region **out)
{
    int rc = shm_region_attach((int)a->h.region_fd, (uint32_t)a->h.generation, out);
    if (rc < 0)
        return rc;
    close((int)a->h.region_fd); /* the mapping does not need it */
    char name[32];
    snprintf(name, sizeof name, "worker %u", (unsigned)a->h.slot);
    shm_region_set_name(*out, name);
    /* The gateway is a thread pool of our parent: its process dying is PDEATHSIG's business
     * and its pid is still checked; a stale gateway heartbeat means a busy gateway, which is
     * not a reason for this worker to quit. */
    shm_region_set_stale_ns(*out, 0);
    return 0;
}

int main(int argc, char **argv)
{
    static char ident[64];
    log_set_ident("clocher-worker");
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == HERITAGE_HELP) {
        heritage_usage(stdout);
        return HERITAGE_EXIT_OK;
    }
    if (rc < 0)
        return HERITAGE_EXIT_FATAL;
    snprintf(ident, sizeof ident, "clocher-worker[%u]", (unsigned)a.h.slot);
    if (getenv("JOURNAL_STREAM"))
        log_set_sink(journal_sink, ident);
    else
        log_set_ident(ident);

    if (setup_process(&a) < 0)
        return HERITAGE_EXIT_FAILURE;
    if (pin(&a) < 0)
        return HERITAGE_EXIT_FATAL;

    struct heritage_env env;
    if (heritage_env_parse(&env) < 0)
        return HERITAGE_EXIT_FATAL;

    struct shm_region *region = NULL;
    if ((rc = attach(&a, &region)) < 0)
        return HERITAGE_EXIT_FATAL; /* not the region we were promised: a supervisor bug */
    struct serve_options so = {
        .model_dir = a.h.model_dir,
        .threads = (unsigned)a.h.threads,
        .kv_budget_bytes = (uint64_t)a.h.kv_budget_mb << 20,
        .max_queue = (uint32_t)a.h.max_queue,
        .max_prompt_tokens = (uint32_t)a.h.max_prompt_tokens,
        .n_adapters = a.h.n_adapters,
        .adapter_names = a.h.adapters_name,
        .adapter_dirs = a.h.adapters_dir,
        .lora_pack = (int)a.lora_weights,
        .kv_dtype = a.kv_dtype,
        .pin = a.h.pin,
        .kv_snapshot_path = a.h.kv_snapshot,
        .kv_snapshot_max_bytes = (uint64_t)(a.h.kv_snapshot_max_mb > 0 ? a.h.kv_snapshot_max_mb
                                                                        : 0) << 20,
        .mem_node = (int)a.h.mem_node,
        .hot_replicate = env.hot_replicate,
        .hot_limit_bytes = env.hot_repl_limit_mb << 20,
        .control_fd = (int)a.h.control_fd,
        .stop = &g_stop,
    };
    struct serve *sv = NULL;
    int status = HERITAGE_EXIT_OK;
    if ((rc = serve_open(&so, region, &sv)) < 0) {
        /* out of memory may pass; a model or adapter that does not load will not */
        status = rc == -ENOMEM ? HERITAGE_EXIT_FAILURE : HERITAGE_EXIT_FATAL;
    } else if (g_stop) {
        LOG_INFO("SIGTERM while loading: stopping");
    } else if (serve_run(sv) < 0) {
        status = HERITAGE_EXIT_FAILURE;
    }
    serve_close(sv);
    shm_region_close(region);
    return status;
}
