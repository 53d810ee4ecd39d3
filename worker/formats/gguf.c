/*
 * gguf.c — GGUF v2/v3 reader and writer (see gguf.h; rules and limits in docs/FORMATS.md).
 *
 * Reader: one forward pass over the bytes with a bounds-checked cursor. Every count is compared
 * with what the remaining bytes could possibly hold before anything is allocated from it, so a
 * hostile header cannot make us allocate more than a small multiple of the input size. Keys and
 * tensor names go into open-addressing hash tables, which also catch duplicates. Tensor ranges
 * are checked against the data section and, sorted by offset, against each other.
 *
 * Writer: keys are serialized into a memory buffer as they are declared (metadata is small);
 * tensors are only declared. The header is written in one write, then each tensor's bytes go
 * from the caller's buffer straight to write(2), with zero padding to the alignment between
 * them. afile.h makes the result appear atomically.
 *
 * NOTES: a gguf_file is immutable after open (lookups only read the tables), so threads may
 * share it. A writer is single-threaded.
 */
#include "gguf.h"

#include "afile.h"
#include "check.h"
#include "err.h"
#include "fmap.h"
#include "log.h"
#include "nametab.h"
#include "tstream.h"
#include "vec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "GGUF payloads are read in place: little-endian hosts only");
_Static_assert(offsetof(struct gguf_kv, key) == 0, "name tables read the key at offset 0");
_Static_assert(offsetof(struct gguf_tensor, name) == 0, "name tables read the name at offset 0");

#define GGUF_HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */
/* Smallest possible encodings, used to bound counts by the bytes that remain. */
#define GGUF_MIN_KV_BYTES (8 + 1 + 4 + 1)             /* key len, 1-byte key, type, u8 value */
#define GGUF_MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8) /* name len, name, n_dims, ne, type, off */

/* ---------------------------------------------------------------------------------------- */
/* type tables                                                                              */

static const struct {
    const char *name;
    uint32_t size; /* bytes of one value; 0 for string and array */
} value_types[] = {
    [GGUF_TYPE_UINT8] = {"uint8", 1},     [GGUF_TYPE_INT8] = {"int8", 1},
    [GGUF_TYPE_UINT16] = {"uint16", 2},   [GGUF_TYPE_INT16] = {"int16", 2},
    [GGUF_TYPE_UINT32] = {"uint32", 4},   [GGUF_TYPE_INT32] = {"int32", 4},
    [GGUF_TYPE_FLOAT32] = {"float32", 4}, [GGUF_TYPE_BOOL] = {"bool", 1},
    [GGUF_TYPE_STRING] = {"string", 0},   [GGUF_TYPE_ARRAY] = {"array", 0},
    [GGUF_TYPE_UINT64] = {"uint64", 8},   [GGUF_TYPE_INT64] = {"int64", 8},
    [GGUF_TYPE_FLOAT64] = {"float64", 8},
};
#define N_VALUE_TYPES (sizeof value_types / sizeof value_types[0])

/* Every type ggml defines (ggml.h enum ggml_type; holes are types removed from GGUF). Sizes
 * let us validate the ranges of tensors we do not read, so a file is accepted or refused as a
 * whole and converters can name what they refuse. */
