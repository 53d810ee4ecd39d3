/*
 * test_safetensors.c — the safetensors reader, writer and sharded sets: round trips of every
 * dtype (buffered and streamed), one case per kind of malformed header or index (asserting the
 * code and that the message names the file, tensor and field), and every prefix of a file.
 */
#include "testutil.h"

#include "bytes.h"
#include "err.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------------------- */

static void fill(uint8_t *p, size_t n, uint32_t seed) { tu_fill_bytes(p, n, seed * 2654435761u + 7); }

/* 8-byte length, the header text as given, then data_len bytes of data. */
static void build(struct bytes *b, const char *header, size_t data_len)
{
    b->len = 0;
    bytes_u64(b, strlen(header));
    bytes_put(b, header, strlen(header));
    for (size_t i = 0; i < data_len; i++)
        bytes_u8(b, (uint8_t)i);
}

static void expect_fail(const struct bytes *b, int code, const char *n1, const char *n2)
{
    uint8_t *copy = malloc(b->len ? b->len : 1); /* exact size: ASan sees any overread */
    assert_non_null(copy);
    memcpy(copy, b->p, b->len);
    struct safetensors_file *f = (struct safetensors_file *)1;
    tu_log_capture_begin();
    int rc = safetensors_open_mem(copy, b->len, "bad.safetensors", &f);
    if (rc != code)
        fail_msg("expected %s, got %s; log:\n%s", err_name(code), err_name(rc),
                 tu_log_captured());
    assert_null(f);
    tu_assert_log_contains("bad.safetensors", n1, n2, NULL);
    tu_log_capture_end();
    free(copy);
}

static void expect_header_fail(const char *header, size_t data_len, int code, const char *n1,
                               const char *n2)
{
    struct bytes b = {0};
    build(&b, header, data_len);
    expect_fail(&b, code, n1, n2);
    bytes_free(&b);
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            empty = false;
    closedir(d);
    return empty;
}

/* ---- round trips ------------------------------------------------------------------------ */

struct tspec {
    const char *name;
    enum safetensors_dtype dt;
    int n_dims;
    uint64_t shape[3];
};

static const struct tspec tspecs[] = {
    {"model.embed_tokens.weight", SAFETENSORS_BF16, 2, {5, 3}},
    {"model.norm.weight", SAFETENSORS_F32, 1, {7}},
    {"f16", SAFETENSORS_F16, 3, {2, 1, 3}},
    {"f64", SAFETENSORS_F64, 1, {2}},
    {"i64", SAFETENSORS_I64, 1, {3}},
    {"i32", SAFETENSORS_I32, 2, {1, 1}},
    {"i16", SAFETENSORS_I16, 1, {5}},
    {"i8", SAFETENSORS_I8, 1, {9}},
    {"u8", SAFETENSORS_U8, 1, {1}},
    {"bool", SAFETENSORS_BOOL, 1, {4}},
    {"u16", SAFETENSORS_U16, 1, {2}},
    {"u32", SAFETENSORS_U32, 1, {2}},
    {"u64", SAFETENSORS_U64, 1, {2}},
    {"f8_e4m3", SAFETENSORS_F8_E4M3, 1, {3}},
    {"f8_e5m2", SAFETENSORS_F8_E5M2, 1, {3}},
    {"scalar", SAFETENSORS_F32, 0, {0}},
    {"empty", SAFETENSORS_F16, 2, {0, 4}},
    {"w\xc3\xa9ight.\xe2\x96\x81", SAFETENSORS_U8, 1, {2}}, /* UTF-8 name */
};
#define N_TSPECS (sizeof tspecs / sizeof tspecs[0])

static uint64_t spec_size(size_t i)
{
    uint64_t n = safetensors_dtype_size(tspecs[i].dt);
    for (int d = 0; d < tspecs[i].n_dims; d++)
        n *= tspecs[i].shape[d];
    return n;
}

static uint8_t *spec_data(size_t i)
{
    uint8_t *p = malloc(spec_size(i) + 1);
    assert_non_null(p);
    fill(p, spec_size(i), (uint32_t)i + 3);
    return p;
}

