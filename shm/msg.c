/*
 * msg.c — record encoders and validating decoders (msg.h, wire layouts in shm_abi.h).
 *
 * One validation routine (validate()) holds every semantic rule and serves both directions: the
 * encoder runs it on what it is asked to send, the decoder runs it on the view it built after
 * the wire-level checks (exact length, reserved fields, NUL placement). Records are decoded from
 * a private copy (shm_ring_read copies), so a field is read once and cannot change after its
 * check.
 */
#include "msg.h"

#include "check.h"
#include "err.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
    uint32_t type;
    const char *name;
} types[] = {
    {SHM_MSG_GENERATE, "generate"},     {SHM_MSG_CANCEL, "cancel"},
    {SHM_MSG_TOKENIZE, "tokenize"},     {SHM_MSG_DETOKENIZE, "detokenize"},
    {SHM_MSG_ADAPTER_LOAD, "adapter-load"}, {SHM_MSG_ADAPTER_UNLOAD, "adapter-unload"},
    {SHM_MSG_STATS_QUERY, "stats-query"}, {SHM_MSG_TOKEN, "token"},
    {SHM_MSG_FINISH, "finish"},         {SHM_MSG_ERROR, "error"},
    {SHM_MSG_TOKENS, "tokens"},         {SHM_MSG_TEXT, "text"},
    {SHM_MSG_ADAPTER, "adapter"},       {SHM_MSG_DONE, "done"},
    {SHM_MSG_STATS, "stats"},           {SHM_MSG_HELLO, "hello"},
};

const char *shm_msg_type_name(uint32_t type)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].type == type)
            return types[i].name;
    return NULL;
}

int shm_msg_type_ring(uint32_t type)
{
    if (!shm_msg_type_name(type))
        return -1;
    return type < 64 ? SHM_RING_REQUESTS : SHM_RING_EVENTS;
}

/* The one message of a refusal: "<what>: <type> record (request N): <reason>". */
static int refuse(const char *what, uint32_t type, uint64_t id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(const char *what, uint32_t type, uint64_t id, const char *fmt, ...)
{
    char reason[256], req[40] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    const char *name = shm_msg_type_name(type);
    if (id)
        snprintf(req, sizeof req, " (request %" PRIu64 ")", id);
    if (name)
        LOG_ERR("%s: %s record%s: %s", what ? what : "shm", name, req, reason);
    else
        LOG_ERR("%s: record of type %" PRIu32 "%s: %s", what ? what : "shm", type, req, reason);
    return ERR_FORMAT;
}

/* ---- semantic rules, shared by both directions ---- */

struct ctx {
    const char *what;
    uint32_t type;
    uint64_t id;
};
#define REFUSE(c, ...) refuse((c)->what, (c)->type, (c)->id, __VA_ARGS__)

static int check_id(const struct ctx *c, uint64_t id)
{
    return id ? 0 : REFUSE(c, "request_id is 0 (ids start at 1)");
}

static bool name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
}

/* An adapter name: 1..SHM_MAX_NAME bytes of [A-Za-z0-9._-]. */
static int check_name(const struct ctx *c, const char *field, const char *s)
{
    if (!s)
        return REFUSE(c, "%s is missing", field);
    size_t n = strnlen(s, SHM_MAX_NAME + 1);
    if (n == 0 || n > SHM_MAX_NAME)
        return REFUSE(c, "%s must be 1..%u bytes, got %s", field, SHM_MAX_NAME,
                      n ? "more" : "none");
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i]))
            return REFUSE(c, "%s holds byte 0x%02x at %zu (allowed: A-Z a-z 0-9 . _ -)", field,
                          (unsigned char)s[i], i);
    return 0;
}

/* A C string of 1..max bytes; printable ASCII only when `printable`. */
static int check_str(const struct ctx *c, const char *field, const char *s, uint32_t max,
                     bool printable)
{
    if (!s)
        return REFUSE(c, "%s is missing", field);
    size_t n = strnlen(s, (size_t)max + 1);
    if (n == 0 || n > max)
        return REFUSE(c, "%s must be 1..%" PRIu32 " bytes, got %s", field, max,
                      n ? "more" : "none");
    for (size_t i = 0; printable && i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return REFUSE(c, "%s holds byte 0x%02x at %zu (printable ASCII only)", field,
                          (unsigned char)s[i], i);
    return 0;
}

static int check_ids(const struct ctx *c, const char *field, const int32_t *ids, uint32_t n)
{
    CHECK(n == 0 || ids);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0)
            return REFUSE(c, "%s[%" PRIu32 "] is %" PRId32 " (token ids are >= 0)", field, i,
                          ids[i]);
    return 0;
}

/* ---- the chat encoding (GENERATE with SHM_GEN_CHAT) ---- */

static const char *const chat_roles[] = {"system", "developer", "user", "assistant", "tool"};

/* A channel, recipient or call id: 0..SHM_MAX_CHAT_NAME bytes of [A-Za-z0-9._:-]; field is
 * the whole field name ("messages[3].recipient", "call id"). */
static int chat_field(const struct ctx *c, const char *field, const char *s, uint32_t n,
                      char *msg, size_t cap)
{
    if (n > SHM_MAX_CHAT_NAME) {
        if (msg)
            snprintf(msg, cap, "%s: %" PRIu32 " bytes, at most %u", field, n, SHM_MAX_CHAT_NAME);
        return REFUSE(c, "%s: %" PRIu32 " bytes, at most %u", field, n, SHM_MAX_CHAT_NAME);
    }
    for (uint32_t k = 0; k < n; k++)
        if (!name_char(s[k]) && s[k] != ':') {
            if (msg)
                snprintf(msg, cap, "%s: byte 0x%02x at %" PRIu32
                         " (allowed: A-Z a-z 0-9 . _ : -)", field, (unsigned char)s[k], k);
            return REFUSE(c, "%s: byte 0x%02x at %" PRIu32, field, (unsigned char)s[k], k);
        }
    return 0;
}

static int chat_name(const struct ctx *c, uint32_t i, const char *field, const char *s,
                     uint32_t n, char *msg, size_t cap)
{
    char f[64];
    snprintf(f, sizeof f, "messages[%" PRIu32 "].%s", i, field);
    return chat_field(c, f, s, n, msg, cap);
}

/* One decoded message's rules (both directions). */
static int chat_msg_check(const struct ctx *c, uint32_t i, const struct shm_chat_msg *m,
                          char *msg, size_t cap)
{
#define CHAT_REFUSE(...)                                                                        \
    do {                                                                                        \
        if (msg)                                                                                \
            snprintf(msg, cap, __VA_ARGS__);                                                    \
        return REFUSE(c, __VA_ARGS__);                                                          \
    } while (0)
    if ((unsigned)m->role > SHM_CHAT_TOOL)
        CHAT_REFUSE("messages[%" PRIu32 "].role: %u is not a role", i, (unsigned)m->role);
    if (m->content_len && memchr(m->content, '\0', m->content_len))
        CHAT_REFUSE("messages[%" PRIu32 "].content: holds a NUL byte", i);
    if (m->channel_len && m->role != SHM_CHAT_ASSISTANT)
        CHAT_REFUSE("messages[%" PRIu32 "].channel: only assistant messages have one (this is "
                    "%s)", i, chat_roles[m->role]);
    if (m->recipient_len && m->role != SHM_CHAT_ASSISTANT && m->role != SHM_CHAT_TOOL)
        CHAT_REFUSE("messages[%" PRIu32 "].recipient: only assistant (a tool call) and tool (its "
                    "name) messages have one (this is %s)", i, chat_roles[m->role]);
    if (m->role == SHM_CHAT_TOOL && !m->recipient_len)
        CHAT_REFUSE("messages[%" PRIu32 "].recipient: a tool message names its tool", i);
    /* chat tools (ABI 3) */
    if (m->tool_call_id_len && m->role != SHM_CHAT_TOOL &&
        !(m->role == SHM_CHAT_ASSISTANT && m->recipient_len))
        CHAT_REFUSE("messages[%" PRIu32 "].tool_call_id: only a tool call (an assistant message "
                    "with a recipient) and a tool's answer have one (this is %s)", i,
                    chat_roles[m->role]);
#undef CHAT_REFUSE
    int rc;
    if ((rc = chat_name(c, i, "channel", m->channel, m->channel_len, msg, cap)) < 0 ||
        (rc = chat_name(c, i, "recipient", m->recipient, m->recipient_len, msg, cap)) < 0 ||
        (rc = chat_name(c, i, "tool_call_id", m->tool_call_id, m->tool_call_id_len, msg, cap)) <
            0)
        return rc;
    return 0;
}

