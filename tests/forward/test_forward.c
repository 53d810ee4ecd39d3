/*
 * test_forward.c — the reference forward pass against llama2.c's golden outputs on
 * stories260K (f32 import): prompt logits fed one token at a time and as prefill chunks,
 * greedy continuations and teacher-forced step logits, the same on a thread pool; f16/bf16
 * imports within their rounding; q8_0 panels against the stored int8 rows; the projection
 * hook against merged weights; the model views; and every kind of bad input with its message.
 */
#include "testutil.h"

#include "golden.h"

#include "err.h"
#include "forward.h"
#include "iebin.h"
#include "kern.h"
#include "model.h"
#include "pool.h"
#include "sampler.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-4f /* fixtures/README.md: an fp32 engine matches every logit to about 1e-4 */

static struct golden g_gold;
static char *g_tmp, *g_dir;
static struct model *g_model;

static int setup(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    golden_load(&g_gold);
    g_dir = golden_import(DT_F32, &g_tmp);
    assert_int_equal(model_open(g_dir, 0, &g_model), 0);
    assert_int_equal(g_model->hp.vocab_size, g_gold.vocab);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    model_close(g_model);
    tu_rmtree(g_tmp);
    free(g_tmp);
    free(g_dir);
    golden_free(&g_gold);
    return 0;
}

static struct forward *make(const struct model *m, uint32_t max_seq, uint32_t chunk,
                            struct pool *pool)
{
    struct forward_config cfg = {.max_seq = max_seq, .max_chunk = chunk, .pool = pool};
    struct forward *f;
    assert_int_equal(forward_create(m, &cfg, &f), 0);
    return f;
}

static void assert_close(const float *got, const float *want, size_t n, float tol,
                         const char *what, size_t c, size_t p)
{
    float d = golden_max_diff(got, want, n);
    if (!(d <= tol))
        fail_msg("case %zu %s %zu: max |logit - golden| = %g > %g", c, what, p, (double)d,
                 (double)tol);
}

/* ---- golden logits ------------------------------------------------------------------------ */

static void test_prompt_one_token_at_a_time(void **state)
{
    (void)state;
    const size_t V = g_gold.vocab;
    float *logits = malloc(V * sizeof *logits);
    struct forward *f = make(g_model, 0, 0, NULL);
    for (size_t c = 0; c < g_gold.n_cases; c++) {
        const struct golden_case *gc = &g_gold.cases[c];
        assert_int_equal(forward_truncate(f, 0), 0);
        for (size_t p = 0; p < gc->n_prompt; p++) {
            assert_int_equal(forward_eval(f, &gc->prompt[p], 1, FORWARD_LOGITS_LAST, logits), 0);
            assert_int_equal(forward_pos(f), p + 1);
            assert_close(logits, gc->prompt_logits + p * V, V, TOL, "position", c, p);
        }
    }
    forward_destroy(f);
    free(logits);
}

/* The whole prompt in one call, split into chunks of `chunk` tokens internally. */
static void prefill_cases(uint32_t chunk, struct pool *pool)
{
    const size_t V = g_gold.vocab;
    struct forward *f = make(g_model, 0, chunk, pool);
    for (size_t c = 0; c < g_gold.n_cases; c++) {
        const struct golden_case *gc = &g_gold.cases[c];
        float *all = malloc(gc->n_prompt * V * sizeof *all), *last = malloc(V * sizeof *last);
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_eval(f, gc->prompt, gc->n_prompt, FORWARD_LOGITS_ALL, all), 0);
        assert_int_equal(forward_pos(f), gc->n_prompt);
        for (size_t p = 0; p < gc->n_prompt; p++)
            assert_close(all + p * V, gc->prompt_logits + p * V, V, TOL, "prefill position", c,
                         p);
        /* the last row alone, as generation asks for it */
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_eval(f, gc->prompt, gc->n_prompt, FORWARD_LOGITS_LAST, last), 0);
        assert_close(last, gc->prompt_logits + (gc->n_prompt - 1) * V, V, TOL, "last of prefill",
                     c, gc->n_prompt - 1);
        free(all);
        free(last);
    }
    forward_destroy(f);
}

