/*
 * chat_meta.c — carries a model's chat template and generation defaults through conversion
 * (chat_meta.h) into <out_dir>/chat.ie.json:
 *   {"chat_template": "...", "eos_token_ids": [..], "bos_token_id": n,
 *    "sampling": {"temperature": t, "top_p": p, "top_k": k, "repetition_penalty": r}}
 * every key optional. Only what the source declares is written: a default invented here would
 * be mistaken for the model's.
 */
#include "chat_meta.h"

#include "err.h"
#include "gguf.h"
#include "jinja.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_TEMPLATE (1u << 20) /* bytes: the largest real templates are ~20 KiB */

static int read_text(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        LOG_ERR("open(%s) failed: %s", path, strerror(e));
        return -e;
    }
    char *buf = malloc(MAX_TEMPLATE + 1);
    size_t n = buf ? fread(buf, 1, MAX_TEMPLATE + 1, f) : 0;
    fclose(f);
    if (!buf)
        return -ENOMEM;
    if (n > MAX_TEMPLATE) {
        free(buf);
        LOG_ERR("%s: a chat template over %u bytes", path, MAX_TEMPLATE);
        return ERR_RANGE;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* Sets meta["chat_template"] = text[len], warning when the interpreter would refuse it. */
static int set_template(json_t *meta, const char *text, size_t len, const char *from)
{
    if (len > MAX_TEMPLATE) {
        LOG_ERR("%s: a chat template over %u bytes", from, MAX_TEMPLATE);
        return ERR_RANGE;
    }
    json_t *s = json_stringn(text, len);
    if (!s) {
        LOG_ERR("%s: the chat template is not valid UTF-8", from);
        return ERR_FORMAT;
    }
    char err[256];
    struct jinja_tpl *t;
    if (jinja_parse(text, len, &t, err, sizeof err) == 0)
        jinja_free(t);
    else
        LOG_WARN("%s: the chat template is carried, but Clocher cannot render it (%s): chats "
                 "to this model will be refused", from, err);
    return json_object_set_new(meta, "chat_template", s) ? -ENOMEM : 0;
}

static int from_hf(const char *dir, json_t *meta)
{
    char p[4200];
    int rc;
    struct stat st;
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    if (stat(p, &st) == 0) {
        char *text = NULL;
        size_t n = 0;
        if ((rc = read_text(p, &text, &n)) == 0) {
            rc = set_template(meta, text, n, p);
            free(text);
        }
        if (rc)
            return rc;
    }
    static const char *const json_files[] = {"chat_template.json", "tokenizer_config.json"};
    for (int k = 0; k < 2 && !json_object_get(meta, "chat_template"); k++) {
        snprintf(p, sizeof p, "%s/%s", dir, json_files[k]);
        if (stat(p, &st) != 0)
            continue;
        json_error_t je;
        json_t *j = json_load_file(p, 0, &je);
        if (!j) {
            LOG_ERR("%s:%d: %s", p, je.line, je.text);
            return ERR_FORMAT;
        }
        json_t *ct = json_object_get(j, "chat_template");
        rc = 0;
        if (json_is_array(ct)) {
            /* named templates: the "default" one is what apply_chat_template uses */
            json_t *def = NULL, *it;
            size_t i;
            json_array_foreach(ct, i, it) {
                if (json_is_string(json_object_get(it, "name")) &&
                    !strcmp(json_string_value(json_object_get(it, "name")), "default"))
                    def = json_object_get(it, "template");
            }
            if (!def) {
                LOG_WARN("%s: chat_template lists named templates but none is \"default\": "
                         "none carried", p);
            }
            ct = def;
        }
        if (ct && !json_is_string(ct)) {
            LOG_ERR("%s: chat_template is not a string", p);
            rc = ERR_FORMAT;
        } else if (ct) {
            rc = set_template(meta, json_string_value(ct), json_string_length(ct), p);
        }
        json_decref(j);
        if (rc)
            return rc;
    }
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    if (stat(p, &st) != 0)
        return 0;
    json_error_t je;
    json_t *g = json_load_file(p, 0, &je);
    if (!g) {
        LOG_ERR("%s:%d: %s", p, je.line, je.text);
        return ERR_FORMAT;
    }
    rc = 0;
    json_t *eos = json_object_get(g, "eos_token_id"), *ids = json_array();
    if (!ids) {
        json_decref(g);
        return -ENOMEM;
    }
    if (json_is_integer(eos)) {
        json_array_append(ids, eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *x;
        json_array_foreach(eos, i, x) {
            if (!json_is_integer(x) || json_integer_value(x) < 0) {
                LOG_ERR("%s: eos_token_id[%zu] is not a token id", p, i);
                rc = ERR_FORMAT;
                break;
            }
            json_array_append(ids, x);
        }
    } else if (eos && !json_is_null(eos)) {
        LOG_ERR("%s: eos_token_id is neither an id nor a list of ids", p);
        rc = ERR_FORMAT;
    }
    if (rc == 0 && json_array_size(ids))
        json_object_set(meta, "eos_token_ids", ids);
    json_decref(ids);
    json_t *bos = json_object_get(g, "bos_token_id");
    if (rc == 0 && json_is_integer(bos))
        json_object_set(meta, "bos_token_id", bos);
    static const char *const samp[] = {"temperature", "top_p", "top_k", "repetition_penalty"};
    json_t *s = json_object();
    for (int k = 0; rc == 0 && s && k < 4; k++) {
        json_t *v = json_object_get(g, samp[k]);
        if (!v || json_is_null(v))
            continue;
        if (!json_is_number(v)) {
            LOG_ERR("%s: %s is not a number", p, samp[k]);
            rc = ERR_FORMAT;
        } else {
            json_object_set(s, samp[k], v);
        }
    }
    if (rc == 0 && s && json_object_size(s))
        json_object_set(meta, "sampling", s);
    json_decref(s);
    json_decref(g);
    return rc;
}

static int from_gguf(const char *path, json_t *meta)
{
    struct gguf_file *f;
    int rc = gguf_open(path, &f);
    if (rc)
        return rc;
    struct gguf_str s;
    if (gguf_find_kv(f, "tokenizer.chat_template")) {
        if (gguf_get_str(f, "tokenizer.chat_template", &s) != 0) {
            LOG_ERR("%s: tokenizer.chat_template is not a string", path);
            rc = ERR_FORMAT;
        } else {
            char from[4200];
            snprintf(from, sizeof from, "%s: tokenizer.chat_template", path);
            rc = set_template(meta, s.ptr, (size_t)s.len, from);
        }
    }
    uint32_t id;
    if (rc == 0 && gguf_find_kv(f, "tokenizer.ggml.eos_token_id") &&
        gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &id) == 0)
        json_object_set_new(meta, "eos_token_ids", json_pack("[I]", (json_int_t)id));
    if (rc == 0 && gguf_find_kv(f, "tokenizer.ggml.bos_token_id") &&
        gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &id) == 0)
        json_object_set_new(meta, "bos_token_id", json_integer(id));
    gguf_close(f);
    return rc;
}

