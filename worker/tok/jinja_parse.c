/*
 * jinja_parse.c — the lexer and parser of the Jinja2 interpreter (jinja.h): template text to
 * the syntax tree of jinja_internal.h.
 *
 * The lexer follows jinja2's lexer.py with trim_blocks and lstrip_blocks on, as Hugging Face
 * renders chat templates: newlines normalized to \n and one trailing newline dropped; `{%-`
 * and `-%}` strip all whitespace on their side; a block or comment tag alone on its line
 * (only spaces/tabs before it) takes that indentation away (lstrip_blocks) unless written
 * `{%+`; the newline right after `%}` or `#}` is dropped (trim_blocks) unless written `+%}`.
 * The parser follows jinja2's parser.py precedence (or, and, not, comparisons, + -, ~, * / //
 * %, **, unary, postfix with filters and tests). Anything else is refused with its name.
 */
#include "jinja.h"
#include "jinja_internal.h"

#include "err.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 100 /* syntax tree height: the parser, evaluator and free recurse on it */

enum tk_type {
    TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME,
    TK_STRING, TK_INT, TK_FLOAT, TK_OP,
};

struct tk {
    enum tk_type type;
    int line;
    char *s; /* owned: text, name, string value or operator */
    size_t len;
    long long i;
    double f;
};

struct parser {
    struct tk *t;
    size_t n, cap, pos;
    int depth;
    int rc;
    char *err;
    size_t errcap;
};

static int fail(struct parser *p, int rc, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct parser *p, int rc, int line, const char *fmt, ...)
{
    if (p->rc == 0) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(p->err, p->errcap, "template line %d: %s", line, msg);
        p->rc = rc;
    }
    return p->rc;
}

static int push(struct parser *p, enum tk_type type, int line, const char *s, size_t len)
{
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        struct tk *nt = realloc(p->t, nc * sizeof *nt);
        if (!nt)
            return fail(p, -ENOMEM, line, "out of memory");
        p->t = nt;
        p->cap = nc;
    }
    struct tk *k = &p->t[p->n];
    memset(k, 0, sizeof *k);
    k->type = type;
    k->line = line;
    k->s = malloc(len + 1);
    if (!k->s)
        return fail(p, -ENOMEM, line, "out of memory");
    if (len)
        memcpy(k->s, s, len);
    k->s[len] = 0;
    k->len = len;
    p->n++;
    return 0;
}

static bool py_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f);
}

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* A string literal's body with Python escapes (jinja2 decodes them with unicode-escape). */
static int lex_string(struct parser *p, const char *s, size_t n, size_t *i, int line)
{
    char q = s[*i];
    size_t j = *i + 1;
    char *buf = malloc(n - *i + 1);
    size_t o = 0;
    if (!buf)
        return fail(p, -ENOMEM, line, "out of memory");
    for (;; j++) {
        if (j >= n) {
            free(buf);
            return fail(p, ERR_FORMAT, line, "unterminated string literal");
        }
        char c = s[j];
        if (c == q)
            break;
        if (c != '\\') {
            buf[o++] = c;
            continue;
        }
        if (++j >= n) {
            free(buf);
            return fail(p, ERR_FORMAT, line, "unterminated string literal");
        }
        c = s[j];
        switch (c) {
        case 'n': buf[o++] = '\n'; break;
        case 't': buf[o++] = '\t'; break;
        case 'r': buf[o++] = '\r'; break;
        case '\\': buf[o++] = '\\'; break;
        case '\'': buf[o++] = '\''; break;
        case '"': buf[o++] = '"'; break;
        case '\n': break;
        case 'a': buf[o++] = '\a'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'v': buf[o++] = '\v'; break;
        case 'x': case 'u': case 'U': {
            int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            unsigned long cp = 0;
            for (int k = 0; k < nd; k++) {
                if (j + 1 >= n || !isxdigit((unsigned char)s[j + 1])) {
                    free(buf);
                    return fail(p, ERR_FORMAT, line, "truncated \\%c escape in a string", c);
                }
                char h = s[++j];
                cp = cp * 16 + (unsigned long)(isdigit((unsigned char)h) ? h - '0'
                                                                         : (tolower(h) - 'a' + 10));
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                free(buf);
                return fail(p, ERR_UNSUPPORTED, line, "escape \\%c%lx is not a scalar value", c, cp);
            }
            /* UTF-8 of cp: at most 4 bytes, never more than the 4+ escape chars it replaces */
            if (cp < 0x80) {
                buf[o++] = (char)cp;
            } else if (cp < 0x800) {
                buf[o++] = (char)(0xC0 | (cp >> 6));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[o++] = (char)(0xE0 | (cp >> 12));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[o++] = (char)(0xF0 | (cp >> 18));
                buf[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                free(buf);
                return fail(p, ERR_UNSUPPORTED, line, "octal escapes in strings");
            }
            /* Python keeps an unknown escape as written */
            buf[o++] = '\\';
            buf[o++] = c;
        }
    }
    int rc = push(p, TK_STRING, line, buf, o);
    free(buf);
    *i = j + 1;
    return rc;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                  "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".",
                                  ":", "|", NULL};

/* Tokens of one tag from s[*i] up to its end (`}}` or `%}` outside brackets); *i is left on
 * the end's first byte (or its '-'/'+'). */
static int lex_tag(struct parser *p, const char *s, size_t n, size_t *i, int *line, bool var)
{
    char close = var ? '}' : '%';
    int bal = 0;
    size_t j = *i;
    for (;;) {
        while (j < n && py_space(s[j])) {
            *line += s[j] == '\n';
            j++;
        }
        if (j >= n)
            return fail(p, ERR_FORMAT, *line, "unclosed %s tag", var ? "{{" : "{%");
        if (bal == 0) {
            size_t k = j;
            if ((s[k] == '-' || s[k] == '+') && k + 2 < n + 1 && k + 1 < n && s[k + 1] == close &&
                k + 2 < n && s[k + 2] == '}')
                break;
            if (s[k] == close && k + 1 < n && s[k + 1] == '}')
                break;
        }
        char c = s[j];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t k = j;
            while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '_'))
                k++;
            if (push(p, TK_NAME, *line, s + j, k - j))
                return p->rc;
            j = k;
        } else if (isdigit((unsigned char)c)) {
            size_t k = j;
            bool fl = false;
            while (k < n && (isdigit((unsigned char)s[k]) || s[k] == '_'))
                k++;
            if (k + 1 < n && s[k] == '.' && isdigit((unsigned char)s[k + 1])) {
                fl = true;
                k++;
                while (k < n && (isdigit((unsigned char)s[k]) || s[k] == '_'))
                    k++;
            }
            if (k < n && (s[k] == 'e' || s[k] == 'E')) {
                size_t e = k + 1;
                if (e < n && (s[e] == '+' || s[e] == '-'))
                    e++;
                if (e < n && isdigit((unsigned char)s[e])) {
                    fl = true;
                    k = e;
                    while (k < n && isdigit((unsigned char)s[k]))
                        k++;
                }
            }
            char num[64];
            size_t o = 0;
            for (size_t m = j; m < k && o + 1 < sizeof num; m++)
                if (s[m] != '_')
                    num[o++] = s[m];
            num[o] = 0;
            if (push(p, fl ? TK_FLOAT : TK_INT, *line, s + j, k - j))
                return p->rc;
            struct tk *t = &p->t[p->n - 1];
            if (fl) {
                t->f = strtod(num, NULL);
            } else {
                errno = 0;
                t->i = strtoll(num, NULL, 10);
                if (errno == ERANGE)
                    return fail(p, ERR_UNSUPPORTED, *line, "integer literal %s beyond 64 bits", num);
            }
            j = k;
        } else if (c == '\'' || c == '"') {
            int l0 = *line;
            size_t j0 = j;
            if (lex_string(p, s, n, &j, *line))
                return p->rc;
            *line = l0 + count_lines(s + j0, j - j0);
        } else {
            const char *op = NULL;
            for (int k = 0; OPS[k]; k++)
                if (strncmp(s + j, OPS[k], strlen(OPS[k])) == 0) {
                    op = OPS[k];
                    break;
                }
            if (!op)
                return fail(p, ERR_FORMAT, *line, "unexpected character '%c' in a tag", c);
            if (op[0] == '(' || op[0] == '[' || op[0] == '{')
                bal++;
            else if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
                if (bal == 0)
                    return fail(p, ERR_FORMAT, *line, "unexpected '%c'", op[0]);
                bal--;
            }
            if (push(p, TK_OP, *line, op, strlen(op)))
                return p->rc;
            j += strlen(op);
        }
    }
    *i = j;
    return 0;
}

