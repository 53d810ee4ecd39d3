/*
 * harmony.c — the harmony chat format of gpt-oss (harmony.h): rendering messages to prompt
 * ids and parsing generated ids into channels.
 *
 * A message is <|start|>{header}<|message|>{content}<|end|>; the header is the role, then
 * optionally <|channel|>{channel}, " to={recipient}" and " <|constrain|>{type}". Rendering
 * encodes each piece of text on its own (plain text, no specials) and puts the structural
 * tokens between them by id, which is what encoding the rendered string with specials allowed
 * gives, since specials split text anyway — without letting message text spell a special.
 */
#include "harmony.h"

#include "tok_internal.h"

#include "err.h"
#include "jinja.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_IDENTITY "You are ChatGPT, a large language model trained by OpenAI."
#define DEFAULT_CUTOFF "2024-06"
#define VALID_CHANNELS \
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
#define FUNCTIONS_LINE "Calls to these tools must go to the commentary channel: 'functions'."

/* The harmony specials, found by name and checked to be control tokens. */
static int specials(const struct tok *t, int32_t *ids[7])
{
    static const char *const names[7] = {"<|start|>",     "<|end|>",    "<|message|>",
                                         "<|channel|>",   "<|constrain|>", "<|return|>",
                                         "<|call|>"};
    for (int i = 0; i < 7; i++) {
        int32_t id = tok_token_id(t, names[i], strlen(names[i]));
        if (id < 0 || tok_token_type(t, id) != TOK_CONTROL) {
            LOG_ERR("harmony: the tokenizer has no control token %s: not an o200k_harmony "
                    "vocabulary", names[i]);
            return ERR_UNSUPPORTED;
        }
        *ids[i] = id;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* tool definitions                                                                         */

/* The TypeScript of a JSON-schema parameter, as gpt-oss's chat template's
 * render_typescript_type writes it — its whitespace included (a nested object's members and a
 * oneOf variant's default carry the template's indentation, which the model saw in training). */
static int ts_type(FILE *f, json_t *spec, int depth)
{
    if (depth > 32) {
        LOG_ERR("harmony: a tool parameter schema nested deeper than 32");
        return ERR_FORMAT;
    }
    json_t *type = json_object_get(spec, "type");
    const char *ts = json_string_value(type); /* NULL unless a string */
    bool nullable = json_is_true(json_object_get(spec, "nullable"));
    if (ts && !strcmp(ts, "array")) {
        json_t *items = json_object_get(spec, "items");
        if (items && json_is_object(items) && json_object_size(items)) {
            const char *it = json_string_value(json_object_get(items, "type"));
            if (it && (!strcmp(it, "string") || !strcmp(it, "boolean")))
                fprintf(f, "%s[]", it);
            else if (it && (!strcmp(it, "number") || !strcmp(it, "integer")))
                fputs("number[]", f);
            else {
                char *inner = NULL;
                size_t len = 0;
                FILE *g = open_memstream(&inner, &len);
                if (!g)
                    return -ENOMEM;
                int rc = ts_type(g, items, depth + 1);
                if (fclose(g) != 0 && rc == 0)
                    rc = -ENOMEM;
                if (rc == 0) {
                    /* the template measures characters; a UTF-8 count of the bytes */
                    size_t chars = 0;
                    for (size_t i = 0; i < len; i++)
                        chars += ((unsigned char)inner[i] & 0xC0) != 0x80;
                    if (!strcmp(inner, "object | object") || chars > 50)
                        fputs("any[]", f);
                    else
                        fprintf(f, "%s[]", inner);
                }
                free(inner);
                if (rc)
                    return rc;
            }
        } else if (items && !json_is_object(items) && !json_is_array(items) &&
                   !json_is_null(items) && !json_is_false(items)) {
            LOG_ERR("harmony: a tool parameter's \"items\" is not a schema");
            return ERR_FORMAT;
        } else {
            fputs("any[]", f);
        }
        if (nullable)
            fputs(" | null", f);
        return 0;
    }
    if (json_is_array(type) && json_array_size(type) > 0) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            json_t *t = json_array_get(type, i);
            if (!json_is_string(t)) {
                LOG_ERR("harmony: a tool parameter's type list holds a non-string");
                return ERR_FORMAT;
            }
            fprintf(f, "%s%s", i ? " | " : "", json_string_value(t));
        }
        return 0;
    }
    json_t *one = json_object_get(spec, "oneOf");
    if (one && (!json_is_array(one) || json_array_size(one) > 0) && !json_is_false(one) &&
        !json_is_null(one)) {
        if (!json_is_array(one)) {
            LOG_ERR("harmony: a tool parameter's \"oneOf\" is not a list");
            return ERR_FORMAT;
        }
        /* the template's "any" for object unions never fires (its flag is set inside a for
         * loop, which Jinja scopes away): every variant is written */
        for (size_t i = 0; i < json_array_size(one); i++) {
            json_t *v = json_array_get(one, i);
            int rc = ts_type(f, v, depth + 1);
            if (rc)
                return rc;
            const char *d = json_string_value(json_object_get(v, "description"));
            if (d && *d)
                fprintf(f, "// %s", d);
            json_t *def = json_object_get(v, "default");
            if (def) {
                char *js;
                if ((rc = jinja_json_dumps(def, &js)) != 0)
                    return rc;
                fprintf(f, "                    // default: %s", js);
                free(js);
            }
            if (i + 1 < json_array_size(one))
                fputs(" | \n", f); /* the template's line break after its " | " */
        }
        return 0;
    }
    if (ts && !strcmp(ts, "string")) {
        json_t *en = json_object_get(spec, "enum");
        if (en && !json_is_array(en) && !json_is_null(en) && !json_is_false(en)) {
            LOG_ERR("harmony: a string parameter's enum is not a list");
            return ERR_FORMAT;
        }
        if (json_is_array(en) && json_array_size(en)) {
            fputc('"', f);
            for (size_t i = 0; i < json_array_size(en); i++) {
                json_t *x = json_array_get(en, i);
                if (!json_is_string(x)) {
                    LOG_ERR("harmony: a string parameter's enum holds a non-string");
                    return ERR_FORMAT;
                }
                fprintf(f, "%s%s", i ? "\" | \"" : "", json_string_value(x));
            }
            fputc('"', f);
        } else {
            fputs(nullable ? "string | null" : "string", f);
        }
        return 0;
    }
    if (ts && (!strcmp(ts, "number") || !strcmp(ts, "integer"))) {
        fputs("number", f);
        return 0;
    }
    if (ts && !strcmp(ts, "boolean")) {
        fputs("boolean", f);
        return 0;
    }
    if (ts && !strcmp(ts, "object")) {
        json_t *props = json_object_get(spec, "properties");
        if (!json_is_object(props) || json_object_size(props) == 0) {
            fputs("object", f);
            return 0;
        }
        json_t *req = json_object_get(spec, "required");
        fputs("{\n", f);
        const char *name;
        json_t *p;
        size_t i = 0, n = json_object_size(props);
        json_object_foreach(props, name, p) {
            bool required = false;
            for (size_t k = 0; json_is_array(req) && k < json_array_size(req); k++)
                required |= json_is_string(json_array_get(req, k)) &&
                            !strcmp(json_string_value(json_array_get(req, k)), name);
            /* the template's own line break and indentation before the member's type */
            fprintf(f, "%s%s: \n                ", name, required ? "" : "?");
            int rc = ts_type(f, p, depth + 1);
            if (rc)
                return rc;
            if (++i < n)
                fputs(", ", f);
        }
        fputs("}", f);
        return 0;
    }
    fputs("any", f);
    return 0;
}

