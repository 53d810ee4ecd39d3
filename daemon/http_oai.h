/*
 * http_oai.h — the body of an OpenAI-compatible request (POST /v1/completions and
 * /v1/chat/completions) read into a plain struct, every field a client controls checked for
 * its JSON type and shape, and the chat template that turns messages into one prompt.
 *
 * Pure (no HTTP, no gateway) so tests/fuzz/fuzz_http_body.c drives it directly. A refusal
 * names the offending parameter as OpenAI's error object does ("param": "temperature"); value
 * ranges the gRPC path also checks (temperature >= 0, top_p in (0, 1], max_tokens against
 * limits.max_tokens, stop strings' count and length) are left to daemon/gw_req.c, whose
 * messages daemon/http.c maps back to these names.
 */
#ifndef CLOCHER_DAEMON_HTTP_OAI_H
#define CLOCHER_DAEMON_HTTP_OAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_OAI_MAX_LOGPROBS 20 /* OpenAI's bound on logprobs / top_logprobs */
#define HTTP_OAI_MAX_N 16u      /* choices per request ("n") */
#define HTTP_OAI_MAX_STOP 16u   /* stop strings (SHM_MAX_STOP) */
#define HTTP_OAI_MAX_MSGS 4096u /* chat messages */

struct http_oai_msg {
    char *role;    /* "system", "developer", "user", "assistant", "tool" */
    char *content; /* the text ("" for none); parts of type "text" joined */
    /* chat tools (http_oai_parse_ex with HTTP_OAI_TOOLS): an assistant message's tool_calls
     * each become an assistant message of their own (content: the arguments), after the
     * message's text if it has any; recipient "functions.NAME", tool_call_id the call's id.
     * A tool message: recipient "functions.NAME" (its "name", else the name of the call its
     * tool_call_id answers), tool_call_id. NULL for none. As gRPC's ChatMessage takes them. */
    char *recipient;
    char *tool_call_id;
};

struct http_oai_req {
    bool chat;                   /* /v1/chat/completions */
    char *model;                 /* required */
    /* the prompt: completions give text or token ids; chat gives messages */
    char *prompt;
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    struct http_oai_msg *msgs;
    size_t n_msgs;
    bool stream, include_usage;
    uint32_t n;                  /* choices, 1..HTTP_OAI_MAX_N */
    bool has_max_tokens;
    uint32_t max_tokens;         /* max_tokens or max_completion_tokens */
    bool has_temperature, has_top_p, has_seed;
    float temperature, top_p;
    uint64_t seed;
    size_t n_stop;
    char *stop[HTTP_OAI_MAX_STOP];
    /* completions: logprobs N (0..20: the chosen token's and N alternatives'); chat:
     * logprobs true, top_logprobs N (0..20) */
    bool logprobs;
    uint32_t top_logprobs;
    /* chat tools (HTTP_OAI_TOOLS): the `tools` array as compact JSON (gRPC's Chat.tools_json;
     * NULL: none, or tool_choice "none", which leaves them out of the prompt as vLLM does);
     * parallel_tool_calls as sent (default true; false: the reply holds at most one call) */
    char *tools_json;
    bool parallel_tool_calls;
    /* tool_choice as gRPC's Chat carries it: "" (auto), "required" or "function" with
     * tool_choice_function (malloc'd) the name, one of the tools' */
    char tool_choice[16];
    char *tool_choice_function;
};

/* http_oai_parse_ex flags */
#define HTTP_OAI_TOOLS 0x1u /* the caller carries tools and tool calls (else `tools` is refused
                             * as unsupported, so a client asking for tools never gets a reply
                             * made without them) */
#define HTTP_OAI_MAX_TOOLS 128u

/*
 * Reads body[len] (a JSON object) into *out (owned: http_oai_free). 0, or a negative code with
 * param[pcap] the offending parameter ("" for the body itself) and msg[cap] saying what is
 * wrong: ERR_FORMAT (not JSON, wrong type, missing), ERR_UNSUPPORTED (a parameter this server
 * does not implement: tools, echo, ...), ERR_RANGE (n, logprobs, top_logprobs: a count out of
 * range).
 */
int http_oai_parse(const char *body, size_t len, bool chat, struct http_oai_req *out,
                   char *param, size_t pcap, char *msg, size_t cap);
/* http_oai_parse with flags (HTTP_OAI_TOOLS): chat requests take `tools` (each {"type":
 * "function", "function": {"name" (1..64 of [A-Za-z0-9_-]), "description"?, "parameters"?
 * (an object)}}), `tool_choice` ("auto", "none", "required" or {"type": "function",
 * "function": {"name"}} naming one of the tools; "required" and a name need tools),
 * `parallel_tool_calls` (a boolean), assistant messages
 * with `tool_calls` and `tool` messages with `tool_call_id`; a malformed one is ERR_FORMAT
 * with param "tools", "tool_choice" or "messages" and msg naming the element and field. */
int http_oai_parse_ex(const char *body, size_t len, bool chat, unsigned flags,
                      struct http_oai_req *out, char *param, size_t pcap, char *msg, size_t cap);

/* One entry of a reply's `tool_calls` (json_t *, owned by the caller; NULL on OOM): whole,
 * {"id", "type": "function", "function": {"name", "arguments"}}; or, for a stream
 * (delta true), {"index", ...} with id, type and name only on the piece that opens the call
 * and each later piece only {"index", "function": {"arguments": piece}}, as OpenAI streams
 * them. name is the recipient ("functions.get_weather": the "functions." is cut). */
struct json_t;
struct json_t *http_oai_tool_call(unsigned index, bool delta, bool opens, const char *id,
                                  const char *name, const char *args, size_t args_len);

void http_oai_free(struct http_oai_req *r);

/*
 * The prompt of a chat request in the plain template (docs/HTTP.md): each message as
 * "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n" for the reply. Models whose tokenizer carries
 * a chat template of its own (gpt-oss's harmony: worker/tok/harmony.h) are rendered by the
 * worker instead once that seam is wired (daemon/http.c, render_chat). malloc'd, NULL on OOM.
 */
char *http_oai_render_plain(const struct http_oai_req *r);

#endif
