/*
 * kv_snapshot.c — persistence of the hottest cached prefix blocks across restarts.
 *
 * File (little-endian; docs/KV.md has the full description):
 *   header, 64 bytes, uncompressed so a mismatch is seen before decompressing anything:
 *     0 "CLKVSNAP" | 8 u32 version (1) | 12 u32 header bytes (64) | 16 u64 model fingerprint
 *     24 u32 dtype (+0x100: 8-bit, unrotated) | 28 u32 block_tokens | 32 u32 n_layers
 *     36 u32 n_kv_heads | 40 u32 head_dim | 44 u32 n_records | 48 u64 record bytes | 56 u64 checksum of bytes 0..55
 *   then one zstd frame (content checksum on) of n_records records, parents before children:
 *     0 u64 tenant | 8 u64 adapter set | 16 u32 depth | 20 u32 parent record (UINT32_MAX at
 *     depth 0) | 24 u64 checksum of the rest of the record, seeded by bytes 0..23
 *     32 i32 tokens[B] | 32+4B K/V bytes [n_layers][2][B][n_kv_heads*head_dim] of the dtype
 *   and nothing after the frame.
 *
 * Nothing read is trusted: every field is checked, chain hashes are recomputed from the token
 * ids (the file stores none), each record's checksum is verified before its bytes are used,
 * and any failure drops everything restored so far. A snapshot is a cache: failures are
 * warnings, the server starts cold.
 *
 * NOTES: owner thread only (kv.h). Save reads the pool; restore fills an empty one.
 */
#include "kv_internal.h"

#include "afile.h"
#include "check.h"
#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define SNAP_ZSTD_LEVEL 1 /* K/V values compress little; favour speed */

static void put32(uint8_t *b, uint32_t v) { memcpy(b, &v, 4); }
static void put64(uint8_t *b, uint64_t v) { memcpy(b, &v, 8); }
static uint32_t get32(const uint8_t *b)
{
    uint32_t v;
    memcpy(&v, b, 4);
    return v;
}
static uint64_t get64(const uint8_t *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return v;
}

static size_t record_bytes(const struct kv_pool *p)
{
    return KV__SNAP_REC_HEAD + (size_t)p->B * sizeof(int32_t) + p->data_bytes;
}

static uint64_t record_checksum(const uint8_t *rec, size_t n)
{
    uint64_t seed = kv__hash64(rec, 24, KV__SNAP_SEED_RECORD);
    return kv__hash64(rec + KV__SNAP_REC_HEAD, n - KV__SNAP_REC_HEAD, seed);
}

/* ---- save ---------------------------------------------------------------------------------- */

struct pick {
    uint32_t id, depth;
    uint64_t last_use;
};

static int by_heat(const void *a, const void *b)
{
    const struct pick *x = a, *y = b;
    return x->last_use < y->last_use ? 1 : x->last_use > y->last_use ? -1 : 0;
}

/* Parents first; among equals the hotter first, so a truncated restore keeps the best. */
static int by_depth_heat(const void *a, const void *b)
{
    const struct pick *x = a, *y = b;
    if (x->depth != y->depth)
        return x->depth < y->depth ? -1 : 1;
    return by_heat(a, b);
}

/* The parent link of indexed block id still names the block it was made with. */
static bool parent_live(const struct kv_pool *p, uint32_t id)
{
    const struct kv_block *b = &p->blocks[id];
    if (b->parent == KV_NONE)
        return true;
    const struct kv_block *pb = &p->blocks[b->parent];
    return pb->indexed && pb->gen == b->parent_gen;
}

/*
 * Fills sel[0..*n_sel) with the hottest indexed blocks, at most max, each together with all
 * of its ancestors; then orders them parents first.
 */
