/*
 * kv_snapshot_config.h — the KV cache shape the snapshot fuzz harness restores into. The seed
 * corpus (corpus/kv_snapshot/) is written for it by tests/kv/test_kv_snapshot.c
 * (CLOCHER_KV_WRITE_SEEDS=<dir>), which also checks that the valid seeds still restore.
 */
#ifndef CLOCHER_TESTS_FUZZ_KV_SNAPSHOT_CONFIG_H
#define CLOCHER_TESTS_FUZZ_KV_SNAPSHOT_CONFIG_H

#include "kv.h"

#define FUZZ_KV_FINGERPRINT UINT64_C(0x5eed5eed00c10c4e)
#define FUZZ_KV_BLOCKS 12u

static inline struct kv_config fuzz_kv_config(void)
{
    /* 2 layers x K,V x 4 tokens x 16 f16 elements = 512 bytes per block, 64-byte aligned */
    struct kv_config c = {
        .n_layers = 2,
        .n_kv_heads = 2,
        .head_dim = 8,
        .block_tokens = 4,
        .dtype = DT_F16,
        .budget_bytes = 512u * FUZZ_KV_BLOCKS,
        .prefix_cache = true,
    };
    return c;
}

#endif