static const struct {
    const char *name;
    uint32_t block;       /* elements per block */
    uint32_t block_bytes; /* bytes per block */
} ggml_types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},          [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},       [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},       [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},    [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},    [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98},  [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},   [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},          [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},         [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},        [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *gguf_type_name(enum gguf_type t)
{
    return (unsigned)t < N_VALUE_TYPES ? value_types[t].name : "?";
}

const char *gguf_ggml_type_name(uint32_t ggml_type)
{
    return ggml_type < N_GGML_TYPES ? ggml_types[ggml_type].name : NULL;
}

bool gguf_ggml_type_supported(uint32_t t)
{
    return t == GGUF_GGML_F32 || t == GGUF_GGML_F16 || t == GGUF_GGML_BF16 ||
           t == GGUF_GGML_Q8_0 || t == GGUF_GGML_Q4_0 || t == GGUF_GGML_MXFP4 ||
           t == GGUF_GGML_Q4_K || t == GGUF_GGML_Q5_K || t == GGUF_GGML_Q6_K;
}

int gguf_ggml_type_to_dtype(uint32_t ggml_type, enum dtype *out)
{
    switch (ggml_type) {
    case GGUF_GGML_F32: *out = DT_F32; return 0;
    case GGUF_GGML_F16: *out = DT_F16; return 0;
    case GGUF_GGML_BF16: *out = DT_BF16; return 0;
    case GGUF_GGML_Q8_0: *out = DT_Q8_0; return 0;
    case GGUF_GGML_Q4_0: *out = DT_Q4_0; return 0;
    case GGUF_GGML_MXFP4: *out = DT_MXFP4; return 0;
    case GGUF_GGML_Q4_K: *out = DT_Q4_K; return 0; /* the same bytes (kernels/include/quant.h) */
    case GGUF_GGML_Q5_K: *out = DT_Q5_K; return 0;
    case GGUF_GGML_Q6_K: *out = DT_Q6_K; return 0;
    default: return ERR_NOT_FOUND;
    }
}

/* Bytes of a tensor: ne[0] must be whole blocks. 0, ERR_FORMAT (ragged) or ERR_OVERFLOW. */
static int tensor_bytes(uint32_t type, const uint64_t *ne, uint32_t n_dims, uint64_t *out)
{
    uint64_t block = ggml_types[type].block, bytes = ggml_types[type].block_bytes;
    if (ne[0] % block != 0)
        return ERR_FORMAT;
    uint64_t n = ne[0] / block * bytes; /* no overflow: bytes <= block * 8 */
    for (uint32_t i = 1; i < n_dims; i++)
        if (__builtin_mul_overflow(n, ne[i], &n))
            return ERR_OVERFLOW;
    *out = n;
    return 0;
}

static const char *shape_str(const uint64_t *ne, uint32_t n_dims, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n_dims && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRIu64, i ? ", " : "[", ne[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
    return buf;
}

/* name tables (private/nametab.h) over arrays whose elements start with a struct gguf_str */
_Static_assert(sizeof(struct gguf_str) == sizeof(struct nametab_str) &&
                   offsetof(struct gguf_str, len) == offsetof(struct nametab_str, len) &&
                   offsetof(struct gguf_str, ptr) == offsetof(struct nametab_str, ptr),
               "nametab reads GGUF names as struct nametab_str");

/* ---------------------------------------------------------------------------------------- */
/* reader                                                                                   */

/* The file as callers see it, plus what only this module uses. */
struct gguf_file_impl {
    struct gguf_file pub; /* first member: struct gguf_file * converts to and from this */
    char *what;
    struct nametab kv_names, tensor_names;
};

static struct gguf_file_impl *impl_of(const struct gguf_file *f)
{
    return (struct gguf_file_impl *)f;
}

struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *what;
};

__attribute__((format(printf, 4, 0)))
static int vtake(struct cursor *c, uint64_t n, const uint8_t **out, const char *fmt,
                 va_list ap)
{
    if (n > c->size - c->pos) {
        char field[320];
        vsnprintf(field, sizeof field, fmt, ap);
        LOG_ERR("%s: %s at offset %" PRIu64 " needs %" PRIu64 " bytes but only %" PRIu64
                " remain (the file is %" PRIu64 " bytes): truncated or corrupt",
                c->what, field, c->pos, n, c->size - c->pos, c->size);
        return ERR_TRUNCATED;
    }
    *out = c->base + c->pos;
    c->pos += n;
    return 0;
}

/* Takes n bytes, or logs which field (printf-style description) ran past the end. */
__attribute__((format(printf, 4, 5))) static int take(struct cursor *c, uint64_t n,
                                                      const uint8_t **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vtake(c, n, out, fmt, ap);
    va_end(ap);
    return rc;
}

/* Copies an n-byte little-endian scalar into dst (the host is little-endian). */
__attribute__((format(printf, 4, 5))) static int take_copy(struct cursor *c, void *dst, size_t n,
                                                           const char *fmt, ...)
{
    const uint8_t *p;
    va_list ap;
    va_start(ap, fmt);
    int rc = vtake(c, n, &p, fmt, ap);
    va_end(ap);
    if (rc == 0)
        memcpy(dst, p, n);
    return rc;
}

#define TAKE_SCALAR(c, dst, ...) take_copy((c), (dst), sizeof *(dst), __VA_ARGS__)

static uint64_t cursor_left(const struct cursor *c) { return c->size - c->pos; }

/* A string: u64 length then bytes. `field` describes it for messages. */
static int take_str(struct cursor *c, struct gguf_str *out, const char *field)
{
    uint64_t len;
    const uint8_t *p;
    int rc = TAKE_SCALAR(c, &len, "the length of %s", field);
    if (rc == 0)
        rc = take(c, len, &p, "%s (length %" PRIu64 ")", field, len);
    if (rc != 0)
        return rc;
    out->len = len;
    out->ptr = (const char *)p;
    return 0;
}

/* Keys must be printable ASCII (the GGUF spec says ASCII; printable keeps messages sane). */
static int check_key(const struct cursor *c, const struct gguf_str *k, uint64_t index)
{
    if (k->len == 0 || k->len > GGUF_MAX_NAME) {
        LOG_ERR("%s: key #%" PRIu64 ": length %" PRIu64 " is outside 1..%u", c->what, index,
                k->len, GGUF_MAX_NAME);
        return ERR_FORMAT;
    }
    for (uint64_t i = 0; i < k->len; i++) {
        unsigned char ch = (unsigned char)k->ptr[i];
        if (ch < 0x20 || ch > 0x7e) {
            LOG_ERR("%s: key #%" PRIu64 ": byte %" PRIu64 " (0x%02x) is not printable ASCII",
                    c->what, index, i, ch);
            return ERR_FORMAT;
        }
    }
    return 0;
}

/* Tensor names may be UTF-8 but never hold control characters or NUL (lookups use C strings). */
static int check_tensor_name(const struct cursor *c, const struct gguf_str *n, uint64_t index)
{
    if (n->len == 0 || n->len > GGUF_MAX_NAME) {
        LOG_ERR("%s: tensor #%" PRIu64 ": name length %" PRIu64 " is outside 1..%u", c->what,
                index, n->len, GGUF_MAX_NAME);
        return ERR_FORMAT;
    }
    for (uint64_t i = 0; i < n->len; i++) {
        unsigned char ch = (unsigned char)n->ptr[i];
        if (ch < 0x20 || ch == 0x7f) {
            LOG_ERR("%s: tensor #%" PRIu64 ": name byte %" PRIu64 " is control character 0x%02x",
                    c->what, index, i, ch);
            return ERR_FORMAT;
        }
    }
    return 0;
}

static int check_value_type(const struct cursor *c, const struct gguf_str *key, uint32_t t,
                            const char *role)
{
    if (t >= N_VALUE_TYPES) {
        LOG_ERR("%s: key '%.*s': unknown %s type %" PRIu32 " (GGUF defines 0..%zu)", c->what,
                (int)key->len, key->ptr, role, t, N_VALUE_TYPES - 1);
        return ERR_FORMAT;
    }
    return 0;
}

static int check_bools(const struct cursor *c, const struct gguf_str *key, const uint8_t *p,
                       uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] > 1) {
            LOG_ERR("%s: key '%.*s': bool %" PRIu64 " has value %u (must be 0 or 1)", c->what,
                    (int)key->len, key->ptr, i, p[i]);
            return ERR_FORMAT;
        }
    }
    return 0;
}

