/*
 * ring.c — the SPSC record ring (ring.h, docs/SHM.md).
 *
 * NOTES on ordering: the rules and their labels (R1/A1, R2/A2, S1/S2, W1/W2, BRK) are part of
 * the ABI and defined in shm_abi.h, "Ordering"; each atomic access below names its label. The
 * futex word is read before the flag is set, so a wake that lands between the check and the
 * sleep makes FUTEX_WAIT return at once.
 * Fast path: a store and a load of a flag that is almost always 0 — no system call per record.
 * A sleeper wakes every slice_ns to run the peer check, so a dead peer is noticed even though
 * it will never wake us.
 */
#include "ring.h"

#include "check.h"
#include "err.h"
#include "internal.h"
#include "mono.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define HDR ((uint64_t)sizeof(struct shm_rec_hdr))
#define SPIN 128 /* polls before sleeping: a busy peer usually answers within microseconds */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void shm_ring_format(struct shm_ring_ctl *ctl)
{
    memset(ctl, 0, sizeof *ctl);
}

void shm_ring_set_name(struct shm_ring *r, const char *name)
{
    snprintf(r->name, sizeof r->name, "%s", name ? name : "ring");
}

int shm_ring_init(struct shm_ring *r, enum shm_ring_role role, unsigned id,
                  struct shm_ring_ctl *ctl, void *data, uint64_t capacity, uint32_t max_record,
                  const char *name)
{
    memset(r, 0, sizeof *r);
    shm_ring_set_name(r, name);
    if (capacity < SHM_RING_MIN_CAPACITY || capacity > SHM_RING_MAX_CAPACITY ||
        (capacity & (capacity - 1)) != 0) {
        LOG_ERR("%s: capacity %" PRIu64 " is not a power of two in [%u, %u]", r->name, capacity,
                SHM_RING_MIN_CAPACITY, SHM_RING_MAX_CAPACITY);
        return ERR_RANGE;
    }
    if (max_record == 0 || max_record > shm_ring_max_record_for(capacity)) {
        LOG_ERR("%s: max record %" PRIu32 " is not in 1..%" PRIu32 " for capacity %" PRIu64,
                r->name, max_record, shm_ring_max_record_for(capacity), capacity);
        return ERR_RANGE;
    }
    CHECK(role == SHM_RING_PRODUCER || role == SHM_RING_CONSUMER);
    CHECK(((uintptr_t)data & (SHM_REC_ALIGN - 1)) == 0);
    /* The own counter is read once here and never again: from now on this end's copy is the
     * truth. Rings are opened fresh (the caller, region attach, checks the block): the producer
     * finds them empty; the consumer may find records published before it came, numbered from
     * 0 at its head, and learns the tail at its first read. */
    uint64_t own = role == SHM_RING_PRODUCER ? atomic_load(&ctl->tail) : atomic_load(&ctl->head);
    if (own % SHM_REC_ALIGN) {
        LOG_ERR("%s: %s %" PRIu64 " is not a multiple of %u", r->name,
                role == SHM_RING_PRODUCER ? "tail" : "head", own, SHM_REC_ALIGN);
        return ERR_FORMAT;
    }
    if (role == SHM_RING_PRODUCER && atomic_load(&ctl->head) != own) {
        LOG_ERR("%s: head %" PRIu64 " differs from tail %" PRIu64 ": a producer opens an empty "
                "ring", r->name, atomic_load(&ctl->head), own);
        return ERR_FORMAT;
    }
    r->magic = SHM_RING_MAGIC;
    r->role = role;
    r->id = id;
    r->ctl = ctl;
    r->data = data;
    r->capacity = capacity;
    r->mask = capacity - 1;
    r->max_record = max_record;
    r->slice_ns = SHM_RING_SLICE_NS;
    r->pos = own;
    r->peer_pos = own;
    r->seq = 0;
    return 0;
}

void shm_ring_fini(struct shm_ring *r)
{
    if (!r || r->magic != SHM_RING_MAGIC)
        return;
    r->reserved = false;
    r->magic = 0;
}

void shm_ring_set_peer_check(struct shm_ring *r, shm_ring_peer_fn *fn, void *ud)
{
    r->peer_check = fn;
    r->peer_ud = ud;
}

void shm_ring_set_slice_ns(struct shm_ring *r, uint64_t ns)
{
    r->slice_ns = ns ? ns : 1;
}

bool shm_ring_broken(const struct shm_ring *r)
{
    return r->broken || atomic_load_explicit(&r->ctl->broken, memory_order_relaxed) != 0; /* BRK */
}

