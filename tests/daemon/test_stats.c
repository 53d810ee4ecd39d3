/*
 * test_stats.c — daemon/stats.c: what each recording call adds to the rendered Prometheus text,
 * tenant interning and its overflow, label escaping, histogram bucket edges, the per-worker
 * series (engine records and the supervisor's slot table), and concurrent writers racing a
 * renderer (also run under TSan: label tsan).
 */
#include "testutil.h"

#include "msg.h"
#include "stats.h"
#include "workers.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *render(struct stats *s, const struct workers *w)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(stats_render(s, w, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

/* The value of the sample whose name and labels are exactly `series`, or fails the test. */
static double value(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    fail_msg("no sample %s in:\n%s", series, text);
    return 0;
}

static bool has(const char *text, const char *needle) { return strstr(text, needle) != NULL; }

static struct stats *mk(size_t n_workers)
{
    struct stats *s = NULL;
    assert_int_equal(stats_create(n_workers, &s), 0);
    return s;
}

static void test_empty(void **state)
{
    (void)state;
    struct stats *s = mk(0);
    char *t = render(s, NULL);
    /* every family is announced even before anything happened */
    assert_true(has(t, "# TYPE clocher_requests_total counter\n"));
    assert_true(has(t, "# TYPE clocher_ttft_seconds histogram\n"));
    assert_true(has(t, "# TYPE clocher_queue_depth gauge\n"));
    assert_true(has(t, "# HELP clocher_kv_blocks "));
    assert_int_equal(value(t, "clocher_queue_depth"), 0);
    assert_false(has(t, "_other"));
    assert_false(has(t, "tenant="));
    free(t);
    stats_destroy(s);
    stats_destroy(NULL);
}

static void test_requests_and_generations(void **state)
{
    (void)state;
    struct stats *s = mk(1);
    stats_request(s, "acme", "Generate", 0);
    stats_request(s, "acme", "Generate", 0);
    stats_request(s, "acme", "Generate", 14);
    stats_request(s, "", "Tokenize", 3);
    stats_request(s, NULL, "Health.Check", 0);
    stats_request(s, "acme", "Generate", 99); /* not a grpc code: UNKNOWN */
    stats_request(s, "acme", "Generate", -1);
    stats_generation(s, "acme", 10, 20, 4, 30000000ull, 2000000ull, 100000000ull);
    stats_generation(s, "acme", 5, 1, 0, 7000000ull, 0, 7000000ull); /* one token: no TPOT */
    stats_queue_depth_add(s, 3);
    stats_queue_depth_add(s, -1);
    stats_active_streams_add(s, "acme", 2);
    stats_active_streams_add(s, "acme", -1);
    stats_active_streams_add(s, "", 1);

    char *t = render(s, NULL);
    assert_int_equal(
        value(t, "clocher_requests_total{method=\"Generate\",status=\"OK\",tenant=\"acme\"}"), 2);
    assert_int_equal(value(t, "clocher_requests_total{method=\"Generate\",status=\"UNAVAILABLE\","
                              "tenant=\"acme\"}"),
                     1);
    assert_int_equal(value(t, "clocher_requests_total{method=\"Generate\",status=\"UNKNOWN\","
                              "tenant=\"acme\"}"),
                     2);
    assert_int_equal(value(t, "clocher_requests_total{method=\"Tokenize\","
                              "status=\"INVALID_ARGUMENT\",tenant=\"anonymous\"}"),
                     1);
    assert_int_equal(value(t, "clocher_requests_total{method=\"Health.Check\",status=\"OK\","
                              "tenant=\"anonymous\"}"),
                     1);
    /* combinations that never happened are not rendered */
    assert_false(has(t, "method=\"Tokenize\",status=\"OK\""));

    assert_int_equal(value(t, "clocher_prompt_tokens_total{tenant=\"acme\"}"), 15);
    assert_int_equal(value(t, "clocher_completion_tokens_total{tenant=\"acme\"}"), 21);
    assert_int_equal(value(t, "clocher_cached_tokens_total{tenant=\"acme\"}"), 4);
    assert_int_equal(value(t, "clocher_prompt_tokens_total{tenant=\"anonymous\"}"), 0);

    /* TTFT 30 ms and 7 ms: le 0.005 has none, le 0.01 one, le 0.05 both */
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"acme\",le=\"0.005\"}"), 0);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"acme\",le=\"0.01\"}"), 1);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"acme\",le=\"0.025\"}"), 1);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"acme\",le=\"0.05\"}"), 2);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"acme\",le=\"+Inf\"}"), 2);
    assert_int_equal(value(t, "clocher_ttft_seconds_count{tenant=\"acme\"}"), 2);
    assert_float_equal(value(t, "clocher_ttft_seconds_sum{tenant=\"acme\"}"), 0.037, 1e-9);
    assert_int_equal(value(t, "clocher_tpot_seconds_count{tenant=\"acme\"}"), 1);
    assert_int_equal(value(t, "clocher_e2e_seconds_count{tenant=\"acme\"}"), 2);
    assert_int_equal(value(t, "clocher_e2e_seconds_bucket{tenant=\"acme\",le=\"0.1\"}"), 2);
    assert_int_equal(value(t, "clocher_e2e_seconds_bucket{tenant=\"acme\",le=\"0.05\"}"), 1);

    assert_int_equal(value(t, "clocher_queue_depth"), 2);
    assert_int_equal(value(t, "clocher_active_streams{tenant=\"acme\"}"), 1);
    assert_int_equal(value(t, "clocher_active_streams{tenant=\"anonymous\"}"), 1);
    free(t);
    stats_destroy(s);
}

