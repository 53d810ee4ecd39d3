/* nametab.c — the format modules' name index (see private/nametab.h). */
#include "nametab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

/* The name of entry i as bytes. */
static void entry_name(const struct nametab *t, const void *entries, size_t stride, uint32_t i,
                       const char **ptr, uint64_t *len)
{
    const char *e = (const char *)entries + (size_t)i * stride;
    if (t->kind == NAMETAB_CSTR) {
        const char *s;
        memcpy(&s, e, sizeof s);
        *ptr = s;
        *len = strlen(s);
    } else {
        struct nametab_str s;
        memcpy(&s, e, sizeof s);
        *ptr = s.ptr;
        *len = s.len;
    }
}

int nametab_init(struct nametab *t, enum nametab_kind kind, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    t->kind = kind;
    t->slots = calloc(cap, sizeof *t->slots);
    if (!t->slots)
        return -ENOMEM;
    t->mask = cap - 1;
    return 0;
}

void nametab_fini(struct nametab *t)
{
    free(t->slots);
    t->slots = NULL;
}

uint32_t *nametab_probe(const struct nametab *t, const void *entries, size_t stride,
                        const char *name, uint64_t len)
{
    for (uint64_t h = hash_bytes(name, len);; h++) {
        uint32_t *slot = &t->slots[h & t->mask];
        if (*slot == 0)
            return slot;
        const char *p;
        uint64_t n;
        entry_name(t, entries, stride, *slot - 1, &p, &n);
        if (n == len && memcmp(p, name, len) == 0)
            return slot;
    }
}

int64_t nametab_insert(struct nametab *t, const void *entries, size_t stride, uint32_t i)
{
    const char *p;
    uint64_t n;
    entry_name(t, entries, stride, i, &p, &n);
    uint32_t *slot = nametab_probe(t, entries, stride, p, n);
    if (*slot != 0)
        return (int64_t)*slot - 1;
    *slot = i + 1;
    return -1;
}

int64_t nametab_find(const struct nametab *t, const void *entries, size_t stride,
                     const char *name)
{
    if (!t->slots)
        return -1;
    uint32_t *slot = nametab_probe(t, entries, stride, name, strlen(name));
    return *slot ? (int64_t)*slot - 1 : -1;
}

int nametab_reserve(struct nametab *t, const void *entries, size_t stride, size_t n_after)
{
    if (t->slots && 2 * (uint64_t)n_after <= t->mask + 1)
        return 0;
    struct nametab nt;
    if (nametab_init(&nt, t->kind, n_after < 8 ? 16 : 2 * (uint64_t)n_after) != 0)
        return -ENOMEM;
    for (size_t i = 0; i + 1 < n_after; i++)
        nametab_insert(&nt, entries, stride, (uint32_t)i);
    nametab_fini(t);
    *t = nt;
    return 0;
}
