/*
 * engine_bench.c — serving-engine benchmark (bench/engine.sh drives it; results in
 * docs/PERFORMANCE.md "## Serving engine"). Three measurements on one engine (worker/engine/engine.h):
 *
 *   scale    aggregate decode tok/s at each stream count of --streams: N greedy requests
 *            (8-token prompts, distinct per stream) are brought into decode, then --steps
 *            engine steps are timed; the stream counts are interleaved within each of --reps
 *            repetitions and the median is reported, with the ratio to the first count, and
 *            the best repetition (wall_tps_best: on a loaded machine, the least disturbed).
 *   lora     the N-stream decode batch of each adapter set (--set LABEL=a,b,c,d: stream i
 *            uses adapter i mod 4), its steps in pairs (session 16): one step of the batch
 *            base-only (engine__set_lora_bypass: the same requests, KV and positions, no
 *            adapter) and one adapted, the order alternating pair by pair (A B, B A, ...),
 *            --steps pairs per run, the sets' runs rotating within each of --reps
 *            repetitions. The overhead is the median over every pair of the pair's ratio
 *            adapted / base, in process CPU time and (apart) in wall time, with the spread:
 *            the pairs' p25-p75 and the range of the repetitions' own medians. A pair is two
 *            steps ~0.1 s apart, so the load a neighbour puts on the memory bus is nearly
 *            the same for both (until session 15 base and adapted were separate runs of 16
 *            steps, seconds apart, and the table moved by several points between runs).
 *   prefill  --prefill-prompts prompts of --prefill-len tokens submitted at once (max_new 1):
 *            time until all have their first token, and each one's ttft.
 *
 * The machine is shared, so every figure comes with process CPU time (getrusage, all threads
 * of the pool): "cpu tok/s" = tokens / (CPU seconds / threads), the rate the same work would
 * have on `threads` dedicated cores. Ratios use it. Wall-clock rates are printed beside it.
 * Output: one JSON object per line on stdout (jansson), a human summary on stderr.
 */
#include "bench_util.h"
#include "engine.h"
#include "engine_internal.h"
#include "err.h"
#include "hotrepl.h"
#include "kern.h"
#include "log.h"
#include "lora.h"
#include "matmul.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define MAX_COUNTS 16
#define MAX_SETS 8
#define MAX_ADAPTERS 32
#define MAX_STREAMS 256
#define MAX_REPS 64
#define MAX_STEPS 256

struct opts {
    const char *model_dir;
    int threads;
    const char *mode;
    size_t counts[MAX_COUNTS], n_counts;
    uint32_t steps, warm, reps;
    size_t streams;                       /* lora mode */
    const char *ad_name[MAX_ADAPTERS], *ad_dir[MAX_ADAPTERS];
    size_t n_ad;
    const char *set_label[MAX_SETS];
    const char *set_names[MAX_SETS][4];
    size_t n_sets;
    uint32_t prefill_prompts, prefill_len, step_tokens;
    uint64_t kv_mib;
    enum dtype kv_dtype;                  /* --kv-dtype */
    bool one_tenant;                      /* prefill: all prompts from one tenant */
    enum lora_pack lora_weights;          /* --lora-weights */
    int lora_only;                        /* --lora-only: 0 pairs, 1 every step base-only,
                                           * 2 every step adapted (for perf record) */
    int ps_pair[2];                       /* --panel-streams-pair A,B (0: not given) */
};

/* Counts the TOKEN events of each stream (user = stream index + 1). */
struct counter {
    size_t n;
    uint64_t tokens[MAX_STREAMS];
    uint64_t total;
    double ttft_ms[MAX_STREAMS];
    size_t finished;
};

