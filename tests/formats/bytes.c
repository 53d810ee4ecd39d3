/* bytes.c — byte builder for hand-made test inputs (see bytes.h). */
#include "bytes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void bytes_put(struct bytes *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "bytes_put: out of memory\n");
            abort();
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
}

void bytes_u8(struct bytes *b, uint8_t v) { bytes_put(b, &v, 1); }
void bytes_u32(struct bytes *b, uint32_t v) { bytes_put(b, &v, 4); }
void bytes_u64(struct bytes *b, uint64_t v) { bytes_put(b, &v, 8); }

void bytes_gstr(struct bytes *b, const char *s)
{
    size_t n = strlen(s);
    bytes_u64(b, n);
    bytes_put(b, s, n);
}

void bytes_pad(struct bytes *b, size_t align)
{
    static const uint8_t zero;
    while (b->len % align)
        bytes_put(b, &zero, 1);
}

void bytes_free(struct bytes *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void bytes_gguf_header(struct bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bytes_put(b, "GGUF", 4);
    bytes_u32(b, version);
    bytes_u64(b, n_tensors);
    bytes_u64(b, n_kv);
}

void bytes_gguf_kv_u32(struct bytes *b, const char *key, uint32_t v)
{
    bytes_gstr(b, key);
    bytes_u32(b, 4 /* GGUF_TYPE_UINT32 */);
    bytes_u32(b, v);
}

void bytes_gguf_tensor(struct bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset)
{
    bytes_gstr(b, name);
    bytes_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        bytes_u64(b, ne[i]);
    bytes_u32(b, type);
    bytes_u64(b, offset);
}
