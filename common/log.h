/*
 * log.h — one logging path for every Clocher process.
 *
 * Messages go to stderr ("clocher: error: ...") or to a sink installed by the embedding program
 * (tests capture messages to assert on their text; the daemon forwards them to the journal).
 * The last error-level message of each thread is kept so a caller that only sees a negative
 * return code can still show the user the precise reason, which was logged once where it
 * happened (log_last_error()).
 *
 * Two line formats: text (above) and JSON, one object per line for log collectors:
 *     {"ts":"2026-11-27T08:00:00.123Z","level":"info","prog":"clocherd","pid":12,
 *      "msg":"...", "request_id":"42"}
 * JSON is chosen by log_set_format() or by CLOCHER_LOG_FORMAT=json in the environment (which
 * is how clocherd's workers, started with clocherd's environment, follow `--log-format json`).
 * A sink then receives the rendered JSON object as its message, except under systemd
 * ($JOURNAL_STREAM set): there the line is written to stderr as "<priority>{...}" whatever the
 * sink (journald strips the prefix), so no sink's decoration breaks the object. The
 * per-thread fields set with log_field_set() (a request id while a thread works on that
 * request) are added to each JSON line and, in text, after the message as " [key=value]".
 *
 * NOTES: log_set_sink()/log_set_level()/log_set_format() are meant to be called at start-up
 * before threads exist; log_msg() itself is thread-safe (one fprintf per message, thread-local
 * last-error buffer and fields).
 */
#ifndef CLOCHER_COMMON_LOG_H
#define CLOCHER_COMMON_LOG_H

#include <stddef.h>

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3 };
enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON = 1 };

#define LOG_ENV_FORMAT "CLOCHER_LOG_FORMAT" /* text | json */
#define LOG_MAX_FIELDS 4                    /* per-thread fields at once */

typedef void log_sink_fn(enum log_level level, const char *msg, void *ud);

/* Default level: INFO, or CLOCHER_LOG=error|warn|info|debug from the environment. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* NULL restores stderr. */
void log_set_sink(log_sink_fn *fn, void *ud);
/* Program name printed before each stderr line ("clocher", "inference-engine", ...). */
void log_set_ident(const char *ident);

/* Default: text, or $CLOCHER_LOG_FORMAT. */
void log_set_format(enum log_format f);
enum log_format log_get_format(void);
/* "text" / "json" -> 0 and *out; anything else -> -EINVAL (nothing logged: the caller names
 * the option it came from). */
int log_format_parse(const char *s, enum log_format *out);

/* A field of the calling thread's lines until cleared (value NULL clears that key). Keys and
 * values are copied (keys up to 31 bytes, values up to 127). -ENOSPC when LOG_MAX_FIELDS are
 * already set. */
int log_field_set(const char *key, const char *value);
void log_fields_clear(void);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last error-level message logged by the calling thread ("" if none). */
const char *log_last_error(void);
void log_clear_error(void);

#define LOG_ERR(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...)                                     \
    do {                                                   \
        if (log_get_level() >= LOG_LEVEL_DEBUG)            \
            log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__);         \
    } while (0)

#endif
