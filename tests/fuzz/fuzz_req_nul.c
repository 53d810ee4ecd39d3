/*
 * fuzz_req_nul.c — libFuzzer harness over the gateway's NUL-byte checks of a client's request
 * bytes (daemon/gw_req.c): gw_req_text_nul (one field, or one field of every sub-message) and
 * gw_req_strings_nul (every string at any depth, by the message's descriptor), run on the
 * request types the gateway reads text from.
 *
 * Properties: both read only within the buffer and answer 1, 0 or ERR_FORMAT; a NUL found is
 * named by a non-empty field path; bytes protobuf-c unpacks are never ERR_FORMAT to the walker
 * (else a NUL there would go unseen and be cut silently), and the two agree on the prompt.
 */
#include "fuzz.h"

#include "err.h"
#include "gw_req.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly size bytes: ASan catches a read past them */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    static const ProtobufCMessageDescriptor *const ds[] = {
        &clocher__v1__generate_request__descriptor,
        &clocher__v1__batch_generate_request__descriptor,
        &clocher__v1__tokenize_request__descriptor,
    };
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        char where[256];
        int rc = gw_req_strings_nul(buf, size, ds[k], where, sizeof where);
        if (rc != 0 && rc != 1 && rc != ERR_FORMAT)
            abort();
        if (rc == 1 && !where[0])
            abort();
        ProtobufCMessage *m = protobuf_c_message_unpack(ds[k], NULL, size, buf);
        if (m && rc == ERR_FORMAT)
            abort();
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        /* GenerateRequest.prompt (2): whenever the one-field check sees a NUL, so does the
         * walk, naming it "prompt" */
        if (k == 0 && rc != ERR_FORMAT) {
            int one = gw_req_text_nul(buf, size, 2, 0);
            if (one == 1 && rc != 1)
                abort();
        }
    }
    int b = gw_req_text_nul(buf, size, 1, 2);
    if (b != 0 && b != 1 && b != ERR_FORMAT)
        abort();
    free(buf);
    return 0;
}
