/*
 * hotrepl.c — node-local copies of hot tensors moved over the shared model mapping, and the
 * model's page cache re-read in 2 MiB folios (see hotrepl.h).
 */
#include "hotrepl.h"

#include "err.h"
#include "iebin.h"
#include "log.h"
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/mempolicy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

struct span {
    uint64_t off, size;
    unsigned rank; /* hotness order: lower first */
    char name[IEBIN_NAME_MAX];
};

struct vma {
    uintptr_t start, end;
    uint64_t off;
};

/* cls_stored: the classifier product reads the stored rows (not panels) */
static unsigned rank_of(const char *name, const struct iebin_hparams *hp, bool cls_stored)
{
    unsigned layer;
    int n = 0;
    if (strcmp(name, IEBIN_T_OUTPUT) == 0 || strcmp(name, IEBIN_T_OUTPUT_NORM) == 0)
        return 0;
    if (strcmp(name, IEBIN_T_TOK_EMBD) == 0) /* tied and read whole: it is the classifier */
        return hp->tied_embeddings && cls_stored ? 0 : hp->n_layers + 1;
    if (sscanf(name, "blk.%u.%n", &layer, &n) == 1 && n > 0)
        return 1 + layer;
    return hp->n_layers + 2;
}

static int cmp_rank(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return (x->off > y->off) - (x->off < y->off);
}

static int cmp_off(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* The VMAs of this process that map the file (dev, ino). */
static int find_vmas(dev_t dev, ino_t ino, struct vma **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) {
        int e = errno;
        LOG_ERR("hot replication: /proc/self/maps: %s", strerror(e));
        return -e;
    }
    char *line = NULL;
    size_t cap = 0, n = 0, alloc = 0;
    struct vma *v = NULL;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        unsigned long start, end, off, inode;
        unsigned maj, min;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &start, &end, perms, &off, &maj, &min,
                   &inode) != 7)
            continue;
        if (inode != (unsigned long)ino || makedev(maj, min) != dev)
            continue;
        if (n == alloc) {
            alloc = alloc ? 2 * alloc : 16;
            struct vma *nv = realloc(v, alloc * sizeof *v);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
        }
        v[n++] = (struct vma){.start = start, .end = end, .off = off};
    }
    free(line);
    fclose(f);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* Whether [a, b) is covered by VMAs belonging to the mapping whose file offset 0 is at base. */
static bool covered(const struct vma *v, size_t n, uintptr_t base, uintptr_t a, uintptr_t b)
{
    while (a < b) {
        bool found = false;
        for (size_t i = 0; i < n; i++)
            if (v[i].start - v[i].off == base && v[i].start <= a && a < v[i].end) {
                a = v[i].end;
                found = true;
                break;
            }
        if (!found)
            return false;
    }
    return true;
}

#define HUGE_2M ((uintptr_t)2 << 20)
#define COPY_CHUNK ((uintptr_t)64 << 20) /* a multiple of 2 MiB: the most memory a copy adds */

/*
 * Copies [addr, addr+len) (addr < end <= addr + COPY_CHUNK) into fresh anonymous memory on
 * `node` and moves it over addr. The copy starts at the same offset within 2 MiB as addr and
 * asks for transparent huge pages, so its 2 MiB-aligned parts keep 2 MiB entries when mremap
 * moves them (decode through 4 KiB entries ran several times slower: hotrepl_hugify).
 */
