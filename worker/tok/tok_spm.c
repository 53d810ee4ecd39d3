/*
 * tok_spm.c — SentencePiece BPE encoding (Llama 2, TinyLlama), as SentencePiece's
 * bpe_model.cc defines it:
 *
 *  1. normalize: optionally drop leading/trailing spaces and squeeze runs of them
 *     (remove_extra_whitespaces); empty text gives no tokens; prepend one space (the dummy
 *     prefix) and write every space as U+2581 "▁";
 *  2. split into symbols: a user-defined token where one starts (longest match, never merged
 *     further), otherwise one Unicode character;
 *  3. repeatedly merge the adjacent pair whose concatenation is the vocabulary piece with the
 *     highest score, the leftmost pair on ties (a priority queue of candidate pairs; entries
 *     made stale by an earlier merge are skipped when popped), so encoding is O(n log n);
 *  4. output each final symbol's token; a symbol that is an "unused" piece is split back into
 *     the two symbols it was made of; a symbol that is not a usable piece becomes <0xNN> byte
 *     tokens (byte fallback) or <unk>.
 *
 * Only normal, user-defined and unused pieces take part in merges and output, so control,
 * unknown and byte tokens never come out of text, whatever the text says.
 */
#include "tok_internal.h"

#include "heap.h"

#include "check.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xE2\x96\x81" /* U+2581 */

/* the normalized text (3 bytes per input byte at most, plus the prefix) has 32-bit offsets,
 * and its symbols (at most two per character) 32-bit indices */
_Static_assert(3ull * TOK_MAX_TEXT + 3 <= UINT32_MAX, "normalized offsets are 32-bit");
_Static_assert(2ull * TOK_MAX_TEXT + 2 <= INT32_MAX, "symbol indices are int32");

struct sym {
    uint32_t start, len; /* span of the normalized text */
    int32_t prev, next;  /* neighbours among live symbols, -1 at the ends */
    int32_t left, right; /* the two symbols merged into this one; -1 for an initial symbol */
    int32_t id;          /* its token when known (merged or user-defined), else -1 */
    bool frozen;         /* user-defined: takes part in no merge */
    bool alive;
};

struct cand {
    float score;         /* of the merged piece: higher first */
    uint32_t pos;        /* start of the left symbol: leftmost first on equal scores */
    int32_t left, right; /* symbols; stale once either is no longer alive */
    int32_t id;          /* the merged piece */
};

struct spm {
    const struct tok *t;
    const char *norm;
    struct sym *syms;
    size_t n_syms, cap_syms;
    struct heap heap; /* of struct cand, ordered by before() */
};

static bool before(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    return a->score > b->score || (a->score == b->score && a->pos < b->pos);
}

static int sym_push(struct spm *w, struct sym s, int32_t *index)
{
    if (w->n_syms == w->cap_syms) {
        size_t cap = w->cap_syms ? w->cap_syms * 2 : 256;
        struct sym *v = realloc(w->syms, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        w->syms = v;
        w->cap_syms = cap;
    }
    *index = (int32_t)w->n_syms;
    w->syms[w->n_syms++] = s;
    return 0;
}

static bool mergeable(uint8_t type)
{
    return type == TOK_NORMAL || type == TOK_USER_DEFINED || type == TOK_UNUSED;
}

/* Queues the pair (l, r) if their concatenation is a mergeable piece. */
static int consider(struct spm *w, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    const struct sym *a = &w->syms[l], *b = &w->syms[r];
    if (a->frozen || b->frozen)
        return 0;
    size_t len = (size_t)a->len + b->len;
    if (len > w->t->max_str)
        return 0;
    int32_t id = tok__find(w->t, w->norm + a->start, len);
    if (id < 0 || !mergeable(w->t->tokens[id].type))
        return 0;
    struct cand c = {w->t->tokens[id].score, a->start, l, r, id};
    return heap_push(&w->heap, &c);
}

/* Step 1. Returns the normalized length (0: no tokens). */
static size_t normalize(const struct tok *t, const char *text, size_t len, char *out)
{
    size_t o = 0;
    bool any = false, pend_space = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == ' ' && t->remove_extra_whitespaces) {
            pend_space = any; /* leading spaces vanish; a run becomes one space */
            continue;
        }
        if (!any && t->add_dummy_prefix) {
            memcpy(out + o, SPACE_MARK, 3);
            o += 3;
        }
        any = true;
        if (pend_space) {
            memcpy(out + o, SPACE_MARK, 3);
            o += 3;
            pend_space = false;
        }
        if (c == ' ') {
            memcpy(out + o, SPACE_MARK, 3);
            o += 3;
        } else {
            out[o++] = c;
        }
    }
    return o; /* a trailing run of spaces is still pending: dropped */
}

