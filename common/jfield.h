/*
 * jfield.h — wording of JSON values in the loaders' error messages (IEBIN manifests, LoRA
 * adapter configs, tokenizer files), so every file format reports a bad field the same way:
 * "<file>: <field> is <what it is>, not <what it should be>".
 *
 * Lives in its own library, clocher_jfield (common + jansson), so that common itself keeps no
 * third-party dependency.
 */
#ifndef CLOCHER_COMMON_JFIELD_H
#define CLOCHER_COMMON_JFIELD_H

#include <jansson.h>

#include <stddef.h>

/* The value's kind: "missing" (v == NULL), "an object", "an array", "a string",
 * "an integer", "a real number", "a boolean" or "null". Never NULL. */
const char *jfield_type(const json_t *v);

/*
 * A short rendering of the value: scalars as compact JSON ("1.5", "\"abc\"", "true"), cut to
 * fit `buf` with "..." when longer; arrays and objects as "an array" / "an object"; NULL as
 * "missing"; "?" if jansson cannot encode it. Returns `buf` or a string constant, never NULL.
 * n must be at least 4.
 */
const char *jfield_desc(const json_t *v, char *buf, size_t n);

#endif
