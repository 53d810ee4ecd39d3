/*
 * quant_manifest.c — reads and applies `--quant-manifest` rules (see quant_manifest.h).
 *
 * The manifest is untrusted input (a user's file): every field is type-checked, unknown keys
 * are refused (a misspelt "zero_point" must not silently mean "none"), and each message names
 * the rule index and the field. Fuzzed by tests/fuzz/fuzz_quant_manifest.c.
 */
#include "quant_manifest.h"

#include "err.h"
#include "fmap.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <regex.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define QM_MAX_PATTERN 256
#define QM_MAX_COPIES 4096

struct qm_rule {
    char *pattern;
    regex_t re;
    enum dtype dtype;
    size_t hits;
};

struct quant_manifest {
    size_t n;
    struct qm_rule rules[];
};

/* The manifest's dtype names and what the engine stores for each. */
static const struct {
    const char *name;
    enum dtype dt;
    unsigned group; /* 0: not a block type (group/scale/zero must be absent) */
} qm_dtypes[] = {
    {"int4w", DT_Q4_0, 32}, {"int8w", DT_Q8_0, 32}, {"bf16", DT_BF16, 0},
    {"f16", DT_F16, 0},     {"f32", DT_F32, 0},
    /* GGUF's k-quants: super-blocks of 256 with their own packed sub-block scales, so a
     * manifest can write a Q4_K_M-style mix (q4_k, with q6_k where precision matters) */
    {"q4_k", DT_Q4_K, 256}, {"q5_k", DT_Q5_K, 256}, {"q6_k", DT_Q6_K, 256},
};

static int rule_field_str(json_t *rule, size_t i, const char *what, const char *key,
                          const char **out)
{
    json_t *v = json_object_get(rule, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v)) {
        LOG_ERR("%s: rules[%zu].%s: expected a string", what, i, key);
        return ERR_FORMAT;
    }
    *out = json_string_value(v);
    return 0;
}

/*
 * glibc's regcomp copies a sub-expression once per unit of a "+" or an interval bound, and
 * through nesting those copies multiply ("(a{16}){16}", "a++++...": millions of nodes, an
 * out-of-memory from a 100-byte file). Tensor names are short and simple, so patterns are
 * held to a budget: the product of every quantifier's copy factor (an upper bound on the
 * nesting blow-up) stays under QM_MAX_COPIES, and a quantifier may not follow a quantifier
 * (undefined in POSIX ERE anyway).
 */
static int check_pattern_cost(const char *p, const char *what, size_t i)
{
    if (strlen(p) > QM_MAX_PATTERN) {
        LOG_ERR("%s: rules[%zu].pattern: longer than %d characters", what, i, QM_MAX_PATTERN);
        return ERR_FORMAT;
    }
    unsigned long cost = 1;
    bool after_quant = false;
    for (const char *c = p; *c; c++) {
        if (*c == '\\' && c[1]) {
            c++;
            after_quant = false;
            continue;
        }
        unsigned long f = 0;
        if (*c == '*' || *c == '?') {
            f = 1;
        } else if (*c == '+') {
            f = 2;
        } else if (*c == '{' && c[1] >= '0' && c[1] <= '9') {
            unsigned long b = 0;
            for (c++; (*c >= '0' && *c <= '9') || *c == ','; c++)
                b = *c == ',' ? b : (b > 100000 ? b : b * 10 + (unsigned long)(*c - '0'));
            if (*c != '}')
                c--; /* regcomp reports the malformed interval */
            f = b + 1;
        }
        if (!f) {
            after_quant = false;
            continue;
        }
        if (after_quant) {
            LOG_ERR("%s: rules[%zu].pattern: a quantifier follows a quantifier at offset %zu",
                    what, i, (size_t)(c - p));
            return ERR_FORMAT;
        }
        after_quant = true;
        cost *= f;
        if (cost > QM_MAX_COPIES) {
            LOG_ERR("%s: rules[%zu].pattern: too many repetitions for a tensor-name pattern "
                    "(nested +/{n} expand past %d copies)", what, i, QM_MAX_COPIES);
            return ERR_FORMAT;
        }
    }
    return 0;
}