static void test_prompt_prefill(void **state)
{
    (void)state;
    prefill_cases(FORWARD_CHUNK_MAX, NULL); /* every prompt in one chunk */
    prefill_cases(7, NULL);                 /* chunks attending to earlier chunks */
    prefill_cases(1, NULL);
}

/*
 * Free-running greedy generation must reproduce the reference's ids up to the first step
 * whose margin is below 0.01; teacher-forced on the reference's ids, the logits at the stored
 * steps must match (step g = after feeding greedy[0..g-1]; step 0 = the prompt's last row).
 */
static void greedy_cases(struct pool *pool, uint32_t chunk)
{
    const size_t V = g_gold.vocab;
    float *logits = malloc(V * sizeof *logits);
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.0f;
    struct sampler *s;
    assert_int_equal(sampler_create(&sp, (uint32_t)V, &s), 0);
    struct forward *f = make(g_model, 0, chunk, pool);
    for (size_t c = 0; c < g_gold.n_cases; c++) {
        const struct golden_case *gc = &g_gold.cases[c];
        /* free running */
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_eval(f, gc->prompt, gc->n_prompt, FORWARD_LOGITS_LAST, logits),
                         0);
        for (size_t i = 0; i < gc->cutoff; i++) {
            int32_t id = sampler_sample(s, logits, NULL, 0);
            if (id != gc->greedy[i])
                fail_msg("case %zu: greedy step %zu: %d, reference %d (margin %g)", c, i, id,
                         gc->greedy[i], (double)gc->margin[i]);
            if (i + 1 < gc->cutoff)
                assert_int_equal(forward_eval(f, &id, 1, FORWARD_LOGITS_LAST, logits), 0);
        }
        /* teacher forced */
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_eval(f, gc->prompt, gc->n_prompt, FORWARD_LOGITS_LAST, logits),
                         0);
        size_t k = 0;
        for (size_t step = 0; k < gc->n_steps; step++) {
            if (step == gc->step[k]) {
                assert_close(logits, gc->step_logits[k], V, TOL, "greedy step", c, step);
                k++;
            }
            if (step < gc->cutoff)
                assert_int_equal(sampler_argmax(logits, V), gc->greedy[step]);
            if (k < gc->n_steps)
                assert_int_equal(
                    forward_eval(f, &gc->greedy[step], 1, FORWARD_LOGITS_LAST, logits), 0);
        }
    }
    forward_destroy(f);
    sampler_destroy(s);
    free(logits);
}

static void test_greedy(void **state)
{
    (void)state;
    greedy_cases(NULL, 0);
}

/* The same numbers with matmul rows and attention heads on a pool of threads. */
static void test_pool(void **state)
{
    (void)state;
    struct pool *p;
    assert_int_equal(pool_create(2, POOL_PIN_NONE, &p), 0);
    prefill_cases(16, p);
    greedy_cases(p, 0);
    pool_destroy(p);
}

/* Reusing a prefix: truncating and feeding the rest again gives the same logits. */
static void test_truncate(void **state)
{
    (void)state;
    const size_t V = g_gold.vocab;
    const struct golden_case *gc = &g_gold.cases[4];
    float *logits = malloc(V * sizeof *logits);
    struct forward *f = make(g_model, 0, 0, NULL);
    assert_int_equal(forward_eval(f, gc->prompt, gc->n_prompt, FORWARD_LOGITS_NONE, NULL), 0);
    assert_int_equal(forward_truncate(f, 50), 0);
    assert_int_equal(forward_pos(f), 50);
    assert_int_equal(
        forward_eval(f, gc->prompt + 50, gc->n_prompt - 50, FORWARD_LOGITS_LAST, logits), 0);
    assert_close(logits, gc->prompt_logits + (gc->n_prompt - 1) * V, V, TOL, "after truncate", 4,
                 gc->n_prompt - 1);
    forward_destroy(f);
    free(logits);
}

