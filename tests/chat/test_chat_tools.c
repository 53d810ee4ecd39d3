/*
 * test_chat_tools.c — tool calling in the worker and on the shm wire: the chat encoding with
 * tools and tool_call_id (round trip; every malformed record refused naming the field), the
 * TOKEN call header (the same), the tool-call format read from a template, and the parser of
 * generated text (chat_out): harmony's `to=` recipients, Hermes/Qwen <tool_call> blocks,
 * Llama 3.1 JSON and Mistral [TOOL_CALLS], split over pieces anywhere; malformed model output
 * stays text, never a crash.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "chat.h"
#include "err.h"
#include "msg.h"
#include "testutil.h"
#include "tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG(r, c) {.role = (r), .content = (c), .content_len = sizeof(c) - 1}
#define F(f, x) .f = (x), .f##_len = (uint32_t)(sizeof(x) - 1)

static const char TOOLS[] = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                            "\"description\": \"Weather in a city\", \"parameters\": {\"type\": "
                            "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";

static char *encode(const struct shm_chat *ch, uint32_t *len)
{
    assert_int_equal(shm_chat_size(ch, len, NULL, 0), 0);
    char *buf = malloc(*len);
    assert_non_null(buf);
    shm_chat_encode(ch, buf, *len);
    return buf;
}

/* a tool call, its answer and the tools survive the encoding byte for byte */
static void shm_chat_round_trip(void **state)
{
    (void)state;
    struct shm_chat_msg m[] = {
        MSG(SHM_CHAT_USER, "Weather in Paris?"),
        {.role = SHM_CHAT_ASSISTANT, F(recipient, "functions.get_weather"),
         F(tool_call_id, "call_abc"), F(content, "{\"city\": \"Paris\"}")},
        {.role = SHM_CHAT_TOOL, F(recipient, "functions.get_weather"),
         F(tool_call_id, "call_abc"), F(content, "21C")},
    };
    struct shm_chat ch = {.msgs = m, .n = 3, .tools = TOOLS, .tools_len = sizeof TOOLS - 1};
    uint32_t len;
    char *enc = encode(&ch, &len);
    struct shm_chat_msg out[3];
    uint32_t n;
    const char *tools;
    uint32_t tl;
    assert_int_equal(shm_chat_decode(enc, len, out, 3, &n, &tools, &tl), 0);
    assert_int_equal(n, 3);
    assert_int_equal(tl, sizeof TOOLS - 1);
    assert_memory_equal(tools, TOOLS, tl);
    assert_int_equal(out[1].tool_call_id_len, 8);
    assert_memory_equal(out[1].tool_call_id, "call_abc", 8);
    assert_memory_equal(out[2].recipient, "functions.get_weather", 21);
    assert_memory_equal(out[2].content, "21C", 3);
    /* no tools: none decoded */
    ch.tools = NULL, ch.tools_len = 0;
    free(enc);
    enc = encode(&ch, &len);
    assert_int_equal(shm_chat_decode(enc, len, out, 3, &n, &tools, &tl), 0);
    assert_null(tools);
    assert_int_equal(tl, 0);
    free(enc);
}

/* what an encoder refuses, named */
static void shm_chat_refused_fields(void **state)
{
    (void)state;
    char msg[256];
    uint32_t len;
    struct shm_chat_msg user_id[] = {{.role = SHM_CHAT_USER, F(tool_call_id, "call_1"),
                                      F(content, "x")}};
    struct shm_chat ch = {.msgs = user_id, .n = 1};
    tu_log_capture_begin();
    assert_int_equal(shm_chat_size(&ch, &len, msg, sizeof msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "messages[0].tool_call_id: only a tool call"));
    struct shm_chat_msg bad_id[] = {{.role = SHM_CHAT_TOOL, F(recipient, "f"),
                                     F(tool_call_id, "call 1"), F(content, "x")}};
    ch.msgs = bad_id;
    assert_int_equal(shm_chat_size(&ch, &len, msg, sizeof msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "messages[0].tool_call_id: byte 0x20 at 4"));
    struct shm_chat_msg ok[] = {MSG(SHM_CHAT_USER, "x")};
    ch.msgs = ok;
    ch.tools = "[\0]", ch.tools_len = 3;
    assert_int_equal(shm_chat_size(&ch, &len, msg, sizeof msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "tools: 3 bytes holds a NUL byte"));
    ch.tools = "[]", ch.tools_len = SHM_MAX_CHAT_TOOLS + 1;
    assert_int_equal(shm_chat_size(&ch, &len, msg, sizeof msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "exceeds the limit"));
    tu_log_capture_end();
}

