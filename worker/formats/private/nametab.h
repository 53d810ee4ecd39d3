/*
 * nametab.h — the format modules' name index (private to worker/formats): open addressing
 * from a tensor or key name to its position in the caller's array, for O(1) lookups and
 * duplicate checks in the GGUF and safetensors readers and writers.
 *
 * The entries stay in the caller's array, `stride` bytes apart, each starting with its name:
 * a NUL-terminated `char *` (NAMETAB_CSTR, safetensors) or a length-counted
 * struct nametab_str (NAMETAB_COUNTED, GGUF's struct gguf_str, which gguf.c asserts has the
 * same layout). The table holds positions only, so the array may move (realloc) between calls:
 * each call is given its current address.
 */
#ifndef CLOCHER_FORMATS_NAMETAB_H
#define CLOCHER_FORMATS_NAMETAB_H

#include <stddef.h>
#include <stdint.h>

enum nametab_kind { NAMETAB_CSTR, NAMETAB_COUNTED };

struct nametab_str {
    uint64_t len;
    const char *ptr; /* not NUL-terminated */
};

struct nametab {
    uint32_t *slots; /* entry position + 1; 0 = empty; NULL before init */
    uint64_t mask;   /* capacity - 1 (a power of two) */
    enum nametab_kind kind;
};

/* Room for n names at most half full (capacity a power of two, at least 16). 0 or -ENOMEM
 * (not logged: the caller names the file). n <= 2^30. */
int nametab_init(struct nametab *t, enum nametab_kind kind, uint64_t n);
/* Frees the slots; the table reads as empty afterwards. Idempotent. */
void nametab_fini(struct nametab *t);

/* The slot holding name[0..len), or the empty slot where it would go. Initialised table. */
uint32_t *nametab_probe(const struct nametab *t, const void *entries, size_t stride,
                        const char *name, uint64_t len);
/* Indexes entry i; returns the position of an earlier entry with the same name (then entry i
 * is not indexed), or -1. */
int64_t nametab_insert(struct nametab *t, const void *entries, size_t stride, uint32_t i);
/* Position of the entry named `name` (a C string), or -1 (also when never initialised). */
int64_t nametab_find(const struct nametab *t, const void *entries, size_t stride,
                     const char *name);
/* Before appending entry n_after - 1: rebuilds the table, larger, from entries
 * 0..n_after - 2 when it would pass half full (or was never initialised). 0 or -ENOMEM, the
 * table unchanged on failure. */
int nametab_reserve(struct nametab *t, const void *entries, size_t stride, size_t n_after);

#endif