static int parse_array(struct cursor *c, struct gguf_kv *kv)
{
    const struct gguf_str *key = &kv->key;
    uint32_t at;
    int rc = TAKE_SCALAR(c, &at, "key '%.*s': array element type", (int)key->len, key->ptr);
    if (rc == 0)
        rc = check_value_type(c, key, at, "array element");
    if (rc != 0)
        return rc;
    if (at == GGUF_TYPE_ARRAY) {
        LOG_ERR("%s: key '%.*s': arrays of arrays are not supported", c->what, (int)key->len,
                key->ptr);
        return ERR_UNSUPPORTED;
    }
    kv->arr_type = (enum gguf_type)at;
    rc = TAKE_SCALAR(c, &kv->arr_n, "key '%.*s': array length", (int)key->len, key->ptr);
    if (rc != 0)
        return rc;
    uint64_t n = kv->arr_n, left = cursor_left(c);
    kv->data = c->base + c->pos;

    if (at == GGUF_TYPE_STRING) {
        /* each string takes at least its 8-byte length: bound n before allocating n entries */
        if (n > left / 8) {
            LOG_ERR("%s: key '%.*s': array of %" PRIu64 " strings cannot fit in the %" PRIu64
                    " bytes that remain (each needs at least 8)",
                    c->what, (int)key->len, key->ptr, n, left);
            return ERR_TRUNCATED;
        }
        struct gguf_str *strs = malloc(n ? n * sizeof *strs : 1);
        if (!strs) {
            LOG_ERR("%s: key '%.*s': out of memory for %" PRIu64 " strings", c->what,
                    (int)key->len, key->ptr, n);
            return -ENOMEM;
        }
        kv->strs = strs;
        char field[96];
        for (uint64_t i = 0; i < n; i++) {
            /* the field text is only needed on failure, but building it is cheap next to the
             * parse and keeps messages exact ("key 'tokenizer.ggml.tokens' string 31999") */
            uint64_t len;
            if (sizeof len <= cursor_left(c)) {
                memcpy(&len, c->base + c->pos, sizeof len);
                if (len <= cursor_left(c) - sizeof len) {
                    strs[i].len = len;
                    strs[i].ptr = (const char *)c->base + c->pos + sizeof len;
                    c->pos += sizeof len + len;
                    continue;
                }
            }
            snprintf(field, sizeof field, "key '%.*s' string %" PRIu64,
                     (int)(key->len > 48 ? 48 : key->len), key->ptr, i);
            return take_str(c, &strs[i], field);
        }
        return 0;
    }

    uint64_t esz = value_types[at].size;
    if (n > left / esz) {
        LOG_ERR("%s: key '%.*s': array of %" PRIu64 " %s values (%u bytes each) cannot fit in "
                "the %" PRIu64 " bytes that remain",
                c->what, (int)key->len, key->ptr, n, value_types[at].name, (unsigned)esz, left);
        return ERR_TRUNCATED;
    }
    const uint8_t *p;
    rc = take(c, n * esz, &p, "key '%.*s': array data", (int)key->len, key->ptr);
    if (rc == 0 && at == GGUF_TYPE_BOOL)
        rc = check_bools(c, key, p, n);
    return rc;
}

static int parse_kv(struct cursor *c, struct gguf_kv *kv, uint64_t index)
{
    char field[64];
    snprintf(field, sizeof field, "key #%" PRIu64, index);
    int rc = take_str(c, &kv->key, field);
    if (rc == 0)
        rc = check_key(c, &kv->key, index);
    if (rc != 0)
        return rc;
    const struct gguf_str *key = &kv->key;
    uint32_t t;
    rc = TAKE_SCALAR(c, &t, "key '%.*s': value type", (int)key->len, key->ptr);
    if (rc == 0)
        rc = check_value_type(c, key, t, "value");
    if (rc != 0)
        return rc;
    kv->type = (enum gguf_type)t;
    if (t == GGUF_TYPE_ARRAY)
        return parse_array(c, kv);
    kv->data = c->base + c->pos;
    if (t == GGUF_TYPE_STRING) {
        snprintf(field, sizeof field, "the value of key '%.*s'",
                 (int)(key->len > 40 ? 40 : key->len), key->ptr);
        return take_str(c, &kv->str, field);
    }
    const uint8_t *p;
    rc = take(c, value_types[t].size, &p, "key '%.*s': %s value", (int)key->len, key->ptr,
              value_types[t].name);
    if (rc == 0 && t == GGUF_TYPE_BOOL)
        rc = check_bools(c, key, p, 1);
    return rc;
}

static int parse_alignment(struct gguf_file_impl *fi)
{
    struct gguf_file *f = &fi->pub;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv)
        return 0;
    if (kv->type != GGUF_TYPE_UINT32) {
        LOG_ERR("%s: key 'general.alignment' has type %s, expected uint32", f->what,
                gguf_type_name(kv->type));
        return ERR_FORMAT;
    }
    uint32_t a;
    memcpy(&a, kv->data, sizeof a);
    if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT) {
        LOG_ERR("%s: key 'general.alignment': %" PRIu32 " is not a power of two in 1..%u",
                f->what, a, GGUF_MAX_ALIGNMENT);
        return ERR_FORMAT;
    }
    f->alignment = a;
    return 0;
}

static int parse_tensor_info(struct cursor *c, struct gguf_tensor *t, uint64_t index,
                             uint64_t alignment)
{
    char field[64];
    snprintf(field, sizeof field, "the name of tensor #%" PRIu64, index);
    int rc = take_str(c, &t->name, field);
    if (rc == 0)
        rc = check_tensor_name(c, &t->name, index);
    if (rc != 0)
        return rc;
    int nl = (int)t->name.len;
    const char *np = t->name.ptr;
    rc = TAKE_SCALAR(c, &t->n_dims, "tensor '%.*s': n_dims", nl, np);
    if (rc != 0)
        return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        LOG_ERR("%s: tensor '%.*s': n_dims %" PRIu32 " is outside 1..%d", c->what, nl, np,
                t->n_dims, GGUF_MAX_DIMS);
        return ERR_FORMAT;
    }
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        rc = TAKE_SCALAR(c, &t->ne[d], "tensor '%.*s': ne[%" PRIu32 "]", nl, np, d);
        if (rc != 0)
            return rc;
        if (t->ne[d] == 0) {
            LOG_ERR("%s: tensor '%.*s': dimension ne[%" PRIu32 "] is 0", c->what, nl, np, d);
            return ERR_FORMAT;
        }
    }
    rc = TAKE_SCALAR(c, &t->type, "tensor '%.*s': type", nl, np);
    if (rc == 0)
        rc = TAKE_SCALAR(c, &t->offset, "tensor '%.*s': offset", nl, np);
    if (rc != 0)
        return rc;
    if (!gguf_ggml_type_name(t->type)) {
        LOG_ERR("%s: tensor '%.*s': unknown ggml type %" PRIu32, c->what, nl, np, t->type);
        return ERR_FORMAT;
    }
    char shape[128];
    rc = tensor_bytes(t->type, t->ne, t->n_dims, &t->size);
    if (rc == ERR_FORMAT) {
        LOG_ERR("%s: tensor '%.*s': row length ne[0] = %" PRIu64 " is not a multiple of the "
                "%s block size %" PRIu32,
                c->what, nl, np, t->ne[0], ggml_types[t->type].name, ggml_types[t->type].block);
        return rc;
    }
    if (rc != 0) {
        LOG_ERR("%s: tensor '%.*s': the byte size of shape %s of %s overflows 64 bits", c->what,
                nl, np, shape_str(t->ne, t->n_dims, shape, sizeof shape),
                ggml_types[t->type].name);
        return rc;
    }
    if (t->offset % alignment != 0) {
        LOG_ERR("%s: tensor '%.*s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                c->what, nl, np, t->offset, alignment);
        return ERR_FORMAT;
    }
    return 0;
}

