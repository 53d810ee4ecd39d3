/*
 * test_backoff.c — the respawn policy on synthetic clocks: doubling delays capped at the
 * maximum, reset after a stable run, the crash-loop limit over a sliding window.
 */
#include "testutil.h"

#include "backoff.h"

static const struct backoff_policy pol = {
    .initial_ms = 100, .max_ms = 10000, .crash_loop_max = 5, .window_ms = 60000,
    .stable_ms = 60000};

static void test_doubling_to_cap(void **state)
{
    (void)state;
    struct backoff b;
    struct backoff_policy p = pol;
    p.crash_loop_max = 1000; /* no give-up in this test */
    backoff_init(&b, &p);
    uint64_t want[] = {100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000};
    uint64_t now = 1000000, d;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        /* each worker lived one second: not stable */
        assert_int_equal(backoff_crash(&b, now, now - 1000, &d), BACKOFF_RESPAWN);
        assert_int_equal(d, want[i]);
        now += 1000 + d;
    }
}

static void test_stable_run_resets(void **state)
{
    (void)state;
    struct backoff b;
    backoff_init(&b, &pol);
    uint64_t d, now = 1000000;
    assert_int_equal(backoff_crash(&b, now, now - 10, &d), BACKOFF_RESPAWN);
    assert_int_equal(d, 100);
    assert_int_equal(backoff_crash(&b, now + 500, now + 100, &d), BACKOFF_RESPAWN);
    assert_int_equal(d, 200);
    /* up for 61 s before crashing: back to the first delay */
    now += 500 + 61000;
    assert_int_equal(backoff_crash(&b, now, now - 61000, &d), BACKOFF_RESPAWN);
    assert_int_equal(d, 100);
    assert_int_equal(backoff_crash(&b, now + 200, now + 150, &d), BACKOFF_RESPAWN);
    assert_int_equal(d, 200);
}

static void test_crash_loop_gives_up(void **state)
{
    (void)state;
    struct backoff b;
    backoff_init(&b, &pol);
    uint64_t d, now = 1000000;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(backoff_crash(&b, now, now - 5, &d), BACKOFF_RESPAWN);
        now += d + 5;
    }
    /* the fifth crash within 60 s */
    assert_int_equal(backoff_crash(&b, now, now - 5, &d), BACKOFF_GIVE_UP);
    assert_true(b.given_up);
    /* and it stays given up */
    assert_int_equal(backoff_crash(&b, now + 999999, now, &d), BACKOFF_GIVE_UP);
    /* until reset (an operator's reload) */
    backoff_reset(&b, &pol);
    assert_int_equal(backoff_crash(&b, now + 1000000, now, &d), BACKOFF_RESPAWN);
    assert_int_equal(d, 100);
}

static void test_sliding_window(void **state)
{
    (void)state;
    struct backoff b;
    struct backoff_policy p = pol;
    p.crash_loop_max = 3;
    p.window_ms = 10000;
    backoff_init(&b, &p);
    uint64_t d;
    /* crashes every 6 s never put 3 within 10 s */
    for (uint64_t t = 100000; t < 100000 + 60 * 6000; t += 6000)
        assert_int_equal(backoff_crash(&b, t, t - 1000, &d), BACKOFF_RESPAWN);
    /* then one 5 s after the last (3 within 11 s: still fine), one 0.5 s later: 3 within 5.5 s */
    uint64_t last = 100000 + 59 * 6000;
    assert_int_equal(backoff_crash(&b, last + 5000, last + 4900, &d), BACKOFF_RESPAWN);
    assert_int_equal(backoff_crash(&b, last + 5500, last + 5400, &d), BACKOFF_GIVE_UP);
}

static void test_limit_of_one(void **state)
{
    (void)state;
    struct backoff b;
    struct backoff_policy p = pol;
    p.crash_loop_max = 1;
    backoff_init(&b, &p);
    uint64_t d;
    assert_int_equal(backoff_crash(&b, 5000, 0, &d), BACKOFF_GIVE_UP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doubling_to_cap),
        cmocka_unit_test(test_stable_run_resets),
        cmocka_unit_test(test_crash_loop_gives_up),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_limit_of_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
