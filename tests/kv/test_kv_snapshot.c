/*
 * test_kv_snapshot.c — KV snapshots: save/restore round trips for every dtype, the hottest-N
 * selection with whole ancestor chains, restore into a smaller pool, and rejection (with a
 * warning naming the reason, leaving the pool empty and consistent) of mismatched, truncated,
 * corrupted and crafted files; atomic replacement on a failed save. Also writes the fuzz seed
 * corpus on request (CLOCHER_KV_WRITE_SEEDS=<dir>) and checks the committed valid seeds still
 * restore.
 */
#include "kvtest.h"

#include "err.h"
#include "fuzz/kv_snapshot_config.h"
#include "kv_internal.h" /* kv__hash64: to craft records with valid checksums */
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define FP UINT64_C(0x0123456789abcdef)
#define SEED_RECORD KV__SNAP_SEED_RECORD
#define SEED_HEADER KV__SNAP_SEED_HEADER

/* A set of prefixes with shared heads, several tenants and adapter sets (B = 4). */
struct prefix {
    uint64_t tenant, adapter;
    int32_t tok[20];
    uint32_t n;
};

static void make_prefixes(struct prefix *px, size_t *n_px)
{
    size_t n = 0;
    px[n] = (struct prefix){1, 0, {0}, 20};
    kt_tokens(px[n].tok, 20, 31);
    n++;
    px[n] = px[0]; /* branches after two blocks */
    kt_tokens(px[n].tok + 8, 12, 32);
    px[n].n = 16;
    n++;
    px[n] = px[0]; /* another tenant, same tokens */
    px[n].tenant = 2;
    px[n].n = 12;
    n++;
    px[n] = px[0]; /* same tenant, an adapter set */
    px[n].adapter = 7;
    px[n].n = 8;
    n++;
    px[n] = (struct prefix){1, 0, {0}, 7}; /* one full block and a partial one */
    kt_tokens(px[n].tok, 7, 33);
    n++;
    *n_px = n;
}

static void cache(struct kv_pool *p, const struct prefix *x)
{
    struct kv_seq *s;
    uint32_t got;
    assert_int_equal(kv_seq_create(p, x->tenant, x->adapter, &s), 0);
    assert_int_equal(kv_seq_attach_prefix(s, x->tok, x->n, &got), 0);
    assert_int_equal(kt_append(s, x->tok + got, x->n - got), 0);
    kv_seq_destroy(s);
}

static uint32_t lookup(struct kv_pool *p, const struct prefix *x)
{
    struct kv_seq *s;
    uint32_t got;
    assert_int_equal(kv_seq_create(p, x->tenant, x->adapter, &s), 0);
    assert_int_equal(kv_seq_attach_prefix(s, x->tok, x->n, &got), 0);
    kt_check_rows(s, x->tok, 0, got);
    kv_seq_destroy(s);
    return got;
}

static void assert_empty(const struct kv_pool *p)
{
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_free, m.blocks_total);
    assert_int_equal(m.blocks_indexed, 0);
}

