/*
 * test_harmony.c — the harmony chat format (worker/tok/harmony.c) on a small byte-level
 * vocabulary that holds the harmony specials: rendered prompts are compared, token by token,
 * with the strings written by hand from the spec (gpt-oss.md §5 "Harmony chat format"), and
 * generated ids are parsed into channels with the stops they end on. The same checks on the
 * real o200k_harmony vocabulary run in test_tok_tiktoken (it needs js-tiktoken's ranks).
 */
#include "testutil.h"

#include "err.h"
#include "harmony.h"
#include "tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SPECIALS[] = {"<|startoftext|>", "<|endoftext|>", "<|return|>",
                                       "<|constrain|>",   "<|channel|>",   "<|start|>",
                                       "<|end|>",         "<|message|>",   "<|call|>"};

/* 256 byte-level characters, no merges, the harmony specials as special added tokens */
static struct tok *harmony_vocab(bool with_specials)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        /* GPT-2's byte-level alphabet */
        int cp = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? b : -1;
        if (cp < 0) {
            int k = 0;
            for (int c = 0; c < b; c++)
                if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
                    k++;
            cp = 256 + k;
        }
        char s[4];
        if (cp < 0x80) {
            s[0] = (char)cp, s[1] = 0;
        } else {
            s[0] = (char)(0xC0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3F)), s[2] = 0;
        }
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_t *added = json_array();
    size_t ns = with_specials ? sizeof SPECIALS / sizeof SPECIALS[0] : 1;
    for (size_t i = 0; i < ns; i++)
        json_array_append_new(added, json_pack("{sisssb}", "id", (int)(256 + i), "content",
                                               SPECIALS[i], "special", 1));
    json_t *doc = json_pack("{s{ssso}so s{ss}}", "model", "type", "BPE", "vocab", vocab,
                            "added_tokens", added, "pre_tokenizer", "type", "ByteLevel");
    json_object_set_new(json_object_get(doc, "model"), "merges", json_array());
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = NULL;
    tu_log_capture_begin();
    int rc = tok_load_mem(text, strlen(text), "hf-json", &t);
    if (rc != 0)
        fail_msg("vocabulary: %s\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    free(text);
    return t;
}

/* ids shown as text with the specials spelled out */
static char *show(const struct tok *t, const int32_t *ids, size_t n)
{
    size_t cap = 16 * n + 1, len = 0;
    char *s = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t l;
        if (tok_token_type(t, ids[i]) == TOK_CONTROL) {
            b = tok_token_str(t, ids[i]);
            l = strlen(b);
        } else {
            assert_int_equal(tok_piece(t, ids[i], &b, &l), 0);
        }
        assert_true(len + l < cap);
        memcpy(s + len, b, l);
        len += l;
    }
    s[len] = '\0';
    return s;
}

static void expect_render(const struct tok *t, const struct harmony_msg *m, size_t n,
                          const struct harmony_opts *o, const char *want)
{
    int32_t *ids;
    size_t n_ids;
    tu_log_capture_begin();
    int rc = harmony_render(t, m, n, o, &ids, &n_ids);
    if (rc != 0)
        fail_msg("harmony_render: %s\n%s", err_name(rc), tu_log_captured());
    tu_log_capture_end();
    char *got = show(t, ids, n_ids);
    if (strcmp(got, want) != 0)
        fail_msg("rendered:\n%s\n---- want:\n%s", got, want);
    char *dec;
    size_t dl;
    assert_int_equal(tok_decode_ex(t, ids, n_ids, TOK_DEC_SPECIAL, &dec, &dl), 0);
    assert_string_equal(dec, want); /* specials decode to their strings when asked */
    assert_int_equal(dl, strlen(want));
    free(dec);
    /* the same ids as encoding the hand-written string with specials allowed */
    int32_t *w;
    size_t nw;
    assert_int_equal(tok_encode_ex(t, want, strlen(want), TOK_ENC_SPECIAL, &w, &nw), 0);
    assert_int_equal(nw, n_ids);
    assert_memory_equal(w, ids, nw * sizeof *w);
    free(w);
    free(got);
    free(ids);
}

