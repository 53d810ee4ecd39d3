/*
 * main.c — clocherd, Clocher's inference daemon: one supervisor on a libuv loop (daemon/sup.c)
 * placing one clocher-worker process per NUMA node (or --workers N) and a gRPC gateway in
 * front of them (daemon/gw.c). docs/DAEMON.md is the manual.
 *
 * Exit status: 0 after a clean stop (SIGTERM/SIGINT), 1 on a runtime failure (a listener that
 * cannot bind, out of memory), 2 on a configuration error or when not one worker could start
 * (systemd's RestartPreventExitStatus=2: restarting cannot fix either).
 *
 * NOTES: start-up order matters: configuration and topology are checked before anything is
 * created; the gateway binds its listeners before any worker is spawned (a port in use fails
 * fast); at the end the supervisor stops the loop once every worker has exited, then the
 * gateway and metrics close their handles and the loop runs once more to release them.
 */
#include "clocher_version.h"
#include "config.h"
#include "err.h"
#include "gw.h"
#include "http_srv.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "modelsrc.h"
#include "slice.h"
#include "stats.h"
#include "sup.h"
#include "topo.h"
#include "workers.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <uv.h>

#define WORKER_NAME "clocher-worker"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocherd [OPTIONS]\n"
            "\n"
            "Serves an IEBIN model over gRPC with one worker process per NUMA node.\n"
            "\n"
            "  -c, --config FILE        JSON configuration (docs/DAEMON.md); without it,\n"
            "                           --model-dir is required and every default applies\n"
            "  -m, --model-dir DIR      the model (overrides model_dir)\n"
            "  -w, --workers N          N workers sharing the CPUs (0 = one per NUMA node;\n"
            "                           overrides workers)\n"
            "      --worker-binary PATH the worker program (default: beside clocherd)\n"
            "      --topology-root DIR  read the NUMA topology from a directory shaped like\n"
            "                           /sys/devices/system/node (also $%s)\n"
            "      --check-config       validate the configuration and the model it names,\n"
            "                           and exit\n"
            "      --no-convert         refuse a Hugging Face folder or a GGUF as the model\n"
            "                           (naming the `clocher convert` command) instead of\n"
            "                           converting it once into the cache (convert.enabled)\n"
            "      --cache-dir DIR      the conversion cache (convert.cache_dir; default\n"
            "                           $CACHE_DIRECTORY, $XDG_CACHE_HOME/clocher, ~/.cache/clocher)\n"
            "      --convert-dtype D    convert with `clocher convert --dtype D` (convert.dtype;\n"
            "                           default: the source's own dtypes)\n"
            "      --convert-program P  the clocher program that converts (convert.program;\n"
            "                           default: beside clocherd)\n"
            "      --print-plan         print where each worker would run and exit\n"
            "      --http HOST:PORT     serve the OpenAI-compatible HTTP API there (overrides\n"
            "                           http.listen; docs/HTTP.md)\n"
            "      --log-format FMT     text (default) or json: one JSON object per line (ts,\n"
            "                           level, prog, pid, msg, fields); the workers follow\n"
            "                           (overrides log_format, itself over $%s;\n"
            "                           docs/OPERATIONS.md)\n"
            "  -h, --help               this text\n"
            "      --version            the version\n"
            "\n"
            "Signals: SIGTERM/SIGINT drain and stop (twice: stop without draining), SIGHUP\n"
            "re-reads the configuration. Exit status: 0 clean stop, 1 failure, 2 configuration\n"
            "error or no worker could start.\n",
            TOPO_ENV_ROOT, LOG_ENV_FORMAT);
}

/* Under systemd, stderr is a journal stream: a "<N>" prefix sets each line's priority. */
static void journal_sink(enum log_level level, const char *msg, void *ud)
{
    (void)ud;
    static const int prio[] = {3 /* err */, 4 /* warning */, 6 /* info */, 7 /* debug */};
    if ((int)level > (int)log_get_level())
        return;
    fprintf(stderr, "<%d>%s\n", prio[level], msg);
}

/*
 * A conversion can take minutes: when one is coming, the listeners are tried first, so that a
 * port another process holds is reported now rather than after it (the gateway and the HTTP
 * servers check again when they bind). 0, or the first failure (logged naming the key).
 */
