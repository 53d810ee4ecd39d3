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
 * Read-only streaming bandwidth in GB/s (1e9 bytes/s), the best of several variants, each the
 * best of `reps` passes over a buffer of `bytes` (>> last-level cache; rounded to 2 MiB):
 * every participant of the pool streams its contiguous share with the widest loads the CPU
 * has, as 1, 2, 4 or 8 interleaved sequential streams, from 4 KiB pages and from 2 MiB pages
 * (madvise(MADV_HUGEPAGE)). bench_bandwidth_ex also reports every variant and the winner.
 */
struct bench_bw {
    double gbs;         /* the best variant */
    int streams, huge;  /* which one: streams per thread, 2 MiB pages or not */
    double each[2][4];  /* [huge][streams 1, 2, 4, 8] */
    double huge_share;  /* share of the huge-page buffer the kernel really backed with them */
};
double bench_bandwidth_ex(struct pool *p, size_t bytes, int reps, struct bench_bw *out);
double bench_bandwidth(struct pool *p, size_t bytes, int reps);

/* Peak instruction throughput of one core, in G-operations/s (1 multiply-add = 2 ops):
 * which = 0: f32 FMA (AVX-512 or AVX2), 1: vdpbf16ps, 2: vpdpbusd. 0 if unavailable. */
double bench_peak_gops(int which);

/*
 * CPU used by other processes while a measurement ran, as a share of the whole machine (0..1):
 * busy time from /proc/stat minus this process's own (getrusage). The machine is shared, so
 * every table row reports it; rows measured beside a busy neighbour are marked.
 */
struct bench_load {
    double busy, self, wall;
};
void bench_load_begin(struct bench_load *l);
double bench_load_end(const struct bench_load *l);

/* The kernel A/B benches' helpers (amxq_bench, amxs_bench): xorshift64 numbers from *state
 * (the top 32 of 53 bits), this thread's CPU seconds, 64-byte aligned memory that exits the
 * program when there is none (named in the message), and a qsort order for doubles. */
uint32_t bench_xorshift(uint64_t *state);
double bench_thread_cpu(void);
void *bench_xmalloc(const char *who, size_t bytes);
int bench_cmp_double(const void *a, const void *b);

/* A [rows][cols] matrix of dtype dt with random finite values (scales ~1e-2); NULL on OOM. */
void *bench_random_matrix(enum dtype dt, size_t rows, size_t cols, uint64_t seed);

#endif
