/*
 * worker_main.c — clocher-worker: one serving process of clocherd, started by the supervisor
 * (daemon/sup.c) with everything it inherits on its command line (docs/DAEMON.md, "Worker
 * lifecycle"):
 *
 *   1. never outlive clocherd (PR_SET_PDEATHSIG), volunteer for the OOM killer;
 *   2. pin: CPUs (sched_setaffinity) and memory (set_mempolicy MPOL_BIND to its node) before
 *      anything is allocated, so the model's private pages, the KV cache and the engine's
 *      threads are all local;
 *   3. attach the shared-memory region inherited as --region-fd and check its generation;
 *   4. create the engine on the model, load the configured adapters, replicate hot tensors
 *      into node-local memory if IE_HOT_REPLICATE=1;
 *   5. say READY=1 on the control socket (--control-fd; daemon/ctl.h is the protocol: text
 *      datagrams READY=1, WATCHDOG=1, HOT_BYTES=n, STATUS=text), then loop (worker/serve.c):
 *      request records → engine_submit/engine_cancel, engine_step, engine events → event
 *      records, WATCHDOG=1 about once a second;
 *   6. SIGTERM: stop taking requests, finish the step, exit 0.
 *
 * Exit status: 0 clean stop; 2 fatal configuration or model error (the supervisor does not
 * respawn: a bad model stays bad); 1 anything else (treated as a crash and respawned).
 *
 * NOTES: single-threaded apart from the engine's own pool (serve.h). The SIGTERM handler only
 * sets a flag (nginx's rule); the loop's waits are bounded so the flag is seen promptly.
 */
#include "err.h"
#include "log.h"
#include "lora.h"
#include "region.h"
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <numa.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define EXIT_FATAL 2
#define MAX_ADAPTERS 256

struct args {
    unsigned slot;
    uint32_t generation;
    int control_fd;
    int region_fd;
    const char *cpus;      /* "0-7" */
    int mem_node;          /* -1: no memory binding */
    const char *model_dir;
    unsigned threads;
    uint64_t kv_budget_mb;
    uint32_t max_queue;
    uint32_t max_prompt_tokens;
    pid_t parent;
    size_t n_adapters;
    const char *adapter_name[MAX_ADAPTERS];
    const char *adapter_dir[MAX_ADAPTERS];
    enum lora_pack lora_weights;
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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher-worker --slot N --generation G --control-fd FD --region-fd FD\n"
            "                      --cpus LIST [--mem-node N] --model-dir DIR [--threads N]\n"
            "                      [--kv-budget-mb MB] [--max-queue N] [--max-prompt-tokens N]\n"
            "                      [--parent-pid PID] [--adapter NAME=DIR ...]\n"
            "                      [--lora-weights auto|bf16]\n"
            "\n"
            "A clocherd worker: started by clocherd, not by hand (docs/DAEMON.md).\n"
            "Environment: IE_HOT_REPLICATE=1 copies hot tensors to node-local memory,\n"
            "IE_HOT_REPL_LIMIT_MB caps how much.\n");
}

