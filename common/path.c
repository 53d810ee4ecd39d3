/* path.c — path joining and mkdir -p (see path.h). */
#include "path.h"

#include "log.h"

#include <errno.h>
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
