/*
 * rpc.h — the client side of clocherd's gRPC API, on gRPC C core and protobuf-c.
 *
 * protobuf-c has no gRPC code generator, so methods are called by path
 * ("/clocher.v1.Inference/Generate") and messages are packed/unpacked with their protobuf-c
 * descriptors. One struct rpc_client is one channel (TCP "host:port", "[v6]:port" or
 * "unix:PATH"; plaintext or TLS) plus the call options every command shares: the API key sent
 * as `authorization: Bearer KEY`, and the per-call deadline.
 *
 * Errors: functions return 0, or
 *   RPC_ERR_UNREACHABLE  the daemon could not be reached (nothing listening, TLS handshake
 *                        failed, no answer within the connect timeout); a message naming the
 *                        address was printed;
 *   RPC_ERR_STATUS       the call ended with a non-OK gRPC status, in *st (not printed: the
 *                        caller decides, e.g. batch keeps going);
 *   another negative     a local failure (-ENOMEM, -errno reading a PEM file, ERR_FORMAT for a
 *                        response that does not decode), printed once.
 * rpc_exit_code() maps them to the process exit codes of cmds.h.
 *
 * NOTES: a client's channel is thread-safe; each call (unary or stream) owns its own
 * completion queue, so one thread per stream may run calls on a shared client (`bench` does).
 * A stream is used by one thread at a time.
 */
#ifndef CLOCHER_CLIENT_RPC_H
#define CLOCHER_CLIENT_RPC_H

#include <protobuf-c/protobuf-c.h>

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#define RPC_DEFAULT_ADDR "127.0.0.1:50051" /* clocherd's default listen.tcp */
#define RPC_ENV_ADDR "CLOCHER_ADDR"
#define RPC_ENV_API_KEY "CLOCHER_API_KEY"

#define RPC_ERR_UNREACHABLE (-10101)
#define RPC_ERR_STATUS (-10102)

#define RPC_STATUS_MSG_MAX 1024

/* Method paths. */
#define RPC_M_GENERATE "/clocher.v1.Inference/Generate"
#define RPC_M_BATCH "/clocher.v1.Inference/BatchGenerate"
#define RPC_M_LIST_MODELS "/clocher.v1.Inference/ListModels"
#define RPC_M_LIST_ADAPTERS "/clocher.v1.Inference/ListAdapters"
#define RPC_M_LOAD_ADAPTER "/clocher.v1.Inference/LoadAdapter"
#define RPC_M_UNLOAD_ADAPTER "/clocher.v1.Inference/UnloadAdapter"
#define RPC_M_GET_METRICS "/clocher.v1.Inference/GetMetrics"
#define RPC_M_HEALTH_CHECK "/grpc.health.v1.Health/Check"

/* The connection flags every online command accepts (rpc_opts_set, RPC_OPTIONS_HELP). */
struct rpc_opts {
    const char *addr;        /* host:port, [v6]:port or unix:PATH */
    const char *api_key;     /* NULL = send none */
    bool tls;
    const char *ca_file;     /* PEM roots for --tls; NULL = the system's */
    const char *cert_file;   /* client certificate chain (PEM), with key_file */
    const char *key_file;
    const char *tls_name;    /* expected server name, when the address is not it */
    double timeout_s;        /* per-call deadline; 0 = none */
    double connect_timeout_s;
    bool quiet;              /* rpc_client_create prints no "cannot reach" message */
};

enum {
    RPC_OPT_ADDR = 0x1000,
    RPC_OPT_API_KEY,
    RPC_OPT_TLS,
    RPC_OPT_CA,
    RPC_OPT_CERT,
    RPC_OPT_KEY,
    RPC_OPT_TLS_NAME,
    RPC_OPT_TIMEOUT,
    RPC_OPT_CONNECT_TIMEOUT,
};

/* Entries for a getopt_long table (the command appends its own and the {0} terminator). */
#define RPC_LONG_OPTIONS                                                                     \
    {"addr", required_argument, NULL, RPC_OPT_ADDR},                                         \
        {"api-key", required_argument, NULL, RPC_OPT_API_KEY},                               \
        {"tls", no_argument, NULL, RPC_OPT_TLS}, {"ca", required_argument, NULL, RPC_OPT_CA}, \
        {"cert", required_argument, NULL, RPC_OPT_CERT},                                     \
        {"key", required_argument, NULL, RPC_OPT_KEY},                                       \
        {"tls-name", required_argument, NULL, RPC_OPT_TLS_NAME},                             \
        {"timeout", required_argument, NULL, RPC_OPT_TIMEOUT},                               \
        {"connect-timeout", required_argument, NULL, RPC_OPT_CONNECT_TIMEOUT}

