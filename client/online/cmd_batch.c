/*
 * cmd_batch.c — `clocher batch`: JSON lines in (one GenerateRequest each), JSON lines out (one
 * result each, in input order), through BatchGenerate calls of at most --chunk requests.
 *
 * A line that is not a valid request is not sent: its output line carries the reason as an
 * INVALID_ARGUMENT error, and the other lines go on. A request the daemon fails (its
 * error_code in the stream) gets an error line too. Chunks run one after the other, so each
 * chunk's lines are written (in order) as soon as its call ends.
 *
 * Exit codes (cmds.h): 0 every request succeeded; 1 some requests failed (their lines say
 * why) or a local failure; 2 usage; 3 the input file cannot be read; 5 daemon unreachable;
 * 6 a BatchGenerate call failed as a whole (its unfinished requests carry that status).
 */
#include "cmds.h"

#include "err.h"
#include "genreq.h"
#include "log.h"
#include "rpc.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES (16u << 20)
#define GRPC_INVALID_ARGUMENT 3
#define GRPC_INTERNAL 13

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher batch [OPTIONS] [INPUT]\n"
            "\n"
            "Reads requests as JSON lines from INPUT (default or \"-\": standard input), sends\n"
            "them to clocherd with BatchGenerate and writes one JSON line per request, in\n"
            "input order. Blank lines are skipped; the others are numbered from 0 (\"index\").\n"
            "\n"
            "input line: a JSON object with the request's fields, e.g.\n"
            "  {\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"temperature\": 0}\n"
            "  {\"prompt_ids\": [1, 403, 407], \"adapter\": \"fr\", \"seed\": 7}\n"
            "  keys: prompt | prompt_ids, model, add_bos, adapter, adapter_scale, max_tokens,\n"
            "  stop (a string or a list), priority, request_id, temperature, top_k, top_p,\n"
            "  min_p, repetition_penalty, seed. The request flags below are defaults for\n"
            "  every line.\n"
            "output line:\n"
            "  {\"index\":0,\"text\":\"...\",\"token_ids\":[...],\"finish_reason\":\"length\",\n"
            "   \"usage\":{...},\"timings\":{...}}   or\n"
            "  {\"index\":1,\"error\":{\"code\":\"INVALID_ARGUMENT\",\"message\":\"...\"}}\n"
            "\n"
            "  -o, --output FILE    write the results to FILE (default: standard output)\n"
            "  --chunk N            at most N requests per BatchGenerate call (default 64)\n"
            "  -h, --help           this help\n"
            "\n%s\n%s\n"
            "exit status: 0 every request succeeded, 1 some failed (see their lines) or a\n"
            "             local failure, 2 usage, 3 INPUT unreadable, 5 daemon unreachable,\n"
            "             6 a BatchGenerate call failed as a whole (status printed)\n",
            GENREQ_OPTIONS_HELP, RPC_OPTIONS_HELP);
}

struct item {
    genreq_t *req;             /* NULL: the line was invalid (res.error_code says why) */
    struct genreq_result res;
};

/* Reads every non-blank line of f into items (requests built over `defaults`). */
static int read_items(FILE *f, const char *name, const genreq_t *defaults, struct item **out,
                      size_t *n_out)
{
    struct item *items = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t l = (size_t)len;
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r' || line[l - 1] == ' ' ||
                     line[l - 1] == '\t'))
            l--;
        size_t b = 0;
        while (b < l && (line[b] == ' ' || line[b] == '\t'))
            b++;
        if (b == l)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            struct item *ni = realloc(items, nc * sizeof *ni);
            if (!ni) {
                rc = -ENOMEM;
                break;
            }
            items = ni;
            cap = nc;
        }
        struct item *it = &items[n++];
        it->req = NULL;
        genreq_result_init(&it->res);
        char why[512], msg[600];
        if (l > LINE_MAX_BYTES) {
            snprintf(why, sizeof why, "longer than %u bytes", LINE_MAX_BYTES);
            rc = ERR_RANGE;
        } else {
            rc = genreq_from_json(line + b, l - b, defaults, &it->req, why, sizeof why);
        }
        if (rc == -ENOMEM)
            break;
        if (rc < 0) {
            snprintf(msg, sizeof msg, "%s line %zu: %s", name, lineno, why);
            if (genreq_result_set_error(&it->res, GRPC_INVALID_ARGUMENT, msg) < 0) {
                rc = -ENOMEM;
                break;
            }
            rc = 0;
        }
    }
    free(line);
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "clocher batch: reading %s: %s\n", name, strerror(errno));
        rc = -EIO;
    }
    *out = items;
    *n_out = n;
    return rc;
}

