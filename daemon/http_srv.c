/*
 * http_srv.c — libmicrohttpd on the supervisor's libuv loop (contract: http_srv.h).
 *
 * NOTES: loop thread only, except http_srv_wake (an atomic flag and uv_async_send). The struct
 * is freed by the last of its three handles' close callbacks (poll, timer, async; the watch
 * timer is a fourth) after http_srv_destroy, which is why main.c runs the loop once more.
 */
#include "http_srv.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HTTP_SRV_MAGIC 0x48535256u /* "HSRV" */
#define HTTP_SRV_HANDLES 6

struct http_srv {
    uint32_t magic;
    uv_loop_t *loop;
    struct MHD_Daemon *d;
    uv_poll_t poll;   /* MHD's epoll fd */
    uv_timer_t timer; /* MHD_get_timeout */
    uv_timer_t watch; /* hang-ups of suspended connections */
    uv_async_t async; /* http_srv_wake */
    uv_check_t check; /* http_srv_defer: after each turn's I/O */
    uv_idle_t idle;   /* ... which must not block in poll while a request waits for it */
    uint64_t turn;    /* check callbacks so far */
    size_t n_deferred;
    int open_handles;
    bool running;     /* MHD_run may be called */
    int port;
    struct http_srv_susp *susp; /* suspended requests */
    size_t n_susp;
    char what[32];
};

static void run(struct http_srv *s);

static void on_handle_closed(uv_handle_t *h)
{
    struct http_srv *s = h->data;
    if (--s->open_handles == 0) {
        s->magic = 0;
        free(s);
    }
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    (void)status, (void)events;
    run(p->data);
}

static void on_timer(uv_timer_t *t) { run(t->data); }

static void unlist(struct http_srv *s, struct http_srv_susp *x)
{
    if (x->deferred) {
        x->deferred = false;
        s->n_deferred--;
    }
    if (!x->listed)
        return;
    if (x->prev)
        x->prev->next = x->next;
    else
        s->susp = x->next;
    if (x->next)
        x->next->prev = x->prev;
    x->prev = x->next = NULL;
    x->listed = false;
    s->n_susp--;
}

static void resume(struct http_srv *s, struct http_srv_susp *x)
{
    unlist(s, x);
    if (x->suspended) {
        x->suspended = false;
        MHD_resume_connection(x->conn);
    }
}

static void on_async(uv_async_t *a)
{
    struct http_srv *s = a->data;
    if (!s->running)
        return;
    for (struct http_srv_susp *x = s->susp, *next; x; x = next) {
        next = x->next;
        if (atomic_load(&x->wake))
            resume(s, x);
    }
    run(s);
}

static void on_idle(uv_idle_t *i) { (void)i; }

/* After the turn's I/O: the deferred requests whose turn came are resumed. */
static void on_check(uv_check_t *c)
{
    struct http_srv *s = c->data;
    s->turn++;
    bool any = false;
    for (struct http_srv_susp *x = s->susp, *next; x && s->running; x = next) {
        next = x->next;
        if (x->deferred && x->defer_turn <= s->turn) {
            resume(s, x);
            any = true;
        }
    }
    if (s->n_deferred == 0) {
        uv_check_stop(&s->check);
        uv_idle_stop(&s->idle);
    }
    if (any)
        run(s);
}

void http_srv_defer(struct http_srv *s, struct http_srv_susp *x)
{
    http_srv_suspend(s, x);
    if (!x->deferred) {
        x->deferred = true;
        s->n_deferred++;
    }
    /* handlers run in a turn's I/O phase, whose check comes next (turn + 1): the next whole
     * turn ends at turn + 2 */
    x->defer_turn = s->turn + 2;
    uv_check_start(&s->check, on_check);
    uv_idle_start(&s->idle, on_idle);
}

/* A suspended connection whose client closed (or reset) it. */
static bool hung_up(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static void on_watch(uv_timer_t *t)
{
    struct http_srv *s = t->data;
    if (s->n_susp == 0) {
        uv_timer_stop(t);
        return;
    }
    for (struct http_srv_susp *x = s->susp, *next; x; x = next) {
        next = x->next;
        if (x->suspended && hung_up(x->conn)) {
            if (x->gone)
                x->gone(x);
            resume(s, x);
        }
    }
    run(s);
}

/* One round of MHD's work, then its next deadline. */
static void run(struct http_srv *s)
{
    if (!s->running)
        return;
    /* twice: a round ends by cleaning up closed connections, and only the next one puts the
     * listening socket back into MHD's epoll set when that brought it under the connection
     * limit (otherwise a waiting client would wait for the next timeout) */
    MHD_run(s->d);
    MHD_run(s->d);
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(s->d, &ms) == MHD_YES)
        uv_timer_start(&s->timer, on_timer, ms, 0);
    else
        uv_timer_stop(&s->timer);
}

void http_srv_suspend(struct http_srv *s, struct http_srv_susp *x)
{
    if (x->suspended)
        return;
    MHD_suspend_connection(x->conn);
    x->suspended = true;
    if (!x->listed) {
        x->prev = NULL;
        x->next = s->susp;
        if (s->susp)
            s->susp->prev = x;
        s->susp = x;
        x->listed = true;
        /* started once and left running while anything is suspended: restarting it at
         * every suspension (each token) would keep it from ever firing */
        if (s->n_susp++ == 0 && !uv_is_active((uv_handle_t *)&s->watch))
            uv_timer_start(&s->watch, on_watch, HTTP_SRV_WATCH_MS, HTTP_SRV_WATCH_MS);
    }
    if (atomic_load(&x->wake))
        uv_async_send(&s->async); /* a wake came before the suspension: resume next turn */
}

