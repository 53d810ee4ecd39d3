/*
 * bytes.h — a growable byte buffer for building GGUF/safetensors inputs by hand in tests, so
 * each malformed file is spelled out field by field next to the assertion about it.
 */
#ifndef CLOCHER_TESTS_FORMATS_BYTES_H
#define CLOCHER_TESTS_FORMATS_BYTES_H

#include <stddef.h>
#include <stdint.h>

struct bytes {
    uint8_t *p;
    size_t len, cap;
};

void bytes_put(struct bytes *b, const void *src, size_t n);
void bytes_u8(struct bytes *b, uint8_t v);
void bytes_u32(struct bytes *b, uint32_t v);
void bytes_u64(struct bytes *b, uint64_t v);
/* GGUF string: u64 length then the bytes (no NUL). */
void bytes_gstr(struct bytes *b, const char *s);
/* Zero bytes until len is a multiple of align. */
void bytes_pad(struct bytes *b, size_t align);
void bytes_free(struct bytes *b);

/* GGUF pieces: header; a uint32 key; a tensor info (ne in GGUF order). */
void bytes_gguf_header(struct bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
void bytes_gguf_kv_u32(struct bytes *b, const char *key, uint32_t v);
void bytes_gguf_tensor(struct bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset);

#endif