static void write_specs(struct safetensors_writer *w, uint8_t **data)
{
    assert_int_equal(safetensors_writer_metadata(w, "format", "pt"), 0);
    for (size_t i = 0; i < N_TSPECS; i++)
        assert_int_equal(safetensors_writer_add(w, tspecs[i].name, tspecs[i].dt, tspecs[i].shape,
                                                tspecs[i].n_dims, data ? data[i] : NULL,
                                                spec_size(i)),
                         0);
}

static void check_specs_file(const char *path)
{
    struct safetensors_file *f = NULL;
    assert_int_equal(safetensors_open(path, &f), 0);
    assert_int_equal(f->n_tensors, N_TSPECS);
    assert_string_equal(f->path, path);
    assert_string_equal(safetensors_metadata(f, "format"), "pt");
    assert_null(safetensors_metadata(f, "absent"));
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    assert_int_equal((8 + hlen) % 8, 0);
    for (size_t i = 0; i < N_TSPECS; i++) {
        const struct safetensors_tensor *t = safetensors_find(f, tspecs[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, tspecs[i].dt);
        assert_int_equal(t->n_dims, tspecs[i].n_dims);
        for (int d = 0; d < t->n_dims; d++)
            assert_int_equal(t->shape[d], tspecs[i].shape[d]);
        assert_int_equal(t->size, spec_size(i));
        assert_ptr_equal(t->data, (const uint8_t *)f->map + t->offset);
        uint8_t *want = spec_data(i);
        if (t->size)
            assert_memory_equal(t->data, want, t->size);
        free(want);
    }
    /* tensors come sorted by offset, contiguous, ending at the end of the file */
    for (size_t i = 1; i < f->n_tensors; i++)
        assert_int_equal(f->tensors[i].offset, f->tensors[i - 1].offset + f->tensors[i - 1].size);
    assert_int_equal(f->tensors[N_TSPECS - 1].offset + f->tensors[N_TSPECS - 1].size,
                     f->map_size);
    assert_null(safetensors_find(f, "absent"));
    safetensors_close(f);
}

static void test_roundtrip_all_dtypes(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "model.safetensors");
    uint8_t *data[N_TSPECS];
    for (size_t i = 0; i < N_TSPECS; i++)
        data[i] = spec_data(i);
    struct safetensors_writer *w = NULL;
    assert_int_equal(safetensors_writer_create(path, &w), 0);
    write_specs(w, data);
    assert_int_equal(safetensors_writer_finish(w), 0);
    check_specs_file(path);
    for (size_t i = 0; i < N_TSPECS; i++)
        free(data[i]);
    assert_string_equal(safetensors_dtype_name(SAFETENSORS_BF16), "BF16");
    assert_int_equal(safetensors_dtype_size(SAFETENSORS_I64), 8);
    enum dtype dt;
    assert_int_equal(safetensors_dtype_to_dtype(SAFETENSORS_BF16, &dt), 0);
    assert_int_equal(dt, DT_BF16);
    assert_int_equal(safetensors_dtype_to_dtype(SAFETENSORS_F16, &dt), 0);
    assert_int_equal(dt, DT_F16);
    assert_int_equal(safetensors_dtype_to_dtype(SAFETENSORS_F32, &dt), 0);
    assert_int_equal(dt, DT_F32);
    assert_int_equal(safetensors_dtype_to_dtype(SAFETENSORS_F8_E4M3, &dt), ERR_NOT_FOUND);
    tu_rmtree(dir);
    free(dir);
}

