/*
 * tstream.h — the data section of a GGUF or safetensors file written as one byte stream over
 * the tensors declared before it (private to worker/formats): the caller hands any slicing of
 * the concatenated tensor data; the stream cuts it at tensor boundaries and pads each tensor's
 * start to the file's alignment.
 */
#ifndef CLOCHER_FORMATS_TSTREAM_H
#define CLOCHER_FORMATS_TSTREAM_H

#include "afile.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tstream {
    struct afile *af;
    uint64_t align;     /* each tensor's data starts at a multiple of it in the file (1: packed) */
    const void *tensors; /* the writer's tensor records, `stride` bytes apart */
    size_t stride;
    size_t size_off;    /* offset of the record's uint64_t byte size */
    size_t n_tensors;
    size_t cur;         /* the tensor being written */
    uint64_t cur_done;  /* its bytes written so far */
};

/* Writes buf[0..n) as the next bytes of tensor data. 0; ERR_USAGE (logged, naming `path`)
 * when the bytes run past the declared tensors, nothing of the excess written; or afile's
 * -errno (logged) when the file could not be written, after which the file is broken. */
int tstream_write(struct tstream *s, const char *path, const void *buf, size_t n);

/* Moves past zero-size tensors at the current position; true when every tensor is complete. */
bool tstream_done(struct tstream *s);

#endif
