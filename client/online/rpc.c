/*
 * rpc.c — gRPC C core channel and calls for the `clocher` online commands (contract: rpc.h).
 *
 * Each call runs three kinds of batches on its own completion queue, each tagged by a small
 * integer: START (send metadata + the request + half-close, receive the initial metadata),
 * STATUS (receive the final status; outstanding from the start, so a server that fails the
 * call without sending a message is seen at once), and MESSAGE (receive one message, re-armed
 * by rpc_stream_next). A call is only freed once every batch it started has completed.
 */
#include "rpc.h"

#include "cmds.h"
#include "err.h"
#include "genreq.h"
#include "log.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECV_BYTES (64 << 20) /* the daemon's largest limits.max_message_bytes */
#define PEM_MAX (1 << 20)

enum { TAG_START = 1, TAG_STATUS = 2, TAG_MESSAGE = 3 };

struct rpc_client {
    grpc_channel *ch;
    char *addr;        /* as the user wrote it, for messages */
    char *auth;        /* "Bearer KEY", NULL = no key */
    double timeout_s;  /* 0 = none */
};

struct rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    unsigned pending;  /* bit (1 << tag) per batch started and not yet completed */
    bool msg_ok;       /* the last MESSAGE batch's success */
    bool ended;        /* the end of the stream was read */
    int err;           /* a local failure, kept for rpc_stream_close */
    grpc_metadata auth_md;
    grpc_metadata_array init_md, trailing_md;
    grpc_byte_buffer *send_buf, *recv_buf;
    grpc_status_code status;
    grpc_slice details;
};

/* ---- options ---- */

void rpc_opts_init(struct rpc_opts *o, double default_timeout_s)
{
    memset(o, 0, sizeof *o);
    const char *a = getenv(RPC_ENV_ADDR);
    o->addr = a && *a ? a : RPC_DEFAULT_ADDR;
    const char *k = getenv(RPC_ENV_API_KEY);
    o->api_key = k && *k ? k : NULL;
    o->timeout_s = default_timeout_s;
    o->connect_timeout_s = 5;
}

static int parse_seconds(const char *cmd, const char *flag, const char *arg, bool allow_zero,
                         double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !isfinite(v) || v < 0 || (!allow_zero && v == 0) ||
        v > 1e6) {
        fprintf(stderr, "clocher %s: %s: expected a number of seconds%s, got '%s'\n", cmd, flag,
                allow_zero ? " (0 = none)" : " above 0", arg);
        return ERR_USAGE;
    }
    *out = v;
    return 0;
}

int rpc_opts_set(struct rpc_opts *o, const char *cmd, int opt, const char *arg)
{
    int rc;
    switch (opt) {
    case RPC_OPT_ADDR:
        if (!*arg) {
            fprintf(stderr, "clocher %s: --addr: empty address\n", cmd);
            return ERR_USAGE;
        }
        o->addr = arg;
        return 1;
    case RPC_OPT_API_KEY:
        o->api_key = *arg ? arg : NULL;
        return 1;
    case RPC_OPT_TLS:
        o->tls = true;
        return 1;
    case RPC_OPT_CA:
        o->ca_file = arg;
        o->tls = true;
        return 1;
    case RPC_OPT_CERT:
        o->cert_file = arg;
        return 1;
    case RPC_OPT_KEY:
        o->key_file = arg;
        return 1;
    case RPC_OPT_TLS_NAME:
        o->tls_name = arg;
        return 1;
    case RPC_OPT_TIMEOUT:
        rc = parse_seconds(cmd, "--timeout", arg, true, &o->timeout_s);
        return rc < 0 ? rc : 1;
    case RPC_OPT_CONNECT_TIMEOUT:
        rc = parse_seconds(cmd, "--connect-timeout", arg, false, &o->connect_timeout_s);
        return rc < 0 ? rc : 1;
    default:
        return 0;
    }
}

/* ---- status ---- */

const char *rpc_status_name(int code)
{
    return genreq_status_name(code);
}

