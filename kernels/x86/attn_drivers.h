/*
 * attn_drivers.h — the ISA-independent half of the x86 attention kernels (contract: kern.h,
 * kern_attn_fn), included by avx2_attn.c and avx512_attn.c after they define, for their ISA:
 *   tile_f32()   one tile of f32 keys/values against nq queries (online softmax),
 *   ATTN_BUF     floats of one widened K (or V) sub-tile on the stack.
 * What is left here walks the keys in tiles and, for f16/bf16 caches, widens each sub-tile to
 * f32 once for all queries (skipping rows no query sees, so a causal prefill widens each row
 * only as far as the latest query reaches, and a sliding window only from the earliest start
 * on); the includer's exported kernels call it with its
 * own widening functions. An includer with its own widening driver defines ATTN_NO_WIDENED
 * (avx512_attn.c widens K inside its transpose) and shares attn_rows_seen.
 */
#ifndef CLOCHER_KERNELS_X86_ATTN_DRIVERS_H
#define CLOCHER_KERNELS_X86_ATTN_DRIVERS_H

/* f32 keys and values: rows are whole floats apart (kern.h), fed to the tile as they are.
 * lo/vis as kern_attn_fn: tile positions [lo[r], vis[r]) of row r (NULL: 0, n). */
static void attn_tiles_f32(const float *const *q, float *const *o, float *m, float *l,
                           const uint32_t *lo, const uint32_t *vis, size_t nq, const void *k,
                           const void *v, size_t ld, size_t n, size_t hd, float scale)
{
    const size_t ldf = ld / sizeof(float);
    for (size_t j0 = 0; j0 < n; j0 += KERN_ATTN_TILE) {
        const size_t nt = n - j0 < KERN_ATTN_TILE ? n - j0 : KERN_ATTN_TILE;
        tile_f32(q, o, m, l, lo, vis, j0, nq, (const float *)k + j0 * ldf,
                 (const float *)v + j0 * ldf, ldf, nt, hd, scale);
    }
}

/* n rows of hd 16-bit elements (row j at src + j*ld bytes) -> dst [n][hd] f32 */
typedef void attn_widen_fn(float *dst, const void *src, size_t ld, size_t n, size_t hd);

/* Rows [*from, *need) of the sub-tile [j0, j0+nt) are the ones some row sees: below `need`
 * for causal limits, from `from` on for sliding-window starts. 0: no row sees any of them. */
static inline int attn_rows_seen(const uint32_t *lo, const uint32_t *vis, size_t nq, size_t j0,
                                 size_t nt, size_t *from, size_t *need)
{
    *need = 0, *from = nt;
    for (size_t r = 0; r < nq; r++) {
        size_t b = vis ? (vis[r] > j0 ? vis[r] - j0 : 0) : nt;
        const size_t a = lo && lo[r] > j0 ? lo[r] - j0 : 0;
        if (b > nt)
            b = nt;
        if (a >= b)
            continue;
        if (b > *need)
            *need = b;
        if (a < *from)
            *from = a;
    }
    return *need > 0;
}

#ifndef ATTN_NO_WIDENED
static void attn_widened(attn_widen_fn *widen, const float *const *q, float *const *o,
                         float *m, float *l, const uint32_t *lo, const uint32_t *vis, size_t nq,
                         const void *k, const void *v, size_t ld, size_t n, size_t hd,
                         float scale)
{
    float kb[ATTN_BUF] __attribute__((aligned(64))); /* [rows][hd] widened K sub-tile */
    float vb[ATTN_BUF] __attribute__((aligned(64))); /* [rows][hd] widened V sub-tile */
    size_t rows = ATTN_BUF / hd;
    if (rows > KERN_ATTN_TILE)
        rows = KERN_ATTN_TILE;
    for (size_t j0 = 0; j0 < n; j0 += rows) {
        const size_t nt = n - j0 < rows ? n - j0 : rows;
        /* only rows [from, need) some query sees: below `need` for causal limits, from
         * `from` on for sliding-window starts (rows below it are left unwidened in kb/vb,
         * and tile_f32 never reads them) */
        size_t need, from;
        if (!attn_rows_seen(lo, vis, nq, j0, nt, &from, &need))
            continue;
        widen(kb + from * hd, (const char *)k + (j0 + from) * ld, ld, need - from, hd);
        widen(vb + from * hd, (const char *)v + (j0 + from) * ld, ld, need - from, hd);
        tile_f32(q, o, m, l, lo, vis, j0, nq, kb, vb, hd, need, hd, scale);
    }
}
#endif

#endif