void shm_ring_wake_all(struct shm_ring_ctl *ctl)
{
    /* W1: what the caller announced (CLOSED, broken) before these bumps */
    atomic_fetch_add_explicit(&ctl->data_seq, 1, memory_order_release);
    atomic_fetch_add_explicit(&ctl->space_seq, 1, memory_order_release);
    shm__futex_wake(&ctl->data_seq);
    shm__futex_wake(&ctl->space_seq);
}

/* The protocol was broken: say what, stop using the ring, tell the peer. */
static int corrupt(struct shm_ring *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(struct shm_ring *r, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    LOG_ERR("%s: %s: ring is corrupt, giving up on it", r->name, what);
    shm_ring_mark_broken(r);
    return ERR_FORMAT;
}

void shm_ring_mark_broken(struct shm_ring *r)
{
    r->broken = true;
    r->reserved = false;
    atomic_store_explicit(&r->ctl->broken, 1, memory_order_relaxed); /* BRK */
    shm_ring_wake_all(r->ctl);
}

/* ERR_STATE once either end has given up; logs the first time this end notices the peer did. */
static int check_usable(struct shm_ring *r)
{
    CHECK(r->magic == SHM_RING_MAGIC);
    if (r->broken)
        return ERR_STATE;
    if (atomic_load_explicit(&r->ctl->broken, memory_order_relaxed) != 0) { /* BRK */
        LOG_ERR("%s: the other end found the ring corrupt and gave up on it", r->name);
        r->broken = true;
        r->reserved = false;
        return ERR_STATE;
    }
    return 0;
}

/* Wakes the other end if it sleeps on `word` (S2: the caller's counter store came before). */
static void wake_if_waiting(struct shm_ring *r, _Atomic uint32_t *waiting, _Atomic uint32_t *word)
{
    if (atomic_load_explicit(waiting, memory_order_seq_cst) == 0) /* S2 */
        return;
    /* relaxed: the flag only elects one waker; the bump below carries the ordering */
    if (atomic_exchange_explicit(waiting, 0, memory_order_relaxed) == 0)
        return; /* it woke by itself meanwhile */
    atomic_fetch_add_explicit(word, 1, memory_order_release); /* W1 */
    shm__futex_wake(word);
    r->stats.wakes++;
}

/* ---- producer ---- */

/* Loads and validates the consumer's head (A2; seq_cst when it is S1's re-check). The head may
 * only move forward, within [last seen head, our tail], in whole alignment units. */
static int refresh_head(struct shm_ring *r, memory_order mo)
{
    uint64_t h = atomic_load_explicit(&r->ctl->head, mo);
    if (h == r->peer_pos)
        return 0;
    if (h - r->peer_pos > r->pos - r->peer_pos)
        return corrupt(r, "head %" PRIu64 " outside [%" PRIu64 ", %" PRIu64 "] (last head, tail)",
                       h, r->peer_pos, r->pos);
    if (h % SHM_REC_ALIGN)
        return corrupt(r, "head %" PRIu64 " is not a multiple of %u", h, SHM_REC_ALIGN);
    r->peer_pos = h;
    return 0;
}

/* Bytes a record of `len` needs at the current tail: its size, plus a pad to the end of the
 * data area when it does not fit before it. */
static uint64_t need_at_tail(const struct shm_ring *r, uint32_t len)
{
    uint64_t size = shm_ring_record_size(len);
    uint64_t to_end = r->capacity - (r->pos & r->mask);
    return size <= to_end ? size : to_end + size;
}

static int check_len(struct shm_ring *r, uint32_t len)
{
    if (len > r->max_record) {
        LOG_ERR("%s: a record of %" PRIu32 " bytes exceeds the ring's limit of %" PRIu32, r->name,
                len, r->max_record);
        return ERR_RANGE;
    }
    return 0;
}

/* 1 when `need` bytes are free (refreshing the head once if the cached one says no), 0 if not. */
static int has_room(struct shm_ring *r, uint64_t need, memory_order mo)
{
    if (r->capacity - (r->pos - r->peer_pos) >= need)
        return 1;
    int rc = refresh_head(r, mo);
    if (rc < 0)
        return rc;
    return r->capacity - (r->pos - r->peer_pos) >= need;
}

int shm_ring_reserve(struct shm_ring *r, uint32_t type, uint32_t len, void **payload)
{
    CHECK(r->role == SHM_RING_PRODUCER);
    CHECK(type >= 16);
    int rc = check_usable(r);
    if (rc < 0 || (rc = check_len(r, len)) < 0)
        return rc;
    r->reserved = false;
    uint64_t need = need_at_tail(r, len);
    if ((rc = has_room(r, need, memory_order_acquire)) <= 0) { /* A2 */
        if (rc == 0)
            r->stats.full++;
        return rc < 0 ? rc : -EAGAIN;
    }
    uint64_t pos = r->pos, seq = r->seq;
    uint64_t off = pos & r->mask, to_end = r->capacity - off;
    uint64_t size = shm_ring_record_size(len);
    if (size > to_end) {
        /* the record would cross the end: fill the rest with a pad and start over at 0 */
        struct shm_rec_hdr pad = {.len = (uint32_t)(to_end - HDR), .type = SHM_REC_PAD,
                                  .seq = seq++};
        memcpy(r->data + off, &pad, sizeof pad);
        pos += to_end;
        off = 0;
    }
    struct shm_rec_hdr h = {.len = len, .type = type, .seq = seq++};
    memcpy(r->data + off, &h, sizeof h);
    *payload = r->data + off + HDR;
    r->reserved = true;
    r->resv_pos = pos + size;
    r->resv_seq = seq;
    r->resv_len = len;
    return 0;
}

void shm_ring_commit(struct shm_ring *r)
{
    CHECK(r->role == SHM_RING_PRODUCER);
    if (!r->reserved)
        return; /* the ring broke between reserve and commit: nothing to publish */
    r->stats.pads += r->resv_seq - r->seq - 1;
    r->stats.records++;
    r->stats.bytes += r->resv_len;
    r->pos = r->resv_pos;
    r->seq = r->resv_seq;
    r->reserved = false;
    /* R1 (+S2): publishes the pad, the header and the payload written since reserve */
    atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_seq_cst);
    wake_if_waiting(r, &r->ctl->cons_waiting, &r->ctl->data_seq);
}