static int probe_listeners_before_converting(const struct config *c)
{
    int e;
    if (!modelsrc_convertible(modelsrc_kind(c->model_dir, &e)) || c->convert_disabled)
        return 0;
    int rc = 0;
    if (c->listen_tcp && (rc = http_srv_probe("listen.tcp", c->listen_tcp)) < 0)
        return rc;
    if (c->http_listen && (rc = http_srv_probe("http.listen", c->http_listen)) < 0)
        return rc;
    if (c->metrics_listen && (rc = http_srv_probe("metrics.listen", c->metrics_listen)) < 0)
        return rc;
    if (c->listen_unix && (rc = gw_unix_free(c->listen_unix)) < 0)
        return rc;
    return 0;
}

/*
 * The model the configuration names. Always: not a source `clocher convert` reads (a Hugging
 * Face folder, a GGUF or another file: refused with the command to run, modelsrc.h). With
 * `full` (--check-config): also an existing IEBIN folder whose manifest is JSON saying
 * "format": "iebin". A start leaves a missing or broken folder to the workers, which say what
 * is wrong with it as they load it (and the supervisor then that no worker could start).
 * A Hugging Face folder or a GGUF is converted at start (sup_prepare_model) unless
 * convert.enabled is false: --check-config then checks that the converter and the cache
 * folder can be found. 0 or a negative code (logged).
 */
static int check_model(const struct config *c, bool from_option, bool full)
{
    const char *what = from_option ? "--model-dir" : "model_dir";
    int e;
    enum modelsrc_kind k = modelsrc_kind(c->model_dir, &e);
    if (modelsrc_convertible(k) && !c->convert_disabled) {
        char cache[4096], prog[4096];
        if (!full)
            return 0;
        if (!c->convert_cache_dir && modelsrc_cache_dir_default(cache, sizeof cache) < 0)
            return ERR_FORMAT;
        if (c->convert_program && access(c->convert_program, X_OK) != 0) {
            int err = errno;
            LOG_ERR("the model converter %s (convert.program, --convert-program): %s",
                    c->convert_program, strerror(err));
            return ERR_FORMAT;
        }
        if (!c->convert_program && modelsrc_find_clocher(prog, sizeof prog) < 0)
            return ERR_FORMAT;
        printf("model %s (%s): %s, converted at start into the cache %s unless already there\n",
               c->model_dir, what, k == MODELSRC_GGUF ? "a GGUF file" : "a Hugging Face folder",
               c->convert_cache_dir ? c->convert_cache_dir : cache);
        return 0;
    }
    bool convertible = k == MODELSRC_HF || k == MODELSRC_GGUF || k == MODELSRC_FILE;
    if (!full && !convertible)
        return 0;
    int rc = modelsrc_check(c->model_dir, what);
    if (rc < 0 || !full)
        return rc;
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/model.ie.json", c->model_dir);
    json_error_t je;
    json_t *m = json_load_file(p, 0, &je);
    if (!m) {
        LOG_ERR("model %s (%s): model.ie.json: line %d: %s", c->model_dir, what, je.line,
                je.text);
        return ERR_FORMAT;
    }
    const char *fmt = json_string_value(json_object_get(m, "format"));
    rc = fmt && strcmp(fmt, "iebin") == 0 ? 0 : ERR_FORMAT;
    if (rc < 0)
        LOG_ERR("model %s (%s): model.ie.json is not an IEBIN manifest (\"format\": \"iebin\" "
                "missing; docs/IEBIN.md)",
                c->model_dir, what);
    json_decref(m);
    return rc;
}

