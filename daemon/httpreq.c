/*
 * httpreq.c — the metrics endpoint's HTTP/1.x request-head parser (contract: httpreq.h).
 *
 * It works on whole lines: each call re-parses from the start (the head is at most
 * HTTPREQ_MAX_BYTES, so re-parsing a few kilobytes per read costs nothing), which keeps the
 * parser free of saved state. A line is only judged once its LF has arrived, except that an
 * unfinished line already longer than its limit fails at once.
 */
#include "httpreq.h"

#include "err.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

/* RFC 9110 tchar: the characters of a token (methods, header names). */
static bool is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A field value's characters: VCHAR, SP, HTAB and obs-text (RFC 9110 section 5.5). */
static bool is_field_char(unsigned char c) { return c == ' ' || c == '\t' || (c > 0x20 && c != 0x7f); }

static int fail(struct httpreq *r, int code, int status, const char *why)
{
    r->status = status;
    r->why = why;
    return code;
}

/* The next line of buf[pos..len): its bytes [pos, *end) without the CR LF / LF, and *next
 * after the terminator. false when no LF is there yet. */
static bool next_line(const char *buf, size_t len, size_t pos, size_t *end, size_t *next)
{
    const char *lf = memchr(buf + pos, '\n', len - pos);
    if (!lf)
        return false;
    size_t e = (size_t)(lf - buf);
    *next = e + 1;
    if (e > pos && buf[e - 1] == '\r')
        e--;
    *end = e;
    return true;
}

/* Case-insensitive equality of a header name buf[n] with a lowercase literal. */
static bool name_is(const char *buf, size_t n, const char *lit)
{
    if (strlen(lit) != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return false;
    }
    return true;
}

static int parse_request_line(const char *l, size_t n, struct httpreq *r)
{
    /* method SP request-target SP HTTP-version: exactly one space between each */
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    if (i == 0 || i == n || l[i] != ' ')
        return fail(r, ERR_FORMAT, 400, "malformed request line (method)");
    if (i >= HTTPREQ_METHOD_MAX)
        return fail(r, ERR_FORMAT, 501, "method not implemented");
    memcpy(r->method, l, i);
    r->method[i] = '\0';

    size_t t = ++i;
    while (i < n && l[i] > 0x20 && l[i] < 0x7f)
        i++;
    size_t tlen = i - t;
    if (tlen == 0 || i == n || l[i] != ' ')
        return fail(r, ERR_FORMAT, 400, "malformed request line (target)");
    if (l[t] != '/')
        return fail(r, ERR_FORMAT, 400, "request target must be a path (origin form)");
    size_t plen = tlen;
    const char *q = memchr(l + t, '?', tlen);
    if (q)
        plen = (size_t)(q - (l + t));
    if (tlen >= HTTPREQ_PATH_MAX)
        return fail(r, ERR_RANGE, 414, "request target too long");
    memcpy(r->path, l + t, plen);
    r->path[plen] = '\0';

    const char *v = l + i + 1;
    size_t vn = n - i - 1;
    if (vn != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9')
        return fail(r, ERR_FORMAT, 400, "malformed request line (version)");
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
        return fail(r, ERR_FORMAT, 505, "HTTP version not supported (1.0 and 1.1 are)");
    r->version_minor = v[7] - '0';
    return 0;
}

int httpreq_parse(const char *buf, size_t len, struct httpreq *r)
{
    memset(r, 0, sizeof *r);
    if (len > HTTPREQ_MAX_BYTES)
        len = HTTPREQ_MAX_BYTES;
    for (size_t i = 0; i < len; i++)
        if (buf[i] == '\0')
            return fail(r, ERR_FORMAT, 400, "NUL byte in request");

    size_t pos = 0, end, next;
    /* RFC 9112 section 2.2: ignore empty lines before the request line */
    while (next_line(buf, len, pos, &end, &next) && end == pos)
        pos = next;

    if (!next_line(buf, len, pos, &end, &next)) {
        /* an unfinished request line: refuse it as soon as it cannot fit any more */
        if (len - pos >= HTTPREQ_METHOD_MAX + HTTPREQ_PATH_MAX + 16) {
            const char *sp = memchr(buf + pos, ' ', len - pos);
            if (sp && !memchr(sp + 1, ' ', len - (size_t)(sp + 1 - buf)))
                return fail(r, ERR_RANGE, 414, "request target too long");
            return fail(r, ERR_FORMAT, 400, "request line too long");
        }
        return len == HTTPREQ_MAX_BYTES ? fail(r, ERR_RANGE, 431, "request head too large")
                                        : -EAGAIN;
    }
    if (memchr(buf + pos, '\r', end - pos))
        return fail(r, ERR_FORMAT, 400, "bare CR in request line");
    int rc = parse_request_line(buf + pos, end - pos, r);
    if (rc < 0)
        return rc;
    pos = next;

    int n_headers = 0, n_host = 0;
    for (;;) {
        if (!next_line(buf, len, pos, &end, &next))
            return len == HTTPREQ_MAX_BYTES ? fail(r, ERR_RANGE, 431, "request head too large")
                                            : -EAGAIN;
        const char *l = buf + pos;
        size_t n = end - pos;
        pos = next;
        if (n == 0)
            break; /* the empty line: the head is complete */
        if (memchr(l, '\r', n))
            return fail(r, ERR_FORMAT, 400, "bare CR in header line");
        if (l[0] == ' ' || l[0] == '\t')
            return fail(r, ERR_FORMAT, 400, "obsolete header line folding");
        if (++n_headers > HTTPREQ_MAX_HEADERS)
            return fail(r, ERR_RANGE, 431, "too many header fields");
        size_t k = 0;
        while (k < n && is_tchar((unsigned char)l[k]))
            k++;
        if (k == n || l[k] != ':')
            return fail(r, ERR_FORMAT, 400, "header line without a colon after a field name");
        if (k == 0)
            return fail(r, ERR_FORMAT, 400, "empty header field name");
        for (size_t j = k + 1; j < n; j++)
            if (!is_field_char((unsigned char)l[j]))
                return fail(r, ERR_FORMAT, 400, "control character in a header value");
        /* the value without its optional surrounding whitespace */
        size_t vb = k + 1, ve = n;
        while (vb < ve && (l[vb] == ' ' || l[vb] == '\t'))
            vb++;
        while (ve > vb && (l[ve - 1] == ' ' || l[ve - 1] == '\t'))
            ve--;
        if (name_is(l, k, "host")) {
            n_host++;
        } else if (name_is(l, k, "transfer-encoding")) {
            return fail(r, ERR_FORMAT, 501, "request bodies are not accepted");
        } else if (name_is(l, k, "content-length")) {
            /* "0" (or 00...) is no body at all; anything else is a body we will not read */
            bool zero = ve > vb;
            for (size_t j = vb; j < ve; j++)
                zero = zero && l[j] == '0';
            if (!zero)
                return fail(r, ERR_FORMAT, 501, "request bodies are not accepted");
        }
    }
    if (r->version_minor == 1 && n_host != 1)
        return fail(r, ERR_FORMAT, 400, "an HTTP/1.1 request needs exactly one Host header");
    if (n_host > 1)
        return fail(r, ERR_FORMAT, 400, "more than one Host header");
    r->header_bytes = pos;
    return 0;
}
