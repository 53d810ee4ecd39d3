/*
 * test_gguf.c — the GGUF reader and writer: round trips of every supported tensor type and
 * value type (buffered and streamed), the real tokenizer fixtures, and one case per kind of
 * malformed input (each asserting the error code and that the message names what is wrong).
 */
#include "testutil.h"

#include "bytes.h"
#include "err.h"
#include "gguf.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- helpers ---------------------------------------------------------------------------- */

static void fill(uint8_t *p, size_t n, uint32_t seed) { tu_fill_bytes(p, n, seed * 2654435761u + 1); }

/* Opening `b` (as "bad.gguf") fails with `code` and the log names the file and each needle. */
static void expect_fail(const struct bytes *b, int code, const char *n1, const char *n2)
{
    /* an exact-size heap copy, so ASan catches any read past the end */
    uint8_t *copy = malloc(b->len ? b->len : 1);
    assert_non_null(copy);
    memcpy(copy, b->p, b->len);
    struct gguf_file *f = (struct gguf_file *)1;
    tu_log_capture_begin();
    int rc = gguf_open_mem(copy, b->len, "bad.gguf", &f);
    if (rc != code)
        fail_msg("expected %s, got %s; log:\n%s", err_name(code), err_name(rc),
                 tu_log_captured());
    assert_null(f);
    tu_assert_log_contains("bad.gguf", n1, n2, NULL);
    tu_log_capture_end();
    free(copy);
}

static struct gguf_file *expect_open(const struct bytes *b)
{
    struct gguf_file *f = NULL;
    tu_log_capture_begin();
    int rc = gguf_open_mem(b->p, b->len, "ok.gguf", &f);
    if (rc != 0)
        fail_msg("gguf_open_mem: %s; log:\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    return f;
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

/* A small valid file: one key, two f32 tensors [4] and [2, 3]. */
static void build_small(struct bytes *b)
{
    static const uint64_t ne_a[1] = {4}, ne_b[2] = {2, 3};
    bytes_gguf_header(b, 3, 2, 1);
    bytes_gguf_kv_u32(b, "llama.block_count", 2);
    bytes_gguf_tensor(b, "a", 1, ne_a, GGUF_GGML_F32, 0);
    bytes_gguf_tensor(b, "b", 2, ne_b, GGUF_GGML_F32, 32);
    bytes_pad(b, 32);
    float data[8 + 6];
    for (int i = 0; i < 14; i++)
        data[i] = (float)i;
    bytes_put(b, data, 16);
    bytes_pad(b, 32);
    bytes_put(b, data + 8, 24);
}

/* Bytes of one row of n elements of a ggml type, as the reader computes them. */
static int tensor_bytes_for_test(uint32_t type, uint64_t n, uint64_t *out)
{
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "r", 1, &n, type, 0);
    bytes_pad(&b, 32);
    uint8_t zero[512] = {0};
    bytes_put(&b, zero, sizeof zero);
    struct gguf_file *f = NULL;
    int rc = gguf_open_mem(b.p, b.len, "row", &f);
    if (rc == 0) {
        *out = f->tensors[0].size;
        gguf_close(f);
    }
    bytes_free(&b);
    return rc;
}

/* ---- round trips ------------------------------------------------------------------------ */

struct tspec {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t size;
};

static const struct tspec tspecs[] = {
    {"token_embd.weight", GGUF_GGML_F32, 2, {4, 3, 1, 1}, 48},
    {"blk.0.attn_norm.weight", GGUF_GGML_F16, 1, {8, 1, 1, 1}, 16},
    {"blk.0.attn_q.weight", GGUF_GGML_BF16, 3, {2, 2, 2, 1}, 16},
    {"blk.0.ffn_up.weight", GGUF_GGML_Q8_0, 2, {64, 2, 1, 1}, 4 * 34},
    {"blk.0.ffn_down.weight", GGUF_GGML_Q4_0, 4, {32, 1, 1, 2}, 2 * 18},
};
#define N_TSPECS (sizeof tspecs / sizeof tspecs[0])

static const char *const toks[] = {"<unk>", "", "\xe2\x96\x81The", "<0x0A>"};
static const float farr[] = {0.0f, -1.5f, 3.25f};
static const int32_t iarr[] = {-2, 0, 7, 2147483647};

static void write_kvs(struct gguf_writer *w)
{
    assert_int_equal(gguf_writer_kv_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(gguf_writer_kv_u32(w, "llama.block_count", 5), 0);
    assert_int_equal(gguf_writer_kv_i32(w, "test.neg", -7), 0);
    assert_int_equal(gguf_writer_kv_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), 0);
    assert_int_equal(gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", true), 0);
    assert_int_equal(gguf_writer_kv_u64(w, "test.big", 1ull << 40), 0);
    assert_int_equal(gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", toks, 4), 0);
    assert_int_equal(gguf_writer_kv_f32_arr(w, "tokenizer.ggml.scores", farr, 3), 0);
    assert_int_equal(gguf_writer_kv_i32_arr(w, "tokenizer.ggml.token_type", iarr, 4), 0);
}

static uint8_t *tensor_data(size_t i)
{
    uint8_t *p = malloc(tspecs[i].size);
    assert_non_null(p);
    fill(p, tspecs[i].size, (uint32_t)i + 1);
    return p;
}

static void check_roundtrip_file(const char *path)
{
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f), 0);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_kv, 9);
    assert_int_equal(f->n_tensors, N_TSPECS);
    assert_int_equal(f->alignment, 32);
    assert_string_equal(f->what, path);

