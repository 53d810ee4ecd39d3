/*
 * convert.c — llama2.c / Hugging Face / GGUF → IEBIN (see convert.h).
 *
 * Every source is reduced to the same loop: for each IEBIN tensor of the llama architecture,
 * find the source tensor, check its shape, and stream its rows through a dtype conversion
 * (and, for HF q/k, a row permutation) into the IEBIN writer.
 */
#include "chat_meta.h"
#include "convert.h"

#include "err.h"
#include "gguf.h"
#include "iebin.h"
#include "kern.h"
#include "llama2c.h"
#include "log.h"
#include "model.h"
#include "mxfp4_hf.h"
#include "safetensors.h"
#include "tok.h"

#include "half.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * One source tensor as the converter sees it: rows of a dtype, row-major, outermost first,
 * with the shape of the IEBIN tensor it becomes (a lookup translates layouts):
 *  - scales != NULL: Hugging Face MXFP4, dtype DT_MXFP4 but stored as two tensors, `data` the
 *    blocks (16 bytes of nibbles per 32 elements, element 2i low and 2i+1 high in byte i) and
 *    `scales` their E8M0 bytes, one per block; repacked to GGUF's block_mxfp4 per row;
 *  - deint 1 / 2: the IEBIN tensor is the even / odd rows (biases: elements) of a source whose
 *    groups (per expert) are twice as long: HF's interleaved gate_up_proj (gpt-oss);
 *    deint 3 / 4: the first / second half of each group: llama.cpp's fused ffn_gate_up_exps
 *    (gate rows, then up rows, per expert).
 */
struct src_tensor {
    enum dtype dtype;
    int n_dims;
    uint64_t shape[4];
    const uint8_t *data;
    const uint8_t *scales;
    int deint;
    char name[200]; /* the source's name for it, in messages */
};

/* The state of one conversion: progress, and whether a failure was the output's. */
struct progress {
    bool on;
    size_t done, total;
    double mb;
    void (*fn)(void *arg, size_t done, size_t total);
    void *arg;
    bool out_failed; /* set where a write to OUT_DIR fails (convert_model's *fault) */
};

/* rc of a call that writes OUT_DIR: a failure there is the output's, not the source's. */
static int out_rc(struct progress *pg, int rc)
{
    if (rc)
        pg->out_failed = true;
    return rc;
}

static void progress_tick(struct progress *p, const char *name, uint64_t bytes)
{
    p->done++;
    p->mb += (double)bytes / 1e6;
    if (p->on) {
        fprintf(stderr, "\rconverting: %zu/%zu tensors, %.0f MB  %-32.32s", p->done, p->total,
                p->mb, name);
        if (p->done == p->total)
            fputc('\n', stderr);
        fflush(stderr);
    }
    if (p->fn)
        p->fn(p->arg, p->done, p->total);
}

/*
 * Round-to-nearest block quantization with one f16 scale per 32 elements, GGML's Q8_0/Q4_0
 * layouts (common/dtype.h):
 *   q8_0: d = max|x| / 127, q = round(x / d) in [-127, 127];
 *   q4_0: d = m / -8 where m is the element of largest magnitude (sign kept), so m maps
 *         exactly to the code 0 and the range [-8, 7] is used asymmetrically, q = round(x/d)+8.
 * The scale is rounded to f16 before the codes are computed from it.
 */
static int quantize_row(enum dtype to, const float *x, void *dst, size_t n)
{
    uint8_t *b = dst;
    for (size_t i = 0; i < n; i += 32) {
        const float *v = x + i;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (!isfinite(v[j])) {
                LOG_ERR("cannot quantize a non-finite value (%g)", (double)v[j]);
                return ERR_RANGE;
            }
            if (fabsf(v[j]) > amax) {
                amax = fabsf(v[j]);
                m = v[j];
            }
        }
        if (to == DT_Q8_0) {
            uint16_t d16 = half_f32_to_f16(amax / 127.0f);
            float d = half_f16_to_f32(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(b, &d16, 2);
            int8_t *q = (int8_t *)(b + 2);
            for (int j = 0; j < 32; j++) {
                float r = roundf(v[j] * id);
                q[j] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
            }
            b += 34;
        } else {
            uint16_t d16 = half_f32_to_f16(m / -8.0f);
            float d = half_f16_to_f32(d16), id = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(b, &d16, 2);
            uint8_t *q = b + 2;
            for (int j = 0; j < 16; j++) {
                float r0 = roundf(v[j] * id) + 8.0f, r1 = roundf(v[j + 16] * id) + 8.0f;
                uint8_t c0 = (uint8_t)(r0 < 0.0f ? 0 : r0 > 15.0f ? 15 : r0);
                uint8_t c1 = (uint8_t)(r1 < 0.0f ? 0 : r1 > 15.0f ? 15 : r1);
                q[j] = (uint8_t)(c0 | (c1 << 4));
            }
            b += 18;
        }
    }
    return 0;
}

/* Converts one row of n elements between dtypes. Targets: same dtype, a float or a block type. */
static int convert_row(enum dtype from, const void *src, enum dtype to, void *dst, float *tmp,
                       size_t n, bool search)
{
    if (from == to) {
        uint64_t rb;
        dtype_row_bytes(from, n, &rb);
        memcpy(dst, src, rb);
        return 0;
    }
    kern_row_to_f32(from, src, tmp, n);
    if (search && (to == DT_Q4_0 || dtype_is_q4g(to)))
        return kern_quantize_row_q4_search(to, tmp, dst, n); /* --rounding search */
    switch (to) {
    case DT_F32:
        memcpy(dst, tmp, n * sizeof(float));
        return 0;
    case DT_F16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) {
            if (isfinite(tmp[i]) && fabsf(tmp[i]) > 65504.0f) {
                LOG_ERR("value %g does not fit in f16", (double)tmp[i]);
                return ERR_RANGE;
            }
            h[i] = half_f32_to_f16(tmp[i]);
        }
        return 0;
    }
    case DT_BF16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++)
            h[i] = half_f32_to_bf16(tmp[i]);
        return 0;
    }
    case DT_Q8_0:
    case DT_Q4_0:
        return quantize_row(to, tmp, dst, n);
    case DT_Q4_G64:
    case DT_Q4_G128:
    case DT_Q4Z_G32:
    case DT_Q4Z_G64:
    case DT_Q4Z_G128:
        /* the int4 group types: round to nearest per group (kern.h states the rule) */
        return kern_quantize_row_q4g(to, tmp, dst, n);
    case DT_Q4_K:
    case DT_Q5_K:
    case DT_Q6_K:
        /* GGUF's k-quant layouts, with a scale/min search per sub-block (kern.h states it) */
        return kern_quantize_row_kq(to, tmp, dst, n);
    default:
        LOG_ERR("conversion to %s is not supported here",
                dtype_info(to)->name);
        return ERR_UNSUPPORTED;
    }
}

/* A source row holding NaN or an infinity (in its values or, for a block type, its scales)
 * is refused naming the element: such weights would only surface later as broken logits.
 * row: [n] the source row already widened to f32. */
static int check_finite_row(const char *what, const char *src, uint64_t row, const float *x,
                            size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            LOG_ERR("%s: tensor '%s': row %llu, element %zu is %s (a checkpoint with non-finite "
                    "weights is broken)",
                    what, src, (unsigned long long)row, i, isnan(x[i]) ? "NaN" : "infinite");
            return ERR_RANGE;
        }
    return 0;
}

/* E8M0 255 is NaN: a checkpoint holding it is broken, and no kernel handles it. */
static int check_e8m0(const char *what, const char *src, uint64_t row, uint64_t block, uint8_t e)
{
    if (e != 255)
        return 0;
    LOG_ERR("%s: tensor '%s': row %llu, block %llu: E8M0 scale byte 255 (NaN)", what, src,
            (unsigned long long)row, (unsigned long long)block);
    return ERR_RANGE;
}

/*
 * One row of Hugging Face MXFP4 (nb blocks: 16 nibble bytes each, element 2i in the low and
 * 2i+1 in the high nibble of byte i, scales separately) as GGUF's block_mxfp4 (scale byte
 * first, then byte j holding element j low and j+16 high): lossless.
 */
static int hf_mxfp4_row(const char *what, const struct src_tensor *st, uint64_t row,
                        uint8_t *dst)
{
    uint64_t nb = st->shape[st->n_dims - 1] / 32;
    const uint8_t *blk = st->data + row * nb * 16, *sc = st->scales + row * nb;
    for (uint64_t b = 0; b < nb; b++, blk += 16, dst += 17) {
        int rc = check_e8m0(what, st->name, row, b, sc[b]);
        if (rc)
            return rc;
        mxfp4_block_from_hf(blk, sc[b], dst);
    }
    return 0;
}

/*
 * Drops the pages of [p, p + n) from this process's mapping of the source (they stay in the
 * page cache): streaming a 13 GB checkpoint then keeps about one tensor resident instead of
 * the whole file. The pages are file-backed and read-only, so this loses nothing; a page
 * shared with a neighbouring tensor just faults in again.
 */
static void release_source(const void *p, uint64_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = (uintptr_t)p + n;
    if (pg > 0 && e > a)
        madvise((void *)a, e - a, MADV_DONTNEED); /* advisory: a failure changes nothing */
}

/* The source row of IEBIN row r (emit's comment gives the three rules). */
static uint64_t source_row(const struct src_tensor *st, uint64_t r, uint32_t perm_heads,
                           uint32_t head_dim, uint64_t group)
{
    if (perm_heads)
        return iebin_rope_hf_row(r, head_dim);
    if (st->deint == 1 || st->deint == 2)
        return (r / group) * 2 * group + 2 * (r % group) + (uint64_t)(st->deint - 1);
    if (st->deint)
        return (r / group) * 2 * group + r % group + (uint64_t)(st->deint - 3) * group;
    return r;
}

