/*
 * test_hotrepl.c — hot tensor replication (worker/process/hotrepl.c) on the real stories260K model:
 * the copies hold the same bytes at the same addresses, are no longer backed by the shared
 * file, live on the requested node, honour the byte limit in hotness order, tensors the forward
 * pass no longer reads (q4_0 matrices repacked into panels) are left shared, and a model that
 * is not mapped is left alone; hotrepl_hugify re-reads the cache keeping bytes and mappings.
 */
#include "testutil.h"

#include "err.h"
#include "hotrepl.h"
#include "iebin.h"
#include "kern.h"
#include "llama2c.h"
#include "log.h"
#include "model.h"

#include <errno.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static char *g_dir;

static int setup(void **state)
{
    (void)state;
    if (kern_init() != 0) /* model_init repacks q4_0 only when the kernels run AVX-512 */
        return -1;
    g_dir = tu_mkdtemp();
    if (llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, g_dir, DT_F32,
                        NULL) != 0)
        fail_msg("llama2c_convert: %s", log_last_error());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

/* Bytes of this process's address space still mapped from model.ie.bin. */
static uint64_t file_backed_bytes(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, IEBIN_BLOB);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    uint64_t total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b, off, ino;
        unsigned maj, min;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &a, &b, perms, &off, &maj, &min, &ino) == 7 &&
            ino == st.st_ino && makedev(maj, min) == st.st_dev)
            total += b - a;
    }
    fclose(f);
    return total;
}

static void test_replicate_all(void **state)
{
    (void)state;
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_dir, &m), 0);
    /* the reference: every tensor's bytes, copied before replication */
    uint8_t **ref = calloc(m->n_tensors, sizeof *ref);
    uint64_t sum = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        ref[i] = malloc(m->tensors[i].size);
        memcpy(ref[i], m->tensors[i].data, m->tensors[i].size);
        sum += m->tensors[i].size;
    }
    assert_true(file_backed_bytes(g_dir) >= sum);

    struct hotrepl_report rep;
    assert_int_equal(hotrepl_apply(g_dir, NULL, 0, 0, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    assert_int_equal(rep.n_tensors, m->n_tensors);
    assert_int_equal(rep.n_skipped, 0);
    assert_true(rep.bytes >= sum);
    /* stories260K ties its embeddings: the classifier (tok_embd) is the hottest */
    assert_true(m->hp.tied_embeddings);
    assert_string_equal(rep.first, "tok_embd");

    /* same addresses, same bytes, no longer the file's pages */
    for (size_t i = 0; i < m->n_tensors; i++)
        if (memcmp(ref[i], m->tensors[i].data, m->tensors[i].size) != 0)
            fail_msg("tensor %s changed by replication", m->tensors[i].name);
    assert_int_equal(file_backed_bytes(g_dir), 0);

    /* and on node 0 (move_pages with no target node reports where each page is) */
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < m->n_tensors; i++) {
        void *pg = (void *)((uintptr_t)m->tensors[i].data / (uintptr_t)page * (uintptr_t)page);
        int status = -1;
        assert_int_equal(move_pages(0, 1, &pg, NULL, &status, 0), 0);
        assert_int_equal(status, 0);
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        free(ref[i]);
    free(ref);
    iebin_close(m); /* one munmap still releases the mixed mapping */

    /* nothing mapped now: nothing to do */
    assert_int_equal(hotrepl_apply(g_dir, NULL, 0, 0, &rep), 0);
    assert_int_equal(rep.n_mappings, 0);
}

static void test_limit(void **state)
{
    (void)state;
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_dir, &m), 0);
    const struct iebin_tensor *emb = iebin_find(m, IEBIN_T_TOK_EMBD);
    const struct iebin_tensor *norm = iebin_find(m, IEBIN_T_OUTPUT_NORM);
    const struct iebin_tensor *q0 = iebin_find(m, "blk.0.attn_q");
    assert_non_null(q0);
    /* room for the classifier, its norm and the first layer's first tensors, not more */
    uint64_t limit = emb->size + norm->size + q0->size + 1;
    struct hotrepl_report rep;
    assert_int_equal(hotrepl_apply(g_dir, NULL, -1, limit, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    assert_true(rep.n_tensors >= 3 && rep.n_tensors < m->n_tensors);
    assert_int_equal(rep.n_tensors + rep.n_skipped, m->n_tensors);
    assert_true(rep.skipped_bytes > 0);
    assert_string_equal(rep.first, "tok_embd");
    assert_true(strncmp(rep.last, "blk.0.", 6) == 0);
    /* part of the file is still mapped: the cold tensors */
    uint64_t left = file_backed_bytes(g_dir);
    assert_true(left > 0 && left < m->map_size);
    iebin_close(m);

    /* a limit below the smallest hot tensor replicates nothing */
    assert_int_equal(iebin_open(g_dir, &m), 0);
    assert_int_equal(hotrepl_apply(g_dir, NULL, -1, 1, &rep), 0);
    assert_int_equal(rep.n_tensors, 0);
    assert_int_equal(rep.bytes, 0);
    assert_int_equal(rep.n_skipped, m->n_tensors);
    iebin_close(m);
}

/* Whether the page at addr is still mapped from model.ie.bin. */
static bool page_file_backed(const char *dir, const void *addr)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, IEBIN_BLOB);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long a, b, off, ino;
        unsigned maj, min;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &a, &b, perms, &off, &maj, &min, &ino) == 7 &&
            ino == st.st_ino && makedev(maj, min) == st.st_dev && a <= (uintptr_t)addr &&
            (uintptr_t)addr < b)
            found = true;
    }
    fclose(f);
    return found;
}

