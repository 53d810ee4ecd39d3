/*
 * fuzz_http_request.c — libFuzzer harness over the metrics endpoint's HTTP request-head parser
 * (daemon/httpreq.c), which reads bytes from anyone who can reach the port. Beyond "no crash":
 * every answer is one of the documented codes with a status and reason when it refuses; an
 * accepted head has a token method, an origin-form path without query, HTTP/1.0 or 1.1, and a
 * length ending on its empty line; and every strict prefix of an accepted head asks for more
 * bytes (what metrics.c relies on when it re-parses after each read).
 */
#include "fuzz.h"

#include "err.h"
#include "httpreq.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_accepted(const uint8_t *data, size_t size, const struct httpreq *r)
{
    if (r->status != 0 || r->why || r->header_bytes == 0 || r->header_bytes > size ||
        r->header_bytes > HTTPREQ_MAX_BYTES || data[r->header_bytes - 1] != '\n')
        abort();
    if (r->version_minor != 0 && r->version_minor != 1)
        abort();
    size_t nm = strnlen(r->method, sizeof r->method);
    if (nm == 0 || nm == sizeof r->method)
        abort();
    size_t np = strnlen(r->path, sizeof r->path);
    if (np == sizeof r->path || r->path[0] != '/' || memchr(r->path, '?', np))
        abort();
    for (size_t i = 0; i < np; i++)
        if ((unsigned char)r->path[i] <= 0x20 || (unsigned char)r->path[i] >= 0x7f)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct httpreq r;
    int rc = httpreq_parse((const char *)data, size, &r);
    switch (rc) {
    case 0: {
        check_accepted(data, size, &r);
        /* the head alone parses the same; a strict prefix of it is incomplete */
        struct httpreq again, part;
        size_t h = r.header_bytes;
        if (httpreq_parse((const char *)data, h, &again) != 0 ||
            strcmp(again.method, r.method) != 0 || strcmp(again.path, r.path) != 0 ||
            again.header_bytes != h)
            abort();
        size_t cut = data[0] % h;
        if (httpreq_parse((const char *)data, cut, &part) != -EAGAIN)
            abort();
        break;
    }
    case -EAGAIN:
        if (r.status != 0 || size >= HTTPREQ_MAX_BYTES)
            abort();
        break;
    case ERR_FORMAT:
        if ((r.status != 400 && r.status != 501 && r.status != 505) || !r.why)
            abort();
        break;
    case ERR_RANGE:
        if ((r.status != 414 && r.status != 431) || !r.why)
            abort();
        break;
    default:
        abort();
    }
    return 0;
}
