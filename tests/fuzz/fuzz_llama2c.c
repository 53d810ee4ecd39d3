/*
 * fuzz_llama2c.c — libFuzzer harness for the llama2.c checkpoint importer (client/llama2c.c).
 * The bytes become a checkpoint file (a memfd, reached through /proc/self/fd so the importer
 * opens a path as it does for users). Whatever header it accepts must describe exactly the
 * file's size; small accepted checkpoints are then converted for real into a scratch
 * directory and the resulting IEBIN model must open (the importer's promise: what it writes
 * passes the loader's validation).
 */
#include "fuzz.h"

#include "iebin.h"
#include "llama2c.h"
#include "log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* conversion writes a model per input: only for checkpoints a fuzzer can cheaply produce */
#define CONVERT_MAX_BYTES (256u << 10)

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static char scratch[64];

static void remove_scratch(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    if (system(cmd) != 0)
        fprintf(stderr, "fuzz_llama2c: could not remove %s\n", scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    if (!scratch[0]) {
        snprintf(scratch, sizeof scratch, "/tmp/fuzz_llama2c.XXXXXX");
        if (!mkdtemp(scratch))
            abort();
        atexit(remove_scratch);
    }
    int fd = memfd_create("llama2c", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0)
            abort();
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    struct iebin_hparams hp;
    if (llama2c_read_hparams(path, &hp) == 0 && size <= CONVERT_MAX_BYTES) {
        char out[128];
        snprintf(out, sizeof out, "%s/model", scratch);
        if (llama2c_convert(path, NULL, 0, out, DT_F32, "fuzz") != 0)
            abort(); /* a header the reader accepted must convert */
        struct iebin_model *m = NULL;
        if (iebin_open(out, &m) != 0)
            abort();
        iebin_close(m);
    }
    close(fd);
    return 0;
}
