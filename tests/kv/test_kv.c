/*
 * test_kv.c — the KV block pool and sequences: configuration checks, alloc/append/free, pool
 * exhaustion, misuse errors, reference counts with sharing, copy-on-write, prefix reuse
 * (hits, misses, tenant and adapter-set isolation, dedup), LRU eviction order and hash
 * collision safety. Every test ends with kv_pool_validate().
 */
#include "kvtest.h"

#include "err.h"
#include "rng.h"

#include <stdlib.h>
#include <string.h>

static void test_config_rejected(void **state)
{
    (void)state;
    struct kv_pool *p = (struct kv_pool *)1;
    struct kv_config c = kt_config(16, DT_F32, 4, true);

    c.n_layers = 0;
    tu_log_capture_begin();
    assert_int_equal(kv_pool_create(&c, &p), ERR_RANGE);
    tu_assert_log_contains("n_layers", "out of range", NULL);
    assert_null(p);

    c = kt_config(16, DT_F32, 4, true);
    c.head_dim = KV_HEAD_DIM_MAX + 1;
    assert_int_equal(kv_pool_create(&c, &p), ERR_RANGE);
    tu_assert_log_contains("head_dim", NULL);

    c = kt_config(16, DT_F32, 4, true);
    c.block_tokens = KV_BLOCK_TOKENS_MAX + 1;
    assert_int_equal(kv_pool_create(&c, &p), ERR_RANGE);
    tu_assert_log_contains("block_tokens", NULL);

    c = kt_config(16, DT_F32, 4, true);
    c.dtype = DT_Q8_0;
    assert_int_equal(kv_pool_create(&c, &p), ERR_RANGE);
    tu_assert_log_contains("dtype q8_0", NULL);

    c = kt_config(16, DT_F32, 4, true);
    c.budget_bytes = 100;
    assert_int_equal(kv_pool_create(&c, &p), ERR_RANGE);
    tu_assert_log_contains("budget_bytes = 100", "holds no block", NULL);
    tu_log_capture_end();

    /* block_tokens 0 means the default */
    c = kt_config(KV_BLOCK_TOKENS_DEFAULT, DT_BF16, 3, false);
    c.block_tokens = 0;
    p = kt_pool(&c);
    assert_int_equal(kv_pool_config(p)->block_tokens, KV_BLOCK_TOKENS_DEFAULT);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_total, 3);
    assert_int_equal(m.blocks_free, 3);
    assert_int_equal(m.block_bytes, 2 * 2 * 16 * 16 * 2); /* layers x K,V x B x dim x bf16 */
    kv_pool_destroy(p);
}