void shm_ring_abort(struct shm_ring *r)
{
    r->reserved = false;
}

int shm_ring_write(struct shm_ring *r, uint32_t type, const void *buf, uint32_t len)
{
    void *p;
    int rc = shm_ring_reserve(r, type, len, &p);
    if (rc < 0)
        return rc;
    if (len)
        memcpy(p, buf, len);
    shm_ring_commit(r);
    return 0;
}

/* ---- consumer ---- */

/* Loads and validates the producer's tail (A1; seq_cst when it is S1's re-check). It is only
 * reloaded once every byte up to the last tail is consumed (pos == peer_pos), so "at most one
 * capacity after head" also rules out a tail that went backwards. */
static int refresh_tail(struct shm_ring *r, memory_order mo)
{
    CHECK(r->pos == r->peer_pos);
    uint64_t t = atomic_load_explicit(&r->ctl->tail, mo);
    if (t == r->peer_pos)
        return 0;
    if (t - r->pos > r->capacity)
        return corrupt(r, "tail %" PRIu64 " is not within %" PRIu64 " bytes after head %" PRIu64,
                       t, r->capacity, r->pos);
    if (t % SHM_REC_ALIGN)
        return corrupt(r, "tail %" PRIu64 " is not a multiple of %u", t, SHM_REC_ALIGN);
    r->peer_pos = t;
    return 0;
}

/* 1 when a record is available, 0 if not, < 0 on corruption. */
static int has_data(struct shm_ring *r, memory_order mo)
{
    if (r->peer_pos != r->pos)
        return 1;
    int rc = refresh_tail(r, mo);
    if (rc < 0)
        return rc;
    return r->peer_pos != r->pos;
}

