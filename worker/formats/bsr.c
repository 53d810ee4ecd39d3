/*
 * bsr.c — block-sparse (BSR) f32 matrices: file image layout, validating loader, atomic
 * writer, dense -> BSR converter and GEMV (contracts in bsr.h, bytes in docs/BSR.md).
 *
 * The in-memory form IS the file image, so the converter's output is written byte for byte and
 * the loader validates exactly what the kernels will read; nothing is re-laid-out. Every value
 * taken from a file is checked before it is used as a size, an offset or an index: first the
 * header (ranges, then the sizes it implies against the real length), then the row pointers,
 * then each block column, then the padding.
 */
#include "bsr.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bsr.c reads and writes its little-endian format in place"
#endif

/* The on-disk header (docs/BSR.md); little-endian, read and written with memcpy. */
struct bsr_header {
    char magic[8];        /* BSR_MAGIC */
    uint32_t version;     /* BSR_VERSION */
    uint32_t dtype;       /* BSR_DTYPE_F32 */
    uint64_t rows, cols;  /* 1..BSR_MAX_DIM */
    uint32_t br, bc;      /* 1..BSR_MAX_BLOCK */
    uint64_t nnzb;        /* stored blocks, <= nbr * nbc and <= UINT32_MAX */
    uint64_t reserved[2]; /* 0 */
};
_Static_assert(sizeof(struct bsr_header) == BSR_HEADER_SIZE, "BSR header is 64 bytes");
_Static_assert(offsetof(struct bsr_header, rows) == 16, "rows at 16");
_Static_assert(offsetof(struct bsr_header, br) == 32, "br at 32");
_Static_assert(offsetof(struct bsr_header, nnzb) == 40, "nnzb at 40");

/* Offsets of the image's arrays: row_ptr at BSR_HEADER_SIZE, col_idx, blocks (aligned). */
struct layout {
    uint64_t col_off, pad_off, blk_off, total;
};

