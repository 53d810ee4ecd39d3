/*
 * swa_window.c — Mistral's window in the serving engine's paged KV cache (test_models.py):
 * when every layer slides, the request's one sequence lets go of blocks older than the window
 * (engine.c release_window), so its KV stays bounded however long it runs, and blocks shared
 * with the prefix cache or another request keep their data (reference counts).
 *
 *   swa_window MODEL_DIR TOKEN N OUT
 * 1. one greedy request (prompt TOKEN, N new tokens, 4-token blocks) with the logits row of
 *    every step written to OUT [N][vocab] f32; prints its ids, then "blocks MAX RELEASES":
 *    the most blocks in use after any step and the blocks the window let go;
 * 2. two requests at once whose prompt is TOKEN + the first N/2 ids (their leading blocks are
 *    the prefix cache's, attached by both): prints each one's N - N/2 ids, one line each.
 * Exit 0, or 1 naming what failed.
 */
#include "engine.h"
#include "engine_internal.h"
#include "kern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IDS 1024

struct out {
    int32_t ids[MAX_IDS];
    size_t n;
};

static void on_event(const struct engine_event *ev, void *ud)
{
    (void)ud;
    struct out *o = ev->user;
    if (ev->kind == ENGINE_EV_TOKEN && ev->token >= 0 && o->n < MAX_IDS)
        o->ids[o->n++] = ev->token;
}

static void tap(void *ud, uint64_t id, uint32_t n_gen, const float *logits, size_t vocab)
{
    (void)id;
    (void)n_gen;
    if (ud && fwrite(logits, sizeof *logits, vocab, ud) != vocab)
        fprintf(stderr, "swa_window: writing logits failed\n");
}

/* Runs the engine until idle; *max_used: the most KV blocks in use after a step. */
static int run(struct engine *e, uint64_t *max_used)
{
    size_t active = 1;
    int rc = 0;
    while (active && !(rc = engine_step(e, &active))) {
        struct engine_metrics m;
        engine_get_metrics(e, &m);
        if (m.kv_blocks_used > *max_used)
            *max_used = m.kv_blocks_used;
    }
    return rc;
}

static void print_ids(const struct out *o)
{
    for (size_t i = 0; i < o->n; i++)
        printf("%s%d", i ? "," : "", o->ids[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: swa_window MODEL_DIR TOKEN N OUT\n");
        return 2;
    }
    int32_t prompt[MAX_IDS];
    prompt[0] = atoi(argv[2]);
    int n = atoi(argv[3]);
    if (n < 2 || n >= MAX_IDS) {
        fprintf(stderr, "swa_window: N %s is not in [2, %d)\n", argv[3], MAX_IDS);
        return 2;
    }
    FILE *f = fopen(argv[4], "wb");
    if (!f) {
        perror(argv[4]);
        return 1;
    }
    if (kern_init())
        return 1;
    struct engine_config cfg = {.model_dir = argv[1], .n_threads = 1, .kv_dtype = DT_F32,
                                .kv_block_tokens = 4, .kv_budget_bytes = 16u << 20,
                                .prefix_cache = true};
    struct engine *e;
    if (engine_create(&cfg, on_event, NULL, &e)) {
        fclose(f);
        return 1;
    }
    engine__set_logits_tap(e, tap, f);
    static struct out o, a, b;
    struct engine_request r = {.prompt = prompt, .n_prompt = 1, .max_new = (uint32_t)n,
                               .temperature = 0, .top_p = 1, .repeat_penalty = 1, .user = &o,
                               .ignore_eos = true};
    uint64_t id, max_used = 0;
    int rc = engine_submit(e, &r, &id);
    if (!rc)
        rc = run(e, &max_used);
    engine__set_logits_tap(e, tap, NULL);
    if (fclose(f) || rc) {
        engine_destroy(e);
        fprintf(stderr, "swa_window: the first request failed (%d)\n", rc);
        return 1;
    }
    struct engine_metrics m;
    engine_get_metrics(e, &m);
    print_ids(&o);
    printf("blocks %llu %llu\n", (unsigned long long)max_used,
           (unsigned long long)m.kv_window_releases);

    size_t half = (size_t)n / 2;
    memcpy(prompt + 1, o.ids, half * sizeof *prompt);
    r.n_prompt = 1 + half;
    r.max_new = (uint32_t)(n - (int)half);
    r.user = &a;
    if (!(rc = engine_submit(e, &r, &id))) {
        r.user = &b;
        rc = engine_submit(e, &r, &id);
    }
    max_used = 0;
    if (!rc)
        rc = run(e, &max_used);
    engine_destroy(e);
    if (rc) {
        fprintf(stderr, "swa_window: the two requests failed (%d)\n", rc);
        return 1;
    }
    print_ids(&a);
    print_ids(&b);
    return 0;
}
