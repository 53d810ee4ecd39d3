/*
 * chat.c — chat prompts rendered in the worker (see chat.h): harmony for gpt-oss, the model's
 * own Jinja2 chat_template when conversion carried one (chat.ie.json), the plain template for
 * the rest (it used to live in the HTTP door; one renderer serves both doors now).
 */
#include "chat.h"

#include "err.h"
#include "harmony.h"
#include "jinja.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[] = {"system", "developer", "user", "assistant", "tool"};

/* The model's chat_template: set by chat_model_load before the render threads start, read-only
 * after (jinja_render does not modify a template), so the threads share it without a lock. */
static struct {
    struct jinja_tpl *tpl;
    char refused[320]; /* non-empty: the template the model carries cannot be rendered */
} g_model;

int chat_model_load(const char *model_dir)
{
    chat_model_unload();
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", model_dir, CHAT_META_FILE);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        LOG_ERR("open(%s) failed: %s", path, strerror(e));
        return -e;
    }
    json_error_t je;
    json_t *meta = json_loadf(f, 0, &je);
    fclose(f);
    if (!meta || !json_is_object(meta)) {
        LOG_ERR("%s:%d: %s", path, meta ? 1 : je.line, meta ? "not a JSON object" : je.text);
        json_decref(meta);
        return ERR_FORMAT;
    }
    json_t *ct = json_object_get(meta, "chat_template");
    int rc = 0;
    if (ct && !json_is_string(ct)) {
        LOG_ERR("%s: chat_template is not a string", path);
        rc = ERR_FORMAT;
    } else if (ct) {
        char err[256];
        if (jinja_parse(json_string_value(ct), json_string_length(ct), &g_model.tpl, err,
                        sizeof err) != 0)
            snprintf(g_model.refused, sizeof g_model.refused,
                     "chat: the model's chat_template cannot be rendered: %s", err);
    }
    json_decref(meta);
    return rc;
}

void chat_model_unload(void)
{
    jinja_free(g_model.tpl);
    g_model.tpl = NULL;
    g_model.refused[0] = '\0';
}

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
    if (g_model.refused[0]) {
        snprintf(why, cap, "%s", g_model.refused);
        return CHAT_TPL_NONE;
    }
    return g_model.tpl ? CHAT_TPL_JINJA : CHAT_TPL_PLAIN;
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

/* The render variables apply_chat_template passes (docs/CHAT.md): messages, tools (none: the
 * chat call carries no tool definitions), add_generation_prompt, the special tokens' text.
 * An assistant message addressed to a recipient is a tool call (its content the arguments,
 * JSON when it parses); a tool message answers the latest call. */
static json_t *jinja_vars(const struct tok *t, const struct shm_chat_msg *m, uint32_t n,
                          char *err, size_t cap)
{
    json_t *msgs = json_array(), *vars = NULL;
    char call_id[16] = "";
    for (uint32_t i = 0; msgs && i < n; i++) {
        json_t *o = json_object();
        if (!o || json_array_append_new(msgs, o))
            goto nomem;
        if (m[i].channel_len && !(m[i].channel_len == 5 && !memcmp(m[i].channel, "final", 5))) {
            snprintf(err, cap, "chat: message %u: channel '%.*s' is harmony's (gpt-oss); this "
                     "model's template has no channels", i, (int)m[i].channel_len, m[i].channel);
            json_decref(msgs);
            return NULL;
        }
        json_t *content = json_stringn(m[i].content, m[i].content_len);
        if (!content) {
            snprintf(err, cap, "chat: message %u: the content is not valid UTF-8", i);
            json_decref(msgs);
            return NULL;
        }
        json_object_set_new(o, "role", json_string(role_names[m[i].role]));
        if (m[i].role == SHM_CHAT_ASSISTANT && m[i].recipient_len) {
            /* ids of 9 alphanumerics: what Mistral's templates insist on */
            snprintf(call_id, sizeof call_id, "call%05u", i);
            const char *name = m[i].recipient;
            uint32_t nl = m[i].recipient_len;
            if (nl > 10 && !memcmp(name, "functions.", 10))
                name += 10, nl -= 10;
            json_t *args = json_loadb(m[i].content, m[i].content_len, 0, NULL);
            json_t *call = json_pack("{s:s, s:s, s:{s:s%, s:o}}", "id", call_id, "type",
                                     "function", "function", "name", name, (size_t)nl,
                                     "arguments", args ? args : json_incref(content));
            json_decref(content);
            if (!call)
                goto nomem;
            json_object_set_new(o, "content", json_null());
            json_object_set_new(o, "tool_calls", json_pack("[o]", call));
            continue;
        }
        json_object_set_new(o, "content", content);
        if (m[i].role == SHM_CHAT_TOOL) {
            json_object_set_new(o, "name", json_stringn(m[i].recipient, m[i].recipient_len));
            if (call_id[0])
                json_object_set_new(o, "tool_call_id", json_string(call_id));
        }
    }
    if (!msgs)
        goto nomem;
    vars = json_pack("{s:o, s:n, s:n, s:b}", "messages", msgs, "tools", "documents",
                     "add_generation_prompt", 1);
    if (!vars)
        goto nomem;
    static const char *const names[] = {"bos_token", "eos_token"};
    int32_t ids[] = {tok_bos(t), tok_eos(t)};
    for (int k = 0; k < 2; k++) {
        const char *s = ids[k] >= 0 ? tok_token_str(t, ids[k]) : NULL;
        if (s)
            json_object_set_new(vars, names[k], json_string(s));
    }
    return vars;
nomem:
    json_decref(msgs);
    snprintf(err, cap, "worker out of memory");
    return NULL;
}

static int render_jinja(const struct tok *t, const struct shm_chat_msg *m, uint32_t n,
                        int32_t **ids, size_t *n_ids, char *err, size_t cap)
{
    json_t *vars = jinja_vars(t, m, n, err, cap);
    if (!vars)
        return strstr(err, "out of memory") ? -ENOMEM : ERR_FORMAT;
    char *text = NULL, jerr[300];
    size_t len;
    int rc = jinja_render(g_model.tpl, vars, NULL, &text, &len, jerr, sizeof jerr);
    json_decref(vars);
    if (rc < 0) {
        /* the template's own refusal (raise_exception) is the client's to fix */
        snprintf(err, cap, "chat: the model's chat template: %s", jerr);
        return rc;
    }
    /* the template spells the special tokens; HF tokenizes its text with add_special_tokens
     * off, so no BOS beyond the one the template writes */
    log_clear_error();
    rc = tok_encode_ex(t, text, len, TOK_ENC_SPECIAL, ids, n_ids);
    if (rc < 0)
        snprintf(err, cap, "%s", log_last_error());
    free(text);
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
        else if (tpl == CHAT_TPL_JINJA && g_model.tpl)
            rc = render_jinja(t, m, count, ids, n, err, cap);
        else
            rc = ERR_UNSUPPORTED, snprintf(err, cap, "chat: the model has no chat template");
    }
    free(m);
    return rc;
}