/*
 * One BatchGenerate call for items[idx[0..k)]. 0 when the call ended OK (requests may still
 * have failed one by one), RPC_ERR_STATUS (st says why), or another negative code.
 */
static int run_chunk(struct rpc_client *c, struct item *items, const size_t *idx, size_t k,
                     struct rpc_status *st)
{
    Clocher__V1__BatchGenerateRequest breq = CLOCHER__V1__BATCH_GENERATE_REQUEST__INIT;
    genreq_t **reqs = malloc(k * sizeof *reqs);
    if (!reqs)
        return -ENOMEM;
    for (size_t i = 0; i < k; i++)
        reqs[i] = items[idx[i]].req;
    breq.requests = reqs;
    breq.n_requests = k;
    struct rpc_stream *s;
    int rc = rpc_stream_open(c, RPC_M_BATCH, &breq.base, -1, &s);
    free(reqs); /* packed by now */
    while (rc == 0) {
        ProtobufCMessage *m;
        int r = rpc_stream_next(s, &clocher__v1__batch_generate_response__descriptor, &m);
        if (r <= 0) {
            rc = r;
            break;
        }
        Clocher__V1__BatchGenerateResponse *b = (Clocher__V1__BatchGenerateResponse *)m;
        if (!b->has_index || b->index >= k) {
            LOG_ERR("BatchGenerate: a response for request %u of a batch of %zu",
                    b->has_index ? b->index : 0, k);
            rc = ERR_FORMAT;
        } else {
            struct genreq_result *res = &items[idx[b->index]].res;
            if (b->has_error_code && b->error_code != 0)
                rc = genreq_result_set_error(res, b->error_code,
                                             b->error_message ? b->error_message : "");
            else if (b->response)
                rc = genreq_result_add(res, b->response);
        }
        protobuf_c_message_free_unpacked(m, NULL);
        if (rc < 0)
            rpc_stream_cancel(s);
    }
    int crc = rpc_stream_close(s, st);
    return rc < 0 ? rc : crc;
}

/* Writes items [from, to) as JSON lines. */
static int write_items(FILE *out, const struct item *items, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        char *j = genreq_result_json(&items[i].res, (long)i);
        if (!j)
            return -ENOMEM;
        fputs(j, out);
        fputc('\n', out);
        free(j);
    }
    return fflush(out) == 0 ? 0 : -errno;
}

