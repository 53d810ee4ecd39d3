/* test_ops_units.c — common/log.c's JSON lines (escaping, invalid UTF-8, per-thread fields,
 * truncation, the text form of fields) and common/modelsrc.c (which model source a path is,
 * the folder `clocher convert` is told to write). */
#include "testutil.h"

#include "err.h"
#include "log.h"
#include "modelsrc.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_line[8192];

static void sink(enum log_level level, const char *msg, void *ud)
{
    (void)level, (void)ud;
    snprintf(g_line, sizeof g_line, "%s", msg);
}

/* The JSON object of the line logged by LOG_WARN("%s", msg). */
static json_t *logged(const char *msg)
{
    g_line[0] = '\0';
    LOG_WARN("%s", msg);
    json_error_t e;
    json_t *j = json_loads(g_line, 0, &e);
    if (!j)
        fail_msg("not JSON (%s): %s", e.text, g_line);
    return j;
}

static int setup(void **state)
{
    (void)state;
    log_set_sink(sink, NULL);
    log_set_format(LOG_FORMAT_JSON);
    log_set_ident("test-ops");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    log_set_sink(NULL, NULL);
    log_set_format(LOG_FORMAT_TEXT);
    log_fields_clear();
    return 0;
}

static void test_json_line_keys_and_escaping(void **state)
{
    (void)state;
    const char *msg = "a \"quoted\" \\path\\ with\nnewline, \t tab, \x01 and caf\xc3\xa9";
    json_t *j = logged(msg);
    assert_string_equal(json_string_value(json_object_get(j, "msg")), msg);
    assert_string_equal(json_string_value(json_object_get(j, "level")), "warn");
    assert_string_equal(json_string_value(json_object_get(j, "prog")), "test-ops");
    assert_int_equal(json_integer_value(json_object_get(j, "pid")), getpid());
    const char *ts = json_string_value(json_object_get(j, "ts"));
    assert_non_null(ts);
    assert_int_equal(strlen(ts), strlen("2026-11-27T08:00:00.123Z"));
    assert_int_equal(ts[strlen(ts) - 1], 'Z');
    json_decref(j);
}

static void test_json_invalid_utf8_becomes_replacement(void **state)
{
    (void)state;
    /* a lone continuation byte, a truncated sequence, an overlong '/', a surrogate */
    json_t *j = logged("x\x80y\xe2\x82z\xc0\xafw\xed\xa0\x80v");
    const char *m = json_string_value(json_object_get(j, "msg"));
    assert_non_null(m);
    assert_null(strchr(m, '\x80'));
    assert_non_null(strstr(m, "x\xef\xbf\xbdy"));
    assert_int_equal(m[strlen(m) - 1], 'v');
    json_decref(j);
}

static void test_json_fields(void **state)
{
    (void)state;
    assert_int_equal(log_field_set("request_id", "42"), 0);
    assert_int_equal(log_field_set("tenant", "al\"ice"), 0);
    json_t *j = logged("with fields");
    assert_string_equal(json_string_value(json_object_get(j, "request_id")), "42");
    assert_string_equal(json_string_value(json_object_get(j, "tenant")), "al\"ice");
    json_decref(j);
    /* replaced, then removed */
    assert_int_equal(log_field_set("request_id", "43"), 0);
    assert_int_equal(log_field_set("tenant", NULL), 0);
    j = logged("one field");
    assert_string_equal(json_string_value(json_object_get(j, "request_id")), "43");
    assert_null(json_object_get(j, "tenant"));
    json_decref(j);
    /* at most LOG_MAX_FIELDS */
    for (int i = 1; i < LOG_MAX_FIELDS; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(log_field_set(k, "v"), 0);
    }
    assert_int_equal(log_field_set("one-too-many", "v"), -ENOSPC);
    log_fields_clear();
    j = logged("none");
    assert_null(json_object_get(j, "request_id"));
    json_decref(j);
}

