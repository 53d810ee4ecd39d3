/*
 * http_oai.c — an OpenAI-style request body read and checked with jansson (see http_oai.h).
 */
#include "http_oai.h"

#include "err.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HTTP_OAI_MAX_DEPTH 64 /* jansson parses recursively: a body nested deeper is refused */

__attribute__((format(printf, 7, 8)))
static int refuse(int rc, char *param, size_t pcap, const char *p, char *msg, size_t cap,
                  const char *fmt, ...)
{
    snprintf(param, pcap, "%s", p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return rc;
}

#define BAD(p, ...) refuse(ERR_FORMAT, param, pcap, p, msg, cap, __VA_ARGS__)
#define UNSUPPORTED(p)                                                                        \
    refuse(ERR_UNSUPPORTED, param, pcap, p, msg, cap,                                        \
           "%s: not supported by this server", p)

/* Deeper than jansson should be asked to go: counted over the raw bytes, outside strings. */
static bool too_deep(const char *s, size_t n)
{
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            if (++depth > HTTP_OAI_MAX_DEPTH)
                return true;
        } else if (ch == '}' || ch == ']') {
            depth--;
        }
    }
    return false;
}

static int dup_to(char **out, const char *s)
{
    *out = strdup(s);
    return *out ? 0 : -ENOMEM;
}

/* A number the client may give as an integer or a real. */
static bool number(json_t *v, double *out)
{
    if (!json_is_number(v))
        return false;
    *out = json_number_value(v);
    return true;
}

static int get_prompt(json_t *v, struct http_oai_req *r, char *param, size_t pcap, char *msg,
                      size_t cap)
{
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0);
    if (json_is_string(v))
        return dup_to(&r->prompt, json_string_value(v));
    if (json_is_array(v) && json_array_size(v) > 0) {
        size_t n = json_array_size(v);
        if (!(r->prompt_ids = malloc(n * sizeof *r->prompt_ids)))
            return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT32_MAX)
                return BAD("prompt", "prompt: element %zu is not a token id (an integer >= 0); "
                           "give a string, [string] or [token ids]", i);
            r->prompt_ids[i] = (int32_t)json_integer_value(e);
        }
        r->n_prompt_ids = n;
        return 0;
    }
    return BAD("prompt", "prompt: must be a string, an array of one string or an array of "
               "token ids, got %s", json_is_array(v) ? "an empty or mixed array" : "another type");
}

/* "content": a string, null, or an array of {"type": "text", "text": "..."} parts. */
static int get_content(json_t *v, size_t i, char **out, char *param, size_t pcap, char *msg,
                       size_t cap)
{
    if (!v || json_is_null(v))
        return dup_to(out, "");
    if (json_is_string(v))
        return dup_to(out, json_string_value(v));
    if (!json_is_array(v))
        return BAD("messages", "messages[%zu].content: must be a string or an array of text "
                   "parts", i);
    size_t total = 1;
    for (size_t k = 0; k < json_array_size(v); k++) {
        json_t *p = json_array_get(v, k), *t = json_object_get(p, "type");
        json_t *x = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(t) ||
            strcmp(json_string_value(t), "text") != 0 || !json_is_string(x))
            return BAD("messages", "messages[%zu].content[%zu]: only {\"type\": \"text\", "
                       "\"text\": ...} parts are supported", i, k);
        total += json_string_length(x);
    }
    if (!(*out = malloc(total)))
        return -ENOMEM;
    size_t at = 0;
    for (size_t k = 0; k < json_array_size(v); k++) {
        json_t *x = json_object_get(json_array_get(v, k), "text");
        memcpy(*out + at, json_string_value(x), json_string_length(x));
        at += json_string_length(x);
    }
    (*out)[at] = '\0';
    return 0;
}

/* ---- chat tools ---- */

/* OpenAI's function-name rule: 1..64 of [A-Za-z0-9_-]. */
static bool fn_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* A tool call id as the chat encoding carries it: 1..128 of [A-Za-z0-9._:-]. */
static bool call_id_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 128)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || strchr("._:-", s[i])))
            return false;
    return true;
}

