/*
 * test_engine.c — the serving engine (worker/engine/engine.h) on stories260K (f32 import) against the
 * reference forward pass (worker/model/forward.h) run on each request alone:
 *  - batched = alone: 16 greedy requests of mixed prompt lengths with staggered arrival and
 *    chunked prefill give the reference's ids (up to its first low-margin step) and every
 *    sampled logits row within 1e-4 of the reference's;
 *  - prefix reuse: a shared 256-token prefix is found (same tenant only), skips prefill work
 *    and gives identical output;
 *  - a tiny KV pool (admission waits, preemption), cancel mid-prefill, deadlines, the bounded
 *    queue and bad requests (each with its message).
 */
#include "testutil.h"
#include "mono.h"

#include "../forward/golden.h"
#include "../lora/peft.h"

#include "engine.h"
#include "engine_internal.h"
#include "err.h"
#include "forward.h"
#include "kern.h"
#include "kv.h"
#include "lora.h"
#include "model.h"
#include "sampler.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOL 1e-4f
#define MARGIN 0.01f /* reference steps below this margin may flip under reordered sums */
#define MAX_REQ 32

static struct golden g_gold;
static char *g_tmp, *g_dir;
static struct model *g_model;

/* ---- the reference, alone ------------------------------------------------------------------ */

struct ref {
    int32_t *ids;     /* [n] greedy continuation */
    float *logits;    /* [n][V] the row each id was chosen from */
    size_t n, cutoff; /* cutoff: first step with margin < MARGIN (n if none) */
};

/* The reference's LoRA hook: one adapter for every token. */
struct ref_lora {
    const struct lora_adapter *ad;
    float scale;
    float tmp[4096];
};

static void ref_hook(void *ud, uint32_t layer, enum lora_target t, const float *x, size_t n,
                     float *y, size_t ldy)
{
    struct ref_lora *rl = ud;
    assert_true(n * rl->ad->cfg.rank <= 4096);
    lora_apply_one(rl->ad, rl->scale, layer, t, x, n, y, ldy, rl->tmp);
}

static void ref_run_lora(const int32_t *prompt, size_t n_prompt, size_t n,
                         const struct lora_adapter *ad, float scale, struct ref *out)
{
    const size_t V = g_model->hp.vocab_size;
    struct forward_config cfg = {0};
    struct forward *f;
    assert_int_equal(forward_create(g_model, &cfg, &f), 0);
    static struct ref_lora rl;
    rl.ad = ad;
    rl.scale = scale;
    if (ad)
        forward_set_hook(f, ref_hook, &rl);
    out->ids = malloc(n * sizeof *out->ids);
    out->logits = malloc(n * V * sizeof *out->logits);
    out->n = n;
    out->cutoff = n;
    assert_int_equal(forward_eval(f, prompt, n_prompt, FORWARD_LOGITS_LAST, out->logits), 0);
    for (size_t i = 0; i < n; i++) {
        float *lg = out->logits + i * V;
        int32_t id = sampler_argmax(lg, V);
        float second = -INFINITY;
        for (size_t v = 0; v < V; v++)
            if ((int32_t)v != id && lg[v] > second)
                second = lg[v];
        if (lg[id] - second < MARGIN && out->cutoff == n)
            out->cutoff = i;
        out->ids[i] = id;
        if (i + 1 < n)
            assert_int_equal(forward_eval(f, &id, 1, FORWARD_LOGITS_LAST, lg + V), 0);
    }
    forward_destroy(f);
}

static void ref_run(const int32_t *prompt, size_t n_prompt, size_t n, struct ref *out)
{
    ref_run_lora(prompt, n_prompt, n, NULL, 0.0f, out);
}

static void ref_free(struct ref *r)
{
    free(r->ids);
    free(r->logits);
}

/* ---- capturing events ---------------------------------------------------------------------- */

struct got {
    uint64_t id;
    int32_t ids[512];
    size_t n;
    bool finished;
    enum engine_finish reason;
    uint32_t cached, prompt_tokens;
    int error;
    struct ref *ref;     /* for the logits tap */
    size_t logits_checked;
    float max_diff;
};

struct capture {
    struct got got[MAX_REQ];
    size_t n;
};

static void on_event(const struct engine_event *ev, void *ud)
{
    (void)ud;
    struct got *g = ev->user;
    if (!g)
        return; /* engine_generate's requests */
    assert_int_equal(ev->id, g->id);
    assert_false(g->finished);
    switch (ev->kind) {
    case ENGINE_EV_TOKEN:
        if (ev->token >= 0) {
            assert_true(g->n < 512);
            g->ids[g->n++] = ev->token;
        }
        break;
    case ENGINE_EV_FINISH:
        g->finished = true;
        g->reason = ev->reason;
        g->cached = ev->cached_tokens;
        g->prompt_tokens = ev->prompt_tokens;
        assert_int_equal(ev->generated_tokens, g->n);
        break;
    case ENGINE_EV_ERROR:
        g->error = ev->code;
        break;
    }
}

static void on_logits(void *ud, uint64_t id, uint32_t n_gen, const float *logits, size_t V)
{
    struct capture *c = ud;
    for (size_t i = 0; i < c->n; i++) {
        struct got *g = &c->got[i];
        if (g->id != id || !g->ref)
            continue;
        /* compare while the batched ids still follow the reference's */
        if (n_gen < g->ref->cutoff && n_gen < g->ref->n) {
            /* relative above 1: the paged attention's online softmax sums in another order
             * than the reference's, which moves logits of magnitude ~10 by ~1e-4 */
            const float *want = g->ref->logits + n_gen * V;
            for (size_t v = 0; v < V; v++) {
                float d = fabsf(logits[v] - want[v]) / fmaxf(1.0f, fabsf(want[v]));
                if (!(d <= g->max_diff))
                    g->max_diff = d;
            }
            g->logits_checked++;
        }
    }
}

