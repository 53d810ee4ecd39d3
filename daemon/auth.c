/*
 * auth.c — API keys to tenants, and per-tenant stream counters (see auth.h).
 */
#include "auth.h"

#include "err.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Constant-time equality of two byte strings of the same length. */
static int same_bytes(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(x[i] ^ y[i]);
    return d == 0;
}

static int key_matches(const struct config_key *k, const char *key, size_t len,
                       const unsigned char digest[32])
{
    if (k->kind == CONFIG_KEY_SHA256)
        return same_bytes(k->sha256, digest, 32);
    size_t n = strlen(k->plain);
    /* the length of a configured key is no secret worth a timing channel of its own */
    return n == len && same_bytes(k->plain, key, len);
}

int auth_tenant(const struct config *c, const char *value, size_t len,
                const struct config_tenant **out)
{
    *out = NULL;
    if (c->n_tenants == 0)
        return 0;
    static const char bearer[] = "Bearer ";
    const size_t pl = sizeof bearer - 1;
    if (!value || len <= pl || strncasecmp(value, bearer, pl) != 0)
        return ERR_FORMAT;
    const char *key = value + pl;
    size_t n = len - pl;
    while (n && *key == ' ')
        key++, n--;
    while (n && key[n - 1] == ' ')
        n--;
    if (n == 0 || n > 4096)
        return n ? ERR_NOT_FOUND : ERR_FORMAT;
    unsigned char digest[32];
    SHA256((const unsigned char *)key, n, digest);
    /* every key is compared, whichever matches: the time does not say which tenant it was */
    const struct config_tenant *found = NULL;
    for (size_t i = 0; i < c->n_tenants; i++)
        for (size_t j = 0; j < c->tenants[i].n_keys; j++)
            if (key_matches(&c->tenants[i].keys[j], key, n, digest) && !found)
                found = &c->tenants[i];
    if (!found)
        return ERR_NOT_FOUND;
    *out = found;
    return 0;
}

uint64_t auth_tenant_id(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; p && *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h ? h : 1;
}

/* ---- streams ---- */

void auth_streams_init(struct auth_streams *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

void auth_streams_fini(struct auth_streams *s) { pthread_mutex_destroy(&s->mu); }

/* The entry of `tenant`, or a free one claimed for it (NULL when the table is full). Held mu. */
static size_t find(struct auth_streams *s, const char *tenant, int claim)
{
    size_t free_i = AUTH_MAX_TRACKED;
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->t[i].name, tenant) == 0)
            return i;
        if (s->t[i].active == 0 && free_i == AUTH_MAX_TRACKED)
            free_i = i;
    }
    if (!claim)
        return AUTH_MAX_TRACKED;
    if (free_i == AUTH_MAX_TRACKED) {
        if (s->n == AUTH_MAX_TRACKED)
            return AUTH_MAX_TRACKED;
        free_i = s->n++;
    }
    snprintf(s->t[free_i].name, sizeof s->t[free_i].name, "%s", tenant);
    s->t[free_i].active = 0;
    return free_i;
}

int auth_streams_acquire_n(struct auth_streams *s, const char *tenant, uint32_t n,
                           uint32_t limit)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    size_t i = find(s, tenant, 1);
    if (i == AUTH_MAX_TRACKED || (limit && (s->t[i].active >= limit || n > limit - s->t[i].active)))
        rc = ERR_OVERLOADED;
    else
        s->t[i].active += n;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int auth_streams_acquire(struct auth_streams *s, const char *tenant, uint32_t limit)
{
    return auth_streams_acquire_n(s, tenant, 1, limit);
}

void auth_streams_release_n(struct auth_streams *s, const char *tenant, uint32_t n)
{
    pthread_mutex_lock(&s->mu);
    size_t i = find(s, tenant, 0);
    if (i != AUTH_MAX_TRACKED)
        s->t[i].active -= s->t[i].active < n ? s->t[i].active : n;
    pthread_mutex_unlock(&s->mu);
}

void auth_streams_release(struct auth_streams *s, const char *tenant)
{
    auth_streams_release_n(s, tenant, 1);
}

uint32_t auth_streams_active(struct auth_streams *s, const char *tenant)
{
    pthread_mutex_lock(&s->mu);
    size_t i = find(s, tenant, 0);
    uint32_t n = i == AUTH_MAX_TRACKED ? 0 : s->t[i].active;
    pthread_mutex_unlock(&s->mu);
    return n;
}
