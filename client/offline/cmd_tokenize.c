/*
 * cmd_tokenize.c — `clocher tokenize` (text on stdin -> token ids on stdout) and
 * `clocher detokenize` (token ids on stdin -> text on stdout), with any tokenizer tok_load
 * reads: .gguf, tokenizer.model, tokenizer.json, tokenizer.bin, tokenizer.ie.json or an IEBIN
 * model directory.
 *
 * Exit codes (cmds.h): 0 ok; 1 the input on stdin is not valid (text that is not UTF-8, a word
 * that is not a token id, an id outside the vocabulary) or stdout cannot be written; 2 usage;
 * 3 the tokenizer is missing or invalid. The reason is always on stderr, once.
 */
#include "cmds.h"

#include "err.h"
#include "log.h"
#include "tok.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct opts {
    const char *tokenizer;
    bool no_bos;
    bool help;
};

/* Parses the flags after the subcommand's name; false (and a message) on a usage error. */
static bool parse(const char *cmd, int argc, char **argv, bool allow_no_bos, struct opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            o->help = true;
        } else if (allow_no_bos && strcmp(a, "--no-bos") == 0) {
            o->no_bos = true;
        } else if (strcmp(a, "--tokenizer") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "clocher %s: --tokenizer needs a FILE\n", cmd);
                return false;
            }
            o->tokenizer = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0) {
            o->tokenizer = a + 12;
        } else {
            fprintf(stderr, "clocher %s: unexpected argument '%s'\n", cmd, a);
            return false;
        }
    }
    if (!o->help && (!o->tokenizer || !*o->tokenizer)) {
        fprintf(stderr, "clocher %s: --tokenizer FILE is required\n", cmd);
        return false;
    }
    return true;
}

static const char tokenizer_help[] =
    "  --tokenizer FILE  a .gguf file, a SentencePiece tokenizer.model, a Hugging Face\n"
    "                    tokenizer.json, a llama2.c tokenizer.bin, a tokenizer.ie.json,\n"
    "                    or an IEBIN model directory (its tokenizer.ie.json)\n";

static const char exit_help[] =
    "exit status: 0 ok, 1 invalid input on stdin or output error, 2 usage,\n"
    "             3 tokenizer missing or invalid\n";

static void tokenize_usage(FILE *f)
{
    fprintf(f,
            "usage: clocher tokenize --tokenizer FILE [--no-bos]\n\n"
            "Reads all of standard input as one UTF-8 text and prints its token ids on one\n"
            "line, separated by spaces.\n\n%s"
            "  --no-bos          do not prepend the BOS token (by default it is prepended when\n"
            "                    the tokenizer's source asks for it: Llama yes, GPT-2 no)\n"
            "  -h, --help        this help\n\n%s",
            tokenizer_help, exit_help);
}

static void detokenize_usage(FILE *f)
{
    fprintf(f,
            "usage: clocher detokenize --tokenizer FILE\n\n"
            "Reads token ids (decimal, separated by white space) from standard input and\n"
            "writes the text they decode to, without adding a newline. Control tokens such as\n"
            "BOS/EOS produce no text; bytes that do not form UTF-8 become U+FFFD.\n\n%s"
            "  -h, --help        this help\n\n%s",
            tokenizer_help, exit_help);
}

/* All of stdin (at most `limit` bytes), malloc'd and NUL-terminated. */
static int read_stdin(const char *cmd, size_t limit, char **out, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        LOG_ERR("%s: out of memory", cmd);
        return -ENOMEM;
    }
    for (;;) {
        if (n == cap) {
            if (cap >= limit) {
                LOG_ERR("%s: standard input is larger than %zu bytes", cmd, limit);
                free(buf);
                return ERR_RANGE;
            }
            cap = cap * 2 > limit ? limit : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                LOG_ERR("%s: out of memory reading standard input", cmd);
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
        }
        ssize_t r = read(STDIN_FILENO, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            LOG_ERR("%s: cannot read standard input: %s", cmd, strerror(e));
            free(buf);
            return -e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static int finish_stdout(const char *cmd)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        LOG_ERR("%s: cannot write standard output: %s", cmd, strerror(errno));
        clearerr(stdout);
        return CMD_EXIT_FAIL;
    }
    return CMD_EXIT_OK;
}

