/*
 * test_inference_engine.c — the `inference-engine` command, run as a process: usage errors
 * (exit 2 with a message), missing or invalid models (exit 3), the JSON line on stdout and
 * its keys, greedy ids equal to llama2.c's on stories260K, --dump-logits against the golden
 * logits, and text prompts, stop strings, prompt files and rounds on a small random-weight
 * model carrying the Llama 2 tokenizer.
 */
#include "testutil.h"
#include "rng.h"

#include "golden.h"

#include "iebin.h"
#include "llama2c.h"
#include "tok.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static struct golden g_gold;
static char *g_tmp, *g_s260k, *g_text_model, *g_err;

/* ---- a random-weight model with a real tokenizer ---------------------------------------------- */

static uint64_t g_rng = 0x243f6a8885a308d3u;

static float rnd(void) /* uniform in [-1, 1) */
{
    rng_xorshift64(&g_rng);
    return (float)(g_rng >> 40) / (float)(1u << 23) - 1.0f;
}

static void add(struct iebin_writer *w, const char *name, uint64_t rows, uint64_t cols,
                float scale, bool norm)
{
    uint64_t shape[2] = {rows, cols};
    size_t n = (size_t)(norm ? cols : rows * cols);
    float *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = norm ? 1.0f : scale * rnd();
    int nd = norm ? 1 : 2;
    const uint64_t *sh = norm ? &shape[1] : shape;
    assert_int_equal(iebin_writer_add(w, name, DT_F32, sh, nd, d, n * sizeof *d), 0);
    free(d);
}

static char *make_text_model(const char *tmp)
{
    char *dir = strdup(tu_path(tmp, "textmodel"));
    struct tok *tok;
    assert_int_equal(tok_load(tu_fixture("tokenizer/llama2-tokenizer.model"), &tok), 0);
    struct iebin_hparams hp = {.dim = 32, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
                               .head_dim = 16, .ffn_dim = 64,
                               .vocab_size = tok_vocab_size(tok), .max_seq_len = 256,
                               .rope_theta = 10000.0f, .rms_eps = 1e-5f,
                               .tied_embeddings = true};
    struct iebin_writer *w;
    assert_int_equal(iebin_writer_create(dir, "llama", "random-llama2-vocab", &hp, &w), 0);
    add(w, IEBIN_T_TOK_EMBD, hp.vocab_size, hp.dim, 1.0f, false);
    add(w, IEBIN_T_OUTPUT_NORM, 0, hp.dim, 0, true);
    for (uint32_t l = 0; l < hp.n_layers; l++) {
        char name[64];
#define T(kind) (snprintf(name, sizeof name, "blk.%u.%s", l, kind), name)
        add(w, T(IEBIN_T_ATTN_NORM), 0, hp.dim, 0, true);
        add(w, T(IEBIN_T_ATTN_Q), 32, hp.dim, 0.3f, false);
        add(w, T(IEBIN_T_ATTN_K), 16, hp.dim, 0.3f, false);
        add(w, T(IEBIN_T_ATTN_V), 16, hp.dim, 0.3f, false);
        add(w, T(IEBIN_T_ATTN_O), hp.dim, 32, 0.3f, false);
        add(w, T(IEBIN_T_FFN_NORM), 0, hp.dim, 0, true);
        add(w, T(IEBIN_T_FFN_GATE), hp.ffn_dim, hp.dim, 0.3f, false);
        add(w, T(IEBIN_T_FFN_UP), hp.ffn_dim, hp.dim, 0.3f, false);
        add(w, T(IEBIN_T_FFN_DOWN), hp.dim, hp.ffn_dim, 0.3f, false);
#undef T
    }
    char *json;
    size_t len;
    assert_int_equal(tok_save_json(tok, &json, &len), 0);
    assert_int_equal(iebin_writer_set_tokenizer(w, json, len), 0);
    assert_int_equal(iebin_writer_finish(w), 0);
    free(json);
    tok_free(tok);
    return dir;
}