struct range {
    uint64_t begin, end;
    uint64_t index;
};

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Every tensor's range inside the data section, and no two sharing a byte. */
static int check_tensor_ranges(struct gguf_file *f, uint64_t data_off)
{
    uint64_t n = f->n_tensors;
    uint64_t data_size = data_off <= f->map_size ? f->map_size - data_off : 0;
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t end;
        if (__builtin_add_overflow(t->offset, t->size, &end) || end > data_size) {
            LOG_ERR("%s: tensor '%.*s': offset %" PRIu64 " + size %" PRIu64 " is beyond the end "
                    "of the file (%zu bytes, data section of %" PRIu64 " bytes at offset %" PRIu64
                    ")",
                    f->what, (int)t->name.len, t->name.ptr, t->offset, t->size, f->map_size,
                    data_size, data_off);
            return ERR_TRUNCATED;
        }
    }
    if (n < 2)
        return 0;
    struct range *r = malloc(n * sizeof *r);
    if (!r) {
        LOG_ERR("%s: out of memory checking %" PRIu64 " tensor ranges", f->what, n);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < n; i++)
        r[i] = (struct range){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].size, i};
    qsort(r, n, sizeof *r, cmp_range);
    int rc = 0;
    for (uint64_t i = 1; i < n; i++) {
        if (r[i].begin < r[i - 1].end) {
            const struct gguf_tensor *a = &f->tensors[r[i - 1].index], *b = &f->tensors[r[i].index];
            /* sizes come from type and shape: say which, so a writer that laid a tensor out
             * with too few bytes (a wrong block size) sees what was expected */
            char shape[128];
            LOG_ERR("%s: tensor '%.*s' (bytes %" PRIu64 "..%" PRIu64 ") overlaps tensor '%.*s' "
                    "(bytes %" PRIu64 "..%" PRIu64 ": %" PRIu64 " bytes for %s of shape %s) in "
                    "the data section",
                    f->what, (int)b->name.len, b->name.ptr, r[i].begin, r[i].end,
                    (int)a->name.len, a->name.ptr, r[i - 1].begin, r[i - 1].end, a->size,
                    ggml_types[a->type].name, shape_str(a->ne, a->n_dims, shape, sizeof shape));
            rc = ERR_FORMAT;
            break;
        }
    }
    free(r);
    return rc;
}

static int check_header(struct cursor *c, struct gguf_file *f)
{
    const uint8_t *magic;
    int rc = take(c, 4, &magic, "the magic");
    if (rc != 0)
        return rc;
    if (memcmp(magic, "GGUF", 4) != 0) {
        LOG_ERR("%s: not a GGUF file: magic is %02x %02x %02x %02x, expected \"GGUF\"", c->what,
                magic[0], magic[1], magic[2], magic[3]);
        return ERR_FORMAT;
    }
    rc = TAKE_SCALAR(c, &f->version, "the version");
    if (rc != 0)
        return rc;
    uint32_t v = f->version;
    if ((v & 0xffff) == 0 && v != 0) {
        LOG_ERR("%s: big-endian GGUF (version %" PRIu32 " byte-swapped) is not supported",
                c->what, __builtin_bswap32(v));
        return ERR_UNSUPPORTED;
    }
    if (v == 1) {
        LOG_ERR("%s: GGUF version 1 is not supported (only v2 and v3; re-convert the model with "
                "a current llama.cpp)",
                c->what);
        return ERR_UNSUPPORTED;
    }
    if (v != 2 && v != 3) {
        LOG_ERR("%s: GGUF version %" PRIu32 " is not supported (only v2 and v3)", c->what, v);
        return ERR_UNSUPPORTED;
    }
    rc = TAKE_SCALAR(c, &f->n_tensors, "n_tensors");
    if (rc == 0)
        rc = TAKE_SCALAR(c, &f->n_kv, "n_kv");
    if (rc != 0)
        return rc;
    uint64_t left = cursor_left(c);
    if (f->n_kv > GGUF_MAX_KV || f->n_kv > left / GGUF_MIN_KV_BYTES) {
        LOG_ERR("%s: n_kv %" PRIu64 " is impossible: the %" PRIu64 " bytes after the header hold "
                "at most %" PRIu64 " key-value pairs (limit %u)",
                c->what, f->n_kv, left, left / GGUF_MIN_KV_BYTES, GGUF_MAX_KV);
        return ERR_FORMAT;
    }
    if (f->n_tensors > GGUF_MAX_TENSORS || f->n_tensors > left / GGUF_MIN_TENSOR_BYTES) {
        LOG_ERR("%s: n_tensors %" PRIu64 " is impossible: the %" PRIu64 " bytes after the header "
                "hold at most %" PRIu64 " tensor infos (limit %u)",
                c->what, f->n_tensors, left, left / GGUF_MIN_TENSOR_BYTES, GGUF_MAX_TENSORS);
        return ERR_FORMAT;
    }
    return 0;
}

static int parse(struct gguf_file_impl *fi)
{
    struct gguf_file *f = &fi->pub;
    struct cursor c = {f->map, f->map_size, 0, f->what};
    int rc = check_header(&c, f);
    if (rc != 0)
        return rc;

    /* key-value pairs */
    if (f->n_kv > 0) {
        f->kv = calloc(f->n_kv, sizeof *f->kv);
        if (!f->kv)
            goto oom;
    }
    rc = nametab_init(&fi->kv_names, NAMETAB_COUNTED, f->n_kv);
    if (rc != 0)
        goto oom;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        rc = parse_kv(&c, &f->kv[i], i);
        if (rc != 0)
            return rc;
        int64_t dup = nametab_insert(&fi->kv_names, f->kv, sizeof *f->kv, (uint32_t)i);
        if (dup >= 0) {
            LOG_ERR("%s: duplicate key '%.*s' (key #%" PRId64 " and key #%" PRIu64 ")", f->what,
                    (int)f->kv[i].key.len, f->kv[i].key.ptr, dup, i);
            return ERR_FORMAT;
        }
    }
    rc = parse_alignment(fi);
    if (rc != 0)
        return rc;

    /* tensor infos: re-bound the count by what is really left now */
    uint64_t left = cursor_left(&c);
    if (f->n_tensors > left / GGUF_MIN_TENSOR_BYTES) {
        LOG_ERR("%s: n_tensors %" PRIu64 " is impossible: the %" PRIu64 " bytes after the "
                "key-value pairs hold at most %" PRIu64 " tensor infos",
                f->what, f->n_tensors, left, left / GGUF_MIN_TENSOR_BYTES);
        return ERR_FORMAT;
    }
    if (f->n_tensors > 0) {
        f->tensors = calloc(f->n_tensors, sizeof *f->tensors);
        if (!f->tensors)
            goto oom;
    }
    rc = nametab_init(&fi->tensor_names, NAMETAB_COUNTED, f->n_tensors);
    if (rc != 0)
        goto oom;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        rc = parse_tensor_info(&c, t, i, f->alignment);
        if (rc != 0)
            return rc;
        int64_t dup = nametab_insert(&fi->tensor_names, f->tensors, sizeof *t, (uint32_t)i);
        if (dup >= 0) {
            LOG_ERR("%s: duplicate tensor name '%.*s' (tensors #%" PRId64 " and #%" PRIu64 ")",
                    f->what, (int)t->name.len, t->name.ptr, dup, i);
            return ERR_FORMAT;
        }
    }

    /* data section: the next multiple of the alignment (c.pos <= size < 2^63: no overflow) */
    uint64_t data_off = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    rc = check_tensor_ranges(f, data_off);
    if (rc != 0)
        return rc;
    f->data_base = data_off <= f->map_size ? (const uint8_t *)f->map + data_off : NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (gguf_ggml_type_supported(t->type))
            t->data = f->data_base + t->offset;
    }
    return 0;
