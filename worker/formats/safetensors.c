/*
 * safetensors.c — safetensors reader (single files and sharded sets) and writer (see
 * safetensors.h; rules and limits in docs/FORMATS.md).
 *
 * Reader: the 8-byte header length is checked against the cap and the file before a byte of
 * JSON is parsed; jansson then parses the header (strict UTF-8, duplicate keys rejected, depth
 * limited). Each tensor entry is checked field by field; entries are then sorted by offset,
 * which both orders them as the file does and makes the overlap check one linear pass.
 *
 * Writer: tensors are declared, the JSON header is built with jansson once all are known, and
 * tensor bytes go from the caller's buffers straight to write(2) through afile (atomic).
 *
 * NOTES: a safetensors_file / safetensors_set is immutable after open; threads may share it.
 */
#include "safetensors.h"

#include "afile.h"
#include "err.h"
#include "fmap.h"
#include "log.h"
#include "nametab.h"
#include "tstream.h"
#include "path.h"
#include "vec.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian and exposed in place");

#define INDEX_JSON "model.safetensors.index.json"
#define SINGLE_FILE "model.safetensors"
#define ADAPTER_FILE "adapter_model.safetensors"

static const struct {
    const char *name;
    size_t size;
} dtypes[SAFETENSORS_DTYPE_COUNT_] = {
    [SAFETENSORS_F32] = {"F32", 4},         [SAFETENSORS_F16] = {"F16", 2},
    [SAFETENSORS_BF16] = {"BF16", 2},       [SAFETENSORS_F64] = {"F64", 8},
    [SAFETENSORS_I64] = {"I64", 8},         [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_I16] = {"I16", 2},         [SAFETENSORS_I8] = {"I8", 1},
    [SAFETENSORS_U8] = {"U8", 1},           [SAFETENSORS_BOOL] = {"BOOL", 1},
    [SAFETENSORS_U16] = {"U16", 2},         [SAFETENSORS_U32] = {"U32", 4},
    [SAFETENSORS_U64] = {"U64", 8},         [SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1},
    [SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
};

const char *safetensors_dtype_name(enum safetensors_dtype dt)
{
    return (unsigned)dt < SAFETENSORS_DTYPE_COUNT_ ? dtypes[dt].name : "?";
}

size_t safetensors_dtype_size(enum safetensors_dtype dt)
{
    return (unsigned)dt < SAFETENSORS_DTYPE_COUNT_ ? dtypes[dt].size : 0;
}

int safetensors_dtype_to_dtype(enum safetensors_dtype dt, enum dtype *out)
{
    switch (dt) {
    case SAFETENSORS_F32: *out = DT_F32; return 0;
    case SAFETENSORS_F16: *out = DT_F16; return 0;
    case SAFETENSORS_BF16: *out = DT_BF16; return 0;
    default: return ERR_NOT_FOUND;
    }
}

static int st_dtype_from_name(const char *s, enum safetensors_dtype *out)
{
    for (int i = 0; i < SAFETENSORS_DTYPE_COUNT_; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (enum safetensors_dtype)i;
            return 0;
        }
    }
    return ERR_NOT_FOUND;
}

