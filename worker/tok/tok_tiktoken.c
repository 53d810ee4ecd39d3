/*
 * tok_tiktoken.c — tiktoken rank files (*.tiktoken, as OpenAI publishes o200k_base and
 * cl100k_base): one token per line, its bytes in base64, a space, its rank in decimal.
 *
 * A rank file carries neither the pre-tokenizer regex nor the special tokens, so the encoding
 * is recognized by its number of ranks, the way tiktoken itself pairs them by name:
 *   199998 ranks: o200k_base, loaded as o200k_harmony (gpt-oss): the o200k regex (GGUF name
 *                 gpt-4o) and the harmony specials 199998..201087, reserved ids included;
 *   100256 ranks: cl100k_base: Llama 3's regex (the same pattern) and cl100k's specials
 *                 100257..100276 (the ids between them and 100256 are reserved).
 * Any other count is refused, naming the two. Ranks must be a permutation of 0..n-1 and
 * become the ids; tokens are spelled in GPT-2's byte-level characters so that everything else
 * (decoding, tokenizer.ie.json) treats them as any byte-level BPE vocabulary. Encoding is
 * tiktoken's: a pair's rank is the rank of its concatenated bytes (tok.ranked).
 */
#include "tok_internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define O200K_RANKS 199998u
#define O200K_HARMONY_VOCAB 201088u
#define CL100K_RANKS 100256u
#define CL100K_VOCAB 100277u

struct special {
    uint32_t id;
    const char *name;
};

/* o200k_harmony's named specials; every other id from 199998 up is <|reserved_ID|> */
static const struct special harmony_specials[] = {
    {199998, "<|startoftext|>"}, {199999, "<|endoftext|>"}, {200002, "<|return|>"},
    {200003, "<|constrain|>"},   {200005, "<|channel|>"},   {200006, "<|start|>"},
    {200007, "<|end|>"},         {200008, "<|message|>"},   {200012, "<|call|>"},
    {200018, "<|endofprompt|>"},
};

static const struct special cl100k_specials[] = {
    {100257, "<|endoftext|>"}, {100258, "<|fim_prefix|>"}, {100259, "<|fim_middle|>"},
    {100260, "<|fim_suffix|>"}, {100276, "<|endofprompt|>"},
};

/* RFC 4648 base64 with padding; the decoded length or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4 != 0)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            char c = s[i + j];
            int d;
            if (c >= 'A' && c <= 'Z')
                d = c - 'A';
            else if (c >= 'a' && c <= 'z')
                d = c - 'a' + 26;
            else if (c >= '0' && c <= '9')
                d = c - '0' + 52;
            else if (c == '+')
                d = 62;
            else if (c == '/')
                d = 63;
            else if (c == '=' && i + 4 == n && j >= 2)
                d = 0, pad++;
            else
                return -1;
            if (pad && c != '=')
                return -1; /* data after padding */
            v = v << 6 | (uint32_t)d;
        }
        out[o++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)v;
    }
    return (long)o;
}

