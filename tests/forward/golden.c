/* golden.c — loading fixtures/stories260K/golden.json, importing the checkpoint, and its q8_0
 * variant (golden.h). */
#include "testutil.h"

#include "golden.h"

#include "half.h"
#include "iebin.h"
#include "llama2c.h"
#include "quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *get(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        fail_msg("golden.json: key '%s' missing", key);
    return v;
}

static int32_t *ids_of(json_t *arr, size_t *n)
{
    assert_true(json_is_array(arr));
    *n = json_array_size(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static void floats_of(json_t *arr, float *out, size_t n)
{
    assert_true(json_is_array(arr));
    assert_int_equal(json_array_size(arr), n);
    for (size_t i = 0; i < n; i++)
        out[i] = (float)json_number_value(json_array_get(arr, i));
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

void golden_load(struct golden *g)
{
    json_error_t err;
    json_t *root = json_load_file(tu_fixture("stories260K/golden.json"), 0, &err);
    if (!root)
        fail_msg("golden.json: %s (line %d)", err.text, err.line);
    g->vocab = (uint32_t)json_integer_value(get(root, "vocab_size"));
    json_t *cases = get(root, "cases");
    g->n_cases = json_array_size(cases);
    assert_true(g->n_cases > 0);
    g->cases = calloc(g->n_cases, sizeof *g->cases);
    assert_non_null(g->cases);
    const size_t V = g->vocab;
    for (size_t c = 0; c < g->n_cases; c++) {
        json_t *jc = json_array_get(cases, c);
        struct golden_case *gc = &g->cases[c];
        gc->prompt = ids_of(get(jc, "prompt"), &gc->n_prompt);
        json_t *pl = get(jc, "prompt_logits");
        assert_int_equal(json_array_size(pl), gc->n_prompt);
        gc->prompt_logits = malloc(gc->n_prompt * V * sizeof(float));
        assert_non_null(gc->prompt_logits);
        for (size_t p = 0; p < gc->n_prompt; p++)
            floats_of(json_array_get(pl, p), gc->prompt_logits + p * V, V);
        gc->greedy = ids_of(get(jc, "greedy"), &gc->n_greedy);
        gc->margin = malloc(gc->n_greedy * sizeof(float));
        assert_non_null(gc->margin);
        floats_of(get(jc, "greedy_margin"), gc->margin, gc->n_greedy);
        gc->cutoff = gc->n_greedy;
        for (size_t i = 0; i < gc->n_greedy; i++)
            if (gc->margin[i] < 0.01f) {
                gc->cutoff = i;
                break;
            }
        json_t *sl = get(jc, "greedy_step_logits");
        const char *key;
        json_t *val;
        size_t order[GOLDEN_MAX_STEPS];
        json_object_foreach(sl, key, val)
        {
            assert_true(gc->n_steps < GOLDEN_MAX_STEPS);
            order[gc->n_steps++] = (size_t)strtoul(key, NULL, 10);
        }
        qsort(order, gc->n_steps, sizeof *order, cmp_size);
        for (size_t i = 0; i < gc->n_steps; i++) {
            char k[32];
            snprintf(k, sizeof k, "%zu", order[i]);
            gc->step[i] = order[i];
            assert_true(order[i] < gc->n_greedy);
            gc->step_logits[i] = malloc(V * sizeof(float));
            assert_non_null(gc->step_logits[i]);
            floats_of(get(sl, k), gc->step_logits[i], V);
        }
    }
    json_decref(root);
}

void golden_free(struct golden *g)
{
    for (size_t c = 0; c < g->n_cases; c++) {
        struct golden_case *gc = &g->cases[c];
        free(gc->prompt);
        free(gc->prompt_logits);
        free(gc->greedy);
        free(gc->margin);
        for (size_t i = 0; i < gc->n_steps; i++)
            free(gc->step_logits[i]);
    }
    free(g->cases);
    memset(g, 0, sizeof *g);
}

char *golden_import(enum dtype dt, char **tmp)
{
    *tmp = tu_mkdtemp();
    char *dir = strdup(tu_path(*tmp, "stories260K"));
    assert_non_null(dir);
    assert_int_equal(
        llama2c_convert(tu_fixture("stories260K/stories260K.bin"), NULL, 0, dir, dt, NULL), 0);
    return dir;
}

float golden_max_diff(const float *a, const float *b, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) /* NaN propagates as a failure */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* golden.h; GGUF's q8_0 rule: d = max|x| / 127 rounded to f16, q = round(x / d). */
char *golden_quantize_q8(const struct iebin_model *im, const char *tmp)
{
    char *dir = strdup(tu_path(tmp, "q8"));
    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(dir, im->arch, "q8", &im->hp, &w), 0);
    for (size_t i = 0; i < im->n_tensors; i++) {
        const struct iebin_tensor *t = &im->tensors[i];
        if (t->n_dims != 2 || t->shape[1] % 32 != 0 || t->dtype != DT_F32) {
            assert_int_equal(
                iebin_writer_add(w, t->name, t->dtype, t->shape, t->n_dims, t->data, t->size),
                0);
            continue;
        }
        size_t rows = t->shape[0], cols = t->shape[1], nb = rows * cols / 32;
        struct quant_q8_0 *q = malloc(nb * sizeof *q);
        assert_non_null(q);
        const float *x = t->data;
        for (size_t b = 0; b < nb; b++) {
            float amax = 0.0f;
            for (size_t j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[b * 32 + j]));
            q[b].d = half_f32_to_f16(amax / 127.0f);
            float d = half_f16_to_f32(q[b].d), id = d != 0.0f ? 1.0f / d : 0.0f;
            for (size_t j = 0; j < 32; j++) {
                long v = lroundf(x[b * 32 + j] * id);
                q[b].qs[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        }
        assert_int_equal(iebin_writer_add(w, t->name, DT_Q8_0, t->shape, 2, q, nb * sizeof *q),
                         0);
        free(q);
    }
    assert_int_equal(iebin_writer_finish(w), 0);
    return dir;
}
