/*
 * ring.h — one single-producer/single-consumer ring of variable-length records in shared
 * memory (layout: shm_abi.h; design: docs/SHM.md). Each process holds one end: a struct
 * shm_ring in its private memory that points at the shared control block and data area.
 *
 * Producer: shm_ring_reserve() a record, fill its payload in place, shm_ring_commit() it (or
 * shm_ring_write() to copy a buffer in). Consumer: shm_ring_read() copies the next record out.
 * Both are non-blocking (-EAGAIN); shm_ring_wait_readable()/shm_ring_wait_writable() sleep on a
 * futex in the region until the other end makes progress, the timeout passes, or the peer check
 * (set by the region: is the other process still there?) says it never will.
 *
 * Failure model: everything read from shared memory is validated. A value that breaks the
 * protocol (a counter out of range or going backwards, a record header that lies) is logged
 * once, naming the ring and the value, returned as ERR_FORMAT, and marks the ring broken, here
 * and in the region so the peer stops too; every later call returns ERR_STATE. Nothing a peer
 * writes can make this end read or write outside the data area.
 *
 * NOTES: an end belongs to one thread at a time (callers serialize, e.g. a mutex around the
 * gateway's producer end). The two ends may run in different threads or processes; that is the
 * point. Records are copied out on read, never decoded in place: the peer can rewrite shared
 * memory at any moment, so a value must be fetched once into private memory before it is
 * checked and used.
 */
#ifndef CLOCHER_SHM_RING_H
#define CLOCHER_SHM_RING_H

#include "shm_abi.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum shm_ring_role { SHM_RING_PRODUCER = 1, SHM_RING_CONSUMER = 2 };

/* Called by the wait functions before each sleep: 0 to keep waiting, or a negative code that
 * ends the wait with that code (the region returns -EPIPE when the peer process is gone). */
typedef int shm_ring_peer_fn(void *ud);

/* Counters of this end (private; for tests and metrics). */
struct shm_ring_stats {
    uint64_t records;               /* records committed (producer) / read (consumer), no pads */
    uint64_t bytes;                 /* payload bytes of those records */
    uint64_t pads;                  /* wrap-around pad records written / skipped */
    uint64_t full;                  /* producer: reserve found no room (-EAGAIN) */
    uint64_t sleeps;                /* futex waits entered */
    uint64_t wakes;                 /* futex wakes issued to the other end */
};

#define SHM_RING_MAGIC 0x474e4952u  /* "RING" */
#define SHM_RING_SLICE_NS 50000000ull /* a sleeping end re-checks its peer this often */

struct shm_ring {
    uint32_t magic;
    enum shm_ring_role role;
    unsigned id;                    /* enum shm_ring_id, for the record-direction check of msg.h */
    struct shm_ring_ctl *ctl;       /* shared */
    uint8_t *data;                  /* shared: [capacity] */
    uint64_t capacity, mask;        /* private copies: never re-read from shared memory */
    uint32_t max_record;
    uint64_t pos;                   /* own counter: producer tail / consumer head (authoritative) */
    uint64_t peer_pos;              /* last validated counter of the other end */
    uint64_t seq;                   /* sequence number of the next record */
    bool reserved;                  /* producer: a reservation awaits commit/abort */
    uint64_t resv_pos, resv_seq;    /* producer: pos and seq once the reservation is committed */
    uint32_t resv_len;
    bool broken;
    uint64_t slice_ns;
    shm_ring_peer_fn *peer_check;
    void *peer_ud;
    struct shm_ring_stats stats;
    char name[96];                  /* for messages: "worker 3 gen 7 events ring" */
};

/* Bytes a record of `len` payload bytes occupies (header and padding included). */
static inline uint64_t shm_ring_record_size(uint32_t len)
{
    return ((uint64_t)len + sizeof(struct shm_rec_hdr) + SHM_REC_ALIGN - 1) &
           ~(uint64_t)(SHM_REC_ALIGN - 1);
}

/* The largest payload a ring of `capacity` bytes can carry: one record must fit even after a
 * pad at the worst position, so it may use at most half the ring. */
static inline uint32_t shm_ring_max_record_for(uint64_t capacity)
{
    uint64_t m = capacity / 2 - sizeof(struct shm_rec_hdr);
    return m > UINT32_MAX ? UINT32_MAX : (uint32_t)m;
}

