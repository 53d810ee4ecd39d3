/*
 * synth.h — deterministic random-weight Llama models in Hugging Face form (config.json +
 * model.safetensors + tokenizer.model), optionally also as a GGUF file of the same weights
 * laid out the way llama.cpp's converter writes them. The benchmarks' and the main job's model.
 */
#ifndef CLOCHER_CLIENT_SYNTH_H
#define CLOCHER_CLIENT_SYNTH_H

#include "dtype.h"
#include "iebin.h"

#include <stdint.h>

struct synth_opts {
    const char *preset;  /* "demo" or "tinyllama-1.1b" */
    uint64_t seed;
    int dtype_set;
    enum dtype dtype;    /* f32, f16 or bf16; preset default otherwise */
    uint32_t layers;     /* 0 = the preset's */
    const char *gguf;    /* also write this GGUF file; NULL = no */
};

/* The preset's hyper-parameters; ERR_NOT_FOUND for an unknown name (logged). */
int synth_preset(const char *name, struct iebin_hparams *hp, enum dtype *dflt);
int synth_model(const char *out_dir, const struct synth_opts *o);

#endif
