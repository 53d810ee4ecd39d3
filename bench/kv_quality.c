/*
 * kv_quality.c — KL divergence of each KV cache dtype against the f32 cache on one model
 * (docs/PERFORMANCE.md, "KV cache dtypes"; bench/kv_quality.sh runs it): the token ids of a
 * file are fed teacher-forced, a prefill of --ctx tokens then --eval decode steps, through the
 * batched forward pass over a pool of each dtype (tests/kv/kvq.c), and the next-token
 * distributions of the --eval + 1 rows compared with the f32 pool's. 8-bit types are run with
 * and without the Walsh-Hadamard rotation. Prints one markdown row per dtype.
 *
 * usage: kv_quality --model-dir DIR --ids FILE --ctx N --eval M [--name NAME] [--threads T]
 *                   [--dtypes "f16 bf16 int8 fp8"]
 */
#include "err.h"
#include "kern.h"
#include "kvq.h"
#include "log.h"
#include "model.h"
#include "pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: kv_quality --model-dir DIR --ids FILE --ctx N --eval M [--name NAME] "
                    "[--threads T] [--dtypes \"f16 bf16 int8 fp8\"]\n");
    return 2;
}

/* Whitespace-separated token ids; *n of them into a malloc'd array. */
static int read_ids(const char *path, int32_t **out, size_t *n)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        LOG_ERR("kv_quality: cannot open %s: %s", path, strerror(e));
        return -e;
    }
    size_t cap = 4096, k = 0;
    int32_t *t = malloc(cap * sizeof *t);
    long v;
    while (t && fscanf(f, "%ld", &v) == 1) {
        if (k == cap) {
            int32_t *nt = realloc(t, 2 * cap * sizeof *t);
            if (!nt) {
                free(t);
                t = NULL;
                break;
            }
            t = nt;
            cap *= 2;
        }
        t[k++] = (int32_t)v;
    }
    fclose(f);
    if (!t) {
        LOG_ERR("kv_quality: out of memory reading %s", path);
        return -ENOMEM;
    }
    *out = t;
    *n = k;
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *ids = NULL, *name = "model", *dts = "f16 bf16 int8 fp8";
    unsigned long ctx = 0, eval = 0, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model-dir"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--ids"))
            ids = argv[i + 1];
        else if (!strcmp(argv[i], "--ctx"))
            ctx = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--eval"))
            eval = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--name"))
            name = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dtypes"))
            dts = argv[i + 1];
        else
            return usage();
    }
    if (argc % 2 == 0 || !dir || !ids || ctx == 0 || eval == 0 || threads == 0 || threads > 256)
        return usage();
    int32_t *tok = NULL;
    size_t n_tok = 0;
    struct model *m = NULL;
    struct pool *pool = NULL;
    if (kern_init() || read_ids(ids, &tok, &n_tok) || model_open(dir, 0, &m) ||
        pool_create((int)threads, POOL_PIN_NONE, &pool))
        return 1;
    if (n_tok < ctx + eval) {
        LOG_ERR("kv_quality: %s has %zu ids, --ctx + --eval need %lu", ids, n_tok, ctx + eval);
        return 2;
    }
    const size_t vocab = m->hp.vocab_size, rows = eval + 1;
    float *ref = malloc(rows * vocab * sizeof *ref), *got = malloc(rows * vocab * sizeof *got);
    if (!ref || !got || kvq_logits(m, pool, DT_F32, false, tok, (uint32_t)ctx, (uint32_t)eval, ref))
        return 1;
    char list[256];
    snprintf(list, sizeof list, "%s", dts);
    for (char *sv = NULL, *w = strtok_r(list, " ", &sv); w; w = strtok_r(NULL, " ", &sv)) {
        enum dtype dt;
        if (dtype_kv_from_name(w, &dt)) {
            LOG_ERR("kv_quality: --dtypes: '%s' is not f32, f16, bf16, int8 or fp8", w);
            return 2;
        }
        for (int unrot = 0; unrot <= dtype_is_kv8(dt); unrot++) {
            double mean, max;
            if (kvq_logits(m, pool, dt, unrot, tok, (uint32_t)ctx, (uint32_t)eval, got))
                return 1;
            kvq_kld(ref, got, rows, vocab, &mean, &max);
            printf("| %s | %lu | %s | %s | %.3g | %.3g |\n", name, ctx, w,
                   dtype_is_kv8(dt) ? (unrot ? "no" : "yes") : "-", mean, max);
            fflush(stdout);
        }
    }
    free(ref);
    free(got);
    free(tok);
    pool_destroy(pool);
    model_close(m);
    return 0;
}
