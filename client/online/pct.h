/*
 * pct.h — percentiles of latency samples for `clocher bench` (pure; unit-tested).
 *
 * Definition: linear interpolation between the closest ranks of the sorted samples
 * (rank = p/100 * (n-1), the "R-7" estimator of numpy's default and of most spreadsheets):
 * p0 is the minimum, p100 the maximum, p50 of an even count is the mean of the two middle
 * samples.
 */
#ifndef CLOCHER_CLIENT_PCT_H
#define CLOCHER_CLIENT_PCT_H

#include <stddef.h>

/* Sorts v[0..n) ascending in place (call once before pct_of). */
void pct_sort(double *v, size_t n);
/* The p-th percentile (0 <= p <= 100) of sorted v[0..n); NAN when n == 0 or p is outside. */
double pct_of(const double *sorted, size_t n, double p);
/* The arithmetic mean; NAN when n == 0. */
double pct_mean(const double *v, size_t n);

#endif