int shm_ring_read(struct shm_ring *r, void *buf, size_t cap, uint32_t *type, uint32_t *len)
{
    CHECK(r->role == SHM_RING_CONSUMER);
    int rc = check_usable(r);
    if (rc < 0)
        return rc;
    for (;;) {
        if ((rc = has_data(r, memory_order_acquire)) <= 0) /* A1 */
            return rc < 0 ? rc : -EAGAIN;
        uint64_t avail = r->peer_pos - r->pos;
        uint64_t off = r->pos & r->mask, to_end = r->capacity - off;
        struct shm_rec_hdr h;
        memcpy(&h, r->data + off, sizeof h); /* fetched once; only the copy is checked and used */
        if (h.seq != r->seq)
            return corrupt(r, "record at byte %" PRIu64 " has sequence number %" PRIu64
                              ", expected %" PRIu64, r->pos, h.seq, r->seq);
        if (h.type == SHM_REC_PAD) {
            if (h.len != to_end - HDR)
                return corrupt(r, "pad record %" PRIu64 " of %" PRIu32 " bytes does not end at "
                                  "the end of the ring (%" PRIu64 " bytes left)",
                               h.seq, h.len, to_end - HDR);
            if (to_end > avail)
                return corrupt(r, "pad record %" PRIu64 " runs past the tail", h.seq);
            r->pos += to_end;
            r->seq++;
            r->stats.pads++;
            continue; /* head is published with the record that follows */
        }
        if (h.type < 16)
            return corrupt(r, "record %" PRIu64 " has reserved type %" PRIu32, h.seq, h.type);
        if (h.len > r->max_record)
            return corrupt(r, "record %" PRIu64 " claims %" PRIu32 " bytes, more than the limit "
                              "of %" PRIu32, h.seq, h.len, r->max_record);
        uint64_t size = shm_ring_record_size(h.len);
        if (size > to_end)
            return corrupt(r, "record %" PRIu64 " of %" PRIu32 " bytes crosses the end of the "
                              "ring (%" PRIu64 " bytes left)", h.seq, h.len, to_end);
        if (size > avail)
            return corrupt(r, "record %" PRIu64 " of %" PRIu32 " bytes runs past the tail "
                              "(%" PRIu64 " bytes published)", h.seq, h.len, avail);
        if (h.len > cap) {
            /* our caller's mistake, not the producer's: keep the record (and any pad before
             * it is already consumed, which is harmless) */
            LOG_ERR("%s: record %" PRIu64 " of %" PRIu32 " bytes does not fit a %zu-byte buffer",
                    r->name, h.seq, h.len, cap);
            *len = h.len;
            return -EMSGSIZE;
        }
        memcpy(buf, r->data + off + HDR, h.len);
        r->pos += size;
        r->seq++;
        r->stats.records++;
        r->stats.bytes += h.len;
        *type = h.type;
        *len = h.len;
        /* R2 (+S2): the copy is done; the producer may reuse these bytes */
        atomic_store_explicit(&r->ctl->head, r->pos, memory_order_seq_cst);
        wake_if_waiting(r, &r->ctl->prod_waiting, &r->ctl->space_seq);
        return 0;
    }
}

/* ---- waiting ---- */

/*
 * The common sleep loop. ready() answers "can the caller proceed" (1), "not yet" (0) or an
 * error; with seq_cst it is S1's re-check. `waiting` and `word` are this end's flag and futex.
 */
static int wait_until(struct shm_ring *r, int (*ready)(struct shm_ring *, uint32_t, memory_order),
                      uint32_t arg, _Atomic uint32_t *waiting, _Atomic uint32_t *word,
                      int64_t timeout_ns)
{
    uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : mono_ns() + (uint64_t)timeout_ns;
    for (int spin = 0;; spin++) {
        int rc = check_usable(r);
        if (rc < 0)
            return rc;
        if ((rc = ready(r, arg, memory_order_acquire)) != 0) /* A1 (readable) / A2 (writable) */
            return rc < 0 ? rc : 0;
        if (spin < SPIN && timeout_ns != 0) {
            cpu_relax();
            continue;
        }
        if (r->peer_check && (rc = r->peer_check(r->peer_ud)) < 0)
            return rc;
        uint64_t now = mono_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        uint32_t seen = atomic_load_explicit(word, memory_order_acquire); /* W2 */
        atomic_store_explicit(waiting, 1, memory_order_seq_cst); /* S1 */
        if ((rc = ready(r, arg, memory_order_seq_cst)) != 0) { /* S1's re-check */
            atomic_store_explicit(waiting, 0, memory_order_relaxed); /* our flag: orders nothing */
            return rc < 0 ? rc : 0;
        }
        uint64_t slice = deadline - now < r->slice_ns ? deadline - now : r->slice_ns;
        r->stats.sleeps++;
        rc = shm__futex_wait(word, seen, slice);
        atomic_store_explicit(waiting, 0, memory_order_relaxed);
        if (rc == -EINTR)
            return rc;
    }
}

static int ready_readable(struct shm_ring *r, uint32_t unused, memory_order mo)
{
    (void)unused;
    return has_data(r, mo);
}

static int ready_writable(struct shm_ring *r, uint32_t len, memory_order mo)
{
    return has_room(r, need_at_tail(r, len), mo);
}

int shm_ring_wait_readable(struct shm_ring *r, int64_t timeout_ns)
{
    CHECK(r->role == SHM_RING_CONSUMER);
    return wait_until(r, ready_readable, 0, &r->ctl->cons_waiting, &r->ctl->data_seq, timeout_ns);
}

int shm_ring_wait_writable(struct shm_ring *r, uint32_t len, int64_t timeout_ns)
{
    CHECK(r->role == SHM_RING_PRODUCER);
    int rc = check_len(r, len);
    if (rc < 0)
        return rc;
    return wait_until(r, ready_writable, len, &r->ctl->prod_waiting, &r->ctl->space_seq,
                      timeout_ns);
}
