/*
 * cmd_sparsify.c — `clocher sparsify IN OUT --block RxC [--threshold T]
 * (--tensor NAME | --shape ROWSxCOLS)`: converts one dense weight matrix to a block-sparse
 * (BSR) file (worker/formats/bsr.h, docs/BSR.md), dropping all-zero blocks and, with --threshold,
 * blocks whose largest |w| is below T.
 *
 * Input, two forms (a directory is an IEBIN model, anything else a raw file):
 *  - IEBIN model directory + --tensor NAME: a 2-D tensor of any dtype the kernels can widen
 *    to f32 (f32, f16, bf16, q8_0, q4_0), converted row by row — the model's own weights;
 *  - raw file + --shape ROWSxCOLS: little-endian f32, row-major, exactly ROWS*COLS*4 bytes —
 *    the simplest thing any other tool (numpy's tofile) can produce.
 * Exit codes: cmds.h (2 usage, 3 input missing/invalid, 1 conversion or write failure).
 */
#include "cmds.h"

#include "bsr.h"
#include "err.h"
#include "iebin.h"
#include "kern.h"
#include "log.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher sparsify IN OUT --block RxC [--threshold T]\n"
            "                        (--tensor NAME | --shape ROWSxCOLS)\n"
            "\n"
            "Converts one dense weight matrix to a block-sparse (BSR) file of RxC f32 blocks\n"
            "(docs/BSR.md). All-zero blocks are dropped; with --threshold, so is every block\n"
            "whose largest |w| is below T.\n"
            "\n"
            "  IN              an IEBIN model directory (with --tensor) or a raw file of\n"
            "                  little-endian row-major f32 (with --shape)\n"
            "  OUT             the BSR file to write (replaced atomically)\n"
            "  --block RxC     block shape, each 1..%u (e.g. 16x16)\n"
            "  --threshold T   prune blocks with max |w| < T (default 0: only zero blocks)\n"
            "  --tensor NAME   the 2-D tensor of the IEBIN model (e.g. blk.0.attn_q)\n"
            "  --shape RxC     the raw file's matrix shape\n",
            BSR_MAX_BLOCK);
}

/* "AxB" with 1 <= A, B <= max. */
static int parse_dims(const char *s, uint64_t max, uint64_t *a, uint64_t *b)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end != 'x' || end[1] < '0' || end[1] > '9')
        return -1;
    unsigned long long y = strtoull(end + 1, &end, 10);
    if (errno || *end || x == 0 || y == 0 || x > max || y > max)
        return -1;
    *a = x;
    *b = y;
    return 0;
}

/* Reads the raw f32 file into *out ([rows][cols]). 0 or CMD_EXIT_INPUT (message printed). */
static int read_raw(const char *path, uint64_t rows, uint64_t cols, float **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "clocher sparsify: cannot open %s: %s\n", path, strerror(errno));
        return CMD_EXIT_INPUT;
    }
    struct stat st;
    uint64_t want = rows * cols * sizeof(float); /* rows, cols <= 2^31: no overflow */
    if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size != want) {
        fprintf(stderr,
                "clocher sparsify: %s is %lld bytes; --shape %llux%llu of f32 needs %llu\n",
                path, (long long)st.st_size, (unsigned long long)rows,
                (unsigned long long)cols, (unsigned long long)want);
        fclose(f);
        return CMD_EXIT_INPUT;
    }
    float *w = malloc(want ? want : 1);
    if (!w || fread(w, 1, want, f) != want) {
        fprintf(stderr, "clocher sparsify: cannot read %s\n", path);
        free(w);
        fclose(f);
        return w ? CMD_EXIT_INPUT : CMD_EXIT_FAIL;
    }
    fclose(f);
    *out = w;
    return 0;
}

/* Reads IEBIN tensor `name` widened to f32. 0 or CMD_EXIT_INPUT / CMD_EXIT_FAIL. */
static int read_iebin(const char *dir, const char *name, uint64_t *rows, uint64_t *cols,
                      float **out)
{
    struct iebin_model *m;
    if (iebin_open_ex(dir, IEBIN_OPEN_LAZY, &m) != 0)
        return CMD_EXIT_INPUT; /* the reason was logged */
    const struct iebin_tensor *t = iebin_find(m, name);
    for (size_t i = 0; !t && i < m->n_tensors; i++) /* names outside the architecture table */
        if (strcmp(m->tensors[i].name, name) == 0)
            t = &m->tensors[i];
    int rc = CMD_EXIT_INPUT;
    if (!t) {
        fprintf(stderr, "clocher sparsify: %s has no tensor '%s'\n", dir, name);
        goto out;
    }
    if (t->n_dims != 2 || t->shape[0] == 0 || t->shape[1] == 0 || t->shape[0] > BSR_MAX_DIM ||
        t->shape[1] > BSR_MAX_DIM) {
        fprintf(stderr, "clocher sparsify: tensor '%s' is not a 2-D matrix of at most 2^31 "
                        "rows and columns\n",
                name);
        goto out;
    }
    *rows = t->shape[0];
    *cols = t->shape[1];
    uint64_t rb;
    float *w = malloc(*rows * *cols * sizeof(float));
    if (!w || dtype_row_bytes(t->dtype, *cols, &rb) != 0) {
        fprintf(stderr, "clocher sparsify: tensor '%s': out of memory or bad row size\n",
                name);
        free(w);
        rc = CMD_EXIT_FAIL;
        goto out;
    }
    for (uint64_t r = 0; r < *rows; r++)
        kern_row_to_f32(t->dtype, (const char *)t->data + r * rb, w + r * *cols, *cols);
    *out = w;
    rc = 0;
out:
    iebin_close(m);
    return rc;
}