static struct engine *make_engine(uint32_t step_tokens, uint32_t running, uint32_t queue,
                                  uint64_t budget, bool prefix, const char *snapshot)
{
    struct engine_config cfg = {
        .model_dir = g_dir,
        .n_threads = 2,
        .kv_budget_bytes = budget,
        .kv_dtype = DT_F32,
        .max_step_tokens = step_tokens,
        .max_running = running,
        .max_queue = queue,
        .prefix_cache = prefix,
        .snapshot_path = snapshot,
    };
    struct engine *e;
    assert_int_equal(engine_create(&cfg, on_event, NULL, &e), 0);
    return e;
}

static struct engine_request greedy_req(const int32_t *prompt, size_t n, uint32_t max_new,
                                        uint64_t tenant, struct got *g)
{
    struct engine_request r = {
        .prompt = prompt,
        .n_prompt = n,
        .max_new = max_new,
        .temperature = 0.0f,
        .top_p = 1.0f,
        .repeat_penalty = 1.0f,
        .tenant = tenant,
        .priority = ENGINE_PRIO_NORMAL,
        .user = g,
    };
    return r;
}

static void run_until_idle(struct engine *e, size_t max_steps)
{
    size_t active = 1;
    for (size_t s = 0; active && s < max_steps; s++)
        assert_int_equal(engine_step(e, &active), 0);
    assert_int_equal(active, 0);
}

/* ids must equal the reference's up to its cutoff */
static void assert_follows(const struct got *g, const struct ref *r, size_t want_n,
                           const char *what)
{
    if (g->n != want_n)
        fail_msg("%s: %zu tokens generated, expected %zu", what, g->n, want_n);
    for (size_t i = 0; i < g->n && i < r->cutoff; i++)
        if (g->ids[i] != r->ids[i])
            fail_msg("%s: token %zu is %d, the reference alone gives %d", what, i, g->ids[i],
                     r->ids[i]);
}

/* A long test text: case 4's prompt followed by its greedy continuation. [n] */
static int32_t *long_text(size_t *n)
{
    const struct golden_case *gc = &g_gold.cases[4];
    *n = gc->n_prompt + gc->n_greedy;
    int32_t *t = malloc(*n * sizeof *t);
    memcpy(t, gc->prompt, gc->n_prompt * sizeof *t);
    memcpy(t + gc->n_prompt, gc->greedy, gc->n_greedy * sizeof *t);
    return t;
}

/* ---- setup --------------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    assert_int_equal(kern_init(), 0);
    golden_load(&g_gold);
    g_dir = golden_import(DT_F32, &g_tmp);
    assert_int_equal(model_open(g_dir, 0, &g_model), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    model_close(g_model);
    tu_rmtree(g_tmp);
    free(g_tmp);
    free(g_dir);
    golden_free(&g_gold);
    return 0;
}

/* ---- 1. batched = alone -------------------------------------------------------------------- */

static void test_batched_equals_alone(void **state)
{
    (void)state;
    size_t n_long;
    int32_t *text = long_text(&n_long);
    /* 16 prompts: the 5 golden prompts, then slices of the long text (1..230 tokens) */
    const size_t lens[11] = {2, 5, 33, 64, 90, 119, 121, 150, 180, 200, 230};
    const int32_t *prompts[16];
    size_t plen[16];
    for (size_t i = 0; i < 5; i++) {
        prompts[i] = g_gold.cases[i].prompt;
        plen[i] = g_gold.cases[i].n_prompt;
    }
    for (size_t i = 0; i < 11; i++) {
        prompts[5 + i] = text;
        plen[5 + i] = lens[i];
    }
    const uint32_t max_new = 24;
    static struct capture cap;
    memset(&cap, 0, sizeof cap);
    struct ref refs[16];
    for (size_t i = 0; i < 16; i++)
        ref_run(prompts[i], plen[i], max_new, &refs[i]);

    /* chunked prefill (48 tokens a step), prefix cache on, three tenants */
    struct engine *e = make_engine(48, 16, 64, 0, true, NULL);
    engine__set_logits_tap(e, on_logits, &cap);
    cap.n = 16;
    size_t active;
    for (size_t i = 0; i < 16; i++) {
        struct got *g = &cap.got[i];
        g->ref = &refs[i];
        struct engine_request r = greedy_req(prompts[i], plen[i], max_new, i % 3, g);
        assert_int_equal(engine_submit(e, &r, &g->id), 0);
        if (i == 9 || i == 12) /* staggered: the rest arrive while others decode */
            for (int s = 0; s < 3; s++)
                assert_int_equal(engine_step(e, &active), 0);
    }
    run_until_idle(e, 2000);
    for (size_t i = 0; i < 16; i++) {
        struct got *g = &cap.got[i];
        char what[64];
        snprintf(what, sizeof what, "request %zu (%zu prompt tokens)", i, plen[i]);
        assert_true(g->finished);
        assert_int_equal(g->reason, ENGINE_FINISH_LENGTH);
        assert_follows(g, &refs[i], max_new, what);
        if (g->logits_checked == 0 || !(g->max_diff <= TOL))
            fail_msg("%s: %zu logits rows compared, max |batched - alone| / max(1, |alone|) = %g",
                     what,
                     g->logits_checked, (double)g->max_diff);
    }
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    assert_int_equal(m.requests_finished, 16);
    assert_int_equal(m.tokens_generated, 16 * max_new);
    assert_int_equal(m.running + m.waiting, 0);
    assert_int_equal(kv_pool_validate(engine__kv(e)), 0);
    assert_int_equal(m.kv_blocks_used, 0);
    engine_destroy(e);
    for (size_t i = 0; i < 16; i++)
        ref_free(&refs[i]);
    free(text);
}

/* engine_generate: the single-shot path gives the golden greedy ids. */
static void test_generate(void **state)
{
    (void)state;
    struct engine *e = make_engine(0, 0, 0, 0, true, NULL);
    for (size_t c = 0; c < g_gold.n_cases; c++) {
        const struct golden_case *gc = &g_gold.cases[c];
        struct engine_request r = greedy_req(gc->prompt, gc->n_prompt, 40, 0, NULL);
        int32_t *ids;
        size_t n;
        struct engine_event fin;
        assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
        assert_int_equal(n, 40);
        assert_int_equal(fin.reason, ENGINE_FINISH_LENGTH);
        for (size_t i = 0; i < n && i < gc->cutoff; i++)
            assert_int_equal(ids[i], gc->greedy[i]);
        free(ids);
    }
    engine_destroy(e);
}