/*
 * Writes one IEBIN tensor from a source tensor. Row r of the IEBIN tensor (or element r, when
 * `elementwise`: a bias whose elements move) comes from source row:
 *  - perm_heads > 0 (q/k of a rotate-half source): iebin_rope_hf_row(r, head_dim), so row
 *    h*hd + 2i + s comes from h*hd + s*hd/2 + i;
 *  - st->deint 1, 2: (r / G)*2G + 2(r % G) + deint - 1, G the rows (elements) per expert;
 *    3, 4: (r / G)*2G + r % G + (deint - 3)*G.
 */
static int emit(struct iebin_writer *w, const char *what, const char *name,
                const struct src_tensor *st, const uint64_t *want, int want_dims, enum dtype to,
                uint32_t perm_heads, uint32_t head_dim, bool elementwise, bool search,
                struct progress *pg)
{
    if (st->n_dims != want_dims || memcmp(st->shape, want, sizeof(uint64_t) * (size_t)want_dims)) {
        char got[96] = "", exp[96] = "";
        for (int i = 0; i < st->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)st->shape[i]);
        for (int i = 0; i < want_dims; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%llu", i ? ", " : "",
                     (unsigned long long)want[i]);
        LOG_ERR("%s: tensor for '%s' has shape [%s], expected [%s] (source '%s')", what, name,
                got, exp, st->name);
        return ERR_MISMATCH;
    }
    uint64_t cols = want[want_dims - 1], rows = 1;
    for (int i = 0; i < want_dims - 1; i++)
        rows *= want[i];
    /* rows (elements) per expert, for de-interleaving */
    uint64_t group = elementwise ? cols : want_dims >= 2 ? want[want_dims - 2] : 1;
    if (elementwise)
        rows *= cols, cols = 1;
    uint64_t src_rb, dst_rb;
    if (dtype_row_bytes(st->dtype, cols, &src_rb) || dtype_row_bytes(to, cols, &dst_rb)) {
        LOG_ERR("%s: tensor for '%s': row of %llu elements is not whole blocks", what, name,
                (unsigned long long)cols);
        return ERR_FORMAT;
    }
    int rc = out_rc(pg, iebin_writer_begin(w, name, to, want, want_dims));
    if (rc)
        return rc;
    /* a chunk of rows at a time keeps writes large without holding the tensor */
    size_t chunk_rows = dst_rb >= (4u << 20) ? 1 : (size_t)((4u << 20) / dst_rb);
    if (chunk_rows > rows)
        chunk_rows = (size_t)rows;
    uint8_t *buf = malloc(chunk_rows * dst_rb);
    uint8_t *mx = st->scales && to != DT_MXFP4 ? malloc(src_rb) : NULL; /* a repacked row */
    float *tmp = malloc(cols * sizeof(float));
    /* [chunk_rows][cols]: a k-quant target's chunk in f32, quantized row-parallel (the search
     * costs far more than reading the source; the other targets stay one row at a time) */
    bool par = dtype_is_kq(to) && to != st->dtype && !st->scales && st->dtype != DT_MXFP4;
    float *xf = par ? malloc(chunk_rows * cols * sizeof(float)) : NULL;
    if (!buf || !tmp || (st->scales && to != DT_MXFP4 && !mx) || (par && !xf)) {
        LOG_ERR("out of memory converting '%s'", name);
        rc = -ENOMEM;
        goto out;
    }
    for (uint64_t r0 = 0; r0 < rows && rc == 0; r0 += chunk_rows) {
        uint64_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        if (xf) { /* a k-quant: widen the chunk, then quantize its rows on every CPU */
            for (uint64_t j = 0; j < nr && rc == 0; j++) {
                uint64_t sr = source_row(st, r0 + j, perm_heads, head_dim, group);
                kern_row_to_f32(st->dtype, st->data + sr * src_rb, xf + j * cols, cols);
                rc = check_finite_row(what, st->name, sr, xf + j * cols, cols);
            }
            if (rc == 0)
                rc = kern_quantize_rows_kq(to, xf, nr, cols, buf, 0);
        }
        for (uint64_t j = 0; j < nr && rc == 0 && !xf; j++) {
            uint64_t sr = source_row(st, r0 + j, perm_heads, head_dim, group);
            uint8_t *d = buf + j * dst_rb;
            if (st->scales) { /* HF MXFP4: repack, then convert like any mxfp4 row */
                if ((rc = hf_mxfp4_row(what, st, sr, mx ? mx : d)) == 0 && mx)
                    rc = convert_row(DT_MXFP4, mx, to, d, tmp, cols, search);
                continue;
            }
            const uint8_t *sp = st->data + sr * src_rb;
            if (st->dtype == DT_MXFP4) {
                for (uint64_t b = 0; b < cols / 32 && rc == 0; b++)
                    rc = check_e8m0(what, st->name, sr, b, sp[b * 17]);
            } else { /* widened once more for the check: cheap beside reading the source */
                kern_row_to_f32(st->dtype, sp, tmp, cols);
                rc = check_finite_row(what, st->name, sr, tmp, cols);
            }
            if (rc == 0)
                rc = convert_row(st->dtype, sp, to, d, tmp, cols, search);
        }
        if (rc == 0)
            rc = out_rc(pg, iebin_writer_write(w, buf, nr * dst_rb));
    }
    if (rc == 0)
        rc = out_rc(pg, iebin_writer_end(w));
    if (rc == 0)
        progress_tick(pg, name, rows * dst_rb);
    /* the source is done with, unless it is a fused gate/up whose other half comes next */
    if (rc == 0 && st->deint != 1 && st->deint != 3) {
        uint64_t src_rows = st->deint ? 2 * rows : rows;
        if (st->scales) {
            release_source(st->data, src_rows * (cols / 32) * 16);
            release_source(st->scales, src_rows * (cols / 32));
        } else {
            release_source(st->data, src_rows * src_rb);
        }
    }
out:
    free(buf);
    free(mx);
    free(tmp);
    free(xf);
    return rc;
}

/*
 * A block type needs rows of whole blocks (32, 64 or 128 elements). A matrix whose rows are
 * not (stories260K's ffn_down has 172 columns) keeps a float dtype instead — its source dtype
 * if that is a float, else f32 — as llama.cpp's quantizer does; said once per tensor at info
 * level.
 */
static enum dtype fallback_dtype(const char *name, enum dtype to, enum dtype from, uint64_t cols)
{
    uint64_t rb;
    if (dtype_row_bytes(to, cols, &rb) == 0)
        return to;
    enum dtype fb = (from == DT_F32 || from == DT_F16 || from == DT_BF16) ? from : DT_F32;
    LOG_INFO("%s: rows of %llu are not whole %s blocks; stored as %s", name,
             (unsigned long long)cols, dtype_info(to)->name, dtype_info(fb)->name);
    return fb;
}

/* ---- a generic walk over an architecture's tensors ---- */

/* Looks a tensor up in the source by its IEBIN name: `kind` is the name for global tensors
 * (layer < 0) or the part after "blk.N." (e.g. "attn_q"). */
typedef int lookup_fn(void *src, const char *kind, int layer, struct src_tensor *out);

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/*
 * Streams every tensor of the architecture (iebin_arch_slot's tables), in the order tok_embd,
 * layer 0, 1, ..., output_norm, output. Norms, biases and sinks become f32; expert tensors
 * keep their source dtype (mxfp4 from checkpoints: never requantized); every other matrix
 * gets --dtype, the embedding dtype or a quant-manifest rule. hf_rope: q/k rows and biases are
 * in rotate-half order in the source.
 */
