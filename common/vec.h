/*
 * vec.h — growth of a plain malloc'd array by doubling, the one step every append-only table
 * (writers' tensor and key lists) repeats.
 */
#ifndef CLOCHER_COMMON_VEC_H
#define CLOCHER_COMMON_VEC_H

#include <stddef.h>
#include <stdlib.h>

/*
 * Makes room for element n (0-based) of an array of *cap elements of `elem` bytes: when
 * n < *cap, returns arr as is; else reallocates to twice *cap (or `first` when empty), stores
 * the new capacity and returns the moved array. NULL when out of memory or the size overflows,
 * with arr still valid and *cap untouched (not logged: the caller names what it was adding).
 */
static inline void *vec_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n < *cap)
        return arr;
    size_t c = *cap ? 2 * *cap : first, bytes;
    if (c <= n || __builtin_mul_overflow(c, elem, &bytes))
        return NULL;
    void *p = realloc(arr, bytes);
    if (p)
        *cap = c;
    return p;
}

#endif
