/* slice.c — a short CPU time slice for latency-sensitive processes (see slice.h). */
#include "slice.h"

#include <errno.h>
#include <linux/sched/types.h> /* struct sched_attr (glibc 2.36 has no sched_setattr) */
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

int slice_request(uint64_t slice_ns)
{
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0); /* sched_setattr sets the nice value too */
    if (errno)
        return -errno;
    struct sched_attr a = {.size = sizeof a,
                           .sched_policy = 0, /* SCHED_OTHER */
                           .sched_nice = nice,
                           .sched_runtime = slice_ns};
    return syscall(SYS_sched_setattr, 0, &a, 0) == 0 ? 0 : -errno;
}
