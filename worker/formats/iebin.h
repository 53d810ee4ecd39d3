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
 * Writing: the blob, tokenizer and manifest are written and fsynced under temporary names;
 * then the old manifest is removed, the blob and tokenizer renamed into place and the
 * manifest last, so a directory whose conversion failed or was interrupted never loads as a
 * half-written model, and a failure before the commit leaves a previous model intact.
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
#define IEBIN_NAME_MAX 128          /* names are 1..127 printable ASCII bytes */
#define IEBIN_MANIFEST_MAX (64u << 20) /* bytes; larger manifests are refused unread */
#define IEBIN_INT_MAX (UINT64_C(1) << 53) /* every manifest integer is <= 2^53 (exact in JSON) */
#define IEBIN_MAX_EXPERTS 4096u    /* gpt_oss: n_experts is 1..4096 */
#define IEBIN_MAX_ROPE_PAIRS 512u  /* head_dim / 2 <= 512: rope_freq_factors' length */

/*
 * The RoPE scaling of a model that has one (docs/IEBIN.md): gpt_oss's YaRN, or llama/qwen2's
 * per-pair frequency factors (Llama 3's "llama3" scaling as llama.cpp stores it: pair i's
 * frequency theta^(-2i/head_dim) is divided by iebin_hparams.rope_freq_factors[i]).
 */
struct iebin_rope_scaling {
    enum iebin_rope_scaling_type {
        IEBIN_ROPE_NONE = 0,
        IEBIN_ROPE_YARN = 1,
        IEBIN_ROPE_FREQ_FACTORS = 2,
    } type;
    float factor;    /* context extension s (gpt-oss: 32) */
    float beta_fast; /* YaRN beta: below dimension "low" the frequencies extrapolate (32) */
    float beta_slow; /* YaRN alpha: above dimension "high" they interpolate (1) */
    uint32_t original_max_position_embeddings; /* L0 (4096) */
    bool truncate;   /* true: low floored and high ceiled (ggml); false: both fractional */
};

/*
 * Hyper-parameters of the "llama", "qwen2" and "gpt_oss" architectures. n_experts != 0 tells a
 * gpt_oss set apart, attn_qkv_bias a qwen2 one (iebin_arch_of). llama and qwen2 may have a
 * sliding window on every layer (Mistral) and frequency-factor RoPE scaling (Llama 3); the
 * other gpt_oss fields are zero for them (iebin_check_hparams refuses a set with any of them).
 */
struct iebin_hparams {
    uint32_t dim;         /* model width */
    uint32_t n_layers;
    uint32_t n_heads;     /* query heads */
    uint32_t n_kv_heads;  /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    uint32_t head_dim;    /* usually dim / n_heads */
    uint32_t ffn_dim;     /* SwiGLU hidden width (gpt_oss: of one expert) */
    uint32_t vocab_size;
    uint32_t max_seq_len; /* context length the model was trained for */
    float rope_theta;
    float rms_eps;
    bool tied_embeddings; /* classifier = token embedding (no "output" tensor) */
    bool attn_qkv_bias;   /* qwen2: q, k and v carry biases (architecture "qwen2") */
    uint32_t sliding_window;            /* 0: no sliding layers; else keys t-u < window */
    uint64_t sliding_layers[16];        /* bit l set: layer l slides (n_layers <= 1024; llama
                                         * and qwen2: every layer or none) */
    struct iebin_rope_scaling rope_scaling; /* gpt_oss: YaRN; llama, qwen2: none or factors */
    /* rope_scaling.type IEBIN_ROPE_FREQ_FACTORS: [head_dim/2] finite > 0, zero beyond */
    float rope_freq_factors[IEBIN_MAX_ROPE_PAIRS];
    /* gpt_oss only (zero otherwise) */
    uint32_t n_experts, n_experts_used; /* 0 for dense models; else 1 <= used <= n_experts */
    float swiglu_limit, swiglu_alpha;   /* clamped SwiGLU: 7.0, 1.702 for gpt-oss */
};

