/*
 * gw_reflect.c — gRPC server reflection (see gw_reflect.h): an index of the embedded
 * descriptor set (which file defines which symbol, which files each imports), the answer to
 * one ServerReflectionRequest, and the bidirectional stream that carries them (one call
 * object per stream: arrive, then read a request / send its answer until the client
 * half-closes, then the status). A leaf beside gw.c: it calls no other gateway file.
 */
#include "gw_reflect.h"

#include "err.h"
#include "gw_internal.h"
#include "log.h"

#include "grpc/reflection/v1/reflection.pb-c.h"
#include "reflect/descriptor_subset.pb-c.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* proto/CMakeLists.txt: protoc's FileDescriptorSet of the served .proto files */
extern const unsigned char clocher_descriptor_set[];
extern const size_t clocher_descriptor_set_len;

#define STATUS_NOT_FOUND 5
#define MAX_FILES 32u

/* ---- the index ---- */

struct rfile {
    const uint8_t *raw; /* a serialized FileDescriptorProto inside clocher_descriptor_set */
    size_t len;
    Clocher__Reflect__FileDescriptorProto *fd; /* its names, unpacked */
    uint32_t deps;                             /* bit i: imports files[i] (transitively) */
};

struct rsym {
    char *name; /* fully qualified: "clocher.v1.Inference.Generate" */
    unsigned file;
};

struct rcall;

struct gw_reflect {
    struct rfile files[MAX_FILES];
    unsigned n_files;
    struct rsym *syms;
    size_t n_syms, cap_syms;
    char **services; /* every service the set defines: all of them are served */
    size_t n_services;
    /* the server side (NULL for an index alone) */
    grpc_server *server;
    grpc_completion_queue *cq;
    void *methods[2]; /* v1, v1alpha */
    atomic_bool stopping;
};