/* engine_set_progress: called once per layer of every forward pass of a step (the worker's
 * heartbeat during long steps), and never again once removed. */
static void count_progress(void *ud) { ++*(size_t *)ud; }

static void test_progress_per_layer(void **state)
{
    (void)state;
    struct engine *e = make_engine(0, 0, 0, 0, false, NULL);
    size_t calls = 0;
    engine_set_progress(e, count_progress, &calls);
    const struct golden_case *gc = &g_gold.cases[0];
    struct engine_request r = greedy_req(gc->prompt, gc->n_prompt, 5, 0, NULL);
    int32_t *ids;
    size_t n;
    struct engine_event fin;
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    free(ids);
    /* one pass for the prompt (one chunk) and one per further token: 5 passes */
    size_t layers = 5; /* stories260K */
    assert_int_equal(calls, 5 * layers);
    engine_set_progress(e, NULL, NULL);
    r = greedy_req(gc->prompt, gc->n_prompt, 3, 0, NULL);
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    free(ids);
    assert_int_equal(calls, 5 * layers);
    engine_destroy(e);
}

/* ---- 2. prefix reuse ------------------------------------------------------------------------ */

static void test_prefix_reuse(void **state)
{
    (void)state;
    size_t n_long;
    int32_t *text = long_text(&n_long);
    /* two prompts sharing the first 256 tokens, then different tails */
    const size_t P = 256, tail = 20;
    int32_t *a = malloc((P + tail) * sizeof *a), *b = malloc((P + tail) * sizeof *b);
    memcpy(a, text, P * sizeof *a);
    memcpy(b, text, P * sizeof *b);
    for (size_t i = 0; i < tail; i++) {
        a[P + i] = g_gold.cases[3].prompt[1 + i % 20];
        b[P + i] = g_gold.cases[2].prompt[1 + i % 16];
    }
    const uint32_t max_new = 16;
    struct ref rb;
    ref_run(b, P + tail, max_new, &rb);

    struct engine *e = make_engine(64, 8, 16, 0, true, NULL);
    static struct capture cap;
    memset(&cap, 0, sizeof cap);
    struct engine_metrics m0, m1, m2;
    struct engine_request r = greedy_req(a, P + tail, max_new, 7, &cap.got[0]);
    assert_int_equal(engine_submit(e, &r, &cap.got[0].id), 0);
    run_until_idle(e, 200);
    assert_int_equal(cap.got[0].cached, 0);
    engine_get_metrics(e, &m0);
    assert_true(m0.tokens_prefilled >= P + tail);

    /* same tenant: the 256-token prefix is found, the prefill skips it */
    r = greedy_req(b, P + tail, max_new, 7, &cap.got[1]);
    assert_int_equal(engine_submit(e, &r, &cap.got[1].id), 0);
    run_until_idle(e, 200);
    engine_get_metrics(e, &m1);
    assert_int_equal(cap.got[1].cached, P);
    assert_true(m1.prefix_hit_tokens >= P);
    assert_int_equal(m1.tokens_prefilled - m0.tokens_prefilled, tail);
    assert_follows(&cap.got[1], &rb, max_new, "prefix hit");

    /* another tenant: no hit, the whole prompt is computed, same output */
    r = greedy_req(b, P + tail, max_new, 8, &cap.got[2]);
    assert_int_equal(engine_submit(e, &r, &cap.got[2].id), 0);
    run_until_idle(e, 200);
    engine_get_metrics(e, &m2);
    assert_int_equal(cap.got[2].cached, 0);
    assert_int_equal(m2.prefix_hit_tokens, m1.prefix_hit_tokens);
    assert_int_equal(m2.tokens_prefilled - m1.tokens_prefilled, P + tail);
    assert_follows(&cap.got[2], &rb, max_new, "other tenant");
    for (size_t i = 0; i < max_new; i++)
        assert_int_equal(cap.got[1].ids[i], cap.got[2].ids[i]);
    assert_int_equal(kv_pool_validate(engine__kv(e)), 0);
    engine_destroy(e);
    ref_free(&rb);
    free(a);
    free(b);
    free(text);
}

/* ---- 3. a tiny KV pool: admission waits, running requests are preempted ---------------------- */

static void test_pool_exhaustion(void **state)
{
    (void)state;
    size_t n_long;
    int32_t *text = long_text(&n_long);
    /* stories260K: a 16-token block is 5 layers x 2 x 16 x 32 floats = 20480 bytes; 12 blocks
     * (192 positions) for 6 requests that each grow to 5 blocks */
    const uint64_t budget = 12 * 20480;
    const uint32_t max_new = 40;
    struct ref refs[6];
    static struct capture cap;
    memset(&cap, 0, sizeof cap);
    struct engine *e = make_engine(32, 6, 16, budget, true, NULL);
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    assert_int_equal(m.kv_blocks_total, 12);
    for (size_t i = 0; i < 6; i++) {
        const int32_t *p = text + 3 * i; /* different prompts: no sharing */
        size_t n = 30 + i;
        ref_run(p, n, max_new, &refs[i]);
        struct engine_request r = greedy_req(p, n, max_new, i, &cap.got[i]);
        r.priority = i < 2 ? ENGINE_PRIO_HIGH : i < 4 ? ENGINE_PRIO_NORMAL : ENGINE_PRIO_LOW;
        assert_int_equal(engine_submit(e, &r, &cap.got[i].id), 0);
    }
    size_t active = 1;
    for (size_t s = 0; active && s < 5000; s++) {
        assert_int_equal(engine_step(e, &active), 0);
        assert_int_equal(kv_pool_validate(engine__kv(e)), 0);
    }
    assert_int_equal(active, 0);
    for (size_t i = 0; i < 6; i++) {
        char what[32];
        snprintf(what, sizeof what, "request %zu", i);
        assert_true(cap.got[i].finished);
        assert_int_equal(cap.got[i].reason, ENGINE_FINISH_LENGTH);
        assert_follows(&cap.got[i], &refs[i], max_new, what);
        ref_free(&refs[i]);
    }
    engine_get_metrics(e, &m);
    assert_true(m.preemptions > 0);
    assert_int_equal(m.kv_blocks_used, 0);
    engine_destroy(e);
    free(text);
}

