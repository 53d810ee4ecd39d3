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

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char *const role_names[] = {"system", "developer", "user", "assistant", "tool"};

/* The model's chat_template: set by chat_model_load before the render threads start, read-only
 * after (jinja_render does not modify a template), so the threads share it without a lock. */
static struct {
    struct jinja_tpl *tpl;
    char refused[320]; /* non-empty: the template the model carries cannot be rendered */
    enum chat_calls calls; /* the tool-call format its template teaches (chat_calls_format) */
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
        g_model.calls = chat_calls_format(json_string_value(ct));
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
    g_model.calls = CHAT_CALLS_NONE;
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
                          const char *tools, uint32_t flags, int32_t **ids, size_t *n_ids,
                          char *err, size_t cap)
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
            if (s[2]) {
                /* a past tool call as gpt-oss's template writes it: commentary, json */
                if (!s[1])
                    hm[i].channel = "commentary";
                hm[i].content_type = "json";
            }
        }
    }
    struct harmony_opts o = {.effort = (flags & SHM_GEN_EFFORT_LOW)    ? HARMONY_EFFORT_LOW
                                       : (flags & SHM_GEN_EFFORT_HIGH) ? HARMONY_EFFORT_HIGH
                                                                       : HARMONY_EFFORT_MEDIUM,
                             .tools_json = tools};
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

/* A tool's name as templates know it: the recipient without harmony's "functions." */
static void bare_name(const char **name, uint32_t *len)
{
    if (*len > 10 && !memcmp(*name, "functions.", 10))
        *name += 10, *len -= 10;
}

/* The render variables apply_chat_template passes (docs/CHAT.md): messages, tools (the parsed
 * OpenAI array, or none), add_generation_prompt, the special tokens' text. An assistant
 * message addressed to a recipient is a tool call (its content the arguments, JSON when it
 * parses) and joins the assistant message before it, as OpenAI's one message with content and
 * tool_calls arrives split; a tool message answers the call its tool_call_id names (none: the
 * latest call). Calls without an id get "call" and 5 digits (9 alphanumerics: what Mistral's
 * templates insist on). */
