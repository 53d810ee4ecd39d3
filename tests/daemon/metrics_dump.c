/*
 * metrics_dump.c — a driver for tests/daemon/test_prometheus.py: reads stats calls from stdin,
 * one a line, makes them on a fresh struct stats with a two-slot worker table, and prints
 * stats_render's text (exactly what GET /metrics serves) on stdout. The python side checks
 * that Prometheus' own parser reads it and that every value agrees with the calls.
 *
 *   request TENANT METHOD STATUS
 *   generation TENANT PROMPT COMPLETION CACHED TTFT_NS TPOT_NS E2E_NS
 *   queue DELTA
 *   streams TENANT DELTA
 *   engine SLOT RUNNING WAITING KV_TOTAL KV_USED KV_CACHED HIT MISS PREEMPT RSS
 *   slot SLOT NODE STATE RESTARTS HOT_BYTES GENERATION
 *   phase PHASE
 * TENANT "-" is anonymous access (""). Exit status 1 on a line it cannot read.
 */
#include "msg.h"
#include "stats.h"
#include "workers.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SLOTS 2

static const char *tenant(const char *t) { return strcmp(t, "-") == 0 ? "" : t; }

int main(void)
{
    struct stats *s = NULL;
    if (stats_create(N_SLOTS, &s) < 0)
        return 1;
    struct workers_slot slots[N_SLOTS];
    memset(slots, 0, sizeof slots);
    struct workers w = {.magic = WORKERS_MAGIC, .n = N_SLOTS, .slots = slots, .stats = s};
    atomic_init(&w.phase, WORKERS_PHASE_STARTING);
    for (unsigned i = 0; i < N_SLOTS; i++) {
        slots[i].magic = WORKERS_SLOT_MAGIC;
        slots[i].index = i;
        atomic_init(&slots[i].state, WORKERS_DEAD);
    }

    char line[1024], a[256], b[256];
    unsigned long lineno = 0;
    while (fgets(line, sizeof line, stdin)) {
        lineno++;
        uint64_t v[10];
        int i1;
        unsigned u;
        int64_t d;
        if (sscanf(line, "request %255s %255s %d", a, b, &i1) == 3) {
            stats_request(s, tenant(a), b, i1);
        } else if (sscanf(line,
                          "generation %255s %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                          " %" SCNu64 " %" SCNu64,
                          a, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 7) {
            stats_generation(s, tenant(a), v[0], v[1], v[2], v[3], v[4], v[5]);
        } else if (sscanf(line, "queue %" SCNd64, &d) == 1) {
            stats_queue_depth_add(s, d);
        } else if (sscanf(line, "streams %255s %" SCNd64, a, &d) == 2) {
            stats_active_streams_add(s, tenant(a), d);
        } else if (sscanf(line,
                          "engine %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                          " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                          &u, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7],
                          &v[8]) == 10) {
            struct shm_msg_stats m = {.running = (uint32_t)v[0], .waiting = (uint32_t)v[1],
                                      .kv_blocks_total = v[2], .kv_blocks_used = v[3],
                                      .kv_blocks_cached = v[4], .prefix_hit_tokens = v[5],
                                      .prefix_miss_tokens = v[6], .preemptions = v[7],
                                      .rss_bytes = v[8]};
            stats_worker_engine(s, u, &m);
        } else if (sscanf(line,
                          "slot %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                          &u, &v[0], &v[1], &v[2], &v[3], &v[4]) == 6 &&
                   u < N_SLOTS) {
            slots[u].node = (int)v[0];
            atomic_store(&slots[u].state, (int)v[1]);
            atomic_store(&slots[u].restarts, v[2]);
            atomic_store(&slots[u].hot_replicated_bytes, v[3]);
            atomic_store(&slots[u].generation, (uint32_t)v[4]);
        } else if (sscanf(line, "phase %d", &i1) == 1) {
            atomic_store(&w.phase, i1);
        } else {
            fprintf(stderr, "metrics_dump: line %lu: cannot read \"%s\"\n", lineno, line);
            return 1;
        }
    }
    char *text = NULL;
    size_t len = 0;
    if (stats_render(s, &w, &text, &len) < 0)
        return 1;
    fwrite(text, 1, len, stdout);
    free(text);
    stats_destroy(s);
    return fflush(stdout) == 0 ? 0 : 1;
}
