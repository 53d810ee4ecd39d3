/*
 * test_metrics.c — daemon/metrics.c, the Prometheus endpoint, as a real libuv server on an
 * ephemeral port (its loop on a thread of its own) driven by plain blocking sockets: a scrape
 * returns what stats recorded, HEAD, /healthz following the daemon's phase, 404/405, malformed
 * and oversized requests answered (by libmicrohttpd) or dropped, a slow client closed at its
 * deadline while another is served, idle connections that do not block /healthz, the
 * connection limit, and the start-up errors (bad address, port in use).
 */
#include "testutil.h"

#include "config.h"
#include "err.h"
#include "log.h"
#include "metrics.h"
#include "stats.h"
#include "workers.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

/* ---- the server under test ---- */

struct fx {
    uv_loop_t loop;
    uv_async_t stop;
    pthread_t thread;
    struct config_ptr cptr;
    struct workers w;
    struct workers_slot slots[2];
    struct metrics *m;
    int port;
};

static struct config *config_with(const char *listen)
{
    struct config *c = NULL;
    assert_int_equal(config_parse("t.json", "/", "{}", 2, "/srv/model", &c), 0);
    free(c->metrics_listen);
    c->metrics_listen = listen ? strdup(listen) : NULL;
    return c;
}

/* The slot table and stats the endpoint reads; no supervisor, no workers. */
static void fx_init(struct fx *f, const char *listen)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    config_ptr_init(&f->cptr, config_with(listen));
    f->w.magic = WORKERS_MAGIC;
    f->w.n = 2;
    f->w.slots = f->slots;
    f->w.config = &f->cptr;
    atomic_init(&f->w.phase, WORKERS_PHASE_STARTING);
    for (int i = 0; i < 2; i++) {
        f->slots[i].magic = WORKERS_SLOT_MAGIC;
        f->slots[i].index = (unsigned)i;
        f->slots[i].node = 0;
        atomic_init(&f->slots[i].state, WORKERS_STARTING);
    }
    assert_int_equal(stats_create(2, &f->w.stats), 0);
}

static void fx_fini(struct fx *f)
{
    /* whatever the test closed must finish closing */
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    stats_destroy(f->w.stats);
    config_ptr_fini(&f->cptr);
}

static void on_stop(uv_async_t *a) { uv_stop(a->loop); }

static void *loop_thread(void *arg)
{
    struct fx *f = arg;
    uv_run(&f->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void start(struct fx *f, uint64_t timeout_ms)
{
    fx_init(f, "127.0.0.1:0");
    assert_int_equal(metrics_create(&f->w, &f->loop, &f->m), 0);
    assert_non_null(f->m);
    f->port = metrics_port(f->m);
    assert_true(f->port > 0);
    if (timeout_ms)
        metrics_set_timeout_ms(f->m, timeout_ms);
    assert_int_equal(uv_async_init(&f->loop, &f->stop, on_stop), 0);
    assert_int_equal(pthread_create(&f->thread, NULL, loop_thread, f), 0);
}

static void stop(struct fx *f)
{
    assert_int_equal(uv_async_send(&f->stop), 0);
    assert_int_equal(pthread_join(f->thread, NULL), 0);
    /* the loop thread is gone: this thread owns the loop now */
    metrics_destroy(f->m);
    uv_close((uv_handle_t *)&f->stop, NULL);
    fx_fini(f);
}

/* ---- a blocking client ---- */

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    /* a safety net against a hung server, not a synchronisation: replies come in ms */
    struct timeval tv = {.tv_sec = 8};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        assert_true(k > 0);
        p += k;
        n -= (size_t)k;
    }
}

/* Everything until the server closes (malloc'd, NUL-terminated). */
static char *recv_all(int fd)
{
    size_t len = 0, cap = 65536;
    char *b = malloc(cap);
    for (;;) {
        if (len + 1 == cap)
            b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            fail_msg("recv: %s (the server neither answered nor closed)", strerror(errno));
        if (k == 0)
            break;
        len += (size_t)k;
    }
    b[len] = '\0';
    return b;
}

/* Sends raw bytes on a fresh connection and returns the whole response. */
static char *exchange(int port, const char *req, size_t len)
{
    int fd = dial(port);
    send_all(fd, req, len);
    char *r = recv_all(fd);
    close(fd);
    return r;
}

static char *get(int port, const char *method, const char *path)
{
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: localhost\r\nUser-Agent: t\r\n\r\n",
                     method, path);
    return exchange(port, req, (size_t)n);
}

static int status_of(const char *resp)
{
    int st = 0;
    if (sscanf(resp, "HTTP/1.1 %d ", &st) != 1)
        fail_msg("not an HTTP response: \"%.80s\"", resp);
    return st;
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    assert_non_null(b);
    return b + 4;
}

static long content_length(const char *resp)
{
    const char *p = strstr(resp, "Content-Length: ");
    assert_non_null(p);
    return strtol(p + 16, NULL, 10);
}

