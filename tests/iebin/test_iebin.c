/*
 * test_iebin.c — IEBIN v1 reader and writer: round trips, every kind of malformed manifest or
 * blob (each asserting the return code and that the single logged message names the file, the
 * tensor and the field), writer misuse, unwritable directories and full disks.
 *
 * Each test gets a fresh directory holding a valid tiny llama model written by the writer
 * (setup), which malformed-input tests then damage in one precise way; the gpt_oss tests start
 * from a tiny gpt_oss model instead (fx_setup_gpt_oss: experts in mxfp4, sinks, biases, a
 * sliding layer and YaRN).
 */
#include "testutil.h"

#include "err.h"
#include "iebin.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* dim 8, 2 layers, 2 heads of 4 (1 kv head), ffn 12, vocab 16 */
static const struct iebin_hparams tiny_hp = {
    .dim = 8,
    .n_layers = 2,
    .n_heads = 2,
    .n_kv_heads = 1,
    .head_dim = 4,
    .ffn_dim = 12,
    .vocab_size = 16,
    .max_seq_len = 32,
    .rope_theta = 10000.0f,
    .rms_eps = 1e-5f,
    .tied_embeddings = true,
};

/* dim 64, 2 layers (0 slides, window 8), 4 heads of 16 (2 kv heads), 4 experts (2 used) of
 * width 32, vocab 16, YaRN: rows of 64 and 32 hold whole mxfp4 blocks */
static const struct iebin_hparams tiny_moe_hp = {
    .dim = 64,
    .n_layers = 2,
    .n_heads = 4,
    .n_kv_heads = 2,
    .head_dim = 16,
    .ffn_dim = 32,
    .vocab_size = 16,
    .max_seq_len = 128,
    .rope_theta = 150000.0f,
    .rms_eps = 1e-5f,
    .tied_embeddings = false,
    .n_experts = 4,
    .n_experts_used = 2,
    .sliding_window = 8,
    .sliding_layers = {1},
    .rope_scaling = {IEBIN_ROPE_YARN, 32.0f, 32.0f, 1.0f, 4096, false},
    .swiglu_limit = 7.0f,
    .swiglu_alpha = 1.702f,
};

struct spec {
    char name[IEBIN_NAME_MAX];
    enum dtype dt;
    int n_dims;
    uint64_t shape[3];
};

/* The architecture's tensors for hp (gpt_oss when hp->n_experts), in the writer's usual
 * order. dt for matrices; gpt_oss experts are mxfp4. */
static size_t model_specs(const struct iebin_hparams *hp, enum dtype dt, struct spec *out)
{
    size_t n = 0;
    uint64_t d = hp->dim, q = (uint64_t)hp->n_heads * hp->head_dim,
             kv = (uint64_t)hp->n_kv_heads * hp->head_dim, f = hp->ffn_dim, v = hp->vocab_size,
             e = hp->n_experts;
#define ADD3(nm, t, nd, a, b, c) \
    (snprintf(out[n].name, IEBIN_NAME_MAX, "%s", nm), out[n].dt = t, out[n].n_dims = nd, \
     out[n].shape[0] = a, out[n].shape[1] = b, out[n].shape[2] = c, n++)
#define ADD(nm, t, nd, a, b) ADD3(nm, t, nd, a, b, 0)
    ADD("tok_embd", dt, 2, v, d);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        char nm[IEBIN_NAME_MAX];
#define LAYER(sfx, t, nd, a, b) (snprintf(nm, sizeof nm, "blk.%u." sfx, l), ADD(nm, t, nd, a, b))
#define LAYER3(sfx, t, a, b, c) (snprintf(nm, sizeof nm, "blk.%u." sfx, l), ADD3(nm, t, 3, a, b, c))
        LAYER("attn_norm", DT_F32, 1, d, 0);
        LAYER("attn_q", dt, 2, q, d);
        if (e)
            LAYER("attn_q_bias", DT_F32, 1, q, 0);
        LAYER("attn_k", dt, 2, kv, d);
        if (e)
            LAYER("attn_k_bias", DT_F32, 1, kv, 0);
        LAYER("attn_v", dt, 2, kv, d);
        if (e)
            LAYER("attn_v_bias", DT_F32, 1, kv, 0);
        LAYER("attn_o", dt, 2, d, q);
        if (e) {
            LAYER("attn_o_bias", DT_F32, 1, d, 0);
            LAYER("attn_sinks", DT_F32, 1, hp->n_heads, 0);
        }
        LAYER("ffn_norm", DT_F32, 1, d, 0);
        if (e) {
            LAYER("ffn_router", dt, 2, e, d);
            LAYER("ffn_router_bias", DT_F32, 1, e, 0);
            LAYER3("ffn_gate_exps", DT_MXFP4, e, f, d);
            LAYER("ffn_gate_exps_bias", DT_F32, 2, e, f);
            LAYER3("ffn_up_exps", DT_MXFP4, e, f, d);
            LAYER("ffn_up_exps_bias", DT_F32, 2, e, f);
            LAYER3("ffn_down_exps", DT_MXFP4, e, d, f);
            LAYER("ffn_down_exps_bias", DT_F32, 2, e, d);
        } else {
            LAYER("ffn_gate", dt, 2, f, d);
            LAYER("ffn_up", dt, 2, f, d);
            LAYER("ffn_down", dt, 2, d, f);
        }
#undef LAYER
#undef LAYER3
    }
    ADD("output_norm", DT_F32, 1, d, 0);
    if (!hp->tied_embeddings)
        ADD("output", dt, 2, v, d);
#undef ADD
#undef ADD3
    return n;
}

static uint64_t spec_bytes(const struct spec *s)
{
    uint64_t n;
    assert_int_equal(dtype_tensor_bytes(s->dt, s->shape, s->n_dims, &n), 0);
    return n;
}

/* Deterministic contents of tensor i of a model written with `seed`. */
static void fill(uint8_t *p, uint64_t n, unsigned seed, size_t i)
{
    tu_fill_bytes(p, (size_t)n, seed * 2654435761u + (uint32_t)i * 40503u + 1u);
}

#define MAX_SPECS 64

/* Writes a complete model; returns the writer's code (0 on success). */
static int write_model(const char *dir, const struct iebin_hparams *hp, enum dtype dt,
                       unsigned seed, const char *tok, size_t tok_len)
{
    struct spec specs[MAX_SPECS];
    size_t n = model_specs(hp, dt, specs);
    assert_true(n <= MAX_SPECS);
    struct iebin_writer *w;
    int rc = iebin_writer_create(dir, hp->n_experts ? "gpt_oss" : "llama", "tiny", hp, &w);
    if (rc != 0)
        return rc;
    if (tok && (rc = iebin_writer_set_tokenizer(w, tok, tok_len)) != 0) {
        iebin_writer_abort(w);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t sz = spec_bytes(&specs[i]);
        uint8_t *buf = malloc(sz);
        fill(buf, sz, seed, i);
        rc = iebin_writer_add(w, specs[i].name, specs[i].dt, specs[i].shape, specs[i].n_dims,
                              buf, sz);
        free(buf);
        if (rc != 0) {
            iebin_writer_abort(w);
            return rc;
        }
    }
    return iebin_writer_finish(w);
}

