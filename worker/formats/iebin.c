/*
 * iebin.c — IEBIN v1 reader: manifest parsing (jansson), validation of every field against the
 * format and the architecture, and the read-only mapping of the blob (see iebin.h and
 * docs/IEBIN.md, which this file implements).
 *
 * Validation runs on the manifest alone (it needs only the blob's size) before anything is
 * mapped, so a bad manifest for a 4 GB model costs a few microseconds, not a 4 GB read. The
 * same code validates what iebin_writer_finish is about to commit (iebin_check_manifest), so
 * the writer can never produce a model this reader rejects.
 *
 * The llama architecture's tensors are numbered by "slot": 0 tok_embd, 1 output_norm,
 * 2 output, then 9 per layer in the order of `kinds` below. A name resolves to its slot by
 * parsing (no table of strings), duplicates are a second hit on a slot, missing tensors an
 * empty slot, and iebin_find is a slot lookup.
 *
 * NOTES: a struct iebin_model is immutable once returned and may be read by any thread. It
 * owns its mapping; tensors' `data` pointers die with iebin_close.
 */
#include "iebin.h"

#include "err.h"
#include "fmap.h"
#include "jfield.h"
#include "log.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the llama architecture ---- */

enum kind {
    K_TOK_EMBD,
    K_OUTPUT_NORM,
    K_OUTPUT,
    K_ATTN_NORM, /* first per-layer kind */
    K_ATTN_Q,
    K_ATTN_K,
    K_ATTN_V,
    K_ATTN_O,
    K_FFN_NORM,
    K_FFN_GATE,
    K_FFN_UP,
    K_FFN_DOWN,
    K_COUNT_
};
#define N_GLOBAL K_ATTN_NORM
#define N_PER_LAYER (K_COUNT_ - K_ATTN_NORM)

static const struct kind_info {
    const char *name; /* full name, or the suffix after "blk.N." for per-layer kinds */
    int n_dims;
    bool f32_only;
    const char *dims; /* the expected shape in words, for messages */
} kinds[K_COUNT_] = {
    [K_TOK_EMBD] = {IEBIN_T_TOK_EMBD, 2, false, "vocab_size, dim"},
    [K_OUTPUT_NORM] = {IEBIN_T_OUTPUT_NORM, 1, true, "dim"},
    [K_OUTPUT] = {IEBIN_T_OUTPUT, 2, false, "vocab_size, dim"},
    [K_ATTN_NORM] = {IEBIN_T_ATTN_NORM, 1, true, "dim"},
    [K_ATTN_Q] = {IEBIN_T_ATTN_Q, 2, false, "n_heads*head_dim, dim"},
    [K_ATTN_K] = {IEBIN_T_ATTN_K, 2, false, "n_kv_heads*head_dim, dim"},
    [K_ATTN_V] = {IEBIN_T_ATTN_V, 2, false, "n_kv_heads*head_dim, dim"},
    [K_ATTN_O] = {IEBIN_T_ATTN_O, 2, false, "dim, n_heads*head_dim"},
    [K_FFN_NORM] = {IEBIN_T_FFN_NORM, 1, true, "dim"},
    [K_FFN_GATE] = {IEBIN_T_FFN_GATE, 2, false, "ffn_dim, dim"},
    [K_FFN_UP] = {IEBIN_T_FFN_UP, 2, false, "ffn_dim, dim"},
    [K_FFN_DOWN] = {IEBIN_T_FFN_DOWN, 2, false, "dim, ffn_dim"},
};

static size_t n_slots(const struct iebin_hparams *hp)
{
    return N_GLOBAL + (size_t)hp->n_layers * N_PER_LAYER;
}

/* "blk.12.attn_q" -> slot; -1 for a name the architecture does not define. */
static long name_slot(const struct iebin_hparams *hp, const char *name)
{
    for (int k = 0; k < N_GLOBAL; k++)
        if (strcmp(name, kinds[k].name) == 0)
            return k;
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    const char *p = name + 4;
    /* decimal without sign or leading zeros: "blk.01.x" is not "blk.1.x" */
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return -1;
    unsigned long layer = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        layer = layer * 10 + (unsigned long)(*p - '0');
        if (layer >= hp->n_layers)
            return -1;
    }
    if (*p != '.')
        return -1;
    p++;
    for (int k = N_GLOBAL; k < K_COUNT_; k++)
        if (strcmp(p, kinds[k].name) == 0)
            return (long)(N_GLOBAL + layer * N_PER_LAYER + (unsigned long)(k - N_GLOBAL));
    return -1;
}

