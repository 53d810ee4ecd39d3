/*
 * test_shm_ring.c — the SPSC record ring (shm/ring.c) inside one process: records in and out,
 * wrap-around with pad records, full and empty, the record size limit, 64-bit counter wrap, the
 * fast path issuing no wake-up, futex sleeps and wake-ups, timeouts, idle CPU, the peer check,
 * and every kind of corrupt counter or record header injected into the shared control block or
 * data area: an error naming the value, never a crash or an out-of-bounds access. Also a
 * producer and a consumer thread streaming checksummed records (labelled tsan).
 */
#include "testutil.h"

#include "err.h"
#include "ring.h"
#include "shmtest.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CAP 4096u
#define MAXREC (CAP / 2 - 16) /* 2032 */

static void put(struct shm_ring *r, uint32_t type, uint32_t len, uint8_t fill)
{
    uint8_t buf[MAXREC];
    memset(buf, fill, len);
    assert_int_equal(shm_ring_write(r, type, buf, len), 0);
}

static void get(struct shm_ring *r, uint32_t type, uint32_t len, uint8_t fill)
{
    uint8_t buf[MAXREC];
    uint32_t t = 0, n = 0;
    assert_int_equal(shm_ring_read(r, buf, sizeof buf, &t, &n), 0);
    assert_int_equal(t, type);
    assert_int_equal(n, len);
    for (uint32_t i = 0; i < n; i++)
        if (buf[i] != fill)
            fail_msg("byte %u is 0x%02x, expected 0x%02x", i, buf[i], fill);
}

static void test_basic(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    uint8_t buf[64];
    uint32_t t, n;
    assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), -EAGAIN);
    put(&p.prod, 16, 0, 0);
    put(&p.prod, 17, 1, 0x11);
    put(&p.prod, 99, 100, 0x22);
    get(&p.cons, 16, 0, 0);
    get(&p.cons, 17, 1, 0x11);
    get(&p.cons, 99, 100, 0x22);
    assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), -EAGAIN);
    /* 16 + 0 -> 16, 16 + 1 -> 32, 16 + 100 -> 128 bytes */
    assert_int_equal(atomic_load(&p.ctl->tail), 16 + 32 + 128);
    assert_int_equal(atomic_load(&p.ctl->head), 16 + 32 + 128);
    assert_int_equal(p.prod.stats.records, 3);
    assert_int_equal(p.prod.stats.bytes, 101);
    assert_int_equal(p.cons.stats.records, 3);
    assert_int_equal(p.cons.stats.bytes, 101);
    /* reserve + abort leaves nothing behind; the next record takes its place */
    void *pl;
    assert_int_equal(shm_ring_reserve(&p.prod, 20, 40, &pl), 0);
    memset(pl, 0x33, 40);
    shm_ring_abort(&p.prod);
    assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), -EAGAIN);
    assert_int_equal(shm_ring_reserve(&p.prod, 21, 8, &pl), 0);
    assert_int_equal((uintptr_t)pl % SHM_REC_ALIGN, 0);
    memset(pl, 0x44, 8);
    shm_ring_commit(&p.prod);
    get(&p.cons, 21, 8, 0x44);
    assert_false(shm_ring_broken(&p.prod));
    st_pair_fini(&p);
}

/* Many laps with records of every size and a lagging consumer: each record comes out whole,
 * in order, and pads appear exactly where records would cross the end. */
static void test_wraparound(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    uint64_t written = 0, read = 0;
    uint8_t buf[MAXREC];
    for (uint64_t round = 0; round < 20000; round++) {
        uint32_t len = st_len(7, written, MAXREC);
        void *pl;
        int rc = shm_ring_reserve(&p.prod, st_type(7, written), len, &pl);
        if (rc == 0) {
            st_fill(7, written, pl, len);
            shm_ring_commit(&p.prod);
            written++;
        } else {
            assert_int_equal(rc, -EAGAIN);
        }
        /* the consumer reads 2 records every 3 rounds, and drains when the producer is stuck */
        int want = rc == -EAGAIN ? 1000 : (round % 3 != 0 ? 1 : 0);
        for (int k = 0; k < want && read < written; k++) {
            uint32_t t, n;
            char why[128];
            assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), 0);
            if (st_check(7, read, MAXREC, t, buf, n, why, sizeof why) != 0)
                fail_msg("%s", why);
            read++;
        }
    }
    assert_true(written > 10000);
    assert_true(atomic_load(&p.ctl->tail) > 100 * CAP); /* many laps */
    assert_true(p.prod.stats.pads > 100);
    assert_int_equal(p.prod.stats.pads, p.cons.stats.pads);
    assert_true(p.prod.stats.full > 0);
    st_pair_fini(&p);
}

