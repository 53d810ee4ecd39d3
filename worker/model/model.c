/*
 * model.c — binds an IEBIN model's tensors (llama, qwen2, gpt_oss) into typed views (model.h),
 * and computes RoPE's frequencies (YaRN for gpt_oss, per-pair factors for Llama 3).
 *
 * iebin_open has already validated every tensor against the architecture; the checks here
 * re-run the same rules (iebin_check_tensor) so that the forward pass can rely on the views'
 * geometry whatever produced the struct iebin_model, at a cost of a few dozen comparisons.
 */
#include "model.h"

#include "err.h"
#include "kern.h"
#include "log.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *label(const struct iebin_model *im)
{
    return im->dir && *im->dir ? im->dir : "(model)";
}

/* Looks `name` up, checks it against the architecture, fills the view. */
static int bind(const struct iebin_model *im, const char *name, struct matmul_mat *mat,
                const float **vec)
{
    const struct iebin_tensor *t = iebin_find(im, name);
    if (!t || !t->data) {
        LOG_ERR("%s: tensor '%s' is missing", label(im), name);
        return ERR_NOT_FOUND;
    }
    int rc = iebin_check_tensor(label(im), im->arch, &im->hp, t->name, t->dtype, t->shape,
                                t->n_dims);
    if (rc)
        return rc;
    if (vec) { /* iebin_check_tensor made sure norms are f32 vectors */
        *vec = t->data;
        return 0;
    }
    /* a matrix [rows][cols], or n_experts of them [n][rows][cols]: mat[0 .. n) */
    const int d = t->n_dims;
    const uint64_t n = d == 3 ? t->shape[0] : 1, rows = t->shape[d - 2], cols = t->shape[d - 1];
    uint64_t rb;
    if ((rc = dtype_row_bytes(t->dtype, cols, &rb))) {
        LOG_ERR("%s: tensor '%s': rows of %llu %s elements are not whole blocks", label(im),
                name, (unsigned long long)cols, dtype_info(t->dtype)->name);
        return rc;
    }
    /* iebin_check_tensor bounded every dimension by the hyper-parameters (< 2^32) and the
     * size by the blob: the views stay inside the tensor */
    for (uint64_t e = 0; e < n; e++)
        mat[e] = (struct matmul_mat){t->dtype, (const char *)t->data + e * rows * rb,
                                     (uint32_t)rows, (uint32_t)cols, (size_t)rb, NULL};
    return 0;
}

/* The matrices the products read, in the order their panels are laid out (a layer's dense
 * FFN views are zero for gpt_oss, its router and expert views zero for llama: both are
 * listed, want_panels skips empty ones). */
static size_t product_mats(struct model *m, struct matmul_mat **out)
{
    size_t k = 0;
    const size_t ne = m->hp.n_experts;
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        struct matmul_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo,
                                    &L->w_gate, &L->w_up, &L->w_down, &L->router};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++, k++)
            if (out)
                out[k] = mats[i];
        for (size_t e = 0; m->moe && e < 3 * ne; e++, k++)
            if (out)
                out[k] = &L->gate_exps[e]; /* gate, up, down: one block of 3 * ne views */
    }
    if (out)
        out[k] = &m->output;
    return k + 1;
}

/* 0 when the environment variable `name` is "0" (a knob that turns one panel kind off). */
static int knob_on(const char *name)
{
    const char *env = getenv(name);
    return !(env && strcmp(env, "0") == 0);
}

/* Which stored dtypes get panels: q4_0 unless CLOCHER_Q4_PANELS=0, q8_0 unless
 * CLOCHER_Q8_PANELS=0, q4_K and q6_K unless CLOCHER_KQ_PANELS=0, mxfp4 (gpt-oss's experts)
 * unless CLOCHER_MX_PANELS=0 (one knob per kind so that each can be measured against its
 * stored rows). */
struct panel_kinds {
    int q4, q8, kq, mx;
};

static int want_panels(const struct panel_kinds *k, const struct matmul_mat *w)
{
    int kind = (w->dtype == DT_Q4_0 && k->q4) || (w->dtype == DT_Q8_0 && k->q8) ||
               ((w->dtype == DT_Q4_K || w->dtype == DT_Q6_K) && k->kq) ||
               (w->dtype == DT_MXFP4 && k->mx);
    return kind && kern_panels_supported(w->dtype) && w->cols % 32 == 0 && w->rows > 0;
}

