/*
 * safetensors.h — Hugging Face safetensors: a validating reader (single files and sharded
 * sets described by model.safetensors.index.json) and a writer.
 *
 * Untrusted input: the 8-byte header length is checked against the file and a 100 MB cap
 * before the JSON is parsed; every tensor's dtype, shape and data_offsets are checked (shape x
 * dtype = byte range, ranges inside the data section, no overlaps) before `data` is exposed.
 *
 * What is accepted, the limits and why: docs/FORMATS.md.
 *
 * NOTES: readers are immutable after open and may be shared by threads. safetensors_open_mem()
 * borrows the caller's buffer: it must outlive the reader. A writer is used by one thread.
 */
#ifndef CLOCHER_WORKER_SAFETENSORS_H
#define CLOCHER_WORKER_SAFETENSORS_H

#include "dtype.h"

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)
#define SAFETENSORS_MAX_DIMS 8

enum safetensors_dtype {
    SAFETENSORS_F32,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_F64,
    SAFETENSORS_I64,
    SAFETENSORS_I32,
    SAFETENSORS_I16,
    SAFETENSORS_I8,
    SAFETENSORS_U8,
    SAFETENSORS_BOOL,
    /* listed so files holding them open; converters refuse them by name */
    SAFETENSORS_U16,
    SAFETENSORS_U32,
    SAFETENSORS_U64,
    SAFETENSORS_F8_E4M3,
    SAFETENSORS_F8_E5M2,
    SAFETENSORS_DTYPE_COUNT_
};

struct safetensors_tensor {
    char *name;                   /* valid UTF-8, non-empty, no control characters */
    enum safetensors_dtype dtype;
    int n_dims;                   /* 0 for a scalar */
    uint64_t shape[SAFETENSORS_MAX_DIMS]; /* outermost first (row-major), as in the file */
    uint64_t size;    /* bytes = product(shape) x dtype size; 0 when a dimension is 0 */
    uint64_t offset;  /* of data, from the start of the file */
    const void *data; /* into the mapping, `size` valid bytes. Only as aligned as the file
                       * makes it (safetensors promises nothing): use memcpy or check. */
};

struct safetensors_file {
    char *path; /* the path, or the `what` given to _open_mem: used in messages */
    void *map;
    size_t map_size;
    int owns_map;
    size_t n_tensors;
    struct safetensors_tensor *tensors; /* sorted by data offset (file order) */
};

/*
 * Opens and validates a file: after 0 every tensor's data lies inside the data section and no
 * two overlap. Errors (logged once, naming the file, the tensor and the field): ERR_FORMAT,
 * ERR_TRUNCATED, ERR_RANGE (header over SAFETENSORS_MAX_HEADER), ERR_OVERFLOW, -errno.
 */
int safetensors_open(const char *path, struct safetensors_file **out);
int safetensors_open_mem(const void *buf, size_t size, const char *what,
                         struct safetensors_file **out);
void safetensors_close(struct safetensors_file *f);
/* O(1) (hash table built at open); NULL when absent. */
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name);
/* A "__metadata__" value (e.g. "format" -> "pt"); NULL when absent. */
const char *safetensors_metadata(const struct safetensors_file *f, const char *key);
/* "F32", "BF16", ...; "?" outside the enum. */
const char *safetensors_dtype_name(enum safetensors_dtype dt);
/* bytes per element (0 outside the enum) */
size_t safetensors_dtype_size(enum safetensors_dtype dt);
/* DT_F32 / DT_F16 / DT_BF16 for F32 / F16 / BF16; ERR_NOT_FOUND for the others (not logged:
 * the caller names the tensor it refuses, with safetensors_dtype_name). */
int safetensors_dtype_to_dtype(enum safetensors_dtype dt, enum dtype *out);

/* A model's weights, looked for in this order: the shards named by
 * dir/model.safetensors.index.json ("weight_map": tensor name -> file name in dir; names with
 * '/' or that are "." or ".." are refused; every mapped tensor must be in its shard and no
 * tensor may appear in two shards), dir/model.safetensors, dir/adapter_model.safetensors.
 * ERR_NOT_FOUND (logged) when none exists. */
struct safetensors_set {
    size_t n_files;
    struct safetensors_file **files;
};
int safetensors_set_open(const char *dir, struct safetensors_set **out);
void safetensors_set_close(struct safetensors_set *s);
const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *s,
                                                      const char *name);

/*
 * ---- writing (synth, tests) ----
 * Tensors are laid out contiguously in the order added; the JSON header is padded with spaces
 * so the data starts at a multiple of 8 bytes (as Hugging Face's writer does). Like the GGUF
 * writer: either give every tensor its data and finish, or add every tensor with data == NULL,
 * call safetensors_writer_stream_begin, feed the bytes in order with
 * safetensors_writer_stream_write (any chunking; nothing is buffered), then finish. Data goes
 * from the caller's buffers straight to write(2). Rule violations return ERR_USAGE (logged)
 * and change nothing; an I/O error fails the writer (ERR_STATE after).
 */
struct safetensors_writer;
int safetensors_writer_create(const char *path, struct safetensors_writer **out);
/* A "__metadata__" entry (string -> string). */
int safetensors_writer_metadata(struct safetensors_writer *w, const char *key,
                                const char *value);
/* data is referenced, not copied: keep it alive until finish (NULL: streamed later).
 * size must equal product(shape) x dtype size. */
int safetensors_writer_add(struct safetensors_writer *w, const char *name,
                           enum safetensors_dtype dt, const uint64_t *shape, int n_dims,
                           const void *data, uint64_t size);
int safetensors_writer_stream_begin(struct safetensors_writer *w);
int safetensors_writer_stream_write(struct safetensors_writer *w, const void *buf, size_t n);
/* Atomic (afile). Frees w whatever the outcome. */
int safetensors_writer_finish(struct safetensors_writer *w);
/* Removes the temporary file and frees w. */
void safetensors_writer_abort(struct safetensors_writer *w);

#endif