/* Bytes of a tensor; ERR_OVERFLOW past 2^64. A zero dimension gives 0. */
static int tensor_bytes(enum safetensors_dtype dt, const uint64_t *shape, int n_dims,
                        uint64_t *out)
{
    uint64_t n = dtypes[dt].size;
    for (int i = 0; i < n_dims; i++)
        if (shape[i] == 0)
            n = 0;
    for (int i = 0; i < n_dims && n != 0; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return ERR_OVERFLOW;
    *out = n;
    return 0;
}

static const char *shape_str(const uint64_t *shape, int n_dims, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n_dims && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
    return buf;
}

/* ---------------------------------------------------------------------------------------- */
/* reader                                                                                   */

_Static_assert(offsetof(struct safetensors_tensor, name) == 0, "the name table reads names");

struct safetensors_impl {
    struct safetensors_file pub; /* first member */
    struct nametab names; /* NAMETAB_CSTR */
    size_t n_meta;
    char **meta; /* key, value, key, value, ... */
};

static struct safetensors_impl *impl_of(const struct safetensors_file *f)
{
    return (struct safetensors_impl *)f;
}

static bool has_control_char(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

static int parse_metadata(struct safetensors_impl *fi, json_t *meta)
{
    const char *what = fi->pub.path;
    if (!json_is_object(meta)) {
        LOG_ERR("%s: \"__metadata__\" must be an object of strings", what);
        return ERR_FORMAT;
    }
    size_t n = json_object_size(meta);
    fi->meta = calloc(2 * n + 1, sizeof *fi->meta);
    if (!fi->meta)
        goto oom;
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v)) {
            LOG_ERR("%s: \"__metadata__\" entry '%s' is not a string", what, k);
            return ERR_FORMAT;
        }
        char *kc = strdup(k), *vc = strdup(json_string_value(v));
        fi->meta[2 * fi->n_meta] = kc;
        fi->meta[2 * fi->n_meta + 1] = vc;
        fi->n_meta++;
        if (!kc || !vc)
            goto oom;
    }
    return 0;
oom:
    LOG_ERR("%s: out of memory reading \"__metadata__\"", what);
    return -ENOMEM;
}

/* A JSON integer in 0..INT64_MAX (jansson refuses larger ones while parsing). */
static bool get_u64(json_t *j, uint64_t *out)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return false;
    *out = (uint64_t)json_integer_value(j);
    return true;
}

static int parse_tensor(const char *what, const char *name, json_t *e, uint64_t data_len,
                        struct safetensors_tensor *t)
{
    if (!json_is_object(e)) {
        LOG_ERR("%s: tensor '%s': entry is not an object", what, name);
        return ERR_FORMAT;
    }
    json_t *jd = json_object_get(e, "dtype"), *js = json_object_get(e, "shape"),
           *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd)) {
        LOG_ERR("%s: tensor '%s': \"dtype\" is %s", what, name, jd ? "not a string" : "missing");
        return ERR_FORMAT;
    }
    if (st_dtype_from_name(json_string_value(jd), &t->dtype) != 0) {
        LOG_ERR("%s: tensor '%s': unknown dtype '%s'", what, name, json_string_value(jd));
        return ERR_FORMAT;
    }
    if (!json_is_array(js)) {
        LOG_ERR("%s: tensor '%s': \"shape\" is %s", what, name, js ? "not an array" : "missing");
        return ERR_FORMAT;
    }
    if (json_array_size(js) > SAFETENSORS_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': \"shape\" has %zu dimensions (at most %d)", what, name,
                json_array_size(js), SAFETENSORS_MAX_DIMS);
        return ERR_FORMAT;
    }
    t->n_dims = (int)json_array_size(js);
    for (int i = 0; i < t->n_dims; i++) {
        if (!get_u64(json_array_get(js, (size_t)i), &t->shape[i])) {
            LOG_ERR("%s: tensor '%s': \"shape\"[%d] is not a non-negative integer", what, name,
                    i);
            return ERR_FORMAT;
        }
    }
    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !get_u64(json_array_get(jo, 0), &begin) || !get_u64(json_array_get(jo, 1), &end)) {
        LOG_ERR("%s: tensor '%s': \"data_offsets\" is %s", what, name,
                jo ? "not a pair of non-negative integers [begin, end]" : "missing");
        return ERR_FORMAT;
    }
    char shape[200];
    if (tensor_bytes(t->dtype, t->shape, t->n_dims, &t->size) != 0) {
        LOG_ERR("%s: tensor '%s': the byte size of shape %s of %s overflows 64 bits", what, name,
                shape_str(t->shape, t->n_dims, shape, sizeof shape), dtypes[t->dtype].name);
        return ERR_OVERFLOW;
    }
    if (begin > end) {
        LOG_ERR("%s: tensor '%s': \"data_offsets\" [%" PRIu64 ", %" PRIu64 "] has begin > end",
                what, name, begin, end);
        return ERR_FORMAT;
    }
    if (end - begin != t->size) {
        LOG_ERR("%s: tensor '%s': \"data_offsets\" [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                " bytes but shape %s of %s (%zu bytes each) needs %" PRIu64,
                what, name, begin, end, end - begin,
                shape_str(t->shape, t->n_dims, shape, sizeof shape), dtypes[t->dtype].name,
                dtypes[t->dtype].size, t->size);
        return ERR_FORMAT;
    }
    if (end > data_len) {
        LOG_ERR("%s: tensor '%s': \"data_offsets\" [%" PRIu64 ", %" PRIu64 "] end beyond the "
                "data section (%" PRIu64 " bytes)",
                what, name, begin, end, data_len);
        return ERR_TRUNCATED;
    }
    t->offset = begin; /* made absolute by the caller */
    return 0;
}

