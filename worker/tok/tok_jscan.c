/*
 * tok_jscan.c — the JSON reader of tokenizer.json and tokenizer.ie.json, on yajl's streaming
 * parser (Debian's libyajl).
 *
 * Why not jansson alone: o200k's tokenizer.json holds 200k vocabulary entries and 446k merges
 * written as ["a", "b"]; as a jansson tree that is ~1.3 million values and ~180 MB of small
 * allocations, which made loading take ~2 s of CPU. Here the few large containers a loader
 * walks in order ("bulks": model.vocab and model.merges of tokenizer.json; tokens, types,
 * scores and merges of tokenizer.ie.json) are captured flat — one element record each, their
 * strings copied into one arena — and everything else (normalizer, pre_tokenizer,
 * added_tokens, ...) still becomes a jansson tree, so the loaders keep their checks.
 *
 * A bulk element is a scalar, or a container of which only the type, the element count and
 * the first two scalar elements are kept (a merge ["a", "b"] or [3, 7]); anything deeper is
 * skipped, and the loader refuses it by its type. The document is held to what jansson
 * enforced: an object at the top, strict JSON (no comments, no trailing garbage), valid UTF-8,
 * no \u0000, no duplicate keys outside the bulks (a duplicate vocabulary string is refused by
 * tok__build as a repeated token), nesting at most TOK_JSON_MAX_DEPTH.
 */
#include "tok_internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

/* the paths of the bulks, in enum tok__jbulk_id order: depth 1 (a key of the root object) or
 * depth 2 (a key of the root's "model" object) */
static const struct {
    const char *key;
    bool in_model;
} bulk_paths[TOK_JB_COUNT] = {
    [TOK_JB_HF_VOCAB] = {"vocab", true},   [TOK_JB_HF_MERGES] = {"merges", true},
    [TOK_JB_IE_TOKENS] = {"tokens", false}, [TOK_JB_IE_TYPES] = {"types", false},
    [TOK_JB_IE_SCORES] = {"scores", false}, [TOK_JB_IE_MERGES] = {"merges", false},
};

struct scan {
    struct tok__jdoc *doc;
    char err[160];            /* why a callback stopped the parse */
    int rc;                   /* its code */
    uint32_t depth;           /* containers open */
    json_t *js[TOK_JSON_MAX_DEPTH]; /* the jansson container at each depth (outside a bulk) */
    char *key;                /* pending key of the innermost jansson object (malloc'd) */
    size_t key_len;
    bool model_open;          /* the root's "model" object is the container at depth 2 */
    struct tok__jbulk *bulk;  /* the bulk being captured, or NULL */
    uint32_t bulk_depth;      /* depth of the bulk's own container */
    size_t cap;               /* elements allocated in bulk->e */
    uint64_t key_off;         /* a bulk object's pending member key */
    uint32_t key_n;
};

static int stop(struct scan *sc, int rc, const char *msg)
{
    snprintf(sc->err, sizeof sc->err, "%s", msg);
    sc->rc = rc;
    return 0; /* yajl: cancel */
}

/* Copies a string into the arena (NUL-terminated); its offset, or UINT64_MAX (no memory). */
static uint64_t arena_put(struct tok__jdoc *d, const unsigned char *s, size_t len)
{
    if (d->arena_len + len + 1 > d->arena_cap) {
        size_t cap = d->arena_cap ? d->arena_cap : 1 << 16;
        while (cap < d->arena_len + len + 1)
            cap *= 2;
        char *p = tok__big_realloc(d->arena, d->arena_len, cap);
        if (!p)
            return UINT64_MAX;
        d->arena = p;
        d->arena_cap = cap;
    }
    uint64_t off = d->arena_len;
    memcpy(d->arena + off, s, len);
    d->arena[off + len] = '\0';
    d->arena_len += len + 1;
    return off;
}

/* The bulk a value about to open or be stored at the current position is, or -1. */
static int bulk_at(const struct scan *sc)
{
    if (!sc->key || (sc->depth != 1 && !(sc->depth == 2 && sc->model_open)))
        return -1;
    for (int b = 0; b < TOK_JB_COUNT; b++)
        if (bulk_paths[b].in_model == (sc->depth == 2) &&
            strlen(bulk_paths[b].key) == sc->key_len &&
            memcmp(bulk_paths[b].key, sc->key, sc->key_len) == 0)
            return b;
    return -1;
}

