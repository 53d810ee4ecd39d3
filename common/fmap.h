/*
 * fmap.h — reading untrusted files whole: a read-only private mapping of a regular file
 * (weights, GGUF, safetensors), or a size-capped read into a NUL-terminated buffer (JSON
 * manifests, configs, tokenizers). Both refuse anything but a regular file — a FIFO or a
 * device would block or never end — and log once, naming the file and what it was meant to be.
 */
#ifndef CLOCHER_COMMON_FMAP_H
#define CLOCHER_COMMON_FMAP_H

#include <stddef.h>

struct fmap {
    void *data;  /* NULL for an empty file */
    size_t size;
};

/* Maps `path` read-only (MAP_PRIVATE). `what` names the file in messages ("GGUF file").
 * 0, -errno (open/fstat/mmap) or ERR_FORMAT (not a regular file). */
int fmap_open(const char *path, const char *what, struct fmap *out);
/* Unmaps; a zeroed or already closed struct is a no-op. */
void fmap_close(struct fmap *m);

/* Reads the whole file into a malloc'd buffer with a NUL after the last byte (*buf, *len).
 * Files over `cap` bytes are refused unread (ERR_RANGE). A file that shrinks while being read
 * yields what was there (the parser will find it truncated). 0 or a negative code. */
int fmap_read(const char *path, const char *what, size_t cap, char **buf, size_t *len);

#endif
