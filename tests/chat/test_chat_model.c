/*
 * test_chat_model.c — a model's chat template from conversion to prompt ids: chat_meta_write
 * (client/offline/chat_meta.h) carries tokenizer_config.json's chat_template and
 * generation_config.json into chat.ie.json; the worker (worker/process/chat.h) loads it, picks
 * it over the plain template, and renders a chat to exactly the ids of the text the template
 * gives (special tokens spelled by the template become their ids). Bad metadata is an error
 * naming the file and field; a template the interpreter refuses makes chats refused naming the
 * construct; gpt-oss keeps harmony.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "chat.h"
#include "chat_meta.h"
#include "err.h"
#include "gguf.h"
#include "harmony.h"
#include "jinja.h"
#include "msg.h"
#include "testutil.h"
#include "tok.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* the Zephyr / TinyLlama-Chat template (the README's model), as its model card ships it */
static const char ZEPHYR[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
    "'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}";

static void write_json(const char *dir, const char *name, json_t *j)
{
    assert_int_equal(json_dump_file(j, tu_path(dir, name), 0), 0);
    json_decref(j);
}

static struct tok *llama_tok(void)
{
    struct tok *t;
    assert_int_equal(tok_load(tu_fixture("tokenizer/llama2-tokenizer.model"), &t), 0);
    return t;
}

/* shm chat encoding of msgs[n] with the tools' JSON text (NULL: none) (malloc'd) */
static char *encode_tools(const struct shm_chat_msg *msgs, uint32_t n, const char *tools,
                          uint32_t *len)
{
    struct shm_chat ch = {.msgs = msgs, .n = n, .tools = tools,
                          .tools_len = tools ? (uint32_t)strlen(tools) : 0};
    assert_int_equal(shm_chat_size(&ch, len, NULL, 0), 0);
    char *buf = malloc(*len);
    assert_non_null(buf);
    shm_chat_encode(&ch, buf, *len);
    return buf;
}

static char *encode(const struct shm_chat_msg *msgs, uint32_t n, uint32_t *len)
{
    return encode_tools(msgs, n, NULL, len);
}

#define MSG(r, c) {.role = (r), .content = (c), .content_len = sizeof(c) - 1}

static void test_hf_to_prompt_ids(void **state)
{
    (void)state;
    char *hf = tu_mkdtemp(), *out = tu_mkdtemp();
    write_json(hf, "tokenizer_config.json",
               json_pack("{s:s, s:s, s:s}", "chat_template", ZEPHYR, "bos_token", "<s>",
                         "eos_token", "</s>"));
    write_json(hf, "generation_config.json",
               json_pack("{s:i, s:[i,i], s:f, s:f}", "bos_token_id", 1, "eos_token_id", 2, 32000,
                         "temperature", 0.6, "top_p", 0.9));
    assert_int_equal(chat_meta_write(hf, out), 0);
    json_t *meta = json_load_file(tu_path(out, CHAT_META_FILE), 0, NULL);
    assert_non_null(meta);
    assert_string_equal(json_string_value(json_object_get(meta, "chat_template")), ZEPHYR);
    assert_int_equal(json_array_size(json_object_get(meta, "eos_token_ids")), 2);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(meta, "eos_token_ids"), 1)),
                     32000);
    assert_int_equal(json_integer_value(json_object_get(meta, "bos_token_id")), 1);
    assert_true(json_real_value(json_object_get(json_object_get(meta, "sampling"), "top_p")) == 0.9);
    json_decref(meta);

    struct tok *t = llama_tok();
    assert_int_equal(chat_model_load(out), 0);
    char why[256];
    assert_int_equal(chat_template_of("llama", t, why, sizeof why), CHAT_TPL_JINJA);
    struct shm_chat_msg msgs[] = {MSG(SHM_CHAT_SYSTEM, "Be brief."), MSG(SHM_CHAT_USER, "Hi!")};
    uint32_t len;
    char *enc = encode(msgs, 2, &len);
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(chat_render(t, CHAT_TPL_JINJA, enc, len, 0, &ids, &n, err, sizeof err), 0);
    /* what python3-jinja2 renders for it (test_chat_templates.py checks the renderer itself) */
    static const char want[] = "<|system|>\nBe brief.</s>\n<|user|>\nHi!</s>\n<|assistant|>\n";
    int32_t *wids;
    size_t wn;
    assert_int_equal(tok_encode_ex(t, want, strlen(want), TOK_ENC_SPECIAL, &wids, &wn), 0);
    assert_int_equal(n, wn);
    assert_memory_equal(ids, wids, n * sizeof *ids);
    /* the template's </s> is the EOS token, not its letters */
    bool has_eos = false;
    for (size_t i = 0; i < n; i++)
        has_eos |= ids[i] == tok_eos(t);
    assert_true(has_eos);
    free(ids);
    free(wids);
    free(enc);
    chat_model_unload();
    assert_int_equal(chat_template_of("llama", t, why, sizeof why), CHAT_TPL_PLAIN);
    tok_free(t);
    tu_rmtree(hf);
    tu_rmtree(out);
    free(hf);
    free(out);
}

