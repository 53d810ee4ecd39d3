/*
 * chat.h — the worker's chat prompts: a GENERATE whose prompt is a chat encoding (shm_abi.h,
 * SHM_GEN_CHAT) rendered to prompt ids with the model's template, and the generated ids of a
 * harmony model parsed into channel-tagged pieces. Both doors (gRPC Chat, HTTP
 * /v1/chat/completions) reach this one renderer. Templates: docs/DAEMON.md "Chat".
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
};

/* The template of a model of architecture arch with tokenizer t (NULL: none); CHAT_TPL_NONE
 * with why[cap] saying why. */
enum chat_template chat_template_of(const char *arch, const struct tok *t, char *why,
                                    size_t cap);

/* Renders the chat encoding enc[len] (validated again here) with tpl; flags: the GENERATE's
 * SHM_GEN_* (reasoning effort). 0 with *ids (malloc'd) [*n]; a negative code with err[cap]
 * naming what is wrong. */
int chat_render(const struct tok *t, enum chat_template tpl, const char *enc, uint32_t len,
                uint32_t flags, int32_t **ids, size_t *n, char *err, size_t cap);

#endif
