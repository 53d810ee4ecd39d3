/*
 * iebin_write.c — IEBIN v1 writer: streams tensors into a temporary blob, then commits the
 * model so that no failure leaves a directory that loads as a half-written model (iebin.h,
 * docs/IEBIN.md "Writing").
 *
 * Tensors are checked against the architecture as they are begun (a converter learns about a
 * wrong shape before streaming gigabytes), and the finished manifest is validated by the
 * reader's own code (iebin_check_manifest) before anything under a final name is touched.
 *
 * NOTES: a writer is used by one thread. It owns up to three temporaries (blob, tokenizer,
 * manifest), removed on every failure path. Old files replaced by rename stay valid for
 * processes that still map them (their inodes live on), which is why nothing is ever rewritten
 * in place.
 */
#include "iebin.h"

#include "afile.h"
#include "err.h"
#include "log.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct iebin_writer {
    char *dir;
    char *blob_path;     /* <dir>/model.ie.bin: also the label of tensor messages */
    char *manifest_path; /* <dir>/model.ie.json */
    char *tok_path;      /* <dir>/tokenizer.ie.json */
    char arch[32];
    char *name;
    struct iebin_hparams hp;
    struct afile blob;
    struct afile tok;
    bool has_tok;
    struct iebin_tensor *tensors; /* records (data == NULL) */
    size_t n_tensors, cap_tensors;
    bool in_tensor;      /* between begin and end: tensors[n_tensors-1] is being streamed */
    uint64_t remaining;  /* bytes the current tensor still needs */
    int err;             /* first failure, sticky */
};

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        LOG_ERR("fsync of directory %s failed: %s", dir, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    close(fd);
    return 0;
}

static void writer_free(struct iebin_writer *w)
{
    afile_abort(&w->blob);
    if (w->has_tok)
        afile_abort(&w->tok);
    free(w->dir);
    free(w->blob_path);
    free(w->manifest_path);
    free(w->tok_path);
    free(w->name);
    free(w->tensors);
    free(w);
}

void iebin_writer_abort(struct iebin_writer *w)
{
    if (w)
        writer_free(w);
}

int iebin_writer_create(const char *dir, const char *arch, const char *name,
                        const struct iebin_hparams *hp, struct iebin_writer **out)
{
    int rc;
    *out = NULL;
    if (!*dir) {
        LOG_ERR("iebin writer: the output directory name is empty");
        return -EINVAL;
    }
    if (strcmp(arch, "gpt_oss") != 0 && strcmp(arch, "llama") != 0 &&
        strcmp(arch, "qwen2") != 0) {
        LOG_ERR("%s: architecture '%s' is not supported (known: llama, qwen2, gpt_oss)", dir,
                arch);
        return ERR_UNSUPPORTED;
    }
    if (strcmp(arch, iebin_arch_of(hp)) != 0) { /* n_experts, attn_qkv_bias tell them apart */
        LOG_ERR("%s: architecture %s with hyper-parameters of %s (n_experts %u, attn_qkv_bias "
                "%d)",
                dir, arch, iebin_arch_of(hp), hp->n_experts, (int)hp->attn_qkv_bias);
        return ERR_MISMATCH;
    }
    struct iebin_writer *w = calloc(1, sizeof *w);
    if (!w) {
        LOG_ERR("%s: out of memory", dir);
        return -ENOMEM;
    }
    w->blob.fd = -1;
    w->tok.fd = -1;
    w->dir = strdup(dir);
    w->blob_path = path_join(dir, IEBIN_BLOB);
    w->manifest_path = path_join(dir, IEBIN_MANIFEST);
    w->tok_path = path_join(dir, IEBIN_TOKENIZER);
    w->name = strdup(name ? name : "");
    if (!w->dir || !w->blob_path || !w->manifest_path || !w->tok_path || !w->name) {
        LOG_ERR("%s: out of memory", dir);
        rc = -ENOMEM;
        goto fail;
    }
    snprintf(w->arch, sizeof w->arch, "%s", arch);
    w->hp = *hp;
    if ((rc = iebin_check_hparams(hp, w->manifest_path)) != 0)
        goto fail;
    if ((rc = path_mkdir_p(dir)) != 0)
        goto fail;
    if ((rc = afile_open(&w->blob, w->blob_path)) != 0)
        goto fail;
    *out = w;
    return 0;
fail:
    writer_free(w);
    return rc;
}

/* Latches the first failure: later calls return it without doing anything. */
static int fail(struct iebin_writer *w, int rc)
{
    if (w->err == 0)
        w->err = rc;
    return rc;
}