/* The tools' JSON text: bounded, no NUL (the worker parses it; shm only bounds it). */
static int chat_tools_check(const struct ctx *c, const char *tools, uint32_t len, char *msg,
                            size_t cap)
{
    const char *why = len > SHM_MAX_CHAT_TOOLS ? "exceeds the limit"
                      : len && memchr(tools, '\0', len) ? "holds a NUL byte" : NULL;
    if (!why)
        return 0;
    if (msg)
        snprintf(msg, cap, "tools: %" PRIu32 " bytes %s (at most %u, no NUL)", len, why,
                 SHM_MAX_CHAT_TOOLS);
    return REFUSE(c, "chat: tools: %" PRIu32 " bytes %s (at most %u, no NUL)", len, why,
                  SHM_MAX_CHAT_TOOLS);
}

/* tool_choice (struct shm_wire_chat): a known mode, an index only with FUNCTION, a mode other
 * than AUTO or the ONE_CALL bit only with tools. */
static int chat_tool_choice_check(const struct ctx *c, uint32_t v, uint32_t tools_len,
                                  char *msg, size_t cap)
{
    uint32_t mode = SHM_TOOL_CHOICE_MODE(v);
    const char *why = NULL;
    if (mode > SHM_TOOL_CHOICE_FUNCTION)
        why = "is not a choice";
    else if (mode != SHM_TOOL_CHOICE_FUNCTION && SHM_TOOL_CHOICE_INDEX(v))
        why = "has an index without FUNCTION";
    else if (mode != SHM_TOOL_CHOICE_AUTO && !tools_len)
        why = "asks for a call without tools";
    else if ((v & SHM_TOOL_CHOICE_ONE_CALL) && !tools_len)
        why = "limits calls without tools";
    if (!why)
        return 0;
    if (msg)
        snprintf(msg, cap, "tool_choice: 0x%" PRIx32 " %s", v, why);
    return REFUSE(c, "chat: tool_choice 0x%" PRIx32 " %s", v, why);
}

/* Validates the encoding buf[len]; decodes into out[cap] when out. */
static int chat_check(const struct ctx *c, const void *buf, uint32_t len,
                      struct shm_chat_msg *out, uint32_t cap, uint32_t *n_out,
                      const char **tools, uint32_t *tools_len)
{
    const unsigned char *p = buf;
    struct shm_wire_chat h;
    if (len < sizeof h)
        return REFUSE(c, "chat: %" PRIu32 " bytes, shorter than its header", len);
    memcpy(&h, p, sizeof h);
    uint32_t off = sizeof h;
    if (h.tools_len > len - off)
        return REFUSE(c, "chat: tools announce %" PRIu32 " bytes, %" PRIu32 " remain",
                      h.tools_len, len - off);
    if (chat_tool_choice_check(c, h.tool_choice, h.tools_len, NULL, 0) < 0)
        return ERR_FORMAT;
    int rc = chat_tools_check(c, (const char *)p + off, h.tools_len, NULL, 0);
    if (rc < 0)
        return rc;
    if (tools)
        *tools = h.tools_len ? (const char *)p + off : NULL, *tools_len = h.tools_len;
    off += h.tools_len;
    uint32_t n = 0;
    while (off < len) {
        if (n == SHM_MAX_CHAT_MSGS)
            return REFUSE(c, "chat: more than %u messages", SHM_MAX_CHAT_MSGS);
        struct shm_wire_chat_msg w;
        if (len - off < sizeof w)
            return REFUSE(c, "chat: message %" PRIu32 " is cut in its fixed part", n);
        memcpy(&w, p + off, sizeof w);
        off += sizeof w;
        uint64_t need = (uint64_t)w.channel_len + w.recipient_len + w.tool_call_id_len +
                        w.content_len;
        if (need > len - off)
            return REFUSE(c, "chat: message %" PRIu32 " announces %" PRIu64 " bytes, %" PRIu32
                          " remain", n, need, len - off);
        if (w.role > SHM_CHAT_TOOL)
            return REFUSE(c, "chat: messages[%" PRIu32 "].role: %" PRIu32 " is not a role", n,
                          w.role);
        if (w.reserved)
            return REFUSE(c, "chat: messages[%" PRIu32 "].reserved: %" PRIu32 ", not 0", n,
                          w.reserved);
        const char *q = (const char *)p + off;
        struct shm_chat_msg m = {.role = (enum shm_chat_role)w.role,
                                 .channel = q, .channel_len = w.channel_len,
                                 .recipient = q + w.channel_len,
                                 .recipient_len = w.recipient_len,
                                 .tool_call_id = q + w.channel_len + w.recipient_len,
                                 .tool_call_id_len = w.tool_call_id_len,
                                 .content = q + w.channel_len + w.recipient_len +
                                            w.tool_call_id_len,
                                 .content_len = w.content_len};
        off += (uint32_t)need;
        if ((rc = chat_msg_check(c, n, &m, NULL, 0)) < 0)
            return rc;
        if (out && n < cap)
            out[n] = m;
        n++;
    }
    if (n == 0)
        return REFUSE(c, "chat: no messages");
    if (n_out)
        *n_out = n;
    return 0;
}

int shm_chat_size(const struct shm_chat *ch, uint32_t *len, char *msg, size_t cap)
{
    struct ctx c = {.what = "chat", .type = SHM_MSG_GENERATE};
    uint32_t n = ch->n;
    if (n == 0 || n > SHM_MAX_CHAT_MSGS) {
        if (msg)
            snprintf(msg, cap, "messages: %" PRIu32 ", give 1..%u", n, SHM_MAX_CHAT_MSGS);
        return REFUSE(&c, "messages: %" PRIu32 ", give 1..%u", n, SHM_MAX_CHAT_MSGS);
    }
    int rc = chat_tools_check(&c, ch->tools, ch->tools_len, msg, cap);
    if (rc < 0 || (rc = chat_tool_choice_check(&c, ch->tool_choice, ch->tools_len, msg, cap)) < 0)
        return rc;
    uint64_t total = sizeof(struct shm_wire_chat) + (uint64_t)ch->tools_len;
    for (uint32_t i = 0; i < n; i++) {
        const struct shm_chat_msg *m = &ch->msgs[i];
        if ((rc = chat_msg_check(&c, i, m, msg, cap)) < 0)
            return rc;
        total += sizeof(struct shm_wire_chat_msg) + (uint64_t)m->channel_len +
                 m->recipient_len + m->tool_call_id_len + m->content_len;
    }
    if (total > UINT32_MAX) {
        if (msg)
            snprintf(msg, cap, "messages: %" PRIu64 " bytes in all", total);
        return REFUSE(&c, "messages: %" PRIu64 " bytes in all", total);
    }
    *len = (uint32_t)total;
    return 0;
}