static int add_sym(struct gw_reflect *r, const char *scope, const char *name, unsigned file)
{
    if (!name)
        return 0;
    if (r->n_syms == r->cap_syms) {
        size_t cap = r->cap_syms ? 2 * r->cap_syms : 256;
        struct rsym *p = realloc(r->syms, cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        r->syms = p, r->cap_syms = cap;
    }
    size_t n = strlen(scope) + strlen(name) + 2;
    char *full = malloc(n);
    if (!full)
        return -ENOMEM;
    snprintf(full, n, "%s%s%s", scope, *scope ? "." : "", name);
    r->syms[r->n_syms++] = (struct rsym){full, file};
    return 0;
}

/* An enum's values are scoped like the enum itself (protobuf's C++ scoping rule). */
static int add_enum(struct gw_reflect *r, const char *scope,
                    const Clocher__Reflect__EnumDescriptorProto *e, unsigned file)
{
    int rc = add_sym(r, scope, e->name, file);
    for (size_t i = 0; i < e->n_value && rc == 0; i++)
        rc = add_sym(r, scope, e->value[i]->name, file);
    return rc;
}

static int add_message(struct gw_reflect *r, const char *scope,
                       const Clocher__Reflect__DescriptorProto *m, unsigned file)
{
    int rc = add_sym(r, scope, m->name, file);
    if (rc < 0 || !m->name)
        return rc;
    char inner[512];
    snprintf(inner, sizeof inner, "%s%s%s", scope, *scope ? "." : "", m->name);
    for (size_t i = 0; i < m->n_field && rc == 0; i++)
        rc = add_sym(r, inner, m->field[i]->name, file);
    for (size_t i = 0; i < m->n_oneof_decl && rc == 0; i++)
        rc = add_sym(r, inner, m->oneof_decl[i]->name, file);
    for (size_t i = 0; i < m->n_enum_type && rc == 0; i++)
        rc = add_enum(r, inner, m->enum_type[i], file);
    for (size_t i = 0; i < m->n_nested_type && rc == 0; i++)
        rc = add_message(r, inner, m->nested_type[i], file);
    return rc;
}

static int index_file(struct gw_reflect *r, unsigned f)
{
    const Clocher__Reflect__FileDescriptorProto *fd = r->files[f].fd;
    const char *pkg = fd->package ? fd->package : "";
    int rc = 0;
    for (size_t i = 0; i < fd->n_message_type && rc == 0; i++)
        rc = add_message(r, pkg, fd->message_type[i], f);
    for (size_t i = 0; i < fd->n_enum_type && rc == 0; i++)
        rc = add_enum(r, pkg, fd->enum_type[i], f);
    for (size_t i = 0; i < fd->n_service && rc == 0; i++) {
        const Clocher__Reflect__ServiceDescriptorProto *s = fd->service[i];
        if (!s->name)
            continue;
        if ((rc = add_sym(r, pkg, s->name, f)) < 0)
            break;
        char **p = realloc(r->services, (r->n_services + 1) * sizeof *p);
        if (!p)
            return -ENOMEM;
        r->services = p;
        r->services[r->n_services++] = r->syms[r->n_syms - 1].name;
        for (size_t k = 0; k < s->n_method && rc == 0; k++)
            rc = add_sym(r, r->syms[r->n_syms - 1].name, s->method[k]->name, f);
    }
    return rc;
}

static int find_file(const struct gw_reflect *r, const char *name)
{
    for (unsigned i = 0; i < r->n_files; i++)
        if (r->files[i].fd->name && strcmp(r->files[i].fd->name, name) == 0)
            return (int)i;
    return -1;
}

/* Splits the set into its files' bytes: a FileDescriptorSet is field 1 (length-delimited),
 * repeated, and nothing else. Our own build's bytes, checked all the same. */
static int split_set(struct gw_reflect *r, const uint8_t *p, size_t n)
{
    size_t at = 0;
    while (at < n) {
        if (p[at++] != 0x0a || r->n_files == MAX_FILES)
            return ERR_FORMAT;
        uint64_t len = 0;
        for (int shift = 0;; shift += 7) {
            if (at >= n || shift > 28)
                return ERR_FORMAT;
            len |= (uint64_t)(p[at] & 0x7f) << shift;
            if (!(p[at++] & 0x80))
                break;
        }
        if (len > n - at)
            return ERR_FORMAT;
        struct rfile *f = &r->files[r->n_files];
        f->raw = p + at, f->len = (size_t)len;
        f->fd = clocher__reflect__file_descriptor_proto__unpack(NULL, f->len, f->raw);
        if (!f->fd)
            return ERR_FORMAT;
        r->n_files++;
        at += (size_t)len;
    }
    return 0;
}

/* Each file's imports, transitively (files come in dependency order from protoc, but the
 * closure does not rely on it). */
static int link_deps(struct gw_reflect *r)
{
    for (unsigned i = 0; i < r->n_files; i++)
        for (size_t k = 0; k < r->files[i].fd->n_dependency; k++) {
            int d = find_file(r, r->files[i].fd->dependency[k]);
            if (d < 0)
                return ERR_FORMAT;
            r->files[i].deps |= 1u << d;
        }
    for (bool changed = true; changed;) {
        changed = false;
        for (unsigned i = 0; i < r->n_files; i++) {
            uint32_t all = r->files[i].deps;
            for (unsigned d = 0; d < r->n_files; d++)
                if (r->files[i].deps & (1u << d))
                    all |= r->files[d].deps;
            if (all != r->files[i].deps)
                r->files[i].deps = all, changed = true;
        }
    }
    return 0;
}

int gw_reflect_index_create(struct gw_reflect **out)
{
    *out = NULL;
    struct gw_reflect *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    int rc = split_set(r, clocher_descriptor_set, clocher_descriptor_set_len);
    if (rc == 0)
        rc = link_deps(r);
    for (unsigned f = 0; f < r->n_files && rc == 0; f++)
        rc = index_file(r, f);
    if (rc < 0) {
        if (rc == ERR_FORMAT)
            LOG_ERR("gateway: reflection: the embedded descriptor set does not parse (a build "
                    "fault)");
        else
            LOG_ERR("gateway: reflection: out of memory indexing the descriptor set");
        gw_reflect_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* ---- one answer ---- */

typedef Grpc__Reflection__V1__ServerReflectionRequest Req;
typedef Grpc__Reflection__V1__ServerReflectionResponse Resp;

/* File f and what it imports, f first (what grpcurl needs to build its descriptors). */
static int files_answer(const struct gw_reflect *r, unsigned f,
                        Grpc__Reflection__V1__FileDescriptorResponse *fdr, ProtobufCBinaryData *b)
{
    size_t n = 0;
    b[n++] = (ProtobufCBinaryData){r->files[f].len, (uint8_t *)r->files[f].raw};
    for (unsigned d = 0; d < r->n_files; d++)
        if (d != f && (r->files[f].deps & (1u << d)))
            b[n++] = (ProtobufCBinaryData){r->files[d].len, (uint8_t *)r->files[d].raw};
    fdr->n_file_descriptor_proto = n;
    fdr->file_descriptor_proto = b;
    return 0;
}

int gw_reflect_answer(const struct gw_reflect *r, const uint8_t *req_bytes, size_t len,
                      uint8_t **out, size_t *out_len, char *msg, size_t cap)
{
    *out = NULL, *out_len = 0;
    Req *req = grpc__reflection__v1__server_reflection_request__unpack(NULL, len, req_bytes);
    if (!req) {
        snprintf(msg, cap, "not a grpc.reflection ServerReflectionRequest (%zu bytes)", len);
        return ERR_FORMAT;
    }
    Resp resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    resp.valid_host = req->host;
    resp.original_request = req;
    Grpc__Reflection__V1__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lsr = GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse err = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    ProtobufCBinaryData files[MAX_FILES];
    Grpc__Reflection__V1__ServiceResponse svc[16], *svcp[16];
    char text[600];
    int f = -1;
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        for (size_t i = 0; i < r->n_services && i < 16; i++) {
            grpc__reflection__v1__service_response__init(&svc[i]);
            svc[i].name = r->services[i];
            svcp[i] = &svc[i];
        }
        lsr.n_service = r->n_services < 16 ? r->n_services : 16;
        lsr.service = svcp;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        resp.list_services_response = &lsr;
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        f = find_file(r, req->file_by_filename);
        if (f < 0)
            snprintf(text, sizeof text, "file not found: %.500s", req->file_by_filename);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        for (size_t i = 0; i < r->n_syms && f < 0; i++)
            if (strcmp(r->syms[i].name, req->file_containing_symbol) == 0)
                f = (int)r->syms[i].file;
        if (f < 0)
            snprintf(text, sizeof text, "symbol not found: %.500s", req->file_containing_symbol);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        snprintf(text, sizeof text, "extension not found: the API declares no extensions");
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        snprintf(text, sizeof text, "type not found among extended types: %.400s "
                 "(the API declares no extensions)", req->all_extension_numbers_of_type);
        break;
    default:
        protobuf_c_message_free_unpacked(&req->base, NULL);
        snprintf(msg, cap, "a ServerReflectionRequest without a request (no field of "
                 "message_request set)");
        return ERR_FORMAT;
    }
    if (f >= 0) {
        files_answer(r, (unsigned)f, &fdr, files);
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        resp.file_descriptor_response = &fdr;
    } else if (!resp.list_services_response) {
        err.error_code = STATUS_NOT_FOUND;
        err.error_message = text;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &err;
    }
    size_t n = grpc__reflection__v1__server_reflection_response__get_packed_size(&resp);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        return -ENOMEM;
    }
    *out_len = grpc__reflection__v1__server_reflection_response__pack(&resp, buf);
    *out = buf;
    protobuf_c_message_free_unpacked(&req->base, NULL);
    return 0;
}

/* ---- the stream ---- */

enum rstate { R_ARRIVED, R_READ, R_DONE };

struct rcall {
    struct gw_reflect *r;
    int method;
    enum rstate state;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *in, *out;
    int cancelled;
    grpc_slice details;
    bool has_details;
    struct gw_tag tag;
};

static void on_event(struct gw_tag *t, bool ok);

static void request(struct gw_reflect *r, int m)
{
    if (atomic_load(&r->stopping))
        return;
    struct rcall *c = calloc(1, sizeof *c);
    if (!c) {
        LOG_ERR("gateway: out of memory: no longer accepting reflection calls");
        return;
    }
    c->r = r, c->method = m, c->state = R_ARRIVED;
    grpc_metadata_array_init(&c->md);
    gw__tag_set(&c->tag, on_event, c);
    grpc_call_error e = grpc_server_request_registered_call(
        r->server, r->methods[m], &c->call, &c->deadline, &c->md, NULL, r->cq, r->cq, &c->tag);
    if (e != GRPC_CALL_OK) {
        LOG_ERR("gateway: requesting a reflection call: gRPC error %d", (int)e);
        grpc_metadata_array_destroy(&c->md);
        free(c);
    }
}

static void rcall_free(struct rcall *c)
{
    if (c->in)
        grpc_byte_buffer_destroy(c->in);
    if (c->out)
        grpc_byte_buffer_destroy(c->out);
    if (c->has_details)
        grpc_slice_unref(c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->call)
        grpc_call_unref(c->call);
    free(c);
}

/* Starts ops[0..n) with the call's tag; on refusal the call is over. */
static void start(struct rcall *c, const grpc_op *ops, size_t n)
{
    gw__tag_set(&c->tag, on_event, c);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->tag, NULL);
    if (e != GRPC_CALL_OK) {
        LOG_WARN("gateway: reflection: grpc_call_start_batch: error %d", (int)e);
        rcall_free(c);
    }
}

