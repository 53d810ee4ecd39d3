/*
 * cmd_chat.c — `clocher chat`: one Generate call in its chat form (messages in, the server
 * renders them with its model's template), the reply written to stdout as it arrives with
 * each change of channel marked on a line of its own ("[analysis]", "[final]", ...), so the
 * model's reasoning is never mistaken for its answer. Messages come from --message flags
 * (ROLE=TEXT, in order) or a JSON file (--messages FILE: [{"role", "content", "channel",
 * "recipient"}, ...] or {"messages": [...]}).
 *
 * Exit codes as `clocher generate` (cmds.h): 0 ok, 1 local failure, 2 usage, 5 daemon
 * unreachable, 6 the daemon ended the call with an error status.
 */
#include "cmds.h"

#include "err.h"
#include "genreq.h"
#include "log.h"
#include "rpc.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAT_MAX_MSGS 256u /* the server's limit (SHM_MAX_CHAT_MSGS) */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher chat [OPTIONS] (--message ROLE=TEXT ... | --messages FILE)\n"
            "\n"
            "Sends a conversation to clocherd; the server renders it with its model's chat\n"
            "template (harmony for gpt-oss) and the reply is written as it arrives, each\n"
            "change of channel on a line of its own: [analysis], [commentary], [final].\n"
            "\n"
            "conversation:\n"
            "  --message ROLE=TEXT  one message (repeatable, in order); ROLE: system,\n"
            "                       developer, user, assistant, tool\n"
            "  --messages FILE      a JSON array of {\"role\", \"content\", \"channel\",\n"
            "                       \"recipient\"} (or {\"messages\": [...]}); \"-\" = stdin\n"
            "  --reasoning-effort low|medium|high   (harmony models; default medium)\n"
            "  --final-only         write the final channel's text only\n"
            "  -h, --help           this help\n"
            "\n%s\n%s\n"
            "exit status: 0 ok, 1 local failure, 2 usage, 5 daemon unreachable,\n"
            "             6 the daemon ended the call with an error status (printed)\n",
            GENREQ_OPTIONS_HELP, RPC_OPTIONS_HELP);
}

/* Appends one message (strings copied) to req's chat; ERR_RANGE past the limit. */
static int add_msg(genreq_t *req, const char *role, const char *content, const char *channel,
                   const char *recipient)
{
    Clocher__V1__Chat *ch = req->chat;
    if (ch->n_messages == CHAT_MAX_MSGS)
        return ERR_RANGE;
    Clocher__V1__ChatMessage **v = realloc(ch->messages, (ch->n_messages + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    ch->messages = v;
    Clocher__V1__ChatMessage *m = malloc(sizeof *m);
    if (!m)
        return -ENOMEM;
    clocher__v1__chat_message__init(m);
    v[ch->n_messages++] = m; /* freed with req from here on */
    if (!(m->role = strdup(role)) || !(m->content = strdup(content)) ||
        (channel && !(m->channel = strdup(channel))) ||
        (recipient && !(m->recipient = strdup(recipient))))
        return -ENOMEM;
    return 0;
}

/* The messages of a JSON file (err names what is wrong). */
static int load_messages(genreq_t *req, const char *path, char *err, size_t cap)
{
    json_error_t je;
    json_t *root = strcmp(path, "-") == 0 ? json_loadf(stdin, 0, &je) : json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, cap, "%s: line %d: %s", path, je.line, je.text);
        return ERR_FORMAT;
    }
    json_t *arr = json_is_object(root) ? json_object_get(root, "messages") : root;
    int rc = 0;
    if (!json_is_array(arr)) {
        snprintf(err, cap, "%s: not an array of messages (nor {\"messages\": [...]})", path);
        rc = ERR_FORMAT;
    }
    size_t i;
    json_t *m;
    json_array_foreach(rc ? NULL : arr, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (!role || !content) {
            snprintf(err, cap, "%s: messages[%zu]: needs string \"role\" and \"content\"", path, i);
            rc = ERR_FORMAT;
            break;
        }
        rc = add_msg(req, role, content, json_string_value(json_object_get(m, "channel")),
                     json_string_value(json_object_get(m, "recipient")));
        if (rc < 0) {
            snprintf(err, cap, "%s: %s", path, rc == ERR_RANGE ? "more than 256 messages"
                                                                : "out of memory");
            break;
        }
    }
    json_decref(root);
    return rc;
}

static const char *channel_name(int c)
{
    switch (c) {
    case CLOCHER__V1__CHANNEL__CHANNEL_ANALYSIS: return "analysis";
    case CLOCHER__V1__CHANNEL__CHANNEL_COMMENTARY: return "commentary";
    case CLOCHER__V1__CHANNEL__CHANNEL_FINAL: return "final";
    case CLOCHER__V1__CHANNEL__CHANNEL_OTHER: return "other";
    default: return NULL;
    }
}

