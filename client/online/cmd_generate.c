/*
 * cmd_generate.c — `clocher generate`: one Generate call to clocherd, its text written to
 * stdout as it arrives (or token ids with --print-ids, or one JSON object with --json).
 *
 * Exit codes (cmds.h): 0 the stream ended OK; 1 local failure (stdout closed, out of memory,
 * unreadable prompt); 2 usage; 5 daemon unreachable; 6 the daemon ended the call with an error
 * status, printed with how many tokens had already arrived.
 */
#include "cmds.h"

#include "err.h"
#include "genreq.h"
#include "log.h"
#include "mono.h"
#include "rpc.h"

#include <errno.h>
#include <jansson.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROMPT_MAX (16u << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher generate [OPTIONS] [PROMPT...]\n"
            "\n"
            "Sends PROMPT (the arguments joined by spaces; none or \"-\": all of standard input)\n"
            "to clocherd and writes the generated text as it arrives. A newline follows the\n"
            "text unless it ended with one.\n"
            "\n"
            "output:\n"
            "  --json               print one JSON object at the end instead: text, token_ids,\n"
            "                       finish_reason, usage, timings (or error)\n"
            "  --print-ids          write the token ids (space-separated) instead of the text\n"
            "  -v, --verbose        then a summary on stderr: finish reason, token counts,\n"
            "                       queue/TTFT/TPOT/end-to-end times\n"
            "  -h, --help           this help\n"
            "\n%s\n%s\n"
            "exit status: 0 ok, 1 local failure, 2 usage, 5 daemon unreachable,\n"
            "             6 the daemon ended the call with an error status (printed)\n",
            GENREQ_OPTIONS_HELP, RPC_OPTIONS_HELP);
}

/* All of stdin, NUL-terminated (malloc'd). */
static int read_all(FILE *in, char **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= PROMPT_MAX) {
                free(buf);
                return ERR_RANGE;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, in);
        n += r;
        if (r == 0) {
            if (ferror(in)) {
                int e = errno ? errno : EIO;
                free(buf);
                return -e;
            }
            break;
        }
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* The positional arguments joined by single spaces (malloc'd). */
static char *join_args(int n, char **v)
{
    size_t len = 1;
    for (int i = 0; i < n; i++)
        len += strlen(v[i]) + 1;
    char *s = malloc(len), *p = s;
    if (!s)
        return NULL;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(v[i]);
        if (i)
            *p++ = ' ';
        memcpy(p, v[i], l);
        p += l;
    }
    *p = '\0';
    return s;
}

