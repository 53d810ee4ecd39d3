/*
 * slice.h — a short CPU time slice for the latency-sensitive processes (clocherd, the clocher
 * client).
 *
 * On a host whose workers keep every core busy, a gateway thread woken to forward a token
 * waits for the running worker thread's slice to end: under Linux's EEVDF scheduler (6.6+)
 * that is up to a few milliseconds, the whole TTFT budget. Since 6.12 a SCHED_OTHER thread may
 * ask for a shorter slice (sched_attr.sched_runtime); a shorter slice also wins wakeup
 * preemption against a longer one, so the gateway runs at once and hands the CPU back as soon.
 * Older kernels ignore the request.
 *
 * NOTES: applies to the calling thread and the threads it creates afterwards: call it first in
 * main(), before any library starts its threads. The nice value is kept.
 */
#ifndef CLOCHER_COMMON_SLICE_H
#define CLOCHER_COMMON_SLICE_H

#include <stdint.h>

#define SLICE_LATENCY_NS 100000u /* 0.1 ms: the kernel's lower bound */

/* 0, or a negative errno (not logged: a kernel or sandbox that refuses it is no error). */
int slice_request(uint64_t slice_ns);

#endif
