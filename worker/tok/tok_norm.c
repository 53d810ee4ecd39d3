/*
 * tok_norm.c — the normalizers a byte-level BPE tokenizer.json declares (Qwen2's NFC, and
 * Sequence, Lowercase, Prepend, Replace, Strip, StripAccents, NFD/NFKC/NFKD), applied to text
 * before it is pre-tokenized, as Hugging Face tokenizers applies them.
 *
 * The Unicode work is utf8proc's (Debian's libutf8proc): normalization forms, lowercase
 * mappings and general categories come from its tables rather than tables written here.
 * Replace with a Regex pattern runs on PCRE2 (UTF, UCP), like the pre-tokenizer.
 *
 * A normalizer is kept in two forms: compiled steps for encoding, and the Hugging Face JSON it
 * was read from (only the types and fields understood), which tokenizer.ie.json carries
 * verbatim so a converted model normalizes exactly as its source did. A normalizer type not
 * listed here is refused by name (ERR_UNSUPPORTED) rather than skipped.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok_internal.h"

#include "err.h"
#include "jfield.h"
#include "log.h"

#include <errno.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum norm_kind {
    NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, /* utf8proc_map */
    NORM_LOWERCASE,
    NORM_STRIP_ACCENTS, /* drops combining marks (general category M) */
    NORM_PREPEND,       /* a string before non-empty text */
    NORM_REPLACE,       /* every match of a string or regex by a string */
    NORM_STRIP,         /* White_Space on the left and/or right */
};

struct norm_step {
    enum norm_kind kind;
    bool left, right;   /* NORM_STRIP */
    char *a;            /* NORM_PREPEND: the prefix; NORM_REPLACE: the literal pattern */
    size_t a_len;
    char *b;            /* NORM_REPLACE: the replacement */
    size_t b_len;
    pcre2_code *re;     /* NORM_REPLACE with a Regex pattern */
};

struct tok__norm {
    uint32_t n;
    struct norm_step steps[TOK_NORM_MAX_STEPS];
    json_t *doc;        /* the Hugging Face form, for tokenizer.ie.json */
};

static const struct {
    const char *name;
    enum norm_kind kind;
} simple_kinds[] = {
    {"NFC", NORM_NFC},           {"NFD", NORM_NFD},
    {"NFKC", NORM_NFKC},         {"NFKD", NORM_NFKD},
    {"Lowercase", NORM_LOWERCASE}, {"StripAccents", NORM_STRIP_ACCENTS},
};

void tok__norm_free(struct tok__norm *nm)
{
    if (!nm)
        return;
    for (uint32_t i = 0; i < nm->n; i++) {
        free(nm->steps[i].a);
        free(nm->steps[i].b);
        pcre2_code_free(nm->steps[i].re);
    }
    json_decref(nm->doc);
    free(nm);
}

static char *dup_str(const json_t *v, size_t *len)
{
    *len = json_string_length(v);
    char *p = malloc(*len + 1);
    if (p)
        memcpy(p, json_string_value(v), *len + 1);
    return p;
}