static void test_stream_writer(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char buffered[4096], streamed[4096];
    snprintf(buffered, sizeof buffered, "%s", tu_path(dir, "a.safetensors"));
    snprintf(streamed, sizeof streamed, "%s", tu_path(dir, "b.safetensors"));
    uint8_t *data[N_TSPECS];
    struct bytes all = {0};
    for (size_t i = 0; i < N_TSPECS; i++) {
        data[i] = spec_data(i);
        bytes_put(&all, data[i], spec_size(i));
    }
    struct safetensors_writer *w = NULL;
    assert_int_equal(safetensors_writer_create(buffered, &w), 0);
    write_specs(w, data);
    assert_int_equal(safetensors_writer_finish(w), 0);

    assert_int_equal(safetensors_writer_create(streamed, &w), 0);
    write_specs(w, NULL);
    assert_int_equal(safetensors_writer_stream_begin(w), 0);
    for (size_t off = 0; off < all.len; off += 5)
        assert_int_equal(
            safetensors_writer_stream_write(w, all.p + off, all.len - off < 5 ? all.len - off : 5),
            0);
    assert_int_equal(safetensors_writer_finish(w), 0);

    size_t n1, n2;
    char *b1 = tu_read_file(buffered, &n1), *b2 = tu_read_file(streamed, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    check_specs_file(streamed);
    free(b1);
    free(b2);
    bytes_free(&all);
    for (size_t i = 0; i < N_TSPECS; i++)
        free(data[i]);
    tu_rmtree(dir);
    free(dir);
}

static void test_writer_misuse(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "w.safetensors");
    struct safetensors_writer *w = NULL;
    assert_int_equal(safetensors_writer_create(path, &w), 0);
    float x[8] = {0};
    uint64_t shape[9] = {2, 4, 1, 1, 1, 1, 1, 1, 1};
    tu_log_capture_begin();
    assert_int_equal(safetensors_writer_add(w, "t", SAFETENSORS_F32, shape, 2, x, 32), 0);
    assert_int_equal(safetensors_writer_add(w, "t", SAFETENSORS_F32, shape, 2, x, 32), ERR_USAGE);
    tu_assert_log_contains("duplicate tensor 't'", NULL);
    assert_int_equal(safetensors_writer_add(w, "u", SAFETENSORS_F32, shape, 2, x, 30), ERR_USAGE);
    tu_assert_log_contains("tensor 'u': size 30 does not match shape [2, 4] of F32", NULL);
    assert_int_equal(safetensors_writer_add(w, "v", SAFETENSORS_F32, shape, 9, x, 32), ERR_USAGE);
    assert_int_equal(safetensors_writer_add(w, "__metadata__", SAFETENSORS_F32, shape, 2, x, 32),
                     ERR_USAGE);
    assert_int_equal(safetensors_writer_add(w, "bad\xff", SAFETENSORS_F32, shape, 2, x, 32),
                     ERR_USAGE);
    tu_assert_log_contains("not valid UTF-8", NULL);
    assert_int_equal(safetensors_writer_metadata(w, "k", "\xc3"), ERR_USAGE);
    assert_int_equal(safetensors_writer_stream_write(w, x, 4), ERR_USAGE);
    assert_int_equal(safetensors_writer_add(w, "z", SAFETENSORS_F32, shape, 2, NULL, 32), 0);
    assert_int_equal(safetensors_writer_finish(w), ERR_USAGE);
    tu_assert_log_contains("tensor 'z' has no data", NULL);
    assert_true(dir_is_empty(dir));

    assert_int_equal(safetensors_writer_create(path, &w), 0);
    assert_int_equal(safetensors_writer_add(w, "t", SAFETENSORS_F32, shape, 2, NULL, 32), 0);
    assert_int_equal(safetensors_writer_stream_begin(w), 0);
    assert_int_equal(safetensors_writer_add(w, "late", SAFETENSORS_F32, shape, 2, x, 32),
                     ERR_USAGE);
    assert_int_equal(safetensors_writer_stream_write(w, x, 12), 0);
    assert_int_equal(safetensors_writer_finish(w), ERR_USAGE);
    tu_assert_log_contains("tensor 't': only 12 of its 32 bytes", NULL);
    assert_true(dir_is_empty(dir));

    /* a full disk mid-write leaves nothing behind */
    uint8_t *big = calloc(1, 8192);
    uint64_t n = 8192;
    assert_int_equal(safetensors_writer_create(path, &w), 0);
    assert_int_equal(safetensors_writer_add(w, "big", SAFETENSORS_U8, &n, 1, big, n), 0);
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "4096", 1);
    assert_int_equal(safetensors_writer_finish(w), -ENOSPC);
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    tu_assert_log_contains("w.safetensors", NULL);
    assert_true(dir_is_empty(dir));
    free(big);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* ---- malformed input -------------------------------------------------------------------- */

