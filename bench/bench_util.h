/*
 * bench_util.h — shared pieces of the benchmarks: a clock, the read-only streaming bandwidth
 * probe, a peak-throughput probe, and random weight matrices of any dtype.
 */
#ifndef CLOCHER_BENCH_UTIL_H
#define CLOCHER_BENCH_UTIL_H

#include "dtype.h"
#include "pool.h"

#include <stddef.h>
#include <stdint.h>

double bench_now(void);

/*
 * Read-only streaming bandwidth in GB/s (1e9 bytes/s): every participant of the pool streams
 * its contiguous share of `bytes` (> last-level cache) with the widest loads the CPU has;
 * best of `reps` passes.
 */
double bench_bandwidth(struct pool *p, size_t bytes, int reps);

/* Peak instruction throughput of one core, in G-operations/s (1 multiply-add = 2 ops):
 * which = 0: f32 FMA (AVX-512 or AVX2), 1: vdpbf16ps, 2: vpdpbusd. 0 if unavailable. */
double bench_peak_gops(int which);

/* A [rows][cols] matrix of dtype dt with random finite values (scales ~1e-2); NULL on OOM. */
void *bench_random_matrix(enum dtype dt, size_t rows, size_t cols, uint64_t seed);

#endif