static int cmp_tensor(const void *a, const void *b)
{
    const struct safetensors_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int parse(struct safetensors_impl *fi)
{
    struct safetensors_file *f = &fi->pub;
    const char *what = f->path;
    const uint8_t *base = f->map;
    if (f->map_size < 8) {
        LOG_ERR("%s: %zu bytes is too short for a safetensors file (an 8-byte header length "
                "comes first): truncated",
                what, f->map_size);
        return ERR_TRUNCATED;
    }
    uint64_t hlen;
    memcpy(&hlen, base, 8);
    if (hlen > SAFETENSORS_MAX_HEADER) {
        LOG_ERR("%s: header length %" PRIu64 " exceeds the %u-byte limit", what, hlen,
                SAFETENSORS_MAX_HEADER);
        return ERR_RANGE;
    }
    if (hlen > f->map_size - 8) {
        LOG_ERR("%s: header length %" PRIu64 " is beyond the end of the file (%zu bytes): "
                "truncated or not a safetensors file",
                what, hlen, f->map_size);
        return ERR_TRUNCATED;
    }
    uint64_t data_len = f->map_size - 8 - hlen;
    const uint8_t *data = base + 8 + hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_invalid_utf8)
            LOG_ERR("%s: header is not valid UTF-8 (byte %d of the JSON): %s", what,
                    jerr.position, jerr.text);
        else
            LOG_ERR("%s: header is not valid JSON: %s at line %d, column %d", what, jerr.text,
                    jerr.line, jerr.column);
        return ERR_FORMAT;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        LOG_ERR("%s: header is not a JSON object", what);
        rc = ERR_FORMAT;
        goto out;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        LOG_ERR("%s: out of memory for %zu tensors", what, n);
        rc = -ENOMEM;
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(fi, val);
            if (rc != 0)
                goto out;
            continue;
        }
        if (key[0] == '\0' || has_control_char(key)) {
            LOG_ERR("%s: tensor #%zu: the name is empty or holds control characters", what,
                    f->n_tensors);
            rc = ERR_FORMAT;
            goto out;
        }
        struct safetensors_tensor *t = &f->tensors[f->n_tensors];
        rc = parse_tensor(what, key, val, data_len, t);
        if (rc != 0)
            goto out;
        t->name = strdup(key);
        if (!t->name) {
            LOG_ERR("%s: out of memory", what);
            rc = -ENOMEM;
            goto out;
        }
        f->n_tensors++;
    }

    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_tensor);
    for (size_t i = 1; i < f->n_tensors; i++) {
        const struct safetensors_tensor *a = &f->tensors[i - 1], *b = &f->tensors[i];
        if (b->offset < a->offset + a->size) {
            LOG_ERR("%s: tensor '%s' (data_offsets [%" PRIu64 ", %" PRIu64 "]) overlaps tensor "
                    "'%s' ([%" PRIu64 ", %" PRIu64 "])",
                    what, b->name, b->offset, b->offset + b->size, a->name, a->offset,
                    a->offset + a->size);
            rc = ERR_FORMAT;
            goto out;
        }
    }
    rc = nametab_init(&fi->names, NAMETAB_CSTR, f->n_tensors);
    if (rc != 0) {
        LOG_ERR("%s: out of memory", what);
        goto out;
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        struct safetensors_tensor *t = &f->tensors[i];
        /* names are unique: jansson rejected duplicate keys */
        nametab_insert(&fi->names, f->tensors, sizeof *t, (uint32_t)i);
        t->data = data + t->offset;
        t->offset += 8 + hlen;
    }