static json_t *jinja_vars(const char *bos, const char *eos, const struct shm_chat_msg *m,
                          uint32_t n, const char *tools, uint32_t tools_len, char *err,
                          size_t cap)
{
    json_t *msgs = json_array(), *vars = NULL, *jtools = json_null();
    char call_id[SHM_MAX_CHAT_NAME + 1] = "";
    if (tools_len) {
        json_error_t je;
        json_decref(jtools);
        jtools = json_loadb(tools, tools_len, 0, &je);
        if (!jtools || !json_is_array(jtools)) {
            snprintf(err, cap, "chat: tools: %s", jtools ? "not an array" : je.text);
            json_decref(jtools);
            json_decref(msgs);
            return NULL;
        }
    }
    json_t *prev = NULL; /* the assistant message a call joins */
    for (uint32_t i = 0; msgs && i < n; i++) {
        if (m[i].channel_len && !(m[i].channel_len == 5 && !memcmp(m[i].channel, "final", 5)) &&
            !(m[i].recipient_len && m[i].channel_len == 10 &&
              !memcmp(m[i].channel, "commentary", 10))) {
            snprintf(err, cap, "chat: message %u: channel '%.*s' is harmony's (gpt-oss); this "
                     "model's template has no channels", i, (int)m[i].channel_len, m[i].channel);
            goto fail;
        }
        json_t *content = json_stringn(m[i].content, m[i].content_len);
        if (!content) {
            snprintf(err, cap, "chat: message %u: the content is not valid UTF-8", i);
            goto fail;
        }
        if (m[i].role == SHM_CHAT_ASSISTANT && m[i].recipient_len) {
            if (m[i].tool_call_id_len)
                snprintf(call_id, sizeof call_id, "%.*s", (int)m[i].tool_call_id_len,
                         m[i].tool_call_id);
            else
                snprintf(call_id, sizeof call_id, "call%05u", i);
            const char *name = m[i].recipient;
            uint32_t nl = m[i].recipient_len;
            bare_name(&name, &nl);
            json_t *args = json_loadb(m[i].content, m[i].content_len, 0, NULL);
            json_t *call = json_pack("{s:s, s:s, s:{s:s%, s:o}}", "id", call_id, "type",
                                     "function", "function", "name", name, (size_t)nl,
                                     "arguments", args ? args : json_incref(content));
            json_decref(content);
            if (!call)
                goto nomem;
            json_t *calls = prev ? json_object_get(prev, "tool_calls") : NULL;
            if (prev && !calls) {
                /* the text the calls come with */
                calls = json_array();
                if (!calls || json_object_set_new(prev, "tool_calls", calls)) {
                    json_decref(call);
                    goto nomem;
                }
                if (!json_string_length(json_object_get(prev, "content")))
                    json_object_set_new(prev, "content", json_null());
            }
            if (calls) {
                if (json_array_append_new(calls, call))
                    goto nomem;
                continue;
            }
            json_t *o = json_pack("{s:s, s:n, s:[o]}", "role", "assistant", "content",
                                  "tool_calls", call);
            if (!o || json_array_append_new(msgs, o))
                goto nomem;
            prev = o;
            continue;
        }
        json_t *o = json_object();
        if (!o || json_array_append_new(msgs, o)) {
            json_decref(content);
            goto nomem;
        }
        json_object_set_new(o, "role", json_string(role_names[m[i].role]));
        json_object_set_new(o, "content", content);
        prev = m[i].role == SHM_CHAT_ASSISTANT ? o : NULL;
        if (m[i].role == SHM_CHAT_TOOL) {
            const char *name = m[i].recipient;
            uint32_t nl = m[i].recipient_len;
            bare_name(&name, &nl);
            json_object_set_new(o, "name", json_stringn(name, nl));
            if (m[i].tool_call_id_len)
                json_object_set_new(o, "tool_call_id",
                                    json_stringn(m[i].tool_call_id, m[i].tool_call_id_len));
            else if (call_id[0])
                json_object_set_new(o, "tool_call_id", json_string(call_id));
        }
    }
    if (!msgs)
        goto nomem;
    vars = json_pack("{s:o, s:o, s:n, s:b}", "messages", msgs, "tools", jtools, "documents",
                     "add_generation_prompt", 1);
    if (!vars)
        goto nomem_vars;
    if (bos)
        json_object_set_new(vars, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(vars, "eos_token", json_string(eos));
    return vars;
nomem:
    snprintf(err, cap, "worker out of memory");
fail:
    json_decref(msgs);
    json_decref(jtools);
    return NULL;
nomem_vars: /* json_pack's "o" took both references, even on failure */
    snprintf(err, cap, "worker out of memory");
    return NULL;
}

/* A special token's text, or NULL. */
static const char *special_text(const struct tok *t, int32_t id)
{
    return t && id >= 0 ? tok_token_str(t, id) : NULL;
}

int chat_render_jinja_text(const char *enc, uint32_t len, const char *bos, const char *eos,
                           char **text, size_t *n, char *err, size_t cap)
{
    *text = NULL, *n = 0;
    uint32_t count = 0;
    const char *tools = NULL;
    uint32_t tools_len = 0;
    if (!g_model.tpl) {
        snprintf(err, cap, "chat: the model has no chat template");
        return ERR_UNSUPPORTED;
    }
    if (shm_chat_decode(enc, len, NULL, 0, &count, NULL, NULL) < 0) {
        snprintf(err, cap, "chat: the messages' encoding is malformed");
        return ERR_FORMAT;
    }
    struct shm_chat_msg *m = calloc(count, sizeof *m);
    if (!m) {
        snprintf(err, cap, "worker out of memory");
        return -ENOMEM;
    }
    int rc = shm_chat_decode(enc, len, m, count, &count, &tools, &tools_len);
    json_t *vars = rc ? NULL : jinja_vars(bos, eos, m, count, tools, tools_len, err, cap);
    free(m);
    if (rc)
        return snprintf(err, cap, "chat: the messages' encoding is malformed"), rc;
    if (!vars)
        return strstr(err, "out of memory") ? -ENOMEM : ERR_FORMAT;
    char jerr[300];
    rc = jinja_render(g_model.tpl, vars, NULL, text, n, jerr, sizeof jerr);
    json_decref(vars);
    if (rc < 0) /* the template's own refusal (raise_exception) is the client's to fix */
        snprintf(err, cap, "chat: the model's chat template: %s", jerr);
    return rc;
}

/* ---- tool_choice: the opening of a call, written for the model (shm_abi.h) ---- */

/* The text that opens a call in the format of tpl/calls, for the encoding's tool_choice:
 * "" when it forces nothing (auto); with FUNCTION the named tool's call up to its arguments,
 * with REQUIRED up to the name, which the model then writes. *name (FUNCTION) is the tool's
 * name. 0, or ERR_UNSUPPORTED / ERR_FORMAT with err[cap] naming tool_choice. */
static int forced_opening(enum chat_template tpl, enum chat_calls calls, const char *enc,
                          uint32_t len, char *out, size_t ocap, char *name, size_t ncap,
                          char *err, size_t cap)
{
    out[0] = name[0] = '\0';
    const char *tools = NULL;
    uint32_t tools_len = 0, count;
    if (shm_chat_decode(enc, len, NULL, 0, &count, &tools, &tools_len) < 0)
        return snprintf(err, cap, "chat: the messages' encoding is malformed"), ERR_FORMAT;
    uint32_t choice = shm_chat_tool_choice(enc);
    uint32_t mode = SHM_TOOL_CHOICE_MODE(choice);
    if (mode == SHM_TOOL_CHOICE_AUTO)
        return 0;
    if (mode == SHM_TOOL_CHOICE_FUNCTION) {
        json_t *a = json_loadb(tools, tools_len, 0, NULL);
        json_t *fn = json_object_get(json_array_get(a, SHM_TOOL_CHOICE_INDEX(choice)), "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        int w = nm ? snprintf(name, ncap, "%s", nm) : -1;
        json_decref(a);
        if (w <= 0 || (size_t)w >= ncap)
            return snprintf(err, cap, "chat: tool_choice: function %u is not a named tool of "
                            "the request", SHM_TOOL_CHOICE_INDEX(choice)), ERR_FORMAT;
    }
    bool fn = mode == SHM_TOOL_CHOICE_FUNCTION;
    const char *head = NULL, *tail = NULL;
    if (tpl == CHAT_TPL_HARMONY)
        head = "<|channel|>commentary to=functions.", tail = " <|constrain|>json<|message|>";
    else if (tpl == CHAT_TPL_JINJA && calls == CHAT_CALLS_HERMES)
        head = "<tool_call>\n{\"name\": \"", tail = "\", \"arguments\": ";
    else if (tpl == CHAT_TPL_JINJA && calls == CHAT_CALLS_MISTRAL)
        head = "[TOOL_CALLS][{\"name\": \"", tail = "\", \"arguments\": ";
    else if (tpl == CHAT_TPL_JINJA && calls == CHAT_CALLS_LLAMA)
        head = "{\"name\": \"", tail = "\", \"parameters\": ";
    else
        return snprintf(err, cap, "chat: tool_choice: this model's chat template has no "
                        "tool-call format to open a call in (docs/CHAT.md \"Tool calls\")"),
               ERR_UNSUPPORTED;
    snprintf(out, ocap, "%s%s%s", head, fn ? name : "", fn ? tail : "");
    return 0;
}

static int render_jinja(const struct tok *t, const char *enc, uint32_t elen, int32_t **ids,
                        size_t *n_ids, char *err, size_t cap)
{
    char *text = NULL;
    size_t len;
    char force[SHM_MAX_CHAT_NAME + 96], name[SHM_MAX_CHAT_NAME + 1];
    int rc = forced_opening(CHAT_TPL_JINJA, g_model.calls, enc, elen, force, sizeof force, name,
                            sizeof name, err, cap);
    if (rc < 0)
        return rc;
    rc = chat_render_jinja_text(enc, elen, special_text(t, tok_bos(t)),
                                special_text(t, tok_eos(t)), &text, &len, err, cap);
    if (rc < 0)
        return rc;
    size_t fl = strlen(force);
    if (fl) { /* the call's opening, as if the model had begun its reply with it */
        char *more = realloc(text, len + fl + 1);
        if (!more) {
            free(text);
            return snprintf(err, cap, "worker out of memory"), -ENOMEM;
        }
        text = more;
        memcpy(text + len, force, fl + 1);
        len += fl;
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

/* Harmony: the ids of the call's opening (forced_opening) after the rendered prompt. */
static int append_forced_harmony(const struct tok *t, const char *enc, uint32_t len,
                                 int32_t **ids, size_t *n, char *err, size_t cap)
{
    char force[SHM_MAX_CHAT_NAME + 96], name[SHM_MAX_CHAT_NAME + 1];
    int rc = forced_opening(CHAT_TPL_HARMONY, CHAT_CALLS_NONE, enc, len, force, sizeof force,
                            name, sizeof name, err, cap);
    if (rc < 0 || !force[0])
        return rc;
    int32_t *more = NULL;
    size_t k = 0;
    log_clear_error();
    if ((rc = tok_encode_ex(t, force, strlen(force), TOK_ENC_SPECIAL, &more, &k)) < 0)
        return snprintf(err, cap, "%s", log_last_error()), rc;
    int32_t *all = realloc(*ids, (*n + k) * sizeof *all);
    if (!all) {
        free(more);
        return snprintf(err, cap, "worker out of memory"), -ENOMEM;
    }
    memcpy(all + *n, more, k * sizeof *all);
    *ids = all, *n += k;
    free(more);
    return 0;
}

int chat_render(const struct tok *t, enum chat_template tpl, const char *enc, uint32_t len,
                uint32_t flags, int32_t **ids, size_t *n, char *err, size_t cap)
{
    *ids = NULL, *n = 0;
    uint32_t count = 0;
    /* the record was validated on arrival; decoding again costs little and keeps this
     * function safe on its own */
    if (shm_chat_decode(enc, len, NULL, 0, &count, NULL, NULL) < 0) {
        snprintf(err, cap, "chat: the messages' encoding is malformed");
        return ERR_FORMAT;
    }
    struct shm_chat_msg *m = calloc(count, sizeof *m);
    if (!m) {
        snprintf(err, cap, "worker out of memory");
        return -ENOMEM;
    }
    const char *tools = NULL;
    uint32_t tools_len = 0;
    char *tools_z = NULL; /* harmony takes NUL-terminated text */
    int rc = shm_chat_decode(enc, len, m, count, &count, &tools, &tools_len);
    if (rc == 0 && tools_len && !(tools_z = strndup(tools, tools_len)))
        rc = -ENOMEM, snprintf(err, cap, "worker out of memory");
    if (rc == 0) {
        if (tpl == CHAT_TPL_HARMONY) {
            rc = render_harmony(t, m, count, tools_z, flags, ids, n, err, cap);
            if (rc == 0)
                rc = append_forced_harmony(t, enc, len, ids, n, err, cap);
        }
        else if (tpl == CHAT_TPL_PLAIN && tools_len)
            rc = ERR_UNSUPPORTED, snprintf(err, cap, "chat: tools: this model has no chat "
                                           "template that defines tools (the plain template "
                                           "has none)");
        else if (tpl == CHAT_TPL_PLAIN)
            rc = render_plain(t, m, count, ids, n, err, cap);
        else if (tpl == CHAT_TPL_JINJA && g_model.tpl)
            rc = render_jinja(t, enc, len, ids, n, err, cap);
        else
            rc = ERR_UNSUPPORTED, snprintf(err, cap, "chat: the model has no chat template");
    }
    free(tools_z);
    free(m);
    return rc;
}

/* ---- a chat's generated text: channels and tool calls ---- */

enum chat_calls chat_calls_format(const char *src)
{
    if (!src)
        return CHAT_CALLS_NONE;
    if (strstr(src, "<tool_call>"))
        return CHAT_CALLS_HERMES;
    if (strstr(src, "[TOOL_CALLS]"))
        return CHAT_CALLS_MISTRAL;
    if (strstr(src, "\"parameters\": ") && (strstr(src, "<|python_tag|>") || strstr(src, "ipython")))
        return CHAT_CALLS_LLAMA;
    return CHAT_CALLS_NONE;
}

/* A piece being built: offsets into the output buffer (it may move while more are added). */
struct pend {
    enum shm_channel channel;
    size_t off, len;
    size_t name_off, id_off; /* SIZE_MAX: no call header */
};

struct chat_out {
    const struct tok *t;
    struct harmony_parser *hp;  /* harmony */
    enum chat_calls calls;      /* Jinja with tools: the format searched; NONE: plain text */
    enum { J_START, J_PASS, J_TEXT, J_IN_CALL, J_WHOLE } mode;
    char *hold;                 /* Jinja: text not yet sent (a marker's start, a call) */
    size_t hlen, hcap;
    char *buf;                  /* this push's texts, names and ids */
    size_t blen, bcap;
    struct pend *pend;
    struct chat_piece *pieces;
    size_t n, cap;
    bool called, oom;
    char forced[SHM_MAX_CHAT_NAME + 1]; /* tool_choice FUNCTION: the tool the reply calls */
    bool open_pending;                  /* harmony: the forced opening reached <|message|>:
                                         * the next piece carries the call header */
    size_t forced_skip;                 /* Jinja: held bytes of the opening before the args */
    bool one_call;                      /* SHM_TOOL_CHOICE_ONE_CALL: at most one call */
    bool ended;                         /* one_call: that call closed; the reply is over */
};

static void reserve(struct chat_out *o, char **b, size_t *cap, size_t need)
{
    if (need <= *cap || o->oom)
        return;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    char *p = realloc(*b, c);
    if (!p) {
        o->oom = true; /* text is then dropped: the reply stays bounded, never wrong bytes */
        return;
    }
    *b = p, *cap = c;
}

static size_t put_buf(struct chat_out *o, const char *s, size_t n)
{
    reserve(o, &o->buf, &o->bcap, o->blen + n + 1);
    if (o->oom)
        return 0;
    size_t off = o->blen;
    memcpy(o->buf + off, s, n);
    o->buf[off + n] = '\0';
    o->blen += n + 1;
    return off;
}

static struct pend *new_pend(struct chat_out *o)
{
    if (o->n == o->cap) {
        size_t c = o->cap ? 2 * o->cap : 8;
        struct pend *p = realloc(o->pend, c * sizeof *p);
        struct chat_piece *q = p ? realloc(o->pieces, c * sizeof *q) : NULL;
        if (p)
            o->pend = p;
        if (!p || !q) {
            o->oom = true;
            return NULL;
        }
        o->pieces = q, o->cap = c;
    }
    struct pend *e = &o->pend[o->n++];
    *e = (struct pend){.name_off = SIZE_MAX, .id_off = SIZE_MAX};
    return e;
}

/* text[n] as pieces of at most SHM_MAX_PIECE bytes, cut between UTF-8 characters; the first
 * opens a call when name is not NULL. */
static void emit(struct chat_out *o, enum shm_channel ch, const char *text, size_t n,
                 const char *name, const char *id)
{
    do {
        size_t k = n;
        if (k > SHM_MAX_PIECE) {
            k = SHM_MAX_PIECE;
            while (k > SHM_MAX_PIECE - 3 && ((unsigned char)text[k] & 0xc0) == 0x80)
                k--;
        }
        struct pend *e = new_pend(o);
        if (!e)
            return;
        e->channel = ch;
        e->off = put_buf(o, text, k);
        e->len = o->oom ? 0 : k;
        if (name) {
            e->name_off = put_buf(o, name, strlen(name));
            e->id_off = put_buf(o, id, strlen(id));
            name = NULL;
        }
        text += k, n -= k;
    } while (n);
}

static void make_call_id(char id[32])
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        /* no entropy yet: ids only need to be unique within a reply */
        static _Atomic uint64_t ctr;
        uint64_t x = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ ++ctr;
        for (size_t i = 0; i < sizeof r; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            r[i] = (unsigned char)x;
        }
    }
    memcpy(id, "call_", 5);
    for (size_t i = 0; i < sizeof r; i++)
        id[5 + i] = abc[r[i] % (sizeof abc - 1)];
    id[5 + sizeof r] = '\0';
}

/* A name a call header may carry (shm's rule for recipients). */
static bool call_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > SHM_MAX_CHAT_NAME)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || strchr("._:-", s[i])))
            return false;
    return true;
}