void http_srv_wake(struct http_srv *s, struct http_srv_susp *x)
{
    atomic_store(&x->wake, true);
    uv_async_send(&s->async);
}

void http_srv_forget(struct http_srv *s, struct http_srv_susp *x) { unlist(s, x); }

int http_srv_port(const struct http_srv *s) { return s ? s->port : 0; }

/* host:port -> its first address (numeric or resolved now). */
static int resolve(const char *what, const char *hostport, struct sockaddr_storage *ss,
                   socklen_t *len)
{
    char host[300];
    const char *colon = strrchr(hostport, ':');
    size_t hl = colon ? (size_t)(colon - hostport) : 0;
    if (!colon || hl == 0 || hl >= sizeof host || !colon[1]) {
        LOG_ERR("%s: \"%s\" is not host:port", what, hostport);
        return ERR_FORMAT;
    }
    memcpy(host, hostport, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) {
        LOG_ERR("%s: \"%s\": the port must be 0..65535", what, hostport);
        return ERR_FORMAT;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *ai = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc != 0 || !ai) {
        LOG_ERR("%s: cannot resolve %s: %s", what, hostport, gai_strerror(rc));
        return -EINVAL;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* Refuses a port already taken: MHD sets SO_REUSEADDR, which on Linux does not let two
 * listeners share a port, but a probe bind names the problem better than MHD's NULL. */
static int probe_bind(const char *what, const char *hostport, const struct sockaddr_storage *ss,
                      socklen_t len)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("%s: socket: %s", what, strerror(e));
        return -e;
    }
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = 0;
    if (bind(fd, (const struct sockaddr *)ss, len) < 0 || listen(fd, 1) < 0) {
        rc = -errno;
        LOG_ERR("%s: cannot listen on %s: %s%s", what, hostport, strerror(-rc),
                rc == -EADDRINUSE ? " (another process serves that port)" : "");
    }
    close(fd);
    return rc;
}

int http_srv_probe(const char *what, const char *hostport)
{
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int rc = resolve(what, hostport, &ss, &len);
    return rc < 0 ? rc : probe_bind(what, hostport, &ss, len);
}

/* libmicrohttpd's own messages (mostly clients' mistakes: a connection closed mid-request)
 * go to the daemon's log at debug level rather than straight to stderr. */
__attribute__((format(printf, 2, 0)))
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    LOG_DEBUG("%s: libmicrohttpd: %s", ((struct http_srv *)cls)->what, msg);
}

int http_srv_create(uv_loop_t *loop, const struct http_srv_opts *o, struct http_srv **out)
{
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int rc = resolve(o->what, o->hostport, &ss, &len);
    if (rc < 0)
        return rc;
    bool any_port = (ss.ss_family == AF_INET && ((struct sockaddr_in *)&ss)->sin_port == 0) ||
                    (ss.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&ss)->sin6_port == 0);
    if (!any_port && (rc = probe_bind(o->what, o->hostport, &ss, len)) < 0)
        return rc;
    struct http_srv *s = calloc(1, sizeof *s);
    if (!s) {
        LOG_ERR("%s: out of memory", o->what);
        return -ENOMEM;
    }
    s->magic = HTTP_SRV_MAGIC;
    s->loop = loop;
    snprintf(s->what, sizeof s->what, "%s", o->what);
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, o->handler, o->ud,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, o->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u,
                            MHD_OPTION_NOTIFY_COMPLETED, o->completed, o->ud,
                            MHD_OPTION_NOTIFY_CONNECTION, o->connected, o->ud,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_END);
    if (!s->d) {
        LOG_ERR("%s: cannot serve on %s (libmicrohttpd refused to start)", o->what,
                o->hostport);
        free(s);
        return -EADDRINUSE;
    }
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = pi ? pi->port : 0;
    if (!ep || (rc = uv_poll_init(loop, &s->poll, ep->epoll_fd)) < 0) {
        LOG_ERR("%s: cannot watch libmicrohttpd's epoll fd: %s", o->what,
                ep ? uv_strerror(rc) : "no fd");
        MHD_stop_daemon(s->d);
        free(s);
        return rc < 0 ? rc : -EINVAL;
    }
    uv_timer_init(loop, &s->timer);
    uv_timer_init(loop, &s->watch);
    uv_async_init(loop, &s->async, on_async);
    uv_check_init(loop, &s->check);
    uv_idle_init(loop, &s->idle);
    s->poll.data = s->timer.data = s->watch.data = s->async.data = s->check.data =
        s->idle.data = s;
    s->open_handles = HTTP_SRV_HANDLES;
    s->running = true;
    uv_poll_start(&s->poll, UV_READABLE, on_poll);
    run(s);
    LOG_INFO("%s: listening on %s (port %d)", o->what, o->hostport, s->port);
    *out = s;
    return 0;
}

void http_srv_destroy(struct http_srv *s)
{
    if (!s)
        return;
    /* resume every suspended connection first: MHD cannot close a suspended one */
    for (struct http_srv_susp *x = s->susp, *next; x; x = next) {
        next = x->next;
        if (x->gone)
            x->gone(x);
        resume(s, x);
    }
    MHD_run(s->d);
    s->running = false;
    uv_poll_stop(&s->poll);
    MHD_stop_daemon(s->d);
    s->d = NULL;
    uv_close((uv_handle_t *)&s->poll, on_handle_closed);
    uv_close((uv_handle_t *)&s->timer, on_handle_closed);
    uv_close((uv_handle_t *)&s->watch, on_handle_closed);
    uv_close((uv_handle_t *)&s->async, on_handle_closed);
    uv_close((uv_handle_t *)&s->check, on_handle_closed);
    uv_close((uv_handle_t *)&s->idle, on_handle_closed);
}
