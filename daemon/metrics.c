/*
 * metrics.c — clocherd's Prometheus endpoint (contract: metrics.h): GET /metrics with
 * stats_render's clocher_* text and the vllm:* / process_* families beside it
 * (daemon/http_vllm.h), GET /healthz with the daemon's phase. HTTP itself is libmicrohttpd's,
 * driven by the loop (daemon/http_srv.h): it parses the requests, answers malformed ones,
 * caps the connections (METRICS_MAX_CONNS) and closes idle ones at the deadline, so idle or
 * slow clients cannot make /healthz unanswerable.
 *
 * NOTES: loop thread only. Every answer says "Connection: close" (a scrape is one request).
 */
#include "metrics.h"

#include "check.h"
#include "config.h"
#include "err.h"
#include "http_srv.h"
#include "http_vllm.h"
#include "log.h"
#include "stats.h"
#include "workers.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAGIC 0x4d455452u /* "METR" */

struct metrics {
    uint32_t magic;
    struct workers *w;
    struct gw *gw;            /* for the vllm:* names (metrics_set_gateway), may be NULL */
    struct http_srv *srv;
    uint64_t timeout_ms;      /* applied to each new connection */
};

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *ctype,
                               char *body, size_t len, bool allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* A small text body (a reason, "serving\n"). */
static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status,
                                    const char *text, bool allow)
{
    char *b = strdup(text);
    return respond(conn, status, "text/plain; charset=utf-8", b, b ? strlen(b) : 0, allow);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version, (void)upload_data;
    static int seen;
    struct metrics *m = cls;
    if (!*con_cls) {
        *con_cls = &seen; /* answered at the head; a body (none is wanted) is refused then */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_TRANSFER_ENCODING);
        if ((cl && strcmp(cl, "0") != 0) || te)
            return respond_text(conn, 501, "request bodies are not accepted here\n", false);
        bool is_metrics = strcmp(url, "/metrics") == 0;
        bool is_health = strcmp(url, "/healthz") == 0;
        if (!is_metrics && !is_health)
            return respond_text(conn, 404, "not found: try /metrics or /healthz\n", false);
        if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
            return respond_text(conn, 405, "method not allowed: GET or HEAD\n", true);
        if (is_health) {
            int phase = atomic_load_explicit(&m->w->phase, memory_order_relaxed);
            bool ok = phase == WORKERS_PHASE_SERVING && workers_ready_count(m->w) > 0;
            char text[64];
            snprintf(text, sizeof text, "%s\n", ok ? "serving" : workers_phase_name(phase));
            return respond_text(conn, ok ? 200 : 503, text, false);
        }
        char *text = NULL;
        size_t len = 0;
        /* beside clocher_*, the vLLM names routers and dashboards read */
        if (!m->w->stats || stats_render(m->w->stats, m->w, &text, &len) < 0 ||
            http_vllm_render(m->gw, text, len, &text, &len) < 0) {
            free(text);
            return respond_text(conn, 500, "cannot render the metrics (out of memory)\n", false);
        }
        return respond(conn, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, false);
    }
    *upload_data_size = 0; /* a body after the answer: dropped */
    return MHD_YES;
}

/* Each new connection gets the deadline of now (metrics_set_timeout_ms). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)socket_ctx;
    struct metrics *m = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)((m->timeout_ms + 999) / 1000));
}

int metrics_create(struct workers *w, uv_loop_t *loop, struct metrics **out)
{
    *out = NULL;
    struct config *cfg = config_ptr_get(w->config);
    if (!cfg->metrics_listen) {
        config_unref(cfg);
        return 0;
    }
    struct metrics *m = calloc(1, sizeof *m);
    if (!m) {
        config_unref(cfg);
        LOG_ERR("metrics: out of memory");
        return -ENOMEM;
    }
    m->magic = METRICS_MAGIC;
    m->w = w;
    m->timeout_ms = METRICS_TIMEOUT_MS;
    struct http_srv_opts o = {.what = "metrics", .hostport = cfg->metrics_listen,
                              .max_connections = METRICS_MAX_CONNS,
                              .timeout_s = (METRICS_TIMEOUT_MS + 999) / 1000,
                              .handler = on_request, .connected = on_connection, .ud = m};
    int rc = http_srv_create(loop, &o, &m->srv);
    config_unref(cfg);
    if (rc < 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void metrics_destroy(struct metrics *m)
{
    if (!m)
        return;
    CHECK(m->magic == METRICS_MAGIC);
    http_srv_destroy(m->srv);
    m->magic = 0;
    free(m);
}

int metrics_port(const struct metrics *m) { return m ? http_srv_port(m->srv) : 0; }

void metrics_set_timeout_ms(struct metrics *m, uint64_t ms) { m->timeout_ms = ms; }

void metrics_set_gateway(struct metrics *m, struct gw *g)
{
    if (m)
        m->gw = g;
}