static void test_named_templates_and_raise(void **state)
{
    (void)state;
    char *hf = tu_mkdtemp(), *out = tu_mkdtemp();
    /* a list of named templates: "default" is apply_chat_template's */
    write_json(hf, "tokenizer_config.json",
               json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "chat_template", "name", "tool_use",
                         "template", "TOOLS", "name", "default", "template",
                         "{% if messages|length > 1 %}{{ raise_exception('one message only') }}"
                         "{% endif %}[{{ messages[0].content }}]"));
    assert_int_equal(chat_meta_write(hf, out), 0);
    struct tok *t = llama_tok();
    assert_int_equal(chat_model_load(out), 0);
    char why[256], err[256];
    assert_int_equal(chat_template_of("llama", t, why, sizeof why), CHAT_TPL_JINJA);
    struct shm_chat_msg msgs[] = {MSG(SHM_CHAT_USER, "a"), MSG(SHM_CHAT_USER, "b")};
    uint32_t len;
    char *enc = encode(msgs, 2, &len);
    int32_t *ids;
    size_t n;
    /* the template's raise_exception reaches the client, its message intact */
    assert_int_equal(chat_render(t, CHAT_TPL_JINJA, enc, len, 0, &ids, &n, err, sizeof err),
                     ERR_USAGE);
    assert_non_null(strstr(err, "raise_exception: one message only"));
    free(enc);
    /* harmony channels have no place in such a template: refused by name */
    struct shm_chat_msg ch[] = {MSG(SHM_CHAT_USER, "q"),
                                {.role = SHM_CHAT_ASSISTANT, .channel = "analysis",
                                 .channel_len = 8, .content = "x", .content_len = 1}};
    enc = encode(ch, 2, &len);
    assert_int_equal(chat_render(t, CHAT_TPL_JINJA, enc, len, 0, &ids, &n, err, sizeof err),
                     ERR_FORMAT);
    assert_non_null(strstr(err, "channel 'analysis'"));
    free(enc);
    chat_model_unload();
    tok_free(t);
    tu_rmtree(hf);
    tu_rmtree(out);
    free(hf);
    free(out);
}

