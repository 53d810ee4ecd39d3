/*
 * tok_iejson.c — tokenizer.ie.json, the tokenizer form IEBIN model directories carry
 * (specification: docs/TOKENIZER.md). tok_save_json writes everything a struct tok holds, so
 * any source converts losslessly; tok__load_ie_json reads it back with the same strictness as
 * the IEBIN manifest: required keys must be present with the right types, unknown keys are
 * ignored (forward compatibility within version 1), a different version is refused.
 *
 * The document is compact JSON (one line): it is an artifact read by programs, and a 32000-
 * token vocabulary stays around 1 MB.
 */
#include "tok_internal.h"

#include "err.h"
#include "jfield.h"
#include "log.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#define IE_FORMAT "clocher-tokenizer"
#define IE_VERSION 1

bool tok__json_is_ie(const json_t *root)
{
    const json_t *f = json_object_get(root, "format");
    return json_is_string(f) && strcmp(json_string_value(f), IE_FORMAT) == 0;
}

/* ---------------------------------------------------------------------------------------- */
/* reading                                                                                  */

static int req_bool(const char *what, const json_t *root, const char *key, bool *out)
{
    const json_t *v = json_object_get(root, key);
    if (!json_is_boolean(v)) {
        LOG_ERR("%s: %s is %s, not a boolean", what, key, jfield_type(v));
        return ERR_FORMAT;
    }
    *out = json_is_true(v);
    return 0;
}

/* A token id or null (-1). */
static int req_id(const char *what, const json_t *root, const char *key, int32_t *out)
{
    const json_t *v = json_object_get(root, key);
    if (json_is_null(v)) {
        *out = -1;
        return 0;
    }
    if (!json_is_integer(v)) {
        LOG_ERR("%s: %s is %s, not a token id or null", what, key, jfield_type(v));
        return ERR_FORMAT;
    }
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= (json_int_t)TOK_MAX_VOCAB) {
        LOG_ERR("%s: %s = %lld is not a token id", what, key, (long long)id);
        return ERR_RANGE;
    }
    *out = (int32_t)id;
    return 0;
}

/* A bulk array of exactly n elements (n == 0: any length, returned in *n). */
static int req_array(const char *what, const struct tok__jdoc *d, enum tok__jbulk_id id,
                     const char *key, size_t *n, const struct tok__jelem **out)
{
    const struct tok__jbulk *v = &d->bulk[id];
    if (!v->present || v->v.type != TOK_JT_ARRAY) {
        LOG_ERR("%s: %s is %s, not an array", what, key, tok__jtype_name(v, &v->v));
        return ERR_FORMAT;
    }
    if (*n != 0 && v->n != *n) {
        LOG_ERR("%s: %s has %zu elements; tokens has %zu", what, key, v->n, *n);
        return ERR_FORMAT;
    }
    *n = v->n;
    *out = v->e;
    return 0;
}

