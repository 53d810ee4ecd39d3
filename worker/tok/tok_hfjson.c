/*
 * tok_hfjson.c — Hugging Face tokenizer.json importer, for the two kinds of BPE this project
 * implements:
 *
 *  - byte-level BPE (GPT-2, Llama 3, Qwen2, o200k_harmony, ...): vocab + merges by rank,
 *    and the normalizer as declared (compiled by tok_norm.c: NFC, Lowercase, Replace, ...);
 *  - Llama's SentencePiece BPE: byte_fallback, with either the legacy normalizer
 *    Sequence[Prepend "▁", Replace " " -> "▁"] or a Metaspace pre-tokenizer that does not
 *    split (prepend_scheme first/always). Hugging Face expresses SentencePiece's merges as a
 *    ranked list of pairs; we turn ranks back into piece scores: a piece scores -r, r being
 *    the rank of the first merge that produces it, so that "highest score first" picks the
 *    merges in rank order (docs/TOKENIZER.md discusses the equivalence).
 *
 * added_tokens are folded into the vocabulary: "special" ones become control tokens (never
 * produced from text), the others user-defined tokens (matched literally); their lstrip,
 * rstrip and single_word flags are kept (tok.c applies them). A byte-level BPE's
 * pre_tokenizer may be ByteLevel, Split (Regex or String pattern, any behavior, invert),
 * Digits, or a Sequence of them: GPT-2's ByteLevel alone uses the hand-written splitter, the
 * rest become PCRE2 steps (tok_pre.c); model.ignore_merges is honoured. Anything that would
 * change how text is split and that we do not implement (other pre-tokenizers, other
 * normalizers, Metaspace splitting, subword prefixes) is refused with ERR_UNSUPPORTED rather
 * than silently giving different tokens.
 */
#include "tok_internal.h"

#include "err.h"
#include "jfield.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xE2\x96\x81" /* U+2581 */

static bool is_str(const json_t *v, const char *s)
{
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* A boolean field that may be absent (then *out = dflt). */
static int opt_bool(const char *what, const json_t *o, const char *field, bool dflt, bool *out)
{
    const json_t *v = json_object_get(o, field);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) {
        LOG_ERR("%s: %s is %s, not a boolean", what, field, jfield_type(v));
        return ERR_FORMAT;
    }
    *out = json_is_true(v);
    return 0;
}

/* The normalizer of Llama's legacy tokenizer.json: Prepend "▁" (optional) and Replace " " by
 * "▁", alone or in a Sequence. */
static int legacy_normalizer(const char *what, const json_t *norm, bool *dummy)
{
    const json_t *list = norm;
    json_t *single = NULL;
    int rc = 0;
    if (is_str(json_object_get(norm, "type"), "Sequence")) {
        list = json_object_get(norm, "normalizers");
        if (!json_is_array(list)) {
            LOG_ERR("%s: normalizer.normalizers is %s, not an array", what, jfield_type(list));
            return ERR_FORMAT;
        }
    } else {
        list = single = json_array();
        if (!single || json_array_append(single, (json_t *)norm) != 0) {
            json_decref(single);
            LOG_ERR("%s: out of memory", what);
            return -ENOMEM;
        }
    }
    bool replace = false;
    *dummy = false;
    size_t i;
    const json_t *n;
    json_array_foreach(list, i, n) {
        const json_t *type = json_object_get(n, "type");
        if (is_str(type, "Prepend") && is_str(json_object_get(n, "prepend"), SPACE_MARK)) {
            *dummy = true;
        } else if (is_str(type, "Replace") &&
                   is_str(json_object_get(json_object_get(n, "pattern"), "String"), " ") &&
                   is_str(json_object_get(n, "content"), SPACE_MARK)) {
            replace = true;
        } else {
            LOG_ERR("%s: normalizer %s is not supported (only Prepend \"" SPACE_MARK
                    "\" and Replace \" \" -> \"" SPACE_MARK "\", Llama's)", what,
                    json_is_string(type) ? json_string_value(type) : "without a type");
            rc = ERR_UNSUPPORTED;
            goto out;
        }
    }
    if (!replace) {
        LOG_ERR("%s: the normalizer does not replace spaces by " SPACE_MARK
                "; not a SentencePiece vocabulary this project reads", what);
        rc = ERR_UNSUPPORTED;
    }
out:
    json_decref(single);
    return rc;
}