int iebin_writer_begin(struct iebin_writer *w, const char *name, enum dtype dt,
                       const uint64_t *shape, int n_dims)
{
    int rc;
    if (w->err)
        return w->err;
    if (w->in_tensor) {
        LOG_ERR("%s: tensor '%s' begun while '%s' is still being written", w->blob_path, name,
                w->tensors[w->n_tensors - 1].name);
        return fail(w, ERR_STATE);
    }
    const struct dtype_info *di = dtype_info(dt);
    if (!di) {
        LOG_ERR("%s: tensor '%s': dtype %d is unknown", w->blob_path, name, (int)dt);
        return fail(w, ERR_UNSUPPORTED);
    }
    if (n_dims < 1 || n_dims > IEBIN_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': %d dimensions, must be 1..%d", w->blob_path, name, n_dims,
                IEBIN_MAX_DIMS);
        return fail(w, ERR_FORMAT);
    }
    if ((rc = iebin_check_tensor(w->blob_path, w->arch, &w->hp, name, dt, shape, n_dims)) != 0)
        return fail(w, rc);
    uint64_t size;
    if ((rc = dtype_tensor_bytes(dt, shape, n_dims, &size)) != 0) {
        if (rc == ERR_FORMAT)
            LOG_ERR("%s: tensor '%s': rows of %llu elements are not a whole number of %s "
                    "blocks (%u)",
                    w->blob_path, name, (unsigned long long)shape[n_dims - 1], di->name,
                    di->block);
        else
            LOG_ERR("%s: tensor '%s': its %s byte size is invalid (%s)", w->blob_path, name,
                    di->name, err_str(rc));
        return fail(w, rc);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            LOG_ERR("%s: tensor '%s' written twice (duplicate name)", w->blob_path, name);
            return fail(w, ERR_FORMAT);
        }
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        struct iebin_tensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) {
            LOG_ERR("%s: out of memory", w->blob_path);
            return fail(w, -ENOMEM);
        }
        w->tensors = t;
        w->cap_tensors = cap;
    }
    if ((rc = afile_pad(&w->blob, IEBIN_ALIGN)) != 0)
        return fail(w, rc);
    struct iebin_tensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name); /* fits: the architecture knows it */
    t->dtype = dt;
    t->n_dims = n_dims;
    memcpy(t->shape, shape, (size_t)n_dims * sizeof *shape);
    t->offset = w->blob.written;
    t->size = size;
    w->in_tensor = true;
    w->remaining = size;
    return 0;
}

int iebin_writer_write(struct iebin_writer *w, const void *data, uint64_t n)
{
    if (w->err)
        return w->err;
    if (!w->in_tensor) {
        LOG_ERR("%s: %llu bytes written outside any tensor", w->blob_path,
                (unsigned long long)n);
        return fail(w, ERR_STATE);
    }
    const struct iebin_tensor *t = &w->tensors[w->n_tensors - 1];
    if (n > w->remaining) {
        LOG_ERR("%s: tensor '%s': %llu more bytes written past its size %llu", w->blob_path,
                t->name, (unsigned long long)(n - w->remaining), (unsigned long long)t->size);
        return fail(w, ERR_RANGE);
    }
    int rc = afile_write(&w->blob, data, (size_t)n);
    if (rc != 0)
        return fail(w, rc);
    w->remaining -= n;
    return 0;
}

int iebin_writer_end(struct iebin_writer *w)
{
    if (w->err)
        return w->err;
    if (!w->in_tensor) {
        LOG_ERR("%s: tensor end without a begin", w->blob_path);
        return fail(w, ERR_STATE);
    }
    const struct iebin_tensor *t = &w->tensors[w->n_tensors - 1];
    if (w->remaining != 0) {
        LOG_ERR("%s: tensor '%s': ended after %llu of its %llu bytes", w->blob_path, t->name,
                (unsigned long long)(t->size - w->remaining), (unsigned long long)t->size);
        return fail(w, ERR_TRUNCATED);
    }
    w->in_tensor = false;
    return 0;
}

int iebin_writer_add(struct iebin_writer *w, const char *name, enum dtype dt,
                     const uint64_t *shape, int n_dims, const void *data, uint64_t size)
{
    int rc = iebin_writer_begin(w, name, dt, shape, n_dims);
    if (rc != 0)
        return rc;
    const struct iebin_tensor *t = &w->tensors[w->n_tensors - 1];
    if (size != t->size) {
        LOG_ERR("%s: tensor '%s': %llu bytes given, its shape and dtype need %llu",
                w->blob_path, name, (unsigned long long)size, (unsigned long long)t->size);
        return fail(w, ERR_MISMATCH);
    }
    if ((rc = iebin_writer_write(w, data, size)) != 0)
        return rc;
    return iebin_writer_end(w);
}

