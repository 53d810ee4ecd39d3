/*
 * fuzz_quant_manifest.c — libFuzzer harness over `--quant-manifest` parsing (qm_parse).
 *
 * The input is the document. A failure must be a negative code and no manifest; a success
 * must give at least one rule, and matching every IEBIN tensor name against it must return
 * one of the engine's dtypes or ERR_NOT_FOUND — never a crash, a leak or another code.
 */
#include "fuzz.h"

#include "err.h"
#include "log.h"
#include "quant_manifest.h"

#include <stdbool.h>
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
    static const char *const names[] = {"tok_embd", "output", "output_norm", "blk.0.attn_q",
                                        "blk.11.ffn_down", "blk.3.attn_norm", ""};
    log_set_sink(quiet, NULL);
    struct quant_manifest *m = NULL;
    int rc = qm_parse((const char *)data, size, "fuzz.json", &m);
    if (rc > 0 || (rc < 0) != (m == NULL))
        abort();
    if (rc < 0)
        return 0;
    if (qm_rule_count(m) == 0 || qm_rule_count(m) > QM_MAX_RULES)
        abort();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        enum dtype d = DT_F32;
        int r = qm_match(m, names[i], &d);
        bool known = d == DT_F32 || d == DT_F16 || d == DT_BF16 || d == DT_Q8_0 ||
                     d == DT_Q4_0 || d == DT_Q4_G64 || d == DT_Q4_G128 || d == DT_Q4Z_G32 ||
                     d == DT_Q4Z_G64 || d == DT_Q4Z_G128 || d == DT_Q4_K || d == DT_Q5_K ||
                     d == DT_Q6_K;
        if (r == 0 ? !known : r != ERR_NOT_FOUND)
            abort();
    }
    qm_free(m);
    return 0;
}