/* One normalizer (not a Sequence) appended to nm; where names it in messages. */
static int parse_one(const char *what, const char *where, const json_t *o, struct tok__norm *nm)
{
    const json_t *type = json_object_get(o, "type");
    if (!json_is_object(o) || !json_is_string(type)) {
        LOG_ERR("%s: %s is not an object with a string type", what, where);
        return ERR_FORMAT;
    }
    const char *ts = json_string_value(type);
    if (nm->n == TOK_NORM_MAX_STEPS) {
        LOG_ERR("%s: more than %d normalizer steps", what, TOK_NORM_MAX_STEPS);
        return ERR_RANGE;
    }
    struct norm_step *st = &nm->steps[nm->n];
    memset(st, 0, sizeof *st);
    for (size_t i = 0; i < sizeof simple_kinds / sizeof simple_kinds[0]; i++) {
        if (strcmp(ts, simple_kinds[i].name) == 0) {
            st->kind = simple_kinds[i].kind;
            nm->n++;
            return 0;
        }
    }
    if (strcmp(ts, "Strip") == 0) {
        const json_t *l = json_object_get(o, "strip_left"), *r = json_object_get(o, "strip_right");
        if (!json_is_boolean(l) || !json_is_boolean(r)) {
            LOG_ERR("%s: %s Strip: strip_left and strip_right must be booleans", what, where);
            return ERR_FORMAT;
        }
        st->kind = NORM_STRIP;
        st->left = json_is_true(l);
        st->right = json_is_true(r);
        nm->n++;
        return 0;
    }
    if (strcmp(ts, "Prepend") == 0) {
        const json_t *p = json_object_get(o, "prepend");
        if (!json_is_string(p)) {
            LOG_ERR("%s: %s Prepend: prepend is %s, not a string", what, where, jfield_type(p));
            return ERR_FORMAT;
        }
        st->kind = NORM_PREPEND;
        if (!(st->a = dup_str(p, &st->a_len)))
            goto oom;
        nm->n++;
        return 0;
    }
    if (strcmp(ts, "Replace") == 0) {
        const json_t *pat = json_object_get(o, "pattern"), *content = json_object_get(o, "content");
        const json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if (!json_is_object(pat) || json_object_size(pat) != 1 || !json_is_string(rx ? rx : lit) ||
            !json_is_string(content)) {
            LOG_ERR("%s: %s Replace: needs pattern {\"String\": s} or {\"Regex\": s} and a "
                    "string content", what, where);
            return ERR_FORMAT;
        }
        st->kind = NORM_REPLACE;
        if (!(st->b = dup_str(content, &st->b_len)))
            goto oom;
        nm->n++; /* owned from here: freed with nm on failure */
        if (lit) {
            if (json_string_length(lit) == 0) {
                LOG_ERR("%s: %s Replace: the String pattern is empty", what, where);
                return ERR_FORMAT;
            }
            if (!(st->a = dup_str(lit, &st->a_len)))
                goto oom;
            return 0;
        }
        if (json_string_length(rx) > TOK_PRE_MAX_PATTERN) {
            LOG_ERR("%s: %s Replace: the pattern is %zu bytes long (limit %u)", what, where,
                    json_string_length(rx), TOK_PRE_MAX_PATTERN);
            return ERR_RANGE;
        }
        int err;
        PCRE2_SIZE off;
        st->re = pcre2_compile((PCRE2_SPTR)json_string_value(rx), json_string_length(rx),
                               PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
        if (!st->re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(err, msg, sizeof msg);
            LOG_ERR("%s: %s Replace: regex refused at offset %zu: %s", what, where, (size_t)off,
                    (const char *)msg);
            return ERR_FORMAT;
        }
        return 0;
    }
    LOG_ERR("%s: %s %.64s is not supported (NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, "
            "Strip, Prepend, Replace or a Sequence of them)", what, where, ts);
    return ERR_UNSUPPORTED;
oom:
    LOG_ERR("%s: out of memory", what);
    return -ENOMEM;
}

/* A normalizer or a Sequence of them (nested Sequences flattened). */
static int parse_tree(const char *what, const char *where, const json_t *o, struct tok__norm *nm,
                      int depth)
{
    const json_t *type = json_object_get(o, "type");
    if (json_is_object(o) && json_is_string(type) &&
        strcmp(json_string_value(type), "Sequence") == 0) {
        const json_t *list = json_object_get(o, "normalizers");
        if (!json_is_array(list)) {
            LOG_ERR("%s: %s Sequence: normalizers is %s, not an array", what, where,
                    jfield_type(list));
            return ERR_FORMAT;
        }
        if (depth >= 4) {
            LOG_ERR("%s: %s: normalizer Sequences nested deeper than 4", what, where);
            return ERR_RANGE;
        }
        size_t i;
        const json_t *e;
        json_array_foreach(list, i, e) {
            char sub[96];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            int rc = parse_tree(what, sub, e, nm, depth + 1);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    return parse_one(what, where, o, nm);
}

int tok__norm_parse(const char *what, const json_t *hf, struct tok__norm **out)
{
    *out = NULL;
    struct tok__norm *nm = calloc(1, sizeof *nm);
    if (!nm || !(nm->doc = json_deep_copy(hf))) {
        free(nm);
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    int rc = parse_tree(what, "normalizer", hf, nm, 0);
    if (rc != 0) {
        tok__norm_free(nm);
        return rc;
    }
    *out = nm;
    return 0;
}

const json_t *tok__norm_json(const struct tok__norm *nm)
{
    return nm->doc;
}

/* ---------------------------------------------------------------------------------------- */
/* applying                                                                                 */

struct buf {
    char *p;
    size_t n, cap;
};

static bool put(struct buf *b, const void *p, size_t n)
{
    if (n == 0)
        return true;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return false;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return true;
}

static bool put_cp(struct buf *b, uint32_t cp)
{
    char c[4];
    return put(b, c, tok__utf8_encode(cp, c));
}

/* Rust's char::to_lowercase needs "cased" and "case-ignorable" for the final sigma; utf8proc
 * has no such properties: approximated by case mappings and the categories that carry none. */
static bool cased(uint32_t cp)
{
    return utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
           utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
           utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_LT;
}

static bool case_ignorable(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME ||
           c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_LM ||
           c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == '.' || cp == ':' ||
           cp == 0x00B7 || cp == 0x2019;
}

/* Σ at [i, i+2) is word-final: a cased letter before it and none after it (skipping
 * case-ignorable characters), Unicode's Final_Sigma as Rust's str::to_lowercase applies it. */
static bool final_sigma(const unsigned char *p, size_t n, size_t i)
{
    bool before = false;
    for (size_t j = i; j > 0;) {
        size_t k = j - 1;
        while (k > 0 && (p[k] & 0xC0) == 0x80)
            k--;
        uint32_t cp = tok__utf8_decode(p + k, j - k);
        j = k;
        if (case_ignorable(cp))
            continue;
        before = cased(cp);
        break;
    }
    if (!before)
        return false;
    for (size_t j = i + 2; j < n;) {
        size_t l = tok__utf8_len(p + j, n - j);
        uint32_t cp = tok__utf8_decode(p + j, l);
        j += l;
        if (case_ignorable(cp))
            continue;
        return !cased(cp);
    }
    return true;
}

static bool is_mark(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

/* Per character: Lowercase or StripAccents. */
static bool map_chars(const struct norm_step *st, const char *in, size_t n, struct buf *o)
{
    const unsigned char *p = (const unsigned char *)in;
    for (size_t i = 0; i < n;) {
        size_t l = tok__utf8_len(p + i, n - i);
        uint32_t cp = tok__utf8_decode(p + i, l);
        bool ok = true;
        if (st->kind == NORM_STRIP_ACCENTS) {
            ok = is_mark(cp) || put(o, p + i, l);
        } else if (cp == 0x0130) { /* İ: the one unconditional multi-character lowercase */
            ok = put(o, "i\xCC\x87", 3);
        } else if (cp == 0x03A3) {
            ok = put_cp(o, final_sigma(p, n, i) ? 0x03C2 : 0x03C3);
        } else {
            ok = put_cp(o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        }
        if (!ok)
            return false;
        i += l;
    }
    return true;
}

static bool replace(const struct norm_step *st, const char *p, size_t n, struct buf *o)
{
    if (!st->re) {
        size_t i = 0;
        while (i < n) {
            const char *m = n - i >= st->a_len ? memmem(p + i, n - i, st->a, st->a_len) : NULL;
            if (!m)
                break;
            if (!put(o, p + i, (size_t)(m - (p + i))) || !put(o, st->b, st->b_len))
                return false;
            i = (size_t)(m - p) + st->a_len;
        }
        return put(o, p + i, n - i);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->re, NULL);
    if (!md)
        return false;
    bool ok = true;
    size_t i = 0, copied = 0;
    while (ok && i <= n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)p, n, i, 0, md, NULL);
        if (rc < 0) /* no match, or a limit: the rest stays as it is */
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        ok = put(o, p + copied, ov[0] - copied) && put(o, st->b, st->b_len);
        copied = ov[1];
        if (ov[1] > ov[0]) {
            i = ov[1];
        } else { /* an empty match: step over one character */
            if (ov[1] >= n)
                break;
            size_t l = tok__utf8_len((const unsigned char *)p + ov[1], n - ov[1]);
            ok = ok && put(o, p + ov[1], l);
            copied = ov[1] + l;
            i = copied;
        }
    }
    pcre2_match_data_free(md);
    return ok && put(o, p + copied, n - copied);
}

static size_t strip_left_len(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t l = tok__utf8_len((const unsigned char *)p + i, n - i);
        if (!tok__is_space(tok__utf8_decode((const unsigned char *)p + i, l)))
            break;
        i += l;
    }
    return i;
}

size_t tok__trailing_space(const char *p, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t k = end - 1;
        while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80)
            k--;
        if (!tok__is_space(tok__utf8_decode((const unsigned char *)p + k, end - k)))
            break;
        end = k;
    }
    return n - end;
}

size_t tok__leading_space(const char *p, size_t n)
{
    return strip_left_len(p, n);
}

/* One step from in[0..n) into o (emptied first). */
static int apply_step(const struct norm_step *st, const char *in, size_t n, struct buf *o)
{
    o->n = 0;
    if (n == 0) /* every step leaves empty text empty (Prepend too, as Hugging Face's) */
        return 0;
    bool ok = true;
    switch (st->kind) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD: {
        utf8proc_option_t opt = UTF8PROC_STABLE;
        opt |= st->kind == NORM_NFC || st->kind == NORM_NFKC ? UTF8PROC_COMPOSE
                                                             : UTF8PROC_DECOMPOSE;
        if (st->kind == NORM_NFKC || st->kind == NORM_NFKD)
            opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n,
                                          &dst, opt);
        if (r < 0) { /* valid UTF-8 in: only memory can fail */
            free(dst);
            return r == UTF8PROC_ERROR_NOMEM ? -ENOMEM : ERR_FORMAT;
        }
        ok = put(o, dst, (size_t)r);
        free(dst);
        break;
    }
    case NORM_LOWERCASE:
    case NORM_STRIP_ACCENTS:
        ok = map_chars(st, in, n, o);
        break;
    case NORM_PREPEND:
        ok = n == 0 || (put(o, st->a, st->a_len) && put(o, in, n));
        break;
    case NORM_REPLACE:
        ok = replace(st, in, n, o);
        break;
    case NORM_STRIP: {
        size_t l = st->left ? strip_left_len(in, n) : 0;
        size_t r = st->right ? tok__trailing_space(in + l, n - l) : 0;
        ok = put(o, in + l, n - l - r);
        break;
    }
    }
    return ok ? 0 : -ENOMEM;
}

int tok__norm_apply(const struct tok__norm *nm, const char *p, size_t n, char **out,
                    size_t *out_len)
{
    struct buf cur = {0}, next = {0};
    int rc = put(&cur, p, n) ? 0 : -ENOMEM;
    for (uint32_t i = 0; i < nm->n && rc == 0; i++) {
        rc = apply_step(&nm->steps[i], cur.p, cur.n, &next);
        struct buf t = cur;
        cur = next;
        next = t;
    }
    free(next.p);
    if (rc == 0 && !cur.p && !(cur.p = malloc(1))) /* a valid pointer even when empty */
        rc = -ENOMEM;
    if (rc != 0) {
        free(cur.p);
        return rc;
    }
    *out = cur.p;
    *out_len = cur.n;
    return 0;
}
