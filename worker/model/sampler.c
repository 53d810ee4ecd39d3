/*
 * sampler.c — token sampling and stop strings (sampler.h).
 *
 * Cost per token: one pass over the vocabulary for the softmax, plus, when a cut is active,
 * a selection that avoids sorting the whole vocabulary: top-k keeps a heap of k candidates;
 * top-p alone first drops every token whose probability is below (1 - top_p) / (V - 1),
 * which can never belong to the nucleus (llama2.c's bound: if such a token were in it, the
 * tokens from it to the end, at most V - 1 of them, would weigh less than 1 - top_p, so the
 * tokens before it would already have reached top_p); min-p drops tokens below its threshold.
 * Only the survivors are sorted.
 */
#include "sampler.h"
#include "rng.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    float e;    /* exp((logit - max) / temperature): unnormalized probability, max = 1 */
    int32_t id;
};

struct sampler {
    struct sampler_params p;
    uint32_t vocab;
    uint64_t rng;
    float *logits;      /* [vocab] the logits after the repetition penalty */
    const float *drawn; /* [vocab] what the last sampler_sample drew from: logits above, or the
                         * caller's own (greedy with nothing to penalize), for sampler_logprobs */
    struct cand *cand;  /* [vocab] */
    uint32_t *seen;     /* [vocab] penalty pass that last touched each token (dedup) */
    uint32_t stamp;
};

void sampler_params_default(struct sampler_params *p)
{
    *p = (struct sampler_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                 .repeat_penalty = 1.0f, .repeat_window = 64, .seed = 0};
}

int sampler_params_check(const struct sampler_params *p)
{
    /* written so that NaN fails every test */
    if (!(p->temperature >= 0.0f && p->temperature <= 1e6f)) {
        LOG_ERR("sampler: temperature %g must be >= 0 and at most 1e6 (0 = greedy)",
                (double)p->temperature);
        return ERR_RANGE;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        LOG_ERR("sampler: top_p %g must be in (0, 1] (1 = off)", (double)p->top_p);
        return ERR_RANGE;
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        LOG_ERR("sampler: min_p %g must be in [0, 1] (0 = off)", (double)p->min_p);
        return ERR_RANGE;
    }
    if (!(p->repeat_penalty > 0.0f && p->repeat_penalty <= 1e6f)) {
        LOG_ERR("sampler: repeat_penalty %g must be > 0 and at most 1e6 (1 = off)",
                (double)p->repeat_penalty);
        return ERR_RANGE;
    }
    return 0;
}

/* uniform in [0, 1) with 53 random bits */
static double uniform(struct sampler *s) { return rng_unit_f64(rng_splitmix64(&s->rng)); }

int sampler_create(const struct sampler_params *p, uint32_t vocab_size, struct sampler **out)
{
    int rc = sampler_params_check(p);
    if (rc)
        return rc;
    if (vocab_size == 0) {
        LOG_ERR("sampler: the vocabulary is empty");
        return ERR_RANGE;
    }
    struct sampler *s = calloc(1, sizeof *s);
    if (!s)
        goto oom;
    s->p = *p;
    s->vocab = vocab_size;
    s->logits = malloc((size_t)vocab_size * sizeof *s->logits);
    s->cand = malloc((size_t)vocab_size * sizeof *s->cand);
    s->seen = calloc(vocab_size, sizeof *s->seen);
    if (!s->logits || !s->cand || !s->seen)
        goto oom;
    sampler_reset(s);
    *out = s;
    return 0;
oom:
    LOG_ERR("sampler: out of memory for a vocabulary of %u tokens", vocab_size);
    sampler_destroy(s);
    return -ENOMEM;
}

void sampler_destroy(struct sampler *s)
{
    if (!s)
        return;
    free(s->logits);
    free(s->cand);
    free(s->seen);
    free(s);
}

void sampler_reset(struct sampler *s) { s->rng = s->p.seed; }

