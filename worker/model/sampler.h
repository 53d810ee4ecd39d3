/*
 * sampler.h — choosing the next token from logits, and stopping a generation.
 *
 * sampler_sample() applies, in this order (docs/DESIGN.md, "Sampling"):
 *   1. repetition penalty over the last repeat_window tokens of the history: each distinct
 *      token's logit is divided by the penalty when positive, multiplied when negative
 *      (CTRL's rule, as Hugging Face and llama.cpp apply it);
 *   2. temperature 0: greedy, the argmax (the lowest id wins a tie, as llama2.c);
 *   3. otherwise softmax(logits / temperature), cut in the order of Hugging Face's and
 *      llama.cpp's chains: top-k keeps the k most probable tokens; top-p keeps, of those, the
 *      smallest set of most probable tokens whose renormalized mass reaches top_p; min-p keeps
 *      those whose probability is at least min_p times the largest. Ties are ordered by id
 *      (lower first), so every cut is exact and deterministic;
 *   4. one draw from the kept candidates, renormalized, with the sampler's own RNG
 *      (splitmix64 seeded by `seed`: the same seed and inputs give the same tokens).
 *
 * sampler_stop_*: stop strings matched on the decoded text as it streams, across token
 * boundaries; text that could be the beginning of a stop string is held back until it is
 * known not to be, and the stop string itself is never emitted.
 *
 * NOTES: a struct sampler and a struct sampler_stop belong to one sequence and one thread.
 */
#ifndef CLOCHER_WORKER_SAMPLER_H
#define CLOCHER_WORKER_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sampler_params {
    float temperature;      /* >= 0; 0 = greedy */
    uint32_t top_k;         /* 0 = off */
    float top_p;            /* (0, 1]; 1 = off */
    float min_p;            /* [0, 1]; 0 = off */
    float repeat_penalty;   /* > 0; 1 = off */
    uint32_t repeat_window; /* tokens of history the penalty looks at; 0 = all */
    uint64_t seed;
};

/* Temperature 1 and every filter off: samples the model's own distribution. */
void sampler_params_default(struct sampler_params *p);
/* 0, or ERR_RANGE naming the parameter and its valid range (logged). NaN is out of range. */
int sampler_params_check(const struct sampler_params *p);

struct sampler;

/* Checks p (as sampler_params_check), allocates the working arrays for vocab_size tokens.
 * 0, ERR_RANGE, -ENOMEM (logged). */
int sampler_create(const struct sampler_params *p, uint32_t vocab_size, struct sampler **out);
void sampler_destroy(struct sampler *s);
/* Restarts the RNG from the seed (a new sequence with the same draws). */
void sampler_reset(struct sampler *s);

/*
 * The next token for logits [vocab_size] (not modified). history[0..n_history) are the
 * sequence's tokens so far (prompt and generated) for the repetition penalty; ids outside the
 * vocabulary are ignored. Returns a token id >= 0, or ERR_STATE (logged; the message says
 * "non-finite logits") when any logit is NaN or every logit is infinite: a broken model must
 * fail the request, not emit token 0.
 */
int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history,
                       size_t n_history);

/* ---- log-probabilities (GenerateRequest.logprobs, docs/DAEMON.md) ---- */

#define SAMPLER_MAX_TOP_LOGPROBS 20u  /* OpenAI's and vLLM's bound on top_logprobs */
#define SAMPLER_LOGPROB_FLOOR -9999.0f /* an impossible token's (-inf) log-probability, as vLLM
                                        * writes it: JSON has no infinity */

struct sampler_logprob {
    int32_t id;
    float logprob;          /* natural log, in [SAMPLER_LOGPROB_FLOOR, 0] */
};

/*
 * The log-probabilities of the step sampler_sample just took (call it right after, before
 * anything else uses s or changes the logits given to it: greedy without a penalty draws
 * from those directly): log-softmax, in double precision, of the logits after the
 * repetition penalty divided by the temperature, before top-k/top-p/min-p cut anything
 * (OpenAI's convention: the distribution the token was drawn from, untruncated). Greedy
 * (temperature 0) reports the temperature-1 distribution, the model's own, as OpenAI and
 * vLLM do. *chosen_lp: token `chosen`'s; top[0..*n_out): the min(n_top,
 * SAMPLER_MAX_TOP_LOGPROBS, vocab) most likely tokens, most likely first (ties: lower id).
 */
void sampler_logprobs(const struct sampler *s, int32_t chosen, uint32_t n_top, float *chosen_lp,
                      struct sampler_logprob *top, uint32_t *n_out);

/*
 * The candidates sampler_sample would draw from (steps 1-3, no draw): *n_out tokens in ids
 * with their renormalized probabilities in probs (summing to 1), ordered by decreasing
 * probability (ties: lower id first) when a cut is active, by id otherwise; ids and probs
 * have room for vocab_size entries. Greedy (temperature 0) gives the argmax alone.
 */
void sampler_candidates(struct sampler *s, const float *logits, const int32_t *history,
                        size_t n_history, int32_t *ids, float *probs, size_t *n_out);

/* Index of the largest of x[0..n) (n > 0), the lowest on ties; NaN never wins. */
int32_t sampler_argmax(const float *x, size_t n);

/* ---- stop strings ---- */

struct sampler_stop {
    char **stops;        /* [n_stops] copies, each non-empty */
    size_t n_stops;
    size_t max_len;      /* longest stop string */
    char *buf;           /* text held back: could be the beginning of a stop string */
    size_t len, cap;
    char *out;           /* the last push's emitted text */
    size_t out_cap;
    bool stopped;
};

/* Copies the n stop strings (none may be empty: ERR_RANGE, logged). -ENOMEM. */
int sampler_stop_init(struct sampler_stop *st, const char *const *stops, size_t n);
void sampler_stop_fini(struct sampler_stop *st);
/* Forgets held-back text and the stopped state (a new sequence). */
void sampler_stop_reset(struct sampler_stop *st);
/*
 * Feeds text[0..len) decoded after what was fed before. *emit / *n_emit: the text that can be
 * shown now (valid until the next call). *stopped: a stop string is complete; *emit then ends
 * right before its first occurrence and further pushes emit nothing. 0 or -ENOMEM.
 */
int sampler_stop_push(struct sampler_stop *st, const char *text, size_t len, const char **emit,
                      size_t *n_emit, bool *stopped);
/* End of the sequence without a stop: the held-back text (valid until the next call). */
void sampler_stop_flush(struct sampler_stop *st, const char **emit, size_t *n_emit);

#endif
