/*
 * gguf.h — GGUF v2/v3 files: a validating reader over a read-only mapping, and a writer.
 *
 * GGUF is untrusted input: every length, count, offset and type read from the file is checked
 * against the bytes that remain before use (huge string lengths, array counts or tensor counts
 * are rejected before any allocation sized by them). Strings point into the mapping and are
 * NOT NUL-terminated. Tensor dimensions are kept in GGUF order (ne[0] is the innermost, the
 * row length); converters reverse them for IEBIN's outermost-first shapes.
 *
 * What is accepted, the limits and why: docs/FORMATS.md.
 *
 * NOTES: a struct gguf_file is immutable after gguf_open*() and may be shared by threads.
 * gguf_open_mem() borrows the caller's buffer: it must outlive the gguf_file. A writer is used
 * by one thread at a time.
 */
#ifndef CLOCHER_WORKER_GGUF_H
#define CLOCHER_WORKER_GGUF_H

#include "dtype.h"

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

/* ggml tensor types this project reads (the values are GGUF's). The reader also lists tensors
 * of the other ggml types (Q4_K, IQ2_XS, ...) with their size but data == NULL, so a converter
 * can refuse them by name (gguf_ggml_type_name); values ggml never defined are malformed. */
enum gguf_ggml_type {
    GGUF_GGML_F32 = 0,
    GGUF_GGML_F16 = 1,
    GGUF_GGML_Q4_0 = 2,
    GGUF_GGML_Q8_0 = 8,
    GGUF_GGML_Q4_K = 12, /* k-quants: block_q4_K / q5_K / q6_K = DT_Q4_K / DT_Q5_K / DT_Q6_K */
    GGUF_GGML_Q5_K = 13,
    GGUF_GGML_Q6_K = 14,
    GGUF_GGML_BF16 = 30,
    GGUF_GGML_MXFP4 = 39, /* gpt-oss experts: block_mxfp4 = DT_MXFP4 */
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1u << 20)   /* general.alignment: a power of two up to 1 MiB */
#define GGUF_MAX_KV (1u << 20)          /* sanity caps, far above any real model */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_NAME 65535             /* bytes in a key or tensor name */
#define GGUF_WRITER_MAX_TENSOR_NAME 63  /* ggml's GGML_MAX_NAME - 1: what llama.cpp can load */

struct gguf_str {
    uint64_t len;
    const char *ptr; /* into the mapping; not NUL-terminated */
};

/* A key-value pair. Payloads point into the mapping and may be unaligned: read them through
 * the getters (or memcpy), never by casting `data` to a wider type. */
struct gguf_kv {
    struct gguf_str key;         /* first member (gguf.c relies on it); printable ASCII */
    enum gguf_type type;
    enum gguf_type arr_type;     /* for GGUF_TYPE_ARRAY (never ARRAY: nested arrays are refused) */
    uint64_t arr_n;              /* element count for arrays */
    const void *data;            /* little-endian payload (for arrays: the first element) */
    const struct gguf_str *strs; /* string arrays: arr_n decoded strings; NULL otherwise */
    struct gguf_str str;         /* GGUF_TYPE_STRING: the value; {0, NULL} otherwise */
};

struct gguf_tensor {
    struct gguf_str name; /* first member (gguf.c relies on it); no control characters */
    uint32_t n_dims;      /* 1..4 */
    uint64_t ne[4];       /* GGUF order: ne[0] innermost (the row); unused entries are 1 */
    uint32_t type;        /* a ggml type; only enum gguf_ggml_type values have data */
    uint64_t offset;      /* relative to the data section; a multiple of the alignment */
    uint64_t size;        /* bytes, computed from type and ne (for every ggml type) */
    const void *data;     /* into the mapping, `size` valid bytes; NULL for types other than
                           * enum gguf_ggml_type's. Aligned to min(alignment, the alignment of
                           * the mapping: a page for gguf_open, the caller's for _open_mem). */
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
    const uint8_t *data_base; /* start of the data section; NULL when it lies past the end
                               * of a file without tensors */
    const char *what;         /* the path or name used in messages */
};