static int replicate_chunk(uintptr_t addr, size_t len, int node)
{
    const size_t span = len + HUGE_2M;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        int e = errno;
        LOG_ERR("hot replication: mmap of %zu bytes: %s", span, strerror(e));
        return -e;
    }
    /* copy = raw + d, copy = addr (mod 2 MiB); the rest of the span is given back */
    const size_t d = (addr - (uintptr_t)raw) & (HUGE_2M - 1);
    char *copy = raw + d;
    if (d)
        munmap(raw, d);
    munmap(copy + len, span - d - len);
    (void)madvise(copy, len, MADV_HUGEPAGE); /* a hint: 4 KiB pages still work */
    if (node >= 0) {
        /* bind before the first touch: memcpy's page faults allocate on the node */
        unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
        mask[(unsigned)node / (8 * sizeof(unsigned long))] |= 1ul << ((unsigned)node % (8 * sizeof(unsigned long)));
        if (syscall(SYS_mbind, copy, len, MPOL_BIND, mask, sizeof mask * 8, 0) != 0) {
            int e = errno;
            LOG_ERR("hot replication: mbind(node %d) of %zu bytes: %s", node, len, strerror(e));
            munmap(copy, len);
            return -e;
        }
    }
    memcpy(copy, (const void *)addr, len);
    if (mprotect(copy, len, PROT_READ) != 0 ||
        mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)addr) == MAP_FAILED) {
        int e = errno;
        LOG_ERR("hot replication: moving %zu bytes over %p: %s", len, (void *)addr, strerror(e));
        munmap(copy, len);
        return -e;
    }
    return 0;
}

/*
 * [addr, addr+len) replicated chunk by chunk (chunks end on 2 MiB boundaries), so that the
 * copies never hold more than one chunk beside the pages they replace: replicating a whole
 * model stays within its size plus COPY_CHUNK.
 */
static int replicate_range(uintptr_t addr, size_t len, int node)
{
    const uintptr_t end = addr + len;
    for (uintptr_t c = addr; c < end;) {
        uintptr_t e = (c + COPY_CHUNK) & ~(HUGE_2M - 1);
        e = e > end || e <= c ? end : e;
        int rc = replicate_chunk(c, (size_t)(e - c), node);
        if (rc < 0)
            return rc;
        c = e;
    }
    return 0;
}

int hotrepl_apply(const char *model_dir, const struct model *model, int node,
                  uint64_t limit_bytes, struct hotrepl_report *rep)
{
    memset(rep, 0, sizeof *rep);
    if (node >= 1024) {
        LOG_ERR("hot replication: node %d is beyond 1023", node);
        return ERR_RANGE;
    }
    /* the manifest, from a lazy mapping of our own that is closed before we look for the
     * engine's (so it is not mistaken for one) */
    struct iebin_model *m = NULL;
    int rc = iebin_open_ex(model_dir, IEBIN_OPEN_LAZY, &m);
    if (rc < 0)
        return rc;
    size_t n = m->n_tensors;
    struct span *sp = calloc(n ? n : 1, sizeof *sp);
    char *blob = malloc(strlen(m->dir) + sizeof "/" IEBIN_BLOB);
    if (!sp || !blob) {
        iebin_close(m);
        free(sp);
        free(blob);
        return -ENOMEM;
    }
    sprintf(blob, "%s/%s", m->dir, IEBIN_BLOB);
    const bool cls_stored = !model || !model->output.panels;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        const struct iebin_tensor *t = &m->tensors[i];
        if (model && !model_reads_stored(model, t->name)) {
            rep->n_unread++;
            rep->unread_bytes += t->size;
            continue;
        }
        sp[kept].off = t->offset;
        sp[kept].size = t->size;
        sp[kept].rank = rank_of(t->name, &m->hp, cls_stored);
        snprintf(sp[kept].name, sizeof sp[kept].name, "%s", t->name);
        kept++;
    }
    n = kept; /* the candidates: tensors something reads */
    iebin_close(m);

    struct vma *v = NULL;
    size_t nv = 0;
    struct stat st;
    if (stat(blob, &st) != 0) {
        rc = -errno;
        LOG_ERR("hot replication: %s: %s", blob, strerror(errno));
        goto out;
    }
    if ((rc = find_vmas(st.st_dev, st.st_ino, &v, &nv)) < 0)
        goto out;

    /* choose in hotness order while the limit allows */
    qsort(sp, n, sizeof *sp, cmp_rank);
    size_t chosen = 0;
    uint64_t total = 0;
    while (chosen < n && (limit_bytes == 0 || total + sp[chosen].size <= limit_bytes))
        total += sp[chosen++].size;
    rep->n_tensors = chosen;
    rep->n_skipped = n - chosen;
    for (size_t i = chosen; i < n; i++)
        rep->skipped_bytes += sp[i].size;
    if (chosen) {
        snprintf(rep->first, sizeof rep->first, "%s", sp[0].name);
        snprintf(rep->last, sizeof rep->last, "%s", sp[chosen - 1].name);
    }
    /* then copy in file order, whole pages, adjacent tensors merged into one range */
    qsort(sp, chosen, sizeof *sp, cmp_off);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

    for (size_t k = 0; k < nv; k++) {
        uintptr_t base = v[k].start - v[k].off;
        bool seen = false;
        for (size_t j = 0; j < k; j++)
            if (v[j].start - v[j].off == base)
                seen = true;
        if (seen)
            continue; /* one pass per mapping, not per VMA */
        rep->n_mappings++;
        for (size_t i = 0; i < chosen;) {
            uint64_t a = sp[i].off / page * page;
            uint64_t b = (sp[i].off + sp[i].size + page - 1) / page * page;
            size_t j = i + 1;
            while (j < chosen && sp[j].off / page * page <= b) {
                uint64_t e = (sp[j].off + sp[j].size + page - 1) / page * page;
                b = e > b ? e : b;
                j++;
            }
            if (!covered(v, nv, base, base + a, base + b)) {
                LOG_WARN("hot replication: the mapping at %p does not cover %s..%s; left shared",
                         (void *)base, sp[i].name, sp[j - 1].name);
            } else {
                if ((rc = replicate_range(base + a, (size_t)(b - a), node)) < 0)
                    goto out;
                rep->bytes += b - a;
            }
            i = j;
        }
    }
    if (rep->n_mappings == 0)
        LOG_INFO("hot replication: %s is not mapped by this process: nothing to replicate",
                 blob);
    /* the copies read whole pages: a page shared with an unread matrix may have faulted
     * more of it back in (fault-around); the unread ranges never overlap a copied page.
     * A failure is memory, not correctness (logged) */
    if (model)
        (void)model_release_stored_rows(model, NULL);
    rc = 0;
