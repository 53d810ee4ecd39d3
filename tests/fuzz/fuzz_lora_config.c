/*
 * fuzz_lora_config.c — libFuzzer harness over adapter_config.json parsing (lora_config_parse).
 *
 * The input is the document. On success the harness checks what lora.c relies on later: a
 * rank in 1..LORA_MAX_RANK, a non-empty mask of known targets, a finite scaling equal to
 * alpha / r (or alpha / sqrt(r) with rsLoRA), and a layer bitmap only when
 * layers_to_transform was given. A failure must be a negative code, never a crash or leak.
 */
#include "fuzz.h"

#include "log.h"
#include "lora.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct lora_config c;
    int rc = lora_config_parse("fuzz/adapter_config.json", (const char *)data, size, &c);
    if (rc > 0)
        abort();
    if (rc < 0)
        return 0;
    if (c.rank < 1 || c.rank > LORA_MAX_RANK)
        abort();
    if (c.target_mask == 0 || (c.target_mask >> LORA_TARGET_COUNT) != 0)
        abort();
    if (!isfinite(c.alpha) || !isfinite(c.scaling))
        abort();
    float want = c.rslora ? (float)((double)c.alpha / sqrt((double)c.rank))
                          : (float)((double)c.alpha / (double)c.rank);
    if (c.scaling != want)
        abort();
    if (!c.has_layers)
        for (size_t i = 0; i < LORA_MAX_LAYERS / 64; i++)
            if (c.layers[i] != 0)
                abort();
    return 0;
}