int iebin_writer_set_tokenizer(struct iebin_writer *w, const char *json, size_t len)
{
    if (w->err)
        return w->err;
    if (w->has_tok) {
        LOG_ERR("%s: tokenizer set twice", w->tok_path);
        return fail(w, ERR_STATE);
    }
    int rc = afile_open(&w->tok, w->tok_path);
    if (rc != 0)
        return fail(w, rc);
    w->has_tok = true;
    if ((rc = afile_write(&w->tok, json, len)) != 0)
        return fail(w, rc);
    return 0;
}

/* ---- the manifest ---- */

/* The double whose shortest decimal form reads back as f (1e-05, not 9.99999975e-06). */
static double json_real_of(float f)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f; /* 9 significant digits always round-trip a float */
}

/* The gpt_oss keys of hparams (docs/IEBIN.md), appended to `o`. 0 or -1 (out of memory). */
static int add_gpt_oss_hparams(json_t *o, const struct iebin_hparams *hp)
{
    json_t *types = json_array();
    for (uint32_t l = 0; types && l < hp->n_layers; l++)
        if (json_array_append_new(types, json_string(iebin_layer_slides(hp, l)
                                                         ? "sliding_attention"
                                                         : "full_attention")) != 0) {
            json_decref(types);
            types = NULL;
        }
    if (!types)
        return -1;
    const struct iebin_rope_scaling *rs = &hp->rope_scaling;
    json_t *rope = json_pack("{s:s, s:f, s:f, s:f, s:I, s:b}", "type", "yarn", "factor",
                             json_real_of(rs->factor), "beta_fast", json_real_of(rs->beta_fast),
                             "beta_slow", json_real_of(rs->beta_slow),
                             "original_max_position_embeddings",
                             (json_int_t)rs->original_max_position_embeddings, "truncate",
                             (int)rs->truncate);
    if (!rope) {
        json_decref(types);
        return -1;
    }
    int rc = json_object_set_new(o, "n_experts", json_integer(hp->n_experts));
    rc |= json_object_set_new(o, "n_experts_used", json_integer(hp->n_experts_used));
    rc |= json_object_set_new(o, "sliding_window", json_integer(hp->sliding_window));
    rc |= json_object_set_new(o, "layer_types", types);
    rc |= json_object_set_new(o, "rope_scaling", rope);
    rc |= json_object_set_new(o, "swiglu_limit", json_real(json_real_of(hp->swiglu_limit)));
    rc |= json_object_set_new(o, "swiglu_alpha", json_real(json_real_of(hp->swiglu_alpha)));
    return rc ? -1 : 0;
}

/* llama and qwen2's optional keys (docs/IEBIN.md): sliding_window when every layer slides,
 * rope_freq_factors with frequency-factor RoPE scaling. 0 or -1 (out of memory). */