/* ---- 4. cancel, deadline, overload, bad requests ------------------------------------------- */

static void test_cancel_mid_prefill(void **state)
{
    (void)state;
    size_t n_long;
    int32_t *text = long_text(&n_long);
    struct engine *e = make_engine(16, 4, 4, 0, true, NULL);
    static struct capture cap;
    memset(&cap, 0, sizeof cap);
    struct engine_request r = greedy_req(text, 200, 8, 1, &cap.got[0]);
    assert_int_equal(engine_submit(e, &r, &cap.got[0].id), 0);
    size_t active;
    assert_int_equal(engine_step(e, &active), 0);
    assert_int_equal(engine_step(e, &active), 0);
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    assert_int_equal(m.tokens_prefilled, 32); /* two chunks of 16 */
    assert_true(m.kv_blocks_used > 0);
    assert_int_equal(engine_cancel(e, cap.got[0].id), 0);
    assert_true(cap.got[0].finished);
    assert_int_equal(cap.got[0].reason, ENGINE_FINISH_CANCELLED);
    assert_int_equal(cap.got[0].n, 0);
    engine_get_metrics(e, &m);
    assert_int_equal(m.kv_blocks_used, 0); /* freed at once */
    assert_int_equal(m.running + m.waiting, 0);
    tu_log_capture_begin();
    assert_int_equal(engine_cancel(e, cap.got[0].id), ERR_NOT_FOUND);
    tu_log_capture_end();
    /* a waiting request is cancelled too */
    r = greedy_req(text, 20, 8, 1, &cap.got[1]);
    assert_int_equal(engine_submit(e, &r, &cap.got[1].id), 0);
    assert_int_equal(engine_cancel(e, cap.got[1].id), 0);
    assert_int_equal(cap.got[1].reason, ENGINE_FINISH_CANCELLED);
    assert_int_equal(kv_pool_validate(engine__kv(e)), 0);
    engine_destroy(e);
    free(text);
}