/* Creator only, before either end exists: zeroes the control block. */
void shm_ring_format(struct shm_ring_ctl *ctl);

/*
 * Opens one end over a formatted (or attached and validated) ring: `data` holds `capacity`
 * bytes, a power of two in [SHM_RING_MIN_CAPACITY, SHM_RING_MAX_CAPACITY]; max_record <=
 * shm_ring_max_record_for(capacity). These come from the caller's private copy of the ring's
 * geometry, never from shared memory. The end starts at the counter values in the control block
 * (0 for a fresh ring); a producer needs an empty ring (head == tail), a consumer may find
 * records already published. ERR_RANGE (logged) for an impossible geometry, ERR_FORMAT (logged)
 * for counters that are not aligned or not empty for a producer.
 */
int shm_ring_init(struct shm_ring *r, enum shm_ring_role role, unsigned id,
                  struct shm_ring_ctl *ctl, void *data, uint64_t capacity, uint32_t max_record,
                  const char *name);
/* Releases nothing shared (the region owns the memory); drops a pending reservation. */
void shm_ring_fini(struct shm_ring *r);

void shm_ring_set_name(struct shm_ring *r, const char *name);
void shm_ring_set_peer_check(struct shm_ring *r, shm_ring_peer_fn *fn, void *ud);
/* How often a sleeping end re-checks its peer (default SHM_RING_SLICE_NS; tests shorten it). */
void shm_ring_set_slice_ns(struct shm_ring *r, uint64_t ns);

static inline uint32_t shm_ring_max_record(const struct shm_ring *r) { return r->max_record; }
/* This end gave up on the ring, or the other end did. */
bool shm_ring_broken(const struct shm_ring *r);

/* ---- producer ---- */

/*
 * Reserves room for one record of `len` payload bytes and `type` (>= 16) and points *payload at
 * its payload in the data area (16-byte aligned). The record is invisible to the consumer until
 * shm_ring_commit(); shm_ring_abort() drops it. -EAGAIN when the ring has no room now;
 * ERR_RANGE (logged) when len > max_record; ERR_FORMAT/ERR_STATE when the ring is broken.
 */
int shm_ring_reserve(struct shm_ring *r, uint32_t type, uint32_t len, void **payload);
/* Publishes the reserved record and wakes a sleeping consumer. */
void shm_ring_commit(struct shm_ring *r);
void shm_ring_abort(struct shm_ring *r);
/* reserve + copy + commit. */
int shm_ring_write(struct shm_ring *r, uint32_t type, const void *buf, uint32_t len);
/*
 * Waits until a record of `len` payload bytes fits. 0 when it does; -ETIMEDOUT after timeout_ns
 * (< 0: no deadline; the peer check still ends the wait); -EINTR on a signal; the peer check's
 * code; ERR_RANGE/ERR_FORMAT/ERR_STATE as reserve.
 */
int shm_ring_wait_writable(struct shm_ring *r, uint32_t len, int64_t timeout_ns);

/* ---- consumer ---- */

/*
 * Copies the next record's payload into buf[cap] and consumes it. 0 with *type and *len set;
 * -EAGAIN when the ring is empty; -EMSGSIZE (logged, record left in place, *len = its size)
 * when cap is too small (give it shm_ring_max_record() bytes); ERR_FORMAT (logged, ring broken)
 * when the producer wrote something impossible; ERR_STATE once broken.
 */
int shm_ring_read(struct shm_ring *r, void *buf, size_t cap, uint32_t *type, uint32_t *len);
/* Waits until a record is available. Codes as shm_ring_wait_writable(). Records committed
 * before the producer died are still delivered: the peer check runs only on an empty ring. */
int shm_ring_wait_readable(struct shm_ring *r, int64_t timeout_ns);

/* Gives up on the ring without a message of its own (the caller has logged why, e.g. a record
 * that does not decode): both ends get ERR_STATE from now on. */
void shm_ring_mark_broken(struct shm_ring *r);

/* Wakes whatever sleeps on either futex of the ring (used when closing or giving up). */
void shm_ring_wake_all(struct shm_ring_ctl *ctl);

#endif