static void test_refused_template_refuses_chats(void **state)
{
    (void)state;
    char *hf = tu_mkdtemp(), *out = tu_mkdtemp();
    write_json(hf, "tokenizer_config.json",
               json_pack("{s:s}", "chat_template", "{% include 'other.jinja' %}"));
    tu_log_capture_begin();
    assert_int_equal(chat_meta_write(hf, out), 0); /* carried, with a warning */
    tu_assert_log_contains("cannot render it", "'{% include %}'", NULL);
    tu_log_capture_end();
    struct tok *t = llama_tok();
    assert_int_equal(chat_model_load(out), 0);
    char why[320];
    assert_int_equal(chat_template_of("llama", t, why, sizeof why), CHAT_TPL_NONE);
    assert_non_null(strstr(why, "'{% include %}'"));
    /* gpt-oss keeps harmony whatever it carries; without harmony tokens it says so */
    assert_int_equal(chat_template_of("gpt_oss", t, why, sizeof why), CHAT_TPL_NONE);
    assert_non_null(strstr(why, "harmony"));
    chat_model_unload();
    tok_free(t);
    tu_rmtree(hf);
    tu_rmtree(out);
    free(hf);
    free(out);
}

static void test_bad_metadata_named(void **state)
{
    (void)state;
    char *hf = tu_mkdtemp(), *out = tu_mkdtemp();
    write_json(hf, "tokenizer_config.json", json_pack("{s:i}", "chat_template", 3));
    tu_log_capture_begin();
    assert_int_equal(chat_meta_write(hf, out), ERR_FORMAT);
    tu_assert_log_contains("tokenizer_config.json: chat_template is not a string", NULL);
    write_json(hf, "tokenizer_config.json", json_pack("{s:s}", "chat_template", "x"));
    write_json(hf, "generation_config.json", json_pack("{s:[i,s]}", "eos_token_id", 2, "x"));
    assert_int_equal(chat_meta_write(hf, out), ERR_FORMAT);
    tu_assert_log_contains("generation_config.json: eos_token_id[1] is not a token id", NULL);
    write_json(hf, "generation_config.json", json_pack("{s:s}", "temperature", "hot"));
    assert_int_equal(chat_meta_write(hf, out), ERR_FORMAT);
    tu_assert_log_contains("temperature is not a number", NULL);
    tu_write_file(tu_path(hf, "generation_config.json"), "{oops", 5);
    assert_int_equal(chat_meta_write(hf, out), ERR_FORMAT);
    tu_assert_log_contains("generation_config.json:1", NULL);
    /* the worker's side: a chat.ie.json that is not JSON, a template that is not a string */
    tu_write_file(tu_path(out, CHAT_META_FILE), "[1]", 3);
    assert_int_equal(chat_model_load(out), ERR_FORMAT);
    tu_assert_log_contains("chat.ie.json", "not a JSON object", NULL);
    tu_write_file(tu_path(out, CHAT_META_FILE), "{\"chat_template\": 1}", 20);
    assert_int_equal(chat_model_load(out), ERR_FORMAT);
    tu_assert_log_contains("chat_template is not a string", NULL);
    tu_log_capture_end();
    /* nothing to carry: no file, and the model keeps the plain template */
    char *empty = tu_mkdtemp(), *out2 = tu_mkdtemp();
    assert_int_equal(chat_meta_write(empty, out2), 0);
    assert_int_equal(chat_model_load(out2), 0);
    struct tok *t = llama_tok();
    char why[256];
    assert_int_equal(chat_template_of("llama", t, why, sizeof why), CHAT_TPL_PLAIN);
    tok_free(t);
    tu_rmtree(hf);
    tu_rmtree(out);
    tu_rmtree(empty);
    tu_rmtree(out2);
    free(hf);
    free(out);
    free(empty);
    free(out2);
}

static void write_gguf(const char *path, bool template_is_string)
{
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(path, &w), 0);
    assert_int_equal(gguf_writer_kv_str(w, "general.architecture", "llama"), 0);
    if (template_is_string)
        assert_int_equal(gguf_writer_kv_str(w, "tokenizer.chat_template", ZEPHYR), 0);
    else
        assert_int_equal(gguf_writer_kv_u32(w, "tokenizer.chat_template", 7), 0);
    assert_int_equal(gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2), 0);
    assert_int_equal(gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1), 0);
    assert_int_equal(gguf_writer_finish(w), 0);
}

/* GGUF's tokenizer.chat_template and special ids; a model directory's chat.ie.json carried
 * through re-quantization */
