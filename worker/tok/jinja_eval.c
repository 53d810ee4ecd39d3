/*
 * jinja_eval.c — the evaluator of the Jinja2 interpreter (jinja.h): renders the syntax tree of
 * jinja_parse.c with Python's semantics where templates can see them (str() of values, ==
 * across int/float/bool, floor division, negative indices and slices, truthiness), jinja2's
 * scoping (a for loop's body starts each iteration from the enclosing scope, so a `set` in it
 * never leaks; `if` opens no scope; a macro sees the template's top level at call time) and
 * its Undefined (prints as "", iterates as empty, fails when an attribute of it is taken).
 *
 * Values are JSON (jansson) wherever Python would hold a str/int/float/bool/None/list/dict,
 * so a request's messages and tools are used as they are; namespaces, macros, bound methods,
 * the loop object and Undefined are the few kinds JSON cannot hold.
 */
#include "jinja.h"
#include "jinja_internal.h"

#include "err.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEF_MAX_OUTPUT (8u << 20)
#define DEF_MAX_STEPS 50000000ull
#define DEF_MAX_DEPTH 64u
#define MAX_SEQ (1u << 20) /* elements a range() / repetition may build */

/* ---- names the parser accepts ------------------------------------------------------------ */

static const char *const FILTERS[] = {
    "trim", "tojson", "length", "count", "join", "reject", "select", "selectattr", "rejectattr",
    "map", "list", "items", "string", "first", "last", "default", "d", "upper", "lower",
    "capitalize", "replace", "int", "float", "abs", "safe", "reverse", NULL};
static const char *const TESTS[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
    "iterable", "sequence", "boolean", "true", "false", "equalto", "eq", "ne", "odd", "even",
    "divisibleby", "in", "callable", "sameas", "lt", "gt", "le", "ge", NULL};
static const char *const METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
    "replace", "find", "items", "keys", "values", "get", "capitalize", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], s))
            return 1;
    return 0;
}
int jinja__known_filter(const char *n) { return in_list(FILTERS, n); }
int jinja__known_test(const char *n) { return in_list(TESTS, n); }
int jinja__known_method(const char *n) { return in_list(METHODS, n); }

/* Python's attribute names of str / dict / list: `x.name` yields the method, not the key. */
static const char *const STR_ATTRS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
    "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix",
    "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip",
    "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper",
    "zfill", NULL};
static const char *const DICT_ATTRS[] = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                         "pop", "popitem", "setdefault", "update", "values",
                                         NULL};
static const char *const LIST_ATTRS[] = {"append", "clear", "copy", "count", "extend", "index",
                                         "insert", "pop", "remove", "reverse", "sort", NULL};

/* ---- values ------------------------------------------------------------------------------- */

enum jv_kind { JV_UNDEF, JV_JSON, JV_NS, JV_MACRO, JV_FUNC, JV_METHOD, JV_LOOP };
enum jv_func { FN_NAMESPACE = 1, FN_RAISE, FN_STRFTIME, FN_RANGE, FN_DICT };

struct jv;
struct ns {
    int refs;
    size_t n, cap;
    const char **keys; /* names from the syntax tree, which outlives the render */
    struct jv *vals;
};

struct loopst {
    size_t index0, length;
    json_t *items; /* the (filtered) sequence */
};

struct jv {
    enum jv_kind k;
    json_t *j;          /* JSON: the value; METHOD: the receiver */
    struct ns *ns;      /* NS */
    const struct jn *m; /* MACRO */
    int fn;             /* FUNC */
    const char *name;   /* METHOD: its name; UNDEF: what was looked up (for messages) */
    struct loopst *loop;
};

static const struct jv UNDEF = {.k = JV_UNDEF};

static void jv_drop(struct jv *v);
static struct jv jv_copy(const struct jv *v)
{
    struct jv c = *v;
    if (c.j)
        json_incref(c.j);
    if (c.ns)
        c.ns->refs++;
    return c;
}

static void ns_drop(struct ns *ns)
{
    if (!ns || --ns->refs > 0)
        return;
    for (size_t i = 0; i < ns->n; i++)
        jv_drop(&ns->vals[i]);
    free(ns->keys);
    free(ns->vals);
    free(ns);
}

static void jv_drop(struct jv *v)
{
    if (v->j)
        json_decref(v->j);
    ns_drop(v->ns);
    *v = UNDEF;
}

/* Takes ownership of j (NULL: out of memory, reported by the caller's check). */
static struct jv jv_json(json_t *j)
{
    struct jv v = {.k = JV_JSON, .j = j};
    return v;
}

/* ---- render state ------------------------------------------------------------------------- */

struct var {
    const char *name;
    struct jv v;
};

struct frame {
    struct frame *parent;
    struct var *vars;
    size_t n, cap;
};

struct buf {
    char *p;
    size_t n, cap;
};

struct ev {
    json_t *ctx;
    struct frame *root;
    struct buf *out;
    size_t max_output;
    uint64_t steps, max_steps;
    uint32_t depth, max_depth;
    time_t now;
    int rc;
    char *err;
    size_t errcap;
};

static int ev_fail(struct ev *e, int rc, const struct jn *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ev_fail(struct ev *e, int rc, const struct jn *n, const char *fmt, ...)
{
    if (e->rc == 0) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (n)
            snprintf(e->err, e->errcap, "template line %d: %s", n->line, msg);
        else
            snprintf(e->err, e->errcap, "%s", msg);
        e->rc = rc;
    }
    return e->rc;
}

static int oom(struct ev *e, const struct jn *n) { return ev_fail(e, -ENOMEM, n, "out of memory"); }

static int buf_add(struct ev *e, struct buf *b, const char *s, size_t n, const struct jn *at)
{
    if (b->n + n > e->max_output)
        return ev_fail(e, ERR_RANGE, at, "the rendered text exceeds %zu bytes", e->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return oom(e, at);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int bufs(struct ev *e, struct buf *b, const char *s, const struct jn *at)
{
    return buf_add(e, b, s, strlen(s), at);
}

static int frame_set(struct ev *e, struct frame *f, const char *name, struct jv v,
                     const struct jn *at)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->vars[i].name, name)) {
            jv_drop(&f->vars[i].v);
            f->vars[i].v = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 8;
        struct var *nv = realloc(f->vars, nc * sizeof *nv);
        if (!nv) {
            jv_drop(&v);
            return oom(e, at);
        }
        f->vars = nv;
        f->cap = nc;
    }
    f->vars[f->n].name = name;
    f->vars[f->n].v = v;
    f->n++;
    return 0;
}

static void frame_fini(struct frame *f)
{
    for (size_t i = 0; i < f->n; i++)
        jv_drop(&f->vars[i].v);
    free(f->vars);
}

/* The value of a name: the innermost frame that has it, then the render's variables, then the
 * globals. */
static struct jv lookup(struct ev *e, struct frame *f, const char *name)
{
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (!strcmp(f->vars[i].name, name))
                return jv_copy(&f->vars[i].v);
    json_t *j = json_object_get(e->ctx, name);
    if (j)
        return jv_json(json_incref(j));
    struct jv g = {.k = JV_FUNC};
    if (!strcmp(name, "namespace"))
        g.fn = FN_NAMESPACE;
    else if (!strcmp(name, "raise_exception"))
        g.fn = FN_RAISE;
    else if (!strcmp(name, "strftime_now"))
        g.fn = FN_STRFTIME;
    else if (!strcmp(name, "range"))
        g.fn = FN_RANGE;
    else if (!strcmp(name, "dict"))
        g.fn = FN_DICT;
    else {
        g = UNDEF;
        g.name = name;
    }
    return g;
}

/* ---- Python's str() and repr() ------------------------------------------------------------ */

/* float.__repr__: the shortest digits that read back, fixed notation for exponents -4..15. */
static void py_float(double d, char *out, size_t cap)
{
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *s = tmp;
    bool neg = *s == '-';
    if (neg)
        s++;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    size_t o = 0;
    char r[96];
    if (neg)
        r[o++] = '-';
    if (exp >= -5 && exp < 16) {
        /* Python switches to exponent form below 1e-4 (repr(0.0001) == '0.0001') */
        if (exp < -4)
            goto sci;
        if (exp < 0) {
            r[o++] = '0';
            r[o++] = '.';
            for (int k = 0; k < -exp - 1; k++)
                r[o++] = '0';
            for (size_t k = 0; k < nd; k++)
                r[o++] = digits[k];
        } else {
            for (int k = 0; k <= exp; k++)
                r[o++] = (size_t)k < nd ? digits[k] : '0';
            r[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t k = (size_t)exp + 1; k < nd; k++)
                    r[o++] = digits[k];
            else
                r[o++] = '0';
        }
        r[o] = 0;
        snprintf(out, cap, "%s", r);
        return;
    }
sci:
    r[o++] = digits[0];
    if (nd > 1) {
        r[o++] = '.';
        for (size_t k = 1; k < nd; k++)
            r[o++] = digits[k];
    }
    r[o] = 0;
    snprintf(out, cap, "%se%c%02d", r, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
}

static int py_repr(struct ev *e, struct buf *b, json_t *j, const struct jn *at, int depth);

static int py_repr_str(struct ev *e, struct buf *b, const char *s, size_t n, const struct jn *at)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (buf_add(e, b, &q, 1, at))
        return e->rc;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '\\' || c == (unsigned char)q) {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = 0;
        } else if (c == '\n') {
            strcpy(esc, "\\n");
        } else if (c == '\r') {
            strcpy(esc, "\\r");
        } else if (c == '\t') {
            strcpy(esc, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
        } else if (c >= 0x80) {
            /* Python escapes non-printable code points in repr; templates print ASCII
             * structures, and guessing Unicode printability would be wrong */
            unsigned cp = c;
            if (c >= 0xC2 && c <= 0xDF && i + 1 < n)
                cp = ((c & 0x1Fu) << 6) | ((unsigned char)s[i + 1] & 0x3Fu);
            if (cp < 0xA0)
                return ev_fail(e, ERR_UNSUPPORTED, at,
                               "repr() of a string with a control character above 0x7f");
            esc[0] = (char)c;
            esc[1] = 0;
        } else {
            esc[0] = (char)c;
            esc[1] = 0;
        }
        if (bufs(e, b, esc, at))
            return e->rc;
    }
    return buf_add(e, b, &q, 1, at);
}

/* str(x) of a JSON value, appended to b. */
static int py_str(struct ev *e, struct buf *b, json_t *j, const struct jn *at, int depth)
{
    char num[64];
    switch (json_typeof(j)) {
    case JSON_STRING:
        return buf_add(e, b, json_string_value(j), json_string_length(j), at);
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        return bufs(e, b, num, at);
    case JSON_REAL:
        py_float(json_real_value(j), num, sizeof num);
        return bufs(e, b, num, at);
    case JSON_TRUE:
        return bufs(e, b, "True", at);
    case JSON_FALSE:
        return bufs(e, b, "False", at);
    case JSON_NULL:
        return bufs(e, b, "None", at);
    default:
        return py_repr(e, b, j, at, depth);
    }
}