/* The first page wholly inside tensor t (boundary pages may be shared with a neighbour). */
static const void *inner_page(const struct iebin_tensor *t)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)t->data + page - 1) / page * page;
    assert_true(a + page <= (uintptr_t)t->data + t->size);
    return (const void *)a;
}

static void test_skips_repacked(void **state)
{
    (void)state;
    /* stories260K is f32, so nothing gets panels on its own: give layer 0's q and the (tied)
     * classifier panels by hand, as repack_q4 would for q4_0 matrices; the pointer is never
     * read here */
    static const char fake_panels[64];
    struct iebin_model *im;
    assert_int_equal(iebin_open(g_dir, &im), 0);
    struct model mdl;
    assert_int_equal(model_init(&mdl, im), 0);
    assert_true(mdl.hp.tied_embeddings);
    mdl.layers[0].wq.panels = fake_panels;
    mdl.output.panels = fake_panels;
    assert_false(model_reads_stored(&mdl, "blk.0.attn_q"));
    assert_true(model_reads_stored(&mdl, "blk.0.attn_k"));
    assert_true(model_reads_stored(&mdl, IEBIN_T_TOK_EMBD)); /* the embedding lookup */
    assert_true(model_reads_stored(&mdl, "blk.0.attn_norm"));
    assert_true(model_reads_stored(&mdl, "no.such.tensor"));

    const struct iebin_tensor *q0 = iebin_find(im, "blk.0.attn_q");
    const struct iebin_tensor *k0 = iebin_find(im, "blk.0.attn_k");
    const struct iebin_tensor *emb = iebin_find(im, IEBIN_T_TOK_EMBD);
    assert_true(page_file_backed(g_dir, inner_page(q0)));
    assert_true(page_file_backed(g_dir, inner_page(k0)));

    struct hotrepl_report rep;
    assert_int_equal(hotrepl_apply(g_dir, &mdl, -1, 0, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    assert_int_equal(rep.n_unread, 1);
    assert_int_equal(rep.unread_bytes, q0->size);
    assert_int_equal(rep.n_tensors, im->n_tensors - 1); /* HOT_TENSORS: what was copied */
    assert_int_equal(rep.n_skipped, 0);
    /* the classifier reads panels: tok_embd is now only the embedding, ranked last */
    assert_string_equal(rep.first, IEBIN_T_OUTPUT_NORM);
    assert_string_equal(rep.last, IEBIN_T_TOK_EMBD);
    /* the repacked matrix keeps the file's pages, the others are copies */
    assert_true(page_file_backed(g_dir, inner_page(q0)));
    assert_false(page_file_backed(g_dir, inner_page(k0)));
    assert_false(page_file_backed(g_dir, inner_page(emb)));
    model_fini(&mdl);
    iebin_close(im);
}

/*
 * The same with panels made by model_init itself: the base with every matrix whose rows are
 * whole q4_0 blocks quantized (stories260K's ffn_down, 172 columns, stays f32). On AVX-512
 * those matrices, and the tied classifier, get panels and are not replicated; elsewhere
 * nothing is repacked and everything is replicated.
 */
static void test_skips_real_panels(void **state)
{
    (void)state;
    struct iebin_model *base;
    assert_int_equal(iebin_open(g_dir, &base), 0);
    char *tmp = tu_mkdtemp();
    char *qdir = strdup(tu_path(tmp, "q4"));
    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(qdir, "llama", "stories260K-q4", &base->hp, &w), 0);
    size_t n_q4 = 0;
    for (size_t i = 0; i < base->n_tensors; i++) {
        const struct iebin_tensor *t = &base->tensors[i];
        if (t->n_dims == 2 && t->shape[1] % 32 == 0) {
            size_t rows = t->shape[0], cols = t->shape[1], rb = cols / 32 * 18;
            uint8_t *q = malloc(rows * rb);
            assert_non_null(q);
            for (size_t r = 0; r < rows; r++)
                assert_int_equal(kern_quantize_row_q4_search(DT_Q4_0, (const float *)t->data +
                                                             r * cols, q + r * rb, cols),
                                 0);
            assert_int_equal(iebin_writer_add(w, t->name, DT_Q4_0, t->shape, 2, q, rows * rb),
                             0);
            free(q);
            n_q4++;
        } else {
            assert_int_equal(
                iebin_writer_add(w, t->name, t->dtype, t->shape, t->n_dims, t->data, t->size), 0);
        }
    }
    assert_int_equal(iebin_writer_finish(w), 0);
    iebin_close(base);

    struct iebin_model *im;
    assert_int_equal(iebin_open(qdir, &im), 0);
    struct model mdl;
    assert_int_equal(model_init(&mdl, im), 0);
    struct hotrepl_report rep;
    assert_int_equal(hotrepl_apply(qdir, &mdl, -1, 0, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    if (mdl.layers[0].wq.panels) {
        /* every q4_0 tensor but tok_embd (still the embedding) is read through panels only */
        assert_non_null(mdl.output.panels);
        assert_false(model_reads_stored(&mdl, "blk.0.attn_q"));
        assert_true(model_reads_stored(&mdl, "blk.0.ffn_down")); /* f32: no panels */
        assert_int_equal(rep.n_unread, n_q4 - 1);
        assert_int_equal(rep.n_tensors, im->n_tensors - (n_q4 - 1));
        assert_string_equal(rep.first, IEBIN_T_OUTPUT_NORM);
        assert_string_equal(rep.last, IEBIN_T_TOK_EMBD);
    } else {
        print_message("  no q4_0 panels on this machine (ISA %d): all tensors replicated\n",
                      (int)kern_isa());
        assert_int_equal(rep.n_unread, 0);
        assert_int_equal(rep.n_tensors, im->n_tensors);
    }
    model_fini(&mdl);
    iebin_close(im);
    tu_rmtree(tmp);
    free(tmp);
    free(qdir);
}

/* hotrepl_hugify re-reads the page cache under a live mapping: same bytes at the same
 * addresses, still the file's pages (nothing copied); the default entry point honours
 * IE_HUGE_PAGES (0: nothing, not 0/1: ERR_RANGE naming it); bad directories are errors. */
static void test_hugify(void **state)
{
    (void)state;
    struct iebin_model *m;
    assert_int_equal(iebin_open(g_dir, &m), 0);
    uint8_t **ref = calloc(m->n_tensors, sizeof *ref);
    uint64_t sum = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        ref[i] = malloc(m->tensors[i].size);
        memcpy(ref[i], m->tensors[i].data, m->tensors[i].size);
        sum += m->tensors[i].size;
    }
    char blob[4096];
    snprintf(blob, sizeof blob, "%s/%s", g_dir, IEBIN_BLOB);
    struct stat st;
    assert_int_equal(stat(blob, &st), 0);

    struct hotrepl_huge_report rep;
    assert_int_equal(hotrepl_hugify(g_dir, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    assert_int_equal(rep.file_bytes, (uint64_t)st.st_size);
    assert_false(rep.skipped); /* 4 KiB-mapped (the file is smaller than 2 MiB) */
    for (size_t i = 0; i < m->n_tensors; i++)
        if (memcmp(ref[i], m->tensors[i].data, m->tensors[i].size) != 0)
            fail_msg("tensor %s changed by hugify", m->tensors[i].name);
    assert_true(file_backed_bytes(g_dir) >= sum);

    const char *old = getenv("IE_HUGE_PAGES");
    char *saved = old ? strdup(old) : NULL;
    setenv("IE_HUGE_PAGES", "1", 1);
    assert_int_equal(hotrepl_hugify_default(g_dir, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    assert_int_equal(rep.file_bytes, (uint64_t)st.st_size);
    setenv("IE_HUGE_PAGES", "0", 1);
    assert_int_equal(hotrepl_hugify_default(g_dir, &rep), 0);
    assert_int_equal(rep.n_mappings, 0);
    assert_int_equal(rep.file_bytes, 0);
    setenv("IE_HUGE_PAGES", "yes", 1);
    tu_log_capture_begin();
    assert_int_equal(hotrepl_hugify_default(g_dir, &rep), ERR_RANGE);
    tu_assert_log_contains("IE_HUGE_PAGES=yes", NULL);
    tu_log_capture_end();
    if (saved)
        setenv("IE_HUGE_PAGES", saved, 1);
    else
        unsetenv("IE_HUGE_PAGES");
    free(saved);
    for (size_t i = 0; i < m->n_tensors; i++)
        if (memcmp(ref[i], m->tensors[i].data, m->tensors[i].size) != 0)
            fail_msg("tensor %s changed by hugify", m->tensors[i].name);
    for (size_t i = 0; i < m->n_tensors; i++)
        free(ref[i]);
    free(ref);
    iebin_close(m);

    /* not mapped: the page cache is re-read all the same */
    assert_int_equal(hotrepl_hugify(g_dir, &rep), 0);
    assert_int_equal(rep.n_mappings, 0);
    assert_int_equal(rep.file_bytes, (uint64_t)st.st_size);

    /* a directory that is no model: a negative code naming it (the default only warns) */
    tu_log_capture_begin();
    assert_true(hotrepl_hugify("/nonexistent/model", &rep) < 0);
    tu_assert_log_contains("/nonexistent/model", NULL);
    tu_log_capture_end();
    char *empty = tu_mkdtemp();
    tu_log_capture_begin();
    assert_true(hotrepl_hugify(empty, &rep) < 0);
    tu_log_capture_end();
    tu_log_capture_begin();
    assert_int_equal(hotrepl_hugify_default(empty, &rep), 0);
    tu_assert_log_contains("2 MiB folios: not done", NULL);
    tu_log_capture_end();
    assert_int_equal(rep.n_mappings, 0);
    tu_rmtree(empty);
    free(empty);
}

static void test_errors(void **state)
{
    (void)state;
    struct hotrepl_report rep;
    tu_log_capture_begin();
    int rc = hotrepl_apply("/nonexistent/model", NULL, 0, 0, &rep);
    tu_log_capture_end();
    assert_true(rc < 0);
    tu_assert_log_contains("/nonexistent/model", NULL);
    tu_log_capture_begin();
    assert_int_equal(hotrepl_apply(g_dir, NULL, 5000, 0, &rep), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("node 5000", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replicate_all),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_skips_repacked),
        cmocka_unit_test(test_skips_real_panels),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_hugify),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