static enum kind slot_kind(size_t slot)
{
    return slot < N_GLOBAL ? (enum kind)slot : (enum kind)(N_GLOBAL + (slot - N_GLOBAL) % N_PER_LAYER);
}

static void slot_name(size_t slot, char *buf, size_t n)
{
    if (slot < N_GLOBAL)
        snprintf(buf, n, "%s", kinds[slot].name);
    else
        snprintf(buf, n, "blk.%zu.%s", (slot - N_GLOBAL) / N_PER_LAYER, kinds[slot_kind(slot)].name);
}

static void expected_shape(const struct iebin_hparams *hp, enum kind k, uint64_t shape[2])
{
    uint64_t q = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t kv = (uint64_t)hp->n_kv_heads * hp->head_dim;
    switch (k) {
    case K_TOK_EMBD:
    case K_OUTPUT:
        shape[0] = hp->vocab_size, shape[1] = hp->dim;
        break;
    case K_OUTPUT_NORM:
    case K_ATTN_NORM:
    case K_FFN_NORM:
        shape[0] = hp->dim, shape[1] = 0;
        break;
    case K_ATTN_Q:
        shape[0] = q, shape[1] = hp->dim;
        break;
    case K_ATTN_K:
    case K_ATTN_V:
        shape[0] = kv, shape[1] = hp->dim;
        break;
    case K_ATTN_O:
        shape[0] = hp->dim, shape[1] = q;
        break;
    case K_FFN_GATE:
    case K_FFN_UP:
        shape[0] = hp->ffn_dim, shape[1] = hp->dim;
        break;
    case K_FFN_DOWN:
        shape[0] = hp->dim, shape[1] = hp->ffn_dim;
        break;
    case K_COUNT_:
        break;
    }
}

static const char *shape_str(const uint64_t *shape, int n_dims, char *buf, size_t n)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

/* ---- hyper-parameters ---- */

static const struct hp_field {
    const char *name;
    size_t off;
    uint32_t lo, hi;
} hp_fields[] = {
    {"dim", offsetof(struct iebin_hparams, dim), 1, 65536},
    {"n_layers", offsetof(struct iebin_hparams, n_layers), 1, 1024},
    {"n_heads", offsetof(struct iebin_hparams, n_heads), 1, 1024},
    {"n_kv_heads", offsetof(struct iebin_hparams, n_kv_heads), 1, 1024},
    {"head_dim", offsetof(struct iebin_hparams, head_dim), 2, 1024},
    {"ffn_dim", offsetof(struct iebin_hparams, ffn_dim), 1, 1048576},
    {"vocab_size", offsetof(struct iebin_hparams, vocab_size), 1, 4194304},
    {"max_seq_len", offsetof(struct iebin_hparams, max_seq_len), 1, 1048576},
};
#define N_HP_FIELDS (sizeof hp_fields / sizeof hp_fields[0])

static uint32_t hp_get(const struct iebin_hparams *hp, const struct hp_field *f)
{
    uint32_t v;
    memcpy(&v, (const char *)hp + f->off, sizeof v);
    return v;
}

int iebin_check_hparams(const struct iebin_hparams *hp, const char *what)
{
    for (size_t i = 0; i < N_HP_FIELDS; i++) {
        const struct hp_field *f = &hp_fields[i];
        uint32_t v = hp_get(hp, f);
        if (v < f->lo || v > f->hi) {
            LOG_ERR("%s: hparams.%s %u is outside %u..%u", what, f->name, v, f->lo, f->hi);
            return ERR_RANGE;
        }
    }
    if (hp->n_heads % hp->n_kv_heads != 0) {
        LOG_ERR("%s: hparams.n_heads %u is not a multiple of n_kv_heads %u", what, hp->n_heads,
                hp->n_kv_heads);
        return ERR_RANGE;
    }
    if (hp->head_dim % 2 != 0) {
        LOG_ERR("%s: hparams.head_dim %u is odd (RoPE rotates pairs of elements)", what,
                hp->head_dim);
        return ERR_RANGE;
    }
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta)) {
        LOG_ERR("%s: hparams.rope_theta %g must be finite and > 0", what, (double)hp->rope_theta);
        return ERR_RANGE;
    }
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f)) {
        LOG_ERR("%s: hparams.rms_eps %g must be in (0, 1)", what, (double)hp->rms_eps);
        return ERR_RANGE;
    }
    return 0;
}

