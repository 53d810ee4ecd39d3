/*
 * test_quant_manifest.c — `--quant-manifest` rules and the calibration library:
 *  - every malformed manifest is refused with a message naming the rule and the field
 *    (JSON syntax, wrong types, unknown keys, unknown dtypes, unsupported group/scale/zero
 *    layouts, bad regexes, versions, empty and oversized rule lists);
 *  - first match wins, norms are never affected, unmatched tensors keep --dtype;
 *  - a conversion of stories260K with a manifest stores exactly the dtypes the rules ask for;
 *  - calib_run on identical models reports KL 0, top-1 1 and cosine 1; on a coarser
 *    quantization it reports a positive KL and calib_check refuses strict thresholds.
 */
#include "testutil.h"

#include "calib.h"
#include "convert.h"
#include "err.h"
#include "iebin.h"
#include "quant_manifest.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S260K "stories260K/stories260K.bin"

static void expect_refused(const char *json, int code, const char *needle)
{
    struct quant_manifest *m = (void *)1;
    tu_log_capture_begin();
    int rc = qm_parse(json, strlen(json), "m.json", &m);
    if (rc != code || !strstr(tu_log_captured(), needle))
        fail_msg("manifest %s: rc %s (wanted %s), log '%s' (wanted '%s')", json, err_name(rc),
                 err_name(code), tu_log_captured(), needle);
    assert_null(m);
    tu_log_capture_end();
}

static void test_malformed(void **state)
{
    (void)state;
    expect_refused("", ERR_FORMAT, "not valid JSON");
    expect_refused("{\"version\": 1, \"rules\": [", ERR_FORMAT, "not valid JSON");
    expect_refused("[]", ERR_FORMAT, "expected a JSON object");
    expect_refused("{\"rules\": [{\"pattern\": \".\", \"dtype\": \"f32\"}]}", ERR_FORMAT,
                   "\"version\"");
    expect_refused("{\"version\": 2, \"rules\": [{\"pattern\": \".\", \"dtype\": \"f32\"}]}",
                   ERR_UNSUPPORTED, "version\" 2");
    expect_refused("{\"version\": 1, \"rules\": []}", ERR_FORMAT, "non-empty array");
    expect_refused("{\"version\": 1, \"rulez\": []}", ERR_FORMAT, "unknown top-level field 'rulez'");
    expect_refused("{\"version\": 1, \"rules\": [7]}", ERR_FORMAT, "rules[0]: expected an object");
    expect_refused("{\"version\": 1, \"rules\": [{\"dtype\": \"f32\"}]}", ERR_FORMAT,
                   "rules[0]: missing field 'pattern'");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\"}]}", ERR_FORMAT,
                   "rules[0]: missing field 'dtype'");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": 3, \"dtype\": \"f32\"}]}",
                   ERR_FORMAT, "rules[0].pattern: expected a string");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"f32\"},"
                   " {\"pattern\": \".\", \"dtype\": \"int3\"}]}",
                   ERR_FORMAT, "rules[1].dtype: 'int3'");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \"(\", \"dtype\": \"f32\"}]}",
                   ERR_FORMAT, "rules[0].pattern '('");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"f32\", "
                   "\"zero_point\": \"none\"}]}",
                   ERR_FORMAT, "unknown field 'zero_point'");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"bf16\", "
                   "\"group\": 32}]}",
                   ERR_FORMAT, "takes no group");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int4w\", "
                   "\"group\": \"32\"}]}",
                   ERR_FORMAT, "rules[0].group: expected an integer");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int4w\", "
                   "\"group\": 256}]}",
                   ERR_UNSUPPORTED, "rules[0].group: int4w with groups of 256");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int4w\", "
                   "\"group\": 16}]}",
                   ERR_UNSUPPORTED, "runs groups of 32, 64 or 128");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int8w\", "
                   "\"group\": 64}]}",
                   ERR_UNSUPPORTED, "rules[0].group: int8w with groups of 64");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"q4_k\", "
                   "\"group\": 32}]}",
                   ERR_UNSUPPORTED, "q4_k with groups of 32 is not supported (the engine runs "
                                    "groups of 256)");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"q6_k\", "
                   "\"zero\": \"per-group\"}]}",
                   ERR_UNSUPPORTED, "per-group zero points are not supported for q6_k");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int8w\", "
                   "\"scale\": \"per-channel\"}]}",
                   ERR_UNSUPPORTED, "rules[0].scale: per-channel");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int8w\", "
                   "\"zero\": \"per-group\"}]}",
                   ERR_UNSUPPORTED, "rules[0].zero: per-group zero points are not supported for "
                                    "int8w");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"int4w\", "
                   "\"zero\": \"maybe\"}]}",
                   ERR_FORMAT, "rules[0].zero: 'maybe'");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \".\", \"dtype\": \"f32\", "
                   "\"pattern\": \"x\"}]}",
                   ERR_FORMAT, "not valid JSON"); /* duplicate keys are refused */
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \"(a{1,200}){200}\", "
                   "\"dtype\": \"f32\"}]}",
                   ERR_FORMAT, "rules[0].pattern: too many repetitions");
    expect_refused("{\"version\": 1, \"rules\": [{\"pattern\": \"a++\", \"dtype\": \"f32\"}]}",
                   ERR_FORMAT, "a quantifier follows a quantifier at offset 2");
    /* more rules than QM_MAX_RULES */
    size_t cap = 64 + (QM_MAX_RULES + 1) * 40;
    char *big = malloc(cap), *p = big;
    p += sprintf(p, "{\"version\": 1, \"rules\": [");
    for (int i = 0; i <= QM_MAX_RULES; i++)
        p += sprintf(p, "%s{\"pattern\": \".\", \"dtype\": \"f32\"}", i ? "," : "");
    sprintf(p, "]}");
    expect_refused(big, ERR_RANGE, "rules (at most");
    free(big);
    /* a missing file names itself */
    struct quant_manifest *m;
    tu_log_capture_begin();
    assert_int_equal(qm_load("/nonexistent/m.json", &m), -ENOENT);
    tu_assert_log_contains("/nonexistent/m.json", NULL);
    tu_log_capture_end();
}

