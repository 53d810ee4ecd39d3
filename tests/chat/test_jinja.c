/*
 * test_jinja.c — the chat-template interpreter's own behaviour (worker/tok/jinja.h) where no
 * reference comparison reaches: constructs it does not implement are refused at load with the
 * construct named; malformed templates are errors naming the line; renders are bounded (output,
 * steps, macro depth); raise_exception's message reaches the caller. The byte-for-byte
 * comparison with python3-jinja2 is test_chat_templates.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "err.h"
#include "jinja.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static int parse(const char *src, struct jinja_tpl **t, char *err, size_t cap)
{
    return jinja_parse(src, strlen(src), t, err, cap);
}

/* Loads src, expecting a refusal whose message names `needle`. */
static void refused(const char *src, int code, const char *needle)
{
    char err[256];
    struct jinja_tpl *t = NULL;
    int rc = parse(src, &t, err, sizeof err);
    if (rc != code || !strstr(err, needle))
        fail_msg("'%s': rc %d (want %d), err '%s' (want '%s')", src, rc, code, err, needle);
    assert_null(t);
}

/* Renders src with vars (JSON text), expecting a render failure whose message names needle. */
static void render_fails(const char *src, const char *vars, const struct jinja_limits *lim,
                         int code, const char *needle)
{
    char err[256];
    struct jinja_tpl *t;
    assert_int_equal(parse(src, &t, err, sizeof err), 0);
    json_t *ctx = json_loads(vars, 0, NULL);
    assert_non_null(ctx);
    char *out = NULL;
    size_t n;
    int rc = jinja_render(t, ctx, lim, &out, &n, err, sizeof err);
    if (rc != code || !strstr(err, needle))
        fail_msg("'%s': rc %d (want %d), err '%s' (want '%s')", src, rc, code, err, needle);
    assert_null(out);
    json_decref(ctx);
    jinja_free(t);
}

static void render_ok(const char *src, const char *vars, const char *want)
{
    char err[256];
    struct jinja_tpl *t;
    assert_int_equal(parse(src, &t, err, sizeof err), 0);
    json_t *ctx = json_loads(vars, 0, NULL);
    assert_non_null(ctx);
    char *out;
    size_t n;
    int rc = jinja_render(t, ctx, NULL, &out, &n, err, sizeof err);
    if (rc)
        fail_msg("'%s': %s", src, err);
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
    free(out);
    json_decref(ctx);
    jinja_free(t);
}

static void test_unsupported_refused_by_name(void **state)
{
    (void)state;
    refused("{% include 'x' %}", ERR_UNSUPPORTED, "'{% include %}'");
    refused("{% extends 'x' %}", ERR_UNSUPPORTED, "'{% extends %}'");
    refused("{% raw %}x{% endraw %}", ERR_UNSUPPORTED, "'{% raw %}'");
    refused("{% call m() %}x{% endcall %}", ERR_UNSUPPORTED, "'{% call %}'");
    refused("{% filter upper %}x{% endfilter %}", ERR_UNSUPPORTED, "'{% filter %}'");
    refused("{% generation %}x{% endgeneration %}", ERR_UNSUPPORTED, "'{% generation %}'");
    refused("{{ x|wordwrap }}", ERR_UNSUPPORTED, "the filter 'wordwrap'");
    refused("{{ x|dictsort }}", ERR_UNSUPPORTED, "the filter 'dictsort'");
    refused("{% if x is lower %}{% endif %}", ERR_UNSUPPORTED, "the test 'lower'");
    refused("{{ x.format(1) }}", ERR_UNSUPPORTED, "the method 'format()'");
    refused("{{ messages.append(1) }}", ERR_UNSUPPORTED, "the method 'append()'");
    refused("{% for x in y recursive %}{% endfor %}", ERR_UNSUPPORTED, "recursive");
    refused("{{ f(*a) }}", ERR_UNSUPPORTED, "*args");
    refused("{{ 1 < x < 3 }}", ERR_UNSUPPORTED, "chained comparisons");
    refused("{{ cycler('a', 'b').next() }}", ERR_UNSUPPORTED, "the method 'next()'");
    refused("{{ cycler('a', 'b') }}", ERR_UNSUPPORTED, "the function 'cycler()'");
    refused("{% macro m() %}{% endmacro %}{{ m() }}{{ lipsum() }}", ERR_UNSUPPORTED,
            "the function 'lipsum()'");
}

static void test_malformed_named(void **state)
{
    (void)state;
    refused("{% if x %}a", ERR_FORMAT, "'elif' expected");
    refused("a\n{{ x", ERR_FORMAT, "line 2: unclosed {{");
    refused("{{ 'abc }}", ERR_FORMAT, "unterminated string");
    refused("{% endfor %}", ERR_FORMAT, "unexpected 'endfor'");
    refused("{{ (1 }}", ERR_FORMAT, "unexpected '}'");
    refused("{{ f(1 2) }}", ERR_FORMAT, "expected ','");
    refused("{{ x ] }}", ERR_FORMAT, "unexpected ']'");
    refused("{# open", ERR_FORMAT, "unclosed comment");
    refused("{{ x | }}", ERR_FORMAT, "filter name");
    refused("{{ @ }}", ERR_FORMAT, "unexpected character '@'");
    refused("{{ 99999999999999999999 }}", ERR_UNSUPPORTED, "beyond 64 bits");
}

