/* convcache.c — the conversion cache (convcache.h): the content key, the lock, and the
 * convert-into-scratch-then-rename that makes an entry appear only complete. */
#define _DEFAULT_SOURCE   /* flock, DT_* */
#include "convcache.h"
#include "convcache_md.h"

#include "clocher_version.h"
#include "err.h"
#include "log.h"
#include "path.h"
#include "modelsrc.h"
#include "mono.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KEY_TAG "clocher-convcache-v1"
#define WHOLE_MAX (64ull << 20) /* files up to this size are hashed whole */
#define HEAD_BYTES (4ull << 20)
#define TAIL_BYTES (1ull << 20)
#define SLICE_BYTES (64ull << 10)
#define N_SLICES 16
#define MAX_FILES 4096

/* Feeds bytes [off, off+len) of fd into the digest. */
static int hash_range(void *md, int fd, const char *path, uint64_t off, uint64_t len)
{
    static char buf[1 << 16];
    while (len > 0) {
        size_t want = len < sizeof buf ? (size_t)len : sizeof buf;
        ssize_t n = pread(fd, buf, want, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            LOG_ERR("%s: cannot read it: %s", path, n < 0 ? strerror(e) : "shorter than its size");
            return -e;
        }
        convcache_md_update(md, buf, (size_t)n);
        off += (uint64_t)n;
        len -= (uint64_t)n;
    }
    return 0;
}

/* One file's part of the key: its name (as given), size, mtime and content (convcache.h). */
static int hash_file(void *md, const char *path, const char *name)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        LOG_ERR("%s: cannot open it: %s", path, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    char meta[512];
    int n = snprintf(meta, sizeof meta, "file %s size %llu mtime %lld.%09ld\n", name,
                     (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec);
    convcache_md_update(md, meta, (size_t)n);
    uint64_t size = (uint64_t)st.st_size;
    int rc = 0;
    if (size <= WHOLE_MAX) {
        rc = hash_range(md, fd, path, 0, size);
    } else {
        rc = hash_range(md, fd, path, 0, HEAD_BYTES);
        for (int i = 0; rc == 0 && i < N_SLICES; i++) {
            uint64_t at = HEAD_BYTES + (size - HEAD_BYTES - TAIL_BYTES - SLICE_BYTES) / N_SLICES *
                                           (uint64_t)i;
            rc = hash_range(md, fd, path, at, SLICE_BYTES);
        }
        if (rc == 0)
            rc = hash_range(md, fd, path, size - TAIL_BYTES, TAIL_BYTES);
    }
    close(fd);
    return rc;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Whether a Hugging Face folder's file is one the converter may read (convcache.h). */
static bool hf_input(const char *name)
{
    static const char *const ext[] = {".json", ".safetensors", ".model", ".txt", ".tiktoken",
                                      ".jinja"};
    if (name[0] == '.')
        return false;
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
        if (ends_with(name, ext[i]))
            return true;
    return false;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every input file of the folder, by name. */
static int hash_folder(void *md, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        LOG_ERR("%s: cannot list it: %s", dir, strerror(e));
        return -e;
    }
    char **names = calloc(MAX_FILES, sizeof *names);
    size_t n = 0;
    int rc = names ? 0 : -ENOMEM;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (!hf_input(de->d_name))
            continue;
        if (n == MAX_FILES) {
            LOG_ERR("%s: more than %d model files", dir, MAX_FILES);
            rc = ERR_RANGE;
        } else if (!(names[n++] = strdup(de->d_name))) {
            rc = -ENOMEM;
        }
    }
    closedir(d);
    if (rc == 0)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char p[4096];
        struct stat st;
        if (snprintf(p, sizeof p, "%s/%s", dir, names[i]) >= (int)sizeof p) {
            LOG_ERR("%s/%s: path too long", dir, names[i]);
            rc = -ENAMETOOLONG;
        } else if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            rc = hash_file(md, p, names[i]);
        }
    }
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

int convcache_key(const char *src, const char *dtype_name, char *hex)
{
    struct stat st;
    if (stat(src, &st) != 0) {
        int e = errno;
        LOG_ERR("model source %s: %s", src, strerror(e));
        return -e;
    }
    void *md = convcache_md_new();
    if (!md) {
        LOG_ERR("SHA-256 is not available from OpenSSL");
        return -ENOMEM;
    }
    char head[256];
    int n = snprintf(head, sizeof head, "%s\nconverter %s epoch %d\ndtype %s\n%s\n", KEY_TAG,
                     CLOCHER_VERSION_NUMBER, CONVCACHE_EPOCH, dtype_name && *dtype_name ? dtype_name : "source",
                     S_ISDIR(st.st_mode) ? "folder" : "file");
    convcache_md_update(md, head, (size_t)n);
    int rc = S_ISDIR(st.st_mode) ? hash_folder(md, src) : hash_file(md, src, "");
    unsigned char d[32];
    convcache_md_final(md, d);
    if (rc < 0)
        return rc;
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}

