/* test_common.c — error codes, half/bfloat conversions, dtype sizes, atomic files. */
#include "testutil.h"

#include "afile.h"
#include "dtype.h"
#include "err.h"
#include "fmap.h"
#include "half.h"
#include "heap.h"
#include "jfield.h"
#include "mono.h"
#include "path.h"
#include "rng.h"
#include "vec.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_err_text(void **state)
{
    (void)state;
    assert_string_equal(err_str(0), "ok");
    assert_string_equal(err_name(ERR_FORMAT), "ERR_FORMAT");
    assert_string_equal(err_str(ERR_FORMAT), "malformed input");
    assert_string_equal(err_name(-ENOENT), "ENOENT");
    assert_non_null(strstr(err_str(-ENOENT), "No such file"));
}

static void test_half_roundtrip(void **state)
{
    (void)state;
    /* every f16 bit pattern converts to f32 and back unchanged (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = half_f16_to_f32((uint16_t)h);
        uint16_t back = half_f32_to_f16(f);
        if (isnan(f))
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
        else
            assert_int_equal(back, h);
    }
    /* round to nearest even at the f16 halfway points */
    assert_int_equal(half_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);
    assert_int_equal(half_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);
    assert_int_equal(half_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(half_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(half_f32_to_f16(5.96046448e-08f), 0x0001); /* smallest subnormal */
    assert_int_equal(half_f32_to_f16(2.98023224e-08f), 0x0000); /* halfway → even (0) */
    /* bf16 */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = half_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(half_f32_to_bf16(f), h);
    }
    assert_int_equal(half_f32_to_bf16(half_bits_f32(0x3f808000u)), 0x3f80); /* tie → even */
    assert_int_equal(half_f32_to_bf16(half_bits_f32(0x3f818000u)), 0x3f82);
}

static void test_dtype_sizes(void **state)
{
    (void)state;
    uint64_t n;
    uint64_t s2[2] = {3, 64};
    assert_int_equal(dtype_tensor_bytes(DT_F32, s2, 2, &n), 0);
    assert_int_equal(n, 3 * 64 * 4);
    assert_int_equal(dtype_tensor_bytes(DT_Q8_0, s2, 2, &n), 0);
    assert_int_equal(n, 3 * 2 * 34);
    assert_int_equal(dtype_tensor_bytes(DT_Q4_0, s2, 2, &n), 0);
    assert_int_equal(n, 3 * 2 * 18);
    uint64_t ragged[2] = {3, 40};
    assert_int_equal(dtype_tensor_bytes(DT_Q4_0, ragged, 2, &n), ERR_FORMAT);
    uint64_t zero[2] = {0, 64};
    assert_int_equal(dtype_tensor_bytes(DT_F32, zero, 2, &n), ERR_RANGE);
    uint64_t huge[3] = {UINT64_C(1) << 40, UINT64_C(1) << 30, 16};
    assert_int_equal(dtype_tensor_bytes(DT_F32, huge, 3, &n), ERR_OVERFLOW);
    uint64_t huge_row[1] = {UINT64_MAX};
    assert_int_equal(dtype_tensor_bytes(DT_F32, huge_row, 1, &n), ERR_OVERFLOW);
    assert_int_equal(dtype_tensor_bytes(DT_F32, s2, 0, &n), ERR_RANGE);
    assert_int_equal(dtype_tensor_bytes(DT_F32, s2, 5, &n), ERR_RANGE);
    enum dtype dt;
    assert_int_equal(dtype_from_name("bf16", &dt), 0);
    assert_int_equal(dt, DT_BF16);
    assert_int_equal(dtype_from_name("f64", &dt), ERR_NOT_FOUND);
}

static void test_afile_commit_and_abort(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *p = tu_path(dir, "out.bin");
    struct afile af;
    assert_int_equal(afile_open(&af, p), 0);
    assert_int_equal(afile_write(&af, "abc", 3), 0);
    assert_int_equal(afile_pad(&af, 64), 0);
    assert_int_equal(access(p, F_OK), -1); /* invisible until committed */
    assert_int_equal(afile_commit(&af), 0);
    size_t len;
    char *got = tu_read_file(p, &len);
    assert_int_equal(len, 64);
    assert_memory_equal(got, "abc", 3);
    free(got);

    /* a simulated full disk fails the write and leaves no temporary behind */
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "10", 1);
    const char *q = tu_path(dir, "full.bin");
    assert_int_equal(afile_open(&af, q), 0);
    assert_int_equal(afile_write(&af, "0123456789abc", 13), -ENOSPC);
    afile_abort(&af);
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    assert_int_equal(access(q, F_OK), -1);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    char *out;
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_int_equal(atoi(out), 1); /* only out.bin */
    free(out);

    /* a directory that does not exist: a clean error */
    assert_int_equal(afile_open(&af, "/nonexistent-dir/x.bin"), -ENOENT);
    tu_rmtree(dir);
    free(dir);
}

struct item {
    uint32_t key, seq;
};