static int lex(struct parser *p, const char *src, size_t len)
{
    /* newline normalization as jinja2's lexer: \r\n and \r become \n, one trailing \n goes */
    char *s = malloc(len + 1);
    if (!s)
        return fail(p, -ENOMEM, 1, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;

    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < n && p->rc == 0) {
        /* the next tag opener */
        size_t q = pos;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        for (; q + 1 < n; q++) {
            if (s[q] != '{')
                continue;
            if (s[q + 1] == '{') { kind = 1; break; }
            if (s[q + 1] == '%') { kind = 2; break; }
            if (s[q + 1] == '#') { kind = 3; break; }
        }
        if (!kind) {
            if (push(p, TK_TEXT, line, s + pos, n - pos))
                break;
            break;
        }
        size_t tlen = q - pos;
        char sign = q + 2 < n ? s[q + 2] : 0;
        if (sign != '-' && sign != '+')
            sign = 0;
        if (sign == '-') {
            while (tlen > 0 && py_space(s[pos + tlen - 1]))
                tlen--;
        } else if (sign != '+' && kind != 1) {
            /* lstrip_blocks: only spaces between the line's start and the tag */
            size_t lp = tlen;
            while (lp > 0 && s[pos + lp - 1] != '\n')
                lp--;
            if (lp > 0 || line_starting) {
                bool ws = lp < tlen;
                for (size_t k = lp; k < tlen; k++)
                    if (!py_space(s[pos + k]))
                        ws = false;
                if (ws)
                    tlen = lp;
            }
        }
        if (tlen && push(p, TK_TEXT, line, s + pos, tlen))
            break;
        line += count_lines(s + pos, q - pos);
        size_t j = q + 2 + (sign ? 1 : 0);
        if (kind == 3) {
            /* a comment ends at the first `#}` (or `-#}` / `+#}`) */
            size_t e = j;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}'))
                e++;
            if (e + 1 >= n) {
                fail(p, ERR_FORMAT, line, "unclosed comment");
                break;
            }
            char esign = e > j && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            line += count_lines(s + j, e - j);
            j = e + 2;
            if (esign == '-') {
                while (j < n && py_space(s[j]))
                    line += s[j++] == '\n';
            } else if (esign != '+' && j < n && s[j] == '\n') {
                j++;
                line++;
            }
            line_starting = j > 0 && s[j - 1] == '\n';
            pos = j;
            continue;
        }
        if (push(p, kind == 1 ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, line, "", 0))
            break;
        if (lex_tag(p, s, n, &j, &line, kind == 1))
            break;
        char esign = s[j] == '-' || s[j] == '+' ? s[j] : 0;
        j += (esign ? 1 : 0) + 2;
        if (push(p, kind == 1 ? TK_VAR_END : TK_BLOCK_END, line, "", 0))
            break;
        if (esign == '-') {
            while (j < n && py_space(s[j]))
                line += s[j++] == '\n';
        } else if (kind == 2 && esign != '+' && j < n && s[j] == '\n') {
            j++;
            line++;
        }
        line_starting = s[j - 1] == '\n';
        pos = j;
    }
    free(s);
    if (p->rc == 0)
        push(p, TK_EOF, line, "", 0);
    return p->rc;
}