static void test_json_truncated_line_is_still_json(void **state)
{
    (void)state;
    /* 1023 control bytes: 6138 bytes escaped, and four fields of the longest values: more
     * than a line holds. The message is cut between escapes; the fields are all kept. */
    char big[1024];
    memset(big, '\x01', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char v[200];
    memset(v, '\x01', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    for (int i = 0; i < LOG_MAX_FIELDS; i++) {
        char k[48];
        snprintf(k, sizeof k, "field-%d-with-a-long-name-xxxxxx", i);
        assert_int_equal(log_field_set(k, v), 0);
    }
    json_t *j = logged(big);
    const char *m = json_string_value(json_object_get(j, "msg"));
    assert_non_null(m);
    assert_true(strlen(m) > 100 && strlen(m) < strlen(big));
    for (int i = 0; i < LOG_MAX_FIELDS; i++) {
        char k[48];
        snprintf(k, sizeof k, "field-%d-with-a-long-name-xxxxxx", i);
        assert_non_null(json_object_get(j, k));
    }
    json_decref(j);
    log_fields_clear();
}

static void test_text_form_and_format_parse(void **state)
{
    (void)state;
    log_set_format(LOG_FORMAT_TEXT);
    assert_int_equal(log_field_set("request_id", "7"), 0);
    LOG_WARN("hello");
    assert_string_equal(g_line, "hello [request_id=7]");
    log_fields_clear();
    LOG_WARN("hello");
    assert_string_equal(g_line, "hello");
    log_set_format(LOG_FORMAT_JSON);
    enum log_format f = LOG_FORMAT_TEXT;
    assert_int_equal(log_format_parse("json", &f), 0);
    assert_int_equal(f, LOG_FORMAT_JSON);
    assert_int_equal(log_format_parse("text", &f), 0);
    assert_int_equal(f, LOG_FORMAT_TEXT);
    assert_int_equal(log_format_parse("xml", &f), -EINVAL);
    assert_int_equal(log_format_parse(NULL, &f), -EINVAL);
}

static void test_modelsrc(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char out[64];
    assert_int_equal(modelsrc_suggest_out("/m/x.Q8_0.gguf", out, sizeof out), 0);
    assert_string_equal(out, "/m/x.Q8_0-iebin");
    assert_int_equal(modelsrc_suggest_out("TinyLlama//", out, sizeof out), 0);
    assert_string_equal(out, "TinyLlama-iebin");
    assert_int_equal(modelsrc_suggest_out("stories15M.bin", out, sizeof out), 0);
    assert_string_equal(out, "stories15M-iebin");
    assert_int_equal(modelsrc_suggest_out("a-very-long-name", out, 8), -ENAMETOOLONG);

    int e;
    assert_int_equal(modelsrc_kind(tu_path(dir, "none"), &e), MODELSRC_MISSING);
    assert_int_equal(e, ENOENT);
    assert_int_equal(modelsrc_kind(dir, &e), MODELSRC_FOLDER);
    tu_write_file(tu_path(dir, "config.json"), "{}", 2);
    assert_int_equal(modelsrc_kind(dir, &e), MODELSRC_HF);
    tu_write_file(tu_path(dir, "model.ie.json"), "{}", 2);
    assert_int_equal(modelsrc_kind(dir, &e), MODELSRC_IEBIN);
    assert_int_equal(modelsrc_check(dir, "model_dir"), 0);
    tu_write_file(tu_path(dir, "f.gguf"), "GGUF\3\0\0\0", 8);
    assert_int_equal(modelsrc_kind(tu_path(dir, "f.gguf"), &e), MODELSRC_GGUF);
    tu_write_file(tu_path(dir, "short"), "GG", 2);
    assert_int_equal(modelsrc_kind(tu_path(dir, "short"), &e), MODELSRC_FILE);

    /* the refusals name the path, where it came from, and what to do */
    log_set_format(LOG_FORMAT_TEXT);
    assert_int_equal(modelsrc_check(tu_path(dir, "f.gguf"), "model_dir"), ERR_UNSUPPORTED);
    assert_non_null(strstr(g_line, "is a GGUF file"));
    assert_non_null(strstr(g_line, "(model_dir)"));
    assert_non_null(strstr(g_line, "`clocher convert "));
    assert_int_equal(modelsrc_check(tu_path(dir, "short"), "--model-dir"), ERR_FORMAT);
    assert_non_null(strstr(g_line, "a file, not a model folder"));
    assert_int_equal(modelsrc_check(tu_path(dir, "none"), "--model-dir"), -ENOENT);
    assert_non_null(strstr(g_line, "No such file"));
    log_set_format(LOG_FORMAT_JSON);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_json_line_keys_and_escaping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_invalid_utf8_becomes_replacement, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_json_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_truncated_line_is_still_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_form_and_format_parse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_modelsrc, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