out:
    json_decref(root);
    return rc;
}

static int open_common(void *map, size_t size, int owns_map, const char *what,
                       struct safetensors_file **out)
{
    *out = NULL;
    struct safetensors_impl *fi = calloc(1, sizeof *fi);
    char *path = strdup(what ? what : "<memory>");
    if (!fi || !path) {
        free(fi);
        free(path);
        if (owns_map && size > 0)
            munmap(map, size);
        LOG_ERR("%s: out of memory", what ? what : "<memory>");
        return -ENOMEM;
    }
    fi->pub.path = path;
    fi->pub.map = map;
    fi->pub.map_size = size;
    fi->pub.owns_map = owns_map;
    int rc = parse(fi);
    if (rc != 0) {
        safetensors_close(&fi->pub);
        return rc;
    }
    *out = &fi->pub;
    return 0;
}

int safetensors_open_mem(const void *buf, size_t size, const char *what,
                         struct safetensors_file **out)
{
    return open_common((void *)buf, size, 0, what, out);
}

int safetensors_open(const char *path, struct safetensors_file **out)
{
    *out = NULL;
    struct fmap fm;
    int rc = fmap_open(path, "safetensors file", &fm);
    if (rc != 0)
        return rc;
    return open_common(fm.data, fm.size, 1, path, out);
}

void safetensors_close(struct safetensors_file *f)
{
    if (!f)
        return;
    struct safetensors_impl *fi = impl_of(f);
    for (size_t i = 0; f->tensors && i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < 2 * fi->n_meta; i++)
        free(fi->meta[i]);
    free(fi->meta);
    nametab_fini(&fi->names);
    if (f->owns_map && f->map_size > 0)
        munmap(f->map, f->map_size);
    free(f->path);
    free(fi);
}

const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name)
{
    const struct safetensors_impl *fi = impl_of(f);
    int64_t i = nametab_find(&fi->names, f->tensors, sizeof *f->tensors, name);
    return i >= 0 ? &f->tensors[i] : NULL;
}

