/*
 * test_bsr.c — the block-sparse (BSR) format and GEMV:
 *  - GEMV on every ISA (one test each, skipped when this CPU lacks it) against a double-precision dense product
 *    of the same matrix, |dy| <= 1e-5 * sum|w x| (docs/adr/0004's table), on
 *    random shapes with ragged row and column tails and sparsities 0..100 %, plus partial
 *    block-row ranges (rows outside them untouched);
 *  - dense -> BSR -> dense exact, threshold pruning, file round trip byte-exact;
 *  - every malformed-file case the loader must refuse, with its code and the field named;
 *  - `clocher sparsify`: --help, bad flags, a real conversion (raw f32 input), and through the
 *    `clocher` executable when the build has it, an IEBIN tensor of stories260K;
 *  - the fuzz seeds (packed by tests/fuzz/gen_bsr_seeds.py from docs/BSR.md, independently of
 *    bsr.c): every ok_* loads, every bad_* is refused.
 */
#include "testutil.h"
#include "../kern/isa_case.h"

#include "bsr.h"
#include "cmds.h"
#include "err.h"
#include "iebin.h"
#include "kern.h"
#include "rng.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { return rng_splitmix64(&rng_state); }

static float rndf(void) { return (float)(rng_unit_f64(rnd()) * 2 - 1); }

/* A [rows][cols] matrix whose br x bc blocks are zero with probability `sparsity`. */
static float *random_sparse(size_t rows, size_t cols, size_t br, size_t bc, double sparsity)
{
    float *w = malloc(rows * cols * sizeof(float));
    assert_non_null(w);
    for (size_t b = 0; b * br < rows; b++)
        for (size_t c = 0; c * bc < cols; c++) {
            int zero = (double)(rnd() >> 11) / 9007199254740992.0 < sparsity;
            for (size_t i = b * br; i < rows && i < (b + 1) * br; i++)
                for (size_t j = c * bc; j < cols && j < (c + 1) * bc; j++)
                    w[i * cols + j] = zero ? 0.0f : rndf();
        }
    return w;
}

static void check_gemv(const struct bsr *m, const float *w, const float *x, const float *y,
                       size_t r0, size_t r1, const char *what)
{
    const size_t cols = m->k.cols;
    for (size_t r = r0; r < r1; r++) {
        double ref = 0, mag = 0;
        for (size_t c = 0; c < cols; c++) {
            ref += (double)w[r * cols + c] * x[c];
            mag += fabs((double)w[r * cols + c] * x[c]);
        }
        double err = fabs((double)y[r] - ref);
        if (!(err <= 1e-5 * mag)) {
            fail_msg("%s: %zux%zu blocks %zux%zu row %zu: y %.9g ref %.9g |d| %.3g > 1e-5*%.3g",
                     what, m->k.rows, cols, m->k.br, m->k.bc, r, (double)y[r], ref, err, mag);
        }
    }
}

