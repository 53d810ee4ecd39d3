/*
 * http_vllm.c — vllm:* metric families from stats_render's clocher_* text (see http_vllm.h),
 * and the process_* families Prometheus clients conventionally export.
 *
 * NOTES: the clocher_* text is read back rather than struct stats because stats.c keeps its
 * series private; what is summed is exactly what a scrape shows. Histograms keep clocher's
 * buckets (stats.h) under the vLLM names.
 */
#include "http_vllm.h"
#include "clocher_version.h"

#include "gw_internal.h"
#include "stats.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define VLLM_MAX_LE 32       /* buckets of one histogram */
#define VLLM_MAX_ADAPTERS 64 /* adapters named in vllm:lora_requests_info */

struct buf {
    char **p;
    size_t *len, cap;
    bool oom;
};

__attribute__((format(printf, 2, 3)))
static void put(struct buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*b->p ? *b->p + *b->len : NULL, *b->p ? b->cap - *b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (*b->p && *b->len + (size_t)n < b->cap) {
            *b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap ? b->cap : 4096;
        while (nc <= *b->len + (size_t)n)
            nc *= 2;
        char *q = realloc(*b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        *b->p = q, b->cap = nc;
    }
}

/* One sample line of the text: name, labels (without braces), value. */
struct sample {
    char name[96];
    const char *labels;
    size_t labels_len;
    double value;
};

static bool parse_line(const char *line, size_t n, struct sample *s)
{
    if (n == 0 || line[0] == '#')
        return false;
    size_t k = 0;
    while (k < n && line[k] != '{' && line[k] != ' ')
        k++;
    if (k == 0 || k >= sizeof s->name)
        return false;
    memcpy(s->name, line, k);
    s->name[k] = '\0';
    s->labels = "", s->labels_len = 0;
    if (k < n && line[k] == '{') {
        const char *end = memchr(line + k, '}', n - k);
        if (!end)
            return false;
        s->labels = line + k + 1;
        s->labels_len = (size_t)(end - s->labels);
        k = (size_t)(end - line) + 1;
    }
    char num[64];
    size_t m = n - k < sizeof num - 1 ? n - k : sizeof num - 1;
    memcpy(num, line + k, m);
    num[m] = '\0';
    s->value = strtod(num, NULL);
    return true;
}

static bool label(const struct sample *s, const char *key, char *out, size_t cap)
{
    char pat[40];
    snprintf(pat, sizeof pat, "%s=\"", key);
    size_t pl = strlen(pat);
    for (size_t i = 0; i + pl <= s->labels_len; i++)
        if ((i == 0 || s->labels[i - 1] == ',') && memcmp(s->labels + i, pat, pl) == 0) {
            const char *v = s->labels + i + pl;
            const char *e = memchr(v, '"', s->labels_len - i - pl);
            if (!e)
                return false;
            snprintf(out, cap, "%.*s", (int)(e - v), v);
            return true;
        }
    return false;
}

struct hist {
    const char *from, *to, *help;
    size_t n_le;
    char le[VLLM_MAX_LE][16];
    double bucket[VLLM_MAX_LE], sum, count;
};

struct totals {
    double running, waiting, queue, kv_used, kv_all, prompt, generation;
    struct hist h[5];
};

static void add_hist(struct hist *h, const struct sample *s)
{
    size_t fl = strlen(h->from);
    if (strncmp(s->name, h->from, fl) != 0)
        return;
    const char *suffix = s->name + fl;
    if (strcmp(suffix, "_sum") == 0) {
        h->sum += s->value;
    } else if (strcmp(suffix, "_count") == 0) {
        h->count += s->value;
    } else if (strcmp(suffix, "_bucket") == 0) {
        char le[16];
        if (!label(s, "le", le, sizeof le))
            return;
        size_t i = 0;
        while (i < h->n_le && strcmp(h->le[i], le) != 0)
            i++;
        if (i == h->n_le) {
            if (h->n_le == VLLM_MAX_LE)
                return;
            snprintf(h->le[h->n_le++], sizeof h->le[0], "%s", le);
        }
        h->bucket[i] += s->value;
    }
}

static void scan(const char *text, size_t len, struct totals *t)
{
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        struct sample s;
        if (parse_line(text + at, n, &s)) {
            char state[16];
            if (strcmp(s.name, "clocher_running_sequences") == 0)
                t->running += s.value;
            else if (strcmp(s.name, "clocher_waiting_sequences") == 0)
                t->waiting += s.value;
            else if (strcmp(s.name, "clocher_queue_depth") == 0)
                t->queue += s.value;
            else if (strcmp(s.name, "clocher_prompt_tokens_total") == 0)
                t->prompt += s.value;
            else if (strcmp(s.name, "clocher_completion_tokens_total") == 0)
                t->generation += s.value;
            else if (strcmp(s.name, "clocher_kv_blocks") == 0) {
                t->kv_all += s.value;
                if (label(&s, "state", state, sizeof state) && strcmp(state, "used") == 0)
                    t->kv_used += s.value;
            }
            for (size_t i = 0; i < sizeof t->h / sizeof t->h[0]; i++)
                add_hist(&t->h[i], &s);
        }
        at += n + 1;
    }
}

