/*
 * genreq.h — GenerateRequests built from command-line flags (`generate`, `batch`, `bench`) and
 * from JSON objects (one per `batch` input line), and a Generate stream's responses gathered
 * into one result rendered as a JSON object. Pure: no gRPC (tests/client unit-tests it).
 *
 * Field names are the proto's (clocher.v1.GenerateRequest and its SamplingParams, flattened):
 * flag `--top-p` and JSON key "top_p" set the same field. A field not given is left unset, so
 * the daemon's default applies.
 *
 * Requests are protobuf-c structs whose every part is malloc'd: free them with genreq_free
 * (protobuf_c_message_free_unpacked with the system allocator).
 */
#ifndef CLOCHER_CLIENT_GENREQ_H
#define CLOCHER_CLIENT_GENREQ_H

#include "clocher/v1/inference.pb-c.h"

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef Clocher__V1__GenerateRequest genreq_t;

enum genreq_field {
    GENREQ_PROMPT,
    GENREQ_PROMPT_IDS,
    GENREQ_MODEL,
    GENREQ_ADD_BOS,
    GENREQ_NO_BOS, /* flag only: --no-bos = add_bos false */
    GENREQ_ADAPTER,
    GENREQ_ADAPTER_SCALE,
    GENREQ_MAX_TOKENS,
    GENREQ_STOP,
    GENREQ_PRIORITY,
    GENREQ_REQUEST_ID,
    GENREQ_TEMPERATURE,
    GENREQ_TOP_K,
    GENREQ_TOP_P,
    GENREQ_MIN_P,
    GENREQ_REPETITION_PENALTY,
    GENREQ_SEED,
    GENREQ_LOGPROBS,
    GENREQ_N_FIELDS
};

#define GENREQ_OPT_BASE 0x2000

/* getopt_long entries for the request flags (not --prompt: commands take the prompt as
 * arguments or from a file). */
#define GENREQ_LONG_OPTIONS                                                                     \
    {"prompt-ids", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_PROMPT_IDS},               \
        {"model", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_MODEL},                     \
        {"no-bos", no_argument, NULL, GENREQ_OPT_BASE + GENREQ_NO_BOS},                         \
        {"adapter", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_ADAPTER},                 \
        {"adapter-scale", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_ADAPTER_SCALE},     \
        {"max-tokens", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_MAX_TOKENS},           \
        {"stop", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_STOP},                       \
        {"priority", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_PRIORITY},               \
        {"request-id", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_REQUEST_ID},           \
        {"temperature", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_TEMPERATURE},         \
        {"top-k", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_TOP_K},                     \
        {"top-p", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_TOP_P},                     \
        {"min-p", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_MIN_P},                     \
        {"repetition-penalty", required_argument, NULL,                                         \
         GENREQ_OPT_BASE + GENREQ_REPETITION_PENALTY},                                          \
        {"seed", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_SEED},                       \
        {"logprobs", required_argument, NULL, GENREQ_OPT_BASE + GENREQ_LOGPROBS}

#define GENREQ_OPTIONS_HELP                                                                     \
    "request (unset fields take the daemon's defaults):\n"                                      \
    "  --prompt-ids IDS     the prompt as token ids (\"1 345 22\" or \"1,345,22\") instead\n"    \
    "                       of text\n"                                                          \
    "  --no-bos             do not prepend BOS to a text prompt\n"                              \
    "  --max-tokens N       at most N new tokens (0 = the daemon's default)\n"                  \
    "  --temperature T      0 = greedy (default 0.8)\n"                                         \
    "  --top-k K            0 = off\n"                                                          \
    "  --top-p P            in (0, 1]; 1 = off\n"                                               \
    "  --min-p P            in [0, 1); 0 = off\n"                                               \
    "  --repetition-penalty R  > 0; 1 = off\n"                                                  \
    "  --seed N             same seed, same output\n"                                           \
    "  --logprobs N         each token's log-probability and its N (0..20) likeliest\n"         \
    "                       alternatives'\n"                                                     \
    "  --stop TEXT          stop before TEXT (repeatable)\n"                                    \
    "  --adapter NAME       a LoRA adapter loaded in the daemon\n"                              \
    "  --adapter-scale S    its scale (default 1)\n"                                            \
    "  --priority P         normal, high or low\n"                                              \
    "  --request-id ID      echoed in the daemon's logs\n"                                      \
    "  --model NAME         \"\" = the daemon's model\n"