/* ---- parser ------------------------------------------------------------------------------ */

static struct tk *cur(struct parser *p) { return &p->t[p->pos]; }
static void adv(struct parser *p)
{
    if (p->t[p->pos].type != TK_EOF)
        p->pos++;
}
static bool is_op(struct parser *p, const char *op)
{
    return cur(p)->type == TK_OP && strcmp(cur(p)->s, op) == 0;
}
static bool is_name(struct parser *p, const char *nm)
{
    return cur(p)->type == TK_NAME && strcmp(cur(p)->s, nm) == 0;
}
static int expect_op(struct parser *p, const char *op)
{
    if (!is_op(p, op))
        return fail(p, ERR_FORMAT, cur(p)->line, "expected '%s', found '%s'", op,
                    cur(p)->type == TK_EOF ? "end of template" : cur(p)->s);
    adv(p);
    return 0;
}

static struct jn *node(struct parser *p, enum jn_kind k)
{
    struct jn *n = calloc(1, sizeof *n);
    if (!n) {
        fail(p, -ENOMEM, cur(p)->line, "out of memory");
        return NULL;
    }
    n->kind = k;
    n->line = cur(p)->line;
    return n;
}

void jinja__node_free(struct jn *n)
{
    if (!n)
        return;
    free(n->name);
    if (n->lit)
        json_decref(n->lit);
    jinja__node_free(n->a);
    jinja__node_free(n->b);
    jinja__node_free(n->c);
    jinja__node_free(n->d);
    for (size_t i = 0; i < n->nv; i++)
        jinja__node_free(n->v[i]);
    free(n->v);
    for (size_t i = 0; i < n->nnames; i++)
        free(n->names[i]);
    free(n->names);
    free(n);
}

/* Appends kid (and keyword kw, copied, or NULL) to n->v; frees kid on failure. */
static int add_kid(struct parser *p, struct jn *n, struct jn *kid, const char *kw, bool with_kw)
{
    struct jn **nv = realloc(n->v, (n->nv + 1) * sizeof *nv);
    if (nv)
        n->v = nv;
    char **nn = NULL;
    if (nv && with_kw) {
        nn = realloc(n->names, (n->nv + 1) * sizeof *nn);
        if (nn)
            n->names = nn;
    }
    if (!nv || (with_kw && !nn)) {
        jinja__node_free(kid);
        return fail(p, -ENOMEM, n->line, "out of memory");
    }
    if (with_kw) {
        n->names[n->nv] = kw ? strdup(kw) : NULL;
        n->nnames = n->nv + 1;
    }
    n->v[n->nv++] = kid;
    return 0;
}

static int add_name(struct parser *p, struct jn *n, const char *nm)
{
    char **nn = realloc(n->names, (n->nnames + 1) * sizeof *nn);
    if (!nn)
        return fail(p, -ENOMEM, n->line, "out of memory");
    n->names = nn;
    n->names[n->nnames] = strdup(nm);
    if (!n->names[n->nnames])
        return fail(p, -ENOMEM, n->line, "out of memory");
    n->nnames++;
    return 0;
}

static struct jn *expr(struct parser *p);
static struct jn *unary(struct parser *p, bool with_filter);

/* One more level of the tree: `a + b + c`, `x.a.b` and `x|f|g` grow it in loops, not by
 * recursion, so each step counts too (the caller restores p->depth when done). */
static bool deeper(struct parser *p)
{
    if (++p->depth > MAX_NEST) {
        fail(p, ERR_RANGE, cur(p)->line, "expressions nested deeper than %d", MAX_NEST);
        return false;
    }
    return true;
}

/* the functions a template may call by name besides its own macros */
static const char *const GLOBALS[] = {"namespace", "raise_exception", "strftime_now", "range",
                                      "dict", NULL};

/* (args...) of a call, filter or test into n->v / n->names. */
static int call_args(struct parser *p, struct jn *n)
{
    if (expect_op(p, "("))
        return p->rc;
    while (!is_op(p, ")")) {
        if (n->nv && expect_op(p, ","))
            return p->rc;
        if (is_op(p, ")"))
            break;
        if (is_op(p, "*") || is_op(p, "**"))
            return fail(p, ERR_UNSUPPORTED, cur(p)->line, "*args / **kwargs in calls");
        const char *kw = NULL;
        if (cur(p)->type == TK_NAME && p->t[p->pos + 1].type == TK_OP &&
            strcmp(p->t[p->pos + 1].s, "=") == 0) {
            kw = cur(p)->s;
            adv(p);
            adv(p);
        } else {
            for (size_t i = 0; i < n->nv; i++)
                if (n->names[i])
                    return fail(p, ERR_FORMAT, cur(p)->line,
                                "a positional argument after a keyword argument");
        }
        struct jn *e = expr(p);
        if (!e || add_kid(p, n, e, kw, true))
            return p->rc;
    }
    adv(p);
    if (n->nv == 0) {
        n->names = NULL;
        n->nnames = 0;
    }
    return 0;
}

