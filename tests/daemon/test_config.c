/*
 * test_config.c — clocherd's JSON configuration: defaults, paths, every kind of bad field
 * (return code AND a message naming the field), reload rules, the shared snapshot.
 */
#include "testutil.h"

#include "config.h"
#include "err.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* A self-signed P-256 certificate and its key (CN=localhost, valid to 2126), and another key. */
#define TEST_CERT \
    "-----BEGIN CERTIFICATE-----\n" \
    "MIIBfzCCASWgAwIBAgIURuTmYnBkjVopSt7G3gZg2okz/+4wCgYIKoZIzj0EAwIw\n" \
    "FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyNzA0MjY1NVoYDzIxMjYxMTAz\n" \
    "MDQyNjU1WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO\n" \
    "PQMBBwNCAAS+91MO9bzIo0vNEQitHA5IvakyFn6XcDr5ETqODXKE3NgSV6PX6xrC\n" \
    "v32Jfk3tqZHkO54kWA9NbWtQwSD/O6uxo1MwUTAdBgNVHQ4EFgQUez3CDURTyn4a\n" \
    "yAvkxZIFCZrdGDUwHwYDVR0jBBgwFoAUez3CDURTyn4ayAvkxZIFCZrdGDUwDwYD\n" \
    "VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEA7UVYOxZ9FsBqEKlOSkfr\n" \
    "bS+sN08M/59dkRT01jyq4LoCIHPsSt2mZYDpt+Yyon+2Y0ZyECtjKr+TZlnSdYir\n" \
    "mGw/\n" \
    "-----END CERTIFICATE-----\n"
#define TEST_KEY \
    "-----BEGIN PRIVATE KEY-----\n" \
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgf43owkl43JyU3ef1\n" \
    "DkBVCMyEgshIgK/iiSQXHobZLwWhRANCAAS+91MO9bzIo0vNEQitHA5IvakyFn6X\n" \
    "cDr5ETqODXKE3NgSV6PX6xrCv32Jfk3tqZHkO54kWA9NbWtQwSD/O6ux\n" \
    "-----END PRIVATE KEY-----\n"
#define TEST_OTHER_KEY \
    "-----BEGIN PRIVATE KEY-----\n" \
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgH35Z76TatMf2C9eb\n" \
    "K822Ot2GajqgrXos/KN2wVPMmq2hRANCAASjTagyrNv75/dDrvB0/PFBURtIpYLY\n" \
    "kb6CpalMrrhBxl7j/SC+cgqlYrKBEhU987LS0hj1mr/XwV0qfuDui4+A\n" \
    "-----END PRIVATE KEY-----\n"

static void put(const char *path, const char *text) { tu_write_file(path, text, strlen(text)); }

static struct config *parse_ok(const char *json)
{
    struct config *c = NULL;
    tu_log_capture_begin();
    int rc = config_parse("t.json", "/etc/clocherd", json, strlen(json), NULL, &c);
    tu_log_capture_end();
    if (rc != 0)
        fail_msg("config_parse failed (%s): %s\n%s", err_name(rc), tu_log_captured(), json);
    return c;
}

static void test_defaults(void **state)
{
    (void)state;
    struct config *c = parse_ok("{\"model_dir\": \"/srv/m\"}");
    assert_string_equal(c->model_dir, "/srv/m");
    assert_string_equal(c->listen_tcp, "127.0.0.1:50051");
    assert_null(c->listen_unix);
    assert_null(c->tls_cert);
    assert_string_equal(c->metrics_listen, "127.0.0.1:9464");
    assert_int_equal(c->workers, 0);
    assert_int_equal(c->threads_per_worker, 0);
    assert_int_equal(c->limits.max_message_bytes, 4u << 20);
    assert_int_equal(c->limits.max_tokens, 2048);
    assert_int_equal(c->limits.max_queue, 256);
    assert_true(c->drain_timeout_s == 30.0);
    assert_int_equal(c->sup.respawn_initial_ms, 100);
    assert_int_equal(c->sup.respawn_max_ms, 10000);
    assert_int_equal(c->sup.crash_loop_max, 5);
    assert_int_equal(c->n_tenants, 0);
    assert_int_equal(c->n_adapters, 0);
    assert_false(c->hot_replicate);
    assert_int_equal(c->kv_dtype, DT_BF16);
    assert_int_equal(c->log_format, -1);
    assert_null(c->access_log);
    config_unref(c);
}

