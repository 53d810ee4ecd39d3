/*
 * test_synth_adapter.c — `clocher synth-adapter` (cmd_synth_adapter, compiled into this test
 * since the `clocher` binary needs every subcommand) on the stories260K base: the files are
 * PEFT-shaped and load, same seed -> same bytes, seeds and dtypes differ as they should,
 * usage errors exit 2, a bad base exits 3, an unwritable output exits 1.
 */
#include "testutil.h"

#include "cmds.h"
#include "err.h"
#include "iebin.h"
#include "llama2c.h"
#include "lora.h"
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_tmp, *g_base;

static int setup(void **state)
{
    (void)state;
    g_tmp = tu_mkdtemp();
    g_base = strdup(tu_path(g_tmp, "base"));
    return llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, g_base, DT_BF16,
                           NULL);
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_tmp);
    free(g_tmp);
    free(g_base);
    return 0;
}

/* runs cmd_synth_adapter with a NULL-terminated argument list */
static int synth(const char *first, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "synth-adapter";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return cmd_synth_adapter(argc, argv);
}

static char *dir(const char *name) { return strdup(tu_path(g_tmp, name)); }

static void assert_same_file(const char *a, const char *b, bool same)
{
    size_t la, lb;
    char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    if (same) {
        assert_int_equal(la, lb);
        assert_memory_equal(x, y, la);
    } else {
        assert_true(la != lb || memcmp(x, y, la) != 0);
    }
    free(x);
    free(y);
}

static void test_writes_loadable_peft(void **state)
{
    (void)state;
    char *d = dir("a1");
    assert_int_equal(synth(g_base, d, "--rank", "6", "--alpha", "12", "--targets",
                           "q,k,down", "--seed", "9", NULL),
                     CMD_EXIT_OK);
    /* the configuration */
    json_error_t e;
    json_t *cfg = json_load_file(tu_path(d, LORA_CONFIG_FILE), 0, &e);
    assert_non_null(cfg);
    assert_string_equal(json_string_value(json_object_get(cfg, "peft_type")), "LORA");
    assert_int_equal(json_integer_value(json_object_get(cfg, "r")), 6);
    assert_true(json_number_value(json_object_get(cfg, "lora_alpha")) == 12.0);
    json_t *mods = json_object_get(cfg, "target_modules");
    assert_int_equal(json_array_size(mods), 3);
    assert_string_equal(json_string_value(json_array_get(mods, 0)), "q_proj");
    assert_string_equal(json_string_value(json_array_get(mods, 1)), "k_proj");
    assert_string_equal(json_string_value(json_array_get(mods, 2)), "down_proj");
    assert_string_equal(json_string_value(json_object_get(cfg, "base_model_name_or_path")),
                        "stories260K");
    json_decref(cfg);

    /* the tensors: PEFT names, shapes, f32, B non-zero and finite */
    struct safetensors_file *f;
    assert_int_equal(safetensors_open(tu_path(d, LORA_WEIGHTS_FILE), &f), 0);
    assert_int_equal(f->n_tensors, 5 * 3 * 2);
    assert_string_equal(safetensors_metadata(f, "format"), "pt");
    const struct safetensors_tensor *t =
        safetensors_find(f, "base_model.model.model.layers.4.mlp.down_proj.lora_B.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, SAFETENSORS_F32);
    assert_int_equal(t->shape[0], 64);
    assert_int_equal(t->shape[1], 6);
    t = safetensors_find(f, "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 6);
    assert_int_equal(t->shape[1], 64);
    for (size_t i = 0; i < f->n_tensors; i++) {
        float sum = 0.0f;
        for (uint64_t k = 0; k < f->tensors[i].size / 4; k++) {
            float v;
            memcpy(&v, (const char *)f->tensors[i].data + 4 * k, 4);
            assert_true(isfinite(v));
            sum += fabsf(v);
        }
        assert_true(sum > 0.0f);
    }
    safetensors_close(f);

    /* it loads against the base */
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_base, &m), 0);
    struct lora_adapter *ad;
    assert_int_equal(lora_open(d, &m->hp, &ad), 0);
    assert_true(ad->cfg.scaling == 2.0f);
    assert_non_null(lora_weights(ad, 3, LORA_K));
    assert_null(lora_weights(ad, 3, LORA_V));
    lora_close(ad);
    iebin_close(m);
    free(d);
}