static void test_full_empty(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    /* 48-byte payloads take 64 bytes: exactly CAP / 64 fit, no slot is wasted */
    for (unsigned i = 0; i < CAP / 64; i++)
        put(&p.prod, 16, 48, (uint8_t)i);
    void *pl;
    assert_int_equal(shm_ring_reserve(&p.prod, 16, 0, &pl), -EAGAIN);
    assert_int_equal(p.prod.stats.full, 1);
    assert_int_equal(shm_ring_wait_writable(&p.prod, 0, 0), -ETIMEDOUT);
    get(&p.cons, 16, 48, 0);
    /* one record's room is back, and not more */
    put(&p.prod, 16, 48, 0xaa);
    assert_int_equal(shm_ring_reserve(&p.prod, 16, 0, &pl), -EAGAIN);
    for (unsigned i = 1; i < CAP / 64; i++)
        get(&p.cons, 16, 48, (uint8_t)i);
    get(&p.cons, 16, 48, 0xaa);
    uint8_t buf[8];
    uint32_t t, n;
    assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), -EAGAIN);
    assert_int_equal(shm_ring_wait_readable(&p.cons, 0), -ETIMEDOUT);
    st_pair_fini(&p);
}

/* The largest record fits at every position of the ring, one byte more never does, and a
 * reader with a short buffer is told the size without losing the record. */
static void test_max_record(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    assert_int_equal(shm_ring_max_record(&p.prod), MAXREC);
    for (unsigned pos = 0; pos < CAP; pos += 16) {
        put(&p.prod, 18, MAXREC, (uint8_t)pos);
        get(&p.cons, 18, MAXREC, (uint8_t)pos);
        put(&p.prod, 16, 0, 0); /* advance by one alignment unit */
        get(&p.cons, 16, 0, 0);
    }
    void *pl;
    tu_log_capture_begin();
    assert_int_equal(shm_ring_reserve(&p.prod, 16, MAXREC + 1, &pl), ERR_RANGE);
    assert_int_equal(shm_ring_wait_writable(&p.prod, MAXREC + 1, 0), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("test ring", "2033 bytes exceeds the ring's limit of 2032", NULL);
    assert_false(shm_ring_broken(&p.prod));

    put(&p.prod, 17, 300, 0x5a);
    uint8_t small[100];
    uint32_t t = 0, n = 0;
    tu_log_capture_begin();
    assert_int_equal(shm_ring_read(&p.cons, small, sizeof small, &t, &n), -EMSGSIZE);
    tu_log_capture_end();
    tu_assert_log_contains("300 bytes does not fit a 100-byte buffer", NULL);
    assert_int_equal(n, 300);
    get(&p.cons, 17, 300, 0x5a);

    /* a ring whose record limit does not fit its capacity is refused */
    struct shm_ring r;
    tu_log_capture_begin();
    assert_int_equal(shm_ring_init(&r, SHM_RING_PRODUCER, 0, p.ctl, p.data, CAP, MAXREC + 1,
                                   "bad"), ERR_RANGE);
    assert_int_equal(shm_ring_init(&r, SHM_RING_PRODUCER, 0, p.ctl, p.data, CAP + 16, 100,
                                   "bad"), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("max record 2033", "capacity 4112 is not a power of two", NULL);
    st_pair_fini(&p);
}

/* The byte counters only grow; their 64-bit wrap (centuries away in practice) is harmless. */
static void test_counter_wrap(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init_at(&p, CAP, MAXREC, (uint64_t)0 - 3 * CAP - 48);
    uint8_t buf[MAXREC];
    for (uint64_t i = 0; i < 200; i++) {
        uint32_t len = st_len(3, i, MAXREC);
        void *pl;
        assert_int_equal(shm_ring_reserve(&p.prod, st_type(3, i), len, &pl), 0);
        st_fill(3, i, pl, len);
        shm_ring_commit(&p.prod);
        uint32_t t, n;
        char why[128];
        assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), 0);
        if (st_check(3, i, MAXREC, t, buf, n, why, sizeof why))
            fail_msg("%s", why);
    }
    assert_true(atomic_load(&p.ctl->tail) < 100 * CAP); /* it did wrap */
    st_pair_fini(&p);
}