/*
 * Drops the whole pages inside file bytes [a, b) from this process's entries of the model's
 * mapping (ADR 0004, "weights resident once"): the mapping is read-only MAP_PRIVATE of the
 * file, so MADV_DONTNEED only unmaps (a later read faults the same bytes back in from the page
 * cache, which keeps them for other processes). MADV_NOHUGEPAGE first gives the range a VMA
 * of its own: a 2 MiB entry can then never span it, else a read of a kept byte sharing a
 * 2 MiB folio with it (a norm between two matrices) would map the whole folio back with one
 * entry (and a partial DONTNEED of a 2 MiB entry of a file drops all of it). A model without a
 * file mapping (iebin_open_mem) is left alone: there, DONTNEED could zero anonymous memory.
 * 0 or -errno, logged as a warning.
 */
static int drop_pages(const struct iebin_model *im, uint64_t a, uint64_t b)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) / page * page;
    b = b / page * page;
    if (!im->map || b <= a || b > im->map_size)
        return 0;
    char *p = (char *)im->map + a;
    /* may fail without harm: EINVAL without transparent huge pages (no 2 MiB entries then),
     * ENOMEM at vm.max_map_count (the release then holds until a neighbour's 2 MiB fault) */
    (void)madvise(p, (size_t)(b - a), MADV_NOHUGEPAGE);
    if (madvise(p, (size_t)(b - a), MADV_DONTNEED) == 0)
        return 0;
    int e = errno;
    LOG_WARN("%s: madvise(DONTNEED) of %llu bytes of the mapping: %s; the repacked weights "
             "stay resident twice", label(im), (unsigned long long)(b - a), strerror(e));
    return -e;
}

/*
 * Repacks every q4_0, q8_0, q4_K, q6_K and mxfp4 product matrix into panels (ADR 0004,
 * "load-time q4_0 panels" and the addenda "q8_0 panels", "k-quant panels", "mxfp4 panels";
 * gpt-oss's experts are mxfp4 views, one matrix each): one anonymous mapping
 * (transparent huge pages asked for: the products stream it), each matrix's panels 64-byte
 * aligned. With tied embeddings the
 * classifier's panels are a repacked copy of tok_embd, whose stored rows still serve the
 * embedding lookup. PACK_SLICE by PACK_SLICE, the panels' pages are populated just before they
 * are written and the stored rows' pages dropped from the mapping once read (drop_pages), so
 * the resident size grows by one slice at most instead of by every panel (addendum "weights
 * resident once").
 */
#define PACK_SLICE ((size_t)16 << 20) /* panels packed between two drops of stored rows */

static int repack_panels(struct model *m)
{
    const struct panel_kinds kinds = {knob_on("CLOCHER_Q4_PANELS"), knob_on("CLOCHER_Q8_PANELS"),
                                      knob_on("CLOCHER_KQ_PANELS"), knob_on("CLOCHER_MX_PANELS")};
    if (kern_isa() != KERN_ISA_AVX512 || (!kinds.q4 && !kinds.q8 && !kinds.kq && !kinds.mx))
        return 0;
    size_t n = product_mats(m, NULL);
    struct matmul_mat **mats = calloc(n, sizeof *mats);
    if (!mats) {
        LOG_ERR("%s: out of memory", label(m->im));
        return -ENOMEM;
    }
    product_mats(m, mats);
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (want_panels(&kinds, mats[i]))
            total += (kern_panels_bytes(mats[i]->dtype, mats[i]->rows, mats[i]->cols) + 63) /
                     64 * 64;
    if (total == 0) {
        free(mats);
        return 0;
    }
    void *buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        int rc = -errno;
        LOG_ERR("%s: mmap(%zu bytes) for the weight panels failed: %s", label(m->im), total,
                strerror(errno));
        free(mats);
        return rc;
    }
    /* a hint: without it, 4 KiB pages faulted one by one while packing */
    (void)madvise(buf, total, MADV_HUGEPAGE);
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const char *map = m->im->map;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        struct matmul_mat *w = mats[i];
        if (!want_panels(&kinds, w))
            continue;
        char *dst = (char *)buf + off;
        const size_t n_pan = (w->rows + 15) / 16, pan = kern_panels_bytes(w->dtype, 16, w->cols);
        /* the stored rows nothing reads any more (tok_embd's serve the embedding lookup) go
         * as they are packed; pages shared with a neighbour are model_release_stored_rows's */
        const bool drop = map && w->data != m->tok_embd.data;
        const uint64_t at = drop ? (uint64_t)((const char *)w->data - map) : 0;
        uint64_t dropped = at; /* file offset up to which this matrix's pages are dropped */
        for (size_t p0 = 0; p0 < n_pan;) {
            /* PACK_SLICE bytes of panels at a time: the gpt-oss classifier alone is 0.6 GB */
            size_t p1 = p0 + (PACK_SLICE / pan ? PACK_SLICE / pan : 1);
            p1 = p1 < n_pan ? p1 : n_pan;
#ifdef MADV_POPULATE_WRITE
            /* the slice's pages, huge where the 2 MiB fits (from the page holding its start:
             * the previous slice's share of it is already there) */
            char *from = (char *)((uintptr_t)(dst + p0 * pan) & ~(page - 1));
            (void)madvise(from, (size_t)(dst + p1 * pan - from), MADV_POPULATE_WRITE);
#endif
            kern_panels_pack(w->dtype, w->data, w->cols, dst, w->rows, p0, p1);
            if (drop) {
                const size_t r1 = 16 * p1 < w->rows ? 16 * p1 : w->rows;
                const uint64_t end = at + (uint64_t)r1 * w->row_bytes;
                (void)drop_pages(m->im, dropped, end);
                dropped = end / page * page > dropped ? end / page * page : dropped;
            }
            p0 = p1;
        }
        w->panels = dst;
        off += (kern_panels_bytes(w->dtype, w->rows, w->cols) + 63) / 64 * 64;
    }
    free(mats);
    m->panel_buf_ = buf;
    m->panel_bytes_ = total;
    return 0;
}