/* Asserts that m is exactly the model write_model(hp, dt, seed) wrote. */
static void check_model(const struct iebin_model *m, const struct iebin_hparams *hp,
                        enum dtype dt, unsigned seed)
{
    struct spec specs[MAX_SPECS];
    size_t n = model_specs(hp, dt, specs);
    assert_int_equal(m->n_tensors, n);
    assert_memory_equal(&m->hp.dim, &hp->dim, offsetof(struct iebin_hparams, rope_theta));
    assert_true(m->hp.rope_theta == hp->rope_theta);
    assert_true(m->hp.rms_eps == hp->rms_eps);
    assert_int_equal(m->hp.tied_embeddings, hp->tied_embeddings);
    assert_string_equal(m->arch, hp->n_experts ? "gpt_oss" : "llama");
    assert_int_equal(m->hp.n_experts, hp->n_experts);
    assert_int_equal(m->hp.n_experts_used, hp->n_experts_used);
    assert_int_equal(m->hp.sliding_window, hp->sliding_window);
    assert_memory_equal(m->hp.sliding_layers, hp->sliding_layers, sizeof hp->sliding_layers);
    assert_int_equal(m->hp.rope_scaling.type, hp->rope_scaling.type);
    assert_true(m->hp.rope_scaling.factor == hp->rope_scaling.factor);
    assert_true(m->hp.rope_scaling.beta_fast == hp->rope_scaling.beta_fast);
    assert_true(m->hp.rope_scaling.beta_slow == hp->rope_scaling.beta_slow);
    assert_int_equal(m->hp.rope_scaling.original_max_position_embeddings,
                     hp->rope_scaling.original_max_position_embeddings);
    assert_int_equal(m->hp.rope_scaling.truncate, hp->rope_scaling.truncate);
    assert_true(m->hp.swiglu_limit == hp->swiglu_limit);
    assert_true(m->hp.swiglu_alpha == hp->swiglu_alpha);
    for (size_t i = 0; i < n; i++) {
        const struct iebin_tensor *t = iebin_find(m, specs[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, &m->tensors[i]); /* manifest order = write order */
        assert_string_equal(t->name, specs[i].name);
        assert_int_equal(t->dtype, specs[i].dt);
        assert_int_equal(t->n_dims, specs[i].n_dims);
        for (int d = 0; d < t->n_dims; d++)
            assert_int_equal(t->shape[d], specs[i].shape[d]);
        assert_int_equal(t->offset % IEBIN_ALIGN, 0);
        assert_int_equal(t->size, spec_bytes(&specs[i]));
        uint8_t *want = malloc(t->size);
        fill(want, t->size, seed, i);
        assert_memory_equal(t->data, want, t->size);
        free(want);
    }
    char past[32];
    snprintf(past, sizeof past, "blk.%u.attn_q", hp->n_layers);
    assert_null(iebin_find(m, past));
    assert_null(iebin_find(m, "nope"));
    if (hp->tied_embeddings)
        assert_null(iebin_find(m, "output"));
}

/* ---- fixture: a fresh valid tiny model per test ---- */

struct fx {
    char *root; /* temp dir */
    char dir[1024];
    char manifest[1100];
    char blob[1100];
};

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    fx->root = tu_mkdtemp();
    snprintf(fx->dir, sizeof fx->dir, "%s/model", fx->root);
    snprintf(fx->manifest, sizeof fx->manifest, "%s/" IEBIN_MANIFEST, fx->dir);
    snprintf(fx->blob, sizeof fx->blob, "%s/" IEBIN_BLOB, fx->dir);
    assert_int_equal(write_model(fx->dir, &tiny_hp, DT_F32, 1, NULL, 0), 0);
    *state = fx;
    return 0;
}

static int fx_setup_gpt_oss(void **state)
{
    fx_setup(state);
    struct fx *fx = *state;
    assert_int_equal(write_model(fx->dir, &tiny_moe_hp, DT_BF16, 2, NULL, 0), 0);
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    tu_log_capture_end();
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    tu_rmtree(fx->root);
    free(fx->root);
    free(fx);
    return 0;
}

static json_t *load_manifest(const struct fx *fx)
{
    json_error_t e;
    json_t *r = json_load_file(fx->manifest, 0, &e);
    if (!r)
        fail_msg("%s: %s", fx->manifest, e.text);
    return r;
}

static void save_manifest(const struct fx *fx, json_t *r)
{
    assert_int_equal(json_dump_file(r, fx->manifest, JSON_INDENT(1)), 0);
    json_decref(r);
}

static json_t *tensor_named(json_t *root, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(root, "tensors"), i, t)
    {
        if (strcmp(json_string_value(json_object_get(t, "name")), name) == 0)
            return t;
    }
    fail_msg("no tensor %s", name);
    return NULL;
}

static void set_int(json_t *obj, const char *key, json_int_t v)
{
    assert_int_equal(json_object_set_new(obj, key, json_integer(v)), 0);
}

static json_int_t get_int(json_t *obj, const char *key)
{
    return json_integer_value(json_object_get(obj, key));
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/*
 * iebin_open(dir) must fail with `code`, logging exactly one message that contains every
 * needle; then the same manifest and blob bytes through iebin_open_mem must fail the same way
 * (mem = false for failures that only exist with files).
 */
static void expect_fail_(const struct fx *fx, bool mem, int code, const char *const *needles)
{
    struct iebin_model *m = (struct iebin_model *)1;
    tu_log_capture_begin();
    int rc = iebin_open(fx->dir, &m);
    if (rc != code)
        fail_msg("iebin_open returned %s (%d), expected %s; log:\n%s", err_name(rc), rc,
                 err_name(code), tu_log_captured());
    assert_null(m);
    for (const char *const *n = needles; *n; n++)
        tu_assert_log_contains(*n, NULL);
    if (count_lines(tu_log_captured()) != 1)
        fail_msg("expected exactly one message, got:\n%s", tu_log_captured());
    assert_string_not_equal(log_last_error(), "");
    if (mem) {
        size_t jl, bl;
        char *j = tu_read_file(fx->manifest, &jl);
        char *b = tu_read_file(fx->blob, &bl);
        m = (struct iebin_model *)1;
        rc = iebin_open_mem(fx->manifest, j, jl, b, bl, &m);
        if (rc != code)
            fail_msg("iebin_open_mem returned %s, expected %s; log:\n%s", err_name(rc),
                     err_name(code), tu_log_captured());
        assert_null(m);
        free(j);
        free(b);
    }
    tu_log_capture_end();
}
#define EXPECT_FAIL(fx, code, ...) expect_fail_(fx, true, code, (const char *[]){__VA_ARGS__, NULL})
#define EXPECT_FAIL_FILE(fx, code, ...) \
    expect_fail_(fx, false, code, (const char *[]){__VA_ARGS__, NULL})

/* ---- round trips ---- */

static void test_roundtrip(void **state)
{
    struct fx *fx = *state;
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &tiny_hp, DT_F32, 1);
    assert_string_equal(m->name, "tiny");
    assert_null(m->tokenizer_path);
    assert_non_null(m->map);
    assert_true(m->dir[0] == '/');
    iebin_close(m);

    assert_int_equal(iebin_open_ex(fx->dir, IEBIN_OPEN_LAZY, &m), 0);
    check_model(m, &tiny_hp, DT_F32, 1);
    iebin_close(m);

    /* the same bytes validated in memory */
    size_t jl, bl;
    char *j = tu_read_file(fx->manifest, &jl);
    char *b = tu_read_file(fx->blob, &bl);
    assert_int_equal(iebin_open_mem("mem", j, jl, b, bl, &m), 0);
    check_model(m, &tiny_hp, DT_F32, 1);
    assert_null(m->map);
    assert_ptr_equal(m->tensors[0].data, b + m->tensors[0].offset);
    iebin_close(m);
    assert_int_equal(iebin_check_manifest("mem", j, jl, bl), 0);
    free(j);
    free(b);
    iebin_close(NULL);
}