oom:
    LOG_ERR("%s: out of memory for %" PRIu64 " keys and %" PRIu64 " tensors", f->what, f->n_kv,
            f->n_tensors);
    return -ENOMEM;
}

static int open_common(void *map, size_t size, bool owns_map, const char *what,
                       struct gguf_file **out)
{
    *out = NULL;
    struct gguf_file_impl *fi = calloc(1, sizeof *fi);
    char *name = strdup(what ? what : "<memory>");
    if (!fi || !name) {
        free(fi);
        free(name);
        if (owns_map && size > 0)
            munmap(map, size);
        LOG_ERR("%s: out of memory", what ? what : "<memory>");
        return -ENOMEM;
    }
    fi->what = name;
    fi->pub.what = name;
    fi->pub.map = map;
    fi->pub.map_size = size;
    fi->pub.owns_map = owns_map;
    int rc = parse(fi);
    if (rc != 0) {
        gguf_close(&fi->pub);
        return rc;
    }
    *out = &fi->pub;
    return 0;
}

int gguf_open_mem(const void *buf, size_t size, const char *what, struct gguf_file **out)
{
    return open_common((void *)buf, size, false, what, out);
}

int gguf_open(const char *path, struct gguf_file **out)
{
    *out = NULL;
    struct fmap fm;
    int rc = fmap_open(path, "GGUF file", &fm);
    if (rc != 0)
        return rc;
    return open_common(fm.data, fm.size, true, path, out);
}

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    struct gguf_file_impl *fi = impl_of(f);
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++)
            free((void *)f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    nametab_fini(&fi->kv_names);
    nametab_fini(&fi->tensor_names);
    if (f->owns_map && f->map_size > 0)
        munmap(f->map, f->map_size);
    free(fi->what);
    free(fi);
}

/* ---------------------------------------------------------------------------------------- */
/* lookups and getters                                                                      */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key)
{
    const struct gguf_file_impl *fi = impl_of(f);
    int64_t i = nametab_find(&fi->kv_names, f->kv, sizeof *f->kv, key);
    return i >= 0 ? &f->kv[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    const struct gguf_file_impl *fi = impl_of(f);
    int64_t i = nametab_find(&fi->tensor_names, f->tensors, sizeof *f->tensors, name);
    return i >= 0 ? &f->tensors[i] : NULL;
}

bool gguf_str_eq(struct gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && memcmp(s.ptr, z, n) == 0;
}

/* An integer (or bool) of type t at p as sign + magnitude; false for other types. */
static bool load_int(enum gguf_type t, const void *p, bool *neg, uint64_t *mag)
{
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    int8_t i8;
    int16_t i16;
    int32_t i32;
    int64_t s;
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_BOOL:
        memcpy(&u8, p, 1);
        u64 = u8;
        break;
    case GGUF_TYPE_UINT16:
        memcpy(&u16, p, 2);
        u64 = u16;
        break;
    case GGUF_TYPE_UINT32:
        memcpy(&u32, p, 4);
        u64 = u32;
        break;
    case GGUF_TYPE_UINT64:
        memcpy(&u64, p, 8);
        break;
    case GGUF_TYPE_INT8:
        memcpy(&i8, p, 1);
        s = i8;
        goto signed_;
    case GGUF_TYPE_INT16:
        memcpy(&i16, p, 2);
        s = i16;
        goto signed_;
    case GGUF_TYPE_INT32:
        memcpy(&i32, p, 4);
        s = i32;
        goto signed_;
    case GGUF_TYPE_INT64:
        memcpy(&s, p, 8);
        goto signed_;
    default:
        return false;
    }
    *neg = false;
    *mag = u64;
    return true;
signed_:
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return true;
}

static bool load_float(enum gguf_type t, const void *p, double *out)
{
    if (t == GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return true;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    return false;
}

static int mismatch(const struct gguf_file *f, const struct gguf_kv *kv, const char *expected)
{
    LOG_ERR("%s: key '%.*s' has type %s, expected %s", f->what, (int)kv->key.len, kv->key.ptr,
            kv->type == GGUF_TYPE_ARRAY ? "array" : gguf_type_name(kv->type), expected);
    return ERR_FORMAT;
}

static int get_int(const struct gguf_file *f, const char *key, const struct gguf_kv **kvp,
                   bool *neg, uint64_t *mag)
{
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *kvp = kv;
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type == GGUF_TYPE_BOOL || !load_int(kv->type, kv->data, neg, mag))
        return mismatch(f, kv, "an integer");
    return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv;
    bool neg;
    uint64_t mag;
    int rc = get_int(f, key, &kv, &neg, &mag);
    if (rc != 0)
        return rc;
    if (neg || mag > UINT32_MAX) {
        LOG_ERR("%s: key '%s' = %s%" PRIu64 " does not fit uint32", f->what, key, neg ? "-" : "",
                mag);
        return ERR_RANGE;
    }
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct gguf_kv *kv;
    bool neg;
    uint64_t mag;
    int rc = get_int(f, key, &kv, &neg, &mag);
    if (rc != 0)
        return rc;
    if (!neg && mag > INT64_MAX) {
        LOG_ERR("%s: key '%s' = %" PRIu64 " does not fit int64", f->what, key, mag);
        return ERR_RANGE;
    }
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag; /* 0 - mag wraps to the two's complement */
    return 0;
}

