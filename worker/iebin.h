/*
 * iebin.h — IEBIN v1 models: read (mmap + validate everything) and write (atomically).
 *
 * A model is a directory holding model.ie.json (the manifest), model.ie.bin (raw tensors, each
 * 64-byte aligned) and optionally tokenizer.ie.json. docs/IEBIN.md is the specification; this
 * module is its only reader and writer.
 *
 * Reading: iebin_open() maps the blob read-only and rejects, with one message naming the file,
 * the tensor and the field, anything that could make later code read out of bounds or compute
 * garbage: unknown version/dtype/architecture, shape x dtype != size, overflowing dimensions,
 * offsets/sizes outside the blob, misalignment, overlapping tensors, missing or extra-shaped
 * architecture tensors, hyper-parameters out of range. After it returns 0 every tensor's
 * `data` points at `size` valid bytes.
 *
 * Writing: the blob and tokenizer go under temporary names and are renamed into place; the
 * manifest is written last (and any old manifest removed first), so a directory whose
 * conversion failed or was interrupted never loads as a valid model.
 *
 * NOTES: a struct iebin_model is immutable after iebin_open() and may be shared by threads.
 */
#ifndef CLOCHER_WORKER_IEBIN_H
#define CLOCHER_WORKER_IEBIN_H

#include "dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IEBIN_VERSION 1
#define IEBIN_ALIGN 64
#define IEBIN_MANIFEST "model.ie.json"
#define IEBIN_BLOB "model.ie.bin"
#define IEBIN_TOKENIZER "tokenizer.ie.json"
#define IEBIN_MAX_DIMS 4
#define IEBIN_NAME_MAX 128

/* Hyper-parameters of the "llama" architecture (the only one of v1). */
struct iebin_hparams {
    uint32_t dim;         /* model width */
    uint32_t n_layers;
    uint32_t n_heads;     /* query heads */
    uint32_t n_kv_heads;  /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    uint32_t head_dim;    /* usually dim / n_heads */
    uint32_t ffn_dim;     /* SwiGLU hidden width */
    uint32_t vocab_size;
    uint32_t max_seq_len; /* context length the model was trained for */
    float rope_theta;
    float rms_eps;
    bool tied_embeddings; /* classifier = token embedding (no "output" tensor) */
};

struct iebin_tensor {
    char name[IEBIN_NAME_MAX];
    enum dtype dtype;
    int n_dims;
    uint64_t shape[IEBIN_MAX_DIMS]; /* row-major, outermost first: a linear layer is [out][in] */
    uint64_t offset;                /* bytes from the start of model.ie.bin, multiple of 64 */
    uint64_t size;                  /* bytes */
    const void *data;               /* into the read-only mapping (NULL while writing) */
};

struct iebin_model {
    char *dir;
    char *name;                  /* free text from the manifest ("" if none) */
    char arch[32];               /* "llama" */
    struct iebin_hparams hp;
    size_t n_tensors;
    struct iebin_tensor *tensors;
    char *tokenizer_path;        /* absolute path of tokenizer.ie.json, NULL when absent */
    void *map;                   /* the blob mapping */
    size_t map_size;
};

/* 0 and *out, or a negative code with the reason logged once (log_last_error()). */
int iebin_open(const char *dir, struct iebin_model **out);
void iebin_close(struct iebin_model *m);
/* NULL when absent. */
const struct iebin_tensor *iebin_find(const struct iebin_model *m, const char *name);

/* Validates hyper-parameters alone (also used by converters before they write anything). */
int iebin_check_hparams(const struct iebin_hparams *hp, const char *what);

/* ---- writing ---- */
struct iebin_writer;

/* Creates dir if needed; nothing under the final names is touched until iebin_writer_finish. */
int iebin_writer_create(const char *dir, const char *arch, const char *name,
                        const struct iebin_hparams *hp, struct iebin_writer **out);
/* Appends one tensor (64-byte aligned in the blob). size must equal shape x dtype. */
int iebin_writer_add(struct iebin_writer *w, const char *name, enum dtype dt,
                     const uint64_t *shape, int n_dims, const void *data, uint64_t size);
/* Streams a tensor in pieces: begin, any number of writes adding up to the size, end. */
int iebin_writer_begin(struct iebin_writer *w, const char *name, enum dtype dt,
                       const uint64_t *shape, int n_dims);
int iebin_writer_write(struct iebin_writer *w, const void *data, uint64_t n);
int iebin_writer_end(struct iebin_writer *w);
/* The tokenizer document (tokenizer.ie.json bytes, see tok_save_json). Optional. */
int iebin_writer_set_tokenizer(struct iebin_writer *w, const char *json, size_t len);
/* Validates the set against the architecture, then commits: blob, tokenizer, manifest last.
 * Frees w whatever the outcome; on failure nothing that loads is left behind. */
int iebin_writer_finish(struct iebin_writer *w);
/* Removes temporaries and frees w. */
void iebin_writer_abort(struct iebin_writer *w);

/* Tensor names of the llama architecture (docs/IEBIN.md). */
#define IEBIN_T_TOK_EMBD "tok_embd"       /* [vocab][dim] */
#define IEBIN_T_OUTPUT_NORM "output_norm" /* [dim] */
#define IEBIN_T_OUTPUT "output"           /* [vocab][dim], absent when tied */
/* per layer, "blk.%u." + one of: */
#define IEBIN_T_ATTN_NORM "attn_norm" /* [dim] */
#define IEBIN_T_ATTN_Q "attn_q"       /* [n_heads*head_dim][dim] */
#define IEBIN_T_ATTN_K "attn_k"       /* [n_kv_heads*head_dim][dim] */
#define IEBIN_T_ATTN_V "attn_v"       /* [n_kv_heads*head_dim][dim] */
#define IEBIN_T_ATTN_O "attn_o"       /* [dim][n_heads*head_dim] */
#define IEBIN_T_FFN_NORM "ffn_norm"   /* [dim] */
#define IEBIN_T_FFN_GATE "ffn_gate"   /* [ffn_dim][dim]  (llama2.c w1) */
#define IEBIN_T_FFN_UP "ffn_up"       /* [ffn_dim][dim]  (llama2.c w3) */
#define IEBIN_T_FFN_DOWN "ffn_down"   /* [dim][ffn_dim]  (llama2.c w2) */

#endif
