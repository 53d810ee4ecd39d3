/*
 * tok_load.c — tok_load / tok_load_mem: recognizing a tokenizer source, and the importers for
 * the binary ones: SentencePiece's tokenizer.model (protobuf, via protobuf-c), llama2.c's
 * tokenizer.bin, and GGUF metadata (tokenizer.ggml.*, tokenizer.ggml.pre through tok_pre.c's
 * table of llama.cpp's names). The JSON sources are read by tok_jscan.c (yajl) and imported by
 * tok_hfjson.c and tok_iejson.c,
 * tiktoken rank files in tok_tiktoken.c.
 *
 * Each importer only reads its format and describes the vocabulary in a struct tok__spec;
 * tok__build (tok.c) validates the whole vocabulary the same way for every source. Counts read
 * from a file are checked against the bytes that could hold them before anything is allocated.
 *
 * NOTES: nothing here keeps a reference to the input: a GGUF file is mapped only while it is
 * read, and tok_load_mem's buffer may be freed as soon as it returns.
 */
#include "tok_internal.h"

#include "err.h"
#include "gguf.h"
#include "fmap.h"
#include "log.h"
#include "sentencepiece/sentencepiece_model.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SPACE_MARK "\xE2\x96\x81" /* U+2581 */

bool tok__split_merge(const char *s, size_t len, const char **left, uint32_t *left_len,
                      const char **right, uint32_t *right_len)
{
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp || (size_t)(sp - s) + 1 >= len || len > 2 * (size_t)TOK_MAX_PIECE + 1)
        return false;
    *left = s;
    *left_len = (uint32_t)(sp - s);
    *right = sp + 1;
    *right_len = (uint32_t)(len - (size_t)(sp - s) - 1);
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* SentencePiece tokenizer.model                                                            */