static void test_header_length(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_put(&b, "\x10\0\0", 3);
    expect_fail(&b, ERR_TRUNCATED, "3 bytes is too short", NULL);
    bytes_free(&b);

    build(&b, "{}", 0);
    uint64_t len = 1000;
    memcpy(b.p, &len, 8);
    expect_fail(&b, ERR_TRUNCATED, "header length 1000 is beyond the end of the file (10 bytes)",
                NULL);
    bytes_free(&b);
}

static void test_header_over_limit(void **state)
{
    (void)state;
    struct bytes b = {0};
    build(&b, "{}", 0);
    uint64_t len;
    /* the length says 200 MB: refused from the 8 bytes alone, nothing is allocated for it */
    len = 200u * 1000u * 1000u;
    memcpy(b.p, &len, 8);
    expect_fail(&b, ERR_RANGE, "header length 200000000 exceeds the 100000000-byte limit", NULL);
    /* the same through a file on disk (10 bytes long, though it claims a 200 MB header) */
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "huge_header.safetensors");
    tu_write_file(path, b.p, b.len);
    struct safetensors_file *f = NULL;
    tu_log_capture_begin();
    assert_int_equal(safetensors_open(path, &f), ERR_RANGE);
    tu_assert_log_contains(path, "header length 200000000 exceeds", NULL);
    tu_log_capture_end();
    assert_null(f);
    tu_rmtree(dir);
    free(dir);
    len = UINT64_MAX;
    memcpy(b.p, &len, 8);
    expect_fail(&b, ERR_RANGE, "header length 18446744073709551615", NULL);
    bytes_free(&b);
}

static void test_invalid_json(void **state)
{
    (void)state;
    expect_header_fail("{\"a\": {\"dtype\": \"F32\",", 0, ERR_FORMAT, "header is not valid JSON",
                       "line 1");
    expect_header_fail("", 0, ERR_FORMAT, "header is not valid JSON", NULL);
    expect_header_fail("[1, 2]", 0, ERR_FORMAT, "header is not a JSON object", NULL);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    expect_header_fail("{\"caf\xe9\": {}}", 0, ERR_FORMAT, "header is not valid UTF-8", NULL);
    expect_header_fail("{\"__metadata__\": {\"k\": \"\xc3\x28\"}}", 0, ERR_FORMAT,
                       "header is not valid UTF-8", NULL);
}

static void test_bad_json(void **state)
{
    (void)state;
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       8, ERR_FORMAT, "duplicate", NULL);
    expect_header_fail("{\"__metadata__\": {\"format\": 1}}", 0, ERR_FORMAT,
                       "\"__metadata__\" entry 'format' is not a string", NULL);
    expect_header_fail("{\"__metadata__\": [\"x\"]}", 0, ERR_FORMAT, "\"__metadata__\"", NULL);
    expect_header_fail("{\"\": {\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                       ERR_FORMAT, "tensor #0: the name is empty", NULL);
    expect_header_fail("{\"a\\nb\": {\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                       ERR_FORMAT, "control characters", NULL);
}

static void test_unknown_dtype(void **state)
{
    (void)state;
    expect_header_fail("{\"w\": {\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 1,
                       ERR_FORMAT, "tensor 'w': unknown dtype 'F4'", NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"f32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                       ERR_FORMAT, "tensor 'w': unknown dtype 'f32'", NULL);
}

static void test_bad_fields(void **state)
{
    (void)state;
    expect_header_fail("{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8, ERR_FORMAT,
                       "tensor 'w': \"dtype\" is missing", NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}",
                       8, ERR_FORMAT, "tensor 'w': \"shape\"[1] is not a non-negative integer",
                       NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [2.0], \"data_offsets\": [0, 8]}}",
                       8, ERR_FORMAT, "\"shape\"[0]", NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": 2, \"data_offsets\": [0, 8]}}", 8,
                       ERR_FORMAT, "tensor 'w': \"shape\" is not an array", NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                       "\"data_offsets\": [0, 4]}}",
                       4, ERR_FORMAT, "tensor 'w': \"shape\" has 9 dimensions", NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8,
                       ERR_FORMAT, "tensor 'w': \"data_offsets\" is not a pair", NULL);
    expect_header_fail("{\"w\": []}", 0, ERR_FORMAT, "tensor 'w': entry is not an object", NULL);
}

static void test_shape_vs_range(void **state)
{
    (void)state;
    expect_header_fail("{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 8]}}",
                       16, ERR_FORMAT,
                       "tensor 'w': \"data_offsets\" [0, 8] hold 8 bytes but shape [2, 3] of BF16",
                       "needs 12");
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [0, 4]}}",
                       4, ERR_FORMAT, "tensor 'w'", "needs 0");
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8,
                       ERR_FORMAT, "tensor 'w': \"data_offsets\" [8, 0] has begin > end", NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], "
                       "\"data_offsets\": [0, 8]}}",
                       8, ERR_OVERFLOW, "tensor 'w': the byte size of shape [4294967296, "
                       "4294967296] of F64 overflows", NULL);
    /* a zero dimension is fine when the range is empty too */
    struct bytes b = {0};
    build(&b, "{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [0, 0]}}", 0);
    struct safetensors_file *f = NULL;
    assert_int_equal(safetensors_open_mem(b.p, b.len, "ok", &f), 0);
    assert_int_equal(f->tensors[0].size, 0);
    safetensors_close(f);
    bytes_free(&b);
}

