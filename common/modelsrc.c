/* modelsrc.c — tells an IEBIN model folder from the sources `clocher convert` reads, and
 * refuses the latter with the command to run (see modelsrc.h). */
#include "modelsrc.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool has_file(const char *dir, const char *name)
{
    char p[4096];
    struct stat st;
    int n = snprintf(p, sizeof p, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool starts_with_gguf(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char m[4];
    bool yes = read(fd, m, 4) == 4 && memcmp(m, "GGUF", 4) == 0;
    close(fd);
    return yes;
}

enum modelsrc_kind modelsrc_kind(const char *path, int *err)
{
    struct stat st;
    *err = 0;
    if (stat(path, &st) != 0) {
        *err = errno;
        return MODELSRC_MISSING;
    }
    if (!S_ISDIR(st.st_mode))
        return starts_with_gguf(path) ? MODELSRC_GGUF : MODELSRC_FILE;
    if (has_file(path, "model.ie.json"))
        return MODELSRC_IEBIN;
    return has_file(path, "config.json") ? MODELSRC_HF : MODELSRC_FOLDER;
}

int modelsrc_suggest_out(const char *src, char *out, size_t cap)
{
    size_t n = strlen(src);
    while (n > 1 && src[n - 1] == '/')
        n--;
    if (n > 5 && strncmp(src + n - 5, ".gguf", 5) == 0)
        n -= 5;
    else if (n > 4 && strncmp(src + n - 4, ".bin", 4) == 0)
        n -= 4;
    int w = snprintf(out, cap, "%.*s-iebin", (int)n, src);
    return w > 0 && (size_t)w < cap ? 0 : -ENAMETOOLONG;
}

/* s as one shell word: as is when it has only safe characters, else single-quoted. */
static void shell_word(const char *s, char *out, size_t cap)
{
    bool safe = *s != '\0';
    for (const char *p = s; *p && safe; p++)
        safe = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:,=@%",
                       *p) != NULL;
    if (safe) {
        snprintf(out, cap, "%s", s);
        return;
    }
    size_t o = 0;
    if (o + 1 < cap)
        out[o++] = '\'';
    for (const char *p = s; *p && o + 5 < cap; p++) {
        if (*p == '\'') { /* ' -> '\'' */
            memcpy(out + o, "'\\''", 4);
            o += 4;
        } else {
            out[o++] = *p;
        }
    }
    if (o + 1 < cap)
        out[o++] = '\'';
    out[o] = '\0';
}

int modelsrc_check(const char *path, const char *what)
{
    int e;
    enum modelsrc_kind k = modelsrc_kind(path, &e);
    if (k == MODELSRC_IEBIN)
        return 0;
    if (k == MODELSRC_MISSING) {
        LOG_ERR("model %s (%s): %s", path, what, strerror(e));
        return -e;
    }
    if (k == MODELSRC_FOLDER) {
        LOG_ERR("model %s (%s): no model.ie.json: not an IEBIN model folder (`clocher convert` "
                "makes one from a Hugging Face folder, a GGUF or a llama2.c file: "
                "docs/CONVERT.md)",
                path, what);
        return ERR_FORMAT;
    }
    char out[4096], qsrc[4200], qout[4200];
    if (modelsrc_suggest_out(path, out, sizeof out) < 0)
        snprintf(out, sizeof out, "OUT_DIR");
    shell_word(path, qsrc, sizeof qsrc);
    shell_word(out, qout, sizeof qout);
    static const char *const kinds[] = {
        [MODELSRC_HF] = "a Hugging Face model folder (config.json)",
        [MODELSRC_GGUF] = "a GGUF file",
        [MODELSRC_FILE] = "a file, not a model folder",
    };
    LOG_ERR("model %s (%s) is %s; Clocher serves IEBIN model folders: convert it once with "
            "`clocher convert %s %s` and give %s as the model (docs/CONVERT.md)",
            path, what, kinds[k], qsrc, qout, qout);
    return k == MODELSRC_FILE ? ERR_FORMAT : ERR_UNSUPPORTED;
}
