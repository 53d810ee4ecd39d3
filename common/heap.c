/*
 * heap.c — the binary heap of heap.h: sift-up on push, sift-down on pop, moving a hole rather
 * than swapping so each level costs one copy.
 */
#include "heap.h"

#include "check.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void heap_init(struct heap *h, size_t elem, size_t initial_cap, heap_before_fn *before)
{
    CHECK(elem > 0 && elem <= HEAP_MAX_ELEM);
    h->data = NULL;
    h->n = h->cap = 0;
    h->elem = elem;
    h->initial_cap = initial_cap ? initial_cap : 16;
    h->before = before;
}

void heap_fini(struct heap *h)
{
    free(h->data);
    h->data = NULL;
    h->n = h->cap = 0;
}

static inline unsigned char *at(const struct heap *h, size_t i) { return h->data + i * h->elem; }

int heap_push(struct heap *h, const void *e)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : h->initial_cap;
        if (cap < h->cap || cap > SIZE_MAX / h->elem)
            return -ENOMEM;
        unsigned char *d = realloc(h->data, cap * h->elem);
        if (!d)
            return -ENOMEM;
        h->data = d;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!h->before(e, at(h, parent)))
            break;
        memcpy(at(h, i), at(h, parent), h->elem);
        i = parent;
    }
    memcpy(at(h, i), e, h->elem);
    return 0;
}

bool heap_pop(struct heap *h, void *out)
{
    if (h->n == 0)
        return false;
    memcpy(out, at(h, 0), h->elem);
    size_t n = --h->n;
    if (n == 0)
        return true;
    unsigned char last[HEAP_MAX_ELEM];
    memcpy(last, at(h, n), h->elem);
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h->before(at(h, c + 1), at(h, c)))
            c++;
        if (!h->before(at(h, c), last))
            break;
        memcpy(at(h, i), at(h, c), h->elem);
        i = c;
    }
    memcpy(at(h, i), last, h->elem);
    return true;
}