static void test_roundtrip_untied_block_types(void **state)
{
    (void)state;
    /* block dtypes need rows that are multiples of 32 */
    struct iebin_hparams hp = tiny_hp;
    hp.dim = 64, hp.n_heads = 4, hp.n_kv_heads = 2, hp.head_dim = 16, hp.ffn_dim = 96;
    hp.tied_embeddings = false;
    hp.rope_theta = 500000.0f, hp.rms_eps = 1e-6f;
    const enum dtype dts[] = {DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0};
    char *root = tu_mkdtemp();
    for (size_t i = 0; i < 4; i++) {
        const char *dir = tu_path(root, dtype_info(dts[i])->name);
        assert_int_equal(write_model(dir, &hp, dts[i], 7 + (unsigned)i, NULL, 0), 0);
        struct iebin_model *m;
        assert_int_equal(iebin_open(dir, &m), 0);
        check_model(m, &hp, dts[i], 7 + (unsigned)i);
        assert_non_null(iebin_find(m, "output"));
        iebin_close(m);
    }
    tu_rmtree(root);
    free(root);
}

static void test_tokenizer_and_replace(void **state)
{
    struct fx *fx = *state;
    static const char tok[] = "{\"tokenizer\": \"test\"}";
    struct iebin_model *old;
    assert_int_equal(iebin_open(fx->dir, &old), 0);

    /* replace the model in place: a new one with a tokenizer and other contents */
    assert_int_equal(write_model(fx->dir, &tiny_hp, DT_BF16, 2, tok, strlen(tok)), 0);
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &tiny_hp, DT_BF16, 2);
    assert_non_null(m->tokenizer_path);
    assert_true(m->tokenizer_path[0] == '/');
    size_t len;
    char *got = tu_read_file(m->tokenizer_path, &len);
    assert_int_equal(len, strlen(tok));
    assert_memory_equal(got, tok, len);
    free(got);
    iebin_close(m);

    /* the old mapping still sees the old model: files are replaced, never rewritten */
    check_model(old, &tiny_hp, DT_F32, 1);
    iebin_close(old);

    /* a model without tokenizer removes the stale one */
    assert_int_equal(write_model(fx->dir, &tiny_hp, DT_F32, 3, NULL, 0), 0);
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    assert_null(m->tokenizer_path);
    iebin_close(m);
    assert_int_equal(access(tu_path(fx->dir, IEBIN_TOKENIZER), F_OK), -1);
}

/* The writer's manifest is readable text: the header indented, one line per tensor. */
static void test_manifest_text(void **state)
{
    struct fx *fx = *state;
    char *j = tu_read_file(fx->manifest, NULL);
    assert_non_null(strstr(j, "\"rope_theta\": 10000.0,"));
    assert_non_null(strstr(j, "\"rms_eps\": 1e-5,"));
    assert_non_null(strstr(j, "\"tokenizer\": null,"));
    assert_non_null(strstr(j, "\n    {\"name\": \"tok_embd\", \"dtype\": \"f32\", \"shape\": "
                              "[16, 8], \"offset\": 0, \"size\": 512},\n"));
    free(j);
}

/* ---- malformed manifests ---- */

static void test_missing_manifest(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(unlink(fx->manifest), 0);
    EXPECT_FAIL_FILE(fx, -ENOENT, fx->manifest, "No such file");
}

static void test_missing_blob(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(unlink(fx->blob), 0);
    EXPECT_FAIL_FILE(fx, -ENOENT, fx->blob, "cannot open the blob", "No such file");
}

static void test_truncated_blob(void **state)
{
    struct fx *fx = *state;
    struct stat st;
    assert_int_equal(stat(fx->blob, &st), 0);
    assert_int_equal(truncate(fx->blob, st.st_size - 64), 0);
    char want[128];
    snprintf(want, sizeof want, "%lld bytes, but the manifest's blob.size is %lld (truncated)",
             (long long)st.st_size - 64, (long long)st.st_size);
    EXPECT_FAIL(fx, ERR_TRUNCATED, fx->blob, want);
}

static void test_blob_size_mismatch(void **state)
{
    struct fx *fx = *state;
    FILE *f = fopen(fx->blob, "ab");
    fputs("extra", f);
    fclose(f);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->blob, "but the manifest's blob.size is");
}

static void test_truncated_manifest(void **state)
{
    struct fx *fx = *state;
    size_t len;
    char *j = tu_read_file(fx->manifest, &len);
    tu_write_file(fx->manifest, j, len / 2);
    free(j);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "invalid JSON", "premature end of input");
}

static void test_invalid_json(void **state)
{
    struct fx *fx = *state;
    static const char bad[] = "{\"format\": iebin}";
    tu_write_file(fx->manifest, bad, strlen(bad));
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "invalid JSON at line 1 column");
}

static void test_trailing_garbage(void **state)
{
    struct fx *fx = *state;
    FILE *f = fopen(fx->manifest, "ab");
    fputs("{}", f);
    fclose(f);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "invalid JSON", "end of file expected");
}

static void test_invalid_utf8(void **state)
{
    struct fx *fx = *state;
    size_t len;
    char *j = tu_read_file(fx->manifest, &len);
    char *p = strstr(j, "\"tiny\"");
    assert_non_null(p);
    p[2] = (char)0xff; /* "t\xffny" */
    tu_write_file(fx->manifest, j, len);
    free(j);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "invalid JSON", "decode byte 0xff");
}

static void test_duplicate_key(void **state)
{
    struct fx *fx = *state;
    size_t len;
    char *j = tu_read_file(fx->manifest, &len);
    char *p = strstr(j, "\"version\": 1,");
    assert_non_null(p);
    memcpy(p, "\"format\": 1, ", 13); /* same length: "format" appears twice */
    tu_write_file(fx->manifest, j, len);
    free(j);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "invalid JSON", "duplicate object key");
}

static void test_not_an_object(void **state)
{
    struct fx *fx = *state;
    tu_write_file(fx->manifest, "[1, 2]", 6);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "not a JSON object");
}

static void test_manifest_too_large(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(truncate(fx->manifest, (off_t)IEBIN_MANIFEST_MAX + 1), 0); /* sparse */
    EXPECT_FAIL_FILE(fx, ERR_RANGE, fx->manifest, "larger than the 67108864-byte limit");
}

static void test_wrong_format(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(r, "format", json_string("gguf"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "format is \"gguf\", not \"iebin\"");
}

static void test_version_2(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    set_int(r, "version", 2);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_UNSUPPORTED, fx->manifest, "version 2 is not supported");
}

static void test_version_missing(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_del(r, "version");
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "version is missing, not an integer");
}

static void test_unknown_architecture(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(r, "architecture", json_string("gpt2"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_UNSUPPORTED, fx->manifest, "architecture 'gpt2' is not supported");
}

static void test_unknown_dtype(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "blk.1.attn_q"), "dtype", json_string("f64"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_UNSUPPORTED, fx->manifest, "tensor 'blk.1.attn_q': dtype 'f64' is unknown");
}

static void test_offset_beyond_blob(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_int_t bs = get_int(json_object_get(r, "blob"), "size");
    set_int(tensor_named(r, "output_norm"), "offset", (bs + 63) / 64 * 64);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "tensor 'output_norm': offset",
                "is beyond the blob (blob.size");
}

