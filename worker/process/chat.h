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

#include <stddef.h>
#include <stdint.h>

enum chat_template {
    CHAT_TPL_NONE = 0, /* the model cannot take chats (chat_template_of says why) */
    CHAT_TPL_PLAIN,    /* "<|ROLE|>\nCONTENT\n" per message, then "<|assistant|>\n", with BOS */
    CHAT_TPL_HARMONY,  /* gpt-oss: worker/tok/harmony.h */
    CHAT_TPL_JINJA,    /* the model's own Jinja2 chat_template (chat.ie.json, worker/tok/jinja.h) */
};

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

#endif
