/*
 * tok_pre.c — regex pre-tokenizers on PCRE2: the split steps a model declares
 * (tokenizer.json pre_tokenizer Split / Sequence / ByteLevel, GGUF tokenizer.ggml.pre names)
 * compiled once per tokenizer and run over the text before BPE.
 *
 * Semantics follow Hugging Face tokenizers' Split: each step finds the matches of its regex
 * inside each piece the previous step produced (a lookahead never sees past its piece), turns
 * the piece into alternating gap / match spans (an empty match still separates two gaps),
 * flips them when `invert`, and combines them by its behavior (Isolated, Removed,
 * MergedWithPrevious, MergedWithNext, Contiguous). Empty pieces are dropped. llama.cpp's
 * regex lists are the same thing with every step Isolated.
 *
 * Patterns compile with PCRE2_UTF | PCRE2_UCP, so \p{L}, \s, \d and case folding are
 * Unicode's, and the text is already validated UTF-8 (PCRE2_NO_UTF_CHECK). JIT is used when
 * PCRE2 has it; a match that overflows the JIT stack is retried by the interpreter, whose match,
 * depth and heap limits bound what one match may cost. Past those limits the rest of the piece
 * being split becomes one piece (warned once per call): hostile text or a hostile pattern
 * costs bounded time (one failed match per piece) and still encodes losslessly.
 *
 * NOTES: the compiled code is shared by threads (pcre2_match only reads it); the match data
 * is made per call.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok_internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* Per match call: steps of the interpreter, its backtracking depth, its heap (KiB). */
#define MATCH_LIMIT 200000u
#define DEPTH_LIMIT 10000u
#define HEAP_LIMIT_KIB 16384u

struct step {
    pcre2_code *code;
    char *pattern; /* NUL-terminated copy */
    struct tok__pre_step decl;
};

struct tok__pre_rx {
    uint32_t n;
    struct step steps[TOK_PRE_MAX_STEPS];
    struct tok__pre_step decl[TOK_PRE_MAX_STEPS]; /* what tok__pre_steps returns */
    pcre2_match_context *mctx;
};

/* ---------------------------------------------------------------------------------------- */
/* names                                                                                    */

static const char *const split_names[][2] = {
    {"isolated", "Isolated"},
    {"removed", "Removed"},
    {"merged_with_previous", "MergedWithPrevious"},
    {"merged_with_next", "MergedWithNext"},
    {"contiguous", "Contiguous"},
};

int tok__split_from_name(const char *name, bool hf)
{
    for (int i = 0; i < (int)(sizeof split_names / sizeof split_names[0]); i++)
        if (strcmp(name, split_names[i][hf]) == 0)
            return i;
    return -1;
}

const char *tok__split_name(int behavior, bool hf)
{
    if (behavior < 0 || behavior >= (int)(sizeof split_names / sizeof split_names[0]))
        return NULL;
    return split_names[behavior][hf];
}

/* GPT-2 (ByteLevel use_regex), with Hugging Face's trailing \s+ */
const char tok__gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Llama 3 (and cl100k_base): contractions of either case, digit runs of at most three */
#define PAT_LLAMA3                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "              \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2: Llama 3's with single digits */
#define PAT_QWEN2                                                                           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                   \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k (gpt-4o, gpt-oss): case-aware words with a contraction suffix */
#define PAT_O200K                                                                           \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "             \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral's tekken: o200k's words without the contractions, single digits */
#define PAT_TEKKEN                                                                          \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* GPT-2's without the final \s+, as llama.cpp lists it (gaps stay pieces either way) */
#define PAT_GPT2_LC "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* DeepSeek LLM's Latin/Greek/Cyrillic/... letter ranges (deepseek-ai's tokenizer.json) */
#define PAT_DEEPSEEK_LETTERS                                                                \
    "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-\xC6\xBF" \
    "\xC7\x84-\xCA\x93\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-\xCD\xBD"    \
    "\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-"    \
    "\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-\xE1\x83\x85\xE1\x8E\xA0-"        \
    "\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA\xE1\xB2\xBD-"             \
    "\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7\xE1\xB5\xB9-"             \
    "\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-\xE1\xBC\x9D\xE1\xBC\xA0-"             \
    "\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD\x90-\xE1\xBD\x97\xE1\xBD\x99"             \
    "\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD\xE1\xBE\x80-\xE1\xBE\xB4"             \
    "\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86-"             \
    "\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-"             \
    "\xE1\xBF\xAC\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82"             \
    "\xE2\x84\x87\xE2\x84\x8A-\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-\xE2\x84\x9D"             \
    "\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD\xE2\x84\xAF-"             \
    "\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85-\xE2\x85\x89"             \
    "\xE2\x85\x8E\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2\xB1\xBB\xE2\xB1\xBE-"             \
    "\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3\xB2\xE2\xB3\xB3\xEA\x99\x80-"             \
    "\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1-"             \
    "\xEA\x9E\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-"             \
    "\xEF\xAC\x86\xEF\xAC\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-"             \
    "\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93\x93"         \
    "\xF0\x90\x93\x98-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2\xF0\x90\xB3\x80-"     \
    "\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+"
