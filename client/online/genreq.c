/*
 * genreq.c — GenerateRequests from flags and JSON lines, Generate results as JSON (genreq.h).
 *
 * Flags and JSON keys share one setter per field (set_field), so `--top-p 0.9` and
 * {"top_p": 0.9} cannot drift apart: a flag's text is parsed into the typed value first.
 */
#include "genreq.h"

#include "err.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT_IDS_MAX (1u << 20)

static int fail(char *err, size_t cap, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t cap, int code, const char *fmt, ...)
{
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return code;
}

genreq_t *genreq_new(void)
{
    genreq_t *r = malloc(sizeof *r);
    Clocher__V1__SamplingParams *sp = malloc(sizeof *sp);
    if (!r || !sp) {
        free(r);
        free(sp);
        return NULL;
    }
    clocher__v1__generate_request__init(r);
    clocher__v1__sampling_params__init(sp);
    r->sampling = sp;
    return r;
}

void genreq_free(genreq_t *r)
{
    if (r)
        protobuf_c_message_free_unpacked(&r->base, NULL);
}

genreq_t *genreq_copy(const genreq_t *r)
{
    /* pack + unpack: a deep copy whose parts all come from malloc, as genreq_free expects */
    size_t n = protobuf_c_message_get_packed_size(&r->base);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    protobuf_c_message_pack(&r->base, buf);
    genreq_t *c = clocher__v1__generate_request__unpack(NULL, n, buf);
    free(buf);
    if (c && !c->sampling) {
        Clocher__V1__SamplingParams *sp = malloc(sizeof *sp);
        if (!sp) {
            genreq_free(c);
            return NULL;
        }
        clocher__v1__sampling_params__init(sp);
        c->sampling = sp;
    }
    return c;
}

/* ---- typed setters ---- */

static int replace_str(char **slot, const char *s, size_t len)
{
    char *d = malloc(len + 1);
    if (!d)
        return -ENOMEM;
    memcpy(d, s, len);
    d[len] = '\0';
    free(*slot);
    *slot = d;
    return 0;
}

static void clear_prompt(genreq_t *r)
{
    if (r->input_case == CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT)
        free(r->prompt);
    else if (r->input_case == CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS)
        protobuf_c_message_free_unpacked(&r->prompt_ids->base, NULL);
    r->input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT__NOT_SET;
    r->prompt = NULL;
}

int genreq_set_prompt(genreq_t *r, const char *text, size_t len)
{
    char *d = malloc(len + 1);
    if (!d)
        return -ENOMEM;
    memcpy(d, text, len);
    d[len] = '\0';
    clear_prompt(r);
    r->input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT;
    r->prompt = d;
    return 0;
}

/* Takes over ids. */
static int set_prompt_ids(genreq_t *r, int32_t *ids, size_t n)
{
    Clocher__V1__TokenIds *t = malloc(sizeof *t);
    if (!t) {
        free(ids);
        return -ENOMEM;
    }
    clocher__v1__token_ids__init(t);
    t->ids = ids;
    t->n_ids = n;
    clear_prompt(r);
    r->input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS;
    r->prompt_ids = t;
    return 0;
}

static void clear_stop(genreq_t *r)
{
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    r->stop = NULL;
    r->n_stop = 0;
}

