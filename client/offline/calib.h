/*
 * calib.h — the calibration gate of `clocher convert`: runs a reference (fp32) model and its
 * quantized conversion side by side on calibration tokens and measures how far apart they are.
 *
 * Measured per position (teacher-forced: both models read the same calibration ids):
 * KL(p_ref || p_quant) of the next-token distributions and whether their argmax agrees; per
 * weight matrix, the cosine similarity between the two models' outputs of that projection
 * (over every position; the quantized model's inputs are its own activations, so the figure
 * includes the drift accumulated by the layers before it, which is what reaches the user).
 * docs/CONVERT.md ("Calibration gate") describes the flags and the report.
 */
#ifndef CLOCHER_CLIENT_CALIB_H
#define CLOCHER_CLIENT_CALIB_H

#include <stddef.h>
#include <stdint.h>

struct calib_tensor {
    char name[48];   /* "blk.3.attn_q" */
    double cosine;   /* output cosine similarity, quant vs ref, over all calibrated positions */
};

struct calib_report {
    size_t positions;           /* positions measured (logits compared) */
    double kld_mean, kld_max;   /* nats */
    double top1;                /* fraction of positions whose argmax agrees, 0..1 */
    double cosine_min;          /* the lowest per-tensor cosine */
    size_t n_tensors;
    struct calib_tensor *tensors; /* [n_tensors], layer-major, q k v o gate up down */
};

/* Thresholds; a NaN field is not checked. */
struct calib_gate {
    double max_kld;    /* mean KL divergence must be <= this */
    double min_top1;   /* top-1 agreement must be >= this */
    double min_cosine; /* every tensor's cosine must be >= this */
};

/* Reads calibration token ids (decimal, separated by whitespace or commas) from `path`.
 * 0 and a malloc'd *ids / *n, or ERR_FORMAT naming the offending token, ERR_RANGE (none, or
 * more than CALIB_MAX_IDS), or the file's error. */
#define CALIB_MAX_IDS (1u << 20)
int calib_read_ids(const char *path, int32_t **ids, size_t *n);

/* Tokenizes the text file `path` with the tokenizer stored in IEBIN directory `model_dir`
 * (with BOS). Same contract as calib_read_ids. */
int calib_read_text(const char *path, const char *model_dir, int32_t **ids, size_t *n);

/* Runs both IEBIN models over ids[0..n) (split into windows of at most the models' context)
 * and fills *r. 0, or ERR_MISMATCH (the two models' shapes differ), ERR_RANGE (an id outside
 * the vocabulary, fewer than 2 ids), a load error, -ENOMEM; logged. */
int calib_run(const char *ref_dir, const char *quant_dir, const int32_t *ids, size_t n,
              unsigned threads, struct calib_report *r);
void calib_report_free(struct calib_report *r);

/* 0 when every threshold holds; ERR_QUALITY, with each missed threshold logged, otherwise. */
int calib_check(const struct calib_report *r, const struct calib_gate *g);

/* Writes the report as JSON to `path` ("-" = stdout). 0 or a negative code, logged. */
int calib_write_report(const struct calib_report *r, const struct calib_gate *g, int verdict,
                       const char *path);

#endif