int cmd_tokenize(int argc, char **argv)
{
    struct opts o;
    if (!parse("tokenize", argc, argv, true, &o)) {
        tokenize_usage(stderr);
        return CMD_EXIT_USAGE;
    }
    if (o.help) {
        tokenize_usage(stdout);
        return finish_stdout("tokenize");
    }
    struct tok *t;
    if (tok_load(o.tokenizer, &t) != 0)
        return CMD_EXIT_INPUT;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len, n_ids;
    int status = CMD_EXIT_FAIL;
    if (read_stdin("tokenize", TOK_MAX_TEXT, &text, &len) != 0 ||
        tok_encode(t, text, len, tok_add_bos(t) && !o.no_bos, &ids, &n_ids) != 0)
        goto out;
    for (size_t i = 0; i < n_ids; i++)
        printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    status = finish_stdout("tokenize");
out:
    free(ids);
    free(text);
    tok_free(t);
    return status;
}

/* Parses the whitespace-separated ids of s; false (logged) on a word that is not an id. */
static bool parse_ids(const char *s, const struct tok *t, int32_t **out, size_t *n_out)
{
    size_t cap = 64, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        LOG_ERR("detokenize: out of memory");
        return false;
    }
    const char *p = s;
    for (size_t word = 1;; word++) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\v' || *p == '\f')
            p++;
        if (!*p)
            break;
        const char *start = p;
        while (*p && !(*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\v' ||
                       *p == '\f'))
            p++;
        char *end;
        errno = 0;
        long long v = strtoll(start, &end, 10);
        if (end != p || errno != 0 || start[0] == '+') {
            LOG_ERR("detokenize: word %zu '%.*s' is not a token id", word,
                    (int)(p - start > 32 ? 32 : p - start), start);
            free(ids);
            return false;
        }
        if (v < 0 || v >= (long long)tok_vocab_size(t)) {
            LOG_ERR("detokenize: word %zu: token id %lld is outside the vocabulary of %u "
                    "tokens", word, v, tok_vocab_size(t));
            free(ids);
            return false;
        }
        if (n == cap) {
            int32_t *nv = realloc(ids, 2 * cap * sizeof *ids);
            if (!nv) {
                LOG_ERR("detokenize: out of memory");
                free(ids);
                return false;
            }
            ids = nv;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
    }
    *out = ids;
    *n_out = n;
    return true;
}

int cmd_detokenize(int argc, char **argv)
{
    struct opts o;
    if (!parse("detokenize", argc, argv, false, &o)) {
        detokenize_usage(stderr);
        return CMD_EXIT_USAGE;
    }
    if (o.help) {
        detokenize_usage(stdout);
        return finish_stdout("detokenize");
    }
    struct tok *t;
    if (tok_load(o.tokenizer, &t) != 0)
        return CMD_EXIT_INPUT;
    char *in = NULL, *text = NULL;
    int32_t *ids = NULL;
    size_t len, n_ids, text_len;
    int status = CMD_EXIT_FAIL;
    /* ids are at least two bytes each with their separator */
    if (read_stdin("detokenize", 2 * (size_t)TOK_MAX_TEXT, &in, &len) != 0)
        goto out;
    if (memchr(in, '\0', len)) {
        LOG_ERR("detokenize: standard input contains a NUL byte at offset %zu",
                (size_t)((char *)memchr(in, '\0', len) - in));
        goto out;
    }
    if (!parse_ids(in, t, &ids, &n_ids) || tok_decode(t, ids, n_ids, &text, &text_len) != 0)
        goto out;
    fwrite(text, 1, text_len, stdout);
    status = finish_stdout("detokenize");
out:
    free(text);
    free(ids);
    free(in);
    tok_free(t);
    return status;
}