static int get_tools(json_t *root, struct http_oai_req *r, char *param, size_t pcap, char *msg,
                     size_t cap)
{
    json_t *v = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice");
    json_t *ptc = json_object_get(root, "parallel_tool_calls");
    r->parallel_tool_calls = true;
    if (ptc && !json_is_null(ptc)) {
        if (!json_is_boolean(ptc))
            return BAD("parallel_tool_calls", "parallel_tool_calls: must be a boolean");
        r->parallel_tool_calls = json_is_true(ptc);
    }
    bool none = false;
    const char *want = NULL; /* a named function */
    if (tc && !json_is_null(tc)) {
        const char *c = json_string_value(tc);
        json_t *tfn = json_object_get(tc, "function");
        const char *ttype = json_string_value(json_object_get(tc, "type"));
        if (c && strcmp(c, "none") == 0)
            none = true;
        else if (c && strcmp(c, "required") == 0)
            snprintf(r->tool_choice, sizeof r->tool_choice, "required");
        else if (json_is_object(tc)) {
            want = json_string_value(json_object_get(tfn, "name"));
            if (!ttype || strcmp(ttype, "function") != 0 || !want)
                return BAD("tool_choice", "tool_choice: an object must be {\"type\": "
                           "\"function\", \"function\": {\"name\": ...}}");
            snprintf(r->tool_choice, sizeof r->tool_choice, "function");
        } else if (!c || strcmp(c, "auto") != 0)
            return BAD("tool_choice", "tool_choice: must be \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if ((!v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)) &&
        r->tool_choice[0])
        return BAD("tool_choice", "tool_choice: \"%s\" needs tools", want ? want : "required");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return BAD("tools", "tools: must be an array of {\"type\": \"function\", \"function\": "
                   "{...}}");
    if (json_array_size(v) > HTTP_OAI_MAX_TOOLS)
        return refuse(ERR_RANGE, param, pcap, "tools", msg, cap, "tools: %zu, the limit is %u",
                      json_array_size(v), HTTP_OAI_MAX_TOOLS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *t = json_array_get(v, i), *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *name = json_object_get(fn, "name"), *d = json_object_get(fn, "description");
        json_t *par = json_object_get(fn, "parameters");
        if (!json_is_object(t))
            return BAD("tools", "tools[%zu]: must be an object", i);
        if (!type || strcmp(type, "function") != 0)
            return BAD("tools", "tools[%zu].type: must be \"function\"", i);
        if (!json_is_object(fn))
            return BAD("tools", "tools[%zu].function: missing or not an object", i);
        if (!json_is_string(name))
            return BAD("tools", "tools[%zu].function.name: missing or not a string", i);
        if (!fn_name_ok(json_string_value(name)))
            return BAD("tools", "tools[%zu].function.name: \"%.70s\" is not 1..64 characters "
                       "of A-Z a-z 0-9 _ -", i, json_string_value(name));
        if (d && !json_is_null(d) && !json_is_string(d))
            return BAD("tools", "tools[%zu].function.description: must be a string", i);
        if (par && !json_is_null(par) && !json_is_object(par))
            return BAD("tools", "tools[%zu].function.parameters: must be a JSON Schema object",
                       i);
    }
    if (want) {
        size_t i = 0;
        while (i < json_array_size(v) &&
               strcmp(want, json_string_value(json_object_get(
                                json_object_get(json_array_get(v, i), "function"), "name"))))
            i++;
        if (i == json_array_size(v))
            return BAD("tool_choice", "tool_choice.function.name: \"%.70s\" is not one of the "
                       "tools", want);
        if (!(r->tool_choice_function = strdup(want)))
            return -ENOMEM;
    }
    if (none || json_array_size(v) == 0)
        return 0;
    return (r->tools_json = json_dumps(v, JSON_COMPACT)) ? 0 : -ENOMEM;
}

/* "functions." + name (malloc'd) */
static int recipient_of(const char *name, char **out)
{
    size_t n = strlen(name) + sizeof "functions.";
    if (!(*out = malloc(n)))
        return -ENOMEM;
    snprintf(*out, n, "functions.%s", name);
    return 0;
}

/* An assistant message's tool_calls, each a message of its own from r->msgs[*at]. */
static int get_tool_calls(json_t *calls, size_t i, struct http_oai_req *r, size_t *at,
                          char *param, size_t pcap, char *msg, size_t cap)
{
    if (!json_is_array(calls))
        return BAD("messages", "messages[%zu].tool_calls: must be an array", i);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_object(c))
            return BAD("messages", "messages[%zu].tool_calls[%zu]: must be an object", i, k);
        if (!id || !call_id_ok(id))
            return BAD("messages", "messages[%zu].tool_calls[%zu].id: missing, or not 1..128 "
                       "characters of A-Z a-z 0-9 . _ : -", i, k);
        if (type && strcmp(type, "function") != 0)
            return BAD("messages", "messages[%zu].tool_calls[%zu].type: must be \"function\"",
                       i, k);
        if (!json_is_object(fn) || !name || !fn_name_ok(name))
            return BAD("messages", "messages[%zu].tool_calls[%zu].function.name: missing, or "
                       "not 1..64 characters of A-Z a-z 0-9 _ -", i, k);
        if (args && !json_is_null(args) && !json_is_string(args))
            return BAD("messages", "messages[%zu].tool_calls[%zu].function.arguments: must be "
                       "a string (JSON text)", i, k);
        struct http_oai_msg *m = &r->msgs[(*at)++];
        r->n_msgs = *at;
        int rc;
        if ((rc = dup_to(&m->role, "assistant")) < 0 ||
            (rc = dup_to(&m->content, args && json_is_string(args) ? json_string_value(args)
                                                                   : "{}")) < 0 ||
            (rc = recipient_of(name, &m->recipient)) < 0 || (rc = dup_to(&m->tool_call_id, id)) < 0)
            return rc;
    }
    return 0;
}