static void test_alloc_append_free(void **state)
{
    (void)state;
    enum dtype dts[] = {DT_F32, DT_F16, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    for (size_t d = 0; d < 5; d++) {
        struct kv_config c = kt_config(16, dts[d], 8, false);
        struct kv_pool *p = kt_pool(&c);
        struct kv_seq *s;
        int32_t tok[40];
        kt_tokens(tok, 40, 1);
        assert_int_equal(kv_seq_create(p, 1, 0, &s), 0);
        /* a prefill chunk, then decode steps one token at a time */
        assert_int_equal(kt_append(s, tok, 30), 0);
        for (uint32_t i = 30; i < 40; i++)
            assert_int_equal(kt_append(s, tok + i, 1), 0);
        assert_int_equal(kv_seq_len(s), 40);
        assert_int_equal(kv_seq_n_blocks(s), 3);
        kt_check_rows(s, tok, 0, 40);
        struct kv_metrics m = kt_valid(p);
        assert_int_equal(m.blocks_used, 3);
        assert_int_equal(m.blocks_free, 5);
        assert_int_equal(m.blocks_cached, 0);
        kv_seq_destroy(s);
        m = kt_valid(p);
        assert_int_equal(m.blocks_free, 8);
        assert_int_equal(m.blocks_used, 0);
        kv_pool_destroy(p);
    }
}

static void test_exhaustion(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_F16, 4, false);
    struct kv_pool *p = kt_pool(&c);
    struct kv_seq *a, *b;
    int32_t tok[32];
    kt_tokens(tok, 32, 2);
    assert_int_equal(kv_seq_create(p, 1, 0, &a), 0);
    assert_int_equal(kv_seq_create(p, 1, 0, &b), 0);
    assert_int_equal(kt_append(a, tok, 10), 0); /* 3 blocks */
    assert_int_equal(kt_append(b, tok, 2), 0);  /* 1 block: the pool is full */

    /* b needs a second block: refused, b unchanged and still usable */
    assert_int_equal(kv_seq_blocks_needed(b, 3), 1);
    assert_int_equal(kv_seq_reserve(b, 3), ERR_OVERLOADED);
    assert_int_equal(kv_seq_len(b), 2);
    assert_int_equal(kv_seq_n_blocks(b), 1);
    /* what fits in the current block is still fine */
    assert_int_equal(kt_append(b, tok + 2, 2), 0);
    assert_int_equal(kt_append(b, tok + 4, 1), ERR_OVERLOADED);
    /* a large request is all-or-nothing */
    assert_int_equal(kv_seq_reserve(a, 30), ERR_OVERLOADED);
    assert_int_equal(kv_seq_n_blocks(a), 3);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.alloc_failures, 3);
    assert_int_equal(m.blocks_free, 0);
    assert_int_equal(m.blocks_used, 4);

    /* freeing a returns its blocks; b proceeds */
    kv_seq_destroy(a);
    m = kt_valid(p);
    assert_int_equal(m.blocks_free, 3);
    assert_int_equal(kt_append(b, tok + 4, 12), 0);
    assert_int_equal(kv_seq_len(b), 16);
    kt_check_rows(b, tok, 0, 16);
    m = kt_valid(p);
    assert_int_equal(m.blocks_free, 0);

    /* the position limit is an error of its own */
    tu_log_capture_begin();
    assert_int_equal(kv_seq_reserve(b, KV_SEQ_TOKENS_MAX), ERR_RANGE);
    tu_assert_log_contains("exceeds the", "position limit", NULL);
    tu_log_capture_end();
    kv_seq_destroy(b);
    kt_valid(p);
    kv_pool_destroy(p);
}

static void test_misuse(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_F32, 8, true);
    struct kv_pool *p = kt_pool(&c);
    struct kv_seq *s, *f;
    int32_t tok[8];
    kt_tokens(tok, 8, 3);
    float k[16 * 8] = {0}, v[16 * 8] = {0};
    assert_int_equal(kv_seq_create(p, 1, 0, &s), 0);
    tu_log_capture_begin();
    /* writing without a reservation */
    assert_int_equal(kv_seq_write(s, 0, k, v, 1), ERR_RANGE);
    tu_assert_log_contains("exceeds the reservation", NULL);
    assert_int_equal(kv_seq_reserve(s, 3), 0);
    assert_int_equal(kv_seq_write(s, 2, k, v, 1), ERR_RANGE);
    tu_assert_log_contains("layer 2 of a 2-layer cache", NULL);
    assert_int_equal(kv_seq_write(s, 0, k, v, 4), ERR_RANGE);
    assert_int_equal(kv_seq_written(s, 0), 0);
    assert_int_equal(kv_seq_write(s, 0, k, v, 3), 0);
    /* layer 1 not written: commit refused, naming the layer */
    assert_int_equal(kv_seq_commit(s, tok, 3), ERR_STATE);
    tu_assert_log_contains("layer 1 has only 0 rows", NULL);
    assert_int_equal(kv_seq_commit(s, tok, 4), ERR_RANGE);
    /* reading a row never written */
    assert_int_equal(kv_seq_read(s, 1, 0, k, v), ERR_RANGE);
    tu_assert_log_contains("not written", NULL);
    /* forking with uncommitted reservations */
    assert_int_equal(kv_seq_fork(s, &f), ERR_STATE);
    tu_assert_log_contains("reserved uncommitted", NULL);
    assert_int_equal(kv_seq_write(s, 1, k, v, 3), 0);
    assert_int_equal(kv_seq_commit(s, tok, 3), 0);
    /* prefix lookup on a sequence that has blocks */
    uint32_t n;
    assert_int_equal(kv_seq_attach_prefix(s, tok, 8, &n), ERR_STATE);
    tu_assert_log_contains("already holds", NULL);
    tu_log_capture_end();
    kt_valid(p);
    kv_seq_destroy(s);
    kv_pool_destroy(p);
}

