/*
 * test_ctl.c — the worker → supervisor control datagrams (daemon/ctl.c): what a worker sends
 * parses; every malformed message is refused with a message naming the worker, the line and
 * the fault.
 */
#include "testutil.h"

#include "ctl.h"
#include "err.h"

#include <string.h>

static int parse(const char *s, struct heritage_ctl_msg *m)
{
    return ctl_parse("worker 3 (pid 77)", s, strlen(s), m);
}

static void test_good(void **state)
{
    (void)state;
    struct heritage_ctl_msg m;
    assert_int_equal(
        parse("READY=1\nHOT_BYTES=123456789\nHOT_TENSORS=201\nSTATUS=model /m loaded", &m), 0);
    assert_true(m.ready);
    assert_true(m.has_hot_tensors);
    assert_int_equal(m.hot_tensors, 201);
    assert_false(m.watchdog);
    assert_true(m.has_hot_bytes);
    assert_int_equal(m.hot_bytes, 123456789);
    assert_string_equal(m.status, "model /m loaded");

    assert_int_equal(parse("WATCHDOG=1\n", &m), 0);
    assert_true(m.watchdog);
    assert_false(m.ready);
    assert_false(m.has_hot_bytes);
    assert_string_equal(m.status, "");

    assert_int_equal(parse("HOT_BYTES=18446744073709551615", &m), 0);
    assert_int_equal(m.hot_bytes, UINT64_MAX);
    assert_int_equal(parse("STATUS=", &m), 0);
    assert_string_equal(m.status, "");
}

static void test_bad(void **state)
{
    (void)state;
    static const struct {
        const char *msg;
        size_t len; /* 0 = strlen */
        const char *needle;
    } bad[] = {
        {"", 0, "empty"},
        {"READY=1\n\nWATCHDOG=1", 0, "line 2: empty line"},
        {"READY", 0, "line 1: not KEY=VALUE"},
        {"=1", 0, "not KEY=VALUE"},
        {"READY=2", 0, "READY must be 1"},
        {"READY=1\nREADY=1", 0, "line 2: READY given twice"},
        {"WATCHDOG=yes", 0, "WATCHDOG must be 1"},
        {"HOT_BYTES=", 0, "decimal byte count"},
        {"HOT_BYTES=-5", 0, "decimal byte count"},
        {"HOT_BYTES=18446744073709551616", 0, "overflows 64 bits"},
        {"HOT_BYTES=1\nHOT_BYTES=2", 0, "HOT_BYTES given twice"},
        {"HOT_TENSORS=", 0, "HOT_TENSORS must be a decimal tensor count"},
        {"HOT_TENSORS=1e3", 0, "HOT_TENSORS must be a decimal tensor count"},
        {"HOT_TENSORS=99999999999999999999", 0, "HOT_TENSORS overflows 64 bits"},
        {"HOT_TENSORS=1\nHOT_TENSORS=1", 0, "line 2: HOT_TENSORS given twice"},
        {"STATUS=bell\a", 0, "printable ASCII"},
        {"STATUS=a\nSTATUS=b", 0, "STATUS given twice"},
        {"FOO=1", 0, "unknown key"},
        {"READY=1\0WATCHDOG=1", 18, "NUL byte"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct heritage_ctl_msg m;
        tu_log_capture_begin();
        int rc = ctl_parse("worker 3 (pid 77)", bad[i].msg,
                           bad[i].len ? bad[i].len : strlen(bad[i].msg), &m);
        tu_log_capture_end();
        if (rc != ERR_FORMAT)
            fail_msg("case %zu accepted", i);
        tu_assert_log_contains("worker 3 (pid 77)", bad[i].needle, NULL);
    }
    char big[HERITAGE_CTL_MSG_MAX + 2];
    memset(big, 'a', sizeof big);
    big[0] = 'S';
    struct heritage_ctl_msg m;
    tu_log_capture_begin();
    assert_int_equal(ctl_parse("w", big, sizeof big, &m), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("longer than the limit", NULL);
    /* a STATUS of 128 bytes is one too many */
    char st[7 + 128 + 1];
    memcpy(st, "STATUS=", 7);
    memset(st + 7, 'x', 128);
    st[7 + 128] = '\0';
    tu_log_capture_begin();
    assert_int_equal(parse(st, &m), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("longer than 127 bytes", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_good), cmocka_unit_test(test_bad)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