/* Fast path: with nobody asleep a commit or a read makes no system call; a sleeping peer gets
 * exactly one wake-up however many records follow before it runs. */
static void test_wake_only_sleepers(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    for (int i = 0; i < 1000; i++) {
        put(&p.prod, 16, 8, 1);
        get(&p.cons, 16, 8, 1);
    }
    assert_int_equal(p.prod.stats.wakes, 0);
    assert_int_equal(p.cons.stats.wakes, 0);
    uint32_t seq = atomic_load(&p.ctl->data_seq);
    atomic_store(&p.ctl->cons_waiting, 1); /* as a consumer about to sleep leaves it */
    put(&p.prod, 16, 8, 2);
    put(&p.prod, 16, 8, 3);
    assert_int_equal(p.prod.stats.wakes, 1);
    assert_int_equal(atomic_load(&p.ctl->cons_waiting), 0);
    assert_int_equal(atomic_load(&p.ctl->data_seq), seq + 1);
    atomic_store(&p.ctl->prod_waiting, 1);
    get(&p.cons, 16, 8, 2);
    get(&p.cons, 16, 8, 3);
    assert_int_equal(p.cons.stats.wakes, 1);
    assert_int_equal(atomic_load(&p.ctl->prod_waiting), 0);
    st_pair_fini(&p);
}

static void test_wait_timeout(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    uint64_t t0 = st_now_ns();
    assert_int_equal(shm_ring_wait_readable(&p.cons, 60 * 1000000), -ETIMEDOUT);
    uint64_t dt = st_now_ns() - t0;
    assert_true(dt >= 60 * 1000000ull && dt < 1000000000ull);
    assert_true(p.cons.stats.sleeps >= 1);
    while (shm_ring_write(&p.prod, 16, NULL, 0) == 0)
        ;
    t0 = st_now_ns();
    assert_int_equal(shm_ring_wait_writable(&p.prod, 0, 60 * 1000000), -ETIMEDOUT);
    dt = st_now_ns() - t0;
    assert_true(dt >= 60 * 1000000ull && dt < 1000000000ull);
    st_pair_fini(&p);
}

/* Idle = ~0% CPU: a consumer waiting on an empty ring sleeps in the kernel. */
static void test_idle_cpu(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    uint64_t t0 = st_now_ns();
    assert_int_equal(shm_ring_wait_readable(&p.cons, 500 * 1000000), -ETIMEDOUT);
    uint64_t wall = st_now_ns() - t0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    uint64_t cpu = (uint64_t)(c1.tv_sec - c0.tv_sec) * 1000000000ull +
                   (uint64_t)(c1.tv_nsec - c0.tv_nsec);
    print_message("idle wait: %.1f ms wall, %.3f ms CPU, %llu sleeps\n", wall / 1e6, cpu / 1e6,
                  (unsigned long long)p.cons.stats.sleeps);
    assert_true(cpu < wall / 50); /* < 2% */
    st_pair_fini(&p);
}

/* ---- sleeping ends are woken by the other end, not by their slice ---- */

struct waiter {
    struct st_pair *p;
    int rc;
    uint64_t woke_ns;
};

static void *wait_read(void *arg)
{
    struct waiter *w = arg;
    w->rc = shm_ring_wait_readable(&w->p->cons, 20ll * 1000000000);
    w->woke_ns = st_now_ns();
    return NULL;
}