    struct gguf_str s;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    uint32_t u;
    assert_int_equal(gguf_get_u32(f, "llama.block_count", &u), 0);
    assert_int_equal(u, 5);
    int64_t i64;
    assert_int_equal(gguf_get_i64(f, "test.neg", &i64), 0);
    assert_int_equal(i64, -7);
    assert_int_equal(gguf_get_i64(f, "test.big", &i64), 0);
    assert_int_equal(i64, 1ll << 40);
    double d;
    assert_int_equal(gguf_get_f64(f, "llama.attention.layer_norm_rms_epsilon", &d), 0);
    assert_true(d == (double)1e-5f);
    bool bv = false;
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &bv), 0);
    assert_true(bv);

    const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_TYPE_ARRAY);
    assert_int_equal(kv->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(kv->arr_n, 4);
    for (int i = 0; i < 4; i++)
        assert_true(gguf_str_eq(kv->strs[i], toks[i]));
    kv = gguf_find_kv(f, "tokenizer.ggml.scores");
    assert_non_null(kv);
    assert_int_equal(kv->arr_type, GGUF_TYPE_FLOAT32);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gguf_arr_f64(kv, (uint64_t)i, &d), 0);
        assert_true(d == farr[i]);
    }
    kv = gguf_find_kv(f, "tokenizer.ggml.token_type");
    assert_non_null(kv);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(gguf_arr_i64(kv, (uint64_t)i, &i64), 0);
        assert_int_equal(i64, iarr[i]);
    }

    for (size_t i = 0; i < N_TSPECS; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(f, tspecs[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, &f->tensors[i]); /* declaration order is kept */
        assert_int_equal(t->type, tspecs[i].type);
        assert_int_equal(t->n_dims, tspecs[i].n_dims);
        for (int dd = 0; dd < 4; dd++)
            assert_int_equal(t->ne[dd], tspecs[i].ne[dd]);
        assert_int_equal(t->size, tspecs[i].size);
        assert_int_equal(t->offset % 32, 0);
        assert_ptr_equal(t->data, f->data_base + t->offset);
        uint8_t *want = tensor_data(i);
        assert_memory_equal(t->data, want, tspecs[i].size);
        free(want);
    }
    assert_int_equal(((uintptr_t)f->data_base) % 32, 0);
    assert_null(gguf_find_tensor(f, "missing"));
    assert_null(gguf_find_kv(f, "missing"));
    gguf_close(f);
}

static void test_roundtrip_all_types(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "model.gguf");
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    write_kvs(w);
    uint8_t *data[N_TSPECS];
    for (size_t i = 0; i < N_TSPECS; i++) {
        data[i] = tensor_data(i);
        assert_int_equal(gguf_writer_add_tensor(w, tspecs[i].name, tspecs[i].type, tspecs[i].ne,
                                                tspecs[i].n_dims, data[i], tspecs[i].size),
                         0);
    }
    assert_int_equal(gguf_writer_finish(w), 0);
    for (size_t i = 0; i < N_TSPECS; i++)
        free(data[i]);
    check_roundtrip_file(path);
    tu_rmtree(dir);
    free(dir);
}

/* Streamed in 7-byte pieces across tensor boundaries: the same bytes as the buffered path. */
static void test_stream_writer(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char buffered[4096], streamed[4096];
    snprintf(buffered, sizeof buffered, "%s", tu_path(dir, "buffered.gguf"));
    snprintf(streamed, sizeof streamed, "%s", tu_path(dir, "streamed.gguf"));

    struct gguf_writer *w = NULL;
    uint8_t *data[N_TSPECS];
    size_t total = 0;
    for (size_t i = 0; i < N_TSPECS; i++) {
        data[i] = tensor_data(i);
        total += tspecs[i].size;
    }
    assert_int_equal(gguf_writer_create(buffered, &w), 0);
    write_kvs(w);
    for (size_t i = 0; i < N_TSPECS; i++)
        assert_int_equal(gguf_writer_add_tensor(w, tspecs[i].name, tspecs[i].type, tspecs[i].ne,
                                                tspecs[i].n_dims, data[i], tspecs[i].size),
                         0);
    assert_int_equal(gguf_writer_finish(w), 0);

    uint8_t *all = malloc(total);
    assert_non_null(all);
    size_t off = 0;
    for (size_t i = 0; i < N_TSPECS; i++) {
        memcpy(all + off, data[i], tspecs[i].size);
        off += tspecs[i].size;
    }
    assert_int_equal(gguf_writer_create(streamed, &w), 0);
    write_kvs(w);
    for (size_t i = 0; i < N_TSPECS; i++)
        assert_int_equal(gguf_writer_add_tensor(w, tspecs[i].name, tspecs[i].type, tspecs[i].ne,
                                                tspecs[i].n_dims, NULL, tspecs[i].size),
                         0);
    assert_int_equal(gguf_writer_stream_begin(w), 0);
    for (off = 0; off < total; off += 7)
        assert_int_equal(gguf_writer_stream_write(w, all + off, total - off < 7 ? total - off : 7),
                         0);
    assert_int_equal(gguf_writer_finish(w), 0);

    size_t n1, n2;
    char *b1 = tu_read_file(buffered, &n1), *b2 = tu_read_file(streamed, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    assert_int_equal(n1 % 32, 0); /* like ggml, the last tensor is padded too */
    check_roundtrip_file(streamed);
    free(b1);
    free(b2);
    free(all);
    for (size_t i = 0; i < N_TSPECS; i++)
        free(data[i]);
    tu_rmtree(dir);
    free(dir);
}

static void test_writer_alignment_and_copy(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s", tu_path(dir, "a.gguf"));
    snprintf(dst, sizeof dst, "%s", tu_path(dir, "b.gguf"));
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(src, &w), 0);
    assert_int_equal(gguf_writer_kv_u32(w, "general.alignment", 64), 0);
    write_kvs(w);
    float x[3] = {1, 2, 3};
    const uint64_t ne[1] = {3};
    assert_int_equal(gguf_writer_add_tensor(w, "x", GGUF_GGML_F32, ne, 1, x, 12), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "y", GGUF_GGML_F32, ne, 1, x, 12), 0);
    assert_int_equal(gguf_writer_finish(w), 0);

    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(src, &f), 0);
    assert_int_equal(f->alignment, 64);
    assert_int_equal(f->tensors[1].offset, 64);
    assert_int_equal((f->data_base - (const uint8_t *)f->map) % 64, 0);

    /* every key copied through gguf_writer_kv_copy reads back identical */
    assert_int_equal(gguf_writer_create(dst, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        assert_int_equal(gguf_writer_kv_copy(w, &f->kv[i]), 0);
    assert_int_equal(gguf_writer_finish(w), 0);
    struct gguf_file *g = NULL;
    assert_int_equal(gguf_open(dst, &g), 0);
    assert_int_equal(g->n_kv, f->n_kv);
    assert_int_equal(g->alignment, 64);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *a = &f->kv[i], *b = &g->kv[i];
        assert_int_equal(a->key.len, b->key.len);
        assert_memory_equal(a->key.ptr, b->key.ptr, a->key.len);
        assert_int_equal(a->type, b->type);
        assert_int_equal(a->arr_type, b->arr_type);
        assert_int_equal(a->arr_n, b->arr_n);
        assert_int_equal(a->str.len, b->str.len);
        if (a->str.len)
            assert_memory_equal(a->str.ptr, b->str.ptr, a->str.len);
        if (a->strs)
            for (uint64_t j = 0; j < a->arr_n; j++)
                assert_true(a->strs[j].len == b->strs[j].len &&
                            memcmp(a->strs[j].ptr, b->strs[j].ptr, a->strs[j].len) == 0);
    }
    gguf_close(g);
    gguf_close(f);
    tu_rmtree(dir);
    free(dir);
}