/* The model `im` with every tensor widened to f32 (exactly: f16 and bf16 are subsets of f32). */
static char *widened_model(const struct iebin_model *im, const char *tmp)
{
    char *dir = strdup(tu_path(tmp, "widened"));
    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(dir, im->arch, "widened", &im->hp, &w), 0);
    for (size_t i = 0; i < im->n_tensors; i++) {
        const struct iebin_tensor *t = &im->tensors[i];
        uint64_t cols = t->shape[t->n_dims - 1], rows = 1, rb;
        for (int d = 0; d + 1 < t->n_dims; d++)
            rows *= t->shape[d];
        assert_int_equal(dtype_row_bytes(t->dtype, cols, &rb), 0);
        float *data = malloc(rows * cols * sizeof *data);
        for (uint64_t r = 0; r < rows; r++)
            kern_row_to_f32(t->dtype, (const char *)t->data + r * rb, data + r * cols, cols);
        assert_int_equal(iebin_writer_add(w, t->name, DT_F32, t->shape, t->n_dims, data,
                                          rows * cols * sizeof *data),
                         0);
        free(data);
    }
    assert_int_equal(iebin_writer_finish(w), 0);
    return dir;
}

/*
 * f16 and bf16 imports. Against the same weights widened to f32 the pass must agree to f32
 * rounding: decode (GEMV) widens weights exactly; the f16 GEMM too, while the bf16 GEMM on
 * AVX512-BF16 also rounds activations to bf16 (kern.h), hence its looser prefill tolerance.
 * Against llama2.c's f32 golden logits the rounded weights themselves move logits (this small
 * model amplifies them): only a sanity bound.
 */
static void test_half_precision_imports(void **state)
{
    (void)state;
    const size_t V = g_gold.vocab;
    const struct {
        enum dtype dt;
        float prefill_tol, golden_tol;
    } kinds[] = {{DT_F16, 1e-4f, 0.2f}, {DT_BF16, 1.0f, 2.0f}};
    for (size_t k = 0; k < 2; k++) {
        char *tmp, *dir = golden_import(kinds[k].dt, &tmp);
        struct model *m, *wm;
        assert_int_equal(model_open(dir, 0, &m), 0);
        assert_int_equal(m->layers[0].wq.dtype, kinds[k].dt);
        assert_int_equal(m->tok_embd.dtype, kinds[k].dt);
        char *wdir = widened_model(m->im, tmp);
        assert_int_equal(model_open(wdir, 0, &wm), 0);
        struct forward *f = make(m, 0, 0, NULL), *wf = make(wm, 0, 0, NULL);
        float worst_golden = 0.0f, worst_prefill = 0.0f, worst_decode = 0.0f;
        float *one = malloc(V * sizeof *one), *wone = malloc(V * sizeof *wone);
        for (size_t c = 0; c < g_gold.n_cases; c++) {
            const struct golden_case *gc = &g_gold.cases[c];
            const size_t n = gc->n_prompt;
            float *all = malloc(n * V * sizeof *all), *wall = malloc(n * V * sizeof *wall);
            assert_int_equal(forward_truncate(f, 0), 0);
            assert_int_equal(forward_truncate(wf, 0), 0);
            assert_int_equal(forward_eval(f, gc->prompt, n, FORWARD_LOGITS_ALL, all), 0);
            assert_int_equal(forward_eval(wf, gc->prompt, n, FORWARD_LOGITS_ALL, wall), 0);
            float d = golden_max_diff(all, wall, n * V);
            worst_prefill = d > worst_prefill ? d : worst_prefill;
            d = golden_max_diff(all, gc->prompt_logits, n * V);
            worst_golden = d > worst_golden ? d : worst_golden;
            /* one token at a time: every matmul is a GEMV */
            assert_int_equal(forward_truncate(f, 0), 0);
            assert_int_equal(forward_truncate(wf, 0), 0);
            for (size_t p = 0; p < n; p++) {
                assert_int_equal(forward_eval(f, &gc->prompt[p], 1, FORWARD_LOGITS_LAST, one), 0);
                assert_int_equal(forward_eval(wf, &gc->prompt[p], 1, FORWARD_LOGITS_LAST, wone),
                                 0);
                d = golden_max_diff(one, wone, V);
                worst_decode = d > worst_decode ? d : worst_decode;
            }
            free(all);
            free(wall);
        }
        print_message("  %s weights: max |logit diff| vs widened f32: prefill %.2e, decode %.2e;"
                      " vs llama2.c f32 golden: %.2e\n",
                      dtype_info(kinds[k].dt)->name, (double)worst_prefill,
                      (double)worst_decode, (double)worst_golden);
        assert_true(worst_decode <= 1e-4f);
        assert_true(worst_prefill <= kinds[k].prefill_tol);
        assert_true(worst_golden <= kinds[k].golden_tol);
        free(one);
        free(wone);
        forward_destroy(f);
        forward_destroy(wf);
        model_close(m);
        model_close(wm);
        tu_rmtree(tmp);
        free(tmp);
        free(dir);
        free(wdir);
    }
}