/* A tool message: its call's id and its tool's name (given, or the name of that call). */
static int get_tool_answer(json_t *m, size_t i, struct http_oai_req *r, struct http_oai_msg *out,
                           char *param, size_t pcap, char *msg, size_t cap)
{
    const char *id = json_string_value(json_object_get(m, "tool_call_id"));
    const char *name = json_string_value(json_object_get(m, "name"));
    if (!id || !call_id_ok(id))
        return BAD("messages", "messages[%zu].tool_call_id: missing, or not 1..128 characters "
                   "of A-Z a-z 0-9 . _ : -", i);
    const char *rcpt = NULL;
    for (size_t k = r->n_msgs; !name && k-- > 0;)
        if (r->msgs[k].tool_call_id && r->msgs[k].recipient &&
            strcmp(r->msgs[k].role, "assistant") == 0 && strcmp(r->msgs[k].tool_call_id, id) == 0)
            rcpt = r->msgs[k].recipient;
    if (!name && !rcpt)
        return BAD("messages", "messages[%zu].tool_call_id: \"%.64s\" answers no earlier tool "
                   "call (and the message has no name)", i, id);
    if (name && !fn_name_ok(name))
        return BAD("messages", "messages[%zu].name: not 1..64 characters of A-Z a-z 0-9 _ -",
                   i);
    int rc = dup_to(&out->tool_call_id, id);
    if (rc == 0)
        rc = name ? recipient_of(name, &out->recipient) : dup_to(&out->recipient, rcpt);
    return rc;
}

