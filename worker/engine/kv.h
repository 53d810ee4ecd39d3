/*
 * kv.h — the paged KV cache of the serving engine: a block pool sized by a memory budget,
 * per-sequence block tables, reference counting with copy-on-write, prefix reuse across
 * requests (per tenant and adapter set) with LRU eviction, attention over the paged cache and
 * snapshot persistence of the hottest prefixes. docs/KV.md explains the design choices.
 *
 * Storage. The pool is one arena of equal blocks. A block holds B consecutive positions
 * (block_tokens, default 16) of ONE sequence for EVERY layer, both K and V:
 *     block: [n_layers][2][B][n_kv_heads*head_dim]     (index 0 = K, 1 = V)
 * in the pool's element type (f32, f16, bf16, or 8-bit: each head's slice of a row is then
 * head_dim int8/E4M3 codes and an f32 scale, written after a Walsh-Hadamard rotation of the
 * head that attention undoes; kern.h "8-bit KV cache rows"), so the rows attention reads for one layer of
 * one block are one contiguous span, and prefix sharing, reference counts and eviction act on
 * one unit per B tokens (not per layer).
 *
 * Writing a step (the scheduler's view):
 *     kv_seq_reserve(s, n)          room for positions [len, len+n): may allocate, may copy a
 *                                   shared partial block (COW); ERR_OVERLOADED when the pool
 *                                   cannot provide the blocks even after evicting cached ones;
 *                                   all-or-nothing, the sequence is unchanged on failure
 *     per layer l:
 *       kv_seq_write(s, l, k, v, n) append n K/V rows of layer l (never allocates)
 *       kv_attn_decode/prefill      attend over the rows written so far for layer l
 *     kv_seq_commit(s, tokens, n)   the n positions become part of the sequence; blocks that
 *                                   became full enter the prefix index
 * A new request first calls kv_seq_attach_prefix() to reuse cached whole blocks.
 *
 * Prefix keys. A full block is keyed by (tenant, adapter set, every token id from position 0 to
 * the block's end). The index hashes a chain (the previous block's hash and this block's
 * tokens) and verifies every hit exactly: same tenant and adapter set, same depth, same token
 * ids, and a parent link to the very block (id and generation) that matched the previous
 * block — by induction the whole prefix is compared, a hash alone is never trusted.
 *
 * NOTES (threads and ownership): a pool and its sequences belong to one thread, the engine's
 * owner thread; every call that changes them (all but the read-only ones) must come from it.
 * kv_attn_* and kv_seq_read only read: any number of threads may run them concurrently (for
 * different heads or sequences) while no mutating call runs. Sequences hold references to
 * blocks, so every sequence must be destroyed before its pool. Callers never keep pointers
 * into blocks across calls: commit may swap a block for an identical cached one.
 */
#ifndef CLOCHER_WORKER_KV_H
#define CLOCHER_WORKER_KV_H

#include "dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_BLOCK_TOKENS_DEFAULT 16u
#define KV_BLOCK_TOKENS_MAX 256u
#define KV_LAYERS_MAX 1024u
#define KV_HEADS_MAX 1024u
#define KV_HEAD_DIM_MAX 256u      /* attention converts rows into fixed stack tiles */
#define KV_SEQ_TOKENS_MAX (1u << 24) /* positions per sequence */
#define KV_NONE UINT32_MAX        /* no block */

struct kv_config {
    uint32_t n_layers;       /* 1..KV_LAYERS_MAX */
    uint32_t n_kv_heads;     /* 1..KV_HEADS_MAX */
    uint32_t head_dim;       /* 1..KV_HEAD_DIM_MAX */
    uint32_t block_tokens;   /* B, 1..KV_BLOCK_TOKENS_MAX; 0 = KV_BLOCK_TOKENS_DEFAULT */
    enum dtype dtype;        /* DT_F32, DT_F16, DT_BF16, DT_KV_I8 or DT_KV_E4M3 (docs/KV.md) */
    uint64_t budget_bytes;   /* block storage; the pool holds floor(budget / block bytes) */
    bool prefix_cache;       /* index full blocks for reuse; off: blocks are freed at once */
    /* Tests only: keep this many low bits of every chain hash (1..63) so that distinct
     * prefixes collide and exact verification is exercised; 0 = full 64-bit hashes. */
    uint32_t test_hash_bits;
    /* Tests and benchmarks only: store 8-bit rows without the Walsh-Hadamard rotation, to
     * measure what the rotation earns (docs/PERFORMANCE.md). Ignored for f32/f16/bf16. */
    bool kv8_no_rotate;
};

/*
 * Block states: used (referenced by at least one sequence; may also be indexed), cached
 * (unreferenced, indexed, on the LRU list, evicted when space is needed) or free.
 * total = used + cached + free.
 */
