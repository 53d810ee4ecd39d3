/*
 * tokfix.c — see tokfix.h. The Hugging Face documents are generated the way Hugging Face's
 * own converter (convert_slow_tokenizer's SentencePieceExtractor) derives them from a
 * SentencePiece model: every split of a piece into two pieces is a merge, merges are ordered
 * by the merged piece's score (highest first), ties by the merged piece's id, then by the
 * ids of the two halves.
 */
#include "testutil.h"

#include "tokfix.h"

#include "err.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEP "\n__ggml_vocab_test__\n"

void tokfix_load(const char *name, struct tokfix *fx)
{
    char inp[256], outp[256];
    snprintf(inp, sizeof inp, "tokenizer/%s.inp", name);
    snprintf(outp, sizeof outp, "tokenizer/%s.out", name);
    char *ip = strdup(tu_fixture(inp));
    tokfix_load_paths(ip, tu_fixture(outp), name, fx);
    free(ip);
}

void tokfix_load_paths(const char *inp, const char *outp, const char *name, struct tokfix *fx)
{
    size_t in_len, out_len;
    char *in = tu_read_file(inp, &in_len);
    char *out = tu_read_file(outp, &out_len);
    memset(fx, 0, sizeof *fx);

    size_t cap = 0, sep_len = strlen(SEP);
    for (size_t pos = 0; pos < in_len;) {
        char *hit = memmem(in + pos, in_len - pos, SEP, sep_len);
        if (!hit)
            fail_msg("%s.inp: text after the last separator at byte %zu", name, pos);
        if (fx->n == cap) {
            cap = cap ? 2 * cap : 64;
            fx->cases = realloc(fx->cases, cap * sizeof *fx->cases);
            assert_non_null(fx->cases);
        }
        struct tokfix_case *c = &fx->cases[fx->n++];
        memset(c, 0, sizeof *c);
        c->len = (size_t)(hit - (in + pos));
        c->text = malloc(c->len + 1);
        assert_non_null(c->text);
        memcpy(c->text, in + pos, c->len);
        c->text[c->len] = '\0';
        pos = (size_t)(hit - in) + sep_len;
    }
    size_t line = 0;
    for (char *p = out, *end = out + out_len; p < end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            nl = end;
        if (line >= fx->n)
            fail_msg("%s.out has more lines than %s.inp has strings (%zu)", name, name, fx->n);
        struct tokfix_case *c = &fx->cases[line];
        c->ids = malloc(((size_t)(nl - p) / 2 + 1) * sizeof *c->ids);
        assert_non_null(c->ids);
        for (char *q = p; q < nl;) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q) {
                if (*q != ' ')
                    fail_msg("%s.out line %zu: unexpected '%c'", name, line + 1, *q);
                q++;
                continue;
            }
            c->ids[c->n_ids++] = (int32_t)v;
            q = e;
        }
        p = nl + 1;
    }
    if (line != fx->n || fx->n == 0)
        fail_msg("%s.out has %zu lines for %zu strings", name, line, fx->n);
    free(in);
    free(out);
}

