/*
 * fuzz_gguf.c — libFuzzer harness for the GGUF reader (gguf_open_mem). On inputs it accepts,
 * it also walks everything a consumer would touch: every key through the lookup and the typed
 * getters, every array element, every string byte, every tensor through the lookup and the
 * first and last byte of its data, so a validation gap shows up as an ASan report here rather
 * than in a converter.
 */
#include "fuzz.h"

#include "gguf.h"
#include "log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static volatile uint64_t sink; /* keeps the reads from being optimized away */

static void touch(const void *p, uint64_t n)
{
    if (n == 0)
        return;
    const uint8_t *b = p;
    sink += b[0] + b[n - 1];
}

static void walk_kv(const struct gguf_file *f, const struct gguf_kv *kv)
{
    char key[GGUF_MAX_NAME + 1];
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    if (gguf_find_kv(f, key) != kv)
        abort(); /* keys are unique, so the lookup must find this very entry */
    uint32_t u;
    int64_t i;
    double d;
    bool b;
    struct gguf_str s;
    gguf_get_u32(f, key, &u);
    gguf_get_i64(f, key, &i);
    gguf_get_f64(f, key, &d);
    gguf_get_bool(f, key, &b);
    if (gguf_get_str(f, key, &s) == 0)
        touch(s.ptr, s.len);
    if (kv->type != GGUF_TYPE_ARRAY)
        return;
    if (kv->arr_type == GGUF_TYPE_STRING) {
        for (uint64_t j = 0; j < kv->arr_n; j++)
            touch(kv->strs[j].ptr, kv->strs[j].len);
        return;
    }
    /* the first elements, the last one, and one past the end (which must be ERR_RANGE) */
    for (uint64_t j = 0; j <= kv->arr_n; j++) {
        if (j == 256 && kv->arr_n > 257)
            j = kv->arr_n - 1;
        int rc1 = gguf_arr_f64(kv, j, &d);
        int rc2 = gguf_arr_i64(kv, j, &i);
        if (j == kv->arr_n && (rc1 == 0 || rc2 == 0))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct gguf_file *f = NULL;
    if (gguf_open_mem(data, size, "<fuzz>", &f) != 0)
        return 0;
    for (uint64_t i = 0; i < f->n_kv; i++)
        walk_kv(f, &f->kv[i]);
    char name[GGUF_MAX_NAME + 1];
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        memcpy(name, t->name.ptr, (size_t)t->name.len);
        name[t->name.len] = '\0';
        if (gguf_find_tensor(f, name) != t)
            abort();
        if (t->data)
            touch(t->data, t->size);
        if (!gguf_ggml_type_name(t->type))
            abort();
    }
    gguf_close(f);
    return 0;
}
