/*
 * http_srv.h — an HTTP/1.1 listener of clocherd: libmicrohttpd (Debian's libmicrohttpd) driven
 * by the supervisor's libuv loop, so no HTTP parsing is ours. Used by the OpenAI-compatible API
 * (daemon/http.c) and the Prometheus endpoint (daemon/metrics.c).
 *
 * How it runs: MHD in external-epoll mode (MHD_USE_EPOLL, no thread of its own); its epoll fd
 * is watched by a uv_poll and MHD_get_timeout drives a uv_timer, both calling MHD_run on the
 * loop thread. Every MHD callback (the handler, content readers, completion) therefore runs on
 * the loop thread. Connections may be suspended (MHD_suspend_connection) while they wait for a
 * worker; another thread wakes them with http_srv_wake (a uv_async), never by calling MHD.
 * Limits: at most max_connections at once (more are refused by MHD at accept), an idle
 * connection is closed after timeout_s, and a suspended one whose client hung up is noticed
 * within HTTP_SRV_WATCH_MS (its `gone` callback runs).
 */
#ifndef CLOCHER_DAEMON_HTTP_SRV_H
#define CLOCHER_DAEMON_HTTP_SRV_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define HTTP_SRV_WATCH_MS 200 /* how often suspended connections are checked for a hang-up */

struct http_srv;

/* One suspendable request of a server (embedded in the owner's per-request state). */
struct http_srv_susp {
    struct http_srv_susp *prev, *next; /* the server's list of suspended requests */
    struct MHD_Connection *conn;
    bool suspended;
    bool listed;
    _Atomic bool wake;                 /* set by http_srv_wake (any thread) */
    bool deferred;                     /* http_srv_defer: resumed at turn defer_turn */
    uint64_t defer_turn;
    void (*gone)(struct http_srv_susp *s); /* its client hung up while suspended */
};

struct http_srv_opts {
    const char *what;                  /* "HTTP API", "metrics": names it in messages */
    const char *hostport;              /* "host:port", "[v6]:port"; port 0 = any free one */
    unsigned max_connections;
    unsigned timeout_s;                /* idle connections are closed after this */
    MHD_AccessHandlerCallback handler;
    MHD_RequestCompletedCallback completed; /* may be NULL */
    MHD_NotifyConnectionCallback connected; /* each connection's start and end, may be NULL */
    void *ud;                          /* both callbacks' closure */
};

/* Resolves and binds o->hostport and starts serving on `loop`. 0, or a negative code (logged,
 * naming the address): ERR_FORMAT (not host:port), -EADDRINUSE (the port is taken: the
 * daemon must not share it), -errno / uv codes. */
int http_srv_create(uv_loop_t *loop, const struct http_srv_opts *o, struct http_srv **out);

/* Whether hostport could be listened on now (resolved, bound and released at once): 0, or the
 * code http_srv_create would meet, logged naming `what` (the config key) and the address. For
 * a check before a long step (the model's conversion): it proves nothing about later. */
int http_srv_probe(const char *what, const char *hostport);

/* Stops MHD (closing every connection, which runs `completed` for each) and closes the
 * handles; the memory is freed by their close callbacks, so the loop must run once more.
 * NULL is a no-op. */
void http_srv_destroy(struct http_srv *s);

/* The TCP port it listens on (the kernel's choice for port 0). */
int http_srv_port(const struct http_srv *s);

/* Suspends s->conn (loop thread, from a handler or content reader of that connection) until
 * http_srv_wake or a hang-up. A wake that came since s->wake was last cleared resumes it at
 * once (next loop turn). */
void http_srv_suspend(struct http_srv *srv, struct http_srv_susp *s);
/* Loop thread, from s's handler: suspends s->conn until the loop has finished its next whole
 * turn, so that every event already pending when the handler ran (a signal's included, which
 * libuv may order after MHD's in the same turn) has been handled when the handler runs again.
 * Suspended like http_srv_suspend (a hang-up meanwhile runs gone()). */
void http_srv_defer(struct http_srv *srv, struct http_srv_susp *s);
/* Any thread: resume s soon (the loop thread does it). */
void http_srv_wake(struct http_srv *srv, struct http_srv_susp *s);
/* Loop thread: s is going away (its request completed): no wake or watch touches it again. */
void http_srv_forget(struct http_srv *srv, struct http_srv_susp *s);

#endif
