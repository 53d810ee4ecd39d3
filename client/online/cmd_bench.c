/*
 * cmd_bench.c — `clocher bench`: N concurrent Generate streams against clocherd for T seconds
 * or M requests; reports throughput, TTFT / TPOT / end-to-end percentiles (client-side clock)
 * and errors by gRPC status, as text or one JSON line.
 *
 * Measures, per request, on this process's monotonic clock: TTFT = call start → first message
 * carrying a token; TPOT = (end-to-end − TTFT) / (tokens − 1) when tokens > 1; end-to-end =
 * call start → status. With --duration, no request starts after the time is up and the ones
 * running are allowed to finish (they count); the wall time runs to the last one's end.
 *
 * NOTES: one thread per stream, all on one channel (thread-safe); each thread appends to its
 * own sample array, merged after join, so the hot path takes no lock. The request counter and
 * the stop flag are atomics.
 *
 * Exit codes (cmds.h): 0 every request succeeded; 1 local failure; 2 usage; 5 daemon
 * unreachable; 6 some requests failed (counted by status in the report).
 */
#include "cmds.h"

#include "err.h"
#include "genreq.h"
#include "mono.h"
#include "pct.h"
#include "rpc.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONCURRENCY 1024
#define N_CODES 17 /* gRPC status codes 0..16; others counted as UNKNOWN */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher bench [OPTIONS] [PROMPT...]\n"
            "\n"
            "Runs --concurrency Generate streams at once against clocherd, each starting a new\n"
            "request when its previous one ends, for --duration seconds or --requests requests\n"
            "(default: 10 s), with PROMPT (the arguments joined by spaces) or --prompt-ids.\n"
            "Reports requests/s, generated tokens/s, TTFT, TPOT and end-to-end latency\n"
            "percentiles (p50/p95/p99, measured by this client) and errors by gRPC status.\n"
            "\n"
            "  -c, --concurrency N  streams at once, 1..%d (default 1)\n"
            "  -d, --duration S     start requests for S seconds (running ones then finish)\n"
            "  -n, --requests M     run M requests in all (instead of --duration)\n"
            "  --warmup W           first run W requests that are not measured (connection,\n"
            "                       client start-up and the daemon's caches warm up)\n"
            "  --json               one JSON line instead of the text report\n"
            "  -h, --help           this help\n"
            "\n%s\n%s\n"
            "exit status: 0 every request succeeded, 1 local failure, 2 usage,\n"
            "             5 daemon unreachable, 6 some requests failed (counted in the report)\n",
            MAX_CONCURRENCY, GENREQ_OPTIONS_HELP, RPC_OPTIONS_HELP);
}

struct sample {
    double ttft_ms, tpot_ms, e2e_ms; /* tpot_ms NAN when fewer than 2 tokens */
    double server_ttft_ms;           /* the worker's own TTFT (the last message's timings): the
                                      * difference to ttft_ms is gRPC + gateway + rings */
    uint32_t tokens, prompt_tokens;
    int code;                        /* gRPC status; -1 for a local failure */
};

struct bench {
    struct rpc_client *c;
    const genreq_t *req;
    long max_requests;  /* -1: run until stop_at */
    double stop_at;
    atomic_long started;
    atomic_bool stop;   /* set when the run is abandoned (a thread could not start) */
};

struct worker {
    pthread_t th;
    struct bench *b;
    struct sample *v;
    size_t n, cap;
    int err;            /* -ENOMEM: samples lost */
};