void tokfix_free(struct tokfix *fx)
{
    for (size_t i = 0; i < fx->n; i++) {
        free(fx->cases[i].text);
        free(fx->cases[i].ids);
    }
    free(fx->cases);
    memset(fx, 0, sizeof *fx);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

void tokfix_check(const struct tok *t, const struct tokfix *fx, const char *label)
{
    size_t bad = 0;
    for (size_t i = 0; i < fx->n; i++) {
        const struct tokfix_case *c = &fx->cases[i];
        int32_t *ids;
        size_t n;
        int rc = tok_encode(t, c->text, c->len, false, &ids, &n);
        if (rc != 0)
            fail_msg("%s: case %zu: tok_encode: %s", label, i, err_name(rc));
        if (n != c->n_ids || memcmp(ids, c->ids, n * sizeof *ids) != 0) {
            fprintf(stderr, "%s: case %zu '%s' encodes wrongly\n", label, i, c->text);
            print_ids("expected", c->ids, c->n_ids);
            print_ids("got     ", ids, n);
            bad++;
        }
        char *text;
        size_t len;
        if ((rc = tok_decode(t, ids, n, &text, &len)) != 0)
            fail_msg("%s: case %zu: tok_decode: %s", label, i, err_name(rc));
        if (len != c->len || memcmp(text, c->text, len) != 0) {
            fprintf(stderr, "%s: case %zu '%s' decodes to '%s'\n", label, i, c->text, text);
            bad++;
        }
        free(text);
        free(ids);
    }
    if (bad)
        fail_msg("%s: %zu of %zu cases wrong", label, bad, fx->n);
    fprintf(stderr, "%s: %zu cases encode and decode exactly\n", label, fx->n);
}

struct tok *tokfix_via_ie_json(const struct tok *t)
{
    char *json;
    size_t len;
    struct tok *t2 = NULL;
    assert_int_equal(tok_save_json(t, &json, &len), 0);
    int rc = tok_load_mem(json, len, "ie-json", &t2);
    if (rc != 0)
        fail_msg("tok_load_mem(ie-json): %s", err_name(rc));
    free(json);
    return t2;
}

/* ---- Hugging Face documents ------------------------------------------------------------ */

struct merge {
    double score;
    int32_t merged, left, right;
};

static int cmp_merge(const void *pa, const void *pb)
{
    const struct merge *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->merged != b->merged)
        return a->merged < b->merged ? -1 : 1;
    if (a->left != b->left)
        return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

static json_t *spm_merges(const json_t *ie, int as_arrays)
{
    const json_t *tokens = json_object_get(ie, "tokens");
    const json_t *types = json_object_get(ie, "types");
    const json_t *scores = json_object_get(ie, "scores");
    size_t n = json_array_size(tokens);
    json_t *normal = json_object(); /* piece -> id of the normal pieces */
    for (size_t i = 0; i < n; i++)
        if (strcmp(json_string_value(json_array_get(types, i)), "normal") == 0)
            json_object_set_new(normal, json_string_value(json_array_get(tokens, i)),
                                json_integer((json_int_t)i));
    size_t cap = 1024, nm = 0;
    struct merge *m = malloc(cap * sizeof *m);
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        if (strcmp(json_string_value(json_array_get(types, i)), "normal") != 0)
            continue;
        const char *s = json_string_value(json_array_get(tokens, i));
        size_t len = strlen(s);
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80)
                continue; /* not a character boundary */
            assert_true(len < sizeof buf);
            memcpy(buf, s, k);
            buf[k] = '\0';
            const json_t *l = json_object_get(normal, buf);
            const json_t *r = json_object_get(normal, s + k);
            if (!l || !r)
                continue;
            if (nm == cap) {
                cap *= 2;
                m = realloc(m, cap * sizeof *m);
            }
            m[nm++] = (struct merge){json_number_value(json_array_get(scores, i)), (int32_t)i,
                                     (int32_t)json_integer_value(l),
                                     (int32_t)json_integer_value(r)};
        }
    }
    qsort(m, nm, sizeof *m, cmp_merge);
    json_t *out = json_array();
    for (size_t i = 0; i < nm; i++) {
        const char *l = json_string_value(json_array_get(tokens, (size_t)m[i].left));
        const char *r = json_string_value(json_array_get(tokens, (size_t)m[i].right));
        if (as_arrays) {
            json_array_append_new(out, json_pack("[ss]", l, r));
        } else {
            snprintf(buf, sizeof buf, "%s %s", l, r);
            json_array_append_new(out, json_string(buf));
        }
    }
    free(m);
    json_decref(normal);
    return out;
}

static json_t *bpe_merges(const json_t *ie)
{
    const json_t *tokens = json_object_get(ie, "tokens");
    json_t *out = json_array();
    size_t i;
    const json_t *pair;
    char buf[1024];
    json_array_foreach(json_object_get(ie, "merges"), i, pair) {
        snprintf(buf, sizeof buf, "%s %s",
                 json_string_value(json_array_get(
                     tokens, (size_t)json_integer_value(json_array_get(pair, 0)))),
                 json_string_value(json_array_get(
                     tokens, (size_t)json_integer_value(json_array_get(pair, 1)))));
        json_array_append_new(out, json_string(buf));
    }
    return out;
}