static int parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > max) {
        LOG_ERR("--%s: want an integer in 0..%" PRIu64 ", got \"%s\"", opt, max, s);
        return ERR_USAGE;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    enum { SLOT = 256, GEN, CTL, FD, CPUS, NODE, MODEL, THREADS, KV, QUEUE, PROMPT, PARENT, ADAPTER,
           LORA_WEIGHTS };
    static const struct option opts[] = {
        {"slot", required_argument, NULL, SLOT},
        {"generation", required_argument, NULL, GEN},
        {"control-fd", required_argument, NULL, CTL},
        {"region-fd", required_argument, NULL, FD},
        {"cpus", required_argument, NULL, CPUS},
        {"mem-node", required_argument, NULL, NODE},
        {"model-dir", required_argument, NULL, MODEL},
        {"threads", required_argument, NULL, THREADS},
        {"kv-budget-mb", required_argument, NULL, KV},
        {"max-queue", required_argument, NULL, QUEUE},
        {"max-prompt-tokens", required_argument, NULL, PROMPT},
        {"parent-pid", required_argument, NULL, PARENT},
        {"adapter", required_argument, NULL, ADAPTER},
        {"lora-weights", required_argument, NULL, LORA_WEIGHTS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    a->control_fd = -1;
    a->region_fd = -1;
    a->mem_node = -1;
    a->max_queue = 256;
    a->max_prompt_tokens = 4096;
    bool have_slot = false, have_gen = false;
    int ch, rc = 0;
    uint64_t v;
    while (rc == 0 && (ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case SLOT:
            if ((rc = parse_u64("slot", optarg, 4095, &v)) == 0)
                a->slot = (unsigned)v, have_slot = true;
            break;
        case GEN:
            if ((rc = parse_u64("generation", optarg, UINT32_MAX, &v)) == 0)
                a->generation = (uint32_t)v, have_gen = true;
            break;
        case CTL:
            if ((rc = parse_u64("control-fd", optarg, INT_MAX, &v)) == 0)
                a->control_fd = (int)v;
            break;
        case FD:
            if ((rc = parse_u64("region-fd", optarg, INT_MAX, &v)) == 0)
                a->region_fd = (int)v;
            break;
        case CPUS: a->cpus = optarg; break;
        case NODE:
            if ((rc = parse_u64("mem-node", optarg, 1023, &v)) == 0)
                a->mem_node = (int)v;
            break;
        case MODEL: a->model_dir = optarg; break;
        case THREADS:
            if ((rc = parse_u64("threads", optarg, 1024, &v)) == 0)
                a->threads = (unsigned)v;
            break;
        case KV: rc = parse_u64("kv-budget-mb", optarg, UINT64_C(1) << 24, &a->kv_budget_mb); break;
        case QUEUE:
            if ((rc = parse_u64("max-queue", optarg, 1u << 20, &v)) == 0)
                a->max_queue = (uint32_t)v;
            break;
        case PROMPT:
            if ((rc = parse_u64("max-prompt-tokens", optarg, 1u << 20, &v)) == 0)
                a->max_prompt_tokens = (uint32_t)v;
            break;
        case LORA_WEIGHTS:
            if (lora_pack_parse(optarg, &a->lora_weights) != 0)
                rc = ERR_USAGE;
            break;
        case PARENT:
            if ((rc = parse_u64("parent-pid", optarg, INT_MAX, &v)) == 0)
                a->parent = (pid_t)v;
            break;
        case ADAPTER: {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || !eq[1]) {
                LOG_ERR("--adapter: want NAME=DIR, got \"%s\"", optarg);
                rc = ERR_USAGE;
            } else if (a->n_adapters == MAX_ADAPTERS) {
                LOG_ERR("--adapter: more than %d adapters", MAX_ADAPTERS);
                rc = ERR_USAGE;
            } else {
                *eq = '\0';
                a->adapter_name[a->n_adapters] = optarg;
                a->adapter_dir[a->n_adapters++] = eq + 1;
            }
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return ERR_USAGE;
        }
    }
    if (rc == 0 && optind < argc) {
        LOG_ERR("unexpected argument \"%s\"", argv[optind]);
        rc = ERR_USAGE;
    }
    if (rc == 0 && (!have_slot || !have_gen || a->control_fd < 0 || a->region_fd < 0 || !a->cpus ||
                    !a->model_dir)) {
        LOG_ERR("--slot, --generation, --control-fd, --region-fd, --cpus and --model-dir are "
                "required");
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
    if (a->parent && getppid() != a->parent) {
        LOG_ERR("clocherd (pid %d) is already gone", (int)a->parent);
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
    struct bitmask *cpus = numa_parse_cpustring_all(a->cpus);
    if (!cpus) {
        LOG_ERR("--cpus %s: not a CPU list of this machine", a->cpus);
        return ERR_RANGE;
    }
    /* numa_sched_setaffinity(0, ...) = sched_setaffinity on this thread; threads created
     * afterwards (the engine's pool) inherit the mask */
    int rc = 0;
    if (numa_sched_setaffinity(0, cpus) < 0) {
        rc = -errno;
        LOG_ERR("sched_setaffinity(%s): %s", a->cpus, strerror(errno));
    }
    numa_free_cpumask(cpus);
    if (rc < 0)
        return rc;
    if (a->mem_node < 0)
        return 0;
    if (numa_available() < 0) {
        LOG_ERR("--mem-node %d: this kernel has no NUMA support", a->mem_node);
        return ERR_UNSUPPORTED;
    }
    struct bitmask *allowed = numa_get_mems_allowed();
    bool ok = allowed && a->mem_node <= numa_max_node() &&
              numa_bitmask_isbitset(allowed, (unsigned)a->mem_node);
    if (allowed)
        numa_free_nodemask(allowed);
    if (!ok) {
        LOG_ERR("--mem-node %d: no such node, or its memory is not allowed to this process",
                a->mem_node);
        return ERR_RANGE;
    }
    struct bitmask *nodes = numa_allocate_nodemask();
    if (!nodes)
        return -ENOMEM;
    numa_bitmask_setbit(nodes, (unsigned)a->mem_node);
    /* strict: an allocation that cannot be served locally fails rather than going remote
     * quietly; the KV budget is sized per node */
    numa_set_bind_policy(1);
    errno = 0;
    numa_set_membind(nodes);
    if (errno) {
        rc = -errno;
        LOG_ERR("set_mempolicy(MPOL_BIND, node %d): %s", a->mem_node, strerror(errno));
    }
    numa_free_nodemask(nodes);
    return rc;
}

/* Step 3: the region, checked against the generation we were told. */
static int attach(const struct args *a, struct shm_region **out)
{
    int rc = shm_region_attach(a->region_fd, a->generation, out);
    if (rc < 0)
        return rc;
    close(a->region_fd); /* the mapping does not need it */
    char name[32];
    snprintf(name, sizeof name, "worker %u", a->slot);
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
    if (parse_args(argc, argv, &a) < 0)
        return EXIT_FATAL;
    snprintf(ident, sizeof ident, "clocher-worker[%u]", a.slot);
    if (getenv("JOURNAL_STREAM"))
        log_set_sink(journal_sink, ident);
    else
        log_set_ident(ident);

    if (setup_process(&a) < 0)
        return 1;
    if (pin(&a) < 0)
        return EXIT_FATAL;

    uint64_t limit_mb = 0;
    const char *hot = getenv("IE_HOT_REPLICATE"), *lim = getenv("IE_HOT_REPL_LIMIT_MB");
    if (lim && *lim && parse_u64("IE_HOT_REPL_LIMIT_MB", lim, UINT64_C(1) << 24, &limit_mb) < 0)
        return EXIT_FATAL;

    struct shm_region *region = NULL;
    int rc = attach(&a, &region);
    if (rc < 0)
        return EXIT_FATAL; /* not the region we were promised: a supervisor bug, not a crash */
    struct serve_options so = {
        .model_dir = a.model_dir,
        .threads = a.threads,
        .kv_budget_bytes = a.kv_budget_mb << 20,
        .max_queue = a.max_queue,
        .max_prompt_tokens = a.max_prompt_tokens,
        .n_adapters = a.n_adapters,
        .adapter_names = a.adapter_name,
        .adapter_dirs = a.adapter_dir,
        .lora_pack = (int)a.lora_weights,
        .mem_node = a.mem_node,
        .hot_replicate = hot && strcmp(hot, "1") == 0,
        .hot_limit_bytes = limit_mb << 20,
        .control_fd = a.control_fd,
        .stop = &g_stop,
    };
    struct serve *sv = NULL;
    int status = 0;
    if ((rc = serve_open(&so, region, &sv)) < 0) {
        /* out of memory may pass; a model or adapter that does not load will not */
        status = rc == -ENOMEM ? 1 : EXIT_FATAL;
    } else if (g_stop) {
        LOG_INFO("SIGTERM while loading: stopping");
    } else if (serve_run(sv) < 0) {
        status = 1;
    }
    serve_close(sv);
    shm_region_close(region);
    return status;
}