/*
 * The int8 path: q8_0 matrices repacked into panels at load (AVX-512; kernels/include/quant.h "q8_0
 * panels") against the same model read from its stored rows (CLOCHER_Q8_PANELS=0). Both
 * quantize activations the same way; the panel GEMM and the stored-row GEMV/GEMM differ only in
 * the order of their f32 sums, so the logits agree to a few ulps of their size. With and without
 * a pool the panel path gives the same bits (the same kernel on the same rows). Against the f32
 * golden logits, int8 weights and activations move them: a sanity bound only.
 */
static void test_q8_0_panels(void **state)
{
    (void)state;
    const size_t V = g_gold.vocab;
    char *tmp = tu_mkdtemp(), *dir = golden_quantize_q8(g_model->im, tmp);
    struct model *m, *ms;
    assert_int_equal(model_open(dir, 0, &m), 0);
    assert_int_equal(setenv("CLOCHER_Q8_PANELS", "0", 1), 0);
    assert_int_equal(model_open(dir, 0, &ms), 0);
    assert_int_equal(unsetenv("CLOCHER_Q8_PANELS"), 0);
    assert_int_equal(m->layers[0].wq.dtype, DT_Q8_0);
    assert_null(ms->layers[0].wq.panels);
    if (kern_isa() == KERN_ISA_AVX512) {
        assert_non_null(m->layers[0].wq.panels);
        assert_non_null(m->output.panels); /* tied: a repacked copy of tok_embd */
        assert_null(m->layers[0].w_down.panels); /* f32 */
        assert_false(model_reads_stored(m, "blk.0.attn_q"));
        assert_true(model_reads_stored(ms, "blk.0.attn_q"));
    } else {
        assert_null(m->layers[0].wq.panels);
        print_message("  no q8_0 panels on this machine (ISA %s)\n", kern_isa_name(kern_isa()));
    }
    struct pool *p;
    assert_int_equal(pool_create(2, POOL_PIN_NONE, &p), 0);
    struct forward *f = make(m, 0, 0, NULL), *fs = make(ms, 0, 0, NULL), *fp = make(m, 0, 0, p);
    float worst_prefill = 0.0f, worst_decode = 0.0f, worst_golden = 0.0f;
    float *one = malloc(V * sizeof *one), *sone = malloc(V * sizeof *sone);
    float *pone = malloc(V * sizeof *pone);
    for (size_t c = 0; c < g_gold.n_cases; c++) {
        const struct golden_case *gc = &g_gold.cases[c];
        const size_t n = gc->n_prompt;
        float *all = malloc(n * V * sizeof *all), *sall = malloc(n * V * sizeof *sall);
        float *pall = malloc(n * V * sizeof *pall);
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_truncate(fs, 0), 0);
        assert_int_equal(forward_truncate(fp, 0), 0);
        assert_int_equal(forward_eval(f, gc->prompt, n, FORWARD_LOGITS_ALL, all), 0);
        assert_int_equal(forward_eval(fs, gc->prompt, n, FORWARD_LOGITS_ALL, sall), 0);
        assert_int_equal(forward_eval(fp, gc->prompt, n, FORWARD_LOGITS_ALL, pall), 0);
        assert_memory_equal(all, pall, n * V * sizeof *all);
        float d = golden_max_diff(all, sall, n * V);
        worst_prefill = d > worst_prefill ? d : worst_prefill;
        d = golden_max_diff(all, gc->prompt_logits, n * V);
        worst_golden = d > worst_golden ? d : worst_golden;
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_truncate(fs, 0), 0);
        assert_int_equal(forward_truncate(fp, 0), 0);
        for (size_t t = 0; t < n; t++) { /* one token at a time: n = 1 products */
            assert_int_equal(forward_eval(f, &gc->prompt[t], 1, FORWARD_LOGITS_LAST, one), 0);
            assert_int_equal(forward_eval(fs, &gc->prompt[t], 1, FORWARD_LOGITS_LAST, sone), 0);
            assert_int_equal(forward_eval(fp, &gc->prompt[t], 1, FORWARD_LOGITS_LAST, pone), 0);
            assert_memory_equal(one, pone, V * sizeof *one);
            d = golden_max_diff(one, sone, V);
            worst_decode = d > worst_decode ? d : worst_decode;
        }
        free(all);
        free(sall);
        free(pall);
    }
    print_message("  q8_0: max |logit diff| panels vs stored rows: prefill %.2e, decode %.2e; "
                  "vs llama2.c f32 golden: %.2e\n",
                  (double)worst_prefill, (double)worst_decode, (double)worst_golden);
    assert_true(worst_prefill <= 1e-3f);
    assert_true(worst_decode <= 2.0f);
    assert_true(worst_golden <= 4.0f);
    free(one);
    free(sone);
    free(pone);
    forward_destroy(f);
    forward_destroy(fs);
    forward_destroy(fp);
    pool_destroy(p);
    model_close(m);
    model_close(ms);
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
}