static int setup(void **state)
{
    (void)state;
    golden_load(&g_gold);
    g_s260k = golden_import(DT_F32, &g_tmp);
    g_text_model = make_text_model(g_tmp);
    g_err = strdup(tu_path(g_tmp, "stderr.txt"));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_tmp);
    free(g_tmp);
    free(g_s260k);
    free(g_text_model);
    free(g_err);
    golden_free(&g_gold);
    return 0;
}

/* ---- running the command ---------------------------------------------------------------------- */

/* Runs inference-engine with `args` (shell words); stdout in *out, stderr in *err (malloc'd). */
static int engine(const char *args, char **out, char **err)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", tu_build_path("worker/inference-engine"), args,
             g_err);
    int rc = tu_run(cmd, out);
    size_t len;
    char *e = tu_read_file(g_err, &len);
    if (err)
        *err = e;
    else
        free(e);
    return rc;
}

static void expect_exit(const char *args, int code, const char *needle)
{
    char *out, *err;
    int rc = engine(args, &out, &err);
    if (rc != code || (needle && !strstr(err, needle)))
        fail_msg("inference-engine %s: exit %d (expected %d), stderr:\n%s\n(expected to "
                 "contain '%s')",
                 args, rc, code, err, needle ? needle : "");
    assert_string_equal(out, ""); /* nothing but JSON lines ever reaches stdout */
    free(out);
    free(err);
}

