/* testutil.c — shared test helpers (see testutil.h). */
#include "testutil.h"

#include "log.h"
#include "rng.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char path_bufs[8][4096];
static int path_next;

static char *next_buf(void)
{
    char *b = path_bufs[path_next];
    path_next = (path_next + 1) % 8;
    return b;
}

const char *tu_fixture(const char *rel)
{
    const char *root = getenv("CLOCHER_FIXTURES");
    if (!root || !*root)
        root = "../shared/fixtures";
    char *b = next_buf();
    snprintf(b, 4096, "%s/%s", root, rel);
    if (access(b, R_OK) != 0) {
        fail_msg("fixture %s is missing (CLOCHER_FIXTURES=%s): the shared fixtures must sit at "
                 "../shared/fixtures beside the project",
                 b, root);
    }
    return b;
}

const char *tu_path(const char *dir, const char *name)
{
    char *b = next_buf();
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}

void tu_fill_bytes(uint8_t *p, size_t n, uint32_t x0)
{
    uint32_t x = x0;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_xorshift32(&x);
}

const char *tu_build_path(const char *rel)
{
    const char *root = getenv("CLOCHER_BUILD_DIR");
    if (!root || !*root)
        root = ".";
    char *b = next_buf();
    snprintf(b, 4096, "%s/%s", root, rel);
    return b;
}

char *tu_mkdtemp(void)
{
    const char *tmp = getenv("TMPDIR");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/clocher-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(buf))
        fail_msg("mkdtemp(%s): %s", buf, strerror(errno));
    return strdup(buf);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

void tu_rmtree(const char *path)
{
    if (path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)
        fail_msg("read %s failed", path);
    buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

void tu_write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("create %s: %s", path, strerror(errno));
    if (len && fwrite(buf, 1, len, f) != len)
        fail_msg("write %s failed", path);
    fclose(f);
}

static char *cap_buf;
static size_t cap_len, cap_cap;

static void cap_sink(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)ud;
    size_t n = strlen(msg);
    if (cap_len + n + 2 > cap_cap) {
        cap_cap = (cap_len + n + 2) * 2;
        cap_buf = realloc(cap_buf, cap_cap);
    }
    memcpy(cap_buf + cap_len, msg, n);
    cap_len += n;
    cap_buf[cap_len++] = '\n';
    cap_buf[cap_len] = '\0';
}

void tu_log_capture_begin(void)
{
    cap_len = 0;
    if (cap_buf)
        cap_buf[0] = '\0';
    log_set_sink(cap_sink, NULL);
}

const char *tu_log_captured(void) { return cap_buf ? cap_buf : ""; }

void tu_log_capture_end(void) { log_set_sink(NULL, NULL); }

void tu_assert_log_contains(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) {
        if (!strstr(tu_log_captured(), s))
            fail_msg("log does not mention \"%s\"; it was:\n%s", s, tu_log_captured());
    }
    va_end(ap);
}

int tu_run(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[len] = '\0';
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    if (st == -1)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