/* malformed records on the wire: each refused with its field named, never read past */
static void shm_chat_malformed_records(void **state)
{
    (void)state;
    struct shm_chat_msg m[] = {
        {.role = SHM_CHAT_TOOL, F(recipient, "f"), F(tool_call_id, "c1"), F(content, "ok")}};
    struct shm_chat ch = {.msgs = m, .n = 1, F(tools, "[]")};
    uint32_t len, n;
    char *enc = encode(&ch, &len);
    struct shm_chat_msg out[1];
    /* header: tools_len beyond the record, reserved set, cut header */
    struct {
        uint32_t off, val;
        const char *want;
    } cases[] = {
        {0, 1000, "tools announce 1000 bytes"},
        {4, 7, "tool_choice 0x7 is not a choice"}, /* the header's former reserved word */
        {8 + 2 + 16, 100, "announces"},                 /* tool_call_id_len */
        {8 + 2 + 20, 1, "messages[0].reserved: 1"},
        {8 + 2 + 0, 9, "role: 9 is not a role"},
        {8 + 2 + 8, 0, "a tool message names its tool"}, /* recipient_len 0 ... */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *bad = malloc(len);
        memcpy(bad, enc, len);
        uint32_t v = cases[i].val;
        memcpy(bad + cases[i].off, &v, 4);
        uint32_t blen = len;
        if (cases[i].off == 8 + 2 + 8) {
            /* recipient_len 0 with the byte moved into tool_call_id: lengths still add up */
            uint32_t id_len = 3;
            memcpy(bad + 8 + 2 + 16, &id_len, 4);
        }
        tu_log_capture_begin();
        assert_int_equal(shm_chat_decode(bad, blen, out, 1, &n, NULL, NULL), ERR_FORMAT);
        tu_assert_log_contains(cases[i].want, NULL);
        tu_log_capture_end();
        free(bad);
    }
    /* a tool_call_id with a byte outside the alphabet */
    char *bad = malloc(len);
    memcpy(bad, enc, len);
    bad[8 + 2 + 24 + 1] = '"'; /* after the 1-byte recipient: the id's first byte */
    tu_log_capture_begin();
    assert_int_equal(shm_chat_decode(bad, len, out, 1, &n, NULL, NULL), ERR_FORMAT);
    tu_assert_log_contains("messages[0].tool_call_id: byte 0x22 at 0", NULL);
    /* cut anywhere: refused, never read past the end */
    for (uint32_t cut = 0; cut < len; cut++)
        assert_int_equal(shm_chat_decode(enc, cut, out, 1, &n, NULL, NULL), ERR_FORMAT);
    tu_log_capture_end();
    free(bad);
    free(enc);
}

/* TOKEN's call header: round trip through a record, and refusals */
static void shm_token_call_header(void **state)
{
    (void)state;
    struct shm_msg m = {.type = SHM_MSG_TOKEN,
                        .token = {.request_id = 7, .token = 12, .channel = SHM_CH_COMMENTARY,
                                  .text = "{\"a\"", .text_len = 4,
                                  F(call_name, "functions.get_weather"),
                                  F(call_id, "call_XYZ")}};
    m.token.call_name_len = 21, m.token.call_id_len = 8;
    uint32_t len;
    assert_int_equal(shm_msg_size("t", &m, &len), 0);
    uint64_t *buf = calloc(1, len + 8);
    shm_msg_encode(&m, buf, len);
    struct shm_msg out;
    assert_int_equal(shm_msg_decode("t", SHM_MSG_TOKEN, buf, len, &out), 0);
    assert_int_equal(out.token.call_name_len, 21);
    assert_memory_equal(out.token.call_name, "functions.get_weather", 21);
    assert_memory_equal(out.token.call_id, "call_XYZ", 8);
    assert_memory_equal(out.token.text, "{\"a\"", 4);
    assert_int_equal(out.token.channel, SHM_CH_COMMENTARY);
    /* refusals: on a piece that is not a chat's, a name without an id, a bad byte */
    tu_log_capture_begin();
    struct shm_msg b = m;
    b.token.channel = SHM_CH_NONE;
    assert_int_equal(shm_msg_size("t", &b, &len), ERR_FORMAT);
    tu_assert_log_contains("not a chat's", NULL);
    b = m, b.token.call_id_len = 0;
    assert_int_equal(shm_msg_size("t", &b, &len), ERR_FORMAT);
    tu_assert_log_contains("without a call id", NULL);
    b = m, b.token.call_name = "functions get";
    assert_int_equal(shm_msg_size("t", &b, &len), ERR_FORMAT);
    tu_assert_log_contains("call name: byte 0x20", NULL);
    /* on the wire: lengths out of bounds, cut sections */
    assert_int_equal(shm_msg_size("t", &m, &len), 0);
    shm_msg_encode(&m, buf, len);
    char *w = (char *)buf;
    uint32_t zero = 0, big = 5000;
    memcpy(w + 16 + 4, &zero, 4); /* name_len 0 */
    assert_int_equal(shm_msg_decode("t", SHM_MSG_TOKEN, buf, len, &out), ERR_FORMAT);
    tu_assert_log_contains("call header: name 0", NULL);
    memcpy(w + 16 + 4, &big, 4);
    assert_int_equal(shm_msg_decode("t", SHM_MSG_TOKEN, buf, len, &out), ERR_FORMAT);
    tu_assert_log_contains("each 1..128", NULL);
    shm_msg_encode(&m, buf, len);
    for (uint32_t cut = 16; cut < len; cut++)
        assert_int_equal(shm_msg_decode("t", SHM_MSG_TOKEN, buf, cut, &out), ERR_FORMAT);
    tu_log_capture_end();
    free(buf);
}

