/*
 * chat_render.c — test driver: a chat given as the gRPC API's messages (JSON: {"tools": [...]
 * or null, "messages": [{"role", "content", "channel"?, "recipient"?, "tool_call_id"?}],
 * "bos_token"?, "eos_token"?}) encoded as the gateway encodes it (shm chat encoding) and
 * rendered by the worker's Jinja path (chat_render_jinja_text) with the chat.ie.json of a
 * model directory. Prints the text. Used by test_chat_templates.py to hold the worker's
 * messages (tool calls, tool answers) to what apply_chat_template renders.
 * Usage: chat_render MODEL_DIR CHAT.json. Exit 0, 1 usage/IO, 3 render error (stderr).
 */
#include "chat.h"
#include "msg.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *opt_str(json_t *o, const char *k, uint32_t *len)
{
    json_t *v = json_object_get(o, k);
    *len = json_is_string(v) ? (uint32_t)json_string_length(v) : 0;
    return json_is_string(v) ? json_string_value(v) : "";
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: chat_render MODEL_DIR CHAT.json\n");
        return 1;
    }
    json_error_t je;
    json_t *in = json_load_file(argv[2], 0, &je);
    json_t *msgs = json_object_get(in, "messages");
    if (!json_is_array(msgs) || chat_model_load(argv[1]) != 0) {
        fprintf(stderr, "chat_render: bad input or model dir\n");
        return 1;
    }
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    size_t n = json_array_size(msgs);
    struct shm_chat_msg *m = calloc(n, sizeof *m);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(o, "role"));
        for (int k = 0; k < 5; k++)
            if (role && strcmp(role, roles[k]) == 0)
                m[i].role = (enum shm_chat_role)k;
        m[i].content = opt_str(o, "content", &m[i].content_len);
        m[i].channel = opt_str(o, "channel", &m[i].channel_len);
        m[i].recipient = opt_str(o, "recipient", &m[i].recipient_len);
        m[i].tool_call_id = opt_str(o, "tool_call_id", &m[i].tool_call_id_len);
    }
    json_t *tools = json_object_get(in, "tools");
    char *tj = json_is_array(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
    struct shm_chat ch = {.msgs = m, .n = (uint32_t)n, .tools = tj,
                          .tools_len = tj ? (uint32_t)strlen(tj) : 0};
    uint32_t len;
    char err[512];
    if (shm_chat_size(&ch, &len, err, sizeof err) != 0) {
        fprintf(stderr, "chat_render: %s\n", err);
        return 3; /* exits: the OS frees */
    }
    char *enc = malloc(len);
    shm_chat_encode(&ch, enc, len);
    char *text;
    size_t tl;
    int rc = chat_render_jinja_text(enc, len, json_string_value(json_object_get(in, "bos_token")),
                                    json_string_value(json_object_get(in, "eos_token")), &text,
                                    &tl, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "%s\n", err);
    else
        fwrite(text, 1, tl, stdout);
    free(text);
    free(enc);
    free(tj);
    free(m);
    json_decref(in);
    chat_model_unload();
    return rc != 0 ? 3 : 0;
}
