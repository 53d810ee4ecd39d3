/*
 * metrics.c — clocherd's Prometheus endpoint (contract: metrics.h): a libuv TCP listener
 * answering GET /metrics with stats_render's text and GET /healthz with the daemon's phase.
 *
 * Life of a connection: READING (bytes accumulate in a fixed buffer until httpreq_parse has a
 * whole head or refuses it) -> WRITING (one uv_write of head + body) -> DRAINING (the write
 * side is shut down and whatever the client still sends is read and dropped until it closes:
 * closing a socket with unread input makes the kernel send RST, which can destroy the
 * response before the client reads it) -> CLOSING. A timer gives each phase a deadline: a
 * client still not done sending its head gets 408, one that does not read its response or
 * never closes is dropped.
 *
 * NOTES: loop thread only. The connection frees itself once both its handles (TCP, timer)
 * are closed; struct metrics frees itself in the last close callback after metrics_destroy,
 * which is why main.c runs the loop once more after destroying it.
 */
#include "metrics.h"

#include "check.h"
#include "config.h"
#include "err.h"
#include "http_vllm.h"
#include "httpreq.h"
#include "log.h"
#include "stats.h"
#include "workers.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAGIC 0x4d455452u /* "METR" */
#define METRICS_CONN_MAGIC 0x4d434f4eu /* "MCON" */
#define METRICS_BACKLOG 128

enum conn_phase { CONN_READING, CONN_WRITING, CONN_DRAINING, CONN_CLOSING };

struct conn {
    uint32_t magic;
    struct metrics *m;
    struct conn *prev, *next; /* m->conns */
    uv_tcp_t tcp;
    uv_timer_t timer;
    int open_handles;         /* closed handles count down to 0, then the conn is freed */
    enum conn_phase phase;
    size_t in_len;
    char in[HTTPREQ_MAX_BYTES];
    char head[512];           /* the response's status line and headers */
    char *body;               /* malloc'd, or NULL */
    size_t body_len;
    uv_write_t wr;
    uv_shutdown_t sh;
};

struct metrics {
    uint32_t magic;
    struct workers *w;
    struct gw *gw;            /* for the vllm:* names (metrics_set_gateway), may be NULL */
    uv_loop_t *loop;
    uv_tcp_t server;
    bool server_open;         /* until the listener's close callback */
    bool closing;             /* metrics_destroy was called (or create failed) */
    int port;
    uint64_t timeout_ms;
    struct conn *conns;
    size_t n_conns;
    char where[300];          /* the address, for messages */
};

/* ---- teardown ---- */

static void maybe_free(struct metrics *m)
{
    if (m->closing && !m->server_open && m->n_conns == 0) {
        m->magic = 0;
        free(m);
    }
}

static void conn_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->open_handles > 0)
        return;
    struct metrics *m = c->m;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    m->n_conns--;
    free(c->body);
    c->magic = 0;
    free(c);
    maybe_free(m);
}

static void conn_close(struct conn *c)
{
    if (c->phase == CONN_CLOSING)
        return;
    c->phase = CONN_CLOSING;
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

/* ---- responses ---- */

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    }
    return "Error";
}

static void on_timeout(uv_timer_t *t);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct conn *c = req->data;
    if (c->phase == CONN_CLOSING)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    /* read and drop until the client closes (see the file comment), within the deadline */
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
        conn_close(c);
}

static void on_written(uv_write_t *req, int status)
{
    struct conn *c = req->data;
    if (c->phase == CONN_CLOSING)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    c->phase = CONN_DRAINING;
    c->sh.data = c;
    if (uv_shutdown(&c->sh, (uv_stream_t *)&c->tcp, on_shutdown) < 0)
        conn_close(c);
}

/* Sends the response and moves on to WRITING. `body` (malloc'd or NULL) becomes the conn's;
 * `head_only` (HEAD) keeps its length in Content-Length but does not send it. */
static void respond(struct conn *c, int status, const char *content_type, char *body,
                    size_t body_len, const char *extra_headers, bool head_only)
{
    struct metrics *m = c->m;
    uv_read_stop((uv_stream_t *)&c->tcp);
    free(c->body);
    c->body = body;
    c->body_len = body_len;
    int n = snprintf(c->head, sizeof c->head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\nCache-Control: no-store\r\n%s\r\n",
                     status, reason_phrase(status), content_type, body_len,
                     extra_headers ? extra_headers : "");
    CHECK(n > 0 && (size_t)n < sizeof c->head);
    uv_buf_t bufs[2] = {uv_buf_init(c->head, (unsigned)n),
                        uv_buf_init(c->body, (unsigned)c->body_len)};
    unsigned nbufs = head_only || !body_len ? 1 : 2;
    c->phase = CONN_WRITING;
    /* a fresh deadline for the client to take the response */
    uv_timer_start(&c->timer, on_timeout, m->timeout_ms, 0);
    c->wr.data = c;
    int rc = uv_write(&c->wr, (uv_stream_t *)&c->tcp, bufs, nbufs, on_written);
    if (rc < 0) {
        LOG_DEBUG("metrics: write: %s", uv_strerror(rc));
        conn_close(c);
    }
}