out:
    free(v);
    free(sp);
    free(blob);
    return rc;
}

/* ---- 2 MiB folios for the file mapping -------------------------------------------------- */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define HUGIFY_CHUNK ((uint64_t)64 << 20) /* a multiple of 2 MiB: the most memory it adds */

/* madvise, logged with what it was for. */
static int advise(void *addr, uint64_t len, int advice, const char *what)
{
    if (madvise(addr, (size_t)len, advice) == 0)
        return 0;
    int e = errno;
    LOG_ERR("2 MiB folios: madvise(%s) of %" PRIu64 " bytes at %p: %s", what, len, addr,
            strerror(e));
    return -e;
}

/* FilePmdMapped of this process in bytes (0 if /proc says nothing). */
static uint64_t pmd_mapped(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "re");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/*
 * Populates file bytes [off, off + n) of the mapping at base (just emptied by MADV_DONTNEED and
 * given MADV_HUGEPAGE), less the unread ranges r[0..nr) (sorted, disjoint, page-aligned):
 * those get MADV_NOHUGEPAGE back first (a VMA of their own, as model_release_stored_rows
 * leaves them, so no 2 MiB entry maps them with a kept neighbour) and stay unpopulated.
 */
static int populate_kept(uintptr_t base, uint64_t off, uint64_t n, const struct model_range *r,
                         size_t nr)
{
    const uint64_t end = off + n;
    int rc;
    for (size_t i = 0; i < nr && r[i].off < end; i++) {
        uint64_t lo = r[i].off > off ? r[i].off : off, hi = r[i].off + r[i].len;
        hi = hi < end ? hi : end;
        if (hi > lo && (rc = advise((void *)(base + lo), hi - lo, MADV_NOHUGEPAGE,
                                    "NOHUGEPAGE")) < 0)
            return rc;
    }
    uint64_t a = off; /* the next byte to populate */
    for (size_t i = 0; i < nr && a < end && r[i].off < end; i++) {
        if (r[i].off + r[i].len <= a)
            continue; /* before the chunk */
        if (r[i].off > a &&
            (rc = advise((void *)(base + a), r[i].off - a, MADV_POPULATE_READ,
                         "POPULATE_READ")) < 0)
            return rc;
        a = r[i].off + r[i].len;
    }
    if (a < end && (rc = advise((void *)(base + a), end - a, MADV_POPULATE_READ,
                                "POPULATE_READ")) < 0)
        return rc;
    return 0;
}