static int get_messages(json_t *v, struct http_oai_req *r, bool tools, char *param, size_t pcap,
                        char *msg, size_t cap)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool",
                                        NULL};
    if (!v)
        return BAD("messages", "messages: missing");
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("messages", "messages: must be a non-empty array");
    size_t n = json_array_size(v), total = n;
    for (size_t i = 0; tools && i < n; i++) {
        json_t *calls = json_object_get(json_array_get(v, i), "tool_calls");
        total += json_is_array(calls) ? json_array_size(calls) : 0;
    }
    if (total > HTTP_OAI_MAX_MSGS)
        return refuse(ERR_RANGE, param, pcap, "messages", msg, cap,
                      "messages: %zu%s, the limit is %u", total,
                      total > n ? " with each tool call one" : "", HTTP_OAI_MAX_MSGS);
    if (!(r->msgs = calloc(total, sizeof *r->msgs)))
        return -ENOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i), *role = json_object_get(m, "role");
        if (!json_is_object(m))
            return BAD("messages", "messages[%zu]: must be an object", i);
        if (!json_is_string(role))
            return BAD("messages", "messages[%zu].role: missing or not a string", i);
        bool known = false;
        for (size_t k = 0; roles[k]; k++)
            known |= strcmp(json_string_value(role), roles[k]) == 0;
        if (!known)
            return BAD("messages", "messages[%zu].role: \"%.32s\" is not one of system, "
                       "developer, user, assistant, tool", i, json_string_value(role));
        const char *rs = json_string_value(role);
        json_t *calls = json_object_get(m, "tool_calls");
        bool has_calls = calls && !json_is_null(calls);
        if (has_calls && (!tools || strcmp(rs, "assistant") != 0))
            return tools ? BAD("messages", "messages[%zu].tool_calls: only assistant messages "
                               "have them", i)
                         : UNSUPPORTED("messages.tool_calls");
        struct http_oai_msg tmp = {0};
        int rc = get_content(json_object_get(m, "content"), i, &tmp.content, param, pcap, msg,
                             cap);
        if (rc == 0 && strcmp(rs, "tool") == 0)
            rc = get_tool_answer(m, i, r, &tmp, param, pcap, msg, cap);
        if (rc == 0 && !(has_calls && !tmp.content[0]) && (rc = dup_to(&tmp.role, rs)) == 0) {
            r->msgs[at++] = tmp; /* owned from here: http_oai_free frees what is set */
            r->n_msgs = at;
            tmp = (struct http_oai_msg){0};
        }
        free(tmp.content), free(tmp.recipient), free(tmp.tool_call_id), free(tmp.role);
        if (rc == 0 && has_calls)
            rc = get_tool_calls(calls, i, r, &at, param, pcap, msg, cap);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int get_stop(json_t *v, struct http_oai_req *r, char *param, size_t pcap, char *msg,
                    size_t cap)
{
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v))
        return dup_to(&r->stop[r->n_stop++], json_string_value(v));
    if (!json_is_array(v))
        return BAD("stop", "stop: must be a string or an array of strings");
    if (json_array_size(v) > HTTP_OAI_MAX_STOP)
        return refuse(ERR_RANGE, param, pcap, "stop", msg, cap,
                      "stop: %zu strings, the limit is %u", json_array_size(v),
                      HTTP_OAI_MAX_STOP);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return BAD("stop", "stop[%zu]: must be a string", i);
        int rc = dup_to(&r->stop[r->n_stop], json_string_value(e));
        if (rc < 0)
            return rc;
        r->n_stop++;
    }
    return 0;
}

/* Parameters a client may send that this server does not implement: refused by name rather
 * than silently ignored (a caller asking for tools must not get a reply without them). */
