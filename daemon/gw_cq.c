/*
 * gw_cq.c — the gateway's completion-queue thread: runs every gRPC completion (new calls,
 * sends done, clients gone) by calling the function of its tag (struct gw_tag), until the
 * queue is shut down after the server's shutdown notification.
 */
#include "gw_internal.h"

#include <grpc/support/time.h>

void gw__cq_on_shutdown(struct gw_tag *t, bool ok)
{
    (void)ok;
    struct gw *g = t->obj;
    atomic_store(&g->shutdown_seen, true);
    grpc_completion_queue_shutdown(g->cq);
}

void *gw__cq_main(void *arg)
{
    struct gw *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                                   NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            gw__tag_run(ev.tag, ev.success != 0);
        }
    }
    return NULL;
}
