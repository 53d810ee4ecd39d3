/*
 * metrics.h — clocherd's Prometheus endpoint: an HTTP listener (libmicrohttpd on the
 * supervisor's libuv loop, daemon/http_srv.h) at config->metrics_listen, serving
 *     GET /metrics   the text exposition format 0.0.4: stats_render of w->stats and w, then the
 *                    vllm:* and process_* families (daemon/http_vllm.h, docs/HTTP.md);
 *     GET /healthz   200 "serving" when the daemon serves with a ready worker, else 503 and
 *                    the phase ("starting", "draining", ...);
 * (HEAD too), 404 for other paths, 405 (with Allow) for other methods, 501 for a request with
 * a body; malformed requests are answered by libmicrohttpd (400, 414, 431, 505). One request
 * per connection ("Connection: close"). docs/DAEMON.md, "Metrics", lists the clocher_* series.
 *
 * NOTES: everything runs on the loop thread; no call blocks it. At most METRICS_MAX_CONNS
 * connections are served at once (more are accepted and closed at once) and a connection
 * idle past its deadline is closed, so idle or slow clients cannot keep /healthz from
 * answering for long (64 idle connections do not block it at all).
 */
#ifndef CLOCHER_DAEMON_METRICS_H
#define CLOCHER_DAEMON_METRICS_H

#include <stdint.h>
#include <uv.h>

#define METRICS_MAX_CONNS 256
#define METRICS_TIMEOUT_MS 10000 /* the default deadline of one connection */

struct metrics;
struct workers;

/*
 * Binds and listens on the configuration's metrics_listen (read through w->config) on `loop`.
 * No metrics_listen (NULL): returns 0 with *out NULL and serves nothing. A "host:port" may
 * name an IPv4 literal, "[IPv6]" or a DNS name (resolved now, at start-up); port 0 picks a free
 * port (metrics_port tells which). Returns 0, or a negative code (logged): ERR_FORMAT for an
 * address that is not host:port, -errno/uv codes when it cannot be resolved or bound.
 */
int metrics_create(struct workers *w, uv_loop_t *loop, struct metrics **out);

/* Closes the listener and every connection; the memory is freed by the close callbacks, so
 * the loop must run once more afterwards (clocherd's main does). NULL is a no-op. */
void metrics_destroy(struct metrics *m);

/* The TCP port it listens on (the one the kernel chose for port 0). */
int metrics_port(const struct metrics *m);

/* Sets the per-connection idle deadline (default METRICS_TIMEOUT_MS; libmicrohttpd counts
 * whole seconds, rounded up), for connections accepted from now on (tests shorten it). */
void metrics_set_timeout_ms(struct metrics *m, uint64_t ms);

/* The gateway whose model name and adapters in flight label the vllm:* series
 * (daemon/http_vllm.h); without one they say model_name="unknown". NULL m is a no-op. */
struct gw;
void metrics_set_gateway(struct metrics *m, struct gw *g);

#endif