/* A request with its SamplingParams allocated and nothing set; NULL when out of memory. */
genreq_t *genreq_new(void);
void genreq_free(genreq_t *r);
/* A deep copy (NULL when out of memory). */
genreq_t *genreq_copy(const genreq_t *r);

/*
 * Applies one getopt_long result: 1 applied, 0 not a request flag, negative (ERR_USAGE, or
 * -ENOMEM) with the reason in err ("--top-k: expected an integer in 0..4294967295, got 'x'").
 */
int genreq_opt_set(genreq_t *r, int opt, const char *arg, char *err, size_t cap);

/* Sets the text prompt (copied), replacing any prompt or prompt ids. 0 or -ENOMEM. */
int genreq_set_prompt(genreq_t *r, const char *text, size_t len);

/*
 * Token ids separated by white space and/or commas ("1 2,3"): 0 and *ids (malloc'd, n >= 1),
 * or ERR_FORMAT with the reason in err.
 */
int genreq_parse_ids(const char *s, int32_t **ids, size_t *n, char *err, size_t cap);

/*
 * One batch input line: a JSON object whose keys are the request's fields (prompt or
 * prompt_ids, model, add_bos, adapter, adapter_scale, max_tokens, stop (a string or a list),
 * priority, request_id, temperature, top_k, top_p, min_p, repetition_penalty, seed, logprobs
 * (the alternatives wanted, 0..20)), applied
 * over a copy of `defaults` (NULL = none). 0 and *out; ERR_FORMAT (not JSON, not an object,
 * an unknown key, a wrong type, no prompt) or ERR_RANGE with the reason in err; -ENOMEM.
 */
int genreq_from_json(const char *line, size_t len, const genreq_t *defaults, genreq_t **out,
                     char *err, size_t cap);

/* "OK", "INVALID_ARGUMENT", ... for a gRPC status code ("CODE_<n>" otherwise, thread-local). */
const char *genreq_status_name(int code);
/* "eos", "length", "stop", "context", "unspecified". */
const char *genreq_finish_name(int reason);

/* A Generate stream's messages gathered, or the error that ended it. */
struct genreq_result {
    char *text;
    size_t text_len, text_cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    bool has_finish;
    int finish_reason;
    bool has_usage;
    uint32_t prompt_tokens, completion_tokens, cached_prompt_tokens;
    bool has_timings;
    double queue_ms, ttft_ms, tpot_ms, e2e_ms;
    void *logprobs;      /* json_t array of {"id", "logprob", "top": [[id, logprob], ...]} for
                          * each token of a logprobs request; NULL = none came */
    int error_code;      /* 0 = none: a gRPC status code */
    char *error_message; /* malloc'd, with error_code */
};

void genreq_result_init(struct genreq_result *r);
void genreq_result_fini(struct genreq_result *r);
/* Appends one response's tokens and text, and keeps its finish/usage/timings. 0 or -ENOMEM. */
int genreq_result_add(struct genreq_result *r, const Clocher__V1__GenerateResponse *m);
/* Records the error that ended the request. 0 or -ENOMEM. */
int genreq_result_set_error(struct genreq_result *r, int code, const char *message);

/*
 * The result as one JSON object without a newline (malloc'd; NULL when out of memory):
 * {"index":I,"text":...,"token_ids":[...],"finish_reason":"length","usage":{...},
 *  "timings":{...}} (and "logprobs":[...] when they came) or {"index":I,"error":{"code":"NOT_FOUND","message":"..."}}.
 * index < 0 leaves "index" out. Text bytes that are not UTF-8 become U+FFFD.
 */
char *genreq_result_json(const struct genreq_result *r, long index);

#endif
