/* modelsrc.c — tells an IEBIN model folder from the sources `clocher convert` reads, and
 * either refuses the latter with the command to run or runs the converter into the conversion
 * cache (see modelsrc.h). */
#include "modelsrc.h"

#include "err.h"
#include "log.h"
#include "mono.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

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

/* ---- the conversion cache (modelsrc_convert) ---- */

bool modelsrc_convertible(enum modelsrc_kind k)
{
    return k == MODELSRC_HF || k == MODELSRC_GGUF;
}

int modelsrc_cache_dir_default(char *out, size_t cap)
{
    const char *v = getenv("CACHE_DIRECTORY");
    int w = -1;
    if (v && *v) /* systemd: one absolute path per CacheDirectory= entry, ':'-separated */
        w = snprintf(out, cap, "%.*s", (int)strcspn(v, ":"), v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        w = snprintf(out, cap, "%s/clocher", v);
    else if ((v = getenv("HOME")) && *v)
        w = snprintf(out, cap, "%s/.cache/clocher", v);
    if (w < 0) {
        LOG_ERR("no conversion cache folder: neither $CACHE_DIRECTORY, $XDG_CACHE_HOME nor "
                "$HOME is set (give one with convert.cache_dir or --cache-dir)");
        return -ENOENT;
    }
    return (size_t)w < cap ? 0 : -ENAMETOOLONG;
}

int modelsrc_find_clocher(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        int e = errno;
        LOG_ERR("readlink(/proc/self/exe): %s", strerror(e));
        return -e;
    }
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    /* installed: bin/ beside sbin/ (clocherd) and bin/ (inference-engine); a build tree:
     * client/ beside daemon/ and worker/ */
    static const char *const rel[] = {"", "/../bin", "/../client"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        int w = snprintf(out, cap, "%s%s/clocher", self, rel[i]);
        if (w > 0 && (size_t)w < cap && access(out, X_OK) == 0)
            return 0;
    }
    LOG_ERR("cannot find the clocher program (which converts models) beside %s, in ../bin nor "
            "in ../client: give its path (convert.program, --convert-program)",
            self);
    return -ENOENT;
}

/* The environment for the converter: ours without the log format, so that its lines come as
 * text and are logged here in our own format. NULL when out of memory. */
static char **child_env(void)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    size_t k = 0, pre = strlen(LOG_ENV_FORMAT);
    for (size_t i = 0; env && i < n; i++)
        if (!(strncmp(environ[i], LOG_ENV_FORMAT, pre) == 0 && environ[i][pre] == '='))
            env[k++] = environ[i];
    return env;
}

/* What a pipe from the converter has given so far: whole lines are handed on, the rest kept. */
struct line_buf {
    char buf[4096];
    size_t len;
    char last[512]; /* the last non-empty line (stderr: quoted when the converter fails) */
    bool eof;
};

static void stderr_line(struct line_buf *b, const char *line)
{
    while (*line == '\r')
        line++;
    if (!*line)
        return;
    LOG_INFO("convert: %s", line);
    snprintf(b->last, sizeof b->last, "%.511s", line);
}

/* Reads what fd has; for stderr (`log`) every whole line is logged, for stdout kept. */
static void pump(int fd, struct line_buf *b, bool log)
{
    char tmp[4096];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        b->eof = true;
        if (log && b->len) { /* an unterminated last line */
            b->buf[b->len < sizeof b->buf ? b->len : sizeof b->buf - 1] = '\0';
            stderr_line(b, b->buf);
            b->len = 0;
        }
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char c = tmp[i];
        if (log && (c == '\n' || b->len == sizeof b->buf - 1)) {
            b->buf[b->len] = '\0';
            stderr_line(b, b->buf);
            b->len = 0;
            if (c == '\n')
                continue;
        }
        if (b->len < sizeof b->buf - 1)
            b->buf[b->len++] = c;
    }
}

/* Spawns the converter with its stdout and stderr on the pipes' write ends. */
static int spawn_converter(const struct modelsrc_convert *c, int out_w, int err_w, pid_t *pid)
{
    char *argv[10], gb[32];
    int a = 0;
    argv[a++] = (char *)c->program;
    argv[a++] = (char *)"convert";
    argv[a++] = (char *)"--cache";
    argv[a++] = (char *)c->cache_dir;
    if (c->dtype && *c->dtype) {
        argv[a++] = (char *)"--dtype";
        argv[a++] = (char *)c->dtype;
    }
    if (c->cache_max_gb > 0) {
        snprintf(gb, sizeof gb, "%.17g", c->cache_max_gb);
        argv[a++] = (char *)"--cache-max-gb";
        argv[a++] = gb;
    }
    argv[a++] = (char *)c->src;
    argv[a] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_w, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, err_w, STDERR_FILENO);
    /* the converter gets the signals we hold, with their default actions */
    sigset_t none, def;
    sigemptyset(&none);
    sigemptyset(&def);
    sigaddset(&def, SIGTERM);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGHUP);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char **env = child_env();
    int rc = env ? posix_spawn(pid, c->program, &fa, &at, argv, env) : ENOMEM;
    free(env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0)
        LOG_ERR("cannot run the model converter %s: %s", c->program, strerror(rc));
    return -rc;
}

/* The shared flock that keeps the entry dir from eviction while this process serves it
 * (modelsrc.h): the descriptor, or a negative code logged. Blocking is brief: only an eviction
 * or a conversion holds the lock exclusively, and an entry that exists is never converted. */
