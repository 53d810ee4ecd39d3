/*
 * lora_pack.c — an adapter's serving copy and its content digest.
 *
 * The serving copy (lora_weights.fa/.fbt, what the fused update reads) is A as is and B
 * transposed into panels of 32 output columns (lora_bt_index), in f32 or bf16 (lora_repack,
 * docs/LORA.md "Weight packing"), laid out per layer in the order the step reads it
 * (store_place). The digest (lora_adapter.digest) names what an adapter
 * computes, so that KV prefix reuse and snapshots never mix adapters.
 */
#include "lora.h"

#include "check.h"
#include "err.h"
#include "half.h"
#include "log.h"
#include "lora_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/*
 * The content digest: an xxh64-style 4-lane multiply-rotate hash over 64-bit words (not
 * cryptographic: it tells adapters apart, it does not authenticate them; an accidental
 * collision between two of n adapters has probability ~n^2 / 2^65).
 */
#define P1 UINT64_C(0x9e3779b185ebca87)
#define P2 UINT64_C(0xc2b2ae3d27d4eb4f)
#define P3 UINT64_C(0x165667b19e3779f9)

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t lane(uint64_t acc, uint64_t w) { return rotl64(acc + w * P2, 31) * P1; }

struct digest {
    uint64_t v[4];
    uint64_t n; /* words */
};

static void digest_init(struct digest *d)
{
    d->v[0] = P1 + P2, d->v[1] = P2, d->v[2] = 0, d->v[3] = (uint64_t)0 - P1;
    d->n = 0;
}

static void digest_words(struct digest *d, const void *p, size_t bytes)
{
    const unsigned char *b = p;
    for (size_t i = 0; i + 8 <= bytes; i += 8, d->n++) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        d->v[d->n & 3] = lane(d->v[d->n & 3], w);
    }
    if (bytes % 8) {
        uint64_t w = 0;
        memcpy(&w, b + bytes / 8 * 8, bytes % 8);
        d->v[d->n & 3] = lane(d->v[d->n & 3], w);
        d->n++;
    }
}

static uint64_t digest_final(const struct digest *d)
{
    uint64_t h = rotl64(d->v[0], 1) + rotl64(d->v[1], 7) + rotl64(d->v[2], 12) +
                 rotl64(d->v[3], 18);
    for (int i = 0; i < 4; i++)
        h = (h ^ lane(0, d->v[i])) * P1 + P3;
    h += d->n * 8;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h ? h : 1; /* 0 is the base model */
}

uint64_t lora__digest(const struct lora_adapter *ad)
{
    /* what changes the computation, in a fixed layout (padding between matrices is left
     * out: it is never read) */
    struct digest dg;
    digest_init(&dg);
    uint32_t hdr[4] = {ad->cfg.rank, ad->cfg.target_mask, ad->n_layers, 0};
    memcpy(&hdr[3], &ad->cfg.scaling, 4);
    digest_words(&dg, hdr, sizeof hdr);
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_TARGET_COUNT; i++) {
        const struct lora_weights *w = &ad->w[i];
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT), here = w->a != NULL;
        digest_words(&dg, &here, 4);
        if (!here)
            continue;
        digest_words(&dg, w->a, (size_t)ad->cfg.rank * ad->in[t] * sizeof(float));
        digest_words(&dg, w->b, (size_t)ad->out[t] * ad->cfg.rank * sizeof(float));
    }
    return digest_final(&dg);
}

/*
 * The serving path's copy (lora_weights.fa/fbt) in dt: B transposed into panels of 32 output
 * columns (lora_bt_index) so that an expand task streams one contiguous block. The loader asks
 * for bf16 when the file holds only BF16 tensors (the f32 values are then exact bf16 numbers:
 * no precision is lost, and the update reads half the bytes; decode with several adapters is
 * bound by those bytes), else f32 (A shared with the canonical copy, B^T copied);
 * lora_repack may ask for bf16 on any file (rounded).
 */
/*
 * The int8 serving copy (kern.h "on int8 adapter weights"): A's rank rows and B^T's rank rows
 * (B's columns) each quantized symmetrically with their own f32 scale, by the rule the
 * kernels apply to activations (kern_lora_i8_quant). A rank row of B^T spans every output:
 * its scale is folded into the expand's activations, so the panels carry no scales. Writes
 * both blocks at p (sizes from lora__fa_offset / lora__fbt_offset); 0 or -ENOMEM (logged).
 */
