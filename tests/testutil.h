/*
 * testutil.h — helpers shared by the unit tests: fixture paths, temporary directories, log
 * capture (to assert that an error message names the file/tensor/field), file utilities,
 * deterministic test bytes.
 * Include after <cmocka.h>'s prerequisites (stdarg.h, stddef.h, setjmp.h, stdint.h).
 */
#ifndef CLOCHER_TESTS_TESTUTIL_H
#define CLOCHER_TESTS_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>

/* Absolute path of a fixture ("stories260K/stories260K.bin"); fails the test if missing. */
const char *tu_fixture(const char *rel);
/* A fresh empty directory under $TMPDIR, removed by tu_rmtree. Returned string is malloc'd. */
char *tu_mkdtemp(void);
void tu_rmtree(const char *path);
/* Reads a whole file (malloc'd, NUL-appended). Fails the test on error. */
char *tu_read_file(const char *path, size_t *len);
void tu_write_file(const char *path, const void *buf, size_t len);
/* Path join into a static rotating buffer (valid for a few calls). */
const char *tu_path(const char *dir, const char *name);

/* Log capture: every message logged while active is appended to a buffer. */
void tu_log_capture_begin(void);
/* The captured text (all levels, newline separated); capture stays active. */
const char *tu_log_captured(void);
void tu_log_capture_end(void);
/* Asserts the captured log contains each of the NULL-terminated needles. */
void tu_assert_log_contains(const char *first, ...);

/* Deterministic bytes: n outputs of xorshift32 (common/rng.h) from state x0 (not 0), low byte
 * of each. Tests pass their own x0 (usually derived from a seed) so their data stay the same. */
void tu_fill_bytes(uint8_t *p, size_t n, uint32_t x0);

/* Runs a shell command, returns its exit status (or -1); output captured into *out if non-NULL. */
int tu_run(const char *cmd, char **out);
/* $CLOCHER_BUILD_DIR/<rel>, e.g. tu_build_path("worker/inference-engine"). */
const char *tu_build_path(const char *rel);

#endif
