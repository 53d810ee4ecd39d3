/*
 * tok_internal.h — private to the tokenizer module (worker/tok*.c): the loaded vocabulary,
 * the builder every importer feeds, and the helpers the files share. Not a folder-wide
 * header: nothing outside tok*.c includes it (hence the tok__ prefix rather than worker__).
 *
 * How the files divide the work:
 *   tok.c         builder and validation, lookups, accessors, decoding and streaming
 *   tok_spm.c     SentencePiece BPE encoding (merges by piece score)
 *   tok_bpe.c     byte-level BPE encoding (GPT-2 pre-tokenizer, merges by rank)
 *   tok_unicode.c UTF-8 and the Unicode classes of the pre-tokenizer
 *   tok_pre.c     the regex pre-tokenizers (PCRE2): compiled steps, splitting, GGUF names
 *   tok_tiktoken.c tiktoken rank files (*.tiktoken) and the specials of known encodings
 *   tok_load.c    tok_load/tok_load_mem dispatch; tokenizer.model, tokenizer.bin, GGUF
 *   tok_norm.c    tokenizer.json normalizers (utf8proc), applied before a byte-level BPE
 *   tok_hfjson.c  Hugging Face tokenizer.json
 *   tok_iejson.c  tokenizer.ie.json (load and save)
 */
#ifndef CLOCHER_WORKER_TOK_INTERNAL_H
#define CLOCHER_WORKER_TOK_INTERNAL_H

#include "tok.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The pre-tokenizer of a byte-level BPE vocabulary: GPT-2's regex written by hand
 * (tok_bpe.c), or a sequence of regex split steps run by PCRE2 (tok_pre.c). */
enum tok_pre { TOK_PRE_NONE = 0, TOK_PRE_GPT2 = 1, TOK_PRE_REGEX = 2 };

/* What a split step does with the pieces its regex matches (Hugging Face's
 * SplitDelimiterBehavior); the values are stored nowhere, the names are. */
enum tok_split {
    TOK_SPLIT_ISOLATED = 0,    /* matches and the gaps between them are pieces */
    TOK_SPLIT_REMOVED,         /* gaps are pieces, matches dropped */
    TOK_SPLIT_MERGED_PREV,     /* a match joins the piece before it */
    TOK_SPLIT_MERGED_NEXT,     /* a match joins the piece after it */
    TOK_SPLIT_CONTIGUOUS,      /* consecutive matches form one piece */
};
#define TOK_PRE_MAX_STEPS 16
#define TOK_PRE_MAX_PATTERN 8192u /* bytes of one pattern */

/* One split step as a source declares it (borrowed strings). */
struct tok__pre_step {
    const char *pattern;  /* PCRE2 syntax (UTF, UCP); a literal string when literal */
    uint32_t pattern_len;
    uint8_t behavior;     /* enum tok_split */
    bool invert;          /* the pattern describes the pieces, not the delimiters */
    bool literal;
};
struct tok__pre_rx; /* compiled steps (tok_pre.c) */

/* How an added token (tokenizer.json added_tokens) matches in text, as Hugging Face's
 * AddedToken: lstrip/rstrip take the white space before/after it into the match (it
 * disappears), single_word matches only between non-word characters; a user-defined token
 * marked normalized: false (RAW) is matched in the text as written, before a byte-level BPE's
 * normalizer runs, the others in the normalized text. */
enum tok_added_flag {
    TOK_ADDED_LSTRIP = 1,
    TOK_ADDED_RSTRIP = 2,
    TOK_ADDED_SINGLE_WORD = 4,
    TOK_ADDED_RAW = 8
};

struct tok__token {
    uint32_t str_off;  /* vocabulary string in tok.strs, NUL-terminated */
    uint32_t str_len;
    uint32_t text_off; /* decoded bytes in tok.text (what tok_piece returns) */
    uint32_t text_len;
    float score;       /* SPM merge priority of this piece (higher merges first) */
    uint8_t type;      /* enum tok_type */
    uint8_t added;     /* user-defined and control tokens: enum tok_added_flag bits */
};