static void test_first_match_wins(void **state)
{
    (void)state;
    const char *j = "{\"version\": 1, \"comment\": \"x\", \"rules\": ["
                    "{\"pattern\": \"^blk\\\\.0\\\\.\", \"dtype\": \"f16\"},"
                    "{\"pattern\": \"ffn_\", \"dtype\": \"int4w\", \"group\": 32, "
                    "\"scale\": \"per-group\", \"zero\": \"none\"},"
                    "{\"pattern\": \"^(tok_embd|output)$\", \"dtype\": \"int8w\"}]}";
    struct quant_manifest *m;
    assert_int_equal(qm_parse(j, strlen(j), "m", &m), 0);
    enum dtype d;
    assert_int_equal(qm_match(m, "blk.0.ffn_up", &d), 0);
    assert_int_equal(d, DT_F16);
    assert_int_equal(qm_match(m, "blk.1.ffn_up", &d), 0);
    assert_int_equal(d, DT_Q4_0);
    assert_int_equal(qm_match(m, "output", &d), 0);
    assert_int_equal(d, DT_Q8_0);
    assert_int_equal(qm_match(m, "blk.1.attn_q", &d), ERR_NOT_FOUND);
    assert_int_equal(qm_rule_count(m), 3);
    assert_int_equal(qm_rule_hits(m, 0), 1);
    assert_int_equal(qm_rule_hits(m, 1), 1);
    qm_free(m);
}