static void test_full(void **state)
{
    (void)state;
    static const char *json =
        "{\"listen\": {\"tcp\": \"[::1]:6000\", \"unix\": \"run/c.sock\"},\n"
        " \"metrics\": {\"listen\": null},\n"
        " \"model_dir\": \"models/tiny\", \"worker_binary\": \"/usr/libexec/clocher-worker\",\n"
        " \"workers\": 2, \"threads_per_worker\": 4, \"kv_budget_mb\": 512,\n"
        " \"lora_weights\": \"bf16\", \"kv_dtype\": \"int8\", \"log_format\": \"json\",\n"
        " \"access_log\": \"log/access.log\",\n"
        " \"limits\": {\"max_message_bytes\": 65536, \"max_prompt_tokens\": 100,\n"
        "            \"max_tokens\": 50, \"max_streams_per_connection\": 8, \"max_queue\": 3},\n"
        " \"drain_timeout_s\": 2.5,\n"
        " \"supervisor\": {\"respawn_initial_ms\": 50, \"respawn_max_ms\": 800,\n"
        "                \"crash_loop_max\": 3, \"crash_loop_window_s\": 10},\n"
        " \"hot_replication\": {\"enabled\": true, \"limit_mb\": 64},\n"
        " \"adapters\": {\"sql\": \"/a/sql\", \"chat-v2\": \"peft/chat\"},\n"
        " \"tenants\": [\n"
        "   {\"name\": \"acme\", \"api_keys\": [\"sha256:"
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\", \"acme-dev-key-1\"],\n"
        "    \"allowed_adapters\": [\"sql\"], \"max_concurrent_streams\": 16},\n"
        "   {\"name\": \"internal\", \"api_keys\": [\"internal-key-xyz\"], \"allowed_adapters\": \"*\"}\n"
        " ]}";
    struct config *c = parse_ok(json);
    assert_string_equal(c->listen_tcp, "[::1]:6000");
    assert_string_equal(c->listen_unix, "/etc/clocherd/run/c.sock");
    assert_null(c->metrics_listen);
    assert_string_equal(c->model_dir, "/etc/clocherd/models/tiny");
    assert_string_equal(c->worker_binary, "/usr/libexec/clocher-worker");
    assert_int_equal(c->workers, 2);
    assert_int_equal(c->threads_per_worker, 4);
    assert_int_equal(c->kv_budget_mb, 512);
    assert_true(c->lora_weights_bf16);
    assert_int_equal(c->kv_dtype, DT_KV_I8);
    assert_int_equal(c->log_format, LOG_FORMAT_JSON);
    assert_string_equal(c->access_log, "/etc/clocherd/log/access.log");
    assert_int_equal(c->limits.max_message_bytes, 65536);
    assert_int_equal(c->limits.max_prompt_tokens, 100);
    assert_int_equal(c->limits.max_tokens, 50);
    assert_int_equal(c->limits.max_streams_per_connection, 8);
    assert_int_equal(c->limits.max_queue, 3);
    assert_true(c->drain_timeout_s == 2.5);
    assert_int_equal(c->sup.respawn_initial_ms, 50);
    assert_int_equal(c->sup.crash_loop_max, 3);
    assert_true(c->hot_replicate);
    assert_int_equal(c->hot_repl_limit_mb, 64);
    assert_int_equal(c->n_adapters, 2);
    assert_string_equal(config_find_adapter(c, "chat-v2")->dir, "/etc/clocherd/peft/chat");
    assert_null(config_find_adapter(c, "nope"));
    assert_int_equal(c->n_tenants, 2);
    const struct config_tenant *t = config_find_tenant(c, "acme");
    assert_non_null(t);
    assert_int_equal(t->n_keys, 2);
    assert_int_equal(t->keys[0].kind, CONFIG_KEY_SHA256);
    assert_int_equal(t->keys[0].sha256[0], 0x9f);
    assert_int_equal(t->keys[0].sha256[31], 0x08);
    assert_int_equal(t->keys[1].kind, CONFIG_KEY_PLAIN);
    assert_string_equal(t->keys[1].plain, "acme-dev-key-1");
    assert_int_equal(t->max_concurrent_streams, 16);
    assert_true(config_tenant_allows(t, "sql"));
    assert_false(config_tenant_allows(t, "chat-v2"));
    assert_true(config_tenant_allows(t, NULL));
    assert_true(config_tenant_allows(config_find_tenant(c, "internal"), "anything"));
    config_unref(c);
}