/* A byte-level BPE merge, in rank order: left + right -> result (ids). */
struct tok__merge {
    int32_t left, right, result;
};

/* One slot of the pair -> rank hash: key and rank side by side, so a probe (every merge at
 * load, every candidate pair at encode) touches one cache line. */
struct tok__merge_slot {
    uint64_t key;  /* (left << 32 | right) + 1, 0 = empty */
    uint32_t rank;
};

/* Longest-match of user-defined pieces: a byte trie whose edges live in one hash table. */
struct tok__trie {
    uint64_t *keys;    /* (parent node << 8 | byte) + 1; 0 = empty */
    uint32_t *child;   /* node reached by the edge */
    uint64_t mask;     /* table capacity - 1 */
    int32_t *node_id;  /* [n_nodes] token ending at the node, -1 for none */
    uint32_t n_nodes;
};

struct tok {
    enum tok_kind kind;
    uint32_t n;                /* vocabulary size */
    struct tok__token *tokens; /* [n] */
    char *strs;                /* vocabulary strings back to back, each NUL-terminated */
    char *text;                /* decoded bytes back to back */
    uint32_t *piece_slots;     /* string -> id hash: id + 1, 0 = empty; [piece_mask + 1] */
    uint64_t piece_mask;
    int32_t bos, eos, unk;     /* -1 = none */
    bool add_bos;
    size_t max_text;           /* longest decoded token, bytes */
    uint32_t max_str;          /* longest vocabulary string, bytes */

    /* SPM */
    bool add_dummy_prefix, remove_extra_whitespaces, byte_fallback;
    int32_t byte_id[256];      /* the <0xNN> token of each byte, -1 if absent */

    /* byte-level BPE */
    enum tok_pre pre;
    struct tok__pre_rx *rx;    /* TOK_PRE_REGEX: the compiled steps */
    bool ignore_merges;        /* a pre-token that is itself a token is not merged */
    bool ranked;               /* tiktoken: a pair's rank is the id of its concatenation */
    uint32_t n_merges;
    struct tok__merge *merges; /* [n_merges] by rank */
    struct tok__merge_slot *merge_slots; /* pair -> rank hash; [merge_mask + 1] */
    uint64_t merge_mask;
    int32_t byte_char_id[256]; /* the token spelling each byte (one byte-level character) */

    struct tok__norm *norm;    /* byte-level BPE: the normalizer applied before splitting */

    struct tok__trie user;     /* user-defined tokens matched in normalized text, when any */
    struct tok__trie user_raw; /* user-defined tokens matched before the normalizer (RAW; only
                                  when there is a normalizer, else all are in user) */
    struct tok__trie special;  /* control tokens, matched in text only when asked */
};

/*
 * What an importer hands to tok__build: borrowed arrays describing the vocabulary. Pieces need
 * not be NUL-terminated; the builder copies what it keeps and validates everything.
 * Merges (byte-level BPE only) come either as strings (merge_str: left and right piece) or as
 * ids (merge_ids), in rank order.
 */
struct tok__spec {
    const char *what;      /* the source, for messages */
    enum tok_kind kind;
    uint32_t n;
    const char **piece;    /* [n] */
    uint32_t *piece_len;   /* [n] */
    float *score;          /* [n], SPM */
    uint8_t *type;         /* [n] enum tok_type */
    int32_t bos, eos, unk; /* -1 = none */
    bool add_bos;
    bool add_dummy_prefix, remove_extra_whitespaces, byte_fallback; /* SPM */
    enum tok_pre pre;      /* BPE */
    uint32_t n_pre;        /* TOK_PRE_REGEX: the steps, applied in order */
    struct tok__pre_step pre_steps[TOK_PRE_MAX_STEPS];
    bool ignore_merges;
    bool ranked;           /* no merges: ranks are ids (tiktoken); see tok.ranked */
    uint32_t n_merges;
    const char **merge_str;    /* [2 * n_merges]: left, right */
    uint32_t *merge_str_len;   /* [2 * n_merges] */
    const int32_t *merge_ids;  /* [2 * n_merges]: left, right */
    uint8_t *added;            /* [n] enum tok_added_flag bits, or NULL (none) */
    const json_t *normalizer;  /* BPE: Hugging Face normalizer JSON (tok_norm.c), or NULL */
};