/* ---- one tensor against the architecture ---- */

static int check_arch_tensor(const char *what, const struct iebin_hparams *hp, const char *name,
                             enum dtype dt, const uint64_t *shape, int n_dims, long *slot_out)
{
    long slot = name_slot(hp, name);
    if (slot < 0) {
        LOG_ERR("%s: tensor '%s' is not a tensor of architecture llama with %u layers "
                "(unexpected tensor)",
                what, name, hp->n_layers);
        return ERR_FORMAT;
    }
    enum kind k = slot_kind((size_t)slot);
    if (k == K_OUTPUT && hp->tied_embeddings) {
        LOG_ERR("%s: tensor '%s' is present but hparams.tied_embeddings is true (the classifier "
                "is tok_embd)",
                what, name);
        return ERR_FORMAT;
    }
    if (kinds[k].f32_only && dt != DT_F32) {
        const struct dtype_info *di = dtype_info(dt);
        LOG_ERR("%s: tensor '%s': dtype %s, but norms must be f32", what, name,
                di ? di->name : "?");
        return ERR_MISMATCH;
    }
    uint64_t want[2];
    expected_shape(hp, k, want);
    bool same = n_dims == kinds[k].n_dims;
    for (int i = 0; same && i < n_dims; i++)
        same = shape[i] == want[i];
    if (!same) {
        char got_s[128], want_s[64];
        LOG_ERR("%s: tensor '%s': shape %s does not match the architecture's %s (%s)", what, name,
                shape_str(shape, n_dims, got_s, sizeof got_s),
                shape_str(want, kinds[k].n_dims, want_s, sizeof want_s), kinds[k].dims);
        return ERR_MISMATCH;
    }
    if (slot_out)
        *slot_out = slot;
    return 0;
}

int iebin_check_tensor(const char *what, const char *arch, const struct iebin_hparams *hp,
                       const char *name, enum dtype dt, const uint64_t *shape, int n_dims)
{
    if (strcmp(arch, "llama") != 0) {
        LOG_ERR("%s: architecture '%s' is not supported (known: llama)", what, arch);
        return ERR_UNSUPPORTED;
    }
    return check_arch_tensor(what, hp, name, dt, shape, n_dims, NULL);
}

/* ---- manifest fields ---- */