static int select_blocks(const struct kv_pool *p, uint32_t max, struct pick *sel,
                         uint32_t *n_sel)
{
    uint32_t n_cand = 0, n = 0;
    struct pick *cand = malloc(((size_t)p->n_indexed + 1) * sizeof *cand);
    uint32_t *chain = malloc(((size_t)p->n_indexed + 1) * sizeof *chain);
    uint8_t *taken = calloc(p->n_blocks, 1);
    if (!cand || !chain || !taken) {
        free(cand);
        free(chain);
        free(taken);
        LOG_ERR("kv snapshot: out of memory selecting %u blocks", p->n_indexed);
        return -ENOMEM;
    }
    for (uint32_t id = 0; id < p->n_blocks; id++)
        if (p->blocks[id].indexed)
            cand[n_cand++] = (struct pick){id, p->blocks[id].depth, p->blocks[id].last_use};
    qsort(cand, n_cand, sizeof *cand, by_heat);
    for (uint32_t c = 0; c < n_cand && n < max; c++) {
        uint32_t len = 0, x = cand[c].id;
        bool ok = true;
        while (x != KV_NONE && !taken[x]) {
            if (!parent_live(p, x)) {
                ok = false; /* an orphan: its prefix is gone, nothing could find it */
                break;
            }
            chain[len++] = x;
            x = p->blocks[x].parent;
        }
        if (!ok || len > max - n)
            continue;
        for (uint32_t i = 0; i < len; i++) {
            const struct kv_block *b = &p->blocks[chain[i]];
            taken[chain[i]] = 1;
            sel[n++] = (struct pick){chain[i], b->depth, b->last_use};
        }
    }
    qsort(sel, n, sizeof *sel, by_depth_heat);
    free(cand);
    free(chain);
    free(taken);
    *n_sel = n;
    return 0;
}

/* Feeds n bytes (or finishes the frame when end) through the compressor into the file. */
static int zwrite(ZSTD_CCtx *cc, struct afile *af, const void *src, size_t n, bool end,
                  uint8_t *obuf, size_t ocap, const char *path)
{
    ZSTD_inBuffer in = {src, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {obuf, ocap, 0};
        size_t r = ZSTD_compressStream2(cc, &out, &in, end ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(r)) {
            LOG_ERR("kv snapshot %s: zstd compression failed: %s", path, ZSTD_getErrorName(r));
            return ERR_STATE;
        }
        if (out.pos > 0) {
            int rc = afile_write(af, obuf, out.pos);
            if (rc)
                return rc;
        }
        if (end ? r == 0 : in.pos == in.size)
            return 0;
    }
}