#define SYS_HIGH                                                                            \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" \
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"              \
    "# Valid channels: analysis, commentary, final. Channel must be included for every "      \
    "message.<|end|>"

static void render_spec_prompt(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab(true);
    /* the spec's minimal prompt, with instructions */
    struct harmony_msg m[] = {{.role = HARMONY_USER, .content = "What is 2 + 2?"}};
    struct harmony_opts o = {.effort = HARMONY_EFFORT_HIGH, .current_date = "2025-06-28",
                             .instructions = "Answer briefly."};
    expect_render(t, m, 1, &o,
                  SYS_HIGH "<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|>"
                           "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant");
    /* the instructions from a system message; medium effort, no date, tools defined */
    struct harmony_msg m2[] = {{.role = HARMONY_SYSTEM, .content = "Be kind."},
                               {.role = HARMONY_USER, .content = "Hi"}};
    struct harmony_opts o2 = {.functions = true};
    expect_render(t, m2, 2, &o2,
                  "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
                  "OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: "
                  "analysis, commentary, final. Channel must be included for every message.\n"
                  "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
                  "<|start|>developer<|message|># Instructions\n\nBe kind.<|end|>"
                  "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    /* text that spells specials stays text */
    struct harmony_msg m3[] = {{.role = HARMONY_USER, .content = "say <|end|> please"}};
    struct harmony_opts o3 = {.effort = HARMONY_EFFORT_LOW, .no_generation_prompt = true};
    int32_t *ids;
    size_t n;
    assert_int_equal(harmony_render(t, m3, 1, &o3, &ids, &n), 0);
    size_t n_end = 0;
    for (size_t i = 0; i < n; i++)
        n_end += ids[i] == tok_token_id(t, "<|end|>", 7);
    assert_int_equal(n_end, 2); /* the system's and the user's, not the typed one */
    assert_int_not_equal(ids[n - 1], tok_token_id(t, "assistant", 9));
    free(ids);
    tok_free(t);
}

static void render_tools_and_turns(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab(true);
    struct harmony_opts o = {.effort = HARMONY_EFFORT_HIGH, .current_date = "2025-06-28",
                             .functions = true};
    /* a tool call in the current turn: its analysis is kept */
    struct harmony_msg m[] = {
        {.role = HARMONY_USER, .content = "Weather in Tokyo?"},
        {.role = HARMONY_ASSISTANT, .channel = "analysis", .content = "Need the tool."},
        {.role = HARMONY_ASSISTANT, .channel = "commentary", .recipient = "functions.get_weather",
         .content_type = "json", .content = "{\"city\":\"Tokyo\"}"},
        {.role = HARMONY_TOOL, .name = "functions.get_weather", .content = "{\"sunny\":true}"},
    };
    const char *sys_fn =
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>";
    char want[2048];
    snprintf(want, sizeof want,
             "%s<|start|>user<|message|>Weather in Tokyo?<|end|>"
             "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
             "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
             "<|message|>{\"city\":\"Tokyo\"}<|call|>"
             "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
             "{\"sunny\":true}<|end|><|start|>assistant",
             sys_fn);
    expect_render(t, m, 4, &o, want);
    /* a finished turn: its analysis is dropped, its final kept */
    struct harmony_msg m2[] = {
        {.role = HARMONY_USER, .content = "2+2?"},
        {.role = HARMONY_ASSISTANT, .channel = "analysis", .content = "Simple."},
        {.role = HARMONY_ASSISTANT, .channel = "final", .content = "4"},
        {.role = HARMONY_USER, .content = "3+3?"},
    };
    struct harmony_opts o2 = {.effort = HARMONY_EFFORT_HIGH, .current_date = "2025-06-28"};
    expect_render(t, m2, 4, &o2,
                  SYS_HIGH "<|start|>user<|message|>2+2?<|end|>"
                           "<|start|>assistant<|channel|>final<|message|>4<|end|>"
                           "<|start|>user<|message|>3+3?<|end|><|start|>assistant");
    tok_free(t);
}

static void render_refusals(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab(true);
    int32_t *ids;
    size_t n;
    struct harmony_msg tool[] = {{.role = HARMONY_TOOL, .content = "x"}};
    tu_log_capture_begin();
    assert_int_equal(harmony_render(t, tool, 1, NULL, &ids, &n), ERR_USAGE);
    tu_assert_log_contains("message 0", "a tool message needs the tool's name", NULL);
    tu_log_capture_end();
    struct harmony_msg empty[] = {{.role = HARMONY_USER}};
    tu_log_capture_begin();
    assert_int_equal(harmony_render(t, empty, 1, NULL, &ids, &n), ERR_USAGE);
    tu_assert_log_contains("message 0: no content", NULL);
    tu_log_capture_end();
    tok_free(t);
    /* a vocabulary without the harmony specials */
    struct tok *plain = harmony_vocab(false);
    struct harmony_msg m[] = {{.role = HARMONY_USER, .content = "x"}};
    tu_log_capture_begin();
    assert_int_equal(harmony_render(plain, m, 1, NULL, &ids, &n), ERR_UNSUPPORTED);
    tu_assert_log_contains("no control token <|start|>", NULL);
    struct harmony_parser p;
    assert_int_equal(harmony_parser_init(&p, plain), ERR_UNSUPPORTED);
    harmony_parser_fini(&p);
    tu_log_capture_end();
    tok_free(plain);
}

/* ---- parsing ----------------------------------------------------------------------------- */

struct parsed {
    char analysis[256], commentary[256], final[256];
    int messages, ends;
    enum harmony_ev stop;
};

static void feed(const struct tok *t, struct harmony_parser *p, const char *generated,
                 struct parsed *out)
{
    int32_t *ids;
    size_t n;
    memset(out, 0, sizeof *out);
    assert_int_equal(tok_encode_ex(t, generated, strlen(generated), TOK_ENC_SPECIAL, &ids, &n),
                     0);
    for (size_t i = 0; i < n; i++) {
        struct harmony_event ev;
        tu_log_capture_begin();
        int rc = harmony_parser_push(p, ids[i], &ev);
        if (rc != 0)
            fail_msg("push %zu: %s\n%s", i, err_name(rc), tu_log_captured());
        tu_log_capture_end();
        char *dst = ev.channel == HARMONY_CH_ANALYSIS     ? out->analysis
                    : ev.channel == HARMONY_CH_COMMENTARY ? out->commentary
                    : ev.channel == HARMONY_CH_FINAL      ? out->final
                                                          : NULL;
        if (ev.len) {
            assert_non_null(dst);
            strncat(dst, ev.text, ev.len);
        }
        out->messages += ev.kind == HARMONY_EV_MESSAGE;
        out->ends += ev.kind == HARMONY_EV_END;
        if (ev.kind == HARMONY_EV_RETURN || ev.kind == HARMONY_EV_CALL) {
            out->stop = ev.kind;
            assert_int_equal(i, n - 1); /* the stop is the last id */
        }
    }
    free(ids);
}

static void parse_answer(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab(true);
    struct harmony_parser p;
    assert_int_equal(harmony_parser_init(&p, t), 0);
    struct parsed r;
    /* the spec's typical output, with a 2-byte character split over byte tokens */
    feed(t, &p,
         "<|channel|>analysis<|message|>User asks 2+2; caf\xC3\xA9.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
         &r);
    assert_string_equal(r.analysis, "User asks 2+2; caf\xC3\xA9.");
    assert_string_equal(r.final, "2 + 2 = 4.");
    assert_string_equal(r.commentary, "");
    assert_int_equal(r.messages, 2);
    assert_int_equal(r.ends, 1);
    assert_int_equal(r.stop, HARMONY_EV_RETURN);
    assert_string_equal(harmony_parser_channel(&p), "final");
    /* nothing after the stop */
    struct harmony_event ev;
    tu_log_capture_begin();
    assert_int_equal(harmony_parser_push(&p, 'a', &ev), ERR_FORMAT);
    tu_assert_log_contains("after the generation stopped", NULL);
    tu_log_capture_end();
    harmony_parser_fini(&p);
    tok_free(t);
}

static void parse_tool_call(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab(true);
    struct harmony_parser p;
    assert_int_equal(harmony_parser_init(&p, t), 0);
    struct parsed r;
    feed(t, &p,
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
         "{\"city\":\"Tokyo\"}<|call|>",
         &r);
    assert_string_equal(r.commentary, "{\"city\":\"Tokyo\"}");
    assert_int_equal(r.stop, HARMONY_EV_CALL);
    assert_string_equal(harmony_parser_role(&p), "assistant");
    assert_string_equal(harmony_parser_channel(&p), "commentary");
    assert_string_equal(harmony_parser_recipient(&p), "functions.get_weather");
    assert_string_equal(harmony_parser_content_type(&p), "json");
    harmony_parser_fini(&p);
    tok_free(t);
}

static void parse_refusals(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab(true);
    int32_t start = tok_token_id(t, "<|start|>", 9), end = tok_token_id(t, "<|end|>", 7);
    int32_t msg = tok_token_id(t, "<|message|>", 11), eot = tok_token_id(t, "<|endoftext|>", 13);
    struct harmony_parser p;
    struct harmony_event ev;
    assert_int_equal(harmony_parser_init(&p, t), 0);
    tu_log_capture_begin();
    assert_int_equal(harmony_parser_push(&p, end, &ev), ERR_FORMAT); /* no content open */
    tu_assert_log_contains("ends a message that has no content open", NULL);
    assert_int_equal(harmony_parser_push(&p, msg, &ev), 0);
    assert_int_equal(ev.kind, HARMONY_EV_MESSAGE);
    assert_int_equal(ev.channel, HARMONY_CH_NONE);
    assert_int_equal(harmony_parser_push(&p, eot, &ev), ERR_FORMAT);
    tu_assert_log_contains("'<|endoftext|>' is a special token harmony does not place here",
                           NULL);
    assert_int_equal(harmony_parser_push(&p, start, &ev), ERR_FORMAT);
    tu_assert_log_contains("opens a message inside another", NULL);
    assert_int_equal(harmony_parser_push(&p, end, &ev), 0);
    assert_int_equal(harmony_parser_push(&p, 'x', &ev), ERR_FORMAT);
    tu_assert_log_contains("is text outside any message", NULL);
    assert_int_equal(harmony_parser_push(&p, 999999, &ev), ERR_FORMAT);
    tu_assert_log_contains("outside the vocabulary", NULL);
    assert_int_equal(harmony_parser_push(&p, start, &ev), 0);
    for (int i = 0; i < 300; i++) { /* a runaway header */
        int rc = harmony_parser_push(&p, 'a', &ev);
        if (rc != 0) {
            assert_int_equal(rc, ERR_FORMAT);
            assert_true(i >= 250);
            break;
        }
        assert_true(i < 255);
    }
    tu_assert_log_contains("longer than 255 bytes", NULL);
    tu_log_capture_end();
    harmony_parser_fini(&p);
    tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(render_spec_prompt), cmocka_unit_test(render_tools_and_turns),
        cmocka_unit_test(render_refusals),    cmocka_unit_test(parse_answer),
        cmocka_unit_test(parse_tool_call),    cmocka_unit_test(parse_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