/* The architecture a hyper-parameter set describes: "gpt_oss", "qwen2" or "llama". */
static inline const char *iebin_arch_of(const struct iebin_hparams *hp)
{
    return hp->n_experts ? "gpt_oss" : hp->attn_qkv_bias ? "qwen2" : "llama";
}

/* Every layer of n_layers slides (llama/qwen2 with a window: Mistral). */
static inline void iebin_slide_all(struct iebin_hparams *hp)
{
    for (uint32_t l = 0; l < hp->n_layers && l < 1024; l++)
        hp->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
}

/* Whether layer l attends through the sliding window (gpt_oss's "sliding_attention"). */
static inline bool iebin_layer_slides(const struct iebin_hparams *hp, uint32_t l)
{
    return hp->sliding_window != 0 && l < 1024 && ((hp->sliding_layers[l / 64] >> (l % 64)) & 1u);
}

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
    char *dir;                   /* absolute (realpath); iebin_open_mem: its label */
    char *name;                  /* free text from the manifest ("" if none) */
    char arch[32];               /* "llama", "qwen2" or "gpt_oss" */
    struct iebin_hparams hp;
    size_t n_tensors;
    struct iebin_tensor *tensors; /* [n_tensors], in manifest order */
    char *tokenizer_path;        /* absolute path of tokenizer.ie.json, NULL when absent */
    void *map;                   /* the blob mapping (NULL for iebin_open_mem) */
    size_t map_size;
    size_t n_slots_;             /* private: size of slot_index_ */
    uint32_t *slot_index_;       /* private: architecture slot -> index in tensors */
};

/*
 * Opens the model in `dir`: reads and validates the manifest, checks the blob's size, maps it
 * read-only and points every tensor's `data` into the mapping. 0 and *out, or a negative code
 * with the reason logged once (log_last_error()). Codes: -errno for a missing/unreadable file;
 * ERR_FORMAT (malformed JSON, missing or mistyped field, misalignment, overlap, unknown or
 * duplicate tensor), ERR_UNSUPPORTED (version, architecture, dtype), ERR_RANGE (a value out of
 * its range, a tensor outside the blob), ERR_OVERFLOW (dimension product), ERR_MISMATCH
 * (shape x dtype != size, shape != the architecture's, blob larger than stated), ERR_TRUNCATED
 * (blob shorter than stated), ERR_NOT_FOUND (an architecture tensor is missing).
 */
int iebin_open(const char *dir, struct iebin_model **out);

/* iebin_open's flags. */
#define IEBIN_OPEN_LAZY 0x1u /* map without MAP_POPULATE: pages fault in on first use */

/*
 * iebin_open with flags. By default the blob is mapped MAP_PRIVATE|MAP_POPULATE (docs/IEBIN.md,
 * "Reading"): the whole model is read (or found in the page cache) at load time so that the
 * first request does not pay for page faults; IEBIN_OPEN_LAZY is for tools that only look at
 * the manifest or a few tensors.
 */
int iebin_open_ex(const char *dir, unsigned flags, struct iebin_model **out);

/*
 * Validates `manifest` (manifest_len bytes, not NUL-terminated) against an in-memory blob of
 * blob_len bytes exactly as iebin_open validates files; `label` names the manifest in messages.
 * On success the tensors point into `blob`, which the caller keeps alive until iebin_close;
 * model->map is NULL and model->tokenizer_path NULL (there is no directory).
 */
int iebin_open_mem(const char *label, const void *manifest, size_t manifest_len, const void *blob,
                   size_t blob_len, struct iebin_model **out);

/* Frees everything iebin_open* returned (unmaps the blob). NULL is a no-op. */
void iebin_close(struct iebin_model *m);
/* NULL when absent. O(1): the name is resolved through the architecture's tensor table. */
const struct iebin_tensor *iebin_find(const struct iebin_model *m, const char *name);