/* ---- the projection hook --------------------------------------------------------------------- */

struct hook_log {
    size_t calls[64][LORA_TARGET_COUNT];
    float scale;       /* multiply every (layer 1, target) output by this */
    enum lora_target target;
};

static void hook(void *ud, uint32_t layer, enum lora_target t, const float *x, size_t n,
                 float *y, size_t ldy)
{
    struct hook_log *h = ud;
    assert_non_null(x);
    assert_true(n >= 1);
    uint32_t in, out;
    lora_target_dims(&g_model->hp, t, &in, &out);
    assert_int_equal(ldy, out);
    h->calls[layer][t]++;
    if (layer == 1 && t == h->target)
        for (size_t i = 0; i < n; i++)
            for (size_t r = 0; r < out; r++)
                y[i * ldy + r] *= h->scale;
}

/* A copy of the model with the rows of blk.1.<tensor> scaled by `scale`. */
static char *scaled_model(const char *tmp, const char *tensor, float scale)
{
    char *dir = strdup(tu_path(tmp, "scaled"));
    const struct iebin_model *im = g_model->im;
    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(dir, im->arch, "scaled", &im->hp, &w), 0);
    for (size_t i = 0; i < im->n_tensors; i++) {
        const struct iebin_tensor *t = &im->tensors[i];
        float *data = malloc(t->size);
        memcpy(data, t->data, t->size);
        if (strcmp(t->name, tensor) == 0)
            for (size_t e = 0; e < t->size / sizeof(float); e++)
                data[e] *= scale;
        assert_int_equal(
            iebin_writer_add(w, t->name, t->dtype, t->shape, t->n_dims, data, t->size), 0);
        free(data);
    }
    assert_int_equal(iebin_writer_finish(w), 0);
    return dir;
}