static void *wait_write(void *arg)
{
    struct waiter *w = arg;
    w->rc = shm_ring_wait_writable(&w->p->prod, 48, 20ll * 1000000000);
    w->woke_ns = st_now_ns();
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void test_wakeup(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    /* slices longer than the test: only a futex wake can end these waits early. The bound
     * below (5 s) is far under the slice (60 s) and the wait's own timeout (20 s) yet above
     * what a loaded 2-core CI machine takes to schedule the woken thread (500 ms was not) */
    shm_ring_set_slice_ns(&p.cons, 60ull * 1000000000);
    shm_ring_set_slice_ns(&p.prod, 60ull * 1000000000);

    struct waiter w = {.p = &p};
    pthread_t th;
    pthread_create(&th, NULL, wait_read, &w);
    sleep_ms(100);
    uint64_t t0 = st_now_ns();
    put(&p.prod, 16, 4, 9);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, 0);
    assert_true(w.woke_ns - t0 < 5000 * 1000000ull);
    get(&p.cons, 16, 4, 9);

    uint8_t ones[48];
    memset(ones, 1, sizeof ones);
    while (shm_ring_write(&p.prod, 16, ones, 48) == 0)
        ;
    pthread_create(&th, NULL, wait_write, &w);
    sleep_ms(100);
    t0 = st_now_ns();
    get(&p.cons, 16, 48, 1);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, 0);
    assert_true(w.woke_ns - t0 < 5000 * 1000000ull);
    assert_true(p.cons.stats.wakes >= 1 && p.prod.stats.wakes >= 1);
    st_pair_fini(&p);
}

/* The peer check ends a wait with its code; a ring given up by one end wakes the other. */
static int peer_dead_after_3(void *ud)
{
    int *calls = ud;
    return ++*calls >= 3 ? -EPIPE : 0;
}

static void test_peer_check(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    int calls = 0;
    shm_ring_set_peer_check(&p.cons, peer_dead_after_3, &calls);
    shm_ring_set_slice_ns(&p.cons, 10 * 1000000);
    uint64_t t0 = st_now_ns();
    assert_int_equal(shm_ring_wait_readable(&p.cons, -1), -EPIPE);
    assert_int_equal(calls, 3);
    assert_true(st_now_ns() - t0 < 1000000000ull);
    /* records already published are delivered even though the peer is "gone" */
    put(&p.prod, 16, 4, 7);
    assert_int_equal(shm_ring_wait_readable(&p.cons, -1), 0);
    get(&p.cons, 16, 4, 7);

    shm_ring_set_slice_ns(&p.cons, 60ull * 1000000000);
    shm_ring_set_peer_check(&p.cons, NULL, NULL);
    struct waiter w = {.p = &p};
    pthread_t th;
    pthread_create(&th, NULL, wait_read, &w);
    sleep_ms(100);
    t0 = st_now_ns();
    shm_ring_mark_broken(&p.prod);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, ERR_STATE);
    assert_true(w.woke_ns - t0 < 5000 * 1000000ull);
    st_pair_fini(&p);
}

/* ---- corruption injected into shared memory ---- */

/* Where the ring stands when the corruption is injected:
 *  AT_RECORD  two 48-byte records written, one read: record 1 (seq 1) waits at byte 64, tail 128;
 *  DRAINED    both read: head = tail = 128, so the next read loads the tail;
 *  FULL       AT_RECORD, then the producer filled the ring: tail 4160, head 64, so the next
 *             reserve loads the head. */
enum phase { AT_RECORD, DRAINED, FULL };

struct corruption {
    const char *name;
    enum phase phase;
    void (*inject)(struct st_pair *p);
    const char *needle;
};

static void set_hdr(struct st_pair *p, uint64_t at, uint32_t len, uint32_t type, uint64_t seq)
{
    struct shm_rec_hdr h = {.len = len, .type = type, .seq = seq};
    memcpy(p->data + (at & (p->capacity - 1)), &h, sizeof h);
}