static void on_event(const struct engine_event *ev, void *ud)
{
    struct counter *c = ud;
    size_t i = (size_t)(uintptr_t)ev->user - 1;
    if (i >= c->n)
        return;
    if (ev->kind == ENGINE_EV_TOKEN && ev->token >= 0) {
        c->tokens[i]++;
        c->total++;
    } else if (ev->kind == ENGINE_EV_FINISH) {
        c->ttft_ms[i] = ev->ttft_ms;
        c->finished++;
    }
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of v[0..n), linear between order statistics. */
static double quantile(const double *v, size_t n, double q)
{
    static double s[MAX_REPS * MAX_STEPS];
    if (n == 0 || n > sizeof s / sizeof s[0])
        return 0;
    memcpy(s, v, n * sizeof *v);
    qsort(s, n, sizeof *s, cmp_double);
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    return i + 1 < n ? s[i] + (pos - (double)i) * (s[i + 1] - s[i]) : s[i];
}

static double median(const double *v, size_t n) { return quantile(v, n, 0.5); }

/*
 * A distribution-free 95 % confidence interval of the median of v[0..n) (session 19): the
 * order statistics of ranks n/2 -+ 1.96 sqrt(n)/2 (the binomial count of samples under the
 * median, normal approximation), so a figure's resolution is printed beside it: at 8
 * streams a pair's ratio spreads over +-5 points (p25-p75), and 100 pairs resolve the
 * median to about +-1.5 points. It covers the pairs' scatter within one run only: runs of
 * the same binary minutes apart have differed by more (docs/PERFORMANCE.md, session 19).
 */
static void median_ci(const double *v, size_t n, double *lo, double *hi)
{
    static double s[MAX_REPS * MAX_STEPS];
    *lo = *hi = 0;
    if (n == 0 || n > sizeof s / sizeof s[0])
        return;
    memcpy(s, v, n * sizeof *v);
    qsort(s, n, sizeof *s, cmp_double);
    const double h = 0.98 * sqrt((double)n); /* 1.96 sqrt(n) / 2 */
    double a = floor((double)n / 2 - h), b = ceil((double)n / 2 + h); /* 1-based ranks */
    size_t ia = a < 1 ? 0 : (size_t)a - 1, ib = b > (double)n ? n - 1 : (size_t)b - 1;
    *lo = s[ia];
    *hi = s[ib];
}


struct sample {
    double wall, cpu, other; /* seconds, seconds, neighbours' share of the machine */
    uint64_t tokens;
    double step_cpu[MAX_STEPS];  /* CPU seconds of each timed step */
    double step_wall[MAX_STEPS]; /* wall seconds of each timed step */
    float step_cyc[MAX_STEPS][MATMUL_CYC_N]; /* --lora-cycles: the fused job's counters over each
                                          * timed step (matmul.h matmul_lora_cycles_read) */
};

/* --lora-cycles: on, and the counters' clock against bench_now() from the start */
static bool g_cycles;
static double g_cyc_t0;
static uint64_t g_cyc_c0;

/* Steps until no request is active (after cancelling them all). */
static int drain(struct engine *e, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        engine_cancel(e, ids[i]); /* a finished one is ERR_NOT_FOUND: fine */
    size_t active = 1;
    while (active) {
        int rc = engine_step(e, &active);
        if (rc)
            return rc;
    }
    return 0;
}

/*
 * One decode measurement: n streams, stream i with adapter names[i % n_names] (n_names 0 =
 * base), brought into decode, `warm` steps, then `steps` timed steps. paired: the timed
 * steps alternate base-only and adapted in pairs (lora mode): pair k is steps 2k and 2k + 1,
 * the base-only one first when (k + seed) is even; step_cpu/step_wall[2k] is then the base
 * step's, [2k + 1] the adapted one's, whichever ran first.
 */
static int decode_run(struct engine *e, struct counter *c, size_t n, const char *const *names,
                      size_t n_names, uint32_t warm, uint32_t steps, uint32_t seed,
                      bool paired, int only, const int *ps_pair, struct sample *out)
{
    int32_t prompts[MAX_STREAMS][8];
    uint64_t ids[MAX_STREAMS];
    memset(c, 0, sizeof *c);
    c->n = n;
    for (size_t i = 0; i < n; i++) {
        prompts[i][0] = 1;
        for (size_t k = 1; k < 8; k++) /* distinct per stream, round and k */
            prompts[i][k] = (int32_t)(100 + (seed * 7919u + i * 131u + k * 17u) % 30000u);
        struct engine_request rq = {
            .prompt = prompts[i], .n_prompt = 8, .max_new = warm + steps + 64,
            .temperature = 0, .top_p = 1, .repeat_penalty = 1, .ignore_eos = true,
            .tenant = 1, .adapter = n_names ? names[i % n_names] : NULL, .adapter_scale = 1,
            .priority = ENGINE_PRIO_NORMAL, .user = (void *)(uintptr_t)(i + 1)};
        int rc = engine_submit(e, &rq, &ids[i]);
        if (rc) {
            fprintf(stderr, "engine_bench: submit failed: %s\n", err_str(rc));
            return rc;
        }
    }
    size_t active;
    int rc;
    for (;;) { /* every stream has its first token: all are decoding */
        size_t ready = 0;
        for (size_t i = 0; i < n; i++)
            ready += c->tokens[i] > 0;
        if (ready == n)
            break;
        if ((rc = engine_step(e, &active)))
            return rc;
    }
    for (uint32_t s = 0; s < warm; s++)
        if ((rc = engine_step(e, &active)))
            return rc;
    uint64_t t0 = c->total;
    struct bench_load ld;
    bench_load_begin(&ld);
    double w0 = bench_now(), c0 = cpu_seconds();
    for (uint32_t s = 0; s < steps; s++) {
        /* paired: within pair k = s / 2, the base-only step first when (k + seed) is even */
        const bool first = s % 2 == 0, base_first = (s / 2 + seed) % 2 == 0;
        const bool base_turn = first == base_first; /* the step's place in its pair */
        const bool base = paired && (only ? only == 1 : base_turn);
        const uint32_t slot = !paired ? s : base_turn ? s / 2 * 2 : s / 2 * 2 + 1;
        if (paired && ps_pair) /* --panel-streams-pair: A in the "base" slot, B in the other */
            kern_set_panel_streams(ps_pair[base ? 0 : 1]);
        else if (paired)
            engine__set_lora_bypass(e, base);
        uint64_t cy0[MATMUL_CYC_N], cy1[MATMUL_CYC_N];
        if (g_cycles)
            matmul_lora_cycles_read(cy0);
        double cs = cpu_seconds(), ws = bench_now();
        rc = engine_step(e, &active);
        out->step_wall[slot] = bench_now() - ws;
        out->step_cpu[slot] = cpu_seconds() - cs;
        if (g_cycles) {
            matmul_lora_cycles_read(cy1);
            for (int q = 0; q < MATMUL_CYC_N; q++)
                out->step_cyc[slot][q] = (float)(cy1[q] - cy0[q]);
        }
        if (rc)
            break;
    }
    if (paired)
        engine__set_lora_bypass(e, false);
    if (ps_pair)
        kern_set_panel_streams(ps_pair[0]);
    if (rc)
        return rc;
    out->cpu = cpu_seconds() - c0;
    out->wall = bench_now() - w0;
    out->other = bench_load_end(&ld);
    out->tokens = c->total - t0;
    if (out->tokens != (uint64_t)n * steps) {
        fprintf(stderr, "engine_bench: %llu tokens in %u steps of %zu streams (expected %llu)\n",
                (unsigned long long)out->tokens, steps, n, (unsigned long long)n * steps);
        return ERR_STATE;
    }
    return drain(e, ids, n);
}

static void emit(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (s)
        puts(s);
    free(s);
    fflush(stdout);
    json_decref(o);
}

static int mode_scale(struct engine *e, struct counter *c, const struct opts *o)
{
    static struct sample smp[MAX_COUNTS][MAX_REPS];
    for (uint32_t r = 0; r < o->reps; r++)
        for (size_t k = 0; k < o->n_counts; k++) {
            /* rotate the order so no count always runs first after a pause */
            size_t j = (k + r) % o->n_counts;
            int rc = decode_run(e, c, o->counts[j], NULL, 0, o->warm, o->steps,
                                r * 97 + (uint32_t)j, false, 0, NULL, &smp[j][r]);
            if (rc)
                return rc;
        }
    double base_cpu = 0, base_wall = 0;
    for (size_t k = 0; k < o->n_counts; k++) {
        double wall_tps[MAX_REPS], cpu_tps[MAX_REPS], other[MAX_REPS];
        for (uint32_t r = 0; r < o->reps; r++) {
            wall_tps[r] = (double)smp[k][r].tokens / smp[k][r].wall;
            cpu_tps[r] = (double)smp[k][r].tokens / (smp[k][r].cpu / o->threads);
            other[r] = smp[k][r].other;
        }
        double mw = median(wall_tps, o->reps), mc = median(cpu_tps, o->reps), best = 0;
        /* the best repetition: on a shared machine, the one least disturbed by neighbours */
        for (uint32_t r = 0; r < o->reps; r++)
            best = wall_tps[r] > best ? wall_tps[r] : best;
        if (k == 0) {
            base_wall = mw;
            base_cpu = mc;
        }
        json_t *j = json_pack("{s:s, s:I, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "mode",
                              "scale", "streams", (json_int_t)o->counts[k], "threads",
                              o->threads, "steps", (json_int_t)o->steps, "wall_tps", mw,
                              "wall_tps_best", best, "cpu_tps", mc,
                              "ratio_cpu", mc / base_cpu, "ratio_wall", mw / base_wall,
                              "neighbour_load", median(other, o->reps));
        emit(j);
        fprintf(stderr, "streams %3zu: %7.2f tok/s wall, %7.2f tok/s cpu, x%.2f (cpu) x%.2f (wall)\n",
                o->counts[k], mw, mc, mc / base_cpu, mw / base_wall);
    }
    return 0;
}

/*
 * --lora-cycles: the median over pairs of each counter's CPU milliseconds a step, for the step
 * in the pair's first place ("base": base-only, or knob A) and the other, and their difference.
 * Counters in the clock of matmul_lora_cycles_now, turned into ms by its rate against
 * bench_now() over the whole run.
 */
static void print_cycles(const struct sample *sm, const struct opts *o)
{
    static const char *const names[MATMUL_CYC_N] = {"base rows", "shrink", "expand", "tasks",
                                                "job x participants"};
    const double per_ms = (double)(matmul_lora_cycles_now() - g_cyc_c0) /
                          ((bench_now() - g_cyc_t0) * 1e3);
    const size_t n_pairs = (size_t)o->reps * o->steps;
    static double v[2][MAX_REPS * MAX_STEPS / 2];
    fprintf(stderr, "  fused job, CPU ms a step (median of pairs; clock %.3f GHz):",
            per_ms / 1e6);
    for (int q = 0; q < MATMUL_CYC_N; q++) {
        for (uint32_t r = 0; r < o->reps; r++)
            for (uint32_t k = 0; k < o->steps; k++)
                for (int h = 0; h < 2; h++)
                    v[h][(size_t)r * o->steps + k] = sm[r].step_cyc[2 * k + h][q] / per_ms;
        const double a = median(v[0], n_pairs), b = median(v[1], n_pairs);
        fprintf(stderr, "%s %s %.2f / %.2f", q ? "," : "", names[q], b, a);
    }
    /* the step's CPU time outside the fused jobs (norms, attention, sampling, other jobs,
     * the pool between jobs) */
    for (uint32_t r = 0; r < o->reps; r++)
        for (uint32_t k = 0; k < o->steps; k++)
            for (int h = 0; h < 2; h++)
                v[h][(size_t)r * o->steps + k] = 1e3 * sm[r].step_cpu[2 * k + h] -
                                                 sm[r].step_cyc[2 * k + h][MATMUL_CYC_JOB] / per_ms;
    fprintf(stderr, ", rest of the step %.2f / %.2f", median(v[1], n_pairs),
            median(v[0], n_pairs));
    fprintf(stderr, " (%s / %s)\n", o->ps_pair[0] ? "B" : "adapted", o->ps_pair[0] ? "A" : "base");
}

static int mode_lora(struct engine *e, struct counter *c, const struct opts *o)
{
    static struct sample smp[MAX_SETS][MAX_REPS];
    const uint32_t steps = 2 * o->steps; /* pairs of steps */
    for (uint32_t r = 0; r < o->reps; r++)
        for (size_t k = 0; k < o->n_sets; k++) {
            size_t j = (k + r) % o->n_sets; /* rotate the sets' order */
            /* the knob's pairs: both steps adapted by the set, or base without one */
            const bool knob = o->ps_pair[0] != 0, none = knob && !o->set_names[j][0];
            int rc = decode_run(e, c, o->streams, none ? NULL : o->set_names[j], none ? 0 : 4,
                                o->warm, steps, r * 97 + (uint32_t)j, true, o->lora_only,
                                knob ? o->ps_pair : NULL, &smp[j][r]);
            if (rc)
                return rc;
        }
    const size_t n_pairs = (size_t)o->reps * o->steps;
    static double rc_[MAX_REPS * MAX_STEPS / 2], rw[MAX_REPS * MAX_STEPS / 2];
    static double base_cpu[MAX_REPS * MAX_STEPS / 2], set_cpu[MAX_REPS * MAX_STEPS / 2];
    for (size_t j = 0; j < o->n_sets; j++) {
        double rep_med[MAX_REPS], other[MAX_REPS], cpu_tps[MAX_REPS];
        for (uint32_t r = 0; r < o->reps; r++) {
            const struct sample *sm = &smp[j][r];
            for (uint32_t k = 0; k < o->steps; k++) {
                size_t i = (size_t)r * o->steps + k;
                base_cpu[i] = sm->step_cpu[2 * k];
                set_cpu[i] = sm->step_cpu[2 * k + 1];
                rc_[i] = set_cpu[i] / base_cpu[i];
                rw[i] = sm->step_wall[2 * k + 1] / sm->step_wall[2 * k];
            }
            rep_med[r] = median(rc_ + (size_t)r * o->steps, o->steps);
            other[r] = sm->other;
            cpu_tps[r] = (double)sm->tokens / (sm->cpu / o->threads);
        }
        double lo = rep_med[0], hi = rep_med[0];
        for (uint32_t r = 1; r < o->reps; r++) {
            lo = rep_med[r] < lo ? rep_med[r] : lo;
            hi = rep_med[r] > hi ? rep_med[r] : hi;
        }
        const double mrc = median(rc_, n_pairs), mrw = median(rw, n_pairs);
        double ci_lo, ci_hi;
        median_ci(rc_, n_pairs, &ci_lo, &ci_hi);
        const double mb = median(base_cpu, n_pairs), ms = median(set_cpu, n_pairs);
        json_t *js = json_pack(
            "{s:s, s:s, s:I, s:i, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
            "s:f, s:f, s:f, s:f, s:f, s:f}",
            "mode", "lora", "set", o->set_label[j], "streams", (json_int_t)o->streams,
            "threads", o->threads, "pairs", (json_int_t)o->steps, "reps", (json_int_t)o->reps,
            "pairs_total", (json_int_t)n_pairs, "cpu_tps_mixed", median(cpu_tps, o->reps),
            "base_step_cpu_ms", 1e3 * mb, "step_cpu_ms", 1e3 * ms, "slowdown_cpu_steps",
            ms / mb, "slowdown_cpu", mrc, "slowdown_cpu_p25", quantile(rc_, n_pairs, 0.25),
            "slowdown_cpu_p75", quantile(rc_, n_pairs, 0.75), "slowdown_cpu_ci_lo", ci_lo,
            "slowdown_cpu_ci_hi", ci_hi, "slowdown_cpu_rep_min", lo,
            "slowdown_cpu_rep_max", hi, "slowdown_wall", mrw, "slowdown_wall_p25",
            quantile(rw, n_pairs, 0.25), "slowdown_wall_p75", quantile(rw, n_pairs, 0.75),
            "neighbour_load", median(other, o->reps));
        emit(js);
        fprintf(stderr, "%-8s: %zu pairs; %s step: %+.1f%% cpu (median's 95%% CI "
                "%+.1f..%+.1f; p25-p75 %+.1f..%+.1f, repetitions %+.1f..%+.1f), %+.1f%% wall; "
                "median steps %.2f / %.2f ms cpu\n",
                o->set_label[j], n_pairs, o->ps_pair[0] ? "B / A" : "adapted / base",
                100 * (mrc - 1), 100 * (ci_lo - 1), 100 * (ci_hi - 1),
                100 * (quantile(rc_, n_pairs, 0.25) - 1), 100 * (quantile(rc_, n_pairs, 0.75) - 1),
                100 * (lo - 1), 100 * (hi - 1), 100 * (mrw - 1), 1e3 * ms, 1e3 * mb);
        if (g_cycles)
            print_cycles(smp[j], o);
    }
    return 0;
}

static int mode_prefill(struct engine *e, struct counter *cn, const struct opts *o)
{
    size_t n = o->prefill_prompts, len = o->prefill_len;
    int32_t *p = malloc(n * len * sizeof *p);
    if (!p)
        return -ENOMEM;
    double walls[MAX_REPS], cpus[MAX_REPS], ttft_med[MAX_REPS], ttft_max[MAX_REPS];
    double other[MAX_REPS];
    int rc = 0;
    for (uint32_t r = 0; r < o->reps && !rc; r++) {
        struct counter *c = cn;
        memset(c, 0, sizeof *c);
        c->n = n;
        uint64_t ids[MAX_STREAMS];
        struct bench_load ld;
        bench_load_begin(&ld);
        double w0 = bench_now(), c0 = cpu_seconds();
        for (size_t i = 0; i < n && !rc; i++) {
            int32_t *q = p + i * len;
            q[0] = 1;
            for (size_t k = 1; k < len; k++) /* distinct prompts: no prefix hit */
                q[k] = (int32_t)(100 + (r * 7919u + i * 104729u + k * 31u) % 30000u);
            struct engine_request rq = {
                .prompt = q, .n_prompt = len, .max_new = 1, .temperature = 0, .top_p = 1,
                .repeat_penalty = 1, .ignore_eos = true, .tenant = o->one_tenant ? 1 : 1 + i,
                .priority = ENGINE_PRIO_NORMAL, .user = (void *)(uintptr_t)(i + 1)};
            rc = engine_submit(e, &rq, &ids[i]);
        }
        size_t active = 1;
        while (!rc && active)
            rc = engine_step(e, &active);
        cpus[r] = cpu_seconds() - c0;
        walls[r] = bench_now() - w0;
        other[r] = bench_load_end(&ld);
        if (!rc && c->finished != n)
            rc = ERR_STATE;
        ttft_med[r] = median(c->ttft_ms, n);
        double mx = 0;
        for (size_t i = 0; i < n; i++)
            mx = c->ttft_ms[i] > mx ? c->ttft_ms[i] : mx;
        ttft_max[r] = mx;
    }
    free(p);
    if (rc) {
        fprintf(stderr, "engine_bench: prefill failed: %s\n", err_str(rc));
        return rc;
    }
    double mw = median(walls, o->reps), mc = median(cpus, o->reps);
    double toks = (double)n * (double)len;
    json_t *j = json_pack("{s:s, s:b, s:I, s:I, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                          "mode", "prefill", "one_tenant", o->one_tenant, "prompts", (json_int_t)n, "prompt_len",
                          (json_int_t)len, "threads", o->threads, "step_tokens",
                          (json_int_t)o->step_tokens, "wall_s", mw, "cpu_s", mc, "wall_tps",
                          toks / mw, "cpu_tps", toks / (mc / o->threads), "ttft_p50_ms",
                          median(ttft_med, o->reps), "ttft_max_ms", median(ttft_max, o->reps),
                          "neighbour_load", median(other, o->reps));
    emit(j);
    fprintf(stderr, "prefill %zu x %zu: %.2f s wall (%.1f tok/s), %.2f s cpu (%.1f tok/s per "
            "%d cores), ttft p50 %.0f ms, last %.0f ms\n", n, len, mw, toks / mw, mc,
            toks / (mc / o->threads), o->threads, median(ttft_med, o->reps),
            median(ttft_max, o->reps));
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
"usage: engine_bench --model-dir DIR --mode scale|lora|prefill [options]\n"
"  --threads N          compute threads (default 2)\n"
"  --reps N             repetitions, interleaved; medians reported (default 5)\n"
"  --steps N            timed decode steps per measurement (default 16; lora: pairs of\n"
"                       steps, one base-only and one adapted)\n"
"  --warm N             untimed decode steps first (default 2)\n"
"  --streams LIST       scale: stream counts, e.g. 1,2,4,8,16; lora: one count (default 8)\n"
"  --adapter NAME=DIR   load an adapter (repeatable)\n"
"  --set LABEL=A,B,C,D  lora: an adapter set of 4 loaded names (repeatable)\n"
"  --prefill N          prefill: prompts submitted at once (default 4)\n"
"  --prefill-len N      prefill: tokens per prompt (default 1024)\n"
"  --step-tokens N      engine max_step_tokens (default 512)\n"
"  --one-tenant         prefill: every prompt from one tenant (default: one tenant each,\n"
"                       so the engine shares each step's prefill budget between them)\n"
"  --kv-mib N           KV pool (default 512)\n"
"  --kv-dtype T         KV cache element type: f32 (default), f16, bf16, int8, fp8\n"
"  --lora-weights auto|bf16|int8  how adapters' weights are packed (default auto)\n"
"  --lora-cycles        lora: per step, the fused LoRA job's time by kind (base rows,\n"
"                       shrink, expand, tasks, job; matmul.h matmul_lora_cycles_enable);\n"
"                       run base steps in the fused job too (CLOCHER_FWD_ONE_JOB=1) to\n"
"                       compare them\n"
"  --lora-only base|adapted  lora: every timed step of that kind, not pairs (to profile one\n"
"                       kind with perf record; the ratios printed are then ~1)\n"
"  --panel-streams-pair A,B  lora mode: each pair runs one step with\n"
"                       kern_set_panel_streams(A) and one with B (1, 2 or 4), the order\n"
"                       alternating, both adapted by each --set or, without one, base-only;\n"
"                       the ratios are B / A (a kernel variant measured in one process:\n"
"                       ~+-1 point where separate runs swing by 10-30 %%)\n");
}