static void run_one(struct bench *b, struct sample *s)
{
    memset(s, 0, sizeof *s);
    s->tpot_ms = NAN;
    s->server_ttft_ms = NAN;
    double t0 = mono_sec(), t_first = 0;
    struct rpc_stream *st;
    int rc = rpc_stream_open(b->c, RPC_M_GENERATE, &b->req->base, -1, &st);
    while (rc == 0) {
        ProtobufCMessage *m;
        int r = rpc_stream_next(st, &clocher__v1__generate_response__descriptor, &m);
        if (r <= 0) {
            rc = r;
            break;
        }
        const Clocher__V1__GenerateResponse *g = (const void *)m;
        if (g->n_token_ids && !t_first)
            t_first = mono_sec();
        s->tokens += (uint32_t)g->n_token_ids;
        if (g->usage)
            s->prompt_tokens = g->usage->prompt_tokens;
        if (g->timings && g->timings->has_ttft_ms)
            s->server_ttft_ms = g->timings->ttft_ms;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    struct rpc_status status;
    int crc = rpc_stream_close(st, &status);
    double t1 = mono_sec();
    if (rc == 0)
        rc = crc;
    s->code = rc == 0 ? 0 : rc == RPC_ERR_STATUS ? status.code : -1;
    s->e2e_ms = (t1 - t0) * 1e3;
    s->ttft_ms = t_first ? (t_first - t0) * 1e3 : NAN;
    if (t_first && s->tokens > 1)
        s->tpot_ms = (t1 - t_first) * 1e3 / (double)(s->tokens - 1);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct bench *b = w->b;
    for (;;) {
        long k = atomic_fetch_add(&b->started, 1);
        if (atomic_load(&b->stop))
            break;
        if (b->max_requests >= 0 ? k >= b->max_requests : mono_sec() >= b->stop_at)
            break;
        if (w->n == w->cap) {
            size_t nc = w->cap ? w->cap * 2 : 256;
            struct sample *nv = realloc(w->v, nc * sizeof *nv);
            if (!nv) {
                w->err = -ENOMEM;
                break;
            }
            w->v = nv;
            w->cap = nc;
        }
        run_one(b, &w->v[w->n++]);
    }
    return NULL;
}

struct dist {
    size_t n;
    double mean, p50, p95, p99, max;
};

/* The distribution of field values (NANs skipped); v is scratch space of n doubles. */
static struct dist distribution(const struct sample *s, size_t n, size_t off, double *v)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i].code != 0)
            continue;
        double x = *(const double *)((const char *)&s[i] + off);
        if (!isnan(x))
            v[k++] = x;
    }
    pct_sort(v, k);
    struct dist d = {k, pct_mean(v, k), pct_of(v, k, 50), pct_of(v, k, 95), pct_of(v, k, 99),
                     pct_of(v, k, 100)};
    return d;
}

static void json_num(FILE *f, const char *key, double x, bool comma)
{
    if (isnan(x))
        fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
    else
        fprintf(f, "\"%s\":%.3f%s", key, x, comma ? "," : "");
}

static void print_dist_json(FILE *f, const char *key, const struct dist *d)
{
    fprintf(f, "\"%s\":{\"n\":%zu,", key, d->n);
    json_num(f, "mean", d->mean, true);
    json_num(f, "p50", d->p50, true);
    json_num(f, "p95", d->p95, true);
    json_num(f, "p99", d->p99, true);
    json_num(f, "max", d->max, false);
    fprintf(f, "}");
}

static void print_dist_text(FILE *f, const char *name, const struct dist *d)
{
    if (d->n == 0) {
        fprintf(f, "%-9s -\n", name);
        return;
    }
    fprintf(f, "%-9s mean %9.2f  p50 %9.2f  p95 %9.2f  p99 %9.2f  max %9.2f  (n=%zu)\n", name,
            d->mean, d->p50, d->p95, d->p99, d->max, d->n);
}