static void put_n(unsigned char *p, uint32_t *off, const void *s, uint32_t n)
{
    if (n)
        memcpy(p + *off, s, n);
    *off += n;
}

void shm_chat_encode(const struct shm_chat *ch, void *buf, uint32_t len)
{
    unsigned char *p = buf;
    uint32_t off = 0;
    struct shm_wire_chat h = {.tools_len = ch->tools_len, .tool_choice = ch->tool_choice};
    put_n(p, &off, &h, sizeof h);
    put_n(p, &off, ch->tools, ch->tools_len);
    for (uint32_t i = 0; i < ch->n; i++) {
        const struct shm_chat_msg *m = &ch->msgs[i];
        struct shm_wire_chat_msg w = {.role = (uint32_t)m->role, .channel_len = m->channel_len,
                                      .recipient_len = m->recipient_len,
                                      .content_len = m->content_len,
                                      .tool_call_id_len = m->tool_call_id_len};
        put_n(p, &off, &w, sizeof w);
        put_n(p, &off, m->channel, m->channel_len);
        put_n(p, &off, m->recipient, m->recipient_len);
        put_n(p, &off, m->tool_call_id, m->tool_call_id_len);
        put_n(p, &off, m->content, m->content_len);
    }
    CHECK(off == len);
}

int shm_chat_decode(const void *buf, uint32_t len, struct shm_chat_msg *out, uint32_t cap,
                    uint32_t *n, const char **tools, uint32_t *tools_len)
{
    struct ctx c = {.what = "chat", .type = SHM_MSG_GENERATE};
    return chat_check(&c, buf, len, out, cap, n, tools, tools_len);
}

uint32_t shm_chat_tool_choice(const void *buf)
{
    struct shm_wire_chat h;
    memcpy(&h, buf, sizeof h);
    return h.tool_choice;
}

static int check_generate(const struct ctx *c, const struct shm_msg_generate *g)
{
    int rc = check_id(c, g->request_id);
    if (rc < 0)
        return rc;
    if (!isfinite(g->temperature) || g->temperature < 0)
        return REFUSE(c, "temperature %g is not a finite value >= 0", (double)g->temperature);
    if (!isfinite(g->top_p) || !(g->top_p > 0 && g->top_p <= 1))
        return REFUSE(c, "top_p %g is outside (0, 1]", (double)g->top_p);
    if (!isfinite(g->min_p) || !(g->min_p >= 0 && g->min_p < 1))
        return REFUSE(c, "min_p %g is outside [0, 1)", (double)g->min_p);
    if (!isfinite(g->repeat_penalty) || !(g->repeat_penalty > 0))
        return REFUSE(c, "repeat_penalty %g is not a finite value > 0",
                      (double)g->repeat_penalty);
    if (!isfinite(g->adapter_scale))
        return REFUSE(c, "adapter_scale %g is not finite", (double)g->adapter_scale);
    if (g->repeat_window > SHM_MAX_REPEAT_WINDOW)
        return REFUSE(c, "repeat_window %" PRIu32 " exceeds %u", g->repeat_window,
                      SHM_MAX_REPEAT_WINDOW);
    if (g->max_tokens == 0)
        return REFUSE(c, "max_tokens is 0 (the gateway resolves the default)");
    if (g->top_logprobs > SHM_MAX_TOP_LOGPROBS || (g->top_logprobs && !g->logprobs))
        return REFUSE(c, "top_logprobs %" PRIu32 " %s %u", g->top_logprobs,
                      g->logprobs ? "exceeds" : "without logprobs; at most", SHM_MAX_TOP_LOGPROBS);
    if ((unsigned)g->priority > SHM_PRIO_LOW)
        return REFUSE(c, "priority %u is not a priority", (unsigned)g->priority);
    if (g->flags & ~SHM_GEN_FLAGS)
        return REFUSE(c, "flags 0x%" PRIx32 " hold unknown bits", g->flags);
    if ((g->flags & SHM_GEN_EFFORT_LOW) && (g->flags & SHM_GEN_EFFORT_HIGH))
        return REFUSE(c, "flags 0x%" PRIx32 " set both reasoning efforts", g->flags);
    if ((g->flags & (SHM_GEN_EFFORT_LOW | SHM_GEN_EFFORT_HIGH)) && !(g->flags & SHM_GEN_CHAT))
        return REFUSE(c, "flags 0x%" PRIx32 " give a reasoning effort without a chat", g->flags);
    if ((g->flags & SHM_GEN_CHAT) && (g->n_prompt_ids || (g->flags & SHM_GEN_ADD_BOS)))
        return REFUSE(c, "a chat (flags 0x%" PRIx32 ") with prompt ids or ADD_BOS", g->flags);
    if ((g->n_prompt_ids == 0) == (g->prompt_text_len == 0))
        return REFUSE(c, "%s", g->n_prompt_ids ? "both a prompt text and prompt token ids"
                                               : "no prompt (neither text nor token ids)");
    CHECK(g->prompt_text_len == 0 || g->prompt_text);
    if ((g->flags & SHM_GEN_CHAT) && chat_check(c, g->prompt_text, g->prompt_text_len, NULL, 0,
                                                  NULL, NULL, NULL) < 0)
        return ERR_FORMAT;
    if ((rc = check_ids(c, "prompt_ids", g->prompt_ids, g->n_prompt_ids)) < 0)
        return rc;
    if (g->adapter && (rc = check_name(c, "adapter", g->adapter)) < 0)
        return rc;
    if (g->n_stop > SHM_MAX_STOP)
        return REFUSE(c, "%" PRIu32 " stop strings, at most %u", g->n_stop, SHM_MAX_STOP);
    for (uint32_t i = 0; i < g->n_stop; i++) {
        char field[24];
        snprintf(field, sizeof field, "stop[%" PRIu32 "]", i);
        if ((rc = check_str(c, field, g->stop[i], SHM_MAX_STOP_LEN, false)) < 0)
            return rc;
    }
    return 0;
}

/* A TOKEN's logprobs (nothing in shared memory is trusted: NaN, a positive logprob or an
 * unordered list would reach the client's JSON). */
static int check_logprob(struct ctx *c, const char *which, uint32_t i,
                         const struct shm_msg_logprob *x)
{
    if (x->id < 0)
        return REFUSE(c, "logprob %s %" PRIu32 ": token %" PRId32 " is negative", which, i,
                      x->id);
    if (!(x->logprob >= SHM_LOGPROB_FLOOR && x->logprob <= 0.0f))
        return REFUSE(c, "logprob %s %" PRIu32 ": %g is outside [%g, 0]", which, i,
                      (double)x->logprob, (double)SHM_LOGPROB_FLOOR);
    if (x->piece_len > SHM_MAX_LOGPROB_PIECE)
        return REFUSE(c, "logprob %s %" PRIu32 ": a piece of %" PRIu32 " bytes exceeds %u",
                      which, i, x->piece_len, SHM_MAX_LOGPROB_PIECE);
    CHECK(x->piece_len == 0 || x->piece);
    return 0;
}