/* ---- tests ---- */

static void test_scrape(void **state)
{
    (void)state;
    struct fx f;
    start(&f, 0);
    stats_request(f.w.stats, "acme", "Generate", 0);
    stats_generation(f.w.stats, "acme", 12, 34, 5, 20000000ull, 3000000ull, 150000000ull);
    stats_queue_depth_add(f.w.stats, 2);

    char *r = get(f.port, "GET", "/metrics");
    assert_int_equal(status_of(r), 200);
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert_non_null(strstr(r, "Connection: close\r\n"));
    const char *body = body_of(r);
    assert_int_equal(content_length(r), (long)strlen(body));
    assert_non_null(strstr(body, "\nclocher_requests_total{method=\"Generate\",status=\"OK\","
                                 "tenant=\"acme\"} 1\n"));
    assert_non_null(strstr(body, "\nclocher_completion_tokens_total{tenant=\"acme\"} 34\n"));
    assert_non_null(strstr(body, "\nclocher_queue_depth 2\n"));
    assert_non_null(strstr(body, "\nclocher_worker_state{worker=\"1\",node=\"0\","
                                 "state=\"starting\"} 1\n"));
    free(r);

    /* a query string is ignored; HTTP/1.0 needs no Host */
    r = exchange(f.port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", 29);
    assert_int_equal(status_of(r), 200);
    free(r);

    /* HEAD: the same length, no body */
    r = get(f.port, "HEAD", "/metrics");
    assert_int_equal(status_of(r), 200);
    assert_true(content_length(r) > 100);
    assert_string_equal(body_of(r), "");
    free(r);
    stop(&f);
}

static void test_healthz(void **state)
{
    (void)state;
    struct fx f;
    start(&f, 0);
    char *r = get(f.port, "GET", "/healthz");
    assert_int_equal(status_of(r), 503);
    assert_string_equal(body_of(r), "starting\n");
    free(r);
    atomic_store(&f.slots[1].state, WORKERS_READY);
    atomic_store(&f.w.phase, WORKERS_PHASE_SERVING);
    r = get(f.port, "GET", "/healthz");
    assert_int_equal(status_of(r), 200);
    assert_string_equal(body_of(r), "serving\n");
    free(r);
    atomic_store(&f.w.phase, WORKERS_PHASE_DRAINING);
    r = get(f.port, "GET", "/healthz");
    assert_int_equal(status_of(r), 503);
    assert_string_equal(body_of(r), "draining\n");
    free(r);
    stop(&f);
}

static void test_not_found_and_method(void **state)
{
    (void)state;
    struct fx f;
    start(&f, 0);
    char *r = get(f.port, "GET", "/");
    assert_int_equal(status_of(r), 404);
    free(r);
    r = get(f.port, "GET", "/metrics/extra");
    assert_int_equal(status_of(r), 404);
    free(r);
    r = get(f.port, "DELETE", "/metrics");
    assert_int_equal(status_of(r), 405);
    assert_non_null(strstr(r, "Allow: GET, HEAD\r\n"));
    free(r);
    r = get(f.port, "get", "/metrics"); /* methods are case-sensitive */
    assert_int_equal(status_of(r), 405);
    free(r);
    stop(&f);
}

static void test_malformed(void **state)
{
    (void)state;
    struct fx f;
    start(&f, 0);
    /* what libmicrohttpd refuses with a status (ours: bodies) */
    static const struct {
        const char *req;
        int status;
        const char *why;
    } cases[] = {
        {"GET /metrics HTTP/2.0\r\nHost: a\r\n\r\n", 505, "version"},
        {"GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", 501, "bodies"},
        {"GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
         "bodies"},
        {"GET metrics HTTP/1.1\r\nHost: a\r\n\r\n", 404, "not found"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *r = exchange(f.port, cases[i].req, strlen(cases[i].req));
        if (status_of(r) != cases[i].status || !strstr(body_of(r), cases[i].why))
            fail_msg("case %zu: want %d \"%s\", got:\n%s", i, cases[i].status, cases[i].why, r);
        free(r);
    }
    /* what libmicrohttpd tolerates or drops: an answer or a close, never a hang or a crash */
    static const struct {
        const char *req;
        size_t len; /* 0: strlen */
    } odd[] = {
        {"GARBAGE\r\n\r\n", 0},
        {"GET /metrics HTTP/1.1\r\n\r\n", 0},
        {"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 0},
        {"GET /metrics HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n", 0},
        {"GET /metrics HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 0},
        {"GET /metrics HTTP/1.1\r\nHost: a\rX\r\n\r\n", 0},
        {"GET /metrics HTTP/1.1\r\nX: \x01\r\n\r\n", 0},
        {"GET /\0metrics HTTP/1.1\r\n\r\n", 26},
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        char *r = exchange(f.port, odd[i].req, odd[i].len ? odd[i].len : strlen(odd[i].req));
        if (r[0] && status_of(r) >= 500 && status_of(r) != 505)
            fail_msg("odd case %zu: a server error:\n%s", i, r);
        free(r);
    }

    /* a head larger than the server's per-connection memory: 431 */
    size_t big = 40000;
    char *req = malloc(big);
    int n = snprintf(req, big, "GET /metrics HTTP/1.1\r\nHost: a\r\nX-Pad: ");
    memset(req + n, 'p', big - (size_t)n);
    char *r = exchange(f.port, req, big);
    assert_int_equal(status_of(r), 431);
    free(r);
    /* a target longer than that: 414 */
    n = snprintf(req, big, "GET /");
    memset(req + n, 'a', big - 100);
    memcpy(req + n + big - 100, " HTTP/1.1\r\nHost: a\r\n\r\n", 23);
    r = exchange(f.port, req, (size_t)n + big - 100 + 22);
    assert_int_equal(status_of(r), 414);
    free(r);
    free(req);

    /* the server still serves */
    r = get(f.port, "GET", "/metrics");
    assert_int_equal(status_of(r), 200);
    free(r);
    stop(&f);
}

static void test_slow_client(void **state)
{
    (void)state;
    struct fx f;
    /* long enough that the scrape below never meets it on a loaded machine (libmicrohttpd
     * counts whole seconds: 2 s) */
    start(&f, 1500);
    int idle = dial(f.port);               /* sends nothing at all */
    int slow = dial(f.port);               /* sends half a request line */
    send_all(slow, "GET /met", 8);

    /* neither blocks anyone else */
    char *r = get(f.port, "GET", "/metrics");
    assert_int_equal(status_of(r), 200);
    free(r);

    /* both are closed once the deadline passes */
    r = recv_all(slow);
    assert_string_equal(r, "");
    free(r);
    r = recv_all(idle);
    assert_string_equal(r, "");
    free(r);
    close(slow);
    close(idle);

    /* a client that leaves mid-request is forgotten quietly */
    int gone = dial(f.port);
    send_all(gone, "GET /metrics HTTP/1.1\r\n", 23);
    close(gone);
    r = get(f.port, "GET", "/metrics");
    assert_int_equal(status_of(r), 200);
    free(r);
    stop(&f);
}

/* 64 idle connections (issue 15, item 8) leave /healthz and /metrics answering at once; at
 * the cap a new connection waits, and is served once one of the others goes. */
static void test_connection_limit(void **state)
{
    (void)state;
    struct fx f;
    start(&f, 0); /* the default deadline: the idle connections stay for the whole test */
    enum { IDLE = 64 };
    int fds[METRICS_MAX_CONNS];
    for (int i = 0; i < IDLE; i++)
        fds[i] = dial(f.port);
    char *r = get(f.port, "GET", "/healthz");
    assert_int_equal(status_of(r), 503); /* the fixture's daemon is still starting */
    free(r);
    r = get(f.port, "GET", "/metrics");
    assert_int_equal(status_of(r), 200);
    free(r);
    for (int i = IDLE; i < METRICS_MAX_CONNS; i++)
        fds[i] = dial(f.port);
    /* the cap is reached: one more waits in the backlog ... */
    int extra = dial(f.port);
    static const char scrape[] = "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
    send_all(extra, scrape, sizeof scrape - 1);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 300000};
    setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b;
    assert_true(recv(extra, &b, 1, 0) < 0);
    /* ... and is served when another leaves */
    tv.tv_sec = 8;
    setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    close(fds[0]);
    r = recv_all(extra);
    assert_int_equal(status_of(r), 200);
    free(r);
    close(extra);
    for (int i = 1; i < METRICS_MAX_CONNS; i++)
        close(fds[i]);
    r = get(f.port, "GET", "/metrics");
    assert_int_equal(status_of(r), 200);
    free(r);
    stop(&f);
}

static void test_create_errors(void **state)
{
    (void)state;
    struct fx f;
    /* no endpoint configured: nothing to do */
    fx_init(&f, NULL);
    assert_int_equal(metrics_create(&f.w, &f.loop, &f.m), 0);
    assert_null(f.m);
    metrics_destroy(NULL);
    fx_fini(&f);

    fx_init(&f, "no-port-here");
    tu_log_capture_begin();
    assert_int_equal(metrics_create(&f.w, &f.loop, &f.m), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("no-port-here", "host:port", NULL);
    fx_fini(&f);

    /* the port of a running endpoint is in use */
    struct fx a;
    start(&a, 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a.port);
    fx_init(&f, addr);
    tu_log_capture_begin();
    int rc = metrics_create(&f.w, &f.loop, &f.m);
    tu_log_capture_end();
    assert_int_equal(rc, -EADDRINUSE);
    tu_assert_log_contains(addr, "in use", NULL);
    fx_fini(&f); /* runs the close callback that frees the half-made endpoint */
    stop(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scrape),
        cmocka_unit_test(test_healthz),
        cmocka_unit_test(test_not_found_and_method),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_slow_client),
        cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