/* An integer in lo..hi (hi <= 2^53). `field` is the full field label for messages. */
static int get_int(const char *what, const char *field, const json_t *v, uint64_t lo, uint64_t hi,
                   uint64_t *out)
{
    char d[48];
    if (!v) {
        LOG_ERR("%s: %s is missing", what, field);
        return ERR_FORMAT;
    }
    if (!json_is_integer(v)) {
        LOG_ERR("%s: %s is %s, not an integer", what, field, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi) {
        LOG_ERR("%s: %s is %lld, outside %llu..%llu", what, field, (long long)x,
                (unsigned long long)lo, (unsigned long long)hi);
        return ERR_RANGE;
    }
    *out = (uint64_t)x;
    return 0;
}

static int get_string(const char *what, const char *field, const json_t *v, const char **out)
{
    char d[48];
    if (!v) {
        LOG_ERR("%s: %s is missing", what, field);
        return ERR_FORMAT;
    }
    if (!json_is_string(v)) {
        LOG_ERR("%s: %s is %s, not a string", what, field, jfield_desc(v, d, sizeof d));
        return ERR_FORMAT;
    }
    *out = json_string_value(v);
    return 0;
}

static int parse_hparams(const char *what, const json_t *o, struct iebin_hparams *hp)
{
    char field[64], d[48];
    if (!o || !json_is_object(o)) {
        LOG_ERR("%s: hparams is %s, not an object", what, jfield_desc(o, d, sizeof d));
        return ERR_FORMAT;
    }
    memset(hp, 0, sizeof *hp);
    for (size_t i = 0; i < N_HP_FIELDS; i++) {
        const struct hp_field *f = &hp_fields[i];
        snprintf(field, sizeof field, "hparams.%s", f->name);
        uint64_t v;
        int rc = get_int(what, field, json_object_get(o, f->name), f->lo, f->hi, &v);
        if (rc != 0)
            return rc;
        uint32_t v32 = (uint32_t)v;
        memcpy((char *)hp + f->off, &v32, sizeof v32);
    }
    static const struct {
        const char *name;
        size_t off;
    } reals[] = {{"rope_theta", offsetof(struct iebin_hparams, rope_theta)},
                 {"rms_eps", offsetof(struct iebin_hparams, rms_eps)}};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(o, reals[i].name);
        if (!v || !json_is_number(v)) {
            LOG_ERR("%s: hparams.%s is %s, not a number", what, reals[i].name,
                    jfield_desc(v, d, sizeof d));
            return ERR_FORMAT;
        }
        double x = json_number_value(v);
        if (!(fabs(x) <= FLT_MAX)) { /* a float cannot hold it; converting would be UB */
            LOG_ERR("%s: hparams.%s %g does not fit a float", what, reals[i].name, x);
            return ERR_RANGE;
        }
        float fx = (float)x;
        memcpy((char *)hp + reals[i].off, &fx, sizeof fx);
    }
    const json_t *t = json_object_get(o, "tied_embeddings");
    if (!t || !json_is_boolean(t)) {
        LOG_ERR("%s: hparams.tied_embeddings is %s, not a boolean", what, jfield_desc(t, d, sizeof d));
        return ERR_FORMAT;
    }
    hp->tied_embeddings = json_is_true(t);
    return iebin_check_hparams(hp, what);
}

/* Names: 1..127 bytes of printable ASCII, so that every message quoting one is readable. */
static int check_name(const char *what, size_t index, const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= IEBIN_NAME_MAX) {
        LOG_ERR("%s: tensors[%zu].name is %zu bytes long, must be 1..%d", what, index, n,
                IEBIN_NAME_MAX - 1);
        return ERR_FORMAT;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c <= 0x20 || c >= 0x7f || c == '\'' || c == '"' || c == '\\') {
            LOG_ERR("%s: tensors[%zu].name contains byte 0x%02x (names are printable ASCII "
                    "without spaces or quotes)",
                    what, index, c);
            return ERR_FORMAT;
        }
    }
    return 0;
}

/* Parses and checks tensors[i] on its own (everything that does not need other tensors). */
static int parse_tensor(const char *what, size_t index, const json_t *o, uint64_t blob_size,
                        struct iebin_tensor *t)
{
    char field[IEBIN_NAME_MAX + 64], d[48];
    int rc;
    if (!json_is_object(o)) {
        LOG_ERR("%s: tensors[%zu] is %s, not an object", what, index, jfield_desc(o, d, sizeof d));
        return ERR_FORMAT;
    }
    const char *name;
    snprintf(field, sizeof field, "tensors[%zu].name", index);
    if ((rc = get_string(what, field, json_object_get(o, "name"), &name)) != 0)
        return rc;
    if ((rc = check_name(what, index, name)) != 0)
        return rc;
    memcpy(t->name, name, strlen(name) + 1);

    const char *dts;
    snprintf(field, sizeof field, "tensor '%s': dtype", name);
    if ((rc = get_string(what, field, json_object_get(o, "dtype"), &dts)) != 0)
        return rc;
    if (dtype_from_name(dts, &t->dtype) != 0) {
        LOG_ERR("%s: tensor '%s': dtype '%s' is unknown (known: f32, f16, bf16, q8_0, q4_0, "
                "q4_g64, q4_g128, q4z_g32, q4z_g64, q4z_g128)",
                what, name, dts);
        return ERR_UNSUPPORTED;
    }

