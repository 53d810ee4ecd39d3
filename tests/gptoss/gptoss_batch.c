/*
 * gptoss_batch.c — gpt-oss acceptance 4 on a model directory test_gptoss.py writes: 8 greedy
 * requests of mixed lengths (some longer than the sliding window) run concurrently through
 * the continuous-batching engine give the ids each gives alone — with the prefix cache on
 * (two prompts share a prefix), with a KV budget so small that requests are preempted and
 * recomputed, and with a bf16 KV cache (batched against bf16 alone). Also: a cancelled request
 * leaves the others' ids unchanged; run one after the other on one engine, request 6 (which
 * extends request 1's prompt) finds its prefix in the cache and still gives its ids; every
 * run releases sliding-layer blocks (docs/KV.md, "Sliding layers").
 *
 * usage: gptoss_batch MODEL_DIR. Prints one line per check and "N passed, M failed"; exit 0
 * when every check passed.
 *        gptoss_batch --logits MODEL_DIR f32|bf16 TOKEN N OUT: one greedy request (prompt
 * TOKEN, N new tokens) through the engine with that KV dtype; writes the logits row of every
 * sampled position to OUT (float32 [N][vocab]) and prints the ids, comma separated, so that
 * test_gptoss.py can score the engine's paged path (and its bf16 KV) against its reference on
 * the same tokens.
 */
#include "engine.h"
#include "engine_internal.h"
#include "err.h"
#include "kern.h"
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_REQ 8
#define MAX_NEW 10
#define MAX_IDS 64

struct out {
    int32_t ids[MAX_IDS];
    size_t n;
    int finished;
};

static void on_event(const struct engine_event *ev, void *ud)
{
    (void)ud;
    struct out *o = ev->user;
    if (ev->kind == ENGINE_EV_TOKEN && ev->token >= 0 && o->n < MAX_IDS)
        o->ids[o->n++] = ev->token;
    else if (ev->kind == ENGINE_EV_FINISH)
        o->finished = 1;
}

static int32_t g_prompts[N_REQ][48];
static const size_t g_len[N_REQ] = {3, 40, 17, 25, 33, 9, 44, 20};

/* Runs requests [0, N_REQ) whose bit is set in `mask` at once (cancel >= 0: that one is
 * cancelled after its first steps; cancel == SEQUENTIAL: one after the other on the same
 * engine, so that later ones find earlier ones' blocks); outputs into out[]. 0 or a negative
 * code. */
#define SEQUENTIAL (-2)
static uint64_t g_releases; /* sliding-layer blocks released by the last run */
static uint64_t g_hits;     /* prefix-cache tokens found by the last run */

static int run(const char *dir, enum dtype kvt, uint64_t budget, unsigned mask, int cancel,
               struct out *out, uint64_t *preemptions)
{
    /* alone (SEQUENTIAL without a budget given): one request at a time, no prefix cache */
    const bool alone = cancel == SEQUENTIAL && budget == 0;
    struct engine_config cfg = {.model_dir = dir, .n_threads = 1, .kv_dtype = kvt,
                                .kv_budget_bytes = alone ? 64u << 20 : budget,
                                .prefix_cache = !alone,
                                .max_step_tokens = 64, .max_running = N_REQ};
    struct engine *e;
    int rc = engine_create(&cfg, on_event, NULL, &e);
    if (rc)
        return rc;
    uint64_t ids[N_REQ] = {0};
    for (int i = 0; i < N_REQ; i++) {
        if (!(mask >> i & 1))
            continue;
        memset(&out[i], 0, sizeof out[i]);
        struct engine_request r = {.prompt = g_prompts[i], .n_prompt = g_len[i],
                                   .max_new = MAX_NEW, .temperature = 0, .top_p = 1,
                                   .repeat_penalty = 1, .user = &out[i], .ignore_eos = true};
        if ((rc = engine_submit(e, &r, &ids[i])))
            goto done;
        for (size_t active = 1; cancel == SEQUENTIAL && active;)
            if ((rc = engine_step(e, &active)) || (rc = kv_pool_validate(engine__kv(e))))
                goto done;
    }
    size_t active = 1;
    for (int step = 0; active; step++) {
        if (step == 3 && cancel >= 0 && (rc = engine_cancel(e, ids[cancel])))
            goto done;
        if ((rc = engine_step(e, &active)) || (rc = kv_pool_validate(engine__kv(e))))
            goto done; /* every invariant of the pool (both sequences, releases) each step */
    }
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    *preemptions = m.preemptions;
    g_releases = m.kv_window_releases;
    g_hits = m.prefix_hit_tokens;
done:
    engine_destroy(e);
    return rc;
}

static int same(const struct out *a, const struct out *b)
{
    return a->n == b->n && memcmp(a->ids, b->ids, a->n * sizeof a->ids[0]) == 0;
}

static void tap(void *ud, uint64_t id, uint32_t n_gen, const float *logits, size_t vocab)
{
    (void)id;
    (void)n_gen;
    if (fwrite(logits, sizeof *logits, vocab, ud) != vocab)
        fprintf(stderr, "gptoss_batch: writing logits failed\n");
}