static int compute_layout(const char *label, uint64_t nbr, uint64_t nnzb, uint64_t br,
                          uint64_t bc, struct layout *l)
{
    uint64_t blk_bytes;
    l->col_off = BSR_HEADER_SIZE + 4 * (nbr + 1); /* nbr <= 2^31: no overflow */
    l->pad_off = l->col_off + 4 * nnzb;           /* nnzb <= 2^32 */
    l->blk_off = (l->pad_off + BSR_ALIGN - 1) / BSR_ALIGN * BSR_ALIGN;
    if (__builtin_mul_overflow(nnzb, br * bc * sizeof(float), &blk_bytes) ||
        __builtin_add_overflow(l->blk_off, blk_bytes, &l->total) || l->total > SIZE_MAX) {
        LOG_ERR("bsr %s: nnzb %llu blocks of %llux%llu f32 overflow the address space", label,
                (unsigned long long)nnzb, (unsigned long long)br, (unsigned long long)bc);
        return ERR_OVERFLOW;
    }
    return 0;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* Range checks shared by the loader and the converter. */
static int check_shape(const char *label, uint64_t rows, uint64_t cols, uint64_t br, uint64_t bc)
{
    if (rows == 0 || rows > BSR_MAX_DIM) {
        LOG_ERR("bsr %s: rows = %llu out of range 1..%llu", label, (unsigned long long)rows,
                (unsigned long long)BSR_MAX_DIM);
        return ERR_RANGE;
    }
    if (cols == 0 || cols > BSR_MAX_DIM) {
        LOG_ERR("bsr %s: cols = %llu out of range 1..%llu", label, (unsigned long long)cols,
                (unsigned long long)BSR_MAX_DIM);
        return ERR_RANGE;
    }
    if (br == 0 || br > BSR_MAX_BLOCK) {
        LOG_ERR("bsr %s: br (block rows) = %llu out of range 1..%u", label,
                (unsigned long long)br, BSR_MAX_BLOCK);
        return ERR_RANGE;
    }
    if (bc == 0 || bc > BSR_MAX_BLOCK) {
        LOG_ERR("bsr %s: bc (block columns) = %llu out of range 1..%u", label,
                (unsigned long long)bc, BSR_MAX_BLOCK);
        return ERR_RANGE;
    }
    return 0;
}

static void set_view(struct bsr *m, const struct bsr_header *h, const struct layout *l)
{
    const char *base = m->image;
    m->nbr = ceil_div(h->rows, h->br);
    m->nbc = ceil_div(h->cols, h->bc);
    m->nnzb = h->nnzb;
    m->k = (struct kern_bsr){
        .rows = (size_t)h->rows,
        .cols = (size_t)h->cols,
        .br = h->br,
        .bc = h->bc,
        .row_ptr = (const uint32_t *)(const void *)(base + BSR_HEADER_SIZE),
        .col_idx = (const uint32_t *)(const void *)(base + l->col_off),
        .blocks = (const float *)(const void *)(base + l->blk_off),
    };
}

/* Is every element of block k outside the matrix +0.0f? Reports the first one that is not. */
static int check_block_padding(const char *label, const struct bsr *m, uint64_t k, uint64_t b)
{
    const struct kern_bsr *v = &m->k;
    const uint64_t c = v->col_idx[k];
    const uint64_t nr = v->rows - b * v->br < v->br ? v->rows - b * v->br : v->br;
    const uint64_t nc = v->cols - c * v->bc < v->bc ? v->cols - c * v->bc : v->bc;
    if (nr == v->br && nc == v->bc)
        return 0;
    const uint32_t *e = (const uint32_t *)(const void *)(v->blocks + k * v->br * v->bc);
    for (uint64_t i = 0; i < v->br; i++)
        for (uint64_t j = i < nr ? nc : 0; j < v->bc; j++)
            if (e[i * v->bc + j] != 0) {
                LOG_ERR("bsr %s: block %llu (block row %llu, block column %llu): element "
                        "[%llu][%llu] lies outside the %llux%llu matrix and is not +0.0 "
                        "(edge-block padding must be zero)",
                        label, (unsigned long long)k, (unsigned long long)b,
                        (unsigned long long)c, (unsigned long long)i, (unsigned long long)j,
                        (unsigned long long)v->rows, (unsigned long long)v->cols);
                return ERR_FORMAT;
            }
    return 0;
}

/* Validates the image m->image (m->image_size bytes) and sets the view. Takes nothing. */
static int validate(const char *label, struct bsr *m)
{
    const size_t len = m->image_size;
    const unsigned char *p = m->image;
    struct bsr_header h;
    if (len < BSR_HEADER_SIZE) {
        LOG_ERR("bsr %s: %zu bytes, shorter than the %d-byte header", label, len,
                BSR_HEADER_SIZE);
        return ERR_TRUNCATED;
    }
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, BSR_MAGIC, 8) != 0) {
        LOG_ERR("bsr %s: bad magic (not a BSR file: expected \"%s\")", label, BSR_MAGIC);
        return ERR_FORMAT;
    }
    if (h.version != BSR_VERSION) {
        LOG_ERR("bsr %s: version %u unsupported (this reader knows %d)", label, h.version,
                BSR_VERSION);
        return ERR_UNSUPPORTED;
    }
    if (h.dtype != BSR_DTYPE_F32) {
        LOG_ERR("bsr %s: dtype %u unsupported (only 0 = f32)", label, h.dtype);
        return ERR_UNSUPPORTED;
    }
    if (h.reserved[0] || h.reserved[1]) {
        LOG_ERR("bsr %s: reserved header bytes 48..63 are not zero", label);
        return ERR_FORMAT;
    }
    int rc = check_shape(label, h.rows, h.cols, h.br, h.bc);
    if (rc)
        return rc;
    const uint64_t nbr = ceil_div(h.rows, h.br), nbc = ceil_div(h.cols, h.bc);
    if (h.nnzb > nbr * nbc || h.nnzb > UINT32_MAX) { /* nbr, nbc <= 2^31: no overflow */
        LOG_ERR("bsr %s: nnzb = %llu exceeds the %llu x %llu block grid (or 2^32-1)", label,
                (unsigned long long)h.nnzb, (unsigned long long)nbr, (unsigned long long)nbc);
        return ERR_RANGE;
    }
    struct layout l;
    if ((rc = compute_layout(label, nbr, h.nnzb, h.br, h.bc, &l)))
        return rc;
    if (len < l.total) {
        LOG_ERR("bsr %s: truncated: %zu bytes, the header's sizes need %llu", label, len,
                (unsigned long long)l.total);
        return ERR_TRUNCATED;
    }
    if (len > l.total) {
        LOG_ERR("bsr %s: %zu bytes, %llu more than the header's sizes (trailing bytes)", label,
                len, (unsigned long long)(len - l.total));
        return ERR_MISMATCH;
    }
    set_view(m, &h, &l);
    const uint32_t *rp = m->k.row_ptr, *ci = m->k.col_idx;
    if (rp[0] != 0) {
        LOG_ERR("bsr %s: row_ptr[0] = %u, must be 0", label, rp[0]);
        return ERR_FORMAT;
    }
    for (uint64_t b = 0; b < nbr; b++)
        if (rp[b + 1] < rp[b]) {
            LOG_ERR("bsr %s: row_ptr[%llu] = %u < row_ptr[%llu] = %u (row pointers must not "
                    "decrease)",
                    label, (unsigned long long)(b + 1), rp[b + 1], (unsigned long long)b, rp[b]);
            return ERR_FORMAT;
        }
    if (rp[nbr] != h.nnzb) {
        LOG_ERR("bsr %s: row_ptr[%llu] = %u, must equal nnzb = %llu", label,
                (unsigned long long)nbr, rp[nbr], (unsigned long long)h.nnzb);
        return ERR_MISMATCH;
    }
    for (uint64_t b = 0; b < nbr; b++)
        for (uint64_t k = rp[b]; k < rp[b + 1]; k++) {
            if (ci[k] >= nbc) {
                LOG_ERR("bsr %s: col_idx[%llu] = %u (block row %llu) out of range: %llu block "
                        "columns",
                        label, (unsigned long long)k, ci[k], (unsigned long long)b,
                        (unsigned long long)nbc);
                return ERR_RANGE;
            }
            if (k > rp[b] && ci[k] <= ci[k - 1]) {
                LOG_ERR("bsr %s: col_idx[%llu] = %u after %u in block row %llu: block columns "
                        "must be strictly increasing (unsorted or duplicate)",
                        label, (unsigned long long)k, ci[k], ci[k - 1], (unsigned long long)b);
                return ERR_FORMAT;
            }
        }
    /* indices first, so a misplaced block is reported as its index rather than its padding */
    for (uint64_t b = 0; b < nbr; b++)
        for (uint64_t k = rp[b]; k < rp[b + 1]; k++)
            if ((rc = check_block_padding(label, m, k, b)))
                return rc;
    for (uint64_t o = l.pad_off; o < l.blk_off; o++)
        if (p[o]) {
            LOG_ERR("bsr %s: alignment padding byte at offset %llu is not zero", label,
                    (unsigned long long)o);
            return ERR_FORMAT;
        }
    return 0;
}

