/*
 * metrics.h — clocherd's Prometheus endpoint: a small HTTP/1.x server on the supervisor's
 * libuv loop at config->metrics_listen, serving
 *     GET /metrics   the text exposition format 0.0.4 (stats_render of w->stats and w);
 *     GET /healthz   200 "serving" when the daemon serves with a ready worker, else 503 and
 *                    the phase ("starting", "draining", ...);
 * (HEAD too), 404 for other paths, 405 for other methods, and 400/414/431/501/505 with a
 * one-line reason for malformed requests (daemon/httpreq.h). One request per connection
 * ("Connection: close"). docs/DAEMON.md, "Metrics", lists every series; the vllm:* and
 * process_* families beside them are daemon/http_vllm.h's (docs/HTTP.md).
 *
 * NOTES: everything runs on the loop thread; no call blocks it: sockets are non-blocking,
 * a render is a few microseconds, at most METRICS_MAX_CONNS connections are served at once
 * (more are accepted and closed at once) and each has a deadline (an idle or slow client,
 * reading or writing, is answered 408 or dropped when it passes).
 */
#ifndef CLOCHER_DAEMON_METRICS_H
#define CLOCHER_DAEMON_METRICS_H

#include <stdint.h>
#include <uv.h>

#define METRICS_MAX_CONNS 64
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

/* Sets the per-connection deadline (default METRICS_TIMEOUT_MS), for connections accepted
 * from now on (tests shorten it). */
void metrics_set_timeout_ms(struct metrics *m, uint64_t ms);

/* The gateway whose model name and adapters in flight label the vllm:* series
 * (daemon/http_vllm.h); without one they say model_name="unknown". NULL m is a no-op. */
struct gw;
void metrics_set_gateway(struct metrics *m, struct gw *g);

#endif