int rpc_exit_code(int rc)
{
    if (rc == 0)
        return CMD_EXIT_OK;
    if (rc == RPC_ERR_UNREACHABLE)
        return CMD_EXIT_UNREACHABLE;
    if (rc == RPC_ERR_STATUS)
        return CMD_EXIT_REFUSED;
    if (rc == ERR_USAGE)
        return CMD_EXIT_USAGE;
    return CMD_EXIT_FAIL;
}

void rpc_opt_error(const char *cmd, int opt, char *const *argv)
{
    if (opt == ':')
        fprintf(stderr, "clocher %s: %s needs a value\n", cmd, argv[optind - 1]);
    else
        fprintf(stderr, "clocher %s: unknown option '%s' (see --help)\n", cmd, argv[optind - 1]);
}

void rpc_print_status(const char *cmd, const char *what, const struct rpc_status *st)
{
    fprintf(stderr, "clocher %s: %s failed: %s%s%s\n", cmd, what, rpc_status_name(st->code),
            st->message[0] ? ": " : "", st->message);
}

static void set_status(struct rpc_status *st, int code, const char *msg, size_t len)
{
    if (!st)
        return;
    st->code = code;
    if (len >= sizeof st->message)
        len = sizeof st->message - 1;
    memcpy(st->message, msg, len);
    st->message[len] = '\0';
}

/* ---- gRPC's own logging: kept out of the user's way unless CLOCHER_LOG=debug ---- */

static void grpc_log_sink(gpr_log_func_args *a)
{
    if (log_get_level() >= LOG_LEVEL_DEBUG)
        log_msg(LOG_LEVEL_DEBUG, "grpc: %s:%d: %s", a->file, a->line, a->message);
}

/* ---- channel ---- */

static int read_pem(const char *cmd, const char *flag, const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        fprintf(stderr, "clocher %s: %s %s: %s\n", cmd, flag, path, strerror(e));
        return -e;
    }
    char *buf = malloc(PEM_MAX + 1);
    if (!buf) {
        fclose(f);
        fprintf(stderr, "clocher %s: out of memory\n", cmd);
        return -ENOMEM;
    }
    size_t n = fread(buf, 1, PEM_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n == 0 || n > PEM_MAX) {
        fprintf(stderr, "clocher %s: %s %s: %s\n", cmd, flag, path,
                bad ? "read error" : n == 0 ? "empty file" : "larger than 1 MiB");
        free(buf);
        return ERR_FORMAT;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

static gpr_timespec deadline_after(double s)
{
    if (s <= 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(s * 1e6), GPR_TIMESPAN));
}

static int make_creds(const char *cmd, const struct rpc_opts *o, grpc_channel_credentials **out)
{
    if (!o->tls) {
        if (o->cert_file || o->key_file || o->tls_name) {
            fprintf(stderr, "clocher %s: --cert, --key and --tls-name need --tls\n", cmd);
            return ERR_USAGE;
        }
        *out = grpc_insecure_credentials_create();
        return 0;
    }
    if (!o->cert_file != !o->key_file) {
        fprintf(stderr, "clocher %s: --cert and --key go together\n", cmd);
        return ERR_USAGE;
    }
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc = 0;
    if (o->ca_file && (rc = read_pem(cmd, "--ca", o->ca_file, &ca)) < 0)
        goto out;
    if (o->cert_file && (rc = read_pem(cmd, "--cert", o->cert_file, &cert)) < 0)
        goto out;
    if (o->key_file && (rc = read_pem(cmd, "--key", o->key_file, &key)) < 0)
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    /* gRPC copies the PEM strings, so they are freed below */
    *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!*out) {
        fprintf(stderr, "clocher %s: TLS credentials could not be created\n", cmd);
        rc = ERR_FORMAT;
    }
out:
    free(ca);
    free(cert);
    free(key);
    return rc;
}