int gguf_get_f64(const struct gguf_file *f, const char *key, double *out)
{
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (load_float(kv->type, kv->data, out))
        return 0;
    bool neg;
    uint64_t mag;
    if (kv->type != GGUF_TYPE_BOOL && load_int(kv->type, kv->data, &neg, &mag)) {
        if (mag > (1ull << 53)) {
            LOG_ERR("%s: key '%s' = %s%" PRIu64 " is not exactly representable as a double",
                    f->what, key, neg ? "-" : "", mag);
            return ERR_RANGE;
        }
        *out = neg ? -(double)mag : (double)mag;
        return 0;
    }
    return mismatch(f, kv, "a number");
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_BOOL)
        return mismatch(f, kv, "bool");
    *out = *(const uint8_t *)kv->data != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_STRING)
        return mismatch(f, kv, "string");
    *out = kv->str;
    return 0;
}

static int arr_elem(const struct gguf_kv *kv, uint64_t i, const void **p)
{
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type == GGUF_TYPE_STRING) {
        LOG_ERR("key '%.*s' is %s%s, not a numeric array", (int)kv->key.len, kv->key.ptr,
                kv->type == GGUF_TYPE_ARRAY ? "an array of " : "a ",
                gguf_type_name(kv->type == GGUF_TYPE_ARRAY ? kv->arr_type : kv->type));
        return ERR_FORMAT;
    }
    if (i >= kv->arr_n) {
        LOG_ERR("key '%.*s': index %" PRIu64 " is past the end of the array (%" PRIu64
                " elements)",
                (int)kv->key.len, kv->key.ptr, i, kv->arr_n);
        return ERR_RANGE;
    }
    *p = (const uint8_t *)kv->data + i * value_types[kv->arr_type].size;
    return 0;
}

int gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out)
{
    const void *p;
    int rc = arr_elem(kv, i, &p);
    if (rc != 0)
        return rc;
    if (load_float(kv->arr_type, p, out))
        return 0;
    bool neg;
    uint64_t mag;
    if (load_int(kv->arr_type, p, &neg, &mag)) {
        *out = neg ? -(double)mag : (double)mag;
        return 0;
    }
    CHECK(false); /* arr_elem let through only numeric element types */
    return ERR_FORMAT;
}

int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out)
{
    const void *p;
    int rc = arr_elem(kv, i, &p);
    if (rc != 0)
        return rc;
    bool neg;
    uint64_t mag;
    if (!load_int(kv->arr_type, p, &neg, &mag)) {
        LOG_ERR("key '%.*s' is an array of %s, not of integers", (int)kv->key.len, kv->key.ptr,
                gguf_type_name(kv->arr_type));
        return ERR_FORMAT;
    }
    if (!neg && mag > INT64_MAX) {
        LOG_ERR("key '%.*s': element %" PRIu64 " = %" PRIu64 " does not fit int64",
                (int)kv->key.len, kv->key.ptr, i, mag);
        return ERR_RANGE;
    }
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* writer                                                                                   */

struct buf {
    uint8_t *p;
    size_t len, cap;
    bool oom; /* sticky: checked once before the buffer is used */
};

static void buf_put(struct buf *b, const void *src, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void buf_u32(struct buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(struct buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void buf_str(struct buf *b, const char *s, uint64_t n)
{
    buf_u64(b, n);
    buf_put(b, s, (size_t)n);
}

struct wtensor {
    struct gguf_str name; /* first member, for the name table; ptr is an owned copy */
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    const void *data;
    uint64_t size;
    uint64_t offset;
};

enum wstate { W_DECLARING, W_STREAMING, W_FAILED };

struct gguf_writer {
    struct afile af;
    enum wstate state;
    uint32_t alignment;
    struct buf kv; /* serialized key-value pairs */
    uint64_t n_kv;
    struct gguf_str *keys; /* owned copies, for duplicates */
    size_t keys_cap;
    struct nametab key_names;
    struct wtensor *tensors;
    size_t n_tensors, tensors_cap;
    struct nametab tensor_names;
    struct tstream ts; /* streaming */
};

static const char *wpath(const struct gguf_writer *w) { return w->af.final_path; }

/* Names entry n (already stored in `entries`, n not yet counted): a copy of name[0..len) into
 * *slot, then indexed. 0 or -ENOMEM (not logged: the caller names what it was adding). */
static int append_name(struct nametab *t, const void *entries, size_t stride, size_t n,
                             struct gguf_str *slot, const char *name, size_t len)
{
    char *copy = strdup(name);
    if (!copy)
        return -ENOMEM;
    *slot = (struct gguf_str){len, copy};
    if (nametab_reserve(t, entries, stride, n + 1) != 0) {
        free(copy);
        return -ENOMEM;
    }
    nametab_insert(t, entries, stride, (uint32_t)n);
    return 0;
}

int gguf_writer_create(const char *path, struct gguf_writer **out)
{
    *out = NULL;
    struct gguf_writer *w = calloc(1, sizeof *w);
    if (!w) {
        LOG_ERR("%s: out of memory", path);
        return -ENOMEM;
    }
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    w->key_names.kind = w->tensor_names.kind = NAMETAB_COUNTED; /* read before their init */
    int rc = afile_open(&w->af, path);
    if (rc != 0) {
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static int check_declaring(struct gguf_writer *w, const char *op)
{
    if (w->state == W_FAILED) {
        LOG_ERR("%s: %s after an earlier failure", wpath(w), op);
        return ERR_STATE;
    }
    if (w->state != W_DECLARING) {
        LOG_ERR("%s: %s after gguf_writer_stream_begin: declare everything first", wpath(w), op);
        return ERR_USAGE;
    }
    return 0;
}

/* Validates a new key and records it; the caller then serializes type and value. */
static int begin_kv(struct gguf_writer *w, const char *key)
{
    int rc = check_declaring(w, "adding a key");
    if (rc != 0)
        return rc;
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n > GGUF_MAX_NAME) {
        LOG_ERR("%s: key length %zu is outside 1..%u", wpath(w), n, GGUF_MAX_NAME);
        return ERR_USAGE;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e) {
            LOG_ERR("%s: key '%s' is not printable ASCII", wpath(w), key);
            return ERR_USAGE;
        }
    }
    if (nametab_find(&w->key_names, w->keys, sizeof *w->keys, key) >= 0) {
        LOG_ERR("%s: duplicate key '%s'", wpath(w), key);
        return ERR_USAGE;
    }
    if (w->n_kv >= GGUF_MAX_KV) {
        LOG_ERR("%s: more than %u keys", wpath(w), GGUF_MAX_KV);
        return ERR_USAGE;
    }
    struct gguf_str *k = vec_grow(w->keys, &w->keys_cap, w->n_kv, sizeof *k, 32);
    if (!k)
        goto oom;
    w->keys = k;
    if (append_name(&w->key_names, w->keys, sizeof *w->keys, w->n_kv, &w->keys[w->n_kv],
                          key, n) != 0)
        goto oom;
    w->n_kv++;
    buf_str(&w->kv, key, n);
    return 0;
oom:
    LOG_ERR("%s: out of memory adding key '%s'", wpath(w), key);
    return -ENOMEM;
}

int gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    if (key && strcmp(key, "general.alignment") == 0 &&
        (v == 0 || (v & (v - 1)) != 0 || v > GGUF_MAX_ALIGNMENT)) {
        LOG_ERR("%s: general.alignment %" PRIu32 " is not a power of two in 1..%u", wpath(w), v,
                GGUF_MAX_ALIGNMENT);
        return ERR_USAGE;
    }
    int rc = begin_kv(w, key);
    if (rc != 0)
        return rc;
    if (strcmp(key, "general.alignment") == 0)
        w->alignment = v;
    buf_u32(&w->kv, GGUF_TYPE_UINT32);
    buf_u32(&w->kv, v);
    return 0;
}

static int kv_scalar(struct gguf_writer *w, const char *key, enum gguf_type t, const void *v)
{
    if (key && strcmp(key, "general.alignment") == 0) {
        LOG_ERR("%s: general.alignment must be written as uint32", wpath(w));
        return ERR_USAGE;
    }
    int rc = begin_kv(w, key);
    if (rc != 0)
        return rc;
    buf_u32(&w->kv, t);
    buf_put(&w->kv, v, value_types[t].size);
    return 0;
}

int gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return kv_scalar(w, key, GGUF_TYPE_INT32, &v);
}

int gguf_writer_kv_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return kv_scalar(w, key, GGUF_TYPE_UINT64, &v);
}

int gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float v)
{
    return kv_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}

