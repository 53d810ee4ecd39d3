/* test_llama2c.c — llama2.c checkpoint import: stories260K end to end, bad checkpoints. */
#include "testutil.h"

#include "err.h"
#include "half.h"
#include "iebin.h"
#include "llama2c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S260K "stories260K/stories260K.bin"

/* The checkpoint's floats after its 28-byte header; release with free_raw. */
static const float *raw_floats(const char *ckpt, size_t *n)
{
    size_t len;
    char *buf = tu_read_file(ckpt, &len);
    *n = (len - 28) / 4;
    return (const float *)(buf + 28);
}

static void free_raw(const float *f) { free((char *)f - 28); }

static void test_stories260k_f32(void **state)
{
    (void)state;
    const char *ckpt = tu_fixture(S260K);
    char *dir = tu_mkdtemp();
    const char *out = tu_path(dir, "model");
    assert_int_equal(llama2c_convert(ckpt, NULL, 0, out, DT_F32, NULL), 0);

    struct iebin_model *m;
    assert_int_equal(iebin_open(out, &m), 0);
    assert_string_equal(m->arch, "llama");
    assert_string_equal(m->name, "stories260K");
    assert_int_equal(m->hp.dim, 64);
    assert_int_equal(m->hp.ffn_dim, 172);
    assert_int_equal(m->hp.n_layers, 5);
    assert_int_equal(m->hp.n_heads, 8);
    assert_int_equal(m->hp.n_kv_heads, 4);
    assert_int_equal(m->hp.head_dim, 8);
    assert_int_equal(m->hp.vocab_size, 512);
    assert_int_equal(m->hp.max_seq_len, 512);
    assert_true(m->hp.tied_embeddings);
    assert_true(m->hp.rope_theta == 10000.0f);
    assert_true(m->hp.rms_eps == 1e-5f);
    assert_int_equal(m->n_tensors, 2 + 9 * 5);
    assert_null(m->tokenizer_path);
    assert_null(iebin_find(m, "output"));

    size_t nf;
    const float *raw = raw_floats(ckpt, &nf);
    const size_t d = 64, L = 5, kv = 32, hid = 172, V = 512;
    /* offsets (floats) in the checkpoint */
    size_t o_emb = 0, o_att = V * d, o_wq = o_att + L * d, o_wk = o_wq + L * d * d,
           o_wv = o_wk + L * kv * d, o_wo = o_wv + L * kv * d, o_ffn = o_wo + L * d * d,
           o_w1 = o_ffn + L * d, o_w2 = o_w1 + L * hid * d, o_w3 = o_w2 + L * d * hid,
           o_fin = o_w3 + L * hid * d;
    assert_int_equal(nf, o_fin + d + 512 * 8);

    const struct iebin_tensor *t = iebin_find(m, "tok_embd");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 512);
    assert_int_equal(t->shape[1], 64);
    assert_int_equal(t->offset % 64, 0);
    assert_memory_equal(t->data, raw + o_emb, V * d * 4);

    struct {
        const char *name;
        size_t off, rows, cols;
    } cases[] = {
        {"blk.0.attn_norm", o_att, 1, d},       {"blk.4.attn_norm", o_att + 4 * d, 1, d},
        {"blk.2.attn_q", o_wq + 2 * d * d, d, d}, {"blk.3.attn_k", o_wk + 3 * kv * d, kv, d},
        {"blk.1.attn_v", o_wv + 1 * kv * d, kv, d}, {"blk.4.attn_o", o_wo + 4 * d * d, d, d},
        {"blk.2.ffn_norm", o_ffn + 2 * d, 1, d},  {"blk.0.ffn_gate", o_w1, hid, d},
        {"blk.3.ffn_up", o_w3 + 3 * hid * d, hid, d}, {"blk.4.ffn_down", o_w2 + 4 * d * hid, d, hid},
        {"output_norm", o_fin, 1, d},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        t = iebin_find(m, cases[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, DT_F32);
        if (cases[i].rows == 1) {
            assert_int_equal(t->n_dims, 1);
            assert_int_equal(t->shape[0], cases[i].cols);
        } else {
            assert_int_equal(t->n_dims, 2);
            assert_int_equal(t->shape[0], cases[i].rows);
            assert_int_equal(t->shape[1], cases[i].cols);
        }
        assert_memory_equal(t->data, raw + cases[i].off, cases[i].rows * cases[i].cols * 4);
    }
    free_raw(raw);
    iebin_close(m);
    tu_rmtree(dir);
    free(dir);
}

/* f16/bf16 matrices are the round-to-nearest-even conversions of the checkpoint's floats; norms
 * stay f32; the tokenizer document is stored beside the model. */