int hotrepl_hugify(const char *model_dir, struct hotrepl_huge_report *rep)
{
    return hotrepl_hugify_model(model_dir, NULL, rep);
}

int hotrepl_hugify_model(const char *model_dir, const struct model *model,
                         struct hotrepl_huge_report *rep)
{
    memset(rep, 0, sizeof *rep);
    struct model_range *unread = NULL;
    size_t n_unread = 0;
    int rc = model ? model_unread_ranges(model, &unread, &n_unread) : 0;
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n_unread; i++)
        rep->unread_bytes += unread[i].len;
    struct iebin_model *m = NULL;
    if ((rc = iebin_open_ex(model_dir, IEBIN_OPEN_LAZY, &m)) < 0) {
        free(unread);
        return rc;
    }
    char *blob = malloc(strlen(m->dir) + sizeof "/" IEBIN_BLOB);
    if (blob)
        sprintf(blob, "%s/%s", m->dir, IEBIN_BLOB);
    iebin_close(m); /* before looking for the engine's mappings: ours is not one */
    if (!blob) {
        free(unread);
        return -ENOMEM;
    }
    struct vma *v = NULL;
    size_t nv = 0;
    uintptr_t *base = NULL;
    size_t nb = 0;
    void *own = MAP_FAILED;
    int fd = open(blob, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = -errno;
        LOG_ERR("2 MiB folios: %s: %s", blob, strerror(errno));
        goto out;
    }
    rep->file_bytes = (uint64_t)st.st_size;
    if ((rc = find_vmas(st.st_dev, st.st_ino, &v, &nv)) < 0)
        goto out;
    base = calloc(nv ? nv : 1, sizeof *base);
    if (!base) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < nv; k++) { /* one entry per mapping, not per VMA */
        uintptr_t b = v[k].start - v[k].off;
        bool seen = false;
        for (size_t j = 0; j < nb; j++)
            seen |= base[j] == b;
        if (!seen)
            base[nb++] = b;
    }
    rep->n_mappings = nb;
    if (st.st_size == 0)
        goto done;
    /* already 2 MiB entries for nearly all of what every mapping keeps: nothing to gain
     * (the unread ranges are out of the page tables, or will be: not counted) */
    const uint64_t kept = (uint64_t)st.st_size > rep->unread_bytes
                              ? (uint64_t)st.st_size - rep->unread_bytes
                              : 0;
    if (nb && (rep->pmd_bytes = pmd_mapped()) * 10 >= kept * nb * 9) {
        rep->skipped = true;
        rc = 0;
        goto out;
    }
    /*
     * Dirty pages cannot be dropped: a model just written (convert, cp) would keep its 4 KiB
     * pages for the whole life of the process (kq helper, session 13: 590 MiB re-read, 0 MiB
     * in 2 MiB pages, until writeback). Writing them out first costs what writeback would.
     */
    if (fdatasync(fd) != 0) {
        int e = errno;
        LOG_WARN("2 MiB folios: fdatasync of %s: %s; pages not yet written stay 4 KiB", blob,
                 strerror(e));
    }
    /* our own mapping reads the file (the kernel aligns a file mapping this large on 2 MiB) */
    own = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (own == MAP_FAILED) {
        rc = -errno;
        LOG_ERR("2 MiB folios: mmap of %s: %s", blob, strerror(errno));
        goto out;
    }
    for (uint64_t off = 0; off < (uint64_t)st.st_size; off += HUGIFY_CHUNK) {
        const uint64_t n = (uint64_t)st.st_size - off < HUGIFY_CHUNK ? (uint64_t)st.st_size - off
                                                                      : HUGIFY_CHUNK;
        /* the chunk's pages unmapped here, then dropped from the cache (if nobody maps them) */
        for (size_t j = 0; j < nb; j++)
            if (covered(v, nv, base[j], base[j] + off, base[j] + off + n) &&
                (rc = advise((void *)(base[j] + off), n, MADV_DONTNEED, "DONTNEED")) < 0)
                goto out;
        if ((rc = posix_fadvise(fd, (off_t)off, (off_t)n, POSIX_FADV_DONTNEED)) != 0) {
            LOG_ERR("2 MiB folios: posix_fadvise(DONTNEED) of %s: %s", blob, strerror(rc));
            rc = -rc;
            goto out;
        }
        /* read again in PMD-sized folios, then mapped whole by the engine's mappings */
        char *p = (char *)own + off;
        if ((rc = advise(p, n, MADV_HUGEPAGE, "HUGEPAGE")) < 0 ||
            (rc = advise(p, n, MADV_POPULATE_READ, "POPULATE_READ")) < 0 ||
            (rc = advise(p, n, MADV_DONTNEED, "DONTNEED")) < 0)
            goto out;
        /* the engine's mappings: what they read (every mapping of this file in the process
         * is taken to be a model with the same panels: the same file, ISA and knobs) */
        for (size_t j = 0; j < nb; j++) {
            void *q = (void *)(base[j] + off);
            if (covered(v, nv, base[j], base[j] + off, base[j] + off + n) &&
                ((rc = advise(q, n, MADV_HUGEPAGE, "HUGEPAGE")) < 0 ||
                 (rc = populate_kept(base[j], off, n, unread, n_unread)) < 0))
                goto out;
        }
    }