/*
 * Two passes the compiler vectorizes (the greedy step of every stream ran the old one-branch-
 * per-logit scan: ~1% of an 8-stream step on the engine's thread): the largest value lane by
 * lane, where `v > m` is false for NaN so NaN never wins, then the first index holding it,
 * found block by block. Ties go to the lowest id as before (-0 == +0 as well); with no non-NaN
 * value the answer is 0, and with only -inf and NaN the first -inf, as the scan gave.
 */
#define ARGMAX_LANES 16

int32_t sampler_argmax(const float *x, size_t n)
{
    float lm[ARGMAX_LANES];
    for (int j = 0; j < ARGMAX_LANES; j++)
        lm[j] = -INFINITY;
    size_t i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int j = 0; j < ARGMAX_LANES; j++)
            lm[j] = x[i + j] > lm[j] ? x[i + j] : lm[j];
    float m = -INFINITY;
    for (int j = 0; j < ARGMAX_LANES; j++)
        m = lm[j] > m ? lm[j] : m;
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    size_t b = 0;
    for (; b + ARGMAX_LANES <= n; b += ARGMAX_LANES) {
        int hit = 0;
        for (int j = 0; j < ARGMAX_LANES; j++)
            hit |= x[b + j] == m;
        if (hit)
            break;
    }
    for (; b < n; b++)
        if (x[b] == m)
            return (int32_t)b;
    return 0; /* every value NaN */
}

/*
 * 0 if logits are usable: no NaN, and not all infinite (all -inf leaves nothing to draw, all
 * +inf has no ordering); else ERR_STATE, logged once. A model with a NaN weight gets here, and
 * sampling token 0 from it would hide the fault (issue 15). Cheap: one pass, vectorizable.
 */
static int logits_check(const float *logits, uint32_t n)
{
    uint32_t n_nan = 0, n_inf = 0;
    for (uint32_t i = 0; i < n; i++) {
        n_nan += isnan(logits[i]) != 0;
        n_inf += isinf(logits[i]) != 0;
    }
    if (n_nan == 0 && n_inf < n)
        return 0;
    LOG_ERR("sampler: non-finite logits (%" PRIu32 " NaN, %" PRIu32 " infinite of %" PRIu32
            "): the model's weights or activations are broken",
            n_nan, n_inf, n);
    return ERR_STATE;
}