/* Which of our two algorithms the document describes. */
static int detect_kind(const char *what, const json_t *root, enum tok_kind *kind, bool *dummy)
{
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const json_t *norm = json_object_get(root, "normalizer");
    bool has_norm = norm && !json_is_null(norm);
    if (has_norm && !json_is_object(norm)) {
        LOG_ERR("%s: normalizer is %s, not an object", what, jfield_type(norm));
        return ERR_FORMAT;
    }
    if (!pre || json_is_null(pre)) {
        if (!has_norm) {
            LOG_ERR("%s: neither a pre_tokenizer nor a normalizer: not a byte-level "
                    "(ByteLevel) nor a SentencePiece (Metaspace, Prepend/Replace) BPE", what);
            return ERR_UNSUPPORTED;
        }
        *kind = TOK_SPM;
        return legacy_normalizer(what, norm, dummy);
    }
    if (!json_is_object(pre)) {
        LOG_ERR("%s: pre_tokenizer is %s, not an object", what, jfield_type(pre));
        return ERR_FORMAT;
    }
    const json_t *type = json_object_get(pre, "type");
    if (!json_is_string(type)) {
        LOG_ERR("%s: pre_tokenizer.type is %s, not a string", what, jfield_type(type));
        return ERR_FORMAT;
    }
    const char *ts = json_string_value(type);
    int rc;
    if (strcmp(ts, "ByteLevel") == 0 || strcmp(ts, "Sequence") == 0 ||
        strcmp(ts, "Split") == 0 || strcmp(ts, "Digits") == 0) {
        *kind = TOK_BPE; /* bpe_pre() reads the steps, tok__build compiles the normalizer */
        return 0;
    }
    if (strcmp(ts, "Metaspace") == 0) {
        const json_t *split = json_object_get(pre, "split");
        if (!is_str(json_object_get(pre, "replacement"), SPACE_MARK) || !json_is_false(split) ||
            has_norm) {
            LOG_ERR("%s: Metaspace pre_tokenizer %s is not supported (only replacement "
                    SPACE_MARK " with split false, as Llama's)", what,
                    !json_is_false(split) ? "that splits words" : "with that replacement or "
                                                                   "a normalizer");
            return ERR_UNSUPPORTED;
        }
        const json_t *scheme = json_object_get(pre, "prepend_scheme");
        if (scheme && !json_is_null(scheme)) {
            if (is_str(scheme, "first") || is_str(scheme, "always")) {
                *dummy = true;
            } else if (is_str(scheme, "never")) {
                *dummy = false;
            } else {
                LOG_ERR("%s: Metaspace prepend_scheme is %s, not first, always or never", what,
                        jfield_type(scheme));
                return ERR_FORMAT;
            }
        } else if ((rc = opt_bool(what, pre, "add_prefix_space", true, dummy)) != 0) {
            return rc;
        }
        *kind = TOK_SPM;
        return 0;
    }
    LOG_ERR("%s: pre_tokenizer %s is not supported (ByteLevel, Split, Digits or a Sequence of "
            "them for byte-level BPE, Metaspace for Llama)", what, ts);
    return ERR_UNSUPPORTED;
}

/* One pre-tokenizer of a byte-level BPE (pre_tokenizers[idx] of a Sequence, or the whole
 * when idx < 0) appended to the spec's regex steps; *gpt2 set when it is GPT-2's own regex. */