/* An aligned buffer of n bytes (at least one), or NULL (logged). */
static void *alloc_image(const char *label, size_t n)
{
    size_t sz = (n + BSR_ALIGN - 1) / BSR_ALIGN * BSR_ALIGN;
    void *p = aligned_alloc(BSR_ALIGN, sz ? sz : BSR_ALIGN);
    if (!p)
        LOG_ERR("bsr %s: cannot allocate %zu bytes", label, n);
    return p;
}

/* Takes ownership of image (n bytes): validates it into a new struct bsr. */
static int adopt(const char *label, void *image, size_t n, struct bsr **out)
{
    struct bsr *m = calloc(1, sizeof *m);
    if (!m) {
        LOG_ERR("bsr %s: out of memory", label);
        free(image);
        return -ENOMEM;
    }
    m->image = image;
    m->image_size = n;
    int rc = validate(label, m);
    if (rc) {
        bsr_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

int bsr_open_mem(const char *label, const void *data, size_t len, struct bsr **out)
{
    *out = NULL;
    void *img = alloc_image(label, len);
    if (!img)
        return -ENOMEM;
    if (len)
        memcpy(img, data, len);
    return adopt(label, img, len, out);
}

int bsr_open(const char *path, struct bsr **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        LOG_ERR("open(%s) failed: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        LOG_ERR("fstat(%s) failed: %s", path, strerror(e));
        close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > SIZE_MAX) {
        LOG_ERR("bsr %s: not a regular file", path);
        close(fd);
        return ERR_FORMAT;
    }
    size_t len = (size_t)st.st_size, got = 0;
    void *img = alloc_image(path, len);
    if (!img) {
        close(fd);
        return -ENOMEM;
    }
    while (got < len) {
        ssize_t r = read(fd, (char *)img + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            if (r < 0)
                LOG_ERR("read(%s) failed: %s", path, strerror(e));
            else
                LOG_ERR("bsr %s: file shrank while being read", path);
            free(img);
            close(fd);
            return r < 0 ? -e : ERR_TRUNCATED;
        }
        got += (size_t)r;
    }
    close(fd);
    return adopt(path, img, len, out);
}

void bsr_close(struct bsr *m)
{
    if (!m)
        return;
    free(m->image);
    free(m);
}

/* Does block (b, c) of the dense matrix survive the conversion? (see bsr_from_dense) */
static int keep_block(const float *w, size_t ld, uint64_t rows, uint64_t cols, uint64_t br,
                      uint64_t bc, uint64_t b, uint64_t c, float threshold)
{
    const uint64_t r1 = (b + 1) * br < rows ? (b + 1) * br : rows;
    const uint64_t c1 = (c + 1) * bc < cols ? (c + 1) * bc : cols;
    for (uint64_t r = b * br; r < r1; r++)
        for (uint64_t j = c * bc; j < c1; j++) {
            const float v = w[r * ld + j];
            if (v != 0.0f && !(fabsf(v) < threshold))
                return 1;
        }
    return 0;
}

int bsr_from_dense(const float *w, uint64_t rows, uint64_t cols, size_t ld, uint32_t br,
                   uint32_t bc, float threshold, struct bsr **out)
{
    static const char label[] = "<dense>";
    *out = NULL;
    int rc = check_shape(label, rows, cols, br, bc);
    if (rc)
        return rc;
    if (ld < cols) {
        LOG_ERR("bsr_from_dense: row stride %zu < cols %llu", ld, (unsigned long long)cols);
        return ERR_RANGE;
    }
    if (!(threshold >= 0.0f)) {
        LOG_ERR("bsr_from_dense: threshold %g must be >= 0", (double)threshold);
        return ERR_RANGE;
    }
    const uint64_t nbr = ceil_div(rows, br), nbc = ceil_div(cols, bc);
    uint64_t nnzb = 0;
    for (uint64_t b = 0; b < nbr; b++)
        for (uint64_t c = 0; c < nbc; c++)
            nnzb += (uint64_t)keep_block(w, ld, rows, cols, br, bc, b, c, threshold);
    if (nnzb > UINT32_MAX) {
        LOG_ERR("bsr_from_dense: %llu nonzero blocks exceed the format's 2^32-1",
                (unsigned long long)nnzb);
        return ERR_RANGE;
    }
    struct layout l;
    if ((rc = compute_layout(label, nbr, nnzb, br, bc, &l)))
        return rc;
    unsigned char *img = alloc_image(label, (size_t)l.total);
    if (!img)
        return -ENOMEM;
    memset(img, 0, (size_t)l.total); /* padding of every kind is zero */
    struct bsr_header h = {.version = BSR_VERSION, .dtype = BSR_DTYPE_F32, .rows = rows,
                           .cols = cols, .br = br, .bc = bc, .nnzb = nnzb};
    memcpy(h.magic, BSR_MAGIC, 8);
    memcpy(img, &h, sizeof h);
    uint32_t *rp = (uint32_t *)(void *)(img + BSR_HEADER_SIZE);
    uint32_t *ci = (uint32_t *)(void *)(img + l.col_off);
    float *blk = (float *)(void *)(img + l.blk_off);
    uint32_t k = 0;
    for (uint64_t b = 0; b < nbr; b++) {
        rp[b] = k;
        for (uint64_t c = 0; c < nbc; c++) {
            if (!keep_block(w, ld, rows, cols, br, bc, b, c, threshold))
                continue;
            ci[k] = (uint32_t)c;
            float *d = blk + (size_t)k * br * bc;
            for (uint64_t i = 0; i < br && b * br + i < rows; i++)
                for (uint64_t j = 0; j < bc && c * bc + j < cols; j++)
                    d[i * bc + j] = w[(b * br + i) * ld + c * bc + j];
            k++;
        }
    }
    rp[nbr] = k;
    return adopt(label, img, (size_t)l.total, out);
}

void bsr_to_dense(const struct bsr *m, float *out)
{
    const struct kern_bsr *v = &m->k;
    memset(out, 0, v->rows * v->cols * sizeof(float));
    for (uint64_t b = 0; b < m->nbr; b++)
        for (uint64_t k = v->row_ptr[b]; k < v->row_ptr[b + 1]; k++) {
            const uint64_t c0 = (uint64_t)v->col_idx[k] * v->bc;
            const float *d = v->blocks + k * v->br * v->bc;
            for (uint64_t i = 0; i < v->br && b * v->br + i < v->rows; i++)
                for (uint64_t j = 0; j < v->bc && c0 + j < v->cols; j++)
                    out[(b * v->br + i) * v->cols + c0 + j] = d[i * v->bc + j];
        }
}

int bsr_write(const struct bsr *m, const char *path)
{
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) {
        LOG_ERR("bsr %s: out of memory", path);
        return -ENOMEM;
    }
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        LOG_ERR("open(%s) failed: %s", tmp, strerror(-rc));
        free(tmp);
        return rc;
    }
    const char *p = m->image;
    size_t done = 0;
    while (done < m->image_size) {
        ssize_t w = write(fd, p + done, m->image_size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            rc = -errno;
            LOG_ERR("write(%s) failed: %s", tmp, strerror(-rc));
            goto fail;
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0) {
        rc = -errno;
        LOG_ERR("fsync(%s) failed: %s", tmp, strerror(-rc));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = -errno;
        LOG_ERR("close(%s) failed: %s", tmp, strerror(-rc));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = -errno;
        LOG_ERR("rename(%s, %s) failed: %s", tmp, path, strerror(-rc));
        goto fail;
    }
    free(tmp);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(tmp);
    return rc;
}

void bsr_gemv(const struct bsr *m, const float *x, float *y)
{
    kern_bsr_gemv(&m->k, x, y, 0, (size_t)m->nbr);
}
