/* test_common.c — error codes, half/bfloat conversions, dtype sizes, atomic files. */
#include "testutil.h"

#include "afile.h"
#include "dtype.h"
#include "err.h"
#include "fmap.h"
#include "half.h"
#include "heap.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_text),
        cmocka_unit_test(test_half_roundtrip),
        cmocka_unit_test(test_dtype_sizes),
        cmocka_unit_test(test_afile_commit_and_abort),
        cmocka_unit_test(test_heap_order),
        cmocka_unit_test(test_fmap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