static void test_deadline(void **state)
{
    (void)state;
    size_t n_long;
    int32_t *text = long_text(&n_long);
    struct engine *e = make_engine(16, 4, 4, 0, true, NULL);
    static struct capture cap;
    memset(&cap, 0, sizeof cap);
    /* already past: finishes at the next step without running */
    struct engine_request r = greedy_req(text, 50, 8, 1, &cap.got[0]);
    r.deadline_ns = mono_ns() - 1;
    assert_int_equal(engine_submit(e, &r, &cap.got[0].id), 0);
    /* passes while running: 100 ms for a context-long generation that takes longer */
    r = greedy_req(text, 10, 500, 1, &cap.got[1]);
    r.deadline_ns = mono_ns() + 100000000ull;
    assert_int_equal(engine_submit(e, &r, &cap.got[1].id), 0);
    size_t active = 1;
    while (active) {
        assert_int_equal(engine_step(e, &active), 0);
        if (!cap.got[1].finished) {
            /* slow the steps down so that the deadline comes first whatever the machine */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    assert_int_equal(cap.got[0].reason, ENGINE_FINISH_DEADLINE);
    assert_int_equal(cap.got[0].n, 0);
    assert_int_equal(cap.got[1].reason, ENGINE_FINISH_DEADLINE);
    assert_true(cap.got[1].n > 0 && cap.got[1].n < 500);
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    assert_int_equal(m.kv_blocks_used, 0);
    engine_destroy(e);
    free(text);
}

static void test_overloaded(void **state)
{
    (void)state;
    /* max_running 2, max_queue 2: max_queue counts the requests waiting beyond the free
     * running slots, so a burst of 4 before any step is taken (2 will run, 2 wait) and the
     * 5th is refused, before and after the step that admits 2 */
    struct engine *e = make_engine(16, 2, 2, 0, true, NULL);
    static struct capture cap;
    memset(&cap, 0, sizeof cap);
    const struct golden_case *gc = &g_gold.cases[2];
    for (size_t i = 0; i < 4; i++) {
        struct engine_request r = greedy_req(gc->prompt, gc->n_prompt, 4, 1, &cap.got[i]);
        assert_int_equal(engine_submit(e, &r, &cap.got[i].id), 0);
    }
    struct engine_request r = greedy_req(gc->prompt, gc->n_prompt, 4, 1, &cap.got[4]);
    uint64_t id;
    tu_log_capture_begin();
    assert_int_equal(engine_submit(e, &r, &id), ERR_OVERLOADED);
    tu_assert_log_contains("overloaded", "max_queue 2", NULL);
    tu_log_capture_end();
    size_t active;
    assert_int_equal(engine_step(e, &active), 0);
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    assert_int_equal(m.running, 2);
    assert_int_equal(m.waiting, 2);
    tu_log_capture_begin();
    assert_int_equal(engine_submit(e, &r, &id), ERR_OVERLOADED);
    tu_assert_log_contains("overloaded", "max_queue 2", NULL);
    tu_log_capture_end();
    /* once they have finished, the queue has room again */
    run_until_idle(e, 200);
    assert_int_equal(engine_submit(e, &r, &cap.got[4].id), 0);
    run_until_idle(e, 200);
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(cap.got[i].reason, ENGINE_FINISH_LENGTH);
    engine_destroy(e);
}

static void expect_submit_error(struct engine *e, const struct engine_request *r, int code,
                                const char *msg)
{
    uint64_t id;
    tu_log_capture_begin();
    assert_int_equal(engine_submit(e, r, &id), code);
    tu_assert_log_contains(msg, NULL);
    tu_log_capture_end();
}

static void test_bad_requests(void **state)
{
    (void)state;
    struct engine *e = make_engine(16, 2, 2, 0, true, NULL);
    const struct golden_case *gc = &g_gold.cases[2];
    int32_t bad[3] = {1, 600, 2};
    struct engine_request r = greedy_req(gc->prompt, 0, 4, 1, NULL);
    expect_submit_error(e, &r, ERR_RANGE, "empty prompt");
    r = greedy_req(bad, 3, 4, 1, NULL);
    expect_submit_error(e, &r, ERR_RANGE, "token 1: id 600 is outside the vocabulary");
    r = greedy_req(gc->prompt, gc->n_prompt, 0, 1, NULL);
    expect_submit_error(e, &r, ERR_RANGE, "max_new is 0");
    r = greedy_req(gc->prompt, gc->n_prompt, 4, 1, NULL);
    r.adapter = "nope";
    r.adapter_scale = 1.0f;
    expect_submit_error(e, &r, ERR_NOT_FOUND, "'nope' is not loaded");
    r.adapter = NULL;
    r.temperature = -1.0f;
    expect_submit_error(e, &r, ERR_RANGE, "temperature");
    r.temperature = 0.0f;
    const char *stop[] = {"x"};
    r.stop = stop;
    r.n_stop = 1;
    expect_submit_error(e, &r, ERR_UNSUPPORTED, "stop strings need a tokenizer");
    r.n_stop = 0;
    r.priority = (enum engine_priority)7;
    expect_submit_error(e, &r, ERR_RANGE, "priority 7");
    r.priority = ENGINE_PRIO_LOW;
    r.adapter_scale = NAN;
    expect_submit_error(e, &r, ERR_RANGE, "adapter_scale");
    /* a prompt the tiny pool could never hold */
    engine_destroy(e);
    e = make_engine(16, 2, 2, 2 * 20480, true, NULL);
    r = greedy_req(g_gold.cases[4].prompt, 40, 4, 1, NULL);
    expect_submit_error(e, &r, ERR_RANGE, "needs 3 KV blocks, the pool holds 2");
    engine_destroy(e);
    /* bad configuration */
    struct engine_config cfg = {.model_dir = g_dir, .n_threads = 1, .max_step_tokens = 4,
                                .max_running = 8};
    struct engine *e2 = NULL;
    tu_log_capture_begin();
    assert_int_equal(engine_create(&cfg, on_event, NULL, &e2), ERR_RANGE);
    tu_assert_log_contains("max_running 8 exceeds max_step_tokens 4", NULL);
    tu_log_capture_end();
    assert_null(e2);
}

/* ---- fairness: the prefill budget is shared between tenants ----------------------------- */

/* Steps until every request of `cap` finished; done_at[i] = the step at which got[i] did. */
static void run_recording(struct engine *e, struct capture *cap, size_t n, size_t *done_at,
                          size_t max_steps)
{
    size_t active = 1;
    for (size_t s = 1; active && s <= max_steps; s++) {
        assert_int_equal(engine_step(e, &active), 0);
        for (size_t i = 0; i < n; i++)
            if (cap->got[i].finished && !done_at[i])
                done_at[i] = s;
    }
    assert_int_equal(active, 0);
}

static void test_tenant_fair_prefill(void **state)
{
    (void)state;
    size_t n_long;
    int32_t *text = long_text(&n_long);
    assert_true(n_long >= 200);
    static struct capture cap;
    for (int same = 0; same < 2; same++) {
        /* tenant 1's three 200-token prompts are admitted and start their prefill; then
         * tenant 2 (or tenant 1 again) sends one */
        struct engine *e = make_engine(64, 8, 8, 0, false, NULL);
        memset(&cap, 0, sizeof cap);
        size_t active;
        for (size_t i = 0; i < 4; i++) {
            struct engine_request r =
                greedy_req(text, 200, 1, i == 3 && !same ? 2 : 1, &cap.got[i]);
            assert_int_equal(engine_submit(e, &r, &cap.got[i].id), 0);
            if (i == 2) {
                assert_int_equal(engine_step(e, &active), 0);
                struct engine_metrics m;
                engine_get_metrics(e, &m);
                assert_int_equal(m.tokens_prefilled, 64); /* the whole budget is used */
                assert_int_equal(m.running, 3);
            }
        }
        size_t done_at[4] = {0};
        run_recording(e, &cap, 4, done_at, 100);
        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(cap.got[i].reason, ENGINE_FINISH_LENGTH);
            assert_int_equal(cap.got[i].n, 1);
        }
        /* step 1 ran before the fourth request came: done_at[i] + 1 is the step number */
        if (!same) {
            /* half of each step from step 2: 200 tokens in ceil(200 / 32) = 7 steps, while
             * tenant 1's prompts get the other half; first come, first served would have made
             * tenant 2 wait for the 536 tokens tenant 1 still had (step 13) */
            if (done_at[3] + 1 > 8)
                fail_msg("tenant 2's prompt finished at step %zu, expected 8",
                         done_at[3] + 1);
            assert_true(done_at[3] < done_at[1]);
            assert_true(done_at[3] < done_at[2]);
        } else {
            /* one tenant: its requests in arrival order */
            assert_true(done_at[0] <= done_at[1] && done_at[1] <= done_at[2] &&
                        done_at[2] <= done_at[3]);
            assert_true(done_at[3] + 1 >= 13);
        }
        assert_int_equal(kv_pool_validate(engine__kv(e)), 0);
        engine_destroy(e);
    }
    free(text);
}

/* ---- LoRA: a batch mixing the base model and two adapters --------------------------------- */

/* An engine (64-token steps, 8 running, prefix cache on) whose logits cap checks for n
 * requests. */
static struct engine *capture_engine(struct capture *cap, size_t n)
{
    memset(cap, 0, sizeof *cap);
    cap->n = n;
    struct engine *e = make_engine(64, 8, 16, 0, true, NULL);
    engine__set_logits_tap(e, on_logits, cap);
    return e;
}

/* Submits n greedy requests of prompt prefixes lens[i] of text, request i with adapter
 * names[i] (NULL: the base model; ads[i] its handle for the reference) at scales[i], each
 * with its reference run into refs[i] and its logits checked against it (cap). */
static void submit_lora_reqs(struct engine *e, struct capture *cap, struct ref *refs,
                             const int32_t *text, const size_t *lens,
                             const struct lora_adapter *const *ads, const char *const *names,
                             const float *scales, size_t n, uint32_t max_new)
{
    for (size_t i = 0; i < n; i++) {
        ref_run_lora(text, lens[i], max_new, ads[i], scales[i], &refs[i]);
        cap->got[i].ref = &refs[i];
        struct engine_request r = greedy_req(text, lens[i], max_new, 1, &cap->got[i]);
        r.adapter = names[i];
        r.adapter_scale = scales[i];
        assert_int_equal(engine_submit(e, &r, &cap->got[i].id), 0);
    }
}

/* Every request of submit_lora_reqs finished, followed its reference's ids, and its logits
 * stayed within 1e-3 relative of the reference's: the grouped LoRA update (lora_apply_a/b)
 * sums in another order than lora_apply_one, and these random adapters move the logits a lot. */
static void check_lora_reqs(const struct capture *cap, const struct ref *refs,
                            const char *const *names, size_t n, uint32_t max_new)
{
    for (size_t i = 0; i < n; i++) {
        char what[48];
        snprintf(what, sizeof what, "request %zu (adapter %s)", i, names[i] ? names[i] : "-");
        assert_true(cap->got[i].finished);
        assert_follows(&cap->got[i], &refs[i], max_new, what);
        if (cap->got[i].logits_checked == 0 || !(cap->got[i].max_diff <= 1e-3f))
            fail_msg("%s: max relative logit difference %g", what, (double)cap->got[i].max_diff);
    }
}

static void test_mixed_adapters(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp();
    char *dir_a = strdup(tu_path(tmp, "a")), *dir_b = strdup(tu_path(tmp, "b"));
    const uint32_t all = (1u << LORA_TARGET_COUNT) - 1;
    struct peft_adapter *pa = peft_adapter_random(&g_model->hp, 4, 8.0, all, 11, 0.3f, 0.3f);
    struct peft_adapter *pb =
        peft_adapter_random(&g_model->hp, 2, 2.0, (1u << LORA_Q) | (1u << LORA_V) |
                                                      (1u << LORA_DOWN), 12, 0.3f, 0.3f);
    peft_adapter_write(pa, dir_a, SAFETENSORS_F32, "");
    peft_adapter_write(pb, dir_b, SAFETENSORS_F32, "");
    struct lora_adapter *ad_a, *ad_b;
    assert_int_equal(lora_open(dir_a, &g_model->hp, &ad_a), 0);
    assert_int_equal(lora_open(dir_b, &g_model->hp, &ad_b), 0);

    size_t n_long;
    int32_t *text = long_text(&n_long);
    const struct lora_adapter *ads[6] = {NULL, ad_a, ad_b, ad_a, NULL, ad_b};
    const char *names[6] = {NULL, "a", "b", "a", NULL, "b"};
    const float scales[6] = {0, 1.0f, 0.5f, 2.0f, 0, 1.0f};
    const size_t lens[6] = {40, 40, 25, 70, 9, 100};
    const uint32_t max_new = 20;
    struct ref refs[6];
    static struct capture cap;
    struct engine *e = capture_engine(&cap, 6);
    assert_int_equal(engine_load_adapter(e, "a", dir_a), 0);
    assert_int_equal(engine_load_adapter(e, "b", dir_b), 0);
    submit_lora_reqs(e, &cap, refs, text, lens, ads, names, scales, 6, max_new);
    /* unloading a name does not take the adapter from the requests that use it */
    assert_int_equal(engine_unload_adapter(e, "b"), 0);
    run_until_idle(e, 500);
    check_lora_reqs(&cap, refs, names, 6, max_new);
    /* the adapters change the output (the test would be vacuous otherwise) */
    assert_memory_not_equal(refs[0].logits, refs[1].logits,
                            g_model->hp.vocab_size * sizeof(float));
    /* request 1 shares request 0's prompt prefix but not its adapter: no hit; a second request
     * with adapter a and the same scale hits */
    assert_int_equal(cap.got[1].cached, 0);
    struct engine_request r = greedy_req(text, 40, 4, 1, NULL);
    r.adapter = "a";
    r.adapter_scale = 1.0f;
    int32_t *ids;
    size_t n;
    struct engine_event fin;
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    assert_int_equal(fin.cached_tokens, 32);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], cap.got[1].ids[i]);
    free(ids);
    r.adapter_scale = 0.5f; /* another scale is another KV */
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    assert_int_equal(fin.cached_tokens, 0);
    free(ids);
    engine_destroy(e);
    for (size_t i = 0; i < 6; i++)
        ref_free(&refs[i]);
    lora_close(ad_a);
    lora_close(ad_b);
    peft_adapter_free(pa);
    peft_adapter_free(pb);
    tu_rmtree(tmp);
    free(tmp);
    free(dir_a);
    free(dir_b);
    free(text);
}