static char *fixture_template(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "chat-templates/%s", name);
    size_t len;
    return tu_read_file(tu_fixture(path), &len);
}

static void calls_format_of_templates(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        enum chat_calls want;
    } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", CHAT_CALLS_HERMES},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", CHAT_CALLS_LLAMA},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", CHAT_CALLS_LLAMA},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", CHAT_CALLS_MISTRAL},
        {"google-gemma-2-2b-it.jinja", CHAT_CALLS_NONE},
        {"microsoft-Phi-3.5-mini-instruct.jinja", CHAT_CALLS_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *src = fixture_template(cases[i].file);
        if (chat_calls_format(src) != cases[i].want)
            fail_msg("%s: format %d, want %d", cases[i].file, chat_calls_format(src),
                     cases[i].want);
        free(src);
    }
    assert_int_equal(chat_calls_format(NULL), CHAT_CALLS_NONE);
}

/* ---- the parser of generated text ---- */

/* What a reply became: its content, and its calls' names, ids and arguments. */
struct reply {
    char content[4096], names[8][160], ids[8][160], args[8][4096];
    int n_calls;
    bool stop, call;
};

static void take(struct reply *r, const struct chat_piece *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_true(p[i].len <= SHM_MAX_PIECE);
        if (p[i].call_name) {
            assert_true(r->n_calls < 8);
            snprintf(r->names[r->n_calls], 160, "%s", p[i].call_name);
            snprintf(r->ids[r->n_calls], 160, "%s", p[i].call_id);
            r->n_calls++;
        }
        char *dst = p[i].channel == SHM_CH_COMMENTARY && r->n_calls ? r->args[r->n_calls - 1]
                                                                     : r->content;
        strncat(dst, p[i].text, p[i].len);
    }
}

/* Feeds pieces (NULL-terminated) as text-only events (id -1), then flushes. */
static void feed_text(struct chat_out *o, const char *const *pieces, struct reply *r)
{
    memset(r, 0, sizeof *r);
    const struct chat_piece *p;
    size_t n;
    for (size_t i = 0; pieces[i]; i++) {
        bool stop, call;
        chat_out_push(o, -1, pieces[i], strlen(pieces[i]), &p, &n, &stop, &call);
        take(r, p, n);
    }
    chat_out_flush(o, &p, &n);
    take(r, p, n);
}

/* a chat_out for a Jinja model whose template is the fixture `file`, with tools or without,
 * and the chat's tool_choice (shm_abi.h) */
static struct chat_out *jinja_out_choice(const char *file, bool tools, uint32_t choice);
static struct chat_out *jinja_out(const char *file, bool tools)
{
    return jinja_out_choice(file, tools, SHM_TOOL_CHOICE_AUTO);
}

/* chat_model_load of a model folder holding only the fixture template `file` */
static void load_template(const char *file)
{
    char *src = fixture_template(file);
    char *dir = tu_mkdtemp();
    json_t *meta = json_pack("{s:s}", "chat_template", src);
    assert_int_equal(json_dump_file(meta, tu_path(dir, CHAT_META_FILE), 0), 0);
    json_decref(meta);
    free(src);
    assert_int_equal(chat_model_load(dir), 0);
    tu_rmtree(dir);
    free(dir);
}

static struct chat_out *jinja_out_choice(const char *file, bool tools, uint32_t choice)
{
    load_template(file);
    struct shm_chat_msg m[] = {MSG(SHM_CHAT_USER, "Weather?")};
    struct shm_chat ch = {.msgs = m, .n = 1, .tools = tools ? TOOLS : NULL,
                          .tools_len = tools ? (uint32_t)strlen(TOOLS) : 0,
                          .tool_choice = choice};
    uint32_t len;
    char *enc = encode(&ch, &len);
    struct tok *t;
    assert_int_equal(tok_load(tu_fixture("tokenizer/llama2-tokenizer.model"), &t), 0);
    struct chat_out *o;
    assert_int_equal(chat_out_new(t, CHAT_TPL_JINJA, enc, len, &o), 0);
    free(enc);
    tok_free(t); /* only the markers' lookup needs it: ids are -1 below */
    return o;
}

