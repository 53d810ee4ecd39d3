/* tstream.c — tensor data streamed into a model file (see private/tstream.h). */
#include "tstream.h"

#include "err.h"
#include "log.h"

#include <string.h>

static uint64_t size_of(const struct tstream *s, size_t i)
{
    uint64_t v;
    memcpy(&v, (const char *)s->tensors + i * s->stride + s->size_off, sizeof v);
    return v;
}

int tstream_write(struct tstream *s, const char *path, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        if (s->cur == s->n_tensors) {
            LOG_ERR("%s: %zu bytes of tensor data beyond the declared tensors", path, n);
            return ERR_USAGE;
        }
        uint64_t size = size_of(s, s->cur);
        int rc = 0;
        if (s->cur_done == 0)
            rc = afile_pad(s->af, s->align);
        uint64_t chunk = size - s->cur_done;
        if (chunk > n)
            chunk = n;
        if (rc == 0)
            rc = afile_write(s->af, p, (size_t)chunk);
        if (rc != 0)
            return rc;
        p += chunk;
        n -= (size_t)chunk;
        s->cur_done += chunk;
        if (s->cur_done == size) {
            s->cur++;
            s->cur_done = 0;
        }
    }
    return 0;
}

bool tstream_done(struct tstream *s)
{
    while (s->cur < s->n_tensors && s->cur_done == 0 && size_of(s, s->cur) == 0)
        s->cur++;
    return s->cur == s->n_tensors;
}