static void test_offsets_beyond_data(void **state)
{
    (void)state;
    expect_header_fail("{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}",
                       12, ERR_TRUNCATED,
                       "tensor 'w': \"data_offsets\" [0, 16] end beyond the data section (12 bytes)",
                       NULL);
    expect_header_fail("{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": "
                       "[9223372036854775806, 9223372036854775807]}}",
                       4, ERR_TRUNCATED, "tensor 'w'", "beyond the data section");
}

static void test_overlapping_ranges(void **state)
{
    (void)state;
    expect_header_fail("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                       " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                       12, ERR_FORMAT,
                       "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' ([0, 8])", NULL);
    /* listed out of order in the JSON: still found */
    expect_header_fail("{\"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]},"
                       " \"c\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [9, 10]},"
                       " \"a\": {\"dtype\": \"U8\", \"shape\": [6], \"data_offsets\": [0, 6]}}",
                       12, ERR_FORMAT, "tensor 'b'", "overlaps tensor 'a'");
    /* holes between ranges are allowed; tensors are returned in file order */
    struct bytes b = {0};
    build(&b, "{\"z\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [6, 8]},"
              " \"y\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}}",
          8);
    struct safetensors_file *f = NULL;
    assert_int_equal(safetensors_open_mem(b.p, b.len, "ok", &f), 0);
    assert_string_equal(f->tensors[0].name, "y");
    assert_string_equal(f->tensors[1].name, "z");
    assert_int_equal(((const uint8_t *)safetensors_find(f, "z")->data)[0], 6);
    safetensors_close(f);
    bytes_free(&b);
}

/* Every prefix of a valid file fails cleanly (the data is contiguous up to the end). */
static void test_truncated_everywhere(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "t.safetensors");
    uint8_t *data[N_TSPECS];
    for (size_t i = 0; i < N_TSPECS; i++)
        data[i] = spec_data(i);
    struct safetensors_writer *w = NULL;
    assert_int_equal(safetensors_writer_create(path, &w), 0);
    write_specs(w, data);
    assert_int_equal(safetensors_writer_finish(w), 0);
    size_t n;
    char *whole = tu_read_file(path, &n);
    tu_log_capture_begin();
    for (size_t len = 0; len < n; len++) {
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, whole, len);
        struct safetensors_file *f = NULL;
        int rc = safetensors_open_mem(cut, len, "t.safetensors", &f);
        if (rc == 0)
            fail_msg("a %zu-byte prefix (of %zu) was accepted", len, n);
        assert_true(rc == ERR_TRUNCATED || rc == ERR_FORMAT);
        assert_non_null(strstr(tu_log_captured(), "t.safetensors"));
        free(cut);
    }
    tu_log_capture_end();
    free(whole);
    for (size_t i = 0; i < N_TSPECS; i++)
        free(data[i]);
    tu_rmtree(dir);
    free(dir);
}

/* ---- sets ------------------------------------------------------------------------------- */

