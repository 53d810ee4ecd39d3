/*
 * fuzz_safetensors.c — libFuzzer harness for the safetensors reader (safetensors_open_mem).
 * On inputs it accepts it walks what a converter would: every tensor through the lookup, the
 * first and last byte of its data, its dtype name and size, and the ordering/overlap promise
 * the reader makes (sorted by offset, disjoint), aborting if any of it does not hold.
 */
#include "fuzz.h"

#include "log.h"
#include "safetensors.h"

#include <stdint.h>
#include <stdlib.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct safetensors_file *f = NULL;
    if (safetensors_open_mem(data, size, "<fuzz>", &f) != 0)
        return 0;
    safetensors_metadata(f, "format");
    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        if (safetensors_find(f, t->name) != t)
            abort();
        if (safetensors_dtype_size(t->dtype) == 0 || safetensors_dtype_name(t->dtype)[0] == '?')
            abort();
        if (t->offset + t->size > size)
            abort();
        if (i > 0 && f->tensors[i - 1].offset + f->tensors[i - 1].size > t->offset)
            abort();
        if (t->size) {
            const uint8_t *p = t->data;
            sink += p[0] + p[t->size - 1];
        }
    }
    safetensors_close(f);
    return 0;
}