char *tokfix_hf_json(const struct tok *t, int metaspace)
{
    char *ie_text;
    size_t ie_len;
    assert_int_equal(tok_save_json(t, &ie_text, &ie_len), 0);
    json_error_t jerr;
    json_t *ie = json_loadb(ie_text, ie_len, 0, &jerr);
    assert_non_null(ie);
    free(ie_text);
    bool spm = strcmp(json_string_value(json_object_get(ie, "kind")), "spm") == 0;

    json_t *vocab = json_object(), *added = json_array();
    const json_t *tokens = json_object_get(ie, "tokens"), *types = json_object_get(ie, "types");
    for (size_t i = 0; i < json_array_size(tokens); i++) {
        const char *s = json_string_value(json_array_get(tokens, i));
        const char *ty = json_string_value(json_array_get(types, i));
        json_object_set_new(vocab, s, json_integer((json_int_t)i));
        if (strcmp(ty, "control") == 0 || strcmp(ty, "unknown") == 0)
            json_array_append_new(added, json_pack("{sIsssbsbsbsbsb}", "id", (json_int_t)i,
                                                   "content", s, "single_word", 0, "lstrip", 0,
                                                   "rstrip", 0, "normalized", 0, "special", 1));
    }
    /* Hugging Face's Llama files say null for the affixes, its GPT-2 files "" */
    json_t *model = spm ? json_pack("{sssnsnsn}", "type", "BPE", "dropout",
                                    "continuing_subword_prefix", "end_of_word_suffix")
                        : json_pack("{sssnssss}", "type", "BPE", "dropout",
                                    "continuing_subword_prefix", "", "end_of_word_suffix", "");
    json_object_set_new(model, "vocab", vocab);
    json_t *doc = json_pack("{sssnsn}", "version", "1.0", "truncation", "padding");
    json_object_set_new(doc, "added_tokens", added);
    if (spm) {
        const json_t *unk = json_object_get(ie, "unk");
        json_object_set_new(model, "unk_token",
                            json_string(json_string_value(json_array_get(
                                tokens, (size_t)json_integer_value(unk)))));
        json_object_set_new(model, "fuse_unk", json_true());
        json_object_set_new(model, "byte_fallback", json_true());
        json_object_set_new(model, "merges", spm_merges(ie, metaspace));
        if (metaspace) {
            json_object_set_new(doc, "normalizer", json_null());
            json_object_set_new(doc, "pre_tokenizer",
                                json_pack("{sssssssb}", "type", "Metaspace", "replacement",
                                          "\xE2\x96\x81", "prepend_scheme", "first", "split", 0));
        } else {
            json_object_set_new(
                doc, "normalizer",
                json_pack("{sss[{ssss}{sss{ss}ss}]}", "type", "Sequence", "normalizers", "type",
                          "Prepend", "prepend", "\xE2\x96\x81", "type", "Replace", "pattern",
                          "String", " ", "content", "\xE2\x96\x81"));
            json_object_set_new(doc, "pre_tokenizer", json_null());
        }
    } else {
        json_object_set_new(model, "unk_token", json_null());
        json_object_set_new(model, "fuse_unk", json_false());
        json_object_set_new(model, "byte_fallback", json_false());
        json_object_set_new(model, "merges", bpe_merges(ie));
        json_object_set_new(doc, "normalizer", json_null());
        json_object_set_new(doc, "pre_tokenizer",
                            json_pack("{sssbsbsb}", "type", "ByteLevel", "add_prefix_space", 0,
                                      "trim_offsets", 1, "use_regex", 1));
    }
    json_object_set_new(doc, "model", model);
    assert_non_null(model);
    char *text = json_dumps(doc, JSON_COMPACT);
    assert_non_null(text);
    json_decref(doc);
    json_decref(ie);
    return text;
}