static struct jn *literal_or_collection(struct parser *p)
{
    struct tk *t = cur(p);
    struct jn *n = NULL;
    if (t->type == TK_STRING) {
        /* adjacent string literals concatenate, as in jinja2 */
        size_t total = 0, k = p->pos;
        while (p->t[k].type == TK_STRING)
            total += p->t[k++].len;
        char *buf = malloc(total + 1);
        if (!buf) {
            fail(p, -ENOMEM, t->line, "out of memory");
            return NULL;
        }
        size_t o = 0;
        while (cur(p)->type == TK_STRING) {
            memcpy(buf + o, cur(p)->s, cur(p)->len);
            o += cur(p)->len;
            adv(p);
        }
        n = node(p, JN_LIT);
        if (n)
            n->lit = json_stringn_nocheck(buf, o);
        free(buf);
        if (n && !n->lit) {
            free(n);
            fail(p, -ENOMEM, t->line, "out of memory");
            return NULL;
        }
        return n;
    }
    if (t->type == TK_INT || t->type == TK_FLOAT) {
        n = node(p, JN_LIT);
        if (!n)
            return NULL;
        n->lit = t->type == TK_INT ? json_integer(t->i) : json_real(t->f);
        adv(p);
        if (!n->lit) {
            free(n);
            fail(p, ERR_UNSUPPORTED, t->line, "the number %s", t->s);
            return NULL;
        }
        return n;
    }
    if (t->type == TK_NAME) {
        const char *s = t->s;
        json_t *lit = NULL;
        if (!strcmp(s, "true") || !strcmp(s, "True"))
            lit = json_true();
        else if (!strcmp(s, "false") || !strcmp(s, "False"))
            lit = json_false();
        else if (!strcmp(s, "none") || !strcmp(s, "None"))
            lit = json_null();
        if (lit) {
            n = node(p, JN_LIT);
            if (n)
                n->lit = lit;
            adv(p);
            return n;
        }
        n = node(p, JN_NAME);
        if (!n)
            return NULL;
        n->name = strdup(s);
        adv(p);
        if (!n->name) {
            free(n);
            fail(p, -ENOMEM, t->line, "out of memory");
            return NULL;
        }
        return n;
    }
    if (t->type == TK_OP && (!strcmp(t->s, "(") || !strcmp(t->s, "["))) {
        bool paren = t->s[0] == '(';
        const char *close = paren ? ")" : "]";
        adv(p);
        n = node(p, JN_LIST);
        if (!n)
            return NULL;
        bool comma = false;
        while (!is_op(p, close)) {
            if (n->nv && expect_op(p, ","))
                goto bad;
            if (n->nv)
                comma = true;
            if (is_op(p, close))
                break;
            struct jn *e = expr(p);
            if (!e || add_kid(p, n, e, NULL, false))
                goto bad;
        }
        adv(p);
        if (paren && n->nv == 1 && !comma) {
            /* (x) is x, not a tuple */
            struct jn *e = n->v[0];
            n->nv = 0;
            jinja__node_free(n);
            return e;
        }
        return n;
    }
    if (t->type == TK_OP && !strcmp(t->s, "{")) {
        adv(p);
        n = node(p, JN_DICT);
        if (!n)
            return NULL;
        while (!is_op(p, "}")) {
            if (n->nv && expect_op(p, ","))
                goto bad;
            if (is_op(p, "}"))
                break;
            struct jn *k = expr(p);
            if (!k || add_kid(p, n, k, NULL, false) || expect_op(p, ":"))
                goto bad;
            struct jn *v = expr(p);
            if (!v || add_kid(p, n, v, NULL, false))
                goto bad;
        }
        adv(p);
        return n;
    }
    fail(p, ERR_FORMAT, t->line, "unexpected '%s' in an expression",
         t->type == TK_EOF ? "end of template" : t->type == TK_VAR_END || t->type == TK_BLOCK_END
                                                     ? "end of tag" : t->s);
    return NULL;
bad:
    jinja__node_free(n);
    return NULL;
}

/* Subscripts, attributes and calls after a primary. */
static struct jn *postfix(struct parser *p, struct jn *n)
{
    int d0 = p->depth;
    while (n && p->rc == 0 && deeper(p)) {
        if (is_op(p, ".")) {
            adv(p);
            if (cur(p)->type != TK_NAME && cur(p)->type != TK_INT) {
                fail(p, ERR_FORMAT, cur(p)->line, "expected an attribute name after '.'");
                break;
            }
            struct jn *a = node(p, cur(p)->type == TK_INT ? JN_ITEM : JN_ATTR);
            if (!a)
                break;
            a->a = n;
            n = a;
            if (cur(p)->type == TK_INT) {
                struct jn *l = node(p, JN_LIT);
                if (!l)
                    break;
                l->lit = json_integer(cur(p)->i);
                a->b = l;
            } else {
                a->name = strdup(cur(p)->s);
                if (!a->name) {
                    fail(p, -ENOMEM, cur(p)->line, "out of memory");
                    break;
                }
            }
            adv(p);
            if (a->kind == JN_ATTR && is_op(p, "(") && !jinja__known_method(a->name)) {
                fail(p, ERR_UNSUPPORTED, a->line, "the method '%s()'", a->name);
                break;
            }
        } else if (is_op(p, "[")) {
            adv(p);
            struct jn *lo = NULL, *hi = NULL, *st = NULL;
            bool slice = false;
            if (!is_op(p, ":")) {
                lo = expr(p);
                if (!lo)
                    break;
            }
            if (is_op(p, ":")) {
                slice = true;
                adv(p);
                if (!is_op(p, "]") && !is_op(p, ":"))
                    hi = expr(p);
                if (is_op(p, ":")) {
                    adv(p);
                    if (!is_op(p, "]"))
                        st = expr(p);
                }
            }
            struct jn *it = p->rc ? NULL : node(p, slice ? JN_SLICE : JN_ITEM);
            if (!it) {
                jinja__node_free(lo);
                jinja__node_free(hi);
                jinja__node_free(st);
                break;
            }
            it->a = n;
            it->b = lo;
            it->c = hi;
            it->d = st;
            n = it;
            if (expect_op(p, "]"))
                break;
        } else if (is_op(p, "(")) {
            struct jn *c = node(p, JN_CALL);
            if (!c)
                break;
            c->a = n;
            n = c;
            if (call_args(p, c))
                break;
        } else {
            return p->depth = d0, n;
        }
    }
    jinja__node_free(n);
    p->depth = d0;
    return NULL;
}