/* Why a connection failed, in gRPC's words: a call made now fails at once with it. */
static void connect_failure_detail(struct rpc_client *c, char *buf, size_t cap)
{
    buf[0] = '\0';
    /* any method will do: without a connection the call never leaves this process */
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice method = grpc_slice_from_static_string(RPC_M_HEALTH_CHECK);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method,
                                               NULL, deadline_after(1.0), NULL);
    if (call) {
        grpc_metadata_array trailing;
        grpc_metadata_array_init(&trailing);
        grpc_status_code code = GRPC_STATUS_OK;
        grpc_slice details = grpc_empty_slice();
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[1].data.recv_status_on_client.trailing_metadata = &trailing;
        ops[1].data.recv_status_on_client.status = &code;
        ops[1].data.recv_status_on_client.status_details = &details;
        if (grpc_call_start_batch(call, ops, 2, (void *)(intptr_t)TAG_STATUS, NULL) ==
            GRPC_CALL_OK) {
            grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            size_t n = GRPC_SLICE_LENGTH(details);
            if (code != GRPC_STATUS_OK && n) {
                if (n >= cap)
                    n = cap - 1;
                memcpy(buf, GRPC_SLICE_START_PTR(details), n);
                buf[n] = '\0';
            }
        }
        grpc_slice_unref(details);
        grpc_metadata_array_destroy(&trailing);
        grpc_call_unref(call);
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

/* Waits for the channel to be READY; false after a failed attempt or the timeout. */
static bool wait_connected(struct rpc_client *c, double timeout_s, bool *timed_out)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    gpr_timespec deadline = deadline_after(timeout_s);
    grpc_connectivity_state s = grpc_channel_check_connectivity_state(c->ch, 1);
    bool ok = false;
    *timed_out = false;
    for (;;) {
        if (s == GRPC_CHANNEL_READY) {
            ok = true;
            break;
        }
        if (s == GRPC_CHANNEL_TRANSIENT_FAILURE || s == GRPC_CHANNEL_SHUTDOWN)
            break;
        grpc_channel_watch_connectivity_state(c->ch, s, deadline, cq, NULL);
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (!ev.success) { /* the deadline passed before the state changed */
            *timed_out = true;
            break;
        }
        s = grpc_channel_check_connectivity_state(c->ch, 1);
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return ok;
}

int rpc_client_create(const char *cmd, const struct rpc_opts *o, struct rpc_client **out)
{
    *out = NULL;
    gpr_set_log_function(grpc_log_sink);
    grpc_init();
    int rc = 0;
    grpc_channel_credentials *creds = NULL;
    struct rpc_client *c = calloc(1, sizeof *c);
    if (!c || !(c->addr = strdup(o->addr))) {
        fprintf(stderr, "clocher %s: out of memory\n", cmd);
        rc = -ENOMEM;
        goto fail;
    }
    c->timeout_s = o->timeout_s;
    if (o->api_key) {
        size_t n = strlen(o->api_key);
        if (!(c->auth = malloc(n + 8))) {
            rc = -ENOMEM;
            goto fail;
        }
        memcpy(c->auth, "Bearer ", 7);
        memcpy(c->auth + 7, o->api_key, n + 1);
    }
    if ((rc = make_creds(cmd, o, &creds)) < 0)
        goto fail;

    grpc_arg args[2];
    int n_args = 0;
    args[n_args].type = GRPC_ARG_INTEGER;
    args[n_args].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[n_args].value.integer = MAX_RECV_BYTES;
    n_args++;
    if (o->tls_name) {
        args[n_args].type = GRPC_ARG_STRING;
        args[n_args].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n_args].value.string = (char *)o->tls_name;
        n_args++;
    }
    grpc_channel_args cargs = {.num_args = (size_t)n_args, .args = args};
    c->ch = grpc_channel_create(o->addr, creds, &cargs);
    grpc_channel_credentials_release(creds);
    creds = NULL;
    if (!c->ch) {
        fprintf(stderr, "clocher %s: cannot create a channel to '%s'\n", cmd, o->addr);
        rc = ERR_FORMAT;
        goto fail;
    }

    bool timed_out;
    if (!wait_connected(c, o->connect_timeout_s, &timed_out)) {
        rc = RPC_ERR_UNREACHABLE;
        if (o->quiet)
            goto fail;
        char detail[512];
        if (timed_out)
            snprintf(detail, sizeof detail, "no connection within %g s", o->connect_timeout_s);
        else
            connect_failure_detail(c, detail, sizeof detail);
        fprintf(stderr,
                "clocher %s: cannot reach clocherd at %s%s%s%s\n"
                "clocher %s: is it running? (--addr or $%s selects the address%s)\n",
                cmd, o->addr, detail[0] ? " (" : "", detail, detail[0] ? ")" : "", cmd,
                RPC_ENV_ADDR, o->tls ? "; --tls is on: does the daemon use TLS?" : "");
        goto fail;
    }
    *out = c;
    return 0;

fail:
    if (creds)
        grpc_channel_credentials_release(creds);
    rpc_client_destroy(c);
    if (!c)
        grpc_shutdown();
    return rc;
}