/* pre_tokenizer "gpt2", or "regex" with pre_steps; ignore_merges and ranked (optional). */
static int read_pre(const char *what, const json_t *root, struct tok__spec *s)
{
    int rc;
    static const char *const flags[] = {"ignore_merges", "ranked"}; /* absent: false */
    bool *dst[] = {&s->ignore_merges, &s->ranked};
    for (int i = 0; i < 2; i++)
        if (json_object_get(root, flags[i]) && (rc = req_bool(what, root, flags[i], dst[i])))
            return rc;
    if (strcmp(json_string_value(json_object_get(root, "pre_tokenizer")), "gpt2") == 0) {
        s->pre = TOK_PRE_GPT2;
        return 0;
    }
    s->pre = TOK_PRE_REGEX;
    const json_t *steps = json_object_get(root, "pre_steps");
    if (!json_is_array(steps)) {
        LOG_ERR("%s: pre_steps is %s, not an array", what, jfield_type(steps));
        return ERR_FORMAT;
    }
    size_t n = json_array_size(steps);
    if (n == 0 || n > TOK_PRE_MAX_STEPS) {
        LOG_ERR("%s: pre_steps has %zu steps; 1..%d are supported", what, n,
                TOK_PRE_MAX_STEPS);
        return ERR_RANGE;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *st = json_array_get(steps, i);
        const json_t *pat = json_object_get(st, "pattern");
        const json_t *beh = json_object_get(st, "behavior");
        const json_t *inv = json_object_get(st, "invert");
        const json_t *lit = json_object_get(st, "literal");
        int b = json_is_string(beh) ? tok__split_from_name(json_string_value(beh), false) : -1;
        if (!json_is_string(pat) || b < 0 || !json_is_boolean(inv) || !json_is_boolean(lit)) {
            LOG_ERR("%s: pre_steps[%zu] is not {\"pattern\": string, \"behavior\": isolated|"
                    "removed|merged_with_previous|merged_with_next|contiguous, \"invert\": "
                    "bool, \"literal\": bool}", what, i);
            return ERR_FORMAT;
        }
        if (json_string_length(pat) > TOK_PRE_MAX_PATTERN) {
            LOG_ERR("%s: pre_steps[%zu]: the pattern is %zu bytes long (limit %u)", what, i,
                    json_string_length(pat), TOK_PRE_MAX_PATTERN);
            return ERR_RANGE;
        }
        s->pre_steps[i] = (struct tok__pre_step){json_string_value(pat),
                                                 (uint32_t)json_string_length(pat), (uint8_t)b,
                                                 json_is_true(inv), json_is_true(lit)};
    }
    s->n_pre = (uint32_t)n;
    return 0;
}

/* The keys of the added-token flags: each an optional array of the ids that have it. */
static const char *const added_keys[] = {"lstrip", "rstrip", "single_word", "unnormalized"};
static const uint8_t added_bits[] = {TOK_ADDED_LSTRIP, TOK_ADDED_RSTRIP, TOK_ADDED_SINGLE_WORD,
                                     TOK_ADDED_RAW};
#define N_ADDED_KEYS (sizeof added_keys / sizeof added_keys[0])

static int read_added_flags(const char *what, const json_t *root, size_t n, uint8_t **out)
{
    *out = NULL;
    for (size_t f = 0; f < N_ADDED_KEYS; f++) {
        const json_t *list = json_object_get(root, added_keys[f]);
        if (!list)
            continue;
        if (!json_is_array(list)) {
            LOG_ERR("%s: %s is %s, not an array of token ids", what, added_keys[f],
                    jfield_type(list));
            return ERR_FORMAT;
        }
        if (!*out && !(*out = calloc(n, 1))) {
            LOG_ERR("%s: out of memory", what);
            return -ENOMEM;
        }
        size_t i;
        const json_t *v;
        json_array_foreach(list, i, v) {
            json_int_t id = json_integer_value(v);
            if (!json_is_integer(v) || id < 0 || id >= (json_int_t)n) {
                LOG_ERR("%s: %s[%zu] is not a token id of the vocabulary", what, added_keys[f],
                        i);
                return ERR_FORMAT;
            }
            (*out)[id] |= added_bits[f];
        }
    }
    return 0;
}