const char *safetensors_metadata(const struct safetensors_file *f, const char *key)
{
    const struct safetensors_impl *fi = impl_of(f);
    for (size_t i = 0; i < fi->n_meta; i++)
        if (strcmp(fi->meta[2 * i], key) == 0)
            return fi->meta[2 * i + 1];
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* sets                                                                                     */

static int exists(const char *path, bool *out)
{
    struct stat st;
    if (stat(path, &st) == 0) {
        *out = true;
        return 0;
    }
    if (errno == ENOENT || errno == ENOTDIR) {
        *out = false;
        return 0;
    }
    int e = errno;
    LOG_ERR("stat(%s) failed: %s", path, strerror(e));
    return -e;
}

static int set_add_file(struct safetensors_set *s, const char *dir, const char *name)
{
    char *path = path_join(dir, name);
    if (!path)
        return -ENOMEM;
    struct safetensors_file *f = NULL;
    int rc = safetensors_open(path, &f);
    free(path);
    if (rc != 0)
        return rc;
    s->files[s->n_files++] = f;
    return 0;
}

/* A shard name from weight_map must stay inside the directory. */
static bool plain_file_name(const char *n)
{
    return n[0] != '\0' && strchr(n, '/') == NULL && strcmp(n, ".") != 0 &&
           strcmp(n, "..") != 0 && strlen(n) <= 255;
}

static int open_sharded(struct safetensors_set *s, const char *dir, const char *index_path)
{
    struct stat st;
    if (stat(index_path, &st) != 0) {
        int e = errno;
        LOG_ERR("stat(%s) failed: %s", index_path, strerror(e));
        return -e;
    }
    if ((uint64_t)st.st_size > SAFETENSORS_MAX_HEADER) {
        LOG_ERR("%s: %" PRIu64 " bytes exceeds the %u-byte limit", index_path,
                (uint64_t)st.st_size, SAFETENSORS_MAX_HEADER);
        return ERR_RANGE;
    }
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        LOG_ERR("%s: not valid JSON: %s at line %d, column %d", index_path, jerr.text, jerr.line,
                jerr.column);
        return ERR_FORMAT;
    }
    int rc = 0;
    const char **shards = NULL;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        LOG_ERR("%s: \"weight_map\" is %s", index_path,
                !map ? "missing" : json_is_object(map) ? "empty" : "not an object");
        rc = ERR_FORMAT;
        goto out;
    }
    /* distinct shard names, in order of first appearance */
    size_t n_map = json_object_size(map), n_shards = 0;
    shards = calloc(n_map, sizeof *shards);
    if (!shards) {
        rc = -ENOMEM;
        goto out;
    }
    const char *tname;
    json_t *v;
    json_object_foreach(map, tname, v) {
        if (!json_is_string(v)) {
            LOG_ERR("%s: weight_map['%s'] is not a string", index_path, tname);
            rc = ERR_FORMAT;
            goto out;
        }
        const char *file = json_string_value(v);
        if (!plain_file_name(file)) {
            LOG_ERR("%s: weight_map['%s']: shard '%s' is not a plain file name in the model "
                    "directory",
                    index_path, tname, file);
            rc = ERR_FORMAT;
            goto out;
        }
        size_t k = 0;
        while (k < n_shards && strcmp(shards[k], file) != 0)
            k++;
        if (k == n_shards)
            shards[n_shards++] = file;
    }
    s->files = calloc(n_shards, sizeof *s->files);
    if (!s->files) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < n_shards; k++) {
        char *path = path_join(dir, shards[k]);
        bool ok = false;
        rc = path ? exists(path, &ok) : -ENOMEM;
        if (rc == 0 && !ok) {
            LOG_ERR("%s: shard '%s' named in weight_map does not exist (%s)", index_path,
                    shards[k], path);
            rc = ERR_NOT_FOUND;
        }
        free(path);
        if (rc == 0)
            rc = set_add_file(s, dir, shards[k]);
        if (rc != 0)
            goto out;
    }
    json_object_foreach(map, tname, v) {
        const char *file = json_string_value(v);
        size_t k = 0;
        while (strcmp(shards[k], file) != 0)
            k++;
        if (!safetensors_find(s->files[k], tname)) {
            LOG_ERR("%s: tensor '%s' is mapped to shard '%s', which does not contain it",
                    index_path, tname, file);
            rc = ERR_NOT_FOUND;
            goto out;
        }
    }
    /* a tensor in two shards would make lookups depend on the shard order */
    for (size_t k = 1; k < s->n_files; k++) {
        for (size_t i = 0; i < s->files[k]->n_tensors; i++) {
            const char *name = s->files[k]->tensors[i].name;
            for (size_t j = 0; j < k; j++) {
                if (safetensors_find(s->files[j], name)) {
                    LOG_ERR("%s: tensor '%s' appears in both %s and %s", dir, name,
                            s->files[j]->path, s->files[k]->path);
                    rc = ERR_FORMAT;
                    goto out;
                }
            }
        }
    }
out:
    if (rc == -ENOMEM)
        LOG_ERR("%s: out of memory", index_path);
    free(shards);
    json_decref(root);
    return rc;
}