int tok__load_tiktoken(const void *buf, size_t len, const char *what, struct tok **out)
{
    const char *p = buf;
    /* first pass: count the non-empty lines (tiktoken skips empty ones) */
    uint32_t n = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(p + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - p) : len;
        if (e > i) {
            if (n == TOK_MAX_VOCAB) {
                LOG_ERR("%s: more than %u ranks", what, TOK_MAX_VOCAB);
                return ERR_RANGE;
            }
            n++;
        }
        i = e + 1;
    }
    if (n == 0) {
        LOG_ERR("%s: no ranks: not a tiktoken rank file", what);
        return ERR_FORMAT;
    }
    /* second pass: every line parsed and checked, whatever the encoding turns out to be;
     * the spellings go to one buffer (<= 2 bytes per byte, 3 bytes per 4 base64 chars) with
     * room for the specials' names after them */
    size_t cap = 2 * len + (size_t)4096 * 24 + 16;
    char *spell = malloc(cap);
    unsigned char *raw = malloc(TOK_MAX_PIECE);
    uint32_t *off = malloc(n * sizeof *off), *slen = calloc(n, sizeof *slen);
    int rc = 0;
    if (!spell || !raw || !off || !slen) {
        LOG_ERR("%s: out of memory for %u ranks", what, n);
        rc = -ENOMEM;
        goto out;
    }
    size_t o = 0;
    uint32_t line = 0;
    for (size_t i = 0; i < len; line++) {
        const char *nl = memchr(p + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - p) : len;
        if (e == i) {
            i = e + 1;
            continue;
        }
        const char *sp1 = memchr(p + i, ' ', e - i);
        size_t b64_len = sp1 ? (size_t)(sp1 - (p + i)) : 0;
        long nb = -1;
        if (sp1 && b64_len <= (size_t)TOK_MAX_PIECE / 2 * 4 / 3)
            nb = b64_decode(p + i, b64_len, raw);
        if (nb <= 0) {
            LOG_ERR("%s: line %u: '%.*s' is not base64 token bytes (1..%u of them), a space "
                    "and a rank", what, line + 1, (int)(e - i > 48 ? 48 : e - i), p + i,
                    TOK_MAX_PIECE / 2);
            rc = ERR_FORMAT;
            goto out;
        }
        uint64_t rank = 0;
        const char *d = sp1 + 1;
        size_t nd = (size_t)(p + e - d);
        bool ok = nd >= 1 && nd <= 10;
        for (size_t j = 0; ok && j < nd; j++) {
            ok = d[j] >= '0' && d[j] <= '9';
            rank = rank * 10 + (uint64_t)(d[j] - '0');
        }
        if (!ok || rank >= n) {
            LOG_ERR("%s: line %u: rank '%.*s' is not an integer in 0..%u (the ranks of a file "
                    "of %u tokens)", what, line + 1, (int)(nd > 24 ? 24 : nd), d, n - 1, n);
            rc = ERR_FORMAT;
            goto out;
        }
        if (slen[rank]) {
            LOG_ERR("%s: line %u: rank %llu is given twice", what, line + 1,
                    (unsigned long long)rank);
            rc = ERR_FORMAT;
            goto out;
        }
        off[rank] = (uint32_t)o;
        for (long j = 0; j < nb; j++)
            o += tok__utf8_encode(tok__byte_to_cp(raw[j]), spell + o);
        slen[rank] = (uint32_t)(o - off[rank]);
        i = e + 1;
    }
    const struct special *sp;
    size_t n_sp;
    uint32_t vocab;
    const char *pre_name;
    if (n == O200K_RANKS) {
        sp = harmony_specials;
        n_sp = sizeof harmony_specials / sizeof harmony_specials[0];
        vocab = O200K_HARMONY_VOCAB;
        pre_name = "gpt-4o";
    } else if (n == CL100K_RANKS) {
        sp = cl100k_specials;
        n_sp = sizeof cl100k_specials / sizeof cl100k_specials[0];
        vocab = CL100K_VOCAB;
        pre_name = "llama-bpe";
    } else {
        LOG_ERR("%s: %u ranks: not a tiktoken encoding we know (o200k_base has %u, "
                "cl100k_base %u); its pre-tokenizer regex and special tokens would be unknown",
                what, n, O200K_RANKS, CL100K_RANKS);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    struct tok__spec s;
    if ((rc = tok__spec_init(&s, what, TOK_BPE, vocab)) != 0)
        goto out;
    for (uint32_t r = 0; r < n; r++) {
        s.piece[r] = spell + off[r];
        s.piece_len[r] = slen[r];
        s.type[r] = TOK_NORMAL;
    }
    /* the ids above the ranks: named specials, reserved names between them */
    for (uint32_t id = n; id < vocab; id++) {
        const char *name = NULL;
        for (size_t k = 0; k < n_sp; k++)
            if (sp[k].id == id)
                name = sp[k].name;
        s.piece[id] = spell + o;
        o += name ? (size_t)snprintf(spell + o, cap - o, "%s", name)
                  : (size_t)snprintf(spell + o, cap - o, "<|reserved_%u|>", id);
        s.piece_len[id] = (uint32_t)(spell + o - s.piece[id]);
        s.type[id] = TOK_CONTROL;
    }
    s.ranked = true;
    bool ign;
    (void)tok__pre_by_name(pre_name, strlen(pre_name), &s.pre, s.pre_steps, &s.n_pre, &ign);
    s.add_bos = false;
    if (n == O200K_RANKS) {
        s.bos = 199998; /* <|startoftext|> */
        s.eos = 200002; /* <|return|>: where a harmony answer ends */
    } else {
        s.bos = s.eos = 100257; /* <|endoftext|> */
    }
    rc = tok__build(&s, out);
    tok__spec_fini(&s);
out:
    free(spell);
    free(raw);
    free(off);
    free(slen);
    return rc;
}