static char *ids_arg(const int32_t *ids, size_t n)
{
    char *s = malloc(n * 12 + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        at += (size_t)sprintf(s + at, i ? ",%d" : "%d", ids[i]);
    s[at] = '\0';
    return s;
}

/* Exactly one JSON object line on stdout. */
static json_t *one_json(const char *out)
{
    const char *nl = strchr(out, '\n');
    if (!nl || nl[1] != '\0')
        fail_msg("expected exactly one line on stdout, got:\n%s", out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j || !json_is_object(j))
        fail_msg("stdout is not a JSON object (%s): %s", e.text, out);
    return j;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_help(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(engine("--help", &out, NULL), 0);
    assert_non_null(strstr(out, "usage: inference-engine --model-dir DIR"));
    assert_non_null(strstr(out, "--dump-logits FILE"));
    assert_non_null(strstr(out, "exit status"));
    free(out);
}

static void test_usage_errors(void **state)
{
    (void)state;
    char a[4096];
    expect_exit("", 2, "--model-dir DIR is required");
    expect_exit("--bogus", 2, "unknown option '--bogus'");
    expect_exit("--model-dir x extra", 2, "unexpected argument 'extra'");
    expect_exit("--model-dir x", 2, "exactly one of --prompt, --prompts-file, --prompt-ids");
    expect_exit("--model-dir x --prompt hi --prompt-ids 1", 2, "exactly one of");
    expect_exit("--model-dir x --prompt-ids", 2, "--prompt-ids needs a value");
    expect_exit("--model-dir x --prompt-ids 1 --max-new abc", 2,
                "--max-new: 'abc' is not an integer");
    expect_exit("--model-dir x --prompt-ids 1 --threads 0", 2, "--threads: '0'");
    expect_exit("--model-dir x --prompt-ids 1 --top-p 0", 2, "top_p 0 must be in (0, 1]");
    expect_exit("--model-dir x --prompt-ids 1 --temperature -1", 2, "temperature -1");
    expect_exit("--model-dir x --prompt-ids 1 --min-p 1.5", 2, "min_p 1.5");
    expect_exit("--model-dir x --prompt-ids 1 --repeat-penalty 0", 2, "repeat_penalty 0");
    expect_exit("--model-dir x --prompt-ids 1 --temperature nan", 2,
                "--temperature: 'nan' is not a finite number");
    expect_exit("--model-dir x --prompt-ids 1 --stop ''", 2, "stop string is empty");
    expect_exit("--model-dir x --prompt-ids 1 --seed -4", 2, "--seed: '-4'");

    /* errors found once the model is known */
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1,x,3", g_s260k);
    expect_exit(a, 2, "--prompt-ids: element 1 of '1,x,3' is not a token id");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1,,3", g_s260k);
    expect_exit(a, 2, "element 1");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1,600", g_s260k);
    expect_exit(a, 2, "token 1: id 600 is outside the model's vocabulary of 512");
    snprintf(a, sizeof a, "--model-dir %s --prompt 'Once upon'", g_s260k);
    expect_exit(a, 2, "the model has no tokenizer: give the prompt as --prompt-ids");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1 --stop x", g_s260k);
    expect_exit(a, 2, "has no tokenizer");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1 --ctx 1000", g_s260k);
    expect_exit(a, 2, "--ctx 1000 exceeds the model's context length 512");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1,2,3,4,5 --ctx 4", g_s260k);
    expect_exit(a, 2, "prompt 0 has 5 tokens: more than the context of 4 positions");
    snprintf(a, sizeof a, "--model-dir %s --prompts-file %s/none.txt", g_text_model, g_tmp);
    expect_exit(a, 2, "none.txt");
    const char *blank = tu_path(g_tmp, "blank.txt");
    tu_write_file(blank, "\n\n\r\n", 4);
    snprintf(a, sizeof a, "--model-dir %s --prompts-file %s", g_text_model, blank);
    expect_exit(a, 2, "no prompts (every line is blank)");
    snprintf(a, sizeof a, "--model-dir %s --prompt '' --no-bos", g_text_model);
    expect_exit(a, 2, "prompt 0 is empty");
}

static void test_model_errors(void **state)
{
    (void)state;
    char a[4096];
    snprintf(a, sizeof a, "--model-dir %s/missing --prompt-ids 1", g_tmp);
    expect_exit(a, 3, "missing");

    char *bad = strdup(tu_path(g_tmp, "bad"));
    mkdir(bad, 0755);
    tu_write_file(tu_path(bad, "model.ie.json"), "{\"format\": \"iebin\", \"version\": 1", 33);
    tu_write_file(tu_path(bad, "model.ie.bin"), "", 0);
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1", bad);
    expect_exit(a, 3, "model.ie.json");

    /* a tokenizer with more tokens than the model's vocabulary */
    struct tok *tok;
    assert_int_equal(tok_load(tu_fixture("tokenizer/llama2-tokenizer.model"), &tok), 0);
    char *json;
    size_t len;
    assert_int_equal(tok_save_json(tok, &json, &len), 0);
    const char *dir = tu_path(g_tmp, "s260k-big-tokenizer");
    assert_int_equal(llama2c_convert(tu_fixture("stories260K/stories260K.bin"), json, len, dir,
                                     DT_F32, NULL),
                     0);
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids 1", dir);
    expect_exit(a, 3, "the tokenizer has 32000 tokens, more than the model's vocab_size 512");
    free(json);
    tok_free(tok);
    free(bad);
}

static void test_golden_greedy(void **state)
{
    (void)state;
    const struct golden_case *gc = &g_gold.cases[1];
    char *ids = ids_arg(gc->prompt, gc->n_prompt);
    for (int threads = 1; threads <= 2; threads++) {
        char a[8192], *out;
        snprintf(a, sizeof a,
                 "--model-dir %s --prompt-ids %s --greedy --max-new %zu --print-ids "
                 "--threads %d",
                 g_s260k, ids, gc->cutoff, threads);
        assert_int_equal(engine(a, &out, NULL), 0);
        json_t *j = one_json(out);
        static const char *const keys[] = {
            "model",  "prompt_tokens", "generated_tokens", "wall_s",    "tps",
            "ttft_ms", "p50_ms",       "p95_ms",           "load_ms",   "rss_peak_mb",
            "threads", "kv_hits",      "kv_misses",        "isa",       "finish",
            "generated_ids", "text",   "prefill_tps",      "decode_tps", "rounds"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!json_object_get(j, keys[k]))
                fail_msg("key '%s' missing from %s", keys[k], out);
        assert_string_equal(json_string_value(json_object_get(j, "model")), "stories260K");
        assert_int_equal(json_integer_value(json_object_get(j, "prompt_tokens")), gc->n_prompt);
        assert_int_equal(json_integer_value(json_object_get(j, "generated_tokens")),
                         gc->cutoff);
        assert_int_equal(json_integer_value(json_object_get(j, "threads")), threads);
        assert_int_equal(json_integer_value(json_object_get(j, "kv_hits")), 0);
        assert_string_equal(json_string_value(json_object_get(j, "finish")), "length");
        assert_true(json_is_null(json_object_get(j, "text")));
        assert_true(json_number_value(json_object_get(j, "tps")) > 0);
        assert_true(json_number_value(json_object_get(j, "rss_peak_mb")) > 0);
        assert_true(json_number_value(json_object_get(j, "p95_ms")) >=
                    json_number_value(json_object_get(j, "p50_ms")));
        const char *isa = json_string_value(json_object_get(j, "isa"));
        assert_true(strcmp(isa, "ref") == 0 || strcmp(isa, "avx2") == 0 ||
                    strcmp(isa, "avx512") == 0);
        json_t *gen = json_object_get(j, "generated_ids");
        assert_int_equal(json_array_size(gen), gc->cutoff);
        for (size_t i = 0; i < gc->cutoff; i++)
            if (json_integer_value(json_array_get(gen, i)) != gc->greedy[i])
                fail_msg("threads %d: generated id %zu is %lld, golden %d", threads, i,
                         (long long)json_integer_value(json_array_get(gen, i)), gc->greedy[i]);
        json_decref(j);
        free(out);
    }
    free(ids);
}

static void test_dump_logits(void **state)
{
    (void)state;
    const struct golden_case *gc = &g_gold.cases[1];
    const size_t V = g_gold.vocab, gen = 51;
    char *ids = ids_arg(gc->prompt, gc->n_prompt);
    const char *dump = tu_path(g_tmp, "logits.f32");
    char a[8192], *out;
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids %s --greedy --max-new %zu --dump-logits %s",
             g_s260k, ids, gen, dump);
    assert_int_equal(engine(a, &out, NULL), 0);
    json_decref(one_json(out));
    free(out);
    size_t len;
    float *rows = (float *)tu_read_file(dump, &len);
    const size_t positions = gc->n_prompt + gen - 1;
    assert_int_equal(len, positions * V * sizeof(float));
    for (size_t p = 0; p < gc->n_prompt; p++)
        assert_true(golden_max_diff(rows + p * V, gc->prompt_logits + p * V, V) <= 1e-4f);
    size_t checked = 0;
    for (size_t k = 0; k < gc->n_steps; k++) {
        size_t row = gc->n_prompt - 1 + gc->step[k]; /* step g: after feeding g tokens */
        if (row >= positions)
            break;
        float d = golden_max_diff(rows + row * V, gc->step_logits[k], V);
        if (!(d <= 1e-4f))
            fail_msg("greedy step %zu (row %zu): max diff %g", gc->step[k], row, (double)d);
        checked++;
    }
    assert_int_equal(checked, 3); /* steps 0, 25, 50 */
    free(rows);

    /* --max-new 0: the prompt only */
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids %s --max-new 0 --dump-logits %s", g_s260k,
             ids, dump);
    assert_int_equal(engine(a, &out, NULL), 0);
    json_t *j = one_json(out);
    assert_int_equal(json_integer_value(json_object_get(j, "generated_tokens")), 0);
    json_decref(j);
    free(out);
    rows = (float *)tu_read_file(dump, &len);
    assert_int_equal(len, gc->n_prompt * V * sizeof(float));
    assert_true(golden_max_diff(rows, gc->prompt_logits, gc->n_prompt * V) <= 1e-4f);
    free(rows);
    free(ids);
}

