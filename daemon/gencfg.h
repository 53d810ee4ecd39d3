/*
 * gencfg.h — the served model's generation defaults (generation_config.json, carried by the
 * converter into chat.ie.json's "sampling"), read once at start and applied by the gateway to
 * each request that leaves a sampling field unset.
 *
 * Precedence, field by field (docs/DAEMON.md, "Sampling defaults"): what the request sets
 * (gRPC SamplingParams has presence; the HTTP API's JSON fields map onto it), else the model's
 * generation_config, else the server's default (gw_req.h: temperature 0.8, top_p 1, top_k 0,
 * repetition_penalty 1).
 */
#ifndef CLOCHER_DAEMON_GENCFG_H
#define CLOCHER_DAEMON_GENCFG_H

#include "config.h"
#include "msg.h"

#include "clocher/v1/inference.pb-c.h"

#define GENCFG_FILE "chat.ie.json"

/*
 * Reads <model_dir>/chat.ie.json's "sampling" into *out (all unset when the file or the key is
 * absent: a model without generation_config.json). 0, or ERR_FORMAT / ERR_RANGE logged once
 * naming the file and the field (not JSON, a value that is not a number, out of the sampler's
 * range: temperature in [0, 1e6], top_p in (0, 1], top_k an integer in [0, 2^31),
 * repetition_penalty in (0, 1e6]).
 */
int gencfg_load(const char *model_dir, struct config_model_sampling *out);

/* Sets each field of the record *out that the request's sampling `s` (NULL = none given)
 * leaves unset and the model sets; gw_req_generate calls it before its range checks. Inline
 * (header only) so that what compiles gw_req.c alone, the fuzzers, needs nothing more. */
static inline void gencfg_apply(const struct config_model_sampling *m,
                                const Clocher__V1__SamplingParams *s,
                                struct shm_msg_generate *out)
{
    if (m->has_temperature && !(s && s->has_temperature))
        out->temperature = m->temperature;
    if (m->has_top_p && !(s && s->has_top_p))
        out->top_p = m->top_p;
    if (m->has_top_k && !(s && s->has_top_k))
        out->top_k = m->top_k;
    if (m->has_repetition_penalty && !(s && s->has_repetition_penalty))
        out->repeat_penalty = m->repetition_penalty;
}

#endif
