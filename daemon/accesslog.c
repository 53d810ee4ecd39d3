/*
 * accesslog.c — the optional access log (contract: accesslog.h): one JSON line per finished
 * generation, made with jansson and appended with one write(2) on an O_APPEND descriptor.
 */
#include "accesslog.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct accesslog {
    int fd;
    char *path;
    _Atomic uint64_t failures;
    _Atomic bool failing; /* the last write failed: the next failure is not logged again */
};

int accesslog_open(const char *path, struct accesslog **out)
{
    *out = NULL;
    if (!path || !*path) {
        LOG_ERR("access log: empty path");
        return ERR_USAGE;
    }
    struct accesslog *a = calloc(1, sizeof *a);
    if (!a || !(a->path = strdup(path))) {
        free(a);
        LOG_ERR("access log: out of memory");
        return -ENOMEM;
    }
    a->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (a->fd < 0) {
        int e = errno;
        LOG_ERR("access log: open(%s) failed: %s", path, strerror(e));
        free(a->path);
        free(a);
        return -e;
    }
    *out = a;
    return 0;
}

/* Seconds from nanoseconds for the JSON line (a real, never an integer: 0 is 0.0). */
static double secs(uint64_t ns) { return (double)ns / 1e9; }

int accesslog_write(struct accesslog *a, const struct accesslog_entry *e)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
    json_t *j = json_pack("{s:s, s:I, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f}",
                          "ts", when, "request_id", (json_int_t)e->request_id,
                          "tenant", e->tenant && *e->tenant ? e->tenant : "anonymous",
                          "adapter", e->adapter ? e->adapter : "", "status", e->status,
                          "finish_reason", e->finish_reason,
                          "prompt_tokens", (json_int_t)e->prompt_tokens,
                          "completion_tokens", (json_int_t)e->completion_tokens,
                          "cached_tokens", (json_int_t)e->cached_tokens,
                          "queue_s", secs(e->queue_ns), "ttft_s", secs(e->ttft_ns),
                          "e2e_s", secs(e->e2e_ns));
    char *line = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    int rc = 0;
    if (!line) {
        rc = -ENOMEM;
    } else {
        size_t len = strlen(line);
        line[len] = '\n'; /* json_dumps' NUL becomes the line's end: one write, one line */
        ssize_t w = write(a->fd, line, len + 1);
        if (w < 0)
            rc = -errno;
        else if ((size_t)w != len + 1)
            rc = -EIO; /* a short write (disk full): the line is cut */
        free(line);
    }
    if (rc < 0) {
        atomic_fetch_add(&a->failures, 1);
        if (!atomic_exchange(&a->failing, true))
            LOG_ERR("access log: cannot append to %s: %s (further failures are counted, not "
                    "logged)", a->path, err_str(rc));
    } else {
        atomic_store(&a->failing, false);
    }
    return rc;
}

uint64_t accesslog_failures(const struct accesslog *a) { return atomic_load(&a->failures); }

void accesslog_close(struct accesslog *a)
{
    if (!a)
        return;
    close(a->fd);
    free(a->path);
    free(a);
}
