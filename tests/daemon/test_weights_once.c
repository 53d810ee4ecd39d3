/*
 * test_weights_once.c — a panelled model's weights are resident once (ADR 0004 addendum
 * "weights resident once", issue 13's "no second copy of the weights"): after model_open the
 * stored rows of the repacked matrices are out of this process's view of model.ie.bin (its
 * Rss in /proc/self/smaps drops by about their bytes), hotrepl_hugify_default_model does not
 * bring them back (hotrepl_hugify without the model does: the negative control), hot
 * replication neither, and the greedy ids are those of the same model read through its stored
 * rows (CLOCHER_Q4_PANELS=0); a blob that is not a file mapping is never released. On a synth
 * "demo" model converted to int4 (q4_0): ~2 MB, a second of CPU. Panels exist only on
 * AVX-512: elsewhere the test skips, saying so.
 */
#include "testutil.h"

#include "convert.h"
#include "err.h"
#include "forward.h"
#include "hotrepl.h"
#include "iebin.h"
#include "kern.h"
#include "log.h"
#include "model.h"
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define N_GEN 8

static char *g_tmp, *g_dir; /* g_dir: the int4 IEBIN model */

static int setup(void **state)
{
    (void)state;
    if (kern_init() != 0)
        return -1;
    g_tmp = tu_mkdtemp();
    char *hf = strdup(tu_path(g_tmp, "hf"));
    g_dir = strdup(tu_path(g_tmp, "int4"));
    struct synth_opts so = {.preset = "demo", .seed = 3};
    struct convert_opts co = {.dtype_set = true, .dtype = DT_Q4_0};
    if (synth_model(hf, &so) != 0 || convert_model(hf, g_dir, &co, NULL) != 0)
        fail_msg("synth/convert: %s", log_last_error());
    free(hf);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_tmp);
    free(g_tmp);
    free(g_dir);
    return 0;
}

/* Rss (bytes) of this process's file-backed mappings of model.ie.bin, from /proc/self/smaps. */
static uint64_t file_rss(void)
{
    struct stat st;
    assert_int_equal(stat(tu_path(g_dir, IEBIN_BLOB), &st), 0);
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[1024];
    bool ours = false;
    uint64_t total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b, off, ino;
        unsigned maj, min;
        char perms[8];
        unsigned long long kb;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &a, &b, perms, &off, &maj, &min, &ino) ==
            7)
            ours = ino == st.st_ino && makedev(maj, min) == st.st_dev;
        else if (ours && sscanf(line, "Rss: %llu kB", &kb) == 1)
            total += kb * 1024;
    }
    fclose(f);
    return total;
}

/* The greedy continuation of a fixed prompt: ids[N_GEN]. */
static void greedy(const struct model *m, int32_t *ids)
{
    struct forward_config fc = {.max_seq = 64};
    struct forward *f;
    assert_int_equal(forward_create(m, &fc, &f), 0);
    float *logits = malloc(m->hp.vocab_size * sizeof *logits);
    assert_non_null(logits);
    int32_t tok[] = {1, 17, 300, 42, 99};
    assert_int_equal(forward_eval(f, tok, 5, FORWARD_LOGITS_LAST, logits), 0);
    for (int i = 0; i < N_GEN; i++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < m->hp.vocab_size; v++)
            best = logits[v] > logits[best] ? (int32_t)v : best;
        ids[i] = best;
        assert_int_equal(forward_eval(f, &best, 1, FORWARD_LOGITS_LAST, logits), 0);
    }
    free(logits);
    forward_destroy(f);
}

static uint64_t sum_ranges(const struct model *m)
{
    struct model_range *r;
    size_t n;
    assert_int_equal(model_unread_ranges(m, &r, &n), 0);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(i == 0 || r[i].off >= r[i - 1].off + r[i - 1].len); /* sorted, disjoint */
        assert_int_equal(r[i].off % (uint64_t)sysconf(_SC_PAGESIZE), 0);
        s += r[i].len;
    }
    free(r);
    return s;
}

/* The stored bytes of the matrices that have panels, tok_embd's excepted. */
static uint64_t repacked_bytes(const struct model *m)
{
    uint64_t s = 0;
    for (size_t i = 0; i < m->im->n_tensors; i++)
        if (!model_reads_stored(m, m->im->tensors[i].name))
            s += m->im->tensors[i].size;
    return s;
}