/* One {"name": ..., "arguments"|"parameters": ...} object sent as a call; false when it is
 * not one (the caller sends the text instead). */
static bool emit_call_obj(struct chat_out *o, json_t *obj)
{
    if (o->one_call && o->called)
        return true; /* parallel_tool_calls false: a list's further calls are dropped */
    const char *name = json_string_value(json_object_get(obj, "name"));
    json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    if (!json_is_object(obj) || !name || !args || !(json_is_object(args) || json_is_string(args)))
        return false;
    char full[SHM_MAX_CHAT_NAME + 16];
    int fl = snprintf(full, sizeof full, "functions.%s", name);
    if (fl < 0 || !call_name_ok(full, (size_t)fl))
        return false;
    char *text = json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, 0);
    if (!text) {
        o->oom = true;
        return true;
    }
    char id[32];
    make_call_id(id);
    emit(o, SHM_CH_COMMENTARY, text, strlen(text), full, id);
    free(text);
    o->called = true;
    return true;
}

/* Parses s[n] as one call object (or, when list, an array of them) and sends them; false
 * (nothing sent) when it is not that. */
static bool emit_calls(struct chat_out *o, const char *s, size_t n, bool list)
{
    json_t *j = json_loadb(s, n, 0, NULL);
    bool ok = j && (list ? json_is_array(j) && json_array_size(j) > 0 : json_is_object(j));
    for (size_t i = 0; ok && list && i < json_array_size(j); i++) {
        json_t *e = json_array_get(j, i);
        ok = json_is_object(e) && json_is_string(json_object_get(e, "name")) &&
             (json_object_get(e, "arguments") || json_object_get(e, "parameters"));
    }
    if (ok && !list)
        ok = emit_call_obj(o, j);
    for (size_t i = 0; ok && list && i < json_array_size(j); i++)
        ok = emit_call_obj(o, json_array_get(j, i)); /* checked above: only a bad name fails */
    json_decref(j);
    return ok;
}