static int walk(void *src, lookup_fn *lookup, const char *what, const struct iebin_hparams *hp,
                struct iebin_writer *w, const struct convert_opts *o, bool hf_rope,
                struct progress *pg)
{
    const char *arch = iebin_arch_of(hp);
    size_t ns = iebin_arch_n_slots(arch, hp);
    pg->total = ns - (hp->tied_embeddings ? 1 : 0);
    for (size_t i = 0; i < ns; i++) {
        /* slots are tok_embd, output_norm, output, layers...: write the layers second */
        size_t slot = i == 0 ? 0 : i + 2 < ns ? i + 2 : i + 3 - ns;
        if (slot == 2 && hp->tied_embeddings)
            continue;
        char name[IEBIN_NAME_MAX];
        uint64_t want[3];
        int nd;
        bool f32;
        iebin_arch_slot(arch, hp, slot, name, want, &nd, &f32);
        int layer = -1;
        const char *kind = name;
        if (slot > 2) {
            layer = atoi(name + 4);
            kind = strchr(name + 4, '.') + 1;
        }
        struct src_tensor st;
        memset(&st, 0, sizeof st);
        int rc = lookup(src, kind, layer, &st);
        if (rc)
            return rc;
        uint32_t perm = 0;
        if (hf_rope && (!strcmp(kind, IEBIN_T_ATTN_Q) || !strcmp(kind, IEBIN_T_ATTN_Q_BIAS)))
            perm = hp->n_heads;
        else if (hf_rope && (!strcmp(kind, IEBIN_T_ATTN_K) || !strcmp(kind, IEBIN_T_ATTN_K_BIAS)))
            perm = hp->n_kv_heads;
        bool expert = ends_with(kind, "_exps");
        enum dtype to = st.dtype;
        if (f32) {
            to = DT_F32;
        } else if (!expert) {
            if (o->dtype_set)
                to = o->dtype;
            if (o->embd_dtype_set && (!strcmp(kind, IEBIN_T_TOK_EMBD) || !strcmp(kind, IEBIN_T_OUTPUT)))
                to = o->embd_dtype;
            enum dtype qm;
            if (o->manifest && qm_match(o->manifest, name, &qm) == 0)
                to = qm;
            to = fallback_dtype(name, to, st.dtype, want[nd - 1]);
        }
        rc = emit(w, what, name, &st, want, nd, to, perm, hp->head_dim, f32 && (perm || st.deint),
                  o->rounding_search, pg);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- tokenizer ---- */

/*
 * Loads any tokenizer tok_load knows and renders it as tokenizer.ie.json. A tokenizer with more
 * tokens than the model has embedding rows could emit ids the model cannot look up (the engine
 * refuses such a pair at load): refused here, before anything is written. Fewer is fine
 * (checkpoints pad their vocabulary to a multiple of 64 or so).
 */
static int tokenizer_json(const char *path, uint32_t vocab_size, char **json, size_t *len)
{
    struct tok *t;
    int rc = tok_load(path, &t);
    if (rc)
        return rc;
    if (tok_vocab_size(t) > vocab_size) {
        LOG_ERR("%s: the tokenizer has %u tokens, more than the model's vocab_size %u", path,
                tok_vocab_size(t), vocab_size);
        rc = ERR_MISMATCH;
    } else {
        rc = tok_save_json(t, json, len);
    }
    tok_free(t);
    return rc;
}

/*
 * The common tail of every streaming import: the tokenizer first (a bad one fails before
 * gigabytes are written), then the tensors, then the atomic commit. tok_path may be NULL.
 */
static int write_model(void *src, lookup_fn *lookup, const char *what, const char *out_dir,
                       const char *name, const struct iebin_hparams *hp, const char *tok_path,
                       const struct convert_opts *o, bool hf_rope, struct progress *pg)
{
    char *json = NULL;
    size_t len = 0;
    int rc = tok_path ? tokenizer_json(tok_path, hp->vocab_size, &json, &len) : 0;
    if (rc)
        return rc;
    struct iebin_writer *w;
    rc = out_rc(pg, iebin_writer_create(out_dir, iebin_arch_of(hp), name, hp, &w));
    if (rc == 0) {
        if ((rc = walk(src, lookup, what, hp, w, o, hf_rope, pg)) == 0 && json)
            rc = out_rc(pg, iebin_writer_set_tokenizer(w, json, len));
        if (rc)
            iebin_writer_abort(w);
        else
            rc = out_rc(pg, iebin_writer_finish(w));
    }
    free(json);
    return rc;
}

static const char *base_name(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *b = strrchr(buf, '/');
    return b ? b + 1 : buf;
}

/* ---- Hugging Face ---- */

struct hf_src {
    struct safetensors_set *set;
    const char *dir;
    const struct iebin_hparams *hp;
};

/* IEBIN kind -> HF name (after "model.layers.N." for per-layer kinds); deint for gate/up. */
static const struct hf_name {
    const char *kind, *hf;
    int deint;
} hf_names[] = {
    {IEBIN_T_TOK_EMBD, "model.embed_tokens.weight", 0},
    {IEBIN_T_OUTPUT_NORM, "model.norm.weight", 0},
    {IEBIN_T_OUTPUT, "lm_head.weight", 0},
    {IEBIN_T_ATTN_NORM, "input_layernorm.weight", 0},
    {IEBIN_T_ATTN_Q, "self_attn.q_proj.weight", 0},
    {IEBIN_T_ATTN_K, "self_attn.k_proj.weight", 0},
    {IEBIN_T_ATTN_V, "self_attn.v_proj.weight", 0},
    {IEBIN_T_ATTN_O, "self_attn.o_proj.weight", 0},
    {IEBIN_T_FFN_NORM, "post_attention_layernorm.weight", 0},
    {IEBIN_T_FFN_GATE, "mlp.gate_proj.weight", 0},
    {IEBIN_T_FFN_UP, "mlp.up_proj.weight", 0},
    {IEBIN_T_FFN_DOWN, "mlp.down_proj.weight", 0},
    /* gpt_oss */
    {IEBIN_T_ATTN_Q_BIAS, "self_attn.q_proj.bias", 0},
    {IEBIN_T_ATTN_K_BIAS, "self_attn.k_proj.bias", 0},
    {IEBIN_T_ATTN_V_BIAS, "self_attn.v_proj.bias", 0},
    {IEBIN_T_ATTN_O_BIAS, "self_attn.o_proj.bias", 0},
    {IEBIN_T_ATTN_SINKS, "self_attn.sinks", 0},
    {IEBIN_T_FFN_ROUTER, "mlp.router.weight", 0},
    {IEBIN_T_FFN_ROUTER_BIAS, "mlp.router.bias", 0},
    {IEBIN_T_FFN_GATE_EXPS, "mlp.experts.gate_up_proj", 1}, /* + _blocks/_scales */
    {IEBIN_T_FFN_UP_EXPS, "mlp.experts.gate_up_proj", 2},
    {IEBIN_T_FFN_DOWN_EXPS, "mlp.experts.down_proj", 0},
    {IEBIN_T_FFN_GATE_EXPS_BIAS, "mlp.experts.gate_up_proj_bias", 1},
    {IEBIN_T_FFN_UP_EXPS_BIAS, "mlp.experts.gate_up_proj_bias", 2},
    {IEBIN_T_FFN_DOWN_EXPS_BIAS, "mlp.experts.down_proj_bias", 0},
};

static const struct safetensors_tensor *hf_find(const struct hf_src *s, const char *name)
{
    const struct safetensors_tensor *t = safetensors_set_find(s->set, name);
    if (!t)
        LOG_ERR("%s: tensor '%s' is missing from the safetensors files", s->dir, name);
    return t;
}

static const char *dims_str(const uint64_t *d, int n, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (int i = 0; i < n; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%llu", i ? ", " : "",
                 (unsigned long long)d[i]);
    return buf;
}

/*
 * gpt-oss experts: `base`_blocks U8 [E][R][nb][16] and `base`_scales U8 [E][R][nb], R the
 * output rows (2*ffn_dim for gate_up, interleaved), nb the 32-blocks of a row (`in` / 32).
 */
static int hf_lookup_mxfp4(const struct hf_src *s, const char *base, int deint, uint64_t in,
                           struct src_tensor *out)
{
    char bn[192], sn[192], d1[96], d2[96];
    snprintf(bn, sizeof bn, "%s_blocks", base);
    snprintf(sn, sizeof sn, "%s_scales", base);
    const struct safetensors_tensor *b = hf_find(s, bn), *sc = b ? hf_find(s, sn) : NULL;
    if (!b || !sc)
        return ERR_NOT_FOUND;
    if (b->dtype != SAFETENSORS_U8 || b->n_dims != 4 || b->shape[3] != 16) {
        LOG_ERR("%s: tensor '%s' is %s [%s]; MXFP4 blocks are U8 [experts, rows, blocks, 16]",
                s->dir, bn, safetensors_dtype_name(b->dtype), dims_str(b->shape, b->n_dims, d1,
                                                                       sizeof d1));
        return ERR_FORMAT;
    }
    if (b->shape[2] * 32 != in) {
        LOG_ERR("%s: tensor '%s' has %llu blocks of 32 per row, expected %llu (rows of %llu)",
                s->dir, bn, (unsigned long long)b->shape[2], (unsigned long long)(in / 32),
                (unsigned long long)in);
        return ERR_MISMATCH;
    }
    if (sc->dtype != SAFETENSORS_U8 || sc->n_dims != 3 || memcmp(sc->shape, b->shape, 3 * 8)) {
        LOG_ERR("%s: tensor '%s' is %s [%s]; expected U8 [%s] (one E8M0 scale per block of '%s')",
                s->dir, sn, safetensors_dtype_name(sc->dtype),
                dims_str(sc->shape, sc->n_dims, d1, sizeof d1), dims_str(b->shape, 3, d2, sizeof d2),
                bn);
        return sc->dtype != SAFETENSORS_U8 ? ERR_FORMAT : ERR_MISMATCH;
    }
    if (deint && b->shape[1] % 2) {
        LOG_ERR("%s: tensor '%s' has %llu rows per expert; interleaved gate/up needs an even "
                "count",
                s->dir, bn, (unsigned long long)b->shape[1]);
        return ERR_MISMATCH;
    }
    out->dtype = DT_MXFP4;
    out->n_dims = 3;
    out->shape[0] = b->shape[0];
    out->shape[1] = deint ? b->shape[1] / 2 : b->shape[1];
    out->shape[2] = in;
    out->data = b->data;
    out->scales = sc->data;
    out->deint = deint;
    snprintf(out->name, sizeof out->name, "%s", sn); /* what an E8M0 error names */
    return 0;
}

static int hf_lookup(void *p, const char *kind, int layer, struct src_tensor *out)
{
    struct hf_src *s = p;
    const struct hf_name *m = NULL;
    for (size_t i = 0; i < sizeof hf_names / sizeof hf_names[0]; i++)
        if (!strcmp(hf_names[i].kind, kind))
            m = &hf_names[i];
    char name[160];
    if (layer < 0)
        snprintf(name, sizeof name, "%s", m->hf);
    else
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, m->hf);
    if (ends_with(kind, "_exps"))
        return hf_lookup_mxfp4(s, name, m->deint,
                               !strcmp(kind, IEBIN_T_FFN_DOWN_EXPS) ? s->hp->ffn_dim : s->hp->dim,
                               out);
    const struct safetensors_tensor *t = hf_find(s, name);
    if (!t)
        return ERR_NOT_FOUND;
    if (safetensors_dtype_to_dtype(t->dtype, &out->dtype) != 0 ||
        (out->dtype != DT_F32 && out->dtype != DT_F16 && out->dtype != DT_BF16)) {
        LOG_ERR("%s: tensor '%s' has dtype %s; F32, F16 and BF16 are supported", s->dir, name,
                safetensors_dtype_name(t->dtype));
        return ERR_UNSUPPORTED;
    }
    if (t->n_dims < 1 || t->n_dims > 4) {
        LOG_ERR("%s: tensor '%s' has %d dimensions", s->dir, name, t->n_dims);
        return ERR_FORMAT;
    }
    out->n_dims = t->n_dims;
    memcpy(out->shape, t->shape, sizeof(uint64_t) * (size_t)t->n_dims);
    out->data = t->data;
    snprintf(out->name, sizeof out->name, "%s", name);
    if ((out->deint = m->deint) != 0) { /* gate_up_proj_bias [E][2F]: even gate, odd up */
        if (out->shape[out->n_dims - 1] % 2) {
            LOG_ERR("%s: tensor '%s' has an odd last dimension; interleaved gate/up needs an "
                    "even one",
                    s->dir, name);
            return ERR_MISMATCH;
        }
        out->shape[out->n_dims - 1] /= 2;
    }
    return 0;
}

/* Whether n is "model.layers.N.self_attn.{q,k,v}_proj.bias" (qwen2's biases). */
static bool hf_qkv_bias_name(const char *n)
{
    if (strncmp(n, "model.layers.", 13) != 0)
        return false;
    const char *p = n + 13;
    while (*p >= '0' && *p <= '9')
        p++;
    return p > n + 13 && (!strcmp(p, ".self_attn.q_proj.bias") ||
                          !strcmp(p, ".self_attn.k_proj.bias") ||
                          !strcmp(p, ".self_attn.v_proj.bias"));
}

/* A bias the config did not announce would be silently dropped: refuse any (but q/k/v's when
 * the architecture has them: qwen2). */
static int hf_refuse_biases(const struct hf_src *s, bool qkv_ok)
{
    for (size_t f = 0; f < s->set->n_files; f++) {
        const struct safetensors_file *sf = s->set->files[f];
        for (size_t i = 0; i < sf->n_tensors; i++) {
            const char *n = sf->tensors[i].name;
            if (ends_with(n, ".bias") && !(qkv_ok && hf_qkv_bias_name(n))) {
                LOG_ERR("%s: tensor '%s': biases are not supported%s", sf->path, n,
                        qkv_ok ? " (qwen2 has q, k and v biases only)" : "");
                return ERR_UNSUPPORTED;
            }
        }
    }
    return 0;
}

static int json_u32(json_t *cfg, const char *path, const char *key, uint32_t *out, bool required,
                    uint32_t dflt)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (!required) {
            *out = dflt;
            return 0;
        }
        LOG_ERR("%s: missing key '%s'", path, key);
        return ERR_FORMAT;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 0x7fffffff) {
        LOG_ERR("%s: '%s' must be a positive integer", path, key);
        return ERR_FORMAT;
    }
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int json_f32(json_t *cfg, const char *path, const char *key, float *out, float dflt)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v)) {
        LOG_ERR("%s: '%s' must be a number", path, key);
        return ERR_FORMAT;
    }
    *out = (float)json_number_value(v);
    return 0;
}

