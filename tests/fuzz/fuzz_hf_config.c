/*
 * fuzz_hf_config.c — libFuzzer harness over the Hugging Face config.json reader of
 * `clocher convert` (convert_hf_config_mem: llama and gpt_oss, every refusal).
 *
 * The input is config.json's bytes. A rejection must be a negative code with a message; an
 * accepted config must give hyper-parameters the IEBIN writer accepts as they are
 * (iebin_check_hparams), with the gpt_oss fields set exactly when model_type is gpt_oss.
 */
#include "fuzz.h"

#include "convert.h"
#include "iebin.h"
#include "log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    log_clear_error();
    struct iebin_hparams hp;
    int rc = convert_hf_config_mem((const char *)data, size, "fuzz/config.json", &hp);
    if (rc > 0)
        abort();
    if (rc < 0) {
        if (!*log_last_error()) /* every refusal says why */
            abort();
        return 0;
    }
    if (iebin_check_hparams(&hp, "fuzz") != 0)
        abort();
    if (hp.n_experts && (hp.rope_scaling.type != IEBIN_ROPE_YARN || hp.sliding_window == 0))
        abort();
    return 0;
}
