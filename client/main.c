/*
 * main.c — `clocher`: the command-line client of clocherd and the offline model tools.
 * Dispatches to one cmd_* function per subcommand (cmds.h); each parses its own flags.
 * docs/CLIENT.md describes the online commands (generate, health, ...).
 */
#include "cmds.h"

#include "clocher_version.h"
#include "log.h"
#include "slice.h"

#include <stdio.h>
#include <string.h>

/* Keep sorted by name; `clocher --help` prints them in this order. */
static const struct cmd commands[] = {
    {"adapters", cmd_adapters, "list, load or unload clocherd's LoRA adapters"},
    {"batch", cmd_batch, "JSON lines of requests -> JSON lines of results (clocherd)"},
    {"bench", cmd_bench, "concurrent streams against clocherd: throughput, latencies"},
    {"chat", cmd_chat, "a conversation (messages) through clocherd's chat template, by channel"},
    {"convert", cmd_convert, "convert a llama2.c / Hugging Face / GGUF model to IEBIN"},
    {"detokenize", cmd_detokenize, "token ids on stdin -> text on stdout"},
    {"generate", cmd_generate, "stream a completion from clocherd"},
    {"health", cmd_health, "ask clocherd whether it is serving"},
    {"metrics", cmd_metrics, "clocherd's metrics (Prometheus text)"},
    {"sparsify", cmd_sparsify, "dense weight matrix -> block-sparse (BSR) file"},
    {"synth", cmd_synth, "write a deterministic random-weight model (Hugging Face form)"},
    {"synth-adapter", cmd_synth_adapter, "write a deterministic random LoRA adapter (PEFT form)"},
    {"tokenize", cmd_tokenize, "text on stdin -> token ids on stdout"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: clocher COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`clocher COMMAND --help` describes each command; `clocher --version` the "
               "version.\n");
}

int main(int argc, char **argv)
{
    log_set_ident("clocher");
    (void)slice_request(SLICE_LATENCY_NS); /* before gRPC starts its threads (slice.h) */
    if (argc < 2) {
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CMD_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("clocher %s\n", CLOCHER_VERSION);
        return CMD_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "clocher: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CMD_EXIT_USAGE;
}