/* tool_choice FUNCTION: the reply ended before its call parsed whole (max_tokens, a stop):
 * the call is still the named tool's, its arguments what the model wrote after the opening
 * (held[0, n) begins with what is left of the opening). false when nothing was forced. */
static bool emit_forced(struct chat_out *o, const char *held, size_t n)
{
    if (!o->forced[0] || o->called || n < o->forced_skip)
        return false;
    char full[SHM_MAX_CHAT_NAME + 16], id[32];
    int fl = snprintf(full, sizeof full, "functions.%s", o->forced);
    if (fl < 0 || !call_name_ok(full, (size_t)fl))
        return false;
    make_call_id(id);
    emit(o, SHM_CH_COMMENTARY, held + o->forced_skip, n - o->forced_skip, full, id);
    o->called = true;
    return true;
}

static void hold_drop(struct chat_out *o, size_t k)
{
    memmove(o->hold, o->hold + k, o->hlen - k);
    o->hlen -= k;
}

static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]";

/* The longest end of s[n] that begins tag: held back, the rest of the tag may follow. */
static size_t tag_prefix_at_end(const char *s, size_t n, const char *tag)
{
    size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

static const char *mem_find(const char *h, size_t n, const char *needle)
{
    size_t l = strlen(needle);
    for (size_t i = 0; i + l <= n; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, l))
            return h + i;
    return NULL;
}