/* An adapter on q and v alone: in its steps the k/v-sharing qkv group runs the fused LoRA
 * job while o, gate/up and down, which no segment adapts, run as in a step without adapters
 * (matmul_group with the inputs prepared by the norm job; session 21). Both kinds of group in
 * one step, with a base-model request beside the adapted ones, against the reference. */
static void test_partial_adapter(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp();
    char *dir = strdup(tu_path(tmp, "qv"));
    struct peft_adapter *pa = peft_adapter_random(
        &g_model->hp, 4, 8.0, (1u << LORA_Q) | (1u << LORA_V), 13, 0.3f, 0.3f);
    peft_adapter_write(pa, dir, SAFETENSORS_F32, "");
    struct lora_adapter *ad;
    assert_int_equal(lora_open(dir, &g_model->hp, &ad), 0);

    size_t n_long;
    int32_t *text = long_text(&n_long);
    const struct lora_adapter *ads[4] = {ad, NULL, ad, ad};
    const char *names[4] = {"qv", NULL, "qv", "qv"};
    const float scales[4] = {1.0f, 0, 2.0f, 1.0f};
    const size_t lens[4] = {30, 30, 12, 60};
    const uint32_t max_new = 16;
    struct ref refs[4];
    static struct capture cap;
    struct engine *e = capture_engine(&cap, 4);
    assert_int_equal(engine_load_adapter(e, "qv", dir), 0);
    submit_lora_reqs(e, &cap, refs, text, lens, ads, names, scales, 4, max_new);
    run_until_idle(e, 500);
    check_lora_reqs(&cap, refs, names, 4, max_new);
    /* the adapter changes the output (the test would be vacuous otherwise) */
    assert_memory_not_equal(refs[0].logits, refs[1].logits,
                            g_model->hp.vocab_size * sizeof(float));
    engine_destroy(e);
    for (size_t i = 0; i < 4; i++)
        ref_free(&refs[i]);
    lora_close(ad);
    peft_adapter_free(pa);
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
    free(text);
}