static int add_stop(genreq_t *r, const char *s, size_t len)
{
    char **v = realloc(r->stop, (r->n_stop + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    r->stop = v;
    v[r->n_stop] = NULL;
    if (replace_str(&v[r->n_stop], s, len) < 0)
        return -ENOMEM;
    r->n_stop++;
    return 0;
}

static int parse_priority(const char *s, Clocher__V1__Priority *out)
{
    if (strcmp(s, "normal") == 0)
        *out = CLOCHER__V1__PRIORITY__PRIORITY_NORMAL;
    else if (strcmp(s, "high") == 0)
        *out = CLOCHER__V1__PRIORITY__PRIORITY_HIGH;
    else if (strcmp(s, "low") == 0)
        *out = CLOCHER__V1__PRIORITY__PRIORITY_LOW;
    else
        return ERR_FORMAT;
    return 0;
}

/* A typed value for set_field: which member is used depends on the field. */
struct value {
    const char *s;
    size_t len;
    double f;
    uint64_t u;
    bool b;
};

static int set_field(genreq_t *r, enum genreq_field f, const struct value *v)
{
    Clocher__V1__SamplingParams *sp = r->sampling;
    switch (f) {
    case GENREQ_PROMPT:
        return genreq_set_prompt(r, v->s, v->len);
    case GENREQ_MODEL:
        return replace_str(&r->model, v->s, v->len);
    case GENREQ_ADAPTER:
        return replace_str(&r->adapter, v->s, v->len);
    case GENREQ_REQUEST_ID:
        return replace_str(&r->request_id, v->s, v->len);
    case GENREQ_ADD_BOS:
        r->has_add_bos = true;
        r->add_bos = v->b;
        return 0;
    case GENREQ_NO_BOS:
        r->has_add_bos = true;
        r->add_bos = false;
        return 0;
    case GENREQ_ADAPTER_SCALE:
        r->has_adapter_scale = true;
        r->adapter_scale = (float)v->f;
        return 0;
    case GENREQ_MAX_TOKENS:
        r->has_max_tokens = true;
        r->max_tokens = (uint32_t)v->u;
        return 0;
    case GENREQ_STOP:
        return add_stop(r, v->s, v->len);
    case GENREQ_PRIORITY:
        r->has_priority = true;
        return parse_priority(v->s, &r->priority);
    case GENREQ_TEMPERATURE:
        sp->has_temperature = true;
        sp->temperature = (float)v->f;
        return 0;
    case GENREQ_TOP_K:
        sp->has_top_k = true;
        sp->top_k = (uint32_t)v->u;
        return 0;
    case GENREQ_TOP_P:
        sp->has_top_p = true;
        sp->top_p = (float)v->f;
        return 0;
    case GENREQ_MIN_P:
        sp->has_min_p = true;
        sp->min_p = (float)v->f;
        return 0;
    case GENREQ_REPETITION_PENALTY:
        sp->has_repetition_penalty = true;
        sp->repetition_penalty = (float)v->f;
        return 0;
    case GENREQ_SEED:
        sp->has_seed = true;
        sp->seed = v->u;
        return 0;
    case GENREQ_LOGPROBS:
        /* the daemon bounds the count (INVALID_ARGUMENT above 20, naming top_logprobs) */
        r->has_logprobs = r->logprobs = true;
        r->has_top_logprobs = true;
        r->top_logprobs = (uint32_t)v->u;
        return 0;
    case GENREQ_PROMPT_IDS:
    case GENREQ_N_FIELDS:
        break;
    }
    return ERR_STATE;
}

enum kind { K_STR, K_F32, K_U32, K_U64, K_BOOL, K_PRIORITY, K_IDS, K_FLAG };

static const struct {
    const char *json;  /* key in a batch line; NULL = flag only */
    const char *flag;
    enum kind kind;
} fields[GENREQ_N_FIELDS] = {
    [GENREQ_PROMPT] = {"prompt", "--prompt", K_STR},
    [GENREQ_PROMPT_IDS] = {"prompt_ids", "--prompt-ids", K_IDS},
    [GENREQ_MODEL] = {"model", "--model", K_STR},
    [GENREQ_ADD_BOS] = {"add_bos", "--add-bos", K_BOOL},
    [GENREQ_NO_BOS] = {NULL, "--no-bos", K_FLAG},
    [GENREQ_ADAPTER] = {"adapter", "--adapter", K_STR},
    [GENREQ_ADAPTER_SCALE] = {"adapter_scale", "--adapter-scale", K_F32},
    [GENREQ_MAX_TOKENS] = {"max_tokens", "--max-tokens", K_U32},
    [GENREQ_STOP] = {"stop", "--stop", K_STR},
    [GENREQ_PRIORITY] = {"priority", "--priority", K_PRIORITY},
    [GENREQ_REQUEST_ID] = {"request_id", "--request-id", K_STR},
    [GENREQ_TEMPERATURE] = {"temperature", "--temperature", K_F32},
    [GENREQ_TOP_K] = {"top_k", "--top-k", K_U32},
    [GENREQ_TOP_P] = {"top_p", "--top-p", K_F32},
    [GENREQ_MIN_P] = {"min_p", "--min-p", K_F32},
    [GENREQ_REPETITION_PENALTY] = {"repetition_penalty", "--repetition-penalty", K_F32},
    [GENREQ_SEED] = {"seed", "--seed", K_U64},
    [GENREQ_LOGPROBS] = {"logprobs", "--logprobs", K_U32},
};

int genreq_parse_ids(const char *s, int32_t **ids, size_t *n, char *err, size_t cap)
{
    size_t count = 0, alloc = 16;
    int32_t *v = malloc(alloc * sizeof *v);
    if (!v)
        return -ENOMEM;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r' &&
             *end != ',')) {
            int w = 0;
            while (p[w] && p[w] != ' ' && p[w] != ',' && w < 32)
                w++;
            free(v);
            return fail(err, cap, ERR_FORMAT, "'%.*s' is not a token id (0..%d)", w, p,
                        INT32_MAX);
        }
        if (count == PROMPT_IDS_MAX) {
            free(v);
            return fail(err, cap, ERR_RANGE, "more than %u token ids", PROMPT_IDS_MAX);
        }
        if (count == alloc) {
            int32_t *nv = realloc(v, 2 * alloc * sizeof *nv);
            if (!nv) {
                free(v);
                return -ENOMEM;
            }
            v = nv;
            alloc *= 2;
        }
        v[count++] = (int32_t)x;
        p = end;
    }
    if (count == 0) {
        free(v);
        return fail(err, cap, ERR_FORMAT, "no token ids");
    }
    *ids = v;
    *n = count;
    return 0;
}