int convcache_entry(const char *cache_dir, const char *src, const char *dtype_name, char *out,
                    size_t cap)
{
    char hex[CONVCACHE_KEY_HEX + 1];
    int rc = convcache_key(src, dtype_name, hex);
    if (rc < 0)
        return rc;
    /* the stem: the source's last component without trailing slashes and ".gguf" */
    size_t n = strlen(src);
    while (n > 1 && src[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && src[b - 1] != '/')
        b--;
    size_t len = n - b;
    if (len > 5 && strncmp(src + n - 5, ".gguf", 5) == 0)
        len -= 5;
    if (len > 96)
        len = 96;
    int w = snprintf(out, cap, "%s/%.*s-%.16s", cache_dir, (int)len, src + b, hex);
    if (w < 0 || (size_t)w >= cap) {
        LOG_ERR("cache directory %s: path too long", cache_dir);
        return -ENAMETOOLONG;
    }
    return 0;
}

/* ---- the entry: lock, reuse or convert into scratch, rename ---- */

/* Removes <entry>.tmp.* in the entry's folder: with the lock held, nobody else writes them. */
static void rm_stale(const char *entry)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", entry);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return;
    *slash = '\0';
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s.tmp.", slash + 1);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char p[4600];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        LOG_INFO("removing %s, left by a conversion that did not finish", p);
        path_rm_tree(p);
    }
    closedir(d);
}

static bool is_iebin(const char *dir)
{
    char p[4608];
    int n = snprintf(p, sizeof p, "%s/model.ie.json", dir);
    return n > 0 && (size_t)n < sizeof p && access(p, F_OK) == 0;
}

/* Marks an entry used now (its folder's mtime: eviction removes the least recently used). */
static int stamp_used(const char *entry)
{
    if (utimensat(AT_FDCWD, entry, NULL, 0) != 0) {
        int e = errno;
        LOG_ERR("%s: cannot mark it used: %s", entry, strerror(e));
        return -e;
    }
    return 0;
}

/* Progress lines for a log (no \r): about every tenth of the tensors. */
struct progress_log {
    const char *src;
    size_t last_tenth;
    uint64_t t0;
};

static void progress_line(void *arg, size_t done, size_t total)
{
    struct progress_log *p = arg;
    size_t tenth = total ? done * 10 / total : 10;
    if (tenth == p->last_tenth && done != total)
        return;
    p->last_tenth = tenth;
    fprintf(stderr, "converting %s: %zu/%zu tensors (%zu%%, %.1f s)\n", p->src, done, total,
            total ? done * 100 / total : 100, (double)(mono_ns() - p->t0) / 1e9);
    fflush(stderr);
}

/* mkdir -p: the default cache folder (~/.cache/clocher) may be the first under ~/.cache. */
static int make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return -ENAMETOOLONG;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -errno;
        if (!(*s = c))
            return 0;
    }
}

int convcache_get(const char *cache_dir, const char *src, const struct convert_opts *o,
                  const char *dtype_name, char *out, size_t cap, bool *converted,
                  enum convert_fault *fault)
{
    *converted = false;
    *fault = CONVERT_FAULT_SOURCE;
    int rc;
    if ((rc = make_dirs(cache_dir)) < 0) {
        LOG_ERR("cache directory %s: cannot create it: %s", cache_dir, strerror(-rc));
        *fault = CONVERT_FAULT_OUTPUT;
        return rc;
    }
    if ((rc = convcache_entry(cache_dir, src, dtype_name, out, cap)) < 0)
        return rc;
    if (is_iebin(out)) /* the common case needs no lock: an entry exists only complete */
        return stamp_used(out);