static void test_writer_misuse(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "w.gguf");
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    float x[64] = {0};
    uint64_t ne[2] = {4, 2};
    tu_log_capture_begin();
    assert_int_equal(gguf_writer_kv_u32(w, "k", 1), 0);
    assert_int_equal(gguf_writer_kv_str(w, "k", "again"), ERR_USAGE);
    tu_assert_log_contains("duplicate key 'k'", NULL);
    assert_int_equal(gguf_writer_kv_u32(w, "general.alignment", 48), ERR_USAGE);
    tu_assert_log_contains("general.alignment 48", NULL);
    assert_int_equal(gguf_writer_kv_u32(w, "bad\nkey", 1), ERR_USAGE);
    assert_int_equal(gguf_writer_add_tensor(w, "t", GGUF_GGML_F32, ne, 2, x, 32), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "t", GGUF_GGML_F32, ne, 2, x, 32), ERR_USAGE);
    tu_assert_log_contains("duplicate tensor 't'", NULL);
    assert_int_equal(gguf_writer_add_tensor(w, "u", GGUF_GGML_F32, ne, 2, x, 31), ERR_USAGE);
    tu_assert_log_contains("tensor 'u': size 31", "32 bytes", NULL);
    assert_int_equal(gguf_writer_add_tensor(w, "v", GGUF_GGML_Q8_0, ne, 2, x, 34), ERR_USAGE);
    tu_assert_log_contains("tensor 'v'", "q8_0", NULL);
    assert_int_equal(gguf_writer_add_tensor(w, "w", 11 /* q3_K */, ne, 2, x, 32), ERR_USAGE);
    tu_assert_log_contains("tensor 'w'", "q3_K", NULL);
    assert_int_equal(gguf_writer_add_tensor(w, "x", GGUF_GGML_F32, ne, 0, x, 32), ERR_USAGE);
    assert_int_equal(gguf_writer_add_tensor(w, "y", GGUF_GGML_F32, ne, 5, x, 32), ERR_USAGE);
    assert_int_equal(gguf_writer_add_tensor(w,
                                            "a_name_that_is_far_too_long_for_ggml_to_load_it_"
                                            "because_it_exceeds_63_bytes",
                                            GGUF_GGML_F32, ne, 2, x, 32),
                     ERR_USAGE);
    assert_int_equal(gguf_writer_stream_write(w, x, 4), ERR_USAGE);
    assert_int_equal(gguf_writer_add_tensor(w, "z", GGUF_GGML_F32, ne, 2, NULL, 32), 0);
    /* z was declared for streaming but the stream never began: nothing is written */
    assert_int_equal(gguf_writer_finish(w), ERR_USAGE);
    tu_assert_log_contains("tensor 'z' has no data", NULL);
    assert_true(dir_is_empty(dir));

    /* streaming: too much data, then too little */
    assert_int_equal(gguf_writer_create(path, &w), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "t", GGUF_GGML_F32, ne, 2, NULL, 32), 0);
    assert_int_equal(gguf_writer_stream_begin(w), 0);
    assert_int_equal(gguf_writer_kv_u32(w, "late", 1), ERR_USAGE);
    assert_int_equal(gguf_writer_stream_write(w, x, 40), ERR_USAGE);
    tu_assert_log_contains("beyond the declared tensors", NULL);
    gguf_writer_abort(w);
    assert_true(dir_is_empty(dir));
    assert_int_equal(gguf_writer_create(path, &w), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "t", GGUF_GGML_F32, ne, 2, NULL, 32), 0);
    assert_int_equal(gguf_writer_stream_begin(w), 0);
    assert_int_equal(gguf_writer_stream_write(w, x, 20), 0);
    assert_int_equal(gguf_writer_finish(w), ERR_USAGE);
    tu_assert_log_contains("tensor 't': only 20 of its 32 bytes", NULL);
    assert_true(dir_is_empty(dir));
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* A full disk mid-write leaves no file, final or temporary. */
static void test_writer_disk_full(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "full.gguf");
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    write_kvs(w);
    uint8_t *data = calloc(1, 4096);
    const uint64_t ne[1] = {1024};
    assert_int_equal(gguf_writer_add_tensor(w, "t", GGUF_GGML_F32, ne, 1, data, 4096), 0);
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "1000", 1);
    tu_log_capture_begin();
    assert_int_equal(gguf_writer_finish(w), -ENOSPC);
    tu_assert_log_contains("full.gguf", NULL);
    tu_log_capture_end();
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    assert_true(dir_is_empty(dir));
    free(data);
    tu_rmtree(dir);
    free(dir);
}