/*
 * The gpt_oss layers (contract: the "gpt_oss" tensor table of docs/IEBIN.md): biased q/k/v/o,
 * sinks, the router and the experts as n_experts views each; the sliding layers' window and
 * the YaRN concentration.
 */
static int bind_gpt_oss(struct model *m)
{
    const struct iebin_model *im = m->im;
    const struct iebin_hparams *hp = &im->hp;
    const size_t ne = hp->n_experts;
    if (ne == 0 || hp->n_experts_used == 0 || hp->n_experts_used > ne) {
        LOG_ERR("%s: gpt_oss needs 1 <= n_experts_used (%u) <= n_experts (%u)", label(im),
                hp->n_experts_used, hp->n_experts);
        return ERR_RANGE;
    }
    m->moe = true;
    if (hp->rope_scaling.type == IEBIN_ROPE_YARN) {
        double mscale;
        (void)model_yarn_inv_freq(hp, 0, &mscale);
        m->rope_mscale = (float)mscale;
    }
    m->expert_views_ = calloc((size_t)hp->n_layers * 3 * ne, sizeof *m->expert_views_);
    if (!m->expert_views_) {
        LOG_ERR("%s: out of memory for %u x 3 x %zu expert views", label(im), hp->n_layers, ne);
        return -ENOMEM;
    }
    int rc;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        L->gate_exps = m->expert_views_ + (size_t)l * 3 * ne;
        L->up_exps = L->gate_exps + ne;
        L->down_exps = L->up_exps + ne;
        L->window = iebin_layer_slides(hp, l) ? hp->sliding_window : 0;
        L->kind_index = L->window ? m->n_sliding++ : l - m->n_sliding;
        struct {
            const char *kind;
            struct matmul_mat *mat;
            const float **vec;
        } slots[] = {
            {IEBIN_T_ATTN_NORM, NULL, &L->attn_norm},
            {IEBIN_T_ATTN_Q, &L->wq, NULL},
            {IEBIN_T_ATTN_Q_BIAS, NULL, &L->bq},
            {IEBIN_T_ATTN_K, &L->wk, NULL},
            {IEBIN_T_ATTN_K_BIAS, NULL, &L->bk},
            {IEBIN_T_ATTN_V, &L->wv, NULL},
            {IEBIN_T_ATTN_V_BIAS, NULL, &L->bv},
            {IEBIN_T_ATTN_O, &L->wo, NULL},
            {IEBIN_T_ATTN_O_BIAS, NULL, &L->bo},
            {IEBIN_T_ATTN_SINKS, NULL, &L->sinks},
            {IEBIN_T_FFN_NORM, NULL, &L->ffn_norm},
            {IEBIN_T_FFN_ROUTER, &L->router, NULL},
            {IEBIN_T_FFN_ROUTER_BIAS, NULL, &L->router_bias},
            {IEBIN_T_FFN_GATE_EXPS, L->gate_exps, NULL},
            {IEBIN_T_FFN_GATE_EXPS_BIAS, NULL, &L->gate_exps_bias},
            {IEBIN_T_FFN_UP_EXPS, L->up_exps, NULL},
            {IEBIN_T_FFN_UP_EXPS_BIAS, NULL, &L->up_exps_bias},
            {IEBIN_T_FFN_DOWN_EXPS, L->down_exps, NULL},
            {IEBIN_T_FFN_DOWN_EXPS_BIAS, NULL, &L->down_exps_bias},
        };
        for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
            char name[IEBIN_NAME_MAX];
            snprintf(name, sizeof name, "blk.%u.%s", l, slots[i].kind);
            if ((rc = bind(im, name, slots[i].mat, slots[i].vec)))
                return rc;
        }
    }
    return 0;
}