static void test_size_beyond_blob(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_int_t last = get_int(tensor_named(r, "output_norm"), "offset");
    set_int(tensor_named(r, "tok_embd"), "offset", last); /* 512 bytes from there pass the end */
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "tensor 'tok_embd': offset",
                "runs past the end of the blob");
}

static void test_offset_size_overflow(void **state)
{
    struct fx *fx = *state;
    /* offsets are capped at 2^53, so offset + size cannot wrap; the huge value is refused */
    json_t *r = load_manifest(fx);
    set_int(tensor_named(r, "blk.0.attn_v"), "offset", INT64_MAX - 63);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest,
                "tensor 'blk.0.attn_v': offset is 9223372036854775744, outside "
                "0..9007199254740992");
}

static void test_size_too_large(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    set_int(tensor_named(r, "blk.0.attn_v"), "size", INT64_MAX);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "tensor 'blk.0.attn_v': size is", "outside");
}

static void test_misaligned_offset(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "blk.0.attn_norm");
    set_int(t, "offset", get_int(t, "offset") + 4);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensor 'blk.0.attn_norm': offset",
                "is not a multiple of 64");
}

static void test_overlapping_tensors(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    set_int(tensor_named(r, "blk.1.ffn_up"), "offset",
            get_int(tensor_named(r, "blk.1.ffn_gate"), "offset") + 64);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensors 'blk.1.ffn_gate'", "and 'blk.1.ffn_up'",
                "overlap");
}

static void test_shape_size_mismatch(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    set_int(tensor_named(r, "tok_embd"), "size", 508);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'tok_embd': size 508 does not match shape [16, 8] x f32 = 512 bytes");
}

static void test_dims_product_overflow(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape",
                        json_pack("[I, I, I]", (json_int_t)1 << 40, (json_int_t)1 << 30,
                                  (json_int_t)16));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_OVERFLOW, fx->manifest,
                "tensor 'tok_embd': shape [1099511627776, 1073741824, 16]", "overflows");
}

static void test_zero_dimension(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape", json_pack("[i, i]", 0, 8));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "tensor 'tok_embd': shape[0] is 0, outside 1..");
}

static void test_negative_dimension(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape", json_pack("[i, i]", 16, -8));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "tensor 'tok_embd': shape[1] is -8, outside 1..");
}

static void test_huge_dimension(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape",
                        json_pack("[I, i]", ((json_int_t)1 << 53) + 1, 8));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest,
                "tensor 'tok_embd': shape[0] is 9007199254740993, outside 1..9007199254740992");
}

static void test_non_integer_dimension(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape", json_pack("[f, i]", 16.0, 8));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensor 'tok_embd': shape[0] is 16.0, not an integer");

    r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape", json_pack("[i, s]", 16, "8"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensor 'tok_embd': shape[1] is \"8\", not an integer");
}

static void test_bad_dims_count(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape", json_pack("[i,i,i,i,i]", 1, 1, 1, 16, 8));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensor 'tok_embd': shape has 5 dimensions, must be 1..4");

    r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "tok_embd"), "shape", json_array());
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensor 'tok_embd': shape has 0 dimensions");
}

static void test_ragged_block(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "tok_embd"); /* [16, 8]: 8 is not a multiple of 32 */
    json_object_set_new(t, "dtype", json_string("q8_0"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest,
                "tensor 'tok_embd': shape [16, 8]: the last dimension is not a multiple of the "
                "q8_0 block (32)");
}

static void test_missing_tensor(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *ts = json_object_get(r, "tensors");
    size_t i;
    json_t *t;
    json_array_foreach(ts, i, t)
    {
        if (strcmp(json_string_value(json_object_get(t, "name")), "blk.1.ffn_up") == 0)
            break;
    }
    assert_int_equal(json_array_remove(ts, i), 0);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_NOT_FOUND, fx->manifest, "tensor 'blk.1.ffn_up' is missing (architecture llama, 2 layers)");
}

static void test_wrong_shape(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "blk.1.attn_k"); /* [4, 8] */
    json_object_set_new(t, "shape", json_pack("[i, i]", 8, 4));
    save_manifest(fx, r);
    char want[4200];
    snprintf(want, sizeof want,
             "%s: tensor 'blk.1.attn_k': shape [8, 4] does not match the architecture's [4, 8] "
             "(n_kv_heads*head_dim, dim)",
             fx->manifest);
    EXPECT_FAIL(fx, ERR_MISMATCH, want);

    r = load_manifest(fx);
    t = tensor_named(r, "blk.0.ffn_norm");
    json_object_set_new(t, "shape", json_pack("[i, i]", 1, 8));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'blk.0.ffn_norm': shape [1, 8] does not match the architecture's [8] (dim)");
}

static void test_norm_not_f32(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "output_norm");
    json_object_set_new(t, "dtype", json_string("bf16"));
    set_int(t, "size", 16);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'output_norm': dtype bf16, but norms must be f32");
}

static void test_unexpected_tensor(void **state)
{
    struct fx *fx = *state;
    static const char *const names[] = {"blk.1.ffn_upp", "blk.2.attn_q", "blk.01.attn_q",
                                        "blk.-1.attn_q", "blk..attn_q", "rope_freqs",
                                        "blk.99999999999999999999.attn_q"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        json_t *r = load_manifest(fx);
        json_object_set_new(tensor_named(r, "blk.1.ffn_up"), "name", json_string(names[i]));
        save_manifest(fx, r);
        char want[256];
        snprintf(want, sizeof want, "tensor '%s' is not a tensor of architecture llama with 2 "
                                    "layers (unexpected tensor)",
                 names[i]);
        EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, want);
        r = load_manifest(fx);
        json_object_set_new(tensor_named(r, names[i]), "name", json_string("blk.1.ffn_up"));
        save_manifest(fx, r);
    }
}

static void test_duplicate_name(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "blk.1.attn_v"), "name", json_string("blk.1.attn_k"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest,
                "tensor 'blk.1.attn_k' is listed twice (tensors[12] and tensors[13]): duplicate");
}

static void test_bad_names(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "blk.0.attn_q"), "name", json_string("blk.0 attn_q"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensors[2].name contains byte 0x20");

    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    r = load_manifest(fx);
    json_object_set_new(tensor_named(r, "blk.0 attn_q"), "name", json_string(longname));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensors[2].name is 199 bytes long, must be 1..127");

    r = load_manifest(fx);
    json_object_set_new(tensor_named(r, longname), "name", json_integer(3));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tensors[2].name is 3, not a string");
}

static void test_output_iff_untied(void **state)
{
    struct fx *fx = *state;
    /* untied but no "output" */
    json_t *r = load_manifest(fx);
    json_object_set_new(json_object_get(r, "hparams"), "tied_embeddings", json_false());
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_NOT_FOUND, fx->manifest,
                "tensor 'output' is missing (architecture llama, 2 layers, tied_embeddings false)");
    /* tied but "output" present */
    r = load_manifest(fx);
    json_object_set_new(json_object_get(r, "hparams"), "tied_embeddings", json_true());
    json_object_set_new(tensor_named(r, "tok_embd"), "name", json_string("output"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest,
                "tensor 'output' is present but hparams.tied_embeddings is true");
}

static void set_hparam(struct fx *fx, const char *key, json_t *v)
{
    json_t *r = load_manifest(fx);
    json_t *hp = json_object_get(r, "hparams");
    if (v)
        json_object_set_new(hp, key, v);
    else
        json_object_del(hp, key);
    save_manifest(fx, r);
}

