/*
 * test_heritage.c — the worker's inheritance (shm/heritage.h) as a drift guard: the argv the
 * supervisor builds parses back to the same fields through the worker's parser, byte for byte
 * the command line clocherd has always passed; every option, control key and environment
 * variable of the tables is documented in docs/DAEMON.md and listed by `clocher-worker --help`;
 * the environment drops systemd's variables and round-trips the two it owns.
 */
#include "testutil.h"

#include "err.h"
#include "heritage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* docs/DAEMON.md, whole, NUL-terminated (the caller frees it). */
static char *read_doc(const char *rel)
{
    const char *src = getenv("CLOCHER_SOURCE_DIR");
    if (!src)
        fail_msg("CLOCHER_SOURCE_DIR is not set (run through ctest)");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", src, rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* `--name` followed by a character that cannot continue an option name. */
static bool has_option(const char *text, const char *name)
{
    char want[80];
    snprintf(want, sizeof want, "--%s", name);
    for (const char *p = strstr(text, want); p; p = strstr(p + 1, want)) {
        char c = p[strlen(want)];
        if (c != '-' && (c < 'a' || c > 'z'))
            return true;
    }
    return false;
}

#define OPTION_NAME(field, name, kind, arg, dflt, max, emit, help) name,
static const char *const option_names[] = {HERITAGE_OPTIONS(OPTION_NAME)};
#define N_OPTIONS (sizeof option_names / sizeof option_names[0])

static void test_documented(void **state)
{
    (void)state;
    char *doc = read_doc("docs/DAEMON.md");
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!has_option(doc, option_names[i]))
            fail_msg("clocher-worker --%s is missing from docs/DAEMON.md", option_names[i]);
    for (int k = 0; k < HERITAGE_CTL_NKEYS; k++) {
        char want[32];
        snprintf(want, sizeof want, "`%s=", heritage_ctl_keys[k].name);
        if (!strstr(doc, want))
            fail_msg("control key %s is missing from docs/DAEMON.md", heritage_ctl_keys[k].name);
    }
    static const char *const env[] = {
        HERITAGE_ENV_HOT_REPLICATE, HERITAGE_ENV_HOT_REPL_LIMIT_MB,
#define DROPPED(name) name,
        HERITAGE_ENV_DROPPED(DROPPED)
#undef DROPPED
    };
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
        if (!strstr(doc, env[i]))
            fail_msg("environment variable %s is missing from docs/DAEMON.md", env[i]);
    free(doc);
}

static void test_help_lists_every_option(void **state)
{
    (void)state;
    const char *build = getenv("CLOCHER_BUILD_DIR");
    if (!build)
        fail_msg("CLOCHER_BUILD_DIR is not set (run through ctest)");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "%s/worker/clocher-worker --help", build);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != HERITAGE_EXIT_OK)
        fail_msg("%s: status %d, output:\n%s", cmd, st, out);
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!has_option(out, option_names[i]))
            fail_msg("clocher-worker --help does not list --%s:\n%s", option_names[i], out);
}

/* The supervisor's fields for one worker, every optional one set. */
static void full_args(struct heritage_args *h)
{
    heritage_args_init(h);
    h->slot = 1;
    h->generation = 4;
    h->control_fd = HERITAGE_FD_CONTROL;
    h->region_fd = HERITAGE_FD_REGION;
    h->cpus = "8-15";
    h->mem_node = 1;
    h->model_dir = "/var/lib/clocherd/models/x";
    h->threads = 8;
    h->kv_budget_mb = 2048;
    h->max_queue = 256;
    h->max_prompt_tokens = 4096;
    h->parent_pid = 812;
    h->lora_weights = HERITAGE_LORA_WEIGHTS_BF16;
    h->kv_dtype = "int8";
    h->n_adapters = 2;
    h->adapters_name[0] = "sql";
    h->adapters_dir[0] = "/a/sql";
    h->adapters_name[1] = "chat";
    h->adapters_dir[1] = "/a/chat=v2"; /* '=' in the directory: split at the first */
}

static int argc_of(char **v)
{
    int n = 0;
    while (v[n])
        n++;
    return n;
}