static void test_stories260k_half(void **state)
{
    (void)state;
    const char *ckpt = tu_fixture(S260K);
    char *dir = tu_mkdtemp();
    size_t nf;
    const float *raw = raw_floats(ckpt, &nf);
    static const char tok[] = "{\"model\": \"stories260K\"}";
    for (int pass = 0; pass < 2; pass++) {
        enum dtype dt = pass ? DT_BF16 : DT_F16;
        const char *out = tu_path(dir, pass ? "bf16" : "f16");
        assert_int_equal(llama2c_convert(ckpt, tok, strlen(tok), out, dt, "s260"), 0);
        struct iebin_model *m;
        assert_int_equal(iebin_open(out, &m), 0);
        assert_string_equal(m->name, "s260");
        assert_non_null(m->tokenizer_path);
        char *got = tu_read_file(m->tokenizer_path, NULL);
        assert_string_equal(got, tok);
        free(got);

        const struct iebin_tensor *t = iebin_find(m, "blk.1.attn_q");
        assert_int_equal(t->dtype, dt);
        assert_int_equal(t->size, 64 * 64 * 2);
        const float *src = raw + 512 * 64 + 5 * 64 + 1 * 64 * 64; /* wq[1] */
        const uint16_t *h = t->data;
        for (size_t i = 0; i < 64 * 64; i++)
            assert_int_equal(h[i], dt == DT_F16 ? half_f32_to_f16(src[i]) : half_f32_to_bf16(src[i]));
        t = iebin_find(m, "tok_embd");
        assert_int_equal(t->dtype, dt);
        h = t->data;
        for (size_t i = 0; i < 512 * 64; i++)
            assert_int_equal(h[i], dt == DT_F16 ? half_f32_to_f16(raw[i]) : half_f32_to_bf16(raw[i]));
        t = iebin_find(m, "blk.3.ffn_norm");
        assert_int_equal(t->dtype, DT_F32);
        assert_int_equal(t->size, 64 * 4);
        iebin_close(m);
    }
    free_raw(raw);
    tu_rmtree(dir);
    free(dir);
}

/* A copy of stories260K with header fields replaced (-1 keeps one) and `extra` floats appended
 * (or removed when negative, in bytes). */
static char *variant(const char *dir, const char *fname, const int32_t hdr[7], long delta_bytes,
                     const float *extra, size_t n_extra)
{
    size_t len;
    char *buf = tu_read_file(tu_fixture(S260K), &len);
    int32_t h[7];
    memcpy(h, buf, sizeof h);
    for (int i = 0; i < 7; i++)
        if (hdr[i] != -1)
            h[i] = hdr[i];
    memcpy(buf, h, sizeof h);
    size_t n = (size_t)((long)len + (delta_bytes < 0 ? delta_bytes : 0));
    char *path = strdup(tu_path(dir, fname));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    if (delta_bytes > 0) {
        for (long i = 0; i < delta_bytes; i++)
            fputc(0, f);
    }
    if (n_extra)
        assert_int_equal(fwrite(extra, sizeof *extra, n_extra, f), n_extra);
    fclose(f);
    free(buf);
    return path;
}

static const int32_t KEEP[7] = {-1, -1, -1, -1, -1, -1, -1};

/* vocab_size < 0: the classifier follows the RoPE tables and becomes `output`. */
static void test_unshared_classifier(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    float *wcls = malloc(512 * 64 * sizeof *wcls);
    for (size_t i = 0; i < 512 * 64; i++)
        wcls[i] = (float)i * 0.001f - 3.0f;
    int32_t h[7] = {-1, -1, -1, -1, -1, -512, -1};
    char *ckpt = variant(dir, "untied.bin", h, 0, wcls, 512 * 64);
    const char *out = tu_path(dir, "model");
    assert_int_equal(llama2c_convert(ckpt, NULL, 0, out, DT_F32, NULL), 0);
    struct iebin_model *m;
    assert_int_equal(iebin_open(out, &m), 0);
    assert_string_equal(m->name, "untied");
    assert_false(m->hp.tied_embeddings);
    assert_int_equal(m->hp.vocab_size, 512);
    assert_int_equal(m->n_tensors, 3 + 9 * 5);
    const struct iebin_tensor *t = iebin_find(m, "output");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 512);
    assert_int_equal(t->shape[1], 64);
    assert_memory_equal(t->data, wcls, 512 * 64 * 4);
    iebin_close(m);

    struct iebin_hparams hp;
    assert_int_equal(llama2c_read_hparams(ckpt, &hp), 0);
    assert_false(hp.tied_embeddings);
    assert_int_equal(hp.vocab_size, 512);
    free(wcls);
    free(ckpt);
    tu_rmtree(dir);
    free(dir);
}