/* Jinja with tools: what the held text lets go now (at_end: the reply is over). */
static void jinja_step(struct chat_out *o, bool at_end)
{
    for (;;) {
        if (o->mode == J_START) {
            size_t k = 0;
            while (k < o->hlen && isspace((unsigned char)o->hold[k]))
                k++;
            const char *mark = o->calls == CHAT_CALLS_MISTRAL ? MISTRAL_MARK
                               : o->calls == CHAT_CALLS_LLAMA ? "{" : NULL;
            if (!mark) {
                o->mode = J_TEXT;
                continue;
            }
            size_t rest = o->hlen - k, ml = strlen(mark);
            if (rest >= ml || at_end) {
                o->mode = rest >= ml && !memcmp(o->hold + k, mark, ml) ? J_WHOLE : J_PASS;
                continue;
            }
            if (memcmp(o->hold + k, mark, rest) != 0) {
                o->mode = J_PASS;
                continue;
            }
            return; /* all blank so far, or the marker's start */
        }
        if (o->mode == J_PASS || (o->mode == J_TEXT && o->calls != CHAT_CALLS_HERMES)) {
            emit(o, SHM_CH_FINAL, o->hold, o->hlen, NULL, NULL);
            o->hlen = 0;
            return;
        }
        if (o->mode == J_WHOLE) {
            if (!at_end)
                return;
            size_t k = 0;
            while (k < o->hlen && isspace((unsigned char)o->hold[k]))
                k++;
            bool mistral = o->calls == CHAT_CALLS_MISTRAL;
            size_t skip = k + (mistral ? strlen(MISTRAL_MARK) : 0);
            if (!emit_calls(o, o->hold + skip, o->hlen - skip, mistral) &&
                !emit_forced(o, o->hold, o->hlen))
                emit(o, SHM_CH_FINAL, o->hold, o->hlen, NULL, NULL);
            o->hlen = 0;
            return;
        }
        if (o->mode == J_TEXT) { /* Hermes: text, until a <tool_call> */
            const char *at = mem_find(o->hold, o->hlen, CALL_OPEN);
            if (!at) {
                size_t keep = at_end ? 0 : tag_prefix_at_end(o->hold, o->hlen, CALL_OPEN);
                emit(o, SHM_CH_FINAL, o->hold, o->hlen - keep, NULL, NULL);
                hold_drop(o, o->hlen - keep);
                return;
            }
            size_t k = (size_t)(at - o->hold);
            if (k)
                emit(o, SHM_CH_FINAL, o->hold, k, NULL, NULL);
            hold_drop(o, k + strlen(CALL_OPEN));
            o->mode = J_IN_CALL;
            continue;
        }
        /* J_IN_CALL: the call's JSON, until </tool_call> (or the end: models stop there) */
        const char *at = mem_find(o->hold, o->hlen, CALL_CLOSE);
        if (!at && !at_end)
            return;
        size_t k = at ? (size_t)(at - o->hold) : o->hlen;
        if (!emit_calls(o, o->hold, k, false) && !emit_forced(o, o->hold, k)) {
            emit(o, SHM_CH_FINAL, CALL_OPEN, strlen(CALL_OPEN), NULL, NULL);
            emit(o, SHM_CH_FINAL, o->hold, at ? k + strlen(CALL_CLOSE) : k, NULL, NULL);
        } else if (o->one_call) { /* the one call closed: nothing after it is sent */
            o->ended = true;
            o->hlen = 0;
            return;
        }
        hold_drop(o, at ? k + strlen(CALL_CLOSE) : k);
        o->mode = J_TEXT;
        if (!o->hlen)
            return;
    }
}

