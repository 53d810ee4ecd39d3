/*
 * fuzz_reflect.c — libFuzzer harness over gRPC server reflection's request handling
 * (daemon/gw_reflect.c, gw_reflect_answer): the bytes of a ServerReflectionRequest, which any
 * client may send without an API key.
 *
 * Properties: an answer is 0 with a response, or ERR_FORMAT with a reason for the status, or
 * -ENOMEM; never a read outside the request, never a response without bytes.
 */
#include "fuzz.h"

#include "err.h"
#include "gw_reflect.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the index is read-only after it is built: one for the whole run, as in the daemon */
    static struct gw_reflect *r;
    if (!r && gw_reflect_index_create(&r) != 0)
        abort();
    uint8_t *req = malloc(size ? size : 1); /* exactly size bytes: ASan sees a read past them */
    if (!req)
        return 0;
    memcpy(req, data, size);
    uint8_t *out = NULL;
    size_t out_len = 0;
    char msg[256] = "";
    int rc = gw_reflect_answer(r, req, size, &out, &out_len, msg, sizeof msg);
    if (rc == 0 && (!out || out_len == 0))
        abort(); /* every answer says something, even NOT_FOUND */
    if (rc == ERR_FORMAT && msg[0] == '\0')
        abort(); /* a refusal names what is wrong */
    if (rc != 0 && rc != ERR_FORMAT && rc != -ENOMEM)
        abort();
    free(out);
    free(req);
    return 0;
}