/* convert must fail with `code`, one message containing the needles, and no model written. */
static void expect_convert_fail(const char *ckpt, const char *out, enum dtype dt, int code,
                                const char *n1, const char *n2)
{
    tu_log_capture_begin();
    int rc = llama2c_convert(ckpt, NULL, 0, out, dt, NULL);
    if (rc != code)
        fail_msg("llama2c_convert returned %s, expected %s; log:\n%s", err_name(rc),
                 err_name(code), tu_log_captured());
    tu_assert_log_contains(n1, n2, NULL);
    tu_log_capture_end();
    assert_int_equal(access(tu_path(out, IEBIN_MANIFEST), F_OK), -1);
}

static void test_bad_checkpoints(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char *out = strdup(tu_path(dir, "out"));
    char *p;

    p = variant(dir, "trunc.bin", KEEP, -100, NULL, 0);
    expect_convert_fail(p, out, DT_F32, ERR_TRUNCATED, p,
                        "1056440 bytes, but its header (dim 64, hidden_dim 172, n_layers 5, "
                        "n_heads 8, n_kv_heads 4, vocab_size 512, seq_len 512) implies 1056540 "
                        "(truncated)");
    free(p);

    p = variant(dir, "long.bin", KEEP, 4, NULL, 0);
    expect_convert_fail(p, out, DT_F32, ERR_MISMATCH, p, "implies 1056540 (trailing bytes)");
    free(p);

    p = strdup(tu_path(dir, "tiny.bin"));
    tu_write_file(p, "\x40\0\0\0\0\0", 6);
    expect_convert_fail(p, out, DT_F32, ERR_TRUNCATED, p,
                        "6 bytes, too short for the 28-byte llama2.c header");
    free(p);

    static const struct {
        int32_t h[7];
        int code;
        const char *msg;
    } bad[] = {
        {{-1, -1, -1, 0, -1, -1, -1}, ERR_RANGE, "header: n_heads is 0, must be > 0"},
        {{-1, -7, -1, -1, -1, -1, -1}, ERR_RANGE, "header: hidden_dim is -7, must be > 0"},
        {{-1, -1, -1, -1, -1, 0, -1}, ERR_RANGE, "header: vocab_size is 0, must be non-zero"},
        {{-1, -1, -1, 7, -1, -1, -1}, ERR_RANGE, "header: dim 64 is not a multiple of n_heads 7"},
        {{-1, -1, -1, -1, 3, -1, -1}, ERR_RANGE,
         "header: n_heads 8 is not a multiple of n_kv_heads 3"},
        {{-1, -1, -1, 4, 8, -1, -1}, ERR_RANGE,
         "header: n_heads 4 is not a multiple of n_kv_heads 8"},
        {{24, -1, -1, -1, -1, -1, -1}, ERR_RANGE, "(llama2.c header): hparams.head_dim 3 is odd"},
        {{1 << 20, -1, -1, 1 << 10, 1 << 10, -1, -1}, ERR_RANGE,
         "(llama2.c header): hparams.dim 1048576 is outside 1..65536"},
        {{-1, -1, 2000, -1, -1, -1, -1}, ERR_RANGE,
         "(llama2.c header): hparams.n_layers 2000 is outside 1..1024"},
        {{-1, -1, 6, -1, -1, -1, -1}, ERR_TRUNCATED, "(truncated)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = variant(dir, "hdr.bin", bad[i].h, 0, NULL, 0);
        expect_convert_fail(p, out, DT_F32, bad[i].code, p, bad[i].msg);
        struct iebin_hparams hp;
        tu_log_capture_begin();
        assert_int_equal(llama2c_read_hparams(p, &hp), bad[i].code);
        tu_log_capture_end();
        free(p);
    }

    expect_convert_fail(tu_path(dir, "absent.bin"), out, DT_F32, -ENOENT, "absent.bin",
                        "No such file");
    expect_convert_fail(tu_fixture(S260K), out, DT_Q8_0, ERR_UNSUPPORTED,
                        "llama2.c import writes f32, f16 or bf16, not q8_0", NULL);
    tu_rmtree(dir);
    free(dir);
    free(out);
}

/* The importer's output failures are the writer's: clean codes and nothing left behind. */
static void test_output_failures(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char *file = strdup(tu_path(dir, "file"));
    tu_write_file(file, "x", 1);
    char out[4200];
    snprintf(out, sizeof out, "%s/model", file);
    expect_convert_fail(tu_fixture(S260K), out, DT_F32, -ENOTDIR, "cannot create directory",
                        "Not a directory");

    char *fresh = strdup(tu_path(dir, "fresh"));
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "100000", 1);
    expect_convert_fail(tu_fixture(S260K), fresh, DT_F32, -ENOSPC, "model.ie.bin.tmp.",
                        "No space left on device");
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    char cmd[4200], *ls = NULL;
    snprintf(cmd, sizeof cmd, "ls -A '%s'", fresh);
    assert_int_equal(tu_run(cmd, &ls), 0);
    assert_string_equal(ls, "");
    free(ls);
    free(fresh);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k_f32),
        cmocka_unit_test(test_stories260k_half),
        cmocka_unit_test(test_unshared_classifier),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_output_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
