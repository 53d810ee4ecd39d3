/*
 * test_lora_forward.c — LoRA acceptance on the real stories260K checkpoint:
 *  - the forward pass the tests run through (worker/model/forward.c, the FP32 reference) matches
 *    the fixture's golden logits, token by token and as one prefill chunk;
 *  - logits with an adapter applied through forward.c's projection hook (forward_set_hook)
 *    match those of the same forward pass over a model whose weights were merged,
 *    W + s * B A, written as an IEBIN model in the test, for every target alone and all
 *    together, at two request scales;
 *  - the q/k row permutation: attention scores computed the Hugging Face way (rotate-half
 *    RoPE on HF-ordered q/k with the adapter's B as stored) equal Clocher's (interleaved RoPE
 *    on IEBIN weights with the loaded B), and a B left unpermuted visibly breaks them;
 *  - an adapter over a q8_0 base: the adapter's effect is the same as over the f32 base.
 * Tolerance: 2e-4 absolute on logits of magnitude <= ~15 (f32 summation in another order
 * plus the f32 rounding of W + sBA; measured ~1e-5). The golden check uses the fixture's 1e-4.
 */
#include "testutil.h"

#include "peft.h"

#include "err.h"
#include "forward.h"
#include "half.h"
#include "iebin.h"
#include "kern.h"
#include "llama2c.h"
#include "lora.h"
#include "model.h"
#include "safetensors.h"
#include "synth_adapter.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-4f
#define MAX_TOK 128

static char *g_tmp;
static struct iebin_model *g_base;
static json_t *g_golden;

static int setup(void **state)
{
    (void)state;
    if (kern_init() != 0)
        return -1;
    g_tmp = tu_mkdtemp();
    const char *base = tu_path(g_tmp, "base");
    if (llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, base, DT_F32,
                        NULL) != 0 ||
        iebin_open(base, &g_base) != 0)
        return -1;
    json_error_t e;
    g_golden = json_load_file(tu_fixture("stories260K/golden.json"), 0, &e);
    return g_golden ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(g_golden);
    iebin_close(g_base);
    tu_rmtree(g_tmp);
    free(g_tmp);
    return 0;
}

/* golden case c's prompt (malloc'd) */
static int32_t *prompt_of(size_t c, size_t *n)
{
    json_t *p = json_object_get(json_array_get(json_object_get(g_golden, "cases"), c), "prompt");
    *n = json_array_size(p);
    int32_t *ids = malloc(*n * sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(p, i));
    return ids;
}

/*
 * logits [n][vocab] for a prompt through worker/model/forward.c over model m (hook may be NULL),
 * fed `chunk` tokens per forward_eval (max_chunk = chunk, so each call is one batch through
 * the layers and the hook sees at most `chunk` tokens).
 */
static float *run(const struct iebin_model *m, const int32_t *ids, size_t n,
                  forward_hook_fn *hook, void *ud, size_t chunk)
{
    const size_t V = m->hp.vocab_size;
    float *logits = malloc(n * V * sizeof(float));
    assert_non_null(logits);
    struct model mdl;
    assert_int_equal(model_init(&mdl, m), 0);
    struct forward *f;
    struct forward_config cfg = {.max_seq = 0, .max_chunk = (uint32_t)chunk, .pool = NULL};
    assert_int_equal(forward_create(&mdl, &cfg, &f), 0);
    forward_set_hook(f, hook, ud);
    for (size_t p = 0; p < n; p += chunk) {
        size_t k = n - p < chunk ? n - p : chunk;
        assert_int_equal(forward_eval(f, ids + p, k, FORWARD_LOGITS_ALL, logits + p * V), 0);
    }
    forward_destroy(f);
    model_fini(&mdl);
    return logits;
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float mx = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        float d = fabsf(a[i] - b[i]);
        mx = d > mx ? d : mx;
    }
    return mx;
}

