/*
 * tok.c — the tokenizer core: turns an importer's description of a vocabulary (struct
 * tok__spec) into a validated, immutable struct tok; lookups; accessors; encoding entry point;
 * decoding and streaming decode.
 *
 * Validation happens once, here, for every source: after tok__build succeeds, every token has
 * a type, a non-empty valid UTF-8 string and precomputed decoded bytes, strings are unique,
 * special ids are in range, every byte can be encoded (SPM: byte fallback or <unk>; byte-level
 * BPE: a token per byte) and every merge names real tokens. Encoding then only fails on
 * invalid UTF-8 text, and decoding only on ids outside the vocabulary.
 *
 * Decoding works on bytes: each token contributes its precomputed bytes, which a UTF-8
 * assembler turns into complete characters, holding back an incomplete tail and replacing
 * ill-formed sequences by U+FFFD (one per maximal ill-formed subpart, as Unicode recommends).
 *
 * NOTES: struct tok is read-only after tok__build; any number of threads may encode and
 * decode with it. A tok_stream is owned by one sequence.
 */
#include "tok_internal.h"

#include "check.h"
#include "err.h"
#include "log.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define SPACE_MARK "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space */
#define UNK_SURFACE " \xE2\x81\x87 " /* SentencePiece decodes <unk> to " U+2047 " */
#define REPLACEMENT "\xEF\xBF\xBD"   /* U+FFFD */

/* ---------------------------------------------------------------------------------------- */
/* names and small helpers                                                                  */

static const char *const type_names[] = {
    [TOK_NORMAL] = "normal", [TOK_UNKNOWN] = "unknown",   [TOK_CONTROL] = "control",
    [TOK_USER_DEFINED] = "user_defined", [TOK_UNUSED] = "unused", [TOK_BYTE] = "byte",
};

const char *tok__type_name(int type)
{
    return type >= TOK_NORMAL && type <= TOK_BYTE ? type_names[type] : NULL;
}

int tok__type_from_name(const char *name)
{
    for (int i = TOK_NORMAL; i <= TOK_BYTE; i++)
        if (strcmp(name, type_names[i]) == 0)
            return i;
    return 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F') /* SentencePiece writes <0x%02X>: one spelling per byte */
        return c - 'A' + 10;
    return -1;
}