static int check_unsupported(json_t *root, bool tools, char *param, size_t pcap, char *msg,
                             size_t cap)
{
    json_t *v;
    if (!tools && (v = json_object_get(root, "tools")) && !json_is_null(v) &&
        !(json_is_array(v) && json_array_size(v) == 0))
        return UNSUPPORTED("tools");
    if ((v = json_object_get(root, "functions")) && !json_is_null(v))
        return UNSUPPORTED("functions");
    if ((v = json_object_get(root, "echo")) && json_is_true(v))
        return UNSUPPORTED("echo");
    if ((v = json_object_get(root, "suffix")) && !json_is_null(v))
        return UNSUPPORTED("suffix");
    if ((v = json_object_get(root, "best_of")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        return UNSUPPORTED("best_of");
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return UNSUPPORTED("response_format");
    }
    return 0;
}

/* An integer 0..HTTP_OAI_MAX_LOGPROBS (logprobs of a completion, top_logprobs of a chat). */
static int logprob_count(json_t *v, const char *name, uint32_t *out, char *param, size_t pcap,
                         char *msg, size_t cap)
{
    if (!json_is_integer(v))
        return BAD(name, "%s: must be an integer 0..%d", name, HTTP_OAI_MAX_LOGPROBS);
    if (json_integer_value(v) < 0 || json_integer_value(v) > HTTP_OAI_MAX_LOGPROBS)
        return refuse(ERR_RANGE, param, pcap, name, msg, cap, "%s: %lld is outside 0..%d", name,
                      (long long)json_integer_value(v), HTTP_OAI_MAX_LOGPROBS);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

/* completions: logprobs N; chat: logprobs (a boolean) and top_logprobs N, which needs it */
static int get_logprobs(json_t *root, bool chat, struct http_oai_req *r, char *param,
                        size_t pcap, char *msg, size_t cap)
{
    json_t *v = json_object_get(root, "logprobs"), *t = json_object_get(root, "top_logprobs");
    int rc;
    if (!chat) {
        if (t && !json_is_null(t))
            return BAD("top_logprobs", "top_logprobs: a chat parameter; completions take "
                       "logprobs: N");
        if (!v || json_is_null(v))
            return 0;
        r->logprobs = true;
        return logprob_count(v, "logprobs", &r->top_logprobs, param, pcap, msg, cap);
    }
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return BAD("logprobs", "logprobs: must be a boolean (top_logprobs gives the count)");
        r->logprobs = json_is_true(v);
    }
    if (t && !json_is_null(t)) {
        if ((rc = logprob_count(t, "top_logprobs", &r->top_logprobs, param, pcap, msg, cap)) < 0)
            return rc;
        if (!r->logprobs)
            return BAD("top_logprobs", "top_logprobs: needs logprobs: true");
    }
    return 0;
}

static int parse_root(json_t *root, bool chat, unsigned flags, struct http_oai_req *r,
                      char *param, size_t pcap, char *msg, size_t cap)
{
    json_t *v;
    int rc;
    bool tools = chat && (flags & HTTP_OAI_TOOLS);
    if (!json_is_object(root))
        return BAD("", "the body must be a JSON object");
    if ((rc = check_unsupported(root, tools, param, pcap, msg, cap)) < 0 ||
        (tools && (rc = get_tools(root, r, param, pcap, msg, cap)) < 0) ||
        (rc = get_logprobs(root, chat, r, param, pcap, msg, cap)) < 0)
        return rc;
    v = json_object_get(root, "model");
    if (!v)
        return BAD("model", "model: missing (GET /v1/models lists the names)");
    if (!json_is_string(v) || json_string_length(v) == 0)
        return BAD("model", "model: must be a non-empty string");
    if ((rc = dup_to(&r->model, json_string_value(v))) < 0)
        return rc;

    if (chat) {
        if ((rc = get_messages(json_object_get(root, "messages"), r, tools, param, pcap, msg,
                               cap)) < 0)
            return rc;
    } else {
        if (!(v = json_object_get(root, "prompt")))
            return BAD("prompt", "prompt: missing");
        if ((rc = get_prompt(v, r, param, pcap, msg, cap)) < 0)
            return rc;
    }

    if ((v = json_object_get(root, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return BAD("stream", "stream: must be a boolean");
        r->stream = json_is_true(v);
    }
    if ((v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
        if (!json_is_object(v))
            return BAD("stream_options", "stream_options: must be an object");
        json_t *u = json_object_get(v, "include_usage");
        if (u && !json_is_null(u) && !json_is_boolean(u))
            return BAD("stream_options", "stream_options.include_usage: must be a boolean");
        r->include_usage = json_is_true(u);
    }
    r->n = 1;
    if ((v = json_object_get(root, "n")) && !json_is_null(v)) {
        if (!json_is_integer(v))
            return BAD("n", "n: must be an integer");
        if (json_integer_value(v) < 1 || json_integer_value(v) > HTTP_OAI_MAX_N)
            return refuse(ERR_RANGE, param, pcap, "n", msg, cap, "n: %lld is outside 1..%u",
                          (long long)json_integer_value(v), HTTP_OAI_MAX_N);
        r->n = (uint32_t)json_integer_value(v);
    }
    /* max_completion_tokens is chat's newer name; either may come, the newer wins */
    static const char *const lens[] = {"max_tokens", "max_completion_tokens"};
    for (size_t k = 0; k < 2; k++) {
        if (!(v = json_object_get(root, lens[k])) || json_is_null(v))
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > UINT32_MAX)
            return BAD(lens[k], "%s: must be an integer >= 1", lens[k]);
        r->has_max_tokens = true;
        r->max_tokens = (uint32_t)json_integer_value(v);
    }
    double d;
    if ((v = json_object_get(root, "temperature")) && !json_is_null(v)) {
        if (!number(v, &d) || !isfinite(d))
            return BAD("temperature", "temperature: must be a number");
        r->has_temperature = true;
        r->temperature = (float)d;
    }
    if ((v = json_object_get(root, "top_p")) && !json_is_null(v)) {
        if (!number(v, &d) || !isfinite(d))
            return BAD("top_p", "top_p: must be a number");
        r->has_top_p = true;
        r->top_p = (float)d;
    }
    if ((v = json_object_get(root, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v))
            return BAD("seed", "seed: must be an integer");
        r->has_seed = true;
        r->seed = (uint64_t)json_integer_value(v);
    }
    return get_stop(json_object_get(root, "stop"), r, param, pcap, msg, cap);
}

int http_oai_parse(const char *body, size_t len, bool chat, struct http_oai_req *out,
                   char *param, size_t pcap, char *msg, size_t cap)
{
    return http_oai_parse_ex(body, len, chat, 0, out, param, pcap, msg, cap);
}

int http_oai_parse_ex(const char *body, size_t len, bool chat, unsigned flags,
                      struct http_oai_req *out, char *param, size_t pcap, char *msg, size_t cap)
{
    memset(out, 0, sizeof *out);
    out->chat = chat;
    param[0] = msg[0] = '\0';
    if (len == 0)
        return BAD("", "the body is empty: send a JSON object");
    if (too_deep(body, len))
        return BAD("", "the body nests deeper than %d levels", HTTP_OAI_MAX_DEPTH);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root)
        return BAD("", "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    int rc = parse_root(root, chat, flags, out, param, pcap, msg, cap);
    json_decref(root);
    if (rc == -ENOMEM)
        snprintf(msg, cap, "out of memory");
    if (rc < 0)
        http_oai_free(out);
    return rc;
}

void http_oai_free(struct http_oai_req *r)
{
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    for (size_t i = 0; i < r->n_msgs; i++)
        free(r->msgs[i].role), free(r->msgs[i].content), free(r->msgs[i].recipient),
            free(r->msgs[i].tool_call_id);
    free(r->tools_json);
    free(r->tool_choice_function);
    free(r->msgs);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    bool chat = r->chat;
    memset(r, 0, sizeof *r);
    r->chat = chat;
}

char *http_oai_render_plain(const struct http_oai_req *r)
{
    size_t n = sizeof "<|assistant|>\n";
    for (size_t i = 0; i < r->n_msgs; i++)
        n += strlen(r->msgs[i].role) + strlen(r->msgs[i].content) + 8;
    char *out = malloc(n), *p = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < r->n_msgs; i++)
        p += sprintf(p, "<|%s|>\n%s\n", r->msgs[i].role, r->msgs[i].content);
    strcpy(p, "<|assistant|>\n");
    return out;
}

json_t *http_oai_tool_call(unsigned index, bool delta, bool opens, const char *id,
                           const char *name, const char *args, size_t args_len)
{
    if (strncmp(name, "functions.", 10) == 0)
        name += 10;
    json_t *fn = opens || !delta ? json_pack("{s:s, s:s%}", "name", name, "arguments", args,
                                             args_len)
                                 : json_pack("{s:s%}", "arguments", args, args_len);
    json_t *c = opens || !delta ? json_pack("{s:s, s:s, s:o}", "id", id, "type", "function",
                                            "function", fn)
                                : json_pack("{s:o}", "function", fn);
    if (c && delta && json_object_set_new(c, "index", json_integer(index)) < 0) {
        json_decref(c);
        return NULL;
    }
    return c;
}