static void test_reference_matches_golden(void **state)
{
    (void)state;
    json_t *cases = json_object_get(g_golden, "cases");
    const size_t V = g_base->hp.vocab_size;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        size_t n;
        int32_t *ids = prompt_of(c, &n);
        json_t *pl = json_object_get(json_array_get(cases, c), "prompt_logits");
        for (size_t chunk = 1; chunk <= MAX_TOK; chunk *= MAX_TOK) { /* one by one, prefill */
            float *lg = run(g_base, ids, n, NULL, NULL, chunk);
            for (size_t p = 0; p < n; p++)
                for (size_t v = 0; v < V; v++) {
                    float want = (float)json_real_value(json_array_get(json_array_get(pl, p), v));
                    if (fabsf(lg[p * V + v] - want) > 1e-4f)
                        fail_msg("case %zu chunk %zu pos %zu logit %zu: %g, golden %g", c, chunk,
                                 p, v, (double)lg[p * V + v], (double)want);
                }
            free(lg);
        }
        free(ids);
    }
}

/* ---- adapters through the hook vs merged weights ---- */

struct hook_ctx {
    const struct lora_adapter *ad;
    float scale;
    float *tmp; /* [MAX_TOK][rank] */
};

static void lora_hook(void *ud, uint32_t layer, enum lora_target t, const float *x, size_t n,
                      float *y, size_t ldy)
{
    struct hook_ctx *h = ud;
    lora_apply_one(h->ad, h->scale, layer, t, x, n, y, ldy, h->tmp);
}

static const char *const iebin_names[LORA_TARGET_COUNT] = {
    IEBIN_T_ATTN_Q, IEBIN_T_ATTN_K, IEBIN_T_ATTN_V, IEBIN_T_ATTN_O,
    IEBIN_T_FFN_GATE, IEBIN_T_FFN_UP, IEBIN_T_FFN_DOWN,
};

/* A PEFT tensor of the adapter file as f32 (the file is f32). */
static const float *file_f32(const struct safetensors_file *f, const char *name)
{
    const struct safetensors_tensor *t = safetensors_find(f, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, SAFETENSORS_F32);
    assert_int_equal((uintptr_t)t->data % 4, 0);
    return t->data;
}

/*
 * Writes base + scale * s * B A as an IEBIN model in out_dir, computing in Hugging Face's
 * order and mapping q/k rows back to IEBIN's with the inverse of HF's own permutation (found
 * by pushing row labels through peft_permute_meta_to_hf). Works on the adapter's files, not on
 * what lora.c loaded.
 */