static void finish_pieces(struct chat_out *o, const struct chat_piece **pieces, size_t *n)
{
    for (size_t i = 0; i < o->n; i++) {
        const struct pend *e = &o->pend[i];
        o->pieces[i] = (struct chat_piece){
            .channel = e->channel, .text = o->buf ? o->buf + e->off : "", .len = e->len,
            .call_name = e->name_off != SIZE_MAX && o->buf ? o->buf + e->name_off : NULL,
            .call_id = e->id_off != SIZE_MAX && o->buf ? o->buf + e->id_off : NULL};
        if (!o->pieces[i].call_id)
            o->pieces[i].call_name = NULL;
    }
    *pieces = o->pieces;
    *n = o->n;
}

/* tool_choice: the call's opening the render wrote after the prompt goes through the parser
 * first, as if the model had written it (nothing comes out yet: a header, or held text), so
 * the model's first ids continue the call. A render that failed on it never gets here. */
static void seed_forced(struct chat_out *o, enum chat_template tpl, const char *enc,
                        uint32_t len)
{
    char force[SHM_MAX_CHAT_NAME + 96], err[160];
    if (forced_opening(tpl, o->calls, enc, len, force, sizeof force, o->forced,
                       sizeof o->forced, err, sizeof err) < 0 || !force[0])
        return;
    if (o->hp) {
        int32_t *ids = NULL;
        size_t k = 0;
        if (tok_encode_ex(o->t, force, strlen(force), TOK_ENC_SPECIAL, &ids, &k) == 0)
            for (size_t i = 0; i < k; i++) {
                struct harmony_event he;
                if (harmony_parser_push(o->hp, ids[i], &he) == 0)
                    o->open_pending = he.kind == HARMONY_EV_MESSAGE;
            }
        free(ids);
        return;
    }
    size_t fl = strlen(force);
    reserve(o, &o->hold, &o->hcap, fl);
    if (o->oom)
        return;
    memcpy(o->hold, force, fl);
    o->hlen = fl;
    jinja_step(o, false);
    o->forced_skip = o->hlen; /* what is left of the opening in the held text */
    o->n = o->blen = 0;
}

