/*
 * kv.c — the paged KV cache: block pool, free stack, LRU of cached prefix blocks, the prefix
 * index (chained hashes, verified exactly), sequences with reference counting and
 * copy-on-write. See kv.h for the contract and docs/KV.md for the design.
 *
 * NOTES: everything here runs on the pool's owner thread (kv.h). Invariants, all checked by
 * kv_pool_validate():
 *  - a block is in exactly one state: used (ref > 0), cached (ref 0, indexed, on the LRU
 *    list) or free (ref 0, not indexed, on the free stack);
 *  - ref equals the number of live sequences' table entries naming the block;
 *  - a block written by kv_seq_write has ref 1 (reserve made it exclusive), so shared blocks
 *    are immutable; indexed blocks are full and never written again;
 *  - an indexed block's parent link is (id, gen) of an indexed block at depth - 1 as long as
 *    that parent stays indexed; evicting a parent bumps its gen and orphans the children
 *    (they can no longer match and age out of the LRU).
 */
#include "kv_internal.h"

#include "check.h"
#include "err.h"
#include "half.h"
#include "kern.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- hashing ------------------------------------------------------------------------------ */

#define H_P1 UINT64_C(0x9E3779B185EBCA87)
#define H_P2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define H_P3 UINT64_C(0x165667B19E3779F9)

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t rd64(const uint8_t *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return v;
}

static inline uint64_t lane(uint64_t acc, uint64_t w) { return rotl64(acc + w * H_P2, 31) * H_P1; }

uint64_t kv__hash64(const void *data, size_t n, uint64_t seed)
{
    const uint8_t *b = data;
    size_t i = 0;
    uint64_t h;
    if (n >= 32) {
        /* four independent lanes keep the multipliers busy on long inputs (snapshots) */
        uint64_t a0 = seed + H_P1 + H_P2, a1 = seed + H_P2, a2 = seed, a3 = seed - H_P1;
        for (; i + 32 <= n; i += 32) {
            a0 = lane(a0, rd64(b + i));
            a1 = lane(a1, rd64(b + i + 8));
            a2 = lane(a2, rd64(b + i + 16));
            a3 = lane(a3, rd64(b + i + 24));
        }
        h = rotl64(a0, 1) + rotl64(a1, 7) + rotl64(a2, 12) + rotl64(a3, 18);
    } else {
        h = seed + H_P3;
    }
    h += (uint64_t)n;
    for (; i + 8 <= n; i += 8)
        h = rotl64(h ^ lane(0, rd64(b + i)), 27) * H_P1 + H_P2;
    for (; i < n; i++)
        h = rotl64(h ^ (b[i] * H_P3), 11) * H_P1;
    /* avalanche: every input bit reaches every output bit */
    h ^= h >> 33;
    h *= H_P2;
    h ^= h >> 29;
    h *= H_P3;
    h ^= h >> 32;
    return h;
}

uint64_t kv__root_hash(const struct kv_pool *p, uint64_t tenant, uint64_t adapter)
{
    uint64_t w[2] = {tenant, adapter};
    return kv__hash64(w, sizeof w, UINT64_C(0x6b765f726f6f7421)) & p->hash_mask;
}

uint64_t kv__chain_hash(const struct kv_pool *p, uint64_t parent_hash, const int32_t *tokens)
{
    return kv__hash64(tokens, (size_t)p->B * sizeof *tokens, parent_hash) & p->hash_mask;
}

/* ---- block lists ---------------------------------------------------------------------------- */

static void lru_unlink(struct kv_pool *p, uint32_t id)
{
    struct kv_block *b = &p->blocks[id];
    if (b->lru_prev != KV_NONE)
        p->blocks[b->lru_prev].lru_next = b->lru_next;
    else
        p->lru_head = b->lru_next;
    if (b->lru_next != KV_NONE)
        p->blocks[b->lru_next].lru_prev = b->lru_prev;
    else
        p->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = KV_NONE;
    p->n_cached--;
}

/* Most recently used end: evicted last. */
static void lru_push_hot(struct kv_pool *p, uint32_t id)
{
    struct kv_block *b = &p->blocks[id];
    b->lru_next = KV_NONE;
    b->lru_prev = p->lru_tail;
    if (p->lru_tail != KV_NONE)
        p->blocks[p->lru_tail].lru_next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
    p->n_cached++;
}

/* Least recently used end: evicted first. */
static void lru_push_cold(struct kv_pool *p, uint32_t id)
{
    struct kv_block *b = &p->blocks[id];
    b->lru_prev = KV_NONE;
    b->lru_next = p->lru_head;
    if (p->lru_head != KV_NONE)
        p->blocks[p->lru_head].lru_prev = id;
    else
        p->lru_tail = id;
    p->lru_head = id;
    p->n_cached++;
}

static void index_unlink(struct kv_pool *p, uint32_t id)
{
    struct kv_block *b = &p->blocks[id];
    uint32_t *link = &p->buckets[b->hash & p->bucket_mask];
    while (*link != id) {
        CHECK(*link != KV_NONE);
        link = &p->blocks[*link].hnext;
    }
    *link = b->hnext;
    b->hnext = KV_NONE;
    b->indexed = 0;
    b->gen++;
    p->n_indexed--;
}