static void write_merged(const char *adapter_dir, float scale, const char *out_dir)
{
    const struct iebin_hparams *hp = &g_base->hp;
    char *cfg_text = tu_read_file(tu_path(adapter_dir, LORA_CONFIG_FILE), NULL);
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    assert_non_null(cfg);
    free(cfg_text);
    const uint32_t r = (uint32_t)json_integer_value(json_object_get(cfg, "r"));
    const double s = json_number_value(json_object_get(cfg, "lora_alpha")) / r * scale;
    uint32_t mask = 0;
    json_t *mods = json_object_get(cfg, "target_modules");
    for (size_t i = 0; i < json_array_size(mods); i++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++)
            if (strcmp(json_string_value(json_array_get(mods, i)),
                       lora_target_name((enum lora_target)t)) == 0)
                mask |= 1u << t;
    json_decref(cfg);
    struct safetensors_file *f;
    assert_int_equal(safetensors_open(tu_path(adapter_dir, LORA_WEIGHTS_FILE), &f), 0);

    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(out_dir, "llama", "merged", hp, &w), 0);
    for (size_t i = 0; i < g_base->n_tensors; i++) {
        const struct iebin_tensor *bt = &g_base->tensors[i];
        int target = -1;
        uint32_t layer = 0;
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            char suffix[32];
            snprintf(suffix, sizeof suffix, ".%s", iebin_names[t]);
            size_t nl = strlen(bt->name), ns = strlen(suffix);
            if ((mask >> t & 1u) && nl > ns && strcmp(bt->name + nl - ns, suffix) == 0) {
                target = t;
                layer = (uint32_t)strtoul(bt->name + 4, NULL, 10);
            }
        }
        if (target < 0) {
            assert_int_equal(iebin_writer_add(w, bt->name, bt->dtype, bt->shape, bt->n_dims,
                                              bt->data, bt->size),
                             0);
            continue;
        }
        assert_int_equal(bt->dtype, DT_F32);
        const size_t out = bt->shape[0], in = bt->shape[1];
        const float *A = file_f32(f, peft_name(layer, (enum lora_target)target, 0)); /* [r][in] */
        const float *B = file_f32(f, peft_name(layer, (enum lora_target)target, 1)); /* [out][r] */
        float *d_hf = malloc(out * in * sizeof(float)); /* s B A, HF row order */
        for (size_t o = 0; o < out; o++)
            for (size_t c = 0; c < in; c++) {
                double acc = 0.0;
                for (uint32_t k = 0; k < r; k++)
                    acc += (double)B[o * r + k] * A[(size_t)k * in + c];
                d_hf[o * in + c] = (float)(s * acc);
            }
        /* HF row j holds IEBIN row label[j] */
        size_t *label = malloc(out * sizeof *label);
        if (target == LORA_Q || target == LORA_K) {
            uint32_t heads = target == LORA_Q ? hp->n_heads : hp->n_kv_heads;
            float *lab = malloc(out * sizeof(float)), *perm = malloc(out * sizeof(float));
            for (size_t j = 0; j < out; j++)
                lab[j] = (float)j;
            peft_permute_meta_to_hf(perm, lab, heads, hp->head_dim, 1);
            for (size_t j = 0; j < out; j++)
                label[j] = (size_t)perm[j];
            free(lab);
            free(perm);
        } else {
            for (size_t j = 0; j < out; j++)
                label[j] = j;
        }
        const float *W = bt->data;
        float *merged = malloc(out * in * sizeof(float));
        for (size_t j = 0; j < out; j++)
            for (size_t c = 0; c < in; c++)
                merged[label[j] * in + c] = W[label[j] * in + c] + d_hf[j * in + c];
        assert_int_equal(
            iebin_writer_add(w, bt->name, DT_F32, bt->shape, 2, merged, out * in * sizeof(float)),
            0);
        free(merged);
        free(label);
        free(d_hf);
    }
    assert_int_equal(iebin_writer_finish(w), 0);
    safetensors_close(f);
}

static void check_against_merged(uint32_t mask, const char *label, uint64_t seed)
{
    char name[64];
    snprintf(name, sizeof name, "adapter_%s", label);
    char *adir = strdup(tu_path(g_tmp, name));
    struct synth_adapter_opts o = {.rank = 4, .alpha = 8.0f, .target_mask = mask, .seed = seed,
                                   .dtype = DT_F32};
    assert_int_equal(synth_adapter_write(g_base, adir, &o), 0);
    struct lora_adapter *ad;
    assert_int_equal(lora_open(adir, &g_base->hp, &ad), 0);

    size_t n;
    int32_t *ids = prompt_of(4, &n); /* 120 tokens */
    const size_t V = g_base->hp.vocab_size;
    float *base = run(g_base, ids, n, NULL, NULL, MAX_TOK);
    static const float scales[] = {1.0f, 0.5f};
    for (size_t k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "merged_%s_%zu", label, k);
        char *mdir = strdup(tu_path(g_tmp, name));
        write_merged(adir, scales[k], mdir);
        struct iebin_model *mm;
        assert_int_equal(iebin_open(mdir, &mm), 0);
        float *want = run(mm, ids, n, NULL, NULL, MAX_TOK);

        struct hook_ctx h = {ad, scales[k], malloc(MAX_TOK * 4 * sizeof(float))};
        for (size_t chunk = 7; chunk <= MAX_TOK; chunk += MAX_TOK - 7) { /* ragged, prefill */
            float *got = run(g_base, ids, n, lora_hook, &h, chunk);
            float err = max_abs_diff(got, want, n * V);
            float effect = max_abs_diff(got, base, n * V);
            print_message("  %-8s scale %.1f chunk %3zu: |hook - merged| %.2e, |hook - base| "
                          "%.3f\n",
                          label, (double)scales[k], chunk, (double)err, (double)effect);
            if (!(err <= TOL))
                fail_msg("%s scale %g: adapter logits differ from merged weights by %g > %g",
                         label, (double)scales[k], (double)err, (double)TOL);
            /* the adapter really changes the model (and not into inf/NaN) */
            assert_true(effect > 0.02f && isfinite(effect));
            free(got);
        }
        free(h.tmp);
        free(want);
        iebin_close(mm);
        tu_rmtree(mdir);
        free(mdir);
    }
    free(base);
    free(ids);
    lora_close(ad);
    free(adir);
}