int kv_snapshot_save(const struct kv_pool *p, const char *path, uint64_t model_fingerprint,
                     uint32_t max_blocks, uint32_t *n_saved)
{
    *n_saved = 0;
    size_t rb = record_bytes(p);
    struct pick *sel = malloc(((size_t)p->n_indexed + 1) * sizeof *sel);
    uint32_t *rec_of = malloc((size_t)p->n_blocks * sizeof *rec_of);
    uint8_t *rec = malloc(rb);
    size_t ocap = ZSTD_CStreamOutSize();
    uint8_t *obuf = malloc(ocap);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    struct afile af = {.fd = -1};
    bool opened = false;
    uint32_t n = 0;
    int rc = 0;
    if (!sel || !rec_of || !rec || !obuf || !cc) {
        rc = -ENOMEM;
        LOG_ERR("kv snapshot %s: out of memory", path);
        goto out;
    }
    if ((rc = select_blocks(p, max_blocks, sel, &n)) != 0)
        goto out;

    uint8_t h[KV__SNAP_HEADER_BYTES] = {0};
    memcpy(h, KV__SNAP_MAGIC, 8);
    put32(h + 8, KV__SNAP_VERSION);
    put32(h + 12, KV__SNAP_HEADER_BYTES);
    put64(h + 16, model_fingerprint);
    put32(h + 24, kv__snap_dtype(p));
    put32(h + 28, p->B);
    put32(h + 32, p->cfg.n_layers);
    put32(h + 36, p->cfg.n_kv_heads);
    put32(h + 40, p->cfg.head_dim);
    put32(h + 44, n);
    put64(h + 48, rb);
    put64(h + 56, kv__hash64(h, 56, KV__SNAP_SEED_HEADER));

    size_t zr;
    if (ZSTD_isError(zr = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, SNAP_ZSTD_LEVEL)) ||
        ZSTD_isError(zr = ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1)) ||
        ZSTD_isError(zr = ZSTD_CCtx_setPledgedSrcSize(cc, (unsigned long long)n * rb))) {
        LOG_ERR("kv snapshot %s: zstd setup failed: %s", path, ZSTD_getErrorName(zr));
        rc = ERR_STATE;
        goto out;
    }
    if ((rc = afile_open(&af, path)) != 0)
        goto out;
    opened = true;
    if ((rc = afile_write(&af, h, sizeof h)) != 0)
        goto out;
    for (uint32_t i = 0; i < n; i++) {
        const struct kv_block *b = &p->blocks[sel[i].id];
        rec_of[sel[i].id] = i;
        put64(rec, b->tenant);
        put64(rec + 8, b->adapter);
        put32(rec + 16, b->depth);
        /* select_blocks put every parent earlier, so rec_of[parent] is set */
        put32(rec + 20, b->parent == KV_NONE ? UINT32_MAX : rec_of[b->parent]);
        memcpy(rec + KV__SNAP_REC_HEAD, kv__block_tokens(p, sel[i].id), (size_t)p->B * 4);
        memcpy(rec + KV__SNAP_REC_HEAD + (size_t)p->B * 4, kv__block_data(p, sel[i].id),
               p->data_bytes);
        put64(rec + 24, record_checksum(rec, rb));
        if ((rc = zwrite(cc, &af, rec, rb, false, obuf, ocap, path)) != 0)
            goto out;
    }
    if ((rc = zwrite(cc, &af, NULL, 0, true, obuf, ocap, path)) != 0)
        goto out;
    rc = afile_commit(&af);
    opened = false; /* commit cleans up after itself, success or not */
    if (rc == 0) {
        *n_saved = n;
        LOG_INFO("kv snapshot %s: saved %u blocks", path, n);
    }
out:
    if (opened)
        afile_abort(&af);
    ZSTD_freeCCtx(cc);
    free(obuf);
    free(rec);
    free(rec_of);
    free(sel);
    return rc;
}

/* ---- restore -------------------------------------------------------------------------------- */

/* Where the bytes come from: a file or memory. */
struct src {
    const char *name;
    FILE *f;
    const uint8_t *mem;
    size_t mem_len, mem_pos;
};

/* Up to cap bytes; *got = 0 at the end. */
static int src_read(struct src *s, void *dst, size_t cap, size_t *got)
{
    if (!s->f) {
        size_t n = s->mem_len - s->mem_pos < cap ? s->mem_len - s->mem_pos : cap;
        if (n)
            memcpy(dst, s->mem + s->mem_pos, n);
        s->mem_pos += n;
        *got = n;
        return 0;
    }
    *got = fread(dst, 1, cap, s->f);
    if (*got == 0 && ferror(s->f)) {
        LOG_WARN("kv snapshot %s ignored: read failed: %s", s->name, strerror(errno));
        return -EIO;
    }
    return 0;
}

struct zreader {
    struct src *src;
    ZSTD_DCtx *dc;
    uint8_t *in;
    size_t in_cap;
    ZSTD_inBuffer ib;
    bool eof;
    size_t last; /* last ZSTD_decompressStream hint: 0 once the frame is complete */
};

static int zr_refill(struct zreader *z)
{
    if (z->ib.pos < z->ib.size || z->eof)
        return 0;
    size_t got;
    int rc = src_read(z->src, z->in, z->in_cap, &got);
    if (rc)
        return rc;
    z->ib = (ZSTD_inBuffer){z->in, got, 0};
    if (got == 0)
        z->eof = true;
    return 0;
}