/*
 * Llama 3's rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}, every key required (as in transformers), into one factor
 * per pair (model_llama3_freq_factor, rounded to float: what llama.cpp stores as rope_freqs,
 * so that HF and GGUF give the same IEBIN). rope_type "default" with nothing else is plain
 * RoPE. Any other type or key changes what the model computes and is refused by name.
 */
static int hf_llama3_rope(json_t *rs, const char *path, struct iebin_hparams *hp)
{
    static const char *const known[] = {"rope_type", "type", "factor", "low_freq_factor",
                                        "high_freq_factor", "original_max_position_embeddings"};
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs)) {
        LOG_ERR("%s: rope_scaling is not an object", path);
        return ERR_FORMAT;
    }
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty)
        ty = json_object_get(rs, "type");
    const char *tys = json_is_string(ty) ? json_string_value(ty) : "(missing)";
    if (!strcmp(tys, "default") && json_object_size(rs) == 1)
        return 0;
    if (strcmp(tys, "llama3") != 0) {
        LOG_ERR("%s: rope_scaling is not supported with rope_type %s (known: llama3)", path,
                tys);
        return ERR_UNSUPPORTED;
    }
    const char *key;
    json_t *v;
    json_object_foreach(rs, key, v) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok) {
            LOG_ERR("%s: rope_scaling.%s is not implemented (llama3 scaling: factor, "
                    "low_freq_factor, high_freq_factor, original_max_position_embeddings)",
                    path, key);
            return ERR_UNSUPPORTED;
        }
    }
    double p[4];
    for (size_t i = 0; i < 4; i++) {
        json_t *x = json_object_get(rs, known[2 + i]);
        if (!json_is_number(x) || !(json_number_value(x) > 0) || !isfinite(json_number_value(x))) {
            LOG_ERR("%s: rope_scaling.%s is %s; llama3 scaling needs a finite number > 0", path,
                    known[2 + i], x ? "not a number > 0" : "missing");
            return ERR_FORMAT;
        }
        p[i] = json_number_value(x);
    }
    if (!(p[2] > p[1])) {
        LOG_ERR("%s: rope_scaling.high_freq_factor %g must be above low_freq_factor %g", path,
                p[2], p[1]);
        return ERR_RANGE;
    }
    if (hp->head_dim / 2 > IEBIN_MAX_ROPE_PAIRS) {
        LOG_ERR("%s: head_dim %u is above %u", path, hp->head_dim, 2 * IEBIN_MAX_ROPE_PAIRS);
        return ERR_RANGE;
    }
    hp->rope_scaling.type = IEBIN_ROPE_FREQ_FACTORS;
    for (uint32_t i = 0; i < hp->head_dim / 2; i++)
        hp->rope_freq_factors[i] = (float)model_llama3_freq_factor(
            hp->rope_theta, hp->head_dim, i, p[0], p[1], p[2], p[3]);
    return 0;
}

/*
 * The config fields of the dense families (model_type llama, mistral, qwen2) that change what
 * the model computes: Llama 3's rope_scaling, Mistral's sliding_window (every layer), qwen2's
 * q/k/v biases (implied by its model_type). Anything else the engine does not implement is
 * refused by name, never ignored (a model run without its sliding window or its RoPE scaling
 * gives plausible garbage).
 */
static int hf_dense_extras(json_t *cfg, const char *path, const char *mt,
                           struct iebin_hparams *hp)
{
    const bool qwen2 = !strcmp(mt, "qwen2"), mistral = !strcmp(mt, "mistral");
    int rc = hf_llama3_rope(json_object_get(cfg, "rope_scaling"), path, hp);
    if (rc)
        return rc;
    hp->attn_qkv_bias = qwen2; /* Qwen2Attention: q/k/v with bias, o without */
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof no_bias / sizeof no_bias[0]; i++) {
        if (json_is_true(json_object_get(cfg, no_bias[i]))) {
            LOG_ERR("%s: %s is true; biases are not supported for %s", path, no_bias[i], mt);
            return ERR_UNSUPPORTED;
        }
    }
    /* qwen2 states a sliding_window it does not use unless use_sliding_window (whose layer
     * rule, max_window_layers, is not implemented); mistral slides every layer when it has
     * one; llama has none */
    json_t *use = json_object_get(cfg, "use_sliding_window");
    if (json_is_true(use)) {
        LOG_ERR("%s: use_sliding_window is true; %s's sliding-window layers (max_window_layers) "
                "are not implemented",
                path, mt);
        return ERR_UNSUPPORTED;
    }
    json_t *sw = json_object_get(cfg, "sliding_window");
    if (sw && !json_is_null(sw) && !qwen2) {
        if (!mistral) {
            LOG_ERR("%s: sliding_window is set; sliding-window attention is not implemented for "
                    "%s (it is for mistral)",
                    path, mt);
            return ERR_UNSUPPORTED;
        }
        if ((rc = json_u32(cfg, path, "sliding_window", &hp->sliding_window, true, 0)))
            return rc;
        if (hp->n_layers > 1024) {
            LOG_ERR("%s: num_hidden_layers %u is above 1024", path, hp->n_layers);
            return ERR_RANGE;
        }
        iebin_slide_all(hp);
    }
    json_t *lt = json_object_get(cfg, "layer_types"), *e;
    size_t i;
    const char *want = hp->sliding_window ? "sliding_attention" : "full_attention";
    json_array_foreach(lt, i, e) {
        if (!json_is_string(e) || strcmp(json_string_value(e), want) != 0) {
            LOG_ERR("%s: layer_types[%zu] is not \"%s\"; %s layers are all %s", path, i, want,
                    mt, hp->sliding_window ? "sliding (sliding_window)" : "full attention");
            return ERR_UNSUPPORTED;
        }
    }
    json_t *prf = json_object_get(cfg, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && !(json_is_number(prf) && json_number_value(prf) == 1.0)) {
        LOG_ERR("%s: partial_rotary_factor is not 1; partial RoPE is not implemented", path);
        return ERR_UNSUPPORTED;
    }
    static const char *const no_experts[] = {"num_local_experts", "num_experts"};
    for (i = 0; i < sizeof no_experts / sizeof no_experts[0]; i++) {
        json_t *v = json_object_get(cfg, no_experts[i]);
        if (json_is_integer(v) && json_integer_value(v) > 0) {
            LOG_ERR("%s: %s is set; mixture-of-experts %s models are not supported", path,
                    no_experts[i], mt);
            return ERR_UNSUPPORTED;
        }
    }
    return 0;
}

/*
 * gpt_oss's rope_scaling (spec §1a): rope_type (or type) "yarn"; factor and
 * original_max_position_embeddings required; beta_fast/beta_slow default to HF's 32/1 and
 * truncate to HF's true (HF truncates unless told not to; gpt-oss-20b's config says false).
 * Any other key (mscale, attention_factor, ...) is a parameter the engine would ignore:
 * refused by name.
 */