static void test_merged_q(void **s) { (void)s; check_against_merged(1u << LORA_Q, "q", 1); }
static void test_merged_k(void **s) { (void)s; check_against_merged(1u << LORA_K, "k", 2); }
static void test_merged_v(void **s) { (void)s; check_against_merged(1u << LORA_V, "v", 3); }
static void test_merged_o(void **s) { (void)s; check_against_merged(1u << LORA_O, "o", 4); }
static void test_merged_gate(void **s) { (void)s; check_against_merged(1u << LORA_GATE, "gate", 5); }
static void test_merged_up(void **s) { (void)s; check_against_merged(1u << LORA_UP, "up", 6); }
static void test_merged_down(void **s) { (void)s; check_against_merged(1u << LORA_DOWN, "down", 7); }
static void test_merged_all(void **s)
{
    (void)s;
    check_against_merged((1u << LORA_TARGET_COUNT) - 1u, "all", 8);
}

/* ---- the q/k permutation, checked through RoPE ---- */

/* Hugging Face's apply_rotary_pos_emb: pairs (i, i + hd/2) of each head */
static void rope_rotate_half(float *v, size_t heads, size_t hd, size_t pos, float theta)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < hd / 2; i++) {
            float freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
            float val = (float)pos * freq, c = cosf(val), s = sinf(val);
            float *p = v + h * hd;
            float x1 = p[i], x2 = p[i + hd / 2];
            p[i] = x1 * c - x2 * s;
            p[i + hd / 2] = x2 * c + x1 * s;
        }
}

/* IEBIN / llama2.c: pairs (2i, 2i + 1) */
static void rope_interleaved(float *v, size_t heads, size_t hd, size_t pos, float theta)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < hd; i += 2) {
            float freq = 1.0f / powf(theta, (float)i / (float)hd);
            float val = (float)pos * freq, c = cosf(val), s = sinf(val);
            float *p = v + h * hd + i;
            float v0 = p[0], v1 = p[1];
            p[0] = v0 * c - v1 * s;
            p[1] = v0 * s + v1 * c;
        }
}

/* scores[h] = q_h . k_{h / group} */
static void scores(const float *q, const float *k, const struct iebin_hparams *hp, float *out)
{
    size_t hd = hp->head_dim, group = hp->n_heads / hp->n_kv_heads;
    for (size_t h = 0; h < hp->n_heads; h++) {
        float s = 0.0f;
        for (size_t i = 0; i < hd; i++)
            s += q[h * hd + i] * k[(h / group) * hd + i];
        out[h] = s;
    }
}

/* Clocher's scores for layer `layer` with adapter ad (scale 1) at positions pq, pk */
static void clocher_scores(const struct lora_adapter *ad, uint32_t layer, const float *x,
                           size_t pq, size_t pk, float *out)
{
    const struct iebin_hparams *hp = &g_base->hp;
    char nq[32], nk[32];
    snprintf(nq, sizeof nq, "blk.%u.attn_q", layer);
    snprintf(nk, sizeof nk, "blk.%u.attn_k", layer);
    const struct iebin_tensor *wq = iebin_find(g_base, nq), *wk = iebin_find(g_base, nk);
    size_t qd = wq->shape[0], kd = wk->shape[0];
    float q[1024], k[1024], tmp[LORA_MAX_RANK];
    kern_matmul(DT_F32, wq->data, hp->dim, x, 1, q, qd, 0, qd);
    kern_matmul(DT_F32, wk->data, hp->dim, x, 1, k, kd, 0, kd);
    lora_apply_one(ad, 1.0f, layer, LORA_Q, x, 1, q, qd, tmp);
    lora_apply_one(ad, 1.0f, layer, LORA_K, x, 1, k, kd, tmp);
    rope_interleaved(q, hp->n_heads, hp->head_dim, pq, hp->rope_theta);
    rope_interleaved(k, hp->n_kv_heads, hp->head_dim, pk, hp->rope_theta);
    scores(q, k, hp, out);
}

