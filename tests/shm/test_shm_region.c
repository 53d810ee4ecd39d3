/*
 * test_shm_region.c — the per-worker region (shm/region.c): creation (sizing, sealing, the
 * header), attach and its refusal of every inconsistent header field or fd, records both ways
 * between the two sides, and the dead-peer check: a peer that closed, exited (a real child
 * process), went silent, or scribbled over its line is reported gone with the reason, once.
 */
#include "testutil.h"

#include "err.h"
#include "msg.h"
#include "region.h"
#include "shmtest.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GEN 7u

/* A second mapping of a region's memfd: how the tests play a corrupt or malicious peer. */
struct poke {
    struct shm_hdr *h;
    size_t size;
};

static struct poke poke_map(int fd)
{
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    return (struct poke){.h = p, .size = (size_t)st.st_size};
}

static void poke_unmap(struct poke *p) { munmap(p->h, p->size); }

static void test_create_attach(void **state)
{
    (void)state;
    struct shm_region *gw, *wk;
    assert_int_equal(shm_region_create(GEN, 1000, &gw), 0);
    assert_int_equal(shm_region_side(gw), SHM_SIDE_GATEWAY);
    assert_int_equal(shm_region_generation(gw), GEN);
    assert_int_equal(shm_region_max_record(gw), SHM_MIN_RECORD); /* raised to the minimum */
    int fd = shm_region_fd(gw);
    assert_true(fd >= 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, SHM_HDR_SIZE + 2 * 65536);
    /* sealed: neither side can resize it under the other */
    int seals = fcntl(fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_not_equal(ftruncate(fd, 4096), 0);

    struct poke pk = poke_map(fd);
    assert_int_equal(pk.h->magic, SHM_MAGIC);
    assert_int_equal(pk.h->abi_version, SHM_ABI_VERSION);
    assert_int_equal(pk.h->generation, GEN);
    assert_int_equal(pk.h->rings[SHM_RING_REQUESTS].data_offset, SHM_HDR_SIZE);
    assert_int_equal(pk.h->rings[SHM_RING_EVENTS].data_offset, SHM_HDR_SIZE + 65536);
    assert_int_equal(atomic_load(&pk.h->sides[SHM_SIDE_GATEWAY].pid), getpid());
    assert_int_equal(atomic_load(&pk.h->sides[SHM_SIDE_GATEWAY].state), SHM_STATE_ATTACHED);
    assert_int_equal(atomic_load(&pk.h->sides[SHM_SIDE_WORKER].state), SHM_STATE_NONE);

    /* before the worker attaches it is not gone, merely absent */
    assert_int_equal(shm_region_check_peer(gw), 0);
    assert_int_equal(shm_region_attach(fd, GEN, &wk), 0);
    shm_region_close_fd(gw);
    assert_int_equal(shm_region_fd(gw), -1);
    assert_int_equal(shm_region_side(wk), SHM_SIDE_WORKER);
    assert_int_equal(shm_region_max_record(wk), SHM_MIN_RECORD);
    assert_int_equal(atomic_load(&pk.h->sides[SHM_SIDE_WORKER].pid), getpid());
    assert_int_equal(atomic_load(&pk.h->sides[SHM_SIDE_WORKER].state), SHM_STATE_ATTACHED);
    shm_region_set_state(wk, SHM_STATE_READY);
    assert_int_equal(atomic_load(&pk.h->sides[SHM_SIDE_WORKER].state), SHM_STATE_READY);
    assert_int_equal(shm_region_check_peer(gw), 0);
    assert_int_equal(shm_region_check_peer(wk), 0);

    /* records both ways, through the mapping each side made */
    shm_region_set_name(gw, "worker 3");
    assert_string_equal(shm_region_tx(gw)->name, "worker 3 gen 7 requests ring");
    assert_string_equal(shm_region_rx(gw)->name, "worker 3 gen 7 events ring");
    struct shm_msg m = {.type = SHM_MSG_CANCEL, .request_id = 42};
    assert_int_equal(shm_msg_send(shm_region_tx(gw), &m), 0);
    void *buf = aligned_alloc(16, SHM_MIN_RECORD);
    struct shm_msg got;
    assert_int_equal(shm_msg_recv(shm_region_rx(wk), buf, SHM_MIN_RECORD, &got), 0);
    assert_int_equal(got.type, SHM_MSG_CANCEL);
    assert_int_equal(got.request_id, 42);
    m = (struct shm_msg){.type = SHM_MSG_DONE, .request_id = 42};
    assert_int_equal(shm_msg_send(shm_region_tx(wk), &m), 0);
    assert_int_equal(shm_msg_recv(shm_region_rx(gw), buf, SHM_MIN_RECORD, &got), 0);
    assert_int_equal(got.type, SHM_MSG_DONE);

    struct shm_peer peer;
    shm_region_heartbeat(wk);
    shm_region_peer(gw, &peer);
    assert_int_equal(peer.pid, getpid());
    assert_int_equal(peer.state, SHM_STATE_READY);
    assert_true(peer.heartbeats >= 2);
    assert_false(peer.gone);

    free(buf);
    shm_region_close(wk);
    shm_region_close(gw);
    poke_unmap(&pk);
}

static void test_sizing(void **state)
{
    (void)state;
    struct shm_region *r;
    /* a 4 MiB record needs 8 MiB of ring plus a pad's worth: 16 MiB */
    assert_int_equal(shm_region_create(1, 4u << 20, &r), 0);
    struct stat st;
    assert_int_equal(fstat(shm_region_fd(r), &st), 0);
    assert_int_equal(st.st_size, SHM_HDR_SIZE + 2 * (16u << 20));
    assert_int_equal(shm_region_max_record(r), 4u << 20);
    shm_region_close(r);
    /* exactly the largest record of a 64 KiB ring */
    assert_int_equal(shm_region_create(1, 32768 - 16, &r), 0);
    assert_int_equal(fstat(shm_region_fd(r), &st), 0);
    assert_int_equal(st.st_size, SHM_HDR_SIZE + 2 * 65536);
    shm_region_close(r);

    tu_log_capture_begin();
    assert_int_equal(shm_region_create(0, 1000, &r), ERR_RANGE);
    assert_null(r);
    assert_int_equal(shm_region_create(2, UINT32_MAX, &r), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("generation 0 is reserved", "records of 4294967295 bytes exceed", NULL);
}

/* ---- attach refuses what it cannot trust ---- */

struct bad_case {
    const char *name;
    void (*poke)(struct shm_hdr *h);
    uint32_t generation;            /* 0 = GEN */
    int code;
    const char *needle;
};

static void p_magic(struct shm_hdr *h) { h->magic = 0x12345678; }
static void p_version(struct shm_hdr *h) { h->abi_version = 99; }
static void p_hdr_size(struct shm_hdr *h) { h->hdr_size = 128; }
static void p_none(struct shm_hdr *h) { (void)h; }
static void p_size(struct shm_hdr *h) { h->region_size += 4096; }
static void p_reserved(struct shm_hdr *h) { h->reserved0 = 1; }
static void p_max_small(struct shm_hdr *h) { h->max_record = 100; }
static void p_max_big(struct shm_hdr *h) { h->max_record = 65536; }
static void p_cap(struct shm_hdr *h) { h->rings[1].capacity = 65536 + 4096; }
static void p_cap_small(struct shm_hdr *h) { h->rings[1].capacity = 1024; }
static void p_offset_unaligned(struct shm_hdr *h) { h->rings[0].data_offset += 16; }
static void p_offset_header(struct shm_hdr *h) { h->rings[0].data_offset = 0; }
static void p_offset_outside(struct shm_hdr *h) { h->rings[1].data_offset = UINT64_MAX - 4095; }
static void p_offset_tail(struct shm_hdr *h) { h->rings[1].data_offset += 4096; }
static void p_overlap(struct shm_hdr *h) { h->rings[1].data_offset = h->rings[0].data_offset; }
static void p_gw_pid(struct shm_hdr *h) { atomic_store(&h->sides[SHM_SIDE_GATEWAY].pid, 0); }
static void p_gw_closed(struct shm_hdr *h)
{
    atomic_store(&h->sides[SHM_SIDE_GATEWAY].state, SHM_STATE_CLOSED);
}
static void p_gw_state(struct shm_hdr *h) { atomic_store(&h->sides[SHM_SIDE_GATEWAY].state, 77); }
static void p_attached(struct shm_hdr *h)
{
    atomic_store(&h->sides[SHM_SIDE_WORKER].pid, 4242);
    atomic_store(&h->sides[SHM_SIDE_WORKER].state, SHM_STATE_READY);
}
static void p_head(struct shm_hdr *h) { atomic_store(&h->ctl[SHM_RING_REQUESTS].head, 64); }
static void p_events_tail(struct shm_hdr *h) { atomic_store(&h->ctl[SHM_RING_EVENTS].tail, 64); }
static void p_broken(struct shm_hdr *h) { atomic_store(&h->ctl[SHM_RING_EVENTS].broken, 1); }

/* the version case below names this build's ABI: a bump updates both */
_Static_assert(SHM_ABI_VERSION == 6, "the \"version\" case expects ABI 6");

static const struct bad_case bad_cases[] = {
    {"magic", p_magic, 0, ERR_FORMAT, "magic 0x12345678, expected 0x48534c43 (not a clocher region)"},
    {"version", p_version, 0, ERR_UNSUPPORTED, "ABI version 99, this build speaks 6"},
    {"hdr_size", p_hdr_size, 0, ERR_FORMAT, "hdr_size 128, this build's header is 640 bytes"},
    {"generation", p_none, 8, ERR_MISMATCH, "generation 7, expected 8"},
    {"region_size", p_size, 0, ERR_FORMAT, "region_size 139264 but the memfd holds 135168 bytes"},
    {"reserved", p_reserved, 0, ERR_FORMAT, "reserved0 is 1, expected 0"},
    {"max_record small", p_max_small, 0, ERR_FORMAT, "max_record 100 is below the minimum 16384"},
    {"max_record big", p_max_big, 0, ERR_FORMAT, "requests ring: max_record 65536 does not fit capacity 65536"},
    {"capacity", p_cap, 0, ERR_FORMAT, "events ring: capacity 69632 is not a power of two"},
    {"capacity small", p_cap_small, 0, ERR_FORMAT, "events ring: capacity 1024 is not a power of two in [4096"},
    {"offset unaligned", p_offset_unaligned, 0, ERR_FORMAT, "requests ring: data at [4112, +65536) is not a page-aligned range"},
    {"offset in header", p_offset_header, 0, ERR_FORMAT, "requests ring: data at [0, +65536)"},
    {"offset outside", p_offset_outside, 0, ERR_FORMAT, "events ring: data at [18446744073709547520"},
    {"ring past end", p_offset_tail, 0, ERR_FORMAT, "events ring: data at [73728, +65536) is not"},
    {"overlap", p_overlap, 0, ERR_FORMAT, "the requests ring [4096, +65536) overlaps the events ring [4096, +65536)"},
    {"gateway pid", p_gw_pid, 0, ERR_FORMAT, "gateway pid 0 is not a process id"},
    {"gateway closed", p_gw_closed, 0, ERR_STATE, "has closed this region already"},
    {"gateway state", p_gw_state, 0, ERR_FORMAT, "gateway state 77 is not a state"},
    {"attached", p_attached, 0, ERR_STATE, "already attached by a worker (pid 4242, state 2)"},
    {"requests head", p_head, 0, ERR_FORMAT, "rings not fresh: requests head 64"},
    {"events tail", p_events_tail, 0, ERR_FORMAT, "events tail 64"},
    {"broken", p_broken, 0, ERR_STATE, "the events ring is marked broken already"},
};

static void test_attach_refuses(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        struct shm_region *gw, *wk = (struct shm_region *)1;
        assert_int_equal(shm_region_create(GEN, 0, &gw), 0);
        struct poke pk = poke_map(shm_region_fd(gw));
        c->poke(pk.h);
        tu_log_capture_begin();
        int rc = shm_region_attach(shm_region_fd(gw), c->generation ? c->generation : GEN, &wk);
        tu_log_capture_end();
        if (rc != c->code)
            fail_msg("%s: got %s, expected %s", c->name, err_name(rc), err_name(c->code));
        assert_null(wk);
        char fdname[32];
        snprintf(fdname, sizeof fdname, "shm region (fd %d)", shm_region_fd(gw));
        tu_assert_log_contains(fdname, c->needle, NULL);
        poke_unmap(&pk);
        shm_region_close(gw);
    }
}

static void test_attach_bad_fd(void **state)
{
    (void)state;
    struct shm_region *wk;
    /* a pipe, a regular file: not memfds */
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    tu_log_capture_begin();
    assert_int_equal(shm_region_attach(pfd[0], GEN, &wk), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("not a sealable memfd", NULL);
    close(pfd[0]);
    close(pfd[1]);
    /* an unsealed memfd: the peer could shrink it and fault us */
    int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, SHM_HDR_SIZE + 2 * 65536), 0);
    tu_log_capture_begin();
    assert_int_equal(shm_region_attach(fd, GEN, &wk), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("not sealed against resizing", NULL);
    /* sealed but too small for a header */
    int fd2 = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd2, 100), 0);
    assert_int_equal(fcntl(fd2, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    tu_log_capture_begin();
    assert_int_equal(shm_region_attach(fd2, GEN, &wk), ERR_FORMAT);
    tu_log_capture_end();
    tu_assert_log_contains("size 100 is not a region size", NULL);
    /* sealed, big enough, all zeros */
    int fd3 = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd3, 8192), 0);
    assert_int_equal(fcntl(fd3, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    tu_log_capture_begin();
    assert_int_equal(shm_region_attach(fd3, GEN, &wk), ERR_FORMAT);
    assert_int_equal(shm_region_attach(-1, GEN, &wk), -EBADF);
    assert_int_equal(shm_region_attach(fd3, 0, &wk), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("magic 0x00000000", "fstat: Bad file descriptor",
                           "generation 0 is reserved", NULL);
    close(fd);
    close(fd2);
    close(fd3);
}

/* ---- the dead-peer check ---- */

static void pair(struct shm_region **gw, struct shm_region **wk)
{
    assert_int_equal(shm_region_create(GEN, 0, gw), 0);
    assert_int_equal(shm_region_attach(shm_region_fd(*gw), GEN, wk), 0);
    /* each side has seen the other's pid */
    assert_int_equal(shm_region_check_peer(*gw), 0);
    assert_int_equal(shm_region_check_peer(*wk), 0);
}

static void expect_gone(struct shm_region *r, const char *needle)
{
    tu_log_capture_begin();
    assert_int_equal(shm_region_check_peer(r), -EPIPE);
    tu_log_capture_end();
    tu_assert_log_contains("is gone", needle, NULL);
    /* final, and said once */
    tu_log_capture_begin();
    assert_int_equal(shm_region_check_peer(r), -EPIPE);
    tu_log_capture_end();
    assert_string_equal(tu_log_captured(), "");
    struct shm_peer p;
    shm_region_peer(r, &p);
    assert_true(p.gone);
    assert_non_null(strstr(p.why, needle));
}

static void test_peer_closed(void **state)
{
    (void)state;
    struct shm_region *gw, *wk;
    pair(&gw, &wk);
    shm_region_set_name(gw, "worker 5");
    shm_region_close(wk);
    expect_gone(gw, "it closed its end");
    shm_region_close(gw);

    pair(&gw, &wk);
    shm_region_close(gw);
    expect_gone(wk, "it closed its end");
    shm_region_close(wk);
}

static void test_peer_garbage(void **state)
{
    (void)state;
    static const char *const needles[] = {
        "its state word holds 9, not a state", "claims pid 999999", "its pid word holds -5",
        "s in the future", "no heartbeat for",
    };
    for (int i = 0; i < 5; i++) {
        struct shm_region *gw, *wk;
        pair(&gw, &wk);
        struct poke pk = poke_map(shm_region_fd(gw));
        struct shm_side *ws = &pk.h->sides[SHM_SIDE_WORKER];
        uint64_t now = st_now_ns();
        switch (i) {
        case 0: atomic_store(&ws->state, 9); break;
        case 1: atomic_store(&ws->pid, 999999); break;
        case 2: atomic_store(&ws->pid, -5); break;
        case 3: atomic_store(&ws->heartbeat_ns, now + 10ull * 1000000000); break;
        case 4:
            shm_region_set_state(wk, SHM_STATE_READY);
            shm_region_set_stale_ns(gw, 100 * 1000000ull);
            atomic_store(&ws->heartbeat_ns, now - 1000000000ull);
            break;
        }
        expect_gone(gw, needles[i]);
        poke_unmap(&pk);
        shm_region_close(wk);
        shm_region_close(gw);
    }
    /* with the heartbeat check off, silence alone is not death */
    struct shm_region *gw, *wk;
    pair(&gw, &wk);
    shm_region_set_state(wk, SHM_STATE_READY);
    struct poke pk = poke_map(shm_region_fd(gw));
    shm_region_set_stale_ns(gw, 0);
    atomic_store(&pk.h->sides[SHM_SIDE_WORKER].heartbeat_ns, 1);
    assert_int_equal(shm_region_check_peer(gw), 0);
    poke_unmap(&pk);
    shm_region_close(wk);
    shm_region_close(gw);

    /* a side that has not said READY (a worker loading its model) need not heartbeat: silence
     * is not death until it does, and READY comes with a fresh heartbeat */
    pair(&gw, &wk);
    pk = poke_map(shm_region_fd(gw));
    shm_region_set_stale_ns(gw, 100 * 1000000ull);
    shm_region_set_stale_ns(wk, 100 * 1000000ull);
    atomic_store(&pk.h->sides[SHM_SIDE_WORKER].heartbeat_ns, st_now_ns() - 5000000000ull);
    atomic_store(&pk.h->sides[SHM_SIDE_GATEWAY].heartbeat_ns, st_now_ns() - 5000000000ull);
    assert_int_equal(shm_region_check_peer(gw), 0);
    assert_int_equal(shm_region_check_peer(wk), 0);
    shm_region_set_state(wk, SHM_STATE_READY);
    assert_int_equal(shm_region_check_peer(gw), 0);
    atomic_store(&pk.h->sides[SHM_SIDE_WORKER].heartbeat_ns, st_now_ns() - 5000000000ull);
    expect_gone(gw, "no heartbeat for 5.");
    poke_unmap(&pk);
    shm_region_close(wk);
    shm_region_close(gw);
}

/* A real worker process that attaches and dies without closing (as a crash would). */
static void test_peer_exited(void **state)
{
    (void)state;
    struct shm_region *gw;
    assert_int_equal(shm_region_create(GEN, 0, &gw), 0);
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct shm_region *wk;
        if (shm_region_attach(shm_region_fd(gw), GEN, &wk) != 0)
            _exit(3);
        char c;
        if (read(go[0], &c, 1) != 1) /* wait until the parent has seen us alive */
            _exit(4);
        _exit(0);
    }
    close(go[0]);
    /* it attaches: its pid appears, it is alive */
    struct shm_peer p = {0};
    for (int i = 0; i < 500 && p.pid != pid; i++) {
        shm_region_peer(gw, &p);
        usleep(2000);
    }
    assert_int_equal(p.pid, pid);
    assert_int_equal(shm_region_check_peer(gw), 0);
    assert_int_equal(write(go[1], "x", 1), 1);
    close(go[1]);
    /* a zombie (not reaped yet) already counts as exited: pidfd */
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
    expect_gone(gw, "its process exited");
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    shm_region_close(gw);
}

/* The gateway knows the worker's pid from the supervisor before the worker attaches. */
static void test_trusted_pid(void **state)
{
    (void)state;
    struct shm_region *gw;
    assert_int_equal(shm_region_create(GEN, 0, &gw), 0);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0); /* dies before attaching */
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    tu_log_capture_begin();
    assert_int_equal(shm_region_set_peer_pid(gw, 0), ERR_RANGE);
    tu_log_capture_end();
    tu_assert_log_contains("peer pid 0 is not a process id", NULL);
    assert_int_equal(shm_region_set_peer_pid(gw, pid), 0);
    expect_gone(gw, "its process exited");
    shm_region_close(gw);

    /* a worker claiming another pid than the one spawned */
    struct shm_region *wk;
    assert_int_equal(shm_region_create(GEN, 0, &gw), 0);
    assert_int_equal(shm_region_set_peer_pid(gw, getppid()), 0);
    assert_int_equal(shm_region_attach(shm_region_fd(gw), GEN, &wk), 0);
    char needle[64];
    snprintf(needle, sizeof needle, "it claims pid %d, but the worker is pid %d", (int)getpid(),
             (int)getppid());
    expect_gone(gw, needle);
    shm_region_close(wk);
    shm_region_close(gw);
}