/* generated_ids and text of one run with a text prompt */
static json_t *text_run(const char *extra, char **err)
{
    char a[8192], *out;
    snprintf(a, sizeof a,
             "--model-dir %s --prompt 'Once upon a time' --max-new 40 --seed 7 --print-ids %s",
             g_text_model, extra);
    assert_int_equal(engine(a, &out, err), 0);
    json_t *j = one_json(out);
    free(out);
    return j;
}

static void test_text_and_stop(void **state)
{
    (void)state;
    char *err;
    json_t *j = text_run("", &err);
    const char *text = json_string_value(json_object_get(j, "text"));
    assert_non_null(text);
    assert_true(strlen(text) > 20);
    /* the text is streamed to stderr too */
    assert_non_null(strstr(err, text));
    free(err);
    /* it is the decoding of the ids (SentencePiece's leading space kept: it continues text) */
    struct tok *tok;
    assert_int_equal(tok_load(g_text_model, &tok), 0);
    json_t *gen = json_object_get(j, "generated_ids");
    size_t n = json_array_size(gen);
    assert_int_equal(n, json_integer_value(json_object_get(j, "generated_tokens")));
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(gen, i));
    char *dec;
    size_t dlen;
    assert_int_equal(tok_decode(tok, ids, n, &dec, &dlen), 0);
    assert_true(strcmp(text, dec) == 0 || (text[0] == ' ' && strcmp(text + 1, dec) == 0));
    /* "Once upon a time" with BOS: as the tokenizer encodes it */
    int32_t *pids;
    size_t np;
    assert_int_equal(tok_encode(tok, "Once upon a time", 16, true, &pids, &np), 0);
    assert_int_equal(json_integer_value(json_object_get(j, "prompt_tokens")), np);
    free(pids);

    /* a stop string taken from the middle of the text: 4 ASCII bytes */
    size_t tl = strlen(text), at = tl / 2;
    while (at + 4 < tl && !((unsigned char)text[at] < 0x80 && (unsigned char)text[at + 1] < 0x80
                            && (unsigned char)text[at + 2] < 0x80 &&
                            (unsigned char)text[at + 3] < 0x80 && text[at] != '\'' &&
                            text[at + 1] != '\'' && text[at + 2] != '\'' &&
                            text[at + 3] != '\''))
        at++;
    assert_true(at + 4 < tl);
    char stop[5];
    memcpy(stop, text + at, 4);
    stop[4] = '\0';
    size_t first = (size_t)(strstr(text, stop) - text);
    char extra[64];
    snprintf(extra, sizeof extra, "--stop '%s' --stop 'never-appears'", stop);
    json_t *s = text_run(extra, NULL);
    const char *st = json_string_value(json_object_get(s, "text"));
    assert_string_equal(json_string_value(json_object_get(s, "finish")), "stop");
    assert_int_equal(strlen(st), first);
    assert_memory_equal(st, text, first);
    /* the same tokens up to the one that completed the stop string */
    json_t *sg = json_object_get(s, "generated_ids");
    assert_true(json_array_size(sg) <= n);
    for (size_t i = 0; i < json_array_size(sg); i++)
        assert_int_equal(json_integer_value(json_array_get(sg, i)), ids[i]);
    json_decref(s);

    /* rounds and warmup: one line, the same output */
    json_t *r = text_run("--rounds 3 --warmup 1 --quiet", &err);
    assert_int_equal(json_integer_value(json_object_get(r, "rounds")), 3);
    assert_string_equal(json_string_value(json_object_get(r, "text")), text);
    assert_string_equal(err, ""); /* --quiet */
    free(err);
    json_decref(r);

    /* another seed, another text */
    json_t *o = text_run("--seed 8", NULL);
    assert_string_not_equal(json_string_value(json_object_get(o, "text")), text);
    json_decref(o);

    free(dec);
    free(ids);
    tok_free(tok);
    json_decref(j);
}