    char lock[4200], tmp[4200];
    snprintf(lock, sizeof lock, "%s" MODELSRC_LOCK_SUFFIX, out);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("%s: cannot create the lock file: %s", lock, strerror(e));
        *fault = CONVERT_FAULT_OUTPUT;
        return -e;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "waiting for another conversion of %s into %s\n", src, out);
        fflush(stderr);
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
            ;
    }
    if (is_iebin(out)) { /* the other one finished it */
        close(fd);
        return stamp_used(out);
    }
    rm_stale(out);
    fprintf(stderr, "converting %s into %s (dtype %s)\n", src, out,
            dtype_name && *dtype_name ? dtype_name : "as in the source");
    fflush(stderr);
    struct progress_log pl = {.src = src, .last_tenth = 0, .t0 = mono_ns()};
    struct convert_opts co = *o;
    co.progress = false;
    co.on_tensor = progress_line;
    co.on_tensor_arg = &pl;
    rc = convert_model(src, tmp, &co, fault);
    if (rc == 0 && rename(tmp, out) != 0) {
        rc = -errno;
        LOG_ERR("%s: cannot move the converted model into place: %s", out, strerror(-rc));
        *fault = CONVERT_FAULT_OUTPUT;
    }
    if (rc != 0)
        path_rm_tree(tmp);
    else {
        *converted = true;
        fprintf(stderr, "converted %s in %.1f s\n", src, (double)(mono_ns() - pl.t0) / 1e9);
        rc = stamp_used(out);
    }
    close(fd); /* releases the lock */
    return rc;
}

/* ---- eviction ---- */

struct cached {
    char name[256];
    uint64_t bytes;   /* on disk (st_blocks) */
    struct timespec used; /* the folder's mtime: stamped at each use */
};

/* Bytes on disk of everything under dir (st_blocks, so sparse files count what they take). */
static uint64_t tree_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[4600];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (lstat(p, &st) != 0)
            continue;
        sum += (uint64_t)st.st_blocks * 512u;
        if (S_ISDIR(st.st_mode))
            sum += tree_bytes(p);
    }
    closedir(d);
    return sum;
}

static int by_use(const void *a, const void *b)
{
    const struct cached *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec)
        return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    if (x->used.tv_nsec != y->used.tv_nsec)
        return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Removes one entry if nobody holds its lock: 1 removed, 0 skipped (in use / vanished). */
static int evict_one(const char *cache_dir, const struct cached *e)
{
    char entry[4400], lock[4450], gone[4500];
    snprintf(entry, sizeof entry, "%s/%s", cache_dir, e->name);
    snprintf(lock, sizeof lock, "%s" MODELSRC_LOCK_SUFFIX, entry);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "cache: cannot evict %s: %s: %s\n", entry, lock, strerror(errno));
        return 0;
    }
    int removed = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "cache: %s is in use: kept\n", entry);
    } else if (is_iebin(entry)) {
        snprintf(gone, sizeof gone, "%s.tmp.evict%ld", entry, (long)getpid());
        if (rename(entry, gone) != 0) {
            fprintf(stderr, "cache: cannot evict %s: %s\n", entry, strerror(errno));
        } else {
            path_rm_tree(gone);
            unlink(lock); /* with the lock held: a later user creates it afresh */
            fprintf(stderr, "cache: evicted %s (%.1f MB, least recently used)\n", entry,
                    (double)e->bytes / 1e6);
            removed = 1;
        }
    }
    close(fd);
    return removed;
}

int convcache_evict(const char *cache_dir, const char *keep, uint64_t max_bytes)
{
    DIR *d = opendir(cache_dir);
    if (!d) {
        int e = errno;
        LOG_ERR("cache directory %s: cannot list it: %s", cache_dir, strerror(e));
        return -e;
    }
    const char *keep_name = keep ? strrchr(keep, '/') : NULL;
    keep_name = keep_name ? keep_name + 1 : keep;
    struct cached *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || strstr(de->d_name, ".tmp.") ||
            strlen(de->d_name) >= sizeof v->name)
            continue;
        char p[4400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", cache_dir, de->d_name);
        if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode) || !is_iebin(p))
            continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            struct cached *nv = realloc(v, nc * sizeof *v);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
        v[n].bytes = tree_bytes(p);
        v[n].used = st.st_mtim;
        total += v[n].bytes;
        n++;
    }
    closedir(d);
    if (rc < 0) {
        free(v);
        LOG_ERR("cache directory %s: out of memory listing it", cache_dir);
        return rc;
    }
    qsort(v, n, sizeof *v, by_use);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (size_t i = 0; i < n && total > max_bytes; i++) {
        if (keep_name && !strcmp(v[i].name, keep_name))
            continue;
        if (now.tv_sec - v[i].used.tv_sec < CONVCACHE_EVICT_GRACE_S)
            continue;
        if (evict_one(cache_dir, &v[i]))
            total -= v[i].bytes;
    }
    if (total > max_bytes)
        fprintf(stderr, "cache: %s holds %.1f MB, above its limit of %.1f MB: the rest is in use "
                        "or was used in the last %d s\n", cache_dir, (double)total / 1e6,
                (double)max_bytes / 1e6, CONVCACHE_EVICT_GRACE_S);
    free(v);
    return 0;
}