static int py_repr(struct ev *e, struct buf *b, json_t *j, const struct jn *at, int depth)
{
    if (depth > 200)
        return ev_fail(e, ERR_RANGE, at, "a value nested deeper than 200");
    if (json_is_string(j))
        return py_repr_str(e, b, json_string_value(j), json_string_length(j), at);
    if (json_is_array(j)) {
        if (bufs(e, b, "[", at))
            return e->rc;
        for (size_t i = 0; i < json_array_size(j); i++)
            if ((i && bufs(e, b, ", ", at)) ||
                py_repr(e, b, json_array_get(j, i), at, depth + 1))
                return e->rc;
        return bufs(e, b, "]", at);
    }
    if (json_is_object(j)) {
        if (bufs(e, b, "{", at))
            return e->rc;
        const char *k;
        json_t *v;
        bool first = true;
        json_object_foreach(j, k, v) {
            if ((!first && bufs(e, b, ", ", at)) || py_repr_str(e, b, k, strlen(k), at) ||
                bufs(e, b, ": ", at) || py_repr(e, b, v, at, depth + 1))
                return e->rc;
            first = false;
        }
        return bufs(e, b, "}", at);
    }
    return py_str(e, b, j, at, depth);
}

/* str(v) of any value (Undefined: ""). */
static int jv_str(struct ev *e, struct buf *b, const struct jv *v, const struct jn *at)
{
    switch (v->k) {
    case JV_UNDEF:
        return 0;
    case JV_JSON:
        return py_str(e, b, v->j, at, 0);
    case JV_NS:
        return ev_fail(e, ERR_UNSUPPORTED, at, "printing a namespace object");
    default:
        return ev_fail(e, ERR_UNSUPPORTED, at, "printing a %s",
                       v->k == JV_METHOD ? "method" : v->k == JV_LOOP ? "loop object"
                                                                      : "function or macro");
    }
}

/* A new JSON string holding str(v). */
static int jv_to_string(struct ev *e, const struct jv *v, struct jv *out, const struct jn *at)
{
    if (v->k == JV_JSON && json_is_string(v->j)) {
        *out = jv_copy(v);
        return 0;
    }
    struct buf b = {0};
    if (jv_str(e, &b, v, at)) {
        free(b.p);
        return e->rc;
    }
    *out = jv_json(json_stringn_nocheck(b.p ? b.p : "", b.n));
    free(b.p);
    return out->j ? 0 : oom(e, at);
}

/* ---- json.dumps as Hugging Face's tojson calls it ----------------------------------------- */

struct dumpopt {
    int indent; /* < 0: none */
    const char *item_sep, *key_sep;
    bool sort_keys, ensure_ascii;
};

static int dump_str(struct ev *e, struct buf *b, const char *s, size_t n, bool ascii,
                    const struct jn *at)
{
    if (bufs(e, b, "\"", at))
        return e->rc;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[16];
        if (c == '"')
            strcpy(esc, "\\\"");
        else if (c == '\\')
            strcpy(esc, "\\\\");
        else if (c == '\n')
            strcpy(esc, "\\n");
        else if (c == '\r')
            strcpy(esc, "\\r");
        else if (c == '\t')
            strcpy(esc, "\\t");
        else if (c == '\b')
            strcpy(esc, "\\b");
        else if (c == '\f')
            strcpy(esc, "\\f");
        else if (c < 0x20 || (ascii && c == 0x7f))
            snprintf(esc, sizeof esc, "\\u%04x", c);
        else if (ascii && c >= 0x80) {
            /* jansson strings are valid UTF-8 */
            unsigned cp;
            int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
            for (int k = 1; k < len && i + (size_t)k < n; k++)
                cp = (cp << 6) | ((unsigned char)s[i + (size_t)k] & 0x3F);
            i += (size_t)len - 1;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                         0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
        } else {
            esc[0] = (char)c;
            esc[1] = 0;
        }
        if (bufs(e, b, esc, at))
            return e->rc;
    }
    return bufs(e, b, "\"", at);
}

static int newline_indent(struct ev *e, struct buf *b, const struct dumpopt *o, int level,
                          const struct jn *at)
{
    if (bufs(e, b, "\n", at))
        return e->rc;
    for (int k = 0; k < o->indent * level; k++)
        if (bufs(e, b, " ", at))
            return e->rc;
    return 0;
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int dump(struct ev *e, struct buf *b, json_t *j, const struct dumpopt *o, int level,
                const struct jn *at)
{
    if (level > 200)
        return ev_fail(e, ERR_RANGE, at, "a value nested deeper than 200");
    char num[64];
    switch (json_typeof(j)) {
    case JSON_STRING:
        return dump_str(e, b, json_string_value(j), json_string_length(j), o->ensure_ascii, at);
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        return bufs(e, b, num, at);
    case JSON_REAL:
        py_float(json_real_value(j), num, sizeof num);
        return bufs(e, b, num, at);
    case JSON_TRUE:
        return bufs(e, b, "true", at);
    case JSON_FALSE:
        return bufs(e, b, "false", at);
    case JSON_NULL:
        return bufs(e, b, "null", at);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (n == 0)
            return bufs(e, b, "[]", at);
        if (bufs(e, b, "[", at))
            return e->rc;
        for (size_t i = 0; i < n; i++) {
            if (i && bufs(e, b, o->item_sep, at))
                return e->rc;
            if (o->indent >= 0 && newline_indent(e, b, o, level + 1, at))
                return e->rc;
            if (dump(e, b, json_array_get(j, i), o, level + 1, at))
                return e->rc;
        }
        if (o->indent >= 0 && newline_indent(e, b, o, level, at))
            return e->rc;
        return bufs(e, b, "]", at);
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        if (n == 0)
            return bufs(e, b, "{}", at);
        const char **keys = malloc(n * sizeof *keys);
        if (!keys)
            return oom(e, at);
        size_t k = 0;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) keys[k++] = key;
        if (o->sort_keys)
            qsort(keys, n, sizeof *keys, cmp_keys);
        int rc = bufs(e, b, "{", at);
        for (size_t i = 0; i < n && !rc; i++) {
            if (i && bufs(e, b, o->item_sep, at))
                break;
            if (o->indent >= 0 && newline_indent(e, b, o, level + 1, at))
                break;
            if (dump_str(e, b, keys[i], strlen(keys[i]), o->ensure_ascii, at) ||
                bufs(e, b, o->key_sep, at) ||
                dump(e, b, json_object_get(j, keys[i]), o, level + 1, at))
                break;
        }
        free(keys);
        if (e->rc)
            return e->rc;
        if (o->indent >= 0 && newline_indent(e, b, o, level, at))
            return e->rc;
        return bufs(e, b, "}", at);
    }
    }
    return ev_fail(e, ERR_STATE, at, "unknown JSON type");
}

/* ---- Python semantics --------------------------------------------------------------------- */

static bool truthy(const struct jv *v)
{
    switch (v->k) {
    case JV_UNDEF:
        return false;
    case JV_JSON:
        switch (json_typeof(v->j)) {
        case JSON_STRING: return json_string_length(v->j) > 0;
        case JSON_INTEGER: return json_integer_value(v->j) != 0;
        case JSON_REAL: return json_real_value(v->j) != 0.0;
        case JSON_TRUE: return true;
        case JSON_FALSE: return false;
        case JSON_NULL: return false;
        case JSON_ARRAY: return json_array_size(v->j) > 0;
        case JSON_OBJECT: return json_object_size(v->j) > 0;
        }
        return false;
    default:
        return true;
    }
}

/* int, bool (Python's bool is an int) or float */
static bool is_num(json_t *j)
{
    return json_is_integer(j) || json_is_real(j) || json_is_boolean(j);
}
static bool is_int(json_t *j) { return json_is_integer(j) || json_is_boolean(j); }
static long long int_of(json_t *j)
{
    return json_is_boolean(j) ? json_is_true(j) : (long long)json_integer_value(j);
}
static double num_of(json_t *j) { return json_is_real(j) ? json_real_value(j) : (double)int_of(j); }

static bool json_py_eq(json_t *a, json_t *b, int depth)
{
    if (depth > 200)
        return false;
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            return int_of(a) == int_of(b);
        return num_of(a) == num_of(b);
    }
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_NULL:
        return true;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!json_py_eq(json_array_get(a, i), json_array_get(b, i), depth + 1))
                return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!w || !json_py_eq(v, w, depth + 1))
                return false;
        }
        return true;
    }
    default:
        return false;
    }
}

static bool py_eq(const struct jv *a, const struct jv *b)
{
    if (a->k == JV_UNDEF || b->k == JV_UNDEF)
        return a->k == b->k;
    if (a->k == JV_JSON && b->k == JV_JSON)
        return json_py_eq(a->j, b->j, 0);
    if (a->k == JV_NS && b->k == JV_NS)
        return a->ns == b->ns;
    return false;
}

static const char *type_name(const struct jv *v)
{
    switch (v->k) {
    case JV_UNDEF: return "undefined";
    case JV_NS: return "namespace";
    case JV_MACRO: return "macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "method";
    case JV_LOOP: return "loop";
    case JV_JSON: break;
    }
    switch (json_typeof(v->j)) {
    case JSON_STRING: return "str";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    case JSON_NULL: return "NoneType";
    case JSON_ARRAY: return "list";
    case JSON_OBJECT: return "dict";
    }
    return "?";
}

static int undef_err(struct ev *e, const struct jv *v, const struct jn *at)
{
    return ev_fail(e, ERR_USAGE, at, "'%s' is undefined", v->name ? v->name : "value");
}

/* Byte offsets of the code points of a UTF-8 string: off[0..n], off[n] == len. */
static size_t *cp_offsets(const char *s, size_t len, size_t *n)
{
    size_t *off = malloc((len + 1) * sizeof *off);
    if (!off)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            off[k++] = i;
    off[k] = len;
    *n = k;
    return off;
}

static size_t cp_count(const char *s, size_t len)
{
    size_t k = 0;
    for (size_t i = 0; i < len; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Python's str.isspace() code points (ASCII, C1 and the Unicode Zs/Zl/Zp ones) at s[i]:
 * their byte length, or 0. */
static size_t space_at(const char *s, size_t len, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f))
        return 1;
    if (c < 0x80)
        return 0;
    unsigned cp = 0;
    size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (i + l > len)
        return 0;
    cp = c & (l == 4 ? 0x07 : l == 3 ? 0x0F : 0x1F);
    for (size_t k = 1; k < l; k++)
        cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
    if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
        cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
        return l;
    return 0;
}

/* strip/lstrip/rstrip: chars NULL for whitespace, else a set of (ASCII) bytes */
static json_t *py_strip(const char *s, size_t len, const char *chars, size_t nchars, bool l,
                        bool r)
{
    size_t a = 0, b = len;
    if (chars) {
        while (l && a < b && memchr(chars, s[a], nchars))
            a++;
        while (r && b > a && memchr(chars, s[b - 1], nchars))
            b--;
    } else {
        for (size_t w; l && a < b && (w = space_at(s, len, a)) > 0;)
            a += w;
        while (r && b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80)
                k--;
            size_t w = space_at(s, len, k);
            if (!w || k + w != b)
                break;
            b = k;
        }
    }
    return json_stringn_nocheck(s + a, b - a);
}

static int ascii_only(struct ev *e, const char *s, size_t n, const char *what, const struct jn *at)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return ev_fail(e, ERR_UNSUPPORTED, at, "%s of non-ASCII text", what);
    return 0;
}

static json_t *case_map(const char *s, size_t n, int mode /* 0 lower 1 upper 2 capitalize */)
{
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool up = mode == 1 || (mode == 2 && i == 0);
        if (up && c >= 'a' && c <= 'z')
            c = (char)(c - 32);
        else if (!up && c >= 'A' && c <= 'Z')
            c = (char)(c + 32);
        t[i] = c;
    }
    json_t *j = json_stringn_nocheck(t, n);
    free(t);
    return j;
}