/* A small text body (a reason, "serving\n"); on allocation failure the body is empty. */
static void respond_text(struct conn *c, int status, const char *text, const char *extra,
                         bool head_only)
{
    size_t n = strlen(text);
    char *b = malloc(n + 1);
    if (b)
        memcpy(b, text, n + 1);
    respond(c, status, "text/plain; charset=utf-8", b, b ? n : 0, extra, head_only);
}

static void serve(struct conn *c, const struct httpreq *r)
{
    struct metrics *m = c->m;
    bool is_metrics = strcmp(r->path, "/metrics") == 0;
    bool is_health = strcmp(r->path, "/healthz") == 0;
    if (!is_metrics && !is_health) {
        respond_text(c, 404, "not found: try /metrics or /healthz\n", NULL, false);
        return;
    }
    bool head = strcmp(r->method, "HEAD") == 0;
    if (!head && strcmp(r->method, "GET") != 0) {
        respond_text(c, 405, "method not allowed: GET or HEAD\n", "Allow: GET, HEAD\r\n", false);
        return;
    }
    if (is_health) {
        int phase = atomic_load_explicit(&m->w->phase, memory_order_relaxed);
        bool ok = phase == WORKERS_PHASE_SERVING && workers_ready_count(m->w) > 0;
        char text[64];
        snprintf(text, sizeof text, "%s\n", ok ? "serving" : workers_phase_name(phase));
        respond_text(c, ok ? 200 : 503, text, NULL, head);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    if (!m->w->stats || stats_render(m->w->stats, m->w, &text, &len) < 0) {
        respond_text(c, 500, "cannot render the metrics (out of memory)\n", NULL, head);
        return;
    }
    /* beside clocher_*, the vLLM names routers and dashboards read */
    if (http_vllm_render(m->gw, text, len, &text, &len) < 0) {
        free(text);
        respond_text(c, 500, "cannot render the metrics (out of memory)\n", NULL, head);
        return;
    }
    respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL, head);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    if (c->phase == CONN_READING) {
        *buf = uv_buf_init(c->in + c->in_len, (unsigned)(sizeof c->in - c->in_len));
    } else {
        /* draining: the bytes are dropped, so every connection can share one buffer (loop
         * thread only) */
        static char sink[4096];
        *buf = uv_buf_init(sink, sizeof sink);
    }
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct conn *c = st->data;
    if (c->phase == CONN_CLOSING || nread == 0)
        return;
    if (nread < 0) {
        /* EOF or an error: a client that leaves before its request is complete gets nothing;
         * one that closes after our response is done with */
        conn_close(c);
        return;
    }
    if (c->phase != CONN_READING)
        return; /* draining */
    c->in_len += (size_t)nread;
    struct httpreq r;
    int rc = httpreq_parse(c->in, c->in_len, &r);
    if (rc == -EAGAIN) {
        if (c->in_len < sizeof c->in)
            return;
        /* the parser asks for more than the buffer holds: it cannot, by its contract */
        respond_text(c, 431, "request head too large\n", NULL, false);
        return;
    }
    if (rc < 0) {
        /* debug only: anyone who can connect must not be able to fill the journal */
        LOG_DEBUG("metrics: bad request on %s: %d %s", c->m->where, r.status, r.why);
        char text[160];
        snprintf(text, sizeof text, "%s\n", r.why);
        respond_text(c, r.status, text, NULL, false);
        return;
    }
    serve(c, &r);
}

static void on_timeout(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->phase == CONN_READING)
        respond_text(c, 408, "request timeout\n", NULL, false); /* with a deadline of its own */
    else
        conn_close(c);
}

/* ---- the listener ---- */

static void reject_closed(uv_handle_t *h) { free(h); }

static void on_connection(uv_stream_t *server, int status)
{
    struct metrics *m = server->data;
    if (status < 0) {
        LOG_WARN("metrics: accept on %s: %s", m->where, uv_strerror(status));
        return;
    }
    struct conn *c = m->n_conns < METRICS_MAX_CONNS ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        /* over the limit (or out of memory): take the connection off the backlog and close
         * it at once, so the listener keeps accepting the ones after it */
        uv_tcp_t *t = malloc(sizeof *t);
        if (!t || uv_tcp_init(m->loop, t) < 0) {
            free(t);
            LOG_WARN("metrics: cannot take a connection on %s (out of memory)", m->where);
            return;
        }
        if (uv_accept(server, (uv_stream_t *)t) < 0)
            LOG_DEBUG("metrics: accept failed on %s", m->where);
        uv_close((uv_handle_t *)t, reject_closed);
        return;
    }
    c->magic = METRICS_CONN_MAGIC;
    c->m = m;
    CHECK(uv_tcp_init(m->loop, &c->tcp) == 0);
    CHECK(uv_timer_init(m->loop, &c->timer) == 0);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    c->phase = CONN_READING;
    c->next = m->conns;
    if (m->conns)
        m->conns->prev = c;
    m->conns = c;
    m->n_conns++;
    int rc = uv_accept(server, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        LOG_DEBUG("metrics: accept on %s: %s", m->where, uv_strerror(rc));
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timeout, m->timeout_ms, 0);
    rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc < 0)
        conn_close(c);
}

