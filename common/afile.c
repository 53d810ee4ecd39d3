/* afile.c — atomic file creation by temp + fsync + rename (see afile.h). */
#include "afile.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t fault_write_limit(void)
{
    const char *s = getenv("CLOCHER_FAULT_WRITE_LIMIT");
    if (!s || !*s)
        return UINT64_MAX;
    return strtoull(s, NULL, 10);
}

static void afile_free(struct afile *af)
{
    free(af->tmp_path);
    free(af->final_path);
    af->tmp_path = NULL;
    af->final_path = NULL;
    af->fd = -1;
}

int afile_open(struct afile *af, const char *final_path)
{
    memset(af, 0, sizeof *af);
    af->fd = -1;
    size_t n = strlen(final_path);
    af->final_path = strdup(final_path);
    af->tmp_path = malloc(n + sizeof ".tmp.XXXXXX");
    if (!af->final_path || !af->tmp_path) {
        LOG_ERR("out of memory creating %s", final_path);
        afile_free(af);
        return -ENOMEM;
    }
    memcpy(af->tmp_path, final_path, n);
    memcpy(af->tmp_path + n, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    af->fd = mkostemp(af->tmp_path, O_CLOEXEC);
    if (af->fd < 0) {
        int e = errno;
        LOG_ERR("cannot create %s: %s", af->tmp_path, strerror(e));
        afile_free(af);
        return -e;
    }
    if (fchmod(af->fd, 0644) != 0) {
        int e = errno;
        LOG_ERR("fchmod(%s) failed: %s", af->tmp_path, strerror(e));
        afile_abort(af);
        return -e;
    }
    return 0;
}

int afile_write(struct afile *af, const void *buf, size_t n)
{
    const char *p = buf;
    if (af->written + n > fault_write_limit()) {
        LOG_ERR("write(%s) failed: %s", af->tmp_path, strerror(ENOSPC));
        return -ENOSPC;
    }
    while (n > 0) {
        ssize_t w = write(af->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            LOG_ERR("write(%s) failed: %s", af->tmp_path, strerror(e));
            return -e;
        }
        p += w;
        n -= (size_t)w;
        af->written += (uint64_t)w;
    }
    return 0;
}

int afile_pad(struct afile *af, uint64_t align)
{
    static const char zeros[256];
    uint64_t rem = af->written % align;
    if (rem == 0)
        return 0;
    uint64_t need = align - rem;
    while (need > 0) {
        size_t chunk = need > sizeof zeros ? sizeof zeros : (size_t)need;
        int rc = afile_write(af, zeros, chunk);
        if (rc != 0)
            return rc;
        need -= chunk;
    }
    return 0;
}

static int fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return -ENOMEM;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (dfd < 0 || fsync(dfd) != 0) {
        rc = -errno;
        LOG_ERR("fsync of directory %s failed: %s", copy, strerror(errno));
    }
    if (dfd >= 0)
        close(dfd);
    free(copy);
    return rc;
}

int afile_commit(struct afile *af)
{
    int rc = 0;
    if (fsync(af->fd) != 0) {
        rc = -errno;
        LOG_ERR("fsync(%s) failed: %s", af->tmp_path, strerror(errno));
        goto fail;
    }
    if (close(af->fd) != 0) {
        af->fd = -1;
        rc = -errno;
        LOG_ERR("close(%s) failed: %s", af->tmp_path, strerror(errno));
        goto fail;
    }
    af->fd = -1;
    if (rename(af->tmp_path, af->final_path) != 0) {
        rc = -errno;
        LOG_ERR("rename(%s, %s) failed: %s", af->tmp_path, af->final_path, strerror(errno));
        goto fail;
    }
    rc = fsync_dir_of(af->final_path);
    afile_free(af);
    return rc;
fail:
    afile_abort(af);
    return rc;
}

void afile_abort(struct afile *af)
{
    if (af->fd >= 0)
        close(af->fd);
    if (af->tmp_path)
        unlink(af->tmp_path);
    afile_free(af);
}