/* ---- real fixtures ---------------------------------------------------------------------- */

static void test_fixture_llama_spm(void **state)
{
    (void)state;
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(tu_fixture("tokenizer/ggml-vocab-llama-spm.gguf"), &f), 0);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_kv, 22);
    assert_int_equal(f->n_tensors, 0);
    struct gguf_str s;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(tok);
    assert_int_equal(tok->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(tok->arr_n, 32000);
    assert_true(gguf_str_eq(tok->strs[0], "<unk>"));
    assert_true(gguf_str_eq(tok->strs[1], "<s>"));
    assert_true(gguf_str_eq(tok->strs[2], "</s>"));
    assert_true(gguf_str_eq(tok->strs[13], "<0x0A>"));
    assert_true(gguf_str_eq(tok->strs[450], "\xe2\x96\x81The"));
    assert_true(gguf_str_eq(tok->strs[31999], "\xe7\xbb\x99"));
    const struct gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    assert_non_null(scores);
    assert_int_equal(scores->arr_n, 32000);
    double d;
    assert_int_equal(gguf_arr_f64(scores, 450, &d), 0);
    assert_true(d == -191.0);
    assert_int_equal(gguf_arr_f64(scores, 31999, &d), 0);
    assert_true(d == -31740.0);
    const struct gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    assert_non_null(types);
    int64_t v;
    assert_int_equal(gguf_arr_i64(types, 0, &v), 0);
    assert_int_equal(v, 2);
    assert_int_equal(gguf_arr_i64(types, 13, &v), 0);
    assert_int_equal(v, 6);
    uint32_t u;
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u), 0);
    assert_int_equal(u, 1);
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u), 0);
    assert_int_equal(u, 2);
    bool b = false;
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b), 0);
    assert_true(b);
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b), 0);
    assert_false(b);
    assert_int_equal(gguf_get_f64(f, "llama.attention.layer_norm_rms_epsilon", &d), 0);
    assert_true(fabs(d - 1e-5) < 1e-9);
    gguf_close(f);
}

static void test_fixture_gpt2(void **state)
{
    (void)state;
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(tu_fixture("tokenizer/ggml-vocab-gpt-2.gguf"), &f), 0);
    assert_int_equal(f->n_kv, 16);
    assert_int_equal(f->n_tensors, 0);
    assert_null(f->data_base); /* no tensors: the aligned data offset lies past the end */
    struct gguf_str s;
    assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s), 0);
    assert_true(gguf_str_eq(s, "gpt2"));
    const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(tok);
    assert_int_equal(tok->arr_n, 50257);
    assert_true(gguf_str_eq(tok->strs[0], "!"));
    assert_true(gguf_str_eq(tok->strs[464], "The"));
    assert_true(gguf_str_eq(tok->strs[50256], "<|endoftext|>"));
    const struct gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    assert_non_null(merges);
    assert_int_equal(merges->arr_n, 50000);
    assert_true(gguf_str_eq(merges->strs[0], "\xc4\xa0 t"));
    assert_true(gguf_str_eq(merges->strs[49999], "\xc4\xa0g azed"));
    uint32_t u;
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u), 0);
    assert_int_equal(u, 50256);
    gguf_close(f);
}

/* ---- getters ---------------------------------------------------------------------------- */

static void test_getters(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 2, 0, 7);
    bytes_gstr(&b, "u8");
    bytes_u32(&b, GGUF_TYPE_UINT8);
    bytes_u8(&b, 200);
    bytes_gstr(&b, "neg");
    bytes_u32(&b, GGUF_TYPE_INT32);
    bytes_u32(&b, (uint32_t)-5);
    bytes_gstr(&b, "huge");
    bytes_u32(&b, GGUF_TYPE_UINT64);
    bytes_u64(&b, UINT64_MAX);
    bytes_gstr(&b, "pi");
    bytes_u32(&b, GGUF_TYPE_FLOAT64);
    double pi = 3.14159;
    bytes_put(&b, &pi, 8);
    bytes_gstr(&b, "s");
    bytes_u32(&b, GGUF_TYPE_STRING);
    bytes_gstr(&b, "text");
    bytes_gstr(&b, "i16s");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, GGUF_TYPE_INT16);
    bytes_u64(&b, 2);
    bytes_u32(&b, 0xffff0003u); /* 3, -1 */
    bytes_gstr(&b, "u64s");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, GGUF_TYPE_UINT64);
    bytes_u64(&b, 1);
    bytes_u64(&b, UINT64_MAX);
    struct gguf_file *f = expect_open(&b);
    assert_int_equal(f->version, 2);

    uint32_t u;
    int64_t i;
    double d;
    bool bo;
    struct gguf_str s;
    tu_log_capture_begin();
    assert_int_equal(gguf_get_u32(f, "u8", &u), 0);
    assert_int_equal(u, 200);
    assert_int_equal(gguf_get_f64(f, "u8", &d), 0);
    assert_true(d == 200.0);
    assert_int_equal(gguf_get_i64(f, "neg", &i), 0);
    assert_int_equal(i, -5);
    assert_int_equal(gguf_get_u32(f, "neg", &u), ERR_RANGE);
    tu_assert_log_contains("ok.gguf", "key 'neg' = -5", "uint32", NULL);
    assert_int_equal(gguf_get_u32(f, "huge", &u), ERR_RANGE);
    assert_int_equal(gguf_get_i64(f, "huge", &i), ERR_RANGE);
    assert_int_equal(gguf_get_f64(f, "huge", &d), ERR_RANGE);
    assert_int_equal(gguf_get_f64(f, "pi", &d), 0);
    assert_true(d == pi);
    assert_int_equal(gguf_get_u32(f, "pi", &u), ERR_FORMAT);
    tu_assert_log_contains("key 'pi' has type float64, expected an integer", NULL);
    assert_int_equal(gguf_get_bool(f, "u8", &bo), ERR_FORMAT);
    assert_int_equal(gguf_get_str(f, "u8", &s), ERR_FORMAT);
    assert_int_equal(gguf_get_str(f, "s", &s), 0);
    assert_true(gguf_str_eq(s, "text"));
    assert_false(gguf_str_eq(s, "tex"));
    assert_int_equal(gguf_get_u32(f, "i16s", &u), ERR_FORMAT);
    tu_assert_log_contains("key 'i16s' has type array", NULL);
    assert_int_equal(gguf_get_u32(f, "absent", &u), ERR_NOT_FOUND);

    const struct gguf_kv *kv = gguf_find_kv(f, "i16s");
    assert_int_equal(gguf_arr_i64(kv, 1, &i), 0);
    assert_int_equal(i, -1);
    assert_int_equal(gguf_arr_f64(kv, 0, &d), 0);
    assert_true(d == 3.0);
    assert_int_equal(gguf_arr_i64(kv, 2, &i), ERR_RANGE);
    tu_assert_log_contains("key 'i16s': index 2 is past the end", NULL);
    assert_int_equal(gguf_arr_i64(gguf_find_kv(f, "u64s"), 0, &i), ERR_RANGE);
    assert_int_equal(gguf_arr_f64(gguf_find_kv(f, "s"), 0, &d), ERR_FORMAT);
    tu_log_capture_end();
    gguf_close(f);
    bytes_free(&b);
}