/* One bad input: the code and the words the message must contain. */
struct bad {
    const char *json;
    int code;
    const char *needle1, *needle2;
};

static const struct bad bads[] = {
    {"{\"model_dir\": \"/m\",", ERR_FORMAT, "t.json:1:", "invalid JSON"},
    {"[1, 2]", ERR_FORMAT, "must be a JSON object", "an array"},
    {"{\"model_dir\": \"/m\", \"model_dir\": \"/n\"}", ERR_FORMAT, "duplicate", "model_dir"},
    {"{\"model_dir\": \"/m\", \"wokers\": 2}", ERR_FORMAT, "unknown key \"wokers\"", "workers"},
    {"{}", ERR_FORMAT, "model_dir", "is required"},
    {"{\"model_dir\": \"\"}", ERR_FORMAT, "model_dir", "must not be empty"},
    {"{\"model_dir\": 7}", ERR_FORMAT, "model_dir", "must be a string"},
    {"{\"model_dir\": \"/m\\u0000x\"}", ERR_FORMAT, "invalid JSON", "NUL"},
    {"{\"model_dir\": \"/m\", \"workers\": 300}", ERR_RANGE, "workers: must be an integer in 0..256",
     "got 300"},
    {"{\"model_dir\": \"/m\", \"workers\": \"2\"}", ERR_FORMAT, "workers", "got a string"},
    {"{\"model_dir\": \"/m\", \"workers\": -1}", ERR_RANGE, "workers", "got -1"},
    {"{\"model_dir\": \"/m\", \"threads_per_worker\": 2000}", ERR_RANGE, "threads_per_worker",
     "got 2000"},
    {"{\"model_dir\": \"/m\", \"kv_budget_mb\": 1.5}", ERR_FORMAT, "kv_budget_mb", "got a number"},
    {"{\"model_dir\": \"/m\", \"lora_weights\": \"int3\"}", ERR_FORMAT,
     "lora_weights: must be \"auto\" or \"bf16\"", "int3"},
    {"{\"model_dir\": \"/m\", \"lora_weights\": true}", ERR_FORMAT, "lora_weights",
     "must be a string"},
    {"{\"model_dir\": \"/m\", \"kv_dtype\": \"q4_0\"}", ERR_FORMAT,
     "kv_dtype: must be one of f32, f16, bf16, int8, fp8", "q4_0"},
    {"{\"model_dir\": \"/m\", \"kv_dtype\": 8}", ERR_FORMAT, "kv_dtype", "must be a string"},
    {"{\"model_dir\": \"/m\", \"log_format\": \"xml\"}", ERR_FORMAT,
     "log_format: must be \"text\" or \"json\"", "xml"},
    {"{\"model_dir\": \"/m\", \"access_log\": \"\"}", ERR_FORMAT, "access_log",
     "must not be empty"},
    {"{\"model_dir\": \"/m\", \"limits\": 3}", ERR_FORMAT, "limits", "must be an object"},
    {"{\"model_dir\": \"/m\", \"limits\": {\"max_tokenz\": 3}}", ERR_FORMAT, "limits",
     "unknown key \"max_tokenz\""},
    {"{\"model_dir\": \"/m\", \"limits\": {\"max_tokens\": 0}}", ERR_RANGE, "limits.max_tokens",
     "got 0"},
    {"{\"model_dir\": \"/m\", \"limits\": {\"max_message_bytes\": 100}}", ERR_RANGE,
     "limits.max_message_bytes", "1024.."},
    {"{\"model_dir\": \"/m\", \"limits\": {\"max_prompt_tokens\": 99999999}}", ERR_RANGE,
     "limits.max_prompt_tokens", "got 99999999"},
    {"{\"model_dir\": \"/m\", \"limits\": {\"max_streams_per_connection\": 0}}", ERR_RANGE,
     "limits.max_streams_per_connection", "got 0"},
    {"{\"model_dir\": \"/m\", \"limits\": {\"max_queue\": true}}", ERR_FORMAT, "limits.max_queue",
     "a boolean"},
    {"{\"model_dir\": \"/m\", \"drain_timeout_s\": -1}", ERR_RANGE, "drain_timeout_s", "got -1"},
    {"{\"model_dir\": \"/m\", \"drain_timeout_s\": \"10s\"}", ERR_FORMAT, "drain_timeout_s",
     "a number of seconds"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"nohostport\"}}", ERR_FORMAT, "listen.tcp",
     "host:port"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"127.0.0.1:0\"}}", ERR_RANGE, "listen.tcp",
     "port must be 1..65535"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"127.0.0.1:99999\"}}", ERR_RANGE,
     "listen.tcp", "\"99999\""},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"::1:80\"}}", ERR_FORMAT, "listen.tcp",
     "[addr]:port"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"[::1:80\"}}", ERR_FORMAT, "listen.tcp",
     "IPv6"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"a b:80\"}}", ERR_FORMAT, "listen.tcp",
     "bad host name"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": null}}", ERR_FORMAT, "listen",
     "no listener left"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"unix\": \"/run/"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "\"}}",
     ERR_RANGE, "listen.unix", "the limit is 107"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"unix\": \"../"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "\"}}",
     ERR_RANGE, "listen.unix", "longer than 107 bytes"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"port\": 1}}", ERR_FORMAT, "listen",
     "unknown key \"port\""},
    {"{\"model_dir\": \"/m\", \"tls\": {\"cert\": \"/etc/c.pem\"}}", ERR_FORMAT, "tls",
     "key is missing"},
    {"{\"model_dir\": \"/m\", \"tls\": {\"key\": \"/etc/k.pem\"}}", ERR_FORMAT, "tls",
     "cert is missing"},
    {"{\"model_dir\": \"/m\", \"tls\": {\"client_ca\": \"/etc/ca.pem\"}}", ERR_FORMAT, "tls",
     "client_ca needs cert and key"},
    {"{\"model_dir\": \"/m\", \"tls\": {\"cert\": \"/nonexistent/c.pem\", \"key\": \"/x\"}}",
     -ENOENT, "tls.cert", "/nonexistent/c.pem"},
    {"{\"model_dir\": \"/m\", \"metrics\": {\"listen\": \"localhost\"}}", ERR_FORMAT,
     "metrics.listen", "host:port"},
    {"{\"model_dir\": \"/m\", \"metrics\": {\"port\": 9}}", ERR_FORMAT, "metrics",
     "unknown key \"port\""},
    {"{\"model_dir\": \"/m\", \"tenants\": {}}", ERR_FORMAT, "tenants", "must be an array"},
    {"{\"model_dir\": \"/m\", \"tenants\": [7]}", ERR_FORMAT, "tenants[0]", "must be an object"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"api_keys\": [\"abcdefgh\"]}]}", ERR_FORMAT,
     "tenants[0].name", "is required"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a b\", \"api_keys\": [\"abcdefgh\"]}]}",
     ERR_FORMAT, "tenants[0].name", "\"a b\""},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\"], "
     "\"quota\": 1}]}",
     ERR_FORMAT, "tenants[0]", "unknown key \"quota\""},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\"}]}", ERR_FORMAT, "tenants[0].api_keys",
     "is required"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": []}]}", ERR_FORMAT,
     "tenants[0].api_keys", "at least one"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": \"abcdefgh\"}]}",
     ERR_FORMAT, "tenants[0].api_keys", "must be an array"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"short\"]}]}",
     ERR_RANGE, "tenants[0].api_keys[0]", "8..256"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"has space!\"]}]}",
     ERR_FORMAT, "tenants[0].api_keys[0]", "character 4"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sha256:abcd\"]}]}",
     ERR_FORMAT, "tenants[0].api_keys[0]", "64 hex digits"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sha256:"
     "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a0g\"]}]}",
     ERR_FORMAT, "tenants[0].api_keys[0]", "character 64"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\", "
     "\"abcdefgh\"]}]}",
     ERR_FORMAT, "tenants[0].api_keys[1]", "duplicate of api_keys[0]"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\"]}, "
     "{\"name\": \"b\", \"api_keys\": [\"abcdefgh\"]}]}",
     ERR_FORMAT, "tenants[1].api_keys[0]", "tenants[0] (\"a\")"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\"]}, "
     "{\"name\": \"a\", \"api_keys\": [\"12345678\"]}]}",
     ERR_FORMAT, "tenants[1].name", "duplicate tenant name \"a\""},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\"], "
     "\"allowed_adapters\": \"all\"}]}",
     ERR_FORMAT, "tenants[0].allowed_adapters", "\"*\" or an array"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\"], "
     "\"allowed_adapters\": [\"ok\", 5]}]}",
     ERR_FORMAT, "tenants[0].allowed_adapters[1]", "must be a string"},
    {"{\"model_dir\": \"/m\", \"tenants\": [{\"name\": \"a\", \"api_keys\": [\"abcdefgh\"], "
     "\"max_concurrent_streams\": -5}]}",
     ERR_RANGE, "tenants[0].max_concurrent_streams", "got -5"},
    {"{\"model_dir\": \"/m\", \"listen\": {\"tcp\": \"0.0.0.0:50051\"}}", ERR_FORMAT, "tenants",
     "not a loopback address"},
    {"{\"model_dir\": \"/m\", \"adapters\": [\"x\"]}", ERR_FORMAT, "adapters", "must be an object"},
    {"{\"model_dir\": \"/m\", \"adapters\": {\"bad/name\": \"/a\"}}", ERR_FORMAT,
     "adapters.bad/name", "must be 1..63 characters"},
    {"{\"model_dir\": \"/m\", \"adapters\": {\"x\": 1}}", ERR_FORMAT, "adapters.x",
     "must be a string"},
    {"{\"model_dir\": \"/m\", \"adapters\": {\"x\": \"\"}}", ERR_FORMAT, "adapters.x",
     "adapter's directory"},
    {"{\"model_dir\": \"/m\", \"hot_replication\": {\"enabled\": \"yes\"}}", ERR_FORMAT,
     "hot_replication.enabled", "true or false"},
    {"{\"model_dir\": \"/m\", \"hot_replication\": {\"limit_mb\": -1}}", ERR_RANGE,
     "hot_replication.limit_mb", "got -1"},
    {"{\"model_dir\": \"/m\", \"supervisor\": {\"respawn_initial_ms\": 500, "
     "\"respawn_max_ms\": 100}}",
     ERR_RANGE, "supervisor.respawn_max_ms", ">= respawn_initial_ms (500)"},
    {"{\"model_dir\": \"/m\", \"supervisor\": {\"crash_loop_max\": 0}}", ERR_RANGE,
     "supervisor.crash_loop_max", "got 0"},
    {"{\"model_dir\": \"/m\", \"supervisor\": {\"restart\": 1}}", ERR_FORMAT, "supervisor",
     "unknown key \"restart\""},
    {"{\"model_dir\": \"/m\", \"worker_binary\": false}", ERR_FORMAT, "worker_binary",
     "must be a string"},
};