static void check_call_id(const char *id)
{
    assert_int_equal(strlen(id), 29);
    assert_memory_equal(id, "call_", 5);
    for (size_t i = 5; i < 29; i++)
        assert_true((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
                    (id[i] >= '0' && id[i] <= '9'));
}

static void parse_hermes(void **state)
{
    (void)state;
    struct chat_out *o = jinja_out("Qwen-Qwen2.5-7B-Instruct.jinja", true);
    struct reply r;
    /* text, then two calls, the tags split across pieces */
    const char *const a[] = {"Let me check. <tool", "_call>\n{\"name\": \"get_weather\", ",
                             "\"arguments\": {\"city\": \"Paris\"}}\n</tool_", "call>\n<tool_call>",
                             "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
                             "</tool_call>", NULL};
    feed_text(o, a, &r);
    assert_string_equal(r.content, "Let me check. \n");
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Paris\"}");
    assert_string_equal(r.args[1], "{\"city\": \"Oslo\"}");
    check_call_id(r.ids[0]);
    check_call_id(r.ids[1]);
    assert_string_not_equal(r.ids[0], r.ids[1]);
    assert_true(chat_out_called(o));
    chat_out_free(o);

    /* malformed output stays text, whole */
    static const char *const bad[][4] = {
        {"<tool_call>{not json}</tool_call> after", NULL},
        {"<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", NULL},
        {"<tool_call>{\"name\": \"a b\", \"arguments\": {}}</tool_call>", NULL},
        {"<tool_call>{\"name\": \"f\"}</tool_call>", NULL},
        {"<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", NULL},
        {"<tool_call>{\"name\": \"f\", \"argu", NULL}, /* cut by max_tokens */
        {"<tool_", NULL},
        {"a <tool_call> b </tool_call> <tool_call>", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = jinja_out("Qwen-Qwen2.5-7B-Instruct.jinja", true);
        feed_text(o, bad[i], &r);
        assert_int_equal(r.n_calls, 0);
        assert_string_equal(r.content, bad[i][0]);
        assert_false(chat_out_called(o));
        chat_out_free(o);
    }
    /* a call that never closed but parses: a call (Qwen often stops there) */
    o = jinja_out("Qwen-Qwen2.5-7B-Instruct.jinja", true);
    const char *const open[] = {"<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n", NULL};
    feed_text(o, open, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{}");
    assert_string_equal(r.content, "");
    chat_out_free(o);
    /* without tools, a model's <tool_call> is its text */
    o = jinja_out("Qwen-Qwen2.5-7B-Instruct.jinja", false);
    feed_text(o, a, &r);
    assert_int_equal(r.n_calls, 0);
    assert_non_null(strstr(r.content, "<tool_call>"));
    chat_out_free(o);
    chat_model_unload();
}

static void parse_llama_and_mistral(void **state)
{
    (void)state;
    struct reply r;
    struct chat_out *o = jinja_out("meta-llama-Llama-3.1-8B-Instruct.jinja", true);
    const char *const a[] = {" {\"name\": \"get_weather\", \"para", "meters\": {\"city\": \"Rome\"}}",
                             NULL};
    feed_text(o, a, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Rome\"}");
    assert_string_equal(r.content, "");
    chat_out_free(o);
    /* a reply that is not a call: text as it came; JSON that is no call: text */
    static const char *const text[][3] = {{"It is ", "sunny.", NULL},
                                          {"{\"answer\": 42}", NULL},
                                          {"{\"name\": \"f\", \"parameters\": ", NULL},
                                          {"  ", NULL}};
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) {
        o = jinja_out("meta-llama-Llama-3.1-8B-Instruct.jinja", true);
        feed_text(o, text[i], &r);
        char want[256] = "";
        for (size_t k = 0; text[i][k]; k++)
            strcat(want, text[i][k]);
        assert_string_equal(r.content, want);
        assert_int_equal(r.n_calls, 0);
        chat_out_free(o);
    }
    /* text goes out at once when the reply does not open with the marker */
    o = jinja_out("meta-llama-Llama-3.1-8B-Instruct.jinja", true);
    const struct chat_piece *p;
    size_t n;
    bool stop, call;
    chat_out_push(o, -1, "Hi", 2, &p, &n, &stop, &call);
    assert_int_equal(n, 1);
    assert_int_equal(p[0].len, 2);
    chat_out_free(o);

    o = jinja_out("mistralai-Mistral-Nemo-Instruct-2407.jinja", true);
    const char *const m[] = {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                             "\"Bern\"}}, {\"name\": \"now\", \"arguments\": {}}]",
                             NULL};
    feed_text(o, m, &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[0], "{\"city\": \"Bern\"}");
    assert_string_equal(r.names[1], "functions.now");
    chat_out_free(o);
    o = jinja_out("mistralai-Mistral-Nemo-Instruct-2407.jinja", true);
    const char *const mb[] = {"[TOOL_CALLS][{\"name\": \"x\"}, 5]", NULL};
    feed_text(o, mb, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, mb[0]);
    chat_out_free(o);
    chat_model_unload();
}

/* Feeds pieces as serve.c does: nothing after the parser says stop; r->stop/call say whether
 * it did, and *fed how many pieces went in. */
static void feed_until_stop(struct chat_out *o, const char *const *pieces, struct reply *r,
                            size_t *fed)
{
    memset(r, 0, sizeof *r);
    const struct chat_piece *p;
    size_t n, i = 0;
    while (pieces[i] && !r->stop) {
        chat_out_push(o, -1, pieces[i], strlen(pieces[i]), &p, &n, &r->stop, &r->call);
        take(r, p, n);
        i++;
    }
    *fed = i;
    chat_out_flush(o, &p, &n);
    take(r, p, n);
}

/* parallel_tool_calls false (SHM_TOOL_CHOICE_ONE_CALL): Hermes ends the reply as its first call
 * closes, a list keeps its first call; without the bit the same text gives every call */
static void parse_one_call(void **state)
{
    (void)state;
    const char *const h[] = {"Checking. <tool_call>\n{\"name\": \"get_weather\", ",
                             "\"arguments\": {\"city\": \"Paris\"}}\n</tool_",
                             "call> and then", "<tool_call>{\"name\": \"now\", \"arguments\": {}}",
                             "</tool_call>", NULL};
    struct chat_out *o = jinja_out_choice("Qwen-Qwen2.5-7B-Instruct.jinja", true,
                                          SHM_TOOL_CHOICE_ONE_CALL);
    struct reply r;
    size_t fed;
    feed_until_stop(o, h, &r, &fed);
    assert_true(r.stop);
    assert_true(r.call);
    assert_int_equal(fed, 3); /* the piece that closed the call ended the reply */
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Paris\"}");
    assert_string_equal(r.content, "Checking. ");
    chat_out_free(o);
    o = jinja_out_choice("Qwen-Qwen2.5-7B-Instruct.jinja", true, SHM_TOOL_CHOICE_AUTO);
    feed_until_stop(o, h, &r, &fed);
    assert_false(r.stop);
    assert_int_equal(r.n_calls, 2);
    chat_out_free(o);
    /* with a forced named call too: the bit combines with the mode */
    const char *const f[] = {"{\"city\": \"Oslo\"}}</tool_call>", "<tool_call>", NULL};
    o = jinja_out_choice("Qwen-Qwen2.5-7B-Instruct.jinja", true,
                         SHM_TOOL_CHOICE_FUNCTION | SHM_TOOL_CHOICE_ONE_CALL);
    feed_until_stop(o, f, &r, &fed);
    assert_true(r.stop);
    assert_int_equal(fed, 1);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Oslo\"}");
    chat_out_free(o);

    const char *const m[] = {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                             "\"Bern\"}}, {\"name\": \"now\", \"arguments\": {}}]",
                             NULL};
    o = jinja_out_choice("mistralai-Mistral-Nemo-Instruct-2407.jinja", true,
                         SHM_TOOL_CHOICE_ONE_CALL);
    feed_text(o, m, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Bern\"}");
    assert_string_equal(r.content, "");
    chat_out_free(o);
    chat_model_unload();
}

