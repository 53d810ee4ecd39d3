/* path.c — path joining and mkdir -p (see path.h). */
#include "path.h"

#include "log.h"

#include <errno.h>
#include <unistd.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

int path_mkdir_p(const char *dir)
{
    if (!dir[0]) {
        LOG_ERR("cannot create a directory with an empty path");
        return -EINVAL;
    }
    char *p = strdup(dir);
    if (!p) {
        LOG_ERR("%s: out of memory", dir);
        return -ENOMEM;
    }
    int rc = 0;
    /* each prefix ending before a '/' (and the whole path), from the root down; p + 1 so an
     * absolute path does not try mkdir("") */
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            rc = -e;
            LOG_ERR("cannot create directory %s: %s", p, strerror(e));
            break;
        }
        *s = c;
        if (c == '\0')
            break;
    }
    /* EEXIST says a name is there, not that it is a directory */
    if (rc == 0) {
        struct stat st;
        if (stat(dir, &st) != 0) {
            int e = errno;
            rc = -e;
            LOG_ERR("cannot create directory %s: %s", dir, strerror(e));
        } else if (!S_ISDIR(st.st_mode)) {
            rc = -ENOTDIR;
            LOG_ERR("cannot create directory %s: %s", dir, strerror(ENOTDIR));
        }
    }
    free(p);
    return rc;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void path_rm_tree(const char *dir)
{
    if (access(dir, F_OK) == 0 && nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        int e = errno;
        LOG_WARN("could not remove scratch folder %s: %s", dir, strerror(e));
    }
}