static void test_hook(void **state)
{
    (void)state;
    const size_t V = g_gold.vocab;
    const struct golden_case *gc = &g_gold.cases[2];
    const size_t n = gc->n_prompt;
    float *a = malloc(n * V * sizeof *a), *b = malloc(n * V * sizeof *b);
    struct forward *f = make(g_model, 0, 8, NULL);

    /* an identity hook: called once per projection, layer and chunk; logits unchanged */
    struct hook_log *h = calloc(1, sizeof *h);
    h->scale = 1.0f;
    forward_set_hook(f, hook, h);
    assert_int_equal(forward_eval(f, gc->prompt, n, FORWARD_LOGITS_ALL, a), 0);
    const size_t chunks = (n + 7) / 8;
    for (uint32_t l = 0; l < g_model->hp.n_layers; l++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++)
            assert_int_equal(h->calls[l][t], chunks);
    assert_close(a, gc->prompt_logits, n * V, TOL, "identity hook", 2, 0);

    /* scaling a projection's output in the hook == scaling the weight (each target once) */
    static const char *const names[LORA_TARGET_COUNT] = {
        "blk.1.attn_q", "blk.1.attn_k",   "blk.1.attn_v",  "blk.1.attn_o",
        "blk.1.ffn_gate", "blk.1.ffn_up", "blk.1.ffn_down"};
    for (int t = 0; t < LORA_TARGET_COUNT; t++) {
        char *tmp = tu_mkdtemp();
        char *dir = scaled_model(tmp, names[t], 1.5f);
        struct model *m;
        assert_int_equal(model_open(dir, 0, &m), 0);
        struct forward *fm = make(m, 0, 8, NULL);
        assert_int_equal(forward_eval(fm, gc->prompt, n, FORWARD_LOGITS_ALL, b), 0);
        memset(h, 0, sizeof *h);
        h->scale = 1.5f;
        h->target = (enum lora_target)t;
        assert_int_equal(forward_truncate(f, 0), 0);
        assert_int_equal(forward_eval(f, gc->prompt, n, FORWARD_LOGITS_ALL, a), 0);
        assert_close(a, b, n * V, 1e-4f, names[t], 2, 0);
        /* and it did change something */
        assert_true(golden_max_diff(a, gc->prompt_logits, n * V) > 1e-3f);
        forward_destroy(fm);
        model_close(m);
        tu_rmtree(tmp);
        free(tmp);
        free(dir);
    }
    forward_set_hook(f, NULL, NULL);
    assert_int_equal(forward_truncate(f, 0), 0);
    assert_int_equal(forward_eval(f, gc->prompt, n, FORWARD_LOGITS_ALL, a), 0);
    assert_close(a, gc->prompt_logits, n * V, TOL, "hook removed", 2, 0);
    forward_destroy(f);
    free(h);
    free(a);
    free(b);
}

/* ---- model views -------------------------------------------------------------------------- */

static void test_model_views(void **state)
{
    (void)state;
    const struct model *m = g_model;
    const struct iebin_model *im = m->im;
    assert_int_equal(m->q_dim, 64);
    assert_int_equal(m->kv_dim, 32);
    assert_ptr_equal(m->tok_embd.data, iebin_find(im, "tok_embd")->data);
    assert_int_equal(m->tok_embd.rows, 512);
    assert_int_equal(m->tok_embd.cols, 64);
    assert_int_equal(m->tok_embd.row_bytes, 64 * 4);
    assert_ptr_equal(m->output.data, m->tok_embd.data); /* tied */
    assert_ptr_equal(m->output_norm, iebin_find(im, "output_norm")->data);
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%u.attn_k", l);
        assert_ptr_equal(m->layers[l].wk.data, iebin_find(im, name)->data);
        assert_int_equal(m->layers[l].wk.rows, 32);
        assert_int_equal(m->layers[l].wk.cols, 64);
        snprintf(name, sizeof name, "blk.%u.ffn_down", l);
        assert_ptr_equal(m->layers[l].w_down.data, iebin_find(im, name)->data);
        assert_int_equal(m->layers[l].w_down.rows, 64);
        assert_int_equal(m->layers[l].w_down.cols, 172);
        snprintf(name, sizeof name, "blk.%u.ffn_norm", l);
        assert_ptr_equal(m->layers[l].ffn_norm, iebin_find(im, name)->data);
    }
    float row[64];
    model_embed_row(m, 7, row);
    assert_memory_equal(row, (const float *)m->tok_embd.data + 7 * 64, sizeof row);
}

