/*
 * http.h — clocherd's OpenAI-compatible HTTP API (docs/HTTP.md is the manual): a listener at
 * config http.listen (or clocherd --http HOST:PORT) beside gRPC, serving
 *     GET  /v1/models             the base model and every adapter the caller's tenant may use
 *     POST /v1/completions        text (or token ids) in, text out
 *     POST /v1/chat/completions   messages in (the chat template, http_oai.h), a reply out
 *     GET  /health, /healthz      200 while serving, 503 otherwise
 * with `stream: true` as Server-Sent Events ending in "data: [DONE]". Tenants come from
 * "Authorization: Bearer KEY" exactly as gRPC's keys do, and every generation goes through the
 * gateway's own path (gw_ext_generate, daemon/internal/gw_internal.h): the same limits, ACLs,
 * routing, prefix-cache scope, statistics and cancellation. Errors are OpenAI's JSON error
 * object with the status mapped from the gateway's (400, 401, 404, 413, 429 + Retry-After,
 * 503).
 *
 * NOTES: everything but the gateway's wake-ups runs on the loop thread (daemon/http_srv.h).
 */
#ifndef CLOCHER_DAEMON_HTTP_H
#define CLOCHER_DAEMON_HTTP_H

#include <uv.h>

struct http;
struct gw;
struct workers;

/* Listens on the configuration's http_listen (NULL: returns 0 with *out NULL). 0, or a
 * negative code (logged; -EADDRINUSE for a port in use). */
int http_create(struct workers *w, struct gw *g, uv_loop_t *loop, struct http **out);

/* Ends every request (running generations are cancelled) and closes the listener; the loop
 * must run once more to free it. Call before gw_destroy. NULL is a no-op. */
void http_destroy(struct http *h);

/* The port it listens on. */
int http_port(const struct http *h);

#endif