static void test_fork_refcounts(void **state)
{
    (void)state;
    struct kv_config c = kt_config(8, DT_F16, 16, false);
    struct kv_pool *p = kt_pool(&c);
    struct kv_seq *a, *b, *d;
    int32_t tok[20];
    kt_tokens(tok, 20, 4);
    assert_int_equal(kv_seq_create(p, 1, 0, &a), 0);
    assert_int_equal(kt_append(a, tok, 20), 0); /* 2 full blocks + 4 rows */
    assert_int_equal(kv_seq_fork(a, &b), 0);
    assert_int_equal(kv_seq_fork(b, &d), 0);
    assert_int_equal(kv_seq_len(d), 20);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(kv_seq_block(b, i), kv_seq_block(a, i));
        assert_int_equal(kv_pool_block_ref(p, kv_seq_block(a, i)), 3);
    }
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_used, 3);
    kt_check_rows(d, tok, 0, 20);
    kv_seq_destroy(a);
    assert_int_equal(kv_pool_block_ref(p, kv_seq_block(b, 0)), 2);
    kv_seq_destroy(d);
    assert_int_equal(kv_pool_block_ref(p, kv_seq_block(b, 0)), 1);
    m = kt_valid(p);
    assert_int_equal(m.blocks_used, 3);
    kv_seq_destroy(b);
    m = kt_valid(p);
    assert_int_equal(m.blocks_free, 16);
    kv_pool_destroy(p);
}

static void test_cow_partial_block(void **state)
{
    (void)state;
    enum dtype dts[] = {DT_F32, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    for (size_t di = 0; di < 4; di++) {
        struct kv_config c = kt_config(8, dts[di], 16, false);
        struct kv_pool *p = kt_pool(&c);
        struct kv_seq *a, *b;
        int32_t ta[24], tb[24];
        kt_tokens(ta, 24, 5);
        memcpy(tb, ta, sizeof tb);
        tb[20] = ta[20] + 1; /* the two continuations differ */
        tb[21] = ta[21] + 1;
        assert_int_equal(kv_seq_create(p, 1, 0, &a), 0);
        assert_int_equal(kt_append(a, ta, 20), 0);
        assert_int_equal(kv_seq_fork(a, &b), 0);
        uint32_t shared_partial = kv_seq_block(a, 2);

        /* b writes into the shared partial block: it gets its own copy first */
        assert_int_equal(kv_seq_blocks_needed(b, 2), 1);
        assert_int_equal(kv_seq_blocks_needed(b, 5), 2);
        assert_int_equal(kv_seq_blocks_needed(b, 0), 0);
        assert_int_equal(kt_append(b, tb + 20, 2), 0);
        assert_int_equal(kv_seq_blocks_needed(b, 2), 0);
        struct kv_metrics m = kt_valid(p);
        assert_int_equal(m.cow_copies, 1);
        assert_int_not_equal(kv_seq_block(b, 2), shared_partial);
        assert_int_equal(kv_seq_block(a, 2), shared_partial);
        assert_int_equal(kv_pool_block_ref(p, shared_partial), 1);
        assert_int_equal(kv_pool_block_ref(p, kv_seq_block(a, 0)), 2); /* full: still shared */
        /* a now owns the original alone: appending needs no copy */
        assert_int_equal(kt_append(a, ta + 20, 4), 0);
        m = kt_valid(p);
        assert_int_equal(m.cow_copies, 1);
        assert_int_equal(kv_seq_block(a, 2), shared_partial);
        /* neither saw the other's rows; the copied prefix rows are intact */
        kt_check_rows(a, ta, 0, 24);
        kt_check_rows(b, tb, 0, 22);
        assert_int_equal(m.blocks_used, 4);
        kv_seq_destroy(a);
        kv_seq_destroy(b);
        m = kt_valid(p);
        assert_int_equal(m.blocks_free, 16);
        kv_pool_destroy(p);
    }
}

static void test_cow_needs_a_block(void **state)
{
    (void)state;
    /* a full pool cannot copy: the writer gets ERR_OVERLOADED and the sharing is untouched */
    struct kv_config c = kt_config(4, DT_F32, 2, false);
    struct kv_pool *p = kt_pool(&c);
    struct kv_seq *a, *b;
    int32_t tok[8];
    kt_tokens(tok, 8, 6);
    assert_int_equal(kv_seq_create(p, 1, 0, &a), 0);
    assert_int_equal(kt_append(a, tok, 6), 0);
    assert_int_equal(kv_seq_fork(a, &b), 0);
    assert_int_equal(kv_seq_reserve(b, 1), ERR_OVERLOADED);
    assert_int_equal(kv_pool_block_ref(p, kv_seq_block(a, 1)), 2);
    kt_valid(p);
    kv_seq_destroy(a); /* now b holds the partial block alone: no copy needed */
    assert_int_equal(kt_append(b, tok + 6, 2), 0);
    kt_check_rows(b, tok, 0, 8);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.cow_copies, 0);
    kv_seq_destroy(b);
    kv_pool_destroy(p);
}