static void write_shard(const char *path, const char *const *names, size_t n)
{
    struct safetensors_writer *w = NULL;
    assert_int_equal(safetensors_writer_create(path, &w), 0);
    float v[2] = {1, 2};
    uint64_t shape = 2;
    for (size_t i = 0; i < n; i++)
        assert_int_equal(safetensors_writer_add(w, names[i], SAFETENSORS_F32, &shape, 1, v, 8), 0);
    assert_int_equal(safetensors_writer_finish(w), 0);
}

static void test_set_single_and_adapter(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct safetensors_set *s = NULL;
    tu_log_capture_begin();
    assert_int_equal(safetensors_set_open(dir, &s), ERR_NOT_FOUND);
    tu_assert_log_contains(dir, "model.safetensors.index.json", "adapter_model.safetensors",
                           NULL);
    tu_log_capture_end();
    assert_null(s);

    static const char *const lora[] = {"base_model.model.layers.0.self_attn.q_proj.lora_A.weight"};
    write_shard(tu_path(dir, "adapter_model.safetensors"), lora, 1);
    assert_int_equal(safetensors_set_open(dir, &s), 0);
    assert_int_equal(s->n_files, 1);
    assert_non_null(safetensors_set_find(s, lora[0]));
    safetensors_set_close(s);

    static const char *const names[] = {"model.norm.weight", "lm_head.weight"};
    write_shard(tu_path(dir, "model.safetensors"), names, 2);
    assert_int_equal(safetensors_set_open(dir, &s), 0); /* model.safetensors wins */
    assert_int_equal(s->n_files, 1);
    assert_non_null(safetensors_set_find(s, "lm_head.weight"));
    assert_null(safetensors_set_find(s, lora[0]));
    safetensors_set_close(s);
    tu_rmtree(dir);
    free(dir);
}

static const char *const shard1[] = {"model.embed_tokens.weight", "model.layers.0.mlp.weight"};
static const char *const shard2[] = {"model.norm.weight", "lm_head.weight"};

static void make_sharded(const char *dir, const char *index_json)
{
    write_shard(tu_path(dir, "model-00001-of-00002.safetensors"), shard1, 2);
    write_shard(tu_path(dir, "model-00002-of-00002.safetensors"), shard2, 2);
    tu_write_file(tu_path(dir, "model.safetensors.index.json"), index_json, strlen(index_json));
}

#define GOOD_MAP                                                                            \
    "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","                  \
    "\"model.layers.0.mlp.weight\": \"model-00001-of-00002.safetensors\","                  \
    "\"model.norm.weight\": \"model-00002-of-00002.safetensors\","                          \
    "\"lm_head.weight\": \"model-00002-of-00002.safetensors\""

static void test_set_sharded(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    make_sharded(dir, "{\"metadata\": {\"total_size\": 32}, \"weight_map\": {" GOOD_MAP "}}");
    struct safetensors_set *s = NULL;
    assert_int_equal(safetensors_set_open(dir, &s), 0);
    assert_int_equal(s->n_files, 2);
    for (int i = 0; i < 2; i++) {
        const struct safetensors_tensor *t = safetensors_set_find(s, shard1[i]);
        assert_non_null(t);
        assert_ptr_equal(t, safetensors_find(s->files[0], shard1[i]));
        t = safetensors_set_find(s, shard2[i]);
        assert_ptr_equal(t, safetensors_find(s->files[1], shard2[i]));
    }
    assert_null(safetensors_set_find(s, "absent"));
    safetensors_set_close(s);
    tu_rmtree(dir);
    free(dir);
}

