/*
 * chat.h — the worker's chat prompts: a GENERATE whose prompt is a chat encoding (shm_abi.h,
 * SHM_GEN_CHAT) rendered to prompt ids with the model's template, and the generated ids of a
 * harmony model parsed into channel-tagged pieces. Both doors (gRPC Chat, HTTP
 * /v1/chat/completions) reach this one renderer. Templates: docs/CHAT.md.
 */
#ifndef CLOCHER_WORKER_PROCESS_CHAT_H
#define CLOCHER_WORKER_PROCESS_CHAT_H

#include "msg.h"
#include "tok.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum chat_template {
    CHAT_TPL_NONE = 0, /* the model cannot take chats (chat_template_of says why) */
    CHAT_TPL_PLAIN,    /* "<|ROLE|>\nCONTENT\n" per message, then "<|assistant|>\n", with BOS */
    CHAT_TPL_HARMONY,  /* gpt-oss: worker/tok/harmony.h */
    CHAT_TPL_JINJA,    /* the model's own Jinja2 chat_template (chat.ie.json, worker/tok/jinja.h) */
};

/* The tool-call format a Jinja template teaches its model (docs/CHAT.md "Tool calls"): read
 * from the template's own text, the markers its tool blocks write. */
enum chat_calls {
    CHAT_CALLS_NONE = 0,   /* no tool blocks: replies stay text */
    CHAT_CALLS_HERMES,     /* "<tool_call>" in it: <tool_call>{"name", "arguments"}</tool_call>
                            * (Hermes, Qwen2.5, ...), any number */
    CHAT_CALLS_MISTRAL,    /* "[TOOL_CALLS]": [TOOL_CALLS][{"name", "arguments"}, ...] */
    CHAT_CALLS_LLAMA,      /* "\"parameters\": " and "<|python_tag|>"/"ipython": the whole
                            * reply one {"name", "parameters"} (Llama 3.1/3.2) */
};
enum chat_calls chat_calls_format(const char *template_src);

/* The chat metadata file conversion writes beside the IEBIN (client/offline/chat_meta.h). */
#ifndef CHAT_META_FILE /* the same name in worker/process/chat.h and client/offline/chat_meta.h */
#define CHAT_META_FILE "chat.ie.json"
#endif

/* Reads <model_dir>/chat.ie.json once at start, before chat_template_of and before any render
 * (a worker serves one model; the template is then read-only and shared by the threads that
 * render). No file: 0, and the model keeps the plain template. A template the interpreter
 * refuses is not an error here: chat_template_of then answers CHAT_TPL_NONE naming the
 * construct. 0, or a negative code logged naming the file and field. */
int chat_model_load(const char *model_dir);
/* Drops what chat_model_load read (tests; a worker keeps it to the end). */
void chat_model_unload(void);

/* The template of a model of architecture arch with tokenizer t (NULL: none): harmony for
 * gpt_oss (its own chat_template renders the same prompt), else the model's chat_template when
 * chat_model_load found one, else the plain template; CHAT_TPL_NONE with why[cap] saying why
 * (no tokenizer, missing harmony tokens, a chat_template the interpreter refuses). */
enum chat_template chat_template_of(const char *arch, const struct tok *t, char *why,
                                    size_t cap);

/* Renders the chat encoding enc[len] (validated again here) with tpl; flags: the GENERATE's
 * SHM_GEN_* (reasoning effort). 0 with *ids (malloc'd) [*n]; a negative code with err[cap]
 * naming what is wrong. */
int chat_render(const struct tok *t, enum chat_template tpl, const char *enc, uint32_t len,
                uint32_t flags, int32_t **ids, size_t *n, char *err, size_t cap);

/* The text the model's Jinja template (chat_model_load) renders for the chat encoding
 * enc[len], with bos/eos the special tokens' text (NULL: undefined): what chat_render
 * tokenizes, for drivers and tests that compare it with python3-jinja2. *text malloc'd. */
int chat_render_jinja_text(const char *enc, uint32_t len, const char *bos, const char *eos,
                           char **text, size_t *n, char *err, size_t cap);

/* ---- a chat's generated text: channels and tool calls ---- */

/* One piece the worker sends for a chat (a TOKEN record's text, channel and call header). */
struct chat_piece {
    enum shm_channel channel;
    const char *text;        /* [len] bytes, len <= SHM_MAX_PIECE */
    size_t len;
    const char *call_name;   /* non-NULL: this piece opens a tool call ("functions.NAME"), its
                              * text and the next pieces' are the arguments */
    const char *call_id;     /* with call_name: "call_" and 24 random alphanumerics */
};

struct chat_out;

/* The parser of what a chat's model generates, for the template tpl and the chat encoding
 * enc[len] (its tools decide whether replies are searched for tool calls): harmony's channels
 * and `to=` recipients; for Jinja templates, the tool-call format of chat_calls_format when
 * the chat defines tools. Text that does not parse as a call stays content. 0 or -ENOMEM. */
int chat_out_new(const struct tok *t, enum chat_template tpl, const char *enc, uint32_t len,
                 struct chat_out **out);
void chat_out_free(struct chat_out *o);
/* Feeds one generated id (-1: text the engine held back) and the text the engine made of it:
 * *pieces[*n] (valid until the next call) are what to send, the first one with the id (a
 * piece may have no text). *stop: the format says the reply is complete (harmony <|return|>,
 * <|call|>: *call). Never fails: output the format does not allow stays text (channel OTHER
 * for harmony). */
void chat_out_push(struct chat_out *o, int32_t id, const char *text, size_t len,
                   const struct chat_piece **pieces, size_t *n, bool *stop, bool *call);
/* At the end of the reply: the text held back (a call that never closed, as text). */
void chat_out_flush(struct chat_out *o, const struct chat_piece **pieces, size_t *n);
/* Whether the reply held a tool call (the finish reason is then a tool call). */
bool chat_out_called(const struct chat_out *o);

#endif