int chat_meta_write(const char *src, const char *out_dir)
{
    struct stat st;
    if (stat(src, &st) != 0) {
        int e = errno;
        LOG_ERR("stat(%s) failed: %s", src, strerror(e));
        return -e;
    }
    json_t *meta = json_object();
    if (!meta)
        return -ENOMEM;
    char p[4200];
    int rc;
    snprintf(p, sizeof p, "%s/" CHAT_META_FILE, src);
    if (S_ISDIR(st.st_mode) && access(p, R_OK) == 0) {
        /* an IEBIN directory being re-quantized: its metadata as it is, checked */
        json_error_t je;
        json_decref(meta);
        meta = json_load_file(p, 0, &je);
        if (!meta) {
            LOG_ERR("%s:%d: %s", p, je.line, je.text);
            return ERR_FORMAT;
        }
        rc = 0;
    } else if (S_ISDIR(st.st_mode)) {
        rc = from_hf(src, meta);
    } else {
        rc = from_gguf(src, meta);
    }
    if (rc == 0 && json_object_size(meta)) {
        snprintf(p, sizeof p, "%s/" CHAT_META_FILE, out_dir);
        if (json_dump_file(meta, p, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0) {
            int e = errno;
            LOG_ERR("writing %s failed: %s", p, strerror(e));
            rc = e ? -e : -EIO;
        }
    }
    json_decref(meta);
    return rc;
}