/* Step 4 for one final symbol (iterative: unused pieces may nest deeply). */
static int emit(struct spm *w, int32_t root, struct tok__ids *out, int32_t **stack,
                size_t *stack_cap)
{
    const struct tok *t = w->t;
    size_t n = 0;
    (*stack)[n++] = root;
    while (n > 0) {
        const struct sym *s = &w->syms[(*stack)[--n]];
        int32_t id = s->id >= 0 ? s->id : tok__find(t, w->norm + s->start, s->len);
        uint8_t type = id >= 0 ? t->tokens[id].type : 0;
        int rc;
        if (type == TOK_NORMAL || type == TOK_USER_DEFINED) {
            if ((rc = tok__ids_push(out, id)) != 0)
                return rc;
            continue;
        }
        if (type == TOK_UNUSED && s->left >= 0) {
            if (n + 2 > *stack_cap) {
                size_t cap = *stack_cap * 2;
                int32_t *v = realloc(*stack, cap * sizeof *v);
                if (!v)
                    return -ENOMEM;
                *stack = v;
                *stack_cap = cap;
            }
            (*stack)[n++] = s->right; /* popped after the left one */
            (*stack)[n++] = s->left;
            continue;
        }
        if (!t->byte_fallback) {
            if ((rc = tok__ids_push(out, t->unk)) != 0)
                return rc;
            continue;
        }
        for (uint32_t i = 0; i < s->len; i++) {
            int32_t b = t->byte_id[(unsigned char)w->norm[s->start + i]];
            if ((rc = tok__ids_push(out, b >= 0 ? b : t->unk)) != 0)
                return rc;
        }
    }
    return 0;
}

int tok__spm_encode(const struct tok *t, const char *text, size_t len, struct tok__ids *out)
{
    /* each byte grows to at most 3 (space -> U+2581), plus the dummy prefix */
    char *norm = malloc(3 * len + 3);
    if (!norm)
        return -ENOMEM;
    size_t n = normalize(t, text, len, norm);
    struct spm w = {.t = t, .norm = norm};
    heap_init(&w.heap, sizeof(struct cand), 256, before);
    int32_t *stack = NULL;
    size_t stack_cap = 64;
    int rc = 0;
    if (n == 0)
        goto out;

    /* step 2 */
    int32_t prev = -1, idx;
    for (size_t i = 0; i < n;) {
        size_t mlen = 0;
        int32_t uid = tok__match_user(t, norm + i, n - i, &mlen);
        struct sym s = {.start = (uint32_t)i, .prev = prev, .next = -1, .left = -1, .right = -1,
                        .id = uid, .frozen = uid >= 0, .alive = true};
        s.len = uid >= 0 ? (uint32_t)mlen
                         : (uint32_t)tok__utf8_len((const unsigned char *)norm + i, n - i);
        CHECK(s.len > 0); /* the text was validated and U+2581 is valid UTF-8 */
        if ((rc = sym_push(&w, s, &idx)) != 0)
            goto out;
        if (prev >= 0)
            w.syms[prev].next = idx;
        prev = idx;
        i += s.len;
    }
    int32_t head = 0;

    /* step 3 */
    for (int32_t i = 0; i + 1 < (int32_t)w.n_syms; i++)
        if ((rc = consider(&w, i, i + 1)) != 0)
            goto out;
    struct cand c;
    while (heap_pop(&w.heap, &c)) {
        if (!w.syms[c.left].alive || !w.syms[c.right].alive)
            continue; /* stale: one side was merged since */
        const struct sym *a = &w.syms[c.left], *b = &w.syms[c.right];
        CHECK(a->next == c.right);
        struct sym m = {.start = a->start, .len = a->len + b->len, .prev = a->prev,
                        .next = b->next, .left = c.left, .right = c.right, .id = c.id,
                        .alive = true};
        if ((rc = sym_push(&w, m, &idx)) != 0)
            goto out;
        w.syms[c.left].alive = w.syms[c.right].alive = false;
        if (m.prev >= 0)
            w.syms[m.prev].next = idx;
        else
            head = idx;
        if (m.next >= 0)
            w.syms[m.next].prev = idx;
        if ((rc = consider(&w, m.prev, idx)) != 0 || (rc = consider(&w, idx, m.next)) != 0)
            goto out;
    }

    /* step 4 */
    if (!(stack = malloc(stack_cap * sizeof *stack))) {
        rc = -ENOMEM;
        goto out;
    }
    for (int32_t i = head; i >= 0; i = w.syms[i].next)
        if ((rc = emit(&w, i, out, &stack, &stack_cap)) != 0)
            goto out;
out:
    free(stack);
    heap_fini(&w.heap);
    free(w.syms);
    free(norm);
    return rc;
}