static void test_bad_fields(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        const struct bad *b = &bads[i];
        struct config *c = (struct config *)1;
        tu_log_capture_begin();
        int rc = config_parse("t.json", "/etc/clocherd", b->json, strlen(b->json), NULL, &c);
        tu_log_capture_end();
        if (rc != b->code)
            fail_msg("case %zu: got %s, want %s\n%s\nlog: %s", i, err_name(rc),
                     err_name(b->code), b->json, tu_log_captured());
        assert_null(c);
        if (!strstr(tu_log_captured(), b->needle1) || !strstr(tu_log_captured(), b->needle2))
            fail_msg("case %zu: the message does not name \"%s\" / \"%s\":\n%s", i, b->needle1,
                     b->needle2, tu_log_captured());
        /* every message starts with the file name */
        assert_non_null(strstr(tu_log_captured(), "t.json"));
    }
}

static void test_model_dir_override(void **state)
{
    (void)state;
    struct config *c = NULL;
    assert_int_equal(config_parse("t.json", "/base", "{}", 2, "rel/model", &c), 0);
    assert_string_equal(c->model_dir, "/base/rel/model");
    config_unref(c);
    assert_int_equal(
        config_parse("t.json", "/base", "{\"model_dir\": \"/x\"}", 19, "/override", &c), 0);
    assert_string_equal(c->model_dir, "/override");
    config_unref(c);
}

