/*
 * mono.h — the monotonic clock in nanoseconds, for deadlines, timeouts and timings.
 *
 * CLOCK_MONOTONIC is system-wide, so values taken in two processes compare (the worker and
 * the daemon stamp deadlines with it); it never jumps with the wall clock.
 */
#ifndef CLOCHER_COMMON_MONO_H
#define CLOCHER_COMMON_MONO_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds since an arbitrary start (boot); cannot fail on Linux. */
static inline uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The same clock in seconds, for human-scale timings (benchmarks, progress). */
static inline double mono_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
