/*
 * modelsrc.h — what a model path handed to a server program is, before anything opens it.
 *
 * clocherd and inference-engine serve IEBIN model folders (model.ie.json + model.ie.bin). A user
 * who points them at what they downloaded — a Hugging Face folder (config.json +
 * *.safetensors) or a llama.cpp `.gguf` file — is told so at once, with the exact
 * `clocher convert` command that makes an IEBIN folder of it, instead of "cannot open the
 * manifest". Only the file system is looked at (no parsing): the programs' own loaders
 * validate the manifest itself.
 *
 * Unless told not to (--no-convert), both programs instead convert such a source once into the
 * conversion cache by running `clocher convert --cache DIR SRC` (client/offline/convcache.h)
 * as a child and serve the folder it prints: the model libraries stay out of clocherd, and
 * the key, the lock and the atomic rename live in one place. modelsrc_convert is that run.
 */
#ifndef CLOCHER_COMMON_MODELSRC_H
#define CLOCHER_COMMON_MODELSRC_H

#include <stdbool.h>
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

/* Whether modelsrc_convert can serve a source of this kind (a Hugging Face folder, a GGUF). */
bool modelsrc_convertible(enum modelsrc_kind k);

/* The conversion cache's folder when none is configured, into out[cap]: $CACHE_DIRECTORY
 * (systemd's CacheDirectory=; its first entry), else $XDG_CACHE_HOME/clocher, else
 * $HOME/.cache/clocher. 0, or -ENOENT (logged) when none of them is set. */
int modelsrc_cache_dir_default(char *out, size_t cap);

/* The `clocher` program beside the running one (/proc/self/exe), in ../bin or in ../client (a
 * build tree), into out[cap]. 0, or -ENOENT logged naming the places looked at. */
int modelsrc_find_clocher(char *out, size_t cap);

/* A cache entry's lock file is the entry's path with this suffix: the converter holds it
 * exclusively while it writes the entry, eviction exclusively while it removes it, and a
 * server shared for as long as it serves it (client/offline/convcache.h). */
#define MODELSRC_LOCK_SUFFIX ".lock"

struct modelsrc_convert {
    const char *program;   /* the `clocher` program (modelsrc_find_clocher, or configured) */
    const char *src;       /* a Hugging Face folder or a GGUF file */
    const char *cache_dir;
    const char *dtype;     /* `--dtype`; NULL: each tensor keeps the source's dtype */
    double cache_max_gb;   /* `--cache-max-gb`: evict least recently used entries; 0 = never */
    void (*tick)(void *ud); /* about once a second while the converter runs; NULL = none */
    void *ud;
};

/*
 * Runs `program convert --cache cache_dir [--dtype D] [--cache-max-gb N] src` and waits for it;
 * then takes a shared flock on the entry's lock file (MODELSRC_LOCK_SUFFIX) so that no eviction
 * removes the entry while this process serves it: *hold_fd is that descriptor (close-on-exec),
 * to keep open for as long as the entry is served. Each line it
 * writes on stderr (progress, its errors) is logged at info level prefixed "convert: ", and
 * the IEBIN folder it prints is copied into out[cap]. SIGTERM and SIGINT are held while it
 * runs: either stops the converter (SIGTERM) and returns ERR_CANCELLED; SIGHUP is ignored.
 * On failure one error names the program, its exit status or signal and the last line it
 * wrote, and the return is ERR_FORMAT (it refused the source: exit 2 or 3, retrying cannot
 * help), -ENOENT/-EACCES (the program cannot be run) or -EIO (it failed otherwise).
 */
int modelsrc_convert(const struct modelsrc_convert *c, char *out, size_t cap, int *hold_fd);

#endif
