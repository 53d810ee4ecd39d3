/*
 * fmap.c — whole-file reads for parsers of untrusted files (see fmap.h).
 */
#include "fmap.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens a regular file; its size in *size. Returns the fd or a negative code (logged). */
static int open_regular(const char *path, const char *what, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("%s: cannot open the %s: %s", path, what, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        LOG_ERR("%s: cannot stat the %s: %s", path, what, strerror(e));
        close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERR("%s: the %s is not a regular file", path, what);
        close(fd);
        return ERR_FORMAT;
    }
    *size = (size_t)st.st_size;
    return fd;
}

int fmap_open(const char *path, const char *what, struct fmap *out)
{
    out->data = NULL;
    out->size = 0;
    size_t size;
    int fd = open_regular(path, what, &size);
    if (fd < 0)
        return fd;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            LOG_ERR("%s: cannot map the %s (%zu bytes): %s", path, what, size, strerror(e));
            close(fd);
            return -e;
        }
    }
    close(fd); /* the mapping keeps the file */
    out->data = map;
    out->size = size;
    return 0;
}

void fmap_close(struct fmap *m)
{
    if (m->data && m->size > 0)
        munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int fmap_read(const char *path, const char *what, size_t cap, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    size_t size;
    int fd = open_regular(path, what, &size);
    if (fd < 0)
        return fd;
    int rc = 0;
    char *b = NULL;
    if (size > cap) {
        LOG_ERR("%s: the %s is %zu bytes, larger than the %zu-byte limit", path, what, size,
                cap);
        rc = ERR_RANGE;
        goto out;
    }
    if (!(b = malloc(size + 1))) {
        LOG_ERR("%s: out of memory reading the %s (%zu bytes)", path, what, size);
        rc = -ENOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, b + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            LOG_ERR("%s: cannot read the %s: %s", path, what, strerror(errno));
            goto out;
        }
        if (r == 0)
            break; /* shrank under us: the parser sees the truncation */
        got += (size_t)r;
    }
    b[got] = '\0';
    *buf = b;
    *len = got;
    b = NULL;
out:
    free(b);
    close(fd);
    return rc;
}