static void tail_beyond(struct st_pair *p) { atomic_store(&p->ctl->tail, 128 + CAP + 16); }
static void tail_huge(struct st_pair *p) { atomic_store(&p->ctl->tail, UINT64_MAX - 15); }
static void tail_unaligned(struct st_pair *p) { atomic_store(&p->ctl->tail, 128 + 8 + 16); }
static void tail_back(struct st_pair *p) { atomic_store(&p->ctl->tail, 96); }
static void len_too_big(struct st_pair *p) { set_hdr(p, 64, MAXREC + 1, 16, 1); }
static void len_past_tail(struct st_pair *p) { set_hdr(p, 64, 200, 16, 1); }
static void len_max(struct st_pair *p) { set_hdr(p, 64, UINT32_MAX, 16, 1); }
static void bad_seq(struct st_pair *p) { set_hdr(p, 64, 48, 16, 77); }
static void bad_type(struct st_pair *p) { set_hdr(p, 64, 48, 3, 1); }
static void zero_type(struct st_pair *p) { set_hdr(p, 64, 48, 0, 1); }
static void pad_short(struct st_pair *p) { set_hdr(p, 64, 100, SHM_REC_PAD, 1); }
static void head_ahead(struct st_pair *p) { atomic_store(&p->ctl->head, 4160 + 16); }
static void head_back(struct st_pair *p) { atomic_store(&p->ctl->head, 48); }
static void head_unaligned(struct st_pair *p) { atomic_store(&p->ctl->head, 72); }
static void head_wrapped(struct st_pair *p) { atomic_store(&p->ctl->head, UINT64_MAX - 15); }

/* A record near the end of the data area whose header claims it continues past the end. */
static void cross_end(struct st_pair *p)
{
    /* test_corrupt_at_end leaves head = tail - 64 = CAP - 64 with one 48-byte record */
    set_hdr(p, CAP - 64, 100, 16, 2);
}
static void pad_past_tail(struct st_pair *p)
{
    set_hdr(p, CAP - 64, 64 - 16, SHM_REC_PAD, 2);
    atomic_store(&p->ctl->tail, CAP - 32);
}

static const struct corruption cases[] = {
    {"tail beyond capacity", DRAINED, tail_beyond, "tail 4240 is not within 4096 bytes after head 128"},
    {"tail below head", DRAINED, tail_huge, "is not within 4096 bytes after head 128"},
    {"tail unaligned", DRAINED, tail_unaligned, "tail 152 is not a multiple of 16"},
    {"tail backwards", DRAINED, tail_back, "tail 96 is not within 4096 bytes after head 128"},
    {"length over limit", AT_RECORD, len_too_big, "claims 2033 bytes, more than the limit of 2032"},
    {"length past tail", AT_RECORD, len_past_tail, "runs past the tail (64 bytes published)"},
    {"length 4 GiB", AT_RECORD, len_max, "claims 4294967295 bytes"},
    {"sequence", AT_RECORD, bad_seq, "has sequence number 77, expected 1"},
    {"reserved type", AT_RECORD, bad_type, "has reserved type 3"},
    {"type 0", AT_RECORD, zero_type, "has reserved type 0"},
    {"pad not to the end", AT_RECORD, pad_short, "does not end at the end of the ring"},
    {"head ahead of tail", FULL, head_ahead, "head 4176 outside [64, 4160]"},
    {"head backwards", FULL, head_back, "head 48 outside [64, 4160]"},
    {"head unaligned", FULL, head_unaligned, "head 72 is not a multiple of 16"},
    {"head far behind", FULL, head_wrapped, "outside [64, 4160]"},
};