static int load_spm_model(const void *buf, size_t len, const char *what, struct tok **out)
{
    Sentencepiece__ModelProto *m = sentencepiece__model_proto__unpack(NULL, len, buf);
    if (!m) {
        LOG_ERR("%s: not a SentencePiece model: the protobuf ModelProto does not parse "
                "(truncated or not a tokenizer.model)", what);
        return ERR_FORMAT;
    }
    struct tok__spec s;
    int rc = 0;
    bool spec_ok = false;
    const Sentencepiece__TrainerSpec *ts = m->trainer_spec;
    const Sentencepiece__NormalizerSpec *ns = m->normalizer_spec;
    if (!ts || ts->model_type != SENTENCEPIECE__TRAINER_SPEC__MODEL_TYPE__BPE) {
        int mt = ts ? (int)ts->model_type : SENTENCEPIECE__TRAINER_SPEC__MODEL_TYPE__UNIGRAM;
        static const char *const names[] = {"?", "unigram", "bpe", "word", "char"};
        LOG_ERR("%s: trainer_spec.model_type is %s (%d); only BPE models are supported",
                what, mt >= 1 && mt <= 4 ? names[mt] : "unknown", mt);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    if (ts->treat_whitespace_as_suffix) {
        LOG_ERR("%s: trainer_spec.treat_whitespace_as_suffix is not supported", what);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    if (ns && ns->has_precompiled_charsmap && ns->precompiled_charsmap.len > 0) {
        LOG_ERR("%s: normalizer_spec '%.64s' has compiled normalization rules; only the "
                "identity normalizer is supported", what, ns->name ? ns->name : "");
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    if (ns && !ns->escape_whitespaces) {
        LOG_ERR("%s: normalizer_spec.escape_whitespaces = false is not supported", what);
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    if (m->n_pieces > TOK_MAX_VOCAB) { /* protobuf-c allocated them already: bounded by len */
        LOG_ERR("%s: %zu pieces, more than the limit of %u", what, m->n_pieces, TOK_MAX_VOCAB);
        rc = ERR_RANGE;
        goto out;
    }
    if ((rc = tok__spec_init(&s, what, TOK_SPM, (uint32_t)m->n_pieces)) != 0)
        goto out;
    spec_ok = true;
    for (size_t i = 0; i < m->n_pieces; i++) {
        const Sentencepiece__ModelProto__SentencePiece *p = m->pieces[i];
        s.piece[i] = p->has_piece ? (const char *)p->piece.data : "";
        if (p->has_piece && p->piece.len > TOK_MAX_PIECE) {
            LOG_ERR("%s: piece %zu is %zu bytes long (limit %u)", what, i, p->piece.len,
                    TOK_MAX_PIECE);
            rc = ERR_RANGE;
            goto out;
        }
        s.piece_len[i] = p->has_piece ? (uint32_t)p->piece.len : 0;
        s.score[i] = p->score;
        int type = (int)p->type;
        if (type < TOK_NORMAL || type > TOK_BYTE) {
            LOG_ERR("%s: piece %zu: type %d is not a SentencePiece piece type (1..6)", what, i,
                    type);
            rc = ERR_FORMAT;
            goto out;
        }
        s.type[i] = (uint8_t)type;
    }
    /* SentencePiece takes the special ids from the trainer spec; <unk> must be one */
    int32_t unk = ts->unk_id;
    if (unk >= 0 && (size_t)unk < m->n_pieces && s.type[unk] != TOK_UNKNOWN) {
        LOG_ERR("%s: trainer_spec.unk_id %d is piece '%.*s', which is not of type UNKNOWN",
                what, unk, (int)(s.piece_len[unk] > 64 ? 64 : s.piece_len[unk]), s.piece[unk]);
        rc = ERR_FORMAT;
        goto out;
    }
    s.unk = unk;
    s.bos = ts->bos_id;
    s.eos = ts->eos_id;
    s.add_bos = true;
    s.add_dummy_prefix = ns ? ns->add_dummy_prefix : true;
    s.remove_extra_whitespaces = ns ? ns->remove_extra_whitespaces : true;
    s.byte_fallback = ts->byte_fallback;
    rc = tok__build(&s, out);
out:
    if (spec_ok)
        tok__spec_fini(&s);
    sentencepiece__model_proto__free_unpacked(m, NULL);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* llama2.c tokenizer.bin: int32 max_token_length, then per token float score, int32 length,
 * bytes. Spaces are stored as ' ' (llama2.c's exporter replaced U+2581) and BOS/EOS as
 * "\n<s>\n" / "\n</s>\n"; types are not stored.                                           */

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    int32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

static float rd_f32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}

static int load_llama2c_bin(const void *buf, size_t len, const char *what, struct tok **out)
{
    const unsigned char *p = buf;
    if (len < 4) {
        LOG_ERR("%s: %zu bytes, shorter than the 4-byte max_token_length header", what, len);
        return ERR_TRUNCATED;
    }
    int32_t max_len = rd_i32(p);
    if (max_len <= 0 || (uint32_t)max_len > TOK_MAX_PIECE) {
        LOG_ERR("%s: max_token_length is %d; expected 1..%u", what, max_len, TOK_MAX_PIECE);
        return ERR_FORMAT;
    }
    /* first pass: count and check every record */
    uint32_t n = 0;
    size_t off = 4, text_bytes = 0;
    while (off < len) {
        if (n == TOK_MAX_VOCAB) {
            LOG_ERR("%s: more than %u tokens", what, TOK_MAX_VOCAB);
            return ERR_RANGE;
        }
        if (len - off < 8) {
            LOG_ERR("%s: token %u: its 8-byte score and length run past the end of the file "
                    "(%zu bytes left)", what, n, len - off);
            return ERR_TRUNCATED;
        }
        int32_t l = rd_i32(p + off + 4);
        if (l < 0) {
            LOG_ERR("%s: token %u: negative length %d", what, n, l);
            return ERR_FORMAT;
        }
        if (l > max_len) {
            LOG_ERR("%s: token %u: length %d exceeds max_token_length %d", what, n, l, max_len);
            return ERR_FORMAT;
        }
        if ((size_t)l > len - off - 8) {
            LOG_ERR("%s: token %u: its %d bytes run past the end of the file (%zu bytes left)",
                    what, n, l, len - off - 8);
            return ERR_TRUNCATED;
        }
        off += 8 + (size_t)l;
        text_bytes += (size_t)l;
        n++;
    }
    if (n == 0) {
        LOG_ERR("%s: no tokens after the header", what);
        return ERR_FORMAT;
    }
    struct tok__spec s;
    int rc = tok__spec_init(&s, what, TOK_SPM, n);
    if (rc != 0)
        return rc;
    char *pieces = malloc(3 * text_bytes + 1); /* ' ' -> U+2581 triples the length at most */
    if (!pieces) {
        LOG_ERR("%s: out of memory", what);
        tok__spec_fini(&s);
        return -ENOMEM;
    }
    off = 4;
    size_t o = 0;
    bool any_byte = false;
    for (uint32_t i = 0; i < n; i++) {
        float score = rd_f32(p + off);
        uint32_t l = (uint32_t)rd_i32(p + off + 4);
        const char *src = (const char *)p + off + 8;
        off += 8 + l;
        if (i == 1 && l == 5 && memcmp(src, "\n<s>\n", 5) == 0) {
            src++;
            l -= 2;
        } else if (i == 2 && l == 6 && memcmp(src, "\n</s>\n", 6) == 0) {
            src++;
            l -= 2;
        }
        s.piece[i] = pieces + o;
        for (uint32_t j = 0; j < l; j++) {
            if (src[j] == ' ') {
                memcpy(pieces + o, SPACE_MARK, 3);
                o += 3;
            } else {
                pieces[o++] = src[j];
            }
        }
        s.piece_len[i] = (uint32_t)(pieces + o - s.piece[i]);
        s.score[i] = score;
        if (i == 0)
            s.type[i] = TOK_UNKNOWN;
        else if (i == 1 || i == 2)
            s.type[i] = TOK_CONTROL;
        else if (tok__parse_byte_piece(s.piece[i], s.piece_len[i]) >= 0)
            s.type[i] = TOK_BYTE, any_byte = true;
        else
            s.type[i] = TOK_NORMAL;
    }
    s.unk = 0;
    s.bos = n > 1 ? 1 : -1;
    s.eos = n > 2 ? 2 : -1;
    s.add_bos = true;
    s.add_dummy_prefix = true;
    s.remove_extra_whitespaces = false;
    s.byte_fallback = any_byte;
    rc = tok__build(&s, out);
    free(pieces);
    tok__spec_fini(&s);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* GGUF (tokenizer.ggml.*, as llama.cpp writes it)                                          */

static int gguf_opt_id(const struct gguf_file *f, const char *key, uint32_t n, int32_t *out)
{
    int64_t v;
    int rc = gguf_get_i64(f, key, &v);
    if (rc == ERR_NOT_FOUND)
        return 0; /* keeps the default */
    if (rc != 0)
        return rc;
    if (v < -1 || v >= (int64_t)n) {
        LOG_ERR("%s: %s = %lld is outside the vocabulary of %u tokens", f->what, key,
                (long long)v, n);
        return ERR_RANGE;
    }
    *out = (int32_t)v;
    return 0;
}

static int gguf_opt_bool(const struct gguf_file *f, const char *key, bool *out)
{
    int rc = gguf_get_bool(f, key, out);
    return rc == ERR_NOT_FOUND ? 0 : rc;
}

/* The array kv `key`, of arr_n == n elements when n != 0. NULL when absent (not logged). */
static int gguf_array(const struct gguf_file *f, const char *key, uint64_t n, bool required,
                      const struct gguf_kv **out)
{
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *out = NULL;
    if (!kv) {
        if (!required)
            return 0;
        LOG_ERR("%s: no tokenizer: key %s is missing", f->what, key);
        return ERR_NOT_FOUND;
    }
    if (kv->type != GGUF_TYPE_ARRAY) {
        LOG_ERR("%s: key %s is a %s, not an array", f->what, key, gguf_type_name(kv->type));
        return ERR_FORMAT;
    }
    if (n != 0 && kv->arr_n != n) {
        LOG_ERR("%s: key %s has %llu elements; tokenizer.ggml.tokens has %llu", f->what, key,
                (unsigned long long)kv->arr_n, (unsigned long long)n);
        return ERR_FORMAT;
    }
    *out = kv;
    return 0;
}

static int load_gguf_file(const struct gguf_file *f, struct tok **out)
{
    const char *what = f->what;
    struct gguf_str model;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (rc == ERR_NOT_FOUND) {
        LOG_ERR("%s: no tokenizer: key tokenizer.ggml.model is missing", what);
        return ERR_NOT_FOUND;
    }
    if (rc != 0)
        return rc;
    enum tok_kind kind;
    if (gguf_str_eq(model, "llama")) {
        kind = TOK_SPM;
    } else if (gguf_str_eq(model, "gpt2")) {
        kind = TOK_BPE;
    } else {
        LOG_ERR("%s: tokenizer.ggml.model '%.*s' is not supported (llama, gpt2)", what,
                (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return ERR_UNSUPPORTED;
    }
    const struct gguf_kv *toks, *scores, *types, *merges = NULL;
    if ((rc = gguf_array(f, "tokenizer.ggml.tokens", 0, true, &toks)) != 0)
        return rc;
    if (toks->arr_type != GGUF_TYPE_STRING) {
        LOG_ERR("%s: tokenizer.ggml.tokens is an array of %s, not of strings", what,
                gguf_type_name(toks->arr_type));
        return ERR_FORMAT;
    }
    if (toks->arr_n > TOK_MAX_VOCAB) {
        LOG_ERR("%s: tokenizer.ggml.tokens has %llu tokens, more than the limit of %u", what,
                (unsigned long long)toks->arr_n, TOK_MAX_VOCAB);
        return ERR_RANGE;
    }
    uint32_t n = (uint32_t)toks->arr_n;
    if (n == 0) {
        LOG_ERR("%s: tokenizer.ggml.tokens is empty", what);
        return ERR_FORMAT;
    }
    if ((rc = gguf_array(f, "tokenizer.ggml.scores", n, kind == TOK_SPM, &scores)) != 0 ||
        (rc = gguf_array(f, "tokenizer.ggml.token_type", n, false, &types)) != 0)
        return rc;
    if (kind == TOK_BPE && (rc = gguf_array(f, "tokenizer.ggml.merges", 0, true, &merges)) != 0)
        return rc;
    if (merges && merges->arr_type != GGUF_TYPE_STRING) {
        LOG_ERR("%s: tokenizer.ggml.merges is an array of %s, not of strings", what,
                gguf_type_name(merges->arr_type));
        return ERR_FORMAT;
    }
    if (merges && merges->arr_n > UINT32_MAX / 2) {
        LOG_ERR("%s: tokenizer.ggml.merges has too many elements", what);
        return ERR_RANGE;
    }

    struct tok__spec s;
    if ((rc = tok__spec_init(&s, what, kind, n)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        s.piece[i] = toks->strs[i].ptr;
        if (toks->strs[i].len > TOK_MAX_PIECE) {
            LOG_ERR("%s: tokenizer.ggml.tokens[%u] is %llu bytes long (limit %u)", what, i,
                    (unsigned long long)toks->strs[i].len, TOK_MAX_PIECE);
            rc = ERR_RANGE;
            goto out;
        }
        s.piece_len[i] = (uint32_t)toks->strs[i].len;
        if (scores) {
            double d;
            if ((rc = gguf_arr_f64(scores, i, &d)) != 0)
                goto out;
            if (!(d >= -FLT_MAX && d <= FLT_MAX)) {
                LOG_ERR("%s: tokenizer.ggml.scores[%u] = %g is not a finite float", what, i, d);
                rc = ERR_FORMAT;
                goto out;
            }
            s.score[i] = (float)d;
        }
        if (types) {
            int64_t v;
            if ((rc = gguf_arr_i64(types, i, &v)) != 0)
                goto out;
            /* llama.cpp's types are SentencePiece's, plus 0 = undefined (treated as normal) */
            if (v < 0 || v > TOK_BYTE) {
                LOG_ERR("%s: tokenizer.ggml.token_type[%u] = %lld is not a token type (0..6)",
                        what, i, (long long)v);
                rc = ERR_FORMAT;
                goto out;
            }
            s.type[i] = v == 0 ? TOK_NORMAL : (uint8_t)v;
        }
    }
    if ((rc = gguf_opt_id(f, "tokenizer.ggml.bos_token_id", n, &s.bos)) != 0 ||
        (rc = gguf_opt_id(f, "tokenizer.ggml.eos_token_id", n, &s.eos)) != 0 ||
        (rc = gguf_opt_id(f, "tokenizer.ggml.unknown_token_id", n, &s.unk)) != 0)
        goto out;
    if (!types) { /* infer what tokenizer.bin also lacks */
        for (uint32_t i = 0; i < n; i++)
            s.type[i] = (int32_t)i == s.unk                          ? TOK_UNKNOWN
                        : (int32_t)i == s.bos || (int32_t)i == s.eos ? TOK_CONTROL
                        : kind == TOK_SPM && tok__parse_byte_piece(s.piece[i], s.piece_len[i]) >= 0
                            ? TOK_BYTE
                            : TOK_NORMAL;
    }
    if (s.unk < 0)
        for (uint32_t i = 0; i < n && s.unk < 0; i++)
            if (s.type[i] == TOK_UNKNOWN)
                s.unk = (int32_t)i;
    s.add_bos = kind == TOK_SPM;
    if ((rc = gguf_opt_bool(f, "tokenizer.ggml.add_bos_token", &s.add_bos)) != 0)
        goto out;
    if (kind == TOK_SPM) {
        s.add_dummy_prefix = true;
        s.remove_extra_whitespaces = false;
        if ((rc = gguf_opt_bool(f, "tokenizer.ggml.add_space_prefix", &s.add_dummy_prefix)) ||
            (rc = gguf_opt_bool(f, "tokenizer.ggml.remove_extra_whitespaces",
                                &s.remove_extra_whitespaces)))
            goto out;
        for (uint32_t i = 0; i < n; i++) /* llama.cpp falls back to bytes when it has them */
            s.byte_fallback |= s.type[i] == TOK_BYTE;
    } else {
        /* the pre-tokenizer llama.cpp derives from the name (absent: GPT-2's, as before) */
        struct gguf_str pre;
        rc = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
        if (rc != 0 && rc != ERR_NOT_FOUND)
            goto out;
        s.pre = TOK_PRE_GPT2;
        if (rc == 0 && tok__pre_by_name(pre.ptr, (size_t)pre.len, &s.pre, s.pre_steps,
                                        &s.n_pre, &s.ignore_merges) != 0) {
            LOG_ERR("%s: tokenizer.ggml.pre '%.*s' is not a pre-tokenizer we know (known: %s)",
                    what, (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, tok__pre_known);
            rc = ERR_UNSUPPORTED;
            goto out;
        }
        s.n_merges = (uint32_t)merges->arr_n;
        size_t m = s.n_merges ? 2 * (size_t)s.n_merges : 1;
        s.merge_str = malloc(m * sizeof *s.merge_str);
        s.merge_str_len = malloc(m * sizeof *s.merge_str_len);
        if (!s.merge_str || !s.merge_str_len) {
            LOG_ERR("%s: out of memory for %u merges", what, s.n_merges);
            rc = -ENOMEM;
            goto out;
        }
        for (uint32_t r = 0; r < s.n_merges; r++) {
            const struct gguf_str *ms = &merges->strs[r];
            if (ms->len > 2 * (uint64_t)TOK_MAX_PIECE + 1 ||
                !tok__split_merge(ms->ptr, (size_t)ms->len, &s.merge_str[2 * r],
                                  &s.merge_str_len[2 * r], &s.merge_str[2 * r + 1],
                                  &s.merge_str_len[2 * r + 1])) {
                LOG_ERR("%s: tokenizer.ggml.merges[%u] '%.*s' is not two tokens separated by a "
                        "space", what, r, (int)(ms->len > 64 ? 64 : ms->len), ms->ptr);
                rc = ERR_FORMAT;
                goto out;
            }
        }
    }
    rc = tok__build(&s, out);
out:
    free((void *)s.merge_str);
    free(s.merge_str_len);
    tok__spec_fini(&s);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON and dispatch                                                                        */

static int load_json(const void *buf, size_t len, const char *what, int force_ie,
                     struct tok **out)
{
    struct tok__jdoc doc;
    int rc = tok__json_scan(buf, len, what, &doc);
    if (rc != 0)
        return rc;
    bool ie = force_ie < 0 ? tok__json_is_ie(doc.root) : force_ie;
    rc = ie ? tok__load_ie_json(&doc, what, out) : tok__load_hf_json(&doc, what, out);
    tok__jdoc_free(&doc);
    return rc;
}

static int load_mem(const void *buf, size_t len, const char *kind, const char *what,
                    struct tok **out)
{
    if (strcmp(kind, "gguf") == 0) {
        struct gguf_file *f;
        int rc = gguf_open_mem(buf, len, what, &f);
        if (rc != 0)
            return rc;
        rc = load_gguf_file(f, out);
        gguf_close(f);
        return rc;
    }
    if (len > TOK_MAX_FILE) {
        LOG_ERR("%s: %zu bytes, more than the %llu-byte limit for a tokenizer file", what, len,
                TOK_MAX_FILE);
        return ERR_RANGE;
    }
    if (strcmp(kind, "spm-model") == 0)
        return load_spm_model(buf, len, what, out);
    if (strcmp(kind, "llama2c-bin") == 0)
        return load_llama2c_bin(buf, len, what, out);
    if (strcmp(kind, "hf-json") == 0)
        return load_json(buf, len, what, 0, out);
    if (strcmp(kind, "ie-json") == 0)
        return load_json(buf, len, what, 1, out);
    if (strcmp(kind, "tiktoken") == 0)
        return tok__load_tiktoken(buf, len, what, out);
    LOG_ERR("%s: unknown tokenizer format '%s' (gguf, spm-model, hf-json, llama2c-bin, "
            "ie-json, tiktoken)", what, kind);
    return ERR_USAGE;
}

int tok_load_mem(const void *buf, size_t len, const char *kind_hint, struct tok **out)
{
    char what[48];
    *out = NULL;
    snprintf(what, sizeof what, "<memory:%s>", kind_hint);
    return load_mem(buf, len, kind_hint, what, out);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int tok_load(const char *path, struct tok **out)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        LOG_ERR("cannot open tokenizer %s: %s", path, strerror(e));
        return -e;
    }
    if (S_ISDIR(st.st_mode)) { /* an IEBIN model directory */
        char p[PATH_MAX];
        if ((size_t)snprintf(p, sizeof p, "%s/tokenizer.ie.json", path) >= sizeof p) {
            LOG_ERR("tokenizer path %s is too long", path);
            return -ENAMETOOLONG;
        }
        if (access(p, F_OK) != 0) {
            int e = errno;
            LOG_ERR("%s has no tokenizer.ie.json (%s): the model carries no tokenizer", path,
                    strerror(e));
            return -e;
        }
        char *buf;
        size_t len;
        int rc = fmap_read(p, "tokenizer", TOK_MAX_FILE, &buf, &len);
        if (rc != 0)
            return rc;
        rc = load_mem(buf, len, "ie-json", p, out);
        free(buf);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) { /* not even peeked at: a FIFO would block */
        LOG_ERR("tokenizer %s is not a regular file or a directory", path);
        return ERR_FORMAT;
    }
    /* GGUF files can be whole models: map them (gguf_open) rather than read them */
    char magic[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t r = read(fd, magic, sizeof magic);
        (void)r; /* a short file simply has no GGUF magic */
        close(fd);
    }
    if (memcmp(magic, "GGUF", 4) == 0) {
        struct gguf_file *f;
        int rc = gguf_open(path, &f);
        if (rc != 0)
            return rc;
        rc = load_gguf_file(f, out);
        gguf_close(f);
        return rc;
    }
    char *buf;
    size_t len;
    int rc = fmap_read(path, "tokenizer", TOK_MAX_FILE, &buf, &len);
    if (rc != 0)
        return rc;
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r'))
        i++;
    const char *kind;
    if (i < len && buf[i] == '{')
        kind = "json"; /* ie or Hugging Face: the document says which */
    else if (ends_with(path, ".bin"))
        kind = "llama2c-bin";
    else if (ends_with(path, ".tiktoken"))
        kind = "tiktoken";
    else if (ends_with(path, ".model") || (len > 0 && buf[0] == 0x0A))
        kind = "spm-model"; /* 0x0A: ModelProto's first field, the pieces */
    else
        kind = NULL;
    if (!kind) {
        LOG_ERR("%s: cannot tell the tokenizer format (expected a .gguf, tokenizer.model, "
                "tokenizer.json, tokenizer.bin, a .tiktoken rank file or an IEBIN model directory)",
                path);
        rc = ERR_UNSUPPORTED;
    } else if (strcmp(kind, "json") == 0) {
        rc = load_json(buf, len, path, -1, out);
    } else {
        rc = load_mem(buf, len, kind, path, out);
    }
    free(buf);
    return rc;
}
