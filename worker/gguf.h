/*
 * gguf.h — GGUF v2/v3 files: a validating reader over a read-only mapping, and a writer.
 *
 * GGUF is untrusted input: every length, count, offset and type read from the file is checked
 * against the bytes that remain before use (huge string lengths, array counts or tensor counts
 * are rejected before any allocation sized by them). Strings point into the mapping and are
 * NOT NUL-terminated. Tensor dimensions are kept in GGUF order (ne[0] is the innermost, the
 * row length); converters reverse them for IEBIN's outermost-first shapes.
 *
 * NOTES: a struct gguf_file is immutable after gguf_open*() and may be shared by threads.
 */
#ifndef CLOCHER_WORKER_GGUF_H
#define CLOCHER_WORKER_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

/* ggml tensor types this project reads (the values are GGUF's). */
enum gguf_ggml_type {
    GGUF_GGML_F32 = 0,
    GGUF_GGML_F16 = 1,
    GGUF_GGML_Q4_0 = 2,
    GGUF_GGML_Q8_0 = 8,
    GGUF_GGML_BF16 = 30,
};

struct gguf_str {
    uint64_t len;
    const char *ptr; /* into the mapping; not NUL-terminated */
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_type type;
    enum gguf_type arr_type;     /* for GGUF_TYPE_ARRAY */
    uint64_t arr_n;              /* element count for arrays */
    const void *data;            /* little-endian payload (for arrays: the first element) */
    const struct gguf_str *strs; /* string arrays: arr_n decoded strings; NULL otherwise */
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];   /* GGUF order: ne[0] innermost */
    uint32_t type;    /* enum gguf_ggml_type value (others are kept but unsupported) */
    uint64_t offset;  /* relative to the data section */
    uint64_t size;    /* bytes, computed from type and ne; 0 when the type is unknown */
    const void *data; /* into the mapping; NULL when the type is unknown */
};

struct gguf_file {
    void *map;
    size_t map_size;
    bool owns_map; /* false for gguf_open_mem */
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t n_tensors;
    struct gguf_tensor *tensors;
    uint64_t alignment;
    const uint8_t *data_base;
};

/* `what` names the source in messages (a path, or "<memory>"). */
int gguf_open(const char *path, struct gguf_file **out);
int gguf_open_mem(const void *buf, size_t size, const char *what, struct gguf_file **out);
void gguf_close(struct gguf_file *f);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);
/* Typed getters: 0, ERR_NOT_FOUND when absent, ERR_FORMAT on a type that does not convert
 * losslessly (any integer type to u32/i64 within range; f32/f64 to double). */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f64(const struct gguf_file *f, const char *key, double *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
/* Element i of a numeric array as double / int64; ERR_RANGE past the end. */
int gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out);
int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out);
/* true when s equals the C string z */
bool gguf_str_eq(struct gguf_str s, const char *z);

/* ---- writing (tests, synth): version 3, alignment 32 ---- */
struct gguf_writer;
int gguf_writer_create(const char *path, struct gguf_writer **out);
int gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_kv_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *v);
int gguf_writer_kv_str_arr(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_kv_f32_arr(struct gguf_writer *w, const char *key, const float *v, uint64_t n);
int gguf_writer_kv_i32_arr(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* ne in GGUF order. The data is copied or referenced until finish (caller keeps it alive). */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t ggml_type,
                           const uint64_t *ne, uint32_t n_dims, const void *data, uint64_t size);
/* Atomic (afile). Frees w whatever the outcome. */
int gguf_writer_finish(struct gguf_writer *w);
void gguf_writer_abort(struct gguf_writer *w);

#endif
