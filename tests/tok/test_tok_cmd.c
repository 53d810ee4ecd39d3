/*
 * test_tok_cmd.c — `clocher tokenize` / `clocher detokenize`, called in-process (cmd_tokenize
 * and cmd_detokenize, with stdin and stdout redirected to files): output format, BOS rules,
 * every kind of tokenizer path, --help, and each failure's exit code and message.
 */
#include "testutil.h"

#include "cmds.h"
#include "tok.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPM_GGUF "tokenizer/ggml-vocab-llama-spm.gguf"
#define GPT2_GGUF "tokenizer/ggml-vocab-gpt-2.gguf"

struct run {
    int status;
    char *out; /* stdout */
    size_t out_len;
    char *err; /* stderr, plus every logged message */
};

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
}

/* Runs fn(argv) with `in` (len bytes) on stdin; collects stdout, stderr and the log. */
static struct run run_cmd(int (*fn)(int, char **), const char *in, size_t len,
                          const char *const *args)
{
    char *dir = tu_mkdtemp();
    char in_path[4096], out_path[4096], err_path[4096];
    snprintf(in_path, sizeof in_path, "%s/in", dir);
    snprintf(out_path, sizeof out_path, "%s/out", dir);
    snprintf(err_path, sizeof err_path, "%s/err", dir);
    tu_write_file(in_path, in, len);
    char *argv[16];
    int argc = 0;
    for (; args[argc]; argc++)
        argv[argc] = (char *)args[argc];
    argv[argc] = NULL;

    fflush(stdout);
    fflush(stderr);
    int saved[3] = {dup(0), dup(1), dup(2)};
    int fin = open(in_path, O_RDONLY);
    int fout = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int ferr = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fin >= 0 && fout >= 0 && ferr >= 0 && saved[0] >= 0);
    dup2(fin, 0);
    dup2(fout, 1);
    dup2(ferr, 2);
    tu_log_capture_begin();
    struct run r = {0};
    r.status = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 3; i++) {
        dup2(saved[i], i);
        close(saved[i]);
    }
    close(fin);
    close(fout);
    close(ferr);
    size_t err_len;
    r.out = tu_read_file(out_path, &r.out_len);
    char *err = tu_read_file(err_path, &err_len);
    const char *log = tu_log_captured();
    r.err = malloc(err_len + strlen(log) + 1);
    memcpy(r.err, err, err_len);
    strcpy(r.err + err_len, log);
    free(err);
    tu_log_capture_end();
    tu_rmtree(dir);
    free(dir);
    return r;
}

static void expect(struct run r, int status, const char *out, const char *err_needle)
{
    if (r.status != status)
        fail_msg("exit status %d, expected %d; stderr:\n%s", r.status, status, r.err);
    if (out && strcmp(r.out, out) != 0)
        fail_msg("stdout '%s', expected '%s'", r.out, out);
    if (err_needle && !strstr(r.err, err_needle))
        fail_msg("stderr does not mention '%s':\n%s", err_needle, r.err);
    run_free(&r);
}

#define TOKENIZE(in, ...) \
    run_cmd(cmd_tokenize, in, strlen(in), (const char *const[]){"tokenize", __VA_ARGS__, NULL})
#define DETOKENIZE(in, ...) \
    run_cmd(cmd_detokenize, in, strlen(in), (const char *const[]){"detokenize", __VA_ARGS__, NULL})

static void tokenize_spm(void **state)
{
    (void)state;
    const char *f = tu_fixture(SPM_GGUF);
    expect(TOKENIZE("Hello world", "--tokenizer", f), 0, "1 15043 3186\n", NULL);
    expect(TOKENIZE("Hello world", "--tokenizer", f, "--no-bos"), 0, "15043 3186\n", NULL);
    char eq[4200];
    snprintf(eq, sizeof eq, "--tokenizer=%s", f);
    expect(TOKENIZE("Hello", "--no-bos", eq), 0, "15043\n", NULL);
    expect(TOKENIZE("", "--tokenizer", f), 0, "1\n", NULL);
    expect(TOKENIZE("", "--tokenizer", f, "--no-bos"), 0, "\n", NULL);
    /* every other source of the same vocabulary */
    expect(TOKENIZE(" Hello\n", "--tokenizer", tu_fixture("tokenizer/llama2-tokenizer.model")),
           0, "1 29871 15043 13\n", NULL);
    expect(TOKENIZE(" Hello\n", "--tokenizer", tu_fixture("tokenizer/llama2-tokenizer.bin")), 0,
           "1 29871 15043 13\n", NULL);
    /* an IEBIN model directory */
    struct tok *t;
    assert_int_equal(tok_load(f, &t), 0);
    char *json;
    size_t len;
    assert_int_equal(tok_save_json(t, &json, &len), 0);
    char *dir = tu_mkdtemp();
    tu_write_file(tu_path(dir, "tokenizer.ie.json"), json, len);
    expect(TOKENIZE("Hello world", "--tokenizer", dir), 0, "1 15043 3186\n", NULL);
    expect(DETOKENIZE("1 15043 3186 2", "--tokenizer", dir), 0, "Hello world", NULL);
    tu_rmtree(dir);
    free(dir);
    free(json);
    tok_free(t);
}