/* engine__set_lora_bypass (engine_bench's paired LoRA steps): while it is on, a request with
 * an adapter steps as the base model does; off again, the adapter applies. */
static void test_lora_bypass(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp();
    char *dir_a = strdup(tu_path(tmp, "a"));
    const uint32_t all = (1u << LORA_TARGET_COUNT) - 1;
    struct peft_adapter *pa = peft_adapter_random(&g_model->hp, 4, 8.0, all, 11, 0.3f, 0.3f);
    peft_adapter_write(pa, dir_a, SAFETENSORS_F32, "");
    struct lora_adapter *ad_a;
    assert_int_equal(lora_open(dir_a, &g_model->hp, &ad_a), 0);
    size_t n_long;
    int32_t *text = long_text(&n_long);
    const uint32_t max_new = 12;
    struct ref base, adapted;
    ref_run(text, 30, max_new, &base);
    ref_run_lora(text, 30, max_new, ad_a, 1.0f, &adapted);
    /* the adapter changes the output (the test would be vacuous otherwise) */
    assert_memory_not_equal(base.logits, adapted.logits, g_model->hp.vocab_size * sizeof(float));
    static struct capture cap;
    for (int off = 1; off >= 0; off--) {
        memset(&cap, 0, sizeof cap);
        cap.n = 1;
        struct engine *e = make_engine(64, 8, 16, 0, false, NULL);
        engine__set_logits_tap(e, on_logits, &cap);
        assert_int_equal(engine_load_adapter(e, "a", dir_a), 0);
        engine__set_lora_bypass(e, off);
        cap.got[0].ref = off ? &base : &adapted;
        struct engine_request r = greedy_req(text, 30, max_new, 1, &cap.got[0]);
        r.adapter = "a";
        r.adapter_scale = 1.0f;
        assert_int_equal(engine_submit(e, &r, &cap.got[0].id), 0);
        run_until_idle(e, 200);
        assert_true(cap.got[0].finished);
        assert_follows(&cap.got[0], cap.got[0].ref, max_new, off ? "bypassed" : "adapted");
        if (cap.got[0].logits_checked == 0 || !(cap.got[0].max_diff <= 1e-3f))
            fail_msg("%s: max relative logit difference %g", off ? "bypassed" : "adapted",
                     (double)cap.got[0].max_diff);
        engine_destroy(e);
    }
    ref_free(&base);
    ref_free(&adapted);
    lora_close(ad_a);
    peft_adapter_free(pa);
    tu_rmtree(tmp);
    free(tmp);
    free(dir_a);
    free(text);
}

/* ---- 5. snapshots -------------------------------------------------------------------------- */

/*
 * Puts a NaN in token tok's embedding row of a fresh copy of the model (written bytes, no
 * converter: it refuses NaN) and returns its directory. The row's f32 bytes are found by
 * content in the copy's files, so the test does not depend on the IEBIN layout.
 */
static char *nan_model(int32_t tok, char **tmp)
{
    char *dir = golden_import(DT_F32, tmp);
    size_t dim = g_model->hp.dim;
    float *row = malloc(dim * sizeof *row); /* [dim] */
    assert_non_null(row);
    model_embed_row(g_model, (uint32_t)tok, row);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int patched = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r+b");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        rewind(f);
        char *buf = malloc((size_t)n + 1);
        assert_non_null(buf);
        assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
        char *hit = memmem(buf, (size_t)n, row, dim * sizeof *row);
        if (hit) {
            float nan = NAN;
            fseek(f, (long)(hit - buf), SEEK_SET);
            assert_int_equal(fwrite(&nan, sizeof nan, 1, f), 1);
            patched++;
        }
        free(buf);
        fclose(f);
    }
    closedir(d);
    free(row);
    assert_int_equal(patched, 1);
    return dir;
}

/* A NaN weight fails the requests with "non-finite logits" (issue 15: it used to emit token 0).
 * stories260K ties its classifier to the embedding, so the NaN row is also logit tok of every
 * request: both requests of the batch fail, each on its own error path, with no token emitted. */
static void test_nan_weights(void **state)
{
    (void)state;
    const int32_t tok = 300;
    char *tmp;
    char *dir = nan_model(tok, &tmp);
    struct engine_config cfg = {
        .model_dir = dir, .n_threads = 2, .kv_dtype = DT_F32, .max_step_tokens = 64,
        .max_running = 2, .max_queue = 2,
    };
    struct engine *e;
    assert_int_equal(engine_create(&cfg, on_event, NULL, &e), 0);
    const int32_t bad[] = {1, tok, 301};
    const int32_t good[] = {1, 302, 301};
    struct got gb = {0}, gg = {0};
    struct engine_request rb = greedy_req(bad, 3, 4, 1, &gb);
    struct engine_request rg = greedy_req(good, 3, 4, 1, &gg);
    tu_log_capture_begin();
    assert_int_equal(engine_submit(e, &rb, &gb.id), 0);
    assert_int_equal(engine_submit(e, &rg, &gg.id), 0);
    run_until_idle(e, 100);
    tu_assert_log_contains("non-finite logits", NULL);
    tu_log_capture_end();
    assert_int_equal(gb.error, ERR_STATE);
    assert_int_equal(gb.n, 0);
    assert_int_equal(gg.error, ERR_STATE);
    assert_int_equal(gg.n, 0);
    engine_destroy(e);
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
}

/* chat.ie.json's eos_token_ids end a request like the tokenizer's EOS (docs/CHAT.md: Llama 3
 * Instruct ends a turn with <|eot_id|>): with the id of greedy step k of a golden case listed,
 * generation stops there (FINISH_EOS, k tokens), ignore_eos goes on past it; a malformed list
 * fails engine_create naming the file. */
