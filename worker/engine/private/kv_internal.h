/*
 * kv_internal.h — the KV cache's data structures, shared by kv.c (pool, sequences, prefix
 * index), kv_attn.c (attention) and kv_snapshot.c (persistence). Private to those files:
 * nothing outside the kv module includes it (the kv__ prefix marks module-private symbols).
 *
 * NOTES: single owner thread, see kv.h. Block ids are uint32_t indexes into the arrays below;
 * KV_NONE ends every list.
 */
#ifndef CLOCHER_WORKER_KV_INTERNAL_H
#define CLOCHER_WORKER_KV_INTERNAL_H

#include "kv.h"

#include <stddef.h>
#include <stdint.h>

/* Token ids and K/V elements are hashed and stored in snapshots in host order. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kv: the hashes and the snapshot format assume a little-endian host"
#endif

struct kv_block {
    uint32_t ref;          /* table entries of live sequences that name this block */
    uint32_t gen;          /* bumped whenever the block leaves the index: stale links die */
    uint32_t lru_prev;     /* cached blocks only: doubly linked, head = least recently used */
    uint32_t lru_next;
    uint32_t hnext;        /* indexed blocks only: next block in the same hash bucket */
    /* the key, valid while indexed */
    uint32_t parent;       /* block holding the previous B tokens of the prefix, or KV_NONE */
    uint32_t parent_gen;   /* parent's gen when the link was made */
    uint32_t depth;        /* this block covers positions [depth*B, depth*B + B) */
    uint64_t hash;         /* chained hash of the key (masked by test_hash_bits) */
    uint64_t tenant;
    uint64_t adapter;
    uint64_t last_use;     /* pool clock at the last attach/commit/release: snapshot heat */
    uint8_t indexed;
};

struct kv_pool {
    struct kv_config cfg;  /* block_tokens resolved */
    uint32_t B;            /* tokens per block */
    uint32_t kv_dim;       /* n_kv_heads * head_dim */
    uint32_t n_blocks;
    size_t esize;          /* bytes per element (8-bit types: 1, plus a scale per head) */
    size_t head_bytes;     /* one head's slice of a row: head_dim * esize, or 8-bit codes
                              + scale (kern_kv8_head_bytes) */
    size_t row_bytes;      /* n_kv_heads * head_bytes: one position of K (or V) of one layer */
    int rotate;            /* 8-bit rows are stored rotated (kern_kv_rotate): not kv8_no_rotate */
    size_t layer_bytes;    /* 2 * B * row_bytes: K rows then V rows of one layer */
    size_t data_bytes;     /* n_layers * layer_bytes: a block's payload */
    size_t block_stride;   /* data_bytes rounded up to 64 */
    uint8_t *data;         /* [n_blocks][block_stride], mmap'd */
    size_t data_map_bytes;
    struct kv_block *blocks; /* [n_blocks] */
    int32_t *tokens;       /* [n_blocks][B] token ids of each block's positions */
    uint32_t *free_ids;    /* [n_blocks] stack of free blocks */
    uint32_t n_free;
    uint32_t lru_head, lru_tail, n_cached;
    uint32_t *buckets;     /* [bucket_mask + 1] heads of hash chains */
    uint64_t bucket_mask;
    uint64_t hash_mask;
    uint32_t n_indexed;
    uint64_t clock;
    struct kv_seq *seqs;   /* live sequences (doubly linked) */
    uint32_t n_seqs;
    struct kv_metrics ctr; /* counters only; the block counts are computed */
};

struct kv_seq {
    struct kv_pool *pool;
    struct kv_seq *prev, *next;
    uint64_t tenant, adapter;
    uint32_t len;          /* committed positions */
    uint32_t cap;          /* reserved positions: len <= cap <= n_table * B */
    uint32_t *table;       /* [table_cap] block ids, n_table used */
    uint32_t n_table, table_cap;
    uint32_t n_indexed;    /* leading full blocks already offered to the index */
    uint32_t n_released;   /* leading entries released (kv_seq_release_before): KV_NONE */
    uint32_t *written;     /* [n_layers] rows written per layer: len <= written <= cap */
};

/* Snapshot format constants (docs/KV.md), shared with the tests and the fuzz harness that
 * craft files with valid checksums. */
#define KV__SNAP_MAGIC "CLKVSNAP"
#define KV__SNAP_VERSION 1u
#define KV__SNAP_HEADER_BYTES 64u
#define KV__SNAP_REC_HEAD 32u
#define KV__SNAP_SEED_HEADER UINT64_C(0x6b76736e61706864)
#define KV__SNAP_SEED_RECORD UINT64_C(0x6b76736e61707263)

/* 64-bit hash of n bytes (four independent multiply-rotate lanes, then an avalanche). Used
 * for the prefix chain and the snapshot checksums; not cryptographic. */
uint64_t kv__hash64(const void *data, size_t n, uint64_t seed);

/* The chain hash of depth 0's parent: the tenant and adapter set alone. */
uint64_t kv__root_hash(const struct kv_pool *p, uint64_t tenant, uint64_t adapter);
/* hash(parent hash, tokens [B]), masked. */
uint64_t kv__chain_hash(const struct kv_pool *p, uint64_t parent_hash, const int32_t *tokens);

/* The finding half of the index: an indexed block with exactly this key, or KV_NONE. */
uint32_t kv__index_find(const struct kv_pool *p, uint64_t hash, uint64_t tenant,
                        uint64_t adapter, uint32_t depth, uint32_t parent, uint32_t parent_gen,
                        const int32_t *tokens);
/* Takes a free block, or evicts the least recently used cached one; KV_NONE if neither.
 * The block comes back with ref 0, not indexed. */
uint32_t kv__block_take(struct kv_pool *p);
/* Puts an unreferenced, unindexed block back on the free stack. */
void kv__block_free(struct kv_pool *p, uint32_t id);
/* Indexes block id under the given key (the caller wrote its tokens and data) and makes it a
 * cached block at the cold end of the LRU list (restore fills hottest first). */
void kv__index_insert_cold(struct kv_pool *p, uint32_t id, uint64_t hash, uint64_t tenant,
                           uint64_t adapter, uint32_t depth, uint32_t parent);

static inline uint8_t *kv__block_data(const struct kv_pool *p, uint32_t id)
{
    return p->data + (size_t)id * p->block_stride;
}

/* Layer l's K rows [B][kv_dim] of block id; its V rows follow at + B * row_bytes. */
static inline uint8_t *kv__layer_k(const struct kv_pool *p, uint32_t id, uint32_t layer)
{
    return kv__block_data(p, id) + (size_t)layer * p->layer_bytes;
}

/* The snapshot header's dtype word: the dtype, plus KV__SNAP_UNROTATED for 8-bit rows stored
 * without the rotation (they cannot be read by a rotating pool, nor the reverse). */
#define KV__SNAP_UNROTATED 0x100u
static inline uint32_t kv__snap_dtype(const struct kv_pool *p)
{
    return (uint32_t)p->cfg.dtype | (dtype_is_kv8(p->cfg.dtype) && !p->rotate ? KV__SNAP_UNROTATED : 0);
}

static inline int32_t *kv__block_tokens(const struct kv_pool *p, uint32_t id)
{
    return p->tokens + (size_t)id * p->B;
}

#endif