static void test_bucket_edges(void **state)
{
    (void)state;
    struct stats *s = mk(0);
    /* le is inclusive: exactly 5 ms lands in 0.005; one ns more in 0.01; beyond 60 s in +Inf */
    stats_generation(s, "t", 0, 0, 0, 5000000ull, 0, 0);
    stats_generation(s, "t", 0, 0, 0, 5000001ull, 0, 0);
    stats_generation(s, "t", 0, 0, 0, 60000000000ull, 0, 0);
    stats_generation(s, "t", 0, 0, 0, UINT64_MAX / 4, 0, 0);
    stats_generation(s, "t", 0, 0, 0, 0, 0, 0); /* 0 is not observed */
    char *t = render(s, NULL);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"t\",le=\"0.005\"}"), 1);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"t\",le=\"0.01\"}"), 2);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"t\",le=\"30\"}"), 2);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"t\",le=\"60\"}"), 3);
    assert_int_equal(value(t, "clocher_ttft_seconds_bucket{tenant=\"t\",le=\"+Inf\"}"), 4);
    assert_int_equal(value(t, "clocher_ttft_seconds_count{tenant=\"t\"}"), 4);
    assert_int_equal(value(t, "clocher_tpot_seconds_count{tenant=\"t\"}"), 0);
    free(t);
    stats_destroy(s);
}

static void test_tenant_overflow(void **state)
{
    (void)state;
    struct stats *s = mk(0);
    /* a real tenant called "anonymous" shares anonymous access's series (never two series with
     * the same labels); it takes one entry of the table */
    stats_request(s, "", "Generate", 0);
    stats_request(s, "anonymous", "Generate", 0);
    char name[32];
    for (int i = 0; i < STATS_MAX_TENANTS + 6; i++) {
        snprintf(name, sizeof name, "tenant-%d", i);
        stats_request(s, name, "Generate", 0);
        stats_request(s, name, "Generate", 0); /* the second time: found, not interned again */
    }
    /* names config.c would refuse, and the overflow label itself, count as "_other" too */
    stats_request(s, "bad name", "Generate", 0);
    stats_request(s, "_other", "Generate", 0);
    stats_request(s, "x\"y", "Generate", 0);
    char long_name[100];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    stats_request(s, long_name, "Generate", 0);

    char *t = render(s, NULL);
    snprintf(name, sizeof name, "tenant-%d", STATS_MAX_TENANTS - 2);
    char series[160];
    snprintf(series, sizeof series,
             "clocher_requests_total{method=\"Generate\",status=\"OK\",tenant=\"%s\"}", name);
    assert_int_equal(value(t, series), 2);
    /* "anonymous" + 63 named tenants fill the table: the 64th name onwards overflows */
    snprintf(name, sizeof name, "tenant-%d", STATS_MAX_TENANTS - 1);
    assert_false(has(t, name));
    assert_int_equal(
        value(t, "clocher_requests_total{method=\"Generate\",status=\"OK\",tenant=\"_other\"}"),
        2 * 7 + 4);
    assert_int_equal(
        value(t, "clocher_requests_total{method=\"Generate\",status=\"OK\","
                 "tenant=\"anonymous\"}"),
        2);
    assert_int_equal(value(t, "clocher_active_streams{tenant=\"_other\"}"), 0);
    free(t);
    stats_destroy(s);
}

