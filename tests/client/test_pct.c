/*
 * test_pct.c — `clocher bench`'s percentiles (client/online/pct.c): the closest-ranks interpolation
 * on hand-computed cases, edges (one sample, p0/p100, out-of-range p, empty input), and
 * agreement with a brute-force definition on random data.
 */
#include "testutil.h"

#include "pct.h"

#include <math.h>
#include <stdlib.h>

/* this cmocka has no assert_double_equal */
#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static void test_hand_cases(void **state)
{
    (void)state;
    double v[] = {40, 10, 30, 20}; /* sorted: 10 20 30 40 */
    pct_sort(v, 4);
    assert_true(v[0] == 10 && v[3] == 40);
    assert_near(pct_of(v, 4, 0), 10, 1e-12);
    assert_near(pct_of(v, 4, 100), 40, 1e-12);
    assert_near(pct_of(v, 4, 50), 25, 1e-12);  /* mean of the middle two */
    assert_near(pct_of(v, 4, 95), 38.5, 1e-12); /* rank 2.85 */
    assert_near(pct_of(v, 4, 99), 39.7, 1e-12);
    assert_near(pct_mean(v, 4), 25, 1e-12);

    double w[] = {1, 2, 3, 4, 5};
    assert_near(pct_of(w, 5, 50), 3, 1e-12);
    assert_near(pct_of(w, 5, 25), 2, 1e-12);
}

static void test_edges(void **state)
{
    (void)state;
    double one = 7;
    assert_near(pct_of(&one, 1, 0), 7, 0);
    assert_near(pct_of(&one, 1, 50), 7, 0);
    assert_near(pct_of(&one, 1, 100), 7, 0);
    assert_true(isnan(pct_of(&one, 0, 50)));
    assert_true(isnan(pct_mean(&one, 0)));
    assert_true(isnan(pct_of(&one, 1, -1)));
    assert_true(isnan(pct_of(&one, 1, 100.5)));
    assert_true(isnan(pct_of(&one, 1, NAN)));
    pct_sort(&one, 0); /* no-op, no crash */
    double same[] = {3, 3, 3};
    assert_near(pct_of(same, 3, 99), 3, 0);
}

/* Brute force: the value v such that rank p/100*(n-1) interpolates linearly. */
static void test_random_against_definition(void **state)
{
    (void)state;
    srand(12345);
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)(rand() % 97);
        double *v = malloc(n * sizeof *v);
        assert_non_null(v);
        for (size_t i = 0; i < n; i++)
            v[i] = (double)(rand() % 1000) / 7.0;
        pct_sort(v, n);
        for (size_t i = 1; i < n; i++)
            assert_true(v[i - 1] <= v[i]);
        double ps[] = {0, 1, 50, 90, 95, 99, 99.9, 100};
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
            double x = pct_of(v, n, ps[k]);
            /* monotone in p, within [min, max], exact at integer ranks */
            assert_true(x >= v[0] && x <= v[n - 1]);
            if (k)
                assert_true(x >= pct_of(v, n, ps[k - 1]));
            double rank = ps[k] / 100 * (double)(n - 1);
            if (rank == floor(rank))
                assert_near(x, v[(size_t)rank], 1e-12);
        }
        free(v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_cases),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_random_against_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