void rpc_client_destroy(struct rpc_client *c)
{
    if (!c)
        return;
    if (c->ch)
        grpc_channel_destroy(c->ch);
    free(c->addr);
    free(c->auth);
    free(c);
    grpc_shutdown();
}

const char *rpc_client_addr(const struct rpc_client *c)
{
    return c->addr;
}

/* ---- calls ---- */

static int pack(const ProtobufCMessage *m, grpc_byte_buffer **out)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return -ENOMEM;
    protobuf_c_message_pack(m, buf);
    grpc_slice s = grpc_slice_new(buf, n, free);
    *out = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return 0;
}

static int unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return ERR_FORMAT;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    *out = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return *out ? 0 : ERR_FORMAT;
}

/* Waits until the batch `tag` has completed (others completing meanwhile are recorded). */
static void wait_tag(struct rpc_stream *s, int tag)
{
    while (s->pending & (1u << tag)) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                                   NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        int t = (int)(intptr_t)ev.tag;
        s->pending &= ~(1u << t);
        if (t == TAG_MESSAGE)
            s->msg_ok = ev.success;
    }
}

int rpc_stream_open(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                    double timeout_s, struct rpc_stream **out)
{
    *out = NULL;
    struct rpc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    int rc = pack(req, &s->send_buf);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice m = grpc_slice_from_static_string(method);
    s->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, m, NULL,
                                       deadline_after(timeout_s >= 0 ? timeout_s : c->timeout_s),
                                       NULL);
    if (!s->call) {
        s->err = -ENOMEM;
        *out = s;
        return -ENOMEM;
    }
    if (c->auth) {
        s->auth_md.key = grpc_slice_from_static_string("authorization");
        s->auth_md.value = grpc_slice_from_static_string(c->auth);
    }

    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = c->auth ? 1 : 0;
    ops[0].data.send_initial_metadata.metadata = c->auth ? &s->auth_md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send_buf;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
    grpc_call_error e = grpc_call_start_batch(s->call, ops, 4, (void *)(intptr_t)TAG_START, NULL);
    if (e == GRPC_CALL_OK)
        s->pending |= 1u << TAG_START;

    grpc_op st[1];
    memset(st, 0, sizeof st);
    st[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    st[0].data.recv_status_on_client.status = &s->status;
    st[0].data.recv_status_on_client.status_details = &s->details;
    grpc_call_error e2 = grpc_call_start_batch(s->call, st, 1, (void *)(intptr_t)TAG_STATUS, NULL);
    if (e2 == GRPC_CALL_OK)
        s->pending |= 1u << TAG_STATUS;
    *out = s;
    if (e != GRPC_CALL_OK || e2 != GRPC_CALL_OK) {
        LOG_ERR("grpc_call_start_batch(%s) failed: %d", method, e != GRPC_CALL_OK ? e : e2);
        s->err = ERR_STATE;
        return ERR_STATE;
    }
    return 0;
}