/* Exactly n decompressed bytes into dst. */
static int zr_read(struct zreader *z, void *dst, size_t n)
{
    ZSTD_outBuffer ob = {dst, n, 0};
    while (ob.pos < n) {
        int rc = zr_refill(z);
        if (rc)
            return rc;
        size_t in0 = z->ib.pos, out0 = ob.pos;
        size_t r = ZSTD_decompressStream(z->dc, &ob, &z->ib);
        if (ZSTD_isError(r)) {
            LOG_WARN("kv snapshot %s ignored: corrupt compressed data: %s", z->src->name,
                     ZSTD_getErrorName(r));
            return ERR_FORMAT;
        }
        z->last = r;
        if (ob.pos < n && (r == 0 || (z->eof && in0 == z->ib.pos && out0 == ob.pos))) {
            LOG_WARN("kv snapshot %s ignored: truncated: the data ends inside a record",
                     z->src->name);
            return ERR_TRUNCATED;
        }
    }
    return 0;
}

/* After the last record: the frame must end (its checksum verified) and nothing follow. */
static int zr_finish(struct zreader *z)
{
    uint8_t extra;
    while (z->last != 0) {
        int rc = zr_refill(z);
        if (rc)
            return rc;
        ZSTD_outBuffer ob = {&extra, 1, 0};
        size_t in0 = z->ib.pos;
        size_t r = ZSTD_decompressStream(z->dc, &ob, &z->ib);
        if (ZSTD_isError(r)) {
            LOG_WARN("kv snapshot %s ignored: corrupt compressed data: %s", z->src->name,
                     ZSTD_getErrorName(r));
            return ERR_FORMAT;
        }
        if (ob.pos > 0) {
            LOG_WARN("kv snapshot %s ignored: more data than its header's record count",
                     z->src->name);
            return ERR_FORMAT;
        }
        z->last = r;
        if (r != 0 && z->eof && in0 == z->ib.pos) {
            LOG_WARN("kv snapshot %s ignored: truncated: the compressed frame is incomplete",
                     z->src->name);
            return ERR_TRUNCATED;
        }
    }
    int rc = zr_refill(z);
    if (rc)
        return rc;
    if (z->ib.pos < z->ib.size) {
        LOG_WARN("kv snapshot %s ignored: trailing bytes after the compressed frame",
                 z->src->name);
        return ERR_FORMAT;
    }
    return 0;
}

static int check_dim(const char *name, const char *field, uint32_t got, uint32_t want)
{
    if (got == want)
        return 0;
    LOG_WARN("kv snapshot %s ignored: %s is %u, this cache uses %u", name, field, got, want);
    return ERR_MISMATCH;
}

static int check_header(const struct kv_pool *p, const uint8_t *h, const char *name,
                        uint64_t fp)
{
    int rc;
    if (memcmp(h, KV__SNAP_MAGIC, 8) != 0) {
        LOG_WARN("kv snapshot %s ignored: bad magic, not a KV snapshot", name);
        return ERR_FORMAT;
    }
    if (get32(h + 8) != KV__SNAP_VERSION) {
        LOG_WARN("kv snapshot %s ignored: version %u, this build reads version %u", name,
                 get32(h + 8), KV__SNAP_VERSION);
        return ERR_UNSUPPORTED;
    }
    if (get64(h + 56) != kv__hash64(h, 56, KV__SNAP_SEED_HEADER)) {
        LOG_WARN("kv snapshot %s ignored: header checksum mismatch (corrupt header)", name);
        return ERR_FORMAT;
    }
    if (get32(h + 12) != KV__SNAP_HEADER_BYTES) {
        LOG_WARN("kv snapshot %s ignored: header size %u, expected %u", name, get32(h + 12),
                 KV__SNAP_HEADER_BYTES);
        return ERR_FORMAT;
    }
    if (get64(h + 16) != fp) {
        LOG_WARN("kv snapshot %s ignored: made for model fingerprint %016llx, this model is "
                 "%016llx",
                 name, (unsigned long long)get64(h + 16), (unsigned long long)fp);
        return ERR_MISMATCH;
    }
    uint32_t dt = get32(h + 24);
    if (dt != kv__snap_dtype(p)) {
        const char *a = dtype_kv_name((enum dtype)(dt & ~KV__SNAP_UNROTATED));
        LOG_WARN("kv snapshot %s ignored: dtype is %s%s, this cache uses %s%s", name,
                 a ? a : "(invalid)", dt & KV__SNAP_UNROTATED ? " (unrotated)" : "",
                 dtype_kv_name(p->cfg.dtype),
                 kv__snap_dtype(p) & KV__SNAP_UNROTATED ? " (unrotated)" : "");
        return ERR_MISMATCH;
    }
    if ((rc = check_dim(name, "block_tokens", get32(h + 28), p->B)) ||
        (rc = check_dim(name, "n_layers", get32(h + 32), p->cfg.n_layers)) ||
        (rc = check_dim(name, "n_kv_heads", get32(h + 36), p->cfg.n_kv_heads)) ||
        (rc = check_dim(name, "head_dim", get32(h + 40), p->cfg.head_dim)))
        return rc;
    if (get64(h + 48) != record_bytes(p)) {
        LOG_WARN("kv snapshot %s ignored: record size %llu, expected %zu", name,
                 (unsigned long long)get64(h + 48), record_bytes(p));
        return ERR_FORMAT;
    }
    return 0;
}