/* a long reply that turns out not to be a call comes out in pieces of at most SHM_MAX_PIECE
 * bytes, cut between UTF-8 characters */
static void long_text_split(void **state)
{
    (void)state;
    struct chat_out *o = jinja_out("meta-llama-Llama-3.1-8B-Instruct.jinja", true);
    size_t n = 3 * SHM_MAX_PIECE;
    char *big = malloc(n + 3);
    big[0] = '{';
    for (size_t i = 1; i + 1 < n; i += 2)
        big[i] = (char)0xC3, big[i + 1] = (char)0xA9; /* é */
    big[n - (n % 2 == 0 ? 1 : 0)] = '\0';
    const struct chat_piece *p;
    size_t k;
    bool stop, call;
    chat_out_push(o, -1, big, strlen(big), &p, &k, &stop, &call);
    assert_int_equal(k, 0); /* held: it may be a call */
    chat_out_flush(o, &p, &k);
    assert_true(k >= 3);
    size_t total = 0;
    for (size_t i = 0; i < k; i++) {
        assert_true(p[i].len <= SHM_MAX_PIECE);
        if (i + 1 < k) /* each cut is before a character's first byte */
            assert_true(((unsigned char)p[i + 1].text[0] & 0xC0) != 0x80);
        total += p[i].len;
    }
    assert_int_equal(total, strlen(big));
    free(big);
    chat_out_free(o);
    chat_model_unload();
}

/* ---- harmony: the vocabulary tests/tok/test_harmony.c builds (256 byte-level characters, no
 * merges, the harmony specials), so generated text can be spelled as ids ---- */