static int bpe_pre_one(const char *what, const json_t *pre, long idx, struct tok__spec *s,
                       bool *gpt2)
{
    char where[64];
    if (idx < 0)
        snprintf(where, sizeof where, "pre_tokenizer");
    else
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%ld]", idx);
    const json_t *type = json_object_get(pre, "type");
    if (!json_is_object(pre) || !json_is_string(type)) {
        LOG_ERR("%s: %s is not an object with a string type", what, where);
        return ERR_FORMAT;
    }
    const char *ts = json_string_value(type);
    struct tok__pre_step st = {.behavior = TOK_SPLIT_ISOLATED};
    int rc;
    if (strcmp(ts, "ByteLevel") == 0) {
        bool prefix, regex;
        if ((rc = opt_bool(what, pre, "add_prefix_space", false, &prefix)) != 0 ||
            (rc = opt_bool(what, pre, "use_regex", true, &regex)) != 0)
            return rc;
        if (prefix) {
            LOG_ERR("%s: ByteLevel pre_tokenizer with add_prefix_space is not supported (%s)",
                    what, where);
            return ERR_UNSUPPORTED;
        }
        if (!regex)
            return 0; /* bytes to characters only: no split */
        *gpt2 = true;
        st.pattern = tok__gpt2_pattern;
        st.pattern_len = (uint32_t)strlen(tok__gpt2_pattern);
    } else if (strcmp(ts, "Digits") == 0) {
        bool single;
        if ((rc = opt_bool(what, pre, "individual_digits", false, &single)) != 0)
            return rc;
        st.pattern = single ? "\\p{N}" : "\\p{N}+";
        st.pattern_len = (uint32_t)strlen(st.pattern);
    } else if (strcmp(ts, "Split") == 0) {
        const json_t *pat = json_object_get(pre, "pattern");
        const json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        const json_t *beh = json_object_get(pre, "behavior");
        if (!json_is_object(pat) || json_object_size(pat) != 1 ||
            !json_is_string(rx ? rx : lit)) {
            LOG_ERR("%s: %s Split: pattern is not {\"Regex\": string} or {\"String\": string}",
                    what, where);
            return ERR_FORMAT;
        }
        int b = json_is_string(beh) ? tok__split_from_name(json_string_value(beh), true) : -1;
        if (b < 0) {
            LOG_ERR("%s: %s Split: behavior %s%s%s is not Isolated, Removed, "
                    "MergedWithPrevious, MergedWithNext or Contiguous", what, where,
                    json_is_string(beh) ? "'" : "",
                    json_is_string(beh) ? json_string_value(beh) : jfield_type(beh),
                    json_is_string(beh) ? "'" : "");
            return ERR_UNSUPPORTED;
        }
        bool inv;
        if ((rc = opt_bool(what, pre, "invert", false, &inv)) != 0)
            return rc;
        const json_t *pv = rx ? rx : lit;
        if (json_string_length(pv) > TOK_PRE_MAX_PATTERN) {
            LOG_ERR("%s: %s Split: the pattern is %zu bytes long (limit %u)", what, where,
                    json_string_length(pv), TOK_PRE_MAX_PATTERN);
            return ERR_RANGE;
        }
        st.pattern = json_string_value(pv);
        st.pattern_len = (uint32_t)json_string_length(pv);
        st.behavior = (uint8_t)b;
        st.invert = inv;
        st.literal = lit != NULL;
    } else {
        LOG_ERR("%s: %s %s is not supported in a byte-level BPE (ByteLevel, Split, Digits)",
                what, where, ts);
        return ERR_UNSUPPORTED;
    }
    if (s->n_pre == TOK_PRE_MAX_STEPS) {
        LOG_ERR("%s: more than %d pre-tokenizer split steps", what, TOK_PRE_MAX_STEPS);
        return ERR_RANGE;
    }
    s->pre_steps[s->n_pre++] = st;
    return 0;
}

/* The pre-tokenizer of a byte-level BPE: GPT-2's ByteLevel alone stays the hand-written
 * splitter; anything else becomes regex steps (tok_pre.c). */