int safetensors_set_open(const char *dir, struct safetensors_set **out)
{
    *out = NULL;
    struct safetensors_set *s = calloc(1, sizeof *s);
    char *index = path_join(dir, INDEX_JSON), *single = path_join(dir, SINGLE_FILE),
         *adapter = path_join(dir, ADAPTER_FILE);
    int rc = 0;
    if (!s || !index || !single || !adapter) {
        LOG_ERR("%s: out of memory", dir);
        rc = -ENOMEM;
        goto out;
    }
    bool has_index = false, has_single = false, has_adapter = false;
    if ((rc = exists(index, &has_index)) != 0 || (rc = exists(single, &has_single)) != 0 ||
        (rc = exists(adapter, &has_adapter)) != 0)
        goto out;
    if (has_index) {
        rc = open_sharded(s, dir, index);
    } else if (has_single || has_adapter) {
        s->files = calloc(1, sizeof *s->files);
        rc = s->files ? set_add_file(s, dir, has_single ? SINGLE_FILE : ADAPTER_FILE) : -ENOMEM;
    } else {
        LOG_ERR("%s: no safetensors weights (looked for %s, %s and %s)", dir, INDEX_JSON,
                SINGLE_FILE, ADAPTER_FILE);
        rc = ERR_NOT_FOUND;
    }
out:
    free(index);
    free(single);
    free(adapter);
    if (rc != 0) {
        safetensors_set_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void safetensors_set_close(struct safetensors_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_files; i++)
        safetensors_close(s->files[i]);
    free(s->files);
    free(s);
}

const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *s,
                                                      const char *name)
{
    for (size_t i = 0; i < s->n_files; i++) {
        const struct safetensors_tensor *t = safetensors_find(s->files[i], name);
        if (t)
            return t;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* writer                                                                                   */

struct wtensor {
    char *name; /* first member, for the name table */
    enum safetensors_dtype dtype;
    int n_dims;
    uint64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;
    uint64_t size;
};

enum wstate { W_DECLARING, W_STREAMING, W_FAILED };

struct safetensors_writer {
    struct afile af;
    enum wstate state;
    json_t *meta;
    struct wtensor *tensors;
    size_t n_tensors, cap;
    struct nametab names;
    uint64_t data_size;
    struct tstream ts; /* streaming */
};

static const char *wpath(const struct safetensors_writer *w) { return w->af.final_path; }

int safetensors_writer_create(const char *path, struct safetensors_writer **out)
{
    *out = NULL;
    struct safetensors_writer *w = calloc(1, sizeof *w);
    if (!w) {
        LOG_ERR("%s: out of memory", path);
        return -ENOMEM;
    }
    w->names.kind = NAMETAB_CSTR; /* read before its init */
    int rc = afile_open(&w->af, path);
    if (rc != 0) {
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static int check_declaring(struct safetensors_writer *w, const char *op)
{
    if (w->state == W_DECLARING)
        return 0;
    LOG_ERR("%s: %s %s", wpath(w), op,
            w->state == W_FAILED ? "after an earlier failure"
                                 : "after safetensors_writer_stream_begin");
    return w->state == W_FAILED ? ERR_STATE : ERR_USAGE;
}

int safetensors_writer_metadata(struct safetensors_writer *w, const char *key, const char *value)
{
    int rc = check_declaring(w, "adding metadata");
    if (rc != 0)
        return rc;
    if (!w->meta && !(w->meta = json_object())) {
        LOG_ERR("%s: out of memory", wpath(w));
        return -ENOMEM;
    }
    json_t *v = json_string(value); /* NULL for invalid UTF-8 */
    if (!v || json_object_set_new(w->meta, key, v) != 0) {
        LOG_ERR("%s: metadata '%s': key or value is not valid UTF-8", wpath(w), key);
        return ERR_USAGE;
    }
    return 0;
}

int safetensors_writer_add(struct safetensors_writer *w, const char *name,
                           enum safetensors_dtype dt, const uint64_t *shape, int n_dims,
                           const void *data, uint64_t size)
{
    int rc = check_declaring(w, "adding a tensor");
    if (rc != 0)
        return rc;
    if (!name || !name[0] || has_control_char(name) || strcmp(name, "__metadata__") == 0) {
        LOG_ERR("%s: invalid tensor name '%s'", wpath(w), name ? name : "");
        return ERR_USAGE;
    }
    json_t *probe = json_string(name);
    if (!probe) {
        LOG_ERR("%s: tensor name '%s' is not valid UTF-8", wpath(w), name);
        return ERR_USAGE;
    }
    json_decref(probe);
    if (nametab_find(&w->names, w->tensors, sizeof *w->tensors, name) >= 0) {
        LOG_ERR("%s: duplicate tensor '%s'", wpath(w), name);
        return ERR_USAGE;
    }
    if ((unsigned)dt >= SAFETENSORS_DTYPE_COUNT_) {
        LOG_ERR("%s: tensor '%s': unknown dtype %d", wpath(w), name, (int)dt);
        return ERR_USAGE;
    }
    if (n_dims < 0 || n_dims > SAFETENSORS_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': n_dims %d is outside 0..%d", wpath(w), name, n_dims,
                SAFETENSORS_MAX_DIMS);
        return ERR_USAGE;
    }
    struct wtensor t = {.dtype = dt, .n_dims = n_dims, .data = data, .size = size};
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] > INT64_MAX) {
            LOG_ERR("%s: tensor '%s': shape[%d] does not fit a JSON integer", wpath(w), name, i);
            return ERR_USAGE;
        }
        t.shape[i] = shape[i];
    }
    uint64_t expect, end;
    char sh[200];
    if (tensor_bytes(dt, t.shape, n_dims, &expect) != 0 || expect != size ||
        __builtin_add_overflow(w->data_size, size, &end) || end > INT64_MAX) {
        LOG_ERR("%s: tensor '%s': size %" PRIu64 " does not match shape %s of %s, or the data "
                "grows past 2^63 bytes",
                wpath(w), name, size, shape_str(t.shape, n_dims, sh, sizeof sh),
                dtypes[dt].name);
        return ERR_USAGE;
    }
    struct wtensor *nt = vec_grow(w->tensors, &w->cap, w->n_tensors, sizeof *nt, 64);
    if (!nt)
        goto oom;
    w->tensors = nt;
    if (!(t.name = strdup(name)))
        goto oom;
    w->tensors[w->n_tensors] = t;
    if (nametab_reserve(&w->names, w->tensors, sizeof *w->tensors, w->n_tensors + 1) != 0) {
        free(t.name);
        goto oom;
    }
    nametab_insert(&w->names, w->tensors, sizeof *w->tensors, (uint32_t)w->n_tensors);
    w->n_tensors++;
    w->data_size = end;
    return 0;
oom:
    LOG_ERR("%s: out of memory adding tensor '%s'", wpath(w), name);
    return -ENOMEM;
}

