/*
 * test_ctl.c — the worker → supervisor control datagrams (daemon/ctl.c): what a worker sends
 * parses; every malformed message is refused with a message naming the worker, the line and
 * the fault; whatever the worker's formatter (shm/heritage.h heritage_ctl_format) produces
 * parses back to the same content.
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

/* Every subset of the keys, extreme values, the longest status: format → parse is identity
 * (the two sides of the control socket cannot drift apart on a key, a limit or a separator). */
static void test_roundtrip(void **state)
{
    (void)state;
    for (unsigned set = 0; set < 1u << HERITAGE_CTL_NKEYS; set++) {
        for (int variant = 0; variant < 2; variant++) {
            struct heritage_ctl_msg m, back;
            memset(&m, 0, sizeof m); /* padding too: compared byte for byte below */
            m.ready = set & 1u << HERITAGE_CTL_READY;
            m.watchdog = set & 1u << HERITAGE_CTL_WATCHDOG;
            m.has_hot_bytes = set & 1u << HERITAGE_CTL_HOT_BYTES;
            m.hot_bytes = m.has_hot_bytes ? (variant ? UINT64_MAX : 0) : 0;
            m.has_hot_tensors = set & 1u << HERITAGE_CTL_HOT_TENSORS;
            m.hot_tensors = m.has_hot_tensors ? (variant ? UINT64_MAX : 7) : 0;
            if (set & 1u << HERITAGE_CTL_STATUS) {
                if (variant)
                    memset(m.status, '~', sizeof m.status - 1);
                else
                    strcpy(m.status, "model /m loaded");
            }
            char buf[HERITAGE_CTL_MSG_MAX + 1];
            size_t n = heritage_ctl_format(&m, buf, sizeof buf);
            if (n == 0)
                continue; /* nothing to say: the worker sends no empty datagram */
            if (ctl_parse("w", buf, n, &back) != 0)
                fail_msg("set %#x variant %d: \"%s\" refused", set, variant, buf);
            assert_memory_equal(&m, &back, sizeof m);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_good), cmocka_unit_test(test_bad),
                                       cmocka_unit_test(test_roundtrip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