/* A value inside a bulk: at its top level it starts an element, one level down it fills the
 * element's first two sub-values; deeper it is only counted by the container above. */
static int bulk_value(struct scan *sc, const struct tok__jval *v)
{
    struct tok__jbulk *b = sc->bulk;
    uint32_t level = sc->depth - sc->bulk_depth; /* 0: directly in the bulk's container */
    if (level == 0) {
        if (b->n == sc->cap) {
            size_t cap = sc->cap ? 2 * sc->cap : 1024;
            struct tok__jelem *e = tok__big_realloc(b->e, sc->cap * sizeof *e, cap * sizeof *e);
            if (!e)
                return stop(sc, -ENOMEM, "out of memory");
            b->e = e;
            sc->cap = cap;
        }
        struct tok__jelem *e = &b->e[b->n++];
        memset(e, 0, sizeof *e);
        e->v = *v;
        e->key_off = sc->key_off;
        e->key_len = sc->key_n;
    } else if (level == 1) {
        struct tok__jelem *e = &b->e[b->n - 1];
        if (e->n_sub < 2)
            e->sub[e->n_sub] = *v;
        if (e->n_sub < UINT32_MAX)
            e->n_sub++;
    }
    return 1;
}

/* Adds a new jansson value at the current position (stealing v). */
static int tree_add(struct scan *sc, json_t *v)
{
    if (!v)
        return stop(sc, -ENOMEM, "out of memory");
    if (sc->depth == 0) {
        sc->doc->root = v;
        return 1;
    }
    json_t *c = sc->js[sc->depth - 1];
    if (json_is_array(c)) {
        if (json_array_append_new(c, v) != 0)
            return stop(sc, -ENOMEM, "out of memory");
        return 1;
    }
    if (json_object_getn(c, sc->key, sc->key_len)) {
        char msg[128];
        snprintf(msg, sizeof msg, "duplicate key '%.64s' in an object", sc->key);
        json_decref(v);
        return stop(sc, ERR_FORMAT, msg);
    }
    int rc = json_object_setn_new(c, sc->key, sc->key_len, v);
    free(sc->key);
    sc->key = NULL;
    return rc == 0 ? 1 : stop(sc, -ENOMEM, "out of memory");
}

/* A scalar value at the current position. */
static json_t *make_scalar(const struct tok__jval *v, const char *arena);

static int scalar(struct scan *sc, const struct tok__jval *v)
{
    if (sc->depth == 0)
        return stop(sc, ERR_FORMAT, "the document is not a JSON object");
    if (sc->bulk)
        return bulk_value(sc, v);
    int b = bulk_at(sc);
    if (b >= 0) { /* a bulk path holding a scalar: kept so the loader names its type */
        if (sc->doc->bulk[b].present) /* the jansson object would have refused it */
            return stop(sc, ERR_FORMAT, "duplicate key in an object");
        sc->doc->bulk[b].present = true;
        sc->doc->bulk[b].v = *v;
        free(sc->key);
        sc->key = NULL;
        return 1;
    }
    return tree_add(sc, make_scalar(v, sc->doc->arena));
}

static json_t *make_scalar(const struct tok__jval *v, const char *arena)
{
    switch (v->type) {
    case TOK_JT_NULL: return json_null();
    case TOK_JT_BOOL: return json_boolean(v->u.i);
    case TOK_JT_INT: return json_integer((json_int_t)v->u.i);
    case TOK_JT_REAL: return json_real(v->u.d);
    default: return json_stringn_nocheck(arena + v->u.off, v->len); /* yajl checked UTF-8 */
    }
}

static int cb_null(void *ctx)
{
    struct tok__jval v = {.type = TOK_JT_NULL};
    return scalar(ctx, &v);
}

static int cb_bool(void *ctx, int b)
{
    struct tok__jval v = {.type = TOK_JT_BOOL, .u.i = b != 0};
    return scalar(ctx, &v);
}

