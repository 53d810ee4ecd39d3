/*
 * gw_callobj.c — the lifetime of a gateway call object (struct gw_call, gw_internal.h): made
 * when the server asks gRPC for the next call of a method, reference-counted while batches,
 * slot tables and the code handling it hold it, freed with everything it owns by the last
 * reference. The bottom of the gateway's files: it calls none of them.
 */
#include "gw_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <protobuf-c/protobuf-c.h>
#include <stdlib.h>

struct gw_call *gw__call_new(struct gw *g, enum gw_method m, gw_tag_fn *arrived)
{
    struct gw_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->magic = GW_CALL_MAGIC;
    c->g = g;
    c->method = m;
    atomic_init(&c->refs, 1); /* the arrival's */
    pthread_mutex_init(&c->mu, NULL);
    grpc_metadata_array_init(&c->md);
    grpc_call_details_init(&c->details);
    c->health = -1;
    /* their functions are the state machine's, set when the call arrives (gw_call.c) */
    gw__tag_set(&c->t_close, NULL, c);
    gw__tag_set(&c->t_send, NULL, c);
    gw__tag_set(&c->t_new, arrived, c); /* last: publishes the fields above */
    return c;
}

void gw__call_ref(struct gw_call *c) { atomic_fetch_add(&c->refs, 1); }

static void item_free(struct gw_item *it)
{
    free(it->ids), free(it->text), free(it->error), free(it->ans_ids), free(it->ans_text);
    free(it->lps), free(it->lp_bytes), free(it->segs);
}

void gw__call_unref(struct gw_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->live)
        atomic_fetch_sub(&c->g->live_calls, 1);
    if (c->call)
        grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    grpc_call_details_destroy(&c->details);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->out)
        grpc_byte_buffer_destroy(c->out);
    if (c->answer)
        grpc_byte_buffer_destroy(c->answer);
    if (c->has_status_slice)
        grpc_slice_unref(c->status_slice);
    for (size_t i = 0; i < c->n_items; i++)
        item_free(&c->items[i]);
    free(c->items);
    if (c->req)
        protobuf_c_message_free_unpacked(c->req, NULL);
    config_unref(c->cfg);
    pthread_mutex_destroy(&c->mu);
    c->magic = 0;
    free(c);
}