/* Allocates the per-token arrays of a spec (piece, piece_len, score, type; zeroed) and sets
 * defaults (no special ids). 0 or -ENOMEM (logged). */
int tok__spec_init(struct tok__spec *s, const char *what, enum tok_kind kind, uint32_t n);
void tok__spec_fini(struct tok__spec *s);
/* Validates a spec and builds the tokenizer. ERR_FORMAT / ERR_RANGE / -ENOMEM, logged naming
 * the source, the token or merge and the fault. */
int tok__build(const struct tok__spec *s, struct tok **out);

/* The hash of a byte string the tokenizer's tables use (FNV-1a, mixed). */
uint64_t tok__hash_bytes(const char *p, size_t n);
/* The id of a vocabulary string, or -1. */
int32_t tok__find(const struct tok *t, const char *p, size_t len);
/* The rank of merge (left, right), or -1. */
int64_t tok__merge_rank(const struct tok *t, int32_t left, int32_t right);
/* Longest user-defined token that prefixes p[0..len): its id and byte length, or -1. */
int32_t tok__match_user(const struct tok *t, const char *p, size_t len, size_t *match_len);
/* Same over the control tokens (tok_encode_ex's TOK_ENC_SPECIAL). */
int32_t tok__match_special(const struct tok *t, const char *p, size_t len, size_t *match_len);
/* The token whose string is a's followed by b's, or -1 (tiktoken's pair lookup). */
int32_t tok__find_cat(const struct tok *t, int32_t a, int32_t b);

/* Names of enum tok_type in documents ("normal", ...); NULL for an invalid value. */
const char *tok__type_name(int type);
int tok__type_from_name(const char *name); /* 0 when unknown */
/* Parses "<0xNN>" (two upper-case hex digits, as SentencePiece writes them); the byte or -1. */
int tok__parse_byte_piece(const char *p, size_t len);

/* ---- large arrays of the load path (tok_mem.c): zeroed, on transparent huge pages ---- */
void *tok__big_alloc(size_t n);                          /* NULL when out of memory */
void *tok__big_realloc(void *p, size_t old_n, size_t n); /* NULL (p kept) when out of memory */
void tok__big_free(void *p);

/* ---- the JSON reader of tokenizer.json / tokenizer.ie.json (tok_jscan.c, yajl) ---- */
#define TOK_JSON_MAX_DEPTH 512
enum tok__jtype { TOK_JT_NULL, TOK_JT_BOOL, TOK_JT_INT, TOK_JT_REAL, TOK_JT_STRING,
                  TOK_JT_ARRAY, TOK_JT_OBJECT };
/* One value of a bulk: a scalar, or only the type of a container. */
struct tok__jval {
    uint8_t type;       /* enum tok__jtype */
    uint32_t len;       /* string: bytes */
    union {
        uint64_t off;   /* string: offset of its bytes (NUL-terminated) in the arena */
        int64_t i;      /* integer; boolean 0/1 */
        double d;       /* real */
    } u;
};
/* One element of a bulk array, or member of a bulk object. */
struct tok__jelem {
    struct tok__jval v;      /* the element */
    struct tok__jval sub[2]; /* an array element's first two elements (deeper: type only) */
    uint32_t n_sub;          /* an array or object element: how many elements it has */
    uint32_t key_len;        /* a bulk object's member: its key, in the arena */
    uint64_t key_off;
};
/* The large containers a loader walks in order, captured flat instead of as jansson trees. */
enum tok__jbulk_id {
    TOK_JB_HF_VOCAB,   /* tokenizer.json model.vocab */
    TOK_JB_HF_MERGES,  /* tokenizer.json model.merges */
    TOK_JB_IE_TOKENS,  /* tokenizer.ie.json tokens, types, scores, merges */
    TOK_JB_IE_TYPES,
    TOK_JB_IE_SCORES,
    TOK_JB_IE_MERGES,
    TOK_JB_COUNT
};
struct tok__jbulk {
    bool present;            /* the key was in the document */
    struct tok__jval v;      /* its value: TOK_JT_ARRAY / TOK_JT_OBJECT, or a scalar */
    size_t n;                /* elements (array) or members (object) */
    struct tok__jelem *e;    /* [n] */
};
struct tok__jdoc {
    json_t *root;            /* the document without its bulks (an object) */
    char *arena;             /* the bulks' strings */
    size_t arena_len, arena_cap;
    struct tok__jbulk bulk[TOK_JB_COUNT];
};
/* Parses a tokenizer JSON document: strict JSON, an object at the top, valid UTF-8, no NUL in
 * strings, no duplicate keys, nesting <= TOK_JSON_MAX_DEPTH. ERR_FORMAT / ERR_RANGE / -ENOMEM,
 * logged naming what and where (line, column). On failure *doc is empty. */