static void test_method_labels(void **state)
{
    (void)state;
    struct stats *s = mk(0);
    stats_request(s, "a", "Odd\"Name\\", 0);
    stats_request(s, "a", "has space", 0); /* not printable-without-space: "_other" */
    stats_request(s, "a", "", 0);
    stats_request(s, "a", NULL, 0);
    char m[16];
    for (int i = 0; i < 40; i++) {
        snprintf(m, sizeof m, "M%d", i);
        stats_request(s, "a", m, 1);
    }
    char *t = render(s, NULL);
    assert_int_equal(value(t, "clocher_requests_total{method=\"Odd\\\"Name\\\\\",status=\"OK\","
                              "tenant=\"a\"}"),
                     1);
    assert_int_equal(
        value(t, "clocher_requests_total{method=\"_other\",status=\"OK\",tenant=\"a\"}"), 3);
    /* 32 methods in the table, one taken by Odd"Name\: M0..M30 get their own, M31.. overflow */
    assert_int_equal(
        value(t, "clocher_requests_total{method=\"M30\",status=\"CANCELLED\",tenant=\"a\"}"), 1);
    assert_false(has(t, "method=\"M31\""));
    assert_int_equal(
        value(t, "clocher_requests_total{method=\"_other\",status=\"CANCELLED\",tenant=\"a\"}"),
        9);
    free(t);
    stats_destroy(s);
}

static void test_workers(void **state)
{
    (void)state;
    struct stats *s = mk(2);
    struct shm_msg_stats m = {.running = 3, .waiting = 1, .kv_blocks_total = 100,
                              .kv_blocks_used = 40, .kv_blocks_cached = 10,
                              .prefix_hit_tokens = 7, .prefix_miss_tokens = 9, .preemptions = 2,
                              .requests_finished = 5, .tokens_generated = 50,
                              .tokens_prefilled = 60, .rss_bytes = 1 << 20};
    stats_worker_engine(s, 1, &m);
    m.running = 4; /* the latest record replaces the previous one */
    stats_worker_engine(s, 1, &m);
    tu_log_capture_begin();
    stats_worker_engine(s, 2, &m); /* no such slot: ignored, with a warning */
    tu_log_capture_end();
    tu_assert_log_contains("worker 2", NULL);

    struct workers_slot slots[2];
    memset(slots, 0, sizeof slots);
    struct workers w = {.magic = WORKERS_MAGIC, .n = 2, .slots = slots};
    atomic_init(&w.phase, WORKERS_PHASE_SERVING);
    for (int i = 0; i < 2; i++) {
        slots[i].magic = WORKERS_SLOT_MAGIC;
        slots[i].index = (unsigned)i;
        slots[i].node = i;
        atomic_init(&slots[i].state, i == 0 ? WORKERS_READY : WORKERS_DEAD);
        atomic_init(&slots[i].generation, (uint32_t)(i + 1));
        atomic_init(&slots[i].restarts, (uint64_t)(i * 3));
        atomic_init(&slots[i].given_up, i == 1);
        atomic_init(&slots[i].hot_replicated_bytes, (uint64_t)(4096 * (i + 1)));
        atomic_init(&slots[i].hot_replicated_tensors, (uint64_t)(3 * (i + 1)));
    }

    char *t = render(s, &w);
    /* the engine series exist only for slots that sent a record */
    assert_false(has(t, "clocher_running_sequences{worker=\"0\""));
    assert_int_equal(value(t, "clocher_running_sequences{worker=\"1\",node=\"1\"}"), 4);
    assert_int_equal(value(t, "clocher_waiting_sequences{worker=\"1\",node=\"1\"}"), 1);
    assert_int_equal(value(t, "clocher_kv_blocks{worker=\"1\",node=\"1\",state=\"used\"}"), 40);
    assert_int_equal(value(t, "clocher_kv_blocks{worker=\"1\",node=\"1\",state=\"cached\"}"), 10);
    assert_int_equal(value(t, "clocher_kv_blocks{worker=\"1\",node=\"1\",state=\"free\"}"), 50);
    assert_int_equal(value(t, "clocher_prefix_hit_tokens_total{worker=\"1\",node=\"1\"}"), 7);
    assert_int_equal(value(t, "clocher_prefix_miss_tokens_total{worker=\"1\",node=\"1\"}"), 9);
    assert_int_equal(value(t, "clocher_preemptions_total{worker=\"1\",node=\"1\"}"), 2);
    assert_int_equal(value(t, "clocher_worker_rss_bytes{worker=\"1\",node=\"1\"}"), 1 << 20);
    /* the supervisor's series, from the slot table */
    assert_int_equal(value(t, "clocher_worker_state{worker=\"0\",node=\"0\",state=\"ready\"}"), 1);
    assert_int_equal(value(t, "clocher_worker_state{worker=\"0\",node=\"0\",state=\"dead\"}"), 0);
    assert_int_equal(value(t, "clocher_worker_state{worker=\"1\",node=\"1\",state=\"dead\"}"), 1);
    assert_int_equal(value(t, "clocher_worker_restarts_total{worker=\"1\",node=\"1\"}"), 3);
    assert_int_equal(value(t, "clocher_worker_given_up{worker=\"1\",node=\"1\"}"), 1);
    assert_int_equal(value(t, "clocher_worker_generation{worker=\"1\",node=\"1\"}"), 2);
    assert_int_equal(value(t, "clocher_worker_hot_replicated_bytes{worker=\"0\",node=\"0\"}"),
                     4096);
    assert_int_equal(value(t, "clocher_worker_hot_replicated_tensors{worker=\"1\",node=\"1\"}"),
                     6);
    assert_int_equal(value(t, "clocher_workers_ready"), 1);
    assert_int_equal(value(t, "clocher_daemon_phase{phase=\"serving\"}"), 1);
    assert_int_equal(value(t, "clocher_daemon_phase{phase=\"starting\"}"), 0);
    free(t);

    /* without the slot table: engine series still there, node unknown, no supervisor series */
    t = render(s, NULL);
    assert_int_equal(value(t, "clocher_running_sequences{worker=\"1\",node=\"unknown\"}"), 4);
    assert_false(has(t, "clocher_worker_state{"));
    free(t);

    /* a record whose used + cached exceed the total renders free = 0, not a wrapped value */
    m.kv_blocks_used = 90;
    m.kv_blocks_cached = 20;
    stats_worker_engine(s, 0, &m);
    t = render(s, &w);
    assert_int_equal(value(t, "clocher_kv_blocks{worker=\"0\",node=\"0\",state=\"free\"}"), 0);
    free(t);
    stats_destroy(s);
}

