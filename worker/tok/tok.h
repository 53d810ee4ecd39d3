/*
 * tok.h — tokenizers: SentencePiece BPE (Llama 2 / TinyLlama) and byte-level BPE (GPT-2
 * family, the base of Llama 3 / Qwen / GPT-OSS), loaded from any file that carries them.
 *
 * tok_load() detects the source from the path: an IEBIN model directory (its
 * tokenizer.ie.json), a .gguf file (tokenizer.ggml.* metadata), a SentencePiece
 * tokenizer.model (protobuf), a Hugging Face tokenizer.json, a tiktoken rank file (*.tiktoken:
 * o200k_base becomes o200k_harmony, cl100k_base gets its specials; docs/TOKENIZER.md), or a
 * llama2.c tokenizer.bin.
 * tok_save_json() writes the documented tokenizer.ie.json form (docs/TOKENIZER.md) that IEBIN
 * models carry, so every source converges on one representation.
 *
 * Every source is untrusted: a vocabulary is validated as a whole when loaded (types, UTF-8,
 * duplicates, ids, merges) so that encoding and decoding cannot fail on it later, except for
 * invalid UTF-8 text and out-of-range ids. Algorithms, formats and limits: docs/TOKENIZER.md.
 *
 * NOTES: a struct tok is immutable after loading and may be shared by threads; a struct
 * tok_stream belongs to one sequence.
 */
#ifndef CLOCHER_WORKER_TOK_H
#define CLOCHER_WORKER_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tok_kind { TOK_SPM = 1, TOK_BPE = 2 };

/* Token types; the values are SentencePiece's (and GGUF's tokenizer.ggml.token_type). */
enum tok_type {
    TOK_NORMAL = 1,       /* ordinary piece, produced by the merges */
    TOK_UNKNOWN = 2,      /* <unk>: stands for text the vocabulary cannot spell */
    TOK_CONTROL = 3,      /* <s>, </s>, <|endoftext|>: never produced from text, decode to "" */
    TOK_USER_DEFINED = 4, /* always one token where its text appears (matched before merging) */
    TOK_UNUSED = 5,       /* SPM: never output; split back into the pieces it was merged from */
    TOK_BYTE = 6,         /* <0xNN>: one raw byte (SPM byte fallback) */
};

#define TOK_MAX_VOCAB (1u << 24)        /* tokens in a vocabulary */
#define TOK_MAX_PIECE 65535u            /* bytes of one vocabulary string */
#define TOK_MAX_FILE (512ull << 20)     /* tokenizer.json / .model / .bin / .ie.json size */
#define TOK_MAX_TEXT (256u << 20)       /* bytes of text in one tok_encode call */

struct tok;

int tok_load(const char *path, struct tok **out);
/* Same, from bytes already in memory; `kind_hint` names the format: "gguf", "spm-model",
 * "hf-json", "llama2c-bin", "ie-json" (fuzzers and tests). The bytes are not kept. */
int tok_load_mem(const void *buf, size_t len, const char *kind_hint, struct tok **out);
/* (kind_hint "tiktoken": a tiktoken rank file; tok_load takes a path ending in .tiktoken.) */
void tok_free(struct tok *t);

enum tok_kind tok_kind(const struct tok *t);
uint32_t tok_vocab_size(const struct tok *t);
int32_t tok_bos(const struct tok *t); /* -1 when the vocabulary has none */
int32_t tok_eos(const struct tok *t);
int32_t tok_unk(const struct tok *t);
/* Whether the source asks for BOS before a prompt (Llama: yes; GPT-2: no). */
bool tok_add_bos(const struct tok *t);
/* The type of a token; 0 for an id outside the vocabulary. */
enum tok_type tok_token_type(const struct tok *t, int32_t id);
/* The vocabulary string of a token as the source spells it ("▁the", "Ġthe", "<s>",
 * "<0x0A>"), NUL-terminated, valid UTF-8; NULL for an id outside the vocabulary. */
