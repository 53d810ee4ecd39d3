/*
 * tok.h — tokenizers: SentencePiece BPE (Llama 2 / TinyLlama) and byte-level BPE (GPT-2
 * family, the base of Llama 3 / Qwen / GPT-OSS), loaded from any file that carries them.
 *
 * tok_load() detects the source from the path: an IEBIN model directory (its
 * tokenizer.ie.json), a .gguf file (tokenizer.ggml.* metadata), a SentencePiece
 * tokenizer.model (protobuf), a Hugging Face tokenizer.json, or a llama2.c tokenizer.bin.
 * tok_save_json() writes the documented tokenizer.ie.json form (docs/IEBIN.md) that IEBIN
 * models carry, so every source converges on one representation.
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

struct tok;

int tok_load(const char *path, struct tok **out);
/* Same, from bytes already in memory; `kind_hint` names the format: "gguf", "spm-model",
 * "hf-json", "llama2c-bin", "ie-json" (fuzzers and tests). */
int tok_load_mem(const void *buf, size_t len, const char *kind_hint, struct tok **out);
void tok_free(struct tok *t);

enum tok_kind tok_kind(const struct tok *t);
uint32_t tok_vocab_size(const struct tok *t);
int32_t tok_bos(const struct tok *t); /* -1 when the vocabulary has none */
int32_t tok_eos(const struct tok *t);

/* Encodes len bytes of UTF-8 text (invalid UTF-8 is ERR_FORMAT). *ids is malloc'd. */
int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, int32_t **ids,
               size_t *n_ids);
/* Decodes a whole sequence to a malloc'd NUL-terminated string (leading-space rule of SPM
 * applied once at the start, as SentencePiece does). */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n_ids, char **text, size_t *len);
/* The raw bytes of one token (byte tokens <0xNN> give one byte). ERR_RANGE for a bad id. */
int tok_piece(const struct tok *t, int32_t id, const char **bytes, size_t *len);

/* Streaming decode: feed ids one at a time, receive only complete UTF-8 characters. */
struct tok_stream {
    const struct tok *tok;
    bool at_start;
    uint8_t pend[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t n_pend;
};
void tok_stream_init(struct tok_stream *s, const struct tok *t);
/* Appends up to cap bytes of newly completed text to out; *n_out = bytes written. */
int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out);
/* Emits what is pending at the end of a sequence (an incomplete tail becomes U+FFFD). */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out);

/* tokenizer.ie.json bytes (malloc'd). */
int tok_save_json(const struct tok *t, char **json, size_t *len);

#endif