int tok__json_scan(const char *buf, size_t len, const char *what, struct tok__jdoc *doc);
void tok__jdoc_free(struct tok__jdoc *doc);
/* A bulk's string bytes. */
static inline const char *tok__jstr(const struct tok__jdoc *d, const struct tok__jval *v)
{
    return d->arena + v->u.off;
}
/* jfield_type's words for a value ("an array", ...; "missing" for a bulk not present). */
const char *tok__jtype_name(const struct tok__jbulk *b, const struct tok__jval *v);

/* ---- importers (tok_load.c, tok_hfjson.c, tok_iejson.c) ---- */
/* The document's kind: tokenizer.ie.json when its "format" says so, else Hugging Face's. */
bool tok__json_is_ie(const json_t *root);
int tok__load_hf_json(const struct tok__jdoc *doc, const char *what, struct tok **out);
int tok__load_ie_json(const struct tok__jdoc *doc, const char *what, struct tok **out);
/* Splits a merge written "left right" at its first space after the first byte; false when
 * there is none or a side is empty. */
bool tok__split_merge(const char *s, size_t len, const char **left, uint32_t *left_len,
                      const char **right, uint32_t *right_len);

/* ---- regex pre-tokenizers (tok_pre.c) ---- */
/* Compiles the steps (UTF, UCP, JIT when available), copying the patterns. ERR_FORMAT naming
 * the step and the offset of a pattern PCRE2 refuses; -ENOMEM. Logged. */
int tok__pre_compile(const char *what, const struct tok__pre_step *steps, uint32_t n,
                     struct tok__pre_rx **out);
void tok__pre_free(struct tok__pre_rx *rx);
/* The steps of a compiled pre-tokenizer (patterns NUL-terminated, owned by rx). */
uint32_t tok__pre_steps(const struct tok__pre_rx *rx, const struct tok__pre_step **steps);
/* Receives each pre-token of a split, in order; non-zero stops the split with that code. */
typedef int (*tok__piece_fn)(void *arg, const char *p, size_t n);
/* Splits valid UTF-8 text into pre-tokens. A match that exceeds PCRE2's limits makes its
 * first character a piece (warned once per call), so hostile text costs bounded time and
 * still encodes. 0, -ENOMEM, or fn's code. */
int tok__pre_split(const struct tok__pre_rx *rx, const char *p, size_t n, tok__piece_fn fn,
                   void *arg);
/* The pre-tokenizer of a GGUF tokenizer.ggml.pre name, as llama.cpp maps it: *kind =
 * TOK_PRE_GPT2 (hand-written) or TOK_PRE_REGEX with *n steps written to steps (static
 * patterns), and whether llama.cpp ignores merges for it. ERR_UNSUPPORTED (not logged) for a
 * name not in the table. */
int tok__pre_by_name(const char *name, size_t len, enum tok_pre *kind,
                     struct tok__pre_step *steps, uint32_t *n, bool *ignore_merges);
/* The GGUF names tok__pre_by_name knows, for messages. */
extern const char tok__pre_known[];
/* Names of enum tok_split ("isolated", ...) as tokenizer.ie.json and tokenizer.json spell
 * them (json: Hugging Face's "Isolated", ...); -1 / NULL when unknown. */
