/*
 * safetensors.h — Hugging Face safetensors: a validating reader (single files and sharded
 * sets described by model.safetensors.index.json) and a writer.
 *
 * Untrusted input: the 8-byte header length is checked against the file and a 100 MB cap
 * before the JSON is parsed; every tensor's dtype, shape and data_offsets are checked (shape x
 * dtype = byte range, ranges inside the data section, no overlaps) before `data` is exposed.
 *
 * NOTES: readers are immutable after open and may be shared by threads.
 */
#ifndef CLOCHER_WORKER_SAFETENSORS_H
#define CLOCHER_WORKER_SAFETENSORS_H

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
};

struct safetensors_tensor {
    char *name;
    enum safetensors_dtype dtype;
    int n_dims; /* 0 for a scalar */
    uint64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t size;    /* bytes */
    const void *data; /* into the mapping */
};

struct safetensors_file {
    char *path;
    void *map;
    size_t map_size;
    int owns_map;
    size_t n_tensors;
    struct safetensors_tensor *tensors;
};

int safetensors_open(const char *path, struct safetensors_file **out);
int safetensors_open_mem(const void *buf, size_t size, const char *what,
                         struct safetensors_file **out);
void safetensors_close(struct safetensors_file *f);
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name);
const char *safetensors_dtype_name(enum safetensors_dtype dt);
/* bytes per element */
size_t safetensors_dtype_size(enum safetensors_dtype dt);

/* A model's weights: dir/model.safetensors, or the shards named by
 * dir/model.safetensors.index.json ("weight_map"), or dir/adapter_model.safetensors. */
struct safetensors_set {
    size_t n_files;
    struct safetensors_file **files;
};
int safetensors_set_open(const char *dir, struct safetensors_set **out);
void safetensors_set_close(struct safetensors_set *s);
const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *s,
                                                      const char *name);

/* ---- writing (synth, tests) ---- */
struct safetensors_writer;
int safetensors_writer_create(const char *path, struct safetensors_writer **out);
/* data is referenced, not copied: keep it alive until finish. */
int safetensors_writer_add(struct safetensors_writer *w, const char *name,
                           enum safetensors_dtype dt, const uint64_t *shape, int n_dims,
                           const void *data, uint64_t size);
/* Atomic (afile). Frees w whatever the outcome. */
int safetensors_writer_finish(struct safetensors_writer *w);
void safetensors_writer_abort(struct safetensors_writer *w);

#endif
