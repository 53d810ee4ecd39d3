/*
 * quant_manifest.h — per-tensor precision rules for `clocher convert --quant-manifest FILE`.
 *
 * A manifest is a JSON object with an ordered list of rules; a tensor takes the dtype of the
 * first rule whose POSIX extended regex matches its IEBIN name ("tok_embd", "blk.3.attn_q",
 * "output"); a tensor no rule matches keeps what --dtype (or its source) gives it. Norm
 * vectors always stay f32 (they are a few KB and every path normalises in f32). The format is
 * in docs/CONVERT.md; docs/examples/quant-manifest.json is an example.
 *
 *   {"version": 1,
 *    "rules": [{"pattern": "^(tok_embd|output)$", "dtype": "int8w"},
 *              {"pattern": "^blk\\.[0-9]+\\.ffn_", "dtype": "int4w", "group": 32,
 *               "scale": "per-group", "zero": "none"},
 *              {"pattern": ".", "dtype": "bf16"}]}
 *
 * The stored formats are the engine's block types: int8w = Q8_0 (groups of 32, one f16 scale
 * each); int4w = Q4_0 (group 32, the default), q4_g64 / q4_g128 ("group": 64 / 128), or with
 * "zero": "per-group" q4z_g32 / q4z_g64 / q4z_g128 (an f16 scale and an f16 offset per group;
 * common/dtype.h). A rule asking for a group,
 * scale or zero-point layout the engine cannot run is refused when the manifest is read, with
 * the rule's index and field named, rather than silently stored as something else.
 */
#ifndef CLOCHER_CLIENT_QUANT_MANIFEST_H
#define CLOCHER_CLIENT_QUANT_MANIFEST_H

#include "dtype.h"

#include <stddef.h>

#define QM_MAX_RULES 256
#define QM_MAX_BYTES (1u << 20) /* a manifest is a few hundred bytes; refuse anything huge */

struct quant_manifest;

/* Parses a manifest held in memory (`what` names it in messages). 0 and *out, or ERR_FORMAT
 * (not JSON, a missing or mistyped field, a bad regex), ERR_UNSUPPORTED (a layout the engine
 * cannot run, an unknown version), ERR_RANGE (too many rules) — logged naming the rule and the
 * field — or -ENOMEM. */
int qm_parse(const char *buf, size_t len, const char *what, struct quant_manifest **out);

/* Reads and parses the file at `path`; errors as qm_parse() plus the file's own. */
int qm_load(const char *path, struct quant_manifest **out);

void qm_free(struct quant_manifest *m); /* NULL is a no-op */

/* The dtype for tensor `name`: 0 and *out from the first matching rule, or ERR_NOT_FOUND when
 * no rule matches (the caller's default applies). */
int qm_match(struct quant_manifest *m, const char *name, enum dtype *out);

/* Number of rules, and how many tensors rule i has matched so far (for the conversion's
 * summary: a rule that matched nothing is usually a typo in its pattern). */
size_t qm_rule_count(const struct quant_manifest *m);
size_t qm_rule_hits(const struct quant_manifest *m, size_t i);
const char *qm_rule_pattern(const struct quant_manifest *m, size_t i);

#endif