int cmd_generate(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 0);
    bool json = false, print_ids = false, verbose = false;
    genreq_t *req = genreq_new();
    if (!req) {
        fprintf(stderr, "clocher generate: out of memory\n");
        return CMD_EXIT_FAIL;
    }
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        GENREQ_LONG_OPTIONS,
        {"json", no_argument, NULL, 'j'},
        {"print-ids", no_argument, NULL, 'i'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt, ret = CMD_EXIT_USAGE;
    char err[256];
    char *prompt = NULL;
    struct rpc_client *c = NULL;
    struct genreq_result res;
    genreq_result_init(&res);
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":vh", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "generate", opt, optarg);
        if (rc < 0)
            goto out;
        if (rc > 0)
            continue;
        rc = genreq_opt_set(req, opt, optarg, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "clocher generate: %s\n", err);
            ret = rc == -ENOMEM ? CMD_EXIT_FAIL : CMD_EXIT_USAGE;
            goto out;
        }
        if (rc > 0)
            continue;
        switch (opt) {
        case 'j':
            json = true;
            break;
        case 'i':
            print_ids = true;
            break;
        case 'v':
            verbose = true;
            break;
        case 'h':
            usage(stdout);
            ret = CMD_EXIT_OK;
            goto out;
        default: /* ':' (an option without its value) or '?' */
            rpc_opt_error("generate", opt, argv);
            goto out;
        }
    }
    if (json && print_ids) {
        fprintf(stderr, "clocher generate: --json and --print-ids exclude each other\n");
        goto out;
    }

    /* the prompt: ids from the flag, else the arguments, else standard input */
    int n_pos = argc - optind;
    if (req->input_case == CLOCHER__V1__GENERATE_REQUEST__INPUT_PROMPT_IDS) {
        if (n_pos) {
            fprintf(stderr, "clocher generate: give a text prompt or --prompt-ids, not both\n");
            goto out;
        }
    } else {
        size_t len = 0;
        if (n_pos == 0 || (n_pos == 1 && strcmp(argv[optind], "-") == 0)) {
            if (isatty(STDIN_FILENO))
                fprintf(stderr, "clocher generate: reading the prompt from the terminal "
                                "(end it with Ctrl-D)\n");
            int rc = read_all(stdin, &prompt, &len);
            if (rc < 0) {
                fprintf(stderr, "clocher generate: reading the prompt from standard input: %s\n",
                        rc == ERR_RANGE ? "larger than 16 MiB" : err_str(rc));
                ret = CMD_EXIT_FAIL;
                goto out;
            }
        } else if (!(prompt = join_args(n_pos, argv + optind))) {
            ret = CMD_EXIT_FAIL;
            goto out;
        } else {
            len = strlen(prompt);
        }
        if (len == 0) {
            fprintf(stderr, "clocher generate: empty prompt\n");
            goto out;
        }
        if (genreq_set_prompt(req, prompt, len) < 0) {
            ret = CMD_EXIT_FAIL;
            goto out;
        }
    }

    /* a closed stdout must end the call with a message, not kill us silently */
    signal(SIGPIPE, SIG_IGN);
    int rc = rpc_client_create("generate", &o, &c);
    if (rc < 0) {
        ret = rpc_exit_code(rc);
        goto out;
    }
    struct rpc_stream *s;
    double t0 = mono_sec(), t_first = 0;
    rc = rpc_stream_open(c, RPC_M_GENERATE, &req->base, -1, &s);
    bool out_error = false, ends_nl = true;
    size_t n_msgs = 0;
    while (rc == 0) {
        ProtobufCMessage *m;
        int r = rpc_stream_next(s, &clocher__v1__generate_response__descriptor, &m);
        if (r <= 0) {
            rc = r;
            break;
        }
        Clocher__V1__GenerateResponse *g = (Clocher__V1__GenerateResponse *)m;
        if (!t_first && g->n_token_ids)
            t_first = mono_sec();
        n_msgs++;
        if (genreq_result_add(&res, g) < 0) {
            rc = -ENOMEM;
        } else if (!json) {
            if (print_ids) {
                for (size_t i = 0; i < g->n_token_ids; i++)
                    printf("%s%d", res.n_ids - g->n_token_ids + i ? " " : "", g->token_ids[i]);
                ends_nl = false;
            } else if (g->text && *g->text) {
                fputs(g->text, stdout);
                ends_nl = g->text[strlen(g->text) - 1] == '\n';
            }
            if (fflush(stdout) != 0)
                out_error = true;
        }
        protobuf_c_message_free_unpacked(m, NULL);
        if (out_error || rc < 0) {
            rpc_stream_cancel(s);
            break;
        }
    }
    struct rpc_status st;
    int crc = rpc_stream_close(s, &st);
    if (rc == 0)
        rc = crc;
    double t_end = mono_sec();

    if (out_error) {
        fprintf(stderr, "clocher generate: writing to standard output: %s\n", strerror(errno));
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    if (rc == RPC_ERR_STATUS)
        genreq_result_set_error(&res, st.code, st.message);
    if (json) {
        char *j = genreq_result_json(&res, -1);
        if (j) {
            printf("%s\n", j);
            free(j);
        }
    } else if (!ends_nl) {
        putchar('\n');
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "clocher generate: writing to standard output: %s\n", strerror(errno));
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    if (rc == RPC_ERR_STATUS) {
        fprintf(stderr, "clocher generate: Generate failed after %zu tokens: %s%s%s\n", res.n_ids,
                rpc_status_name(st.code), st.message[0] ? ": " : "", st.message);
        ret = CMD_EXIT_REFUSED;
        goto out;
    }
    if (rc < 0) {
        fprintf(stderr, "clocher generate: %s\n",
                log_last_error()[0] ? log_last_error() : err_str(rc));
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    if (!json && res.logprobs) {
        /* after the text: one line per token, "ID LOGPROB" then its alternatives' */
        printf("logprobs (token id, log-probability; the likeliest alternatives):\n");
        json_t *e;
        size_t k;
        json_array_foreach((json_t *)res.logprobs, k, e) {
            printf("%6lld %10.5f", (long long)json_integer_value(json_object_get(e, "id")),
                   json_real_value(json_object_get(e, "logprob")));
            json_t *t;
            size_t j;
            json_array_foreach(json_object_get(e, "top"), j, t)
                printf("%s%lld:%.5f", j ? " " : "   ", (long long)json_integer_value(
                                                            json_array_get(t, 0)),
                       json_real_value(json_array_get(t, 1)));
            putchar('\n');
        }
    }
    if (!json && !print_ids && res.n_ids && res.text_len == 0)
        fprintf(stderr, "clocher generate: %zu tokens and no text (a model without a tokenizer?); "
                        "--print-ids shows them\n",
                res.n_ids);
    if (verbose) {
        fprintf(stderr, "[finish: %s; tokens: %u prompt (%u cached) + %zu generated",
                genreq_finish_name(res.has_finish ? res.finish_reason : 0), res.prompt_tokens,
                res.cached_prompt_tokens, res.n_ids);
        if (res.has_timings)
            fprintf(stderr, "; server: queue %.1f ms, ttft %.1f ms, tpot %.2f ms, e2e %.1f ms",
                    res.queue_ms, res.ttft_ms, res.tpot_ms, res.e2e_ms);
        fprintf(stderr, "; client: ttft %.1f ms, e2e %.1f ms]\n",
                t_first ? (t_first - t0) * 1e3 : 0.0, (t_end - t0) * 1e3);
    }
    ret = CMD_EXIT_OK;
out:
    rpc_client_destroy(c);
    genreq_result_fini(&res);
    free(prompt);
    genreq_free(req);
    return ret;
}