/* s->logits = logits with NaN as -inf (sampler_candidates) and the repetition penalty applied. */
static void penalize(struct sampler *s, const float *logits, const int32_t *history, size_t n)
{
    for (uint32_t i = 0; i < s->vocab; i++)
        s->logits[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    s->drawn = s->logits;
    const float pen = s->p.repeat_penalty;
    if (pen == 1.0f || n == 0)
        return;
    size_t from = s->p.repeat_window && n > s->p.repeat_window ? n - s->p.repeat_window : 0;
    if (++s->stamp == 0) { /* wrapped: old stamps could collide */
        memset(s->seen, 0, (size_t)s->vocab * sizeof *s->seen);
        s->stamp = 1;
    }
    for (size_t i = from; i < n; i++) {
        int32_t id = history[i];
        if (id < 0 || (uint32_t)id >= s->vocab || s->seen[id] == s->stamp)
            continue; /* each distinct token once */
        s->seen[id] = s->stamp;
        float *l = &s->logits[id];
        *l = *l > 0.0f ? *l / pen : *l * pen;
    }
}

/* a ranks before b: more probable, or as probable with a lower id */
static int before(const struct cand *a, const struct cand *b)
{
    return a->e > b->e || (a->e == b->e && a->id < b->id);
}

static int cmp_cand(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Min-heap (by rank: the root is the worst) of the k best of c[0..n); returns k' = min(k, n)
 * with them in c[0..k') sorted best first. */

/* Restores the heap below j in c[0..k) (the worst candidate at the root). */
static void sift_down(struct cand *c, size_t k, size_t j)
{
    for (;;) {
        size_t w = j, l = 2 * j + 1, r = l + 1;
        if (l < k && before(&c[w], &c[l]))
            w = l;
        if (r < k && before(&c[w], &c[r]))
            w = r;
        if (w == j)
            return;
        struct cand t = c[j];
        c[j] = c[w];
        c[w] = t;
        j = w;
    }
}
static size_t select_top_k(struct cand *c, size_t n, size_t k)
{
    if (k >= n) {
        qsort(c, n, sizeof *c, cmp_cand);
        return n;
    }
    /* heapify c[0..k) with the worst at the root */
    for (size_t i = k / 2; i-- > 0;) {
        sift_down(c, k, i);
    }
    for (size_t i = k; i < n; i++) {
        if (!before(&c[i], &c[0]))
            continue;
        c[0] = c[i];
        sift_down(c, k, 0);
    }
    qsort(c, k, sizeof *c, cmp_cand);
    return k;
}

/* Fills s->cand[0..*n) with the kept candidates; returns their total (unnormalized) mass. */
static double cut(struct sampler *s, size_t *n_out)
{
    const uint32_t V = s->vocab;
    float max = s->logits[sampler_argmax(s->logits, V)];
    if (max == -INFINITY) { /* nothing is possible: the lowest id, as argmax */
        s->cand[0] = (struct cand){1.0f, 0};
        *n_out = 1;
        return 1.0;
    }
    /* a division, not a product with 1/T: 1/T overflows for tiny T, and 0 * inf is NaN */
    const float t = s->p.temperature;
    double sum = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        float e = expf((s->logits[i] - max) / t);
        s->cand[i] = (struct cand){e, (int32_t)i};
        sum += e;
    }
    const bool top_k = s->p.top_k > 0 && s->p.top_k < V;
    const bool top_p = s->p.top_p < 1.0f, min_p = s->p.min_p > 0.0f;
    if (!top_k && !top_p && !min_p) {
        *n_out = V;
        return sum;
    }

    size_t n;
    double mass; /* what top-p's fraction refers to: the top-k survivors' mass */
    if (top_k) {
        n = select_top_k(s->cand, V, s->p.top_k);
        mass = 0.0;
        for (size_t i = 0; i < n; i++)
            mass += s->cand[i].e;
    } else {
        /* Drop what no cut can keep before sorting. The most probable token (e = 1) always
         * stays: the threshold is capped at 1. */
        double thr = min_p ? s->p.min_p : 0.0;
        if (top_p && V > 1) {
            double c = (1.0 - (double)s->p.top_p) / (double)(V - 1) * sum;
            thr = c > thr ? c : thr;
        }
        thr = thr < 1.0 ? thr : 1.0;
        n = 0;
        for (uint32_t i = 0; i < V; i++)
            if ((double)s->cand[i].e >= thr)
                s->cand[n++] = s->cand[i];
        qsort(s->cand, n, sizeof *s->cand, cmp_cand);
        mass = sum;
    }

    /* s->cand[0..n) is sorted, best first: each cut keeps a prefix */
    double kept = 0.0;
    size_t keep = 0;
    const double target = top_p ? (double)s->p.top_p * mass : INFINITY;
    const float floor_e = min_p ? s->p.min_p : 0.0f; /* min_p * the largest (e = 1) */
    while (keep < n && kept < target && s->cand[keep].e >= floor_e) {
        kept += s->cand[keep].e;
        keep++;
    }
    if (keep == 0) { /* unreachable (the first has e = 1 >= floor_e) but cheap to rule out */
        kept = s->cand[0].e;
        keep = 1;
    }
    *n_out = keep;
    return kept;
}

void sampler_candidates(struct sampler *s, const float *logits, const int32_t *history,
                        size_t n_history, int32_t *ids, float *probs, size_t *n_out)
{
    penalize(s, logits, history, n_history);
    if (s->p.temperature == 0.0f) {
        ids[0] = sampler_argmax(s->logits, s->vocab);
        probs[0] = 1.0f;
        *n_out = 1;
        return;
    }
    size_t n;
    double mass = cut(s, &n);
    for (size_t i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = (float)(s->cand[i].e / mass);
    }
    *n_out = n;
}

int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history,
                       size_t n_history)
{
    int rc = logits_check(logits, s->vocab);
    if (rc)
        return rc;
    /* greedy with nothing to penalize: logits_check left no NaN, so penalize's copy would be
     * the logits as they are; one pass over the vocabulary instead of two (for 8 decode
     * streams of a 32k vocabulary the copies were ~0.5% of an int4 step) */
    if (s->p.temperature == 0.0f && (s->p.repeat_penalty == 1.0f || n_history == 0)) {
        s->drawn = logits;
        return sampler_argmax(logits, s->vocab);
    }
    penalize(s, logits, history, n_history);
    if (s->p.temperature == 0.0f)
        return sampler_argmax(s->logits, s->vocab);
    size_t n;
    double mass = cut(s, &n);
    double r = uniform(s) * mass, acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += s->cand[i].e;
        if (r < acc)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* r rounded up to the total */
}

/* ---- stop strings ------------------------------------------------------------------------ */

int sampler_stop_init(struct sampler_stop *st, const char *const *stops, size_t n)
{
    memset(st, 0, sizeof *st);
    if (n == 0)
        return 0;
    st->stops = calloc(n, sizeof *st->stops);
    if (!st->stops)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(stops[i]);
        if (len == 0) {
            LOG_ERR("sampler: stop string %zu is empty", i);
            sampler_stop_fini(st);
            return ERR_RANGE;
        }
        if (!(st->stops[i] = strdup(stops[i])))
            goto oom;
        st->n_stops = i + 1;
        st->max_len = len > st->max_len ? len : st->max_len;
    }
    return 0;
oom:
    LOG_ERR("sampler: out of memory for %zu stop strings", n);
    sampler_stop_fini(st);
    return -ENOMEM;
}

