/*
 * lora_registry.c — the adapters a worker serves, by name (lora.h "registry"): load, unload,
 * and one reference per request that uses an adapter.
 *
 * NOTES: single-threaded by contract (the engine's owner thread), except
 * lora_registry_release, which only drops an adapter reference (atomic).
 */
#include "lora.h"

#include "check.h"
#include "err.h"
#include "log.h"
#include "lora_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define REGISTRY_MAGIC 0x4c6f5267u /* "LoRg" */

struct lora_registry {
    uint32_t magic;
    struct iebin_hparams hp;
    enum lora_pack pack; /* applied to adapters loaded from now on */
    size_t max, n;
    struct lora_adapter **v; /* [max], the first n used, in load order */
};

int lora_registry_create(const struct iebin_hparams *hp, size_t max_adapters,
                         struct lora_registry **out)
{
    int rc;
    *out = NULL;
    if ((rc = iebin_check_hparams(hp, "LoRA registry base model")) != 0)
        return rc;
    struct lora_registry *r = calloc(1, sizeof *r);
    size_t max = max_adapters ? max_adapters : LORA_REGISTRY_DEFAULT_MAX;
    if (r)
        r->v = calloc(max, sizeof *r->v);
    if (!r || !r->v) {
        LOG_ERR("LoRA registry: out of memory");
        free(r);
        return -ENOMEM;
    }
    r->magic = REGISTRY_MAGIC;
    r->hp = *hp;
    r->max = max;
    *out = r;
    return 0;
}

void lora_registry_destroy(struct lora_registry *r)
{
    if (!r)
        return;
    CHECK(r->magic == REGISTRY_MAGIC);
    for (size_t i = 0; i < r->n; i++)
        lora__adapter_unref(r->v[i]);
    r->magic = 0;
    free(r->v);
    free(r);
}

static long find(const struct lora_registry *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->v[i]->name, name) == 0)
            return (long)i;
    return -1;
}

static int check_name(const char *name)
{
    size_t n = strnlen(name, LORA_NAME_MAX);
    bool ok = n > 0 && n < LORA_NAME_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        char c = name[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    }
    if (!ok) {
        LOG_ERR("LoRA adapter name '%.*s%s' is invalid: 1..%u bytes of A-Z a-z 0-9 . _ -",
                (int)(n > 64 ? 64 : n), name, n > 64 ? "..." : "", LORA_NAME_MAX - 1);
        return ERR_FORMAT;
    }
    return 0;
}

void lora_registry_set_pack(struct lora_registry *r, enum lora_pack pack)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    r->pack = pack;
}

int lora_registry_load(struct lora_registry *r, const char *name, const char *dir)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    int rc;
    if ((rc = check_name(name)) != 0)
        return rc;
    long taken = find(r, name);
    if (taken >= 0) {
        LOG_ERR("LoRA adapter '%s' is already loaded (from %s): unload it first", name,
                r->v[taken]->dir);
        return ERR_STATE;
    }
    if (r->n == r->max) {
        LOG_ERR("LoRA adapter '%s': %zu adapters are loaded, the most this registry holds",
                name, r->max);
        return ERR_OVERLOADED;
    }
    struct lora_adapter *ad;
    if ((rc = lora__open_named(dir, name, &r->hp, &ad)) != 0)
        return rc;
    if ((rc = lora_repack(ad, r->pack)) != 0) {
        lora__adapter_unref(ad);
        return rc;
    }
    r->v[r->n++] = ad;
    LOG_INFO("LoRA adapter '%s' loaded from %s (r=%u, scaling %g, %s weights)", name, dir,
             ad->cfg.rank, (double)ad->cfg.scaling,
             ad->fast_dt == DT_BF16 ? "bf16" : "f32");
    return 0;
}

int lora_registry_unload(struct lora_registry *r, const char *name)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    long i = find(r, name);
    if (i < 0) {
        LOG_ERR("LoRA adapter '%.64s' is not loaded", name);
        return ERR_NOT_FOUND;
    }
    struct lora_adapter *ad = r->v[i];
    memmove(&r->v[i], &r->v[i + 1], (r->n - (size_t)i - 1) * sizeof *r->v);
    r->n--;
    int users = lora_refcount(ad) - 1;
    if (users > 0)
        LOG_INFO("LoRA adapter '%s' unloaded; freed when its %d user(s) finish", name, users);
    else
        LOG_INFO("LoRA adapter '%s' unloaded", name);
    lora__adapter_unref(ad);
    return 0;
}

int lora_registry_acquire(struct lora_registry *r, const char *name, struct lora_adapter **out)
{
    CHECK(r->magic == REGISTRY_MAGIC);
    *out = NULL;
    long i = find(r, name);
    if (i < 0) {
        LOG_ERR("LoRA adapter '%.64s' is not loaded", name);
        return ERR_NOT_FOUND;
    }
    atomic_fetch_add_explicit(&r->v[i]->refs_, 1, memory_order_relaxed);
    *out = r->v[i];
    return 0;
}

void lora_registry_release(struct lora_adapter *ad) { lora__adapter_unref(ad); }

size_t lora_registry_count(const struct lora_registry *r) { return r->n; }

const struct lora_adapter *lora_registry_at(const struct lora_registry *r, size_t i)
{
    CHECK(i < r->n);
    return r->v[i];
}
