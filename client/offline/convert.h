/*
 * convert.h — offline conversion of llama2.c checkpoints, Hugging Face directories and GGUF
 * files into IEBIN models (the engine of `clocher convert`).
 *
 * Tensors are streamed one at a time through the IEBIN writer, so converting a 4 GB model
 * needs memory for one tensor, not the model. Hugging Face q/k projections are converted from
 * the rotate-half RoPE order to IEBIN's interleaved order (a pure row permutation, so it is
 * exact in every dtype); llama2.c and GGUF are already interleaved. Nothing under OUT_DIR
 * loads unless the conversion completed (iebin.h's writer protocol).
 */
#ifndef CLOCHER_CLIENT_CONVERT_H
#define CLOCHER_CLIENT_CONVERT_H

#include "dtype.h"
#include "quant_manifest.h"

#include <stdbool.h>
#include <stddef.h>

enum convert_from { CONVERT_AUTO = 0, CONVERT_LLAMA2C, CONVERT_HF, CONVERT_GGUF, CONVERT_IEBIN };

struct convert_opts {
    enum convert_from from;
    bool dtype_set;       /* false: keep the source dtype of every matrix */
    enum dtype dtype;     /* f32, f16 or bf16 when dtype_set */
    bool embd_dtype_set;  /* tok_embd and output get embd_dtype instead of dtype */
    enum dtype embd_dtype;
    /* per-tensor dtypes by name (quant_manifest.h); overrides dtype/embd_dtype for the tensors
     * a rule matches; NULL = none. Counts its rules' matches. */
    struct quant_manifest *manifest;
    /* --rounding search: int4 (q4_0 and the group types) with a per-group error-minimising
     * scale/offset search (kern_quantize_row_q4_search) instead of round to nearest */
    bool rounding_search;
    const char *tokenizer; /* overrides the source's tokenizer; NULL: the source's own */
    bool progress;        /* in-place progress line on stderr */
    /* Called after each tensor is written (streaming imports: HF, GGUF, IEBIN); NULL = none.
     * For GUIs and tests (which kill the process mid-conversion from it). */
    void (*on_tensor)(void *arg, size_t done, size_t total);
    void *on_tensor_arg;
};

/* Which side a failed conversion failed on: the source (missing, malformed, unsupported: exit
 * code 3 of `clocher convert`) or OUT_DIR (cannot create, disk full: exit code 1). */
enum convert_fault { CONVERT_FAULT_NONE = 0, CONVERT_FAULT_SOURCE, CONVERT_FAULT_OUTPUT };

/* 0, or a negative code with the reason logged once; ERR_USAGE for bad options. *fault (may
 * be NULL) tells which side failed. OUT_DIR then holds its previous model or none that loads. */
int convert_model(const char *src, const char *out_dir, const struct convert_opts *o,
                  enum convert_fault *fault);

/*
 * Reads a Hugging Face config.json (text, len bytes; `what` names it in messages) into hp as
 * `clocher convert` does, every refusal included (docs/CONVERT.md). 0, or a negative code
 * logged once. For tests and the fuzzer; tied_embeddings is the config's word only (the
 * converter also looks for lm_head.weight).
 */
struct iebin_hparams;
int convert_hf_config_mem(const char *text, size_t len, const char *what,
                          struct iebin_hparams *hp);

/* Detects the format of src (0 and *out, or ERR_UNSUPPORTED naming what was tried). */
int convert_detect(const char *src, enum convert_from *out);

#endif
