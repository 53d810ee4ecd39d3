/*
 * cmd_health.c — `clocher health`: asks clocherd's standard gRPC health service
 * (grpc.health.v1.Health/Check) and prints the serving status; with --wait, polls until the
 * daemon is SERVING (what scripts/run.sh does after starting it).
 *
 * With --json, one JSON object on stdout instead of the word, for scripts and probes:
 *     {"service": "", "status": "SERVING"}
 *     {"service": "", "status": "UNREACHABLE", "error": "..."}
 *     {"service": "x", "status": "ERROR", "code": 5, "code_name": "NOT_FOUND", "error": "..."}
 * (the exit status is the same as without it).
 *
 * Exit codes (cmds.h): 0 SERVING; 1 answered but not serving (NOT_SERVING, UNKNOWN); 2 usage;
 * 5 unreachable (with --wait: still unreachable when the time ran out); 6 the daemon refused
 * the call (e.g. NOT_FOUND for an unknown --service).
 */
#include "cmds.h"

#include "err.h"
#include "health.pb-c.h"
#include "log.h"
#include "mono.h"
#include "rpc.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POLL_S 0.25

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher health [--service NAME] [--wait SECONDS] [-q] [--json] [connection flags]\n"
            "\n"
            "Asks clocherd's gRPC health service (grpc.health.v1.Health/Check) and prints the\n"
            "status: SERVING, NOT_SERVING or UNKNOWN.\n"
            "\n"
            "  --service NAME     the service to ask about: \"\" (default: the daemon) or\n"
            "                     clocher.v1.Inference\n"
            "  --wait SECONDS     poll until SERVING, for at most SECONDS (an unreachable or\n"
            "                     not-yet-serving daemon is asked again every %g s)\n"
            "  -q, --quiet        print nothing (the exit status says it)\n"
            "      --json         print one JSON object: service, status (SERVING,\n"
            "                     NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN, UNREACHABLE or\n"
            "                     ERROR) and, when it failed, error (and code, code_name)\n"
            "  -h, --help         this help\n"
            "\n%s\n"
            "exit status: 0 SERVING, 1 not serving, 2 usage, 5 daemon unreachable,\n"
            "             6 the daemon refused the call (status printed)\n",
            POLL_S, RPC_OPTIONS_HELP);
}

static const char *serving_name(int s)
{
    switch (s) {
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING:
        return "SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING:
        return "NOT_SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN:
        return "SERVICE_UNKNOWN";
    default:
        return "UNKNOWN";
    }
}