static void test_open_errors(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct gguf_file *f = NULL;
    tu_log_capture_begin();
    assert_int_equal(gguf_open(tu_path(dir, "missing.gguf"), &f), -ENOENT);
    tu_assert_log_contains("missing.gguf", NULL);
    assert_int_equal(gguf_open(dir, &f), ERR_FORMAT);
    tu_assert_log_contains("not a regular file", NULL);
    const char *empty = tu_path(dir, "empty.gguf");
    tu_write_file(empty, "", 0);
    assert_int_equal(gguf_open(empty, &f), ERR_TRUNCATED);
    tu_assert_log_contains("empty.gguf", "magic", NULL);
    tu_log_capture_end();
    assert_null(f);
    tu_rmtree(dir);
    free(dir);
}

/* ---- malformed input -------------------------------------------------------------------- */

/* Every prefix of a valid file: never a crash, never a leak; an error until the last tensor's
 * bytes are all present (only the final padding may be cut off). */
static void test_truncated_everywhere(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "t.gguf");
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    write_kvs(w);
    uint8_t *data[N_TSPECS];
    for (size_t i = 0; i < N_TSPECS; i++) {
        data[i] = tensor_data(i);
        assert_int_equal(gguf_writer_add_tensor(w, tspecs[i].name, tspecs[i].type, tspecs[i].ne,
                                                tspecs[i].n_dims, data[i], tspecs[i].size),
                         0);
    }
    assert_int_equal(gguf_writer_finish(w), 0);
    size_t n;
    char *whole = tu_read_file(path, &n);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_mem(whole, n, "t.gguf", &f), 0);
    const struct gguf_tensor *last = &f->tensors[N_TSPECS - 1];
    size_t need = (size_t)((const uint8_t *)last->data - (const uint8_t *)whole) + last->size;
    gguf_close(f);

    tu_log_capture_begin();
    for (size_t len = 0; len < n; len++) {
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, whole, len);
        f = NULL;
        int rc = gguf_open_mem(cut, len, "t.gguf", &f);
        if (len < need) {
            if (rc == 0)
                fail_msg("a %zu-byte prefix (of %zu) was accepted", len, n);
            assert_true(rc == ERR_TRUNCATED || rc == ERR_FORMAT);
            assert_non_null(strstr(tu_log_captured(), "t.gguf"));
        } else {
            assert_int_equal(rc, 0);
            gguf_close(f);
        }
        free(cut);
    }
    tu_log_capture_end();
    free(whole);
    for (size_t i = 0; i < N_TSPECS; i++)
        free(data[i]);
    tu_rmtree(dir);
    free(dir);
}

static void test_bad_magic(void **state)
{
    (void)state;
    struct bytes b = {0};
    build_small(&b);
    memcpy(b.p, "GGML", 4);
    expect_fail(&b, ERR_FORMAT, "not a GGUF file", "magic");
    bytes_free(&b);
}

static void test_version1(void **state)
{
    (void)state;
    struct bytes b = {0};
    build_small(&b);
    uint32_t v = 1;
    memcpy(b.p + 4, &v, 4);
    expect_fail(&b, ERR_UNSUPPORTED, "GGUF version 1 is not supported", NULL);
    bytes_free(&b);
}

static void test_versions(void **state)
{
    (void)state;
    struct bytes b = {0};
    build_small(&b);
    uint32_t v = 4;
    memcpy(b.p + 4, &v, 4);
    expect_fail(&b, ERR_UNSUPPORTED, "GGUF version 4 is not supported", NULL);
    v = 3u << 24; /* a big-endian v3 file read as little-endian */
    memcpy(b.p + 4, &v, 4);
    expect_fail(&b, ERR_UNSUPPORTED, "big-endian", NULL);
    v = 2;
    memcpy(b.p + 4, &v, 4);
    struct gguf_file *f = expect_open(&b);
    assert_int_equal(f->version, 2);
    gguf_close(f);
    bytes_free(&b);
}

