/*
 * batch_inv.c — issue 16's "the same tokens at any batch size" (and gpt-oss acceptance 4 on
 * every ISA) on one model directory, at the ISA CLOCHER_ISA names: batch-invariant requests
 * (engine_request.batch_invariant) give, under load, the bits they give alone.
 *  1. greedy: 8 requests of mixed prompt lengths run one at a time, then at once (two of them
 *     joining mid-run, prefill chunked by a smaller step budget): the same ids, and every
 *     logits row they sampled from equal bit for bit;
 *  2. seeded sampling: one sampled request alone, then beside 9 others (greedy and sampled,
 *     invariant or not, long and short prompts, three joining while it decodes): the same
 *     ids and logits bits;
 *  3. the control: (1) again without the flag; prints how many logits rows differ from the
 *     flagged alone runs (the caller decides whether the ISA must show a difference: the
 *     f32/bf16 SIMD products round differently at other batch sizes, which is the point).
 *
 * With ADAPTER_DIR (a PEFT LoRA adapter), every other request uses it, so the batch mixes
 * adapted and base rows (the LoRA update's segments then differ between alone and batched).
 *
 * usage: batch_inv MODEL_DIR [ADAPTER_DIR]. Prints one line per check, then "control: D of N rows differ"
 * and "N passed, M failed"; exit 0 when every check passed, 77 (skip) when the CPU lacks the
 * ISA CLOCHER_ISA names.
 */
#include "engine.h"
#include "engine_internal.h"
#include "kern.h"
#include "kv.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_REQ 10
#define MAX_NEW 16
#define MAX_PROMPT 120

struct out {
    int32_t ids[MAX_NEW + 4];
    uint64_t rows[MAX_NEW + 4]; /* FNV-1a of each sampled logits row's bytes */
    size_t n, n_rows;
    int finished;
};

static struct out *g_outs[64]; /* request id -> its output (ids are small and dense here) */

static void on_event(const struct engine_event *ev, void *ud)
{
    (void)ud;
    struct out *o = ev->user;
    if (ev->kind == ENGINE_EV_TOKEN && ev->token >= 0 && o->n < MAX_NEW + 4)
        o->ids[o->n++] = ev->token;
    else if (ev->kind == ENGINE_EV_FINISH)
        o->finished = 1;
}

static void tap(void *ud, uint64_t id, uint32_t n_gen, const float *logits, size_t vocab)
{
    (void)ud;
    (void)n_gen;
    if (id >= 64 || !g_outs[id])
        return;
    struct out *o = g_outs[id];
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    const unsigned char *b = (const unsigned char *)logits;
    for (size_t i = 0; i < vocab * sizeof *logits; i++)
        h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    if (o->n_rows < MAX_NEW + 4)
        o->rows[o->n_rows++] = h;
}

static const char *g_adapter; /* ADAPTER_DIR, or NULL */
static int32_t g_prompt[N_REQ][MAX_PROMPT];
/* mixed lengths: a 1-token prompt, short ones, ones longer than the step budget (chunked) */
static const size_t g_len[N_REQ] = {1, 37, 9, 100, 18, 64, 3, 77, 120, 29};

struct spec {
    float temperature; /* 0: greedy */
    uint64_t seed;
    bool invariant;
};

/*
 * Runs the requests whose bit is in `mask` on a fresh engine (step budget `budget`): one at a
 * time when `alone`, else all at once, those in `late` submitted after `late_step` steps.
 * 0 or a negative code.
 */
static int run(const char *dir, unsigned mask, const struct spec *sp, bool alone,
               uint32_t budget, unsigned late, int late_step, struct out *out)
{
    struct engine_config cfg = {.model_dir = dir, .n_threads = 2, .kv_budget_bytes = 64u << 20,
                                .prefix_cache = true, .max_step_tokens = budget,
                                .max_running = N_REQ};
    struct engine *e;
    int rc = engine_create(&cfg, on_event, NULL, &e);
    if (rc)
        return rc;
    engine__set_logits_tap(e, tap, NULL);
    if (g_adapter && (rc = engine_load_adapter(e, "a", g_adapter))) {
        engine_destroy(e);
        return rc;
    }
    memset(g_outs, 0, sizeof g_outs);
    size_t active = 0;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        for (int i = 0; i < N_REQ && !rc; i++) {
            if (!(mask >> i & 1) || (!alone && (pass == 1) != ((late >> i & 1) != 0)))
                continue;
            memset(&out[i], 0, sizeof out[i]);
            struct engine_request r = {.prompt = g_prompt[i], .n_prompt = g_len[i],
                                       .max_new = MAX_NEW, .temperature = sp[i].temperature,
                                       .top_p = 0.95f, .repeat_penalty = 1, .seed = sp[i].seed,
                                       .user = &out[i], .ignore_eos = true,
                                       .batch_invariant = sp[i].invariant,
                                       .adapter = g_adapter && i % 2 ? "a" : NULL,
                                       .adapter_scale = 1.0f};
            uint64_t id;
            if ((rc = engine_submit(e, &r, &id)))
                break;
            if (id >= 64) {
                fprintf(stderr, "batch_inv: request id %llu\n", (unsigned long long)id);
                rc = -1;
                break;
            }
            g_outs[id] = &out[i];
            if (alone)
                do
                    rc = engine_step(e, &active);
                while (!rc && active);
        }
        for (int s = 0; !alone && !rc && s < (pass == 0 ? late_step : 1 << 30); s++) {
            if ((rc = engine_step(e, &active)) || (rc = kv_pool_validate(engine__kv(e))))
                break;
            if (pass == 1 && !active)
                break;
        }
        if (alone)
            break;
    }
    engine_destroy(e);
    return rc;
}