static int bpe_pre(const char *what, const json_t *pre, struct tok__spec *s)
{
    bool gpt2 = false;
    int rc;
    s->n_pre = 0;
    if (is_str(json_object_get(pre, "type"), "Sequence")) {
        const json_t *list = json_object_get(pre, "pretokenizers");
        if (!json_is_array(list)) {
            LOG_ERR("%s: pre_tokenizer.pretokenizers is %s, not an array", what,
                    jfield_type(list));
            return ERR_FORMAT;
        }
        size_t i;
        const json_t *p;
        json_array_foreach(list, i, p) {
            if ((rc = bpe_pre_one(what, p, (long)i, s, &gpt2)) != 0)
                return rc;
        }
    } else if ((rc = bpe_pre_one(what, pre, -1, s, &gpt2)) != 0) {
        return rc;
    }
    if (gpt2 && s->n_pre == 1) {
        s->pre = TOK_PRE_GPT2;
        s->n_pre = 0;
    } else if (s->n_pre == 0) { /* no split at all: the whole text is one pre-token */
        s->pre = TOK_PRE_REGEX;
        s->pre_steps[s->n_pre++] =
            (struct tok__pre_step){"(?s).+", 6, TOK_SPLIT_ISOLATED, false, false};
    } else {
        s->pre = TOK_PRE_REGEX;
    }
    return 0;
}

/* The id of an integer JSON value in 0 .. TOK_MAX_VOCAB-1 (type: jfield_type's words for a
 * value that is not an integer). */
static int get_id(const char *what, const char *field, const char *name, const char *type,
                  int64_t id, uint32_t *out)
{
    if (type) {
        LOG_ERR("%s: %s '%.64s' has an id that is %s, not an integer", what, field, name, type);
        return ERR_FORMAT;
    }
    if (id < 0 || id >= (int64_t)TOK_MAX_VOCAB) {
        LOG_ERR("%s: %s '%.64s' has id %lld, outside 0..%u", what, field, name, (long long)id,
                TOK_MAX_VOCAB - 1);
        return ERR_RANGE;
    }
    *out = (uint32_t)id;
    return 0;
}

/* Left and right strings of merge i: "left right" or ["left", "right"]. */
static int merge_sides(const char *what, const struct tok__jdoc *d, size_t i, const char **l,
                       uint32_t *ll, const char **r, uint32_t *rl)
{
    const struct tok__jelem *m = &d->bulk[TOK_JB_HF_MERGES].e[i];
    if (m->v.type == TOK_JT_STRING) {
        if (tok__split_merge(tok__jstr(d, &m->v), m->v.len, l, ll, r, rl))
            return 0;
        LOG_ERR("%s: model.merges[%zu] \"%.64s\" is not two tokens separated by a space", what,
                i, tok__jstr(d, &m->v));
        return ERR_FORMAT;
    }
    if (m->v.type == TOK_JT_ARRAY && m->n_sub == 2 && m->sub[0].type == TOK_JT_STRING &&
        m->sub[1].type == TOK_JT_STRING && m->sub[0].len <= TOK_MAX_PIECE &&
        m->sub[1].len <= TOK_MAX_PIECE) {
        *l = tok__jstr(d, &m->sub[0]);
        *ll = m->sub[0].len;
        *r = tok__jstr(d, &m->sub[1]);
        *rl = m->sub[1].len;
        return 0;
    }
    LOG_ERR("%s: model.merges[%zu] is %s, not \"left right\" or [\"left\", \"right\"]", what, i,
            tok__jtype_name(NULL, &m->v));
    return ERR_FORMAT;
}

/* model.vocab's string -> id, for the lookups made before tok__build (unk_token, the scores
 * of a SentencePiece BPE): an open-addressing table of member index + 1. */
struct vmap {
    const struct tok__jdoc *d;
    uint32_t *slot;
    uint64_t mask;
};