static int pack_i8(const struct lora_adapter *ad, const struct lora_weights *w, uint32_t t,
                   unsigned char *pa, unsigned char *pb, const char *f_what)
{
    const size_t r = ad->cfg.rank, in = ad->in[t], out = ad->out[t];
    const size_t row = in > out ? in : out;
    if (in > KERN_LORA_I8_IN_MAX || r > KERN_LORA_RANK_MAX) {
        LOG_ERR("%s: %s has in %zu and rank %zu: int8 adapter weights need in <= %u and "
                "rank <= %u",
                f_what, lora_target_name((enum lora_target)t), in, r, KERN_LORA_I8_IN_MAX,
                KERN_LORA_RANK_MAX);
        return ERR_RANGE;
    }
    float *col = malloc(row * sizeof *col);
    int8_t *q = malloc(row);
    if (!col || !q) {
        free(col);
        free(q);
        LOG_ERR("%s: out of memory packing int8 adapter weights", f_what);
        return -ENOMEM;
    }
    float *sa = (float *)pa, *sb = (float *)pb;
    memset(pa, 0, KERN_LORA_I8_HDR(r));
    memset(pb, 0, KERN_LORA_I8_HDR(r));
    uint8_t *qa = pa + KERN_LORA_I8_HDR(r), *qb = pb + KERN_LORA_I8_HDR(r);
    memset(qb, 128, lora__fbt_offset(ad, out) - KERN_LORA_I8_HDR(r)); /* padding: zero */
    for (size_t k = 0; k < r; k++) {
        sa[k] = kern_lora_i8_quant(w->a + k * in, in, q);
        for (size_t c = 0; c < in; c++)
            qa[k * in + c] = (uint8_t)(q[c] + 128);
        for (size_t j = 0; j < out; j++)
            col[j] = w->b[j * r + k];
        sb[k] = kern_lora_i8_quant(col, out, q);
        for (size_t j = 0; j < out; j++)
            qb[KERN_LORA_I8_BT_INDEX(r, k, j)] = (uint8_t)(q[j] + 128);
    }
    free(col);
    free(q);
    return 0;
}

/* Bytes of target t's A block in the serving copy (none on f32: A is shared with the
 * canonical copy) and of its B^T block, each rounded to 64 so that every block starts on a
 * cache line. ad->fast_dt is the packing. */
static size_t a_block(const struct lora_adapter *ad, uint32_t t)
{
    if (ad->fast_dt == DT_F32)
        return 0;
    return (lora__fa_offset(ad, t, ad->cfg.rank) + 63) / 64 * 64;
}

static size_t bt_block(const struct lora_adapter *ad, uint32_t t)
{
    return (lora__fbt_offset(ad, ad->out[t]) + 63) / 64 * 64;
}

/* A new ad->fast_store for every adapted (layer, target)'s blocks in ad->fast_dt; 0 or
 * -ENOMEM (logged). */
static int store_alloc(struct lora_adapter *ad, const char *f_what)
{
    size_t bytes = 0;
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_TARGET_COUNT; i++) {
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT);
        if (ad->w[i].a)
            bytes += a_block(ad, t) + bt_block(ad, t);
    }
    ad->fast_bytes = bytes;
    ad->fast_store = bytes ? aligned_alloc(64, bytes) : NULL;
    if (bytes && !ad->fast_store) {
        LOG_ERR("%s: out of memory for %zu bytes of packed adapter weights", f_what, bytes);
        return -ENOMEM;
    }
    return 0;
}

/*
 * Where each adapted (layer, target)'s blocks go in ad->fast_store (lora_weights.fa/.fbt;
 * f32: fa is the canonical A). Per layer, the targets that share an input (q, k, v; o;
 * gate, up; down: the products of one matmul_group_lora job) have their A blocks back to
 * back, then their B^T blocks: a segment's shrinks of one job read one contiguous stream, and
 * a whole layer is read front to back in the order the step reads it (session 14: the
 * update's 2-32 KB blocks, each a fresh stream, made an adapter byte cost 2.5-3.6 base bytes,
 * docs/PERFORMANCE.md "LoRA over int8, session 13").
 */
static void store_place(struct lora_adapter *ad)
{
    static const uint32_t group_end[] = {LORA_O, LORA_GATE, LORA_DOWN, LORA_TARGET_COUNT};
    unsigned char *p = ad->fast_store;
    if (!p) /* nothing adapted */
        return;
    for (size_t l = 0; l < ad->n_layers; l++) {
        struct lora_weights *lw = &ad->w[l * LORA_TARGET_COUNT];
        uint32_t t0 = 0;
        for (size_t g = 0; g < sizeof group_end / sizeof group_end[0]; g++) {
            const uint32_t t1 = group_end[g];
            for (uint32_t t = t0; t < t1; t++)
                if (lw[t].a) {
                    lw[t].fa = ad->fast_dt == DT_F32 ? (const void *)lw[t].a : p;
                    p += a_block(ad, t);
                }
            for (uint32_t t = t0; t < t1; t++)
                if (lw[t].a) {
                    lw[t].fbt = p;
                    p += bt_block(ad, t);
                }
            t0 = t1;
        }
    }
    CHECK((size_t)(p - (unsigned char *)ad->fast_store) == ad->fast_bytes);
}

/* A block store_place put in the store, to be written (the fields are const for readers). */
static unsigned char *block(const struct lora_adapter *ad, const void *at)
{
    return (unsigned char *)ad->fast_store + ((const unsigned char *)at -
                                              (const unsigned char *)ad->fast_store);
}