static void test_qk_permutation_through_rope(void **state)
{
    (void)state;
    const struct iebin_hparams *hp = &g_base->hp;
    const uint32_t layer = 2, r = 8;
    const size_t dim = hp->dim, hd = hp->head_dim;
    const size_t qd = hp->n_heads * hd, kd = hp->n_kv_heads * hd;
    const size_t pq = 37, pk = 11;

    /* an adapter for q and k (full-strength B so it dominates the scores) */
    char *adir = strdup(tu_path(g_tmp, "adapter_qk"));
    struct synth_adapter_opts o = {.rank = r, .alpha = 16.0f,
                                   .target_mask = 1u << LORA_Q | 1u << LORA_K, .seed = 77,
                                   .dtype = DT_F32, .strength = 1.0f};
    assert_int_equal(synth_adapter_write(g_base, adir, &o), 0);
    struct lora_adapter *ad;
    assert_int_equal(lora_open(adir, hp, &ad), 0);
    struct safetensors_file *f;
    assert_int_equal(safetensors_open(tu_path(adir, LORA_WEIGHTS_FILE), &f), 0);

    float x[64];
    for (size_t i = 0; i < dim; i++)
        x[i] = sinf((float)i * 0.7f + 0.3f);

    /* Hugging Face: q_proj = permute(W_q) (what HF checkpoints hold), plus s B A as stored */
    char nq[32], nk[32];
    snprintf(nq, sizeof nq, "blk.%u.attn_q", layer);
    snprintf(nk, sizeof nk, "blk.%u.attn_k", layer);
    float *wq_hf = malloc(qd * dim * 4), *wk_hf = malloc(kd * dim * 4);
    peft_permute_meta_to_hf(wq_hf, iebin_find(g_base, nq)->data, hp->n_heads, hd, dim);
    peft_permute_meta_to_hf(wk_hf, iebin_find(g_base, nk)->data, hp->n_kv_heads, hd, dim);
    float q[64], k[32];
    const float *mats[2][3] = {
        {wq_hf, file_f32(f, peft_name(layer, LORA_Q, 0)), file_f32(f, peft_name(layer, LORA_Q, 1))},
        {wk_hf, file_f32(f, peft_name(layer, LORA_K, 0)), file_f32(f, peft_name(layer, LORA_K, 1))},
    };
    float *outs[2] = {q, k};
    const size_t rows[2] = {qd, kd};
    const double s = 16.0 / r;
    for (int m = 0; m < 2; m++) {
        double ax[16];
        for (uint32_t j = 0; j < r; j++) {
            ax[j] = 0.0;
            for (size_t c = 0; c < dim; c++)
                ax[j] += (double)mats[m][1][j * dim + c] * x[c];
        }
        for (size_t o2 = 0; o2 < rows[m]; o2++) {
            double acc = 0.0, lo = 0.0;
            for (size_t c = 0; c < dim; c++)
                acc += (double)mats[m][0][o2 * dim + c] * x[c];
            for (uint32_t j = 0; j < r; j++)
                lo += (double)mats[m][2][o2 * r + j] * ax[j];
            outs[m][o2] = (float)(acc + s * lo);
        }
    }
    rope_rotate_half(q, hp->n_heads, hd, pq, hp->rope_theta);
    rope_rotate_half(k, hp->n_kv_heads, hd, pk, hp->rope_theta);
    float want[8], got[8], base_scores[8];
    scores(q, k, hp, want);

    clocher_scores(ad, layer, x, pq, pk, got);
    float err = 0.0f, effect = 0.0f;
    {
        /* the adapter's effect on the scores, for scale: base-only scores */
        float qb[64], kb[32];
        kern_matmul(DT_F32, iebin_find(g_base, nq)->data, dim, x, 1, qb, qd, 0, qd);
        kern_matmul(DT_F32, iebin_find(g_base, nk)->data, dim, x, 1, kb, kd, 0, kd);
        rope_interleaved(qb, hp->n_heads, hd, pq, hp->rope_theta);
        rope_interleaved(kb, hp->n_kv_heads, hd, pk, hp->rope_theta);
        scores(qb, kb, hp, base_scores);
    }
    for (size_t h = 0; h < hp->n_heads; h++) {
        err = fmaxf(err, fabsf(got[h] - want[h]));
        effect = fmaxf(effect, fabsf(want[h] - base_scores[h]));
    }
    print_message("  scores: |clocher - hf| %.2e, adapter effect %.3f\n", (double)err,
                  (double)effect);
    assert_true(effect > 0.1f);
    assert_true(err <= 1e-4f * (1.0f + effect));

    /* negative control: an adapter whose B rows reach the loader already in IEBIN order
     * (so lora.c's reordering is effectively skipped) no longer matches Hugging Face */
    char *bdir = strdup(tu_path(g_tmp, "adapter_qk_unpermuted"));
    struct peft_adapter *pa = peft_adapter_random(hp, r, 16.0, 1u << LORA_Q | 1u << LORA_K, 1,
                                                  0.0f, 0.0f);
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (int t = LORA_Q; t <= LORA_K; t++) {
            uint32_t heads = t == LORA_Q ? hp->n_heads : hp->n_kv_heads;
            memcpy(pa->a[l][t], file_f32(f, peft_name(l, (enum lora_target)t, 0)),
                   (size_t)r * dim * 4);
            /* HF's permute applied to B: the loader's inverse gives back the file's B rows
             * in their original (HF) positions */
            peft_permute_meta_to_hf(pa->b[l][t], file_f32(f, peft_name(l, (enum lora_target)t, 1)),
                                    heads, hd, r);
        }
    peft_adapter_write(pa, bdir, SAFETENSORS_F32, "");
    peft_adapter_free(pa);
    struct lora_adapter *bad;
    assert_int_equal(lora_open(bdir, hp, &bad), 0);
    /* that adapter's loaded B is the file's B unpermuted */
    assert_memory_equal(lora_weights(bad, layer, LORA_Q)->b,
                        file_f32(f, peft_name(layer, LORA_Q, 1)), qd * r * 4);
    float wrong[8];
    clocher_scores(bad, layer, x, pq, pk, wrong);
    float err_bad = 0.0f;
    for (size_t h = 0; h < hp->n_heads; h++)
        err_bad = fmaxf(err_bad, fabsf(wrong[h] - want[h]));
    print_message("  unpermuted B: |clocher - hf| %.3f\n", (double)err_bad);
    assert_true(err_bad > 0.05f * effect);

    lora_close(bad);
    safetensors_close(f);
    lora_close(ad);
    free(wq_hf);
    free(wk_hf);
    free(bdir);
    free(adir);
}