/*
 * Validates hyper-parameters alone (also used by converters before they write anything).
 * `what` names the source in messages ("…/model.ie.json", "stories260K.bin"). A set with
 * n_experts == 0 is checked as llama (every gpt_oss field must then be zero), otherwise as
 * gpt_oss. 0 or ERR_RANGE.
 */
int iebin_check_hparams(const struct iebin_hparams *hp, const char *what);

/*
 * Checks one tensor against the architecture `arch` with (already valid) hyper-parameters:
 * the name is one the architecture defines (ERR_FORMAT otherwise, also for `output` when the
 * embeddings are tied), norms are f32 and the shape is exactly the expected one (ERR_MISMATCH).
 * Converters may call it before streaming a tensor; the writer does.
 */
int iebin_check_tensor(const char *what, const char *arch, const struct iebin_hparams *hp,
                       const char *name, enum dtype dt, const uint64_t *shape, int n_dims);

/*
 * Validates a manifest document as if its blob were blob_size bytes, without any blob (what
 * iebin_writer_finish runs on the manifest it is about to commit). 0 or a code as above.
 */
int iebin_check_manifest(const char *label, const char *manifest, size_t manifest_len,
                         uint64_t blob_size);

/*
 * The tensors architecture `arch` defines for hp, by slot: 0 tok_embd, 1 output_norm,
 * 2 output (listed even when tied), then the per-layer tensors of layer 0, 1, ... in
 * docs/IEBIN.md's table order. iebin_arch_n_slots is their count (0 for an unknown
 * architecture); iebin_arch_slot fills slot's name, shape (n_dims <= 3) and whether it must be
 * f32 (norms, biases, sinks), and returns 0 (ERR_RANGE past the end). Converters walk these
 * instead of keeping their own copy of the tables.
 */
size_t iebin_arch_n_slots(const char *arch, const struct iebin_hparams *hp);
int iebin_arch_slot(const char *arch, const struct iebin_hparams *hp, size_t slot,
                    char name[IEBIN_NAME_MAX], uint64_t shape[3], int *n_dims, bool *f32);

/* ---- writing ---- */
/*
 * A writer streams tensors into a temporary blob beside the final one and keeps their records
 * in memory; iebin_writer_finish validates the whole set with the reader's own checks, flushes
 * every temporary, and only then replaces the model (docs/IEBIN.md, "Writing"):
 *  - any failure before the commit phase (a bad tensor, a full disk, an fsync error) leaves
 *    the directory as it was: a model already there still loads, unchanged;
 *  - the commit phase removes the old manifest first (and fsyncs the directory), renames the
 *    blob and the tokenizer into place, then the manifest; a failure there leaves a directory
 *    without a manifest, which does not load.
 * Every function logs its own failures; after the first one the writer refuses further calls
 * with the same code, and iebin_writer_finish returns it (having removed the temporaries).
 */
struct iebin_writer;

/* Creates dir (and missing parents) if needed and the temporary blob; checks arch and hp. */
int iebin_writer_create(const char *dir, const char *arch, const char *name,
                        const struct iebin_hparams *hp, struct iebin_writer **out);
/* Appends one tensor (64-byte aligned in the blob). size must equal shape x dtype, and the
 * tensor must be one the architecture defines, with its exact shape (iebin_check_tensor). */
int iebin_writer_add(struct iebin_writer *w, const char *name, enum dtype dt,
                     const uint64_t *shape, int n_dims, const void *data, uint64_t size);
/* Streams a tensor in pieces: begin, any number of writes adding up to the size, end. */
int iebin_writer_begin(struct iebin_writer *w, const char *name, enum dtype dt,
                       const uint64_t *shape, int n_dims);