/* lora__pack for LORA_DT_I8: every adapted (layer, target)'s two blocks in one store. */
static int lora__pack_i8(struct lora_adapter *ad, const char *f_what)
{
    int rc = store_alloc(ad, f_what);
    if (rc)
        return rc;
    store_place(ad);
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_TARGET_COUNT; i++) {
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT);
        struct lora_weights *w = &ad->w[i];
        if (!w->a)
            continue;
        rc = pack_i8(ad, w, t, block(ad, w->fa), block(ad, w->fbt), f_what);
        if (rc) {
            free(ad->fast_store);
            ad->fast_store = NULL;
            return rc;
        }
    }
    return 0;
}

int lora__pack(struct lora_adapter *ad, enum dtype dt, const char *f_what)
{
    ad->fast_dt = dt;
    if (dt == LORA_DT_I8)
        return lora__pack_i8(ad, f_what);
    const bool bf16 = dt == DT_BF16;
    const size_t esz = bf16 ? 2 : 4;
    int rc = store_alloc(ad, f_what);
    if (rc)
        return rc;
    store_place(ad);
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_TARGET_COUNT; i++) {
        uint32_t t = (uint32_t)(i % LORA_TARGET_COUNT);
        struct lora_weights *w = &ad->w[i];
        if (!w->a)
            continue;
        size_t r = ad->cfg.rank, in = ad->in[t], out = ad->out[t];
        if (bf16) {
            uint16_t *a16 = (uint16_t *)block(ad, w->fa);
            for (size_t k = 0; k < r * in; k++)
                a16[k] = half_f32_to_bf16(w->a[k]);
        }
        unsigned char *p = block(ad, w->fbt);
        size_t nbt = lora_bt_elems(out, r);
        memset(p, 0, nbt * esz); /* the last panel's padding columns */
        for (size_t k = 0; k < r; k++)
            for (size_t j = 0; j < out; j++) {
                size_t d = lora_bt_index(r, k, j);
                if (bf16)
                    ((uint16_t *)p)[d] = half_f32_to_bf16(w->b[j * r + k]);
                else
                    ((float *)p)[d] = w->b[j * r + k];
            }
    }
    return 0;
}

static const char *const pack_names[] = {"auto", "bf16", "int8"};

int lora_pack_parse(const char *s, enum lora_pack *out)
{
    for (unsigned i = 0; i < 3; i++)
        if (strcmp(s, pack_names[i]) == 0) {
            *out = (enum lora_pack)i;
            return 0;
        }
    LOG_ERR("LoRA weight packing '%.32s' is unknown: auto, bf16 or int8", s);
    return ERR_FORMAT;
}

int lora_repack(struct lora_adapter *ad, enum lora_pack pack)
{
    CHECK(ad->magic == LORA__MAGIC && lora__refs(ad) == 1);
    enum dtype dt = pack == LORA_PACK_BF16   ? DT_BF16
                    : pack == LORA_PACK_INT8 ? LORA_DT_I8
                                             : ad->fast_dt;
    /* rank 1 in int8 reads more bytes than in bf16 (B^T's panels hold rank groups of 4:
     * in + 4 out codes against 2 in + 2 out bf16 per projection, 8.0 against 6.3 MB a step
     * for 4 adapters on TinyLlama's 7 projections) and its kernels took 1.5-2x bf16's time
     * (lora_kern_bench 1, session 17): it is served in bf16, which is also the nearer copy.
     * From rank 2 on int8 reads fewer bytes (2 in + 4 out against 4 in + 4 out). */
    if (dt == LORA_DT_I8 && ad->cfg.rank < LORA_I8_MIN_RANK) {
        dt = DT_BF16;
        LOG_INFO("%s: rank %u adapter served with bf16 weights, not int8 (fewer bytes at this "
                 "rank)", ad->dir, (unsigned)ad->cfg.rank);
    }
    if (dt == ad->fast_dt)
        return 0;
    void *old = ad->fast_store;
    enum dtype old_dt = ad->fast_dt;
    struct lora_weights *keep = malloc((size_t)ad->n_layers * LORA_TARGET_COUNT * sizeof *keep);
    if (!keep) {
        LOG_ERR("%s: out of memory repacking the adapter", ad->dir);
        return -ENOMEM;
    }
    memcpy(keep, ad->w, (size_t)ad->n_layers * LORA_TARGET_COUNT * sizeof *keep);
    int rc = lora__pack(ad, dt, ad->dir);
    if (rc) { /* the previous copy stays */
        free(ad->fast_store);
        memcpy(ad->w, keep, (size_t)ad->n_layers * LORA_TARGET_COUNT * sizeof *keep);
        ad->fast_store = old;
        ad->fast_dt = old_dt;
        free(keep);
        return rc;
    }
    free(keep);
    free(old);
    /* a lossy copy computes something else: prefix reuse and snapshots must not mix them */
    struct digest dg;
    digest_init(&dg);
    uint64_t words[2] = {ad->digest, (uint64_t)dt};
    digest_words(&dg, words, sizeof words);
    ad->digest = digest_final(&dg);
    return 0;
}