/*
 * Opens and validates a whole file: after 0 every key, string, array and tensor range lies
 * inside the input and all the rules of docs/FORMATS.md hold. Errors (logged, naming the file,
 * the key or tensor and the field): ERR_FORMAT (malformed), ERR_TRUNCATED (runs past the end),
 * ERR_UNSUPPORTED (v1, big-endian, nested arrays), ERR_OVERFLOW, ERR_RANGE, -errno, -ENOMEM.
 * `what` names the source in messages (a path, or "<memory>").
 */
int gguf_open(const char *path, struct gguf_file **out);
int gguf_open_mem(const void *buf, size_t size, const char *what, struct gguf_file **out);
void gguf_close(struct gguf_file *f);

/* "uint32", "string", ... ; "?" for values outside enum gguf_type. */
const char *gguf_type_name(enum gguf_type t);
/* "f32", "q4_K", "iq2_xs", ... for every type ggml defines; NULL otherwise. */
const char *gguf_ggml_type_name(uint32_t ggml_type);
/* true for the types whose data this project reads (enum gguf_ggml_type). */
bool gguf_ggml_type_supported(uint32_t ggml_type);
/* The project's dtype for a supported ggml type (the block layouts are identical); ERR_NOT_FOUND
 * otherwise. Not logged: the caller names the tensor it refuses. */
int gguf_ggml_type_to_dtype(uint32_t ggml_type, enum dtype *out);

/* O(1) lookups (hash tables built at open); NULL when absent. */
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);
/* Typed getters: 0, ERR_NOT_FOUND when absent (not logged: many keys are optional), ERR_FORMAT
 * when the type does not convert (any integer type to u32/i64; f32/f64, or an integer exactly
 * representable, to double; only bool to bool; only string to string), ERR_RANGE when an
 * integer does not fit the target. Mismatches are logged naming the file and key. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f64(const struct gguf_file *f, const char *key, double *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
/* Element i of a numeric array as double (any numeric element type) / int64 (integer and bool
 * elements); ERR_FORMAT for other element types, ERR_RANGE past the end or when a uint64 does
 * not fit int64. Logged, naming the key. */
int gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out);
int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out);
/* true when s equals the C string z */
bool gguf_str_eq(struct gguf_str s, const char *z);

/*
 * ---- writing (tests, synth): version 3, alignment 32 (or the value of a general.alignment
 * key written with gguf_writer_kv_u32) ----
 *
 * Declare keys and tensors, then either
 *  - give every tensor its data in gguf_writer_add_tensor and call gguf_writer_finish, or
 *  - declare every tensor with data == NULL, call gguf_writer_stream_begin (writes the header),
 *    feed the tensors' bytes in declaration order with gguf_writer_stream_write (any chunking:
 *    nothing is kept in memory), then gguf_writer_finish.
 * Tensor data is written straight from the caller's buffers with large write(2)s.
 * Calls that break a rule (duplicate key or tensor, bad shape, size mismatch, wrong order)
 * return ERR_USAGE, are logged and leave the writer unchanged; an I/O error fails the writer
 * (later calls return ERR_STATE) and finish then removes the temporary file.
 */
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
int gguf_writer_kv_u64(struct gguf_writer *w, const char *key, uint64_t v);
/* Copies a key-value pair read by gguf_open* (any type), e.g. to pass metadata through. */
int gguf_writer_kv_copy(struct gguf_writer *w, const struct gguf_kv *kv);
/* ne in GGUF order; ggml_type one of enum gguf_ggml_type; size must equal the computed size.
 * The data is referenced, not copied: keep it alive until finish. NULL = streamed later. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t ggml_type,
                           const uint64_t *ne, uint32_t n_dims, const void *data, uint64_t size);
/* Streaming: writes the header once all keys and tensors are declared. */
int gguf_writer_stream_begin(struct gguf_writer *w);
/* The next n bytes of tensor data, in declaration order, across tensor boundaries. */
int gguf_writer_stream_write(struct gguf_writer *w, const void *buf, size_t n);
/* Atomic (afile). Frees w whatever the outcome. */
int gguf_writer_finish(struct gguf_writer *w);
/* Removes the temporary file and frees w. */
void gguf_writer_abort(struct gguf_writer *w);

#endif