int chat_out_new(const struct tok *t, enum chat_template tpl, const char *enc, uint32_t len,
                 struct chat_out **out)
{
    *out = NULL;
    struct chat_out *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    o->t = t;
    if (tpl == CHAT_TPL_HARMONY) {
        if (!(o->hp = malloc(sizeof *o->hp)) || harmony_parser_init(o->hp, t) < 0) {
            free(o->hp);
            free(o);
            return -ENOMEM;
        }
    } else if (tpl == CHAT_TPL_JINJA) {
        const char *tools = NULL;
        uint32_t tools_len = 0, count;
        if (shm_chat_decode(enc, len, NULL, 0, &count, &tools, &tools_len) == 0 && tools_len)
            o->calls = g_model.calls;
    }
    uint32_t n_msgs;
    if (shm_chat_decode(enc, len, NULL, 0, &n_msgs, NULL, NULL) == 0)
        o->one_call = (shm_chat_tool_choice(enc) & SHM_TOOL_CHOICE_ONE_CALL) != 0;
    seed_forced(o, tpl, enc, len);
    *out = o;
    return 0;
}

void chat_out_free(struct chat_out *o)
{
    if (!o)
        return;
    if (o->hp) {
        harmony_parser_fini(o->hp);
        free(o->hp);
    }
    free(o->hold);
    free(o->buf);
    free(o->pend);
    free(o->pieces);
    free(o);
}