/* ---- concurrency: writers on every path while a renderer scrapes ---- */

#define N_WRITERS 4
#define N_ITERS 20000

struct race {
    struct stats *s;
    int id;
    atomic_bool *stop;
};

static void *writer(void *arg)
{
    struct race *r = arg;
    char mine[32], method[16];
    snprintf(mine, sizeof mine, "w%d", r->id);
    struct shm_msg_stats m = {.kv_blocks_total = 10};
    for (int i = 0; i < N_ITERS; i++) {
        /* new names keep arriving while others look them up, so interning races lookups */
        char fresh[32];
        snprintf(fresh, sizeof fresh, "t%d-%d", r->id, i % 40);
        snprintf(method, sizeof method, "M%d", i % 8);
        stats_request(r->s, "shared", method, i % 3);
        stats_request(r->s, fresh, "Generate", 0);
        stats_generation(r->s, mine, 1, 2, 1, (uint64_t)(i % 1000) * 1000000ull, 1000000ull,
                         5000000ull);
        stats_active_streams_add(r->s, "shared", 1);
        stats_queue_depth_add(r->s, 1);
        stats_active_streams_add(r->s, "shared", -1);
        stats_queue_depth_add(r->s, -1);
        m.running = (uint32_t)i;
        m.kv_blocks_used = (uint64_t)(i % 10);
        stats_worker_engine(r->s, (unsigned)r->id % 2, &m);
    }
    return NULL;
}