/* The worker program: the option, the configuration, then beside us (installed: libexec). */
static int find_worker(const char *opt, const struct config *c, char *out, size_t cap)
{
    if (opt || c->worker_binary) {
        const char *p = opt ? opt : c->worker_binary;
        if (access(p, X_OK) != 0) {
            int e = errno;
            LOG_ERR("worker binary %s%s: %s", p, opt ? "" : " (worker_binary)", strerror(e));
            return -e;
        }
        snprintf(out, cap, "%s", p);
        return 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        int e = errno;
        LOG_ERR("readlink(/proc/self/exe): %s", strerror(e));
        return -e;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    *slash = '\0';
    static const char *const rel[] = {"", "/../libexec/clocher", "/../worker"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        int w = snprintf(out, cap, "%s%s/" WORKER_NAME, self, rel[i]);
        if (w > 0 && (size_t)w < cap && access(out, X_OK) == 0)
            return 0;
    }
    LOG_ERR("cannot find %s beside %s (nor in ../libexec/clocher): give --worker-binary or "
            "worker_binary",
            WORKER_NAME, self);
    return -ENOENT;
}

/* Logs in format f from now on, and so do the workers (started with our environment). */
static int use_log_format(enum log_format f)
{
    log_set_format(f);
    const char *name = f == LOG_FORMAT_JSON ? "json" : "text";
    if (setenv(LOG_ENV_FORMAT, name, 1) != 0) {
        int e = errno;
        LOG_ERR("setenv(%s): %s", LOG_ENV_FORMAT, strerror(e));
        return -e;
    }
    return 0;
}

int main(int argc, char **argv)
{
    enum { OPT_WORKER_BIN = 256, OPT_TOPO, OPT_CHECK, OPT_PLAN, OPT_VERSION, OPT_HTTP,
           OPT_LOG_FORMAT, OPT_NO_CONVERT, OPT_CACHE_DIR, OPT_CONVERT_DTYPE, OPT_CONVERT_PROG };
    (void)slice_request(SLICE_LATENCY_NS); /* before gRPC and libuv start their threads */
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"model-dir", required_argument, NULL, 'm'},
        {"workers", required_argument, NULL, 'w'},
        {"worker-binary", required_argument, NULL, OPT_WORKER_BIN},
        {"topology-root", required_argument, NULL, OPT_TOPO},
        {"check-config", no_argument, NULL, OPT_CHECK},
        {"print-plan", no_argument, NULL, OPT_PLAN},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"http", required_argument, NULL, OPT_HTTP},
        {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
        {"no-convert", no_argument, NULL, OPT_NO_CONVERT},
        {"cache-dir", required_argument, NULL, OPT_CACHE_DIR},
        {"convert-dtype", required_argument, NULL, OPT_CONVERT_DTYPE},
        {"convert-program", required_argument, NULL, OPT_CONVERT_PROG},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *model_dir = NULL, *worker_opt = NULL, *http_opt = NULL;
    const char *topo_root = getenv(TOPO_ENV_ROOT);
    bool check_only = false, plan_only = false, log_format_given = false;
    int workers_override = -1;
    /* the conversion cache's overrides; paths made absolute (a reload must not depend on the
     * working directory) */
    bool no_convert = false;
    const char *convert_dtype = NULL;
    char cache_dir[PATH_MAX] = "", convert_prog[PATH_MAX] = "";

    log_set_ident("clocherd");
    if (getenv("JOURNAL_STREAM"))
        log_set_sink(journal_sink, NULL);

    int ch;
    while ((ch = getopt_long(argc, argv, "c:m:w:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': config_path = optarg; break;
        case 'm': model_dir = optarg; break;
        case 'w': {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || v < 0 || v > CONFIG_MAX_WORKERS) {
                fprintf(stderr, "clocherd: --workers: want an integer in 0..%d, got \"%s\"\n",
                        CONFIG_MAX_WORKERS, optarg);
                return SUP_EXIT_FATAL;
            }
            workers_override = (int)v;
            break;
        }
        case OPT_WORKER_BIN: worker_opt = optarg; break;
        case OPT_TOPO: topo_root = optarg; break;
        case OPT_CHECK: check_only = true; break;
        case OPT_PLAN: plan_only = true; break;
        case 'h': usage(stdout); return 0;
        case OPT_HTTP: http_opt = optarg; break;
        case OPT_VERSION: printf("clocherd %s\n", CLOCHER_VERSION); return 0;
        case OPT_LOG_FORMAT: {
            enum log_format f;
            if (log_format_parse(optarg, &f) < 0) {
                fprintf(stderr, "clocherd: --log-format: want text or json, got \"%s\"\n",
                        optarg);
                return SUP_EXIT_FATAL;
            }
            if (use_log_format(f) < 0)
                return SUP_EXIT_FAILURE;
            log_format_given = true;
            break;
        }
        case OPT_NO_CONVERT: no_convert = true; break;
        case OPT_CONVERT_DTYPE: {
            enum dtype t;
            if (!config_convert_dtype_ok(optarg, &t)) {
                fprintf(stderr, "clocherd: --convert-dtype: want a `clocher convert --dtype` "
                                "(f32, f16, bf16, int8, int4, q4_k, ...), got \"%s\"\n", optarg);
                return SUP_EXIT_FATAL;
            }
            convert_dtype = optarg;
            break;
        }
        case OPT_CACHE_DIR:
        case OPT_CONVERT_PROG: {
            char *dst = ch == OPT_CACHE_DIR ? cache_dir : convert_prog;
            char cwd[PATH_MAX];
            int w = optarg[0] == '/' || !getcwd(cwd, sizeof cwd)
                        ? snprintf(dst, PATH_MAX, "%s", optarg)
                        : snprintf(dst, PATH_MAX, "%s/%s", cwd, optarg);
            if (!*optarg || w >= PATH_MAX) {
                fprintf(stderr, "clocherd: %s: want a path, got \"%s\"\n",
                        ch == OPT_CACHE_DIR ? "--cache-dir" : "--convert-program", optarg);
                return SUP_EXIT_FATAL;
            }
            break;
        }
        default: usage(stderr); return SUP_EXIT_FATAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "clocherd: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return SUP_EXIT_FATAL;
    }
    if (topo_root && !*topo_root)
        topo_root = NULL;

    /* ---- configuration and placement: all checked before anything starts ---- */
    struct config *cfg = NULL;
    int rc;
    if (config_path) {
        rc = config_load(config_path, model_dir, &cfg);
    } else if (model_dir) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) {
            int e = errno;
            LOG_ERR("getcwd: %s", strerror(e));
            return SUP_EXIT_FAILURE;
        }
        rc = config_parse("(defaults)", cwd, "{}", 2, model_dir, &cfg);
    } else {
        fprintf(stderr, "clocherd: give --config FILE or --model-dir DIR\n");
        usage(stderr);
        return SUP_EXIT_FATAL;
    }
    if (rc < 0)
        return SUP_EXIT_FATAL; /* the reason was logged where it was found */
    /* the key: unless --log-format said otherwise (the flag wins) */
    if (!log_format_given && cfg->log_format >= 0 &&
        use_log_format((enum log_format)cfg->log_format) < 0) {
        config_unref(cfg);
        return SUP_EXIT_FAILURE;
    }
    struct sup_options so = {.config_path = cfg->path && *cfg->path ? cfg->path : NULL,
                             .model_dir_override = model_dir,
                             .workers_override = workers_override,
                             .no_convert = no_convert,
                             .convert_dtype = convert_dtype,
                             .cache_dir = cache_dir[0] ? cache_dir : NULL,
                             .convert_program = convert_prog[0] ? convert_prog : NULL};
    sup_apply_overrides(cfg, &so);
    /* --print-plan alone is about placement: it may name a model that is not here */
    if ((check_only || !plan_only) && check_model(cfg, model_dir != NULL, check_only) < 0) {
        config_unref(cfg);
        return SUP_EXIT_FATAL;
    }
    if (http_opt) {
        char *l = strdup(http_opt);
        if (!l)
            return SUP_EXIT_FAILURE;
        free(cfg->http_listen);
        cfg->http_listen = l;
    }

    struct topo *topo = NULL;
    struct topo_plan *plan = NULL;
    int exit_code = SUP_EXIT_FATAL;
    if ((rc = topo_discover(topo_root, &topo)) < 0 ||
        (rc = topo_plan_create(topo, cfg->workers, &plan)) < 0)
        goto out_cfg;
    /* a fake topology describes another machine: its nodes may not exist here */
    so.numa = topo->numa && !topo_root;

    if (plan_only || check_only) {
        if (plan_only) {
            printf("%zu workers (%s)\n", plan->n,
                   cfg->workers ? "--workers/workers" : "one per NUMA node");
            for (size_t i = 0; i < plan->n; i++) {
                char cpus[1024];
                if (topo_cpulist_format(plan->shares[i].cpus, plan->shares[i].n_cpus, cpus,
                                        sizeof cpus) < 0)
                    snprintf(cpus, sizeof cpus, "(%zu CPUs)", plan->shares[i].n_cpus);
                printf("worker %zu: node %d, cpus %s\n", i, plan->shares[i].node, cpus);
            }
        }
        if (check_only)
            printf("configuration ok: model %s, %zu workers, %zu tenants, %zu adapters\n",
                   cfg->model_dir, plan->n, cfg->n_tenants, cfg->n_adapters);
        exit_code = 0;
        goto out_plan;
    }

    char worker_bin[PATH_MAX];
    if (find_worker(worker_opt, cfg, worker_bin, sizeof worker_bin) < 0)
        goto out_plan;
    so.worker_binary = worker_bin;

    /* ---- the model: a Hugging Face folder or a GGUF is converted first (the cache) ---- */
    if ((rc = probe_listeners_before_converting(cfg)) < 0) {
        exit_code = SUP_EXIT_FAILURE; /* as the listeners' own failure: it may clear later */
        goto out_plan;
    }
    if ((rc = sup_prepare_model(cfg)) < 0) {
        if (rc == ERR_CANCELLED) {
            LOG_INFO("stopped while converting the model");
            exit_code = SUP_EXIT_OK;
        } else {
            /* the source or its sampling defaults refused, the converter not found: a
             * restart would meet the same */
            bool fatal = rc == ERR_FORMAT || rc == ERR_RANGE || rc == -ENOENT || rc == -EACCES;
            exit_code = fatal ? SUP_EXIT_FATAL : SUP_EXIT_FAILURE;
        }
        goto out_plan;
    }

    /* ---- the daemon ---- */
    /* a client gone mid-write must be an error on that socket, not the end of the daemon */
    signal(SIGPIPE, SIG_IGN);
    exit_code = SUP_EXIT_FAILURE;
    uv_loop_t loop;
    if ((rc = uv_loop_init(&loop)) < 0) {
        LOG_ERR("uv_loop_init: %s", uv_strerror(rc));
        goto out_plan;
    }
    struct config_ptr cptr;
    config_ptr_init(&cptr, cfg);
    cfg = NULL; /* cptr holds it now */
    struct workers *w = NULL;
    struct sup *sup = NULL;
    struct stats *stats = NULL;
    struct gw *gw = NULL;
    struct metrics *metrics = NULL;
    struct http *http = NULL;
    if (workers_create(plan, &cptr, &w) < 0)
        goto out_loop;
    /* the gateway's counters: made here, lent to the gateway (writer) and the metrics endpoint
     * (reader) through w->stats, freed after both are gone */
    if (stats_create(w->n, &stats) < 0)
        goto out_workers;
    w->stats = stats;
    if (cptr.cur->access_log && stats_open_access_log(stats, cptr.cur->access_log) < 0)
        goto out_workers;
    if (gw_create(w, &loop, &gw) < 0)
        goto out_workers;
    if (metrics_create(w, &loop, &metrics) < 0)
        goto out_workers;
    metrics_set_gateway(metrics, gw);
    if (http_create(w, gw, &loop, &http) < 0)
        goto out_workers;
    if (sup_create(&loop, w, &so, &sup) < 0 || sup_start(sup) < 0)
        goto out_workers;
    LOG_INFO("clocherd %s: %zu workers, model %s", CLOCHER_VERSION, w->n,
             cptr.cur->model_dir);

    uv_run(&loop, UV_RUN_DEFAULT);
    /* the loop has stopped, and with it the signal watchers: another SIGTERM now (an impatient
     * operator, systemd repeating itself) must not kill the teardown with the default action */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    exit_code = sup_exit_code(sup);
    if (exit_code == 0)
        LOG_INFO("stopped cleanly");

out_workers:
    http_destroy(http);
    metrics_destroy(metrics);
    gw_destroy(gw);
    /* let the close callbacks of whatever was torn down run */
    uv_run(&loop, UV_RUN_DEFAULT);
    sup_destroy(sup);
    workers_destroy(w);
    stats_destroy(stats);
out_loop:
    if (uv_loop_close(&loop) != 0)
        LOG_WARN("the event loop still had open handles at exit");
    config_ptr_fini(&cptr);
out_plan:
    topo_plan_destroy(plan);
    topo_destroy(topo);
out_cfg:
    config_unref(cfg);
    return exit_code;
}