static int add_dense_hparams(json_t *o, const struct iebin_hparams *hp)
{
    int rc = 0;
    if (hp->sliding_window)
        rc |= json_object_set_new(o, "sliding_window", json_integer(hp->sliding_window));
    if (hp->rope_scaling.type == IEBIN_ROPE_FREQ_FACTORS) {
        json_t *ff = json_array();
        for (uint32_t i = 0; ff && i < hp->head_dim / 2; i++)
            rc |= json_array_append_new(ff, json_real(json_real_of(hp->rope_freq_factors[i])));
        rc |= ff ? json_object_set_new(o, "rope_freq_factors", ff) : -1;
    }
    return rc ? -1 : 0;
}

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_add(struct sbuf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

/*
 * The manifest text: the header fields indented, then one line per tensor (readable and
 * diffable even with thousands of tensors). NULL on out-of-memory.
 */
static char *build_manifest(const struct iebin_writer *w, size_t *len)
{
    const struct iebin_hparams *hp = &w->hp;
    struct sbuf b = {0};
    char *head = NULL;
    json_t *hpo = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b}", "dim", (json_int_t)hp->dim,
        "n_layers", (json_int_t)hp->n_layers, "n_heads", (json_int_t)hp->n_heads, "n_kv_heads",
        (json_int_t)hp->n_kv_heads, "head_dim", (json_int_t)hp->head_dim, "ffn_dim",
        (json_int_t)hp->ffn_dim, "vocab_size", (json_int_t)hp->vocab_size, "max_seq_len",
        (json_int_t)hp->max_seq_len, "rope_theta", json_real_of(hp->rope_theta), "rms_eps",
        json_real_of(hp->rms_eps), "tied_embeddings", (int)hp->tied_embeddings);
    if (hpo && (strcmp(w->arch, "gpt_oss") == 0 ? add_gpt_oss_hparams(hpo, hp)
                                                 : add_dense_hparams(hpo, hp)) != 0) {
        json_decref(hpo);
        hpo = NULL;
    }
    if (!hpo)
        return NULL;
    json_t *top = json_pack("{s:s, s:i, s:s, s:s, s:o, s:s?, s:{s:s, s:I}}", "format", "iebin",
                            "version", IEBIN_VERSION, "architecture", w->arch, "name", w->name,
                            "hparams", hpo, "tokenizer", w->has_tok ? IEBIN_TOKENIZER : NULL,
                            "blob", "file", IEBIN_BLOB, "size", (json_int_t)w->blob.written);
    if (!top)
        return NULL;
    head = json_dumps(top, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(top);
    if (!head)
        return NULL;
    /* head ends with "\n}": continue the object with the tensors array */
    char *close = strrchr(head, '}');
    *close = '\0';
    while (close > head && close[-1] == '\n')
        *--close = '\0';
    sb_add(&b, head);
    free(head);
    sb_add(&b, ",\n  \"tensors\": [\n");
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct iebin_tensor *t = &w->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->n_dims; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *o = shape ? json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", t->name, "dtype",
                                      dtype_info(t->dtype)->name, "shape", shape, "offset",
                                      (json_int_t)t->offset, "size", (json_int_t)t->size)
                          : NULL;
        char *line = o ? json_dumps(o, 0) : NULL;
        json_decref(o);
        if (!line) {
            free(b.p);
            return NULL;
        }
        sb_add(&b, "    ");
        sb_add(&b, line);
        sb_add(&b, i + 1 < w->n_tensors ? ",\n" : "\n");
        free(line);
    }
    sb_add(&b, "  ]\n}\n");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

static int fsync_file(const struct afile *af)
{
    if (fsync(af->fd) != 0) {
        int e = errno;
        LOG_ERR("fsync(%s) failed: %s", af->tmp_path, strerror(e));
        return -e;
    }
    return 0;
}

int iebin_writer_finish(struct iebin_writer *w)
{
    int rc;
    char *text = NULL;
    size_t len = 0;
    struct afile mf = {.fd = -1};
    if (w->err) {
        rc = w->err;
        goto fail;
    }
    if (w->in_tensor) {
        LOG_ERR("%s: tensor '%s' was begun but never ended", w->blob_path,
                w->tensors[w->n_tensors - 1].name);
        rc = ERR_STATE;
        goto fail;
    }
    if (!(text = build_manifest(w, &len))) {
        LOG_ERR("%s: out of memory building the manifest", w->manifest_path);
        rc = -ENOMEM;
        goto fail;
    }
    /* The reader's own validation, on exactly the bytes about to be committed. */
    if ((rc = iebin_check_manifest(w->manifest_path, text, len, w->blob.written)) != 0)
        goto fail;
    if ((rc = afile_open(&mf, w->manifest_path)) != 0)
        goto fail;
    if ((rc = afile_write(&mf, text, len)) != 0)
        goto fail;
    /* Flush every temporary while the old model is still whole: a full disk or an I/O error
     * found here (delayed allocation reports ENOSPC as late as fsync) costs nothing. */
    if ((rc = fsync_file(&w->blob)) != 0 || (w->has_tok && (rc = fsync_file(&w->tok)) != 0) ||
        (rc = fsync_file(&mf)) != 0)
        goto fail;

    /* Commit. From here a failure leaves no manifest, hence nothing that loads. */
    if (unlink(w->manifest_path) != 0 && errno != ENOENT) {
        rc = -errno;
        LOG_ERR("cannot remove the old manifest %s: %s", w->manifest_path, strerror(errno));
        goto fail;
    }
    if ((rc = fsync_dir(w->dir)) != 0)
        goto fail;
    if ((rc = afile_commit(&w->blob)) != 0)
        goto fail;
    if (w->has_tok) {
        if ((rc = afile_commit(&w->tok)) != 0)
            goto fail;
    } else if (unlink(w->tok_path) != 0 && errno != ENOENT) {
        rc = -errno;
        LOG_ERR("cannot remove the old tokenizer %s: %s", w->tok_path, strerror(errno));
        goto fail;
    }
    if ((rc = afile_commit(&mf)) != 0)
        goto fail;
    free(text);
    writer_free(w);
    return 0;
fail:
    afile_abort(&mf);
    free(text);
    writer_free(w);
    return rc;
}