/* The status, and the wait for the client's close, in one last batch. */
static void finish(struct rcall *c, grpc_status_code code, const char *msg)
{
    c->state = R_DONE;
    c->details = grpc_slice_from_copied_string(msg);
    c->has_details = true;
    grpc_op ops[2] = {0};
    ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[0].data.send_status_from_server.status = code;
    ops[0].data.send_status_from_server.status_details = code ? &c->details : NULL;
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &c->cancelled;
    start(c, ops, 2);
}

/* The request that came (c->in): its answer goes out with the read of the next one. */
static void answer(struct rcall *c)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, c->in)) {
        finish(c, GRPC_STATUS_INTERNAL, "cannot read the request");
        return;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(c->in);
    c->in = NULL;
    uint8_t *bytes;
    size_t n;
    char msg[200];
    int rc = gw_reflect_answer(c->r, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), &bytes, &n,
                               msg, sizeof msg);
    grpc_slice_unref(s);
    if (rc < 0) {
        finish(c, rc == ERR_FORMAT ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_RESOURCE_EXHAUSTED,
               rc == ERR_FORMAT ? msg : "out of memory");
        return;
    }
    grpc_slice out = grpc_slice_new(bytes, n, free);
    c->out = grpc_raw_byte_buffer_create(&out, 1);
    grpc_slice_unref(out);
    grpc_op ops[2] = {0};
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message = c->out;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &c->in;
    c->state = R_READ;
    start(c, ops, 2);
}

