/*
 * jinja_render.c — a small driver of the chat-template interpreter for the comparison with
 * python3-jinja2 (test_chat_templates.py): `jinja_render TEMPLATE VARS.json` renders TEMPLATE
 * with the variables of VARS.json and writes the text to stdout, byte for byte.
 * Exit 0 rendered; 2 the template was refused at load; 3 the render failed (raise_exception,
 * a type error); 1 usage or I/O. The message goes to stderr. CLOCHER_JINJA_NOW (seconds since
 * the epoch) pins strftime_now's clock.
 */
#include "jinja.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "jinja_render: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (len < cap)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    *n = len;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: jinja_render TEMPLATE VARS.json\n");
        return 1;
    }
    size_t n;
    char *src = slurp(argv[1], &n);
    if (!src)
        return 1;
    json_error_t je;
    json_t *ctx = json_load_file(argv[2], JSON_DECODE_ANY, &je);
    if (!ctx) {
        fprintf(stderr, "jinja_render: %s: %s\n", argv[2], je.text);
        free(src);
        return 1;
    }
    char err[512];
    struct jinja_tpl *t;
    if (jinja_parse(src, n, &t, err, sizeof err)) {
        fprintf(stderr, "refused: %s\n", err);
        free(src);
        json_decref(ctx);
        return 2;
    }
    free(src);
    struct jinja_limits lim = {0};
    const char *now = getenv("CLOCHER_JINJA_NOW");
    if (now)
        lim.now = (time_t)strtoll(now, NULL, 10);
    char *out;
    size_t len;
    int rc = jinja_render(t, ctx, &lim, &out, &len, err, sizeof err);
    jinja_free(t);
    json_decref(ctx);
    if (rc) {
        fprintf(stderr, "render failed: %s\n", err);
        return 3;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    return 0;
}
