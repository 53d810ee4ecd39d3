/*
 * calib.c — the calibration gate (see calib.h).
 *
 * Both models are evaluated window by window in lockstep: the reference's projection outputs
 * of one chunk are kept (forward_set_hook) and the quantized model's outputs of the same chunk
 * are compared against them as they are produced, so memory is one chunk of activations per
 * projection, not the whole calibration run. KL divergence is computed in double from
 * max-subtracted log-softmax of both logit rows.
 */
#include "calib.h"

#include "err.h"
#include "fmap.h"
#include "forward.h"
#include "log.h"
#include "model.h"
#include "pool.h"
#include "tok.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALIB_CHUNK 32u         /* tokens per forward_eval: bounds the kept activations */
#define CALIB_WINDOW_MAX 1024u  /* positions per window (a longer run restarts the cache) */

int calib_read_ids(const char *path, int32_t **ids, size_t *n)
{
    char *buf;
    size_t len;
    *ids = NULL;
    *n = 0;
    int rc = fmap_read(path, "calibration ids", 16u << 20, &buf, &len);
    if (rc)
        return rc;
    size_t cap = 1024, cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) {
        free(buf);
        return -ENOMEM;
    }
    const char *p = buf, *end = buf + len;
    while (p < end) {
        if (isspace((unsigned char)*p) || *p == ',') {
            p++;
            continue;
        }
        const char *s = p;
        unsigned long long x = 0;
        while (p < end && isdigit((unsigned char)*p) && x <= INT32_MAX)
            x = x * 10 + (unsigned)(*p++ - '0');
        if (p == s || x > INT32_MAX || (p < end && !isspace((unsigned char)*p) && *p != ',')) {
            LOG_ERR("%s: byte %zu: '%.*s' is not a token id (a decimal number below 2^31)", path,
                    (size_t)(s - buf), (int)((end - s) < 16 ? (end - s) : 16), s);
            rc = ERR_FORMAT;
            goto fail;
        }
        if (cnt == CALIB_MAX_IDS) {
            LOG_ERR("%s: more than %u token ids", path, CALIB_MAX_IDS);
            rc = ERR_RANGE;
            goto fail;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                rc = -ENOMEM;
                goto fail;
            }
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (int32_t)x;
    }
    if (cnt < 2) {
        LOG_ERR("%s: %zu token ids; calibration needs at least 2", path, cnt);
        rc = ERR_RANGE;
        goto fail;
    }
    free(buf);
    *ids = v;
    *n = cnt;
    return 0;
fail:
    free(buf);
    free(v);
    return rc;
}

int calib_read_text(const char *path, const char *model_dir, int32_t **ids, size_t *n)
{
    char *buf;
    size_t len;
    struct tok *t = NULL;
    *ids = NULL;
    *n = 0;
    int rc = fmap_read(path, "calibration text", 16u << 20, &buf, &len);
    if (rc)
        return rc;
    if ((rc = tok_load(model_dir, &t)) == 0) {
        size_t cnt;
        rc = tok_encode(t, buf, len, tok_bos(t) >= 0, ids, &cnt);
        if (rc == 0 && cnt < 2) {
            LOG_ERR("%s: %zu tokens; calibration needs at least 2", path, cnt);
            free(*ids);
            *ids = NULL;
            rc = ERR_RANGE;
        } else if (rc == 0) {
            *n = cnt;
        }
    }
    tok_free(t);
    free(buf);
    return rc;
}

/* ---- lockstep evaluation ---- */

struct calib_state {
    const struct model *m;
    float *kept[LORA_TARGET_COUNT];   /* per target: [n_layers][CALIB_CHUNK][out] of the ref */
    uint32_t out_dim[LORA_TARGET_COUNT];
    double *dot, *nr, *nq;            /* [n_layers * LORA_TARGET_COUNT] */
};

static void hook_keep(void *ud, uint32_t layer, enum lora_target t, const float *x, size_t n,
                      float *y, size_t ldy)
{
    (void)x;
    struct calib_state *s = ud;
    uint32_t od = s->out_dim[t];
    float *dst = s->kept[t] + (size_t)layer * CALIB_CHUNK * od;
    for (size_t i = 0; i < n; i++)
        memcpy(dst + i * od, y + i * ldy, od * sizeof(float));
}

static void hook_compare(void *ud, uint32_t layer, enum lora_target t, const float *x, size_t n,
                         float *y, size_t ldy)
{
    (void)x;
    struct calib_state *s = ud;
    uint32_t od = s->out_dim[t];
    const float *ref = s->kept[t] + (size_t)layer * CALIB_CHUNK * od;
    size_t k = (size_t)layer * LORA_TARGET_COUNT + t;
    double dot = 0, nr = 0, nq = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < od; j++) {
            double a = ref[i * od + j], b = y[i * ldy + j];
            dot += a * b;
            nr += a * a;
            nq += b * b;
        }
    s->dot[k] += dot;
    s->nr[k] += nr;
    s->nq[k] += nq;
}

