/*
 * shmtest.h — helpers shared by the shm tests: deterministic records of random sizes that carry
 * their index and a checksum, so a consumer can verify order, length and content of every
 * record without a copy of what was sent; and a shared-memory ring pair for in-process tests.
 */
#ifndef CLOCHER_TESTS_SHMTEST_H
#define CLOCHER_TESTS_SHMTEST_H

#include "ring.h"

#include <stdbool.h>
#include <stdint.h>

/* Record i of stream `seed`: its type (>= 16), length (16..max) and bytes. The first 8 payload
 * bytes hold i, the next 8 a checksum of the rest. */
uint32_t st_type(uint64_t seed, uint64_t i);
uint32_t st_len(uint64_t seed, uint64_t i, uint32_t max);
void st_fill(uint64_t seed, uint64_t i, uint8_t *buf, uint32_t len);
/* 0 when buf[len] of `type` is record i of stream seed; else a description in why[n]. */
int st_check(uint64_t seed, uint64_t i, uint32_t max, uint32_t type, const uint8_t *buf,
             uint32_t len, char *why, size_t n);

uint64_t st_now_ns(void);
uint64_t st_splitmix(uint64_t *state);

/* Both ends of one ring over private (malloc'd) memory: for tests inside one process. */
struct st_pair {
    struct shm_ring_ctl *ctl;
    uint8_t *data;
    uint64_t capacity;
    struct shm_ring prod, cons;
};
void st_pair_init(struct st_pair *p, uint64_t capacity, uint32_t max_record);
/* The same, with both counters starting at `start` (a multiple of 16): counter wrap tests. */
void st_pair_init_at(struct st_pair *p, uint64_t capacity, uint32_t max_record, uint64_t start);
void st_pair_fini(struct st_pair *p);

#endif
