/*
 * modelsrc.h — what a model path handed to a server program is, before anything opens it.
 *
 * clocherd and inference-engine serve IEBIN model folders (model.ie.json + model.ie.bin). A user
 * who points them at what they downloaded — a Hugging Face folder (config.json +
 * *.safetensors) or a llama.cpp `.gguf` file — is told so at once, with the exact
 * `clocher convert` command that makes an IEBIN folder of it, instead of "cannot open the
 * manifest". Only the file system is looked at (no parsing): the programs' own loaders
 * validate the manifest itself.
 */
#ifndef CLOCHER_COMMON_MODELSRC_H
#define CLOCHER_COMMON_MODELSRC_H

#include <stddef.h>

enum modelsrc_kind {
    MODELSRC_IEBIN = 0, /* a folder with model.ie.json */
    MODELSRC_HF,        /* a folder with config.json and no model.ie.json */
    MODELSRC_GGUF,      /* a file starting with "GGUF" */
    MODELSRC_FILE,      /* another file (a llama2.c checkpoint, anything) */
    MODELSRC_FOLDER,    /* a folder with neither manifest nor config.json */
    MODELSRC_MISSING,   /* nothing there (or not readable: errno says) */
};

/* What path is; for MODELSRC_MISSING *err is the errno of the failing stat (else 0). */
enum modelsrc_kind modelsrc_kind(const char *path, int *err);

/*
 * 0 when path is an IEBIN model folder; otherwise logs one error naming path, where it came
 * from (`what`: "model_dir", "--model-dir") and, for a convertible source, the command
 * `clocher convert SRC OUT` to run (OUT: SRC's name with "-iebin", beside it), and returns
 * -ENOENT (missing), ERR_UNSUPPORTED (a convertible source) or ERR_FORMAT (anything else).
 */
int modelsrc_check(const char *path, const char *what);

/* The folder `clocher convert` is suggested to write for src ("/m/x.gguf" -> "/m/x-iebin"),
 * into out[cap]; -ENAMETOOLONG when it does not fit. */
int modelsrc_suggest_out(const char *src, char *out, size_t cap);

#endif
