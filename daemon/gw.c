/*
 * gw.c — clocherd's gRPC gateway, the server on top of its parts (see gw.h; threads and locks:
 * gw_internal.h): the listeners and their TLS credentials, the registered methods, the
 * requests for the next call of each method, and the start and stop of the gateway's threads.
 * The parts below it, each calling only the ones listed after it:
 *     gw_hooks.c     the supervisor's hooks (workers.h), configuration reload included
 *     gw_reader.c    one event reader per worker slot: records -> calls
 *     gw_call.c      one state machine per call (arrival, items, messages, end)
 *     gw_route.c     the slots' request tables, routing, submission and cancel, health
 *     gw_adapters.c  the adapter registry (replays to fresh workers, reloads)
 *     gw_cq.c        the completion-queue thread
 *     gw_conn.c      connections: our Unix listener, rapid-reset accounting (beside gw_cq.c)
 *     gw_quota.c     per-tenant quotas (token buckets, queued generations; a leaf)
 *     gw_callobj.c   a call object's references and freeing
 * Beside them, a leaf of its own: gw_reflect.c, gRPC server reflection (its own call objects
 * on the same completion queue).
 *
 * NOTES
 *  - gRPC C core has no generated service code for C: each method is registered by its path
 *    and its request arrives as a byte buffer (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER) that
 *    gw_call.c unpacks with protobuf-c. One completion queue serves every call; a call's
 *    address (its embedded tags) is the tag.
 *  - Each arrival re-arms its method (on_arrival) before the call is handled, so there is
 *    always a request outstanding for every method while the server runs.
 */
#include "gw.h"

#include "err.h"
#include "gw_internal.h"
#include "gw_reflect.h"
#include "log.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const method_paths[GW_METHODS] = {
    [GW_GENERATE] = "/clocher.v1.Inference/Generate",
    [GW_BATCH_GENERATE] = "/clocher.v1.Inference/BatchGenerate",
    [GW_TOKENIZE] = "/clocher.v1.Inference/Tokenize",
    [GW_DETOKENIZE] = "/clocher.v1.Inference/Detokenize",
    [GW_LIST_MODELS] = "/clocher.v1.Inference/ListModels",
    [GW_LIST_ADAPTERS] = "/clocher.v1.Inference/ListAdapters",
    [GW_LOAD_ADAPTER] = "/clocher.v1.Inference/LoadAdapter",
    [GW_UNLOAD_ADAPTER] = "/clocher.v1.Inference/UnloadAdapter",
    [GW_GET_METRICS] = "/clocher.v1.Inference/GetMetrics",
    [GW_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
    [GW_HEALTH_WATCH] = "/grpc.health.v1.Health/Watch",
};

static void on_arrival(struct gw_tag *t, bool ok);

/* ---- new calls ---- */

/* Asks gRPC for the next call of method m (re-armed by each arrival). */
static void request_call(struct gw *g, enum gw_method m)
{
    if (atomic_load(&g->stopping))
        return;
    struct gw_call *c = gw__call_new(g, m, on_arrival);
    if (!c) {
        LOG_ERR("gateway: out of memory: no longer accepting %s calls",
                m < GW_METHODS ? method_paths[m] : "unknown");
        return;
    }
    grpc_call_error e;
    if (m == GW_UNKNOWN)
        e = grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cq, g->cq,
                                     &c->t_new);
    else
        e = grpc_server_request_registered_call(g->server, g->methods[m], &c->call,
                                                &c->deadline, &c->md, &c->payload, g->cq, g->cq,
                                                &c->t_new);
    if (e != GRPC_CALL_OK) {
        LOG_ERR("gateway: requesting a %s call: gRPC error %d",
                m < GW_METHODS ? method_paths[m] : "unregistered", (int)e);
        gw__call_unref(c);
    }
}

/* A call of its method came (ok = false: the server is shutting down, no call came): ask for
 * the next one, then let its state machine handle it. */
static void on_arrival(struct gw_tag *t, bool ok)
{
    struct gw_call *c = t->obj;
    if (ok)
        request_call(c->g, c->method);
    gw__call_arrived(c, ok);
}

/* ---- set-up ---- */

/* gRPC core's own messages (a TLS handshake that failed, a listener error) go through our log,
 * so under systemd they carry a priority like every other line. */