static void test_unknown_adapter_warns(void **state)
{
    (void)state;
    static const char *json =
        "{\"model_dir\": \"/m\", \"adapters\": {\"a\": \"/a\"}, \"tenants\": [{\"name\": \"t\", "
        "\"api_keys\": [\"abcdefgh\"], \"allowed_adapters\": [\"a\", \"later\"]}]}";
    struct config *c = NULL;
    tu_log_capture_begin();
    assert_int_equal(config_parse("t.json", "/", json, strlen(json), NULL, &c), 0);
    tu_log_capture_end();
    tu_assert_log_contains("tenants[0].allowed_adapters[1]", "\"later\" is not in adapters", NULL);
    assert_true(config_tenant_allows(&c->tenants[0], "later"));
    config_unref(c);
}

static void test_load_file(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *p = tu_path(dir, "c.json");
    put(p, "{\"model_dir\": \"m\", \"adapters\": {\"x\": \"ad/x\"}}");
    struct config *c = NULL;
    assert_int_equal(config_load(p, NULL, &c), 0);
    char want[4200];
    snprintf(want, sizeof want, "%s/m", dir);
    assert_string_equal(c->model_dir, want);
    snprintf(want, sizeof want, "%s/ad/x", dir);
    assert_string_equal(c->adapters[0].dir, want);
    assert_string_equal(c->path, p);
    config_unref(c);

    /* missing file: -ENOENT naming it */
    tu_log_capture_begin();
    assert_int_equal(config_load(tu_path(dir, "none.json"), NULL, &c), -ENOENT);
    tu_log_capture_end();
    tu_assert_log_contains("none.json", NULL);
    /* a directory */
    tu_log_capture_begin();
    assert_int_equal(config_load(dir, NULL, &c), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("not a regular file", NULL);
    /* larger than the limit: refused unread */
    const char *big = tu_path(dir, "big.json");
    FILE *f = fopen(big, "w");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), CONFIG_FILE_MAX + 1), 0);
    fclose(f);
    tu_log_capture_begin();
    assert_int_equal(config_load(big, NULL, &c), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("big.json", "the limit is", NULL);
    /* TLS files are checked for readability, relative to the file */
    tu_write_file(tu_path(dir, "cert.pem"), TEST_CERT, strlen(TEST_CERT));
    tu_write_file(tu_path(dir, "key.pem"), TEST_KEY, strlen(TEST_KEY));
    put(p, "{\"model_dir\": \"m\", \"tls\": {\"cert\": \"cert.pem\", \"key\": \"key.pem\"}}");
    assert_int_equal(config_load(p, NULL, &c), 0);
    snprintf(want, sizeof want, "%s/key.pem", dir);
    assert_string_equal(c->tls_key, want);
    config_unref(c);
    /* ... and for being PEM, and a pair (issue 15: a non-PEM certificate passed --check-config,
     * then the listener failed with "cannot listen ... in use") */
    tu_write_file(tu_path(dir, "bad.pem"), "x", 1);
    tu_write_file(tu_path(dir, "other.pem"), TEST_OTHER_KEY, strlen(TEST_OTHER_KEY));
    static const struct {
        const char *cert, *key, *words;
    } bad[] = {
        {"bad.pem", "key.pem", "tls.cert"},
        {"cert.pem", "bad.pem", "tls.key"},
        {"cert.pem", "other.pem", "not the private key of the certificate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char js[256];
        snprintf(js, sizeof js, "{\"model_dir\": \"m\", \"tls\": {\"cert\": \"%s\", \"key\": \"%s\"}}",
                 bad[i].cert, bad[i].key);
        put(p, js);
        tu_log_capture_begin();
        assert_int_equal(config_load(p, NULL, &c), ERR_FORMAT);
        tu_log_capture_end();
        tu_assert_log_contains(bad[i].words, strcmp(bad[i].cert, "bad.pem") == 0 ? "bad.pem is not a PEM certificate" : "pem", NULL);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_example_file(void **state)
{
    (void)state;
    const char *src = getenv("CLOCHER_SOURCE_DIR");
    assert_non_null(src);
    char p[4096];
    snprintf(p, sizeof p, "%s/systemd/clocherd.json", src);
    struct config *c = NULL;
    tu_log_capture_begin();
    int rc = config_load(p, NULL, &c);
    tu_log_capture_end();
    if (rc != 0)
        fail_msg("the example configuration does not load: %s", tu_log_captured());
    assert_true(c->n_tenants >= 1);
    config_unref(c);
}

/* kv_dtype and log_format are restart-only: a reload keeps the running values, saying so */
static void test_keep_kv_dtype_log_format(void **state)
{
    (void)state;
    struct config *run = parse_ok("{\"model_dir\": \"/m\"}");
    struct config *fresh =
        parse_ok("{\"model_dir\": \"/m\", \"kv_dtype\": \"fp8\", \"log_format\": \"json\"}");
    tu_log_capture_begin();
    assert_int_equal(config_keep_restart_fields(fresh, run), 2);
    tu_log_capture_end();
    tu_assert_log_contains("kv_dtype changed (\"bf16\" -> \"fp8\")",
                           "log_format changed (\"(not set)\" -> \"json\")",
                           "takes effect at restart", NULL);
    assert_int_equal(fresh->kv_dtype, DT_BF16);
    assert_int_equal(fresh->log_format, -1);
    config_unref(run);
    config_unref(fresh);
}

static void test_keep_restart_fields(void **state)
{
    (void)state;
    struct config *run = parse_ok("{\"model_dir\": \"/m\", \"workers\": 2, \"limits\": "
                                  "{\"max_tokens\": 10}}");
    struct config *fresh = parse_ok(
        "{\"model_dir\": \"/other\", \"workers\": 4, \"listen\": {\"tcp\": \"127.0.0.1:7000\"}, "
        "\"limits\": {\"max_tokens\": 20}, \"tenants\": [{\"name\": \"n\", \"api_keys\": "
        "[\"abcdefgh\"]}]}");
    tu_log_capture_begin();
    assert_int_equal(config_keep_restart_fields(fresh, run), 3);
    tu_log_capture_end();
    tu_assert_log_contains("model_dir changed", "workers changed", "listen.tcp changed",
                           "takes effect at restart", NULL);
    assert_string_equal(fresh->model_dir, "/m");
    assert_int_equal(fresh->workers, 2);
    assert_string_equal(fresh->listen_tcp, "127.0.0.1:50051");
    /* what may change live did */
    assert_int_equal(fresh->limits.max_tokens, 20);
    assert_int_equal(fresh->n_tenants, 1);
    config_unref(run);
    config_unref(fresh);
}

/* Readers take and drop references while the snapshot is swapped under them: no reader ever
 * sees a freed config (ASan/TSan builds make a violation loud). */
static struct config_ptr g_ptr;
static atomic_bool g_stop;

static void *reader(void *arg)
{
    (void)arg;
    unsigned long n = 0;
    while (!atomic_load(&g_stop)) {
        struct config *c = config_ptr_get(&g_ptr);
        assert_true(c->magic == CONFIG_MAGIC);
        assert_true(c->limits.max_tokens >= 1);
        config_unref(c);
        n++;
    }
    return (void *)n;
}

static void test_snapshot_swap(void **state)
{
    (void)state;
    config_ptr_init(&g_ptr, parse_ok("{\"model_dir\": \"/m\"}"));
    struct config *held = config_ptr_get(&g_ptr);
    pthread_t th[3];
    atomic_store(&g_stop, false);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader, NULL), 0);
    for (int i = 0; i < 300; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"model_dir\": \"/m\", \"limits\": {\"max_tokens\": %d}}",
                 i + 1);
        struct config *c = NULL;
        assert_int_equal(config_parse("t", "/", json, strlen(json), NULL, &c), 0);
        config_ptr_set(&g_ptr, c);
    }
    atomic_store(&g_stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    /* a reference taken before the swaps still reads the old snapshot */
    assert_int_equal(held->limits.max_tokens, 2048);
    config_unref(held);
    struct config *now = config_ptr_get(&g_ptr);
    assert_int_equal(now->limits.max_tokens, 300);
    config_unref(now);
    config_ptr_fini(&g_ptr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_model_dir_override),
        cmocka_unit_test(test_unknown_adapter_warns),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_keep_restart_fields),
        cmocka_unit_test(test_keep_kv_dtype_log_format),
        cmocka_unit_test(test_snapshot_swap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