void sampler_stop_fini(struct sampler_stop *st)
{
    for (size_t i = 0; i < st->n_stops; i++)
        free(st->stops[i]);
    free(st->stops);
    free(st->buf);
    free(st->out);
    memset(st, 0, sizeof *st);
}

void sampler_stop_reset(struct sampler_stop *st)
{
    st->len = 0;
    st->stopped = false;
}

/* Grows *buf to hold need bytes; allocates it even for 0 (the callers' memcpy/memmove want a
 * non-NULL buffer whatever the length). */
static int reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc = nc > SIZE_MAX / 2 ? need : nc * 2;
    char *nb = realloc(*buf, nc);
    if (!nb) {
        LOG_ERR("sampler: out of memory for %zu bytes of text", need);
        return -ENOMEM;
    }
    *buf = nb;
    *cap = nc;
    return 0;
}

/* Moves buf[0..n) to out (the caller's view of it), keeps the rest held back. */
static int emit_prefix(struct sampler_stop *st, size_t n, const char **emit, size_t *n_emit)
{
    int rc = reserve(&st->out, &st->out_cap, n ? n : 1);
    if (rc)
        return rc;
    memcpy(st->out, st->buf, n);
    memmove(st->buf, st->buf + n, st->len - n);
    st->len -= n;
    *emit = st->out;
    *n_emit = n;
    return 0;
}