static json_t *str_replace(const char *s, size_t n, const char *a, size_t na, const char *b,
                           size_t nb, long long count, size_t cap)
{
    struct buf o = {0};
    struct ev tmp = {.max_output = cap};
    size_t i = 0;
    long long done = 0;
    if (na == 0) {
        /* Python inserts b between every code point (and at both ends) */
        for (size_t k = 0; k <= n; k++) {
            bool boundary = k == n || ((unsigned char)s[k] & 0xC0) != 0x80;
            if (boundary && (count < 0 || done < count)) {
                if (buf_add(&tmp, &o, b, nb, NULL))
                    break;
                done++;
            }
            if (k < n && buf_add(&tmp, &o, s + k, 1, NULL))
                break;
        }
    } else {
        while (i < n) {
            if ((count < 0 || done < count) && i + na <= n && !memcmp(s + i, a, na)) {
                if (buf_add(&tmp, &o, b, nb, NULL))
                    break;
                i += na;
                done++;
            } else {
                if (buf_add(&tmp, &o, s + i, 1, NULL))
                    break;
                i++;
            }
        }
    }
    json_t *j = tmp.rc ? NULL : json_stringn_nocheck(o.p ? o.p : "", o.n);
    free(o.p);
    return j;
}

/* ---- evaluation --------------------------------------------------------------------------- */

static int eval(struct ev *e, struct frame *f, const struct jn *n, struct jv *out);
static int exec_body(struct ev *e, struct frame *f, const struct jn *b);

static int step(struct ev *e, const struct jn *at)
{
    if (++e->steps > e->max_steps)
        return ev_fail(e, ERR_RANGE, at, "the template ran more than %llu steps",
                       (unsigned long long)e->max_steps);
    return 0;
}

/* An attribute of v (jinja2's sandboxed getattr: Python attribute first, then the key). */
static int get_attr(struct ev *e, const struct jv *v, const char *name, struct jv *out,
                    const struct jn *at)
{
    *out = UNDEF;
    out->name = name;
    if (v->k == JV_UNDEF)
        return undef_err(e, v, at);
    if (v->k == JV_NS) {
        for (size_t i = 0; i < v->ns->n; i++)
            if (!strcmp(v->ns->keys[i], name)) {
                *out = jv_copy(&v->ns->vals[i]);
                return 0;
            }
        return 0;
    }
    if (v->k == JV_LOOP) {
        const struct loopst *l = v->loop;
        long long r = -1;
        if (!strcmp(name, "index")) r = (long long)l->index0 + 1;
        else if (!strcmp(name, "index0")) r = (long long)l->index0;
        else if (!strcmp(name, "revindex")) r = (long long)(l->length - l->index0);
        else if (!strcmp(name, "revindex0")) r = (long long)(l->length - l->index0 - 1);
        else if (!strcmp(name, "length")) r = (long long)l->length;
        else if (!strcmp(name, "first")) { *out = jv_json(json_boolean(l->index0 == 0)); return 0; }
        else if (!strcmp(name, "last")) {
            *out = jv_json(json_boolean(l->index0 + 1 == l->length));
            return 0;
        } else if (!strcmp(name, "previtem")) {
            if (l->index0 > 0)
                *out = jv_json(json_incref(json_array_get(l->items, l->index0 - 1)));
            return 0;
        } else if (!strcmp(name, "nextitem")) {
            if (l->index0 + 1 < l->length)
                *out = jv_json(json_incref(json_array_get(l->items, l->index0 + 1)));
            return 0;
        } else if (!strcmp(name, "depth")) r = 1;
        else if (!strcmp(name, "depth0")) r = 0;
        else
            return ev_fail(e, ERR_UNSUPPORTED, at, "loop.%s", name);
        *out = jv_json(json_integer(r));
        return out->j ? 0 : oom(e, at);
    }
    if (v->k != JV_JSON)
        return 0;
    const char *const *attrs = json_is_string(v->j) ? STR_ATTRS : json_is_object(v->j) ? DICT_ATTRS
                               : json_is_array(v->j) ? LIST_ATTRS : NULL;
    if (attrs && in_list(attrs, name)) {
        out->k = JV_METHOD;
        out->j = json_incref(v->j);
        out->name = name;
        return 0;
    }
    if (json_is_object(v->j)) {
        json_t *x = json_object_get(v->j, name);
        if (x)
            *out = jv_json(json_incref(x));
    }
    return 0;
}

/* v[key] (jinja2's sandboxed getitem: the item first, then a string key as an attribute). */
static int get_item(struct ev *e, const struct jv *v, const struct jv *key, struct jv *out,
                    const struct jn *at)
{
    *out = UNDEF;
    if (v->k == JV_UNDEF)
        return undef_err(e, v, at);
    if (key->k == JV_UNDEF && v->k == JV_JSON && !json_is_object(v->j))
        return 0;
    bool skey = key->k == JV_JSON && json_is_string(key->j);
    if (v->k == JV_JSON && key->k == JV_JSON) {
        json_t *j = v->j, *k = key->j;
        if (json_is_object(j) && skey) {
            json_t *x = json_object_get(j, json_string_value(k));
            if (x) {
                *out = jv_json(json_incref(x));
                return 0;
            }
        } else if ((json_is_array(j) || json_is_string(j)) && is_int(k)) {
            long long i = int_of(k);
            if (json_is_array(j)) {
                long long n = (long long)json_array_size(j);
                if (i < 0)
                    i += n;
                if (i >= 0 && i < n)
                    *out = jv_json(json_incref(json_array_get(j, (size_t)i)));
                return 0;
            }
            size_t n;
            size_t *off = cp_offsets(json_string_value(j), json_string_length(j), &n);
            if (!off)
                return oom(e, at);
            if (i < 0)
                i += (long long)n;
            if (i >= 0 && i < (long long)n)
                *out = jv_json(json_stringn_nocheck(json_string_value(j) + off[i],
                                                    off[i + 1] - off[i]));
            free(off);
            return 0;
        }
    }
    if (skey) {
        /* an attribute of that name: ns members, loop fields, methods; never a missing key */
        struct jv a;
        if (v->k == JV_JSON && json_is_object(v->j) &&
            !in_list(DICT_ATTRS, json_string_value(key->j)))
            return 0;
        if (get_attr(e, v, json_string_value(key->j), &a, at))
            return e->rc;
        *out = a;
    }
    return 0;
}

/* Python's slice index normalization (PySlice_AdjustIndices). */
static int slice_of(struct ev *e, const struct jv *v, const struct jv *lo, const struct jv *hi,
                    const struct jv *st, struct jv *out, const struct jn *at)
{
    if (v->k == JV_UNDEF)
        return undef_err(e, v, at);
    if (v->k != JV_JSON || (!json_is_array(v->j) && !json_is_string(v->j)))
        return ev_fail(e, ERR_USAGE, at, "cannot slice a %s", type_name(v));
    const struct jv *b3[3] = {lo, hi, st};
    long long val[3];
    bool has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = b3[k]->k == JV_JSON && !json_is_null(b3[k]->j);
        if (has[k] && !is_int(b3[k]->j))
            return ev_fail(e, ERR_USAGE, at, "slice indices must be integers");
        if (b3[k]->k != JV_JSON && b3[k]->k != JV_UNDEF)
            return ev_fail(e, ERR_USAGE, at, "slice indices must be integers");
        val[k] = has[k] ? int_of(b3[k]->j) : 0;
    }
    long long stepv = has[2] ? val[2] : 1;
    if (stepv == 0)
        return ev_fail(e, ERR_USAGE, at, "slice step cannot be zero");
    bool str = json_is_string(v->j);
    size_t n;
    size_t *off = NULL;
    if (str) {
        off = cp_offsets(json_string_value(v->j), json_string_length(v->j), &n);
        if (!off)
            return oom(e, at);
    } else {
        n = json_array_size(v->j);
    }
    long long len = (long long)n;
    long long start, stop;
    if (!has[0]) {
        start = stepv < 0 ? len - 1 : 0;
    } else {
        start = val[0];
        if (start < 0) {
            start += len;
            if (start < 0)
                start = stepv < 0 ? -1 : 0;
        } else if (start >= len) {
            start = stepv < 0 ? len - 1 : len;
        }
    }
    if (!has[1]) {
        stop = stepv < 0 ? -1 : len;
    } else {
        stop = val[1];
        if (stop < 0) {
            stop += len;
            if (stop < 0)
                stop = stepv < 0 ? -1 : 0;
        } else if (stop >= len) {
            stop = stepv < 0 ? len - 1 : len;
        }
    }
    json_t *r;
    if (str) {
        struct buf b = {0};
        for (long long i = start; stepv > 0 ? i < stop : i > stop; i += stepv)
            if (buf_add(e, &b, json_string_value(v->j) + off[i], off[i + 1] - off[i], at))
                break;
        r = e->rc ? NULL : json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        free(off);
    } else {
        r = json_array();
        for (long long i = start; r && (stepv > 0 ? i < stop : i > stop); i += stepv)
            if (json_array_append(r, json_array_get(v->j, (size_t)i))) {
                json_decref(r);
                r = NULL;
            }
    }
    if (e->rc)
        return e->rc;
    if (!r)
        return oom(e, at);
    *out = jv_json(r);
    return 0;
}

/* The elements a for loop / filter iterates over: a new JSON array. */
static int iter_list(struct ev *e, const struct jv *v, json_t **out, const struct jn *at)
{
    *out = NULL;
    if (v->k == JV_UNDEF) {
        *out = json_array();
        return *out ? 0 : oom(e, at);
    }
    if (v->k != JV_JSON)
        return ev_fail(e, ERR_USAGE, at, "a %s is not iterable", type_name(v));
    json_t *j = v->j;
    if (json_is_array(j)) {
        *out = json_incref(j);
        return 0;
    }
    json_t *r = json_array();
    if (!r)
        return oom(e, at);
    if (json_is_object(j)) {
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) if (json_array_append_new(r, json_string(k))) goto nomem;
    } else if (json_is_string(j)) {
        size_t n;
        size_t *off = cp_offsets(json_string_value(j), json_string_length(j), &n);
        if (!off)
            goto nomem;
        for (size_t i = 0; i < n; i++)
            if (json_array_append_new(r, json_stringn_nocheck(json_string_value(j) + off[i],
                                                              off[i + 1] - off[i]))) {
                free(off);
                goto nomem;
            }
        free(off);
    } else {
        json_decref(r);
        return ev_fail(e, ERR_USAGE, at, "a %s is not iterable", type_name(v));
    }
    *out = r;
    return 0;
nomem:
    json_decref(r);
    return oom(e, at);
}

/* dict.items() as a list of [key, value] pairs */
static json_t *items_of(json_t *obj)
{
    json_t *r = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        json_t *pair = json_pack("[sO]", k, v);
        if (!r || !pair || json_array_append_new(r, pair)) {
            json_decref(r);
            return NULL;
        }
    }
    return r;
}