static void index_link(struct kv_pool *p, uint32_t id, uint64_t hash, uint64_t tenant,
                       uint64_t adapter, uint32_t depth, uint32_t parent)
{
    struct kv_block *b = &p->blocks[id];
    CHECK(!b->indexed);
    b->hash = hash;
    b->tenant = tenant;
    b->adapter = adapter;
    b->depth = depth;
    b->parent = parent;
    b->parent_gen = parent == KV_NONE ? 0 : p->blocks[parent].gen;
    b->indexed = 1;
    uint32_t *head = &p->buckets[hash & p->bucket_mask];
    b->hnext = *head;
    *head = id;
    p->n_indexed++;
}

uint32_t kv__index_find(const struct kv_pool *p, uint64_t hash, uint64_t tenant,
                        uint64_t adapter, uint32_t depth, uint32_t parent, uint32_t parent_gen,
                        const int32_t *tokens)
{
    for (uint32_t id = p->buckets[hash & p->bucket_mask]; id != KV_NONE;
         id = p->blocks[id].hnext) {
        const struct kv_block *b = &p->blocks[id];
        /* the hash only narrows the search; the key itself decides */
        if (b->hash != hash || b->tenant != tenant || b->adapter != adapter ||
            b->depth != depth || b->parent != parent)
            continue;
        if (parent != KV_NONE && b->parent_gen != parent_gen)
            continue;
        if (memcmp(kv__block_tokens(p, id), tokens, (size_t)p->B * sizeof *tokens) != 0)
            continue;
        return id;
    }
    return KV_NONE;
}

uint32_t kv__block_take(struct kv_pool *p)
{
    uint32_t id;
    if (p->n_free > 0) {
        id = p->free_ids[--p->n_free];
    } else if (p->lru_head != KV_NONE) {
        id = p->lru_head;
        lru_unlink(p, id);
        index_unlink(p, id);
        p->ctr.evictions++;
    } else {
        return KV_NONE;
    }
    CHECK(p->blocks[id].ref == 0 && !p->blocks[id].indexed);
    return id;
}

void kv__block_free(struct kv_pool *p, uint32_t id)
{
    CHECK(p->blocks[id].ref == 0 && !p->blocks[id].indexed);
    CHECK(p->n_free < p->n_blocks);
    p->free_ids[p->n_free++] = id;
}

void kv__index_insert_cold(struct kv_pool *p, uint32_t id, uint64_t hash, uint64_t tenant,
                           uint64_t adapter, uint32_t depth, uint32_t parent)
{
    index_link(p, id, hash, tenant, adapter, depth, parent);
    p->blocks[id].last_use = ++p->clock;
    lru_push_cold(p, id);
}

/* A sequence takes a reference (attach, fork, dedup). */
static void block_ref(struct kv_pool *p, uint32_t id)
{
    struct kv_block *b = &p->blocks[id];
    if (b->ref == 0) {
        CHECK(b->indexed); /* only cached blocks are picked up with no reference */
        lru_unlink(p, id);
    }
    b->ref++;
}

static void block_unref(struct kv_pool *p, uint32_t id)
{
    struct kv_block *b = &p->blocks[id];
    CHECK(b->ref > 0);
    if (--b->ref > 0)
        return;
    if (b->indexed) {
        b->last_use = ++p->clock;
        lru_push_hot(p, id);
    } else {
        kv__block_free(p, id);
    }
}

/* ---- pool ------------------------------------------------------------------------------------ */

static int check_field(const char *name, uint64_t v, uint64_t lo, uint64_t hi)
{
    if (v < lo || v > hi) {
        LOG_ERR("kv config: %s = %llu is out of range [%llu, %llu]", name, (unsigned long long)v,
                (unsigned long long)lo, (unsigned long long)hi);
        return ERR_RANGE;
    }
    return 0;
}