const char *tok_token_str(const struct tok *t, int32_t id);

/* Encodes len bytes of UTF-8 text (invalid UTF-8 is ERR_FORMAT). *ids is malloc'd (possibly
 * with *n_ids == 0). Text never produces control tokens; add_bos prepends tok_bos() if any. */
int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, int32_t **ids,
               size_t *n_ids);
/* tok_encode with flags: TOK_ENC_BOS prepends tok_bos() if any; TOK_ENC_SPECIAL lets text
 * spell control tokens ("<|start|>", "<|endoftext|>"): each occurrence, longest first, becomes
 * that token and the text between is encoded as without the flag. Without it, such text is
 * ordinary text (the safe default for untrusted input). */
#define TOK_ENC_BOS 1u
#define TOK_ENC_SPECIAL 2u
int tok_encode_ex(const struct tok *t, const char *text, size_t len, unsigned flags,
                  int32_t **ids, size_t *n_ids);
/* The id of the token whose vocabulary string is str[0..len) ("<|start|>", "Ġthe"), or -1. */
int32_t tok_token_id(const struct tok *t, const char *str, size_t len);

/* Decodes a whole sequence to a malloc'd NUL-terminated string (leading-space rule of SPM
 * applied once at the start, as SentencePiece does). Bytes that do not form valid UTF-8
 * become U+FFFD, so the result is always valid UTF-8. ERR_RANGE (logged) for a bad id. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n_ids, char **text, size_t *len);
/* tok_decode with flags: TOK_DEC_SPECIAL spells control tokens as their strings
 * ("<|start|>"), so what tok_encode_ex(TOK_ENC_SPECIAL) read comes back; without it they
 * decode to nothing. */
#define TOK_DEC_SPECIAL 1u
int tok_decode_ex(const struct tok *t, const int32_t *ids, size_t n_ids, unsigned flags,
                  char **text, size_t *len);
/* The bytes one token contributes to decoded text, before UTF-8 assembly and without the
 * leading-space rule: byte tokens <0xNN> give one byte, control tokens none, SPM's <unk>
 * " \u2047 ". Not NUL-terminated. ERR_RANGE for a bad id (not logged). */
int tok_piece(const struct tok *t, int32_t id, const char **bytes, size_t *len);

/* Streaming decode: feed ids one at a time, receive only complete UTF-8 characters.
 * Set at_start = false after tok_stream_init when the ids continue earlier text (tokens
 * generated after a prompt), so a leading space is kept. */
struct tok_stream {
    const struct tok *tok;
    bool at_start;   /* nothing decoded yet: SPM drops a first "▁" (the dummy prefix) */
    uint8_t pend[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t n_pend;
};
void tok_stream_init(struct tok_stream *s, const struct tok *t);
/* The largest output of one tok_stream_push or tok_stream_flush for this vocabulary: an
 * out buffer of this size never gives ERR_RANGE. */
size_t tok_stream_max_out(const struct tok *t);
/* Appends up to cap bytes of newly completed text to out; *n_out = bytes written.
 * ERR_RANGE (logged) for a bad id or when cap is too small; the stream is then unchanged. */
int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out);
/* Emits what is pending at the end of a sequence (an incomplete tail becomes U+FFFD) and
 * resets the stream for a new sequence. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out);

/* A byte-level BPE's merges as token-id pairs (left, right) in rank order, malloc'd in
 * *pairs [2 * *n]: the stored list, or for a ranked (tiktoken) vocabulary the list
 * transformers' converter derives (every split of each token into two normal tokens, by the
 * merged token's id, then the left's, then the right's), which encodes the same. For writers
 * of GGUF or tokenizer.json. SentencePiece: *n = 0. 0 or -ENOMEM (logged). */
int tok_merges(const struct tok *t, int32_t **pairs, size_t *n);

/* tokenizer.ie.json bytes (malloc'd, NUL-terminated; *len excludes the NUL). */
int tok_save_json(const struct tok *t, char **json, size_t *len);

#endif