static int binop(struct ev *e, int op, struct jv *a, struct jv *b, struct jv *out,
                 const struct jn *at)
{
    *out = UNDEF;
    if (op == JN_OP_EQ || op == JN_OP_NE) {
        bool eq = py_eq(a, b);
        *out = jv_json(json_boolean(op == JN_OP_EQ ? eq : !eq));
        return 0;
    }
    if (op == JN_OP_CONCAT) {
        struct buf s = {0};
        if (jv_str(e, &s, a, at) || jv_str(e, &s, b, at)) {
            free(s.p);
            return e->rc;
        }
        *out = jv_json(json_stringn_nocheck(s.p ? s.p : "", s.n));
        free(s.p);
        return out->j ? 0 : oom(e, at);
    }
    if (op == JN_OP_IN || op == JN_OP_NOTIN) {
        bool r = false;
        if (b->k == JV_UNDEF) {
            r = false;
        } else if (b->k != JV_JSON) {
            return ev_fail(e, ERR_USAGE, at, "'in' a %s", type_name(b));
        } else if (json_is_string(b->j)) {
            if (a->k != JV_JSON || !json_is_string(a->j))
                return ev_fail(e, ERR_USAGE, at, "'in <string>' requires a string on the left, not a %s",
                               type_name(a));
            const char *h = json_string_value(b->j);
            size_t hn = json_string_length(b->j), nn = json_string_length(a->j);
            const char *nd = json_string_value(a->j);
            for (size_t i = 0; !r && i + nn <= hn; i++)
                r = !memcmp(h + i, nd, nn);
        } else if (json_is_array(b->j)) {
            for (size_t i = 0; !r && i < json_array_size(b->j); i++) {
                struct jv x = {.k = JV_JSON, .j = json_array_get(b->j, i)};
                r = py_eq(a, &x);
            }
        } else if (json_is_object(b->j)) {
            r = a->k == JV_JSON && json_is_string(a->j) &&
                json_object_get(b->j, json_string_value(a->j)) != NULL;
        } else {
            return ev_fail(e, ERR_USAGE, at, "'in' a %s", type_name(b));
        }
        *out = jv_json(json_boolean(op == JN_OP_IN ? r : !r));
        return 0;
    }
    if (a->k == JV_UNDEF)
        return undef_err(e, a, at);
    if (b->k == JV_UNDEF)
        return undef_err(e, b, at);
    if (a->k != JV_JSON || b->k != JV_JSON)
        return ev_fail(e, ERR_USAGE, at, "unsupported operand types %s and %s", type_name(a),
                       type_name(b));
    json_t *x = a->j, *y = b->j;
    if (op >= JN_OP_LT && op <= JN_OP_GE) {
        int c;
        if (is_num(x) && is_num(y)) {
            double p = num_of(x), q = num_of(y);
            if (is_int(x) && is_int(y))
                c = int_of(x) < int_of(y) ? -1 : int_of(x) > int_of(y);
            else
                c = p < q ? -1 : p > q;
        } else if (json_is_string(x) && json_is_string(y)) {
            size_t nx = json_string_length(x), ny = json_string_length(y);
            c = memcmp(json_string_value(x), json_string_value(y), nx < ny ? nx : ny);
            if (c == 0)
                c = nx < ny ? -1 : nx > ny;
        } else {
            return ev_fail(e, ERR_USAGE, at, "cannot compare a %s with a %s", type_name(a),
                           type_name(b));
        }
        bool r = op == JN_OP_LT ? c < 0 : op == JN_OP_LE ? c <= 0 : op == JN_OP_GT ? c > 0 : c >= 0;
        *out = jv_json(json_boolean(r));
        return 0;
    }
    if (op == JN_OP_ADD && json_is_string(x) && json_is_string(y)) {
        struct buf s = {0};
        if (buf_add(e, &s, json_string_value(x), json_string_length(x), at) ||
            buf_add(e, &s, json_string_value(y), json_string_length(y), at)) {
            free(s.p);
            return e->rc;
        }
        *out = jv_json(json_stringn_nocheck(s.p ? s.p : "", s.n));
        free(s.p);
        return out->j ? 0 : oom(e, at);
    }
    if (op == JN_OP_ADD && json_is_array(x) && json_is_array(y)) {
        json_t *r = json_copy(x);
        if (!r || json_array_extend(r, y)) {
            json_decref(r);
            return oom(e, at);
        }
        *out = jv_json(r);
        return 0;
    }
    if (op == JN_OP_MUL && (json_is_string(x) || json_is_array(x) || json_is_string(y) ||
                            json_is_array(y))) {
        json_t *s = json_is_string(x) || json_is_array(x) ? x : y, *k = s == x ? y : x;
        if (!is_int(k))
            return ev_fail(e, ERR_USAGE, at, "can't multiply a sequence by a non-int");
        long long times = int_of(k);
        if (times < 0)
            times = 0;
        if (json_is_string(s)) {
            struct buf o = {0};
            for (long long i = 0; i < times; i++)
                if (buf_add(e, &o, json_string_value(s), json_string_length(s), at))
                    break;
            *out = e->rc ? UNDEF : jv_json(json_stringn_nocheck(o.p ? o.p : "", o.n));
            free(o.p);
            return e->rc ? e->rc : out->j ? 0 : oom(e, at);
        }
        if ((unsigned long long)times * json_array_size(s) > MAX_SEQ)
            return ev_fail(e, ERR_RANGE, at, "a list of more than %u elements", MAX_SEQ);
        json_t *r = json_array();
        for (long long i = 0; r && i < times; i++)
            if (json_array_extend(r, s)) {
                json_decref(r);
                r = NULL;
            }
        if (!r)
            return oom(e, at);
        *out = jv_json(r);
        return 0;
    }
    if (!is_num(x) || !is_num(y))
        return ev_fail(e, ERR_USAGE, at, "unsupported operand types for arithmetic: %s and %s",
                       type_name(a), type_name(b));
    bool ints = is_int(x) && is_int(y);
    long long p = ints ? int_of(x) : 0, q = ints ? int_of(y) : 0;
    double fp = num_of(x), fq = num_of(y);
    long long ri = 0;
    double rf = 0;
    bool rint = ints;
    switch (op) {
    case JN_OP_ADD:
        if (ints && __builtin_add_overflow(p, q, &ri))
            goto ovf;
        rf = fp + fq;
        break;
    case JN_OP_SUB:
        if (ints && __builtin_sub_overflow(p, q, &ri))
            goto ovf;
        rf = fp - fq;
        break;
    case JN_OP_MUL:
        if (ints && __builtin_mul_overflow(p, q, &ri))
            goto ovf;
        rf = fp * fq;
        break;
    case JN_OP_DIV:
        if (fq == 0)
            return ev_fail(e, ERR_USAGE, at, "division by zero");
        rint = false;
        rf = fp / fq;
        break;
    case JN_OP_FLOORDIV:
    case JN_OP_MOD:
        if (ints ? q == 0 : fq == 0)
            return ev_fail(e, ERR_USAGE, at, "integer division or modulo by zero");
        if (ints) {
            if (p == LLONG_MIN && q == -1)
                goto ovf;
            long long d = p / q, m = p % q;
            if (m != 0 && ((m < 0) != (q < 0))) {
                d--;
                m += q;
            }
            ri = op == JN_OP_FLOORDIV ? d : m;
        } else {
            double m = fmod(fp, fq);
            if (m != 0 && ((m < 0) != (fq < 0)))
                m += fq;
            rf = op == JN_OP_FLOORDIV ? floor(fp / fq) : m;
        }
        break;
    case JN_OP_POW:
        if (ints && q >= 0) {
            ri = 1;
            for (long long i = 0; i < q; i++)
                if (__builtin_mul_overflow(ri, p, &ri))
                    goto ovf;
                else if (ri == 0 || ri == 1)
                    break;
        } else {
            rint = false;
            rf = pow(fp, fq);
        }
        break;
    default:
        return ev_fail(e, ERR_STATE, at, "unknown operator");
    }
    *out = jv_json(rint ? json_integer(ri) : json_real(rf));
    if (!out->j)
        return ev_fail(e, ERR_UNSUPPORTED, at, "a non-finite float result");
    return 0;
ovf:
    return ev_fail(e, ERR_UNSUPPORTED, at, "integer arithmetic beyond 64 bits");
}

/* Evaluated arguments of a call / filter / test: pos[np] in order, kw[] by name. */
struct args {
    struct jv v[16];
    const char *kw[16];
    size_t n;
};

static void args_fini(struct args *a)
{
    for (size_t i = 0; i < a->n; i++)
        jv_drop(&a->v[i]);
    a->n = 0;
}

static int eval_args(struct ev *e, struct frame *f, const struct jn *n, size_t first,
                     struct args *a)
{
    a->n = 0;
    if (n->nv - first > 16)
        return ev_fail(e, ERR_UNSUPPORTED, n, "more than 16 arguments");
    for (size_t i = first; i < n->nv; i++) {
        if (eval(e, f, n->v[i], &a->v[a->n]))
            return e->rc;
        a->kw[a->n] = n->names ? n->names[i] : NULL;
        a->n++;
    }
    return 0;
}

/* Argument `name` at position pos (or keyword); NULL when not given. */
static const struct jv *arg(const struct args *a, size_t pos, const char *name)
{
    size_t p = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            if (name && !strcmp(a->kw[i], name))
                return &a->v[i];
        } else if (p++ == pos) {
            return &a->v[i];
        }
    }
    return NULL;
}

static int check_args(struct ev *e, const struct args *a, size_t maxpos,
                      const char *const *names, const char *what, const struct jn *at)
{
    size_t p = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (!a->kw[i]) {
            if (++p > maxpos)
                return ev_fail(e, ERR_USAGE, at, "%s takes at most %zu arguments", what, maxpos);
            continue;
        }
        bool ok = false;
        for (int k = 0; names && names[k]; k++)
            ok |= !strcmp(names[k], a->kw[i]);
        if (!ok)
            return ev_fail(e, ERR_UNSUPPORTED, at, "%s: the argument '%s'", what, a->kw[i]);
    }
    return 0;
}

static bool is_str(const struct jv *v) { return v && v->k == JV_JSON && json_is_string(v->j); }

static int run_test(struct ev *e, const char *name, const struct jv *v, const struct args *a,
                    bool *r, const struct jn *at);

/* ---- filters ------------------------------------------------------------------------------ */

static int do_tojson(struct ev *e, const struct jv *v, const struct args *a, struct jv *out,
                     const struct jn *at)
{
    static const char *const names[] = {"indent", "separators", "sort_keys", "ensure_ascii",
                                        NULL};
    if (check_args(e, a, 0, names, "tojson", at))
        return e->rc;
    if (v->k != JV_JSON)
        return ev_fail(e, ERR_USAGE, at, "tojson: a %s is not JSON serializable", type_name(v));
    struct dumpopt o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
    const struct jv *ind = arg(a, 99, "indent"), *sep = arg(a, 99, "separators"),
                    *sk = arg(a, 99, "sort_keys"), *ea = arg(a, 99, "ensure_ascii");
    if (ind && ind->k == JV_JSON && !json_is_null(ind->j)) {
        if (!is_int(ind->j) || int_of(ind->j) > 64)
            return ev_fail(e, ERR_UNSUPPORTED, at, "tojson: indent other than a small integer");
        o.indent = (int)(int_of(ind->j) < 0 ? 0 : int_of(ind->j));
        o.item_sep = ",";
    }
    if (sep && sep->k == JV_JSON && !json_is_null(sep->j)) {
        if (!json_is_array(sep->j) || json_array_size(sep->j) != 2 ||
            !json_is_string(json_array_get(sep->j, 0)) ||
            !json_is_string(json_array_get(sep->j, 1)))
            return ev_fail(e, ERR_USAGE, at, "tojson: separators must be two strings");
        o.item_sep = json_string_value(json_array_get(sep->j, 0));
        o.key_sep = json_string_value(json_array_get(sep->j, 1));
    }
    o.sort_keys = sk && truthy(sk);
    o.ensure_ascii = ea && truthy(ea);
    struct buf b = {0};
    if (dump(e, &b, v->j, &o, 0, at)) {
        free(b.p);
        return e->rc;
    }
    *out = jv_json(json_stringn_nocheck(b.p ? b.p : "", b.n));
    free(b.p);
    return out->j ? 0 : oom(e, at);
}