static int check_logprobs(struct ctx *c, const struct shm_msg_token *t)
{
    if (!t->has_logprob)
        return t->n_top ? REFUSE(c, "%" PRIu32 " logprob alternatives without a logprob",
                                 t->n_top)
                        : 0;
    if (t->token < 0)
        return REFUSE(c, "a text-only piece carries a logprob");
    if (t->own.id != t->token)
        return REFUSE(c, "the logprob is of token %" PRId32 ", not %" PRId32, t->own.id,
                      t->token);
    if (t->n_top > SHM_MAX_TOP_LOGPROBS)
        return REFUSE(c, "%" PRIu32 " logprob alternatives, at most %u", t->n_top,
                      SHM_MAX_TOP_LOGPROBS);
    int rc = check_logprob(c, "of the token", 0, &t->own);
    for (uint32_t i = 0; rc == 0 && i < t->n_top; i++) {
        rc = check_logprob(c, "alternative", i, &t->top[i]);
        if (rc == 0 && i && t->top[i].logprob > t->top[i - 1].logprob)
            rc = REFUSE(c, "logprob alternative %" PRIu32 " is more likely than the one before "
                        "it", i);
    }
    return rc;
}

/* Bytes of a TOKEN's logprob section (after validate). */
/* chat tools (ABI 3): a piece's call header, if any */
static int check_call_open(const struct ctx *c, const struct shm_msg_token *t)
{
    if (!t->call_name_len && !t->call_id_len)
        return 0;
    if (t->channel == SHM_CH_NONE)
        return REFUSE(c, "a call header on a piece that is not a chat's");
    if (!t->call_name_len || !t->call_id_len)
        return REFUSE(c, "a call header without a %s", t->call_name_len ? "call id" : "name");
    int rc;
    if ((rc = chat_field(c, "call name", t->call_name, t->call_name_len, NULL, 0)) < 0 ||
        (rc = chat_field(c, "call id", t->call_id, t->call_id_len, NULL, 0)) < 0)
        return rc;
    return 0;
}

static uint64_t logprobs_bytes(const struct shm_msg_token *t)
{
    if (!t->has_logprob)
        return 0;
    uint64_t n = sizeof(struct shm_wire_logprob) + t->own.piece_len;
    for (uint32_t i = 0; i < t->n_top; i++)
        n += sizeof(struct shm_wire_logprob) + t->top[i].piece_len;
    return n;
}

static int validate(const char *what, const struct shm_msg *m)
{
    struct ctx c = {.what = what, .type = m->type};
    int rc;
    switch (m->type) {
    case SHM_MSG_GENERATE:
        c.id = m->generate.request_id;
        return check_generate(&c, &m->generate);
    case SHM_MSG_CANCEL:
    case SHM_MSG_STATS_QUERY:
    case SHM_MSG_DONE:
        return check_id(&c, m->request_id);
    case SHM_MSG_TOKENIZE:
        c.id = m->tokenize.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        if (m->tokenize.flags & ~SHM_GEN_ADD_BOS)
            return REFUSE(&c, "flags 0x%" PRIx32 " hold unknown bits", m->tokenize.flags);
        CHECK(m->tokenize.text_len == 0 || m->tokenize.text);
        return 0;
    case SHM_MSG_DETOKENIZE:
    case SHM_MSG_TOKENS:
        c.id = m->ids.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        return check_ids(&c, "ids", m->ids.ids, m->ids.n_ids);
    case SHM_MSG_ADAPTER_LOAD:
        c.id = m->adapter_load.request_id;
        if ((rc = check_id(&c, c.id)) < 0 ||
            (rc = check_name(&c, "name", m->adapter_load.name)) < 0)
            return rc;
        return check_str(&c, "path", m->adapter_load.path, SHM_MAX_PATH, false);
    case SHM_MSG_ADAPTER_UNLOAD:
        c.id = m->name.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        return check_name(&c, "name", m->name.name);
    case SHM_MSG_TOKEN:
        c.id = m->token.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        /* -1: a text-only piece (text the engine held back until the end, engine.h) */
        if (m->token.token < -1)
            return REFUSE(&c, "token %" PRId32 " is negative (only -1, text only, is allowed)",
                          m->token.token);
        if (m->token.token == -1 && m->token.text_len == 0)
            return REFUSE(&c, "token -1 (text only) carries no text");
        if ((unsigned)m->token.channel > SHM_CH_OTHER)
            return REFUSE(&c, "channel %u is not a channel", (unsigned)m->token.channel);
        if (m->token.call && m->token.token < 0)
            return REFUSE(&c, "a text-only piece marked as a tool call");
        if ((rc = check_call_open(&c, &m->token)) < 0) /* chat tools (ABI 3) */
            return rc;
        if ((rc = check_logprobs(&c, &m->token)) < 0)
            return rc;
        if (m->token.text_len > SHM_MAX_PIECE)
            return REFUSE(&c, "text of %" PRIu32 " bytes exceeds %u", m->token.text_len,
                          SHM_MAX_PIECE);
        CHECK(m->token.text_len == 0 || m->token.text);
        return 0;
    case SHM_MSG_FINISH:
        c.id = m->finish.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        if (m->finish.reason < SHM_FINISH_EOS || m->finish.reason > SHM_FINISH_CONTEXT)
            return REFUSE(&c, "reason %u is not a finish reason", (unsigned)m->finish.reason);
        if (m->finish.cached_tokens > m->finish.prompt_tokens)
            return REFUSE(&c, "cached_tokens %" PRIu32 " exceeds prompt_tokens %" PRIu32,
                          m->finish.cached_tokens, m->finish.prompt_tokens);
        return 0;
    case SHM_MSG_ERROR:
        c.id = m->error.request_id;
        if (m->error.code >= 0)
            return REFUSE(&c, "code %" PRId32 " is not a negative error code", m->error.code);
        return check_str(&c, "message", m->error.message, SHM_MAX_ERROR, false);
    case SHM_MSG_TEXT:
        c.id = m->text.request_id;
        CHECK(m->text.text_len == 0 || m->text.text);
        return check_id(&c, c.id);
    case SHM_MSG_ADAPTER:
        c.id = m->adapter.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        if (m->adapter.rank == 0 || m->adapter.rank > SHM_MAX_RANK)
            return REFUSE(&c, "rank %" PRIu32 " is outside 1..%u", m->adapter.rank, SHM_MAX_RANK);
        if (!isfinite(m->adapter.alpha) || !(m->adapter.alpha > 0))
            return REFUSE(&c, "alpha %g is not a finite value > 0", (double)m->adapter.alpha);
        if (m->adapter.targets == 0 || (m->adapter.targets & ~SHM_TARGETS))
            return REFUSE(&c, "targets 0x%" PRIx32 " is not a nonempty set of projections",
                          m->adapter.targets);
        return check_name(&c, "name", m->adapter.name);
    case SHM_MSG_STATS:
        c.id = m->stats.request_id;
        if ((rc = check_id(&c, c.id)) < 0)
            return rc;
        if (m->stats.kv_blocks_used > m->stats.kv_blocks_total ||
            m->stats.kv_blocks_cached > m->stats.kv_blocks_total)
            return REFUSE(&c, "kv blocks used %" PRIu64 " / cached %" PRIu64 " exceed total %"
                          PRIu64, m->stats.kv_blocks_used, m->stats.kv_blocks_cached,
                          m->stats.kv_blocks_total);
        return 0;
    case SHM_MSG_HELLO:
        if (m->hello.vocab_size == 0 || m->hello.context_length == 0)
            return REFUSE(&c, "vocab_size %" PRIu32 " and context_length %" PRIu32
                          " must be >= 1", m->hello.vocab_size, m->hello.context_length);
        if ((rc = check_str(&c, "name", m->hello.name, SHM_MAX_INFO, true)) < 0 ||
            (rc = check_str(&c, "arch", m->hello.arch, SHM_MAX_INFO, true)) < 0)
            return rc;
        return check_str(&c, "dtype", m->hello.dtype, SHM_MAX_INFO, true);
    }
    return REFUSE(&c, "not a record type");
}

