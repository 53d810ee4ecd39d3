/*
 * fuzz_kv_snapshot.c — the KV snapshot reader (kv_snapshot_restore_mem) on arbitrary bytes.
 *
 * Two kinds of input:
 *  - a snapshot file as is (anything not starting with "RAW!"): exercises the header checks,
 *    zstd framing, truncation and checksums;
 *  - "RAW!" u32 n_records, then uncompressed record bytes: the harness writes a correct
 *    header for the fuzz pool, gives every whole record a valid checksum and compresses the
 *    payload, so mutations reach the record semantics (parents, depths, tenants, duplicate
 *    keys, record counts) that checksums would otherwise hide from a fuzzer.
 * Whatever the input, the pool must stay consistent (kv_pool_validate), a rejected snapshot
 * must leave it empty, and an accepted one must hold exactly the blocks it reports, usable by
 * sequences (filling the pool evicts every restored block through the LRU list).
 */
#include "fuzz.h"

#include "kv_snapshot_config.h"

#include "kv_internal.h"
#include "log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The file a "RAW!" input stands for; malloc'd, NULL if out of memory. */
static uint8_t *build_file(const struct kv_pool *p, const uint8_t *data, size_t size,
                           size_t *len)
{
    const struct kv_config *c = kv_pool_config(p);
    struct kv_metrics m;
    kv_pool_metrics(p, &m);
    size_t rb = KV__SNAP_REC_HEAD + (size_t)c->block_tokens * 4 + m.block_bytes;
    uint32_t n_records;
    memcpy(&n_records, data + 4, 4);
    size_t plen = size - 8;
    uint8_t *payload = malloc(plen ? plen : 1);
    size_t cap = ZSTD_compressBound(plen);
    uint8_t *out = malloc(KV__SNAP_HEADER_BYTES + cap);
    if (!payload || !out) {
        free(payload);
        free(out);
        return NULL;
    }
    memcpy(payload, data + 8, plen);
    for (size_t off = 0; off + rb <= plen; off += rb) {
        uint8_t *r = payload + off;
        uint64_t sum = kv__hash64(r + KV__SNAP_REC_HEAD, rb - KV__SNAP_REC_HEAD,
                                  kv__hash64(r, 24, KV__SNAP_SEED_RECORD));
        memcpy(r + 24, &sum, 8);
    }
    uint8_t *h = out;
    uint32_t u32[] = {KV__SNAP_VERSION, KV__SNAP_HEADER_BYTES};
    uint32_t dims[] = {(uint32_t)c->dtype, c->block_tokens, c->n_layers, c->n_kv_heads,
                       c->head_dim, n_records};
    uint64_t fp = FUZZ_KV_FINGERPRINT, rb64 = rb;
    memcpy(h, KV__SNAP_MAGIC, 8);
    memcpy(h + 8, u32, 8);
    memcpy(h + 16, &fp, 8);
    memcpy(h + 24, dims, 24);
    memcpy(h + 48, &rb64, 8);
    uint64_t hsum = kv__hash64(h, 56, KV__SNAP_SEED_HEADER);
    memcpy(h + 56, &hsum, 8);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    size_t z = cc ? ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1) : 1;
    if (cc && !ZSTD_isError(z))
        z = ZSTD_compress2(cc, out + KV__SNAP_HEADER_BYTES, cap, payload, plen);
    ZSTD_freeCCtx(cc);
    free(payload);
    if (!cc || ZSTD_isError(z)) {
        free(out);
        return NULL;
    }
    *len = KV__SNAP_HEADER_BYTES + z;
    return out;
}

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
    uint8_t *file = NULL;
    size_t len = size;
    if (size >= 8 && memcmp(data, "RAW!", 4) == 0) {
        file = build_file(p, data, size, &len);
        if (!file) {
            kv_pool_destroy(p);
            return 0;
        }
    }
    uint32_t n = 0;
    int rc = kv_snapshot_restore_mem(p, file ? file : data, len, "fuzz input",
                                     FUZZ_KV_FINGERPRINT, &n);
    free(file);
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
