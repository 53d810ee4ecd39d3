/*
 * test_tok_tiktoken.c — the C half of test_tiktoken.py: given the directory where js-tiktoken
 * wrote its ranks and ids (expected.json) and the driver wrote a tokenizer.json per encoding,
 * checks that o200k_harmony and cl100k_base give js-tiktoken's ids for every corpus case,
 * 100%, through each loading path: the .tiktoken rank file, tokenizer.json, a GGUF written
 * from that tokenizer.json (tokenizer.ggml.pre gpt-4o / llama-bpe), and tokenizer.ie.json
 * saved from the rank-file tokenizer. Then, on o200k_harmony: the harmony specials and their
 * ids, specials encoded when allowed (the same ids as js-tiktoken's allowed specials) and
 * plain text otherwise, specials' strings, streaming decode holding partial UTF-8, and 100 KB
 * encoded fast. Usage: test_tok_tiktoken DIR. Exit 0 when everything holds.
 */
#include "err.h"
#include "gguf.h"
#include "harmony.h"
#include "log.h"
#include "mono.h"
#include "tok.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

__attribute__((format(printf, 1, 2)))
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

static char *path_in(const char *dir, const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* ids of a JSON array */
static int32_t *json_ids(const json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *v = malloc((*n ? *n : 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

/* Compares one encoding of text with the expected ids; prints the first difference. */
static void compare(const struct tok *t, const char *label, const char *text, const json_t *want,
                    unsigned flags, size_t *n_ok)
{
    size_t nw;
    int32_t *w = json_ids(want, &nw);
    int32_t *ids;
    size_t n;
    int rc = tok_encode_ex(t, text, strlen(text), flags, &ids, &n);
    if (rc != 0) {
        fail("%s: encoding '%.40s...' failed: %s", label, text, err_name(rc));
        free(w);
        return;
    }
    size_t i = 0;
    while (i < n && i < nw && ids[i] == w[i])
        i++;
    if (i == n && n == nw) {
        (*n_ok)++;
    } else {
        fail("%s: '%.60s': %zu ids, js-tiktoken %zu; first difference at %zu: ours %d, js %d",
             label, text, n, nw, i, i < n ? ids[i] : -1, i < nw ? w[i] : -1);
    }
    free(ids);
    free(w);
}

/* Every corpus case and the whole corpus through one tokenizer. */
static void check_corpus(const struct tok *t, const char *label, const json_t *exp,
                         const char *enc)
{
    const json_t *cases = json_object_get(exp, "cases");
    const json_t *e = json_object_get(exp, enc);
    size_t n_ok = 0, total = json_array_size(cases) + 1;
    for (size_t i = 0; i < json_array_size(cases); i++)
        compare(t, label, json_string_value(json_array_get(cases, i)),
                json_array_get(json_object_get(e, "cases"), i), 0, &n_ok);
    /* the whole corpus: the cases joined by "\n@@@@\n" */
    size_t len = 0;
    for (size_t i = 0; i < json_array_size(cases); i++)
        len += json_string_length(json_array_get(cases, i)) + 6;
    char *whole = malloc(len + 1), *o = whole;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        if (i)
            o += sprintf(o, "\n@@@@\n");
        o += sprintf(o, "%s", json_string_value(json_array_get(cases, i)));
    }
    compare(t, label, whole, json_object_get(e, "whole"), 0, &n_ok);
    free(whole);
    /* js-tiktoken's allowed specials (<|endoftext|>, <|endofprompt|>) */
    const json_t *sp = json_object_get(e, "specials");
    total += json_array_size(sp);
    for (size_t i = 0; i < json_array_size(sp); i++) {
        const json_t *c = json_array_get(sp, i);
        compare(t, label, json_string_value(json_object_get(c, "text")),
                json_object_get(c, "ids"), TOK_ENC_SPECIAL, &n_ok);
    }
    fprintf(stderr, "%s: %zu/%zu equal to js-tiktoken's ids\n", label, n_ok, total);
    if (n_ok != total)
        fail("%s: %zu of %zu differ", label, total - n_ok, total);
}

static struct tok *load(const char *path, const char *label)
{
    struct tok *t = NULL;
    double t0 = mono_sec();
    int rc = tok_load(path, &t);
    if (rc != 0) {
        fail("%s: tok_load(%s): %s", label, path, err_name(rc));
        return NULL;
    }
    fprintf(stderr, "%s: loaded in %.2f s\n", label, mono_sec() - t0);
    return t;
}

/* A GGUF tokenizer as llama.cpp's converter writes one, from the tokenizer.json. */
static int write_gguf(const char *json_path, const char *pre, const char *out)
{
    json_error_t jerr;
    json_t *doc = json_load_file(json_path, 0, &jerr);
    if (!doc) {
        fail("%s: %s", json_path, jerr.text);
        return -1;
    }
    const json_t *model = json_object_get(doc, "model");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(doc, "added_tokens");
    size_t n = json_object_size(vocab) + json_array_size(added);
    const char **toks = calloc(n, sizeof *toks);
    int32_t *types = calloc(n, sizeof *types);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)vocab, k, v) {
        toks[json_integer_value(v)] = k;
        types[json_integer_value(v)] = 1; /* normal */
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        toks[id] = json_string_value(json_object_get(v, "content"));
        types[id] = 3; /* control */
    }
    size_t nm = json_array_size(merges);
    char **ms = malloc(nm * sizeof *ms);
    for (i = 0; i < nm; i++) {
        const json_t *m = json_array_get(merges, i);
        const char *l = json_string_value(json_array_get(m, 0));
        const char *r = json_string_value(json_array_get(m, 1));
        ms[i] = malloc(strlen(l) + strlen(r) + 2);
        sprintf(ms[i], "%s %s", l, r);
    }
    struct gguf_writer *w;
    int rc = gguf_writer_create(out, &w);
    if (rc == 0)
        rc = gguf_writer_kv_str(w, "general.architecture", "gpt-oss");
    if (rc == 0)
        rc = gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    if (rc == 0)
        rc = gguf_writer_kv_str(w, "tokenizer.ggml.pre", pre);
    if (rc == 0)
        rc = gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", toks, n);
    if (rc == 0)
        rc = gguf_writer_kv_i32_arr(w, "tokenizer.ggml.token_type", types, n);
    if (rc == 0)
        rc = gguf_writer_kv_str_arr(w, "tokenizer.ggml.merges", (const char *const *)ms, nm);
    if (rc == 0)
        rc = gguf_writer_finish(w);
    else
        gguf_writer_abort(w);
    for (i = 0; i < nm; i++)
        free(ms[i]);
    free(ms);
    free(toks);
    free(types);
    json_decref(doc);
    if (rc != 0)
        fail("writing %s: %s", out, err_name(rc));
    return rc;
}

/* Every loading path of one encoding. */
static void check_encoding(const char *dir, const json_t *exp, const char *enc, const char *pre)
{
    char name[64], label[96];
    snprintf(name, sizeof name, "%s.tiktoken", enc);
    snprintf(label, sizeof label, "%s via .tiktoken", enc);
    struct tok *t = load(path_in(dir, name), label);
    if (t)
        check_corpus(t, label, exp, enc);
    snprintf(name, sizeof name, "%s.json", enc);
    snprintf(label, sizeof label, "%s via tokenizer.json", enc);
    struct tok *th = load(path_in(dir, name), label);
    if (th)
        check_corpus(th, label, exp, enc);
    char gg[64];
    snprintf(gg, sizeof gg, "%s.gguf", enc);
    if (write_gguf(path_in(dir, name), pre, path_in(dir, gg)) == 0) {
        snprintf(label, sizeof label, "%s via GGUF (pre %s)", enc, pre);
        struct tok *tg = load(path_in(dir, gg), label);
        if (tg)
            check_corpus(tg, label, exp, enc);
        tok_free(tg);
    }
    if (t) { /* tokenizer.ie.json of the rank-file tokenizer, as IEBIN models carry it */
        char *json = NULL;
        size_t len;
        struct tok *ti = NULL;
        if (tok_save_json(t, &json, &len) != 0 || tok_load_mem(json, len, "ie-json", &ti)) {
            fail("%s: tokenizer.ie.json round trip failed", enc);
        } else {
            snprintf(label, sizeof label, "%s via tokenizer.ie.json", enc);
            check_corpus(ti, label, exp, enc);
        }
        free(json);
        tok_free(ti);
    }
    if (t && th) { /* the merges a writer gets from the rank file are the tokenizer.json's */
        int32_t *m1, *m2;
        size_t n1, n2;
        if (tok_merges(t, &m1, &n1) != 0 || tok_merges(th, &m2, &n2) != 0) {
            fail("%s: tok_merges failed", enc);
        } else {
            if (n1 != n2 || memcmp(m1, m2, 2 * n1 * sizeof *m1) != 0)
                fail("%s: tok_merges of the rank file (%zu) differs from tokenizer.json's (%zu)",
                     enc, n1, n2);
            else
                fprintf(stderr, "%s: %zu merges derived from the ranks, as transformers does\n",
                        enc, n1);
            free(m1);
            free(m2);
        }
    }
    tok_free(th);
    tok_free(t);
}

static bool valid_utf8_complete(const char *p, size_t n)
{
    /* a push's output is whole characters: its lead bytes and continuations add up */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (l == 0 || i + l > n)
            return false;
        for (size_t j = 1; j < l; j++)
            if (((unsigned char)p[i + j] & 0xC0) != 0x80)
                return false;
        i += l;
    }
    return true;
}

