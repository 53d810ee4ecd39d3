/*
 * accesslog.h — clocherd's optional access log: one JSON object per line for every finished
 * generation (tenant, adapter, request id, token counts, queue time, TTFT, end-to-end time,
 * how it ended), appended to a file an operator names (the config key `access_log`). Written
 * by stats_finish (daemon/stats.h) from the gateway's reader threads.
 *
 * NOTES: the file is opened O_APPEND and each line goes out in one write(2), so lines of
 * concurrent writers never interleave and an external rotation by copy-and-truncate
 * (logrotate's copytruncate) loses no line boundary. A failed write is logged once per
 * failure streak and counted; it never fails the request.
 */
#ifndef CLOCHER_DAEMON_ACCESSLOG_H
#define CLOCHER_DAEMON_ACCESSLOG_H

#include <stdint.h>

struct accesslog;

/* One finished generation. Strings are NUL-terminated; tenant "" is anonymous access,
 * adapter "" the base model. Durations in nanoseconds (0 = not measured). */
struct accesslog_entry {
    const char *tenant, *adapter;
    uint64_t request_id;           /* the worker request id, as the gateway's log lines name it */
    const char *status;            /* "ok", "cancelled", "deadline" */
    const char *finish_reason;     /* "eos", "length", "stop", "cancelled", "deadline", "context" */
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    uint64_t queue_ns, ttft_ns, e2e_ns;
};

/* Opens (creating with mode 0640) `path` for appending. 0, ERR_USAGE for an empty path, or
 * -errno (logged, naming the path). */
int accesslog_open(const char *path, struct accesslog **out);
/* Appends one line: {"ts":"2026-11-27T08:00:00.123Z","request_id":..,"tenant":..,"adapter":..,
 * "status":..,"finish_reason":..,"prompt_tokens":..,"completion_tokens":..,"cached_tokens":..,
 * "queue_s":..,"ttft_s":..,"e2e_s":..}. 0 or a negative code (logged at the first failure). */
int accesslog_write(struct accesslog *a, const struct accesslog_entry *e);
/* Lines that could not be written since the log was opened. */
uint64_t accesslog_failures(const struct accesslog *a);
void accesslog_close(struct accesslog *a); /* NULL is a no-op */

#endif
