/*
 * cmd_metrics.c — `clocher metrics`: the daemon's Prometheus text, through the GetMetrics RPC
 * (authenticated like every call) or, with --http HOST:PORT, by scraping the metrics
 * endpoint the way Prometheus does (GET /metrics, with libcurl).
 *
 * Exit codes (cmds.h): 0 ok; 1 local failure or a malformed HTTP answer; 2 usage; 5 daemon
 * (or endpoint) unreachable; 6 the daemon refused (gRPC status, or an HTTP status not 200).
 */
#include "cmds.h"

#include "clocher/v1/inference.pb-c.h"
#include "rpc.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The body as it arrives, bounded by HTTP_MAX. */
struct body {
    char *p;
    size_t len;
    bool too_big;
};

static size_t on_data(char *data, size_t size, size_t n, void *ud)
{
    struct body *b = ud;
    size_t k = size * n;
    if (b->len + k > HTTP_MAX) {
        b->too_big = true;
        return 0; /* curl stops with CURLE_WRITE_ERROR */
    }
    char *q = realloc(b->p, b->len + k + 1);
    if (!q)
        return 0;
    memcpy(q + b->len, data, k);
    b->p = q;
    b->len += k;
    return k;
}

/* GET /metrics from addr with libcurl; the body to stdout. Returns an exit code. */
static int scrape(const char *addr, double timeout_s, double connect_timeout_s)
{
    char buf[512];
    const char *host, *port;
    if (split_hostport(addr, buf, sizeof buf, &host, &port) < 0) {
        fprintf(stderr, "clocher metrics: --http: expected HOST:PORT or [V6]:PORT, got '%s'\n",
                addr);
        return CMD_EXIT_USAGE;
    }
    char url[600];
    snprintf(url, sizeof url, "http://%s/metrics", addr);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "clocher metrics: libcurl could not start\n");
        return CMD_EXIT_FAIL;
    }
    CURL *h = curl_easy_init();
    struct body b = {0};
    char err[CURL_ERROR_SIZE] = "";
    int ret = CMD_EXIT_FAIL;
    if (!h)
        goto out;
    double t = timeout_s > 0 ? timeout_s : 10;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "clocher");
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(t * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)((connect_timeout_s > 0 ? connect_timeout_s : t) * 1000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) {
        bool unreachable = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                           rc == CURLE_OPERATION_TIMEDOUT;
        if (b.too_big)
            fprintf(stderr, "clocher metrics: the answer from %s is over %u bytes\n", addr,
                    HTTP_MAX);
        else
            fprintf(stderr, "clocher metrics: %s the metrics endpoint at %s: %s\n",
                    unreachable ? "cannot reach" : "reading from", addr,
                    err[0] ? err : curl_easy_strerror(rc));
        ret = unreachable ? CMD_EXIT_UNREACHABLE : CMD_EXIT_FAIL;
        goto out;
    }
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) {
        fprintf(stderr, "clocher metrics: %s answered HTTP %ld\n", addr, code);
        ret = CMD_EXIT_REFUSED;
        goto out;
    }
    if (b.len)
        fwrite(b.p, 1, b.len, stdout);
    ret = fflush(stdout) == 0 ? CMD_EXIT_OK : CMD_EXIT_FAIL;
out:
    free(b.p);
    if (h)
        curl_easy_cleanup(h);
    curl_global_cleanup();
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