static void *renderer(void *arg)
{
    struct race *r = arg;
    size_t scrapes = 0;
    while (!atomic_load(r->stop) || scrapes == 0) {
        char *t = NULL;
        size_t len = 0;
        assert_int_equal(stats_render(r->s, NULL, &t, &len), 0);
        free(t);
        scrapes++;
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    struct stats *s = mk(2);
    atomic_bool stop;
    atomic_init(&stop, false);
    pthread_t th[N_WRITERS], rd;
    struct race rs[N_WRITERS], rr = {.s = s, .id = -1, .stop = &stop};
    /* the names checked below take their table entries first; the fresh ones race for the rest */
    stats_active_streams_add(s, "shared", 0);
    for (int i = 0; i < N_WRITERS; i++) {
        char mine[32];
        snprintf(mine, sizeof mine, "w%d", i);
        stats_active_streams_add(s, mine, 0);
    }
    assert_int_equal(pthread_create(&rd, NULL, renderer, &rr), 0);
    for (int i = 0; i < N_WRITERS; i++) {
        rs[i] = (struct race){.s = s, .id = i, .stop = &stop};
        assert_int_equal(pthread_create(&th[i], NULL, writer, &rs[i]), 0);
    }
    for (int i = 0; i < N_WRITERS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    atomic_store(&stop, true);
    assert_int_equal(pthread_join(rd, NULL), 0);

    /* no update was lost: every total equals what the writers did */
    char *t = render(s, NULL);
    uint64_t shared = 0;
    for (int m = 0; m < 8; m++)
        for (int c = 0; c < 3; c++) {
            static const char *const code[] = {"OK", "CANCELLED", "UNKNOWN"};
            char series[128];
            snprintf(series, sizeof series,
                     "clocher_requests_total{method=\"M%d\",status=\"%s\",tenant=\"shared\"}", m,
                     code[c]);
            shared += (uint64_t)value(t, series);
        }
    assert_int_equal(shared, (uint64_t)N_WRITERS * N_ITERS);
    for (int i = 0; i < N_WRITERS; i++) {
        char series[96];
        snprintf(series, sizeof series, "clocher_completion_tokens_total{tenant=\"w%d\"}", i);
        assert_int_equal(value(t, series), 2.0 * N_ITERS);
        snprintf(series, sizeof series, "clocher_ttft_seconds_count{tenant=\"w%d\"}", i);
        /* i % 1000 == 0 is a 0 ns TTFT: not observed */
        assert_int_equal(value(t, series), N_ITERS - N_ITERS / 1000);
    }
    /* 1 "shared" + 4 writers' own + 160 fresh names: the table is full, the rest overflowed;
     * every fresh-name request is counted once, under its name or "_other" */
    double fresh_total = 0;
    for (const char *p = t; (p = strstr(p, "clocher_requests_total{method=\"Generate\"")); p++) {
        const char *sp = strchr(p, ' ');
        fresh_total += strtod(sp + 1, NULL);
    }
    assert_int_equal(fresh_total, (double)N_WRITERS * N_ITERS);
    assert_int_equal(value(t, "clocher_queue_depth"), 0);
    assert_int_equal(value(t, "clocher_active_streams{tenant=\"shared\"}"), 0);
    assert_int_equal(value(t, "clocher_running_sequences{worker=\"0\",node=\"unknown\"}"),
                     N_ITERS - 1);
    free(t);
    stats_destroy(s);
}

/* stats_render_for: a tenant's own series only (GetMetrics for a tenant that is not an admin);
 * quota refusals and the rapid-reset counters. */
static void test_scoped_and_throttles(void **state)
{
    (void)state;
    struct stats *s = mk(0);
    stats_request(s, "alice", "Generate", 0);
    stats_request(s, "bob", "Generate", 8);
    stats_generation(s, "bob", 3, 4, 0, 1000, 1000, 1000);
    stats_throttled(s, "bob", "tokens_per_min");
    stats_throttled(s, "bob", "no_such_limit"); /* ignored */
    stats_early_reset(s, false);
    stats_early_reset(s, true);
    stats_global_refusal(s, "max_calls");
    stats_global_refusal(s, "max_connections");
    stats_global_refusal(s, "max_connections");
    stats_global_refusal(s, "no_such_cap"); /* ignored */
    stats_request(s, "", "Generate", 0); /* anonymous access */
    for (int i = 0; i < STATS_MAX_TENANTS + 2; i++) { /* fills the overflow entry */
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        stats_request(s, name, "Tokenize", 0);
    }
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(stats_render_for(s, NULL, "bob", &text, &len), 0);
    assert_true(has(text, "tenant=\"bob\""));
    assert_false(has(text, "alice"));
    assert_false(has(text, "_other"));
    assert_false(has(text, "tenant=\"t1\""));
    assert_int_equal(value(text, "clocher_throttled_total{tenant=\"bob\",limit=\"tokens_per_min\"}"),
                     1);
    assert_int_equal(value(text, "clocher_completion_tokens_total{tenant=\"bob\"}"), 4);
    assert_int_equal(value(text, "clocher_early_resets_total"), 2);
    assert_int_equal(value(text, "clocher_connections_closed_total"), 1);
    assert_int_equal(value(text, "clocher_global_refusals_total{limit=\"max_calls\"}"), 1);
    assert_int_equal(value(text, "clocher_global_refusals_total{limit=\"max_connections\"}"), 2);
    free(text);
    char *all = render(s, NULL);
    assert_true(has(all, "tenant=\"alice\""));
    assert_true(has(all, "_other"));
    free(all);
    /* anonymous ("") sees the anonymous series */
    assert_int_equal(stats_render_for(s, NULL, "", &text, &len), 0);
    assert_true(has(text, "tenant=\"anonymous\""));
    assert_false(has(text, "bob"));
    free(text);
    stats_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_requests_and_generations),
        cmocka_unit_test(test_bucket_edges),
        cmocka_unit_test(test_tenant_overflow),
        cmocka_unit_test(test_method_labels),
        cmocka_unit_test(test_workers),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_scoped_and_throttles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