int model_init(struct model *m, const struct iebin_model *im)
{
    memset(m, 0, sizeof *m);
    const bool gpt_oss = strcmp(im->arch, "gpt_oss") == 0;
    if (strcmp(im->arch, "llama") != 0 && strcmp(im->arch, "qwen2") != 0 && !gpt_oss) {
        LOG_ERR("%s: architecture '%s' is not supported by the forward pass (known: llama, "
                "qwen2, gpt_oss)", label(im), im->arch);
        return ERR_UNSUPPORTED;
    }
    if (strcmp(im->arch, iebin_arch_of(&im->hp)) != 0) { /* a hand-built struct iebin_model */
        LOG_ERR("%s: architecture '%s' with hyper-parameters of %s", label(im), im->arch,
                iebin_arch_of(&im->hp));
        return ERR_MISMATCH;
    }
    int rc = iebin_check_hparams(&im->hp, label(im));
    if (rc)
        return rc;
    m->im = im;
    m->hp = im->hp;
    m->q_dim = im->hp.n_heads * im->hp.head_dim;     /* <= 1024*1024 (IEBIN's ranges) */
    m->kv_dim = im->hp.n_kv_heads * im->hp.head_dim;
    m->rope_mscale = 1.0f;
    m->layers = calloc(im->hp.n_layers, sizeof *m->layers);
    if (!m->layers) {
        LOG_ERR("%s: out of memory for %u layer views", label(im), im->hp.n_layers);
        return -ENOMEM;
    }
    if ((rc = bind(im, IEBIN_T_TOK_EMBD, &m->tok_embd, NULL)) ||
        (rc = bind(im, IEBIN_T_OUTPUT_NORM, NULL, &m->output_norm)))
        goto fail;
    if (im->hp.tied_embeddings)
        m->output = m->tok_embd;
    else if ((rc = bind(im, IEBIN_T_OUTPUT, &m->output, NULL)))
        goto fail;
    if (gpt_oss) {
        if ((rc = bind_gpt_oss(m)))
            goto fail;
        goto panels;
    }

    /* llama and qwen2 (= llama with q/k/v biases); a window slides every layer or none
     * (Mistral), so kind_index is the layer's index either way */
    for (uint32_t l = 0; l < im->hp.n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        L->window = iebin_layer_slides(&im->hp, l) ? im->hp.sliding_window : 0;
        L->kind_index = l;
        m->n_sliding += L->window != 0;
        struct {
            const char *kind;
            struct matmul_mat *mat;
            const float **vec;
        } slots[] = {
            {IEBIN_T_ATTN_NORM, NULL, &L->attn_norm}, {IEBIN_T_ATTN_Q, &L->wq, NULL},
            {IEBIN_T_ATTN_K, &L->wk, NULL},           {IEBIN_T_ATTN_V, &L->wv, NULL},
            {IEBIN_T_ATTN_O, &L->wo, NULL},           {IEBIN_T_FFN_NORM, NULL, &L->ffn_norm},
            {IEBIN_T_FFN_GATE, &L->w_gate, NULL},     {IEBIN_T_FFN_UP, &L->w_up, NULL},
            {IEBIN_T_FFN_DOWN, &L->w_down, NULL},     /* qwen2: */
            {IEBIN_T_ATTN_Q_BIAS, NULL, &L->bq},      {IEBIN_T_ATTN_K_BIAS, NULL, &L->bk},
            {IEBIN_T_ATTN_V_BIAS, NULL, &L->bv},
        };
        const size_t n_slots = sizeof slots / sizeof slots[0] - (im->hp.attn_qkv_bias ? 0 : 3);
        for (size_t i = 0; i < n_slots; i++) {
            char name[IEBIN_NAME_MAX];
            snprintf(name, sizeof name, "blk.%u.%s", l, slots[i].kind);
            if ((rc = bind(im, name, slots[i].mat, slots[i].vec)))
                goto fail;
        }
    }
panels:
    if ((rc = repack_panels(m)))
        goto fail;
    (void)model_release_stored_rows(m, NULL); /* memory, not correctness: logged */
    return 0;
fail:
    model_fini(m);
    return rc;
}