/* --logits: see the header. */
static int dump_logits(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: gptoss_batch --logits MODEL_DIR f32|bf16 TOKEN N OUT\n");
        return 2;
    }
    FILE *f = fopen(argv[6], "wb");
    if (!f) {
        perror(argv[6]);
        return 1;
    }
    struct out o = {0};
    int32_t prompt = atoi(argv[4]);
    struct engine_config cfg = {.model_dir = argv[2], .n_threads = 1,
                                .kv_dtype = strcmp(argv[3], "bf16") ? DT_F32 : DT_BF16,
                                .kv_budget_bytes = 64u << 20, .prefix_cache = true};
    struct engine *e;
    int rc = engine_create(&cfg, on_event, NULL, &e);
    if (rc) {
        fclose(f);
        return 1;
    }
    engine__set_logits_tap(e, tap, f);
    struct engine_request r = {.prompt = &prompt, .n_prompt = 1, .max_new = (uint32_t)atoi(argv[5]),
                               .temperature = 0, .top_p = 1, .repeat_penalty = 1, .user = &o,
                               .ignore_eos = true};
    uint64_t id;
    size_t active = 1;
    if (!(rc = engine_submit(e, &r, &id)))
        while (active && !(rc = engine_step(e, &active)))
            ;
    engine_destroy(e);
    if (fclose(f) || rc)
        return 1;
    for (size_t i = 0; i < o.n; i++)
        printf("%s%d", i ? "," : "", o.ids[i]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--logits"))
        return kern_init() ? 1 : dump_logits(argc, argv);
    if (argc != 2) {
        fprintf(stderr, "usage: gptoss_batch MODEL_DIR\n");
        return 2;
    }
    if (kern_init())
        return 1;
    uint64_t x = 88172645463325252ull; /* xorshift: fixed prompts over a vocabulary of 512 */
    for (int i = 0; i < N_REQ; i++)
        for (size_t t = 0; t < 48; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            g_prompts[i][t] = (int32_t)(x % 512);
        }
    memcpy(g_prompts[6], g_prompts[1], 40 * sizeof(int32_t)); /* 6 extends 1: prefix reuse */

    int passed = 0, failed = 0;
    const struct {
        const char *name;
        enum dtype kvt;
        uint64_t budget;
        int cancel;
    } cases[] = {
        {"f32 KV, prefix cache", DT_F32, 64u << 20, -1},
        {"f32 KV, 12 blocks of 2 layers (preemption)", DT_F32, 12 * 32768, -1},
        {"f32 KV, request 3 cancelled", DT_F32, 64u << 20, 3},
        {"bf16 KV, prefix cache", DT_BF16, 64u << 20, -1},
        {"f32 KV, one after the other (prefix reuse)", DT_F32, 64u << 20, SEQUENTIAL},
    };
    struct out alone[2][N_REQ]; /* [f32, bf16] */
    for (int k = 0; k < 2; k++) {
        uint64_t pre;
        int rc = run(argv[1], k ? DT_BF16 : DT_F32, 0, (1u << N_REQ) - 1, SEQUENTIAL, alone[k],
                     &pre);
        for (int i = 0; i < N_REQ; i++)
            if (rc || alone[k][i].n != MAX_NEW) {
                printf("FAIL alone %d (%s KV): rc %d, %zu ids\n", i, k ? "bf16" : "f32", rc,
                       alone[k][i].n);
                return 1;
            }
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct out got[N_REQ];
        uint64_t pre = 0;
        int rc = run(argv[1], cases[c].kvt, cases[c].budget, (1u << N_REQ) - 1, cases[c].cancel,
                     got, &pre);
        const struct out *want = alone[cases[c].kvt == DT_BF16];
        int ok = rc == 0, mism = -1;
        for (int i = 0; ok && i < N_REQ; i++) {
            if (i == cases[c].cancel)
                ok = got[i].finished && got[i].n < MAX_NEW; /* stopped early */
            else if (!same(&got[i], &want[i]))
                ok = 0, mism = i;
        }
        if (ok && cases[c].budget < (1u << 20) && pre == 0)
            ok = 0; /* the small budget must have preempted */
        if (ok && g_releases == 0)
            ok = 0; /* prompts longer than the window: sliding blocks must have been released */
        if (ok && cases[c].cancel == SEQUENTIAL && g_hits < 32)
            ok = 0; /* request 6 extends request 1's 40 tokens: two whole blocks at least */
        printf("%s %s: rc %d, preemptions %llu, sliding blocks released %llu, "
               "prefix hits %llu%s\n",
               ok ? "ok  " : "FAIL", cases[c].name, rc, (unsigned long long)pre,
               (unsigned long long)g_releases, (unsigned long long)g_hits,
               mism >= 0 ? " (ids differ from alone)" : "");
        if (mism >= 0) {
            printf("  request %d alone:", mism);
            for (size_t t = 0; t < want[mism].n; t++)
                printf(" %d", want[mism].ids[t]);
            printf("\n  request %d batched:", mism);
            for (size_t t = 0; t < got[mism].n; t++)
                printf(" %d", got[mism].ids[t]);
            printf("\n");
        }
        ok ? passed++ : failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