static int parse_rule(json_t *rule, size_t i, const char *what, struct qm_rule *r)
{
    if (!json_is_object(rule)) {
        LOG_ERR("%s: rules[%zu]: expected an object", what, i);
        return ERR_FORMAT;
    }
    const char *key;
    json_t *val;
    json_object_foreach(rule, key, val) {
        if (strcmp(key, "pattern") && strcmp(key, "dtype") && strcmp(key, "group") &&
            strcmp(key, "scale") && strcmp(key, "zero")) {
            LOG_ERR("%s: rules[%zu]: unknown field '%s' (expected pattern, dtype, group, scale, "
                    "zero)", what, i, key);
            return ERR_FORMAT;
        }
    }
    const char *pattern, *dtype, *scale, *zero;
    int rc;
    if ((rc = rule_field_str(rule, i, what, "pattern", &pattern)) ||
        (rc = rule_field_str(rule, i, what, "dtype", &dtype)) ||
        (rc = rule_field_str(rule, i, what, "scale", &scale)) ||
        (rc = rule_field_str(rule, i, what, "zero", &zero)))
        return rc;
    if (!pattern || !dtype) {
        LOG_ERR("%s: rules[%zu]: missing field '%s'", what, i, pattern ? "dtype" : "pattern");
        return ERR_FORMAT;
    }
    size_t d = 0;
    while (d < sizeof qm_dtypes / sizeof qm_dtypes[0] && strcmp(qm_dtypes[d].name, dtype))
        d++;
    if (d == sizeof qm_dtypes / sizeof qm_dtypes[0]) {
        LOG_ERR("%s: rules[%zu].dtype: '%s' is not one of int4w, int8w, q4_k, q5_k, q6_k, bf16, f16, f32", what, i,
                dtype);
        return ERR_FORMAT;
    }
    json_t *g = json_object_get(rule, "group");
    if (g && !json_is_integer(g)) {
        LOG_ERR("%s: rules[%zu].group: expected an integer", what, i);
        return ERR_FORMAT;
    }
    if (!qm_dtypes[d].group) {
        if (g || scale || zero) {
            LOG_ERR("%s: rules[%zu]: '%s' is not a quantized dtype; it takes no %s", what, i,
                    dtype, g ? "group" : scale ? "scale" : "zero");
            return ERR_FORMAT;
        }
    } else {
        /* int4w runs groups of 32, 64 and 128, with or without a per-group zero point;
         * int8w only q8_0's groups of 32 without one */
        const bool int4 = qm_dtypes[d].dt == DT_Q4_0;
        long long gv = g ? (long long)json_integer_value(g) : (long long)qm_dtypes[d].group;
        if (gv != (long long)qm_dtypes[d].group && !(int4 && (gv == 64 || gv == 128))) {
            LOG_ERR("%s: rules[%zu].group: %s with groups of %lld is not supported (the engine "
                    "runs groups of %s)", what, i, dtype, gv,
                    int4 ? "32, 64 or 128" : qm_dtypes[d].group == 256 ? "256" : "32");
            return ERR_UNSUPPORTED;
        }
        if (scale && strcmp(scale, "per-group")) {
            if (strcmp(scale, "per-channel")) {
                LOG_ERR("%s: rules[%zu].scale: '%s' is not per-group or per-channel", what, i,
                        scale);
                return ERR_FORMAT;
            }
            LOG_ERR("%s: rules[%zu].scale: per-channel scales are not supported for %s (the "
                    "engine stores one scale per group)", what, i, dtype);
            return ERR_UNSUPPORTED;
        }
        bool zp = false;
        if (zero && strcmp(zero, "none")) {
            if (strcmp(zero, "per-group")) {
                LOG_ERR("%s: rules[%zu].zero: '%s' is not none or per-group", what, i, zero);
                return ERR_FORMAT;
            }
            if (!int4) {
                LOG_ERR("%s: rules[%zu].zero: per-group zero points are not supported for %s "
                        "(only int4w has them)", what, i, dtype);
                return ERR_UNSUPPORTED;
            }
            zp = true;
        }
        if (int4) {
            /* common/dtype.h: q4_0 / q4_g64 / q4_g128, or q4z_g32 / q4z_g64 / q4z_g128 */
            static const enum dtype by_group[2][3] = {
                {DT_Q4_0, DT_Q4_G64, DT_Q4_G128}, {DT_Q4Z_G32, DT_Q4Z_G64, DT_Q4Z_G128}};
            r->dtype = by_group[zp][gv == 32 ? 0 : gv == 64 ? 1 : 2];
        }
    }
    if ((rc = check_pattern_cost(pattern, what, i)) != 0)
        return rc;
    int ec = regcomp(&r->re, pattern, REG_EXTENDED | REG_NOSUB);
    if (ec) {
        char msg[128];
        regerror(ec, &r->re, msg, sizeof msg);
        LOG_ERR("%s: rules[%zu].pattern '%s': %s", what, i, pattern, msg);
        return ERR_FORMAT;
    }
    r->pattern = strdup(pattern);
    if (!r->pattern) {
        regfree(&r->re);
        return -ENOMEM;
    }
    if (!qm_dtypes[d].group || qm_dtypes[d].dt != DT_Q4_0)
        r->dtype = qm_dtypes[d].dt;
    return 0;
}