static struct jn *filter_or_test(struct parser *p, struct jn *n)
{
    int d0 = p->depth;
    while (n && p->rc == 0 && deeper(p)) {
        if (is_op(p, "|")) {
            adv(p);
            if (cur(p)->type != TK_NAME) {
                fail(p, ERR_FORMAT, cur(p)->line, "expected a filter name after '|'");
                break;
            }
            struct jn *f = node(p, JN_FILTER);
            if (!f)
                break;
            f->a = n;
            n = f;
            f->name = strdup(cur(p)->s);
            if (!f->name) {
                fail(p, -ENOMEM, f->line, "out of memory");
                break;
            }
            adv(p);
            if (!jinja__known_filter(f->name)) {
                fail(p, ERR_UNSUPPORTED, f->line, "the filter '%s'", f->name);
                break;
            }
            if (is_op(p, "(") && call_args(p, f))
                break;
        } else if (is_name(p, "is")) {
            adv(p);
            struct jn *t = node(p, JN_TEST);
            if (!t)
                break;
            t->a = n;
            n = t;
            if (is_name(p, "not")) {
                t->op = 1;
                adv(p);
            }
            if (cur(p)->type != TK_NAME) {
                fail(p, ERR_FORMAT, cur(p)->line, "expected a test name after 'is'");
                break;
            }
            /* `is none` / `is true` / `is false` lex as literals-to-be: take the word */
            t->name = strdup(cur(p)->s);
            if (!t->name) {
                fail(p, -ENOMEM, t->line, "out of memory");
                break;
            }
            adv(p);
            if (!jinja__known_test(t->name)) {
                fail(p, ERR_UNSUPPORTED, t->line, "the test '%s'", t->name);
                break;
            }
            if (is_op(p, "(")) {
                if (call_args(p, t))
                    break;
            } else {
                struct tk *c = cur(p);
                bool arg = c->type == TK_STRING || c->type == TK_INT || c->type == TK_FLOAT ||
                           (c->type == TK_OP && (!strcmp(c->s, "[") || !strcmp(c->s, "{"))) ||
                           (c->type == TK_NAME && strcmp(c->s, "else") && strcmp(c->s, "or") &&
                            strcmp(c->s, "and"));
                if (arg) {
                    if (c->type == TK_NAME && !strcmp(c->s, "is")) {
                        fail(p, ERR_FORMAT, c->line, "you cannot chain tests with 'is'");
                        break;
                    }
                    struct jn *e = postfix(p, literal_or_collection(p));
                    if (!e || add_kid(p, t, e, NULL, true))
                        break;
                }
            }
        } else if (is_op(p, "(")) {
            struct jn *c = node(p, JN_CALL);
            if (!c)
                break;
            c->a = n;
            n = c;
            if (call_args(p, c))
                break;
        } else {
            return p->depth = d0, n;
        }
    }
    jinja__node_free(n);
    p->depth = d0;
    return NULL;
}

static struct jn *unary(struct parser *p, bool with_filter)
{
    if (++p->depth > MAX_NEST) {
        fail(p, ERR_RANGE, cur(p)->line, "expressions nested deeper than %d", MAX_NEST);
        return NULL;
    }
    struct jn *n;
    if (is_op(p, "-") || is_op(p, "+")) {
        int op = cur(p)->s[0];
        adv(p);
        struct jn *a = unary(p, false);
        n = a ? node(p, JN_NEG) : NULL;
        if (!n) {
            jinja__node_free(a);
            p->depth--;
            return NULL;
        }
        n->op = op;
        n->a = a;
    } else {
        n = postfix(p, literal_or_collection(p));
    }
    if (n && with_filter)
        n = filter_or_test(p, n);
    p->depth--;
    return n;
}