static void grpc_log_sink(gpr_log_func_args *a)
{
    const char *base = a->file ? strrchr(a->file, '/') : NULL;
    base = base ? base + 1 : a->file ? a->file : "?";
    switch (a->severity) {
    case GPR_LOG_SEVERITY_ERROR: LOG_WARN("grpc: %s (%s:%d)", a->message, base, a->line); break;
    case GPR_LOG_SEVERITY_INFO: LOG_INFO("grpc: %s (%s:%d)", a->message, base, a->line); break;
    default: LOG_DEBUG("grpc: %s (%s:%d)", a->message, base, a->line); break;
    }
}

static char *read_text(const char *path, const char *what)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        int e = errno;
        LOG_ERR("%s %s: %s", what, path, strerror(e));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            char *p = realloc(buf, cap + 65536);
            if (!p) {
                free(buf);
                fclose(f);
                LOG_ERR("%s %s: out of memory", what, path);
                return NULL;
            }
            buf = p, cap += 65536;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
        if (len > (1u << 20)) {
            LOG_ERR("%s %s: larger than 1 MiB: not a PEM file", what, path);
            free(buf);
            fclose(f);
            return NULL;
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static grpc_server_credentials *server_creds(const struct config *c)
{
    if (!c->tls_cert)
        return grpc_insecure_server_credentials_create();
    char *cert = read_text(c->tls_cert, "tls.cert");
    char *key = cert ? read_text(c->tls_key, "tls.key") : NULL;
    char *ca = key && c->tls_client_ca ? read_text(c->tls_client_ca, "tls.client_ca") : NULL;
    grpc_server_credentials *cr = NULL;
    if (key && (!c->tls_client_ca || ca)) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        cr = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!cr)
            LOG_ERR("tls: gRPC refused the certificate %s / key %s", c->tls_cert, c->tls_key);
    }
    free(cert), free(key), free(ca);
    return cr;
}

static int add_port(struct gw *g, const char *addr, grpc_server_credentials *cr)
{
    int port = grpc_server_add_http2_port(g->server, addr, cr);
    if (port == 0) {
        LOG_ERR("gateway: cannot listen on %s (in use, or not an address of this host)", addr);
        return -EADDRINUSE;
    }
    LOG_INFO("gateway: listening on %s", addr);
    return 0;
}