static struct tok *harmony_vocab(void)
{
    static const char *const specials[] = {"<|return|>", "<|constrain|>", "<|channel|>",
                                           "<|start|>", "<|end|>", "<|message|>", "<|call|>"};
    json_t *vocab = json_object();
    for (int b = 0, extra = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = printable ? b : 256 + extra++; /* GPT-2's byte-level alphabet */
        char c[4] = {0};
        if (cp < 0x80)
            c[0] = (char)cp;
        else
            c[0] = (char)(0xC0 | cp >> 6), c[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_t *added = json_array();
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        json_array_append_new(added, json_pack("{sisssb}", "id", (int)(256 + i), "content",
                                               specials[i], "special", 1));
    json_t *doc = json_pack("{s{ssso}so s{ss}}", "model", "type", "BPE", "vocab", vocab,
                            "added_tokens", added, "pre_tokenizer", "type", "ByteLevel");
    json_object_set_new(json_object_get(doc, "model"), "merges", json_array());
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    struct tok *t = NULL;
    assert_int_equal(tok_load_mem(text, strlen(text), "hf-json", &t), 0);
    free(text);
    return t;
}

/* harmony: a message addressed to functions.NAME opens a call (its id made here), its text
 * is the arguments, <|call|> stops the reply as a call; analysis stays analysis */
static void parse_harmony(void **state)
{
    (void)state;
    struct tok *t = harmony_vocab();
    struct shm_chat_msg m[] = {MSG(SHM_CHAT_USER, "Weather?")};
    struct shm_chat ch = {.msgs = m, .n = 1, F(tools, TOOLS)};
    uint32_t len;
    char *enc = encode(&ch, &len);
    static const char *const outputs[] = {
        /* the recipient in the channel part, and in the role part */
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
        "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"
        "<|call|>",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions."
        "get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
    };
    for (size_t k = 0; k < 2; k++) {
        struct chat_out *o;
        assert_int_equal(chat_out_new(t, CHAT_TPL_HARMONY, enc, len, &o), 0);
        int32_t *ids;
        size_t n;
        assert_int_equal(tok_encode_ex(t, outputs[k], strlen(outputs[k]), TOK_ENC_SPECIAL, &ids,
                                       &n), 0);
        char analysis[256] = "", args[256] = "", name[160] = "", id[160] = "";
        bool stop = false, call = false;
        for (size_t i = 0; i < n; i++) {
            const struct chat_piece *p;
            size_t np;
            assert_false(stop);
            chat_out_push(o, ids[i], "?", 1, &p, &np, &stop, &call);
            assert_int_equal(np, 1); /* one piece per id: the id travels with it */
            if (p[0].call_name) {
                snprintf(name, sizeof name, "%s", p[0].call_name);
                snprintf(id, sizeof id, "%s", p[0].call_id);
                assert_int_equal(p[0].channel, SHM_CH_COMMENTARY);
            }
            if (p[0].channel == SHM_CH_ANALYSIS)
                strncat(analysis, p[0].text, p[0].len);
            else if (p[0].channel == SHM_CH_COMMENTARY)
                strncat(args, p[0].text, p[0].len);
        }
        assert_true(stop && call);
        assert_string_equal(analysis, "Need weather.");
        assert_string_equal(name, "functions.get_weather");
        check_call_id(id);
        assert_string_equal(args, "{\"city\": \"Paris\"}");
        assert_true(chat_out_called(o));
        free(ids);
        chat_out_free(o);
    }
    /* ids the format does not allow (a random model): text on OTHER, never a crash; a
     * recipient no call header may carry stays content */
    struct chat_out *o;
    assert_int_equal(chat_out_new(t, CHAT_TPL_HARMONY, enc, len, &o), 0);
    const char *junk = "<|message|><|call|>x<|start|>";
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode_ex(t, junk, strlen(junk), TOK_ENC_SPECIAL, &ids, &n), 0);
    tu_log_capture_begin();
    for (size_t i = 0; i < n; i++) {
        const struct chat_piece *p;
        size_t np;
        bool stop, call;
        chat_out_push(o, ids[i], "j", 1, &p, &np, &stop, &call);
        assert_int_equal(np, 1);
        assert_null(p[0].call_name);
    }
    tu_log_capture_end();
    free(ids);
    chat_out_free(o);
    assert_int_equal(chat_out_new(t, CHAT_TPL_HARMONY, enc, len, &o), 0);
    const char *odd = "<|channel|>commentary to=fn{x} <|message|>{}<|call|>";
    assert_int_equal(tok_encode_ex(t, odd, strlen(odd), TOK_ENC_SPECIAL, &ids, &n), 0);
    for (size_t i = 0; i < n; i++) {
        const struct chat_piece *p;
        size_t np;
        bool stop, call;
        chat_out_push(o, ids[i], "", 0, &p, &np, &stop, &call);
        assert_null(p[0].call_name);
    }
    assert_false(chat_out_called(o));
    free(ids);
    chat_out_free(o);
    free(enc);
    /* tool_choice FUNCTION: the render wrote the opening up to <|message|>; the model's first
     * id already belongs to the call, and its piece carries the header */
    ch.tool_choice = SHM_TOOL_CHOICE_FUNCTION;
    enc = encode(&ch, &len);
    assert_int_equal(chat_out_new(t, CHAT_TPL_HARMONY, enc, len, &o), 0);
    const char *args = "{\"city\": \"Oslo\"}<|call|>";
    assert_int_equal(tok_encode_ex(t, args, strlen(args), TOK_ENC_SPECIAL, &ids, &n), 0);
    char got[128] = "";
    int headers = 0;
    bool stop = false, call = false;
    for (size_t i = 0; i < n; i++) {
        const struct chat_piece *p;
        size_t np;
        chat_out_push(o, ids[i], "", 0, &p, &np, &stop, &call);
        assert_int_equal(np, 1);
        if (p[0].call_name) {
            assert_int_equal(i, 0);
            assert_string_equal(p[0].call_name, "functions.get_weather");
            check_call_id(p[0].call_id);
            headers++;
        }
        strncat(got, p[0].text, p[0].len);
    }
    assert_int_equal(headers, 1);
    assert_true(stop && call && chat_out_called(o));
    assert_string_equal(got, "{\"city\": \"Oslo\"}");
    free(ids);
    chat_out_free(o);
    free(enc);
    tok_free(t);
}

/* tool_choice in the chat encoding: round trip, and what the encoder and decoder refuse */
static void shm_chat_tool_choice_field(void **state)
{
    (void)state;
    struct shm_chat_msg m[] = {MSG(SHM_CHAT_USER, "Weather?")};
    struct shm_chat ch = {.msgs = m, .n = 1, F(tools, TOOLS),
                          .tool_choice = SHM_TOOL_CHOICE_FUNCTION | 5u << 8};
    uint32_t len, n;
    char *enc = encode(&ch, &len);
    assert_int_equal(shm_chat_decode(enc, len, NULL, 0, &n, NULL, NULL), 0);
    assert_int_equal(shm_chat_tool_choice(enc), SHM_TOOL_CHOICE_FUNCTION | 5u << 8);
    assert_int_equal(SHM_TOOL_CHOICE_INDEX(shm_chat_tool_choice(enc)), 5);
    free(enc);
    ch.tool_choice = SHM_TOOL_CHOICE_FUNCTION | SHM_TOOL_CHOICE_ONE_CALL | 5u << 8;
    enc = encode(&ch, &len);
    assert_int_equal(shm_chat_decode(enc, len, NULL, 0, &n, NULL, NULL), 0);
    assert_int_equal(SHM_TOOL_CHOICE_MODE(shm_chat_tool_choice(enc)), SHM_TOOL_CHOICE_FUNCTION);
    assert_int_equal(SHM_TOOL_CHOICE_INDEX(shm_chat_tool_choice(enc)), 5);
    static const struct {
        uint32_t choice;
        bool tools;
        const char *says;
    } bad[] = {
        {3, true, "is not a choice"},
        {SHM_TOOL_CHOICE_REQUIRED | 1u << 8, true, "index without FUNCTION"},
        {SHM_TOOL_CHOICE_AUTO | 2u << 8, true, "index without FUNCTION"},
        {SHM_TOOL_CHOICE_REQUIRED, false, "without tools"},
        {SHM_TOOL_CHOICE_FUNCTION, false, "without tools"},
        {SHM_TOOL_CHOICE_ONE_CALL, false, "limits calls without tools"},
        {SHM_TOOL_CHOICE_ONE_CALL | 3, true, "is not a choice"},
    };
    tu_log_capture_begin();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct shm_chat b = ch;
        b.tool_choice = bad[i].choice;
        if (!bad[i].tools)
            b.tools = NULL, b.tools_len = 0;
        char msg[160];
        assert_int_equal(shm_chat_size(&b, &len, msg, sizeof msg), ERR_FORMAT);
        assert_non_null(strstr(msg, "tool_choice"));
        assert_non_null(strstr(msg, bad[i].says));
        /* the same on the wire: a decoder never trusts the header */
        b.tool_choice = 0;
        uint32_t blen;
        char *w = encode(&b, &blen);
        memcpy(w + 4, &bad[i].choice, 4);
        assert_int_equal(shm_chat_decode(w, blen, NULL, 0, &n, NULL, NULL), ERR_FORMAT);
        tu_assert_log_contains(bad[i].says, NULL);
        free(w);
    }
    tu_log_capture_end();
    free(enc);
}