static void test_deterministic(void **state)
{
    (void)state;
    char *a = dir("d1"), *b = dir("d2"), *c = dir("d3"), *h = dir("d4"), *q = dir("d5");
    assert_int_equal(synth(g_base, a, "--rank", "4", "--seed", "123", "--targets", "all", NULL), 0);
    assert_int_equal(synth("--seed", "123", "--rank", "4", g_base, b, "--targets", "all", NULL),
                     0);
    assert_int_equal(synth(g_base, c, "--rank", "4", "--seed", "124", "--targets", "all", NULL), 0);
    assert_same_file(tu_path(a, LORA_WEIGHTS_FILE), tu_path(b, LORA_WEIGHTS_FILE), true);
    assert_same_file(tu_path(a, LORA_CONFIG_FILE), tu_path(b, LORA_CONFIG_FILE), true);
    assert_same_file(tu_path(a, LORA_WEIGHTS_FILE), tu_path(c, LORA_WEIGHTS_FILE), false);
    /* rewriting a directory replaces the adapter */
    assert_int_equal(synth(g_base, c, "--rank", "4", "--seed", "123", "--targets", "all", NULL), 0);
    assert_same_file(tu_path(a, LORA_WEIGHTS_FILE), tu_path(c, LORA_WEIGHTS_FILE), true);

    /* a projection's weights do not depend on the other targets chosen */
    assert_int_equal(synth(g_base, h, "--rank", "4", "--seed", "123", "--targets", "v", NULL), 0);
    struct safetensors_file *fa, *fh;
    assert_int_equal(safetensors_open(tu_path(a, LORA_WEIGHTS_FILE), &fa), 0);
    assert_int_equal(safetensors_open(tu_path(h, LORA_WEIGHTS_FILE), &fh), 0);
    const char *nm = "base_model.model.model.layers.2.self_attn.v_proj.lora_B.weight";
    const struct safetensors_tensor *ta = safetensors_find(fa, nm), *th = safetensors_find(fh, nm);
    assert_non_null(ta);
    assert_non_null(th);
    assert_int_equal(ta->size, th->size);
    assert_memory_equal(ta->data, th->data, ta->size);
    safetensors_close(fa);
    safetensors_close(fh);

    /* f16 / bf16 output: the same values rounded, and they load */
    assert_int_equal(synth(g_base, q, "--rank", "4", "--seed", "123", "--targets", "all",
                           "--dtype", "f16", NULL),
                     0);
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_base, &m), 0);
    struct lora_adapter *a32, *a16;
    assert_int_equal(lora_open(a, &m->hp, &a32), 0);
    assert_int_equal(lora_open(q, &m->hp, &a16), 0);
    const struct lora_weights *w32 = lora_weights(a32, 1, LORA_GATE),
                              *w16 = lora_weights(a16, 1, LORA_GATE);
    for (size_t i = 0; i < 4 * 64; i++)
        assert_true(fabsf(w32->a[i] - w16->a[i]) <= 1e-3f * fabsf(w32->a[i]) + 1e-7f);
    lora_close(a32);
    lora_close(a16);
    iebin_close(m);
    free(a);
    free(b);
    free(c);
    free(h);
    free(q);
}