/* Builds a sequence of tokens[0..n) for (tenant, adapter) and destroys it: its full blocks
 * stay cached. */
static void cache_prefix(struct kv_pool *p, uint64_t tenant, uint64_t adapter,
                         const int32_t *tokens, uint32_t n)
{
    struct kv_seq *s;
    assert_int_equal(kv_seq_create(p, tenant, adapter, &s), 0);
    uint32_t got;
    assert_int_equal(kv_seq_attach_prefix(s, tokens, n, &got), 0);
    assert_int_equal(kt_append(s, tokens + got, n - got), 0);
    kv_seq_destroy(s);
}

/* Attaches the longest cached prefix of tokens[0..n) and returns its length in tokens;
 * checks the attached rows and that the rest can be appended. */
static uint32_t lookup(struct kv_pool *p, uint64_t tenant, uint64_t adapter,
                       const int32_t *tokens, uint32_t n)
{
    struct kv_seq *s;
    uint32_t got;
    assert_int_equal(kv_seq_create(p, tenant, adapter, &s), 0);
    assert_int_equal(kv_seq_attach_prefix(s, tokens, n, &got), 0);
    assert_int_equal(kv_seq_len(s), got);
    kt_check_rows(s, tokens, 0, got);
    kv_seq_destroy(s);
    return got;
}

static void test_prefix_hits_and_misses(void **state)
{
    (void)state;
    struct kv_config c = kt_config(16, DT_F16, 32, true);
    struct kv_pool *p = kt_pool(&c);
    int32_t t[64], other[64];
    kt_tokens(t, 64, 7);
    memcpy(other, t, sizeof other);
    other[20] ^= 1; /* differs inside the second block */

    struct kv_seq *a;
    assert_int_equal(kv_seq_create(p, 10, 0, &a), 0);
    assert_int_equal(kt_append(a, t, 40), 0);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_indexed, 2); /* the two full blocks; the partial one is not */
    /* a second request while a still runs shares a's blocks */
    struct kv_seq *b;
    uint32_t got;
    assert_int_equal(kv_seq_create(p, 10, 0, &b), 0);
    assert_int_equal(kv_seq_attach_prefix(b, t, 39, &got), 0);
    assert_int_equal(got, 32);
    assert_int_equal(kv_seq_block(b, 0), kv_seq_block(a, 0));
    assert_int_equal(kv_seq_block(b, 1), kv_seq_block(a, 1));
    assert_int_equal(kv_pool_block_ref(p, kv_seq_block(a, 1)), 2);
    m = kt_valid(p);
    assert_int_equal(m.hit_blocks, 2);
    assert_int_equal(m.miss_blocks, 0);
    assert_int_equal(m.hit_tokens, 32);
    assert_int_equal(m.miss_tokens, 7);
    /* b continues on its own blocks after the shared prefix */
    assert_int_equal(kt_append(b, t + 32, 30), 0);
    kt_check_rows(b, t, 0, 62);
    kv_seq_destroy(a);
    kv_seq_destroy(b);
    m = kt_valid(p);
    assert_int_equal(m.blocks_cached, 3); /* blocks 0..2 of t; partial ones freed */
    assert_int_equal(m.blocks_used, 0);

    assert_int_equal(lookup(p, 10, 0, t, 64), 48);
    assert_int_equal(lookup(p, 10, 0, t, 47), 32); /* only whole blocks */
    assert_int_equal(lookup(p, 10, 0, other, 64), 16);
    assert_int_equal(lookup(p, 10, 0, t, 15), 0);
    m = kt_valid(p);
    assert_int_equal(m.hit_blocks, 2 + 3 + 2 + 1);
    assert_int_equal(m.miss_blocks, 0 + 1 + 0 + 3 + 0);
    assert_int_equal(m.hit_tokens, 32 + 48 + 32 + 16);
    assert_int_equal(m.miss_tokens, 7 + 16 + 15 + 48 + 15);
    kv_pool_destroy(p);
}