/* CJK ideographs, U+0800..U+4E00 and Hangul (both DeepSeek tokenizers) */
#define PAT_DEEPSEEK_CJK                                                                    \
    "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+"

/* A regex list: up to 6 patterns, all Isolated (llama.cpp's form). */
struct pre_entry {
    const char *names; /* '|'-separated GGUF names */
    enum tok_pre kind;
    bool ignore_merges; /* tiktoken-made vocabularies (llama.cpp sets it for llama3, tekken) */
    const char *pats[6];
};

static const struct pre_entry pre_table[] = {
    {"gpt-2|gpt2|mpt|olmo|jais|trillion|granite-docling", TOK_PRE_GPT2, false, {NULL}},
    {"llama-bpe|llama3|llama-v3|falcon3", TOK_PRE_REGEX, true, {PAT_LLAMA3}},
    {"dbrx|smaug-bpe|chatglm-bpe", TOK_PRE_REGEX, false, {PAT_LLAMA3}},
    {"gpt-4o|minimax-m2", TOK_PRE_REGEX, true, {PAT_O200K}},
    {"tekken", TOK_PRE_REGEX, true, {PAT_TEKKEN}},
    {"qwen2|qwen2.5|qwen-2.5|deepseek-r1-qwen|stablelm2|hunyuan", TOK_PRE_REGEX, false,
     {PAT_QWEN2}},
    {"deepseek-llm", TOK_PRE_REGEX, false,
     {"[\r\n]", PAT_DEEPSEEK_LETTERS,
      "\\s?[!-/:-~\xEF\xBC\x81-\xEF\xBC\x8F\xEF\xBC\x9A-\xEF\xBD\x9E\xE2\x80\x98-\xE2\x80\x9F"
      "\xE3\x80\x80-\xE3\x80\x82]+",
      "\\s+$", PAT_DEEPSEEK_CJK, "\\p{N}+"}},
    {"deepseek-coder", TOK_PRE_REGEX, false,
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", PAT_DEEPSEEK_CJK, "\\p{N}"}},
    {"falcon", TOK_PRE_REGEX, false,
     {"[\\p{P}\\$\\+<=>\\^~\\|`]+", PAT_GPT2_LC, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva", TOK_PRE_REGEX, false,
     {"\\p{N}", PAT_GPT2_LC}},
    {"bloom|poro-chat|gpt3-finnish", TOK_PRE_REGEX, false,
     {" ?[^(\\s|.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94"
      "\xD8\x8C)]+"}},
    {"viking", TOK_PRE_REGEX, false,
     {" ?[^(\\s|.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94"
      "\xD8\x8C)]+",
      "\\p{N}"}},
    {"default", TOK_PRE_REGEX, false,
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", PAT_GPT2_LC, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"deepseek-v3|hunyuan-dense", TOK_PRE_REGEX, false,
     {"\\p{N}{1,3}", "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-"
                     "\xE3\x83\xBF]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
      "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
};

/* every name above, for the message that refuses another */
const char tok__pre_known[] =
    "gpt-2, gpt2, mpt, olmo, jais, trillion, granite-docling, llama-bpe, llama3, "
    "llama-v3, falcon3, dbrx, smaug-bpe, chatglm-bpe, gpt-4o, minimax-m2, tekken, "
    "qwen2, qwen2.5, qwen-2.5, deepseek-r1-qwen, stablelm2, hunyuan, deepseek-llm, "
    "deepseek-coder, falcon, starcoder, refact, command-r, smollm, codeshell, exaone,"
    " minerva, bloom, poro-chat, gpt3-finnish, viking, default, deepseek-v3, "
    "hunyuan-dense";

static bool name_in(const char *names, const char *name, size_t len)
{
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == len && memcmp(p, name, len) == 0)
            return true;
        p += l + (bar != NULL);
    }
    return false;
}

int tok__pre_by_name(const char *name, size_t len, enum tok_pre *kind,
                     struct tok__pre_step *steps, uint32_t *n, bool *ignore_merges)
{
    for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++) {
        const struct pre_entry *e = &pre_table[i];
        if (!name_in(e->names, name, len))
            continue;
        *kind = e->kind;
        *ignore_merges = e->ignore_merges;
        *n = 0;
        for (uint32_t k = 0; k < 6 && e->pats[k]; k++)
            steps[(*n)++] = (struct tok__pre_step){e->pats[k], (uint32_t)strlen(e->pats[k]),
                                                   TOK_SPLIT_ISOLATED, false, false};
        return 0;
    }
    return ERR_UNSUPPORTED;
}

/* ---------------------------------------------------------------------------------------- */
/* compiling                                                                                */

void tok__pre_free(struct tok__pre_rx *rx)
{
    if (!rx)
        return;
    for (uint32_t i = 0; i < rx->n; i++) {
        pcre2_code_free(rx->steps[i].code);
        free(rx->steps[i].pattern);
    }
    pcre2_match_context_free(rx->mctx);
    free(rx);
}

uint32_t tok__pre_steps(const struct tok__pre_rx *rx, const struct tok__pre_step **steps)
{
    *steps = rx->decl;
    return rx->n;
}

int tok__pre_compile(const char *what, const struct tok__pre_step *steps, uint32_t n,
                     struct tok__pre_rx **out)
{
    *out = NULL;
    if (n == 0 || n > TOK_PRE_MAX_STEPS) {
        LOG_ERR("%s: %u pre-tokenizer split steps; 1..%d are supported", what, n,
                TOK_PRE_MAX_STEPS);
        return ERR_RANGE;
    }
    struct tok__pre_rx *rx = calloc(1, sizeof *rx);
    if (!rx || !(rx->mctx = pcre2_match_context_create(NULL))) {
        LOG_ERR("%s: out of memory for the pre-tokenizer", what);
        free(rx);
        return -ENOMEM;
    }
    pcre2_set_match_limit(rx->mctx, MATCH_LIMIT);
    pcre2_set_depth_limit(rx->mctx, DEPTH_LIMIT);
    pcre2_set_heap_limit(rx->mctx, HEAP_LIMIT_KIB);
    uint32_t jit = 0;
    (void)pcre2_config(PCRE2_CONFIG_JIT, &jit);
    int rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct tok__pre_step *d = &steps[i];
        if (d->pattern_len > TOK_PRE_MAX_PATTERN) {
            LOG_ERR("%s: pre-tokenizer step %u: the pattern is %u bytes long (limit %u)", what,
                    i, d->pattern_len, TOK_PRE_MAX_PATTERN);
            rc = ERR_RANGE;
            goto fail;
        }
        if (!tok__split_name(d->behavior, false)) {
            LOG_ERR("%s: pre-tokenizer step %u: behavior %d is not a split behavior", what, i,
                    d->behavior);
            rc = ERR_FORMAT;
            goto fail;
        }
        struct step *s = &rx->steps[i];
        if (!(s->pattern = malloc((size_t)d->pattern_len + 1))) {
            LOG_ERR("%s: out of memory for the pre-tokenizer", what);
            rc = -ENOMEM;
            goto fail;
        }
        memcpy(s->pattern, d->pattern, d->pattern_len);
        s->pattern[d->pattern_len] = '\0';
        s->decl = *d;
        s->decl.pattern = s->pattern;
        rx->decl[i] = s->decl;
        rx->n = i + 1;
        int err;
        PCRE2_SIZE at;
        uint32_t opts = PCRE2_UTF | (d->literal ? PCRE2_LITERAL : PCRE2_UCP);
        s->code = pcre2_compile((PCRE2_SPTR)s->pattern, d->pattern_len, opts, &err, &at, NULL);
        if (!s->code) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            LOG_ERR("%s: pre-tokenizer step %u: the regex /%.80s%s/ does not compile at "
                    "offset %zu: %s", what, i, s->pattern, d->pattern_len > 80 ? "..." : "",
                    (size_t)at, (const char *)msg);
            rc = ERR_FORMAT;
            goto fail;
        }
        if (jit)
            (void)pcre2_jit_compile(s->code, PCRE2_JIT_COMPLETE); /* else: the interpreter */
    }
    *out = rx;
    return 0;