static void test_errors(void **state)
{
    (void)state;
    char *d = dir("err");
    /* usage: exit 2 with a message */
    struct {
        const char *args[8];
        const char *needle;
    } usage[] = {
        {{g_base, d, NULL}, "--rank is required"},
        {{g_base, "--rank", "4", NULL}, "expected BASE_DIR and OUT_DIR"},
        {{g_base, d, "x", "--rank", "4", NULL}, "expected BASE_DIR and OUT_DIR"},
        {{g_base, d, "--rank", "0", NULL}, "--rank '0'"},
        {{g_base, d, "--rank", "2000", NULL}, "--rank '2000'"},
        {{g_base, d, "--rank", "4x", NULL}, "--rank '4x'"},
        {{g_base, d, "--rank", "4", "--targets", "q,lm_head", NULL}, "unknown projection 'lm_head'"},
        {{g_base, d, "--rank", "4", "--targets", "q,", NULL}, "--targets 'q,'"},
        {{g_base, d, "--rank", "4", "--dtype", "q8_0", NULL}, "--dtype 'q8_0'"},
        {{g_base, d, "--rank", "4", "--alpha", "0", NULL}, "--alpha '0'"},
        {{g_base, d, "--rank", "4", "--alpha", "nan", NULL}, "--alpha 'nan'"},
        {{g_base, d, "--rank", "4", "--seed", "-1", NULL}, "--seed '-1'"},
        {{g_base, d, "--rank", "4", "--strength", "0", NULL}, "--strength '0'"},
        {{g_base, d, "--rank", "4", "--bogus", NULL}, "unknown or incomplete option"},
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        /* the command prints usage errors on stderr: capture it in memory */
        const char **a = usage[i].args;
        fflush(stderr);
        FILE *saved = stderr;
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        stderr = mem;
        int rc = synth(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
        fflush(mem);
        stderr = saved;
        fclose(mem);
        if (rc != CMD_EXIT_USAGE || !strstr(buf, usage[i].needle))
            fail_msg("case %zu: exit %d, stderr: %s (want 2 and '%s')", i, rc, buf,
                     usage[i].needle);
        free(buf);
    }
    /* --help: exit 0 */
    FILE *saved = stdout;
    char *buf = NULL;
    size_t len = 0;
    stdout = open_memstream(&buf, &len);
    assert_int_equal(synth("--help", NULL), CMD_EXIT_OK);
    fclose(stdout);
    stdout = saved;
    assert_non_null(strstr(buf, "usage: clocher synth-adapter"));
    free(buf);

    /* a base that is not a model: exit 3, the reason logged */
    tu_log_capture_begin();
    assert_int_equal(synth(g_tmp, d, "--rank", "4", NULL), CMD_EXIT_INPUT);
    tu_assert_log_contains("model.ie.json", NULL);
    tu_log_capture_end();

    /* an output directory that cannot be created: exit 1, nothing loadable left */
    const char *file = tu_path(g_tmp, "plain_file");
    tu_write_file(file, "x", 1);
    char *under = strdup(tu_path(file, "adapter"));
    tu_log_capture_begin();
    assert_int_equal(synth(g_base, under, "--rank", "4", NULL), CMD_EXIT_FAIL);
    tu_assert_log_contains("plain_file", NULL);
    tu_log_capture_end();
    free(under);

    /* a full disk while writing the weights: exit 1, no configuration left behind, and a
     * previous adapter's configuration is gone too (it must not pair with other weights) */
    assert_int_equal(synth(g_base, d, "--rank", "4", NULL), CMD_EXIT_OK);
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "1000", 1);
    tu_log_capture_begin();
    int rc = synth(g_base, d, "--rank", "64", "--targets", "all", NULL);
    tu_log_capture_end();
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    assert_int_equal(rc, CMD_EXIT_FAIL);
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_base, &m), 0);
    struct lora_adapter *ad;
    tu_log_capture_begin();
    assert_int_equal(lora_open(d, &m->hp, &ad), -ENOENT);
    tu_assert_log_contains("adapter_config.json", NULL);
    tu_log_capture_end();
    iebin_close(m);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writes_loadable_peft),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
