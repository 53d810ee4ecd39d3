/*
 * llama2c.h — import of llama2.c checkpoints (Karpathy's `run.c` format, "version 0") into
 * IEBIN.
 *
 * The checkpoint is a header of 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len; a negative vocab_size means the classifier is stored
 * separately) followed by f32 tensors, each stacked over layers:
 *   token_embedding [vocab][dim], rms_att [L][dim], wq [L][dim][dim], wk [L][kv_dim][dim],
 *   wv [L][kv_dim][dim], wo [L][dim][dim], rms_ffn [L][dim], w1 [L][hidden][dim],
 *   w2 [L][dim][hidden], w3 [L][hidden][dim], rms_final [dim],
 *   freq_cis_real [seq_len][head_size/2], freq_cis_imag [seq_len][head_size/2] (unused),
 *   wcls [vocab][dim] (only when vocab_size < 0).
 * llama2.c's q/k rows are already in IEBIN's interleaved RoPE order: no permutation.
 */
#ifndef CLOCHER_CLIENT_LLAMA2C_H
#define CLOCHER_CLIENT_LLAMA2C_H

#include "dtype.h"
#include "iebin.h"

#include <stddef.h>

/* llama2.c's run.c constants, which its checkpoints do not store. */
#define LLAMA2C_ROPE_THETA 10000.0f
#define LLAMA2C_RMS_EPS 1e-5f

/*
 * Reads and validates a checkpoint's header against the file's exact size; on success *hp
 * holds the IEBIN hyper-parameters (head_dim = dim / n_heads, tied_embeddings = vocab_size > 0).
 * ERR_TRUNCATED when the file is shorter than the header implies, ERR_MISMATCH when longer,
 * ERR_RANGE for header values IEBIN cannot hold, -errno for I/O; each logged naming the file.
 */
int llama2c_read_hparams(const char *checkpoint_path, struct iebin_hparams *hp);
/* Every weight of the checkpoint is finite: 0, or ERR_RANGE naming the first NaN/infinity
 * (a source fault: the converter calls it before writing anything); codes as above otherwise. */
int llama2c_check_weights(const char *checkpoint_path);

/*
 * Converts a checkpoint to an IEBIN model in out_dir (created if needed; an existing model
 * there is replaced atomically, see iebin.h). dtype is f32, f16 or bf16 for the matrices and
 * the embedding; norms stay f32. tokenizer_json (tokenizer.ie.json bytes, may be NULL) is stored
 * beside the model. name NULL takes the checkpoint's file name without ".bin".
 * 0, or a negative code with the reason logged once.
 */
int llama2c_convert(const char *checkpoint_path, const char *tokenizer_json,
                    size_t tokenizer_json_len, const char *out_dir, enum dtype dtype,
                    const char *name);

#endif
