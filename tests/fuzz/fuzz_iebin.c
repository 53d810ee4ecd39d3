/*
 * fuzz_iebin.c — libFuzzer harness over the IEBIN manifest parser and validation.
 *
 * The input is the manifest (model.ie.json bytes). The blob is an in-memory buffer whose size
 * is the manifest's own blob.size when it parses and is small enough (so the fuzzer reaches the
 * tensor and architecture checks rather than stopping at the size comparison), unless a
 * top-level "fuzz_blob_size" key says otherwise (the reader ignores unknown keys; seeds use it
 * to keep the blob-size paths covered). Validation never
 * reads the blob's contents; after a success the harness touches the first and last byte of
 * every tensor, so a tensor pointing outside the blob is an ASan report, and checks the
 * invariants the rest of the engine relies on. iebin_check_manifest must agree with
 * iebin_open_mem on every input.
 */
#include "fuzz.h"

#include "iebin.h"
#include "log.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_CAP (2u << 20)

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static size_t blob_size_for(const uint8_t *data, size_t size)
{
    size_t n = 4096;
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    json_t *bs = json_object_get(root, "fuzz_blob_size");
    if (!bs)
        bs = json_object_get(json_object_get(root, "blob"), "size");
    if (json_is_integer(bs) && json_integer_value(bs) >= 0 &&
        json_integer_value(bs) <= (json_int_t)BLOB_CAP)
        n = (size_t)json_integer_value(bs);
    json_decref(root);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    size_t blob_len = blob_size_for(data, size);
    uint8_t *blob = malloc(blob_len ? blob_len : 1);
    if (!blob)
        return 0;
    memset(blob, 0xa5, blob_len);

    struct iebin_model *m = NULL;
    int rc = iebin_open_mem("fuzz/model.ie.json", data, size, blob, blob_len, &m);
    int rc2 = iebin_check_manifest("fuzz/model.ie.json", (const char *)data, size, blob_len);
    if (rc != rc2)
        abort();
    if (rc != 0) {
        if (m != NULL || rc > 0)
            abort();
        free(blob);
        return 0;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const struct iebin_tensor *t = &m->tensors[i];
        if (t->size == 0 || t->offset % IEBIN_ALIGN != 0 || t->offset + t->size > blob_len)
            abort();
        if (iebin_find(m, t->name) != t)
            abort();
        const uint8_t *p = t->data;
        sink ^= p[0];
        sink ^= p[t->size - 1];
    }
    if (iebin_check_hparams(&m->hp, "fuzz") != 0)
        abort();
    (void)sink;
    iebin_close(m);
    free(blob);
    return 0;
}