int cmd_sparsify(int argc, char **argv)
{
    static const struct option opts[] = {
        {"block", required_argument, NULL, 'b'},  {"threshold", required_argument, NULL, 't'},
        {"tensor", required_argument, NULL, 'n'}, {"shape", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    uint64_t br = 0, bc = 0, rows = 0, cols = 0;
    float threshold = 0.0f;
    const char *tensor = NULL;
    bool have_shape = false;
    int c;
    optind = 0; /* GNU: full re-initialisation (tests call commands more than once) */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (parse_dims(optarg, BSR_MAX_BLOCK, &br, &bc) != 0) {
                fprintf(stderr, "clocher sparsify: --block '%s': expected RxC with 1 <= R, C "
                                "<= %u\n",
                        optarg, BSR_MAX_BLOCK);
                return CMD_EXIT_USAGE;
            }
            break;
        case 't': {
            char *end;
            errno = 0;
            double t = strtod(optarg, &end);
            if (errno || end == optarg || *end || !isfinite(t) || t < 0.0 || t > 3.4e38) {
                fprintf(stderr, "clocher sparsify: --threshold '%s': expected a finite number "
                                ">= 0\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            threshold = (float)t;
            break;
        }
        case 'n':
            tensor = optarg;
            break;
        case 's':
            if (parse_dims(optarg, BSR_MAX_DIM, &rows, &cols) != 0) {
                fprintf(stderr, "clocher sparsify: --shape '%s': expected ROWSxCOLS, each "
                                "1..2^31\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            have_shape = true;
            break;
        case 'h':
            usage(stdout);
            return CMD_EXIT_OK;
        default:
            fprintf(stderr, "clocher sparsify: unknown or incomplete option '%s'\n\n",
                    argv[optind - 1]);
            usage(stderr);
            return CMD_EXIT_USAGE;
        }
    }
    const char *why = NULL;
    if (argc - optind != 2)
        why = "expected IN and OUT";
    else if (br == 0)
        why = "--block is required";
    else if (!tensor == !have_shape)
        why = "give exactly one of --tensor (IEBIN directory) and --shape (raw f32 file)";
    if (why) {
        fprintf(stderr, "clocher sparsify: %s\n\n", why);
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    struct stat st;
    bool is_dir = stat(in, &st) == 0 && S_ISDIR(st.st_mode);
    if (tensor && !is_dir) {
        fprintf(stderr, "clocher sparsify: --tensor needs IN to be an IEBIN model directory\n");
        return CMD_EXIT_USAGE;
    }
    if (have_shape && is_dir) {
        fprintf(stderr, "clocher sparsify: --shape needs IN to be a raw f32 file, %s is a "
                        "directory\n",
                in);
        return CMD_EXIT_USAGE;
    }
    if (kern_init() != 0)
        return CMD_EXIT_FAIL;
    float *w = NULL;
    int rc = tensor ? read_iebin(in, tensor, &rows, &cols, &w) : read_raw(in, rows, cols, &w);
    if (rc)
        return rc;
    struct bsr *m = NULL;
    if (bsr_from_dense(w, rows, cols, (size_t)cols, (uint32_t)br, (uint32_t)bc, threshold,
                       &m) != 0 ||
        bsr_write(m, out) != 0) {
        free(w);
        bsr_close(m);
        return CMD_EXIT_FAIL; /* logged */
    }
    const uint64_t total = m->nbr * m->nbc;
    printf("%s: %llux%llu, %llux%llu blocks, kept %llu of %llu (%.1f%% sparse), %zu bytes "
           "(dense f32: %llu)\n",
           out, (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)br,
           (unsigned long long)bc, (unsigned long long)m->nnzb, (unsigned long long)total,
           100.0 * (double)(total - m->nnzb) / (double)total, m->image_size,
           (unsigned long long)(rows * cols * sizeof(float)));
    free(w);
    bsr_close(m);
    return CMD_EXIT_OK;
}