struct kv_metrics {
    uint64_t blocks_total, blocks_used, blocks_cached, blocks_free;
    uint64_t blocks_indexed;          /* prefix blocks findable by lookup (used or cached) */
    uint64_t block_bytes;             /* bytes of one block's K/V data */
    uint64_t hit_blocks, miss_blocks; /* kv_seq_attach_prefix: whole blocks found / not found */
    uint64_t hit_tokens, miss_tokens; /* tokens covered by hits / left to compute */
    uint64_t evictions;               /* cached blocks reclaimed for new data */
    uint64_t cow_copies;              /* shared partial blocks copied before a write */
    uint64_t alloc_failures;          /* kv_seq_reserve calls refused with ERR_OVERLOADED */
    uint64_t window_releases;         /* blocks let go by kv_seq_release_before */
};

struct kv_pool;
struct kv_seq;

/* ---- pool --------------------------------------------------------------------------------- */

/* Validates cfg (ERR_RANGE naming the field), allocates the arena and metadata (-ENOMEM). */
int kv_pool_create(const struct kv_config *cfg, struct kv_pool **out);
/* Every sequence must have been destroyed (CHECKed). NULL is a no-op. */
void kv_pool_destroy(struct kv_pool *p);
/* The configuration in effect (block_tokens resolved). */
const struct kv_config *kv_pool_config(const struct kv_pool *p);
void kv_pool_metrics(const struct kv_pool *p, struct kv_metrics *m);
/* Frees every cached (unreferenced) block; used blocks stay. */
void kv_pool_drop_cached(struct kv_pool *p);
/* References held on block `id` (tests and debugging). */
uint32_t kv_pool_block_ref(const struct kv_pool *p, uint32_t id);
/*
 * Checks every invariant (reference counts against the live sequences' tables, free and LRU
 * lists, the index, the counters): 0, or ERR_STATE with the first broken invariant logged.
 * O(blocks + table entries): for tests and debug builds, not the hot path.
 */
int kv_pool_validate(const struct kv_pool *p);

/* ---- sequences ---------------------------------------------------------------------------- */

/* An empty sequence of the given tenant and adapter set (ids chosen by the caller). */
int kv_seq_create(struct kv_pool *p, uint64_t tenant, uint64_t adapter_set, struct kv_seq **out);
/* Releases the blocks (indexed ones become cached, the last block first so that a prefix's
 * tail is evicted before its head). NULL is a no-op. */
void kv_seq_destroy(struct kv_seq *s);
/*
 * A new sequence sharing every block of src (parallel sampling, beams): same tenant, adapter
 * set and length. src must have no reserved-but-uncommitted positions (ERR_STATE).
 */
int kv_seq_fork(struct kv_seq *src, struct kv_seq **out);
/*
 * For an empty sequence (ERR_STATE otherwise): finds the longest cached prefix of
 * tokens[0..n_tokens) in whole blocks of the same tenant and adapter set, attaches those
 * blocks and sets the length to *n_cached (a multiple of B). Counts hits and misses. To keep
 * at least one token to compute (its logits are needed), pass n_tokens = prompt length - 1.
 * With prefix_cache off, attaches nothing.
 */
int kv_seq_attach_prefix(struct kv_seq *s, const int32_t *tokens, size_t n_tokens,
                         uint32_t *n_cached);
/*
 * Makes positions [len, len+n) writable: allocates blocks, evicting cached ones if needed,
 * and copies the last block first if it is partial and shared. ERR_OVERLOADED (not logged:
 * the scheduler waits or preempts) when free + cached blocks are too few; ERR_RANGE past
 * KV_SEQ_TOKENS_MAX; -ENOMEM growing the table. Any failure leaves the sequence unchanged.
 */
int kv_seq_reserve(struct kv_seq *s, uint32_t n);
/*
 * Appends n rows of layer `layer` after the rows already written for it:
 * k, v: [n][n_kv_heads*head_dim] f32, converted to the pool dtype (8-bit: each head rotated,
 * then quantized with one scale per head and position). ERR_RANGE if the layer is
 * out of range or the rows exceed the reservation (nothing written then).
 */
int kv_seq_write(struct kv_seq *s, uint32_t layer, const float *k, const float *v, uint32_t n);
/*
 * Makes n reserved positions part of the sequence; tokens: [n] their ids. Every layer must
 * have rows for them (ERR_STATE naming the layer otherwise). With prefix_cache on, each
 * block that became full is indexed — or, if an identical block is already cached, the
 * sequence switches to that block and frees its own copy.
 */
int kv_seq_commit(struct kv_seq *s, const int32_t *tokens, uint32_t n);

/*
 * A sliding-window sequence lets go of its leading blocks that lie wholly before position
 * `pos` (no later query reads them: gpt-oss's sliding layers pass pos = len + 1 - window):
 * their table entries become KV_NONE and their references are dropped (an indexed block
 * becomes cached, so prefix reuse still finds it until it is evicted; others are freed). A
 * block is kept while the block after it is not yet full and committed, since indexing that
 * block links to it. Reading a released position (kv_seq_read, attention) is ERR_RANGE.
 * Returns the number of blocks released by this call.
 */
uint32_t kv_seq_release_before(struct kv_seq *s, uint32_t pos);
/* Leading entries released so far; kv_seq_n_blocks - this = blocks the sequence holds. */
uint32_t kv_seq_n_released(const struct kv_seq *s);

