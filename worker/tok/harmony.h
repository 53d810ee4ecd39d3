/*
 * harmony.h — OpenAI's harmony chat format (gpt-oss) over an o200k_harmony tokenizer: rendering
 * a conversation to prompt ids, and a streaming parser of generated ids that separates the
 * `analysis`, `commentary` and `final` channels and reports where generation stops
 * (<|return|>, <|call|>). Format: docs/TOKENIZER.md "Harmony"; spec: gpt-oss.md §5.
 *
 * Rendering never lets message text produce special tokens: text is encoded as plain text and
 * the structural tokens are inserted by id, so "<|end|>" typed by a user stays text.
 *
 * NOTES: the tokenizer must hold the harmony specials (<|start|>, <|end|>, <|message|>,
 * <|channel|>, <|constrain|>, <|return|>, <|call|>): ERR_UNSUPPORTED (logged) otherwise.
 * A parser belongs to one generated sequence.
 */
#ifndef CLOCHER_WORKER_TOK_HARMONY_H
#define CLOCHER_WORKER_TOK_HARMONY_H

#include "tok.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum harmony_role {
    HARMONY_SYSTEM = 0, /* its content becomes the developer instructions (as gpt-oss's
                         * chat template does); the system header itself comes from opts */
    HARMONY_DEVELOPER,
    HARMONY_USER,
    HARMONY_ASSISTANT,
    HARMONY_TOOL,       /* a tool's answer: rendered with the tool's name as the role */
};

enum harmony_effort { HARMONY_EFFORT_MEDIUM = 0, HARMONY_EFFORT_LOW, HARMONY_EFFORT_HIGH };

struct harmony_msg {
    enum harmony_role role;
    const char *content;      /* UTF-8, NUL-terminated */
    const char *channel;      /* assistant: "analysis", "commentary" or "final" (NULL: final);
                               * tool: NULL means "commentary" */
    const char *recipient;    /* assistant tool call: "functions.get_weather" (ends the message
                               * with <|call|>); NULL otherwise */
    const char *content_type; /* assistant tool call: "json" after <|constrain|>; or NULL */
    const char *name;         /* tool: its name, "functions.get_weather" (required) */
};

struct harmony_opts {
    enum harmony_effort effort;
    const char *identity;          /* NULL: "You are ChatGPT, a large language model trained
                                    * by OpenAI." */
    const char *knowledge_cutoff;  /* NULL: "2024-06" */
    const char *current_date;      /* "2025-06-28"; NULL: the line is left out */
    const char *instructions;      /* developer instructions; NULL: those of the first
                                    * system/developer message, if any */
    bool functions;                /* tools are defined: the system message says where their
                                    * calls go (implied by tools_json) */
    const char *tools_json;        /* the function tools, as JSON text of an OpenAI-style array
                                    * [{"type": "function", "function": {"name", "description",
                                    * "parameters"}}]: the developer message gets its "# Tools"
                                    * block (harmony_tools_text); NULL or []: none */
    bool no_generation_prompt;     /* leave out the final <|start|>assistant */
};

/* Renders the conversation to prompt ids (malloc'd). Assistant analysis messages of turns
 * that ended on a final message are dropped (harmony keeps chain of thought only across tool
 * calls of the current turn). ERR_USAGE (logged) for a message the format cannot express
 * (a tool without a name, a NULL content). */
int harmony_render(const struct tok *t, const struct harmony_msg *msgs, size_t n,
                   const struct harmony_opts *opts, int32_t **ids, size_t *n_ids);

/* The "# Tools" section of the developer message for the function tools tools_json (as in
 * harmony_opts): "# Tools\n\n## functions\n\nnamespace functions {\n\n// {description}\n
 * type {name} = (_: {\n{params as TypeScript},\n}) => any;\n\n...} // namespace functions",
 * written as gpt-oss's own chat template writes it (docs/TOKENIZER.md "Harmony"). *out is
 * malloc'd ("" when there are no tools). ERR_FORMAT (logged, naming the tool and field) for
 * tools that are not such an array. */
int harmony_tools_text(const char *tools_json, char **out);

enum harmony_channel {
    HARMONY_CH_NONE = 0,   /* no message open */
    HARMONY_CH_ANALYSIS,
    HARMONY_CH_COMMENTARY,
    HARMONY_CH_FINAL,
    HARMONY_CH_OTHER,      /* a channel name the format does not define */
};

enum harmony_ev {
    HARMONY_EV_NONE = 0,    /* the id was consumed (header, or text held as partial UTF-8) */
    HARMONY_EV_TEXT,        /* text of the open message's channel */
    HARMONY_EV_MESSAGE,     /* <|message|>: a message opens (channel, recipient known) */
    HARMONY_EV_END,         /* <|end|>: the message closed; more may follow */
    HARMONY_EV_RETURN,      /* <|return|>: the final answer is done: stop */
    HARMONY_EV_CALL,        /* <|call|>: a tool call is complete: stop, run the tool */
};

struct harmony_event {
    enum harmony_ev kind;
    enum harmony_channel channel; /* of the message the id belongs to */
    const char *text;             /* complete UTF-8 produced by this id (TEXT, and the tail
                                   * flushed at END/RETURN/CALL); valid until the next push */
    size_t len;
};

#define HARMONY_HEADER_MAX 256 /* bytes of one header (role, channel, recipient, type) */

struct harmony_parser {
    const struct tok *tok;
    int32_t id_start, id_end, id_message, id_channel, id_constrain, id_return, id_call;
    enum { HP_HEADER, HP_CONTENT, HP_BETWEEN, HP_DONE } state;
    enum { HF_ROLE, HF_CHANNEL, HF_TYPE } field; /* the header part being read */
    char role[HARMONY_HEADER_MAX], chan[HARMONY_HEADER_MAX], recipient[HARMONY_HEADER_MAX];
    char ctype[HARMONY_HEADER_MAX];
    enum harmony_channel channel;
    struct tok_stream stream;
    char *out; /* [tok_stream_max_out] */
    size_t cap;
};

/* Starts parsing what a model generates after a prompt that ends with <|start|>assistant
 * (harmony_render's generation prompt): the first ids are the assistant's header. */
int harmony_parser_init(struct harmony_parser *p, const struct tok *t);
void harmony_parser_fini(struct harmony_parser *p);
/* Feeds one generated id. ERR_FORMAT (logged) for an id the format does not allow where it
 * comes (text outside a message, a header too long, anything after a stop); the parser then
 * stays where it was. */
int harmony_parser_push(struct harmony_parser *p, int32_t id, struct harmony_event *ev);
/* The open (or last) message's role ("assistant"), channel name ("analysis", or another for
 * HARMONY_CH_OTHER), recipient ("functions.get_weather", "" when none) and content type. */
const char *harmony_parser_role(const struct harmony_parser *p);
const char *harmony_parser_channel(const struct harmony_parser *p);
const char *harmony_parser_recipient(const struct harmony_parser *p);
const char *harmony_parser_content_type(const struct harmony_parser *p);

#endif
