/* log.c — stderr/sink logging, text or JSON lines, with a per-thread last-error message and
 * per-thread fields (see log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int g_level = -1;  /* -1: not yet read from the environment */
static int g_format = -1; /* -1: not yet read from the environment */
static log_sink_fn *g_sink;
static void *g_sink_ud;
static const char *g_ident = "clocher";
static _Thread_local char t_last_error[1024];

struct log_field {
    char key[32];
    char value[128];
};
static _Thread_local struct log_field t_fields[LOG_MAX_FIELDS];
static _Thread_local int t_n_fields;

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

int log_format_parse(const char *s, enum log_format *out)
{
    if (s && strcmp(s, "text") == 0)
        *out = LOG_FORMAT_TEXT;
    else if (s && strcmp(s, "json") == 0)
        *out = LOG_FORMAT_JSON;
    else
        return -EINVAL;
    return 0;
}

void log_set_format(enum log_format f) { g_format = (int)f; }

enum log_format log_get_format(void)
{
    if (g_format < 0) {
        /* an unknown value is text: a worker must not die over its log format */
        enum log_format f = LOG_FORMAT_TEXT;
        (void)log_format_parse(getenv(LOG_ENV_FORMAT), &f);
        g_format = (int)f;
    }
    return (enum log_format)g_format;
}

/* stderr is systemd's journal stream (it sets $JOURNAL_STREAM for the unit's processes) */
static bool under_journal(void)
{
    static int yes = -1;
    if (yes < 0)
        yes = getenv("JOURNAL_STREAM") != NULL;
    return yes;
}

void log_set_sink(log_sink_fn *fn, void *ud)
{
    g_sink = fn;
    g_sink_ud = ud;
}

void log_set_ident(const char *ident) { g_ident = ident ? ident : "clocher"; }

int log_field_set(const char *key, const char *value)
{
    int i = 0;
    while (i < t_n_fields && strcmp(t_fields[i].key, key) != 0)
        i++;
    if (!value) {
        if (i < t_n_fields)
            t_fields[i] = t_fields[--t_n_fields];
        return 0;
    }
    if (i == t_n_fields) {
        if (t_n_fields == LOG_MAX_FIELDS)
            return -ENOSPC;
        t_n_fields++;
        snprintf(t_fields[i].key, sizeof t_fields[i].key, "%s", key);
    }
    snprintf(t_fields[i].value, sizeof t_fields[i].value, "%s", value);
    return 0;
}

void log_fields_clear(void) { t_n_fields = 0; }

/* ---- JSON lines ---- */

struct out {
    char *p;
    size_t len, cap; /* cap keeps room for the closing "}" and the NUL */
};

static void put(struct out *o, const char *s, size_t n)
{
    if (n > o->cap - o->len)
        n = o->cap - o->len;
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

/* The length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates,
 * at most U+10FFFF), 0 if it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                                : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || len > n || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((len == 3 && c == 0xe0 && s[1] < 0xa0) || (len == 3 && c == 0xed && s[1] >= 0xa0) ||
        (len == 4 && c == 0xf0 && s[1] < 0x90) || (len == 4 && c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

/* s as a JSON string (quotes included); a byte that is not UTF-8 becomes U+FFFD. An escape
 * that does not fit is dropped whole, so a truncated line is still JSON. */
static void put_json_string(struct out *o, const char *s)
{
    put(o, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        char esc[8];
        size_t k = utf8_len(u + i, n - i);
        const char *piece = (const char *)u + i;
        size_t plen = k;
        if (k == 0) {
            piece = "\\ufffd", plen = 6, k = 1;
        } else if (u[i] == '"' || u[i] == '\\') {
            esc[0] = '\\', esc[1] = (char)u[i];
            piece = esc, plen = 2;
        } else if (u[i] < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", u[i]);
            piece = esc, plen = 6;
        }
        if (plen + 1 > o->cap - o->len)
            break; /* the closing quote still fits */
        put(o, piece, plen);
        i += k;
    }
    put(o, "\"", 1);
}

/* ,"key":"value" whole, or nothing when it does not fit (the value is cut first). */
static void put_field(struct out *o, const char *key, const char *value)
{
    size_t start = o->len, k = strlen(key);
    if (o->cap - o->len < k * 6 + 6) /* key escaped at worst, quotes, comma, colon */
        return;
    put(o, ",", 1);
    put_json_string(o, key);
    put(o, ":", 1);
    if (o->cap - o->len < 2) {
        o->len = start;
        return;
    }
    put_json_string(o, value);
}

/* One JSON object (no newline) into buf[cap]. The per-thread fields are rendered first and
 * kept: a message too long for the line is cut, the request id it belongs to is not. */
static void render_json(enum log_level level, const char *msg, char *buf, size_t cap)
{
    char fbuf[LOG_MAX_FIELDS * 1024];
    struct out f = {.p = fbuf, .cap = sizeof fbuf};
    for (int i = 0; i < t_n_fields; i++)
        put_field(&f, t_fields[i].key, t_fields[i].value);

    struct out o = {.p = buf, .cap = cap - 2 - f.len}; /* "}", NUL and the fields after msg */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char head[160];
    int n = snprintf(head, sizeof head,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
    put(&o, head, (size_t)n);
    put_field(&o, "prog", g_ident);
    n = snprintf(head, sizeof head, ",\"pid\":%ld", (long)getpid());
    put(&o, head, (size_t)n);
    put_field(&o, "msg", msg);
    memcpy(buf + o.len, fbuf, f.len);
    o.len += f.len;
    buf[o.len++] = '}';
    buf[o.len] = '\0';
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (level == LOG_LEVEL_ERROR)
        memcpy(t_last_error, buf, sizeof t_last_error);
    if (!g_sink && (int)level > (int)log_get_level())
        return;
    if (log_get_format() == LOG_FORMAT_JSON) {
        char line[8192];
        render_json(level, buf, line, sizeof line);
        if (under_journal()) {
            /* a journal sink would decorate the object ("name: {...}"): the priority prefix,
             * which journald strips, and the object alone */
            static const int prio[] = {3 /* err */, 4 /* warning */, 6 /* info */, 7 /* debug */};
            if ((int)level <= (int)log_get_level())
                fprintf(stderr, "<%d>%s\n", prio[level], line);
        } else if (g_sink) {
            g_sink(level, line, g_sink_ud);
        } else {
            fprintf(stderr, "%s\n", line);
        }
        return;
    }
    char fields[LOG_MAX_FIELDS * 164] = "";
    for (int i = 0, at = 0; i < t_n_fields; i++)
        at += snprintf(fields + at, sizeof fields - (size_t)at, " [%s=%s]", t_fields[i].key,
                       t_fields[i].value);
    if (g_sink) {
        if (fields[0]) {
            char full[sizeof buf + sizeof fields];
            snprintf(full, sizeof full, "%s%s", buf, fields);
            g_sink(level, full, g_sink_ud);
        } else {
            g_sink(level, buf, g_sink_ud);
        }
        return;
    }
    fprintf(stderr, "%s: %s: %s%s\n", g_ident, level_names[level], buf, fields);
}

const char *log_last_error(void) { return t_last_error; }

void log_clear_error(void) { t_last_error[0] = '\0'; }