void model_fini(struct model *m)
{
    if (m->panel_buf_)
        munmap(m->panel_buf_, m->panel_bytes_);
    m->panel_buf_ = NULL;
    free(m->layers);
    m->layers = NULL;
    free(m->expert_views_);
    m->expert_views_ = NULL;
}

int model_open(const char *dir, unsigned iebin_flags, struct model **out)
{
    struct iebin_model *im = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        LOG_ERR("%s: out of memory", dir);
        return -ENOMEM;
    }
    int rc = iebin_open_ex(dir, iebin_flags, &im);
    if (rc)
        goto fail;
    if ((rc = model_init(m, im)))
        goto fail_close;
    m->owned_ = im;
    *out = m;
    return 0;
fail_close:
    iebin_close(im);
fail:
    free(m);
    return rc;
}

void model_close(struct model *m)
{
    if (!m)
        return;
    struct iebin_model *im = m->owned_;
    model_fini(m);
    free(m);
    iebin_close(im);
}

bool model_reads_stored(const struct model *m, const char *name)
{
    const struct iebin_tensor *t = iebin_find(m->im, name);
    if (!t || !t->data || t->data == m->tok_embd.data)
        return true;
    /* a stored tensor backs at most one product view: match it by address */
    if (m->output.data == t->data)
        return !m->output.panels;
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct matmul_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo,
                                          &L->w_gate, &L->w_up, &L->w_down, &L->router,
                                          L->gate_exps, L->up_exps, L->down_exps};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mats[i] && mats[i]->data == t->data) /* experts: their first view */
                return !mats[i]->panels;
    }
    return true; /* norms, biases, sinks */
}

/* A tensor's file bytes and whether a reader still takes them from the mapping. */
struct stored {
    uint64_t off, end;
    bool read;
};

