/*
 * test_yarn.c — YaRN's RoPE frequencies (model_yarn_inv_freq, model.h) against the table of
 * ../shared/specs/gpt-oss.md §2.3 (openai/gpt-oss-20b: theta 150000, head_dim 64, factor 32,
 * beta_fast 32, beta_slow 1, original context 4096), the truncated (ggml) ramp against its
 * closed form, and model_rope_inv_freq's float table for a hand-built gpt_oss model; and a
 * LoRA adapter of the FFN refused on a mixture-of-experts base (lora_open_mem).
 */
#include "testutil.h"

#include "err.h"
#include "iebin.h"
#include "log.h"
#include "lora.h"
#include "model.h"

#include <math.h>
#include <string.h>

static struct iebin_hparams hp20b(bool truncate)
{
    struct iebin_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.head_dim = 64;
    hp.rope_theta = 150000.0f;
    hp.rope_scaling = (struct iebin_rope_scaling){IEBIN_ROPE_YARN, 32.0f, 32.0f, 1.0f, 4096,
                                                  truncate};
    return hp;
}

/* The spec's test vector (j, inv_freq_j), 10 significant digits. */
static void test_spec_table(void **state)
{
    (void)state;
    static const struct {
        uint32_t j;
        double inv_freq;
    } tab[] = {{0, 1.0},
               {1, 6.890443059e-01},
               {8, 5.081327482e-02},
               {9, 3.170569618e-02},
               {12, 6.794959490e-03},
               {17, 1.293187012e-04},
               {18, 3.830881237e-05},
               {31, 3.023511428e-07}};
    struct iebin_hparams hp = hp20b(false);
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        double ms = 0;
        double got = model_yarn_inv_freq(&hp, tab[i].j, &ms);
        if (fabs(got - tab[i].inv_freq) > 1e-9 * tab[i].inv_freq)
            fail_msg("inv_freq_%u = %.10e, the spec says %.9e", tab[i].j, got,
                     tab[i].inv_freq);
        assert_true(fabs(ms - 1.3465735902799727) < 1e-15);
    }
}

/* truncate: low = floor(8.09) = 8, high = ceil(17.40) = 18 (ggml's corr dims). */
static void test_truncated_ramp(void **state)
{
    (void)state;
    struct iebin_hparams hp = hp20b(true);
    for (uint32_t j = 0; j < 32; j++) {
        double ramp = j <= 8 ? 0 : j >= 18 ? 1 : (j - 8.0) / 10.0;
        double f = pow(150000.0, 2.0 * j / 64.0);
        double want = ramp / (32 * f) + (1 - ramp) / f;
        double got = model_yarn_inv_freq(&hp, j, NULL);
        if (fabs(got - want) > 1e-12 * want)
            fail_msg("truncated inv_freq_%u = %.12e, want %.12e", j, got, want);
    }
    /* and it differs from the fractional ramp where the spec says it does (j = 17: ~76%) */
    struct iebin_hparams hpf = hp20b(false);
    double a = model_yarn_inv_freq(&hp, 17, NULL), b = model_yarn_inv_freq(&hpf, 17, NULL);
    assert_true(fabs(a - b) / b > 0.5);
}

/* model_rope_inv_freq: the YaRN values rounded to float; plain theta^(-2i/d) without. */
static void test_rope_table(void **state)
{
    (void)state;
    struct model m;
    memset(&m, 0, sizeof m);
    m.hp = hp20b(false);
    float inv[32];
    model_rope_inv_freq(&m, inv);
    for (uint32_t j = 0; j < 32; j++)
        assert_true(inv[j] == (float)model_yarn_inv_freq(&m.hp, j, NULL));
    m.hp.rope_scaling.type = IEBIN_ROPE_NONE;
    model_rope_inv_freq(&m, inv);
    assert_true(inv[17] == (float)pow(150000.0, -34.0 / 64.0));
}

/* gpt-oss-tiny's hyper-parameters (contract §4), valid for iebin_check_hparams. */
static struct iebin_hparams tiny(void)
{
    struct iebin_hparams hp = hp20b(false);
    hp.dim = 128, hp.n_layers = 4, hp.n_heads = 4, hp.n_kv_heads = 2, hp.ffn_dim = 128;
    hp.vocab_size = 512, hp.max_seq_len = 64, hp.rms_eps = 1e-5f;
    hp.n_experts = 8, hp.n_experts_used = 4, hp.sliding_window = 16;
    hp.sliding_layers[0] = 0x5; /* layers 0 and 2 */
    hp.swiglu_limit = 7.0f, hp.swiglu_alpha = 1.702f;
    return hp;
}

/* An adapter of mlp.gate_proj on a MoE base: a clear refusal naming why. */
static void test_lora_ffn_refused(void **state)
{
    (void)state;
    struct iebin_hparams hp = tiny();
    assert_int_equal(iebin_check_hparams(&hp, "tiny"), 0);
    static const char cfg[] = "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
                              "[\"q_proj\", \"gate_proj\"]}";
    static const char st[] = "\x02\0\0\0\0\0\0\0{}"; /* safetensors: no tensors */
    struct lora_adapter *ad = NULL;
    assert_int_equal(lora_open_mem("moe-adapter", cfg, sizeof cfg - 1, st, sizeof st - 1, &hp,
                                   &ad),
                     ERR_UNSUPPORTED);
    assert_null(ad);
    assert_non_null(strstr(log_last_error(), "mixture of 8 experts"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_table),
        cmocka_unit_test(test_truncated_ramp),
        cmocka_unit_test(test_rope_table),
        cmocka_unit_test(test_lora_ffn_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