static int parse_counts(const char *s, struct opts *o)
{
    o->n_counts = 0;
    while (*s) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0 || v > MAX_STREAMS || o->n_counts == MAX_COUNTS)
            return -1;
        o->counts[o->n_counts++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return o->n_counts ? 0 : -1;
}

static int parse_set(char *s, struct opts *o)
{
    char *eq = strchr(s, '=');
    if (!eq || o->n_sets == MAX_SETS)
        return -1;
    *eq = 0;
    o->set_label[o->n_sets] = s;
    char *save = NULL;
    size_t k = 0;
    for (char *t = strtok_r(eq + 1, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (k == 4)
            return -1;
        o->set_names[o->n_sets][k++] = t;
    }
    if (k != 4)
        return -1;
    o->n_sets++;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.threads = 2, .steps = 16, .warm = 2, .reps = 5, .streams = 8,
                     .prefill_prompts = 4, .prefill_len = 1024, .step_tokens = 512,
                     .kv_mib = 512, .kv_dtype = DT_F32};
    o.counts[0] = 8;
    o.n_counts = 1;
    static const struct option lo[] = {
        {"model-dir", 1, 0, 'm'}, {"mode", 1, 0, 'M'},     {"threads", 1, 0, 't'},
        {"reps", 1, 0, 'r'},      {"steps", 1, 0, 's'},    {"warm", 1, 0, 'w'},
        {"streams", 1, 0, 'n'},   {"adapter", 1, 0, 'a'},  {"set", 1, 0, 'S'},
        {"prefill", 1, 0, 'p'},   {"prefill-len", 1, 0, 'l'}, {"step-tokens", 1, 0, 'T'},
        {"kv-mib", 1, 0, 'k'}, {"kv-dtype", 1, 0, 'D'},    {"help", 0, 0, 'h'},     {"one-tenant", 0, 0, 'o'},
        {"lora-weights", 1, 0, 'L'}, {"lora-only", 1, 0, 'O'},
        {"panel-streams-pair", 1, 0, 'P'}, {"lora-cycles", 0, 0, 'Y'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o.model_dir = optarg; break;
        case 'M': o.mode = optarg; break;
        case 't': o.threads = atoi(optarg); break;
        case 'r': o.reps = (uint32_t)atoi(optarg); break;
        case 's': o.steps = (uint32_t)atoi(optarg); break;
        case 'w': o.warm = (uint32_t)atoi(optarg); break;
        case 'n':
            if (parse_counts(optarg, &o)) {
                fprintf(stderr, "engine_bench: bad --streams '%s'\n", optarg);
                return 2;
            }
            o.streams = o.counts[0];
            break;
        case 'a': {
            char *eq = strchr(optarg, '=');
            if (!eq || o.n_ad == MAX_ADAPTERS) {
                fprintf(stderr, "engine_bench: bad --adapter '%s' (NAME=DIR)\n", optarg);
                return 2;
            }
            *eq = 0;
            o.ad_name[o.n_ad] = optarg;
            o.ad_dir[o.n_ad++] = eq + 1;
            break;
        }
        case 'S':
            if (parse_set(optarg, &o)) {
                fprintf(stderr, "engine_bench: bad --set (LABEL=A,B,C,D)\n");
                return 2;
            }
            break;
        case 'p': o.prefill_prompts = (uint32_t)atoi(optarg); break;
        case 'l': o.prefill_len = (uint32_t)atoi(optarg); break;
        case 'T': o.step_tokens = (uint32_t)atoi(optarg); break;
        case 'k': o.kv_mib = (uint64_t)atoll(optarg); break;
        case 'D':
            if (dtype_kv_from_name(optarg, &o.kv_dtype) != 0) {
                fprintf(stderr, "engine_bench: bad --kv-dtype '%s' (f32, f16, bf16, int8, fp8)\n",
                        optarg);
                return 2;
            }
            break;
        case 'o': o.one_tenant = true; break;
        case 'L':
            if (lora_pack_parse(optarg, &o.lora_weights))
                return 2;
            break;
        case 'O':
            if (strcmp(optarg, "base") && strcmp(optarg, "adapted")) {
                fprintf(stderr, "engine_bench: bad --lora-only '%s' (base, adapted)\n", optarg);
                return 2;
            }
            o.lora_only = strcmp(optarg, "base") ? 2 : 1;
            break;
        case 'P':
            if (sscanf(optarg, "%d,%d", &o.ps_pair[0], &o.ps_pair[1]) != 2 ||
                o.ps_pair[0] < 1 || o.ps_pair[0] > 4 || o.ps_pair[1] < 1 || o.ps_pair[1] > 4) {
                fprintf(stderr, "engine_bench: bad --panel-streams-pair '%s' (A,B: 1, 2 or 4)\n",
                        optarg);
                return 2;
            }
            break;
        case 'Y':
            g_cycles = true;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o.model_dir || !o.mode || o.threads < 1 || o.reps < 1 || o.reps > MAX_REPS ||
        o.steps < 1 || o.steps > MAX_STEPS || o.prefill_prompts < 1 || o.prefill_prompts > MAX_STREAMS ||
        o.prefill_len < 2 || o.step_tokens < 16 || o.kv_mib < 1) {
        usage(stderr);
        return 2;
    }
    if (o.ps_pair[0] && strcmp(o.mode, "lora")) {
        fprintf(stderr, "engine_bench: --panel-streams-pair runs in lora mode\n");
        return 2;
    }
    if (o.ps_pair[0] && !o.n_sets) { /* one set of the knob's pairs, no adapters */
        o.set_label[0] = "panel-streams";
        o.n_sets = 1;
    }
    if (!strcmp(o.mode, "lora") && (o.steps > MAX_STEPS / 2 || o.n_sets == 0)) {
        fprintf(stderr, "engine_bench: lora mode wants one --set at least and --steps <= %d "
                "(pairs)\n", MAX_STEPS / 2);
        return 2;
    }
    size_t max_n = 0;
    for (size_t k = 0; k < o.n_counts; k++)
        max_n = o.counts[k] > max_n ? o.counts[k] : max_n;
    if (!strcmp(o.mode, "prefill"))
        max_n = o.prefill_prompts;
    struct counter *cnt = calloc(1, sizeof *cnt);
    struct engine_config cfg = {.model_dir = o.model_dir, .n_threads = o.threads,
                                .kv_budget_bytes = o.kv_mib << 20, .kv_dtype = o.kv_dtype,
                                .max_step_tokens = o.step_tokens,
                                .max_running = (uint32_t)(max_n > 16 ? max_n : 16),
                                .prefix_cache = false, .lora_pack = (int)o.lora_weights};
    struct engine *e = NULL;
    int rc = cnt ? engine_create(&cfg, on_event, cnt, &e) : -ENOMEM;
    if (rc) {
        fprintf(stderr, "engine_bench: engine_create(%s) failed: %s\n", o.model_dir,
                err_str(rc));
        free(cnt);
        return 3;
    }
    /* the page cache in 2 MiB folios, as clocherd's workers and inference-engine have it
     * (hotrepl.h; IE_HUGE_PAGES=0 turns it off): a freshly written model read through 4 KiB
     * entries decoded at half speed here, which is not what a server runs; the repacked
     * matrices' stored rows stay out of the mapping, as there */
    struct hotrepl_huge_report huge;
    rc = hotrepl_hugify_default_model(o.model_dir, engine_model(e), &huge);
    for (size_t i = 0; i < o.n_ad && !rc; i++)
        rc = engine_load_adapter(e, o.ad_name[i], o.ad_dir[i]);
    if (!rc && g_cycles) {
        matmul_lora_cycles_enable(true);
        g_cyc_t0 = bench_now();
        g_cyc_c0 = matmul_lora_cycles_now();
    }
    if (!rc) {
        if (!strcmp(o.mode, "scale"))
            rc = mode_scale(e, cnt, &o);
        else if (!strcmp(o.mode, "lora"))
            rc = mode_lora(e, cnt, &o);
        else if (!strcmp(o.mode, "prefill"))
            rc = mode_prefill(e, cnt, &o);
        else {
            usage(stderr);
            rc = ERR_FORMAT;
        }
    }
    engine_destroy(e);
    free(cnt);
    return rc ? 1 : 0;
}
