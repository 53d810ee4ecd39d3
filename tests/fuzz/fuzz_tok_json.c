/*
 * fuzz_tok_json.c — libFuzzer harness for the tokenizer JSON reader (worker/tok/tok_jscan.c,
 * yajl) that tokenizer.json and tokenizer.ie.json go through. The input is the document. The
 * reader's result must be consistent: on success a root object, every captured element's
 * strings inside the arena and NUL-terminated, counts bounded by the input; on failure an
 * error code and an empty document. Then both loaders run on it (a vocabulary that loads must
 * encode and decode a text losslessly when byte-level). Any violation aborts.
 */
#include "fuzz.h"

#include "err.h"
#include "log.h"
#include "tok.h"
#include "tok_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum log_level level, const char *msg, void *ud)
{
    (void)level;
    (void)msg;
    (void)ud;
}

static void check_str(const struct tok__jdoc *d, const struct tok__jval *v)
{
    if (v->type != TOK_JT_STRING)
        return;
    if (v->u.off + v->len >= d->arena_len || d->arena[v->u.off + v->len] != '\0' ||
        memchr(d->arena + v->u.off, '\0', v->len))
        abort();
}

static void check_doc(const struct tok__jdoc *d, size_t size)
{
    if (!json_is_object(d->root) || d->arena_len > d->arena_cap || d->arena_len > size + 1)
        abort();
    for (int b = 0; b < TOK_JB_COUNT; b++) {
        const struct tok__jbulk *k = &d->bulk[b];
        if (!k->present && (k->n || k->e))
            abort();
        if (k->n > size) /* each element takes at least one byte */
            abort();
        if (k->n && k->v.type != TOK_JT_ARRAY && k->v.type != TOK_JT_OBJECT)
            abort();
        check_str(d, &k->v);
        for (size_t i = 0; i < k->n; i++) {
            const struct tok__jelem *e = &k->e[i];
            check_str(d, &e->v);
            for (uint32_t j = 0; j < e->n_sub && j < 2; j++)
                check_str(d, &e->sub[j]);
            if (k->v.type == TOK_JT_OBJECT) {
                struct tok__jval key = {TOK_JT_STRING, e->key_len, {.off = e->key_off}};
                check_str(d, &key);
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_sink(quiet, NULL);
    struct tok__jdoc d;
    int rc = tok__json_scan((const char *)data, size, "<fuzz>", &d);
    if (rc == 0) {
        check_doc(&d, size);
        tok__jdoc_free(&d);
    } else if (rc != ERR_FORMAT && rc != ERR_RANGE && rc != -ENOMEM) {
        abort();
    } else if (d.root || d.arena) {
        abort();
    }
    static const char *const kinds[] = {"hf-json", "ie-json"};
    for (int k = 0; k < 2; k++) {
        struct tok *t = NULL;
        if (tok_load_mem(data, size, kinds[k], &t) != 0) {
            if (t)
                abort();
            continue;
        }
        static const char text[] = "Hello world, it's 42 \xC3\xA9t\xC3\xA9\n";
        int32_t *ids;
        size_t n;
        if (tok_encode(t, text, sizeof text - 1, false, &ids, &n) != 0)
            abort();
        char *out;
        size_t len;
        if (tok_decode(t, ids, n, &out, &len) != 0)
            abort();
        if (tok_kind(t) == TOK_BPE && (len != sizeof text - 1 || memcmp(out, text, len)))
            abort();
        free(out);
        free(ids);
        tok_free(t);
    }
    return 0;
}