/* ---- encoding ---- */

/* Bytes of a C string on the wire (NUL included); 0 for NULL. Only after validate(). */
static uint64_t wlen(const char *s)
{
    return s ? strlen(s) + 1 : 0;
}

static uint64_t stop_bytes(const struct shm_msg_generate *g)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < g->n_stop; i++)
        n += wlen(g->stop[i]);
    return n;
}

/* The record length of a valid message. */
static uint64_t encoded_size(const struct shm_msg *m)
{
    switch (m->type) {
    case SHM_MSG_GENERATE: {
        const struct shm_msg_generate *g = &m->generate;
        return sizeof(struct shm_wire_generate) + 4ull * g->n_prompt_ids + wlen(g->adapter) +
               stop_bytes(g) + g->prompt_text_len;
    }
    case SHM_MSG_CANCEL:
    case SHM_MSG_STATS_QUERY:
    case SHM_MSG_DONE:
        return sizeof(struct shm_wire_id);
    case SHM_MSG_TOKENIZE:
        return sizeof(struct shm_wire_tokenize) + m->tokenize.text_len;
    case SHM_MSG_DETOKENIZE:
    case SHM_MSG_TOKENS:
        return sizeof(struct shm_wire_ids) + 4ull * m->ids.n_ids;
    case SHM_MSG_ADAPTER_LOAD:
        return sizeof(struct shm_wire_adapter_load) + wlen(m->adapter_load.name) +
               wlen(m->adapter_load.path);
    case SHM_MSG_ADAPTER_UNLOAD:
        return sizeof(struct shm_wire_name) + wlen(m->name.name);
    case SHM_MSG_TOKEN:
        return sizeof(struct shm_wire_token) + m->token.text_len + logprobs_bytes(&m->token) +
               (m->token.call_name_len ? sizeof(struct shm_wire_call) + m->token.call_name_len +
                                             m->token.call_id_len
                                       : 0);
    case SHM_MSG_FINISH:
        return sizeof(struct shm_wire_finish);
    case SHM_MSG_ERROR:
        return sizeof(struct shm_wire_error) + wlen(m->error.message);
    case SHM_MSG_TEXT:
        return sizeof(struct shm_wire_text) + m->text.text_len;
    case SHM_MSG_ADAPTER:
        return sizeof(struct shm_wire_adapter) + wlen(m->adapter.name);
    case SHM_MSG_STATS:
        return sizeof(struct shm_wire_stats);
    case SHM_MSG_HELLO:
        return sizeof(struct shm_wire_hello) + wlen(m->hello.name) + wlen(m->hello.arch) +
               wlen(m->hello.dtype);
    }
    CHECK(!"validated type");
    return 0;
}

int shm_msg_size(const char *what, const struct shm_msg *m, uint32_t *len)
{
    int rc = validate(what, m);
    if (rc < 0)
        return rc;
    uint64_t n = encoded_size(m);
    if (n > UINT32_MAX) {
        LOG_ERR("%s: %s record of %" PRIu64 " bytes exceeds 4 GiB", what ? what : "shm",
                shm_msg_type_name(m->type), n);
        return ERR_RANGE;
    }
    *len = (uint32_t)n;
    return 0;
}

struct out {
    uint8_t *p;
    uint64_t off, len;
};

static void put(struct out *o, const void *src, uint64_t n)
{
    CHECK(n <= o->len - o->off);
    if (n)
        memcpy(o->p + o->off, src, n);
    o->off += n;
}

static void put_str(struct out *o, const char *s)
{
    if (s)
        put(o, s, strlen(s) + 1);
}