/* ---- flags ---- */

int genreq_opt_set(genreq_t *r, int opt, const char *arg, char *err, size_t cap)
{
    if (opt < GENREQ_OPT_BASE || opt >= GENREQ_OPT_BASE + GENREQ_N_FIELDS)
        return 0;
    enum genreq_field f = (enum genreq_field)(opt - GENREQ_OPT_BASE);
    const char *flag = fields[f].flag;
    struct value v = {.s = arg, .len = arg ? strlen(arg) : 0};
    char *end;
    int rc;
    switch (fields[f].kind) {
    case K_IDS: {
        int32_t *ids;
        size_t n;
        char why[128];
        if ((rc = genreq_parse_ids(arg, &ids, &n, why, sizeof why)) < 0)
            return rc == -ENOMEM ? rc : fail(err, cap, ERR_USAGE, "%s: %s", flag, why);
        return set_prompt_ids(r, ids, n) < 0 ? -ENOMEM : 1;
    }
    case K_F32:
        errno = 0;
        v.f = strtod(arg, &end);
        if (errno || end == arg || *end || !isfinite(v.f) || fabs(v.f) > 3.4e38)
            return fail(err, cap, ERR_USAGE, "%s: expected a number, got '%s'", flag, arg);
        break;
    case K_U32:
    case K_U64: {
        errno = 0;
        unsigned long long x = strtoull(arg, &end, 10);
        uint64_t max = fields[f].kind == K_U32 ? UINT32_MAX : UINT64_MAX;
        if (errno || end == arg || *end || arg[0] == '-' || x > max)
            return fail(err, cap, ERR_USAGE, "%s: expected an integer in 0..%llu, got '%s'",
                        flag, (unsigned long long)max, arg);
        v.u = x;
        break;
    }
    case K_PRIORITY: {
        Clocher__V1__Priority p;
        if (parse_priority(arg, &p) < 0)
            return fail(err, cap, ERR_USAGE, "%s: expected normal, high or low, got '%s'",
                        flag, arg);
        break;
    }
    case K_BOOL:
        v.b = true;
        break;
    case K_STR:
    case K_FLAG:
        break;
    }
    rc = set_field(r, f, &v);
    if (rc == -ENOMEM)
        return fail(err, cap, rc, "out of memory");
    return rc < 0 ? rc : 1;
}