/* ---- quantized base ---- */

/* Q8_0 block: f16 scale d, 32 int8 (x = d * q) */
static void quantize_q8_0(const float *x, size_t n, uint8_t *out)
{
    for (size_t b = 0; b < n / 32; b++, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + (size_t)j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        uint16_t d16 = half_f32_to_f16(d);
        memcpy(out, &d16, 2);
        for (int j = 0; j < 32; j++)
            out[2 + j] = (uint8_t)(int8_t)lroundf(x[b * 32 + (size_t)j] * id);
    }
}

static void test_quantized_base(void **state)
{
    (void)state;
    const struct iebin_hparams *hp = &g_base->hp;
    /* the base with every matrix whose rows are whole q8_0 blocks quantized */
    const char *qdir = tu_path(g_tmp, "base_q8");
    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(qdir, "llama", "stories260K-q8", hp, &w), 0);
    size_t n_q = 0;
    for (size_t i = 0; i < g_base->n_tensors; i++) {
        const struct iebin_tensor *t = &g_base->tensors[i];
        if (t->n_dims == 2 && t->shape[1] % 32 == 0) {
            size_t rows = t->shape[0], cols = t->shape[1];
            size_t bytes = rows * cols / 32 * 34;
            uint8_t *q = malloc(bytes);
            for (size_t r = 0; r < rows; r++)
                quantize_q8_0((const float *)t->data + r * cols, cols, q + r * cols / 32 * 34);
            assert_int_equal(iebin_writer_add(w, t->name, DT_Q8_0, t->shape, 2, q, bytes), 0);
            free(q);
            n_q++;
        } else {
            assert_int_equal(
                iebin_writer_add(w, t->name, t->dtype, t->shape, t->n_dims, t->data, t->size), 0);
        }
    }
    assert_int_equal(iebin_writer_finish(w), 0);
    assert_true(n_q >= 1 + 6 * hp->n_layers); /* embedding, q k v o gate up */
    struct iebin_model *qm;
    assert_int_equal(iebin_open(qdir, &qm), 0);
    assert_int_equal(iebin_find(qm, "blk.0.attn_q")->dtype, DT_Q8_0);

    char *adir = strdup(tu_path(g_tmp, "adapter_q8"));
    struct synth_adapter_opts o = {.rank = 8, .alpha = 8.0f,
                                   .target_mask = (1u << LORA_TARGET_COUNT) - 1u, .seed = 5,
                                   .dtype = DT_BF16};
    assert_int_equal(synth_adapter_write(g_base, adir, &o), 0);
    struct lora_adapter *ad;
    assert_int_equal(lora_open(adir, &qm->hp, &ad), 0);

    size_t n;
    int32_t *ids = prompt_of(3, &n); /* 24 tokens */
    const size_t V = hp->vocab_size;
    struct hook_ctx h = {ad, 1.0f, malloc(MAX_TOK * 8 * sizeof(float))};
    float *f_base = run(g_base, ids, n, NULL, NULL, MAX_TOK);
    float *f_ad = run(g_base, ids, n, lora_hook, &h, MAX_TOK);
    float *q_base = run(qm, ids, n, NULL, NULL, MAX_TOK);
    float *q_ad = run(qm, ids, n, lora_hook, &h, MAX_TOK);
    /* the adapter moves the q8_0 model as it moves the f32 one: the difference between the
     * two is quantization error, small against the adapter's effect */
    float effect = max_abs_diff(f_ad, f_base, n * V);
    float quant = max_abs_diff(q_base, f_base, n * V);
    float err = max_abs_diff(q_ad, f_ad, n * V);
    /* the adapter's own contribution over each base */
    float delta_err = 0.0f;
    for (size_t i = 0; i < n * V; i++)
        delta_err = fmaxf(delta_err, fabsf((q_ad[i] - q_base[i]) - (f_ad[i] - f_base[i])));
    print_message("  q8_0: adapter effect %.3f, quantization error %.3f (base) %.3f (adapted), "
                  "effect differs by %.3f\n",
                  (double)effect, (double)quant, (double)err, (double)delta_err);
    assert_true(effect > 0.5f);
    assert_true(err < 0.4f * effect);
    assert_true(err < 3.0f * quant + 0.05f);
    assert_true(delta_err < 0.5f * effect);

    free(f_base);
    free(f_ad);
    free(q_base);
    free(q_ad);
    free(ids);
    free(h.tmp);
    lora_close(ad);
    iebin_close(qm);
    free(adir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_matches_golden),
        cmocka_unit_test(test_merged_q),
        cmocka_unit_test(test_merged_k),
        cmocka_unit_test(test_merged_v),
        cmocka_unit_test(test_merged_o),
        cmocka_unit_test(test_merged_gate),
        cmocka_unit_test(test_merged_up),
        cmocka_unit_test(test_merged_down),
        cmocka_unit_test(test_merged_all),
        cmocka_unit_test(test_qk_permutation_through_rope),
        cmocka_unit_test(test_quantized_base),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