void shm_msg_encode(const struct shm_msg *m, void *buf, uint32_t len)
{
    struct out o = {.p = buf, .len = len};
    switch (m->type) {
    case SHM_MSG_GENERATE: {
        const struct shm_msg_generate *g = &m->generate;
        struct shm_wire_generate w = {
            .request_id = g->request_id, .tenant_id = g->tenant_id,
            .deadline_ns = g->deadline_ns, .sent_ns = g->sent_ns, .seed = g->seed,
            .temperature = g->temperature,
            .top_p = g->top_p, .min_p = g->min_p, .repeat_penalty = g->repeat_penalty,
            .adapter_scale = g->adapter_scale, .top_k = g->top_k,
            .repeat_window = g->repeat_window, .max_tokens = g->max_tokens,
            .priority = (uint32_t)g->priority, .flags = g->flags,
            .n_prompt_ids = g->n_prompt_ids, .prompt_text_len = g->prompt_text_len,
            .adapter_len = (uint32_t)wlen(g->adapter), .n_stop = g->n_stop,
            .stop_bytes = (uint32_t)stop_bytes(g),
            .logprobs = g->logprobs ? 1 + g->top_logprobs : 0};
        put(&o, &w, sizeof w);
        put(&o, g->prompt_ids, 4ull * g->n_prompt_ids);
        put_str(&o, g->adapter);
        for (uint32_t i = 0; i < g->n_stop; i++)
            put_str(&o, g->stop[i]);
        put(&o, g->prompt_text, g->prompt_text_len);
        break;
    }
    case SHM_MSG_CANCEL:
    case SHM_MSG_STATS_QUERY:
    case SHM_MSG_DONE: {
        struct shm_wire_id w = {.request_id = m->request_id};
        put(&o, &w, sizeof w);
        break;
    }
    case SHM_MSG_TOKENIZE: {
        struct shm_wire_tokenize w = {.request_id = m->tokenize.request_id,
                                      .flags = m->tokenize.flags,
                                      .text_len = m->tokenize.text_len};
        put(&o, &w, sizeof w);
        put(&o, m->tokenize.text, m->tokenize.text_len);
        break;
    }
    case SHM_MSG_DETOKENIZE:
    case SHM_MSG_TOKENS: {
        struct shm_wire_ids w = {.request_id = m->ids.request_id, .n_ids = m->ids.n_ids};
        put(&o, &w, sizeof w);
        put(&o, m->ids.ids, 4ull * m->ids.n_ids);
        break;
    }
    case SHM_MSG_ADAPTER_LOAD: {
        struct shm_wire_adapter_load w = {.request_id = m->adapter_load.request_id,
                                          .name_len = (uint32_t)wlen(m->adapter_load.name),
                                          .path_len = (uint32_t)wlen(m->adapter_load.path)};
        put(&o, &w, sizeof w);
        put_str(&o, m->adapter_load.name);
        put_str(&o, m->adapter_load.path);
        break;
    }
    case SHM_MSG_ADAPTER_UNLOAD: {
        struct shm_wire_name w = {.request_id = m->name.request_id,
                                  .name_len = (uint32_t)wlen(m->name.name)};
        put(&o, &w, sizeof w);
        put_str(&o, m->name.name);
        break;
    }
    case SHM_MSG_TOKEN: {
        struct shm_wire_token w = {.request_id = m->token.request_id, .token = m->token.token,
                                   .text_len = m->token.text_len |
                                               (uint32_t)m->token.channel
                                                   << SHM_TOKEN_CHANNEL_SHIFT |
                                               (m->token.call ? SHM_TOKEN_CALL : 0) |
                                               (m->token.call_name_len ? SHM_TOKEN_CALL_OPEN
                                                                       : 0) |
                                               (m->token.has_logprob
                                                    ? SHM_TOKEN_LOGPROBS |
                                                          m->token.n_top << SHM_TOKEN_TOP_SHIFT
                                                    : 0)};
        put(&o, &w, sizeof w);
        put(&o, m->token.text, m->token.text_len);
        if (m->token.call_name_len) { /* chat tools (ABI 3) */
            struct shm_wire_call wc = {m->token.call_name_len, m->token.call_id_len};
            put(&o, &wc, sizeof wc);
            put(&o, m->token.call_name, m->token.call_name_len);
            put(&o, m->token.call_id, m->token.call_id_len);
        }
        for (uint32_t i = 0; m->token.has_logprob && i <= m->token.n_top; i++) {
            const struct shm_msg_logprob *x = i ? &m->token.top[i - 1] : &m->token.own;
            struct shm_wire_logprob wl = {x->id, x->logprob, x->piece_len};
            put(&o, &wl, sizeof wl);
            put(&o, x->piece, x->piece_len);
        }
        break;
    }
    case SHM_MSG_FINISH: {
        const struct shm_msg_finish *f = &m->finish;
        struct shm_wire_finish w = {
            .request_id = f->request_id, .reason = (uint32_t)f->reason,
            .prompt_tokens = f->prompt_tokens, .completion_tokens = f->completion_tokens,
            .cached_tokens = f->cached_tokens, .queue_ns = f->queue_ns, .ttft_ns = f->ttft_ns,
            .tpot_ns = f->tpot_ns, .e2e_ns = f->e2e_ns};
        put(&o, &w, sizeof w);
        break;
    }
    case SHM_MSG_ERROR: {
        struct shm_wire_error w = {.request_id = m->error.request_id, .code = m->error.code,
                                   .message_len = (uint32_t)wlen(m->error.message)};
        put(&o, &w, sizeof w);
        put_str(&o, m->error.message);
        break;
    }
    case SHM_MSG_TEXT: {
        struct shm_wire_text w = {.request_id = m->text.request_id,
                                  .text_len = m->text.text_len};
        put(&o, &w, sizeof w);
        put(&o, m->text.text, m->text.text_len);
        break;
    }
    case SHM_MSG_ADAPTER: {
        const struct shm_msg_adapter *a = &m->adapter;
        struct shm_wire_adapter w = {.request_id = a->request_id, .rank = a->rank,
                                     .alpha = a->alpha, .targets = a->targets,
                                     .active_requests = a->active_requests,
                                     .name_len = (uint32_t)wlen(a->name)};
        put(&o, &w, sizeof w);
        put_str(&o, a->name);
        break;
    }
    case SHM_MSG_STATS: {
        const struct shm_msg_stats *s = &m->stats;
        struct shm_wire_stats w = {
            .request_id = s->request_id, .running = s->running, .waiting = s->waiting,
            .kv_blocks_total = s->kv_blocks_total, .kv_blocks_used = s->kv_blocks_used,
            .kv_blocks_cached = s->kv_blocks_cached, .prefix_hit_tokens = s->prefix_hit_tokens,
            .prefix_miss_tokens = s->prefix_miss_tokens, .preemptions = s->preemptions,
            .requests_finished = s->requests_finished, .tokens_generated = s->tokens_generated,
            .tokens_prefilled = s->tokens_prefilled, .rss_bytes = s->rss_bytes};
        put(&o, &w, sizeof w);
        break;
    }
    case SHM_MSG_HELLO: {
        const struct shm_msg_hello *h = &m->hello;
        struct shm_wire_hello w = {.parameters = h->parameters, .vocab_size = h->vocab_size,
                                   .context_length = h->context_length,
                                   .name_len = (uint32_t)wlen(h->name),
                                   .arch_len = (uint32_t)wlen(h->arch),
                                   .dtype_len = (uint32_t)wlen(h->dtype)};
        put(&o, &w, sizeof w);
        put_str(&o, h->name);
        put_str(&o, h->arch);
        put_str(&o, h->dtype);
        break;
    }
    }
    CHECK(o.off == len);
}

/* ---- decoding ---- */

struct in {
    const struct ctx *c;
    const uint8_t *p;
    uint32_t off, len;
};

/* The fixed part; the id is taken from it for the messages that follow. */
static int take_fixed(struct in *in, void *dst, size_t n)
{
    if (in->len < n)
        return REFUSE(in->c, "%" PRIu32 " bytes, shorter than its %zu-byte fixed part", in->len,
                      n);
    memcpy(dst, in->p, n);
    in->off = (uint32_t)n;
    return 0;
}

/* After the fixed part: the sections announced must add up to the record exactly. */
static int expect_total(struct in *in, uint64_t sections)
{
    uint64_t want = (uint64_t)in->off + sections;
    if (want != in->len)
        return REFUSE(in->c, "%" PRIu32 " bytes, but its fixed part and counts make %" PRIu64,
                      in->len, want);
    return 0;
}

/* At least `sections` more bytes (sections that carry their own lengths, read one by one). */
static int expect_min(struct in *in, uint64_t sections)
{
    uint64_t want = (uint64_t)in->off + sections;
    if (want > in->len)
        return REFUSE(in->c, "%" PRIu32 " bytes, but its fixed part and counts make at least %"
                      PRIu64, in->len, want);
    return 0;
}

static const void *take(struct in *in, uint64_t n)
{
    CHECK(n <= (uint64_t)in->len - in->off); /* expect_total() came first */
    const void *p = in->p + in->off;
    in->off += (uint32_t)n;
    return p;
}

static int take_ids(struct in *in, uint32_t n, const int32_t **out)
{
    *out = n ? take(in, 4ull * n) : NULL; /* 4-aligned: fixed parts are multiples of 8 */
    return 0;
}

/* A NUL-terminated string section of n bytes (NUL included; 0 = absent when `optional`). */
static int take_cstr(struct in *in, const char *field, uint32_t n, bool optional,
                     const char **out)
{
    *out = NULL;
    if (n == 0)
        return optional ? 0 : REFUSE(in->c, "%s is missing (length 0)", field);
    const char *s = take(in, n);
    if (s[n - 1] != '\0')
        return REFUSE(in->c, "%s of %" PRIu32 " bytes does not end with a NUL", field, n);
    const char *nul = memchr(s, '\0', n - 1);
    if (nul)
        return REFUSE(in->c, "%s holds a NUL byte at %td", field, nul - s);
    *out = s;
    return 0;
}

static int reserved_zero(struct in *in, uint32_t v)
{
    return v ? REFUSE(in->c, "reserved field holds %" PRIu32 ", expected 0", v) : 0;
}

static int decode_stops(struct in *in, uint32_t n_stop, uint32_t bytes,
                        struct shm_msg_generate *g)
{
    if (n_stop > SHM_MAX_STOP)
        return REFUSE(in->c, "%" PRIu32 " stop strings, at most %u", n_stop, SHM_MAX_STOP);
    if ((n_stop == 0) != (bytes == 0))
        return REFUSE(in->c, "%" PRIu32 " stop strings in %" PRIu32 " bytes", n_stop, bytes);
    const char *s = take(in, bytes);
    uint32_t i = 0, start = 0;
    for (uint32_t k = 0; k < bytes; k++) {
        if (s[k] != '\0')
            continue;
        if (i == n_stop)
            return REFUSE(in->c, "stop strings section holds more than n_stop = %" PRIu32, n_stop);
        g->stop[i++] = s + start;
        start = k + 1;
    }
    if (start != bytes)
        return REFUSE(in->c, "stop strings section does not end with a NUL");
    if (i != n_stop)
        return REFUSE(in->c, "stop strings section holds %" PRIu32 " strings, n_stop says %"
                      PRIu32, i, n_stop);
    g->n_stop = n_stop;
    return 0;
}

