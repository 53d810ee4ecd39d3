/*
 * auth.h — who is calling the gateway and how many streams each caller may hold: the API key
 * of a call's `authorization: Bearer <key>` metadata mapped to a tenant of the configuration,
 * and the per-tenant concurrent-stream counters (config tenants[].max_concurrent_streams).
 *
 * NOTES: pure functions of a config snapshot, no gRPC: the gateway passes the header's bytes,
 * unit tests pass strings. A configuration without tenants is anonymous access (config.c only
 * allows it on local listeners): every call is the tenant "" with every adapter allowed.
 * Keys are compared in constant time (a key's prefix must not be guessable from timings), the
 * sha256: form by hashing what the client sent.
 */
#ifndef CLOCHER_DAEMON_AUTH_H
#define CLOCHER_DAEMON_AUTH_H

#include "config.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The tenant a call's authorization header value names. `value` is the header's bytes (not
 * NUL-terminated; NULL when the call had none). 0 with *out the tenant (NULL for anonymous
 * access); ERR_FORMAT when the header is missing or not "Bearer <key>" while tenants are
 * configured; ERR_NOT_FOUND when no tenant holds the key. Nothing is logged (a caller's
 * mistake, not the daemon's; the gateway answers UNAUTHENTICATED and counts it).
 */
int auth_tenant(const struct config *c, const char *value, size_t len,
                const struct config_tenant **out);

/* A stable nonzero id for a tenant name (the engine's fairness key): FNV-1a 64. */
uint64_t auth_tenant_id(const char *name);

/* ---- concurrent streams per tenant ---- */

#define AUTH_MAX_TRACKED 256 /* tenant names tracked at once; config.c caps tenants lower */

struct auth_streams {
    pthread_mutex_t mu;
    size_t n;
    struct {
        char name[CONFIG_NAME_MAX];
        uint32_t active;
    } t[AUTH_MAX_TRACKED];
};

void auth_streams_init(struct auth_streams *s);
void auth_streams_fini(struct auth_streams *s);
/* One more stream for `tenant` if it holds fewer than `limit` (0 = no limit): 0, or
 * ERR_OVERLOADED (the gateway's RESOURCE_EXHAUSTED). */
int auth_streams_acquire(struct auth_streams *s, const char *tenant, uint32_t limit);
/* n more at once (a BatchGenerate holds one per request), all or none: 0 or ERR_OVERLOADED. */
int auth_streams_acquire_n(struct auth_streams *s, const char *tenant, uint32_t n,
                           uint32_t limit);
/* Gives back a stream auth_streams_acquire granted. */
void auth_streams_release(struct auth_streams *s, const char *tenant);
/* Gives back n streams auth_streams_acquire_n granted. */
void auth_streams_release_n(struct auth_streams *s, const char *tenant, uint32_t n);
/* Streams `tenant` holds now. */
uint32_t auth_streams_active(struct auth_streams *s, const char *tenant);

#endif