static void test_model_stop_ids(void **state)
{
    (void)state;
    const struct golden_case *gc = &g_gold.cases[0];
    size_t k = 3; /* a step whose id does not occur before it, inside the reliable prefix */
    for (;; k++) {
        assert_true(k < gc->cutoff && k < 40);
        bool seen = false;
        for (size_t j = 0; j < k; j++)
            seen |= gc->greedy[j] == gc->greedy[k];
        if (!seen)
            break;
    }
    char meta[128], path[4200];
    snprintf(path, sizeof path, "%s/chat.ie.json", g_dir);
    snprintf(meta, sizeof meta, "{\"eos_token_ids\": [0, %d]}", (int)gc->greedy[k]);
    tu_write_file(path, meta, strlen(meta));
    struct engine *e = make_engine(0, 0, 0, 0, false, NULL);
    struct engine_request r = greedy_req(gc->prompt, gc->n_prompt, 40, 0, NULL);
    int32_t *ids;
    size_t n;
    struct engine_event fin;
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    assert_int_equal(fin.reason, ENGINE_FINISH_EOS);
    assert_int_equal(n, k);
    assert_memory_equal(ids, gc->greedy, k * sizeof *ids);
    free(ids);
    r.ignore_eos = true;
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    assert_int_equal(fin.reason, ENGINE_FINISH_LENGTH);
    assert_int_equal(n, 40);
    assert_int_equal(ids[k], gc->greedy[k]);
    free(ids);
    engine_destroy(e);

    static const char *const bad[] = {
        "{\"eos_token_ids\": 5}",        "{\"eos_token_ids\": [1, -2]}",
        "{\"eos_token_ids\": [\"2\"]}", "{\"eos_token_ids\": [1000000]}",
        "[1]",                          "{\"eos_token_ids\": [1,",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_write_file(path, bad[i], strlen(bad[i]));
        struct engine_config cfg = {.model_dir = g_dir, .n_threads = 1, .kv_dtype = DT_F32};
        tu_log_capture_begin();
        assert_int_equal(engine_create(&cfg, on_event, NULL, &e), ERR_FORMAT);
        tu_assert_log_contains("chat.ie.json", NULL);
        tu_log_capture_end();
    }
    assert_int_equal(remove(path), 0);
}

/* The default KV budget (every running request at full context) sizes 8-bit rows as kv.c
 * stores them (codes plus an f32 scale per head), not as f32 rows: int8 and fp8 pools hold as
 * many blocks as an f32 one (the stride's 64-byte rounding aside), not ~4x as many. */
static void test_default_budget_kv8(void **state)
{
    (void)state;
    static const enum dtype dts[] = {DT_F32, DT_BF16, DT_KV_I8, DT_KV_E4M3};
    uint64_t blocks[4];
    for (size_t i = 0; i < 4; i++) {
        struct engine_config cfg = {.model_dir = g_dir, .n_threads = 1, .kv_dtype = dts[i],
                                    .max_running = 4};
        struct engine *e;
        assert_int_equal(engine_create(&cfg, on_event, NULL, &e), 0);
        struct engine_metrics m;
        engine_get_metrics(e, &m);
        blocks[i] = m.kv_blocks_total;
        engine_destroy(e);
    }
    for (size_t i = 1; i < 4; i++)
        if (blocks[i] * 10 < blocks[0] * 9 || blocks[i] * 10 > blocks[0] * 11)
            fail_msg("kv dtype %d: %llu blocks by default, f32 has %llu", (int)dts[i],
                     (unsigned long long)blocks[i], (unsigned long long)blocks[0]);
}

static void test_snapshot(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp();
    char *path = strdup(tu_path(tmp, "kv.snap"));
    size_t n_long;
    int32_t *text = long_text(&n_long);
    struct engine_request r = greedy_req(text, 100, 8, 5, NULL);
    int32_t *ids, *ids2;
    size_t n, n2;
    struct engine_event fin;

    struct engine *e = make_engine(64, 4, 8, 0, true, path);
    assert_int_equal(engine_generate(e, &r, &ids, &n, &fin), 0);
    assert_int_equal(fin.cached_tokens, 0);
    engine_destroy(e); /* saves */

    e = make_engine(64, 4, 8, 0, true, path); /* restores */
    assert_int_equal(engine_generate(e, &r, &ids2, &n2, &fin), 0);
    assert_int_equal(fin.cached_tokens, 96);
    assert_int_equal(n2, n);
    assert_memory_equal(ids, ids2, n * sizeof *ids);
    free(ids2);
    /* another tenant gets nothing from it */
    r.tenant = 6;
    assert_int_equal(engine_generate(e, &r, &ids2, &n2, &fin), 0);
    assert_int_equal(fin.cached_tokens, 0);
    free(ids2);
    r.tenant = 5;
    engine_destroy(e);

    /* a corrupted snapshot is refused with a warning; the engine works without it */
    size_t len;
    char *buf = tu_read_file(path, &len);
    assert_true(len > 200);
    for (size_t i = 100; i < 140; i++)
        buf[i] ^= 0x5a;
    tu_write_file(path, buf, len);
    free(buf);
    tu_log_capture_begin();
    e = make_engine(64, 4, 8, 0, true, path);
    tu_assert_log_contains("kv snapshot", NULL);
    tu_log_capture_end();
    assert_int_equal(engine_generate(e, &r, &ids2, &n2, &fin), 0);
    assert_int_equal(fin.cached_tokens, 0);
    assert_memory_equal(ids, ids2, n * sizeof *ids);
    free(ids2);
    engine_destroy(e);

    free(ids);
    free(text);
    tu_rmtree(tmp);
    free(tmp);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_progress_per_layer),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_pool_exhaustion),
        cmocka_unit_test(test_cancel_mid_prefill),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_overloaded),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_tenant_fair_prefill),
        cmocka_unit_test(test_mixed_adapters),
        cmocka_unit_test(test_partial_adapter),
        cmocka_unit_test(test_lora_bypass),
        cmocka_unit_test(test_snapshot),
        cmocka_unit_test(test_nan_weights),
        cmocka_unit_test(test_model_stop_ids),
        cmocka_unit_test(test_default_budget_kv8),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
