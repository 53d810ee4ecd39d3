/*
 * shmtest.c — deterministic checksummed records and in-process ring pairs (shmtest.h).
 */
#include "shmtest.h"
#include "mono.h"
#include "rng.h"

#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t st_splitmix(uint64_t *state) { return rng_splitmix64(state); }

static uint64_t rec_state(uint64_t seed, uint64_t i)
{
    uint64_t s = seed * 0x2545f4914f6cdd1dull + i;
    st_splitmix(&s);
    return s;
}

uint32_t st_type(uint64_t seed, uint64_t i)
{
    return 16 + (uint32_t)(rec_state(seed, i) % 48);
}

uint32_t st_len(uint64_t seed, uint64_t i, uint32_t max)
{
    uint64_t s = rec_state(seed, i) ^ 0x5555;
    uint64_t r = st_splitmix(&s);
    uint32_t pick = (uint32_t)(r % 100), v = (uint32_t)(r >> 32);
    uint32_t hi = pick < 75 ? 128 : pick < 98 ? 2048 : max;
    if (hi > max)
        hi = max;
    return 16 + v % (hi - 16 + 1);
}

static uint64_t checksum(const uint8_t *p, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, p + k, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; k < n; k++)
        h = (h ^ p[k]) * 0x100000001b3ull;
    return h;
}

void st_fill(uint64_t seed, uint64_t i, uint8_t *buf, uint32_t len)
{
    CHECK(len >= 16);
    uint64_t s = rec_state(seed, i) ^ 0xaaaa;
    uint32_t k = 16;
    for (; k + 8 <= len; k += 8) {
        uint64_t w = st_splitmix(&s);
        memcpy(buf + k, &w, 8);
    }
    if (k < len) {
        uint64_t w = st_splitmix(&s);
        memcpy(buf + k, &w, len - k);
    }
    uint64_t sum = checksum(buf + 16, len - 16);
    memcpy(buf, &i, 8);
    memcpy(buf + 8, &sum, 8);
}

int st_check(uint64_t seed, uint64_t i, uint32_t max, uint32_t type, const uint8_t *buf,
             uint32_t len, char *why, size_t n)
{
    uint64_t idx, sum;
    if (len < 16) {
        snprintf(why, n, "record %llu: %u bytes, too short", (unsigned long long)i, len);
        return -1;
    }
    memcpy(&idx, buf, 8);
    memcpy(&sum, buf + 8, 8);
    if (idx != i) {
        snprintf(why, n, "expected record %llu, got record %llu", (unsigned long long)i,
                 (unsigned long long)idx);
        return -1;
    }
    if (len != st_len(seed, i, max) || type != st_type(seed, i)) {
        snprintf(why, n, "record %llu: type %u length %u, expected type %u length %u",
                 (unsigned long long)i, type, len, st_type(seed, i), st_len(seed, i, max));
        return -1;
    }
    if (checksum(buf + 16, len - 16) != sum) {
        snprintf(why, n, "record %llu: checksum mismatch", (unsigned long long)i);
        return -1;
    }
    return 0;
}

uint64_t st_now_ns(void) { return mono_ns(); }

void st_pair_init_at(struct st_pair *p, uint64_t capacity, uint32_t max_record, uint64_t start)
{
    p->capacity = capacity;
    p->ctl = aligned_alloc(64, sizeof *p->ctl);
    p->data = aligned_alloc(64, capacity);
    CHECK(p->ctl && p->data);
    memset(p->data, 0xee, capacity);
    shm_ring_format(p->ctl);
    atomic_store(&p->ctl->head, start);
    atomic_store(&p->ctl->tail, start);
    CHECK(shm_ring_init(&p->prod, SHM_RING_PRODUCER, SHM_RING_REQUESTS, p->ctl, p->data, capacity,
                        max_record, "test ring") == 0);
    CHECK(shm_ring_init(&p->cons, SHM_RING_CONSUMER, SHM_RING_REQUESTS, p->ctl, p->data, capacity,
                        max_record, "test ring") == 0);
}

void st_pair_init(struct st_pair *p, uint64_t capacity, uint32_t max_record)
{
    st_pair_init_at(p, capacity, max_record, 0);
}

void st_pair_fini(struct st_pair *p)
{
    shm_ring_fini(&p->prod);
    shm_ring_fini(&p->cons);
    free(p->ctl);
    free(p->data);
}