static void test_hparams_out_of_range(void **state)
{
    struct fx *fx = *state;
    set_hparam(fx, "n_kv_heads", json_integer(3));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.n_heads 2 is not a multiple of n_kv_heads 3");
    set_hparam(fx, "n_kv_heads", json_integer(1));

    set_hparam(fx, "head_dim", json_integer(5));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.head_dim 5 is odd");
    set_hparam(fx, "head_dim", json_integer(4));

    set_hparam(fx, "dim", json_integer(0));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.dim is 0, outside 1..65536");
    set_hparam(fx, "dim", json_integer(8));

    set_hparam(fx, "n_layers", json_integer(-2));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.n_layers is -2, outside 1..1024");
    set_hparam(fx, "n_layers", json_integer(2));

    set_hparam(fx, "vocab_size", json_integer(5000000));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.vocab_size is 5000000, outside 1..4194304");
    set_hparam(fx, "vocab_size", json_integer(16));

    set_hparam(fx, "rope_theta", json_real(-1.0));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.rope_theta -1 must be finite and > 0");
    set_hparam(fx, "rope_theta", json_real(1e300));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.rope_theta 1e+300 does not fit a float");
    set_hparam(fx, "rope_theta", json_integer(10000)); /* an integer is a number too */

    set_hparam(fx, "rms_eps", json_real(1.0));
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.rms_eps 1 must be in (0, 1)");
    set_hparam(fx, "rms_eps", json_real(1e-60)); /* 0 as a float */
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.rms_eps 0 must be in (0, 1)");
    set_hparam(fx, "rms_eps", json_string("1e-5"));
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "hparams.rms_eps is \"1e-5\", not a number");
    set_hparam(fx, "rms_eps", json_string("0.000000000000000000000000000000000000000000000001"));
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest,
                "hparams.rms_eps is \"0.00000000000000000000000000000000000000000..., not a "
                "number");
    set_hparam(fx, "rms_eps", json_real(1e-5));

    set_hparam(fx, "ffn_dim", NULL);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "hparams.ffn_dim is missing");
    set_hparam(fx, "ffn_dim", json_integer(12));

    set_hparam(fx, "tied_embeddings", json_integer(1));
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "hparams.tied_embeddings is 1, not a boolean");
    set_hparam(fx, "tied_embeddings", json_true());

    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0); /* all restored */
    iebin_close(m);
}

static void test_blob_and_tokenizer_fields(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(json_object_get(r, "blob"), "file", json_string("../other.bin"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "blob.file is \"../other.bin\"; it must be");

    r = load_manifest(fx);
    json_object_set_new(json_object_get(r, "blob"), "file", json_string(IEBIN_BLOB));
    json_object_del(json_object_get(r, "blob"), "size");
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "blob.size is missing");

    r = load_manifest(fx);
    json_object_del(r, "blob");
    json_object_set_new(r, "tokenizer", json_string("/etc/passwd"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "tokenizer is \"/etc/passwd\"; it must be null");
}

static void test_tokenizer_missing(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(r, "tokenizer", json_string(IEBIN_TOKENIZER));
    save_manifest(fx, r);
    EXPECT_FAIL_FILE(fx, -ENOENT, tu_path(fx->dir, IEBIN_TOKENIZER),
                     "the manifest references it but it cannot be read");
}

static void test_unknown_keys_ignored(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_object_set_new(r, "future", json_string("x"));
    /* (this used "sliding_window" until gpt_oss made it a key llama refuses by name) */
    json_object_set_new(json_object_get(r, "hparams"), "future_window", json_integer(4));
    json_object_set_new(tensor_named(r, "tok_embd"), "checksum", json_string("abc"));
    json_object_del(r, "name");
    save_manifest(fx, r);
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    assert_string_equal(m->name, "");
    check_model(m, &tiny_hp, DT_F32, 1);
    iebin_close(m);
}

/* Tensors may come in any order in the manifest and in the blob. */
static void test_any_order(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *ts = json_object_get(r, "tensors");
    json_t *rev = json_array();
    for (size_t i = json_array_size(ts); i-- > 0;)
        json_array_append(rev, json_array_get(ts, i));
    json_object_set_new(r, "tensors", rev);
    save_manifest(fx, r);
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    assert_string_equal(m->tensors[0].name, "output_norm");
    const struct iebin_tensor *t = iebin_find(m, "blk.1.ffn_down");
    assert_non_null(t);
    assert_string_equal(t->name, "blk.1.ffn_down");
    iebin_close(m);
}

/* ---- the writer ---- */

static void test_writer_rejects(void **state)
{
    struct fx *fx = *state;
    struct iebin_writer *w;
    char *dir = strdup(tu_path(fx->root, "w"));
    uint64_t good[2] = {16, 8}, bad[2] = {16, 9};
    float data[16 * 9] = {0};

    tu_log_capture_begin();
    assert_int_equal(iebin_writer_create(dir, "gpt2", NULL, &tiny_hp, &w), ERR_UNSUPPORTED);
    tu_assert_log_contains("architecture 'gpt2' is not supported", NULL);
    struct iebin_hparams hp = tiny_hp;
    hp.n_kv_heads = 3;
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &hp, &w), ERR_RANGE);
    tu_assert_log_contains("hparams.n_heads 2 is not a multiple of n_kv_heads 3", NULL);

    /* wrong shape, caught at begin; the error then sticks */
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "tok_embd", DT_F32, bad, 2), ERR_MISMATCH);
    tu_assert_log_contains("model.ie.bin: tensor 'tok_embd': shape [16, 9] does not match the "
                           "architecture's [16, 8] (vocab_size, dim)",
                           NULL);
    assert_int_equal(iebin_writer_add(w, "tok_embd", DT_F32, good, 2, data, 512), ERR_MISMATCH);
    assert_int_equal(iebin_writer_finish(w), ERR_MISMATCH);

    /* unknown name, norm dtype, duplicate, oversize write, short tensor, size mismatch */
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "tok_embeddings", DT_F32, good, 2), ERR_FORMAT);
    tu_assert_log_contains("tensor 'tok_embeddings' is not a tensor of architecture llama", NULL);
    iebin_writer_abort(w);

    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "tok_embd", DT_Q4_0, good, 2), ERR_FORMAT);
    tu_assert_log_contains("tensor 'tok_embd': rows of 8 elements are not a whole number of "
                           "q4_0 blocks (32)",
                           NULL);
    iebin_writer_abort(w);

    uint64_t nshape[1] = {8};
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "output_norm", DT_F16, nshape, 1), ERR_MISMATCH);
    tu_assert_log_contains("tensor 'output_norm': dtype f16, but norms must be f32", NULL);
    iebin_writer_abort(w);

    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_add(w, "tok_embd", DT_F32, good, 2, data, 512), 0);
    assert_int_equal(iebin_writer_add(w, "tok_embd", DT_F32, good, 2, data, 512), ERR_FORMAT);
    tu_assert_log_contains("tensor 'tok_embd' written twice (duplicate name)", NULL);
    iebin_writer_abort(w);

    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "tok_embd", DT_F32, good, 2), 0);
    assert_int_equal(iebin_writer_write(w, data, 500), 0);
    assert_int_equal(iebin_writer_write(w, data, 16), ERR_RANGE);
    tu_assert_log_contains("tensor 'tok_embd': 4 more bytes written past its size 512", NULL);
    iebin_writer_abort(w);

    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "tok_embd", DT_F32, good, 2), 0);
    assert_int_equal(iebin_writer_write(w, data, 500), 0);
    assert_int_equal(iebin_writer_end(w), ERR_TRUNCATED);
    tu_assert_log_contains("tensor 'tok_embd': ended after 500 of its 512 bytes", NULL);
    iebin_writer_abort(w);

    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_add(w, "tok_embd", DT_F32, good, 2, data, 500), ERR_MISMATCH);
    tu_assert_log_contains("tensor 'tok_embd': 500 bytes given, its shape and dtype need 512",
                           NULL);
    iebin_writer_abort(w);

    /* state errors */
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_write(w, data, 4), ERR_STATE);
    tu_assert_log_contains("4 bytes written outside any tensor", NULL);
    iebin_writer_abort(w);
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_begin(w, "tok_embd", DT_F32, good, 2), 0);
    assert_int_equal(iebin_writer_finish(w), ERR_STATE);
    tu_assert_log_contains("tensor 'tok_embd' was begun but never ended", NULL);
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_set_tokenizer(w, "{}", 2), 0);
    assert_int_equal(iebin_writer_set_tokenizer(w, "{}", 2), ERR_STATE);
    tu_assert_log_contains("tokenizer set twice", NULL);
    iebin_writer_abort(w);
    iebin_writer_abort(NULL);
    tu_log_capture_end();

    /* none of this left a file behind (temporaries included) */
    char *out = NULL;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls -A '%s'", dir);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "");
    free(out);
    free(dir);
}