int gguf_writer_kv_bool(struct gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return kv_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

int gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *v)
{
    int rc = begin_kv(w, key);
    if (rc != 0)
        return rc;
    buf_u32(&w->kv, GGUF_TYPE_STRING);
    buf_str(&w->kv, v, strlen(v));
    return 0;
}

int gguf_writer_kv_str_arr(struct gguf_writer *w, const char *key, const char *const *v,
                           uint64_t n)
{
    int rc = begin_kv(w, key);
    if (rc != 0)
        return rc;
    buf_u32(&w->kv, GGUF_TYPE_ARRAY);
    buf_u32(&w->kv, GGUF_TYPE_STRING);
    buf_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++)
        buf_str(&w->kv, v[i], strlen(v[i]));
    return 0;
}

static int kv_arr(struct gguf_writer *w, const char *key, enum gguf_type at, const void *v,
                  uint64_t n)
{
    uint64_t bytes;
    if (__builtin_mul_overflow(n, (uint64_t)value_types[at].size, &bytes) || bytes > SIZE_MAX) {
        LOG_ERR("%s: key '%s': %" PRIu64 " elements overflow", wpath(w), key ? key : "", n);
        return ERR_USAGE;
    }
    int rc = begin_kv(w, key);
    if (rc != 0)
        return rc;
    buf_u32(&w->kv, GGUF_TYPE_ARRAY);
    buf_u32(&w->kv, at);
    buf_u64(&w->kv, n);
    buf_put(&w->kv, v, (size_t)bytes);
    return 0;
}

int gguf_writer_kv_f32_arr(struct gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return kv_arr(w, key, GGUF_TYPE_FLOAT32, v, n);
}

int gguf_writer_kv_i32_arr(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return kv_arr(w, key, GGUF_TYPE_INT32, v, n);
}

int gguf_writer_kv_copy(struct gguf_writer *w, const struct gguf_kv *kv)
{
    /* the key came from a validated file: at most GGUF_MAX_NAME printable bytes */
    char key[GGUF_MAX_NAME + 1];
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    if (kv->type == GGUF_TYPE_UINT32) {
        uint32_t v;
        memcpy(&v, kv->data, 4);
        return gguf_writer_kv_u32(w, key, v);
    }
    if (strcmp(key, "general.alignment") == 0)
        return kv_scalar(w, key, kv->type, kv->data); /* refused: wrong type */
    int rc = begin_kv(w, key);
    if (rc != 0)
        return rc;
    buf_u32(&w->kv, kv->type);
    if (kv->type == GGUF_TYPE_STRING) {
        buf_str(&w->kv, kv->str.ptr, kv->str.len);
    } else if (kv->type != GGUF_TYPE_ARRAY) {
        buf_put(&w->kv, kv->data, value_types[kv->type].size);
    } else {
        buf_u32(&w->kv, kv->arr_type);
        buf_u64(&w->kv, kv->arr_n);
        if (kv->arr_type == GGUF_TYPE_STRING)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                buf_str(&w->kv, kv->strs[i].ptr, kv->strs[i].len);
        else /* bounded by the size of the file it came from */
            buf_put(&w->kv, kv->data, (size_t)(kv->arr_n * value_types[kv->arr_type].size));
    }
    return 0;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t ggml_type,
                           const uint64_t *ne, uint32_t n_dims, const void *data, uint64_t size)
{
    int rc = check_declaring(w, "adding a tensor");
    if (rc != 0)
        return rc;
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > GGUF_WRITER_MAX_TENSOR_NAME) {
        LOG_ERR("%s: tensor name '%s' must have 1..%d bytes (ggml's limit)", wpath(w),
                name ? name : "", GGUF_WRITER_MAX_TENSOR_NAME);
        return ERR_USAGE;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) {
            LOG_ERR("%s: tensor name '%s' holds a control character", wpath(w), name);
            return ERR_USAGE;
        }
    }
    if (nametab_find(&w->tensor_names, w->tensors, sizeof *w->tensors, name) >= 0) {
        LOG_ERR("%s: duplicate tensor '%s'", wpath(w), name);
        return ERR_USAGE;
    }
    if (!gguf_ggml_type_supported(ggml_type)) {
        const char *tn = gguf_ggml_type_name(ggml_type);
        LOG_ERR("%s: tensor '%s': cannot write ggml type %s (%" PRIu32 ")", wpath(w), name,
                tn ? tn : "unknown", ggml_type);
        return ERR_USAGE;
    }
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': n_dims %" PRIu32 " is outside 1..%d", wpath(w), name, n_dims,
                GGUF_MAX_DIMS);
        return ERR_USAGE;
    }
    struct wtensor t = {.type = ggml_type, .n_dims = n_dims, .data = data, .size = size};
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = d < n_dims ? ne[d] : 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (t.ne[d] == 0) {
            LOG_ERR("%s: tensor '%s': ne[%" PRIu32 "] is 0", wpath(w), name, d);
            return ERR_USAGE;
        }
    }
    uint64_t expect;
    char shape[128];
    rc = tensor_bytes(ggml_type, t.ne, n_dims, &expect);
    if (rc != 0 || expect != size) {
        shape_str(t.ne, n_dims, shape, sizeof shape);
        if (rc != 0)
            LOG_ERR("%s: tensor '%s': shape %s is not valid for %s (ragged blocks or overflow)",
                    wpath(w), name, shape, ggml_types[ggml_type].name);
        else
            LOG_ERR("%s: tensor '%s': size %" PRIu64 " but shape %s of %s takes %" PRIu64
                    " bytes",
                    wpath(w), name, size, shape, ggml_types[ggml_type].name, expect);
        return ERR_USAGE;
    }
    if (w->n_tensors >= GGUF_MAX_TENSORS) {
        LOG_ERR("%s: more than %u tensors", wpath(w), GGUF_MAX_TENSORS);
        return ERR_USAGE;
    }
    struct wtensor *nt = vec_grow(w->tensors, &w->tensors_cap, w->n_tensors, sizeof *nt, 64);
    if (!nt)
        goto oom;
    w->tensors = nt;
    w->tensors[w->n_tensors] = t;
    if (append_name(&w->tensor_names, w->tensors, sizeof *w->tensors, w->n_tensors,
                          &w->tensors[w->n_tensors].name, name, n) != 0)
        goto oom;
    w->n_tensors++;
    return 0;
