/*
 * test_kern_isa.c — ISA selection: CPUID default, CLOCHER_ISA forcing, bad values rejected
 * with a message. Its own binary because kern_init() decides once per process.
 */
#include "testutil.h"

#include "err.h"
#include "kern.h"

#include <stdlib.h>

static void test_env_bad_value(void **state)
{
    (void)state;
    setenv("CLOCHER_ISA", "sse9", 1);
    tu_log_capture_begin();
    assert_int_equal(kern_init(), ERR_USAGE);
    tu_assert_log_contains("CLOCHER_ISA=sse9", "expected ref, avx2 or avx512", NULL);
    tu_log_capture_end();
}

static void test_env_forces(void **state)
{
    (void)state;
    setenv("CLOCHER_ISA", "avx2", 1);
    if (!kern_isa_supported(KERN_ISA_AVX2)) {
        tu_log_capture_begin();
        assert_int_equal(kern_init(), ERR_UNSUPPORTED);
        tu_assert_log_contains("avx2", "not supported", NULL);
        tu_log_capture_end();
        setenv("CLOCHER_ISA", "ref", 1);
        assert_int_equal(kern_init(), 0);
        assert_int_equal(kern_isa(), KERN_ISA_REF);
        return;
    }
    assert_int_equal(kern_init(), 0);
    assert_int_equal(kern_isa(), KERN_ISA_AVX2);
    assert_string_equal(kern_isa_name(kern_isa()), "avx2");
    /* idempotent: a later kern_init keeps the choice */
    setenv("CLOCHER_ISA", "ref", 1);
    assert_int_equal(kern_init(), 0);
    assert_int_equal(kern_isa(), KERN_ISA_AVX2);
}

static void test_force_and_best(void **state)
{
    (void)state;
    for (int i = KERN_ISA_REF; i <= KERN_ISA_AVX512; i++) {
        enum kern_isa isa = (enum kern_isa)i;
        if (kern_isa_supported(isa)) {
            assert_int_equal(kern_force_isa(isa), 0);
            assert_int_equal(kern_isa(), isa);
        } else {
            tu_log_capture_begin();
            assert_int_equal(kern_force_isa(isa), ERR_UNSUPPORTED);
            tu_assert_log_contains(kern_isa_name(isa), "not supported by this CPU", NULL);
            tu_log_capture_end();
        }
    }
    assert_true(kern_isa_supported(KERN_ISA_REF));
    assert_string_equal(kern_isa_name((enum kern_isa)7), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_bad_value),
        cmocka_unit_test(test_env_forces),
        cmocka_unit_test(test_force_and_best),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