static int hf_rope_scaling(json_t *rs, const char *path, struct iebin_rope_scaling *out)
{
    static const char *const known[] = {"rope_type", "type", "factor", "beta_fast", "beta_slow",
                                        "original_max_position_embeddings", "truncate"};
    if (!json_is_object(rs)) {
        LOG_ERR("%s: rope_scaling is %s; gpt_oss needs a YaRN object", path,
                rs ? "not an object" : "missing");
        return rs ? ERR_FORMAT : ERR_UNSUPPORTED;
    }
    const char *key;
    json_t *v;
    json_object_foreach(rs, key, v) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok) {
            LOG_ERR("%s: rope_scaling.%s is not implemented (known: rope_type, factor, "
                    "beta_fast, beta_slow, original_max_position_embeddings, truncate)",
                    path, key);
            return ERR_UNSUPPORTED;
        }
    }
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty)
        ty = json_object_get(rs, "type");
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "yarn") != 0) {
        LOG_ERR("%s: rope_scaling.rope_type %s is not supported (only \"yarn\")", path,
                json_is_string(ty) ? json_string_value(ty) : "(missing)");
        return ERR_UNSUPPORTED;
    }
    out->type = IEBIN_ROPE_YARN;
    int rc;
    if (!json_object_get(rs, "factor")) {
        LOG_ERR("%s: missing key 'rope_scaling.factor'", path);
        return ERR_FORMAT;
    }
    if ((rc = json_f32(rs, path, "factor", &out->factor, 0.0f)) ||
        (rc = json_f32(rs, path, "beta_fast", &out->beta_fast, 32.0f)) ||
        (rc = json_f32(rs, path, "beta_slow", &out->beta_slow, 1.0f)))
        return rc;
    if (!json_object_get(rs, "original_max_position_embeddings")) {
        LOG_ERR("%s: missing key 'rope_scaling.original_max_position_embeddings'", path);
        return ERR_FORMAT;
    }
    if ((rc = json_u32(rs, path, "original_max_position_embeddings",
                       &out->original_max_position_embeddings, true, 0)))
        return rc;
    json_t *tr = json_object_get(rs, "truncate");
    if (tr && !json_is_null(tr) && !json_is_boolean(tr)) {
        LOG_ERR("%s: 'rope_scaling.truncate' must be true or false", path);
        return ERR_FORMAT;
    }
    out->truncate = !tr || json_is_null(tr) || json_is_true(tr);
    return 0;
}

/* The gpt_oss fields of config.json (spec §1a) into hp. */
static int hf_gpt_oss_hparams(json_t *cfg, const char *path, struct iebin_hparams *hp)
{
    int rc;
    uint32_t per_tok = 0, ept = 0;
    if ((rc = json_u32(cfg, path, "num_local_experts", &hp->n_experts, true, 0)) ||
        (rc = json_u32(cfg, path, "num_experts_per_tok", &per_tok, false, 0)) ||
        (rc = json_u32(cfg, path, "experts_per_token", &ept, false, 0)) ||
        (rc = json_u32(cfg, path, "sliding_window", &hp->sliding_window, true, 0)))
        return rc;
    if (per_tok && ept && per_tok != ept) {
        LOG_ERR("%s: num_experts_per_tok %u and experts_per_token %u disagree", path, per_tok,
                ept);
        return ERR_FORMAT;
    }
    hp->n_experts_used = per_tok ? per_tok : ept;
    if (!hp->n_experts_used) {
        LOG_ERR("%s: missing key 'num_experts_per_tok'", path);
        return ERR_FORMAT;
    }
    if (hp->n_experts_used > hp->n_experts) {
        LOG_ERR("%s: %s %u is above num_local_experts %u", path,
                per_tok ? "num_experts_per_tok" : "experts_per_token", hp->n_experts_used,
                hp->n_experts);
        return ERR_RANGE;
    }
    if (hp->n_layers > 1024) {
        LOG_ERR("%s: num_hidden_layers %u is above 1024", path, hp->n_layers);
        return ERR_RANGE;
    }
    json_t *lt = json_object_get(cfg, "layer_types");
    if (!lt || json_is_null(lt)) { /* HF's default: even layers slide */
        for (uint32_t l = 0; l < hp->n_layers; l += 2)
            hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
    } else if (!json_is_array(lt) || json_array_size(lt) != hp->n_layers) {
        LOG_ERR("%s: layer_types must be an array of num_hidden_layers (%u) strings", path,
                hp->n_layers);
        return ERR_FORMAT;
    } else {
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            json_t *e = json_array_get(lt, l);
            const char *ty = json_is_string(e) ? json_string_value(e) : "(not a string)";
            if (!strcmp(ty, "sliding_attention")) {
                hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
            } else if (strcmp(ty, "full_attention") != 0) {
                LOG_ERR("%s: layer_types[%u] is \"%.64s\": unknown layer type (known: "
                        "sliding_attention, full_attention)",
                        path, l, ty);
                return ERR_UNSUPPORTED;
            }
        }
    }
    if ((rc = hf_rope_scaling(json_object_get(cfg, "rope_scaling"), path, &hp->rope_scaling)) ||
        (rc = json_f32(cfg, path, "swiglu_limit", &hp->swiglu_limit, 7.0f)))
        return rc;
    hp->swiglu_alpha = 1.702f; /* not a config field: HF and OpenAI hard-code it */
    json_t *ab = json_object_get(cfg, "attention_bias");
    if (ab && !json_is_null(ab) && !json_is_true(ab)) {
        LOG_ERR("%s: attention_bias is not true; gpt_oss without attention biases is not "
                "implemented",
                path);
        return ERR_UNSUPPORTED;
    }
    json_t *qc = json_object_get(cfg, "quantization_config");
    if (qc && !json_is_null(qc)) {
        json_t *qm = json_object_get(qc, "quant_method");
        if (!json_is_string(qm) || strcmp(json_string_value(qm), "mxfp4") != 0) {
            LOG_ERR("%s: quantization_config.quant_method %s is not supported (only \"mxfp4\")",
                    path, json_is_string(qm) ? json_string_value(qm) : "(missing)");
            return ERR_UNSUPPORTED;
        }
    }
    return 0;
}

/* config.json's document (cfg) into hp; path names it in messages. */
static int hf_hparams_doc(json_t *cfg, const char *path, struct iebin_hparams *hp,
                          bool *tie_given)
{
    int rc = ERR_FORMAT;
    if (!json_is_object(cfg)) {
        LOG_ERR("%s: not a JSON object", path);
        goto out;
    }
    json_t *mtj = json_object_get(cfg, "model_type");
    const char *mt = json_is_string(mtj) ? json_string_value(mtj) : "(missing)";
    bool moe = strcmp(mt, "gpt_oss") == 0;
    if (!moe && strcmp(mt, "llama") != 0 && strcmp(mt, "mistral") != 0 &&
        strcmp(mt, "qwen2") != 0) {
        LOG_ERR("%s: model_type %s is not supported (known: llama, mistral, qwen2, gpt_oss)",
                path, mt);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    json_t *act = json_object_get(cfg, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        LOG_ERR("%s: hidden_act %s is not supported (only \"silu\")", path,
                json_is_string(act) ? json_string_value(act) : "(not a string)");
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    memset(hp, 0, sizeof *hp);
    if ((rc = json_u32(cfg, path, "hidden_size", &hp->dim, true, 0)) ||
        (rc = json_u32(cfg, path, "intermediate_size", &hp->ffn_dim, true, 0)) ||
        (rc = json_u32(cfg, path, "num_hidden_layers", &hp->n_layers, true, 0)) ||
        (rc = json_u32(cfg, path, "num_attention_heads", &hp->n_heads, true, 0)) ||
        (rc = json_u32(cfg, path, "vocab_size", &hp->vocab_size, true, 0)) ||
        (rc = json_u32(cfg, path, "num_key_value_heads", &hp->n_kv_heads, false, hp->n_heads)) ||
        (rc = json_u32(cfg, path, "max_position_embeddings", &hp->max_seq_len, false, 2048)) ||
        (rc = json_f32(cfg, path, "rope_theta", &hp->rope_theta, 10000.0f)) ||
        (rc = json_f32(cfg, path, "rms_norm_eps", &hp->rms_eps, moe ? 1e-5f : 1e-6f)))
        goto out;
    /* head_dim is explicit in newer configs (and may differ from hidden_size / heads) */
    if ((rc = json_u32(cfg, path, "head_dim", &hp->head_dim, false, 0)) != 0)
        goto out;
    if (!hp->head_dim) {
        if (hp->dim % hp->n_heads != 0) {
            LOG_ERR("%s: hidden_size %u is not a multiple of num_attention_heads %u", path,
                    hp->dim, hp->n_heads);
            rc = ERR_FORMAT;
            goto out;
        }
        hp->head_dim = hp->dim / hp->n_heads;
    }
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie)) {
        LOG_ERR("%s: 'tie_word_embeddings' must be true or false", path);
        rc = ERR_FORMAT;
        goto out;
    }
    hp->tied_embeddings = json_is_true(tie);
    *tie_given = tie && json_is_boolean(tie);
    if (moe ? (rc = hf_gpt_oss_hparams(cfg, path, hp)) != 0
            : (rc = hf_dense_extras(cfg, path, mt, hp)) != 0)
        goto out;
    rc = iebin_check_hparams(hp, path);
out:
    return rc;
}

static int hf_hparams(const char *dir, struct iebin_hparams *hp, bool *tie_given)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        int e = errno;
        LOG_ERR("%s: %s", dir, strerror(e));
        return -e;
    }
    if (!S_ISDIR(sb.st_mode)) {
        LOG_ERR("%s: not a directory (a Hugging Face model is a directory with config.json)",
                dir);
        return ERR_UNSUPPORTED; /* an input problem (exit 3), unlike an output ENOTDIR */
    }
    if (access(path, R_OK) != 0) {
        int e = errno;
        LOG_ERR("cannot read %s: %s", path, strerror(e));
        return -e;
    }
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!cfg) {
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", path, je.line, je.column, je.text);
        return ERR_FORMAT;
    }
    int rc = hf_hparams_doc(cfg, path, hp, tie_given);
    json_decref(cfg);
    return rc;
}

int convert_hf_config_mem(const char *text, size_t len, const char *what,
                          struct iebin_hparams *hp)
{
    json_error_t je;
    json_t *cfg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!cfg) {
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", what, je.line, je.column, je.text);
        return ERR_FORMAT;
    }
    bool tie_given;
    int rc = hf_hparams_doc(cfg, what, hp, &tie_given);
    json_decref(cfg);
    return rc;
}

/* The first (by name) *.tiktoken file in dir, if any. */
static bool find_tiktoken(const char *dir, char *out, size_t cap)
{
    struct dirent **list;
    int n = scandir(dir, &list, NULL, alphasort);
    bool found = false;
    for (int i = 0; i < n; i++) {
        if (!found && ends_with(list[i]->d_name, ".tiktoken")) {
            snprintf(out, cap, "%s/%s", dir, list[i]->d_name);
            found = true;
        }
        free(list[i]);
    }
    if (n >= 0)
        free(list);
    return found;
}