static void test_prefix_isolation(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_F32, 64, true);
    struct kv_pool *p = kt_pool(&c);
    int32_t t[16];
    kt_tokens(t, 16, 8);
    cache_prefix(p, 1, 100, t, 16);
    assert_int_equal(lookup(p, 1, 100, t, 16), 16);
    /* same tokens, another tenant: nothing, even with the same adapter set */
    assert_int_equal(lookup(p, 2, 100, t, 16), 0);
    /* same tenant, another adapter set (or the base model): nothing */
    assert_int_equal(lookup(p, 1, 101, t, 16), 0);
    assert_int_equal(lookup(p, 1, 0, t, 16), 0);
    /* each gets its own chain, and the first is still intact */
    cache_prefix(p, 2, 100, t, 16);
    cache_prefix(p, 1, 101, t, 8);
    assert_int_equal(lookup(p, 2, 100, t, 16), 16);
    assert_int_equal(lookup(p, 1, 101, t, 16), 8);
    assert_int_equal(lookup(p, 1, 100, t, 16), 16);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_indexed, 4 + 4 + 2);
    kv_pool_destroy(p);
}

static void test_prefix_cache_off(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_F32, 8, false);
    struct kv_pool *p = kt_pool(&c);
    int32_t t[16];
    kt_tokens(t, 16, 9);
    cache_prefix(p, 1, 0, t, 16);
    assert_int_equal(lookup(p, 1, 0, t, 16), 0);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_cached, 0);
    assert_int_equal(m.blocks_indexed, 0);
    assert_int_equal(m.blocks_free, 8);
    kv_pool_destroy(p);
}

static void test_dedup_on_commit(void **state)
{
    (void)state;
    /* two requests with the same prompt computed side by side: the second one's full block is
     * replaced by the first one's, its own copy freed */
    struct kv_config c = kt_config(4, DT_F16, 8, true);
    struct kv_pool *p = kt_pool(&c);
    int32_t t[6];
    kt_tokens(t, 6, 10);
    struct kv_seq *a, *b;
    assert_int_equal(kv_seq_create(p, 1, 0, &a), 0);
    assert_int_equal(kv_seq_create(p, 1, 0, &b), 0);
    assert_int_equal(kv_seq_reserve(a, 6), 0);
    assert_int_equal(kv_seq_reserve(b, 6), 0);
    assert_int_equal(kt_append(a, t, 6), 0);
    assert_int_equal(kt_append(b, t, 6), 0);
    assert_int_equal(kv_seq_block(a, 0), kv_seq_block(b, 0));
    assert_int_not_equal(kv_seq_block(a, 1), kv_seq_block(b, 1));
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_used, 3);
    assert_int_equal(m.blocks_indexed, 1);
    kt_check_rows(b, t, 0, 6);
    kv_seq_destroy(a);
    kv_seq_destroy(b);
    kv_pool_destroy(p);
}

