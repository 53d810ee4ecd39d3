/*
 * check.h — always-on assertions for impossible states.
 *
 * CHECK() stays in release builds: a broken invariant inside the engine is a bug, and aborting
 * with file:line beats computing garbage. Never use it on untrusted bytes (files, requests,
 * shared memory): those are validated and rejected with an error code and a message.
 */
#ifndef CLOCHER_COMMON_CHECK_H
#define CLOCHER_COMMON_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (__builtin_expect(!(cond), 0)) {                                                   \
            fprintf(stderr, "clocher: CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

#define CHECK_EQ(a, b) CHECK((a) == (b))

#endif
