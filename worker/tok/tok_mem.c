/*
 * tok_mem.c — the large arrays of loading a vocabulary (the JSON reader's element records and
 * string arena, the tokenizer's token, string and hash tables) on transparent huge pages.
 *
 * Why: o200k's tokenizer.json touches ~100 MB of fresh memory while it loads, and on the
 * virtual machines this project runs on a 4 KiB first-touch page fault cost ~25 µs: 40 MB of
 * malloc'd memory took 0.27 s of CPU to touch, the same in 2 MiB-aligned anonymous memory with
 * MADV_HUGEPAGE 0.003 s (docs/TOKENIZER.md "Loading time"). Arrays under 1 MiB, or when the
 * mapping fails, come from malloc; MADV_HUGEPAGE is a hint (4 KiB pages still work when the
 * kernel's transparent huge pages are off).
 *
 * Each block starts with a 64-byte header holding the mapping's length (0: malloc'd), so the
 * caller frees with tok__big_free alone and the returned pointer stays 64-byte aligned.
 */
#include "tok_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HDR 64u
#define HUGE_PAGE ((size_t)2 << 20)
#define MMAP_MIN ((size_t)1 << 20)

void *tok__big_alloc(size_t n)
{
    if (n > SIZE_MAX - HDR - 2 * HUGE_PAGE)
        return NULL;
    size_t len = n + HDR;
    if (len >= MMAP_MIN) {
        size_t map = (len + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        char *m = mmap(NULL, map + HUGE_PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) {
            /* a 2 MiB-aligned start, so every 2 MiB of the block can be one huge page */
            char *base = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
            if (base > m)
                munmap(m, (size_t)(base - m));
            if (m + map + HUGE_PAGE > base + map)
                munmap(base + map, (size_t)(m + map + HUGE_PAGE - (base + map)));
            (void)madvise(base, map, MADV_HUGEPAGE); /* a hint */
            memcpy(base, &map, sizeof map);
            return base + HDR; /* anonymous memory is zeroed */
        }
    }
    char *p = calloc(1, len);
    if (!p)
        return NULL;
    size_t zero = 0;
    memcpy(p, &zero, sizeof zero);
    return p + HDR;
}

void tok__big_free(void *p)
{
    if (!p)
        return;
    char *b = (char *)p - HDR;
    size_t map;
    memcpy(&map, b, sizeof map);
    if (map)
        munmap(b, map);
    else
        free(b);
}

void *tok__big_realloc(void *p, size_t old_n, size_t n)
{
    void *q = tok__big_alloc(n);
    if (!q)
        return NULL;
    if (p)
        memcpy(q, p, old_n < n ? old_n : n);
    tok__big_free(p);
    return q;
}
