/*
 * jinja.h — a Jinja2 interpreter for chat templates (the `chat_template` of tokenizer_config.json
 * and GGUF `tokenizer.chat_template`), written for what real templates use and rendering as
 * Hugging Face's apply_chat_template does: an ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks, the loopcontrols extension, json.dumps-style `tojson`, and the globals
 * raise_exception, strftime_now and namespace. docs/CHAT.md lists what is supported.
 *
 * Templates are untrusted text: a construct the interpreter does not implement (a tag, filter,
 * test, global or method it does not know) is refused by jinja_parse with the construct named,
 * never rendered approximately, and rendering is bounded (output bytes, steps, call depth).
 */
#ifndef CLOCHER_WORKER_TOK_JINJA_H
#define CLOCHER_WORKER_TOK_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct jinja_tpl;

/* Limits of one render; zero fields take the defaults below. */
struct jinja_limits {
    size_t max_output; /* bytes of rendered text (default 8 MiB) */
    uint64_t max_steps; /* statements + loop iterations + expression nodes (default 50M) */
    uint32_t max_depth; /* nested macro calls (default 64) */
    time_t now;         /* the clock of strftime_now; 0: time(NULL) (tests pin it) */
};

/* Parses src[len] (UTF-8 template text) into *out. 0, or a negative code (ERR_FORMAT for a
 * syntax error, ERR_UNSUPPORTED for a construct not implemented) with err[cap] naming it and
 * its line. */
int jinja_parse(const char *src, size_t len, struct jinja_tpl **out, char *err, size_t cap);

void jinja_free(struct jinja_tpl *t);

/* Renders t with the variables of the JSON object ctx (messages, tools, add_generation_prompt,
 * bos_token, ...: a key absent is undefined, a JSON null is none). 0 with *out (malloc'd,
 * NUL-terminated) [*out_len], or a negative code with err[cap]: the template's
 * raise_exception("...") message (ERR_USAGE) or what went wrong (an undefined attribute of an
 * undefined value, a type error, a limit). lim may be NULL. */
int jinja_render(const struct jinja_tpl *t, json_t *ctx, const struct jinja_limits *lim,
                 char **out, size_t *out_len, char *err, size_t cap);

/* json.dumps(v) as Python writes it with HF's tojson defaults (", " and ": " separators, keys
 * in their order, UTF-8 as is, floats in their shortest repr): the text `v|tojson` renders.
 * 0 with *out (malloc'd, NUL-terminated), or -ENOMEM / ERR_RANGE (nested deeper than 200). */
int jinja_json_dumps(json_t *v, char **out);

#endif