static struct jn *binop(struct parser *p, struct jn *l, enum jn_kind k, int op, struct jn *r)
{
    if (!l || !r) {
        jinja__node_free(l);
        jinja__node_free(r);
        return NULL;
    }
    struct jn *n = node(p, k);
    if (!n) {
        jinja__node_free(l);
        jinja__node_free(r);
        return NULL;
    }
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static struct jn *power(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = unary(p, true);
    while (l && is_op(p, "**")) {
        if (!deeper(p)) {
            jinja__node_free(l);
            l = NULL;
            break;
        }
        adv(p);
        l = binop(p, l, JN_BIN, JN_OP_POW, unary(p, true));
    }
    return p->depth = d0, l;
}

static struct jn *math2(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = power(p);
    for (;;) {
        int op = is_op(p, "*") ? JN_OP_MUL : is_op(p, "/") ? JN_OP_DIV
                 : is_op(p, "//") ? JN_OP_FLOORDIV : is_op(p, "%") ? JN_OP_MOD : 0;
        if (!l || !op)
            return p->depth = d0, l;
        if (!deeper(p)) {
            jinja__node_free(l);
            return p->depth = d0, NULL;
        }
        adv(p);
        l = binop(p, l, JN_BIN, op, power(p));
    }
}

static struct jn *concat(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = math2(p);
    while (l && is_op(p, "~")) {
        if (!deeper(p)) {
            jinja__node_free(l);
            l = NULL;
            break;
        }
        adv(p);
        l = binop(p, l, JN_BIN, JN_OP_CONCAT, math2(p));
    }
    return p->depth = d0, l;
}

static struct jn *math1(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = concat(p);
    for (;;) {
        int op = is_op(p, "+") ? JN_OP_ADD : is_op(p, "-") ? JN_OP_SUB : 0;
        if (!l || !op)
            return p->depth = d0, l;
        if (!deeper(p)) {
            jinja__node_free(l);
            return p->depth = d0, NULL;
        }
        adv(p);
        l = binop(p, l, JN_BIN, op, concat(p));
    }
}

static struct jn *compare(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = math1(p);
    bool compared = false;
    for (;;) {
        int op = 0;
        if (is_op(p, "==")) op = JN_OP_EQ;
        else if (is_op(p, "!=")) op = JN_OP_NE;
        else if (is_op(p, "<")) op = JN_OP_LT;
        else if (is_op(p, "<=")) op = JN_OP_LE;
        else if (is_op(p, ">")) op = JN_OP_GT;
        else if (is_op(p, ">=")) op = JN_OP_GE;
        else if (is_name(p, "in")) op = JN_OP_IN;
        else if (is_name(p, "not") && p->t[p->pos + 1].type == TK_NAME &&
                 !strcmp(p->t[p->pos + 1].s, "in")) {
            op = JN_OP_NOTIN;
            adv(p);
        }
        if (!l || !op)
            return p->depth = d0, l;
        /* a < b < c chains in Python; templates do not, and a wrong reading is worse */
        if (compared) {
            fail(p, ERR_UNSUPPORTED, cur(p)->line, "chained comparisons");
            jinja__node_free(l);
            return NULL;
        }
        adv(p);
        compared = true;
        l = binop(p, l, JN_BIN, op, math1(p));
    }
}

static struct jn *not_expr(struct parser *p)
{
    if (is_name(p, "not")) {
        adv(p);
        if (++p->depth > MAX_NEST) {
            fail(p, ERR_RANGE, cur(p)->line, "expressions nested deeper than %d", MAX_NEST);
            return NULL;
        }
        struct jn *a = not_expr(p);
        p->depth--;
        struct jn *n = a ? node(p, JN_NOT) : NULL;
        if (!n) {
            jinja__node_free(a);
            return NULL;
        }
        n->a = a;
        return n;
    }
    return compare(p);
}

static struct jn *and_expr(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = not_expr(p);
    while (l && is_name(p, "and")) {
        if (!deeper(p)) {
            jinja__node_free(l);
            l = NULL;
            break;
        }
        adv(p);
        l = binop(p, l, JN_AND, 0, not_expr(p));
    }
    return p->depth = d0, l;
}

static struct jn *or_expr(struct parser *p)
{
    int d0 = p->depth;
    struct jn *l = and_expr(p);
    while (l && is_name(p, "or")) {
        if (!deeper(p)) {
            jinja__node_free(l);
            l = NULL;
            break;
        }
        adv(p);
        l = binop(p, l, JN_OR, 0, and_expr(p));
    }
    return p->depth = d0, l;
}

/* `a if cond else b` (jinja2's parse_condexpr) */
static struct jn *expr(struct parser *p)
{
    if (++p->depth > MAX_NEST) {
        fail(p, ERR_RANGE, cur(p)->line, "expressions nested deeper than %d", MAX_NEST);
        return NULL;
    }
    int d0 = p->depth;
    struct jn *l = or_expr(p);
    while (l && is_name(p, "if")) {
        if (!deeper(p)) {
            jinja__node_free(l);
            l = NULL;
            break;
        }
        adv(p);
        struct jn *c = or_expr(p);
        struct jn *e = NULL;
        if (c && is_name(p, "else")) {
            adv(p);
            e = expr(p);
            if (!e) {
                jinja__node_free(c);
                c = NULL;
            }
        }
        struct jn *n = c ? node(p, JN_COND) : NULL;
        if (!n) {
            jinja__node_free(l);
            jinja__node_free(c);
            jinja__node_free(e);
            l = NULL;
            break;
        }
        n->a = c;
        n->b = l;
        n->c = e;
        l = n;
    }
    p->depth = d0 - 1;
    return l;
}

/* An expression, or a tuple `a, b` where the grammar allows one (set / for values). */
static struct jn *expr_tuple(struct parser *p)
{
    struct jn *e = expr(p);
    if (!e || !is_op(p, ","))
        return e;
    struct jn *t = node(p, JN_LIST);
    if (!t || add_kid(p, t, e, NULL, false)) {
        jinja__node_free(t);
        return NULL;
    }
    while (is_op(p, ",")) {
        adv(p);
        if (cur(p)->type == TK_BLOCK_END || cur(p)->type == TK_VAR_END)
            break;
        e = expr(p);
        if (!e || add_kid(p, t, e, NULL, false)) {
            jinja__node_free(t);
            return NULL;
        }
    }
    return t;
}

static int end_block(struct parser *p)
{
    if (cur(p)->type != TK_BLOCK_END)
        return fail(p, ERR_FORMAT, cur(p)->line, "expected the end of the tag, found '%s'",
                    cur(p)->type == TK_EOF ? "end of template" : cur(p)->s);
    adv(p);
    return 0;
}

static struct jn *body(struct parser *p, const char *const *ends);

/* Target names of for/set: `a` or `a, b`. */
static int targets(struct parser *p, struct jn *n)
{
    for (;;) {
        if (cur(p)->type != TK_NAME)
            return fail(p, ERR_FORMAT, cur(p)->line, "expected a variable name");
        if (add_name(p, n, cur(p)->s))
            return p->rc;
        adv(p);
        if (!is_op(p, ","))
            return 0;
        adv(p);
    }
}

static const char *const ENDS_IF[] = {"elif", "else", "endif", NULL};
static const char *const ENDS_ENDIF[] = {"endif", NULL};
static const char *const ENDS_FOR[] = {"else", "endfor", NULL};
static const char *const ENDS_ENDFOR[] = {"endfor", NULL};
static const char *const ENDS_MACRO[] = {"endmacro", NULL};
static const char *const ENDS_SET[] = {"endset", NULL};

/* The if statement after `if` / `elif` (current token: the condition). */
static struct jn *stmt_if(struct parser *p)
{
    struct jn *n = node(p, JN_IF);
    if (!n)
        return NULL;
    if (!(n->a = expr(p)) || end_block(p) || !(n->b = body(p, ENDS_IF)))
        goto bad;
    /* body() stopped on elif / else / endif, the tag's name being current */
    if (is_name(p, "elif")) {
        adv(p);
        if (!(n->c = stmt_if(p)))
            goto bad;
        return n; /* the inner if consumed endif */
    }
    if (is_name(p, "else")) {
        adv(p);
        if (end_block(p) || !(n->c = body(p, ENDS_ENDIF)))
            goto bad;
    }
    adv(p); /* endif */
    if (end_block(p))
        goto bad;
    return n;
bad:
    jinja__node_free(n);
    return NULL;
}

static struct jn *stmt(struct parser *p)
{
    struct tk *t = cur(p);
    if (t->type != TK_NAME) {
        fail(p, ERR_FORMAT, t->line, "expected a statement name after '{%%'");
        return NULL;
    }
    const char *kw = t->s;
    int line = t->line;
    struct jn *n = NULL;
    if (!strcmp(kw, "if")) {
        adv(p);
        return stmt_if(p);
    }
    if (!strcmp(kw, "for")) {
        adv(p);
        n = node(p, JN_FOR);
        if (!n || targets(p, n))
            goto bad;
        if (!is_name(p, "in")) {
            fail(p, ERR_FORMAT, cur(p)->line, "expected 'in' in a for loop");
            goto bad;
        }
        adv(p);
        /* the iterable stops before `if` (a loop filter), as jinja2's parse_tuple(with_condexpr=False) */
        if (!(n->a = or_expr(p)))
            goto bad;
        if (is_name(p, "if")) {
            adv(p);
            if (!(n->d = expr(p)))
                goto bad;
        }
        if (is_name(p, "recursive")) {
            fail(p, ERR_UNSUPPORTED, line, "recursive for loops");
            goto bad;
        }
        if (end_block(p) || !(n->b = body(p, ENDS_FOR)))
            goto bad;
        if (is_name(p, "else")) {
            adv(p);
            if (end_block(p) || !(n->c = body(p, ENDS_ENDFOR)))
                goto bad;
        }
        adv(p);
        if (end_block(p))
            goto bad;
        return n;
    }
    if (!strcmp(kw, "set")) {
        adv(p);
        n = node(p, JN_SET);
        if (!n)
            goto bad;
        if (cur(p)->type == TK_NAME && p->t[p->pos + 1].type == TK_OP &&
            !strcmp(p->t[p->pos + 1].s, ".")) {
            /* set ns.attr = value */
            if (add_name(p, n, cur(p)->s))
                goto bad;
            adv(p);
            adv(p);
            if (cur(p)->type != TK_NAME) {
                fail(p, ERR_FORMAT, cur(p)->line, "expected an attribute name");
                goto bad;
            }
            n->name = strdup(cur(p)->s);
            if (!n->name) {
                fail(p, -ENOMEM, line, "out of memory");
                goto bad;
            }
            adv(p);
        } else if (targets(p, n)) {
            goto bad;
        }
        if (cur(p)->type == TK_BLOCK_END && !n->name && n->nnames == 1) {
            n->kind = JN_SETBLOCK;
            adv(p);
            if (!(n->b = body(p, ENDS_SET)))
                goto bad;
            adv(p);
            if (end_block(p))
                goto bad;
            return n;
        }
        if (is_op(p, "|")) {
            fail(p, ERR_UNSUPPORTED, line, "filtered set blocks");
            goto bad;
        }
        if (expect_op(p, "=") || !(n->a = expr_tuple(p)) || end_block(p))
            goto bad;
        return n;
    }
    if (!strcmp(kw, "macro")) {
        adv(p);
        n = node(p, JN_MACRO);
        if (!n)
            goto bad;
        if (cur(p)->type != TK_NAME) {
            fail(p, ERR_FORMAT, cur(p)->line, "expected a macro name");
            goto bad;
        }
        n->name = strdup(cur(p)->s);
        if (!n->name) {
            fail(p, -ENOMEM, line, "out of memory");
            goto bad;
        }
        adv(p);
        if (expect_op(p, "("))
            goto bad;
        while (!is_op(p, ")")) {
            if (n->nnames && expect_op(p, ","))
                goto bad;
            if (cur(p)->type != TK_NAME) {
                fail(p, ERR_FORMAT, cur(p)->line, "expected a parameter name");
                goto bad;
            }
            if (add_name(p, n, cur(p)->s))
                goto bad;
            adv(p);
            struct jn *def = NULL;
            if (is_op(p, "=")) {
                adv(p);
                if (!(def = expr(p)))
                    goto bad;
            } else {
                for (size_t i = 0; i < n->nv; i++)
                    if (n->v[i]) {
                        fail(p, ERR_FORMAT, line, "a parameter without default after one with");
                        goto bad;
                    }
            }
            /* v[i]: the default of parameter i, NULL when none */
            struct jn **nv = realloc(n->v, (n->nv + 1) * sizeof *nv);
            if (!nv) {
                jinja__node_free(def);
                fail(p, -ENOMEM, line, "out of memory");
                goto bad;
            }
            n->v = nv;
            n->v[n->nv++] = def;
        }
        adv(p);
        if (end_block(p) || !(n->b = body(p, ENDS_MACRO)))
            goto bad;
        adv(p);
        if (cur(p)->type == TK_NAME && !strcmp(cur(p)->s, n->name))
            adv(p);
        if (end_block(p))
            goto bad;
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = node(p, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE);
        adv(p);
        if (!n || end_block(p))
            goto bad;
        return n;
    }
    fail(p, ERR_UNSUPPORTED, line, "the tag '{%% %s %%}'", kw);
    return NULL;
bad:
    jinja__node_free(n);
    return NULL;
}

/* Statements until a block tag whose name is in ends (NULL: until the end of the template);
 * leaves that name as the current token. */
static struct jn *body(struct parser *p, const char *const *ends)
{
    if (++p->depth > MAX_NEST) {
        fail(p, ERR_RANGE, cur(p)->line, "blocks nested deeper than %d", MAX_NEST);
        return NULL;
    }
    int line0 = cur(p)->line;
    struct jn *b = node(p, JN_BODY);
    while (b && p->rc == 0) {
        struct tk *t = cur(p);
        struct jn *s = NULL;
        if (t->type == TK_EOF) {
            if (ends) {
                fail(p, ERR_FORMAT, line0, "a block opened here is not closed ('%s' expected)",
                     ends[0]);
                break;
            }
            p->depth--;
            return b;
        }
        if (t->type == TK_TEXT) {
            s = node(p, JN_TEXT);
            if (s) {
                s->name = malloc(t->len + 1);
                if (!s->name) {
                    free(s);
                    s = NULL;
                    fail(p, -ENOMEM, t->line, "out of memory");
                } else {
                    memcpy(s->name, t->s, t->len + 1);
                    s->nlen = t->len;
                }
            }
            adv(p);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(p);
            s = node(p, JN_OUT);
            if (s && (!(s->a = expr_tuple(p)) || p->rc)) {
                jinja__node_free(s);
                s = NULL;
            }
            if (s && cur(p)->type != TK_VAR_END) {
                fail(p, ERR_FORMAT, cur(p)->line, "expected '}}', found '%s'",
                     cur(p)->type == TK_EOF ? "end of template" : cur(p)->s);
                jinja__node_free(s);
                s = NULL;
            }
            adv(p);
        } else if (t->type == TK_BLOCK_BEGIN) {
            adv(p);
            struct tk *k = cur(p);
            if (k->type == TK_NAME && ends)
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(ends[i], k->s)) {
                        p->depth--;
                        return b;
                    }
            if (k->type == TK_NAME &&
                (!strcmp(k->s, "endif") || !strcmp(k->s, "endfor") || !strcmp(k->s, "elif") ||
                 !strcmp(k->s, "else") || !strcmp(k->s, "endmacro") || !strcmp(k->s, "endset"))) {
                fail(p, ERR_FORMAT, k->line, "unexpected '%s'", k->s);
                break;
            }
            s = stmt(p);
        } else {
            fail(p, ERR_FORMAT, t->line, "unexpected '%s'", t->s);
            break;
        }
        if (!s || add_kid(p, b, s, NULL, false))
            break;
    }
    jinja__node_free(b);
    p->depth--;
    return NULL;
}

