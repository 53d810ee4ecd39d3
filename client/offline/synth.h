/*
 * synth.h — deterministic random-weight models in Hugging Face form, optionally also as a GGUF
 * file of the same weights laid out the way llama.cpp's converter writes them. The benchmarks'
 * and the tests' models.
 *  - Llama-family presets (synth.c): config.json + model.safetensors + tokenizer.model
 *    (synthesized); llama3-tiny, qwen2-tiny and mistral-tiny carry their family's features
 *    (Llama 3 RoPE scaling and tied embeddings; q/k/v biases; a sliding window), and their
 *    --gguf is llama.cpp's layout of the family (rope_freqs.weight; arch qwen2, NEOX q/k).
 *  - gpt-oss presets (synth_gpt_oss.c): the release's layout, config.json as
 *    ../shared/specs/gpt-oss.md §1a, sharded safetensors + index, MXFP4 experts; streamed, so
 *    the 20b preset's 13 GB need about a megabyte of memory.
 */
#ifndef CLOCHER_CLIENT_SYNTH_H
#define CLOCHER_CLIENT_SYNTH_H

#include "dtype.h"
#include "iebin.h"

#include <stdint.h>

struct synth_opts {
    const char *preset;  /* "demo", "tinyllama-1.1b", "llama3-tiny", "qwen2-tiny",
                          * "mistral-tiny", "gpt-oss-tiny" or "gpt-oss-20b" */
    uint64_t seed;
    int dtype_set;
    enum dtype dtype;    /* f32, f16 or bf16; preset default otherwise */
    uint32_t layers;     /* 0 = the preset's */
    const char *gguf;    /* also write this GGUF file; NULL = no */
    int gguf_q4_k_m;     /* Llama presets: the GGUF's matrices in llama.cpp's Q4_K_M mix (q4_K,
                          * q6_K for output and some attn_v / ffn_down), not the float dtype */
    /* gpt-oss presets: a tokenizer file (tokenizer.json, *.tiktoken: anything tok_load
     * reads) copied beside the weights, and/or the vocabulary size (0: the tokenizer's, or
     * the preset's: 201088 for gpt-oss-20b; gpt-oss-tiny needs one of the two). Llama
     * presets: vocab replaces the preset's (the synthesized SentencePiece vocabulary grows to
     * it, up to the pieces it can make) */
    const char *tokenizer;
    uint32_t vocab;
};

/* The preset's hyper-parameters; ERR_NOT_FOUND for an unknown name (logged). */
int synth_preset(const char *name, struct iebin_hparams *hp, enum dtype *dflt);
int synth_model(const char *out_dir, const struct synth_opts *o);
/* synth_model's gpt-oss half (hp from synth_preset, --layers applied; dt the non-expert
 * dtype). */
int synth_gpt_oss(const char *out_dir, const struct synth_opts *o, struct iebin_hparams *hp,
                  enum dtype dt);

#endif
