/* ctl.c — parser of the worker → supervisor control datagrams (see ctl.h). */
#include "ctl.h"

#include "err.h"
#include "log.h"

#include <stdio.h>
#include <string.h>

static int bad(const char *who, size_t line, const char *what)
{
    LOG_ERR("%s: control message line %zu: %s; message ignored", who, line, what);
    return ERR_FORMAT;
}

static bool is_one(const char *v, size_t n) { return n == 1 && v[0] == '1'; }

/* A decimal uint64 of 1..20 digits: NULL and *out, or what is wrong with it ("KEY must be
 * <kind>" / "KEY overflows 64 bits", in a static buffer: the parser is not reentrant there,
 * and its callers log the text at once). */
static const char *decimal(const char *v, size_t n, const char *key, const char *kind,
                           uint64_t *out)
{
    static _Thread_local char why[64];
    uint64_t x = 0;
    if (n == 0 || n > 20)
        goto not_decimal;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            goto not_decimal;
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (UINT64_MAX - d) / 10) {
            snprintf(why, sizeof why, "%s overflows 64 bits", key);
            return why;
        }
        x = x * 10 + d;
    }
    *out = x;
    return NULL;
not_decimal:
    snprintf(why, sizeof why, "%s must be %s", key, kind);
    return why;
}

int ctl_parse(const char *who, const char *buf, size_t len, struct ctl_msg *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return bad(who, 0, "empty");
    if (len > CTL_MSG_MAX)
        return bad(who, 0, "longer than the limit");
    if (memchr(buf, '\0', len))
        return bad(who, 0, "contains a NUL byte");
    bool seen_ready = false, seen_wd = false, seen_status = false;
    size_t line = 0;
    for (size_t at = 0; at < len;) {
        const char *s = buf + at;
        const char *nl = memchr(s, '\n', len - at);
        size_t n = nl ? (size_t)(nl - s) : len - at;
        at += n + (nl ? 1 : 0);
        line++;
        if (n == 0) {
            if (at == len && line > 1)
                break; /* one trailing newline */
            return bad(who, line, "empty line");
        }
        const char *eq = memchr(s, '=', n);
        if (!eq || eq == s)
            return bad(who, line, "not KEY=VALUE");
        size_t kn = (size_t)(eq - s), vn = n - kn - 1;
        const char *v = eq + 1;
        if (kn == 5 && memcmp(s, "READY", 5) == 0) {
            if (seen_ready || !is_one(v, vn))
                return bad(who, line, seen_ready ? "READY given twice" : "READY must be 1");
            seen_ready = out->ready = true;
        } else if (kn == 8 && memcmp(s, "WATCHDOG", 8) == 0) {
            if (seen_wd || !is_one(v, vn))
                return bad(who, line, seen_wd ? "WATCHDOG given twice" : "WATCHDOG must be 1");
            seen_wd = out->watchdog = true;
        } else if (kn == 9 && memcmp(s, "HOT_BYTES", 9) == 0) {
            if (out->has_hot_bytes)
                return bad(who, line, "HOT_BYTES given twice");
            const char *why = decimal(v, vn, "HOT_BYTES", "a decimal byte count", &out->hot_bytes);
            if (why)
                return bad(who, line, why);
            out->has_hot_bytes = true;
        } else if (kn == 11 && memcmp(s, "HOT_TENSORS", 11) == 0) {
            if (out->has_hot_tensors)
                return bad(who, line, "HOT_TENSORS given twice");
            const char *why =
                decimal(v, vn, "HOT_TENSORS", "a decimal tensor count", &out->hot_tensors);
            if (why)
                return bad(who, line, why);
            out->has_hot_tensors = true;
        } else if (kn == 6 && memcmp(s, "STATUS", 6) == 0) {
            if (seen_status)
                return bad(who, line, "STATUS given twice");
            if (vn >= CTL_STATUS_MAX)
                return bad(who, line, "STATUS longer than 127 bytes");
            for (size_t i = 0; i < vn; i++)
                if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] >= 0x7f)
                    return bad(who, line, "STATUS must be printable ASCII");
            memcpy(out->status, v, vn);
            out->status[vn] = '\0';
            seen_status = true;
        } else {
            return bad(who, line, "unknown key");
        }
    }
    return 0;
}