static void collect_macros(const struct jn *n, const char **names, size_t *k, size_t cap)
{
    if (!n)
        return;
    if (n->kind == JN_MACRO && *k < cap)
        names[(*k)++] = n->name;
    const struct jn *kids[] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++)
        collect_macros(kids[i], names, k, cap);
    for (size_t i = 0; i < n->nv; i++)
        collect_macros(n->v[i], names, k, cap);
}

/* A call by name must reach a global or one of the template's macros: anything else (cycler,
 * joiner, lipsum, a callable variable) is refused at load, not at some render. */
static int check_calls(struct parser *p, const struct jn *n, const char **macros, size_t nm)
{
    if (!n || p->rc)
        return p->rc;
    if (n->kind == JN_CALL && n->a->kind == JN_NAME) {
        bool known = false;
        for (int k = 0; GLOBALS[k]; k++)
            known |= !strcmp(GLOBALS[k], n->a->name);
        for (size_t k = 0; k < nm; k++)
            known |= !strcmp(macros[k], n->a->name);
        if (!known)
            return fail(p, ERR_UNSUPPORTED, n->line, "the function '%s()'", n->a->name);
    }
    const struct jn *kids[] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++)
        check_calls(p, kids[i], macros, nm);
    for (size_t i = 0; i < n->nv; i++)
        check_calls(p, n->v[i], macros, nm);
    return p->rc;
}

