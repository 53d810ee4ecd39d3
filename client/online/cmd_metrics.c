/*
 * cmd_metrics.c — `clocher metrics`: the daemon's Prometheus text, through the GetMetrics RPC
 * (authenticated like every call) or, with --http HOST:PORT, by scraping the metrics
 * endpoint the way Prometheus does (GET /metrics, HTTP/1.0 so the body is never chunked).
 *
 * Exit codes (cmds.h): 0 ok; 1 local failure or a malformed HTTP answer; 2 usage; 5 daemon
 * (or endpoint) unreachable; 6 the daemon refused (gRPC status, or an HTTP status not 200).
 */
#include "cmds.h"

#include "clocher/v1/inference.pb-c.h"
#include "rpc.h"

#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define HTTP_MAX (64u << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clocher metrics [--http HOST:PORT] [connection flags]\n"
            "\n"
            "Prints the daemon's metrics in the Prometheus text format: by default through the\n"
            "GetMetrics call; with --http, from the metrics endpoint (config metrics.listen,\n"
            "default 127.0.0.1:9464) with GET /metrics.\n"
            "\n"
            "  --http HOST:PORT     scrape this endpoint instead ([V6]:PORT for IPv6); only\n"
            "                       --timeout and --connect-timeout apply then\n"
            "  -h, --help           this help\n"
            "\n%s\n"
            "exit status: 0 ok, 1 local failure or malformed answer, 2 usage,\n"
            "             5 unreachable, 6 refused (gRPC status, or HTTP status not 200)\n",
            RPC_OPTIONS_HELP);
}

/* Splits "host:port" / "[v6]:port" into host and port (in buf). */
static int split_hostport(const char *s, char *buf, size_t cap, const char **host,
                          const char **port)
{
    if (strlen(s) >= cap)
        return -1;
    strcpy(buf, s);
    char *colon;
    if (buf[0] == '[') {
        char *rb = strchr(buf, ']');
        if (!rb || rb[1] != ':')
            return -1;
        *rb = '\0';
        *host = buf + 1;
        colon = rb + 1;
    } else {
        colon = strrchr(buf, ':');
        if (!colon)
            return -1;
        *colon = '\0';
        *host = buf;
    }
    *port = colon + 1;
    return **host && **port ? 0 : -1;
}

/* GET /metrics from addr; the body to stdout. Returns an exit code. */
static int scrape(const char *addr, double timeout_s, double connect_timeout_s)
{
    char buf[512];
    const char *host, *port;
    if (split_hostport(addr, buf, sizeof buf, &host, &port) < 0) {
        fprintf(stderr, "clocher metrics: --http: expected HOST:PORT or [V6]:PORT, got '%s'\n",
                addr);
        return CMD_EXIT_USAGE;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0) {
        fprintf(stderr, "clocher metrics: cannot reach %s: %s\n", addr, gai_strerror(g));
        return CMD_EXIT_UNREACHABLE;
    }
    int fd = -1, err = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        /* a blocking connect honours the send timeout; reads the receive timeout */
        struct timeval ct = {(time_t)connect_timeout_s,
                             (suseconds_t)((connect_timeout_s - (time_t)connect_timeout_s) * 1e6)};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &ct, sizeof ct);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        fprintf(stderr, "clocher metrics: cannot reach the metrics endpoint at %s: %s\n", addr,
                strerror(err));
        return CMD_EXIT_UNREACHABLE;
    }
    double t = timeout_s > 0 ? timeout_s : 10;
    struct timeval rt = {(time_t)t, (suseconds_t)((t - (time_t)t) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &rt, sizeof rt);
    char req[600];
    int n = snprintf(req, sizeof req,
                     "GET /metrics HTTP/1.0\r\nHost: %s\r\nAccept: text/plain\r\n"
                     "User-Agent: clocher\r\n\r\n",
                     addr);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        fprintf(stderr, "clocher metrics: sending to %s: %s\n", addr, strerror(errno));
        close(fd);
        return CMD_EXIT_FAIL;
    }
    size_t cap = 1 << 16, len = 0;
    char *body = malloc(cap + 1);
    int ret = CMD_EXIT_FAIL;
    if (!body)
        goto out;
    for (;;) {
        if (len == cap) {
            if (cap >= HTTP_MAX) {
                fprintf(stderr, "clocher metrics: the answer from %s is over %u bytes\n", addr,
                        HTTP_MAX);
                goto out;
            }
            char *nb = realloc(body, cap * 2 + 1);
            if (!nb)
                goto out;
            body = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, body + len, cap - len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "clocher metrics: reading from %s: %s\n", addr,
                    errno == EAGAIN ? "timed out" : strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    body[len] = '\0';
    int code;
    char *eoh = strstr(body, "\r\n\r\n");
    if (sscanf(body, "HTTP/1.%*d %d", &code) != 1 || !eoh) {
        fprintf(stderr, "clocher metrics: %s did not answer in HTTP\n", addr);
        goto out;
    }
    if (code != 200) {
        char *eol = strstr(body, "\r\n");
        fprintf(stderr, "clocher metrics: %s answered: %.*s\n", addr, (int)(eol - body), body);
        ret = CMD_EXIT_REFUSED;
        goto out;
    }
    fwrite(eoh + 4, 1, len - (size_t)(eoh + 4 - body), stdout);
    ret = fflush(stdout) == 0 ? CMD_EXIT_OK : CMD_EXIT_FAIL;
out:
    free(body);
    close(fd);
    return ret;
}

int cmd_metrics(int argc, char **argv)
{
    struct rpc_opts o;
    rpc_opts_init(&o, 10);
    const char *http = NULL;
    static const struct option longopts[] = {
        RPC_LONG_OPTIONS,
        {"http", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        int rc = rpc_opts_set(&o, "metrics", opt, optarg);
        if (rc < 0)
            return CMD_EXIT_USAGE;
        if (rc > 0)
            continue;
        switch (opt) {
        case 'H':
            http = optarg;
            break;
        case 'h':
            usage(stdout);
            return CMD_EXIT_OK;
        default: /* ':' (an option without its value) or '?' */
            rpc_opt_error("metrics", opt, argv);
            return CMD_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "clocher metrics: unexpected argument '%s'\n", argv[optind]);
        return CMD_EXIT_USAGE;
    }
    if (http)
        return scrape(http, o.timeout_s, o.connect_timeout_s);

    struct rpc_client *c;
    int rc = rpc_client_create("metrics", &o, &c);
    if (rc < 0)
        return rpc_exit_code(rc);
    Clocher__V1__GetMetricsRequest q = CLOCHER__V1__GET_METRICS_REQUEST__INIT;
    ProtobufCMessage *resp;
    struct rpc_status st;
    rc = rpc_unary(c, RPC_M_GET_METRICS, &q.base, &clocher__v1__get_metrics_response__descriptor,
                   &resp, &st);
    if (rc == 0) {
        const Clocher__V1__GetMetricsResponse *r = (void *)resp;
        fputs(r->prometheus_text ? r->prometheus_text : "", stdout);
        protobuf_c_message_free_unpacked(resp, NULL);
        if (fflush(stdout) != 0) {
            fprintf(stderr, "clocher metrics: writing to standard output: %s\n", strerror(errno));
            rc = -EIO;
        }
    } else if (rc == RPC_ERR_STATUS) {
        rpc_print_status("metrics", "GetMetrics", &st);
    } else {
        fprintf(stderr, "clocher metrics: GetMetrics: %s\n", st.message);
    }
    rpc_client_destroy(c);
    return rpc_exit_code(rc);
}
