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

/* A decimal uint64 of 1..20 digits: 0 and *out, -1 (not decimal) or -2 (overflow). */
static int decimal(const char *v, size_t n, uint64_t *out)
{
    uint64_t x = 0;
    if (n == 0 || n > 20)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -2;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

/* Checks and stores one KEY=VALUE of key k: NULL, or what is wrong (in why[cap]). */
static const char *apply(enum heritage_ctl_key k, const char *v, size_t vn,
                         struct heritage_ctl_msg *out, char *why, size_t cap)
{
    const struct heritage_ctl_key_info *ki = &heritage_ctl_keys[k];
    uint64_t x = 0;
    switch (ki->kind) {
    case HERITAGE_CTL_FLAG:
        if (vn != 1 || v[0] != '1')
            goto bad_value;
        break;
    case HERITAGE_CTL_COUNT: {
        int rc = decimal(v, vn, &x);
        if (rc == -2) {
            snprintf(why, cap, "%s overflows 64 bits", ki->name);
            return why;
        }
        if (rc < 0)
            goto bad_value;
        break;
    }
    case HERITAGE_CTL_TEXT:
        if (vn >= HERITAGE_CTL_STATUS_MAX) {
            snprintf(why, cap, "%s longer than %d bytes", ki->name, HERITAGE_CTL_STATUS_MAX - 1);
            return why;
        }
        for (size_t i = 0; i < vn; i++)
            if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] >= 0x7f)
                goto bad_value;
        break;
    }
    switch (k) {
    case HERITAGE_CTL_READY: out->ready = true; break;
    case HERITAGE_CTL_WATCHDOG: out->watchdog = true; break;
    case HERITAGE_CTL_HOT_BYTES: out->hot_bytes = x, out->has_hot_bytes = true; break;
    case HERITAGE_CTL_HOT_TENSORS: out->hot_tensors = x, out->has_hot_tensors = true; break;
    case HERITAGE_CTL_STATUS:
        memcpy(out->status, v, vn);
        out->status[vn] = '\0';
        break;
    case HERITAGE_CTL_NKEYS: break;
    }
    return NULL;
bad_value:
    snprintf(why, cap, "%s must be %s", ki->name, ki->value);
    return why;
}

int ctl_parse(const char *who, const char *buf, size_t len, struct heritage_ctl_msg *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return bad(who, 0, "empty");
    if (len > HERITAGE_CTL_MSG_MAX)
        return bad(who, 0, "longer than the limit");
    if (memchr(buf, '\0', len))
        return bad(who, 0, "contains a NUL byte");
    bool seen[HERITAGE_CTL_NKEYS] = {false};
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
        size_t kn = (size_t)(eq - s);
        int k = heritage_ctl_key_find(s, kn);
        if (k < 0)
            return bad(who, line, "unknown key");
        char why[96];
        if (seen[k]) {
            snprintf(why, sizeof why, "%s given twice", heritage_ctl_keys[k].name);
            return bad(who, line, why);
        }
        seen[k] = true;
        if (apply((enum heritage_ctl_key)k, eq + 1, n - kn - 1, out, why, sizeof why))
            return bad(who, line, why);
    }
    return 0;
}