static void test_huge_key_length(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_u64(&b, 1ull << 62); /* key length */
    bytes_put(&b, "abcdefgh", 8);
    expect_fail(&b, ERR_TRUNCATED, "key #0", "4611686018427387904");
    bytes_free(&b);
}

static void test_huge_string_value(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "general.name");
    bytes_u32(&b, GGUF_TYPE_STRING);
    bytes_u64(&b, UINT64_MAX - 3);
    bytes_put(&b, "tiny", 4);
    expect_fail(&b, ERR_TRUNCATED, "the value of key 'general.name'", NULL);
    bytes_free(&b);
}

static void test_huge_array_count(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "tokenizer.ggml.scores");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, GGUF_TYPE_FLOAT32);
    bytes_u64(&b, 1ull << 62); /* × 4 bytes would wrap to 0 without the division test */
    bytes_u32(&b, 0);
    expect_fail(&b, ERR_TRUNCATED, "key 'tokenizer.ggml.scores'", "array of 4611686018427387904");
    bytes_free(&b);

    /* a string array whose count exceeds what the bytes could hold: refused before allocating */
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "tokenizer.ggml.tokens");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, GGUF_TYPE_STRING);
    bytes_u64(&b, 1ull << 40);
    bytes_gstr(&b, "a");
    expect_fail(&b, ERR_TRUNCATED, "key 'tokenizer.ggml.tokens'", "1099511627776 strings");
    bytes_free(&b);

    /* one string of the array runs past the end */
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "tokenizer.ggml.tokens");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, GGUF_TYPE_STRING);
    bytes_u64(&b, 3);
    bytes_gstr(&b, "a");
    bytes_gstr(&b, "b");
    bytes_u64(&b, 1000);
    bytes_put(&b, "c", 1);
    expect_fail(&b, ERR_TRUNCATED, "key 'tokenizer.ggml.tokens' string 2", NULL);
    bytes_free(&b);
}

static void test_huge_n_kv(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, UINT64_MAX);
    bytes_pad(&b, 64);
    expect_fail(&b, ERR_FORMAT, "n_kv 18446744073709551615 is impossible", NULL);
    bytes_free(&b);
}

static void test_huge_tensor_count(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 1ull << 60, 0);
    bytes_pad(&b, 64);
    expect_fail(&b, ERR_FORMAT, "n_tensors 1152921504606846976 is impossible", NULL);
    bytes_free(&b);
    /* plausible against the whole file, impossible against what follows the keys */
    bytes_gguf_header(&b, 3, 3, 1);
    bytes_gstr(&b, "k");
    bytes_u32(&b, GGUF_TYPE_STRING);
    bytes_gstr(&b, "a long value that eats most of the file, leaving room for one tensor info, "
                   "not three");
    bytes_pad(&b, 8);
    expect_fail(&b, ERR_FORMAT, "n_tensors 3 is impossible", "after the key-value pairs");
    bytes_free(&b);
}

static void test_tensor_beyond_file(void **state)
{
    (void)state;
    struct bytes b = {0};
    build_small(&b);
    b.len -= 4; /* cut the last element of tensor 'b' */
    expect_fail(&b, ERR_TRUNCATED, "tensor 'b': offset 32 + size 24 is beyond the end of the file",
                NULL);
    bytes_free(&b);

    static const uint64_t ne[1] = {4};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "far", 1, ne, GGUF_GGML_F32, UINT64_MAX - 31); /* offset+size wraps */
    bytes_pad(&b, 32);
    bytes_put(&b, "0123456789abcdef", 16);
    expect_fail(&b, ERR_TRUNCATED, "tensor 'far': offset 18446744073709551584", NULL);
    bytes_free(&b);
}

static void test_overlapping_tensors(void **state)
{
    (void)state;
    static const uint64_t ne8[1] = {8}, ne4[1] = {4};
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 3, 0);
    bytes_gguf_tensor(&b, "first", 1, ne4, GGUF_GGML_F32, 64);
    bytes_gguf_tensor(&b, "wide", 1, ne8, GGUF_GGML_F32, 0); /* bytes 0..32 */
    bytes_gguf_tensor(&b, "inside", 1, ne4, GGUF_GGML_F32, 0);
    bytes_pad(&b, 32);
    uint8_t zero[96] = {0};
    bytes_put(&b, zero, sizeof zero);
    /* the message says why the earlier tensor is that long: its type and shape */
    expect_fail(&b, ERR_FORMAT, "overlaps tensor",
                "'inside' (bytes 0..16: 16 bytes for f32 of shape [4])");
    bytes_free(&b);
}

static void test_misaligned_offset(void **state)
{
    (void)state;
    static const uint64_t ne[1] = {4};
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "blk.0.attn_q.weight", 1, ne, GGUF_GGML_F32, 4);
    bytes_pad(&b, 32);
    uint8_t zero[64] = {0};
    bytes_put(&b, zero, sizeof zero);
    expect_fail(&b, ERR_FORMAT, "tensor 'blk.0.attn_q.weight': offset 4 is not a multiple of the "
                "alignment 32", NULL);
    bytes_free(&b);
}

static void test_bad_alignment_key(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gguf_kv_u32(&b, "general.alignment", 24);
    expect_fail(&b, ERR_FORMAT, "general.alignment", "24 is not a power of two");
    bytes_free(&b);
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "general.alignment");
    bytes_u32(&b, GGUF_TYPE_UINT64);
    bytes_u64(&b, 32);
    expect_fail(&b, ERR_FORMAT, "general.alignment' has type uint64, expected uint32", NULL);
    bytes_free(&b);
}

static void test_zero_dimension(void **state)
{
    (void)state;
    struct bytes b = {0};
    uint64_t ne[2] = {4, 0};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "zero", 2, ne, GGUF_GGML_F32, 0);
    bytes_pad(&b, 64);
    expect_fail(&b, ERR_FORMAT, "tensor 'zero': dimension ne[1] is 0", NULL);
    bytes_free(&b);
}