int cmd_chat(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 0);
    bool final_only = false;
    genreq_t *req = genreq_new();
    Clocher__V1__Chat *chat = req ? malloc(sizeof *chat) : NULL;
    if (!chat) {
        fprintf(stderr, "clocher chat: out of memory\n");
        genreq_free(req);
        return CMD_EXIT_FAIL;
    }
    clocher__v1__chat__init(chat);
    req->input_case = CLOCHER__V1__GENERATE_REQUEST__INPUT_CHAT;
    req->chat = chat;
    enum { O_MESSAGE = 0x300, O_MESSAGES, O_EFFORT, O_FINAL_ONLY };
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        GENREQ_LONG_OPTIONS,
        {"message", required_argument, NULL, O_MESSAGE},
        {"messages", required_argument, NULL, O_MESSAGES},
        {"reasoning-effort", required_argument, NULL, O_EFFORT},
        {"final-only", no_argument, NULL, O_FINAL_ONLY},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt, ret = CMD_EXIT_USAGE;
    char err[512];
    struct rpc_client *c = NULL;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "chat", opt, optarg);
        if (rc < 0)
            goto out;
        if (rc > 0)
            continue;
        if (opt == GENREQ_OPT_BASE + GENREQ_PROMPT_IDS || opt == GENREQ_OPT_BASE + GENREQ_NO_BOS) {
            fprintf(stderr, "clocher chat: --prompt-ids and --no-bos are for generate\n");
            goto out;
        }
        rc = genreq_opt_set(req, opt, optarg, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "clocher chat: %s\n", err);
            ret = rc == -ENOMEM ? CMD_EXIT_FAIL : CMD_EXIT_USAGE;
            goto out;
        }
        if (rc > 0)
            continue;
        switch (opt) {
        case O_MESSAGE: {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg) {
                fprintf(stderr, "clocher chat: --message \"%s\": give ROLE=TEXT\n", optarg);
                goto out;
            }
            char role[32];
            snprintf(role, sizeof role, "%.*s", (int)(eq - optarg), optarg);
            if ((rc = add_msg(req, role, eq + 1, NULL, NULL)) < 0) {
                fprintf(stderr, "clocher chat: %s\n",
                        rc == ERR_RANGE ? "more than 256 messages" : "out of memory");
                ret = rc == ERR_RANGE ? CMD_EXIT_USAGE : CMD_EXIT_FAIL;
                goto out;
            }
            break;
        }
        case O_MESSAGES:
            if (load_messages(req, optarg, err, sizeof err) < 0) {
                fprintf(stderr, "clocher chat: --messages %s\n", err);
                goto out;
            }
            break;
        case O_EFFORT:
            chat->has_reasoning_effort = 1;
            if (strcmp(optarg, "low") == 0)
                chat->reasoning_effort = CLOCHER__V1__REASONING_EFFORT__REASONING_EFFORT_LOW;
            else if (strcmp(optarg, "high") == 0)
                chat->reasoning_effort = CLOCHER__V1__REASONING_EFFORT__REASONING_EFFORT_HIGH;
            else if (strcmp(optarg, "medium") == 0)
                chat->reasoning_effort = CLOCHER__V1__REASONING_EFFORT__REASONING_EFFORT_MEDIUM;
            else {
                fprintf(stderr, "clocher chat: --reasoning-effort \"%s\": low, medium or high\n",
                        optarg);
                goto out;
            }
            break;
        case O_FINAL_ONLY:
            final_only = true;
            break;
        case 'h':
            usage(stdout);
            ret = CMD_EXIT_OK;
            goto out;
        default:
            rpc_opt_error("chat", opt, argv);
            goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "clocher chat: unexpected argument \"%s\" (messages go in --message)\n",
                argv[optind]);
        goto out;
    }
    if (chat->n_messages == 0) {
        fprintf(stderr, "clocher chat: no messages (give --message ROLE=TEXT or --messages)\n");
        goto out;
    }

    signal(SIGPIPE, SIG_IGN);
    int rc = rpc_client_create("chat", &o, &c);
    if (rc < 0) {
        ret = rpc_exit_code(rc);
        goto out;
    }
    struct rpc_stream *s;
    rc = rpc_stream_open(c, RPC_M_GENERATE, &req->base, -1, &s);
    int shown = -1, finish = 0;
    size_t n_ids = 0;
    bool ends_nl = true, out_error = false;
    while (rc == 0) {
        ProtobufCMessage *m;
        int r = rpc_stream_next(s, &clocher__v1__generate_response__descriptor, &m);
        if (r <= 0) {
            rc = r;
            break;
        }
        Clocher__V1__GenerateResponse *g = (Clocher__V1__GenerateResponse *)m;
        n_ids += g->n_token_ids;
        if (g->has_finish_reason)
            finish = g->finish_reason;
        int ch = g->has_channel ? (int)g->channel : 0;
        bool show = !final_only || ch == CLOCHER__V1__CHANNEL__CHANNEL_FINAL || ch == 0;
        if (show && g->text && *g->text) {
            if (!final_only && ch != shown && channel_name(ch)) {
                printf("%s[%s]\n", ends_nl ? "" : "\n", channel_name(ch));
                shown = ch;
            }
            fputs(g->text, stdout);
            ends_nl = g->text[strlen(g->text) - 1] == '\n';
            if (fflush(stdout) != 0)
                out_error = true;
        }
        protobuf_c_message_free_unpacked(m, NULL);
        if (out_error) {
            rpc_stream_cancel(s);
            break;
        }
    }
    struct rpc_status st;
    int crc = rpc_stream_close(s, &st);
    if (rc == 0)
        rc = crc;
    if (!ends_nl)
        putchar('\n');
    if (out_error || fflush(stdout) != 0) {
        fprintf(stderr, "clocher chat: writing to standard output: %s\n", strerror(errno));
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    if (rc == RPC_ERR_STATUS) {
        fprintf(stderr, "clocher chat: failed after %zu tokens: %s%s%s\n", n_ids,
                rpc_status_name(st.code), st.message[0] ? ": " : "", st.message);
        ret = CMD_EXIT_REFUSED;
        goto out;
    }
    if (rc < 0) {
        fprintf(stderr, "clocher chat: %s\n",
                log_last_error()[0] ? log_last_error() : err_str(rc));
        ret = CMD_EXIT_FAIL;
        goto out;
    }
    fprintf(stderr, "[finish: %s; %zu tokens]\n", genreq_finish_name(finish), n_ids);
    ret = CMD_EXIT_OK;
out:
    rpc_client_destroy(c);
    genreq_free(req);
    return ret;
}
