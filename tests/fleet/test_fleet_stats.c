/*
 * test_fleet_stats.c — the series routers and dashboards read that the gateway's per-token and
 * per-finish observations feed (daemon/stats.h): inter-token gaps per token (stats_track),
 * queue time and per-adapter counters (stats_finish), the running/waiting split
 * (stats_started), their vllm:* names (daemon/http_vllm.h), and the access log
 * (daemon/accesslog.h): its JSON lines, a path it cannot open, closing it.
 */
#include "testutil.h"

#include "accesslog.h"
#include "err.h"
#include "http_vllm.h"
#include "msg.h"
#include "stats.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MS 1000000ull

static char *render_only(struct stats *s, const char *only)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(stats_render_for(s, NULL, only, &text, &len), 0);
    assert_non_null(text);
    return text;
}

static char *render(struct stats *s) { return render_only(s, NULL); }

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

static void token(struct stats *s, unsigned slot, uint64_t id, int32_t tok, uint64_t now)
{
    struct shm_msg m = {.type = SHM_MSG_TOKEN,
                        .token = {.request_id = id, .token = tok, .text = "x", .text_len = 1}};
    stats_track(s, slot, &m, now);
}

static void finish_rec(struct stats *s, unsigned slot, uint64_t id)
{
    struct shm_msg m = {.type = SHM_MSG_FINISH, .finish = {.request_id = id}};
    stats_track(s, slot, &m, 0);
}

/* Each generated token after the first observes its gap; text-only pieces, other slots'
 * requests and ended requests do not. */
static void test_itl_per_token(void **state)
{
    (void)state;
    struct stats *s = mk(2);
    assert_int_equal(stats_started(s, 0, 7), -1); /* nothing fed yet: cannot tell */
    token(s, 0, 7, 11, 100 * MS);                 /* first token: TTFT, no gap */
    assert_int_equal(stats_started(s, 0, 7), 1);
    assert_int_equal(stats_started(s, 0, 8), 0);
    assert_int_equal(stats_started(s, 1, 7), 0); /* ids are per slot */
    token(s, 0, 7, -1, 101 * MS);                /* a text-only piece: not a token */
    token(s, 0, 7, 12, 102 * MS);                /* gap 2 ms (from the last token) */
    token(s, 1, 9, 5, 103 * MS);                 /* another worker's request: its first */
    token(s, 0, 7, 13, 132 * MS);                /* gap 30 ms */
    token(s, 1, 9, 6, 703 * MS);                 /* gap 600 ms */
    char *t = render(s);
    assert_true(has(t, "# TYPE clocher_itl_seconds histogram\n"));
    assert_int_equal(value(t, "clocher_itl_seconds_bucket{le=\"0.005\"}"), 1);
    assert_int_equal(value(t, "clocher_itl_seconds_bucket{le=\"0.025\"}"), 1);
    assert_int_equal(value(t, "clocher_itl_seconds_bucket{le=\"0.05\"}"), 2);
    assert_int_equal(value(t, "clocher_itl_seconds_bucket{le=\"0.5\"}"), 2);
    assert_int_equal(value(t, "clocher_itl_seconds_bucket{le=\"1\"}"), 3);
    assert_int_equal(value(t, "clocher_itl_seconds_count"), 3);
    assert_float_equal(value(t, "clocher_itl_seconds_sum"), 0.632, 1e-9);
    free(t);

    /* the end forgets it: a later record with the same id starts afresh (no gap) */
    finish_rec(s, 0, 7);
    assert_int_equal(stats_started(s, 0, 7), 0);
    token(s, 0, 7, 14, 5000 * MS);
    /* a worker request STATS_TRACK_PER_SLOT ids later takes the entry over: neither sees a
     * gap that was the other's */
    token(s, 0, 7 + STATS_TRACK_PER_SLOT, 1, 5001 * MS);
    token(s, 0, 7, 15, 5002 * MS);
    /* out-of-range slots and records without a request are ignored */
    token(s, 9, 1, 1, 1);
    token(s, 0, 0, 1, 1);
    struct shm_msg st = {.type = SHM_MSG_STATS};
    stats_track(s, 0, &st, 1);
    t = render(s);
    assert_int_equal(value(t, "clocher_itl_seconds_count"), 3);
    free(t);
    stats_destroy(s);
}