int tok__parse_byte_piece(const char *p, size_t len)
{
    if (len != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* A piece for messages: control characters, quotes, backslashes and bytes that are not valid
 * UTF-8 escaped; at most ~48 bytes; always NUL-terminated. */
static const char *quote(const char *p, size_t len, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap;) {
        unsigned char c = (unsigned char)p[i];
        size_t cl = tok__utf8_len((const unsigned char *)p + i, len - i);
        if (o > 48) {
            o += (size_t)snprintf(buf + o, cap - o, "...");
            break;
        }
        if (c == '\\' || c == '\'') {
            o += (size_t)snprintf(buf + o, cap - o, "\\%c", c);
        } else if (cl == 0 || c < 0x20 || c == 0x7F) {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", c);
        } else {
            memcpy(buf + o, p + i, cl);
            o += cl;
            i += cl;
            continue;
        }
        i++;
    }
    buf[o] = '\0';
    return buf;
}

int tok__ids_push(struct tok__ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* hashing                                                                                  */

/* FNV-1a over bytes, in pieces (hash_more), then a final mix for the low bits */
#define HASH_INIT 0xcbf29ce484222325ull

static uint64_t hash_more(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t hash_final(uint64_t h)
{
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    return h ^ (h >> 32);
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    return hash_final(hash_more(HASH_INIT, p, n));
}

uint64_t tok__hash_bytes(const char *p, size_t n) { return hash_bytes(p, n); }

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t table_capacity(uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

int32_t tok__find(const struct tok *t, const char *p, size_t len)
{
    for (uint64_t h = hash_bytes(p, len);; h++) {
        uint32_t slot = t->piece_slots[h & t->piece_mask];
        if (slot == 0)
            return -1;
        const struct tok__token *k = &t->tokens[slot - 1];
        if (k->str_len == len && memcmp(t->strs + k->str_off, p, len) == 0)
            return (int32_t)(slot - 1);
    }
}

int32_t tok__find_cat(const struct tok *t, int32_t a, int32_t b)
{
    const struct tok__token *ka = &t->tokens[a], *kb = &t->tokens[b];
    const char *pa = t->strs + ka->str_off, *pb = t->strs + kb->str_off;
    size_t la = ka->str_len, lb = kb->str_len;
    /* hash_bytes of the two strings as one */
    for (uint64_t h = hash_final(hash_more(hash_more(HASH_INIT, pa, la), pb, lb));; h++) {
        uint32_t slot = t->piece_slots[h & t->piece_mask];
        if (slot == 0)
            return -1;
        const struct tok__token *k = &t->tokens[slot - 1];
        const char *pk = t->strs + k->str_off;
        if (k->str_len == la + lb && memcmp(pk, pa, la) == 0 && memcmp(pk + la, pb, lb) == 0)
            return (int32_t)(slot - 1);
    }
}

int64_t tok__merge_rank(const struct tok *t, int32_t left, int32_t right)
{
    if (t->n_merges == 0)
        return -1;
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    for (uint64_t h = hash_u64(key);; h++) {
        const struct tok__merge_slot *m = &t->merge_slots[h & t->merge_mask];
        if (m->key == 0)
            return -1;
        if (m->key == key)
            return m->rank;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* user-defined tokens: a byte trie with its edges in one open-addressing table              */

static int64_t trie_child(const struct tok__trie *tr, uint32_t node, unsigned char c)
{
    uint64_t key = ((uint64_t)node << 8 | c) + 1;
    for (uint64_t h = hash_u64(key);; h++) {
        uint64_t k = tr->keys[h & tr->mask];
        if (k == 0)
            return -1;
        if (k == key)
            return tr->child[h & tr->mask];
    }
}

/* Whether token k belongs in a trie of tokens of `type` whose RAW flag is `raw` (-1: any). */
static bool trie_takes(const struct tok__token *k, uint8_t type, int raw)
{
    return k->type == type && (raw < 0 || !!(k->added & TOK_ADDED_RAW) == raw);
}

/* Builds the trie of the tokens of one type, all (raw < 0) or those whose RAW flag is raw
 * (none: an empty trie, n_nodes == 0). */
static int trie_build(struct tok *t, struct tok__trie *tr, uint8_t type, int raw)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (trie_takes(&t->tokens[i], type, raw))
            total += t->tokens[i].str_len;
    if (total == 0)
        return 0;
    uint64_t cap = table_capacity(total);
    tr->keys = calloc(cap, sizeof *tr->keys);
    tr->child = calloc(cap, sizeof *tr->child);
    tr->node_id = malloc((total + 1) * sizeof *tr->node_id);
    if (!tr->keys || !tr->child || !tr->node_id)
        return -ENOMEM;
    tr->mask = cap - 1;
    tr->n_nodes = 1; /* the root */
    tr->node_id[0] = -1;
    for (uint32_t i = 0; i < t->n; i++) {
        const struct tok__token *k = &t->tokens[i];
        if (!trie_takes(k, type, raw))
            continue;
        uint32_t node = 0;
        for (uint32_t j = 0; j < k->str_len; j++) {
            unsigned char c = (unsigned char)t->strs[k->str_off + j];
            int64_t next = trie_child(tr, node, c);
            if (next < 0) {
                uint64_t key = ((uint64_t)node << 8 | c) + 1;
                uint64_t h = hash_u64(key);
                while (tr->keys[h & tr->mask] != 0)
                    h++;
                tr->keys[h & tr->mask] = key;
                tr->child[h & tr->mask] = tr->n_nodes;
                tr->node_id[tr->n_nodes] = -1;
                next = tr->n_nodes++;
            }
            node = (uint32_t)next;
        }
        tr->node_id[node] = (int32_t)i; /* strings are unique: no node is claimed twice */
    }
    return 0;
}

static int32_t trie_match(const struct tok__trie *tr, const char *p, size_t len,
                          size_t *match_len)
{
    if (tr->n_nodes == 0)
        return -1;
    int32_t best = -1;
    uint32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        int64_t next = trie_child(tr, node, (unsigned char)p[i]);
        if (next < 0)
            break;
        node = (uint32_t)next;
        if (tr->node_id[node] >= 0) {
            best = tr->node_id[node];
            *match_len = i + 1;
        }
    }
    return best;
}

int32_t tok__match_user(const struct tok *t, const char *p, size_t len, size_t *match_len)
{
    return trie_match(&t->user, p, len, match_len);
}

int32_t tok__match_special(const struct tok *t, const char *p, size_t len, size_t *match_len)
{
    return trie_match(&t->special, p, len, match_len);
}

/* ---------------------------------------------------------------------------------------- */
/* building                                                                                 */

int tok__spec_init(struct tok__spec *s, const char *what, enum tok_kind kind, uint32_t n)
{
    memset(s, 0, sizeof *s);
    s->what = what;
    s->kind = kind;
    s->n = n;
    s->bos = s->eos = s->unk = -1;
    size_t m = n ? n : 1;
    s->piece = tok__big_alloc(m * sizeof *s->piece);
    s->piece_len = tok__big_alloc(m * sizeof *s->piece_len);
    s->score = tok__big_alloc(m * sizeof *s->score);
    s->type = tok__big_alloc(m * sizeof *s->type);
    if (!s->piece || !s->piece_len || !s->score || !s->type) {
        tok__spec_fini(s);
        LOG_ERR("%s: out of memory for %u tokens", what, n);
        return -ENOMEM;
    }
    return 0;
}

void tok__spec_fini(struct tok__spec *s)
{
    tok__big_free(s->piece);
    tok__big_free(s->piece_len);
    tok__big_free(s->score);
    tok__big_free(s->type);
    s->piece = NULL;
    s->piece_len = NULL;
    s->score = NULL;
    s->type = NULL;
}

void tok_free(struct tok *t)
{
    if (!t)
        return;
    tok__big_free(t->tokens);
    tok__big_free(t->strs);
    tok__big_free(t->text);
    tok__big_free(t->piece_slots);
    tok__big_free(t->merges);
    tok__big_free(t->merge_slots);
    free(t->user.keys);
    free(t->user.child);
    free(t->user.node_id);
    free(t->user_raw.keys);
    free(t->user_raw.child);
    free(t->user_raw.node_id);
    free(t->special.keys);
    free(t->special.child);
    free(t->special.node_id);
    tok__pre_free(t->rx);
    tok__norm_free(t->norm);
    free(t);
}

/* One token's string: non-empty, bounded, valid UTF-8 without NUL; a byte token spells
 * <0xNN>; an SPM score is finite. */
static int check_token(const struct tok__spec *s, uint32_t i)
{
    const char *p = s->piece[i];
    size_t len = s->piece_len[i];
    char q[64];
    int type = s->type[i];
    if (!tok__type_name(type)) {
        LOG_ERR("%s: token %u '%s': type %d is not a token type (1 normal .. 6 byte)", s->what,
                i, quote(p, len, q, sizeof q), type);
        return ERR_FORMAT;
    }
    if (len == 0) {
        LOG_ERR("%s: token %u is an empty string", s->what, i);
        return ERR_FORMAT;
    }
    if (len > TOK_MAX_PIECE) {
        LOG_ERR("%s: token %u '%s' is %zu bytes long (limit %u)", s->what, i,
                quote(p, len, q, sizeof q), len, TOK_MAX_PIECE);
        return ERR_RANGE;
    }
    if (memchr(p, '\0', len)) {
        LOG_ERR("%s: token %u '%s' contains a NUL byte", s->what, i, quote(p, len, q, sizeof q));
        return ERR_FORMAT;
    }
    size_t bad = tok__utf8_check(p, len);
    if (bad != len) {
        LOG_ERR("%s: token %u '%s' is not valid UTF-8 (byte %zu)", s->what, i,
                quote(p, len, q, sizeof q), bad);
        return ERR_FORMAT;
    }
    if (type == TOK_BYTE && tok__parse_byte_piece(p, len) < 0) {
        LOG_ERR("%s: token %u '%s' has type byte but does not spell <0xNN>", s->what, i,
                quote(p, len, q, sizeof q));
        return ERR_FORMAT;
    }
    if (s->kind == TOK_SPM && !isfinite(s->score[i])) {
        LOG_ERR("%s: token %u '%s' has a score that is not a finite number", s->what, i,
                quote(p, len, q, sizeof q));
        return ERR_FORMAT;
    }
    return 0;
}

/* The decoded bytes of token i, written at out (room for its string length + 5). */
static int token_text(const struct tok__spec *s, uint32_t i, char *out, uint32_t *out_len)
{
    const char *p = s->piece[i];
    uint32_t len = s->piece_len[i], o = 0;
    int type = s->type[i];
    if (type == TOK_CONTROL) {
        /* decodes to nothing */
    } else if (type == TOK_BYTE) {
        out[o++] = (char)tok__parse_byte_piece(p, len);
    } else if (type == TOK_UNKNOWN && s->kind == TOK_SPM) {
        memcpy(out, UNK_SURFACE, sizeof UNK_SURFACE - 1);
        o = sizeof UNK_SURFACE - 1;
    } else if (s->kind == TOK_SPM) { /* normal, user-defined, unused: spaces are U+2581 */
        for (uint32_t j = 0; j < len;) {
            if (len - j >= 3 && memcmp(p + j, SPACE_MARK, 3) == 0) {
                out[o++] = ' ';
                j += 3;
            } else {
                out[o++] = p[j++];
            }
        }
    } else if (type == TOK_USER_DEFINED || type == TOK_UNKNOWN) {
        memcpy(out, p, len); /* added tokens are literal text, not byte-level */
        o = len;
    } else {
        for (uint32_t j = 0; j < len;) { /* byte-level: each character stands for a byte */
            size_t cl = tok__utf8_len((const unsigned char *)p + j, len - j);
            int b = tok__cp_to_byte(tok__utf8_decode((const unsigned char *)p + j, cl));
            if (b < 0) {
                char q[64];
                LOG_ERR("%s: token %u '%s': character '%.*s' at byte %u is not one of the 256 "
                        "byte-level BPE characters",
                        s->what, i, quote(p, len, q, sizeof q), (int)cl, p + j, j);
                return ERR_FORMAT;
            }
            out[o++] = (char)b;
            j += (uint32_t)cl;
        }
    }
    *out_len = o;
    return 0;
}

static int check_special(const struct tok__spec *s, const char *name, int32_t id)
{
    if (id < -1 || (id >= 0 && (uint32_t)id >= s->n)) {
        LOG_ERR("%s: %s id %d is outside the vocabulary of %u tokens", s->what, name, id, s->n);
        return ERR_RANGE;
    }
    return 0;
}

static int build_merges(const struct tok__spec *s, struct tok *t)
{
    char q1[64], q2[64];
    uint32_t n = s->n_merges;
    t->merges = tok__big_alloc((n ? n : 1) * sizeof *t->merges);
    uint64_t cap = table_capacity(n);
    t->merge_slots = tok__big_alloc(cap * sizeof *t->merge_slots);
    if (!t->merges || !t->merge_slots) {
        LOG_ERR("%s: out of memory for %u merges", s->what, n);
        return -ENOMEM;
    }
    t->merge_mask = cap - 1;
    char *cat = malloc(2 * (size_t)TOK_MAX_PIECE);
    if (!cat) {
        LOG_ERR("%s: out of memory", s->what);
        return -ENOMEM;
    }
    int rc = 0;
    for (uint32_t r = 0; r < n; r++) {
        int32_t ids[2];
        for (int side = 0; side < 2; side++) {
            if (s->merge_ids) {
                ids[side] = s->merge_ids[2 * r + side];
                if (ids[side] < 0 || (uint32_t)ids[side] >= s->n) {
                    LOG_ERR("%s: merge %u names token id %d, outside the vocabulary of %u "
                            "tokens", s->what, r, ids[side], s->n);
                    rc = ERR_FORMAT;
                    goto out;
                }
            } else {
                const char *p = s->merge_str[2 * r + side];
                uint32_t len = s->merge_str_len[2 * r + side];
                ids[side] = len <= TOK_MAX_PIECE ? tok__find(t, p, len) : -1;
                if (ids[side] < 0) {
                    LOG_ERR("%s: merge %u: '%s' is not in the vocabulary", s->what, r,
                            quote(p, len, q1, sizeof q1));
                    rc = ERR_FORMAT;
                    goto out;
                }
            }
        }
        const struct tok__token *a = &t->tokens[ids[0]], *b = &t->tokens[ids[1]];
        memcpy(cat, t->strs + a->str_off, a->str_len);
        memcpy(cat + a->str_len, t->strs + b->str_off, b->str_len);
        size_t cat_len = (size_t)a->str_len + b->str_len;
        int32_t res = cat_len <= TOK_MAX_PIECE ? tok__find(t, cat, cat_len) : -1;
        /* quoted only for a message: 400k merges (o200k) would pay for it at every load */
#define LS quote(t->strs + a->str_off, a->str_len, q1, sizeof q1)
#define RS quote(t->strs + b->str_off, b->str_len, q2, sizeof q2)
        if (res < 0) {
            LOG_ERR("%s: merge %u ('%s', '%s'): the merged token is not in the vocabulary",
                    s->what, r, LS, RS);
            rc = ERR_FORMAT;
            goto out;
        }
        if (a->type != TOK_NORMAL || b->type != TOK_NORMAL ||
            t->tokens[res].type != TOK_NORMAL) {
            LOG_ERR("%s: merge %u ('%s', '%s') involves a %s token; merges join normal tokens",
                    s->what, r, LS, RS,
                    tok__type_name(a->type != TOK_NORMAL   ? a->type
                                   : b->type != TOK_NORMAL ? b->type
                                                           : t->tokens[res].type));
            rc = ERR_FORMAT;
            goto out;
        }
        uint64_t key = ((uint64_t)(uint32_t)ids[0] << 32 | (uint32_t)ids[1]) + 1;
        uint64_t h = hash_u64(key);
        while (t->merge_slots[h & t->merge_mask].key != 0) {
            if (t->merge_slots[h & t->merge_mask].key == key) {
                LOG_ERR("%s: merge %u ('%s', '%s') repeats merge %u", s->what, r, LS, RS,
                        t->merge_slots[h & t->merge_mask].rank);
                rc = ERR_FORMAT;
                goto out;
            }
            h++;
        }
        t->merge_slots[h & t->merge_mask] = (struct tok__merge_slot){key, r};
        t->merges[r] = (struct tok__merge){ids[0], ids[1], res};
        t->n_merges = r + 1;
#undef LS
#undef RS
    }
out:
    free(cat);
    return rc;
}

int tok__build(const struct tok__spec *s, struct tok **out)
{
    *out = NULL;
    CHECK(s->kind == TOK_SPM || s->kind == TOK_BPE);
    CHECK(s->kind == TOK_BPE || s->n_merges == 0);
    const char *what = s->what;
    char q[64];
    if (s->n == 0) {
        LOG_ERR("%s: the vocabulary is empty", what);
        return ERR_FORMAT;
    }
    if (s->n > TOK_MAX_VOCAB) {
        LOG_ERR("%s: %u tokens, more than the limit of %u", what, s->n, TOK_MAX_VOCAB);
        return ERR_RANGE;
    }
    int rc;
    uint64_t str_total = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        if ((rc = check_token(s, i)) != 0)
            return rc;
        str_total += (uint64_t)s->piece_len[i] + 1;
    }
    if (str_total + 5ull * s->n > UINT32_MAX) {
        LOG_ERR("%s: the vocabulary's strings total %llu bytes, more than 4 GiB", what,
                (unsigned long long)str_total);
        return ERR_RANGE;
    }
    if ((rc = check_special(s, "bos", s->bos)) != 0 || (rc = check_special(s, "eos", s->eos)) ||
        (rc = check_special(s, "unk", s->unk)))
        return rc;

    struct tok *t = calloc(1, sizeof *t);
    if (!t) {
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    t->kind = s->kind;
    t->n = s->n;
    t->bos = s->bos;
    t->eos = s->eos;
    t->unk = s->unk;
    t->add_bos = s->add_bos;
    t->add_dummy_prefix = s->add_dummy_prefix;
    t->remove_extra_whitespaces = s->remove_extra_whitespaces;
    t->byte_fallback = s->byte_fallback;
    t->pre = s->pre;
    t->ignore_merges = s->ignore_merges;
    t->ranked = s->ranked;
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = t->byte_char_id[b] = -1;
    uint64_t cap = table_capacity(s->n);
    t->tokens = tok__big_alloc(s->n * sizeof *t->tokens);
    t->strs = tok__big_alloc(str_total);
    t->text = tok__big_alloc(str_total + 5ull * s->n);
    t->piece_slots = tok__big_alloc(cap * sizeof *t->piece_slots);
    if (!t->tokens || !t->strs || !t->text || !t->piece_slots) {
        LOG_ERR("%s: out of memory for %u tokens", what, s->n);
        rc = -ENOMEM;
        goto fail;
    }
    t->piece_mask = cap - 1;

    uint32_t str_off = 0, text_off = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        struct tok__token *k = &t->tokens[i];
        k->type = s->type[i];
        k->added = s->added && (k->type == TOK_USER_DEFINED || k->type == TOK_CONTROL)
                       ? s->added[i] & (TOK_ADDED_LSTRIP | TOK_ADDED_RSTRIP |
                                        TOK_ADDED_SINGLE_WORD |
                                        (k->type == TOK_USER_DEFINED ? TOK_ADDED_RAW : 0))
                       : 0;
        k->score = s->kind == TOK_SPM ? s->score[i] : 0.0f;
        k->str_off = str_off;
        k->str_len = s->piece_len[i];
        memcpy(t->strs + str_off, s->piece[i], k->str_len);
        t->strs[str_off + k->str_len] = '\0';
        str_off += k->str_len + 1;
        k->text_off = text_off;
        if ((rc = token_text(s, i, t->text + text_off, &k->text_len)) != 0)
            goto fail;
        text_off += k->text_len;
        if (k->text_len > t->max_text)
            t->max_text = k->text_len;
        if (k->str_len > t->max_str)
            t->max_str = k->str_len;

        uint64_t h = hash_bytes(s->piece[i], k->str_len);
        for (;; h++) {
            uint32_t *slot = &t->piece_slots[h & t->piece_mask];
            if (*slot == 0) {
                *slot = i + 1;
                break;
            }
            const struct tok__token *o = &t->tokens[*slot - 1];
            if (o->str_len == k->str_len &&
                memcmp(t->strs + o->str_off, s->piece[i], k->str_len) == 0) {
                LOG_ERR("%s: tokens %u and %u are both '%s'; token strings must be unique", what,
                        *slot - 1, i, quote(s->piece[i], k->str_len, q, sizeof q));
                rc = ERR_FORMAT;
                goto fail;
            }
        }
        if (k->type == TOK_BYTE)
            t->byte_id[tok__parse_byte_piece(s->piece[i], k->str_len)] = (int32_t)i;
    }

    if (s->kind == TOK_SPM) {
        bool all_bytes = true;
        for (int b = 0; b < 256; b++)
            all_bytes &= t->byte_id[b] >= 0;
        if (t->unk < 0 && !(t->byte_fallback && all_bytes)) {
            LOG_ERR("%s: no unknown token and no byte fallback over all 256 <0xNN> tokens: "
                    "text outside the vocabulary could not be encoded", what);
            rc = ERR_FORMAT;
            goto fail;
        }
    } else {
        if (s->pre != TOK_PRE_GPT2 && s->pre != TOK_PRE_REGEX) {
            LOG_ERR("%s: byte-level BPE without a known pre-tokenizer", what);
            rc = ERR_UNSUPPORTED;
            goto fail;
        }
        if (s->pre == TOK_PRE_REGEX &&
            (rc = tok__pre_compile(what, s->pre_steps, s->n_pre, &t->rx)) != 0)
            goto fail;
        if (s->ranked && s->n_merges != 0) {
            LOG_ERR("%s: a ranked (tiktoken) vocabulary has no merge list, yet %u merges are "
                    "given", what, s->n_merges);
            rc = ERR_FORMAT;
            goto fail;
        }
        for (int b = 0; b < 256; b++) {
            char c[4];
            size_t cl = tok__utf8_encode(tok__byte_to_cp((uint8_t)b), c);
            int32_t id = tok__find(t, c, cl);
            /* bytes that never occur in UTF-8 (C0, C1, F5..FF) need no token: text is
             * validated before encoding (DeepSeek's, MPT's vocabularies lack them); other
             * missing bytes (Refact's lacks F1..F4, the lead bytes of planes 4..16) are
             * dropped from text as Hugging Face's BPE drops what it cannot spell, or become
             * <unk> when there is one */
            if (b == 0xC0 || b == 0xC1 || b >= 0xF1)
                if (id < 0 || t->tokens[id].type != TOK_NORMAL)
                    continue;
            if (id < 0 || t->tokens[id].type != TOK_NORMAL) {
                LOG_ERR("%s: byte-level BPE vocabulary has no normal token '%.*s' for byte "
                        "0x%02X", what, (int)cl, c, b);
                rc = ERR_FORMAT;
                goto fail;
            }
            t->byte_char_id[b] = id;
        }
        if ((rc = build_merges(s, t)) != 0)
            goto fail;
    }
    if (s->normalizer) {
        if (s->kind != TOK_BPE) {
            LOG_ERR("%s: a normalizer is supported for byte-level BPE only", what);
            rc = ERR_UNSUPPORTED;
            goto fail;
        }
        if ((rc = tok__norm_parse(what, s->normalizer, &t->norm)) != 0)
            goto fail;
    }
    /* normalized: false matters only where a normalizer runs (byte-level BPE) */
    bool split_raw = t->norm != NULL;
    if ((rc = trie_build(t, &t->user, TOK_USER_DEFINED, split_raw ? 0 : -1)) != 0 ||
        (split_raw && (rc = trie_build(t, &t->user_raw, TOK_USER_DEFINED, 1)) != 0) ||
        (rc = trie_build(t, &t->special, TOK_CONTROL, -1)) != 0) {
        LOG_ERR("%s: out of memory", what);
        goto fail;
    }
    *out = t;
    return 0;
fail:
    tok_free(t);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* merges for writers                                                                       */

int tok_merges(const struct tok *t, int32_t **pairs, size_t *n)
{
    *pairs = NULL;
    *n = 0;
    struct tok__ids a = {0};
    int rc = 0;
    if (t->kind == TOK_BPE && !t->ranked) {
        for (uint32_t r = 0; r < t->n_merges && rc == 0; r++)
            if ((rc = tok__ids_push(&a, t->merges[r].left)) == 0)
                rc = tok__ids_push(&a, t->merges[r].right);
    } else if (t->kind == TOK_BPE) {
        /* ids in order are ranks in order; for each token, its splits at character
         * boundaries (one byte-level character per byte) whose two sides are normal tokens,
         * by the left side's id (the right one follows from it) */
        for (uint32_t id = 0; id < t->n && rc == 0; id++) {
            const struct tok__token *k = &t->tokens[id];
            if (k->type != TOK_NORMAL)
                continue;
            const char *p = t->strs + k->str_off;
            size_t first = a.n;
            for (size_t i = tok__utf8_len((const unsigned char *)p, k->str_len); i < k->str_len;
                 i += tok__utf8_len((const unsigned char *)p + i, k->str_len - i)) {
                int32_t l = tok__find(t, p, i), r = tok__find(t, p + i, k->str_len - i);
                if (l < 0 || r < 0 || t->tokens[l].type != TOK_NORMAL ||
                    t->tokens[r].type != TOK_NORMAL)
                    continue;
                if ((rc = tok__ids_push(&a, l)) != 0 || (rc = tok__ids_push(&a, r)) != 0)
                    break;
            }
            /* by the left id: insertion sort of this token's few pairs */
            for (size_t x = first + 2; rc == 0 && x < a.n; x += 2)
                for (size_t y = x; y > first && a.v[y - 2] > a.v[y]; y -= 2) {
                    int32_t l = a.v[y], r = a.v[y + 1];
                    a.v[y] = a.v[y - 2];
                    a.v[y + 1] = a.v[y - 1];
                    a.v[y - 2] = l;
                    a.v[y - 1] = r;
                }
        }
    }
    if (rc == 0 && !a.v)
        rc = (a.v = malloc(sizeof *a.v)) ? 0 : -ENOMEM;
    if (rc != 0) {
        LOG_ERR("listing the merges: out of memory");
        free(a.v);
        return rc;
    }
    *pairs = a.v;
    *n = a.n / 2;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* accessors                                                                                */

enum tok_kind tok_kind(const struct tok *t) { return t->kind; }
uint32_t tok_vocab_size(const struct tok *t) { return t->n; }
int32_t tok_bos(const struct tok *t) { return t->bos; }
int32_t tok_eos(const struct tok *t) { return t->eos; }
int32_t tok_unk(const struct tok *t) { return t->unk; }
bool tok_add_bos(const struct tok *t) { return t->add_bos && t->bos >= 0; }

static bool valid_id(const struct tok *t, int32_t id)
{
    return id >= 0 && (uint32_t)id < t->n;
}

enum tok_type tok_token_type(const struct tok *t, int32_t id)
{
    return valid_id(t, id) ? (enum tok_type)t->tokens[id].type : (enum tok_type)0;
}

const char *tok_token_str(const struct tok *t, int32_t id)
{
    return valid_id(t, id) ? t->strs + t->tokens[id].str_off : NULL;
}

int tok_piece(const struct tok *t, int32_t id, const char **bytes, size_t *len)
{
    if (!valid_id(t, id))
        return ERR_RANGE;
    *bytes = t->text + t->tokens[id].text_off;
    *len = t->tokens[id].text_len;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* encoding                                                                                 */

/* Rust's \w, as Hugging Face's single_word tests it: letters, marks, digits, connectors. */
static bool word_char(uint32_t cp)
{
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* single_word: no word character touches [start, end) of valid UTF-8 text[0..len). */
static bool single_word_ok(const char *text, size_t len, size_t start, size_t end)
{
    const unsigned char *p = (const unsigned char *)text;
    if (start > 0) {
        size_t k = start - 1;
        while (k > 0 && (p[k] & 0xC0) == 0x80)
            k--;
        if (word_char(tok__utf8_decode(p + k, start - k)))
            return false;
    }
    return end == len || !word_char(tok__utf8_decode(p + end, tok__utf8_len(p + end, len - end)));
}

int tok__cut_added(const struct tok *t, const struct tok__trie *tr, const char *text, size_t len,
                   tok__piece_fn seg_fn, void *arg, struct tok__ids *out)
{
    size_t seg = 0;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t mlen = 0;
        int32_t id = trie_match(tr, text + i, len - i, &mlen);
        uint8_t f = id >= 0 ? t->tokens[id].added : 0;
        if (id >= 0 && (f & TOK_ADDED_SINGLE_WORD) && !single_word_ok(text, len, i, i + mlen))
            id = -1;
        if (id < 0) {
            i += tok__utf8_len((const unsigned char *)text + i, len - i);
            continue;
        }
        /* lstrip / rstrip: the white space beside the token belongs to its match (never
         * reaching back into the previous match) */
        size_t start = i, end = i + mlen;
        if (f & TOK_ADDED_LSTRIP)
            start -= tok__trailing_space(text + seg, i - seg);
        if (f & TOK_ADDED_RSTRIP)
            end += tok__leading_space(text + end, len - end);
        if ((rc = seg_fn(arg, text + seg, start - seg)) == 0)
            rc = tok__ids_push(out, id);
        i = seg = end;
    }
    return rc != 0 ? rc : seg_fn(arg, text + seg, len - seg);
}

struct text_sink {
    const struct tok *t;
    struct tok__ids *out;
};

/* Text without added tokens matched raw through the normalizer and the BPE encoder. */
static int encode_normalized(void *arg, const char *text, size_t len)
{
    const struct text_sink *k = arg;
    const struct tok *t = k->t;
    if (len == 0)
        return 0;
    char *norm;
    size_t norm_len;
    int rc = tok__norm_apply(t->norm, text, len, &norm, &norm_len);
    if (rc == 0)
        rc = norm_len ? tok__bpe_encode(t, norm, norm_len, k->out) : 0;
    free(norm);
    return rc;
}

/* Text without control tokens through the vocabulary's normalizer and encoder; user-defined
 * tokens marked normalized: false are cut out first, on the text as written (Hugging Face's
 * AddedVocabulary does so, then normalizes what is between them). */
static int encode_text(void *arg, const char *text, size_t len)
{
    const struct text_sink *k = arg;
    const struct tok *t = k->t;
    if (len == 0)
        return 0;
    if (t->kind == TOK_SPM)
        return tok__spm_encode(t, text, len, k->out);
    if (!t->norm)
        return tok__bpe_encode(t, text, len, k->out);
    if (t->user_raw.n_nodes > 0)
        return tok__cut_added(t, &t->user_raw, text, len, encode_normalized, arg, k->out);
    return encode_normalized(arg, text, len);
}

int tok_encode_ex(const struct tok *t, const char *text, size_t len, unsigned flags,
                  int32_t **ids, size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_MAX_TEXT) {
        LOG_ERR("text to encode is %zu bytes, more than the limit of %u", len, TOK_MAX_TEXT);
        return ERR_RANGE;
    }
    size_t bad = tok__utf8_check(text, len);
    if (bad != len) {
        LOG_ERR("text to encode is not valid UTF-8: byte %zu (0x%02X) of %zu", bad,
                (unsigned char)text[bad], len);
        return ERR_FORMAT;
    }
    struct tok__ids a = {0};
    struct text_sink k = {t, &a};
    int rc = 0;
    if ((flags & TOK_ENC_BOS) && t->bos >= 0)
        rc = tok__ids_push(&a, t->bos);
    if (rc == 0) {
        /* control tokens spelled in the text are cut out first, longest match, on the text
         * as written (Hugging Face does not normalize them) */
        if ((flags & TOK_ENC_SPECIAL) && t->special.n_nodes > 0)
            rc = tok__cut_added(t, &t->special, text, len, encode_text, &k, &a);
        else
            rc = encode_text(&k, text, len);
    }
    if (rc == 0 && !a.v)
        rc = (a.v = malloc(sizeof *a.v)) ? 0 : -ENOMEM; /* a valid pointer even when empty */
    if (rc != 0) {
        LOG_ERR("encoding %zu bytes of text: %s", len, err_str(rc));
        free(a.v);
        return rc;
    }
    *ids = a.v;
    *n_ids = a.n;
    return 0;
}

int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, int32_t **ids,
               size_t *n_ids)
{
    return tok_encode_ex(t, text, len, add_bos ? TOK_ENC_BOS : 0, ids, n_ids);
}

int32_t tok_token_id(const struct tok *t, const char *str, size_t len)
{
    return len <= t->max_str ? tok__find(t, str, len) : -1;
}

/* ---------------------------------------------------------------------------------------- */
/* decoding                                                                                 */

/* Expected length of a UTF-8 sequence from its lead byte; 0 if c cannot start one. */
static size_t lead_len(unsigned c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* Whether c may follow the n bytes of pend in a well-formed sequence. */
static bool continues(const uint8_t *pend, size_t n, unsigned c)
{
    unsigned lo = 0x80, hi = 0xBF;
    if (n == 1) {
        if (pend[0] == 0xE0)
            lo = 0xA0;
        else if (pend[0] == 0xED)
            hi = 0x9F;
        else if (pend[0] == 0xF0)
            lo = 0x90;
        else if (pend[0] == 0xF4)
            hi = 0x8F;
    }
    return c >= lo && c <= hi;
}

struct sink {
    char *out;
    size_t cap, n;
};

static bool put(struct sink *k, const void *p, size_t n)
{
    if (k->cap - k->n < n)
        return false;
    memcpy(k->out + k->n, p, n);
    k->n += n;
    return true;
}

/*
 * Outputs one complete character. `mark` says it is SentencePiece's space: a space of a text
 * piece, or a U+2581 assembled from byte tokens; it decodes to ' ', except that the first
 * character of a sequence is dropped when it is the dummy prefix.
 */
static bool emit(struct tok_stream *s, struct sink *k, const void *c, size_t len, bool mark)
{
    const struct tok *t = s->tok;
    bool first = s->at_start;
    s->at_start = false;
    if (mark) {
        if (first && t->add_dummy_prefix)
            return true;
        c = " ";
        len = 1;
    }
    return put(k, c, len);
}

/* Feeds bytes through the UTF-8 assembler; false when the sink is full. `text_piece`: the
 * bytes are an SPM text piece's, whose spaces stand for U+2581. */
static bool feed(struct tok_stream *s, const char *p, size_t n, struct sink *k, bool text_piece)
{
    bool spm = s->tok->kind == TOK_SPM;
    for (size_t i = 0; i < n; i++) {
        unsigned c = (unsigned char)p[i];
        if (s->n_pend > 0) {
            if (continues(s->pend, s->n_pend, c)) {
                s->pend[s->n_pend++] = (uint8_t)c;
                if (s->n_pend == lead_len(s->pend[0])) {
                    bool mark = spm && s->n_pend == 3 && memcmp(s->pend, SPACE_MARK, 3) == 0;
                    if (!emit(s, k, s->pend, s->n_pend, mark))
                        return false;
                    s->n_pend = 0;
                }
                continue;
            }
            /* the pending bytes are a maximal ill-formed subpart; c starts afresh */
            if (!emit(s, k, REPLACEMENT, 3, false))
                return false;
            s->n_pend = 0;
        }
        size_t need = lead_len(c);
        if (need == 1) {
            if (!emit(s, k, &p[i], 1, spm && text_piece && c == ' '))
                return false;
        } else if (need == 0) {
            if (!emit(s, k, REPLACEMENT, 3, false))
                return false;
        } else {
            s->pend[0] = (uint8_t)c;
            s->n_pend = 1;
        }
    }
    return true;
}

void tok_stream_init(struct tok_stream *s, const struct tok *t)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->at_start = true;
}

size_t tok_stream_max_out(const struct tok *t)
{
    /* every byte consumed (3 pending + one token) yields at most 3 bytes (U+FFFD) */
    return 3 * (t->max_text + 3);
}

int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out)
{
    const struct tok *t = s->tok;
    *n_out = 0;
    if (!valid_id(t, id)) {
        LOG_ERR("token id %d is outside the vocabulary of %u tokens", id, t->n);
        return ERR_RANGE;
    }
    const struct tok__token *k = &t->tokens[id];
    const char *p = t->text + k->text_off;
    size_t n = k->text_len;
    struct tok_stream saved = *s;
    bool text_piece =
        k->type == TOK_NORMAL || k->type == TOK_USER_DEFINED || k->type == TOK_UNUSED;
    struct sink sk = {out, cap, 0};
    if (!feed(s, p, n, &sk, text_piece)) {
        *s = saved;
        LOG_ERR("decoding token %d: an output buffer of %zu bytes is too small (%zu always "
                "suffice)", id, cap, tok_stream_max_out(t));
        return ERR_RANGE;
    }
    *n_out = sk.n;
    return 0;
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if (s->n_pend > 0) {
        if (cap < 3) {
            LOG_ERR("flushing a decode stream: an output buffer of %zu bytes is too small", cap);
            return ERR_RANGE;
        }
        memcpy(out, REPLACEMENT, 3);
        *n_out = 3;
    }
    tok_stream_init(s, s->tok);
    return 0;
}

int tok_decode_ex(const struct tok *t, const int32_t *ids, size_t n_ids, unsigned flags,
                  char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (!valid_id(t, ids[i])) {
            LOG_ERR("decoding: id %d at position %zu is outside the vocabulary of %u tokens",
                    ids[i], i, t->n);
            return ERR_RANGE;
        }
    }
    size_t step = tok_stream_max_out(t), cap = 256, n = 0;
    if (step < t->max_str)
        step = t->max_str; /* a control token spelled out */
    char *buf = malloc(cap);
    if (!buf)
        goto oom;
    struct tok_stream s;
    tok_stream_init(&s, t);
    for (size_t i = 0; i <= n_ids; i++) {
        /* room for a flush and a spelled control token, or one push */
        if (cap - n < 2 * step + 1) {
            size_t ncap = cap * 2 > n + 2 * step + 1 ? cap * 2 : n + 2 * step + 1;
            char *nb = realloc(buf, ncap);
            if (!nb)
                goto oom;
            buf = nb;
            cap = ncap;
        }
        size_t got;
        int rc;
        if (i < n_ids && (flags & TOK_DEC_SPECIAL) && t->tokens[ids[i]].type == TOK_CONTROL) {
            /* pending bytes end before the special; the text after it continues the text */
            bool start = s.at_start;
            rc = tok_stream_flush(&s, buf + n, cap - n, &got);
            n += got;
            s.at_start = start && n == 0;
            const struct tok__token *k = &t->tokens[ids[i]];
            memcpy(buf + n, t->strs + k->str_off, k->str_len);
            got = k->str_len;
        } else {
            rc = i < n_ids ? tok_stream_push(&s, ids[i], buf + n, cap - n, &got)
                           : tok_stream_flush(&s, buf + n, cap - n, &got);
        }
        CHECK(rc == 0); /* ids were checked and the buffer holds the largest output */
        n += got;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
oom:
    free(buf);
    LOG_ERR("decoding %zu tokens: out of memory", n_ids);
    return -ENOMEM;
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n_ids, char **text, size_t *len)
{
    return tok_decode_ex(t, ids, n_ids, 0, text, len);
}