static void test_resident_once(void **state)
{
    (void)state;
    if (kern_isa() != KERN_ISA_AVX512) {
        print_message("  no panels on this machine (ISA %d): nothing to release\n",
                      (int)kern_isa());
        skip();
    }
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), slack = 8 * page;
    struct stat st;
    assert_int_equal(stat(tu_path(g_dir, IEBIN_BLOB), &st), 0);
    const uint64_t file = ((uint64_t)st.st_size + page - 1) / page * page;

    /* the reference: the stored rows, every page of the file resident */
    int32_t ref[N_GEN], ids[N_GEN];
    setenv("CLOCHER_Q4_PANELS", "0", 1);
    struct model *m;
    assert_int_equal(model_open(g_dir, 0, &m), 0);
    unsetenv("CLOCHER_Q4_PANELS");
    assert_null(m->layers[0].wq.panels);
    assert_int_equal(sum_ranges(m), 0);
    assert_true(file_rss() + slack >= file);
    uint64_t rel = 1;
    assert_int_equal(model_release_stored_rows(m, &rel), 0); /* nothing unread: a no-op */
    assert_int_equal(rel, 0);
    greedy(m, ref);
    model_close(m);
    assert_int_equal(file_rss(), 0);

    /* panelled: the repacked matrices' pages are gone from the mapping after model_open */
    assert_int_equal(model_open(g_dir, 0, &m), 0);
    assert_non_null(m->layers[0].wq.panels);
    assert_non_null(m->output.panels);
    const uint64_t unread = sum_ranges(m), stored = repacked_bytes(m);
    print_message("  file %llu bytes, repacked matrices %llu, released %llu, Rss %llu\n",
                  (unsigned long long)file, (unsigned long long)stored,
                  (unsigned long long)unread, (unsigned long long)file_rss());
    assert_true(unread <= stored && unread * 10 >= stored * 9); /* about their bytes */
    assert_true(file_rss() <= file - unread + slack);
    assert_true(file_rss() + slack >= file - unread); /* what is read stays mapped */

    /* hugify with the model (forced: not skipped) leaves them out; without it, they return */
    struct hotrepl_huge_report hr;
    assert_int_equal(hotrepl_hugify_model(g_dir, m, &hr), 0);
    assert_false(hr.skipped); /* the kept 0.6 MB is below 2 MiB: no 2 MiB entries */
    assert_int_equal(hr.unread_bytes, unread);
    assert_true(file_rss() <= file - unread + slack);
    assert_int_equal(hotrepl_hugify(g_dir, &hr), 0); /* the negative control */
    assert_true(file_rss() + slack >= file);
    assert_int_equal(hotrepl_hugify_default_model(g_dir, m, &hr), 0); /* released again */
    assert_int_equal(hr.released_bytes, unread);
    assert_true(file_rss() <= file - unread + slack);
    setenv("IE_HUGE_PAGES", "0", 1); /* off: the release still happens */
    assert_int_equal(hotrepl_hugify(g_dir, &hr), 0);
    assert_int_equal(hotrepl_hugify_default_model(g_dir, m, &hr), 0);
    unsetenv("IE_HUGE_PAGES");
    assert_int_equal(hr.released_bytes, unread);
    assert_true(file_rss() <= file - unread + slack);

    greedy(m, ids); /* the products read the panels, the lookup tok_embd's rows */
    assert_memory_equal(ids, ref, sizeof ids);
    assert_true(file_rss() <= file - unread + slack);

    /* hot replication copies what is read and faults nothing unread back in: the file's
     * pages left in the mapping are about none */
    struct hotrepl_report rep;
    assert_int_equal(hotrepl_apply(g_dir, m, -1, 0, &rep), 0);
    assert_int_equal(rep.n_mappings, 1);
    assert_true(rep.bytes + unread + slack >= file);
    assert_true(file_rss() <= slack);
    greedy(m, ids);
    assert_memory_equal(ids, ref, sizeof ids);
    model_close(m);
}

/*
 * A model whose blob is not a file mapping (iebin_open_mem's contract: map NULL, the bytes the
 * caller's) is left alone: DONTNEED there would zero anonymous memory. Here the same bytes,
 * a shallow copy of an opened model with its map hidden: panels are made, nothing is dropped.
 */
static void test_memory_blob_left_alone(void **state)
{
    (void)state;
    if (kern_isa() != KERN_ISA_AVX512) {
        print_message("  no panels on this machine (ISA %d): nothing to release\n",
                      (int)kern_isa());
        skip();
    }
    struct iebin_model *im;
    assert_int_equal(iebin_open(g_dir, &im), 0);
    const uint64_t before = file_rss();
    struct iebin_model mem = *im;
    mem.map = NULL;
    struct model m;
    assert_int_equal(model_init(&m, &mem), 0);
    assert_non_null(m.layers[0].wq.panels);
    assert_true(sum_ranges(&m) > 0); /* there is something it would release */
    uint64_t rel = 1;
    assert_int_equal(model_release_stored_rows(&m, &rel), 0);
    assert_int_equal(rel, 0);
    assert_int_equal(file_rss(), before); /* every page still mapped */
    int32_t ids[N_GEN];
    greedy(&m, ids);
    model_fini(&m);
    iebin_close(im);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident_once),
        cmocka_unit_test(test_memory_blob_left_alone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