/* finish validates the whole set: an incomplete model is never committed, the old one stays. */
static void test_writer_incomplete_keeps_old(void **state)
{
    struct fx *fx = *state;
    struct iebin_writer *w;
    uint64_t shape[2] = {16, 8};
    float data[128] = {0};
    tu_log_capture_begin();
    assert_int_equal(iebin_writer_create(fx->dir, "llama", NULL, &tiny_hp, &w), 0);
    assert_int_equal(iebin_writer_add(w, "tok_embd", DT_F32, shape, 2, data, 512), 0);
    assert_int_equal(iebin_writer_finish(w), ERR_NOT_FOUND);
    tu_assert_log_contains(fx->manifest, "tensor 'output_norm' is missing",
                           "18 more missing", NULL);
    tu_log_capture_end();
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &tiny_hp, DT_F32, 1);
    iebin_close(m);
}

static void test_writer_unwritable_dir(void **state)
{
    struct fx *fx = *state;
    /* root ignores permission bits, so use a path whose parent is a regular file */
    const char *file = tu_path(fx->root, "plainfile");
    tu_write_file(file, "x", 1);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/sub/model", file);
    struct iebin_writer *w = (struct iebin_writer *)1;
    tu_log_capture_begin();
    assert_int_equal(iebin_writer_create(dir, "llama", NULL, &tiny_hp, &w), -ENOTDIR);
    tu_assert_log_contains("cannot create directory", file, "Not a directory", NULL);
    tu_log_capture_end();
    assert_null(w);

    /* the target itself is a regular file */
    tu_log_capture_begin();
    assert_int_equal(iebin_writer_create(file, "llama", NULL, &tiny_hp, &w), -ENOTDIR);
    tu_assert_log_contains("cannot create directory", file, NULL);
    tu_log_capture_end();

    tu_log_capture_begin();
    assert_int_equal(iebin_writer_create("", "llama", NULL, &tiny_hp, &w), -EINVAL);
    tu_assert_log_contains("output directory name is empty", NULL);
    tu_log_capture_end();

    /* /proc refuses new files */
    tu_log_capture_begin();
    assert_true(iebin_writer_create("/proc/self/clocher-model", "llama", NULL, &tiny_hp, &w) < 0);
    tu_assert_log_contains("/proc/self/clocher-model", NULL);
    tu_log_capture_end();
}

static char *ls(const char *dir)
{
    char cmd[4200], *out = NULL;
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>&1", dir);
    tu_run(cmd, &out);
    return out;
}

/* Disk full in a fresh directory: an error naming the file, and nothing at all left behind. */
static void test_disk_full_fresh(void **state)
{
    struct fx *fx = *state;
    const char *dir = tu_path(fx->root, "fresh");
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "1000", 1); /* the blob is ~4.6 KB */
    tu_log_capture_begin();
    assert_int_equal(write_model(dir, &tiny_hp, DT_F32, 5, NULL, 0), -ENOSPC);
    tu_assert_log_contains("model.ie.bin.tmp.", "No space left on device", NULL);
    tu_log_capture_end();
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    char *out = ls(dir);
    assert_string_equal(out, "");
    free(out);
    struct iebin_model *m;
    tu_log_capture_begin();
    assert_int_equal(iebin_open(dir, &m), -ENOENT);
    tu_log_capture_end();
}

/*
 * Disk full while replacing a model: every byte goes to temporaries before anything is
 * committed, so whichever file hits the limit (blob, tokenizer, manifest), the previous model
 * is still there, byte for byte, and no temporary remains.
 */
static void test_disk_full_keeps_old(void **state)
{
    struct fx *fx = *state;
    size_t old_len;
    char *old_manifest = tu_read_file(fx->manifest, &old_len);
    char *before = ls(fx->dir);

    /* 1: the blob hits the limit */
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "1000", 1);
    tu_log_capture_begin();
    assert_int_equal(write_model(fx->dir, &tiny_hp, DT_F32, 9, NULL, 0), -ENOSPC);
    tu_assert_log_contains("model.ie.bin.tmp.", NULL);

    /* 2: the tokenizer hits the limit */
    size_t big = 8000;
    char *tok = malloc(big);
    memset(tok, ' ', big);
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "6000", 1);
    assert_int_equal(write_model(fx->dir, &tiny_hp, DT_F32, 9, tok, big), -ENOSPC);
    tu_assert_log_contains("tokenizer.ie.json.tmp.", NULL);
    free(tok);

    /* 3: the manifest hits the limit: many thin layers make it larger than the blob */
    struct iebin_hparams thin = tiny_hp;
    thin.dim = 2, thin.n_heads = 1, thin.n_kv_heads = 1, thin.head_dim = 2, thin.ffn_dim = 1;
    thin.vocab_size = 1, thin.n_layers = 6;
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "4000", 1);
    assert_int_equal(write_model(fx->dir, &thin, DT_F32, 9, NULL, 0), -ENOSPC);
    tu_assert_log_contains("model.ie.json.tmp.", NULL);
    tu_log_capture_end();
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");

    char *after = ls(fx->dir);
    assert_string_equal(after, before);
    size_t len;
    char *j = tu_read_file(fx->manifest, &len);
    assert_int_equal(len, old_len);
    assert_memory_equal(j, old_manifest, len);
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &tiny_hp, DT_F32, 1);
    iebin_close(m);
    /* and the thin model does fit when the disk has room */
    assert_int_equal(write_model(fx->dir, &thin, DT_F32, 9, NULL, 0), 0);
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &thin, DT_F32, 9);
    iebin_close(m);
    free(j);
    free(old_manifest);
    free(before);
    free(after);
}

static void test_check_tensor_api(void **state)
{
    (void)state;
    uint64_t s[2] = {4, 8};
    tu_log_capture_begin();
    assert_int_equal(iebin_check_tensor("x", "llama", &tiny_hp, "blk.1.attn_v", DT_Q4_0, s, 2), 0);
    assert_int_equal(iebin_check_tensor("x", "mamba", &tiny_hp, "blk.1.attn_v", DT_F32, s, 2),
                     ERR_UNSUPPORTED);
    tu_assert_log_contains("x: architecture 'mamba' is not supported", NULL);
    tu_log_capture_end();
}


/* ---- architecture gpt_oss ---- */