    const json_t *shape = json_object_get(o, "shape");
    if (!shape || !json_is_array(shape)) {
        LOG_ERR("%s: tensor '%s': shape is %s, not an array", what, name,
                jfield_desc(shape, d, sizeof d));
        return ERR_FORMAT;
    }
    size_t nd = json_array_size(shape);
    if (nd < 1 || nd > IEBIN_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': shape has %zu dimensions, must be 1..%d", what, name, nd,
                IEBIN_MAX_DIMS);
        return ERR_FORMAT;
    }
    t->n_dims = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        snprintf(field, sizeof field, "tensor '%s': shape[%zu]", name, i);
        if ((rc = get_int(what, field, json_array_get(shape, i), 1, IEBIN_INT_MAX, &t->shape[i])))
            return rc;
    }
    snprintf(field, sizeof field, "tensor '%s': offset", name);
    if ((rc = get_int(what, field, json_object_get(o, "offset"), 0, IEBIN_INT_MAX, &t->offset)))
        return rc;
    snprintf(field, sizeof field, "tensor '%s': size", name);
    if ((rc = get_int(what, field, json_object_get(o, "size"), 0, IEBIN_INT_MAX, &t->size)))
        return rc;

    char ss[128];
    uint64_t bytes;
    rc = dtype_tensor_bytes(t->dtype, t->shape, t->n_dims, &bytes);
    if (rc == ERR_OVERFLOW) {
        LOG_ERR("%s: tensor '%s': shape %s: the byte size overflows 64 bits", what, name,
                shape_str(t->shape, t->n_dims, ss, sizeof ss));
        return ERR_OVERFLOW;
    }
    if (rc == ERR_FORMAT) {
        LOG_ERR("%s: tensor '%s': shape %s: the last dimension is not a multiple of the %s "
                "block (%u)",
                what, name, shape_str(t->shape, t->n_dims, ss, sizeof ss), dts,
                dtype_info(t->dtype)->block);
        return ERR_FORMAT;
    }
    if (rc != 0) { /* dimensions were checked >= 1 and n_dims 1..4 above */
        LOG_ERR("%s: tensor '%s': shape %s is invalid", what, name,
                shape_str(t->shape, t->n_dims, ss, sizeof ss));
        return rc;
    }
    if (bytes != t->size) {
        LOG_ERR("%s: tensor '%s': size %llu does not match shape %s x %s = %llu bytes", what,
                name, (unsigned long long)t->size, shape_str(t->shape, t->n_dims, ss, sizeof ss),
                dts, (unsigned long long)bytes);
        return ERR_MISMATCH;
    }
    if (t->offset % IEBIN_ALIGN != 0) {
        LOG_ERR("%s: tensor '%s': offset %llu is not a multiple of %d", what, name,
                (unsigned long long)t->offset, IEBIN_ALIGN);
        return ERR_FORMAT;
    }
    uint64_t end;
    if (dtype_add_u64(t->offset, t->size, &end) != 0) {
        LOG_ERR("%s: tensor '%s': offset %llu + size %llu overflows", what, name,
                (unsigned long long)t->offset, (unsigned long long)t->size);
        return ERR_OVERFLOW;
    }
    if (t->offset >= blob_size) {
        LOG_ERR("%s: tensor '%s': offset %llu is beyond the blob (blob.size %llu)", what, name,
                (unsigned long long)t->offset, (unsigned long long)blob_size);
        return ERR_RANGE;
    }
    if (end > blob_size) {
        LOG_ERR("%s: tensor '%s': offset %llu + size %llu = %llu runs past the end of the blob "
                "(blob.size %llu)",
                what, name, (unsigned long long)t->offset, (unsigned long long)t->size,
                (unsigned long long)end, (unsigned long long)blob_size);
        return ERR_RANGE;
    }
    return 0;
}