static int convert_hf(const char *dir, const char *out_dir, const struct convert_opts *o,
                      struct progress *pg)
{
    struct iebin_hparams hp;
    bool tie_given = false;
    int rc = hf_hparams(dir, &hp, &tie_given);
    if (rc)
        return rc;
    struct hf_src s = {.dir = dir, .hp = &hp};
    char p[4200], idx[4200], pt[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    snprintf(pt, sizeof pt, "%s/pytorch_model.bin", dir);
    if (access(p, F_OK) != 0 && access(idx, F_OK) != 0 && access(pt, F_OK) == 0) {
        LOG_ERR("%s: only PyTorch pickle weights (pytorch_model.bin); convert them to "
                "safetensors first", dir);
        return ERR_UNSUPPORTED;
    }
    rc = safetensors_set_open(dir, &s.set);
    if (rc)
        return rc;
    /* transformers' default is untied, but a config that does not say and has no lm_head
     * can only mean tied; an explicit false with no lm_head is a missing tensor (walk) */
    if (!tie_given && !safetensors_set_find(s.set, "lm_head.weight"))
        hp.tied_embeddings = true;
    if (!hp.n_experts && (rc = hf_refuse_biases(&s, hp.attn_qkv_bias)) != 0) /* gpt_oss: all */
        goto out;
    const char *tok_path = o->tokenizer;
    char tp[4096];
    if (!tok_path) {
        snprintf(tp, sizeof tp, "%s/tokenizer.model", dir);
        if (access(tp, R_OK) != 0)
            snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
        if (access(tp, R_OK) == 0)
            tok_path = tp;
        else if (find_tiktoken(dir, tp, sizeof tp)) /* a rank file (synth --tokenizer) */
            tok_path = tp;
    }
    char nb[4096];
    rc = write_model(&s, hf_lookup, dir, out_dir, base_name(dir, nb, sizeof nb), &hp, tok_path, o,
                     true, pg);
out:
    safetensors_set_close(s.set);
    return rc;
}

/* ---- GGUF ---- */

struct gguf_src {
    struct gguf_file *f;
    const char *path;
    bool moe; /* gpt-oss: its FFN norm is post_attention_norm */
};

static int gguf_lookup(void *p, const char *kind, int layer, struct src_tensor *out)
{
    struct gguf_src *s = p;
    static const struct {
        const char *kind, *g;
    } map[] = {{IEBIN_T_TOK_EMBD, "token_embd.weight"},
               {IEBIN_T_OUTPUT_NORM, "output_norm.weight"},
               {IEBIN_T_OUTPUT, "output.weight"},
               {IEBIN_T_ATTN_NORM, "attn_norm.weight"},
               {IEBIN_T_ATTN_Q, "attn_q.weight"},
               {IEBIN_T_ATTN_K, "attn_k.weight"},
               {IEBIN_T_ATTN_V, "attn_v.weight"},
               {IEBIN_T_ATTN_O, "attn_output.weight"},
               {IEBIN_T_FFN_NORM, "ffn_norm.weight"},
               {IEBIN_T_FFN_GATE, "ffn_gate.weight"},
               {IEBIN_T_FFN_UP, "ffn_up.weight"},
               {IEBIN_T_FFN_DOWN, "ffn_down.weight"},
               /* gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE names) */
               {IEBIN_T_ATTN_Q_BIAS, "attn_q.bias"},
               {IEBIN_T_ATTN_K_BIAS, "attn_k.bias"},
               {IEBIN_T_ATTN_V_BIAS, "attn_v.bias"},
               {IEBIN_T_ATTN_O_BIAS, "attn_output.bias"},
               {IEBIN_T_ATTN_SINKS, "attn_sinks.weight"},
               {IEBIN_T_FFN_ROUTER, "ffn_gate_inp.weight"},
               {IEBIN_T_FFN_ROUTER_BIAS, "ffn_gate_inp.bias"},
               {IEBIN_T_FFN_GATE_EXPS, "ffn_gate_exps.weight"},
               {IEBIN_T_FFN_GATE_EXPS_BIAS, "ffn_gate_exps.bias"},
               {IEBIN_T_FFN_UP_EXPS, "ffn_up_exps.weight"},
               {IEBIN_T_FFN_UP_EXPS_BIAS, "ffn_up_exps.bias"},
               {IEBIN_T_FFN_DOWN_EXPS, "ffn_down_exps.weight"},
               {IEBIN_T_FFN_DOWN_EXPS_BIAS, "ffn_down_exps.bias"}};
    const char *g = NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].kind, kind))
            g = map[i].g;
    if (s->moe && !strcmp(kind, IEBIN_T_FFN_NORM))
        g = "post_attention_norm.weight";
    char *name = out->name;
    if (layer < 0)
        snprintf(name, sizeof out->name, "%s", g);
    else
        snprintf(name, sizeof out->name, "blk.%d.%s", layer, g);
    const struct gguf_tensor *t = gguf_find_tensor(s->f, name);
    int fused = 0; /* llama.cpp's --fuse-gate-up-exps: ffn_gate_up_exps, gate rows first */
    if (!t && s->moe && (!strcmp(kind, IEBIN_T_FFN_GATE_EXPS) || !strcmp(kind, IEBIN_T_FFN_UP_EXPS) ||
                         !strcmp(kind, IEBIN_T_FFN_GATE_EXPS_BIAS) ||
                         !strcmp(kind, IEBIN_T_FFN_UP_EXPS_BIAS))) {
        char fn[sizeof out->name];
        snprintf(fn, sizeof fn, "blk.%d.ffn_gate_up_exps.%s", layer,
                 ends_with(kind, "_bias") ? "bias" : "weight");
        if ((t = gguf_find_tensor(s->f, fn)) != NULL) {
            fused = strncmp(kind, "ffn_gate", 8) == 0 ? 3 : 4;
            snprintf(name, sizeof out->name, "%s", fn);
        }
    }
    if (!t) {
        LOG_ERR("%s: tensor '%s' is missing", s->path, name);
        return ERR_NOT_FOUND;
    }
    if (!t->data || gguf_ggml_type_to_dtype(t->type, &out->dtype) != 0) {
        LOG_ERR("%s: tensor '%s' has type %s; F32, F16, BF16, Q8_0, Q4_0, MXFP4, Q4_K, Q5_K and Q6_K are "
                "supported",
                s->path, name, gguf_ggml_type_name(t->type));
        return ERR_UNSUPPORTED;
    }
    out->n_dims = (int)t->n_dims;
    for (uint32_t i = 0; i < t->n_dims; i++) /* GGUF lists dimensions innermost first */
        out->shape[i] = t->ne[t->n_dims - 1 - i];
    out->data = t->data;
    if ((out->deint = fused) != 0) { /* [E][2F]([D]): halve the per-expert dimension */
        int d = ends_with(kind, "_bias") ? out->n_dims - 1 : out->n_dims - 2;
        if (d < 0 || out->shape[d] % 2) {
            LOG_ERR("%s: tensor '%s': fused gate/up needs an even dimension %d", s->path, name,
                    d);
            return ERR_MISMATCH;
        }
        out->shape[d] /= 2;
    }
    return 0;
}

/* Optional keys: 0 with *present telling whether it is there; a mistyped value is the
 * getter's (logged) error rather than a silent default. */
static int opt_u32(struct gguf_file *f, const char *key, uint32_t *v, bool *present)
{
    int rc = gguf_get_u32(f, key, v);
    *present = rc == 0;
    return rc == ERR_NOT_FOUND ? 0 : rc;
}

static int opt_f64(struct gguf_file *f, const char *key, double *v, bool *present)
{
    int rc = gguf_get_f64(f, key, v);
    *present = rc == 0;
    return rc == ERR_NOT_FOUND ? 0 : rc;
}