/* A label value escaped for the text format. */
static void put_escaped(struct buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            put(b, "\\%c", *v);
        else if (*v == '\n')
            put(b, "\\n");
        else
            put(b, "%c", *v);
    }
}

static void family(struct buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(struct buf *b, const char *model, const char *name, const char *help,
                  const char *type, double v)
{
    family(b, name, type, help);
    put(b, "%s{model_name=\"", name);
    put_escaped(b, model);
    put(b, "\"} %.12g\n", v);
}

/* A list of distinct adapter names, rendered comma-separated. */
struct names {
    char name[VLLM_MAX_ADAPTERS][SHM_MAX_NAME + 1];
    size_t n;
};

static void names_add(struct names *l, const char *name)
{
    size_t j = 0;
    while (j < l->n && strcmp(l->name[j], name) != 0)
        j++;
    if (j == l->n && l->n < VLLM_MAX_ADAPTERS)
        snprintf(l->name[l->n++], sizeof l->name[0], "%s", name);
}

static void names_join(const struct names *l, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (size_t j = 0; j < l->n && at < cap; j++)
        at += (size_t)snprintf(out + at, cap - at, "%s%s", j ? "," : "", l->name[j]);
}

/* Adapters of the generations in flight (the slots' request tables), split into running (a
 * token came: stats_started) and waiting (none yet); every one counts as running when the
 * gateway's readers do not feed stats_track. */
static void lora_adapters(struct gw *g, struct names *running, struct names *waiting,
                          size_t *n_loaded)
{
    running->n = waiting->n = 0;
    *n_loaded = 0;
    if (!g)
        return;
    for (size_t i = 0; i < g->n_slots; i++) {
        struct gw_slot *s = &g->slots[i];
        pthread_mutex_lock(&s->mu);
        for (size_t k = 0; k < GW_BUCKETS && s->n_entries; k++)
            for (const struct gw_entry *e = s->buckets[k]; e; e = e->next) {
                if (!e->adapter[0])
                    continue;
                int started = g->stats ? stats_started(g->stats, s->index, e->req_id) : -1;
                names_add(started == 0 ? waiting : running, e->adapter);
            }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&g->adapters_mu);
    for (size_t i = 0; i < g->n_adapters; i++)
        *n_loaded += !g->adapters[i].unloaded;
    pthread_mutex_unlock(&g->adapters_mu);
}

/* clocher_adapter_info{adapter, source}: every adapter this host serves, with where it comes
 * from: "config" (declared in the configuration: every host of a fleet reading it has it) or
 * "runtime" (LoadAdapter on this host only: host-local, docs/DEPLOY.md). */
static void adapter_info(struct buf *b, struct gw *g)
{
    family(b, "clocher_adapter_info", "gauge",
           "1 for each adapter served, labelled with its source: config (fleet-wide) or runtime "
           "(loaded on this host only).");
    if (!g)
        return;
    pthread_mutex_lock(&g->adapters_mu);
    for (size_t i = 0; i < g->n_adapters; i++) {
        const struct gw_adapter *a = &g->adapters[i];
        if (a->unloaded)
            continue;
        put(b, "clocher_adapter_info{adapter=\"");
        put_escaped(b, a->name);
        put(b, "\",source=\"%s\"} 1\n", a->from_config ? "config" : "runtime");
    }
    pthread_mutex_unlock(&g->adapters_mu);
}

/* process_* from /proc/self (the conventions of Prometheus' client libraries). */
static void process_metrics(struct buf *b)
{
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/stat", "r");
    unsigned long ut = 0, st = 0, vsize = 0;
    unsigned long long start = 0;
    long rss = 0;
    bool ok = false;
    if (f) {
        char line[1024];
        if (fgets(line, sizeof line, f)) {
            const char *p = strrchr(line, ')'); /* the command may contain spaces */
            ok = p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d "
                                    "%*d %*d %*d %*d %llu %lu %ld",
                             &ut, &st, &start, &vsize, &rss) == 5;
        }
        fclose(f);
    }
    if (!ok || tick <= 0)
        return;
    double boot = 0;
    if ((f = fopen("/proc/stat", "r"))) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "btime %lf", &boot) == 1)
                break;
        fclose(f);
    }
    family(b, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
    put(b, "process_cpu_seconds_total %.12g\n", (double)(ut + st) / (double)tick);
    family(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    put(b, "process_resident_memory_bytes %ld\n", rss * page);
    family(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    put(b, "process_virtual_memory_bytes %lu\n", vsize);
    family(b, "process_start_time_seconds", "gauge",
           "Start time of the process since unix epoch in seconds.");
    put(b, "process_start_time_seconds %.12g\n", boot + (double)start / (double)tick);
}

int http_vllm_render(struct gw *g, const char *text, size_t len, char **out, size_t *out_len)
{
    struct totals t = {
        .h = {{.from = "clocher_ttft_seconds", .to = "vllm:time_to_first_token_seconds",
               .help = "Histogram of time to first token in seconds."},
              {.from = "clocher_e2e_seconds", .to = "vllm:e2e_request_latency_seconds",
               .help = "Histogram of end to end request latency in seconds."},
              {.from = "clocher_tpot_seconds", .to = "vllm:request_time_per_output_token_seconds",
               .help = "Histogram of each request's mean time per output token in seconds."},
              {.from = "clocher_itl_seconds", .to = "vllm:inter_token_latency_seconds",
               .help = "Histogram of inter-token latency in seconds (one observation per token)."},
              {.from = "clocher_queue_seconds", .to = "vllm:request_queue_time_seconds",
               .help = "Histogram of time spent in WAITING phase for request."}}};
    scan(text, len, &t);
    struct gw_model_info mi;
    const char *model = g && gw__model(g, &mi) ? mi.name : "unknown";
    struct buf b = {.p = out, .len = out_len, .cap = *out ? *out_len + 1 : 0};
    /* *out is the caller's malloc'd text: grow it in place */
    if (*out) {
        char *q = realloc(*out, *out_len + 4096);
        if (!q)
            return -ENOMEM;
        *out = q, b.cap = *out_len + 4096;
    }
    gauge(&b, model, "vllm:num_requests_running", "Number of requests in model execution batches.",
          "gauge", t.running);
    gauge(&b, model, "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          "gauge", t.waiting + t.queue);
    gauge(&b, model, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          "gauge", t.kv_all > 0 ? t.kv_used / t.kv_all : 0);
    gauge(&b, model, "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
          "counter", t.prompt);
    gauge(&b, model, "vllm:generation_tokens_total", "Number of generation tokens processed.",
          "counter", t.generation);
    struct names run, wait;
    char run_s[VLLM_MAX_ADAPTERS * (SHM_MAX_NAME + 1)], wait_s[sizeof run_s];
    size_t n_loaded;
    lora_adapters(g, &run, &wait, &n_loaded);
    names_join(&run, run_s, sizeof run_s);
    names_join(&wait, wait_s, sizeof wait_s);
    family(&b, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    put(&b, "vllm:lora_requests_info{max_lora=\"%zu\",running_lora_adapters=\"%s\","
            "waiting_lora_adapters=\"%s\"} %.12g\n", n_loaded, run_s, wait_s, (double)time(NULL));
    adapter_info(&b, g);
    for (size_t i = 0; i < sizeof t.h / sizeof t.h[0]; i++) {
        const struct hist *h = &t.h[i];
        family(&b, h->to, "histogram", h->help);
        for (size_t k = 0; k < h->n_le; k++) {
            put(&b, "%s_bucket{model_name=\"", h->to);
            put_escaped(&b, model);
            put(&b, "\",le=\"%s\"} %.12g\n", h->le[k], h->bucket[k]);
        }
        if (h->n_le == 0) {
            put(&b, "%s_bucket{model_name=\"", h->to);
            put_escaped(&b, model);
            put(&b, "\",le=\"+Inf\"} 0\n");
        }
        put(&b, "%s_sum{model_name=\"", h->to);
        put_escaped(&b, model);
        put(&b, "\"} %.12g\n%s_count{model_name=\"", h->sum, h->to);
        put_escaped(&b, model);
        put(&b, "\"} %.12g\n", h->count);
    }
    process_metrics(&b);
    /* the build a scrape came from, as Prometheus exporters conventionally say it: a constant 1
     * whose labels carry the version (dashboards join on it to mark upgrades) */
    family(&b, "clocher_build_info", "gauge", "Clocher's version and git description; always 1.");
    put(&b, "clocher_build_info{version=\"%s\",git=\"", CLOCHER_VERSION_NUMBER);
    put_escaped(&b, CLOCHER_VERSION_GIT);
    put(&b, "\"} 1\n");
    return b.oom ? -ENOMEM : 0;
}