static int length_of(struct ev *e, const struct jv *v, long long *n, const struct jn *at)
{
    if (v->k == JV_UNDEF)
        *n = 0;
    else if (v->k == JV_NS)
        return ev_fail(e, ERR_USAGE, at, "length of a namespace");
    else if (v->k != JV_JSON)
        return ev_fail(e, ERR_USAGE, at, "length of a %s", type_name(v));
    else if (json_is_string(v->j))
        *n = (long long)cp_count(json_string_value(v->j), json_string_length(v->j));
    else if (json_is_array(v->j))
        *n = (long long)json_array_size(v->j);
    else if (json_is_object(v->j))
        *n = (long long)json_object_size(v->j);
    else
        return ev_fail(e, ERR_USAGE, at, "object of type '%s' has no len()", type_name(v));
    return 0;
}

/* attribute access used by selectattr / map(attribute=) / join(attribute=): dotted paths */
static int attr_path(struct ev *e, const struct jv *v, const char *path, struct jv *out,
                     const struct jn *at)
{
    struct jv cur = jv_copy(v);
    char part[128];
    const char *s = path;
    while (*s) {
        size_t l = strcspn(s, ".");
        if (l >= sizeof part) {
            jv_drop(&cur);
            return ev_fail(e, ERR_UNSUPPORTED, at, "an attribute path component over 127 bytes");
        }
        memcpy(part, s, l);
        part[l] = 0;
        struct jv key = jv_json(json_string(part)), next;
        if (!key.j) {
            jv_drop(&cur);
            return oom(e, at);
        }
        if (cur.k == JV_UNDEF) {
            jv_drop(&key);
            *out = cur;
            return 0;
        }
        int rc = get_item(e, &cur, &key, &next, at);
        jv_drop(&key);
        jv_drop(&cur);
        if (rc)
            return rc;
        cur = next;
        s += l;
        if (*s == '.')
            s++;
    }
    *out = cur;
    return 0;
}

static int apply_filter(struct ev *e, const char *name, struct jv *v, struct args *a,
                        struct jv *out, const struct jn *at);

static int do_select(struct ev *e, const char *name, const struct jv *v, const struct args *a,
                     struct jv *out, const struct jn *at)
{
    bool reject = name[0] == 'r';
    bool byattr = strstr(name, "attr") != NULL;
    json_t *items;
    if (iter_list(e, v, &items, at))
        return e->rc;
    json_t *r = json_array();
    if (!r) {
        json_decref(items);
        return oom(e, at);
    }
    size_t first = 0;
    const struct jv *attr = NULL;
    if (byattr) {
        attr = arg(a, 0, NULL);
        if (!is_str(attr)) {
            json_decref(items);
            json_decref(r);
            return ev_fail(e, ERR_USAGE, at, "%s needs an attribute name", name);
        }
        first = 1;
    }
    const struct jv *test = arg(a, first, NULL);
    if (test && !is_str(test)) {
        json_decref(items);
        json_decref(r);
        return ev_fail(e, ERR_USAGE, at, "%s: the test must be named by a string", name);
    }
    if (test && !jinja__known_test(json_string_value(test->j))) {
        json_decref(items);
        json_decref(r);
        return ev_fail(e, ERR_UNSUPPORTED, at, "the test '%s'", json_string_value(test->j));
    }
    struct args targs = {0};
    for (size_t i = 0, p = 0; i < a->n; i++) {
        if (a->kw[i]) {
            json_decref(items);
            json_decref(r);
            return ev_fail(e, ERR_UNSUPPORTED, at, "%s: keyword arguments", name);
        }
        if (p++ > first)
            targs.v[targs.n++] = a->v[i]; /* borrowed: not dropped */
    }
    for (size_t i = 0; i < json_array_size(items) && !e->rc; i++) {
        struct jv it = {.k = JV_JSON, .j = json_array_get(items, i)}, x;
        if (attr) {
            if (attr_path(e, &it, json_string_value(attr->j), &x, at))
                break;
        } else {
            x = jv_copy(&it);
        }
        bool ok;
        if (test)
            run_test(e, json_string_value(test->j), &x, &targs, &ok, at);
        else
            ok = truthy(&x);
        jv_drop(&x);
        if (!e->rc && ok != reject && json_array_append(r, it.j))
            oom(e, at);
    }
    json_decref(items);
    if (e->rc) {
        json_decref(r);
        return e->rc;
    }
    *out = jv_json(r);
    return 0;
}

static int do_map(struct ev *e, const struct jv *v, struct args *a, struct jv *out,
                  const struct jn *at)
{
    const struct jv *attr = arg(a, 99, "attribute"), *def = arg(a, 99, "default");
    const struct jv *fname = arg(a, 0, NULL);
    if (!attr && !is_str(fname))
        return ev_fail(e, ERR_USAGE, at, "map needs attribute= or a filter name");
    if (attr && !is_str(attr))
        return ev_fail(e, ERR_USAGE, at, "map: attribute must be a string");
    if (!attr && !jinja__known_filter(json_string_value(fname->j)))
        return ev_fail(e, ERR_UNSUPPORTED, at, "the filter '%s'", json_string_value(fname->j));
    json_t *items;
    if (iter_list(e, v, &items, at))
        return e->rc;
    json_t *r = json_array();
    struct args fa = {0};
    for (size_t i = 0, p = 0; !attr && i < a->n; i++) {
        if (!a->kw[i] && p++ == 0)
            continue; /* the filter's name */
        fa.v[fa.n] = a->v[i];
        fa.kw[fa.n++] = a->kw[i];
    }
    for (size_t i = 0; r && i < json_array_size(items) && !e->rc; i++) {
        struct jv it = {.k = JV_JSON, .j = json_array_get(items, i)}, x = UNDEF;
        if (attr) {
            if (attr_path(e, &it, json_string_value(attr->j), &x, at))
                break;
            if (x.k == JV_UNDEF && def) {
                jv_drop(&x);
                x = jv_copy(def);
            }
        } else {
            struct jv in = jv_copy(&it);
            struct args copy = fa;
            apply_filter(e, json_string_value(fname->j), &in, &copy, &x, at);
            jv_drop(&in);
            if (e->rc)
                break;
        }
        if (x.k != JV_JSON) {
            jv_drop(&x);
            ev_fail(e, ERR_UNSUPPORTED, at, "map: an undefined or non-JSON element");
            break;
        }
        if (json_array_append(r, x.j))
            oom(e, at);
        jv_drop(&x);
    }
    json_decref(items);
    if (!r && !e->rc)
        oom(e, at);
    if (e->rc) {
        json_decref(r);
        return e->rc;
    }
    *out = jv_json(r);
    return 0;
}