static void on_event(struct gw_tag *t, bool ok)
{
    struct rcall *c = t->obj;
    if (c->out) { /* the answer sent with the last batch */
        grpc_byte_buffer_destroy(c->out);
        c->out = NULL;
    }
    switch (c->state) {
    case R_ARRIVED: {
        if (!ok) { /* the server is shutting down: no call came */
            rcall_free(c);
            return;
        }
        request(c->r, c->method); /* the next call of this method */
        grpc_op ops[2] = {0};
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_RECV_MESSAGE;
        ops[1].data.recv_message.recv_message = &c->in;
        c->state = R_READ;
        start(c, ops, 2);
        return;
    }
    case R_READ:
        if (!ok) { /* the client went away */
            rcall_free(c);
            return;
        }
        if (!c->in) { /* the client half-closed: the stream is over */
            finish(c, GRPC_STATUS_OK, "");
            return;
        }
        answer(c);
        return;
    case R_DONE:
        rcall_free(c);
        return;
    }
}

/* ---- the server side ---- */

int gw_reflect_create(grpc_server *server, grpc_completion_queue *cq, struct gw_reflect **out)
{
    int rc = gw_reflect_index_create(out);
    if (rc < 0)
        return rc;
    struct gw_reflect *r = *out;
    r->server = server, r->cq = cq;
    atomic_init(&r->stopping, false);
    static const char *const paths[2] = {GW_REFLECT_V1, GW_REFLECT_V1ALPHA};
    for (int m = 0; m < 2; m++)
        r->methods[m] = grpc_server_register_method(server, paths[m], NULL,
                                                    GRPC_SRM_PAYLOAD_NONE, 0);
    return 0;
}

void gw_reflect_start(struct gw_reflect *r)
{
    for (int m = 0; m < 2; m++)
        request(r, m);
}

void gw_reflect_stop(struct gw_reflect *r)
{
    if (r)
        atomic_store(&r->stopping, true);
}

void gw_reflect_destroy(struct gw_reflect *r)
{
    if (!r)
        return;
    for (unsigned i = 0; i < r->n_files; i++)
        protobuf_c_message_free_unpacked(&r->files[i].fd->base, NULL);
    for (size_t i = 0; i < r->n_syms; i++)
        free(r->syms[i].name);
    free(r->syms);
    free(r->services);
    free(r);
}