static int vmap_build(const char *what, const struct tok__jdoc *d, struct vmap *m)
{
    const struct tok__jbulk *v = &d->bulk[TOK_JB_HF_VOCAB];
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)v->n)
        cap *= 2;
    m->d = d;
    m->mask = cap - 1;
    if (!(m->slot = calloc(cap, sizeof *m->slot))) {
        LOG_ERR("%s: out of memory", what);
        return -ENOMEM;
    }
    for (size_t i = 0; i < v->n; i++) {
        uint64_t h = tok__hash_bytes(d->arena + v->e[i].key_off, v->e[i].key_len);
        while (m->slot[h & m->mask])
            h++;
        m->slot[h & m->mask] = (uint32_t)i + 1;
    }
    return 0;
}

/* vocab id of a string (not NUL-terminated), or -1 (ids were checked before) */
static int32_t vocab_id(const struct vmap *m, const char *p, size_t len)
{
    const struct tok__jbulk *v = &m->d->bulk[TOK_JB_HF_VOCAB];
    for (uint64_t h = tok__hash_bytes(p, len);; h++) {
        uint32_t s = m->slot[h & m->mask];
        if (!s)
            return -1;
        const struct tok__jelem *e = &v->e[s - 1];
        if (e->key_len == len && memcmp(m->d->arena + e->key_off, p, len) == 0)
            return (int32_t)e->v.u.i;
    }
}

/* The id of the control token spelled `name` (BOS/EOS by convention), or -1. tokenizer.json
 * does not say which tokens are BOS and EOS (tokenizer_config.json does); the conventional
 * names are taken only when they are special added tokens. */
static int32_t control_id(const struct tok__spec *s, const char *name)
{
    size_t len = strlen(name);
    for (uint32_t id = 0; id < s->n; id++)
        if (s->type[id] == TOK_CONTROL && s->piece_len[id] == len &&
            memcmp(s->piece[id], name, len) == 0)
            return (int32_t)id;
    return -1;
}

/* SPM: a piece's score is minus the rank of the first merge producing it. */
static int scores_from_merges(const char *what, const struct vmap *vocab, struct tok__spec *s)
{
    size_t n_merges = vocab->d->bulk[TOK_JB_HF_MERGES].n;
    if (n_merges > TOK_MAX_VOCAB) { /* ranks beyond 2^24 are not exact as float scores */
        LOG_ERR("%s: %zu merges, more than the limit of %u for a SentencePiece vocabulary",
                what, n_merges, TOK_MAX_VOCAB);
        return ERR_RANGE;
    }
    bool *scored = calloc(s->n, sizeof *scored);
    char *cat = malloc(2 * (size_t)TOK_MAX_PIECE);
    int rc = 0;
    if (!scored || !cat) {
        LOG_ERR("%s: out of memory", what);
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n_merges; i++) {
        const char *l, *r;
        uint32_t ll, rl;
        if ((rc = merge_sides(what, vocab->d, i, &l, &ll, &r, &rl)) != 0)
            goto out;
        const char *missing = vocab_id(vocab, l, ll) < 0 ? l : vocab_id(vocab, r, rl) < 0 ? r
                                                                                          : NULL;
        if (missing) {
            LOG_ERR("%s: model.merges[%zu]: '%.*s' is not in the vocabulary", what, i,
                    (int)((missing == l ? ll : rl) > 64 ? 64 : (missing == l ? ll : rl)),
                    missing);
            rc = ERR_FORMAT;
            goto out;
        }
        memcpy(cat, l, ll);
        memcpy(cat + ll, r, rl);
        int32_t id = vocab_id(vocab, cat, (size_t)ll + rl);
        if (id < 0) {
            LOG_ERR("%s: model.merges[%zu] ('%.*s', '%.*s'): the merged token is not in the "
                    "vocabulary", what, i, (int)(ll > 64 ? 64 : ll), l, (int)(rl > 64 ? 64 : rl),
                    r);
            rc = ERR_FORMAT;
            goto out;
        }
        if (!scored[id]) {
            scored[id] = true;
            s->score[id] = -(float)i;
        }
    }
    for (uint32_t id = 0; id < s->n; id++) /* no merge makes them: below every merge */
        if (!scored[id])
            s->score[id] = -(float)n_merges - 1.0f;
out:
    free(cat);
    free(scored);
    return rc;
}