static int apply_filter(struct ev *e, const char *name, struct jv *v, struct args *a,
                        struct jv *out, const struct jn *at)
{
    *out = UNDEF;
    if (!strcmp(name, "tojson"))
        return do_tojson(e, v, a, out, at);
    if (!strcmp(name, "safe")) {
        *out = jv_copy(v);
        return 0;
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const struct jv *dv = arg(a, 0, "default_value"), *bo = arg(a, 1, "boolean");
        bool use = v->k == JV_UNDEF || (bo && truthy(bo) && !truthy(v));
        if (use)
            *out = dv ? jv_copy(dv) : jv_json(json_string(""));
        else
            *out = jv_copy(v);
        return 0;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        long long n = 0;
        if (length_of(e, v, &n, at))
            return e->rc;
        *out = jv_json(json_integer(n));
        return 0;
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "selectattr") ||
        !strcmp(name, "rejectattr"))
        return do_select(e, name, v, a, out, at);
    if (!strcmp(name, "map"))
        return do_map(e, v, a, out, at);
    if (!strcmp(name, "list")) {
        json_t *l;
        if (iter_list(e, v, &l, at))
            return e->rc;
        *out = jv_json(json_is_array(v->j) && l == v->j ? json_copy(l) : json_incref(l));
        json_decref(l);
        return out->j ? 0 : oom(e, at);
    }
    if (!strcmp(name, "items")) {
        if (v->k == JV_UNDEF) {
            *out = jv_json(json_array());
            return 0;
        }
        if (v->k != JV_JSON || !json_is_object(v->j))
            return ev_fail(e, ERR_USAGE, at, "items: a %s is not a mapping", type_name(v));
        *out = jv_json(items_of(v->j));
        return out->j ? 0 : oom(e, at);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        json_t *l;
        if (iter_list(e, v, &l, at))
            return e->rc;
        size_t n = json_array_size(l);
        if (n)
            *out = jv_json(json_incref(json_array_get(l, name[0] == 'f' ? 0 : n - 1)));
        json_decref(l);
        return 0;
    }
    if (!strcmp(name, "reverse")) {
        if (is_str(v)) {
            json_t *l;
            if (iter_list(e, v, &l, at))
                return e->rc;
            struct buf b = {0};
            for (size_t i = json_array_size(l); i-- > 0;)
                if (buf_add(e, &b, json_string_value(json_array_get(l, i)),
                            json_string_length(json_array_get(l, i)), at))
                    break;
            json_decref(l);
            if (!e->rc)
                *out = jv_json(json_stringn_nocheck(b.p ? b.p : "", b.n));
            free(b.p);
            return e->rc ? e->rc : out->j ? 0 : oom(e, at);
        }
        json_t *l;
        if (iter_list(e, v, &l, at))
            return e->rc;
        json_t *r = json_array();
        for (size_t i = json_array_size(l); r && i-- > 0;)
            if (json_array_append(r, json_array_get(l, i))) {
                json_decref(r);
                r = NULL;
            }
        json_decref(l);
        if (!r)
            return oom(e, at);
        *out = jv_json(r);
        return 0;
    }
    if (!strcmp(name, "abs")) {
        if (v->k != JV_JSON || !is_num(v->j))
            return ev_fail(e, ERR_USAGE, at, "abs of a %s", type_name(v));
        if (is_int(v->j)) {
            long long x = int_of(v->j);
            if (x == LLONG_MIN)
                return ev_fail(e, ERR_UNSUPPORTED, at, "integer arithmetic beyond 64 bits");
            *out = jv_json(json_integer(x < 0 ? -x : x));
        } else {
            *out = jv_json(json_real(fabs(json_real_value(v->j))));
        }
        return 0;
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        bool fl = name[0] == 'f';
        const struct jv *dv = arg(a, 0, "default");
        if (v->k == JV_JSON && is_num(v->j)) {
            *out = jv_json(fl ? json_real(num_of(v->j))
                              : json_integer(is_int(v->j) ? int_of(v->j)
                                                          : (long long)json_real_value(v->j)));
            return out->j ? 0 : oom(e, at);
        }
        if (is_str(v)) {
            const char *s = json_string_value(v->j);
            char *end;
            errno = 0;
            if (fl) {
                double d = strtod(s, &end);
                if (end != s && *end == 0 && errno == 0 && isfinite(d)) {
                    *out = jv_json(json_real(d));
                    return 0;
                }
            } else {
                long long x = strtoll(s, &end, 10);
                if (end != s && *end == 0 && errno == 0) {
                    *out = jv_json(json_integer(x));
                    return 0;
                }
                /* Python's int filter also reads floats and other bases: not here */
                if (strpbrk(s, ".xXoObB_eE"))
                    return ev_fail(e, ERR_UNSUPPORTED, at, "int of the string '%.40s'", s);
            }
        }
        *out = dv ? jv_copy(dv) : jv_json(fl ? json_real(0.0) : json_integer(0));
        return 0;
    }
    /* the string filters take str(value) */
    struct jv s;
    if (jv_to_string(e, v, &s, at))
        return e->rc;
    const char *p = json_string_value(s.j);
    size_t n = json_string_length(s.j);
    json_t *r = NULL;
    if (!strcmp(name, "string")) {
        *out = s;
        return 0;
    } else if (!strcmp(name, "trim")) {
        const struct jv *chars = arg(a, 0, "chars");
        if (chars && chars->k == JV_JSON && !json_is_null(chars->j) && !is_str(chars)) {
            jv_drop(&s);
            return ev_fail(e, ERR_USAGE, at, "trim: chars must be a string");
        }
        if (is_str(chars) && ascii_only(e, json_string_value(chars->j),
                                        json_string_length(chars->j), "trim(chars)", at)) {
            jv_drop(&s);
            return e->rc;
        }
        r = is_str(chars) ? py_strip(p, n, json_string_value(chars->j),
                                     json_string_length(chars->j), true, true)
                          : py_strip(p, n, NULL, 0, true, true);
    } else if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize")) {
        if (ascii_only(e, p, n, name, at)) {
            jv_drop(&s);
            return e->rc;
        }
        r = case_map(p, n, name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : 2);
    } else if (!strcmp(name, "replace")) {
        const struct jv *o = arg(a, 0, "old"), *nw = arg(a, 1, "new"), *c = arg(a, 2, "count");
        if (!is_str(o) || !is_str(nw)) {
            jv_drop(&s);
            return ev_fail(e, ERR_USAGE, at, "replace needs two strings");
        }
        r = str_replace(p, n, json_string_value(o->j), json_string_length(o->j),
                        json_string_value(nw->j), json_string_length(nw->j),
                        c && c->k == JV_JSON && is_int(c->j) ? int_of(c->j) : -1, e->max_output);
    } else if (!strcmp(name, "join")) {
        /* join's value is the iterable, not str(value) */
        jv_drop(&s);
        const struct jv *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        json_t *l;
        if (iter_list(e, v, &l, at))
            return e->rc;
        struct buf b = {0};
        for (size_t i = 0; i < json_array_size(l) && !e->rc; i++) {
            struct jv it = {.k = JV_JSON, .j = json_array_get(l, i)}, x;
            if (i && sep && jv_str(e, &b, sep, at))
                break;
            if (attr && is_str(attr)) {
                if (attr_path(e, &it, json_string_value(attr->j), &x, at))
                    break;
            } else {
                x = jv_copy(&it);
            }
            jv_str(e, &b, &x, at);
            jv_drop(&x);
        }
        json_decref(l);
        if (!e->rc)
            *out = jv_json(json_stringn_nocheck(b.p ? b.p : "", b.n));
        free(b.p);
        return e->rc ? e->rc : out->j ? 0 : oom(e, at);
    } else {
        jv_drop(&s);
        return ev_fail(e, ERR_UNSUPPORTED, at, "the filter '%s'", name);
    }
    jv_drop(&s);
    if (!r)
        return e->rc ? e->rc : oom(e, at);
    *out = jv_json(r);
    return 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static int run_test(struct ev *e, const char *name, const struct jv *v, const struct args *a,
                    bool *r, const struct jn *at)
{
    bool js = v->k == JV_JSON;
    json_t *j = v->j;
    const struct jv *x = arg(a, 0, NULL);
    *r = false;
    if (!strcmp(name, "defined"))
        *r = v->k != JV_UNDEF;
    else if (!strcmp(name, "undefined"))
        *r = v->k == JV_UNDEF;
    else if (!strcmp(name, "none"))
        *r = js && json_is_null(j);
    else if (!strcmp(name, "string"))
        *r = js && json_is_string(j);
    else if (!strcmp(name, "number"))
        *r = js && is_num(j);
    else if (!strcmp(name, "integer"))
        *r = js && json_is_integer(j);
    else if (!strcmp(name, "float"))
        *r = js && json_is_real(j);
    else if (!strcmp(name, "boolean"))
        *r = js && json_is_boolean(j);
    else if (!strcmp(name, "true"))
        *r = js && json_is_true(j);
    else if (!strcmp(name, "false"))
        *r = js && json_is_false(j);
    else if (!strcmp(name, "mapping"))
        *r = js && json_is_object(j);
    else if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        *r = v->k == JV_UNDEF || (js && (json_is_string(j) || json_is_array(j) || json_is_object(j)));
    else if (!strcmp(name, "callable"))
        *r = v->k == JV_MACRO || v->k == JV_FUNC || v->k == JV_METHOD;
    else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        long long d = name[0] == 'o' || name[0] == 'e' ? 2 : 0;
        if (!d) {
            if (!x || x->k != JV_JSON || !is_int(x->j) || int_of(x->j) == 0)
                return ev_fail(e, ERR_USAGE, at, "divisibleby needs a non-zero integer");
            d = int_of(x->j);
        }
        if (!js || !is_int(j))
            return ev_fail(e, ERR_USAGE, at, "%s of a %s", name, type_name(v));
        long long m = int_of(j) % d;
        *r = name[0] == 'o' ? m != 0 : m == 0;
    } else if (!strcmp(name, "sameas")) {
        if (!x)
            return ev_fail(e, ERR_USAGE, at, "sameas needs an argument");
        *r = (v->k == JV_JSON && x->k == JV_JSON &&
              ((json_is_null(j) && json_is_null(x->j)) || (json_is_true(j) && json_is_true(x->j)) ||
               (json_is_false(j) && json_is_false(x->j)) || j == x->j)) ||
             (v->k == JV_NS && x->k == JV_NS && v->ns == x->ns);
    } else {
        if (!x)
            return ev_fail(e, ERR_USAGE, at, "the test '%s' needs an argument", name);
        int op = !strcmp(name, "equalto") || !strcmp(name, "eq") ? JN_OP_EQ
                 : !strcmp(name, "ne") ? JN_OP_NE : !strcmp(name, "in") ? JN_OP_IN
                 : !strcmp(name, "lt") ? JN_OP_LT : !strcmp(name, "gt") ? JN_OP_GT
                 : !strcmp(name, "le") ? JN_OP_LE : !strcmp(name, "ge") ? JN_OP_GE : 0;
        if (!op)
            return ev_fail(e, ERR_UNSUPPORTED, at, "the test '%s'", name);
        struct jv res;
        struct jv va = jv_copy(v), vb = jv_copy(x);
        int rc = binop(e, op, &va, &vb, &res, at);
        jv_drop(&va);
        jv_drop(&vb);
        if (rc)
            return rc;
        *r = truthy(&res);
        jv_drop(&res);
    }
    return 0;
}

/* ---- calls -------------------------------------------------------------------------------- */

static int call_macro(struct ev *e, const struct jn *m, struct args *a, struct jv *out,
                      const struct jn *at)
{
    if (e->depth >= e->max_depth)
        return ev_fail(e, ERR_RANGE, at, "macro calls nested deeper than %u", e->max_depth);
    struct frame fr = {.parent = e->root};
    size_t p = 0;
    for (size_t i = 0; i < a->n && !e->rc; i++) {
        size_t slot = m->nnames;
        if (a->kw[i]) {
            for (size_t k = 0; k < m->nnames; k++)
                if (!strcmp(m->names[k], a->kw[i]))
                    slot = k;
            if (slot == m->nnames)
                ev_fail(e, ERR_USAGE, at, "macro '%s' has no parameter '%s'", m->name, a->kw[i]);
        } else {
            slot = p++;
            if (slot >= m->nnames)
                ev_fail(e, ERR_USAGE, at, "macro '%s' takes %zu arguments", m->name, m->nnames);
        }
        if (!e->rc)
            frame_set(e, &fr, m->names[slot], jv_copy(&a->v[i]), at);
    }
    for (size_t k = 0; k < m->nnames && !e->rc; k++) {
        bool given = false;
        for (size_t i = 0; i < fr.n; i++)
            given |= fr.vars[i].name == m->names[k];
        if (given)
            continue;
        struct jv d = UNDEF;
        d.name = m->names[k];
        if (m->v[k] && eval(e, &fr, m->v[k], &d))
            break;
        frame_set(e, &fr, m->names[k], d, at);
    }
    struct buf b = {0};
    if (!e->rc) {
        struct buf *saved = e->out;
        e->out = &b;
        e->depth++;
        int rc = exec_body(e, &fr, m->b);
        e->depth--;
        e->out = saved;
        if (rc > 0)
            ev_fail(e, ERR_USAGE, at, "break/continue outside a loop");
    }
    frame_fini(&fr);
    if (!e->rc)
        *out = jv_json(json_stringn_nocheck(b.p ? b.p : "", b.n));
    free(b.p);
    return e->rc ? e->rc : out->j ? 0 : oom(e, at);
}