/* ---- JSON lines ---- */

static int json_field(genreq_t *r, enum genreq_field f, json_t *j, char *err, size_t cap)
{
    const char *key = fields[f].json;
    struct value v = {0};
    switch (fields[f].kind) {
    case K_STR:
        if (f == GENREQ_STOP && json_is_array(j)) {
            clear_stop(r);
            size_t i;
            json_t *e;
            json_array_foreach(j, i, e) {
                if (!json_is_string(e))
                    return fail(err, cap, ERR_FORMAT, "stop[%zu]: expected a string", i);
                if (add_stop(r, json_string_value(e), json_string_length(e)) < 0)
                    return -ENOMEM;
            }
            return 0;
        }
        if (!json_is_string(j))
            return fail(err, cap, ERR_FORMAT, "%s: expected a string%s", key,
                        f == GENREQ_STOP ? " or a list of strings" : "");
        v.s = json_string_value(j);
        v.len = json_string_length(j);
        if (f == GENREQ_STOP)
            clear_stop(r);
        break;
    case K_IDS: {
        if (!json_is_array(j) || json_array_size(j) == 0)
            return fail(err, cap, ERR_FORMAT, "prompt_ids: expected a non-empty list of token ids");
        size_t n = json_array_size(j);
        if (n > PROMPT_IDS_MAX)
            return fail(err, cap, ERR_RANGE, "prompt_ids: more than %u ids", PROMPT_IDS_MAX);
        int32_t *ids = malloc(n * sizeof *ids);
        if (!ids)
            return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(j, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT32_MAX) {
                free(ids);
                return fail(err, cap, ERR_FORMAT, "prompt_ids[%zu]: expected a token id (0..%d)",
                            i, INT32_MAX);
            }
            ids[i] = (int32_t)json_integer_value(e);
        }
        return set_prompt_ids(r, ids, n);
    }
    case K_F32:
        if (!json_is_number(j))
            return fail(err, cap, ERR_FORMAT, "%s: expected a number", key);
        v.f = json_number_value(j);
        if (!isfinite(v.f) || fabs(v.f) > 3.4e38)
            return fail(err, cap, ERR_RANGE, "%s: out of range", key);
        break;
    case K_U32:
    case K_U64: {
        if (!json_is_integer(j))
            return fail(err, cap, ERR_FORMAT, "%s: expected an integer", key);
        json_int_t x = json_integer_value(j);
        if (x < 0 || (fields[f].kind == K_U32 && x > (json_int_t)UINT32_MAX))
            return fail(err, cap, ERR_RANGE, "%s: expected an integer in 0..%s, got %lld", key,
                        fields[f].kind == K_U32 ? "4294967295" : "9223372036854775807",
                        (long long)x);
        v.u = (uint64_t)x;
        break;
    }
    case K_BOOL:
        if (!json_is_boolean(j))
            return fail(err, cap, ERR_FORMAT, "%s: expected true or false", key);
        v.b = json_is_true(j);
        break;
    case K_PRIORITY:
        if (!json_is_string(j))
            return fail(err, cap, ERR_FORMAT, "priority: expected \"normal\", \"high\" or \"low\"");
        v.s = json_string_value(j);
        if (strcmp(v.s, "normal") && strcmp(v.s, "high") && strcmp(v.s, "low"))
            return fail(err, cap, ERR_FORMAT,
                        "priority: expected \"normal\", \"high\" or \"low\", got \"%s\"", v.s);
        break;
    case K_FLAG:
        return ERR_STATE;
    }
    int rc = set_field(r, f, &v);
    return rc == -ENOMEM ? rc : rc < 0 ? fail(err, cap, rc, "%s: invalid", key) : 0;
}