bool chat_out_called(const struct chat_out *o) { return o->called; }

static const enum shm_channel harmony_chans[] = {
    [HARMONY_CH_NONE] = SHM_CH_NONE, [HARMONY_CH_ANALYSIS] = SHM_CH_ANALYSIS,
    [HARMONY_CH_COMMENTARY] = SHM_CH_COMMENTARY, [HARMONY_CH_FINAL] = SHM_CH_FINAL,
    [HARMONY_CH_OTHER] = SHM_CH_OTHER};

/* Harmony: one piece per id; a message addressed to a recipient opens a call. */
static void harmony_push(struct chat_out *o, int32_t id, const char *text, size_t len,
                         bool *stop, bool *call)
{
    if (id < 0)
        return; /* the engine's held-back text: the parser holds its own */
    struct harmony_event he = {0};
    if (harmony_parser_push(o->hp, id, &he) < 0) {
        emit(o, SHM_CH_OTHER, text, len < SHM_MAX_PIECE ? len : SHM_MAX_PIECE, NULL, NULL);
        return;
    }
    enum shm_channel ch = harmony_chans[he.channel];
    const char *rcpt = harmony_parser_recipient(o->hp);
    /* a call opens at its <|message|>, or with the first id after a forced opening */
    bool opens = he.kind == HARMONY_EV_MESSAGE || o->open_pending;
    o->open_pending = false;
    if (opens && rcpt[0] && call_name_ok(rcpt, strlen(rcpt))) {
        char cid[32];
        make_call_id(cid);
        emit(o, ch ? ch : SHM_CH_COMMENTARY, he.text ? he.text : "", he.len, rcpt, cid);
        o->called = true;
    } else {
        /* a header's flushed tail is bounded by the parser: one piece */
        emit(o, ch, he.len ? he.text : "", he.len < SHM_MAX_PIECE ? he.len : SHM_MAX_PIECE, NULL,
             NULL);
    }
    if (he.kind == HARMONY_EV_RETURN)
        *stop = true;
    else if (he.kind == HARMONY_EV_CALL)
        *stop = true, *call = true;
}

/* A special token the detokenizer leaves out but a call format spells: its text. */
static const char *marker_of(const struct chat_out *o, int32_t id)
{
    const char *s = id >= 0 ? tok_token_str(o->t, id) : NULL;
    if (!s)
        return NULL;
    if ((o->calls == CHAT_CALLS_HERMES && (!strcmp(s, CALL_OPEN) || !strcmp(s, CALL_CLOSE))) ||
        (o->calls == CHAT_CALLS_MISTRAL && !strcmp(s, MISTRAL_MARK)))
        return s;
    return NULL;
}

void chat_out_push(struct chat_out *o, int32_t id, const char *text, size_t len,
                   const struct chat_piece **pieces, size_t *n, bool *stop, bool *call)
{
    o->n = o->blen = 0;
    *stop = *call = false;
    if (o->hp) {
        harmony_push(o, id, text, len, stop, call);
    } else if (!o->calls) {
        if (len)
            emit(o, SHM_CH_FINAL, text, len, NULL, NULL);
    } else {
        const char *mk = len ? NULL : marker_of(o, id);
        if (mk)
            text = mk, len = strlen(mk);
        reserve(o, &o->hold, &o->hcap, o->hlen + len);
        if (!o->oom && len) {
            memcpy(o->hold + o->hlen, text, len);
            o->hlen += len;
        }
        jinja_step(o, false);
        if (o->ended) /* parallel_tool_calls false: the reply ends with its one call */
            *stop = *call = true;
    }
    if (id >= 0 && o->n == 0)
        new_pend(o); /* the id travels with an empty piece */
    if (id >= 0 && o->n && o->pend[0].channel == SHM_CH_NONE)
        o->pend[0].channel = o->hp ? SHM_CH_NONE : SHM_CH_FINAL;
    finish_pieces(o, pieces, n);
}

void chat_out_flush(struct chat_out *o, const struct chat_piece **pieces, size_t *n)
{
    o->n = o->blen = 0;
    if (!o->hp && o->calls && !o->ended && (o->hlen || o->mode == J_IN_CALL))
        jinja_step(o, true);
    finish_pieces(o, pieces, n);
}