static void test_nesting_bounded(void **state)
{
    (void)state;
    /* deep nesting is refused, not a stack overflow */
    char src[4096] = "{{ ";
    for (int i = 0; i < 1000; i++)
        strcat(src, "(");
    strcat(src, "1");
    for (int i = 0; i < 1000; i++)
        strcat(src, ")");
    strcat(src, " }}");
    refused(src, ERR_RANGE, "nested deeper");
    /* long chains build deep trees without recursion in the parser: bounded too */
    static const char *const chains[] = {"1 + ", "'a' ~ ", "x and ", "x or ", "2 ** ", "x if y else ",
                                         "x * "};
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        size_t cl = strlen(chains[c]), o = 3;
        char *big = malloc(20000 * cl + 16);
        assert_non_null(big);
        memcpy(big, "{{ ", 3);
        for (int i = 0; i < 20000; i++, o += cl)
            memcpy(big + o, chains[c], cl);
        strcpy(big + o, "1 }}");
        refused(big, ERR_RANGE, "nested deeper");
        free(big);
    }
    static const char *const posts[] = {".a", "|trim", "[0]", "(1)"};
    for (size_t c = 0; c < sizeof posts / sizeof posts[0]; c++) {
        size_t cl = strlen(posts[c]), o = 4;
        char *big = malloc(5000 * cl + 16);
        assert_non_null(big);
        memcpy(big, "{{ x", 4);
        for (int i = 0; i < 5000; i++, o += cl)
            memcpy(big + o, posts[c], cl);
        strcpy(big + o, " }}");
        refused(big, ERR_RANGE, "nested deeper");
        free(big);
    }
    char blk[8192] = "";
    for (int i = 0; i < 500; i++)
        strcat(blk, "{% if 1 %}");
    refused(blk, ERR_RANGE, "nested deeper");
}

static void test_render_bounded(void **state)
{
    (void)state;
    struct jinja_limits small = {.max_output = 1000};
    render_fails("{% for i in range(100) %}0123456789abcdef{% endfor %}", "{}", &small, ERR_RANGE,
                 "exceeds 1000 bytes");
    struct jinja_limits steps = {.max_steps = 10000};
    render_fails("{% for i in range(100000) %}{% endfor %}", "{}", &steps, ERR_RANGE, "steps");
    render_fails("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "{}", NULL, ERR_RANGE,
                 "macro calls nested deeper than 64");
    render_fails("{{ range(100000000) }}", "{}", NULL, ERR_RANGE, "range of more than");
    render_fails("{{ [1] * 100000000 }}", "{}", NULL, ERR_RANGE, "more than");
}

static void test_render_errors_named(void **state)
{
    (void)state;
    render_fails("x\n{{ raise_exception('roles must alternate') }}", "{}", NULL, ERR_USAGE,
                 "line 2: raise_exception: roles must alternate");
    render_fails("{{ nothing.attr }}", "{}", NULL, ERR_USAGE, "'nothing' is undefined");
    render_fails("{{ 'a' + 1 }}", "{}", NULL, ERR_USAGE, "unsupported operand");
    render_fails("{{ 1 // 0 }}", "{}", NULL, ERR_USAGE, "by zero");
    render_fails("{% set x = 1 %}{% set x.a = 2 %}", "{}", NULL, ERR_USAGE, "namespace");
    /* a refused namespace() frees what it built (the ASan tree's leak check; found by fuzz_jinja) */
    render_fails("{% set ns = namespace(n7z, s='') %}", "{}", NULL, ERR_UNSUPPORTED,
                 "namespace() with a positional argument");
    render_fails("{% set ns = namespace(s='', t=[1]) %}{% set ns = namespace([2], s='') %}", "{}",
                 NULL, ERR_UNSUPPORTED, "positional argument");
    render_fails("{{ messages|tojson }}", "{}", NULL, ERR_USAGE, "not JSON serializable");
    render_fails("{{ 'É'|upper }}", "{}", NULL, ERR_UNSUPPORTED, "non-ASCII");
    render_fails("{{ 9223372036854775807 + 1 }}", "{}", NULL, ERR_UNSUPPORTED, "64 bits");
    render_fails("{{ strftime_now('%Q') }}", "{}", NULL, ERR_UNSUPPORTED, "directive %Q");
}

static void test_render_basics(void **state)
{
    (void)state;
    render_ok("{{ messages[0].content }}|{{ messages[0]['role'] }}",
              "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "hi|user");
    render_ok("{% if tools is none %}none{% endif %}{% if x is not defined %}undef{% endif %}",
              "{\"tools\": null}", "noneundef");
    render_ok("a\n  {% if true %}\n  b\n  {% endif %}\nc", "{}", "a\n  b\nc");
    render_ok("{{ 'x' }}\n", "{}", "x");
    render_ok("{{ 0.1 + 0.2 }} {{ 1.0 }} {{ 1e100 }}", "{}", "0.30000000000000004 1.0 1e+100");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported_refused_by_name),
        cmocka_unit_test(test_malformed_named),
        cmocka_unit_test(test_nesting_bounded),
        cmocka_unit_test(test_render_bounded),
        cmocka_unit_test(test_render_errors_named),
        cmocka_unit_test(test_render_basics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