static int cb_int(void *ctx, long long i)
{
    struct tok__jval v = {.type = TOK_JT_INT, .u.i = i};
    return scalar(ctx, &v);
}

static int cb_double(void *ctx, double d)
{
    struct tok__jval v = {.type = TOK_JT_REAL, .u.d = d};
    return scalar(ctx, &v);
}

static int cb_string(void *ctx, const unsigned char *s, size_t len)
{
    struct scan *sc = ctx;
    if (memchr(s, '\0', len))
        return stop(sc, ERR_FORMAT, "a string contains \\u0000 (NUL)");
    if (len > UINT32_MAX)
        return stop(sc, ERR_RANGE, "a string longer than 4 GiB");
    /* outside a bulk the arena only lends the bytes to jansson: taken back right after */
    size_t mark = sc->doc->arena_len;
    uint64_t off = arena_put(sc->doc, s, len);
    if (off == UINT64_MAX)
        return stop(sc, -ENOMEM, "out of memory");
    struct tok__jval v = {.type = TOK_JT_STRING, .len = (uint32_t)len, .u.off = off};
    bool keep = sc->bulk || bulk_at(sc) >= 0;
    int r = scalar(sc, &v);
    if (!keep)
        sc->doc->arena_len = mark;
    return r;
}

static int cb_key(void *ctx, const unsigned char *s, size_t len)
{
    struct scan *sc = ctx;
    if (memchr(s, '\0', len))
        return stop(sc, ERR_FORMAT, "an object key contains \\u0000 (NUL)");
    if (len > UINT32_MAX)
        return stop(sc, ERR_RANGE, "an object key longer than 4 GiB");
    if (sc->bulk) {
        if (sc->depth == sc->bulk_depth) { /* a member of the bulk object itself */
            uint64_t off = arena_put(sc->doc, s, len);
            if (off == UINT64_MAX)
                return stop(sc, -ENOMEM, "out of memory");
            sc->key_off = off;
            sc->key_n = (uint32_t)len;
        }
        return 1;
    }
    free(sc->key);
    sc->key = malloc(len + 1);
    if (!sc->key)
        return stop(sc, -ENOMEM, "out of memory");
    memcpy(sc->key, s, len);
    sc->key[len] = '\0';
    sc->key_len = len;
    return 1;
}

static int open_container(struct scan *sc, bool object)
{
    if (sc->depth == TOK_JSON_MAX_DEPTH) {
        char msg[64];
        snprintf(msg, sizeof msg, "nesting deeper than %d", TOK_JSON_MAX_DEPTH);
        return stop(sc, ERR_RANGE, msg);
    }
    struct tok__jval v = {.type = object ? TOK_JT_OBJECT : TOK_JT_ARRAY};
    if (sc->depth == 0 && !object)
        return stop(sc, ERR_FORMAT, "the document is not a JSON object");
    if (sc->bulk) {
        if (bulk_value(sc, &v) == 0)
            return 0;
        sc->depth++;
        return 1;
    }
    int b = bulk_at(sc);
    if (b >= 0) {
        struct tok__jbulk *bk = &sc->doc->bulk[b];
        if (bk->present) /* the jansson object would have refused it */
            return stop(sc, ERR_FORMAT, "duplicate key in an object");
        bk->present = true;
        bk->v = v;
        sc->bulk = bk;
        sc->cap = 0;
        sc->key_off = 0;
        sc->key_n = 0;
        free(sc->key);
        sc->key = NULL;
        sc->depth++;
        sc->bulk_depth = sc->depth;
        return 1;
    }
    json_t *c = object ? json_object() : json_array();
    bool model = sc->depth == 1 && object && sc->key && strcmp(sc->key, "model") == 0;
    if (!c)
        return stop(sc, -ENOMEM, "out of memory");
    json_incref(c); /* the stack's reference, beside the parent's */
    if (tree_add(sc, c) == 0) {
        json_decref(c);
        return 0;
    }
    sc->js[sc->depth++] = c;
    if (model)
        sc->model_open = true;
    return 1;
}