/* "<arch>.<suffix>" in a static buffer per call site (keys are short). */
static const char *akey(char *buf, size_t cap, const char *arch, const char *suffix)
{
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

/*
 * gpt-oss's keys beyond llama's (llama.cpp's converter, spec §3.3): experts, the sliding window
 * and its period, YaRN. The beta keys default to llama.cpp's own defaults (32, 1), which are
 * gpt-oss's; truncate is false, the architecture's reference value (OpenAI's code never
 * truncates and gpt-oss-20b's config says so), since GGUF has no key for it.
 */
static int gguf_gpt_oss_hparams(struct gguf_file *f, const char *path, const char *arch,
                                struct iebin_hparams *hp)
{
    char k[128];
    bool has;
    int rc;
    static const struct {
        const char *key;
        size_t off;
    } req[] = {
        {"expert_count", offsetof(struct iebin_hparams, n_experts)},
        {"expert_used_count", offsetof(struct iebin_hparams, n_experts_used)},
        {"expert_feed_forward_length", offsetof(struct iebin_hparams, ffn_dim)},
        {"attention.sliding_window", offsetof(struct iebin_hparams, sliding_window)},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        if ((rc = opt_u32(f, akey(k, sizeof k, arch, req[i].key),
                          (uint32_t *)((char *)hp + req[i].off), &has)) != 0)
            return rc;
        if (!has) {
            LOG_ERR("%s: key %s is missing", path, k);
            return ERR_FORMAT;
        }
    }
    if (hp->n_experts_used > hp->n_experts) {
        LOG_ERR("%s: %s.expert_used_count %u is above %s.expert_count %u", path, arch,
                hp->n_experts_used, arch, hp->n_experts);
        return ERR_RANGE;
    }
    /* the sliding layers: a period p (llama.cpp's set_swa_pattern: layer l slides iff
     * l % p < p - 1; default 2, even layers) or one bool per layer */
    const struct gguf_kv *pat = gguf_find_kv(f, akey(k, sizeof k, arch,
                                                     "attention.sliding_window_pattern"));
    if (hp->n_layers > 1024) {
        LOG_ERR("%s: %s.block_count %u is above 1024", path, arch, hp->n_layers);
        return ERR_RANGE;
    }
    if (pat && pat->type == GGUF_TYPE_ARRAY) {
        if (pat->arr_n != hp->n_layers) {
            LOG_ERR("%s: key %s has %llu entries, not block_count %u", path, k,
                    (unsigned long long)pat->arr_n, hp->n_layers);
            return ERR_FORMAT;
        }
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            int64_t v;
            if ((rc = gguf_arr_i64(pat, l, &v)) != 0)
                return rc;
            if (v)
                hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
        }
    } else {
        uint32_t period = 2;
        if ((rc = opt_u32(f, k, &period, &has)) != 0)
            return rc;
        for (uint32_t l = 0; l < hp->n_layers; l++)
            if (period == 0 || l % period < period - 1)
                hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
    }
    double d;
    if ((rc = opt_f64(f, akey(k, sizeof k, arch, "rope.freq_base_swa"), &d, &has)) != 0)
        return rc;
    if (has && (float)d != hp->rope_theta) {
        LOG_ERR("%s: key %s is %g, not rope.freq_base %g: a separate RoPE base for sliding "
                "layers is not implemented",
                path, k, d, (double)hp->rope_theta);
        return ERR_UNSUPPORTED;
    }
    struct gguf_str st;
    rc = gguf_get_str(f, akey(k, sizeof k, arch, "rope.scaling.type"), &st);
    if (rc == ERR_NOT_FOUND) {
        LOG_ERR("%s: key %s is missing (gpt-oss needs YaRN)", path, k);
        return ERR_FORMAT;
    }
    if (rc)
        return rc;
    if (!gguf_str_eq(st, "yarn")) {
        LOG_ERR("%s: %s is %.*s; gpt-oss needs yarn", path, k, (int)(st.len > 32 ? 32 : st.len),
                st.ptr);
        return ERR_UNSUPPORTED;
    }
    struct iebin_rope_scaling *rs = &hp->rope_scaling;
    rs->type = IEBIN_ROPE_YARN;
    rs->truncate = false;
    static const struct {
        const char *key;
        size_t off;
        bool required;
        float dflt;
    } yarn[] = {
        {"rope.scaling.factor", offsetof(struct iebin_rope_scaling, factor), true, 0.0f},
        {"rope.scaling.yarn_beta_fast", offsetof(struct iebin_rope_scaling, beta_fast), false,
         32.0f},
        {"rope.scaling.yarn_beta_slow", offsetof(struct iebin_rope_scaling, beta_slow), false,
         1.0f},
    };
    for (size_t i = 0; i < sizeof yarn / sizeof yarn[0]; i++) {
        if ((rc = opt_f64(f, akey(k, sizeof k, arch, yarn[i].key), &d, &has)) != 0)
            return rc;
        if (!has && yarn[i].required) {
            LOG_ERR("%s: key %s is missing", path, k);
            return ERR_FORMAT;
        }
        float v = has ? (float)d : yarn[i].dflt;
        memcpy((char *)rs + yarn[i].off, &v, sizeof v);
    }
    if ((rc = opt_u32(f, akey(k, sizeof k, arch, "rope.scaling.original_context_length"),
                      &rs->original_max_position_embeddings, &has)) != 0)
        return rc;
    if (!has) {
        LOG_ERR("%s: key %s is missing", path, k);
        return ERR_FORMAT;
    }
    /* YaRN parameters the engine does not implement: refused, not ignored */
    static const char *const unsupported[] = {"rope.scaling.yarn_ext_factor",
                                              "rope.scaling.yarn_attn_factor",
                                              "rope.scaling.yarn_log_multiplier"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (gguf_find_kv(f, akey(k, sizeof k, arch, unsupported[i]))) {
            LOG_ERR("%s: key %s is not implemented (gpt-oss's YaRN uses the default)", path, k);
            return ERR_UNSUPPORTED;
        }
    /* llama.cpp hard-codes gpt-oss's clamped SwiGLU (ggml_swiglu_oai(x, 1.702, 7.0)) */
    hp->swiglu_alpha = 1.702f;
    hp->swiglu_limit = 7.0f;
    return 0;
}

/*
 * The dense families' keys beyond the basics (llama, qwen2): no experts, no RoPE scaling type
 * or linear scale, a window on every layer (attention.sliding_window: Mistral, llama only),
 * and Llama 3's scaling as llama.cpp stores it, the tensor rope_freqs.weight (F32
 * [head_dim/2]: pair i's frequency is divided by element i). Called once head_dim is known.
 */
static int gguf_dense_hparams(struct gguf_file *f, const char *path, const char *arch,
                              struct iebin_hparams *hp)
{
    char k[128];
    bool has;
    uint32_t u;
    double d;
    int rc;
    /* Mixture-of-experts models (Mixtral) also call themselves "llama" */
    if ((rc = opt_u32(f, akey(k, sizeof k, arch, "expert_count"), &u, &has)) != 0)
        return rc;
    if (has && u > 0) {
        LOG_ERR("%s: %s is %u; mixture-of-experts models are not supported", path, k, u);
        return ERR_UNSUPPORTED;
    }
    struct gguf_str st;
    rc = gguf_get_str(f, akey(k, sizeof k, arch, "rope.scaling.type"), &st);
    if (rc != 0 && rc != ERR_NOT_FOUND)
        return rc;
    if (rc == 0 && !gguf_str_eq(st, "none")) {
        LOG_ERR("%s: %s is %.*s; only plain RoPE and Llama 3's rope_freqs are supported", path,
                k, (int)(st.len > 32 ? 32 : st.len), st.ptr);
        return ERR_UNSUPPORTED;
    }
    if ((rc = opt_f64(f, akey(k, sizeof k, arch, "rope.scale_linear"), &d, &has)) != 0)
        return rc;
    if (has && d != 1.0) {
        LOG_ERR("%s: %s is %g; only plain RoPE and Llama 3's rope_freqs are supported", path, k,
                d);
        return ERR_UNSUPPORTED;
    }
    if ((rc = opt_u32(f, akey(k, sizeof k, arch, "attention.sliding_window"), &u, &has)) != 0)
        return rc;
    if (has) {
        if (strcmp(arch, "llama") != 0 || u == 0 || hp->n_layers > 1024) {
            LOG_ERR("%s: %s is %u; sliding-window attention is implemented for llama (Mistral: "
                    "every layer, a window >= 1) only",
                    path, k, u);
            return ERR_UNSUPPORTED;
        }
        hp->sliding_window = u;
        iebin_slide_all(hp);
    }
    const struct gguf_tensor *rf = gguf_find_tensor(f, "rope_freqs.weight");
    if (!rf)
        return 0;
    if (rf->type != GGUF_GGML_F32 || !rf->data || rf->n_dims != 1 ||
        rf->ne[0] != hp->head_dim / 2 || hp->head_dim / 2 > IEBIN_MAX_ROPE_PAIRS) {
        LOG_ERR("%s: tensor 'rope_freqs.weight' is not F32 [head_dim/2 = %u]", path,
                hp->head_dim / 2);
        return ERR_MISMATCH;
    }
    hp->rope_scaling.type = IEBIN_ROPE_FREQ_FACTORS;
    memcpy(hp->rope_freq_factors, rf->data, sizeof(float) * (hp->head_dim / 2));
    return 0;
}

static int gguf_hparams(struct gguf_file *f, const char *path, struct iebin_hparams *hp)
{
    struct gguf_str as = {0, NULL};
    bool moe = false, qwen2 = false;
    if (gguf_get_str(f, "general.architecture", &as) != 0 ||
        !(gguf_str_eq(as, "llama") || (qwen2 = gguf_str_eq(as, "qwen2")) ||
          (moe = gguf_str_eq(as, "gpt-oss")))) {
        LOG_ERR("%s: general.architecture is %.*s; only \"llama\", \"qwen2\" and \"gpt-oss\" "
                "are supported%s",
                path, as.ptr ? (int)(as.len > 64 ? 64 : as.len) : 9,
                as.ptr ? as.ptr : "(missing)",
                as.ptr && gguf_str_eq(as, "gptoss")
                    ? " (\"gptoss\" is Ollama's or a fork's layout, not llama.cpp's)"
                    : "");
        return ERR_UNSUPPORTED;
    }
    const char *arch = moe ? "gpt-oss" : qwen2 ? "qwen2" : "llama";
    char k[128];
    memset(hp, 0, sizeof *hp);
    hp->attn_qkv_bias = qwen2;
    static const struct {
        const char *key;
        size_t off;
        bool required;
    } keys[] = {
        {"embedding_length", offsetof(struct iebin_hparams, dim), true},
        {"feed_forward_length", offsetof(struct iebin_hparams, ffn_dim), true},
        {"block_count", offsetof(struct iebin_hparams, n_layers), true},
        {"attention.head_count", offsetof(struct iebin_hparams, n_heads), true},
        {"attention.head_count_kv", offsetof(struct iebin_hparams, n_kv_heads), false},
        {"context_length", offsetof(struct iebin_hparams, max_seq_len), false},
    };
    bool has;
    int rc;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        bool required = keys[i].required && !(moe && keys[i].off == offsetof(struct iebin_hparams,
                                                                             ffn_dim));
        if ((rc = opt_u32(f, akey(k, sizeof k, arch, keys[i].key),
                          (uint32_t *)((char *)hp + keys[i].off), &has)) != 0)
            return rc;
        if (!has && required) {
            LOG_ERR("%s: key %s is missing", path, k);
            return ERR_FORMAT;
        }
    }
    if (!hp->n_kv_heads)
        hp->n_kv_heads = hp->n_heads;
    if (!hp->max_seq_len)
        hp->max_seq_len = 2048;
    double d;
    if ((rc = opt_f64(f, akey(k, sizeof k, arch, "rope.freq_base"), &d, &has)) != 0)
        return rc;
    hp->rope_theta = has ? (float)d : 10000.0f;
    if ((rc = opt_f64(f, akey(k, sizeof k, arch, "attention.layer_norm_rms_epsilon"), &d,
                      &has)) != 0)
        return rc;
    hp->rms_eps = has ? (float)d : 1e-5f;

    uint32_t u;
    if (moe && (rc = gguf_gpt_oss_hparams(f, path, arch, hp)) != 0)
        return rc;
    /* head_dim: attention.key_length when present (it may differ from dim / heads) */
    if ((rc = opt_u32(f, akey(k, sizeof k, arch, "attention.key_length"), &hp->head_dim, &has)))
        return rc;
    if (!has)
        hp->head_dim = hp->n_heads && hp->dim % hp->n_heads == 0 ? hp->dim / hp->n_heads : 0;
    static const char *const same_as_head_dim[] = {"attention.value_length",
                                                   "rope.dimension_count"};
    for (size_t i = 0; i < 2; i++) {
        if ((rc = opt_u32(f, akey(k, sizeof k, arch, same_as_head_dim[i]), &u, &has)) != 0)
            return rc;
        if (has && u != hp->head_dim) {
            LOG_ERR("%s: %s is %u, not the head dimension %u (partial RoPE and unequal "
                    "key/value heads are not supported)", path, k, u, hp->head_dim);
            return ERR_UNSUPPORTED;
        }
    }
    if (!moe && (rc = gguf_dense_hparams(f, path, arch, hp)) != 0)
        return rc;

    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2) {
        LOG_ERR("%s: tensor 'token_embd.weight' is missing or not 2-D", path);
        return ERR_FORMAT;
    }
    if (emb->ne[1] > UINT32_MAX) {
        LOG_ERR("%s: vocabulary of %llu tokens is too large", path, (unsigned long long)emb->ne[1]);
        return ERR_RANGE;
    }
    hp->vocab_size = (uint32_t)emb->ne[1];
    if ((rc = opt_u32(f, akey(k, sizeof k, arch, "vocab_size"), &u, &has)) != 0)
        return rc;
    if (has && u != hp->vocab_size) {
        LOG_ERR("%s: %s %u does not match token_embd.weight's %u rows", path, k, u,
                hp->vocab_size);
        return ERR_MISMATCH;
    }
    hp->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    return iebin_check_hparams(hp, path);
}