int sampler_stop_push(struct sampler_stop *st, const char *text, size_t len, const char **emit,
                      size_t *n_emit, bool *stopped)
{
    *emit = "";
    *n_emit = 0;
    *stopped = st->stopped;
    if (st->stopped)
        return 0;
    if (len > SIZE_MAX - st->len) {
        LOG_ERR("sampler: stop-string buffer overflow");
        return -ENOMEM;
    }
    int rc = reserve(&st->buf, &st->cap, st->len + len);
    if (rc)
        return rc;
    if (len) /* an empty piece may come with a NULL text: memcpy wants none */
        memcpy(st->buf + st->len, text, len);
    st->len += len;
    if (st->n_stops == 0)
        return emit_prefix(st, st->len, emit, n_emit);

    /* the earliest complete stop string, if any: the held-back text held none */
    size_t at = SIZE_MAX;
    for (size_t i = 0; i < st->n_stops; i++) {
        const char *hit = memmem(st->buf, st->len, st->stops[i], strlen(st->stops[i]));
        if (hit && (size_t)(hit - st->buf) < at)
            at = (size_t)(hit - st->buf);
    }
    if (at != SIZE_MAX) {
        if ((rc = emit_prefix(st, at, emit, n_emit)))
            return rc;
        st->len = 0;
        st->stopped = *stopped = true;
        return 0;
    }
    /* hold back the longest tail that begins some stop string */
    size_t hold = 0;
    for (size_t k = st->max_len - 1 < st->len ? st->max_len - 1 : st->len; k > 0 && !hold; k--)
        for (size_t i = 0; i < st->n_stops; i++)
            if (strlen(st->stops[i]) > k &&
                memcmp(st->buf + st->len - k, st->stops[i], k) == 0) {
                hold = k;
                break;
            }
    return emit_prefix(st, st->len - hold, emit, n_emit);
}

void sampler_stop_flush(struct sampler_stop *st, const char **emit, size_t *n_emit)
{
    /* the text is already in buf: hand it out from there, then forget it */
    *emit = st->len ? st->buf : "";
    *n_emit = st->len;
    st->len = 0;
}

/* ---- log-probabilities ---- */

static float lp_clamp(double x)
{
    return x > 0.0 ? 0.0f : x < (double)SAMPLER_LOGPROB_FLOOR ? SAMPLER_LOGPROB_FLOOR : (float)x;
}

void sampler_logprobs(const struct sampler *s, int32_t chosen, uint32_t n_top, float *chosen_lp,
                      struct sampler_logprob *top, uint32_t *n_out)
{
    const uint32_t V = s->vocab;
    const double t = s->p.temperature > 0.0f ? (double)s->p.temperature : 1.0;
    /* log-sum-exp around the largest: every term <= 1, the sum >= 1 */
    const float *L = s->drawn ? s->drawn : s->logits; /* see struct sampler */
    int32_t am = sampler_argmax(L, V);
    double max = (double)L[am] / t, sum = 0.0;
    if (isinf(max)) { /* every logit -inf (sampler_sample drew the lowest id) */
        *chosen_lp = chosen == am ? 0.0f : SAMPLER_LOGPROB_FLOOR;
        *n_out = 0;
        if (n_top && top)
            top[0] = (struct sampler_logprob){am, 0.0f}, *n_out = 1;
        return;
    }
    for (uint32_t i = 0; i < V; i++)
        sum += exp((double)L[i] / t - max);
    const double lse = max + log(sum);
    *chosen_lp = chosen >= 0 && (uint32_t)chosen < V
                     ? lp_clamp((double)L[chosen] / t - lse)
                     : SAMPLER_LOGPROB_FLOOR;
    /* the n best by insertion into a sorted list: n <= 20, and after the first few tokens
     * almost none enters it */
    uint32_t n = n_top < SAMPLER_MAX_TOP_LOGPROBS ? n_top : SAMPLER_MAX_TOP_LOGPROBS, k = 0;
    n = n < V ? n : V;
    for (uint32_t i = 0; i < V && n; i++) {
        float x = L[i];
        if (k == n && !(x > top[k - 1].logprob))
            continue; /* logprob holds the raw logit until the end; a tie keeps the lower id */
        uint32_t j = k < n ? k++ : n - 1;
        while (j > 0 && x > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (struct sampler_logprob){(int32_t)i, x};
    }
    for (uint32_t j = 0; j < k; j++)
        top[j].logprob = lp_clamp((double)top[j].logprob / t - lse);
    *n_out = k;
}