static void server_closed(uv_handle_t *h)
{
    struct metrics *m = h->data;
    m->server_open = false;
    maybe_free(m);
}

/* "host:port" / "[v6]:port" into host and port strings (config.c checked the shape, but
 * metrics_create is also called on hand-made configurations, so this checks again). */
static int split_hostport(const char *s, char *host, size_t host_cap, char *port,
                          size_t port_cap)
{
    const char *colon = strrchr(s, ':');
    if (!colon || !colon[1] || strlen(colon + 1) >= port_cap)
        return ERR_FORMAT;
    const char *h = s, *he = colon;
    if (s[0] == '[') {
        if (colon == s || colon[-1] != ']')
            return ERR_FORMAT;
        h = s + 1;
        he = colon - 1;
    }
    if (he <= h || (size_t)(he - h) >= host_cap)
        return ERR_FORMAT;
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = '\0';
    strcpy(port, colon + 1);
    return strspn(port, "0123456789") == strlen(port) ? 0 : ERR_FORMAT;
}

int metrics_create(struct workers *w, uv_loop_t *loop, struct metrics **out)
{
    *out = NULL;
    struct config *cfg = config_ptr_get(w->config);
    if (!cfg->metrics_listen) {
        config_unref(cfg);
        return 0;
    }
    int rc;
    struct metrics *m = calloc(1, sizeof *m);
    if (!m) {
        LOG_ERR("metrics: out of memory");
        rc = -ENOMEM;
        goto out_cfg;
    }
    m->magic = METRICS_MAGIC;
    m->w = w;
    m->loop = loop;
    m->timeout_ms = METRICS_TIMEOUT_MS;
    snprintf(m->where, sizeof m->where, "%s", cfg->metrics_listen);

    char host[256], port[8];
    if (split_hostport(cfg->metrics_listen, host, sizeof host, port, sizeof port) < 0) {
        LOG_ERR("metrics: listen address \"%s\" is not host:port", m->where);
        rc = ERR_FORMAT;
        goto out_free;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    /* start-up only, before the loop runs: a blocking lookup delays nothing */
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        LOG_ERR("metrics: cannot resolve %s: %s", m->where, gai_strerror(gai));
        rc = gai == EAI_SYSTEM ? -errno : ERR_NOT_FOUND;
        goto out_free;
    }
    if ((rc = uv_tcp_init(loop, &m->server)) < 0) {
        freeaddrinfo(ai);
        LOG_ERR("metrics: uv_tcp_init: %s", uv_strerror(rc));
        goto out_free;
    }
    m->server.data = m;
    m->server_open = true;
    rc = uv_tcp_bind(&m->server, ai->ai_addr, 0);
    freeaddrinfo(ai);
    if (rc < 0) {
        LOG_ERR("metrics: bind %s: %s", m->where, uv_strerror(rc));
        goto out_close;
    }
    if ((rc = uv_listen((uv_stream_t *)&m->server, METRICS_BACKLOG, on_connection)) < 0) {
        LOG_ERR("metrics: listen on %s: %s", m->where, uv_strerror(rc));
        goto out_close;
    }
    struct sockaddr_storage sa;
    int salen = sizeof sa;
    if ((rc = uv_tcp_getsockname(&m->server, (struct sockaddr *)&sa, &salen)) < 0) {
        LOG_ERR("metrics: getsockname %s: %s", m->where, uv_strerror(rc));
        goto out_close;
    }
    m->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                             : ((struct sockaddr_in *)&sa)->sin_port);
    LOG_INFO("metrics: serving http://%s/metrics (port %d)", m->where, m->port);
    config_unref(cfg);
    *out = m;
    return 0;

out_close:
    /* the handle is the loop's until its close callback, which frees m */
    m->closing = true;
    uv_close((uv_handle_t *)&m->server, server_closed);
    config_unref(cfg);
    return rc;
out_free:
    free(m);
out_cfg:
    config_unref(cfg);
    return rc;
}

void metrics_destroy(struct metrics *m)
{
    if (!m)
        return;
    CHECK(m->magic == METRICS_MAGIC);
    CHECK(!m->closing);
    m->closing = true;
    for (struct conn *c = m->conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&m->server, server_closed);
}

int metrics_port(const struct metrics *m) { return m->port; }

void metrics_set_timeout_ms(struct metrics *m, uint64_t ms) { m->timeout_ms = ms ? ms : 1; }

void metrics_set_gateway(struct metrics *m, struct gw *g)
{
    if (m)
        m->gw = g;
}