int qm_parse(const char *buf, size_t len, const char *what, struct quant_manifest **out)
{
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        LOG_ERR("%s: not valid JSON: %s (line %d, column %d)", what, jerr.text, jerr.line,
                jerr.column);
        return ERR_FORMAT;
    }
    int rc = ERR_FORMAT;
    struct quant_manifest *m = NULL;
    if (!json_is_object(root)) {
        LOG_ERR("%s: expected a JSON object with \"version\" and \"rules\"", what);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "version") && strcmp(key, "rules") && strcmp(key, "comment")) {
            LOG_ERR("%s: unknown top-level field '%s' (expected version, rules, comment)", what,
                    key);
            goto out;
        }
    }
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver)) {
        LOG_ERR("%s: \"version\": expected the integer 1", what);
        goto out;
    }
    if (json_integer_value(ver) != 1) {
        LOG_ERR("%s: \"version\" %lld is not supported (this clocher reads version 1)", what,
                (long long)json_integer_value(ver));
        rc = ERR_UNSUPPORTED;
        goto out;
    }
    json_t *rules = json_object_get(root, "rules");
    if (!json_is_array(rules) || json_array_size(rules) == 0) {
        LOG_ERR("%s: \"rules\": expected a non-empty array", what);
        goto out;
    }
    size_t n = json_array_size(rules);
    if (n > QM_MAX_RULES) {
        LOG_ERR("%s: %zu rules (at most %d)", what, n, QM_MAX_RULES);
        rc = ERR_RANGE;
        goto out;
    }
    m = calloc(1, sizeof *m + n * sizeof m->rules[0]);
    if (!m) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        rc = parse_rule(json_array_get(rules, i), i, what, &m->rules[i]);
        if (rc)
            goto out;
        m->n++;
    }
    rc = 0;
out:
    json_decref(root);
    if (rc)
        qm_free(m);
    else
        *out = m;
    return rc;
}

int qm_load(const char *path, struct quant_manifest **out)
{
    char *buf;
    size_t len;
    *out = NULL;
    int rc = fmap_read(path, "quant manifest", QM_MAX_BYTES, &buf, &len);
    if (rc)
        return rc;
    rc = qm_parse(buf, len, path, out);
    free(buf);
    return rc;
}

void qm_free(struct quant_manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++) {
        regfree(&m->rules[i].re);
        free(m->rules[i].pattern);
    }
    free(m);
}

int qm_match(struct quant_manifest *m, const char *name, enum dtype *out)
{
    for (size_t i = 0; i < m->n; i++) {
        if (regexec(&m->rules[i].re, name, 0, NULL, 0) == 0) {
            m->rules[i].hits++;
            *out = m->rules[i].dtype;
            return 0;
        }
    }
    return ERR_NOT_FOUND;
}

size_t qm_rule_count(const struct quant_manifest *m) { return m ? m->n : 0; }
size_t qm_rule_hits(const struct quant_manifest *m, size_t i) { return m->rules[i].hits; }
const char *qm_rule_pattern(const struct quant_manifest *m, size_t i) { return m->rules[i].pattern; }