#define RPC_OPTIONS_HELP                                                                     \
    "connection:\n"                                                                          \
    "  --addr ADDR          clocherd's address: HOST:PORT, [V6]:PORT or unix:PATH\n"          \
    "                       (default $" RPC_ENV_ADDR ", else " RPC_DEFAULT_ADDR ")\n"          \
    "  --api-key KEY        sent as `authorization: Bearer KEY` (default $" RPC_ENV_API_KEY   \
    ";\n"                                                                                    \
    "                       prefer the variable: arguments are visible to other users)\n"    \
    "  --tls                use TLS (roots: --ca, else the system's)\n"                      \
    "  --ca FILE            PEM certificates to verify the server with (implies --tls)\n"    \
    "  --cert FILE --key FILE  a client certificate (PEM) for servers that ask for one\n"     \
    "  --tls-name NAME      the name the server's certificate must carry\n"                  \
    "  --timeout SECONDS    deadline of each call (default: none for generation, 60 for\n"   \
    "                       adapters, 10 for the others)\n"                                  \
    "  --connect-timeout SECONDS  how long to try reaching the daemon (default 5)\n"

/* Defaults, then $CLOCHER_ADDR and $CLOCHER_API_KEY. default_timeout_s: 0 = none. */
void rpc_opts_init(struct rpc_opts *o, double default_timeout_s);
/*
 * Applies one getopt_long result. 1: it was a connection flag (applied); 0: not one of ours;
 * negative (ERR_USAGE): a bad value, reported on stderr as "clocher CMD: ...".
 */
int rpc_opts_set(struct rpc_opts *o, const char *cmd, int opt, const char *arg);

/* A call's final status. code is a grpc_status_code (0 = OK). */
struct rpc_status {
    int code;
    char message[RPC_STATUS_MSG_MAX];
};

/* "OK", "INVALID_ARGUMENT", ... ("CODE_<n>" for an unknown number: static buffer). */
const char *rpc_status_name(int code);

struct rpc_client;

/*
 * Creates the channel (reads the PEM files named by o) and waits up to o->connect_timeout_s
 * for it to connect. `cmd` prefixes messages ("clocher generate: cannot reach clocherd at
 * unix:/run/x.sock: ..."). 0 and *out, RPC_ERR_UNREACHABLE, or a local failure.
 */
int rpc_client_create(const char *cmd, const struct rpc_opts *o, struct rpc_client **out);
void rpc_client_destroy(struct rpc_client *c);
const char *rpc_client_addr(const struct rpc_client *c);

/*
 * One request, one response. On 0, *resp (free with protobuf_c_message_free_unpacked(*resp,
 * NULL)). On RPC_ERR_STATUS, *st says why; st is filled in every case (OK on success).
 */
int rpc_unary(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
              struct rpc_status *st);

/* A server-streaming call. */
struct rpc_stream;

/* Sends the request (and half-closes). timeout_s overrides the client's deadline when >= 0. */
int rpc_stream_open(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                    double timeout_s, struct rpc_stream **out);
/*
 * The next message: 1 and *msg (free with protobuf_c_message_free_unpacked); 0 at the end of
 * the stream (then call rpc_stream_close for the status); negative on a local failure.
 */
int rpc_stream_next(struct rpc_stream *s, const ProtobufCMessageDescriptor *d,
                    ProtobufCMessage **msg);
/* Cancels the call if it is still running (the status becomes CANCELLED). */
void rpc_stream_cancel(struct rpc_stream *s);
/*
 * Waits for the final status, frees the stream. 0 when OK, RPC_ERR_STATUS otherwise (*st
 * filled either way; st may be NULL), or the local failure rpc_stream_next returned.
 */
int rpc_stream_close(struct rpc_stream *s, struct rpc_status *st);

/*
 * The exit code (cmds.h) for a result of the functions above: 0 → CMD_EXIT_OK,
 * RPC_ERR_UNREACHABLE → CMD_EXIT_UNREACHABLE, RPC_ERR_STATUS → CMD_EXIT_REFUSED, ERR_USAGE
 * (inconsistent TLS flags) → CMD_EXIT_USAGE, others → CMD_EXIT_FAIL.
 */
int rpc_exit_code(int rc);

/* After getopt_long returned ':' (an option without its value) or '?': prints "clocher CMD:
 * --x needs a value" or "clocher CMD: unknown option '--y' (see --help)" on stderr. */
void rpc_opt_error(const char *cmd, int opt, char *const *argv);

/* Prints "clocher CMD: METHOD failed: CODE: message" for a non-OK status. */
void rpc_print_status(const char *cmd, const char *what, const struct rpc_status *st);

#endif