/* FINISH's queue time per tenant and the per-adapter counters; the vllm:* names sum them. */
static void test_finish_queue_adapters(void **state)
{
    (void)state;
    struct stats *s = mk(1);
    struct shm_msg_finish f = {.request_id = 3, .reason = SHM_FINISH_EOS, .prompt_tokens = 10,
                               .completion_tokens = 4, .cached_tokens = 2, .queue_ns = 20 * MS,
                               .ttft_ns = 40 * MS, .tpot_ns = 3 * MS, .e2e_ns = 60 * MS};
    stats_finish(s, "acme", "ad1", &f);
    f.queue_ns = 0; /* never waited: still a sample */
    stats_finish(s, "acme", "", &f);
    f.queue_ns = 2000 * MS;
    stats_finish(s, "", "ad1", &f);
    stats_finish(s, "beta", "bad/name", &f); /* a name config.c refuses: "_other" */
    stats_finish(s, "beta", "_base", &f);    /* cannot pass for the base model */
    char *t = render(s);
    assert_int_equal(value(t, "clocher_queue_seconds_bucket{tenant=\"acme\",le=\"0.005\"}"), 1);
    assert_int_equal(value(t, "clocher_queue_seconds_bucket{tenant=\"acme\",le=\"0.025\"}"), 2);
    assert_int_equal(value(t, "clocher_queue_seconds_count{tenant=\"acme\"}"), 2);
    assert_int_equal(value(t, "clocher_queue_seconds_bucket{tenant=\"anonymous\",le=\"1\"}"), 0);
    assert_int_equal(value(t, "clocher_queue_seconds_bucket{tenant=\"anonymous\",le=\"2.5\"}"),
                     1);
    assert_int_equal(value(t, "clocher_adapter_generations_total{adapter=\"ad1\"}"), 2);
    assert_int_equal(value(t, "clocher_adapter_generations_total{adapter=\"_base\"}"), 1);
    assert_int_equal(value(t, "clocher_adapter_generations_total{adapter=\"_other\"}"), 2);
    assert_int_equal(value(t, "clocher_adapter_prompt_tokens_total{adapter=\"ad1\"}"), 20);
    assert_int_equal(value(t, "clocher_adapter_completion_tokens_total{adapter=\"ad1\"}"), 8);
    /* stats_generation's series as before */
    assert_int_equal(value(t, "clocher_completion_tokens_total{tenant=\"acme\"}"), 8);
    assert_int_equal(value(t, "clocher_ttft_seconds_count{tenant=\"beta\"}"), 2);

    /* the vLLM names: sums over tenants */
    size_t len = strlen(t);
    assert_int_equal(http_vllm_render(NULL, t, len, &t, &len), 0);
    assert_int_equal(value(t, "vllm:request_queue_time_seconds_count{model_name=\"unknown\"}"),
                     5);
    assert_int_equal(
        value(t, "vllm:request_queue_time_seconds_bucket{model_name=\"unknown\",le=\"0.025\"}"),
        2);
    assert_true(has(t, "# TYPE vllm:inter_token_latency_seconds histogram\n"));
    assert_int_equal(value(t, "vllm:inter_token_latency_seconds_count{model_name=\"unknown\"}"),
                     0);
    assert_true(has(t, "waiting_lora_adapters=\"\"")); /* no gateway: nothing in flight */
    free(t);

    /* a tenant's own view: adapters mix tenants, so they are left out */
    t = render_only(s, "acme");
    assert_false(has(t, "clocher_adapter_generations_total{"));
    assert_false(has(t, "tenant=\"beta\""));
    assert_int_equal(value(t, "clocher_queue_seconds_count{tenant=\"acme\"}"), 2);
    free(t);
    stats_destroy(s);
}

