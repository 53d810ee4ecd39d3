/*
 * http_vllm.h — the vLLM-compatible metric names inference routers and dashboards read
 * (the Gateway API inference extension's model-server protocol, vLLM's Grafana boards), made
 * from the clocher_* series the daemon already keeps: the text stats_render produced, summed
 * over tenants and workers, plus what only the gateway knows (the model's name, the adapters
 * in flight, split into running and waiting by stats_started, and clocher_adapter_info with
 * each served adapter's source: "config" or "runtime", docs/DEPLOY.md). docs/HTTP.md,
 * "Metrics", lists each name and its source.
 */
#ifndef CLOCHER_DAEMON_HTTP_VLLM_H
#define CLOCHER_DAEMON_HTTP_VLLM_H

#include <stddef.h>

struct gw;

/*
 * Appends the vllm:* families for clocher_text[len] (stats_render's output) to *out / *out_len
 * (malloc'd, realloc'd; NUL-terminated). g may be NULL (no model name: "unknown", no adapters).
 * 0 or -ENOMEM.
 */
int http_vllm_render(struct gw *g, const char *clocher_text, size_t len, char **out,
                     size_t *out_len);

#endif