static int convert_gguf(const char *path, const char *out_dir, const struct convert_opts *o,
                        struct progress *pg)
{
    struct gguf_src s = {.path = path};
    int rc = gguf_open(path, &s.f);
    if (rc)
        return rc;
    struct iebin_hparams hp;
    rc = gguf_hparams(s.f, path, &hp);
    s.moe = hp.n_experts != 0;
    if (rc == 0) {
        const char *tok_path = o->tokenizer;
        if (!tok_path && gguf_find_kv(s.f, "tokenizer.ggml.model"))
            tok_path = path;
        char nb[4096];
        /* llama.cpp permutes llama's q/k to interleaved pairs, but keeps gpt-oss's and
         * qwen2's in HF's rotate-half order (it runs them as NEOX RoPE) */
        rc = write_model(&s, gguf_lookup, path, out_dir, base_name(path, nb, sizeof nb), &hp,
                         tok_path, o, s.moe || hp.attn_qkv_bias, pg);
    }
    gguf_close(s.f);
    return rc;
}

/* ---- IEBIN (re-quantization of an existing model) ---- */

static int iebin_lookup(void *p, const char *kind, int layer, struct src_tensor *out)
{
    const struct iebin_model *m = p;
    char name[IEBIN_NAME_MAX];
    if (layer < 0)
        snprintf(name, sizeof name, "%s", kind);
    else
        snprintf(name, sizeof name, "blk.%d.%s", layer, kind);
    const struct iebin_tensor *t = iebin_find(m, name);
    if (!t) {
        LOG_ERR("%s: tensor '%s' is missing", m->dir, name);
        return ERR_NOT_FOUND;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    out->dtype = t->dtype;
    out->n_dims = t->n_dims;
    memcpy(out->shape, t->shape, sizeof(uint64_t) * (size_t)t->n_dims);
    out->data = t->data;
    return 0;
}

static int convert_iebin(const char *dir, const char *out_dir, const struct convert_opts *o,
                         struct progress *pg)
{
    struct iebin_model *m;
    int rc = iebin_open_ex(dir, IEBIN_OPEN_LAZY, &m);
    if (rc)
        return rc;
    const char *tok_path = o->tokenizer ? o->tokenizer : m->tokenizer_path;
    char nb[4096];
    rc = write_model(m, iebin_lookup, dir, out_dir,
                     m->name && *m->name ? m->name : base_name(dir, nb, sizeof nb), &m->hp,
                     tok_path, o, false, pg);
    iebin_close(m);
    return rc;
}

/* ---- llama2.c ---- */

/* Removes a directory this process created and the files in it. */
static void remove_scratch(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4400];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

/*
 * The llama2.c importer (client/llama2c.h) validates the checkpoint against its exact size,
 * then writes float tensors; every failure after that validation is the output's. Block
 * dtypes go through an f32 import in a scratch directory of our own beside OUT_DIR (same
 * file system, never a name the user could own), re-quantized by the IEBIN path.
 */
static int convert_llama2c(const char *path, const char *out_dir, const struct convert_opts *o,
                           struct progress *pg)
{
    char *json = NULL;
    size_t len = 0;
    struct iebin_hparams hp;
    int rc = llama2c_read_hparams(path, &hp);
    if (rc)
        return rc;
    if (o->tokenizer && (rc = tokenizer_json(o->tokenizer, hp.vocab_size, &json, &len)) != 0)
        return rc;
    if ((rc = llama2c_check_weights(path)) != 0) {
        free(json);
        return rc;
    }
    enum dtype dt = o->dtype_set ? o->dtype : DT_F32;
    /* block types, per-tensor dtypes and the embedding's own dtype go through the general
     * walk: import as f32 first, then convert that IEBIN like any other source */
    if (dt == DT_Q8_0 || dt == DT_Q4_0 || dtype_is_q4g(dt) || o->manifest ||
        o->embd_dtype_set) {
        char tmp[4096];
        char *slash;
        snprintf(tmp, sizeof tmp, "%s", out_dir);
        while ((slash = strrchr(tmp, '/')) != NULL && slash[1] == '\0' && slash != tmp)
            *slash = '\0';
        if (strlen(tmp) + sizeof ".import.XXXXXX" > sizeof tmp) {
            LOG_ERR("%s: path too long", out_dir);
            free(json);
            return out_rc(pg, -ENAMETOOLONG);
        }
        strcat(tmp, ".import.XXXXXX");
        if (!mkdtemp(tmp)) {
            rc = -errno;
            LOG_ERR("cannot create a scratch directory %s: %s", tmp, strerror(errno));
            free(json);
            return out_rc(pg, rc);
        }
        rc = out_rc(pg, llama2c_convert(path, json, len, tmp, DT_F32, NULL));
        if (rc == 0) {
            struct convert_opts o2 = *o;
            o2.tokenizer = NULL;
            rc = convert_iebin(tmp, out_dir, &o2, pg);
        }
        remove_scratch(tmp);
        free(json);
        return rc;
    }
    rc = out_rc(pg, llama2c_convert(path, json, len, out_dir, dt, NULL));
    free(json);
    return rc;
}

int convert_detect(const char *src, enum convert_from *out)
{
    struct stat st;
    if (stat(src, &st) != 0) {
        LOG_ERR("%s: %s", src, strerror(errno));
        return -errno;
    }
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/config.json", src);
        if (access(p, R_OK) == 0) {
            *out = CONVERT_HF;
            return 0;
        }
        snprintf(p, sizeof p, "%s/" IEBIN_MANIFEST, src);
        if (access(p, R_OK) == 0) {
            *out = CONVERT_IEBIN;
            return 0;
        }
        LOG_ERR("%s: a directory without config.json or " IEBIN_MANIFEST " is not a model", src);
        return ERR_UNSUPPORTED;
    }
    FILE *f = fopen(src, "rb");
    char magic[4] = {0};
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f)
        fclose(f);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) {
        *out = CONVERT_GGUF;
        return 0;
    }
    struct iebin_hparams hp;
    log_clear_error();
    if (llama2c_read_hparams(src, &hp) == 0) {
        *out = CONVERT_LLAMA2C;
        return 0;
    }
    LOG_ERR("%s: not a Hugging Face directory, a GGUF file or a valid llama2.c checkpoint "
            "(llama2.c: %s)",
            src, log_last_error());
    return ERR_UNSUPPORTED;
}

static int run(const char *src, const char *out_dir, const struct convert_opts *o,
               struct progress *pg)
{
    if (o->dtype_set && o->dtype >= DT_COUNT_) {
        LOG_ERR("--dtype: unknown dtype");
        return ERR_USAGE;
    }
    int rc = kern_init();
    if (rc)
        return rc;
    enum convert_from from = o->from;
    if (from == CONVERT_AUTO && (rc = convert_detect(src, &from)) != 0)
        return rc;
    switch (from) {
    case CONVERT_HF:
        rc = convert_hf(src, out_dir, o, pg);
        break;
    case CONVERT_GGUF:
        rc = convert_gguf(src, out_dir, o, pg);
        break;
    case CONVERT_LLAMA2C: /* a llama2.c checkpoint carries no chat template */
        return convert_llama2c(src, out_dir, o, pg);
    case CONVERT_IEBIN:
        rc = convert_iebin(src, out_dir, o, pg);
        break;
    default:
        return ERR_USAGE;
    }
    /* the chat template and generation defaults travel beside the weights (docs/CHAT.md) */
    return rc ? rc : chat_meta_write(src, out_dir);
}

int convert_model(const char *src, const char *out_dir, const struct convert_opts *o,
                  enum convert_fault *fault)
{
    struct progress pg = {.on = o->progress, .fn = o->on_tensor, .arg = o->on_tensor_arg};
    int rc = run(src, out_dir, o, &pg);
    /* a rule that matched nothing is almost always a typo in its pattern */
    for (size_t i = 0; rc == 0 && i < qm_rule_count(o->manifest); i++)
        if (qm_rule_hits(o->manifest, i) == 0)
            LOG_WARN("quant manifest: rules[%zu] (pattern '%s') matched no tensor", i,
                     qm_rule_pattern(o->manifest, i));
    if (fault)
        *fault = rc == 0 ? CONVERT_FAULT_NONE
                 : pg.out_failed ? CONVERT_FAULT_OUTPUT
                 : CONVERT_FAULT_SOURCE;
    return rc;
}