static int call_method(struct ev *e, const struct jv *m, struct args *a, struct jv *out,
                       const struct jn *at)
{
    json_t *self = m->j;
    const char *name = m->name;
    if (json_is_object(self)) {
        if (check_args(e, a, !strcmp(name, "get") ? 2 : 0, NULL, name, at))
            return e->rc;
        if (!strcmp(name, "items"))
            *out = jv_json(items_of(self));
        else if (!strcmp(name, "keys")) {
            struct jv sv = {.k = JV_JSON, .j = self};
            json_t *l;
            if (iter_list(e, &sv, &l, at))
                return e->rc;
            *out = jv_json(l);
        } else if (!strcmp(name, "values")) {
            json_t *r = json_array();
            const char *k;
            json_t *v;
            json_object_foreach(self, k, v) if (r && json_array_append(r, v)) {
                json_decref(r);
                r = NULL;
            }
            *out = jv_json(r);
        } else if (!strcmp(name, "get")) {
            const struct jv *k = arg(a, 0, NULL), *d = arg(a, 1, NULL);
            json_t *x = is_str(k) ? json_object_get(self, json_string_value(k->j)) : NULL;
            if (!k)
                return ev_fail(e, ERR_USAGE, at, "get needs a key");
            *out = x ? jv_json(json_incref(x)) : d ? jv_copy(d) : jv_json(json_null());
            return 0;
        } else {
            return ev_fail(e, ERR_USAGE, at, "the dict method '%s' (the sandbox forbids it or "
                           "it is not implemented)", name);
        }
        return out->j ? 0 : oom(e, at);
    }
    if (!json_is_string(self))
        return ev_fail(e, ERR_USAGE, at, "the %s method '%s' is not implemented",
                       json_is_array(self) ? "list" : "value", name);
    const char *s = json_string_value(self);
    size_t n = json_string_length(self);
    json_t *r = NULL;
    const struct jv *x = arg(a, 0, NULL);
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (check_args(e, a, 1, NULL, name, at))
            return e->rc;
        bool l = name[0] != 'r', rr = name[0] != 'l';
        if (x && x->k == JV_JSON && !json_is_null(x->j)) {
            if (!is_str(x))
                return ev_fail(e, ERR_USAGE, at, "%s: chars must be a string", name);
            if (ascii_only(e, json_string_value(x->j), json_string_length(x->j), name, at))
                return e->rc;
            r = py_strip(s, n, json_string_value(x->j), json_string_length(x->j), l, rr);
        } else {
            r = py_strip(s, n, NULL, 0, l, rr);
        }
    } else if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize")) {
        if (check_args(e, a, 0, NULL, name, at) || ascii_only(e, s, n, name, at))
            return e->rc;
        r = case_map(s, n, name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : 2);
    } else if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (check_args(e, a, 1, NULL, name, at))
            return e->rc;
        if (!x || x->k != JV_JSON || (!json_is_string(x->j) && !json_is_array(x->j)))
            return ev_fail(e, ERR_USAGE, at, "%s needs a string or a tuple of strings", name);
        bool res = false;
        size_t cnt = json_is_string(x->j) ? 1 : json_array_size(x->j);
        for (size_t i = 0; i < cnt && !res; i++) {
            json_t *pj = json_is_string(x->j) ? x->j : json_array_get(x->j, i);
            if (!json_is_string(pj))
                return ev_fail(e, ERR_USAGE, at, "%s needs strings", name);
            size_t pn = json_string_length(pj);
            res = pn <= n && !memcmp(name[0] == 's' ? s : s + n - pn, json_string_value(pj), pn);
        }
        r = json_boolean(res);
    } else if (!strcmp(name, "replace")) {
        if (check_args(e, a, 3, NULL, name, at))
            return e->rc;
        const struct jv *o = arg(a, 0, NULL), *nw = arg(a, 1, NULL), *c = arg(a, 2, NULL);
        if (!is_str(o) || !is_str(nw))
            return ev_fail(e, ERR_USAGE, at, "replace needs two strings");
        r = str_replace(s, n, json_string_value(o->j), json_string_length(o->j),
                        json_string_value(nw->j), json_string_length(nw->j),
                        c && c->k == JV_JSON && is_int(c->j) ? int_of(c->j) : -1, e->max_output);
    } else if (!strcmp(name, "find")) {
        if (check_args(e, a, 1, NULL, name, at))
            return e->rc;
        if (!is_str(x))
            return ev_fail(e, ERR_USAGE, at, "find needs a string");
        const char *nd = json_string_value(x->j);
        size_t nn = json_string_length(x->j);
        long long pos = -1;
        for (size_t i = 0; i + nn <= n; i++)
            if (!memcmp(s + i, nd, nn)) {
                pos = (long long)cp_count(s, i);
                break;
            }
        r = json_integer(pos);
    } else if (!strcmp(name, "split")) {
        static const char *const kn[] = {"sep", "maxsplit", NULL};
        if (check_args(e, a, 2, kn, name, at))
            return e->rc;
        const struct jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
        long long maxs = mx && mx->k == JV_JSON && is_int(mx->j) ? int_of(mx->j) : -1;
        r = json_array();
        if (!r)
            return oom(e, at);
        if (sep && sep->k == JV_JSON && !json_is_null(sep->j)) {
            if (!is_str(sep) || json_string_length(sep->j) == 0) {
                json_decref(r);
                return ev_fail(e, ERR_USAGE, at, "split: empty or non-string separator");
            }
            const char *sp = json_string_value(sep->j);
            size_t sn = json_string_length(sep->j), st = 0;
            long long done = 0;
            for (size_t i = 0; i + sn <= n;) {
                if ((maxs < 0 || done < maxs) && !memcmp(s + i, sp, sn)) {
                    json_array_append_new(r, json_stringn_nocheck(s + st, i - st));
                    i += sn;
                    st = i;
                    done++;
                } else {
                    i++;
                }
            }
            json_array_append_new(r, json_stringn_nocheck(s + st, n - st));
        } else {
            /* whitespace split: runs of whitespace, no empty strings */
            size_t i = 0;
            long long done = 0;
            for (;;) {
                size_t w;
                while (i < n && (w = space_at(s, n, i)) > 0)
                    i += w;
                if (i >= n)
                    break;
                if (maxs >= 0 && done >= maxs) {
                    size_t end = n;
                    while (end > i) {
                        size_t k = end - 1;
                        while (k > i && ((unsigned char)s[k] & 0xC0) == 0x80)
                            k--;
                        size_t ww = space_at(s, n, k);
                        if (!ww || k + ww != end)
                            break;
                        end = k;
                    }
                    json_array_append_new(r, json_stringn_nocheck(s + i, end - i));
                    break;
                }
                size_t st = i;
                while (i < n && space_at(s, n, i) == 0)
                    i++;
                json_array_append_new(r, json_stringn_nocheck(s + st, i - st));
                done++;
            }
        }
    } else {
        return ev_fail(e, ERR_UNSUPPORTED, at, "the str method '%s'", name);
    }
    if (!r)
        return oom(e, at);
    *out = jv_json(r);
    return 0;
}

/* strftime_now(fmt): Python's datetime.now().strftime for the C-library directives */
static int do_strftime(struct ev *e, const struct args *a, struct jv *out, const struct jn *at)
{
    const struct jv *f = arg(a, 0, NULL);
    if (!is_str(f) || a->n != 1)
        return ev_fail(e, ERR_USAGE, at, "strftime_now needs one format string");
    const char *fmt = json_string_value(f->j);
    for (const char *p = fmt; *p; p++)
        if (*p == '%') {
            p++;
            if (!*p || !strchr("aAbBdHIjmMpSUwWyYZ%eFTuVGgCDRnt", *p))
                return ev_fail(e, ERR_UNSUPPORTED, at, "strftime_now: the directive %%%c",
                               *p ? *p : ' ');
        }
    time_t now = e->now ? e->now : time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm))
        return ev_fail(e, ERR_STATE, at, "localtime failed");
    char buf[512];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    /* the directives were checked above */
    size_t n = strftime(buf, sizeof buf, fmt, &tm);
#pragma GCC diagnostic pop
    if (n == 0 && fmt[0])
        return ev_fail(e, ERR_RANGE, at, "strftime_now: the result is too long");
    *out = jv_json(json_stringn_nocheck(buf, n));
    return out->j ? 0 : oom(e, at);
}

static int call(struct ev *e, struct frame *f, const struct jn *n, struct jv *out)
{
    struct jv callee;
    if (eval(e, f, n->a, &callee))
        return e->rc;
    struct args a;
    if (eval_args(e, f, n, 0, &a)) {
        args_fini(&a);
        jv_drop(&callee);
        return e->rc;
    }
    switch (callee.k) {
    case JV_MACRO:
        call_macro(e, callee.m, &a, out, n);
        break;
    case JV_METHOD:
        call_method(e, &callee, &a, out, n);
        break;
    case JV_FUNC:
        if (callee.fn == FN_RAISE) {
            const struct jv *m = arg(&a, 0, NULL);
            struct buf b = {0};
            if (m)
                jv_str(e, &b, m, n);
            if (!e->rc)
                ev_fail(e, ERR_USAGE, n, "raise_exception: %s", b.p ? b.p : "");
            free(b.p);
        } else if (callee.fn == FN_STRFTIME) {
            do_strftime(e, &a, out, n);
        } else if (callee.fn == FN_NAMESPACE) {
            struct ns *ns = calloc(1, sizeof *ns);
            if (!ns) {
                oom(e, n);
                break;
            }
            ns->refs = 1;
            *out = UNDEF;
            out->k = JV_NS;
            out->ns = ns;
            for (size_t i = 0; i < a.n && !e->rc; i++) {
                if (!a.kw[i]) {
                    ev_fail(e, ERR_UNSUPPORTED, n, "namespace() with a positional argument");
                    break;
                }
                if (ns->n == ns->cap) {
                    size_t nc = ns->cap ? ns->cap * 2 : 4;
                    const char **nk = realloc(ns->keys, nc * sizeof *nk);
                    struct jv *nv = nk ? realloc(ns->vals, nc * sizeof *nv) : NULL;
                    if (nk)
                        ns->keys = nk;
                    if (nv)
                        ns->vals = nv;
                    if (!nk || !nv) {
                        oom(e, n);
                        break;
                    }
                    ns->cap = nc;
                }
                ns->keys[ns->n] = a.kw[i];
                ns->vals[ns->n++] = jv_copy(&a.v[i]);
            }
            if (e->rc)
                jv_drop(out); /* a refused namespace() must not leave its object behind */
        } else if (callee.fn == FN_DICT) {
            json_t *d = json_object();
            for (size_t i = 0; d && i < a.n && !e->rc; i++) {
                if (!a.kw[i])
                    ev_fail(e, ERR_UNSUPPORTED, n, "dict() with a positional argument");
                else if (a.v[i].k != JV_JSON)
                    ev_fail(e, ERR_UNSUPPORTED, n, "a %s inside a dict", type_name(&a.v[i]));
                else if (json_object_set(d, a.kw[i], a.v[i].j))
                    oom(e, n);
            }
            if (!d)
                oom(e, n);
            else if (e->rc)
                json_decref(d);
            else
                *out = jv_json(d);
        } else if (callee.fn == FN_RANGE) {
            long long b3[3] = {0, 0, 1};
            size_t np = 0;
            for (size_t i = 0; i < a.n; i++)
                if (a.kw[i] || a.v[i].k != JV_JSON || !is_int(a.v[i].j) || np >= 3) {
                    ev_fail(e, ERR_USAGE, n, "range takes 1 to 3 integers");
                    break;
                } else {
                    b3[np++] = int_of(a.v[i].j);
                }
            if (e->rc)
                break;
            if (np == 0) {
                ev_fail(e, ERR_USAGE, n, "range takes 1 to 3 integers");
                break;
            }
            if (np == 1) {
                b3[1] = b3[0];
                b3[0] = 0;
            }
            if (b3[2] == 0) {
                ev_fail(e, ERR_USAGE, n, "range step must not be zero");
                break;
            }
            json_t *r = json_array();
            size_t cnt = 0;
            for (long long i = b3[0]; r && (b3[2] > 0 ? i < b3[1] : i > b3[1]); i += b3[2]) {
                if (++cnt > MAX_SEQ) {
                    ev_fail(e, ERR_RANGE, n, "range of more than %u elements", MAX_SEQ);
                    break;
                }
                if (json_array_append_new(r, json_integer(i))) {
                    json_decref(r);
                    r = NULL;
                }
            }
            if (e->rc) {
                json_decref(r);
                break;
            }
            if (!r)
                oom(e, n);
            else
                *out = jv_json(r);
        }
        break;
    case JV_UNDEF:
        undef_err(e, &callee, n);
        break;
    default:
        ev_fail(e, ERR_USAGE, n, "a %s is not callable", type_name(&callee));
    }
    args_fini(&a);
    jv_drop(&callee);
    return e->rc;
}

/* ---- expressions -------------------------------------------------------------------------- */