/* KL(softmax(a) || softmax(b)) in double, and whether the argmaxes agree. */
static double row_kld(const float *a, const float *b, uint32_t v, bool *agree)
{
    uint32_t ia = 0, ib = 0;
    for (uint32_t i = 1; i < v; i++) {
        if (a[i] > a[ia])
            ia = i;
        if (b[i] > b[ib])
            ib = i;
    }
    *agree = ia == ib;
    double sa = 0, sb = 0;
    for (uint32_t i = 0; i < v; i++) {
        sa += exp((double)a[i] - a[ia]);
        sb += exp((double)b[i] - b[ib]);
    }
    double lza = a[ia] + log(sa), lzb = b[ib] + log(sb), kld = 0;
    for (uint32_t i = 0; i < v; i++) {
        double la = a[i] - lza, lb = b[i] - lzb;
        kld += exp(la) * (la - lb);
    }
    return kld < 0 ? 0 : kld; /* rounding can give -1e-17 for identical rows */
}

static bool same_shape(const struct model *a, const struct model *b)
{
    const struct iebin_hparams *x = &a->hp, *y = &b->hp;
    return x->dim == y->dim && x->n_layers == y->n_layers && x->n_heads == y->n_heads &&
           x->n_kv_heads == y->n_kv_heads && x->head_dim == y->head_dim &&
           x->ffn_dim == y->ffn_dim && x->vocab_size == y->vocab_size;
}

int calib_run(const char *ref_dir, const char *quant_dir, const int32_t *ids, size_t n,
              unsigned threads, struct calib_report *r)
{
    memset(r, 0, sizeof *r);
    struct model *mr = NULL, *mq = NULL;
    struct forward *fr = NULL, *fq = NULL;
    struct pool *pool = NULL;
    float *lr = NULL, *lq = NULL;
    struct calib_state s = {0};
    int rc;
    if (n < 2) {
        LOG_ERR("calibration: %zu token ids; at least 2 are needed", n);
        return ERR_RANGE;
    }
    if ((rc = model_open(ref_dir, 0, &mr)) || (rc = model_open(quant_dir, 0, &mq)))
        goto out;
    if (!same_shape(mr, mq)) {
        LOG_ERR("calibration: %s and %s are not the same architecture", ref_dir, quant_dir);
        rc = ERR_MISMATCH;
        goto out;
    }
    const struct iebin_hparams *hp = &mr->hp;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp->vocab_size) {
            LOG_ERR("calibration: id %d at index %zu is outside the vocabulary (%u)", ids[i], i,
                    hp->vocab_size);
            rc = ERR_RANGE;
            goto out;
        }
    uint32_t window = hp->max_seq_len < CALIB_WINDOW_MAX ? hp->max_seq_len : CALIB_WINDOW_MAX;
    if (threads > 1 && (rc = pool_create((int)threads, POOL_PIN_NONE, &pool)))
        goto out;
    struct forward_config fc = {.max_seq = window, .max_chunk = CALIB_CHUNK, .pool = pool};
    if ((rc = forward_create(mr, &fc, &fr)) || (rc = forward_create(mq, &fc, &fq)))
        goto out;
    size_t nk = (size_t)hp->n_layers * LORA_TARGET_COUNT;
    s.m = mr;
    s.dot = calloc(nk, sizeof(double));
    s.nr = calloc(nk, sizeof(double));
    s.nq = calloc(nk, sizeof(double));
    lr = malloc((size_t)CALIB_CHUNK * hp->vocab_size * sizeof(float));
    lq = malloc((size_t)CALIB_CHUNK * hp->vocab_size * sizeof(float));
    r->tensors = calloc(nk, sizeof *r->tensors);
    rc = -ENOMEM;
    if (!s.dot || !s.nr || !s.nq || !lr || !lq || !r->tensors)
        goto out;
    for (int t = 0; t < LORA_TARGET_COUNT; t++) {
        uint32_t in;
        lora_target_dims(hp, (enum lora_target)t, &in, &s.out_dim[t]);
        s.kept[t] = malloc((size_t)hp->n_layers * CALIB_CHUNK * s.out_dim[t] * sizeof(float));
        if (!s.kept[t])
            goto out;
    }
    forward_set_hook(fr, hook_keep, &s);
    forward_set_hook(fq, hook_compare, &s);
    double kld_sum = 0;
    size_t agree = 0;
    /* the last id of each window is only a target, so windows overlap by one */
    for (size_t w0 = 0; w0 + 1 < n; w0 += window - 1) {
        size_t wn = n - w0 < window ? n - w0 : window;
        if ((rc = forward_truncate(fr, 0)) || (rc = forward_truncate(fq, 0)))
            goto out;
        for (size_t c0 = 0; c0 + 1 < wn; c0 += CALIB_CHUNK) {
            size_t cn = wn - 1 - c0 < CALIB_CHUNK ? wn - 1 - c0 : CALIB_CHUNK;
            const int32_t *chunk = ids + w0 + c0;
            if ((rc = forward_eval(fr, chunk, cn, FORWARD_LOGITS_ALL, lr)) ||
                (rc = forward_eval(fq, chunk, cn, FORWARD_LOGITS_ALL, lq)))
                goto out;
            for (size_t i = 0; i < cn; i++) {
                bool ag;
                double k = row_kld(lr + i * hp->vocab_size, lq + i * hp->vocab_size,
                                   hp->vocab_size, &ag);
                kld_sum += k;
                if (k > r->kld_max)
                    r->kld_max = k;
                agree += ag;
                r->positions++;
            }
        }
        if (wn < window)
            break;
    }
    r->kld_mean = kld_sum / (double)r->positions;
    r->top1 = (double)agree / (double)r->positions;
    r->cosine_min = 1.0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            static const char *const kind[] = {"attn_q", "attn_k",   "attn_v", "attn_o",
                                               "ffn_gate", "ffn_up", "ffn_down"};
            size_t k = (size_t)l * LORA_TARGET_COUNT + (size_t)t;
            struct calib_tensor *ct = &r->tensors[k];
            snprintf(ct->name, sizeof ct->name, "blk.%u.%s", l, kind[t]);
            double den = sqrt(s.nr[k]) * sqrt(s.nq[k]);
            ct->cosine = den > 0 ? s.dot[k] / den : (s.nr[k] == s.nq[k] ? 1.0 : 0.0);
            if (ct->cosine < r->cosine_min)
                r->cosine_min = ct->cosine;
        }
    r->n_tensors = nk;
    rc = 0;