/* Blocks kv_seq_reserve(s, n) would take from the pool (new blocks plus a copy-on-write);
 * it succeeds when this is at most the pool's blocks_free + blocks_cached. For admission. */
uint32_t kv_seq_blocks_needed(const struct kv_seq *s, uint32_t n);

uint32_t kv_seq_len(const struct kv_seq *s);
/* The pool the sequence lives in. */
const struct kv_pool *kv_seq_pool(const struct kv_seq *s);
/* Rows written for a layer: len <= written <= len + reserved. */
uint32_t kv_seq_written(const struct kv_seq *s, uint32_t layer);
uint32_t kv_seq_n_blocks(const struct kv_seq *s);
/* Block id of the sequence's i-th block, KV_NONE past the end. */
uint32_t kv_seq_block(const struct kv_seq *s, uint32_t i);
/* Reads one position of one layer back as f32: k, v [n_kv_heads*head_dim] (8-bit: decoded
 * and rotated back). ERR_RANGE if the row was not written. Read-only. */
int kv_seq_read(const struct kv_seq *s, uint32_t layer, uint32_t pos, float *k, float *v);

/* ---- attention over the paged cache (kv_attn.c) ------------------------------------------ */

/*
 * Decode attention of one query position over positions [0, n_ctx) of one layer:
 *   out[h] = sum_t softmax_t(q[h] . K[t][g] / sqrt(head_dim)) V[t][g],
 *   g = h / (n_heads / n_kv_heads)   (grouped-query attention)
 * q: [n_heads][head_dim] f32, out: [n_heads][head_dim] f32. f32 accumulation, online softmax
 * with running-max subtraction. Only KV heads [kv_h0, kv_h1) and their query heads are
 * computed, so a thread pool can shard by head; (0, n_kv_heads) computes all.
 * n_ctx must be 1..kv_seq_written(s, layer). ERR_RANGE on bad arguments. Read-only.
 */
int kv_attn_decode(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t n_ctx,
                   const float *q, float *out, uint32_t kv_h0, uint32_t kv_h1);
/*
 * Causal attention for a chunk of n_q consecutive positions starting at pos0 (a prefill chunk
 * after a cached or computed prefix): query i sees positions [0, pos0 + i].
 * q: [n_q][n_heads][head_dim] f32, out: [n_q][n_heads][head_dim] f32.
 * pos0 + n_q must be <= kv_seq_written(s, layer). Same head sharding and errors as decode.
 */
int kv_attn_prefill(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t pos0,
                    uint32_t n_q, const float *q, float *out, uint32_t kv_h0, uint32_t kv_h1);
/*
 * kv_attn_prefill for gpt-oss: query i at position p = pos0 + i sees positions
 * [p - window + 1, p] (window 0: all of [0, p]), and sinks [n_heads] (or NULL) is one learned
 * logit per query head that joins each softmax unscaled and without a value row:
 *   out[h] = sum_t e^(s_t - M) V[t][g] / (sum_t e^(s_t - M) + e^(sinks[h] - M)).
 * Blocks wholly before every query's window are not read. kv_attn_prefill = window 0, no sinks.
 */
int kv_attn_prefill_swa(const struct kv_seq *s, uint32_t layer, uint32_t n_heads, uint32_t pos0,
                        uint32_t n_q, const float *q, float *out, uint32_t kv_h0,
                        uint32_t kv_h1, uint32_t window, const float *sinks);

/* ---- snapshots (kv_snapshot.c) ------------------------------------------------------------ */

/*
 * Writes the hottest (most recently used) indexed blocks, at most max_blocks, to `path`
 * atomically: a checked header (magic, version, model fingerprint, dtype, block and head
 * dimensions) then a zstd frame (with content checksum) of records (key + K/V bytes, each with
 * its own 64-bit checksum), parents before children. A block is saved only with its whole
 * chain of ancestors. The format is in docs/KV.md.
 */
int kv_snapshot_save(const struct kv_pool *p, const char *path, uint64_t model_fingerprint,
                     uint32_t max_blocks, uint32_t *n_saved);
/*
 * Re-inserts a snapshot's blocks as cached blocks into a pool that has no sequences and no
 * indexed blocks (ERR_STATE otherwise); with prefix_cache off it restores nothing and
 * returns 0. If there are more records than the pool holds, the first ones (shallowest,
 * hottest) are kept. A missing file is -ENOENT (logged as info). A corrupt, truncated or
 * mismatched file (other model, dtype or dims) is never trusted: it is rejected with a
 * LOG_WARN naming the reason, the pool is left empty and consistent, and the code is
 * ERR_FORMAT / ERR_TRUNCATED / ERR_MISMATCH / ERR_UNSUPPORTED (-errno if reading fails).
 */
int kv_snapshot_restore(struct kv_pool *p, const char *path, uint64_t model_fingerprint,
                        uint32_t *n_restored);
/* The same from memory; `name` labels the bytes in messages (the fuzz harness uses it). */
int kv_snapshot_restore_mem(struct kv_pool *p, const void *buf, size_t len, const char *name,
                            uint64_t model_fingerprint, uint32_t *n_restored);

#endif
