/*
 * test_hotrepl.c — hot tensor replication (worker/hotrepl.c) on the real stories260K model:
 * the copies hold the same bytes at the same addresses, are no longer backed by the shared
 * file, live on the requested node, honour the byte limit in hotness order, tensors the forward
 * pass no longer reads (q4_0 matrices repacked into panels) are left shared, and a model that
 * is not mapped is left alone.
 */
#include "testutil.h"

#include "err.h"
#include "hotrepl.h"
#include "iebin.h"
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
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
