/*
 * gw_reflect.h — gRPC server reflection for clocherd's gateway (grpc.reflection.v1 and
 * v1alpha, ServerReflection/ServerReflectionInfo), so grpcurl, Postman and other generic
 * clients discover the API without the .proto files. What it serves is the FileDescriptorSet
 * protoc made of proto/ at build time, embedded in the daemon (proto/CMakeLists.txt): the
 * answer is always the schema the binary was built from.
 *
 * Answers list_services, file_by_filename and file_containing_symbol (a file comes with its
 * transitive imports); file_containing_extension and all_extension_numbers_of_type answer
 * NOT_FOUND (the API declares no extensions). A request that is not a ServerReflectionRequest
 * ends the stream with INVALID_ARGUMENT. Reflection needs no API key: it shows only the
 * public schema (docs/OPERATIONS.md).
 *
 * NOTES: the index is built once and read-only afterwards; each call has one batch in flight
 * at a time, so its completions (on any CQ thread) never overlap.
 */
#ifndef CLOCHER_DAEMON_GW_REFLECT_H
#define CLOCHER_DAEMON_GW_REFLECT_H

#include <grpc/grpc.h>
#include <stddef.h>
#include <stdint.h>

struct gw_reflect;

/* The method paths served (v1 and v1alpha). */
#define GW_REFLECT_V1 "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
#define GW_REFLECT_V1ALPHA "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

/* Indexes the embedded descriptor set and registers both methods on server, which must not
 * be started yet. 0, -ENOMEM, or ERR_FORMAT (a descriptor set that does not parse: a build
 * fault; logged). */
int gw_reflect_create(grpc_server *server, grpc_completion_queue *cq, struct gw_reflect **out);
/* Asks gRPC for the first call of each method (after grpc_server_start). */
void gw_reflect_start(struct gw_reflect *r);
/* No more calls are asked for (before the server shuts down). */
void gw_reflect_stop(struct gw_reflect *r);
/* After the completion queue is drained (every call it had has ended). NULL is fine. */
void gw_reflect_destroy(struct gw_reflect *r);

/*
 * One request's bytes -> the response's bytes (*out: malloc'd, free() it), the server's whole
 * logic without gRPC (also what the unit test and the fuzzer call). 0; ERR_FORMAT when the
 * bytes are not a ServerReflectionRequest (msg[cap] says why, for the status); -ENOMEM.
 */
int gw_reflect_answer(const struct gw_reflect *r, const uint8_t *req, size_t len,
                      uint8_t **out, size_t *out_len, char *msg, size_t cap);

/* The index alone, for gw_reflect_answer without a server (tests, fuzzing). */
int gw_reflect_index_create(struct gw_reflect **out);

#endif