int kv_pool_create(const struct kv_config *cfg, struct kv_pool **out)
{
    struct kv_config c = *cfg;
    int rc;
    *out = NULL;
    if (c.block_tokens == 0)
        c.block_tokens = KV_BLOCK_TOKENS_DEFAULT;
    if ((rc = check_field("n_layers", c.n_layers, 1, KV_LAYERS_MAX)) ||
        (rc = check_field("n_kv_heads", c.n_kv_heads, 1, KV_HEADS_MAX)) ||
        (rc = check_field("head_dim", c.head_dim, 1, KV_HEAD_DIM_MAX)) ||
        (rc = check_field("block_tokens", c.block_tokens, 1, KV_BLOCK_TOKENS_MAX)) ||
        (rc = check_field("test_hash_bits", c.test_hash_bits, 0, 63)))
        return rc;
    if (!dtype_kv_name(c.dtype)) {
        const struct dtype_info *di = dtype_info(c.dtype);
        LOG_ERR("kv config: dtype %s is not a KV element type (f32, f16, bf16, int8 or fp8)",
                di ? di->name : "(invalid)");
        return ERR_RANGE;
    }

    const int kv8 = dtype_is_kv8(c.dtype);
    size_t esize = c.dtype == DT_F32 ? 4 : kv8 ? 1 : 2;
    /* each factor is bounded above, so these products fit comfortably in 64 bits */
    size_t kv_dim = (size_t)c.n_kv_heads * c.head_dim;
    size_t head_bytes = kv8 ? kern_kv8_head_bytes(c.head_dim) : c.head_dim * esize;
    size_t row_bytes = c.n_kv_heads * head_bytes;
    size_t layer_bytes = 2 * (size_t)c.block_tokens * row_bytes;
    size_t data_bytes = (size_t)c.n_layers * layer_bytes;
    size_t stride = (data_bytes + 63) & ~(size_t)63;
    uint64_t n_blocks = c.budget_bytes / stride;
    if (n_blocks == 0) {
        LOG_ERR("kv config: budget_bytes = %llu holds no block of %zu bytes (%u layers x %u "
                "tokens x K,V x %zu elements)",
                (unsigned long long)c.budget_bytes, stride, c.n_layers, c.block_tokens, kv_dim);
        return ERR_RANGE;
    }
    if (n_blocks > (UINT64_C(1) << 30))
        n_blocks = UINT64_C(1) << 30; /* ids stay far from KV_NONE; metadata stays bounded */

    struct kv_pool *p = calloc(1, sizeof *p);
    if (!p) {
        LOG_ERR("kv: out of memory for the pool");
        return -ENOMEM;
    }
    p->cfg = c;
    p->B = c.block_tokens;
    p->kv_dim = (uint32_t)kv_dim;
    p->n_blocks = (uint32_t)n_blocks;
    p->esize = esize;
    p->head_bytes = head_bytes;
    p->row_bytes = row_bytes;
    p->rotate = kv8 && !c.kv8_no_rotate;
    p->layer_bytes = layer_bytes;
    p->data_bytes = data_bytes;
    p->block_stride = stride;
    p->lru_head = p->lru_tail = KV_NONE;
    p->hash_mask = c.test_hash_bits ? (UINT64_C(1) << c.test_hash_bits) - 1 : UINT64_MAX;
    uint64_t n_buckets = 16;
    while (n_buckets < n_blocks)
        n_buckets <<= 1;
    p->bucket_mask = n_buckets - 1;

    /* Anonymous mapping: pages are committed on first write, so a large budget costs memory
     * only as blocks are used (at 2 MiB grain where huge pages are granted). The arena starts
     * on a 2 MiB boundary and asks for transparent huge pages (this kernel grants them on
     * madvise only): a long context's decode walks every block of every layer, and through
     * 4 KiB entries each block costs TLB misses (a two-dimensional walk on a VM; the weights
     * measured 2.4-6.8x slower that way, docs/PERFORMANCE.md "Session 9"). */
    const size_t huge = (size_t)2 << 20;
    p->data_map_bytes = ((size_t)n_blocks * stride + huge - 1) / huge * huge;
    void *m = mmap(NULL, p->data_map_bytes + huge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        rc = -errno;
        LOG_ERR("kv: mmap of %zu bytes for %llu blocks failed: %s", p->data_map_bytes,
                (unsigned long long)n_blocks, err_str(rc));
        p->data = NULL;
        goto fail;
    }
    uintptr_t at = ((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1);
    size_t head = at - (uintptr_t)m, tail = huge - head; /* trimmed off: the arena stays */
    if (head)
        munmap(m, head);
    if (tail)
        munmap((char *)at + p->data_map_bytes, tail);
    m = (void *)at;
    (void)madvise(m, p->data_map_bytes, MADV_HUGEPAGE); /* advice: without it, 4 KiB pages */
    p->data = m;
    p->blocks = calloc(n_blocks, sizeof *p->blocks);
    p->tokens = calloc(n_blocks * p->B, sizeof *p->tokens);
    p->free_ids = malloc(n_blocks * sizeof *p->free_ids);
    p->buckets = malloc(n_buckets * sizeof *p->buckets);
    if (!p->blocks || !p->tokens || !p->free_ids || !p->buckets) {
        rc = -ENOMEM;
        LOG_ERR("kv: out of memory for the metadata of %llu blocks",
                (unsigned long long)n_blocks);
        goto fail;
    }
    for (uint64_t i = 0; i < n_buckets; i++)
        p->buckets[i] = KV_NONE;
    for (uint32_t i = 0; i < p->n_blocks; i++) {
        struct kv_block *b = &p->blocks[i];
        b->lru_prev = b->lru_next = b->hnext = b->parent = KV_NONE;
        /* pop order 0, 1, 2, ...: the arena is touched from its start */
        p->free_ids[i] = p->n_blocks - 1 - i;
    }
    p->n_free = p->n_blocks;
    *out = p;
    return 0;
fail:
    kv_pool_destroy(p);
    return rc;
}

void kv_pool_destroy(struct kv_pool *p)
{
    if (!p)
        return;
    CHECK(p->n_seqs == 0); /* sequences hold references into the pool */
    if (p->data)
        munmap(p->data, p->data_map_bytes);
    free(p->blocks);
    free(p->tokens);
    free(p->free_ids);
    free(p->buckets);
    free(p);
}

const struct kv_config *kv_pool_config(const struct kv_pool *p) { return &p->cfg; }

void kv_pool_metrics(const struct kv_pool *p, struct kv_metrics *m)
{
    *m = p->ctr;
    m->blocks_total = p->n_blocks;
    m->blocks_free = p->n_free;
    m->blocks_cached = p->n_cached;
    m->blocks_used = (uint64_t)p->n_blocks - p->n_free - p->n_cached;
    m->blocks_indexed = p->n_indexed;
    m->block_bytes = p->data_bytes;
}

void kv_pool_drop_cached(struct kv_pool *p)
{
    while (p->lru_head != KV_NONE) {
        uint32_t id = p->lru_head;
        lru_unlink(p, id);
        index_unlink(p, id);
        kv__block_free(p, id);
    }
}

uint32_t kv_pool_block_ref(const struct kv_pool *p, uint32_t id)
{
    return id < p->n_blocks ? p->blocks[id].ref : 0;
}

#define BAD(...)                 \
    do {                         \
        LOG_ERR(__VA_ARGS__);    \
        rc = ERR_STATE;          \
        goto out;                \
    } while (0)

int kv_pool_validate(const struct kv_pool *p)
{
    int rc = 0;
    uint32_t *refs = calloc(p->n_blocks, sizeof *refs);
    uint8_t *seen = calloc(p->n_blocks, 1); /* 1 free, 2 cached */
    if (!refs || !seen) {
        rc = -ENOMEM;
        LOG_ERR("kv validate: out of memory");
        goto out;
    }
    uint32_t n_seqs = 0;
    for (const struct kv_seq *s = p->seqs; s; s = s->next) {
        n_seqs++;
        if (s->pool != p)
            BAD("kv validate: sequence %p belongs to another pool", (const void *)s);
        if (s->len > s->cap || (uint64_t)s->cap > (uint64_t)s->n_table * p->B ||
            s->n_table > s->table_cap || s->n_indexed > s->len / p->B)
            BAD("kv validate: sequence %p: len %u cap %u blocks %u indexed %u inconsistent",
                (const void *)s, s->len, s->cap, s->n_table, s->n_indexed);
        if (s->n_table != (s->cap + p->B - 1) / p->B)
            BAD("kv validate: sequence %p holds %u blocks for %u positions", (const void *)s,
                s->n_table, s->cap);
        for (uint32_t l = 0; l < p->cfg.n_layers; l++)
            if (s->written[l] < s->len || s->written[l] > s->cap)
                BAD("kv validate: sequence %p layer %u written %u outside [%u, %u]",
                    (const void *)s, l, s->written[l], s->len, s->cap);
        if (s->n_released > s->n_indexed || (s->n_released && s->n_released >= s->n_table))
            BAD("kv validate: sequence %p released %u of %u blocks (%u indexed)",
                (const void *)s, s->n_released, s->n_table, s->n_indexed);
        for (uint32_t i = 0; i < s->n_table; i++) {
            uint32_t id = s->table[i];
            if (i < s->n_released) {
                if (id != KV_NONE)
                    BAD("kv validate: released entry %u of sequence %p names block %u", i,
                        (const void *)s, id);
                continue;
            }
            if (id >= p->n_blocks)
                BAD("kv validate: sequence %p entry %u names block %u", (const void *)s, i, id);
            refs[id]++;
            const struct kv_block *b = &p->blocks[id];
            /* blocks that will still be written must be exclusive */
            if ((uint64_t)(i + 1) * p->B > s->len && s->cap > s->len && b->ref != 1)
                BAD("kv validate: block %u is written by sequence %p but has ref %u", id,
                    (const void *)s, b->ref);
            if (b->indexed && (b->depth != i || b->tenant != s->tenant ||
                               b->adapter != s->adapter))
                BAD("kv validate: indexed block %u (depth %u) sits at entry %u of sequence %p",
                    id, b->depth, i, (const void *)s);
            if (i < s->n_indexed && p->cfg.prefix_cache && !b->indexed)
                BAD("kv validate: block %u of sequence %p should be indexed", id,
                    (const void *)s);
        }
    }
    if (n_seqs != p->n_seqs)
        BAD("kv validate: %u sequences linked, %u counted", n_seqs, p->n_seqs);
    for (uint32_t i = 0; i < p->n_free; i++) {
        uint32_t id = p->free_ids[i];
        if (id >= p->n_blocks || seen[id])
            BAD("kv validate: free stack entry %u (block %u) is invalid or repeated", i, id);
        seen[id] = 1;
    }
    uint32_t n_lru = 0, prev = KV_NONE;
    for (uint32_t id = p->lru_head; id != KV_NONE; id = p->blocks[id].lru_next) {
        if (id >= p->n_blocks || seen[id] || n_lru > p->n_blocks)
            BAD("kv validate: LRU list broken at block %u", id);
        if (p->blocks[id].lru_prev != prev)
            BAD("kv validate: LRU back link of block %u is %u, expected %u", id,
                p->blocks[id].lru_prev, prev);
        seen[id] = 2;
        n_lru++;
        prev = id;
    }
    if (prev != p->lru_tail || n_lru != p->n_cached)
        BAD("kv validate: LRU tail %u / count %u, expected %u / %u", p->lru_tail, p->n_cached,
            prev, n_lru);
    uint32_t n_idx = 0;
    for (uint32_t id = 0; id < p->n_blocks; id++) {
        const struct kv_block *b = &p->blocks[id];
        if (b->ref != refs[id])
            BAD("kv validate: block %u has ref %u but %u table entries", id, b->ref, refs[id]);
        if (b->ref > 0 && seen[id])
            BAD("kv validate: block %u is referenced and on the %s list", id,
                seen[id] == 1 ? "free" : "LRU");
        if (b->ref == 0 && !seen[id])
            BAD("kv validate: block %u is unreferenced but on no list (leaked)", id);
        if (seen[id] == 1 && b->indexed)
            BAD("kv validate: free block %u is indexed", id);
        if (seen[id] == 2 && !b->indexed)
            BAD("kv validate: cached block %u is not indexed", id);
        if (b->indexed) {
            n_idx++;
            if ((b->depth == 0) != (b->parent == KV_NONE))
                BAD("kv validate: indexed block %u depth %u parent %u", id, b->depth, b->parent);
            /* the block must be findable under its own key */
            uint64_t ph = b->parent == KV_NONE ? kv__root_hash(p, b->tenant, b->adapter)
                                               : p->blocks[b->parent].hash;
            bool parent_live = b->parent == KV_NONE ||
                               (p->blocks[b->parent].indexed &&
                                p->blocks[b->parent].gen == b->parent_gen);
            if (parent_live && kv__chain_hash(p, ph, kv__block_tokens(p, id)) != b->hash)
                BAD("kv validate: indexed block %u hash does not match its key", id);
            uint32_t found = kv__index_find(p, b->hash, b->tenant, b->adapter, b->depth,
                                            b->parent, b->parent_gen, kv__block_tokens(p, id));
            if (found == KV_NONE)
                BAD("kv validate: indexed block %u cannot be found", id);
        }
    }
    if (n_idx != p->n_indexed)
        BAD("kv validate: %u indexed blocks, counter says %u", n_idx, p->n_indexed);
out:
    free(refs);
    free(seen);
    return rc;
}

#undef BAD

/* ---- sequences ------------------------------------------------------------------------------ */

int kv_seq_create(struct kv_pool *p, uint64_t tenant, uint64_t adapter_set, struct kv_seq **out)
{
    *out = NULL;
    struct kv_seq *s = calloc(1, sizeof *s);
    uint32_t *written = calloc(p->cfg.n_layers, sizeof *written);
    if (!s || !written) {
        free(s);
        free(written);
        LOG_ERR("kv: out of memory for a sequence");
        return -ENOMEM;
    }
    s->pool = p;
    s->tenant = tenant;
    s->adapter = adapter_set;
    s->written = written;
    s->next = p->seqs;
    if (p->seqs)
        p->seqs->prev = s;
    p->seqs = s;
    p->n_seqs++;
    *out = s;
    return 0;
}

void kv_seq_destroy(struct kv_seq *s)
{
    if (!s)
        return;
    struct kv_pool *p = s->pool;
    /* last block first: the prefix's head is released last, so it is the most recently used
     * of the chain and its tail is evicted before it */
    for (uint32_t i = s->n_table; i-- > s->n_released;)
        block_unref(p, s->table[i]);
    if (s->prev)
        s->prev->next = s->next;
    else
        p->seqs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    p->n_seqs--;
    free(s->table);
    free(s->written);
    free(s);
}

static int table_grow(struct kv_seq *s, uint32_t need)
{
    if (need <= s->table_cap)
        return 0;
    uint32_t cap = s->table_cap ? s->table_cap : 8;
    while (cap < need)
        cap *= 2;
    uint32_t *t = realloc(s->table, (size_t)cap * sizeof *t);
    if (!t) {
        LOG_ERR("kv: out of memory growing a block table to %u entries", cap);
        return -ENOMEM;
    }
    s->table = t;
    s->table_cap = cap;
    return 0;
}

int kv_seq_fork(struct kv_seq *src, struct kv_seq **out)
{
    struct kv_pool *p = src->pool;
    *out = NULL;
    if (src->cap != src->len) {
        LOG_ERR("kv: cannot fork a sequence with %u reserved uncommitted positions",
                src->cap - src->len);
        return ERR_STATE;
    }
    struct kv_seq *s;
    int rc = kv_seq_create(p, src->tenant, src->adapter, &s);
    if (rc)
        return rc;
    if ((rc = table_grow(s, src->n_table)) != 0) {
        kv_seq_destroy(s);
        return rc;
    }
    for (uint32_t i = 0; i < src->n_table; i++) {
        if (i >= src->n_released)
            block_ref(p, src->table[i]);
        s->table[i] = src->table[i];
    }
    s->n_table = src->n_table;
    s->n_released = src->n_released;
    s->len = s->cap = src->len;
    s->n_indexed = src->n_indexed;
    for (uint32_t l = 0; l < p->cfg.n_layers; l++)
        s->written[l] = src->len;
    *out = s;
    return 0;
}

int kv_seq_attach_prefix(struct kv_seq *s, const int32_t *tokens, size_t n_tokens,
                         uint32_t *n_cached)
{
    struct kv_pool *p = s->pool;
    *n_cached = 0;
    if (s->n_table != 0 || s->cap != 0) {
        LOG_ERR("kv: prefix lookup on a sequence that already holds %u blocks", s->n_table);
        return ERR_STATE;
    }
    if (!p->cfg.prefix_cache)
        return 0;
    size_t max_tokens = n_tokens < KV_SEQ_TOKENS_MAX ? n_tokens : KV_SEQ_TOKENS_MAX;
    uint32_t n_full = (uint32_t)(max_tokens / p->B);
    int rc = table_grow(s, n_full);
    if (rc)
        return rc;
    uint64_t h = kv__root_hash(p, s->tenant, s->adapter);
    uint32_t parent = KV_NONE, parent_gen = 0, n = 0;
    for (; n < n_full; n++) {
        const int32_t *t = tokens + (size_t)n * p->B;
        h = kv__chain_hash(p, h, t);
        uint32_t id = kv__index_find(p, h, s->tenant, s->adapter, n, parent, parent_gen, t);
        if (id == KV_NONE)
            break;
        block_ref(p, id);
        p->blocks[id].last_use = ++p->clock;
        s->table[n] = id;
        parent = id;
        parent_gen = p->blocks[id].gen;
    }
    s->n_table = s->n_indexed = n;
    s->len = s->cap = n * p->B;
    for (uint32_t l = 0; l < p->cfg.n_layers; l++)
        s->written[l] = s->len;
    p->ctr.hit_blocks += n;
    p->ctr.miss_blocks += n_full - n;
    p->ctr.hit_tokens += (uint64_t)n * p->B;
    p->ctr.miss_tokens += n_tokens - (uint64_t)n * p->B;
    *n_cached = s->len;
    return 0;
}

/* Copies the first `rows` positions of every layer (K and V) and their token ids. */
static void block_copy_rows(struct kv_pool *p, uint32_t dst, uint32_t src, uint32_t rows)
{
    size_t n = (size_t)rows * p->row_bytes, v_off = (size_t)p->B * p->row_bytes;
    for (uint32_t l = 0; l < p->cfg.n_layers; l++) {
        uint8_t *d = kv__layer_k(p, dst, l);
        const uint8_t *sp = kv__layer_k(p, src, l);
        memcpy(d, sp, n);
        memcpy(d + v_off, sp + v_off, n);
    }
    memcpy(kv__block_tokens(p, dst), kv__block_tokens(p, src), (size_t)rows * sizeof(int32_t));
}

/* What reserving n more positions takes: new table entries and whether the block receiving
 * position len must be copied first. n <= KV_SEQ_TOKENS_MAX - len. */
static uint32_t reserve_plan(const struct kv_seq *s, uint32_t n, uint32_t *n_new, bool *cow)
{
    const struct kv_pool *p = s->pool;
    uint32_t blocks_needed = (s->len + n + p->B - 1) / p->B;
    *n_new = blocks_needed > s->n_table ? blocks_needed - s->n_table : 0;
    /* Positions past an earlier reservation are already exclusive (fork refuses sequences
     * with reservations, and only full blocks are shared through the index). */
    *cow = n > 0 && s->len % p->B != 0 && s->cap == s->len &&
           p->blocks[s->table[s->len / p->B]].ref > 1;
    return blocks_needed;
}

uint32_t kv_seq_blocks_needed(const struct kv_seq *s, uint32_t n)
{
    uint32_t n_new;
    bool cow;
    if (n > KV_SEQ_TOKENS_MAX - s->len)
        n = KV_SEQ_TOKENS_MAX - s->len;
    reserve_plan(s, n, &n_new, &cow);
    return n_new + (cow ? 1 : 0);
}

int kv_seq_reserve(struct kv_seq *s, uint32_t n)
{
    struct kv_pool *p = s->pool;
    if (n > KV_SEQ_TOKENS_MAX - s->len) {
        LOG_ERR("kv: reserving %u positions after %u exceeds the %u-position limit", n, s->len,
                KV_SEQ_TOKENS_MAX);
        return ERR_RANGE;
    }
    uint32_t target = s->len + n, n_new;
    uint32_t partial = s->len % p->B;
    bool cow;
    uint32_t blocks_needed = reserve_plan(s, n, &n_new, &cow);
    uint32_t need = n_new + (cow ? 1 : 0);
    if (need == 0) {
        if (target > s->cap)
            s->cap = target;
        return 0;
    }
    if ((uint64_t)need > (uint64_t)p->n_free + p->n_cached) {
        p->ctr.alloc_failures++;
        LOG_DEBUG("kv: reserve of %u positions needs %u blocks, %u free + %u cached", n, need,
                  p->n_free, p->n_cached);
        return ERR_OVERLOADED;
    }
    int rc = table_grow(s, blocks_needed);
    if (rc)
        return rc;
    /* nothing below can fail: the blocks are known to be available */
    if (cow) {
        uint32_t bi = s->len / p->B, old = s->table[bi];
        uint32_t id = kv__block_take(p);
        CHECK(id != KV_NONE);
        block_copy_rows(p, id, old, partial);
        p->blocks[id].ref = 1;
        block_unref(p, old);
        s->table[bi] = id;
        p->ctr.cow_copies++;
    }
    for (uint32_t i = 0; i < n_new; i++) {
        uint32_t id = kv__block_take(p);
        CHECK(id != KV_NONE);
        p->blocks[id].ref = 1;
        s->table[s->n_table++] = id;
    }
    if (target > s->cap)
        s->cap = target;
    return 0;
}

/* One K or V row of the pool's dtype from src [kv_dim] f32; 8-bit: per head, rotated (unless
 * kv8_no_rotate) then quantized with its own scale. */
static void store_row(const struct kv_pool *p, uint8_t *dst, const float *src)
{
    const uint32_t n = p->kv_dim, hd = p->cfg.head_dim;
    if (dtype_is_kv8(p->cfg.dtype)) {
        float x[KV_HEAD_DIM_MAX]; /* [hd] one head, rotated */
        for (uint32_t g = 0; g < p->cfg.n_kv_heads; g++) {
            memcpy(x, src + (size_t)g * hd, hd * sizeof(float));
            if (p->rotate)
                kern_kv_rotate(x, hd);
            kern_kv8_quant(p->cfg.dtype, x, dst + g * p->head_bytes, hd);
        }
        return;
    }
    switch (p->cfg.dtype) {
    case DT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case DT_F16: {
        uint16_t h;
        for (uint32_t i = 0; i < n; i++) {
            h = half_f32_to_f16(src[i]);
            memcpy(dst + 2 * (size_t)i, &h, 2);
        }
        return;
    }
    case DT_BF16: {
        uint16_t h;
        for (uint32_t i = 0; i < n; i++) {
            h = half_f32_to_bf16(src[i]);
            memcpy(dst + 2 * (size_t)i, &h, 2);
        }
        return;
    }
    default:
        CHECK(!"kv: unsupported dtype");
    }
}

int kv_seq_write(struct kv_seq *s, uint32_t layer, const float *k, const float *v, uint32_t n)
{
    struct kv_pool *p = s->pool;
    if (layer >= p->cfg.n_layers) {
        LOG_ERR("kv: write to layer %u of a %u-layer cache", layer, p->cfg.n_layers);
        return ERR_RANGE;
    }
    uint32_t pos = s->written[layer];
    if (n > s->cap - pos) {
        LOG_ERR("kv: writing %u rows to layer %u at position %u exceeds the reservation (%u "
                "positions)",
                n, layer, pos, s->cap);
        return ERR_RANGE;
    }
    size_t v_off = (size_t)p->B * p->row_bytes;
    for (uint32_t i = 0; i < n; i++, pos++) {
        uint32_t id = s->table[pos / p->B];
        CHECK(p->blocks[id].ref == 1 && !p->blocks[id].indexed);
        uint8_t *kd = kv__layer_k(p, id, layer) + (size_t)(pos % p->B) * p->row_bytes;
        store_row(p, kd, k + (size_t)i * p->kv_dim);
        store_row(p, kd + v_off, v + (size_t)i * p->kv_dim);
    }
    s->written[layer] = pos;
    return 0;
}

/* Offers full block i of s to the index: either it becomes indexed, or an identical cached
 * block replaces it in the table (its own copy is freed). */
static void index_full_block(struct kv_pool *p, struct kv_seq *s, uint32_t i)
{
    uint32_t id = s->table[i];
    uint32_t parent = i > 0 ? s->table[i - 1] : KV_NONE;
    uint64_t ph;
    if (parent == KV_NONE) {
        ph = kv__root_hash(p, s->tenant, s->adapter);
    } else {
        CHECK(p->blocks[parent].indexed);
        ph = p->blocks[parent].hash;
    }
    const int32_t *t = kv__block_tokens(p, id);
    uint64_t h = kv__chain_hash(p, ph, t);
    uint32_t parent_gen = parent == KV_NONE ? 0 : p->blocks[parent].gen;
    uint32_t found = kv__index_find(p, h, s->tenant, s->adapter, i, parent, parent_gen, t);
    if (found == id)
        return;
    if (found != KV_NONE) {
        block_ref(p, found);
        block_unref(p, id);
        s->table[i] = found;
        p->blocks[found].last_use = ++p->clock;
        return;
    }
    CHECK(!p->blocks[id].indexed);
    index_link(p, id, h, s->tenant, s->adapter, i, parent);
    p->blocks[id].last_use = ++p->clock;
}

int kv_seq_commit(struct kv_seq *s, const int32_t *tokens, uint32_t n)
{
    struct kv_pool *p = s->pool;
    if (n > s->cap - s->len) {
        LOG_ERR("kv: committing %u positions after %u exceeds the reservation (%u positions)", n,
                s->len, s->cap);
        return ERR_RANGE;
    }
    for (uint32_t l = 0; l < p->cfg.n_layers; l++) {
        if (s->written[l] - s->len < n) {
            LOG_ERR("kv: commit of %u positions: layer %u has only %u rows written after "
                    "position %u",
                    n, l, s->written[l] - s->len, s->len);
            return ERR_STATE;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t pos = s->len + i;
        kv__block_tokens(p, s->table[pos / p->B])[pos % p->B] = tokens[i];
    }
    s->len += n;
    uint32_t full = s->len / p->B;
    if (p->cfg.prefix_cache) {
        for (uint32_t i = s->n_indexed; i < full; i++)
            index_full_block(p, s, i);
    }
    s->n_indexed = full;
    return 0;
}

uint32_t kv_seq_release_before(struct kv_seq *s, uint32_t pos)
{
    struct kv_pool *p = s->pool;
    uint32_t n = 0;
    /* block i ends at (i+1)*B <= pos; block i+1 must be indexed already (it links to i) */
    while (s->n_released + 1 < s->n_indexed && (uint64_t)(s->n_released + 1) * p->B <= pos) {
        uint32_t i = s->n_released++;
        block_unref(p, s->table[i]);
        s->table[i] = KV_NONE;
        n++;
    }
    p->ctr.window_releases += n;
    return n;
}

uint32_t kv_seq_n_released(const struct kv_seq *s) { return s->n_released; }

uint32_t kv_seq_len(const struct kv_seq *s) { return s->len; }

uint32_t kv_seq_written(const struct kv_seq *s, uint32_t layer)
{
    return layer < s->pool->cfg.n_layers ? s->written[layer] : 0;
}

uint32_t kv_seq_n_blocks(const struct kv_seq *s) { return s->n_table; }

uint32_t kv_seq_block(const struct kv_seq *s, uint32_t i)
{
    return i < s->n_table ? s->table[i] : KV_NONE;
}

const struct kv_pool *kv_seq_pool(const struct kv_seq *s) { return s->pool; }

int kv_seq_read(const struct kv_seq *s, uint32_t layer, uint32_t pos, float *k, float *v)
{
    const struct kv_pool *p = s->pool;
    if (layer >= p->cfg.n_layers || pos >= s->written[layer]) {
        LOG_ERR("kv: read of layer %u position %u: not written", layer, pos);
        return ERR_RANGE;
    }
    if (pos / p->B < s->n_released) {
        LOG_ERR("kv: read of position %u: its block was released (sliding window)", pos);
        return ERR_RANGE;
    }
    const uint8_t *kd = kv__layer_k(p, s->table[pos / p->B], layer) +
                        (size_t)(pos % p->B) * p->row_bytes;
    const uint8_t *vd = kd + (size_t)p->B * p->row_bytes;
    if (dtype_is_kv8(p->cfg.dtype)) {
        const uint32_t hd = p->cfg.head_dim;
        for (uint32_t g = 0; g < p->cfg.n_kv_heads; g++) {
            float *kr = k + (size_t)g * hd, *vr = v + (size_t)g * hd;
            kern_kv8_dequant(p->cfg.dtype, kd + g * p->head_bytes, kr, hd);
            kern_kv8_dequant(p->cfg.dtype, vd + g * p->head_bytes, vr, hd);
            if (p->rotate) {
                kern_kv_unrotate(kr, hd);
                kern_kv_unrotate(vr, hd);
            }
        }
        return 0;
    }
    for (uint32_t i = 0; i < p->kv_dim; i++) {
        uint16_t h;
        switch (p->cfg.dtype) {
        case DT_F32:
            memcpy(&k[i], kd + 4 * (size_t)i, 4);
            memcpy(&v[i], vd + 4 * (size_t)i, 4);
            break;
        case DT_F16:
            memcpy(&h, kd + 2 * (size_t)i, 2);
            k[i] = half_f16_to_f32(h);
            memcpy(&h, vd + 2 * (size_t)i, 2);
            v[i] = half_f16_to_f32(h);
            break;
        default:
            memcpy(&h, kd + 2 * (size_t)i, 2);
            k[i] = half_bf16_to_f32(h);
            memcpy(&h, vd + 2 * (size_t)i, 2);
            v[i] = half_bf16_to_f32(h);
            break;
        }
    }
    return 0;
}