/* Every field of the table compared, by the table. */
static void assert_same(const struct heritage_args *a, const struct heritage_args *b)
{
#define CMP_NUM(f) assert_int_equal(a->f, b->f);
#define CMP_STR(f)                                                                                 \
    if (!a->f || !b->f)                                                                            \
        assert_ptr_equal(a->f, b->f);                                                              \
    else                                                                                           \
        assert_string_equal(a->f, b->f);
#define CMP_LIST(f)                                                                                \
    assert_int_equal(a->n_##f, b->n_##f);                                                          \
    for (size_t i = 0; i < a->n_##f; i++) {                                                        \
        assert_string_equal(a->f##_name[i], b->f##_name[i]);                                       \
        assert_string_equal(a->f##_dir[i], b->f##_dir[i]);                                         \
    }
#define CMP(field, name, kind, arg, dflt, max, emit, help) CMP_##kind(field)
    HERITAGE_OPTIONS(CMP)
#undef CMP
}

static void test_roundtrip(void **state)
{
    (void)state;
    struct heritage_args h, back;
    full_args(&h);
    char **v = heritage_argv_build("/usr/libexec/clocher/clocher-worker", &h);
    assert_non_null(v);
    /* the command line clocherd passed before the table existed, in the same order */
    static const char *const want[] = {
        "/usr/libexec/clocher/clocher-worker", "--slot", "1", "--generation", "4",
        "--control-fd", "3", "--region-fd", "4", "--cpus", "8-15", "--mem-node", "1",
        "--model-dir", "/var/lib/clocherd/models/x", "--threads", "8", "--kv-budget-mb", "2048",
        "--max-queue", "256", "--max-prompt-tokens", "4096", "--parent-pid", "812",
        "--lora-weights", "bf16", "--kv-dtype", "int8", "--adapter", "sql=/a/sql", "--adapter", "chat=/a/chat=v2",
        NULL};
    for (size_t i = 0; want[i] || v[i]; i++) {
        if (!want[i] || !v[i] || strcmp(want[i], v[i]) != 0)
            fail_msg("argv[%zu] is \"%s\", want \"%s\"", i, v[i] ? v[i] : "(end)",
                     want[i] ? want[i] : "(end)");
    }
    assert_int_equal(heritage_args_parse(argc_of(v), v, &back), 0);
    assert_same(&h, &back);
    free(v);

    /* the optional ones at their defaults are left out, and come back as defaults */
    h.mem_node = -1;
    h.lora_weights = HERITAGE_LORA_WEIGHTS_AUTO;
    h.kv_dtype = HERITAGE_KV_DTYPE_DEFAULT;
    h.n_adapters = 0;
    h.kv_budget_mb = 0; /* ALWAYS: passed even at its default */
    v = heritage_argv_build("w", &h);
    assert_non_null(v);
    assert_int_equal(argc_of(v), 1 + 2 * 11);
    for (int i = 0; v[i]; i++) {
        assert_string_not_equal(v[i], "--mem-node");
        assert_string_not_equal(v[i], "--lora-weights");
        assert_string_not_equal(v[i], "--kv-dtype");
        assert_string_not_equal(v[i], "--adapter");
    }
    assert_int_equal(heritage_args_parse(argc_of(v), v, &back), 0);
    assert_same(&h, &back);
    free(v);
}

static void test_parse_refuses(void **state)
{
    (void)state;
    static const struct {
        const char *args[8];
        const char *needle;
    } bad[] = {
        {{"--generation", "1", "--control-fd", "3", "--region-fd", "4", "--cpus", "0"},
         "--slot is missing"},
        {{"--slot", "4096"}, "--slot: want an integer in 0..4095"},
        {{"--slot", "-1"}, "want an integer"},
        {{"--generation", "4294967296"}, "--generation: want an integer in 0..4294967295"},
        {{"--threads", "x"}, "--threads"},
        {{"--adapter", "noequals"}, "--adapter: want NAME=DIR"},
        {{"--adapter", "=dir"}, "want NAME=DIR"},
        {{"--adapter", "name="}, "want NAME=DIR"},
        {{"stray"}, "unexpected argument \"stray\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[10] = {"w"};
        int argc = 1;
        char copies[8][64];
        for (int k = 0; k < 8 && bad[i].args[k]; k++) {
            snprintf(copies[k], sizeof copies[k], "%s", bad[i].args[k]);
            argv[argc++] = copies[k];
        }
        struct heritage_args h;
        tu_log_capture_begin();
        int rc = heritage_args_parse(argc, argv, &h);
        tu_log_capture_end();
        if (rc != ERR_USAGE)
            fail_msg("case %zu: %d, want ERR_USAGE", i, rc);
        tu_assert_log_contains(bad[i].needle, NULL);
    }
    char *help[] = {"w", "--help", NULL};
    struct heritage_args h;
    assert_int_equal(heritage_args_parse(2, help, &h), HERITAGE_HELP);
}

static void test_env(void **state)
{
    (void)state;
    char *in[] = {"PATH=/bin", "NOTIFY_SOCKET=/run/systemd/notify", "WATCHDOG_USEC=1000",
                  "WATCHDOG_PID=1", "IE_HOT_REPLICATE=0", "IE_HOT_REPL_LIMIT_MB=5",
                  "NOTIFY_SOCKETX=kept", "HOME=/root", NULL};
    struct heritage_env e = {.hot_replicate = true, .hot_repl_limit_mb = 640};
    struct heritage_env_store store;
    char **out = heritage_env_build(in, &e, &store);
    assert_non_null(out);
    static const char *const want[] = {"PATH=/bin", "NOTIFY_SOCKETX=kept", "HOME=/root",
                                       "IE_HOT_REPLICATE=1", "IE_HOT_REPL_LIMIT_MB=640", NULL};
    for (size_t i = 0; want[i] || out[i]; i++) {
        if (!want[i] || !out[i] || strcmp(want[i], out[i]) != 0)
            fail_msg("env[%zu] is \"%s\", want \"%s\"", i, out[i] ? out[i] : "(end)",
                     want[i] ? want[i] : "(end)");
    }
    /* what the worker reads back */
    for (size_t i = 0; out[i]; i++)
        if (strncmp(out[i], "IE_", 3) == 0)
            putenv(out[i]);
    struct heritage_env back;
    assert_int_equal(heritage_env_parse(&back), 0);
    assert_true(back.hot_replicate);
    assert_int_equal(back.hot_repl_limit_mb, 640);
    free(out);
    setenv(HERITAGE_ENV_HOT_REPL_LIMIT_MB, "16777217", 1);
    tu_log_capture_begin();
    assert_int_equal(heritage_env_parse(&back), ERR_USAGE);
    tu_log_capture_end();
    tu_assert_log_contains("IE_HOT_REPL_LIMIT_MB", "0..16777216", NULL);
    unsetenv(HERITAGE_ENV_HOT_REPL_LIMIT_MB);
    unsetenv(HERITAGE_ENV_HOT_REPLICATE);
}

static void test_ctl_format(void **state)
{
    (void)state;
    char buf[HERITAGE_CTL_MSG_MAX + 1];
    struct heritage_ctl_msg m = {.ready = true, .has_hot_bytes = true, .hot_bytes = 123456789,
                                 .has_hot_tensors = true, .hot_tensors = 201};
    snprintf(m.status, sizeof m.status, "model /m loaded");
    size_t n = heritage_ctl_format(&m, buf, sizeof buf);
    assert_string_equal(buf,
                        "READY=1\nHOT_BYTES=123456789\nHOT_TENSORS=201\nSTATUS=model /m loaded");
    assert_int_equal(n, strlen(buf));
    n = heritage_ctl_format(&(struct heritage_ctl_msg){.watchdog = true}, buf, sizeof buf);
    assert_string_equal(buf, "WATCHDOG=1");
    /* the longest message fits the limit; a status byte outside printable ASCII becomes '?' */
    struct heritage_ctl_msg big = {.ready = true, .watchdog = true, .has_hot_bytes = true,
                                   .hot_bytes = UINT64_MAX, .has_hot_tensors = true,
                                   .hot_tensors = UINT64_MAX};
    memset(big.status, 'x', sizeof big.status - 1);
    big.status[3] = '\n';
    big.status[4] = (char)0xc3;
    n = heritage_ctl_format(&big, buf, sizeof buf);
    assert_true(n <= HERITAGE_CTL_MSG_MAX);
    assert_non_null(strstr(buf, "STATUS=xxx??xx"));
    for (int k = 0; k < HERITAGE_CTL_NKEYS; k++)
        assert_int_equal(heritage_ctl_key_find(heritage_ctl_keys[k].name,
                                               heritage_ctl_keys[k].len), k);
    assert_int_equal(heritage_ctl_key_find("READ", 4), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_documented),
        cmocka_unit_test(test_help_lists_every_option),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_ctl_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
