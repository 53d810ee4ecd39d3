/*
 * golden.h — the stories260K reference outputs (fixtures/stories260K/golden.json, computed by
 * llama2.c's run.c in fp32) and the f32 IEBIN import the forward tests run them against.
 */
#ifndef CLOCHER_TESTS_FORWARD_GOLDEN_H
#define CLOCHER_TESTS_FORWARD_GOLDEN_H

#include "dtype.h"

#include <stddef.h>
#include <stdint.h>

#define GOLDEN_MAX_STEPS 16

struct golden_case {
    int32_t *prompt;              /* [n_prompt], prompt[0] = BOS */
    size_t n_prompt;
    float *prompt_logits;         /* [n_prompt][vocab]: after feeding prompt[p] at position p */
    int32_t *greedy;              /* [n_greedy] greedy continuation */
    float *margin;                /* [n_greedy] top-1 minus top-2 logit at each step */
    size_t n_greedy;
    size_t cutoff;                /* first step whose margin < 0.01 (n_greedy if none) */
    size_t n_steps;
    size_t step[GOLDEN_MAX_STEPS];        /* greedy steps with stored logits, ascending */
    float *step_logits[GOLDEN_MAX_STEPS]; /* [vocab] each, teacher-forced on `greedy` */
};

struct golden {
    uint32_t vocab;
    size_t n_cases;
    struct golden_case *cases;
};

/* Reads golden.json (fails the test on any surprise). */
void golden_load(struct golden *g);
void golden_free(struct golden *g);

/* Imports stories260K.bin to an IEBIN model of dtype dt in a fresh temp dir; returns the model
 * directory (malloc'd); the temp dir to remove is its parent (*tmp, malloc'd). */
char *golden_import(enum dtype dt, char **tmp);

struct iebin_model;
/* The model `im` with every f32 matrix whose rows are whole blocks quantized to q8_0 (the norms
 * and stories260K's ffn_down, 172 columns, stay f32), written to <tmp>/q8; returns that
 * directory (malloc'd). */
char *golden_quantize_q8(const struct iebin_model *im, const char *tmp);

/* max |a[i] - b[i]| over n */
float golden_max_diff(const float *a, const float *b, size_t n);

#endif