int jinja_parse(const char *src, size_t len, struct jinja_tpl **out, char *err, size_t cap)
{
    struct parser p = {.err = err, .errcap = cap};
    *out = NULL;
    if (cap)
        err[0] = 0;
    struct jn *root = NULL;
    if (lex(&p, src, len) == 0)
        root = body(&p, NULL);
    if (root) {
        const char *macros[256];
        size_t nm = 0;
        collect_macros(root, macros, &nm, 256);
        if (nm == 256) {
            fail(&p, ERR_UNSUPPORTED, 1, "more than 255 macros");
        } else {
            check_calls(&p, root, macros, nm);
        }
        if (p.rc) {
            jinja__node_free(root);
            root = NULL;
        }
    }
    for (size_t i = 0; i < p.n; i++)
        free(p.t[i].s);
    free(p.t);
    if (!root)
        return p.rc ? p.rc : ERR_FORMAT;
    struct jinja_tpl *t = malloc(sizeof *t);
    if (!t) {
        jinja__node_free(root);
        snprintf(err, cap, "out of memory");
        return -ENOMEM;
    }
    t->root = root;
    *out = t;
    return 0;
}

void jinja_free(struct jinja_tpl *t)
{
    if (!t)
        return;
    jinja__node_free(t->root);
    free(t);
}
