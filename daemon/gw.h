/*
 * gw.h — clocherd's gRPC gateway: the clocher.v1.Inference service and grpc.health.v1.Health
 * on the configured listeners (TCP, Unix socket, TLS), in front of the workers' shm rings.
 * docs/DAEMON.md ("The gateway") is the manual; daemon/workers.h is its contract with the
 * supervisor.
 */
#ifndef CLOCHER_DAEMON_GW_H
#define CLOCHER_DAEMON_GW_H

#include "workers.h"

#include <uv.h>

struct gw;

/*
 * Binds the listeners of the current configuration and starts the gateway's threads (the
 * completion-queue thread and one event reader per worker slot); sets w->hooks. Called before
 * any worker is spawned, so a port in use fails the start (logged, naming the address):
 * -EADDRINUSE / ERR_FORMAT / -ENOMEM.
 */
int gw_create(struct workers *w, uv_loop_t *loop, struct gw **out);

/* 0 if no other process serves the Unix socket path (a stale one is removed), -EADDRINUSE
 * if one does (logged): gw_create's own check, run early (before the model's conversion). */
int gw_unix_free(const char *path);

/* Stops accepting, ends every call still open (UNAVAILABLE), joins the threads, frees.
 * NULL is a no-op. Called after the supervisor's loop has stopped. */
void gw_destroy(struct gw *g);

#endif