static void test_gpt_oss_roundtrip(void **state)
{
    struct fx *fx = *state;
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &tiny_moe_hp, DT_BF16, 2);
    assert_true(iebin_layer_slides(&m->hp, 0));
    assert_false(iebin_layer_slides(&m->hp, 1));
    assert_false(iebin_layer_slides(&m->hp, 1023));
    const struct iebin_tensor *t = iebin_find(m, "blk.1." IEBIN_T_FFN_DOWN_EXPS);
    assert_non_null(t);
    assert_int_equal(t->n_dims, 3);
    assert_int_equal(t->size, 4 * 64 * (32 / 32) * 17); /* [4][64][32] mxfp4 */
    assert_null(iebin_find(m, "blk.0.ffn_gate")); /* a llama name */
    iebin_close(m);
    /* the manifest spells the gpt_oss keys as docs/IEBIN.md does */
    json_t *r = load_manifest(fx);
    json_t *hp = json_object_get(r, "hparams");
    assert_string_equal(json_string_value(json_object_get(r, "architecture")), "gpt_oss");
    assert_string_equal(json_string_value(json_array_get(json_object_get(hp, "layer_types"), 0)),
                        "sliding_attention");
    assert_string_equal(json_string_value(json_array_get(json_object_get(hp, "layer_types"), 1)),
                        "full_attention");
    json_t *rs = json_object_get(hp, "rope_scaling");
    assert_string_equal(json_string_value(json_object_get(rs, "type")), "yarn");
    assert_true(json_is_false(json_object_get(rs, "truncate")));
    assert_int_equal(json_integer_value(json_object_get(rs, "original_max_position_embeddings")),
                     4096);
    assert_true(json_real_value(json_object_get(hp, "swiglu_alpha")) == 1.702);
    json_decref(r);

    /* truncate true round-trips too, and a model may have no sliding layer */
    struct iebin_hparams hp2 = tiny_moe_hp;
    hp2.rope_scaling.truncate = true;
    hp2.sliding_layers[0] = 0;
    assert_int_equal(write_model(fx->dir, &hp2, DT_F32, 3, NULL, 0), 0);
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    check_model(m, &hp2, DT_F32, 3);
    assert_false(iebin_layer_slides(&m->hp, 0));
    iebin_close(m);
}

static void test_gpt_oss_layer_types(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *lt = json_object_get(json_object_get(r, "hparams"), "layer_types");
    json_array_set_new(lt, 1, json_string("local_attention"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_UNSUPPORTED, fx->manifest,
                "hparams.layer_types[1] is \"local_attention\"", "unknown layer type");

    r = load_manifest(fx);
    lt = json_object_get(json_object_get(r, "hparams"), "layer_types");
    json_array_set_new(lt, 1, json_integer(1));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "hparams.layer_types[1] is 1, not a string");
}

static void test_gpt_oss_layer_types_length(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *lt = json_object_get(json_object_get(r, "hparams"), "layer_types");
    json_array_append_new(lt, json_string("full_attention"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest,
                "hparams.layer_types has 3 entries, but n_layers is 2");
    r = load_manifest(fx);
    json_object_del(json_object_get(r, "hparams"), "layer_types");
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "hparams.layer_types is missing, not an array");
}

static void test_gpt_oss_experts_used(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    set_int(json_object_get(r, "hparams"), "n_experts_used", 5);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest,
                "hparams.n_experts_used 5 is above hparams.n_experts 4");
    r = load_manifest(fx);
    set_int(json_object_get(r, "hparams"), "n_experts", 0);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest, "hparams.n_experts is 0, outside 1..4096");
    /* and through the API the converters and the writer use */
    struct iebin_hparams hp = tiny_moe_hp;
    hp.n_experts_used = 5;
    tu_log_capture_begin();
    assert_int_equal(iebin_check_hparams(&hp, "conv"), ERR_RANGE);
    tu_assert_log_contains("conv: hparams.n_experts_used 5 is outside 1..n_experts (n_experts 4)",
                           NULL);
    struct iebin_writer *w = NULL;
    assert_int_equal(iebin_writer_create(fx->dir, "gpt_oss", "x", &hp, &w), ERR_RANGE);
    assert_null(w);
    tu_log_capture_end();
}

static void test_gpt_oss_missing_sinks(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *ts = json_object_get(r, "tensors");
    size_t i;
    json_t *t;
    json_array_foreach(ts, i, t) {
        if (strcmp(json_string_value(json_object_get(t, "name")), "blk.1.attn_sinks") == 0)
            break;
    }
    assert_int_equal(json_array_remove(ts, i), 0);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_NOT_FOUND, fx->manifest,
                "tensor 'blk.1.attn_sinks' is missing (architecture gpt_oss, 2 layers)");
}

static void test_gpt_oss_sinks_and_biases_f32(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "blk.0.attn_sinks");
    json_object_set_new(t, "dtype", json_string("bf16"));
    set_int(t, "size", 8);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'blk.0.attn_sinks': dtype bf16, but sinks must be f32");
    r = load_manifest(fx);
    t = tensor_named(r, "blk.0.attn_sinks");
    json_object_set_new(t, "dtype", json_string("f32"));
    set_int(t, "size", 16);
    t = tensor_named(r, "blk.1.ffn_up_exps_bias");
    json_object_set_new(t, "dtype", json_string("f16"));
    set_int(t, "size", 4 * 32 * 2);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'blk.1.ffn_up_exps_bias': dtype f16, but biases must be f32");
}

static void test_gpt_oss_expert_shape(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "blk.0.ffn_down_exps");
    /* [4][32][64] has the same size as the expected [4][64][32] */
    json_array_set_new(json_object_get(t, "shape"), 1, json_integer(32));
    json_array_set_new(json_object_get(t, "shape"), 2, json_integer(64));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'blk.0.ffn_down_exps': shape [4, 32, 64] does not match the "
                "architecture's [4, 64, 32] (n_experts, dim, ffn_dim)");
}

static void test_gpt_oss_mxfp4_ragged_row(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "blk.0.ffn_gate_exps");
    json_array_set_new(json_object_get(t, "shape"), 2, json_integer(48));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest,
                "tensor 'blk.0.ffn_gate_exps': shape [4, 32, 48]: the last dimension is not a "
                "multiple of the mxfp4 block (32)");
}

static void test_gpt_oss_truncated_experts(void **state)
{
    struct fx *fx = *state;
    /* a record whose size is short of its shape */
    json_t *r = load_manifest(fx);
    json_t *t = tensor_named(r, "blk.1.ffn_up_exps");
    set_int(t, "size", get_int(t, "size") - 17);
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_MISMATCH, fx->manifest,
                "tensor 'blk.1.ffn_up_exps': size 4335 does not match shape [4, 32, 64] x "
                "mxfp4 = 4352 bytes");
    /* a blob cut inside the last expert tensor */
    struct fx *fx2 = NULL;
    void *st2 = NULL;
    fx_setup_gpt_oss(&st2);
    fx2 = st2;
    r = load_manifest(fx2);
    uint64_t end = 0;
    size_t i;
    json_array_foreach(json_object_get(r, "tensors"), i, t) {
        uint64_t e = (uint64_t)(get_int(t, "offset") + get_int(t, "size"));
        if (strcmp(json_string_value(json_object_get(t, "name")), "blk.1.ffn_down_exps") == 0)
            end = e;
    }
    json_decref(r);
    assert_int_equal(truncate(fx2->blob, (off_t)(end - 100)), 0);
    EXPECT_FAIL_FILE(fx2, ERR_TRUNCATED, fx2->blob, "(truncated)");
    fx_teardown(&st2);
}