int iebin_writer_write(struct iebin_writer *w, const void *data, uint64_t n);
int iebin_writer_end(struct iebin_writer *w);
/* The tokenizer document (tokenizer.ie.json bytes, see tok_save_json). Optional; at most once.
 * The bytes are written to a temporary file at once (the caller may free them). Without it,
 * finish removes any tokenizer.ie.json left by a previous model. */
int iebin_writer_set_tokenizer(struct iebin_writer *w, const char *json, size_t len);
/* Validates the set against the architecture, then commits: blob, tokenizer, manifest last.
 * Frees w whatever the outcome; on failure nothing that loads is left behind. */
int iebin_writer_finish(struct iebin_writer *w);
/* Removes temporaries and frees w. NULL is a no-op. */
void iebin_writer_abort(struct iebin_writer *w);

/*
 * The RoPE row order (docs/IEBIN.md "RoPE convention", docs/CONVERT.md). IEBIN's attn_q/attn_k
 * rows are interleaved: within each head of head_dim rows, rows 2i and 2i+1 form rotation pair
 * i. Hugging Face checkpoints hold the same rows in rotate-half order: pair i is rows i and
 * i + head_dim/2. Row `row` of an IEBIN q/k matrix is therefore row iebin_rope_hf_row(row,
 * head_dim) of the HF matrix (head_dim even). Converters (HF import, GGUF export of synthetic
 * HF weights, LoRA lora_B) all go through this one mapping.
 */
static inline uint64_t iebin_rope_hf_row(uint64_t row, uint32_t head_dim)
{
    uint64_t head = row / head_dim, j = row % head_dim;
    return head * head_dim + (j % 2) * (head_dim / 2) + j / 2;
}

/* Tensor names of the llama and gpt_oss architectures (docs/IEBIN.md). */
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
/* llama only */
#define IEBIN_T_FFN_GATE "ffn_gate"   /* [ffn_dim][dim]  (llama2.c w1) */
#define IEBIN_T_FFN_UP "ffn_up"       /* [ffn_dim][dim]  (llama2.c w3) */
#define IEBIN_T_FFN_DOWN "ffn_down"   /* [dim][ffn_dim]  (llama2.c w2) */
/* gpt_oss and qwen2 (q/k/v biases), gpt_oss only (o bias, sinks, experts); biases and sinks
 * f32; q/k biases in the interleaved RoPE order like q/k rows */
#define IEBIN_T_ATTN_Q_BIAS "attn_q_bias"               /* [n_heads*head_dim] */
#define IEBIN_T_ATTN_K_BIAS "attn_k_bias"               /* [n_kv_heads*head_dim] */
#define IEBIN_T_ATTN_V_BIAS "attn_v_bias"               /* [n_kv_heads*head_dim] */
#define IEBIN_T_ATTN_O_BIAS "attn_o_bias"               /* [dim] */
#define IEBIN_T_ATTN_SINKS "attn_sinks"                 /* [n_heads] */
#define IEBIN_T_FFN_ROUTER "ffn_router"                 /* [n_experts][dim] */
#define IEBIN_T_FFN_ROUTER_BIAS "ffn_router_bias"       /* [n_experts] */
#define IEBIN_T_FFN_GATE_EXPS "ffn_gate_exps"           /* [n_experts][ffn_dim][dim] */
#define IEBIN_T_FFN_GATE_EXPS_BIAS "ffn_gate_exps_bias" /* [n_experts][ffn_dim] */
#define IEBIN_T_FFN_UP_EXPS "ffn_up_exps"               /* [n_experts][ffn_dim][dim] */
#define IEBIN_T_FFN_UP_EXPS_BIAS "ffn_up_exps_bias"     /* [n_experts][ffn_dim] */
#define IEBIN_T_FFN_DOWN_EXPS "ffn_down_exps"           /* [n_experts][dim][ffn_dim] */
#define IEBIN_T_FFN_DOWN_EXPS_BIAS "ffn_down_exps_bias" /* [n_experts][dim] */

#endif
