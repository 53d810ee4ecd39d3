/*
 * isa_case.h — one cmocka test per kernel ISA, for tests that exercise each ISA's path
 * (tests/kern, and the ISA comparisons in tests/bsr, tests/lora, tests/convert): the ISA
 * comes in the test's state, and a CPU without it makes the test skip() — counted and printed
 * by the runner — rather than pass without checking anything. Each such test leaves the ISA
 * that was active before it (kern_init's choice) active again, for the tests after it.
 *
 *   static void test_x(void **state) { const struct isa_case *c = isa_case_begin(state); ... }
 *   ISA_CASE_TESTS(test_x)   -> test_x/ref, test_x/avx2, test_x/avx512 in the CMUnitTest list
 *   ISA_CASE_SIMD(test_x)    -> test_x/avx2, test_x/avx512 (tests comparing SIMD against ref)
 *   ISA_CASE_TEST(test_x, isa_case_avx512bf16) -> one entry (the AVX512-BF16 variants)
 *   ISA_CASE_TEST(test_x, isa_case_amxbf16)    -> one entry (the AMX-BF16 variant; skips where
 *                                                 the CPU or the OS gives no AMX)
 */
#ifndef CLOCHER_TESTS_KERN_ISA_CASE_H
#define CLOCHER_TESTS_KERN_ISA_CASE_H

#include "testutil.h"

#include "kern.h"

struct isa_case {
    const char *name;
    enum kern_isa isa;
    int bf16; /* also needs AVX512-BF16 (kern_has_avx512bf16) */
    int amx;  /* also needs AMX-BF16 enabled for this process (kern_has_amx_bf16) */
};

static const struct isa_case isa_case_ref = {"ref", KERN_ISA_REF, 0, 0};
static const struct isa_case isa_case_avx2 = {"avx2", KERN_ISA_AVX2, 0, 0};
static const struct isa_case isa_case_avx512 = {"avx512", KERN_ISA_AVX512, 0, 0};
static const struct isa_case isa_case_avx512bf16 = {"avx512bf16", KERN_ISA_AVX512, 1, 0};
static const struct isa_case isa_case_amxbf16 = {"amxbf16", KERN_ISA_AVX512, 1, 1};

/* The state's ISA, made the active one; skips the test when this CPU cannot run it. */
static inline const struct isa_case *isa_case_begin(void **state)
{
    const struct isa_case *c = *state;
    if (!kern_isa_supported(c->isa) || (c->bf16 && !kern_has_avx512bf16()) ||
        (c->amx && !kern_has_amx_bf16())) {
        print_message("[  SKIP    ] this CPU has no %s\n", c->name);
        skip();
    }
    assert_int_equal(kern_force_isa(c->isa), 0);
    /* The CPU has AMX but this process asked for none (CLOCHER_AMX=0, dispatch.c): the AMX
     * entries would check the avx512 kernels again, so they skip, counted, like a CPU without
     * it (the teardown restores the ISA active before). */
    if (c->amx && !kern_amx_active()) {
        print_message("[  SKIP    ] AMX is off in this process (CLOCHER_AMX=0)\n");
        skip();
    }
    return c;
}

static enum kern_isa isa_case_saved_; /* the active ISA before the running test */

static inline int isa_case_setup(void **state)
{
    (void)state;
    if (kern_init() != 0)
        return -1;
    isa_case_saved_ = kern_isa();
    return 0;
}

static inline int isa_case_teardown(void **state)
{
    (void)state;
    return kern_force_isa(isa_case_saved_) == 0 ? 0 : -1;
}

#define ISA_CASE_TEST(fn, c) {#fn "/" #c, fn, isa_case_setup, isa_case_teardown, (void *)&(c)}
#define ISA_CASE_SIMD(fn) ISA_CASE_TEST(fn, isa_case_avx2), ISA_CASE_TEST(fn, isa_case_avx512)
#define ISA_CASE_TESTS(fn) ISA_CASE_TEST(fn, isa_case_ref), ISA_CASE_SIMD(fn)

#endif
