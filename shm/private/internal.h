/*
 * internal.h — helpers shared by the files of shm/ only: the monotonic clock and the futex
 * calls the rings sleep and wake with.
 *
 * NOTES: the futex words live in a MAP_SHARED region, so the calls use the shared (not
 * FUTEX_PRIVATE) variants: the kernel keys them by the underlying page, which both processes
 * map at different addresses.
 */
#ifndef CLOCHER_SHM_INTERNAL_H
#define CLOCHER_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

/* Sleeps while *word == expected, at most timeout_ns. 0 when woken (or the word had already
 * changed: EAGAIN is a normal outcome), -ETIMEDOUT, -EINTR on a signal. */
int shm__futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns);
/* Wakes every sleeper on word. */
void shm__futex_wake(_Atomic uint32_t *word);

#endif