static int decode_generate(struct in *in, struct ctx *c, struct shm_msg_generate *g)
{
    struct shm_wire_generate w = {0};
    int rc = take_fixed(in, &w, sizeof w);
    if (rc < 0)
        return rc;
    c->id = w.request_id;
    if (w.logprobs > 1 + SHM_MAX_TOP_LOGPROBS)
        return REFUSE(c, "logprobs %" PRIu32 " exceeds %u (1 + the alternatives)", w.logprobs,
                      1 + SHM_MAX_TOP_LOGPROBS);
    if ((rc = expect_total(in, 4ull * w.n_prompt_ids + w.adapter_len + (uint64_t)w.stop_bytes +
                                   w.prompt_text_len)) < 0)
        return rc;
    *g = (struct shm_msg_generate){
        .request_id = w.request_id, .tenant_id = w.tenant_id, .deadline_ns = w.deadline_ns,
        .sent_ns = w.sent_ns, .seed = w.seed, .temperature = w.temperature, .top_p = w.top_p, .min_p = w.min_p,
        .repeat_penalty = w.repeat_penalty, .adapter_scale = w.adapter_scale, .top_k = w.top_k,
        .repeat_window = w.repeat_window, .max_tokens = w.max_tokens,
        .priority = (enum shm_priority)w.priority, .flags = w.flags,
        .n_prompt_ids = w.n_prompt_ids, .prompt_text_len = w.prompt_text_len,
        .logprobs = w.logprobs != 0, .top_logprobs = w.logprobs ? w.logprobs - 1 : 0};
    if (w.priority > SHM_PRIO_LOW) /* before it becomes an enum value anyone switches on */
        return REFUSE(c, "priority %" PRIu32 " is not a priority", w.priority);
    if ((rc = take_ids(in, w.n_prompt_ids, &g->prompt_ids)) < 0 ||
        (rc = take_cstr(in, "adapter", w.adapter_len, true, &g->adapter)) < 0 ||
        (rc = decode_stops(in, w.n_stop, w.stop_bytes, g)) < 0)
        return rc;
    g->prompt_text = w.prompt_text_len ? take(in, w.prompt_text_len) : NULL;
    return 0;
}