int tok__split_from_name(const char *name, bool hf);
const char *tok__split_name(int behavior, bool hf);
/* GPT-2's pattern (ByteLevel's use_regex), for a regex step list. */
extern const char tok__gpt2_pattern[];

/* ---- normalizers (tok_norm.c, utf8proc) ---- */
#define TOK_NORM_MAX_STEPS 16
struct tok__norm;
/* Compiles a Hugging Face normalizer object (a type or a Sequence of them), keeping a copy of
 * it. ERR_FORMAT (malformed), ERR_UNSUPPORTED (a type not implemented, named), ERR_RANGE,
 * -ENOMEM; logged naming the normalizer. */
int tok__norm_parse(const char *what, const json_t *hf, struct tok__norm **out);
void tok__norm_free(struct tok__norm *nm);
/* The JSON it was compiled from (owned by nm). */
const json_t *tok__norm_json(const struct tok__norm *nm);
/* Normalizes valid UTF-8 p[0..n) into a new malloc'd buffer (valid UTF-8; a valid pointer
 * even when empty). 0 or -ENOMEM (not logged). */
int tok__norm_apply(const struct tok__norm *nm, const char *p, size_t n, char **out,
                    size_t *out_len);
/* Bytes of White_Space at the end / start of valid UTF-8 p[0..n) (lstrip/rstrip, Strip). */
size_t tok__trailing_space(const char *p, size_t n);
size_t tok__leading_space(const char *p, size_t n);

struct tok__ids;
/* Cuts the added tokens of trie tr (t->special, t->user or t->user_raw) out of valid
 * UTF-8 text, longest match first, honouring their lstrip/rstrip/single_word: seg_fn gets
 * the text between them (possibly empty), each token's id is pushed to out. 0, -ENOMEM or
 * seg_fn's code. */
int tok__cut_added(const struct tok *t, const struct tok__trie *tr, const char *text, size_t len,
                   tok__piece_fn seg_fn, void *arg, struct tok__ids *out);

/* ---- tiktoken rank files (tok_tiktoken.c) ---- */
int tok__load_tiktoken(const void *buf, size_t len, const char *what, struct tok **out);

/* ---- growable id array used by the encoders ---- */
struct tok__ids {
    int32_t *v;
    size_t n, cap;
};
int tok__ids_push(struct tok__ids *a, int32_t id); /* 0 or -ENOMEM (not logged) */

/* Encoders: append the ids of already validated UTF-8 text. 0 or -ENOMEM (not logged). */
int tok__spm_encode(const struct tok *t, const char *text, size_t len, struct tok__ids *out);
int tok__bpe_encode(const struct tok *t, const char *text, size_t len, struct tok__ids *out);
/* GPT-2 pre-tokenizer: the end of the pre-token starting at i (< n) of valid UTF-8 p. */
size_t tok__gpt2_next(const unsigned char *p, size_t n, size_t i);

/* ---- UTF-8 and Unicode (tok_unicode.c) ---- */
/* Length of the valid UTF-8 sequence at p (1..4), or 0 if p[0..n) does not start with one
 * (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
size_t tok__utf8_len(const unsigned char *p, size_t n);
/* Offset of the first invalid byte of p[0..n), or n when all is valid UTF-8. */
size_t tok__utf8_check(const char *p, size_t n);
/* Decodes the valid sequence of length len at p. */
uint32_t tok__utf8_decode(const unsigned char *p, size_t len);
/* Encodes cp (<= 0x10FFFF, not a surrogate) into out[4]; returns the length. */
size_t tok__utf8_encode(uint32_t cp, char *out);
bool tok__is_letter(uint32_t cp);     /* \p{L} */
bool tok__is_number(uint32_t cp);     /* \p{N} */
bool tok__is_space(uint32_t cp);      /* \s: the Unicode White_Space property */

/* GPT-2's byte <-> character mapping of byte-level BPE. */
uint32_t tok__byte_to_cp(uint8_t b);
int tok__cp_to_byte(uint32_t cp);     /* -1 outside the 256 characters */

#endif