int rpc_stream_next(struct rpc_stream *s, const ProtobufCMessageDescriptor *d,
                    ProtobufCMessage **msg)
{
    *msg = NULL;
    if (s->err)
        return s->err;
    if (s->ended)
        return 0;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv_buf;
    if (grpc_call_start_batch(s->call, &op, 1, (void *)(intptr_t)TAG_MESSAGE, NULL) !=
        GRPC_CALL_OK) {
        s->err = ERR_STATE;
        return s->err;
    }
    s->pending |= 1u << TAG_MESSAGE;
    wait_tag(s, TAG_MESSAGE);
    if (!s->msg_ok || !s->recv_buf) { /* the server closed the stream (status follows) */
        s->ended = true;
        return 0;
    }
    int rc = unpack(s->recv_buf, d, msg);
    grpc_byte_buffer_destroy(s->recv_buf);
    s->recv_buf = NULL;
    if (rc < 0) {
        LOG_ERR("a %s from the server does not decode", d->name);
        s->err = rc;
        grpc_call_cancel(s->call, NULL);
        return rc;
    }
    return 1;
}

void rpc_stream_cancel(struct rpc_stream *s)
{
    if (s && s->call)
        grpc_call_cancel(s->call, NULL);
}

int rpc_stream_close(struct rpc_stream *s, struct rpc_status *st)
{
    if (!s)
        return 0;
    int rc = s->err;
    if (s->call) {
        /* not read to its end: the caller gave up on the rest */
        if (!s->ended && !s->err)
            grpc_call_cancel(s->call, NULL);
        wait_tag(s, TAG_START);
        wait_tag(s, TAG_STATUS);
        wait_tag(s, TAG_MESSAGE);
        if (rc == 0 && s->status != GRPC_STATUS_OK)
            rc = RPC_ERR_STATUS;
        set_status(st, s->status, (const char *)GRPC_SLICE_START_PTR(s->details),
                   GRPC_SLICE_LENGTH(s->details));
        if (rc < 0 && rc != RPC_ERR_STATUS && st && st->code == GRPC_STATUS_OK)
            set_status(st, GRPC_STATUS_INTERNAL, err_str(rc), strlen(err_str(rc)));
        grpc_call_unref(s->call);
    } else if (st) {
        set_status(st, GRPC_STATUS_INTERNAL, err_str(rc), strlen(err_str(rc)));
    }
    if (s->recv_buf)
        grpc_byte_buffer_destroy(s->recv_buf);
    if (s->send_buf)
        grpc_byte_buffer_destroy(s->send_buf);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    if (s->cq) {
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->cq);
    }
    free(s);
    return rc;
}

int rpc_unary(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
              struct rpc_status *st)
{
    *resp = NULL;
    struct rpc_stream *s;
    int rc = rpc_stream_open(c, method, req, -1, &s);
    if (!s) { /* not even created (out of memory) */
        set_status(st, GRPC_STATUS_INTERNAL, err_str(rc), strlen(err_str(rc)));
        return rc;
    }
    ProtobufCMessage *m = NULL;
    if (rc == 0) {
        rc = rpc_stream_next(s, resp_desc, &m);
        if (rc == 1) { /* read on to the end, so the status is the server's own */
            ProtobufCMessage *extra = NULL;
            rc = rpc_stream_next(s, resp_desc, &extra);
            if (rc == 1) {
                protobuf_c_message_free_unpacked(extra, NULL);
                LOG_ERR("%s: the server sent more than one response", method);
                rpc_stream_cancel(s);
                s->err = ERR_FORMAT;
            }
        }
    }
    rc = rpc_stream_close(s, st); /* the status, or the local failure the stream kept */
    if (rc == 0 && !m) { /* OK without a message: not what a unary method does */
        set_status(st, GRPC_STATUS_INTERNAL, "no response message", 19);
        rc = RPC_ERR_STATUS;
    }
    if (rc == 0)
        *resp = m;
    else if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}