static int close_container(struct scan *sc)
{
    if (sc->bulk) {
        sc->depth--;
        if (sc->depth < sc->bulk_depth)
            sc->bulk = NULL;
        return 1;
    }
    sc->depth--;
    json_decref(sc->js[sc->depth]);
    if (sc->depth == 1)
        sc->model_open = false;
    return 1;
}

static int cb_start_map(void *ctx) { return open_container(ctx, true); }
static int cb_start_array(void *ctx) { return open_container(ctx, false); }
static int cb_end(void *ctx) { return close_container(ctx); }

static const yajl_callbacks callbacks = {
    .yajl_null = cb_null,
    .yajl_boolean = cb_bool,
    .yajl_integer = cb_int,
    .yajl_double = cb_double,
    .yajl_string = cb_string,
    .yajl_start_map = cb_start_map,
    .yajl_map_key = cb_key,
    .yajl_end_map = cb_end,
    .yajl_start_array = cb_start_array,
    .yajl_end_array = cb_end,
};

void tok__jdoc_free(struct tok__jdoc *d)
{
    json_decref(d->root);
    tok__big_free(d->arena);
    for (int b = 0; b < TOK_JB_COUNT; b++)
        tok__big_free(d->bulk[b].e);
    memset(d, 0, sizeof *d);
}

/* line and column (1-based) of byte offset off */
static void line_col(const char *buf, size_t len, size_t off, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (buf[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

int tok__json_scan(const char *buf, size_t len, const char *what, struct tok__jdoc *doc)
{
    memset(doc, 0, sizeof *doc);
    struct scan *sc = calloc(1, sizeof *sc);
    yajl_handle h = sc ? yajl_alloc(&callbacks, NULL, sc) : NULL;
    if (!h) {
        free(sc);
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    sc->doc = doc;
    /* every string's bytes and NUL fit in the input (its quotes are two bytes): one block */
    if (!(doc->arena = tok__big_alloc(len + 1))) {
        yajl_free(h);
        free(sc);
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    doc->arena_cap = len + 1;
    yajl_status st = yajl_parse(h, (const unsigned char *)buf, len);
    bool at_end = false;
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
        at_end = true;
    }
    int rc = 0;
    if (st == yajl_status_client_canceled) {
        size_t off = yajl_get_bytes_consumed(h);
        int line, col;
        line_col(buf, len, off, &line, &col);
        if (sc->rc == -ENOMEM)
            LOG_ERR("%s: out of memory", what);
        else
            LOG_ERR("%s: %s (line %d column %d)", what, sc->err, line, col);
        rc = sc->rc;
    } else if (st != yajl_status_ok) {
        unsigned char *e = yajl_get_error(h, 0, NULL, 0);
        size_t off = at_end ? len : yajl_get_bytes_consumed(h);
        int line, col;
        line_col(buf, len, off, &line, &col);
        char text[128] = "unknown error";
        if (e) {
            snprintf(text, sizeof text, "%s", (const char *)e);
            text[strcspn(text, "\n")] = '\0';
            yajl_free_error(h, e);
        }
        LOG_ERR("%s: invalid JSON at line %d column %d: %s", what, line, col, text);
        rc = ERR_FORMAT;
    } else if (!doc->root) {
        LOG_ERR("%s: the document is not a JSON object", what);
        rc = ERR_FORMAT;
    }
    while (sc->depth > 0) { /* a stopped parse leaves containers open */
        if (sc->bulk)
            sc->bulk = NULL, sc->depth = sc->bulk_depth - 1;
        else
            json_decref(sc->js[--sc->depth]);
    }
    free(sc->key);
    yajl_free(h);
    free(sc);
    if (rc != 0)
        tok__jdoc_free(doc);
    return rc;
}

const char *tok__jtype_name(const struct tok__jbulk *b, const struct tok__jval *v)
{
    if (b && !b->present)
        return "missing";
    switch (v->type) {
    case TOK_JT_OBJECT: return "an object";
    case TOK_JT_ARRAY: return "an array";
    case TOK_JT_STRING: return "a string";
    case TOK_JT_INT: return "an integer";
    case TOK_JT_REAL: return "a real number";
    case TOK_JT_BOOL: return "a boolean";
    default: return "null";
    }
}