out:
    for (int t = 0; t < LORA_TARGET_COUNT; t++)
        free(s.kept[t]);
    free(s.dot);
    free(s.nr);
    free(s.nq);
    free(lr);
    free(lq);
    forward_destroy(fr);
    forward_destroy(fq);
    pool_destroy(pool);
    model_close(mr);
    model_close(mq);
    if (rc)
        calib_report_free(r);
    return rc;
}

void calib_report_free(struct calib_report *r)
{
    free(r->tensors);
    memset(r, 0, sizeof *r);
}

int calib_check(const struct calib_report *r, const struct calib_gate *g)
{
    int rc = 0;
    if (!isnan(g->max_kld) && !(r->kld_mean <= g->max_kld)) {
        LOG_ERR("calibration gate: mean KL divergence %.6g exceeds --gate-kld %.6g", r->kld_mean,
                g->max_kld);
        rc = ERR_QUALITY;
    }
    if (!isnan(g->min_top1) && !(r->top1 >= g->min_top1)) {
        LOG_ERR("calibration gate: top-1 agreement %.4f is below --gate-top1 %.4f", r->top1,
                g->min_top1);
        rc = ERR_QUALITY;
    }
    if (!isnan(g->min_cosine))
        for (size_t i = 0; i < r->n_tensors; i++)
            if (!(r->tensors[i].cosine >= g->min_cosine)) {
                LOG_ERR("calibration gate: %s output cosine %.6f is below --gate-cos %.6f",
                        r->tensors[i].name, r->tensors[i].cosine, g->min_cosine);
                rc = ERR_QUALITY;
            }
    return rc;
}

int calib_write_report(const struct calib_report *r, const struct calib_gate *g, int verdict,
                       const char *path)
{
    json_t *o = json_object(), *ts = json_array(), *gate = json_object();
    int rc = -ENOMEM;
    if (!o || !ts || !gate)
        goto out;
    json_object_set_new(o, "positions", json_integer((json_int_t)r->positions));
    json_object_set_new(o, "kld_mean", json_real(r->kld_mean));
    json_object_set_new(o, "kld_max", json_real(r->kld_max));
    json_object_set_new(o, "top1", json_real(r->top1));
    json_object_set_new(o, "cosine_min", json_real(r->cosine_min));
    if (!isnan(g->max_kld))
        json_object_set_new(gate, "max_kld", json_real(g->max_kld));
    if (!isnan(g->min_top1))
        json_object_set_new(gate, "min_top1", json_real(g->min_top1));
    if (!isnan(g->min_cosine))
        json_object_set_new(gate, "min_cosine", json_real(g->min_cosine));
    json_object_set_new(gate, "passed", json_boolean(verdict == 0));
    json_object_set(o, "gate", gate);
    for (size_t i = 0; i < r->n_tensors; i++) {
        json_t *t = json_pack("{s:s, s:f}", "name", r->tensors[i].name, "cosine",
                              r->tensors[i].cosine);
        if (!t || json_array_append_new(ts, t))
            goto out;
    }
    json_object_set(o, "tensors", ts);
    if (!strcmp(path, "-")) {
        rc = json_dumpf(o, stdout, JSON_INDENT(1)) ? -EIO : 0;
        fputc('\n', stdout);
    } else {
        rc = json_dump_file(o, path, JSON_INDENT(1)) ? -EIO : 0;
    }
    if (rc)
        LOG_ERR("--calib-report %s: cannot write the report", path);
out:
    json_decref(o);
    json_decref(ts);
    json_decref(gate);
    return rc;
}
