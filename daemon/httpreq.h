/*
 * httpreq.h — a minimal, strict HTTP/1.x request parser for clocherd's metrics endpoint
 * (daemon/metrics.c): the request line and the header block, nothing else (the endpoint takes
 * no bodies and answers one request per connection).
 *
 * The bytes come from anyone who can reach the port, so every byte is checked (RFC 9112
 * grammar: token methods, visible-ASCII targets in origin form, "HTTP/1.0" or "HTTP/1.1",
 * header names as tokens, no obsolete line folding, no control characters, one Host for
 * HTTP/1.1) and sizes are capped; a bad request gets an HTTP status and a reason to answer
 * with, never a crash. Lines may end in CRLF or a bare LF (RFC 9112 section 2.2 allows a
 * recipient to accept LF); a bare CR is an error.
 *
 * NOTES: no allocation, no logging (a client must not be able to fill the journal: the caller
 * decides what to log), no global state; safe on any thread.
 */
#ifndef CLOCHER_DAEMON_HTTPREQ_H
#define CLOCHER_DAEMON_HTTPREQ_H

#include <stddef.h>

#define HTTPREQ_MAX_BYTES 8192  /* request line + headers + the empty line */
#define HTTPREQ_METHOD_MAX 16   /* bytes of a method, NUL included */
#define HTTPREQ_PATH_MAX 1024   /* bytes of the request target, NUL included */
#define HTTPREQ_MAX_HEADERS 64

struct httpreq {
    char method[HTTPREQ_METHOD_MAX]; /* "GET", as sent (methods are case-sensitive) */
    char path[HTTPREQ_PATH_MAX];     /* the target's path: "/metrics" (query stripped) */
    int version_minor;               /* HTTP/1.<version_minor>: 0 or 1 */
    size_t header_bytes;             /* bytes the request line and headers took */
    /* When the parse fails: the HTTP status to answer (400, 414, 431, 501, 505) and why, a
     * static string fit for a response body ("header line without a colon"). */
    int status;
    const char *why;
};

/*
 * Parses the request at the start of buf[len] (len may exceed HTTPREQ_MAX_BYTES; only that
 * much is looked at). Returns
 *   0         a complete, valid request head: r filled (status 0, why NULL);
 *   -EAGAIN   valid so far but incomplete: read more bytes and call again with all of them;
 *   ERR_FORMAT  malformed: r->status 400 (bad syntax), 501 (a request body, which the
 *             endpoint never takes) or 505 (an HTTP version other than 1.0/1.1), r->why;
 *   ERR_RANGE   too large: r->status 414 (target) or 431 (header block, or too many
 *             headers), r->why.
 */
int httpreq_parse(const char *buf, size_t len, struct httpreq *r);

#endif