int cmd_batch(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 0);
    const char *out_path = NULL, *in_path = "-";
    unsigned long chunk = 64;
    genreq_t *defaults = genreq_new();
    if (!defaults)
        return CMD_EXIT_FAIL;
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        GENREQ_LONG_OPTIONS,
        {"output", required_argument, NULL, 'o'},
        {"chunk", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt, ret = CMD_EXIT_USAGE;
    char err[256];
    FILE *in = NULL, *out = NULL;
    struct item *items = NULL;
    size_t n = 0, *idx = NULL;
    struct rpc_client *c = NULL;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "batch", opt, optarg);
        if (rc < 0)
            goto done;
        if (rc > 0)
            continue;
        rc = genreq_opt_set(defaults, opt, optarg, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "clocher batch: %s\n", err);
            goto done;
        }
        if (rc > 0)
            continue;
        switch (opt) {
        case 'o':
            out_path = optarg;
            break;
        case 'c': {
            char *end;
            errno = 0;
            chunk = strtoul(optarg, &end, 10);
            if (errno || end == optarg || *end || chunk == 0 || chunk > 65536 ||
                optarg[0] == '-') {
                fprintf(stderr, "clocher batch: --chunk: expected 1..65536, got '%s'\n", optarg);
                goto done;
            }
            break;
        }
        case 'h':
            usage(stdout);
            ret = CMD_EXIT_OK;
            goto done;
        default: /* ':' (an option without its value) or '?' */
            rpc_opt_error("batch", opt, argv);
            goto done;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "clocher batch: one INPUT file at most, got '%s' too\n", argv[optind + 1]);
        goto done;
    }
    if (defaults->input_case != CLOCHER__V1__GENERATE_REQUEST__INPUT__NOT_SET) {
        fprintf(stderr, "clocher batch: --prompt-ids: prompts come from the input lines\n");
        goto done;
    }
    if (optind < argc)
        in_path = argv[optind];
    if (strcmp(in_path, "-") == 0) {
        in = stdin;
    } else if (!(in = fopen(in_path, "r"))) {
        fprintf(stderr, "clocher batch: %s: %s\n", in_path, strerror(errno));
        ret = CMD_EXIT_INPUT;
        goto done;
    }
    int rc = read_items(in, in == stdin ? "stdin" : in_path, defaults, &items, &n);
    if (rc < 0) {
        if (rc == -ENOMEM)
            fprintf(stderr, "clocher batch: out of memory reading the input\n");
        ret = rc == -EIO ? CMD_EXIT_INPUT : CMD_EXIT_FAIL;
        goto done;
    }
    if (out_path && !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "clocher batch: %s: %s\n", out_path, strerror(errno));
        ret = CMD_EXIT_FAIL;
        goto done;
    }
    if (!out)
        out = stdout;
    signal(SIGPIPE, SIG_IGN);

    size_t n_valid = 0;
    for (size_t i = 0; i < n; i++)
        n_valid += items[i].req != NULL;
    if (n_valid && (rc = rpc_client_create("batch", &o, &c)) < 0) {
        ret = rpc_exit_code(rc);
        goto done;
    }
    if (!(idx = malloc((chunk < n ? chunk : n ? n : 1) * sizeof *idx))) {
        ret = CMD_EXIT_FAIL;
        goto done;
    }
    bool call_failed = false, local_failed = false;
    size_t written = 0, next = 0;
    while (next < n) {
        /* the next chunk: up to `chunk` valid requests, and the invalid lines among them */
        size_t k = 0, end = next;
        while (end < n && k < chunk) {
            if (items[end].req)
                idx[k++] = end;
            end++;
        }
        if (k) {
            struct rpc_status st = {0};
            rc = run_chunk(c, items, idx, k, &st);
            if (rc == RPC_ERR_STATUS) {
                rpc_print_status("batch", "BatchGenerate", &st);
                call_failed = true;
            } else if (rc < 0) {
                fprintf(stderr, "clocher batch: BatchGenerate: %s\n",
                        log_last_error()[0] ? log_last_error() : err_str(rc));
                local_failed = true;
                st.code = GRPC_INTERNAL;
                snprintf(st.message, sizeof st.message, "client: %s", err_str(rc));
            }
            for (size_t i = 0; i < k; i++) {
                struct genreq_result *r = &items[idx[i]].res;
                if (r->error_code || r->has_finish)
                    continue;
                if (rc < 0)
                    genreq_result_set_error(r, st.code, st.message);
                else
                    genreq_result_set_error(r, GRPC_INTERNAL,
                                            "the call ended without a result for this request");
            }
        }
        if ((rc = write_items(out, items, written, end)) < 0) {
            fprintf(stderr, "clocher batch: writing %s: %s\n", out_path ? out_path : "stdout",
                    err_str(rc));
            ret = CMD_EXIT_FAIL;
            goto done;
        }
        written = end;
        next = end;
    }
    size_t n_failed = 0;
    for (size_t i = 0; i < n; i++)
        n_failed += items[i].res.error_code != 0;
    if (n_failed)
        fprintf(stderr, "clocher batch: %zu of %zu requests failed (see their \"error\")\n",
                n_failed, n);
    ret = call_failed ? CMD_EXIT_REFUSED : local_failed || n_failed ? CMD_EXIT_FAIL : CMD_EXIT_OK;
done:
    rpc_client_destroy(c);
    for (size_t i = 0; i < n; i++) {
        genreq_free(items[i].req);
        genreq_result_fini(&items[i].res);
    }
    free(items);
    free(idx);
    if (in && in != stdin)
        fclose(in);
    if (out && out != stdout && fclose(out) != 0 && ret == CMD_EXIT_OK) {
        fprintf(stderr, "clocher batch: writing %s: %s\n", out_path, strerror(errno));
        ret = CMD_EXIT_FAIL;
    }
    genreq_free(defaults);
    return ret;
}