static void test_dimension_overflow(void **state)
{
    (void)state;
    struct bytes b = {0};
    /* 16 bytes per row x 2^64 rows: the byte size overflows 64 bits */
    const uint64_t ne[3] = {4, 1ull << 32, 1ull << 32};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "vast", 3, ne, GGUF_GGML_F32, 0);
    bytes_pad(&b, 64);
    expect_fail(&b, ERR_OVERFLOW, "tensor 'vast': the byte size of shape [4, 4294967296, "
                "4294967296] of f32 overflows", NULL);
    bytes_free(&b);
}

static void test_bad_dims(void **state)
{
    (void)state;
    struct bytes b = {0};
    uint64_t ne[5] = {4, 2, 2, 1, 1};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "five", 5, ne, GGUF_GGML_F32, 0);
    bytes_pad(&b, 64);
    expect_fail(&b, ERR_FORMAT, "tensor 'five': n_dims 5 is outside 1..4", NULL);
    bytes_free(&b);

    ne[0] = 33; /* not a whole number of q8_0 blocks */
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "ragged", 1, ne, GGUF_GGML_Q8_0, 0);
    bytes_pad(&b, 64);
    expect_fail(&b, ERR_FORMAT, "tensor 'ragged': row length ne[0] = 33", "q8_0 block size 32");
    bytes_free(&b);
}

static void test_unknown_tensor_type(void **state)
{
    (void)state;
    static const uint64_t ne[2] = {256, 2};
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "t", 2, ne, 4 /* Q4_2, removed from ggml */, 0);
    bytes_pad(&b, 32);
    expect_fail(&b, ERR_FORMAT, "tensor 't': unknown ggml type 4", NULL);
    bytes_free(&b);
    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gguf_tensor(&b, "t", 2, ne, 1000, 0);
    bytes_pad(&b, 32);
    expect_fail(&b, ERR_FORMAT, "tensor 't': unknown ggml type 1000", NULL);
    bytes_free(&b);
}

static void test_tensor_types(void **state)
{
    (void)state;
    static const uint64_t ne[2] = {256, 2};
    struct bytes b = {0};

    /* a real ggml type we do not read: listed, sized, range-checked, but without data */
    bytes_gguf_header(&b, 3, 2, 0);
    bytes_gguf_tensor(&b, "k", 2, ne, 11 /* q3_K */, 0);
    bytes_gguf_tensor(&b, "f", 1, ne, GGUF_GGML_F32, 224); /* 2 x 110 bytes, aligned */
    bytes_pad(&b, 32);
    uint8_t blob[288 + 1024] = {0};
    bytes_put(&b, blob, sizeof blob);
    struct gguf_file *f = expect_open(&b);
    const struct gguf_tensor *t = gguf_find_tensor(f, "k");
    assert_non_null(t);
    assert_int_equal(t->size, 2 * 110);
    assert_null(t->data);
    assert_string_equal(gguf_ggml_type_name(t->type), "q3_K");
    assert_false(gguf_ggml_type_supported(t->type));
    assert_non_null(gguf_find_tensor(f, "f")->data);
    gguf_close(f);
    bytes_free(&b);
    assert_null(gguf_ggml_type_name(4));
    assert_string_equal(gguf_ggml_type_name(GGUF_GGML_BF16), "bf16");
    assert_string_equal(gguf_ggml_type_name(GGUF_GGML_MXFP4), "mxfp4");
    /* the supported types map onto the project's dtypes with the same block layout */
    static const uint32_t g[] = {GGUF_GGML_F32,  GGUF_GGML_F16,  GGUF_GGML_BF16,
                                 GGUF_GGML_Q8_0, GGUF_GGML_Q4_0, GGUF_GGML_MXFP4};
    static const enum dtype want[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_MXFP4};
    for (int i = 0; i < 6; i++) {
        enum dtype dt;
        assert_int_equal(gguf_ggml_type_to_dtype(g[i], &dt), 0);
        assert_int_equal(dt, want[i]);
        uint64_t ne32 = 64, bytes = 0, gbytes = 0;
        assert_int_equal(dtype_row_bytes(dt, ne32, &bytes), 0);
        assert_int_equal(tensor_bytes_for_test(g[i], 64, &gbytes), 0);
        assert_int_equal(bytes, gbytes);
    }
    /* the k-quants (super-blocks of 256): q4_K, q5_K, q6_K */
    static const uint32_t gk[] = {GGUF_GGML_Q4_K, GGUF_GGML_Q5_K, GGUF_GGML_Q6_K};
    static const enum dtype wantk[] = {DT_Q4_K, DT_Q5_K, DT_Q6_K};
    static const char *const namek[] = {"q4_K", "q5_K", "q6_K"};
    for (int i = 0; i < 3; i++) {
        enum dtype dt;
        assert_true(gguf_ggml_type_supported(gk[i]));
        assert_string_equal(gguf_ggml_type_name(gk[i]), namek[i]);
        assert_int_equal(gguf_ggml_type_to_dtype(gk[i], &dt), 0);
        assert_int_equal(dt, wantk[i]);
        uint64_t bytes = 0, gbytes = 0;
        assert_int_equal(dtype_row_bytes(dt, 512, &bytes), 0);
        assert_int_equal(tensor_bytes_for_test(gk[i], 512, &gbytes), 0);
        assert_int_equal(bytes, gbytes);
    }
    enum dtype dt;
    assert_int_equal(gguf_ggml_type_to_dtype(11 /* q3_K */, &dt), ERR_NOT_FOUND);
    assert_int_equal(gguf_ggml_type_to_dtype(15 /* q8_K */, &dt), ERR_NOT_FOUND);
}