int gw_create(struct workers *w, uv_loop_t *loop, struct gw **out)
{
    *out = NULL;
    struct gw *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    g->magic = GW_MAGIC;
    g->w = w;
    g->loop = loop;
    g->stats = w->stats;
    atomic_init(&g->accepting, true);
    atomic_init(&g->next_id, 1);
    g->unix_fd = -1;
    g->wake[0] = g->wake[1] = -1;
    pthread_mutex_init(&g->conn_mu, NULL);
    pthread_mutex_init(&g->quota_mu, NULL);
    auth_streams_init(&g->streams);
    pthread_mutex_init(&g->adapters_mu, NULL);
    gw__tag_set(&g->t_shutdown, gw__cq_on_shutdown, g);
    g->n_slots = w->n;
    if (!(g->slots = calloc(w->n, sizeof *g->slots))) {
        free(g);
        return -ENOMEM;
    }
    for (size_t i = 0; i < w->n; i++) {
        struct gw_slot *s = &g->slots[i];
        s->g = g;
        s->index = (unsigned)i;
        s->ws = &w->slots[i];
        pthread_mutex_init(&s->mu, NULL);
    }

    struct config *c = config_ptr_get(w->config);
    gw__adapters_init(g, c);

    /* fork+exec of workers happens while our threads run: gRPC's fork handlers would only
     * stall the supervisor, and the child execs at once */
    setenv("GRPC_ENABLE_FORK_SUPPORT", "0", 0);
    gpr_set_log_function(grpc_log_sink);
    grpc_init();
    grpc_arg args[4] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)c->limits.max_message_bytes},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)c->limits.max_message_bytes},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONCURRENT_STREAMS,
         .value.integer = (int)c->limits.max_streams_per_connection},
        /* a second clocherd must not share the port (SO_REUSEPORT would let it) */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
    };
    grpc_channel_args ca = {.num_args = 4, .args = args};
    g->server = grpc_server_create(&ca, NULL);
    g->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    for (int m = 0; m < GW_METHODS; m++)
        g->methods[m] = grpc_server_register_method(g->server, method_paths[m], NULL,
                                                    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    int rc = gw_reflect_create(g->server, g->cq, &g->reflect);
    grpc_server_credentials *cr = rc < 0 ? NULL : server_creds(c);
    if (rc < 0) {
        /* logged by gw_reflect_create */
    } else if (!cr) {
        rc = ERR_FORMAT;
    } else {
        if (c->listen_tcp)
            rc = add_port(g, c->listen_tcp, cr);
        /* ours, plaintext only: gRPC's would take a live socket over (gw_conn.c); TLS with
         * listen.unix is refused at config time (config.c) */
        if (rc == 0 && c->listen_unix)
            rc = gw__conn_listen_unix(g, c->listen_unix);
        grpc_server_credentials_release(cr);
    }
    config_unref(c);
    if (rc < 0) {
        grpc_server_destroy(g->server);
        g->server = NULL;
        gw_destroy(g);
        return rc;
    }
    grpc_server_start(g->server);
    if ((rc = gw__conn_start(g)) < 0) {
        gw_destroy(g);
        return rc;
    }
    for (int m = 0; m <= GW_UNKNOWN; m++) {
        /* a few calls requested ahead for the streaming methods: bursts queue less */
        int ahead = m == GW_GENERATE || m == GW_BATCH_GENERATE ? 4 : 1;
        for (int k = 0; k < ahead; k++)
            request_call(g, (enum gw_method)m);
    }
    gw_reflect_start(g->reflect);
    /* GW_CQ_THREADS of them: a thread waiting on the queue also does gRPC's reading, and one
     * alone falls behind a flood of streams it reads (rapid reset is then seen seconds late) */
    int e = 0;
    for (int k = 0; k < GW_CQ_THREADS && e == 0; k++)
        if ((e = pthread_create(&g->cq_threads[k], NULL, gw__cq_main, g)) == 0)
            g->n_cq_threads++;
    g->cq_started = g->n_cq_threads > 0;
    if (e != 0) {
        /* pthread_create returns its error; errno is not set */
        LOG_ERR("gateway: pthread_create: %s", strerror(e));
        gw_destroy(g);
        return -ENOMEM;
    }
    for (size_t i = 0; i < g->n_slots; i++) {
        e = pthread_create(&g->slots[i].reader, NULL, gw__reader_main, &g->slots[i]);
        if (e != 0) {
            LOG_ERR("gateway: pthread_create: %s", strerror(e));
            gw_destroy(g);
            return -ENOMEM;
        }
        g->slots[i].reader_started = true;
    }
    g->hooks = gw__hooks;
    w->hooks = &g->hooks;
    w->hooks_ud = g;
    *out = g;
    return 0;
}

void gw_destroy(struct gw *g)
{
    if (!g)
        return;
    atomic_store(&g->stopping, true);
    atomic_store(&g->accepting, false);
    gw_reflect_stop(g->reflect);
    if (g->w->hooks == &g->hooks)
        g->w->hooks = NULL;
    gw__conn_stop(g); /* before the server goes: it adds connections to it */
    /* the readers fail what their workers still had */
    for (size_t i = 0; i < g->n_slots; i++)
        if (g->slots[i].reader_started)
            pthread_join(g->slots[i].reader, NULL);
    if (g->server) {
        grpc_server_shutdown_and_notify(g->server, g->cq, &g->t_shutdown);
        grpc_server_cancel_all_calls(g->server);
        if (!g->cq_started) {
            /* nothing polls the queue: drain it here */
            while (!atomic_load(&g->shutdown_seen)) {
                grpc_event ev = grpc_completion_queue_next(
                    g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
                if (ev.type == GRPC_OP_COMPLETE)
                    gw__tag_run(ev.tag, ev.success != 0);
            }
        }
    } else if (g->cq) {
        grpc_completion_queue_shutdown(g->cq);
    }
    if (g->cq_started) {
        for (int k = 0; k < g->n_cq_threads; k++)
            pthread_join(g->cq_threads[k], NULL);
    } else if (g->cq) {
        while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
    }
    if (g->server)
        grpc_server_destroy(g->server);
    if (g->cq)
        grpc_completion_queue_destroy(g->cq);
    if (g->cq || g->server)
        grpc_shutdown();
    for (size_t i = 0; i < g->n_slots; i++)
        pthread_mutex_destroy(&g->slots[i].mu);
    gw__adapters_fini(g);
    free(g->watch);
    free(g->slots);
    auth_streams_fini(&g->streams);
    pthread_mutex_destroy(&g->adapters_mu);
    pthread_mutex_destroy(&g->conn_mu);
    pthread_mutex_destroy(&g->quota_mu);
    gw_reflect_destroy(g->reflect); /* its calls ended with the queue */
    g->magic = 0;
    free(g);
}