static void tokenize_gpt2(void **state)
{
    (void)state;
    const char *f = tu_fixture(GPT2_GGUF);
    /* GPT-2 prepends nothing by default */
    expect(TOKENIZE("Hello world", "--tokenizer", f), 0, "15496 995\n", NULL);
    expect(TOKENIZE("Hello world", "--no-bos", "--tokenizer", f), 0, "15496 995\n", NULL);
}

static void detokenize(void **state)
{
    (void)state;
    const char *f = tu_fixture(SPM_GGUF);
    expect(DETOKENIZE("1 15043 3186\n", "--tokenizer", f), 0, "Hello world", NULL);
    expect(DETOKENIZE("\t 15043\n\n3186  ", "--tokenizer", f), 0, "Hello world", NULL);
    expect(DETOKENIZE("", "--tokenizer", f), 0, "", NULL);
    /* an emoji spelled with byte tokens, after the dummy prefix "▁" (dropped) */
    expect(DETOKENIZE("29871 243 162 169 156", "--tokenizer", f), 0, "\xF0\x9F\xA6\x99", NULL);
    /* an incomplete character at the end becomes U+FFFD */
    expect(DETOKENIZE("15043 243 162", "--tokenizer", f), 0, "Hello\xEF\xBF\xBD", NULL);
    expect(DETOKENIZE("15496 995 50256", "--tokenizer", tu_fixture(GPT2_GGUF)), 0, "Hello world",
           NULL);
}

static void help(void **state)
{
    (void)state;
    expect(TOKENIZE("", "--help"), 0, NULL, NULL);
    struct run r = TOKENIZE("", "-h");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: clocher tokenize --tokenizer FILE [--no-bos]"));
    run_free(&r);
    r = DETOKENIZE("", "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: clocher detokenize --tokenizer FILE"));
    run_free(&r);
}

static void usage_errors(void **state)
{
    (void)state;
    const char *f = tu_fixture(SPM_GGUF);
    expect(run_cmd(cmd_tokenize, "", 0, (const char *const[]){"tokenize", NULL}),
           CMD_EXIT_USAGE, "", "--tokenizer FILE is required");
    expect(TOKENIZE("", "--tokenizer"), CMD_EXIT_USAGE, "", "--tokenizer needs a FILE");
    expect(TOKENIZE("", "--tokenizer", f, "--bogus"), CMD_EXIT_USAGE, "",
           "unexpected argument '--bogus'");
    /* --no-bos means nothing to detokenize */
    expect(DETOKENIZE("", "--tokenizer", f, "--no-bos"), CMD_EXIT_USAGE, "",
           "unexpected argument '--no-bos'");
}

static void bad_tokenizer(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    expect(TOKENIZE("x", "--tokenizer", tu_path(dir, "missing.model")), CMD_EXIT_INPUT, "",
           "missing.model");
    /* a directory without tokenizer.ie.json: a model without a tokenizer */
    expect(TOKENIZE("x", "--tokenizer", dir), CMD_EXIT_INPUT, "", "has no tokenizer.ie.json");
    tu_write_file(tu_path(dir, "tokenizer.json"), "{\"model\": 3}", 12);
    expect(DETOKENIZE("1", "--tokenizer", tu_path(dir, "tokenizer.json")), CMD_EXIT_INPUT, "",
           "model is an integer, not an object");
    tu_rmtree(dir);
    free(dir);
}

static void bad_stdin(void **state)
{
    (void)state;
    const char *f = tu_fixture(SPM_GGUF);
    expect(TOKENIZE("ok \xC3(", "--tokenizer", f), CMD_EXIT_FAIL, "",
           "not valid UTF-8: byte 3 (0xC3)");
    expect(DETOKENIZE("1 15043 x3", "--tokenizer", f), CMD_EXIT_FAIL, "",
           "word 3 'x3' is not a token id");
    expect(DETOKENIZE("1 +2", "--tokenizer", f), CMD_EXIT_FAIL, "", "word 2 '+2'");
    expect(DETOKENIZE("1 32000", "--tokenizer", f), CMD_EXIT_FAIL, "",
           "token id 32000 is outside the vocabulary of 32000 tokens");
    expect(DETOKENIZE("-1", "--tokenizer", f), CMD_EXIT_FAIL, "", "token id -1 is outside");
    expect(DETOKENIZE("99999999999999999999", "--tokenizer", f), CMD_EXIT_FAIL, "",
           "is not a token id");
    expect(run_cmd(cmd_detokenize, "1 \0 2", 5,
                   (const char *const[]){"detokenize", "--tokenizer", f, NULL}),
           CMD_EXIT_FAIL, "", "NUL byte at offset 2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tokenize_spm),  cmocka_unit_test(tokenize_gpt2),
        cmocka_unit_test(detokenize),    cmocka_unit_test(help),
        cmocka_unit_test(usage_errors),  cmocka_unit_test(bad_tokenizer),
        cmocka_unit_test(bad_stdin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