static void test_gguf_and_iebin_sources(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp(), *out = tu_mkdtemp(), *out2 = tu_mkdtemp();
    char gg[4200];
    snprintf(gg, sizeof gg, "%s/m.gguf", dir);
    write_gguf(gg, true);
    assert_int_equal(chat_meta_write(gg, out), 0);
    json_t *meta = json_load_file(tu_path(out, CHAT_META_FILE), 0, NULL);
    assert_non_null(meta);
    assert_string_equal(json_string_value(json_object_get(meta, "chat_template")), ZEPHYR);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(meta, "eos_token_ids"), 0)), 2);
    assert_int_equal(json_integer_value(json_object_get(meta, "bos_token_id")), 1);
    /* re-quantizing that model directory keeps it */
    assert_int_equal(chat_meta_write(out, out2), 0);
    json_t *again = json_load_file(tu_path(out2, CHAT_META_FILE), 0, NULL);
    assert_non_null(again);
    assert_true(json_equal(meta, again));
    json_decref(again);
    json_decref(meta);
    /* a chat_template key that is not a string is named */
    write_gguf(gg, false);
    tu_log_capture_begin();
    assert_int_equal(chat_meta_write(gg, out), ERR_FORMAT);
    tu_assert_log_contains("tokenizer.chat_template is not a string", NULL);
    tu_log_capture_end();
    tu_rmtree(dir);
    tu_rmtree(out);
    tu_rmtree(out2);
    free(dir);
    free(out);
    free(out2);
}

/* a tool call and its answer reach a template as HF's messages do: the assistant's recipient
 * becomes tool_calls[0].function (name without "functions.", arguments parsed), the tool
 * message answers it (Qwen2.5's template; expected text from python3-jinja2) */
static void test_tool_call_messages(void **state)
{
    (void)state;
    size_t len;
    char *src = tu_read_file(tu_fixture("chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja"), &len);
    char *out = tu_mkdtemp();
    write_json(out, CHAT_META_FILE, json_pack("{s:s%}", "chat_template", src, len));
    free(src);
    assert_int_equal(chat_model_load(out), 0);
    struct tok *t = llama_tok();
    char why[256], err[256];
    assert_int_equal(chat_template_of("qwen2", t, why, sizeof why), CHAT_TPL_JINJA);
    struct shm_chat_msg msgs[] = {
        MSG(SHM_CHAT_USER, "Weather?"),
        {.role = SHM_CHAT_ASSISTANT, .recipient = "functions.get_weather", .recipient_len = 21,
         .content = "{\"location\": \"Paris\"}", .content_len = 21},
        {.role = SHM_CHAT_TOOL, .recipient = "functions.get_weather", .recipient_len = 21,
         .content = "21C", .content_len = 3},
    };
    uint32_t elen;
    char *enc = encode(msgs, 3, &elen);
    int32_t *ids, *wids;
    size_t n, wn;
    assert_int_equal(chat_render(t, CHAT_TPL_JINJA, enc, elen, 0, &ids, &n, err, sizeof err), 0);
    static const char want[] =
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n21C\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(tok_encode_ex(t, want, strlen(want), TOK_ENC_SPECIAL, &wids, &wn), 0);
    assert_int_equal(n, wn);
    assert_memory_equal(ids, wids, n * sizeof *ids);
    free(ids);
    free(wids);
    free(enc);
    chat_model_unload();
    tok_free(t);
    tu_rmtree(out);
    free(out);
}