static void run_case(const struct corruption *c)
{
    struct st_pair p;
    st_pair_init(&p, CAP, MAXREC);
    put(&p.prod, 16, 48, 1);
    put(&p.prod, 16, 48, 2);
    get(&p.cons, 16, 48, 1);
    void *pl;
    if (c->phase == DRAINED)
        get(&p.cons, 16, 48, 2);
    if (c->phase == FULL) {
        while (shm_ring_reserve(&p.prod, 16, 48, &pl) == 0) {
            memset(pl, 3, 48);
            shm_ring_commit(&p.prod);
        }
        assert_int_equal(atomic_load(&p.ctl->tail), 4160);
    }
    c->inject(&p);
    tu_log_capture_begin();
    uint8_t buf[MAXREC];
    uint32_t t, n;
    int rc = c->phase == FULL ? shm_ring_reserve(&p.prod, 16, 48, &pl)
                              : shm_ring_read(&p.cons, buf, sizeof buf, &t, &n);
    tu_log_capture_end();
    if (rc != ERR_FORMAT)
        fail_msg("%s: got %s, expected ERR_FORMAT", c->name, err_name(rc));
    tu_assert_log_contains("test ring", c->needle, "corrupt", NULL);
    /* the ring stays given up: here, and at the other end */
    assert_true(shm_ring_broken(&p.prod) && shm_ring_broken(&p.cons));
    tu_log_capture_begin();
    assert_int_equal(shm_ring_read(&p.cons, buf, sizeof buf, &t, &n), ERR_STATE);
    assert_int_equal(shm_ring_reserve(&p.prod, 16, 8, &pl), ERR_STATE);
    assert_int_equal(shm_ring_wait_readable(&p.cons, -1), ERR_STATE);
    assert_int_equal(shm_ring_wait_writable(&p.prod, 8, -1), ERR_STATE);
    tu_log_capture_end();
    st_pair_fini(&p);
}

