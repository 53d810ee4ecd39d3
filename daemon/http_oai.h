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
};

/*
 * Reads body[len] (a JSON object) into *out (owned: http_oai_free). 0, or a negative code with
 * param[pcap] the offending parameter ("" for the body itself) and msg[cap] saying what is
 * wrong: ERR_FORMAT (not JSON, wrong type, missing), ERR_UNSUPPORTED (a parameter this server
 * does not implement: tools, echo, ...), ERR_RANGE (n, logprobs, top_logprobs: a count out of
 * range).
 */
int http_oai_parse(const char *body, size_t len, bool chat, struct http_oai_req *out,
                   char *param, size_t pcap, char *msg, size_t cap);

void http_oai_free(struct http_oai_req *r);

/*
 * The prompt of a chat request in the plain template (docs/HTTP.md): each message as
 * "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n" for the reply. Models whose tokenizer carries
 * a chat template of its own (gpt-oss's harmony: worker/tok/harmony.h) are rendered by the
 * worker instead once that seam is wired (daemon/http.c, render_chat). malloc'd, NULL on OOM.
 */
char *http_oai_render_plain(const struct http_oai_req *r);

#endif
