/*
 * pct.c — percentiles by linear interpolation between closest ranks (pct.h).
 */
#include "pct.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void pct_sort(double *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof *v, cmp_double);
}

double pct_of(const double *sorted, size_t n, double p)
{
    if (n == 0 || !(p >= 0 && p <= 100))
        return NAN;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    if (lo >= n - 1)
        return sorted[n - 1];
    double frac = rank - (double)lo;
    return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

double pct_mean(const double *v, size_t n)
{
    if (n == 0)
        return NAN;
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    return s / (double)n;
}