/* One verified record into a free block, indexed and cached. rec_block[0..i) map earlier
 * records to their blocks. */
static int restore_record(struct kv_pool *p, const uint8_t *rec, size_t rb, uint32_t i,
                          const uint32_t *rec_block, const char *name, uint32_t *out_id)
{
    if (get64(rec + 24) != record_checksum(rec, rb)) {
        LOG_WARN("kv snapshot %s ignored: record %u checksum mismatch", name, i);
        return ERR_FORMAT;
    }
    uint64_t tenant = get64(rec), adapter = get64(rec + 8);
    uint32_t depth = get32(rec + 16), parent_rec = get32(rec + 20);
    uint32_t parent = KV_NONE;
    uint64_t ph;
    if (parent_rec == UINT32_MAX) {
        if (depth != 0) {
            LOG_WARN("kv snapshot %s ignored: record %u has depth %u but no parent", name, i,
                     depth);
            return ERR_FORMAT;
        }
        ph = kv__root_hash(p, tenant, adapter);
    } else {
        if (parent_rec >= i) {
            LOG_WARN("kv snapshot %s ignored: record %u names parent record %u, not an earlier "
                     "one",
                     name, i, parent_rec);
            return ERR_FORMAT;
        }
        parent = rec_block[parent_rec];
        const struct kv_block *pb = &p->blocks[parent];
        if (pb->depth + 1 != depth || pb->tenant != tenant || pb->adapter != adapter) {
            LOG_WARN("kv snapshot %s ignored: record %u (depth %u) does not extend its parent "
                     "record %u (depth %u, same tenant and adapter set required)",
                     name, i, depth, parent_rec, pb->depth);
            return ERR_FORMAT;
        }
        ph = pb->hash;
    }
    const uint8_t *tok_bytes = rec + KV__SNAP_REC_HEAD;
    int32_t tokens[KV_BLOCK_TOKENS_MAX];
    memcpy(tokens, tok_bytes, (size_t)p->B * 4);
    uint64_t h = kv__chain_hash(p, ph, tokens);
    uint32_t pgen = parent == KV_NONE ? 0 : p->blocks[parent].gen;
    if (kv__index_find(p, h, tenant, adapter, depth, parent, pgen, tokens) != KV_NONE) {
        LOG_WARN("kv snapshot %s ignored: record %u repeats the key of an earlier record", name,
                 i);
        return ERR_FORMAT;
    }
    uint32_t id = kv__block_take(p);
    CHECK(id != KV_NONE); /* the caller never restores more records than blocks */
    memcpy(kv__block_tokens(p, id), tokens, (size_t)p->B * 4);
    memcpy(kv__block_data(p, id), tok_bytes + (size_t)p->B * 4, p->data_bytes);
    kv__index_insert_cold(p, id, h, tenant, adapter, depth, parent);
    *out_id = id;
    return 0;
}