static int eval(struct ev *e, struct frame *f, const struct jn *n, struct jv *out)
{
    *out = UNDEF;
    if (step(e, n))
        return e->rc;
    struct jv a = UNDEF, b = UNDEF, c = UNDEF, d = UNDEF;
    switch (n->kind) {
    case JN_LIT:
        *out = jv_json(json_incref(n->lit));
        return 0;
    case JN_NAME:
        *out = lookup(e, f, n->name);
        return 0;
    case JN_ATTR:
        if (!eval(e, f, n->a, &a))
            get_attr(e, &a, n->name, out, n);
        break;
    case JN_ITEM:
        if (!eval(e, f, n->a, &a) && !eval(e, f, n->b, &b))
            get_item(e, &a, &b, out, n);
        break;
    case JN_SLICE:
        if (!eval(e, f, n->a, &a) && (!n->b || !eval(e, f, n->b, &b)) &&
            (!n->c || !eval(e, f, n->c, &c)) && (!n->d || !eval(e, f, n->d, &d)))
            slice_of(e, &a, &b, &c, &d, out, n);
        break;
    case JN_CALL:
        return call(e, f, n, out);
    case JN_FILTER: {
        if (eval(e, f, n->a, &a))
            break;
        struct args args;
        if (!eval_args(e, f, n, 0, &args))
            apply_filter(e, n->name, &a, &args, out, n);
        args_fini(&args);
        break;
    }
    case JN_TEST: {
        if (eval(e, f, n->a, &a))
            break;
        struct args args;
        bool r;
        if (!eval_args(e, f, n, 0, &args) && !run_test(e, n->name, &a, &args, &r, n))
            *out = jv_json(json_boolean(n->op ? !r : r));
        args_fini(&args);
        break;
    }
    case JN_NEG:
        if (eval(e, f, n->a, &a))
            break;
        if (a.k != JV_JSON || !is_num(a.j)) {
            if (a.k == JV_UNDEF)
                undef_err(e, &a, n);
            else
                ev_fail(e, ERR_USAGE, n, "bad operand type for unary %c: %s", n->op, type_name(&a));
        } else if (n->op == '+') {
            *out = jv_json(is_int(a.j) ? json_integer(int_of(a.j)) : json_incref(a.j));
        } else if (is_int(a.j)) {
            if (int_of(a.j) == LLONG_MIN)
                ev_fail(e, ERR_UNSUPPORTED, n, "integer arithmetic beyond 64 bits");
            else
                *out = jv_json(json_integer(-int_of(a.j)));
        } else {
            *out = jv_json(json_real(-json_real_value(a.j)));
        }
        break;
    case JN_NOT:
        if (!eval(e, f, n->a, &a))
            *out = jv_json(json_boolean(!truthy(&a)));
        break;
    case JN_AND:
    case JN_OR:
        /* Python returns the deciding operand, not a bool */
        if (eval(e, f, n->a, &a))
            break;
        if (truthy(&a) == (n->kind == JN_OR)) {
            *out = a;
            return 0;
        }
        jv_drop(&a);
        return eval(e, f, n->b, out);
    case JN_BIN:
        if (!eval(e, f, n->a, &a) && !eval(e, f, n->b, &b))
            binop(e, n->op, &a, &b, out, n);
        break;
    case JN_COND:
        if (eval(e, f, n->a, &a))
            break;
        if (truthy(&a))
            eval(e, f, n->b, out);
        else if (n->c)
            eval(e, f, n->c, out);
        break;
    case JN_LIST:
    case JN_DICT: {
        json_t *r = n->kind == JN_LIST ? json_array() : json_object();
        if (!r) {
            oom(e, n);
            break;
        }
        for (size_t i = 0; i < n->nv && !e->rc; i++) {
            struct jv x;
            if (eval(e, f, n->v[i], &x))
                break;
            if (x.k != JV_JSON) {
                ev_fail(e, ERR_UNSUPPORTED, n, "a %s inside a list or dict literal", type_name(&x));
            } else if (n->kind == JN_LIST) {
                if (json_array_append(r, x.j))
                    oom(e, n);
            } else if (i % 2 == 0) {
                if (!json_is_string(x.j))
                    ev_fail(e, ERR_UNSUPPORTED, n, "a dict key that is not a string");
                else
                    jv_drop(&b), b = jv_copy(&x);
            } else if (json_object_set(r, json_string_value(b.j), x.j)) {
                oom(e, n);
            }
            jv_drop(&x);
        }
        if (e->rc)
            json_decref(r);
        else
            *out = jv_json(r);
        break;
    }
    default:
        ev_fail(e, ERR_STATE, n, "a statement where an expression belongs");
    }
    jv_drop(&a);
    jv_drop(&b);
    jv_drop(&c);
    jv_drop(&d);
    if (e->rc)
        jv_drop(out);
    return e->rc;
}

/* ---- statements --------------------------------------------------------------------------- */

/* Binds the for/set targets names[] to v (one name: v itself; several: v unpacked). */
static int bind(struct ev *e, struct frame *f, const struct jn *n, const struct jv *v)
{
    if (n->nnames == 1)
        return frame_set(e, f, n->names[0], jv_copy(v), n);
    if (v->k != JV_JSON || (!json_is_array(v->j) && !json_is_string(v->j)))
        return ev_fail(e, ERR_USAGE, n, "cannot unpack a %s into %zu names", type_name(v),
                       n->nnames);
    json_t *l;
    if (iter_list(e, v, &l, n))
        return e->rc;
    if (json_array_size(l) != n->nnames) {
        json_decref(l);
        return ev_fail(e, ERR_USAGE, n, "cannot unpack %zu values into %zu names",
                       json_array_size(l), n->nnames);
    }
    for (size_t i = 0; i < n->nnames && !e->rc; i++)
        frame_set(e, f, n->names[i], jv_json(json_incref(json_array_get(l, i))), n);
    json_decref(l);
    return e->rc;
}

static int exec_for(struct ev *e, struct frame *f, const struct jn *n)
{
    struct jv it;
    if (eval(e, f, n->a, &it))
        return e->rc;
    json_t *items;
    int rc = iter_list(e, &it, &items, n);
    jv_drop(&it);
    if (rc)
        return rc;
    if (n->d) {
        /* a loop filter runs before the loop: loop.* counts only what passes */
        json_t *kept = json_array();
        for (size_t i = 0; kept && i < json_array_size(items) && !e->rc; i++) {
            struct frame fr = {.parent = f};
            struct jv x = {.k = JV_JSON, .j = json_array_get(items, i)}, c;
            if (!bind(e, &fr, n, &x) && !eval(e, &fr, n->d, &c)) {
                if (truthy(&c) && json_array_append(kept, x.j))
                    oom(e, n);
                jv_drop(&c);
            }
            frame_fini(&fr);
        }
        json_decref(items);
        if (!kept)
            return oom(e, n);
        items = kept;
        if (e->rc) {
            json_decref(items);
            return e->rc;
        }
    }
    struct loopst ls = {.length = json_array_size(items), .items = items};
    int res = 0;
    for (size_t i = 0; i < ls.length && !e->rc; i++) {
        if (step(e, n))
            break;
        struct frame fr = {.parent = f};
        ls.index0 = i;
        struct jv x = {.k = JV_JSON, .j = json_array_get(items, i)};
        struct jv lv = {.k = JV_LOOP, .loop = &ls};
        if (!bind(e, &fr, n, &x) && !frame_set(e, &fr, "loop", lv, n))
            res = exec_body(e, &fr, n->b);
        frame_fini(&fr);
        if (res == 1 || res < 0)
            break;
        res = 0;
    }
    if (!e->rc && ls.length == 0 && n->c)
        res = exec_body(e, f, n->c);
    json_decref(items);
    return e->rc ? e->rc : res > 0 ? res : 0;
}

/* 0, 1 (break), 2 (continue) or a negative error */
static int exec_body(struct ev *e, struct frame *f, const struct jn *b)
{
    for (size_t i = 0; i < b->nv && !e->rc; i++) {
        const struct jn *n = b->v[i];
        if (step(e, n))
            break;
        struct jv v;
        switch (n->kind) {
        case JN_TEXT:
            buf_add(e, e->out, n->name, n->nlen, n);
            break;
        case JN_OUT:
            if (!eval(e, f, n->a, &v)) {
                jv_str(e, e->out, &v, n);
                jv_drop(&v);
            }
            break;
        case JN_IF: {
            const struct jn *c = n;
            int r = 0;
            /* elif chains are nested ifs in c */
            while (c && !e->rc) {
                if (c->kind != JN_IF) {
                    r = exec_body(e, f, c);
                    break;
                }
                if (eval(e, f, c->a, &v))
                    break;
                bool t = truthy(&v);
                jv_drop(&v);
                if (t) {
                    r = exec_body(e, f, c->b);
                    break;
                }
                c = c->c;
            }
            if (r > 0)
                return r;
            break;
        }
        case JN_FOR:
            exec_for(e, f, n);
            break;
        case JN_SET:
            if (eval(e, f, n->a, &v))
                break;
            if (n->name) {
                struct jv ns = lookup(e, f, n->names[0]);
                if (ns.k != JV_NS) {
                    ev_fail(e, ERR_USAGE, n, "cannot assign the attribute '%s' of a %s: only a "
                            "namespace() takes attributes", n->name, type_name(&ns));
                } else if (v.k == JV_NS || v.k == JV_LOOP) {
                    ev_fail(e, ERR_UNSUPPORTED, n, "storing a %s in a namespace", type_name(&v));
                } else {
                    size_t k = 0;
                    while (k < ns.ns->n && strcmp(ns.ns->keys[k], n->name))
                        k++;
                    if (k == ns.ns->n) {
                        if (ns.ns->n == ns.ns->cap) {
                            size_t nc = ns.ns->cap ? ns.ns->cap * 2 : 4;
                            const char **nk = realloc(ns.ns->keys, nc * sizeof *nk);
                            struct jv *nv = nk ? realloc(ns.ns->vals, nc * sizeof *nv) : NULL;
                            if (nk)
                                ns.ns->keys = nk;
                            if (nv)
                                ns.ns->vals = nv;
                            if (!nk || !nv) {
                                oom(e, n);
                                jv_drop(&ns);
                                jv_drop(&v);
                                break;
                            }
                            ns.ns->cap = nc;
                        }
                        ns.ns->keys[k] = n->name;
                        ns.ns->vals[k] = UNDEF;
                        ns.ns->n++;
                    }
                    jv_drop(&ns.ns->vals[k]);
                    ns.ns->vals[k] = v;
                    v = UNDEF;
                }
                jv_drop(&ns);
            } else if (v.k == JV_LOOP) {
                ev_fail(e, ERR_UNSUPPORTED, n, "assigning the loop object");
            } else {
                bind(e, f, n, &v);
            }
            jv_drop(&v);
            break;
        case JN_SETBLOCK: {
            struct buf bb = {0};
            struct buf *saved = e->out;
            e->out = &bb;
            int r = exec_body(e, f, n->b);
            e->out = saved;
            if (r > 0)
                ev_fail(e, ERR_UNSUPPORTED, n, "break/continue inside a set block");
            if (!e->rc) {
                json_t *s = json_stringn_nocheck(bb.p ? bb.p : "", bb.n);
                if (!s)
                    oom(e, n);
                else
                    frame_set(e, f, n->names[0], jv_json(s), n);
            }
            free(bb.p);
            break;
        }
        case JN_MACRO: {
            struct jv m = {.k = JV_MACRO, .m = n};
            frame_set(e, f, n->name, m, n);
            break;
        }
        case JN_BREAK:
            return 1;
        case JN_CONTINUE:
            return 2;
        default:
            ev_fail(e, ERR_STATE, n, "an expression where a statement belongs");
        }
    }
    return e->rc;
}

int jinja_render(const struct jinja_tpl *t, json_t *ctx, const struct jinja_limits *lim,
                 char **out, size_t *out_len, char *err, size_t cap)
{
    struct buf b = {0};
    struct frame root = {0};
    struct ev e = {
        .ctx = ctx,
        .root = &root,
        .out = &b,
        .max_output = lim && lim->max_output ? lim->max_output : DEF_MAX_OUTPUT,
        .max_steps = lim && lim->max_steps ? lim->max_steps : DEF_MAX_STEPS,
        .max_depth = lim && lim->max_depth ? lim->max_depth : DEF_MAX_DEPTH,
        .now = lim ? lim->now : 0,
        .err = err,
        .errcap = cap,
    };
    *out = NULL;
    *out_len = 0;
    if (cap)
        err[0] = 0;
    if (!json_is_object(ctx)) {
        snprintf(err, cap, "the render variables must be a JSON object");
        return ERR_USAGE;
    }
    int r = exec_body(&e, &root, t->root);
    if (r > 0 && !e.rc)
        ev_fail(&e, ERR_USAGE, NULL, "break/continue outside a loop");
    frame_fini(&root);
    if (e.rc) {
        free(b.p);
        return e.rc;
    }
    if (!b.p) {
        b.p = strdup("");
        if (!b.p) {
            snprintf(err, cap, "out of memory");
            return -ENOMEM;
        }
    }
    *out = b.p;
    *out_len = b.n;
    return 0;
}

int jinja_json_dumps(json_t *v, char **out)
{
    char err[128];
    struct buf b = {0};
    struct ev e = {.max_output = SIZE_MAX, .err = err, .errcap = sizeof err};
    struct dumpopt o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
    *out = NULL;
    if (dump(&e, &b, v, &o, 0, NULL) || (!b.p && buf_add(&e, &b, "", 0, NULL))) {
        free(b.p);
        return e.rc;
    }
    *out = b.p;
    return 0;
}