static int parse_num(const char *flag, const char *arg, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "clocher bench: %s: expected a number in %g..%g, got '%s'\n", flag, lo,
                hi, arg);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 0);
    double concurrency = 1, duration = -1, requests = -1, warmup = 0;
    bool json = false;
    genreq_t *req = genreq_new();
    if (!req)
        return CMD_EXIT_FAIL;
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        GENREQ_LONG_OPTIONS,
        {"concurrency", required_argument, NULL, 'c'},
        {"duration", required_argument, NULL, 'd'},
        {"requests", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt, ret = CMD_EXIT_USAGE;
    char err[256];
    struct worker *ws = NULL;
    struct bench b = {0};
    char *prompt = NULL;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":c:d:n:h", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "bench", opt, optarg);
        if (rc < 0)
            goto out;
        if (rc > 0)
            continue;
        rc = genreq_opt_set(req, opt, optarg, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "clocher bench: %s\n", err);
            goto out;
        }
        if (rc > 0)
            continue;
        switch (opt) {
        case 'c':
            if (parse_num("--concurrency", optarg, 1, MAX_CONCURRENCY, &concurrency) < 0 ||
                concurrency != floor(concurrency)) {
                fprintf(stderr, "clocher bench: --concurrency: a whole number, please\n");
                goto out;
            }
            break;
        case 'd':
            if (parse_num("--duration", optarg, 0.001, 86400 * 7, &duration) < 0)
                goto out;
            break;
        case 'n':
            if (parse_num("--requests", optarg, 1, 1e9, &requests) < 0 ||
                requests != floor(requests))
                goto out;
            break;
        case 'w':
            if (parse_num("--warmup", optarg, 0, 1e6, &warmup) < 0 || warmup != floor(warmup))
                goto out;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            usage(stdout);
            ret = CMD_EXIT_OK;
            goto out;
        default: /* ':' (an option without its value) or '?' */
            rpc_opt_error("bench", opt, argv);
            goto out;
        }
    }
    if (duration >= 0 && requests >= 0) {
        fprintf(stderr, "clocher bench: --duration or --requests, not both\n");
        goto out;
    }
    if (duration < 0 && requests < 0)
        duration = 10;
    if (req->input_case == CLOCHER__V1__GENERATE_REQUEST__INPUT__NOT_SET) {
        if (optind == argc) {
            fprintf(stderr, "clocher bench: no prompt (give PROMPT or --prompt-ids)\n");
            goto out;
        }
        size_t len = 0;
        for (int i = optind; i < argc; i++)
            len += strlen(argv[i]) + 1;
        if (!(prompt = malloc(len))) {
            ret = CMD_EXIT_FAIL;
            goto out;
        }
        prompt[0] = '\0';
        for (int i = optind; i < argc; i++) {
            if (i > optind)
                strcat(prompt, " ");
            strcat(prompt, argv[i]);
        }
        if (genreq_set_prompt(req, prompt, strlen(prompt)) < 0) {
            ret = CMD_EXIT_FAIL;
            goto out;
        }
    } else if (optind < argc) {
        fprintf(stderr, "clocher bench: give a text prompt or --prompt-ids, not both\n");
        goto out;
    }

    int rc = rpc_client_create("bench", &o, &b.c);
    if (rc < 0) {
        ret = rpc_exit_code(rc);
        goto out;
    }
    size_t nw = (size_t)concurrency;
    if (!(ws = calloc(nw, sizeof *ws))) {
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    b.req = req;
    if (warmup > 0) {
        /* not measured: the channel connects, gRPC's threads start, the daemon's caches warm */
        b.max_requests = (long)warmup;
        atomic_init(&b.started, 0);
        atomic_init(&b.stop, false);
        size_t n_up = 0;
        for (; n_up < nw; n_up++) {
            ws[n_up].b = &b;
            if (pthread_create(&ws[n_up].th, NULL, worker_main, &ws[n_up]) != 0)
                break;
        }
        for (size_t i = 0; i < n_up; i++) {
            pthread_join(ws[i].th, NULL);
            free(ws[i].v);
            ws[i] = (struct worker){0};
        }
    }
    b.max_requests = requests >= 0 ? (long)requests : -1;
    double t0 = mono_sec();
    b.stop_at = t0 + (duration >= 0 ? duration : 0);
    atomic_init(&b.started, 0);
    atomic_init(&b.stop, false);
    size_t started = 0;
    for (; started < nw; started++) {
        ws[started].b = &b;
        if (pthread_create(&ws[started].th, NULL, worker_main, &ws[started]) != 0) {
            fprintf(stderr, "clocher bench: cannot start thread %zu\n", started);
            atomic_store(&b.stop, true); /* the others stop before their next request */
            break;
        }
    }
    for (size_t i = 0; i < started; i++)
        pthread_join(ws[i].th, NULL);
    double wall = mono_sec() - t0;
    if (started < nw) {
        ret = CMD_EXIT_FAIL;
        goto out;
    }

    /* merge */
    size_t total = 0;
    for (size_t i = 0; i < nw; i++) {
        total += ws[i].n;
        if (ws[i].err) {
            fprintf(stderr, "clocher bench: out of memory recording samples\n");
            ret = CMD_EXIT_FAIL;
            goto out;
        }
    }
    struct sample *all = malloc((total ? total : 1) * sizeof *all);
    double *scratch = malloc((total ? total : 1) * sizeof *scratch);
    if (!all || !scratch) {
        free(all);
        free(scratch);
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < nw; i++) {
        memcpy(all + k, ws[i].v, ws[i].n * sizeof *all);
        k += ws[i].n;
    }
    size_t by_code[N_CODES + 1] = {0}; /* [N_CODES]: local failures */
    uint64_t tokens = 0, prompt_tokens = 0;
    size_t ok = 0;
    for (size_t i = 0; i < total; i++) {
        int c = all[i].code;
        by_code[c < 0 ? N_CODES : c < N_CODES ? c : 2 /* UNKNOWN */]++;
        if (c == 0) {
            ok++;
            tokens += all[i].tokens;
            prompt_tokens += all[i].prompt_tokens;
        }
    }
    struct dist ttft = distribution(all, total, offsetof(struct sample, ttft_ms), scratch);
    struct dist tpot = distribution(all, total, offsetof(struct sample, tpot_ms), scratch);
    struct dist e2e = distribution(all, total, offsetof(struct sample, e2e_ms), scratch);
    struct dist sttft = distribution(all, total, offsetof(struct sample, server_ttft_ms), scratch);
    size_t failed = total - ok;
    double req_s = wall > 0 ? (double)ok / wall : NAN, tok_s = wall > 0 ? (double)tokens / wall : NAN;

    if (json) {
        printf("{\"concurrency\":%zu,\"requests\":%zu,\"ok\":%zu,\"failed\":%zu,", nw, total, ok,
               failed);
        json_num(stdout, "wall_s", wall, true);
        json_num(stdout, "requests_per_s", req_s, true);
        printf("\"tokens\":%llu,\"prompt_tokens\":%llu,", (unsigned long long)tokens,
               (unsigned long long)prompt_tokens);
        json_num(stdout, "tokens_per_s", tok_s, true);
        print_dist_json(stdout, "ttft_ms", &ttft);
        printf(",");
        print_dist_json(stdout, "tpot_ms", &tpot);
        printf(",");
        print_dist_json(stdout, "e2e_ms", &e2e);
        printf(",");
        print_dist_json(stdout, "server_ttft_ms", &sttft);
        printf(",\"errors\":{");
        bool first = true;
        for (int c = 1; c <= N_CODES; c++) {
            if (!by_code[c])
                continue;
            printf("%s\"%s\":%zu", first ? "" : ",",
                   c == N_CODES ? "CLIENT" : rpc_status_name(c), by_code[c]);
            first = false;
        }
        printf("}}\n");
    } else {
        printf("bench: %zu streams, %zu requests in %.2f s: %zu ok, %zu failed\n", nw, total, wall,
               ok, failed);
        printf("throughput: %.2f requests/s, %.1f generated tokens/s (%llu tokens, %llu prompt)\n",
               req_s, tok_s, (unsigned long long)tokens, (unsigned long long)prompt_tokens);
        printf("latency (ms, successful requests):\n");
        print_dist_text(stdout, "  ttft", &ttft);
        print_dist_text(stdout, "  tpot", &tpot);
        print_dist_text(stdout, "  e2e", &e2e);
        print_dist_text(stdout, "  ttft in the worker", &sttft);
        if (failed) {
            printf("errors:");
            for (int c = 1; c <= N_CODES; c++)
                if (by_code[c])
                    printf(" %s %zu", c == N_CODES ? "CLIENT" : rpc_status_name(c), by_code[c]);
            printf("\n");
        }
    }
    free(all);
    free(scratch);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "clocher bench: writing to standard output: %s\n", strerror(errno));
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    ret = failed ? CMD_EXIT_REFUSED : CMD_EXIT_OK;
out:
    if (ws)
        for (size_t i = 0; i < (size_t)concurrency; i++)
            free(ws[i].v);
    free(ws);
    rpc_client_destroy(b.c);
    free(prompt);
    genreq_free(req);
    return ret;
}
