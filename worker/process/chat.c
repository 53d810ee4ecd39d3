/*
 * chat.c — chat prompts rendered in the worker (see chat.h): harmony for gpt-oss, the plain
 * template for the rest (it used to live in the HTTP door; one renderer serves both doors now).
 */
#include "chat.h"

#include "err.h"
#include "harmony.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[] = {"system", "developer", "user", "assistant", "tool"};

/* The harmony specials the renderer and the parser need (harmony.h's NOTES). */
static bool has_harmony(const struct tok *t)
{
    static const char *const need[] = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                       "<|return|>", "<|call|>"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (tok_token_id(t, need[i], strlen(need[i])) < 0)
            return false;
    return true;
}

enum chat_template chat_template_of(const char *arch, const struct tok *t, char *why,
                                    size_t cap)
{
    why[0] = '\0';
    if (!t) {
        snprintf(why, cap, "chat: the model has no tokenizer, so no chat template; send token "
                 "ids");
        return CHAT_TPL_NONE;
    }
    if (arch && strcmp(arch, "gpt_oss") == 0) {
        if (has_harmony(t))
            return CHAT_TPL_HARMONY;
        snprintf(why, cap, "chat: this gpt_oss model's tokenizer lacks the harmony special "
                 "tokens (<|start|>, <|channel|>, <|return|>, ...): its chat template cannot "
                 "be rendered");
        return CHAT_TPL_NONE;
    }
    return CHAT_TPL_PLAIN;
}

/* A NUL-terminated copy of s[n] (the decoded views are not terminated). */
static char *dup_n(const char *s, uint32_t n) { return n ? strndup(s, n) : strdup(""); }

static int render_plain(const struct tok *t, const struct shm_chat_msg *m, uint32_t n,
                        int32_t **ids, size_t *n_ids, char *err, size_t cap)
{
    size_t len = sizeof "<|assistant|>\n";
    for (uint32_t i = 0; i < n; i++)
        len += strlen(role_names[m[i].role]) + m[i].content_len + 8;
    char *text = malloc(len), *p = text;
    if (!text) {
        snprintf(err, cap, "worker out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        p += sprintf(p, "<|%s|>\n", role_names[m[i].role]);
        memcpy(p, m[i].content, m[i].content_len);
        p += m[i].content_len;
        *p++ = '\n';
    }
    strcpy(p, "<|assistant|>\n");
    log_clear_error();
    int rc = tok_encode(t, text, strlen(text), true, ids, n_ids);
    if (rc < 0)
        snprintf(err, cap, "%s", log_last_error());
    free(text);
    return rc;
}

static int render_harmony(const struct tok *t, const struct shm_chat_msg *m, uint32_t n,
                          uint32_t flags, int32_t **ids, size_t *n_ids, char *err, size_t cap)
{
    struct harmony_msg *hm = calloc(n, sizeof *hm);
    char **strs = calloc(3 * (size_t)n, sizeof *strs);
    int rc = 0;
    if (!hm || !strs) {
        rc = -ENOMEM;
        goto out;
    }
    static const enum harmony_role roles[] = {HARMONY_SYSTEM, HARMONY_DEVELOPER, HARMONY_USER,
                                              HARMONY_ASSISTANT, HARMONY_TOOL};
    for (uint32_t i = 0; i < n; i++) {
        char **s = &strs[3 * i];
        if (!(s[0] = dup_n(m[i].content, m[i].content_len)) ||
            (m[i].channel_len && !(s[1] = dup_n(m[i].channel, m[i].channel_len))) ||
            (m[i].recipient_len && !(s[2] = dup_n(m[i].recipient, m[i].recipient_len)))) {
            rc = -ENOMEM;
            goto out;
        }
        hm[i].role = roles[m[i].role];
        hm[i].content = s[0];
        if (m[i].role == SHM_CHAT_TOOL) {
            hm[i].name = s[2];
        } else {
            hm[i].channel = s[1];
            hm[i].recipient = s[2];
        }
    }
    struct harmony_opts o = {.effort = (flags & SHM_GEN_EFFORT_LOW)    ? HARMONY_EFFORT_LOW
                                       : (flags & SHM_GEN_EFFORT_HIGH) ? HARMONY_EFFORT_HIGH
                                                                       : HARMONY_EFFORT_MEDIUM};
    log_clear_error();
    rc = harmony_render(t, hm, n, &o, ids, n_ids);
    if (rc < 0)
        snprintf(err, cap, "%s", log_last_error());
out:
    if (rc == -ENOMEM)
        snprintf(err, cap, "worker out of memory");
    for (size_t i = 0; strs && i < 3 * (size_t)n; i++)
        free(strs[i]);
    free(strs);
    free(hm);
    return rc;
}

int chat_render(const struct tok *t, enum chat_template tpl, const char *enc, uint32_t len,
                uint32_t flags, int32_t **ids, size_t *n, char *err, size_t cap)
{
    *ids = NULL, *n = 0;
    uint32_t count = 0;
    /* the record was validated on arrival; decoding again costs little and keeps this
     * function safe on its own */
    if (shm_chat_decode(enc, len, NULL, 0, &count) < 0) {
        snprintf(err, cap, "chat: the messages' encoding is malformed");
        return ERR_FORMAT;
    }
    struct shm_chat_msg *m = calloc(count, sizeof *m);
    if (!m) {
        snprintf(err, cap, "worker out of memory");
        return -ENOMEM;
    }
    int rc = shm_chat_decode(enc, len, m, count, &count);
    if (rc == 0) {
        if (tpl == CHAT_TPL_HARMONY)
            rc = render_harmony(t, m, count, flags, ids, n, err, cap);
        else if (tpl == CHAT_TPL_PLAIN)
            rc = render_plain(t, m, count, ids, n, err, cap);
        else
            rc = ERR_UNSUPPORTED, snprintf(err, cap, "chat: the model has no chat template");
    }
    free(m);
    return rc;
}
