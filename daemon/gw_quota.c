/*
 * gw_quota.c — per-tenant quotas (tenants[] in the configuration; 0 = none):
 *  - requests_per_s: a token bucket of RPCs that reach a worker (each request of a batch, each
 *    Tokenize and Detokenize), refilled at that rate, holding at most one second of them;
 *  - tokens_per_min: a token bucket of prompt + generated tokens (and Tokenize's ids), charged
 *    when the worker reports them (so a request is admitted while the bucket is positive and
 *    its tokens may take it below zero: the debt delays the next ones), holding at most one
 *    minute of them;
 *  - max_prompt_bytes: a prompt's (or Tokenize text's) bytes, below limits.max_prompt_bytes;
 *  - max_queued: the tenant's generations at the workers that have not produced a token yet.
 * Over a quota → RESOURCE_EXHAUSTED naming the tenant, the limit and when to retry; each
 * refusal is counted (clocher_throttled_total{tenant, limit}). The state of a tenant lives in
 * a fixed table under one mutex (a leaf lock: taken with a call's mutex held, never the other
 * way), by name, so a reload that changes the numbers keeps the buckets.
 */
#include "gw_internal.h"

#include "mono.h"
#include "stats.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The entry of tenant (claimed if new); NULL when the table is full. quota_mu held. */
static struct gw_quota *entry(struct gw *g, const char *tenant)
{
    struct gw_quota *free_e = NULL;
    for (size_t i = 0; i < GW_QUOTA_TENANTS; i++) {
        struct gw_quota *q = &g->quotas[i];
        if (q->used && strcmp(q->name, tenant) == 0)
            return q;
        if (!q->used && !free_e)
            free_e = q;
    }
    if (free_e) {
        memset(free_e, 0, sizeof *free_e);
        free_e->used = true;
        snprintf(free_e->name, sizeof free_e->name, "%s", tenant);
    }
    return free_e;
}

/* Refills a bucket of `rate` per `per_ns` holding at most `cap` (a new one starts full). */
static void refill(double *level, uint64_t *last_ns, bool *init, double rate, double per_ns,
                   double cap, uint64_t now)
{
    if (!*init) {
        *level = cap, *last_ns = now, *init = true;
        return;
    }
    *level += (double)(now - *last_ns) * rate / per_ns;
    if (*level > cap)
        *level = cap;
    *last_ns = now;
}

static int refuse(struct gw *g, const char *tenant, const char *limit, char *msg, size_t cap,
                  double retry_s, double *retry_after_s, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static int refuse(struct gw *g, const char *tenant, const char *limit, char *msg, size_t cap,
                  double retry_s, double *retry_after_s, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(msg, cap, "tenant %s: %s (tenants[].%s); retry after %.1f s", tenant, what, limit,
             retry_s);
    if (retry_after_s)
        *retry_after_s = retry_s;
    if (g->stats)
        stats_throttled(g->stats, tenant, limit);
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
}

int gw__quota_admit(struct gw *g, const struct config_tenant *t, const char *tenant,
                    uint32_t n_requests, uint32_t n_generations, size_t prompt_bytes,
                    char *msg, size_t cap, double *retry_after_s)
{
    /* a tenant's generations waiting are counted whatever its quotas: a reload may set
     * max_queued while they run */
    if (!t)
        return 0;
    if (t->max_prompt_bytes && prompt_bytes > t->max_prompt_bytes)
        return refuse(g, tenant, "max_prompt_bytes", msg, cap, 0, retry_after_s,
                      "a prompt of %zu bytes, the limit is %" PRIu32, prompt_bytes,
                      t->max_prompt_bytes);
    uint64_t now = mono_ns();
    pthread_mutex_lock(&g->quota_mu);
    struct gw_quota *q = entry(g, tenant);
    if (!q)
        goto out; /* more tenants than the table: config.c caps tenants far below it */
    if (t->requests_per_s) {
        double rate = t->requests_per_s;
        refill(&q->req_level, &q->req_ns, &q->req_init, rate, 1e9, rate, now);
        if (q->req_level < n_requests) {
            double wait = (n_requests - q->req_level) / rate;
            pthread_mutex_unlock(&g->quota_mu);
            if (n_requests > t->requests_per_s)
                return refuse(g, tenant, "requests_per_s", msg, cap, 0, retry_after_s,
                              "%" PRIu32 " requests at once, more than the limit of %" PRIu32
                              " per second", n_requests, t->requests_per_s);
            return refuse(g, tenant, "requests_per_s", msg, cap, wait, retry_after_s,
                          "%" PRIu32 " requests, over the limit of %" PRIu32 " per second",
                          n_requests, t->requests_per_s);
        }
    }
    if (t->tokens_per_min) {
        double rate = t->tokens_per_min;
        refill(&q->tok_level, &q->tok_ns, &q->tok_init, rate, 60e9, rate, now);
        if (q->tok_level <= 0) {
            double wait = (1 - q->tok_level) * 60.0 / rate;
            uint64_t used = (uint64_t)(rate - q->tok_level);
            pthread_mutex_unlock(&g->quota_mu);
            return refuse(g, tenant, "tokens_per_min", msg, cap, wait, retry_after_s,
                          "%" PRIu64 " prompt and generated tokens in the last minute, the "
                          "limit is %" PRIu32, used, t->tokens_per_min);
        }
    }
    if (t->max_queued && n_generations &&
        (q->queued >= t->max_queued || n_generations > t->max_queued - q->queued)) {
        uint32_t queued = q->queued;
        pthread_mutex_unlock(&g->quota_mu);
        return refuse(g, tenant, "max_queued", msg, cap, 1.0, retry_after_s,
                      "%" PRIu32 " requests already wait at the workers, the limit is %" PRIu32,
                      queued, t->max_queued);
    }
    if (t->requests_per_s)
        q->req_level -= n_requests;
    q->queued += n_generations;
out:
    pthread_mutex_unlock(&g->quota_mu);
    return 0;
}

void gw__quota_unqueue(struct gw *g, const char *tenant)
{
    pthread_mutex_lock(&g->quota_mu);
    for (size_t i = 0; i < GW_QUOTA_TENANTS; i++) {
        struct gw_quota *q = &g->quotas[i];
        if (q->used && strcmp(q->name, tenant) == 0) {
            if (q->queued)
                q->queued--;
            break;
        }
    }
    pthread_mutex_unlock(&g->quota_mu);
}

void gw__quota_charge(struct gw *g, const struct config_tenant *t, const char *tenant,
                      uint64_t tokens)
{
    if (!t || !t->tokens_per_min || !tokens)
        return;
    uint64_t now = mono_ns();
    pthread_mutex_lock(&g->quota_mu);
    struct gw_quota *q = entry(g, tenant);
    if (q) {
        double rate = t->tokens_per_min;
        refill(&q->tok_level, &q->tok_ns, &q->tok_init, rate, 60e9, rate, now);
        q->tok_level -= (double)tokens;
    }
    pthread_mutex_unlock(&g->quota_mu);
}