fail:
    tok__pre_free(rx);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* splitting                                                                                */

struct split {
    const struct tok__pre_rx *rx;
    pcre2_match_data *md;
    const char *text;
    tok__piece_fn fn;
    void *arg;
    bool warned;
};

/* The spans a behavior is still deciding about at one level. */
struct pend {
    bool has, match, prev_match;
    size_t s, e;
};

static int run(struct split *c, uint32_t k, size_t s, size_t e);

/* A final piece of step k goes to step k + 1, or out. */
static int out_piece(struct split *c, uint32_t k, size_t s, size_t e)
{
    if (s == e)
        return 0;
    if (k + 1 == c->rx->n)
        return c->fn(c->arg, c->text + s, e - s);
    return run(c, k + 1, s, e);
}

static int flush(struct split *c, uint32_t k, struct pend *p)
{
    if (!p->has)
        return 0;
    p->has = false;
    return out_piece(c, k, p->s, p->e);
}

/* One span [s, e) of step k, a match or a gap (after invert), through the behavior. */
static int span(struct split *c, uint32_t k, struct pend *p, size_t s, size_t e, bool match)
{
    int rc = 0;
    switch ((enum tok_split)c->rx->steps[k].decl.behavior) {
    case TOK_SPLIT_ISOLATED:
        return out_piece(c, k, s, e);
    case TOK_SPLIT_REMOVED:
        return match ? 0 : out_piece(c, k, s, e);
    case TOK_SPLIT_MERGED_PREV:
        if (match && !p->prev_match && p->has) {
            p->e = e;
        } else {
            rc = flush(c, k, p);
            *p = (struct pend){true, match, p->prev_match, s, e};
        }
        p->prev_match = match;
        return rc;
    case TOK_SPLIT_MERGED_NEXT: /* a match joins the gap after it */
        if (p->has) {
            if (!match) {
                p->has = false;
                return out_piece(c, k, p->s, e);
            }
            rc = flush(c, k, p);
            *p = (struct pend){true, true, false, s, e};
            return rc;
        }
        if (match) {
            *p = (struct pend){true, true, false, s, e};
            return 0;
        }
        return out_piece(c, k, s, e);
    case TOK_SPLIT_CONTIGUOUS:
        if (p->has && match == p->match) {
            p->e = e;
            return 0;
        }
        rc = flush(c, k, p);
        *p = (struct pend){true, match, false, s, e};
        return rc;
    }
    return 0;
}