/* Reads the lines of `path`, parsed; n_out lines. */
static json_t *read_lines(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    json_t *arr = json_array();
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        assert_true(n > 0 && line[n - 1] == '\n'); /* whole lines only */
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j)
            fail_msg("access log line is not JSON (%s): %s", je.text, line);
        json_array_append_new(arr, j);
    }
    fclose(f);
    *n_out = json_array_size(arr);
    return arr;
}

static void test_access_log(void **state)
{
    (void)state;
    char dir[] = "/tmp/clocher-accesslog-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/access.log", dir);
    snprintf(bad, sizeof bad, "%s/no-such-dir/access.log", dir);
    struct stats *s = mk(1);
    struct shm_msg_finish f = {.request_id = 41, .reason = SHM_FINISH_LENGTH,
                               .prompt_tokens = 9, .completion_tokens = 16, .cached_tokens = 4,
                               .queue_ns = 1 * MS, .ttft_ns = 25 * MS, .e2e_ns = 250 * MS};
    stats_finish(s, "acme", "ad1", &f); /* no log yet: nothing written anywhere */
    assert_int_equal(stats_open_access_log(s, path), 0);
    stats_finish(s, "acme", "ad1", &f);
    f.request_id = 42, f.reason = SHM_FINISH_CANCELLED;
    stats_finish(s, "", "", &f);
    /* a path it cannot open: the error names why, and the open log stays */
    assert_int_equal(stats_open_access_log(s, bad), -ENOENT);
    f.request_id = 43, f.reason = SHM_FINISH_DEADLINE;
    stats_finish(s, "beta", "", &f);
    assert_int_equal(stats_open_access_log(s, NULL), 0); /* closed */
    stats_finish(s, "beta", "", &f);

    size_t n;
    json_t *lines = read_lines(path, &n);
    assert_int_equal(n, 3);
    json_t *a = json_array_get(lines, 0);
    assert_int_equal(json_integer_value(json_object_get(a, "request_id")), 41);
    assert_string_equal(json_string_value(json_object_get(a, "tenant")), "acme");
    assert_string_equal(json_string_value(json_object_get(a, "adapter")), "ad1");
    assert_string_equal(json_string_value(json_object_get(a, "status")), "ok");
    assert_string_equal(json_string_value(json_object_get(a, "finish_reason")), "length");
    assert_int_equal(json_integer_value(json_object_get(a, "prompt_tokens")), 9);
    assert_int_equal(json_integer_value(json_object_get(a, "completion_tokens")), 16);
    assert_int_equal(json_integer_value(json_object_get(a, "cached_tokens")), 4);
    assert_float_equal(json_real_value(json_object_get(a, "ttft_s")), 0.025, 1e-12);
    assert_float_equal(json_real_value(json_object_get(a, "e2e_s")), 0.25, 1e-12);
    assert_float_equal(json_real_value(json_object_get(a, "queue_s")), 0.001, 1e-12);
    const char *ts = json_string_value(json_object_get(a, "ts"));
    assert_non_null(ts);
    assert_int_equal(strlen(ts), 24); /* 2026-11-27T08:00:00.123Z */
    assert_int_equal(ts[23], 'Z');
    json_t *b = json_array_get(lines, 1);
    assert_string_equal(json_string_value(json_object_get(b, "tenant")), "anonymous");
    assert_string_equal(json_string_value(json_object_get(b, "adapter")), "");
    assert_string_equal(json_string_value(json_object_get(b, "status")), "cancelled");
    json_t *c = json_array_get(lines, 2);
    assert_int_equal(json_integer_value(json_object_get(c, "request_id")), 43);
    assert_string_equal(json_string_value(json_object_get(c, "status")), "deadline");
    json_decref(lines);
    stats_destroy(s);

    /* accesslog itself: an empty path is a usage error */
    struct accesslog *al = (struct accesslog *)1;
    assert_int_equal(accesslog_open("", &al), ERR_USAGE);
    assert_null(al);
    assert_int_equal(accesslog_open(path, &al), 0);
    assert_int_equal(accesslog_failures(al), 0);
    accesslog_close(al);
    accesslog_close(NULL);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_itl_per_token),
        cmocka_unit_test(test_finish_queue_adapters),
        cmocka_unit_test(test_access_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
