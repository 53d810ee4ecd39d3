/*
 * fuzz_kv_snapshot.c — the KV snapshot reader (kv_snapshot_restore_mem) on arbitrary bytes.
 * Whatever the input, the pool must stay consistent (kv_pool_validate), a rejected snapshot
 * must leave it empty, and an accepted one must hold exactly the blocks it reports, usable
 * by sequences (filling the pool evicts every restored block through the LRU list).
 */
#include "kv_snapshot_config.h"

#include "log.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        log_set_level(LOG_LEVEL_ERROR); /* rejected snapshots warn; that is expected here */
        quiet = 1;
    }
    struct kv_config c = fuzz_kv_config();
    struct kv_pool *p;
    if (kv_pool_create(&c, &p) != 0)
        abort();
    uint32_t n = 0;
    int rc = kv_snapshot_restore_mem(p, data, size, "fuzz input", FUZZ_KV_FINGERPRINT, &n);
    if (kv_pool_validate(p) != 0)
        abort();
    struct kv_metrics m;
    kv_pool_metrics(p, &m);
    if (rc != 0 && (n != 0 || m.blocks_free != m.blocks_total))
        abort();
    if (rc == 0) {
        if (m.blocks_cached != n || m.blocks_indexed != n || n > FUZZ_KV_BLOCKS)
            abort();
        struct kv_seq *s;
        if (kv_seq_create(p, 1, 0, &s) != 0 || kv_seq_reserve(s, 4 * FUZZ_KV_BLOCKS) != 0)
            abort();
        if (kv_pool_validate(p) != 0)
            abort();
        kv_seq_destroy(s);
    }
    kv_pool_destroy(p);
    return 0;
}