/* A side sleeping on its ring learns at once that the other closed (close wakes it). */
struct reader {
    struct shm_region *r;
    int rc;
    uint64_t t;
};

static void *read_until_gone(void *arg)
{
    struct reader *rd = arg;
    rd->rc = shm_ring_wait_readable(shm_region_rx(rd->r), -1);
    rd->t = st_now_ns();
    return NULL;
}

static void test_close_wakes_waiter(void **state)
{
    (void)state;
    struct shm_region *gw, *wk;
    pair(&gw, &wk);
    shm_ring_set_slice_ns(shm_region_rx(wk), 60ull * 1000000000);
    struct reader rd = {.r = wk};
    pthread_t th;
    pthread_create(&th, NULL, read_until_gone, &rd);
    usleep(100 * 1000);
    uint64_t t0 = st_now_ns();
    shm_region_close(gw);
    pthread_join(th, NULL);
    assert_int_equal(rd.rc, -EPIPE);
    assert_true(rd.t - t0 < 500 * 1000000ull);
    shm_region_close(wk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_attach),
        cmocka_unit_test(test_sizing),
        cmocka_unit_test(test_attach_refuses),
        cmocka_unit_test(test_attach_bad_fd),
        cmocka_unit_test(test_peer_closed),
        cmocka_unit_test(test_peer_garbage),
        cmocka_unit_test(test_peer_exited),
        cmocka_unit_test(test_trusted_pid),
        cmocka_unit_test(test_close_wakes_waiter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