int shm_msg_decode(const char *what, uint32_t type, const void *buf, uint32_t len,
                   struct shm_msg *out)
{
    CHECK(((uintptr_t)buf & 7) == 0);
    memset(out, 0, sizeof *out);
    out->type = (enum shm_msg_type)type;
    struct ctx c = {.what = what, .type = type};
    struct in in = {.c = &c, .p = buf, .len = len};
    int rc = 0;
    switch (type) {
    case SHM_MSG_GENERATE:
        rc = decode_generate(&in, &c, &out->generate);
        break;
    case SHM_MSG_CANCEL:
    case SHM_MSG_STATS_QUERY:
    case SHM_MSG_DONE: {
        struct shm_wire_id w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = expect_total(&in, 0)) == 0)
            out->request_id = w.request_id;
        break;
    }
    case SHM_MSG_TOKENIZE: {
        struct shm_wire_tokenize w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = expect_total(&in, w.text_len)) < 0)
            break;
        out->tokenize = (struct shm_msg_tokenize){
            .request_id = w.request_id, .flags = w.flags, .text_len = w.text_len,
            .text = w.text_len ? take(&in, w.text_len) : NULL};
        break;
    }
    case SHM_MSG_DETOKENIZE:
    case SHM_MSG_TOKENS: {
        struct shm_wire_ids w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = reserved_zero(&in, w.reserved)) < 0 ||
            (rc = expect_total(&in, 4ull * w.n_ids)) < 0)
            break;
        out->ids.request_id = w.request_id;
        out->ids.n_ids = w.n_ids;
        rc = take_ids(&in, w.n_ids, &out->ids.ids);
        break;
    }
    case SHM_MSG_ADAPTER_LOAD: {
        struct shm_wire_adapter_load w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = expect_total(&in, (uint64_t)w.name_len + w.path_len)) < 0)
            break;
        out->adapter_load.request_id = w.request_id;
        if ((rc = take_cstr(&in, "name", w.name_len, false, &out->adapter_load.name)) == 0)
            rc = take_cstr(&in, "path", w.path_len, false, &out->adapter_load.path);
        break;
    }
    case SHM_MSG_ADAPTER_UNLOAD: {
        struct shm_wire_name w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = reserved_zero(&in, w.reserved)) < 0 || (rc = expect_total(&in, w.name_len)) < 0)
            break;
        out->name.request_id = w.request_id;
        rc = take_cstr(&in, "name", w.name_len, false, &out->name.name);
        break;
    }
    case SHM_MSG_TOKEN: {
        struct shm_wire_token w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        uint32_t tlen = w.text_len & SHM_TOKEN_LEN_MASK;
        bool lp = (w.text_len & SHM_TOKEN_LOGPROBS) != 0;
        uint32_t n_top = w.text_len >> SHM_TOKEN_TOP_SHIFT & SHM_TOKEN_TOP_MASK;
        if (!lp && n_top) {
            rc = REFUSE(&c, "%" PRIu32 " logprob alternatives without the logprob flag", n_top);
            break;
        }
        if (n_top > SHM_MAX_TOP_LOGPROBS) {
            rc = REFUSE(&c, "%" PRIu32 " logprob alternatives, at most %u", n_top,
                        SHM_MAX_TOP_LOGPROBS);
            break;
        }
        bool open = (w.text_len & SHM_TOKEN_CALL_OPEN) != 0;
        if ((rc = lp || open ? expect_min(&in, tlen) : expect_total(&in, tlen)) < 0)
            break;
        out->token = (struct shm_msg_token){
            .request_id = w.request_id, .token = w.token, .text_len = tlen,
            .channel = (enum shm_channel)(w.text_len >> SHM_TOKEN_CHANNEL_SHIFT &
                                          SHM_TOKEN_CHANNEL_MASK),
            .call = (w.text_len & SHM_TOKEN_CALL) != 0,
            .text = tlen ? take(&in, tlen) : NULL, .has_logprob = lp, .n_top = n_top};
        if (open) { /* chat tools (ABI 3): the call header, bounded before it is read */
            struct shm_wire_call wc;
            if ((rc = expect_min(&in, sizeof wc)) < 0)
                break;
            memcpy(&wc, take(&in, sizeof wc), sizeof wc);
            if (wc.name_len == 0 || wc.name_len > SHM_MAX_CHAT_NAME || wc.id_len == 0 ||
                wc.id_len > SHM_MAX_CHAT_NAME) {
                rc = REFUSE(&c, "call header: name %" PRIu32 " and id %" PRIu32 " bytes (each "
                            "1..%u)", wc.name_len, wc.id_len, SHM_MAX_CHAT_NAME);
                break;
            }
            if ((rc = expect_min(&in, (uint64_t)wc.name_len + wc.id_len)) < 0)
                break;
            out->token.call_name_len = wc.name_len, out->token.call_id_len = wc.id_len;
            out->token.call_name = take(&in, wc.name_len);
            out->token.call_id = take(&in, wc.id_len);
        }
        /* the entries, each a fixed part (unaligned after the text: copied) and its piece */
        for (uint32_t i = 0; lp && rc == 0 && i <= n_top; i++) {
            struct shm_msg_logprob *x = i ? &out->token.top[i - 1] : &out->token.own;
            struct shm_wire_logprob wl;
            if ((rc = expect_min(&in, sizeof wl)) < 0)
                break;
            memcpy(&wl, take(&in, sizeof wl), sizeof wl);
            if (wl.piece_len > SHM_MAX_LOGPROB_PIECE) {
                rc = REFUSE(&c, "logprob entry %" PRIu32 ": a piece of %" PRIu32 " bytes "
                            "exceeds %u", i, wl.piece_len, SHM_MAX_LOGPROB_PIECE);
                break;
            }
            if ((rc = expect_min(&in, wl.piece_len)) < 0)
                break;
            *x = (struct shm_msg_logprob){.id = wl.id, .logprob = wl.logprob,
                                          .piece_len = wl.piece_len,
                                          .piece = wl.piece_len ? take(&in, wl.piece_len) : NULL};
        }
        if (rc == 0)
            rc = expect_total(&in, 0);
        break;
    }
    case SHM_MSG_FINISH: {
        struct shm_wire_finish w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = expect_total(&in, 0)) < 0)
            break;
        if (w.reason < SHM_FINISH_EOS || w.reason > SHM_FINISH_CONTEXT) {
            rc = REFUSE(&c, "reason %" PRIu32 " is not a finish reason", w.reason);
            break;
        }
        out->finish = (struct shm_msg_finish){
            .request_id = w.request_id, .reason = (enum shm_finish)w.reason,
            .prompt_tokens = w.prompt_tokens, .completion_tokens = w.completion_tokens,
            .cached_tokens = w.cached_tokens, .queue_ns = w.queue_ns, .ttft_ns = w.ttft_ns,
            .tpot_ns = w.tpot_ns, .e2e_ns = w.e2e_ns};
        break;
    }
    case SHM_MSG_ERROR: {
        struct shm_wire_error w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = expect_total(&in, w.message_len)) < 0)
            break;
        out->error.request_id = w.request_id;
        out->error.code = w.code;
        rc = take_cstr(&in, "message", w.message_len, false, &out->error.message);
        break;
    }
    case SHM_MSG_TEXT: {
        struct shm_wire_text w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = reserved_zero(&in, w.reserved)) < 0 || (rc = expect_total(&in, w.text_len)) < 0)
            break;
        out->text = (struct shm_msg_text){.request_id = w.request_id, .text_len = w.text_len,
                                          .text = w.text_len ? take(&in, w.text_len) : NULL};
        break;
    }
    case SHM_MSG_ADAPTER: {
        struct shm_wire_adapter w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = reserved_zero(&in, w.reserved)) < 0 || (rc = expect_total(&in, w.name_len)) < 0)
            break;
        out->adapter = (struct shm_msg_adapter){.request_id = w.request_id, .rank = w.rank,
                                                .alpha = w.alpha, .targets = w.targets,
                                                .active_requests = w.active_requests};
        rc = take_cstr(&in, "name", w.name_len, false, &out->adapter.name);
        break;
    }
    case SHM_MSG_STATS: {
        struct shm_wire_stats w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        c.id = w.request_id;
        if ((rc = expect_total(&in, 0)) < 0)
            break;
        out->stats = (struct shm_msg_stats){
            .request_id = w.request_id, .running = w.running, .waiting = w.waiting,
            .kv_blocks_total = w.kv_blocks_total, .kv_blocks_used = w.kv_blocks_used,
            .kv_blocks_cached = w.kv_blocks_cached, .prefix_hit_tokens = w.prefix_hit_tokens,
            .prefix_miss_tokens = w.prefix_miss_tokens, .preemptions = w.preemptions,
            .requests_finished = w.requests_finished, .tokens_generated = w.tokens_generated,
            .tokens_prefilled = w.tokens_prefilled, .rss_bytes = w.rss_bytes};
        break;
    }
    case SHM_MSG_HELLO: {
        struct shm_wire_hello w = {0};
        if ((rc = take_fixed(&in, &w, sizeof w)) < 0)
            break;
        if (w.request_id != 0) {
            rc = REFUSE(&c, "request_id %" PRIu64 ", a hello answers no request (0)",
                        w.request_id);
            break;
        }
        if ((rc = reserved_zero(&in, w.reserved)) < 0 ||
            (rc = expect_total(&in, (uint64_t)w.name_len + w.arch_len + w.dtype_len)) < 0)
            break;
        out->hello = (struct shm_msg_hello){.parameters = w.parameters,
                                            .vocab_size = w.vocab_size,
                                            .context_length = w.context_length};
        if ((rc = take_cstr(&in, "name", w.name_len, false, &out->hello.name)) == 0 &&
            (rc = take_cstr(&in, "arch", w.arch_len, false, &out->hello.arch)) == 0)
            rc = take_cstr(&in, "dtype", w.dtype_len, false, &out->hello.dtype);
        break;
    }
    default:
        return REFUSE(&c, "unknown record type");
    }
    if (rc < 0)
        return rc;
    return validate(what, out);
}

/* ---- over a ring ---- */

static int check_direction(struct shm_ring *r, uint32_t type)
{
    int dir = shm_msg_type_ring(type);
    if (dir < 0 || (unsigned)dir == r->id)
        return 0; /* a non-type is refused by validate/decode with its own message */
    return refuse(r->name, type, 0, "travels on the %s ring, not this one",
                  dir == SHM_RING_REQUESTS ? "requests" : "events");
}

int shm_msg_send(struct shm_ring *r, const struct shm_msg *m)
{
    uint32_t len;
    int rc = check_direction(r, m->type);
    if (rc < 0 || (rc = shm_msg_size(r->name, m, &len)) < 0)
        return rc;
    void *p;
    if ((rc = shm_ring_reserve(r, m->type, len, &p)) < 0)
        return rc;
    shm_msg_encode(m, p, len);
    shm_ring_commit(r);
    return 0;
}

int shm_msg_send_wait(struct shm_ring *r, const struct shm_msg *m, int64_t timeout_ns)
{
    uint32_t len;
    int rc = check_direction(r, m->type);
    if (rc < 0 || (rc = shm_msg_size(r->name, m, &len)) < 0)
        return rc;
    for (;;) {
        void *p;
        rc = shm_ring_reserve(r, m->type, len, &p);
        if (rc == 0) {
            shm_msg_encode(m, p, len);
            shm_ring_commit(r);
            return 0;
        }
        if (rc != -EAGAIN)
            return rc;
        /* the wait's own deadline bounds the loop: it returns 0 only once the record fits */
        if ((rc = shm_ring_wait_writable(r, len, timeout_ns)) < 0)
            return rc;
    }
}

int shm_msg_recv(struct shm_ring *r, void *buf, size_t cap, struct shm_msg *out)
{
    uint32_t type, len;
    int rc = shm_ring_read(r, buf, cap, &type, &len);
    if (rc < 0)
        return rc;
    if ((rc = check_direction(r, type)) < 0 ||
        (rc = shm_msg_decode(r->name, type, buf, len, out)) < 0) {
        shm_ring_mark_broken(r);
        return rc;
    }
    return 0;
}