int tok__load_hf_json(const struct tok__jdoc *doc, const char *what, struct tok **out)
{
    const json_t *root = doc->root;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        LOG_ERR("%s: model is %s, not an object", what, jfield_type(model));
        return ERR_FORMAT;
    }
    const json_t *mtype = json_object_get(model, "type");
    if (!json_is_string(mtype)) {
        LOG_ERR("%s: model.type is %s, not a string", what, jfield_type(mtype));
        return ERR_FORMAT;
    }
    if (strcmp(json_string_value(mtype), "BPE") != 0) {
        LOG_ERR("%s: model.type %.64s is not supported (only BPE)", what,
                json_string_value(mtype));
        return ERR_UNSUPPORTED;
    }
    const struct tok__jbulk *vocab = &doc->bulk[TOK_JB_HF_VOCAB];
    const struct tok__jbulk *merges = &doc->bulk[TOK_JB_HF_MERGES];
    const json_t *added = json_object_get(root, "added_tokens");
    if (!vocab->present || vocab->v.type != TOK_JT_OBJECT) {
        LOG_ERR("%s: model.vocab is %s, not an object", what, tok__jtype_name(vocab, &vocab->v));
        return ERR_FORMAT;
    }
    if (!merges->present || merges->v.type != TOK_JT_ARRAY) {
        LOG_ERR("%s: model.merges is %s, not an array", what,
                tok__jtype_name(merges, &merges->v));
        return ERR_FORMAT;
    }
    if (added && !json_is_null(added) && !json_is_array(added)) {
        LOG_ERR("%s: added_tokens is %s, not an array", what, jfield_type(added));
        return ERR_FORMAT;
    }
    bool ignore_merges;
    int rc = opt_bool(what, model, "ignore_merges", false, &ignore_merges);
    if (rc != 0)
        return rc;
    /* null or "" (GPT-2's files say "") mean none; a real affix or dropout changes tokens */
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    const char *unsupported = NULL;
    for (int i = 0; i < 2 && !unsupported; i++) {
        const json_t *a = json_object_get(model, affixes[i]);
        if (a && !json_is_null(a) && !is_str(a, ""))
            unsupported = affixes[i];
    }
    const json_t *dropout = json_object_get(model, "dropout");
    if (!unsupported && dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0))
        unsupported = "dropout";
    if (unsupported) {
        LOG_ERR("%s: model.%s is not supported", what, unsupported);
        return ERR_UNSUPPORTED;
    }
    enum tok_kind kind;
    bool dummy = false;
    if ((rc = detect_kind(what, root, &kind, &dummy)) != 0)
        return rc;
    if (kind == TOK_SPM && ignore_merges) {
        LOG_ERR("%s: model.ignore_merges is not supported for a SentencePiece BPE", what);
        return ERR_UNSUPPORTED;
    }

    /* ids: vocab and added tokens together must number 0 .. n-1 */
    uint32_t n = 0, id;
    size_t entries = vocab->n;
    for (size_t k = 0; k < vocab->n; k++) {
        const struct tok__jelem *e = &vocab->e[k];
        if ((rc = get_id(what, "model.vocab token", doc->arena + e->key_off,
                         e->v.type == TOK_JT_INT ? NULL : tok__jtype_name(NULL, &e->v), e->v.u.i,
                         &id)) != 0)
            return rc;
        n = id + 1 > n ? id + 1 : n;
    }
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a) {
        const json_t *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_string(content)) {
            LOG_ERR("%s: added_tokens[%zu] is not an object with a string content", what, i);
            return ERR_FORMAT;
        }
        const json_t *aid = json_object_get(a, "id");
        if ((rc = get_id(what, "added token", json_string_value(content),
                         json_is_integer(aid) ? NULL : jfield_type(aid),
                         json_integer_value(aid), &id)) != 0)
            return rc;
        n = id + 1 > n ? id + 1 : n;
        entries++;
    }
    if (n == 0) {
        LOG_ERR("%s: model.vocab is empty", what);
        return ERR_FORMAT;
    }
    if (n > entries) { /* checked before allocating n entries */
        LOG_ERR("%s: token ids go up to %u but there are only %zu tokens: ids must be "
                "contiguous from 0", what, n - 1, entries);
        return ERR_FORMAT;
    }
    struct tok__spec s;
    struct vmap vmap = {0};
    if ((rc = tok__spec_init(&s, what, kind, n)) != 0)
        return rc;
    uint8_t *added_flags = calloc(n, 1);
    if (!added_flags) {
        LOG_ERR("%s: out of memory", what);
        rc = -ENOMEM;
        goto out;
    }
    s.added = added_flags;
    for (size_t k = 0; k < vocab->n; k++) {
        const struct tok__jelem *e = &vocab->e[k];
        const char *key = doc->arena + e->key_off;
        id = (uint32_t)e->v.u.i;
        if (s.piece[id]) {
            LOG_ERR("%s: model.vocab tokens '%.64s' and '%.64s' both have id %u", what,
                    s.piece[id], key, id);
            rc = ERR_FORMAT;
            goto out;
        }
        s.piece[id] = key;
        s.piece_len[id] = e->key_len > TOK_MAX_PIECE + 1 ? TOK_MAX_PIECE + 1 : e->key_len;
        s.type[id] = TOK_NORMAL;
    }
    json_array_foreach(added, i, a) {
        const json_t *content = json_object_get(a, "content");
        const char *c = json_string_value(content);
        size_t clen = json_string_length(content);
        id = (uint32_t)json_integer_value(json_object_get(a, "id"));
        bool special, fl[3], normalized;
        static const char *const flag_names[3] = {"lstrip", "rstrip", "single_word"};
        if ((rc = opt_bool(what, a, "special", false, &special)) != 0)
            goto out;
        for (int f = 0; f < 3; f++)
            if ((rc = opt_bool(what, a, flag_names[f], false, &fl[f])) != 0)
                goto out;
        /* Hugging Face's AddedToken: normalized defaults to !special */
        if ((rc = opt_bool(what, a, "normalized", !special, &normalized)) != 0)
            goto out;
        if (kind == TOK_SPM && !special && (fl[0] || fl[1] || fl[2])) {
            LOG_ERR("%s: added_tokens[%zu] '%.64s': lstrip/rstrip/single_word are not supported "
                    "on a SentencePiece BPE's user-defined tokens", what, i, c);
            rc = ERR_UNSUPPORTED;
            goto out;
        }
        s.added[id] = (uint8_t)((fl[0] ? TOK_ADDED_LSTRIP : 0) | (fl[1] ? TOK_ADDED_RSTRIP : 0) |
                                (fl[2] ? TOK_ADDED_SINGLE_WORD : 0) |
                                (kind == TOK_BPE && !special && !normalized ? TOK_ADDED_RAW : 0));
        if (s.piece[id] && (s.piece_len[id] != clen || memcmp(s.piece[id], c, clen) != 0 ||
                            s.type[id] != TOK_NORMAL)) {
            LOG_ERR("%s: added_tokens[%zu] '%.64s' has id %u, already token '%.64s'", what, i, c,
                    id, s.piece[id]);
            rc = ERR_FORMAT;
            goto out;
        }
        s.piece[id] = c;
        s.piece_len[id] = (uint32_t)(clen > TOK_MAX_PIECE + 1 ? TOK_MAX_PIECE + 1 : clen);
        s.type[id] = special ? TOK_CONTROL : TOK_USER_DEFINED;
    }
    for (id = 0; id < n; id++) {
        if (!s.piece[id]) {
            LOG_ERR("%s: no token has id %u: ids must be contiguous from 0", what, id);
            rc = ERR_FORMAT;
            goto out;
        }
    }

    const json_t *unk = json_object_get(model, "unk_token");
    bool need_map = kind == TOK_SPM || (unk && !json_is_null(unk));
    if (need_map && (rc = vmap_build(what, doc, &vmap)) != 0)
        goto out;
    if (unk && !json_is_null(unk)) {
        int32_t uid = json_is_string(unk) ? vocab_id(&vmap, json_string_value(unk),
                                                     json_string_length(unk))
                                          : -1;
        if (uid < 0) {
            LOG_ERR("%s: model.unk_token %s%.64s%s is not a token of model.vocab", what,
                    json_is_string(unk) ? "'" : "", json_is_string(unk) ? json_string_value(unk)
                                                                        : jfield_type(unk),
                    json_is_string(unk) ? "'" : "");
            rc = ERR_FORMAT;
            goto out;
        }
        s.unk = uid;
        s.type[uid] = TOK_UNKNOWN;
    }
    if (kind == TOK_SPM) {
        if ((rc = opt_bool(what, model, "byte_fallback", false, &s.byte_fallback)) != 0)
            goto out;
        if (s.byte_fallback)
            for (id = 0; id < n; id++)
                if (s.type[id] == TOK_NORMAL &&
                    tok__parse_byte_piece(s.piece[id], s.piece_len[id]) >= 0)
                    s.type[id] = TOK_BYTE;
        s.add_dummy_prefix = dummy;
        s.remove_extra_whitespaces = false;
        s.add_bos = true;
        s.bos = control_id(&s, "<s>");
        s.eos = control_id(&s, "</s>");
        if ((rc = scores_from_merges(what, &vmap, &s)) != 0)
            goto out;
    } else {
        size_t nm = merges->n;
        if (nm > UINT32_MAX / 2) {
            LOG_ERR("%s: too many merges (%zu)", what, nm);
            rc = ERR_RANGE;
            goto out;
        }
        if ((rc = bpe_pre(what, json_object_get(root, "pre_tokenizer"), &s)) != 0)
            goto out;
        const json_t *norm = json_object_get(root, "normalizer");
        s.normalizer = json_is_null(norm) ? NULL : norm; /* detect_kind: an object */
        s.ignore_merges = ignore_merges;
        s.n_merges = (uint32_t)nm;
        s.merge_str = tok__big_alloc((nm ? 2 * nm : 1) * sizeof *s.merge_str);
        s.merge_str_len = tok__big_alloc((nm ? 2 * nm : 1) * sizeof *s.merge_str_len);
        if (!s.merge_str || !s.merge_str_len) {
            LOG_ERR("%s: out of memory for %zu merges", what, nm);
            rc = -ENOMEM;
            goto out;
        }
        for (i = 0; i < nm; i++) {
            if ((rc = merge_sides(what, doc, i, &s.merge_str[2 * i], &s.merge_str_len[2 * i],
                                  &s.merge_str[2 * i + 1], &s.merge_str_len[2 * i + 1])) != 0)
                goto out;
        }
        /* GPT-2's one special token is both (tokenizer_config.json, which we do not read);
         * o200k_harmony's prompts start with <|start|> and answers end at <|return|>, which
         * its generation_config.json lists first among the eos ids */
        s.bos = s.eos = control_id(&s, "<|endoftext|>");
        if (control_id(&s, "<|return|>") >= 0 && control_id(&s, "<|startoftext|>") >= 0) {
            s.bos = control_id(&s, "<|startoftext|>");
            s.eos = control_id(&s, "<|return|>");
        }
        s.add_bos = false;
    }
    rc = tok__build(&s, out);
out:
    free(vmap.slot);
    free(s.added);
    tok__big_free((void *)s.merge_str);
    tok__big_free(s.merge_str_len);
    tok__spec_fini(&s);
    return rc;
}