static int cmp_stored(const void *a, const void *b)
{
    const struct stored *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

int model_unread_ranges(const struct model *m, struct model_range **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    const struct iebin_model *im = m->im;
    const size_t nt = im->n_tensors;
    struct stored *t = malloc((nt ? nt : 1) * sizeof *t);
    struct model_range *r = malloc((nt ? nt : 1) * sizeof *r);
    if (!t || !r) {
        free(t);
        free(r);
        LOG_ERR("%s: out of memory", label(im));
        return -ENOMEM;
    }
    for (size_t i = 0; i < nt; i++)
        t[i] = (struct stored){im->tensors[i].offset,
                               im->tensors[i].offset + im->tensors[i].size,
                               model_reads_stored(m, im->tensors[i].name)};
    qsort(t, nt, sizeof *t, cmp_stored);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    size_t k = 0;
    for (size_t i = 0; i < nt;) {
        if (t[i].read) {
            i++;
            continue;
        }
        /* a run of unread tensors, with the padding up to the next read one */
        size_t j = i;
        while (j < nt && !t[j].read)
            j++;
        const uint64_t a = (t[i].off + page - 1) / page * page;
        const uint64_t b = (j < nt ? t[j].off : t[j - 1].end) / page * page;
        if (b > a)
            r[k++] = (struct model_range){a, b - a};
        i = j;
    }
    free(t);
    if (k == 0) {
        free(r);
        return 0;
    }
    *out = r;
    *n_out = k;
    return 0;
}

int model_release_stored_rows(const struct model *m, uint64_t *released)
{
    if (released)
        *released = 0;
    if (!m->im->map)
        return 0;
    struct model_range *r;
    size_t n;
    int rc = model_unread_ranges(m, &r, &n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = drop_pages(m->im, r[i].off, r[i].off + r[i].len);
        if (rc == 0 && released)
            *released += r[i].len;
    }
    free(r);
    return rc;
}

void model_embed_row(const struct model *m, uint32_t r, float *out)
{
    const struct matmul_mat *e = &m->tok_embd;
    kern_row_to_f32(e->dtype, (const char *)e->data + (size_t)r * e->row_bytes, out, e->cols);
}

double model_yarn_inv_freq(const struct iebin_hparams *hp, uint32_t j, double *mscale)
{
    const struct iebin_rope_scaling *rs = &hp->rope_scaling;
    const double pi = 3.14159265358979323846, theta = hp->rope_theta, d = hp->head_dim;
    const double s = rs->factor, l0 = rs->original_max_position_embeddings;
    double low = d / 2 * log(l0 / (rs->beta_fast * 2 * pi)) / log(theta);
    double high = d / 2 * log(l0 / (rs->beta_slow * 2 * pi)) / log(theta);
    if (rs->truncate) { /* ggml_rope_yarn_corr_dims */
        low = fmax(floor(low), 0.0);
        high = fmin(ceil(high), d - 1);
    }
    double ramp = ((double)j - low) / fmax(high - low, 0.001);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    const double inv_extrap = 1.0 / pow(theta, 2.0 * j / d); /* 1 / freq_j */
    if (mscale)
        *mscale = 0.1 * log(s) + 1.0;
    return inv_extrap / s * ramp + inv_extrap * (1.0 - ramp);
}

void model_rope_inv_freq(const struct model *m, float *inv_freq)
{
    const struct iebin_hparams *hp = &m->hp;
    if (hp->rope_scaling.type == IEBIN_ROPE_YARN) {
        for (uint32_t i = 0; i < hp->head_dim / 2; i++)
            inv_freq[i] = (float)model_yarn_inv_freq(hp, i, NULL);
        return;
    }
    const bool factors = hp->rope_scaling.type == IEBIN_ROPE_FREQ_FACTORS;
    for (uint32_t i = 0; i < hp->head_dim / 2; i++) {
        double f = pow((double)hp->rope_theta, -(double)(2 * i) / (double)hp->head_dim);
        inv_freq[i] = (float)(factors ? f / hp->rope_freq_factors[i] : f);
    }
}

/* Llama 3's smoothing between the two wavelength bounds (model.h). */
double model_llama3_freq_factor(double theta, uint32_t head_dim, uint32_t i, double factor,
                                double low_freq_factor, double high_freq_factor,
                                double original_max_position_embeddings)
{
    const double pi = 3.14159265358979323846, l0 = original_max_position_embeddings;
    const double wavelen = 2 * pi * pow(theta, (double)(2 * i) / (double)head_dim);
    if (wavelen < l0 / high_freq_factor)
        return 1.0;
    if (wavelen > l0 / low_freq_factor)
        return factor;
    const double smooth = (l0 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return 1.0 / ((1.0 - smooth) / factor + smooth);
}

void model_rope_row(const struct model *m, float *cs, uint32_t pos, const float *inv_freq)
{
    const size_t half = m->hp.head_dim / 2;
    kern_rope_table(cs, pos, inv_freq, half);
    for (size_t i = 0; m->rope_mscale != 1.0f && i < half * 2; i++)
        cs[i] *= m->rope_mscale;
}

void model_add_bias(float *y, size_t n, size_t ldy, const float *b, size_t cols)
{
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < cols; i++)
            y[t * ldy + i] += b[i];
}

int model_alloc_f32(const char *who, const char *what, uint64_t a, uint64_t b, uint64_t c,
                    float **out)
{
    uint64_t n, bytes;
    if (dtype_mul_u64(a, b, &n) || dtype_mul_u64(n, c, &n) ||
        dtype_mul_u64(n, sizeof(float), &bytes) || bytes > SIZE_MAX - 64) {
        LOG_ERR("%s: the %s, %llu x %llu x %llu floats, overflows", who, what,
                (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
        return ERR_OVERFLOW;
    }
    size_t size = ((size_t)bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple */
    *out = aligned_alloc(64, size ? size : 64);
    if (!*out) {
        LOG_ERR("%s: out of memory for the %s (%llu bytes)", who, what,
                (unsigned long long)bytes);
        return -ENOMEM;
    }
    return 0;
}
