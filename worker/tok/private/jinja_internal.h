/*
 * jinja_internal.h — what jinja_parse.c (lexer and parser) hands jinja_eval.c: the syntax tree
 * of a template. Not part of jinja.h: only the two halves of the interpreter see it.
 */
#ifndef CLOCHER_WORKER_TOK_JINJA_INTERNAL_H
#define CLOCHER_WORKER_TOK_JINJA_INTERNAL_H

#include <jansson.h>
#include <stddef.h>

enum jn_kind {
    /* expressions */
    JN_LIT,    /* lit: a constant (string, number, bool, none) */
    JN_NAME,   /* name */
    JN_ATTR,   /* a.name */
    JN_ITEM,   /* a[b] */
    JN_SLICE,  /* a[b:c:d], each of b, c, d may be NULL */
    JN_CALL,   /* a(v...), names[i]: the keyword of v[i] or NULL */
    JN_FILTER, /* a | name(v...) */
    JN_TEST,   /* a is [not] name(v...); op: 1 when negated */
    JN_NEG,    /* -a (op '-') or +a (op '+') */
    JN_NOT,    /* not a */
    JN_BIN,    /* a op b: op one of JN_OP_* */
    JN_AND,    /* a and b */
    JN_OR,     /* a or b */
    JN_COND,   /* b if a else c (c may be NULL: undefined) */
    JN_LIST,   /* [v...] and tuples (a, b) */
    JN_DICT,   /* {v[0]: v[1], v[2]: v[3], ...} */
    /* statements */
    JN_BODY,     /* v: statements in order */
    JN_TEXT,     /* name: literal text (len in nlen) */
    JN_OUT,      /* {{ a }} */
    JN_IF,       /* if a: b (body) else c (body, or NULL) */
    JN_FOR,      /* for names in a [if d]: b else c */
    JN_SET,      /* set names = a (one name, or several to unpack); name: the ns attr */
    JN_SETBLOCK, /* set names[0] %}b{% endset */
    JN_MACRO,    /* macro name(names = v defaults...): b */
    JN_BREAK,
    JN_CONTINUE,
};

enum jn_op {
    JN_OP_ADD = 1, JN_OP_SUB, JN_OP_MUL, JN_OP_DIV, JN_OP_FLOORDIV, JN_OP_MOD, JN_OP_POW,
    JN_OP_CONCAT, JN_OP_EQ, JN_OP_NE, JN_OP_LT, JN_OP_LE, JN_OP_GT, JN_OP_GE, JN_OP_IN,
    JN_OP_NOTIN,
};

struct jn {
    enum jn_kind kind;
    int op;
    int line;
    char *name; /* NAME, ATTR, FILTER, TEST, TEXT, MACRO, SET (ns attr) */
    size_t nlen;
    json_t *lit;
    struct jn *a, *b, *c, *d;
    struct jn **v;
    size_t nv;
    char **names; /* CALL/FILTER/TEST: nv keyword names or NULL; FOR/SET/MACRO: nnames targets */
    size_t nnames;
};

struct jinja_tpl {
    struct jn *root; /* a JN_BODY */
};

void jinja__node_free(struct jn *n);

/* The filters, tests, globals and methods the evaluator implements: the parser refuses any
 * other name at load. */
int jinja__known_filter(const char *name);
int jinja__known_test(const char *name);
int jinja__known_method(const char *name);

#endif