static void test_lru_eviction_order(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_F32, 4, true);
    struct kv_pool *p = kt_pool(&c);
    int32_t x[4], y[4], z[4], n[12];
    kt_tokens(x, 4, 11);
    kt_tokens(y, 4, 12);
    kt_tokens(z, 4, 13);
    kt_tokens(n, 12, 14);
    cache_prefix(p, 1, 0, x, 4);
    cache_prefix(p, 1, 0, y, 4);
    cache_prefix(p, 1, 0, z, 4);
    /* use x again: the LRU order becomes y, z, x */
    assert_int_equal(lookup(p, 1, 0, x, 4), 4);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_cached, 3);
    assert_int_equal(m.blocks_free, 1);

    /* three blocks needed: the free one, then y, then z are taken; x survives */
    struct kv_seq *s;
    assert_int_equal(kv_seq_create(p, 1, 0, &s), 0);
    assert_int_equal(kv_seq_reserve(s, 12), 0);
    m = kt_valid(p);
    assert_int_equal(m.evictions, 2);
    assert_int_equal(m.blocks_cached, 1);
    assert_int_equal(lookup(p, 1, 0, y, 4), 0);
    assert_int_equal(lookup(p, 1, 0, z, 4), 0);
    assert_int_equal(lookup(p, 1, 0, x, 4), 4);
    /* x is the last cached block: one more block evicts it, then the pool is exhausted */
    assert_int_equal(kv_seq_reserve(s, 16), 0);
    assert_int_equal(kv_seq_reserve(s, 17), ERR_OVERLOADED);
    m = kt_valid(p);
    assert_int_equal(m.evictions, 3);
    assert_int_equal(m.blocks_used, 4);
    assert_int_equal(lookup(p, 1, 0, x, 4), 0);
    kv_seq_destroy(s);
    kt_valid(p);
    kv_pool_destroy(p);
}

static void test_lru_evicts_chain_tail_first(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_F32, 4, true);
    struct kv_pool *p = kt_pool(&c);
    int32_t t[16];
    kt_tokens(t, 16, 15);
    cache_prefix(p, 1, 0, t, 16); /* four blocks, all cached */
    struct kv_seq *s[3];
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(kv_seq_create(p, 2, 0, &s[i]), 0);
        assert_int_equal(kv_seq_reserve(s[i], 4), 0); /* evicts one block: the deepest */
        assert_int_equal(lookup(p, 1, 0, t, 16), (3 - i) * 4);
        kt_valid(p);
    }
    for (uint32_t i = 0; i < 3; i++)
        kv_seq_destroy(s[i]);
    kt_valid(p);
    kv_pool_destroy(p);
}

static void test_hash_collisions(void **state)
{
    (void)state;
    /* With 1-bit hashes every other prefix collides: only the exact key comparison (tenant,
     * adapter set, depth, tokens, parent) keeps lookups right. Expected matches are computed
     * by brute force over the prefixes inserted. */
    struct kv_config c = kt_config(2, DT_F16, 256, true);
    c.test_hash_bits = 1;
    struct kv_pool *p = kt_pool(&c);
    enum { NP = 12, LEN = 8 };
    int32_t pre[NP][LEN];
    uint64_t ten[NP];
    for (int i = 0; i < NP; i++) {
        /* families sharing the first 2 or 4 tokens, so chains branch at several depths */
        kt_tokens(pre[i], LEN, 200 + (uint32_t)i);
        if (i % 3 != 0)
            memcpy(pre[i], pre[i - i % 3], (size_t)(i % 3) * 2 * sizeof(int32_t));
        /* the same tokens under another tenant */
        ten[i] = i % 4 == 3 ? 2 : 1;
        if (i % 4 == 3)
            memcpy(pre[i], pre[i - 1], sizeof pre[i]);
        cache_prefix(p, ten[i], 0, pre[i], LEN);
    }
    kt_valid(p);
    for (int q = 0; q < NP; q++) {
        for (uint64_t tenant = 1; tenant <= 2; tenant++) {
            uint32_t want = 0;
            for (int i = 0; i < NP; i++) {
                if (ten[i] != tenant)
                    continue;
                uint32_t k = 0;
                while (k < LEN && pre[i][k] == pre[q][k])
                    k++;
                k -= k % 2;
                if (k > want)
                    want = k;
            }
            assert_int_equal(lookup(p, tenant, 0, pre[q], LEN), want);
        }
    }
    /* a block whose hash collides with a cached one but whose tokens differ never matches */
    int32_t probe[LEN];
    int misses = 0;
    for (uint32_t seed = 0; seed < 16; seed++) {
        kt_tokens(probe, LEN, 900 + seed);
        misses += lookup(p, 1, 0, probe, LEN) == 0;
    }
    assert_int_equal(misses, 16);
    kt_valid(p);
    kv_pool_destroy(p);
}