oom:
    LOG_ERR("%s: out of memory adding tensor '%s'", wpath(w), name);
    return -ENOMEM;
}

/* Header: magic, version, counts, key-value pairs, tensor infos, padding to the alignment. */
int gguf_writer_stream_begin(struct gguf_writer *w)
{
    int rc = check_declaring(w, "gguf_writer_stream_begin");
    if (rc != 0)
        return rc;
    struct buf h = {0};
    buf_put(&h, "GGUF", 4);
    buf_u32(&h, 3);
    buf_u64(&h, w->n_tensors);
    buf_u64(&h, w->n_kv);
    buf_put(&h, w->kv.p, w->kv.len);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        struct wtensor *t = &w->tensors[i];
        off = (off + w->alignment - 1) / w->alignment * w->alignment;
        t->offset = off;
        off += t->size;
        buf_str(&h, t->name.ptr, t->name.len);
        buf_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            buf_u64(&h, t->ne[d]);
        buf_u32(&h, t->type);
        buf_u64(&h, t->offset);
    }
    if (h.oom || w->kv.oom) {
        LOG_ERR("%s: out of memory building the header", wpath(w));
        free(h.p);
        w->state = W_FAILED;
        return -ENOMEM;
    }
    w->state = W_STREAMING;
    rc = afile_write(&w->af, h.p, h.len);
    if (rc == 0 && w->n_tensors > 0)
        rc = afile_pad(&w->af, w->alignment);
    free(h.p);
    if (rc != 0)
        w->state = W_FAILED;
    w->ts = (struct tstream){.af = &w->af, .align = w->alignment, .tensors = w->tensors,
                             .stride = sizeof *w->tensors,
                             .size_off = offsetof(struct wtensor, size),
                             .n_tensors = w->n_tensors};
    return rc;
}

int gguf_writer_stream_write(struct gguf_writer *w, const void *buf, size_t n)
{
    if (w->state != W_STREAMING) {
        LOG_ERR("%s: gguf_writer_stream_write %s", wpath(w),
                w->state == W_FAILED ? "after an earlier failure"
                                     : "before gguf_writer_stream_begin");
        return w->state == W_FAILED ? ERR_STATE : ERR_USAGE;
    }
    int rc = tstream_write(&w->ts, wpath(w), buf, n);
    if (rc != 0 && rc != ERR_USAGE)
        w->state = W_FAILED;
    return rc;
}

static void writer_free(struct gguf_writer *w)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        free((void *)w->keys[i].ptr);
    for (size_t i = 0; i < w->n_tensors; i++)
        free((void *)w->tensors[i].name.ptr);
    free(w->keys);
    free(w->tensors);
    free(w->kv.p);
    nametab_fini(&w->key_names);
    nametab_fini(&w->tensor_names);
    free(w);
}

int gguf_writer_finish(struct gguf_writer *w)
{
    int rc = 0;
    if (w->state == W_DECLARING) {
        for (size_t i = 0; i < w->n_tensors; i++) {
            if (!w->tensors[i].data) {
                LOG_ERR("%s: tensor '%s' has no data (declared for streaming, but the stream "
                        "was never begun)",
                        wpath(w), w->tensors[i].name.ptr);
                rc = ERR_USAGE;
                goto fail;
            }
        }
        rc = gguf_writer_stream_begin(w);
        for (size_t i = 0; rc == 0 && i < w->n_tensors; i++)
            rc = gguf_writer_stream_write(w, w->tensors[i].data, (size_t)w->tensors[i].size);
        if (rc != 0)
            goto fail;
    }
    if (w->state == W_FAILED) {
        LOG_ERR("%s: not written: an earlier step failed", wpath(w));
        rc = ERR_STATE;
        goto fail;
    }
    if (w->ts.cur != w->n_tensors) {
        const struct wtensor *t = &w->tensors[w->ts.cur];
        LOG_ERR("%s: tensor '%s': only %" PRIu64 " of its %" PRIu64 " bytes were written "
                "(%zu of %zu tensors complete)",
                wpath(w), t->name.ptr, w->ts.cur_done, t->size, w->ts.cur, w->n_tensors);
        rc = ERR_USAGE;
        goto fail;
    }
    /* like ggml's writer: every tensor's data, the last included, is padded to the alignment */
    if (w->n_tensors > 0)
        rc = afile_pad(&w->af, w->alignment);
    if (rc == 0)
        rc = afile_commit(&w->af); /* removes the temporary itself on failure */
    else
        afile_abort(&w->af);
    writer_free(w);
    return rc;
fail:
    afile_abort(&w->af);
    writer_free(w);
    return rc;
}

void gguf_writer_abort(struct gguf_writer *w)
{
    if (!w)
        return;
    afile_abort(&w->af);
    writer_free(w);
}
