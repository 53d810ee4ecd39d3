/*
 * test_kv_cli.c — `inference-engine --kv-dtype`, run as a process on stories260K (f32
 * import): a name that is not a KV type is a usage error (exit 2) naming the choices; every
 * KV type serves a greedy request through the engine (--kv-dtype implies --concurrency 1),
 * and f16, bf16 and int8 give f32's first 8 greedy tokens (measured: int8 agrees for 25+,
 * fp8 departs at the third: docs/PERFORMANCE.md "KV cache dtypes").
 */
#include "testutil.h"

#include "golden.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_NEW 20

/* Runs inference-engine with args; returns the exit status, stdout in *out, stderr in *err. */
static int run(const char *args, const char *errpath, char **out, char **err)
{
    char cmd[16384];
    int n = snprintf(cmd, sizeof cmd, "%s %s 2>%s", tu_build_path("worker/inference-engine"),
                     args, errpath);
    assert_true(n > 0 && (size_t)n < sizeof cmd);
    int rc = tu_run(cmd, out);
    size_t len;
    *err = tu_read_file(errpath, &len);
    return rc;
}

/* The generated ids of the one request in a --concurrency JSON line. */
static void ids_of(const char *out, int32_t *ids)
{
    json_error_t je;
    json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    if (!j)
        fail_msg("not JSON: %s (%s)", out, je.text);
    json_t *g = json_object_get(j, "generated_ids");
    json_t *a = json_is_array(g) ? json_array_get(g, 0) : NULL;
    if (!json_is_array(a) || json_array_size(a) != N_NEW)
        fail_msg("no %d generated ids for the request: %s", N_NEW, out);
    for (size_t i = 0; i < N_NEW; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    json_decref(j);
}

static void test_kv_dtype_flag(void **state)
{
    (void)state;
    char *tmp = NULL, *dir = golden_import(DT_F32, &tmp);
    char errpath[4200], args[5000];
    snprintf(errpath, sizeof errpath, "%s/stderr", tmp);
    char *out, *err;

    snprintf(args, sizeof args, "--model-dir %s --prompt-ids 1,100 --kv-dtype int9", dir);
    assert_int_equal(run(args, errpath, &out, &err), 2);
    if (!strstr(err, "--kv-dtype: 'int9' is not one of f32, f16, bf16, int8, fp8"))
        fail_msg("stderr: %s", err);
    assert_string_equal(out, "");
    free(out);
    free(err);
    snprintf(args, sizeof args, "--model-dir %s --prompt-ids 1,100 --kv-dtype q8_0", dir);
    assert_int_equal(run(args, errpath, &out, &err), 2); /* a weight type is not a KV type */
    free(out);
    free(err);

    const char *dts[] = {"f32", "f16", "bf16", "int8", "fp8"};
    int32_t ref[N_NEW], ids[N_NEW];
    for (size_t d = 0; d < 5; d++) {
        snprintf(args, sizeof args,
                 "--model-dir %s --prompt-ids 1,100 --max-new %d --greedy --ignore-eos "
                 "--print-ids --quiet --threads 1 --kv-dtype %s",
                 dir, N_NEW, dts[d]);
        int rc = run(args, errpath, &out, &err);
        if (rc != 0)
            fail_msg("--kv-dtype %s: exit %d, stderr:\n%s", dts[d], rc, err);
        ids_of(out, d == 0 ? ref : ids);
        if (d > 0 && d < 4)
            for (int i = 0; i < 8; i++)
                if (ids[i] != ref[i])
                    fail_msg("--kv-dtype %s: greedy token %d is %d, f32 gives %d", dts[d], i,
                             ids[i], ref[i]);
        free(out);
        free(err);
    }
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_dtype_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
