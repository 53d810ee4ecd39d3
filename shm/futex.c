/*
 * futex.c — the futex wrappers of internal.h. Shared (not private) futexes: the words
 * sit in a MAP_SHARED memfd mapping that the two processes map at different addresses.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int shm__futex_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000ull),
                          .tv_nsec = (long)(timeout_ns % 1000000000ull)};
    /* FUTEX_WAIT's timeout is relative (CLOCK_MONOTONIC) */
    if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0) == 0)
        return 0;
    if (errno == EAGAIN)
        return 0; /* the word changed before we slept: someone made progress */
    return -errno;
}

void shm__futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
