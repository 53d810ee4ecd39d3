/*
 * bsr.h — block-sparse (BSR) f32 weight matrices: the file format (docs/BSR.md), its validating
 * loader and writer, the dense -> BSR converter behind `clocher sparsify`, and the GEMV.
 *
 * A BSR matrix is held as its file image (one 64-byte-aligned allocation): a 64-byte header,
 * the block-row pointers, the block columns and the blocks. Loading validates everything a
 * kernel would trust — header fields, row pointers, block columns, the zero padding of edge
 * blocks, the exact file length — and rejects the file with one message naming the file and
 * the field (log_last_error()). After bsr_open*() returns 0, `k` is safe to hand to
 * kern_bsr_gemv: every index is in range and every padding element is +0.0f, so there is one
 * encoding per matrix (the converter's).
 *
 * NOTES: a struct bsr is immutable after creation and may be shared by threads.
 */
#ifndef CLOCHER_WORKER_BSR_H
#define CLOCHER_WORKER_BSR_H

#include "kern.h"

#include <stddef.h>
#include <stdint.h>

#define BSR_MAGIC "CLOCHBSR" /* 8 bytes, no NUL */
#define BSR_VERSION 1
#define BSR_DTYPE_F32 0
#define BSR_HEADER_SIZE 64
#define BSR_ALIGN 64                       /* the blocks start on a multiple of this */
#define BSR_MAX_DIM (UINT64_C(1) << 31)    /* rows, cols <= this */
#define BSR_MAX_BLOCK 1024u                /* br, bc <= this */

struct bsr {
    struct kern_bsr k; /* the view the kernels take; points into image */
    uint64_t nbr, nbc; /* block rows ceil(rows/br), block columns ceil(cols/bc) */
    uint64_t nnzb;     /* stored blocks */
    void *image;       /* the file image, 64-byte aligned, owned */
    size_t image_size; /* bytes */
};

/*
 * Reads and validates the BSR file at `path`. 0 and *out, or a negative code (logged once,
 * naming the file and field): -errno (open/read), ERR_TRUNCATED (shorter than its header or
 * than the sizes it states), ERR_FORMAT (magic, reserved bytes, row pointers that do not start
 * at 0 or decrease, block columns unsorted or duplicated in a block row, nonzero alignment or
 * block padding), ERR_UNSUPPORTED (version, dtype), ERR_RANGE (a dimension or block size out of
 * range, a block column past the matrix, more blocks than fit), ERR_OVERFLOW (sizes that
 * overflow), ERR_MISMATCH (the last row pointer is not the block count, trailing bytes).
 */
int bsr_open(const char *path, struct bsr **out);

/* bsr_open on `len` bytes in memory (copied); `label` names them in messages. */
int bsr_open_mem(const char *label, const void *data, size_t len, struct bsr **out);

/* Frees a matrix from bsr_open* or bsr_from_dense. NULL is a no-op. */
void bsr_close(struct bsr *m);

/*
 * Converts a dense row-major [rows][cols] f32 matrix w (row stride ld >= cols elements) to BSR
 * with br x bc blocks. A block is dropped when all its elements are zero (±0.0) or when every
 * element has |w| < threshold (threshold 0: only zero blocks; NaN elements keep a block).
 * 0 and *out; ERR_RANGE for dimensions/blocks out of range or a negative/NaN threshold,
 * ERR_OVERFLOW, -ENOMEM.
 */
int bsr_from_dense(const float *w, uint64_t rows, uint64_t cols, size_t ld, uint32_t br,
                   uint32_t bc, float threshold, struct bsr **out);

/* Writes the dense [rows][cols] form of m into out (row stride cols). Dropped blocks are +0. */
void bsr_to_dense(const struct bsr *m, float *out);

/*
 * Writes m's image to `path` atomically: a temporary beside it, fsync, rename. 0 or -errno
 * (logged); on failure nothing is left at path's temporary and a previous file is intact.
 */
int bsr_write(const struct bsr *m, const char *path);

/* y = W x over all rows: x [cols], y [rows]. Dispatches on kern_isa() (kern_bsr_gemv). */
void bsr_gemv(const struct bsr *m, const float *x, float *y);

#endif