static void test_corrupt(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

/* Corrupt records at the end of the data area: one claiming to cross it, a pad running past
 * the published tail. */
static void test_corrupt_at_end(void **state)
{
    (void)state;
    static const struct corruption end_cases[] = {
        {"record crossing the end", AT_RECORD, cross_end, "crosses the end of the ring (64 bytes left)"},
        {"pad past tail", AT_RECORD, pad_past_tail, "pad record 2 runs past the tail"},
    };
    for (size_t k = 0; k < 2; k++) {
        struct st_pair p;
        st_pair_init_at(&p, CAP, MAXREC, CAP - 64 - 16 - 16);
        put(&p.prod, 16, 0, 0);
        put(&p.prod, 16, 0, 0);
        get(&p.cons, 16, 0, 0);
        get(&p.cons, 16, 0, 0);
        put(&p.prod, 16, 48, 5); /* at CAP - 64: fits exactly */
        end_cases[k].inject(&p);
        uint8_t buf[MAXREC];
        uint32_t t, n;
        tu_log_capture_begin();
        int rc = shm_ring_read(&p.cons, buf, sizeof buf, &t, &n);
        tu_log_capture_end();
        assert_int_equal(rc, ERR_FORMAT);
        tu_assert_log_contains(end_cases[k].needle, NULL);
        st_pair_fini(&p);
    }
}

/* Random garbage in the whole control block and data area: every call returns, with data or
 * an error, and never touches memory outside the ring (ASan watches). */
static void test_garbage(void **state)
{
    (void)state;
    uint64_t rng = 42;
    for (int round = 0; round < 2000; round++) {
        struct st_pair p;
        st_pair_init(&p, CAP, MAXREC);
        int k = (int)(st_splitmix(&rng) % 4);
        for (int i = 0; i < 6; i++)
            shm_ring_write(&p.prod, 16, NULL, 0);
        /* scribble: random words at random places, sometimes in the counters */
        for (int i = 0; i < 1 + k; i++) {
            uint64_t r = st_splitmix(&rng);
            if (r % 5 == 0)
                atomic_store(&p.ctl->tail, st_splitmix(&rng) % (3 * CAP));
            else if (r % 5 == 1)
                atomic_store(&p.ctl->head, st_splitmix(&rng) % (3 * CAP));
            else {
                uint64_t w = st_splitmix(&rng);
                memcpy(p.data + (r % (CAP / 8)) * 8, &w, 8);
            }
        }
        tu_log_capture_begin();
        uint8_t buf[MAXREC];
        uint32_t t, n;
        void *pl;
        for (int i = 0; i < 20; i++) {
            int rc = shm_ring_read(&p.cons, buf, sizeof buf, &t, &n);
            if (rc == 0)
                assert_true(n <= MAXREC && t >= 16);
            if (rc == 0 || rc == -EAGAIN) {
                if (shm_ring_reserve(&p.prod, 16, 40, &pl) == 0) {
                    memset(pl, 0, 40);
                    shm_ring_commit(&p.prod);
                }
                continue;
            }
            assert_true(rc == ERR_FORMAT || rc == ERR_STATE);
        }
        tu_log_capture_end();
        st_pair_fini(&p);
    }
}

/* ---- two threads streaming (also under TSan) ---- */

#define STREAM_SEED 99
struct stream {
    struct st_pair *p;
    uint64_t n;
    char why[160];
    int fail;
};

static void *producer(void *arg)
{
    struct stream *s = arg;
    uint32_t max = shm_ring_max_record(&s->p->prod);
    for (uint64_t i = 0; i < s->n; i++) {
        uint32_t len = st_len(STREAM_SEED, i, max);
        void *pl;
        int rc;
        while ((rc = shm_ring_reserve(&s->p->prod, st_type(STREAM_SEED, i), len, &pl)) ==
               -EAGAIN) {
            if ((rc = shm_ring_wait_writable(&s->p->prod, len, 5ll * 1000000000)) < 0)
                break;
        }
        if (rc < 0) {
            snprintf(s->why, sizeof s->why, "producer: record %llu: %s", (unsigned long long)i,
                     err_name(rc));
            s->fail = 1;
            return NULL;
        }
        st_fill(STREAM_SEED, i, pl, len);
        shm_ring_commit(&s->p->prod);
        if (i % 4096 < 64 && (i / 4096) % 4 == 1)
            sched_yield(); /* slow phases: the consumer drains and sleeps */
    }
    return NULL;
}

static void *consumer(void *arg)
{
    struct stream *s = arg;
    uint32_t max = shm_ring_max_record(&s->p->cons);
    uint8_t *buf = malloc(max);
    for (uint64_t i = 0; i < s->n; i++) {
        uint32_t t, n;
        int rc;
        while ((rc = shm_ring_read(&s->p->cons, buf, max, &t, &n)) == -EAGAIN)
            if ((rc = shm_ring_wait_readable(&s->p->cons, 5ll * 1000000000)) < 0)
                break;
        if (rc < 0) {
            snprintf(s->why, sizeof s->why, "consumer: record %llu: %s", (unsigned long long)i,
                     err_name(rc));
            s->fail = 1;
            break;
        }
        if (st_check(STREAM_SEED, i, max, t, buf, n, s->why, sizeof s->why) != 0) {
            s->fail = 1;
            break;
        }
        if (i % 4096 < 64 && (i / 4096) % 4 == 3)
            sched_yield(); /* slow phases: the producer fills the ring and sleeps */
    }
    free(buf);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct st_pair p;
    st_pair_init(&p, 16384, 8176);
    const char *env = getenv("CLOCHER_SHM_RING_RECORDS");
    struct stream sp = {.p = &p, .n = env ? strtoull(env, NULL, 10) : 200000};
    struct stream sc = sp;
    pthread_t tp, tc;
    pthread_create(&tc, NULL, consumer, &sc);
    pthread_create(&tp, NULL, producer, &sp);
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    if (sp.fail)
        fail_msg("%s", sp.why);
    if (sc.fail)
        fail_msg("%s", sc.why);
    assert_int_equal(p.cons.stats.records, sp.n);
    print_message("threads: %llu records, %llu pads, producer full %llu / sleeps %llu / wakes "
                  "%llu, consumer sleeps %llu / wakes %llu\n",
                  (unsigned long long)sp.n, (unsigned long long)p.prod.stats.pads,
                  (unsigned long long)p.prod.stats.full, (unsigned long long)p.prod.stats.sleeps,
                  (unsigned long long)p.prod.stats.wakes, (unsigned long long)p.cons.stats.sleeps,
                  (unsigned long long)p.cons.stats.wakes);
    st_pair_fini(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_wraparound),
        cmocka_unit_test(test_full_empty),
        cmocka_unit_test(test_max_record),
        cmocka_unit_test(test_counter_wrap),
        cmocka_unit_test(test_wake_only_sleepers),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_idle_cpu),
        cmocka_unit_test(test_wakeup),
        cmocka_unit_test(test_peer_check),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_corrupt_at_end),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