static const char *str_field(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

int harmony_tools_text(const char *tools_json, char **out)
{
    *out = NULL;
    json_error_t je;
    json_t *tools = tools_json ? json_loads(tools_json, 0, &je) : json_array();
    if (!tools) {
        LOG_ERR("harmony: tools: %s (line %d)", je.text, je.line);
        return ERR_FORMAT;
    }
    if (!json_is_array(tools)) {
        LOG_ERR("harmony: tools: not a list of tools");
        json_decref(tools);
        return ERR_FORMAT;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        json_decref(tools);
        LOG_ERR("harmony: out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    if (json_array_size(tools))
        fputs("# Tools\n\n## functions\n\nnamespace functions {\n\n", f);
    for (size_t i = 0; rc == 0 && i < json_array_size(tools); i++) {
        json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *name = str_field(fn, "name"), *desc = str_field(fn, "description");
        if (!json_is_object(fn) || !name || !*name) {
            LOG_ERR("harmony: tools[%zu]: not {\"type\": \"function\", \"function\": "
                    "{\"name\": ...}}", i);
            rc = ERR_FORMAT;
            break;
        }
        if (!desc) {
            /* the template concatenates it: a tool without one fails to render there */
            LOG_ERR("harmony: tools[%zu] (%s): no description", i, name);
            rc = ERR_FORMAT;
            break;
        }
        fprintf(f, "// %s\ntype %s = ", desc, name);
        json_t *params = json_object_get(fn, "parameters");
        json_t *props = json_object_get(params, "properties");
        if (!json_is_object(props) || json_object_size(props) == 0) {
            fputs("() => any;\n\n", f);
            continue;
        }
        json_t *req = json_object_get(params, "required");
        fputs("(_: {\n", f);
        const char *pname;
        json_t *p;
        json_object_foreach(props, pname, p) {
            const char *pd = str_field(p, "description");
            if (pd && *pd)
                fprintf(f, "// %s\n", pd);
            bool required = false;
            for (size_t k = 0; json_is_array(req) && k < json_array_size(req); k++)
                required |= json_is_string(json_array_get(req, k)) &&
                            !strcmp(json_string_value(json_array_get(req, k)), pname);
            fprintf(f, "%s%s: ", pname, required ? "" : "?");
            if ((rc = ts_type(f, p, 0)) != 0)
                break;
            json_t *def = json_object_get(p, "default");
            if (def) {
                json_t *en = json_object_get(p, "enum"), *one = json_object_get(p, "oneOf");
                bool en_t = en && !json_is_false(en) && !json_is_null(en) &&
                            !(json_is_array(en) && !json_array_size(en));
                bool one_t = one && !json_is_false(one) && !json_is_null(one) &&
                             !(json_is_array(one) && !json_array_size(one));
                if (en_t || one_t) {
                    /* the template concatenates the default as a string */
                    if (!json_is_string(def)) {
                        LOG_ERR("harmony: tools[%zu] (%s): parameter %s: a non-string default "
                                "beside enum/oneOf", i, name, pname);
                        rc = ERR_FORMAT;
                        break;
                    }
                    fprintf(f, "%s// default: %s", en_t ? ", " : "", json_string_value(def));
                } else {
                    char *js;
                    if ((rc = jinja_json_dumps(def, &js)) != 0)
                        break;
                    fprintf(f, ", // default: %s", js);
                    free(js);
                }
            }
            fputs(",\n", f);
        }
        if (rc == 0)
            fputs("}) => any;\n\n", f);
    }
    if (rc == 0 && json_array_size(tools))
        fputs("} // namespace functions", f);
    json_decref(tools);
    if (fclose(f) != 0 && rc == 0)
        rc = -ENOMEM;
    if (rc) {
        if (rc == -ENOMEM)
            LOG_ERR("harmony: out of memory");
        free(text);
        return rc;
    }
    *out = text;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* rendering                                                                                */

struct render {
    const struct tok *t;
    struct tok__ids ids;
    int32_t start, end, message, channel, constrain, ret, call;
};

static int put_id(struct render *r, int32_t id)
{
    if (tok__ids_push(&r->ids, id) != 0) {
        LOG_ERR("harmony: out of memory");
        return -ENOMEM;
    }
    return 0;
}

static int put_text(struct render *r, const char *s, size_t len)
{
    int32_t *v;
    size_t n;
    int rc = tok_encode(r->t, s, len, false, &v, &n);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = put_id(r, v[i]);
    free(v);
    return rc;
}

static int put_str(struct render *r, const char *s)
{
    return put_text(r, s, strlen(s));
}

/* <|start|>{role}[<|channel|>{channel}[ to={to}]][ <|constrain|>{type}]<|message|>{content}
 * then <|end|> or <|call|> */
static int put_message(struct render *r, const char *role, const char *channel, const char *to,
                       const char *type, const char *content, int32_t last)
{
    int rc;
    if ((rc = put_id(r, r->start)) || (rc = put_str(r, role)))
        return rc;
    if (channel) {
        char hdr[2 * HARMONY_HEADER_MAX];
        int len = snprintf(hdr, sizeof hdr, "%s%s%s%s", channel, to ? " to=" : "",
                           to ? to : "", type ? " " : "");
        if (len < 0 || (size_t)len >= sizeof hdr) {
            LOG_ERR("harmony: the header '%.40s...' is too long", channel);
            return ERR_USAGE;
        }
        if ((rc = put_id(r, r->channel)) || (rc = put_text(r, hdr, (size_t)len)))
            return rc;
    }
    if (type && ((rc = put_id(r, r->constrain)) || (rc = put_str(r, type))))
        return rc;
    if ((rc = put_id(r, r->message)) || (rc = put_str(r, content)))
        return rc;
    return put_id(r, last);
}

static const char *effort_name(enum harmony_effort e)
{
    return e == HARMONY_EFFORT_LOW ? "low" : e == HARMONY_EFFORT_HIGH ? "high" : "medium";
}

int harmony_render(const struct tok *t, const struct harmony_msg *msgs, size_t n,
                   const struct harmony_opts *opts, int32_t **ids, size_t *n_ids)
{
    static const struct harmony_opts none = {0};
    const struct harmony_opts *o = opts ? opts : &none;
    *ids = NULL;
    *n_ids = 0;
    struct render r = {.t = t};
    int rc = specials(t, (int32_t *[7]){&r.start, &r.end, &r.message, &r.channel, &r.constrain,
                                        &r.ret, &r.call});
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].content || (msgs[i].role == HARMONY_TOOL && !msgs[i].name) ||
            (unsigned)msgs[i].role > HARMONY_TOOL) {
            LOG_ERR("harmony: message %zu: %s", i,
                    !msgs[i].content ? "no content" : msgs[i].role == HARMONY_TOOL
                                                          ? "a tool message needs the tool's name"
                                                          : "not a harmony role");
            return ERR_USAGE;
        }
    }
    /* the instructions: given, or the first message's when it is a system/developer one */
    const char *instr = o->instructions;
    size_t first = 0;
    if (!instr && n > 0 && (msgs[0].role == HARMONY_SYSTEM || msgs[0].role == HARMONY_DEVELOPER)) {
        instr = msgs[0].content;
        first = 1;
    }
    /* analysis before the last final answer belongs to finished turns: dropped */
    size_t last_final = 0;
    bool any_final = false;
    for (size_t i = first; i < n; i++)
        if (msgs[i].role == HARMONY_ASSISTANT && !msgs[i].recipient &&
            (!msgs[i].channel || strcmp(msgs[i].channel, "final") == 0))
            last_final = i, any_final = true;

    char *tools = NULL;
    if (o->tools_json && (rc = harmony_tools_text(o->tools_json, &tools)) != 0)
        return rc;
    char *sys = NULL;
    size_t sys_len = 0;
    FILE *f = open_memstream(&sys, &sys_len);
    if (!f) {
        free(tools);
        LOG_ERR("harmony: out of memory");
        return -ENOMEM;
    }
    fprintf(f, "%s\nKnowledge cutoff: %s\n", o->identity ? o->identity : DEFAULT_IDENTITY,
            o->knowledge_cutoff ? o->knowledge_cutoff : DEFAULT_CUTOFF);
    if (o->current_date)
        fprintf(f, "Current date: %s\n", o->current_date);
    fprintf(f, "\nReasoning: %s\n\n" VALID_CHANNELS "%s", effort_name(o->effort),
            o->functions || (tools && *tools) ? "\n" FUNCTIONS_LINE : "");
    if (fclose(f) != 0 || !sys) {
        free(sys);
        free(tools);
        LOG_ERR("harmony: out of memory");
        return -ENOMEM;
    }
    rc = put_message(&r, "system", NULL, NULL, NULL, sys, r.end);
    free(sys);
    if (rc == 0 && (instr || (tools && *tools))) {
        /* "# Instructions\n\n{instr}", then "\n\n# Tools..." when tools are defined */
        size_t il = instr ? strlen(instr) : 0, tl = tools ? strlen(tools) : 0;
        char *dev = malloc(il + tl + 32);
        if (!dev) {
            rc = -ENOMEM;
        } else {
            int k = instr ? snprintf(dev, il + 32, "# Instructions\n\n%s", instr) : 0;
            snprintf(dev + k, tl + 8, "%s%s", k && tl ? "\n\n" : "", tl ? tools : "");
            rc = put_message(&r, "developer", NULL, NULL, NULL, dev, r.end);
            free(dev);
        }
    }
    free(tools);
    for (size_t i = first; rc == 0 && i < n; i++) {
        const struct harmony_msg *m = &msgs[i];
        switch (m->role) {
        case HARMONY_SYSTEM:
        case HARMONY_DEVELOPER:
            rc = put_message(&r, "developer", NULL, NULL, NULL, m->content, r.end);
            break;
        case HARMONY_USER:
            rc = put_message(&r, "user", NULL, NULL, NULL, m->content, r.end);
            break;
        case HARMONY_ASSISTANT: {
            const char *ch = m->channel ? m->channel : "final";
            if (any_final && i < last_final && strcmp(ch, "analysis") == 0)
                break;
            rc = put_message(&r, "assistant", ch, m->recipient, m->content_type, m->content,
                             m->recipient ? r.call : r.end);
            break;
        }
        case HARMONY_TOOL: {
            char role[HARMONY_HEADER_MAX];
            int len = snprintf(role, sizeof role, "%s to=assistant", m->name);
            if (len < 0 || (size_t)len >= sizeof role) {
                LOG_ERR("harmony: message %zu: tool name '%.40s...' is too long", i, m->name);
                rc = ERR_USAGE;
                break;
            }
            rc = put_message(&r, role, m->channel ? m->channel : "commentary", NULL, NULL,
                             m->content, r.end);
            break;
        }
        }
    }
    if (rc == 0 && !o->no_generation_prompt)
        if ((rc = put_id(&r, r.start)) == 0)
            rc = put_str(&r, "assistant");
    if (rc == 0 && !r.ids.v)
        rc = (r.ids.v = malloc(sizeof *r.ids.v)) ? 0 : -ENOMEM;
    if (rc != 0) {
        if (rc == -ENOMEM)
            LOG_ERR("harmony: out of memory");
        free(r.ids.v);
        return rc;
    }
    *ids = r.ids.v;
    *n_ids = r.ids.n;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* parsing                                                                                  */

int harmony_parser_init(struct harmony_parser *p, const struct tok *t)
{
    memset(p, 0, sizeof *p);
    p->tok = t;
    int rc = specials(t, (int32_t *[7]){&p->id_start, &p->id_end, &p->id_message,
                                        &p->id_channel, &p->id_constrain, &p->id_return,
                                        &p->id_call});
    if (rc != 0)
        return rc;
    p->cap = tok_stream_max_out(t);
    if (!(p->out = malloc(p->cap))) {
        LOG_ERR("harmony: out of memory");
        return -ENOMEM;
    }
    p->state = HP_HEADER; /* the prompt ended with <|start|>assistant */
    p->field = HF_ROLE;
    snprintf(p->role, sizeof p->role, "assistant");
    return 0;
}

void harmony_parser_fini(struct harmony_parser *p)
{
    free(p->out);
    p->out = NULL;
}

const char *harmony_parser_role(const struct harmony_parser *p) { return p->role; }
const char *harmony_parser_channel(const struct harmony_parser *p) { return p->chan; }
const char *harmony_parser_recipient(const struct harmony_parser *p) { return p->recipient; }
const char *harmony_parser_content_type(const struct harmony_parser *p) { return p->ctype; }

static int bad(const struct harmony_parser *p, int32_t id, const char *why)
{
    const char *s = tok_token_str(p->tok, id);
    LOG_ERR("harmony: generated token %d '%.40s' %s", id, s ? s : "?", why);
    return ERR_FORMAT;
}

/* Cuts "to=X" out of a header field (keeping X as the recipient) and trims spaces. */
static void take_recipient(char *field, char *recipient)
{
    char *to = strstr(field, "to=");
    if (to && (to == field || to[-1] == ' ')) {
        size_t l = strcspn(to + 3, " ");
        snprintf(recipient, HARMONY_HEADER_MAX, "%.*s", (int)l, to + 3);
        memmove(to, to + 3 + l, strlen(to + 3 + l) + 1);
    }
    size_t b = strspn(field, " "), e = strlen(field);
    while (e > b && field[e - 1] == ' ')
        e--;
    memmove(field, field + b, e - b);
    field[e - b] = '\0';
}

static void open_message(struct harmony_parser *p)
{
    take_recipient(p->role, p->recipient);
    take_recipient(p->chan, p->recipient);
    take_recipient(p->ctype, p->recipient);
    /* "commentary json": the content type without <|constrain|>, as gpt-oss's template writes
     * past tool calls (and the model then copies) */
    char *sp = strchr(p->chan, ' ');
    if (sp) {
        if (!p->ctype[0])
            snprintf(p->ctype, sizeof p->ctype, "%s", sp + 1 + strspn(sp + 1, " "));
        *sp = '\0';
    }
    p->channel = !p->chan[0]                           ? HARMONY_CH_NONE
                 : strcmp(p->chan, "analysis") == 0    ? HARMONY_CH_ANALYSIS
                 : strcmp(p->chan, "commentary") == 0  ? HARMONY_CH_COMMENTARY
                 : strcmp(p->chan, "final") == 0       ? HARMONY_CH_FINAL
                                                       : HARMONY_CH_OTHER;
    tok_stream_init(&p->stream, p->tok);
    p->stream.at_start = false;
    p->state = HP_CONTENT;
}

/* Appends a text token's bytes to the header field being read. */
static int header_text(struct harmony_parser *p, int32_t id)
{
    const char *b;
    size_t l;
    if (tok_piece(p->tok, id, &b, &l) != 0)
        return bad(p, id, "is not in the vocabulary");
    char *f = p->field == HF_ROLE ? p->role : p->field == HF_CHANNEL ? p->chan : p->ctype;
    size_t have = strlen(f);
    if (have + l >= HARMONY_HEADER_MAX || memchr(b, '\0', l))
        return bad(p, id, "makes a message header longer than 255 bytes");
    memcpy(f + have, b, l);
    f[have + l] = '\0';
    return 0;
}

int harmony_parser_push(struct harmony_parser *p, int32_t id, struct harmony_event *ev)
{
    *ev = (struct harmony_event){HARMONY_EV_NONE, p->channel, p->out, 0};
    if (p->state == HP_DONE)
        return bad(p, id, "comes after the generation stopped (<|return|> or <|call|>)");
    if (id == p->id_start) {
        if (p->state != HP_BETWEEN)
            return bad(p, id, "opens a message inside another");
        p->state = HP_HEADER;
        p->field = HF_ROLE;
        p->role[0] = p->chan[0] = p->recipient[0] = p->ctype[0] = '\0';
        p->channel = HARMONY_CH_NONE;
        ev->channel = HARMONY_CH_NONE;
        return 0;
    }
    if (id == p->id_channel || id == p->id_constrain || id == p->id_message) {
        if (p->state != HP_HEADER)
            return bad(p, id, "is a header token outside a message header");
        if (id == p->id_channel) {
            p->field = HF_CHANNEL;
        } else if (id == p->id_constrain) {
            p->field = HF_TYPE;
        } else {
            open_message(p);
            ev->kind = HARMONY_EV_MESSAGE;
            ev->channel = p->channel;
        }
        return 0;
    }
    if (id == p->id_end || id == p->id_return || id == p->id_call) {
        if (p->state != HP_CONTENT)
            return bad(p, id, "ends a message that has no content open");
        if (tok_stream_flush(&p->stream, p->out, p->cap, &ev->len) != 0)
            return ERR_RANGE;
        ev->kind = id == p->id_end ? HARMONY_EV_END : id == p->id_return ? HARMONY_EV_RETURN
                                                                          : HARMONY_EV_CALL;
        p->state = id == p->id_end ? HP_BETWEEN : HP_DONE;
        return 0;
    }
    enum tok_type ty = tok_token_type(p->tok, id);
    if (ty == 0)
        return bad(p, id, "is outside the vocabulary");
    if (ty == TOK_CONTROL)
        return bad(p, id, "is a special token harmony does not place here");
    if (p->state == HP_HEADER)
        return header_text(p, id);
    if (p->state != HP_CONTENT)
        return bad(p, id, "is text outside any message");
    int rc = tok_stream_push(&p->stream, id, p->out, p->cap, &ev->len);
    if (rc != 0)
        return rc;
    ev->kind = ev->len ? HARMONY_EV_TEXT : HARMONY_EV_NONE;
    return 0;
}