static void test_gemv(void **state)
{
    const enum kern_isa isa = isa_case_begin(state)->isa;
    static const size_t shapes[][4] = {
        {1, 1, 1, 1},     {1, 17, 1, 16},   {37, 53, 8, 16},  {64, 64, 16, 16},
        {100, 70, 16, 16}, {33, 19, 5, 7},  {130, 257, 32, 32}, {48, 200, 8, 40},
        {17, 300, 24, 20}, {256, 96, 16, 48}, {9, 33, 9, 33},  {200, 129, 64, 1},
        /* AVX-512 paths: 4 x slices in registers (bc 64), slabs of 64 rows (br > 64),
           full-width masked slices (bc > 64) */
        {50, 200, 8, 64},  {170, 100, 80, 32}, {70, 130, 100, 80}, {129, 64, 129, 16},
    };
    static const double sparsities[] = {0.0, 0.5, 0.75, 0.95, 1.0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t p = 0; p < sizeof sparsities / sizeof sparsities[0]; p++) {
            const size_t rows = shapes[s][0], cols = shapes[s][1];
            const size_t br = shapes[s][2], bc = shapes[s][3];
            float *w = random_sparse(rows, cols, br, bc, sparsities[p]);
            struct bsr *m;
            assert_int_equal(bsr_from_dense(w, rows, cols, cols, (uint32_t)br, (uint32_t)bc,
                                            0.0f, &m),
                             0);
            float *x = malloc(cols * sizeof(float)), *y = malloc(rows * sizeof(float));
            for (size_t c = 0; c < cols; c++)
                x[c] = rndf();
            {
                assert_int_equal(kern_force_isa(isa), 0);
                memset(y, 0xff, rows * sizeof(float)); /* NaN: every row must be written */
                bsr_gemv(m, x, y);
                check_gemv(m, w, x, y, 0, rows, kern_isa_name((enum kern_isa)isa));
                /* a middle range of block rows: the rows outside it stay untouched */
                size_t b0 = m->nbr / 3, b1 = m->nbr - m->nbr / 3;
                for (size_t r = 0; r < rows; r++)
                    y[r] = 12345.0f;
                kern_bsr_gemv(&m->k, x, y, b0, b1);
                size_t r0 = b0 * br, r1 = b1 * br < rows ? b1 * br : rows;
                check_gemv(m, w, x, y, r0, r1, kern_isa_name((enum kern_isa)isa));
                for (size_t r = 0; r < rows; r++)
                    if (r < r0 || r >= r1)
                        assert_true(y[r] == 12345.0f);
            }
            assert_int_equal(kern_init(), 0);
            free(x);
            free(y);
            free(w);
            bsr_close(m);
        }
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    for (int t = 0; t < 20; t++) {
        size_t rows = 1 + rnd() % 90, cols = 1 + rnd() % 90;
        size_t br = 1 + rnd() % 20, bc = 1 + rnd() % 20;
        float *w = random_sparse(rows, cols, br, bc, (double)(rnd() % 100) / 100.0);
        struct bsr *m, *m2;
        assert_int_equal(bsr_from_dense(w, rows, cols, cols, (uint32_t)br, (uint32_t)bc, 0.0f,
                                        &m),
                         0);
        /* exactly the nonzero blocks are kept */
        size_t nonzero = 0;
        for (size_t b = 0; b * br < rows; b++)
            for (size_t c = 0; c * bc < cols; c++) {
                int nz = 0;
                for (size_t i = b * br; i < rows && i < (b + 1) * br; i++)
                    for (size_t j = c * bc; j < cols && j < (c + 1) * bc; j++)
                        nz |= w[i * cols + j] != 0.0f;
                nonzero += (size_t)nz;
            }
        assert_int_equal(m->nnzb, nonzero);
        float *d = malloc(rows * cols * sizeof(float));
        bsr_to_dense(m, d);
        assert_memory_equal(d, w, rows * cols * sizeof(float));
        /* file round trip: the same bytes back, and they validate */
        const char *path = tu_path(dir, "m.bsr");
        assert_int_equal(bsr_write(m, path), 0);
        assert_int_equal(bsr_open(path, &m2), 0);
        assert_int_equal(m2->image_size, m->image_size);
        assert_memory_equal(m2->image, m->image, m->image_size);
        bsr_close(m2);
        bsr_close(m);
        free(d);
        free(w);
    }
    /* threshold: a block whose max |w| is below T goes, one at or above stays intact */
    float w[4 * 4] = {0};
    w[0] = 0.01f;            /* block (0,0): max 0.01 < 0.05 -> pruned */
    w[1 * 4 + 0] = -0.02f;
    w[0 * 4 + 2] = 0.001f;   /* block (0,1): max 0.05 -> kept with its small element */
    w[1 * 4 + 3] = -0.05f;
    w[2 * 4 + 2] = NAN;      /* block (1,1): NaN keeps it */
    struct bsr *m;
    assert_int_equal(bsr_from_dense(w, 4, 4, 4, 2, 2, 0.05f, &m), 0);
    assert_int_equal(m->nnzb, 2);
    float d[16];
    bsr_to_dense(m, d);
    assert_true(d[0] == 0.0f && d[4] == 0.0f && d[2] == 0.001f && d[7] == -0.05f);
    assert_true(isnan(d[10]));
    bsr_close(m);
    /* the converter's own argument checks */
    tu_log_capture_begin();
    assert_int_equal(bsr_from_dense(w, 4, 4, 4, 0, 2, 0.0f, &m), ERR_RANGE);
    assert_int_equal(bsr_from_dense(w, 4, 4, 4, 2, 2, -1.0f, &m), ERR_RANGE);
    assert_int_equal(bsr_from_dense(w, 4, 4, 4, 2, 2, NAN, &m), ERR_RANGE);
    assert_int_equal(bsr_from_dense(w, 4, 4, 3, 2, 2, 0.0f, &m), ERR_RANGE);
    tu_assert_log_contains("br (block rows) = 0", "threshold", "row stride", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
}

/* ---- malformed files ---------------------------------------------------------------------- */

/*
 * The base image: a 5x7 matrix in 4x4 blocks, all four blocks stored, so both edges carry
 * padding. Layout: header 0..63, row_ptr[3] 64..75, col_idx[4] 76..91, zero bytes 92..127,
 * blocks 128.. (4 x 64 bytes).
 */
static struct bsr *base_matrix(void)
{
    float w[5 * 7];
    for (int i = 0; i < 35; i++)
        w[i] = (float)(i + 1);
    struct bsr *m;
    assert_int_equal(bsr_from_dense(w, 5, 7, 7, 4, 4, 0.0f, &m), 0);
    assert_int_equal(m->nnzb, 4);
    assert_int_equal(m->image_size, 128 + 4 * 64);
    return m;
}

static void put32(unsigned char *p, size_t off, uint32_t v) { memcpy(p + off, &v, 4); }
static void put64(unsigned char *p, size_t off, uint64_t v) { memcpy(p + off, &v, 8); }
static void putf(unsigned char *p, size_t off, float v) { memcpy(p + off, &v, 4); }

struct bad_case {
    const char *what;
    size_t off; /* where to write */
    int width;  /* 4, 8 (integers), -4 (a float), 1 (a byte), 0: the length changes instead */
    uint64_t value;
    long dlen;  /* length change when width == 0 */
    int code;
    const char *needle;
};

static void test_malformed(void **state)
{
    (void)state;
    /* block k at 128 + 64k; element [i][j] at + 4 * (4i + j) */
#define ELEM(k, i, j) (128 + 64 * (k) + 4 * (4 * (i) + (j)))
    static const struct bad_case cases[] = {
        {"short header", 0, 0, 0, -(128 + 4 * 64 - 10), ERR_TRUNCATED, "shorter than the 64-byte header"},
        {"empty file", 0, 0, 0, -(128 + 4 * 64), ERR_TRUNCATED, "0 bytes"},
        {"magic", 0, 1, 'X', 0, ERR_FORMAT, "bad magic"},
        {"version", 8, 4, 2, 0, ERR_UNSUPPORTED, "version 2"},
        {"dtype", 12, 4, 1, 0, ERR_UNSUPPORTED, "dtype 1"},
        {"reserved", 56, 8, 1, 0, ERR_FORMAT, "reserved header bytes"},
        {"rows 0", 16, 8, 0, 0, ERR_RANGE, "rows = 0"},
        {"cols huge", 24, 8, UINT64_MAX, 0, ERR_RANGE, "cols = 18446744073709551615"},
        {"br 0", 32, 4, 0, 0, ERR_RANGE, "br (block rows) = 0"},
        {"bc huge", 36, 4, 5000, 0, ERR_RANGE, "bc (block columns) = 5000"},
        {"nnzb > grid", 40, 8, 5, 0, ERR_RANGE, "nnzb = 5 exceeds"},
        {"nnzb huge", 40, 8, UINT64_C(1) << 62, 0, ERR_RANGE, "nnzb = 4611686018427387904"},
        {"nnzb smaller", 40, 8, 3, 0, ERR_MISMATCH, "trailing"},
        {"rows larger (sizes)", 16, 8, 1000, 0, ERR_RANGE, "nnzb = 4 exceeds"}, /* see below */
        {"truncated body", 0, 0, 0, -4, ERR_TRUNCATED, "truncated"},
        {"trailing byte", 0, 0, 0, 1, ERR_MISMATCH, "trailing bytes"},
        {"row_ptr[0]", 64, 4, 1, 0, ERR_FORMAT, "row_ptr[0] = 1"},
        {"row_ptr decreasing", 68, 4, 5, 0, ERR_FORMAT, "row_ptr[2] = 4 < row_ptr[1] = 5"},
        {"row_ptr end", 72, 4, 3, 0, ERR_MISMATCH, "row_ptr[2] = 3, must equal nnzb = 4"},
        {"col out of range", 80, 4, 2, 0, ERR_RANGE, "col_idx[1] = 2 (block row 0) out of range"},
        {"col huge", 88, 4, UINT32_MAX, 0, ERR_RANGE, "col_idx[3] = 4294967295"},
        {"col unsorted", 76, 4, 1, 0, ERR_FORMAT, "col_idx[1] = 1 after 1"},
        {"col duplicate", 88, 4, 0, 0, ERR_FORMAT, "col_idx[3] = 0 after 0 in block row 1"},
        {"column padding", ELEM(1, 0, 3), -4, 0x3f800000, 0, ERR_FORMAT,
         "block 1 (block row 0, block column 1): element [0][3]"},
        {"row padding", ELEM(2, 1, 0), -4, 0x3f800000, 0, ERR_FORMAT,
         "block 2 (block row 1, block column 0): element [1][0]"},
        {"negative zero padding", ELEM(3, 3, 3), 4, 0x80000000u, 0, ERR_FORMAT,
         "element [3][3]"},
        {"alignment padding", 100, 1, 7, 0, ERR_FORMAT, "padding byte at offset 100"},
    };
#undef ELEM
    struct bsr *base = base_matrix();
    /* "rows larger": rows 1000 makes 250 block rows, whose 4-block grid check still passes
       (nnzb 4 <= 250*2) but the sizes now need more bytes: truncated. Fix the expectation. */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct bad_case *c = &cases[i];
        size_t len = base->image_size + (size_t)(c->width == 0 ? c->dlen : 0);
        unsigned char *img = calloc(1, base->image_size + 8);
        memcpy(img, base->image, base->image_size);
        if (c->width == 1)
            img[c->off] = (unsigned char)c->value;
        else if (c->width == 4)
            put32(img, c->off, (uint32_t)c->value);
        else if (c->width == 8)
            put64(img, c->off, c->value);
        else if (c->width == -4)
            putf(img, c->off, 1.0f);
        int want = c->code;
        const char *needle = c->needle;
        if (strcmp(c->what, "rows larger (sizes)") == 0) {
            want = ERR_TRUNCATED;
            needle = "the header's sizes need";
        }
        struct bsr *m = (struct bsr *)1;
        tu_log_capture_begin();
        int rc = bsr_open_mem("bad.bsr", img, len, &m);
        if (rc != want || !strstr(tu_log_captured(), needle))
            fail_msg("case '%s': got %s (%s), want %s with '%s'", c->what, err_name(rc),
                     tu_log_captured(), err_name(want), needle);
        assert_null(m);
        assert_non_null(strstr(tu_log_captured(), "bad.bsr"));
        tu_log_capture_end();
        free(img);
    }
    /* the base itself loads, and a missing file is -ENOENT */
    struct bsr *m;
    assert_int_equal(bsr_open_mem("ok.bsr", base->image, base->image_size, &m), 0);
    bsr_close(m);
    tu_log_capture_begin();
    assert_int_equal(bsr_open("/nonexistent/dir/x.bsr", &m), -ENOENT);
    tu_assert_log_contains("open(/nonexistent/dir/x.bsr)", NULL);
    tu_log_capture_end();
    bsr_close(base);
}