/* tool_choice: the render wrote the call's opening after the prompt; the parser takes the
 * model's continuation as that call (and, for a named tool, keeps it a call of that tool
 * when the reply ends before its JSON closes) */
static void parse_forced_calls(void **state)
{
    (void)state;
    const uint32_t fn0 = SHM_TOOL_CHOICE_FUNCTION; /* tools[0]: get_weather */
    struct reply r;
    struct chat_out *o = jinja_out_choice("Qwen-Qwen2.5-7B-Instruct.jinja", true, fn0);
    const char *const whole[] = {"{\"city\": \"Paris\"}", "}\n</tool_call>", NULL};
    feed_text(o, whole, &r);
    assert_string_equal(r.content, "");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    check_call_id(r.ids[0]);
    assert_string_equal(r.args[0], "{\"city\": \"Paris\"}");
    chat_out_free(o);
    /* cut short (max_tokens): still the named tool's call, with what arguments there are */
    o = jinja_out_choice("Qwen-Qwen2.5-7B-Instruct.jinja", true, fn0);
    const char *const cut[] = {"{\"city\": \"Pa", NULL};
    feed_text(o, cut, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Pa");
    assert_string_equal(r.content, "");
    chat_out_free(o);
    /* required: the model writes the name */
    o = jinja_out_choice("Qwen-Qwen2.5-7B-Instruct.jinja", true, SHM_TOOL_CHOICE_REQUIRED);
    const char *const req[] = {"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
                               "\n</tool_call>", NULL};
    feed_text(o, req, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Oslo\"}");
    chat_out_free(o);
    /* Mistral and Llama 3.1 */
    o = jinja_out_choice("mistralai-Mistral-Nemo-Instruct-2407.jinja", true, fn0);
    const char *const mis[] = {"{\"city\": \"Rome\"}}]", NULL};
    feed_text(o, mis, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Rome\"}");
    chat_out_free(o);
    o = jinja_out_choice("meta-llama-Llama-3.1-8B-Instruct.jinja", true, fn0);
    const char *const lla[] = {"{\"city\": \"Lima\"}}", NULL};
    feed_text(o, lla, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "functions.get_weather");
    assert_string_equal(r.args[0], "{\"city\": \"Lima\"}");
    chat_out_free(o);
    chat_model_unload();
}

/* tool_choice in the render: the prompt's ids end with the call's opening, tokenized with the
 * prompt; a template without a tool-call format is refused naming tool_choice */
static void render_forced_calls(void **state)
{
    (void)state;
    struct tok *t;
    assert_int_equal(tok_load(tu_fixture("tokenizer/llama2-tokenizer.model"), &t), 0);
    struct shm_chat_msg m[] = {MSG(SHM_CHAT_USER, "Weather?")};
    struct shm_chat ch = {.msgs = m, .n = 1, F(tools, TOOLS),
                          .tool_choice = SHM_TOOL_CHOICE_FUNCTION};
    uint32_t len;
    char *enc = encode(&ch, &len);
    load_template("Qwen-Qwen2.5-7B-Instruct.jinja");
    char err[300] = "", *text = NULL;
    size_t tl;
    assert_int_equal(chat_render_jinja_text(enc, len, NULL, NULL, &text, &tl, err, sizeof err),
                     0);
    char *want_text = malloc(tl + 128);
    snprintf(want_text, tl + 128, "%s<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
             text);
    int32_t *want, *got;
    size_t nw, ng;
    assert_int_equal(tok_encode_ex(t, want_text, strlen(want_text), TOK_ENC_SPECIAL, &want, &nw),
                     0);
    assert_int_equal(chat_render(t, CHAT_TPL_JINJA, enc, len, 0, &got, &ng, err, sizeof err), 0);
    assert_int_equal(ng, nw);
    assert_memory_equal(got, want, nw * sizeof *got);
    free(got), free(want), free(want_text), free(text);
    /* a template that teaches no call format: refused by name */
    load_template("google-gemma-2-2b-it.jinja");
    err[0] = '\0';
    assert_int_equal(chat_render(t, CHAT_TPL_JINJA, enc, len, 0, &got, &ng, err, sizeof err),
                     ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "tool_choice"));
    chat_model_unload();
    free(enc);
    tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shm_chat_round_trip),
        cmocka_unit_test(shm_chat_refused_fields),
        cmocka_unit_test(shm_chat_malformed_records),
        cmocka_unit_test(shm_token_call_header),
        cmocka_unit_test(calls_format_of_templates),
        cmocka_unit_test(parse_hermes),
        cmocka_unit_test(parse_llama_and_mistral),
        cmocka_unit_test(parse_one_call),
        cmocka_unit_test(long_text_split),
        cmocka_unit_test(parse_harmony),
        cmocka_unit_test(shm_chat_tool_choice_field),
        cmocka_unit_test(parse_forced_calls),
        cmocka_unit_test(render_forced_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