static bool item_before(const void *pa, const void *pb)
{
    const struct item *a = pa, *b = pb;
    return a->key < b->key || (a->key == b->key && a->seq < b->seq);
}

/* random pushes interleaved with pops come out in (key, seq) order, from a tiny first
 * allocation that must grow several times */
static void test_heap_order(void **state)
{
    (void)state;
    struct heap h;
    heap_init(&h, sizeof(struct item), 1, item_before);
    struct item out;
    assert_false(heap_pop(&h, &out));
    uint32_t x = 12345, seq = 0;
    size_t popped = 0;
    for (int round = 0; round < 2000; round++) {
        x = x * 1103515245u + 12345u;
        struct item it = {(x >> 16) % 97, seq++};
        assert_int_equal(heap_push(&h, &it), 0);
        if (round % 3 == 2) { /* pops between pushes: the heap invariant must hold after each */
            assert_true(heap_pop(&h, &out));
            popped++;
            for (size_t i = 1; i < h.n; i++)
                assert_false(item_before(h.data + i * h.elem, h.data + ((i - 1) / 2) * h.elem));
        }
    }
    struct item prev = {0, 0};
    bool first = true;
    while (heap_pop(&h, &out)) {
        if (!first)
            assert_false(item_before(&out, &prev));
        prev = out, first = false;
        popped++;
    }
    assert_int_equal(popped, 2000);
    heap_clear(&h);
    heap_fini(&h);
}

/* fmap: a map and a capped read of the same file agree; directories, missing files and
 * files over the cap are refused with a message naming the file and its role */