/* ---- clocher sparsify --------------------------------------------------------------------- */

static int run(const char *first, ...)
{
    char *argv[16];
    int argc = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return cmd_sparsify(argc, argv);
}

static void test_cli(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char in[512], out[512];
    snprintf(in, sizeof in, "%s/w.f32", dir);
    snprintf(out, sizeof out, "%s/w.bsr", dir);
    const size_t rows = 40, cols = 50;
    float *w = random_sparse(rows, cols, 8, 8, 0.6);
    tu_write_file(in, w, rows * cols * sizeof(float));

    tu_log_capture_begin();
    assert_int_equal(run("sparsify", "--help", NULL), CMD_EXIT_OK);
    assert_int_equal(run("sparsify", NULL), CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--shape", "40x50", NULL), CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "0x8", "--shape", "40x50", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "8", "--shape", "40x50", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8x", "--shape", "40x50", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "2000x8", "--shape", "40x50", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", NULL), CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--shape", "40x50", "--tensor",
                         "x", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--tensor", "x", NULL),
                     CMD_EXIT_USAGE); /* a raw file is not an IEBIN directory */
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--shape", "40x50",
                         "--threshold", "-1", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--shape", "40x50",
                         "--threshold", "nan", NULL),
                     CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, out, "--bogus", NULL), CMD_EXIT_USAGE);
    assert_int_equal(run("sparsify", in, NULL), CMD_EXIT_USAGE);
    /* input problems */
    assert_int_equal(run("sparsify", "/nonexistent.f32", out, "--block", "8x8", "--shape",
                         "40x50", NULL),
                     CMD_EXIT_INPUT);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--shape", "40x51", NULL),
                     CMD_EXIT_INPUT);
    assert_int_equal(access(out, F_OK), -1);
    tu_log_capture_end();

    /* a real conversion, then the same with pruning */
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--shape", "40x50", NULL),
                     CMD_EXIT_OK);
    struct bsr *got, *want;
    assert_int_equal(bsr_open(out, &got), 0);
    assert_int_equal(bsr_from_dense(w, rows, cols, cols, 8, 8, 0.0f, &want), 0);
    assert_int_equal(got->image_size, want->image_size);
    assert_memory_equal(got->image, want->image, want->image_size);
    assert_true(got->nnzb < got->nbr * got->nbc); /* 60 % of 35 blocks were zero */
    bsr_close(got);
    bsr_close(want);
    assert_int_equal(run("sparsify", in, out, "--block", "8x8", "--shape", "40x50",
                         "--threshold", "0.99", NULL),
                     CMD_EXIT_OK);
    assert_int_equal(bsr_open(out, &got), 0);
    assert_int_equal(bsr_from_dense(w, rows, cols, cols, 8, 8, 0.99f, &want), 0);
    assert_memory_equal(got->image, want->image, want->image_size);
    bsr_close(got);
    bsr_close(want);

    /* the `clocher` executable, when this build has it, routes the subcommand here */
    const char *exe = tu_build_path("client/clocher");
    if (access(exe, X_OK) == 0) {
        char cmd[1024], *text = NULL;
        snprintf(cmd, sizeof cmd, "%s sparsify --help", exe);
        assert_int_equal(tu_run(cmd, &text), 0);
        assert_non_null(strstr(text, "usage: clocher sparsify"));
        free(text);
        /* the IEBIN input: stories260K converted, one attention matrix sparsified; the
           file's dense form is the tensor exactly */
        char *mdir = tu_mkdtemp();
        snprintf(cmd, sizeof cmd, "%s convert %s %s >/dev/null 2>&1", exe,
                 tu_fixture("stories260K/stories260K.bin"), mdir);
        assert_int_equal(tu_run(cmd, NULL), 0);
        snprintf(cmd, sizeof cmd, "%s sparsify %s %s --tensor blk.0.attn_q --block 16x8", exe,
                 mdir, out);
        assert_int_equal(tu_run(cmd, NULL), 0);
        snprintf(cmd, sizeof cmd, "%s sparsify %s %s --tensor blk.0.attn_norm --block 16x8 "
                 "2>/dev/null", exe, mdir, out);
        assert_int_equal(tu_run(cmd, NULL), CMD_EXIT_INPUT); /* 1-D */
        struct iebin_model *im;
        assert_int_equal(iebin_open(mdir, &im), 0);
        const struct iebin_tensor *t = iebin_find(im, "blk.0.attn_q");
        assert_non_null(t);
        assert_int_equal(bsr_open(out, &got), 0);
        assert_int_equal(got->k.rows, t->shape[0]);
        assert_int_equal(got->k.cols, t->shape[1]);
        float *d = malloc(t->size);
        bsr_to_dense(got, d);
        assert_memory_equal(d, t->data, t->size);
        free(d);
        bsr_close(got);
        iebin_close(im);
        tu_rmtree(mdir);
        free(mdir);
    }
    free(w);
    tu_rmtree(dir);
    free(dir);
}

/* ---- the documented layout, packed independently: the fuzz seeds ------------------------- */

static void test_seeds(void **state)
{
    (void)state;
    const char *src = getenv("CLOCHER_SOURCE_DIR");
    assert_non_null(src);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/bsr", src);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int ok = 0, bad = 0;
    struct dirent *e;
    tu_log_capture_begin();
    while ((e = readdir(d))) {
        int want_ok = strncmp(e->d_name, "ok_", 3) == 0;
        if (!want_ok && strncmp(e->d_name, "bad_", 4) != 0)
            continue;
        struct bsr *m = NULL;
        int rc = bsr_open(tu_path(dir, e->d_name), &m);
        if ((rc == 0) != want_ok)
            fail_msg("seed %s: %s (%s)", e->d_name, err_name(rc), tu_log_captured());
        *(want_ok ? &ok : &bad) += 1;
        bsr_close(m);
    }
    tu_log_capture_end();
    closedir(d);
    assert_true(ok >= 5 && bad >= 10);
}

int main(void)
{
    if (kern_init() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        ISA_CASE_TESTS(test_gemv),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
