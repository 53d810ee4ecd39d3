/* log.c — stderr/sink logging with a per-thread last-error message (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int g_level = -1; /* -1: not yet read from the environment */
static log_sink_fn *g_sink;
static void *g_sink_ud;
static const char *g_ident = "clocher";
static _Thread_local char t_last_error[1024];

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static int level_from_env(void)
{
    const char *s = getenv("CLOCHER_LOG");
    if (s)
        for (int i = 0; i < 4; i++)
            if (strcasecmp(s, level_names[i]) == 0)
                return i;
    return LOG_LEVEL_INFO;
}

void log_set_level(enum log_level level) { g_level = (int)level; }

enum log_level log_get_level(void)
{
    if (g_level < 0)
        g_level = level_from_env();
    return (enum log_level)g_level;
}

void log_set_sink(log_sink_fn *fn, void *ud)
{
    g_sink = fn;
    g_sink_ud = ud;
}

void log_set_ident(const char *ident) { g_ident = ident ? ident : "clocher"; }

void log_msg(enum log_level level, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (level == LOG_LEVEL_ERROR)
        memcpy(t_last_error, buf, sizeof t_last_error);
    if (g_sink) {
        g_sink(level, buf, g_sink_ud);
        return;
    }
    if ((int)level > (int)log_get_level())
        return;
    fprintf(stderr, "%s: %s: %s\n", g_ident, level_names[level], buf);
}

const char *log_last_error(void) { return t_last_error; }

void log_clear_error(void) { t_last_error[0] = '\0'; }