static void test_drop_cached(void **state)
{
    (void)state;
    struct kv_config c = kt_config(4, DT_BF16, 8, true);
    struct kv_pool *p = kt_pool(&c);
    int32_t t[12];
    kt_tokens(t, 12, 16);
    struct kv_seq *s;
    assert_int_equal(kv_seq_create(p, 1, 0, &s), 0);
    assert_int_equal(kt_append(s, t, 12), 0);
    cache_prefix(p, 3, 0, t, 8);
    kv_pool_drop_cached(p);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_cached, 0);
    assert_int_equal(m.blocks_used, 3);
    assert_int_equal(m.blocks_indexed, 3); /* the running sequence's blocks stay indexed */
    kv_seq_destroy(s);
    m = kt_valid(p);
    assert_int_equal(m.blocks_cached, 3);
    kv_pool_destroy(p);
}

/*
 * Random operations against a model of what each sequence should hold: create (with prefix
 * lookup), append chunks (some refused when the pool is full), fork, destroy, over prompts
 * drawn from a few families under two tenants so prefixes, copies, dedup and evictions all
 * interleave. After every operation the pool's invariants hold and every live sequence reads
 * back exactly its own rows.
 */
struct model_seq {
    struct kv_seq *s;
    int32_t tok[96];
    uint32_t len;
};

static uint32_t rnd_u32(uint64_t *x) { return (uint32_t)(rng_xorshift64(x) >> 32); }

static void test_random_operations(void **state)
{
    (void)state;
    enum { LIVE = 8, OPS = 3000 };
    struct kv_config c = kt_config(4, DT_F16, 40, true);
    struct kv_pool *p = kt_pool(&c);
    struct model_seq live[LIVE];
    uint32_t n_live = 0, refused = 0;
    uint64_t x = 0x2545f4914f6cdd1dull;
    int32_t family[3][96];
    for (uint32_t f = 0; f < 3; f++)
        kt_tokens(family[f], 96, 300 + f);
    for (int op = 0; op < OPS; op++) {
        uint32_t kind = rnd_u32(&x) % 10, i = n_live ? rnd_u32(&x) % n_live : 0;
        if (kind < 2 && n_live < LIVE) {
            struct model_seq *m = &live[n_live];
            uint32_t f = rnd_u32(&x) % 3, plen = 1 + rnd_u32(&x) % 40, got;
            memcpy(m->tok, family[f], sizeof m->tok);
            m->tok[1 + rnd_u32(&x) % 60] ^= (int32_t)(rnd_u32(&x) % 2); /* sometimes diverge */
            assert_int_equal(kv_seq_create(p, 1 + f % 2, 0, &m->s), 0);
            assert_int_equal(kv_seq_attach_prefix(m->s, m->tok, plen - 1, &got), 0);
            assert_true(got <= plen - 1 && got % 4 == 0);
            m->len = got;
            n_live++;
        } else if (kind < 6 && n_live) {
            struct model_seq *m = &live[i];
            uint32_t n = 1 + rnd_u32(&x) % 9;
            if (m->len + n > 96)
                continue;
            if (rnd_u32(&x) % 4 == 0) /* decode-like tokens from a tiny alphabet: dedup */
                for (uint32_t t = 0; t < n; t++)
                    m->tok[m->len + t] = (int32_t)(rnd_u32(&x) % 2);
            int rc = kt_append(m->s, m->tok + m->len, n);
            if (rc == ERR_OVERLOADED) {
                refused++;
                assert_int_equal(kv_seq_len(m->s), m->len);
            } else {
                assert_int_equal(rc, 0);
                m->len += n;
            }
        } else if (kind < 7 && n_live && n_live < LIVE) {
            struct model_seq *m = &live[n_live];
            *m = live[i];
            assert_int_equal(kv_seq_fork(live[i].s, &m->s), 0);
            n_live++;
        } else if (n_live) {
            kv_seq_destroy(live[i].s);
            live[i] = live[--n_live];
        }
        kt_valid(p);
        for (uint32_t j = 0; j < n_live; j++) {
            assert_int_equal(kv_seq_len(live[j].s), live[j].len);
            if (op % 16 == 0)
                kt_check_rows(live[j].s, live[j].tok, 0, live[j].len);
        }
    }
    struct kv_metrics m = kt_valid(p);
    /* the mix really exercised every mechanism */
    assert_true(refused > 0 && m.evictions > 0 && m.cow_copies > 0 && m.hit_blocks > 0);
    while (n_live)
        kv_seq_destroy(live[--n_live].s);
    kt_valid(p);
    kv_pool_destroy(p);
}