static void test_fmap(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *p = tu_path(dir, "f.json");
    tu_write_file(p, "{\"a\": 1}", 8);
    struct fmap m;
    assert_int_equal(fmap_open(p, "config", &m), 0);
    assert_int_equal(m.size, 8);
    char *buf;
    size_t len;
    assert_int_equal(fmap_read(p, "config", 8, &buf, &len), 0);
    assert_int_equal(len, 8);
    assert_memory_equal(buf, m.data, 8);
    assert_int_equal(buf[8], '\0');
    free(buf);
    fmap_close(&m);
    fmap_close(&m); /* twice is harmless */

    tu_log_capture_begin();
    assert_int_equal(fmap_read(p, "config", 7, &buf, &len), ERR_RANGE);
    tu_assert_log_contains("f.json", "config", "8 bytes, larger than the 7-byte limit", NULL);
    assert_null(buf);
    tu_log_capture_begin();
    assert_int_equal(fmap_open(dir, "GGUF file", &m), ERR_FORMAT);
    tu_assert_log_contains("the GGUF file is not a regular file", NULL);
    tu_log_capture_begin();
    assert_int_equal(fmap_read(tu_path(dir, "nope"), "tokenizer", 10, &buf, &len), -ENOENT);
    tu_assert_log_contains("nope: cannot open the tokenizer", NULL);

    /* an empty file maps to nothing and reads as "" */
    const char *e = tu_path(dir, "empty");
    tu_write_file(e, "", 0);
    assert_int_equal(fmap_open(e, "blob", &m), 0);
    assert_null(m.data);
    assert_int_equal(fmap_read(e, "blob", 0, &buf, &len), 0);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    free(buf);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* path_join: "dir/name", even with empty parts; path_mkdir_p: creates nested directories,
 * accepts existing ones, and refuses an empty path and a file in the way with a message */
static void test_path(void **state)
{
    (void)state;
    char *j = path_join("a/b", "c.json");
    assert_string_equal(j, "a/b/c.json");
    free(j);
    j = path_join("", "x");
    assert_string_equal(j, "/x");
    free(j);
    j = path_join("d", "");
    assert_string_equal(j, "d/");
    free(j);

    char *dir = tu_mkdtemp();
    char *deep = path_join(dir, "a/b/c");
    struct stat st;
    assert_int_equal(path_mkdir_p(deep), 0);
    assert_int_equal(stat(deep, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(path_mkdir_p(deep), 0); /* already there */
    char *slash = path_join(deep, "d/"); /* a trailing slash */
    assert_int_equal(path_mkdir_p(slash), 0);
    assert_int_equal(stat(slash, &st), 0);
    free(slash);

    tu_write_file(tu_path(dir, "file"), "x", 1);
    tu_log_capture_begin();
    assert_int_equal(path_mkdir_p(tu_path(dir, "file")), -ENOTDIR);
    tu_assert_log_contains("cannot create directory", "file", "Not a directory", NULL);
    tu_log_capture_begin();
    assert_int_equal(path_mkdir_p(tu_path(dir, "file/sub")), -ENOTDIR);
    tu_assert_log_contains("cannot create directory", "file/sub", NULL);
    tu_log_capture_begin();
    assert_int_equal(path_mkdir_p(""), -EINVAL);
    tu_assert_log_contains("empty path", NULL);
    tu_log_capture_end();
    free(deep);
    tu_rmtree(dir);
    free(dir);
}

/* mono_ns / mono_sec: never go back, and agree with each other */
static void test_mono(void **state)
{
    (void)state;
    uint64_t a = mono_ns();
    double s = mono_sec();
    uint64_t b = mono_ns();
    assert_true(a > 0);
    assert_true(b >= a);
    assert_true(s * 1e9 >= (double)a - 1e3 && s * 1e9 <= (double)b + 1e3);
}

/* The generators' sequences are pinned: the sampler, `clocher synth` and the tests' data
 * depend on them bit for bit. Reference values: SplitMix64 from 0, Marsaglia's xorshift
 * papers' seeds. */
static void test_rng(void **state)
{
    (void)state;
    uint64_t s = 0;
    assert_true(rng_splitmix64(&s) == 0xe220a8397b1dcdafull);
    assert_true(rng_splitmix64(&s) == 0x6e789e6aa1b965f4ull);
    uint64_t x = 88172645463325252ull;
    assert_true(rng_xorshift64(&x) == 8748534153485358512ull);
    assert_true(rng_xorshift64(&x) == 3040900993826735515ull);
    assert_true(x == 3040900993826735515ull); /* the state is the last output */
    uint32_t y = 2463534242u;
    assert_int_equal(rng_xorshift32(&y), 723471715u);
    assert_int_equal(rng_xorshift32(&y), 2497366906u);

    /* the draws at the ends of their ranges */
    assert_true(rng_unit_f64(0) == 0.0);
    assert_true(rng_unit_f64(UINT64_MAX) == 1.0 - 0x1p-53);
    assert_true(rng_signed_f32(0) == -1.0f);
    assert_true(rng_signed_f32(UINT64_MAX) == 1.0f - 0x1p-23f);
    assert_true(rng_signed_f32(1ull << 63) == 0.0f);

    /* tu_fill_bytes is xorshift32's low bytes */
    uint8_t b[3];
    tu_fill_bytes(b, 3, 2463534242u);
    y = 2463534242u;
    for (int i = 0; i < 3; i++)
        assert_int_equal(b[i], (uint8_t)rng_xorshift32(&y));
}

/* jfield: every JSON kind named; scalars rendered and cut to the buffer */
static void test_jfield(void **state)
{
    (void)state;
    char d[12];
    json_t *o = json_object(), *a = json_array(), *str = json_string("abc"),
           *lng = json_string("a long string value"), *i = json_integer(42),
           *r = json_real(1.5), *t = json_true(), *n = json_null();
    assert_string_equal(jfield_type(NULL), "missing");
    assert_string_equal(jfield_type(o), "an object");
    assert_string_equal(jfield_type(a), "an array");
    assert_string_equal(jfield_type(str), "a string");
    assert_string_equal(jfield_type(i), "an integer");
    assert_string_equal(jfield_type(r), "a real number");
    assert_string_equal(jfield_type(t), "a boolean");
    assert_string_equal(jfield_type(n), "null");
    assert_string_equal(jfield_desc(NULL, d, sizeof d), "missing");
    assert_string_equal(jfield_desc(o, d, sizeof d), "an object");
    assert_string_equal(jfield_desc(a, d, sizeof d), "an array");
    assert_string_equal(jfield_desc(str, d, sizeof d), "\"abc\"");
    assert_string_equal(jfield_desc(i, d, sizeof d), "42");
    assert_string_equal(jfield_desc(r, d, sizeof d), "1.5");
    assert_string_equal(jfield_desc(t, d, sizeof d), "true");
    assert_string_equal(jfield_desc(n, d, sizeof d), "null");
    assert_string_equal(jfield_desc(lng, d, sizeof d), "\"a long ...");
    json_t *all[] = {o, a, str, lng, i, r, t, n};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        json_decref(all[k]);
}

/* vec_grow: leaves a roomy array alone, doubles a full one (from `first` when empty), and
 * refuses a size that overflows without touching the array */
static void test_vec_grow(void **state)
{
    (void)state;
    size_t cap = 0;
    int *a = vec_grow(NULL, &cap, 0, sizeof *a, 4);
    assert_non_null(a);
    assert_int_equal(cap, 4);
    for (int i = 0; i < 4; i++)
        a[i] = i;
    assert_ptr_equal(vec_grow(a, &cap, 3, sizeof *a, 4), a);
    assert_int_equal(cap, 4);
    a = vec_grow(a, &cap, 4, sizeof *a, 4);
    assert_non_null(a);
    assert_int_equal(cap, 8);
    for (int i = 0; i < 4; i++)
        assert_int_equal(a[i], i);
    size_t huge = SIZE_MAX / 2 + 1;
    assert_null(vec_grow(a, &huge, huge, sizeof *a, 4));
    assert_true(huge == SIZE_MAX / 2 + 1);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_text),
        cmocka_unit_test(test_half_roundtrip),
        cmocka_unit_test(test_dtype_sizes),
        cmocka_unit_test(test_afile_commit_and_abort),
        cmocka_unit_test(test_heap_order),
        cmocka_unit_test(test_fmap),
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_mono),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_jfield),
        cmocka_unit_test(test_vec_grow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