/* tools with every parameter shape gpt-oss's template knows */
static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"location\": {\"type\": \"string\", \"description\": \"The city, e.g. Paris\"},"
    "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"},"
    "\"days\": {\"type\": \"integer\", \"default\": 1}, \"ratio\": {\"type\": \"number\", \"default\": 0.1},"
    "\"hourly\": {\"type\": \"boolean\", \"nullable\": true}, \"note\": {\"type\": \"string\", \"nullable\": true},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}},"
    "\"any_list\": {\"type\": \"array\"},"
    "\"points\": {\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}}, \"nullable\": true},"
    "\"kinds\": {\"type\": [\"string\", \"number\"]},"
    "\"mode\": {\"oneOf\": [{\"type\": \"string\", \"description\": \"by name\"}, {\"type\": \"integer\", \"default\": 3}], \"default\": \"auto\"},"
    "\"where\": {\"type\": \"object\", \"properties\": {\"lat\": {\"type\": \"number\"}, \"lon\": {\"type\": \"number\"}}, \"required\": [\"lat\"]},"
    "\"blob\": {\"type\": \"object\"}, \"other\": {\"description\": \"untyped\"}},"
    "\"required\": [\"location\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";

/* harmony's "# Tools" block is what gpt-oss's own chat template writes (rendered here by the
 * interpreter that test_chat_templates.py holds to python3-jinja2) */
static void test_harmony_tools_as_template(void **state)
{
    (void)state;
    size_t len;
    char *src = tu_read_file(tu_fixture("chat-templates/openai-gpt-oss-120b.jinja"), &len);
    char err[256];
    struct jinja_tpl *t;
    assert_int_equal(jinja_parse(src, len, &t, err, sizeof err), 0);
    json_t *vars = json_pack("{s:[{s:s,s:s},{s:s,s:s}], s:o, s:b}", "messages", "role", "system",
                             "content", "Be brief.", "role", "user", "content", "hi", "tools",
                             json_loads(TOOLS, 0, NULL), "add_generation_prompt", 1);
    assert_non_null(vars);
    char *out;
    size_t n;
    struct jinja_limits lim = {.now = 1785000000};
    if (jinja_render(t, vars, &lim, &out, &n, err, sizeof err))
        fail_msg("%s", err);
    const char *dev = strstr(out, "<|start|>developer<|message|>");
    assert_non_null(dev);
    dev += strlen("<|start|>developer<|message|>");
    const char *end = strstr(dev, "<|end|>");
    assert_non_null(end);
    char *tools;
    assert_int_equal(harmony_tools_text(TOOLS, &tools), 0);
    char want[8192];
    snprintf(want, sizeof want, "# Instructions\n\nBe brief.\n\n%s", tools);
    assert_int_equal((size_t)(end - dev), strlen(want));
    assert_memory_equal(dev, want, strlen(want));
    /* and the system message announces the functions */
    assert_non_null(strstr(out, "Calls to these tools must go to the commentary channel: 'functions'."));
    free(tools);
    free(out);
    json_decref(vars);
    jinja_free(t);
    free(src);
    /* no tools: nothing */
    assert_int_equal(harmony_tools_text("[]", &tools), 0);
    assert_string_equal(tools, "");
    free(tools);
    /* malformed tools are named */
    tu_log_capture_begin();
    assert_int_equal(harmony_tools_text("{}", &tools), ERR_FORMAT);
    tu_assert_log_contains("not a list of tools", NULL);
    assert_int_equal(harmony_tools_text("[{\"function\": {\"name\": \"f\"}}]", &tools), ERR_FORMAT);
    tu_assert_log_contains("tools[0] (f): no description", NULL);
    assert_int_equal(harmony_tools_text("[{\"type\": \"function\"}]", &tools), ERR_FORMAT);
    tu_assert_log_contains("tools[0]: not", NULL);
    assert_int_equal(harmony_tools_text("[1", &tools), ERR_FORMAT);
    tu_log_capture_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_to_prompt_ids),
        cmocka_unit_test(test_named_templates_and_raise),
        cmocka_unit_test(test_refused_template_refuses_chats),
        cmocka_unit_test(test_bad_metadata_named),
        cmocka_unit_test(test_harmony_tools_as_template),
        cmocka_unit_test(test_gguf_and_iebin_sources),
        cmocka_unit_test(test_tool_call_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
