/* gencfg.c — the model's generation defaults: read from chat.ie.json, applied field by field
 * where a request is silent (gencfg.h). */
#include "gencfg.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One number of "sampling": absent is fine; else a number within [lo, hi] (lo excluded when
 * lo_open). */
static int get_num(const char *path, json_t *s, const char *key, double lo, bool lo_open,
                   double hi, bool *has, double *v)
{
    json_t *x = json_object_get(s, key);
    *has = false;
    if (!x || json_is_null(x))
        return 0;
    if (!json_is_number(x)) {
        LOG_ERR("%s: sampling.%s: must be a number, got %s", path, key,
                json_is_string(x) ? "a string" : "another type");
        return ERR_FORMAT;
    }
    /* checked as the float the sampler gets: a top_p of 1e-50 is 0 there */
    double d = strcmp(key, "top_k") == 0 ? json_number_value(x) : (float)json_number_value(x);
    if (!isfinite(d) || d < lo || (lo_open && d == lo) || d > hi) {
        LOG_ERR("%s: sampling.%s: %g is outside %s%g, %g]", path, key, d, lo_open ? "(" : "[",
                lo, hi);
        return ERR_RANGE;
    }
    *has = true;
    *v = d;
    return 0;
}

int gencfg_load(const char *model_dir, struct config_model_sampling *out)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    snprintf(path, sizeof path, "%s/" GENCFG_FILE, model_dir);
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return 0; /* a model without chat metadata: no defaults of its own */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        LOG_ERR("%s: line %d: %s", path, je.line, je.text);
        return ERR_FORMAT;
    }
    json_t *s = json_object_get(root, "sampling");
    int rc = 0;
    if (s && !json_is_object(s)) {
        LOG_ERR("%s: sampling: must be an object", path);
        rc = ERR_FORMAT;
    } else if (s) {
        double t = 0, p = 0, k = 0, r = 0;
        bool hk = false;
        if ((rc = get_num(path, s, "temperature", 0, false, 1e6, &out->has_temperature, &t)) ||
            (rc = get_num(path, s, "top_p", 0, true, 1, &out->has_top_p, &p)) ||
            (rc = get_num(path, s, "top_k", 0, false, 2147483647.0, &hk, &k)) ||
            (rc = get_num(path, s, "repetition_penalty", 0, true, 1e6,
                          &out->has_repetition_penalty, &r)))
            goto out;
        if (hk && k != floor(k)) {
            LOG_ERR("%s: sampling.top_k: %g is not an integer", path, k);
            rc = ERR_FORMAT;
            goto out;
        }
        out->temperature = (float)t;
        out->top_p = (float)p;
        out->has_top_k = hk;
        out->top_k = (uint32_t)k;
        out->repetition_penalty = (float)r;
    }
out:
    json_decref(root);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}
