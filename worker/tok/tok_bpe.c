/*
 * tok_bpe.c — byte-level BPE encoding (GPT-2 and its descendants):
 *
 *  1. user-defined tokens (Hugging Face "added tokens" that are not special) are cut out of
 *     the text first, longest match, each becoming its own token (those marked normalized:
 *     false were cut before the normalizer, by tok.c);
 *  2. the rest is split into pre-tokens by GPT-2's regex
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *     implemented by hand over UTF-8 code points (tok_unicode.c has the classes), or by the
 *     regex steps the model declares (tok_pre.c, PCRE2);
 *  3. a pre-token that is itself a normal token stays whole when the vocabulary says
 *     ignore_merges or is ranked (tiktoken does this); otherwise its bytes become the tokens
 *     of their byte-level characters, and adjacent pairs are merged by rank — the lowest rank
 *     first, the leftmost on ties — through a priority queue, so a pre-token of n bytes costs
 *     O(n log n) whatever its length. A pair's rank is its merge's index, or for a ranked
 *     (tiktoken) vocabulary the id of the token the pair concatenates to (one hash lookup).
 *
 * The builder guarantees a token for each of the 256 bytes and that merges join normal
 * tokens into normal tokens, so text never yields control tokens and never fails.
 */
#include "tok_internal.h"

#include "heap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sym {
    int32_t id;
    int32_t prev, next; /* live neighbours, -1 at the ends */
    bool alive;
};

struct cand {
    uint32_t rank;       /* lower first */
    uint32_t pos;        /* index of the left symbol: leftmost first on equal ranks */
    int32_t lid, rid;    /* the pair's tokens when queued; the entry is stale otherwise */
    int32_t result;      /* the merged token */
};

struct bpe {
    const struct tok *t;
    struct sym *syms;
    size_t cap_syms;
    struct heap heap; /* of struct cand, ordered by before() */
    char *spell;      /* a pre-token spelled in byte-level characters */
    size_t cap_spell;
};

static bool before(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int consider(struct bpe *w, int32_t l)
{
    if (l < 0)
        return 0;
    int32_t r = w->syms[l].next;
    if (r < 0)
        return 0;
    int32_t lid = w->syms[l].id, rid = w->syms[r].id, result;
    int64_t rank;
    if (w->t->ranked) {
        result = tok__find_cat(w->t, lid, rid);
        if (result < 0 || w->t->tokens[result].type != TOK_NORMAL)
            return 0;
        rank = result;
    } else {
        if ((rank = tok__merge_rank(w->t, lid, rid)) < 0)
            return 0;
        result = w->t->merges[rank].result;
    }
    struct cand c = {(uint32_t)rank, (uint32_t)l, lid, rid, result};
    return heap_push(&w->heap, &c);
}

/* A byte the vocabulary has no token for (only F1..F4 can be missing, see tok__build):
 * <unk> when there is one, else nothing, as Hugging Face's BPE drops it. */
static int unspellable(const struct tok *t, struct tok__ids *out)
{
    return t->unk >= 0 ? tok__ids_push(out, t->unk) : 0;
}

/* Step 3 for one pre-token. */
static int encode_word(struct bpe *w, const unsigned char *p, size_t n, struct tok__ids *out)
{
    const struct tok *t = w->t;
    if (n == 0)
        return 0;
    if (n == 1)
        return t->byte_char_id[p[0]] >= 0 ? tok__ids_push(out, t->byte_char_id[p[0]])
                                          : unspellable(t, out);
    if (t->ignore_merges || t->ranked) { /* a whole pre-token that is a token stays one */
        if (2 * n > w->cap_spell) {
            char *v = realloc(w->spell, 2 * n);
            if (!v)
                return -ENOMEM;
            w->spell = v;
            w->cap_spell = 2 * n;
        }
        size_t len = 0;
        for (size_t i = 0; i < n; i++) /* each byte-level character is 1 or 2 bytes */
            len += tok__utf8_encode(tok__byte_to_cp(p[i]), w->spell + len);
        int32_t id = len <= t->max_str ? tok__find(t, w->spell, len) : -1;
        if (id >= 0 && t->tokens[id].type == TOK_NORMAL)
            return tok__ids_push(out, id);
    }
    if (n > w->cap_syms) {
        struct sym *v = realloc(w->syms, n * sizeof *v);
        if (!v)
            return -ENOMEM;
        w->syms = v;
        w->cap_syms = n;
    }
    for (size_t i = 0; i < n; i++) {
        if (t->byte_char_id[p[i]] < 0) { /* rare: split the word around the byte */
            int rc = encode_word(w, p, i, out);
            if (rc == 0)
                rc = unspellable(t, out);
            return rc != 0 ? rc : encode_word(w, p + i + 1, n - i - 1, out);
        }
        w->syms[i] = (struct sym){t->byte_char_id[p[i]], (int32_t)i - 1,
                                  i + 1 < n ? (int32_t)i + 1 : -1, true};
    }
    int rc;
    heap_clear(&w->heap);
    for (size_t i = 0; i + 1 < n; i++)
        if ((rc = consider(w, (int32_t)i)) != 0)
            return rc;
    struct cand c;
    while (heap_pop(&w->heap, &c)) {
        struct sym *a = &w->syms[c.pos];
        if (!a->alive || a->id != c.lid || a->next < 0 || w->syms[a->next].id != c.rid)
            continue; /* stale: a side changed since it was queued */
        struct sym *b = &w->syms[a->next];
        a->id = c.result;
        b->alive = false;
        a->next = b->next;
        if (b->next >= 0)
            w->syms[b->next].prev = (int32_t)c.pos;
        if ((rc = consider(w, a->prev)) != 0 || (rc = consider(w, (int32_t)c.pos)) != 0)
            return rc;
    }
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) /* symbol 0 is never merged away */
        if ((rc = tok__ids_push(out, w->syms[i].id)) != 0)
            return rc;
    return 0;
}