static int restore(struct kv_pool *p, struct src *src, uint64_t fp, uint32_t *n_restored)
{
    const char *name = src->name;
    uint8_t h[KV__SNAP_HEADER_BYTES];
    size_t have = 0, got;
    int rc;
    *n_restored = 0;
    if (p->n_seqs != 0 || p->n_indexed != 0) {
        LOG_ERR("kv snapshot %s: restore needs an empty pool (%u sequences, %u cached blocks)",
                name, p->n_seqs, p->n_indexed);
        return ERR_STATE;
    }
    if (!p->cfg.prefix_cache) {
        LOG_INFO("kv snapshot %s: not restored, the prefix cache is off", name);
        return 0;
    }
    do {
        if ((rc = src_read(src, h + have, sizeof h - have, &got)) != 0)
            return rc;
        have += got;
    } while (got > 0 && have < sizeof h);
    if (have < sizeof h) {
        LOG_WARN("kv snapshot %s ignored: truncated: %zu bytes, shorter than the %u-byte header",
                 name, have, KV__SNAP_HEADER_BYTES);
        return ERR_TRUNCATED;
    }
    if ((rc = check_header(p, h, name, fp)) != 0)
        return rc;

    uint32_t n_records = get32(h + 44);
    uint32_t n_keep = n_records < p->n_blocks ? n_records : p->n_blocks;
    size_t rb = record_bytes(p);
    struct zreader z = {.src = src, .in_cap = ZSTD_DStreamInSize()};
    z.dc = ZSTD_createDCtx();
    z.in = malloc(z.in_cap);
    z.last = 1;
    uint8_t *rec = malloc(rb);
    uint32_t *rec_block = malloc(((size_t)n_keep + 1) * sizeof *rec_block);
    if (!z.dc || !z.in || !rec || !rec_block) {
        rc = -ENOMEM;
        LOG_WARN("kv snapshot %s ignored: out of memory", name);
        goto out;
    }
    for (uint32_t i = 0; i < n_keep; i++) {
        if ((rc = zr_read(&z, rec, rb)) != 0)
            goto out;
        if ((rc = restore_record(p, rec, rb, i, rec_block, name, &rec_block[i])) != 0)
            goto out;
    }
    if (n_keep == n_records) {
        if ((rc = zr_finish(&z)) != 0)
            goto out;
    } else {
        /* the rest is not read: its checksums guard only what is used */
        LOG_INFO("kv snapshot %s: the pool holds %u blocks, %u of %u records restored", name,
                 p->n_blocks, n_keep, n_records);
    }
    *n_restored = n_keep;
    LOG_INFO("kv snapshot %s: restored %u cached blocks", name, n_keep);
out:
    if (rc != 0)
        kv_pool_drop_cached(p); /* never half-trusted: start cold */
    ZSTD_freeDCtx(z.dc);
    free(z.in);
    free(rec);
    free(rec_block);
    return rc;
}

int kv_snapshot_restore(struct kv_pool *p, const char *path, uint64_t model_fingerprint,
                        uint32_t *n_restored)
{
    *n_restored = 0;
    FILE *f = fopen(path, "rbe");
    if (!f) {
        int e = errno;
        if (e == ENOENT)
            LOG_INFO("kv snapshot %s: none yet, starting cold", path);
        else
            LOG_WARN("kv snapshot %s ignored: cannot open: %s", path, strerror(e));
        return -e;
    }
    struct src s = {.name = path, .f = f};
    int rc = restore(p, &s, model_fingerprint, n_restored);
    fclose(f);
    return rc;
}

int kv_snapshot_restore_mem(struct kv_pool *p, const void *buf, size_t len, const char *name,
                            uint64_t model_fingerprint, uint32_t *n_restored)
{
    struct src s = {.name = name, .mem = buf, .mem_len = len};
    return restore(p, &s, model_fingerprint, n_restored);
}