static void expect_set_fail(const char *index_json, int code, const char *n1, const char *n2)
{
    char *dir = tu_mkdtemp();
    make_sharded(dir, index_json);
    struct safetensors_set *s = (struct safetensors_set *)1;
    tu_log_capture_begin();
    int rc = safetensors_set_open(dir, &s);
    if (rc != code)
        fail_msg("expected %s, got %s; log:\n%s", err_name(code), err_name(rc),
                 tu_log_captured());
    assert_null(s);
    tu_assert_log_contains(n1, n2, NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

static void test_set_missing_shard(void **state)
{
    (void)state;
    expect_set_fail("{\"weight_map\": {" GOOD_MAP ", \"extra\": \"model-00003-of-00003.safetensors\"}}",
                    ERR_NOT_FOUND, "shard 'model-00003-of-00003.safetensors' named in weight_map "
                    "does not exist", NULL);
}

static void test_set_escaping_shard(void **state)
{
    (void)state;
    expect_set_fail("{\"weight_map\": {" GOOD_MAP ", \"x\": \"../model-00001-of-00002.safetensors\"}}",
                    ERR_FORMAT, "weight_map['x']: shard '../model-00001-of-00002.safetensors' is "
                    "not a plain file name", NULL);
    expect_set_fail("{\"weight_map\": {\"x\": \"/etc/passwd\"}}", ERR_FORMAT, "'/etc/passwd'",
                    NULL);
    expect_set_fail("{\"weight_map\": {\"x\": \"..\"}}", ERR_FORMAT, "shard '..'", NULL);
    expect_set_fail("{\"weight_map\": {\"x\": \"sub/model.safetensors\"}}", ERR_FORMAT,
                    "shard 'sub/model.safetensors' is not a plain file name", NULL);
}

static void test_set_bad_index(void **state)
{
    (void)state;
    expect_set_fail("{\"weight_map\": {" GOOD_MAP ", \"model.extra\": "
                    "\"model-00001-of-00002.safetensors\"}}",
                    ERR_NOT_FOUND, "tensor 'model.extra' is mapped to shard "
                    "'model-00001-of-00002.safetensors', which does not contain it", NULL);
    expect_set_fail("{\"weight_map\": {" GOOD_MAP, ERR_FORMAT, "model.safetensors.index.json",
                    "not valid JSON");
    expect_set_fail("{\"weight_map\": {}}", ERR_FORMAT, "\"weight_map\" is empty", NULL);
    expect_set_fail("{\"metadata\": {}}", ERR_FORMAT, "\"weight_map\" is missing", NULL);
    expect_set_fail("{\"weight_map\": {\"a\": 3}}", ERR_FORMAT, "weight_map['a'] is not a string",
                    NULL);
}

static void test_set_duplicate_across_shards(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    static const char *const dup[] = {"model.norm.weight", "model.embed_tokens.weight"};
    write_shard(tu_path(dir, "a.safetensors"), shard1, 2);
    write_shard(tu_path(dir, "b.safetensors"), dup, 2);
    const char *idx = "{\"weight_map\": {\"model.embed_tokens.weight\": \"a.safetensors\", "
                      "\"model.norm.weight\": \"b.safetensors\"}}";
    tu_write_file(tu_path(dir, "model.safetensors.index.json"), idx, strlen(idx));
    struct safetensors_set *s = NULL;
    tu_log_capture_begin();
    assert_int_equal(safetensors_set_open(dir, &s), ERR_FORMAT);
    tu_assert_log_contains("tensor 'model.embed_tokens.weight' appears in both", "a.safetensors",
                           "b.safetensors", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

static void test_set_bad_shard(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    make_sharded(dir, "{\"weight_map\": {" GOOD_MAP "}}");
    tu_write_file(tu_path(dir, "model-00002-of-00002.safetensors"), "\x05\0\0\0\0\0\0\0{}", 10);
    struct safetensors_set *s = NULL;
    tu_log_capture_begin();
    assert_int_equal(safetensors_set_open(dir, &s), ERR_TRUNCATED);
    tu_assert_log_contains("model-00002-of-00002.safetensors: header length 5", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_dtypes),
        cmocka_unit_test(test_stream_writer),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_header_over_limit),
        cmocka_unit_test(test_invalid_json),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_shape_vs_range),
        cmocka_unit_test(test_offsets_beyond_data),
        cmocka_unit_test(test_overlapping_ranges),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_set_single_and_adapter),
        cmocka_unit_test(test_set_sharded),
        cmocka_unit_test(test_set_missing_shard),
        cmocka_unit_test(test_set_escaping_shard),
        cmocka_unit_test(test_set_bad_index),
        cmocka_unit_test(test_set_duplicate_across_shards),
        cmocka_unit_test(test_set_bad_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