static size_t char_len(const char *p, size_t n)
{
    size_t l = tok__utf8_len((const unsigned char *)p, n);
    return l ? l : 1;
}

/* Step k over the piece [s, e). */
static int run(struct split *c, uint32_t k, size_t s, size_t e)
{
    const struct step *st = &c->rx->steps[k];
    bool inv = st->decl.invert;
    struct pend p = {0};
    const PCRE2_SPTR subj = (PCRE2_SPTR)(c->text + s);
    size_t n = e - s, pos = 0, gap = 0;
    int rc;
    while (pos <= n) {
        int m = pcre2_match(st->code, subj, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->rx->mctx);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its stack on the heap */
            m = pcre2_match(st->code, subj, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md,
                            c->rx->mctx);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        size_t ms, me;
        if (m < 0 && m != PCRE2_ERROR_NOMEMORY) {
            /* past a limit (or any other failure): the rest of the piece is one piece */
            if (!c->warned) {
                PCRE2_UCHAR msg[120];
                pcre2_get_error_message(m, msg, sizeof msg);
                LOG_WARN("pre-tokenizer step %u: %s at byte %zu; the rest of that piece "
                         "becomes one piece", k, (const char *)msg, s + pos);
                c->warned = true;
            }
            if (pos > gap && (rc = span(c, k, &p, s + gap, s + pos, inv)) != 0)
                return rc;
            if ((rc = flush(c, k, &p)) != 0)
                return rc;
            return out_piece(c, k, s + pos, e);
        } else if (m < 0) {
            return -ENOMEM;
        } else {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
            ms = ov[0];
            me = ov[1];
            if (me < ms) /* \K in a lookahead can report it: take nothing from such a match */
                me = ms;
        }
        if (ms > gap && (rc = span(c, k, &p, s + gap, s + ms, inv)) != 0)
            return rc;
        if ((rc = span(c, k, &p, s + ms, s + me, !inv)) != 0)
            return rc;
        gap = me;
        if (me > ms) {
            pos = me;
        } else { /* an empty match: search again one character further */
            if (ms >= n)
                break;
            pos = ms + char_len((const char *)subj + ms, n - ms);
        }
    }
    if (gap < n && (rc = span(c, k, &p, s + gap, e, inv)) != 0)
        return rc;
    return flush(c, k, &p);
}

int tok__pre_split(const struct tok__pre_rx *rx, const char *p, size_t n, tok__piece_fn fn,
                   void *arg)
{
    if (n == 0)
        return 0;
    struct split c = {.rx = rx, .text = p, .fn = fn, .arg = arg};
    /* the largest ovector any step needs */
    uint32_t pairs = 1;
    for (uint32_t i = 0; i < rx->n; i++) {
        uint32_t cap = 0;
        (void)pcre2_pattern_info(rx->steps[i].code, PCRE2_INFO_CAPTURECOUNT, &cap);
        pairs = cap + 1 > pairs ? cap + 1 : pairs;
    }
    if (!(c.md = pcre2_match_data_create(pairs, NULL)))
        return -ENOMEM;
    int rc = run(&c, 0, 0, n);
    pcre2_match_data_free(c.md);
    return rc;
}