static void test_unknown_value_type(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "general.weird");
    bytes_u32(&b, 13);
    bytes_u64(&b, 0);
    expect_fail(&b, ERR_FORMAT, "key 'general.weird': unknown value type 13", NULL);
    bytes_free(&b);
    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "general.weird_array");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, 99);
    bytes_u64(&b, 0);
    expect_fail(&b, ERR_FORMAT, "key 'general.weird_array': unknown array element type 99", NULL);
    bytes_free(&b);
}

static void test_bad_values(void **state)
{
    (void)state;
    struct bytes b = {0};

    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "nested");
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u32(&b, GGUF_TYPE_ARRAY);
    bytes_u64(&b, 1);
    bytes_u32(&b, GGUF_TYPE_UINT8);
    bytes_u64(&b, 1);
    bytes_u8(&b, 0);
    expect_fail(&b, ERR_UNSUPPORTED, "key 'nested': arrays of arrays are not supported", NULL);
    bytes_free(&b);

    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "flag");
    bytes_u32(&b, GGUF_TYPE_BOOL);
    bytes_u8(&b, 2);
    expect_fail(&b, ERR_FORMAT, "key 'flag': bool 0 has value 2", NULL);
    bytes_free(&b);

    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "bad\x01key");
    bytes_u32(&b, GGUF_TYPE_UINT8);
    bytes_u8(&b, 2);
    expect_fail(&b, ERR_FORMAT, "key #0: byte 3 (0x01) is not printable ASCII", NULL);
    bytes_free(&b);

    bytes_gguf_header(&b, 3, 0, 1);
    bytes_gstr(&b, "");
    bytes_u32(&b, GGUF_TYPE_UINT8);
    bytes_u8(&b, 2);
    bytes_pad(&b, 32);
    expect_fail(&b, ERR_FORMAT, "key #0: length 0", NULL);
    bytes_free(&b);
}

static void test_duplicate_key(void **state)
{
    (void)state;
    struct bytes b = {0};
    bytes_gguf_header(&b, 3, 0, 3);
    bytes_gguf_kv_u32(&b, "llama.block_count", 2);
    bytes_gguf_kv_u32(&b, "llama.context_length", 2);
    bytes_gguf_kv_u32(&b, "llama.block_count", 3);
    expect_fail(&b, ERR_FORMAT, "duplicate key 'llama.block_count'", "#0 and key #2");
    bytes_free(&b);
}

static void test_bad_tensor_names(void **state)
{
    (void)state;
    struct bytes b = {0};
    static const uint64_t ne[1] = {4};
    bytes_gguf_header(&b, 3, 2, 0);
    bytes_gguf_tensor(&b, "output.weight", 1, ne, GGUF_GGML_F32, 0);
    bytes_gguf_tensor(&b, "output.weight", 1, ne, GGUF_GGML_F32, 32);
    bytes_pad(&b, 32);
    uint8_t zero[64] = {0};
    bytes_put(&b, zero, sizeof zero);
    expect_fail(&b, ERR_FORMAT, "duplicate tensor name 'output.weight'", NULL);
    bytes_free(&b);

    bytes_gguf_header(&b, 3, 1, 0);
    bytes_gstr(&b, "ctl\nname");
    bytes_u32(&b, 1);
    bytes_u64(&b, 4);
    bytes_u32(&b, 0);
    bytes_u64(&b, 0);
    bytes_pad(&b, 32);
    bytes_put(&b, zero, 16);
    expect_fail(&b, ERR_FORMAT, "tensor #0: name byte 3 is control character 0x0a", NULL);
    bytes_free(&b);
}

/* Many keys and tensors: lookups find each one (exercises hash collisions and growth). */
static void test_many_names(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *path = tu_path(dir, "many.gguf");
    struct gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    enum { N = 3000 };
    float v = 1.0f;
    const uint64_t ne[1] = {1};
    char name[64];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "key.%d", i);
        assert_int_equal(gguf_writer_kv_u32(w, name, (uint32_t)i), 0);
        snprintf(name, sizeof name, "blk.%d.weight", i);
        assert_int_equal(gguf_writer_add_tensor(w, name, GGUF_GGML_F32, ne, 1, &v, 4), 0);
    }
    assert_int_equal(gguf_writer_finish(w), 0);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f), 0);
    assert_int_equal(f->n_kv, N);
    assert_int_equal(f->n_tensors, N);
    for (int i = 0; i < N; i++) {
        uint32_t u;
        snprintf(name, sizeof name, "key.%d", i);
        assert_int_equal(gguf_get_u32(f, name, &u), 0);
        assert_int_equal(u, (uint32_t)i);
        snprintf(name, sizeof name, "blk.%d.weight", i);
        const struct gguf_tensor *t = gguf_find_tensor(f, name);
        assert_ptr_equal(t, &f->tensors[i]);
        assert_int_equal(t->offset, (uint64_t)i * 32);
    }
    gguf_close(f);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_types),
        cmocka_unit_test(test_stream_writer),
        cmocka_unit_test(test_writer_alignment_and_copy),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_writer_disk_full),
        cmocka_unit_test(test_fixture_llama_spm),
        cmocka_unit_test(test_fixture_gpt2),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_version1),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_huge_key_length),
        cmocka_unit_test(test_huge_string_value),
        cmocka_unit_test(test_huge_array_count),
        cmocka_unit_test(test_huge_n_kv),
        cmocka_unit_test(test_huge_tensor_count),
        cmocka_unit_test(test_tensor_beyond_file),
        cmocka_unit_test(test_overlapping_tensors),
        cmocka_unit_test(test_misaligned_offset),
        cmocka_unit_test(test_bad_alignment_key),
        cmocka_unit_test(test_zero_dimension),
        cmocka_unit_test(test_dimension_overflow),
        cmocka_unit_test(test_bad_dims),
        cmocka_unit_test(test_unknown_tensor_type),
        cmocka_unit_test(test_tensor_types),
        cmocka_unit_test(test_unknown_value_type),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_bad_tensor_names),
        cmocka_unit_test(test_many_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