int tok__load_ie_json(const struct tok__jdoc *doc, const char *what, struct tok **out)
{
    const json_t *root = doc->root;
    if (!tok__json_is_ie(root)) {
        const json_t *f = json_object_get(root, "format");
        LOG_ERR("%s: format is %s%.64s%s, not \"" IE_FORMAT "\"", what,
                json_is_string(f) ? "\"" : "", json_is_string(f) ? json_string_value(f) : jfield_type(f),
                json_is_string(f) ? "\"" : "");
        return ERR_FORMAT;
    }
    const json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver)) {
        LOG_ERR("%s: version is %s, not an integer", what, jfield_type(ver));
        return ERR_FORMAT;
    }
    if (json_integer_value(ver) != IE_VERSION) {
        LOG_ERR("%s: version %lld is not supported (this build reads version %d)", what,
                (long long)json_integer_value(ver), IE_VERSION);
        return ERR_UNSUPPORTED;
    }
    const json_t *kv = json_object_get(root, "kind");
    if (!json_is_string(kv)) {
        LOG_ERR("%s: kind is %s, not a string", what, jfield_type(kv));
        return ERR_FORMAT;
    }
    enum tok_kind kind;
    if (strcmp(json_string_value(kv), "spm") == 0) {
        kind = TOK_SPM;
    } else if (strcmp(json_string_value(kv), "bpe") == 0) {
        kind = TOK_BPE;
    } else {
        LOG_ERR("%s: kind \"%.64s\" is not supported (spm, bpe)", what, json_string_value(kv));
        return ERR_UNSUPPORTED;
    }
    size_t n = 0, nt;
    const struct tok__jelem *tokens, *types, *scores = NULL, *merges = NULL;
    size_t nm = 0;
    int rc = req_array(what, doc, TOK_JB_IE_TOKENS, "tokens", &n, &tokens);
    if (rc != 0)
        return rc;
    if (n == 0) {
        LOG_ERR("%s: tokens is empty", what);
        return ERR_FORMAT;
    }
    if (n > TOK_MAX_VOCAB) {
        LOG_ERR("%s: %zu tokens, more than the limit of %u", what, n, TOK_MAX_VOCAB);
        return ERR_RANGE;
    }
    nt = n;
    if ((rc = req_array(what, doc, TOK_JB_IE_TYPES, "types", &nt, &types)) != 0)
        return rc;
    if (kind == TOK_SPM) {
        nt = n;
        if ((rc = req_array(what, doc, TOK_JB_IE_SCORES, "scores", &nt, &scores)) != 0)
            return rc;
    } else {
        if ((rc = req_array(what, doc, TOK_JB_IE_MERGES, "merges", &nm, &merges)) != 0)
            return rc;
        if (nm > UINT32_MAX / 2) {
            LOG_ERR("%s: too many merges (%zu)", what, nm);
            return ERR_RANGE;
        }
        const json_t *pre = json_object_get(root, "pre_tokenizer");
        if (!json_is_string(pre)) {
            LOG_ERR("%s: pre_tokenizer is %s, not a string", what, jfield_type(pre));
            return ERR_FORMAT;
        }
        if (strcmp(json_string_value(pre), "gpt2") != 0 &&
            strcmp(json_string_value(pre), "regex") != 0) {
            LOG_ERR("%s: pre_tokenizer \"%.64s\" is not supported (gpt2, regex)", what,
                    json_string_value(pre));
            return ERR_UNSUPPORTED;
        }
    }

    struct tok__spec s;
    if ((rc = tok__spec_init(&s, what, kind, (uint32_t)n)) != 0)
        return rc;
    int32_t *merge_ids = NULL;
    uint8_t *added = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct tok__jval *p = &tokens[i].v, *ty = &types[i].v;
        if (p->type != TOK_JT_STRING) {
            LOG_ERR("%s: tokens[%zu] is %s, not a string", what, i, tok__jtype_name(NULL, p));
            rc = ERR_FORMAT;
            goto out;
        }
        s.piece[i] = tok__jstr(doc, p);
        s.piece_len[i] = p->len > TOK_MAX_PIECE + 1 ? TOK_MAX_PIECE + 1 : p->len;
        bool ty_str = ty->type == TOK_JT_STRING;
        int type = ty_str ? tok__type_from_name(tok__jstr(doc, ty)) : 0;
        if (type == 0) {
            LOG_ERR("%s: types[%zu] is %s%.32s%s, not one of normal, unknown, control, "
                    "user_defined, unused, byte", what, i, ty_str ? "\"" : "",
                    ty_str ? tok__jstr(doc, ty) : tok__jtype_name(NULL, ty), ty_str ? "\"" : "");
            rc = ERR_FORMAT;
            goto out;
        }
        s.type[i] = (uint8_t)type;
        if (scores) {
            const struct tok__jval *sc = &scores[i].v;
            double d = sc->type == TOK_JT_INT ? (double)sc->u.i : sc->u.d;
            if ((sc->type != TOK_JT_INT && sc->type != TOK_JT_REAL) ||
                !(d >= -FLT_MAX && d <= FLT_MAX)) {
                LOG_ERR("%s: scores[%zu] is %s, not a number in float range", what, i,
                        tok__jtype_name(NULL, sc));
                rc = ERR_FORMAT;
                goto out;
            }
            s.score[i] = (float)d;
        }
    }
    if ((rc = req_id(what, root, "bos", &s.bos)) != 0 ||
        (rc = req_id(what, root, "eos", &s.eos)) != 0 ||
        (rc = req_id(what, root, "unk", &s.unk)) != 0 ||
        (rc = req_bool(what, root, "add_bos", &s.add_bos)) != 0)
        goto out;
    if (kind == TOK_SPM) {
        if ((rc = req_bool(what, root, "add_dummy_prefix", &s.add_dummy_prefix)) != 0 ||
            (rc = req_bool(what, root, "remove_extra_whitespaces",
                           &s.remove_extra_whitespaces)) != 0 ||
            (rc = req_bool(what, root, "byte_fallback", &s.byte_fallback)) != 0)
            goto out;
    } else {
        if ((rc = read_pre(what, root, &s)) != 0)
            goto out;
        if (!(merge_ids = malloc((nm ? 2 * nm : 1) * sizeof *merge_ids))) {
            LOG_ERR("%s: out of memory for %zu merges", what, nm);
            rc = -ENOMEM;
            goto out;
        }
        for (size_t r = 0; r < nm; r++) {
            const struct tok__jelem *m = &merges[r];
            if (m->v.type != TOK_JT_ARRAY || m->n_sub != 2 || m->sub[0].type != TOK_JT_INT ||
                m->sub[1].type != TOK_JT_INT) {
                LOG_ERR("%s: merges[%zu] is %s, not a pair of token ids [left, right]", what, r,
                        tok__jtype_name(NULL, &m->v));
                rc = ERR_FORMAT;
                goto out;
            }
            int64_t l = m->sub[0].u.i, rr = m->sub[1].u.i;
            if (l < 0 || l >= (int64_t)n || rr < 0 || rr >= (int64_t)n) {
                LOG_ERR("%s: merges[%zu] = [%lld, %lld] names an id outside the vocabulary of "
                        "%zu tokens", what, r, (long long)l, (long long)rr, n);
                rc = ERR_FORMAT;
                goto out;
            }
            merge_ids[2 * r] = (int32_t)l;
            merge_ids[2 * r + 1] = (int32_t)rr;
        }
        s.n_merges = (uint32_t)nm;
        s.merge_ids = merge_ids;
        const json_t *norm = json_object_get(root, "normalizer");
        if (norm && !json_is_null(norm)) {
            if (!json_is_object(norm)) {
                LOG_ERR("%s: normalizer is %s, not an object", what, jfield_type(norm));
                rc = ERR_FORMAT;
                goto out;
            }
            s.normalizer = norm; /* Hugging Face's form, compiled by tok__build */
        }
    }
    if ((rc = read_added_flags(what, root, n, &added)) != 0)
        goto out;
    s.added = added;
    rc = tok__build(&s, out);