int genreq_from_json(const char *line, size_t len, const genreq_t *defaults, genreq_t **out,
                     char *err, size_t cap)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fail(err, cap, ERR_FORMAT, "not JSON: %s (column %d)", je.text, je.column);
    int rc = 0;
    genreq_t *r = NULL;
    if (!json_is_object(root)) {
        rc = fail(err, cap, ERR_FORMAT, "expected a JSON object");
        goto out;
    }
    if (json_object_get(root, "prompt") && json_object_get(root, "prompt_ids")) {
        rc = fail(err, cap, ERR_FORMAT, "prompt and prompt_ids: give one of them");
        goto out;
    }
    r = defaults ? genreq_copy(defaults) : genreq_new();
    if (!r) {
        rc = -ENOMEM;
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        int f = -1;
        for (int i = 0; i < GENREQ_N_FIELDS; i++)
            if (fields[i].json && strcmp(fields[i].json, key) == 0)
                f = i;
        if (f < 0) {
            rc = fail(err, cap, ERR_FORMAT,
                      "unknown key \"%s\" (known keys: prompt, prompt_ids, model, add_bos, "
                      "adapter, adapter_scale, max_tokens, stop, priority, request_id, "
                      "temperature, top_k, top_p, min_p, repetition_penalty, seed)",
                      key);
            goto out;
        }
        if ((rc = json_field(r, (enum genreq_field)f, val, err, cap)) < 0)
            goto out;
    }
    if (r->input_case == CLOCHER__V1__GENERATE_REQUEST__INPUT__NOT_SET) {
        rc = fail(err, cap, ERR_FORMAT, "no prompt (give \"prompt\" or \"prompt_ids\")");
        goto out;
    }
    *out = r;
    r = NULL;
out:
    if (rc == -ENOMEM)
        fail(err, cap, rc, "out of memory");
    genreq_free(r);
    json_decref(root);
    return rc;
}

/* ---- names ---- */

const char *genreq_status_name(int code)
{
    static const char *const names[] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (code >= 0 && code < (int)(sizeof names / sizeof names[0]))
        return names[code];
    static _Thread_local char buf[24];
    snprintf(buf, sizeof buf, "CODE_%d", code);
    return buf;
}

const char *genreq_finish_name(int reason)
{
    switch (reason) {
    case CLOCHER__V1__FINISH_REASON__FINISH_REASON_EOS:
        return "eos";
    case CLOCHER__V1__FINISH_REASON__FINISH_REASON_LENGTH:
        return "length";
    case CLOCHER__V1__FINISH_REASON__FINISH_REASON_STOP:
        return "stop";
    case CLOCHER__V1__FINISH_REASON__FINISH_REASON_CONTEXT:
        return "context";
    case CLOCHER__V1__FINISH_REASON__FINISH_REASON_TOOL_CALL:
        return "tool_call";
    default:
        return "unspecified";
    }
}

/* ---- results ---- */

void genreq_result_init(struct genreq_result *r)
{
    memset(r, 0, sizeof *r);
}