/* Saves a pool holding make_prefixes() into dir/name; returns the file's bytes. */
static uint8_t *saved_file(const char *dir, const char *name, enum dtype dt, size_t *len,
                           uint32_t *n_saved)
{
    struct kv_config c = kt_config(4, dt, 64, true);
    struct kv_pool *p = kt_pool(&c);
    struct prefix px[8];
    size_t n_px;
    make_prefixes(px, &n_px);
    for (size_t i = 0; i < n_px; i++)
        cache(p, &px[i]);
    uint32_t n;
    assert_int_equal(kv_snapshot_save(p, tu_path(dir, name), FP, 1000, &n), 0);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(n, m.blocks_indexed);
    if (n_saved)
        *n_saved = n;
    kv_pool_destroy(p);
    return (uint8_t *)tu_read_file(tu_path(dir, name), len);
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    enum dtype dts[] = {DT_F32, DT_F16, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    for (size_t d = 0; d < 5; d++) {
        struct kv_config c = kt_config(4, dts[d], 64, true);
        struct kv_pool *a = kt_pool(&c), *b = kt_pool(&c);
        struct prefix px[8];
        size_t n_px;
        make_prefixes(px, &n_px);
        for (size_t i = 0; i < n_px; i++)
            cache(a, &px[i]);
        /* a running sequence's indexed blocks are saved too */
        struct kv_seq *run;
        uint32_t got;
        assert_int_equal(kv_seq_create(a, 1, 0, &run), 0);
        assert_int_equal(kv_seq_attach_prefix(run, px[0].tok, 20, &got), 0);
        uint32_t n_saved, n_restored;
        const char *path = tu_path(dir, "kv.snap");
        assert_int_equal(kv_snapshot_save(a, path, FP, 1000, &n_saved), 0);
        struct kv_metrics ma = kt_valid(a);
        assert_int_equal(n_saved, ma.blocks_indexed);
        assert_int_equal(n_saved, 5 + 2 + 3 + 2 + 1);

        assert_int_equal(kv_snapshot_restore(b, path, FP, &n_restored), 0);
        assert_int_equal(n_restored, n_saved);
        struct kv_metrics mb = kt_valid(b);
        assert_int_equal(mb.blocks_cached, n_saved);
        assert_int_equal(mb.blocks_indexed, n_saved);
        for (size_t i = 0; i < n_px; i++) {
            uint32_t want = px[i].n - px[i].n % 4;
            assert_int_equal(lookup(b, &px[i]), want); /* lookup checks every K/V row */
            assert_int_equal(lookup(a, &px[i]), want);
        }
        /* isolation survives the trip */
        struct prefix other = px[0];
        other.tenant = 9;
        assert_int_equal(lookup(b, &other), 0);
        kt_valid(b);
        kv_seq_destroy(run);
        kv_pool_destroy(a);
        kv_pool_destroy(b);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_hottest_with_ancestors(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    struct kv_config c = kt_config(4, DT_F16, 64, true);
    struct kv_pool *a = kt_pool(&c);
    struct prefix p1 = {1, 0, {0}, 8}, p2 = {1, 0, {0}, 8}, p3 = {1, 0, {0}, 8};
    kt_tokens(p1.tok, 8, 41);
    kt_tokens(p2.tok, 8, 42);
    kt_tokens(p3.tok, 8, 43);
    cache(a, &p1);
    cache(a, &p2);
    cache(a, &p3);
    assert_int_equal(lookup(a, &p1), 8); /* heat: p1 > p3 > p2; heads hotter than tails */
    const uint32_t maxes[] = {4, 3, 1, 0};
    const uint32_t want[][3] = {{8, 0, 8}, {8, 0, 4}, {4, 0, 0}, {0, 0, 0}};
    for (size_t i = 0; i < 4; i++) {
        uint32_t n_saved, n_restored;
        const char *path = tu_path(dir, "hot.snap");
        assert_int_equal(kv_snapshot_save(a, path, FP, maxes[i], &n_saved), 0);
        assert_int_equal(n_saved, maxes[i]);
        struct kv_pool *b = kt_pool(&c);
        assert_int_equal(kv_snapshot_restore(b, path, FP, &n_restored), 0);
        assert_int_equal(n_restored, maxes[i]);
        kt_valid(b);
        assert_int_equal(lookup(b, &p1), want[i][0]);
        assert_int_equal(lookup(b, &p2), want[i][1]);
        assert_int_equal(lookup(b, &p3), want[i][2]);
        kv_pool_destroy(b);
    }
    kv_pool_destroy(a);
    tu_rmtree(dir);
    free(dir);
}

static void test_restore_into_smaller_pool(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len;
    uint32_t n_saved, n;
    uint8_t *file = saved_file(dir, "big.snap", DT_F32, &len, &n_saved);
    struct kv_config c = kt_config(4, DT_F32, 5, true);
    struct kv_pool *p = kt_pool(&c);
    tu_log_capture_begin();
    assert_int_equal(kv_snapshot_restore_mem(p, file, len, "big.snap", FP, &n), 0);
    tu_assert_log_contains("5 of 13 records restored", NULL);
    tu_log_capture_end();
    assert_int_equal(n, 5);
    struct kv_metrics m = kt_valid(p);
    assert_int_equal(m.blocks_cached, 5);
    /* the shallowest blocks came first: every tenant's first block is there */
    struct prefix px[8];
    size_t n_px;
    make_prefixes(px, &n_px);
    for (size_t i = 0; i < n_px; i++)
        assert_true(lookup(p, &px[i]) >= 4);
    kt_valid(p);
    kv_pool_destroy(p);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

static void expect_rejected(struct kv_pool *p, const uint8_t *buf, size_t len, int code,
                            const char *needle)
{
    uint32_t n = 99;
    tu_log_capture_begin();
    int rc = kv_snapshot_restore_mem(p, buf, len, "test.snap", FP, &n);
    if (code != 0 && rc != code)
        fail_msg("expected %s, got %s; log:\n%s", err_name(code), err_name(rc),
                 tu_log_captured());
    assert_true(rc < 0);
    assert_int_equal(n, 0);
    if (needle)
        tu_assert_log_contains("test.snap ignored", needle, NULL);
    tu_log_capture_end();
    assert_empty(p);
}

static void test_mismatch_rejected(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len;
    uint8_t *file = saved_file(dir, "m.snap", DT_F16, &len, NULL);
    uint32_t n;

    struct kv_config c = kt_config(4, DT_F16, 64, true);
    struct kv_pool *p = kt_pool(&c);
    tu_log_capture_begin();
    assert_int_equal(kv_snapshot_restore_mem(p, file, len, "m.snap", FP + 1, &n), ERR_MISMATCH);
    tu_assert_log_contains("m.snap ignored", "fingerprint 0123456789abcdef", "0123456789abcdf0",
                           NULL);
    tu_log_capture_end();
    assert_empty(p);
    kv_pool_destroy(p);

    struct {
        struct kv_config c;
        const char *needle;
    } cases[5];
    cases[0].c = kt_config(4, DT_BF16, 64, true);
    cases[0].needle = "dtype is f16, this cache uses bf16";
    cases[1].c = kt_config(8, DT_F16, 64, true);
    cases[1].needle = "block_tokens is 4, this cache uses 8";
    cases[2].c = kt_config(4, DT_F16, 64, true);
    cases[2].c.n_layers = 3;
    cases[2].needle = "n_layers is 2, this cache uses 3";
    cases[3].c = kt_config(4, DT_F16, 64, true);
    cases[3].c.n_kv_heads = 4;
    cases[3].needle = "n_kv_heads is 2, this cache uses 4";
    cases[4].c = kt_config(4, DT_F16, 64, true);
    cases[4].c.head_dim = 16;
    cases[4].needle = "head_dim is 8, this cache uses 16";
    for (size_t i = 0; i < 5; i++) {
        cases[i].c.budget_bytes = 1u << 20;
        p = kt_pool(&cases[i].c);
        expect_rejected(p, file, len, ERR_MISMATCH, cases[i].needle);
        kv_pool_destroy(p);
    }
    free(file);
    tu_rmtree(dir);
    free(dir);
}

/* 8-bit caches: a round trip restores the stored bytes exactly (every row reads back bit for
 * bit), and a snapshot of rotated rows is refused by an unrotated pool and vice versa, as is
 * one of the other 8-bit type. */
static void test_kv8_exact_and_mismatch(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    const enum dtype dts[2] = {DT_KV_I8, DT_KV_E4M3};
    for (int d = 0; d < 2; d++) {
        for (int unrot = 0; unrot < 2; unrot++) {
            struct kv_config c = kt_config(4, dts[d], 64, true);
            c.kv8_no_rotate = unrot;
            struct kv_pool *a = kt_pool(&c), *b = kt_pool(&c);
            struct prefix px[8];
            size_t n_px;
            make_prefixes(px, &n_px);
            for (size_t i = 0; i < n_px; i++)
                cache(a, &px[i]);
            uint32_t n_saved, n_restored;
            const char *path = tu_path(dir, "kv8.snap");
            assert_int_equal(kv_snapshot_save(a, path, FP, 1000, &n_saved), 0);
            assert_int_equal(kv_snapshot_restore(b, path, FP, &n_restored), 0);
            assert_int_equal(n_restored, n_saved);
            struct kv_seq *sa, *sb;
            uint32_t ga, gb;
            assert_int_equal(kv_seq_create(a, 1, 0, &sa), 0);
            assert_int_equal(kv_seq_create(b, 1, 0, &sb), 0);
            assert_int_equal(kv_seq_attach_prefix(sa, px[0].tok, 20, &ga), 0);
            assert_int_equal(kv_seq_attach_prefix(sb, px[0].tok, 20, &gb), 0);
            assert_int_equal(ga, 20);
            assert_int_equal(gb, 20);
            for (uint32_t l = 0; l < c.n_layers; l++)
                for (uint32_t pos = 0; pos < 20; pos++) {
                    float ka[16], va[16], kb[16], vb[16];
                    assert_int_equal(kv_seq_read(sa, l, pos, ka, va), 0);
                    assert_int_equal(kv_seq_read(sb, l, pos, kb, vb), 0);
                    assert_memory_equal(ka, kb, sizeof ka);
                    assert_memory_equal(va, vb, sizeof va);
                }
            kv_seq_destroy(sa);
            kv_seq_destroy(sb);
            kv_pool_destroy(a);
            kv_pool_destroy(b);

            size_t len;
            uint8_t *file = (uint8_t *)tu_read_file(path, &len);
            struct kv_config o = c;
            o.kv8_no_rotate = !unrot;
            struct kv_pool *p = kt_pool(&o);
            expect_rejected(p, file, len, ERR_MISMATCH,
                            unrot    ? "(unrotated), this cache uses"
                            : d == 0 ? "this cache uses int8 (unrotated)"
                                     : "this cache uses fp8 (unrotated)");
            kv_pool_destroy(p);
            o = c;
            o.dtype = dts[1 - d];
            p = kt_pool(&o);
            expect_rejected(p, file, len, ERR_MISMATCH,
                            d == 0 ? "dtype is int8" : "dtype is fp8");
            kv_pool_destroy(p);
            free(file);
        }
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_truncated_rejected(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len;
    uint8_t *file = saved_file(dir, "t.snap", DT_BF16, &len, NULL);
    struct kv_config c = kt_config(4, DT_BF16, 64, true);
    struct kv_pool *p = kt_pool(&c);
    expect_rejected(p, file, 0, ERR_TRUNCATED, "shorter than the 64-byte header");
    expect_rejected(p, file, 63, ERR_TRUNCATED, "shorter than the 64-byte header");
    expect_rejected(p, file, 64, ERR_TRUNCATED, "truncated");
    for (size_t cut = 65; cut < len; cut += 1 + len / 300)
        expect_rejected(p, file, cut, ERR_TRUNCATED, "truncated");
    expect_rejected(p, file, len - 1, ERR_TRUNCATED, "truncated");
    /* the same through a real file */
    tu_write_file(tu_path(dir, "cut.snap"), file, len / 2);
    uint32_t n;
    tu_log_capture_begin();
    assert_int_equal(kv_snapshot_restore(p, tu_path(dir, "cut.snap"), FP, &n), ERR_TRUNCATED);
    tu_assert_log_contains("cut.snap ignored", "truncated", NULL);
    tu_log_capture_end();
    assert_empty(p);
    kv_pool_destroy(p);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

static void test_corruption_rejected(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len;
    uint8_t *file = saved_file(dir, "c.snap", DT_F16, &len, NULL);
    struct kv_config c = kt_config(4, DT_F16, 64, true);
    struct kv_pool *p = kt_pool(&c);
    uint8_t *bad = malloc(len + 16);
    assert_non_null(bad);

    memcpy(bad, file, len);
    bad[0] = 'X';
    expect_rejected(p, bad, len, ERR_FORMAT, "bad magic");
    memcpy(bad, file, len);
    bad[8] = 2;
    expect_rejected(p, bad, len, ERR_UNSUPPORTED, "version 2");
    /* any other header byte: the header checksum */
    for (size_t i = 12; i < 64; i++) {
        memcpy(bad, file, len);
        bad[i] ^= 0x10;
        expect_rejected(p, bad, len, ERR_FORMAT, "header checksum mismatch");
    }
    /* bytes of the compressed frame: zstd, a record checksum or the frame checksum objects */
    for (size_t i = 64; i < len; i += 1 + len / 200) {
        memcpy(bad, file, len);
        bad[i] ^= 0x5a;
        expect_rejected(p, bad, len, 0, "ignored");
    }
    memcpy(bad, file, len);
    memcpy(bad + len, "garbage", 7);
    expect_rejected(p, bad, len + 7, ERR_FORMAT, "trailing bytes after the compressed frame");
    free(bad);
    kv_pool_destroy(p);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

/* ---- crafted files: decompress, edit the records, fix the checksums, recompress ----------- */

struct crafted {
    uint8_t header[64];
    uint8_t *payload;
    size_t n_records, rec_bytes;
};

static void craft_open(struct crafted *cr, const uint8_t *file, size_t len)
{
    memcpy(cr->header, file, 64);
    memcpy(&cr->rec_bytes, file + 48, 8);
    uint32_t n;
    memcpy(&n, file + 44, 4);
    cr->n_records = n;
    unsigned long long sz = ZSTD_getFrameContentSize(file + 64, len - 64);
    assert_true(sz == cr->n_records * cr->rec_bytes);
    cr->payload = malloc(sz + cr->rec_bytes);
    assert_int_equal(ZSTD_decompress(cr->payload, sz, file + 64, len - 64), sz);
}

static uint8_t *rec_at(struct crafted *cr, size_t i) { return cr->payload + i * cr->rec_bytes; }

static void fix_record(struct crafted *cr, size_t i)
{
    uint8_t *r = rec_at(cr, i);
    uint64_t sum = kv__hash64(r + 32, cr->rec_bytes - 32, kv__hash64(r, 24, SEED_RECORD));
    memcpy(r + 24, &sum, 8);
}

/* Rebuilds the file with header n_records = n_hdr over the first n_payload records. */
static uint8_t *craft_close(struct crafted *cr, uint32_t n_hdr, size_t n_payload, size_t *len)
{
    memcpy(cr->header + 44, &n_hdr, 4);
    uint64_t h = kv__hash64(cr->header, 56, SEED_HEADER);
    memcpy(cr->header + 56, &h, 8);
    size_t src = n_payload * cr->rec_bytes, cap = ZSTD_compressBound(src);
    uint8_t *out = malloc(64 + cap);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    assert_true(out && cc);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    size_t z = ZSTD_compress2(cc, out + 64, cap, cr->payload, src);
    assert_false(ZSTD_isError(z));
    ZSTD_freeCCtx(cc);
    memcpy(out, cr->header, 64);
    *len = 64 + z;
    return out;
}

static void test_crafted_records_rejected(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len, blen;
    uint8_t *file = saved_file(dir, "k.snap", DT_F16, &len, NULL);
    struct kv_config c = kt_config(4, DT_F16, 64, true);
    struct kv_pool *p = kt_pool(&c);
    struct crafted cr;
    uint8_t *bad;
    uint32_t n;

    /* untouched, the rebuilt file is accepted: the crafting itself is sound */
    craft_open(&cr, file, len);
    bad = craft_close(&cr, (uint32_t)cr.n_records, cr.n_records, &blen);
    assert_int_equal(kv_snapshot_restore_mem(p, bad, blen, "test.snap", FP, &n), 0);
    assert_int_equal(n, cr.n_records);
    kv_pool_drop_cached(p);
    free(bad);
    /* records are depth-sorted: the last one has a parent; find a root */
    size_t last = cr.n_records - 1;
    uint32_t parent_of_last;
    memcpy(&parent_of_last, rec_at(&cr, last) + 20, 4);
    assert_true(parent_of_last != UINT32_MAX);

    /* K/V bytes altered inside a record, frame checksum intact: the record checksum */
    rec_at(&cr, 1)[cr.rec_bytes - 3] ^= 1;
    bad = craft_close(&cr, (uint32_t)cr.n_records, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "record 1 checksum mismatch");
    free(bad);
    free(cr.payload);

    /* a parent that is not an earlier record */
    craft_open(&cr, file, len);
    uint32_t fwd = (uint32_t)last;
    memcpy(rec_at(&cr, 0) + 20, &fwd, 4);
    memcpy(rec_at(&cr, 0) + 16, &(uint32_t){1}, 4);
    fix_record(&cr, 0);
    bad = craft_close(&cr, (uint32_t)cr.n_records, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "not an earlier one");
    free(bad);
    free(cr.payload);

    /* depth 0 with a parent, depth > 0 without */
    craft_open(&cr, file, len);
    memcpy(rec_at(&cr, last) + 20, &(uint32_t){UINT32_MAX}, 4);
    fix_record(&cr, last);
    bad = craft_close(&cr, (uint32_t)cr.n_records, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "but no parent");
    free(bad);
    free(cr.payload);

    /* a child in another tenant than its parent: a prefix never crosses tenants */
    craft_open(&cr, file, len);
    uint64_t t;
    memcpy(&t, rec_at(&cr, last), 8);
    t ^= 0x100;
    memcpy(rec_at(&cr, last), &t, 8);
    fix_record(&cr, last);
    bad = craft_close(&cr, (uint32_t)cr.n_records, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "does not extend its parent");
    free(bad);
    free(cr.payload);

    /* the same key twice */
    craft_open(&cr, file, len);
    memcpy(rec_at(&cr, cr.n_records), rec_at(&cr, 0), cr.rec_bytes);
    bad = craft_close(&cr, (uint32_t)cr.n_records + 1, cr.n_records + 1, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "repeats the key");
    free(bad);

    /* record count in the header larger / smaller than the payload */
    bad = craft_close(&cr, (uint32_t)cr.n_records + 1, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_TRUNCATED, "truncated");
    free(bad);
    bad = craft_close(&cr, (uint32_t)cr.n_records - 1, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "more data than its header's record count");
    free(bad);
    free(cr.payload);

    /* the record size field */
    craft_open(&cr, file, len);
    uint64_t rb = cr.rec_bytes + 4;
    memcpy(cr.header + 48, &rb, 8);
    bad = craft_close(&cr, (uint32_t)cr.n_records, cr.n_records, &blen);
    expect_rejected(p, bad, blen, ERR_FORMAT, "record size");
    free(bad);
    free(cr.payload);

    kv_pool_destroy(p);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

static void test_restore_preconditions(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len;
    uint8_t *file = saved_file(dir, "s.snap", DT_F32, &len, NULL);
    struct kv_config c = kt_config(4, DT_F32, 64, true);
    struct kv_pool *p = kt_pool(&c);
    uint32_t n;
    tu_log_capture_begin();
    assert_int_equal(kv_snapshot_restore(p, tu_path(dir, "none.snap"), FP, &n), -ENOENT);
    tu_assert_log_contains("none.snap", "none yet", NULL);
    /* only into an empty pool */
    struct kv_seq *s;
    assert_int_equal(kv_seq_create(p, 1, 0, &s), 0);
    assert_int_equal(kv_snapshot_restore_mem(p, file, len, "s.snap", FP, &n), ERR_STATE);
    tu_assert_log_contains("restore needs an empty pool", NULL);
    kv_seq_destroy(s);
    assert_int_equal(kv_snapshot_restore_mem(p, file, len, "s.snap", FP, &n), 0);
    assert_int_equal(kv_snapshot_restore_mem(p, file, len, "s.snap", FP, &n), ERR_STATE);
    kt_valid(p);
    kv_pool_destroy(p);
    /* nothing to restore into when the prefix cache is off */
    c.prefix_cache = false;
    p = kt_pool(&c);
    n = 99;
    assert_int_equal(kv_snapshot_restore_mem(p, file, len, "s.snap", FP, &n), 0);
    tu_assert_log_contains("the prefix cache is off", NULL);
    tu_log_capture_end();
    assert_int_equal(n, 0);
    assert_empty(p);
    kv_pool_destroy(p);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

static void test_save_is_atomic(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    size_t len, len2;
    uint8_t *file = saved_file(dir, "a.snap", DT_F16, &len, NULL);
    struct kv_config c = kt_config(4, DT_F16, 64, true);
    struct kv_pool *p = kt_pool(&c);
    struct prefix px = {3, 0, {0}, 20};
    kt_tokens(px.tok, 20, 51);
    cache(p, &px);
    uint32_t n;
    /* the disk fills up mid-write: the old snapshot stays whole, no temporary remains */
    setenv("CLOCHER_FAULT_WRITE_LIMIT", "100", 1);
    tu_log_capture_begin();
    int rc = kv_snapshot_save(p, tu_path(dir, "a.snap"), FP, 100, &n);
    unsetenv("CLOCHER_FAULT_WRITE_LIMIT");
    assert_int_equal(rc, -ENOSPC);
    tu_assert_log_contains("a.snap.tmp", NULL);
    tu_log_capture_end();
    assert_int_equal(n, 0);
    uint8_t *after = (uint8_t *)tu_read_file(tu_path(dir, "a.snap"), &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(file, after, len);
    DIR *d = opendir(dir);
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(d)))
        entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 1);
    /* a directory that does not exist */
    tu_log_capture_begin();
    assert_int_equal(kv_snapshot_save(p, tu_path(dir, "no/such/x.snap"), FP, 100, &n), -ENOENT);
    tu_assert_log_contains("no/such/x.snap", NULL);
    tu_log_capture_end();
    kv_pool_destroy(p);
    free(after);
    free(file);
    tu_rmtree(dir);
    free(dir);
}

/* ---- the fuzz corpus -------------------------------------------------------------------- */

static uint8_t *fuzz_snapshot(const char *dir, const char *name, uint32_t pool_blocks,
                              uint32_t n_chains, uint32_t max, uint64_t fp, size_t *len)
{
    struct kv_config c = fuzz_kv_config();
    c.budget_bytes = 512u * pool_blocks;
    struct kv_pool *p = kt_pool(&c);
    for (uint32_t i = 0; i < n_chains; i++) {
        struct kv_seq *s;
        int32_t tok[12];
        uint32_t got;
        kt_tokens(tok, 12, 60 + i % 3);
        tok[8] = (int32_t)i; /* chains share heads, differ in the third block */
        assert_int_equal(kv_seq_create(p, 1 + i % 2, i % 4 == 3 ? 5 : 0, &s), 0);
        assert_int_equal(kv_seq_attach_prefix(s, tok, 12, &got), 0);
        assert_int_equal(kt_append(s, tok + got, 12 - got), 0);
        kv_seq_destroy(s);
    }
    uint32_t n;
    assert_int_equal(kv_snapshot_save(p, tu_path(dir, name), fp, max, &n), 0);
    kv_pool_destroy(p);
    return (uint8_t *)tu_read_file(tu_path(dir, name), len);
}

static void test_fuzz_seeds(void **state)
{
    (void)state;
    const char *out = getenv("CLOCHER_KV_WRITE_SEEDS");
    char *dir = tu_mkdtemp();
    size_t len;
    struct {
        const char *name;
        uint32_t pool, chains, max;
        uint64_t fp;
        long cut;   /* keep this many bytes (< 0: all) */
        long flip;  /* xor 0x20 into this byte (< 0: none) */
    } seeds[] = {
        {"valid.snap", 32, 6, 10, FUZZ_KV_FINGERPRINT, -1, -1},
        {"valid_empty.snap", 8, 0, 10, FUZZ_KV_FINGERPRINT, -1, -1},
        {"valid_more_than_pool.snap", 64, 12, 40, FUZZ_KV_FINGERPRINT, -1, -1},
        {"other_model.snap", 32, 4, 10, FUZZ_KV_FINGERPRINT ^ 1, -1, -1},
        {"truncated.snap", 32, 4, 10, FUZZ_KV_FINGERPRINT, 700, -1},
        {"flipped_payload.snap", 32, 4, 10, FUZZ_KV_FINGERPRINT, -1, 300},
        {"flipped_header.snap", 32, 4, 10, FUZZ_KV_FINGERPRINT, -1, 30},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        uint8_t *b = fuzz_snapshot(dir, seeds[i].name, seeds[i].pool, seeds[i].chains,
                                   seeds[i].max, seeds[i].fp, &len);
        if (seeds[i].cut >= 0 && (size_t)seeds[i].cut < len)
            len = (size_t)seeds[i].cut;
        if (seeds[i].flip >= 0 && (size_t)seeds[i].flip < len)
            b[seeds[i].flip] ^= 0x20;
        /* each seed does what its name says for the harness's pool */
        struct kv_config c = fuzz_kv_config();
        struct kv_pool *p = kt_pool(&c);
        uint32_t n;
        log_set_level(LOG_LEVEL_ERROR);
        int rc = kv_snapshot_restore_mem(p, b, len, seeds[i].name, FUZZ_KV_FINGERPRINT, &n);
        log_set_level(LOG_LEVEL_INFO);
        assert_int_equal(rc == 0, strncmp(seeds[i].name, "valid", 5) == 0);
        kt_valid(p);
        kv_pool_destroy(p);
        if (out)
            tu_write_file(tu_path(out, seeds[i].name), b, len);
        if (out && rc == 0 && len > 64) {
            /* the harness's structured form: "RAW!", n_records, uncompressed records */
            struct crafted cr;
            craft_open(&cr, b, len);
            size_t plen = cr.n_records * cr.rec_bytes;
            uint8_t *raw = malloc(8 + plen);
            uint32_t nr = (uint32_t)cr.n_records;
            assert_non_null(raw);
            memcpy(raw, "RAW!", 4);
            memcpy(raw + 4, &nr, 4);
            memcpy(raw + 8, cr.payload, plen);
            char name[64];
            snprintf(name, sizeof name, "raw_%s", seeds[i].name);
            tu_write_file(tu_path(out, name), raw, 8 + plen);
            free(raw);
            free(cr.payload);
        }
        free(b);
    }
    tu_rmtree(dir);
    free(dir);

    /* the committed valid seeds still restore: the corpus tracks the format */
    const char *src = getenv("CLOCHER_SOURCE_DIR");
    assert_non_null(src);
    char corpus[4096];
    snprintf(corpus, sizeof corpus, "%s/tests/fuzz/corpus/kv_snapshot", src);
    DIR *d = opendir(corpus);
    if (!d)
        fail_msg("cannot open the seed corpus %s: %s", corpus, strerror(errno));
    struct dirent *e;
    int n_valid = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "valid", 5) != 0)
            continue;
        char *b = tu_read_file(tu_path(corpus, e->d_name), &len);
        struct kv_config c = fuzz_kv_config();
        struct kv_pool *p = kt_pool(&c);
        uint32_t n;
        tu_log_capture_begin();
        if (kv_snapshot_restore_mem(p, b, len, e->d_name, FUZZ_KV_FINGERPRINT, &n) != 0)
            fail_msg("seed %s no longer restores:\n%s", e->d_name, tu_log_captured());
        tu_log_capture_end();
        kt_valid(p);
        kv_pool_destroy(p);
        free(b);
        n_valid++;
    }
    closedir(d);
    assert_true(n_valid >= 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hottest_with_ancestors),
        cmocka_unit_test(test_restore_into_smaller_pool),
        cmocka_unit_test(test_mismatch_rejected),
        cmocka_unit_test(test_kv8_exact_and_mismatch),
        cmocka_unit_test(test_truncated_rejected),
        cmocka_unit_test(test_corruption_rejected),
        cmocka_unit_test(test_crafted_records_rejected),
        cmocka_unit_test(test_restore_preconditions),
        cmocka_unit_test(test_save_is_atomic),
        cmocka_unit_test(test_fuzz_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