/* o200k_harmony's specials, allowed specials, streaming, speed. */
static void check_harmony(const char *dir)
{
    struct tok *t = load(path_in(dir, "o200k_base.tiktoken"), "o200k_harmony");
    if (!t)
        return;
    if (tok_vocab_size(t) != 201088)
        fail("o200k_harmony has %u tokens, not 201088", tok_vocab_size(t));
    static const struct {
        const char *s;
        int32_t id;
    } sp[] = {{"<|startoftext|>", 199998}, {"<|endoftext|>", 199999},
              {"<|reserved_200000|>", 200000}, {"<|return|>", 200002},
              {"<|constrain|>", 200003}, {"<|channel|>", 200005}, {"<|start|>", 200006},
              {"<|end|>", 200007}, {"<|message|>", 200008}, {"<|call|>", 200012},
              {"<|reserved_200013|>", 200013}, {"<|endofprompt|>", 200018},
              {"<|reserved_201087|>", 201087}};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        if (tok_token_id(t, sp[i].s, strlen(sp[i].s)) != sp[i].id)
            fail("%s is id %d, not %d", sp[i].s, tok_token_id(t, sp[i].s, strlen(sp[i].s)),
                 sp[i].id);
        if (tok_token_type(t, sp[i].id) != TOK_CONTROL)
            fail("%s is not a control token", sp[i].s);
        if (!tok_token_str(t, sp[i].id) || strcmp(tok_token_str(t, sp[i].id), sp[i].s) != 0)
            fail("token %d's string is not %s", sp[i].id, sp[i].s);
    }
    if (tok_bos(t) != 199998 || tok_eos(t) != 200002 || tok_add_bos(t))
        fail("o200k_harmony: bos %d eos %d add_bos %d; want 199998, 200002, no", tok_bos(t),
             tok_eos(t), tok_add_bos(t));
    /* specials: allowed, they are one token each; not allowed, plain text that decodes back */
    const char *msg = "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant";
    int32_t *ids;
    size_t n;
    if (tok_encode_ex(t, msg, strlen(msg), TOK_ENC_SPECIAL, &ids, &n) != 0 || n < 6 ||
        ids[0] != 200006 || ids[2] != 200008 || ids[n - 2] != 200006) {
        fail("harmony specials in text: not encoded as <|start|> .. <|message|> ..");
    } else {
        char *back, *plain;
        size_t bl, pl;
        if (tok_decode_ex(t, ids, n, TOK_DEC_SPECIAL, &back, &bl) != 0 ||
            tok_decode(t, ids, n, &plain, &pl) != 0) {
            fail("harmony specials: decoding failed");
        } else {
            if (bl != strlen(msg) || memcmp(back, msg, bl) != 0)
                fail("harmony specials do not decode back with TOK_DEC_SPECIAL: '%s'", back);
            if (strcmp(plain, "userWhat is 2 + 2?assistant") != 0)
                fail("harmony specials decode to '%s' without TOK_DEC_SPECIAL", plain);
            free(back);
            free(plain);
        }
        free(ids);
    }
    if (tok_encode_ex(t, msg, strlen(msg), 0, &ids, &n) != 0) {
        fail("harmony text without specials did not encode");
    } else {
        for (size_t i = 0; i < n; i++)
            if (tok_token_type(t, ids[i]) == TOK_CONTROL)
                fail("text without TOK_ENC_SPECIAL gave control token %d", ids[i]);
        char *back;
        size_t bl;
        if (tok_decode(t, ids, n, &back, &bl) != 0 || bl != strlen(msg) ||
            memcmp(back, msg, bl) != 0)
            fail("harmony text as plain text does not decode back");
        else
            free(back);
        free(ids);
    }
    /* harmony on the real vocabulary: the spec's prompt renders to the ids of its text with
     * specials allowed, and the spec's typical output parses into its channels */
    {
        static const char want[] =
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
            "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high"
            "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
            "every message.<|end|><|start|>developer<|message|># Instructions\n\nAnswer in "
            "one line.<|end|><|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant";
        struct harmony_msg m[] = {{.role = HARMONY_USER, .content = "What is 2 + 2?"}};
        struct harmony_opts o = {.effort = HARMONY_EFFORT_HIGH, .current_date = "2025-06-28",
                                 .instructions = "Answer in one line."};
        int32_t *r, *w;
        size_t nr, nw;
        if (harmony_render(t, m, 1, &o, &r, &nr) != 0 ||
            tok_encode_ex(t, want, strlen(want), TOK_ENC_SPECIAL, &w, &nw) != 0) {
            fail("harmony: render or encode failed");
        } else {
            if (nr != nw || memcmp(r, w, nr * sizeof *r) != 0)
                fail("harmony: the rendered prompt (%zu ids) is not the spec's (%zu ids)", nr,
                     nw);
            free(r);
            free(w);
        }
        static const char out[] = "<|channel|>analysis<|message|>Trivial arithmetic: "
                                  "\xE2\x9C\x93<|end|><|start|>assistant<|channel|>final"
                                  "<|message|>2 + 2 = 4.<|return|>";
        struct harmony_parser p;
        char fin[64] = "", ana[64] = "";
        enum harmony_ev stop = HARMONY_EV_NONE;
        if (tok_encode_ex(t, out, strlen(out), TOK_ENC_SPECIAL, &w, &nw) != 0 ||
            harmony_parser_init(&p, t) != 0) {
            fail("harmony: parser setup failed");
        } else {
            for (size_t i = 0; i < nw; i++) {
                struct harmony_event ev;
                if (harmony_parser_push(&p, w[i], &ev) != 0) {
                    fail("harmony: parsing id %zu failed", i);
                    break;
                }
                if (ev.len && ev.channel == HARMONY_CH_FINAL)
                    strncat(fin, ev.text, ev.len);
                if (ev.len && ev.channel == HARMONY_CH_ANALYSIS)
                    strncat(ana, ev.text, ev.len);
                if (ev.kind == HARMONY_EV_RETURN)
                    stop = ev.kind;
            }
            if (strcmp(fin, "2 + 2 = 4.") || strcmp(ana, "Trivial arithmetic: \xE2\x9C\x93") ||
                stop != HARMONY_EV_RETURN)
                fail("harmony: parsed final '%s' analysis '%s' stop %d", fin, ana, stop);
            harmony_parser_fini(&p);
            free(w);
        }
    }
    /* streaming: 4-byte characters split over byte tokens are held until complete */
    const char *text = "\xF0\x9F\xA6\x99\xF0\x9F\xA7\x91\xF0\x9F\x8F\xBF\xE2\x80\x8D"
                       "\xF0\x9F\x9A\x80 \xE4\xB8\xAD\xF0\x90\x8D\x88 \xF0\x93\x80\x80";
    if (tok_encode(t, text, strlen(text), false, &ids, &n) != 0) {
        fail("streaming text did not encode");
    } else {
        struct tok_stream st;
        tok_stream_init(&st, t);
        size_t cap = tok_stream_max_out(t), held = 0, total = 0;
        char *out = malloc(cap), *all = malloc(strlen(text) + 8);
        for (size_t i = 0; i < n; i++) {
            size_t k;
            const char *piece;
            size_t pl;
            if (tok_stream_push(&st, ids[i], out, cap, &k) != 0) {
                fail("tok_stream_push failed");
                break;
            }
            if (!valid_utf8_complete(out, k))
                fail("stream push %zu gave a partial UTF-8 character", i);
            if (tok_piece(t, ids[i], &piece, &pl) == 0 && pl > 0 && k == 0)
                held++;
            memcpy(all + total, out, k);
            total += k;
        }
        size_t k;
        tok_stream_flush(&st, out, cap, &k);
        memcpy(all + total, out, k);
        total += k;
        if (total != strlen(text) || memcmp(all, text, total) != 0)
            fail("streamed text differs from the original");
        if (held == 0)
            fail("no token was held as partial UTF-8: the test text no longer exercises it");
        fprintf(stderr, "stream: %zu ids, %zu held back as partial UTF-8\n", n, held);
        free(out);
        free(all);
        free(ids);
    }
    /* speed: 100 KB of varied text, and 100 KB of one long word */
    size_t big = 100 * 1024;
    char *buf = malloc(big + 64);
    static const char *const words[] = {"Hello", " world,", " \xE4\xB8\xAD\xE6\x96\x87",
                                        " 12345", " don't", "\n\n", "   ", " \xF0\x9F\x98\x80",
                                        " \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7", "()=>{}"};
    size_t len = 0;
    for (unsigned i = 0; len < big; i++) {
        const char *w = words[(i * 7 + i / 3) % 10];
        memcpy(buf + len, w, strlen(w));
        len += strlen(w);
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (size_t i = 0; i < big; i++)
                buf[i] = "abcdefghij"[(i * i + i / 7) % 10], len = big;
        double t0 = mono_sec();
        if (tok_encode(t, buf, len, false, &ids, &n) != 0) {
            fail("100 KB did not encode");
            continue;
        }
        double dt = mono_sec() - t0;
        fprintf(stderr, "o200k_harmony: %zu bytes (%s) -> %zu ids in %.3f s\n", len,
                pass ? "one word" : "text", n, dt);
        if (dt > 2.0)
            fail("encoding 100 KB took %.2f s", dt);
        free(ids);
    }
    free(buf);
    tok_free(t);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    json_error_t jerr;
    json_t *exp = json_load_file(path_in(dir, "expected.json"), 0, &jerr);
    if (!exp) {
        fprintf(stderr, "FAIL: expected.json: %s\n", jerr.text);
        return 1;
    }
    check_encoding(dir, exp, "o200k_base", "gpt-4o");
    check_encoding(dir, exp, "cl100k_base", "llama-bpe");
    check_harmony(dir);
    json_decref(exp);
    fprintf(stderr, failures ? "%d failures\n" : "all equal\n", failures);
    return failures ? 1 : 0;
}