/* One check: 0 and *serving, or a negative rpc code (st filled for RPC_ERR_STATUS). */
static int check_once(const struct rpc_opts *o, const char *service, int *serving,
                      struct rpc_status *st)
{
    struct rpc_client *c;
    int rc = rpc_client_create("health", o, &c);
    if (rc < 0)
        return rc;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    ProtobufCMessage *resp;
    rc = rpc_unary(c, RPC_M_HEALTH_CHECK, &req.base, &grpc__health__v1__health_check_response__descriptor,
                   &resp, st);
    if (rc == 0) {
        *serving = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    rpc_client_destroy(c);
    return rc;
}

/* --json's line: status, and for a failure its reason (st: a refusal; err: any other). 0, or
 * -ENOMEM. */
static int print_json(const char *service, const char *status, const struct rpc_status *st,
                      const char *err)
{
    json_t *j = json_object();
    int bad = !j || json_object_set_new(j, "service", json_string(service)) ||
              json_object_set_new(j, "status", json_string(status));
    if (!bad && st) {
        bad = json_object_set_new(j, "code", json_integer(st->code)) ||
              json_object_set_new(j, "code_name", json_string(rpc_status_name(st->code))) ||
              json_object_set_new(j, "error", json_string(st->message));
    } else if (!bad && err) {
        bad = json_object_set_new(j, "error", json_string(err));
    }
    char *text = bad ? NULL : json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text) {
        fprintf(stderr, "clocher health: out of memory\n");
        return -ENOMEM;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

int cmd_health(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 10);
    const char *service = "";
    double wait_s = -1;
    bool quiet = false, as_json = false;
    enum { O_JSON = 256 + 64 }; /* above RPC_LONG_OPTIONS' values */
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        {"service", required_argument, NULL, 's'},
        {"wait", required_argument, NULL, 'w'},
        {"quiet", no_argument, NULL, 'q'},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":qh", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "health", opt, optarg);
        if (rc < 0)
            return CMD_EXIT_USAGE;
        if (rc > 0)
            continue;
        switch (opt) {
        case 's':
            service = optarg;
            break;
        case 'w': {
            char *end;
            wait_s = strtod(optarg, &end);
            if (end == optarg || *end || !(wait_s >= 0 && wait_s <= 86400)) {
                fprintf(stderr, "clocher health: --wait: expected seconds in 0..86400, got '%s'\n",
                        optarg);
                return CMD_EXIT_USAGE;
            }
            break;
        }
        case 'q':
            quiet = true;
            break;
        case O_JSON:
            as_json = true;
            break;
        case 'h':
            usage(stdout);
            return CMD_EXIT_OK;
        default: /* ':' (an option without its value) or '?' */
            rpc_opt_error("health", opt, argv);
            return CMD_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "clocher health: unexpected argument '%s'\n", argv[optind]);
        return CMD_EXIT_USAGE;
    }

    struct rpc_status st = {0};
    int serving = 0, rc;
    log_clear_error();
    if (as_json)
        quiet = true; /* the JSON line says it all; stderr stays quiet */
    if (wait_s < 0) {
        struct rpc_opts q = o;
        q.quiet = quiet;
        rc = check_once(&q, service, &serving, &st);
    } else {
        double end = mono_sec() + wait_s;
        struct rpc_opts q = o;
        q.quiet = true;
        for (;;) {
            double left = end - mono_sec();
            q.connect_timeout_s = left < o.connect_timeout_s ? (left > 0.1 ? left : 0.1)
                                                            : o.connect_timeout_s;
            rc = check_once(&q, service, &serving, &st);
            if (rc == 0 && serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
                break;
            /* keep polling through "not yet": unreachable, not serving, or UNAVAILABLE */
            bool again = rc == RPC_ERR_UNREACHABLE || rc == 0 ||
                         (rc == RPC_ERR_STATUS && st.code == 14 /* UNAVAILABLE */);
            if (!again || mono_sec() + POLL_S > end)
                break;
            sleep_s(POLL_S);
        }
        if (rc == RPC_ERR_UNREACHABLE && !quiet) /* once, with the reason */
            rc = check_once(&o, service, &serving, &st);
    }
    if (as_json) {
        const char *status = rc == RPC_ERR_STATUS        ? "ERROR"
                             : rc == RPC_ERR_UNREACHABLE ? "UNREACHABLE"
                             : rc < 0                    ? "ERROR"
                                                         : serving_name(serving);
        char err[600] = "";
        if (rc == RPC_ERR_UNREACHABLE)
            snprintf(err, sizeof err, "cannot reach clocherd at %s", o.addr);
        else if (rc < 0 && rc != RPC_ERR_STATUS)
            snprintf(err, sizeof err, "%s", *log_last_error() ? log_last_error() : err_str(rc));
        if (print_json(service, status, rc == RPC_ERR_STATUS ? &st : NULL, err[0] ? err : NULL) < 0)
            return CMD_EXIT_FAIL;
    }
    if (rc == RPC_ERR_STATUS) {
        if (!quiet)
            rpc_print_status("health", "Health/Check", &st);
        return CMD_EXIT_REFUSED;
    }
    if (rc < 0)
        return rpc_exit_code(rc);
    if (!quiet)
        printf("%s\n", serving_name(serving));
    return serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
               ? CMD_EXIT_OK
               : CMD_EXIT_FAIL;
}
