/*
 * gptoss_batch.c — gpt-oss acceptance 4 on a model directory test_gptoss.py writes: 8 greedy
 * requests of mixed lengths (some longer than the sliding window) run concurrently through
 * the continuous-batching engine give the ids each gives alone — with the prefix cache on
 * (two prompts share a prefix), with a KV budget so small that requests are preempted and
 * recomputed, and with a bf16 KV cache (batched against bf16 alone). Also: a cancelled request
 * leaves the others' ids unchanged.
 *
 * usage: gptoss_batch MODEL_DIR. Prints one line per check and "N passed, M failed"; exit 0
 * when every check passed.
 */
#include "engine.h"
#include "err.h"
#include "kern.h"

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

/* Runs requests [0, N_REQ) whose bit is set in `mask` at once (cancel: that one is cancelled
 * after its first steps); outputs into out[]. 0 or a negative code. */
static int run(const char *dir, enum dtype kvt, uint64_t budget, unsigned mask, int cancel,
               struct out *out, uint64_t *preemptions)
{
    struct engine_config cfg = {.model_dir = dir, .n_threads = 2, .kv_dtype = kvt,
                                .kv_budget_bytes = budget, .prefix_cache = true,
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
    }
    size_t active = 1;
    for (int step = 0; active; step++) {
        if (step == 3 && cancel >= 0 && (rc = engine_cancel(e, ids[cancel])))
            goto done;
        if ((rc = engine_step(e, &active)))
            goto done;
    }
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    *preemptions = m.preemptions;
done:
    engine_destroy(e);
    return rc;
}

static int same(const struct out *a, const struct out *b)
{
    return a->n == b->n && memcmp(a->ids, b->ids, a->n * sizeof a->ids[0]) == 0;
}

int main(int argc, char **argv)
{
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
        {"f32 KV, 14 blocks (preemption)", DT_F32, 14 * 65536, -1},
        {"f32 KV, request 3 cancelled", DT_F32, 64u << 20, 3},
        {"bf16 KV, prefix cache", DT_BF16, 64u << 20, -1},
    };
    struct out alone[2][N_REQ]; /* [f32, bf16] */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_REQ; i++) {
            uint64_t pre;
            int rc = run(argv[1], k ? DT_BF16 : DT_F32, 64u << 20, 1u << i, -1, alone[k], &pre);
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
        printf("%s %s: rc %d, preemptions %llu%s\n", ok ? "ok  " : "FAIL", cases[c].name, rc,
               (unsigned long long)pre, mism >= 0 ? " (ids differ from alone)" : "");
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