/* ---- step 2: GPT-2's pre-tokenizer ---- */

enum cls { C_LETTER, C_NUMBER, C_SPACE, C_OTHER };

static enum cls classify(uint32_t cp)
{
    if (tok__is_letter(cp))
        return C_LETTER;
    if (tok__is_number(cp))
        return C_NUMBER;
    if (tok__is_space(cp))
        return C_SPACE;
    return C_OTHER;
}

static uint32_t cp_at(const unsigned char *p, size_t n, size_t i, size_t *len)
{
    *len = tok__utf8_len(p + i, n - i); /* the text was validated: never 0 */
    return tok__utf8_decode(p + i, *len);
}

/* End of the run of class k starting at i. */
static size_t run_end(const unsigned char *p, size_t n, size_t i, enum cls k)
{
    while (i < n) {
        size_t l;
        if (classify(cp_at(p, n, i, &l)) != k)
            break;
        i += l;
    }
    return i;
}

/* The regex's alternatives in order. */
size_t tok__gpt2_next(const unsigned char *p, size_t n, size_t i)
{
    size_t l;
    uint32_t c = cp_at(p, n, i, &l);
    if (c == '\'' && i + 1 < n) { /* 's 't 're 've 'm 'll 'd (case-sensitive) */
        unsigned char c1 = p[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
            return i + 2;
        if (i + 2 < n && ((c1 == 'r' && p[i + 2] == 'e') || (c1 == 'v' && p[i + 2] == 'e') ||
                          (c1 == 'l' && p[i + 2] == 'l')))
            return i + 3;
    }
    if (c == ' ' && i + 1 < n) { /* ' ?' before a letter, number or other run */
        size_t l2;
        enum cls k = classify(cp_at(p, n, i + 1, &l2));
        if (k != C_SPACE)
            return run_end(p, n, i + 1, k);
    }
    enum cls k = classify(c);
    if (k != C_SPACE)
        return run_end(p, n, i, k);
    /* \s+(?!\S): the whitespace run, less its last character when a non-space follows;
     * \s+ catches a lone whitespace character before a non-space */
    size_t last = i, j = i;
    while (j < n) {
        size_t lj;
        if (!tok__is_space(cp_at(p, n, j, &lj)))
            break;
        last = j;
        j += lj;
    }
    if (j == n || last == i)
        return j;
    return last;
}

struct word_sink {
    struct bpe *w;
    struct tok__ids *out;
};

static int regex_piece(void *arg, const char *p, size_t n)
{
    struct word_sink *k = arg;
    return encode_word(k->w, (const unsigned char *)p, n, k->out);
}

static int encode_segment(struct bpe *w, const unsigned char *p, size_t n, struct tok__ids *out)
{
    if (w->t->pre == TOK_PRE_REGEX) {
        struct word_sink k = {w, out};
        return tok__pre_split(w->t->rx, (const char *)p, n, regex_piece, &k);
    }
    for (size_t i = 0; i < n;) {
        size_t end = tok__gpt2_next(p, n, i);
        int rc = encode_word(w, p + i, end - i, out);
        if (rc != 0)
            return rc;
        i = end;
    }
    return 0;
}

struct seg_sink {
    struct bpe *w;
    struct tok__ids *out;
};

static int segment_piece(void *arg, const char *p, size_t n)
{
    struct seg_sink *k = arg;
    return encode_segment(k->w, (const unsigned char *)p, n, k->out);
}

int tok__bpe_encode(const struct tok *t, const char *text, size_t len, struct tok__ids *out)
{
    struct bpe w = {.t = t};
    heap_init(&w.heap, sizeof(struct cand), 64, before);
    struct seg_sink k = {&w, out};
    int rc = t->user.n_nodes > 0 ? tok__cut_added(t, &t->user, text, len, segment_piece, &k, out)
                                 : segment_piece(&k, text, len); /* step 1 */
    free(w.syms);
    free(w.spell);
    heap_fini(&w.heap);
    return rc;
}