static void test_gpt_oss_rope_scaling(void **state)
{
    struct fx *fx = *state;
    json_t *r = load_manifest(fx);
    json_t *rs = json_object_get(json_object_get(r, "hparams"), "rope_scaling");
    json_object_set_new(rs, "mscale", json_real(1.0));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, "hparams.rope_scaling.mscale is an unknown key");

    static const char *const keys[] = {"type", "factor", "beta_fast", "beta_slow",
                                       "original_max_position_embeddings", "truncate"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        r = load_manifest(fx);
        rs = json_object_get(json_object_get(r, "hparams"), "rope_scaling");
        json_object_del(rs, "mscale");
        json_t *keep = json_incref(json_object_get(rs, keys[k]));
        json_object_del(rs, keys[k]);
        save_manifest(fx, r);
        char want[128];
        snprintf(want, sizeof want, "hparams.rope_scaling.%s is missing", keys[k]);
        EXPECT_FAIL(fx, ERR_FORMAT, fx->manifest, want);
        r = load_manifest(fx);
        json_object_set_new(json_object_get(json_object_get(r, "hparams"), "rope_scaling"),
                            keys[k], keep);
        save_manifest(fx, r);
    }
    r = load_manifest(fx);
    rs = json_object_get(json_object_get(r, "hparams"), "rope_scaling");
    json_object_set_new(rs, "type", json_string("linear"));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_UNSUPPORTED, fx->manifest,
                "hparams.rope_scaling.type \"linear\" is not supported (known: yarn)");
    r = load_manifest(fx);
    rs = json_object_get(json_object_get(r, "hparams"), "rope_scaling");
    json_object_set_new(rs, "type", json_string("yarn"));
    json_object_set_new(rs, "beta_fast", json_real(0.5));
    save_manifest(fx, r);
    EXPECT_FAIL(fx, ERR_RANGE, fx->manifest,
                "hparams.rope_scaling.beta_fast 0.5 and beta_slow 1 must be finite with "
                "beta_fast > beta_slow > 0");
}

/* gpt_oss keys on a llama model: refused by name, never ignored (they change the numbers) */
static void test_gpt_oss_keys_on_llama(void **state)
{
    struct fx *fx = *state; /* the llama fixture */
    /* sliding_window is llama's too (every layer: Mistral, docs/IEBIN.md) */
    static const char *const keys[] = {"n_experts",    "n_experts_used", "layer_types",
                                       "rope_scaling", "swiglu_limit",   "swiglu_alpha"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        json_t *r = load_manifest(fx);
        json_t *hp = json_object_get(r, "hparams");
        json_object_set_new(hp, keys[k], json_integer(4));
        save_manifest(fx, r);
        char want[128];
        snprintf(want, sizeof want,
                 "hparams.%s is a gpt_oss key; architecture llama does not implement it", keys[k]);
        EXPECT_FAIL(fx, ERR_UNSUPPORTED, fx->manifest, want);
        r = load_manifest(fx);
        json_object_del(json_object_get(r, "hparams"), keys[k]);
        save_manifest(fx, r);
    }
    /* the same through the struct: a llama set with a gpt_oss field set */
    struct iebin_hparams hp = tiny_hp;
    hp.sliding_window = 4096;
    tu_log_capture_begin();
    assert_int_equal(iebin_check_hparams(&hp, "conv"), ERR_RANGE);
    tu_assert_log_contains("conv: hparams.sliding_window is set, but architecture llama does not "
                           "implement it",
                           NULL);
    hp = tiny_hp;
    hp.rope_scaling.type = IEBIN_ROPE_YARN;
    assert_int_equal(iebin_check_hparams(&hp, "conv"), ERR_RANGE);
    tu_assert_log_contains("conv: hparams.rope_scaling is set", NULL);
    /* and a gpt_oss model named llama (or the reverse) is refused by the writer */
    struct iebin_writer *w = NULL;
    assert_int_equal(iebin_writer_create(fx->dir, "llama", "x", &tiny_moe_hp, &w), ERR_MISMATCH);
    assert_int_equal(iebin_writer_create(fx->dir, "gpt_oss", "x", &tiny_hp, &w), ERR_MISMATCH);
    assert_null(w);
    uint64_t s[2] = {4, 64};
    assert_int_equal(iebin_check_tensor("x", "llama", &tiny_moe_hp, "blk.0.ffn_router", DT_F32,
                                        s, 2),
                     ERR_MISMATCH);
    assert_int_equal(iebin_check_tensor("x", "gpt_oss", &tiny_moe_hp, "blk.0.ffn_router", DT_F32,
                                        s, 2),
                     0);
    tu_log_capture_end();
    /* llama models still load */
    struct iebin_model *m;
    assert_int_equal(iebin_open(fx->dir, &m), 0);
    iebin_close(m);
}

#define FX(t) cmocka_unit_test_setup_teardown(t, fx_setup, fx_teardown)
#define FXG(t) cmocka_unit_test_setup_teardown(t, fx_setup_gpt_oss, fx_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        FX(test_roundtrip),
        FX(test_roundtrip_untied_block_types),
        FX(test_tokenizer_and_replace),
        FX(test_manifest_text),
        FX(test_missing_manifest),
        FX(test_missing_blob),
        FX(test_truncated_blob),
        FX(test_blob_size_mismatch),
        FX(test_truncated_manifest),
        FX(test_invalid_json),
        FX(test_trailing_garbage),
        FX(test_invalid_utf8),
        FX(test_duplicate_key),
        FX(test_not_an_object),
        FX(test_manifest_too_large),
        FX(test_wrong_format),
        FX(test_version_2),
        FX(test_version_missing),
        FX(test_unknown_architecture),
        FX(test_unknown_dtype),
        FX(test_offset_beyond_blob),
        FX(test_size_beyond_blob),
        FX(test_offset_size_overflow),
        FX(test_size_too_large),
        FX(test_misaligned_offset),
        FX(test_overlapping_tensors),
        FX(test_shape_size_mismatch),
        FX(test_dims_product_overflow),
        FX(test_zero_dimension),
        FX(test_negative_dimension),
        FX(test_huge_dimension),
        FX(test_non_integer_dimension),
        FX(test_bad_dims_count),
        FX(test_ragged_block),
        FX(test_missing_tensor),
        FX(test_wrong_shape),
        FX(test_norm_not_f32),
        FX(test_unexpected_tensor),
        FX(test_duplicate_name),
        FX(test_bad_names),
        FX(test_output_iff_untied),
        FX(test_hparams_out_of_range),
        FX(test_blob_and_tokenizer_fields),
        FX(test_tokenizer_missing),
        FX(test_unknown_keys_ignored),
        FX(test_any_order),
        FX(test_writer_rejects),
        FX(test_writer_incomplete_keeps_old),
        FX(test_writer_unwritable_dir),
        FX(test_disk_full_fresh),
        FX(test_disk_full_keeps_old),
        FX(test_check_tensor_api),
        FXG(test_gpt_oss_roundtrip),
        FXG(test_gpt_oss_layer_types),
        FXG(test_gpt_oss_layer_types_length),
        FXG(test_gpt_oss_experts_used),
        FXG(test_gpt_oss_missing_sinks),
        FXG(test_gpt_oss_sinks_and_biases_f32),
        FXG(test_gpt_oss_expert_shape),
        FXG(test_gpt_oss_mxfp4_ragged_row),
        FXG(test_gpt_oss_truncated_experts),
        FXG(test_gpt_oss_rope_scaling),
        FX(test_gpt_oss_keys_on_llama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