static void test_model_bad(void **state)
{
    (void)state;
    struct model m;
    struct iebin_model copy = *g_model->im;

    tu_log_capture_begin();
    snprintf(copy.arch, sizeof copy.arch, "gpt2");
    assert_int_equal(model_init(&m, &copy), ERR_UNSUPPORTED);
    tu_assert_log_contains("architecture 'gpt2'", "not supported", NULL);
    tu_log_capture_end();

    copy = *g_model->im;
    copy.hp.head_dim = 7;
    tu_log_capture_begin();
    assert_int_equal(model_init(&m, &copy), ERR_RANGE);
    tu_assert_log_contains("head_dim", NULL);
    tu_log_capture_end();

    /* a tensor whose shape disagrees with the hyper-parameters */
    copy = *g_model->im;
    copy.hp.ffn_dim = 173;
    tu_log_capture_begin();
    assert_int_equal(model_init(&m, &copy), ERR_MISMATCH);
    tu_assert_log_contains("tensor 'blk.0.ffn_gate'", "shape", NULL);
    tu_log_capture_end();

    struct model *mp;
    char *tmp = tu_mkdtemp();
    tu_log_capture_begin();
    assert_int_equal(model_open(tu_path(tmp, "nothing"), 0, &mp), -ENOENT);
    tu_assert_log_contains("nothing", NULL);
    tu_log_capture_end();
    tu_rmtree(tmp);
    free(tmp);
}

/* ---- bad input ----------------------------------------------------------------------------- */

static void test_bad_input(void **state)
{
    (void)state;
    const size_t V = g_gold.vocab;
    float *logits = malloc(4 * V * sizeof *logits);
    struct forward *f;

    struct forward_config cfg = {.max_seq = 513};
    tu_log_capture_begin();
    assert_int_equal(forward_create(g_model, &cfg, &f), ERR_RANGE);
    tu_assert_log_contains("max_seq 513", "context length 512", NULL);
    cfg = (struct forward_config){.max_chunk = FORWARD_CHUNK_MAX + 1};
    assert_int_equal(forward_create(g_model, &cfg, &f), ERR_RANGE);
    tu_assert_log_contains("max_chunk 4097", NULL);
    tu_log_capture_end();

    f = make(g_model, 8, 0, NULL);
    const int32_t good[3] = {1, 100, 200};
    assert_int_equal(forward_eval(f, good, 3, FORWARD_LOGITS_LAST, logits), 0);

    tu_log_capture_begin();
    const int32_t high[3] = {5, 512, 6};
    assert_int_equal(forward_eval(f, high, 3, FORWARD_LOGITS_ALL, logits), ERR_RANGE);
    tu_assert_log_contains("token 1: id 512 is outside the vocabulary of 512", NULL);
    const int32_t neg[1] = {-3};
    assert_int_equal(forward_eval(f, neg, 1, FORWARD_LOGITS_LAST, logits), ERR_RANGE);
    tu_assert_log_contains("token 0: id -3", NULL);
    assert_int_equal(forward_eval(f, good, 0, FORWARD_LOGITS_LAST, logits), ERR_RANGE);
    tu_assert_log_contains("no tokens", NULL);
    /* 3 held + 6 > 8 positions */
    const int32_t six[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(forward_eval(f, six, 6, FORWARD_LOGITS_LAST, logits), ERR_RANGE);
    tu_assert_log_contains("6 tokens at position 3 exceed the context of 8 positions", NULL);
    assert_int_equal(forward_truncate(f, 4), ERR_RANGE);
    tu_assert_log_contains("truncate to position 4", "holds 3", NULL);
    tu_log_capture_end();

    /* refused calls left the sequence as it was: continuing gives the golden logits */
    assert_int_equal(forward_pos(f), 3);
    assert_int_equal(forward_eval(f, six, 5, FORWARD_LOGITS_LAST, logits), 0);
    assert_int_equal(forward_pos(f), 8);
    struct forward *r = make(g_model, 0, 0, NULL);
    const int32_t all[8] = {1, 100, 200, 1, 2, 3, 4, 5};
    float *want = malloc(V * sizeof *want);
    assert_int_equal(forward_eval(r, all, 8, FORWARD_LOGITS_LAST, want), 0);
    assert_close(logits, want, V, 1e-5f, "after refused calls", 0, 7);
    forward_destroy(r);
    forward_destroy(f);
    free(want);
    free(logits);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_one_token_at_a_time),
        cmocka_unit_test(test_prompt_prefill),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_half_precision_imports),
        cmocka_unit_test(test_q8_0_panels),
        cmocka_unit_test(test_hook),
        cmocka_unit_test(test_model_views),
        cmocka_unit_test(test_model_bad),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
