/*
 * tokfix.h — helpers shared by the tokenizer tests: the llama.cpp vocabulary test cases
 * (.inp/.out fixtures), and Hugging Face tokenizer.json documents generated from a loaded
 * vocabulary (through its tokenizer.ie.json), so the HF loader runs on real vocabularies.
 */
#ifndef CLOCHER_TESTS_TOK_TOKFIX_H
#define CLOCHER_TESTS_TOK_TOKFIX_H

#include "tok.h"

#include <stddef.h>
#include <stdint.h>

struct tokfix_case {
    char *text; /* may be empty or whitespace only; NUL-terminated for convenience */
    size_t len;
    int32_t *ids;
    size_t n_ids;
};

struct tokfix {
    struct tokfix_case *cases;
    size_t n;
};

/* Reads tokenizer/<name>.inp and .out ("ggml-vocab-llama-spm.gguf"); fails the test on any
 * inconsistency (the number of strings and of id lines must agree). */
void tokfix_load(const char *name, struct tokfix *fx);
/* The same from two paths (an .inp of the fixtures with an .out kept elsewhere); name labels
 * messages. */
void tokfix_load_paths(const char *inp, const char *outp, const char *name, struct tokfix *fx);
void tokfix_free(struct tokfix *fx);

/* Asserts that every case encodes (no BOS) to exactly its ids and decodes back to its text;
 * `label` names the loading path in failure messages. */
void tokfix_check(const struct tok *t, const struct tokfix *fx, const char *label);

/* Hugging Face tokenizer.json of the vocabulary, malloc'd. SPM: the merges Hugging Face's
 * converter derives from the scores; `metaspace` picks the newer Metaspace pre-tokenizer
 * (merges as arrays) over the legacy Prepend/Replace normalizer (merges as strings).
 * BPE: vocab, merges and <|endoftext|> as a special added token. */
char *tokfix_hf_json(const struct tok *t, int metaspace);

/* tok_save_json then tok_load_mem("ie-json"); fails the test on error. */
struct tok *tokfix_via_ie_json(const struct tok *t);

#endif