static json_t *u64_array(const uint64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        if (json_array_append_new(a, json_integer((json_int_t)v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static char *build_header(struct safetensors_writer *w)
{
    json_t *root = json_object();
    if (!root)
        return NULL;
    if (w->meta && json_object_set(root, "__metadata__", w->meta) != 0)
        goto fail;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        uint64_t range[2] = {off, off + t->size};
        off += t->size;
        json_t *e = json_object();
        if (!e || json_object_set_new(root, t->name, e) != 0 ||
            json_object_set_new(e, "dtype", json_string(dtypes[t->dtype].name)) != 0 ||
            json_object_set_new(e, "shape", u64_array(t->shape, t->n_dims)) != 0 ||
            json_object_set_new(e, "data_offsets", u64_array(range, 2)) != 0)
            goto fail;
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
fail:
    json_decref(root);
    return NULL;
}

int safetensors_writer_stream_begin(struct safetensors_writer *w)
{
    int rc = check_declaring(w, "safetensors_writer_stream_begin");
    if (rc != 0)
        return rc;
    char *json = build_header(w);
    if (!json) {
        LOG_ERR("%s: out of memory building the header", wpath(w));
        w->state = W_FAILED;
        return -ENOMEM;
    }
    size_t n = strlen(json);
    size_t padded = n + (8 - (8 + n) % 8) % 8; /* the data starts 8-byte aligned */
    if (padded > SAFETENSORS_MAX_HEADER) {
        LOG_ERR("%s: header of %zu bytes exceeds the %u-byte limit readers apply", wpath(w),
                padded, SAFETENSORS_MAX_HEADER);
        free(json);
        w->state = W_FAILED;
        return ERR_USAGE;
    }
    char *h = malloc(8 + padded);
    if (!h) {
        free(json);
        w->state = W_FAILED;
        LOG_ERR("%s: out of memory building the header", wpath(w));
        return -ENOMEM;
    }
    uint64_t len = padded;
    memcpy(h, &len, 8);
    memcpy(h + 8, json, n);
    memset(h + 8 + n, ' ', padded - n);
    free(json);
    w->state = W_STREAMING;
    rc = afile_write(&w->af, h, 8 + padded);
    free(h);
    if (rc != 0)
        w->state = W_FAILED;
    w->ts = (struct tstream){.af = &w->af, .align = 1, .tensors = w->tensors,
                             .stride = sizeof *w->tensors,
                             .size_off = offsetof(struct wtensor, size),
                             .n_tensors = w->n_tensors};
    return rc;
}

int safetensors_writer_stream_write(struct safetensors_writer *w, const void *buf, size_t n)
{
    if (w->state != W_STREAMING) {
        LOG_ERR("%s: safetensors_writer_stream_write %s", wpath(w),
                w->state == W_FAILED ? "after an earlier failure"
                                     : "before safetensors_writer_stream_begin");
        return w->state == W_FAILED ? ERR_STATE : ERR_USAGE;
    }
    int rc = tstream_write(&w->ts, wpath(w), buf, n);
    if (rc != 0 && rc != ERR_USAGE)
        w->state = W_FAILED;
    return rc;
}

static void writer_free(struct safetensors_writer *w)
{
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    nametab_fini(&w->names);
    json_decref(w->meta);
    free(w);
}

int safetensors_writer_finish(struct safetensors_writer *w)
{
    int rc = 0;
    if (w->state == W_DECLARING) {
        for (size_t i = 0; i < w->n_tensors; i++) {
            if (!w->tensors[i].data && w->tensors[i].size > 0) {
                LOG_ERR("%s: tensor '%s' has no data (declared for streaming, but the stream "
                        "was never begun)",
                        wpath(w), w->tensors[i].name);
                rc = ERR_USAGE;
                goto fail;
            }
        }
        rc = safetensors_writer_stream_begin(w);
        for (size_t i = 0; rc == 0 && i < w->n_tensors; i++)
            if (w->tensors[i].size > 0)
                rc = safetensors_writer_stream_write(w, w->tensors[i].data,
                                                     (size_t)w->tensors[i].size);
        if (rc != 0)
            goto fail;
    }
    if (w->state == W_FAILED) {
        LOG_ERR("%s: not written: an earlier step failed", wpath(w));
        rc = ERR_STATE;
        goto fail;
    }
    if (!tstream_done(&w->ts)) {
        const struct wtensor *t = &w->tensors[w->ts.cur];
        LOG_ERR("%s: tensor '%s': only %" PRIu64 " of its %" PRIu64 " bytes were written "
                "(%zu of %zu tensors complete)",
                wpath(w), t->name, w->ts.cur_done, t->size, w->ts.cur, w->n_tensors);
        rc = ERR_USAGE;
        goto fail;
    }
    rc = afile_commit(&w->af);
    writer_free(w);
    return rc;
fail:
    afile_abort(&w->af);
    writer_free(w);
    return rc;
}

void safetensors_writer_abort(struct safetensors_writer *w)
{
    if (!w)
        return;
    afile_abort(&w->af);
    writer_free(w);
}
