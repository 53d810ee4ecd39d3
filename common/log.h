/*
 * log.h — one logging path for every Clocher process.
 *
 * Messages go to stderr ("clocher: error: ...") or to a sink installed by the embedding program
 * (tests capture messages to assert on their text; the daemon forwards them to the journal).
 * The last error-level message of each thread is kept so a caller that only sees a negative
 * return code can still show the user the precise reason, which was logged once where it
 * happened (log_last_error()).
 *
 * NOTES: log_set_sink()/log_set_level() are meant to be called at start-up before threads exist;
 * log_msg() itself is thread-safe (one fprintf per message, thread-local last-error buffer).
 */
#ifndef CLOCHER_COMMON_LOG_H
#define CLOCHER_COMMON_LOG_H

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3 };

typedef void log_sink_fn(enum log_level level, const char *msg, void *ud);

/* Default level: INFO, or CLOCHER_LOG=error|warn|info|debug from the environment. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* NULL restores stderr. */
void log_set_sink(log_sink_fn *fn, void *ud);
/* Program name printed before each stderr line ("clocher", "inference-engine", ...). */
void log_set_ident(const char *ident);

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
