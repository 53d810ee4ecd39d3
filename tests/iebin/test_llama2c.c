/* test_llama2c.c — llama2.c checkpoint import: stories260K end to end, bad checkpoints. */
#include "testutil.h"

#include "err.h"
#include "half.h"
#include "iebin.h"
#include "llama2c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