out:
    free(added);
    free(merge_ids);
    tok__spec_fini(&s);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* writing                                                                                  */

static json_t *id_or_null(int32_t id)
{
    return id >= 0 ? json_integer(id) : json_null();
}

/* json_object_set_new that remembers a failure (a NULL value or an allocation error). */
static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(o, key, v) != 0)
        *ok = false;
}

static json_t *pre_steps_json(const struct tok *t)
{
    const struct tok__pre_step *st;
    uint32_t n = tok__pre_steps(t->rx, &st);
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < n; i++) {
        json_t *o = json_pack("{s:s%,s:s,s:b,s:b}", "pattern", st[i].pattern,
                              (size_t)st[i].pattern_len, "behavior",
                              tok__split_name(st[i].behavior, false), "invert", st[i].invert,
                              "literal", st[i].literal);
        if (!o || json_array_append_new(a, o) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

int tok_save_json(const struct tok *t, char **json, size_t *len)
{
    *json = NULL;
    *len = 0;
    bool ok = true;
    json_t *root = json_object();
    json_t *tokens = json_array(), *types = json_array();
    json_t *scores = t->kind == TOK_SPM ? json_array() : NULL;
    json_t *merges = t->kind == TOK_BPE ? json_array() : NULL;
    if (!root || !tokens || !types || (t->kind == TOK_SPM ? !scores : !merges)) {
        json_decref(tokens);
        json_decref(types);
        json_decref(scores);
        json_decref(merges);
        ok = false;
        goto out;
    }
    put(root, "format", json_string(IE_FORMAT), &ok);
    put(root, "version", json_integer(IE_VERSION), &ok);
    put(root, "kind", json_string(t->kind == TOK_SPM ? "spm" : "bpe"), &ok);
    put(root, "bos", id_or_null(t->bos), &ok);
    put(root, "eos", id_or_null(t->eos), &ok);
    put(root, "unk", id_or_null(t->unk), &ok);
    put(root, "add_bos", json_boolean(t->add_bos), &ok);
    if (t->kind == TOK_SPM) {
        put(root, "add_dummy_prefix", json_boolean(t->add_dummy_prefix), &ok);
        put(root, "remove_extra_whitespaces", json_boolean(t->remove_extra_whitespaces), &ok);
        put(root, "byte_fallback", json_boolean(t->byte_fallback), &ok);
    } else {
        put(root, "pre_tokenizer", json_string(t->pre == TOK_PRE_GPT2 ? "gpt2" : "regex"), &ok);
        put(root, "ignore_merges", json_boolean(t->ignore_merges), &ok);
        put(root, "ranked", json_boolean(t->ranked), &ok);
        if (t->pre == TOK_PRE_REGEX)
            put(root, "pre_steps", pre_steps_json(t), &ok);
        if (t->norm)
            put(root, "normalizer", json_deep_copy(tok__norm_json(t->norm)), &ok);
    }
    for (size_t f = 0; f < N_ADDED_KEYS && ok; f++) { /* written only when some token has the flag */
        json_t *ids = NULL;
        for (uint32_t i = 0; i < t->n && ok; i++)
            if (t->tokens[i].added & added_bits[f])
                ok = (ids || (ids = json_array())) &&
                     json_array_append_new(ids, json_integer(i)) == 0;
        if (ids)
            put(root, added_keys[f], ids, &ok);
    }
    for (uint32_t i = 0; i < t->n && ok; i++) {
        const struct tok__token *k = &t->tokens[i];
        /* strings were validated as UTF-8 without NUL: json_stringn cannot refuse them */
        ok = json_array_append_new(tokens, json_stringn(t->strs + k->str_off, k->str_len)) == 0 &&
             json_array_append_new(types, json_string(tok__type_name(k->type))) == 0 &&
             (!scores || json_array_append_new(scores, json_real(k->score)) == 0);
    }
    for (uint32_t r = 0; merges && r < t->n_merges && ok; r++) {
        json_t *pair = json_pack("[ii]", t->merges[r].left, t->merges[r].right);
        ok = pair && json_array_append_new(merges, pair) == 0;
    }
    put(root, "tokens", tokens, &ok);
    put(root, "types", types, &ok);
    if (scores)
        put(root, "scores", scores, &ok);
    if (merges)
        put(root, "merges", merges, &ok);
    if (ok) {
        *json = json_dumps(root, JSON_COMPACT);
        ok = *json != NULL;
    }
out:
    json_decref(root);
    if (!ok) {
        LOG_ERR("writing tokenizer.ie.json: out of memory");
        return -ENOMEM;
    }
    *len = strlen(*json);
    return 0;
}
