/*
 * fuzz.h — the one entry point every harness defines (libFuzzer's), declared once so that
 * harnesses and standalone.c agree on it (and -Wmissing-prototypes sees a prototype).
 */
#ifndef CLOCHER_TESTS_FUZZ_H
#define CLOCHER_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Runs the parser under test on data[0..size): must never crash, leak or hang. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
