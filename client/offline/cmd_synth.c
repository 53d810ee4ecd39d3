/* cmd_synth.c — `clocher synth --preset NAME OUT_DIR [--seed N] [--dtype D] [--layers N] [--gguf F]
 * [--ftype q4_k_m] [--tokenizer F] [--vocab N]`. */
#include "cmds.h"
#include "synth.h"

#include "err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: clocher synth --preset PRESET OUT_DIR\n"
               "                     [--seed N] [--dtype f32|f16|bf16] [--layers N] [--gguf FILE]\n"
               "                     [--ftype q4_k_m] [--tokenizer FILE] [--vocab N]\n\n"
               "Presets: demo, tinyllama-1.1b, llama3-tiny, qwen2-tiny, mistral-tiny, gpt-oss-tiny,\n"
               "gpt-oss-20b.\n\n"
               "Writes a deterministic RANDOM-weight model in Hugging Face form. Its output is not\n"
               "language. Llama-family presets (llama3-tiny: Llama 3 RoPE scaling, tied;\n"
               "qwen2-tiny: q/k/v biases, tied; mistral-tiny: a sliding window): config.json,\n"
               "model.safetensors, tokenizer.model; --vocab N replaces the preset's vocabulary.\n"
               "gpt-oss presets: the release's layout (config.json, sharded safetensors with\n"
               "model.safetensors.index.json, MXFP4 experts), the vocabulary from --tokenizer\n"
               "(copied beside the weights) or --vocab (gpt-oss-tiny needs one). --gguf also\n"
               "writes the same weights as a GGUF file (llama.cpp's layout); with --ftype q4_k_m its\n"
               "matrices are quantized in llama.cpp's Q4_K_M mix (q4_K; q6_K for output.weight and\n"
               "for attn_v/ffn_down of the layers llama.cpp's use_more_bits picks; f32 norms)\n"
               "(Llama presets). Same seed, same bytes.\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s || *s == '-')
        return -1;
    *out = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

int cmd_synth(int argc, char **argv)
{
    struct synth_opts o = {.seed = 1};
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CMD_EXIT_OK;
        } else if (!strcmp(a, "--preset") && i + 1 < argc) {
            o.preset = argv[++i];
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            if (parse_u64(argv[++i], &o.seed)) {
                fprintf(stderr, "clocher synth: --seed %s: expected a non-negative integer\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--layers") && i + 1 < argc) {
            if (parse_u64(argv[++i], &u) || u < 1 || u > 1024) {
                fprintf(stderr, "clocher synth: --layers %s: expected 1..1024\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
            o.layers = (uint32_t)u;
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            o.dtype_set = 1;
            if (dtype_from_name(argv[++i], &o.dtype) ||
                (o.dtype != DT_F32 && o.dtype != DT_F16 && o.dtype != DT_BF16)) {
                fprintf(stderr, "clocher synth: --dtype %s: expected f32, f16 or bf16\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--ftype") && i + 1 < argc) {
            if (strcmp(argv[++i], "q4_k_m") != 0) {
                fprintf(stderr, "clocher synth: --ftype %s: expected q4_k_m\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
            o.gguf_q4_k_m = 1;
        } else if (!strcmp(a, "--gguf") && i + 1 < argc) {
            o.gguf = argv[++i];
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o.tokenizer = argv[++i];
        } else if (!strcmp(a, "--vocab") && i + 1 < argc) {
            if (parse_u64(argv[++i], &u) || u < 1 || u > 4194304) {
                fprintf(stderr, "clocher synth: --vocab %s: expected 1..4194304\n", argv[i]);
                return CMD_EXIT_USAGE;
            }
            o.vocab = (uint32_t)u;
        } else if (a[0] == '-') {
            fprintf(stderr, "clocher synth: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return CMD_EXIT_USAGE;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "clocher synth: unexpected argument '%s'\n", a);
            return CMD_EXIT_USAGE;
        }
    }
    if (!o.preset || !out) {
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    int rc = synth_model(out, &o);
    return rc == 0 ? CMD_EXIT_OK : rc == ERR_NOT_FOUND || rc == ERR_USAGE ? CMD_EXIT_USAGE : CMD_EXIT_FAIL;
}