/*
 * Sliding-window release (gpt-oss's sliding layers): a long sequence appended in chunks and
 * released to the window after each holds a bounded number of blocks; released positions
 * refuse reads and window-less attention; the window's rows are intact; a second sequence
 * with the same tokens still finds the whole prefix (released blocks were indexed: cached);
 * with the prefix cache off, released blocks are freed; a fork copies the released state.
 */
static void test_window_release(void **state)
{
    (void)state;
    for (int cache = 0; cache < 2; cache++) {
        const uint32_t B = 4, W = 6, N = 64;
        struct kv_config cfg = kt_config(B, DT_F32, 64, cache);
        struct kv_pool *p = kt_pool(&cfg);
        int32_t tok[64];
        kt_tokens(tok, N, 9);
        struct kv_seq *s;
        assert_int_equal(kv_seq_create(p, 1, 0, &s), 0);
        uint32_t max_held = 0;
        for (uint32_t pos = 0; pos < N; pos += 3) {
            uint32_t n = N - pos < 3 ? N - pos : 3;
            assert_int_equal(kt_append(s, tok + pos, n), 0);
            uint32_t len = kv_seq_len(s);
            if (len + 1 > W)
                kv_seq_release_before(s, len + 1 - W);
            uint32_t held = kv_seq_n_blocks(s) - kv_seq_n_released(s);
            max_held = held > max_held ? held : max_held;
            kt_valid(p);
        }
        /* W positions span at most ceil((W-1)/B) + 1 blocks, plus one kept as a parent */
        assert_true(max_held <= (W - 1 + B - 1) / B + 2);
        assert_true(kv_seq_n_released(s) >= N / B - 4);
        kt_check_rows(s, tok, N - W + 1, N);
        float k[16], v[16]; /* kt_config: 2 KV heads of 8 */
        assert_int_equal(kv_seq_read(s, 0, 0, k, v), ERR_RANGE);
        float q[16] = {0}, o[16]; /* 2 query heads of 8 */
        assert_int_equal(kv_attn_decode(s, 0, 2, N, q, o, 0, 2), ERR_RANGE);
        assert_int_equal(kv_attn_prefill_swa(s, 0, 2, N - 1, 1, q, o, 0, 2, W, NULL), 0);
        struct kv_metrics m = kt_valid(p);
        assert_int_equal(m.window_releases, kv_seq_n_released(s));
        if (cache)
            assert_true(m.blocks_cached >= kv_seq_n_released(s)); /* released, still indexed */
        else
            assert_int_equal(m.blocks_used, kv_seq_n_blocks(s) - kv_seq_n_released(s));
        struct kv_seq *f;
        assert_int_equal(kv_seq_fork(s, &f), 0);
        assert_int_equal(kv_seq_n_released(f), kv_seq_n_released(s));
        kv_seq_destroy(f);
        kv_seq_destroy(s);
        kt_valid(p);
        if (cache) { /* the whole chain is still found */
            struct kv_seq *t;
            uint32_t hit = 0;
            assert_int_equal(kv_seq_create(p, 1, 0, &t), 0);
            assert_int_equal(kv_seq_attach_prefix(t, tok, N - 1, &hit), 0);
            assert_int_equal(hit, (N - 1) / B * B);
            kt_check_rows(t, tok, 0, hit);
            kv_seq_destroy(t);
        }
        kt_valid(p);
        kv_pool_destroy(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_release),
        cmocka_unit_test(test_config_rejected),
        cmocka_unit_test(test_alloc_append_free),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_fork_refcounts),
        cmocka_unit_test(test_cow_partial_block),
        cmocka_unit_test(test_cow_needs_a_block),
        cmocka_unit_test(test_prefix_hits_and_misses),
        cmocka_unit_test(test_prefix_isolation),
        cmocka_unit_test(test_prefix_cache_off),
        cmocka_unit_test(test_dedup_on_commit),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_lru_evicts_chain_tail_first),
        cmocka_unit_test(test_hash_collisions),
        cmocka_unit_test(test_drop_cached),
        cmocka_unit_test(test_random_operations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
