/*
 * heap.h — a growable binary min-heap of fixed-size elements ordered by a caller's "before"
 * function (the element that must come out first is the smallest). Used where a priority
 * queue of small structs is needed (the BPE and SentencePiece merge queues); elements are
 * copied in and out, so they must be plain data of at most HEAP_MAX_ELEM bytes.
 */
#ifndef CLOCHER_COMMON_HEAP_H
#define CLOCHER_COMMON_HEAP_H

#include <stdbool.h>
#include <stddef.h>

#define HEAP_MAX_ELEM 64

typedef bool heap_before_fn(const void *a, const void *b);

struct heap {
    unsigned char *data;
    size_t n, cap, elem;
    size_t initial_cap;   /* first allocation, in elements */
    heap_before_fn *before;
};

/* elem ≤ HEAP_MAX_ELEM; nothing is allocated until the first push. */
void heap_init(struct heap *h, size_t elem, size_t initial_cap, heap_before_fn *before);
void heap_fini(struct heap *h);
/* Empties the heap, keeping its memory. */
static inline void heap_clear(struct heap *h) { h->n = 0; }
/* Copies *e in. 0 or -ENOMEM (the heap is unchanged then). */
int heap_push(struct heap *h, const void *e);
/* Copies the first element to *out and removes it; false when empty. */
bool heap_pop(struct heap *h, void *out);

#endif