static void test_prompts_file(void **state)
{
    (void)state;
    const char *file = tu_path(g_tmp, "prompts.txt");
    const char body[] = "Once upon a time\n\nThe cat sat\r\n";
    tu_write_file(file, body, sizeof body - 1);
    char a[8192], *out;
    snprintf(a, sizeof a, "--model-dir %s --prompts-file %s --max-new 5 --greedy --quiet",
             g_text_model, file);
    assert_int_equal(engine(a, &out, NULL), 0);
    /* two lines (the blank one is skipped), each a JSON object */
    char *nl = strchr(out, '\n');
    assert_non_null(nl);
    json_error_t e;
    json_t *j0 = json_loadb(out, (size_t)(nl - out), 0, &e);
    json_t *j1 = one_json(nl + 1);
    assert_non_null(j0);
    assert_int_equal(json_integer_value(json_object_get(j0, "index")), 0);
    assert_int_equal(json_integer_value(json_object_get(j1, "index")), 1);
    assert_int_equal(json_integer_value(json_object_get(j0, "generated_tokens")), 5);
    struct tok *tok;
    assert_int_equal(tok_load(g_text_model, &tok), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(tok, "The cat sat", 11, true, &ids, &n), 0);
    assert_int_equal(json_integer_value(json_object_get(j1, "prompt_tokens")), n);
    free(ids);
    tok_free(tok);
    json_decref(j0);
    json_decref(j1);
    free(out);
}

