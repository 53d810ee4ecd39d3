/* cmd_convert.c — `clocher convert SRC OUT_DIR [--dtype D] [--tokenizer FILE] [--from F]`. */
#include "cmds.h"
#include "convert.h"

#include "err.h"

#include <errno.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher convert SRC OUT_DIR [--dtype f32|f16|bf16|int8|int4] [--embd-dtype D]\n                       [--tokenizer FILE]"
            " [--from llama2c|hf|gguf]\n\n"
            "Converts a llama2.c checkpoint, a Hugging Face directory (config.json +\n"
            "safetensors) or a GGUF file into an IEBIN model directory. The format is\n"
            "detected unless --from names it. --dtype converts the weight matrices (norms stay\n"
            "f32); without it each matrix keeps its source dtype (GGUF Q8_0/Q4_0 stay native).\n"
            "int8 = q8_0 (blocks of 32, f16 scale), int4 = q4_0 (groups of 32, f16 scale).\n"
            "--embd-dtype D gives the token embedding and the classifier their own dtype.\n"
            "--tokenizer takes a tokenizer.model, tokenizer.json, tokenizer.bin or .gguf.\n"
            "Nothing under OUT_DIR loads unless the conversion completed.\n");
}

int cmd_convert(int argc, char **argv)
{
    struct convert_opts o = {.progress = isatty(2)};
    const char *pos[2];
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return CMD_EXIT_OK;
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            o.dtype_set = true;
            if (!strcmp(d, "int8"))
                d = "q8_0"; /* int8 weights: blocks of 32 with an f16 scale (GGML Q8_0) */
            else if (!strcmp(d, "int4"))
                d = "q4_0"; /* int4 weights: groups of 32 with an f16 scale (GGML Q4_0) */
            if (dtype_from_name(d, &o.dtype) != 0) {
                fprintf(stderr, "clocher convert: --dtype %s: expected f32, f16, bf16, int8 (q8_0) "
                                "or int4 (q4_0)\n", d);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--embd-dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            o.embd_dtype_set = true;
            if (!strcmp(d, "int8"))
                d = "q8_0";
            else if (!strcmp(d, "int4"))
                d = "q4_0";
            if (dtype_from_name(d, &o.embd_dtype) != 0) {
                fprintf(stderr, "clocher convert: --embd-dtype %s: expected f32, f16, bf16, int8 or int4\n", d);
                return CMD_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o.tokenizer = argv[++i];
        } else if (!strcmp(a, "--from") && i + 1 < argc) {
            const char *f = argv[++i];
            if (!strcmp(f, "llama2c"))
                o.from = CONVERT_LLAMA2C;
            else if (!strcmp(f, "hf"))
                o.from = CONVERT_HF;
            else if (!strcmp(f, "gguf"))
                o.from = CONVERT_GGUF;
            else {
                fprintf(stderr, "clocher convert: --from %s: expected llama2c, hf or gguf\n", f);
                return CMD_EXIT_USAGE;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "clocher convert: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return CMD_EXIT_USAGE;
        } else if (n_pos < 2) {
            pos[n_pos++] = a;
        } else {
            fprintf(stderr, "clocher convert: unexpected argument '%s'\n", a);
            return CMD_EXIT_USAGE;
        }
    }
    if (n_pos != 2) {
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    enum convert_fault fault;
    int rc = convert_model(pos[0], pos[1], &o, &fault);
    if (rc == 0)
        return CMD_EXIT_OK;
    /* the reason was logged where it was found */
    if (rc == ERR_USAGE)
        return CMD_EXIT_USAGE;
    return fault == CONVERT_FAULT_OUTPUT ? CMD_EXIT_FAIL : CMD_EXIT_INPUT;
}