/* int4w's group and zero settings pick the stored layout (common/dtype.h). */
static void test_int4_layouts(void **state)
{
    (void)state;
    static const struct {
        const char *extra;
        enum dtype dt;
    } cases[] = {
        {"", DT_Q4_0},
        {", \"group\": 32, \"zero\": \"none\"", DT_Q4_0},
        {", \"group\": 64", DT_Q4_G64},
        {", \"group\": 128, \"scale\": \"per-group\"", DT_Q4_G128},
        {", \"zero\": \"per-group\"", DT_Q4Z_G32},
        {", \"group\": 64, \"zero\": \"per-group\"", DT_Q4Z_G64},
        {", \"group\": 128, \"zero\": \"per-group\"", DT_Q4Z_G128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char j[256];
        snprintf(j, sizeof j,
                 "{\"version\": 1, \"rules\": [{\"pattern\": \"ffn\", \"dtype\": \"int4w\"%s},"
                 " {\"pattern\": \".\", \"dtype\": \"int8w\", \"group\": 32}]}",
                 cases[i].extra);
        struct quant_manifest *m;
        assert_int_equal(qm_parse(j, strlen(j), "m", &m), 0);
        enum dtype d;
        assert_int_equal(qm_match(m, "blk.0.ffn_up", &d), 0);
        if (d != cases[i].dt)
            fail_msg("%s: dtype %s, want %s", j, dtype_info(d)->name,
                     dtype_info(cases[i].dt)->name);
        assert_int_equal(qm_match(m, "blk.0.attn_q", &d), 0);
        assert_int_equal(d, DT_Q8_0);
        qm_free(m);
    }
    /* a Q4_K_M-style mix: q4_k, the classifier and ffn_down in q6_k */
    const char *kj = "{\"version\": 1, \"rules\": [{\"pattern\": \"(output|ffn_down)\", "
                     "\"dtype\": \"q6_k\"}, {\"pattern\": \".\", \"dtype\": \"q4_k\", "
                     "\"group\": 256}]}";
    struct quant_manifest *km;
    assert_int_equal(qm_parse(kj, strlen(kj), "m", &km), 0);
    enum dtype kd;
    assert_int_equal(qm_match(km, "output", &kd), 0);
    assert_int_equal(kd, DT_Q6_K);
    assert_int_equal(qm_match(km, "blk.3.ffn_down", &kd), 0);
    assert_int_equal(kd, DT_Q6_K);
    assert_int_equal(qm_match(km, "blk.3.attn_q", &kd), 0);
    assert_int_equal(kd, DT_Q4_K);
    qm_free(km);
}

static enum dtype stored(const struct iebin_model *im, const char *name)
{
    for (size_t i = 0; i < im->n_tensors; i++)
        if (!strcmp(im->tensors[i].name, name))
            return im->tensors[i].dtype;
    fail_msg("no tensor %s", name);
    return DT_COUNT_;
}

static void test_convert_with_manifest_and_calib(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *j = "{\"version\": 1, \"rules\": ["
                    "{\"pattern\": \"\\\\.attn_[qk]$\", \"dtype\": \"int8w\"},"
                    "{\"pattern\": \"^tok_embd$\", \"dtype\": \"bf16\"}]}";
    struct quant_manifest *m;
    assert_int_equal(qm_parse(j, strlen(j), "m", &m), 0);
    struct convert_opts o = {.manifest = m, .dtype_set = true, .dtype = DT_F16};
    char q[4096], r[4096], q4[4096];
    snprintf(q, sizeof q, "%s/q", dir);
    snprintf(r, sizeof r, "%s/r", dir);
    snprintf(q4, sizeof q4, "%s/q4", dir);
    assert_int_equal(convert_model(tu_fixture(S260K), q, &o, NULL), 0);
    struct convert_opts of32 = {.dtype_set = true, .dtype = DT_F32};
    assert_int_equal(convert_model(tu_fixture(S260K), r, &of32, NULL), 0);
    struct convert_opts o4 = {.dtype_set = true, .dtype = DT_Q4_0};
    assert_int_equal(convert_model(tu_fixture(S260K), q4, &o4, NULL), 0);

    struct iebin_model *im;
    assert_int_equal(iebin_open_ex(q, IEBIN_OPEN_LAZY, &im), 0);
    assert_int_equal(stored(im, "blk.2.attn_q"), DT_Q8_0);
    assert_int_equal(stored(im, "blk.2.attn_k"), DT_Q8_0);
    assert_int_equal(stored(im, "blk.2.attn_v"), DT_F16);    /* unmatched: --dtype */
    assert_int_equal(stored(im, "tok_embd"), DT_BF16);
    assert_int_equal(stored(im, "blk.2.attn_norm"), DT_F32); /* norms stay f32 */
    iebin_close(im);
    qm_free(m);

    /* stories260K's own greedy continuation of its golden prompts is in-distribution text */
    int32_t ids[400];
    for (size_t i = 0; i < 400; i++)
        ids[i] = (int32_t)((i * 131 + 7) % 512);
    struct calib_report rep;
    assert_int_equal(calib_run(r, r, ids, 400, 1, &rep), 0);
    assert_int_equal(rep.positions, 399);
    assert_true(rep.kld_mean == 0 && rep.top1 == 1.0);
    assert_true(fabs(rep.cosine_min - 1.0) < 1e-12);
    struct calib_gate strict = {1e-6, 0.999, 0.9999};
    assert_int_equal(calib_check(&rep, &strict), 0);
    calib_report_free(&rep);

    assert_int_equal(calib_run(r, q4, ids, 400, 2, &rep), 0);
    assert_true(rep.kld_mean > 0 && rep.kld_max >= rep.kld_mean);
    assert_true(rep.top1 < 1.0 && rep.top1 > 0.0);
    assert_int_equal(rep.n_tensors, 5 * 7);
    assert_true(rep.cosine_min < 1.0 && rep.cosine_min > 0.0);
    tu_log_capture_begin();
    assert_int_equal(calib_check(&rep, &strict), ERR_QUALITY);
    tu_assert_log_contains("mean KL divergence", "top-1 agreement", "output cosine", NULL);
    tu_log_capture_end();
    struct calib_gate lax = {NAN, NAN, NAN};
    assert_int_equal(calib_check(&rep, &lax), 0);
    calib_report_free(&rep);

    /* out-of-vocabulary ids and too few ids are refused before anything runs */
    ids[5] = 512;
    tu_log_capture_begin();
    assert_int_equal(calib_run(r, q4, ids, 10, 1, &rep), ERR_RANGE);
    tu_assert_log_contains("id 512 at index 5", NULL);
    assert_int_equal(calib_run(r, q4, ids, 1, 1, &rep), ERR_RANGE);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

static void test_read_ids(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const char *p = tu_path(dir, "ids.txt");
    int32_t *ids;
    size_t n;
    tu_write_file(p, "1, 2 3\n4,5", 10);
    assert_int_equal(calib_read_ids(p, &ids, &n), 0);
    assert_int_equal(n, 5);
    assert_int_equal(ids[4], 5);
    free(ids);
    tu_log_capture_begin();
    tu_write_file(p, "1 2 x3", 6);
    assert_int_equal(calib_read_ids(p, &ids, &n), ERR_FORMAT);
    tu_assert_log_contains("'x3' is not a token id", NULL);
    tu_write_file(p, "1 99999999999", 13);
    assert_int_equal(calib_read_ids(p, &ids, &n), ERR_FORMAT);
    tu_write_file(p, "-1 2", 4);
    assert_int_equal(calib_read_ids(p, &ids, &n), ERR_FORMAT);
    tu_write_file(p, "7", 1);
    assert_int_equal(calib_read_ids(p, &ids, &n), ERR_RANGE);
    tu_assert_log_contains("at least 2", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_first_match_wins),
        cmocka_unit_test(test_int4_layouts),
        cmocka_unit_test(test_read_ids),
        cmocka_unit_test(test_convert_with_manifest_and_calib),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