static int g_pass, g_fail;

static void check(const char *what, bool ok, const char *detail)
{
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail && *detail ? ": " : "",
           detail ? detail : "");
    ok ? g_pass++ : g_fail++;
}

/* Compares b against a (the alone run): ids and logits rows. */
static void same(const char *what, int i, const struct out *a, const struct out *b)
{
    char name[128], detail[160] = "";
    snprintf(name, sizeof name, "%s: request %d (%zu prompt tokens)", what, i, g_len[i]);
    size_t d = 0;
    while (d < a->n && d < b->n && a->ids[d] == b->ids[d])
        d++;
    bool ok = a->finished && b->finished && a->n == MAX_NEW && b->n == a->n && d == a->n &&
              a->n_rows == b->n_rows &&
              memcmp(a->rows, b->rows, a->n_rows * sizeof a->rows[0]) == 0;
    if (!ok)
        snprintf(detail, sizeof detail, "%zu and %zu ids, first difference at %zu; %zu/%zu rows",
                 a->n, b->n, d, a->n_rows, b->n_rows);
    check(name, ok, detail);
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: batch_inv MODEL_DIR [ADAPTER_DIR]\n");
        return 2;
    }
    g_adapter = argc == 3 ? argv[2] : NULL;
    const char *isa = getenv("CLOCHER_ISA");
    for (int i = 0; isa && i < 3; i++)
        if (!strcmp(isa, kern_isa_name((enum kern_isa)i)) &&
            !kern_isa_supported((enum kern_isa)i)) {
            printf("skip: this CPU has no %s\n", isa);
            return 77;
        }
    struct model *m;
    if (model_open(argv[1], 0, &m)) {
        fprintf(stderr, "batch_inv: cannot open %s\n", argv[1]);
        return 1;
    }
    uint32_t vocab = m->hp.vocab_size;
    model_close(m);
    uint64_t s = 12345;
    for (int i = 0; i < N_REQ; i++)
        for (int k = 0; k < MAX_PROMPT; k++) {
            s = s * UINT64_C(6364136223846793005) + 1442695040888963407u;
            g_prompt[i][k] = (int32_t)((s >> 33) % vocab);
        }
    /* request 5 shares request 3's first 40 tokens: a prefix the cache may hand over */
    memcpy(g_prompt[5], g_prompt[3], 40 * sizeof g_prompt[3][0]);

    static struct out alone[N_REQ], batched[N_REQ], ctl[N_REQ];
    struct spec sp[N_REQ];
    int rc;

    /* 1. greedy, requests 0..7 */
    for (int i = 0; i < N_REQ; i++)
        sp[i] = (struct spec){0, 0, true};
    const unsigned greedy = 0xff;
    if ((rc = run(argv[1], greedy, sp, true, 256, 0, 0, alone))) {
        printf("FAIL greedy alone: %d\n", rc);
        return 1;
    }
    if ((rc = run(argv[1], greedy, sp, false, 48, 1u << 2 | 1u << 6, 3, batched))) {
        printf("FAIL greedy batched: %d\n", rc);
        return 1;
    }
    for (int i = 0; i < 8; i++)
        same("greedy batched = alone", i, &alone[i], &batched[i]);

    /* 3. the control: the same batch without the flag */
    for (int i = 0; i < N_REQ; i++)
        sp[i].invariant = false;
    if ((rc = run(argv[1], greedy, sp, false, 48, 1u << 2 | 1u << 6, 3, ctl))) {
        printf("FAIL control: %d\n", rc);
        return 1;
    }
    size_t rows = 0, diff = 0;
    for (int i = 0; i < 8; i++)
        for (size_t k = 0; k < alone[i].n_rows && k < ctl[i].n_rows; k++, rows++)
            diff += alone[i].rows[k] != ctl[i].rows[k];

    /* 2. seeded sampling: request 4 alone, then beside the 9 others */
    for (int i = 0; i < N_REQ; i++)
        sp[i] = (struct spec){i % 3 ? 0.9f : 0, 1000u + (uint64_t)i, i % 4 != 1};
    sp[4] = (struct spec){0.8f, 42, true};
    if ((rc = run(argv[1], 1u << 4, sp, true, 256, 0, 0, alone))) {
        printf("FAIL sampled alone: %d\n", rc);
        return 1;
    }
    if ((rc = run(argv[1], (1u << N_REQ) - 1, sp, false, 64, 1u << 1 | 1u << 7 | 1u << 8, 4,
                  batched))) {
        printf("FAIL sampled batched: %d\n", rc);
        return 1;
    }
    same("seeded sampled under 10-way load = alone", 4, &alone[4], &batched[4]);
    for (int i = 0; i < N_REQ; i++)
        if (!batched[i].finished || batched[i].n != MAX_NEW)
            check("every request of the load finished", false, "");

    printf("control: %zu of %zu rows differ\n", diff, rows);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