void genreq_result_fini(struct genreq_result *r)
{
    json_decref(r->logprobs);
    free(r->text);
    free(r->ids);
    free(r->error_message);
    memset(r, 0, sizeof *r);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

int genreq_result_add(struct genreq_result *r, const Clocher__V1__GenerateResponse *m)
{
    size_t tl = m->text ? strlen(m->text) : 0;
    if (grow((void **)&r->text, &r->text_cap, r->text_len + tl + 1, 1) < 0 ||
        grow((void **)&r->ids, &r->ids_cap, r->n_ids + m->n_token_ids, sizeof *r->ids) < 0)
        return -ENOMEM;
    memcpy(r->text + r->text_len, m->text ? m->text : "", tl + 1);
    r->text_len += tl;
    if (m->n_token_ids)
        memcpy(r->ids + r->n_ids, m->token_ids, m->n_token_ids * sizeof *r->ids);
    r->n_ids += m->n_token_ids;
    for (size_t i = 0; i < m->n_logprobs; i++) {
        const Clocher__V1__TokenLogprob *l = m->logprobs[i];
        if (!r->logprobs && !(r->logprobs = json_array()))
            return -ENOMEM;
        json_t *top = json_array();
        for (size_t k = 0; top && k < l->n_top; k++)
            json_array_append_new(top, json_pack("[i, f]", (int)l->top[k]->id,
                                                 (double)l->top[k]->logprob));
        json_t *e = json_pack("{s:i, s:f, s:o}", "id", (int)l->id, "logprob", (double)l->logprob,
                              "top", top ? top : json_array());
        if (!e || json_array_append_new(r->logprobs, e) < 0)
            return -ENOMEM;
    }
    if (m->has_finish_reason) {
        r->has_finish = true;
        r->finish_reason = (int)m->finish_reason;
    }
    if (m->usage) {
        r->has_usage = true;
        r->prompt_tokens = m->usage->prompt_tokens;
        r->completion_tokens = m->usage->completion_tokens;
        r->cached_prompt_tokens = m->usage->cached_prompt_tokens;
    }
    if (m->timings) {
        r->has_timings = true;
        r->queue_ms = m->timings->queue_ms;
        r->ttft_ms = m->timings->ttft_ms;
        r->tpot_ms = m->timings->tpot_ms;
        r->e2e_ms = m->timings->e2e_ms;
    }
    return 0;
}

int genreq_result_set_error(struct genreq_result *r, int code, const char *message)
{
    char *m = strdup(message ? message : "");
    if (!m)
        return -ENOMEM;
    free(r->error_message);
    r->error_message = m;
    r->error_code = code;
    return 0;
}

/* The length of the valid UTF-8 sequence at p (1..4), or 0 if it is not one. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0xff >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string of bytes that should be UTF-8: invalid bytes become U+FFFD. */
static json_t *json_text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    char *clean = malloc(3 * n + 1);
    if (!clean)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k) {
            memcpy(clean + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(clean + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(clean, o);
    free(clean);
    return j;
}

char *genreq_result_json(const struct genreq_result *r, long index)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (index >= 0)
        json_object_set_new(o, "index", json_integer(index));
    if (r->error_code) {
        json_t *e = json_object();
        json_object_set_new(e, "code", json_string(genreq_status_name(r->error_code)));
        json_object_set_new(e, "message", json_text(r->error_message ? r->error_message : "",
                                                    r->error_message ? strlen(r->error_message) : 0));
        json_object_set_new(o, "error", e);
    } else {
        json_object_set_new(o, "text", json_text(r->text ? r->text : "", r->text_len));
        json_t *ids = json_array();
        for (size_t i = 0; i < r->n_ids; i++)
            json_array_append_new(ids, json_integer(r->ids[i]));
        json_object_set_new(o, "token_ids", ids);
        json_object_set_new(o, "finish_reason",
                            json_string(genreq_finish_name(r->has_finish ? r->finish_reason : 0)));
        if (r->has_usage) {
            json_t *u = json_object();
            json_object_set_new(u, "prompt_tokens", json_integer(r->prompt_tokens));
            json_object_set_new(u, "completion_tokens", json_integer(r->completion_tokens));
            json_object_set_new(u, "cached_prompt_tokens", json_integer(r->cached_prompt_tokens));
            json_object_set_new(o, "usage", u);
        }
        if (r->has_timings) {
            json_t *t = json_object();
            json_object_set_new(t, "queue_ms", json_real(r->queue_ms));
            json_object_set_new(t, "ttft_ms", json_real(r->ttft_ms));
            json_object_set_new(t, "tpot_ms", json_real(r->tpot_ms));
            json_object_set_new(t, "e2e_ms", json_real(r->e2e_ms));
            json_object_set_new(o, "timings", t);
        }
        if (r->logprobs)
            json_object_set(o, "logprobs", r->logprobs);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