static int hold_entry(const char *dir)
{
    char lock[PATH_MAX + 16], manifest[PATH_MAX + 16];
    snprintf(lock, sizeof lock, "%s" MODELSRC_LOCK_SUFFIX, dir);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("%s: cannot open the cache entry's lock: %s", lock, strerror(e));
        return -e;
    }
    while (flock(fd, LOCK_SH) != 0) {
        if (errno == EINTR)
            continue;
        int e = errno;
        LOG_ERR("%s: cannot lock it: %s", lock, strerror(e));
        close(fd);
        return -e;
    }
    snprintf(manifest, sizeof manifest, "%s/model.ie.json", dir);
    if (access(manifest, F_OK) != 0) { /* evicted between the converter's answer and the lock */
        LOG_ERR("%s: the cache entry was evicted while this server started; start it again",
                dir);
        close(fd);
        return -EAGAIN;
    }
    return fd;
}

int modelsrc_convert(const struct modelsrc_convert *c, char *out, size_t cap, int *hold_fd)
{
    *hold_fd = -1;
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, sfd = -1, rc;
    sigset_t held, old;
    sigemptyset(&held);
    sigaddset(&held, SIGTERM);
    sigaddset(&held, SIGINT);
    sigaddset(&held, SIGHUP);
    if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) {
        rc = -errno;
        LOG_ERR("pipe: %s", strerror(-rc));
        goto out_pipes;
    }
    /* signals come through a descriptor while the converter runs: a SIGTERM then stops it
     * instead of leaving it orphaned */
    pthread_sigmask(SIG_BLOCK, &held, &old);
    if ((sfd = signalfd(-1, &held, SFD_CLOEXEC)) < 0) {
        rc = -errno;
        LOG_ERR("signalfd: %s", strerror(-rc));
        goto out_mask;
    }
    LOG_INFO("model %s: its IEBIN conversion from the cache %s (%s convert --cache, %s)", c->src,
             c->cache_dir, c->program,
             c->dtype && *c->dtype ? c->dtype : "the source's dtypes");
    pid_t pid;
    rc = spawn_converter(c, out_p[1], err_p[1], &pid);
    close(out_p[1]);
    close(err_p[1]);
    out_p[1] = err_p[1] = -1;
    if (rc < 0)
        goto out_mask;

    static struct line_buf ob, eb; /* large; one conversion at a time per process */
    memset(&ob, 0, sizeof ob);
    memset(&eb, 0, sizeof eb);
    bool cancelled = false;
    uint64_t last_tick = mono_ns();
    while (!ob.eof || !eb.eof) {
        struct pollfd p[3] = {{.fd = ob.eof ? -1 : out_p[0], .events = POLLIN},
                              {.fd = eb.eof ? -1 : err_p[0], .events = POLLIN},
                              {.fd = sfd, .events = POLLIN}};
        int n = poll(p, 3, 1000);
        if (n < 0 && errno != EINTR) {
            LOG_ERR("poll: %s", strerror(errno));
            kill(pid, SIGKILL);
            break;
        }
        if (n > 0 && p[0].revents)
            pump(out_p[0], &ob, false);
        if (n > 0 && p[1].revents)
            pump(err_p[0], &eb, true);
        if (n > 0 && p[2].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGHUP) {
                    LOG_INFO("SIGHUP while converting the model: ignored");
                } else if (!cancelled) {
                    LOG_WARN("%s while converting the model: stopping the converter (pid %d)",
                             si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM", (int)pid);
                    cancelled = true;
                    kill(pid, SIGTERM);
                }
            }
        }
        if (c->tick && mono_ns() - last_tick >= 1000000000ull) {
            last_tick = mono_ns();
            c->tick(c->ud);
        }
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (cancelled) {
        rc = ERR_CANCELLED;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        ob.buf[ob.len] = '\0';
        ob.buf[strcspn(ob.buf, "\n")] = '\0';
        struct stat sb;
        char manifest[PATH_MAX + 16];
        snprintf(manifest, sizeof manifest, "%s/model.ie.json", ob.buf);
        if (!ob.buf[0] || stat(manifest, &sb) != 0) {
            LOG_ERR("the model converter %s printed no IEBIN folder (\"%.200s\")", c->program,
                    ob.buf);
            rc = -EIO;
        } else if ((size_t)snprintf(out, cap, "%s", ob.buf) >= cap) {
            rc = -ENAMETOOLONG;
        } else {
            int fd = hold_entry(out);
            rc = fd < 0 ? fd : 0;
            *hold_fd = fd;
        }
    } else {
        char how[64];
        if (WIFEXITED(st))
            snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
        else
            snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(st));
        /* 2 (usage) and 3 (the source: missing, malformed, unsupported) cannot be retried */
        bool source = WIFEXITED(st) && (WEXITSTATUS(st) == 2 || WEXITSTATUS(st) == 3);
        LOG_ERR("model %s: conversion failed: `%s convert --cache %s%s%s %s` %s: %s", c->src,
                c->program, c->cache_dir, c->dtype && *c->dtype ? " --dtype " : "",
                c->dtype && *c->dtype ? c->dtype : "", c->src, how,
                eb.last[0] ? eb.last : "(it wrote nothing)");
        rc = source ? ERR_FORMAT : -EIO;
    }
out_mask:
    if (sfd >= 0)
        close(sfd);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
out_pipes:
    for (int i = 0; i < 2; i++) {
        if (out_p[i] >= 0)
            close(out_p[i]);
        if (err_p[i] >= 0)
            close(err_p[i]);
    }
    return rc;
}