static int cmp_offset(const void *a, const void *b, void *ctx)
{
    const struct iebin_tensor *ts = ctx;
    const struct iebin_tensor *x = &ts[*(const uint32_t *)a], *y = &ts[*(const uint32_t *)b];
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int check_overlaps(const char *what, const struct iebin_tensor *ts, size_t n)
{
    uint32_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) {
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    qsort_r(order, n, sizeof *order, cmp_offset, (void *)ts);
    int rc = 0;
    for (size_t i = 1; i < n; i++) {
        const struct iebin_tensor *a = &ts[order[i - 1]], *b = &ts[order[i]];
        if (a->offset + a->size > b->offset) { /* no overflow: both checked against the blob */
            LOG_ERR("%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the blob",
                    what, a->name, (unsigned long long)a->offset,
                    (unsigned long long)(a->offset + a->size), b->name,
                    (unsigned long long)b->offset, (unsigned long long)(b->offset + b->size));
            rc = ERR_FORMAT;
            break;
        }
    }
    free(order);
    return rc;
}

/*
 * Parses and validates a manifest as if its blob had `blob_size` bytes (the size stated in the
 * manifest must then equal it). Fills m except dir, tokenizer_path and the data pointers;
 * *has_tokenizer tells whether the manifest references one.
 */
static int parse_manifest(const char *what, const char *blob_what, const char *text, size_t len,
                          uint64_t blob_size, struct iebin_model *m, bool *has_tokenizer)
{
    char d[48];
    int rc;
    json_t *root = NULL;
    bool *seen = NULL;
    if (len > IEBIN_MANIFEST_MAX) {
        LOG_ERR("%s: %zu bytes, larger than the %u-byte limit for a manifest", what, len,
                IEBIN_MANIFEST_MAX);
        return ERR_RANGE;
    }
    json_error_t jerr;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", what, jerr.line, jerr.column,
                jerr.text);
        return ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        LOG_ERR("%s: the manifest is %s, not a JSON object", what, jfield_desc(root, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    const char *s;
    if ((rc = get_string(what, "format", json_object_get(root, "format"), &s)) != 0)
        goto out;
    if (strcmp(s, "iebin") != 0) {
        LOG_ERR("%s: format is \"%.64s\", not \"iebin\"", what, s);
        rc = ERR_FORMAT;
        goto out;
    }
    const json_t *ver = json_object_get(root, "version");
    if (!ver || !json_is_integer(ver)) {
        LOG_ERR("%s: version is %s, not an integer", what, jfield_desc(ver, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    if (json_integer_value(ver) != IEBIN_VERSION) {
        LOG_ERR("%s: version %lld is not supported (this build reads IEBIN version %d)", what,
                (long long)json_integer_value(ver), IEBIN_VERSION);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    if ((rc = get_string(what, "architecture", json_object_get(root, "architecture"), &s)) != 0)
        goto out;
    if (strcmp(s, "llama") != 0) {
        LOG_ERR("%s: architecture '%.64s' is not supported (known: llama)", what, s);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(m->arch, sizeof m->arch, "%s", s);
    const json_t *name = json_object_get(root, "name");
    if (name && !json_is_null(name) && !json_is_string(name)) {
        LOG_ERR("%s: name is %s, not a string", what, jfield_desc(name, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    m->name = strdup(name && json_is_string(name) ? json_string_value(name) : "");
    if (!m->name) {
        rc = -ENOMEM;
        LOG_ERR("%s: out of memory", what);
        goto out;
    }
    if ((rc = parse_hparams(what, json_object_get(root, "hparams"), &m->hp)) != 0)
        goto out;

    const json_t *tok = json_object_get(root, "tokenizer");
    *has_tokenizer = tok && !json_is_null(tok);
    if (*has_tokenizer &&
        (!json_is_string(tok) || strcmp(json_string_value(tok), IEBIN_TOKENIZER) != 0)) {
        LOG_ERR("%s: tokenizer is %s; it must be null or \"" IEBIN_TOKENIZER "\"", what,
                jfield_desc(tok, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }

    const json_t *blob = json_object_get(root, "blob");
    if (!blob || !json_is_object(blob)) {
        LOG_ERR("%s: blob is %s, not an object", what, jfield_desc(blob, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    if ((rc = get_string(what, "blob.file", json_object_get(blob, "file"), &s)) != 0)
        goto out;
    if (strcmp(s, IEBIN_BLOB) != 0) { /* never a path: a manifest must not point elsewhere */
        LOG_ERR("%s: blob.file is \"%.64s\"; it must be \"" IEBIN_BLOB "\"", what, s);
        rc = ERR_FORMAT;
        goto out;
    }
    uint64_t stated;
    if ((rc = get_int(what, "blob.size", json_object_get(blob, "size"), 0, IEBIN_INT_MAX,
                      &stated)) != 0)
        goto out;

    const json_t *tensors = json_object_get(root, "tensors");
    if (!tensors || !json_is_array(tensors)) {
        LOG_ERR("%s: tensors is %s, not an array", what, jfield_desc(tensors, d, sizeof d));
        rc = ERR_FORMAT;
        goto out;
    }
    /* Every accepted entry fills a distinct slot, so n_slots bounds the allocation whatever
     * the array's length (a 64 MB array of {} cannot make us allocate gigabytes). */
    size_t ns = n_slots(&m->hp);
    size_t n = json_array_size(tensors);
    size_t cap = n < ns ? n : ns;
    m->tensors = calloc(cap ? cap : 1, sizeof *m->tensors);
    m->slot_index_ = malloc(ns * sizeof *m->slot_index_);
    seen = calloc(ns, sizeof *seen);
    if (!m->tensors || !m->slot_index_ || !seen) {
        LOG_ERR("%s: out of memory for %zu tensors", what, cap);
        rc = -ENOMEM;
        goto out;
    }
    m->n_slots_ = ns;
    for (size_t slot = 0; slot < ns; slot++)
        m->slot_index_[slot] = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        struct iebin_tensor t;
        memset(&t, 0, sizeof t);
        if ((rc = parse_tensor(what, i, json_array_get(tensors, i), stated, &t)) != 0)
            goto out;
        long slot;
        if ((rc = check_arch_tensor(what, &m->hp, t.name, t.dtype, t.shape, t.n_dims, &slot)))
            goto out;
        if (seen[slot]) {
            LOG_ERR("%s: tensor '%s' is listed twice (tensors[%u] and tensors[%zu]): duplicate "
                    "name",
                    what, t.name, m->slot_index_[slot], i);
            rc = ERR_FORMAT;
            goto out;
        }
        seen[slot] = true;
        m->slot_index_[slot] = (uint32_t)m->n_tensors;
        m->tensors[m->n_tensors++] = t;
    }
    size_t n_missing = 0, first_missing = 0;
    for (size_t slot = ns; slot-- > 0;) {
        if (!seen[slot] && !(slot == K_OUTPUT && m->hp.tied_embeddings))
            n_missing++, first_missing = slot;
    }
    if (n_missing) {
        char nm[IEBIN_NAME_MAX], more[48] = "";
        slot_name(first_missing, nm, sizeof nm);
        if (n_missing > 1)
            snprintf(more, sizeof more, "; %zu more missing", n_missing - 1);
        LOG_ERR("%s: tensor '%s' is missing (architecture llama, %u layers%s%s)", what, nm,
                m->hp.n_layers, first_missing == K_OUTPUT ? ", tied_embeddings false" : "", more);
        rc = ERR_NOT_FOUND;
        goto out;
    }
    if ((rc = check_overlaps(what, m->tensors, m->n_tensors)) != 0)
        goto out;
    if (blob_size != stated) {
        LOG_ERR("%s: %llu bytes, but the manifest's blob.size is %llu%s", blob_what,
                (unsigned long long)blob_size, (unsigned long long)stated,
                blob_size < stated ? " (truncated)" : "");
        rc = blob_size < stated ? ERR_TRUNCATED : ERR_MISMATCH;
        goto out;
    }
    rc = 0;
out:
    free(seen);
    json_decref(root);
    return rc;
}

/* ---- opening ---- */

static void model_free(struct iebin_model *m)
{
    if (!m)
        return;
    if (m->map)
        munmap(m->map, m->map_size);
    free(m->dir);
    free(m->name);
    free(m->tensors);
    free(m->tokenizer_path);
    free(m->slot_index_);
    free(m);
}

void iebin_close(struct iebin_model *m) { model_free(m); }

int iebin_check_manifest(const char *label, const char *manifest, size_t manifest_len,
                         uint64_t blob_size)
{
    struct iebin_model *m = calloc(1, sizeof *m);
    if (!m) {
        LOG_ERR("%s: out of memory", label);
        return -ENOMEM;
    }
    bool has_tok;
    int rc = parse_manifest(label, IEBIN_BLOB, manifest, manifest_len, blob_size, m, &has_tok);
    model_free(m);
    return rc;
}

int iebin_open_mem(const char *label, const void *manifest, size_t manifest_len, const void *blob,
                   size_t blob_len, struct iebin_model **out)
{
    *out = NULL;
    struct iebin_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(label))) {
        LOG_ERR("%s: out of memory", label);
        free(m);
        return -ENOMEM;
    }
    bool has_tok;
    int rc = parse_manifest(label, IEBIN_BLOB, manifest, manifest_len, blob_len, m, &has_tok);
    if (rc != 0) {
        model_free(m);
        return rc;
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        m->tensors[i].data = (const char *)blob + m->tensors[i].offset;
    *out = m;
    return 0;
}

int iebin_open_ex(const char *dir, unsigned flags, struct iebin_model **out)
{
    int rc;
    int fd = -1;
    char *text = NULL, *mpath = NULL, *bpath = NULL;
    size_t len = 0;
    struct iebin_model *m = NULL;
    *out = NULL;

    mpath = path_join(dir, IEBIN_MANIFEST);
    bpath = path_join(dir, IEBIN_BLOB);
    m = calloc(1, sizeof *m);
    if (!mpath || !bpath || !m) {
        LOG_ERR("%s: out of memory", dir);
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = fmap_read(mpath, "manifest", IEBIN_MANIFEST_MAX, &text, &len)) != 0)
        goto fail;

    /* The blob's size is needed to validate; its contents are not, so map only afterwards. */
    fd = open(bpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        LOG_ERR("%s: cannot open the blob: %s", bpath, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        LOG_ERR("%s: fstat failed: %s", bpath, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERR("%s: not a regular file", bpath);
        rc = ERR_FORMAT;
        goto fail;
    }
    bool has_tok;
    if ((rc = parse_manifest(mpath, bpath, text, len, (uint64_t)st.st_size, m, &has_tok)) != 0)
        goto fail;

    char *abs = realpath(dir, NULL);
    if (!abs) {
        rc = -errno;
        LOG_ERR("%s: realpath failed: %s", dir, strerror(errno));
        goto fail;
    }
    m->dir = abs;
    if (has_tok) {
        if (!(m->tokenizer_path = path_join(abs, IEBIN_TOKENIZER))) {
            LOG_ERR("%s: out of memory", dir);
            rc = -ENOMEM;
            goto fail;
        }
        if (access(m->tokenizer_path, R_OK) != 0) {
            rc = -errno;
            LOG_ERR("%s: the manifest references it but it cannot be read: %s",
                    m->tokenizer_path, strerror(errno));
            goto fail;
        }
    }

    if (st.st_size > 0) {
        /* MAP_PRIVATE + PROT_READ: pages are never written, so they stay the page cache's own
         * pages, shared by every process that maps the file (no private copies). MAP_POPULATE
         * reads the model at load time instead of on the first request; see docs/IEBIN.md. */
        int mflags = MAP_PRIVATE | ((flags & IEBIN_OPEN_LAZY) ? 0 : MAP_POPULATE);
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, mflags, fd, 0);
        if (map == MAP_FAILED) {
            rc = -errno;
            LOG_ERR("%s: mmap of %lld bytes failed: %s", bpath, (long long)st.st_size,
                    strerror(errno));
            goto fail;
        }
        m->map = map;
        m->map_size = (size_t)st.st_size;
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        m->tensors[i].data = (const char *)m->map + m->tensors[i].offset;
    close(fd);
    free(text);
    free(mpath);
    free(bpath);
    *out = m;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    free(text);
    free(mpath);
    free(bpath);
    model_free(m);
    return rc;
}

int iebin_open(const char *dir, struct iebin_model **out) { return iebin_open_ex(dir, 0, out); }

const struct iebin_tensor *iebin_find(const struct iebin_model *m, const char *name)
{
    long slot = name_slot(&m->hp, name);
    if (slot < 0 || (size_t)slot >= m->n_slots_)
        return NULL;
    uint32_t i = m->slot_index_[slot];
    return i < m->n_tensors ? &m->tensors[i] : NULL;
}