done:
    rep->pmd_bytes = pmd_mapped();
    rc = 0;
out:
    if (own != MAP_FAILED)
        munmap(own, (size_t)st.st_size);
    if (fd >= 0)
        close(fd);
    free(base);
    free(v);
    free(blob);
    free(unread);
    return rc;
}

int hotrepl_hugify_default(const char *model_dir, struct hotrepl_huge_report *rep)
{
    return hotrepl_hugify_default_model(model_dir, NULL, rep);
}

/* The weights resident once: the unread stored rows out of m's mapping, after hugify. */
static int release_after(const struct model *m, struct hotrepl_huge_report *rep)
{
    if (!m)
        return 0;
    int rc = model_release_stored_rows(m, &rep->released_bytes);
    if (rc < 0) /* memory, not correctness: the products read the panels either way */
        LOG_WARN("stored rows: not released (%d, logged above); the repacked weights stay "
                 "resident twice", rc);
    else if (rep->released_bytes)
        LOG_INFO("stored rows: %.1f MiB of repacked weights out of the mapping (read through "
                 "their panels)", (double)rep->released_bytes / 1048576.0);
    return 0;
}

int hotrepl_hugify_default_model(const char *model_dir, const struct model *m,
                                 struct hotrepl_huge_report *rep)
{
    memset(rep, 0, sizeof *rep);
    const char *env = getenv("IE_HUGE_PAGES");
    if (env && !strcmp(env, "0")) {
        LOG_INFO("2 MiB folios: off (IE_HUGE_PAGES=0)");
        return release_after(m, rep);
    }
    if (env && *env && strcmp(env, "1")) {
        LOG_ERR("IE_HUGE_PAGES=%s: expected 0 (off) or 1 (on, the default)", env);
        return ERR_RANGE;
    }
    int rc = hotrepl_hugify_model(model_dir, m, rep);
    if (rc < 0) { /* a speed-up, not a need: the mappings still read the file in 4 KiB pages */
        LOG_WARN("2 MiB folios: not done (%d, logged above); the model is read in 4 KiB pages",
                 rc);
        memset(rep, 0, sizeof *rep);
    } else if (rep->skipped)
        LOG_INFO("2 MiB folios: the model is already mapped in 2 MiB pages (%.1f of the %.1f "
                 "MiB read through the mapping)", (double)rep->pmd_bytes / 1048576.0,
                 (double)(rep->file_bytes - rep->unread_bytes) / 1048576.0);
    else
        LOG_INFO("2 MiB folios: %.1f MiB re-read; %.1f MiB mapped in 2 MiB pages",
                 (double)rep->file_bytes / 1048576.0, (double)rep->pmd_bytes / 1048576.0);
    return release_after(m, rep);
}