/* --concurrency: N requests at once through the serving engine, one JSON line per round. */
static void test_concurrency(void **state)
{
    (void)state;
    const struct golden_case *gc = &g_gold.cases[3];
    char *ids = ids_arg(gc->prompt, gc->n_prompt);
    char a[8192], *out;
    snprintf(a, sizeof a,
             "--model-dir %s --prompt-ids %s --greedy --max-new 16 --concurrency 4 --rounds 2 "
             "--threads 2",
             g_s260k, ids);
    assert_int_equal(engine(a, &out, NULL), 0);
    char *nl = strchr(out, '\n');
    assert_non_null(nl);
    *nl = '\0';
    json_t *j[2];
    json_error_t e;
    j[0] = json_loads(out, 0, &e);
    j[1] = json_loads(nl + 1, 0, &e);
    assert_non_null(j[0]);
    assert_non_null(j[1]);
    for (int r = 0; r < 2; r++) {
        static const char *const keys[] = {"concurrency", "tps", "ttft_p50_ms", "ttft_p95_ms",
                                           "e2e_p50_ms", "e2e_p95_ms", "p50_ms", "p95_ms",
                                           "kv_hits", "kv_misses", "preemptions", "isa"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!json_object_get(j[r], keys[k]))
                fail_msg("key '%s' missing from round %d", keys[k], r);
        assert_int_equal(json_integer_value(json_object_get(j[r], "generated_tokens")), 64);
        assert_int_equal(json_integer_value(json_object_get(j[r], "prompt_tokens")),
                         4 * gc->n_prompt);
        assert_true(json_number_value(json_object_get(j[r], "tps")) > 0);
        assert_true(json_number_value(json_object_get(j[r], "e2e_p95_ms")) >=
                    json_number_value(json_object_get(j[r], "e2e_p50_ms")));
    }
    /* the second round finds the first round's prompt blocks */
    assert_true(json_integer_value(json_object_get(j[1], "kv_hits")) > 0);
    json_decref(j[0]);
    json_decref(j[1]);
    free(out);
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids %s --concurrency 0", g_s260k, ids);
    expect_exit(a, 2, "--concurrency");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids %s --concurrency 2 --dump-logits x",
             g_s260k, ids);
    expect_exit(a, 2, "--dump-logits works on the reference path only");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids %s --adapter noequals", g_s260k, ids);
    expect_exit(a, 2, "expected NAME=DIR");
    snprintf(a, sizeof a, "--model-dir %s --prompt-ids %s --concurrency 2 --lora-weights int3",
             g_s260k, ids);
    expect_exit(a, 2, "LoRA weight packing 'int3' is unknown: auto, bf16 or int8");
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_golden_greedy),
        cmocka_unit_test(test_dump_logits),
        cmocka_unit_test(test_text_and_stop),
        cmocka_unit_test(test_prompts_file),
        cmocka_unit_test(test_concurrency),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
